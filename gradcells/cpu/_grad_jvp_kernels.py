"""The fused elementwise passes of the second order (docs/spec.md §12; Numba): the tangent
of a backward kernel's gate gradients, beside the backward kernel itself.

Each pass reads the primal the forward saved and its tangent (the backend's own fused
``*_sequence_jvp``), the step's upstream gradients and their tangents, and writes the
tangent of what the cell's backward kernel writes (``_lstm_kernels``, ...), the backward
kernel's expressions differentiated term by term; the backward kernel itself still writes
the primal, so a gradient's primal is the backend's ``*_grad``'s. Branches follow the
primal (a clip's mask is the backward kernel's), so the tangent is zero where the gradient
is masked. Derivatives are read from the saved outputs: σ'' from s: (1-2s), tanh' = 1-t².

All arrays C-contiguous, one float dtype; B rows, H = the state's width; a ``d_``-prefixed
argument is its primal's tangent, laid out the same way. Outputs are overwritten, the sums
accumulated (``+=``), and must not overlap the inputs.
"""

from __future__ import annotations

import math

from numba import njit

from ._activations import typed
from ._compile import kernel

# Helpers are compiled with the kernels' flags; LLVM inlines them into the loops.
_helper = njit(error_model="numpy")

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


@_helper
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


@_helper
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
