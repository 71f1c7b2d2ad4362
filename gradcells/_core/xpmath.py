"""What the reference cells share, for any array namespace: the overflow-free sigmoid, gate
blocks, and the per-row bookkeeping of sequences with lengths and masks."""

from __future__ import annotations

from .arrays import namespace_of
from .dual import Dual, parts

# The masks of a sequence (docs/spec.md §11.3) are plumbing every backend shares.
from .plan import at_step, masked, zoned, zoneout_grad  # noqa: F401


def sigmoid(xp, z):
    """σ(z) = 0.5·tanh(0.5·z) + 0.5: equal to 1/(1+e^-z), with no overflow for any finite z."""
    return 0.5 * xp.tanh(0.5 * z) + 0.5


def blocks(a, n: int):
    """Split the last axis of ``a`` into ``n`` equal column blocks (views)."""
    width = a.shape[-1] // n
    return tuple(a[..., k * width : (k + 1) * width] for k in range(n))


def valid_rows(seq_len, t):
    """``[B, 1]`` mask of the rows still running at step t, or None when all rows run."""
    return None if seq_len is None else (t < seq_len)[:, None]


def keep(valid, new, old):
    """``new`` in the running rows, ``old`` in the frozen ones."""
    return new if valid is None else namespace_of(new).where(valid, new, old)


def layer_norm(xp, z, gamma, beta, epsilon):
    """Layer normalisation over the last axis (N columns), biased variance:

        ẑ = (z - mean(z)) · r,   r = 1/sqrt(var(z) + ε);   LN(z; γ, β) = γ∘ẑ + β

    Returns ``(LN(z), ẑ, r)`` (``r`` with a trailing axis of 1), what ``layer_norm_grad``
    needs."""
    z_hat, rstd = layer_norm_stats(xp, z, epsilon)
    return gamma * z_hat + beta, z_hat, rstd


def layer_norm_stats(xp, z, epsilon):
    """``(ẑ, r)`` of ``layer_norm``: the normalised ``z`` and the inverse deviation."""
    n = max(z.shape[-1], 1)
    centred = z - z.sum(axis=-1, keepdims=True) / n
    rstd = 1 / xp.sqrt((centred * centred).sum(axis=-1, keepdims=True) / n + epsilon)
    return centred * rstd, rstd


def layer_norm_grad(dy, gamma, z_hat, rstd):
    """The layer norm's backward: ``(dz, dγ, dβ)`` from the gradient ``dy`` of ``LN(z)``,
    with ``g = dy∘γ`` and means over the row:

        dz = r · (g - mean(g) - ẑ∘mean(g∘ẑ))
        dγ = Σ dy∘ẑ,   dβ = Σ dy           (sums over every axis but the last)

    ``mean(g)`` comes from the mean that LN subtracts, ``ẑ∘mean(g∘ẑ)`` from the variance it
    divides by; dropping either is the classic layer-norm bug (notebooks/08)."""
    n = max(z_hat.shape[-1], 1)
    g = dy * gamma
    dz = rstd * (g - g.sum(axis=-1, keepdims=True) / n
                 - z_hat * (g * z_hat).sum(axis=-1, keepdims=True) / n)
    axes = tuple(range(dy.ndim - 1))
    return dz, (dy * z_hat).sum(axis=axes), dy.sum(axis=axes)


# Forward mode (docs/spec.md §12): a tangent travels beside each primal value.


def filled(xp, tangents, primals):
    """``tangents`` (a gradient-type NamedTuple, fields aligned with ``primals``) with every
    None a zero tangent of its primal (None where the primal is None; an ``LSTMNorm``
    field by field)."""
    def fill(t, p):
        if p is None:
            return None
        if hasattr(p, "_fields"):
            return type(p)(*(fill(a, b) for a, b in zip(t or (None,) * len(p), p, strict=True)))
        return xp.zeros_like(p) if t is None else t

    return type(tangents)(*(fill(t, p) for t, p in zip(tangents, primals, strict=True)))


def weights_part(grads, weights):
    """The weights' fields of a gradient-type NamedTuple (a gradient, or the tangents of a
    call), read by name, as ``weights``'s type."""
    return type(weights)(*(getattr(grads, name) for name in weights._fields))


def layer_norm_jvp(xp, z, dz, gamma, d_gamma, beta, d_beta, epsilon):
    """``(LN(z), its tangent)`` for the tangents ``dz``, ``dγ``, ``dβ``: with ``ẑ``, ``r``
    of ``layer_norm`` and means over the row,

        dẑ = r · (dz - mean(dz) - ẑ∘mean(ẑ∘dz));   dLN = dγ∘ẑ + γ∘dẑ + dβ

    (the mean's tangent gives ``mean(dz)``, the variance's ``ẑ∘mean(ẑ∘dz)``: the same two
    terms as ``layer_norm_grad``, for the same reasons)."""
    y, z_hat, rstd = layer_norm(xp, z, gamma, beta, epsilon)
    n = max(z.shape[-1], 1)
    d_hat = rstd * (dz - dz.sum(axis=-1, keepdims=True) / n
                    - z_hat * (z_hat * dz).sum(axis=-1, keepdims=True) / n)
    return y, d_gamma * z_hat + gamma * d_hat + d_beta


def gradient_jvp(forward_jvp, gradient, arrays, weights, result, tangents, settings, upstream,
                 **options):
    """The JVP of a gradient op (docs/spec.md §12): ``(grads, grads_tangent)`` of
    ``gradient(*arrays, weights, result, settings, **upstream, **options)`` along
    ``tangents`` (the gradient type's tangents of ``arrays`` and ``weights``) and the
    upstream gradients' own tangents (``upstream``: name -> ``(gradient, tangent)``, None
    for zero).

    The result's tangent is ``forward_jvp``'s; then the gradient itself runs on dual numbers
    (``gradcells._core.dual``), every input with its tangent, so each line of the
    hand-derived backward is differentiated exactly as written: what reaches the gradient
    through the saved result, the weights and the upstream gradients alike. Branches (the
    clips' masks, a ReLU's) follow the primals, so the tangent is zero through an active
    clip, as the gradient is."""
    xp = namespace_of(arrays[0])
    t = filled(xp, tangents, (*arrays, *weights))
    d_result = forward_jvp(*arrays, weights, t, settings)[1]
    t_arrays = [getattr(t, name) for name in t._fields if name not in weights._fields]
    duals = [_dual(a, da) for a, da in zip(arrays, t_arrays, strict=True)]
    dual_weights = type(weights)(*(_dual(w, dw) for w, dw
                                   in zip(weights, weights_part(t, weights), strict=True)))
    dual_result = type(result)(*(Dual(a, da) for a, da in zip(result, d_result, strict=True)))
    dual_upstream = {name: _upstream_dual(xp, g, dg, like)
                     for name, (g, dg, like) in upstream.items()}
    grads = gradient(*duals, dual_weights, dual_result, settings, **dual_upstream, **options)
    return (type(grads)(*(_part(g, 0) for g in grads)),
            type(grads)(*(_part(g, 1) for g in grads)))


def _dual(a, da):
    """``a`` with its tangent ``da`` (a weight set's ``LSTMNorm`` field by field)."""
    if a is None:
        return None
    if hasattr(a, "_fields"):
        return type(a)(*(_dual(p, t) for p, t in zip(a, da, strict=True)))
    return Dual(a, da)


def _upstream_dual(xp, g, dg, like):
    """An upstream gradient with its tangent (None when both are; a missing one is zeros
    of the result field ``like``)."""
    if g is None and dg is None:
        return None
    return Dual(xp.zeros_like(like) if g is None else g,
                xp.zeros_like(like) if dg is None else dg)


def _part(g, k):
    """The primal (``k = 0``) or tangent (1) of a gradient field of duals."""
    if g is None:
        return None
    if hasattr(g, "_fields"):
        return type(g)(*(_part(a, k) for a in g))
    return parts(g)[k] if isinstance(g, Dual) else (g if k == 0 else namespace_of(g).zeros_like(g))
