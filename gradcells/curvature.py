"""Curvature products under a user's loss (docs/spec.md §12): the Hessian-vector and the
Gauss-Newton-vector product of ``L(a) = ℓ(op(a))`` for a cell or sequence op, built from the
op's forward mode (``op_jvp``), its gradient (``op_grad``) and the gradient's JVP
(``op_grad_jvp``). No math of their own beyond the chain rule:

    J·t                          = op_jvp(a, t)                    (the result's tangent)
    g = ∇ℓ,   H_ℓ·(J·t)           = the loss's gradient and Hessian-vector product
    ∇L = Jᵀ·g,   H_L·t = Jᵀ·H_ℓ·J·t + Σ_k g_k·∇²op_k·t   = op_grad_jvp(a, t; g, H_ℓ·J·t)
    G·t = Jᵀ·H_ℓ·J·t                                              = op_grad(a; H_ℓ·J·t)

The Gauss-Newton matrix ``G`` drops the second term, the model's own curvature: it is
positive semi-definite for a convex ``ℓ``, which is what Hessian-free optimisation needs
(Martens and Sutskever 2011). ``ℓ`` enters only through two callables, so any loss, written
in any library, will do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._core.specs import OPS, OPTIONAL_WEIGHTS
from ._core.types import LSTMSettings

LossGrad = Callable[[Any], Mapping[str, Any]]
LossHVP = Callable[[Any, Any], Mapping[str, Any]]


def _ops(op):
    """The spec, forward-mode, gradient and gradient-JVP ops of the public op ``op``."""
    from . import cells, sequences

    name = getattr(op, "__name__", op)
    if name not in OPS:
        raise TypeError(f"op must be one of the cell or sequence ops ({', '.join(OPS)}), got "
                        f"{name!r}")
    spec = OPS[name]
    module = sequences if spec.sequence else cells
    return spec, *(getattr(module, f"{name}{suffix}") for suffix in ("_jvp", "_grad",
                                                                     "_grad_jvp"))


def _grad_keywords(spec, keywords, clip_grad):
    """The forward's keywords its gradient takes too: the optional weights and ``backend``
    (the result records every setting), and an LSTM's ``clip_grad``."""
    given = {k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS or k == "backend"}
    return {**given, "clip_grad": clip_grad} if spec.settings is LSTMSettings else given


def _upstream(spec, values, what):
    """The loss's mapping checked: keys among the gradient's upstream names."""
    unknown = sorted(set(values) - set(spec.upstream))
    if unknown:
        raise ValueError(f"{what} must map the gradient's upstream names "
                         f"({', '.join(spec.upstream)}) to arrays, got {', '.join(unknown)}")
    return dict(values)


def hessian_vector_product(op: Callable[..., Any] | str, arrays: Sequence[Any],
                           tangents: tuple | None, *, loss_grad: LossGrad, loss_hvp: LossHVP,
                           clip_grad: str = "exact", **keywords: Any) -> tuple[tuple, tuple]:
    """``(∇L, H_L·t)`` for ``L(a) = ℓ(op(*arrays, **keywords))`` along ``tangents`` (the op's
    gradient type of the arrays' tangents, as for ``op_jvp``).

    ``loss_grad(result)`` returns ``ℓ``'s gradient by the gradient op's upstream names
    (``{"d_h": ..., "d_h_final": ...}``); ``loss_hvp(result, d_result)`` its Hessian applied
    to the result's tangent, by the same names. ``op`` is a public cell or sequence op (the
    function or its name); ``keywords`` are its keywords; ``clip_grad`` as for an LSTM's
    gradient. Both results have the op's gradient type.
    """
    spec, forward_jvp, _, grad_jvp = _ops(op)
    result, d_result = forward_jvp(*arrays, tangents, **keywords)
    upstream = _upstream(spec, loss_grad(result), "loss_grad")
    curvature = _upstream(spec, loss_hvp(result, d_result), "loss_hvp")
    return grad_jvp(*arrays, result, tangents, **upstream,
                    **{f"{name}_tangent": v for name, v in curvature.items()},
                    **_grad_keywords(spec, keywords, clip_grad))


def gauss_newton_vector_product(op: Callable[..., Any] | str, arrays: Sequence[Any],
                                tangents: tuple | None, *, loss_hvp: LossHVP,
                                clip_grad: str = "exact", **keywords: Any) -> tuple:
    """``G·t = Jᵀ·H_ℓ·J·t`` for ``L(a) = ℓ(op(*arrays, **keywords))`` along ``tangents``:
    the forward's tangent (``op_jvp``), ``loss_hvp(result, d_result)`` (``ℓ``'s Hessian
    applied to it, by the gradient's upstream names) and the gradient of that
    (``op_grad``). Arguments as for ``hessian_vector_product``; returns the op's gradient
    type."""
    spec, forward_jvp, gradient, _ = _ops(op)
    result, d_result = forward_jvp(*arrays, tangents, **keywords)
    curvature = _upstream(spec, loss_hvp(result, d_result), "loss_hvp")
    return gradient(*arrays, result, **curvature, **_grad_keywords(spec, keywords, clip_grad))
