"""The minLSTM on the GPU: ``minlstm.cu``'s kernels and the shared ``gated_scan``
(``gradcells/gpu/scan.cu``, the minGRU's) around cuBLAS products.

The plan follows the reference's: a sequence's forward is one product for every step's
pre-activations ``p = x_flat·w + b``, one ``minlstm_gates`` launch over the ``T·B·H``
elements (``f'``, ``i'``, ``h̃``), and one ``gated_scan`` launch with ``i'`` as its gate, one
thread per element of the ``[B, H]`` state running its column over time (``h_t = (1 -
i'_t)∘h_{t-1} + i'_t∘h̃_t``, ``1 - i' = f'``). The gradient is ``gated_scan`` again for the
adjoint (``g_t = d_h_t + f'_{t+1}∘g_{t+1}``, backwards in time, ending at ``dh0``), the
recomputed ``p`` (one product), one ``minlstm_gate_grads`` launch, ``dx`` and ``dw`` as two
products and the bias gradient a column sum. Steps past a row's length are the scan's
identity steps.

As the minGRU's, the GPU runs the recurrence as per-(b, j) scans over time whatever
``method`` says (the two methods give one function, bitwise here). Forward mode is the
forward's plan with the tangents' gates in whole-array operations and the tangent's
recurrence one more ``gated_scan``; second order runs the reference's ``gradient_jvp``
(dual numbers) on the device's arrays. A cell step is a sequence of one.
"""

from __future__ import annotations

from ..._core import plan
from ..._core.one_step import OneStep
from ..._core.scan import candidate_grad, only_running, running_steps
from ..._core.xpmath import blocks
from ...gpu import _launch
from ...gpu._launch import Launcher, column_sum, contiguous, gated_scan, matmul
from . import reference
from .spec import CELL, MinLSTMSequence, MinLSTMSequenceGrads


def _projection(xp, x, w, b):
    """``x_flat·w + b`` as a C-contiguous ``[T·B, width]``."""
    return matmul(xp, plan.flat(x), w) + b


def _forward(rt, x, h0, weights, settings):
    """``(f, i, hc, h, h_final, p, x)``: the sequence, its pre-activations and its running
    inputs."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, x, lengths)
    n_steps, n_batch, _ = x.shape
    n_hidden = h0.shape[1]
    p = _projection(xp, x, weights.w, weights.b)
    f, i, hc = (xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype) for _ in range(3))
    Launcher(rt, "minlstm_gates", x.dtype, n_steps * n_batch * n_hidden)(
        p=p, seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        use_identity=settings.activation == "identity", n_steps=n_steps, batch=n_batch,
        hidden=n_hidden, f=f, i=i, hc=hc)
    h, h_final = gated_scan(rt, i, hc, h0, lengths, gated=True, post=False,
                       backward=settings.reverse)
    return f, i, hc, h, h_final, p, x


def minlstm_sequence(x, h0, weights, settings):
    """The minLSTM over ``x [T, B, I]``; see ``gradcells.reference``'s
    ``minlstm_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return MinLSTMSequence(*_forward(rt, x, h0, weights, settings)[:5])


def minlstm_sequence_grad(x, h0, weights, seq, settings, *, d_f=None, d_i=None, d_hc=None,
                          d_h=None, d_h_final=None):
    """Backpropagation through time for ``minlstm_sequence`` (the plan in the module
    docstring)."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return MinLSTMSequenceGrads(*_backward(rt, x, h0, weights, seq, settings,
                                               (d_f, d_i, d_hc, d_h, d_h_final)))


def _backward(rt, x, h0, weights, seq, settings, upstream):
    xp = rt.xp
    d_f, d_i, d_hc, d_h, d_h_final = (contiguous(xp, d) for d in upstream)
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, x, lengths)
    n_steps, n_batch, _ = x.shape
    n_hidden = h0.shape[1]
    f, i, hc, h = (xp.ascontiguousarray(a) for a in (seq.f, seq.i, seq.hc, seq.h))
    h0 = xp.ascontiguousarray(h0)
    g, dh0 = gated_scan(rt, i, xp.zeros_like(i) if d_h is None else d_h,
                   xp.zeros_like(h0) if d_h_final is None else d_h_final, lengths,
                   gated=False, post=True, backward=not settings.reverse)
    p = _projection(xp, x, weights.w, weights.b)
    d_p = xp.empty((n_steps * n_batch, 3 * n_hidden), dtype=x.dtype)
    Launcher(rt, "minlstm_gate_grads", x.dtype, n_steps * n_batch * n_hidden)(
        p=p, f=f, i=i, hc=hc, h=h, h0=h0, g=g, d_f=i if d_f is None else d_f,
        d_i=i if d_i is None else d_i, d_hc=i if d_hc is None else d_hc,
        seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        has_d_f=d_f is not None, has_d_i=d_i is not None, has_d_hc=d_hc is not None,
        use_identity=settings.activation == "identity", n_steps=n_steps, batch=n_batch,
        hidden=n_hidden, d_p=d_p)
    dx = matmul(xp, d_p, weights.w.T).reshape(x.shape)
    return dx, dh0, matmul(xp, plan.flat(x).T, d_p), column_sum(rt, d_p)


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def minlstm_sequence_jvp(x, h0, weights, tangents, settings):
    """``minlstm_sequence`` and its tangent along ``tangents`` (a ``MinLSTMSequenceGrads``,
    None fields zero): the gates' tangents as whole-array operations, the state's by
    ``gated_scan``, ``dh_t = f'_t∘dh_{t-1} + di'_t∘(h̃_t - h_{t-1}) + i'_t∘dh̃_t``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _jvp(rt, x, h0, weights, tangents, settings)


# the step: the sequence of one step (``gradcells._core.one_step``)
minlstm_cell, minlstm_cell_grad, minlstm_cell_jvp = OneStep(
    CELL, minlstm_sequence, minlstm_sequence_grad, minlstm_sequence_jvp).ops()


def _jvp(rt, x, h0, weights, tangents, settings):
    xp = rt.xp
    f, i, hc, h, h_final, p, x_run = _forward(rt, x, h0, weights, settings)
    lengths = _launch.lengths(xp, settings.seq_len)
    dp = xp.zeros_like(p) if tangents.b is None else xp.zeros_like(p) + tangents.b
    if tangents.x is not None:
        dp += plan.flat(plan.running_inputs(xp, tangents.x, lengths)) @ weights.w
    if tangents.w is not None:
        dp += plan.flat(x_run) @ tangents.w
    dp, p = (a.reshape(*i.shape[:2], a.shape[1]) for a in (dp, p))
    dp_f, dp_i, dp_h = blocks(dp, 3)
    slope_f, slope_i = reference.gate_slopes(xp, p)
    di = f * i * (slope_i * dp_i - slope_f * dp_f)
    dhc = only_running(candidate_grad(xp, blocks(p, 3)[2], hc, dp_h, settings.activation),
                       running_steps(xp, x_run, lengths))
    t_h0 = xp.zeros_like(h0) if tangents.h0 is None else tangents.h0
    c = xp.ascontiguousarray(di * (hc - _launch.previous(xp, h0, h)) + i * dhc)
    d_h, d_final = gated_scan(rt, i, c, t_h0, lengths, gated=False, post=False,
                         backward=settings.reverse)
    return (MinLSTMSequence(f, i, hc, h, h_final),
            MinLSTMSequence(-di, di, dhc, d_h, d_final))


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12): the reference's, on the device's arrays

minlstm_cell_grad_jvp = reference.minlstm_cell_grad_jvp
minlstm_sequence_grad_jvp = reference.minlstm_sequence_grad_jvp
