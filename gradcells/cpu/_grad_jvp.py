"""The second order on the CPU (docs/spec.md §12): a gradient op and its tangent, the JVP
of the gradient in all its array inputs, in the same backward loop (a cell: a sequence of
one step, its result the CPU cell gradient's to round-off).

The math is ``gradcells.reference``'s ``*_grad_jvp`` (the hand-derived gradient on dual
numbers); the plan is the CPU gradient's (``_sequence``, ``rnn.py``, ``gru.py``,
``lstm.py``) with a tangent beside every value:

- the saved result's tangent first, from this backend's own fused forward mode (``_jvp``);
- per step (``Walk.back_times()``): the cell's backward kernel for the gate gradients
  ``dZ_t`` (the primal, as the CPU gradient computes it) and one fused Numba pass for their
  tangents ``dZ'_t`` (``_grad_jvp_kernels``; with the LSTM's layer norm NumPy's, as the
  forward mode's layer-normalised step is); then the carry ``dZ_t·W_hᵀ`` and its tangent
  ``dZ'_t·W_hᵀ + dZ_t·W_h'ᵀ`` (BLAS; one stacked call, ``_jvp.Linear`` on
  ``[W_hᵀ; W_h'ᵀ]``, where the plan allows);
- after the loop ``dx``, ``dW`` and their tangents over all ``T·B`` rows: by the product
  rule ``input_and_weight_grads`` on ``(x, W, dZ')`` plus on ``(x', W', dZ)``
  (``product_grads``).

The masks, zoneout's split, the upstream gradients and the rows past their length are
linear in the state gradient, so its tangent takes them exactly as the gradient does
(``upstream``, ``zoneout_split``, ``finish_state_grad``, ``masked_input_grad`` on the
tangent arrays). Branches follow the primals: relu' = [h > 0], whose own tangent is zero; a
clip's mask (``clip_grad="exact"``) zeroes the tangent where it zeroes the gradient,
``"straight_through"`` masks neither. The ops see a time-major, forward-running sequence
(``gradcells._order.grad_jvp``). Scratch comes from ``_workspace.scratch``; results are
fresh arrays; inputs are never written.
"""

from __future__ import annotations

import numpy as np

from .._core.plan import flat
from .._core.types import LSTMNorm, LSTMSequenceGrads
from ._compile import kernel_array
from ._grad_jvp_kernels import (
    gru_candidate_grad_tangent_kernel,
    gru_reset_after_grad_tangent_kernel,
    gru_reset_grad_tangent_kernel,
    lstm_backward_tangent_kernel,
    rnn_backward_tangent_kernel,
)
from ._gru_kernels import (
    gru_candidate_grad_kernel,
    gru_reset_after_grad_kernel,
    gru_reset_grad_kernel,
)
from ._jvp import (
    Linear,
    gru_jvp,
    input_tangent,
    layer_norm_stats,
    layer_norm_tangent,
    lstm_jvp,
    norm_tangents,
    rnn_jvp,
    sequence_inputs,
    stack_shape,
    step_pair,
    tangent_or_zeros,
)
from ._jvp_kernels import rnn_jvp_kernel
from ._lstm_kernels import (
    layer_norm_grad_kernel,
    layer_norm_stats_kernel,
    lstm_backward_kernel,
    lstm_ln_backward_kernel,
)
from ._rnn_kernels import rnn_backward_kernel
from ._sequence import (
    Walk,
    contiguous,
    finish_state_grad,
    initial_carry,
    input_and_weight_grads,
    masked_input_grad,
    projection,
    seen_states,
    stopped_rows,
    upstream,
    zoneout_split,
)
from ._workspace import scratch
from .gru import _input_and_weight_grads, _Scratch, _split_weights
from .rnn import _reads_saved_states


def upstream_pair(gradient, tangent):
    """An upstream gradient and its tangent, each C-contiguous or None (zero)."""
    return (None if gradient is None else contiguous(gradient),
            None if tangent is None else contiguous(tangent))


def carry_pair(final, d_final, shape, dtype):
    """The carried state gradient and its tangent before the backward loop
    (``initial_carry`` of each)."""
    return initial_carry(final, shape, dtype), initial_carry(d_final, shape, dtype)


def back_linear(w_h, dw_h):
    """``Linear`` of the carried gradient's matmul: ``[W_hᵀ; dW_hᵀ]`` (C-contiguous)."""
    return Linear.of(np.ascontiguousarray(w_h.T), None if dw_h is None else dw_h.T)


def sequence_of_one(x, h_prev, state, tangents, d_h, d_h_tangent):
    """A cell's arguments as a sequence of one step's: ``(x [1, B, I], h0, the result's
    fields (``state.h`` also the final state), the tangents' fields, the upstreams
    (d_h, d_h_final, d_h_tangent, d_h_final_tangent))``, each step array with a time
    axis."""
    def step(a):
        return None if a is None else a[None]

    return (x[None], h_prev, (*map(step, state), state.h), (step(tangents.x), *tangents[1:]),
            (step(d_h), None, step(d_h_tangent), None))


def product_grads(walk, primal, tangent, d_parts):
    """``(dx, dw)`` and their tangents from the gradients of the matmuls' outputs:
    ``primal = (x, h0_seen, w, h_seen)`` and ``tangent`` its tangents (arrays),
    ``d_parts = (dZ, dZ')``, each an array or a pair ``(dZ_x, dZ_h)`` (the gradients of
    ``x·W_x`` and ``h_prev·W_h`` where they differ); the tangents by the product rule,
    ``input_and_weight_grads`` on ``(x, W, dZ')`` plus on ``(x', W', dZ)``."""
    d_z, t_z = (p if isinstance(p, tuple) else (p,) for p in d_parts)
    dx, dw = input_and_weight_grads(walk, *primal, *d_z)
    tx, tw = input_and_weight_grads(walk, *primal, *t_z)
    tx2, tw2 = input_and_weight_grads(walk, *tangent, *d_z)
    return (dx, dw), (tx + tx2, tw + tw2)


def state_step(zoneout, t, carried, d_steps, stopped, buffers):
    """The gradient of step t's new state (``upstream``) split by zoneout
    (``zoneout_split``): ``(to the step's kernel, to the old state or None)``; ``buffers``:
    two ``[B, N]`` scratch arrays."""
    total = upstream(carried, d_steps, t, buffers[0], stopped)
    return zoneout_split(zoneout, t, total, buffers[0], buffers[1])


# --------------------------------------------------------------------------------------
# RNN


def rnn_grad_jvp(x, h0, weights, seq, tangents, settings, relu, upstreams):
    """``rnn.rnn_sequence_grad`` and its tangent: ``(grads, d_grads)``, each ``(dx, dh0,
    dw, db)``; ``upstreams = (d_h, d_h_final, d_h_tangent, d_h_final_tangent)``. Per step,
    ``up`` the step's gradient ((1-z)∘ of carry plus ``d_h[t]``) and ``up'`` its tangent:

        dz' = act'(h̃)∘up' + act''(h̃)[h̃']∘up        (``rnn_backward_tangent_kernel``)
        grad_h' = (dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec + z∘(carry' + d_h'[t])

    ``act'`` and its tangent read every step's own output before zoneout and its tangent:
    the saved ``h`` and the forward-mode tangent ``h'`` (``rnn_jvp``) without zoneout or with
    a binary one (``rnn._reads_saved_states``), else ``h̃ = act(x·W_x + b + h_seen·W_h)``
    and its tangent recomputed over all steps at once (``_rnn_unzoned``)."""
    t_w = (tangents.w, tangents.b)
    _, _, dh_seq, _ = rnn_jvp(x, tangents.x, h0, tangents.h0, weights, t_w, settings, relu)
    h0, w = contiguous(h0), contiguous(weights.w)
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    x, dx, lengths, masks = sequence_inputs(x, tangents.x, settings, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    walk = Walk(n_steps, lengths, False)
    d_h, d_h_t = upstream_pair(upstreams[0], upstreams[2])
    grad_h, d_grad_h = carry_pair(upstreams[1], upstreams[3], (n_batch, n_hidden), dtype)
    dw, dh0 = tangent_or_zeros(tangents.w, w), tangent_or_zeros(tangents.h0, h0)
    h = contiguous(seq.h)
    h0_seen, h_seen = seen_states(h0, h, masks.recurrent)
    dh0_seen, dh_seen = seen_states(dh0, dh_seq, masks.recurrent)
    lin_back = back_linear(w[n_in:], None if tangents.w is None else dw[n_in:])
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)
    recompute = not _reads_saved_states(masks.zoneout_h)
    buffers = scratch(dtype, steps, steps, *[state] * 6, stack_shape(lin_back, n_batch),
                      *([steps] * 4 if recompute else []))
    d_z, dd_z = buffers[:2]
    outputs = (h, dh_seq) if not recompute else _rnn_unzoned(
        walk, (x, dx), (h0_seen, h_seen, dh0_seen, dh_seen), weights, t_w, relu, buffers[9:])
    sums = np.zeros(n_hidden, dtype), np.zeros(n_hidden, dtype)
    _rnn_backward_steps(outputs, (d_h, d_h_t), (grad_h, d_grad_h), walk, (d_z, dd_z),
                        (lin_back, relu, masks), buffers[2:9], sums)
    (dx, dw), (d_dx, d_dw) = product_grads(
        walk, (x, h0_seen, w, h_seen), (tangent_or_zeros(dx, x), dh0_seen, dw, dh_seen),
        (d_z, dd_z))
    return ((masked_input_grad(dx, masks.input), grad_h, dw, sums[0]),
            (masked_input_grad(d_dx, masks.input), d_grad_h, d_dw, sums[1]))


def _rnn_unzoned(walk, inputs, states, weights, t_w, relu, buffers):
    """Every step's output before zoneout and its tangent, ``(h̃, h̃')``: the primal as
    ``rnn._unzoned_outputs`` computes it, ``h̃ = act(x·W_x + b + h_seen·W_h)``, and
    ``h̃' = act'∘(x'·W_x + x·W_x' + b' + h_seen'·W_h + h_seen·W_h')`` (``rnn_jvp_kernel``
    over all ``T·B`` rows). ``buffers``: four ``[T, B, H]`` scratch arrays."""
    x, dx = inputs
    h0_seen, h_seen, dh0_seen, dh_seen = states
    x_z, h_z, dx_z, dh_z = buffers
    n_in = x.shape[2]
    w, b = contiguous(weights.w), contiguous(weights.b)
    dw, db = t_w
    projection(x, w[:n_in], b, x_z)
    walk.recurrent_projection(h0_seen, h_seen, w[n_in:], h_z)
    lin_x = Linear.of(w[:n_in], None if dw is None else dw[:n_in])
    stack = np.empty(stack_shape(lin_x, x.shape[0] * x.shape[1]), x.dtype)
    input_tangent(lin_x, dx, x, None if db is None else contiguous(db), dx_z, stack)
    walk.recurrent_projection(dh0_seen, dh_seen, w[n_in:], dh_z)
    if dw is not None:
        dh_z += _recurrent_product(walk, h0_seen, h_seen, contiguous(dw[n_in:]))
    out, d_out = np.empty_like(x_z), np.empty_like(x_z)
    if out.size:
        rnn_jvp_kernel(flat(h_z), flat(x_z), flat(dh_z), flat(dx_z), relu, flat(out),
                       flat(d_out))
    return out, d_out


def _recurrent_product(walk, h0, h, w):
    """``h_prev·w`` for every step (``Walk.recurrent_projection``), a fresh array."""
    out = np.zeros((*h.shape[:2], w.shape[1]), h.dtype)
    walk.recurrent_projection(h0, h, w, out)
    return out


def _rnn_backward_steps(outputs, d_h, carry, walk, d_z, fixed, buffers, sums):
    """The backward loop with its tangent: updates ``carry = (grad_h, grad_h')`` in place
    to the gradient of ``h0`` and its tangent, writes every step's ``d_z = (dz, dz')`` and
    accumulates ``sums = (db, db')``. ``outputs = (h̃, h̃')``, ``d_h = (d_h, d_h')``;
    ``fixed = (lin_back, relu, masks)``; ``buffers``: six ``[B, H]`` and the stack."""
    h, dh = outputs
    lin_back, relu, masks = fixed
    bufs, d_bufs, (prev, d_prev), stack = buffers[0:2], buffers[2:4], buffers[4:6], buffers[6]
    for t in walk.back_times():
        stopped = stopped_rows(walk.lengths, t)
        up, up_old = state_step(masks.zoneout_h, t, carry[0], d_h[0], stopped, bufs)
        d_up, d_up_old = state_step(masks.zoneout_h, t, carry[1], d_h[1], stopped, d_bufs)
        rnn_backward_kernel(h[t], up, up, False, relu, d_z[0][t], sums[0])
        rnn_backward_tangent_kernel(h[t], dh[t], up, d_up, relu, d_z[1][t], sums[1])
        target = carry if stopped is None else (prev, d_prev)
        np.matmul(d_z[0][t], lin_back.w, out=target[0])
        lin_back.into(d_z[1][t], d_z[0][t], target[1], stack)
        finish_state_grad(target[0], masks.recurrent, up_old)
        finish_state_grad(target[1], masks.recurrent, d_up_old)
        if stopped is not None:      # stopped rows keep their state gradient
            np.copyto(carry[0], prev, where=~stopped)
            np.copyto(carry[1], d_prev, where=~stopped)


# --------------------------------------------------------------------------------------
# GRU


def gru_grad_jvp(x, h0, weights, seq, tangents, settings, reset_after, upstreams):
    """``gru.gru_sequence_grad`` and its tangent: ``(grads, d_grads)``, each ``(dx, dh0,
    dw_ru, dw_c, db_ru, db_c)``; ``upstreams = (d_h, d_h_final, d_h_tangent,
    d_h_final_tangent)``.

    The saved gates' tangents are ``gru_jvp``'s. Per step (``_gru_backward_steps``) the
    gradient's kernels and their tangents' passes (``_grad_jvp_kernels``) around the
    matmuls' tangents (``Linear``):

        reset before:  d_hr' = (dc_bar'·W_chᵀ + dc_bar·W_ch'ᵀ)∘m_rec
        reset after:   n' = h_seen'·W_ch + h_seen·W_ch' + b_ch' (all steps first, as n)
        grad_h' = ([dr', du']·W_ruhᵀ + [dr, du]·W_ruh'ᵀ + (d_n'·W_chᵀ + d_n·W_ch'ᵀ))∘m_rec
                  + z∘up' + direct'          (the bracket reset after; direct' the kernels')

    After
    the loop ``gru._input_and_weight_grads`` three times: on the gate gradients, on their
    tangents, and on the gate gradients with the tangents of ``x``, the states, the weights
    and (reset before) of the rows ``r∘h_seen``."""
    d_seq = gru_jvp(x, tangents.x, h0, tangents.h0, weights, tangents[2:], settings,
                    reset_after)[1]
    h0, b_c = contiguous(h0), contiguous(weights.b_c)
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    x, dx, lengths, masks = sequence_inputs(x, tangents.x, settings, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    walk = Walk(n_steps, lengths, False)
    seq = tuple(map(contiguous, seq[:4]))
    d_t = [tangent_or_zeros(d, p) for d, p in zip(tangents[1:], (h0, *weights))]
    split = _split_weights(weights.w_ru, weights.w_c, n_in)
    d_split = _split_weights(d_t[1], d_t[2], n_in)
    lin_ruh = back_linear(split[1], None if tangents.w_ru is None else d_split[1])
    lin_ch = back_linear(split[3], None if tangents.w_c is None else d_split[3])
    work, d_work, stacks = _gru_scratch(dtype, (n_steps, n_batch, n_in, n_hidden), reset_after,
                                        (lin_ruh, lin_ch))
    np.copyto(work.w_ruh_t, split[1].T)
    np.copyto(work.w_ch_t, split[3].T)
    h0_seen, h_seen = seen_states(h0, seq[3], masks.recurrent)
    dh0_seen, dh_seen = seen_states(d_t[0], d_seq[3], masks.recurrent)
    b_ch = None
    if reset_after:
        b_ch = b_c[n_hidden:]
        walk.recurrent_projection(h0_seen, h_seen, split[3], work.recurrent)
        walk.recurrent_projection(dh0_seen, dh_seen, split[3], d_work.recurrent)
        if tangents.w_c is not None:
            d_work.recurrent[...] += _recurrent_product(walk, h0_seen, h_seen, d_split[3])
        d_work.recurrent[...] += d_t[4][n_hidden:]
    carry = carry_pair(upstreams[1], upstreams[3], (n_batch, n_hidden), dtype)
    sums = [(np.zeros(2 * n_hidden, dtype), np.zeros(b_c.shape[0], dtype)) for _ in range(2)]
    _gru_backward_steps((h0, d_t[0]), (seq, d_seq[:4]), upstream_pair(*upstreams[::2]), carry,
                        walk, (work, d_work, stacks), (lin_ruh, lin_ch, b_ch, masks), sums)
    if masks.recurrent is not None and not reset_after:     # the rows r∘h_prev∘m_rec
        for w in (work, d_work):
            np.multiply(w.d_n_or_reset_h, masks.recurrent, out=w.d_n_or_reset_h)
    grads = _gru_product_rule(walk, (x, h0_seen, h_seen, split),
                              (tangent_or_zeros(dx, x), dh0_seen, dh_seen, d_split),
                              work, d_work, reset_after)
    (dx, dw_ru, dw_c), (d_dx, d_dw_ru, d_dw_c) = grads
    return ((masked_input_grad(dx, masks.input), carry[0], dw_ru, dw_c, *sums[0]),
            (masked_input_grad(d_dx, masks.input), carry[1], d_dw_ru, d_dw_c, *sums[1]))


def _gru_scratch(dtype, sizes, reset_after, linears):
    """The gradient's ``gru._Scratch``, its tangent's (the same fields; no ``W_ᵀ`` copies)
    and the two stacks of ``linears`` ``(W_ruhᵀ, W_chᵀ)``, taken at once."""
    n_steps, n_batch, n_in, n_hidden = sizes
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)

    def fields(transposes):
        return (state, state, state, state, (n_steps, n_batch, 2 * n_hidden), steps, steps,
                steps if reset_after else (0,), (n_steps * n_batch, n_in), *transposes,
                state, state)
    buffers = scratch(dtype, *fields([(2 * n_hidden, n_hidden), (n_hidden, n_hidden)]),
                      *fields([(0, 0), (0, 0)]),
                      *(stack_shape(lin, n_batch) for lin in linears))
    count = len(_Scratch._fields)
    return _Scratch(*buffers[:count]), _Scratch(*buffers[count:2 * count]), buffers[2 * count:]


def _gru_backward_steps(first, saved, d_h, carry, walk, work, fixed, sums):
    """The backward loop with its tangent (``gru._backward_steps``, each value with its
    tangent beside it): updates ``carry = (grad_h, grad_h')`` in place, writes every step's
    gate gradients and their tangents into ``work = (work, d_work, stacks)`` and accumulates
    ``sums = ((db_ru, db_c), (db_ru', db_c'))``. ``first = (h0, h0')``; ``saved = ((r, u, c,
    h), their tangents)``; ``d_h = (d_h, d_h')``; ``fixed = (lin_ruh, lin_ch, b_ch,
    masks)`` (``b_ch`` None: reset before)."""
    (r, u, c, h), (dr, du, dc, dh) = saved
    works, stacks = work[:2], work[2]
    lin_ruh, lin_ch, b_ch, masks = fixed
    for t in walk.back_times():
        stopped = stopped_rows(walk.lengths, t)
        ups = [state_step(masks.zoneout_h, t, carry[k], d_h[k], stopped, (w.upstream, w.old))
               for k, w in enumerate(works)]
        states = tuple(walk.previous_of_step(a, first[k], t, works[k].previous)
                       for k, a in enumerate((h, dh)))
        step = (ups[0][0], ups[1][0], (r[t], u[t], c[t]), (dr[t], du[t], dc[t]), states)
        if b_ch is not None:
            _gru_reset_after_step(t, step, works, (lin_ch, b_ch, stacks[1]), sums,
                                  masks.recurrent)
        else:
            _gru_reset_before_step(t, step, works, (lin_ch, stacks[1]), sums, masks.recurrent)
        for k, w in enumerate(works):
            target = carry[k] if stopped is None else w.dh_prev
            if k == 0:
                np.matmul(w.d_ru[t], w.w_ruh_t, out=target)
            else:
                lin_ruh.into(w.d_ru[t], works[0].d_ru[t], target, stacks[0])
            if masks.recurrent is not None and b_ch is not None:
                target += w.candidate_h
            finish_state_grad(target, masks.recurrent, ups[k][1])
            target += w.direct
            if stopped is not None:      # stopped rows keep their state gradient
                np.copyto(carry[k], w.dh_prev, where=~stopped)


def _gru_reset_after_step(t, step, works, fixed, sums, m_rec):
    """A reset-after step's gate gradients and their tangents into ``works = (work,
    d_work)``: the gradient's kernel, the tangent's pass, ``d_n·W_chᵀ`` and its tangent
    (added to ``direct`` here without a recurrent mask); ``step = (up, up', outs, d_outs,
    states)``; ``fixed = (lin_ch, b_ch, stack)``."""
    up, d_up, outs, d_outs, states = step
    work, d_work = works
    lin_ch, b_ch, stack = fixed
    gru_reset_after_grad_kernel(up, True, *outs, states[0], work.recurrent[t], b_ch,
                                work.d_c[t], work.d_n_or_reset_h[t], work.d_ru[t], work.direct,
                                *sums[0])
    gru_reset_after_grad_tangent_kernel(
        up, d_up, outs, d_outs, states, (work.recurrent[t], b_ch), d_work.recurrent[t],
        (work.d_c[t], work.d_n_or_reset_h[t]),
        (d_work.d_c[t], d_work.d_n_or_reset_h[t], d_work.d_ru[t], d_work.direct), sums[1])
    np.matmul(work.d_n_or_reset_h[t], work.w_ch_t, out=work.candidate_h)
    lin_ch.into(d_work.d_n_or_reset_h[t], work.d_n_or_reset_h[t], d_work.candidate_h, stack)
    if m_rec is None:
        work.direct[...] += work.candidate_h
        d_work.direct[...] += d_work.candidate_h


def _gru_reset_before_step(t, step, works, fixed, sums, m_rec):
    """A reset-before step's gate gradients and their tangents into ``works = (work,
    d_work)``: the candidate's kernel and its tangent's pass, ``d_hr = (dc_bar·W_chᵀ)∘m_rec``
    and its tangent, then the reset gate's tangent pass (before the gradient's kernel
    overwrites ``d_hr``) and kernel; ``fixed = (lin_ch, stack)``."""
    up, d_up, outs, d_outs, states = step
    work, d_work = works
    lin_ch, stack = fixed
    no_x = np.empty((up.shape[0], 0), up.dtype)
    gru_candidate_grad_kernel(up, True, *outs, states[0], no_x, work.d_c[t], work.d_ru[t],
                              work.d_n_or_reset_h[t], *sums[0])
    gru_candidate_grad_tangent_kernel(
        up, d_up, outs, d_outs, states,
        (d_work.d_c[t], d_work.d_ru[t], d_work.d_n_or_reset_h[t]), sums[1])
    np.matmul(work.d_c[t], work.w_ch_t, out=work.direct)
    lin_ch.into(d_work.d_c[t], work.d_c[t], d_work.direct, stack)
    finish_state_grad(work.direct, m_rec, None)
    finish_state_grad(d_work.direct, m_rec, None)
    gru_reset_grad_tangent_kernel(work.direct, d_work.direct, up, d_up, outs[:2], d_outs[:2],
                                  states, d_work.d_ru[t], sums[1][0])
    gru_reset_grad_kernel(work.direct, up, True, *outs[:2], states[0], work.d_ru[t],
                          sums[0][0])


def _gru_product_rule(walk, primal, tangent, work, d_work, reset_after):
    """``gru._input_and_weight_grads`` and its tangent: ``((dx, dw_ru, dw_c), (dx', dw_ru',
    dw_c'))``; ``primal = (x, h0_seen, h_seen, split weights)`` and ``tangent`` theirs. The
    tangent is the function on the gate gradients' tangents (with the rows ``r∘h_seen``
    reset before) plus the function on the tangents' inputs with the gate gradients (and
    the rows' tangent)."""
    grads = _input_and_weight_grads(walk, *primal, work, reset_after)
    rows = ((d_work.d_n_or_reset_h, work.d_n_or_reset_h) if reset_after
            else (work.d_n_or_reset_h, d_work.d_n_or_reset_h))
    on_tangents = work._replace(d_ru=d_work.d_ru, d_c=d_work.d_c, d_n_or_reset_h=rows[0])
    a = _input_and_weight_grads(walk, *primal, on_tangents, reset_after)
    b = _input_and_weight_grads(walk, *tangent, work._replace(d_n_or_reset_h=rows[1]),
                                reset_after)
    for part, more in zip(a, b):
        part += more
    return grads, a


# --------------------------------------------------------------------------------------
# LSTM



def lstm_grad_jvp(x, states, weights, seq, tangents, settings, upstreams, clip_grad):
    """``lstm_sequence_grad`` and its tangent: ``(grads, grads_tangent)``, each an
    ``LSTMSequenceGrads`` (``states = (cs0, h0)``; ``upstreams``: ``(gradient, tangent)``
    pairs for ``d_h, d_cs, d_h_final, d_cs_final``, None fields zero).

    The result's tangent from ``_jvp.lstm_jvp``; then ``lstm_sequence_grad``'s loop
    (``_lstm_backward``) with ``lstm_backward_tangent_kernel`` beside
    ``lstm_backward_kernel`` (``_LSTMCell``; with a layer norm ``_LSTMNormCell``), and
    ``product_grads``."""
    cs0, h0 = (kernel_array(a) for a in states)
    n_hidden, n_state = cs0.shape[1], h0.shape[1]
    d_seq = lstm_jvp(x, tangents.x, (cs0, h0), (tangents.cs0, tangents.h0), weights,
                     tangents[3:], settings)[1]
    x, dx, lengths, masks = sequence_inputs(x, tangents.x, settings, n_state, n_hidden)
    dx = np.zeros_like(x) if dx is None else dx
    walk = Walk(x.shape[0], lengths, False)
    w = kernel_array(weights.w)
    t_w = tangent_or_zeros(tangents.w, w)
    firsts = (cs0, tangent_or_zeros(tangents.cs0, cs0))
    saved = _own_cells(firsts, tuple(map(kernel_array, seq[:7])), d_seq[:7], weights,
                       tangents, settings, masks)
    h_steps = seen_states(h0, saved[0][6], masks.recurrent), seen_states(
        tangent_or_zeros(tangents.h0, h0), saved[1][6], masks.recurrent)
    shape = saved[0][0].shape
    if weights.layer_norm is None:
        cell = _LSTMCell(weights, tangents, settings, clip_grad, shape)
    else:
        cell = _LSTMNormCell(weights, tangents, settings, clip_grad, shape,
                             (walk, (x, dx), h_steps, (w, t_w)))
    proj = None if weights.w_proj is None else _ProjectionJVP(weights, tangents, settings,
                                                              clip_grad, seq)
    carries = _lstm_backward(x.shape[2], firsts, saved, (w, t_w), cell, settings, upstreams,
                             (lengths, masks), proj)
    d_parts, norms = (cell.gates, None) if weights.layer_norm is None else cell.finish()
    (gx, gw), (tx, tw) = product_grads(walk, (x, h_steps[0][0], w, h_steps[0][1]),
                                       (dx, h_steps[1][0], t_w, h_steps[1][1]), d_parts)
    w_proj = (None, None) if proj is None else proj.weight_grads()
    results = []
    for k, (g_x, g_w) in enumerate(((gx, gw), (tx, tw))):
        sums = cell.sums[k]
        peeps = sums[1:4] if settings.peepholes else (None, None, None)
        results.append(LSTMSequenceGrads(
            x=masked_input_grad(g_x, masks.input), cs0=carries[k][0], h0=carries[k][1],
            w=g_w, b=sums[0], wci=peeps[0], wcf=peeps[1], wco=peeps[2], w_proj=w_proj[k],
            layer_norm=None if norms is None else norms[k]))
    return tuple(results)


def _own_cells(firsts, seq, d_seq, weights, tangents, settings, masks):
    """``(saved, d_saved)``: the saved steps and their tangents with every step's own cell
    state (before zoneout mixed it with the old one) in place of the saved one, as the
    gradient reads them (``lstm._unzoned_cells``), and the saved (zoned) cell state after
    them, the next step's ``cs_prev``; the tangent ``c̃' = i'∘ci + i∘ci' + f'∘cs_prev +
    f∘cs_prev'``, zero where the clip is active (the boundary passes), with the
    normalising carry ``LN(c̃)``'s (``_jvp.layer_norm_tangent``)."""
    from .lstm import _unzoned_cells

    if masks.zoneout_cs is None:
        return (*seq, seq[1]), (*d_seq, d_seq[1])
    n_steps = seq[0].shape[0]
    own = _unzoned_cells(Walk(n_steps, None, False), firsts[0], seq, weights, settings, masks,
                         np.empty_like(seq[0]))
    i, cs, f, _, ci = seq[:5]
    di, _, df, _, dci = d_seq[:5]
    cs_prev, dcs_prev = (np.concatenate((first[None], steps[:-1]))[:n_steps]
                         for first, steps in zip(firsts, (cs, d_seq[1])))
    c_tilde, d_tilde = _candidate(seq[:5], d_seq[:5], cs_prev, dcs_prev, settings)
    norm = weights.layer_norm
    if norm is not None and settings.ln_carry == "normalized":
        d_norm = norm_tangents(tangents.layer_norm, norm)
        d_tilde = layer_norm_tangent(c_tilde, d_tilde, norm.gamma_c, d_norm.gamma_c,
                                     d_norm.beta_c, settings.ln_epsilon)
    return (*own, cs), (di, d_tilde, *d_seq[2:], d_seq[1])


def _candidate(gates, d_gates, cs_prev, dcs_prev, settings):
    """``(c̃, c̃')``: ``c̃ = clip(i∘ci + f∘cs_prev)`` from the saved ``gates = (i, cs, f, o,
    ci)`` (``cs`` unread) and its tangent, zero where the clip is active."""
    i, _, f, _, ci = gates
    di, _, df, _, dci = d_gates
    raw = i * ci + f * cs_prev
    d_tilde = di * ci + i * dci + df * cs_prev + f * dcs_prev
    if settings.cell_clip is None:
        return raw, d_tilde
    passes = np.abs(raw) <= settings.cell_clip
    return (np.clip(raw, -settings.cell_clip, settings.cell_clip),
            np.where(passes, d_tilde, np.zeros((), d_tilde.dtype)))


def _lstm_backward(n_in, firsts, saved, w_pair, cell, settings, upstreams, running, proj):
    """``lstm_sequence_grad``'s backward loop (``lstm._backward_steps``) with a tangent
    beside every value; returns the state gradients before step 0 and their tangents
    ``((dcs0, dh0), (dcs0', dh0'))``. ``cell`` (``_LSTMCell`` or ``_LSTMNormCell``) runs
    each step's kernels, keeping the gate gradients, their tangents and the sums;
    ``proj``: a ``_ProjectionJVP`` or None.

    Per step t, back from the final states: ``state_step`` for both states' gradients
    and their tangents; the projection's backward and its tangent; ``cell``; the carries
    ``dZ_t·W_hᵀ`` and ``dZ'_t·W_hᵀ + dZ_t·W_h'ᵀ`` (BLAS; ``dZ`` what multiplies ``W_hᵀ``,
    ``dG`` or with a layer norm ``dz_h``) through ``finish_state_grad``; stopped rows keep
    their state gradients and tangents."""
    (seq, d_seq), (lengths, masks), (w, t_w) = saved, running, w_pair
    n_steps, n_batch, n_hidden = seq[0].shape
    n_state, dtype = seq[6].shape[2], seq[0].dtype
    (d_h, t_h), (d_cs, t_cs), (d_hf, t_hf), (d_csf, t_csf) = (
        tuple(None if a is None else kernel_array(a) for a in pair) for pair in upstreams)
    carry_h = [initial_carry(a, (n_batch, n_state), dtype) for a in (d_hf, t_hf)]
    carry_cs = [initial_carry(a, (n_batch, n_hidden), dtype) for a in (d_csf, t_csf)]
    w_h_t, t_w_h_t = (np.ascontiguousarray(a[n_in:].T) for a in (w, t_w))
    h_bufs, cs_bufs = ([np.empty((n_batch, n), dtype) for _ in range(4)]
                       for n in (n_state, n_hidden))
    prev_cs = [np.empty((n_batch, n_hidden), dtype) for _ in range(2)]
    prev_h = [np.empty((n_batch, n_state), dtype) for _ in range(2)]
    for t in range(n_steps - 1, -1, -1):
        stopped = stopped_rows(lengths, t)
        ups_h = [state_step(masks.zoneout_h, t, c, d, stopped, h_bufs[2 * k:2 * k + 2])
                 for k, (c, d) in enumerate(zip(carry_h, (d_h, t_h)))]
        ups_cs = [state_step(masks.zoneout_cs, t, c, d, stopped, cs_bufs[2 * k:2 * k + 2])
                  for k, (c, d) in enumerate(zip(carry_cs, (d_cs, t_cs)))]
        to_h = [u[0] for u in ups_h]
        if proj is not None:
            to_h = proj.step(t, to_h, seq, d_seq)
        at = [(step_pair(t, first, steps[7]), *(a[t] for a in steps[:6]))
              for first, steps in zip(firsts, (seq, d_seq))]
        d_z = cell(t, at, to_h, [u[0] for u in ups_cs], prev_cs)
        for k in range(2):
            finish_state_grad(prev_cs[k], None, ups_cs[k][1])
            np.matmul(d_z[k], w_h_t, out=prev_h[k])
        prev_h[1] += d_z[0] @ t_w_h_t
        for k in range(2):
            finish_state_grad(prev_h[k], masks.recurrent, ups_h[k][1])
            if stopped is None:
                carry_h[k], prev_h[k] = prev_h[k], carry_h[k]
                carry_cs[k], prev_cs[k] = prev_cs[k], carry_cs[k]
            else:                        # stopped rows keep their state gradient
                np.copyto(carry_h[k], prev_h[k], where=~stopped)
                np.copyto(carry_cs[k], prev_cs[k], where=~stopped)
    return tuple((carry_cs[k], carry_h[k]) for k in range(2))


class _LSTMCell:
    """A step's gate gradients and their tangents without a layer norm:
    ``lstm_backward_kernel`` and ``lstm_backward_tangent_kernel`` into ``gates = (dG,
    dG') [T, B, 4H]``, accumulating ``sums`` (two ``lstm._norm_sums`` lists, the primal's
    and the tangent's)."""

    def __init__(self, weights, tangents, settings, clip_grad, shape):
        from .lstm import _mask_clip, _norm_sums, _peepholes

        n_steps, n_batch, n_hidden = shape
        dtype = weights.w.dtype
        *peeps, peephole = _peepholes(weights, settings, kernel_array)
        self.peeps = tuple(peeps)
        self.d_peeps = (tuple(tangent_or_zeros(d, p) for d, p in zip(tangents[5:8], peeps))
                        if peephole else self.peeps)
        self.options = (peephole, _mask_clip(settings, clip_grad))
        self.sums = [_norm_sums(4 * n_hidden, n_hidden, peephole, dtype) for _ in range(2)]
        self.gates = [np.zeros((n_steps, n_batch, 4 * n_hidden), dtype) for _ in range(2)]

    def __call__(self, t, at, to_h, to_cs, prev_cs):
        """Step t's kernels; returns ``(dG_t, dG'_t)``."""
        gates, sums = self.gates, self.sums
        lstm_backward_kernel(*at[0], to_h[0], True, to_cs[0], True, *self.peeps,
                             *self.options, gates[0][t], prev_cs[0], *sums[0][:4])
        lstm_backward_tangent_kernel(at[0], at[1], (to_h[0], to_cs[0]), (to_h[1], to_cs[1]),
                                     self.peeps, self.d_peeps, self.options, gates[1][t],
                                     prev_cs[1], tuple(sums[1][:4]))
        return gates[0][t], gates[1][t]


class _LSTMNormCell:
    """A step's gate gradients and their tangents with a layer norm: the CPU gradient's
    ``lstm_ln_backward_kernel`` (``dG``, ``dcs_prev``, the sums, ``dz_h``) and the tangent
    in NumPy, as the forward mode's layer-normalised step (``_ln_cell_tangent`` and
    ``layer_norm_grad_tangent`` of the recurrent part's norm); ``finish`` then the input
    part's norm for every step at once. The norms' ``ẑ, r`` are recomputed as the gradient
    does (``lstm._norm_backward_work``), their inputs' tangents ``z_x' = x'·W_x + x·W_x'``
    and ``z_h' = h_prev'·W_h + h_prev·W_h'`` (BLAS, every step at once).
    ``context = (walk, (x, x'), ((h0, h), (h0', h')) as the matmuls saw them, (w, w'))``."""

    def __init__(self, weights, tangents, settings, clip_grad, shape, context):
        from .lstm import _backward_norm_fixed, _mask_clip, _norm_sums

        walk, (x, dx), (h_seen, dh_seen), (w, t_w) = context
        n_steps, n_batch, n_hidden = shape
        n_in, dtype = x.shape[2], x.dtype
        gates = (n_steps, n_batch, 4 * n_hidden)
        self.norm = LSTMNorm(*map(kernel_array, weights.layer_norm))
        self.d_norm = norm_tangents(tangents.layer_norm, self.norm)
        self.x_hat, self.h_hat, t_zh, t_part = (np.zeros(gates, dtype) for _ in range(4))
        self.rstd = np.empty((2, n_steps, n_batch), dtype)
        projection(x, w[:n_in], None, self.x_hat)
        walk.recurrent_projection(*h_seen, w[n_in:], self.h_hat)
        for z, r in ((self.x_hat, self.rstd[0]), (self.h_hat, self.rstd[1])):
            layer_norm_stats_kernel(flat(z), settings.ln_epsilon, r.reshape(-1))
        self.t_zx = (flat(dx) @ w[:n_in] + flat(x) @ t_w[:n_in]).reshape(gates)
        walk.recurrent_projection(*dh_seen, w[n_in:], t_zh)
        walk.recurrent_projection(*h_seen, t_w[n_in:], t_part)
        self.t_zh = t_zh + t_part
        self.fixed = _backward_norm_fixed(self.norm, weights, settings, clip_grad,
                                          kernel_array)
        self.d_peeps = tuple(tangent_or_zeros(d, p)
                             for d, p in zip(tangents[5:8], self.fixed[:3]))
        self.settings, self.mask_clip = settings, _mask_clip(settings, clip_grad)
        peephole = settings.peepholes
        self.sums = [_norm_sums(4 * n_hidden, n_hidden, peephole, dtype) for _ in range(2)]
        self.gates = [np.zeros(gates, dtype) for _ in range(2)]
        self.dz_h = [np.zeros(gates, dtype) for _ in range(2)]

    def __call__(self, t, at, to_h, to_cs, prev_cs):
        """Step t; returns ``(dz_h,t, dz_h,t')``."""
        gates, sums, dz_h, norm = self.gates, self.sums, self.dz_h, self.norm
        np.copyto(dz_h[0][t], self.h_hat[t])            # the kernel writes dz_h over ĥ
        lstm_ln_backward_kernel(*at[0], to_h[0], True, to_cs[0], True, *self.fixed,
                                dz_h[0][t], self.rstd[1][t], gates[0][t], prev_cs[0],
                                *sums[0][:7])
        gates[1][t], prev_cs[1][...] = _ln_cell_tangent(at, to_h, to_cs, self)
        _, dz_h[1][t], t_gamma_h, _ = layer_norm_grad_tangent(
            gates[0][t], gates[1][t], norm.gamma_h, self.d_norm.gamma_h, self.h_hat[t],
            self.rstd[1][t][:, None], self.t_zh[t])
        sums[1][6] += t_gamma_h
        return dz_h[0][t], dz_h[1][t]

    def finish(self):
        """After the loop: ``((dz_x, dz_h), (dz_x', dz_h'))`` and the norms' gradients and
        their tangents (``lstm._norm_grads``); the input part's norm every step at once
        (``layer_norm_grad_kernel``, ``layer_norm_grad_tangent``)."""
        from .lstm import _norm_grads

        dz_x = self.x_hat.copy()
        layer_norm_grad_kernel(flat(self.gates[0]), self.norm.gamma_x, flat(dz_x),
                               self.rstd[0].reshape(-1), self.sums[0][7])
        _, t_dz_x, t_gamma_x, _ = layer_norm_grad_tangent(
            self.gates[0], self.gates[1], self.norm.gamma_x, self.d_norm.gamma_x, self.x_hat,
            self.rstd[0][..., None], self.t_zx)
        self.sums[1][7] += t_gamma_x
        return ((dz_x, self.dz_h[0]), (t_dz_x, self.dz_h[1])), [_norm_grads(s)
                                                               for s in self.sums]


def _ln_cell_tangent(at, to_h, to_cs, cell):
    """The tangent of ``lstm_ln_backward_kernel``'s ``dG`` and ``dcs_prev`` (NumPy), the
    reference's ``lstm_gate_grads`` with its cell norm (``lstm_cell_norm_grad``)
    differentiated, accumulating the tangents of the bias, peephole and cell-norm sums into
    ``cell.sums[1]``; ``at``: the step's ``(cs_prev, i, cs, f, o, ci, co)`` and their
    tangents, ``to_h, to_cs``: the upstream gradients and their tangents. Returns
    ``(dG', dcs_prev')``."""
    (cs_prev, i, cs, f, o, ci, co), (t_prev, t_i, t_cs, t_f, t_o, t_ci, t_co) = at
    (uh, t_uh), (ucs, t_ucs) = to_h, to_cs
    wci, wcf, wco, peephole = cell.fixed[:4]
    twci, twcf, twco = cell.d_peeps
    settings, norm, d_norm, sums = cell.settings, cell.norm, cell.d_norm, cell.sums[1]
    normalized = settings.ln_carry == "normalized"
    c_tilde, t_tilde = _candidate((i, cs, f, o, ci), (t_i, t_cs, t_f, t_o, t_ci), cs_prev,
                                  t_prev, settings)
    c_hat, r_c = layer_norm_stats(c_tilde, settings.ln_epsilon)
    s_o = o * (1 - o)
    d_o = uh * co * s_o
    t_do = (t_uh * co + uh * t_co) * s_o + uh * co * t_o * (1 - 2 * o)
    d_co = uh * o * (1 - co * co)
    t_dco = (t_uh * o + uh * t_o) * (1 - co * co) - 2 * uh * o * co * t_co
    d_carry, t_carry = ucs, t_ucs
    if peephole:
        d_carry, t_carry = ucs + d_o * wco, t_ucs + t_do * wco + d_o * twco
    d_n, t_dn = (d_co + d_carry, t_dco + t_carry) if normalized else (d_co, t_dco)
    d_state, t_state, t_gamma_c, _ = layer_norm_grad_tangent(
        d_n, t_dn, norm.gamma_c, d_norm.gamma_c, c_hat, r_c, t_tilde)
    if not normalized:
        d_state, t_state = d_state + d_carry, t_state + t_carry
    if cell.mask_clip < np.inf:
        passes = np.abs(i * ci + f * cs_prev) <= cell.mask_clip
        d_state = np.where(passes, d_state, np.zeros((), d_state.dtype))
        t_state = np.where(passes, t_state, np.zeros((), t_state.dtype))
    s_i, s_f = i * (1 - i), f * (1 - f)
    d_i, d_f = d_state * ci * s_i, d_state * cs_prev * s_f
    t_di = (t_state * ci + d_state * t_ci) * s_i + d_state * ci * t_i * (1 - 2 * i)
    t_dci = (t_state * i + d_state * t_i) * (1 - ci * ci) - 2 * d_state * i * ci * t_ci
    t_df = (t_state * cs_prev + d_state * t_prev) * s_f + d_state * cs_prev * t_f * (1 - 2 * f)
    t_gates = np.concatenate((t_di, t_dci, t_df, t_do), axis=1)
    t_dcs_prev = t_state * f + d_state * t_f
    sums[0] += t_gates.sum(axis=0)
    if peephole:
        t_dcs_prev += t_di * wci + d_i * twci + t_df * wcf + d_f * twcf
        sums[1] += (t_di * cs_prev + d_i * t_prev).sum(axis=0)
        sums[2] += (t_df * cs_prev + d_f * t_prev).sum(axis=0)
        sums[3] += (t_do * cs + d_o * t_cs).sum(axis=0)
    sums[4] += t_gamma_c
    sums[5] += t_dn.sum(axis=0)
    return t_gates, t_dcs_prev


def layer_norm_grad_tangent(dy, t_dy, gamma, t_gamma, z_hat, rstd, t_z):
    """The layer norm's backward (``reference._common.layer_norm_grad``) and its tangent,
    over the last axis (means over the row; ``rstd`` with a trailing axis of 1):

        g = dy∘γ;   dz = r·(g - mean(g) - ẑ∘mean(g∘ẑ))
        ẑ' = r·(z' - mean(z') - ẑ∘mean(ẑ∘z'));   r' = -r²·mean(ẑ∘z');   g' = dy'∘γ + dy∘γ'
        dz' = r'·(g - mean(g) - ẑ∘mean(g∘ẑ))
              + r·(g' - mean(g') - ẑ'∘mean(g∘ẑ) - ẑ∘mean(g'∘ẑ + g∘ẑ'))
        dγ' = Σ dy'∘ẑ + dy∘ẑ'      (sums over every axis but the last)

    Returns ``(dz, dz', dγ', ẑ')``."""
    n = max(z_hat.shape[-1], 1)

    def mean(a):
        return a.sum(axis=-1, keepdims=True) / n

    t_hat = rstd * (t_z - mean(t_z) - z_hat * mean(z_hat * t_z))
    t_rstd = -rstd * rstd * mean(z_hat * t_z)
    g, t_g = dy * gamma, t_dy * gamma + dy * t_gamma
    g_hat = mean(g * z_hat)
    core = g - mean(g) - z_hat * g_hat
    t_dz = t_rstd * core + rstd * (t_g - mean(t_g) - t_hat * g_hat
                                   - z_hat * mean(t_g * z_hat + g * t_hat))
    axes = tuple(range(dy.ndim - 1))
    return rstd * core, t_dz, (t_dy * z_hat + dy * t_hat).sum(axis=axes), t_hat


class _ProjectionJVP:
    """The projection's backward and its tangent, step by step (``lstm._projection_step``):
    ``dh_raw_t`` the state gradient zeroed where the clip was active (``clip_grad="exact"``;
    the boundary passes), ``dm_t = dh_raw_t·w_projᵀ``, ``dm'_t = dh_raw'_t·w_projᵀ +
    dh_raw_t·w_proj'ᵀ``; after the loop ``dw_proj = Mᵀ·DHraw`` and ``dw_proj' = M'ᵀ·DHraw +
    Mᵀ·DHraw'``, ``m = o∘co``, ``m' = o'∘co + o∘co'``."""

    def __init__(self, weights, tangents, settings, clip_grad, seq):
        w_proj = kernel_array(weights.w_proj)
        self.w_proj_t = np.ascontiguousarray(w_proj.T)
        self.t_w_proj_t = np.ascontiguousarray(tangent_or_zeros(tangents.w_proj, w_proj).T)
        self.w_proj = w_proj
        exact = settings.proj_clip is not None and clip_grad == "exact"
        self.clip = settings.proj_clip if exact else None
        n_steps, n_batch, n_hidden = seq[0].shape
        shape = (n_steps, n_batch, w_proj.shape[1])
        self.dh_raw = [np.zeros(shape, seq[0].dtype) for _ in range(2)]
        self.m = [np.zeros(seq[0].shape, seq[0].dtype) for _ in range(2)]

    def step(self, t, ups, seq, d_seq):
        """``(dm_t, dm'_t)`` from the state gradient and its tangent ``ups``."""
        o, co, do, dco = seq[3][t], seq[5][t], d_seq[3][t], d_seq[5][t]
        np.multiply(o, co, out=self.m[0][t])
        self.m[1][t] = do * co + o * dco
        for k in range(2):
            np.copyto(self.dh_raw[k][t], ups[k])
        if self.clip is not None:
            active = ~(np.abs(self.m[0][t] @ self.w_proj) <= self.clip)
            for k in range(2):
                np.copyto(self.dh_raw[k][t], 0, where=active)
        d_m = self.dh_raw[0][t] @ self.w_proj_t
        t_m = self.dh_raw[1][t] @ self.w_proj_t + self.dh_raw[0][t] @ self.t_w_proj_t
        return d_m, t_m

    def weight_grads(self):
        """``(dw_proj, dw_proj')`` over all steps."""
        (m, t_m), (dh, t_dh) = self.m, self.dh_raw
        return flat(m).T @ flat(dh), flat(t_m).T @ flat(dh) + flat(m).T @ flat(t_dh)
