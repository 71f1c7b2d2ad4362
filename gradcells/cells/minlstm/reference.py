"""The minLSTM and the minLSTM over time, forward and gradient, written once for any array
namespace (docs/spec.md §18.2; Feng et al. 2024, "Were RNNs All We Needed?").

Layout: ``w [I, 3H]``, columns the forget gate f, the input gate i, then the candidate h̃;
``b [3H]``.

    [p_f, p_i, p_h] = x·w + b;   f = σ(p_f),   i = σ(p_i)
    f' = f/(f+i),   i' = i/(f+i);   h̃ = act(p_h);   h = f'∘h_prev + i'∘h̃
    act = g:  g(v) = v + 0.5 (v >= 0),  σ(v) (v < 0);     or the identity

The normalised gates are computed without forming ``f + i`` (which rounds to 0, or loses
every digit, when both pre-activations are very negative): with ``log σ(v) = -softplus(-v)``,

    e = log i - log f = softplus(-p_f) - softplus(-p_i);   i' = σ(e);   f' = 1 - i'

(``softplus(v) = max(v, 0) + log1p(exp(-|v|))``, ``|v|`` capped at 40, and the
overflow-free ``σ(v) = 0.5·tanh(0.5·v) + 0.5``: finite for any finite pre-activations).
So the minLSTM is the minGRU's recurrence with the gate ``i'`` in the minGRU's ``z``'s place,

    h_t = a_t∘h_{t-1} + c_t,   a_t = f'_t = 1 - i'_t,   c_t = i'_t∘h̃_t,

run by ``gradcells._core.scan`` (sequential or parallel, its adjoint too), and its gradient
differs from the minGRU's only through ``e``:

    de = (d_i' - d_f' + g∘(h̃ - h_prev))∘f'∘i';   dp_f = -de∘σ(-p_f);   dp_i = de∘σ(-p_i)

The sequence ops take the backend protocol's arguments (``.spec.MinLSTMBackend``): the
arrays, a ``MinLSTMWeights`` and a ``MinLSTMSettings`` (time-major and forward: the public
layer reorders ``reverse`` and ``batch_first``, ``gradcells._order``).
"""

from __future__ import annotations

from ..._core import plan
from ..._core.arrays import namespace_of
from ..._core.one_step import OneStep
from ..._core.scan import (
    adjoint,
    candidate,
    candidate_grad,
    final_state,
    only_running,
    running_steps,
    scan,
)
from ..._core.xpmath import blocks, filled, gradient_jvp, sigmoid
from .spec import (
    CELL,
    MinLSTMSequence,
    MinLSTMSequenceGrads,
    scan_method,
)

SOFTPLUS_TAIL = 40.0
"""``softplus`` reads ``exp(-|v|)`` at ``|v| <= SOFTPLUS_TAIL`` only: beyond it the term
(below ``exp(-40) ≈ 4e-18``) moves ``i' = σ(e)`` by less than a unit in the last place of
0.5 in float64, and ``exp`` never underflows (no floating-point warning, float32 too)."""


def softplus(xp, v):
    """``log(1 + exp(v))`` as ``max(v, 0) + log1p(exp(-|v|))``: no overflow, no
    underflow."""
    return xp.maximum(v, 0) + xp.log1p(xp.exp(-xp.minimum(xp.abs(v), SOFTPLUS_TAIL)))


def gates(xp, p, activation):
    """``(f', i', h̃)`` from the pre-activations ``p [..., 3H]``: ``i' = σ(e)`` with ``e =
    softplus(-p_f) - softplus(-p_i)``, ``f' = 1 - i'``."""
    p_f, p_i, p_h = blocks(p, 3)
    i = sigmoid(xp, softplus(xp, -p_f) - softplus(xp, -p_i))
    return 1 - i, i, candidate(xp, p_h, activation)


def gate_slopes(xp, p):
    """``(σ(-p_f), σ(-p_i))``: the derivatives of ``e`` with respect to ``-p_f`` and
    ``p_i``."""
    p_f, p_i, _ = blocks(p, 3)
    return sigmoid(xp, -p_f), sigmoid(xp, -p_i)


def recurrence(i, hc, running):
    """``(a, c) = (1 - i', i'∘h̃)`` of the steps each row runs, the identity ``(1, 0)`` past
    its length."""
    return 1 - only_running(i, running), only_running(i * hc, running)


# --------------------------------------------------------------------------------------
# sequence


def minlstm_sequence(x, h0, weights, settings):
    """The minLSTM over ``x [T, B, I]`` from ``h0``: ``MinLSTMSequence(f, i, hc, h,
    h_final)``, the per-step fields zero past a row's length."""
    xp = namespace_of(x)
    running = running_steps(xp, x, settings.seq_len)
    x = plan.running_inputs(xp, x, settings.seq_len)
    f, i, hc = gates(xp, plan.input_projection(x, weights.w, weights.b), settings.activation)
    a, c = recurrence(i, hc, running)
    h = scan(xp, a, c, h0, scan_method(settings.method, x.shape[0]))
    return MinLSTMSequence(*(only_running(v, running) for v in (f, i, hc, h)),
                           final_state(h, h0))


def minlstm_sequence_grad(x, h0, weights, seq, settings, *, d_f=None, d_i=None, d_hc=None,
                          d_h=None, d_h_final=None):
    """Backpropagation through time for ``minlstm_sequence``: the adjoint recurrence
    (``adjoint``), then per step

        de = (d_i - d_f + g∘(h̃ - h_prev))∘f'∘i'
        dp_f = -de∘σ(-p_f);   dp_i = de∘σ(-p_i);   dp_h = (d_hc + g∘i')∘act'(p_h)

    and ``dx = dp·wᵀ``, ``dw = x_flatᵀ·dp``, ``db = Σ dp`` over all steps at once. The
    upstream gradients past a row's length are never read; ``p`` is recomputed (one
    product) for ``σ(-p_f)``, ``σ(-p_i)`` and ``act'``'s branch."""
    xp = namespace_of(x)
    w, b = weights
    running = running_steps(xp, x, settings.seq_len)
    x = plan.running_inputs(xp, x, settings.seq_len)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    zero_steps = xp.zeros((n_steps, n_batch, n_hidden), dtype=x.dtype)
    d_f, d_i, d_hc, d_h = (zero_steps if d is None else only_running(d, running)
                           for d in (d_f, d_i, d_hc, d_h))
    a, _ = recurrence(seq.i, seq.hc, running)
    g, d_h0 = adjoint(xp, a, d_h, xp.zeros_like(h0) if d_h_final is None else d_h_final,
                      scan_method(settings.method, n_steps))
    h_prev = plan.previous_states(xp, h0, seq.h)
    p = plan.input_projection(x, w, b)
    slope_f, slope_i = gate_slopes(xp, p)
    de = (d_i - d_f + g * (seq.hc - h_prev)) * seq.f * seq.i
    d_ph = candidate_grad(xp, blocks(p, 3)[2], seq.hc, d_hc + g * seq.i, settings.activation)
    d_p = only_running(xp.concatenate([-de * slope_f, de * slope_i, d_ph], axis=2), running)
    d_flat = plan.flat(d_p)
    dx = (d_flat @ w.T).reshape(n_steps, n_batch, n_in)
    return MinLSTMSequenceGrads(x=dx, h0=d_h0, w=plan.flat(x).T @ d_flat,
                                b=d_flat.sum(axis=0))


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def minlstm_sequence_jvp(x, h0, weights, tangents, settings):
    """``minlstm_sequence`` and its tangent for ``tangents``, a ``MinLSTMSequenceGrads`` of
    the inputs' tangents (None: zero). The tangent's recurrence has the state's
    multipliers:

        dp = dx·w + x·dw + db;   de = σ(-p_i)∘dp_i - σ(-p_f)∘dp_f
        di' = f'∘i'∘de;   df' = -di';   dh̃ = act'(p_h)∘dp_h
        dh_t = f'_t∘dh_{t-1} + di'_t∘(h̃_t - h_{t-1}) + i'_t∘dh̃_t
    """
    xp = namespace_of(x)
    w, b = weights
    t = filled(xp, tangents, (x, h0, w, b))
    running = running_steps(xp, x, settings.seq_len)
    x, dx = (plan.running_inputs(xp, v, settings.seq_len) for v in (x, t.x))
    method = scan_method(settings.method, x.shape[0])
    p = plan.input_projection(x, w, b)
    dp_f, dp_i, dp_h = blocks(plan.input_projection(dx, w, t.b)
                              + plan.input_projection(x, t.w, 0), 3)
    f, i, hc = gates(xp, p, settings.activation)
    slope_f, slope_i = gate_slopes(xp, p)
    di = f * i * (slope_i * dp_i - slope_f * dp_f)
    dhc = candidate_grad(xp, blocks(p, 3)[2], hc, dp_h, settings.activation)
    a, c = recurrence(i, hc, running)
    h = scan(xp, a, c, h0, method)
    h_prev = plan.previous_states(xp, h0, h)
    d_h = scan(xp, a, only_running(di * (hc - h_prev) + i * dhc, running), t.h0, method)
    result = MinLSTMSequence(*(only_running(v, running) for v in (f, i, hc, h)),
                             final_state(h, h0))
    return result, MinLSTMSequence(*(only_running(v, running) for v in (-di, di, dhc, d_h)),
                                   final_state(d_h, t.h0))


# the step: the sequence of one step (``gradcells._core.one_step``)
minlstm_cell, minlstm_cell_grad, minlstm_cell_jvp = OneStep(
    CELL, minlstm_sequence, minlstm_sequence_grad, minlstm_sequence_jvp).ops()


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12)


def minlstm_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_f=None,
                          d_i=None, d_hc=None, d_h=None, d_f_tangent=None, d_i_tangent=None,
                          d_hc_tangent=None, d_h_tangent=None):
    """The JVP of ``minlstm_cell_grad`` along ``tangents`` (a ``MinLSTMCellGrads``) and the
    upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(minlstm_cell_jvp, minlstm_cell_grad, (x, h_prev), weights, state,
                        tangents, settings,
                        {"d_f": (d_f, d_f_tangent, state.f), "d_i": (d_i, d_i_tangent, state.i),
                         "d_hc": (d_hc, d_hc_tangent, state.hc),
                         "d_h": (d_h, d_h_tangent, state.h)})


def minlstm_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_f=None, d_i=None,
                              d_hc=None, d_h=None, d_h_final=None, d_f_tangent=None,
                              d_i_tangent=None, d_hc_tangent=None, d_h_tangent=None,
                              d_h_final_tangent=None):
    """The JVP of ``minlstm_sequence_grad`` along ``tangents`` (a ``MinLSTMSequenceGrads``)
    and the upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(minlstm_sequence_jvp, minlstm_sequence_grad, (x, h0), weights, seq,
                        tangents, settings,
                        {"d_f": (d_f, d_f_tangent, seq.f), "d_i": (d_i, d_i_tangent, seq.i),
                         "d_hc": (d_hc, d_hc_tangent, seq.hc), "d_h": (d_h, d_h_tangent, seq.h),
                         "d_h_final": (d_h_final, d_h_final_tangent, seq.h_final)})
