"""The LSTM's fused elementwise passes (Numba), one pass over ``[B, H]`` each way.

The math is ``gradcells.reference.lstm`` (gate blocks i, ci, f, o):

    lstm_forward_kernel(G, b, ...)         one pass over [B, H]: bias, forget_bias,
                                           peepholes, clip, five activations, seven outputs
    lstm_backward_kernel(...)              one pass over [B, H]: dG [B, 4H], dcs_prev, and the
                                           bias and peephole reductions, accumulated

``lstm.py`` calls them around its BLAS matmuls: once for a cell, once per time step for a
sequence. Their contracts are in their docstrings.
"""

from __future__ import annotations

import math

from ._activations import sigmoid, tanh, typed
from ._compile import kernel, row_of


@kernel
def lstm_forward_kernel(gates, addend, cs_prev, wci, wcf, wco, peephole, forget_bias,
                        cell_clip, i, cs, f, o, ci, co, h):
    """The LSTM forward elementwise step, one pass over each row in two loops; writes
    ``i, cs, f, o, ci, co, h``.

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``cs_prev.shape[1]``):

    - ``gates [B, 4H]``: the pre-activations without bias, e.g. ``[x, h_prev]·w`` (icfo);
    - ``addend [4H]`` (the bias, broadcast over rows) or ``[B, 4H]`` (per row, e.g. a
      precomputed ``x_t·W_x + b`` in a sequence); G = gates + addend;
    - ``cs_prev [B, H]``;
    - ``wci, wcf, wco [H]``: peephole vectors, read only when ``peephole`` is True (otherwise
      pass any arrays of length >= H, e.g. the bias);
    - ``forget_bias``: float; ``cell_clip``: float, ``math.inf`` for no clipping;
    - ``i, cs, f, o, ci, co, h [B, H]``: outputs, overwritten (must not overlap the inputs).

    Per element, with G split into Gi, Gc, Gf, Go:

        i = σ(Gi + cs_prev·wci);  ci = tanh(Gc);  f = σ(Gf + forget_bias + cs_prev·wcf)
        cs = clip(i·ci + f·cs_prev, ±cell_clip);  co = tanh(cs);  o = σ(Go + cs·wco)
        h = o·co                                  (peephole terms only when ``peephole``)
    """
    n_batch, n_hidden = cs_prev.shape
    fb = typed(forget_bias, cs_prev)
    clip = typed(cell_clip, cs_prev)
    w_i, w_f, w_o = wci[:n_hidden], wcf[:n_hidden], wco[:n_hidden]
    for row in range(n_batch):
        g, a = gates[row], row_of(addend, row)
        g_i, g_c = g[:n_hidden], g[n_hidden:2 * n_hidden]
        g_f, g_o = g[2 * n_hidden:3 * n_hidden], g[3 * n_hidden:]
        a_i, a_c = a[:n_hidden], a[n_hidden:2 * n_hidden]
        a_f, a_o = a[2 * n_hidden:3 * n_hidden], a[3 * n_hidden:]
        c_prev = cs_prev[row]
        i_r, cs_r, f_r, o_r = i[row], cs[row], f[row], o[row]
        ci_r, co_r, h_r = ci[row], co[row], h[row]
        for j in range(n_hidden):
            pre_i = g_i[j] + a_i[j]
            pre_f = g_f[j] + a_f[j] + fb
            if peephole:
                pre_i = pre_i + c_prev[j] * w_i[j]
                pre_f = pre_f + c_prev[j] * w_f[j]
            gate_i = sigmoid(pre_i)
            gate_ci = tanh(g_c[j] + a_c[j])
            gate_f = sigmoid(pre_f)
            state = gate_i * gate_ci + gate_f * c_prev[j]
            state = clip if state > clip else state          # NaN passes through unchanged
            state = -clip if state < -clip else state
            i_r[j] = gate_i
            cs_r[j] = state
            f_r[j] = gate_f
            ci_r[j] = gate_ci
        # The output gate in a loop of its own, reading the new state back from cache: with
        # all five activations in one loop AVX2's 16 registers spill (float32, H = 128 and
        # 256, interleaved A/B: 11-16% more time a row than this).
        for j in range(n_hidden):
            state = cs_r[j]
            pre_o = g_o[j] + a_o[j]
            if peephole:
                pre_o = pre_o + state * w_o[j]
            gate_o = sigmoid(pre_o)
            state_co = tanh(state)
            o_r[j] = gate_o
            co_r[j] = state_co
            h_r[j] = gate_o * state_co


@kernel
def lstm_backward_kernel(cs_prev, i, cs, f, o, ci, co, d_h, has_d_h, d_cs, has_d_cs, wci, wcf,
                         wco, peephole, cell_clip, d_gates, dcs_prev, d_bias, d_wci, d_wcf,
                         d_wco):
    """The LSTM backward elementwise step, one pass per row with the reductions fused.

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``cs_prev.shape[1]``):

    - ``cs_prev`` and the forward's saved ``i, cs, f, o, ci, co`` (``[B, H]``);
    - ``d_h, d_cs [B, H]``: upstream gradients, read only when ``has_d_h`` / ``has_d_cs``
      (otherwise zeros are used: pass any ``[B, H]`` array);
    - ``wci, wcf, wco [H]``: peepholes, read only when ``peephole`` (else any length >= H);
    - ``cell_clip``: the forward's clip for ``clip_grad="exact"``; ``math.inf`` when there
      was no clipping or for the straight-through gradient (no mask);
    - outputs, overwritten: ``d_gates [B, 4H]`` (dL/dG, icfo), ``dcs_prev [B, H]``;
    - outputs, **accumulated** (``+=``, so a sequence can sum over steps; pass zeros for one
      step): ``d_bias [4H]`` (Σ_batch dG), and when ``peephole`` ``d_wci, d_wcf, d_wco [H]``
      (otherwise never touched: pass any arrays).

    Per element (docs/spec.md §2):

        do  = d_h·co·o(1-o);   dcs = d_h·o(1-co²) + d_cs + do·wco
        dcs = 0 where |i·ci + f·cs_prev| > cell_clip    (the clip was active)
        di = dcs·ci·i(1-i);  dci = dcs·i(1-ci²);  df = dcs·cs_prev·f(1-f)
        dcs_prev = dcs·f + di·wci + df·wcf
        d_wci += Σ di·cs_prev;  d_wcf += Σ df·cs_prev;  d_wco += Σ do·cs
    """
    n_batch, n_hidden = cs_prev.shape
    zero = typed(0.0, cs_prev)
    one = typed(1.0, cs_prev)
    clip = typed(cell_clip, cs_prev)
    masked = cell_clip < math.inf
    w_i, w_f, w_o = wci[:n_hidden], wcf[:n_hidden], wco[:n_hidden]
    dw_i, dw_f, dw_o = d_wci[:n_hidden], d_wcf[:n_hidden], d_wco[:n_hidden]
    for row in range(n_batch):
        c_prev, i_r, cs_r, f_r = cs_prev[row], i[row], cs[row], f[row]
        o_r, ci_r, co_r = o[row], ci[row], co[row]
        dh_r, dcs_r = d_h[row], d_cs[row]
        dg = d_gates[row]
        dg_i, dg_c = dg[:n_hidden], dg[n_hidden:2 * n_hidden]
        dg_f, dg_o = dg[2 * n_hidden:3 * n_hidden], dg[3 * n_hidden:]
        dcs_prev_r = dcs_prev[row]
        for j in range(n_hidden):
            gate_i, gate_f, gate_o = i_r[j], f_r[j], o_r[j]
            gate_ci, state_co = ci_r[j], co_r[j]
            upstream_h = dh_r[j] if has_d_h else zero
            upstream_cs = dcs_r[j] if has_d_cs else zero
            d_o = upstream_h * state_co * gate_o * (one - gate_o)
            d_state = upstream_h * gate_o * (one - state_co * state_co) + upstream_cs
            if peephole:
                d_state = d_state + d_o * w_o[j]
            if masked:
                raw = gate_i * gate_ci + gate_f * c_prev[j]
                d_state = d_state if abs(raw) <= clip else zero
            d_i = d_state * gate_ci * gate_i * (one - gate_i)
            dg_i[j] = d_i
            dg_c[j] = d_state * gate_i * (one - gate_ci * gate_ci)
            d_f = d_state * c_prev[j] * gate_f * (one - gate_f)
            dg_f[j] = d_f
            dg_o[j] = d_o
            d_prev = d_state * gate_f
            if peephole:
                d_prev = d_prev + d_i * w_i[j] + d_f * w_f[j]
            dcs_prev_r[j] = d_prev
        # The reductions in loops of their own: fused into the loop above they give it more
        # memory streams than LLVM checks for overlap, and it would not be vectorized.
        for k in range(4 * n_hidden):
            d_bias[k] += dg[k]
        if peephole:
            for j in range(n_hidden):
                dw_i[j] += dg_i[j] * c_prev[j]
                dw_f[j] += dg_f[j] * c_prev[j]
                dw_o[j] += dg_o[j] * cs_r[j]
