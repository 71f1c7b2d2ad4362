"""The second order on the CPU (docs/spec.md §12): a gradient op and its tangent, the JVP
of the gradient in all its array inputs, in the same backward loop.

The math is ``gradcells.reference``'s ``*_grad_jvp`` (the hand-derived gradient on dual
numbers); the plan is the CPU gradient's (``_sequence``) with a tangent beside every value:

- the saved result's tangent first, from this backend's own fused ``*_sequence_jvp``
  plumbing (``_jvp``);
- per step (``Walk.back_times()``): the cell's backward kernel for the gate gradients
  ``dZ_t`` (the primal, as the CPU gradient computes it) and one fused Numba pass for their
  tangents ``dZ'_t`` (``_grad_jvp_kernels``; with the LSTM's layer norm NumPy's, as the
  forward mode's layer-normalised step is); then the carry ``dZ_t·W_hᵀ`` and its tangent
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
from .._core.types import LSTMNorm, LSTMSequenceGrads
from ._compile import kernel_array
from ._grad_jvp_kernels import lstm_backward_tangent_kernel
from ._jvp import (
    layer_norm_stats,
    layer_norm_tangent,
    lstm_jvp,
    norm_tangents,
    sequence_inputs,
    step_pair,
    tangent_or_zeros,
)
from ._lstm_kernels import (
    layer_norm_grad_kernel,
    layer_norm_stats_kernel,
    lstm_backward_kernel,
    lstm_ln_backward_kernel,
)
from ._sequence import (
    Walk,
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


# ---- LSTM


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
