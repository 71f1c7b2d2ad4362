// The diagonal linear recurrence (docs/spec.md section 18.1) in its gated form, the one the
// minGRU and the minLSTM (section 18.2) run: per-(b, j) scans over time, one thread per
// element of the [B, H] state. All arrays C-contiguous [T, B, H]; grid-stride loop.
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). Each kernel's signature below is the one place its parameters are written
// (gradcells/gpu/_kernels.py reads it and generates the extern "C" entry points).

#include "common.cuh"

// The linear recurrence, one thread per element k = b*H + j of the [B, H] state, each
// running its own column over time from s0[k]: the multiplier a_t = 1 - z_t and the addend
// c_t = z_t*c[t] (use_gated: c holds h-tilde) or c[t]. use_post = 0: s = a*s + c, the output s
// (the forward, and forward mode's tangent); use_post = 1: the output s + c, then
// s = a*(s + c) (the adjoint: c holds d_h, s starts at d_h_final and ends at dh0).
// use_backward: time runs from T-1 down to 0. A step past the row's length is the identity
// (a = 1, c = 0; z and c are not read there) and outputs 0. s_final[k]: the state after the
// last step.
template <class T, class A, class Index>
__device__ __forceinline__ void gated_scan_body(
    const T* z, const T* c, const T* s0, const int* seq_len, int use_seq_len, int use_gated,
    int use_post, int use_backward, long long n_steps, Index n, Index hidden, T* out,
    T* s_final)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const long long length = use_seq_len ? (long long)seq_len[k / hidden] : n_steps;
        A s = gc_load(s0[k]);
        for (long long i = 0; i < n_steps; ++i) {
            const long long t = use_backward ? n_steps - 1 - i : i;
            const unsigned long long at = (unsigned long long)t * (unsigned long long)n + k;
            if (t >= length) {
                out[at] = gc_store<T>::from(zero);
                continue;
            }
            const A gate = gc_load(z[at]);
            const A add = use_gated ? gate * gc_load(c[at]) : gc_load(c[at]);
            if (use_post) {
                const A v = s + add;
                out[at] = gc_store<T>::from(v);
                s = (one - gate) * v;
            } else {
                s = (one - gate) * s + add;
                out[at] = gc_store<T>::from(s);
            }
        }
        s_final[k] = gc_store<T>::from(s);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gated_scan(
    const T* z, const T* c, const T* s0, const int* seq_len, int use_seq_len, int use_gated,
    int use_post, int use_backward, long long n_steps, long long batch, long long hidden,
    T* out, T* s_final)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gated_scan_body<T, A, unsigned int>(
            z, c, s0, seq_len, use_seq_len, use_gated, use_post, use_backward, n_steps,
            (unsigned int)n, (unsigned int)hidden, out, s_final);
    } else {
        gated_scan_body<T, A, unsigned long long>(
            z, c, s0, seq_len, use_seq_len, use_gated, use_post, use_backward, n_steps,
            (unsigned long long)n, (unsigned long long)hidden, out, s_final);
    }
}

// The public linear scan (docs/spec.md section 18.1), h_t = m_t*h_{t-1} + c_t, over the
// columns k = b*width + j of the [B, D] state. Real or complex: with use_complex_state the
// states, c, s0, out and s_final hold interleaved (re, im) pairs of T (element k at
// [2k, 2k+1]); with use_complex_a a does too, else a is real. The multiplier m_t is a_t
// (conj(a_t) with use_conj: the adjoint), 0 where resets[t*batch + b] (use_resets: the
// incoming state replaced by zeros) and the identity past the row's length (use_seq_len; a,
// c and resets are not read there, the output is 0). use_post = 0: s = m*s + c, the output s
// (the forward and its tangent); use_post = 1: the output s + c, then s = m*(s + c) (the
// adjoint: c holds d_h, s starts at d_h_final and ends at dh0). use_backward: time runs from
// T-1 down to 0.
//
// linear_scan runs each column from s0 over all T steps (one thread a column);
// linear_scan_maps, linear_scan_carries and linear_scan_chunks are the same recurrence as a
// chunked two-level scan (the "parallel" method: one thread per (chunk, column) in the first
// and last pass): each chunk of `chunk` run positions reduced to its affine map
// s -> P*s + C (P the product of its multipliers, C the chunk run from 0; A-typed pairs),
// a pass over the chunks' maps for each chunk's incoming state, then each chunk run again
// from it, writing the outputs (the last chunk's state is s_final).

struct gc_scan_flags {
    int use_resets, use_complex_a, use_complex_state, use_conj, use_post, use_backward;
};

// Run positions [first, last) of one column's run order from the state (s_re, s_im),
// updated in place, multiplying (p_re, p_im) by every multiplier; writes each output into
// out unless out is null.
template <class T, class A>
__device__ __forceinline__ void linear_run(
    const T* a, const T* c, const int* resets, gc_scan_flags f, long long n_steps,
    long long batch, unsigned long long n, unsigned long long k, unsigned long long row,
    long long length, long long first, long long last, T* out, A& s_re, A& s_im, A& p_re,
    A& p_im)
{
    const A zero = (A)0;
    const unsigned long long ca = f.use_complex_a ? 2 : 1;
    const unsigned long long cs = f.use_complex_state ? 2 : 1;
    for (long long i = first; i < last; ++i) {
        const long long t = f.use_backward ? n_steps - 1 - i : i;
        const unsigned long long at = (unsigned long long)t * n + k;
        if (t >= length) {
            if (out != nullptr) {
                out[cs * at] = gc_store<T>::from(zero);
                if (f.use_complex_state) {
                    out[cs * at + 1] = gc_store<T>::from(zero);
                }
            }
            continue;
        }
        const bool reset = f.use_resets
            && resets[(unsigned long long)t * (unsigned long long)batch + row] != 0;
        const A m_re = reset ? zero : gc_load(a[ca * at]);
        A m_im = (reset || !f.use_complex_a) ? zero : gc_load(a[ca * at + 1]);
        if (f.use_conj) {
            m_im = -m_im;
        }
        const A c_re = gc_load(c[cs * at]);
        const A c_im = f.use_complex_state ? gc_load(c[cs * at + 1]) : zero;
        A v_re = s_re;
        A v_im = s_im;
        if (f.use_post) {
            v_re = s_re + c_re;
            v_im = s_im + c_im;
            s_re = m_re * v_re - m_im * v_im;
            s_im = m_re * v_im + m_im * v_re;
        } else {
            s_re = m_re * v_re - m_im * v_im + c_re;
            s_im = m_re * v_im + m_im * v_re + c_im;
            v_re = s_re;
            v_im = s_im;
        }
        if (out != nullptr) {
            out[cs * at] = gc_store<T>::from(v_re);
            if (f.use_complex_state) {
                out[cs * at + 1] = gc_store<T>::from(v_im);
            }
        }
        const A q_re = p_re * m_re - p_im * m_im;
        p_im = p_re * m_im + p_im * m_re;
        p_re = q_re;
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void linear_scan(
    const T* a, const T* c, const T* s0, const int* seq_len, const int* resets,
    int use_seq_len, int use_resets, int use_complex_a, int use_complex_state, int use_conj,
    int use_post, int use_backward, long long n_steps, long long batch, long long width,
    T* out, T* s_final)
{
    const gc_scan_flags f = {use_resets, use_complex_a, use_complex_state, use_conj, use_post,
                             use_backward};
    const unsigned long long n = (unsigned long long)(batch * width);
    const unsigned long long cs = use_complex_state ? 2 : 1;
    for (unsigned long long k = gc_first_x<unsigned long long>(); k < n;
         k += gc_stride_x<unsigned long long>()) {
        const unsigned long long row = k / (unsigned long long)width;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        A s_re = gc_load(s0[cs * k]);
        A s_im = use_complex_state ? gc_load(s0[cs * k + 1]) : (A)0;
        A p_re = (A)1;
        A p_im = (A)0;
        linear_run<T, A>(a, c, resets, f, n_steps, batch, n, k, row, length, 0, n_steps, out,
                         s_re, s_im, p_re, p_im);
        s_final[cs * k] = gc_store<T>::from(s_re);
        if (use_complex_state) {
            s_final[cs * k + 1] = gc_store<T>::from(s_im);
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void linear_scan_maps(
    const T* a, const T* c, const int* seq_len, const int* resets, int use_seq_len,
    int use_resets, int use_complex_a, int use_complex_state, int use_conj, int use_post,
    int use_backward, long long n_steps, long long batch, long long width, long long chunk,
    long long n_chunks, A* agg_a, A* agg_c)
{
    const gc_scan_flags f = {use_resets, use_complex_a, use_complex_state, use_conj, use_post,
                             use_backward};
    const unsigned long long n = (unsigned long long)(batch * width);
    const unsigned long long items = n * (unsigned long long)n_chunks;
    for (unsigned long long q = gc_first_x<unsigned long long>(); q < items;
         q += gc_stride_x<unsigned long long>()) {
        const unsigned long long k = q % n;
        const long long first = (long long)(q / n) * chunk;
        const long long last = first + chunk < n_steps ? first + chunk : n_steps;
        const unsigned long long row = k / (unsigned long long)width;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        A s_re = (A)0;
        A s_im = (A)0;
        A p_re = (A)1;
        A p_im = (A)0;
        linear_run<T, A>(a, c, resets, f, n_steps, batch, n, k, row, length, first, last,
                         (T*)nullptr, s_re, s_im, p_re, p_im);
        agg_a[2 * q] = p_re;
        agg_a[2 * q + 1] = p_im;
        agg_c[2 * q] = s_re;
        agg_c[2 * q + 1] = s_im;
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void linear_scan_carries(
    const A* agg_a, const A* agg_c, const T* s0, int use_complex_state, long long batch,
    long long width, long long n_chunks, A* carries)
{
    const unsigned long long n = (unsigned long long)(batch * width);
    const unsigned long long cs = use_complex_state ? 2 : 1;
    for (unsigned long long k = gc_first_x<unsigned long long>(); k < n;
         k += gc_stride_x<unsigned long long>()) {
        A s_re = gc_load(s0[cs * k]);
        A s_im = use_complex_state ? gc_load(s0[cs * k + 1]) : (A)0;
        for (long long kc = 0; kc < n_chunks; ++kc) {
            const unsigned long long q = (unsigned long long)kc * n + k;
            carries[2 * q] = s_re;
            carries[2 * q + 1] = s_im;
            const A n_re = agg_a[2 * q] * s_re - agg_a[2 * q + 1] * s_im + agg_c[2 * q];
            s_im = agg_a[2 * q] * s_im + agg_a[2 * q + 1] * s_re + agg_c[2 * q + 1];
            s_re = n_re;
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void linear_scan_chunks(
    const T* a, const T* c, const int* seq_len, const int* resets, const A* carries,
    int use_seq_len, int use_resets, int use_complex_a, int use_complex_state, int use_conj,
    int use_post, int use_backward, long long n_steps, long long batch, long long width,
    long long chunk, long long n_chunks, T* out, T* s_final)
{
    const gc_scan_flags f = {use_resets, use_complex_a, use_complex_state, use_conj, use_post,
                             use_backward};
    const unsigned long long n = (unsigned long long)(batch * width);
    const unsigned long long items = n * (unsigned long long)n_chunks;
    const unsigned long long cs = use_complex_state ? 2 : 1;
    for (unsigned long long q = gc_first_x<unsigned long long>(); q < items;
         q += gc_stride_x<unsigned long long>()) {
        const unsigned long long k = q % n;
        const long long kc = (long long)(q / n);
        const long long first = kc * chunk;
        const long long last = first + chunk < n_steps ? first + chunk : n_steps;
        const unsigned long long row = k / (unsigned long long)width;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        A s_re = carries[2 * q];
        A s_im = carries[2 * q + 1];
        A p_re = (A)1;
        A p_im = (A)0;
        linear_run<T, A>(a, c, resets, f, n_steps, batch, n, k, row, length, first, last, out,
                         s_re, s_im, p_re, p_im);
        if (kc == n_chunks - 1) {
            s_final[cs * k] = gc_store<T>::from(s_re);
            if (use_complex_state) {
                s_final[cs * k + 1] = gc_store<T>::from(s_im);
            }
        }
    }
}
