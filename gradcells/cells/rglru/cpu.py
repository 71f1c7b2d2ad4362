"""The RG-LRU on the CPU: one batched BLAS product per gate for every step (the
block-diagonal weights as N matrices), one fused pass for the gates and the recurrence's
terms, the linear recurrence as a Numba scan (``gradcells.cpu._scan``, shared with the
minGRU and the minLSTM).

The math is ``gradcells.cells.rglru.reference``. A sequence's forward:

    p_a = x·W_a + b_a,  p_x = x·W_x + b_x      two batched BLAS calls over all T·B rows
    rglru_gates_kernel(...)                    r, i, a, c_t = m∘i∘x in one pass
    linear_scan(a, c, h0, ...)                 h_t = a_t∘h_{t-1} + c_t

and its gradient:

    rglru_decay_kernel(r, ...)                 the multipliers a (no product recomputed)
    linear_scan(a, d_h, d_h_final, post=True)  the adjoint g, and dh0
    rglru_grad_kernel(...)                     dp_a, dp_x, g∘m∘i, the sums
    dx += dp·Wᵀ,  dW = xᵀ·dp                   four batched BLAS calls

``method`` "parallel" runs the scans chunked, "sequential" step by step, "auto" as the
CPU resolves it (``gradcells.cpu._scan.sequence_scan``). With ``reverse`` and lengths the
scans run backwards in time natively (``gradcells.cpu.NATIVE_REVERSE``), ``resets`` at their
time positions. Forward mode and second order run the reference's formulas on NumPy arrays
(the forward mode's products are BLAS calls there too).
"""

from __future__ import annotations

import numpy as np

from ..._core.one_step import OneStep
from ...cpu._scan import sequence_scan
from ...cpu._sequence import (
    contiguous,
    given_or_empty,
    kernel_lengths,
    lengths_of,
    running_inputs,
    zero_stopped,
)
from . import reference
from ._cpu_kernels import rglru_decay_kernel, rglru_gates_kernel, rglru_grad_kernel
from .spec import (
    CELL,
    RGLRUSequence,
    RGLRUSequenceGrads,
)


def _kernel_resets(settings):
    return (np.empty((0, 0), np.bool_) if settings.resets is None
            else contiguous(np.asarray(settings.resets, dtype=np.bool_)))


def block_product(x, w, out=None):
    """``x·W`` for the block-diagonal ``W`` of ``w [N, H/N, H/N]`` over ``x [T, B, H]``:
    one batched product, ``[N, T·B, H/N] @ [N, H/N, H/N]``."""
    n_steps, n_batch, width = x.shape
    n_heads = w.shape[0]
    heads = x.reshape(n_steps * n_batch, n_heads, width // max(n_heads, 1)).transpose(1, 0, 2)
    return np.matmul(heads, w).transpose(1, 0, 2).reshape(n_steps, n_batch, width)


def block_weight_grad(x, d, n_heads):
    """``[x_kᵀ·d_k]_k [N, H/N, H/N]`` over all ``T·B`` rows: one batched product."""
    rows = x.shape[0] * x.shape[1]
    width = x.shape[2] // max(n_heads, 1)
    xh = x.reshape(rows, n_heads, width).transpose(1, 2, 0)
    dh = d.reshape(rows, n_heads, width).transpose(1, 0, 2)
    return np.matmul(xh, dh)


def _tails(dtype):
    """``(GATE_TAIL, DECAY_TAIL)`` of ``dtype`` (``reference``'s)."""
    key = "float64" if np.dtype(dtype).itemsize >= 8 else "float32"
    return (reference.GATE_TAIL[key], reference.DECAY_TAIL[key])


def softplus(lam):
    """``softplus(λ)`` as the reference forms it (``reference.softplus``)."""
    return reference.softplus(np, lam)


# --------------------------------------------------------------------------------------
# sequence


def rglru_sequence(x, h0, weights, settings):
    """The RG-LRU over ``x [T, B, H]``; see ``gradcells.reference``'s ``rglru_sequence``."""
    lengths = lengths_of(settings.seq_len)
    x = running_inputs(contiguous(x), lengths)
    w_a, b_a, w_x, b_x, lam = weights
    p_a = contiguous(block_product(x, contiguous(w_a)) + b_a)
    p_x = contiguous(block_product(x, contiguous(w_x)) + b_x)
    r, i, a, c = (np.empty(x.shape, x.dtype) for _ in range(4))
    rglru_gates_kernel(p_a, p_x, x, contiguous(softplus(lam)), float(settings.c),
                       _tails(x.dtype), _kernel_resets(settings), kernel_lengths(lengths),
                       r, i, a, c)
    h, h_final = sequence_scan(a, c, contiguous(h0), settings, post=False)
    zero_stopped((h,), lengths)
    return RGLRUSequence(r, i, h, h_final)


def _upstream_steps(d, shape, dtype, lengths):
    """``d`` (zeros for None) with zeros past each row's length: a fresh array."""
    if d is None:
        return np.zeros(shape, dtype)
    out = np.array(d, dtype=dtype, order="C")
    zero_stopped((out,), lengths)
    return out


def rglru_sequence_grad(x, h0, weights, seq, settings, *, d_r=None, d_i=None, d_h=None,
                        d_h_final=None):
    """Backpropagation through time for ``rglru_sequence`` (the plan in the module
    docstring)."""
    lengths = lengths_of(settings.seq_len)
    x, h0 = running_inputs(contiguous(x), lengths), contiguous(h0)
    w_a, _, w_x, _, lam = weights
    dtype, n_hidden = x.dtype, x.shape[2]
    r, i = contiguous(seq.r), contiguous(seq.i)
    sp, resets, kl = contiguous(softplus(lam)), _kernel_resets(settings), kernel_lengths(
        lengths)
    a = np.empty(x.shape, dtype)
    tails = _tails(dtype)
    rglru_decay_kernel(r, sp, float(settings.c), tails[1], resets, kl, a)
    up = _upstream_steps(d_h, x.shape, dtype, lengths)
    final = np.zeros_like(h0) if d_h_final is None else d_h_final
    g, d_h0 = sequence_scan(a, up, contiguous(final), settings, post=True)
    d_pa, d_px, dx = (np.empty(x.shape, dtype) for _ in range(3))
    d_ba, d_bx, d_sp = (np.zeros(n_hidden, dtype) for _ in range(3))
    bound = settings.sqrt_grad_bound
    rglru_grad_kernel(r, i, x, contiguous(seq.h), h0, g, *given_or_empty((d_r, d_i), dtype),
        sp, float(settings.c), 0.0 if bound is None else float(bound), tails[1], resets, kl,
        settings.reverse, d_pa, d_px, dx, d_ba, d_bx, d_sp)
    dx += block_product(d_pa, np.ascontiguousarray(w_a.transpose(0, 2, 1)))
    dx += block_product(d_px, np.ascontiguousarray(w_x.transpose(0, 2, 1)))
    n_heads = w_a.shape[0]
    return RGLRUSequenceGrads(x=dx, h0=d_h0, w_a=block_weight_grad(x, d_pa, n_heads), b_a=d_ba,
                              w_x=block_weight_grad(x, d_px, n_heads), b_x=d_bx,
                              lam=d_sp * reference.exact_sigmoid(np, lam))


# --------------------------------------------------------------------------------------
# forward mode and second order (docs/spec.md §12): the reference's, on NumPy arrays
# (the public layer hands these time-major and forward)

rglru_sequence_jvp = reference.rglru_sequence_jvp


# the step: the sequence of one step (``gradcells._core.one_step``)
rglru_cell, rglru_cell_grad, rglru_cell_jvp = OneStep(
    CELL, rglru_sequence, rglru_sequence_grad, rglru_sequence_jvp).ops()
rglru_cell_grad_jvp = reference.rglru_cell_grad_jvp
rglru_sequence_grad_jvp = reference.rglru_sequence_grad_jvp
