"""The JAX primitives behind ``gradcells.jax`` (docs/spec.md §13): one call of a gradcells op
as a JAX primitive, its forward mode as a second primitive linear in the tangents, and the
transpose of that one from the op's gradient.

A call is described by a hashable ``Call`` (the op, the names of its differentiable arrays
and of its constant arrays, the static keywords, the result's shapes). Three rules, each the
op's own (none is JAX's autodiff of the kernels):

    forward_p(a, k)            = gc.<op>(a; k)                      the primal
    jvp_p(a, k, t)             = J(a)·t           = gc.<op>_jvp      forward mode
    transpose of jvp_p at ct   = J(a)ᵀ·ct         = gc.<op>_grad     reverse mode

(``a``: the arrays, ``k``: the constants seq_len and the masks, no tangent). ``grad`` is
JAX's linearise-then-transpose: the JVP rule emits ``jvp_p``, linear in ``t``, and its
transpose rule runs the gradient. The kernels run on the host through ``jax.pure_callback``
(NumPy arrays, the CPU backend unless ``backend=`` says otherwise). ``vmap`` maps either
primitive sequentially (``lax.map`` over the mapped axis, unmapped operands shared); the
gradient's callback maps sequentially too.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

import gradcells as gc

from .._core.specs import MASKS, NORM_ARRAYS, OPS
from .._core.types import LSTMNorm


@dataclasses.dataclass(frozen=True)
class Call:
    """One op call's static part: ``diff`` the differentiable arrays' flat names (as
    ``OpSpec.flat_arrays``), ``const`` the constants' names (``seq_len``, masks),
    ``options`` the keywords, ``out`` each result field's ``(shape, dtype)``."""

    op: str
    diff: tuple[str, ...]
    const: tuple[str, ...]
    options: tuple[tuple[str, object], ...]
    out: tuple[tuple[tuple[int, ...], np.dtype], ...]

    @property
    def spec(self):
        return OPS[self.op]

    def keywords(self, values, of=None):
        """The gc call's keywords from the diff and constant arrays ``values`` (NumPy),
        those ``of`` (a gc function) takes when given."""
        named = _grouped(self.diff + self.const, values)
        named.update(self.options)
        if of is not None:
            taken = _parameters(of)
            named = {k: a for k, a in named.items() if k in taken}
        return named

    def shapes(self):
        return [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in self.out]


@functools.cache
def _parameters(function):
    return frozenset(inspect.signature(function).parameters)


def _grouped(names, values):
    """Flat ``name -> array``, the six ``layer_norm.*`` arrays as one ``LSTMNorm``."""
    named = dict(zip(names, values))
    norm = [named.pop(n) for n in NORM_ARRAYS if n in named]
    if norm:
        named["layer_norm"] = LSTMNorm(*norm)
    return named


def _flat(grads, names):
    """The fields ``names`` (flat, as ``Call.diff``) of a gradient NamedTuple."""
    return [getattr(grads.layer_norm, n.split(".")[1]) if n.startswith("layer_norm.")
            else getattr(grads, n) for n in names]


def _host(arrays):
    return [np.asarray(a) for a in arrays]


# --------------------------------------------------------------------------------------
# Host functions: NumPy in, NumPy out, each one gc call


def _host_forward(call, *arrays):
    result = getattr(gc, call.op)(**call.keywords(_host(arrays)))
    return tuple(np.asarray(a) for a in result)


def _host_jvp(call, *arrays):
    """``J·t``: the tangents of the result fields along the diff arrays' tangents (the
    operands: the arrays, the constants, the result, the tangents)."""
    arrays = _host(arrays)
    n = len(call.diff) + len(call.const)
    tangents = call.spec.grads(**_grouped(call.diff, arrays[n + len(call.out):]))
    _, d_result = getattr(gc, f"{call.op}_jvp")(**call.keywords(arrays[:n]),
                                                tangents=tangents)
    return tuple(np.zeros(s, d) if t is None else np.asarray(t, d)
                 for t, (s, d) in zip(d_result, call.out))


def _host_vjp(call, given, unsupported, *arrays):
    """``Jᵀ·ct``: the diff arrays' gradients from the result's cotangents ``given`` (the
    upstream names of those passed); ``unsupported``: the names of result fields the
    op's gradient takes no upstream for, whose cotangents must be zero."""
    arrays = _host(arrays)
    n, n_out = len(call.diff) + len(call.const), len(call.out)
    inputs, result = arrays[:n], arrays[n:n + n_out]
    upstream = arrays[n + n_out:n + n_out + len(given)]
    for name, ct in zip(unsupported, arrays[n + n_out + len(given):]):
        if np.any(ct):
            raise ValueError(
                f"{call.op}_grad takes no upstream gradient of the result's {name!r}: "
                f"differentiate through {', '.join(call.spec.upstream)} only")
    function = getattr(gc, f"{call.op}_grad")
    grads = function(**call.keywords(inputs, of=function),
                     **{call.spec.result_arg: call.spec.result(*result)},
                     **dict(zip(given, upstream)))
    return tuple(np.asarray(g, a.dtype) for g, a in zip(_flat(grads, call.diff), inputs))


# --------------------------------------------------------------------------------------
# The primitives


def _callback(host, call, *operands):
    return jax.pure_callback(functools.partial(host, call), call.shapes(), *operands,
                             vmap_method="sequential")


def _primitive(name, host):
    p = Primitive(name)
    p.multiple_results = True
    impl = functools.partial(_callback, host)

    def rule(*operands, call):
        return impl(call, *operands)

    p.def_impl(rule)
    p.def_abstract_eval(lambda *operands, call: [jax.core.ShapedArray(s, d)
                                                  for s, d in call.out])
    mlir.register_lowering(p, mlir.lower_fun(rule, multiple_results=True))
    batching.primitive_batchers[p] = lambda operands, dims, call: _batched(
        p, operands, dims, call=call)
    return p


forward_p = _primitive("gradcells_forward", _host_forward)
jvp_p = _primitive("gradcells_jvp", _host_jvp)


def _forward_jvp(primals, tangents, *, call):
    """``forward_p``'s JVP rule: the primal and ``jvp_p`` of the diff arrays' tangents (the
    constants' tangents are dropped: they are no inputs of the derivative). ``jvp_p`` also
    takes the primal result, which its transpose reads (the gradient needs the forward's
    result) and its host function ignores."""
    out = forward_p.bind(*primals, call=call)
    d = [ad.instantiate_zeros(t) for t in tangents[:len(call.diff)]]
    return out, jvp_p.bind(*primals, *out, *d, call=call)


def _jvp_transpose(cts, *operands, call):
    """``jvp_p``'s transpose: ``Jᵀ·ct`` through ``gc.<op>_grad`` for the tangent operands
    (the primals and constants are known: JAX linearises before it transposes)."""
    n, n_out = len(call.diff) + len(call.const), len(call.out)
    known, result, tangents = operands[:n], operands[n:n + n_out], operands[n + n_out:]
    if any(ad.is_undefined_primal(a) for a in (*known, *result)):
        raise NotImplementedError(
            f"gradcells.jax.{call.op}: transposing along the primal inputs is not supported")
    fields = call.spec.result._fields
    upstream = {name: fields.index(name.removeprefix("d_")) for name in call.spec.upstream}
    given = [u for u, i in upstream.items() if not isinstance(cts[i], ad.Zero)]
    unsupported = [f for i, f in enumerate(fields)
                   if i not in upstream.values() and not isinstance(cts[i], ad.Zero)]
    arrays = [*known, *result, *(cts[upstream[u]] for u in given),
              *(cts[fields.index(f)] for f in unsupported)]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in known[:len(call.diff)]]
    grads = jax.pure_callback(
        functools.partial(_host_vjp, call, tuple(given), tuple(unsupported)), shapes,
        *arrays, vmap_method="sequential")
    return [None] * (n + n_out) + [g if ad.is_undefined_primal(t) else None
                         for g, t in zip(grads, tangents)]


ad.primitive_jvps[forward_p] = _forward_jvp
ad.primitive_transposes[jvp_p] = _jvp_transpose


def _batched(p, operands, dims, *, call):
    """vmap of ``p``: folded into the op's batch axis when it can be (``_folded``), else
    one call per index of the mapped axis (``lax.map``, unmapped operands shared)."""
    folded = _folded(p, operands, dims, call)
    if folded is not None:
        return folded
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(operands, dims)]
    mapped = [i for i, d in enumerate(dims) if d is not None]

    def one(slices):
        args = list(moved)
        for i, s in zip(mapped, slices):
            args[i] = s
        return p.bind(*args, call=call)

    out = jax.lax.map(one, [moved[i] for i in mapped])
    return out, [0] * len(out)


def _operand_labels(p, call):
    """The shape labels of ``p``'s operands (weights: none with ``B``; the masks marked
    ``None``: they broadcast, and fold only when their ``B`` extent is 1)."""
    spec = call.spec
    by_name = {"x": spec.x_labels, **dict(zip(spec.states, spec.state_labels)),
               "seq_len": ("B",)}
    diff = [by_name.get(n, ()) for n in call.diff]
    const = [by_name.get(n) for n in call.const]
    return diff + const + ([*spec.result_labels(), *diff] if p is jvp_p else [])


def _batch_axis(labels, batch_first):
    if labels is None or "B" not in labels:
        return None
    return 0 if batch_first and len(labels) == 3 else labels.index("B")


def _folded(p, operands, dims, call):
    """vmap of ``p`` as one call on ``N·B`` rows, when only arrays with a batch axis are
    mapped (x, the states, seq_len, their tangents and results) and each mask is the same
    for every row: the mapped axis is moved before the batch axis and merged with it, an
    unmapped per-row operand repeated. None when it cannot be."""
    batch_first = dict(call.options).get("batch_first", False)
    labels = _operand_labels(p, call)
    axes = [_batch_axis(lab, batch_first) for lab in labels]
    n = next(a.shape[d] for a, d in zip(operands, dims) if d is not None)
    names = [*call.diff, *call.const]
    for a, d, lab, axis, name in zip(operands, dims, labels, axes, names + [""] * len(dims)):
        if lab is None and (d is not None or _mask_rows(a, name, batch_first) != 1):
            return None
        if lab is not None and d is not None and axis is None:
            return None
    merged = []
    for a, d, axis in zip(operands, dims, axes):
        if axis is not None:
            a = (jnp.broadcast_to(jnp.expand_dims(a, axis), (*a.shape[:axis], n,
                                                             *a.shape[axis:]))
                 if d is None else jnp.moveaxis(a, d, axis))
            a = a.reshape(*a.shape[:axis], n * a.shape[axis + 1], *a.shape[axis + 2:])
        merged.append(a)
    out_axes = [_batch_axis(lab, batch_first) for lab in call.spec.result_labels()]
    out = tuple((tuple(n * k if i == axis else k for i, k in enumerate(shape)), dtype)
                for (shape, dtype), axis in zip(call.out, out_axes))
    results = p.bind(*merged, call=dataclasses.replace(call, out=out))
    return ([r.reshape(*r.shape[:axis], n, r.shape[axis] // n, *r.shape[axis + 1:])
             for r, axis in zip(results, out_axes)], out_axes)


def _mask_rows(mask, name, batch_first):
    """A mask's extent along the batch axis it broadcasts to (1 when it has none)."""
    labels = MASKS[name]
    if batch_first and len(labels) == 3:
        labels = ("B", "T", *labels[2:])
    offset = len(labels) - mask.ndim
    at = labels.index("B") - offset
    return 1 if at < 0 else mask.shape[at]
