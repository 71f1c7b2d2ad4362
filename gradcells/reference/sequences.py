"""LSTM and GRU over time, forward and backpropagation through time, for any array namespace.

The matmul plan (the one the fast backends follow too):

- forward: the input part of every step's pre-activations is one matmul,
  ``x [T·B, I] · W_x`` (the x-rows of the weights); per step only ``h·W_h`` and the cell's
  elementwise math remain;
- backward: the gate gradients of all steps are kept in one ``[T, B, ·]`` array, so after
  the loop ``dx = dG·W_xᵀ`` is one matmul and the weight gradients are two,
  ``dW_x = x_flatᵀ·dG`` and ``dW_h = h_prev_flatᵀ·dG``; per step only ``dG_t·W_hᵀ`` remains.

Per-example lengths ``seq_len [B]`` follow PyTorch's packed sequences: for ``t >= seq_len[b]``
row b's per-step outputs are zero and its state is frozen, so the final state is the state
after its last valid step. In the backward pass a frozen row passes the gradient of its
state straight through the step, and its gate gradients are zero.
"""

from __future__ import annotations

from .._dispatch import namespace_of
from .._types import (
    GRUSequence,
    GRUSequenceGrads,
    LSTMCellState,
    LSTMSequence,
    LSTMSequenceGrads,
)
from ._math import blocks, sigmoid
from .lstm import lstm_activations, lstm_gate_grads


def _valid_rows(seq_len, t):
    """``[B, 1]`` mask of the rows still running at step t, or None when all rows run."""
    return None if seq_len is None else (t < seq_len)[:, None]


def _keep(valid, new, old):
    """``new`` in the running rows, ``old`` in the frozen ones."""
    return new if valid is None else namespace_of(new).where(valid, new, old)


def _previous_states(first, steps):
    """The state each step starts from: ``[first, steps[0], ..., steps[T-2]]``.

    In a row that has stopped, ``steps[t-1]`` is zero rather than the frozen state, but the
    gradients of such a step are zero, so the value never matters.
    """
    xp = namespace_of(first)
    return xp.concatenate([first[None], steps], axis=0)[:-1]


def _input_projection(x, w_x, b):
    """``x·W_x + b`` for all T steps at once, as ``[T, B, width]``."""
    n_steps, n_batch, n_in = x.shape
    flat = x.reshape(n_steps * n_batch, n_in) @ w_x + b
    return flat.reshape(n_steps, n_batch, w_x.shape[1])


def _flat(a):
    """``[T, B, n] -> [T·B, n]``."""
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2])


def _running_inputs(x, seq_len):
    """``x`` with every step past its row's length zeroed (``x`` itself without lengths).

    Those steps' outputs are discarded and their gate gradients are zero, so their inputs
    never matter, except that padding which is NaN or inf would still reach the input
    projection (with a warning) and ``dW_x = x_flatᵀ·dG`` (0·NaN is NaN). Every sequence
    function starts from this, so the padding is never read.
    """
    if seq_len is None:
        return x
    xp = namespace_of(x)
    running = xp.arange(x.shape[0])[:, None] < seq_len[None, :]
    return xp.where(running[:, :, None], x, xp.zeros((), dtype=x.dtype))


# --------------------------------------------------------------------------------------
# LSTM


def lstm_sequence(x, cs0, h0, w, b, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
                  cell_clip=None, seq_len=None):
    """The LSTM block cell over ``x [T, B, I]`` from ``(cs0, h0)``.

    Returns ``LSTMSequence(i, cs, f, o, ci, co, h, cs_final, h_final)``: every step's
    outputs ``[T, B, H]`` (zero past a row's length) and the final states ``[B, H]``.
    """
    x = _running_inputs(x, seq_len)
    xp = namespace_of(x)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    w_h = w[n_in:]
    x_gates = _input_projection(x, w[:n_in], b)
    steps = [xp.zeros((n_steps, n_batch, n_hidden), dtype=x.dtype) for _ in LSTMCellState._fields]
    cs, h = cs0, h0
    for t in range(n_steps):
        state = lstm_activations(x_gates[t] + h @ w_h, cs, wci=wci, wcf=wcf, wco=wco,
                                 forget_bias=forget_bias, cell_clip=cell_clip)
        valid = _valid_rows(seq_len, t)
        for out, value in zip(steps, state):
            out[t] = _keep(valid, value, 0)
        cs, h = _keep(valid, state.cs, cs), _keep(valid, state.h, h)
    return LSTMSequence(*steps, cs_final=cs.copy(), h_final=h.copy())


def lstm_sequence_grad(x, cs0, h0, w, b, seq, *, d_h=None, d_cs=None, d_h_final=None,
                       d_cs_final=None, wci=None, wcf=None, wco=None, cell_clip=None,
                       clip_grad="exact", seq_len=None):
    """Backpropagation through time for ``lstm_sequence``.

    Walking back from the final states, the gradient of the state after step t is carried
    in ``(dh_next, dcs_next)``; a running row adds the step's upstream ``d_h[t], d_cs[t]``
    and goes through ``lstm_gate_grads``, a frozen row passes the carry through unchanged:

        dG_t = lstm_gate_grads(cs_prev_t, step t, d_h = dh_next + d_h[t], d_cs = dcs_next + d_cs[t])
        dh_next = dG_t·W_hᵀ;   dcs_next = dcs_prev from the same call
        dx = dG·W_xᵀ;  dw = [x_flatᵀ·dG ; h_prev_flatᵀ·dG];  db = Σ_{t,b} dG
    """
    x = _running_inputs(x, seq_len)
    xp = namespace_of(x)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    w_x, w_h = w[:n_in], w[n_in:]
    cs_prev = _previous_states(cs0, seq.cs)
    h_prev = _previous_states(h0, seq.h)
    zeros = xp.zeros_like(h0)
    dh_next = xp.zeros_like(h0) if d_h_final is None else d_h_final.copy()
    dcs_next = xp.zeros_like(cs0) if d_cs_final is None else d_cs_final.copy()
    d_gates = xp.zeros((n_steps, n_batch, 4 * n_hidden), dtype=x.dtype)
    peephole_grads = [xp.zeros(n_hidden, dtype=x.dtype) for _ in range(3)]

    for t in reversed(range(n_steps)):
        valid = _valid_rows(seq_len, t)
        dh_t = dh_next if d_h is None else dh_next + d_h[t]
        dcs_t = dcs_next if d_cs is None else dcs_next + d_cs[t]
        step = LSTMCellState(*(a[t] for a in seq[:7]))
        d_gates[t], dcs_prev, *d_peepholes = lstm_gate_grads(
            cs_prev[t], step, d_h=_keep(valid, dh_t, zeros), d_cs=_keep(valid, dcs_t, zeros),
            wci=wci, wcf=wcf, wco=wco, cell_clip=cell_clip, clip_grad=clip_grad)
        dh_next = _keep(valid, d_gates[t] @ w_h.T, dh_next)
        dcs_next = _keep(valid, dcs_prev, dcs_next)
        if wci is not None:
            peephole_grads = [acc + g for acc, g in zip(peephole_grads, d_peepholes)]

    d_gates_flat = _flat(d_gates)
    dx = (d_gates_flat @ w_x.T).reshape(n_steps, n_batch, n_in)
    dw = xp.concatenate([_flat(x).T @ d_gates_flat, _flat(h_prev).T @ d_gates_flat], axis=0)
    dwci, dwcf, dwco = peephole_grads if wci is not None else (None, None, None)
    return LSTMSequenceGrads(x=dx, cs0=dcs_next, h0=dh_next, w=dw, b=d_gates_flat.sum(axis=0),
                             wci=dwci, wcf=dwcf, wco=dwco)


# --------------------------------------------------------------------------------------
# GRU


def _gru_input_projection(x, w_ru, w_c, b_ru, b_c, n_hidden):
    """The x parts of every step's r, u and candidate pre-activations, one matmul:
    ``x·[W_rux, W_cx] + [b_ru, b_c(x part)]`` as ``[T, B, 3H]``."""
    xp = namespace_of(x)
    n_in = x.shape[2]
    w_x = xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)
    return _input_projection(x, w_x, xp.concatenate([b_ru, b_c[:n_hidden]]))


def gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, *, reset_after=False, seq_len=None):
    """The GRU block cell over ``x [T, B, I]`` from ``h0``.

    Per step, with ``xr, xu, xc`` the step's slice of the input projection:

        [r, u] = σ([xr, xu] + h_prev·W_ruh);   c = tanh(xc + (r∘h_prev)·W_ch)
        reset_after:                            c = tanh(xc + r∘(h_prev·W_ch + b_ch))
        h = u∘h_prev + (1-u)∘c

    Returns ``GRUSequence(r, u, c, h, h_final)``: steps ``[T, B, H]`` (zero past a row's
    length) and the final state ``[B, H]``.
    """
    x = _running_inputs(x, seq_len)
    xp = namespace_of(x)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    w_ruh, w_ch = w_ru[n_in:], w_c[n_in:]
    x_gates = _gru_input_projection(x, w_ru, w_c, b_ru, b_c, n_hidden)
    steps = [xp.zeros((n_steps, n_batch, n_hidden), dtype=x.dtype) for _ in range(4)]
    h = h0
    for t in range(n_steps):
        x_ru, x_c = x_gates[t, :, : 2 * n_hidden], x_gates[t, :, 2 * n_hidden :]
        r, u = blocks(sigmoid(xp, x_ru + h @ w_ruh), 2)
        if reset_after:
            c = xp.tanh(x_c + r * (h @ w_ch + b_c[n_hidden:]))
        else:
            c = xp.tanh(x_c + (r * h) @ w_ch)
        h_new = u * h + (1 - u) * c
        valid = _valid_rows(seq_len, t)
        for out, value in zip(steps, (r, u, c, h_new)):
            out[t] = _keep(valid, value, 0)
        h = _keep(valid, h_new, h)
    return GRUSequence(*steps, h_final=h.copy())


def gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, seq, *, d_h=None, d_h_final=None,
                      reset_after=False, seq_len=None):
    """Backpropagation through time for ``gru_sequence``.

    Per step, with ``dh`` the gradient of the step's new state (carry plus ``d_h[t]``):

        dc_bar = dh∘(1-u)∘(1-c²);   du_bar = dh∘(h_prev-c)∘u(1-u)
        d_hr = dc_bar·W_chᵀ;  dr_bar = d_hr∘h_prev∘r(1-r)
        dh_prev = [dr_bar, du_bar]·W_ruhᵀ + d_hr∘r + dh∘u
    reset_after, with n = h_prev·W_ch + b_ch (recomputed for all steps in one matmul):
        d_n = dc_bar∘r;  dr_bar = dc_bar∘n∘r(1-r)
        dh_prev = [dr_bar, du_bar]·W_ruhᵀ + d_n·W_chᵀ + dh∘u

    After the loop, with ``dR, dU, dC`` (and ``dN = d_n``) stacked over all steps:
        dx = [dR, dU, dC]·[W_rux, W_cx]ᵀ;   dw_ru = [x_flatᵀ·[dR, dU] ; h_prev_flatᵀ·[dR, dU]]
        dw_c = [x_flatᵀ·dC ; (r∘h_prev)_flatᵀ·dC]   (reset_after: [x_flatᵀ·dC ; h_prev_flatᵀ·dN])
    """
    x = _running_inputs(x, seq_len)
    xp = namespace_of(x)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    w_ruh, w_ch = w_ru[n_in:], w_c[n_in:]
    h_prev = _previous_states(h0, seq.h)
    if reset_after:
        recurrent_candidate = (_flat(h_prev) @ w_ch + b_c[n_hidden:]).reshape(h_prev.shape)
        d_recurrent = xp.zeros((n_steps, n_batch, n_hidden), dtype=x.dtype)  # dN
    zeros = xp.zeros_like(h0)
    dh_next = xp.zeros_like(h0) if d_h_final is None else d_h_final.copy()
    # Gradients of the pre-activations [r, u, c] of every step: [dR, dU, dC].
    d_gates = xp.zeros((n_steps, n_batch, 3 * n_hidden), dtype=x.dtype)

    for t in reversed(range(n_steps)):
        valid = _valid_rows(seq_len, t)
        r, u, c = seq.r[t], seq.u[t], seq.c[t]
        dh = _keep(valid, dh_next if d_h is None else dh_next + d_h[t], zeros)
        dc_bar = dh * (1 - u) * (1 - c * c)
        du_bar = dh * (h_prev[t] - c) * u * (1 - u)
        if reset_after:
            d_n = dc_bar * r
            dr_bar = dc_bar * recurrent_candidate[t] * r * (1 - r)
            d_recurrent[t] = d_n
            dh_candidate = d_n @ w_ch.T
        else:
            d_hr = dc_bar @ w_ch.T
            dr_bar = d_hr * h_prev[t] * r * (1 - r)
            dh_candidate = d_hr * r
        d_gates[t] = xp.concatenate([dr_bar, du_bar, dc_bar], axis=1)
        dh_prev = d_gates[t, :, : 2 * n_hidden] @ w_ruh.T + dh_candidate + dh * u
        dh_next = _keep(valid, dh_prev, dh_next)

    d_gates_flat = _flat(d_gates)
    d_ru_flat, d_c_flat = d_gates_flat[:, : 2 * n_hidden], d_gates_flat[:, 2 * n_hidden :]
    w_x = xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)
    dx = (d_gates_flat @ w_x.T).reshape(n_steps, n_batch, n_in)
    dw_x = _flat(x).T @ d_gates_flat
    h_prev_flat = _flat(h_prev)
    if reset_after:  # the h-rows of w_c multiply h_prev, and n has its own bias b_ch
        dw_c_h = h_prev_flat.T @ _flat(d_recurrent)
        db_c = xp.concatenate([d_c_flat.sum(axis=0), _flat(d_recurrent).sum(axis=0)])
    else:  # the h-rows of w_c multiply r∘h_prev
        dw_c_h = (_flat(seq.r) * h_prev_flat).T @ d_c_flat
        db_c = d_c_flat.sum(axis=0)
    return GRUSequenceGrads(
        x=dx, h0=dh_next,
        w_ru=xp.concatenate([dw_x[:, : 2 * n_hidden], h_prev_flat.T @ d_ru_flat], axis=0),
        w_c=xp.concatenate([dw_x[:, 2 * n_hidden :], dw_c_h], axis=0),
        b_ru=d_ru_flat.sum(axis=0), b_c=db_c)
