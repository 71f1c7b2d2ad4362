"""The tangents of a forward-mode (``_jvp``) or second-order (``_grad_jvp``) call
(docs/spec.md §12): each None (zero) or an array of its primal's library, dtype and shape.
"""

from __future__ import annotations

from ..cells import OPS
from .arrays import described, library_and_dtype


def tangents_value(op: str, tangents, primals):
    """Check the ``tangents`` of a JVP call of ``op`` (docs/spec.md §12) against its
    ``primals``, the op's gradient fields' values in order (``x``, the states, the weights'
    fields): None (every tangent zero) or a sequence of the op's gradient type's length,
    each entry None (zero) or an array of its primal's library, dtype and shape (an
    ``LSTMNorm``'s fields one by one). A tangent for an absent primal is a ``ValueError``.
    Returns the tangents as the op's gradient type."""
    grads = OPS[op].grads
    if tangents is None:
        return grads(*(None for _ in grads._fields))
    if not isinstance(tangents, (tuple, list)) or len(tangents) != len(grads._fields):
        raise TypeError(f"tangents must be a {grads.__name__} (or None: every tangent zero), "
                        f"got {described(tangents)}")
    checked = [_tangent(f"tangents.{name}", t, p)
               for name, t, p in zip(grads._fields, tangents, primals, strict=True)]
    return grads(*checked)


def _tangent(name, tangent, primal, of=None):
    """One field of ``tangents_value``: None, or checked against its primal (named ``of``;
    by default ``name`` without its first part, ``tangents.x`` -> ``x``)."""
    of = name.split(".", 1)[-1] if of is None else of
    if tangent is None:
        return None
    if primal is None:
        raise ValueError(f"{name} is given, but the call has no {of}")
    if isinstance(primal, tuple) and hasattr(primal, "_fields"):   # a nested weight set
        kind = type(primal)
        if not isinstance(tangent, (tuple, list)) or len(tangent) != len(primal):
            raise TypeError(f"{name} must be None or a gradcells.{kind.__name__}, got "
                            f"{described(tangent)}")
        return kind(*(_tangent(f"{name}.{field}", t, p)
                      for field, t, p in zip(kind._fields, tangent, primal, strict=True)))
    library_and_dtype([(of, primal), (name, tangent)])
    if tuple(tangent.shape) != tuple(primal.shape):
        raise ValueError(f"{name} must have its primal's shape {tuple(primal.shape)}, got "
                         f"{tuple(tangent.shape)}")
    return tangent


def stack_tangents(grads_type, tangents, x, states, weights):
    """Check a stack JVP's ``tangents`` (None, or a ``grads_type``: ``x``'s, the states' and
    a list of weight sets of tangents, one per weight set or None) against its primals; each
    layer's weight tangents are checked by its sequence JVP. Returns ``(dx, d_states,
    d_weights)``, ``d_weights`` one entry per weight set (None: zero)."""
    if tangents is None:
        return None, [None] * len(states), [None] * len(weights)
    if not isinstance(tangents, (tuple, list)) or len(tangents) != len(grads_type._fields):
        raise TypeError(f"tangents must be a {grads_type.__name__} (or None: every tangent "
                        f"zero), got {described(tangents)}")
    tangents = grads_type(*tangents)
    primals = (x, *states)
    checked = [_tangent(f"tangents.{n}", getattr(tangents, n), p)
               for n, p in zip(grads_type._fields[:len(primals)], primals, strict=True)]
    d_weights = tangents.weights
    if d_weights is None:
        return checked[0], checked[1:], [None] * len(weights)
    if not isinstance(d_weights, (tuple, list)) or len(d_weights) != len(weights):
        raise ValueError(f"tangents.weights must list one weight set of tangents (or None) per "
                         f"weight set ({len(weights)}), got {described(d_weights)}")
    return checked[0], checked[1:], [None if d is None else type(w)(*d)
                                     for d, w in zip(d_weights, weights, strict=True)]


def upstream_tangents(op: str, result, given):
    """Check the upstream gradients' tangents of a gradient JVP call of ``op``: ``given``
    maps ``d_h_tangent``, ... to None or an array of the result field's (``h``, ...)
    library, dtype and shape. Returns ``given``."""
    fields = dict(zip(OPS[op].result._fields, result, strict=True))
    for name, tangent in given.items():
        field = name.removeprefix("d_").removesuffix("_tangent")
        _tangent(name, tangent, fields[field], f"the result's {field}")
    return given

