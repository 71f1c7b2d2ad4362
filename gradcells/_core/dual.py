"""Dual numbers for arrays: forward-mode differentiation of code written for an array namespace.

A ``Dual`` carries a primal array ``p`` and its tangent ``t`` (same shape and dtype, NumPy or
CuPy) through the operations the reference backend is written with: arithmetic, ``@``,
indexing and item assignment, ``sum``, ``reshape``, ``.T``, and the namespace functions of
``namespace(xp)`` (``tanh``, ``sqrt``, ``exp``, ``expm1``, ``log1p``, ``where``, ``clip``,
``maximum``, ``concatenate``, ``zeros``, ``zeros_like``, ``arange``). Each applies its
derivative to the tangent:

    (a·b)' = a'·b + a·b';   tanh(a)' = (1 - tanh²a)·a';   sqrt(a)' = a' / (2·sqrt a)
    exp(a)' = expm1(a)' = exp(a)·a';   log1p(a)' = a' / (1 + a)
    (a / b)' = (a' - (a/b)·b') / b;   where/clip/maximum/abs: the branch the primal takes

Comparisons compare the primals and give plain boolean arrays, so a branch (a clip's mask, a
ReLU's) is chosen by the primal and its tangent is exact away from the kink; at a clip's
boundary the tangent passes, as the gradient does; ``maximum(z, 0)`` passes only for
``z > 0``, relu'(0) = 0, as the gradient does.

Running the reference's gradient functions on duals gives the directional derivative of the
gradient itself, the second-order JVP (docs/spec.md §12), without a second derivation that
could itself be wrong. ``gradcells._core.arrays.namespace_of`` returns ``namespace(xp)`` for a
dual over ``xp``.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np


def _xp(a):
    """NumPy or CuPy, whichever owns the plain array ``a``."""
    cupy = sys.modules.get("cupy")
    return cupy if cupy is not None and isinstance(a, cupy.ndarray) else np


def parts(a):
    """``(primal, tangent)`` of a dual; of anything else, itself and None (a constant)."""
    return (a.p, a.t) if isinstance(a, Dual) else (a, None)


def _add(*tangents):
    """The sum of the tangents that are not None (None when all are)."""
    present = [t for t in tangents if t is not None]
    if not present:
        return None
    total = present[0]
    for t in present[1:]:
        total = total + t
    return total


def dual(p, t=None):
    """A ``Dual`` of ``p`` and ``t`` (zeros when None, broadcast to ``p``'s shape)."""
    xp = _xp(p)
    p = xp.asarray(p)
    t = xp.zeros_like(p) if t is None else xp.broadcast_to(xp.asarray(t, dtype=p.dtype),
                                                           p.shape)
    return Dual(p, t)


class Dual:
    """An array and its tangent; see the module docstring for what it supports."""

    __slots__ = ("p", "t")
    __array_ufunc__ = None       # NumPy and CuPy defer to the reflected operators below
    __array_priority__ = 1000    # (older CuPy reads the priority instead)

    def __init__(self, p, t):
        self.p, self.t = p, t

    # array attributes ------------------------------------------------------------------
    shape = property(lambda self: self.p.shape)
    ndim = property(lambda self: self.p.ndim)
    dtype = property(lambda self: self.p.dtype)
    T = property(lambda self: Dual(self.p.T, self.t.T))

    def __array_namespace__(self, api_version=None):
        return namespace(_xp(self.p))

    def __len__(self):
        return len(self.p)

    def __getitem__(self, index):
        return Dual(self.p[index], self.t[index])

    def __setitem__(self, index, value):
        p, t = parts(value)
        self.p[index] = p
        self.t[index] = 0 if t is None else t

    def reshape(self, *shape):
        return Dual(self.p.reshape(*shape), self.t.reshape(*shape))

    def sum(self, axis=None, keepdims=False):
        return Dual(self.p.sum(axis=axis, keepdims=keepdims),
                    self.t.sum(axis=axis, keepdims=keepdims))

    def copy(self):
        return Dual(self.p.copy(), self.t.copy())

    # arithmetic ------------------------------------------------------------------------
    def _binary(self, other, value, tangent):
        (a, da), (b, db) = parts(self), parts(other)
        out = value(a, b)
        return Dual(out, _full(tangent(a, da, b, db), out))

    def __add__(self, other):
        return self._binary(other, lambda a, b: a + b, lambda a, da, b, db: _add(da, db))

    __radd__ = __add__

    def __sub__(self, other):
        return self._binary(other, lambda a, b: a - b,
                            lambda a, da, b, db: _add(da, None if db is None else -db))

    def __rsub__(self, other):
        return dual_of(other, self) - self

    def __mul__(self, other):
        return self._binary(other, lambda a, b: a * b, lambda a, da, b, db: _add(
            None if da is None else da * b, None if db is None else a * db))

    __rmul__ = __mul__

    def __truediv__(self, other):
        def tangent(a, da, b, db):
            q = a / b
            return _add(None if da is None else da / b, None if db is None else -q * db / b)
        return self._binary(other, lambda a, b: a / b, tangent)

    def __rtruediv__(self, other):
        return dual_of(other, self) / self

    def __matmul__(self, other):
        return self._binary(other, lambda a, b: a @ b, lambda a, da, b, db: _add(
            None if da is None else da @ b, None if db is None else a @ db))

    def __rmatmul__(self, other):
        return dual_of(other, self) @ self

    def __neg__(self):
        return Dual(-self.p, -self.t)

    def __abs__(self):
        return Dual(abs(self.p), _xp(self.p).sign(self.p) * self.t)

    # comparisons: of the primals, plain booleans ---------------------------------------
    def __lt__(self, other):
        return self.p < parts(other)[0]

    def __le__(self, other):
        return self.p <= parts(other)[0]

    def __gt__(self, other):
        return self.p > parts(other)[0]

    def __ge__(self, other):
        return self.p >= parts(other)[0]


def dual_of(value, like):
    """``value`` (a constant) as a dual with zero tangent, in ``like``'s dtype."""
    p = _xp(like.p).asarray(value, dtype=like.dtype)
    return Dual(p, _xp(p).zeros_like(p))


def _full(tangent, out):
    """A tangent for the result ``out``: broadcast to its shape (zeros when None)."""
    xp = _xp(out)
    if tangent is None:
        return xp.zeros_like(out)
    return tangent if tangent.shape == out.shape else xp.broadcast_to(tangent, out.shape).copy()


# the namespace ------------------------------------------------------------------------


def _tanh(a):
    p, t = parts(a)
    y = _xp(p).tanh(p)
    return y if t is None else Dual(y, (1 - y * y) * t)


def _sqrt(a):
    p, t = parts(a)
    y = _xp(p).sqrt(p)
    return y if t is None else Dual(y, t / (2 * y))


def _exp(a):
    p, t = parts(a)
    y = _xp(p).exp(p)
    return y if t is None else Dual(y, y * t)


def _expm1(a):
    p, t = parts(a)
    xp = _xp(p)
    y = xp.expm1(p)
    return y if t is None else Dual(y, xp.exp(p) * t)


def _log1p(a):
    p, t = parts(a)
    y = _xp(p).log1p(p)
    return y if t is None else Dual(y, t / (1 + p))


def _where(condition, a, b):
    (pa, ta), (pb, tb) = parts(a), parts(b)
    xp = _xp(pa) if _xp(pa) is not np else _xp(pb)
    value = xp.where(condition, pa, pb)
    if ta is None and tb is None:
        return value
    zero = xp.zeros((), dtype=value.dtype)
    return Dual(value, xp.where(condition, zero if ta is None else ta, zero if tb is None else tb))


def _clip(a, low, high):
    p, t = parts(a)
    xp = _xp(p)
    value = xp.clip(p, low, high)
    if t is None:
        return value
    inside = (p >= low) & (p <= high)          # on the boundary the tangent passes
    return Dual(value, xp.where(inside, t, xp.zeros((), dtype=t.dtype)))


def _maximum(a, b):
    """``maximum(a, b)`` for a dual ``a`` and a constant ``b`` (a ReLU): the tangent passes
    where ``a > b`` only."""
    p, t = parts(a)
    xp = _xp(p)
    value = xp.maximum(p, b)
    return value if t is None else Dual(value, xp.where(p > b, t, xp.zeros((), dtype=t.dtype)))


def _concatenate(arrays, axis=0):
    arrays = list(arrays)
    if not any(isinstance(a, Dual) for a in arrays):
        return _xp(arrays[0]).concatenate(arrays, axis=axis)
    like = next(a for a in arrays if isinstance(a, Dual))
    duals = [a if isinstance(a, Dual) else dual_of(a, like) for a in arrays]
    xp = _xp(like.p)
    return Dual(xp.concatenate([d.p for d in duals], axis=axis),
                xp.concatenate([d.t for d in duals], axis=axis))


def namespace(xp):
    """The array namespace of duals over ``xp`` (NumPy or CuPy): ``zeros`` and ``arange``
    make ``xp`` arrays, the other functions follow their arguments."""
    cached = _NAMESPACES.get(xp.__name__)
    if cached is None:
        cached = _NAMESPACES[xp.__name__] = SimpleNamespace(
            tanh=_tanh, sqrt=_sqrt, exp=_exp, expm1=_expm1, log1p=_log1p, where=_where,
            clip=_clip, maximum=_maximum,
            concatenate=_concatenate, zeros_like=_zeros_like, arange=xp.arange,
            zeros=lambda shape, dtype=float: Dual(xp.zeros(shape, dtype), xp.zeros(shape, dtype)))
    return cached


_NAMESPACES: dict[str, SimpleNamespace] = {}


def _zeros_like(a):
    p = parts(a)[0]
    xp = _xp(p)
    return Dual(xp.zeros_like(p), xp.zeros_like(p))
