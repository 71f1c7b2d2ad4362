"""One call's arrays (docs/spec.md §7): given where required, of one library (NumPy or
CuPy), device and float dtype, of the ranks and shapes ``gradcells._core.specs`` gives each
argument, with the sizes read from ``x`` and the states; ``checked_library`` checks a
forward or gradient call's arrays at once and returns their library.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._core import arrays
from .._core.specs import Labels
from ..cells import OPS, OPTIONAL_WEIGHTS, SPECS, WEIGHT_LABELS, cell_of

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
FLOAT_DTYPES = (_FLOAT32, _FLOAT64)
_FLOAT16 = np.dtype(np.float16)  # CuPy's (the GPU backend's half path); NumPy's is widened to
# float32 before the validation (``_interop.computes_half_in_single``)
refused_subclass = arrays.refused_subclass


def array_library(name, a):
    """The library of the one array ``a`` ("numpy" or "cupy"); TypeError naming ``name``
    for anything else (the scans' arguments, checked one by one)."""
    lib = "numpy" if type(a) is np.ndarray else arrays.library_of(a)
    if lib not in arrays.NATIVE or (type(a) is not np.ndarray and refused_subclass(a)):
        raise TypeError(f"{name} must be a NumPy or CuPy array, got {type(a).__name__} "
                        "(PyTorch and JAX arrays are taken too)")
    return lib


def library_and_dtype(specs):
    """Check that every given array is a NumPy/CuPy float array of one library and dtype.

    ``specs`` is a sequence of (name, array-or-None, ...). Returns (library, dtype).
    This runs on every call, so the common case (all NumPy, one dtype) is kept cheap.
    """
    first_name = library = dtype = device = None
    for spec in specs:
        a = spec[1]
        if a is None:
            continue
        lib = "numpy" if type(a) is np.ndarray else arrays.library_of(a)
        if lib is None or (type(a) is not np.ndarray and refused_subclass(a)):
            raise TypeError(f"{spec[0]} must be a NumPy or CuPy array, got "
                            f"{type(a).__name__} (PyTorch and JAX arrays are taken too)")
        if lib not in arrays.NATIVE:  # a tensor among NumPy arrays (the first decides)
            raise TypeError(arrays.two_libraries(first_name or "x", "numpy", spec[0], lib))
        a_dtype = a.dtype
        if library is None:
            # Identity first: comparing dtypes by value costs far more than the rest.
            if (a_dtype is not _FLOAT32 and a_dtype is not _FLOAT64 and a_dtype not in FLOAT_DTYPES
                    and not (lib == "cupy" and a_dtype == _FLOAT16)):
                also = " (or float16 for CuPy arrays)" if lib == "cupy" else ""
                raise TypeError(
                    f"{spec[0]} must have dtype float32 or float64{also}, got {a_dtype}")
            first_name, library, dtype = spec[0], lib, a_dtype
            device = a.device.id if lib == "cupy" else None
            continue
        if lib != library:
            raise TypeError(arrays.two_libraries(first_name, library, spec[0], lib))
        if device is not None and a.device.id != device:
            raise ValueError(
                f"{spec[0]} is on CUDA device {a.device.id} but {first_name} is on device "
                f"{device}; pass arrays on one device")
        if a_dtype is not dtype and a_dtype != dtype:
            if a_dtype not in FLOAT_DTYPES and a_dtype != _FLOAT16:
                raise TypeError(f"{spec[0]} must have dtype float32 or float64, got {a_dtype}")
            raise TypeError(
                f"{spec[0]} must have the same dtype as {first_name} ({dtype}), got {a_dtype}")
    return library, dtype


def _matrix_dims(name, a, labels):
    """Check that ``a`` has rank len(labels) and return its shape."""
    if a.ndim != len(labels):
        raise ValueError(
            f"{name} must be a {len(labels)}-D array [{', '.join(labels)}], "
            f"got shape {tuple(a.shape)}")
    return a.shape


def check_shapes(specs, expected_shapes, origin):
    """``specs``: (name, array-or-None, labels); ``expected_shapes``: each one's shape;
    ``origin()``: which arguments the sizes were read from, for the message."""
    for (name, a, labels), expected in zip(specs, expected_shapes, strict=True):
        if a is not None and a.shape != expected:
            raise ValueError(_other_gru_variant(name, tuple(a.shape), expected, origin) or
                             f"{name} must have shape [{', '.join(labels)}] = {expected}, "
                             f"got {tuple(a.shape)} ({origin()})")


def _other_gru_variant(name, shape, expected, origin):
    """The message for a GRU candidate bias ``b_c`` of the shape the other variant takes
    (docs/spec.md §3: ``[2H]`` reset after, ``[H]`` before), else None."""
    if name != "b_c" or len(shape) != 1 or len(expected) != 1 or not shape[0]:
        return None
    if shape[0] == 2 * expected[0]:
        labels, layout, flag = "[2H]", "the reset-after layout", "reset_after=True"
    elif 2 * shape[0] == expected[0]:
        labels, layout = "[H]", "the reset-before layout (TensorFlow's block cell)"
        flag = "reset_after=False"
    else:
        return None
    return f"b_c has shape {labels} = {shape}, {layout}: pass {flag} ({origin()})"


_SIZE_SOURCE = {"I+H": "I + H", "2H": "2 * H", "3H": "3 * H", "4H": "4 * H", "I+P": "I + P",
                "H/N": "H // N", "4H/N": "4 * H // N"}
"""Each compound size label as an expression of the sizes I, H, P and N: the expression
``fits_function`` writes, and what ``expected_shapes`` computes (``_COMPOUND_SIZE``)."""
_COMPOUND_SIZE = {label: eval(f"lambda I, H, P, N: {source}")  # noqa: S307
                  for label, source in _SIZE_SOURCE.items()}

_EXPECTED_SHAPES: dict = {}  # (layout key, x's shape, H) -> every array's expected shape


def expected_shapes(key, labels, x_shape, n_hidden, n_proj, n_heads=1):
    """The shape each of ``labels`` (a tuple of label tuples, named by the small hashable
    ``key``) stands for, given x's shape (``[B, I]``, ``[T, B, I]`` or ``[B, T, I]`` as
    ``labels[0]``, x's labels, says), H, P and the heads N (an sLSTM's, read from ``r``;
    H divisible by N). A program's
    calls repeat a few shapes, so the answer is kept (up to a few thousand of them)."""
    cached = _EXPECTED_SHAPES.get((key, x_shape, n_hidden, n_proj, n_heads))
    if cached is not None:
        return cached
    n_in = x_shape[-1]
    sizes = {**dict(zip(labels[0], x_shape, strict=True)), "H": n_hidden, "P": n_proj,
             "N": n_heads, **{label: size(n_in, n_hidden, n_proj, n_heads)
                              for label, size in _COMPOUND_SIZE.items()}}
    if len(_EXPECTED_SHAPES) >= 4096:
        _EXPECTED_SHAPES.clear()
    shapes = tuple(tuple([sizes[label] for label in each]) for each in labels)
    _EXPECTED_SHAPES[(key, x_shape, n_hidden, n_proj, n_heads)] = shapes
    return shapes


@functools.cache
def heads_index(labels):
    """Where the array whose first axis is the heads ``N`` stands among ``labels`` (an
    sLSTM's ``r``), or None."""
    return next((k for k, each in enumerate(labels) if each[:1] == ("N",)), None)


def checked_heads(name, a, n_hidden, labels=("N", "H/N", "4H/N")):
    """The heads N of the array ``a`` (called ``name``, shaped as ``labels``: an sLSTM's
    ``[N, H/N, 4H/N]``, an RG-LRU's ``[N, H/N, H/N]``) after checking its rank, that N >= 1
    and that N divides H; ValueError naming it otherwise."""
    _matrix_dims(name, a, labels)
    n_heads = a.shape[0]
    if n_heads < 1 or n_hidden % n_heads:
        raise ValueError(f"{name} must have shape [{', '.join(labels)}] with N >= 1 heads "
                         f"dividing H = {n_hidden}, got {tuple(a.shape)}")
    return n_heads


def _check_arrays(values, checks, key):
    """Every check on one call's arrays; returns their library ("numpy" or "cupy").

    ``values``: the arrays (or Nones) that ``checks`` (a ``_Checks``) names and shapes, x
    (``[B, I]`` or ``[T, B, I]``) first and an array ``[B, H]`` second; ``key``: a small
    hashable name of the checks. A NumPy call that passes every check is accepted by
    ``checks.fits``; any other call is checked in order, and the first failure named:
    required arrays given, one library and float dtype, the ranks of x, of the ``[B, H]``
    array and of ``w_proj`` (which fix the sizes: P from ``w_proj``, the heads N from the
    heads array), every shape.
    """
    if checks.fits(*values):
        return "numpy"
    names, labels, n_required, proj, heads = checks[:5]
    specs = list(zip(names, values, labels, strict=True))
    (x_name, x, x_labels), (h_name, h, h_labels) = specs[0], specs[1]
    require_arrays(specs[:n_required])
    library, _ = library_and_dtype(specs)
    x_shape = _matrix_dims(x_name, x, x_labels)
    h_shape = _matrix_dims(h_name, h, h_labels)
    n_proj = h_shape[1] if proj is None else _matrix_dims(*specs[proj])[1]
    n_heads = 1 if heads is None else checked_heads(*specs[heads][:2], h_shape[1],
                                                    specs[heads][2])

    def origin():
        return (f"{', '.join(x_labels)} from {x_name} {tuple(x_shape)}, "
                f"H from {h_name} {tuple(h_shape)}"
                + ("" if proj is None else f", P from w_proj {tuple(specs[proj][1].shape)}"))

    check_shapes(specs, expected_shapes(key, labels, tuple(x_shape), h_shape[1], n_proj,
                                        n_heads), origin)
    return library


def fits_function(labels, n_required, proj=None, heads=None):
    """``fits(*values)``: whether every array of a call is a NumPy array of x's float dtype
    and of its expected shape (``labels``: the sizes read from x, then H from the ``[B, H]``
    array second, P from ``w_proj`` at index ``proj``, N from the heads array at index
    ``heads``), the first ``n_required`` given: the common call, accepted by one expression
    written for these labels (no loop, no shape built but the compared tuples), as
    ``gradcells._public`` writes its functions. False sends the call to the full checks,
    which name what is wrong."""
    n = len(labels)
    sizes = [f"{', '.join(labels[0])} = a0.shape", "H = a1.shape[1]"]
    ranks = [f"a0.ndim == {len(labels[0])}", "type(a1) is _ndarray", "a1.ndim == 2"]
    if proj is not None:
        ranks += [f"type(a{proj}) is _ndarray", f"a{proj}.ndim == 2"]
    sizes.append("P = H" if proj is None else f"P = a{proj}.shape[1]")
    if heads is not None:
        ranks += [f"type(a{heads}) is _ndarray", f"a{heads}.ndim == 3",
                  f"a{heads}.shape[0] >= 1", f"a1.shape[1] % a{heads}.shape[0] == 0"]
    sizes.append("N = 1" if heads is None else f"N = a{heads}.shape[0]")

    def fits(k):
        shape = ", ".join(_SIZE_SOURCE.get(label, label) for label in labels[k])
        test = f"type(a{k}) is _ndarray and a{k}.dtype is dt and a{k}.shape == ({shape},)"
        return test if k < n_required else f"(a{k} is None or ({test}))"

    source = "\n    ".join([
        f"def fits({', '.join(f'a{k}' for k in range(n))}):",
        "if type(a0) is not _ndarray:",
        "    return False",
        "dt = a0.dtype",
        f"if (dt is not _float32 and dt is not _float64) or not ({' and '.join(ranks)}):",
        "    return False", *sizes,
        f"return ({' and '.join(fits(k) for k in range(n))})"])
    scope = {"_ndarray": np.ndarray, "_float32": _FLOAT32, "_float64": _FLOAT64}
    exec(source + "\n", scope)  # noqa: S102
    return scope["fits"]


def require_arrays(specs):
    for name, a, _ in specs:
        if a is None:
            raise TypeError(f"{name} must be an array, got None")


def described(a):
    """``shape (...)`` of an array, else its type's name, for a message."""
    return f"shape {tuple(a.shape)}" if hasattr(a, "shape") else type(a).__name__


def check_result(spec, result):
    """TypeError unless ``result`` (a cell's ``state``, a sequence's ``seq``) is a tuple of
    as many arrays as the forward's result has fields."""
    fields = spec.result._fields
    if not isinstance(result, tuple) or len(result) != len(fields):
        raise TypeError(
            f"{spec.result_arg} must be a tuple of {len(fields)} arrays ({', '.join(fields)}), "
            f"got {type(result).__name__}"
            + (f" of length {len(result)}" if isinstance(result, tuple) else ""))


@functools.cache
def _qualified_names(prefix, fields):
    """``("state.i", "state.cs", ...)``: built once, not on every call."""
    return tuple(f"{prefix}.{field}" for field in fields)


class _Checks(NamedTuple):
    """One mode's arrays (a forward's or a gradient's) in checking order, x first and the
    required ones before the optional: their names and shape labels, how many are required,
    where ``w_proj`` (when the call has one) and the heads array stand, and ``fits``, the
    common call's check (``fits_function``)."""

    names: tuple[str, ...]
    labels: tuple[Labels, ...]
    n_required: int
    proj: int | None
    heads: int | None
    fits: Callable[..., bool]


def _checks(names, labels, n_required, projection):
    proj = names.index("w_proj") if projection else None
    heads = heads_index(labels)
    return _Checks(names, labels, n_required, proj, heads,
                   fits_function(labels, n_required, proj, heads))


class _Layout(NamedTuple):
    """What one operation's arrays are called and shaped like, settled once per operation,
    GRU variant, projection and layout: the checks of a forward call (x, the states, the
    weights, the required ones first) and of a gradient call (the result's fields after the
    required arrays, the upstream gradients last)."""

    forward: _Checks
    grad: _Checks


@functools.cache
def layout_of(op: str, reset_after: bool, projection: bool = False,
              batch_first: bool = False) -> _Layout:
    spec = OPS[op]
    names = spec.flat_arrays
    labels = ((spec.x_labels,) + spec.state_labels
              + tuple(_weight_labels(spec, name, reset_after)
                      for name in names[1 + len(spec.states):]))
    n = sum(name not in OPTIONAL_WEIGHTS for name in names)
    upstream_labels = tuple(spec.upstream_labels(name) for name in spec.upstream)
    result_labels = spec.result_labels()
    if not projection:  # P is H: the messages say so
        labels, result_labels, upstream_labels = (
            _without_projection(group) for group in (labels, result_labels, upstream_labels))
    if batch_first:  # every per-step array is [B, T, ·]
        labels, result_labels, upstream_labels = (
            _batch_first(group) for group in (labels, result_labels, upstream_labels))
    result_names = _qualified_names(spec.result_arg, spec.result._fields)
    return _Layout(_checks(names, labels, n, projection),
                   _checks(names[:n] + result_names + names[n:] + spec.upstream,
                           labels[:n] + result_labels + labels[n:] + upstream_labels,
                           n + len(result_names), projection))


def _without_projection(group):
    """Label tuples with ``P`` read as ``H`` (an LSTM without a projection)."""
    renamed = {"P": "H", "I+P": "I+H"}
    return tuple(tuple(renamed.get(label, label) for label in each) for each in group)


def _batch_first(group):
    """Label tuples with ``[T, B, ·]`` read as ``[B, T, ·]``."""
    return tuple(("B", "T", *each[2:]) if each[:2] == ("T", "B") else each for each in group)


def _weight_labels(spec, name, reset_after):
    """A weight's shape labels, the GRU candidate bias's ``C`` read as ``2H`` or ``H``."""
    labels = WEIGHT_LABELS[spec.weights][name]
    return labels if labels != ("C",) else ("2H",) if reset_after else ("H",)


def flat_weights(spec, weights):
    """The weight set's arrays in ``spec.flat_arrays`` order: each nested weight set (an
    LSTM's ``layer_norm``) as its arrays (Nones without one), after checking that it is a
    tuple of its type holding arrays."""
    if not spec.nested:
        return weights
    flat: tuple = ()
    start = 0
    for index, kind in _NESTED_AT[spec.name]:
        value = weights[index]
        if value is None:
            inner: tuple = _NONES[kind]
        elif isinstance(value, kind):
            inner = value
            require_arrays([(f"{weights._fields[index]}.{f}", a, None)
                            for f, a in zip(kind._fields, value, strict=True)])
        else:
            raise TypeError(f"{weights._fields[index]} must be a gradcells.{kind.__name__} of "
                            f"{len(kind._fields)} arrays or None, got {type(value).__name__}")
        flat += (*weights[start:index], *inner)
        start = index + 1
    return flat + tuple(weights[start:])


_NESTED_AT = {op: tuple((spec.weights._fields.index(name), kind)
                        for name, kind in spec.nested.items()) for op, spec in OPS.items()}
"""Where each op's nested weight sets stand in its weights, with their types."""
_NONES = {kind: (None,) * len(kind._fields) for spec in OPS.values()
          for kind in spec.nested.values()}


def checked_library(spec, x, states, weights, *, reset_after, batch_first=False, result=None,
                    upstream=None):
    """Check every array of a forward call (and of its gradient when ``upstream`` is given),
    each group of optional weights whole or absent (``groups_given``: an LSTM's peepholes);
    return the arrays' library.
    The optional arrays (the peepholes, the projection, the layer norm) come last in
    ``spec.flat_arrays``."""
    projection = spec.h_width == "P" and weights.w_proj is not None
    layout = layout_of(spec.name, reset_after, projection, batch_first)
    values = (x, *states, *flat_weights(spec, weights))
    grad = upstream is not None
    if grad:        # the result's fields after the required arrays, the upstream last
        check_result(spec, result)
        n = layout.forward.n_required
        values = (*values[:n], *result, *values[n:], *map(upstream.__getitem__, spec.upstream))
    library = _check_arrays(values, layout.grad if grad else layout.forward,
                            (spec.name, reset_after, projection, batch_first, grad))
    if _GROUPS[spec.name]:
        groups_given(spec.name, weights)
    return library


_GROUPS = {op: tuple((flag, names, operator.attrgetter(*names))
                    for flag, names in SPECS[cell_of(op)].flags.items() if len(names) > 1)
           for op in OPS}
"""Each op's groups of more than one optional weight (the LSTM's peepholes), by flag, with
the getter of the group's weights."""


def groups_given(op, weights):
    """ValueError unless each of ``op``'s groups of optional weights (an LSTM's peepholes)
    is given whole or not at all."""
    for flag, names, group in _GROUPS[op]:
        given = given_values(group(weights))
        if any(given) and not all(given):
            present = [n for n, g in zip(names, given, strict=True) if g]
            missing = [n for n, g in zip(names, given, strict=True) if not g]
            raise ValueError(
                f"{flag} need all of {', '.join(names[:-1])} and {names[-1]} or none: got "
                f"{', '.join(present)} without {', '.join(missing)}")


def tuple_getter(names):
    """``operator.attrgetter(*names)``, giving a tuple for any number of names."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    return lambda value: tuple(getattr(value, name) for name in names)


def presence(names, weights):
    """Whether each weight of ``names`` is given (not None), as a tuple of bools; no Python
    frame per weight (this runs on every forward call)."""
    return given_values(map(getattr, itertools.repeat(weights), names))


def given_values(values):
    """Whether each of ``values`` is given (not None), as a tuple of bools."""
    return tuple(map(operator.is_not, values, itertools.repeat(None)))
