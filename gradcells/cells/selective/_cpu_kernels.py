"""The selective scan's fused passes (Numba): one pass over time per (batch, channel) for the
forward, two for the backward (a forward that keeps the state at every ``CHUNK``-th step,
then the adjoint chunk by chunk from the last, each chunk's states recomputed from its
checkpoint), so that no ``[Bt, Dm, L, N]`` array is ever made: a call holds ``L/CHUNK + CHUNK``
states of ``N`` for its channel.

The math is ``gradcells.cells.selective.reference`` (its docstring derives the backward):

    selective_forward_kernel     x_t = exp(Δ_t A)∘x_{t-1} + Δ_t B_t u_t,
                                 y_t = (C_t·x_t + D u_t) silu(z_t)
    selective_backward_kernel    g_t = C_t d_p_t + exp(Δ_{t+1} A)∘g_{t+1} and every gradient

B and C arrive as ``[Bt, G, N, L]`` (ungrouped: G = 1; each its own G); channel d reads
group ``d // (Dm/G)``. Optional arrays are passed as empty arrays (``D``, ``z``, ``delta_bias``
absent). The backward runs the channels of one (batch, group) in turn, so that their sums
into ``d_B``, ``d_C`` (shared by the group) need no atomics; ``d_A``, ``d_D``,
``d_delta_bias`` are written per batch row (``[Bt, Dm, ·]``) and summed by ``cpu.py``.
Arrays are C-contiguous, one float dtype; everything is computed in that dtype.
"""

from __future__ import annotations

import math

import numpy as np

from ...cpu._activations import typed
from ...cpu._compile import helper, kernel

CHUNK = 64
"""Steps between the backward's checkpoints of the state."""


@helper
def _sigmoid(r):
    """σ(r), overflow-free (the reference's formula)."""
    e = math.exp(-abs(r))
    return 1 / (1 + e) if r >= 0 else e / (1 + e)


@helper
def _softplus(r):
    """log(1 + exp(r)), overflow-free."""
    return max(r, 0 * r) + math.log1p(math.exp(-abs(r)))


@helper
def _step_size(delta, bias, use_bias, use_softplus, b, d, t):
    """``(r, Δ)`` of step t of channel (b, d)."""
    r = delta[b, d, t] + bias[d] if use_bias else delta[b, d, t]
    return r, (_softplus(r) if use_softplus else r)


@kernel
def selective_forward_kernel(u, delta, A, B, C, D, z, bias, use_D, use_z, use_bias,
                             use_softplus, reverse, y, last):
    """Writes ``y [Bt, Dm, L]`` and ``last [Bt, Dm, N]`` (the state after the last step)."""
    n_batch, channels, n_steps = u.shape
    n_state = A.shape[1]
    per_group = channels // B.shape[1]
    per_group_c = channels // C.shape[1]
    x = np.zeros(n_state, dtype=u.dtype)
    for b in range(n_batch):
        for d in range(channels):
            grp = d // per_group
            grc = d // per_group_c
            x[:] = 0
            for k in range(n_steps):
                t = n_steps - 1 - k if reverse else k
                _, step = _step_size(delta, bias, use_bias, use_softplus, b, d, t)
                drive = step * u[b, d, t]
                acc = typed(0.0, x)
                for n in range(n_state):
                    x[n] = math.exp(step * A[d, n]) * x[n] + drive * B[b, grp, n, t]
                    acc += C[b, grc, n, t] * x[n]
                if use_D:
                    acc += D[d] * u[b, d, t]
                if use_z:
                    acc *= z[b, d, t] * _sigmoid(z[b, d, t])
                y[b, d, t] = acc
            last[b, d, :] = x


@helper
def _run(u, delta, A, B, bias, use_bias, use_softplus, reverse, b, d, grp, k0, k1, states):
    """Steps k0..k1-1 (run order) of channel (b, d) from ``states[0]``: ``states[j + 1]``
    is x after step k0 + j."""
    n_steps = u.shape[2]
    for k in range(k0, k1):
        t = n_steps - 1 - k if reverse else k
        _, step = _step_size(delta, bias, use_bias, use_softplus, b, d, t)
        drive = step * u[b, d, t]
        j = k - k0
        for n in range(A.shape[1]):
            states[j + 1, n] = math.exp(step * A[d, n]) * states[j, n] + drive * B[b, grp, n, t]


@helper
def _checkpoints(u, delta, A, B, bias, use_bias, use_softplus, reverse, b, d, grp, marks,
                 states):
    """Pass 1: the forward of channel (b, d), ``marks[c]`` the state before chunk c."""
    states[0, :] = 0
    for c in range(marks.shape[0]):
        marks[c, :] = states[0]
        k0 = c * CHUNK
        k1 = min(k0 + CHUNK, u.shape[2])
        _run(u, delta, A, B, bias, use_bias, use_softplus, reverse, b, d, grp, k0, k1, states)
        states[0, :] = states[k1 - k0]


@helper
def _adjoint_step(u, delta, A, B, C, D, z, bias, use_D, use_z, use_bias, use_softplus, b, d,
                  grp, grc, t, x_prev, x, g, d_y, d_u, d_delta, d_A, d_B, d_C, d_z):
    """One step t of the adjoint of channel (b, d): ``g`` holds a_{t+1}∘g_{t+1} and leaves
    holding a_t∘g_t; writes step t's gradients, adds into ``d_A``, ``d_B``, ``d_C``.
    Returns ``(d_p u_t, d_r_t)``: the step's terms of d_D and d_delta_bias."""
    r, step = _step_size(delta, bias, use_bias, use_softplus, b, d, t)
    ut = u[b, d, t]
    p = typed(0.0, g)
    for n in range(A.shape[1]):
        p += C[b, grc, n, t] * x[n]
    if use_D:
        p += D[d] * ut
    d_p = d_y[b, d, t]
    if use_z:
        s = _sigmoid(z[b, d, t])
        d_z[b, d, t] = d_y[b, d, t] * p * s * (1 + z[b, d, t] * (1 - s))
        d_p = d_y[b, d, t] * z[b, d, t] * s
    du = D[d] * d_p if use_D else typed(0.0, g)
    d_step = typed(0.0, g)
    for n in range(A.shape[1]):
        g[n] += C[b, grc, n, t] * d_p
        d_C[b, grc, n, t] += d_p * x[n]
        d_B[b, grp, n, t] += g[n] * step * ut
        du += g[n] * step * B[b, grp, n, t]
        decay = math.exp(step * A[d, n])
        carried = g[n] * decay * x_prev[n]
        d_step += g[n] * B[b, grp, n, t] * ut + carried * A[d, n]
        d_A[b, d, n] += carried * step
        g[n] = decay * g[n]
    if use_softplus:
        d_step = d_step * _sigmoid(r)
    d_u[b, d, t] = du
    d_delta[b, d, t] = d_step
    return d_p * ut, d_step


@kernel
def selective_backward_kernel(u, delta, A, B, C, D, z, bias, use_D, use_z, use_bias,
                              use_softplus, reverse, d_y, d_last, use_d_last, d_u, d_delta,
                              d_A, d_B, d_C, d_D, d_z, d_bias):
    """Writes ``d_u, d_delta, d_z [Bt, Dm, L]`` (``d_delta``: the gradient of ``delta``, the
    raw step size), ``d_B, d_C [Bt, G, N, L]`` (zeroed here) and the per-batch-row partial
    sums ``d_A [Bt, Dm, N]``, ``d_D, d_bias [Bt, Dm]``. ``d_last [Bt, Dm, N]`` is read only
    with ``use_d_last``."""
    n_batch, channels, n_steps = u.shape
    n_state = A.shape[1]
    per_group, per_group_c = channels // B.shape[1], channels // C.shape[1]
    n_chunks = (n_steps + CHUNK - 1) // CHUNK
    marks = np.zeros((n_chunks, n_state), dtype=u.dtype)      # x before each chunk
    states = np.zeros((CHUNK + 1, n_state), dtype=u.dtype)    # a chunk's states
    g = np.zeros(n_state, dtype=u.dtype)
    d_B[:] = 0
    d_C[:] = 0
    for b in range(n_batch):
        for d in range(channels):
            grp, grc = d // per_group, d // per_group_c
            _checkpoints(u, delta, A, B, bias, use_bias, use_softplus, reverse, b, d, grp,
                         marks, states)
            g[:] = 0
            if use_d_last:
                g[:] = d_last[b, d, :]
            d_A[b, d, :] = 0
            sum_D, sum_bias = typed(0.0, g), typed(0.0, g)
            for c in range(n_chunks - 1, -1, -1):     # pass 2: the adjoint, chunk by chunk
                k0 = c * CHUNK
                k1 = min(k0 + CHUNK, n_steps)
                states[0, :] = marks[c]
                _run(u, delta, A, B, bias, use_bias, use_softplus, reverse, b, d, grp, k0, k1,
                     states)
                for k in range(k1 - 1, k0 - 1, -1):
                    t = n_steps - 1 - k if reverse else k
                    dD, dr = _adjoint_step(u, delta, A, B, C, D, z, bias, use_D, use_z,
                                           use_bias, use_softplus, b, d, grp, grc, t,
                                           states[k - k0], states[k - k0 + 1], g, d_y, d_u,
                                           d_delta, d_A, d_B, d_C, d_z)
                    sum_D += dD
                    sum_bias += dr
            d_D[b, d] = sum_D if use_D else 0
            d_bias[b, d] = sum_bias
