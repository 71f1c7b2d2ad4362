"""The LSTM block cell, forward and gradient, written once for any array namespace.

Layout (TensorFlow's kernel, SPEC 2): the columns of ``w`` and entries of ``b`` are four
blocks of width H in the order i, ci, f, o; the rows of ``w`` are the x part then the h part.

    G  = [x, h_prev]·w + b                  split into Gi, Gc, Gf, Go
    i  = σ(Gi + cs_prev∘wci)
    ci = tanh(Gc)
    f  = σ(Gf + forget_bias + cs_prev∘wcf)
    cs = clip(i∘ci + f∘cs_prev, -cell_clip, cell_clip)
    co = tanh(cs)
    o  = σ(Go + cs∘wco)
    h  = o∘co

Every derivative is written in terms of the saved outputs: σ' = σ(1-σ), tanh' = 1-tanh².
"""

from __future__ import annotations

from .._dispatch import namespace_of
from .._types import LSTMCellGrads, LSTMCellState
from ._math import blocks, sigmoid


def lstm_cell(x, cs_prev, h_prev, w, b, *, wci=None, wcf=None, wco=None,
              forget_bias=1.0, cell_clip=None):
    """One LSTM step; returns ``LSTMCellState(i, cs, f, o, ci, co, h)``."""
    xp = namespace_of(x)
    gates = xp.concatenate([x, h_prev], axis=1) @ w + b
    return lstm_activations(gates, cs_prev, wci=wci, wcf=wcf, wco=wco,
                            forget_bias=forget_bias, cell_clip=cell_clip)


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


def lstm_cell_grad(x, cs_prev, h_prev, w, b, state, *, d_h=None, d_cs=None, wci=None,
                   wcf=None, wco=None, cell_clip=None, clip_grad="exact"):
    """Gradient of one LSTM step with respect to every input.

        dG = lstm_gate_grads(...)
        d[x, h_prev] = dG·wᵀ;   dw = [x, h_prev]ᵀ·dG;   db = Σ_batch dG
    """
    xp = namespace_of(x)
    d_gates, dcs_prev, dwci, dwcf, dwco = lstm_gate_grads(
        cs_prev, state, d_h=d_h, d_cs=d_cs, wci=wci, wcf=wcf, wco=wco,
        cell_clip=cell_clip, clip_grad=clip_grad)
    xh = xp.concatenate([x, h_prev], axis=1)
    dxh = d_gates @ w.T
    n_in = x.shape[1]
    return LSTMCellGrads(
        x=dxh[:, :n_in], cs_prev=dcs_prev, h_prev=dxh[:, n_in:],
        w=xh.T @ d_gates, b=d_gates.sum(axis=0), wci=dwci, wcf=dwcf, wco=dwco)
