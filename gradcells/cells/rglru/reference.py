"""The RG-LRU and the RG-LRU over time, forward and gradient, written once for any array
namespace (docs/spec.md §18.3; De et al. 2024, Griffin and Hawk; recurrentgemma's
``RGLRU``).

Layout: ``x [T, B, H]`` (as wide as the state), ``w_a, w_x [N, H/N, H/N]`` block-diagonal
(head k maps the k-th ``H/N`` columns of ``x`` by ``w[k]``), ``b_a, b_x, lam [H]``.

    p_a = x·W_a + b_a,   p_x = x·W_x + b_x
    r = σ(p_a),   i = σ(p_x),   log a = -c·r∘softplus(λ),   a = exp(log a)
    m = sqrt(1 - a²),   h_t = a_t∘h_{t-1} + m_t∘(i_t∘x_t)

At a reset (``resets[t, b]``) the state received is zeros and ``m`` is 1: ``a = 0`` and
``c = i∘x`` in the recurrence below. Numerically careful forms, each for a reason:

* ``1 - a²`` is ``-expm1(2·log a)``: ``a`` is near 1 exactly where the RG-LRU remembers
  (small ``r`` or ``softplus(λ)``), and ``1 - exp(2·log a)`` loses every digit there.
* ``σ(p) = e/(1 + e)`` below 0 (``e = exp(-|p|)``): relative precision for a tiny ``r``
  (``m ≈ sqrt(2c·r·softplus(λ))`` reads it); ``0.5·tanh(0.5p) + 0.5`` would round ``r`` to
  0 from ``p ≈ -17`` in float32, and the gradient with it. Below ``-GATE_TAIL`` it is 0.
* ``softplus(v) = max(v, 0) + log1p(exp(-|v|))``: ``softplus(λ)`` keeps its relative
  precision for a negative ``λ`` down to ``-GATE_TAIL`` (0 below).
* ``a`` is 0 below ``log a = -DECAY_TAIL``: the tails keep every product of the gradient
  a normal number (no underflow, no floating-point warning, at any pre-activation).
* The gradient of ``m`` reaches ``p_a`` and ``λ`` through ``q = r/sqrt(z)`` (``z = 1 -
  a²``): ``dm/dp_a = c·softplus(λ)∘a²∘(1-r)∘q``, ``dm/dsoftplus(λ) = c·a²∘q``, finite as
  ``r → 0`` (``q ≈ sqrt(r/(2c·softplus(λ)))``), taken as 0 where ``z`` rounds to 0.

``sqrt_grad_bound`` (recurrentgemma's ``SqrtBoundDerivative``) replaces ``sqrt(z)`` in
``q`` by ``sqrt(max(z, 1/(4·bound²)))``: the derivative of the square root taken at the
bounded point, a convention the forward records.

The gates read ``x`` only, so the state is the diagonal linear recurrence of
docs/spec.md §18.1, ``h_t = a_t∘h_{t-1} + c_t`` with ``c_t = m_t∘i_t∘x_t``, run by
``gradcells._core.scan`` (sequential or parallel; its adjoint too), the steps past a row's
length the identity. The sequence ops take the backend protocol's arguments
(``.spec.RGLRUBackend``), time-major and forward (``gradcells._order``).
"""

from __future__ import annotations

from ..._core import plan
from ..._core.arrays import namespace_of
from ..._core.one_step import OneStep
from ..._core.scan import adjoint, final_state, only_running, running_steps, scan
from ..._core.xpmath import blocks, filled, gradient_jvp
from .spec import (
    CELL,
    RGLRUSequence,
    RGLRUSequenceGrads,
    scan_method,
)

GATE_TAIL = {"float32": 30.0, "float64": 200.0}
"""``exact_sigmoid`` and ``softplus`` are exactly 0 below ``-GATE_TAIL`` (by dtype; float16
as float32): ``e^-30 ≈ 9e-14`` and ``e^-200 ≈ 1e-87``, so that a product of up to three such
factors (``r∘softplus(λ)∘g`` in the gradient) stays a normal number and nothing underflows
(no floating-point warning), while every value above the tail keeps its relative
precision."""

DECAY_TAIL = {"float32": 20.0, "float64": 100.0}
"""``a = exp(log a)`` is exactly 0 below ``log a = -DECAY_TAIL`` (``a < 2e-9`` in float32,
``4e-44`` in float64: below the resolution of ``m ≈ 1`` there), so that ``a²`` and its
products never underflow."""


def _tail(table, a):
    return table["float64" if a.dtype.itemsize >= 8 else "float32"]


def exact_sigmoid(xp, p):
    """σ(p) as ``1/(1 + e)`` (``p >= 0``) or ``e/(1 + e)`` (``p < 0``), ``e = exp(-|p|)``:
    no overflow, and relative precision for every ``p`` down to ``-GATE_TAIL``, below
    which it is 0."""
    tail = _tail(GATE_TAIL, p)
    e = xp.exp(xp.maximum(xp.where(p >= 0, -p, p), -tail))
    return xp.where(p < -tail, 0, xp.where(p >= 0, 1, e) / (1 + e))


def softplus(xp, v):
    """``log(1 + exp(v)) = max(v, 0) + log1p(exp(-|v|))``: no overflow, relative precision
    for a negative ``v`` down to ``-GATE_TAIL``, below which it is 0; its slope is ``σ(v)``
    (0.5 at 0, on dual numbers too)."""
    tail = _tail(GATE_TAIL, v)
    value = xp.where(v >= 0, v, 0) + xp.log1p(xp.exp(xp.maximum(xp.where(v >= 0, -v, v),
                                                                 -tail)))
    return xp.where(v < -tail, 0, value)


def block_product(xp, x, w):
    """``x·W`` for the block-diagonal ``W`` of ``w [N, H/N, H/N]``: head k's columns of
    ``x [..., H]`` times ``w[k]``, side by side."""
    return xp.concatenate([part @ w[k] for k, part in enumerate(blocks(x, w.shape[0]))],
                          axis=-1)


def block_product_t(xp, d, w):
    """``d·Wᵀ`` for the block-diagonal ``W`` of ``w``: the input's gradient."""
    return xp.concatenate([part @ w[k].T for k, part in enumerate(blocks(d, w.shape[0]))],
                          axis=-1)


def block_weight_grad(xp, x, d, w):
    """``[x_kᵀ·d_k]_k [N, H/N, H/N]`` over all steps and rows: the blocks' gradient."""
    n = w.shape[0]
    return xp.concatenate([(plan.flat(xk).T @ plan.flat(dk))[None]
                           for xk, dk in zip(blocks(x, n), blocks(d, n), strict=True)],
                          axis=0)


def gates(xp, x, weights):
    """``(r, i)``: the recurrence and input gates of ``x [T, B, H]``."""
    w_a, b_a, w_x, b_x, _ = weights
    return (exact_sigmoid(xp, block_product(xp, x, w_a) + b_a),
            exact_sigmoid(xp, block_product(xp, x, w_x) + b_x))


def decay(xp, r, lam, c):
    """``(softplus(λ), a, z)``: ``a = exp(-c·r∘softplus(λ))`` (0 below ``DECAY_TAIL``) and
    ``z = 1 - a² = -expm1(2·log a)``."""
    sp = softplus(xp, lam)
    log_a = -c * r * sp
    tail = _tail(DECAY_TAIL, log_a)
    a = xp.where(log_a < -tail, 0, xp.exp(xp.maximum(log_a, -tail)))
    return sp, a, -xp.expm1(2 * log_a)


def root_ratio(xp, r, z, bound):
    """``q = r/sqrt(z*)``, ``z* = z`` or ``max(z, 1/(4·bound²))`` (the ``sqrt_grad_bound``
    convention); 0 where ``z*`` is 0 (``r`` or ``softplus(λ)`` underflowed: the limit)."""
    root = xp.sqrt(z if bound is None else xp.maximum(z, 1 / (4 * bound * bound)))
    positive = root > 0
    return xp.where(positive, r / xp.where(positive, root, 1), 0)


def reset_flags(settings):
    """``resets`` as ``[T, B, 1]`` booleans, or None."""
    return None if settings.resets is None else settings.resets[:, :, None]


def recurrence(xp, a, m, u, reset, running):
    """``(a, c)`` of ``h_t = a_t∘h_{t-1} + c_t``: ``c = m∘u``; at a reset ``(0, u)``; the
    identity ``(1, 0)`` past a row's length."""
    c = m * u
    if reset is not None:
        a, c = xp.where(reset, 0, a), xp.where(reset, u, c)
    return (a if running is None else xp.where(running, a, 1)), only_running(c, running)


def _setup(x, settings):
    xp = namespace_of(x)
    running = running_steps(xp, x, settings.seq_len)
    return xp, running, plan.running_inputs(xp, x, settings.seq_len)


# --------------------------------------------------------------------------------------
# sequence


def rglru_sequence(x, h0, weights, settings):
    """The RG-LRU over ``x [T, B, H]`` from ``h0``: ``RGLRUSequence(r, i, h, h_final)``,
    the per-step fields zero past a row's length."""
    xp, running, x = _setup(x, settings)
    r, i = gates(xp, x, weights)
    _, a, z = decay(xp, r, weights.lam, settings.c)
    a, c = recurrence(xp, a, xp.sqrt(z), i * x, reset_flags(settings), running)
    h = scan(xp, a, c, h0, scan_method(settings.method, x.shape[0]))
    return RGLRUSequence(only_running(r, running), only_running(i, running),
                         only_running(h, running), final_state(h, h0))


def rglru_sequence_grad(x, h0, weights, seq, settings, *, d_r=None, d_i=None, d_h=None,
                        d_h_final=None):
    """Backpropagation through time for ``rglru_sequence``: the adjoint recurrence
    (``adjoint``), then per step (``h_prev`` 0 and ``g_m`` 0 at a reset)

        g_a = g∘h_prev∘a;   g_m = g∘i∘x;   q = r/sqrt(z*)
        dp_a = (d_r - c·sp∘g_a)∘r(1-r) + c·sp∘a²∘(1-r)∘q∘g_m
        dp_x = (d_i + g∘m∘x)∘i(1-i);   dλ = σ(λ)∘Σ(c·a²∘q∘g_m - c·r∘g_a)

    and the block-diagonal products of the input and weight gradients over all steps at
    once. The upstream gradients and flags past a row's length are never read."""
    xp, running, x = _setup(x, settings)
    w_a, _, w_x, _, lam = weights
    c = settings.c
    zero_steps = xp.zeros(x.shape, dtype=x.dtype)
    d_r, d_i, d_h = (zero_steps if d is None else only_running(d, running)
                     for d in (d_r, d_i, d_h))
    # r is stored as 0 past a row's length; 1 there keeps m = sqrt(1 - a²) off 0, whose
    # slope (of the gradient's own JVP) would be infinite, though every term is masked
    r, i = (seq.r if running is None else xp.where(running, seq.r, 1)), seq.i
    sp, a, z = decay(xp, r, lam, c)
    m = xp.sqrt(z)
    u = i * x
    reset = reset_flags(settings)
    a_run, _ = recurrence(xp, a, m, u, reset, running)
    g, d_h0 = adjoint(xp, a_run, d_h, xp.zeros_like(h0) if d_h_final is None else d_h_final,
                      scan_method(settings.method, x.shape[0]))
    g = only_running(g, running)
    h_prev = plan.previous_states(xp, h0, seq.h)
    g_a, g_m, mult = g * h_prev * a, g * u, m
    if reset is not None:
        g_a, g_m = xp.where(reset, 0, g_a), xp.where(reset, 0, g_m)
        mult = xp.where(reset, 1, m)
    q = root_ratio(xp, r, z, settings.sqrt_grad_bound)
    d_pa = (d_r - c * sp * g_a) * r * (1 - r) + c * sp * a * a * (1 - r) * q * g_m
    d_px = (d_i + g * mult * x) * i * (1 - i)
    d_sp = (c * a * a * q * g_m - c * r * g_a).sum(axis=(0, 1))
    dx = g * mult * i + block_product_t(xp, d_pa, w_a) + block_product_t(xp, d_px, w_x)
    return RGLRUSequenceGrads(
        x=dx, h0=d_h0, w_a=block_weight_grad(xp, x, d_pa, w_a), b_a=d_pa.sum(axis=(0, 1)),
        w_x=block_weight_grad(xp, x, d_px, w_x), b_x=d_px.sum(axis=(0, 1)),
        lam=d_sp * exact_sigmoid(xp, lam))


# --------------------------------------------------------------------------------------
# forward mode (docs/spec.md §12)


def rglru_sequence_jvp(x, h0, weights, tangents, settings):
    """``rglru_sequence`` and its tangent for ``tangents``, an ``RGLRUSequenceGrads`` of
    the inputs' tangents (None: zero). The tangent's recurrence has the state's
    multipliers:

        dr = r(1-r)∘dp_a;   di = i(1-i)∘dp_x;   dsp = σ(λ)∘dλ
        da = -c·a∘(dr∘sp + r∘dsp);   dm = c·a²∘q∘((1-r)∘sp∘dp_a + dsp)
        dh_t = a_t∘dh_{t-1} + da_t∘h_{t-1} + dm∘u + m∘du,   u = i∘x
    """
    xp, running, x = _setup(x, settings)
    t = filled(xp, tangents, (x, h0, *weights))
    dx = plan.running_inputs(xp, t.x, settings.seq_len)
    c, lam = settings.c, weights.lam
    dp_a = (block_product(xp, dx, weights.w_a) + block_product(xp, x, t.w_a) + t.b_a)
    dp_x = (block_product(xp, dx, weights.w_x) + block_product(xp, x, t.w_x) + t.b_x)
    r, i = gates(xp, x, weights)
    sp, a, z = decay(xp, r, lam, c)
    m = xp.sqrt(z)
    dr, di = r * (1 - r) * dp_a, i * (1 - i) * dp_x
    d_sp = exact_sigmoid(xp, lam) * t.lam
    da = -c * a * (dr * sp + r * d_sp)
    dm = c * a * a * root_ratio(xp, r, z, settings.sqrt_grad_bound) * (
        (1 - r) * sp * dp_a + d_sp)
    u, du = i * x, di * x + i * dx
    reset = reset_flags(settings)
    a_run, c_run = recurrence(xp, a, m, u, reset, running)
    method = scan_method(settings.method, x.shape[0])
    h = scan(xp, a_run, c_run, h0, method)
    h_prev = plan.previous_states(xp, h0, h)
    d_c = da * h_prev + dm * u + m * du
    if reset is not None:
        d_c = xp.where(reset, du, d_c)
    d_h = scan(xp, a_run, only_running(d_c, running), t.h0, method)
    result = RGLRUSequence(*(only_running(v, running) for v in (r, i, h)), final_state(h, h0))
    return result, RGLRUSequence(*(only_running(v, running) for v in (dr, di, d_h)),
                                 final_state(d_h, t.h0))


# the step: the sequence of one step (``gradcells._core.one_step``)
rglru_cell, rglru_cell_grad, rglru_cell_jvp = OneStep(
    CELL, rglru_sequence, rglru_sequence_grad, rglru_sequence_jvp).ops()


# --------------------------------------------------------------------------------------
# second order (docs/spec.md §12)


def rglru_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_r=None, d_i=None,
                        d_h=None, d_r_tangent=None, d_i_tangent=None, d_h_tangent=None):
    """The JVP of ``rglru_cell_grad`` along ``tangents`` (an ``RGLRUCellGrads``) and the
    upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(rglru_cell_jvp, rglru_cell_grad, (x, h_prev), weights, state,
                        tangents, settings,
                        {"d_r": (d_r, d_r_tangent, state.r), "d_i": (d_i, d_i_tangent, state.i),
                         "d_h": (d_h, d_h_tangent, state.h)})


def rglru_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_r=None, d_i=None,
                            d_h=None, d_h_final=None, d_r_tangent=None, d_i_tangent=None,
                            d_h_tangent=None, d_h_final_tangent=None):
    """The JVP of ``rglru_sequence_grad`` along ``tangents`` (an ``RGLRUSequenceGrads``)
    and the upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp``."""
    return gradient_jvp(rglru_sequence_jvp, rglru_sequence_grad, (x, h0), weights, seq,
                        tangents, settings,
                        {"d_r": (d_r, d_r_tangent, seq.r), "d_i": (d_i, d_i_tangent, seq.i),
                         "d_h": (d_h, d_h_tangent, seq.h),
                         "d_h_final": (d_h_final, d_h_final_tangent, seq.h_final)})
