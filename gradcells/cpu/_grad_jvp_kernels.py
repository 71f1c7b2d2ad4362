"""The fused tangent passes of the second order (docs/spec.md §12; Numba): the tangent of a
backward kernel's gate gradients, along the saved result's tangent and the upstream
gradients' tangents, one pass per step beside the backward kernel it differentiates.

The math is the reference's gradient differentiated as written (``gradcells.reference``'s
``*_grad`` on dual numbers): with ``g`` the gradient reaching a step, ``g'`` its tangent
and primes the tangents of the saved outputs,

    dz' = act'(saved)∘g' + act''(saved)[saved']∘g

``_grad_jvp.py`` calls them around its BLAS matmuls, once per time step after the backward
kernel (``_rnn_kernels``, ``_gru_kernels``, ``_lstm_kernels``) wrote the step's gate
gradients, so a gradient's primal is the backend's ``*_grad``'s:

    rnn_backward_tangent_kernel          the RNN's dz'
    gru_reset_after_grad_tangent_kernel  the reset-after GRU's dc', dn', [dr', du'], direct'
    gru_candidate_grad_tangent_kernel    reset before, pass 1: dc', du', (r∘h_prev)'
    gru_reset_grad_tangent_kernel        reset before, pass 2: dr', direct'
    lstm_backward_tangent_kernel         the LSTM's gate gradients' and dcs_prev's tangents

Each accumulates (``+=``) its bias sums' tangents as the backward kernel does the sums.
Derivatives are read from the outputs as the gradients read them: σ' = s(1-s) (its tangent
s'(1-2s)), tanh' = 1 - t² (its tangent -2t·t'), relu' = [h > 0] (its tangent 0: the branch
follows the primal, as a clip's mask does, so the tangent is zero where the gradient is
masked). All arrays C-contiguous, one float dtype; B rows, H = the state's width; a
``d_``-prefixed argument is its primal's tangent, laid out the same way; an ``addend`` is
``[N]`` (broadcast) or ``[B, N]`` (``row_of``). Outputs are overwritten and must not
overlap the inputs unless a docstring says so.
"""

from __future__ import annotations

import math

from ._activations import typed
from ._compile import helper, kernel, row_of

# --------------------------------------------------------------------------------------
# RNN


@kernel
def rnn_backward_tangent_kernel(h, dh, up, d_up, relu, d_z, d_bias):
    """The tangent of ``rnn_backward_kernel``'s ``dz = up·act'(z)``; writes ``d_z [B, H]``
    and accumulates (``+=``) ``d_bias [H]`` with Σ_batch d_z.

    ``h [B, H]``: the output act'(z) is read from (the step's own, before zoneout) and
    ``dh`` its tangent; ``up [B, H]``: the gradient the backward kernel took and ``d_up``
    its tangent; ``relu``: the activation (False: tanh):

        d_z = d_up·(1 - h²) - up·2h·dh       tanh
        d_z = d_up·[h > 0]                   relu
    """
    n_batch, n_hidden = h.shape
    zero = typed(0.0, h)
    one = typed(1.0, h)
    two = typed(2.0, h)
    for row in range(n_batch):
        h_r, dh_r, up_r, dup_r, dz_r = h[row], dh[row], up[row], d_up[row], d_z[row]
        if relu:
            for j in range(n_hidden):
                dz_r[j] = dup_r[j] * (one if h_r[j] > zero else zero)
        else:
            for j in range(n_hidden):
                out = h_r[j]
                dz_r[j] = dup_r[j] * (one - out * out) - up_r[j] * (two * out * dh_r[j])
        for j in range(n_hidden):
            d_bias[j] += dz_r[j]


# --------------------------------------------------------------------------------------
# GRU


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


# --------------------------------------------------------------------------------------
# LSTM
#
# ``lstm_backward_tangent_kernel``: ``lstm_backward_kernel``'s expressions differentiated
# (primes the tangents), with σ'(s) = s(1-s), σ'(s)' = s'(1-2s), tanh'(t)' = -2t·t' (the
# upstream gradients g_h = d_h, g_cs = d_cs):
#
#     do'  = (g_h·co)'·σ'(o) + g_h·co·σ'(o)'
#     dcs' = (g_h·o)'·tanh'(co) + g_h·o·tanh'(co)' + g_cs' + do'·wco + do·wco'
#     dcs' = 0 where the backward kernel masks dcs
#     di'  = (dcs·ci)'·σ'(i) + dcs·ci·σ'(i)';   dci' = (dcs·i)'·tanh'(ci) + dcs·i·tanh'(ci)'
#     df'  = (dcs·cs_prev)'·σ'(f) + dcs·cs_prev·σ'(f)'
#     dcs_prev' = (dcs·f)' + (di·wci)' + (df·wcf)'
#     Σ dG';  d_wci' += Σ (di·cs_prev)';  d_wcf' += Σ (df·cs_prev)';  d_wco' += Σ (do·cs)'


@helper
def _output_tangents(ups, gate_o, state_co, one, two):
    """``(do, do', dcs, dcs')`` before the peephole: from ``(d_h, d_h', d_cs, d_cs')``,
    ``(o, o')``, ``(co, co')`` (``lstm_backward_tangent_kernel``)."""
    (uh, duh, ucs, ducs), (go, dgo), (sc, dsc) = ups, gate_o, state_co
    s_o = go * (one - go)
    tanh_co = one - sc * sc
    d_o = uh * sc * s_o
    t_do = (duh * sc + uh * dsc) * s_o + uh * sc * dgo * (one - two * go)
    return (d_o, t_do, uh * go * tanh_co + ucs,
            (duh * go + uh * dgo) * tanh_co - uh * go * two * sc * dsc + ducs)


@helper
def _gate_tangents(d_state, t_state, gates, d_gates, one, two):
    """``(di, di', dci', df, df')`` from the cell state's gradient ``dcs`` and its tangent,
    ``gates = (i, ci, f, cs_prev)`` and their tangents (``lstm_backward_tangent_kernel``)."""
    gi, gc, gf, c_p = gates
    dgi, dgc, dgf, dc_p = d_gates
    s_i = gi * (one - gi)
    s_f = gf * (one - gf)
    d_i = d_state * gc * s_i
    t_di = (t_state * gc + d_state * dgc) * s_i + d_state * gc * dgi * (one - two * gi)
    t_dci = (t_state * gi + d_state * dgi) * (one - gc * gc) - d_state * gi * two * gc * dgc
    d_f = d_state * c_p * s_f
    t_df = (t_state * c_p + d_state * dc_p) * s_f + d_state * c_p * dgf * (one - two * gf)
    return d_i, t_di, t_dci, d_f, t_df


@kernel
def lstm_backward_tangent_kernel(saved, d_saved, up, d_up, peepholes, d_peepholes, options,
                                 d_gates, dcs_prev, sums):
    """The tangent of ``lstm_backward_kernel``'s outputs, one pass per row.

    ``saved = (cs_prev, i, cs, f, o, ci, co)`` (``cs`` the step's own, unzoned state) and
    ``d_saved`` their tangents, ``[B, H]``; ``up = (d_h, d_cs)`` the upstream gradients of
    the step's new states and ``d_up`` their tangents, ``[B, H]``; ``peepholes = (wci, wcf,
    wco)`` and ``d_peepholes`` (``[H]``, read only when ``peephole``); ``options =
    (peephole, cell_clip)``, ``cell_clip`` the backward kernel's (``math.inf``: no mask).
    Writes ``d_gates [B, 4H]`` and ``dcs_prev [B, H]``, the tangents of ``dG`` and
    ``dcs_prev``; accumulates ``sums = (d_bias [4H], d_wci, d_wcf, d_wco [H])``, the
    tangents of the backward kernel's sums (the peepholes' only when ``peephole``). The
    math: the section's comment above.
    """
    cs_prev, i, cs, f, o, ci, co = saved
    t_prev, t_i, t_cs, t_f, t_o, t_ci, t_co = d_saved
    (g_h, g_cs), (t_gh, t_gcs) = up, d_up
    peephole, cell_clip = options
    d_bias, d_wci, d_wcf, d_wco = sums
    n_batch, n_hidden = cs_prev.shape
    zero, one, two = typed(0.0, cs_prev), typed(1.0, cs_prev), typed(2.0, cs_prev)
    clip = typed(cell_clip, cs_prev)
    masked = cell_clip < math.inf
    w_i, w_f, w_o = peepholes[0][:n_hidden], peepholes[1][:n_hidden], peepholes[2][:n_hidden]
    tw_i, tw_f = d_peepholes[0][:n_hidden], d_peepholes[1][:n_hidden]
    tw_o = d_peepholes[2][:n_hidden]
    for row in range(n_batch):
        dg = d_gates[row]
        dg_i, dg_c = dg[:n_hidden], dg[n_hidden:2 * n_hidden]
        dg_f, dg_o = dg[2 * n_hidden:3 * n_hidden], dg[3 * n_hidden:]
        for j in range(n_hidden):
            c_p, dc_p = cs_prev[row, j], t_prev[row, j]
            gi, gf, go, gc, sc = i[row, j], f[row, j], o[row, j], ci[row, j], co[row, j]
            dgi, dgf, dgo = t_i[row, j], t_f[row, j], t_o[row, j]
            dgc, dsc = t_ci[row, j], t_co[row, j]
            uh, ucs, duh, ducs = g_h[row, j], g_cs[row, j], t_gh[row, j], t_gcs[row, j]
            d_o, t_do, d_state, t_state = _output_tangents(
                (uh, duh, ucs, ducs), (go, dgo), (sc, dsc), one, two)
            if peephole:
                d_state = d_state + d_o * w_o[j]
                t_state = t_state + t_do * w_o[j] + d_o * tw_o[j]
            if masked:
                raw = gi * gc + gf * c_p
                if not abs(raw) <= clip:
                    d_state = zero
                    t_state = zero
            d_i, t_di, t_dci, d_f, t_df = _gate_tangents(
                d_state, t_state, (gi, gc, gf, c_p), (dgi, dgc, dgf, dc_p), one, two)
            dg_i[j], dg_c[j], dg_f[j], dg_o[j] = t_di, t_dci, t_df, t_do
            t_prev_j = t_state * gf + d_state * dgf
            if peephole:
                t_prev_j = (t_prev_j + t_di * w_i[j] + d_i * tw_i[j]
                            + t_df * w_f[j] + d_f * tw_f[j])
                d_wci[j] += t_di * c_p + d_i * dc_p
                d_wcf[j] += t_df * c_p + d_f * dc_p
                d_wco[j] += t_do * cs[row, j] + d_o * t_cs[row, j]
            dcs_prev[row, j] = t_prev_j
        for k in range(4 * n_hidden):
            d_bias[k] += dg[k]
