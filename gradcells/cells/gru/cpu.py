"""The GRU block cell and sequence on the CPU: BLAS matmuls plus fused Numba passes
(``_gru_kernels``, which also shows the plan of passes and matmuls each way).

The math is ``gradcells.reference.gru``. Reset before the candidate matmul (TensorFlow's
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

from .._core.plan import flat, masked
from .._core.types import GRUCellGrads, GRUCellState, GRUSequence, GRUSequenceGrads
from ._compile import kernel_array
from ._gru_kernels import (
    gru_candidate_grad_kernel,
    gru_candidate_kernel,
    gru_gates_kernel,
    gru_reset_after_grad_kernel,
    gru_reset_after_kernel,
    gru_reset_grad_kernel,
)
from ._sequence import (
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
from ._workspace import scratch

# --------------------------------------------------------------------------------------
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
        gru_reset_after_kernel(gates_ru, kernel_array(b_ru), np.dot(x, w_c[:n_in]),
                               b_c[:n_hidden], np.dot(h_prev, w_c[n_in:]), b_c[n_hidden:],
                               h_prev, r, u, c, h)
    else:
        xrh = np.empty((n_batch, n_in + n_hidden), dtype)
        gru_gates_kernel(gates_ru, kernel_array(b_ru), kernel_array(x), h_prev, r, u, xrh)
        gru_candidate_kernel(np.dot(xrh, w_c), kernel_array(b_c), h_prev, u, c, h)
    return GRUCellState(r, u, c, h)


def gru_cell_grad(x, h_prev, weights, state, settings, *, d_h=None):
    """Gradient of one GRU step with respect to every input (``GRUCellGrads``)."""
    n_batch, n_hidden = h_prev.shape
    dtype = h_prev.dtype
    h_prev = kernel_array(h_prev)
    r, u, c = (kernel_array(a) for a in state[:3])
    has_d_h = d_h is not None
    d_h = kernel_array(d_h) if has_d_h else h_prev
    xh = np.concatenate((x, h_prev), axis=1)
    d_ru = np.empty((n_batch, 2 * n_hidden), dtype)
    dc_bar = np.empty((n_batch, n_hidden), dtype)
    d_bias_ru = np.zeros(2 * n_hidden, dtype)
    upstream_and_state = (d_h, has_d_h, r, u, c, h_prev)
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
    d_h, has_d_h, r, u, c, h_prev = upstream_and_state
    w_ru, w_c = weights.w_ru, weights.w_c
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    dtype = h_prev.dtype
    b_c = kernel_array(weights.b_c)
    d_bias_c = np.zeros(2 * n_hidden, dtype)
    d_n = np.empty((n_batch, n_hidden), dtype)
    dh_direct = np.empty((n_batch, n_hidden), dtype)
    gru_reset_after_grad_kernel(d_h, has_d_h, r, u, c, h_prev, np.dot(h_prev, w_c[n_in:]),
                                b_c[n_hidden:], dc_bar, d_n, d_ru, dh_direct, d_bias_ru,
                                d_bias_c)
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
    d_h, has_d_h, r, u, c, h_prev = upstream_and_state
    w_ru, w_c = weights.w_ru, weights.w_c
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    dtype = h_prev.dtype
    d_bias_c = np.zeros(n_hidden, dtype)
    xrh = np.empty((n_batch, n_in + n_hidden), dtype)
    gru_candidate_grad_kernel(d_h, has_d_h, r, u, c, h_prev, kernel_array(x), dc_bar, d_ru,
                              xrh, d_bias_ru, d_bias_c)
    dxhr = np.dot(dc_bar, w_c.T)
    gru_reset_grad_kernel(dxhr, d_h, has_d_h, r, u, h_prev, d_ru, d_bias_ru)
    dxh = np.dot(d_ru, w_ru.T)
    dxh += dxhr
    dw_c = np.dot(xrh.T, dc_bar)
    return dxh[:, :n_in], dxh[:, n_in:], dw_c, d_bias_c


# --------------------------------------------------------------------------------------
# sequence


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


def gru_sequence_grad(x, h0, weights, seq, settings, *, d_h=None, d_h_final=None):
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
    (``_sequence.zoneout_split``); ``dx`` is multiplied by ``m_in``.
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
    seq = tuple(map(contiguous, seq[:4]))
    d_h = None if d_h is None else contiguous(d_h)
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
    _backward_steps(h0, seq, d_h, grad_h, walk, work, sums, b_ch, masks)
    if masks.recurrent is not None and not reset_after:     # the rows r∘h_prev∘m_rec
        np.multiply(work.d_n_or_reset_h, masks.recurrent, out=work.d_n_or_reset_h)
    dx, dw_ru, dw_c = _input_and_weight_grads(walk, x, h0_seen, h_seen, split, work,
                                              reset_after)
    return GRUSequenceGrads(x=masked_input_grad(dx, masks.input), h0=grad_h, w_ru=dw_ru,
                            w_c=dw_c, b_ru=sums[0], b_c=sums[1])


def _backward_steps(h0, seq, d_h, grad_h, walk, work, sums, b_ch, masks):
    """The backward loop over the steps in ``walk``'s backward order: updates ``grad_h``
    in place to the gradient of ``h0``, writes every step's gate gradients into ``work``
    and accumulates ``sums = (db_ru, db_c)``. ``b_ch``: reset after, ``b_c[H:]``; reset
    before, None."""
    r, u, c, h = seq
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
        if b_ch is not None:
            gru_reset_after_grad_kernel(up, True, r[t], u[t], c[t], h_prev, recurrent[t],
                                        b_ch, d_c[t], d_n_or_reset_h[t], d_ru[t], direct,
                                        db_ru, db_c)
            np.matmul(d_n_or_reset_h[t], w_ch_t, out=candidate_h)
            if m_rec is None:
                direct += candidate_h
        else:
            gru_candidate_grad_kernel(up, True, r[t], u[t], c[t], h_prev, no_x, d_c[t],
                                      d_ru[t], d_n_or_reset_h[t], db_ru, db_c)
            np.matmul(d_c[t], w_ch_t, out=direct)
            finish_state_grad(direct, m_rec, None)
            gru_reset_grad_kernel(direct, up, True, r[t], u[t], h_prev, d_ru[t], db_ru)
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
# forward mode (docs/spec.md §12; ``_jvp``)


def gru_cell_jvp(x, h_prev, weights, tangents, settings):
    """One GRU step and its tangent along ``tangents`` (a ``GRUCellGrads``, None fields
    zero): ``(GRUCellState(r, u, c, h), GRUCellState of tangents)``, the primal exactly as
    ``gru_cell``'s (``_jvp.gru_cell_step``)."""
    from ._jvp import gru_cell_step

    outs, d_outs = gru_cell_step(x, h_prev, weights, tangents, settings.reset_after)
    return GRUCellState(*outs), GRUCellState(*d_outs)


def gru_sequence_jvp(x, h0, weights, tangents, settings):
    """``gru_sequence`` and its tangent along ``tangents`` (a ``GRUSequenceGrads``, None
    fields zero): ``(GRUSequence, GRUSequence of tangents)``. The primal is the forward's,
    bitwise; ``_jvp.gru_jvp`` states the plan."""
    from ._jvp import gru_jvp

    outs, d_outs = gru_jvp(x, tangents.x, h0, tangents.h0, weights, tangents[2:], settings,
                           settings.reset_after)
    return GRUSequence(*outs), GRUSequence(*d_outs)



# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12; ``_grad_jvp``)


def gru_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_h=None,
                      d_h_tangent=None):
    """The JVP of ``gru_cell_grad`` along ``tangents`` (a ``GRUCellGrads``, None fields
    zero) and ``d_h_tangent``: ``(GRUCellGrads, GRUCellGrads of tangents)``, a sequence of
    one step (``_grad_jvp.gru_grad_jvp``)."""
    from ._grad_jvp import gru_grad_jvp, sequence_of_one

    x, h0, seq, t, up = sequence_of_one(x, h_prev, state, tangents, d_h, d_h_tangent)
    pair = gru_grad_jvp(x, h0, weights, GRUSequence(*seq), GRUSequenceGrads(*t), settings,
                        settings.reset_after, up)
    return tuple(GRUCellGrads(g[0][0], *g[1:]) for g in pair)


def gru_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_h=None,
                          d_h_final=None, d_h_tangent=None, d_h_final_tangent=None):
    """The JVP of ``gru_sequence_grad`` along ``tangents`` (a ``GRUSequenceGrads``, None
    fields zero) and the upstream gradients' tangents: ``(GRUSequenceGrads, GRUSequenceGrads
    of tangents)``, the primal as ``gru_sequence_grad``'s; ``_grad_jvp.gru_grad_jvp`` states
    the plan."""
    from ._grad_jvp import gru_grad_jvp

    pair = gru_grad_jvp(x, h0, weights, seq, tangents, settings, settings.reset_after,
                        (d_h, d_h_final, d_h_tangent, d_h_final_tangent))
    return tuple(GRUSequenceGrads(*g) for g in pair)
