"""Mamba's selective scan (docs/spec.md §18.4), forward, gradient, forward mode and second
order, written once for any array namespace: the teaching text the fused backends are held
to. Mamba's layout (``selective_scan_ref``'s): ``u, delta, z: [Bt, Dm, L]``, ``A: [Dm, N]``,
``B, C: [Bt, N, L]`` or grouped ``[Bt, G, N, L]`` (channel d reads group d // (Dm/G)),
``D, delta_bias: [Dm]``; the state ``x: [Bt, Dm, N]``.

The forward, for every (b, d, n), time t in run order (t = 0..L-1, or L-1..0 with
``reverse``; "t-1" is the step before in run order, x_{-1} = 0):

    r_t = delta_t + delta_bias          Δ_t = softplus(r_t) (delta_softplus) or r_t
    a_t = exp(Δ_t A)                    x_t = a_t∘x_{t-1} + Δ_t B_t u_t
    p_t = Σ_n C_t x_t + D u_t           y_t = p_t silu(z_t) (with z) or p_t

``softplus(r) = max(r, 0) + log1p(exp(-|r|))`` and ``σ(r) = 1/(1 + exp(-r))`` for r >= 0,
``exp(r)/(1 + exp(r))`` otherwise: neither overflows. ``silu(z) = z σ(z)``,
``silu'(z) = σ(z)(1 + z(1 - σ(z)))``. ``last_state`` is the last x run.

The gradient of a loss given ``d_y`` and ``d_last_state`` (the backward, derived by the chain
rule through the lines above, in terms of the inputs, the recomputed a_t, x_t and p_t):

    d_p_t = d_y_t silu(z_t);    d_z_t = d_y_t p_t silu'(z_t)
    d_D = Σ_{b,t} d_p_t u_t;    d_u_t  = D d_p_t + Σ_n g_t Δ_t B_t
    g_t = C_t d_p_t + a_{t+1}∘g_{t+1},   g_{last} = C d_p + d_last_state   (the adjoint)
    d_C_t = Σ_{d in the group} d_p_t x_t
    d_B_t = Σ_{d in the group} g_t Δ_t u_t
    d_Δ_t = Σ_n g_t (B_t u_t + A a_t x_{t-1})
    d_A = Σ_{b,t} g_t Δ_t a_t x_{t-1}
    d_r_t = d_Δ_t σ(r_t) (delta_softplus) or d_Δ_t;  d_delta = d_r;  d_delta_bias = Σ_{b,t} d_r

(g_t is ∂L/∂x_t; x_t enters y_t through C_t and x_{t+1} through a_{t+1}; a_t = exp(Δ_t A)
gives ∂a_t/∂Δ_t = A a_t and ∂a_t/∂A = Δ_t a_t.) Ungrouped B, C ([Bt, N, L]) sum over every
channel.

Forward mode and second order are those same lines differentiated along a direction: every
quantity above is evaluated as a pair (value, tangent) (``_Dual``: the product rule for
``*``, ``t(exp r) = exp(r) t_r``, ``t(softplus r) = σ(r) t_r``, ``t(σ(r)) = σ(1-σ) t_r``,
``t(silu z) = silu'(z) t_z``, ``t(silu'(z)) = σ(1-σ)(2 + z(1 - 2σ)) t_z``; sums, slices and
group repeats linear). ``selective_scan_jvp`` runs the forward on the pairs of the inputs
and their tangents, ``selective_scan_grad_jvp`` the backward on those and the upstream
gradients' tangents: the JVP of the gradient function, exactly, with nothing more derived.
"""

from __future__ import annotations

from ..._core.arrays import namespace_of
from .spec import SelectiveScan, SelectiveScanGrads


def _t_add(a, b):
    return a if b is None else b if a is None else a + b


class _Dual:
    """A value and its tangent (None: zero), with the product rule."""

    __slots__ = ("v", "t")

    def __init__(self, v, t=None):
        self.v, self.t = v, t

    def map(self, f):
        """A linear map (a slice, a reshape, a sum, a repeat) applied to both parts."""
        return _Dual(f(self.v), None if self.t is None else f(self.t))

    def __add__(self, other):
        if not isinstance(other, _Dual):
            return _Dual(self.v + other, self.t)
        v = self.v + other.v
        t = _t_add(self.t, other.t)
        if t is not None and t.shape != v.shape:    # one tangent zero: the other broadcast
            t = namespace_of(v).broadcast_to(t, v.shape)
        return _Dual(v, t)

    __radd__ = __add__

    def __neg__(self):
        return _Dual(-self.v, None if self.t is None else -self.t)

    def __sub__(self, other):
        return self + (-other)

    def __mul__(self, other):
        if not isinstance(other, _Dual):
            return _Dual(self.v * other, None if self.t is None else self.t * other)
        t = None if self.t is None else self.t * other.v
        return _Dual(self.v * other.v, _t_add(t, None if other.t is None else self.v * other.t))

    __rmul__ = __mul__


def _chain(d, value, slope):
    """``f(d)`` given ``value = f(d.v)`` and ``slope = f'(d.v)``."""
    return _Dual(value, None if d.t is None else d.t * slope)


def sigmoid(xp, r):
    """``σ(r)``, overflow-free."""
    e = xp.exp(-xp.abs(r))
    return xp.where(r >= 0, 1 / (1 + e), e / (1 + e))


def softplus(xp, r):
    """``log(1 + exp(r))``, overflow-free."""
    return xp.maximum(r, xp.zeros((), dtype=r.dtype)) + xp.log1p(xp.exp(-xp.abs(r)))


def _exp(xp, d):
    e = xp.exp(d.v)
    return _chain(d, e, e)


def _softplus(xp, d):
    return _chain(d, softplus(xp, d.v), sigmoid(xp, d.v))


def _sigmoid(xp, d):
    s = sigmoid(xp, d.v)
    return _chain(d, s, s * (1 - s))


def _silu(xp, d):
    s = sigmoid(xp, d.v)
    return _chain(d, d.v * s, s * (1 + d.v * (1 - s)))


def _silu_slope(xp, d):
    s = sigmoid(xp, d.v)
    return _chain(d, s * (1 + d.v * (1 - s)), s * (1 - s) * (2 + d.v * (1 - 2 * s)))


def _stack(xp, steps, shape, dtype):
    """The per-step ``[Bt, ·]`` pairs ``steps`` (in time order) stacked on a last axis."""
    if not steps:
        return _Dual(xp.zeros(shape, dtype=dtype))
    v = xp.stack([s.v for s in steps], axis=-1)
    if all(s.t is None for s in steps):
        return _Dual(v)
    zero = xp.zeros(steps[0].v.shape, dtype=dtype)
    return _Dual(v, xp.stack([zero if s.t is None else s.t for s in steps], axis=-1))


def _times(n_steps, reverse):
    return range(n_steps - 1, -1, -1) if reverse else range(n_steps)


def _by_channel(xp, M, channels):
    """``B`` or ``C`` as ``[Bt, Dm or 1, N, L]``: a group's arrays repeated for its
    channels (ungrouped: one row that broadcasts over every channel)."""
    if M.v.ndim == 3:
        return M.map(lambda a: a[:, None])
    return M.map(lambda a: xp.repeat(a, channels // a.shape[1], axis=1))


def _to_groups(xp, d_M, like):
    """A ``[Bt, Dm, N]`` gradient of the channels' copies summed back onto ``like``'s
    ``[Bt, N]`` (ungrouped) or ``[Bt, G, N]`` rows."""
    if like.ndim == 3:
        return d_M.map(lambda a: xp.sum(a, axis=1))
    groups = like.shape[1]

    def fold(a):
        return xp.sum(xp.reshape(a, (a.shape[0], groups, a.shape[1] // groups, a.shape[2])),
                      axis=2)
    return d_M.map(fold)


def _inputs(xp, arrays, tangents):
    """The arrays as pairs with their tangents (None arrays stay None)."""
    return [None if v is None else _Dual(v, None if tangents is None else getattr(tangents, name))
            for v, name in zip(arrays, SelectiveScanGrads._fields, strict=True)]


def _step_size(xp, delta, delta_bias, settings):
    """``(r, Δ)``: the raw step size and the one the recurrence uses."""
    r = delta if delta_bias is None else delta + delta_bias.map(lambda b: b[:, None])
    return r, (_softplus(xp, r) if settings.delta_softplus else r)


def _states(xp, u, Δ, A, Bd, settings):
    """Every step's ``(a_t, x_t)`` by time index (the recurrence; a list of pairs)."""
    n_steps = u.v.shape[2]
    out = [None] * n_steps
    x = _Dual(xp.zeros((u.v.shape[0], u.v.shape[1], A.v.shape[1]), dtype=u.v.dtype))
    for t in _times(n_steps, settings.reverse):
        d_t = Δ.map(lambda a, t=t: a[:, :, t, None])
        a_t = _exp(xp, d_t * A.map(lambda a: a[None]))
        u_t = u.map(lambda a, t=t: a[:, :, t, None])
        x = a_t * x + d_t * Bd.map(lambda a, t=t: a[..., t]) * u_t
        out[t] = (a_t, x)
    return out, x


def _forward(xp, u, delta, A, B, C, D, z, delta_bias, settings):
    """``(y, last_state, p, states)`` as pairs."""
    _, Δ = _step_size(xp, delta, delta_bias, settings)
    channels = u.v.shape[1]
    states, last = _states(xp, u, Δ, A, _by_channel(xp, B, channels), settings)
    Cd = _by_channel(xp, C, channels)
    p = _stack(xp, [(Cd.map(lambda a, t=t: a[..., t]) * x).map(lambda a: xp.sum(a, axis=-1))
                    for t, (_, x) in enumerate(states)], u.v.shape, u.v.dtype)
    if D is not None:
        p = p + D.map(lambda a: a[:, None]) * u
    y = p if z is None else p * _silu(xp, z)
    return y, last, p, states


def selective_scan(u, delta, A, B, C, D, z, delta_bias, settings):
    """``SelectiveScan(y, last_state)`` (the module docstring's forward)."""
    xp = namespace_of(u)
    y, last, _, _ = _forward(xp, *_inputs(xp, (u, delta, A, B, C, D, z, delta_bias), None),
                             settings)
    return SelectiveScan(y.v, last.v if settings.return_last_state else None)


def selective_scan_jvp(u, delta, A, B, C, D, z, delta_bias, tangents, settings):
    """``selective_scan`` and its tangent along ``tangents`` (a ``SelectiveScanGrads``, None
    fields zero): the forward on (value, tangent) pairs."""
    xp = namespace_of(u)
    y, last, _, _ = _forward(xp, *_inputs(xp, (u, delta, A, B, C, D, z, delta_bias), tangents),
                             settings)

    def tangent(d):
        return xp.zeros(d.v.shape, dtype=d.v.dtype) if d.t is None else d.t
    keep = settings.return_last_state
    return (SelectiveScan(y.v, last.v if keep else None),
            SelectiveScan(tangent(y), tangent(last) if keep else None))


def _backward(xp, u, delta, A, B, C, D, z, delta_bias, settings, d_y, d_last):
    """The gradients as pairs (the module docstring's backward)."""
    r, Δ = _step_size(xp, delta, delta_bias, settings)
    _, _, p, states = _forward(xp, u, delta, A, B, C, D, z, delta_bias, settings)
    channels, n_steps, dtype = u.v.shape[1], u.v.shape[2], u.v.dtype
    Bd, Cd = _by_channel(xp, B, channels), _by_channel(xp, C, channels)
    d_p = d_y if z is None else d_y * _silu(xp, z)
    d_z = None if z is None else d_y * p * _silu_slope(xp, z)
    d_u = (d_p * D.map(lambda a: a[:, None]) if D is not None
           else _Dual(xp.zeros(u.v.shape, dtype=dtype)))
    d_D = None if D is None else (d_p * u).map(lambda a: xp.sum(a, axis=(0, 2)))
    g = d_last if d_last is not None else _Dual(
        xp.zeros((u.v.shape[0], channels, A.v.shape[1]), dtype=dtype))
    d_A = _Dual(xp.zeros(A.v.shape, dtype=dtype))
    d_Δ: list = [None] * n_steps
    d_B, d_C, d_u_steps = list(d_Δ), list(d_Δ), list(d_Δ)
    zeros_x = _Dual(xp.zeros(g.v.shape, dtype=dtype))
    order = list(_times(n_steps, settings.reverse))
    for k in range(n_steps - 1, -1, -1):
        t = order[k]
        a_t, x_t = states[t]
        x_prev = states[order[k - 1]][1] if k else zeros_x
        d_p_t = d_p.map(lambda a, t=t: a[:, :, t, None])
        g = g + Cd.map(lambda a, t=t: a[..., t]) * d_p_t
        d_C[t] = _to_groups(xp, d_p_t * x_t, C.v)
        Δ_t, u_t = Δ.map(lambda a, t=t: a[:, :, t, None]), u.map(lambda a, t=t: a[:, :, t, None])
        B_t = Bd.map(lambda a, t=t: a[..., t])
        d_B[t] = _to_groups(xp, g * Δ_t * u_t, B.v)
        d_u_steps[t] = (g * Δ_t * B_t).map(lambda a: xp.sum(a, axis=-1))
        carried = g * a_t * x_prev
        d_Δ[t] = (g * B_t * u_t + carried * A.map(lambda a: a[None])).map(
            lambda a: xp.sum(a, axis=-1))
        d_A = d_A + (carried * Δ_t).map(lambda a: xp.sum(a, axis=0))
        g = a_t * g
    d_u = d_u + _stack(xp, d_u_steps, u.v.shape, dtype)
    d_r = _stack(xp, d_Δ, u.v.shape, dtype)
    if settings.delta_softplus:
        d_r = d_r * _sigmoid(xp, r)
    d_bias = None if delta_bias is None else d_r.map(lambda a: xp.sum(a, axis=(0, 2)))
    return (d_u, d_r, d_A, _stack(xp, d_B, B.v.shape, dtype), _stack(xp, d_C, C.v.shape, dtype),
            d_D, d_z, d_bias)


def _grads(xp, u, delta, A, B, C, D, z, delta_bias, settings, tangents, d_y, d_last_state,
           d_y_tangent, d_last_state_tangent):
    inputs = _inputs(xp, (u, delta, A, B, C, D, z, delta_bias), tangents)
    zeros_y = xp.zeros(u.shape, dtype=u.dtype)
    up_y = _Dual(zeros_y if d_y is None else d_y, d_y_tangent)
    up_last = None
    if d_last_state is not None or d_last_state_tangent is not None:
        shape = (u.shape[0], u.shape[1], A.shape[1])
        up_last = _Dual(xp.zeros(shape, dtype=u.dtype) if d_last_state is None else d_last_state,
                        d_last_state_tangent)
    return _backward(xp, *inputs, settings, up_y, up_last)


def selective_scan_grad(u, delta, A, B, C, D, z, delta_bias, result, settings, *, d_y=None,
                        d_last_state=None):
    """``SelectiveScanGrads`` by the adjoint recurrence (the module docstring); ``result``
    is not read (every value it needs is recomputed from the inputs)."""
    xp = namespace_of(u)
    grads = _grads(xp, u, delta, A, B, C, D, z, delta_bias, settings, None, d_y, d_last_state,
                   None, None)
    return SelectiveScanGrads(*(None if d is None else d.v for d in grads))


def selective_scan_grad_jvp(u, delta, A, B, C, D, z, delta_bias, result, tangents, settings,
                            *, d_y=None, d_last_state=None, d_y_tangent=None,
                            d_last_state_tangent=None):
    """The JVP of ``selective_scan_grad`` along ``tangents`` (a ``SelectiveScanGrads``, None
    fields zero) and the upstream gradients' tangents: the backward on (value, tangent)
    pairs."""
    xp = namespace_of(u)
    grads = _grads(xp, u, delta, A, B, C, D, z, delta_bias, settings, tangents, d_y,
                   d_last_state, d_y_tangent, d_last_state_tangent)

    def tangent(d):
        return xp.zeros(d.v.shape, dtype=d.v.dtype) if d.t is None else d.t
    return (SelectiveScanGrads(*(None if d is None else d.v for d in grads)),
            SelectiveScanGrads(*(None if d is None else tangent(d) for d in grads)))
