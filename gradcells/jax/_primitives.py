"""The JAX primitives behind ``gradcells.jax`` (docs/spec.md §13): one call of a gradcells op
as a JAX primitive, its forward mode as a second primitive linear in the tangents, and the
transpose of that one from the op's gradient.

A call is described by a hashable ``Call`` (the op, the names of its differentiable arrays
and of its constant arrays, the static keywords, the result's shapes). Each rule is the
op's own (none is JAX's autodiff of the kernels):

    forward_p(a, k)                = gc.<op>(a; k) = r                   the primal
    jvp_p(a, k, r, t)              = J(a)·t        = gc.<op>_jvp          forward mode
    transpose of jvp_p at ct       = vjp_p(a, k, r, ct) = J(a)ᵀ·ct = gc.<op>_grad
    JVP of vjp_p along (t, dct)    = grad_jvp_p    = gc.<op>_grad_jvp     second order

(``a``: the arrays, ``k``: the constants seq_len and the masks, no tangent; ``r``: the
result, which the gradient reads). ``grad`` is JAX's linearise-then-transpose: the JVP rule
emits ``jvp_p``, linear in ``t``, and its transpose rule ``vjp_p``. Each primitive's
kernel runs on the host through ``jax.pure_callback``
(NumPy arrays, the CPU backend unless ``backend=`` says otherwise). Second order, forward
over reverse (``jvp`` of ``grad``: Hessian-vector products, ``jax.hessian``): the gradient
is a primitive too, ``vjp_p``, whose JVP rule emits ``grad_jvp_p`` = ``gc.<op>_grad_jvp``.
Not supported (``NotImplementedError``): ``jvp`` of ``jvp`` and ``grad`` of ``grad``.

``vmap`` folds the mapped axis into the op's batch axis when only per-row arrays are mapped
(x, the states, seq_len; the selective scan's ``u, delta, z, B, C``; the weights, the
selective scan's ``A, D, delta_bias`` and the masks shared): one call on ``N·B`` rows, each
operand's batch axis read from the op's shape labels (``OpSpec.labels`` where it declares
them). Anything
else (a mapped weight, a per-row mask, the gradients, whose weight gradients are per
example) maps sequentially: ``lax.map`` over the mapped axis, one call per index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

import gradcells as gc

from .._core.specs import MASKS, shaped
from ..cells import OPS, SCAN_SPECS
from ..cells.lstm.spec import NORM_ARRAYS, LSTMNorm


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
        return SCAN_SPECS[self.op] if self.op in SCAN_SPECS else OPS[self.op]

    def keywords(self, values, of=None):
        """The gc call's keywords from the diff and constant arrays ``values`` (NumPy),
        those ``of`` (a gc function) takes when given."""
        named = _grouped(self.diff + self.const, values)
        named.update(self.options)
        if of is not None:
            taken = _parameters(of)
            named = {k: a for k, a in named.items() if k in taken}
        return named


@functools.cache
def _parameters(function):
    return frozenset(inspect.signature(function).parameters)


def _grouped(names, values):
    """Flat ``name -> array``, the six ``layer_norm.*`` arrays as one ``LSTMNorm``."""
    named = dict(zip(names, values, strict=True))
    norm = [named.pop(n) for n in NORM_ARRAYS if n in named]
    if norm:
        named["layer_norm"] = LSTMNorm(*norm)
    return named


def _tangents(call, arrays):
    """The op's gradient type holding ``arrays``, the diff arrays' tangents, by flat name
    (None for an array not given)."""
    fields = dict.fromkeys(call.spec.grads._fields)
    return call.spec.grads(**{**fields, **_grouped(call.diff, arrays)})


def _flat(grads, names):
    """The fields ``names`` (flat, as ``Call.diff``) of a gradient NamedTuple."""
    return [getattr(grads.layer_norm, n.split(".")[1]) if n.startswith("layer_norm.")
            else getattr(grads, n) for n in names]


def _host(arrays):
    return [np.asarray(a) for a in arrays]


# --------------------------------------------------------------------------------------
# Host functions: NumPy in, NumPy out, each one gc call


def _host_forward(call, grad, *arrays):
    result = getattr(gc, call.op)(**call.keywords(_host(arrays)))
    return tuple(np.asarray(a) for a in result)


def _host_jvp(call, grad, *arrays):
    """``J·t``: the tangents of the result fields along the diff arrays' tangents (the
    operands: the arrays, the constants, the result, the tangents)."""
    arrays = _host(arrays)
    n = len(call.diff) + len(call.const)
    tangents = _tangents(call, arrays[n + len(call.out):])
    _, d_result = getattr(gc, f"{call.op}_jvp")(**call.keywords(arrays[:n]),
                                                tangents=tangents)
    return tuple(np.zeros(s, d) if t is None else np.asarray(t, d)
                 for t, (s, d) in zip(d_result, call.out, strict=True))


def _gradient_args(call, grad, arrays):
    """A gradient call's keywords and the remaining operands, from ``vjp_p``'s operands
    (the arrays, the constants, the result, the upstream cotangents ``grad[0]`` names,
    the cotangents of ``grad[1]``'s fields, which must be zero, then any tangents)."""
    given, unsupported = grad
    n, n_out = len(call.diff) + len(call.const), len(call.out)
    upstream = arrays[n + n_out:n + n_out + len(given)]
    rest = arrays[n + n_out + len(given):]
    for name, ct in zip(unsupported, rest[:len(unsupported)], strict=True):
        if np.any(ct):
            raise ValueError(
                f"{call.op}_grad takes no upstream gradient of the result's {name!r}: "
                f"differentiate through {', '.join(call.spec.upstream)} only")
    keywords = {**call.keywords(arrays[:n], of=getattr(gc, f"{call.op}_grad")),
                call.spec.result_arg: call.spec.result(*arrays[n:n + n_out]),
                **dict(zip(given, upstream, strict=True))}
    return keywords, rest[len(unsupported):]


def _conjugated(arrays, first, count):
    """``arrays`` with ``count`` of them from ``first`` on conjugated (the complex ones:
    ``np.conj`` of a real array is itself)."""
    return [np.conj(a) if first <= k < first + count and a.dtype.kind == "c" else a
            for k, a in enumerate(arrays)]


def _host_vjp(call, grad, *arrays):
    """``Jᵀ·ct``: the diff arrays' gradients (``gc.<op>_grad``) from the result's
    cotangents. JAX's transpose of a complex-linear ``J`` is ``Jᵀ``, gradcells's gradient
    ``Jᴴ`` (PyTorch's convention): ``Jᵀ·ct = conj(Jᴴ·conj(ct))``, so complex cotangents
    are conjugated in and the gradients out (nothing changes for real arrays)."""
    arrays = _host(arrays)
    n = len(call.diff) + len(call.const) + len(call.out)
    keywords, _ = _gradient_args(call, grad, _conjugated(arrays, n, len(arrays) - n))
    grads = getattr(gc, f"{call.op}_grad")(**keywords)
    diff = arrays[:len(call.diff)]
    return tuple(np.asarray(np.conj(g) if g.dtype.kind == "c" else g, a.dtype)
                 for g, a in zip(_flat(grads, call.diff), diff, strict=True))


def _host_grad_jvp(call, grad, *arrays):
    """The tangent of ``Jᵀ·ct`` (``gc.<op>_grad_jvp``) along the diff arrays' tangents and
    the given cotangents' tangents, the last operands (one forward more than the
    gradient's JVP: the result recording its settings)."""
    arrays = _host(arrays)
    n_ct = len(call.diff) + len(call.const) + len(call.out)
    upstream = len(grad[0]) + len(grad[1])
    arrays = _conjugated(arrays, n_ct, upstream)        # as ``_host_vjp``: conj in and out
    arrays = _conjugated(arrays, n_ct + upstream + len(call.diff), len(grad[0]))
    keywords, rest = _gradient_args(call, grad, arrays)
    # the result as the forward records it: the tangents of the gates need settings
    # (forget_bias) the gradient's keywords do not carry
    n = len(call.diff) + len(call.const)
    keywords[call.spec.result_arg] = getattr(gc, call.op)(**call.keywords(arrays[:n]))
    d_inputs, d_upstream = rest[:len(call.diff)], rest[len(call.diff):]
    tangents = _tangents(call, d_inputs)
    _, d_grads = getattr(gc, f"{call.op}_grad_jvp")(
        **keywords, tangents=tangents,
        **{f"{u}_tangent": t for u, t in zip(grad[0], d_upstream, strict=True)})
    return tuple(np.zeros(a.shape, a.dtype) if g is None
                 else np.asarray(np.conj(g) if g.dtype.kind == "c" else g, a.dtype)
                 for g, a in zip(_flat(d_grads, call.diff), arrays[:len(call.diff)],
                                 strict=True))


# --------------------------------------------------------------------------------------
# The primitives: operands, then the static ``call`` (the forward's) and ``grad`` (the
# gradient's given and unsupported cotangents' names; ``()`` for the first two)


def _result_avals(operands, call, grad):
    return call.out


def _input_avals(operands, call, grad):
    """The gradient's avals: the diff arrays'."""
    return tuple((a.shape, a.dtype) for a in operands[:len(call.diff)])


@contextlib.contextmanager
def named_errors():
    """Inside this block (or function, as a decorator), gradcells's own ``ValueError`` or
    ``TypeError`` where a host call of a gradcells primitive raised one and JAX wrapped it:
    a ``JaxRuntimeError`` whose message is the callback's traceback through this module's
    host functions, then ``ValueError: <message>`` (or ``TypeError``; gradcells's messages
    are one line, and JAX may append its own after it), is raised as that error, ``from
    None``. gradcells's eager calls run in it; a ``jax.jit``-compiled
    function runs its kernels after the traced code has returned, so its caller wraps the
    call (docs/spec.md §16.3: a traced ``seq_len``'s values are known only then)."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        text = str(error)
        kind, at = max(((kind, text.rfind(f"\n{kind.__name__}: "))
                        for kind in (ValueError, TypeError)), key=lambda found: found[1])
        if at < 0 or __file__ not in text:
            raise
        raise kind(text[at + len(kind.__name__) + 3:].split("\n", 1)[0]) from None


def _primitive(name, host, avals):
    p = Primitive(name)
    p.multiple_results = True

    def rule(*operands, call, grad):
        shapes = [jax.ShapeDtypeStruct(s, d) for s, d in avals(operands, call, grad)]
        with named_errors():
            return jax.pure_callback(functools.partial(host, call, grad), shapes, *operands,
                                     vmap_method="sequential")

    p.def_impl(rule)
    p.def_abstract_eval(lambda *operands, call, grad: [
        jax.core.ShapedArray(s, d) for s, d in avals(operands, call, grad)])
    mlir.register_lowering(p, mlir.lower_fun(rule, multiple_results=True))
    batching.primitive_batchers[p] = lambda operands, dims, call, grad: _batched(
        p, operands, dims, call=call, grad=grad)
    return p


forward_p = _primitive("gradcells_forward", _host_forward, _result_avals)
jvp_p = _primitive("gradcells_jvp", _host_jvp, _result_avals)
vjp_p = _primitive("gradcells_vjp", _host_vjp, _input_avals)
grad_jvp_p = _primitive("gradcells_grad_jvp", _host_grad_jvp, _input_avals)


def _forward_jvp(primals, tangents, *, call, grad):
    """``forward_p``'s JVP rule: the primal and ``jvp_p`` of the diff arrays' tangents (the
    constants' tangents are dropped: they are no inputs of the derivative). ``jvp_p`` also
    takes the primal result, which its transpose reads (the gradient needs the forward's
    result) and its host function ignores."""
    out = forward_p.bind(*primals, call=call, grad=grad)
    d = [ad.instantiate_zeros(t) for t in tangents[:len(call.diff)]]
    return out, jvp_p.bind(*primals, *out, *d, call=call, grad=grad)


def _jvp_transpose(cts, *operands, call, grad):
    """``jvp_p``'s transpose: ``Jᵀ·ct``, ``vjp_p`` (``gc.<op>_grad``), for the tangent
    operands (the primals and constants are known: JAX linearises before it transposes).
    Symbolic-zero cotangents are not passed; those of fields with no upstream in
    ``gc.<op>_grad`` (the gates) are passed to be checked zero."""
    n, n_out = len(call.diff) + len(call.const), len(call.out)
    known, result, tangents = operands[:n], operands[n:n + n_out], operands[n + n_out:]
    if any(ad.is_undefined_primal(a) for a in (*known, *result)):
        raise NotImplementedError(
            f"gradcells.jax.{call.op}: transposing along the primal inputs is not supported")
    fields = call.spec.result._fields
    upstream = {name: fields.index(name.removeprefix("d_")) for name in call.spec.upstream}
    given = tuple(u for u, i in upstream.items() if not isinstance(cts[i], ad.Zero))
    unsupported = tuple(f for i, f in enumerate(fields)
                        if i not in upstream.values() and not isinstance(cts[i], ad.Zero))
    grads = vjp_p.bind(*known, *result, *(cts[upstream[u]] for u in given),
                       *(cts[fields.index(f)] for f in unsupported), call=call,
                       grad=(given, unsupported))
    return [None] * (n + n_out) + [g if ad.is_undefined_primal(t) else None
                                   for g, t in zip(grads, tangents, strict=True)]


def _vjp_jvp(primals, tangents, *, call, grad):
    """``vjp_p``'s JVP rule (forward over reverse: Hessian-vector products): ``grad_jvp_p``
    of the diff arrays' and the given cotangents' tangents. The result operand's tangent
    is not read: the result is the forward's of the arrays, and ``gc.<op>_grad_jvp``
    derives its tangent from theirs."""
    out = vjp_p.bind(*primals, call=call, grad=grad)
    n, n_out = len(call.diff) + len(call.const), len(call.out)
    d_inputs = tangents[:len(call.diff)]
    d_upstream = tangents[n + n_out:n + n_out + len(grad[0])]
    d = [ad.instantiate_zeros(t) for t in (*d_inputs, *d_upstream)]
    return out, grad_jvp_p.bind(*primals, *d, call=call, grad=grad)


def _unsupported(what):
    def rule(*args, call, grad, **_):
        raise NotImplementedError(
            f"gradcells.jax.{call.op}: {what} is not supported (first order in both modes "
            "and forward over reverse, jvp of grad, are)")
    return rule


ad.primitive_jvps[forward_p] = _forward_jvp
ad.primitive_transposes[jvp_p] = _jvp_transpose
ad.primitive_jvps[vjp_p] = _vjp_jvp
ad.primitive_jvps[jvp_p] = _unsupported("the JVP of a JVP (jvp of jvp)")
ad.primitive_transposes[vjp_p] = _unsupported("reverse over reverse (grad of grad)")
ad.primitive_transposes[grad_jvp_p] = _unsupported("reverse over reverse (grad of grad)")


def _batched(p, operands, dims, *, call, grad):
    """vmap of ``p``: folded into the op's batch axis when it can be (``_folded``), else
    one call per index of the mapped axis (``lax.map``, unmapped operands shared)."""
    folded = _folded(p, operands, dims, call) if p in (forward_p, jvp_p) else None
    if folded is not None:
        return folded
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(operands, dims, strict=True)]
    mapped = [i for i, d in enumerate(dims) if d is not None]

    def one(slices):
        args = list(moved)
        for i, s in zip(mapped, slices, strict=True):
            args[i] = s
        return p.bind(*args, call=call, grad=grad)

    with named_errors():
        out = jax.lax.map(one, [moved[i] for i in mapped])
    return out, [0] * len(out)


def _operand_labels(p, call):
    """The shape labels of ``p``'s operands (weights: none with ``B``; the masks marked
    ``None``: they broadcast, and fold only when their ``B`` extent is 1)."""
    spec = call.spec
    by_name = {**{n: spec.input_labels(n) for n in spec.inputs},
               **dict(zip(spec.states, spec.state_labels, strict=True)),
               "seq_len": ("B",), **spec.constants}
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
    labels = [lab if lab is None else shaped(lab, a.ndim - (d is not None))
              for lab, a, d in zip(_operand_labels(p, call), operands, dims, strict=True)]
    axes = [_batch_axis(lab, batch_first) for lab in labels]
    n = next(a.shape[d] for a, d in zip(operands, dims, strict=True) if d is not None)
    names = [*call.diff, *call.const]
    # strict=False: ``names`` is padded past the operands, whose trailing masks have none
    padded = names + [""] * len(dims)
    for a, d, lab, axis, name in zip(operands, dims, labels, axes, padded, strict=False):
        if lab is None and (d is not None or _mask_rows(a, name, batch_first) != 1):
            return None
        if lab is not None and d is not None and axis is None:
            return None
    merged = []
    for a, d, axis in zip(operands, dims, axes, strict=True):
        if axis is not None:
            a = (jnp.broadcast_to(jnp.expand_dims(a, axis), (*a.shape[:axis], n,
                                                             *a.shape[axis:]))
                 if d is None else jnp.moveaxis(a, d, axis))
            a = a.reshape(*a.shape[:axis], n * a.shape[axis + 1], *a.shape[axis + 2:])
        merged.append(a)
    out_axes = [_batch_axis(lab, batch_first) for lab in call.spec.result_labels()]
    out = tuple((tuple(n * k if i == axis else k for i, k in enumerate(shape)), dtype)
                for (shape, dtype), axis in zip(call.out, out_axes, strict=True))
    results = p.bind(*merged, call=dataclasses.replace(call, out=out), grad=())
    return ([r.reshape(*r.shape[:axis], n, r.shape[axis] // n, *r.shape[axis + 1:])
             for r, axis in zip(results, out_axes, strict=True)], out_axes)


def _mask_rows(mask, name, batch_first):
    """A mask's extent along the batch axis it broadcasts to (1 when it has none)."""
    labels = MASKS[name]
    if batch_first and len(labels) == 3:
        labels = ("B", "T", *labels[2:])
    offset = len(labels) - mask.ndim
    at = labels.index("B") - offset
    return 1 if at < 0 else mask.shape[at]
