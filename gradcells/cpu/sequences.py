"""LSTM and GRU sequences on the CPU: the matmul plan of ``gradcells.reference.sequences``
with BLAS for the matmuls and the fused cell kernels of ``fused_lstm`` / ``fused_gru`` for
each step's elementwise work.

- forward: the input projection ``x_flat·W_x + b`` of all steps first (one matmul per
  weight block), then per step ``h_prev·W_h`` and the cell kernel, which takes the step's
  slice of the projection as its per-row addend and writes the step's outputs in place;
- backward: per step the cell's backward kernel writes the step's gate gradients into
  ``[T, B, ·]`` arrays (and accumulates the bias and peephole sums), then ``dG_t·W_hᵀ``
  gives the gradient of the previous state, with ``W_hᵀ`` copied C-contiguous once per
  call (OpenBLAS packs a contiguous operand about 10% faster at these shapes); after the
  loop ``dx``, ``dW_x`` and ``dW_h`` are large matmuls over all ``T·B`` rows, written
  straight into their outputs.

Scratch (the projections, every step's gate gradients, the per-step buffers) comes from the
calling thread's reusable buffer (``_workspace``); results are always fresh arrays.

Per-example lengths: a row that runs step t ran every step before it, so every step starts
from the previous step's outputs and no state buffers are needed. Rows past their length
are computed as if they ran on and zeroed after the loop; their final state is gathered
from step ``L-1`` before that. Backwards, a stopped row gets zero upstream gradient (its
outputs are constants), so its gate gradients are zero, and keeps its state gradient.
Steps before the shortest length take the unmasked path.
"""

from __future__ import annotations

import math

import numpy as np

from .._types import GRUSequence, GRUSequenceGrads, LSTMSequence, LSTMSequenceGrads
from ._workspace import scratch
from .fused_gru import (
    gru_candidate_grad_kernel,
    gru_candidate_kernel,
    gru_gates_kernel,
    gru_reset_after_grad_kernel,
    gru_reset_after_kernel,
    gru_reset_grad_kernel,
)
from .fused_lstm import lstm_backward_kernel, lstm_forward_kernel

# --------------------------------------------------------------------------------------
# helpers


def _contiguous(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _lengths(seq_len):
    return None if seq_len is None else np.asarray(seq_len, dtype=np.int64)


def _projection(x, w_x, b, out):
    """``x_flat·W_x (+ b)`` for all steps at once, into ``out [T, B, width]``."""
    np.matmul(_flat(x), w_x, out=_flat(out))
    if b is not None:
        out += b


def _step_outputs(count, shape, dtype):
    """``count`` new ``[T, B, H]`` arrays for a sequence's per-step outputs, as views of one
    block: NumPy asks the kernel for huge pages for allocations of 4 MiB and more, and one
    large block then costs a few hundred page faults where seven separate arrays of a few
    MiB cost thousands (measured: 2.9 ms against 17 ms to allocate and fill 7·[100, 32, 256]
    float32)."""
    return list(np.empty((count, *shape), dtype))


def _flat(a):
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2])


def _previous_rows_grad(h0, steps, d_steps, out=None):
    """``h_prevᵀ·dG`` over all steps, ``h_prev = [h0, steps[0], ..., steps[T-2]]``, without
    stacking the states: ``steps[:-1]_flatᵀ·dG[1:]_flat + h0ᵀ·dG[0]`` (into ``out``, a
    ``[H, width]`` array, when given)."""
    n_steps, n_batch, n_hidden = steps.shape
    if out is None:
        out = np.empty((n_hidden, d_steps.shape[2]), steps.dtype)
    if n_steps == 0 or n_batch == 0:
        out[...] = 0
        return out
    np.matmul(_flat(steps[:-1]).T, _flat(d_steps[1:]), out=out)
    out += h0.T @ d_steps[0]
    return out


def _recurrent_projection(h0, steps, w, out):
    """``h_prev·W`` for every step at once (two matmuls, no stacking), into ``out [T, B, ·]``."""
    n_steps, n_batch, n_hidden = steps.shape
    if n_steps and n_batch:
        np.matmul(h0, w, out=out[0])
        np.matmul(_flat(steps[:-1]), w, out=_flat(out[1:]))


def _running_inputs(x, lengths):
    """``x`` with every step past its row's length zeroed (``x`` itself without lengths,
    which the public layer passes when every row runs all T steps), so that padding is never
    read: NaN or inf there would reach the input projection and ``dW_x = x_flatᵀ·dG``
    (0·NaN is NaN), though those steps' outputs are discarded and their gate gradients are
    zero."""
    if lengths is None:
        return x
    running = np.arange(x.shape[0])[:, None] < lengths
    return np.where(running[:, :, None], x, x.dtype.type(0))


def _final_state(steps, first, lengths):
    """Each row's state after its last valid step: ``steps[L-1, b]``, or ``first[b]`` when
    ``L = 0`` (``lengths`` None: every row ran all T steps)."""
    n_steps, n_batch = steps.shape[:2]
    if n_steps == 0 or n_batch == 0:
        return first.copy()
    if lengths is None:
        return steps[-1].copy()
    last = steps[np.maximum(lengths - 1, 0), np.arange(n_batch)]
    return np.where((lengths > 0)[:, None], last, first)


def _zero_stopped(steps, lengths):
    """Zero every step output in rows past their length."""
    if lengths is None:
        return
    stopped = np.arange(steps[0].shape[0])[:, None] >= lengths
    for a in steps:
        a[stopped] = 0


def _stopped_rows(lengths, t):
    """``[B, 1]`` mask of the rows that stopped before step t; None when every row runs."""
    if lengths is None or t < lengths.min(initial=t + 1):
        return None
    return (t >= lengths)[:, None]


def _upstream(carried, d_steps, t, buffer, stopped):
    """The gradient of step t's new state: carried from step t+1 plus the step's own
    upstream gradient, zero in stopped rows."""
    if d_steps is not None:
        total = np.add(carried, d_steps[t], out=buffer)
    elif stopped is not None:
        total = buffer
        np.copyto(total, carried)
    else:
        return carried
    if stopped is not None:
        np.copyto(total, 0, where=stopped)
    return total


def _initial_carry(final, shape, dtype):
    return np.zeros(shape, dtype) if final is None else np.array(final, dtype=dtype, order="C")


# --------------------------------------------------------------------------------------
# LSTM


def lstm_sequence(x, cs0, h0, w, b, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
                  cell_clip=None, seq_len=None):
    """The LSTM cell over ``x [T, B, I]``; see ``gradcells.reference.sequences``.

    Per step: ``h_prev·W_h`` (BLAS) and ``lstm_forward_kernel`` with the step's slice of
    ``x·W_x + b`` as its per-row addend.
    """
    x, cs0, h0, w, b = map(_contiguous, (x, cs0, h0, w, b))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    lengths = _lengths(seq_len)
    x = _running_inputs(x, lengths)
    peephole = wci is not None
    wci, wcf, wco = map(_contiguous, (wci, wcf, wco)) if peephole else (b, b, b)
    clip = math.inf if cell_clip is None else cell_clip
    x_gates, h_gates = scratch(x.dtype, (n_steps, n_batch, 4 * n_hidden),
                               (n_batch, 4 * n_hidden))
    _projection(x, w[:n_in], b, x_gates)
    w_h = w[n_in:]
    steps = _step_outputs(7, (n_steps, n_batch, n_hidden), x.dtype)
    i, cs, f, o, ci, co, h = steps
    for t in range(n_steps):
        cs_prev, h_prev = (cs0, h0) if t == 0 else (cs[t - 1], h[t - 1])
        np.matmul(h_prev, w_h, out=h_gates)
        lstm_forward_kernel(h_gates, x_gates[t], cs_prev, wci, wcf, wco, peephole,
                            forget_bias, clip, i[t], cs[t], f[t], o[t], ci[t], co[t], h[t])
    finals = _final_state(cs, cs0, lengths), _final_state(h, h0, lengths)
    _zero_stopped(steps, lengths)
    return LSTMSequence(*steps, *finals)


def lstm_sequence_grad(x, cs0, h0, w, b, seq, *, d_h=None, d_cs=None, d_h_final=None,
                       d_cs_final=None, wci=None, wcf=None, wco=None, cell_clip=None,
                       clip_grad="exact", seq_len=None):
    """Backpropagation through time for ``lstm_sequence``.

    ``grad_h, grad_cs``: the gradient of the state after the current step (the final-state
    gradients before the loop). Per step: ``lstm_backward_kernel`` from ``grad + d[t]``
    writes ``dG_t`` and ``dcs_prev`` and accumulates the bias and peephole sums;
    ``dG_t·W_hᵀ`` (BLAS) is the new ``grad_h``.
    """
    x, cs0, h0, w = map(_contiguous, (x, cs0, h0, w))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    lengths = _lengths(seq_len)
    x = _running_inputs(x, lengths)
    i, cs, f, o, ci, co, h = map(_contiguous, seq[:7])
    d_h = None if d_h is None else _contiguous(d_h)
    d_cs = None if d_cs is None else _contiguous(d_cs)
    grad_h = _initial_carry(d_h_final, (n_batch, n_hidden), dtype)
    grad_cs = _initial_carry(d_cs_final, (n_batch, n_hidden), dtype)
    dcs_prev = np.empty_like(grad_cs)         # swapped with grad_cs, which is returned
    state = (n_batch, n_hidden)
    upstream_h, upstream_cs, dh_prev, d_gates, w_h_t = scratch(
        dtype, state, state, state, (n_steps, n_batch, 4 * n_hidden), (4 * n_hidden, n_hidden))
    d_bias = np.zeros(4 * n_hidden, dtype)
    peephole = wci is not None
    if peephole:
        wci, wcf, wco = map(_contiguous, (wci, wcf, wco))
        d_peepholes = np.zeros((3, n_hidden), dtype)
    else:
        wci = wcf = wco = d_bias
        d_peepholes = (d_bias, d_bias, d_bias)     # never touched without peepholes
    mask_clip = cell_clip if cell_clip is not None and clip_grad == "exact" else math.inf
    w_x = w[:n_in]
    np.copyto(w_h_t, w[n_in:].T)     # C-contiguous: OpenBLAS packs it faster

    for t in reversed(range(n_steps)):
        stopped = _stopped_rows(lengths, t)
        up_h = _upstream(grad_h, d_h, t, upstream_h, stopped)
        up_cs = _upstream(grad_cs, d_cs, t, upstream_cs, stopped)
        lstm_backward_kernel(cs0 if t == 0 else cs[t - 1], i[t], cs[t], f[t], o[t], ci[t],
                             co[t], up_h, True, up_cs, True, wci, wcf, wco, peephole,
                             mask_clip, d_gates[t], dcs_prev, d_bias, *d_peepholes)
        if stopped is None:
            np.matmul(d_gates[t], w_h_t, out=grad_h)
            grad_cs, dcs_prev = dcs_prev, grad_cs
        else:                        # stopped rows keep their state gradient
            np.matmul(d_gates[t], w_h_t, out=dh_prev)
            np.copyto(grad_h, dh_prev, where=~stopped)
            np.copyto(grad_cs, dcs_prev, where=~stopped)

    d_flat = _flat(d_gates)
    dx = (d_flat @ w_x.T).reshape(n_steps, n_batch, n_in)
    dw = np.empty_like(w)
    np.matmul(_flat(x).T, d_flat, out=dw[:n_in])
    _previous_rows_grad(h0, h, d_gates, out=dw[n_in:])
    dwci, dwcf, dwco = d_peepholes if peephole else (None, None, None)
    return LSTMSequenceGrads(x=dx, cs0=grad_cs, h0=grad_h, w=dw, b=d_bias, wci=dwci,
                             wcf=dwcf, wco=dwco)


# --------------------------------------------------------------------------------------
# GRU. The input projection is kept as two C-contiguous arrays, ``x·W_rux + b_ru [T, B, 2H]``
# and ``x·W_cx (+ b_c) [T, B, H]``, so each step's slices are the kernels' row-major inputs.


def _gru_weights(w_ru, w_c, n_in):
    """The x-rows and h-rows of ``w_ru`` and ``w_c``, each C-contiguous."""
    return tuple(_contiguous(a) for a in (w_ru[:n_in], w_ru[n_in:], w_c[:n_in], w_c[n_in:]))


def gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, *, reset_after=False, seq_len=None):
    """The GRU cell over ``x [T, B, I]``; see ``gradcells.reference.sequences``.

    Reset before, per step: ``h_prev·W_ruh`` -> ``gru_gates_kernel`` (r, u, r∘h_prev) ->
    ``(r∘h_prev)·W_ch`` -> ``gru_candidate_kernel`` (c, h). Reset after: ``h_prev·W_ruh``
    and ``h_prev·W_ch`` -> ``gru_reset_after_kernel``.
    """
    x, h0, b_ru, b_c = map(_contiguous, (x, h0, b_ru, b_c))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    lengths = _lengths(seq_len)
    x = _running_inputs(x, lengths)
    w_rux, w_ruh, w_cx, w_ch = _gru_weights(w_ru, w_c, n_in)
    x_ru, x_c, gates_ru, gates_c, reset_h = scratch(
        dtype, (n_steps, n_batch, 2 * n_hidden), (n_steps, n_batch, n_hidden),
        (n_batch, 2 * n_hidden), (n_batch, n_hidden), (n_batch, n_hidden))
    _projection(x, w_rux, b_ru, x_ru)
    _projection(x, w_cx, None if reset_after else b_c, x_c)
    steps = _step_outputs(4, (n_steps, n_batch, n_hidden), dtype)
    r, u, c, h = steps
    no_x = np.empty((n_batch, 0), dtype)
    for t in range(n_steps):
        h_prev = h0 if t == 0 else h[t - 1]
        np.matmul(h_prev, w_ruh, out=gates_ru)
        if reset_after:
            np.matmul(h_prev, w_ch, out=gates_c)
            gru_reset_after_kernel(gates_ru, x_ru[t], x_c[t], b_c[:n_hidden], gates_c,
                                   b_c[n_hidden:], h_prev, r[t], u[t], c[t], h[t])
        else:
            gru_gates_kernel(gates_ru, x_ru[t], no_x, h_prev, r[t], u[t], reset_h)
            np.matmul(reset_h, w_ch, out=gates_c)
            gru_candidate_kernel(gates_c, x_c[t], h_prev, u[t], c[t], h[t])
    final = _final_state(h, h0, lengths)
    _zero_stopped(steps, lengths)
    return GRUSequence(*steps, final)


def gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, seq, *, d_h=None, d_h_final=None,
                      reset_after=False, seq_len=None):
    """Backpropagation through time for ``gru_sequence``.

    ``grad_h``: the gradient of the state after the current step. Per step, from
    ``up = grad_h + d_h[t]``:

    - reset before: ``gru_candidate_grad_kernel`` (dc_bar, du_bar, r∘h_prev) ->
      ``d_hr = dc_bar·W_chᵀ`` -> ``gru_reset_grad_kernel`` (dr_bar; d_hr∘r + up∘u) ->
      ``grad_h = [dr_bar, du_bar]·W_ruhᵀ + (d_hr∘r + up∘u)``;
    - reset after (n = h_prev·W_ch for all steps first, one matmul):
      ``gru_reset_after_grad_kernel`` (dc_bar, d_n, [dr_bar, du_bar], up∘u) ->
      ``grad_h = [dr_bar, du_bar]·W_ruhᵀ + d_n·W_chᵀ + up∘u``.

    After the loop: ``dx = dRU·W_ruxᵀ + dC·W_cxᵀ``, ``dw_ru = [x_flatᵀ·dRU; h_prev_flatᵀ·dRU]``,
    ``dw_c = [x_flatᵀ·dC; (r∘h_prev)_flatᵀ·dC]`` (reset after: ``h_prev_flatᵀ·dN``).
    """
    x, h0, b_c = map(_contiguous, (x, h0, b_c))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    lengths = _lengths(seq_len)
    x = _running_inputs(x, lengths)
    r, u, c, h = map(_contiguous, seq[:4])
    d_h = None if d_h is None else _contiguous(d_h)
    w_rux, w_ruh, w_cx, w_ch = _gru_weights(w_ru, w_c, n_in)
    grad_h = _initial_carry(d_h_final, (n_batch, n_hidden), dtype)
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)
    # d_n_or_reset_h: reset after, dN; reset before, the rows r∘h_prev of dw_c's h part.
    # recurrent: reset after, n's h_prev·W_ch for every step.
    (upstream, dh_prev, direct, candidate_h, d_ru, d_c, d_n_or_reset_h, recurrent, dx_c,
     w_ruh_t, w_ch_t) = scratch(dtype, state, state, state, state,
                                (n_steps, n_batch, 2 * n_hidden), steps, steps,
                                steps if reset_after else (0,), (n_steps * n_batch, n_in),
                                (2 * n_hidden, n_hidden), (n_hidden, n_hidden))
    np.copyto(w_ruh_t, w_ruh.T)      # C-contiguous: OpenBLAS packs them faster
    np.copyto(w_ch_t, w_ch.T)
    db_ru = np.zeros(2 * n_hidden, dtype)
    db_c = np.zeros(b_c.shape[0], dtype)
    if reset_after:
        _recurrent_projection(h0, h, w_ch, recurrent)
        b_ch = b_c[n_hidden:]
    no_x = np.empty((n_batch, 0), dtype)

    for t in reversed(range(n_steps)):
        stopped = _stopped_rows(lengths, t)
        up = _upstream(grad_h, d_h, t, upstream, stopped)
        h_prev = h0 if t == 0 else h[t - 1]
        target = grad_h if stopped is None else dh_prev
        if reset_after:
            gru_reset_after_grad_kernel(up, True, r[t], u[t], c[t], h_prev, recurrent[t],
                                        b_ch, d_c[t], d_n_or_reset_h[t], d_ru[t], direct,
                                        db_ru, db_c)
            np.matmul(d_n_or_reset_h[t], w_ch_t, out=candidate_h)
            direct += candidate_h
        else:
            gru_candidate_grad_kernel(up, True, r[t], u[t], c[t], h_prev, no_x, d_c[t],
                                      d_ru[t], d_n_or_reset_h[t], db_ru, db_c)
            np.matmul(d_c[t], w_ch_t, out=direct)
            gru_reset_grad_kernel(direct, up, True, r[t], u[t], h_prev, d_ru[t], db_ru)
        np.matmul(d_ru[t], w_ruh_t, out=target)
        target += direct
        if stopped is not None:      # stopped rows keep their state gradient
            np.copyto(grad_h, dh_prev, where=~stopped)

    x_flat, d_ru_flat, d_c_flat = _flat(x), _flat(d_ru), _flat(d_c)
    dx = d_ru_flat @ w_rux.T
    dx += np.matmul(d_c_flat, w_cx.T, out=dx_c)
    dw_ru = np.empty((n_in + n_hidden, 2 * n_hidden), dtype)
    np.matmul(x_flat.T, d_ru_flat, out=dw_ru[:n_in])
    _previous_rows_grad(h0, h, d_ru, out=dw_ru[n_in:])
    dw_c = np.empty((n_in + n_hidden, n_hidden), dtype)
    np.matmul(x_flat.T, d_c_flat, out=dw_c[:n_in])
    if reset_after:
        _previous_rows_grad(h0, h, d_n_or_reset_h, out=dw_c[n_in:])
    else:
        np.matmul(_flat(d_n_or_reset_h).T, d_c_flat, out=dw_c[n_in:])
    return GRUSequenceGrads(x=dx.reshape(n_steps, n_batch, n_in), h0=grad_h, w_ru=dw_ru,
                            w_c=dw_c, b_ru=db_ru, b_c=db_c)
