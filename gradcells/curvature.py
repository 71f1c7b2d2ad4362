"""Curvature products under a user's loss (docs/spec.md §12): the Hessian-vector and the
Gauss-Newton-vector product of ``L(a) = ℓ(op(a))`` for a cell, sequence or stack op, built
from the op's forward mode (``op_jvp``), its gradient (``op_grad``) and the gradient's JVP
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
from typing import Any, NamedTuple

from . import sequences, stacks, steps
from .cells import OPS, OPTIONAL_WEIGHTS, STACKS
from .cells.lstm.spec import LSTMSettings

LossGrad = Callable[[Any], Mapping[str, Any]]
LossHVP = Callable[[Any, Any], Mapping[str, Any]]


class _Ops(NamedTuple):
    """What a curvature product calls for one public op."""

    upstream: tuple[str, ...]     # its gradient's upstream names
    jvp: Callable[..., Any]
    grad: Callable[..., Any]
    grad_jvp: Callable[..., Any]
    keywords: tuple[str, ...]     # the forward's keywords its gradient takes too


def _ops(op) -> _Ops:
    """The forward-mode, gradient and gradient-JVP ops of the public op ``op`` (a cell,
    sequence or stack op, or its name)."""
    name = getattr(op, "__name__", op)
    if name in STACKS:
        module, spec = stacks, OPS[STACKS[name]]
        upstream = tuple(n for n in spec.upstream if n.endswith("_final") or n == "d_h")
        keywords = ("backend", "clip_grad") if spec.settings is LSTMSettings else ("backend",)
    elif name in OPS:
        spec = OPS[name]
        module, upstream = (sequences if spec.sequence else steps), spec.upstream
        keywords = (*OPTIONAL_WEIGHTS, "backend",
                    *(("clip_grad",) if spec.settings is LSTMSettings else ()))
    else:
        raise TypeError(f"op must be a cell, sequence or stack op ({', '.join(OPS)}, "
                        f"{', '.join(STACKS)}), got {name!r}")
    return _Ops(upstream=upstream, jvp=getattr(module, f"{name}_jvp"),
                grad=getattr(module, f"{name}_grad"),
                grad_jvp=getattr(module, f"{name}_grad_jvp"), keywords=keywords)


def _grad_keywords(ops, keywords, clip_grad):
    """The forward's keywords its gradient takes too (the result records every setting),
    and an LSTM's ``clip_grad``."""
    return {k: v for k, v in {**keywords, "clip_grad": clip_grad}.items() if k in ops.keywords}


def _upstream(ops, values, what):
    """The loss's mapping checked: keys among the gradient's upstream names."""
    unknown = sorted(set(values) - set(ops.upstream))
    if unknown:
        raise ValueError(f"{what} must map the gradient's upstream names "
                         f"({', '.join(ops.upstream)}) to arrays, got {', '.join(unknown)}")
    return dict(values)


def hessian_vector_product(op: Callable[..., Any] | str, arrays: Sequence[Any],
                           tangents: tuple | None, *, loss_grad: LossGrad, loss_hvp: LossHVP,
                           clip_grad: str = "exact", **keywords: Any) -> tuple[tuple, tuple]:
    """``(∇L, H_L·t)`` for ``L(a) = ℓ(op(*arrays, **keywords))`` along ``tangents`` (the op's
    gradient type of the arrays' tangents, as for ``op_jvp``).

    ``loss_grad(result)`` returns ``ℓ``'s gradient by the gradient op's upstream names
    (``{"d_h": ..., "d_h_final": ...}``); ``loss_hvp(result, d_result)`` its Hessian applied
    to the result's tangent, by the same names. ``op`` is a public cell, sequence or stack
    op (the function or its name); ``keywords`` are its keywords; ``clip_grad`` as for an LSTM's
    gradient. Both results have the op's gradient type.
    """
    ops = _ops(op)
    result, d_result = ops.jvp(*arrays, tangents, **keywords)
    upstream = _upstream(ops, loss_grad(result), "loss_grad")
    curvature = _upstream(ops, loss_hvp(result, d_result), "loss_hvp")
    return ops.grad_jvp(*arrays, result, tangents, **upstream,
                        **{f"{name}_tangent": v for name, v in curvature.items()},
                        **_grad_keywords(ops, keywords, clip_grad))


def gauss_newton_vector_product(op: Callable[..., Any] | str, arrays: Sequence[Any],
                                tangents: tuple | None, *, loss_hvp: LossHVP,
                                clip_grad: str = "exact", **keywords: Any) -> tuple:
    """``G·t = Jᵀ·H_ℓ·J·t`` for ``L(a) = ℓ(op(*arrays, **keywords))`` along ``tangents``:
    the forward's tangent (``op_jvp``), ``loss_hvp(result, d_result)`` (``ℓ``'s Hessian
    applied to it, by the gradient's upstream names) and the gradient of that
    (``op_grad``). Arguments as for ``hessian_vector_product``; returns the op's gradient
    type."""
    ops = _ops(op)
    result, d_result = ops.jvp(*arrays, tangents, **keywords)
    curvature = _upstream(ops, loss_hvp(result, d_result), "loss_hvp")
    return ops.grad(*arrays, result, **curvature, **_grad_keywords(ops, keywords, clip_grad))
