// Mamba's selective scan (docs/spec.md section 18.4), in Mamba's layout: u, delta, z
// [Bt, Dm, L]; a_mat (A) [Dm, N]; b_mat, c_mat (B, C) [Bt, G, N, L] (ungrouped: G = 1, each
// its own G; channel d reads group d / (Dm/G)); d_vec (D), bias (delta_bias) [Dm]. All arrays
// C-contiguous; an absent optional array is any array of the launch, never read (its use_
// flag 0). The math is gradcells/cells/selective/reference.py, whose docstring derives the
// backward:
//
//   r = delta_t + bias,  dt = softplus(r) (use_softplus) or r,  a_t = exp(dt A)
//   x_t = a_t x_{t-1} + dt B_t u_t,  p_t = sum_n C_t x_t + D u_t,  y_t = p_t silu(z_t)
//   g_t = C_t d_p_t + a_{t+1} g_{t+1}   (the adjoint; g_last = C d_p + d_last)
//
// selective_forward: one thread per (b, d), looping over time and over the N states (the
// state in the scratch x, N of A per thread). selective_backward: one thread per (b, part),
// a part being Dm/P channels with P = gcd(G_B, G_C), so that every group of B and of C is
// one thread's and its sums need no atomics; the thread runs its channels in turn: a forward
// that keeps the state before every chunk of `chunk` steps (marks), then the adjoint chunk by
// chunk from the last, each chunk's states recomputed from its mark (states). Nothing
// [Bt, Dm, L, N] is made. Gradients are written in A (the arithmetic type); d_b, d_c are
// zeroed by the caller; d_a, d_d, d_bias are per batch row ([Bt, Dm, .]), summed by gpu.py.
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). Each kernel's signature below is the one place its parameters are written
// (gradcells/gpu/_kernels.py reads it and generates the extern "C" entry points).

#include "common.cuh"

__device__ __forceinline__ float sel_exp(float a) { return expf(a); }
__device__ __forceinline__ double sel_exp(double a) { return exp(a); }
__device__ __forceinline__ float sel_log1p(float a) { return log1pf(a); }
__device__ __forceinline__ double sel_log1p(double a) { return log1p(a); }

// softplus(r) = max(r, 0) + log1p(exp(-|r|)): no overflow.
template <class A>
__device__ __forceinline__ A sel_softplus(A r) {
    return (r > (A)0 ? r : (A)0) + sel_log1p(sel_exp(-gc_abs(r)));
}

// (r, dt) of step t of channel (b, d): the raw step size and the one the recurrence uses.
template <class T, class A>
__device__ __forceinline__ A sel_step(const T* delta, const T* bias, int use_bias,
                                      int use_softplus, long long at, long long d, A* raw)
{
    A r = gc_load(delta[at]);
    if (use_bias) r += gc_load(bias[d]);
    *raw = r;
    return use_softplus ? sel_softplus(r) : r;
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void selective_forward(
    const T* u, const T* delta, const T* a_mat, const T* b_mat, const T* c_mat,
    const T* d_vec, const T* z, const T* bias, int use_d, int use_z, int use_bias,
    int use_softplus, int use_reverse, long long batch, long long channels, long long n_steps,
    long long n_state, long long groups_b, long long groups_c, A* x, T* y, T* last)
{
    const long long n = batch * channels;
    for (long long k = gc_first_x<long long>(); k < n; k += gc_stride_x<long long>()) {
        const long long b = k / channels;
        const long long d = k - b * channels;
        const long long gb = d / (channels / groups_b);
        const long long gcn = d / (channels / groups_c);
        const T* bm = b_mat + (b * groups_b + gb) * n_state * n_steps;
        const T* cm = c_mat + (b * groups_c + gcn) * n_state * n_steps;
        A* xs = x + k * n_state;
        for (long long i = 0; i < n_state; ++i) xs[i] = (A)0;
        for (long long s = 0; s < n_steps; ++s) {
            const long long t = use_reverse ? n_steps - 1 - s : s;
            const long long at = k * n_steps + t;
            A raw;
            const A step = sel_step<T, A>(delta, bias, use_bias, use_softplus, at, d, &raw);
            const A ut = gc_load(u[at]);
            const A drive = step * ut;
            A acc = (A)0;
            for (long long i = 0; i < n_state; ++i) {
                xs[i] = sel_exp(step * gc_load(a_mat[d * n_state + i])) * xs[i]
                        + drive * gc_load(bm[i * n_steps + t]);
                acc += gc_load(cm[i * n_steps + t]) * xs[i];
            }
            if (use_d) acc += gc_load(d_vec[d]) * ut;
            if (use_z) {
                const A zt = gc_load(z[at]);
                acc *= zt * gc_sigmoid(zt);
            }
            y[at] = gc_store<T>::from(acc);
        }
        for (long long i = 0; i < n_state; ++i) last[k * n_state + i] = gc_store<T>::from(xs[i]);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void selective_backward(
    const T* u, const T* delta, const T* a_mat, const T* b_mat, const T* c_mat,
    const T* d_vec, const T* z, const T* bias, int use_d, int use_z, int use_bias,
    int use_softplus, int use_reverse, long long batch, long long channels, long long n_steps,
    long long n_state, long long groups_b, long long groups_c, long long parts,
    long long chunk, const T* d_y, const T* d_last, int use_d_last, A* scratch, A* d_u,
    A* d_delta, A* d_a, A* d_b, A* d_c, A* d_d, A* d_z, A* d_bias)
{
    const long long n = batch * parts;
    const long long n_chunks = (n_steps + chunk - 1) / chunk;
    const long long per_part = channels / parts;
    for (long long k = gc_first_x<long long>(); k < n; k += gc_stride_x<long long>()) {
        const long long b = k / parts;
        const long long part = k - b * parts;
        A* marks = scratch + k * (n_chunks + chunk + 2) * n_state;   // x before each chunk
        A* states = marks + n_chunks * n_state;                      // a chunk's states
        A* g = states + (chunk + 1) * n_state;
        for (long long d = part * per_part; d < (part + 1) * per_part; ++d) {
            const long long row = b * channels + d;
            const long long gb = d / (channels / groups_b);
            const long long gcn = d / (channels / groups_c);
            const long long b_off = (b * groups_b + gb) * n_state * n_steps;
            const long long c_off = (b * groups_c + gcn) * n_state * n_steps;
            const T* am = a_mat + d * n_state;
            // Pass 1: the forward, keeping the state before every chunk.
            for (long long i = 0; i < n_state; ++i) states[i] = (A)0;
            for (long long s = 0; s < n_steps; ++s) {
                if (s % chunk == 0) {
                    for (long long i = 0; i < n_state; ++i)
                        marks[(s / chunk) * n_state + i] = states[i];
                }
                const long long t = use_reverse ? n_steps - 1 - s : s;
                const long long at = row * n_steps + t;
                A raw;
                const A step = sel_step<T, A>(delta, bias, use_bias, use_softplus, at, d, &raw);
                const A drive = step * gc_load(u[at]);
                for (long long i = 0; i < n_state; ++i)
                    states[i] = sel_exp(step * gc_load(am[i])) * states[i]
                                + drive * gc_load(b_mat[b_off + i * n_steps + t]);
            }
            // Pass 2: the adjoint, chunk by chunk from the last.
            for (long long i = 0; i < n_state; ++i) {
                g[i] = use_d_last ? gc_load(d_last[row * n_state + i]) : (A)0;
                d_a[row * n_state + i] = (A)0;
            }
            A sum_d = (A)0;
            A sum_bias = (A)0;
            for (long long c = n_chunks - 1; c >= 0; --c) {
                const long long s0 = c * chunk;
                const long long s1 = s0 + chunk < n_steps ? s0 + chunk : n_steps;
                for (long long i = 0; i < n_state; ++i) states[i] = marks[c * n_state + i];
                for (long long s = s0; s < s1; ++s) {   // states[j + 1]: x after step s0 + j
                    const long long t = use_reverse ? n_steps - 1 - s : s;
                    const long long at = row * n_steps + t;
                    const long long j = s - s0;
                    A raw;
                    const A step = sel_step<T, A>(delta, bias, use_bias, use_softplus, at, d,
                                                  &raw);
                    const A drive = step * gc_load(u[at]);
                    for (long long i = 0; i < n_state; ++i)
                        states[(j + 1) * n_state + i] =
                            sel_exp(step * gc_load(am[i])) * states[j * n_state + i]
                            + drive * gc_load(b_mat[b_off + i * n_steps + t]);
                }
                for (long long s = s1 - 1; s >= s0; --s) {
                    const long long t = use_reverse ? n_steps - 1 - s : s;
                    const long long at = row * n_steps + t;
                    const long long j = s - s0;
                    A raw;
                    const A step = sel_step<T, A>(delta, bias, use_bias, use_softplus, at, d,
                                                  &raw);
                    const A ut = gc_load(u[at]);
                    A p = (A)0;
                    for (long long i = 0; i < n_state; ++i)
                        p += gc_load(c_mat[c_off + i * n_steps + t])
                             * states[(j + 1) * n_state + i];
                    if (use_d) p += gc_load(d_vec[d]) * ut;
                    const A dy = gc_load(d_y[at]);
                    A d_p = dy;
                    if (use_z) {
                        const A zt = gc_load(z[at]);
                        const A sg = gc_sigmoid(zt);
                        d_z[at] = dy * p * sg * ((A)1 + zt * ((A)1 - sg));
                        d_p = dy * zt * sg;
                    }
                    A du = (A)0;
                    if (use_d) {
                        du = gc_load(d_vec[d]) * d_p;
                        sum_d += d_p * ut;
                    }
                    A d_step = (A)0;
                    for (long long i = 0; i < n_state; ++i) {
                        const long long bi = b_off + i * n_steps + t;
                        const long long ci = c_off + i * n_steps + t;
                        const A bt = gc_load(b_mat[bi]);
                        const A ai = gc_load(am[i]);
                        g[i] += gc_load(c_mat[ci]) * d_p;
                        d_c[ci] += d_p * states[(j + 1) * n_state + i];
                        d_b[bi] += g[i] * step * ut;
                        du += g[i] * step * bt;
                        const A decay = sel_exp(step * ai);
                        const A carried = g[i] * decay * states[j * n_state + i];
                        d_step += g[i] * bt * ut + carried * ai;
                        d_a[row * n_state + i] += carried * step;
                        g[i] = decay * g[i];
                    }
                    if (use_softplus) d_step *= gc_sigmoid(raw);
                    d_u[at] = du;
                    d_delta[at] = d_step;
                    sum_bias += d_step;
                }
            }
            d_d[row] = sum_d;
            d_bias[row] = sum_bias;
        }
    }
}
