"""The minLSTM's fused passes (Numba): the gates of every step in one pass over the ``T·B``
rows and the gate gradients in one pass; the linear recurrence between them is the shared
scan (``gradcells.cpu._scan``, as the minGRU's).

The math is ``gradcells.cells.minlstm.reference``:

    minlstm_gates_kernel(p, ...)     e = softplus(-p_f) - softplus(-p_i), i' = σ(e),
                                     f' = 1 - i', h̃ = act(p_h), a = f', c = i'∘h̃
                                     (the identity a = 1, c = 0 past a row's length)
    minlstm_grad_kernel(...)         dp = [dp_f, dp_i, dp_h] from the adjoint g, and the
                                     bias sum

``cpu.py`` calls them around its BLAS products. Arrays are C-contiguous, one float dtype.
"""

from __future__ import annotations

import numpy as np

from ...cpu._activations import sigmoid, typed
from ...cpu._compile import helper, kernel


@helper
def softplus_neg(v, zero, tail):
    """``softplus(-v) = max(-v, 0) + log1p(exp(-min(|v|, tail)))`` in ``v``'s precision (the
    reference's ``softplus``, ``tail`` its ``SOFTPLUS_TAIL``): no overflow, no underflow."""
    return max(-v, zero) + np.log1p(np.exp(-min(abs(v), tail)))


@kernel
def minlstm_gates_kernel(p, lengths, identity, f, i, hc, a, c):
    """The gates of every step; writes ``f, i, hc, a, c [T, B, H]`` from ``p [T, B, 3H]``
    (the pre-activations, bias added). ``lengths [B]`` (int64; empty: every row runs all T
    steps): past a row's length ``f = i = hc = c = 0`` and ``a = 1``, the identity step.
    ``identity``: h̃ = p_h, else the paper's ``g``."""
    n_steps, n_batch, n_hidden = f.shape
    zero, one, half, tail = typed(0.0, f), typed(1.0, f), typed(0.5, f), typed(40.0, f)
    for t in range(n_steps):
        for row in range(n_batch):
            f_r, i_r, hc_r, a_r, c_r = f[t, row], i[t, row], hc[t, row], a[t, row], c[t, row]
            if lengths.size and t >= lengths[row]:
                for j in range(n_hidden):
                    f_r[j], i_r[j], hc_r[j], a_r[j], c_r[j] = zero, zero, zero, one, zero
                continue
            p_r = p[t, row]
            for j in range(n_hidden):
                gate = sigmoid(softplus_neg(p_r[j], zero, tail)
                               - softplus_neg(p_r[n_hidden + j], zero, tail))
                v = p_r[2 * n_hidden + j]
                cand = v if identity else (v + half if v >= zero else sigmoid(v))
                f_r[j], i_r[j], hc_r[j] = one - gate, gate, cand
                a_r[j], c_r[j] = one - gate, gate * cand


@kernel
def minlstm_grad_kernel(p, f, i, hc, h, h0, g, d_f, d_i, d_hc, lengths, reverse, identity,
                        d_p, d_bias):
    """The gate gradients of every step; writes ``d_p [T, B, 3H]`` and **accumulates**
    ``d_bias [3H]`` (Σ over rows). ``p [T, B, 3H]``: the recomputed pre-activations; ``g
    [T, B, H]``: the adjoint, the gradient of each step's state; ``h`` the saved states
    (zero past a row's length), ``h0 [B, H]``: each step's previous state is ``h[t-1]``
    (``h[t+1]`` with ``reverse``; ``h0`` at the row's first step); ``d_f``, ``d_i``,
    ``d_hc``: the upstream gradients (``[0, 0, 0]`` arrays: none). ``lengths`` as
    ``minlstm_gates_kernel``; past a row's length ``d_p = 0``.

        de = (d_i - d_f + g∘(h̃ - h_prev))∘f'∘i'
        dp_f = -de∘σ(-p_f);   dp_i = de∘σ(-p_i);   dp_h = (d_hc + g∘i')∘act'(p_h)
    """
    n_steps, n_batch, n_hidden = f.shape
    zero, one = typed(0.0, f), typed(1.0, f)
    has_df, has_di, has_dhc = d_f.size > 0, d_i.size > 0, d_hc.size > 0
    for t in range(n_steps):
        for row in range(n_batch):
            dp_r = d_p[t, row]
            length = lengths[row] if lengths.size else n_steps
            if t >= length:
                for j in range(3 * n_hidden):
                    dp_r[j] = zero
                continue
            first = t == length - 1 if reverse else t == 0
            prev = h0[row] if first else h[t + 1, row] if reverse else h[t - 1, row]
            f_r, i_r, hc_r, g_r, p_r = f[t, row], i[t, row], hc[t, row], g[t, row], p[t, row]
            for j in range(n_hidden):
                up = g_r[j] * (hc_r[j] - prev[j]) + (d_i[t, row, j] if has_di else zero) - (
                    d_f[t, row, j] if has_df else zero)
                de = up * f_r[j] * i_r[j]
                up_h = g_r[j] * i_r[j] + (d_hc[t, row, j] if has_dhc else zero)
                v = p_r[2 * n_hidden + j]
                slope = one if identity or v >= zero else hc_r[j] * (one - hc_r[j])
                dp_r[j] = -de * sigmoid(-p_r[j])
                dp_r[n_hidden + j] = de * sigmoid(-p_r[n_hidden + j])
                dp_r[2 * n_hidden + j] = up_h * slope
            for j in range(3 * n_hidden):
                d_bias[j] += dp_r[j]
