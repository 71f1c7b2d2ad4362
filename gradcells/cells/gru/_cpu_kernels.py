"""The GRU's fused elementwise passes (Numba).

The math is ``gradcells.reference.gru``. Reset before the candidate matmul (TensorFlow's
cell) needs r before the candidate's matmul, so each direction is two passes around a matmul
(``gru.py`` does the matmuls):

    forward:   [x,h_prev]·w_ru -> gru_gates_kernel (r, u, [x, r∘h_prev])
               [x, r∘h_prev]·w_c -> gru_candidate_kernel (c, h)
    gradient:  gru_candidate_grad_kernel (dc_bar, du_bar, [x, r∘h_prev], bias sums)
               dc_bar·w_cᵀ -> gru_reset_grad_kernel (dr_bar, dh partial)
               then d[x,h_prev] = [dr_bar,du_bar]·w_ruᵀ + ..., dw_ru, dw_c by BLAS

Reset after (``reset_after=True``) has every matmul up front, so each direction is one pass:
``gru_reset_after_kernel`` and ``gru_reset_after_grad_kernel``.

Every kernel's contract is in its docstring (``gru.py``'s sequence ops call them once per
time step). All arrays are C-contiguous and of one float dtype; B rows, H columns.
"""

from __future__ import annotations

from ._activations import sigmoid, tanh, typed
from ._compile import kernel, row_of


@kernel
def gru_gates_kernel(gates_ru, addend_ru, x, h_prev, r, u, xrh):
    """Reset and update gates; writes ``r, u [B, H]`` and ``xrh [B, I+H] = [x, r∘h_prev]``.

    ``gates_ru [B, 2H]``: pre-activations without bias (``[x, h_prev]·w_ru``); ``addend_ru``:
    ``[2H]`` (bias) or ``[B, 2H]``; ``x [B, I]`` is copied into the first I columns of
    ``xrh`` (pass a ``[B, 0]`` array to get ``r∘h_prev`` alone):

        [r, u] = σ(gates_ru + addend_ru)
    """
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    for row in range(n_batch):
        g, a = gates_ru[row], row_of(addend_ru, row)
        g_r, g_u = g[:n_hidden], g[n_hidden:]
        a_r, a_u = a[:n_hidden], a[n_hidden:]
        h_r, r_r, u_r = h_prev[row], r[row], u[row]
        out = xrh[row]
        out[:n_in] = x[row]
        rh = out[n_in:]
        for j in range(n_hidden):
            gate_r = sigmoid(g_r[j] + a_r[j])
            r_r[j] = gate_r
            u_r[j] = sigmoid(g_u[j] + a_u[j])
            rh[j] = gate_r * h_r[j]


@kernel
def gru_candidate_kernel(gates_c, addend_c, h_prev, u, c, h):
    """Candidate and new state; writes ``c, h [B, H]``.

    ``gates_c [B, H]``: ``[x, r∘h_prev]·w_c`` without bias; ``addend_c [H]`` or ``[B, H]``:

        c = tanh(gates_c + addend_c);   h = u·h_prev + (1-u)·c
    """
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    for row in range(n_batch):
        g, a = gates_c[row], row_of(addend_c, row)
        h_p, u_r, c_r, h_r = h_prev[row], u[row], c[row], h[row]
        for j in range(n_hidden):
            cand = tanh(g[j] + a[j])
            c_r[j] = cand
            h_r[j] = u_r[j] * h_p[j] + (one - u_r[j]) * cand


@kernel
def gru_reset_after_kernel(gates_ru, addend_ru, gates_cx, addend_cx, gates_ch, addend_ch,
                           h_prev, r, u, c, h):
    """The reset-after GRU step in one pass; writes ``r, u, c, h [B, H]``.

    ``gates_ru [B, 2H] = [x, h_prev]·w_ru``, ``gates_cx [B, H] = x·W_cx``,
    ``gates_ch [B, H] = h_prev·W_ch`` (all without bias); each ``addend_*`` is its bias
    (``[2H]``/``[H]``) or a per-row ``[B, ·]`` array:

        [r, u] = σ(gates_ru + addend_ru);   n = gates_ch + addend_ch
        c = tanh(gates_cx + addend_cx + r·n);   h = u·h_prev + (1-u)·c
    """
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    for row in range(n_batch):
        g, a = gates_ru[row], row_of(addend_ru, row)
        g_r, g_u = g[:n_hidden], g[n_hidden:]
        a_r, a_u = a[:n_hidden], a[n_hidden:]
        g_cx, a_cx = gates_cx[row], row_of(addend_cx, row)
        g_ch, a_ch = gates_ch[row], row_of(addend_ch, row)
        h_p, r_r, u_r, c_r, h_r = h_prev[row], r[row], u[row], c[row], h[row]
        for j in range(n_hidden):
            gate_r = sigmoid(g_r[j] + a_r[j])
            gate_u = sigmoid(g_u[j] + a_u[j])
            cand = tanh(g_cx[j] + a_cx[j] + gate_r * (g_ch[j] + a_ch[j]))
            r_r[j] = gate_r
            u_r[j] = gate_u
            c_r[j] = cand
            h_r[j] = gate_u * h_p[j] + (one - gate_u) * cand


@kernel
def gru_candidate_grad_kernel(d_h, has_d_h, r, u, c, h_prev, x, dc_bar, d_ru, xrh, d_bias_ru,
                              d_bias_c):
    """First backward pass (reset before): the candidate and update-gate gradients.

    ``d_h [B, H]`` is read only when ``has_d_h`` (else zeros: pass any ``[B, H]`` array);
    ``r, u, c`` the forward's outputs; ``x [B, I]`` (or ``[B, 0]``). Writes
    ``dc_bar [B, H]``, the right half ``du_bar`` of ``d_ru [B, 2H]`` and
    ``xrh [B, I+H] = [x, r∘h_prev]``; accumulates (``+=``) ``d_bias_c [H]`` and the right
    half of ``d_bias_ru [2H]``:

        dc_bar = d_h·(1-u)·(1-c²);   du_bar = d_h·(h_prev-c)·u(1-u)
    """
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    zero = typed(0.0, h_prev)
    one = typed(1.0, h_prev)
    db_u = d_bias_ru[n_hidden:]
    db_c = d_bias_c[:n_hidden]
    for row in range(n_batch):
        dh_r, r_r, u_r, c_r, h_p = d_h[row], r[row], u[row], c[row], h_prev[row]
        dc_r, du_r = dc_bar[row], d_ru[row, n_hidden:]
        out = xrh[row]
        out[:n_in] = x[row]
        rh = out[n_in:]
        for j in range(n_hidden):
            upstream = dh_r[j] if has_d_h else zero
            gate_u, cand = u_r[j], c_r[j]
            d_c = upstream * (one - gate_u) * (one - cand * cand)
            d_u = upstream * (h_p[j] - cand) * gate_u * (one - gate_u)
            dc_r[j] = d_c
            du_r[j] = d_u
            db_c[j] += d_c
            db_u[j] += d_u
            rh[j] = r_r[j] * h_p[j]


@kernel
def gru_reset_grad_kernel(dxhr, d_h, has_d_h, r, u, h_prev, d_ru, d_bias_ru):
    """Second backward pass (reset before): the reset-gate gradient.

    ``dxhr [B, I+H] = dc_bar·w_cᵀ``, whose last H columns are d_hr = dL/d(r∘h_prev). Writes
    the left half ``dr_bar`` of ``d_ru [B, 2H]``, accumulates (``+=``) the left half of
    ``d_bias_ru [2H]``, and overwrites those last H columns of ``dxhr`` with the part of
    dL/dh_prev that does not go through w_ru:

        dr_bar = d_hr·h_prev·r(1-r);   dxhr[:, I:] = d_hr·r + d_h·u
    """
    n_batch, n_hidden = h_prev.shape
    n_in = dxhr.shape[1] - n_hidden
    zero = typed(0.0, h_prev)
    one = typed(1.0, h_prev)
    db_r = d_bias_ru[:n_hidden]
    for row in range(n_batch):
        d_hr = dxhr[row, n_in:]
        dh_r, r_r, u_r, h_p = d_h[row], r[row], u[row], h_prev[row]
        dr_r = d_ru[row, :n_hidden]
        for j in range(n_hidden):
            upstream = dh_r[j] if has_d_h else zero
            gate_r = r_r[j]
            through_reset = d_hr[j]
            d_r = through_reset * h_p[j] * gate_r * (one - gate_r)
            dr_r[j] = d_r
            db_r[j] += d_r
            d_hr[j] = through_reset * gate_r + upstream * u_r[j]


@kernel
def gru_reset_after_grad_kernel(d_h, has_d_h, r, u, c, h_prev, gates_ch, addend_ch, dc_bar,
                                d_n, d_ru, dh_direct, d_bias_ru, d_bias_c):
    """The reset-after backward elementwise step in one pass.

    ``d_h [B, H]`` read only when ``has_d_h``; ``r, u, c`` the forward's outputs;
    ``gates_ch [B, H] = h_prev·W_ch`` and ``addend_ch`` (``[H]`` bias ``b_ch`` or ``[B, H]``)
    recompute n. Writes ``dc_bar, d_n, dh_direct [B, H]`` and ``d_ru [B, 2H]``; accumulates
    (``+=``) ``d_bias_ru [2H]`` and ``d_bias_c [2H]`` (``[Σ dc_bar, Σ d_n]``):

        dc_bar = d_h·(1-u)·(1-c²);  du_bar = d_h·(h_prev-c)·u(1-u);  d_n = dc_bar·r
        dr_bar = dc_bar·n·r(1-r),  n = gates_ch + addend_ch;   dh_direct = d_h·u
    """
    n_batch, n_hidden = h_prev.shape
    zero = typed(0.0, h_prev)
    one = typed(1.0, h_prev)
    db_r, db_u = d_bias_ru[:n_hidden], d_bias_ru[n_hidden:]
    db_cx, db_ch = d_bias_c[:n_hidden], d_bias_c[n_hidden:]
    for row in range(n_batch):
        dh_r, r_r, u_r, c_r, h_p = d_h[row], r[row], u[row], c[row], h_prev[row]
        g_ch, a_ch = gates_ch[row], row_of(addend_ch, row)
        dc_r, dn_r, dd_r = dc_bar[row], d_n[row], dh_direct[row]
        dr_r, du_r = d_ru[row, :n_hidden], d_ru[row, n_hidden:]
        for j in range(n_hidden):
            upstream = dh_r[j] if has_d_h else zero
            gate_r, gate_u, cand = r_r[j], u_r[j], c_r[j]
            d_c = upstream * (one - gate_u) * (one - cand * cand)
            d_u = upstream * (h_p[j] - cand) * gate_u * (one - gate_u)
            d_r = d_c * (g_ch[j] + a_ch[j]) * gate_r * (one - gate_r)
            d_nn = d_c * gate_r
            dc_r[j] = d_c
            dn_r[j] = d_nn
            dr_r[j] = d_r
            du_r[j] = d_u
            dd_r[j] = upstream * gate_u
            db_r[j] += d_r
            db_u[j] += d_u
            db_cx[j] += d_c
            db_ch[j] += d_nn
