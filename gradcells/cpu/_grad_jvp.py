"""The second order on the CPU (docs/spec.md §12): a sequence gradient's result exactly as
the CPU gradient computes it, and its tangent along the inputs' tangents and the upstream
gradients' tangents, in the same backward loop (a cell: a sequence of one step, its result
the CPU cell gradient's to round-off).

The math is the reference's ``*_grad_jvp`` (the hand-derived gradient on dual numbers); the
plan is the CPU gradient's (``_sequence``, ``rnn.py``, ``gru.py``) with a tangent beside
every value:

- the saved result's tangent first, from the CPU's own fused forward mode (``_jvp``);
- per step (``Walk.back_times()``): the gradient's backward kernel for the gate gradients
  ``dz`` and a fused tangent pass for ``dz'`` (``_grad_jvp_kernels``); the carried state
  gradient ``dz·W_hᵀ`` (BLAS) and its tangent ``dz'·W_hᵀ + dz·dW_hᵀ``, one stacked BLAS
  call (``_jvp.Linear`` on ``[W_hᵀ; dW_hᵀ]``);
- after the loop: ``dx``, ``dW`` by ``_sequence.input_and_weight_grads`` and their
  tangents by the product rule, the same function on ``(x, W, dZ')`` and on
  ``(x', W', dZ)``, summed.

The masks, zoneout, the upstream gradients and the rows past their length are linear in the
gradient, so the tangent takes them exactly as the gradient does (``upstream``,
``zoneout_split``, ``finish_state_grad``, ``masked_input_grad`` called on the tangents).
Branches follow the primal (relu' = [h > 0], whose own tangent is zero). The ops see a
time-major, forward-running sequence (``gradcells._order.grad_jvp``). A cell is a sequence
of one step. Scratch comes from ``_workspace.scratch``; results are fresh arrays; inputs are
never written.
"""

from __future__ import annotations

import numpy as np

from .._core.plan import flat
from ._grad_jvp_kernels import (
    gru_candidate_grad_tangent_kernel,
    gru_reset_after_grad_tangent_kernel,
    gru_reset_grad_tangent_kernel,
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
    rnn_jvp,
    sequence_inputs,
    stack_shape,
    tangent_or_zeros,
)
from ._jvp_kernels import rnn_jvp_kernel
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


def step_upstream(carry, d_steps, t, buffers, stopped, zoneout):
    """Step t's gradient ``(up, up_old)`` (``upstream`` then ``zoneout_split``) from the
    carry and the upstream ``d_steps``; ``buffers = (upstream [B, H], old [B, H])``. Called
    on the gradient and, alike, on its tangent."""
    up = upstream(carry, d_steps, t, buffers[0], stopped)
    return zoneout_split(zoneout, t, up, buffers[0], buffers[1])


def product_rule_grads(walk, primal, tangent, d_z, d_z_tangent):
    """``input_and_weight_grads`` and its tangent: ``(dx, dw, dx', dw')``. ``primal`` and
    ``tangent`` are ``(x, h0_seen, w, h_seen)`` and their tangents (zero arrays for zero
    tangents): ``dx' = dZ'·W_xᵀ + dZ·W_x'ᵀ``, ``dw' = [x, h_prev]ᵀ·dZ' + [x', h_prev']ᵀ·dZ``."""
    dx, dw = input_and_weight_grads(walk, *primal, d_z)
    dx_a, dw_a = input_and_weight_grads(walk, *primal, d_z_tangent)
    dx_b, dw_b = input_and_weight_grads(walk, *tangent, d_z)
    dx_a += dx_b
    dw_a += dw_b
    return dx, dw, dx_a, dw_a


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
    dx, dw, d_dx, d_dw = product_rule_grads(
        walk, (x, h0_seen, w, h_seen), (tangent_or_zeros(dx, x), dh0_seen, dw, dh_seen),
        d_z, dd_z)
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
        up, up_old = step_upstream(carry[0], d_h[0], t, bufs, stopped, masks.zoneout_h)
        d_up, d_up_old = step_upstream(carry[1], d_h[1], t, d_bufs, stopped, masks.zoneout_h)
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
        ups = [step_upstream(carry[k], d_h[k], t, (w.upstream, w.old), stopped,
                             masks.zoneout_h) for k, w in enumerate(works)]
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
