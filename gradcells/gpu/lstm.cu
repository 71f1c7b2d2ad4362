// LSTM block cell, one time step per launch: the fused elementwise forward and backward.
// Gate order i, ci, f, o (TensorFlow's "icfo"); all [B, H] arrays C-contiguous; one thread
// per element k = b*H + j of a [B, H] array, in a grid-stride loop.
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). The parameter lists are mirrored, in order, by gradcells/gpu/_kernels.py,
// which generates each kernel's extern "C" entry point per dtype (see GC_KERNEL).

#include "common.cuh"

// In the comments, @ is a matmul and * an elementwise (or scalar) product.
//
// Forward:
//   pre = gx + gh + b                       gx = x@W_x, gh = h_prev@W_h: [B, 4H];  b: [4H]
//   i  = sigmoid(pre_i + cs_prev*wci)       ci = tanh(pre_c)
//   f  = sigmoid(pre_f + forget_bias + cs_prev*wcf)
//   cs = clip(i*ci + f*cs_prev)             co = tanh(cs)
//   o  = sigmoid(pre_o + cs*wco)            h  = o*co
// i, ci and f are rounded to T before cs is formed (a no-op for float and double), so the
// backward kernel, which reloads them, recomputes this very i*ci + f*cs_prev: its clip
// mask is exact in every dtype.
// With lengths (use_seq_len), a row with step >= seq_len[b] writes zeros to every output
// and leaves its state alone; a running row also writes its new cs and h to cs_state and
// h_state, which may be the cs_prev buffer itself (each element is read, then written, by
// one thread).
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_forward_body(
    const T* gx, const T* gh, const T* b, const T* cs_prev,
    const T* wci, const T* wcf, const T* wco, const int* seq_len,
    A forget_bias, A cell_clip, int use_peephole, int use_clip, int use_seq_len,
    long long step, Index n, Index hidden,
    T* i_out, T* cs_out, T* f_out, T* o_out, T* ci_out, T* co_out, T* h_out,
    T* cs_state, T* h_state)
{
    const T zero = gc_store<T>::from((A)0);
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            i_out[k] = zero; cs_out[k] = zero; f_out[k] = zero; o_out[k] = zero;
            ci_out[k] = zero; co_out[k] = zero; h_out[k] = zero;
            continue;
        }
        const Index g = row * 4 * hidden + col;
        const A c_prev = gc_load(cs_prev[k]);
        A pre_i = gc_load(gx[g]) + gc_load(gh[g]) + gc_load(b[col]);
        A pre_c = gc_load(gx[g + hidden]) + gc_load(gh[g + hidden]) + gc_load(b[col + hidden]);
        A pre_f = gc_load(gx[g + 2 * hidden]) + gc_load(gh[g + 2 * hidden])
                  + gc_load(b[col + 2 * hidden]) + forget_bias;
        A pre_o = gc_load(gx[g + 3 * hidden]) + gc_load(gh[g + 3 * hidden])
                  + gc_load(b[col + 3 * hidden]);
        if (use_peephole) {
            pre_i = pre_i + c_prev * gc_load(wci[col]);
            pre_f = pre_f + c_prev * gc_load(wcf[col]);
        }
        const A i = gc_rounded<T>(gc_sigmoid(pre_i));
        const A ci = gc_rounded<T>(gc_tanh(pre_c));
        const A f = gc_rounded<T>(gc_sigmoid(pre_f));
        A cs = gc_fma(i, ci, f * c_prev);
        if (use_clip) cs = gc_clip(cs, cell_clip);
        cs = gc_rounded<T>(cs);
        const A co = gc_rounded<T>(gc_tanh(cs));
        if (use_peephole) pre_o = pre_o + cs * gc_load(wco[col]);
        const A o = gc_rounded<T>(gc_sigmoid(pre_o));
        const A h = o * co;
        i_out[k] = gc_store<T>::from(i);
        cs_out[k] = gc_store<T>::from(cs);
        f_out[k] = gc_store<T>::from(f);
        o_out[k] = gc_store<T>::from(o);
        ci_out[k] = gc_store<T>::from(ci);
        co_out[k] = gc_store<T>::from(co);
        h_out[k] = gc_store<T>::from(h);
        if (use_seq_len) {
            cs_state[k] = gc_store<T>::from(cs);
            h_state[k] = gc_store<T>::from(h);
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_forward(
    const T* gx, const T* gh, const T* b, const T* cs_prev,
    const T* wci, const T* wcf, const T* wco, const int* seq_len,
    A forget_bias, A cell_clip, int use_peephole, int use_clip, int use_seq_len,
    long long step, long long batch, long long hidden,
    T* i, T* cs, T* f, T* o, T* ci, T* co, T* h,
    T* cs_state, T* h_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        lstm_forward_body<T, A, unsigned int>(
            gx, gh, b, cs_prev, wci, wcf, wco, seq_len, forget_bias, cell_clip,
            use_peephole, use_clip, use_seq_len, step, (unsigned int)n, (unsigned int)hidden,
            i, cs, f, o, ci, co, h, cs_state, h_state);
    } else {
        lstm_forward_body<T, A, unsigned long long>(
            gx, gh, b, cs_prev, wci, wcf, wco, seq_len, forget_bias, cell_clip,
            use_peephole, use_clip, use_seq_len, step, (unsigned long long)n,
            (unsigned long long)hidden, i, cs, f, o, ci, co, h, cs_state, h_state);
    }
}

// Backward, from the saved outputs of the step. The upstream gradients of the step's h and
// cs are the step's own (d_h, d_cs; has_d_h, has_d_cs) plus, on a row's last step
// (step + 1 == length, length = seq_len[b] or n_steps), the final-state gradients
// (d_h_final, d_cs_final; has_*_final), and otherwise the carry from step + 1
// (dh_next = dG_{t+1}@W_h^T, dcs_next = its dcs_prev; never read on a last step).
//   do  = dh*co*o(1-o)
//   dcs = dh*o*(1-co^2) + dcs_up + do*wco
//   dcs = 0 where |i*ci + f*cs_prev| > cell_clip           (mask_clip: the exact gradient)
//   di  = dcs*ci*i(1-i);  dci = dcs*i*(1-ci^2);  df = dcs*cs_prev*f(1-f)
//   d_gates = [di, dci, df, do] ([B, 4H]);   dcs_prev = dcs*f + di*wci + df*wcf
//   peephole_terms = [di*cs_prev, df*cs_prev, do*cs] ([B, 3H]; column sums: dwci, dwcf, dwco)
// A row past its length has zero gate gradients and passes its final-state gradient
// through: dcs_prev = d_cs_final (or 0). dcs_prev may be the dcs_next buffer itself.
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_backward_body(
    const T* cs_prev, const T* i_in, const T* cs_in, const T* f_in, const T* o_in,
    const T* ci_in, const T* co_in, const T* wci, const T* wcf, const T* wco,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len,
    A cell_clip, int use_peephole, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    long long step, long long n_steps, Index n, Index hidden,
    T* d_gates, T* dcs_prev, T* peephole_terms)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        const Index g = row * 4 * hidden + col;
        const Index p = row * 3 * hidden + col;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        if (step >= length) {
            const T z = gc_store<T>::from(zero);
            d_gates[g] = z; d_gates[g + hidden] = z;
            d_gates[g + 2 * hidden] = z; d_gates[g + 3 * hidden] = z;
            if (use_peephole) {
                peephole_terms[p] = z; peephole_terms[p + hidden] = z;
                peephole_terms[p + 2 * hidden] = z;
            }
            dcs_prev[k] = has_d_cs_final ? d_cs_final[k] : z;
            continue;
        }
        A dh = has_d_h ? gc_load(d_h[k]) : zero;
        A dcs_up = has_d_cs ? gc_load(d_cs[k]) : zero;
        if (step + 1 >= length) {
            if (has_d_h_final) dh = dh + gc_load(d_h_final[k]);
            if (has_d_cs_final) dcs_up = dcs_up + gc_load(d_cs_final[k]);
        } else {
            dh = dh + gc_load(dh_next[k]);
            dcs_up = dcs_up + gc_load(dcs_next[k]);
        }
        const A c_prev = gc_load(cs_prev[k]);
        const A i = gc_load(i_in[k]);
        const A cs = gc_load(cs_in[k]);
        const A f = gc_load(f_in[k]);
        const A o = gc_load(o_in[k]);
        const A ci = gc_load(ci_in[k]);
        const A co = gc_load(co_in[k]);

        const A d_o = dh * co * o * (one - o);
        A dcs = dh * o * (one - co * co) + dcs_up;
        if (use_peephole) dcs = dcs + d_o * gc_load(wco[col]);
        if (mask_clip && !(gc_abs(gc_fma(i, ci, f * c_prev)) <= cell_clip)) dcs = zero;
        const A di = dcs * ci * i * (one - i);
        const A dci = dcs * i * (one - ci * ci);
        const A df = dcs * c_prev * f * (one - f);
        d_gates[g] = gc_store<T>::from(di);
        d_gates[g + hidden] = gc_store<T>::from(dci);
        d_gates[g + 2 * hidden] = gc_store<T>::from(df);
        d_gates[g + 3 * hidden] = gc_store<T>::from(d_o);
        A d_prev = dcs * f;
        if (use_peephole) {
            d_prev = d_prev + di * gc_load(wci[col]) + df * gc_load(wcf[col]);
            peephole_terms[p] = gc_store<T>::from(di * c_prev);
            peephole_terms[p + hidden] = gc_store<T>::from(df * c_prev);
            peephole_terms[p + 2 * hidden] = gc_store<T>::from(d_o * cs);
        }
        dcs_prev[k] = gc_store<T>::from(d_prev);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_backward(
    const T* cs_prev, const T* i, const T* cs, const T* f, const T* o, const T* ci,
    const T* co, const T* wci, const T* wcf, const T* wco,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len,
    A cell_clip, int use_peephole, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    long long step, long long n_steps, long long batch, long long hidden,
    T* d_gates, T* dcs_prev, T* peephole_terms)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        lstm_backward_body<T, A, unsigned int>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, d_h, d_cs, dh_next, dcs_next,
            d_h_final, d_cs_final, seq_len, cell_clip, use_peephole, mask_clip, has_d_h,
            has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len, step, n_steps,
            (unsigned int)n, (unsigned int)hidden, d_gates, dcs_prev, peephole_terms);
    } else {
        lstm_backward_body<T, A, unsigned long long>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, d_h, d_cs, dh_next, dcs_next,
            d_h_final, d_cs_final, seq_len, cell_clip, use_peephole, mask_clip, has_d_h,
            has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len, step, n_steps,
            (unsigned long long)n, (unsigned long long)hidden, d_gates, dcs_prev,
            peephole_terms);
    }
}
