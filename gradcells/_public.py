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

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _dispatch, _order
from . import _validate as v
from ._core.specs import MASKS, CellSpec, OpSpec
from ._core.types import record_settings
from ._interop import accepts_any_array, computes_half_in_single

REQUIRED = inspect.Parameter.empty
"""The default of a positional parameter: none."""

SEQUENCE_KEYWORDS = (("seq_len", "Array | None", None), ("reverse", "bool", False),
                     ("batch_first", "bool", False))
"""A sequence's keywords beyond its cell's (docs/spec.md §11): name, annotation, default."""


def function(name: str, positional: list[tuple[str, str]],
             keywords: list[tuple[str, str, Any]], returns: str, body: str,
             namespace: dict[str, Any], doc: str, module: str) -> Callable[..., Any]:
    """``def name(*positional, *, **keywords) -> returns: body``, compiled in ``namespace``
    and documented by ``doc``. ``positional``: (name, annotation), x first; ``keywords``:
    (name, annotation, default); ``body``: statements, one per line.

    The function takes any array: a call whose x is a NumPy array of float32 or float64
    runs ``body`` after one type test; any other call goes through ``accepts_any_array``
    (PyTorch, JAX, dask and CuPy arrays) and ``computes_half_in_single`` (NumPy float16)
    to the same body."""
    defaults = {f"_default_{k}": default for k, _, default in keywords}
    parameters = ", ".join([p for p, _ in positional]
                           + (["*"] if keywords else [])
                           + [f"{k}=_default_{k}" for k, _, _ in keywords])
    arguments = ", ".join([p for p, _ in positional] + [f"{k}={k}" for k, _, _ in keywords])
    first = positional[0][0]
    guard = (f"if type({first}) is not _ndarray or {first}.dtype.char == 'e':\n"
             f"    return _other_arrays({arguments})")
    scope = {**namespace, **defaults, "_ndarray": np.ndarray, "__name__": module}

    def compiled(source):
        lines = "".join(f"\n    {line}" for line in source.strip().splitlines())
        exec(f"def {name}({parameters}):{lines}\n", scope)  # noqa: S102
        made = scope[name]
        made.__annotations__ = {**dict(positional), **{k: a for k, a, _ in keywords},
                                "return": returns}
        made.__doc__ = inspect.cleandoc(doc)
        made.__module__ = module
        made.__qualname__ = name
        return made

    scope["_other_arrays"] = accepts_any_array(computes_half_in_single(compiled(body)))
    return compiled(f"{guard}\n{body}")


# The four bodies, as source: the public function of each mode validates (``_validate``),
# dispatches (``_dispatch``), runs the backend (a sequence in the caller's order and layout,
# ``_order``) and records the settings. Written out, not called, so that a call costs no
# frame or argument dictionary beyond what the old hand-written functions did.
_BODIES = {
    "": """
        weights = _weights({weights})
        library, settings = _forward_args({name!r}, x, {states}, weights{settings})
        impl = _backend_for(backend, library)
        return _record({run}, settings)""",
    "_jvp": """
        weights = _weights({weights})
        library, settings = _forward_args({name!r}, x, {states}, weights{settings})
        tangents = _tangents_value({name!r}, tangents, (x, *{states}, *weights))
        impl = _backend_for(backend, library)
        result, d_result = {run}
        return _record(result, settings), d_result""",
    "_grad": """
        weights = _weights({weights})
        upstream = {upstream}
        library, settings = _grad_args({name!r}, x, {states}, weights, {saved}, upstream{settings})
        impl = _backend_for(backend, library)
        return {run}""",
    "_grad_jvp": """
        weights = _weights({weights})
        upstream = {upstream}
        library, settings = _grad_args({name!r}, x, {states}, weights, {saved}, upstream{settings})
        tangents = _tangents_value({name!r}, tangents, (x, *{states}, *weights))
        _upstream_tangents({name!r}, {saved}, {upstream_t})
        upstream.update({upstream_t})
        impl = _backend_for(backend, library)
        return {run}""",
}

# How each mode runs its backend: a cell step directly, a sequence through ``_order``.
_RUNS = {
    ("", False): "impl.{op}(x, {state_args}, weights, settings)",
    ("", True): "_order.forward(_op, impl.{op}, x, {states}, weights, settings, package=impl)",
    ("_jvp", False): "impl.{op}(x, {state_args}, weights, tangents, settings)",
    ("_jvp", True): "_order.jvp(_op, impl.{op}, x, {states}, weights, tangents, settings)",
    ("_grad", False): "impl.{op}(x, {state_args}, weights, _result(*{saved}), settings, "
                      "**upstream{options})",
    ("_grad", True): "_order.grad(_op, impl.{op}, x, {states}, weights, {saved}, settings, "
                     "upstream, package=impl{options})",
    ("_grad_jvp", False): "impl.{op}(x, {state_args}, weights, _result(*{saved}), tangents, "
                          "settings, **upstream{options})",
    ("_grad_jvp", True): "_order.grad_jvp(_op, impl.{op}, x, {states}, weights, {saved}, "
                         "tangents, settings, upstream{options})",
}

_NAMESPACE = {"_forward_args": v.forward_args, "_grad_args": v.grad_args,
              "_tangents_value": v.tangents_value, "_upstream_tangents": v.upstream_tangents,
              "_backend_for": _dispatch.backend_for,
              "_record": record_settings, "_order": _order}
"""What the bodies call, by the names they use."""


def operations(spec: CellSpec, op: OpSpec, module: str) -> dict[str, Callable[..., Any]]:
    """The four public functions of ``op`` (the cell's step or its sequence), by name."""
    grads, result = op.grads.__name__, op.result.__name__
    positional = [("x", "Array"), *((s, "Array") for s in op.states),
                  *weight_parameters(op)[0]]
    upstream = [(d, "Array | None", None) for d in op.upstream]
    upstream_t = [(f"{d}_tangent", "Array | None", None) for d in op.upstream]
    options = [(k.name, k.annotation, k.default) for k in spec.grad_options]
    tangents, saved = [("tangents", f"{grads} | None")], [(op.result_arg, result)]
    kinds = {  # suffix: positional, upstream, settings, options, returns
        "": (positional, [], forward_keywords(spec, op), [], result),
        "_jvp": (positional + tangents, [], forward_keywords(spec, op), [],
                 f"tuple[{result}, {result}]"),
        "_grad": (positional + saved, upstream, grad_keywords(spec, op), options, grads),
        "_grad_jvp": (positional + saved + tangents, upstream + upstream_t,
                      grad_keywords(spec, op), options, f"tuple[{grads}, {grads}]")}
    namespace = {**_NAMESPACE, "_op": op, "_weights": op.weights, "_result": op.result,
                 "_option": functools.partial(v.grad_option, spec)}
    made = {}
    for suffix, (given, cotangents, settings, opts, returns) in kinds.items():
        name = f"{op.name}{suffix}"
        made[name] = function(
            name, given, [*cotangents, *weight_parameters(op)[1], *settings, *opts,
                          ("backend", "str | None", None)],
            returns, _body(op, suffix, settings, opts), namespace, spec.docs[name], module)
    return made


def _body(op, suffix, settings, options):
    """The source of the body of ``op``'s public function of mode ``suffix``."""
    fields = {
        "name": op.name, "op": f"{op.name}{'_grad' if 'grad' in suffix else ''}"
                              f"{'_jvp' if suffix.endswith('jvp') else ''}",
        "weights": ", ".join(op.weights._fields), "saved": op.result_arg,
        "state_args": ", ".join(op.states), "states": f"({', '.join(op.states)},)",
        "upstream": keyword_dict([(d, "", None) for d in op.upstream]),
        "upstream_t": keyword_dict([(f"{d}_tangent", "", None) for d in op.upstream]),
        "settings": _keyword_arguments(op, settings),
        "options": "".join(f", {n}=_option({n!r}, {n})" for n, _, _ in options)}
    fields["run"] = _RUNS[suffix, op.sequence].format(**fields)
    return inspect.cleandoc(_BODIES[suffix].format(**fields))


def _keyword_arguments(op, settings):
    """``, name=name, ...`` for the settings, a sequence's masks gathered as ``masks``."""
    own = [n for n, _, _ in settings if n not in MASKS]
    masks = [(n, "", None) for n, _, _ in settings if n in MASKS]
    return "".join(f", {n}={n}" for n in own) + (f", masks={keyword_dict(masks)}"
                                                  if op.sequence else "")


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
    own = [(k.name, k.annotation, k.default) for k in spec.keywords
           if op.sequence or not k.sequence_only]
    return own + (_sequence_keywords(spec, given_again=False) if op.sequence else [])


def grad_keywords(spec: CellSpec, op: OpSpec) -> list[tuple[str, str, Any]]:
    """A gradient's settings: every setting a forward records, None by default (the record
    decides; given again, it must agree)."""
    own = [(k.name, _optional(k.annotation), None) for k in spec.keywords
           if not k.forward_only and (op.sequence or not k.sequence_only)]
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
