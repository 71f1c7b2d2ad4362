"""The LSTM block cell and the LSTM over time, forward and gradient, written once for any array
namespace.

Layout (TensorFlow's kernel, docs/spec.md §2): the columns of ``w`` and entries of ``b`` are
four blocks of width H in the order i, ci, f, o; the rows of ``w`` are the x part then the h
part.

    G  = [x, h_prev]·w + b                  split into Gi, Gc, Gf, Go
    i  = σ(Gi + cs_prev∘wci)
    ci = tanh(Gc)
    f  = σ(Gf + forget_bias + cs_prev∘wcf)
    cs = clip(i∘ci + f∘cs_prev, -cell_clip, cell_clip)
    co = tanh(cs)
    o  = σ(Go + cs∘wco)
    h  = o∘co

Every derivative is written in terms of the saved outputs: σ' = σ(1-σ), tanh' = 1-tanh².

The sequence ops follow the matmul plan every backend follows (docs/spec.md §4):

- forward: the input part of every step's pre-activations is one matmul,
  ``x [T·B, I] · W_x`` (the x-rows of the weights); per step only ``h·W_h`` and the cell's
  elementwise math remain;
- backward: the gate gradients of all steps are kept in one ``[T, B, 4H]`` array, so after
  the loop ``dx = dG·W_xᵀ`` is one matmul and the weight gradients are two,
  ``dW_x = x_flatᵀ·dG`` and ``dW_h = h_prev_flatᵀ·dG``; per step only ``dG_t·W_hᵀ`` remains.

Per-example lengths ``seq_len [B]`` follow PyTorch's packed sequences: for ``t >= seq_len[b]``
row b's per-step outputs are zero and its state is frozen, so the final state is the state
after its last valid step. In the backward pass a frozen row passes the gradient of its
state straight through the step, and its gate gradients are zero.

The four ops take the backend protocol's arguments (``gradcells._core.types.LSTMBackend``):
the arrays, an ``LSTMWeights`` and an ``LSTMSettings``.
"""

from __future__ import annotations

from .._core import plan
from .._core.arrays import namespace_of
from .._core.types import LSTMCellGrads, LSTMCellState, LSTMSequence, LSTMSequenceGrads
from ._common import blocks, keep, sigmoid, valid_rows


def lstm_cell(x, cs_prev, h_prev, weights, settings):
    """One LSTM step; returns ``LSTMCellState(i, cs, f, o, ci, co, h)`` (``h [B, P]``)."""
    xp = namespace_of(x)
    w, b, wci, wcf, wco, w_proj = weights
    gates = xp.concatenate([x, h_prev], axis=1) @ w + b
    state = lstm_activations(gates, cs_prev, wci=wci, wcf=wcf, wco=wco,
                             forget_bias=settings.forget_bias, cell_clip=settings.cell_clip)
    return state._replace(h=lstm_project(xp, state.h, w_proj, settings.proj_clip))


def lstm_project(xp, m, w_proj, proj_clip):
    """The projection (docs/spec.md §9.1): ``h = clip(m·w_proj, ±proj_clip)`` from
    ``m = o∘co [B, H]``; ``m`` itself without a projection."""
    if w_proj is None:
        return m
    h = m @ w_proj
    return h if proj_clip is None else xp.clip(h, -proj_clip, proj_clip)


def lstm_projection_grad(xp, state, d_h, w_proj, proj_clip, clip_grad):
    """The projection's backward step: ``(dm, dw_proj)`` from the gradient ``d_h [B, P]`` of
    the projected ``h`` (``(d_h, None)`` without a projection):

        m = o∘co;   dh_raw = d_h, zeroed where |m·w_proj| > proj_clip (clip_grad="exact")
        dm = dh_raw·w_projᵀ;   dw_proj = mᵀ·dh_raw

    The unclipped ``m·w_proj`` is recomputed, so the mask is exact; on the boundary itself
    the gradient passes (as for the cell clip).
    """
    if w_proj is None:
        return d_h, None
    m = state.o * state.co
    if d_h is None:
        d_h = xp.zeros((m.shape[0], w_proj.shape[1]), dtype=m.dtype)
    if proj_clip is not None and clip_grad == "exact":
        d_h = xp.where(abs(m @ w_proj) <= proj_clip, d_h, xp.zeros((), dtype=d_h.dtype))
    return d_h @ w_proj.T, m.T @ d_h


def lstm_activations(gates, cs_prev, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
                     cell_clip=None):
    """The LSTM cell's elementwise step from its pre-activations ``G [B, 4H]`` (icfo):

        i = σ(Gi + cs_prev∘wci);  ci = tanh(Gc);  f = σ(Gf + forget_bias + cs_prev∘wcf)
        cs = clip(i∘ci + f∘cs_prev);  co = tanh(cs);  o = σ(Go + cs∘wco);  h = o∘co
    """
    xp = namespace_of(gates)
    gi, gc, gf, go = blocks(gates, 4)
    peephole = wci is not None
    i = sigmoid(xp, gi + cs_prev * wci if peephole else gi)
    ci = xp.tanh(gc)
    f = sigmoid(xp, gf + forget_bias + cs_prev * wcf if peephole else gf + forget_bias)
    cs = i * ci + f * cs_prev
    if cell_clip is not None:
        cs = xp.clip(cs, -cell_clip, cell_clip)
    co = xp.tanh(cs)
    o = sigmoid(xp, go + cs * wco if peephole else go)
    return LSTMCellState(i, cs, f, o, ci, co, o * co)


def clip_pass_mask(state, cs_prev, cell_clip):
    """1 where the gradient passes the clip (|i∘ci + f∘cs_prev| <= cell_clip), else 0.

    The unclipped cell state is recomputed from the saved gates with the forward's own
    expression, so the mask is exact; on the boundary itself the gradient passes.
    """
    cs_raw = state.i * state.ci + state.f * cs_prev
    return abs(cs_raw) <= cell_clip


def lstm_gate_grads(cs_prev, state, *, d_h=None, d_cs=None, wci=None, wcf=None, wco=None,
                    cell_clip=None, clip_grad="exact"):
    """The elementwise backward step: dL/dG ``[B, 4H]`` (icfo), dL/dcs_prev and the peephole
    gradients ``(dwci, dwcf, dwco)`` (None without peepholes).

        do      = d_h∘co∘o(1-o)
        dcs     = d_h∘o∘(1-co²) + d_cs + do∘wco          (dL/d clipped cs)
        dcs_raw = dcs, zeroed where the clip was active (clip_grad="exact")
        di = dcs_raw∘ci∘i(1-i);  dci = dcs_raw∘i∘(1-ci²);  df = dcs_raw∘cs_prev∘f(1-f)
        dcs_prev = dcs_raw∘f + di∘wci + df∘wcf
    """
    xp = namespace_of(cs_prev)
    i, cs, f, o, ci, co, _ = state
    zeros = xp.zeros_like(cs_prev)
    d_h = zeros if d_h is None else d_h
    d_cs = zeros if d_cs is None else d_cs
    peephole = wci is not None

    do = d_h * co * o * (1 - o)
    dcs = d_h * o * (1 - co * co) + d_cs
    if peephole:
        dcs = dcs + do * wco
    if cell_clip is not None and clip_grad == "exact":
        dcs = xp.where(clip_pass_mask(state, cs_prev, cell_clip), dcs, zeros)
    di = dcs * ci * i * (1 - i)
    dci = dcs * i * (1 - ci * ci)
    df = dcs * cs_prev * f * (1 - f)
    d_gates = xp.concatenate([di, dci, df, do], axis=1)

    dcs_prev = dcs * f
    if not peephole:
        return d_gates, dcs_prev, None, None, None
    dcs_prev = dcs_prev + di * wci + df * wcf
    dwci = (di * cs_prev).sum(axis=0)
    dwcf = (df * cs_prev).sum(axis=0)
    dwco = (do * cs).sum(axis=0)
    return d_gates, dcs_prev, dwci, dwcf, dwco


def lstm_cell_grad(x, cs_prev, h_prev, weights, state, settings, *, d_h=None, d_cs=None,
                   clip_grad="exact"):
    """Gradient of one LSTM step with respect to every input.

        dm, dw_proj = lstm_projection_grad(...)      (dm = d_h without a projection)
        dG = lstm_gate_grads(..., d_h=dm)
        d[x, h_prev] = dG·wᵀ;   dw = [x, h_prev]ᵀ·dG;   db = Σ_batch dG
    """
    xp = namespace_of(x)
    w, _, wci, wcf, wco, w_proj = weights
    d_m, dw_proj = lstm_projection_grad(xp, state, d_h, w_proj, settings.proj_clip, clip_grad)
    d_gates, dcs_prev, dwci, dwcf, dwco = lstm_gate_grads(
        cs_prev, state, d_h=d_m, d_cs=d_cs, wci=wci, wcf=wcf, wco=wco,
        cell_clip=settings.cell_clip, clip_grad=clip_grad)
    xh = xp.concatenate([x, h_prev], axis=1)
    dxh = d_gates @ w.T
    n_in = x.shape[1]
    return LSTMCellGrads(
        x=dxh[:, :n_in], cs_prev=dcs_prev, h_prev=dxh[:, n_in:], w=xh.T @ d_gates,
        b=d_gates.sum(axis=0), wci=dwci, wcf=dwcf, wco=dwco, w_proj=dw_proj)


def lstm_sequence(x, cs0, h0, weights, settings):
    """The LSTM block cell over ``x [T, B, I]`` from ``(cs0, h0)``.

    Returns ``LSTMSequence(i, cs, f, o, ci, co, h, cs_final, h_final)``: every step's
    outputs ``[T, B, H]`` (zero past a row's length) and the final states ``[B, H]``.
    """
    xp = namespace_of(x)
    w, b, wci, wcf, wco, w_proj = weights
    seq_len = settings.seq_len
    x = plan.running_inputs(xp, x, seq_len)
    n_steps, n_batch, n_in = x.shape
    w_h = w[n_in:]
    x_gates = plan.input_projection(x, w[:n_in], b)
    steps = [xp.zeros((n_steps, n_batch, (h0 if field == "h" else cs0).shape[1]), dtype=x.dtype)
             for field in LSTMCellState._fields]
    cs, h = cs0, h0
    for t in range(n_steps):
        state = lstm_activations(x_gates[t] + h @ w_h, cs, wci=wci, wcf=wcf, wco=wco,
                                 forget_bias=settings.forget_bias, cell_clip=settings.cell_clip)
        state = state._replace(h=lstm_project(xp, state.h, w_proj, settings.proj_clip))
        valid = valid_rows(seq_len, t)
        for out, value in zip(steps, state):
            out[t] = keep(valid, value, 0)
        cs, h = keep(valid, state.cs, cs), keep(valid, state.h, h)
    return LSTMSequence(*steps, cs_final=cs.copy(), h_final=h.copy())


def lstm_sequence_grad(x, cs0, h0, weights, seq, settings, *, d_h=None, d_cs=None,
                       d_h_final=None, d_cs_final=None, clip_grad="exact"):
    """Backpropagation through time for ``lstm_sequence``.

    Walking back from the final states, the gradient of the state after step t is carried
    in ``(dh_next, dcs_next)``; a running row adds the step's upstream ``d_h[t], d_cs[t]``
    and goes through ``lstm_gate_grads``, a frozen row passes the carry through unchanged:

        dm_t, dw_proj_t = lstm_projection_grad(step t, dh_next + d_h[t])   (dm_t = d_h without)
        dG_t = lstm_gate_grads(cs_prev_t, step t, d_h = dm_t, d_cs = dcs_next + d_cs[t])
        dh_next = dG_t·W_hᵀ;   dcs_next = dcs_prev from the same call;   dw_proj = Σ_t dw_proj_t
        dx = dG·W_xᵀ;  dw = [x_flatᵀ·dG ; h_prev_flatᵀ·dG];  db = Σ_{t,b} dG
    """
    xp = namespace_of(x)
    w, _, wci, wcf, wco, w_proj = weights
    seq_len = settings.seq_len
    x = plan.running_inputs(xp, x, seq_len)
    n_steps, n_batch, n_in = x.shape
    w_h = w[n_in:]
    cs_prev = plan.previous_states(xp, cs0, seq.cs)
    zeros, cs_zeros = xp.zeros_like(h0), xp.zeros_like(cs0)
    dh_next = zeros if d_h_final is None else d_h_final.copy()
    dcs_next = cs_zeros if d_cs_final is None else d_cs_final.copy()
    d_gates = xp.zeros((n_steps, n_batch, w.shape[1]), dtype=x.dtype)
    # The peephole and projection gradients, summed over the steps.
    sums = [xp.zeros(cs0.shape[1], dtype=x.dtype) for _ in range(3)]
    dw_proj = None if w_proj is None else xp.zeros_like(w_proj)

    for t in reversed(range(n_steps)):
        valid = valid_rows(seq_len, t)
        dh_t = keep(valid, dh_next if d_h is None else dh_next + d_h[t], zeros)
        dcs_t = dcs_next if d_cs is None else dcs_next + d_cs[t]
        step = LSTMCellState(*(a[t] for a in seq[:7]))
        d_m, dw_proj_t = lstm_projection_grad(xp, step, dh_t, w_proj, settings.proj_clip,
                                              clip_grad)
        d_gates[t], dcs_prev, *d_peepholes = lstm_gate_grads(
            cs_prev[t], step, d_h=d_m, d_cs=keep(valid, dcs_t, cs_zeros),
            wci=wci, wcf=wcf, wco=wco, cell_clip=settings.cell_clip, clip_grad=clip_grad)
        dh_next = keep(valid, d_gates[t] @ w_h.T, dh_next)
        dcs_next = keep(valid, dcs_prev, dcs_next)
        if wci is not None:
            sums = [acc + g for acc, g in zip(sums, d_peepholes)]
        if w_proj is not None:
            dw_proj = dw_proj + dw_proj_t

    dx, dw, db = _weight_grads(xp, x, plan.previous_states(xp, h0, seq.h), w, d_gates)
    dwci, dwcf, dwco = sums if wci is not None else (None, None, None)
    return LSTMSequenceGrads(x=dx, cs0=dcs_next, h0=dh_next, w=dw, b=db,
                             wci=dwci, wcf=dwcf, wco=dwco, w_proj=dw_proj)


def _weight_grads(xp, x, h_prev, w, d_gates):
    """After the backward loop, from every step's gate gradients ``dG [T, B, 4H]``:
    ``dx = dG·W_xᵀ``, ``dw = [x_flatᵀ·dG ; h_prev_flatᵀ·dG]`` and ``db = Σ_{t,b} dG``."""
    n_steps, n_batch, n_in = x.shape
    d_flat = plan.flat(d_gates)
    dx = (d_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = xp.concatenate([plan.flat(x).T @ d_flat, plan.flat(h_prev).T @ d_flat], axis=0)
    return dx, dw, d_flat.sum(axis=0)
