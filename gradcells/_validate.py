"""Argument checking for every public operation (docs/spec.md §7 and §10): checks only.

``forward_args`` and ``grad_args`` check everything about one call's arguments before any
computation, raise ``TypeError`` or ``ValueError`` naming the offending argument with the
expected and actual shape or dtype, and return the arrays' library and the call's settings
record (``gradcells._core.types``). What an operation takes is read from
``gradcells._core.specs``. Nothing here computes or copies an array, and nothing here
chooses a backend (``_dispatch`` does).

A gradient call resolves each setting from the forward's record (``result.settings``) and
from its own keywords: a keyword left at None takes the recorded value; one that contradicts
the record raises ``ValueError`` naming it; a result that records nothing (a tuple built by
hand) leaves the keywords to decide, with their documented defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
from typing import NamedTuple

import numpy as np

from ._core import arrays
from ._core.specs import (
    ACTIVATIONS,
    CLIP_GRADS,
    LN_CARRIES,
    MASKS,
    NORM_ARRAYS,
    NORM_FIELDS,
    OPS,
    OPTIONAL_WEIGHTS,
    PEEPHOLES,
    WEIGHT_LABELS,
    Labels,
)
from ._core.types import GRUSettings, GRUWeights, LSTMNorm, LSTMSettings, LSTMWeights, RNNSettings

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
FLOAT_DTYPES = (_FLOAT32, _FLOAT64)
_FLOAT16 = np.dtype(np.float16)  # accepted for CuPy arrays only (the GPU backend's half path)
refused_subclass = arrays.refused_subclass


def _library_and_dtype(specs):
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
            if a_dtype not in FLOAT_DTYPES and not (lib == "cupy" and a_dtype == _FLOAT16):
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


def _check_shapes(specs, expected_shapes, origin):
    """``specs``: (name, array-or-None, labels); ``expected_shapes``: each one's shape;
    ``origin()``: which arguments the sizes were read from, for the message."""
    for (name, a, labels), expected in zip(specs, expected_shapes):
        if a is not None and a.shape != expected:
            raise ValueError(
                f"{name} must have shape [{', '.join(labels)}] = {expected}, "
                f"got {tuple(a.shape)} ({origin()})")


_EXPECTED_SHAPES: dict = {}  # (layout key, x's shape, H) -> every array's expected shape


def _expected_shapes(key, labels, x_shape, n_hidden, n_proj):
    """The shape each of ``labels`` (a tuple of label tuples, named by the small hashable
    ``key``) stands for, given x's shape (``[B, I]``, ``[T, B, I]`` or ``[B, T, I]`` as
    ``labels[0]``, x's labels, says), H and P. A program's
    calls repeat a few shapes, so the answer is kept (up to a few thousand of them)."""
    cached = _EXPECTED_SHAPES.get((key, x_shape, n_hidden, n_proj))
    if cached is not None:
        return cached
    n_in = x_shape[-1]
    sizes = {**dict(zip(labels[0], x_shape)), "H": n_hidden, "I+H": n_in + n_hidden,
             "2H": 2 * n_hidden, "4H": 4 * n_hidden, "P": n_proj, "I+P": n_in + n_proj}
    if len(_EXPECTED_SHAPES) >= 4096:
        _EXPECTED_SHAPES.clear()
    shapes = tuple(tuple([sizes[label] for label in each]) for each in labels)
    _EXPECTED_SHAPES[(key, x_shape, n_hidden, n_proj)] = shapes
    return shapes


def _check_arrays(specs, n_required, labels, key, proj=None):
    """Every check on one call's arrays; returns their library ("numpy" or "cupy").

    ``specs``: (name, array-or-None, shape labels), x (``[B, I]`` or ``[T, B, I]``) first and
    an array ``[B, H]`` second; the first ``n_required`` must be given; ``labels``: the
    specs' labels as one tuple, named by the hashable ``key``; ``proj``: the index of the
    spec whose width is P (an LSTM's ``w_proj``), when it is given. In order: required
    arrays given, one library and float dtype, the ranks of x, of the ``[B, H]`` array and
    of ``w_proj`` (which fix the sizes), every shape.
    """
    (x_name, x, x_labels), (h_name, h, h_labels) = specs[0], specs[1]
    _require_arrays(specs[:n_required])
    library, _ = _library_and_dtype(specs)
    x_shape = _matrix_dims(x_name, x, x_labels)
    h_shape = _matrix_dims(h_name, h, h_labels)
    n_proj = h_shape[1] if proj is None else _matrix_dims(*specs[proj])[1]

    def origin():
        return (f"{', '.join(x_labels)} from {x_name} {tuple(x_shape)}, "
                f"H from {h_name} {tuple(h_shape)}"
                + ("" if proj is None else f", P from w_proj {tuple(specs[proj][1].shape)}"))

    _check_shapes(specs, _expected_shapes(key, labels, tuple(x_shape), h_shape[1], n_proj),
                  origin)
    return library


def _real(name, value):
    """A finite real attribute as a float: a Python or NumPy number, or a 0-d integer or
    float array (what a PyTorch or JAX scalar becomes on its way in). An integer beyond
    float64 (finite, but beyond every dtype) comes back as ±inf for the caller to judge."""
    if type(value) is float and math.isfinite(value):  # the common case, first
        return value
    scalar_array = (getattr(value, "shape", None) == ()
                    and getattr(getattr(value, "dtype", None), "kind", None) in ("f", "i", "u"))
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or scalar_array):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}")
    return number


_HALF_MAX = float(np.finfo(np.float16).max)


def _beyond(value, dtype):
    """Whether the float ``value`` is beyond the largest finite number of ``dtype``."""
    return abs(value) > _HALF_MAX and abs(value) > float(np.finfo(dtype).max)


def _shown(number):
    """``number`` for a message: ``1e+300``, or an integer beyond float64 by its size."""
    try:
        return f"{float(number):.4g}"
    except OverflowError:
        return f"an integer of {int(number).bit_length()} bits"


def forget_bias_value(forget_bias, dtype):
    """``forget_bias`` as a float, finite in the arrays' ``dtype`` (1e300 would be inf in
    float32)."""
    value = _real("forget_bias", forget_bias)
    if _beyond(value, dtype):
        raise ValueError(f"forget_bias must be finite in the arrays' dtype {np.dtype(dtype)} "
                         f"(|forget_bias| <= {np.finfo(dtype).max:.4g}), got {_shown(forget_bias)}")
    return value


def cell_clip_value(cell_clip, dtype, name="cell_clip"):
    """None, 0 or negative means no clipping (returned as None); otherwise a positive float.
    A clip beyond the largest finite number of the arrays' ``dtype`` can never act: None.
    (``proj_clip`` follows the same rule, under its own ``name``.)"""
    if cell_clip is None:
        return None
    value = _real(name, cell_clip)
    return value if 0 < value and not _beyond(value, dtype) else None


def clip_grad_value(clip_grad):
    """``clip_grad``, one of ``CLIP_GRADS``."""
    if not isinstance(clip_grad, str) or clip_grad not in CLIP_GRADS:
        raise ValueError(f"clip_grad must be one of {CLIP_GRADS}, got {clip_grad!r}")
    return clip_grad


def activation_value(activation):
    """``activation``, one of ``ACTIVATIONS``."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation


def bool_value(name, value):
    """``value`` of the flag ``name`` as a bool (a bool or NumPy bool only)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def reset_after_value(reset_after):
    """``reset_after`` as a bool."""
    return bool_value("reset_after", reset_after)


def peepholes_given(wci, wcf, wco):
    """True when all three peephole vectors are given, False when none is; else ValueError."""
    if wci is None and wcf is None and wco is None:
        return False
    given = [name for name, v in zip(PEEPHOLES, (wci, wcf, wco)) if v is not None]
    if given and len(given) != len(PEEPHOLES):
        missing = [name for name in PEEPHOLES if name not in given]
        raise ValueError(
            f"peepholes need all of {', '.join(PEEPHOLES[:-1])} and {PEEPHOLES[-1]} or none: "
            f"got {', '.join(given)} "
            f"without {', '.join(missing)}")
    return bool(given)


def _check_result(spec, result):
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


def _require_arrays(specs):
    for name, a, _ in specs:
        if a is None:
            raise TypeError(f"{name} must be an array, got None")


def seq_len_value(seq_len, library, x, batch_first=False):
    """Check ``seq_len``: None, a list or tuple of integers, or an integer array ``[B]`` of
    ``library`` (on ``x``'s device), with values in ``[0, T]``. Returns None when it is None
    or every row runs all T steps, else the lengths as an array of ``library``.

    Reading the extremes of a CuPy array synchronises with the device once.
    """
    if seq_len is None:
        return None
    if isinstance(seq_len, (list, tuple)):
        seq_len = _lengths_array(seq_len, library, x)
    lib = arrays.library_of(seq_len)
    if lib not in arrays.NATIVE or refused_subclass(seq_len):
        raise TypeError(
            f"seq_len must be a {library} integer array [B] (or a list of integers), got "
            f"{type(seq_len).__name__}")
    if lib != library:
        raise TypeError(
            f"seq_len must come from the same array library as x ({library}), got {lib}")
    if lib == "cupy" and seq_len.device.id != x.device.id:
        raise ValueError(f"seq_len is on CUDA device {seq_len.device.id} but x is on device "
                         f"{x.device.id}; pass arrays on one device")
    n_steps, n_batch = x.shape[1::-1] if batch_first else x.shape[:2]
    if seq_len.dtype.kind not in "iu":
        raise TypeError(f"seq_len must have an integer dtype, got {seq_len.dtype}")
    if tuple(seq_len.shape) != (n_batch,):
        raise ValueError(
            f"seq_len must have shape [B] = ({n_batch},), got {tuple(seq_len.shape)}")
    if n_batch == 0:
        return None
    with contextlib.nullcontext() if lib == "numpy" else seq_len.device:
        # On x's device (checked above) whatever device is current: a CuPy reduction on
        # another device needs peer access, and warns or fails without it.
        shortest, longest = int(seq_len.min()), int(seq_len.max())
    if shortest < 0 or longest > n_steps:
        bad = shortest if shortest < 0 else longest
        raise ValueError(
            f"seq_len must hold lengths in [0, T] = [0, {n_steps}], got {bad}")
    return None if shortest == n_steps else seq_len


# --------------------------------------------------------------------------------------
# One call's arguments, by operation


class _Layout(NamedTuple):
    """What one operation's arrays are called and shaped like, settled once per operation
    and GRU variant: the forward's arrays (x, the states, the weights) with the required
    ones first, then the gradient's result fields and upstream gradients."""

    names: tuple[str, ...]
    labels: tuple[Labels, ...]
    n_required: int
    result_names: tuple[str, ...]
    result_labels: tuple[Labels, ...]
    upstream: tuple[str, ...]
    upstream_labels: tuple[Labels, ...]
    grad_labels: tuple[Labels, ...]  # a gradient call's arrays' labels, in checking order


@functools.cache
def _layout(op: str, reset_after: bool, projection: bool = False,
            batch_first: bool = False) -> _Layout:
    spec = OPS[op]
    names = spec.flat_arrays
    labels = ((spec.x_labels,) + spec.state_labels
              + tuple(_weight_labels(spec, name, reset_after)
                      for name in names[1 + len(spec.states):]))
    n_required = sum(name not in OPTIONAL_WEIGHTS for name in names)
    upstream_labels = tuple(spec.upstream_labels(name) for name in spec.upstream)
    result_labels = spec.result_labels()
    if not projection:  # P is H: the messages say so
        labels, result_labels, upstream_labels = (
            _without_projection(group) for group in (labels, result_labels, upstream_labels))
    if batch_first:  # every per-step array is [B, T, ·]
        labels, result_labels, upstream_labels = (
            _batch_first(group) for group in (labels, result_labels, upstream_labels))
    return _Layout(names, labels, n_required,
                   _qualified_names(spec.result_arg, spec.result._fields),
                   result_labels, spec.upstream, upstream_labels,
                   labels[:n_required] + result_labels + labels[n_required:]
                   + upstream_labels)


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


_NO_NORM = (None,) * len(NORM_FIELDS)


def _flat_weights(spec, weights):
    """The weight set's arrays in ``spec.flat_arrays`` order: an LSTM's ``layer_norm`` as
    its six arrays (six Nones without one), after checking that it is an ``LSTMNorm`` of
    arrays."""
    if spec.settings is not LSTMSettings:
        return weights
    norm = weights[6]
    if norm is None:
        return (*weights[:6], *_NO_NORM)
    if not isinstance(norm, LSTMNorm):
        raise TypeError(f"layer_norm must be a gradcells.LSTMNorm of six arrays or None, got "
                        f"{type(norm).__name__}")
    _require_arrays([(name, a, None) for name, a in zip(NORM_ARRAYS, norm)])
    return (*weights[:6], *norm)


def _checked_library(spec, x, states, weights, *, reset_after, batch_first=False, result=None,
                     upstream=None):
    """Check every array of a forward call (and of its gradient when ``upstream`` is given);
    return the arrays' library. The optional arrays (the peepholes, the projection, the
    layer norm) come last in ``spec.flat_arrays``."""
    projection = spec.settings is LSTMSettings and weights[5] is not None
    layout = _layout(spec.name, reset_after, projection, batch_first)
    specs = list(zip(layout.names, (x, *states, *_flat_weights(spec, weights)), layout.labels))
    n_required = layout.n_required
    if upstream is not None:
        _check_result(spec, result)
        specs[n_required:n_required] = zip(layout.result_names, result, layout.result_labels)
        n_required += len(layout.result_names)
        specs += zip(layout.upstream, [upstream[name] for name in layout.upstream],
                     layout.upstream_labels)
    grad = upstream is not None
    proj = _proj_index(layout, grad) if projection else None
    library = _check_arrays(specs, n_required, layout.grad_labels if grad else layout.labels,
                            (spec.name, reset_after, projection, batch_first, grad), proj)
    if spec.settings is LSTMSettings:
        peepholes_given(*weights[2:5])
    return library


def _proj_index(layout, grad):
    """Where ``w_proj`` stands among the specs of a call that has one."""
    index = layout.names.index("w_proj")
    return index + len(layout.result_names) if grad else index


def forward_args(op: str, x, states, weights, *, forget_bias=1.0, cell_clip=None,
                 proj_clip=None, ln_epsilon=1e-5, ln_carry="raw", reset_after=False,
                 activation="tanh", seq_len=None, reverse=False, batch_first=False,
                 masks=None):
    """Check a forward call of ``op``; return ``(library, settings)``. The keywords are the
    op's attributes as the caller gave them (those the op does not have keep their
    defaults)."""
    spec = OPS[op]
    kind = spec.settings
    reset_after = reset_after_value(reset_after) if kind is GRUSettings else False
    if kind is RNNSettings:
        activation = activation_value(activation)
    order = ((bool_value("reverse", reverse), bool_value("batch_first", batch_first))
             if spec.sequence else (False, False))
    library = _checked_library(spec, x, states, weights, reset_after=reset_after,
                               batch_first=order[1])
    seq_len = (_recorded_copy(seq_len_value(seq_len, library, x, order[1]))
               if spec.sequence else None)
    settings = _settings(spec, x, weights, seq_len, reset_after=reset_after,
                         activation=activation, forget_bias=forget_bias, cell_clip=cell_clip,
                         proj_clip=proj_clip, ln_epsilon=ln_epsilon, ln_carry=ln_carry)
    if order != (False, False):
        settings = dataclasses.replace(settings, reverse=order[0], batch_first=order[1])
    if masks and any(m is not None for m in masks.values()):
        settings = dataclasses.replace(settings, **{
            name: _recorded_copy(mask_value(name, m, x, states, batch_first=order[1]))
            for name, m in masks.items() if m is not None})
    return library, settings


def mask_value(name, mask, x, states, *, batch_first):
    """Check a sequence's mask (docs/spec.md §11.3): an array of x's library and dtype that
    broadcasts to its shape in ``MASKS`` (in the ``batch_first`` layout when it has a time
    axis). Returns it."""
    _library_and_dtype([("x", x), (name, mask)])
    labels = MASKS[name]
    if states[0].shape[1] == states[-1].shape[1]:  # no projection: P is H
        labels = tuple("H" if label == "P" else label for label in labels)
    if batch_first and labels[0] == "T":
        labels = ("B", "T", *labels[2:])
    n_steps, n_batch = x.shape[1::-1] if batch_first else x.shape[:2]
    sizes = {"T": n_steps, "B": n_batch, "I": x.shape[-1], "H": states[0].shape[1],
             "P": states[-1].shape[1]}
    target = tuple(sizes[label] for label in labels)
    try:
        fits = np.broadcast_shapes(tuple(mask.shape), target) == target
    except ValueError:
        fits = False
    if not fits or mask.ndim > len(target):
        raise ValueError(f"{name} must broadcast to [{', '.join(labels)}] = {target}, got "
                         f"shape {tuple(mask.shape)}")
    return mask


def _settings(spec, x, weights, seq_len, *, reset_after, activation, forget_bias, cell_clip,
              proj_clip, ln_epsilon, ln_carry):
    """The settings record of a forward call of ``spec`` (time order and layout aside)."""
    kind = spec.settings
    if kind is GRUSettings:
        return GRUSettings(reset_after, seq_len)
    if kind is RNNSettings:
        return RNNSettings(activation, seq_len)
    values = (forget_bias_value(forget_bias, x.dtype), cell_clip_value(cell_clip, x.dtype),
              weights[2] is not None, _proj_clip_value(proj_clip, weights, x.dtype),
              _norm_values(weights, ln_epsilon, ln_carry, x.dtype))
    return (_lstm_settings(*values) if seq_len is None
            else dataclasses.replace(_lstm_settings(*values), seq_len=seq_len))


@functools.lru_cache(maxsize=256)
def _lstm_settings(forget_bias, cell_clip, peepholes, proj_clip, norm):
    """The record of a call without lengths; records are frozen, so calls share them."""
    return LSTMSettings(forget_bias, cell_clip, peepholes, None, projection=proj_clip[0],
                        proj_clip=proj_clip[1], layer_norm=norm[0], ln_epsilon=norm[1],
                        ln_carry=norm[2])


_DEFAULT_NORM = (LSTMSettings.ln_epsilon, LSTMSettings.ln_carry)


def _norm_values(weights, ln_epsilon, ln_carry, dtype):
    """``(layer_norm, ln_epsilon, ln_carry)``: whether ``layer_norm`` is given and its
    settings, checked; without a layer norm, settings other than the defaults are refused."""
    values = (ln_epsilon_value(ln_epsilon, dtype), ln_carry_value(ln_carry))
    if weights[6] is None and values != _DEFAULT_NORM:
        name = "ln_epsilon" if values[0] != _DEFAULT_NORM[0] else "ln_carry"
        raise ValueError(f"{name} is a setting of the layer norm: pass layer_norm with it")
    return (weights[6] is not None, *values)


def ln_epsilon_value(ln_epsilon, dtype):
    """``ln_epsilon`` as a float, positive and a positive normal number in ``dtype`` (the
    layer norms divide by ``sqrt(var + ε)``, and ``var`` may be 0)."""
    value = _real("ln_epsilon", ln_epsilon)
    if not (float(np.finfo(dtype).tiny) <= value and not _beyond(value, dtype)):
        raise ValueError(f"ln_epsilon must be positive and a normal number in the arrays' dtype "
                         f"{np.dtype(dtype)} (>= {np.finfo(dtype).tiny:.4g}), got "
                         f"{_shown(ln_epsilon)}")
    return value


def ln_carry_value(ln_carry):
    """``ln_carry``, one of ``LN_CARRIES``."""
    if not isinstance(ln_carry, str) or ln_carry not in LN_CARRIES:
        raise ValueError(f"ln_carry must be one of {LN_CARRIES}, got {ln_carry!r}")
    return ln_carry


def _proj_clip_value(proj_clip, weights, dtype):
    """``(projection, proj_clip)``: whether ``w_proj`` is given and its clip (None: off, as
    ``cell_clip``); a clip without a projection is refused."""
    clip = cell_clip_value(proj_clip, dtype, "proj_clip")
    if weights[5] is None and clip is not None:
        raise ValueError("proj_clip clips the projection: pass w_proj with it")
    return weights[5] is not None, clip


def _recorded_copy(array):
    """An array (lengths, a mask) as the record keeps it: a copy (a caller who changes their
    array later does not change what the forward was computed with), read-only where NumPy
    allows."""
    if array is None:
        return None
    kept = array.copy()
    if isinstance(kept, np.ndarray):
        kept.flags.writeable = False
    return kept


def grad_args(op: str, x, states, weights, result, upstream, *, cell_clip=None,
              proj_clip=None, ln_epsilon=None, ln_carry=None, reset_after=None,
              activation=None, seq_len=None, reverse=None, batch_first=None, masks=None):
    """Check a gradient call of ``op``; return ``(library, settings)``: the forward's record,
    each setting given again (None: not given) checked against it; for a result that
    records nothing, the record the keywords make.

    ``upstream``: the upstream gradients by name (None where absent).
    """
    spec = OPS[op]
    recorded = result.settings if type(result) is spec.result else None
    settings = recorded
    if settings is None:
        settings = (LSTMSettings(peepholes=weights[2] is not None,
                                 projection=weights[5] is not None,
                                 layer_norm=weights[6] is not None)
                    if spec.settings is LSTMSettings else spec.settings())
    settings = _given_again(spec, recorded, settings, {  # the shapes depend on these
        "reset_after": (reset_after, reset_after_value),
        "activation": (activation, activation_value),
        "reverse": (reverse, functools.partial(bool_value, "reverse")),
        "batch_first": (batch_first, functools.partial(bool_value, "batch_first"))})
    if spec.settings is LSTMSettings:  # before the shapes, which depend on the projection
        _check_optional(spec, recorded, weights)
    library = _checked_library(spec, x, states, weights,
                               reset_after=getattr(settings, "reset_after", False),
                               batch_first=settings.batch_first, result=result,
                               upstream=upstream)
    batch_first = settings.batch_first
    return library, _given_again(spec, recorded, settings, {
        "seq_len": (seq_len, lambda value: seq_len_value(value, library, x, batch_first)),
        "cell_clip": (cell_clip, lambda value: cell_clip_value(value, x.dtype)),
        "proj_clip": (proj_clip, lambda value: _proj_clip_value(value, weights, x.dtype)[1]),
        "ln_epsilon": (ln_epsilon, lambda value: ln_epsilon_value(value, x.dtype)),
        "ln_carry": (ln_carry, ln_carry_value),
        **{name: (m, functools.partial(mask_value, name, x=x, states=states,
                                       batch_first=batch_first))
           for name, m in (masks or {}).items()}})


def _given_again(spec, recorded, settings, given):
    """``settings`` with each setting of ``given`` (name: (value or None, its
    normalisation)) that the call gives again checked against the record (``_agreeing``)."""
    for name, (value, normalised) in given.items():
        if value is not None:
            settings = _agreeing(spec, recorded, settings, name, normalised(value))
    return settings


def _check_optional(spec, recorded, weights):
    """ValueError unless the peepholes, the projection and the layer norm are present as the
    forward's record says."""
    peepholes, projection, norm = (weights[k] is not None for k in (2, 5, 6))
    if recorded is None or (peepholes == recorded.peepholes
                            and projection == recorded.projection
                            and norm == recorded.layer_norm):
        return
    for given, flag, names in ((peepholes, "peepholes", ", ".join(PEEPHOLES)),
                               (projection, "projection", "w_proj"),
                               (norm, "layer_norm", "layer_norm")):
        ran = getattr(recorded, flag)
        if given != ran:
            raise ValueError(
                f"the forward ran with {flag}; pass {names} again" if ran else
                f"{names} {'were' if ',' in names else 'was'} given but the forward ran "
                f"without {flag} ({spec.result_arg}.settings.{flag} is False)")


def _agreeing(spec, recorded, settings, name, value):
    """``settings`` with setting ``name`` given again as ``value``: unchanged when it agrees
    with the forward's record, ValueError naming it when it contradicts the record; with no
    record, ``settings`` with ``name`` set."""
    if recorded is None:
        return dataclasses.replace(settings, **{name: value})
    before = getattr(recorded, name)
    agrees = (_same_arrays(value, before) if name == "seq_len" or name in MASKS
              else value == before)
    if not agrees:
        raise ValueError(
            f"{name}={_setting_text(value)} contradicts the forward's {name}="
            f"{_setting_text(before)} recorded in {spec.result_arg}.settings; leave "
            f"{name} out to use the forward's")
    return settings


def _same_arrays(a, b):
    """Whether two arrays (lengths, masks) or Nones are the same."""
    if a is None or b is None:
        return a is b
    return a is b or (a.shape == b.shape and bool((a == b).all()))


def _setting_text(value):
    if value is None or isinstance(value, (bool, float, int, str)):
        return repr(value)
    if value.ndim != 1 or value.dtype.kind not in "iu":
        return f"<an array of shape {tuple(value.shape)}>"
    return f"[{', '.join(str(int(n)) for n in value.tolist())}]"


def _lengths_array(values, library, x):
    """A list or tuple of lengths as an array of ``library`` on ``x``'s device (its dtype
    then says whether they were integers)."""
    if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in values):
        raise TypeError("seq_len must hold integers, got "
                        f"{sorted({type(n).__name__ for n in values})}")
    lengths = np.asarray(values, dtype=np.int64).reshape(len(values))
    if library == "numpy":
        return lengths
    with x.device:
        return arrays.namespace_of(x).asarray(lengths)


# --------------------------------------------------------------------------------------
# Stacks (docs/spec.md §11.4): what composes the layers; each layer's sequence call checks
# its own arrays


def stack_args(weights_type, x, states, weights, *, bidirectional, batch_first,
               dropout_masks):
    """Check what a stack call adds to its layers' calls: the flags, the list of weight sets
    (their number, type and the sizes that chain the layers), the initial states' leading
    ``L·D`` axis and the dropout masks. Returns ``(directions, widths, masks)``: 1 or 2,
    each layer's state width (P for an LSTM, else H) and the masks as a tuple (or None)."""
    directions = 2 if bool_value("bidirectional", bidirectional) else 1
    bool_value("batch_first", batch_first)
    widths = _stack_widths(weights_type, weights, directions)
    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"x must be a 3-D array [{'B, T' if batch_first else 'T, B'}, I], "
                         f"got {_described(x)}")
    _check_chain(weights_type, weights, widths, directions, x.shape[-1])
    for name, state in states.items():
        if getattr(state, "ndim", None) != 3 or state.shape[0] != len(weights):
            raise ValueError(
                f"{name} must be a 3-D array [L·D, B, ·] with L·D = {len(weights)} (one state "
                f"per weight set), got {_described(state)}")
    return directions, widths, _stack_masks(dropout_masks, x, widths, directions, batch_first)


def _described(a):
    """``shape (...)`` of an array, else its type's name, for a message."""
    return f"shape {tuple(a.shape)}" if hasattr(a, "shape") else type(a).__name__


def _stack_widths(weights_type, weights, directions):
    """Each layer's state width, after checking the list's type, length and directions."""
    if not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError(f"weights must be a non-empty list of gradcells.{weights_type.__name__}, "
                        f"got {type(weights).__name__}")
    for k, w in enumerate(weights):
        if not isinstance(w, weights_type):
            raise TypeError(f"weights[{k}] must be a gradcells.{weights_type.__name__}, got "
                            f"{type(w).__name__}")
    if len(weights) % directions:
        raise ValueError(f"weights holds {len(weights)} weight sets; a bidirectional stack "
                         "needs two per layer (layer 0, layer 0 reverse, layer 1, ...)")
    widths = [_state_width(w) for w in weights]
    for k, width in enumerate(widths):
        if width != widths[0]:
            raise ValueError(f"weights[{k}] has a state {width} wide but weights[0] one "
                             f"{widths[0]} wide: the states [L·D, B, ·] give every layer and "
                             "direction one width")
    return widths[::directions]


def _state_width(weights):
    """The recurrent state's width of one weight set: P (an LSTM's projection) or H."""
    if isinstance(weights, LSTMWeights):
        return (weights.w_proj.shape[1] if weights.w_proj is not None
                else weights.b.shape[0] // 4)
    return weights[1].shape[1] if isinstance(weights, GRUWeights) else weights.w.shape[1]


def _check_chain(weights_type, weights, widths, directions, n_in):
    """ValueError unless each layer's first weight has rows for its input (x's ``I`` for
    layer 0, ``D·P`` of the layer below after it) and its own state."""
    for k, w in enumerate(weights):
        layer = k // directions
        width_in = n_in if layer == 0 else directions * widths[layer - 1]
        rows, name = w[0].shape[0], weights_type._fields[0]
        if rows != width_in + widths[layer]:
            source = ("x's input size" if layer == 0 else
                      f"{directions} × {widths[layer - 1]}, layer {layer - 1}'s outputs")
            raise ValueError(
                f"weights[{k}].{name} has {rows} rows, but layer {layer}'s input is {width_in} "
                f"wide ({source}) and its state {widths[layer]}: it needs "
                f"{width_in + widths[layer]}")


def _stack_masks(masks, x, widths, directions, batch_first):
    """The dropout masks as a tuple (None when not given), each checked against the layer
    outputs it multiplies."""
    if masks is None:
        return None
    n_layers = len(widths)
    if not isinstance(masks, (list, tuple)) or len(masks) != n_layers - 1:
        raise ValueError(f"dropout_masks must hold num_layers - 1 = {n_layers - 1} arrays (one "
                         "per boundary between layers), got "
                         + (f"{len(masks)}" if isinstance(masks, (list, tuple))
                            else type(masks).__name__))
    leading = tuple(x.shape[:2])
    for k, mask in enumerate(masks):
        name, outputs = f"dropout_masks[{k}]", (*leading, directions * widths[k])
        _library_and_dtype([("x", x), (name, mask)])
        try:
            np.broadcast_shapes(tuple(mask.shape), outputs)
        except ValueError:
            labels = "B, T" if batch_first else "T, B"
            raise ValueError(f"{name} of shape {tuple(mask.shape)} does not broadcast to layer "
                             f"{k}'s outputs [{labels}, D·P] = {outputs}") from None
    return tuple(masks)


def stack_upstream(stack, upstream):
    """ValueError unless each upstream gradient of a stack's gradient call has the shape of
    what it is the gradient of (``d_h``: the top outputs; ``d_*_final``: the final
    states)."""
    for name, g in upstream.items():
        if g is None:
            continue
        like = getattr(stack, name.removeprefix("d_"))
        if tuple(getattr(g, "shape", ())) != tuple(like.shape):
            raise ValueError(f"{name} must have the shape of stack.{name.removeprefix('d_')} "
                             f"{tuple(like.shape)}, got {_described(g)}")


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
                        f"got {_described(tangents)}")
    checked = [_tangent(f"tangents.{name}", t, p)
               for name, t, p in zip(grads._fields, tangents, primals)]
    return grads(*checked)


def _tangent(name, tangent, primal, of=None):
    """One field of ``tangents_value``: None, or checked against its primal (named ``of``;
    by default ``name`` without its first part, ``tangents.x`` -> ``x``)."""
    of = name.split(".", 1)[-1] if of is None else of
    if tangent is None:
        return None
    if primal is None:
        raise ValueError(f"{name} is given, but the call has no {of}")
    if isinstance(primal, LSTMNorm):
        if not isinstance(tangent, (tuple, list)) or len(tangent) != len(primal):
            raise TypeError(f"{name} must be an LSTMNorm (or None), got {_described(tangent)}")
        return LSTMNorm(*(_tangent(f"{name}.{field}", t, p)
                          for field, t, p in zip(NORM_FIELDS, tangent, primal)))
    _library_and_dtype([(of, primal), (name, tangent)])
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
                        f"zero), got {_described(tangents)}")
    names = grads_type._fields
    checked = [_tangent(f"tangents.{n}", t, p) for n, t, p in zip(names, tangents, (x, *states))]
    d_weights = tangents[-1]
    if d_weights is None:
        return checked[0], checked[1:], [None] * len(weights)
    if not isinstance(d_weights, (tuple, list)) or len(d_weights) != len(weights):
        raise ValueError(f"tangents.weights must list one weight set of tangents (or None) per "
                         f"weight set ({len(weights)}), got {_described(d_weights)}")
    return checked[0], checked[1:], [None if d is None else type(w)(*d)
                                     for d, w in zip(d_weights, weights)]


def upstream_tangents(op: str, result, given):
    """Check the upstream gradients' tangents of a gradient JVP call of ``op``: ``given``
    maps ``d_h_tangent``, ... to None or an array of the result field's (``h``, ...)
    library, dtype and shape. Returns ``given``."""
    fields = dict(zip(OPS[op].result._fields, result))
    for name, tangent in given.items():
        field = name.removeprefix("d_").removesuffix("_tangent")
        _tangent(name, tangent, fields[field], f"the result's {field}")
    return given
