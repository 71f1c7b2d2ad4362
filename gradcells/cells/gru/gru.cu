// GRU block cell, one time step per launch: the fused elementwise forward and backward.
// Column blocks r, u (then c); one thread per element k = b*H + j of a [B, H] array, in a
// grid-stride loop. [B, H] arrays are C-contiguous; the pre-activation inputs gx_*, gh_*
// are rows of width 2H (r, u) or H (c) with their own row stride ld_* (so they may be
// column blocks of one wider matmul result).
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). The parameter lists are mirrored, in order, by gradcells/gpu/_kernels.py,
// which generates each kernel's extern "C" entry point per dtype (see GC_KERNEL).
// In the comments, @ is a matmul and * an elementwise (or scalar) product.
// Rows past their length (use_seq_len, step >= seq_len[b]) write zeros to the step's
// outputs and leave the state alone; running rows also write their new h to h_state,
// which may be the h_prev buffer itself (read, then written, by one thread).
// Masks (docs/spec.md, section 11.3): the matmuls' inputs are masked around the kernels
// (h_prev here is the state itself, what the interpolation reads; gru_gates' h_prev is what
// the matmul (r*h)@W_ch sees). Zoneout (use_zoneout_h, zoneout_h: the step's [B, H] mask)
// mixes the new state with the old one, h = z*h_prev + (1-z)*h, in the kernel that forms h;
// its backward splits the upstream gradient g of the zoned state into (1-z)*g, the new
// state's, and z*g, added to dh_direct (the old state's).

#include "common.cuh"

// Reset before the candidate matmul, part 1 of 2:
//   [r, u] = sigmoid(gx_ru + gh_ru + b_ru);   rh = r*h_prev   (the next matmul is rh@W_ch)
template <class T, class A, class Index>
__device__ __forceinline__ void gru_gates_body(
    const T* gx_ru, Index ld_gx_ru, const T* gh_ru, Index ld_gh_ru, const T* b_ru,
    const T* h_prev, const int* seq_len, int use_seq_len, long long step, Index n,
    Index hidden, T* r_out, T* u_out, T* rh_out)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z = gc_store<T>::from((A)0);
            r_out[k] = z; u_out[k] = z; rh_out[k] = z;
            continue;
        }
        const Index x = row * ld_gx_ru + col;
        const Index h = row * ld_gh_ru + col;
        const A r = gc_rounded<T>(gc_sigmoid(
            gc_load(gx_ru[x]) + gc_load(gh_ru[h]) + gc_load(b_ru[col])));
        const A u = gc_sigmoid(gc_load(gx_ru[x + hidden]) + gc_load(gh_ru[h + hidden])
                               + gc_load(b_ru[col + hidden]));
        r_out[k] = gc_store<T>::from(r);
        u_out[k] = gc_store<T>::from(u);
        rh_out[k] = gc_store<T>::from(r * gc_load(h_prev[k]));
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_gates(
    const T* gx_ru, long long ld_gx_ru, const T* gh_ru, long long ld_gh_ru, const T* b_ru,
    const T* h_prev, const int* seq_len, int use_seq_len,
    long long step, long long batch, long long hidden,
    T* r, T* u, T* rh)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_gates_body<T, A, unsigned int>(
            gx_ru, (unsigned int)ld_gx_ru, gh_ru, (unsigned int)ld_gh_ru, b_ru, h_prev,
            seq_len, use_seq_len, step, (unsigned int)n, (unsigned int)hidden, r, u, rh);
    } else {
        gru_gates_body<T, A, unsigned long long>(
            gx_ru, (unsigned long long)ld_gx_ru, gh_ru, (unsigned long long)ld_gh_ru, b_ru,
            h_prev, seq_len, use_seq_len, step, (unsigned long long)n,
            (unsigned long long)hidden, r, u, rh);
    }
}

// Reset before the candidate matmul, part 2 of 2 (u is part 1's output):
//   c = tanh(gx_c + gh_c + b_c)   (gh_c = rh@W_ch);    h = u*h_prev + (1-u)*c
template <class T, class A, class Index>
__device__ __forceinline__ void gru_candidate_body(
    const T* gx_c, Index ld_gx_c, const T* gh_c, Index ld_gh_c, const T* b_c,
    const T* u_in, const T* h_prev, const int* seq_len, const T* zoneout_h, int use_seq_len,
    int use_zoneout_h, long long step, Index n, Index hidden, T* c_out, T* h_out,
    T* h_state)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z = gc_store<T>::from((A)0);
            c_out[k] = z; h_out[k] = z;
            continue;
        }
        const A c = gc_rounded<T>(gc_tanh(
            gc_load(gx_c[row * ld_gx_c + col]) + gc_load(gh_c[row * ld_gh_c + col])
            + gc_load(b_c[col])));
        const A u = gc_load(u_in[k]);
        const A hp = gc_load(h_prev[k]);
        A h = u * hp + ((A)1 - u) * c;
        if (use_zoneout_h) h = gc_zoned(gc_load(zoneout_h[k]), hp, h);
        c_out[k] = gc_store<T>::from(c);
        h_out[k] = gc_store<T>::from(h);
        if (use_seq_len) h_state[k] = gc_store<T>::from(h);
    }
}

// gc-optional (zoneout): zoneout_h use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_candidate(
    const T* gx_c, long long ld_gx_c, const T* gh_c, long long ld_gh_c, const T* b_c,
    const T* u, const T* h_prev, const int* seq_len, const T* zoneout_h, int use_seq_len,
    int use_zoneout_h, long long step, long long batch, long long hidden,
    T* c, T* h, T* h_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_candidate_body<T, A, unsigned int>(
            gx_c, (unsigned int)ld_gx_c, gh_c, (unsigned int)ld_gh_c, b_c, u, h_prev,
            seq_len, zoneout_h, use_seq_len, use_zoneout_h, step, (unsigned int)n,
            (unsigned int)hidden, c, h, h_state);
    } else {
        gru_candidate_body<T, A, unsigned long long>(
            gx_c, (unsigned long long)ld_gx_c, gh_c, (unsigned long long)ld_gh_c, b_c, u,
            h_prev, seq_len, zoneout_h, use_seq_len, use_zoneout_h, step, (unsigned long long)n,
            (unsigned long long)hidden, c, h, h_state);
    }
}

// Reset after (cuDNN's variant), the whole step; b_c is [2H] = [b_cx, b_ch]:
//   [r, u] = sigmoid(gx_ru + gh_ru + b_ru)
//   c = tanh(gx_c + b_cx + r*(gh_c + b_ch))      (gx_c = x@W_cx, gh_c = h_prev@W_ch)
//   h = u*h_prev + (1-u)*c
template <class T, class A, class Index>
__device__ __forceinline__ void gru_forward_reset_after_body(
    const T* gx_ru, Index ld_gx_ru, const T* gx_c, Index ld_gx_c,
    const T* gh_ru, Index ld_gh_ru, const T* gh_c, Index ld_gh_c,
    const T* b_ru, const T* b_c, const T* h_prev, const int* seq_len, const T* zoneout_h,
    int use_seq_len, int use_zoneout_h, long long step, Index n, Index hidden,
    T* r_out, T* u_out, T* c_out, T* h_out, T* h_state)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z = gc_store<T>::from((A)0);
            r_out[k] = z; u_out[k] = z; c_out[k] = z; h_out[k] = z;
            continue;
        }
        const Index xr = row * ld_gx_ru + col;
        const Index hr = row * ld_gh_ru + col;
        const A r = gc_rounded<T>(gc_sigmoid(
            gc_load(gx_ru[xr]) + gc_load(gh_ru[hr]) + gc_load(b_ru[col])));
        const A u = gc_rounded<T>(gc_sigmoid(
            gc_load(gx_ru[xr + hidden]) + gc_load(gh_ru[hr + hidden])
            + gc_load(b_ru[col + hidden])));
        const A recurrent = gc_load(gh_c[row * ld_gh_c + col]) + gc_load(b_c[col + hidden]);
        const A c = gc_rounded<T>(gc_tanh(
            gc_load(gx_c[row * ld_gx_c + col]) + gc_load(b_c[col]) + r * recurrent));
        const A hp = gc_load(h_prev[k]);
        A h = u * hp + ((A)1 - u) * c;
        if (use_zoneout_h) h = gc_zoned(gc_load(zoneout_h[k]), hp, h);
        r_out[k] = gc_store<T>::from(r);
        u_out[k] = gc_store<T>::from(u);
        c_out[k] = gc_store<T>::from(c);
        h_out[k] = gc_store<T>::from(h);
        if (use_seq_len) h_state[k] = gc_store<T>::from(h);
    }
}

// gc-optional (zoneout): zoneout_h use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_forward_reset_after(
    const T* gx_ru, long long ld_gx_ru, const T* gx_c, long long ld_gx_c,
    const T* gh_ru, long long ld_gh_ru, const T* gh_c, long long ld_gh_c,
    const T* b_ru, const T* b_c, const T* h_prev, const int* seq_len, const T* zoneout_h,
    int use_seq_len, int use_zoneout_h, long long step, long long batch, long long hidden,
    T* r, T* u, T* c, T* h, T* h_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_forward_reset_after_body<T, A, unsigned int>(
            gx_ru, (unsigned int)ld_gx_ru, gx_c, (unsigned int)ld_gx_c, gh_ru,
            (unsigned int)ld_gh_ru, gh_c, (unsigned int)ld_gh_c, b_ru, b_c, h_prev, seq_len,
            zoneout_h, use_seq_len, use_zoneout_h, step, (unsigned int)n, (unsigned int)hidden, r, u, c, h, h_state);
    } else {
        gru_forward_reset_after_body<T, A, unsigned long long>(
            gx_ru, (unsigned long long)ld_gx_ru, gx_c, (unsigned long long)ld_gx_c, gh_ru,
            (unsigned long long)ld_gh_ru, gh_c, (unsigned long long)ld_gh_c, b_ru, b_c,
            h_prev, seq_len, zoneout_h, use_seq_len, use_zoneout_h, step, (unsigned long long)n,
            (unsigned long long)hidden, r, u, c, h, h_state);
    }
}

// The upstream gradient of a step's state at element k: its own d_h (has_d_h) plus, on
// a row's last step (last), the final-state gradient (has_d_h_final), else the carry
// dh_next_a + dh_next_b. The backward and its tangent (on the tangents' arrays) read it.
template <class A, class T, class Index>
__device__ __forceinline__ A gru_upstream(
    const T* d_h, const T* dh_next_a, const T* dh_next_b, const T* d_h_final, int has_d_h,
    int has_d_h_final, bool last, Index k)
{
    A dh = has_d_h ? gc_load(d_h[k]) : (A)0;
    if (last) {
        if (has_d_h_final) dh = dh + gc_load(d_h_final[k]);
    } else {
        dh = dh + (gc_load(dh_next_a[k]) + gc_load(dh_next_b[k]));
    }
    return dh;
}

// Backward, part 1 (both variants). The upstream gradient of the step's h is the step's
// own d_h (has_d_h) plus, on a row's last step (step + 1 == length, length = seq_len[b]
// or n_steps), the final-state gradient d_h_final (has_d_h_final), and otherwise the carry
// dh_next_a + dh_next_b from step + 1 (never read on a last step):
//   dc_bar = dh*(1-u)*(1-c^2);   du_bar = dh*(h_prev-c)*u(1-u);   dh_direct = dh*u
//   reset after, n = n_pre + b_ch (n_pre = h_prev@W_ch):
//       d_n = dc_bar*r;   dr_bar = dc_bar*n*r(1-r)
//   reset before: rh = r*h_prev; dr_bar is left to gru_backward_reset.
// d_gates is [B, 3H] = [dr_bar, du_bar, dc_bar]. A row past its length has zero gate
// gradients (and d_n, rh) and passes its final-state gradient through: dh_direct =
// d_h_final (or 0). dh_direct may be the dh_next_b buffer itself.
template <class T, class A, class Index>
__device__ __forceinline__ void gru_backward_candidate_body(
    const T* r_in, const T* u_in, const T* c_in, const T* h_prev, const T* n_pre,
    const T* b_c, const T* d_h, const T* dh_next_a, const T* dh_next_b,
    const T* d_h_final, const int* seq_len, const T* zoneout_h, int reset_after,
    int has_d_h, int has_d_h_final, int use_seq_len, int use_zoneout_h, long long step,
    long long n_steps, Index n, Index hidden, T* d_gates, T* d_n, T* dh_direct, T* rh)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        const Index g = row * 3 * hidden + col;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        if (step >= length) {
            const T z = gc_store<T>::from(zero);
            d_gates[g] = z; d_gates[g + hidden] = z; d_gates[g + 2 * hidden] = z;
            if (reset_after) d_n[k] = z; else rh[k] = z;
            dh_direct[k] = has_d_h_final ? d_h_final[k] : z;
            continue;
        }
        A dh = gru_upstream<A>(d_h, dh_next_a, dh_next_b, d_h_final, has_d_h, has_d_h_final,
                               step + 1 >= length, k);
        A dh_old = zero;
        if (use_zoneout_h) {
            const A z = gc_load(zoneout_h[k]);
            dh_old = z * dh;
            dh = (one - z) * dh;
        }
        const A r = gc_load(r_in[k]);
        const A u = gc_load(u_in[k]);
        const A c = gc_load(c_in[k]);
        const A hp = gc_load(h_prev[k]);
        const A dc_bar = dh * (one - u) * (one - c * c);
        const A du_bar = dh * (hp - c) * u * (one - u);
        if (reset_after) {
            const A recurrent = gc_load(n_pre[k]) + gc_load(b_c[col + hidden]);
            d_gates[g] = gc_store<T>::from(dc_bar * recurrent * r * (one - r));
            d_n[k] = gc_store<T>::from(dc_bar * r);
        } else {
            rh[k] = gc_store<T>::from(r * hp);
        }
        d_gates[g + hidden] = gc_store<T>::from(du_bar);
        d_gates[g + 2 * hidden] = gc_store<T>::from(dc_bar);
        dh_direct[k] = gc_store<T>::from(dh * u + dh_old);
    }
}

// gc-optional (zoneout): zoneout_h use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_backward_candidate(
    const T* r, const T* u, const T* c, const T* h_prev, const T* n_pre, const T* b_c,
    const T* d_h, const T* dh_next_a, const T* dh_next_b, const T* d_h_final,
    const int* seq_len, const T* zoneout_h, int reset_after, int has_d_h, int has_d_h_final,
    int use_seq_len, int use_zoneout_h, long long step, long long n_steps, long long batch,
    long long hidden, T* d_gates, T* d_n, T* dh_direct, T* rh)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_backward_candidate_body<T, A, unsigned int>(
            r, u, c, h_prev, n_pre, b_c, d_h, dh_next_a, dh_next_b, d_h_final, seq_len,
            zoneout_h, reset_after, has_d_h, has_d_h_final, use_seq_len, use_zoneout_h, step,
            n_steps,
            (unsigned int)n, (unsigned int)hidden, d_gates, d_n, dh_direct, rh);
    } else {
        gru_backward_candidate_body<T, A, unsigned long long>(
            r, u, c, h_prev, n_pre, b_c, d_h, dh_next_a, dh_next_b, d_h_final, seq_len,
            zoneout_h, reset_after, has_d_h, has_d_h_final, use_seq_len, use_zoneout_h, step,
            n_steps,
            (unsigned long long)n, (unsigned long long)hidden, d_gates, d_n, dh_direct, rh);
    }
}

// Backward, part 2 (reset before only), from d_hr = dc_bar@W_ch^T (dL/d(r*h_prev)):
//   dr_bar = d_hr*h_prev*r(1-r)  -> column block r of d_gates;   dh_direct += d_hr*r
// Rows past their length have d_hr = 0 (their dc_bar is 0), so nothing changes there.
template <class T, class A, class Index>
__device__ __forceinline__ void gru_backward_reset_body(
    const T* d_hr, const T* r_in, const T* h_prev, Index n, Index hidden,
    T* d_gates, T* dh_direct)
{
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        const A dhr = gc_load(d_hr[k]);
        const A r = gc_load(r_in[k]);
        d_gates[row * 3 * hidden + col] =
            gc_store<T>::from(dhr * gc_load(h_prev[k]) * r * (one - r));
        dh_direct[k] = gc_store<T>::from(gc_load(dh_direct[k]) + dhr * r);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_backward_reset(
    const T* d_hr, const T* r, const T* h_prev, long long batch, long long hidden,
    T* d_gates, T* dh_direct)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_backward_reset_body<T, A, unsigned int>(
            d_hr, r, h_prev, (unsigned int)n, (unsigned int)hidden, d_gates, dh_direct);
    } else {
        gru_backward_reset_body<T, A, unsigned long long>(
            d_hr, r, h_prev, (unsigned long long)n, (unsigned long long)hidden, d_gates,
            dh_direct);
    }
}

// The gates' own upstream gradients (docs/spec.md section 16.1), added to a step's gate
// gradients after its backward kernels; launched only when one is given (reset before:
// after gru_backward_candidate for d_u and d_c, after gru_backward_reset for d_r, whose r
// block that kernel writes). Each of d_r, d_u, d_c [B, H] is read only where its flag is
// set, and only in running rows (a row past its length is left as it is):
//   e_c = d_c*(1-c^2):   dc_bar += e_c;   du_bar += d_u*u(1-u);   dr_bar += d_r*r(1-r)
//   reset after, n = n_pre + b_ch:   dr_bar += e_c*n*r(1-r);   d_n += e_c*r
template <class T, class A, class Index>
__device__ __forceinline__ void gru_backward_gates_body(
    const T* r_in, const T* u_in, const T* c_in, const T* n_pre, const T* b_c,
    const T* d_r, const T* d_u, const T* d_c, const int* seq_len, int reset_after,
    int has_d_r, int has_d_u, int has_d_c, int use_seq_len, long long step, Index n,
    Index hidden, T* d_gates, T* d_n)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) continue;
        const Index g = row * 3 * hidden + col;
        const A r = gc_load(r_in[k]);
        const A c = gc_load(c_in[k]);
        const A e_c = has_d_c ? gc_load(d_c[k]) * (one - c * c) : zero;
        A e_r = has_d_r ? gc_load(d_r[k]) : zero;
        if (reset_after) {
            e_r = e_r + e_c * (gc_load(n_pre[k]) + gc_load(b_c[col + hidden]));
            d_n[k] = gc_store<T>::from(gc_load(d_n[k]) + e_c * r);
        }
        if (has_d_u) {
            const A u = gc_load(u_in[k]);
            d_gates[g + hidden] = gc_store<T>::from(
                gc_load(d_gates[g + hidden]) + gc_load(d_u[k]) * u * (one - u));
        }
        if (has_d_c) {
            d_gates[g + 2 * hidden] = gc_store<T>::from(gc_load(d_gates[g + 2 * hidden]) + e_c);
        }
        if (has_d_r || (reset_after && has_d_c)) {
            d_gates[g] = gc_store<T>::from(gc_load(d_gates[g]) + e_r * r * (one - r));
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_backward_gates(
    const T* r, const T* u, const T* c, const T* n_pre, const T* b_c, const T* d_r,
    const T* d_u, const T* d_c, const int* seq_len, int reset_after, int has_d_r,
    int has_d_u, int has_d_c, int use_seq_len, long long step, long long batch,
    long long hidden, T* d_gates, T* d_n)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_backward_gates_body<T, A, unsigned int>(
            r, u, c, n_pre, b_c, d_r, d_u, d_c, seq_len, reset_after, has_d_r, has_d_u,
            has_d_c, use_seq_len, step, (unsigned int)n, (unsigned int)hidden, d_gates, d_n);
    } else {
        gru_backward_gates_body<T, A, unsigned long long>(
            r, u, c, n_pre, b_c, d_r, d_u, d_c, seq_len, reset_after, has_d_r, has_d_u,
            has_d_c, use_seq_len, step, (unsigned long long)n, (unsigned long long)hidden,
            d_gates, d_n);
    }
}

// Forward mode (docs/spec.md section 12): the step's tangents from its primal outputs
// (r, u, c as the forward stored them) and the tangent pre-activations, in two launches
// after the step's forward kernels (the tangent's matmuls around them: gpu.py, _jvp).
//
// Part 1 of 2, the gates (d_ru: the [B, 2H] tangent of [r, u]'s pre-activation,
// C-contiguous; h_seen, dh_seen: the state the matmuls see and its tangent):
//   [dr, du] = [r*(1-r), u*(1-u)]*d_ru;   d_rh = dr*h_seen + r*dh_seen
// (d_rh is the reset-before candidate matmul's input tangent; reset after it is not read).
// A row past its length writes zeros.
template <class T, class A, class Index>
__device__ __forceinline__ void gru_gates_tangent_body(
    const T* r_in, const T* u_in, const T* d_ru, const T* h_seen, const T* dh_seen,
    const int* seq_len, int use_seq_len, long long step, Index n, Index hidden,
    T* dr_out, T* du_out, T* d_rh)
{
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z = gc_store<T>::from((A)0);
            dr_out[k] = z; du_out[k] = z; d_rh[k] = z;
            continue;
        }
        const A r = gc_load(r_in[k]);
        const A u = gc_load(u_in[k]);
        const Index at = row * 2 * hidden + col;
        const A dr = r * (one - r) * gc_load(d_ru[at]);
        const A du = u * (one - u) * gc_load(d_ru[at + hidden]);
        dr_out[k] = gc_store<T>::from(dr);
        du_out[k] = gc_store<T>::from(du);
        d_rh[k] = gc_store<T>::from(dr * gc_load(h_seen[k]) + r * gc_load(dh_seen[k]));
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_gates_tangent(
    const T* r, const T* u, const T* d_ru, const T* h_seen, const T* dh_seen,
    const int* seq_len, int use_seq_len, long long step, long long batch, long long hidden,
    T* dr, T* du, T* d_rh)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_gates_tangent_body<T, A, unsigned int>(
            r, u, d_ru, h_seen, dh_seen, seq_len, use_seq_len, step, (unsigned int)n,
            (unsigned int)hidden, dr, du, d_rh);
    } else {
        gru_gates_tangent_body<T, A, unsigned long long>(
            r, u, d_ru, h_seen, dh_seen, seq_len, use_seq_len, step, (unsigned long long)n,
            (unsigned long long)hidden, dr, du, d_rh);
    }
}

// Part 2 of 2, the candidate and the state (dgx_c: the tangent of the candidate's input
// part, its bias's tangent included; dgh_c: of its recurrent part, reset before
// d_rh@W_ch + rh@dW_ch, reset after dn = dh_seen@W_ch + h_seen@dW_ch + db_ch):
//   dc_pre = dgx_c + dgh_c                            reset before
//   dc_pre = dgx_c + dr*n + r*dgh_c,  n = gh_c + b_ch  reset after (gh_c, b_c the forward's)
//   dc = (1 - c^2)*dc_pre;   dh = du*(h_prev - c) + u*dh_prev + (1-u)*dc
// Zoneout mixes the tangents as the states: dh = z*dh_prev + (1-z)*dh. A row past its
// length writes zeros and leaves dh_state alone; a running row also writes dh_state
// (use_seq_len), which may be the dh_prev buffer.
template <class T, class A, class Index>
__device__ __forceinline__ void gru_candidate_tangent_body(
    const T* r_in, const T* u_in, const T* c_in, const T* h_prev, const T* dr_in,
    const T* du_in, const T* dgx_c, const T* dgh_c, const T* gh_c, Index ld_gh_c,
    const T* b_c, const int* seq_len, const T* dh_prev, const T* zoneout_h, int reset_after,
    int use_seq_len, int use_zoneout_h, long long step, Index n, Index hidden, T* dc_out,
    T* dh_out, T* dh_state)
{
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z = gc_store<T>::from((A)0);
            dc_out[k] = z; dh_out[k] = z;
            continue;
        }
        A dc_pre = gc_load(dgx_c[k]);
        if (reset_after) {
            const A recurrent = gc_load(gh_c[row * ld_gh_c + col]) + gc_load(b_c[col + hidden]);
            dc_pre = dc_pre + gc_load(dr_in[k]) * recurrent + gc_load(r_in[k]) * gc_load(dgh_c[k]);
        } else {
            dc_pre = dc_pre + gc_load(dgh_c[k]);
        }
        const A c = gc_load(c_in[k]);
        const A u = gc_load(u_in[k]);
        const A dhp = gc_load(dh_prev[k]);
        const A dc = (one - c * c) * dc_pre;
        A dh = gc_load(du_in[k]) * (gc_load(h_prev[k]) - c) + u * dhp + (one - u) * dc;
        if (use_zoneout_h) dh = gc_zoned(gc_load(zoneout_h[k]), dhp, dh);
        dc_out[k] = gc_store<T>::from(dc);
        dh_out[k] = gc_store<T>::from(dh);
        if (use_seq_len) dh_state[k] = gc_store<T>::from(dh);
    }
}

// gc-optional (zoneout): zoneout_h use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_candidate_tangent(
    const T* r, const T* u, const T* c, const T* h_prev, const T* dr, const T* du,
    const T* dgx_c, const T* dgh_c, const T* gh_c, long long ld_gh_c, const T* b_c,
    const int* seq_len, const T* dh_prev, const T* zoneout_h, int reset_after,
    int use_seq_len, int use_zoneout_h, long long step, long long batch, long long hidden,
    T* dc, T* dh, T* dh_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_candidate_tangent_body<T, A, unsigned int>(
            r, u, c, h_prev, dr, du, dgx_c, dgh_c, gh_c, (unsigned int)ld_gh_c, b_c, seq_len,
            dh_prev, zoneout_h, reset_after, use_seq_len, use_zoneout_h, step,
            (unsigned int)n, (unsigned int)hidden, dc, dh, dh_state);
    } else {
        gru_candidate_tangent_body<T, A, unsigned long long>(
            r, u, c, h_prev, dr, du, dgx_c, dgh_c, gh_c, (unsigned long long)ld_gh_c, b_c,
            seq_len, dh_prev, zoneout_h, reset_after, use_seq_len, use_zoneout_h, step,
            (unsigned long long)n, (unsigned long long)hidden, dc, dh, dh_state);
    }
}

// Second order (docs/spec.md section 12): the tangents (suffix _t) of the backward's
// outputs along those of the step's saved r, u, c, of h_prev, of n_pre (reset after, its
// bias's tangent db_ch included), of the upstream gradients and of the carry, one launch
// beside each backward kernel (gpu.py, _grad_jvp; the primal values are recomputed
// from the same inputs as the backward's).
//
// Part 1, beside gru_backward_candidate (dh: the upstream after zoneout's split, as there;
// s = r(1-r), p = u(1-u), their tangents s_t = r_t(1-2r), p_t = u_t(1-2u)):
//   dh_t = (1-z)*g_t, dh_old_t = z*g_t        (g_t: gru_upstream on the tangents)
//   dc_bar_t = dh_t*(1-u)*(1-c^2) - dh*u_t*(1-c^2) - 2*dh*(1-u)*c*c_t
//   du_bar_t = dh_t*(h_prev-c)*p + dh*(h_prev_t-c_t)*p + dh*(h_prev-c)*p_t
//   dh_direct_t = dh_t*u + dh*u_t + dh_old_t
//   reset after, n = n_pre + b_ch:  d_n_t = dc_bar_t*r + dc_bar*r_t
//       dr_bar_t = (dc_bar_t*n + dc_bar*n_pre_t)*s + dc_bar*n*s_t
//   reset before: rh_t = r_t*h_prev + r*h_prev_t   (dr_bar_t is gru_backward_reset_tangent's)
// A row past its length writes zeros and passes the final state's tangent: dh_direct_t =
// d_h_final_t (or 0). dh_direct_t may be the dh_next_b_t buffer itself; dh_next_b must be
// the carry the backward kernel read (it writes its own dh_direct over it).
template <class T, class A, class Index>
__device__ __forceinline__ void gru_backward_candidate_tangent_body(
    const T* r_in, const T* u_in, const T* c_in, const T* h_prev, const T* r_t_in,
    const T* u_t_in, const T* c_t_in, const T* h_prev_t, const T* n_pre, const T* n_pre_t,
    const T* b_c, const T* d_h, const T* d_h_t, const T* dh_next_a, const T* dh_next_b,
    const T* dh_next_a_t, const T* dh_next_b_t, const T* d_h_final, const T* d_h_final_t,
    const int* seq_len, const T* zoneout_h, int reset_after, int has_d_h, int has_d_h_final,
    int use_seq_len, int use_zoneout_h, long long step, long long n_steps, Index n,
    Index hidden, T* d_gates_t, T* d_n_t, T* dh_direct_t, T* rh_t)
{
    const A zero = (A)0;
    const A one = (A)1;
    const A two = (A)2;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        const Index g = row * 3 * hidden + col;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        if (step >= length) {
            const T z = gc_store<T>::from(zero);
            d_gates_t[g] = z; d_gates_t[g + hidden] = z; d_gates_t[g + 2 * hidden] = z;
            if (reset_after) d_n_t[k] = z; else rh_t[k] = z;
            dh_direct_t[k] = has_d_h_final ? d_h_final_t[k] : z;
            continue;
        }
        const bool last = step + 1 >= length;
        A dh = gru_upstream<A>(d_h, dh_next_a, dh_next_b, d_h_final, has_d_h, has_d_h_final,
                               last, k);
        A dh_t = gru_upstream<A>(d_h_t, dh_next_a_t, dh_next_b_t, d_h_final_t, has_d_h,
                                 has_d_h_final, last, k);
        A dh_old_t = zero;
        if (use_zoneout_h) {
            const A z = gc_load(zoneout_h[k]);
            dh_old_t = z * dh_t;
            dh = (one - z) * dh;
            dh_t = (one - z) * dh_t;
        }
        const A r = gc_load(r_in[k]);
        const A u = gc_load(u_in[k]);
        const A c = gc_load(c_in[k]);
        const A hp = gc_load(h_prev[k]);
        const A r_t = gc_load(r_t_in[k]);
        const A u_t = gc_load(u_t_in[k]);
        const A c_t = gc_load(c_t_in[k]);
        const A hp_t = gc_load(h_prev_t[k]);
        const A slope_c = one - c * c;
        const A p = u * (one - u);
        const A p_t = u_t * (one - two * u);
        const A dc_bar = dh * (one - u) * slope_c;
        const A dc_bar_t = dh_t * (one - u) * slope_c - dh * u_t * slope_c
                           - two * dh * (one - u) * c * c_t;
        const A du_bar_t = dh_t * (hp - c) * p + dh * (hp_t - c_t) * p + dh * (hp - c) * p_t;
        if (reset_after) {
            const A recurrent = gc_load(n_pre[k]) + gc_load(b_c[col + hidden]);
            const A s = r * (one - r);
            const A s_t = r_t * (one - two * r);
            d_gates_t[g] = gc_store<T>::from(
                (dc_bar_t * recurrent + dc_bar * gc_load(n_pre_t[k])) * s
                + dc_bar * recurrent * s_t);
            d_n_t[k] = gc_store<T>::from(dc_bar_t * r + dc_bar * r_t);
        } else {
            rh_t[k] = gc_store<T>::from(r_t * hp + r * hp_t);
        }
        d_gates_t[g + hidden] = gc_store<T>::from(du_bar_t);
        d_gates_t[g + 2 * hidden] = gc_store<T>::from(dc_bar_t);
        dh_direct_t[k] = gc_store<T>::from(dh_t * u + dh * u_t + dh_old_t);
    }
}

// gc-optional (zoneout): zoneout_h use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_backward_candidate_tangent(
    const T* r, const T* u, const T* c, const T* h_prev, const T* r_t, const T* u_t,
    const T* c_t, const T* h_prev_t, const T* n_pre, const T* n_pre_t, const T* b_c,
    const T* d_h, const T* d_h_t, const T* dh_next_a, const T* dh_next_b,
    const T* dh_next_a_t, const T* dh_next_b_t, const T* d_h_final, const T* d_h_final_t,
    const int* seq_len, const T* zoneout_h, int reset_after, int has_d_h, int has_d_h_final,
    int use_seq_len, int use_zoneout_h, long long step, long long n_steps, long long batch,
    long long hidden, T* d_gates_t, T* d_n_t, T* dh_direct_t, T* rh_t)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_backward_candidate_tangent_body<T, A, unsigned int>(
            r, u, c, h_prev, r_t, u_t, c_t, h_prev_t, n_pre, n_pre_t, b_c, d_h, d_h_t,
            dh_next_a, dh_next_b, dh_next_a_t, dh_next_b_t, d_h_final, d_h_final_t, seq_len,
            zoneout_h, reset_after, has_d_h, has_d_h_final, use_seq_len, use_zoneout_h, step,
            n_steps, (unsigned int)n, (unsigned int)hidden, d_gates_t, d_n_t, dh_direct_t,
            rh_t);
    } else {
        gru_backward_candidate_tangent_body<T, A, unsigned long long>(
            r, u, c, h_prev, r_t, u_t, c_t, h_prev_t, n_pre, n_pre_t, b_c, d_h, d_h_t,
            dh_next_a, dh_next_b, dh_next_a_t, dh_next_b_t, d_h_final, d_h_final_t, seq_len,
            zoneout_h, reset_after, has_d_h, has_d_h_final, use_seq_len, use_zoneout_h, step,
            n_steps, (unsigned long long)n, (unsigned long long)hidden, d_gates_t, d_n_t,
            dh_direct_t, rh_t);
    }
}

// Part 2 (reset before only), beside gru_backward_reset, from d_hr and its tangent d_hr_t
// (= (dc_bar_t@W_ch^T + dc_bar@dW_ch^T), masked as d_hr is):
//   dr_bar_t = d_hr_t*h_prev*s + d_hr*h_prev_t*s + d_hr*h_prev*s_t  -> block r of d_gates_t
//   dh_direct_t += d_hr_t*r + d_hr*r_t
template <class T, class A, class Index>
__device__ __forceinline__ void gru_backward_reset_tangent_body(
    const T* d_hr, const T* d_hr_t, const T* r_in, const T* r_t_in, const T* h_prev,
    const T* h_prev_t, Index n, Index hidden, T* d_gates_t, T* dh_direct_t)
{
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        const A dhr = gc_load(d_hr[k]);
        const A dhr_t = gc_load(d_hr_t[k]);
        const A r = gc_load(r_in[k]);
        const A r_t = gc_load(r_t_in[k]);
        const A hp = gc_load(h_prev[k]);
        const A s = r * (one - r);
        const A s_t = r_t * (one - (A)2 * r);
        d_gates_t[row * 3 * hidden + col] = gc_store<T>::from(
            (dhr_t * hp + dhr * gc_load(h_prev_t[k])) * s + dhr * hp * s_t);
        dh_direct_t[k] = gc_store<T>::from(gc_load(dh_direct_t[k]) + dhr_t * r + dhr * r_t);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_backward_reset_tangent(
    const T* d_hr, const T* d_hr_t, const T* r, const T* r_t, const T* h_prev,
    const T* h_prev_t, long long batch, long long hidden, T* d_gates_t, T* dh_direct_t)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_backward_reset_tangent_body<T, A, unsigned int>(
            d_hr, d_hr_t, r, r_t, h_prev, h_prev_t, (unsigned int)n, (unsigned int)hidden,
            d_gates_t, dh_direct_t);
    } else {
        gru_backward_reset_tangent_body<T, A, unsigned long long>(
            d_hr, d_hr_t, r, r_t, h_prev, h_prev_t, (unsigned long long)n,
            (unsigned long long)hidden, d_gates_t, dh_direct_t);
    }
}

// The tangent of gru_backward_gates' additions (second order), added to the tangents of
// the gate gradients beside it (after the step's tangent kernels), along the tangents _t of
// the saved r, u, c, of n_pre (reset after, its bias's tangent included) and of the gates'
// upstream gradients (a missing one of a given pair: zeros). With s = r(1-r), p = u(1-u),
// s_t = r_t(1-2r), p_t = u_t(1-2u):
//   e_c_t = d_c_t*(1-c^2) - 2*d_c*c*c_t:   dc_bar_t += e_c_t;   du_bar_t += d_u_t*p + d_u*p_t
//   dr_bar_t += d_r_t*s + d_r*s_t;   reset after also
//       dr_bar_t += (e_c_t*n + e_c*n_pre_t)*s + e_c*n*s_t,   d_n_t += e_c_t*r + e_c*r_t
template <class T, class A, class Index>
__device__ __forceinline__ void gru_backward_gates_tangent_body(
    const T* r_in, const T* u_in, const T* c_in, const T* r_t_in, const T* u_t_in,
    const T* c_t_in, const T* n_pre, const T* n_pre_t, const T* b_c, const T* d_r,
    const T* d_u, const T* d_c, const T* d_r_t, const T* d_u_t, const T* d_c_t,
    const int* seq_len, int reset_after, int has_d_r, int has_d_u, int has_d_c,
    int use_seq_len, long long step, Index n, Index hidden, T* d_gates_t, T* d_n_t)
{
    const A zero = (A)0;
    const A one = (A)1;
    const A two = (A)2;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) continue;
        const Index g = row * 3 * hidden + col;
        const A r = gc_load(r_in[k]);
        const A r_t = gc_load(r_t_in[k]);
        const A c = gc_load(c_in[k]);
        A e_c = zero, e_c_t = zero, e_r = zero, e_r_t = zero;
        if (has_d_c) {
            const A dc = gc_load(d_c[k]);
            e_c = dc * (one - c * c);
            e_c_t = gc_load(d_c_t[k]) * (one - c * c) - two * dc * c * gc_load(c_t_in[k]);
            d_gates_t[g + 2 * hidden] = gc_store<T>::from(
                gc_load(d_gates_t[g + 2 * hidden]) + e_c_t);
        }
        if (has_d_u) {
            const A u = gc_load(u_in[k]);
            const A u_t = gc_load(u_t_in[k]);
            d_gates_t[g + hidden] = gc_store<T>::from(
                gc_load(d_gates_t[g + hidden]) + gc_load(d_u_t[k]) * u * (one - u)
                + gc_load(d_u[k]) * u_t * (one - two * u));
        }
        if (has_d_r) {
            e_r = gc_load(d_r[k]);
            e_r_t = gc_load(d_r_t[k]);
        }
        if (reset_after) {
            const A recurrent = gc_load(n_pre[k]) + gc_load(b_c[col + hidden]);
            e_r = e_r + e_c * recurrent;
            e_r_t = e_r_t + e_c_t * recurrent + e_c * gc_load(n_pre_t[k]);
            d_n_t[k] = gc_store<T>::from(gc_load(d_n_t[k]) + e_c_t * r + e_c * r_t);
        }
        if (has_d_r || (reset_after && has_d_c)) {
            d_gates_t[g] = gc_store<T>::from(gc_load(d_gates_t[g]) + e_r_t * r * (one - r)
                                             + e_r * r_t * (one - two * r));
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void gru_backward_gates_tangent(
    const T* r, const T* u, const T* c, const T* r_t, const T* u_t, const T* c_t,
    const T* n_pre, const T* n_pre_t, const T* b_c, const T* d_r, const T* d_u, const T* d_c,
    const T* d_r_t, const T* d_u_t, const T* d_c_t, const int* seq_len, int reset_after,
    int has_d_r, int has_d_u, int has_d_c, int use_seq_len, long long step, long long batch,
    long long hidden, T* d_gates_t, T* d_n_t)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        gru_backward_gates_tangent_body<T, A, unsigned int>(
            r, u, c, r_t, u_t, c_t, n_pre, n_pre_t, b_c, d_r, d_u, d_c, d_r_t, d_u_t, d_c_t,
            seq_len, reset_after, has_d_r, has_d_u, has_d_c, use_seq_len, step,
            (unsigned int)n, (unsigned int)hidden, d_gates_t, d_n_t);
    } else {
        gru_backward_gates_tangent_body<T, A, unsigned long long>(
            r, u, c, r_t, u_t, c_t, n_pre, n_pre_t, b_c, d_r, d_u, d_c, d_r_t, d_u_t, d_c_t,
            seq_len, reset_after, has_d_r, has_d_u, has_d_c, use_seq_len, step,
            (unsigned long long)n, (unsigned long long)hidden, d_gates_t, d_n_t);
    }
}
