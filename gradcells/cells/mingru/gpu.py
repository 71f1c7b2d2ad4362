"""The minGRU on the GPU: ``mingru.cu``'s kernels around cuBLAS products.

The plan follows the reference's: a sequence's forward is one product for every step's
pre-activations ``p = x_flat·w + b``, one ``mingru_gates`` launch over the ``T·B·H``
elements (``z``, ``h̃``), and one ``gated_scan`` launch, one thread per element of the
``[B, H]`` state running its column over time (``h_t = (1 - z_t)∘h_{t-1} + z_t∘h̃_t``).
The gradient is ``gated_scan`` again for the adjoint (``g_t = d_h_t + a_{t+1}∘g_{t+1}``,
backwards in time, ending at ``dh0``), the recomputed ``p_h`` (one product, for ``g``'s
branch), one ``mingru_gate_grads`` launch, ``dx`` and ``dw`` as two products and the bias
gradient a column sum. Steps past a row's length are the scan's identity steps.

The GPU runs the recurrence as per-(b, j) scans over time whatever ``method`` says: the
``B·H`` columns are its parallelism, and the two methods give one function (bitwise here). A
work-efficient block scan over time, for ``B·H`` too small to fill the device, is the next
step. Forward mode is the forward's plan with the tangents' gates in whole-array operations
and the tangent's recurrence one more ``gated_scan``; second order runs the reference's
``gradient_jvp`` (dual numbers) on the device's arrays. A cell step is a sequence of one.
"""

from __future__ import annotations

from ..._core import plan
from ..._core.one_step import OneStep
from ...gpu import _launch
from ...gpu._launch import Launcher, column_sum, contiguous, gated_scan, matmul
from . import reference
from .spec import CELL, MinGRUSequence, MinGRUSequenceGrads


def _projection(xp, x, w, b):
    """``x_flat·w + b`` as a C-contiguous ``[T·B, width]``."""
    return matmul(xp, plan.flat(x), w) + b


def _forward(rt, x, h0, weights, settings):
    """``(z, hc, h, h_final, p, x)``: the sequence, its pre-activations and its running
    inputs."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, x, lengths)
    n_steps, n_batch, _ = x.shape
    n_hidden = h0.shape[1]
    p = _projection(xp, x, weights.w, weights.b)
    z, hc = (xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype) for _ in range(2))
    Launcher(rt, "mingru_gates", x.dtype, n_steps * n_batch * n_hidden)(
        p=p, seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        use_identity=settings.activation == "identity", n_steps=n_steps, batch=n_batch,
        hidden=n_hidden, z=z, hc=hc)
    h, h_final = gated_scan(rt, z, hc, h0, lengths, gated=True, post=False,
                       backward=settings.reverse)
    return z, hc, h, h_final, p, x


def mingru_sequence(x, h0, weights, settings):
    """The minGRU over ``x [T, B, I]``; see ``gradcells.reference``'s ``mingru_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return MinGRUSequence(*_forward(rt, x, h0, weights, settings)[:4])


def mingru_sequence_grad(x, h0, weights, seq, settings, *, d_z=None, d_hc=None, d_h=None,
                         d_h_final=None):
    """Backpropagation through time for ``mingru_sequence`` (the plan in the module
    docstring)."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return MinGRUSequenceGrads(*_backward(rt, x, h0, weights, seq, settings,
                                              (d_z, d_hc, d_h, d_h_final)))


def _backward(rt, x, h0, weights, seq, settings, upstream):
    xp = rt.xp
    d_z, d_hc, d_h, d_h_final = (contiguous(xp, d) for d in upstream)
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, x, lengths)
    n_steps, n_batch, _ = x.shape
    n_hidden = h0.shape[1]
    z, hc, h = (xp.ascontiguousarray(a) for a in (seq.z, seq.hc, seq.h))
    h0 = xp.ascontiguousarray(h0)
    g, dh0 = gated_scan(rt, z, xp.zeros_like(z) if d_h is None else d_h,
                   xp.zeros_like(h0) if d_h_final is None else d_h_final, lengths,
                   gated=False, post=True, backward=not settings.reverse)
    identity = settings.activation == "identity"
    p_h = z if identity else _projection(xp, x, weights.w[:, n_hidden:], weights.b[n_hidden:])
    d_p = xp.empty((n_steps * n_batch, 2 * n_hidden), dtype=x.dtype)
    Launcher(rt, "mingru_gate_grads", x.dtype, n_steps * n_batch * n_hidden)(
        p_h=p_h, z=z, hc=hc, h=h, h0=h0, g=g, d_z=z if d_z is None else d_z,
        d_hc=z if d_hc is None else d_hc, seq_len=_launch.lengths_argument(xp, lengths),
        use_seq_len=lengths is not None, has_d_z=d_z is not None, has_d_hc=d_hc is not None,
        use_identity=identity, n_steps=n_steps, batch=n_batch, hidden=n_hidden, d_p=d_p)
    dx = matmul(xp, d_p, weights.w.T).reshape(x.shape)
    return dx, dh0, matmul(xp, plan.flat(x).T, d_p), column_sum(rt, d_p)


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def mingru_sequence_jvp(x, h0, weights, tangents, settings):
    """``mingru_sequence`` and its tangent along ``tangents`` (a ``MinGRUSequenceGrads``,
    None fields zero): the gates' tangents as whole-array operations, the state's by
    ``gated_scan``, ``dh_t = a_t∘dh_{t-1} + dz_t∘(h̃_t - h_{t-1}) + z_t∘dh̃_t``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _jvp(rt, x, h0, weights, tangents, settings)


# the step: the sequence of one step (``gradcells._core.one_step``)
mingru_cell, mingru_cell_grad, mingru_cell_jvp = OneStep(
    CELL, mingru_sequence, mingru_sequence_grad, mingru_sequence_jvp).ops()


def _jvp(rt, x, h0, weights, tangents, settings):
    xp = rt.xp
    z, hc, h, h_final, p, x_run = _forward(rt, x, h0, weights, settings)
    n_hidden = h0.shape[1]
    lengths = _launch.lengths(xp, settings.seq_len)
    dp = xp.zeros_like(p) if tangents.b is None else xp.zeros_like(p) + tangents.b
    if tangents.x is not None:
        dp += plan.flat(plan.running_inputs(xp, tangents.x, lengths)) @ weights.w
    if tangents.w is not None:
        dp += plan.flat(x_run) @ tangents.w
    dp = dp.reshape(*z.shape[:2], 2 * n_hidden)
    dz = z * (1 - z) * dp[..., :n_hidden]
    slope = 1 if settings.activation == "identity" else xp.where(
        p.reshape(dp.shape)[..., n_hidden:] >= 0, 1, hc * (1 - hc))
    dhc = reference.only_running(slope * dp[..., n_hidden:], reference.running_steps(
        xp, x_run, lengths))
    t_h0 = xp.zeros_like(h0) if tangents.h0 is None else tangents.h0
    c = xp.ascontiguousarray(dz * (hc - _launch.previous(xp, h0, h)) + z * dhc)
    d_h, d_final = gated_scan(rt, z, c, t_h0, lengths, gated=False, post=False,
                         backward=settings.reverse)
    return MinGRUSequence(z, hc, h, h_final), MinGRUSequence(dz, dhc, d_h, d_final)


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12): the reference's, on the device's arrays

mingru_cell_grad_jvp = reference.mingru_cell_grad_jvp
mingru_sequence_grad_jvp = reference.mingru_sequence_grad_jvp
