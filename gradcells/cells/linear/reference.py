"""The linear scan (docs/spec.md §18.1), forward, gradient, forward mode and second order,
written once for any array namespace: the teaching text the fused backends are held to.

    h_t = m_t∘h_{t-1} + c_t,   h_{-1} = h0
    m_t = a_t (0 where resets[t]: h_{t-1} replaced by zeros),   c_t = b_t

Steps past a row's length are the identity (``m = 1``, ``c = 0``): the state passes through
them to ``h_final`` unchanged, their outputs are zero, and ``a``, ``b`` are never read
there. ``gradcells._core.scan.scan`` runs the recurrence step by step or as a parallel
(Hillis-Steele) scan. The adjoint (the gradient of a real loss ``L``) is the same
recurrence backwards in time with conjugated multipliers,

    g_t = d_h_t + conj(m_{t+1})∘g_{t+1},   g_{T-1} = d_h_{T-1} + d_h_final
    d_b_t = g_t,   d_a_t = g_t∘conj(h_{t-1}) (0 at a reset),   d_h0 = conj(m_0)∘g_0

in PyTorch's convention for complex arrays: the gradient of ``z`` is ``∂L/∂Re z +
i ∂L/∂Im z`` (for real arrays the conjugates are the identity); a real ``a`` with a complex
``b`` gets the real part, ``Re(g_t∘conj(h_{t-1}))``.

The ops take the backend protocol's arguments (``.spec.LinearScanBackend``): time-major,
forward (``gradcells._order`` reorders ``reverse`` and ``batch_first``, ``resets``
included).
"""

from __future__ import annotations

from ..._core import plan
from ..._core.arrays import namespace_of
from ..._core.scan import adjoint, final_state, scan
from .spec import LinearScan, LinearScanGrads, scan_method


def result_dtype(xp, a, b):
    """The states' dtype: ``b``'s (a complex ``b`` with a real ``a`` stays complex)."""
    return xp.result_type(a, b)


def steps(xp, a, b, settings):
    """``(running, m, c)``: ``[T, B, 1]`` booleans of the steps each row runs (None
    without lengths), the multipliers (0 at a reset, 1 past a row's length) and the
    addends (0 past a row's length)."""
    running = None if settings.seq_len is None else plan.running_mask(
        xp, a.shape[0], settings.seq_len)[:, :, None]
    m = a if settings.resets is None else xp.where(settings.resets[:, :, None],
                                                   xp.zeros((), a.dtype), a)
    if running is None:
        return None, m, b
    return running, xp.where(running, m, xp.ones((), a.dtype)), xp.where(
        running, b, xp.zeros((), b.dtype))


def kept(xp, v, running):
    """``v`` zeroed past each row's length (``v`` itself without lengths)."""
    return v if running is None else xp.where(running, v, xp.zeros((), v.dtype))


def multiplier_tangent(xp, t_a, settings, running):
    """The tangent of the multipliers ``m``: ``t_a``, 0 at a reset and past a length."""
    t_m = t_a if settings.resets is None else xp.where(settings.resets[:, :, None],
                                                       xp.zeros((), t_a.dtype), t_a)
    return kept(xp, t_m, running)


def linear_scan(a, b, h0, settings):
    """``LinearScan(h, h_final)`` of ``h_t = m_t∘h_{t-1} + c_t`` (the module docstring)."""
    xp = namespace_of(b)
    running, m, c = steps(xp, a, b, settings)
    dtype = result_dtype(xp, a, b)
    h = scan(xp, m, c.astype(dtype), h0.astype(dtype), scan_method(settings.method,
                                                                     a.shape[0]))
    return LinearScan(kept(xp, h, running), final_state(h, h0.astype(dtype)))


def previous_in_run_order(xp, h0, h, lengths, backward):
    """The state each step starts from, in run order: ``h_{t-1}`` (``h0`` at t = 0), or
    with ``backward`` (a backend running ``reverse`` itself) ``h_{t+1}`` (``h0`` at each
    row's last valid step, ``lengths`` None: at T-1)."""
    if not backward:
        return plan.previous_states(xp, h0, h)
    following = xp.concatenate([h[1:], h0[None]], axis=0)
    if lengths is None:
        return following
    last = (xp.arange(h.shape[0])[:, None] + 1 >= lengths[None, :])[:, :, None]
    return xp.where(last, h0[None], following)


def _real_if(xp, v, like):
    """``v`` as ``like``'s kind: its real part for a real ``like``."""
    return v if like.dtype.kind == "c" else xp.real(v)


def _zeros_if_none(xp, v, shape, dtype):
    return xp.zeros(shape, dtype=dtype) if v is None else v


def linear_scan_grad(a, b, h0, result, settings, *, d_h=None, d_h_final=None):
    """``LinearScanGrads(a, b, h0)`` by the adjoint recurrence (the module docstring); the
    upstream gradients past a row's length are never read."""
    xp = namespace_of(b)
    running, m, _ = steps(xp, a, b, settings)
    dtype = result_dtype(xp, a, b)
    d_h = kept(xp, _zeros_if_none(xp, d_h, b.shape, dtype), running)
    d_final = _zeros_if_none(xp, d_h_final, h0.shape, dtype)
    g, d_h0 = adjoint(xp, xp.conj(m), d_h, d_final, scan_method(settings.method, a.shape[0]))
    g = kept(xp, g, running)
    h_prev = plan.previous_states(xp, h0.astype(dtype), result.h)
    d_a = multiplier_tangent(xp, g * xp.conj(h_prev), settings, running)
    return LinearScanGrads(a=_real_if(xp, d_a, a), b=_real_if(xp, g, b),
                           h0=_real_if(xp, d_h0, h0))


def _tangents(xp, a, b, h0, tangents):
    """The inputs' tangents, zeros for None."""
    return (_zeros_if_none(xp, tangents.a, a.shape, a.dtype),
            _zeros_if_none(xp, tangents.b, b.shape, b.dtype),
            _zeros_if_none(xp, tangents.h0, h0.shape, h0.dtype))


def linear_scan_jvp(a, b, h0, tangents, settings):
    """``linear_scan`` and its tangent along ``tangents`` (a ``LinearScanGrads``, None
    fields zero): the same recurrence,

        t_h_t = m_t∘t_h_{t-1} + t_m_t∘h_{t-1} + t_b_t
    """
    xp = namespace_of(b)
    t_a, t_b, t_h0 = _tangents(xp, a, b, h0, tangents)
    result = linear_scan(a, b, h0, settings)
    running, m, _ = steps(xp, a, b, settings)
    dtype = result_dtype(xp, a, b)
    h_prev = plan.previous_states(xp, h0.astype(dtype), result.h)
    addend = multiplier_tangent(xp, t_a, settings, running) * h_prev + kept(xp, t_b, running)
    t_h = scan(xp, m, addend.astype(dtype), t_h0.astype(dtype),
               scan_method(settings.method, a.shape[0]))
    return result, LinearScan(kept(xp, t_h, running), final_state(t_h, t_h0.astype(dtype)))


def linear_scan_grad_jvp(a, b, h0, result, tangents, settings, *, d_h=None, d_h_final=None,
                         d_h_tangent=None, d_h_final_tangent=None):
    """The JVP of ``linear_scan_grad`` along ``tangents`` and the upstream gradients'
    tangents (the gradient is real-linear in the conjugates: ``t(conj z) = conj(t_z)``):

        t_g_t = t_d_h_t + conj(m_{t+1})∘t_g_{t+1} + conj(t_m_{t+1})∘g_{t+1}
        t_d_a_t = t_g_t∘conj(h_{t-1}) + g_t∘conj(t_h_{t-1});   t_d_b = t_g
        t_d_h0 = conj(m_0)∘t_g_0 + conj(t_m_0)∘g_0
    """
    xp = namespace_of(b)
    grads = linear_scan_grad(a, b, h0, result, settings, d_h=d_h, d_h_final=d_h_final)
    t_a, _, _ = _tangents(xp, a, b, h0, tangents)
    running, m, _ = steps(xp, a, b, settings)
    dtype = result_dtype(xp, a, b)
    _, t_result = linear_scan_jvp(a, b, h0, tangents, settings)
    d_h = kept(xp, _zeros_if_none(xp, d_h, b.shape, dtype), running)
    method = scan_method(settings.method, a.shape[0])
    g, _ = adjoint(xp, xp.conj(m), d_h, _zeros_if_none(xp, d_h_final, h0.shape, dtype), method)
    t_m = xp.conj(multiplier_tangent(xp, t_a, settings, running))
    from_next = xp.concatenate([t_m[1:] * g[1:], t_m[:1] * g[:1] * 0], axis=0)
    t_up = kept(xp, _zeros_if_none(xp, d_h_tangent, b.shape, dtype), running) + from_next
    t_g, t_d_h0 = adjoint(xp, xp.conj(m), t_up.astype(dtype),
                          _zeros_if_none(xp, d_h_final_tangent, h0.shape, dtype), method)
    t_g = kept(xp, t_g, running)
    if a.shape[0]:
        t_d_h0 = t_d_h0 + t_m[0] * g[0]
    h_prev = plan.previous_states(xp, h0.astype(dtype), result.h)
    t_h_prev = plan.previous_states(xp, _tangents(xp, a, b, h0, tangents)[2].astype(dtype),
                                    t_result.h)
    t_d_a = multiplier_tangent(xp, t_g * xp.conj(h_prev) + kept(xp, g, running)
                               * xp.conj(t_h_prev), settings, running)
    return grads, LinearScanGrads(a=_real_if(xp, t_d_a, a), b=_real_if(xp, t_g, b),
                                  h0=_real_if(xp, t_d_h0, h0))
