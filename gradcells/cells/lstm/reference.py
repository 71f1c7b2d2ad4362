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

The layer-normalised LSTM (docs/spec.md §9.2) normalises the two parts of ``G`` and the cell
state before its tanh, each over its row with biased variance (``xpmath.layer_norm``):

    G  = LN(x·w_x; γ_x, β_x) + LN(h_prev·w_h; γ_h, β_h) + b
    c̃  = clip(i∘ci + f∘cs_prev);   n = LN(c̃; γ_c, β_c);   co = tanh(n)
    cs = c̃ (ln_carry="raw")  or  n ("normalized");   o = σ(Go + cs∘wco)

Its gradient needs the normalised values ``ẑ`` and the inverse deviations ``r`` of the three
norms. The result keeps exactly the arrays it keeps without a layer norm, so the gradient
recomputes them: ``c̃`` from the saved gates (as the clip mask is), ``x·w_x`` and
``h_prev·w_h`` from the inputs, all steps at once (one matmul each).

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

The four ops take the backend protocol's arguments (``.spec.LSTMBackend``):
the arrays, an ``LSTMWeights`` and an ``LSTMSettings``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..._core import plan
from ..._core.arrays import namespace_of
from ..._core.xpmath import (
    at_step,
    blocks,
    filled,
    gradient_jvp,
    keep,
    layer_norm_grad,
    layer_norm_jvp,
    layer_norm_stats,
    masked,
    sigmoid,
    valid_rows,
    weights_part,
    zoned,
    zoneout_grad,
)
from ..._core.xpmath import layer_norm as _layer_norm  # the keyword layer_norm is the parameters
from .spec import (
    GATE_UPSTREAM,
    LSTMCellGrads,
    LSTMCellState,
    LSTMNorm,
    LSTMSequence,
    LSTMSequenceGrads,
)


def lstm_cell(x, cs_prev, h_prev, weights, settings):
    """One LSTM step; returns ``LSTMCellState(i, cs, f, o, ci, co, h)`` (``h [B, P]``)."""
    xp = namespace_of(x)
    w, b, wci, wcf, wco, w_proj, norm = weights
    n_in = x.shape[1]
    if norm is None:
        gates = xp.concatenate([x, h_prev], axis=1) @ w + b
    else:
        gates = (lstm_input_gates(xp, x[None], w[:n_in], b, norm, settings.ln_epsilon)[0]
                 + lstm_recurrent_gates(xp, h_prev @ w[n_in:], norm, settings.ln_epsilon))
    state = lstm_activations(gates, cs_prev, wci=wci, wcf=wcf, wco=wco,
                             forget_bias=settings.forget_bias, cell_clip=settings.cell_clip,
                             **_norm_keywords(weights, settings))
    return state._replace(h=lstm_project(xp, state.h, w_proj, settings.proj_clip))


def lstm_input_gates(xp, x, w_x, b, norm, epsilon):
    """The input part of every step's pre-activations, one matmul for ``x [T, B, I]``:
    ``x·W_x + b``, or with a layer norm ``LN(x·W_x; γ_x, β_x) + b``."""
    if norm is None:
        return plan.input_projection(x, w_x, b)
    z = plan.input_projection(x, w_x, xp.zeros((), dtype=x.dtype))
    return _layer_norm(xp, z, norm.gamma_x, norm.beta_x, epsilon)[0] + b


def lstm_recurrent_gates(xp, z_h, norm, epsilon):
    """The recurrent part ``z_h = h_prev·W_h`` of the pre-activations as they enter ``G``:
    itself, or with a layer norm ``LN(z_h; γ_h, β_h)``."""
    return z_h if norm is None else _layer_norm(xp, z_h, norm.gamma_h, norm.beta_h, epsilon)[0]


def _norm_keywords(weights, settings):
    """The layer-norm keywords of ``lstm_activations`` and ``lstm_gate_grads``."""
    if weights.layer_norm is None:
        return {}
    return {"layer_norm": weights.layer_norm, "ln_epsilon": settings.ln_epsilon,
            "ln_carry": settings.ln_carry}


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
                     cell_clip=None, layer_norm=None, ln_epsilon=1e-5, ln_carry="raw"):
    """The LSTM cell's elementwise step from its pre-activations ``G [B, 4H]`` (icfo):

        i = σ(Gi + cs_prev∘wci);  ci = tanh(Gc);  f = σ(Gf + forget_bias + cs_prev∘wcf)
        cs = clip(i∘ci + f∘cs_prev);  co = tanh(cs);  o = σ(Go + cs∘wco);  h = o∘co

    With ``layer_norm`` (an ``LSTMNorm``; its ``gamma_c, beta_c`` act here) the clipped
    ``c̃`` is normalised first, ``co = tanh(LN(c̃))``, and ``cs`` is ``c̃`` or ``LN(c̃)`` as
    ``ln_carry`` says.
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
    if layer_norm is None:
        co = xp.tanh(cs)
    else:
        normed = _layer_norm(xp, cs, layer_norm.gamma_c, layer_norm.beta_c, ln_epsilon)[0]
        co = xp.tanh(normed)
        cs = normed if ln_carry == "normalized" else cs
    o = sigmoid(xp, go + cs * wco if peephole else go)
    return LSTMCellState(i, cs, f, o, ci, co, o * co)


def clip_pass_mask(state, cs_prev, cell_clip):
    """1 where the gradient passes the clip (|i∘ci + f∘cs_prev| <= cell_clip), else 0.

    The unclipped cell state is recomputed from the saved gates with the forward's own
    expression, so the mask is exact; on the boundary itself the gradient passes.
    """
    cs_raw = state.i * state.ci + state.f * cs_prev
    return abs(cs_raw) <= cell_clip


class GateGrads(NamedTuple):
    """What ``lstm_gate_grads`` returns: dL/dG ``gates [B, 4H]`` (icfo), dL/d``cs_prev``, the
    peephole gradients and the cell norm's ``gamma_c, beta_c`` (None where absent)."""

    gates: Any
    cs_prev: Any
    wci: Any = None
    wcf: Any = None
    wco: Any = None
    gamma_c: Any = None
    beta_c: Any = None


def lstm_gate_grads(cs_prev, state, *, d_h=None, d_cs=None, gates=None, wci=None, wcf=None,
                    wco=None, cell_clip=None, clip_grad="exact", layer_norm=None,
                    ln_epsilon=1e-5, ln_carry="raw"):
    """The elementwise backward step, a ``GateGrads``. ``gates``: the upstream gradients of
    the step's gate fields by name (``d_i``, ``d_f``, ``d_o``, ``d_ci``, ``d_co``; a missing
    one or None: zero), which enter where their gate's pre-activation gradient is formed
    (docs/spec.md §16.1):

        do      = d_h∘co∘o(1-o) + d_o∘o(1-o);   dco = d_h∘o∘(1-co²) + d_co∘(1-co²)
        dcs     = dco + d_cs + do∘wco                       (dL/d clipped cs; dco through tanh)
        dcs_raw = dcs, zeroed where the clip was active (clip_grad="exact")
        di  = dcs_raw∘ci∘i(1-i) + d_i∘i(1-i);   dci = dcs_raw∘i∘(1-ci²) + d_ci∘(1-ci²)
        df  = dcs_raw∘cs_prev∘f(1-f) + d_f∘f(1-f)
        dcs_prev = dcs_raw∘f + di∘wci + df∘wcf

    The gates' own upstreams pass no clip: i, ci, f and o are not clipped. With a layer
    norm, ``dco`` reaches the clipped ``c̃`` through ``LN(c̃)`` instead
    (``lstm_cell_norm_grad``: ``co = tanh(n)``, so ``dco`` is dL/dn there), and so does
    the carried state's gradient when ``ln_carry`` is "normalized".
    """
    xp = namespace_of(cs_prev)
    i, cs, f, o, ci, co, _ = state
    zeros = xp.zeros_like(cs_prev)
    d_h = zeros if d_h is None else d_h
    d_cs = zeros if d_cs is None else d_cs
    up = {} if gates is None else {k: v for k, v in gates.items() if v is not None}
    peephole = wci is not None

    do = d_h * co * o * (1 - o)
    dco = d_h * o * (1 - co * co)
    do = _plus(do, _through(up, "d_o", o * (1 - o)))         # the gates' own upstreams
    dco = _plus(dco, _through(up, "d_co", 1 - co * co))
    dcs = d_cs + do * wco if peephole else d_cs  # the carried cs's gradient
    d_norm = (None, None)
    if layer_norm is None:
        dcs = dco + dcs
    else:
        dcs, *d_norm = lstm_cell_norm_grad(xp, cs_prev, state, dco, dcs, layer_norm,
                                           ln_epsilon, ln_carry, cell_clip)
    if cell_clip is not None and clip_grad == "exact":
        dcs = xp.where(clip_pass_mask(state, cs_prev, cell_clip), dcs, zeros)
    di = dcs * ci * i * (1 - i)
    dci = dcs * i * (1 - ci * ci)
    df = dcs * cs_prev * f * (1 - f)
    di = _plus(di, _through(up, "d_i", i * (1 - i)))          # the gates' own upstreams
    dci = _plus(dci, _through(up, "d_ci", 1 - ci * ci))
    df = _plus(df, _through(up, "d_f", f * (1 - f)))
    d_gates = xp.concatenate([di, dci, df, do], axis=1)

    dcs_prev = dcs * f
    if not peephole:
        return GateGrads(d_gates, dcs_prev, None, None, None, *d_norm)
    dcs_prev = dcs_prev + di * wci + df * wcf
    dwci = (di * cs_prev).sum(axis=0)
    dwcf = (df * cs_prev).sum(axis=0)
    dwco = (do * cs).sum(axis=0)
    return GateGrads(d_gates, dcs_prev, dwci, dwcf, dwco, *d_norm)


def lstm_cell_candidate(xp, state, cs_prev, cell_clip):
    """The step's clipped cell state before any layer norm or zoneout, recomputed from the
    saved gates with the forward's expression: ``c̃ = clip(i∘ci + f∘cs_prev)``."""
    c_tilde = state.i * state.ci + state.f * cs_prev
    return c_tilde if cell_clip is None else xp.clip(c_tilde, -cell_clip, cell_clip)


def lstm_cell_norm_grad(xp, cs_prev, state, dco, dcs, norm, epsilon, carry, cell_clip):
    """The cell norm's backward: ``(dc̃, dγ_c, dβ_c)`` from ``dco`` (through ``co =
    tanh(n)``, ``n = LN(c̃)``) and the carried state's gradient ``dcs``:

        raw:         dn = dco;         dc̃ = dcs + LN'ᵀ·(dn)
        normalized:  dn = dco + dcs;   dc̃ = LN'ᵀ·(dn)
        dγ_c = Σ_batch dn∘ĉ;   dβ_c = Σ_batch dn

    ``ĉ`` and ``r`` are recomputed from the clipped ``c̃ = clip(i∘ci + f∘cs_prev)``.
    """
    c_tilde = lstm_cell_candidate(xp, state, cs_prev, cell_clip)
    _, c_hat, rstd = _layer_norm(xp, c_tilde, norm.gamma_c, norm.beta_c, epsilon)
    dn = dco + dcs if carry == "normalized" else dco
    d_tilde, dgamma, dbeta = layer_norm_grad(dn, norm.gamma_c, c_hat, rstd)
    return (d_tilde if carry == "normalized" else d_tilde + dcs), dgamma, dbeta


def lstm_cell_grad(x, cs_prev, h_prev, weights, state, settings, *, d_h=None, d_cs=None,
                   d_i=None, d_f=None, d_o=None, d_ci=None, d_co=None, clip_grad="exact"):
    """Gradient of one LSTM step with respect to every input, from the upstream gradients
    of every field of its result (``d_i, d_f, d_o, d_ci, d_co`` those of the gates, the
    projection's ``m = o∘co`` before it):

        dm, dw_proj = lstm_projection_grad(...)      (dm = d_h without a projection)
        dG = lstm_gate_grads(..., d_h=dm, gates={d_i, d_f, d_o, d_ci, d_co})
        dz_x = dz_h = dG      (a layer norm: each through its norm, lstm_gate_norm_grads)
        dx = dz_x·W_xᵀ;   dh_prev = dz_h·W_hᵀ;   dw = [xᵀ·dz_x ; h_prevᵀ·dz_h];   db = Σ dG
    """
    xp = namespace_of(x)
    w, _, wci, wcf, wco, w_proj, norm = weights
    n_in = x.shape[1]
    d_m, dw_proj = lstm_projection_grad(xp, state, d_h, w_proj, settings.proj_clip, clip_grad)
    gates = {"d_i": d_i, "d_f": d_f, "d_o": d_o, "d_ci": d_ci, "d_co": d_co}
    gg = lstm_gate_grads(cs_prev, state, d_h=d_m, d_cs=d_cs, gates=gates, wci=wci, wcf=wcf,
                         wco=wco, cell_clip=settings.cell_clip, clip_grad=clip_grad,
                         **_norm_keywords(weights, settings))
    dz_x = dz_h = gg.gates
    d_norm = None
    if norm is not None:
        dz_x, dz_h, *d_norm = lstm_gate_norm_grads(
            gg.gates, norm, *lstm_gate_norm_stats(xp, x, h_prev, w, settings.ln_epsilon))
        d_norm = LSTMNorm(*d_norm, gg.gamma_c, gg.beta_c)
    return LSTMCellGrads(
        x=dz_x @ w[:n_in].T, cs_prev=gg.cs_prev, h_prev=dz_h @ w[n_in:].T,
        w=xp.concatenate([x.T @ dz_x, h_prev.T @ dz_h], axis=0), b=gg.gates.sum(axis=0),
        wci=gg.wci, wcf=gg.wcf, wco=gg.wco, w_proj=dw_proj, layer_norm=d_norm)


def lstm_gate_norm_stats(xp, x, h_prev, w, epsilon):
    """``(x̂, r_x), (ĥ, r_h)`` of the gate norms ``LN(x·W_x)`` and ``LN(h_prev·W_h)``,
    recomputed from the inputs (``[B, ·]``, or ``[T, B, ·]`` for every step at once)."""
    n_in = x.shape[-1]
    return (layer_norm_stats(xp, x @ w[:n_in], epsilon),
            layer_norm_stats(xp, h_prev @ w[n_in:], epsilon))


def lstm_gate_norm_grads(d_gates, norm, x_stats, h_stats):
    """The gate norms' backward from ``dG``, which reaches both parts of ``G``:

        dz_x, dγ_x, dβ_x = layer_norm_grad(dG, γ_x, x̂, r_x)      (dz_x: of x·W_x)
        dz_h, dγ_h, dβ_h = layer_norm_grad(dG, γ_h, ĥ, r_h)      (dz_h: of h_prev·W_h)

    Returns ``(dz_x, dz_h, dγ_x, dβ_x, dγ_h, dβ_h)``."""
    dz_x, dgamma_x, dbeta_x = layer_norm_grad(d_gates, norm.gamma_x, *x_stats)
    dz_h, dgamma_h, dbeta_h = layer_norm_grad(d_gates, norm.gamma_h, *h_stats)
    return dz_x, dz_h, dgamma_x, dbeta_x, dgamma_h, dbeta_h


def lstm_sequence(x, cs0, h0, weights, settings):
    """The LSTM block cell over ``x [T, B, I]`` from ``(cs0, h0)``.

    Returns ``LSTMSequence(i, cs, f, o, ci, co, h, cs_final, h_final)``: every step's
    outputs ``[T, B, H]`` (zero past a row's length) and the final states ``[B, H]``.
    """
    xp = namespace_of(x)
    w, b, wci, wcf, wco, w_proj, norm = weights
    seq_len, epsilon = settings.seq_len, settings.ln_epsilon
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, n_in = x.shape
    w_h = w[n_in:]
    x_gates = lstm_input_gates(xp, x, w[:n_in], b, norm, epsilon)
    steps = [xp.zeros((n_steps, n_batch, (h0 if field == "h" else cs0).shape[1]), dtype=x.dtype)
             for field in LSTMCellState._fields]
    cs, h = cs0, h0
    for t in range(n_steps):
        z_h = masked(h, settings.recurrent_mask) @ w_h
        gates = x_gates[t] + lstm_recurrent_gates(xp, z_h, norm, epsilon)
        state = lstm_activations(gates, cs, wci=wci, wcf=wcf, wco=wco,
                                 forget_bias=settings.forget_bias, cell_clip=settings.cell_clip,
                                 **_norm_keywords(weights, settings))
        state = state._replace(  # the projection, then zoneout's mix with the old states
            cs=zoned(at_step(settings.zoneout_cs, t), cs, state.cs),
            h=zoned(at_step(settings.zoneout_h, t), h,
                    lstm_project(xp, state.h, w_proj, settings.proj_clip)))
        valid = valid_rows(seq_len, t)
        for out, value in zip(steps, state, strict=True):
            out[t] = keep(valid, value, 0)
        cs, h = keep(valid, state.cs, cs), keep(valid, state.h, h)
    return LSTMSequence(*steps, cs_final=cs.copy(), h_final=h.copy())


def lstm_sequence_grad(x, cs0, h0, weights, seq, settings, *, d_h=None, d_cs=None,
                       d_h_final=None, d_cs_final=None, d_i=None, d_f=None, d_o=None,
                       d_ci=None, d_co=None, clip_grad="exact"):
    """Backpropagation through time for ``lstm_sequence``.

    Walking back from the final states, the gradient of the state after step t is carried
    in ``(dh_next, dcs_next)``; a running row adds the step's upstream ``d_h[t], d_cs[t]``
    and goes through ``lstm_gate_grads``, a frozen row passes the carry through unchanged:

        dm_t, dw_proj_t = lstm_projection_grad(step t, dh_next + d_h[t])   (dm_t = d_h without)
        dG_t = lstm_gate_grads(cs_prev_t, step t, dm_t, dcs_next + d_cs[t], d_i[t], ..., d_co[t])
        dz_h_t = dG_t   (a layer norm: layer_norm_grad(dG_t, γ_h, ĥ_t, r_t))
        dh_next = dz_h_t·W_hᵀ;  dcs_next = dcs_prev from the same call;  dw_proj = Σ_t dw_proj_t

    and after the loop the weight gradients (``_weight_grads``). The masks (docs/spec.md
    §11.3): the matmuls saw ``x∘m_in`` and ``h_prev∘m_rec``, so ``dx`` and the matmul's
    part of ``dh_next`` are masked alike; zoneout splits g into ``(1-z)∘g``, ``z∘g``."""
    xp = namespace_of(x)
    w, _, wci, _, _, w_proj, norm = weights
    seq_len, m_rec = settings.seq_len, settings.recurrent_mask
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, n_in = x.shape
    w_h = w[n_in:]
    cs_prev = plan.previous_states(xp, cs0, seq.cs)
    h_prev = masked(plan.previous_states(xp, h0, seq.h), m_rec)   # what the matmul saw
    zeros, cs_zeros = xp.zeros_like(h0), xp.zeros_like(cs0)
    dh_next = zeros if d_h_final is None else d_h_final.copy()
    dcs_next = cs_zeros if d_cs_final is None else d_cs_final.copy()
    d_gates = xp.zeros((n_steps, n_batch, w.shape[1]), dtype=x.dtype)
    stats = None if norm is None else lstm_gate_norm_stats(xp, x, h_prev, w, settings.ln_epsilon)
    dz_h = d_gates if norm is None else xp.zeros_like(d_gates)
    # The peephole, cell-norm and projection gradients, summed over the steps.
    sums = [xp.zeros(cs0.shape[1], dtype=x.dtype) for _ in range(5)]
    dw_proj = None if w_proj is None else xp.zeros_like(w_proj)

    for t in reversed(range(n_steps)):
        valid = valid_rows(seq_len, t)
        dh_t, dh_old = zoneout_grad(at_step(settings.zoneout_h, t),
                                    dh_next if d_h is None else dh_next + d_h[t])
        dcs_t, dcs_old = zoneout_grad(at_step(settings.zoneout_cs, t),
                                      dcs_next if d_cs is None else dcs_next + d_cs[t])
        # After the split: a zoneout mask past a row's length is never read.
        gg, dw_proj_t = _step_grads(xp, _at(seq, t), cs_prev[t], keep(valid, dh_t, zeros),
                                    keep(valid, dcs_t, cs_zeros), _gates_at(
                                        (d_i, d_f, d_o, d_ci, d_co), t, valid, cs_zeros),
                                    weights, settings, clip_grad)
        d_gates[t] = gg.gates
        if norm is not None:  # the recurrent part's norm, step by step
            dz_h[t] = layer_norm_grad(gg.gates, norm.gamma_h, *(a[t] for a in stats[1]))[0]
        dh_next = keep(valid, _plus(masked(dz_h[t] @ w_h.T, m_rec), dh_old), dh_next)
        dcs_next = keep(valid, _plus(gg.cs_prev, dcs_old), dcs_next)
        sums = [acc if g is None else acc + g for acc, g in zip(sums, _sums(gg), strict=True)]
        dw_proj = None if w_proj is None else dw_proj + dw_proj_t

    dx, dw, db, d_norm = _weight_grads(xp, x, h_prev, w, d_gates, dz_h, norm, stats)
    dwci, dwcf, dwco = sums[:3] if wci is not None else (None, None, None)
    dx = plan.running_inputs(xp, masked(dx, settings.input_mask), seq_len)
    return LSTMSequenceGrads(x=dx, cs0=dcs_next, h0=dh_next,
                             w=dw, b=db, wci=dwci, wcf=dwcf, wco=dwco, w_proj=dw_proj,
                             layer_norm=d_norm and LSTMNorm(*d_norm, *sums[3:]))


def _at(seq, t):
    """Step t of an ``LSTMSequence``'s every-step arrays, an ``LSTMCellState`` (by name)."""
    return LSTMCellState(*(getattr(seq, name)[t] for name in LSTMCellState._fields))


def _gates_at(gates, t, valid, zeros):
    """Step t's upstream gradients of the gate fields ``(d_i, ..., d_co)`` by keyword (None
    where absent), zero in the rows past their length (never read there)."""
    return {k: None if g is None else keep(valid, g[t], zeros)
            for k, g in zip(GATE_UPSTREAM, gates, strict=True)}


def _sums(gg):
    """A ``GateGrads``'s parts summed over the steps: the peepholes' and the cell norm's."""
    return gg.wci, gg.wcf, gg.wco, gg.gamma_c, gg.beta_c


def _step_grads(xp, step, cs_prev, d_h, d_cs, gates, weights, settings, clip_grad):
    """One step's backward from the gradients of its new (unzoned) states and of its gates
    (``gates``, by keyword): the projection's, then the gates' (``lstm_projection_grad``,
    ``lstm_gate_grads``). Returns ``(GateGrads, dw_proj)``."""
    step = _unzoned(xp, step, cs_prev, weights, settings)
    d_m, dw_proj = lstm_projection_grad(xp, step, d_h, weights.w_proj, settings.proj_clip,
                                        clip_grad)
    gg = lstm_gate_grads(cs_prev, step, d_h=d_m, d_cs=d_cs, gates=gates, wci=weights.wci,
                         wcf=weights.wcf, wco=weights.wco, cell_clip=settings.cell_clip,
                         clip_grad=clip_grad, **_norm_keywords(weights, settings))
    return gg, dw_proj


def _plus(a, b):
    """``a + b``, or ``a`` when ``b`` is None."""
    return a if b is None else a + b


def _through(upstream, name, slope):
    """The upstream gradient ``upstream[name]`` of a gate's activation times the
    activation's derivative ``slope`` (σ' = σ(1-σ), tanh' = 1-tanh²): its part of the gate's
    pre-activation gradient; None without it."""
    g = upstream.get(name)
    return None if g is None else g * slope


def _unzoned(xp, step, cs_prev, weights, settings):
    """A step's saved state with the cell state the step itself computed, before zoneout
    mixed it with the old one (recomputed from the gates as the clip mask is; with a
    normalising carry, its layer norm): what the gate gradients read. Without
    ``zoneout_cs`` the saved state is that already."""
    if settings.zoneout_cs is None:
        return step
    c_tilde = lstm_cell_candidate(xp, step, cs_prev, settings.cell_clip)
    norm = weights.layer_norm
    if norm is not None and settings.ln_carry == "normalized":
        c_tilde = _layer_norm(xp, c_tilde, norm.gamma_c, norm.beta_c, settings.ln_epsilon)[0]
    return step._replace(cs=c_tilde)


def _weight_grads(xp, x, h_prev, w, d_gates, dz_h, norm, stats):
    """After the backward loop, from every step's gate gradients ``dG [T, B, 4H]`` and the
    recurrent part's ``dz_h`` (``dG`` without a layer norm):

        dz_x = dG   (a layer norm: lstm_gate_norm_grads, every step at once)
        dx = dz_x·W_xᵀ;  dw = [x_flatᵀ·dz_x ; h_prev_flatᵀ·dz_h];  db = Σ_{t,b} dG

    Returns ``(dx, dw, db, d_norm)``, ``d_norm`` the gate norms' ``(dγ_x, dβ_x, dγ_h, dβ_h)``
    (None without a layer norm)."""
    n_steps, n_batch, n_in = x.shape
    dz_x, d_norm = d_gates, None
    if norm is not None:
        dz_x, _, *d_norm = lstm_gate_norm_grads(d_gates, norm, *stats)
    dx_flat = plan.flat(dz_x)
    dx = (dx_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = xp.concatenate([plan.flat(x).T @ dx_flat, plan.flat(h_prev).T @ plan.flat(dz_h)],
                        axis=0)
    return dx, dw, plan.flat(d_gates).sum(axis=0), d_norm


# --------------------------------------------------------------------------------------
# Forward mode (docs/spec.md §12): each function beside the forward one it differentiates.
# Tangents are exact through active clips: zero where the clip is active, as the exact
# gradient is (on the boundary itself they pass, as the gradient does).


def lstm_cell_jvp(x, cs_prev, h_prev, weights, tangents, settings):
    """One LSTM step and its tangent for ``tangents``, an ``LSTMCellGrads`` of the inputs'
    tangents (None: zero). Returns ``(LSTMCellState, LSTMCellState of tangents)``: the
    pre-activations' tangent (``lstm_gates_jvp``), the elementwise step's
    (``lstm_activations_jvp``) and the projection's (``lstm_project_jvp``)."""
    xp = namespace_of(x)
    t = filled(xp, tangents, (x, cs_prev, h_prev, *weights))
    gates = lstm_gates_jvp(xp, (x, t.x), (h_prev, t.h_prev), weights, t, settings.ln_epsilon)
    state, d_state = lstm_activations_jvp(xp, gates, (cs_prev, t.cs_prev), weights, t, settings)
    h, dh = lstm_project_jvp(xp, (state.h, d_state.h), weights.w_proj, t.w_proj,
                             settings.proj_clip)
    return state._replace(h=h), d_state._replace(h=dh)


def lstm_gates_jvp(xp, x, h_prev, weights, t, epsilon):
    """The pre-activations ``G`` and their tangent, from ``(primal, tangent)`` pairs ``x``
    and ``h_prev`` and the weights' tangents ``t``:

        dG = [dx, dh_prev]·w + [x, h_prev]·dw + db
        layer norm: dG = dLN(z_x) + dLN(z_h) + db,  dz_x = dx·W_x + x·dW_x  (and z_h alike)
    """
    (x, dx), (h_prev, dh_prev) = x, h_prev
    w, b, norm = weights.w, weights.b, weights.layer_norm
    if norm is None:
        xh = xp.concatenate([x, h_prev], axis=1)
        return (xh @ w + b,
                xp.concatenate([dx, dh_prev], axis=1) @ w + xh @ t.w + t.b)
    n_in, dn = x.shape[1], t.layer_norm
    g_x, dg_x = layer_norm_jvp(xp, x @ w[:n_in], dx @ w[:n_in] + x @ t.w[:n_in],
                               norm.gamma_x, dn.gamma_x, norm.beta_x, dn.beta_x, epsilon)
    g_h, dg_h = layer_norm_jvp(xp, h_prev @ w[n_in:], dh_prev @ w[n_in:] + h_prev @ t.w[n_in:],
                               norm.gamma_h, dn.gamma_h, norm.beta_h, dn.beta_h, epsilon)
    return g_x + g_h + b, dg_x + dg_h + t.b


def lstm_activations_jvp(xp, gates, cs_prev, weights, t, settings):
    """``lstm_activations`` and its tangent, from ``(primal, tangent)`` pairs ``gates`` and
    ``cs_prev`` and the weights' tangents ``t``. With σ' = σ(1-σ), tanh' = 1-tanh²:

        di = σ'(i)∘(dGi + dcs_prev∘wci + cs_prev∘dwci);   dci = tanh'(ci)∘dGc
        df = σ'(f)∘(dGf + dcs_prev∘wcf + cs_prev∘dwcf)
        dc̃ = di∘ci + i∘dci + df∘cs_prev + f∘dcs_prev, zero where the clip is active
        dco = tanh'(co)∘dn, dn = dc̃ (a layer norm: dLN(c̃));  dcs = dc̃ (or dn, normalized)
        do = σ'(o)∘(dGo + dcs∘wco + cs∘dwco);   dh = do∘co + o∘dco
    """
    (gates, d_gates), (cs_prev, d_cs_prev) = gates, cs_prev
    state = lstm_activations(gates, cs_prev, wci=weights.wci, wcf=weights.wcf,
                             wco=weights.wco, forget_bias=settings.forget_bias,
                             cell_clip=settings.cell_clip, **_norm_keywords(weights, settings))
    i, cs, f, o, ci, co, _ = state
    dgi, dgc, dgf, dgo = blocks(d_gates, 4)
    if weights.wci is not None:
        dgi = dgi + d_cs_prev * weights.wci + cs_prev * t.wci
        dgf = dgf + d_cs_prev * weights.wcf + cs_prev * t.wcf
    di, dci, df = i * (1 - i) * dgi, (1 - ci * ci) * dgc, f * (1 - f) * dgf
    d_tilde = di * ci + i * dci + df * cs_prev + f * d_cs_prev
    if settings.cell_clip is not None:
        d_tilde = xp.where(clip_pass_mask(state, cs_prev, settings.cell_clip), d_tilde,
                           xp.zeros((), dtype=d_tilde.dtype))
    norm, d_norm = weights.layer_norm, t.layer_norm
    d_n = d_cs = d_tilde
    if norm is not None:
        _, d_n = layer_norm_jvp(xp, lstm_cell_candidate(xp, state, cs_prev, settings.cell_clip),
                                d_tilde, norm.gamma_c, d_norm.gamma_c, norm.beta_c,
                                d_norm.beta_c, settings.ln_epsilon)
        d_cs = d_n if settings.ln_carry == "normalized" else d_tilde
    dco = (1 - co * co) * d_n
    if weights.wco is not None:
        dgo = dgo + d_cs * weights.wco + cs * t.wco
    do = o * (1 - o) * dgo
    return state, LSTMCellState(di, d_cs, df, do, dci, dco, do * co + o * dco)


def lstm_project_jvp(xp, m, w_proj, d_w_proj, proj_clip):
    """``lstm_project`` and its tangent from the pair ``m = (o∘co, its tangent)``:
    ``dh = dm·w_proj + m·dw_proj``, zero where the projection's clip is active."""
    m, dm = m
    if w_proj is None:
        return m, dm
    raw, d_raw = m @ w_proj, dm @ w_proj + m @ d_w_proj
    if proj_clip is None:
        return raw, d_raw
    return (xp.clip(raw, -proj_clip, proj_clip),
            xp.where(abs(raw) <= proj_clip, d_raw, xp.zeros((), dtype=d_raw.dtype)))


def lstm_sequence_jvp(x, cs0, h0, weights, tangents, settings):
    """``lstm_sequence`` and its tangent for ``tangents``, an ``LSTMSequenceGrads`` of the
    inputs' tangents (None: zero). Returns ``(LSTMSequence, LSTMSequence of tangents)``.

    Each step is ``lstm_cell_jvp`` on the masked input and ``h_prev∘m_rec`` (the state
    enters the step through its matmul only); the masks, zoneout and the frozen rows past a
    row's length are linear in the state, so the tangent takes them as the state does."""
    xp = namespace_of(x)
    t = filled(xp, tangents, (x, cs0, h0, *weights))
    seq_len, m_rec = settings.seq_len, settings.recurrent_mask
    x, dx = (plan.running_inputs(xp, masked(a, settings.input_mask), seq_len) for a in (x, t.x))
    shapes = [(h0 if name == "h" else cs0).shape[1] for name in LSTMCellState._fields]
    outs = [xp.zeros((*x.shape[:2], n), dtype=x.dtype) for n in shapes]
    d_outs = [xp.zeros_like(a) for a in outs]
    cs, h, dcs, dh = cs0, h0, t.cs0, t.h0
    for step in range(x.shape[0]):
        state, d_state = lstm_cell_jvp(
            x[step], cs, masked(h, m_rec), weights,
            LSTMCellGrads(dx[step], dcs, masked(dh, m_rec), *weights_part(t, weights)), settings)
        z_cs, z_h = at_step(settings.zoneout_cs, step), at_step(settings.zoneout_h, step)
        state = state._replace(cs=zoned(z_cs, cs, state.cs), h=zoned(z_h, h, state.h))
        d_state = d_state._replace(cs=zoned(z_cs, dcs, d_state.cs), h=zoned(z_h, dh, d_state.h))
        valid = valid_rows(seq_len, step)
        for out, d_out, a, da in zip(outs, d_outs, state, d_state, strict=True):
            out[step], d_out[step] = keep(valid, a, 0), keep(valid, da, 0)
        cs, h = keep(valid, state.cs, cs), keep(valid, state.h, h)
        dcs, dh = keep(valid, d_state.cs, dcs), keep(valid, d_state.h, dh)
    return (LSTMSequence(*outs, cs_final=cs.copy(), h_final=h.copy()),
            LSTMSequence(*d_outs, cs_final=dcs.copy(), h_final=dh.copy()))


def lstm_cell_grad_jvp(x, cs_prev, h_prev, weights, state, tangents, settings, *, d_h=None,
                       d_cs=None, d_i=None, d_f=None, d_o=None, d_ci=None, d_co=None,
                       d_h_tangent=None, d_cs_tangent=None, d_i_tangent=None,
                       d_f_tangent=None, d_o_tangent=None, d_ci_tangent=None,
                       d_co_tangent=None, clip_grad="exact"):
    """The JVP of ``lstm_cell_grad`` along ``tangents`` (an ``LSTMCellGrads`` of the inputs'
    tangents) and the upstream gradients' tangents (every field's, the gates' too):
    ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    given = locals()
    upstream = {name: (given[name], given[f"{name}_tangent"], getattr(state, name[2:]))
                for name in ("d_h", "d_cs", *GATE_UPSTREAM)}
    return gradient_jvp(lstm_cell_jvp, lstm_cell_grad, (x, cs_prev, h_prev), weights, state,
                        tangents, settings, upstream, clip_grad=clip_grad)


def lstm_sequence_grad_jvp(x, cs0, h0, weights, seq, tangents, settings, *, d_h=None,
                           d_cs=None, d_h_final=None, d_cs_final=None, d_i=None, d_f=None,
                           d_o=None, d_ci=None, d_co=None, d_h_tangent=None,
                           d_cs_tangent=None, d_h_final_tangent=None, d_cs_final_tangent=None,
                           d_i_tangent=None, d_f_tangent=None, d_o_tangent=None,
                           d_ci_tangent=None, d_co_tangent=None, clip_grad="exact"):
    """The JVP of ``lstm_sequence_grad`` along ``tangents`` (an ``LSTMSequenceGrads``) and
    the upstream gradients' tangents (every field's, the gates' too): ``(grads,
    grads_tangent)``, by ``gradient_jvp``."""
    given = locals()
    upstream = {name: (given[name], given[f"{name}_tangent"], getattr(seq, name[2:]))
                for name in ("d_h", "d_cs", "d_h_final", "d_cs_final", *GATE_UPSTREAM)}
    return gradient_jvp(lstm_sequence_jvp, lstm_sequence_grad, (x, cs0, h0), weights, seq,
                        tangents, settings, upstream, clip_grad=clip_grad)
