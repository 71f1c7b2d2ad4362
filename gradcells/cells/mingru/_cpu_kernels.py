"""The minGRU's fused passes (Numba): the gates of every step in one pass over the ``T·B``
rows, the linear recurrence as a sequential or a chunked scan, and the gate gradients in one
pass.

The math is ``gradcells.cells.mingru.reference``:

    mingru_gates_kernel(p, ...)          z = σ(p_z), h̃ = act(p_h), a = 1 - z, c = z∘h̃
                                         (the identity a = 1, c = 0 past a row's length)
    (gradcells.cpu._scan)                s_t = a_t∘s_{t-1} + c_t, or its adjoint's form
    mingru_grad_kernel(...)              dp = [dp_z, dp_h] from g, and the bias sum

``cpu.py`` calls them around its BLAS products. Arrays are C-contiguous, one float dtype.
"""

from __future__ import annotations

from ...cpu._activations import sigmoid, typed
from ...cpu._compile import kernel


@kernel
def mingru_gates_kernel(p, lengths, identity, z, hc, a, c):
    """The gates of every step; writes ``z, hc, a, c [T, B, H]`` from ``p [T, B, 2H]`` (the
    pre-activations, bias added). ``lengths [B]`` (int64; empty: every row runs all T
    steps): past a row's length ``z = hc = c = 0`` and ``a = 1``, the identity step.
    ``identity``: h̃ = p_h, else the paper's ``g``."""
    n_steps, n_batch, n_hidden = z.shape
    zero, one, half = typed(0.0, z), typed(1.0, z), typed(0.5, z)
    for t in range(n_steps):
        for row in range(n_batch):
            z_r, hc_r, a_r, c_r = z[t, row], hc[t, row], a[t, row], c[t, row]
            if lengths.size and t >= lengths[row]:
                for j in range(n_hidden):
                    z_r[j], hc_r[j], a_r[j], c_r[j] = zero, zero, one, zero
                continue
            p_r = p[t, row]
            for j in range(n_hidden):
                gate = sigmoid(p_r[j])
                v = p_r[n_hidden + j]
                cand = v if identity else (v + half if v >= zero else sigmoid(v))
                z_r[j], hc_r[j], a_r[j], c_r[j] = gate, cand, one - gate, gate * cand


@kernel
def mingru_grad_kernel(p_h, z, hc, h, h0, g, d_z, d_hc, lengths, reverse, identity, d_p,
                       d_bias):
    """The gate gradients of every step; writes ``d_p [T, B, 2H]`` and **accumulates**
    ``d_bias [2H]`` (Σ over rows). ``g [T, B, H]``: the adjoint, the gradient of each
    step's state; ``h`` the saved states (zero past a row's length), ``h0 [B, H]``: each
    step's previous state is ``h[t-1]`` (``h[t+1]`` with ``reverse``; ``h0`` at the row's
    first step); ``d_z``, ``d_hc``: the upstream gradients (``[0, 0, 0]`` arrays: none).
    ``lengths`` as ``mingru_gates_kernel``; past a row's length ``d_p = 0``.

        dp_z = (d_z + g∘(h̃ - h_prev))∘z∘(1 - z);   dp_h = (d_hc + g∘z)∘act'(p_h)
    """
    n_steps, n_batch, n_hidden = z.shape
    zero, one = typed(0.0, z), typed(1.0, z)
    has_dz, has_dhc = d_z.size > 0, d_hc.size > 0
    for t in range(n_steps):
        for row in range(n_batch):
            dp_r = d_p[t, row]
            length = lengths[row] if lengths.size else n_steps
            if t >= length:
                for j in range(2 * n_hidden):
                    dp_r[j] = zero
                continue
            first = t == length - 1 if reverse else t == 0
            prev = h0[row] if first else h[t + 1, row] if reverse else h[t - 1, row]
            z_r, hc_r, g_r, ph_r = z[t, row], hc[t, row], g[t, row], p_h[t, row]
            for j in range(n_hidden):
                up_z = g_r[j] * (hc_r[j] - prev[j]) + (d_z[t, row, j] if has_dz else zero)
                up_h = g_r[j] * z_r[j] + (d_hc[t, row, j] if has_dhc else zero)
                slope = one if identity or ph_r[j] >= zero else hc_r[j] * (one - hc_r[j])
                dp_r[j] = up_z * z_r[j] * (one - z_r[j])
                dp_r[n_hidden + j] = up_h * slope
            for j in range(2 * n_hidden):
                d_bias[j] += dp_r[j]
