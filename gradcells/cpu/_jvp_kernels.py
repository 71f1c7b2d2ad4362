"""The fused elementwise passes of forward mode (docs/spec.md §12; Numba): each computes a
cell step's elementwise primal exactly as the forward's kernel does, and its tangent in the
same pass.

The math is the reference's "Forward mode" sections (``gradcells.reference.rnn``, ``.gru``,
``.lstm``). ``_jvp.py`` calls them around its BLAS matmuls, once per time step (a cell is a
sequence of one step):

    rnn_jvp_kernel                   h = act(z), dh = act'(z)∘dz, one pass
    gru_gates_jvp_kernel             reset before, pass 1: r, u, r∘h_seen and tangents
    gru_candidate_jvp_kernel         reset before, pass 2: c, h and tangents
    gru_reset_after_tangent_kernel   reset after: the tangent, after the forward's
                                     ``gru_reset_after_kernel`` wrote the primal
    lstm_tangent_kernel              the tangent, after the forward's ``lstm_forward_kernel``

Where a kernel computes the primal, its expressions are the forward kernel's, term for
term (``_rnn_kernels``, ``_gru_kernels``); elsewhere the primal IS the forward kernel's; so
a sequence's primal is bitwise the forward's. The reset-after GRU and the LSTM take two
passes because one fused pass did not vectorize (measured, float32, B = 32, H = 128: the
fused LSTM pass 78 µs against 8 µs for the forward kernel plus 4 µs for the tangent's; the
fused reset-after GRU pass 101 µs against 6 + 3): with the primal and tangent streams
together a loop reads and writes some 30 arrays, past what LLVM's vectorizer will check for
overlap at run time, and it stays scalar. Derivatives are read from the outputs as the
gradients read them: σ' = s(1-s), tanh' = 1 - t², relu' = [h > 0].

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


@kernel
def lstm_tangent_kernel(d_gates, cs_prev, dcs_prev, peepholes, d_peepholes, options, outs,
                        d_outs):
    """The LSTM step's tangent, from the primal ``lstm_forward_kernel`` wrote, one pass per
    row in two loops (as the forward's).

    ``d_gates [B, 4H]``: the tangent of the pre-activations ``G`` (icfo, bias included);
    ``cs_prev, dcs_prev [B, H]``; ``peepholes = (wci, wcf, wco)`` and ``d_peepholes`` (their
    tangents; ``[H]``, read only when ``peephole``: otherwise any arrays of length >= H);
    ``options = (peephole, cell_clip, clipped)`` (``clipped`` False: no clipping, then
    ``cell_clip`` is never read); ``outs = (i, cs, f, o, ci, co)`` the primal; ``d_outs =
    (di, dcs, df, do, dci, dco, dh)``, all ``[B, H]``, written. With σ' = s(1-s),
    tanh' = 1 - t²:

        di = σ'(i)·(dGi + dcs_prev·wci + cs_prev·dwci);  dci = tanh'(ci)·dGc
        df = σ'(f)·(dGf + dcs_prev·wcf + cs_prev·dwcf)
        dcs = di·ci + i·dci + df·cs_prev + f·dcs_prev,  0 unless |i·ci + f·cs_prev| <= clip
        dco = tanh'(co)·dcs;  do = σ'(o)·(dGo + dcs·wco + cs·dwco);  dh = do·co + o·dco

    (``i·ci + f·cs_prev`` is the forward's unclipped state, recomputed with its expression;
    a NaN there gives a zero tangent under a clip, as the reference's mask does).
    """
    wci, wcf, wco = peepholes
    dwci, dwcf, dwco = d_peepholes
    peephole, cell_clip, clipped = options
    i, cs, f, o, ci, co = outs
    di, dcs, df, do, dci, dco, dh = d_outs
    n_batch, n_hidden = cs_prev.shape
    clip = typed(cell_clip, cs_prev)
    zero = typed(0.0, cs_prev)
    one = typed(1.0, cs_prev)
    w_i, w_f, w_o = wci[:n_hidden], wcf[:n_hidden], wco[:n_hidden]
    dw_i, dw_f, dw_o = dwci[:n_hidden], dwcf[:n_hidden], dwco[:n_hidden]
    for row in range(n_batch):
        dg = d_gates[row]
        dg_i, dg_c = dg[:n_hidden], dg[n_hidden:2 * n_hidden]
        dg_f, dg_o = dg[2 * n_hidden:3 * n_hidden], dg[3 * n_hidden:]
        c_prev, dc_prev = cs_prev[row], dcs_prev[row]
        i_r, f_r, ci_r = i[row], f[row], ci[row]
        di_r, df_r, dci_r, dcs_r = di[row], df[row], dci[row], dcs[row]
        for j in range(n_hidden):
            d_pre_i = dg_i[j]
            d_pre_f = dg_f[j]
            if peephole:
                d_pre_i = d_pre_i + dc_prev[j] * w_i[j] + c_prev[j] * dw_i[j]
                d_pre_f = d_pre_f + dc_prev[j] * w_f[j] + c_prev[j] * dw_f[j]
            gate_i, gate_ci, gate_f = i_r[j], ci_r[j], f_r[j]
            d_i = gate_i * (one - gate_i) * d_pre_i
            d_ci = (one - gate_ci * gate_ci) * dg_c[j]
            d_f = gate_f * (one - gate_f) * d_pre_f
            d_state = d_i * gate_ci + gate_i * d_ci + d_f * c_prev[j] + gate_f * dc_prev[j]
            if clipped:
                raw = gate_i * gate_ci + gate_f * c_prev[j]
                d_state = d_state if abs(raw) <= clip else zero
            di_r[j] = d_i
            dci_r[j] = d_ci
            df_r[j] = d_f
            dcs_r[j] = d_state
        cs_r, o_r, co_r = cs[row], o[row], co[row]
        do_r, dco_r, dh_r = do[row], dco[row], dh[row]
        for j in range(n_hidden):
            d_state = dcs_r[j]
            d_pre_o = dg_o[j]
            if peephole:
                d_pre_o = d_pre_o + d_state * w_o[j] + cs_r[j] * dw_o[j]
            gate_o, state_co = o_r[j], co_r[j]
            d_o = gate_o * (one - gate_o) * d_pre_o
            d_co = (one - state_co * state_co) * d_state
            do_r[j] = d_o
            dco_r[j] = d_co
            dh_r[j] = d_o * state_co + gate_o * d_co
