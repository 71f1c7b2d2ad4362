"""The public functions, made from the cells' specs: a cell adds no code here.

Each registered cell (``gradcells.cells``) gets, for its cell step and its sequence, the
forward, ``_jvp``, ``_grad`` and ``_grad_jvp`` (``operations``), and for its stack the same
four (``function``, called by ``gradcells.stacks``). Their parameters are read from the
spec: ``x``, the states and the required weights by position, then the gradient's result
and the tangents; by keyword the upstream gradients (``d_<name>``) and their tangents, the
optional weights, the cell's settings (its ``Keyword``s: a forward's default, or None in a
gradient, where the forward's record decides), the gradient's options, the sequence's
order, lengths and masks, and ``backend``. Their docstrings are the spec's.

The functions are compiled from source, as ``dataclasses`` makes ``__init__``: a real
signature that ``inspect``, ``help`` and editors read, and no binding cost per call. Every
one is one call of a body below: validate (``gradcells._validate``), dispatch
(``gradcells._dispatch``), run in the caller's order and layout (``gradcells._order``),
record the settings.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import _dispatch, _order
from . import _validate as v
from ._core.specs import MASKS, CellSpec, OpSpec
from ._core.types import record_settings
from ._interop import accepts_any_array

REQUIRED = inspect.Parameter.empty
"""The default of a positional parameter: none."""

SEQUENCE_KEYWORDS = (("seq_len", "Array | None", None), ("reverse", "bool", False),
                     ("batch_first", "bool", False))
"""A sequence's keywords beyond its cell's (docs/spec.md §11): name, annotation, default."""


def function(name: str, positional: list[tuple[str, str]],
             keywords: list[tuple[str, str, Any]], returns: str, call: str,
             namespace: dict[str, Any], doc: str, module: str) -> Callable[..., Any]:
    """``def name(*positional, *, **keywords) -> returns: return call``, compiled in
    ``namespace``, documented by ``doc`` and taking any array (``accepts_any_array``).
    ``positional``: (name, annotation); ``keywords``: (name, annotation, default)."""
    defaults = {f"_default_{k}": default for k, _, default in keywords}
    parameters = ", ".join([p for p, _ in positional]
                           + (["*"] if keywords else [])
                           + [f"{k}=_default_{k}" for k, _, _ in keywords])
    scope = {**namespace, **defaults}
    exec(f"def {name}({parameters}):\n    return {call}\n", scope)  # noqa: S102
    made = scope[name]
    made.__annotations__ = {**dict(positional), **{k: a for k, a, _ in keywords},
                            "return": returns}
    made.__doc__ = inspect.cleandoc(doc)
    made.__module__ = module
    made.__qualname__ = name
    return accepts_any_array(made)


def operations(spec: CellSpec, op: OpSpec, module: str) -> dict[str, Callable[..., Any]]:
    """The four public functions of ``op`` (the cell's step or its sequence), by name."""
    grads, result = op.grads.__name__, op.result.__name__
    positional = [("x", "Array"), *((s, "Array") for s in op.states),
                  *weight_parameters(op)[0]]
    weights = f"_weights({', '.join(op.weights._fields)})"
    states = f"({', '.join(op.states)},)"
    namespace = {"_op": op, "_weights": op.weights, "_forward": _forward, "_jvp": _jvp,
                 "_grad": _grad, "_grad_jvp": _grad_jvp}
    upstream = [(d, "Array | None", None) for d in op.upstream]
    upstream_t = [(f"{d}_tangent", "Array | None", None) for d in op.upstream]
    options = [(k.name, k.annotation, k.default) for k in spec.grad_options]
    tangents = [("tangents", f"{grads} | None")]
    saved = [(op.result_arg, result)]
    kinds = {  # suffix: positional, upstream, settings, options, returns, call
        "": (positional, [], forward_keywords(spec, op), [], result, "_forward(_op, {a}, {k})"),
        "_jvp": (positional + tangents, [], forward_keywords(spec, op), [],
                 f"tuple[{result}, {result}]", "_jvp(_op, {a}, tangents, {k})"),
        "_grad": (positional + saved, upstream, grad_keywords(spec, op), options, grads,
                  "_grad(_op, {a}, {r}, {u}, {k}, {o})"),
        "_grad_jvp": (positional + saved + tangents, upstream + upstream_t,
                      grad_keywords(spec, op), options, f"tuple[{grads}, {grads}]",
                      "_grad_jvp(_op, {a}, {r}, tangents, {u}, {k}, {o})")}
    made = {}
    for suffix, (given, cotangents, settings, opts, returns, call) in kinds.items():
        keywords = [*cotangents, *weight_parameters(op)[1], *settings, *opts,
                    ("backend", "str | None", None)]
        name = f"{op.name}{suffix}"
        source = call.format(a=f"x, {states}, {weights}, backend", r=op.result_arg,
                             u=keyword_dict(cotangents), k=keyword_dict(settings),
                             o=keyword_dict(opts))
        made[name] = function(name, given, keywords, returns, source, namespace,
                              spec.docs[name], module)
    return made


def weight_parameters(op: OpSpec) -> tuple[list[tuple[str, str]], list[tuple[str, str, Any]]]:
    """The weights as parameters: the required ones by position, the optional ones (those
    with a default in the weights' type) by keyword."""
    optional = op.weights._field_defaults
    annotations = {n: getattr(a, "__forward_arg__", a)  # a NamedTuple's may be ForwardRefs
                   for n, a in op.weights.__annotations__.items()}
    return ([(n, "Array") for n in op.weights._fields if n not in optional],
            [(n, annotations[n], optional[n]) for n in optional])


def forward_keywords(spec: CellSpec, op: OpSpec) -> list[tuple[str, str, Any]]:
    """A forward's settings: the cell's keywords with their defaults, then a sequence's."""
    own = [(k.name, k.annotation, k.default) for k in spec.keywords]
    return own + (_sequence_keywords(spec, given_again=False) if op.sequence else [])


def grad_keywords(spec: CellSpec, op: OpSpec) -> list[tuple[str, str, Any]]:
    """A gradient's settings: every setting a forward records, None by default (the record
    decides; given again, it must agree)."""
    own = [(k.name, _optional(k.annotation), None) for k in spec.keywords
           if not k.forward_only]
    return own + (_sequence_keywords(spec, given_again=True) if op.sequence else [])


def _sequence_keywords(spec, given_again):
    return ([(n, _optional(a) if given_again else a, None if given_again else d)
             for n, a, d in SEQUENCE_KEYWORDS]
            + [(m, "Array | None", None) for m in spec.masks])


def _optional(annotation):
    return annotation if "None" in annotation else f"{annotation} | None"


def keyword_dict(parameters):
    """Source of a dict of the keyword ``parameters``, each value under its own name."""
    return "{" + ", ".join(f"{n!r}: {n}" for n, _, _ in parameters) + "}"


# --------------------------------------------------------------------------------------
# The bodies: every public cell and sequence function is one call of one of these.


def _settings(op, keywords):
    """The keywords as ``forward_args``/``grad_args`` take them: the masks as one dict."""
    masks = {m: keywords.pop(m) for m in list(keywords) if m in MASKS}
    return {**keywords, "masks": masks} if op.sequence else keywords


def _forward(op, x, states, weights, backend, keywords):
    library, settings = v.forward_args(op.name, x, states, weights, **_settings(op, keywords))
    impl = _dispatch.backend_for(backend, library)
    return record_settings(_order.forward(op, getattr(impl, op.name), x, states, weights,
                                          settings, package=impl), settings)


def _jvp(op, x, states, weights, backend, tangents, keywords):
    library, settings = v.forward_args(op.name, x, states, weights, **_settings(op, keywords))
    tangents = v.tangents_value(op.name, tangents, (x, *states, *weights))
    impl = _dispatch.backend_for(backend, library)
    result, d_result = _order.jvp(op, getattr(impl, f"{op.name}_jvp"), x, states, weights,
                                  tangents, settings)
    return record_settings(result, settings), d_result


def _grad(op, x, states, weights, backend, result, upstream, keywords, options):
    library, settings = v.grad_args(op.name, x, states, weights, result, upstream,
                                    **_settings(op, keywords))
    impl = _dispatch.backend_for(backend, library)
    return _order.grad(op, getattr(impl, op.grad_name), x, states, weights, result, settings,
                       upstream, package=impl, **v.grad_options(options))


def _grad_jvp(op, x, states, weights, backend, result, tangents, upstream, keywords, options):
    cotangents = {k: g for k, g in upstream.items() if not k.endswith("_tangent")}
    library, settings = v.grad_args(op.name, x, states, weights, result, cotangents,
                                    **_settings(op, keywords))
    tangents = v.tangents_value(op.name, tangents, (x, *states, *weights))
    v.upstream_tangents(op.name, result, {k: t for k, t in upstream.items()
                                          if k.endswith("_tangent")})
    impl = _dispatch.backend_for(backend, library)
    return _order.grad_jvp(op, getattr(impl, f"{op.grad_name}_jvp"), x, states, weights,
                           result, tangents, settings, upstream, **v.grad_options(options))
