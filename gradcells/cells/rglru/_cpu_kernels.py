"""The RG-LRU's fused passes (Numba): the gates and the recurrence's terms of every step in
one pass over the ``T·B`` rows, and the gate gradients in one pass; the linear recurrence
itself is ``gradcells.cpu._scan``'s (sequential or chunked).

The math is ``gradcells.cells.rglru.reference`` (its numerically careful forms, each for
the reason given there):

    rglru_gates_kernel(p_a, p_x, x, sp, ...)   r = σ(p_a), i = σ(p_x), a = exp(-c·r∘sp),
                                               m = sqrt(-expm1(2·log a)), c_t = m∘i∘x
                                               (a reset: a = 0, c_t = i∘x; past a row's
                                               length the identity a = 1, c_t = 0)
    (gradcells.cpu._scan)                      s_t = a_t∘s_{t-1} + c_t, or its adjoint
    rglru_grad_kernel(...)                     dp_a, dp_x, g∘m∘i, and the bias and
                                               softplus(λ) sums

``cpu.py`` calls them around its block-diagonal (batched) BLAS products. Arrays are
C-contiguous, one float dtype; ``resets`` a ``[T, B]`` boolean array (``[0, 0]``: none),
``lengths`` int64 ``[B]`` (empty: every row runs all T steps).
"""

from __future__ import annotations

import numpy as np

from ...cpu._activations import typed
from ...cpu._compile import helper, kernel


@helper
def exact_sigmoid(p, one, tail):
    """σ(p) with relative precision: ``1/(1 + e)`` or ``e/(1 + e)``, ``e = exp(-|p|)``,
    0 below ``-tail`` (``reference.GATE_TAIL``; ``one``: 1 in ``p``'s dtype)."""
    if p < -tail:
        return one - one
    e = np.exp(max(-abs(p), -tail))
    return (e if p < 0 else one) / (one + e)


@helper
def decay(log_a, tail):
    """``exp(log a)``, 0 below ``-tail`` (``reference.DECAY_TAIL``)."""
    return log_a - log_a if log_a < -tail else np.exp(log_a)


@kernel
def rglru_gates_kernel(p_a, p_x, x, sp, c, tails, resets, lengths, r, i, a, cc):
    """The gates of every step; writes ``r, i [T, B, H]`` (0 past a row's length) and the
    recurrence's multipliers ``a`` and terms ``cc`` (the identity past a row's length) from
    the pre-activations ``p_a, p_x`` (biases added), the running inputs ``x`` and
    ``sp = softplus(λ) [H]``; ``tails``: ``(GATE_TAIL, DECAY_TAIL)`` of the dtype."""
    n_steps, n_batch, n_hidden = r.shape
    zero, one, two = typed(0.0, r), typed(1.0, r), typed(2.0, r)
    cc_ = typed(c, r)
    gate_tail, decay_tail = typed(tails[0], r), typed(tails[1], r)
    has_resets = resets.size > 0
    for t in range(n_steps):
        for row in range(n_batch):
            r_r, i_r, a_r, c_r = r[t, row], i[t, row], a[t, row], cc[t, row]
            if lengths.size and t >= lengths[row]:
                for j in range(n_hidden):
                    r_r[j], i_r[j], a_r[j], c_r[j] = zero, zero, one, zero
                continue
            reset = has_resets and resets[t, row]
            pa_r, px_r, x_r = p_a[t, row], p_x[t, row], x[t, row]
            for j in range(n_hidden):
                gate_r = exact_sigmoid(pa_r[j], one, gate_tail)
                gate_i = exact_sigmoid(px_r[j], one, gate_tail)
                log_a = -cc_ * gate_r * sp[j]
                u = gate_i * x_r[j]
                r_r[j], i_r[j] = gate_r, gate_i
                if reset:
                    a_r[j], c_r[j] = zero, u
                else:
                    a_r[j] = decay(log_a, decay_tail)
                    c_r[j] = np.sqrt(-np.expm1(two * log_a)) * u


@kernel
def rglru_decay_kernel(r, sp, c, decay_tail, resets, lengths, a):
    """The recurrence's multipliers from the saved ``r``: ``a = exp(-c·r∘sp)``, 0 at a
    reset, 1 past a row's length (the adjoint's)."""
    n_steps, n_batch, n_hidden = r.shape
    zero, one = typed(0.0, r), typed(1.0, r)
    cc_, tail = typed(c, r), typed(decay_tail, r)
    has_resets = resets.size > 0
    for t in range(n_steps):
        for row in range(n_batch):
            a_r, r_r = a[t, row], r[t, row]
            if lengths.size and t >= lengths[row]:
                for j in range(n_hidden):
                    a_r[j] = one
            elif has_resets and resets[t, row]:
                for j in range(n_hidden):
                    a_r[j] = zero
            else:
                for j in range(n_hidden):
                    a_r[j] = decay(-cc_ * r_r[j] * sp[j], tail)


@kernel
def rglru_grad_kernel(r, i, x, h, h0, g, d_r, d_i, sp, c, bound, decay_tail, resets, lengths,
                      reverse, d_pa, d_px, dx, d_ba, d_bx, d_sp):
    """The gate gradients of every step; writes ``d_pa, d_px`` and the direct part of the
    input gradient ``dx = g∘m∘i`` (``[T, B, H]``, 0 past a row's length) and
    **accumulates** ``d_ba, d_bx`` (Σ over rows of ``d_pa``, ``d_px``) and ``d_sp`` (the
    gradient of ``softplus(λ)``). ``g``: the adjoint; ``h`` the saved states, ``h0``: each
    step's previous state as ``mingru_grad_kernel`` reads it; ``d_r``, ``d_i``: the
    upstream gradients (``[0, 0, 0]`` arrays: none); ``bound`` 0: the true derivative of
    the square root, else ``sqrt_grad_bound``.

        g_a = g∘h_prev∘a;   g_m = g∘i∘x;   q = r/sqrt(z*)   (0 at a reset)
        dp_a = (d_r - c·sp∘g_a)∘r(1-r) + c·sp∘a²∘(1-r)∘q∘g_m
        dp_x = (d_i + g∘m∘x)∘i(1-i);   d_sp += c·a²∘q∘g_m - c·r∘g_a
    """
    n_steps, n_batch, n_hidden = r.shape
    zero, one, two = typed(0.0, r), typed(1.0, r), typed(2.0, r)
    cc_, tail = typed(c, r), typed(decay_tail, r)
    floor = typed(1.0 / (4.0 * bound * bound) if bound > 0 else 0.0, r)
    has_dr, has_di, has_resets = d_r.size > 0, d_i.size > 0, resets.size > 0
    for t in range(n_steps):
        for row in range(n_batch):
            dpa_r, dpx_r, dx_r = d_pa[t, row], d_px[t, row], dx[t, row]
            length = lengths[row] if lengths.size else n_steps
            if t >= length:
                for j in range(n_hidden):
                    dpa_r[j], dpx_r[j], dx_r[j] = zero, zero, zero
                continue
            reset = has_resets and resets[t, row]
            first = t == length - 1 if reverse else t == 0
            prev = h0[row] if first else h[t + 1, row] if reverse else h[t - 1, row]
            r_r, i_r, x_r, g_r = r[t, row], i[t, row], x[t, row], g[t, row]
            for j in range(n_hidden):
                gate_r, gate_i, g_j = r_r[j], i_r[j], g_r[j]
                log_a = -cc_ * gate_r * sp[j]
                a = decay(log_a, tail)
                z = -np.expm1(two * log_a)
                up_r = d_r[t, row, j] if has_dr else zero
                up_i = d_i[t, row, j] if has_di else zero
                if reset:
                    m, g_a, g_m = one, zero, zero
                else:
                    m, g_a, g_m = np.sqrt(z), g_j * prev[j] * a, g_j * gate_i * x_r[j]
                root = np.sqrt(max(z, floor))
                q = gate_r / root if root > zero else zero
                dpa_r[j] = ((up_r - cc_ * sp[j] * g_a) * gate_r * (one - gate_r)
                            + cc_ * sp[j] * a * a * (one - gate_r) * q * g_m)
                dpx_r[j] = (up_i + g_j * m * x_r[j]) * gate_i * (one - gate_i)
                dx_r[j] = g_j * m * gate_i
                d_sp[j] += cc_ * a * a * q * g_m - cc_ * gate_r * g_a
                d_ba[j] += dpa_r[j]
                d_bx[j] += dpx_r[j]
