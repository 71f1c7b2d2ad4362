"""The fused elementwise passes of forward mode (docs/spec.md §12; Numba): each computes a
cell step's elementwise primal exactly as the forward's kernel does, and its tangent in the
same pass.

The math is the reference's "Forward mode" sections (``gradcells.reference.rnn``,
``gradcells.reference.gru``). ``_jvp.py`` calls them around its BLAS matmuls, once per time
step (a cell is a sequence of one step):

    rnn_jvp_kernel                 h = act(z), dh = act'(z)∘dz
    gru_reset_after_jvp_kernel     r, u, c, h and their tangents, one pass
    gru_gates_jvp_kernel           reset before, pass 1: r, u, r∘h_seen and tangents
    gru_candidate_jvp_kernel       reset before, pass 2: c, h and tangents

Each primal expression is the forward kernel's, term for term (``_rnn_kernels``,
``_gru_kernels``), so a sequence's primal is bitwise the forward's. Derivatives are read
from the outputs as the gradients read them: σ' = s(1-s), tanh' = 1 - t², relu' = [h > 0].

All arrays C-contiguous, one float dtype; B rows, H = the state's width. An ``addend`` is a
bias ``[N]`` (broadcast over rows) or a per-row ``[B, N]`` array (``row_of``); a
``d_``-prefixed argument is its primal's tangent, laid out the same way. Outputs are
overwritten and must not overlap the inputs.
"""

from __future__ import annotations

from ._activations import sigmoid, tanh, typed
from ._compile import kernel, row_of


@kernel
def rnn_jvp_kernel(gates, addend, d_gates, d_addend, relu, h, dh):
    """The RNN step and its tangent; writes ``h, dh [B, H]``.

    ``gates [B, H]`` (e.g. ``h_prev·W_h``), ``addend`` (``x·W_x + b`` or ``b``) and their
    tangents ``d_gates [B, H]``, ``d_addend``; ``relu``: True for relu, False for tanh:

        z = gates + addend;   h = act(z)
        dh = (d_gates + d_addend)·(1 - h²)      tanh
        dh = (d_gates + d_addend)·[h > 0]       relu (relu'(0) = 0; NaN gives 0·dz)
    """
    n_batch, n_hidden = h.shape
    zero = typed(0.0, h)
    one = typed(1.0, h)
    for row in range(n_batch):
        g, a, h_r = gates[row], row_of(addend, row), h[row]
        dg, da, dh_r = d_gates[row], row_of(d_addend, row), dh[row]
        if relu:
            for j in range(n_hidden):
                z = g[j] + a[j]
                out = zero if z < zero else z
                h_r[j] = out
                dh_r[j] = (dg[j] + da[j]) * (one if out > zero else zero)
        else:
            for j in range(n_hidden):
                out = tanh(g[j] + a[j])
                h_r[j] = out
                dh_r[j] = (dg[j] + da[j]) * (one - out * out)


@kernel
def gru_reset_after_jvp_kernel(gates, addends, tangents, h_prev, dh_prev, outs, d_outs):
    """The reset-after GRU step and its tangent in one pass.

    ``gates = (g_ru [B, 2H], g_cx [B, H], g_ch [B, H])``: ``h_seen·W_ruh``, ``x·W_cx`` (or
    a step's slice of it), ``h_seen·W_ch``; ``addends = (a_ru, a_cx, a_ch)``: what
    ``gru_reset_after_kernel`` adds to each (biases or per-row projections); ``tangents``:
    the six tangents in the order ``(dg_ru, dg_cx, dg_ch, da_ru, da_cx, da_ch)``;
    ``h_prev, dh_prev [B, H]``: the state the update interpolates and its tangent;
    ``outs = (r, u, c, h)`` and ``d_outs`` (their tangents), all ``[B, H]``, written:

        [r, u] = σ(g_ru + a_ru);  n = g_ch + a_ch;  c = tanh(g_cx + a_cx + r·n)
        h = u·h_prev + (1-u)·c
        [dr, du] = [r(1-r), u(1-u)]·(dg_ru + da_ru);  dn = dg_ch + da_ch
        dc = (1-c²)·(dg_cx + da_cx + dr·n + r·dn)
        dh = du·(h_prev - c) + u·dh_prev + (1-u)·dc
    """
    g_ru, g_cx, g_ch = gates
    a_ru, a_cx, a_ch = addends
    dg_ru, dg_cx, dg_ch, da_ru, da_cx, da_ch = tangents
    r, u, c, h = outs
    dr, du, dc, dh = d_outs
    n_batch, n_hidden = h_prev.shape
    one = typed(1.0, h_prev)
    for row in range(n_batch):
        g, a = g_ru[row], row_of(a_ru, row)
        dg, da = dg_ru[row], row_of(da_ru, row)
        gx, ax, gh, ah = g_cx[row], row_of(a_cx, row), g_ch[row], row_of(a_ch, row)
        dgx, dax, dgh, dah = dg_cx[row], row_of(da_cx, row), dg_ch[row], row_of(da_ch, row)
        h_p, dh_p = h_prev[row], dh_prev[row]
        r_r, u_r, c_r, h_r = r[row], u[row], c[row], h[row]
        dr_r, du_r, dc_r, dh_r = dr[row], du[row], dc[row], dh[row]
        for j in range(n_hidden):
            k = n_hidden + j
            gate_r = sigmoid(g[j] + a[j])
            gate_u = sigmoid(g[k] + a[k])
            n = gh[j] + ah[j]
            cand = tanh(gx[j] + ax[j] + gate_r * n)
            r_r[j] = gate_r
            u_r[j] = gate_u
            c_r[j] = cand
            h_r[j] = gate_u * h_p[j] + (one - gate_u) * cand
            d_r = gate_r * (one - gate_r) * (dg[j] + da[j])
            d_u = gate_u * (one - gate_u) * (dg[k] + da[k])
            d_c = (one - cand * cand) * (dgx[j] + dax[j] + d_r * n
                                         + gate_r * (dgh[j] + dah[j]))
            dr_r[j] = d_r
            du_r[j] = d_u
            dc_r[j] = d_c
            dh_r[j] = d_u * (h_p[j] - cand) + gate_u * dh_p[j] + (one - gate_u) * d_c


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
def lstm_jvp_kernel(gates, addend, d_gates, d_addend, cs_prev, dcs_prev, peepholes,
                    d_peepholes, options, outs, d_outs):
    """The LSTM step (``lstm_forward_kernel``'s, term for term) and its tangent, one pass
    per row in two loops, as the forward's.

    ``gates [B, 4H]`` (icfo; e.g. ``h_seen·W_h``), ``addend`` (``[4H]`` or ``[B, 4H]``) and
    their tangents; ``cs_prev, dcs_prev [B, H]``; ``peepholes = (wci, wcf, wco)`` and
    ``d_peepholes`` (their tangents; ``[H]``, read only when ``peephole``: otherwise any
    arrays of length >= H); ``options = (peephole, forget_bias, cell_clip, clipped)``
    (``cell_clip`` ``math.inf`` and ``clipped`` False for no clipping); ``outs = (i, cs, f,
    o, ci, co, h)`` and ``d_outs`` their tangents, all ``[B, H]``, written. With σ' = s(1-s),
    tanh' = 1 - t²:

        di = σ'(i)·(dGi + dcs_prev·wci + cs_prev·dwci);  dci = tanh'(ci)·dGc
        df = σ'(f)·(dGf + dcs_prev·wcf + cs_prev·dwcf)
        dcs = di·ci + i·dci + df·cs_prev + f·dcs_prev,  0 where |i·ci + f·cs_prev| > clip
        dco = tanh'(co)·dcs;  do = σ'(o)·(dGo + dcs·wco + cs·dwco);  dh = do·co + o·dco

    (a clipped NaN state gives a zero tangent, as the reference's mask does).
    """
    wci, wcf, wco = peepholes
    dwci, dwcf, dwco = d_peepholes
    peephole, forget_bias, cell_clip, clipped = options
    i, cs, f, o, ci, co, h = outs
    di, dcs, df, do, dci, dco, dh = d_outs
    n_batch, n_hidden = cs_prev.shape
    fb = typed(forget_bias, cs_prev)
    clip = typed(cell_clip, cs_prev)
    zero = typed(0.0, cs_prev)
    one = typed(1.0, cs_prev)
    w_i, w_f, w_o = wci[:n_hidden], wcf[:n_hidden], wco[:n_hidden]
    dw_i, dw_f, dw_o = dwci[:n_hidden], dwcf[:n_hidden], dwco[:n_hidden]
    n2, n3 = 2 * n_hidden, 3 * n_hidden
    for row in range(n_batch):
        g, a, dg, da = gates[row], row_of(addend, row), d_gates[row], row_of(d_addend, row)
        c_prev, dc_prev = cs_prev[row], dcs_prev[row]
        i_r, cs_r, f_r, o_r = i[row], cs[row], f[row], o[row]
        ci_r, co_r, h_r = ci[row], co[row], h[row]
        di_r, dcs_r, df_r, do_r = di[row], dcs[row], df[row], do[row]
        dci_r, dco_r, dh_r = dci[row], dco[row], dh[row]
        for j in range(n_hidden):
            pre_i = g[j] + a[j]
            pre_f = g[n2 + j] + a[n2 + j] + fb
            d_pre_i = dg[j] + da[j]
            d_pre_f = dg[n2 + j] + da[n2 + j]
            if peephole:
                pre_i = pre_i + c_prev[j] * w_i[j]
                pre_f = pre_f + c_prev[j] * w_f[j]
                d_pre_i = d_pre_i + dc_prev[j] * w_i[j] + c_prev[j] * dw_i[j]
                d_pre_f = d_pre_f + dc_prev[j] * w_f[j] + c_prev[j] * dw_f[j]
            gate_i = sigmoid(pre_i)
            gate_ci = tanh(g[n_hidden + j] + a[n_hidden + j])
            gate_f = sigmoid(pre_f)
            raw = gate_i * gate_ci + gate_f * c_prev[j]
            state = clip if raw > clip else raw          # NaN passes through unchanged
            state = -clip if state < -clip else state
            i_r[j] = gate_i
            cs_r[j] = state
            f_r[j] = gate_f
            ci_r[j] = gate_ci
            d_i = gate_i * (one - gate_i) * d_pre_i
            d_ci = (one - gate_ci * gate_ci) * (dg[n_hidden + j] + da[n_hidden + j])
            d_f = gate_f * (one - gate_f) * d_pre_f
            d_state = d_i * gate_ci + gate_i * d_ci + d_f * c_prev[j] + gate_f * dc_prev[j]
            if clipped:
                d_state = d_state if abs(raw) <= clip else zero
            di_r[j] = d_i
            dci_r[j] = d_ci
            df_r[j] = d_f
            dcs_r[j] = d_state
        for j in range(n_hidden):
            state = cs_r[j]
            d_state = dcs_r[j]
            pre_o = g[n3 + j] + a[n3 + j]
            d_pre_o = dg[n3 + j] + da[n3 + j]
            if peephole:
                pre_o = pre_o + state * w_o[j]
                d_pre_o = d_pre_o + d_state * w_o[j] + state * dw_o[j]
            gate_o = sigmoid(pre_o)
            state_co = tanh(state)
            o_r[j] = gate_o
            co_r[j] = state_co
            h_r[j] = gate_o * state_co
            d_o = gate_o * (one - gate_o) * d_pre_o
            d_co = (one - state_co * state_co) * d_state
            do_r[j] = d_o
            dco_r[j] = d_co
            dh_r[j] = d_o * state_co + gate_o * d_co
