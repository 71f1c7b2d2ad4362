"""xLSTM's sLSTM on the CPU (docs/spec.md §19): BLAS matmuls plus one fused Numba pass
per step each way (``_cpu_kernels``).

The math is ``gradcells.cells.slstm.reference``. A sequence's forward:

    X = x_flat·w + b                           one BLAS call, every step
    per step:  rec = h_prev∘m_rec · r          per head, one batched matmul [N, B, d]·[N, d, 4d]
               slstm_forward_kernel(...)       gates, stabiliser, state, one pass over [B, H]

and its gradient:

    per step:  slstm_backward_kernel(...)      dG (gate-major and head-major), the carries
               dh_prev = dG_k·r[k]ᵀ ∘ m_rec    one batched matmul
    dx = dG·wᵀ;  dw = x_flatᵀ·dG;  dr[k] = h_prev_kᵀ·dG_k;  db = Σ dG     after the loop

The recurrent weights stay head-major (``r [N, d, 4d]`` as given, each head's block one
contiguous ``d × 4d`` matrix) and so do the products (``rec [N, B, 4d]``), so a head's
block is read from cache through the time loop. For the sigmoid forget the gradient
recomputes ``f̃`` of every step (one matmul per head over all ``T·B`` rows). A cell is the
sequence of one step.

Forward mode (``_jvp``) runs the forward's plan with the tangents beside, one fused pass per
step (``slstm_forward_tangent_kernel``; the tangent of ``rec`` is ``rec(dh, r) + rec(h,
dr)``, two more batched matmuls). The second order (``_grad_jvp``) takes the saved
fields' tangents from the forward mode, then runs the backward's loop with a tangent
beside every value (``slstm_backward_tangent_kernel``, the backward differentiated line by
line, the stabiliser's branch the primal's) and the matmuls' product rule after it.

The CPU backend runs the reverse direction natively (``gradcells.cpu.NATIVE_REVERSE``): a
sequence op is handed ``reverse=True`` with the lengths, every per-step array at its time
position. Here each row's valid steps are put in run order (``_RowFlip``, the permutation
``t -> L_b-1-t`` of the steps ``t < L_b``, an involution), run forward, and the per-step
results put back.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..._core.plan import flat, previous_states
from ...cpu._compile import kernel_array
from ...cpu._sequence import lengths_of, running_inputs
from ._cpu_kernels import (
    slstm_backward_kernel,
    slstm_backward_tangent_kernel,
    slstm_forward_kernel,
    slstm_forward_tangent_kernel,
)
from .spec import SLSTMCellGrads, SLSTMCellState, SLSTMSequence, SLSTMSequenceGrads

_UPSTREAM = ("d_i", "d_f", "d_z", "d_o", "d_c", "d_n", "d_m", "d_h")
"""The per-step upstream gradients in the order of the result's fields."""


def _floor(dtype):
    """The exponent below which a gate is flushed to 0 (``reference.flushed_exp``)."""
    return np.dtype(dtype).type(2 * math.log(float(np.finfo(dtype).eps)))


def _heads(h, n_heads):
    """``h [rows, H]`` head-major, ``[N, rows, d]`` (a copy, C-contiguous)."""
    rows, hidden = h.shape
    return np.ascontiguousarray(h.reshape(rows, n_heads, hidden // max(n_heads, 1))
                                .transpose(1, 0, 2))


def _running(lengths, t, n_batch):
    return np.ones(n_batch, np.bool_) if lengths is None else t < lengths


def _forward(x, c0, n0, m0, h0, weights, settings):
    """The forward time loop (in run order); returns an ``SLSTMSequence``."""
    w, r, b = (kernel_array(a) for a in weights)
    n_steps, n_batch, _ = x.shape
    hidden, n_heads = h0.shape[1], r.shape[0]
    lengths = lengths_of(settings.seq_len)
    m_in, m_rec = settings.input_mask, settings.recurrent_mask
    x = running_inputs(x if m_in is None else x * m_in, lengths)
    x_pre = (flat(x) @ w + b).reshape(n_steps, n_batch, 4 * hidden)
    state = [np.array(a, order="C") for a in (c0, n0, m0, h0)]
    out = np.empty((8, n_steps, n_batch, hidden), x.dtype)
    floor = _floor(x.dtype)
    for t in range(n_steps):
        h_seen = state[3] if m_rec is None else state[3] * m_rec
        rec = np.matmul(_heads(h_seen, n_heads), r)
        slstm_forward_kernel(x_pre[t], rec, _running(lengths, t, n_batch),
                             settings.forget == "exp", floor, *state, *out[:, t])
    return SLSTMSequence(*out, *state)


def _upstream_steps(given, shape, dtype):
    """The per-step upstream gradients as one ``[T, 8, B, H]`` array (zeros where none)."""
    up = np.zeros((shape[0], 8, *shape[1:]), dtype)
    for k, name in enumerate(_UPSTREAM):
        if given.get(name) is not None:
            up[:, k] = given[name]
    return up


def _forget_preactivations(x, h_prev, w, r, b, hidden):
    """``f̃`` of every step ``[T, B, H]`` from the inputs and the states the steps read."""
    n_steps, n_batch, _ = x.shape
    n_heads, d = r.shape[0], r.shape[1]
    h_flat = flat(h_prev)
    f_pre = flat(x) @ np.ascontiguousarray(w[:, hidden:2 * hidden]) + b[hidden:2 * hidden]
    for k in range(n_heads):      # each head's f block, over all T·B rows at once (BLAS)
        f_pre[:, k * d:(k + 1) * d] += (h_flat[:, k * d:(k + 1) * d]
                                        @ np.ascontiguousarray(r[k, :, d:2 * d]))
    return f_pre.reshape(n_steps, n_batch, hidden)


def _backward(x, c0, n0, m0, h0, weights, seq, settings, given):
    """The backward time loop (in run order); returns an ``SLSTMSequenceGrads``."""
    w, r, b = (kernel_array(a) for a in weights)
    n_steps, n_batch, n_in = x.shape
    hidden, n_heads = h0.shape[1], r.shape[0]
    lengths = lengths_of(settings.seq_len)
    m_in, m_rec = settings.input_mask, settings.recurrent_mask
    x = running_inputs(x if m_in is None else x * m_in, lengths)
    fields = [kernel_array(np.asarray(a)) for a in seq[:8]]
    h_prev = previous_states(np, h0, fields[7])
    if m_rec is not None:
        h_prev = h_prev * m_rec
    starts = [np.ascontiguousarray(previous_states(np, s0, fields[k]))
              for s0, k in ((c0, 4), (n0, 5))]
    f_pre = (_forget_preactivations(x, h_prev, w, r, b, hidden)
             if settings.forget == "sigmoid" else np.zeros((n_steps, n_batch, hidden), x.dtype))
    up = _upstream_steps(given, (n_steps, n_batch, hidden), x.dtype)
    carry = [np.zeros((n_batch, hidden), x.dtype) if given.get(f"d_{k}_final") is None
             else np.array(given[f"d_{k}_final"], order="C") for k in "cnmh"]
    d_gates = np.empty((n_steps, n_batch, 4 * hidden), x.dtype)
    d_heads = np.empty((n_steps, n_heads, n_batch, 4 * hidden // max(n_heads, 1)), x.dtype)
    r_t = np.ascontiguousarray(r.transpose(0, 2, 1))
    for t in reversed(range(n_steps)):
        running = _running(lengths, t, n_batch)
        slstm_backward_kernel(*(a[t] for a in fields[:4]), fields[4][t], fields[5][t],
                              fields[7][t], starts[0][t], starts[1][t], f_pre[t], up[t],
                              running, settings.forget == "exp",
                              settings.stabilizer_grad == "stop", *carry, d_gates[t],
                              d_heads[t])
        dh = np.matmul(d_heads[t], r_t).transpose(1, 0, 2).reshape(n_batch, hidden)
        if m_rec is not None:
            dh *= m_rec
        carry[3] = np.where(running[:, None], dh, carry[3])
    d_flat = flat(d_gates)
    dx = (d_flat @ w.T).reshape(n_steps, n_batch, n_in)
    dx = running_inputs(dx if m_in is None else dx * m_in, lengths)
    return SLSTMSequenceGrads(dx, *carry, flat(x).T @ d_flat,
                              _recurrent_weight_grad(flat(h_prev), d_heads, r),
                              d_flat.sum(axis=0))


def _recurrent_weight_grad(h_flat, d_heads, r):
    """``dr[k] = h_prev_kᵀ·dG_k`` over all ``T·B`` rows, one BLAS call per head
    (``d_heads [T, N, B, 4d]``)."""
    n_heads, d = r.shape[0], r.shape[1]
    dr = np.empty(r.shape, h_flat.dtype)
    for k in range(n_heads):
        dr[k] = h_flat[:, k * d:(k + 1) * d].T @ d_heads[:, k].reshape(h_flat.shape[0], 4 * d)
    return dr


def slstm_cell(x, c_prev, n_prev, m_prev, h_prev, weights, settings):
    """One sLSTM step (a sequence of one); see ``gradcells.reference.slstm_cell``."""
    seq = _forward(x[None], c_prev, n_prev, m_prev, h_prev, weights, settings)
    return SLSTMCellState(*(a[0] for a in seq[:8]))


def slstm_cell_grad(x, c_prev, n_prev, m_prev, h_prev, weights, state, settings, *,
                    d_h=None, d_c=None, d_n=None, d_m=None, d_i=None, d_f=None, d_z=None,
                    d_o=None):
    """Gradient of one sLSTM step (a sequence of one); see
    ``gradcells.reference.slstm_cell_grad``."""
    given = {k: None if v is None else v[None] for k, v in locals().items()
             if k.startswith("d_")}
    seq = SLSTMSequence(*(np.asarray(a)[None] for a in state), *state[4:])
    g = _backward(x[None], c_prev, n_prev, m_prev, h_prev, weights, seq, settings, given)
    return SLSTMCellGrads(g.x[0], *g[1:])


def slstm_cell_jvp(x, c_prev, n_prev, m_prev, h_prev, weights, tangents, settings):
    """One sLSTM step and its tangent (a sequence of one); see
    ``gradcells.reference.slstm_cell_jvp``."""
    t = SLSTMSequenceGrads(None if tangents.x is None else tangents.x[None], *tangents[1:])
    pair = _forward_jvp(x[None], (c_prev, n_prev, m_prev, h_prev), weights, t, settings)
    return tuple(SLSTMCellState(*(a[0] for a in s[:8])) for s in pair)


def slstm_cell_grad_jvp(x, c_prev, n_prev, m_prev, h_prev, weights, state, tangents,
                        settings, *, d_h=None, d_c=None, d_n=None, d_m=None, d_i=None,
                        d_f=None, d_z=None, d_o=None, d_h_tangent=None, d_c_tangent=None,
                        d_n_tangent=None, d_m_tangent=None, d_i_tangent=None,
                        d_f_tangent=None, d_z_tangent=None, d_o_tangent=None):
    """The JVP of ``slstm_cell_grad`` (a sequence of one); see
    ``gradcells.reference.slstm_cell_grad_jvp``."""
    given = {k: None if v is None else v[None] for k, v in locals().items()
             if k.startswith("d_")}
    seq = SLSTMSequence(*(np.asarray(a)[None] for a in state), *state[4:])
    t = SLSTMSequenceGrads(None if tangents.x is None else tangents.x[None], *tangents[1:])
    pair = _backward_jvp(x[None], (c_prev, n_prev, m_prev, h_prev), weights, seq, t, settings,
                         given)
    return tuple(SLSTMCellGrads(g.x[0], *g[1:]) for g in pair)


def _head_major(d_gates, n_heads):
    """Gate-major ``[..., B, 4H]`` pre-activation gradients as ``[..., N, B, 4d]``."""
    *lead, n_batch, width = d_gates.shape
    d = width // 4 // max(n_heads, 1)
    a = d_gates.reshape(*lead, n_batch, 4, n_heads, d)
    order = (*range(len(lead)), len(lead) + 2, len(lead), len(lead) + 1, len(lead) + 3)
    return np.ascontiguousarray(a.transpose(order).reshape(*lead, n_heads, n_batch, 4 * d))


def _backward_jvp(x, states, weights, seq, tangents, settings, given):
    """The backward time loop with the tangents beside (in run order): ``(grads,
    grads_tangent)``, the forward's tangent from ``_forward_jvp``."""
    w, r, b = (kernel_array(a) for a in weights)
    t = SLSTMSequenceGrads(*_filled(tangents, (x, *states, *weights)))
    d_seq = _forward_jvp(x, states, weights, t, settings)[1]
    n_steps, n_batch, n_in = x.shape
    hidden, n_heads = states[3].shape[1], r.shape[0]
    lengths = lengths_of(settings.seq_len)
    m_in, m_rec = settings.input_mask, settings.recurrent_mask
    x, dx = (running_inputs(a if m_in is None else a * m_in, lengths) for a in (x, t.x))
    fields = np.ascontiguousarray(np.stack([np.asarray(a) for a in seq[:8]], axis=1))
    d_fields = np.ascontiguousarray(np.stack(d_seq[:8], axis=1))
    h_prev, dh_prev = (previous_states(np, h0, f[:, 7]) for h0, f in
                       ((states[3], fields), (t.h0, d_fields)))
    if m_rec is not None:
        h_prev, dh_prev = h_prev * m_rec, dh_prev * m_rec
    starts, d_starts = (np.ascontiguousarray(np.stack(
        [previous_states(np, s0[0], f[:, 4]), previous_states(np, s0[1], f[:, 5])], axis=1))
        for s0, f in (((states[0], states[1]), fields), ((t.c0, t.n0), d_fields)))
    f_pre = _forget_preactivations(x, h_prev, w, r, b, hidden)
    d_f_pre = (_forget_preactivations(dx, dh_prev, w, r, t.b, hidden)
               + _forget_preactivations(x, h_prev, t.w, t.r, 0 * t.b, hidden))
    up = _upstream_steps(given, (n_steps, n_batch, hidden), x.dtype)
    d_up = _upstream_steps({k.removesuffix("_tangent"): v for k, v in given.items()
                            if k.endswith("_tangent")}, (n_steps, n_batch, hidden), x.dtype)
    carry, d_carry = (np.stack([np.zeros((n_batch, hidden), x.dtype)
                                if given.get(f"d_{k}_final{suffix}") is None
                                else given[f"d_{k}_final{suffix}"] for k in "cnmh"])
                      for suffix in ("", "_tangent"))
    d_gates, d_gates_t = np.empty((2, n_steps, n_batch, 4 * hidden), x.dtype)
    r_t, dr_t = (np.ascontiguousarray(a.transpose(0, 2, 1)) for a in (r, t.r))
    for step in reversed(range(n_steps)):
        running = _running(lengths, step, n_batch)
        slstm_backward_tangent_kernel(
            fields[step], d_fields[step], starts[step], d_starts[step], f_pre[step],
            d_f_pre[step], up[step], d_up[step], running, settings.forget == "exp",
            settings.stabilizer_grad == "stop", carry, d_carry, d_gates[step],
            d_gates_t[step])
        heads, heads_t = _head_major(d_gates[step], n_heads), _head_major(d_gates_t[step],
                                                                          n_heads)
        for target, value in ((carry, np.matmul(heads, r_t)),
                              (d_carry, np.matmul(heads_t, r_t) + np.matmul(heads, dr_t))):
            dh = value.transpose(1, 0, 2).reshape(n_batch, hidden)
            if m_rec is not None:
                dh = dh * m_rec
            target[3] = np.where(running[:, None], dh, target[3])
    return _weight_grads_jvp(x, dx, (h_prev, dh_prev), (w, r), t, (d_gates, d_gates_t),
                             (carry, d_carry), (m_in, lengths))


def _weight_grads_jvp(x, dx, h_pair, w_r, t, gates, carries, masks):
    """After the loop: the input and weight gradients and their tangents."""
    w, r = w_r
    (h_prev, dh_prev), (d_gates, d_gates_t), (m_in, lengths) = h_pair, gates, masks
    n_steps, n_batch, n_in = x.shape
    n_heads = r.shape[0]
    g, g_t = flat(d_gates), flat(d_gates_t)
    heads, heads_t = _head_major(d_gates, n_heads), _head_major(d_gates_t, n_heads)

    def input_grad(a):
        a = a.reshape(n_steps, n_batch, n_in)
        return running_inputs(a if m_in is None else a * m_in, lengths)

    grads = SLSTMSequenceGrads(
        input_grad(g @ w.T), *carries[0], flat(x).T @ g,
        _recurrent_weight_grad(flat(h_prev), heads, r), g.sum(axis=0))
    tangent = SLSTMSequenceGrads(
        input_grad(g_t @ w.T + g @ t.w.T), *carries[1], flat(dx).T @ g + flat(x).T @ g_t,
        _recurrent_weight_grad(flat(dh_prev), heads, r)
        + _recurrent_weight_grad(flat(h_prev), heads_t, r), g_t.sum(axis=0))
    return grads, tangent


def _filled(tangents, primals):
    """The tangents with each None a zero array of its primal."""
    return [np.zeros_like(p) if t is None else t for t, p in zip(tangents, primals, strict=True)]


def _forward_jvp(x, states, weights, tangents, settings):
    """The forward time loop with the tangents beside (in run order): ``(SLSTMSequence,
    SLSTMSequence of tangents)``."""
    w, r, b = (kernel_array(a) for a in weights)
    dx, dc0, dn0, dm0, dh0, dw, dr, db = _filled(tangents, (x, *states, *weights))
    d_states = (dc0, dn0, dm0, dh0)
    n_steps, n_batch, _ = x.shape
    hidden, n_heads = states[3].shape[1], r.shape[0]
    lengths = lengths_of(settings.seq_len)
    m_in, m_rec = settings.input_mask, settings.recurrent_mask
    x, dx = (running_inputs(a if m_in is None else a * m_in, lengths) for a in (x, dx))
    x_pre = (flat(x) @ w + b).reshape(n_steps, n_batch, 4 * hidden)
    dx_pre = (flat(dx) @ w + flat(x) @ dw + db).reshape(n_steps, n_batch, 4 * hidden)
    state, d_state = (np.array(np.stack(s), order="C") for s in (states, d_states))
    out = np.empty((2, n_steps, 8, n_batch, hidden), x.dtype)
    floor, dr = _floor(x.dtype), kernel_array(dr)
    for t in range(n_steps):
        h, dh = ((a if m_rec is None else a * m_rec) for a in (state[3], d_state[3]))
        heads = _heads(h, n_heads)
        slstm_forward_tangent_kernel(
            x_pre[t], np.matmul(heads, r), dx_pre[t],
            np.matmul(_heads(dh, n_heads), r) + np.matmul(heads, dr),
            _running(lengths, t, n_batch), settings.forget == "exp",
            settings.stabilizer_grad == "stop", floor, state, d_state, out[0, t], out[1, t])
    return tuple(SLSTMSequence(*o.transpose(1, 0, 2, 3), *s)
                 for o, s in zip(out, (state, d_state), strict=True))


class _RowFlip:
    """Each row's first ``L_b`` steps in reverse, the others in place (None: no reversal)."""

    def __init__(self, settings, n_steps):
        self.on = bool(settings.reverse) and settings.seq_len is not None
        if self.on:
            lengths = np.asarray(settings.seq_len, dtype=np.int64)
            t = np.arange(n_steps)[:, None]
            self.rows = np.where(t < lengths, lengths - 1 - t, t)

    def __call__(self, a):
        """A per-step array ``[T, B, ·]`` (a mask broadcast there first) in the other order;
        anything else unchanged."""
        if not self.on or a is None or a.ndim < 3 or a.shape[0] == 1:
            return a
        a = np.broadcast_to(a, (self.rows.shape[0], self.rows.shape[1], a.shape[-1]))
        return a[self.rows, np.arange(self.rows.shape[1])[None, :]]

    def settings(self, settings):
        """The settings of the run in run order: forward, the per-step input mask flipped."""
        if not self.on:
            return settings
        return dataclasses.replace(settings, reverse=False,
                                   input_mask=self(settings.input_mask))

    def sequence(self, seq):
        """A sequence result (or its tangent) with every per-step field flipped."""
        return SLSTMSequence(*(self(a) if k < 8 else a for k, a in enumerate(seq)))


def slstm_sequence(x, c0, n0, m0, h0, weights, settings):
    """The sLSTM over time; see ``gradcells.reference.slstm_sequence``."""
    flip = _RowFlip(settings, x.shape[0])
    return flip.sequence(_forward(flip(x), c0, n0, m0, h0, weights, flip.settings(settings)))


def slstm_sequence_grad(x, c0, n0, m0, h0, weights, seq, settings, *, d_h=None, d_c=None,
                        d_n=None, d_m=None, d_h_final=None, d_c_final=None, d_n_final=None,
                        d_m_final=None, d_i=None, d_f=None, d_z=None, d_o=None):
    """Backpropagation through time; see ``gradcells.reference.slstm_sequence_grad``."""
    flip = _RowFlip(settings, x.shape[0])
    upstream = {k: flip(v) for k, v in locals().items() if k.startswith("d_")}
    grads = _backward(flip(x), c0, n0, m0, h0, weights, flip.sequence(seq),
                      flip.settings(settings), upstream)
    return grads._replace(x=flip(grads.x))


def slstm_sequence_jvp(x, c0, n0, m0, h0, weights, tangents, settings):
    """The sLSTM over time and its tangent; see ``gradcells.reference.slstm_sequence_jvp``."""
    flip = _RowFlip(settings, x.shape[0])
    pair = _forward_jvp(flip(x), (c0, n0, m0, h0), weights,
                        tangents._replace(x=flip(tangents.x)), flip.settings(settings))
    return tuple(flip.sequence(s) for s in pair)


def slstm_sequence_grad_jvp(x, c0, n0, m0, h0, weights, seq, tangents, settings, *,
                            d_h=None, d_c=None, d_n=None, d_m=None, d_h_final=None,
                            d_c_final=None, d_n_final=None, d_m_final=None, d_i=None,
                            d_f=None, d_z=None, d_o=None, d_h_tangent=None, d_c_tangent=None,
                            d_n_tangent=None, d_m_tangent=None, d_h_final_tangent=None,
                            d_c_final_tangent=None, d_n_final_tangent=None,
                            d_m_final_tangent=None, d_i_tangent=None, d_f_tangent=None,
                            d_z_tangent=None, d_o_tangent=None):
    """The JVP of ``slstm_sequence_grad``; see
    ``gradcells.reference.slstm_sequence_grad_jvp``."""
    flip = _RowFlip(settings, x.shape[0])
    upstream = {k: flip(v) for k, v in locals().items() if k.startswith("d_")}
    pair = _backward_jvp(flip(x), (c0, n0, m0, h0), weights, flip.sequence(seq),
                         tangents._replace(x=flip(tangents.x)), flip.settings(settings),
                         upstream)
    return tuple(g._replace(x=flip(g.x)) for g in pair)
