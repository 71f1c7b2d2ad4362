"""The settings a call gives by keyword, each checked and normalised (``forget_bias`` a
finite float, ``cell_clip`` None or positive, ``seq_len`` an integer array or None, a mask
checked against the shape it broadcasts to, ...), and the frozen settings record a forward
builds from them (``settings_record``; docs/spec.md §10).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from .._core import arrays
from .._core.specs import FLAG_MASKS, MASKS, Keyword
from .arrays import library_and_dtype, presence, refused_subclass


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


def real_value(name, value, dtype):
    """A setting ``name`` as a float, finite in the arrays' ``dtype`` (1e300 would be inf in
    float32): ``forget_bias``."""
    number = _real(name, value)
    if _beyond(number, dtype):
        raise ValueError(f"{name} must be finite in the arrays' dtype {np.dtype(dtype)} "
                         f"(|{name}| <= {np.finfo(dtype).max:.4g}), got {_shown(value)}")
    return number


def clip_value(name, value, dtype):
    """A clip ``name``: None, 0 or negative means no clipping (returned as None); otherwise
    a positive float. A clip beyond the largest finite number of the arrays' ``dtype`` can
    never act: None. (``cell_clip``, ``proj_clip``.)"""
    if value is None:
        return None
    number = _real(name, value)
    return number if 0 < number and not _beyond(number, dtype) else None


def positive_value(name, value, dtype):
    """A setting ``name`` as a float, positive and a normal number in ``dtype``
    (``ln_epsilon``: the layer norms divide by ``sqrt(var + ε)``, and ``var`` may be 0)."""
    number = _real(name, value)
    if not (float(np.finfo(dtype).tiny) <= number and not _beyond(number, dtype)):
        raise ValueError(f"{name} must be positive and a normal number in the arrays' dtype "
                         f"{np.dtype(dtype)} (>= {np.finfo(dtype).tiny:.4g}), got "
                         f"{_shown(value)}")
    return number


def bound_value(name, value, dtype):
    """A bound ``name``: None (no bound), or a float, positive and a normal number in
    ``dtype`` (``sqrt_grad_bound``: 0 or a negative bound is refused, never read as
    none)."""
    return None if value is None else positive_value(name, value, dtype)


def choice_value(name, value, choices):
    """A setting ``name``, one of ``choices`` (``activation``, ``ln_carry``, ``clip_grad``)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def bool_value(name, value):
    """``value`` of the flag ``name`` as a bool (a bool or NumPy bool only)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def keyword_value(keyword, value, dtype=None):
    """A cell's keyword (a ``Keyword`` of its spec) checked and normalised by its
    ``check``; the checks that need the arrays' ``dtype`` are given it."""
    check, name = keyword.check, keyword.name
    if check == "bool":
        return bool_value(name, value)
    if check == "choice":
        return choice_value(name, value, keyword.choices)
    return {"real": real_value, "clip": clip_value, "positive": positive_value,
            "bound": bound_value}[check](name, value, dtype)


def needs_arrays(keyword):
    """Whether checking ``keyword`` needs the arrays' dtype (so comes after them)."""
    return keyword.check not in ("bool", "choice")


def grad_option(cell, name, value):
    """A gradient's own keyword ``name`` (of the cell's ``grad_options``), checked (its
    default, the common call, needs no check)."""
    keyword = _grad_options(cell)[name]
    return value if value is keyword.default else keyword_value(keyword, value)


@functools.cache
def _grad_options(cell):
    return {k.name: k for k in cell.grad_options}


def seq_len_value(seq_len, library, x, batch_first=False):
    """Check ``seq_len``: None, a list or tuple of integers, or an integer array ``[B]`` of
    ``library`` (on ``x``'s device), with values in ``[0, T]``. Returns None when it is None
    or every row runs all T steps, else the lengths as an array of ``library``.

    Reading the extremes of a CuPy array synchronises with the device once.
    """
    if seq_len is None:
        return None
    n_steps, n_batch = x.shape[1::-1] if batch_first else x.shape[:2]
    if isinstance(seq_len, (list, tuple)):
        seq_len = _lengths_array(seq_len, library, x, n_steps)
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
        raise ValueError(_out_of_range(n_steps, shortest if shortest < 0 else longest))
    return None if shortest == n_steps else seq_len


def _out_of_range(n_steps, bad):
    """The message of a length ``bad`` outside [0, T]."""
    return f"seq_len must hold lengths in [0, T] = [0, {n_steps}], got {bad}"


def _lengths_array(values, library, x, n_steps):
    """A list or tuple of lengths as an array of ``library`` on ``x``'s device (its dtype
    then says whether they were integers; a length beyond int64 is out of range)."""
    if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in values):
        raise TypeError("seq_len must hold integers, got "
                        f"{sorted({type(n).__name__ for n in values})}")
    beyond = [int(n) for n in values if not -2**63 <= int(n) < 2**63]
    if beyond:
        raise ValueError(_out_of_range(n_steps, beyond[0]))
    lengths = np.asarray(values, dtype=np.int64).reshape(len(values))
    if library == "numpy":
        return lengths
    with x.device:
        return arrays.namespace_of(x).asarray(lengths)


def mask_value(name, mask, x, states, *, batch_first):
    """Check a sequence's mask (docs/spec.md §11.3): an array of x's library and dtype that
    broadcasts to its shape in ``MASKS`` (in the ``batch_first`` layout when it has a time
    axis). A flag mask (``FLAG_MASKS``: ``resets``) is a boolean array of x's library and
    of exactly its shape. Returns it."""
    labels = MASKS[name]
    if name in FLAG_MASKS:
        return flag_mask_value(name, mask, x, labels, batch_first)
    library_and_dtype([("x", x), (name, mask)])
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


def flag_mask_value(name, mask, x, labels, batch_first):
    """Check a flag mask (``FLAG_MASKS``): a boolean array of ``x``'s library (on its
    device) of exactly the shape ``labels`` give (``[T, B]``; ``[B, T]`` with
    ``batch_first``)."""
    library = arrays.library_of(mask)
    if library not in arrays.NATIVE or refused_subclass(mask):
        raise TypeError(f"{name} must be a boolean array of x's library "
                        f"({arrays.library_of(x)}), got {type(mask).__name__}")
    if library != arrays.library_of(x):
        raise TypeError(arrays.two_libraries("x", arrays.library_of(x), name, library))
    if library == "cupy" and mask.device.id != x.device.id:
        raise ValueError(f"{name} is on CUDA device {mask.device.id} but x is on device "
                         f"{x.device.id}; pass arrays on one device")
    if mask.dtype != np.bool_:
        raise TypeError(f"{name} must have dtype bool, got {mask.dtype}")
    if batch_first:
        labels = ("B", "T", *labels[2:])
    n_steps, n_batch = x.shape[1::-1] if batch_first else x.shape[:2]
    target = tuple({"T": n_steps, "B": n_batch}[label] for label in labels)
    if tuple(mask.shape) != target:
        raise ValueError(f"{name} must have shape [{', '.join(labels)}] = {target}, got "
                         f"shape {tuple(mask.shape)}")
    return mask


class KeywordPlan(NamedTuple):
    """How a forward call checks one cell's keywords and notes its weights, settled once
    per cell (``keyword_plan``)."""

    early: tuple[Keyword, ...]
    """The keywords whose check needs no array (checked before the arrays)."""
    late: tuple[Keyword, ...]
    """The keywords whose check needs the arrays' dtype (checked after them)."""
    early_names: tuple[str, ...]
    early_given: tuple[Any, ...]
    """The early keywords' defaults as a call gives them."""
    early_defaults: tuple[tuple[str, Any], ...]
    """The same, checked: a call that gives them (the same objects) uses these."""
    late_names: tuple[str, ...]
    late_defaults: tuple[Any, ...]
    named: tuple[str, ...]
    """The weights the cell's flags and ``requires`` name, whose presence the record notes."""


@functools.cache
def keyword_plan(cell) -> KeywordPlan:
    """``cell``'s ``KeywordPlan``."""
    early = tuple(k for k in cell.keywords if not needs_arrays(k))
    late = tuple(k for k in cell.keywords if needs_arrays(k))
    named = tuple(dict.fromkeys((*(names[0] for names in cell.flags.values()),
                                 *(k.requires[0] for k in cell.keywords if k.requires))))
    return KeywordPlan(early, late, tuple(k.name for k in early), tuple(k.default for k in early),
                       tuple((k.name, keyword_value(k, k.default)) for k in early),
                       tuple(k.name for k in late), tuple(k.default for k in late), named)


def weights_present(cell, weights):
    """Which of the weights the cell's flags and ``requires`` name are given, by name."""
    named = keyword_plan(cell).named
    return dict(zip(named, presence(named, weights), strict=True))


def settings_record(cell, spec, values, present, seq_len=None):
    """The settings record of a forward call of ``spec`` (time order and layout aside):
    the checked keyword ``values``, the cell's flags (whether each group of optional
    weights is ``present``, by ``weights_present``) and ``seq_len``."""
    flags = {flag: present[names[0]] for flag, names in cell.flags.items()}
    record = _record(spec.settings, tuple({**values, **flags}.items()))
    return record if seq_len is None else dataclasses.replace(record, seq_len=seq_len)


@functools.lru_cache(maxsize=256)
def _record(kind, items):
    """A record without lengths; records are frozen, so calls share them."""
    return kind(**dict(items))


def check_requires(cell, settings, present):
    """ValueError for a setting other than its default whose weight is not ``present``
    (a ``Keyword.requires``): "proj_clip clips the projection: pass w_proj with it"."""
    for keyword in cell.keywords:
        if keyword.requires is None or keyword.forward_only:
            continue
        weight, does = keyword.requires
        value = getattr(settings, keyword.name)
        if not present[weight] and value != getattr(type(settings), keyword.name):
            raise ValueError(f"{keyword.name} {does}: pass {weight} with it")


@functools.lru_cache(maxsize=1024)
def checked_record(cell, spec, early, late, kinds, dtype, present):
    """``settings_record`` and ``check_requires`` of a forward call whose keywords are
    hashable: ``early`` the values checked before the arrays, ``late`` the ones given for
    the checks that need the arrays' dtype (``kinds``: their types, ``dtype``: its
    character code), ``present`` the ``presence`` of the plan's ``named`` weights. A call
    with settings seen before costs one lookup."""
    dtype, plan = np.dtype(dtype), keyword_plan(cell)
    values = dict(early)
    values.update((k.name, keyword_value(k, v, dtype))
                  for k, v in zip(plan.late, late, strict=True))
    present = dict(zip(plan.named, present, strict=True))
    record = settings_record(cell, spec, values, present)
    check_requires(cell, record, present)
    return record


def recorded_copy(array):
    """An array (lengths, a mask) as the record keeps it: a copy (a caller who changes their
    array later does not change what the forward was computed with), read-only where NumPy
    allows."""
    if array is None:
        return None
    kept = array.copy()
    if isinstance(kept, np.ndarray):
        kept.flags.writeable = False
    return kept

