"""``gradcells.jax.linear_scan``: the linear scan (docs/spec.md §18.1) as a JAX function
that ``jax.jit`` and ``jax.grad``/``jax.vjp`` accept, real and complex.

A ``jax.custom_vjp`` around two ``jax.pure_callback`` calls on the host (NumPy arrays, the
CPU backend): the forward ``gc.linear_scan`` and the backward ``gc.linear_scan_grad``. JAX's
cotangents of complex arrays are the conjugates of PyTorch's gradients (``jax.grad`` of a
real loss gives ``∂L/∂Re z - i ∂L/∂Im z``), so the backward conjugates the cotangent in
and the gradients out. Shapes, dtypes and settings are checked at trace time with the NumPy
call's named errors; ``seq_len`` and ``resets`` are constants (concrete arrays, NumPy or
JAX). Forward mode (``jax.jvp``) is not supported yet (``custom_vjp`` has none).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import gradcells as gc

from .._validate.scans import scan_args

__all__ = ["linear_scan"]


def _placeholder(a):
    """A NumPy stand-in for ``a``'s shape and dtype (no memory), for the trace-time checks."""
    return np.broadcast_to(np.zeros((), np.dtype(a.dtype)), tuple(a.shape))


def _constant(value):
    return None if value is None else np.asarray(value)


def linear_scan(a, b, h0, *, seq_len=None, reverse: bool = False, resets=None,
                batch_first: bool = False, method: str = "auto") -> gc.LinearScan:
    """``gc.linear_scan`` on JAX arrays: ``LinearScan(h, h_final)`` of JAX arrays,
    differentiable by ``jax.grad``/``jax.vjp`` (JAX's complex convention) under ``jax.jit``."""
    options = {"seq_len": _constant(seq_len), "reverse": reverse,
               "resets": _constant(resets), "batch_first": batch_first, "method": method}
    scan_args(*(_placeholder(v) for v in (a, b, h0)), **options)    # the named errors
    dtype = jnp.result_type(a, b)
    out = (jax.ShapeDtypeStruct(b.shape, dtype), jax.ShapeDtypeStruct(h0.shape, dtype))

    def host_forward(a, b, h0):
        return tuple(gc.linear_scan(np.asarray(a), np.asarray(b), np.asarray(h0), **options))

    def host_grad(a, b, h0, h, h_final, d_h, d_h_final):
        arrays = tuple(np.asarray(v) for v in (a, b, h0))
        return tuple(gc.linear_scan_grad(*arrays, (np.asarray(h), np.asarray(h_final)),
                                         d_h=np.asarray(d_h), d_h_final=np.asarray(d_h_final),
                                         **options))

    @jax.custom_vjp
    def scan(a, b, h0):
        return jax.pure_callback(host_forward, out, a, b, h0)

    def forward(a, b, h0):
        h, h_final = scan(a, b, h0)
        return (h, h_final), (a, b, h0, h, h_final)

    def backward(residuals, cotangents):
        a, b, h0, h, h_final = residuals
        shapes = tuple(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in (a, b, h0))
        grads = jax.pure_callback(host_grad, shapes, a, b, h0, h, h_final,
                                  *(jnp.conj(c) for c in cotangents))
        return tuple(jnp.conj(g) for g in grads)

    scan.defvjp(forward, backward)
    return gc.LinearScan(*scan(a, b, h0))
