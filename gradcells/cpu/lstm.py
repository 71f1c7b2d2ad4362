"""The LSTM block cell and sequence on the CPU: BLAS matmuls plus one fused Numba pass each
way (``_lstm_kernels``).

The math is ``gradcells.reference.lstm`` (gate blocks i, ci, f, o). A cell's forward:

    G = [x, h_prev]·w                      one BLAS call
    lstm_forward_kernel(G, b, ...)         one pass over [B, H]

and its gradient:

    lstm_backward_kernel(...)              dG [B, 4H], dcs_prev, bias and peephole sums
    d[x, h_prev] = dG·wᵀ,  dw = [x, h_prev]ᵀ·dG       two BLAS calls

A sequence projects every step's input at once and runs the kernels once per step
(``_sequence`` describes the plan, its scratch and per-example lengths).
"""

from __future__ import annotations

import math

import numpy as np

from .._core.plan import flat
from .._core.types import LSTMCellGrads, LSTMCellState, LSTMSequence, LSTMSequenceGrads
from ._compile import kernel_array
from ._lstm_kernels import lstm_backward_kernel, lstm_forward_kernel
from ._sequence import (
    contiguous,
    final_state,
    initial_carry,
    lengths_of,
    previous_rows_grad,
    projection,
    running_inputs,
    step_outputs,
    stopped_rows,
    upstream,
    zero_stopped,
)
from ._workspace import scratch

_INF = math.inf


def _clip_or_inf(cell_clip):
    return _INF if cell_clip is None else cell_clip


def _mask_clip(settings, clip_grad):
    """The clip the backward kernel masks at: the forward's for ``clip_grad="exact"``, else
    (or without clipping) infinity."""
    masked = settings.cell_clip is not None and clip_grad == "exact"
    return settings.cell_clip if masked else _INF


# --------------------------------------------------------------------------------------
# cell


def lstm_cell(x, cs_prev, h_prev, weights, settings):
    """One LSTM step; returns ``LSTMCellState(i, cs, f, o, ci, co, h)``."""
    n_batch, n_hidden = cs_prev.shape
    gates = np.dot(np.concatenate((x, h_prev), axis=1), weights.w)
    b = kernel_array(weights.b)
    peephole = settings.peepholes
    if peephole:
        wci, wcf, wco = (kernel_array(a) for a in weights[2:5])
    else:
        wci = wcf = wco = b
    dtype = gates.dtype
    outputs = [np.empty((n_batch, n_hidden), dtype) for _ in range(7)]
    lstm_forward_kernel(gates, b, kernel_array(cs_prev), wci, wcf, wco, peephole,
                        settings.forget_bias, _clip_or_inf(settings.cell_clip), *outputs)
    if weights.w_proj is not None:       # outputs[6] is m = o∘co [B, H]
        outputs[6] = _project(outputs[6], weights.w_proj, settings.proj_clip)
    return LSTMCellState(*outputs)


def _project(m, w_proj, proj_clip, out=None):
    """``h = clip(m·w_proj, ±proj_clip)`` (BLAS, then the clip in place; into ``out``)."""
    h = np.matmul(m, w_proj, out=out)
    if proj_clip is not None:
        np.clip(h, -proj_clip, proj_clip, out=h)
    return h


def _passed(d_h, m, w_proj, settings, clip_grad):
    """``d_h`` zeroed where the projection clip was active (a fresh array; ``d_h`` itself
    when no clip masks): the unclipped ``m·w_proj`` recomputed, the boundary passes."""
    if settings.proj_clip is None or clip_grad != "exact":
        return d_h
    active = ~(np.abs(m @ w_proj) <= settings.proj_clip)
    return np.where(active, np.zeros((), d_h.dtype), d_h)


def lstm_cell_grad(x, cs_prev, h_prev, weights, state, settings, *, d_h=None, d_cs=None,
                   clip_grad="exact"):
    """Gradient of one LSTM step with respect to every input (``LSTMCellGrads``)."""
    n_batch, n_hidden = cs_prev.shape
    n_in = x.shape[1]
    dtype = cs_prev.dtype
    cs_prev = kernel_array(cs_prev)
    saved = [kernel_array(a) for a in state[:6]]
    d_gates = np.empty((n_batch, 4 * n_hidden), dtype)
    dcs_prev = np.empty((n_batch, n_hidden), dtype)
    d_bias = np.zeros(4 * n_hidden, dtype)
    peephole = settings.peepholes
    if peephole:
        wci, wcf, wco = (kernel_array(a) for a in weights[2:5])
        d_peep = np.zeros((3, n_hidden), dtype)
        d_wci, d_wcf, d_wco = d_peep
    else:
        wci = wcf = wco = d_wci = d_wcf = d_wco = d_bias
    w_proj = weights.w_proj
    d_w_proj = None
    if w_proj is not None:     # the projection's backward: d_h becomes dm [B, H]
        m = saved[3] * saved[5]
        d_w_proj = np.zeros(w_proj.shape, dtype)
        if d_h is not None:
            d_h = _passed(d_h, m, w_proj, settings, clip_grad)
            d_w_proj = np.dot(m.T, d_h)
            d_h = np.dot(d_h, w_proj.T)
    lstm_backward_kernel(
        cs_prev, *saved,
        cs_prev if d_h is None else kernel_array(d_h), d_h is not None,
        cs_prev if d_cs is None else kernel_array(d_cs), d_cs is not None,
        wci, wcf, wco, peephole, _mask_clip(settings, clip_grad),
        d_gates, dcs_prev, d_bias, d_wci, d_wcf, d_wco)
    dxh = np.dot(d_gates, weights.w.T)
    dw = np.dot(np.concatenate((x, h_prev), axis=1).T, d_gates)
    if not peephole:
        d_wci = d_wcf = d_wco = None
    return LSTMCellGrads(x=dxh[:, :n_in], cs_prev=dcs_prev, h_prev=dxh[:, n_in:], w=dw,
                         b=d_bias, wci=d_wci, wcf=d_wcf, wco=d_wco, w_proj=d_w_proj)


# --------------------------------------------------------------------------------------
# sequence


def lstm_sequence(x, cs0, h0, weights, settings):
    """The LSTM cell over ``x [T, B, I]``; see ``gradcells.reference``'s ``lstm_sequence``.

    Per step: ``h_prev·W_h`` (BLAS) and ``lstm_forward_kernel`` with the step's slice of
    ``x·W_x + b`` as its per-row addend. With a projection the kernel writes
    ``m = o∘co`` into a scratch ``[B, H]`` and ``h_t = clip(m·w_proj)`` (BLAS, clip in
    place) is the step's ``[B, P]`` state.
    """
    x, cs0, h0, w, b = map(contiguous, (x, cs0, h0, weights.w, weights.b))
    n_steps, n_batch, n_in = x.shape
    n_hidden = cs0.shape[1]
    lengths = lengths_of(settings.seq_len)
    x = running_inputs(x, lengths)
    peephole = settings.peepholes
    wci, wcf, wco = map(contiguous, weights[2:5]) if peephole else (b, b, b)
    clip = _clip_or_inf(settings.cell_clip)
    forget_bias = settings.forget_bias
    w_proj = weights.w_proj
    x_gates, h_gates, m = scratch(x.dtype, (n_steps, n_batch, 4 * n_hidden),
                                  (n_batch, 4 * n_hidden),
                                  (n_batch, n_hidden if w_proj is not None else 0))
    projection(x, w[:n_in], b, x_gates)
    w_h = w[n_in:]
    if w_proj is None:
        steps = step_outputs(7, (n_steps, n_batch, n_hidden), x.dtype)
    else:
        w_proj = contiguous(w_proj)
        steps = [*step_outputs(6, (n_steps, n_batch, n_hidden), x.dtype),
                 np.empty((n_steps, n_batch, w_proj.shape[1]), x.dtype)]
    i, cs, f, o, ci, co, h = steps
    for t in range(n_steps):
        cs_prev, h_prev = (cs0, h0) if t == 0 else (cs[t - 1], h[t - 1])
        np.matmul(h_prev, w_h, out=h_gates)
        lstm_forward_kernel(h_gates, x_gates[t], cs_prev, wci, wcf, wco, peephole,
                            forget_bias, clip, i[t], cs[t], f[t], o[t], ci[t], co[t],
                            h[t] if w_proj is None else m)
        if w_proj is not None:
            _project(m, w_proj, settings.proj_clip, out=h[t])
    finals = final_state(cs, cs0, lengths), final_state(h, h0, lengths)
    zero_stopped(steps, lengths)
    return LSTMSequence(*steps, *finals)


def lstm_sequence_grad(x, cs0, h0, weights, seq, settings, *, d_h=None, d_cs=None,
                       d_h_final=None, d_cs_final=None, clip_grad="exact"):
    """Backpropagation through time for ``lstm_sequence``.

    ``grad_h, grad_cs``: the gradient of the state after the current step (the final-state
    gradients before the loop). Per step (``_backward_steps``): ``lstm_backward_kernel``
    from ``grad + d[t]`` writes ``dG_t`` and ``dcs_prev`` and accumulates the bias and
    peephole sums; ``dG_t·W_hᵀ`` (BLAS) is the new ``grad_h``. Then ``dx`` and ``dw`` over
    all steps at once (``_input_and_weight_grads``). With a projection ``grad_h`` is
    ``[B, P]`` and each step first goes through the projection (``_projection_step``);
    ``dw_proj = M_flatᵀ·DHraw_flat`` after the loop.
    """
    x, cs0, h0, w = map(contiguous, (x, cs0, h0, weights.w))
    n_steps, n_batch, n_in = x.shape
    n_hidden, n_state = cs0.shape[1], h0.shape[1]      # n_state: P with a projection
    dtype = x.dtype
    lengths = lengths_of(settings.seq_len)
    x = running_inputs(x, lengths)
    seq = tuple(map(contiguous, seq[:7]))
    d_h = None if d_h is None else contiguous(d_h)
    d_cs = None if d_cs is None else contiguous(d_cs)
    grad_h = initial_carry(d_h_final, (n_batch, n_state), dtype)
    grad_cs = initial_carry(d_cs_final, (n_batch, n_hidden), dtype)
    state, h_state = (n_batch, n_hidden), (n_batch, n_state)
    proj_shapes = () if weights.w_proj is None else _projection_shapes(seq)
    buffers = scratch(dtype, h_state, state, h_state, (n_steps, n_batch, 4 * n_hidden),
                      (4 * n_hidden, n_state), *proj_shapes)
    proj = _projection_work(weights.w_proj, settings, clip_grad, buffers[5:])
    d_bias = np.zeros(4 * n_hidden, dtype)
    peephole = settings.peepholes
    if peephole:
        peepholes = tuple(map(contiguous, weights[2:5]))
        d_peepholes = np.zeros((3, n_hidden), dtype)
    else:
        peepholes = d_peepholes = (d_bias, d_bias, d_bias)    # never touched
    fixed = (*peepholes, peephole, _mask_clip(settings, clip_grad))
    np.copyto(buffers[4], w[n_in:].T)     # W_hᵀ, C-contiguous: OpenBLAS packs it faster
    grad_cs, grad_h = _backward_steps(cs0, seq, (d_h, d_cs), grad_h, grad_cs, lengths,
                                      buffers[:5], fixed, (d_bias, *d_peepholes), proj)
    dx, dw = _input_and_weight_grads(x, h0, w, seq[6], buffers[3])
    dwci, dwcf, dwco = d_peepholes if peephole else (None, None, None)
    return LSTMSequenceGrads(x=dx, cs0=grad_cs, h0=grad_h, w=dw, b=d_bias, wci=dwci,
                             wcf=dwcf, wco=dwco, w_proj=_projection_weight_grad(proj))


def _projection_shapes(seq):
    """The projection's backward scratch: ``w_projᵀ [P, H]``, ``dh_raw [T, B, P]``,
    ``m [T, B, H]``, ``dm [B, H]``, the unclipped ``m_t·w_proj [B, P]``."""
    n_steps, n_batch, n_hidden = seq[0].shape
    width = seq[6].shape[2]
    return ((width, n_hidden), (n_steps, n_batch, width), (n_steps, n_batch, n_hidden),
            (n_batch, n_hidden), (n_batch, width))


def _projection_work(w_proj, settings, clip_grad, buffers):
    """``(w_proj, clip, w_projᵀ, dh_raw, m, dm, raw)`` for ``_projection_step`` (``clip``:
    None unless the backward masks at ``proj_clip``), or None without a projection."""
    if w_proj is None:
        return None
    masked = settings.proj_clip is not None and clip_grad == "exact"
    w_proj = contiguous(w_proj)
    np.copyto(buffers[0], w_proj.T)
    return (w_proj, settings.proj_clip if masked else None, *buffers)


def _projection_step(up_h, o, co, t, proj):
    """The projection's backward at step t: keeps ``dh_raw_t`` (``up_h`` zeroed where the
    clip was active) and ``m_t = o∘co``; returns ``dm_t = dh_raw_t·w_projᵀ`` [B, H]."""
    w_proj, clip, w_proj_t, dh_raw, m, d_m, raw = proj
    np.copyto(dh_raw[t], up_h)
    np.multiply(o[t], co[t], out=m[t])
    if clip is not None:
        np.matmul(m[t], w_proj, out=raw)
        np.abs(raw, out=raw)
        np.copyto(dh_raw[t], 0, where=~(raw <= clip))
    np.matmul(dh_raw[t], w_proj_t, out=d_m)
    return d_m


def _projection_weight_grad(proj):
    """``dw_proj = M_flatᵀ·DHraw_flat`` over all steps (None without a projection)."""
    if proj is None:
        return None
    dh_raw, m = proj[3], proj[4]
    return flat(m).T @ flat(dh_raw)


def _backward_steps(cs0, seq, d_steps, grad_h, grad_cs, lengths, buffers, fixed, sums,
                    proj=None):
    """The backward loop over the steps, last first; returns the state gradients
    ``(grad_cs, grad_h)`` before step 0 (fresh arrays) and leaves every step's ``dG_t`` in
    ``buffers[3]``.

    ``buffers``: the scratch ``(upstream_h, upstream_cs, dh_prev [B, P], d_gates
    [T, B, 4H], w_h_t [4H, P])`` (P = H without a projection); ``fixed``: the kernel's
    ``(wci, wcf, wco, peephole, cell_clip)``; ``sums``: the accumulated ``(d_bias, d_wci,
    d_wcf, d_wco)``; ``proj``: ``_projection_work``'s tuple, or None.
    """
    i, cs, f, o, ci, co, _ = seq
    d_h, d_cs = d_steps
    upstream_h, upstream_cs, dh_prev, d_gates, w_h_t = buffers
    dcs_prev = np.empty_like(grad_cs)         # swapped with grad_cs, which is returned
    for t in reversed(range(i.shape[0])):
        stopped = stopped_rows(lengths, t)
        up_h = upstream(grad_h, d_h, t, upstream_h, stopped)
        up_cs = upstream(grad_cs, d_cs, t, upstream_cs, stopped)
        if proj is not None:
            up_h = _projection_step(up_h, o, co, t, proj)
        lstm_backward_kernel(cs0 if t == 0 else cs[t - 1], i[t], cs[t], f[t], o[t], ci[t],
                             co[t], up_h, True, up_cs, True, *fixed, d_gates[t], dcs_prev,
                             *sums)
        if stopped is None:
            np.matmul(d_gates[t], w_h_t, out=grad_h)
            grad_cs, dcs_prev = dcs_prev, grad_cs
        else:                        # stopped rows keep their state gradient
            np.matmul(d_gates[t], w_h_t, out=dh_prev)
            np.copyto(grad_h, dh_prev, where=~stopped)
            np.copyto(grad_cs, dcs_prev, where=~stopped)
    return grad_cs, grad_h


def _input_and_weight_grads(x, h0, w, h, d_gates):
    """``dx = dG·W_xᵀ`` and ``dw = [x_flatᵀ·dG; h_prev_flatᵀ·dG]`` over all ``T·B`` rows."""
    n_steps, n_batch, n_in = x.shape
    d_flat = flat(d_gates)
    dx = (d_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = np.empty_like(w)
    np.matmul(flat(x).T, d_flat, out=dw[:n_in])
    previous_rows_grad(h0, h, d_gates, out=dw[n_in:])
    return dx, dw
