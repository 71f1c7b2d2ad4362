"""The second order on the CPU (docs/spec.md §12): a gradient op and its tangent, the JVP
of the gradient in all its array inputs, in the same backward loop.

The math is ``gradcells.reference``'s ``*_grad_jvp`` (the hand-derived gradient on dual
numbers); the plan is the CPU gradient's (``_sequence``) with a tangent beside every value:

- the saved result's tangent first, from this backend's own fused ``*_sequence_jvp``
  plumbing (``_jvp``);
- per step (``Walk.back_times()``): the cell's backward kernel for the gate gradients
  ``dZ_t`` (the primal, as the CPU gradient computes it) and one fused Numba pass for their
  tangents ``dZ'_t`` (``_grad_jvp_kernels``); then the carry ``dZ_t·W_hᵀ`` and its tangent
  ``dZ'_t·W_hᵀ + dZ_t·W_h'ᵀ`` (BLAS);
- after the loop ``dx``, ``dW`` and their tangents over all ``T·B`` rows: by the product
  rule ``input_and_weight_grads`` on ``(x, W, dZ')`` plus on ``(x', W', dZ)``.

The masks, zoneout's split and the rows past their length are linear in the state
gradient, so its tangent takes them exactly as the gradient does (``upstream``,
``zoneout_split``, ``finish_state_grad``, ``masked_input_grad`` on the tangent arrays).
Branches follow the primals: a clip's mask (``clip_grad="exact"``) zeroes the tangent where
it zeroes the gradient; ``"straight_through"`` masks neither. Results are fresh arrays;
inputs are never written.
"""

from __future__ import annotations

import numpy as np

from .._core.plan import flat
from .._core.types import LSTMSequenceGrads
from ._compile import kernel_array
from ._grad_jvp_kernels import lstm_backward_tangent_kernel
from ._jvp import lstm_jvp, sequence_inputs, step_pair, tangent_or_zeros
from ._lstm_kernels import lstm_backward_kernel
from ._sequence import (
    Walk,
    finish_state_grad,
    initial_carry,
    input_and_weight_grads,
    masked_input_grad,
    seen_states,
    stopped_rows,
    upstream,
    zoneout_split,
)


def product_grads(walk, primal, tangent, d_parts):
    """``(dx, dw)`` and their tangents from the gradients of the matmuls' outputs:
    ``primal = (x, h0_seen, w, h_seen)`` and ``tangent`` its tangents (arrays),
    ``d_parts = (dZ, dZ')``; the tangents by the product rule, ``input_and_weight_grads``
    on ``(x, W, dZ')`` plus on ``(x', W', dZ)``."""
    d_z, t_z = d_parts
    dx, dw = input_and_weight_grads(walk, *primal, d_z)
    tx, tw = input_and_weight_grads(walk, *primal, t_z)
    tx2, tw2 = input_and_weight_grads(walk, *tangent, d_z)
    return (dx, dw), (tx + tx2, tw + tw2)


def state_step(zoneout, t, carried, d_steps, stopped, buffers):
    """The gradient of step t's new state (``upstream``) split by zoneout
    (``zoneout_split``): ``(to the step's kernel, to the old state or None)``; ``buffers``:
    two ``[B, N]`` scratch arrays."""
    total = upstream(carried, d_steps, t, buffers[0], stopped)
    return zoneout_split(zoneout, t, total, buffers[0], buffers[1])


# ---- LSTM


def lstm_grad_jvp(x, states, weights, seq, tangents, settings, upstreams, clip_grad):
    """``lstm_sequence_grad`` and its tangent: ``(grads, grads_tangent)``, each an
    ``LSTMSequenceGrads`` (``states = (cs0, h0)``; ``upstreams``: ``(gradient, tangent)``
    pairs for ``d_h, d_cs, d_h_final, d_cs_final``, None fields zero). Without a layer norm
    (``lstm.py`` hands those to the reference).

    The result's tangent from ``_jvp.lstm_jvp``; then ``lstm_sequence_grad``'s loop
    (``_lstm_backward``) with ``lstm_backward_tangent_kernel`` beside
    ``lstm_backward_kernel``, and ``product_grads``."""
    cs0, h0 = (kernel_array(a) for a in states)
    n_hidden, n_state = cs0.shape[1], h0.shape[1]
    d_seq = lstm_jvp(x, tangents.x, (cs0, h0), (tangents.cs0, tangents.h0), weights,
                     tangents[3:], settings)[1]
    x, dx, lengths, masks = sequence_inputs(x, tangents.x, settings, n_state, n_hidden)
    walk = Walk(x.shape[0], lengths, False)
    w = kernel_array(weights.w)
    t_w = tangent_or_zeros(tangents.w, w)
    firsts = (cs0, tangent_or_zeros(tangents.cs0, cs0))
    saved = _own_cells(firsts, tuple(map(kernel_array, seq[:7])), d_seq[:7], weights, settings,
                       masks)
    (d_gates, t_gates), carries, sums, proj = _lstm_backward(
        x.shape[2], firsts, saved, (w, t_w), weights, tangents, settings, upstreams,
        (lengths, masks), clip_grad)
    h_steps = seen_states(h0, saved[0][6], masks.recurrent), seen_states(
        tangent_or_zeros(tangents.h0, h0), saved[1][6], masks.recurrent)
    (gx, gw), (tx, tw) = product_grads(
        walk, (x, *h_steps[0][:1], w, h_steps[0][1]),
        (np.zeros_like(x) if dx is None else dx, h_steps[1][0], t_w, h_steps[1][1]),
        (d_gates, t_gates))
    results = []
    for k, (g_x, g_w) in enumerate(((gx, gw), (tx, tw))):
        peeps = sums[k][1:] if settings.peepholes else (None, None, None)
        results.append(LSTMSequenceGrads(
            x=masked_input_grad(g_x, masks.input), cs0=carries[k][0], h0=carries[k][1],
            w=g_w, b=sums[k][0], wci=peeps[0], wcf=peeps[1], wco=peeps[2],
            w_proj=None if proj is None else proj[k], layer_norm=None))
    return tuple(results)


def _own_cells(firsts, seq, d_seq, weights, settings, masks):
    """``(saved, d_saved)``: the saved steps and their tangents with every step's own cell
    state (before zoneout mixed it with the old one) in place of the saved one, as the
    gradient reads them (``lstm._unzoned_cells``), and the saved (zoned) cell state after
    them, the next step's ``cs_prev``; the tangent ``c̃' = i'∘ci + i∘ci' +
    f'∘cs_prev + f∘cs_prev'``, zero where the clip is active (the boundary passes)."""
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
    d_tilde = di * ci + i * dci + df * cs_prev + f * dcs_prev
    if settings.cell_clip is not None:
        passes = np.abs(i * ci + f * cs_prev) <= settings.cell_clip
        d_tilde = np.where(passes, d_tilde, np.zeros((), d_tilde.dtype))
    return (*own, cs), (di, d_tilde, *d_seq[2:], d_seq[1])


def _lstm_backward(n_in, firsts, saved, w_pair, weights, tangents, settings, upstreams,
                   running, clip_grad):
    """``lstm_sequence_grad``'s backward loop (``lstm._backward_steps``) with a tangent
    beside every value. Returns ``((dG, dG'), carries, sums, proj)``: every step's gate
    gradients and their tangents ``[T, B, 4H]``, the state gradients before step 0 and
    their tangents ``((dcs0, dh0), (dcs0', dh0'))``, the kernels' sums ``(db, dwci, dwcf,
    dwco)`` and their tangents, and ``(dw_proj, dw_proj')`` (None without a projection).

    Per step t, back from the final states: ``state_step`` for both states' gradients
    and their tangents; the projection's backward and its tangent (``_projection_jvp``);
    ``lstm_backward_kernel`` and ``lstm_backward_tangent_kernel``; the carries
    ``dG_t·W_hᵀ`` and ``dG'_t·W_hᵀ + dG_t·W_h'ᵀ`` (BLAS) through ``finish_state_grad``;
    stopped rows keep their state gradients and tangents."""
    from .lstm import _mask_clip, _peepholes

    (seq, d_seq), (lengths, masks), (w, t_w) = saved, running, w_pair
    n_steps, n_batch, n_hidden = seq[0].shape
    n_state, dtype = seq[6].shape[2], seq[0].dtype
    (d_h, t_h), (d_cs, t_cs), (d_hf, t_hf), (d_csf, t_csf) = (
        tuple(None if a is None else kernel_array(a) for a in pair) for pair in upstreams)
    carry_h = [initial_carry(a, (n_batch, n_state), dtype) for a in (d_hf, t_hf)]
    carry_cs = [initial_carry(a, (n_batch, n_hidden), dtype) for a in (d_csf, t_csf)]
    gates = [np.zeros((n_steps, n_batch, 4 * n_hidden), dtype) for _ in range(2)]
    w_h_t, t_w_h_t = (np.ascontiguousarray(a[n_in:].T) for a in (w, t_w))
    *peeps, peephole = _peepholes(weights, settings, kernel_array)
    d_peeps = (tuple(tangent_or_zeros(d, p) for d, p in zip(tangents[5:8], peeps))
               if peephole else tuple(peeps))
    options = (peephole, _mask_clip(settings, clip_grad))
    sums = [[np.zeros(4 * n_hidden, dtype)] for _ in range(2)]
    for s in sums:
        s += list(np.zeros((3, n_hidden), dtype)) if peephole else [s[0]] * 3
    proj = None if weights.w_proj is None else _ProjectionJVP(weights, tangents, settings,
                                                              clip_grad, seq)
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
        lstm_backward_kernel(*at[0], to_h[0], True, ups_cs[0][0], True, *peeps, peephole,
                             options[1], gates[0][t], prev_cs[0], *sums[0])
        lstm_backward_tangent_kernel(at[0], at[1], (to_h[0], ups_cs[0][0]),
                                     (to_h[1], ups_cs[1][0]), tuple(peeps), d_peeps, options,
                                     gates[1][t], prev_cs[1], tuple(sums[1]))
        for k in range(2):
            finish_state_grad(prev_cs[k], None, ups_cs[k][1])
            np.matmul(gates[k][t], w_h_t, out=prev_h[k])
        prev_h[1] += gates[0][t] @ t_w_h_t
        for k in range(2):
            finish_state_grad(prev_h[k], masks.recurrent, ups_h[k][1])
            if stopped is None:
                carry_h[k], prev_h[k] = prev_h[k], carry_h[k]
                carry_cs[k], prev_cs[k] = prev_cs[k], carry_cs[k]
            else:                        # stopped rows keep their state gradient
                np.copyto(carry_h[k], prev_h[k], where=~stopped)
                np.copyto(carry_cs[k], prev_cs[k], where=~stopped)
    carries = tuple((carry_cs[k], carry_h[k]) for k in range(2))
    return gates, carries, sums, None if proj is None else proj.weight_grads()


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
