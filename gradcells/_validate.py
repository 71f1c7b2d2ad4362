"""Argument checking shared by every public function (SPEC 7).

Each ``*_args`` function checks everything about one operation's arguments before any
computation, raises ``TypeError`` or ``ValueError`` naming the offending argument with the
expected and actual shape or dtype, and returns the backend module to call together with
the normalised attributes. Nothing here computes or copies an array.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import sys

import numpy as np

from . import _dispatch, _interop

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
FLOAT_DTYPES = (_FLOAT32, _FLOAT64)
_FLOAT16 = np.dtype(np.float16)  # accepted for CuPy arrays only (the GPU backend's half path)
CLIP_GRADS = ("exact", "straight_through")
LSTM_STATE_FIELDS = ("i", "cs", "f", "o", "ci", "co", "h")
GRU_STATE_FIELDS = ("r", "u", "c", "h")
LSTM_SEQUENCE_FIELDS = LSTM_STATE_FIELDS + ("cs_final", "h_final")
GRU_SEQUENCE_FIELDS = GRU_STATE_FIELDS + ("h_final",)
# The shape labels of each field of those results.
_STEP, _STATE = ("T", "B", "H"), ("B", "H")
LSTM_STATE_LABELS = (_STATE,) * len(LSTM_STATE_FIELDS)
GRU_STATE_LABELS = (_STATE,) * len(GRU_STATE_FIELDS)
LSTM_SEQUENCE_LABELS = (_STEP,) * len(LSTM_STATE_FIELDS) + (_STATE,) * 2
GRU_SEQUENCE_LABELS = (_STEP,) * len(GRU_STATE_FIELDS) + (_STATE,)


def refused_subclass(a) -> bool:
    """``np.matrix`` (``*`` is a matmul) and ``np.ma.MaskedArray`` (the backends would
    ignore the mask) change what an array means; they are refused, not silently taken as
    plain arrays. A masked array can only exist once ``numpy.ma`` is imported."""
    masked = sys.modules.get("numpy.ma")
    return isinstance(a, np.matrix) or (masked is not None and isinstance(a, masked.MaskedArray))


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
        lib = "numpy" if type(a) is np.ndarray else _dispatch.library_of(a)
        if lib is None or (type(a) is not np.ndarray and refused_subclass(a)):
            raise TypeError(f"{spec[0]} must be a NumPy or CuPy array, got {type(a).__name__}")
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
            raise TypeError(
                f"{first_name} and {spec[0]} come from two array libraries ({library} and "
                f"{lib}); pass arrays of one library")
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


def _check_shapes(specs, sizes, origin):
    """``specs``: (name, array-or-None, labels); ``sizes`` maps each label to its length;
    ``origin()``: which arguments the sizes were read from, for the message."""
    expected_for = {}  # most arrays share a few label tuples, e.g. ("B", "H")
    for name, a, labels in specs:
        if a is None:
            continue
        expected = expected_for.get(labels)
        if expected is None:
            expected = expected_for[labels] = tuple([sizes[label] for label in labels])
        if a.shape != expected:
            raise ValueError(
                f"{name} must have shape [{', '.join(labels)}] = {expected}, "
                f"got {tuple(a.shape)} ({origin()})")


_GATES_LABEL = {2: "2H", 4: "4H"}


def _sizes(x_shape, n_hidden, n_gates):
    """The length of every shape label, from x's shape (``[B, I]`` or ``[T, B, I]``), H and the
    number of gate blocks in the weights' columns (LSTM 4, GRU 2)."""
    n_in = x_shape[-1]
    sizes = {"B": x_shape[-2], "I": n_in, "H": n_hidden, "I+H": n_in + n_hidden,
             _GATES_LABEL[n_gates]: n_gates * n_hidden}
    if len(x_shape) == 3:
        sizes["T"] = x_shape[0]
    return sizes


def _check_arrays(specs, n_required, n_gates):
    """Every check on one call's arrays; returns their library ("numpy" or "cupy").

    ``specs``: (name, array-or-None, shape labels), x (``[B, I]`` or ``[T, B, I]``) first and
    an array ``[B, H]`` second; the first ``n_required`` must be given. In order: required
    arrays given, one library and float dtype, the ranks of x and of the ``[B, H]`` array
    (which fix the sizes), every shape.
    """
    (x_name, x, x_labels), (h_name, h, h_labels) = specs[0], specs[1]
    _require_arrays(specs[:n_required])
    library, _ = _library_and_dtype(specs)
    x_shape = _matrix_dims(x_name, x, x_labels)
    h_shape = _matrix_dims(h_name, h, h_labels)

    def origin():
        return (f"{', '.join(x_labels)} from {x_name} {tuple(x_shape)}, "
                f"H from {h_name} {tuple(h_shape)}")

    _check_shapes(specs, _sizes(x_shape, h_shape[1], n_gates), origin)
    return library


def _real(name, value):
    """A finite real attribute as a float: a Python or NumPy number, or a 0-d integer or
    float array (what a PyTorch or JAX scalar becomes on its way in). An integer beyond
    float64 (finite, but beyond every dtype) comes back as ±inf for the caller to judge."""
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


def cell_clip_value(cell_clip, dtype):
    """None, 0 or negative means no clipping (returned as None); otherwise a positive float.
    A clip beyond the largest finite number of the arrays' ``dtype`` can never act: None."""
    if cell_clip is None:
        return None
    value = _real("cell_clip", cell_clip)
    return value if 0 < value and not _beyond(value, dtype) else None


def clip_grad_value(clip_grad):
    if clip_grad not in CLIP_GRADS:
        raise ValueError(f"clip_grad must be one of {CLIP_GRADS}, got {clip_grad!r}")
    return clip_grad


def reset_after_value(reset_after):
    if not isinstance(reset_after, (bool, np.bool_)):
        raise TypeError(f"reset_after must be a bool, got {type(reset_after).__name__}")
    return bool(reset_after)


def peepholes_given(wci, wcf, wco):
    """True when all three peephole vectors are given, False when none is; else ValueError."""
    given = [name for name, v in (("wci", wci), ("wcf", wcf), ("wco", wco)) if v is not None]
    if given and len(given) != 3:
        missing = sorted({"wci", "wcf", "wco"} - set(given))
        raise ValueError(
            f"peepholes need all of wci, wcf and wco or none: got {', '.join(given)} "
            f"without {', '.join(missing)}")
    return bool(given)


def backend_for(backend, library):
    """The backend module serving arrays of ``library`` under the caller's ``backend``."""
    if backend is None:
        return _dispatch.backend_module(_dispatch.default_backend(library))
    if backend not in _dispatch.BACKENDS:
        raise ValueError(f"backend must be None or one of {_dispatch.BACKENDS}, got {backend!r}")
    wanted = _dispatch.backend_library(backend)
    if wanted is not None and wanted != library:
        caller = _interop.CALLER_LIBRARY.get()
        converted = f" (converted from the {caller} arrays passed)" if caller else ""
        raise ValueError(
            f"backend={backend!r} takes {wanted} arrays, got {library} arrays{converted}")
    return _dispatch.backend_module(backend)


def _result_specs(prefix, result, fields, labels):
    """Specs for a result tuple (a cell's ``state``, a sequence's ``seq``): one per field,
    ``labels[k]`` giving field k's shape."""
    if not isinstance(result, tuple) or len(result) != len(fields):
        raise TypeError(
            f"{prefix} must be a tuple of {len(fields)} arrays ({', '.join(fields)}), "
            f"got {type(result).__name__}"
            + (f" of length {len(result)}" if isinstance(result, tuple) else ""))
    return list(zip(_qualified_names(prefix, fields), result, labels))


@functools.cache
def _qualified_names(prefix, fields):
    """``("state.i", "state.cs", ...)``: built once, not on every call."""
    return tuple(f"{prefix}.{field}" for field in fields)


def _require_arrays(specs):
    for name, a, _ in specs:
        if a is None:
            raise TypeError(f"{name} must be an array, got None")


def lstm_cell_args(x, cs_prev, h_prev, w, b, wci, wcf, wco, *, grad=False, state=None,
                   d_h=None, d_cs=None, backend=None):
    """Check the arrays of ``lstm_cell`` (and of ``lstm_cell_grad`` when ``grad``);
    return the backend module."""
    required = [("x", x, ("B", "I")), ("cs_prev", cs_prev, ("B", "H")),
                ("h_prev", h_prev, ("B", "H")), ("w", w, ("I+H", "4H")), ("b", b, ("4H",))]
    if grad:
        required += _result_specs("state", state, LSTM_STATE_FIELDS, LSTM_STATE_LABELS)
    specs = required + [("wci", wci, ("H",)), ("wcf", wcf, ("H",)), ("wco", wco, ("H",)),
                        ("d_h", d_h, ("B", "H")), ("d_cs", d_cs, ("B", "H"))]
    library = _check_arrays(specs, len(required), 4)
    peepholes_given(wci, wcf, wco)
    return backend_for(backend, library)


def gru_cell_args(x, h_prev, w_ru, w_c, b_ru, b_c, *, reset_after, grad=False, state=None,
                  d_h=None, backend=None):
    """Check the arrays of ``gru_cell`` (and of ``gru_cell_grad`` when ``grad``);
    return the backend module."""
    specs = [("x", x, ("B", "I")), ("h_prev", h_prev, ("B", "H")),
             ("w_ru", w_ru, ("I+H", "2H")), ("w_c", w_c, ("I+H", "H")),
             ("b_ru", b_ru, ("2H",)), ("b_c", b_c, ("2H" if reset_after else "H",))]
    if grad:
        specs += _result_specs("state", state, GRU_STATE_FIELDS, GRU_STATE_LABELS)
    n_required = len(specs)
    specs.append(("d_h", d_h, ("B", "H")))
    return backend_for(backend, _check_arrays(specs, n_required, 2))


# --------------------------------------------------------------------------------------
# Sequences (SPEC 4)

def seq_len_value(seq_len, library, x):
    """Check ``seq_len``: None, or an integer array ``[B]`` of ``library`` (on ``x``'s device)
    with values in ``[0, T]``. Returns None when it is None or every row runs all T steps,
    else ``seq_len``.

    Reading the extremes of a CuPy array synchronises with the device once.
    """
    if seq_len is None:
        return None
    lib = _dispatch.library_of(seq_len)
    if lib is None or refused_subclass(seq_len):
        raise TypeError(
            f"seq_len must be a {library} integer array [B], got {type(seq_len).__name__}")
    if lib != library:
        raise TypeError(
            f"seq_len must come from the same array library as x ({library}), got {lib}")
    if lib == "cupy" and seq_len.device.id != x.device.id:
        raise ValueError(f"seq_len is on CUDA device {seq_len.device.id} but x is on device "
                         f"{x.device.id}; pass arrays on one device")
    n_steps, n_batch = x.shape[:2]
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


def lstm_sequence_args(x, cs0, h0, w, b, wci, wcf, wco, *, seq_len=None, grad=False,
                       seq=None, d_h=None, d_cs=None, d_h_final=None, d_cs_final=None,
                       backend=None):
    """Check the arrays of ``lstm_sequence`` (and of ``lstm_sequence_grad`` when ``grad``);
    return ``(backend module, seq_len)`` with ``seq_len`` normalised by ``seq_len_value``."""
    required = [("x", x, ("T", "B", "I")), ("cs0", cs0, ("B", "H")), ("h0", h0, ("B", "H")),
                ("w", w, ("I+H", "4H")), ("b", b, ("4H",))]
    if grad:
        required += _result_specs("seq", seq, LSTM_SEQUENCE_FIELDS, LSTM_SEQUENCE_LABELS)
    specs = required + [("wci", wci, ("H",)), ("wcf", wcf, ("H",)), ("wco", wco, ("H",)),
                        ("d_h", d_h, ("T", "B", "H")), ("d_cs", d_cs, ("T", "B", "H")),
                        ("d_h_final", d_h_final, ("B", "H")),
                        ("d_cs_final", d_cs_final, ("B", "H"))]
    library = _check_arrays(specs, len(required), 4)
    peepholes_given(wci, wcf, wco)
    seq_len = seq_len_value(seq_len, library, x)
    return backend_for(backend, library), seq_len


def gru_sequence_args(x, h0, w_ru, w_c, b_ru, b_c, *, reset_after, seq_len=None, grad=False,
                      seq=None, d_h=None, d_h_final=None, backend=None):
    """Check the arrays of ``gru_sequence`` (and of ``gru_sequence_grad`` when ``grad``);
    return ``(backend module, seq_len)`` with ``seq_len`` normalised by ``seq_len_value``."""
    specs = [("x", x, ("T", "B", "I")), ("h0", h0, ("B", "H")),
             ("w_ru", w_ru, ("I+H", "2H")), ("w_c", w_c, ("I+H", "H")),
             ("b_ru", b_ru, ("2H",)), ("b_c", b_c, ("2H" if reset_after else "H",))]
    if grad:
        specs += _result_specs("seq", seq, GRU_SEQUENCE_FIELDS, GRU_SEQUENCE_LABELS)
    n_required = len(specs)
    specs += [("d_h", d_h, ("T", "B", "H")), ("d_h_final", d_h_final, ("B", "H"))]
    library = _check_arrays(specs, n_required, 2)
    seq_len = seq_len_value(seq_len, library, x)
    return backend_for(backend, library), seq_len
