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


# --------------------------------------------------------------------------------------
# forward mode: the primal's pass (or the forward's own) and the tangent's


@kernel
def gru_gates_jvp_kernel(gates_ru, addend_ru, d_gates_ru, d_addend_ru, h_seen, dh_seen,
                         outs, d_outs):
    """Reset before, pass 1: the gates, the reset state and their tangents.

    ``gates_ru [B, 2H] = h_seen·W_ruh`` (or ``[x, h_seen]·w_ru``), ``addend_ru`` as
    ``gru_gates_kernel`` takes it, and their tangents; ``h_seen, dh_seen [B, H]``: the state
    the matmuls read and its tangent; ``outs = (r, u, rh)``, ``d_outs = (dr, du, d_rh)``,
    all ``[B, H]``, written:

        [r, u] = σ(gates_ru + addend_ru);  rh = r·h_seen
        [dr, du] = [r(1-r), u(1-u)]·(d_gates_ru + d_addend_ru);  d_rh = dr·h_seen + r·dh_seen
    """
    r, u, rh = outs
    dr, du, d_rh = d_outs
    n_batch, n_hidden = h_seen.shape
    one = typed(1.0, h_seen)
    for row in range(n_batch):
        g, a = gates_ru[row], row_of(addend_ru, row)
        dg, da = d_gates_ru[row], row_of(d_addend_ru, row)
        h_r, dh_r = h_seen[row], dh_seen[row]
        r_r, u_r, rh_r, dr_r, du_r, drh_r = r[row], u[row], rh[row], dr[row], du[row], d_rh[row]
        for j in range(n_hidden):
            k = n_hidden + j
            gate_r = sigmoid(g[j] + a[j])
            gate_u = sigmoid(g[k] + a[k])
            r_r[j] = gate_r
            u_r[j] = gate_u
            rh_r[j] = gate_r * h_r[j]
            d_r = gate_r * (one - gate_r) * (dg[j] + da[j])
            dr_r[j] = d_r
            du_r[j] = gate_u * (one - gate_u) * (dg[k] + da[k])
            drh_r[j] = d_r * h_r[j] + gate_r * dh_r[j]


@kernel
def gru_candidate_jvp_kernel(gates_c, addend_c, d_gates_c, d_addend_c, h_prev, dh_prev, u,
                             du, outs, d_outs):
    """Reset before, pass 2: the candidate, the new state and their tangents.

    ``gates_c [B, H] = (r∘h_seen)·W_ch`` (or ``[x, r∘h_seen]·w_c``), ``addend_c`` as
    ``gru_candidate_kernel`` takes it, and their tangents; ``h_prev, dh_prev``: the state
    the update interpolates and its tangent; ``u, du`` from pass 1; ``outs = (c, h)``,
    ``d_outs = (dc, dh)``, all ``[B, H]``, written:

        c = tanh(gates_c + addend_c);   h = u·h_prev + (1-u)·c
        dc = (1-c²)·(d_gates_c + d_addend_c);  dh = du·(h_prev - c) + u·dh_prev + (1-u)·dc
    """
    c, h = outs
    dc, dh = d_outs
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    for row in range(n_batch):
        g, a = gates_c[row], row_of(addend_c, row)
        dg, da = d_gates_c[row], row_of(d_addend_c, row)
        h_p, dh_p, u_r, du_r = h_prev[row], dh_prev[row], u[row], du[row]
        c_r, h_r, dc_r, dh_r = c[row], h[row], dc[row], dh[row]
        for j in range(n_hidden):
            cand = tanh(g[j] + a[j])
            gate_u = u_r[j]
            c_r[j] = cand
            h_r[j] = gate_u * h_p[j] + (one - gate_u) * cand
            d_c = (one - cand * cand) * (dg[j] + da[j])
            dc_r[j] = d_c
            dh_r[j] = du_r[j] * (h_p[j] - cand) + gate_u * dh_p[j] + (one - gate_u) * d_c



@kernel
def gru_reset_after_tangent_kernel(d_ru, d_cx, d_ch, g_ch, a_ch, r, u, c, h_prev, dh_prev, dr,
                                   du, dc, dh):
    """The reset-after GRU step's tangent, from the primal ``gru_reset_after_kernel``
    wrote; writes ``dr, du, dc, dh [B, H]``.

    ``d_ru [B, 2H]``, ``d_cx [B, H]``, ``d_ch [B, H]``: the tangents of the pre-activations
    ``[x, h_seen]·w_ru + b_ru``, ``x·W_cx + b_cx`` and ``n = h_seen·W_ch + b_ch``;
    ``g_ch [B, H]`` and ``a_ch`` (``[H]`` or ``[B, H]``): n's two parts as the forward
    kernel added them; ``r, u, c [B, H]``: the primal; ``h_prev, dh_prev``: the state the
    update interpolates and its tangent:

        [dr, du] = [r(1-r), u(1-u)]·d_ru;   dc = (1-c²)·(d_cx + dr·n + r·d_ch)
        dh = du·(h_prev - c) + u·dh_prev + (1-u)·dc
    """
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    for row in range(n_batch):
        d_gates = d_ru[row]
        d_r, d_u = d_gates[:n_hidden], d_gates[n_hidden:]
        dx_r, dn_r, g_r, a_r = d_cx[row], d_ch[row], g_ch[row], row_of(a_ch, row)
        r_r, u_r, c_r, h_p, dh_p = r[row], u[row], c[row], h_prev[row], dh_prev[row]
        dr_r, du_r, dc_r, dh_r = dr[row], du[row], dc[row], dh[row]
        for j in range(n_hidden):
            gate_r, gate_u, cand = r_r[j], u_r[j], c_r[j]
            d_gate_r = gate_r * (one - gate_r) * d_r[j]
            d_gate_u = gate_u * (one - gate_u) * d_u[j]
            d_cand = (one - cand * cand) * (dx_r[j] + d_gate_r * (g_r[j] + a_r[j])
                                            + gate_r * dn_r[j])
            dr_r[j] = d_gate_r
            du_r[j] = d_gate_u
            dc_r[j] = d_cand
            dh_r[j] = d_gate_u * (h_p[j] - cand) + gate_u * dh_p[j] + (one - gate_u) * d_cand


# --------------------------------------------------------------------------------------
# second order: the tangents of the backward kernel's gate gradients


@helper
def _update_tangents(g, dg, gate_u, cand, d_gate_u, d_cand, h_p, dh_p, one):
    """The tangents ``(dc_bar', du_bar')`` of ``dc_bar = g(1-u)(1-c²)`` and ``du_bar =
    g(h_prev-c)u(1-u)``, one element (both GRU variants' kernels; LLVM inlines it; ``one``:
    1 in the arrays' dtype):

        dc_bar' = g'(1-u)(1-c²) - g·u'(1-c²) - g(1-u)·2c·c'
        du_bar' = [g'(h_prev-c) + g(h_prev'-c')]·u(1-u) + g(h_prev-c)·(u'(1-u) - u·u')
    """
    two = one + one
    tanh_d = one - cand * cand
    dd_c = (dg * (one - gate_u) * tanh_d - g * d_gate_u * tanh_d
            - g * (one - gate_u) * (two * cand * d_cand))
    diff = h_p - cand
    dd_u = ((dg * diff + g * (dh_p - d_cand)) * (gate_u * (one - gate_u))
            + g * diff * (d_gate_u * (one - gate_u) - gate_u * d_gate_u))
    return dd_c, dd_u


@kernel
def gru_reset_after_grad_tangent_kernel(up, d_up, outs, d_outs, states, n_parts, d_n_pre,
                                        grads, d_grads, d_sums):
    """The tangent of ``gru_reset_after_grad_kernel``'s step.

    ``up, d_up [B, H]``: the step's gradient and its tangent; ``outs = (r, u, c)`` the
    saved gates and ``d_outs = (dr, du, dc)`` their tangents; ``states = (h_prev,
    dh_prev)``: the state the update interpolates and its tangent; ``n_parts = (gates_ch,
    addend_ch)``: n = h_seen·W_ch + b_ch as the backward kernel added it, ``d_n_pre [B, H]``
    its tangent; ``grads = (dc_bar, d_n)``: the backward kernel's. Writes ``d_grads =
    (dc_bar', d_n' [B, H], d_ru' [B, 2H], direct' [B, H])`` and accumulates ``d_sums =
    (db_ru' [2H], db_c' [2H])``:

        dc_bar', du_bar' = _update_tangents's, with g = up
        dr_bar' = dc_bar'·n·r(1-r) + dc_bar·n'·r(1-r) + dc_bar·n·(r'(1-r) - r·r')
        d_n' = dc_bar'·r + dc_bar·r';   direct' = up'·u + up·u'
    """
    r, u, c = outs
    dr, du, dc = d_outs
    h_prev, dh_prev = states
    gates_ch, addend_ch = n_parts
    dc_bar, d_n = grads
    ddc_bar, dd_n, dd_ru, d_direct = d_grads
    db_ru, db_c = d_sums
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    db_r, db_u = db_ru[:n_hidden], db_ru[n_hidden:]
    db_cx, db_ch = db_c[:n_hidden], db_c[n_hidden:]
    for row in range(n_batch):
        up_r, dup_r, h_p, dh_p = up[row], d_up[row], h_prev[row], dh_prev[row]
        r_r, u_r, c_r, dr_r, du_r, dc_r = r[row], u[row], c[row], dr[row], du[row], dc[row]
        g_ch, a_ch, dn_pre = gates_ch[row], row_of(addend_ch, row), d_n_pre[row]
        dcb_r, ddcb_r, ddn_r, ddir_r = dc_bar[row], ddc_bar[row], dd_n[row], d_direct[row]
        ddr_r, ddu_r = dd_ru[row, :n_hidden], dd_ru[row, n_hidden:]
        for j in range(n_hidden):        # two loops: fewer streams each, so both vectorize
            g, dg, gate_u = up_r[j], dup_r[j], u_r[j]
            dd_c, dd_u = _update_tangents(g, dg, gate_u, c_r[j], du_r[j], dc_r[j], h_p[j],
                                          dh_p[j], one)
            ddcb_r[j] = dd_c
            ddu_r[j] = dd_u
            ddir_r[j] = dg * gate_u + g * du_r[j]
            db_u[j] += dd_u
            db_cx[j] += dd_c
        for j in range(n_hidden):
            gate_r, d_gate_r, dd_c, d_c = r_r[j], dr_r[j], ddcb_r[j], dcb_r[j]
            n = g_ch[j] + a_ch[j]
            sig_r = gate_r * (one - gate_r)
            dd_r = (dd_c * n * sig_r + d_c * dn_pre[j] * sig_r
                    + d_c * n * (d_gate_r * (one - gate_r) - gate_r * d_gate_r))
            dd_nn = dd_c * gate_r + d_c * d_gate_r
            ddn_r[j] = dd_nn
            ddr_r[j] = dd_r
            db_r[j] += dd_r
            db_ch[j] += dd_nn


@kernel
def gru_candidate_grad_tangent_kernel(up, d_up, outs, d_outs, states, d_grads, d_sums):
    """Reset before, pass 1: the tangent of ``gru_candidate_grad_kernel``'s step.

    ``up, d_up [B, H]``, ``outs = (r, u, c)``, ``d_outs = (dr, du, dc)``, ``states =
    (h_prev, dh_prev)`` as ``gru_reset_after_grad_tangent_kernel`` takes them. Writes
    ``d_grads = (dc_bar' [B, H], d_ru' [B, 2H] (its right half du_bar'), d_rh' [B, H])`` and
    accumulates ``d_sums = (db_ru' [2H] (its right half), db_c' [H])``:

        dc_bar', du_bar' as the reset-after kernel's;   d_rh' = r'·h_prev + r·h_prev'
    """
    r, u, c = outs
    dr, du, dc = d_outs
    h_prev, dh_prev = states
    ddc_bar, dd_ru, d_rh = d_grads
    db_ru, db_c = d_sums
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    db_u = db_ru[n_hidden:]
    for row in range(n_batch):
        up_r, dup_r, h_p, dh_p = up[row], d_up[row], h_prev[row], dh_prev[row]
        r_r, u_r, c_r, dr_r, du_r, dc_r = r[row], u[row], c[row], dr[row], du[row], dc[row]
        ddcb_r, ddu_r, drh_r = ddc_bar[row], dd_ru[row, n_hidden:], d_rh[row]
        for j in range(n_hidden):
            dd_c, dd_u = _update_tangents(up_r[j], dup_r[j], u_r[j], c_r[j], du_r[j], dc_r[j],
                                          h_p[j], dh_p[j], one)
            ddcb_r[j] = dd_c
            ddu_r[j] = dd_u
            drh_r[j] = dr_r[j] * h_p[j] + r_r[j] * dh_p[j]
            db_c[j] += dd_c
            db_u[j] += dd_u


@kernel
def gru_reset_grad_tangent_kernel(d_hr, dd_hr, up, d_up, outs, d_outs, states, dd_ru,
                                  d_bias_ru):
    """Reset before, pass 2: the tangent of ``gru_reset_grad_kernel``'s step, run before
    it (which overwrites ``d_hr``).

    ``d_hr [B, H]``: ``(dc_bar·W_chᵀ)∘m_rec`` as that kernel reads it; ``dd_hr [B, H]``: its
    tangent, **overwritten in place** with direct'; ``up, d_up``, ``outs = (r, u)``,
    ``d_outs = (dr, du)``, ``states = (h_prev, dh_prev)`` as the other kernels take them.
    Writes the left half ``dr_bar'`` of ``dd_ru [B, 2H]`` and accumulates (``+=``) the left
    half of ``d_bias_ru [2H]``:

        dr_bar' = [d_hr'·h_prev + d_hr·h_prev']·r(1-r) + d_hr·h_prev·(r'(1-r) - r·r')
        direct' = d_hr'·r + d_hr·r' + up'·u + up·u'
    """
    r, u = outs
    dr, du = d_outs
    h_prev, dh_prev = states
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    db_r = d_bias_ru[:n_hidden]
    for row in range(n_batch):
        a_r, da_r, up_r, dup_r = d_hr[row], dd_hr[row], up[row], d_up[row]
        r_r, u_r, dr_r, du_r = r[row], u[row], dr[row], du[row]
        h_p, dh_p, ddr_r = h_prev[row], dh_prev[row], dd_ru[row, :n_hidden]
        for j in range(n_hidden):
            gate_r, d_gate_r, a, da = r_r[j], dr_r[j], a_r[j], da_r[j]
            dd_r = ((da * h_p[j] + a * dh_p[j]) * (gate_r * (one - gate_r))
                    + a * h_p[j] * (d_gate_r * (one - gate_r) - gate_r * d_gate_r))
            ddr_r[j] = dd_r
            db_r[j] += dd_r
            da_r[j] = da * gate_r + a * d_gate_r + dup_r[j] * u_r[j] + up_r[j] * du_r[j]
