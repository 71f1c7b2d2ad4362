"""The minGRU on the CPU: one BLAS product for every step's gates, one fused pass for their
activations, the linear recurrence as a Numba scan (``_cpu_kernels``).

The math is ``gradcells.cells.mingru.reference``. A sequence's forward:

    p = x_flat·w + b                          one BLAS call over all T·B rows
    mingru_gates_kernel(p, ...)               z, h̃, a = 1 - z, c = z∘h̃ in one pass
    linear_scan_kernel(a, c, h0, ...)         h_t = a_t∘h_{t-1} + c_t

and its gradient:

    linear_scan_kernel(a, d_h, d_h_final, ..., post=True)     the adjoint g, and dh0
    p_h = x_flat·w_h + b_h                                     for act''s branch (g only)
    mingru_grad_kernel(...)                                    dp and the bias sum
    dx = dp·wᵀ,  dw = x_flatᵀ·dp                               two BLAS calls

``method`` "parallel" runs the scans chunked (``linear_scan_kernel``'s two-level scan,
``CHUNK`` steps a chunk, the chunks' two passes spread over the cores this process may use:
``gradcells.cpu._scan.sequence_scan``, shared with the minLSTM and the linear scan),
"sequential" step by step; "auto" as ``spec.scan_method``. With ``reverse`` and lengths the
scans run backwards in time natively (``gradcells.cpu.NATIVE_REVERSE``), the steps past each
row's length being the identity.
Forward mode is NumPy around the same kernels; second order runs the reference's
``gradient_jvp`` (dual numbers) on NumPy arrays.
"""

from __future__ import annotations

import numpy as np

from ..._core.one_step import OneStep
from ..._core.plan import flat, previous_states
from ...cpu._scan import identity_past_lengths, sequence_scan, upstream_steps
from ...cpu._sequence import (
    contiguous,
    given_or_empty,
    input_tangent,
    kernel_lengths,
    lengths_of,
    projection,
    projection_of,
    running_inputs,
    step_outputs,
    zero_stopped,
)
from ...cpu._workspace import scratch
from . import reference
from ._cpu_kernels import (
    mingru_gates_kernel,
    mingru_grad_kernel,
)
from .spec import (
    CELL,
    MinGRUSequence,
    MinGRUSequenceGrads,
)


def _gates(x, weights, settings, lengths):
    """``(x, p, z, hc, a, c)``: the running inputs, the pre-activations (scratch) and the
    gates (``z``, ``hc`` fresh arrays; ``a``, ``c`` scratch)."""
    x, w, b = (contiguous(v) for v in (x, weights.w, weights.b))
    x = running_inputs(x, lengths)
    n_steps, n_batch, _ = x.shape
    n_hidden = w.shape[1] // 2
    p, a, c = scratch(x.dtype, (n_steps, n_batch, 2 * n_hidden),
                      *[(n_steps, n_batch, n_hidden)] * 2)
    projection(x, w, b, p)
    z, hc = step_outputs(2, (n_steps, n_batch, n_hidden), x.dtype)
    mingru_gates_kernel(p, kernel_lengths(lengths), settings.activation == "identity",
                        z, hc, a, c)
    return x, p, z, hc, a, c


# --------------------------------------------------------------------------------------
# sequence


def mingru_sequence(x, h0, weights, settings):
    """The minGRU over ``x [T, B, I]``; see ``gradcells.reference``'s ``mingru_sequence``."""
    lengths = lengths_of(settings.seq_len)
    _, _, z, hc, a, c = _gates(x, weights, settings, lengths)
    h, h_final = sequence_scan(a, c, h0, settings, post=False)
    zero_stopped((h,), lengths)
    return MinGRUSequence(z, hc, h, h_final)


def mingru_sequence_grad(x, h0, weights, seq, settings, *, d_z=None, d_hc=None, d_h=None,
                         d_h_final=None):
    """Backpropagation through time for ``mingru_sequence`` (the plan in the module
    docstring)."""
    lengths = lengths_of(settings.seq_len)
    x, w, h0 = running_inputs(contiguous(x), lengths), contiguous(weights.w), contiguous(h0)
    n_steps, n_batch, _ = x.shape
    n_hidden, dtype = h0.shape[1], x.dtype
    z, hc = contiguous(seq.z), contiguous(seq.hc)
    up = upstream_steps(d_h, z.shape, dtype, lengths)
    final = np.zeros_like(h0) if d_h_final is None else d_h_final
    g, d_h0 = sequence_scan(identity_past_lengths(1 - z, lengths), up, final, settings,
                            post=True)
    identity = settings.activation == "identity"
    (d_p,) = scratch(dtype, (n_steps, n_batch, 2 * n_hidden))
    p_h = z if identity else projection_of(x, w[:, n_hidden:], weights.b[n_hidden:])
    d_bias = np.zeros(2 * n_hidden, dtype)
    mingru_grad_kernel(p_h, z, hc, contiguous(seq.h), h0, g, *given_or_empty((d_z, d_hc), dtype),
        kernel_lengths(lengths), settings.reverse, identity, d_p, d_bias)
    d_flat = flat(d_p)
    dx = (d_flat @ w.T).reshape(x.shape)
    return MinGRUSequenceGrads(x=dx, h0=d_h0, w=flat(x).T @ d_flat, b=d_bias)


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def mingru_sequence_jvp(x, h0, weights, tangents, settings):
    """``mingru_sequence`` and its tangent along ``tangents`` (a ``MinGRUSequenceGrads``,
    None fields zero): the gates' tangents in NumPy, the state's by the same scan,

        dh_t = a_t∘dh_{t-1} + dz_t∘(h̃_t - h_{t-1}) + z_t∘dh̃_t
    """
    lengths = lengths_of(settings.seq_len)
    x_run, p, z, hc, a, c = _gates(x, weights, settings, lengths)
    h, h_final = sequence_scan(a, c, h0, settings, post=False)
    n_hidden = h0.shape[1]
    dp = input_tangent(x_run, weights, tangents, lengths)
    dz = z * (1 - z) * dp[..., :n_hidden]
    slope = 1 if settings.activation == "identity" else np.where(
        p[..., n_hidden:] >= 0, 1, hc * (1 - hc))
    dhc = upstream_steps(slope * dp[..., n_hidden:], z.shape, z.dtype, lengths)
    t_h0 = np.zeros_like(h0) if tangents.h0 is None else tangents.h0
    d_h, d_final = sequence_scan(a, dz * (hc - previous_states(np, h0, h)) + z * dhc, t_h0,
                                 settings, post=False)
    zero_stopped((h, d_h), lengths)
    return MinGRUSequence(z, hc, h, h_final), MinGRUSequence(dz, dhc, d_h, d_final)


# the step: the sequence of one step (``gradcells._core.one_step``)
mingru_cell, mingru_cell_grad, mingru_cell_jvp = OneStep(
    CELL, mingru_sequence, mingru_sequence_grad, mingru_sequence_jvp).ops()


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12): the reference's, on NumPy arrays

mingru_cell_grad_jvp = reference.mingru_cell_grad_jvp
mingru_sequence_grad_jvp = reference.mingru_sequence_grad_jvp
