"""The minLSTM on the CPU: one BLAS product for every step's gates, one fused pass for their
activations, the linear recurrence as the shared Numba scan (``gradcells.cpu._scan``, the
minGRU's).

The math is ``gradcells.cells.minlstm.reference``. A sequence's forward:

    p = x_flat·w + b                          one BLAS call over all T·B rows
    minlstm_gates_kernel(p, ...)              f', i', h̃, a = f', c = i'∘h̃ in one pass
    linear_scan(a, c, h0, ...)                h_t = a_t∘h_{t-1} + c_t

and its gradient:

    linear_scan(a, d_h, d_h_final, ..., post=True)      the adjoint g, and dh0
    p = x_flat·w + b                                     recomputed: σ(-p_f), σ(-p_i), act'
    minlstm_grad_kernel(...)                             dp and the bias sum
    dx = dp·wᵀ,  dw = x_flatᵀ·dp                         two BLAS calls

``method`` "parallel" runs the scans chunked (``gradcells.cpu._scan.sequence_scan``:
``CHUNK`` steps a chunk, the chunks' passes on threads), "sequential" step by step; "auto" as
``spec.scan_method``. With ``reverse`` and lengths the scans run backwards in time natively
(``gradcells.cpu.NATIVE_REVERSE``), the steps past each row's length being the identity.
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
from ._cpu_kernels import minlstm_gates_kernel, minlstm_grad_kernel
from .spec import (
    CELL,
    MinLSTMSequence,
    MinLSTMSequenceGrads,
)


def _gates(x, weights, settings, lengths):
    """``(x, p, f, i, hc, a, c)``: the running inputs, the pre-activations (scratch) and the
    gates (``f``, ``i``, ``hc`` fresh arrays; ``a``, ``c`` scratch)."""
    x, w, b = (contiguous(v) for v in (x, weights.w, weights.b))
    x = running_inputs(x, lengths)
    n_steps, n_batch, _ = x.shape
    n_hidden = w.shape[1] // 3
    p, a, c = scratch(x.dtype, (n_steps, n_batch, 3 * n_hidden),
                      *[(n_steps, n_batch, n_hidden)] * 2)
    projection(x, w, b, p)
    f, i, hc = step_outputs(3, (n_steps, n_batch, n_hidden), x.dtype)
    minlstm_gates_kernel(p, kernel_lengths(lengths), settings.activation == "identity",
                         f, i, hc, a, c)
    return x, p, f, i, hc, a, c


# --------------------------------------------------------------------------------------
# sequence


def minlstm_sequence(x, h0, weights, settings):
    """The minLSTM over ``x [T, B, I]``; see ``gradcells.reference``'s
    ``minlstm_sequence``."""
    lengths = lengths_of(settings.seq_len)
    _, _, f, i, hc, a, c = _gates(x, weights, settings, lengths)
    h, h_final = sequence_scan(a, c, h0, settings, post=False)
    zero_stopped((h,), lengths)
    return MinLSTMSequence(f, i, hc, h, h_final)


def minlstm_sequence_grad(x, h0, weights, seq, settings, *, d_f=None, d_i=None, d_hc=None,
                          d_h=None, d_h_final=None):
    """Backpropagation through time for ``minlstm_sequence`` (the plan in the module
    docstring)."""
    lengths = lengths_of(settings.seq_len)
    x, w, h0 = running_inputs(contiguous(x), lengths), contiguous(weights.w), contiguous(h0)
    dtype = x.dtype
    f, i, hc = contiguous(seq.f), contiguous(seq.i), contiguous(seq.hc)
    up = upstream_steps(d_h, i.shape, dtype, lengths)
    final = np.zeros_like(h0) if d_h_final is None else d_h_final
    g, d_h0 = sequence_scan(identity_past_lengths(1 - i, lengths), up, final, settings,
                            post=True)
    p = projection_of(x, w, weights.b)
    d_p = np.empty_like(p)
    d_bias = np.zeros(p.shape[2], dtype)
    minlstm_grad_kernel(p, f, i, hc, contiguous(seq.h), h0, g,
                        *given_or_empty((d_f, d_i, d_hc), dtype), kernel_lengths(lengths),
                        settings.reverse, settings.activation == "identity", d_p, d_bias)
    d_flat = flat(d_p)
    dx = (d_flat @ w.T).reshape(x.shape)
    return MinLSTMSequenceGrads(x=dx, h0=d_h0, w=flat(x).T @ d_flat, b=d_bias)


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def _sigmoid(v):
    return 0.5 * np.tanh(0.5 * v) + 0.5


def minlstm_sequence_jvp(x, h0, weights, tangents, settings):
    """``minlstm_sequence`` and its tangent along ``tangents`` (a ``MinLSTMSequenceGrads``,
    None fields zero): the gates' tangents in NumPy, the state's by the same scan,

        di' = f'∘i'∘(σ(-p_i)∘dp_i - σ(-p_f)∘dp_f);   df' = -di'
        dh_t = f'_t∘dh_{t-1} + di'_t∘(h̃_t - h_{t-1}) + i'_t∘dh̃_t
    """
    lengths = lengths_of(settings.seq_len)
    x_run, p, f, i, hc, a, c = _gates(x, weights, settings, lengths)
    h, h_final = sequence_scan(a, c, h0, settings, post=False)
    n_hidden = h0.shape[1]
    dp = input_tangent(x_run, weights, tangents, lengths)
    di = f * i * (_sigmoid(-p[..., n_hidden:2 * n_hidden]) * dp[..., n_hidden:2 * n_hidden]
                  - _sigmoid(-p[..., :n_hidden]) * dp[..., :n_hidden])
    slope = 1 if settings.activation == "identity" else np.where(
        p[..., 2 * n_hidden:] >= 0, 1, hc * (1 - hc))
    dhc = upstream_steps(slope * dp[..., 2 * n_hidden:], i.shape, i.dtype, lengths)
    t_h0 = np.zeros_like(h0) if tangents.h0 is None else tangents.h0
    d_h, d_final = sequence_scan(a, di * (hc - previous_states(np, h0, h)) + i * dhc, t_h0,
                                 settings, post=False)
    zero_stopped((h, d_h), lengths)
    return MinLSTMSequence(f, i, hc, h, h_final), MinLSTMSequence(-di, di, dhc, d_h, d_final)


# the step: the sequence of one step (``gradcells._core.one_step``)
minlstm_cell, minlstm_cell_grad, minlstm_cell_jvp = OneStep(
    CELL, minlstm_sequence, minlstm_sequence_grad, minlstm_sequence_jvp).ops()


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12): the reference's, on NumPy arrays

minlstm_cell_grad_jvp = reference.minlstm_cell_grad_jvp
minlstm_sequence_grad_jvp = reference.minlstm_sequence_grad_jvp
