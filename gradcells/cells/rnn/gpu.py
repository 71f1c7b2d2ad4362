"""The plain (Elman) RNN on the GPU: ``rnn.cu``'s fused step kernels around cuBLAS matmuls.

The matmul plan follows the reference's sequences: the input projection of all steps is one
matmul; per step only ``h·W_h`` and one fused elementwise kernel remain (forward: bias,
activation, the length mask and the state; backward: ``dz = (carry + d_h[t])∘act'(z)``
from the saved h, masked); after the backward loop ``dx`` is one matmul and ``dW`` two (x
part and h part); the bias gradient is a column sum. The activation (tanh or relu) is the
kernels' ``use_relu`` argument. A cell is the same code with T = 1. Each operation runs on
its arguments' device.

The masks (docs/spec.md §11.3, ``gradcells.reference.rnn.rnn_sequence``): the input mask
multiplies ``x`` once (and ``dx``), the recurrent mask each step's ``h`` before ``h·W_h``
and the carry after ``dZ·W_hᵀ``; zoneout is the kernels' (the forward's mix, the
backward's split, whose ``z∘g`` joins the carry). With zoneout the saved h is the zoned
state, so ``act'`` needs the step's own output: the backward recomputes ``act(z_t)`` of all
steps, one matmul ``h_prev∘m_rec·W_h`` and one ``rnn_forward`` launch over T·B rows
(``_unzoned``).

Forward mode (docs/spec.md §12, ``rnn_*_jvp``: ``_jvp``) runs the forward's plan with the
tangent step kernel ``rnn_forward_tangent`` after each step's ``rnn_forward``; the second
order (``rnn_*_grad_jvp``: ``_grad_jvp``) runs the backward's own code with
``rnn_backward_tangent`` beside each step's ``rnn_backward`` (the step hook ``_Tangent``);
what every cell's tangents share is ``gradcells.gpu._tangents``'s.
"""

from __future__ import annotations

from ..._core import plan
from ...gpu import _launch
from ...gpu._launch import Launcher, column_sum, contiguous, matmul
from ...gpu._tangents import (
    input_tangent,
    recurrent_tangent,
    running,
    split_rows,
    state_buffers,
    upstream_pair,
    zeros_or,
)
from .spec import RNNCellGrads, RNNCellState, RNNSequence, RNNSequenceGrads


def rnn_cell(x, h_prev, weights, settings):
    """One RNN step; see ``gradcells.reference.rnn.rnn_cell``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, _ = _forward(rt, x[None], h_prev, weights, settings)
        return RNNCellState(steps[0])


def rnn_cell_grad(x, h_prev, weights, state, settings, *, d_h=None):
    """Gradient of one RNN step; see ``gradcells.reference.rnn.rnn_cell_grad``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        dx, dh0, dw, db = _backward(rt, x[None], h_prev, weights, state.h[None], settings,
                                    d_h=None if d_h is None else d_h[None], d_h_final=None)
        return RNNCellGrads(dx[0], dh0, dw, db)


def rnn_sequence(x, h0, weights, settings):
    """The RNN over ``x [T, B, I]``; see ``gradcells.reference.rnn.rnn_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, h = _forward(rt, x, h0, weights, settings)
        # Without lengths h is a view of the last step (or h0 itself when T = 0).
        return RNNSequence(steps, h_final=h.copy() if settings.seq_len is None else h)


def rnn_sequence_grad(x, h0, weights, seq, settings, *, d_h=None, d_h_final=None):
    """Backpropagation through time for ``rnn_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return RNNSequenceGrads(*_backward(rt, x, h0, weights, seq.h, settings, d_h=d_h,
                                           d_h_final=d_h_final))


# --------------------------------------------------------------------------------------
# The algorithm


def _use_relu(settings):
    """The kernels' ``use_relu`` argument."""
    return settings.activation == "relu"


def _masks(xp, settings, n_steps, n_batch, n_hidden):
    """The kernels' ``(m_rec, z_h)`` (``_launch.sequence_mask``; None where absent)."""
    return (_launch.sequence_mask(xp, settings.recurrent_mask, (1, n_batch, n_hidden)),
            _launch.sequence_mask(xp, settings.zoneout_h, (n_steps, n_batch, n_hidden)))


def _input_part(xp, x, w_x):
    """``x·W_x`` of every step, one matmul, ``[T, B, H]``."""
    n_steps, n_batch, _ = x.shape
    return (plan.flat(x) @ w_x).reshape(n_steps, n_batch, w_x.shape[1])


def _forward(rt, x, h0, weights, settings):
    """Every step's ``h`` (``[T, B, H]``) and the final h (a view of the last step, or h0,
    when ``seq_len`` is None; else the state buffer the kernel updated)."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, plan.masked(x, settings.input_mask), lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    m_rec, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
    w_h = weights.w[n_in:]
    x_z = _input_part(xp, x, weights.w[:n_in])
    steps = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    # With lengths, the state buffer the kernel updates in the rows still running; without,
    # h_state is never written and any array of the dtype will do.
    h = xp.ascontiguousarray(h0) if lengths is None else h0.copy(order="C")
    forward = Launcher(
        rt, "rnn_forward", x.dtype, n_batch * n_hidden, b=xp.ascontiguousarray(weights.b),
        seq_len=_launch.lengths_argument(xp, lengths), use_relu=_use_relu(settings),
        use_seq_len=lengths is not None, use_zoneout_h=z_h is not None, batch=n_batch,
        hidden=n_hidden, h_state=steps if lengths is None else h)
    for t in range(n_steps):
        forward(gx=x_z[t], gh=matmul(xp, plan.masked(h, m_rec), w_h), step=t, h_prev=h,
                zoneout_h=_launch.at_step(z_h, t, h), h=steps[t])
        if lengths is None:
            h = steps[t]
    return steps, h


def _unzoned(rt, x, h_seen, weights, settings):
    """Every step's own output ``act(z_t)`` ``[T, B, H]``, which the saved (zoned) states
    are not: the input part and ``h_seen·W_h`` (one matmul each, all steps at once) through
    ``rnn_forward`` over the T·B rows (no lengths: the rows past them are never read)."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = h_seen.shape[2]
    out = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    rows = n_steps * n_batch
    Launcher(rt, "rnn_forward", x.dtype, rows * n_hidden)(
        gx=_input_part(xp, x, weights.w[:n_in]), b=xp.ascontiguousarray(weights.b),
        gh=matmul(xp, plan.flat(h_seen), weights.w[n_in:]),
        seq_len=_launch.lengths_argument(xp, None), h_prev=out, zoneout_h=out,
        use_relu=_use_relu(settings), use_seq_len=False, use_zoneout_h=False, step=0,
        batch=rows, hidden=n_hidden, h=out, h_state=out)
    return out


def _backward(rt, x, h0, weights, h, settings, *, d_h, d_h_final, tangent=None):
    """Backpropagation through time from the saved steps ``h``; returns the fields of
    RNNSequenceGrads (``tangent``: ``_backward_steps``'s step hook)."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, plan.masked(x, settings.input_mask), lengths)
    h = xp.ascontiguousarray(h)
    d_h, d_h_final = contiguous(xp, d_h), contiguous(xp, d_h_final)
    m_rec, z_h = _masks(xp, settings, *h.shape)
    h_seen = plan.masked(_launch.previous(xp, h0, h), m_rec)  # what the matmul saw
    outputs = h if z_h is None else _unzoned(rt, x, h_seen, weights, settings)
    d_z, dh_recurrent = _backward_steps(rt, x, h0, weights, outputs, settings, lengths,
                                        (m_rec, z_h), d_h=d_h, d_h_final=d_h_final,
                                        tangent=tangent)
    dh0 = _initial_state_grad(xp, h0, dh_recurrent, lengths, d_h_final)
    dx, dw, db = _input_and_weight_grads(rt, x, h_seen, weights.w, d_z)
    dx = plan.running_inputs(xp, plan.masked(dx, settings.input_mask), lengths)
    return dx, dh0, dw, db


def _initial_state_grad(xp, h0, dh_recurrent, lengths, d_h_final):
    """``dL/dh0`` from the carry through the steps (None when T = 0) and, in the rows that
    never ran (length 0), the final state's gradient ``d_h_final`` (None: zero)."""
    if dh_recurrent is None:
        return xp.zeros_like(h0) if d_h_final is None else d_h_final.copy()
    if lengths is not None and d_h_final is not None:  # rows that never ran
        return dh_recurrent + xp.where((lengths == 0)[:, None], d_h_final,
                                       xp.zeros_like(d_h_final))
    return dh_recurrent


def _backward_steps(rt, x, h0, weights, h, settings, lengths, masks, *, d_h, d_h_final,
                    tangent=None):
    """The backward loop from every step's own output ``h``: every step's ``dz``
    ``[T, B, H]`` and the carry before step 0, ``dL/dh0`` through the steps: ``dZ_0·W_hᵀ``
    (None when T = 0). The masks ``(m_rec, z_h)`` (``_masks``): the carry is
    ``(dZ_t·W_hᵀ)∘m_rec``, plus the old state's part of the zoned h's gradient (the
    kernel's ``dh_zoned``). ``tangent(t, dh_next, d_z)`` (second order: ``_Tangent``),
    when given, runs after each step's kernel, with the carry the kernel read (None on the
    first step back) and every step's ``dz`` (``[T, B, H]``, written from step t on)."""
    xp = rt.xp
    m_rec, z_h = masks
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    w_h = weights.w[n_in:]
    d_z = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    placeholder = h  # an array of the dtype for the arguments a launch never reads
    dh_recurrent = None  # dL/dh before step t: (dZ_t·W_hᵀ)∘m_rec + z_h∘g
    dh_zoned = placeholder if z_h is None else xp.empty((n_batch, n_hidden), dtype=x.dtype)
    backward = Launcher(
        rt, "rnn_backward", x.dtype, n_batch * n_hidden,
        d_h_final=placeholder if d_h_final is None else d_h_final,
        seq_len=_launch.lengths_argument(xp, lengths), use_relu=_use_relu(settings),
        has_d_h=d_h is not None, has_d_h_final=d_h_final is not None,
        use_seq_len=lengths is not None, use_zoneout_h=z_h is not None, n_steps=n_steps,
        batch=n_batch, hidden=n_hidden, dh_zoned=dh_zoned)
    for t in reversed(range(n_steps)):
        backward(h=h[t], d_h=placeholder if d_h is None else d_h[t],
                 dh_next=placeholder if dh_recurrent is None else dh_recurrent, step=t,
                 zoneout_h=_launch.at_step(z_h, t, placeholder), d_z=d_z[t])
        if tangent is not None:
            tangent(t, dh_recurrent, d_z)
        dh_recurrent = plan.masked(matmul(xp, d_z[t], w_h.T), m_rec)
        if z_h is not None:
            dh_recurrent = dh_recurrent + dh_zoned
    return d_z, dh_recurrent


def _input_and_weight_grads(rt, x, h_prev, w, d_z):
    """``dx`` (one matmul), ``dW`` (its x and h parts, ``x`` and ``h_prev`` as the matmuls
    saw them) and the bias gradient (a column sum)."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = w.shape[1]
    d_flat = plan.flat(d_z)
    dx = (d_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = xp.empty((n_in + n_hidden, n_hidden), dtype=x.dtype)
    xp.matmul(plan.flat(x).T, d_flat, out=dw[:n_in])
    xp.matmul(plan.flat(h_prev).T, d_flat, out=dw[n_in:])
    return dx, dw, column_sum(rt, d_flat)


# --------------------------------------------------------------------------------------
# Forward mode (docs/spec.md §12)


def rnn_cell_jvp(x, h_prev, weights, tangents, settings):
    """One RNN step and its tangent along ``tangents`` (an ``RNNCellGrads``, None fields
    zero); see ``gradcells.reference.rnn.rnn_cell_jvp``. The primal is ``rnn_cell``'s."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, _, t_steps, _ = _jvp(rt, x[None], None if tangents.x is None else
                                       tangents.x[None], h_prev, tangents.h_prev, weights,
                                       tangents.w, tangents.b, settings)
        return RNNCellState(steps[0]), RNNCellState(t_steps[0])


def rnn_sequence_jvp(x, h0, weights, tangents, settings):
    """``rnn_sequence`` and its tangent along ``tangents`` (an ``RNNSequenceGrads``, None
    fields zero); see ``gradcells.reference.rnn.rnn_sequence_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, h, t_steps, t_h = _jvp(rt, x, tangents.x, h0, tangents.h0, weights,
                                        tangents.w, tangents.b, settings)
        copy = settings.seq_len is None
        return (RNNSequence(steps, h.copy() if copy else h),
                RNNSequence(t_steps, t_h.copy() if copy else t_h))


def _jvp(rt, x, t_x, h0, t_h0, weights, t_w, t_b, settings):
    """The RNN over ``x [T, B, I]`` and its tangent: ``(steps, h_final, t_steps,
    t_h_final)``, the primal as ``_forward`` computes it."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x, t_x = running(xp, x, settings, lengths), running(xp, t_x, settings, lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    m_rec, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
    w_x, w_h = weights.w[:n_in], weights.w[n_in:]
    t_w_x, t_w_h = split_rows(t_w, n_in)
    x_z = _input_part(xp, x, w_x)
    t_x_z = input_tangent(xp, x, t_x, w_x, t_w_x, t_b, n_hidden)
    steps = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    t_steps = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    h, t_h = state_buffers(xp, h0, t_h0, lengths)
    b = xp.ascontiguousarray(weights.b)
    common = dict(seq_len=_launch.lengths_argument(xp, lengths), use_relu=_use_relu(settings),
                  use_seq_len=lengths is not None, use_zoneout_h=z_h is not None,
                  batch=n_batch, hidden=n_hidden)
    forward = Launcher(rt, "rnn_forward", x.dtype, n_batch * n_hidden, b=b, **common,
                       h_state=steps if lengths is None else h)
    tangent = Launcher(rt, "rnn_forward_tangent", x.dtype, n_batch * n_hidden, b=b, **common,
                       dh_state=t_steps if lengths is None else t_h)
    for t in range(n_steps):
        h_seen = plan.masked(h, m_rec)
        gh = matmul(xp, h_seen, w_h)
        t_gh = recurrent_tangent(xp, h_seen, plan.masked(t_h, m_rec), w_h, t_w_h)
        zoneout = _launch.at_step(z_h, t, h)
        forward(gx=x_z[t], gh=gh, step=t, h_prev=h, zoneout_h=zoneout, h=steps[t])
        tangent(gx=x_z[t], gh=gh, dgx=t_x_z[t], dgh=t_gh, step=t, dh_prev=t_h,
                zoneout_h=zoneout, dh=t_steps[t])
        if lengths is None:
            h, t_h = steps[t], t_steps[t]
    return steps, h, t_steps, t_h


# --------------------------------------------------------------------------------------
# Second order (docs/spec.md §12)


def rnn_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_h=None,
                      d_h_tangent=None):
    """The JVP of ``rnn_cell_grad`` along ``tangents`` (an ``RNNCellGrads``, None fields
    zero) and ``d_h_tangent``: ``(grads, grads_tangent)``, ``grads`` ``rnn_cell_grad``'s;
    see ``gradcells.reference.rnn.rnn_cell_grad_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        d_h, t_d_h = upstream_pair(rt.xp, d_h, d_h_tangent, state.h)
        pairs = _grad_jvp(
            rt, x[None], h_prev, weights, state.h[None],
            tangents._replace(x=None if tangents.x is None else tangents.x[None]), settings,
            (None if d_h is None else d_h[None], None if t_d_h is None else t_d_h[None],
             None, None))
        return tuple(RNNCellGrads(dx[0], *rest) for dx, *rest in pairs)


def rnn_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_h=None,
                          d_h_final=None, d_h_tangent=None, d_h_final_tangent=None):
    """The JVP of ``rnn_sequence_grad`` along ``tangents`` (an ``RNNSequenceGrads``, None
    fields zero) and the upstream gradients' tangents: ``(grads, grads_tangent)``, ``grads``
    ``rnn_sequence_grad``'s; see ``gradcells.reference.rnn.rnn_sequence_grad_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        xp = rt.xp
        upstream = (*upstream_pair(xp, d_h, d_h_tangent, seq.h),
                    *upstream_pair(xp, d_h_final, d_h_final_tangent, seq.h_final))
        pairs = _grad_jvp(rt, x, h0, weights, seq.h, tangents, settings, upstream)
        return tuple(RNNSequenceGrads(*fields) for fields in pairs)


def _grad_jvp(rt, x, h0, weights, h, tangents, settings, upstream):
    """``rnn_sequence_grad`` from the saved steps ``h`` and its tangent along ``tangents``
    (an ``RNNSequenceGrads`` or ``RNNCellGrads`` of ``[T, B, ·]`` x tangents, None fields
    zero) and ``upstream = (d_h, t_d_h, d_h_final, t_d_h_final)`` (``upstream_pair``s):
    two lists of the fields of RNNSequenceGrads. The primal is ``_backward``'s, with
    ``_Tangent`` as its step hook; the saved steps' tangent is ``_jvp``'s."""
    xp = rt.xp
    t_x, t_h0, t_w, t_b = tangents
    d_h, t_d_h, d_h_final, t_d_h_final = upstream
    t_h0, t_w = zeros_or(xp, t_h0, h0), zeros_or(xp, t_w, weights.w)
    t_steps = _jvp(rt, x, t_x, h0, t_h0, weights, t_w, t_b, settings)[2]
    hook = _Tangent(rt, x, t_x, h0, t_h0, weights, (t_w, t_b), xp.ascontiguousarray(h),
                       t_steps, settings, upstream)
    grads = _backward(rt, x, h0, weights, h, settings, d_h=d_h, d_h_final=d_h_final,
                      tangent=hook)
    t_dh0 = _initial_state_grad(xp, h0, hook.carry, hook.lengths, t_d_h_final)
    d_z = hook.t_d_z if hook.d_z is None else hook.d_z  # T = 0: both empty
    t_dx, t_dw, t_db = _input_and_weight_grads(rt, hook.x, hook.h_seen, weights.w, hook.t_d_z)
    t_dx_w, t_dw_w, _ = _input_and_weight_grads(rt, hook.t_x, hook.t_seen, t_w, d_z)
    t_dx = plan.running_inputs(xp, plan.masked(t_dx + t_dx_w, settings.input_mask),
                               hook.lengths)
    return list(grads), [t_dx, t_dh0, t_dw + t_dw_w, t_db]


def _outputs(rt, x, t_x, h_seen, t_seen, weights, t_w, t_b, settings):
    """Every step's own output ``act(z_t)`` (``_unzoned``) and its tangent, ``[T, B,
    H]``: ``rnn_forward_tangent`` over the T·B rows on the tangent's input part (x'·W_x +
    x·W_x' + b') and recurrent part (h_seen'·W_h + h_seen·W_h'), no lengths."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = h_seen.shape[2]
    out = _unzoned(rt, x, h_seen, weights, settings)
    t_out = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    rows = n_steps * n_batch
    w_x, w_h = weights.w[:n_in], weights.w[n_in:]
    Launcher(rt, "rnn_forward_tangent", x.dtype, rows * n_hidden)(
        gx=_input_part(xp, x, w_x), gh=matmul(xp, plan.flat(h_seen), w_h),
        b=xp.ascontiguousarray(weights.b),
        dgx=input_tangent(xp, x, t_x, w_x, t_w[:n_in], t_b, n_hidden),
        dgh=recurrent_tangent(xp, plan.flat(h_seen), plan.flat(t_seen), w_h, t_w[n_in:]),
        seq_len=_launch.lengths_argument(xp, None), use_relu=_use_relu(settings),
        use_seq_len=False, step=0, batch=rows, hidden=n_hidden, dh=t_out, dh_state=t_out)
    return out, t_out


class _Tangent:
    """``_backward_steps``'s step hook: after step t's ``rnn_backward``,
    ``rnn_backward_tangent`` (the tangent of its ``dz``, into ``t_d_z[t]``) and the tangent
    carry ``(dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec`` (plus zoneout's ``z∘g'``), kept in ``carry``.
    Built from the call's arrays: the inputs and states as the matmuls saw them (``x``,
    ``h_seen`` and their tangents) and each step's own output ``act(z_t)`` and tangent."""

    def __init__(self, rt, x, t_x, h0, t_h0, weights, t_weights, h, t_steps, settings,
                 upstream):

        xp = self.xp = rt.xp
        t_w, t_b = t_weights
        self.lengths = lengths = _launch.lengths(xp, settings.seq_len)
        self.x = running(xp, x, settings, lengths)
        self.t_x = running(xp, zeros_or(xp, t_x, x), settings, lengths)
        n_steps, n_batch, n_in = self.x.shape
        n_hidden = h0.shape[1]
        self.m_rec, self.z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
        self.h_seen = plan.masked(_launch.previous(xp, h0, h), self.m_rec)
        self.t_seen = plan.masked(_launch.previous(xp, t_h0, t_steps), self.m_rec)
        self.w_h, self.t_w_h = weights.w[n_in:], t_w[n_in:]
        self.outputs, self.t_outputs = (h, t_steps) if self.z_h is None else _outputs(
            rt, self.x, self.t_x, self.h_seen, self.t_seen, weights, t_w, t_b, settings)
        self.d_h, self.t_d_h, d_h_final, t_d_h_final = upstream
        self.carry = self.d_z = None
        self.t_d_z = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
        self.placeholder = placeholder = self.outputs
        self.t_dh_zoned = (placeholder if self.z_h is None
                           else xp.empty((n_batch, n_hidden), dtype=x.dtype))
        self.kernel = Launcher(
            rt, "rnn_backward_tangent", x.dtype, n_batch * n_hidden,
            d_h_final=placeholder if d_h_final is None else d_h_final,
            d_h_final_t=placeholder if t_d_h_final is None else t_d_h_final,
            seq_len=_launch.lengths_argument(xp, lengths), use_relu=_use_relu(settings),
            has_d_h=self.d_h is not None, has_d_h_final=d_h_final is not None,
            use_seq_len=lengths is not None, use_zoneout_h=self.z_h is not None,
            n_steps=n_steps, batch=n_batch, hidden=n_hidden, dh_zoned_t=self.t_dh_zoned)

    def __call__(self, t, dh_next, d_z):
        placeholder = self.placeholder
        self.d_z = d_z
        given = self.d_h is not None
        self.kernel(h=self.outputs[t], h_t=self.t_outputs[t],
                    d_h=self.d_h[t] if given else placeholder,
                    d_h_t=self.t_d_h[t] if given else placeholder,
                    dh_next=placeholder if dh_next is None else dh_next,
                    dh_next_t=placeholder if self.carry is None else self.carry, step=t,
                    zoneout_h=_launch.at_step(self.z_h, t, placeholder), d_z_t=self.t_d_z[t])
        carry = recurrent_tangent(self.xp, d_z[t], self.t_d_z[t], self.w_h.T, self.t_w_h.T)
        carry = plan.masked(carry, self.m_rec)
        self.carry = carry if self.z_h is None else carry + self.t_dh_zoned
