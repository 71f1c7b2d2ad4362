// Plain (Elman) RNN cell, one time step per launch: the fused elementwise forward and
// backward. All [B, H] arrays C-contiguous; one thread per element k = b*H + j of a
// [B, H] array, in a grid-stride loop.
//
// T is the storage type (float, double or gc_half); A the arithmetic type (float for
// gc_half). The parameter lists are mirrored, in order, by gradcells/gpu/_kernels.py,
// which generates each kernel's extern "C" entry point per dtype (see GC_KERNEL).
// The activation is an argument: use_relu = 0 is tanh, 1 is relu.

#include "common.cuh"

// relu(z) = max(z, 0); NaN passes through (as numpy.maximum).
template <class A>
__device__ __forceinline__ A rnn_relu(A z) {
    return z <= (A)0 ? (A)0 : z;
}

// In the comments, @ is a matmul and * an elementwise (or scalar) product.
//
// Forward:
//   h = act(gx + gh + b)          gx = x@W_x, gh = h_prev@W_h: [B, H];  b: [H]
// With lengths (use_seq_len), a row with step >= seq_len[b] writes zero to h and leaves
// its state alone; a running row also writes its new h to h_state, which may be the
// buffer gh was computed from (each element is written by one thread).
// Zoneout (use_zoneout_h, zoneout_h: the step's [B, H] mask; docs/spec.md, section 11.3)
// mixes the new state with the old one: h = z*h_prev + (1-z)*act(...), stored and carried
// (h_prev is read only then, and may be the h_state buffer).
template <class T, class A, class Index>
__device__ __forceinline__ void rnn_forward_body(
    const T* gx, const T* gh, const T* b, const int* seq_len, const T* h_prev,
    const T* zoneout_h, int use_relu, int use_seq_len, int use_zoneout_h, long long step,
    Index n, Index hidden, T* h_out, T* h_state)
{
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            h_out[k] = gc_store<T>::from((A)0);
            continue;
        }
        const A z = gc_load(gx[k]) + gc_load(gh[k]) + gc_load(b[col]);
        A h = use_relu ? rnn_relu(z) : gc_tanh(z);
        if (use_zoneout_h) h = gc_zoned(gc_load(zoneout_h[k]), gc_load(h_prev[k]), h);
        h_out[k] = gc_store<T>::from(h);
        if (use_seq_len) h_state[k] = gc_store<T>::from(h);
    }
}

// gc-optional (zoneout): h_prev zoneout_h use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void rnn_forward(
    const T* gx, const T* gh, const T* b, const int* seq_len, const T* h_prev,
    const T* zoneout_h, int use_relu, int use_seq_len, int use_zoneout_h, long long step,
    long long batch, long long hidden, T* h, T* h_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        rnn_forward_body<T, A, unsigned int>(
            gx, gh, b, seq_len, h_prev, zoneout_h, use_relu, use_seq_len, use_zoneout_h, step, (unsigned int)n,
            (unsigned int)hidden, h, h_state);
    } else {
        rnn_forward_body<T, A, unsigned long long>(
            gx, gh, b, seq_len, h_prev, zoneout_h, use_relu, use_seq_len, use_zoneout_h, step, (unsigned long long)n,
            (unsigned long long)hidden, h, h_state);
    }
}

// The upstream gradient of a step's state at element k: its own d_h (has_d_h) plus, on
// a row's last step (last), the final-state gradient (has_d_h_final), else the carry.
// The backward and its tangent (on the tangents' arrays) both read it.
template <class A, class T, class Index>
__device__ __forceinline__ A rnn_upstream(
    const T* d_h, const T* dh_next, const T* d_h_final, int has_d_h, int has_d_h_final,
    bool last, Index k)
{
    A dh = has_d_h ? gc_load(d_h[k]) : (A)0;
    if (last) {
        if (has_d_h_final) dh = dh + gc_load(d_h_final[k]);
    } else {
        dh = dh + gc_load(dh_next[k]);
    }
    return dh;
}

// Backward, from the step's saved output h. The upstream gradient of the step's h is the
// step's own d_h (has_d_h) plus, on a row's last step (step + 1 == length, length =
// seq_len[b] or n_steps), the final-state gradient d_h_final (has_d_h_final), and
// otherwise the carry from step + 1 (dh_next = dZ_{t+1}@W_h^T; never read on a last step):
//   dz = dh*(1 - h^2)                        tanh
//   dz = dh*(h > 0 ? 1 : 0)                  relu (relu'(0) = 0)
// A row past its length has dz = 0 (its final-state gradient passes to h0 around the
// kernels: gpu.py beside this file).
// Zoneout splits the upstream gradient g of the zoned state: dh = (1-z)*g is the new
// state's, dh_zoned = z*g the old one's (added to the carry around the kernel; 0 in a row
// past its length). Then h must be the step's own act(z), not the saved (zoned) state.
template <class T, class A, class Index>
__device__ __forceinline__ void rnn_backward_body(
    const T* h_in, const T* d_h, const T* dh_next, const T* d_h_final, const int* seq_len,
    const T* zoneout_h, int use_relu, int has_d_h, int has_d_h_final, int use_seq_len,
    int use_zoneout_h, long long step, long long n_steps, Index n, Index hidden, T* d_z,
    T* dh_zoned)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const long long length = use_seq_len ? (long long)seq_len[k / hidden] : n_steps;
        if (step >= length) {
            d_z[k] = gc_store<T>::from(zero);
            if (use_zoneout_h) dh_zoned[k] = gc_store<T>::from(zero);
            continue;
        }
        A dh = rnn_upstream<A>(d_h, dh_next, d_h_final, has_d_h, has_d_h_final,
                               step + 1 >= length, k);
        if (use_zoneout_h) {
            const A z = gc_load(zoneout_h[k]);
            dh_zoned[k] = gc_store<T>::from(z * dh);
            dh = (one - z) * dh;
        }
        const A h = gc_load(h_in[k]);
        const A slope = use_relu ? (h > zero ? one : zero) : one - h * h;
        d_z[k] = gc_store<T>::from(dh * slope);
    }
}

// gc-optional (zoneout): zoneout_h use_zoneout_h dh_zoned
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void rnn_backward(
    const T* h, const T* d_h, const T* dh_next, const T* d_h_final, const int* seq_len,
    const T* zoneout_h, int use_relu, int has_d_h, int has_d_h_final, int use_seq_len,
    int use_zoneout_h, long long step, long long n_steps, long long batch, long long hidden,
    T* d_z, T* dh_zoned)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        rnn_backward_body<T, A, unsigned int>(
            h, d_h, dh_next, d_h_final, seq_len, zoneout_h, use_relu, has_d_h, has_d_h_final,
            use_seq_len, use_zoneout_h, step, n_steps, (unsigned int)n, (unsigned int)hidden,
            d_z, dh_zoned);
    } else {
        rnn_backward_body<T, A, unsigned long long>(
            h, d_h, dh_next, d_h_final, seq_len, zoneout_h, use_relu, has_d_h, has_d_h_final,
            use_seq_len, use_zoneout_h, step, n_steps, (unsigned long long)n,
            (unsigned long long)hidden, d_z, dh_zoned);
    }
}

// Forward mode (docs/spec.md section 12), one step per launch after rnn_forward: the
// tangent of the step's state from the primal pre-activation parts (gx, gh, b: the same
// rounding as rnn_forward's, which recomputes act(z)) and the tangent's (dgx = dx@W_x +
// x@dW_x + db, dgh = dh_prev@W_h + h_prev@dW_h, the recurrent mask applied to both states):
//   dh = act'(z)*(dgx + dgh)             act' from act(z): 1 - h^2 (tanh), h > 0 (relu)
// Zoneout mixes the tangents as the states: dh = z*dh_prev + (1-z)*dh (dh_prev is read
// only then, and may be the dh_state buffer). A row past its length writes zero to dh and
// leaves dh_state alone; a running row also writes dh_state (use_seq_len).
template <class T, class A, class Index>
__device__ __forceinline__ void rnn_forward_tangent_body(
    const T* gx, const T* gh, const T* b, const T* dgx, const T* dgh, const int* seq_len,
    const T* dh_prev, const T* zoneout_h, int use_relu, int use_seq_len, int use_zoneout_h,
    long long step, Index n, Index hidden, T* dh_out, T* dh_state)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const Index row = k / hidden;
        const Index col = k - row * hidden;
        if (use_seq_len && step >= (long long)seq_len[row]) {
            dh_out[k] = gc_store<T>::from(zero);
            continue;
        }
        const A z = gc_load(gx[k]) + gc_load(gh[k]) + gc_load(b[col]);
        const A h = use_relu ? rnn_relu(z) : gc_tanh(z);
        const A slope = use_relu ? (h > zero ? one : zero) : one - h * h;
        A dh = slope * (gc_load(dgx[k]) + gc_load(dgh[k]));
        if (use_zoneout_h) dh = gc_zoned(gc_load(zoneout_h[k]), gc_load(dh_prev[k]), dh);
        dh_out[k] = gc_store<T>::from(dh);
        if (use_seq_len) dh_state[k] = gc_store<T>::from(dh);
    }
}

// gc-optional (zoneout): dh_prev zoneout_h use_zoneout_h
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void rnn_forward_tangent(
    const T* gx, const T* gh, const T* b, const T* dgx, const T* dgh, const int* seq_len,
    const T* dh_prev, const T* zoneout_h, int use_relu, int use_seq_len, int use_zoneout_h,
    long long step, long long batch, long long hidden, T* dh, T* dh_state)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        rnn_forward_tangent_body<T, A, unsigned int>(
            gx, gh, b, dgx, dgh, seq_len, dh_prev, zoneout_h, use_relu, use_seq_len,
            use_zoneout_h, step, (unsigned int)n, (unsigned int)hidden, dh, dh_state);
    } else {
        rnn_forward_tangent_body<T, A, unsigned long long>(
            gx, gh, b, dgx, dgh, seq_len, dh_prev, zoneout_h, use_relu, use_seq_len,
            use_zoneout_h, step, (unsigned long long)n, (unsigned long long)hidden, dh,
            dh_state);
    }
}

// Second order (docs/spec.md section 12), one step per launch beside rnn_backward: the
// tangent of its outputs along the tangents (suffix _t) of the step's own output h
// (h_t), of the upstream gradients and of the carry (dh_next_t = tangent of dh_next):
//   g_t = d_h_t + (d_h_final_t on a row's last step, else dh_next_t)   (as g, rnn_upstream)
//   zoneout: dh_zoned_t = z*g_t;  dh_t = (1-z)*g_t   (else dh_t = g_t)
//   dz_t = dh_t*(1 - h^2) - 2*dh*h*h_t      tanh   (dh: rnn_backward's, recomputed)
//   dz_t = dh_t*(h > 0 ? 1 : 0)             relu   (the branch follows the primal)
// A row past its length writes zeros (and dh_zoned_t = 0).
template <class T, class A, class Index>
__device__ __forceinline__ void rnn_backward_tangent_body(
    const T* h_in, const T* h_t, const T* d_h, const T* d_h_t, const T* dh_next,
    const T* dh_next_t, const T* d_h_final, const T* d_h_final_t, const int* seq_len,
    const T* zoneout_h, int use_relu, int has_d_h, int has_d_h_final, int use_seq_len,
    int use_zoneout_h, long long step, long long n_steps, Index n, Index hidden, T* d_z_t,
    T* dh_zoned_t)
{
    const A zero = (A)0;
    const A one = (A)1;
    for (Index k = gc_first_x<Index>(); k < n; k += gc_stride_x<Index>()) {
        const long long length = use_seq_len ? (long long)seq_len[k / hidden] : n_steps;
        if (step >= length) {
            d_z_t[k] = gc_store<T>::from(zero);
            if (use_zoneout_h) dh_zoned_t[k] = gc_store<T>::from(zero);
            continue;
        }
        const bool last = step + 1 >= length;
        A dh = rnn_upstream<A>(d_h, dh_next, d_h_final, has_d_h, has_d_h_final, last, k);
        A dh_t = rnn_upstream<A>(d_h_t, dh_next_t, d_h_final_t, has_d_h, has_d_h_final, last, k);
        if (use_zoneout_h) {
            const A z = gc_load(zoneout_h[k]);
            dh_zoned_t[k] = gc_store<T>::from(z * dh_t);
            dh = (one - z) * dh;
            dh_t = (one - z) * dh_t;
        }
        const A h = gc_load(h_in[k]);
        A dz_t;
        if (use_relu) {
            dz_t = h > zero ? dh_t : zero;
        } else {
            dz_t = dh_t * (one - h * h) - dh * ((A)2 * h * gc_load(h_t[k]));
        }
        d_z_t[k] = gc_store<T>::from(dz_t);
    }
}

// gc-optional (zoneout): zoneout_h use_zoneout_h dh_zoned_t
template <class T, class A = typename gc_compute<T>::type>
GC_KERNEL void rnn_backward_tangent(
    const T* h, const T* h_t, const T* d_h, const T* d_h_t, const T* dh_next,
    const T* dh_next_t, const T* d_h_final, const T* d_h_final_t, const int* seq_len,
    const T* zoneout_h, int use_relu, int has_d_h, int has_d_h_final, int use_seq_len,
    int use_zoneout_h, long long step, long long n_steps, long long batch, long long hidden,
    T* d_z_t, T* dh_zoned_t)
{
    const long long n = batch * hidden;
    if (n <= GC_UINT32_SAFE_COUNT) {
        rnn_backward_tangent_body<T, A, unsigned int>(
            h, h_t, d_h, d_h_t, dh_next, dh_next_t, d_h_final, d_h_final_t, seq_len,
            zoneout_h, use_relu, has_d_h, has_d_h_final, use_seq_len, use_zoneout_h, step,
            n_steps, (unsigned int)n, (unsigned int)hidden, d_z_t, dh_zoned_t);
    } else {
        rnn_backward_tangent_body<T, A, unsigned long long>(
            h, h_t, d_h, d_h_t, dh_next, dh_next_t, d_h_final, d_h_final_t, seq_len,
            zoneout_h, use_relu, has_d_h, has_d_h_final, use_seq_len, use_zoneout_h, step,
            n_steps, (unsigned long long)n, (unsigned long long)hidden, d_z_t, dh_zoned_t);
    }
}
