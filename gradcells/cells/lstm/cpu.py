"""The LSTM block cell and sequence on the CPU: BLAS matmuls plus one fused Numba pass each
way (``_cpu_kernels``).

The math is ``gradcells.cells.lstm.reference`` (gate blocks i, ci, f, o). A cell's forward:

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
from typing import NamedTuple

import numpy as np

from ..._core.plan import flat, masked
from ..._core.xpmath import weights_part
from ...cpu._compile import kernel_array, one_row
from ...cpu._sequence import (
    Walk,
    contiguous,
    final_state,
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
    cell_gates,
    input_tangent,
    product_grads,
    sequence_inputs,
    stack_shape,
    state_step,
    step_pair,
    tangent_or_zeros,
)
from ...cpu._workspace import scratch
from ._cpu_kernels import (
    layer_norm_forward_kernel,
    layer_norm_grad_kernel,
    layer_norm_stats_kernel,
    lstm_backward_kernel,
    lstm_backward_tangent_kernel,
    lstm_forward_kernel,
    lstm_ln_backward_kernel,
    lstm_ln_forward_kernel,
    lstm_tangent_kernel,
)
from .spec import LSTMCellGrads, LSTMCellState, LSTMNorm, LSTMSequence, LSTMSequenceGrads

_INF = math.inf


def _clip_or_inf(cell_clip):
    return _INF if cell_clip is None else cell_clip


def _mask_clip(settings, clip_grad):
    """The clip the backward kernel masks at: the forward's for ``clip_grad="exact"``, else
    (or without clipping) infinity."""
    masked = settings.cell_clip is not None and clip_grad == "exact"
    return settings.cell_clip if masked else _INF


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
        wci, wcf, wco = (kernel_array(a) for a in _peepholes_of(weights))
    else:
        wci = wcf = wco = b
    dtype = gates.dtype
    outputs = [np.empty((n_batch, n_hidden), dtype) for _ in range(7)]
    lstm_forward_kernel(gates, one_row(b), kernel_array(cs_prev), wci, wcf, wco, peephole,
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
                   d_i=None, d_f=None, d_o=None, d_ci=None, d_co=None, clip_grad="exact"):
    """Gradient of one LSTM step with respect to every input (``LSTMCellGrads``), from the
    upstream gradients of every field (the gates' through ``gate_upstreams``)."""
    fields = gate_upstreams((d_i, d_f, d_o, d_ci, d_co), None, cs_prev.shape)
    if weights.layer_norm is not None:
        return _norm_cell_grad(x, cs_prev, h_prev, weights, state, settings, d_h, d_cs,
                               fields, clip_grad)
    n_batch, n_hidden = cs_prev.shape
    n_in = x.shape[1]
    dtype = cs_prev.dtype
    cs_prev = kernel_array(cs_prev)
    saved = [kernel_array(a) for a in _gate_arrays(state)]
    d_gates = np.empty((n_batch, 4 * n_hidden), dtype)
    dcs_prev = np.empty((n_batch, n_hidden), dtype)
    d_bias = np.zeros(4 * n_hidden, dtype)
    peephole = settings.peepholes
    if peephole:
        wci, wcf, wco = (kernel_array(a) for a in _peepholes_of(weights))
        d_peep = np.zeros((3, n_hidden), dtype)
        d_wci, d_wcf, d_wco = d_peep
    else:
        wci = wcf = wco = d_wci = d_wcf = d_wco = d_bias
    d_h, d_w_proj = _cell_projection_grad(d_h, saved, weights.w_proj, settings, clip_grad)
    lstm_backward_kernel(
        cs_prev, *saved,
        cs_prev if d_h is None else kernel_array(d_h), d_h is not None,
        cs_prev if d_cs is None else kernel_array(d_cs), d_cs is not None,
        *_fields_arguments(fields, cs_prev),
        wci, wcf, wco, peephole, _mask_clip(settings, clip_grad),
        d_gates, dcs_prev, d_bias, d_wci, d_wcf, d_wco)
    dxh = np.dot(d_gates, weights.w.T)
    dw = np.dot(np.concatenate((x, h_prev), axis=1).T, d_gates)
    if not peephole:
        d_wci = d_wcf = d_wco = None
    return LSTMCellGrads(x=dxh[:, :n_in], cs_prev=dcs_prev, h_prev=dxh[:, n_in:], w=dw,
                         b=d_bias, wci=d_wci, wcf=d_wcf, wco=d_wco, w_proj=d_w_proj)


def gate_upstreams(gates, lengths, shape):
    """The gates' upstream gradients ``(d_i, d_f, d_o, d_ci, d_co)`` (each of ``shape``,
    ``[B, H]`` or ``[T, B, H]``, or None) as the backward kernels read them: one array
    ``[5, B, H]``, or ``[T, 5, B, H]`` for a sequence, a step's ``[5, B, H]`` contiguous
    (zeros for a None among given ones, and past each row's length: never read there); None
    when all are None, and then the kernels run their loops without them."""
    given = [g for g in gates if g is not None]
    if not given:
        return None
    out = np.zeros((*shape[:-2], len(gates), *shape[-2:]), given[0].dtype)
    for k, g in enumerate(gates):
        if g is not None:
            out[..., k, :, :] = g
    if lengths is not None:
        stopped = ~(np.arange(shape[0])[:, None] < lengths[None, :])
        np.copyto(out, 0, where=stopped[:, None, :, None])
    return out


def _fields_arguments(fields, like):
    """The backward kernels' ``(d_fields, has_d_fields)`` for a step: the step's
    ``[5, B, H]`` gates' upstreams, or a stand-in ``[1, B, H]`` view of ``like`` (never
    read)."""
    return (like[None], False) if fields is None else (fields, True)


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


def _peepholes_of(a):
    """The peephole fields ``(wci, wcf, wco)`` of a weight set, a gradient or tangents, by
    name."""
    return a.wci, a.wcf, a.wco


def _gate_arrays(state):
    """An ``LSTMCellState``'s arrays before the output ``(i, cs, f, o, ci, co)``, by
    name (``h`` left out)."""
    return state.i, state.cs, state.f, state.o, state.ci, state.co


def _steps(seq):
    """An ``LSTMSequence``'s every-step arrays, by name (``LSTMCellState``'s fields; the
    final states left out)."""
    return tuple(getattr(seq, name) for name in LSTMCellState._fields)


def _peepholes(weights, settings, contiguous_as=kernel_array):
    """``(wci, wcf, wco, peephole)`` for the kernels (the bias stands in without
    peepholes: never read)."""
    if settings.peepholes:
        return (*(contiguous_as(a) for a in _peepholes_of(weights)), True)
    b = contiguous_as(weights.b)
    return b, b, b, False


def _norm_stats(z, epsilon):
    """``z [.., W]`` turned into ``ẑ`` in place; returns ``r`` (``z``'s shape without its
    last axis)."""
    rstd = np.empty(z.shape[:-1], z.dtype)
    layer_norm_stats_kernel(z.reshape(-1, z.shape[-1]), epsilon, rstd.reshape(-1))
    return rstd


def _norm_cell_grad(x, cs_prev, h_prev, weights, state, settings, d_h, d_cs, fields,
                    clip_grad):
    """``lstm_cell_grad`` with a layer norm (``fields``: ``gate_upstreams``')."""
    n_batch, n_hidden = cs_prev.shape
    n_in = x.shape[1]
    dtype = cs_prev.dtype
    norm = _norm_arrays(weights)
    w = weights.w
    dz_x, dz_h = np.dot(x, w[:n_in]), np.dot(h_prev, w[n_in:])   # ẑ first, then dz
    rstd_x, rstd_h = _norm_stats(dz_x, settings.ln_epsilon), _norm_stats(dz_h, settings.ln_epsilon)
    saved = [kernel_array(a) for a in _gate_arrays(state)]
    d_h, d_w_proj = _cell_projection_grad(d_h, saved, weights.w_proj, settings, clip_grad)
    cs_prev = kernel_array(cs_prev)
    d_gates = np.empty((n_batch, 4 * n_hidden), dtype)
    dcs_prev = np.empty((n_batch, n_hidden), dtype)
    sums = _norm_sums(4 * n_hidden, n_hidden, settings.peepholes, dtype)
    lstm_ln_backward_kernel(
        cs_prev, *saved,
        cs_prev if d_h is None else kernel_array(d_h), d_h is not None,
        cs_prev if d_cs is None else kernel_array(d_cs), d_cs is not None,
        *_fields_arguments(fields, cs_prev),
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
                       d_h_final=None, d_cs_final=None, d_i=None, d_f=None, d_o=None,
                       d_ci=None, d_co=None, clip_grad="exact"):
    """Backpropagation through time for ``lstm_sequence``.

    ``grad_h, grad_cs``: the gradient of the state after the current step (the final-state
    gradients before the loop). Per step (``_backward_steps``): ``lstm_backward_kernel``
    from ``grad + d[t]`` and the gates' ``d_i[t], ..., d_co[t]`` (``gate_upstreams``, or
    none) writes ``dG_t``, ``dcs_prev`` and the sums; ``dG_t·W_hᵀ`` (BLAS) is the new
    ``grad_h``. Then ``dx`` and ``dw`` over all steps at once (``input_and_weight_grads``).
    With a projection ``grad_h`` is ``[B, P]`` and each step first goes through the
    projection (``_projection_step``); ``dw_proj = M_flatᵀ·DHraw_flat`` after the loop.

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
    n_hidden, n_state, dtype = cs0.shape[1], h0.shape[1], x.dtype   # n_state: P (projection)
    lengths = lengths_of(settings.seq_len)
    walk = Walk(n_steps, lengths, settings.reverse)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, n_state, n_hidden)
    x = running_inputs(masked(x, masks.input), lengths)
    seq = tuple(map(contiguous, _steps(seq)))
    d_h, d_cs = (None if d is None else contiguous(d) for d in (d_h, d_cs))
    fields = gate_upstreams((d_i, d_f, d_o, d_ci, d_co), lengths, seq[0].shape)
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
        step, d_parts = _plain_backward_work((own, fields), weights, settings, clip_grad,
                                             buffers[3], sums)
    else:
        step, d_parts, norm = _norm_backward_work(walk, x, (h0_seen, h_seen), (own, fields),
                                                  weights, settings, clip_grad,
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


def _plain_backward_work(saved, weights, settings, clip_grad, d_gates, sums):
    """``lstm_sequence_grad``'s step without a layer norm (``_step_grad`` of
    ``lstm_backward_kernel``; ``saved``: the saved steps and the gates' upstreams) and the
    arrays that will hold ``(dz_x, dz_h)``: ``dG`` twice."""
    fixed = (*_peepholes(weights, settings, contiguous), _mask_clip(settings, clip_grad))
    return _step_grad(*saved, lstm_backward_kernel, fixed, (), d_gates, sums[:4]), (d_gates,
                                                                                   d_gates)


def _step_grad(seq, fields, step_kernel, fixed, per_step, d_gates, sums):
    """The backward step for ``_backward_steps``: ``step(t, cs_prev, up_h, up_cs,
    dcs_prev)`` runs ``step_kernel`` on step t (writing ``dG_t`` and ``dcs_prev``,
    accumulating ``sums``) and returns what multiplies ``W_hᵀ``: ``dG_t``, or with a layer
    norm the ``dz_h,t`` written over ``per_step[0][t]``. ``fields``: the gates' upstreams
    ``[T, 5, B, H]`` (``gate_upstreams``) or None; ``fixed``: the kernel's arguments after
    the upstream gradients; ``per_step``: its ``[T, ...]`` arguments after those."""
    i, cs, f, o, ci, co, _ = seq

    def step(t, cs_prev, up_h, up_cs, dcs_prev):
        step_kernel(cs_prev, i[t], cs[t], f[t], o[t], ci[t], co[t], up_h, True, up_cs, True,
                    *_fields_arguments(None if fields is None else fields[t], dcs_prev),
                    *fixed, *[a[t] for a in per_step], d_gates[t], dcs_prev, *sums)
        return per_step[0][t] if per_step else d_gates[t]

    return step


def _norm_backward_work(walk, x, states_seen, saved, weights, settings, clip_grad, buffers,
                        sums):
    """The layer norm's part of ``lstm_sequence_grad`` before the loop: ``x̂`` and ``ĥ`` of
    every step recomputed into the scratch and their ``r``; returns the step
    (``_step_grad``), the arrays that will hold ``(dz_x, dz_h)`` (``x̂``, ``ĥ``) and the
    layer norm's contiguous arrays. ``states_seen``: ``(h0, h)`` as the recurrent matmuls
    saw them; ``saved``: the saved steps and the gates' upstreams (``_step_grad``'s);
    ``buffers``: ``(d_gates, x̂, ĥ, r [2, T, B])``."""
    d_gates, x_hat, h_hat, rstd = buffers
    n_in = x.shape[2]
    norm = LSTMNorm(*map(contiguous, weights.layer_norm))
    w = contiguous(weights.w)
    projection(x, w[:n_in], None, x_hat)
    walk.recurrent_projection(*states_seen, w[n_in:], h_hat)
    for z, r in ((x_hat, rstd[0]), (h_hat, rstd[1])):
        layer_norm_stats_kernel(flat(z), settings.ln_epsilon, r.reshape(-1))
    fixed = _backward_norm_fixed(norm, weights, settings, clip_grad, contiguous)
    step = _step_grad(*saved, lstm_ln_backward_kernel, fixed, (h_hat, rstd[1]), d_gates,
                      sums[:7])
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
    [T, B, H]`` (``gradcells.cells.lstm.reference._unzoned``), ``c̃ = clip(i∘ci + f∘cs_prev)``
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
# forward mode (docs/spec.md §12)


def lstm_cell_jvp(x, cs_prev, h_prev, weights, tangents, settings):
    """One LSTM step and its tangent along ``tangents`` (an ``LSTMCellGrads``, None fields
    zero): ``(LSTMCellState, LSTMCellState of tangents)``, the primal exactly as
    ``lstm_cell``'s (``lstm_cell_step``; with a layer norm a sequence of one step,
    ``lstm_jvp``, whose matmuls are then the cell's)."""

    if weights.layer_norm is None:
        outs, t_outs = lstm_cell_step(x, cs_prev, h_prev, weights, tangents, settings)
        return LSTMCellState(*outs), LSTMCellState(*t_outs)
    outs, t_outs = lstm_jvp(x[None], None if tangents.x is None else tangents.x[None],
                            (cs_prev, h_prev), (tangents.cs_prev, tangents.h_prev), weights,
                            weights_part(tangents, weights), settings)
    return tuple(LSTMCellState(*(a[0] for a in _steps(LSTMSequence(*o))))
                 for o in (outs, t_outs))


def lstm_sequence_jvp(x, cs0, h0, weights, tangents, settings):
    """``lstm_sequence`` and its tangent along ``tangents`` (an ``LSTMSequenceGrads``, None
    fields zero): ``(LSTMSequence, LSTMSequence of tangents)``. The primal is the
    forward's, bitwise; ``lstm_jvp`` states the plan."""

    outs, t_outs = lstm_jvp(x, tangents.x, (cs0, h0), (tangents.cs0, tangents.h0), weights,
                            weights_part(tangents, weights), settings)
    return LSTMSequence(*outs), LSTMSequence(*t_outs)


# --------------------------------------------------------------------------------------
# forward mode's loop: the primal as the forward computes it, its tangent beside it


class _LSTMStep(NamedTuple):
    """An LSTM sequence's per-step scratch (``_workspace.scratch``)."""

    h_g: np.ndarray          # [B, 4H] h_seen·W_h
    t_h_g: np.ndarray        # [B, 4H] its tangent
    h_seen: np.ndarray       # [B, P]  h_prev∘m_rec
    t_h_seen: np.ndarray     # [B, P]
    h_stack: np.ndarray      # [B, 2P] [t_h_seen, h_seen] (when t_W_h is given)
    m: np.ndarray            # [B, H]  o∘co before the projection (or [B, 0])
    t_m: np.ndarray          # [B, H]
    m_stack: np.ndarray      # [B, 2H] [t_m, m] (when t_w_proj is given)


def lstm_jvp(x, t_x, states, t_states, weights, t_weights, settings):
    """The LSTM sequence ``x [T, B, I]`` from ``states = (cs0, h0)`` and its tangent:
    ``(outs, t_outs)``, each ``(i, cs, f, o, ci, co, h [T, B, ·], cs_final, h_final)``
    (a cell's settings have no masks or lengths; ``t_weights``: the tangents of
    ``weights``).

    The forward's plan (``lstm_sequence``): the input part ``x·W_x + b`` (with a layer
    norm ``LN(x·W_x) + b``) for all steps, per step ``h_seen·W_h`` and the step's pass, then
    the projection ``clip(m·w_proj)``; each matmul's tangent one stacked BLAS call beside it.
    The primal's pass is the forward's kernel; the tangent's is ``lstm_tangent_kernel``
    (with a layer norm NumPy's, ``_ln_step_tangent``)."""
    (cs0, h0), (t_cs0, t_h0) = (contiguous(a) for a in states), t_states
    t_w, t_b, t_wci, t_wcf, t_wco, t_w_proj, t_norm = t_weights
    n_in, (n_batch, n_hidden), n_state = x.shape[2], cs0.shape, h0.shape[1]
    x, t_x, lengths, masks = sequence_inputs(x, t_x, settings, n_state, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    t_cs0, t_h0 = tangent_or_zeros(t_cs0, cs0), tangent_or_zeros(t_h0, h0)
    w = contiguous(weights.w)
    lin_x = Linear.of(w[:n_in], None if t_w is None else t_w[:n_in])
    lin_h = Linear.of(w[n_in:], None if t_w is None else t_w[n_in:])
    projected = weights.w_proj is not None
    lin_p = Linear.of(weights.w_proj, t_w_proj) if projected else None
    gates, steps = (n_steps, n_batch, 4 * n_hidden), (n_steps, n_batch, n_hidden)
    m_shape = (n_batch, n_hidden if projected else 0)
    buffers = scratch(dtype, gates, gates, stack_shape(lin_x, n_steps * n_batch),
                      (n_batch, 4 * n_hidden), (n_batch, 4 * n_hidden), (n_batch, n_state),
                      (n_batch, n_state), stack_shape(lin_h, n_batch), m_shape, m_shape,
                      stack_shape(lin_p, n_batch) if projected else (0, 0))
    x_g, t_x_g, x_stack = buffers[:3]
    step = _LSTMStep(*buffers[3:])
    _lstm_input_part(x, t_x, weights, (lin_x, t_b, t_norm), settings, (x_g, t_x_g, x_stack))
    outs, t_outs = _lstm_outputs(steps, n_state, dtype), _lstm_outputs(steps, n_state, dtype)
    run_step = _lstm_step_pass(weights, t_weights, settings)
    for t in range(n_steps):
        cs_prev, h_prev = step_pair(t, cs0, outs[1]), step_pair(t, h0, outs[6])
        t_cs_prev, t_h_prev = step_pair(t, t_cs0, t_outs[1]), step_pair(t, t_h0, t_outs[6])
        h_read = seen(h_prev, masks.recurrent, step.h_seen)
        t_h_read = seen(t_h_prev, masks.recurrent, step.t_h_seen)
        np.matmul(h_read, lin_h.w, out=step.h_g)
        lin_h.into(t_h_read, h_read, step.t_h_g, step.h_stack)
        new = [a[t] for a in outs], [a[t] for a in t_outs]
        final_h = new[0][6], new[1][6]
        if projected:
            new[0][6], new[1][6] = step.m, step.t_m
        run_step(step.h_g, x_g[t], step.t_h_g, t_x_g[t], (cs_prev, t_cs_prev), new)
        if projected:
            _project_jvp(lin_p, step, settings.proj_clip, final_h)
        for k, (old, t_old) in ((1, (cs_prev, t_cs_prev)), (6, (h_prev, t_h_prev))):
            zoneout = masks.zoneout_cs if k == 1 else masks.zoneout_h
            zone(zoneout, t, old, outs[k][t])
            zone(zoneout, t, t_old, t_outs[k][t])
    finals = [final_state(outs[k], first, lengths) for k, first in ((1, cs0), (6, h0))]
    t_finals = [final_state(t_outs[k], first, lengths)
                for k, first in ((1, t_cs0), (6, t_h0))]
    zero_stopped((*outs, *t_outs), lengths)
    return (*outs, *finals), (*t_outs, *t_finals)


def _lstm_outputs(steps, n_state, dtype):
    """A sequence's seven per-step outputs ``(i, cs, f, o, ci, co [T, B, H], h [T, B, P])``."""
    return [*step_outputs(6, steps, dtype), np.empty((*steps[:2], n_state), dtype)]


def _lstm_input_part(x, t_x, weights, tangent, settings, buffers):
    """Every step's input part into ``buffers = (x_g, t_x_g, stack)``: the forward's
    ``x·W_x + b`` (or ``LN(x·W_x) + b``, ``layer_norm_forward_kernel`` in place) and its
    tangent ``t_x·W_x + x·t_W_x + t_b`` (or ``t_LN(x·W_x) + t_b``); ``tangent = (lin_x, t_b,
    t_norm)``."""
    lin_x, t_b, t_norm = tangent
    x_g, t_x_g, stack = buffers
    b = contiguous(weights.b)
    norm = weights.layer_norm
    if norm is None:
        projection(x, lin_x.w, b, x_g)
        input_tangent(lin_x, t_x, x, t_b, t_x_g, stack)
        return
    norm = LSTMNorm(*map(contiguous, norm))
    t_norm = norm_tangents(t_norm, norm)
    projection(x, lin_x.w, None, x_g)
    input_tangent(lin_x, t_x, x, None, t_x_g, stack)
    t_x_g[...] = layer_norm_tangent(x_g, t_x_g, norm.gamma_x, t_norm.gamma_x, t_norm.beta_x,
                                   settings.ln_epsilon)
    if t_b is not None:
        t_x_g += t_b
    layer_norm_forward_kernel(flat(x_g), norm.gamma_x, norm.beta_x, b, settings.ln_epsilon)


def norm_tangents(t_norm, norm):
    """The layer norm's tangents as an ``LSTMNorm`` with every None a zero array."""
    t_norm = t_norm if t_norm is not None else LSTMNorm(*(None,) * len(norm))
    return LSTMNorm(*(tangent_or_zeros(t, p) for t, p in zip(t_norm, norm, strict=True)))


def layer_norm_stats(z, epsilon):
    """``(ẑ, r)`` of ``z`` over its last axis (biased variance, the reference's formula)."""
    n = max(z.shape[-1], 1)
    centred = z - z.sum(axis=-1, keepdims=True) / n
    rstd = 1 / np.sqrt((centred * centred).sum(axis=-1, keepdims=True) / n + epsilon)
    return centred * rstd, rstd


def layer_norm_tangent(z, t_z, gamma, t_gamma, t_beta, epsilon):
    """The tangent of ``LN(z; γ, β)``: ``t_γ∘ẑ + γ∘r·(t_z - mean(t_z) - ẑ∘mean(ẑ∘t_z)) + t_β``
    (``xpmath.layer_norm_jvp``'s)."""
    z_hat, rstd = layer_norm_stats(z, epsilon)
    n = max(z.shape[-1], 1)
    t_hat = rstd * (t_z - t_z.sum(axis=-1, keepdims=True) / n
                    - z_hat * (z_hat * t_z).sum(axis=-1, keepdims=True) / n)
    return t_gamma * z_hat + gamma * t_hat + t_beta


def _lstm_step_pass(weights, t_weights, settings):
    """The step's elementwise pass as ``run(h_g, x_g, t_h_g, t_x_g, (cs_prev, t_cs_prev),
    (outs, t_outs))``, its fixed arguments bound (the bias stands in for absent peepholes
    and their tangents: never read)."""
    b = contiguous(weights.b)
    peephole = settings.peepholes
    peeps = tuple(contiguous(a) for a in _peepholes_of(weights)) if peephole else (b, b, b)
    t_peeps = (tuple(tangent_or_zeros(t, p)
                     for t, p in zip(_peepholes_of(t_weights), peeps, strict=True))
               if peephole else (b, b, b))
    clip = math.inf if settings.cell_clip is None else settings.cell_clip
    if weights.layer_norm is None:
        fixed = (*peeps, peephole, settings.forget_bias, clip)
        options = (peephole, clip, settings.cell_clip is not None)

        def run(h_g, x_g, t_h_g, t_x_g, cs, new):
            lstm_forward_kernel(h_g, x_g, cs[0], *fixed, *new[0])
            t_h_g += t_x_g
            lstm_tangent_kernel(t_h_g, cs[0], cs[1], peeps, t_peeps, options,
                                tuple(new[0][:6]), tuple(new[1]))
        return run
    norm = LSTMNorm(*map(contiguous, weights.layer_norm))
    t_norm = norm_tangents(t_weights[6], norm)
    fixed = (norm.gamma_h, norm.beta_h, norm.gamma_c, norm.beta_c, settings.ln_epsilon,
             settings.ln_carry == "normalized", *peeps, peephole, settings.forget_bias, clip)

    def run_norm(h_g, x_g, t_h_g, t_x_g, cs, new):
        lstm_ln_forward_kernel(h_g, x_g, cs[0], *fixed, *new[0])
        _ln_step_tangent(h_g, t_h_g, t_x_g, cs, new, (norm, t_norm, peeps, t_peeps, peephole),
                         settings)
    return run_norm


def _ln_step_tangent(z_h, t_z_h, t_x_g, cs, new, fixed, settings):
    """The layer-normalised step's tangent (NumPy; the reference's
    ``lstm_gates_jvp``/``lstm_activations_jvp``) into ``new[1]``, from the primal the
    kernel wrote (``new[0]``), ``z_h = h_seen·W_h``, its tangent and the input part's."""
    norm, t_norm, (wci, wcf, wco), (t_wci, t_wcf, t_wco), peephole = fixed
    cs_prev, t_cs_prev = cs
    i, cs_new, f, o, ci, co, _ = new[0]
    n_hidden, eps = cs_prev.shape[1], settings.ln_epsilon
    t_g = layer_norm_tangent(z_h, t_z_h, norm.gamma_h, t_norm.gamma_h, t_norm.beta_h, eps)
    t_g += t_x_g
    t_gi, t_gc, t_gf, t_go = (t_g[:, k * n_hidden:(k + 1) * n_hidden] for k in range(4))
    if peephole:
        t_gi = t_gi + t_cs_prev * wci + cs_prev * t_wci
        t_gf = t_gf + t_cs_prev * wcf + cs_prev * t_wcf
    t_i, t_ci, t_f = i * (1 - i) * t_gi, (1 - ci * ci) * t_gc, f * (1 - f) * t_gf
    t_tilde = t_i * ci + i * t_ci + t_f * cs_prev + f * t_cs_prev
    raw = i * ci + f * cs_prev
    c_tilde = raw
    if settings.cell_clip is not None:
        t_tilde = np.where(np.abs(raw) <= settings.cell_clip, t_tilde,
                           np.zeros((), t_tilde.dtype))
        c_tilde = np.clip(raw, -settings.cell_clip, settings.cell_clip)
    t_n = layer_norm_tangent(c_tilde, t_tilde, norm.gamma_c, t_norm.gamma_c, t_norm.beta_c,
                             eps)
    t_cs = t_n if settings.ln_carry == "normalized" else t_tilde
    t_co = (1 - co * co) * t_n
    if peephole:
        t_go = t_go + t_cs * wco + cs_new * t_wco
    t_o = o * (1 - o) * t_go
    for out, value in zip(new[1], (t_i, t_cs, t_f, t_o, t_ci, t_co, t_o * co + o * t_co),
                          strict=True):
        out[...] = value


def _project_jvp(lin_p, step, proj_clip, out):
    """The projection and its tangent: ``h = clip(m·w_proj)`` (the forward's: BLAS, then
    the clip in place) and ``t_h = t_m·w_proj + m·t_w_proj``, zero where the clip is active
    (the boundary passes), into ``out = (h, t_h)``."""
    h, t_h = out
    np.matmul(step.m, lin_p.w, out=h)
    lin_p.into(step.t_m, step.m, t_h, step.m_stack)
    if proj_clip is not None:
        np.copyto(t_h, 0, where=~(np.abs(h) <= proj_clip))
        np.clip(h, -proj_clip, proj_clip, out=h)




def lstm_cell_step(x, cs_prev, h_prev, weights, tangents, settings):
    """The LSTM cell without a layer norm and its tangent, the primal exactly as
    ``lstm_cell``'s (``lstm_forward_kernel`` on ``[x, h_prev]·w``, then the
    projection): ``(outs, t_outs)``, each the seven ``LSTMCellState`` fields."""
    gates, t_gates = cell_gates(x, h_prev, weights.w, (tangents.x, tangents.h_prev,
                                                        tangents.w))
    b = contiguous(weights.b)
    n_batch, n_hidden = cs_prev.shape
    cs_prev = contiguous(cs_prev)
    outs = [np.empty((n_batch, n_hidden), gates.dtype) for _ in range(7)]
    t_outs = [np.empty_like(a) for a in outs]
    run = _lstm_step_pass(weights, weights_part(tangents, weights), settings)
    run(gates, one_row(b), t_gates, one_row(tangent_or_zeros(tangents.b, b)),   # addends
        (cs_prev, tangent_or_zeros(tangents.cs_prev, cs_prev)), (outs, t_outs))
    if weights.w_proj is not None:
        lin_p = Linear.of(weights.w_proj, tangents.w_proj)
        m, t_m = outs[6], t_outs[6]
        step = _LSTMStep(*(None,) * 5, m, t_m, np.empty(stack_shape(lin_p, n_batch), m.dtype))
        outs[6] = np.empty((n_batch, lin_p.w.shape[1]), m.dtype)
        t_outs[6] = np.empty_like(outs[6])
        _project_jvp(lin_p, step, settings.proj_clip, (outs[6], t_outs[6]))
    return outs, t_outs


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12)


def lstm_cell_grad_jvp(x, cs_prev, h_prev, weights, state, tangents, settings, *, d_h=None,
                       d_cs=None, d_i=None, d_f=None, d_o=None, d_ci=None, d_co=None,
                       d_h_tangent=None, d_cs_tangent=None, d_i_tangent=None,
                       d_f_tangent=None, d_o_tangent=None, d_ci_tangent=None,
                       d_co_tangent=None, clip_grad="exact"):
    """The JVP of ``lstm_cell_grad`` along ``tangents`` (an ``LSTMCellGrads``, None fields
    zero) and the upstream gradients' tangents (every field's): ``(LSTMCellGrads,
    LSTMCellGrads of tangents)``, as a sequence of one step (``lstm_grad_jvp``; the step's
    upstream gradients are the cell's, its matmuls ``x·W_x`` and ``h_prev·W_h``)."""

    def step(a):
        return None if a is None else a[None]

    seq = LSTMSequence(*(a[None] for a in state), cs_final=state.cs, h_final=state.h)
    t_seq = LSTMSequenceGrads(step(tangents.x), tangents.cs_prev, tangents.h_prev,
                              *weights_part(tangents, weights))
    gates = (d_i, d_f, d_o, d_ci, d_co)
    t_gates = (d_i_tangent, d_f_tangent, d_o_tangent, d_ci_tangent, d_co_tangent)
    upstreams = ((step(d_h), step(d_h_tangent)), (step(d_cs), step(d_cs_tangent)),
                 (None, None), (None, None),
                 (tuple(map(step, gates)), tuple(map(step, t_gates))))
    results = lstm_grad_jvp(x[None], (cs_prev, h_prev), weights, seq, t_seq, settings,
                            upstreams, clip_grad)
    return tuple(LSTMCellGrads(g.x[0], g.cs0, g.h0, *weights_part(g, weights))
                 for g in results)


def lstm_sequence_grad_jvp(x, cs0, h0, weights, seq, tangents, settings, *, d_h=None,
                           d_cs=None, d_h_final=None, d_cs_final=None, d_i=None, d_f=None,
                           d_o=None, d_ci=None, d_co=None, d_h_tangent=None,
                           d_cs_tangent=None, d_h_final_tangent=None, d_cs_final_tangent=None,
                           d_i_tangent=None, d_f_tangent=None, d_o_tangent=None,
                           d_ci_tangent=None, d_co_tangent=None, clip_grad="exact"):
    """The JVP of ``lstm_sequence_grad`` along ``tangents`` (an ``LSTMSequenceGrads``, None
    fields zero) and the upstream gradients' tangents (every field's): ``(LSTMSequenceGrads,
    LSTMSequenceGrads of tangents)``; the primal is this backend's gradient (its kernels),
    the tangent ``lstm_grad_jvp``'s (the plan and the math are there), every
    option fused."""

    upstreams = ((d_h, d_h_tangent), (d_cs, d_cs_tangent), (d_h_final, d_h_final_tangent),
                 (d_cs_final, d_cs_final_tangent),
                 ((d_i, d_f, d_o, d_ci, d_co),
                  (d_i_tangent, d_f_tangent, d_o_tangent, d_ci_tangent, d_co_tangent)))
    return lstm_grad_jvp(x, (cs0, h0), weights, seq, tangents, settings, upstreams,
                         clip_grad)


# --------------------------------------------------------------------------------------
# second order's loop: the gradient's backward loop with a tangent beside every value


def lstm_grad_jvp(x, states, weights, seq, tangents, settings, upstreams, clip_grad):
    """``lstm_sequence_grad`` and its tangent: ``(grads, grads_tangent)``, each an
    ``LSTMSequenceGrads`` (``states = (cs0, h0)``; ``upstreams``: ``(gradient, tangent)``
    pairs for ``d_h, d_cs, d_h_final, d_cs_final``, then the pair of the gates' five
    ``(d_i, ..., d_co)`` and their tangents, None fields zero).

    The result's tangent from ``lstm_jvp``; then ``lstm_sequence_grad``'s loop
    (``_lstm_backward``) with ``lstm_backward_tangent_kernel`` beside
    ``lstm_backward_kernel`` (``_LSTMCell``; with a layer norm ``_LSTMNormCell``), and
    ``product_grads``."""
    cs0, h0 = (kernel_array(a) for a in states)
    n_hidden, n_state = cs0.shape[1], h0.shape[1]
    t_seq = lstm_jvp(x, tangents.x, (cs0, h0), (tangents.cs0, tangents.h0), weights,
                     weights_part(tangents, weights), settings)[1]
    x, t_x, lengths, masks = sequence_inputs(x, tangents.x, settings, n_state, n_hidden)
    t_x = np.zeros_like(x) if t_x is None else t_x
    walk = Walk(x.shape[0], lengths, False)
    w = kernel_array(weights.w)
    t_w = tangent_or_zeros(tangents.w, w)
    firsts = (cs0, tangent_or_zeros(tangents.cs0, cs0))
    saved = _own_cells(firsts, tuple(map(kernel_array, _steps(seq))), t_seq[:7], weights,
                       tangents, settings, masks)
    h_steps = seen_states(h0, saved[0][6], masks.recurrent), seen_states(
        tangent_or_zeros(tangents.h0, h0), saved[1][6], masks.recurrent)
    shape = saved[0][0].shape
    gates = _gate_pair(upstreams[4], lengths, shape)
    if weights.layer_norm is None:
        cell = _LSTMCell(weights, tangents, settings, clip_grad, shape, gates)
    else:
        cell = _LSTMNormCell(weights, tangents, settings, clip_grad, shape,
                             (walk, (x, t_x), h_steps, (w, t_w)), gates)
    proj = None if weights.w_proj is None else _ProjectionJVP(weights, tangents, settings,
                                                              clip_grad, seq)
    carries = _lstm_backward(x.shape[2], firsts, saved, (w, t_w), cell, settings,
                             upstreams[:4], (lengths, masks), proj)
    d_parts, norms = (cell.gates, None) if weights.layer_norm is None else cell.finish()
    (gx, gw), (t_gx, t_gw) = product_grads(walk, (x, h_steps[0][0], w, h_steps[0][1]),
                                           (t_x, h_steps[1][0], t_w, h_steps[1][1]), d_parts)
    w_proj = (None, None) if proj is None else proj.weight_grads()
    results = []
    for k, (g_x, g_w) in enumerate(((gx, gw), (t_gx, t_gw))):
        sums = cell.sums[k]
        peeps = sums[1:4] if settings.peepholes else (None, None, None)
        results.append(LSTMSequenceGrads(
            x=masked_input_grad(g_x, masks.input), cs0=carries[k][0], h0=carries[k][1],
            w=g_w, b=sums[0], wci=peeps[0], wcf=peeps[1], wco=peeps[2], w_proj=w_proj[k],
            layer_norm=None if norms is None else norms[k]))
    return tuple(results)


def _gate_pair(gates, lengths, shape):
    """The gates' upstreams and their tangents (``(d_i, ..., d_co)`` twice) as
    ``gate_upstreams`` gives them, ``[T, 5, B, H]`` each: ``(None, None)`` when all ten are
    None, else both arrays (zeros for the absent)."""
    pair = [gate_upstreams(g, lengths, shape) for g in gates]
    if pair[0] is None and pair[1] is None:
        return None, None
    return tuple(np.zeros((shape[0], 5, *shape[1:]), pair[k ^ 1].dtype) if a is None else a
                 for k, a in enumerate(pair))


def _own_cells(firsts, seq, t_seq, weights, tangents, settings, masks):
    """``(saved, t_saved)``: the saved steps and their tangents with every step's own cell
    state (before zoneout mixed it with the old one) in place of the saved one, as the
    gradient reads them (``lstm._unzoned_cells``), and the saved (zoned) cell state after
    them, the next step's ``cs_prev``; the tangent ``c̃' = i'∘ci + i∘ci' + f'∘cs_prev +
    f∘cs_prev'``, zero where the clip is active (the boundary passes), with the
    normalising carry ``LN(c̃)``'s (``layer_norm_tangent``)."""

    if masks.zoneout_cs is None:
        return (*seq, seq[1]), (*t_seq, t_seq[1])
    n_steps = seq[0].shape[0]
    own = _unzoned_cells(Walk(n_steps, None, False), firsts[0], seq, weights, settings, masks,
                         np.empty_like(seq[0]))
    i, cs, f, _, ci = seq[:5]
    t_i, _, t_f, _, t_ci = t_seq[:5]
    cs_prev, t_cs_prev = (np.concatenate((first[None], steps[:-1]))[:n_steps]
                          for first, steps in zip(firsts, (cs, t_seq[1]), strict=True))
    c_tilde, t_tilde = _candidate(seq[:5], t_seq[:5], cs_prev, t_cs_prev, settings)
    norm = weights.layer_norm
    if norm is not None and settings.ln_carry == "normalized":
        t_norm = norm_tangents(tangents.layer_norm, norm)
        t_tilde = layer_norm_tangent(c_tilde, t_tilde, norm.gamma_c, t_norm.gamma_c,
                                     t_norm.beta_c, settings.ln_epsilon)
    return (*own, cs), (t_i, t_tilde, *t_seq[2:], t_seq[1])


def _candidate(gates, t_gates, cs_prev, t_cs_prev, settings):
    """``(c̃, c̃')``: ``c̃ = clip(i∘ci + f∘cs_prev)`` from the saved ``gates = (i, cs, f, o,
    ci)`` (``cs`` unread) and its tangent, zero where the clip is active."""
    i, _, f, _, ci = gates
    t_i, _, t_f, _, t_ci = t_gates
    raw = i * ci + f * cs_prev
    t_tilde = t_i * ci + i * t_ci + t_f * cs_prev + f * t_cs_prev
    if settings.cell_clip is None:
        return raw, t_tilde
    passes = np.abs(raw) <= settings.cell_clip
    return (np.clip(raw, -settings.cell_clip, settings.cell_clip),
            np.where(passes, t_tilde, np.zeros((), t_tilde.dtype)))


def _lstm_backward(n_in, firsts, saved, w_pair, cell, settings, upstreams, running, proj):
    """``lstm_sequence_grad``'s backward loop (``lstm._backward_steps``) with a tangent
    beside every value; returns the state gradients before step 0 and their tangents
    ``((dcs0, dh0), (t_dcs0, t_dh0))``. ``cell`` (``_LSTMCell`` or ``_LSTMNormCell``) runs
    each step's kernels, keeping the gate gradients, their tangents and the sums;
    ``proj``: a ``_ProjectionJVP`` or None.

    Per step t, back from the final states: ``state_step`` for both states' gradients
    and their tangents; the projection's backward and its tangent; ``cell``; the carries
    ``dZ_t·W_hᵀ`` and ``dZ'_t·W_hᵀ + dZ_t·W_h'ᵀ`` (BLAS; ``dZ`` what multiplies ``W_hᵀ``,
    ``dG`` or with a layer norm ``dz_h``) through ``finish_state_grad``; stopped rows keep
    their state gradients and tangents."""
    (seq, t_seq), (lengths, masks), (w, t_w) = saved, running, w_pair
    n_steps, n_batch, n_hidden = seq[0].shape
    n_state, dtype = seq[6].shape[2], seq[0].dtype
    (d_h, t_d_h), (d_cs, t_d_cs), (d_hf, t_d_hf), (d_csf, t_d_csf) = (
        tuple(None if a is None else kernel_array(a) for a in pair) for pair in upstreams)
    carry_h = [initial_carry(a, (n_batch, n_state), dtype) for a in (d_hf, t_d_hf)]
    carry_cs = [initial_carry(a, (n_batch, n_hidden), dtype) for a in (d_csf, t_d_csf)]
    w_h_t, t_w_h_t = (np.ascontiguousarray(a[n_in:].T) for a in (w, t_w))
    h_bufs, cs_bufs = ([np.empty((n_batch, n), dtype) for _ in range(4)]
                       for n in (n_state, n_hidden))
    prev_cs = [np.empty((n_batch, n_hidden), dtype) for _ in range(2)]
    prev_h = [np.empty((n_batch, n_state), dtype) for _ in range(2)]
    for t in range(n_steps - 1, -1, -1):
        stopped = stopped_rows(lengths, t)
        ups_h = [state_step(masks.zoneout_h, t, c, d, stopped, h_bufs[2 * k:2 * k + 2])
                 for k, (c, d) in enumerate(zip(carry_h, (d_h, t_d_h), strict=True))]
        ups_cs = [state_step(masks.zoneout_cs, t, c, d, stopped, cs_bufs[2 * k:2 * k + 2])
                  for k, (c, d) in enumerate(zip(carry_cs, (d_cs, t_d_cs), strict=True))]
        to_h = [u[0] for u in ups_h]
        if proj is not None:
            to_h = proj.step(t, to_h, seq, t_seq)
        at = [(step_pair(t, first, steps[7]), *(a[t] for a in steps[:6]))
              for first, steps in zip(firsts, (seq, t_seq), strict=True)]
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

    def __init__(self, weights, tangents, settings, clip_grad, shape, gates):

        n_steps, n_batch, n_hidden = shape
        self.fields = gates         # the gates' upstreams and tangents (_gate_pair)
        dtype = weights.w.dtype
        *peeps, peephole = _peepholes(weights, settings, kernel_array)
        self.peeps = tuple(peeps)
        self.t_peeps = (tuple(tangent_or_zeros(t, p)
                              for t, p in zip(_peepholes_of(tangents), peeps, strict=True))
                        if peephole else self.peeps)
        self.options = (peephole, _mask_clip(settings, clip_grad))
        self.has_fields = gates[0] is not None
        self.sums = [_norm_sums(4 * n_hidden, n_hidden, peephole, dtype) for _ in range(2)]
        self.gates = [np.zeros((n_steps, n_batch, 4 * n_hidden), dtype) for _ in range(2)]

    def __call__(self, t, at, to_h, to_cs, prev_cs):
        """Step t's kernels; returns ``(dG_t, dG'_t)``."""
        gates, sums = self.gates, self.sums
        fields = [prev_cs[k][None] if a is None else a[t] for k, a in enumerate(self.fields)]
        lstm_backward_kernel(*at[0], to_h[0], True, to_cs[0], True, fields[0],
                             self.has_fields, *self.peeps, *self.options, gates[0][t],
                             prev_cs[0], *sums[0][:4])
        lstm_backward_tangent_kernel(at[0], at[1], (to_h[0], to_cs[0], fields[0]),
                                     (to_h[1], to_cs[1], fields[1]), self.peeps, self.t_peeps,
                                     (*self.options, self.has_fields), gates[1][t],
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

    def __init__(self, weights, tangents, settings, clip_grad, shape, context, gates):

        walk, (x, t_x), (h_seen, t_h_seen), (w, t_w) = context
        self.fields = gates         # the gates' upstreams and tangents (_gate_pair)
        n_steps, n_batch, n_hidden = shape
        n_in, dtype = x.shape[2], x.dtype
        gates = (n_steps, n_batch, 4 * n_hidden)
        self.norm = LSTMNorm(*map(kernel_array, weights.layer_norm))
        self.t_norm = norm_tangents(tangents.layer_norm, self.norm)
        self.x_hat, self.h_hat, t_zh, t_part = (np.zeros(gates, dtype) for _ in range(4))
        self.rstd = np.empty((2, n_steps, n_batch), dtype)
        projection(x, w[:n_in], None, self.x_hat)
        walk.recurrent_projection(*h_seen, w[n_in:], self.h_hat)
        for z, r in ((self.x_hat, self.rstd[0]), (self.h_hat, self.rstd[1])):
            layer_norm_stats_kernel(flat(z), settings.ln_epsilon, r.reshape(-1))
        self.t_zx = (flat(t_x) @ w[:n_in] + flat(x) @ t_w[:n_in]).reshape(gates)
        walk.recurrent_projection(*t_h_seen, w[n_in:], t_zh)
        walk.recurrent_projection(*h_seen, t_w[n_in:], t_part)
        self.t_zh = t_zh + t_part
        self.fixed = _backward_norm_fixed(self.norm, weights, settings, clip_grad,
                                          kernel_array)
        self.t_peeps = tuple(tangent_or_zeros(t, p)
                             for t, p in zip(_peepholes_of(tangents), self.fixed[:3],
                                             strict=True))
        self.settings, self.mask_clip = settings, _mask_clip(settings, clip_grad)
        peephole = settings.peepholes
        self.sums = [_norm_sums(4 * n_hidden, n_hidden, peephole, dtype) for _ in range(2)]
        self.gates = [np.zeros(gates, dtype) for _ in range(2)]
        self.dz_h = [np.zeros(gates, dtype) for _ in range(2)]

    def __call__(self, t, at, to_h, to_cs, prev_cs):
        """Step t; returns ``(dz_h,t, dz_h,t')``."""
        gates, sums, dz_h, norm = self.gates, self.sums, self.dz_h, self.norm
        np.copyto(dz_h[0][t], self.h_hat[t])            # the kernel writes dz_h over ĥ
        fields = [None if a is None else a[t] for a in self.fields]
        lstm_ln_backward_kernel(*at[0], to_h[0], True, to_cs[0], True,
                                *_fields_arguments(fields[0], prev_cs[0]), *self.fixed,
                                dz_h[0][t], self.rstd[1][t], gates[0][t], prev_cs[0],
                                *sums[0][:7])
        gates[1][t], prev_cs[1][...] = _ln_cell_tangent(at, to_h, to_cs, fields, self)
        _, dz_h[1][t], t_gamma_h, _ = layer_norm_grad_tangent(
            gates[0][t], gates[1][t], norm.gamma_h, self.t_norm.gamma_h, self.h_hat[t],
            self.rstd[1][t][:, None], self.t_zh[t])
        sums[1][6] += t_gamma_h
        return dz_h[0][t], dz_h[1][t]

    def finish(self):
        """After the loop: ``((dz_x, dz_h), (dz_x', dz_h'))`` and the norms' gradients and
        their tangents (``lstm._norm_grads``); the input part's norm every step at once
        (``layer_norm_grad_kernel``, ``layer_norm_grad_tangent``)."""

        dz_x = self.x_hat.copy()
        layer_norm_grad_kernel(flat(self.gates[0]), self.norm.gamma_x, flat(dz_x),
                               self.rstd[0].reshape(-1), self.sums[0][7])
        _, t_dz_x, t_gamma_x, _ = layer_norm_grad_tangent(
            self.gates[0], self.gates[1], self.norm.gamma_x, self.t_norm.gamma_x, self.x_hat,
            self.rstd[0][..., None], self.t_zx)
        self.sums[1][7] += t_gamma_x
        return ((dz_x, self.dz_h[0]), (t_dz_x, self.dz_h[1])), [_norm_grads(s)
                                                               for s in self.sums]


def _ln_cell_tangent(at, to_h, to_cs, fields, cell):
    """The tangent of ``lstm_ln_backward_kernel``'s ``dG`` and ``dcs_prev`` (NumPy), the
    reference's ``lstm_gate_grads`` with its cell norm (``lstm_cell_norm_grad``)
    differentiated, accumulating the tangents of the bias, peephole and cell-norm sums into
    ``cell.sums[1]``; ``at``: the step's ``(cs_prev, i, cs, f, o, ci, co)`` and their
    tangents, ``to_h, to_cs``: the upstream gradients and their tangents, ``fields``: the
    gates' ``[5, B, H]`` and their tangents' (or None twice; ``_gate_terms``). Returns
    ``(dG', dcs_prev')``."""
    (cs_prev, i, cs, f, o, ci, co), (t_prev, t_i, t_cs, t_f, t_o, t_ci, t_co) = at
    (uh, t_uh), (ucs, t_ucs) = to_h, to_cs
    (u_i, u_f, u_o, u_ci, u_co), (tu_i, tu_f, tu_o, tu_ci, tu_co) = _gate_terms(fields)
    wci, wcf, wco, peephole = cell.fixed[:4]
    t_wci, t_wcf, t_wco = cell.t_peeps
    settings, norm, t_norm, sums = cell.settings, cell.norm, cell.t_norm, cell.sums[1]
    normalized = settings.ln_carry == "normalized"
    c_tilde, t_tilde = _candidate((i, cs, f, o, ci), (t_i, t_cs, t_f, t_o, t_ci), cs_prev,
                                  t_prev, settings)
    c_hat, r_c = layer_norm_stats(c_tilde, settings.ln_epsilon)
    s_o = o * (1 - o)
    pre_o, t_pre_o = uh * co + u_o, t_uh * co + uh * t_co + tu_o
    d_o = pre_o * s_o
    t_do = t_pre_o * s_o + pre_o * t_o * (1 - 2 * o)
    pre_co, t_pre_co = uh * o + u_co, t_uh * o + uh * t_o + tu_co
    d_co = pre_co * (1 - co * co)
    t_dco = t_pre_co * (1 - co * co) - 2 * pre_co * co * t_co
    d_carry, t_carry = ucs, t_ucs
    if peephole:
        d_carry, t_carry = ucs + d_o * wco, t_ucs + t_do * wco + d_o * t_wco
    d_n, t_dn = (d_co + d_carry, t_dco + t_carry) if normalized else (d_co, t_dco)
    d_state, t_state, t_gamma_c, _ = layer_norm_grad_tangent(
        d_n, t_dn, norm.gamma_c, t_norm.gamma_c, c_hat, r_c, t_tilde)
    if not normalized:
        d_state, t_state = d_state + d_carry, t_state + t_carry
    if cell.mask_clip < np.inf:
        passes = np.abs(i * ci + f * cs_prev) <= cell.mask_clip
        d_state = np.where(passes, d_state, np.zeros((), d_state.dtype))
        t_state = np.where(passes, t_state, np.zeros((), t_state.dtype))
    s_i, s_f = i * (1 - i), f * (1 - f)
    pre_i, pre_c, pre_f = d_state * ci + u_i, d_state * i + u_ci, d_state * cs_prev + u_f
    d_i, d_f = pre_i * s_i, pre_f * s_f
    t_di = (t_state * ci + d_state * t_ci + tu_i) * s_i + pre_i * t_i * (1 - 2 * i)
    t_dci = (t_state * i + d_state * t_i + tu_ci) * (1 - ci * ci) - 2 * pre_c * ci * t_ci
    t_df = (t_state * cs_prev + d_state * t_prev + tu_f) * s_f + pre_f * t_f * (1 - 2 * f)
    t_d_gates = np.concatenate((t_di, t_dci, t_df, t_do), axis=1)
    t_dcs_prev = t_state * f + d_state * t_f
    sums[0] += t_d_gates.sum(axis=0)
    if peephole:
        t_dcs_prev += t_di * wci + d_i * t_wci + t_df * wcf + d_f * t_wcf
        sums[1] += (t_di * cs_prev + d_i * t_prev).sum(axis=0)
        sums[2] += (t_df * cs_prev + d_f * t_prev).sum(axis=0)
        sums[3] += (t_do * cs + d_o * t_cs).sum(axis=0)
    sums[4] += t_gamma_c
    sums[5] += t_dn.sum(axis=0)
    return t_d_gates, t_dcs_prev


def _gate_terms(fields):
    """The gates' upstreams ``(u_i, u_f, u_o, u_ci, u_co)`` and their tangents' from a step's
    ``[5, B, H]`` pair (``_gate_pair``'s), or zeros (scalars) for ``(None, None)``."""
    if fields[0] is None:
        return (0.0,) * 5, (0.0,) * 5
    return tuple(fields[0]), tuple(fields[1])


def layer_norm_grad_tangent(dy, t_dy, gamma, t_gamma, z_hat, rstd, t_z):
    """The layer norm's backward (``xpmath.layer_norm_grad``) and its tangent,
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

    def step(self, t, ups, seq, t_seq):
        """``(dm_t, t_dm_t)`` from the state gradient and its tangent ``ups``."""
        o, co, t_o, t_co = seq[3][t], seq[5][t], t_seq[3][t], t_seq[5][t]
        np.multiply(o, co, out=self.m[0][t])
        self.m[1][t] = t_o * co + o * t_co
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
