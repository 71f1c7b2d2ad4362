"""Forward mode on the CPU (docs/spec.md §12): a cell's or sequence's primal exactly as the
CPU forward computes it, and its tangent along the inputs' tangents, in the same loop.

The math is the reference's "Forward mode" sections; the plan is the CPU forward's
(``_sequence``) with a tangent beside every value:

- the input part of every step at once: the forward's ``x·W_x (+ b)`` and its tangent
  ``dx·W_x + x·dW_x (+ db)`` as ONE BLAS call over ``[dx, x]·[W_x; dW_x]`` (K = 2I; the
  stacked rows a scratch copy), a term whose tangent is None left out;
- per step: the forward's ``h_seen·W_h`` and the tangent's ``dh_seen·W_h + h_seen·dW_h``,
  again one call on ``[dh_seen, h_seen]`` (just ``dh_seen·W_h`` when ``dW_h`` is None);
- the elementwise step: one fused Numba pass computing the primal and its tangent together
  (the RNN; the reset-before GRU's two passes around its candidate's matmul), or the
  forward's own kernel and then one tangent pass (the reset-after GRU and the LSTM, where
  one fused pass did not vectorize: ``_jvp_kernels``); with a layer norm the LSTM's primal
  is the forward's kernel and its tangent NumPy's.

The masks, zoneout and the rows past their length are linear in the state, so the tangent
takes them exactly as the state does: ``x∘m_in`` and ``dx∘m_in``, ``h_prev∘m_rec`` and
``dh_prev∘m_rec``, ``z∘old + (1-z)∘new`` for both (``zoneout_kernel``), and the stopped
rows zeroed after the loop with the final state (and tangent) gathered at step ``L-1``.

A cell takes the CPU cell's own matmuls (``[x, h_prev]·w``, one BLAS call) and kernels with
the same tangents beside them (``rnn_cell_step``, ``gru_cell_step``, ``lstm_cell_step``; the
layer-normalised LSTM cell is a sequence of one step, whose matmuls are the cell's), so
every result's primal is bitwise the CPU forward's, cell or sequence. Scratch comes from
``_workspace.scratch``; results are fresh arrays; inputs are never written.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._core.plan import flat, masked
from .._core.types import LSTMNorm
from ._gru_kernels import gru_reset_after_kernel
from ._jvp_kernels import (
    gru_candidate_jvp_kernel,
    gru_gates_jvp_kernel,
    gru_reset_after_tangent_kernel,
    lstm_tangent_kernel,
    rnn_jvp_kernel,
)
from ._lstm_kernels import layer_norm_forward_kernel, lstm_forward_kernel, lstm_ln_forward_kernel
from ._sequence import (
    Masks,
    contiguous,
    final_state,
    lengths_of,
    projection,
    running_inputs,
    seen,
    sequence_masks,
    step_outputs,
    zero_stopped,
    zone,
)
from ._workspace import scratch

# --------------------------------------------------------------------------------------
# plumbing


def tangent_or_zeros(tangent, primal):
    """A C-contiguous tangent: ``tangent``, or zeros of ``primal``'s shape and dtype."""
    return np.zeros_like(primal) if tangent is None else contiguous(tangent)


def optional(tangent):
    """A C-contiguous tangent, or None (a zero tangent whose products are left out)."""
    return None if tangent is None else contiguous(tangent)


class Linear(NamedTuple):
    """The tangent of ``a·w`` along ``(da, dw)``: ``da·w + a·dw``, each term left out when
    its tangent is None (``da``: a per-call array; ``w``, ``dw`` fixed for the call).
    ``stacked_w``: ``[w; dw]`` when both terms can be there (one BLAS call, K doubled)."""

    w: np.ndarray
    dw: np.ndarray | None
    stacked_w: np.ndarray | None

    @classmethod
    def of(cls, w, dw):
        w = contiguous(w)
        dw = optional(dw)
        return cls(w, dw, None if dw is None else np.concatenate((w, dw)))

    def stacks(self):
        """Whether ``into`` may stack ``[da, a]`` (both terms can be there)."""
        return self.dw is not None

    def into(self, da, a, out, stack):
        """``out = da·w + a·dw`` (``da`` None: ``a·dw``; both None: zeros); ``stack``: a
        ``[rows, 2K]`` scratch for ``[da, a]`` (read only when both terms are there)."""
        if self.dw is None:
            if da is None:
                out[...] = 0
            else:
                np.matmul(da, self.w, out=out)
        elif da is None:
            np.matmul(a, self.dw, out=out)
        else:
            k = da.shape[1]
            stack[:, :k] = da
            stack[:, k:] = a
            np.matmul(stack, self.stacked_w, out=out)
        return out


def input_tangent(linear, dx, x, d_bias, out, stack):
    """``dx·W_x + x·dW_x (+ db)`` for every step at once into ``out [T, B, N]`` (``stack``:
    a ``[T·B, 2I]`` scratch, or an empty one when ``linear`` needs none)."""
    linear.into(None if dx is None else flat(dx), flat(x), flat(out), stack)
    if d_bias is not None:
        out += d_bias
    return out


def stack_shape(linear, rows):
    """The scratch shape of ``linear``'s stacked operand ``[da, a]`` for ``rows`` rows."""
    return (rows, linear.stacked_w.shape[0]) if linear.stacks() else (0, 0)


def step_pair(t, first, steps):
    """The state (or tangent) a step starts from: ``first`` at step 0, else ``steps[t-1]``."""
    return first if t == 0 else steps[t - 1]


def finish(steps, d_steps, first, d_first, lengths):
    """The final state and tangent (``final_state``), then the stopped rows zeroed."""
    final, d_final = final_state(steps[-1], first, lengths), final_state(d_steps[-1], d_first,
                                                                        lengths)
    zero_stopped((*steps, *d_steps), lengths)
    return final, d_final


class Inputs(NamedTuple):
    """A sequence's inputs as the loops take them: the masked running ``x`` and its tangent
    (None: zero), the lengths and the masks."""

    x: np.ndarray
    dx: np.ndarray | None
    lengths: np.ndarray | None
    masks: Masks


def sequence_inputs(x, dx, settings, width, n_hidden=0):
    """``Inputs`` of a sequence (a cell's settings: no masks or lengths)."""
    x = contiguous(x)
    dx = optional(dx)
    n_steps, n_batch = x.shape[:2]
    lengths = lengths_of(settings.seq_len)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, width, n_hidden)
    def run(a):
        return running_inputs(masked(a, masks.input), lengths)
    return Inputs(run(x), None if dx is None else run(dx), lengths, masks)


# --------------------------------------------------------------------------------------
# RNN


def rnn_jvp(x, dx, h0, dh0, weights, tangent_w, settings, relu):
    """The RNN sequence ``x [T, B, I]`` from ``h0`` and its tangent: ``(h, h_final, dh,
    dh_final)`` (``tangent_w = (dw, db)``).

    Per step: ``h_seen·W_h`` and ``[dh_seen, h_seen]·[W_h; dW_h]`` (BLAS), then
    ``rnn_jvp_kernel`` with the step's slices of ``x·W_x + b`` and its tangent, writing
    ``h[t], dh[t]``; zoneout on both (``zone``)."""
    h0, w, b = (contiguous(a) for a in (h0, weights.w, weights.b))
    dw, db = tangent_w
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    inputs = sequence_inputs(x, dx, settings, n_hidden)
    x, dx, lengths, masks = inputs
    n_steps, dtype = x.shape[0], x.dtype
    dh0, db = tangent_or_zeros(dh0, h0), tangent_or_zeros(db, b)
    lin_x = Linear.of(w[:n_in], None if dw is None else dw[:n_in])
    lin_h = Linear.of(w[n_in:], None if dw is None else dw[n_in:])
    state, steps = (n_batch, n_hidden), (n_steps, n_batch, n_hidden)
    x_z, dx_z, x_stack, h_z, dh_z, h_seen, dh_seen, h_stack = scratch(
        dtype, steps, steps, stack_shape(lin_x, n_steps * n_batch), state, state, state, state,
        stack_shape(lin_h, n_batch))
    projection(x, lin_x.w, b, x_z)
    input_tangent(lin_x, dx, x, db, dx_z, x_stack)
    h, dh = step_outputs(2, steps, dtype)
    for t in range(n_steps):
        h_prev, dh_prev = step_pair(t, h0, h), step_pair(t, dh0, dh)
        h_read = seen(h_prev, masks.recurrent, h_seen)
        dh_read = seen(dh_prev, masks.recurrent, dh_seen)
        np.matmul(h_read, lin_h.w, out=h_z)
        lin_h.into(dh_read, h_read, dh_z, h_stack)
        rnn_jvp_kernel(h_z, x_z[t], dh_z, dx_z[t], relu, h[t], dh[t])
        zone(masks.zoneout_h, t, h_prev, h[t])
        zone(masks.zoneout_h, t, dh_prev, dh[t])
    final, d_final = finish((h,), (dh,), h0, dh0, lengths)
    return h, final, dh, d_final


# --------------------------------------------------------------------------------------
# GRU


class _GRUStep(NamedTuple):
    """A GRU sequence's per-step scratch (``_workspace.scratch``), all ``[B, ·]``."""

    g_ru: np.ndarray         # [B, 2H] h_seen·W_ruh
    dg_ru: np.ndarray        # [B, 2H] its tangent
    g_c: np.ndarray          # [B, H]  h_seen·W_ch (reset after) or (r∘h_seen)·W_ch
    dg_c: np.ndarray         # [B, H]  its tangent
    h_seen: np.ndarray       # [B, H]  h_prev∘m_rec
    dh_seen: np.ndarray      # [B, H]
    rh: np.ndarray           # [B, H]  reset before: r∘h_seen
    d_rh: np.ndarray         # [B, H]
    stack_ru: np.ndarray     # [B, 2H] [dh_seen, h_seen] for W_ruh (when dW_ru is given)
    stack_c: np.ndarray      # [B, 2H] [dh_seen, h_seen] or [d_rh, rh] for W_ch


def gru_jvp(x, dx, h0, dh0, weights, tangent_w, settings, reset_after):
    """The GRU sequence ``x [T, B, I]`` from ``h0`` and its tangent: ``(outs, d_outs)``,
    each ``(r, u, c, h [T, B, H], h_final)`` (``tangent_w = (dw_ru, dw_c, db_ru, db_c)``).

    The forward's plan (``gru.gru_sequence``): reset before, per step ``h_seen·W_ruh`` ->
    ``gru_gates_jvp_kernel`` -> ``(r∘h_seen)·W_ch`` -> ``gru_candidate_jvp_kernel``; reset
    after, ``h_seen·W_ruh`` and ``h_seen·W_ch`` -> ``gru_reset_after_jvp_kernel``; each
    matmul's tangent one stacked BLAS call beside it (``Linear``)."""
    h0, b_ru, b_c = (contiguous(a) for a in (h0, weights.b_ru, weights.b_c))
    dw_ru, dw_c, db_ru, db_c = tangent_w
    n_in, (n_batch, n_hidden) = x.shape[2], h0.shape
    x, dx, lengths, masks = sequence_inputs(x, dx, settings, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    dh0, db_ru, db_c = (tangent_or_zeros(t, p) for t, p in ((dh0, h0), (db_ru, b_ru),
                                                             (db_c, b_c)))
    lin = [Linear.of(w[rows], None if dw is None else dw[rows])
           for w, dw in ((weights.w_ru, dw_ru), (weights.w_c, dw_c))
           for rows in (slice(None, n_in), slice(n_in, None))]
    lin_rux, lin_ruh, lin_cx, lin_ch = lin
    ru, c_steps, state = (n_steps, n_batch, 2 * n_hidden), (n_steps, n_batch, n_hidden), (
        n_batch, n_hidden)
    buffers = scratch(dtype, ru, ru, c_steps, c_steps,
                      (0, 0) if not (lin_rux.stacks() or lin_cx.stacks())
                      else (n_steps * n_batch, 2 * n_in),
                      (n_batch, 2 * n_hidden), (n_batch, 2 * n_hidden), *[state] * 6,
                      stack_shape(lin_ruh, n_batch), stack_shape(lin_ch, n_batch))
    x_ru, dx_ru, x_c, dx_c, x_stack = buffers[:5]
    step = _GRUStep(*buffers[5:])
    b_cx = None if reset_after else b_c
    projection(x, lin_rux.w, b_ru, x_ru)
    projection(x, lin_cx.w, b_cx, x_c)
    input_tangent(lin_rux, dx, x, db_ru, dx_ru, x_stack)
    input_tangent(lin_cx, dx, x, db_c[:n_hidden] if reset_after else db_c, dx_c, x_stack)
    outs, d_outs = step_outputs(4, c_steps, dtype), step_outputs(4, c_steps, dtype)
    projections = (x_ru, dx_ru, x_c, dx_c)
    biases = (b_c[:n_hidden], b_c[n_hidden:], db_c[:n_hidden], db_c[n_hidden:])
    for t in range(n_steps):
        h_prev, dh_prev = step_pair(t, h0, outs[3]), step_pair(t, dh0, d_outs[3])
        h_read = seen(h_prev, masks.recurrent, step.h_seen)
        dh_read = seen(dh_prev, masks.recurrent, step.dh_seen)
        np.matmul(h_read, lin_ruh.w, out=step.g_ru)
        lin_ruh.into(dh_read, h_read, step.dg_ru, step.stack_ru)
        at = tuple(a[t] for a in projections)
        new = tuple(a[t] for a in outs), tuple(a[t] for a in d_outs)
        if reset_after:
            _reset_after_step(step, lin_ch, at, biases, (h_prev, dh_prev, h_read, dh_read),
                              new)
        else:
            _reset_before_step(step, lin_ch, at, (h_prev, dh_prev, h_read, dh_read), new)
        zone(masks.zoneout_h, t, h_prev, outs[3][t])
        zone(masks.zoneout_h, t, dh_prev, d_outs[3][t])
    final, d_final = finish(outs, d_outs, h0, dh0, lengths)
    return (*outs, final), (*d_outs, d_final)


def _reset_after_step(step, lin_ch, at, biases, states, new):
    """A reset-after step: ``h_seen·W_ch`` and its tangent, the forward's
    ``gru_reset_after_kernel``, then the tangent's pass into the step's outputs
    ``new = ((r, u, c, h), (dr, du, dc, dh))`` (``dx_c`` holds ``db_cx`` already)."""
    x_ru, dx_ru, x_c, dx_c = at
    b_cx, b_ch, _, db_ch = biases
    h_prev, dh_prev, h_read, dh_read = states
    np.matmul(h_read, lin_ch.w, out=step.g_c)
    lin_ch.into(dh_read, h_read, step.dg_c, step.stack_c)
    gru_reset_after_kernel(step.g_ru, x_ru, x_c, b_cx, step.g_c, b_ch, h_prev, *new[0])
    np.add(step.dg_ru, dx_ru, out=step.dg_ru)
    np.add(step.dg_c, db_ch, out=step.dg_c)
    gru_reset_after_tangent_kernel(step.dg_ru, dx_c, step.dg_c, step.g_c, b_ch, *new[0][:3],
                                   h_prev, dh_prev, *new[1])


def _reset_before_step(step, lin_ch, at, states, new):
    """A reset-before step: the gates' pass, ``(r∘h_seen)·W_ch`` and its tangent, then the
    candidate's pass into ``new = ((r, u, c, h), (dr, du, dc, dh))``."""
    x_ru, dx_ru, x_c, dx_c = at
    h_prev, dh_prev, h_read, dh_read = states
    (r, u, c, h), (dr, du, dc, dh) = new
    gru_gates_jvp_kernel(step.g_ru, x_ru, step.dg_ru, dx_ru, h_read, dh_read,
                         (r, u, step.rh), (dr, du, step.d_rh))
    np.matmul(step.rh, lin_ch.w, out=step.g_c)
    lin_ch.into(step.d_rh, step.rh, step.dg_c, step.stack_c)
    gru_candidate_jvp_kernel(step.g_c, x_c, step.dg_c, dx_c, h_prev, dh_prev, u, du, (c, h),
                             (dc, dh))


# --------------------------------------------------------------------------------------
# LSTM


class _LSTMStep(NamedTuple):
    """An LSTM sequence's per-step scratch (``_workspace.scratch``)."""

    h_g: np.ndarray          # [B, 4H] h_seen·W_h
    dh_g: np.ndarray         # [B, 4H] its tangent
    h_seen: np.ndarray       # [B, P]  h_prev∘m_rec
    dh_seen: np.ndarray      # [B, P]
    h_stack: np.ndarray      # [B, 2P] [dh_seen, h_seen] (when dW_h is given)
    m: np.ndarray            # [B, H]  o∘co before the projection (or [B, 0])
    dm: np.ndarray           # [B, H]
    m_stack: np.ndarray      # [B, 2H] [dm, m] (when dw_proj is given)


def lstm_jvp(x, dx, states, d_states, weights, t_w, settings):
    """The LSTM sequence ``x [T, B, I]`` from ``states = (cs0, h0)`` and its tangent:
    ``(outs, d_outs)``, each ``(i, cs, f, o, ci, co, h [T, B, ·], cs_final, h_final)``
    (a cell's settings have no masks or lengths; ``t_w``: the tangents of ``weights``).

    The forward's plan (``lstm.lstm_sequence``): the input part ``x·W_x + b`` (with a layer
    norm ``LN(x·W_x) + b``) for all steps, per step ``h_seen·W_h`` and the step's pass, then
    the projection ``clip(m·w_proj)``; each matmul's tangent one stacked BLAS call beside it.
    The primal's pass is the forward's kernel; the tangent's is ``lstm_tangent_kernel``
    (with a layer norm NumPy's, ``_ln_step_tangent``)."""
    (cs0, h0), (dcs0, dh0) = (contiguous(a) for a in states), d_states
    dw, db, dwci, dwcf, dwco, dw_proj, d_norm = t_w
    n_in, (n_batch, n_hidden), n_state = x.shape[2], cs0.shape, h0.shape[1]
    x, dx, lengths, masks = sequence_inputs(x, dx, settings, n_state, n_hidden)
    n_steps, dtype = x.shape[0], x.dtype
    dcs0, dh0 = tangent_or_zeros(dcs0, cs0), tangent_or_zeros(dh0, h0)
    w = contiguous(weights.w)
    lin_x = Linear.of(w[:n_in], None if dw is None else dw[:n_in])
    lin_h = Linear.of(w[n_in:], None if dw is None else dw[n_in:])
    projected = weights.w_proj is not None
    lin_p = Linear.of(weights.w_proj, dw_proj) if projected else None
    gates, steps = (n_steps, n_batch, 4 * n_hidden), (n_steps, n_batch, n_hidden)
    m_shape = (n_batch, n_hidden if projected else 0)
    buffers = scratch(dtype, gates, gates, stack_shape(lin_x, n_steps * n_batch),
                      (n_batch, 4 * n_hidden), (n_batch, 4 * n_hidden), (n_batch, n_state),
                      (n_batch, n_state), stack_shape(lin_h, n_batch), m_shape, m_shape,
                      stack_shape(lin_p, n_batch) if projected else (0, 0))
    x_g, dx_g, x_stack = buffers[:3]
    step = _LSTMStep(*buffers[3:])
    _lstm_input_part(x, dx, weights, (lin_x, db, d_norm), settings, (x_g, dx_g, x_stack))
    outs, d_outs = _lstm_outputs(steps, n_state, dtype), _lstm_outputs(steps, n_state, dtype)
    run_step = _lstm_step_pass(weights, t_w, settings)
    for t in range(n_steps):
        cs_prev, h_prev = step_pair(t, cs0, outs[1]), step_pair(t, h0, outs[6])
        dcs_prev, dh_prev = step_pair(t, dcs0, d_outs[1]), step_pair(t, dh0, d_outs[6])
        h_read = seen(h_prev, masks.recurrent, step.h_seen)
        dh_read = seen(dh_prev, masks.recurrent, step.dh_seen)
        np.matmul(h_read, lin_h.w, out=step.h_g)
        lin_h.into(dh_read, h_read, step.dh_g, step.h_stack)
        new = [a[t] for a in outs], [a[t] for a in d_outs]
        final_h = new[0][6], new[1][6]
        if projected:
            new[0][6], new[1][6] = step.m, step.dm
        run_step(step.h_g, x_g[t], step.dh_g, dx_g[t], (cs_prev, dcs_prev), new)
        if projected:
            _project_jvp(lin_p, step, settings.proj_clip, final_h)
        for k, (old, d_old) in ((1, (cs_prev, dcs_prev)), (6, (h_prev, dh_prev))):
            zoneout = masks.zoneout_cs if k == 1 else masks.zoneout_h
            zone(zoneout, t, old, outs[k][t])
            zone(zoneout, t, d_old, d_outs[k][t])
    finals = [final_state(outs[k], first, lengths) for k, first in ((1, cs0), (6, h0))]
    d_finals = [final_state(d_outs[k], first, lengths) for k, first in ((1, dcs0), (6, dh0))]
    zero_stopped((*outs, *d_outs), lengths)
    return (*outs, *finals), (*d_outs, *d_finals)


def _lstm_outputs(steps, n_state, dtype):
    """A sequence's seven per-step outputs ``(i, cs, f, o, ci, co [T, B, H], h [T, B, P])``."""
    return [*step_outputs(6, steps, dtype), np.empty((*steps[:2], n_state), dtype)]


def _lstm_input_part(x, dx, weights, tangent, settings, buffers):
    """Every step's input part into ``buffers = (x_g, dx_g, stack)``: the forward's
    ``x·W_x + b`` (or ``LN(x·W_x) + b``, ``layer_norm_forward_kernel`` in place) and its
    tangent ``dx·W_x + x·dW_x + db`` (or ``dLN(x·W_x) + db``); ``tangent = (lin_x, db,
    d_norm)``."""
    lin_x, db, d_norm = tangent
    x_g, dx_g, stack = buffers
    b = contiguous(weights.b)
    norm = weights.layer_norm
    if norm is None:
        projection(x, lin_x.w, b, x_g)
        input_tangent(lin_x, dx, x, db, dx_g, stack)
        return
    norm = LSTMNorm(*map(contiguous, norm))
    d_norm = norm_tangents(d_norm, norm)
    projection(x, lin_x.w, None, x_g)
    input_tangent(lin_x, dx, x, None, dx_g, stack)
    dx_g[...] = layer_norm_tangent(x_g, dx_g, norm.gamma_x, d_norm.gamma_x, d_norm.beta_x,
                                   settings.ln_epsilon)
    if db is not None:
        dx_g += db
    layer_norm_forward_kernel(flat(x_g), norm.gamma_x, norm.beta_x, b, settings.ln_epsilon)


def norm_tangents(d_norm, norm):
    """The layer norm's tangents as an ``LSTMNorm`` with every None a zero array."""
    d_norm = d_norm if d_norm is not None else LSTMNorm(*(None,) * len(norm))
    return LSTMNorm(*(tangent_or_zeros(d, p) for d, p in zip(d_norm, norm)))


def layer_norm_stats(z, epsilon):
    """``(ẑ, r)`` of ``z`` over its last axis (biased variance, the reference's formula)."""
    n = max(z.shape[-1], 1)
    centred = z - z.sum(axis=-1, keepdims=True) / n
    rstd = 1 / np.sqrt((centred * centred).sum(axis=-1, keepdims=True) / n + epsilon)
    return centred * rstd, rstd


def layer_norm_tangent(z, dz, gamma, d_gamma, d_beta, epsilon):
    """The tangent of ``LN(z; γ, β)``: ``dγ∘ẑ + γ∘r·(dz - mean(dz) - ẑ∘mean(ẑ∘dz)) + dβ``
    (``_common.layer_norm_jvp``'s)."""
    z_hat, rstd = layer_norm_stats(z, epsilon)
    n = max(z.shape[-1], 1)
    d_hat = rstd * (dz - dz.sum(axis=-1, keepdims=True) / n
                    - z_hat * (z_hat * dz).sum(axis=-1, keepdims=True) / n)
    return d_gamma * z_hat + gamma * d_hat + d_beta


def _lstm_step_pass(weights, t_w, settings):
    """The step's elementwise pass as ``run(h_g, x_g, dh_g, dx_g, (cs_prev, dcs_prev),
    (outs, d_outs))``, its fixed arguments bound (the bias stands in for absent peepholes
    and their tangents: never read)."""
    b = contiguous(weights.b)
    peephole = settings.peepholes
    peeps = tuple(contiguous(a) for a in weights[2:5]) if peephole else (b, b, b)
    d_peeps = (tuple(tangent_or_zeros(d, p) for d, p in zip(t_w[2:5], peeps)) if peephole
               else (b, b, b))
    clip = math.inf if settings.cell_clip is None else settings.cell_clip
    if weights.layer_norm is None:
        fixed = (*peeps, peephole, settings.forget_bias, clip)
        options = (peephole, clip, settings.cell_clip is not None)

        def run(h_g, x_g, dh_g, dx_g, cs, new):
            lstm_forward_kernel(h_g, x_g, cs[0], *fixed, *new[0])
            dh_g += dx_g
            lstm_tangent_kernel(dh_g, cs[0], cs[1], peeps, d_peeps, options,
                                tuple(new[0][:6]), tuple(new[1]))
        return run
    norm = LSTMNorm(*map(contiguous, weights.layer_norm))
    d_norm = norm_tangents(t_w[6], norm)
    fixed = (norm.gamma_h, norm.beta_h, norm.gamma_c, norm.beta_c, settings.ln_epsilon,
             settings.ln_carry == "normalized", *peeps, peephole, settings.forget_bias, clip)

    def run_norm(h_g, x_g, dh_g, dx_g, cs, new):
        lstm_ln_forward_kernel(h_g, x_g, cs[0], *fixed, *new[0])
        _ln_step_tangent(h_g, dh_g, dx_g, cs, new, (norm, d_norm, peeps, d_peeps, peephole),
                         settings)
    return run_norm


def _ln_step_tangent(z_h, dz_h, dx_g, cs, new, fixed, settings):
    """The layer-normalised step's tangent (NumPy; the reference's
    ``lstm_gates_jvp``/``lstm_activations_jvp``) into ``new[1]``, from the primal the
    kernel wrote (``new[0]``), ``z_h = h_seen·W_h``, its tangent and the input part's."""
    norm, d_norm, (wci, wcf, wco), (dwci, dwcf, dwco), peephole = fixed
    cs_prev, dcs_prev = cs
    i, cs_new, f, o, ci, co, _ = new[0]
    n_hidden, eps = cs_prev.shape[1], settings.ln_epsilon
    d_g = layer_norm_tangent(z_h, dz_h, norm.gamma_h, d_norm.gamma_h, d_norm.beta_h, eps)
    d_g += dx_g
    dgi, dgc, dgf, dgo = (d_g[:, k * n_hidden:(k + 1) * n_hidden] for k in range(4))
    if peephole:
        dgi = dgi + dcs_prev * wci + cs_prev * dwci
        dgf = dgf + dcs_prev * wcf + cs_prev * dwcf
    di, dci, df = i * (1 - i) * dgi, (1 - ci * ci) * dgc, f * (1 - f) * dgf
    d_tilde = di * ci + i * dci + df * cs_prev + f * dcs_prev
    raw = i * ci + f * cs_prev
    c_tilde = raw
    if settings.cell_clip is not None:
        d_tilde = np.where(np.abs(raw) <= settings.cell_clip, d_tilde,
                           np.zeros((), d_tilde.dtype))
        c_tilde = np.clip(raw, -settings.cell_clip, settings.cell_clip)
    d_n = layer_norm_tangent(c_tilde, d_tilde, norm.gamma_c, d_norm.gamma_c, d_norm.beta_c,
                             eps)
    d_cs = d_n if settings.ln_carry == "normalized" else d_tilde
    dco = (1 - co * co) * d_n
    if peephole:
        dgo = dgo + d_cs * wco + cs_new * dwco
    do = o * (1 - o) * dgo
    for out, value in zip(new[1], (di, d_cs, df, do, dci, dco, do * co + o * dco)):
        out[...] = value


def _project_jvp(lin_p, step, proj_clip, out):
    """The projection and its tangent: ``h = clip(m·w_proj)`` (the forward's: BLAS, then
    the clip in place) and ``dh = dm·w_proj + m·dw_proj``, zero where the clip is active
    (the boundary passes), into ``out = (h, dh)``."""
    h, dh = out
    np.matmul(step.m, lin_p.w, out=h)
    lin_p.into(step.dm, step.m, dh, step.m_stack)
    if proj_clip is not None:
        np.copyto(dh, 0, where=~(np.abs(h) <= proj_clip))
        np.clip(h, -proj_clip, proj_clip, out=h)


# --------------------------------------------------------------------------------------
# cells whose forward is one matmul on [x, h_prev]: the primal exactly as the cell's


def cell_gates(x, h_prev, w, tangent):
    """``[x, h_prev]·w`` as the CPU cell computes it (``np.dot``) and its tangent
    ``[dx, dh_prev]·w + [x, h_prev]·dw`` (one stacked BLAS call; ``tangent = (dx, dh_prev,
    dw)``, None fields zero)."""
    dx, dh_prev, dw = tangent
    xh = np.concatenate((x, h_prev), axis=1)
    gates = np.dot(xh, w)
    d_xh = np.concatenate((tangent_or_zeros(dx, x), tangent_or_zeros(dh_prev, h_prev)), axis=1)
    linear = Linear.of(w, dw)
    stack = np.empty(stack_shape(linear, xh.shape[0]), gates.dtype)
    return gates, linear.into(d_xh, xh, np.empty_like(gates), stack)


def rnn_cell_step(x, h_prev, weights, tangents, relu):
    """The RNN cell and its tangent, the primal exactly as ``rnn.rnn_cell``'s:
    ``(h, dh)``."""
    gates, d_gates = cell_gates(x, h_prev, weights.w, (tangents.x, tangents.h_prev,
                                                        tangents.w))
    b = contiguous(weights.b)
    h, dh = np.empty_like(gates), np.empty_like(gates)
    rnn_jvp_kernel(gates, b, d_gates, tangent_or_zeros(tangents.b, b), relu, h, dh)
    return h, dh


def lstm_cell_step(x, cs_prev, h_prev, weights, tangents, settings):
    """The LSTM cell without a layer norm and its tangent, the primal exactly as
    ``lstm.lstm_cell``'s (``lstm_forward_kernel`` on ``[x, h_prev]·w``, then the
    projection): ``(outs, d_outs)``, each the seven ``LSTMCellState`` fields."""
    gates, d_gates = cell_gates(x, h_prev, weights.w, (tangents.x, tangents.h_prev,
                                                        tangents.w))
    b = contiguous(weights.b)
    n_batch, n_hidden = cs_prev.shape
    cs_prev = contiguous(cs_prev)
    outs = [np.empty((n_batch, n_hidden), gates.dtype) for _ in range(7)]
    d_outs = [np.empty_like(a) for a in outs]
    run = _lstm_step_pass(weights, tangents[3:], settings)
    run(gates, b, d_gates, tangent_or_zeros(tangents.b, b),    # the bias as the addend
        (cs_prev, tangent_or_zeros(tangents.cs_prev, cs_prev)), (outs, d_outs))
    if weights.w_proj is not None:
        lin_p = Linear.of(weights.w_proj, tangents.w_proj)
        m, dm = outs[6], d_outs[6]
        step = _LSTMStep(*(None,) * 5, m, dm, np.empty(stack_shape(lin_p, n_batch), m.dtype))
        outs[6] = np.empty((n_batch, lin_p.w.shape[1]), m.dtype)
        d_outs[6] = np.empty_like(outs[6])
        _project_jvp(lin_p, step, settings.proj_clip, (outs[6], d_outs[6]))
    return outs, d_outs


def gru_cell_step(x, h_prev, weights, tangents, reset_after):
    """The GRU cell and its tangent, the primal exactly as ``gru.gru_cell``'s (its matmuls
    and kernels, ``[x, h_prev]·w_ru`` first): ``(outs, d_outs)``, each ``(r, u, c, h)``."""
    w_ru, w_c, b_ru, b_c = weights
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    x, h_prev = contiguous(x), contiguous(h_prev)
    dx, dh_prev = tangents.x, tangent_or_zeros(tangents.h_prev, h_prev)
    dw_c = tangents.w_c
    b_ru, b_c = contiguous(b_ru), contiguous(b_c)
    db_ru, db_c = tangent_or_zeros(tangents.b_ru, b_ru), tangent_or_zeros(tangents.b_c, b_c)
    gates_ru, d_ru = cell_gates(x, h_prev, w_ru, (dx, tangents.h_prev, tangents.w_ru))
    outs = [np.empty((n_batch, n_hidden), gates_ru.dtype) for _ in range(4)]
    d_outs = [np.empty_like(a) for a in outs]
    if reset_after:
        g_cx, g_ch = np.dot(x, w_c[:n_in]), np.dot(h_prev, w_c[n_in:])
        dg_cx = _cell_linear(w_c[:n_in], None if dw_c is None else dw_c[:n_in], dx, x)
        dg_ch = _cell_linear(w_c[n_in:], None if dw_c is None else dw_c[n_in:], dh_prev,
                             h_prev)
        gru_reset_after_kernel(gates_ru, b_ru, g_cx, b_c[:n_hidden], g_ch, b_c[n_hidden:],
                               h_prev, *outs)
        d_ru += db_ru
        dg_cx += db_c[:n_hidden]
        dg_ch += db_c[n_hidden:]
        gru_reset_after_tangent_kernel(d_ru, dg_cx, dg_ch, g_ch, b_c[n_hidden:], *outs[:3],
                                       h_prev, dh_prev, *d_outs)
        return outs, d_outs
    (r, u, c, h), (dr, du, dc, dh) = outs, d_outs
    rh, d_rh = np.empty_like(h_prev), np.empty_like(h_prev)
    gru_gates_jvp_kernel(gates_ru, b_ru, d_ru, db_ru, h_prev, dh_prev, (r, u, rh), (dr, du, d_rh))
    xrh = np.concatenate((x, rh), axis=1)
    d_xrh = np.concatenate((tangent_or_zeros(dx, x), d_rh), axis=1)
    gates_c = np.dot(xrh, w_c)
    d_gates_c = _cell_linear(w_c, dw_c, d_xrh, xrh)
    gru_candidate_jvp_kernel(gates_c, b_c, d_gates_c, db_c, h_prev, dh_prev, u, du, (c, h),
                             (dc, dh))
    return outs, d_outs


def _cell_linear(w, dw, da, a):
    """``da·w + a·dw`` for one cell step (``Linear``), a fresh array."""
    linear = Linear.of(w, dw)
    out = np.empty((a.shape[0], linear.w.shape[1]), a.dtype)
    return linear.into(da, a, out, np.empty(stack_shape(linear, a.shape[0]), a.dtype))
