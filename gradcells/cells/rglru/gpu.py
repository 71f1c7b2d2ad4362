"""The RG-LRU on the GPU: ``rglru.cu``'s kernels and the shared ``gated_scan``
(``gradcells/gpu/scan.cu``, the minGRU's and the minLSTM's) around batched cuBLAS products.

The plan follows the CPU's (``cpu.py``): a sequence's forward is one batched product per
gate for every step's pre-activations (the block-diagonal weights as N matrices), one
``rglru_gates`` launch over the ``T·B·H`` elements (``r``, ``i``, and the scan's gate
``1 - a`` and addend ``m∘i∘x``; at a reset ``1`` and ``i∘x``), and one ``gated_scan``
launch, one thread per element of the ``[B, H]`` state running its column over time. The
gradient is ``rglru_decay_gate`` (the multipliers again, from the saved ``r``), ``gated_scan``
for the adjoint (backwards in time, ending at ``dh0``), one ``rglru_gate_grads`` launch,
the input and weight gradients as batched products and the bias and ``softplus(λ)``
gradients as column sums. Steps past a row's length are the scan's identity steps.

``gated_scan`` multiplies by ``1 - z``: with ``z = 1 - a`` that is ``a`` up to the rounding
of ``1 - a`` (half an ulp of 1, absolute). As the minGRU's, the GPU runs the recurrence as
per-(b, j) scans over time whatever ``method`` says. Forward mode and second order run the
reference's formulas on the device's arrays. A cell step is a sequence of one.
"""

from __future__ import annotations

from ..._core import plan
from ..._core.one_step import OneStep
from ...gpu import _launch
from ...gpu._launch import Launcher, column_sum, contiguous
from . import reference
from .spec import CELL, RGLRUSequence, RGLRUSequenceGrads


def _tails(dtype):
    """``(GATE_TAIL, DECAY_TAIL)`` of ``dtype`` (``reference``'s; float16 as float32)."""
    key = "float64" if dtype.itemsize >= 8 else "float32"
    return reference.GATE_TAIL[key], reference.DECAY_TAIL[key]


def block_product(xp, x, w):
    """``x·W`` for the block-diagonal ``W`` of ``w [N, H/N, H/N]`` over ``x [T, B, H]``: one
    batched product, as a C-contiguous ``[T, B, H]``."""
    n_steps, n_batch, width = x.shape
    n_heads = w.shape[0]
    heads = x.reshape(n_steps * n_batch, n_heads, width // max(n_heads, 1)).transpose(1, 0, 2)
    return xp.ascontiguousarray(
        xp.matmul(heads, w).transpose(1, 0, 2).reshape(n_steps, n_batch, width))


def block_weight_grad(xp, x, d, n_heads):
    """``[x_kᵀ·d_k]_k [N, H/N, H/N]`` over all ``T·B`` rows: one batched product."""
    rows = x.shape[0] * x.shape[1]
    width = x.shape[2] // max(n_heads, 1)
    return xp.matmul(x.reshape(rows, n_heads, width).transpose(1, 2, 0),
                     d.reshape(rows, n_heads, width).transpose(1, 0, 2))


def _resets(xp, settings):
    """``(flags, use)``: the resets as a contiguous int32 ``[T, B]`` array (an empty one
    without)."""
    if settings.resets is None:
        return xp.empty(0, dtype=xp.int32), False
    return xp.ascontiguousarray(xp.asarray(settings.resets), dtype=xp.int32), True


def _scan(rt, z, add, s0, lengths, *, post, backward):
    """One ``gated_scan`` launch with the gate ``z = 1 - a``: ``(out [T, B, H], s_final)``."""
    xp = rt.xp
    n_steps, n_batch, n_hidden = z.shape
    out, final = xp.empty_like(z), xp.empty((n_batch, n_hidden), dtype=z.dtype)
    Launcher(rt, "gated_scan", z.dtype, n_batch * n_hidden)(
        z=z, c=add, s0=xp.ascontiguousarray(s0, dtype=z.dtype),
        seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        use_gated=False, use_post=post, use_backward=backward, n_steps=n_steps,
        batch=n_batch, hidden=n_hidden, out=out, s_final=final)
    return out, final


def _softplus(xp, lam):
    return xp.ascontiguousarray(reference.softplus(xp, lam))


# --------------------------------------------------------------------------------------
# sequence


def rglru_sequence(x, h0, weights, settings):
    """The RG-LRU over ``x [T, B, H]``; see ``gradcells.reference``'s ``rglru_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _forward(rt, x, h0, weights, settings)


def _forward(rt, x, h0, weights, settings):
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = xp.ascontiguousarray(plan.running_inputs(xp, x, lengths))
    n_steps, n_batch, n_hidden = x.shape
    p_a = block_product(xp, x, weights.w_a) + weights.b_a
    p_x = block_product(xp, x, weights.w_x) + weights.b_x
    r, i, z, add = (xp.empty(x.shape, dtype=x.dtype) for _ in range(4))
    flags, use_resets = _resets(xp, settings)
    gate_tail, decay_tail = _tails(x.dtype)
    Launcher(rt, "rglru_gates", x.dtype, n_steps * n_batch * n_hidden)(
        p_a=xp.ascontiguousarray(p_a), p_x=xp.ascontiguousarray(p_x), x=x,
        sp=_softplus(xp, weights.lam), resets=flags,
        seq_len=_launch.lengths_argument(xp, lengths), use_resets=use_resets,
        use_seq_len=lengths is not None, c=settings.c, gate_tail=gate_tail,
        decay_tail=decay_tail, n_steps=n_steps, batch=n_batch, hidden=n_hidden, r=r, i=i,
        z=z, add=add)
    h, h_final = _scan(rt, z, add, h0, lengths, post=False, backward=settings.reverse)
    return RGLRUSequence(r, i, h, h_final)


def rglru_sequence_grad(x, h0, weights, seq, settings, *, d_r=None, d_i=None, d_h=None,
                        d_h_final=None):
    """Backpropagation through time for ``rglru_sequence`` (the plan in the module
    docstring)."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _backward(rt, x, h0, weights, seq, settings, (d_r, d_i, d_h, d_h_final))


def _backward(rt, x, h0, weights, seq, settings, upstream):
    xp = rt.xp
    d_r, d_i, d_h, d_h_final = (contiguous(xp, d) for d in upstream)
    lengths = _launch.lengths(xp, settings.seq_len)
    x = xp.ascontiguousarray(plan.running_inputs(xp, x, lengths))
    n_steps, n_batch, n_hidden = x.shape
    r, i, h = (xp.ascontiguousarray(a) for a in (seq.r, seq.i, seq.h))
    h0 = xp.ascontiguousarray(h0)
    sp = _softplus(xp, weights.lam)
    flags, use_resets = _resets(xp, settings)
    _, decay_tail = _tails(x.dtype)
    n = n_steps * n_batch * n_hidden
    z = xp.empty_like(x)
    Launcher(rt, "rglru_decay_gate", x.dtype, n)(
        r=r, sp=sp, resets=flags, use_resets=use_resets, c=settings.c, decay_tail=decay_tail,
        n_steps=n_steps, batch=n_batch, hidden=n_hidden, z=z)
    g, d_h0 = _scan(rt, z, xp.zeros_like(x) if d_h is None else d_h,
                    xp.zeros_like(h0) if d_h_final is None else d_h_final, lengths,
                    post=True, backward=not settings.reverse)
    bound = settings.sqrt_grad_bound
    d_pa, d_px, dx, d_spe = (xp.empty_like(x) for _ in range(4))
    Launcher(rt, "rglru_gate_grads", x.dtype, n)(
        r=r, i=i, x=x, h=h, h0=h0, g=g, d_r=r if d_r is None else d_r,
        d_i=i if d_i is None else d_i, sp=sp, resets=flags,
        seq_len=_launch.lengths_argument(xp, lengths), has_d_r=d_r is not None,
        has_d_i=d_i is not None, use_resets=use_resets, use_seq_len=lengths is not None,
        use_backward=settings.reverse, c=settings.c,
        floor=0.0 if bound is None else 1 / (4 * bound * bound), decay_tail=decay_tail,
        n_steps=n_steps, batch=n_batch, hidden=n_hidden, d_pa=d_pa, d_px=d_px, dx=dx,
        d_spe=d_spe)
    w_a, w_x = weights.w_a, weights.w_x
    dx = (dx + block_product(xp, d_pa, w_a.transpose(0, 2, 1))
          + block_product(xp, d_px, w_x.transpose(0, 2, 1)))
    n_heads = w_a.shape[0]
    return RGLRUSequenceGrads(
        x=dx, h0=d_h0, w_a=block_weight_grad(xp, x, d_pa, n_heads),
        b_a=column_sum(rt, plan.flat(d_pa)), w_x=block_weight_grad(xp, x, d_px, n_heads),
        b_x=column_sum(rt, plan.flat(d_px)),
        lam=column_sum(rt, plan.flat(d_spe)) * reference.exact_sigmoid(xp, weights.lam))


# --------------------------------------------------------------------------------------
# forward mode and second order (docs/spec.md §12): the reference's, on the device's arrays

rglru_sequence_jvp = reference.rglru_sequence_jvp


# the step: the sequence of one step (``gradcells._core.one_step``)
rglru_cell, rglru_cell_grad, rglru_cell_jvp = OneStep(
    CELL, rglru_sequence, rglru_sequence_grad, rglru_sequence_jvp).ops()
rglru_cell_grad_jvp = reference.rglru_cell_grad_jvp
rglru_sequence_grad_jvp = reference.rglru_sequence_grad_jvp
