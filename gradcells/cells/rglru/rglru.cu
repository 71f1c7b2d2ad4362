// The RG-LRU (docs/spec.md section 18.3): the gates and the recurrence's terms of every step
// in one launch, the linear recurrence as one launch of per-(b, j) scans over time
// (gated_scan, gradcells/gpu/scan.cu, shared with the minGRU and the minLSTM: its gate is
// 1 - a), the multipliers again for the adjoint, the gate gradients in one launch.
// All arrays C-contiguous: [T, B, H] per-step arrays (the pre-activations too), [H] for
// softplus(lam), [T, B] int flags for the resets; one thread per element in a grid-stride
// loop. The math and its careful forms are gradcells/cells/rglru/reference.py's:
//   r = sigma(p_a), i = sigma(p_x) (relative precision, 0 below -gate_tail),
//   log a = -c r sp, a = exp(log a) (0 below -decay_tail), m = sqrt(-expm1(2 log a)).
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). Each kernel's signature below is the one place its parameters are written
// (gradcells/gpu/_kernels.py reads it and generates the extern "C" entry points).

#include "common.cuh"

__device__ __forceinline__ float rglru_exp(float a) { return expf(a); }
__device__ __forceinline__ double rglru_exp(double a) { return exp(a); }
__device__ __forceinline__ float rglru_expm1(float a) { return expm1f(a); }
__device__ __forceinline__ double rglru_expm1(double a) { return expm1(a); }

// sigma(p) as 1/(1 + e) or e/(1 + e), e = exp(-|p|): relative precision; 0 below -tail.
template <class A>
__device__ __forceinline__ A rglru_sigmoid(A p, A tail) {
    if (p < -tail) {
        return (A)0;
    }
    A least = -gc_abs(p);
    if (least < -tail) {
        least = -tail;
    }
    const A e = rglru_exp(least);
    return (p < (A)0 ? e : (A)1) / ((A)1 + e);
}

// exp(log a), 0 below -tail.
template <class A>
__device__ __forceinline__ A rglru_decay(A log_a, A tail) {
    return log_a < -tail ? (A)0 : rglru_exp(log_a);
}

// Gates: for element k = (t*B + b)*H + j of the [T, B, H] arrays,
//   r = sigma(p_a[k]), i = sigma(p_x[k]), and the scan's gate z = 1 - a and addend
//   add = m*i*x (at a reset, resets[t*B + b] != 0: z = 1, add = i*x);
// zero past a row's length (use_seq_len: t >= seq_len[b]; the scan reads nothing there).
template <class T, class A, class Index>
__device__ __forceinline__ void rglru_gates_body(
    const T* p_a, const T* p_x, const T* x, const T* sp, const int* resets,
    const int* seq_len, int use_resets, int use_seq_len, A c, A gate_tail, A decay_tail,
    Index n, Index batch, Index hidden, T* r, T* i, T* z, T* add)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index step_row = k / hidden;
        const Index col = k - step_row * hidden;
        const Index t = step_row / batch;
        const Index row = step_row - t * batch;
        if (use_seq_len && (long long)t >= (long long)seq_len[row]) {
            r[k] = gc_store<T>::from((A)0);
            i[k] = gc_store<T>::from((A)0);
            z[k] = gc_store<T>::from((A)0);
            add[k] = gc_store<T>::from((A)0);
            continue;
        }
        const A gate_r = rglru_sigmoid(gc_load(p_a[k]), gate_tail);
        const A gate_i = rglru_sigmoid(gc_load(p_x[k]), gate_tail);
        const A log_a = -c * gate_r * gc_load(sp[col]);
        const A u = gate_i * gc_load(x[k]);
        r[k] = gc_store<T>::from(gate_r);
        i[k] = gc_store<T>::from(gate_i);
        if (use_resets && resets[step_row]) {
            z[k] = gc_store<T>::from((A)1);
            add[k] = gc_store<T>::from(u);
        } else {
            z[k] = gc_store<T>::from((A)1 - rglru_decay(log_a, decay_tail));
            add[k] = gc_store<T>::from(gc_sqrt(-rglru_expm1((A)2 * log_a)) * u);
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void rglru_gates(
    const T* p_a, const T* p_x, const T* x, const T* sp, const int* resets,
    const int* seq_len, int use_resets, int use_seq_len, A c, A gate_tail, A decay_tail,
    long long n_steps, long long batch, long long hidden, T* r, T* i, T* z, T* add)
{
    const long long n = n_steps * batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        rglru_gates_body<T, A, unsigned int>(
            p_a, p_x, x, sp, resets, seq_len, use_resets, use_seq_len, c, gate_tail,
            decay_tail, (unsigned int)n, (unsigned int)batch, (unsigned int)hidden, r, i, z,
            add);
    } else {
        rglru_gates_body<T, A, unsigned long long>(
            p_a, p_x, x, sp, resets, seq_len, use_resets, use_seq_len, c, gate_tail,
            decay_tail, (unsigned long long)n, (unsigned long long)batch,
            (unsigned long long)hidden, r, i, z, add);
    }
}

// The adjoint's gate: z = 1 - a from the saved r (1 at a reset; not read past a length).
template <class T, class A, class Index>
__device__ __forceinline__ void rglru_decay_gate_body(
    const T* r, const T* sp, const int* resets, int use_resets, A c, A decay_tail, Index n,
    Index hidden, T* z)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index step_row = k / hidden;
        const Index col = k - step_row * hidden;
        if (use_resets && resets[step_row]) {
            z[k] = gc_store<T>::from((A)1);
        } else {
            const A log_a = -c * gc_load(r[k]) * gc_load(sp[col]);
            z[k] = gc_store<T>::from((A)1 - rglru_decay(log_a, decay_tail));
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void rglru_decay_gate(
    const T* r, const T* sp, const int* resets, int use_resets, A c, A decay_tail,
    long long n_steps, long long batch, long long hidden, T* z)
{
    const long long n = n_steps * batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        rglru_decay_gate_body<T, A, unsigned int>(
            r, sp, resets, use_resets, c, decay_tail, (unsigned int)n, (unsigned int)hidden, z);
    } else {
        rglru_decay_gate_body<T, A, unsigned long long>(
            r, sp, resets, use_resets, c, decay_tail, (unsigned long long)n,
            (unsigned long long)hidden, z);
    }
}

// Gate gradients: for element k, with g the adjoint, h_prev the step's previous state
// (h0 at the row's first step in run order; use_backward: time runs from T-1 down), and
// q = r / sqrt(max(z, floor)) (floor = 1/(4 bound^2), 0 without a bound; q = 0 where that
// is 0); at a reset h_prev and g_m are 0 and m is 1:
//   g_a = g h_prev a,  g_m = g i x
//   d_pa = (d_r - c sp g_a) r(1-r) + c sp a^2 (1-r) q g_m
//   d_px = (d_i + g m x) i(1-i),  dx = g m i,  d_spe = c a^2 q g_m - c r g_a
// all zero past a row's length; d_r, d_i read only with has_d_r, has_d_i.
template <class T, class A, class Index>
__device__ __forceinline__ void rglru_gate_grads_body(
    const T* r, const T* i, const T* x, const T* h, const T* h0, const T* g, const T* d_r,
    const T* d_i, const T* sp, const int* resets, const int* seq_len, int has_d_r,
    int has_d_i, int use_resets, int use_seq_len, int use_backward, A c, A floor,
    A decay_tail, long long n_steps, Index n, Index batch, Index hidden, T* d_pa, T* d_px,
    T* dx, T* d_spe)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index step_row = k / hidden;
        const Index col = k - step_row * hidden;
        const Index t = step_row / batch;
        const Index row = step_row - t * batch;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        if ((long long)t >= length) {
            d_pa[k] = gc_store<T>::from(zero);
            d_px[k] = gc_store<T>::from(zero);
            dx[k] = gc_store<T>::from(zero);
            d_spe[k] = gc_store<T>::from(zero);
            continue;
        }
        const bool first = use_backward ? (long long)t == length - 1 : t == 0;
        const Index state = row * hidden + col;
        const A prev = first ? gc_load(h0[state])
            : gc_load(h[(use_backward ? t + 1 : t - 1) * batch * hidden + state]);
        const A gate_r = gc_load(r[k]);
        const A gate_i = gc_load(i[k]);
        const A g_k = gc_load(g[k]);
        const A x_k = gc_load(x[k]);
        const A s = gc_load(sp[col]);
        const A log_a = -c * gate_r * s;
        const A a = rglru_decay(log_a, decay_tail);
        const A zz = -rglru_expm1((A)2 * log_a);
        const A up_r = has_d_r ? gc_load(d_r[k]) : zero;
        const A up_i = has_d_i ? gc_load(d_i[k]) : zero;
        const bool reset = use_resets && resets[step_row];
        const A m = reset ? one : gc_sqrt(zz);
        const A g_a = reset ? zero : g_k * prev * a;
        const A g_m = reset ? zero : g_k * gate_i * x_k;
        const A root = gc_sqrt(zz > floor ? zz : floor);
        const A q = root > zero ? gate_r / root : zero;
        d_pa[k] = gc_store<T>::from((up_r - c * s * g_a) * gate_r * (one - gate_r)
                                    + c * s * a * a * (one - gate_r) * q * g_m);
        d_px[k] = gc_store<T>::from((up_i + g_k * m * x_k) * gate_i * (one - gate_i));
        dx[k] = gc_store<T>::from(g_k * m * gate_i);
        d_spe[k] = gc_store<T>::from(c * a * a * q * g_m - c * gate_r * g_a);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void rglru_gate_grads(
    const T* r, const T* i, const T* x, const T* h, const T* h0, const T* g, const T* d_r,
    const T* d_i, const T* sp, const int* resets, const int* seq_len, int has_d_r,
    int has_d_i, int use_resets, int use_seq_len, int use_backward, A c, A floor,
    A decay_tail, long long n_steps, long long batch, long long hidden, T* d_pa, T* d_px,
    T* dx, T* d_spe)
{
    const long long n = n_steps * batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        rglru_gate_grads_body<T, A, unsigned int>(
            r, i, x, h, h0, g, d_r, d_i, sp, resets, seq_len, has_d_r, has_d_i, use_resets,
            use_seq_len, use_backward, c, floor, decay_tail, n_steps, (unsigned int)n,
            (unsigned int)batch, (unsigned int)hidden, d_pa, d_px, dx, d_spe);
    } else {
        rglru_gate_grads_body<T, A, unsigned long long>(
            r, i, x, h, h0, g, d_r, d_i, sp, resets, seq_len, has_d_r, has_d_i, use_resets,
            use_seq_len, use_backward, c, floor, decay_tail, n_steps, (unsigned long long)n,
            (unsigned long long)batch, (unsigned long long)hidden, d_pa, d_px, dx, d_spe);
    }
}
