"""The minGRU's fused passes (Numba): the gates of every step in one pass over the ``T·B``
rows, the linear recurrence as a sequential or a chunked scan, and the gate gradients in one
pass.

The math is ``gradcells.cells.mingru.reference``:

    mingru_gates_kernel(p, ...)          z = σ(p_z), h̃ = act(p_h), a = 1 - z, c = z∘h̃
                                         (the identity a = 1, c = 0 past a row's length)
    linear_scan_kernel(a, c, s0, ...)    s_t = a_t∘s_{t-1} + c_t, or its adjoint's form
    mingru_grad_kernel(...)              dp = [dp_z, dp_h] from g, and the bias sum

``cpu.py`` calls them around its BLAS products. Arrays are C-contiguous, one float dtype.
"""

from __future__ import annotations

import numpy as np

from ...cpu._activations import sigmoid, typed
from ...cpu._compile import helper, kernel


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


@helper
def _time(position, n_steps, backward):
    return n_steps - 1 - position if backward else position


@helper
def _run(a, c, s, backward, post, first, last, out, write):
    """Positions ``first..last-1`` of the run order from the state ``s [N]`` (updated in
    place); writes each step's output into ``out`` when ``write``. ``post`` False:
    ``s = a∘s + c``, the output ``s``; True (the adjoint): the output ``s + c``, then
    ``s = a∘(s + c)``."""
    n_steps, n = a.shape
    for position in range(first, last):
        t = _time(position, n_steps, backward)
        a_t, c_t, o_t = a[t], c[t], out[t]
        if post:
            for j in range(n):
                v = s[j] + c_t[j]
                if write:
                    o_t[j] = v
                s[j] = a_t[j] * v
        else:
            for j in range(n):
                s[j] = a_t[j] * s[j] + c_t[j]
                if write:
                    o_t[j] = s[j]


@kernel
def linear_scan_kernel(a, c, s0, backward, post, chunk, out, s_final):
    """The linear recurrence over ``a, c [T, N]`` from ``s0 [N]`` in the run order
    (``backward``: from time T-1 down to 0); writes every step's output into ``out [T, N]``
    and the state after the last step into ``s_final [N]``. ``post`` as ``_run``.

    ``chunk`` 0 (or at least T): sequential. Otherwise the chunked two-level scan, on the
    calling thread: (1) ``scan_maps_kernel``: each chunk of ``chunk`` consecutive steps
    reduced to its affine map ``s -> A∘s + C``, (2) ``scan_carries_kernel``: a sequential
    pass over the chunks' maps gives each chunk's incoming state, (3)
    ``scan_chunks_kernel``: each chunk scanned again from its incoming state, writing the
    outputs. Steps (1) and (3) are independent per chunk (``cpu.py`` runs them on threads
    over ranges of chunks); within a chunk the outputs are the sequential scan's from that
    chunk's incoming state, which differs from the sequential method's only by the rounding
    of the composed maps."""
    n_steps, n = a.shape
    if chunk <= 0 or chunk >= n_steps:
        s_final[:] = s0
        _run(a, c, s_final, backward, post, 0, n_steps, out, True)
        return
    n_chunks = (n_steps + chunk - 1) // chunk
    agg_a, agg_c = np.empty((n_chunks, n), a.dtype), np.empty((n_chunks, n), a.dtype)
    carries = np.empty((n_chunks, n), a.dtype)
    scan_maps_kernel(a, c, backward, post, chunk, 0, n_chunks, agg_a, agg_c)
    scan_carries_kernel(agg_a, agg_c, s0, carries, s_final)
    scan_chunks_kernel(a, c, backward, post, chunk, 0, n_chunks, carries, out, s_final)


@kernel
def scan_maps_kernel(a, c, backward, post, chunk, first, last, agg_a, agg_c):
    """Step (1) of ``linear_scan_kernel`` for the chunks ``first..last-1``: each chunk's map
    ``s -> agg_a[k]∘s + agg_c[k]`` (``agg_c``: the chunk scanned from 0; ``agg_a``: its
    multipliers' product)."""
    n_steps, n = a.shape
    for k in range(first, last):
        lo, hi = k * chunk, min((k + 1) * chunk, n_steps)
        agg_c[k] = 0
        _run(a, c, agg_c[k], backward, post, lo, hi, a, False)   # a: never written
        product = agg_a[k]
        product[:] = 1
        for position in range(lo, hi):
            a_t = a[_time(position, n_steps, backward)]
            for j in range(n):
                product[j] *= a_t[j]


@kernel
def scan_carries_kernel(agg_a, agg_c, s0, carries, s_final):
    """Step (2) of ``linear_scan_kernel``: each chunk's incoming state ``carries[k]``, from
    ``s0`` through the maps of the chunks before it; ``s_final``: through all of them."""
    n_chunks, n = agg_a.shape
    s_final[:] = s0
    for k in range(n_chunks):
        carries[k] = s_final
        for j in range(n):
            s_final[j] = agg_a[k, j] * s_final[j] + agg_c[k, j]


@kernel
def scan_chunks_kernel(a, c, backward, post, chunk, first, last, carries, out, s_final):
    """Step (3) of ``linear_scan_kernel`` for the chunks ``first..last-1``: each scanned from
    ``carries[k]`` (updated in place), writing ``out``; the last chunk's own last state
    into ``s_final`` (so that it is the last output, bitwise)."""
    n_steps = a.shape[0]
    n_chunks = carries.shape[0]
    for k in range(first, last):
        _run(a, c, carries[k], backward, post, k * chunk, min((k + 1) * chunk, n_steps),
             out, True)
        if k == n_chunks - 1:
            s_final[:] = carries[k]


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
