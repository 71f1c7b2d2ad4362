"""The minGRU and the minGRU over time, forward and gradient, written once for any array
namespace (docs/spec.md §18.2; Feng et al. 2024, "Were RNNs All We Needed?").

Layout: ``w [I, 2H]``, columns the gate z then the candidate h̃; ``b [2H]``.

    [p_z, p_h] = x·w + b
    z = σ(p_z);   h̃ = act(p_h);   h = (1 - z)∘h_prev + z∘h̃
    act = g:  g(v) = v + 0.5 (v >= 0),  σ(v) (v < 0);     or the identity

The gates read ``x`` only, so a whole sequence's gates come from one input product and the
state is the diagonal linear recurrence of docs/spec.md §18.1,

    h_t = a_t∘h_{t-1} + c_t,   a_t = 1 - z_t,   c_t = z_t∘h̃_t,

whose steps compose associatively, ``(a, c)`` then ``(a', c')`` being ``(a'∘a, a'∘c + c')``:
``scan`` (``gradcells._core.scan``, shared with the minLSTM) runs it step by step or as a
parallel (Hillis-Steele) scan over time, log2 T rounds of whole-array products. Its adjoint
is the same recurrence backwards in time,

    g_t = d_h_t + a_{t+1}∘g_{t+1},   g_{T-1} = d_h_{T-1} + d_h_final,   dh0 = a_0∘g_0,

which ``adjoint`` runs as a ``scan`` over the reversed steps. Per-row lengths make the steps
past a row's length the identity (``a = 1``, ``c = 0``): the state passes through them
unchanged to ``h_final``, and the adjoint passes ``d_h_final`` back through them.

The sequence ops take the backend protocol's arguments (``.spec.MinGRUBackend``): the
arrays, a ``MinGRUWeights`` and a ``MinGRUSettings`` (time-major and forward: the public
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
from ..._core.xpmath import filled, gradient_jvp, sigmoid
from .spec import (
    CELL,
    MinGRUSequence,
    MinGRUSequenceGrads,
    scan_method,
)


def gates(xp, p, activation):
    """``(z, h̃)`` from the pre-activations ``p [..., 2H]``."""
    n_hidden = p.shape[-1] // 2
    return sigmoid(xp, p[..., :n_hidden]), candidate(xp, p[..., n_hidden:], activation)


def recurrence(z, hc, running):
    """``(a, c) = (1 - z, z∘h̃)`` of the steps each row runs, the identity ``(1, 0)`` past its
    length."""
    a, c = 1 - only_running(z, running), only_running(z * hc, running)
    return a, c


# --------------------------------------------------------------------------------------
# sequence


def mingru_sequence(x, h0, weights, settings):
    """The minGRU over ``x [T, B, I]`` from ``h0``: ``MinGRUSequence(z, hc, h, h_final)``,
    the per-step fields zero past a row's length."""
    xp = namespace_of(x)
    running = running_steps(xp, x, settings.seq_len)
    x = plan.running_inputs(xp, x, settings.seq_len)
    z, hc = gates(xp, plan.input_projection(x, weights.w, weights.b), settings.activation)
    a, c = recurrence(z, hc, running)
    h = scan(xp, a, c, h0, scan_method(settings.method, x.shape[0]))
    return MinGRUSequence(only_running(z, running), only_running(hc, running),
                          only_running(h, running), final_state(h, h0))


def mingru_sequence_grad(x, h0, weights, seq, settings, *, d_z=None, d_hc=None, d_h=None,
                         d_h_final=None):
    """Backpropagation through time for ``mingru_sequence``: the adjoint recurrence
    (``adjoint``), then per step

        dp_z = (d_z + g∘(h̃ - h_prev))∘z∘(1 - z);   dp_h = (d_hc + g∘z)∘act'(p_h)

    and ``dx = dp·wᵀ``, ``dw = x_flatᵀ·dp``, ``db = Σ dp`` over all steps at once. The
    upstream gradients past a row's length are never read; ``p_h`` is recomputed (one
    product) for ``act'``'s branch."""
    xp = namespace_of(x)
    w, b = weights
    running = running_steps(xp, x, settings.seq_len)
    x = plan.running_inputs(xp, x, settings.seq_len)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    zero_steps = xp.zeros((n_steps, n_batch, n_hidden), dtype=x.dtype)
    d_z, d_hc, d_h = (zero_steps if d is None else only_running(d, running)
                      for d in (d_z, d_hc, d_h))
    a, _ = recurrence(seq.z, seq.hc, running)
    g, d_h0 = adjoint(xp, a, d_h, xp.zeros_like(h0) if d_h_final is None else d_h_final,
                      scan_method(settings.method, n_steps))
    h_prev = plan.previous_states(xp, h0, seq.h)
    p_h = plan.input_projection(x, w[:, n_hidden:], b[n_hidden:])
    d_pz = (d_z + g * (seq.hc - h_prev)) * seq.z * (1 - seq.z)
    d_ph = candidate_grad(xp, p_h, seq.hc, d_hc + g * seq.z, settings.activation)
    d_p = only_running(xp.concatenate([d_pz, d_ph], axis=2), running)
    d_flat = plan.flat(d_p)
    dx = (d_flat @ w.T).reshape(n_steps, n_batch, n_in)
    return MinGRUSequenceGrads(x=dx, h0=d_h0, w=plan.flat(x).T @ d_flat,
                               b=d_flat.sum(axis=0))


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def mingru_sequence_jvp(x, h0, weights, tangents, settings):
    """``mingru_sequence`` and its tangent for ``tangents``, a ``MinGRUSequenceGrads`` of
    the inputs' tangents (None: zero). The tangent's recurrence has the state's
    multipliers:

        dp = dx·w + x·dw + db;   dz = z∘(1 - z)∘dp_z;   dh̃ = act'(p_h)∘dp_h
        dh_t = a_t∘dh_{t-1} + dz_t∘(h̃_t - h_{t-1}) + z_t∘dh̃_t
    """
    xp = namespace_of(x)
    w, b = weights
    t = filled(xp, tangents, (x, h0, w, b))
    running = running_steps(xp, x, settings.seq_len)
    x, dx = (plan.running_inputs(xp, v, settings.seq_len) for v in (x, t.x))
    n_hidden, method = h0.shape[1], scan_method(settings.method, x.shape[0])
    p = plan.input_projection(x, w, b)
    dp = plan.input_projection(dx, w, t.b) + plan.input_projection(x, t.w, 0)
    z, hc = gates(xp, p, settings.activation)
    dz = z * (1 - z) * dp[..., :n_hidden]
    dhc = candidate_grad(xp, p[..., n_hidden:], hc, dp[..., n_hidden:], settings.activation)
    a, c = recurrence(z, hc, running)
    h = scan(xp, a, c, h0, method)
    h_prev = plan.previous_states(xp, h0, h)
    d_h = scan(xp, a, only_running(dz * (hc - h_prev) + z * dhc, running), t.h0, method)
    result = MinGRUSequence(*(only_running(v, running) for v in (z, hc, h)),
                            final_state(h, h0))
    return result, MinGRUSequence(*(only_running(v, running) for v in (dz, dhc, d_h)),
                                  final_state(d_h, t.h0))


# the step: the sequence of one step (``gradcells._core.one_step``)
mingru_cell, mingru_cell_grad, mingru_cell_jvp = OneStep(
    CELL, mingru_sequence, mingru_sequence_grad, mingru_sequence_jvp).ops()


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12)


def mingru_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_z=None,
                         d_hc=None, d_h=None, d_z_tangent=None, d_hc_tangent=None,
                         d_h_tangent=None):
    """The JVP of ``mingru_cell_grad`` along ``tangents`` (a ``MinGRUCellGrads``) and the
    upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(mingru_cell_jvp, mingru_cell_grad, (x, h_prev), weights, state,
                        tangents, settings,
                        {"d_z": (d_z, d_z_tangent, state.z), "d_hc": (d_hc, d_hc_tangent, state.hc),
                         "d_h": (d_h, d_h_tangent, state.h)})


def mingru_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_z=None, d_hc=None,
                             d_h=None, d_h_final=None, d_z_tangent=None, d_hc_tangent=None,
                             d_h_tangent=None, d_h_final_tangent=None):
    """The JVP of ``mingru_sequence_grad`` along ``tangents`` (a ``MinGRUSequenceGrads``)
    and the upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(mingru_sequence_jvp, mingru_sequence_grad, (x, h0), weights, seq,
                        tangents, settings,
                        {"d_z": (d_z, d_z_tangent, seq.z), "d_hc": (d_hc, d_hc_tangent, seq.hc),
                         "d_h": (d_h, d_h_tangent, seq.h),
                         "d_h_final": (d_h_final, d_h_final_tangent, seq.h_final)})
