// The minLSTM (docs/spec.md section 18.2): the gates of every step in one launch, the linear
// recurrence as the minGRU's (gated_scan, gradcells/gpu/scan.cu, with the gate i' in z's
// place: a = 1 - i' = f'), the gate gradients in one launch. All arrays C-contiguous:
// [T, B, H] per-step arrays, [T*B, 3H] pre-activations; one thread per element in a
// grid-stride loop.
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). Each kernel's signature below is the one place its parameters are written
// (gradcells/gpu/_kernels.py reads it and generates the extern "C" entry points).

#include "common.cuh"

// softplus(-v) = max(-v, 0) + log1p(exp(-min(|v|, 40))): no overflow, no underflow (the
// reference's softplus and its SOFTPLUS_TAIL).
__device__ __forceinline__ float minlstm_softplus_neg(float v) {
    return fmaxf(-v, 0.0f) + log1pf(expf(-fminf(fabsf(v), 40.0f)));
}
__device__ __forceinline__ double minlstm_softplus_neg(double v) {
    return fmax(-v, 0.0) + log1p(exp(-fmin(fabs(v), 40.0)));
}

// The paper's g: v + 0.5 for v >= 0, sigmoid(v) below (continuous at 0).
template <class A>
__device__ __forceinline__ A minlstm_g(A v) {
    return v >= (A)0 ? v + (A)0.5 : gc_sigmoid(v);
}

// Gates: for element k = (t*B + b)*H + j of the [T, B, H] outputs, with the pre-activations
// p_f, p_i, p_h at columns j, H + j, 2H + j of row t*B + b,
//   i = sigmoid(softplus(-p_f) - softplus(-p_i)),  f = 1 - i,  hc = act(p_h)
// (act: g, or the identity); zero past a row's length (use_seq_len: t >= seq_len[b]).
template <class T, class A, class Index>
__device__ __forceinline__ void minlstm_gates_body(
    const T* p, const int* seq_len, int use_seq_len, int use_identity, Index n, Index batch,
    Index hidden, T* f, T* i, T* hc)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index step_row = k / hidden;
        const Index col = k - step_row * hidden;
        const Index t = step_row / batch;
        const Index row = step_row - t * batch;
        if (use_seq_len && (long long)t >= (long long)seq_len[row]) {
            f[k] = gc_store<T>::from((A)0);
            i[k] = gc_store<T>::from((A)0);
            hc[k] = gc_store<T>::from((A)0);
            continue;
        }
        const Index base = step_row * 3 * hidden;
        const A gate = gc_sigmoid(minlstm_softplus_neg(gc_load(p[base + col]))
                                  - minlstm_softplus_neg(gc_load(p[base + hidden + col])));
        const A v = gc_load(p[base + 2 * hidden + col]);
        f[k] = gc_store<T>::from((A)1 - gate);
        i[k] = gc_store<T>::from(gate);
        hc[k] = gc_store<T>::from(use_identity ? v : minlstm_g(v));
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void minlstm_gates(
    const T* p, const int* seq_len, int use_seq_len, int use_identity, long long n_steps,
    long long batch, long long hidden, T* f, T* i, T* hc)
{
    const long long n = n_steps * batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        minlstm_gates_body<T, A, unsigned int>(
            p, seq_len, use_seq_len, use_identity, (unsigned int)n, (unsigned int)batch,
            (unsigned int)hidden, f, i, hc);
    } else {
        minlstm_gates_body<T, A, unsigned long long>(
            p, seq_len, use_seq_len, use_identity, (unsigned long long)n,
            (unsigned long long)batch, (unsigned long long)hidden, f, i, hc);
    }
}

// Gate gradients: for element k = (t*B + b)*H + j, with g the adjoint (the gradient of
// the step's state), h_prev = h[t-1] (h0 at t = 0) and the upstream d_f, d_i, d_hc (has_*;
// otherwise not read),
//   de = (d_i - d_f + g*(hc - h_prev))*f*i
//   dp_f = -de*sigmoid(-p_f),  dp_i = de*sigmoid(-p_i)
//   dp_h = (d_hc + g*i)*act'(p_h)      act' = 1 (identity, or p_h >= 0), hc*(1 - hc) below
// into d_p [T*B, 3H] (p: the recomputed pre-activations, same layout); zero past a row's
// length.
template <class T, class A, class Index>
__device__ __forceinline__ void minlstm_gate_grads_body(
    const T* p, const T* f, const T* i, const T* hc, const T* h, const T* h0, const T* g,
    const T* d_f, const T* d_i, const T* d_hc, const int* seq_len, int use_seq_len,
    int has_d_f, int has_d_i, int has_d_hc, int use_identity, Index n, Index batch,
    Index hidden, T* d_p)
{
    const A zero = (A)0;
    const A one = (A)1;
    const Index state = batch * hidden;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index step_row = k / hidden;
        const Index col = k - step_row * hidden;
        const Index t = step_row / batch;
        const Index row = step_row - t * batch;
        const Index base = step_row * 3 * hidden;
        if (use_seq_len && (long long)t >= (long long)seq_len[row]) {
            d_p[base + col] = gc_store<T>::from(zero);
            d_p[base + hidden + col] = gc_store<T>::from(zero);
            d_p[base + 2 * hidden + col] = gc_store<T>::from(zero);
            continue;
        }
        const A forget = gc_load(f[k]);
        const A input = gc_load(i[k]);
        const A cand = gc_load(hc[k]);
        const A adj = gc_load(g[k]);
        const A prev = t == 0 ? gc_load(h0[row * hidden + col]) : gc_load(h[k - state]);
        const A up = adj * (cand - prev) + (has_d_i ? gc_load(d_i[k]) : zero)
                     - (has_d_f ? gc_load(d_f[k]) : zero);
        const A de = up * forget * input;
        const A up_h = adj * input + (has_d_hc ? gc_load(d_hc[k]) : zero);
        const A v = gc_load(p[base + 2 * hidden + col]);
        const A slope = (use_identity || v >= zero) ? one : cand * (one - cand);
        d_p[base + col] = gc_store<T>::from(-de * gc_sigmoid(-gc_load(p[base + col])));
        d_p[base + hidden + col] = gc_store<T>::from(
            de * gc_sigmoid(-gc_load(p[base + hidden + col])));
        d_p[base + 2 * hidden + col] = gc_store<T>::from(up_h * slope);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void minlstm_gate_grads(
    const T* p, const T* f, const T* i, const T* hc, const T* h, const T* h0, const T* g,
    const T* d_f, const T* d_i, const T* d_hc, const int* seq_len, int use_seq_len,
    int has_d_f, int has_d_i, int has_d_hc, int use_identity, long long n_steps,
    long long batch, long long hidden, T* d_p)
{
    const long long n = n_steps * batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        minlstm_gate_grads_body<T, A, unsigned int>(
            p, f, i, hc, h, h0, g, d_f, d_i, d_hc, seq_len, use_seq_len, has_d_f, has_d_i,
            has_d_hc, use_identity, (unsigned int)n, (unsigned int)batch, (unsigned int)hidden,
            d_p);
    } else {
        minlstm_gate_grads_body<T, A, unsigned long long>(
            p, f, i, hc, h, h0, g, d_f, d_i, d_hc, seq_len, use_seq_len, has_d_f, has_d_i,
            has_d_hc, use_identity, (unsigned long long)n, (unsigned long long)batch,
            (unsigned long long)hidden, d_p);
    }
}
