"""The LSTM's fused elementwise passes (Numba), one pass over ``[B, H]`` each way.

The math is ``gradcells.cells.lstm.reference`` (gate blocks i, ci, f, o):

    lstm_forward_kernel(G, b, ...)         one pass over [B, H]: bias, forget_bias,
                                           peepholes, clip, five activations, seven outputs
    lstm_backward_kernel(...)              one pass over [B, H]: dG [B, 4H], dcs_prev, and the
                                           bias and peephole reductions, accumulated

The layer-normalised LSTM (docs/spec.md §9.2) has its own:

    layer_norm_forward_kernel(Z, ...)      LN(x·W_x) + b in place, every row (every step)
    lstm_ln_forward_kernel(Z_h, ...)       per row: LN of h_prev·W_h, the gates, the cell
                                           norm, seven outputs
    layer_norm_stats_kernel(Z, ...)        ẑ in place and r, every row (the gradient's
                                           recompute)
    lstm_ln_backward_kernel(...)           per row: dG through the cell norm, dcs_prev, the
                                           sums, then dz_h in place of ĥ
    layer_norm_grad_kernel(dY, ...)        dz in place of ẑ and Σ dY∘ẑ, every row

``cpu.py`` calls them around its BLAS matmuls: once for a cell, once per time step for a
sequence. Their contracts are in their docstrings.
"""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload

from ...cpu._activations import sigmoid, tanh, typed
from ...cpu._compile import helper, kernel, row_of


@kernel
def lstm_forward_kernel(gates, addend, cs_prev, wci, wcf, wco, peephole, forget_bias,
                        cell_clip, i, cs, f, o, ci, co, h):
    """The LSTM forward elementwise step, one pass over each row in two loops; writes
    ``i, cs, f, o, ci, co, h``.

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``cs_prev.shape[1]``):

    - ``gates [B, 4H]``: the pre-activations without bias, e.g. ``[x, h_prev]·w`` (icfo);
    - ``addend [1, 4H]`` (a cell's bias, broadcast over rows: ``_compile.one_row``) or
      ``[B, 4H]`` (per row: a sequence's precomputed ``x_t·W_x + b``), one signature for
      both (``_compile.row_of``); G = gates + addend;
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


@helper
def _gate_rows(d_gates, row):
    """Row ``row`` of the gates' upstream gradients ``d_gates [5, B, H]`` (``i, f, o, ci,
    co``; a stand-in with fewer than five, never read, gives its last)."""
    last = d_gates.shape[0] - 1
    return (d_gates[min(0, last)][row], d_gates[min(1, last)][row],
            d_gates[min(2, last)][row], d_gates[min(3, last)][row],
            d_gates[min(4, last)][row])


@kernel
def lstm_backward_kernel(cs_prev, i, cs, f, o, ci, co, d_h, has_d_h, d_cs, has_d_cs,
                         d_fields, has_d_fields, wci, wcf, wco, peephole, cell_clip, d_gates,
                         dcs_prev, d_bias, d_wci, d_wcf, d_wco):
    """The LSTM backward elementwise step, one pass per row with the reductions fused.

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``cs_prev.shape[1]``):

    - ``cs_prev`` and the forward's saved ``i, cs, f, o, ci, co`` (``[B, H]``);
    - ``d_h, d_cs [B, H]``: upstream gradients, read only when ``has_d_h`` / ``has_d_cs``
      (otherwise zeros are used: pass any ``[B, H]`` array);
    - ``d_fields [5, B, H]``: the upstream gradients of the gates ``i, f, o, ci, co``
      (docs/spec.md §16.1), read only when ``has_d_fields`` (otherwise any ``[k, B, H]``,
      e.g. ``cs_prev[None]``: the loop is the one without them);
    - ``wci, wcf, wco [H]``: peepholes, read only when ``peephole`` (else any length >= H);
    - ``cell_clip``: the forward's clip for ``clip_grad="exact"``; ``math.inf`` when there
      was no clipping or for the straight-through gradient (no mask);
    - outputs, overwritten: ``d_gates [B, 4H]`` (dL/dG, icfo), ``dcs_prev [B, H]``;
    - outputs, **accumulated** (``+=``, so a sequence can sum over steps; pass zeros for one
      step): ``d_bias [4H]`` (Σ_batch dG), and when ``peephole`` ``d_wci, d_wcf, d_wco [H]``
      (otherwise never touched: pass any arrays).

    Per element (docs/spec.md §2; the gates' upstreams ``u_*`` zero without ``has_d_fields``):

        do  = (d_h·co + u_o)·o(1-o);   dcs = (d_h·o + u_co)(1-co²) + d_cs + do·wco
        dcs = 0 where |i·ci + f·cs_prev| > cell_clip    (the clip was active)
        di = (dcs·ci + u_i)·i(1-i);  dci = (dcs·i + u_ci)(1-ci²);  df = (dcs·cs_prev + u_f)·f(1-f)
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
        u_i, u_f, u_o, u_ci, u_co = _gate_rows(d_fields, row)
        for j in range(n_hidden):
            gate_i, gate_f, gate_o = i_r[j], f_r[j], o_r[j]
            gate_ci, state_co = ci_r[j], co_r[j]
            upstream_h = dh_r[j] if has_d_h else zero
            upstream_cs = dcs_r[j] if has_d_cs else zero
            pre_o = upstream_h * state_co
            pre_co = upstream_h * gate_o
            if has_d_fields:
                pre_o = pre_o + u_o[j]
                pre_co = pre_co + u_co[j]
            d_o = pre_o * gate_o * (one - gate_o)
            d_state = pre_co * (one - state_co * state_co) + upstream_cs
            if peephole:
                d_state = d_state + d_o * w_o[j]
            if masked:
                raw = gate_i * gate_ci + gate_f * c_prev[j]
                d_state = d_state if abs(raw) <= clip else zero
            pre_i = d_state * gate_ci
            pre_c = d_state * gate_i
            pre_f = d_state * c_prev[j]
            if has_d_fields:
                pre_i = pre_i + u_i[j]
                pre_c = pre_c + u_ci[j]
                pre_f = pre_f + u_f[j]
            d_i = pre_i * gate_i * (one - gate_i)
            dg_i[j] = d_i
            dg_c[j] = pre_c * (one - gate_ci * gate_ci)
            d_f = pre_f * gate_f * (one - gate_f)
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


# --------------------------------------------------------------------------------------
# the layer-normalised LSTM (docs/spec.md §9.2)
#
# A row's mean and variance are sums over its 4H (or H) columns. Without fastmath LLVM may
# not reorder a floating-point sum, so a one-accumulator loop runs at one add per add's
# latency; ``_row_sum`` and ``_row_centred_squares`` keep eight independent partial sums
# (a fixed order: the results do not depend on the machine; docs/performance.md, "The
# layer-normalised LSTM", gives the speed-up).


@helper
def _row_sum(z):
    """Σ z over a row, in eight interleaved partial sums."""
    n = z.shape[0]
    zero = typed(0.0, z)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
    m = n - n % 8
    for k in range(0, m, 8):
        s0 += z[k]
        s1 += z[k + 1]
        s2 += z[k + 2]
        s3 += z[k + 3]
        s4 += z[k + 4]
        s5 += z[k + 5]
        s6 += z[k + 6]
        s7 += z[k + 7]
    for k in range(m, n):
        s0 += z[k]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@helper
def _row_dot(a, b):
    """Σ a∘b over a row, in eight interleaved partial sums."""
    n = a.shape[0]
    zero = typed(0.0, a)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
    m = n - n % 8
    for k in range(0, m, 8):
        s0 += a[k] * b[k]
        s1 += a[k + 1] * b[k + 1]
        s2 += a[k + 2] * b[k + 2]
        s3 += a[k + 3] * b[k + 3]
        s4 += a[k + 4] * b[k + 4]
        s5 += a[k + 5] * b[k + 5]
        s6 += a[k + 6] * b[k + 6]
        s7 += a[k + 7] * b[k + 7]
    for k in range(m, n):
        s0 += a[k] * b[k]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@helper
def _row_centred_squares(z, mean):
    """Σ (z - mean)² over a row, in eight interleaved partial sums."""
    n = z.shape[0]
    zero = typed(0.0, z)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
    m = n - n % 8
    for k in range(0, m, 8):
        d0, d1, d2, d3 = z[k] - mean, z[k + 1] - mean, z[k + 2] - mean, z[k + 3] - mean
        d4, d5, d6, d7 = z[k + 4] - mean, z[k + 5] - mean, z[k + 6] - mean, z[k + 7] - mean
        s0 += d0 * d0
        s1 += d1 * d1
        s2 += d2 * d2
        s3 += d3 * d3
        s4 += d4 * d4
        s5 += d5 * d5
        s6 += d6 * d6
        s7 += d7 * d7
    for k in range(m, n):
        d = z[k] - mean
        s0 += d * d
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@helper
def _row_stats_two_pass(z, epsilon):
    """``_row_stats`` for float64: the mean, then the centred squares (as the reference)."""
    count = float(max(z.shape[0], 1))
    mean = _row_sum(z) / count
    return mean, 1.0 / math.sqrt(_row_centred_squares(z, mean) / count + epsilon)


@helper
def _row_stats_wide(z, epsilon):
    """``_row_stats`` for float32: Σz and Σz² in one pass, accumulated in float64, which
    holds the difference ``Σz²/n - mean²`` to far below float32's resolution; the results
    rounded to float32 once."""
    n = z.shape[0]
    s0 = s1 = s2 = s3 = q0 = q1 = q2 = q3 = 0.0
    m = n - n % 4
    for k in range(0, m, 4):
        a0, a1 = np.float64(z[k]), np.float64(z[k + 1])
        a2, a3 = np.float64(z[k + 2]), np.float64(z[k + 3])
        s0 += a0
        s1 += a1
        s2 += a2
        s3 += a3
        q0 += a0 * a0
        q1 += a1 * a1
        q2 += a2 * a2
        q3 += a3 * a3
    for k in range(m, n):
        a0 = np.float64(z[k])
        s0 += a0
        q0 += a0 * a0
    count = float(max(n, 1))
    mean = ((s0 + s1) + (s2 + s3)) / count
    var = ((q0 + q1) + (q2 + q3)) / count - mean * mean
    var = 0.0 if var < 0.0 else var                       # NaN passes through unchanged
    return np.float32(mean), np.float32(1.0 / math.sqrt(var + np.float64(epsilon)))


def _row_stats(z, epsilon):
    """``(mean, r)`` of a row: its mean and ``1/sqrt(var + ε)``, biased variance, in the
    row's dtype (``gradcells._core.xpmath.layer_norm_stats``). Jitted code only."""
    raise NotImplementedError("_row_stats is compiled into the kernels")


@overload(_row_stats)
def _row_stats_impl(z, epsilon):
    if isinstance(z, types.Array) and z.dtype == types.float32:
        return lambda z, epsilon: _row_stats_wide(z, epsilon)
    if isinstance(z, types.Array) and z.dtype == types.float64:
        return lambda z, epsilon: _row_stats_two_pass(z, epsilon)
    return None


@helper
def _row_grad_sums(dy, gamma, z_hat):
    """``(Σ g, Σ g∘ẑ)`` over a row, ``g = dy∘γ``, in one pass of four interleaved partial
    sums each."""
    n = dy.shape[0]
    zero = typed(0.0, dy)
    s0 = s1 = s2 = s3 = t0 = t1 = t2 = t3 = zero
    m = n - n % 4
    for k in range(0, m, 4):
        g0, g1 = dy[k] * gamma[k], dy[k + 1] * gamma[k + 1]
        g2, g3 = dy[k + 2] * gamma[k + 2], dy[k + 3] * gamma[k + 3]
        s0 += g0
        s1 += g1
        s2 += g2
        s3 += g3
        t0 += g0 * z_hat[k]
        t1 += g1 * z_hat[k + 1]
        t2 += g2 * z_hat[k + 2]
        t3 += g3 * z_hat[k + 3]
    for k in range(m, n):
        g0 = dy[k] * gamma[k]
        s0 += g0
        t0 += g0 * z_hat[k]
    return (s0 + s1) + (s2 + s3), (t0 + t1) + (t2 + t3)


@helper
def _row_norm_grad(dy, gamma, z_hat, rstd, d_gamma):
    """The layer norm's backward on one row, in place: ``z_hat`` (``ẑ``) becomes
    ``dz = r·(g - mean(g) - ẑ∘mean(g∘ẑ))``, ``g = dy∘γ``; ``d_gamma += dy∘ẑ``."""
    count = typed(max(dy.shape[0], 1), dy)
    sum_g, sum_gz = _row_grad_sums(dy, gamma, z_hat)
    mean_g, mean_gz = sum_g / count, sum_gz / count
    for k in range(dy.shape[0]):
        z = z_hat[k]
        d_gamma[k] += dy[k] * z
        z_hat[k] = rstd * (dy[k] * gamma[k] - mean_g - z * mean_gz)


@kernel
def layer_norm_forward_kernel(z, gamma, beta, addend, epsilon):
    """Layer normalisation of every row of ``z [N, W]``, in place, plus an addend:
    ``z = γ∘ẑ + β + addend`` with ``ẑ = (z - mean)·r``, ``r = 1/sqrt(var + ε)`` over the row
    (biased variance). ``gamma, beta, addend [W]``; ``epsilon`` a float. The sequence's input
    part ``LN(x·W_x; γ_x, β_x) + b`` for all steps at once."""
    n_rows, width = z.shape
    eps = typed(epsilon, z)
    for row in range(n_rows):
        z_r = z[row]
        mean, rstd = _row_stats(z_r, eps)
        for k in range(width):
            z_r[k] = gamma[k] * ((z_r[k] - mean) * rstd) + beta[k] + addend[k]


@kernel
def layer_norm_stats_kernel(z, epsilon, rstd):
    """What the layer norm's backward needs, recomputed: every row of ``z [N, W]`` becomes
    ``ẑ = (z - mean)·r`` in place and ``rstd[row] = r`` (``rstd [N]``)."""
    n_rows, width = z.shape
    eps = typed(epsilon, z)
    for row in range(n_rows):
        z_r = z[row]
        mean, r = _row_stats(z_r, eps)
        for k in range(width):
            z_r[k] = (z_r[k] - mean) * r
        rstd[row] = r


@kernel
def layer_norm_grad_kernel(dy, gamma, z_hat, rstd, d_gamma):
    """The layer norm's backward over every row (``_row_norm_grad``): ``z_hat [N, W]`` (from
    ``layer_norm_stats_kernel``) becomes ``dz`` in place, ``d_gamma [W]`` accumulates
    ``Σ dy∘ẑ``. ``dy [N, W]`` is the gradient of the normalised output; ``rstd [N]``."""
    for row in range(dy.shape[0]):
        _row_norm_grad(dy[row], gamma, z_hat[row], rstd[row], d_gamma)


@kernel
def lstm_ln_forward_kernel(z_h, addend, cs_prev, gamma_h, beta_h, gamma_c, beta_c, epsilon,
                           normalized, wci, wcf, wco, peephole, forget_bias, cell_clip, i, cs,
                           f, o, ci, co, h):
    """The layer-normalised LSTM's forward step, one pass per row: the recurrent part's norm,
    the gates, the cell norm and the outputs; writes ``i, cs, f, o, ci, co, h``.

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``cs_prev.shape[1]``):

    - ``z_h [B, 4H]``: ``h_prev·W_h`` (icfo); ``addend [B, 4H]``: the input part as it
      enters G, ``LN(x·W_x; γ_x, β_x) + b`` (``layer_norm_forward_kernel``);
    - ``gamma_h, beta_h [4H]``, ``gamma_c, beta_c [H]``; ``epsilon``: float;
      ``normalized``: True for ``ln_carry="normalized"`` (carry ``n``), False for "raw";
    - ``cs_prev``, peepholes, ``forget_bias``, ``cell_clip`` and the outputs as for
      ``lstm_forward_kernel`` (``cs``: the carried state).

    Per row: ``(μ, r)`` of ``z_h``; ``G = addend + γ_h∘(z_h - μ)·r + β_h``; ``i, ci, f`` and
    ``c̃ = clip(i·ci + f·cs_prev)`` as in ``lstm_forward_kernel`` (``c̃`` kept in ``cs``);
    ``(μ_c, r_c)`` of ``c̃``; ``n = γ_c∘(c̃ - μ_c)·r_c + β_c``; ``co = tanh(n)``;
    ``cs = n`` or ``c̃``; ``o = σ(Go + cs·wco)``; ``h = o·co``.
    """
    n_batch, n_hidden = cs_prev.shape
    fb = typed(forget_bias, cs_prev)
    clip = typed(cell_clip, cs_prev)
    eps = typed(epsilon, cs_prev)
    w_i, w_f, w_o = wci[:n_hidden], wcf[:n_hidden], wco[:n_hidden]
    gh_i, gh_c = gamma_h[:n_hidden], gamma_h[n_hidden:2 * n_hidden]
    gh_f, gh_o = gamma_h[2 * n_hidden:3 * n_hidden], gamma_h[3 * n_hidden:]
    bh_i, bh_c = beta_h[:n_hidden], beta_h[n_hidden:2 * n_hidden]
    bh_f, bh_o = beta_h[2 * n_hidden:3 * n_hidden], beta_h[3 * n_hidden:]
    for row in range(n_batch):
        g, a = z_h[row], addend[row]
        mean, rstd = _row_stats(g, eps)
        g_i, g_c = g[:n_hidden], g[n_hidden:2 * n_hidden]
        g_f, g_o = g[2 * n_hidden:3 * n_hidden], g[3 * n_hidden:]
        a_i, a_c = a[:n_hidden], a[n_hidden:2 * n_hidden]
        a_f, a_o = a[2 * n_hidden:3 * n_hidden], a[3 * n_hidden:]
        c_prev = cs_prev[row]
        i_r, cs_r, f_r, o_r = i[row], cs[row], f[row], o[row]
        ci_r, co_r, h_r = ci[row], co[row], h[row]
        for j in range(n_hidden):
            pre_i = a_i[j] + (gh_i[j] * ((g_i[j] - mean) * rstd) + bh_i[j])
            pre_c = a_c[j] + (gh_c[j] * ((g_c[j] - mean) * rstd) + bh_c[j])
            pre_f = a_f[j] + (gh_f[j] * ((g_f[j] - mean) * rstd) + bh_f[j]) + fb
            if peephole:
                pre_i = pre_i + c_prev[j] * w_i[j]
                pre_f = pre_f + c_prev[j] * w_f[j]
            gate_i = sigmoid(pre_i)
            gate_ci = tanh(pre_c)
            gate_f = sigmoid(pre_f)
            state = gate_i * gate_ci + gate_f * c_prev[j]
            state = clip if state > clip else state          # NaN passes through unchanged
            state = -clip if state < -clip else state
            i_r[j] = gate_i
            cs_r[j] = state
            f_r[j] = gate_f
            ci_r[j] = gate_ci
        mean_c, rstd_c = _row_stats(cs_r, eps)
        for j in range(n_hidden):
            raw = cs_r[j]
            normed = gamma_c[j] * ((raw - mean_c) * rstd_c) + beta_c[j]
            state = normed if normalized else raw
            pre_o = a_o[j] + (gh_o[j] * ((g_o[j] - mean) * rstd) + bh_o[j])
            if peephole:
                pre_o = pre_o + state * w_o[j]
            gate_o = sigmoid(pre_o)
            state_co = tanh(normed)
            cs_r[j] = state
            o_r[j] = gate_o
            co_r[j] = state_co
            h_r[j] = gate_o * state_co


@kernel
def lstm_ln_backward_kernel(cs_prev, i, cs, f, o, ci, co, d_h, has_d_h, d_cs, has_d_cs,
                            d_fields, has_d_fields, wci,
                            wcf, wco, peephole, state_clip, mask_clip, gamma_c, epsilon,
                            normalized, gamma_h, h_hat, rstd_h, d_gates, dcs_prev, d_bias,
                            d_wci, d_wcf, d_wco, d_gamma_c, d_beta_c, d_gamma_h):
    """The layer-normalised LSTM's backward step, row by row: the gate gradients through
    the cell norm, then the recurrent part's norm (short loops, as in
    ``lstm_ln_forward_kernel``).

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``cs_prev.shape[1]``):

    - ``cs_prev``, the forward's saved ``i, cs, f, o, ci, co`` (``cs``: the carried state),
      ``d_h, has_d_h, d_cs, has_d_cs``, ``d_fields, has_d_fields``, the peepholes and
      ``mask_clip`` as for ``lstm_backward_kernel``; ``state_clip``: the forward's
      ``cell_clip`` (``math.inf`` for none), with which ``c̃`` is recomputed;
    - ``gamma_c [H]``, ``epsilon``, ``normalized`` as for ``lstm_ln_forward_kernel``;
    - ``gamma_h [4H]``; ``h_hat [B, 4H]``, ``rstd_h [B]``: ``ĥ`` and ``r`` of the step's
      ``h_prev·W_h`` (``layer_norm_stats_kernel``); **overwritten** with ``dz_h``, the
      gradient of ``h_prev·W_h``;
    - outputs, overwritten: ``d_gates [B, 4H]`` (dL/dG), ``dcs_prev [B, H]``;
    - outputs, accumulated: ``d_bias [4H]``, the peepholes' sums (when ``peephole``),
      ``d_gamma_c, d_beta_c [H]`` and ``d_gamma_h [4H]``.

    Per row (``gradcells.cells.lstm.reference``'s ``lstm_gate_grads``, ``lstm_cell_norm_grad``):
    ``c̃ = clip(i·ci + f·cs_prev, ±state_clip)``, its ``(μ_c, r_c)`` and ``ĉ``;
    ``do = (d_h·co + u_o)·o(1-o)``; ``dcs = d_cs + do·wco``; ``dn = (d_h·o + u_co)(1-co²)``
    (+ ``dcs`` when normalized); ``dc̃ = r_c·(g - mean(g) - ĉ∘mean(g∘ĉ))``, ``g = dn∘γ_c``
    (+ ``dcs`` when raw), zeroed where ``|i·ci + f·cs_prev| > mask_clip``; ``di, dci, df,
    dcs_prev`` as in ``lstm_backward_kernel`` (the gates' upstreams ``u_*`` with them);
    then ``dz_h = r_h·(g' - mean(g') - ĥ∘mean(g'∘ĥ))``,
    ``g' = dG∘γ_h``.
    """
    n_batch, n_hidden = cs_prev.shape
    zero = typed(0.0, cs_prev)
    one = typed(1.0, cs_prev)
    s_clip = typed(state_clip, cs_prev)
    m_clip = typed(mask_clip, cs_prev)
    masked = mask_clip < math.inf
    eps = typed(epsilon, cs_prev)
    count = typed(max(n_hidden, 1), cs_prev)
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
        u_i, u_f, u_o, u_ci, u_co = _gate_rows(d_fields, row)
        for j in range(n_hidden):                         # c̃, in dcs_prev for now
            state = i_r[j] * ci_r[j] + f_r[j] * c_prev[j]
            state = s_clip if state > s_clip else state
            dcs_prev_r[j] = -s_clip if state < -s_clip else state
        mean_c, rstd_c = _row_stats(dcs_prev_r, eps)
        for j in range(n_hidden):                         # ĉ, in dcs_prev for now
            dcs_prev_r[j] = (dcs_prev_r[j] - mean_c) * rstd_c
        # do (dg_o), the carried state's gradient (dg_f), dn (dg_c)
        if has_d_h and has_d_fields:
            for j in range(n_hidden):
                dg_o[j] = (dh_r[j] * co_r[j] + u_o[j]) * o_r[j] * (one - o_r[j])
        elif has_d_fields:
            for j in range(n_hidden):
                dg_o[j] = u_o[j] * o_r[j] * (one - o_r[j])
        elif has_d_h:
            for j in range(n_hidden):
                dg_o[j] = dh_r[j] * co_r[j] * o_r[j] * (one - o_r[j])
        else:
            for j in range(n_hidden):
                dg_o[j] = zero
        if has_d_cs:
            for j in range(n_hidden):
                dg_f[j] = dcs_r[j]
        else:
            for j in range(n_hidden):
                dg_f[j] = zero
        if peephole:
            for j in range(n_hidden):
                dg_f[j] = dg_f[j] + dg_o[j] * w_o[j]
        if has_d_h and has_d_fields:
            for j in range(n_hidden):
                dg_c[j] = (dh_r[j] * o_r[j] + u_co[j]) * (one - co_r[j] * co_r[j])
        elif has_d_fields:
            for j in range(n_hidden):
                dg_c[j] = u_co[j] * (one - co_r[j] * co_r[j])
        elif has_d_h:
            for j in range(n_hidden):
                dg_c[j] = dh_r[j] * o_r[j] * (one - co_r[j] * co_r[j])
        else:
            for j in range(n_hidden):
                dg_c[j] = zero
        if normalized:
            for j in range(n_hidden):
                dg_c[j] = dg_c[j] + dg_f[j]
        sum_g, sum_gc = _row_grad_sums(dg_c, gamma_c, dcs_prev_r)
        mean_g, mean_gc = sum_g / count, sum_gc / count
        for j in range(n_hidden):
            d_gamma_c[j] += dg_c[j] * dcs_prev_r[j]
        for j in range(n_hidden):
            d_beta_c[j] += dg_c[j]
        # dc̃ (dg_f): through the cell norm, plus the carried state's gradient when raw
        if normalized:
            for j in range(n_hidden):
                dg_f[j] = rstd_c * (dg_c[j] * gamma_c[j] - mean_g - dcs_prev_r[j] * mean_gc)
        else:
            for j in range(n_hidden):
                dg_f[j] = rstd_c * (dg_c[j] * gamma_c[j] - mean_g - dcs_prev_r[j] * mean_gc) \
                    + dg_f[j]
        if masked:
            for j in range(n_hidden):
                raw = i_r[j] * ci_r[j] + f_r[j] * c_prev[j]
                dg_f[j] = dg_f[j] if abs(raw) <= m_clip else zero
        if has_d_fields:                                  # the gates' own upstreams
            for j in range(n_hidden):
                dg_i[j] = (dg_f[j] * ci_r[j] + u_i[j]) * i_r[j] * (one - i_r[j])
            for j in range(n_hidden):
                dg_c[j] = (dg_f[j] * i_r[j] + u_ci[j]) * (one - ci_r[j] * ci_r[j])
        else:
            for j in range(n_hidden):
                dg_i[j] = dg_f[j] * ci_r[j] * i_r[j] * (one - i_r[j])
            for j in range(n_hidden):
                dg_c[j] = dg_f[j] * i_r[j] * (one - ci_r[j] * ci_r[j])
        if peephole:
            for j in range(n_hidden):
                pre_f = dg_f[j] * c_prev[j]
                if has_d_fields:
                    pre_f = pre_f + u_f[j]
                d_f = pre_f * f_r[j] * (one - f_r[j])
                dcs_prev_r[j] = dg_f[j] * f_r[j] + dg_i[j] * w_i[j] + d_f * w_f[j]
        else:
            for j in range(n_hidden):
                dcs_prev_r[j] = dg_f[j] * f_r[j]
        if has_d_fields:
            for j in range(n_hidden):
                dg_f[j] = (dg_f[j] * c_prev[j] + u_f[j]) * f_r[j] * (one - f_r[j])
        else:
            for j in range(n_hidden):
                dg_f[j] = dg_f[j] * c_prev[j] * f_r[j] * (one - f_r[j])
        for k in range(4 * n_hidden):
            d_bias[k] += dg[k]
        if peephole:
            for j in range(n_hidden):
                dw_i[j] += dg_i[j] * c_prev[j]
            for j in range(n_hidden):
                dw_f[j] += dg_f[j] * c_prev[j]
            for j in range(n_hidden):
                dw_o[j] += dg_o[j] * cs_r[j]
        _row_norm_grad(dg, gamma_h, h_hat[row], rstd_h[row], d_gamma_h)


# --------------------------------------------------------------------------------------
# forward mode: the primal's pass (or the forward's own) and the tangent's


@kernel
def lstm_tangent_kernel(t_gates, cs_prev, t_cs_prev, peepholes, t_peepholes, options, outs,
                        t_outs):
    """The LSTM step's tangent, from the primal ``lstm_forward_kernel`` wrote, one pass per
    row in two loops (as the forward's).

    ``t_gates [B, 4H]``: the tangent of the pre-activations ``G`` (icfo, bias included);
    ``cs_prev, t_cs_prev [B, H]``; ``peepholes = (wci, wcf, wco)`` and ``t_peepholes`` (their
    tangents; ``[H]``, read only when ``peephole``: otherwise any arrays of length >= H);
    ``options = (peephole, cell_clip, clipped)`` (``clipped`` False: no clipping, then
    ``cell_clip`` is never read); ``outs = (i, cs, f, o, ci, co)`` the primal; ``t_outs =
    (t_i, t_cs, t_f, t_o, t_ci, t_co, t_h)``, all ``[B, H]``, written. With σ' = s(1-s),
    tanh' = 1 - t²:

        t_i = σ'(i)·(t_Gi + t_cs_prev·wci + cs_prev·t_wci);  t_ci = tanh'(ci)·t_Gc
        t_f = σ'(f)·(t_Gf + t_cs_prev·wcf + cs_prev·t_wcf)
        t_cs = t_i·ci + i·t_ci + t_f·cs_prev + f·t_cs_prev,  0 unless |i·ci + f·cs_prev| <= clip
        t_co = tanh'(co)·t_cs;  t_o = σ'(o)·(t_Go + t_cs·wco + cs·t_wco);  t_h = t_o·co + o·t_co

    (``i·ci + f·cs_prev`` is the forward's unclipped state, recomputed with its expression;
    a NaN there gives a zero tangent under a clip, as the reference's mask does).
    """
    wci, wcf, wco = peepholes
    t_wci, t_wcf, t_wco = t_peepholes
    peephole, cell_clip, clipped = options
    i, cs, f, o, ci, co = outs
    t_i, t_cs, t_f, t_o, t_ci, t_co, t_h = t_outs
    n_batch, n_hidden = cs_prev.shape
    clip = typed(cell_clip, cs_prev)
    zero = typed(0.0, cs_prev)
    one = typed(1.0, cs_prev)
    w_i, w_f, w_o = wci[:n_hidden], wcf[:n_hidden], wco[:n_hidden]
    t_w_i, t_w_f, t_w_o = t_wci[:n_hidden], t_wcf[:n_hidden], t_wco[:n_hidden]
    for row in range(n_batch):
        t_g = t_gates[row]
        t_g_i, t_g_c = t_g[:n_hidden], t_g[n_hidden:2 * n_hidden]
        t_g_f, t_g_o = t_g[2 * n_hidden:3 * n_hidden], t_g[3 * n_hidden:]
        c_prev, t_c_prev = cs_prev[row], t_cs_prev[row]
        i_r, f_r, ci_r = i[row], f[row], ci[row]
        t_i_r, t_f_r, t_ci_r, t_cs_r = t_i[row], t_f[row], t_ci[row], t_cs[row]
        for j in range(n_hidden):
            t_pre_i = t_g_i[j]
            t_pre_f = t_g_f[j]
            if peephole:
                t_pre_i = t_pre_i + t_c_prev[j] * w_i[j] + c_prev[j] * t_w_i[j]
                t_pre_f = t_pre_f + t_c_prev[j] * w_f[j] + c_prev[j] * t_w_f[j]
            gate_i, gate_ci, gate_f = i_r[j], ci_r[j], f_r[j]
            t_gate_i = gate_i * (one - gate_i) * t_pre_i
            t_gate_ci = (one - gate_ci * gate_ci) * t_g_c[j]
            t_gate_f = gate_f * (one - gate_f) * t_pre_f
            t_state = (t_gate_i * gate_ci + gate_i * t_gate_ci + t_gate_f * c_prev[j]
                       + gate_f * t_c_prev[j])
            if clipped:
                raw = gate_i * gate_ci + gate_f * c_prev[j]
                t_state = t_state if abs(raw) <= clip else zero
            t_i_r[j] = t_gate_i
            t_ci_r[j] = t_gate_ci
            t_f_r[j] = t_gate_f
            t_cs_r[j] = t_state
        cs_r, o_r, co_r = cs[row], o[row], co[row]
        t_o_r, t_co_r, t_h_r = t_o[row], t_co[row], t_h[row]
        for j in range(n_hidden):
            t_state = t_cs_r[j]
            t_pre_o = t_g_o[j]
            if peephole:
                t_pre_o = t_pre_o + t_state * w_o[j] + cs_r[j] * t_w_o[j]
            gate_o, state_co = o_r[j], co_r[j]
            t_gate_o = gate_o * (one - gate_o) * t_pre_o
            t_state_co = (one - state_co * state_co) * t_state
            t_o_r[j] = t_gate_o
            t_co_r[j] = t_state_co
            t_h_r[j] = t_gate_o * state_co + gate_o * t_state_co


# --------------------------------------------------------------------------------------
# second order: the tangents of the backward kernel's gate gradients


# ``lstm_backward_tangent_kernel``: ``lstm_backward_kernel``'s expressions differentiated
# (primes the tangents), with σ'(s) = s(1-s), σ'(s)' = s'(1-2s), tanh'(t)' = -2t·t' (the
# upstream gradients g_h = d_h, g_cs = d_cs, and the gates' u_i, u_f, u_o, u_ci, u_co, zero
# without them):
#
#     do'  = (g_h·co + u_o)'·σ'(o) + (g_h·co + u_o)·σ'(o)'
#     dcs' = (g_h·o + u_co)'·tanh'(co) + (g_h·o + u_co)·tanh'(co)' + g_cs' + do'·wco + do·wco'
#     dcs' = 0 where the backward kernel masks dcs
#     di'  = (dcs·ci + u_i)'·σ'(i) + (dcs·ci + u_i)·σ'(i)'
#     dci' = (dcs·i + u_ci)'·tanh'(ci) + (dcs·i + u_ci)·tanh'(ci)'
#     df'  = (dcs·cs_prev + u_f)'·σ'(f) + (dcs·cs_prev + u_f)·σ'(f)'
#     dcs_prev' = (dcs·f)' + (di·wci)' + (df·wcf)'
#     Σ dG';  d_wci' += Σ (di·cs_prev)';  d_wcf' += Σ (df·cs_prev)';  d_wco' += Σ (do·cs)'


@helper
def _output_tangents(ups, gate_o, state_co, one, two):
    """``(do, t_do, dcs, t_dcs)`` before the peephole: from ``(d_h, t_d_h, d_cs, t_d_cs, u_o,
    t_u_o, u_co, t_u_co)``, ``(o, t_o)``, ``(co, t_co)`` (``lstm_backward_tangent_kernel``)."""
    (uh, t_uh, ucs, t_ucs, uo, t_uo, uco, t_uco), (go, t_go), (sc, t_sc) = (
        ups, gate_o, state_co)
    s_o = go * (one - go)
    tanh_co = one - sc * sc
    pre_o, t_pre_o = uh * sc + uo, t_uh * sc + uh * t_sc + t_uo
    pre_co, t_pre_co = uh * go + uco, t_uh * go + uh * t_go + t_uco
    return (pre_o * s_o, t_pre_o * s_o + pre_o * t_go * (one - two * go),
            pre_co * tanh_co + ucs, t_pre_co * tanh_co - pre_co * two * sc * t_sc + t_ucs)


@helper
def _gate_tangents(d_state, t_state, gates, t_gates, ups, one, two):
    """``(di, t_di, t_dci, df, t_df)`` from the cell state's gradient ``dcs`` and its tangent,
    ``gates = (i, ci, f, cs_prev)`` and their tangents ``t_gates``, and the gates' upstreams
    ``ups = (u_i, t_u_i, u_ci, t_u_ci, u_f, t_u_f)`` (``lstm_backward_tangent_kernel``)."""
    gi, gc, gf, c_p = gates
    t_gi, t_gc, t_gf, t_c_p = t_gates
    ui, t_ui, uci, t_uci, uf, t_uf = ups
    s_i = gi * (one - gi)
    s_f = gf * (one - gf)
    pre_i, t_pre_i = d_state * gc + ui, t_state * gc + d_state * t_gc + t_ui
    pre_c, t_pre_c = d_state * gi + uci, t_state * gi + d_state * t_gi + t_uci
    pre_f, t_pre_f = d_state * c_p + uf, t_state * c_p + d_state * t_c_p + t_uf
    t_di = t_pre_i * s_i + pre_i * t_gi * (one - two * gi)
    t_dci = t_pre_c * (one - gc * gc) - pre_c * two * gc * t_gc
    t_df = t_pre_f * s_f + pre_f * t_gf * (one - two * gf)
    return pre_i * s_i, t_di, t_dci, pre_f * s_f, t_df


@kernel
def lstm_backward_tangent_kernel(saved, t_saved, up, t_up, peepholes, t_peepholes, options,
                                 t_d_gates, t_dcs_prev, sums):
    """The tangent of ``lstm_backward_kernel``'s outputs, one pass per row.

    ``saved = (cs_prev, i, cs, f, o, ci, co)`` (``cs`` the step's own, unzoned state) and
    ``t_saved`` their tangents, ``[B, H]``; ``up = (d_h, d_cs, d_fields)`` the upstream
    gradients of the step's new states (``[B, H]``) and of its gates (``[5, B, H]``, as for
    ``lstm_backward_kernel``, read only when ``has_d_fields``), ``t_up`` their tangents;
    ``peepholes = (wci, wcf, wco)`` and ``t_peepholes`` (``[H]``, read only when
    ``peephole``); ``options = (peephole, cell_clip, has_d_fields)``, ``cell_clip`` the
    backward kernel's (``math.inf``: no mask).
    Writes ``t_d_gates [B, 4H]`` and ``t_dcs_prev [B, H]``, the tangents of ``dG`` and
    ``dcs_prev``; accumulates ``sums = (t_d_bias [4H], t_d_wci, t_d_wcf, t_d_wco [H])``, the
    tangents of the backward kernel's sums (the peepholes' only when ``peephole``). The
    math: the section's comment above.
    """
    cs_prev, i, cs, f, o, ci, co = saved
    t_prev, t_i, t_cs, t_f, t_o, t_ci, t_co = t_saved
    (g_h, g_cs, g_fields), (t_g_h, t_g_cs, t_g_fields) = up, t_up
    peephole, cell_clip, has_d_fields = options
    t_d_bias, t_d_wci, t_d_wcf, t_d_wco = sums
    n_batch, n_hidden = cs_prev.shape
    zero, one, two = typed(0.0, cs_prev), typed(1.0, cs_prev), typed(2.0, cs_prev)
    clip = typed(cell_clip, cs_prev)
    masked = cell_clip < math.inf
    w_i, w_f, w_o = peepholes[0][:n_hidden], peepholes[1][:n_hidden], peepholes[2][:n_hidden]
    t_w_i, t_w_f = t_peepholes[0][:n_hidden], t_peepholes[1][:n_hidden]
    t_w_o = t_peepholes[2][:n_hidden]
    for row in range(n_batch):
        t_dg = t_d_gates[row]
        t_dg_i, t_dg_c = t_dg[:n_hidden], t_dg[n_hidden:2 * n_hidden]
        t_dg_f, t_dg_o = t_dg[2 * n_hidden:3 * n_hidden], t_dg[3 * n_hidden:]
        u_i, u_f, u_o, u_ci, u_co = _gate_rows(g_fields, row)
        tu_i, tu_f, tu_o, tu_ci, tu_co = _gate_rows(t_g_fields, row)
        for j in range(n_hidden):
            c_p, t_c_p = cs_prev[row, j], t_prev[row, j]
            if has_d_fields:
                gate_ups = (u_i[j], tu_i[j], u_ci[j], tu_ci[j], u_f[j], tu_f[j])
                out_ups = (u_o[j], tu_o[j], u_co[j], tu_co[j])
            else:
                gate_ups = (zero, zero, zero, zero, zero, zero)
                out_ups = (zero, zero, zero, zero)
            gi, gf, go, gc, sc = i[row, j], f[row, j], o[row, j], ci[row, j], co[row, j]
            t_gi, t_gf, t_go = t_i[row, j], t_f[row, j], t_o[row, j]
            t_gc, t_sc = t_ci[row, j], t_co[row, j]
            uh, ucs, t_uh, t_ucs = g_h[row, j], g_cs[row, j], t_g_h[row, j], t_g_cs[row, j]
            d_o, t_do, d_state, t_state = _output_tangents(
                (uh, t_uh, ucs, t_ucs, *out_ups), (go, t_go), (sc, t_sc), one, two)
            if peephole:
                d_state = d_state + d_o * w_o[j]
                t_state = t_state + t_do * w_o[j] + d_o * t_w_o[j]
            if masked:
                raw = gi * gc + gf * c_p
                if not abs(raw) <= clip:
                    d_state = zero
                    t_state = zero
            d_i, t_di, t_dci, d_f, t_df = _gate_tangents(
                d_state, t_state, (gi, gc, gf, c_p), (t_gi, t_gc, t_gf, t_c_p), gate_ups, one,
                two)
            t_dg_i[j], t_dg_c[j], t_dg_f[j], t_dg_o[j] = t_di, t_dci, t_df, t_do
            t_prev_j = t_state * gf + d_state * t_gf
            if peephole:
                t_prev_j = (t_prev_j + t_di * w_i[j] + d_i * t_w_i[j]
                            + t_df * w_f[j] + d_f * t_w_f[j])
                t_d_wci[j] += t_di * c_p + d_i * t_c_p
                t_d_wcf[j] += t_df * c_p + d_f * t_c_p
                t_d_wco[j] += t_do * cs[row, j] + d_o * t_cs[row, j]
            t_dcs_prev[row, j] = t_prev_j
        for k in range(4 * n_hidden):
            t_d_bias[k] += t_dg[k]
