"""``gradcells.torch.linear_scan``: the linear scan (docs/spec.md §18.1) under PyTorch's
autograd, real and complex.

Two ``torch.autograd.Function`` classes, as ``_functions``' for the cells:

* ``_Scan``: the forward calls ``gc.linear_scan`` on views of the tensors (NumPy on the
  CPU, CuPy on CUDA) and returns ``h``, ``h_final`` as tensors; its backward is
  ``_ScanBackward``; its forward mode ``gc.linear_scan_jvp``.
* ``_ScanBackward``, ``G(p, u) = ∇_p Re⟨u, f(p)⟩`` (``gc.linear_scan_grad``, the forward
  recomputed from the primals): its backward, for a cotangent ``v`` of its output, is
  ``vᵀ∂G/∂p = (∂/∂ε) G(p + εv, u)`` (the real Hessian is symmetric;
  ``gc.linear_scan_grad_jvp`` with zero upstream tangents) and ``vᵀ∂G/∂u = J(p)v`` (the
  tangent of ``gc.linear_scan_jvp``); its forward mode ``gc.linear_scan_grad_jvp``.
  Complex arrays follow PyTorch's convention throughout (``z.grad = ∂L/∂Re z +
  i ∂L/∂Im z``), which is ``gc.linear_scan_grad``'s; the directional derivatives are the
  real ones (``t(conj z) = conj(t_z)``). Third order is not supported.

``seq_len`` and ``resets`` are data, never differentiated (tensors or NumPy arrays). Not
registered as a ``torch.library`` custom op yet: ``torch.compile`` graph-breaks on it.
"""

from __future__ import annotations

import torch

import gradcells as gc

from .._core.types import record_settings
from .._validate.scans import scan_args
from ._bridge import on_device, to_tensor, view

__all__ = ["linear_scan"]


def _arrays(*tensors):
    return tuple(view(t, name) for t, name in zip(tensors, ("a", "b", "h0"), strict=False))


def _tangents(*tangents):
    return gc.LinearScanGrads(*(None if t is None else view(t) for t in tangents))


def _tensors(values):
    return tuple(to_tensor(v) for v in values)


class _Scan(torch.autograd.Function):
    @staticmethod
    def forward(a, b, h0, config):
        with on_device(b.device):
            result = gc.linear_scan(*_arrays(a, b, h0), **config)
        return _tensors(result)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, h0, config = inputs
        ctx.save_for_backward(a, b, h0)
        ctx.save_for_forward(a, b, h0)
        ctx.config = config

    @staticmethod
    def backward(ctx, d_h, d_h_final):
        a, b, h0 = ctx.saved_tensors
        return (*_ScanBackward.apply(a, b, h0, d_h, d_h_final, ctx.config), None)

    @staticmethod
    def jvp(ctx, t_a, t_b, t_h0, _):
        a, b, h0 = ctx.saved_tensors
        with on_device(b.device):
            _, tangent = gc.linear_scan_jvp(*_arrays(a, b, h0), _tangents(t_a, t_b, t_h0),
                                            **ctx.config)
        return _tensors(tangent)


class _ScanBackward(torch.autograd.Function):
    @staticmethod
    def forward(a, b, h0, d_h, d_h_final, config):
        with on_device(b.device):
            arrays = _arrays(a, b, h0)
            result = gc.linear_scan(*arrays, **config)
            grads = gc.linear_scan_grad(*arrays, result, d_h=view(d_h),
                                        d_h_final=view(d_h_final))
        return _tensors(grads)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, h0, d_h, d_h_final, config = inputs
        ctx.save_for_backward(a, b, h0, d_h, d_h_final)
        ctx.save_for_forward(a, b, h0, d_h, d_h_final)
        ctx.config = config

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_a, v_b, v_h0):
        a, b, h0, d_h, d_h_final = ctx.saved_tensors
        with on_device(b.device):
            arrays, v = _arrays(a, b, h0), _tangents(v_a, v_b, v_h0)
            result = gc.linear_scan(*arrays, **ctx.config)
            _, by_primals = gc.linear_scan_grad_jvp(*arrays, result, v, d_h=view(d_h),
                                                    d_h_final=view(d_h_final))
            _, by_upstream = gc.linear_scan_jvp(*arrays, v, **ctx.config)
        return (*_tensors(by_primals), *_tensors(by_upstream), None)

    @staticmethod
    def jvp(ctx, t_a, t_b, t_h0, t_d_h, t_d_h_final, _):
        a, b, h0, d_h, d_h_final = ctx.saved_tensors
        with on_device(b.device):
            arrays = _arrays(a, b, h0)
            result = gc.linear_scan(*arrays, **ctx.config)
            _, tangent = gc.linear_scan_grad_jvp(
                *arrays, result, _tangents(t_a, t_b, t_h0), d_h=view(d_h),
                d_h_final=view(d_h_final), d_h_tangent=view(t_d_h),
                d_h_final_tangent=view(t_d_h_final))
        return _tensors(tangent)


def _data(value, name):
    """``seq_len`` or ``resets``: a tensor as its NumPy/CuPy view, anything else as it is."""
    return view(value, name) if isinstance(value, torch.Tensor) else value


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, *,
                seq_len=None, reverse: bool = False, resets=None,
                batch_first: bool = False, method: str = "auto") -> gc.LinearScan:
    """``gc.linear_scan`` on tensors, differentiable in reverse mode (second order
    included) and forward mode: ``LinearScan(h, h_final)`` of tensors, recording the
    settings as ``gc.linear_scan``'s result does. Complex tensors follow PyTorch's
    convention (docs/spec.md §18.1)."""
    config = {"seq_len": _data(seq_len, "seq_len"), "reverse": reverse,
              "resets": _data(resets, "resets"), "batch_first": batch_first, "method": method}
    with on_device(b.device):   # the settings the forward records (checked there too)
        _, settings = scan_args(*_arrays(a, b, h0), **config)
    h, h_final = _Scan.apply(a, b, h0, config)
    return record_settings(gc.LinearScan(h, h_final), settings)
