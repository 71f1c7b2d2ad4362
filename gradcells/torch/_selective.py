"""``gradcells.torch.selective_scan``: Mamba's selective scan (docs/spec.md §18.4) under
PyTorch's autograd, as ``_scan``'s linear scan: two ``torch.autograd.Function`` classes.

* ``_Selective``: the forward calls ``gc.selective_scan`` (with ``return_last_state``, so
  that a loss on the last state is differentiated) on views of the tensors and returns
  ``y``, ``last_state``; its backward is ``_SelectiveBackward``; its forward mode
  ``gc.selective_scan_jvp``.
* ``_SelectiveBackward``, ``G(p, u) = ∇_p ⟨u, f(p)⟩`` (``gc.selective_scan_grad``): its
  backward, for a cotangent ``v``, is ``vᵀ∂G/∂p`` (``gc.selective_scan_grad_jvp`` along
  ``v`` with zero upstream tangents: the Hessian is symmetric) and ``vᵀ∂G/∂u = J(p)v``
  (``gc.selective_scan_jvp``); its forward mode ``gc.selective_scan_grad_jvp``. Third order
  is not supported.

Only the arrays given travel through the Functions (``names``: u, delta, A, B, C and those
of D, z, delta_bias that are not None). Not a ``torch.library`` custom op yet.
"""

from __future__ import annotations

import torch

import gradcells as gc

from .._core.types import record_settings
from .._validate.selective import selective_args
from ._bridge import on_device, to_tensor, view

__all__ = ["selective_scan"]

_POSITIONAL = ("u", "delta", "A", "B", "C")


def _call(names, tensors):
    """``(positional arrays, optional keyword arrays)`` of the tensors named ``names``."""
    arrays = {n: view(t, n) for n, t in zip(names, tensors, strict=True)}
    return [arrays.pop(n) for n in _POSITIONAL], arrays


def _tangents(names, tangents):
    given = {n: None if t is None else view(t) for n, t in zip(names, tangents, strict=True)}
    return gc.SelectiveScanGrads(**{n: given.get(n) for n in gc.SelectiveScanGrads._fields})


def _picked(names, grads):
    return tuple(to_tensor(getattr(grads, n)) for n in names)


class _Selective(torch.autograd.Function):
    @staticmethod
    def forward(config, names, *tensors):
        with on_device(tensors[0].device):
            positional, optional = _call(names, tensors)
            result = gc.selective_scan(*positional, **optional, **config)
        return to_tensor(result.y), to_tensor(result.last_state)

    @staticmethod
    def setup_context(ctx, inputs, output):
        config, names, *tensors = inputs
        ctx.save_for_backward(*tensors)
        ctx.save_for_forward(*tensors)
        ctx.config, ctx.names = config, names

    @staticmethod
    def backward(ctx, d_y, d_last):
        return (None, None, *_SelectiveBackward.apply(ctx.config, ctx.names, d_y, d_last,
                                                      *ctx.saved_tensors))

    @staticmethod
    def jvp(ctx, _, __, *tangents):
        tensors = ctx.saved_tensors
        with on_device(tensors[0].device):
            positional, optional = _call(ctx.names, tensors)
            _, tangent = gc.selective_scan_jvp(*positional, _tangents(ctx.names, tangents),
                                               **optional, **ctx.config)
        return to_tensor(tangent.y), to_tensor(tangent.last_state)


class _SelectiveBackward(torch.autograd.Function):
    @staticmethod
    def forward(config, names, d_y, d_last, *tensors):
        with on_device(tensors[0].device):
            positional, optional = _call(names, tensors)
            result = gc.selective_scan(*positional, **optional, **config)
            grads = gc.selective_scan_grad(*positional, result, **optional, d_y=view(d_y),
                                           d_last_state=view(d_last))
        return _picked(names, grads)

    @staticmethod
    def setup_context(ctx, inputs, output):
        config, names, d_y, d_last, *tensors = inputs
        ctx.save_for_backward(d_y, d_last, *tensors)
        ctx.save_for_forward(d_y, d_last, *tensors)
        ctx.config, ctx.names = config, names

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *v):
        d_y, d_last, *tensors = ctx.saved_tensors
        with on_device(tensors[0].device):
            positional, optional = _call(ctx.names, tensors)
            result = gc.selective_scan(*positional, **optional, **ctx.config)
            _, by_primals = gc.selective_scan_grad_jvp(
                *positional, result, _tangents(ctx.names, v), **optional, d_y=view(d_y),
                d_last_state=view(d_last))
            _, by_upstream = gc.selective_scan_jvp(*positional, _tangents(ctx.names, v),
                                                   **optional, **ctx.config)
        return (None, None, to_tensor(by_upstream.y), to_tensor(by_upstream.last_state),
                *_picked(ctx.names, by_primals))

    @staticmethod
    def jvp(ctx, _, __, t_d_y, t_d_last, *tangents):
        d_y, d_last, *tensors = ctx.saved_tensors
        with on_device(tensors[0].device):
            positional, optional = _call(ctx.names, tensors)
            result = gc.selective_scan(*positional, **optional, **ctx.config)
            _, tangent = gc.selective_scan_grad_jvp(
                *positional, result, _tangents(ctx.names, tangents), **optional,
                d_y=view(d_y), d_last_state=view(d_last), d_y_tangent=view(t_d_y),
                d_last_state_tangent=view(t_d_last))
        return _picked(ctx.names, tangent)


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, *, D=None, z=None, delta_bias=None,
                   delta_softplus: bool = False, reverse: bool = False,
                   return_last_state: bool = False) -> gc.SelectiveScan:
    """``gc.selective_scan`` on tensors, differentiable in reverse mode (second order
    included) and forward mode, every input and both outputs: ``SelectiveScan(y,
    last_state)`` of tensors (``last_state`` None unless asked for), recording the settings
    as ``gc.selective_scan``'s result does."""
    optional = {"D": D, "z": z, "delta_bias": delta_bias}
    names = (*_POSITIONAL, *(n for n, t in optional.items() if t is not None))
    tensors = (u, delta, A, B, C, *(t for t in optional.values() if t is not None))
    with on_device(u.device):   # the settings the forward records (checked there too)
        _, settings = selective_args(*(view(t, n) for n, t in zip(_POSITIONAL, tensors,
                                                                   strict=False)),
                                     *(None if t is None else view(t, n)
                                       for n, t in optional.items()),
                                     delta_softplus=delta_softplus, reverse=reverse,
                                     return_last_state=return_last_state)
    config = {"delta_softplus": delta_softplus, "reverse": reverse, "return_last_state": True}
    y, last = _Selective.apply(config, names, *tensors)
    return record_settings(gc.SelectiveScan(y, last if return_last_state else None), settings)
