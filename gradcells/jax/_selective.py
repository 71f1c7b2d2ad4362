"""``gradcells.jax.selective_scan``: Mamba's selective scan (docs/spec.md §18.4) as a JAX
function: ``jax.jit`` and ``jax.grad``/``vjp`` over every input and both outputs.

Its arrays are in Mamba's ``[Bt, Dm, L]`` layout, not the time-major ``[T, B, ·]`` the
generic primitives (``_ops``, ``_primitives``) read from an ``OpSpec``'s labels, so it is
written here: a ``jax.custom_vjp`` whose primal runs ``gc.selective_scan`` and whose
backward runs ``gc.selective_scan_grad`` on the host through ``jax.pure_callback``
(``last_state`` always computed, so that a loss on it is differentiated). Shapes, dtypes
and settings are checked at trace time by ``gc.selective_scan``'s validation, on stand-ins.
Not yet: ``jax.jvp`` and ``jax.vmap`` (the generic primitives give the cells those).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import gradcells as gc

from .._validate.selective import selective_args

__all__ = ["selective_scan"]

_POSITIONAL = ("u", "delta", "A", "B", "C")


def _stand_in(a):
    """A zero-strided NumPy array of ``a``'s shape and dtype (validation without data)."""
    return None if a is None else np.broadcast_to(np.zeros((), dtype=a.dtype), a.shape)


@functools.cache
def _function(names, settings):
    """The custom-VJP function of the arrays ``names`` under the ``settings`` items."""
    config = dict(settings)

    def split(arrays):
        named = dict(zip(names, (np.asarray(a) for a in arrays), strict=True))
        return [named.pop(n) for n in _POSITIONAL], named

    def forward_host(*arrays):
        positional, optional = split(arrays)
        return tuple(gc.selective_scan(*positional, **optional, **config,
                                       return_last_state=True))

    def grad_host(d_y, d_last, *arrays):
        positional, optional = split(arrays)
        result = gc.selective_scan(*positional, **optional, **config, return_last_state=True)
        grads = gc.selective_scan_grad(*positional, result, **optional, d_y=np.asarray(d_y),
                                       d_last_state=np.asarray(d_last))
        return tuple(getattr(grads, n) for n in names)

    def shapes(arrays):
        u, A = arrays[0], arrays[2]
        return (jax.ShapeDtypeStruct(u.shape, u.dtype),
                jax.ShapeDtypeStruct((u.shape[0], u.shape[1], A.shape[1]), u.dtype))

    @jax.custom_vjp
    def scan(*arrays):
        return jax.pure_callback(forward_host, shapes(arrays), *arrays)

    def scan_forward(*arrays):
        return scan(*arrays), arrays

    def scan_backward(arrays, cotangents):
        out = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)
        return jax.pure_callback(grad_host, out, *cotangents, *arrays)

    scan.defvjp(scan_forward, scan_backward)
    return scan


def selective_scan(u, delta, A, B, C, *, D=None, z=None, delta_bias=None,
                   delta_softplus: bool = False, reverse: bool = False,
                   return_last_state: bool = False) -> gc.SelectiveScan:
    """``gc.selective_scan`` on JAX arrays: ``SelectiveScan(y, last_state)`` of JAX arrays
    (``last_state`` None unless asked for), differentiable with ``jax.grad`` under
    ``jax.jit``."""
    optional = {"D": D, "z": z, "delta_bias": delta_bias}
    names = (*_POSITIONAL, *(n for n, a in optional.items() if a is not None))
    arrays = [jnp.asarray(a) for a in (u, delta, A, B, C, *(a for a in optional.values()
                                                              if a is not None))]
    selective_args(*(_stand_in(a) for a in arrays[:5]),
                   *(None if a is None else _stand_in(jnp.asarray(a))
                     for a in optional.values()),
                   delta_softplus=delta_softplus, reverse=reverse,
                   return_last_state=return_last_state)
    settings = (("delta_softplus", bool(delta_softplus)), ("reverse", bool(reverse)))
    y, last = _function(names, settings)(*arrays)
    return gc.SelectiveScan(y, last if return_last_state else None)
