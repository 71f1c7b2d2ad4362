"""The plain (Elman) RNN cell and sequence on the CPU: BLAS matmuls plus one fused Numba
pass each way (``_cpu_kernels``).

The math is ``gradcells.cells.rnn.reference``. A cell's forward:

    Z = [x, h_prev]·w                      one BLAS call
    rnn_forward_kernel(Z, b, ...)          h = act(Z + b), one pass over [B, H]

and its gradient:

    rnn_backward_kernel(...)               dz [B, H] and the bias sum
    d[x, h_prev] = dz·wᵀ,  dw = [x, h_prev]ᵀ·dz       two BLAS calls

A sequence projects every step's input at once and runs the kernels once per step
(``_sequence`` describes the plan, its scratch and per-example lengths).
"""

from __future__ import annotations

import numpy as np

from ..._core.plan import flat, masked
from ...cpu._compile import kernel_array, one_row
from ...cpu._sequence import (
    Walk,
    contiguous,
    finish_state_grad,
    initial_carry,
    input_and_weight_grads,
    lengths_of,
    masked_input_grad,
    projection,
    running_inputs,
    seen,
    seen_states,
    sequence_masks,
    step_outputs,
    stopped_rows,
    upstream,
    zero_stopped,
    zone,
    zoneout_split,
)
from ...cpu._tangents import (
    Linear,
    back_linear,
    carry_pair,
    cell_gates,
    finish,
    input_tangent,
    product_grads,
    recurrent_product,
    sequence_inputs,
    sequence_of_one,
    stack_shape,
    state_step,
    step_pair,
    tangent_or_zeros,
    upstream_pair,
)
from ...cpu._workspace import scratch
from ._cpu_kernels import (
    rnn_backward_kernel,
    rnn_backward_tangent_kernel,
    rnn_forward_kernel,
    rnn_jvp_kernel,
)
from .spec import RNNCellGrads, RNNCellState, RNNSequence, RNNSequenceGrads


def _is_relu(settings):
    return settings.activation == "relu"


# cell


def rnn_cell(x, h_prev, weights, settings):
    """One RNN step; returns ``RNNCellState(h)``."""
    gates = np.dot(np.concatenate((x, h_prev), axis=1), weights.w)
    h = np.empty_like(gates)
    rnn_forward_kernel(gates, one_row(weights.b), _is_relu(settings), h)
    return RNNCellState(h)


def rnn_cell_grad(x, h_prev, weights, state, settings, *, d_h=None):
    """Gradient of one RNN step with respect to every input (``RNNCellGrads``)."""
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    dtype = h_prev.dtype
    h = kernel_array(state.h)
    carry = np.zeros((n_batch, n_hidden), dtype) if d_h is None else kernel_array(d_h)
    d_z = np.empty((n_batch, n_hidden), dtype)
    d_bias = np.zeros(n_hidden, dtype)
    rnn_backward_kernel(h, carry, carry, False, _is_relu(settings), d_z, d_bias)
    dxh = np.dot(d_z, weights.w.T)
    dw = np.dot(np.concatenate((x, h_prev), axis=1).T, d_z)
    return RNNCellGrads(x=dxh[:, :n_in], h_prev=dxh[:, n_in:], w=dw, b=d_bias)


# --------------------------------------------------------------------------------------
# sequence


def rnn_sequence(x, h0, weights, settings):
    """The RNN cell over ``x [T, B, I]``; see ``gradcells.reference``'s ``rnn_sequence``.

    Per step: ``h_prev·W_h`` (BLAS; ``(h_prev∘m_rec)·W_h`` with a recurrent mask) and
    ``rnn_forward_kernel`` with the step's slice of ``x·W_x + b`` (``x∘m_in`` with an input
    mask) as its per-row addend, writing the step's output in place; with zoneout, then
    ``h_t = z∘h_prev + (1-z)∘h_t`` in place (``_sequence.zone``).
    """
    x, h0, w, b = map(contiguous, (x, h0, weights.w, weights.b))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    lengths = lengths_of(settings.seq_len)
    walk = Walk(n_steps, lengths, settings.reverse)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, n_hidden)
    x = running_inputs(masked(x, masks.input), lengths)
    relu = _is_relu(settings)
    x_z, h_z, h_seen = scratch(x.dtype, (n_steps, n_batch, n_hidden), *[(n_batch, n_hidden)] * 2)
    projection(x, w[:n_in], b, x_z)
    w_h = w[n_in:]
    (h,) = step_outputs(1, (n_steps, n_batch, n_hidden), x.dtype)
    for t in walk.times():
        h_prev = walk.previous(h, h0, t)
        np.matmul(seen(h_prev, masks.recurrent, h_seen), w_h, out=h_z)
        rnn_forward_kernel(h_z, x_z[t], relu, h[t])
        zone(masks.zoneout_h, t, h_prev, h[t])
        walk.hold(t, (h, h0))
    final = walk.final(h, h0)
    zero_stopped((h,), lengths)
    return RNNSequence(h, final)


def rnn_sequence_grad(x, h0, weights, seq, settings, *, d_h=None, d_h_final=None):
    """Backpropagation through time for ``rnn_sequence``.

    ``grad_h``: the gradient of the state after the current step (``d_h_final`` before the
    loop). Per step (``_backward_steps``): ``rnn_backward_kernel`` from ``grad_h + d_h[t]``
    writes ``dz_t`` and accumulates the bias sum; ``dz_t·W_hᵀ`` (BLAS) is the new
    ``grad_h``. Then ``dx`` and ``dw`` over all steps at once
    (``_sequence.input_and_weight_grads``).

    Masks: ``dz_t·W_hᵀ`` is multiplied by ``m_rec`` and ``dx`` by ``m_in``; zoneout splits
    the step's gradient (``_sequence.zoneout_split``). With zoneout the saved ``h`` is the
    zoned state and ``act'`` needs every step's own ``h̃_t = act(z_t)``. Where ``z`` is 0 the
    saved state is ``h̃_t`` itself (``0∘h_prev + 1∘h̃_t`` rounds to ``h̃_t``), where it is 1
    the step's gradient ``(1-z)∘g`` is 0 whatever ``act'`` reads; so a binary mask (every
    entry 0 or 1, checked once per call: zoneout as trained) reads the saved ``h``, exactly,
    and a fractional one recomputes ``h̃`` before the loop as the reference does
    (``_unzoned_outputs``: the forward's two matmuls over all ``T·B`` rows at once and its
    kernel; three ``[T, B, H]`` of scratch).
    """
    x, h0, w = map(contiguous, (x, h0, weights.w))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    lengths = lengths_of(settings.seq_len)
    walk = Walk(n_steps, lengths, settings.reverse)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, n_hidden)
    x = running_inputs(masked(x, masks.input), lengths)
    h = contiguous(seq.h)
    d_h = None if d_h is None else contiguous(d_h)
    grad_h = initial_carry(d_h_final, (n_batch, n_hidden), dtype)
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)
    recompute = [steps] * 3 if not _reads_saved_states(masks.zoneout_h) else []
    buffers = scratch(dtype, state, state, steps, (n_hidden, n_hidden), state, *recompute)
    np.copyto(buffers[3], w[n_in:].T)     # W_hᵀ, C-contiguous: OpenBLAS packs it faster
    h0_seen, h_seen = seen_states(h0, h, masks.recurrent)
    outputs = h if not recompute else _unzoned_outputs(
        walk, x, h0_seen, h_seen, weights, _is_relu(settings), buffers[5:])
    d_bias = np.zeros(n_hidden, dtype)
    _backward_steps(outputs, d_h, grad_h, walk, buffers[:5], _is_relu(settings), d_bias,
                    masks)
    dx, dw = input_and_weight_grads(walk, x, h0_seen, w, h_seen, buffers[2])
    return RNNSequenceGrads(x=masked_input_grad(dx, masks.input), h0=grad_h, w=dw, b=d_bias)


def _reads_saved_states(zoneout):
    """Whether the gradient's ``act'`` may read the saved states: no zoneout, or a binary
    one (``rnn_sequence_grad``)."""
    return zoneout is None or bool(np.all((zoneout == 0) | (zoneout == 1)))


def _unzoned_outputs(walk, x, h0_seen, h_seen, weights, relu, buffers):
    """Every step's output before zoneout, ``act(x·W_x + b + h_prev_seen·W_h)``, into
    ``buffers[2]`` (``buffers``: three ``[T, B, H]`` scratch arrays)."""
    x_z, h_z, out = buffers
    n_in = x.shape[2]
    w = contiguous(weights.w)
    projection(x, w[:n_in], contiguous(weights.b), x_z)
    walk.recurrent_projection(h0_seen, h_seen, w[n_in:], h_z)
    if out.size:
        rnn_forward_kernel(flat(h_z), flat(x_z), relu, flat(out))
    return out


def _backward_steps(h, d_h, grad_h, walk, buffers, relu, d_bias, masks):
    """The backward loop over the steps in ``walk``'s backward order: updates ``grad_h``
    in place to the gradient of ``h0``, leaves every step's ``dz_t`` in ``buffers[2]`` and
    accumulates ``d_bias``. ``h``: every step's own output (before zoneout).

    ``buffers``: the scratch ``(upstream [B, H], dh_prev [B, H], d_z [T, B, H],
    w_h_t [H, H], old [B, H])`` (``old``: the zoned state's part for the old state).
    """
    upstream_h, dh_prev, d_z, w_h_t, old = buffers
    zoneout = masks.zoneout_h
    for t in walk.back_times():
        stopped = stopped_rows(walk.lengths, t)
        if stopped is None and zoneout is None:      # the kernel adds d_h[t] itself
            rnn_backward_kernel(h[t], grad_h, grad_h if d_h is None else d_h[t],
                                d_h is not None, relu, d_z[t], d_bias)
            np.matmul(d_z[t], w_h_t, out=grad_h)
            finish_state_grad(grad_h, masks.recurrent, None)
            continue
        # stopped rows: no upstream, keep their state gradient
        up = upstream(grad_h, d_h, t, upstream_h, stopped)
        up, up_old = zoneout_split(zoneout, t, up, upstream_h, old)
        rnn_backward_kernel(h[t], up, up, False, relu, d_z[t], d_bias)
        target = grad_h if stopped is None else dh_prev
        np.matmul(d_z[t], w_h_t, out=target)
        finish_state_grad(target, masks.recurrent, up_old)
        if stopped is not None:
            np.copyto(grad_h, dh_prev, where=~stopped)


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def rnn_cell_jvp(x, h_prev, weights, tangents, settings):
    """One RNN step and its tangent along ``tangents`` (an ``RNNCellGrads``, None fields
    zero): ``(RNNCellState(h), RNNCellState(t_h))``, the primal exactly as ``rnn_cell``'s
    (``rnn_cell_step``)."""

    h, t_h = rnn_cell_step(x, h_prev, weights, tangents, _is_relu(settings))
    return RNNCellState(h), RNNCellState(t_h)


def rnn_sequence_jvp(x, h0, weights, tangents, settings):
    """``rnn_sequence`` and its tangent along ``tangents`` (an ``RNNSequenceGrads``, None
    fields zero): ``(RNNSequence, RNNSequence of tangents)``. The primal is the forward's,
    bitwise; ``rnn_jvp`` states the plan."""

    h, final, t_h, t_final = rnn_jvp(x, tangents.x, h0, tangents.h0, weights,
                                    (tangents.w, tangents.b), settings, _is_relu(settings))
    return RNNSequence(h, final), RNNSequence(t_h, t_final)


# --------------------------------------------------------------------------------------
# forward mode's loop: the primal as the forward computes it, its tangent beside it


def rnn_jvp(x, t_x, h0, t_h0, weights, t_weights, settings, relu):
    """The RNN sequence ``x [T, B, I]`` from ``h0`` and its tangent: ``(h, h_final, t_h,
    t_h_final)`` (``t_weights = (t_w, t_b)``).

    Per step: ``h_seen·W_h`` and ``[t_h_seen, h_seen]·[W_h; t_W_h]`` (BLAS), then
    ``rnn_jvp_kernel`` with the step's slices of ``x·W_x + b`` and its tangent, writing
    ``h[t], t_h[t]``; zoneout on both (``zone``)."""
    h0, w, b = (contiguous(a) for a in (h0, weights.w, weights.b))
    t_w, t_b = t_weights
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    inputs = sequence_inputs(x, t_x, settings, n_hidden)
    x, t_x, lengths, masks = inputs
    n_steps, dtype = x.shape[0], x.dtype
    t_h0, t_b = tangent_or_zeros(t_h0, h0), tangent_or_zeros(t_b, b)
    lin_x = Linear.of(w[:n_in], None if t_w is None else t_w[:n_in])
    lin_h = Linear.of(w[n_in:], None if t_w is None else t_w[n_in:])
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)
    x_z, t_x_z, x_stack, h_z, t_h_z, h_seen, t_h_seen, h_stack = scratch(
        dtype, steps, steps, stack_shape(lin_x, n_steps * n_batch), state, state, state, state,
        stack_shape(lin_h, n_batch))
    projection(x, lin_x.w, b, x_z)
    input_tangent(lin_x, t_x, x, t_b, t_x_z, x_stack)
    h, t_h = step_outputs(2, steps, dtype)
    for t in range(n_steps):
        h_prev, t_h_prev = step_pair(t, h0, h), step_pair(t, t_h0, t_h)
        h_read = seen(h_prev, masks.recurrent, h_seen)
        t_h_read = seen(t_h_prev, masks.recurrent, t_h_seen)
        np.matmul(h_read, lin_h.w, out=h_z)
        lin_h.into(t_h_read, h_read, t_h_z, h_stack)
        rnn_jvp_kernel(h_z, x_z[t], t_h_z, t_x_z[t], relu, h[t], t_h[t])
        zone(masks.zoneout_h, t, h_prev, h[t])
        zone(masks.zoneout_h, t, t_h_prev, t_h[t])
    final, t_final = finish((h,), (t_h,), h0, t_h0, lengths)
    return h, final, t_h, t_final




def rnn_cell_step(x, h_prev, weights, tangents, relu):
    """The RNN cell and its tangent, the primal exactly as ``rnn_cell``'s:
    ``(h, t_h)``."""
    gates, t_gates = cell_gates(x, h_prev, weights.w, (tangents.x, tangents.h_prev,
                                                        tangents.w))
    b = contiguous(weights.b)
    h, t_h = np.empty_like(gates), np.empty_like(gates)
    rnn_jvp_kernel(gates, one_row(b), t_gates, one_row(tangent_or_zeros(tangents.b, b)), relu,
                   h, t_h)
    return h, t_h


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12)


def rnn_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_h=None,
                      d_h_tangent=None):
    """The JVP of ``rnn_cell_grad`` along ``tangents`` (an ``RNNCellGrads``, None fields
    zero) and ``d_h_tangent``: ``(RNNCellGrads, RNNCellGrads of tangents)``, a sequence of
    one step (``rnn_grad_jvp``)."""

    x, h0, seq, t, up = sequence_of_one(x, h_prev, state, tangents, d_h, d_h_tangent)
    pair = rnn_grad_jvp(x, h0, weights, RNNSequence(*seq), RNNSequenceGrads(*t), settings,
                        _is_relu(settings), up)
    return tuple(RNNCellGrads(g[0][0], *g[1:]) for g in pair)


def rnn_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_h=None,
                          d_h_final=None, d_h_tangent=None, d_h_final_tangent=None):
    """The JVP of ``rnn_sequence_grad`` along ``tangents`` (an ``RNNSequenceGrads``, None
    fields zero) and the upstream gradients' tangents: ``(RNNSequenceGrads, RNNSequenceGrads
    of tangents)``, the primal as ``rnn_sequence_grad``'s; ``rnn_grad_jvp`` states
    the plan."""

    pair = rnn_grad_jvp(x, h0, weights, seq, tangents, settings, _is_relu(settings),
                        (d_h, d_h_final, d_h_tangent, d_h_final_tangent))
    return tuple(RNNSequenceGrads(*g) for g in pair)


# --------------------------------------------------------------------------------------
# second order's loop: the gradient's backward loop with a tangent beside every value


def rnn_grad_jvp(x, h0, weights, seq, tangents, settings, relu, upstreams):
    """``rnn_sequence_grad`` and its tangent: ``(grads, t_grads)``, each ``(dx, dh0,
    dw, db)``; ``upstreams = (d_h, d_h_final, d_h_tangent, d_h_final_tangent)``. Per step,
    ``up`` the step's gradient ((1-z)∘ of carry plus ``d_h[t]``) and ``up'`` its tangent:

        dz' = act'(h̃)∘up' + act''(h̃)[h̃']∘up        (``rnn_backward_tangent_kernel``)
        grad_h' = (dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec + z∘(carry' + d_h'[t])

    ``act'`` and its tangent read every step's own output before zoneout and its tangent:
    the saved ``h`` and the forward-mode tangent ``h'`` (``rnn_jvp``) without zoneout or with
    a binary one (``rnn._reads_saved_states``), else ``h̃ = act(x·W_x + b + h_seen·W_h)``
    and its tangent recomputed over all steps at once (``_rnn_unzoned``)."""
    t_weights = (tangents.w, tangents.b)
    _, _, t_h_seq, _ = rnn_jvp(x, tangents.x, h0, tangents.h0, weights, t_weights, settings,
                               relu)
    h0, w = contiguous(h0), contiguous(weights.w)
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    x, t_x, lengths, masks = sequence_inputs(x, tangents.x, settings, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    walk = Walk(n_steps, lengths, False)
    d_h, t_d_h = upstream_pair(upstreams[0], upstreams[2])
    grad_h, t_grad_h = carry_pair(upstreams[1], upstreams[3], (n_batch, n_hidden), dtype)
    t_w, t_h0 = tangent_or_zeros(tangents.w, w), tangent_or_zeros(tangents.h0, h0)
    h = contiguous(seq.h)
    h0_seen, h_seen = seen_states(h0, h, masks.recurrent)
    t_h0_seen, t_h_seen = seen_states(t_h0, t_h_seq, masks.recurrent)
    lin_back = back_linear(w[n_in:], None if tangents.w is None else t_w[n_in:])
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)
    recompute = not _reads_saved_states(masks.zoneout_h)
    buffers = scratch(dtype, steps, steps, *[state] * 6, stack_shape(lin_back, n_batch),
                      *([steps] * 4 if recompute else []))
    d_z, t_d_z = buffers[:2]
    outputs = (h, t_h_seq) if not recompute else _rnn_unzoned(
        walk, (x, t_x), (h0_seen, h_seen, t_h0_seen, t_h_seen), weights, t_weights, relu,
        buffers[9:])
    sums = np.zeros(n_hidden, dtype), np.zeros(n_hidden, dtype)
    _rnn_backward_steps(outputs, (d_h, t_d_h), (grad_h, t_grad_h), walk, (d_z, t_d_z),
                        (lin_back, relu, masks), buffers[2:9], sums)
    (dx, dw), (t_dx, t_dw) = product_grads(
        walk, (x, h0_seen, w, h_seen), (tangent_or_zeros(t_x, x), t_h0_seen, t_w, t_h_seen),
        (d_z, t_d_z))
    return ((masked_input_grad(dx, masks.input), grad_h, dw, sums[0]),
            (masked_input_grad(t_dx, masks.input), t_grad_h, t_dw, sums[1]))


def _rnn_unzoned(walk, inputs, states, weights, t_weights, relu, buffers):
    """Every step's output before zoneout and its tangent, ``(h̃, h̃')``: the primal as
    ``rnn._unzoned_outputs`` computes it, ``h̃ = act(x·W_x + b + h_seen·W_h)``, and
    ``h̃' = act'∘(x'·W_x + x·W_x' + b' + h_seen'·W_h + h_seen·W_h')`` (``rnn_jvp_kernel``
    over all ``T·B`` rows). ``buffers``: four ``[T, B, H]`` scratch arrays."""
    x, t_x = inputs
    h0_seen, h_seen, t_h0_seen, t_h_seen = states
    x_z, h_z, t_x_z, t_h_z = buffers
    n_in = x.shape[2]
    w, b = contiguous(weights.w), contiguous(weights.b)
    t_w, t_b = t_weights
    projection(x, w[:n_in], b, x_z)
    walk.recurrent_projection(h0_seen, h_seen, w[n_in:], h_z)
    lin_x = Linear.of(w[:n_in], None if t_w is None else t_w[:n_in])
    stack = np.empty(stack_shape(lin_x, x.shape[0] * x.shape[1]), x.dtype)
    input_tangent(lin_x, t_x, x, None if t_b is None else contiguous(t_b), t_x_z, stack)
    walk.recurrent_projection(t_h0_seen, t_h_seen, w[n_in:], t_h_z)
    if t_w is not None:
        t_h_z += recurrent_product(walk, h0_seen, h_seen, contiguous(t_w[n_in:]))
    out, t_out = np.empty_like(x_z), np.empty_like(x_z)
    if out.size:
        rnn_jvp_kernel(flat(h_z), flat(x_z), flat(t_h_z), flat(t_x_z), relu, flat(out),
                       flat(t_out))
    return out, t_out




def _rnn_backward_steps(outputs, d_h, carry, walk, d_z, fixed, buffers, sums):
    """The backward loop with its tangent: updates ``carry = (grad_h, grad_h')`` in place
    to the gradient of ``h0`` and its tangent, writes every step's ``d_z = (dz, dz')`` and
    accumulates ``sums = (db, db')``. ``outputs = (h̃, h̃')``, ``d_h = (d_h, d_h')``;
    ``fixed = (lin_back, relu, masks)``; ``buffers``: six ``[B, H]`` and the stack."""
    h, t_h = outputs
    lin_back, relu, masks = fixed
    bufs, t_bufs, (prev, t_prev), stack = buffers[0:2], buffers[2:4], buffers[4:6], buffers[6]
    for t in walk.back_times():
        stopped = stopped_rows(walk.lengths, t)
        up, up_old = state_step(masks.zoneout_h, t, carry[0], d_h[0], stopped, bufs)
        t_up, t_up_old = state_step(masks.zoneout_h, t, carry[1], d_h[1], stopped, t_bufs)
        rnn_backward_kernel(h[t], up, up, False, relu, d_z[0][t], sums[0])
        rnn_backward_tangent_kernel(h[t], t_h[t], up, t_up, relu, d_z[1][t], sums[1])
        target = carry if stopped is None else (prev, t_prev)
        np.matmul(d_z[0][t], lin_back.w, out=target[0])
        lin_back.into(d_z[1][t], d_z[0][t], target[1], stack)
        finish_state_grad(target[0], masks.recurrent, up_old)
        finish_state_grad(target[1], masks.recurrent, t_up_old)
        if stopped is not None:      # stopped rows keep their state gradient
            np.copyto(carry[0], prev, where=~stopped)
            np.copyto(carry[1], t_prev, where=~stopped)
