// xLSTM's sLSTM cell (docs/spec.md, section 19), one time step per launch: the fused
// elementwise forward and backward. All arrays C-contiguous; one thread per element
// k = b*H + col of a [B, H] array, in a grid-stride loop. Head kh = col / d, unit
// j = col - kh*d (d = H/N).
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). The parameter lists are read by gradcells/gpu/_kernels.py, which generates each
// kernel's extern "C" entry point per dtype (see GC_KERNEL).
//
// The math is gradcells/cells/slstm/reference.py. Pre-activations of gate g (i, f, z, o)
// are x_pre[b, g*H + col] + rec[kh, b, g*d + j]: x_pre = x@w + b gate-major, rec each
// head's h_prev_kh@r[kh] head-major (cuBLAS, around the kernels: gpu.py beside this file).
// A gate's exponential is flushed to 0 below exp(floor), floor = 2*log(eps) (the
// reference's flushed_exp); the i~ branch of the stabiliser is where i = 1.

#include "common.cuh"

__device__ __forceinline__ float slstm_exp(float a) { return expf(a); }
__device__ __forceinline__ double slstm_exp(double a) { return exp(a); }
__device__ __forceinline__ float slstm_log1p(float a) { return log1pf(a); }
__device__ __forceinline__ double slstm_log1p(double a) { return log1p(a); }

// exp(a) for a <= 0, exactly 0 below exp(floor).
template <class A>
__device__ __forceinline__ A slstm_flushed_exp(A a, A floor) {
    return a < floor ? (A)0 : slstm_exp(a);
}

// log sigmoid(z) = min(z, 0) - log1p(exp(-|z|)).
template <class A>
__device__ __forceinline__ A slstm_log_sigmoid(A z) {
    return (z < (A)0 ? z : (A)0) - slstm_log1p(slstm_exp(-gc_abs(z)));
}

// Forward, per element:
//   lf = log sigmoid(f~) (exp_forget = 0) or f~ (1);   m = max(i~, lf + m_prev)
//   i = exp(i~ - m);  f = exp(lf + m_prev - m);  z = tanh(z~);  o = sigmoid(o~)
//   c = f*c_prev + i*z;  n = f*n_prev + i;  h = o*c/n
// The state c, n, m, h is updated in place (each element by its own thread; rec was
// computed from h before the launch). With lengths (use_seq_len), a row with
// step >= seq_len[b] writes zeros to the step's outputs and leaves its state alone.
template <class T, class A, class Index>
__device__ __forceinline__ void slstm_forward_body(
    const T* x_pre, const T* rec, const int* seq_len, int use_seq_len, int exp_forget,
    A floor, long long step, Index n_all, Index batch, Index hidden, Index d, T* c, T* n,
    T* m, T* h, T* out_i, T* out_f, T* out_z, T* out_o, T* out_c, T* out_n, T* out_m,
    T* out_h)
{
    for (Index k = gc_first_x<Index>(); k < n_all; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T zero = gc_store<T>::from((A)0);
            out_i[k] = zero; out_f[k] = zero; out_z[k] = zero; out_o[k] = zero;
            out_c[k] = zero; out_n[k] = zero; out_m[k] = zero; out_h[k] = zero;
            continue;
        }
        const Index kh = col / d;
        const Index j = col - kh * d;
        const T* xr = x_pre + row * 4 * hidden;
        const T* rr = rec + (kh * batch + row) * 4 * d;
        const A it = gc_load(xr[col]) + gc_load(rr[j]);
        const A ft = gc_load(xr[hidden + col]) + gc_load(rr[d + j]);
        const A lfm = (exp_forget ? ft : slstm_log_sigmoid(ft)) + gc_load(m[k]);
        const A m_new = it >= lfm ? it : lfm;
        const A i = slstm_flushed_exp(it - m_new, floor);
        const A f = slstm_flushed_exp(lfm - m_new, floor);
        const A z = gc_tanh(gc_load(xr[2 * hidden + col]) + gc_load(rr[2 * d + j]));
        const A o = gc_sigmoid(gc_load(xr[3 * hidden + col]) + gc_load(rr[3 * d + j]));
        const A c_new = f * gc_load(c[k]) + i * z;
        const A n_new = f * gc_load(n[k]) + i;
        const A h_new = o * c_new / n_new;
        out_i[k] = gc_store<T>::from(i); out_f[k] = gc_store<T>::from(f);
        out_z[k] = gc_store<T>::from(z); out_o[k] = gc_store<T>::from(o);
        out_c[k] = c[k] = gc_store<T>::from(c_new);
        out_n[k] = n[k] = gc_store<T>::from(n_new);
        out_m[k] = m[k] = gc_store<T>::from(m_new);
        out_h[k] = h[k] = gc_store<T>::from(h_new);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void slstm_forward(
    const T* x_pre, const T* rec, const int* seq_len, int use_seq_len, int exp_forget,
    A floor, long long step, long long batch, long long hidden, long long heads,
    T* c_state, T* n_state, T* m_state, T* h_state, T* out_i, T* out_f, T* out_z, T* out_o,
    T* out_c, T* out_n, T* out_m, T* out_h)
{
    const long long n_all = batch * hidden;
    const long long d = heads > 0 ? hidden / heads : 1;
    if (4 * n_all <= GC_UINT32_SAFE_COUNT) {
        slstm_forward_body<T, A, unsigned int>(
            x_pre, rec, seq_len, use_seq_len, exp_forget, floor, step, (unsigned int)n_all,
            (unsigned int)batch, (unsigned int)hidden, (unsigned int)d, c_state, n_state,
            m_state, h_state, out_i, out_f, out_z, out_o, out_c, out_n, out_m, out_h);
    } else {
        slstm_forward_body<T, A, unsigned long long>(
            x_pre, rec, seq_len, use_seq_len, exp_forget, floor, step,
            (unsigned long long)n_all, (unsigned long long)batch, (unsigned long long)hidden,
            (unsigned long long)d, c_state, n_state, m_state, h_state, out_i, out_f, out_z,
            out_o, out_c, out_n, out_m, out_h);
    }
}

// Backward of one step, per element, from the step's saved fields (i, f, z, o, c, n, h),
// the state it started from (c_prev, n_prev), the forget pre-activation f_pre (read for
// the sigmoid forget only) and up [8, B, H], the step's upstream gradients of i, f, z, o,
// c, n, m, h. g_c, g_n, g_m: the carried gradients of the state after the step, replaced
// by those of the state before it; g_h: h's carried gradient (read only: the new one is
// d_heads@r^T, formed around the kernel). With gc, gn, gh the totals:
//   gc += gh*o/n;  gn -= gh*h/n;  do~ = (d_o + gh*c/n)*o(1-o)
//   gi = d_i + gc*z + gn;  gf = d_f + gc*c_prev + gn*n_prev;  dz~ = (d_z + gc*i)(1-z^2)
//   gm = g_m + d_m - gi*i - gf*f   (stop: none; dm_prev = 0)
//   di~ = gi*i (+ gm where i = 1);  dlf = gf*f (+ gm elsewhere);  dm_prev = dlf
//   df~ = dlf*sigmoid(-f~) (sigmoid forget) or dlf;  dc_prev = gc*f;  dn_prev = gn*f
// The pre-activation gradients go to d_gates [B, 4H] gate-major and d_heads [N, B, 4d]
// head-major. A row past its length (use_seq_len) writes zeros and keeps its carry.
template <class T, class A, class Index>
__device__ __forceinline__ void slstm_backward_body(
    const T* i_t, const T* f_t, const T* z_t, const T* o_t, const T* c_t, const T* n_t,
    const T* h_t, const T* c_prev, const T* n_prev, const T* f_pre, const T* up,
    const int* seq_len, int use_seq_len, int exp_forget, int stop, long long step,
    Index n_all, Index batch, Index hidden, Index d, T* g_c, T* g_n, T* g_m, const T* g_h,
    T* d_gates, T* d_heads)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n_all; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        const Index kh = col / d;
        const Index j = col - kh * d;
        T* dg = d_gates + row * 4 * hidden;
        T* dh = d_heads + (kh * batch + row) * 4 * d;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            const T z0 = gc_store<T>::from(zero);
            dg[col] = z0; dg[hidden + col] = z0; dg[2 * hidden + col] = z0;
            dg[3 * hidden + col] = z0;
            dh[j] = z0; dh[d + j] = z0; dh[2 * d + j] = z0; dh[3 * d + j] = z0;
            continue;
        }
        const A i = gc_load(i_t[k]), f = gc_load(f_t[k]), z = gc_load(z_t[k]);
        const A o = gc_load(o_t[k]), c = gc_load(c_t[k]), n = gc_load(n_t[k]);
        const A hv = gc_load(h_t[k]);
        const A gh = gc_load(g_h[k]) + gc_load(up[7 * n_all + k]);
        const A gc = gc_load(g_c[k]) + gc_load(up[4 * n_all + k]) + gh * o / n;
        const A gn = gc_load(g_n[k]) + gc_load(up[5 * n_all + k]) - gh * hv / n;
        const A d_o = (gc_load(up[3 * n_all + k]) + gh * c / n) * (o * (one - o));
        const A gi = gc_load(up[k]) + gc * z + gn;
        const A gf = gc_load(up[n_all + k]) + gc * gc_load(c_prev[k]) + gn * gc_load(n_prev[k]);
        const A d_z = (gc_load(up[2 * n_all + k]) + gc * i) * (one - z * z);
        A d_it = gi * i;
        A d_lf = gf * f;
        A dm_prev = zero;
        if (!stop) {
            const A gm = gc_load(g_m[k]) + gc_load(up[6 * n_all + k]) - d_it - d_lf;
            if (i >= one) d_it = d_it + gm; else d_lf = d_lf + gm;
            dm_prev = d_lf;
        }
        const A d_ft = exp_forget ? d_lf : d_lf * gc_sigmoid(-gc_load(f_pre[k]));
        dg[col] = gc_store<T>::from(d_it);
        dg[hidden + col] = gc_store<T>::from(d_ft);
        dg[2 * hidden + col] = gc_store<T>::from(d_z);
        dg[3 * hidden + col] = gc_store<T>::from(d_o);
        dh[j] = gc_store<T>::from(d_it);
        dh[d + j] = gc_store<T>::from(d_ft);
        dh[2 * d + j] = gc_store<T>::from(d_z);
        dh[3 * d + j] = gc_store<T>::from(d_o);
        g_c[k] = gc_store<T>::from(gc * f);
        g_n[k] = gc_store<T>::from(gn * f);
        g_m[k] = gc_store<T>::from(dm_prev);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void slstm_backward(
    const T* i_t, const T* f_t, const T* z_t, const T* o_t, const T* c_t, const T* n_t,
    const T* h_t, const T* c_prev, const T* n_prev, const T* f_pre, const T* up,
    const int* seq_len, int use_seq_len, int exp_forget, int stop, long long step,
    long long batch, long long hidden, long long heads, T* g_c, T* g_n, T* g_m,
    const T* g_h, T* d_gates, T* d_heads)
{
    const long long n_all = batch * hidden;
    const long long d = heads > 0 ? hidden / heads : 1;
    if (8 * n_all <= GC_UINT32_SAFE_COUNT) {
        slstm_backward_body<T, A, unsigned int>(
            i_t, f_t, z_t, o_t, c_t, n_t, h_t, c_prev, n_prev, f_pre, up, seq_len,
            use_seq_len, exp_forget, stop, step, (unsigned int)n_all, (unsigned int)batch,
            (unsigned int)hidden, (unsigned int)d, g_c, g_n, g_m, g_h, d_gates, d_heads);
    } else {
        slstm_backward_body<T, A, unsigned long long>(
            i_t, f_t, z_t, o_t, c_t, n_t, h_t, c_prev, n_prev, f_pre, up, seq_len,
            use_seq_len, exp_forget, stop, step, (unsigned long long)n_all,
            (unsigned long long)batch, (unsigned long long)hidden, (unsigned long long)d,
            g_c, g_n, g_m, g_h, d_gates, d_heads);
    }
}

// Forward mode: one step and its tangent, per element (the reference's slstm_step_jvp).
// dx_pre, drec: the tangents of x_pre and rec (rec(dh, r) + rec(h, dr), around the
// kernel). state, d_state [4, B, H]: c, n, m, h and their tangents, updated in place;
// out, d_out [8, B, H]: the step's fields i, f, z, o, c, n, m, h and their tangents.
//   dlf = df~*sigmoid(-f~) (sigmoid forget) or df~;  dm = di~ where i = 1, else dlf + dm_prev
//   (stop: dm = dm_prev = 0);  di = i*(di~ - dm);  df = f*(dlf + dm_prev - dm)
//   dz = (1 - z^2)*dz~;  do = o(1-o)*do~;  dc = df*c_prev + f*dc_prev + di*z + i*dz
//   dn = df*n_prev + f*dn_prev + di;  dh = do*c/n + (o*dc - h*dn)/n
// A row past its length writes zeros to the step's fields and tangents and keeps its state.
template <class T, class A, class Index>
__device__ __forceinline__ void slstm_forward_tangent_body(
    const T* x_pre, const T* rec, const T* dx_pre, const T* drec, const int* seq_len,
    int use_seq_len, int exp_forget, int stop, A floor, long long step, Index n_all,
    Index batch, Index hidden, Index d, T* state, T* d_state, T* out, T* d_out)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n_all; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            for (int g = 0; g < 8; ++g) {
                out[g * n_all + k] = gc_store<T>::from(zero);
                d_out[g * n_all + k] = gc_store<T>::from(zero);
            }
            continue;
        }
        const Index kh = col / d;
        const Index j = col - kh * d;
        const Index xo = row * 4 * hidden + col;
        const Index ro = (kh * batch + row) * 4 * d + j;
        A pre[4], dpre[4];
        for (int g = 0; g < 4; ++g) {
            pre[g] = gc_load(x_pre[xo + g * hidden]) + gc_load(rec[ro + g * d]);
            dpre[g] = gc_load(dx_pre[xo + g * hidden]) + gc_load(drec[ro + g * d]);
        }
        const A c_p = gc_load(state[k]), n_p = gc_load(state[n_all + k]);
        const A m_p = gc_load(state[2 * n_all + k]);
        const A dc_p = gc_load(d_state[k]), dn_p = gc_load(d_state[n_all + k]);
        const A lfm = (exp_forget ? pre[1] : slstm_log_sigmoid(pre[1])) + m_p;
        const A m_new = pre[0] >= lfm ? pre[0] : lfm;
        const A i = slstm_flushed_exp(pre[0] - m_new, floor);
        const A f = slstm_flushed_exp(lfm - m_new, floor);
        const A z = gc_tanh(pre[2]);
        const A o = gc_sigmoid(pre[3]);
        const A c_new = f * c_p + i * z;
        const A n_new = f * n_p + i;
        const A h_new = o * c_new / n_new;
        const A d_lf = exp_forget ? dpre[1] : dpre[1] * gc_sigmoid(-pre[1]);
        const A dm_p = stop ? zero : gc_load(d_state[2 * n_all + k]);
        const A dm = stop ? zero : (i >= one ? dpre[0] : d_lf + dm_p);
        const A di = i * (dpre[0] - dm);
        const A df = f * (d_lf + dm_p - dm);
        const A dz = (one - z * z) * dpre[2];
        const A d_o = o * (one - o) * dpre[3];
        const A dc = df * c_p + f * dc_p + di * z + i * dz;
        const A dn = df * n_p + f * dn_p + di;
        const A dh = d_o * c_new / n_new + (o * dc - h_new * dn) / n_new;
        const A values[8] = {i, f, z, o, c_new, n_new, m_new, h_new};
        const A tangents[8] = {di, df, dz, d_o, dc, dn, dm, dh};
        for (int g = 0; g < 8; ++g) {
            out[g * n_all + k] = gc_store<T>::from(values[g]);
            d_out[g * n_all + k] = gc_store<T>::from(tangents[g]);
        }
        for (int g = 0; g < 4; ++g) {
            state[g * n_all + k] = gc_store<T>::from(values[4 + g]);
            d_state[g * n_all + k] = gc_store<T>::from(tangents[4 + g]);
        }
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void slstm_forward_tangent(
    const T* x_pre, const T* rec, const T* dx_pre, const T* drec, const int* seq_len,
    int use_seq_len, int exp_forget, int stop, A floor, long long step, long long batch,
    long long hidden, long long heads, T* state, T* d_state, T* out, T* d_out)
{
    const long long n_all = batch * hidden;
    const long long d = heads > 0 ? hidden / heads : 1;
    if (8 * n_all <= GC_UINT32_SAFE_COUNT) {
        slstm_forward_tangent_body<T, A, unsigned int>(
            x_pre, rec, dx_pre, drec, seq_len, use_seq_len, exp_forget, stop, floor, step,
            (unsigned int)n_all, (unsigned int)batch, (unsigned int)hidden, (unsigned int)d,
            state, d_state, out, d_out);
    } else {
        slstm_forward_tangent_body<T, A, unsigned long long>(
            x_pre, rec, dx_pre, drec, seq_len, use_seq_len, exp_forget, stop, floor, step,
            (unsigned long long)n_all, (unsigned long long)batch, (unsigned long long)hidden,
            (unsigned long long)d, state, d_state, out, d_out);
    }
}

// Second order: one step's backward and its tangent, per element (the JVP of
// slstm_backward, every line differentiated as written; the branch of m is the primal's).
// fields, d_fields [8, B, H]: the step's saved i, f, z, o, c, n, m, h and their tangents;
// starts, d_starts [2, B, H]: c_prev, n_prev and theirs; f_pre, d_f_pre [B, H]: f~ and its
// tangent (sigmoid forget only); up, d_up [8, B, H]: the step's upstream gradients and
// theirs; carry, d_carry [4, B, H]: g_c, g_n, g_m, g_h and their tangents, the first three
// replaced by the state-before's (g_h read only); d_gates, d_gates_t [B, 4H] gate-major.
template <class T, class A, class Index>
__device__ __forceinline__ void slstm_backward_tangent_body(
    const T* fields, const T* d_fields, const T* starts, const T* d_starts, const T* f_pre,
    const T* d_f_pre, const T* up, const T* d_up, const int* seq_len, int use_seq_len,
    int exp_forget, int stop, long long step, Index n_all, Index hidden, T* carry,
    T* d_carry, T* d_gates, T* d_gates_t)
{
    const A zero = (A)0;
    const A one = (A)1;
    const A two = (A)2;
    for (Index k = gc_first_x<Index>(); k < n_all; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        T* dg = d_gates + row * 4 * hidden;
        T* dgt = d_gates_t + row * 4 * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            for (int g = 0; g < 4; ++g) {
                dg[g * hidden + col] = gc_store<T>::from(zero);
                dgt[g * hidden + col] = gc_store<T>::from(zero);
            }
            continue;
        }
        A v[8], t[8], u[8], tu[8];
        for (int g = 0; g < 8; ++g) {
            v[g] = gc_load(fields[g * n_all + k]);
            t[g] = gc_load(d_fields[g * n_all + k]);
            u[g] = gc_load(up[g * n_all + k]);
            tu[g] = gc_load(d_up[g * n_all + k]);
        }
        const A i = v[0], f = v[1], z = v[2], o = v[3], c = v[4], n = v[5], h = v[7];
        const A ti = t[0], tf = t[1], tz = t[2], to = t[3], tc = t[4], tn = t[5], th = t[7];
        const A cp = gc_load(starts[k]), np_ = gc_load(starts[n_all + k]);
        const A tcp = gc_load(d_starts[k]), tnp = gc_load(d_starts[n_all + k]);
        const A gh = gc_load(carry[3 * n_all + k]) + u[7];
        const A tgh = gc_load(d_carry[3 * n_all + k]) + tu[7];
        const A gc = gc_load(carry[k]) + u[4] + gh * o / n;
        const A tgc = gc_load(d_carry[k]) + tu[4] + (tgh * o + gh * to) / n
                      - gh * o * tn / (n * n);
        const A gn = gc_load(carry[n_all + k]) + u[5] - gh * h / n;
        const A tgn = gc_load(d_carry[n_all + k]) + tu[5] - (tgh * h + gh * th) / n
                      + gh * h * tn / (n * n);
        const A a = u[3] + gh * c / n;
        const A ta = tu[3] + (tgh * c + gh * tc) / n - gh * c * tn / (n * n);
        const A d_o = a * (o * (one - o));
        const A td_o = ta * (o * (one - o)) + a * (to * (one - two * o));
        const A gi = u[0] + gc * z + gn;
        const A tgi = tu[0] + tgc * z + gc * tz + tgn;
        const A gf = u[1] + gc * cp + gn * np_;
        const A tgf = tu[1] + tgc * cp + gc * tcp + tgn * np_ + gn * tnp;
        const A bz = u[2] + gc * i;
        const A tbz = tu[2] + tgc * i + gc * ti;
        const A d_z = bz * (one - z * z);
        const A td_z = tbz * (one - z * z) - bz * (two * z * tz);
        A d_it = gi * i, td_it = tgi * i + gi * ti;
        A d_lf = gf * f, td_lf = tgf * f + gf * tf;
        A dm_prev = zero, tdm_prev = zero;
        if (!stop) {
            const A gm = gc_load(carry[2 * n_all + k]) + u[6] - d_it - d_lf;
            const A tgm = gc_load(d_carry[2 * n_all + k]) + tu[6] - td_it - td_lf;
            if (i >= one) { d_it = d_it + gm; td_it = td_it + tgm; }
            else { d_lf = d_lf + gm; td_lf = td_lf + tgm; }
            dm_prev = d_lf;
            tdm_prev = td_lf;
        }
        A d_ft = d_lf, td_ft = td_lf;
        if (!exp_forget) {
            const A s = gc_sigmoid(-gc_load(f_pre[k]));
            d_ft = d_lf * s;
            td_ft = td_lf * s - d_lf * (s * (one - s) * gc_load(d_f_pre[k]));
        }
        const A grads[4] = {d_it, d_ft, d_z, d_o};
        const A tangents[4] = {td_it, td_ft, td_z, td_o};
        for (int g = 0; g < 4; ++g) {
            dg[g * hidden + col] = gc_store<T>::from(grads[g]);
            dgt[g * hidden + col] = gc_store<T>::from(tangents[g]);
        }
        carry[k] = gc_store<T>::from(gc * f);
        d_carry[k] = gc_store<T>::from(tgc * f + gc * tf);
        carry[n_all + k] = gc_store<T>::from(gn * f);
        d_carry[n_all + k] = gc_store<T>::from(tgn * f + gn * tf);
        carry[2 * n_all + k] = gc_store<T>::from(dm_prev);
        d_carry[2 * n_all + k] = gc_store<T>::from(tdm_prev);
    }
}

template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void slstm_backward_tangent(
    const T* fields, const T* d_fields, const T* starts, const T* d_starts, const T* f_pre,
    const T* d_f_pre, const T* up, const T* d_up, const int* seq_len, int use_seq_len,
    int exp_forget, int stop, long long step, long long batch, long long hidden, T* carry,
    T* d_carry, T* d_gates, T* d_gates_t)
{
    const long long n_all = batch * hidden;
    if (8 * n_all <= GC_UINT32_SAFE_COUNT) {
        slstm_backward_tangent_body<T, A, unsigned int>(
            fields, d_fields, starts, d_starts, f_pre, d_f_pre, up, d_up, seq_len, use_seq_len,
            exp_forget, stop, step, (unsigned int)n_all, (unsigned int)hidden, carry, d_carry,
            d_gates, d_gates_t);
    } else {
        slstm_backward_tangent_body<T, A, unsigned long long>(
            fields, d_fields, starts, d_starts, f_pre, d_f_pre, up, d_up, seq_len, use_seq_len,
            exp_forget, stop, step, (unsigned long long)n_all, (unsigned long long)hidden,
            carry, d_carry, d_gates, d_gates_t);
    }
}
