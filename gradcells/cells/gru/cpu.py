"""The GRU block cell and sequence on the CPU: BLAS matmuls plus fused Numba passes
(``_cpu_kernels``, which also shows the plan of passes and matmuls each way).

The math is ``gradcells.cells.gru.reference``. Reset before the candidate matmul (TensorFlow's
cell) takes two passes each way around the candidate's matmul; reset after (PyTorch's) one
pass each way, every matmul up front. A sequence projects every step's input at once and
runs the kernels once per step (``_sequence`` describes the plan, its scratch and
per-example lengths); its input projection is kept as two C-contiguous arrays,
``x·W_rux + b_ru [T, B, 2H]`` and ``x·W_cx (+ b_c) [T, B, H]``, so each step's slices are the
kernels' row-major inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._core.plan import flat, masked
from ..._core.xpmath import weights_part
from ...cpu._compile import kernel_array, one_row
from ...cpu._sequence import (
    Walk,
    contiguous,
    finish_state_grad,
    initial_carry,
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
    cell_linear,
    finish,
    input_tangent,
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
    gru_candidate_grad_kernel,
    gru_candidate_grad_tangent_kernel,
    gru_candidate_jvp_kernel,
    gru_candidate_kernel,
    gru_gates_grad_kernel,
    gru_gates_grad_tangent_kernel,
    gru_gates_jvp_kernel,
    gru_gates_kernel,
    gru_reset_after_grad_kernel,
    gru_reset_after_grad_tangent_kernel,
    gru_reset_after_kernel,
    gru_reset_after_tangent_kernel,
    gru_reset_grad_kernel,
    gru_reset_grad_tangent_kernel,
)
from .spec import GRUCellGrads, GRUCellState, GRUSequence, GRUSequenceGrads

# cell


def gru_cell(x, h_prev, weights, settings):
    """One GRU step; returns ``GRUCellState(r, u, c, h)``."""
    w_ru, w_c, b_ru, b_c = weights
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    h_prev = kernel_array(h_prev)
    xh = np.concatenate((x, h_prev), axis=1)
    gates_ru = np.dot(xh, w_ru)
    dtype = gates_ru.dtype
    r, u, c, h = (np.empty((n_batch, n_hidden), dtype) for _ in range(4))
    if settings.reset_after:
        b_c = kernel_array(b_c)
        gru_reset_after_kernel(gates_ru, one_row(b_ru), np.dot(x, w_c[:n_in]),
                               b_c[:n_hidden], np.dot(h_prev, w_c[n_in:]), b_c[n_hidden:],
                               h_prev, r, u, c, h)
    else:
        xrh = np.empty((n_batch, n_in + n_hidden), dtype)
        gru_gates_kernel(gates_ru, one_row(b_ru), kernel_array(x), h_prev, r, u, xrh)
        gru_candidate_kernel(np.dot(xrh, w_c), one_row(b_c), h_prev, u, c, h)
    return GRUCellState(r, u, c, h)


def gru_cell_grad(x, h_prev, weights, state, settings, *, d_r=None, d_u=None, d_c=None,
                  d_h=None):
    """Gradient of one GRU step with respect to every input (``GRUCellGrads``); the gates'
    own upstream gradients ``d_r, d_u, d_c`` (when any is given) by ``gru_gates_grad_kernel``
    after the step's backward kernels."""
    n_batch, n_hidden = h_prev.shape
    dtype = h_prev.dtype
    h_prev = kernel_array(h_prev)
    r, u, c = (kernel_array(a) for a in (state.r, state.u, state.c))
    has_d_h = d_h is not None
    d_h = kernel_array(d_h) if has_d_h else h_prev
    gates = _gate_upstreams((d_r, d_u, d_c), h_prev)
    xh = np.concatenate((x, h_prev), axis=1)
    d_ru = np.empty((n_batch, 2 * n_hidden), dtype)
    dc_bar = np.empty((n_batch, n_hidden), dtype)
    d_bias_ru = np.zeros(2 * n_hidden, dtype)
    upstream_and_state = (d_h, has_d_h, r, u, c, h_prev, gates)
    if settings.reset_after:
        dx, dh_prev, dw_c, d_bias_c = _reset_after_cell_grad(
            x, weights, upstream_and_state, dc_bar, d_ru, d_bias_ru)
    else:
        dx, dh_prev, dw_c, d_bias_c = _reset_before_cell_grad(
            x, weights, upstream_and_state, dc_bar, d_ru, d_bias_ru)
    return GRUCellGrads(x=dx, h_prev=dh_prev, w_ru=np.dot(xh.T, d_ru), w_c=dw_c,
                        b_ru=d_bias_ru, b_c=d_bias_c)


def _reset_after_cell_grad(x, weights, upstream_and_state, dc_bar, d_ru, d_bias_ru):
    """The reset-after cell's ``(dx, dh_prev, dw_c, db_c)``; writes ``dc_bar`` and ``d_ru``
    and accumulates ``d_bias_ru`` (``gru_reset_after_grad_kernel``)."""
    d_h, has_d_h, r, u, c, h_prev, gates = upstream_and_state
    w_ru, w_c = weights.w_ru, weights.w_c
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    dtype = h_prev.dtype
    b_c = kernel_array(weights.b_c)
    d_bias_c = np.zeros(2 * n_hidden, dtype)
    d_n = np.empty((n_batch, n_hidden), dtype)
    dh_direct = np.empty((n_batch, n_hidden), dtype)
    n_parts = (np.dot(h_prev, w_c[n_in:]), b_c[n_hidden:])
    gru_reset_after_grad_kernel(d_h, has_d_h, r, u, c, h_prev, *n_parts, dc_bar, d_n, d_ru,
                                dh_direct, d_bias_ru, d_bias_c)
    _add_gate_grads(gates, "r, u, c", None, (r, u, c), n_parts, (d_ru, dc_bar, d_n),
                   (d_bias_ru, d_bias_c))
    # x and h_prev rows apart: the sums are then contiguous (the whole gradient 3–7%
    # faster than adding into column slices of one [B, I+H] product, at (64, 256, 256))
    dx = np.dot(d_ru, w_ru[:n_in].T)
    dx += np.dot(dc_bar, w_c[:n_in].T)
    dh_prev = np.dot(d_ru, w_ru[n_in:].T)
    dh_prev += np.dot(d_n, w_c[n_in:].T)
    dh_prev += dh_direct
    dw_c = np.empty((n_in + n_hidden, n_hidden), dtype)
    np.dot(x.T, dc_bar, out=dw_c[:n_in])
    np.dot(h_prev.T, d_n, out=dw_c[n_in:])
    return dx, dh_prev, dw_c, d_bias_c


def _reset_before_cell_grad(x, weights, upstream_and_state, dc_bar, d_ru, d_bias_ru):
    """The reset-before cell's ``(dx, dh_prev, dw_c, db_c)``; writes ``dc_bar`` and ``d_ru``
    and accumulates ``d_bias_ru`` (``gru_candidate_grad_kernel``, ``gru_reset_grad_kernel``)."""
    d_h, has_d_h, r, u, c, h_prev, gates = upstream_and_state
    w_ru, w_c = weights.w_ru, weights.w_c
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    dtype = h_prev.dtype
    d_bias_c = np.zeros(n_hidden, dtype)
    xrh = np.empty((n_batch, n_in + n_hidden), dtype)
    gru_candidate_grad_kernel(d_h, has_d_h, r, u, c, h_prev, kernel_array(x), dc_bar, d_ru,
                              xrh, d_bias_ru, d_bias_c)
    outs, grads, sums = (r, u, c), (d_ru, dc_bar, dc_bar), (d_bias_ru, d_bias_c)
    _add_gate_grads(gates, "u, c", None, outs, None, grads, sums)
    dxhr = np.dot(dc_bar, w_c.T)
    gru_reset_grad_kernel(dxhr, d_h, has_d_h, r, u, h_prev, d_ru, d_bias_ru)
    _add_gate_grads(gates, "r", None, outs, None, grads, sums)
    dxh = np.dot(d_ru, w_ru.T)
    dxh += dxhr
    dw_c = np.dot(xrh.T, dc_bar)
    return dxh[:, :n_in], dxh[:, n_in:], dw_c, d_bias_c


# --------------------------------------------------------------------------------------
# the gates' own upstream gradients (docs/spec.md §16.1)


_EVERY_ROW = np.zeros(0, np.bool_)
_PARTS = {"r, u, c": (True, True, True), "u, c": (False, True, True), "r": (True, False, False)}


def _gate_upstreams(gates, like):
    """The gates' upstream gradients ``(d_r, d_u, d_c)`` as ``gru_gates_grad_kernel`` takes
    them: ``(arrays, has)``, a missing one ``like`` (an array of the shape, never read)
    with its flag False; None when all are None: then no pass runs, no work is added."""
    if all(g is None for g in gates):
        return None
    return (tuple(like if g is None else kernel_array(g) for g in gates),
            tuple(g is not None for g in gates))


def _gates_at(gates, t):
    """Step t's ``_gate_upstreams`` of a sequence's ``[T, B, H]`` gradients."""
    return None if gates is None else (tuple(a[t] for a in gates[0]), gates[1])


def _selected(gates, part):
    """The flags ``has`` of ``gates`` for the gates of ``part`` (a key of ``_PARTS``)."""
    return tuple(h and wanted for h, wanted in zip(gates[1], _PARTS[part], strict=True))


def _add_gate_grads(gates, part, stopped, outs, n_parts, grads, sums):
    """``gru_gates_grad_kernel``: the step's ``gates`` (``_gate_upstreams``'s; None: nothing
    to do) of ``part`` added to its gate gradients: all of them (reset after: ``n_parts``
    given), or reset before (``n_parts`` None) ``"u, c"`` after the candidate's kernel and
    ``"r"`` after the reset kernel. ``stopped``: ``stopped_rows``'s (None: every row runs)."""
    if gates is None or not any(has := _selected(gates, part)):
        return
    rows = _EVERY_ROW if stopped is None else stopped[:, 0]
    reset_after = n_parts is not None
    unread = (outs[0], sums[1])       # reset before: n's parts' types, never read
    gru_gates_grad_kernel(gates[0], has, rows, outs, n_parts if reset_after else unread,
                          reset_after, grads, sums)


def _add_gate_grad_tangents(gates, part, stopped, saved, n_parts, t_grads, t_sums):
    """``gru_gates_grad_tangent_kernel``, beside ``_add_gate_grads``: ``gates = (arrays,
    tangents, has)`` (``gate_pairs``'s, a step's), ``saved = (outs, t_outs)``, ``n_parts =
    (gates_ch, addend_ch, t_n)`` reset after (else None)."""
    if gates is None or not any(has := _selected(gates[::2], part)):
        return
    rows = _EVERY_ROW if stopped is None else stopped[:, 0]
    reset_after = n_parts is not None
    n_parts = n_parts if reset_after else (saved[0][0], t_sums[1], saved[0][0])   # unread
    gru_gates_grad_tangent_kernel(gates[0], gates[1], has, rows, saved[0], saved[1],
                                  n_parts[:2], n_parts[2], reset_after, t_grads, t_sums)


# --------------------------------------------------------------------------------------
# sequence


def _steps(seq):
    """A ``GRUSequence``'s every-step arrays ``(r, u, c, h)``, by name (``h_final`` left
    out)."""
    return seq.r, seq.u, seq.c, seq.h


def _split_weights(w_ru, w_c, n_in):
    """The x-rows and h-rows of ``w_ru`` and ``w_c``, each C-contiguous."""
    return tuple(contiguous(a) for a in (w_ru[:n_in], w_ru[n_in:], w_c[:n_in], w_c[n_in:]))


def gru_sequence(x, h0, weights, settings):
    """The GRU cell over ``x [T, B, I]``; see ``gradcells.reference``'s ``gru_sequence``.

    Reset before, per step: ``h_prev·W_ruh`` -> ``gru_gates_kernel`` (r, u, r∘h_prev) ->
    ``(r∘h_prev)·W_ch`` -> ``gru_candidate_kernel`` (c, h). Reset after: ``h_prev·W_ruh``
    and ``h_prev·W_ch`` -> ``gru_reset_after_kernel``.

    Masks (``_sequence``): the matmuls and the reset gate's product read ``h_prev∘m_rec``
    (a scratch ``[B, H]``), the interpolation ``u∘h_prev`` the state itself; zoneout mixes
    the kernel's new state with the old one in place.
    """
    reset_after = settings.reset_after
    x, h0, b_ru, b_c = map(contiguous, (x, h0, weights.b_ru, weights.b_c))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    lengths = lengths_of(settings.seq_len)
    walk = Walk(n_steps, lengths, settings.reverse)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, n_hidden)
    x = running_inputs(masked(x, masks.input), lengths)
    w_rux, w_ruh, w_cx, w_ch = _split_weights(weights.w_ru, weights.w_c, n_in)
    state = (n_batch, n_hidden)
    x_ru, x_c, gates_ru, gates_c, reset_h, h_seen = scratch(
        dtype, (n_steps, n_batch, 2 * n_hidden), (n_steps, n_batch, n_hidden),
        (n_batch, 2 * n_hidden), state, state, state)
    projection(x, w_rux, b_ru, x_ru)
    projection(x, w_cx, None if reset_after else b_c, x_c)
    steps = step_outputs(4, (n_steps, n_batch, n_hidden), dtype)
    r, u, c, h = steps
    no_x = np.empty((n_batch, 0), dtype)
    for t in walk.times():
        h_prev = walk.previous(h, h0, t)
        h_read = seen(h_prev, masks.recurrent, h_seen)
        np.matmul(h_read, w_ruh, out=gates_ru)
        if reset_after:
            np.matmul(h_read, w_ch, out=gates_c)
            gru_reset_after_kernel(gates_ru, x_ru[t], x_c[t], b_c[:n_hidden], gates_c,
                                   b_c[n_hidden:], h_prev, r[t], u[t], c[t], h[t])
        else:
            gru_gates_kernel(gates_ru, x_ru[t], no_x, h_read, r[t], u[t], reset_h)
            np.matmul(reset_h, w_ch, out=gates_c)
            gru_candidate_kernel(gates_c, x_c[t], h_prev, u[t], c[t], h[t])
        zone(masks.zoneout_h, t, h_prev, h[t])
        walk.hold(t, (h, h0))
    final = walk.final(h, h0)
    zero_stopped(steps, lengths)
    return GRUSequence(*steps, final)


class _Scratch(NamedTuple):
    """A GRU sequence gradient's scratch, taken at once (``_workspace.scratch``)."""

    upstream: np.ndarray          # [B, H]: grad_h + d_h[t]
    dh_prev: np.ndarray           # [B, H]: the new grad_h, before stopped rows keep theirs
    direct: np.ndarray            # [B, H]: the part of dh_prev not through W_ruh
    candidate_h: np.ndarray       # [B, H]: reset after, d_n·W_chᵀ
    d_ru: np.ndarray              # [T, B, 2H]: [dr_bar, du_bar] of every step
    d_c: np.ndarray               # [T, B, H]: dc_bar of every step
    d_n_or_reset_h: np.ndarray    # [T, B, H]: reset after, d_n; before, the rows r∘h_prev
    recurrent: np.ndarray         # [T, B, H]: reset after, n's h_prev·W_ch for every step
    dx_c: np.ndarray              # [T·B, I]: dC·W_cxᵀ
    w_ruh_t: np.ndarray           # [2H, H]: W_ruhᵀ, C-contiguous
    w_ch_t: np.ndarray            # [H, H]: W_chᵀ, C-contiguous
    old: np.ndarray               # [B, H]: zoneout, the gradient's part for the old state
    previous: np.ndarray          # [B, H]: the state a step started from (Walk.previous_of_step)


def gru_sequence_grad(x, h0, weights, seq, settings, *, d_r=None, d_u=None, d_c=None,
                      d_h=None, d_h_final=None):
    """Backpropagation through time for ``gru_sequence``.

    ``grad_h``: the gradient of the state after the current step. Per step, from
    ``up = grad_h + d_h[t]`` (``_backward_steps``):

    - reset before: ``gru_candidate_grad_kernel`` (dc_bar, du_bar, r∘h_prev) ->
      ``d_hr = dc_bar·W_chᵀ`` -> ``gru_reset_grad_kernel`` (dr_bar; d_hr∘r + up∘u) ->
      ``grad_h = [dr_bar, du_bar]·W_ruhᵀ + (d_hr∘r + up∘u)``;
    - reset after (n = h_prev·W_ch for all steps first, one matmul):
      ``gru_reset_after_grad_kernel`` (dc_bar, d_n, [dr_bar, du_bar], up∘u) ->
      ``grad_h = [dr_bar, du_bar]·W_ruhᵀ + d_n·W_chᵀ + up∘u``.

    After the loop (``_input_and_weight_grads``): ``dx = dRU·W_ruxᵀ + dC·W_cxᵀ``,
    ``dw_ru = [x_flatᵀ·dRU; h_prev_flatᵀ·dRU]``, ``dw_c = [x_flatᵀ·dC; (r∘h_prev)_flatᵀ·dC]``
    (reset after: ``h_prev_flatᵀ·dN``).

    Masks: the matmuls saw ``h_prev∘m_rec`` (``_sequence.seen_states``: ``n``, ``dw_ru``,
    ``dw_c`` read it), so their part of ``grad_h`` is multiplied by ``m_rec``, and reset
    before ``d_hr`` is too before ``gru_reset_grad_kernel`` (which then gives ``dr_bar =
    d_hr∘h_seen∘r(1-r)`` and the masked ``d_hr∘r``) and the rows ``r∘h_prev`` after the
    loop; ``du_bar`` and ``up∘u`` read the state itself. Zoneout splits ``up``
    (``_sequence.zoneout_split``); ``dx`` is multiplied by ``m_in``. ``d_r, d_u, d_c``, when
    given, join in running rows after each step's kernels (``_add_gate_grads``).
    """
    reset_after = settings.reset_after
    x, h0, b_c = map(contiguous, (x, h0, weights.b_c))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    lengths = lengths_of(settings.seq_len)
    walk = Walk(n_steps, lengths, settings.reverse)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, n_hidden)
    x = running_inputs(masked(x, masks.input), lengths)
    seq = tuple(map(contiguous, _steps(seq)))
    d_h = None if d_h is None else contiguous(d_h)
    gates = _gate_upstreams((d_r, d_u, d_c), seq[0])
    split = _split_weights(weights.w_ru, weights.w_c, n_in)
    grad_h = initial_carry(d_h_final, (n_batch, n_hidden), dtype)
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)
    work = _Scratch(*scratch(dtype, state, state, state, state,
                             (n_steps, n_batch, 2 * n_hidden), steps, steps,
                             steps if reset_after else (0,), (n_steps * n_batch, n_in),
                             (2 * n_hidden, n_hidden), (n_hidden, n_hidden), state, state))
    np.copyto(work.w_ruh_t, split[1].T)      # C-contiguous: OpenBLAS packs them faster
    np.copyto(work.w_ch_t, split[3].T)
    sums = (np.zeros(2 * n_hidden, dtype), np.zeros(b_c.shape[0], dtype))
    h0_seen, h_seen = seen_states(h0, seq[3], masks.recurrent)
    b_ch = None
    if reset_after:
        walk.recurrent_projection(h0_seen, h_seen, split[3], work.recurrent)
        b_ch = b_c[n_hidden:]
    _backward_steps(h0, seq, (d_h, gates), grad_h, walk, work, sums, b_ch, masks)
    if masks.recurrent is not None and not reset_after:     # the rows r∘h_prev∘m_rec
        np.multiply(work.d_n_or_reset_h, masks.recurrent, out=work.d_n_or_reset_h)
    dx, dw_ru, dw_c = _input_and_weight_grads(walk, x, h0_seen, h_seen, split, work,
                                              reset_after)
    return GRUSequenceGrads(x=masked_input_grad(dx, masks.input), h0=grad_h, w_ru=dw_ru,
                            w_c=dw_c, b_ru=sums[0], b_c=sums[1])


def _backward_steps(h0, seq, upstreams, grad_h, walk, work, sums, b_ch, masks):
    """The backward loop over the steps in ``walk``'s backward order: updates ``grad_h``
    in place to the gradient of ``h0``, writes every step's gate gradients into ``work``
    and accumulates ``sums = (db_ru, db_c)``. ``upstreams = (d_h, gates)``: ``d_h [T, B,
    H]`` or None and the gates' (``_gate_upstreams``'s); ``b_ch``: reset after,
    ``b_c[H:]``; reset before, None."""
    r, u, c, h = seq
    d_h, gates = upstreams
    db_ru, db_c = sums
    d_ru, d_c, d_n_or_reset_h, recurrent = work.d_ru, work.d_c, work.d_n_or_reset_h, work.recurrent
    direct, candidate_h, dh_prev = work.direct, work.candidate_h, work.dh_prev
    w_ruh_t, w_ch_t = work.w_ruh_t, work.w_ch_t
    m_rec = masks.recurrent
    no_x = np.empty((grad_h.shape[0], 0), grad_h.dtype)
    for t in walk.back_times():
        stopped = stopped_rows(walk.lengths, t)
        up = upstream(grad_h, d_h, t, work.upstream, stopped)
        up, up_old = zoneout_split(masks.zoneout_h, t, up, work.upstream, work.old)
        h_prev = walk.previous_of_step(h, h0, t, work.previous)
        target = grad_h if stopped is None else dh_prev
        step_gates, outs = _gates_at(gates, t), (r[t], u[t], c[t])
        grads = (d_ru[t], d_c[t], d_n_or_reset_h[t])
        if b_ch is not None:
            gru_reset_after_grad_kernel(up, True, r[t], u[t], c[t], h_prev, recurrent[t],
                                        b_ch, d_c[t], d_n_or_reset_h[t], d_ru[t], direct,
                                        db_ru, db_c)
            _add_gate_grads(step_gates, "r, u, c", stopped, outs, (recurrent[t], b_ch), grads,
                            sums)
            np.matmul(d_n_or_reset_h[t], w_ch_t, out=candidate_h)
            if m_rec is None:
                direct += candidate_h
        else:
            gru_candidate_grad_kernel(up, True, r[t], u[t], c[t], h_prev, no_x, d_c[t],
                                      d_ru[t], d_n_or_reset_h[t], db_ru, db_c)
            _add_gate_grads(step_gates, "u, c", stopped, outs, None, grads, sums)
            np.matmul(d_c[t], w_ch_t, out=direct)
            finish_state_grad(direct, m_rec, None)
            gru_reset_grad_kernel(direct, up, True, r[t], u[t], h_prev, d_ru[t], db_ru)
            _add_gate_grads(step_gates, "r", stopped, outs, None, grads, sums)
        np.matmul(d_ru[t], w_ruh_t, out=target)
        if m_rec is not None and b_ch is not None:
            target += candidate_h
        finish_state_grad(target, m_rec, up_old)
        target += direct
        if stopped is not None:      # stopped rows keep their state gradient
            np.copyto(grad_h, dh_prev, where=~stopped)


def _input_and_weight_grads(walk, x, h0, h, split, work, reset_after):
    """``(dx [T, B, I], dw_ru, dw_c)`` from every step's gate gradients in ``work``, as large
    matmuls over all ``T·B`` rows (``h0, h``: the states as the matmuls saw them)."""
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    w_rux, _, w_cx, _ = split
    x_flat, d_ru_flat, d_c_flat = flat(x), flat(work.d_ru), flat(work.d_c)
    dx = d_ru_flat @ w_rux.T
    dx += np.matmul(d_c_flat, w_cx.T, out=work.dx_c)
    dw_ru = np.empty((n_in + n_hidden, 2 * n_hidden), dtype)
    np.matmul(x_flat.T, d_ru_flat, out=dw_ru[:n_in])
    walk.previous_rows_grad(h0, h, work.d_ru, out=dw_ru[n_in:])
    dw_c = np.empty((n_in + n_hidden, n_hidden), dtype)
    np.matmul(x_flat.T, d_c_flat, out=dw_c[:n_in])
    if reset_after:
        walk.previous_rows_grad(h0, h, work.d_n_or_reset_h, out=dw_c[n_in:])
    else:
        np.matmul(flat(work.d_n_or_reset_h).T, d_c_flat, out=dw_c[n_in:])
    return dx.reshape(n_steps, n_batch, n_in), dw_ru, dw_c


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def gru_cell_jvp(x, h_prev, weights, tangents, settings):
    """One GRU step and its tangent along ``tangents`` (a ``GRUCellGrads``, None fields
    zero): ``(GRUCellState(r, u, c, h), GRUCellState of tangents)``, the primal exactly as
    ``gru_cell``'s (``gru_cell_step``)."""

    outs, t_outs = gru_cell_step(x, h_prev, weights, tangents, settings.reset_after)
    return GRUCellState(*outs), GRUCellState(*t_outs)


def gru_sequence_jvp(x, h0, weights, tangents, settings):
    """``gru_sequence`` and its tangent along ``tangents`` (a ``GRUSequenceGrads``, None
    fields zero): ``(GRUSequence, GRUSequence of tangents)``. The primal is the forward's,
    bitwise; ``gru_jvp`` states the plan."""

    outs, t_outs = gru_jvp(x, tangents.x, h0, tangents.h0, weights,
                           weights_part(tangents, weights), settings,
                           settings.reset_after)
    return GRUSequence(*outs), GRUSequence(*t_outs)


# --------------------------------------------------------------------------------------
# forward mode's loop: the primal as the forward computes it, its tangent beside it


class _GRUStep(NamedTuple):
    """A GRU sequence's per-step scratch (``_workspace.scratch``), all ``[B, ·]``."""

    g_ru: np.ndarray         # [B, 2H] h_seen·W_ruh
    t_g_ru: np.ndarray       # [B, 2H] its tangent
    g_c: np.ndarray          # [B, H]  h_seen·W_ch (reset after) or (r∘h_seen)·W_ch
    t_g_c: np.ndarray        # [B, H]  its tangent
    h_seen: np.ndarray       # [B, H]  h_prev∘m_rec
    t_h_seen: np.ndarray     # [B, H]
    rh: np.ndarray           # [B, H]  reset before: r∘h_seen
    t_rh: np.ndarray         # [B, H]
    stack_ru: np.ndarray     # [B, 2H] [t_h_seen, h_seen] for W_ruh (when t_w_ru is given)
    stack_c: np.ndarray      # [B, 2H] [t_h_seen, h_seen] or [t_rh, rh] for W_ch


def gru_jvp(x, t_x, h0, t_h0, weights, t_weights, settings, reset_after):
    """The GRU sequence ``x [T, B, I]`` from ``h0`` and its tangent: ``(outs, t_outs)``,
    each ``(r, u, c, h [T, B, H], h_final)`` (``t_weights = (t_w_ru, t_w_c, t_b_ru,
    t_b_c)``).

    The forward's plan (``gru_sequence``): reset before, per step ``h_seen·W_ruh`` ->
    ``gru_gates_jvp_kernel`` -> ``(r∘h_seen)·W_ch`` -> ``gru_candidate_jvp_kernel``; reset
    after, ``h_seen·W_ruh`` and ``h_seen·W_ch`` -> ``gru_reset_after_jvp_kernel``; each
    matmul's tangent one stacked BLAS call beside it (``Linear``)."""
    h0, b_ru, b_c = (contiguous(a) for a in (h0, weights.b_ru, weights.b_c))
    t_w_ru, t_w_c, t_b_ru, t_b_c = t_weights
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    x, t_x, lengths, masks = sequence_inputs(x, t_x, settings, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    t_h0, t_b_ru, t_b_c = (tangent_or_zeros(t, p) for t, p in ((t_h0, h0), (t_b_ru, b_ru),
                                                                (t_b_c, b_c)))
    lin = [Linear.of(w[rows], None if t_w is None else t_w[rows])
           for w, t_w in ((weights.w_ru, t_w_ru), (weights.w_c, t_w_c))
           for rows in (slice(None, n_in), slice(n_in, None))]
    lin_rux, lin_ruh, lin_cx, lin_ch = lin
    ru, c_steps, state = (n_steps, n_batch, 2 * n_hidden), (n_steps, n_batch, n_hidden), (
        n_batch, n_hidden)
    buffers = scratch(dtype, ru, ru, c_steps, c_steps,
                      (0, 0) if not (lin_rux.stacks() or lin_cx.stacks())
                      else (n_steps * n_batch, 2 * n_in),
                      (n_batch, 2 * n_hidden), (n_batch, 2 * n_hidden), *[state] * 6,
                      stack_shape(lin_ruh, n_batch), stack_shape(lin_ch, n_batch))
    x_ru, t_x_ru, x_c, t_x_c, x_stack = buffers[:5]
    step = _GRUStep(*buffers[5:])
    b_cx = None if reset_after else b_c
    projection(x, lin_rux.w, b_ru, x_ru)
    projection(x, lin_cx.w, b_cx, x_c)
    input_tangent(lin_rux, t_x, x, t_b_ru, t_x_ru, x_stack)
    input_tangent(lin_cx, t_x, x, t_b_c[:n_hidden] if reset_after else t_b_c, t_x_c, x_stack)
    outs, t_outs = step_outputs(4, c_steps, dtype), step_outputs(4, c_steps, dtype)
    projections = (x_ru, t_x_ru, x_c, t_x_c)
    biases = (b_c[:n_hidden], b_c[n_hidden:], t_b_c[:n_hidden], t_b_c[n_hidden:])
    for t in range(n_steps):
        h_prev, t_h_prev = step_pair(t, h0, outs[3]), step_pair(t, t_h0, t_outs[3])
        h_read = seen(h_prev, masks.recurrent, step.h_seen)
        t_h_read = seen(t_h_prev, masks.recurrent, step.t_h_seen)
        np.matmul(h_read, lin_ruh.w, out=step.g_ru)
        lin_ruh.into(t_h_read, h_read, step.t_g_ru, step.stack_ru)
        at = tuple(a[t] for a in projections)
        new = tuple(a[t] for a in outs), tuple(a[t] for a in t_outs)
        if reset_after:
            _reset_after_step(step, lin_ch, at, biases, (h_prev, t_h_prev, h_read, t_h_read),
                              new)
        else:
            _reset_before_step(step, lin_ch, at, (h_prev, t_h_prev, h_read, t_h_read), new)
        zone(masks.zoneout_h, t, h_prev, outs[3][t])
        zone(masks.zoneout_h, t, t_h_prev, t_outs[3][t])
    final, t_final = finish(outs, t_outs, h0, t_h0, lengths)
    return (*outs, final), (*t_outs, t_final)


def _reset_after_step(step, lin_ch, at, biases, states, new):
    """A reset-after step: ``h_seen·W_ch`` and its tangent, the forward's
    ``gru_reset_after_kernel``, then the tangent's pass into the step's outputs
    ``new = ((r, u, c, h), (t_r, t_u, t_c, t_h))`` (``t_x_c`` holds ``t_b_cx`` already)."""
    x_ru, t_x_ru, x_c, t_x_c = at
    b_cx, b_ch, _, t_b_ch = biases
    h_prev, t_h_prev, h_read, t_h_read = states
    np.matmul(h_read, lin_ch.w, out=step.g_c)
    lin_ch.into(t_h_read, h_read, step.t_g_c, step.stack_c)
    gru_reset_after_kernel(step.g_ru, x_ru, x_c, b_cx, step.g_c, b_ch, h_prev, *new[0])
    np.add(step.t_g_ru, t_x_ru, out=step.t_g_ru)
    np.add(step.t_g_c, t_b_ch, out=step.t_g_c)
    gru_reset_after_tangent_kernel(step.t_g_ru, t_x_c, step.t_g_c, step.g_c, b_ch,
                                   *new[0][:3], h_prev, t_h_prev, *new[1])


def _reset_before_step(step, lin_ch, at, states, new):
    """A reset-before step: the gates' pass, ``(r∘h_seen)·W_ch`` and its tangent, then the
    candidate's pass into ``new = ((r, u, c, h), (t_r, t_u, t_c, t_h))``."""
    x_ru, t_x_ru, x_c, t_x_c = at
    h_prev, t_h_prev, h_read, t_h_read = states
    (r, u, c, h), (t_r, t_u, t_c, t_h) = new
    gru_gates_jvp_kernel(step.g_ru, x_ru, step.t_g_ru, t_x_ru, h_read, t_h_read,
                         (r, u, step.rh), (t_r, t_u, step.t_rh))
    np.matmul(step.rh, lin_ch.w, out=step.g_c)
    lin_ch.into(step.t_rh, step.rh, step.t_g_c, step.stack_c)
    gru_candidate_jvp_kernel(step.g_c, x_c, step.t_g_c, t_x_c, h_prev, t_h_prev, u, t_u,
                             (c, h), (t_c, t_h))




def gru_cell_step(x, h_prev, weights, tangents, reset_after):
    """The GRU cell and its tangent, the primal exactly as ``gru_cell``'s (its matmuls
    and kernels, ``[x, h_prev]·w_ru`` first): ``(outs, t_outs)``, each ``(r, u, c, h)``."""
    w_ru, w_c, b_ru, b_c = weights
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    x, h_prev = contiguous(x), contiguous(h_prev)
    t_x, t_h_prev = tangents.x, tangent_or_zeros(tangents.h_prev, h_prev)
    t_w_c = tangents.w_c
    b_ru, b_c = contiguous(b_ru), contiguous(b_c)
    t_b_ru, t_b_c = tangent_or_zeros(tangents.b_ru, b_ru), tangent_or_zeros(tangents.b_c, b_c)
    gates_ru, t_ru = cell_gates(x, h_prev, w_ru, (t_x, tangents.h_prev, tangents.w_ru))
    outs = [np.empty((n_batch, n_hidden), gates_ru.dtype) for _ in range(4)]
    t_outs = [np.empty_like(a) for a in outs]
    if reset_after:
        g_cx, g_ch = np.dot(x, w_c[:n_in]), np.dot(h_prev, w_c[n_in:])
        t_g_cx = cell_linear(w_c[:n_in], None if t_w_c is None else t_w_c[:n_in], t_x, x)
        t_g_ch = cell_linear(w_c[n_in:], None if t_w_c is None else t_w_c[n_in:], t_h_prev,
                             h_prev)
        gru_reset_after_kernel(gates_ru, one_row(b_ru), g_cx, b_c[:n_hidden], g_ch,
                               b_c[n_hidden:], h_prev, *outs)
        t_ru += t_b_ru
        t_g_cx += t_b_c[:n_hidden]
        t_g_ch += t_b_c[n_hidden:]
        gru_reset_after_tangent_kernel(t_ru, t_g_cx, t_g_ch, g_ch, b_c[n_hidden:], *outs[:3],
                                       h_prev, t_h_prev, *t_outs)
        return outs, t_outs
    (r, u, c, h), (t_r, t_u, t_c, t_h) = outs, t_outs
    rh, t_rh = np.empty_like(h_prev), np.empty_like(h_prev)
    gru_gates_jvp_kernel(gates_ru, one_row(b_ru), t_ru, one_row(t_b_ru), h_prev, t_h_prev,
                         (r, u, rh), (t_r, t_u, t_rh))
    xrh = np.concatenate((x, rh), axis=1)
    t_xrh = np.concatenate((tangent_or_zeros(t_x, x), t_rh), axis=1)
    gates_c = np.dot(xrh, w_c)
    t_gates_c = cell_linear(w_c, t_w_c, t_xrh, xrh)
    gru_candidate_jvp_kernel(gates_c, one_row(b_c), t_gates_c, one_row(t_b_c), h_prev,
                             t_h_prev, u, t_u, (c, h), (t_c, t_h))
    return outs, t_outs


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12)


def gru_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_r=None, d_u=None,
                      d_c=None, d_h=None, d_r_tangent=None, d_u_tangent=None,
                      d_c_tangent=None, d_h_tangent=None):
    """The JVP of ``gru_cell_grad`` along ``tangents`` (a ``GRUCellGrads``, None fields
    zero) and the upstream gradients' tangents: ``(GRUCellGrads, GRUCellGrads of
    tangents)``, a sequence of one step (``gru_grad_jvp``)."""

    x, h0, seq, t, up = sequence_of_one(x, h_prev, state, tangents, d_h, d_h_tangent)
    gates = tuple((None if g is None else g[None], None if t_g is None else t_g[None])
                  for g, t_g in ((d_r, d_r_tangent), (d_u, d_u_tangent), (d_c, d_c_tangent)))
    pair = gru_grad_jvp(x, h0, weights, GRUSequence(*seq), GRUSequenceGrads(*t), settings,
                        settings.reset_after, up, _gate_pairs(gates, seq[0]))
    return tuple(GRUCellGrads(g[0][0], *g[1:]) for g in pair)


def gru_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_r=None, d_u=None,
                          d_c=None, d_h=None, d_h_final=None, d_r_tangent=None,
                          d_u_tangent=None, d_c_tangent=None, d_h_tangent=None,
                          d_h_final_tangent=None):
    """The JVP of ``gru_sequence_grad`` along ``tangents`` (a ``GRUSequenceGrads``, None
    fields zero) and the upstream gradients' tangents: ``(GRUSequenceGrads, GRUSequenceGrads
    of tangents)``, the primal as ``gru_sequence_grad``'s; ``gru_grad_jvp`` states
    the plan."""

    pair = gru_grad_jvp(x, h0, weights, seq, tangents, settings, settings.reset_after,
                        (d_h, d_h_final, d_h_tangent, d_h_final_tangent),
                        _gate_pairs(((d_r, d_r_tangent), (d_u, d_u_tangent),
                                     (d_c, d_c_tangent)), seq.r))
    return tuple(GRUSequenceGrads(*g) for g in pair)


def _gate_pairs(pairs, like):
    """The gates' upstream gradients and their tangents, ``pairs = ((d_r, t_d_r), (d_u,
    t_d_u), (d_c, t_d_c))`` of ``[T, B, H]`` arrays or None, as ``_add_gate_grad_tangents``
    takes them: ``(arrays, tangents, has)``, the missing one of a given pair zeros, a gate
    with neither ``like`` (never read) and its flag False; None when no gate has either."""
    has = tuple(g is not None or t_g is not None for g, t_g in pairs)
    if not any(has):
        return None
    like = contiguous(like)
    filled = [tuple(like if not given else np.zeros_like(like) if a is None else contiguous(a)
                    for a in pair) for pair, given in zip(pairs, has, strict=True)]
    return tuple(p[0] for p in filled), tuple(p[1] for p in filled), has


# --------------------------------------------------------------------------------------
# second order's loop: the gradient's backward loop with a tangent beside every value


def gru_grad_jvp(x, h0, weights, seq, tangents, settings, reset_after, upstreams, gates):
    """``gru_sequence_grad`` and its tangent: ``(grads, t_grads)``, each ``(dx, dh0,
    dw_ru, dw_c, db_ru, db_c)``; ``upstreams = (d_h, d_h_final, d_h_tangent,
    d_h_final_tangent)``, ``gates`` the gates' (``_gate_pairs``'s).

    The saved gates' tangents are ``gru_jvp``'s. Per step (``_gru_backward_steps``) the
    gradient's kernels and their tangents' passes (``_cpu_kernels``) around the
    matmuls' tangents (``Linear``):

        reset before:  d_hr' = (dc_bar'·W_chᵀ + dc_bar·W_ch'ᵀ)∘m_rec
        reset after:   n' = h_seen'·W_ch + h_seen·W_ch' + b_ch' (all steps first, as n)
        grad_h' = ([dr', du']·W_ruhᵀ + [dr, du]·W_ruh'ᵀ + (d_n'·W_chᵀ + d_n·W_ch'ᵀ))∘m_rec
                  + z∘up' + direct'          (the bracket reset after; direct' the kernels')

    The gates' own upstream gradients and tangents join after each step's kernels
    (``_gate_step``). After the loop ``gru._input_and_weight_grads`` three times: on the
    gate gradients, on their tangents, and on the gate gradients with the tangents of ``x``,
    the states, the weights and (reset before) of the rows ``r∘h_seen``."""
    t_seq = gru_jvp(x, tangents.x, h0, tangents.h0, weights, weights_part(tangents, weights),
                    settings, reset_after)[1]
    h0, b_c = contiguous(h0), contiguous(weights.b_c)
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    x, t_x, lengths, masks = sequence_inputs(x, tangents.x, settings, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    walk = Walk(n_steps, lengths, False)
    seq = tuple(map(contiguous, _steps(seq)))
    t_h0 = tangent_or_zeros(tangents.h0, h0)
    t_weights = type(weights)(*(tangent_or_zeros(t, p) for t, p in zip(
        weights_part(tangents, weights), weights, strict=True)))
    split = _split_weights(weights.w_ru, weights.w_c, n_in)
    t_split = _split_weights(t_weights.w_ru, t_weights.w_c, n_in)
    lin_ruh = back_linear(split[1], None if tangents.w_ru is None else t_split[1])
    lin_ch = back_linear(split[3], None if tangents.w_c is None else t_split[3])
    work, t_work, stacks = _gru_scratch(dtype, (n_steps, n_batch, n_in, n_hidden), reset_after,
                                        (lin_ruh, lin_ch))
    np.copyto(work.w_ruh_t, split[1].T)
    np.copyto(work.w_ch_t, split[3].T)
    h0_seen, h_seen = seen_states(h0, seq[3], masks.recurrent)
    t_h0_seen, t_h_seen = seen_states(t_h0, t_seq[3], masks.recurrent)
    b_ch = None
    if reset_after:
        b_ch = b_c[n_hidden:]
        walk.recurrent_projection(h0_seen, h_seen, split[3], work.recurrent)
        walk.recurrent_projection(t_h0_seen, t_h_seen, split[3], t_work.recurrent)
        if tangents.w_c is not None:
            t_work.recurrent[...] += recurrent_product(walk, h0_seen, h_seen, t_split[3])
        t_work.recurrent[...] += t_weights.b_c[n_hidden:]
    carry = carry_pair(upstreams[1], upstreams[3], (n_batch, n_hidden), dtype)
    sums = [(np.zeros(2 * n_hidden, dtype), np.zeros(b_c.shape[0], dtype)) for _ in range(2)]
    _gru_backward_steps((h0, t_h0), (seq, t_seq[:4]), (upstream_pair(*upstreams[::2]), gates),
                        carry, walk, (work, t_work, stacks), (lin_ruh, lin_ch, b_ch, masks), sums)
    if masks.recurrent is not None and not reset_after:     # the rows r∘h_prev∘m_rec
        for w in (work, t_work):
            np.multiply(w.d_n_or_reset_h, masks.recurrent, out=w.d_n_or_reset_h)
    grads = _gru_product_rule(walk, (x, h0_seen, h_seen, split),
                              (tangent_or_zeros(t_x, x), t_h0_seen, t_h_seen, t_split),
                              work, t_work, reset_after)
    (dx, dw_ru, dw_c), (t_dx, t_dw_ru, t_dw_c) = grads
    return ((masked_input_grad(dx, masks.input), carry[0], dw_ru, dw_c, *sums[0]),
            (masked_input_grad(t_dx, masks.input), carry[1], t_dw_ru, t_dw_c, *sums[1]))


def _gru_scratch(dtype, sizes, reset_after, linears):
    """The gradient's ``gru._Scratch``, its tangent's (the same fields, each holding the
    tangent of the gradient's; no ``W_ᵀ`` copies) and the two stacks of ``linears``
    ``(W_ruhᵀ, W_chᵀ)``, taken at once."""
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


def _gru_backward_steps(first, saved, upstreams, carry, walk, work, fixed, sums):
    """The backward loop with its tangent (``gru._backward_steps``, each value with its
    tangent beside it): updates ``carry = (grad_h, t_grad_h)`` in place, writes every step's
    gate gradients and their tangents into ``work = (work, t_work, stacks)`` and accumulates
    ``sums = ((db_ru, db_c), (t_db_ru, t_db_c))``. ``first = (h0, t_h0)``; ``saved = ((r, u,
    c, h), their tangents)``; ``upstreams = ((d_h, t_d_h), gates)`` (``gates``:
    ``_gate_pairs``'s); ``fixed = (lin_ruh, lin_ch, b_ch, masks)`` (``b_ch`` None: reset
    before)."""
    (r, u, c, h), (t_r, t_u, t_c, t_h) = saved
    d_h, gates = upstreams
    works, stacks = work[:2], work[2]
    lin_ruh, lin_ch, b_ch, masks = fixed
    for t in walk.back_times():
        stopped = stopped_rows(walk.lengths, t)
        ups = [state_step(masks.zoneout_h, t, carry[k], d_h[k], stopped, (w.upstream, w.old))
               for k, w in enumerate(works)]
        states = tuple(walk.previous_of_step(a, first[k], t, works[k].previous)
                       for k, a in enumerate((h, t_h)))
        step_gates = None if gates is None else (
            stopped, (*(tuple(a[t] for a in arrays) for arrays in gates[:2]), gates[2]))
        step = (ups[0][0], ups[1][0], (r[t], u[t], c[t]), (t_r[t], t_u[t], t_c[t]), states,
                step_gates)
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
    t_work)``: the gradient's kernel, the tangent's pass, ``d_n·W_chᵀ`` and its tangent
    (added to ``direct`` here without a recurrent mask); ``step = (up, t_up, outs, t_outs,
    states, gates)`` (``gates``: None, or ``(stopped, the step's _gate_pairs)``, added after
    the kernels); ``fixed = (lin_ch, b_ch, stack)``."""
    up, t_up, outs, t_outs, states, gates = step
    work, t_work = works
    lin_ch, b_ch, stack = fixed
    gru_reset_after_grad_kernel(up, True, *outs, states[0], work.recurrent[t], b_ch,
                                work.d_c[t], work.d_n_or_reset_h[t], work.d_ru[t], work.direct,
                                *sums[0])
    gru_reset_after_grad_tangent_kernel(
        up, t_up, outs, t_outs, states, (work.recurrent[t], b_ch), t_work.recurrent[t],
        (work.d_c[t], work.d_n_or_reset_h[t]),
        (t_work.d_c[t], t_work.d_n_or_reset_h[t], t_work.d_ru[t], t_work.direct), sums[1])
    _gate_step(t, works, step, sums, "r, u, c", (work.recurrent[t], b_ch, t_work.recurrent[t]))
    np.matmul(work.d_n_or_reset_h[t], work.w_ch_t, out=work.candidate_h)
    lin_ch.into(t_work.d_n_or_reset_h[t], work.d_n_or_reset_h[t], t_work.candidate_h, stack)
    if m_rec is None:
        work.direct[...] += work.candidate_h
        t_work.direct[...] += t_work.candidate_h


def _gru_reset_before_step(t, step, works, fixed, sums, m_rec):
    """A reset-before step's gate gradients and their tangents into ``works = (work,
    t_work)``: the candidate's kernel and its tangent's pass, ``d_hr = (dc_bar·W_chᵀ)∘m_rec``
    and its tangent, then the reset gate's tangent pass (before the gradient's kernel
    overwrites ``d_hr``) and kernel; the gates' upstream gradients (``step``'s last, as
    ``_gru_reset_after_step`` takes it) after the candidate's kernels (``d_u``, ``d_c``)
    and after the reset gate's (``d_r``); ``fixed = (lin_ch, stack)``."""
    up, t_up, outs, t_outs, states, _ = step
    work, t_work = works
    lin_ch, stack = fixed
    no_x = np.empty((up.shape[0], 0), up.dtype)
    gru_candidate_grad_kernel(up, True, *outs, states[0], no_x, work.d_c[t], work.d_ru[t],
                              work.d_n_or_reset_h[t], *sums[0])
    gru_candidate_grad_tangent_kernel(
        up, t_up, outs, t_outs, states,
        (t_work.d_c[t], t_work.d_ru[t], t_work.d_n_or_reset_h[t]), sums[1])
    _gate_step(t, works, step, sums, "u, c", None)
    np.matmul(work.d_c[t], work.w_ch_t, out=work.direct)
    lin_ch.into(t_work.d_c[t], work.d_c[t], t_work.direct, stack)
    finish_state_grad(work.direct, m_rec, None)
    finish_state_grad(t_work.direct, m_rec, None)
    gru_reset_grad_tangent_kernel(work.direct, t_work.direct, up, t_up, outs[:2], t_outs[:2],
                                  states, t_work.d_ru[t], sums[1][0])
    gru_reset_grad_kernel(work.direct, up, True, *outs[:2], states[0], work.d_ru[t],
                          sums[0][0])
    _gate_step(t, works, step, sums, "r", None)


def _gate_step(t, works, step, sums, part, n_parts):
    """The step's gate upstream gradients of ``part`` and their tangents added to the gate
    gradients in ``works = (work, t_work)`` and to ``sums`` (``_add_gate_grads``,
    ``_add_gate_grad_tangents``); ``n_parts = (gates_ch, addend_ch, t_n)`` reset after,
    else None. Nothing when the step has none (``step``'s last None)."""
    if step[5] is None:
        return
    (stopped, gates), outs, t_outs = step[5], step[2], step[3]
    grads = [(w.d_ru[t], w.d_c[t], w.d_n_or_reset_h[t]) for w in works]
    _add_gate_grads((gates[0], gates[2]), part, stopped, outs,
                    None if n_parts is None else n_parts[:2], grads[0], sums[0])
    _add_gate_grad_tangents(gates, part, stopped, (outs, t_outs), n_parts, grads[1], sums[1])


def _gru_product_rule(walk, primal, tangent, work, t_work, reset_after):
    """``gru._input_and_weight_grads`` and its tangent: ``((dx, dw_ru, dw_c), (t_dx,
    t_dw_ru, t_dw_c))``; ``primal = (x, h0_seen, h_seen, split weights)`` and ``tangent``
    theirs. The tangent is the function on the gate gradients' tangents (with the rows
    ``r∘h_seen`` reset before) plus the function on the tangents' inputs with the gate
    gradients (and the rows' tangent)."""
    grads = _input_and_weight_grads(walk, *primal, work, reset_after)
    rows = ((t_work.d_n_or_reset_h, work.d_n_or_reset_h) if reset_after
            else (work.d_n_or_reset_h, t_work.d_n_or_reset_h))
    on_tangents = work._replace(d_ru=t_work.d_ru, d_c=t_work.d_c, d_n_or_reset_h=rows[0])
    a = _input_and_weight_grads(walk, *primal, on_tangents, reset_after)
    b = _input_and_weight_grads(walk, *tangent, work._replace(d_n_or_reset_h=rows[1]),
                                reset_after)
    for part, more in zip(a, b, strict=True):
        part += more
    return grads, a
