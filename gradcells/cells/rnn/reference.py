"""The plain (Elman) RNN cell and the RNN over time, forward and gradient, written once for
any array namespace (docs/spec.md §9.3; PyTorch's ``nn.RNN``, Keras' ``SimpleRNN``, ONNX's
``RNN``).

Layout: ``w [I+H, H]``, rows the x part then the h part; ``b [H]``.

    z = [x, h_prev]·w + b
    h = act(z)                       act: tanh, or relu

The derivative is written in terms of the saved output, as for the other cells:
tanh'(z) = 1 - h², relu'(z) = 1 where h > 0 and 0 elsewhere (relu'(0) = 0, as PyTorch).

This is the first step of the backpropagation-through-time story: over a sequence the
gradient of each step's state is the upstream gradient plus what the next step sends back,
``dh_{t-1} = (dh_t∘act'(z_t))·W_hᵀ``, a product of T Jacobians that vanishes or explodes
with the spectrum of ``W_h``. The sequence ops follow the matmul plan of
``gradcells.cells.lstm.reference`` and its per-row lengths; they take the backend protocol's
arguments (``.spec.RNNBackend``): the arrays, an ``RNNWeights`` and an
``RNNSettings``.
"""

from __future__ import annotations

from ..._core import plan
from ..._core.arrays import namespace_of
from ..._core.xpmath import (
    at_step,
    filled,
    gradient_jvp,
    keep,
    masked,
    valid_rows,
    zoned,
    zoneout_grad,
)
from .spec import RNNCellGrads, RNNCellState, RNNSequence, RNNSequenceGrads


def rnn_activation(xp, z, activation):
    """``act(z)``: ``tanh(z)`` or ``relu(z) = max(z, 0)``."""
    return xp.tanh(z) if activation == "tanh" else xp.maximum(z, 0)


def rnn_preactivation_grad(h, d_h, activation):
    """``dz = d_h∘act'(z)`` from the saved output ``h``: ``d_h∘(1 - h²)`` for tanh,
    ``d_h`` where ``h > 0`` (else 0) for relu."""
    if activation == "tanh":
        return d_h * (1 - h * h)
    return d_h * (h > 0)


def rnn_cell(x, h_prev, weights, settings):
    """One RNN step; returns ``RNNCellState(h)``."""
    xp = namespace_of(x)
    w, b = weights
    z = xp.concatenate([x, h_prev], axis=1) @ w + b
    return RNNCellState(rnn_activation(xp, z, settings.activation))


def rnn_cell_grad(x, h_prev, weights, state, settings, *, d_h=None):
    """Gradient of one RNN step with respect to every input.

        dz = d_h∘act'(z);   d[x, h_prev] = dz·wᵀ;   dw = [x, h_prev]ᵀ·dz;   db = Σ_batch dz
    """
    xp = namespace_of(x)
    w, _ = weights
    d_h = xp.zeros_like(h_prev) if d_h is None else d_h
    dz = rnn_preactivation_grad(state.h, d_h, settings.activation)
    xh = xp.concatenate([x, h_prev], axis=1)
    dxh = dz @ w.T
    n_in = x.shape[1]
    return RNNCellGrads(x=dxh[:, :n_in], h_prev=dxh[:, n_in:], w=xh.T @ dz, b=dz.sum(axis=0))


def rnn_sequence(x, h0, weights, settings):
    """The RNN cell over ``x [T, B, I]`` from ``h0``.

    Per step, with ``xz`` the step's slice of the input projection ``x·W_x + b``:
    ``h = act(xz + h_prev·W_h)``. Returns ``RNNSequence(h, h_final)``: steps ``[T, B, H]``
    (zero past a row's length) and the final state ``[B, H]``.
    """
    xp = namespace_of(x)
    w, b = weights
    seq_len = settings.seq_len
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, n_in = x.shape
    w_h = w[n_in:]
    x_z = plan.input_projection(x, w[:n_in], b)
    steps = xp.zeros((n_steps, n_batch, h0.shape[1]), dtype=x.dtype)
    h = h0
    for t in range(n_steps):
        h_new = rnn_activation(xp, x_z[t] + masked(h, settings.recurrent_mask) @ w_h,
                               settings.activation)
        h_new = zoned(at_step(settings.zoneout_h, t), h, h_new)
        valid = valid_rows(seq_len, t)
        steps[t] = keep(valid, h_new, 0)
        h = keep(valid, h_new, h)
    return RNNSequence(steps, h_final=h.copy())


def rnn_sequence_grad(x, h0, weights, seq, settings, *, d_h=None, d_h_final=None):
    """Backpropagation through time for ``rnn_sequence``.

    Walking back from the final state, the gradient of the state after step t is carried in
    ``dh_next``; a running row adds the step's upstream ``d_h[t]``, a frozen row passes the
    carry through unchanged:

        dz_t = (dh_next + d_h[t])∘act'(z_t);   dh_next = dz_t·W_hᵀ
        dx = dZ·W_xᵀ;  dw = [x_flatᵀ·dZ ; h_prev_flatᵀ·dZ];  db = Σ_{t,b} dZ

    With masks (docs/spec.md §11.3): the matmul saw ``x∘m_in`` and ``h_prev∘m_rec``, and
    with zoneout the saved ``h`` is the zoned state, so ``act'`` reads the step's own
    output ``act(z_t)``, recomputed for all steps at once (one matmul).
    """
    xp = namespace_of(x)
    w, _ = weights
    seq_len = settings.seq_len
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, n_in = x.shape
    w_h = w[n_in:]
    zeros = xp.zeros_like(h0)
    dh_next = zeros if d_h_final is None else d_h_final.copy()
    d_z = xp.zeros((n_steps, n_batch, h0.shape[1]), dtype=x.dtype)
    h_prev = masked(plan.previous_states(xp, h0, seq.h), settings.recurrent_mask)
    outputs = seq.h if settings.zoneout_h is None else rnn_activation(
        xp, plan.input_projection(x, w[:n_in], weights.b) + h_prev @ w_h, settings.activation)
    for t in reversed(range(n_steps)):
        valid = valid_rows(seq_len, t)
        dh_t, dh_old = zoneout_grad(at_step(settings.zoneout_h, t),
                                    dh_next if d_h is None else dh_next + d_h[t])
        dh_t = keep(valid, dh_t, zeros)   # after the split: z past a row's length is unread
        d_z[t] = rnn_preactivation_grad(outputs[t], dh_t, settings.activation)
        dh_prev = masked(d_z[t] @ w_h.T, settings.recurrent_mask)
        dh_next = keep(valid, dh_prev if dh_old is None else dh_prev + dh_old, dh_next)
    d_flat = plan.flat(d_z)
    dx = plan.running_inputs(xp, masked((d_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in),
                                        settings.input_mask), seq_len)
    dw = xp.concatenate([plan.flat(x).T @ d_flat, plan.flat(h_prev).T @ d_flat], axis=0)
    return RNNSequenceGrads(x=dx, h0=dh_next, w=dw, b=d_flat.sum(axis=0))


# --------------------------------------------------------------------------------------
# Forward mode (docs/spec.md §12)


def rnn_cell_jvp(x, h_prev, weights, tangents, settings):
    """One RNN step and its tangent for ``tangents``, an ``RNNCellGrads`` of the inputs'
    tangents (None: zero). Returns ``(RNNCellState(h), RNNCellState(dh))``:

        dz = [dx, dh_prev]·w + [x, h_prev]·dw + db;   dh = act'(z)∘dz

    ``act'`` from the output, as the gradient reads it (``rnn_preactivation_grad``: the
    same diagonal Jacobian, applied to a tangent instead of a cotangent)."""
    xp = namespace_of(x)
    w, b = weights
    t = filled(xp, tangents, (x, h_prev, w, b))
    xh = xp.concatenate([x, h_prev], axis=1)
    z = xh @ w + b
    dz = xp.concatenate([t.x, t.h_prev], axis=1) @ w + xh @ t.w + t.b
    h = rnn_activation(xp, z, settings.activation)
    return RNNCellState(h), RNNCellState(rnn_preactivation_grad(h, dz, settings.activation))


def rnn_sequence_jvp(x, h0, weights, tangents, settings):
    """``rnn_sequence`` and its tangent for ``tangents``, an ``RNNSequenceGrads`` of the
    inputs' tangents (None: zero). Returns ``(RNNSequence, RNNSequence of tangents)``.

    Each step is ``rnn_cell_jvp`` on the masked input and state; the masks, zoneout and the
    frozen rows past a row's length are linear in the state, so the tangent takes them
    exactly as the state does."""
    xp = namespace_of(x)
    t = filled(xp, tangents, (x, h0, *weights))
    seq_len = settings.seq_len
    x, dx = (plan.running_inputs(xp, masked(a, settings.input_mask), seq_len) for a in (x, t.x))
    steps, d_steps = xp.zeros((2, *x.shape[:2], h0.shape[1]), dtype=x.dtype)
    h, dh = h0, t.h0
    for step in range(x.shape[0]):
        m_rec, z = settings.recurrent_mask, at_step(settings.zoneout_h, step)
        (h_new,), (dh_new,) = rnn_cell_jvp(
            x[step], masked(h, m_rec), weights,
            RNNCellGrads(dx[step], masked(dh, m_rec), t.w, t.b), settings)
        h_new, dh_new = zoned(z, h, h_new), zoned(z, dh, dh_new)
        valid = valid_rows(seq_len, step)
        steps[step], d_steps[step] = keep(valid, h_new, 0), keep(valid, dh_new, 0)
        h, dh = keep(valid, h_new, h), keep(valid, dh_new, dh)
    return RNNSequence(steps, h.copy()), RNNSequence(d_steps, dh.copy())


def rnn_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_h=None,
                      d_h_tangent=None):
    """The JVP of ``rnn_cell_grad`` along ``tangents`` (an ``RNNCellGrads`` of the inputs'
    tangents) and ``d_h_tangent``: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(rnn_cell_jvp, rnn_cell_grad, (x, h_prev), weights, state, tangents,
                        settings, {"d_h": (d_h, d_h_tangent, state.h)})


def rnn_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_h=None,
                          d_h_final=None, d_h_tangent=None, d_h_final_tangent=None):
    """The JVP of ``rnn_sequence_grad`` along ``tangents`` (an ``RNNSequenceGrads``) and the
    upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(rnn_sequence_jvp, rnn_sequence_grad, (x, h0), weights, seq, tangents,
                        settings, {"d_h": (d_h, d_h_tangent, seq.h),
                                   "d_h_final": (d_h_final, d_h_final_tangent, seq.h_final)})
