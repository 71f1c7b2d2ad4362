"""The GRU's fused elementwise passes (Numba).

The math is ``gradcells.cells.gru.reference``. Reset before the candidate matmul (TensorFlow's
cell) needs r before the candidate's matmul, so each direction is two passes around a matmul
(``cpu.py`` does the matmuls):

    forward:   [x,h_prev]·w_ru -> gru_gates_kernel (r, u, [x, r∘h_prev])
               [x, r∘h_prev]·w_c -> gru_candidate_kernel (c, h)
    gradient:  gru_candidate_grad_kernel (dc_bar, du_bar, [x, r∘h_prev], bias sums)
               dc_bar·w_cᵀ -> gru_reset_grad_kernel (dr_bar, dh partial)
               then d[x,h_prev] = [dr_bar,du_bar]·w_ruᵀ + ..., dw_ru, dw_c by BLAS

Reset after (``reset_after=True``) has every matmul up front, so each direction is one pass:
``gru_reset_after_kernel`` and ``gru_reset_after_grad_kernel``.

Every kernel's contract is in its docstring (``cpu.py``'s sequence ops call them once per
time step). All arrays are C-contiguous and of one float dtype; B rows, H columns.
"""

from __future__ import annotations

from ...cpu._activations import sigmoid, tanh, typed
from ...cpu._compile import helper, kernel, row_of


@kernel
def gru_gates_kernel(gates_ru, addend_ru, x, h_prev, r, u, xrh):
    """Reset and update gates; writes ``r, u [B, H]`` and ``xrh [B, I+H] = [x, r∘h_prev]``.

    ``gates_ru [B, 2H]``: pre-activations without bias (``[x, h_prev]·w_ru``); ``addend_ru``:
    ``[1, 2H]`` (a cell's bias, ``_compile.one_row``) or ``[B, 2H]``; ``x [B, I]`` is copied
    into the first I columns of ``xrh`` (pass a ``[B, 0]`` array to get ``r∘h_prev`` alone):

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

    ``gates_c [B, H]``: ``[x, r∘h_prev]·w_c`` without bias; ``addend_c [1, H]`` or ``[B, H]``:

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


# --------------------------------------------------------------------------------------
# forward mode: the primal's pass (or the forward's own) and the tangent's


@kernel
def gru_gates_jvp_kernel(gates_ru, addend_ru, t_gates_ru, t_addend_ru, h_seen, t_h_seen,
                         outs, t_outs):
    """Reset before, pass 1: the gates, the reset state and their tangents.

    ``gates_ru [B, 2H] = h_seen·W_ruh`` (or ``[x, h_seen]·w_ru``), ``addend_ru`` as
    ``gru_gates_kernel`` takes it, and their tangents ``t_gates_ru``, ``t_addend_ru``;
    ``h_seen, t_h_seen [B, H]``: the state the matmuls read and its tangent; ``outs = (r,
    u, rh)``, ``t_outs = (t_r, t_u, t_rh)``, all ``[B, H]``, written:

        [r, u] = σ(gates_ru + addend_ru);  rh = r·h_seen
        [t_r, t_u] = [r(1-r), u(1-u)]·(t_gates_ru + t_addend_ru);  t_rh = t_r·h_seen + r·t_h_seen
    """
    r, u, rh = outs
    t_r, t_u, t_rh = t_outs
    n_batch, n_hidden = h_seen.shape
    one = typed(1.0, h_seen)
    for row in range(n_batch):
        g, a = gates_ru[row], row_of(addend_ru, row)
        t_g, t_a = t_gates_ru[row], row_of(t_addend_ru, row)
        h_r, t_h_r = h_seen[row], t_h_seen[row]
        r_r, u_r, rh_r = r[row], u[row], rh[row]
        t_r_r, t_u_r, t_rh_r = t_r[row], t_u[row], t_rh[row]
        for j in range(n_hidden):
            k = n_hidden + j
            gate_r = sigmoid(g[j] + a[j])
            gate_u = sigmoid(g[k] + a[k])
            r_r[j] = gate_r
            u_r[j] = gate_u
            rh_r[j] = gate_r * h_r[j]
            t_gate_r = gate_r * (one - gate_r) * (t_g[j] + t_a[j])
            t_r_r[j] = t_gate_r
            t_u_r[j] = gate_u * (one - gate_u) * (t_g[k] + t_a[k])
            t_rh_r[j] = t_gate_r * h_r[j] + gate_r * t_h_r[j]


@kernel
def gru_candidate_jvp_kernel(gates_c, addend_c, t_gates_c, t_addend_c, h_prev, t_h_prev, u,
                             t_u, outs, t_outs):
    """Reset before, pass 2: the candidate, the new state and their tangents.

    ``gates_c [B, H] = (r∘h_seen)·W_ch`` (or ``[x, r∘h_seen]·w_c``), ``addend_c`` as
    ``gru_candidate_kernel`` takes it, and their tangents ``t_gates_c``, ``t_addend_c``;
    ``h_prev, t_h_prev``: the state the update interpolates and its tangent; ``u, t_u``
    from pass 1; ``outs = (c, h)``, ``t_outs = (t_c, t_h)``, all ``[B, H]``, written:

        c = tanh(gates_c + addend_c);   h = u·h_prev + (1-u)·c
        t_c = (1-c²)·(t_gates_c + t_addend_c);  t_h = t_u·(h_prev - c) + u·t_h_prev + (1-u)·t_c
    """
    c, h = outs
    t_c, t_h = t_outs
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    for row in range(n_batch):
        g, a = gates_c[row], row_of(addend_c, row)
        t_g, t_a = t_gates_c[row], row_of(t_addend_c, row)
        h_p, t_h_p, u_r, t_u_r = h_prev[row], t_h_prev[row], u[row], t_u[row]
        c_r, h_r, t_c_r, t_h_r = c[row], h[row], t_c[row], t_h[row]
        for j in range(n_hidden):
            cand = tanh(g[j] + a[j])
            gate_u = u_r[j]
            c_r[j] = cand
            h_r[j] = gate_u * h_p[j] + (one - gate_u) * cand
            t_cand = (one - cand * cand) * (t_g[j] + t_a[j])
            t_c_r[j] = t_cand
            t_h_r[j] = t_u_r[j] * (h_p[j] - cand) + gate_u * t_h_p[j] + (one - gate_u) * t_cand



@kernel
def gru_reset_after_tangent_kernel(t_ru, t_cx, t_ch, g_ch, a_ch, r, u, c, h_prev, t_h_prev,
                                   t_r, t_u, t_c, t_h):
    """The reset-after GRU step's tangent, from the primal ``gru_reset_after_kernel``
    wrote; writes ``t_r, t_u, t_c, t_h [B, H]``.

    ``t_ru [B, 2H]``, ``t_cx [B, H]``, ``t_ch [B, H]``: the tangents of the pre-activations
    ``[x, h_seen]·w_ru + b_ru``, ``x·W_cx + b_cx`` and ``n = h_seen·W_ch + b_ch``;
    ``g_ch [B, H]`` and ``a_ch`` (``[H]`` or ``[B, H]``): n's two parts as the forward
    kernel added them; ``r, u, c [B, H]``: the primal; ``h_prev, t_h_prev``: the state the
    update interpolates and its tangent:

        [t_r, t_u] = [r(1-r), u(1-u)]·t_ru;   t_c = (1-c²)·(t_cx + t_r·n + r·t_ch)
        t_h = t_u·(h_prev - c) + u·t_h_prev + (1-u)·t_c
    """
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    for row in range(n_batch):
        t_pre = t_ru[row]
        t_pre_r, t_pre_u = t_pre[:n_hidden], t_pre[n_hidden:]
        t_cx_r, t_ch_r, g_r, a_r = t_cx[row], t_ch[row], g_ch[row], row_of(a_ch, row)
        r_r, u_r, c_r, h_p, t_h_p = r[row], u[row], c[row], h_prev[row], t_h_prev[row]
        t_r_r, t_u_r, t_c_r, t_h_r = t_r[row], t_u[row], t_c[row], t_h[row]
        for j in range(n_hidden):
            gate_r, gate_u, cand = r_r[j], u_r[j], c_r[j]
            t_gate_r = gate_r * (one - gate_r) * t_pre_r[j]
            t_gate_u = gate_u * (one - gate_u) * t_pre_u[j]
            t_cand = (one - cand * cand) * (t_cx_r[j] + t_gate_r * (g_r[j] + a_r[j])
                                            + gate_r * t_ch_r[j])
            t_r_r[j] = t_gate_r
            t_u_r[j] = t_gate_u
            t_c_r[j] = t_cand
            t_h_r[j] = t_gate_u * (h_p[j] - cand) + gate_u * t_h_p[j] + (one - gate_u) * t_cand


# --------------------------------------------------------------------------------------
# second order: the tangents of the backward kernel's gate gradients


@helper
def _update_tangents(g, t_g, gate_u, cand, t_gate_u, t_cand, h_p, t_h_p, one):
    """The tangents ``(t_dc_bar, t_du_bar)`` of ``dc_bar = g(1-u)(1-c²)`` and ``du_bar =
    g(h_prev-c)u(1-u)``, one element (both GRU variants' kernels; LLVM inlines it; ``one``:
    1 in the arrays' dtype; ``t_`` the tangents):

        t_dc_bar = t_g(1-u)(1-c²) - g·t_u(1-c²) - g(1-u)·2c·t_c
        t_du_bar = [t_g(h_prev-c) + g(t_h_prev-t_c)]·u(1-u) + g(h_prev-c)·(t_u(1-u) - u·t_u)
    """
    two = one + one
    tanh_d = one - cand * cand
    t_dc = (t_g * (one - gate_u) * tanh_d - g * t_gate_u * tanh_d
            - g * (one - gate_u) * (two * cand * t_cand))
    diff = h_p - cand
    t_du = ((t_g * diff + g * (t_h_p - t_cand)) * (gate_u * (one - gate_u))
            + g * diff * (t_gate_u * (one - gate_u) - gate_u * t_gate_u))
    return t_dc, t_du


@kernel
def gru_reset_after_grad_tangent_kernel(up, t_up, outs, t_outs, states, n_parts, t_n_pre,
                                        grads, t_grads, t_sums):
    """The tangent of ``gru_reset_after_grad_kernel``'s step.

    ``up, t_up [B, H]``: the step's gradient and its tangent; ``outs = (r, u, c)`` the
    saved gates and ``t_outs = (t_r, t_u, t_c)`` their tangents; ``states = (h_prev,
    t_h_prev)``: the state the update interpolates and its tangent; ``n_parts = (gates_ch,
    addend_ch)``: n = h_seen·W_ch + b_ch as the backward kernel added it, ``t_n_pre [B, H]``
    its tangent; ``grads = (dc_bar, d_n)``: the backward kernel's. Writes ``t_grads =
    (t_dc_bar, t_d_n [B, H], t_d_ru [B, 2H], t_direct [B, H])`` and accumulates ``t_sums =
    (t_db_ru [2H], t_db_c [2H])``:

        t_dc_bar, t_du_bar = _update_tangents's, with g = up
        t_dr_bar = t_dc_bar·n·r(1-r) + dc_bar·t_n·r(1-r) + dc_bar·n·(t_r(1-r) - r·t_r)
        t_d_n = t_dc_bar·r + dc_bar·t_r;   t_direct = t_up·u + up·t_u
    """
    r, u, c = outs
    t_r, t_u, t_c = t_outs
    h_prev, t_h_prev = states
    gates_ch, addend_ch = n_parts
    dc_bar, d_n = grads
    t_dc_bar, t_d_n, t_d_ru, t_direct = t_grads
    t_db_ru, t_db_c = t_sums
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    t_db_r, t_db_u = t_db_ru[:n_hidden], t_db_ru[n_hidden:]
    t_db_cx, t_db_ch = t_db_c[:n_hidden], t_db_c[n_hidden:]
    for row in range(n_batch):
        up_r, t_up_r, h_p, t_h_p = up[row], t_up[row], h_prev[row], t_h_prev[row]
        r_r, u_r, c_r, t_r_r, t_u_r, t_c_r = r[row], u[row], c[row], t_r[row], t_u[row], t_c[row]
        g_ch, a_ch, t_n_pre_r = gates_ch[row], row_of(addend_ch, row), t_n_pre[row]
        dcb_r, t_dcb_r, t_dn_r, t_dir_r = dc_bar[row], t_dc_bar[row], t_d_n[row], t_direct[row]
        t_dr_r, t_du_r = t_d_ru[row, :n_hidden], t_d_ru[row, n_hidden:]
        for j in range(n_hidden):        # two loops: fewer streams each, so both vectorize
            g, t_g, gate_u = up_r[j], t_up_r[j], u_r[j]
            t_dc, t_du = _update_tangents(g, t_g, gate_u, c_r[j], t_u_r[j], t_c_r[j], h_p[j],
                                          t_h_p[j], one)
            t_dcb_r[j] = t_dc
            t_du_r[j] = t_du
            t_dir_r[j] = t_g * gate_u + g * t_u_r[j]
            t_db_u[j] += t_du
            t_db_cx[j] += t_dc
        for j in range(n_hidden):
            gate_r, t_gate_r, t_dc, d_c = r_r[j], t_r_r[j], t_dcb_r[j], dcb_r[j]
            n = g_ch[j] + a_ch[j]
            sig_r = gate_r * (one - gate_r)
            t_dr = (t_dc * n * sig_r + d_c * t_n_pre_r[j] * sig_r
                    + d_c * n * (t_gate_r * (one - gate_r) - gate_r * t_gate_r))
            t_dn = t_dc * gate_r + d_c * t_gate_r
            t_dn_r[j] = t_dn
            t_dr_r[j] = t_dr
            t_db_r[j] += t_dr
            t_db_ch[j] += t_dn


@kernel
def gru_candidate_grad_tangent_kernel(up, t_up, outs, t_outs, states, t_grads, t_sums):
    """Reset before, pass 1: the tangent of ``gru_candidate_grad_kernel``'s step.

    ``up, t_up [B, H]``, ``outs = (r, u, c)``, ``t_outs = (t_r, t_u, t_c)``, ``states =
    (h_prev, t_h_prev)`` as ``gru_reset_after_grad_tangent_kernel`` takes them. Writes
    ``t_grads = (t_dc_bar [B, H], t_d_ru [B, 2H] (its right half t_du_bar), t_rh [B, H])``
    and accumulates ``t_sums = (t_db_ru [2H] (its right half), t_db_c [H])``:

        t_dc_bar, t_du_bar as the reset-after kernel's;   t_rh = t_r·h_prev + r·t_h_prev
    """
    r, u, c = outs
    t_r, t_u, t_c = t_outs
    h_prev, t_h_prev = states
    t_dc_bar, t_d_ru, t_rh = t_grads
    t_db_ru, t_db_c = t_sums
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    t_db_u = t_db_ru[n_hidden:]
    for row in range(n_batch):
        up_r, t_up_r, h_p, t_h_p = up[row], t_up[row], h_prev[row], t_h_prev[row]
        r_r, u_r, c_r, t_r_r, t_u_r, t_c_r = r[row], u[row], c[row], t_r[row], t_u[row], t_c[row]
        t_dcb_r, t_du_r, t_rh_r = t_dc_bar[row], t_d_ru[row, n_hidden:], t_rh[row]
        for j in range(n_hidden):
            t_dc, t_du = _update_tangents(up_r[j], t_up_r[j], u_r[j], c_r[j], t_u_r[j],
                                          t_c_r[j], h_p[j], t_h_p[j], one)
            t_dcb_r[j] = t_dc
            t_du_r[j] = t_du
            t_rh_r[j] = t_r_r[j] * h_p[j] + r_r[j] * t_h_p[j]
            t_db_c[j] += t_dc
            t_db_u[j] += t_du


@kernel
def gru_reset_grad_tangent_kernel(d_hr, t_d_hr, up, t_up, outs, t_outs, states, t_d_ru,
                                  t_d_bias_ru):
    """Reset before, pass 2: the tangent of ``gru_reset_grad_kernel``'s step, run before
    it (which overwrites ``d_hr``).

    ``d_hr [B, H]``: ``(dc_bar·W_chᵀ)∘m_rec`` as that kernel reads it; ``t_d_hr [B, H]``:
    its tangent, **overwritten in place** with t_direct; ``up, t_up``, ``outs = (r, u)``,
    ``t_outs = (t_r, t_u)``, ``states = (h_prev, t_h_prev)`` as the other kernels take
    them. Writes the left half ``t_dr_bar`` of ``t_d_ru [B, 2H]`` and accumulates (``+=``)
    the left half of ``t_d_bias_ru [2H]``:

        t_dr_bar = [t_d_hr·h_prev + d_hr·t_h_prev]·r(1-r) + d_hr·h_prev·(t_r(1-r) - r·t_r)
        t_direct = t_d_hr·r + d_hr·t_r + t_up·u + up·t_u
    """
    r, u = outs
    t_r, t_u = t_outs
    h_prev, t_h_prev = states
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    t_db_r = t_d_bias_ru[:n_hidden]
    for row in range(n_batch):
        a_r, t_a_r, up_r, t_up_r = d_hr[row], t_d_hr[row], up[row], t_up[row]
        r_r, u_r, t_r_r, t_u_r = r[row], u[row], t_r[row], t_u[row]
        h_p, t_h_p, t_dr_r = h_prev[row], t_h_prev[row], t_d_ru[row, :n_hidden]
        for j in range(n_hidden):
            gate_r, t_gate_r, a, t_a = r_r[j], t_r_r[j], a_r[j], t_a_r[j]
            t_dr = ((t_a * h_p[j] + a * t_h_p[j]) * (gate_r * (one - gate_r))
                    + a * h_p[j] * (t_gate_r * (one - gate_r) - gate_r * t_gate_r))
            t_dr_r[j] = t_dr
            t_db_r[j] += t_dr
            t_a_r[j] = t_a * gate_r + a * t_gate_r + t_up_r[j] * u_r[j] + up_r[j] * t_u_r[j]


# --------------------------------------------------------------------------------------
# the gates' own upstream gradients (docs/spec.md §16.1): a pass after the step's backward
# kernels, run only when one is given (the kernels above are as they were without them)


@kernel
def gru_gates_grad_kernel(gates, has, stopped, outs, n_parts, reset_after, grads, sums):
    """Adds the gates' own upstream gradients to one step's gate gradients, after the
    step's backward kernel (reset before: after ``gru_candidate_grad_kernel`` for ``d_u``
    and ``d_c``, after ``gru_reset_grad_kernel`` for ``d_r``, which it overwrites).

    ``gates = (d_r, d_u, d_c)``, each ``[B, H]``, read only where its flag in ``has`` is
    set (else any ``[B, H]`` array) and only in running rows (``stopped [B]``: True past a
    row's length; ``[0]``: every row runs); ``outs = (r, u, c)``; ``n_parts = (gates_ch,
    addend_ch)``, n = gates_ch + addend_ch as the backward kernel read it (reset after;
    before, any arrays). Adds (``+=``) to ``grads = (d_ru [B, 2H], dc_bar [B, H], d_n
    [B, H])`` (d_n reset after only) and to ``sums = (d_bias_ru [2H], d_bias_c)``:

        e_c = d_c·(1-c²);   dc_bar += e_c;   du_bar += d_u·u(1-u)
        dr_bar += d_r·r(1-r);  reset after also dr_bar += e_c·n·r(1-r), d_n += e_c·r
    """
    d_r, d_u, d_c = gates
    has_r, has_u, has_c = has
    r, u, c = outs
    gates_ch, addend_ch = n_parts
    d_ru, dc_bar, d_n = grads
    d_bias_ru, d_bias_c = sums
    n_batch, n_hidden = r.shape
    zero = typed(0.0, r)
    one = typed(1.0, r)
    db_r, db_u = d_bias_ru[:n_hidden], d_bias_ru[n_hidden:]
    db_c, db_n = d_bias_c[:n_hidden], d_bias_c[n_hidden:]
    for row in range(n_batch):
        if stopped.shape[0] > 0 and stopped[row]:
            continue
        dr_in, du_in, dc_in = d_r[row], d_u[row], d_c[row]
        r_r, u_r, c_r = r[row], u[row], c[row]
        dr_r, du_r, dc_r = d_ru[row, :n_hidden], d_ru[row, n_hidden:], dc_bar[row]
        for j in range(n_hidden):
            gate_r, gate_u, cand = r_r[j], u_r[j], c_r[j]
            e_c = dc_in[j] * (one - cand * cand) if has_c else zero
            e_u = du_in[j] * gate_u * (one - gate_u) if has_u else zero
            e_r = dr_in[j] if has_r else zero
            if reset_after:
                e_r += e_c * (gates_ch[row, j] + row_of(addend_ch, row)[j])
                d_nn = e_c * gate_r
                d_n[row, j] += d_nn
                db_n[j] += d_nn
            e_r = e_r * gate_r * (one - gate_r)
            dc_r[j] += e_c
            du_r[j] += e_u
            dr_r[j] += e_r
            db_c[j] += e_c
            db_u[j] += e_u
            db_r[j] += e_r


@kernel
def gru_gates_grad_tangent_kernel(gates, t_gates, has, stopped, outs, t_outs, n_parts,
                                  t_n_pre, reset_after, t_grads, t_sums):
    """The tangent of ``gru_gates_grad_kernel``'s additions, added (``+=``) to the tangents
    ``t_grads = (t_d_ru, t_dc_bar, t_d_n)`` and ``t_sums = (t_d_bias_ru, t_d_bias_c)``
    (after the step's tangent kernels, where ``gru_gates_grad_kernel`` runs after the
    gradient's). ``t_gates = (t_d_r, t_d_u, t_d_c)``: the upstream gradients' tangents, read
    with ``gates`` where ``has`` is set (a missing one of a pair: zeros); ``t_outs = (t_r,
    t_u, t_c)``; ``t_n_pre [B, H]``: n's tangent (reset after); the rest as there. With
    s = r(1-r), p = u(1-u) and their tangents s' = r'(1-2r), p' = u'(1-2u):

        e_c' = d_c'·(1-c²) - 2·d_c·c·c';   dc_bar' += e_c';   du_bar' += d_u'·p + d_u·p'
        dr_bar' += d_r'·s + d_r·s';  reset after also
            dr_bar' += (e_c'·n + e_c·n')·s + e_c·n·s',   d_n' += e_c'·r + e_c·r'
    """
    d_r, d_u, d_c = gates
    t_d_r, t_d_u, t_d_c = t_gates
    has_r, has_u, has_c = has
    r, u, c = outs
    t_r, t_u, t_c = t_outs
    gates_ch, addend_ch = n_parts
    t_d_ru, t_dc_bar, t_d_n = t_grads
    t_bias_ru, t_bias_c = t_sums
    n_batch, n_hidden = r.shape
    zero = typed(0.0, r)
    one = typed(1.0, r)
    two = one + one
    t_db_r, t_db_u = t_bias_ru[:n_hidden], t_bias_ru[n_hidden:]
    t_db_c, t_db_n = t_bias_c[:n_hidden], t_bias_c[n_hidden:]
    for row in range(n_batch):
        if stopped.shape[0] > 0 and stopped[row]:
            continue
        for j in range(n_hidden):
            gate_r, gate_u, cand = r[row, j], u[row, j], c[row, j]
            t_gate_r = t_r[row, j]
            e_c, t_e_c, t_e_u, e_r, t_e_r = zero, zero, zero, zero, zero
            if has_c:
                e_c = d_c[row, j] * (one - cand * cand)
                t_e_c = (t_d_c[row, j] * (one - cand * cand)
                         - two * d_c[row, j] * cand * t_c[row, j])
            if has_u:
                t_e_u = (t_d_u[row, j] * gate_u * (one - gate_u)
                         + d_u[row, j] * t_u[row, j] * (one - two * gate_u))
            if has_r:
                e_r = d_r[row, j]
                t_e_r = t_d_r[row, j]
            if reset_after:
                n = gates_ch[row, j] + row_of(addend_ch, row)[j]
                e_r += e_c * n
                t_e_r += t_e_c * n + e_c * t_n_pre[row, j]
                t_dn = t_e_c * gate_r + e_c * t_gate_r
                t_d_n[row, j] += t_dn
                t_db_n[j] += t_dn
            t_dr = t_e_r * gate_r * (one - gate_r) + e_r * t_gate_r * (one - two * gate_r)
            t_dc_bar[row, j] += t_e_c
            t_d_ru[row, n_hidden + j] += t_e_u
            t_d_ru[row, j] += t_dr
            t_db_c[j] += t_e_c
            t_db_u[j] += t_e_u
            t_db_r[j] += t_dr
