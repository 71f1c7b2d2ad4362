// LSTM block cell, one time step per launch: the fused elementwise forward and backward.
// Gate order i, ci, f, o (TensorFlow's "icfo"); all [B, H] arrays C-contiguous; one thread
// per element k = b*H + j of a [B, H] array, in a grid-stride loop. The layer-normalised
// LSTM's kernels (at the end of the file) give one thread a whole row instead.
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). The parameter lists are mirrored, in order, by gradcells/gpu/_kernels.py,
// which generates each kernel's extern "C" entry point per dtype (see GC_KERNEL).

#include "common.cuh"

// The clipped cell value c~ = clip(i*ci + f*cs_prev) of one element, rounded to T: the
// forward forms it from the rounded gates it stores, and the backward recomputes it from
// them with the same fma, bit for bit (so its mean and r are the forward's too).
template <class T, class A>
__device__ __forceinline__ A gc_lstm_c_tilde(A i, A ci, A f, A c_prev, int use_clip, A cell_clip)
{
    A c = gc_fma(i, ci, f * c_prev);
    if (use_clip) c = gc_clip(c, cell_clip);
    return gc_rounded<T>(c);
}

// The upstream gradients of one element's gate fields (docs/spec.md, section 16.1): the
// step's d_gate_up is [5, B, H], the gates i, f, o, ci, co one after another (n = B*H), read
// only when has_d_gate_up (zeros otherwise: the kernels' arithmetic is then theirs without).
template <class A>
struct gc_lstm_gate_up {
    A i, f, o, ci, co;
};

template <class T, class A, class Index>
__device__ __forceinline__ gc_lstm_gate_up<A> gc_lstm_gate_upstream(
    const T* d_gate_up, int has_d_gate_up, Index k, Index n)
{
    gc_lstm_gate_up<A> u;
    if (has_d_gate_up) {
        u.i = gc_load(d_gate_up[k]);
        u.f = gc_load(d_gate_up[n + k]);
        u.o = gc_load(d_gate_up[2 * n + k]);
        u.ci = gc_load(d_gate_up[3 * n + k]);
        u.co = gc_load(d_gate_up[4 * n + k]);
    } else {
        u.i = u.f = u.o = u.ci = u.co = (A)0;
    }
    return u;
}

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
// Zoneout (use_zoneout_cs, use_zoneout_h; zoneout_cs, zoneout_h: the step's [B, H] masks)
// mixes the new states with the old ones, cs = z_cs*cs_prev + (1-z_cs)*cs and
// h = z_h*h_prev + (1-z_h)*h, as they are stored and carried; co and o read the step's own
// (unzoned) cs. h_prev is read only for zoneout (and may be the h_state buffer).
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_forward_body(
    const T* gx, const T* gh, const T* b, const T* cs_prev,
    const T* wci, const T* wcf, const T* wco, const int* seq_len, const T* h_prev,
    const T* zoneout_cs, const T* zoneout_h,
    A forget_bias, A cell_clip, int use_peephole, int use_clip, int use_seq_len,
    int use_zoneout_cs, int use_zoneout_h, long long step, Index n, Index hidden,
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
        A h = o * co;
        if (use_zoneout_cs) cs = gc_zoned(gc_load(zoneout_cs[k]), c_prev, cs);
        if (use_zoneout_h) h = gc_zoned(gc_load(zoneout_h[k]), gc_load(h_prev[k]), h);
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

// gc-optional (zoneout): h_prev zoneout_cs zoneout_h use_zoneout_cs use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_forward(
    const T* gx, const T* gh, const T* b, const T* cs_prev,
    const T* wci, const T* wcf, const T* wco, const int* seq_len, const T* h_prev,
    const T* zoneout_cs, const T* zoneout_h,
    A forget_bias, A cell_clip, int use_peephole, int use_clip, int use_seq_len,
    int use_zoneout_cs, int use_zoneout_h, long long step, long long batch, long long hidden,
    T* i, T* cs, T* f, T* o, T* ci, T* co, T* h,
    T* cs_state, T* h_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        lstm_forward_body<T, A, unsigned int>(
            gx, gh, b, cs_prev, wci, wcf, wco, seq_len, h_prev, zoneout_cs, zoneout_h,
            forget_bias, cell_clip, use_peephole, use_clip, use_seq_len, use_zoneout_cs,
            use_zoneout_h, step, (unsigned int)n, (unsigned int)hidden,
            i, cs, f, o, ci, co, h, cs_state, h_state);
    } else {
        lstm_forward_body<T, A, unsigned long long>(
            gx, gh, b, cs_prev, wci, wcf, wco, seq_len, h_prev, zoneout_cs, zoneout_h,
            forget_bias, cell_clip, use_peephole, use_clip, use_seq_len, use_zoneout_cs,
            use_zoneout_h, step, (unsigned long long)n,
            (unsigned long long)hidden, i, cs, f, o, ci, co, h, cs_state, h_state);
    }
}

// Backward, from the saved outputs of the step. The upstream gradients of the step's h and
// cs are the step's own (d_h, d_cs; has_d_h, has_d_cs) plus, on a row's last step
// (step + 1 == length, length = seq_len[b] or n_steps), the final-state gradients
// (d_h_final, d_cs_final; has_*_final), and otherwise the carry from step + 1
// (dh_next = dG_{t+1}@W_h^T, dcs_next = its dcs_prev; never read on a last step). The
// step's gates' own upstream gradients u_i, u_f, u_o, u_ci, u_co (d_gate_up, has_d_gate_up;
// gc_lstm_gate_upstream) enter where their pre-activations' gradients are formed:
//   do  = (dh*co + u_o)*o(1-o)
//   dcs = (dh*o + u_co)*(1-co^2) + dcs_up + do*wco
//   dcs = 0 where |i*ci + f*cs_prev| > cell_clip           (mask_clip: the exact gradient)
//   di  = (dcs*ci + u_i)*i(1-i);  dci = (dcs*i + u_ci)*(1-ci^2);  df = (dcs*cs_prev + u_f)*f(1-f)
//   d_gates = [di, dci, df, do] ([B, 4H]);   dcs_prev = dcs*f + di*wci + df*wcf
//   peephole_terms = [di*cs_prev, df*cs_prev, do*cs] ([B, 3H]; column sums: dwci, dwcf, dwco)
// A row past its length has zero gate gradients and passes its final-state gradient
// through: dcs_prev = d_cs_final (or 0). dcs_prev may be the dcs_next buffer itself.
// Zoneout (use_zoneout_h, use_zoneout_cs) splits the upstream gradient g of a zoned state:
// (1-z)*g is the new state's (dh, dcs_up above), z*g the old one's: dh_zoned = z_h*g_h
// (added to the carry around the kernel; 0 in a row past its length) and dcs_prev +=
// z_cs*g_cs. With zoneout_cs the saved cs is the zoned state, so the o-peephole's term reads
// the step's own c~ = clip(i*ci + f*cs_prev), recomputed (use_clip: clipped) as the forward
// formed it.
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_backward_body(
    const T* cs_prev, const T* i_in, const T* cs_in, const T* f_in, const T* o_in,
    const T* ci_in, const T* co_in, const T* wci, const T* wcf, const T* wco,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len, const T* d_gate_up,
    const T* zoneout_cs, const T* zoneout_h,
    A cell_clip, int use_peephole, int use_clip, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    int has_d_gate_up, int use_zoneout_cs, int use_zoneout_h, long long step,
    long long n_steps, Index n, Index hidden, T* d_gates, T* dcs_prev, T* peephole_terms,
    T* dh_zoned)
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
            if (use_zoneout_h) dh_zoned[k] = z;
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
        if (use_zoneout_h) {
            const A z = gc_load(zoneout_h[k]);
            dh_zoned[k] = gc_store<T>::from(z * dh);
            dh = (one - z) * dh;
        }
        A dcs_old = zero;
        if (use_zoneout_cs) {
            const A z = gc_load(zoneout_cs[k]);
            dcs_old = z * dcs_up;
            dcs_up = (one - z) * dcs_up;
        }
        const A c_prev = gc_load(cs_prev[k]);
        const A i = gc_load(i_in[k]);
        const A f = gc_load(f_in[k]);
        const A o = gc_load(o_in[k]);
        const A ci = gc_load(ci_in[k]);
        const A co = gc_load(co_in[k]);
        const A cs = use_zoneout_cs ? gc_lstm_c_tilde<T, A>(i, ci, f, c_prev, use_clip, cell_clip)
                                    : gc_load(cs_in[k]);
        const gc_lstm_gate_up<A> u = gc_lstm_gate_upstream<T, A, Index>(
            d_gate_up, has_d_gate_up, k, n);

        const A d_o = (dh * co + u.o) * o * (one - o);
        A dcs = (dh * o + u.co) * (one - co * co) + dcs_up;
        if (use_peephole) dcs = dcs + d_o * gc_load(wco[col]);
        if (mask_clip && !(gc_abs(gc_fma(i, ci, f * c_prev)) <= cell_clip)) dcs = zero;
        const A di = (dcs * ci + u.i) * i * (one - i);
        const A dci = (dcs * i + u.ci) * (one - ci * ci);
        const A df = (dcs * c_prev + u.f) * f * (one - f);
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
        dcs_prev[k] = gc_store<T>::from(d_prev + dcs_old);
    }
}

// gc-optional (zoneout): zoneout_cs zoneout_h use_clip use_zoneout_cs use_zoneout_h dh_zoned
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_backward(
    const T* cs_prev, const T* i, const T* cs, const T* f, const T* o, const T* ci,
    const T* co, const T* wci, const T* wcf, const T* wco,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len, const T* d_gate_up,
    const T* zoneout_cs, const T* zoneout_h,
    A cell_clip, int use_peephole, int use_clip, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    int has_d_gate_up, int use_zoneout_cs, int use_zoneout_h, long long step,
    long long n_steps, long long batch, long long hidden,
    T* d_gates, T* dcs_prev, T* peephole_terms, T* dh_zoned)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        lstm_backward_body<T, A, unsigned int>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, d_h, d_cs, dh_next, dcs_next,
            d_h_final, d_cs_final, seq_len, d_gate_up, zoneout_cs, zoneout_h, cell_clip,
            use_peephole, use_clip, mask_clip, has_d_h, has_d_cs, has_d_h_final,
            has_d_cs_final, use_seq_len, has_d_gate_up, use_zoneout_cs, use_zoneout_h, step,
            n_steps, (unsigned int)n, (unsigned int)hidden, d_gates, dcs_prev,
            peephole_terms, dh_zoned);
    } else {
        lstm_backward_body<T, A, unsigned long long>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, d_h, d_cs, dh_next, dcs_next,
            d_h_final, d_cs_final, seq_len, d_gate_up, zoneout_cs, zoneout_h, cell_clip,
            use_peephole, use_clip, mask_clip, has_d_h, has_d_cs, has_d_h_final,
            has_d_cs_final, use_seq_len, has_d_gate_up, use_zoneout_cs, use_zoneout_h, step,
            n_steps, (unsigned long long)n, (unsigned long long)hidden, d_gates, dcs_prev,
            peephole_terms, dh_zoned);
    }
}

// ---------------------------------------------------------------------------------------
// The layer-normalised LSTM (docs/spec.md, section 9.2). A layer norm reduces over a whole row (the
// 4H gate columns, or the H cell columns), and the kernels must not let threads talk (no
// shared memory, no shuffles: see common.cuh), so each kernel below gives ONE THREAD A WHOLE
// ROW and loops over its columns: two passes for the mean and the (biased, centred)
// variance, accumulated in the arithmetic type A, then the pass that writes. Such a launch
// has only B (or T*B) threads instead of B*H; the price is parallelism on small batches
// (a real GPU would want a warp or a block per row), in exchange for results that do not
// depend on launch shape or thread order and run unchanged in the host emulation.
//
//   LN(z) = gamma*(z - mean)*r + beta,   r = 1/sqrt(var + epsilon)

// The mean and r of the row z[0 .. cols) (the mean over max(cols, 1) columns).
template <class T, class A, class Index>
__device__ __forceinline__ void gc_row_stats(const T* z, Index cols, A epsilon, A* mean, A* r)
{
    const A count = (A)(cols > 0 ? cols : 1);
    A sum = (A)0;
    for (Index j = 0; j < cols; ++j) sum = sum + gc_load(z[j]);
    const A mu = sum / count;
    A squares = (A)0;
    for (Index j = 0; j < cols; ++j) {
        const A c = gc_load(z[j]) - mu;
        squares = gc_fma(c, c, squares);
    }
    *mean = mu;
    *r = (A)1 / gc_sqrt(squares / count + epsilon);
}

// y = LN(z; gamma, beta) over each row of a C-contiguous [rows, cols] array: the gate norms
// of x@W_x (every step at once) and of h_prev@W_h (one step). One thread per row.
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void layer_norm_rows(
    const T* z, const T* gamma, const T* beta, A epsilon, long long rows, long long cols,
    T* y)
{
    for (long long row = gc_first_x<long long>(); row < rows; row += gc_stride_x<long long>()) {
        const T* zr = z + row * cols;
        A mean, r;
        gc_row_stats<T, A, long long>(zr, cols, epsilon, &mean, &r);
        for (long long j = 0; j < cols; ++j) {
            const A z_hat = (gc_load(zr[j]) - mean) * r;
            y[row * cols + j] = gc_store<T>::from(
                gc_fma(gc_load(gamma[j]), z_hat, gc_load(beta[j])));
        }
    }
}

// The layer norm's backward over each row, from dy = dL/dLN(z) and the raw z (its mean and
// r recomputed as the forward computed them), with g = dy*gamma:
//   dz = r*(g - mean(g) - z_hat*mean(g*z_hat))        dgamma_terms = dy*z_hat
// (column sums of dgamma_terms give dgamma; dbeta is the column sum of dy itself). For the
// gate norms dy is dG: of every step after the backward loop (x part) or of one step inside
// it (h part). One thread per row.
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void layer_norm_grad_rows(
    const T* dy, const T* z, const T* gamma, A epsilon, long long rows, long long cols,
    T* dz, T* dgamma_terms)
{
    const A count = (A)(cols > 0 ? cols : 1);
    for (long long row = gc_first_x<long long>(); row < rows; row += gc_stride_x<long long>()) {
        const T* zr = z + row * cols;
        const T* dyr = dy + row * cols;
        A mean, r;
        gc_row_stats<T, A, long long>(zr, cols, epsilon, &mean, &r);
        A sum_g = (A)0, sum_gz = (A)0;
        for (long long j = 0; j < cols; ++j) {
            const A g = gc_load(dyr[j]) * gc_load(gamma[j]);
            sum_g = sum_g + g;
            sum_gz = gc_fma(g, (gc_load(zr[j]) - mean) * r, sum_gz);
        }
        const A mean_g = sum_g / count, mean_gz = sum_gz / count;
        for (long long j = 0; j < cols; ++j) {
            const A d = gc_load(dyr[j]);
            const A z_hat = (gc_load(zr[j]) - mean) * r;
            const A g = d * gc_load(gamma[j]);
            dz[row * cols + j] = gc_store<T>::from(r * (g - mean_g - z_hat * mean_gz));
            dgamma_terms[row * cols + j] = gc_store<T>::from(d * z_hat);
        }
    }
}

// The step of the layer-normalised cell, ONE THREAD PER ROW b (see above); gx and gh are
// the gate norms' outputs LN(x@W_x) and LN(h_prev@W_h) ([B, 4H], layer_norm_rows):
//   pre = gx + gh + b;   i, ci, f as lstm_forward;   c~ = clip(i*ci + f*cs_prev)
//   n  = LN(c~; gamma_c, beta_c);   co = tanh(n)
//   cs = c~ (carry_normalized = 0, "raw") or n (1, "normalized");   o = sigmoid(pre_o + cs*wco)
//   h  = o*co
// Pass 1 writes i, ci, f and sums c~; pass 2 the variance; pass 3 the rest. Lengths,
// cs_state and h_state as lstm_forward (cs_state may be cs_prev: each element is read by the
// row's thread before that thread writes it). Zoneout as lstm_forward, on the carried cs.
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_forward_ln_body(
    const T* gx, const T* gh, const T* b, const T* cs_prev,
    const T* wci, const T* wcf, const T* wco, const T* gamma_c, const T* beta_c,
    const int* seq_len, const T* h_prev, const T* zoneout_cs, const T* zoneout_h,
    A forget_bias, A cell_clip, A epsilon, int use_peephole, int use_clip, int use_seq_len,
    int carry_normalized, int use_zoneout_cs, int use_zoneout_h, long long step,
    Index batch, Index hidden, T* i_out, T* cs_out, T* f_out, T* o_out, T* ci_out, T* co_out, T* h_out,
    T* cs_state, T* h_state)
{
    const T zero = gc_store<T>::from((A)0);
    const A count = (A)(hidden > 0 ? hidden : 1);
    for (Index row = gc_first_x<Index>(); row < batch; row += gc_stride_x<Index>()) {
        const Index base = row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            for (Index k = base; k < base + hidden; ++k) {
                i_out[k] = zero; cs_out[k] = zero; f_out[k] = zero; o_out[k] = zero;
                ci_out[k] = zero; co_out[k] = zero; h_out[k] = zero;
            }
            continue;
        }
        A sum = (A)0;
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const Index g = row * 4 * hidden + col;
            const A c_prev = gc_load(cs_prev[k]);
            A pre_i = gc_load(gx[g]) + gc_load(gh[g]) + gc_load(b[col]);
            A pre_c = gc_load(gx[g + hidden]) + gc_load(gh[g + hidden])
                      + gc_load(b[col + hidden]);
            A pre_f = gc_load(gx[g + 2 * hidden]) + gc_load(gh[g + 2 * hidden])
                      + gc_load(b[col + 2 * hidden]) + forget_bias;
            if (use_peephole) {
                pre_i = pre_i + c_prev * gc_load(wci[col]);
                pre_f = pre_f + c_prev * gc_load(wcf[col]);
            }
            const A i = gc_rounded<T>(gc_sigmoid(pre_i));
            const A ci = gc_rounded<T>(gc_tanh(pre_c));
            const A f = gc_rounded<T>(gc_sigmoid(pre_f));
            i_out[k] = gc_store<T>::from(i);
            ci_out[k] = gc_store<T>::from(ci);
            f_out[k] = gc_store<T>::from(f);
            sum = sum + gc_lstm_c_tilde<T, A>(i, ci, f, c_prev, use_clip, cell_clip);
        }
        // The stored gates are reloaded: c~ below is pass 1's, bit for bit.
        const A mean = sum / count;
        A squares = (A)0;
        for (Index k = base; k < base + hidden; ++k) {
            const A c = gc_lstm_c_tilde<T, A>(gc_load(i_out[k]), gc_load(ci_out[k]),
                                              gc_load(f_out[k]), gc_load(cs_prev[k]),
                                              use_clip, cell_clip) - mean;
            squares = gc_fma(c, c, squares);
        }
        const A r = (A)1 / gc_sqrt(squares / count + epsilon);
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const Index g = row * 4 * hidden + col;
            const A c_tilde = gc_lstm_c_tilde<T, A>(gc_load(i_out[k]), gc_load(ci_out[k]),
                                                    gc_load(f_out[k]), gc_load(cs_prev[k]),
                                                    use_clip, cell_clip);
            const A n = gc_rounded<T>(
                gc_fma(gc_load(gamma_c[col]), (c_tilde - mean) * r, gc_load(beta_c[col])));
            const A co = gc_rounded<T>(gc_tanh(n));
            A cs = carry_normalized ? n : c_tilde;
            A pre_o = gc_load(gx[g + 3 * hidden]) + gc_load(gh[g + 3 * hidden])
                      + gc_load(b[col + 3 * hidden]);
            if (use_peephole) pre_o = pre_o + cs * gc_load(wco[col]);
            const A o = gc_rounded<T>(gc_sigmoid(pre_o));
            A h = o * co;
            if (use_zoneout_cs) cs = gc_zoned(gc_load(zoneout_cs[k]), gc_load(cs_prev[k]), cs);
            if (use_zoneout_h) h = gc_zoned(gc_load(zoneout_h[k]), gc_load(h_prev[k]), h);
            cs_out[k] = gc_store<T>::from(cs);
            o_out[k] = gc_store<T>::from(o);
            co_out[k] = gc_store<T>::from(co);
            h_out[k] = gc_store<T>::from(h);
            if (use_seq_len) {
                cs_state[k] = gc_store<T>::from(cs);
                h_state[k] = gc_store<T>::from(h);
            }
        }
    }
}

// gc-optional (zoneout): h_prev zoneout_cs zoneout_h use_zoneout_cs use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_forward_ln(
    const T* gx, const T* gh, const T* b, const T* cs_prev,
    const T* wci, const T* wcf, const T* wco, const T* gamma_c, const T* beta_c,
    const int* seq_len, const T* h_prev, const T* zoneout_cs, const T* zoneout_h,
    A forget_bias, A cell_clip, A epsilon, int use_peephole, int use_clip, int use_seq_len,
    int carry_normalized, int use_zoneout_cs, int use_zoneout_h,
    long long step, long long batch, long long hidden,
    T* i, T* cs, T* f, T* o, T* ci, T* co, T* h,
    T* cs_state, T* h_state)
{
    if (batch * hidden <= GC_UINT32_SAFE_COUNT) {
        lstm_forward_ln_body<T, A, unsigned int>(
            gx, gh, b, cs_prev, wci, wcf, wco, gamma_c, beta_c, seq_len, h_prev, zoneout_cs,
            zoneout_h, forget_bias, cell_clip, epsilon, use_peephole, use_clip, use_seq_len,
            carry_normalized, use_zoneout_cs, use_zoneout_h, step,
            (unsigned int)batch, (unsigned int)hidden, i, cs, f, o, ci, co, h, cs_state,
            h_state);
    } else {
        lstm_forward_ln_body<T, A, unsigned long long>(
            gx, gh, b, cs_prev, wci, wcf, wco, gamma_c, beta_c, seq_len, h_prev, zoneout_cs,
            zoneout_h, forget_bias, cell_clip, epsilon, use_peephole, use_clip, use_seq_len,
            carry_normalized, use_zoneout_cs, use_zoneout_h, step,
            (unsigned long long)batch, (unsigned long long)hidden, i, cs, f, o, ci, co, h,
            cs_state, h_state);
    }
}

// What the backward of the layer-normalised step needs of one element before the cell
// norm: do, the gradient dn of n = LN(c~) and the carried state's gradient dcs_c.
// With zoneout, the upstream gradients are split first (as in lstm_backward): dh_old and
// dcs_old are the old states' parts.
template <class A>
struct gc_lstm_ln_up {
    A d_o, dn, dcs_c, dh_old, dcs_old;
};

template <class T, class A, class Index>
__device__ __forceinline__ gc_lstm_ln_up<A> gc_lstm_ln_upstream(
    Index k, Index col, const T* o_in, const T* co_in, const T* wco,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next, const T* d_h_final,
    const T* d_cs_final, const T* zoneout_cs, const T* zoneout_h, int use_peephole,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_zoneout_cs,
    int use_zoneout_h, int last, int carry_normalized, const T* d_gate_up,
    int has_d_gate_up, Index n)
{
    A dh = has_d_h ? gc_load(d_h[k]) : (A)0;
    A dcs_up = has_d_cs ? gc_load(d_cs[k]) : (A)0;
    if (last) {
        if (has_d_h_final) dh = dh + gc_load(d_h_final[k]);
        if (has_d_cs_final) dcs_up = dcs_up + gc_load(d_cs_final[k]);
    } else {
        dh = dh + gc_load(dh_next[k]);
        dcs_up = dcs_up + gc_load(dcs_next[k]);
    }
    gc_lstm_ln_up<A> up;
    up.dh_old = (A)0;
    up.dcs_old = (A)0;
    if (use_zoneout_h) {
        const A z = gc_load(zoneout_h[k]);
        up.dh_old = z * dh;
        dh = ((A)1 - z) * dh;
    }
    if (use_zoneout_cs) {
        const A z = gc_load(zoneout_cs[k]);
        up.dcs_old = z * dcs_up;
        dcs_up = ((A)1 - z) * dcs_up;
    }
    const A o = gc_load(o_in[k]);
    const A co = gc_load(co_in[k]);
    const gc_lstm_gate_up<A> g = gc_lstm_gate_upstream<T, A, Index>(d_gate_up, has_d_gate_up,
                                                                    k, n);
    up.d_o = (dh * co + g.o) * o * ((A)1 - o);
    up.dcs_c = use_peephole ? dcs_up + up.d_o * gc_load(wco[col]) : dcs_up;
    const A dco = (dh * o + g.co) * ((A)1 - co * co);
    up.dn = carry_normalized ? dco + up.dcs_c : dco;
    return up;
}

// Backward of the layer-normalised step, ONE THREAD PER ROW b (see above), from the saved
// outputs; upstream gradients (the gates' u_* too), lengths and the carries as lstm_backward:
//   do = (dh*co + u_o)*o(1-o);   dcs_c = dcs_up + do*wco          (the carried cs's gradient)
//   dn = (dh*o + u_co)*(1-co^2)  (+ dcs_c when carry_normalized)
//   dc~ = r*(g - mean(g) - c_hat*mean(g*c_hat)), g = dn*gamma_c  (+ dcs_c when raw)
//   dc~ = 0 where |i*ci + f*cs_prev| > cell_clip                 (mask_clip)
//   di, dci, df (with u_i, u_ci, u_f), d_gates, dcs_prev and peephole_terms from dc~ as
//   lstm_backward
//   norm_terms = [dn*c_hat, dn] ([B, 2H]; column sums: dgamma_c, dbeta_c)
// c~, its mean and r are recomputed from the saved gates (use_clip: c~ is clipped).
// Pass 1 and 2: mean and r; pass 3: the sums of g and g*c_hat; pass 4 writes. dcs_prev may
// be dcs_next (each element read by the row's thread before it writes it).
// Zoneout as lstm_backward; with zoneout_cs the o-peephole's term reads the step's own
// carried state, c~ or (carry_normalized) n = LN(c~), recomputed as the forward formed it.
// A row past its length in the layer-normalised backward (``lstm_backward_ln`` and its
// tangent ``lstm_backward_tangent_ln``, which pass their tangents' arrays): its gate
// gradients, peephole and norm terms and zoned h's gradient are zeros, and the cell state's
// gradient passes d_cs_final (zeros without it).
template <class T, class Index>
__device__ __forceinline__ void gc_lstm_ln_stopped_row(
    Index row, Index hidden, int use_peephole, int has_d_cs_final, int use_zoneout_h,
    const T* d_cs_final, T* d_gates, T* peephole_terms, T* norm_terms, T* dcs_prev,
    T* dh_zoned)
{
    const T z = gc_store<T>::from((typename gc_compute<T>::type)0);
    for (Index col = 0; col < hidden; ++col) {
        const Index k = row * hidden + col;
        const Index g = row * 4 * hidden + col;
        const Index p = row * 3 * hidden + col;
        d_gates[g] = z; d_gates[g + hidden] = z;
        d_gates[g + 2 * hidden] = z; d_gates[g + 3 * hidden] = z;
        if (use_peephole) {
            peephole_terms[p] = z; peephole_terms[p + hidden] = z;
            peephole_terms[p + 2 * hidden] = z;
        }
        norm_terms[row * 2 * hidden + col] = z;
        norm_terms[row * 2 * hidden + hidden + col] = z;
        dcs_prev[k] = has_d_cs_final ? d_cs_final[k] : z;
        if (use_zoneout_h) dh_zoned[k] = z;
    }
}

template <class T, class A, class Index>
__device__ __forceinline__ void lstm_backward_ln_body(
    const T* cs_prev, const T* i_in, const T* cs_in, const T* f_in, const T* o_in,
    const T* ci_in, const T* co_in, const T* wci, const T* wcf, const T* wco,
    const T* gamma_c, const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len, const T* beta_c,
    const T* d_gate_up, const T* zoneout_cs, const T* zoneout_h,
    A cell_clip, A epsilon, int use_peephole, int use_clip, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    int has_d_gate_up, int carry_normalized, int use_zoneout_cs, int use_zoneout_h,
    long long step, long long n_steps, Index batch, Index hidden,
    T* d_gates, T* dcs_prev, T* peephole_terms, T* norm_terms, T* dh_zoned)
{
    const A zero = (A)0;
    const Index n = batch * hidden;
    const A one = (A)1;
    const A count = (A)(hidden > 0 ? hidden : 1);
    for (Index row = gc_first_x<Index>(); row < batch; row += gc_stride_x<Index>()) {
        const Index base = row * hidden;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        if (step >= length) {
            gc_lstm_ln_stopped_row<T>(row, hidden, use_peephole, has_d_cs_final, use_zoneout_h,
                                      d_cs_final, d_gates, peephole_terms,
                                      norm_terms, dcs_prev, dh_zoned);
            continue;
        }
        const int last = step + 1 >= length;
        A sum = zero;
        for (Index k = base; k < base + hidden; ++k)
            sum = sum + gc_lstm_c_tilde<T, A>(gc_load(i_in[k]), gc_load(ci_in[k]),
                                              gc_load(f_in[k]), gc_load(cs_prev[k]),
                                              use_clip, cell_clip);
        const A mean = sum / count;
        A squares = zero;
        for (Index k = base; k < base + hidden; ++k) {
            const A c = gc_lstm_c_tilde<T, A>(gc_load(i_in[k]), gc_load(ci_in[k]),
                                              gc_load(f_in[k]), gc_load(cs_prev[k]),
                                              use_clip, cell_clip) - mean;
            squares = gc_fma(c, c, squares);
        }
        const A r = one / gc_sqrt(squares / count + epsilon);
        A sum_g = zero, sum_gc = zero;
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const gc_lstm_ln_up<A> up = gc_lstm_ln_upstream<T, A, Index>(
                k, col, o_in, co_in, wco, d_h, d_cs, dh_next, dcs_next, d_h_final,
                d_cs_final, zoneout_cs, zoneout_h, use_peephole, has_d_h, has_d_cs,
                has_d_h_final, has_d_cs_final, use_zoneout_cs, use_zoneout_h, last,
                carry_normalized, d_gate_up, has_d_gate_up, n);
            const A c_hat = (gc_lstm_c_tilde<T, A>(gc_load(i_in[k]), gc_load(ci_in[k]),
                                                   gc_load(f_in[k]), gc_load(cs_prev[k]),
                                                   use_clip, cell_clip) - mean) * r;
            const A g = up.dn * gc_load(gamma_c[col]);
            sum_g = sum_g + g;
            sum_gc = gc_fma(g, c_hat, sum_gc);
        }
        const A mean_g = sum_g / count, mean_gc = sum_gc / count;
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const Index g_at = row * 4 * hidden + col;
            const Index p = row * 3 * hidden + col;
            const gc_lstm_ln_up<A> up = gc_lstm_ln_upstream<T, A, Index>(
                k, col, o_in, co_in, wco, d_h, d_cs, dh_next, dcs_next, d_h_final,
                d_cs_final, zoneout_cs, zoneout_h, use_peephole, has_d_h, has_d_cs,
                has_d_h_final, has_d_cs_final, use_zoneout_cs, use_zoneout_h, last,
                carry_normalized, d_gate_up, has_d_gate_up, n);
            const A c_prev = gc_load(cs_prev[k]);
            const A i = gc_load(i_in[k]);
            const A f = gc_load(f_in[k]);
            const A ci = gc_load(ci_in[k]);
            const A c_hat = (gc_lstm_c_tilde<T, A>(i, ci, f, c_prev, use_clip, cell_clip)
                             - mean) * r;
            const A g = up.dn * gc_load(gamma_c[col]);
            A dcs = r * (g - mean_g - c_hat * mean_gc);
            if (!carry_normalized) dcs = dcs + up.dcs_c;
            if (mask_clip && !(gc_abs(gc_fma(i, ci, f * c_prev)) <= cell_clip)) dcs = zero;
            const gc_lstm_gate_up<A> u = gc_lstm_gate_upstream<T, A, Index>(
                d_gate_up, has_d_gate_up, k, n);
            const A di = (dcs * ci + u.i) * i * (one - i);
            const A dci = (dcs * i + u.ci) * (one - ci * ci);
            const A df = (dcs * c_prev + u.f) * f * (one - f);
            d_gates[g_at] = gc_store<T>::from(di);
            d_gates[g_at + hidden] = gc_store<T>::from(dci);
            d_gates[g_at + 2 * hidden] = gc_store<T>::from(df);
            d_gates[g_at + 3 * hidden] = gc_store<T>::from(up.d_o);
            A d_prev = dcs * f;
            if (use_peephole) {
                d_prev = d_prev + di * gc_load(wci[col]) + df * gc_load(wcf[col]);
                peephole_terms[p] = gc_store<T>::from(di * c_prev);
                peephole_terms[p + hidden] = gc_store<T>::from(df * c_prev);
                A cs = gc_load(cs_in[k]);
                if (use_zoneout_cs) {
                    cs = carry_normalized ? gc_rounded<T>(gc_fma(gc_load(gamma_c[col]), c_hat,
                                                                 gc_load(beta_c[col])))
                                          : gc_lstm_c_tilde<T, A>(i, ci, f, c_prev, use_clip,
                                                                  cell_clip);
                }
                peephole_terms[p + 2 * hidden] = gc_store<T>::from(up.d_o * cs);
            }
            norm_terms[row * 2 * hidden + col] = gc_store<T>::from(up.dn * c_hat);
            norm_terms[row * 2 * hidden + hidden + col] = gc_store<T>::from(up.dn);
            dcs_prev[k] = gc_store<T>::from(d_prev + up.dcs_old);
            if (use_zoneout_h) dh_zoned[k] = gc_store<T>::from(up.dh_old);
        }
    }
}

// gc-optional (zoneout): beta_c zoneout_cs zoneout_h use_zoneout_cs use_zoneout_h dh_zoned
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_backward_ln(
    const T* cs_prev, const T* i, const T* cs, const T* f, const T* o, const T* ci,
    const T* co, const T* wci, const T* wcf, const T* wco, const T* gamma_c,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len, const T* beta_c,
    const T* d_gate_up, const T* zoneout_cs, const T* zoneout_h,
    A cell_clip, A epsilon, int use_peephole, int use_clip, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    int has_d_gate_up, int carry_normalized, int use_zoneout_cs, int use_zoneout_h,
    long long step, long long n_steps, long long batch, long long hidden,
    T* d_gates, T* dcs_prev, T* peephole_terms, T* norm_terms, T* dh_zoned)
{
    if (batch * hidden <= GC_UINT32_SAFE_COUNT) {
        lstm_backward_ln_body<T, A, unsigned int>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, gamma_c, d_h, d_cs, dh_next,
            dcs_next, d_h_final, d_cs_final, seq_len, beta_c, d_gate_up, zoneout_cs,
            zoneout_h, cell_clip, epsilon, use_peephole, use_clip, mask_clip, has_d_h,
            has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len, has_d_gate_up,
            carry_normalized, use_zoneout_cs, use_zoneout_h, step, n_steps,
            (unsigned int)batch, (unsigned int)hidden, d_gates, dcs_prev, peephole_terms,
            norm_terms, dh_zoned);
    } else {
        lstm_backward_ln_body<T, A, unsigned long long>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, gamma_c, d_h, d_cs, dh_next,
            dcs_next, d_h_final, d_cs_final, seq_len, beta_c, d_gate_up, zoneout_cs,
            zoneout_h, cell_clip, epsilon, use_peephole, use_clip, mask_clip, has_d_h,
            has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len, has_d_gate_up,
            carry_normalized, use_zoneout_cs, use_zoneout_h, step, n_steps,
            (unsigned long long)batch, (unsigned long long)hidden, d_gates, dcs_prev,
            peephole_terms, norm_terms, dh_zoned);
    }
}

// The tangent of one element's clipped cell value c~ from its gates' pre-activation tangents
// (both tangent kernels below): with the peepholes' input,
//   dgi = d_gates_i + dcs_prev*wci + cs_prev*dwci     (dgf alike)
//   di = i*(1-i)*dgi;   dci = (1-ci^2)*d_gates_c;   df = f*(1-f)*dgf
//   dc = di*ci + i*dci + df*cs_prev + f*dcs_prev, zero where the clip is active
//        (|i*ci + f*cs_prev| > cell_clip, the forward's own fma: on the boundary it passes)
// Returns dc; writes di, dci, df.
template <class T, class A, class Index>
__device__ __forceinline__ A gc_lstm_cell_tangent(
    const T* d_gates, Index g, Index hidden, Index col, A i, A f, A ci, A c_prev, A dc_prev,
    const T* wci, const T* wcf, const T* dwci, const T* dwcf, int use_peephole,
    int use_d_peephole, int use_clip, A cell_clip, A* di, A* dci, A* df)
{
    const A one = (A)1;
    A dgi = gc_load(d_gates[g]);
    A dgf = gc_load(d_gates[g + 2 * hidden]);
    if (use_peephole) {
        dgi = dgi + dc_prev * gc_load(wci[col]);
        dgf = dgf + dc_prev * gc_load(wcf[col]);
        if (use_d_peephole) {
            dgi = dgi + c_prev * gc_load(dwci[col]);
            dgf = dgf + c_prev * gc_load(dwcf[col]);
        }
    }
    *di = i * (one - i) * dgi;
    *dci = (one - ci * ci) * gc_load(d_gates[g + hidden]);
    *df = f * (one - f) * dgf;
    const A dc = *di * ci + i * *dci + *df * c_prev + f * dc_prev;
    if (use_clip && !(gc_abs(gc_fma(i, ci, f * c_prev)) <= cell_clip)) return (A)0;
    return dc;
}

// The rest of one element's tangent, after dco (both tangent kernels below), from the
// carried cell state cs and its tangent dcs:
//   do = o*(1-o)*(d_gates_o + dcs*wco + cs*dwco);   dh = do*co + o*dco
// then zoneout's mix (dcs = z_cs*dcs_prev + (1-z_cs)*dcs, dh alike), and the stores of dcs,
// do, dco, dh (and of the state tangents dcs_state, dh_state with use_seq_len).
template <class T, class A, class Index>
__device__ __forceinline__ void gc_lstm_output_tangent(
    const T* d_gates, Index g, Index hidden, Index col, Index k, A o, A co, A dco, A cs,
    A dcs, A dc_prev, const T* wco, const T* dwco, const T* dh_prev, const T* zoneout_cs,
    const T* zoneout_h, int use_peephole, int use_d_peephole, int use_seq_len,
    int use_zoneout_cs, int use_zoneout_h, T* dcs_out, T* do_out, T* dco_out, T* dh_out,
    T* dcs_state, T* dh_state)
{
    const A one = (A)1;
    A dgo = gc_load(d_gates[g + 3 * hidden]);
    if (use_peephole) {
        dgo = dgo + dcs * gc_load(wco[col]);
        if (use_d_peephole) dgo = dgo + cs * gc_load(dwco[col]);
    }
    const A d_o = o * (one - o) * dgo;
    A dh = d_o * co + o * dco;
    if (use_zoneout_cs) dcs = gc_zoned(gc_load(zoneout_cs[k]), dc_prev, dcs);
    if (use_zoneout_h) dh = gc_zoned(gc_load(zoneout_h[k]), gc_load(dh_prev[k]), dh);
    dcs_out[k] = gc_store<T>::from(dcs);
    do_out[k] = gc_store<T>::from(d_o);
    dco_out[k] = gc_store<T>::from(dco);
    dh_out[k] = gc_store<T>::from(dh);
    if (use_seq_len) {
        dcs_state[k] = gc_store<T>::from(dcs);
        dh_state[k] = gc_store<T>::from(dh);
    }
}

// Forward mode (docs/spec.md section 12), one step per launch after lstm_forward: the
// step's tangents from its stored gates (i, f, o, ci, co), cs_prev and the tangents of the
// pre-activations (d_gates: [B, 4H] icfo, dx@W_x + x@dW_x + db + dh_prev@W_h + h_prev@dW_h)
// and of cs_prev (dcs_prev); dwci, dwcf, dwco: the peepholes' tangents (use_d_peephole):
//   di, dci, df, dc by gc_lstm_cell_tangent;   dco = (1-co^2)*dc
//   do, dh and zoneout's mix by gc_lstm_output_tangent, the carried cs being c~ (the step's
//   own unzoned cell value, recomputed from the stored gates by gc_lstm_c_tilde)
// A row past its length
// writes zeros and leaves the state tangents alone; a running row also writes them to
// dcs_state and dh_state (use_seq_len), which may be the dcs_prev and dh_prev buffers.
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_forward_tangent_body(
    const T* d_gates, const T* cs_prev, const T* dcs_prev, const T* i_in, const T* f_in,
    const T* o_in, const T* ci_in, const T* co_in, const T* wci, const T* wcf,
    const T* wco, const T* dwci, const T* dwcf, const T* dwco, const int* seq_len,
    const T* dh_prev, const T* zoneout_cs, const T* zoneout_h, A cell_clip,
    int use_peephole, int use_d_peephole, int use_clip, int use_seq_len,
    int use_zoneout_cs, int use_zoneout_h, long long step, Index n, Index hidden,
    T* di_out, T* dcs_out, T* df_out, T* do_out, T* dci_out, T* dco_out, T* dh_out,
    T* dcs_state, T* dh_state)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z = gc_store<T>::from(zero);
            di_out[k] = z; dcs_out[k] = z; df_out[k] = z; do_out[k] = z;
            dci_out[k] = z; dco_out[k] = z; dh_out[k] = z;
            continue;
        }
        const Index g = row * 4 * hidden + col;
        const A c_prev = gc_load(cs_prev[k]);
        const A dc_prev = gc_load(dcs_prev[k]);
        const A i = gc_load(i_in[k]);
        const A f = gc_load(f_in[k]);
        const A ci = gc_load(ci_in[k]);
        const A co = gc_load(co_in[k]);
        A di, dci, df;
        const A dc = gc_lstm_cell_tangent<T, A, Index>(
            d_gates, g, hidden, col, i, f, ci, c_prev, dc_prev, wci, wcf, dwci, dwcf,
            use_peephole, use_d_peephole, use_clip, cell_clip, &di, &dci, &df);
        const A dco = (one - co * co) * dc;
        const A cs = use_peephole && use_d_peephole
            ? gc_lstm_c_tilde<T, A>(i, ci, f, c_prev, use_clip, cell_clip) : zero;
        di_out[k] = gc_store<T>::from(di);
        df_out[k] = gc_store<T>::from(df);
        dci_out[k] = gc_store<T>::from(dci);
        gc_lstm_output_tangent<T, A, Index>(
            d_gates, g, hidden, col, k, gc_load(o_in[k]), co, dco, cs, dc, dc_prev, wco, dwco,
            dh_prev, zoneout_cs, zoneout_h, use_peephole, use_d_peephole, use_seq_len,
            use_zoneout_cs, use_zoneout_h, dcs_out, do_out, dco_out, dh_out, dcs_state,
            dh_state);
    }
}

// gc-optional (zoneout): dh_prev zoneout_cs zoneout_h use_zoneout_cs use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_forward_tangent(
    const T* d_gates, const T* cs_prev, const T* dcs_prev, const T* i, const T* f,
    const T* o, const T* ci, const T* co, const T* wci, const T* wcf, const T* wco,
    const T* dwci, const T* dwcf, const T* dwco, const int* seq_len, const T* dh_prev,
    const T* zoneout_cs, const T* zoneout_h, A cell_clip, int use_peephole,
    int use_d_peephole, int use_clip, int use_seq_len, int use_zoneout_cs,
    int use_zoneout_h, long long step, long long batch, long long hidden,
    T* di, T* dcs, T* df, T* d_o, T* dci, T* dco, T* dh, T* dcs_state, T* dh_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        lstm_forward_tangent_body<T, A, unsigned int>(
            d_gates, cs_prev, dcs_prev, i, f, o, ci, co, wci, wcf, wco, dwci, dwcf, dwco,
            seq_len, dh_prev, zoneout_cs, zoneout_h, cell_clip, use_peephole, use_d_peephole,
            use_clip, use_seq_len, use_zoneout_cs, use_zoneout_h, step, (unsigned int)n,
            (unsigned int)hidden, di, dcs, df, d_o, dci, dco, dh, dcs_state, dh_state);
    } else {
        lstm_forward_tangent_body<T, A, unsigned long long>(
            d_gates, cs_prev, dcs_prev, i, f, o, ci, co, wci, wcf, wco, dwci, dwcf, dwco,
            seq_len, dh_prev, zoneout_cs, zoneout_h, cell_clip, use_peephole, use_d_peephole,
            use_clip, use_seq_len, use_zoneout_cs, use_zoneout_h, step,
            (unsigned long long)n, (unsigned long long)hidden, di, dcs, df, d_o, dci, dco,
            dh, dcs_state, dh_state);
    }
}

// Forward mode of a gate norm, over each row of C-contiguous [rows, cols] arrays: the
// tangent dy of y = LN(z; gamma, beta) (layer_norm_rows) for the tangents dz, d_gamma
// (use_d_gamma) and d_beta (use_d_beta), z's mean and r recomputed as the forward's:
//   dz_hat = r*(dz - mean(dz) - z_hat*mean(z_hat*dz));   dy = d_gamma*z_hat + gamma*dz_hat + d_beta
// One thread per row.
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void layer_norm_tangent_rows(
    const T* z, const T* dz, const T* gamma, const T* d_gamma, const T* d_beta, A epsilon,
    int use_d_gamma, int use_d_beta, long long rows, long long cols, T* dy)
{
    const A count = (A)(cols > 0 ? cols : 1);
    for (long long row = gc_first_x<long long>(); row < rows; row += gc_stride_x<long long>()) {
        const T* zr = z + row * cols;
        const T* dzr = dz + row * cols;
        A mean, r;
        gc_row_stats<T, A, long long>(zr, cols, epsilon, &mean, &r);
        A sum_d = (A)0, sum_zd = (A)0;
        for (long long j = 0; j < cols; ++j) {
            const A d = gc_load(dzr[j]);
            sum_d = sum_d + d;
            sum_zd = gc_fma((gc_load(zr[j]) - mean) * r, d, sum_zd);
        }
        const A mean_d = sum_d / count;
        const A mean_zd = sum_zd / count;
        for (long long j = 0; j < cols; ++j) {
            const A z_hat = (gc_load(zr[j]) - mean) * r;
            A t = gc_load(gamma[j]) * (r * (gc_load(dzr[j]) - mean_d - z_hat * mean_zd));
            if (use_d_gamma) t = t + gc_load(d_gamma[j]) * z_hat;
            if (use_d_beta) t = t + gc_load(d_beta[j]);
            dy[row * cols + j] = gc_store<T>::from(t);
        }
    }
}

// Forward mode of the layer-normalised step, ONE THREAD PER ROW b, after lstm_forward_ln:
// as lstm_forward_tangent, with the cell norm n = LN(c~; gamma_c, beta_c) between dc~ and
// co (c~, its mean and r recomputed from the stored gates as the forward's):
//   dn = d_gamma_c*c_hat + gamma_c*r*(dc~ - mean(dc~) - c_hat*mean(c_hat*dc~)) + d_beta_c
//   dco = (1-co^2)*dn;   the carried cs is n (carry_normalized) or c~, its tangent dn or dc~;
//   do = o*(1-o)*(d_gates_o + dcs*wco + cs*dwco);   dh = do*co + o*dco
// Pass 1 writes di, dci, df and dc~ (into dcs, then overwritten) and sums c~; pass 2 the
// variance; pass 3 the sums of dc~ and c_hat*dc~; pass 4 the rest. Lengths and zoneout as
// lstm_forward_tangent (dcs_state may be dcs_prev: each element is read by the row's
// thread before that thread writes it).
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_forward_tangent_ln_body(
    const T* d_gates, const T* cs_prev, const T* dcs_prev, const T* i_in, const T* f_in,
    const T* o_in, const T* ci_in, const T* co_in, const T* wci, const T* wcf,
    const T* wco, const T* dwci, const T* dwcf, const T* dwco, const T* gamma_c,
    const T* beta_c, const T* d_gamma_c, const T* d_beta_c, const int* seq_len,
    const T* dh_prev, const T* zoneout_cs, const T* zoneout_h, A cell_clip, A epsilon,
    int use_peephole, int use_d_peephole, int use_clip, int use_d_gamma, int use_d_beta,
    int carry_normalized, int use_seq_len, int use_zoneout_cs, int use_zoneout_h,
    long long step, Index batch, Index hidden, T* di_out, T* dcs_out, T* df_out,
    T* do_out, T* dci_out, T* dco_out, T* dh_out, T* dcs_state, T* dh_state)
{
    const A zero = (A)0;
    const A one = (A)1;
    const A count = (A)(hidden > 0 ? hidden : 1);
    for (Index row = gc_first_x<Index>(); row < batch; row += gc_stride_x<Index>()) {
        const Index base = row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z = gc_store<T>::from(zero);
            for (Index k = base; k < base + hidden; ++k) {
                di_out[k] = z; dcs_out[k] = z; df_out[k] = z; do_out[k] = z;
                dci_out[k] = z; dco_out[k] = z; dh_out[k] = z;
            }
            continue;
        }
        A sum = zero;
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const Index g = row * 4 * hidden + col;
            const A c_prev = gc_load(cs_prev[k]);
            const A dc_prev = gc_load(dcs_prev[k]);
            const A i = gc_load(i_in[k]);
            const A f = gc_load(f_in[k]);
            const A ci = gc_load(ci_in[k]);
            A di, dci, df;
            const A dc = gc_lstm_cell_tangent<T, A, Index>(
                d_gates, g, hidden, col, i, f, ci, c_prev, dc_prev, wci, wcf, dwci, dwcf,
                use_peephole, use_d_peephole, use_clip, cell_clip, &di, &dci, &df);
            di_out[k] = gc_store<T>::from(di);
            dci_out[k] = gc_store<T>::from(dci);
            df_out[k] = gc_store<T>::from(df);
            dcs_out[k] = gc_store<T>::from(dc);
            sum = sum + gc_lstm_c_tilde<T, A>(i, ci, f, c_prev, use_clip, cell_clip);
        }
        const A mean = sum / count;
        A squares = zero;
        for (Index k = base; k < base + hidden; ++k) {
            const A c = gc_lstm_c_tilde<T, A>(gc_load(i_in[k]), gc_load(ci_in[k]),
                                              gc_load(f_in[k]), gc_load(cs_prev[k]),
                                              use_clip, cell_clip) - mean;
            squares = gc_fma(c, c, squares);
        }
        const A r = one / gc_sqrt(squares / count + epsilon);
        A sum_d = zero, sum_cd = zero;
        for (Index k = base; k < base + hidden; ++k) {
            const A c_hat = (gc_lstm_c_tilde<T, A>(gc_load(i_in[k]), gc_load(ci_in[k]),
                                                   gc_load(f_in[k]), gc_load(cs_prev[k]),
                                                   use_clip, cell_clip) - mean) * r;
            const A d = gc_load(dcs_out[k]);
            sum_d = sum_d + d;
            sum_cd = gc_fma(c_hat, d, sum_cd);
        }
        const A mean_d = sum_d / count;
        const A mean_cd = sum_cd / count;
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const Index g = row * 4 * hidden + col;
            const A c_prev = gc_load(cs_prev[k]);
            const A dc_prev = gc_load(dcs_prev[k]);
            const A c_tilde = gc_lstm_c_tilde<T, A>(gc_load(i_in[k]), gc_load(ci_in[k]),
                                                    gc_load(f_in[k]), c_prev, use_clip,
                                                    cell_clip);
            const A c_hat = (c_tilde - mean) * r;
            const A dc = gc_load(dcs_out[k]);
            const A gamma = gc_load(gamma_c[col]);
            A dn = gamma * (r * (dc - mean_d - c_hat * mean_cd));
            if (use_d_gamma) dn = dn + gc_load(d_gamma_c[col]) * c_hat;
            if (use_d_beta) dn = dn + gc_load(d_beta_c[col]);
            const A n = gc_rounded<T>(gc_fma(gamma, c_hat, gc_load(beta_c[col])));
            const A co = gc_load(co_in[k]);
            const A o = gc_load(o_in[k]);
            const A dco = (one - co * co) * dn;
            gc_lstm_output_tangent<T, A, Index>(
                d_gates, g, hidden, col, k, o, co, dco, carry_normalized ? n : c_tilde,
                carry_normalized ? dn : dc, dc_prev, wco, dwco, dh_prev, zoneout_cs,
                zoneout_h, use_peephole, use_d_peephole, use_seq_len, use_zoneout_cs,
                use_zoneout_h, dcs_out, do_out, dco_out, dh_out, dcs_state, dh_state);
        }
    }
}

// gc-optional (zoneout): dh_prev zoneout_cs zoneout_h use_zoneout_cs use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_forward_tangent_ln(
    const T* d_gates, const T* cs_prev, const T* dcs_prev, const T* i, const T* f,
    const T* o, const T* ci, const T* co, const T* wci, const T* wcf, const T* wco,
    const T* dwci, const T* dwcf, const T* dwco, const T* gamma_c, const T* beta_c,
    const T* d_gamma_c, const T* d_beta_c, const int* seq_len, const T* dh_prev,
    const T* zoneout_cs, const T* zoneout_h, A cell_clip, A epsilon, int use_peephole,
    int use_d_peephole, int use_clip, int use_d_gamma, int use_d_beta, int carry_normalized,
    int use_seq_len, int use_zoneout_cs, int use_zoneout_h, long long step, long long batch,
    long long hidden, T* di, T* dcs, T* df, T* d_o, T* dci, T* dco, T* dh, T* dcs_state,
    T* dh_state)
{
    if (batch * hidden <= GC_UINT32_SAFE_COUNT) {
        lstm_forward_tangent_ln_body<T, A, unsigned int>(
            d_gates, cs_prev, dcs_prev, i, f, o, ci, co, wci, wcf, wco, dwci, dwcf, dwco,
            gamma_c, beta_c, d_gamma_c, d_beta_c, seq_len, dh_prev, zoneout_cs, zoneout_h,
            cell_clip, epsilon, use_peephole, use_d_peephole, use_clip, use_d_gamma,
            use_d_beta, carry_normalized, use_seq_len, use_zoneout_cs, use_zoneout_h, step,
            (unsigned int)batch, (unsigned int)hidden, di, dcs, df, d_o, dci, dco, dh,
            dcs_state, dh_state);
    } else {
        lstm_forward_tangent_ln_body<T, A, unsigned long long>(
            d_gates, cs_prev, dcs_prev, i, f, o, ci, co, wci, wcf, wco, dwci, dwcf, dwco,
            gamma_c, beta_c, d_gamma_c, d_beta_c, seq_len, dh_prev, zoneout_cs, zoneout_h,
            cell_clip, epsilon, use_peephole, use_d_peephole, use_clip, use_d_gamma,
            use_d_beta, carry_normalized, use_seq_len, use_zoneout_cs, use_zoneout_h, step,
            (unsigned long long)batch, (unsigned long long)hidden, di, dcs, df, d_o, dci,
            dco, dh, dcs_state, dh_state);
    }
}

// The second order's upstream gradients of one element and their tangents (both tangent
// kernels below), as lstm_backward forms them: the step's own (has_d_h, has_d_cs: each
// gradient and its tangent alike) plus the final-state ones on a row's last step, else the
// carries; then zoneout's split, the old states' parts of the tangents in t_dh_old and
// t_dcs_old (the primal's are lstm_backward's own).
template <class A>
struct gc_lstm_up_pair {
    A dh, tdh, dcs_up, tdcs_up, tdh_old, tdcs_old;
};

template <class T, class A, class Index>
__device__ __forceinline__ gc_lstm_up_pair<A> gc_lstm_upstream_pair(
    Index k, const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const T* t_d_h, const T* t_d_cs,
    const T* t_dh_next, const T* t_dcs_next, const T* t_d_h_final, const T* t_d_cs_final,
    const T* zoneout_cs, const T* zoneout_h, int has_d_h, int has_d_cs, int has_d_h_final,
    int has_d_cs_final, int use_zoneout_cs, int use_zoneout_h, int last)
{
    const A zero = (A)0;
    const A one = (A)1;
    gc_lstm_up_pair<A> u;
    u.dh = has_d_h ? gc_load(d_h[k]) : zero;
    u.tdh = has_d_h ? gc_load(t_d_h[k]) : zero;
    u.dcs_up = has_d_cs ? gc_load(d_cs[k]) : zero;
    u.tdcs_up = has_d_cs ? gc_load(t_d_cs[k]) : zero;
    if (last) {
        if (has_d_h_final) {
            u.dh = u.dh + gc_load(d_h_final[k]);
            u.tdh = u.tdh + gc_load(t_d_h_final[k]);
        }
        if (has_d_cs_final) {
            u.dcs_up = u.dcs_up + gc_load(d_cs_final[k]);
            u.tdcs_up = u.tdcs_up + gc_load(t_d_cs_final[k]);
        }
    } else {
        u.dh = u.dh + gc_load(dh_next[k]);
        u.tdh = u.tdh + gc_load(t_dh_next[k]);
        u.dcs_up = u.dcs_up + gc_load(dcs_next[k]);
        u.tdcs_up = u.tdcs_up + gc_load(t_dcs_next[k]);
    }
    u.tdh_old = zero;
    u.tdcs_old = zero;
    if (use_zoneout_h) {
        const A z = gc_load(zoneout_h[k]);
        u.tdh_old = z * u.tdh;
        u.dh = (one - z) * u.dh;
        u.tdh = (one - z) * u.tdh;
    }
    if (use_zoneout_cs) {
        const A z = gc_load(zoneout_cs[k]);
        u.tdcs_old = z * u.tdcs_up;
        u.dcs_up = (one - z) * u.dcs_up;
        u.tdcs_up = (one - z) * u.tdcs_up;
    }
    return u;
}

// The tangents of the i, ci and f gate gradients (into t_d_gates) and of the i and f
// peephole terms (use_peephole) from the gradient dcs of c~ (after the clip's mask) and its
// tangent tdcs, and the gates' own upstreams u and their tangents tu; returns the tangent of
// dcs*f + di*wci + df*wcf (dcs_prev's, before zoneout). With pre_i = dcs*ci + u_i:
//   di' = pre_i'*i(1-i) + pre_i*i'*(1-2i);   dci', df' alike (tanh': -2*pre_c*ci*ci')
template <class T, class A, class Index>
__device__ __forceinline__ A gc_lstm_gate_grads_tangent(
    A dcs, A tdcs, A i, A f, A ci, A c_prev, A ti, A tf, A tci, A tc_prev,
    gc_lstm_gate_up<A> u, gc_lstm_gate_up<A> tu, Index g, Index p,
    Index hidden, Index col, const T* wci, const T* wcf, const T* t_wci, const T* t_wcf,
    int use_peephole, T* t_d_gates, T* t_peephole_terms)
{
    const A one = (A)1;
    const A two = (A)2;
    const A si = i * (one - i);
    const A sf = f * (one - f);
    const A sci = one - ci * ci;
    const A pre_i = dcs * ci + u.i;
    const A pre_c = dcs * i + u.ci;
    const A pre_f = dcs * c_prev + u.f;
    const A di = pre_i * si;
    const A df = pre_f * sf;
    const A tdi = (tdcs * ci + dcs * tci + tu.i) * si + pre_i * ti * (one - two * i);
    const A tdci = (tdcs * i + dcs * ti + tu.ci) * sci - two * pre_c * ci * tci;
    const A tdf = (tdcs * c_prev + dcs * tc_prev + tu.f) * sf + pre_f * tf * (one - two * f);
    t_d_gates[g] = gc_store<T>::from(tdi);
    t_d_gates[g + hidden] = gc_store<T>::from(tdci);
    t_d_gates[g + 2 * hidden] = gc_store<T>::from(tdf);
    A t_prev = tdcs * f + dcs * tf;
    if (use_peephole) {
        t_prev = t_prev + tdi * gc_load(wci[col]) + di * gc_load(t_wci[col])
                 + tdf * gc_load(wcf[col]) + df * gc_load(t_wcf[col]);
        t_peephole_terms[p] = gc_store<T>::from(tdi * c_prev + di * tc_prev);
        t_peephole_terms[p + hidden] = gc_store<T>::from(tdf * c_prev + df * tc_prev);
    }
    return t_prev;
}

// The tangent of the step's own c~ = clip(i*ci + f*cs_prev): i'*ci + i*ci' + f'*cs_prev +
// f*cs_prev', 0 where the clip is active (the forward's rule: on the boundary it passes).
template <class A>
__device__ __forceinline__ A gc_lstm_c_tilde_tangent(A i, A ci, A f, A c_prev, A ti, A tci,
                                                     A tf, A tc_prev, int use_clip,
                                                     A cell_clip)
{
    if (use_clip && !(gc_abs(gc_fma(i, ci, f * c_prev)) <= cell_clip)) return (A)0;
    return ti * ci + i * tci + tf * c_prev + f * tc_prev;
}

// Second order (docs/spec.md section 12), one step per launch BEFORE that step's
// lstm_backward (which overwrites the dcs carry in place): the tangent of lstm_backward's
// outputs along the tangents t_* of every input it reads (the saved gates' and cs_prev's
// tangents from the forward's JVP, the peepholes', the upstream gradients' and the carries'),
// the same branches as the primal (the clip mask, lengths, last steps), recomputing the
// primal values it needs. With g = dh and dcs_up the step's upstream gradients, and the
// gates' own u_* (d_gate_up) and their tangents (t_d_gate_up; has_d_gate_up both alike):
//   do'  = (dh'*co + dh*co' + u_o')*o(1-o) + (dh*co + u_o)*o'*(1-2o)
//   dcs' = (dh'*o + dh*o' + u_co')*(1-co^2) - 2*(dh*o + u_co)*co*co' + dcs_up'
//          + do'*wco + do*wco'      (0 where mask_clip and the clip is active)
//   di'  = (dcs'*ci + dcs*ci' + u_i')*i(1-i) + (dcs*ci + u_i)*i'*(1-2i);   dci', df' alike
//   t_dcs_prev = dcs'*f + dcs*f' + di'*wci + di*wci' + df'*wcf + df*wcf' (+ z_cs*dcs_up')
//   t_peephole_terms = [di'*c_prev + di*c_prev', df'*c_prev + df*c_prev', do'*cs + do*cs']
// Zoneout splits the tangents as lstm_backward splits the gradients (t_dh_zoned = z_h*dh');
// with zoneout_cs the o-peephole's cs is the step's own c~ and cs' its tangent
// i'*ci + i*ci' + f'*cs_prev + f*cs_prev' (0 where the clip is active: the forward's rule).
// A row past its length: zero tangents, t_dcs_prev = t_d_cs_final (or 0). The has_* flags
// cover each upstream gradient and its tangent alike (the caller passes zeros for a None
// one of a pair). t_dcs_prev may be the t_dcs_next buffer itself.
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_backward_tangent_body(
    const T* cs_prev, const T* i_in, const T* cs_in, const T* f_in, const T* o_in,
    const T* ci_in, const T* co_in, const T* wci, const T* wcf, const T* wco,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const T* t_cs_prev, const T* t_i_in,
    const T* t_cs_in, const T* t_f_in, const T* t_o_in, const T* t_ci_in, const T* t_co_in,
    const T* t_wci, const T* t_wcf, const T* t_wco, const T* t_d_h, const T* t_d_cs,
    const T* t_dh_next, const T* t_dcs_next, const T* t_d_h_final, const T* t_d_cs_final,
    const int* seq_len, const T* d_gate_up, const T* t_d_gate_up, const T* zoneout_cs,
    const T* zoneout_h, A cell_clip, int use_peephole, int use_clip, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    int has_d_gate_up, int use_zoneout_cs, int use_zoneout_h, long long step,
    long long n_steps, Index n, Index hidden, T* t_d_gates, T* t_dcs_prev,
    T* t_peephole_terms, T* t_dh_zoned)
{
    const A zero = (A)0;
    const A one = (A)1;
    const A two = (A)2;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        const Index g = row * 4 * hidden + col;
        const Index p = row * 3 * hidden + col;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        if (step >= length) {
            const T z = gc_store<T>::from(zero);
            t_d_gates[g] = z; t_d_gates[g + hidden] = z;
            t_d_gates[g + 2 * hidden] = z; t_d_gates[g + 3 * hidden] = z;
            if (use_peephole) {
                t_peephole_terms[p] = z; t_peephole_terms[p + hidden] = z;
                t_peephole_terms[p + 2 * hidden] = z;
            }
            t_dcs_prev[k] = has_d_cs_final ? t_d_cs_final[k] : z;
            if (use_zoneout_h) t_dh_zoned[k] = z;
            continue;
        }
        const gc_lstm_up_pair<A> u = gc_lstm_upstream_pair<T, A, Index>(
            k, d_h, d_cs, dh_next, dcs_next, d_h_final, d_cs_final, t_d_h, t_d_cs, t_dh_next,
            t_dcs_next, t_d_h_final, t_d_cs_final, zoneout_cs, zoneout_h, has_d_h, has_d_cs,
            has_d_h_final, has_d_cs_final, use_zoneout_cs, use_zoneout_h, step + 1 >= length);
        if (use_zoneout_h) t_dh_zoned[k] = gc_store<T>::from(u.tdh_old);
        const A c_prev = gc_load(cs_prev[k]);
        const A i = gc_load(i_in[k]);
        const A f = gc_load(f_in[k]);
        const A o = gc_load(o_in[k]);
        const A ci = gc_load(ci_in[k]);
        const A co = gc_load(co_in[k]);
        const A tc_prev = gc_load(t_cs_prev[k]);
        const A ti = gc_load(t_i_in[k]);
        const A tf = gc_load(t_f_in[k]);
        const A to = gc_load(t_o_in[k]);
        const A tci = gc_load(t_ci_in[k]);
        const A tco = gc_load(t_co_in[k]);

        const gc_lstm_gate_up<A> gu = gc_lstm_gate_upstream<T, A, Index>(
            d_gate_up, has_d_gate_up, k, n);
        const gc_lstm_gate_up<A> tgu = gc_lstm_gate_upstream<T, A, Index>(
            t_d_gate_up, has_d_gate_up, k, n);
        const A dh = u.dh, tdh = u.tdh;
        const A so = o * (one - o);
        const A pre_o = dh * co + gu.o;
        const A d_o = pre_o * so;
        const A td_o = (tdh * co + dh * tco + tgu.o) * so + pre_o * to * (one - two * o);
        const A sco = one - co * co;
        const A pre_co = dh * o + gu.co;
        A dcs = pre_co * sco + u.dcs_up;
        A tdcs = (tdh * o + dh * to + tgu.co) * sco - two * pre_co * co * tco + u.tdcs_up;
        if (use_peephole) {
            const A w = gc_load(wco[col]);
            dcs = dcs + d_o * w;
            tdcs = tdcs + td_o * w + d_o * gc_load(t_wco[col]);
        }
        if (mask_clip && !(gc_abs(gc_fma(i, ci, f * c_prev)) <= cell_clip)) {
            dcs = zero;
            tdcs = zero;
        }
        const A t_prev = gc_lstm_gate_grads_tangent<T, A, Index>(
            dcs, tdcs, i, f, ci, c_prev, ti, tf, tci, tc_prev, gu, tgu, g, p, hidden, col, wci,
            wcf, t_wci, t_wcf, use_peephole, t_d_gates, t_peephole_terms);
        t_d_gates[g + 3 * hidden] = gc_store<T>::from(td_o);
        if (use_peephole) {
            A cs = gc_load(cs_in[k]);
            A tcs = gc_load(t_cs_in[k]);
            if (use_zoneout_cs) {
                cs = gc_lstm_c_tilde<T, A>(i, ci, f, c_prev, use_clip, cell_clip);
                tcs = gc_lstm_c_tilde_tangent<A>(i, ci, f, c_prev, ti, tci, tf, tc_prev,
                                                 use_clip, cell_clip);
            }
            t_peephole_terms[p + 2 * hidden] = gc_store<T>::from(td_o * cs + d_o * tcs);
        }
        t_dcs_prev[k] = gc_store<T>::from(t_prev + u.tdcs_old);
    }
}

// gc-optional (zoneout): zoneout_cs zoneout_h use_zoneout_cs use_zoneout_h t_dh_zoned
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_backward_tangent(
    const T* cs_prev, const T* i, const T* cs, const T* f, const T* o, const T* ci,
    const T* co, const T* wci, const T* wcf, const T* wco,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const T* t_cs_prev, const T* t_i,
    const T* t_cs, const T* t_f, const T* t_o, const T* t_ci, const T* t_co,
    const T* t_wci, const T* t_wcf, const T* t_wco, const T* t_d_h, const T* t_d_cs,
    const T* t_dh_next, const T* t_dcs_next, const T* t_d_h_final, const T* t_d_cs_final,
    const int* seq_len, const T* d_gate_up, const T* t_d_gate_up, const T* zoneout_cs,
    const T* zoneout_h, A cell_clip, int use_peephole, int use_clip, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    int has_d_gate_up, int use_zoneout_cs, int use_zoneout_h, long long step,
    long long n_steps, long long batch, long long hidden,
    T* t_d_gates, T* t_dcs_prev, T* t_peephole_terms, T* t_dh_zoned)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        lstm_backward_tangent_body<T, A, unsigned int>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, d_h, d_cs, dh_next, dcs_next,
            d_h_final, d_cs_final, t_cs_prev, t_i, t_cs, t_f, t_o, t_ci, t_co, t_wci, t_wcf,
            t_wco, t_d_h, t_d_cs, t_dh_next, t_dcs_next, t_d_h_final, t_d_cs_final, seq_len,
            d_gate_up, t_d_gate_up, zoneout_cs, zoneout_h, cell_clip, use_peephole, use_clip,
            mask_clip, has_d_h, has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len,
            has_d_gate_up, use_zoneout_cs, use_zoneout_h, step, n_steps, (unsigned int)n,
            (unsigned int)hidden, t_d_gates, t_dcs_prev, t_peephole_terms, t_dh_zoned);
    } else {
        lstm_backward_tangent_body<T, A, unsigned long long>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, d_h, d_cs, dh_next, dcs_next,
            d_h_final, d_cs_final, t_cs_prev, t_i, t_cs, t_f, t_o, t_ci, t_co, t_wci, t_wcf,
            t_wco, t_d_h, t_d_cs, t_dh_next, t_dcs_next, t_d_h_final, t_d_cs_final, seq_len,
            d_gate_up, t_d_gate_up, zoneout_cs, zoneout_h, cell_clip, use_peephole, use_clip,
            mask_clip, has_d_h, has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len,
            has_d_gate_up, use_zoneout_cs, use_zoneout_h, step, n_steps,
            (unsigned long long)n, (unsigned long long)hidden, t_d_gates, t_dcs_prev,
            t_peephole_terms, t_dh_zoned);
    }
}

// Second order of a gate norm's backward (layer_norm_grad_rows), over each row of
// C-contiguous [rows, cols] arrays: the tangents of dz and dgamma_terms along t_dy, t_z and
// t_gamma (the caller passes zeros for a zero one), z's mean and r recomputed as the
// forward's. With m = mean(z_hat*t_z):
//   t_z_hat = r*(t_z - mean(t_z) - z_hat*m);   t_r = -r^2*m;   g = dy*gamma, t_g = t_dy*gamma + dy*t_gamma
//   t_dz = t_r*(g - mean(g) - z_hat*mean(g*z_hat))
//          + r*(t_g - mean(t_g) - t_z_hat*mean(g*z_hat) - z_hat*mean(t_g*z_hat + g*t_z_hat))
//   t_dgamma_terms = t_dy*z_hat + dy*t_z_hat
// One thread per row.
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void layer_norm_grad_tangent_rows(
    const T* dy, const T* t_dy, const T* z, const T* t_z, const T* gamma, const T* t_gamma,
    A epsilon, long long rows, long long cols, T* t_dz, T* t_dgamma_terms)
{
    const A count = (A)(cols > 0 ? cols : 1);
    for (long long row = gc_first_x<long long>(); row < rows; row += gc_stride_x<long long>()) {
        const long long base = row * cols;
        A mean, r;
        gc_row_stats<T, A, long long>(z + base, cols, epsilon, &mean, &r);
        A sum_t = (A)0, sum_zt = (A)0;
        for (long long j = 0; j < cols; ++j) {
            const A t = gc_load(t_z[base + j]);
            sum_t = sum_t + t;
            sum_zt = gc_fma((gc_load(z[base + j]) - mean) * r, t, sum_zt);
        }
        const A mean_t = sum_t / count, m = sum_zt / count;
        const A t_r = -r * r * m;
        A sum_g = (A)0, sum_gz = (A)0, sum_tg = (A)0, sum_tgz = (A)0;
        for (long long j = 0; j < cols; ++j) {
            const A z_hat = (gc_load(z[base + j]) - mean) * r;
            const A t_z_hat = r * (gc_load(t_z[base + j]) - mean_t - z_hat * m);
            const A d = gc_load(dy[base + j]);
            const A g = d * gc_load(gamma[j]);
            const A tg = gc_load(t_dy[base + j]) * gc_load(gamma[j]) + d * gc_load(t_gamma[j]);
            sum_g = sum_g + g;
            sum_gz = gc_fma(g, z_hat, sum_gz);
            sum_tg = sum_tg + tg;
            sum_tgz = sum_tgz + tg * z_hat + g * t_z_hat;
        }
        const A mean_g = sum_g / count, mean_gz = sum_gz / count;
        const A mean_tg = sum_tg / count, mean_tgz = sum_tgz / count;
        for (long long j = 0; j < cols; ++j) {
            const A z_hat = (gc_load(z[base + j]) - mean) * r;
            const A t_z_hat = r * (gc_load(t_z[base + j]) - mean_t - z_hat * m);
            const A d = gc_load(dy[base + j]);
            const A td = gc_load(t_dy[base + j]);
            const A g = d * gc_load(gamma[j]);
            const A tg = td * gc_load(gamma[j]) + d * gc_load(t_gamma[j]);
            t_dz[base + j] = gc_store<T>::from(
                t_r * (g - mean_g - z_hat * mean_gz)
                + r * (tg - mean_tg - t_z_hat * mean_gz - z_hat * mean_tgz));
            t_dgamma_terms[base + j] = gc_store<T>::from(td * z_hat + d * t_z_hat);
        }
    }
}

// What the layer-normalised step's tangent needs of one element's upstream (the tangent
// of gc_lstm_ln_upstream's, beside it): do, the cell norm's output gradient dn, the
// carried cs's gradient dcs_c, their tangents, and zoneout's old states' parts' tangents.
template <class A>
struct gc_lstm_ln_up_tangent {
    A d_o, td_o, dn, tdn, dcs_c, tdcs_c, tdh_old, tdcs_old;
};

template <class T, class A, class Index>
__device__ __forceinline__ gc_lstm_ln_up_tangent<A> gc_lstm_ln_upstream_tangent(
    Index k, Index col, const T* o_in, const T* co_in, const T* t_o_in, const T* t_co_in,
    const T* wco, const T* t_wco, const T* d_h, const T* d_cs, const T* dh_next,
    const T* dcs_next, const T* d_h_final, const T* d_cs_final, const T* t_d_h,
    const T* t_d_cs, const T* t_dh_next, const T* t_dcs_next, const T* t_d_h_final,
    const T* t_d_cs_final, const T* zoneout_cs, const T* zoneout_h, int use_peephole,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_zoneout_cs,
    int use_zoneout_h, int last, int carry_normalized, const T* d_gate_up,
    const T* t_d_gate_up, int has_d_gate_up, Index n)
{
    const A one = (A)1;
    const A two = (A)2;
    const gc_lstm_up_pair<A> u = gc_lstm_upstream_pair<T, A, Index>(
        k, d_h, d_cs, dh_next, dcs_next, d_h_final, d_cs_final, t_d_h, t_d_cs, t_dh_next,
        t_dcs_next, t_d_h_final, t_d_cs_final, zoneout_cs, zoneout_h, has_d_h, has_d_cs,
        has_d_h_final, has_d_cs_final, use_zoneout_cs, use_zoneout_h, last);
    const A o = gc_load(o_in[k]);
    const A co = gc_load(co_in[k]);
    const A to = gc_load(t_o_in[k]);
    const A tco = gc_load(t_co_in[k]);
    const A so = o * (one - o);
    const A sco = one - co * co;
    const gc_lstm_gate_up<A> g = gc_lstm_gate_upstream<T, A, Index>(d_gate_up, has_d_gate_up,
                                                                    k, n);
    const gc_lstm_gate_up<A> tg = gc_lstm_gate_upstream<T, A, Index>(t_d_gate_up,
                                                                     has_d_gate_up, k, n);
    gc_lstm_ln_up_tangent<A> v;
    const A pre_o = u.dh * co + g.o;
    v.d_o = pre_o * so;
    v.td_o = (u.tdh * co + u.dh * tco + tg.o) * so + pre_o * to * (one - two * o);
    v.dcs_c = u.dcs_up;
    v.tdcs_c = u.tdcs_up;
    if (use_peephole) {
        const A w = gc_load(wco[col]);
        v.dcs_c = v.dcs_c + v.d_o * w;
        v.tdcs_c = v.tdcs_c + v.td_o * w + v.d_o * gc_load(t_wco[col]);
    }
    const A pre_co = u.dh * o + g.co;
    const A dco = pre_co * sco;
    const A tdco = (u.tdh * o + u.dh * to + tg.co) * sco - two * pre_co * co * tco;
    v.dn = carry_normalized ? dco + v.dcs_c : dco;
    v.tdn = carry_normalized ? tdco + v.tdcs_c : tdco;
    v.tdh_old = u.tdh_old;
    v.tdcs_old = u.tdcs_old;
    return v;
}

// Second order of the layer-normalised step, ONE THREAD PER ROW b, before that step's
// lstm_backward_ln: as lstm_backward_tangent (the gates' upstreams and their tangents too),
// with the cell norm's backward between dn and
// dc~ differentiated (c~, its mean and r, c_hat recomputed from the saved gates; c~' by
// gc_lstm_c_tilde_tangent, m = mean(c_hat*c~'), c_hat' = r*(c~' - mean(c~') - c_hat*m),
// r' = -r^2*m; g = dn*gamma_c, g' = dn'*gamma_c + dn*gamma_c'):
//   dc~' = r'*(g - mean(g) - c_hat*mean(g*c_hat))
//          + r*(g' - mean(g') - c_hat'*mean(g*c_hat) - c_hat*mean(g'*c_hat + g*c_hat'))
//          (+ dcs_c' when the carry is raw; 0 where mask_clip and the clip is active)
//   t_norm_terms = [dn'*c_hat + dn*c_hat', dn']
// and with zoneout_cs the o-peephole's carried state n = gamma_c*c_hat + beta_c (its
// tangent gamma_c'*c_hat + gamma_c*c_hat' + beta_c') or c~ (c~'). Passes: 1-2 the mean and
// r; 3 the sums of c~' and c_hat*c~'; 4 those of g, g*c_hat, g', g'*c_hat + g*c_hat';
// 5 writes. t_dcs_prev may be t_dcs_next.
template <class T, class A, class Index>
__device__ __forceinline__ void lstm_backward_tangent_ln_body(
    const T* cs_prev, const T* i_in, const T* cs_in, const T* f_in, const T* o_in,
    const T* ci_in, const T* co_in, const T* wci, const T* wcf, const T* wco,
    const T* gamma_c, const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len, const T* beta_c,
    const T* t_cs_prev, const T* t_i_in, const T* t_cs_in, const T* t_f_in,
    const T* t_o_in, const T* t_ci_in, const T* t_co_in, const T* t_wci, const T* t_wcf,
    const T* t_wco, const T* t_gamma_c, const T* t_beta_c, const T* t_d_h,
    const T* t_d_cs, const T* t_dh_next, const T* t_dcs_next, const T* t_d_h_final,
    const T* t_d_cs_final, const T* d_gate_up, const T* t_d_gate_up, const T* zoneout_cs,
    const T* zoneout_h, A cell_clip, A epsilon, int use_peephole, int use_clip,
    int mask_clip, int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final,
    int use_seq_len, int has_d_gate_up, int carry_normalized, int use_zoneout_cs,
    int use_zoneout_h, long long step, long long n_steps, Index batch, Index hidden,
    T* t_d_gates, T* t_dcs_prev, T* t_peephole_terms, T* t_norm_terms, T* t_dh_zoned)
{
    const A zero = (A)0;
    const Index n = batch * hidden;
    const A one = (A)1;
    const A count = (A)(hidden > 0 ? hidden : 1);
    for (Index row = gc_first_x<Index>(); row < batch; row += gc_stride_x<Index>()) {
        const Index base = row * hidden;
        const long long length = use_seq_len ? (long long)seq_len[row] : n_steps;
        if (step >= length) {
            gc_lstm_ln_stopped_row<T>(row, hidden, use_peephole, has_d_cs_final, use_zoneout_h,
                                      t_d_cs_final, t_d_gates, t_peephole_terms,
                                      t_norm_terms, t_dcs_prev, t_dh_zoned);
            continue;
        }
        const int last = step + 1 >= length;
#define GC_C_TILDE(k) gc_lstm_c_tilde<T, A>(gc_load(i_in[k]), gc_load(ci_in[k]), \
                                            gc_load(f_in[k]), gc_load(cs_prev[k]), \
                                            use_clip, cell_clip)
#define GC_C_TILDE_TANGENT(k) gc_lstm_c_tilde_tangent<A>( \
        gc_load(i_in[k]), gc_load(ci_in[k]), gc_load(f_in[k]), gc_load(cs_prev[k]), \
        gc_load(t_i_in[k]), gc_load(t_ci_in[k]), gc_load(t_f_in[k]), gc_load(t_cs_prev[k]), \
        use_clip, cell_clip)
#define GC_UP(k, col) gc_lstm_ln_upstream_tangent<T, A, Index>( \
        k, col, o_in, co_in, t_o_in, t_co_in, wco, t_wco, d_h, d_cs, dh_next, dcs_next, \
        d_h_final, d_cs_final, t_d_h, t_d_cs, t_dh_next, t_dcs_next, t_d_h_final, \
        t_d_cs_final, zoneout_cs, zoneout_h, use_peephole, has_d_h, has_d_cs, has_d_h_final, \
        has_d_cs_final, use_zoneout_cs, use_zoneout_h, last, carry_normalized, d_gate_up, \
        t_d_gate_up, has_d_gate_up, n)
        A sum = zero;
        for (Index k = base; k < base + hidden; ++k) sum = sum + GC_C_TILDE(k);
        const A mean = sum / count;
        A squares = zero;
        for (Index k = base; k < base + hidden; ++k) {
            const A c = GC_C_TILDE(k) - mean;
            squares = gc_fma(c, c, squares);
        }
        const A r = one / gc_sqrt(squares / count + epsilon);
        A sum_t = zero, sum_ct = zero;
        for (Index k = base; k < base + hidden; ++k) {
            const A t = GC_C_TILDE_TANGENT(k);
            sum_t = sum_t + t;
            sum_ct = gc_fma((GC_C_TILDE(k) - mean) * r, t, sum_ct);
        }
        const A mean_t = sum_t / count, m = sum_ct / count;
        const A t_r = -r * r * m;
        A sum_g = zero, sum_gc = zero, sum_tg = zero, sum_tgc = zero;
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const gc_lstm_ln_up_tangent<A> v = GC_UP(k, col);
            const A c_hat = (GC_C_TILDE(k) - mean) * r;
            const A t_c_hat = r * (GC_C_TILDE_TANGENT(k) - mean_t - c_hat * m);
            const A g = v.dn * gc_load(gamma_c[col]);
            const A tg = v.tdn * gc_load(gamma_c[col]) + v.dn * gc_load(t_gamma_c[col]);
            sum_g = sum_g + g;
            sum_gc = gc_fma(g, c_hat, sum_gc);
            sum_tg = sum_tg + tg;
            sum_tgc = sum_tgc + tg * c_hat + g * t_c_hat;
        }
        const A mean_g = sum_g / count, mean_gc = sum_gc / count;
        const A mean_tg = sum_tg / count, mean_tgc = sum_tgc / count;
        for (Index col = 0; col < hidden; ++col) {
            const Index k = base + col;
            const Index g_at = row * 4 * hidden + col;
            const Index p = row * 3 * hidden + col;
            const gc_lstm_ln_up_tangent<A> v = GC_UP(k, col);
            const A c_prev = gc_load(cs_prev[k]);
            const A i = gc_load(i_in[k]);
            const A f = gc_load(f_in[k]);
            const A ci = gc_load(ci_in[k]);
            const A c_tilde = GC_C_TILDE(k);
            const A t_c_tilde = GC_C_TILDE_TANGENT(k);
            const A c_hat = (c_tilde - mean) * r;
            const A t_c_hat = r * (t_c_tilde - mean_t - c_hat * m);
            const A gamma = gc_load(gamma_c[col]);
            const A g = v.dn * gamma;
            const A tg = v.tdn * gamma + v.dn * gc_load(t_gamma_c[col]);
            A dcs = r * (g - mean_g - c_hat * mean_gc);
            A tdcs = t_r * (g - mean_g - c_hat * mean_gc)
                     + r * (tg - mean_tg - t_c_hat * mean_gc - c_hat * mean_tgc);
            if (!carry_normalized) {
                dcs = dcs + v.dcs_c;
                tdcs = tdcs + v.tdcs_c;
            }
            if (mask_clip && !(gc_abs(gc_fma(i, ci, f * c_prev)) <= cell_clip)) {
                dcs = zero;
                tdcs = zero;
            }
            const A t_prev = gc_lstm_gate_grads_tangent<T, A, Index>(
                dcs, tdcs, i, f, ci, c_prev, gc_load(t_i_in[k]), gc_load(t_f_in[k]),
                gc_load(t_ci_in[k]), gc_load(t_cs_prev[k]),
                gc_lstm_gate_upstream<T, A, Index>(d_gate_up, has_d_gate_up, k, n),
                gc_lstm_gate_upstream<T, A, Index>(t_d_gate_up, has_d_gate_up, k, n), g_at, p,
                hidden, col, wci, wcf, t_wci, t_wcf, use_peephole, t_d_gates,
                t_peephole_terms);
            t_d_gates[g_at + 3 * hidden] = gc_store<T>::from(v.td_o);
            if (use_peephole) {
                A cs = gc_load(cs_in[k]);
                A tcs = gc_load(t_cs_in[k]);
                if (use_zoneout_cs) {
                    cs = carry_normalized ? gc_rounded<T>(gc_fma(gamma, c_hat,
                                                                 gc_load(beta_c[col])))
                                          : c_tilde;
                    tcs = carry_normalized ? gc_load(t_gamma_c[col]) * c_hat + gamma * t_c_hat
                                                 + gc_load(t_beta_c[col])
                                           : t_c_tilde;
                }
                t_peephole_terms[p + 2 * hidden] = gc_store<T>::from(v.td_o * cs + v.d_o * tcs);
            }
            t_norm_terms[row * 2 * hidden + col] = gc_store<T>::from(v.tdn * c_hat
                                                                     + v.dn * t_c_hat);
            t_norm_terms[row * 2 * hidden + hidden + col] = gc_store<T>::from(v.tdn);
            t_dcs_prev[k] = gc_store<T>::from(t_prev + v.tdcs_old);
            if (use_zoneout_h) t_dh_zoned[k] = gc_store<T>::from(v.tdh_old);
        }
#undef GC_C_TILDE
#undef GC_C_TILDE_TANGENT
#undef GC_UP
    }
}

// gc-optional (zoneout): zoneout_cs zoneout_h use_zoneout_cs use_zoneout_h t_dh_zoned
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void lstm_backward_tangent_ln(
    const T* cs_prev, const T* i, const T* cs, const T* f, const T* o, const T* ci,
    const T* co, const T* wci, const T* wcf, const T* wco, const T* gamma_c,
    const T* d_h, const T* d_cs, const T* dh_next, const T* dcs_next,
    const T* d_h_final, const T* d_cs_final, const int* seq_len, const T* beta_c,
    const T* t_cs_prev, const T* t_i, const T* t_cs, const T* t_f, const T* t_o,
    const T* t_ci, const T* t_co, const T* t_wci, const T* t_wcf, const T* t_wco,
    const T* t_gamma_c, const T* t_beta_c, const T* t_d_h, const T* t_d_cs,
    const T* t_dh_next, const T* t_dcs_next, const T* t_d_h_final, const T* t_d_cs_final,
    const T* d_gate_up, const T* t_d_gate_up, const T* zoneout_cs, const T* zoneout_h,
    A cell_clip, A epsilon, int use_peephole, int use_clip, int mask_clip,
    int has_d_h, int has_d_cs, int has_d_h_final, int has_d_cs_final, int use_seq_len,
    int has_d_gate_up, int carry_normalized, int use_zoneout_cs, int use_zoneout_h,
    long long step, long long n_steps, long long batch, long long hidden,
    T* t_d_gates, T* t_dcs_prev, T* t_peephole_terms, T* t_norm_terms, T* t_dh_zoned)
{
    if (batch * hidden <= GC_UINT32_SAFE_COUNT) {
        lstm_backward_tangent_ln_body<T, A, unsigned int>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, gamma_c, d_h, d_cs, dh_next,
            dcs_next, d_h_final, d_cs_final, seq_len, beta_c, t_cs_prev, t_i, t_cs, t_f, t_o,
            t_ci, t_co, t_wci, t_wcf, t_wco, t_gamma_c, t_beta_c, t_d_h, t_d_cs, t_dh_next,
            t_dcs_next, t_d_h_final, t_d_cs_final, d_gate_up, t_d_gate_up, zoneout_cs,
            zoneout_h, cell_clip, epsilon, use_peephole, use_clip, mask_clip, has_d_h,
            has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len, has_d_gate_up,
            carry_normalized, use_zoneout_cs, use_zoneout_h,
            step, n_steps, (unsigned int)batch, (unsigned int)hidden, t_d_gates, t_dcs_prev,
            t_peephole_terms, t_norm_terms, t_dh_zoned);
    } else {
        lstm_backward_tangent_ln_body<T, A, unsigned long long>(
            cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, gamma_c, d_h, d_cs, dh_next,
            dcs_next, d_h_final, d_cs_final, seq_len, beta_c, t_cs_prev, t_i, t_cs, t_f, t_o,
            t_ci, t_co, t_wci, t_wcf, t_wco, t_gamma_c, t_beta_c, t_d_h, t_d_cs, t_dh_next,
            t_dcs_next, t_d_h_final, t_d_cs_final, d_gate_up, t_d_gate_up, zoneout_cs,
            zoneout_h, cell_clip, epsilon, use_peephole, use_clip, mask_clip, has_d_h,
            has_d_cs, has_d_h_final, has_d_cs_final, use_seq_len, has_d_gate_up,
            carry_normalized, use_zoneout_cs, use_zoneout_h,
            step, n_steps, (unsigned long long)batch, (unsigned long long)hidden, t_d_gates,
            t_dcs_prev, t_peephole_terms, t_norm_terms, t_dh_zoned);
    }
}
