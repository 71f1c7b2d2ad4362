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

With a layer norm (``weights.layer_norm``) the same plan runs with the layer-normalised
kernels: ``x·W_x`` and ``h_prev·W_h`` are separate matmuls, the input part's norm is one pass
over all steps before the loop, the recurrent part's and the cell's norms are inside the
step kernel. The results hold what they hold without a layer norm, so the gradient
recomputes ``x·W_x`` and ``h_prev·W_h`` of every step (one matmul each, ``ẑ`` and ``r`` in
place), the step's backward kernel also writes ``dz_h`` (which multiplies ``W_hᵀ``), and the
input part's norm is differentiated for all steps at once after the loop.
"""

from __future__ import annotations

import math

import numpy as np

from .._core.plan import flat, masked
from .._core.types import (
    LSTMCellGrads,
    LSTMCellState,
    LSTMNorm,
    LSTMSequence,
    LSTMSequenceGrads,
)
from ._compile import kernel_array
from ._lstm_kernels import (
    layer_norm_forward_kernel,
    layer_norm_grad_kernel,
    layer_norm_stats_kernel,
    lstm_backward_kernel,
    lstm_forward_kernel,
    lstm_ln_backward_kernel,
    lstm_ln_forward_kernel,
)
from ._sequence import (
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
    if weights.layer_norm is not None:
        return _norm_cell(x, cs_prev, h_prev, weights, settings)
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
    if weights.layer_norm is not None:
        return _norm_cell_grad(x, cs_prev, h_prev, weights, state, settings, d_h, d_cs,
                               clip_grad)
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
    d_h, d_w_proj = _cell_projection_grad(d_h, saved, weights.w_proj, settings, clip_grad)
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


def _cell_projection_grad(d_h, saved, w_proj, settings, clip_grad):
    """The projection's backward for a cell: ``(dm [B, H], dw_proj)`` from ``d_h [B, P]``
    and the saved ``i, cs, f, o, ci, co`` (``(d_h, None)`` without a projection)."""
    if w_proj is None:
        return d_h, None
    m = saved[3] * saved[5]
    d_w_proj = np.zeros(w_proj.shape, m.dtype)
    if d_h is not None:
        d_h = _passed(d_h, m, w_proj, settings, clip_grad)
        d_w_proj = np.dot(m.T, d_h)
        d_h = np.dot(d_h, w_proj.T)
    return d_h, d_w_proj


# --------------------------------------------------------------------------------------
# the layer-normalised cell (docs/spec.md §9.2)
#
# Forward: z_x = x·W_x and z_h = h_prev·W_h (two BLAS calls), LN(z_x) + b in place
# (``layer_norm_forward_kernel``), then ``lstm_ln_forward_kernel``. Gradient: z_x and z_h
# recomputed and turned into (ẑ, r) in place (``layer_norm_stats_kernel``),
# ``lstm_ln_backward_kernel`` (dG and, in place of ĥ, dz_h), ``layer_norm_grad_kernel``
# (dz_x in place of x̂), then dx = dz_x·W_xᵀ, dh_prev = dz_h·W_hᵀ, dw = [xᵀ·dz_x; h_prevᵀ·dz_h].


def _norm_arrays(weights):
    """The layer norm's six arrays, C-contiguous."""
    return LSTMNorm(*(kernel_array(a) for a in weights.layer_norm))


def _norm_cell(x, cs_prev, h_prev, weights, settings):
    """``lstm_cell`` with a layer norm."""
    n_batch, n_hidden = cs_prev.shape
    n_in = x.shape[1]
    norm = _norm_arrays(weights)
    addend = np.dot(x, weights.w[:n_in])
    layer_norm_forward_kernel(addend, norm.gamma_x, norm.beta_x, kernel_array(weights.b),
                              settings.ln_epsilon)
    z_h = np.dot(h_prev, weights.w[n_in:])
    outputs = [np.empty((n_batch, n_hidden), addend.dtype) for _ in range(7)]
    lstm_ln_forward_kernel(z_h, addend, kernel_array(cs_prev),
                           *_forward_norm_fixed(norm, settings), *_peepholes(weights, settings),
                           settings.forget_bias, _clip_or_inf(settings.cell_clip), *outputs)
    if weights.w_proj is not None:       # outputs[6] is m = o∘co [B, H]
        outputs[6] = _project(outputs[6], weights.w_proj, settings.proj_clip)
    return LSTMCellState(*outputs)


def _forward_norm_fixed(norm, settings):
    """``lstm_ln_forward_kernel``'s ``(gamma_h, beta_h, gamma_c, beta_c, epsilon,
    normalized)``."""
    return (norm.gamma_h, norm.beta_h, norm.gamma_c, norm.beta_c, settings.ln_epsilon,
            settings.ln_carry == "normalized")


def _peepholes(weights, settings, contiguous_as=kernel_array):
    """``(wci, wcf, wco, peephole)`` for the kernels (the bias stands in without
    peepholes: never read)."""
    if settings.peepholes:
        return (*(contiguous_as(a) for a in weights[2:5]), True)
    b = contiguous_as(weights.b)
    return b, b, b, False


def _norm_stats(z, epsilon):
    """``z [.., W]`` turned into ``ẑ`` in place; returns ``r`` (``z``'s shape without its
    last axis)."""
    rstd = np.empty(z.shape[:-1], z.dtype)
    layer_norm_stats_kernel(z.reshape(-1, z.shape[-1]), epsilon, rstd.reshape(-1))
    return rstd


def _norm_cell_grad(x, cs_prev, h_prev, weights, state, settings, d_h, d_cs, clip_grad):
    """``lstm_cell_grad`` with a layer norm."""
    n_batch, n_hidden = cs_prev.shape
    n_in = x.shape[1]
    dtype = cs_prev.dtype
    norm = _norm_arrays(weights)
    w = weights.w
    dz_x, dz_h = np.dot(x, w[:n_in]), np.dot(h_prev, w[n_in:])   # ẑ first, then dz
    rstd_x, rstd_h = _norm_stats(dz_x, settings.ln_epsilon), _norm_stats(dz_h, settings.ln_epsilon)
    saved = [kernel_array(a) for a in state[:6]]
    d_h, d_w_proj = _cell_projection_grad(d_h, saved, weights.w_proj, settings, clip_grad)
    cs_prev = kernel_array(cs_prev)
    d_gates = np.empty((n_batch, 4 * n_hidden), dtype)
    dcs_prev = np.empty((n_batch, n_hidden), dtype)
    sums = _norm_sums(4 * n_hidden, n_hidden, settings.peepholes, dtype)
    lstm_ln_backward_kernel(
        cs_prev, *saved,
        cs_prev if d_h is None else kernel_array(d_h), d_h is not None,
        cs_prev if d_cs is None else kernel_array(d_cs), d_cs is not None,
        *_backward_norm_fixed(norm, weights, settings, clip_grad), dz_h, rstd_h,
        d_gates, dcs_prev, *sums[:7])
    layer_norm_grad_kernel(d_gates, norm.gamma_x, dz_x, rstd_x, sums[7])
    return LSTMCellGrads(
        x=np.dot(dz_x, w[:n_in].T), cs_prev=dcs_prev, h_prev=np.dot(dz_h, w[n_in:].T),
        w=np.concatenate((np.dot(x.T, dz_x), np.dot(h_prev.T, dz_h)), axis=0), b=sums[0],
        **_peephole_grads(sums, settings), w_proj=d_w_proj, layer_norm=_norm_grads(sums))


def _norm_sums(width, n_hidden, peephole, dtype):
    """The accumulated sums of ``lstm_ln_backward_kernel`` (``d_bias, d_wci, d_wcf, d_wco,
    d_gamma_c, d_beta_c, d_gamma_h``), zeros, and after them ``d_gamma_x``
    (``layer_norm_grad_kernel``'s); without peepholes ``d_bias`` stands in for theirs."""
    d_bias = np.zeros(width, dtype)
    peepholes = list(np.zeros((3, n_hidden), dtype)) if peephole else [d_bias] * 3
    cell = np.zeros((2, n_hidden), dtype)
    return [d_bias, *peepholes, *cell, np.zeros(width, dtype), np.zeros(width, dtype)]


def _backward_norm_fixed(norm, weights, settings, clip_grad, contiguous_as=kernel_array):
    """``lstm_ln_backward_kernel``'s ``(wci, wcf, wco, peephole, state_clip, mask_clip,
    gamma_c, epsilon, normalized, gamma_h)``."""
    return (*_peepholes(weights, settings, contiguous_as), _clip_or_inf(settings.cell_clip),
            _mask_clip(settings, clip_grad), norm.gamma_c, settings.ln_epsilon,
            settings.ln_carry == "normalized", norm.gamma_h)


def _peephole_grads(sums, settings):
    """The peephole gradients from ``_norm_sums``'s list (None without peepholes)."""
    if not settings.peepholes:
        return {"wci": None, "wcf": None, "wco": None}
    return {"wci": sums[1], "wcf": sums[2], "wco": sums[3]}


def _norm_grads(sums):
    """The gradient's ``LSTMNorm`` from ``_norm_sums``'s list: both gate norms' shifts
    take ``Σ dG``, the bias's gradient (copies)."""
    return LSTMNorm(gamma_x=sums[7], beta_x=sums[0].copy(), gamma_h=sums[6],
                    beta_h=sums[0].copy(), gamma_c=sums[4], beta_c=sums[5])


# --------------------------------------------------------------------------------------
# sequence


def lstm_sequence(x, cs0, h0, weights, settings):
    """The LSTM cell over ``x [T, B, I]``; see ``gradcells.reference``'s ``lstm_sequence``.

    Per step: ``h_prev·W_h`` (BLAS) and ``lstm_forward_kernel`` with the step's slice of
    ``x·W_x + b`` as its per-row addend. With a projection the kernel writes
    ``m = o∘co`` into a scratch ``[B, H]`` and ``h_t = clip(m·w_proj)`` (BLAS, clip in
    place) is the step's ``[B, P]`` state. With a layer norm the addend is
    ``LN(x·W_x) + b`` (``layer_norm_forward_kernel`` over all steps at once, in place) and
    the step's kernel is ``lstm_ln_forward_kernel``, which normalises ``h_prev·W_h`` itself.

    Masks (``_sequence``): ``x∘m_in`` is projected, the recurrent matmul reads
    ``h_prev∘m_rec`` (a scratch ``[B, P]``); zoneout mixes the kernel's (and the
    projection's) new states with the old ones in place, after the kernel, so ``co`` and the
    o-peephole read the step's own cell state.
    """
    x, cs0, h0, w, b = map(contiguous, (x, cs0, h0, weights.w, weights.b))
    n_steps, n_batch, n_in = x.shape
    n_hidden, n_state = cs0.shape[1], h0.shape[1]
    lengths = lengths_of(settings.seq_len)
    walk = Walk(n_steps, lengths, settings.reverse)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, n_state, n_hidden)
    x = running_inputs(masked(x, masks.input), lengths)
    w_proj = weights.w_proj
    x_gates, h_gates, m, h_seen = scratch(
        x.dtype, (n_steps, n_batch, 4 * n_hidden), (n_batch, 4 * n_hidden),
        (n_batch, n_hidden if w_proj is not None else 0), (n_batch, n_state))
    step_kernel, fixed = _forward_step(x, w[:n_in], b, weights, settings, x_gates)
    w_h = w[n_in:]
    if w_proj is None:
        steps = step_outputs(7, (n_steps, n_batch, n_hidden), x.dtype)
    else:
        w_proj = contiguous(w_proj)
        steps = [*step_outputs(6, (n_steps, n_batch, n_hidden), x.dtype),
                 np.empty((n_steps, n_batch, w_proj.shape[1]), x.dtype)]
    i, cs, f, o, ci, co, h = steps
    for t in walk.times():
        cs_prev, h_prev = walk.previous(cs, cs0, t), walk.previous(h, h0, t)
        np.matmul(seen(h_prev, masks.recurrent, h_seen), w_h, out=h_gates)
        step_kernel(h_gates, x_gates[t], cs_prev, *fixed, i[t], cs[t], f[t], o[t], ci[t],
                    co[t], h[t] if w_proj is None else m)
        if w_proj is not None:
            _project(m, w_proj, settings.proj_clip, out=h[t])
        zone(masks.zoneout_cs, t, cs_prev, cs[t])
        zone(masks.zoneout_h, t, h_prev, h[t])
        walk.hold(t, (cs, cs0), (h, h0))
    finals = walk.final(cs, cs0), walk.final(h, h0)
    zero_stopped(steps, lengths)
    return LSTMSequence(*steps, *finals)


def _forward_step(x, w_x, b, weights, settings, x_gates):
    """Fill ``x_gates`` with every step's input part (``x·W_x + b``, or ``LN(x·W_x) + b``)
    and return the step kernel with its fixed arguments (those between ``cs_prev`` and the
    outputs)."""
    clip = _clip_or_inf(settings.cell_clip)
    peepholes = _peepholes(weights, settings, contiguous)
    if weights.layer_norm is None:
        projection(x, w_x, b, x_gates)
        return lstm_forward_kernel, (*peepholes, settings.forget_bias, clip)
    norm = LSTMNorm(*map(contiguous, weights.layer_norm))
    projection(x, w_x, None, x_gates)
    layer_norm_forward_kernel(flat(x_gates), norm.gamma_x, norm.beta_x, b, settings.ln_epsilon)
    return lstm_ln_forward_kernel, (*_forward_norm_fixed(norm, settings), *peepholes,
                                    settings.forget_bias, clip)


def lstm_sequence_grad(x, cs0, h0, weights, seq, settings, *, d_h=None, d_cs=None,
                       d_h_final=None, d_cs_final=None, clip_grad="exact"):
    """Backpropagation through time for ``lstm_sequence``.

    ``grad_h, grad_cs``: the gradient of the state after the current step (the final-state
    gradients before the loop). Per step (``_backward_steps``): ``lstm_backward_kernel``
    from ``grad + d[t]`` writes ``dG_t`` and ``dcs_prev`` and accumulates the bias and
    peephole sums; ``dG_t·W_hᵀ`` (BLAS) is the new ``grad_h``. Then ``dx`` and ``dw`` over
    all steps at once (``_sequence.input_and_weight_grads``). With a projection ``grad_h`` is
    ``[B, P]`` and each step first goes through the projection (``_projection_step``);
    ``dw_proj = M_flatᵀ·DHraw_flat`` after the loop.

    With a layer norm (``_norm_backward_work``) ``x·W_x`` and ``h_prev·W_h`` of every step
    are recomputed first (one matmul each) and turned into ``(ẑ, r)``; the step's kernel is
    ``lstm_ln_backward_kernel``, which also writes ``dz_h,t`` over ``ĥ_t``, and
    ``dz_h,t·W_hᵀ`` is the new ``grad_h``; after the loop ``layer_norm_grad_kernel`` turns
    ``x̂`` into ``dz_x`` for all steps at once.

    Masks: ``dw_h`` and the norm's ``h_prev·W_h`` read ``h_prev∘m_rec`` (``seen_states``),
    ``grad_h``'s matmul part is multiplied by it; zoneout splits each state's gradient
    (``zoneout_split``), the kernel reads the step's own cell state (``_unzoned_cells``, a
    ``[T, B, H]`` of scratch, with zoneout of ``cs``); ``dx`` is multiplied by ``m_in``.
    """
    x, cs0, h0, w = map(contiguous, (x, cs0, h0, weights.w))
    n_steps, n_batch, n_in = x.shape
    n_hidden, n_state = cs0.shape[1], h0.shape[1]      # n_state: P with a projection
    dtype = x.dtype
    lengths = lengths_of(settings.seq_len)
    walk = Walk(n_steps, lengths, settings.reverse)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, n_state, n_hidden)
    x = running_inputs(masked(x, masks.input), lengths)
    seq = tuple(map(contiguous, seq[:7]))
    d_h, d_cs = (None if d is None else contiguous(d) for d in (d_h, d_cs))
    grad_h = initial_carry(d_h_final, (n_batch, n_state), dtype)
    grad_cs = initial_carry(d_cs_final, (n_batch, n_hidden), dtype)
    buffers, zone_work = _backward_scratch(seq, n_state, weights, masks)
    proj = _projection_work(weights.w_proj, settings, clip_grad,
                            buffers[6 if weights.layer_norm is None else 9:])
    sums = _norm_sums(4 * n_hidden, n_hidden, settings.peepholes, dtype)
    np.copyto(buffers[4], w[n_in:].T)     # W_hᵀ, C-contiguous: OpenBLAS packs it faster
    h0_seen, h_seen = seen_states(h0, seq[6], masks.recurrent)
    own = _unzoned_cells(walk, cs0, seq, weights, settings, masks, zone_work[2])
    if weights.layer_norm is None:
        step = _step_grad(own, lstm_backward_kernel, (*_peepholes(weights, settings, contiguous),
                          _mask_clip(settings, clip_grad)), (), buffers[3], sums[:4])
        d_parts = buffers[3], buffers[3]
    else:
        step, d_parts, norm = _norm_backward_work(walk, x, (h0_seen, h_seen), own, weights,
                                                  settings, clip_grad,
                                                  (buffers[3], *buffers[6:9]), sums)
    grad_cs, grad_h = _backward_steps(cs0, seq, (d_h, d_cs), grad_h, grad_cs, walk,
                                      buffers[:6], step, proj, (masks, *zone_work[:2]))
    if weights.layer_norm is not None:   # the input part's norm, every step at once
        layer_norm_grad_kernel(flat(buffers[3]), norm.gamma_x, flat(d_parts[0]),
                               buffers[8][0].reshape(-1), sums[7])
    dx, dw = input_and_weight_grads(walk, x, h0_seen, w, h_seen, *d_parts)
    return LSTMSequenceGrads(
        x=masked_input_grad(dx, masks.input), cs0=grad_cs, h0=grad_h, w=dw, b=sums[0],
        **_peephole_grads(sums, settings), w_proj=_projection_weight_grad(proj),
        layer_norm=None if weights.layer_norm is None else _norm_grads(sums))


def _backward_scratch(seq, n_state, weights, masks):
    """``lstm_sequence_grad``'s scratch, taken at once: ``(buffers, zone_work)``.
    ``buffers``: ``_backward_steps``'s six, then the layer norm's three and the projection's
    five (``_projection_shapes``) where there are; ``zone_work``: zoneout's parts of the old
    states' gradients ``[B, P]``, ``[B, H]`` and every step's own cell state ``[T, B, H]``
    (``_unzoned_cells``; empty without zoneout of ``cs``)."""
    n_steps, n_batch, n_hidden = seq[0].shape
    state, h_state = (n_batch, n_hidden), (n_batch, n_state)
    gates = (n_steps, n_batch, 4 * n_hidden)
    norm_shapes = () if weights.layer_norm is None else (gates, gates, (2, n_steps, n_batch))
    proj_shapes = () if weights.w_proj is None else _projection_shapes(seq)
    zone_shapes = (h_state, state, seq[0].shape if masks.zoneout_cs is not None else (0,))
    buffers = scratch(seq[0].dtype, h_state, state, h_state, gates, (4 * n_hidden, n_state),
                      state, *zone_shapes, *norm_shapes, *proj_shapes)
    return buffers[:6] + buffers[9:], buffers[6:9]


def _step_grad(seq, step_kernel, fixed, per_step, d_gates, sums):
    """The backward step for ``_backward_steps``: ``step(t, cs_prev, up_h, up_cs,
    dcs_prev)`` runs ``step_kernel`` on step t (writing ``dG_t`` and ``dcs_prev``,
    accumulating ``sums``) and returns what multiplies ``W_hᵀ``: ``dG_t``, or with a layer
    norm the ``dz_h,t`` written over ``per_step[0][t]``. ``fixed``: the kernel's arguments
    after the upstream gradients; ``per_step``: its ``[T, ...]`` arguments after those."""
    i, cs, f, o, ci, co, _ = seq

    def step(t, cs_prev, up_h, up_cs, dcs_prev):
        step_kernel(cs_prev, i[t], cs[t], f[t], o[t], ci[t], co[t], up_h, True, up_cs, True,
                    *fixed, *[a[t] for a in per_step], d_gates[t], dcs_prev, *sums)
        return per_step[0][t] if per_step else d_gates[t]

    return step


def _norm_backward_work(walk, x, states_seen, seq, weights, settings, clip_grad, buffers,
                        sums):
    """The layer norm's part of ``lstm_sequence_grad`` before the loop: ``x̂`` and ``ĥ`` of
    every step recomputed into the scratch and their ``r``; returns the step
    (``_step_grad``), the arrays that will hold ``(dz_x, dz_h)`` (``x̂``, ``ĥ``) and the
    layer norm's contiguous arrays. ``states_seen``: ``(h0, h)`` as the recurrent matmuls
    saw them; ``buffers``: ``(d_gates, x̂, ĥ, r [2, T, B])``."""
    d_gates, x_hat, h_hat, rstd = buffers
    n_in = x.shape[2]
    norm = LSTMNorm(*map(contiguous, weights.layer_norm))
    w = contiguous(weights.w)
    projection(x, w[:n_in], None, x_hat)
    walk.recurrent_projection(*states_seen, w[n_in:], h_hat)
    for z, r in ((x_hat, rstd[0]), (h_hat, rstd[1])):
        layer_norm_stats_kernel(flat(z), settings.ln_epsilon, r.reshape(-1))
    fixed = _backward_norm_fixed(norm, weights, settings, clip_grad, contiguous)
    step = _step_grad(seq, lstm_ln_backward_kernel, fixed, (h_hat, rstd[1]), d_gates, sums[:7])
    return step, (x_hat, h_hat), norm


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


def _backward_steps(cs0, seq, d_steps, grad_h, grad_cs, walk, buffers, step, proj, zoning):
    """The backward loop over the steps in ``walk``'s backward order; returns the state gradients
    ``(grad_cs, grad_h)`` before step 0 (fresh arrays); ``step`` (``_step_grad``) leaves
    every step's ``dG_t`` in ``buffers[3]``.

    ``buffers``: the scratch ``(upstream_h, upstream_cs, dh_prev [B, P], d_gates
    [T, B, 4H], w_h_t [4H, P], cs_prev [B, H])`` (P = H without a projection; ``cs_prev``
    for ``Walk.previous_of_step``); ``proj``:
    ``_projection_work``'s tuple, or None; ``zoning``: ``(masks, old_h [B, P], old_cs
    [B, H])``, the masks and the scratch of the zoned states' parts for the old ones.
    """
    o, co = seq[3], seq[5]
    d_h, d_cs = d_steps
    upstream_h, upstream_cs, dh_prev, d_gates, w_h_t, cs_prev = buffers
    masks, old_h, old_cs = zoning
    dcs_prev = np.empty_like(grad_cs)         # swapped with grad_cs, which is returned
    for t in walk.back_times():
        stopped = stopped_rows(walk.lengths, t)
        up_h, old_h_t = zoneout_split(masks.zoneout_h, t,
                                      upstream(grad_h, d_h, t, upstream_h, stopped),
                                      upstream_h, old_h)
        up_cs, old_cs_t = zoneout_split(masks.zoneout_cs, t,
                                        upstream(grad_cs, d_cs, t, upstream_cs, stopped),
                                        upstream_cs, old_cs)
        if proj is not None:
            up_h = _projection_step(up_h, o, co, t, proj)
        d_z = step(t, walk.previous_of_step(seq[1], cs0, t, cs_prev), up_h, up_cs, dcs_prev)
        finish_state_grad(dcs_prev, None, old_cs_t)
        target = grad_h if stopped is None else dh_prev
        np.matmul(d_z, w_h_t, out=target)
        finish_state_grad(target, masks.recurrent, old_h_t)
        if stopped is None:
            grad_cs, dcs_prev = dcs_prev, grad_cs
        else:                        # stopped rows keep their state gradient
            np.copyto(grad_h, dh_prev, where=~stopped)
            np.copyto(grad_cs, dcs_prev, where=~stopped)
    return grad_cs, grad_h


def _unzoned_cells(walk, cs0, seq, weights, settings, masks, out):
    """``seq`` with every step's own cell state, before zoneout mixed it with the old one,
    in place of the saved one (``seq`` itself without zoneout of ``cs``): into ``out
    [T, B, H]`` (``gradcells.reference.lstm._unzoned``), ``c̃ = clip(i∘ci + f∘cs_prev)``
    from the saved gates and the saved (zoned) previous states in ``walk``'s order
    (``Walk.add_previous_product``), whole-array ops; with the
    normalising carry its layer norm (``layer_norm_forward_kernel``, a zero addend)."""
    i, cs, f, _, ci = seq[:5]
    if masks.zoneout_cs is None or out.size == 0:
        return seq
    np.multiply(i, ci, out=out)
    walk.add_previous_product(f, cs0, cs, out)
    if settings.cell_clip is not None:
        np.clip(out, -settings.cell_clip, settings.cell_clip, out=out)
    norm = weights.layer_norm
    if norm is not None and settings.ln_carry == "normalized":
        layer_norm_forward_kernel(flat(out), contiguous(norm.gamma_c), contiguous(norm.beta_c),
                                  np.zeros(out.shape[2], out.dtype), settings.ln_epsilon)
    return (i, out, *seq[2:])


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12; ``_jvp``)


def lstm_cell_jvp(x, cs_prev, h_prev, weights, tangents, settings):
    """One LSTM step and its tangent along ``tangents`` (an ``LSTMCellGrads``, None fields
    zero): ``(LSTMCellState, LSTMCellState of tangents)``, the primal exactly as
    ``lstm_cell``'s (``_jvp.lstm_cell_step``; with a layer norm a sequence of one step,
    ``_jvp.lstm_jvp``, whose matmuls are then the cell's)."""
    from ._jvp import lstm_cell_step, lstm_jvp

    if weights.layer_norm is None:
        outs, d_outs = lstm_cell_step(x, cs_prev, h_prev, weights, tangents, settings)
        return LSTMCellState(*outs), LSTMCellState(*d_outs)
    outs, d_outs = lstm_jvp(x[None], None if tangents.x is None else tangents.x[None],
                            (cs_prev, h_prev), (tangents.cs_prev, tangents.h_prev), weights,
                            tangents[3:], settings)
    return (LSTMCellState(*(a[0] for a in outs[:7])),
            LSTMCellState(*(a[0] for a in d_outs[:7])))


def lstm_sequence_jvp(x, cs0, h0, weights, tangents, settings):
    """``lstm_sequence`` and its tangent along ``tangents`` (an ``LSTMSequenceGrads``, None
    fields zero): ``(LSTMSequence, LSTMSequence of tangents)``. The primal is the
    forward's, bitwise; ``_jvp.lstm_jvp`` states the plan."""
    from ._jvp import lstm_jvp

    outs, d_outs = lstm_jvp(x, tangents.x, (cs0, h0), (tangents.cs0, tangents.h0), weights,
                            tangents[3:], settings)
    return LSTMSequence(*outs), LSTMSequence(*d_outs)


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12; ``_grad_jvp``)


def lstm_cell_grad_jvp(x, cs_prev, h_prev, weights, state, tangents, settings, *, d_h=None,
                       d_cs=None, d_h_tangent=None, d_cs_tangent=None, clip_grad="exact"):
    """The JVP of ``lstm_cell_grad`` along ``tangents`` (an ``LSTMCellGrads``, None fields
    zero) and the upstream gradients' tangents: ``(LSTMCellGrads, LSTMCellGrads of
    tangents)``, as a sequence of one step (``_grad_jvp.lstm_grad_jvp``; the step's
    upstream gradients are the cell's, its matmuls ``x·W_x`` and ``h_prev·W_h``)."""
    from ._grad_jvp import lstm_grad_jvp

    def step(a):
        return None if a is None else a[None]

    seq = LSTMSequence(*(a[None] for a in state), cs_final=state.cs, h_final=state.h)
    t_seq = LSTMSequenceGrads(step(tangents.x), *tangents[1:])
    upstreams = ((step(d_h), step(d_h_tangent)), (step(d_cs), step(d_cs_tangent)),
                 (None, None), (None, None))
    results = lstm_grad_jvp(x[None], (cs_prev, h_prev), weights, seq, t_seq, settings,
                            upstreams, clip_grad)
    return tuple(LSTMCellGrads(g.x[0], *g[1:]) for g in results)


def lstm_sequence_grad_jvp(x, cs0, h0, weights, seq, tangents, settings, *, d_h=None,
                           d_cs=None, d_h_final=None, d_cs_final=None, d_h_tangent=None,
                           d_cs_tangent=None, d_h_final_tangent=None, d_cs_final_tangent=None,
                           clip_grad="exact"):
    """The JVP of ``lstm_sequence_grad`` along ``tangents`` (an ``LSTMSequenceGrads``, None
    fields zero) and the upstream gradients' tangents: ``(LSTMSequenceGrads,
    LSTMSequenceGrads of tangents)``; the primal is this backend's gradient (its kernels),
    the tangent ``_grad_jvp.lstm_grad_jvp``'s (the plan and the math are there), every
    option fused."""
    from ._grad_jvp import lstm_grad_jvp

    upstreams = ((d_h, d_h_tangent), (d_cs, d_cs_tangent), (d_h_final, d_h_final_tangent),
                 (d_cs_final, d_cs_final_tangent))
    return lstm_grad_jvp(x, (cs0, h0), weights, seq, tangents, settings, upstreams,
                         clip_grad)
