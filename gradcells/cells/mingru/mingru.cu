// The minGRU (docs/spec.md section 18.2): the gates of every step in one launch, the linear
// recurrence as one launch of per-(b, j) scans over time (gated_scan, gradcells/gpu/scan.cu,
// shared with the minLSTM), the gate gradients in one launch.
// All arrays C-contiguous: [T, B, H] per-step arrays, [T*B, 2H] pre-activations; one thread
// per element in a grid-stride loop.
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). Each kernel's signature below is the one place its parameters are written
// (gradcells/gpu/_kernels.py reads it and generates the extern "C" entry points).

#include "common.cuh"

// The paper's g: v + 0.5 for v >= 0, sigmoid(v) below (continuous at 0).
template <class A>
__device__ __forceinline__ A mingru_g(A v) {
    return v >= (A)0 ? v + (A)0.5 : gc_sigmoid(v);
}

// Gates: for element k = (t*B + b)*H + j of the [T, B, H] outputs,
//   z = sigmoid(p[t*B + b, j]),  hc = act(p[t*B + b, H + j])      act: g, or the identity
// zero past a row's length (use_seq_len: t >= seq_len[b]).
template <class T, class A, class Index>
__device__ __forceinline__ void mingru_gates_body(
    const T* p, const int* seq_len, int use_seq_len, int use_identity, Index n, Index batch,
    Index hidden, T* z, T* hc)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index step_row = k / hidden;
        const Index col = k - step_row * hidden;
        const Index t = step_row / batch;
        const Index row = step_row - t * batch;
        if (use_seq_len && (long long)t >= (long long)seq_len[row]) {
            z[k] = gc_store<T>::from((A)0);
            hc[k] = gc_store<T>::from((A)0);
            continue;
        }
        const Index base = step_row * 2 * hidden;
        const A v = gc_load(p[base + hidden + col]);
        z[k] = gc_store<T>::from(gc_sigmoid(gc_load(p[base + col])));
        hc[k] = gc_store<T>::from(use_identity ? v : mingru_g(v));
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void mingru_gates(
    const T* p, const int* seq_len, int use_seq_len, int use_identity, long long n_steps,
    long long batch, long long hidden, T* z, T* hc)
{
    const long long n = n_steps * batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        mingru_gates_body<T, A, unsigned int>(
            p, seq_len, use_seq_len, use_identity, (unsigned int)n, (unsigned int)batch,
            (unsigned int)hidden, z, hc);
    } else {
        mingru_gates_body<T, A, unsigned long long>(
            p, seq_len, use_seq_len, use_identity, (unsigned long long)n,
            (unsigned long long)batch, (unsigned long long)hidden, z, hc);
    }
}

// The linear recurrence runs in the shared gated_scan kernel (gradcells/gpu/scan.cu).

// Gate gradients: for element k = (t*B + b)*H + j, with g the adjoint (the gradient of
// the step's state), h_prev = h[t-1] (h0 at t = 0) and the upstream d_z, d_hc (has_d_z,
// has_d_hc; otherwise not read),
//   dp_z = (d_z + g*(hc - h_prev))*z*(1 - z)
//   dp_h = (d_hc + g*z)*act'(p_h)      act' = 1 (identity, or p_h >= 0), hc*(1 - hc) below
// into d_p [T*B, 2H]; zero past a row's length. p_h is read only for g.
template <class T, class A, class Index>
__device__ __forceinline__ void mingru_gate_grads_body(
    const T* p_h, const T* z, const T* hc, const T* h, const T* h0, const T* g, const T* d_z,
    const T* d_hc, const int* seq_len, int use_seq_len, int has_d_z, int has_d_hc,
    int use_identity, Index n, Index batch, Index hidden, T* d_p)
{
    const A zero = (A)0;
    const A one = (A)1;
    const Index state = batch * hidden;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index step_row = k / hidden;
        const Index col = k - step_row * hidden;
        const Index t = step_row / batch;
        const Index row = step_row - t * batch;
        const Index base = step_row * 2 * hidden;
        if (use_seq_len && (long long)t >= (long long)seq_len[row]) {
            d_p[base + col] = gc_store<T>::from(zero);
            d_p[base + hidden + col] = gc_store<T>::from(zero);
            continue;
        }
        const A gate = gc_load(z[k]);
        const A cand = gc_load(hc[k]);
        const A adj = gc_load(g[k]);
        const A prev = t == 0 ? gc_load(h0[row * hidden + col]) : gc_load(h[k - state]);
        const A up_z = adj * (cand - prev) + (has_d_z ? gc_load(d_z[k]) : zero);
        const A up_h = adj * gate + (has_d_hc ? gc_load(d_hc[k]) : zero);
        const A slope = (use_identity || gc_load(p_h[k]) >= zero) ? one : cand * (one - cand);
        d_p[base + col] = gc_store<T>::from(up_z * gate * (one - gate));
        d_p[base + hidden + col] = gc_store<T>::from(up_h * slope);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void mingru_gate_grads(
    const T* p_h, const T* z, const T* hc, const T* h, const T* h0, const T* g, const T* d_z,
    const T* d_hc, const int* seq_len, int use_seq_len, int has_d_z, int has_d_hc,
    int use_identity, long long n_steps, long long batch, long long hidden, T* d_p)
{
    const long long n = n_steps * batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        mingru_gate_grads_body<T, A, unsigned int>(
            p_h, z, hc, h, h0, g, d_z, d_hc, seq_len, use_seq_len, has_d_z, has_d_hc,
            use_identity, (unsigned int)n, (unsigned int)batch, (unsigned int)hidden, d_p);
    } else {
        mingru_gate_grads_body<T, A, unsigned long long>(
            p_h, z, hc, h, h0, g, d_z, d_hc, seq_len, use_seq_len, has_d_z, has_d_hc,
            use_identity, (unsigned long long)n, (unsigned long long)batch,
            (unsigned long long)hidden, d_p);
    }
}
