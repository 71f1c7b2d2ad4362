"""The linear scan's calls checked (docs/spec.md §18.1, §7, §10): ``scan_args`` and
``scan_grad_args`` return the arrays' library and the call's ``LinearScanSettings``;
``scan_tangents`` and ``scan_upstream_tangents`` check forward-mode and second-order
tangents. Checks only: nothing here computes or copies an array beyond the record's copies.

Dtypes: ``b`` and ``h0`` float32, float64, complex64 or complex128, one dtype; ``a`` the same
dtype, or, with a complex ``b``, its real counterpart (a real decay on a complex state).
"""

from __future__ import annotations

import numpy as np

from .._core import arrays
from ..cells.linear.spec import METHODS, LinearScan, LinearScanGrads, LinearScanSettings
from .arrays import array_library, refused_subclass
from .settings import bool_value, choice_value, recorded_copy, seq_len_value

STATE_DTYPES = tuple(map(np.dtype, (np.float32, np.float64, np.complex64, np.complex128)))
"""The dtypes of ``b``, ``h0`` and the states."""


def check_arrays(a, b, h0):
    """Check ``a``, ``b`` ``[T, B, D]`` and ``h0 [B, D]``: one library (one device), the
    dtypes of the module docstring, the shapes. Returns the library."""
    library = array_library("b", b)
    for name, v in (("a", a), ("h0", h0)):
        lib = array_library(name, v)
        if lib != library:
            raise TypeError(arrays.two_libraries("b", library, name, lib))
        if lib == "cupy" and v.device.id != b.device.id:
            raise ValueError(f"{name} is on CUDA device {v.device.id} but b is on device "
                             f"{b.device.id}; pass arrays on one device")
    if b.dtype not in STATE_DTYPES:
        raise TypeError(f"b must have dtype float32, float64, complex64 or complex128, got "
                        f"{b.dtype}")
    if h0.dtype != b.dtype:
        raise TypeError(f"h0 must have the same dtype as b ({b.dtype}), got {h0.dtype}")
    real = np.dtype(b.dtype.char.lower()) if b.dtype.kind == "c" else b.dtype
    if a.dtype not in (b.dtype, real):
        also = f" or {real}" if real != b.dtype else ""
        raise TypeError(f"a must have the dtype of b ({b.dtype}){also}, got {a.dtype}")
    if a.ndim != 3:
        raise ValueError(f"a must have rank 3 ([T, B, D]), got shape {tuple(a.shape)}")
    if tuple(b.shape) != tuple(a.shape):
        raise ValueError(f"b must have a's shape {tuple(a.shape)}, got {tuple(b.shape)}")
    return library


def _state_shape(a, batch_first):
    return (a.shape[0], a.shape[2]) if batch_first else (a.shape[1], a.shape[2])


def resets_value(resets, library, a, batch_first):
    """Check ``resets``: None, or a bool array of ``library`` shaped ``[T, B]`` (``[B, T]``
    with ``batch_first``). Returns the record's copy."""
    if resets is None:
        return None
    lib = arrays.library_of(resets)
    if lib != library or refused_subclass(resets):
        raise TypeError(f"resets must be a {library} bool array, got {type(resets).__name__}")
    if resets.dtype != np.bool_:
        raise TypeError(f"resets must have dtype bool, got {resets.dtype}")
    expected = tuple(a.shape[:2])
    if tuple(resets.shape) != expected:
        labels = "[B, T]" if batch_first else "[T, B]"
        raise ValueError(f"resets must have shape {labels} = {expected}, got "
                         f"{tuple(resets.shape)}")
    return recorded_copy(resets)


def scan_args(a, b, h0, *, seq_len, reverse, resets, batch_first, method):
    """Check a ``linear_scan`` call; return ``(library, settings)``."""
    method = choice_value("method", method, METHODS)
    reverse, batch_first = bool_value("reverse", reverse), bool_value("batch_first", batch_first)
    library = check_arrays(a, b, h0)
    if tuple(h0.shape) != _state_shape(a, batch_first):
        raise ValueError(f"h0 must have shape [B, D] = {_state_shape(a, batch_first)}, got "
                         f"{tuple(h0.shape)}")
    seq_len = recorded_copy(seq_len_value(seq_len, library, a, batch_first))
    return library, LinearScanSettings(method=method, seq_len=seq_len, reverse=reverse,
                                       batch_first=batch_first,
                                       resets=resets_value(resets, library, a, batch_first))


def _same(x, y):
    if x is None or y is None:
        return x is None and y is None
    return x.shape == y.shape and bool((x == y).all())


def scan_grad_args(a, b, h0, result, upstream, *, given):
    """Check a ``linear_scan_grad`` call: ``result`` (a ``LinearScan`` or a pair of arrays),
    ``upstream`` (``d_h``, ``d_h_final``, None for zeros) and the settings ``given`` again
    (None: not given), each against the forward's record (``ValueError`` naming a
    contradiction); a result that records nothing takes them, with their defaults. Returns
    ``(library, settings, result)``."""
    recorded = result.settings if type(result) is LinearScan else None
    keywords = {k: (getattr(recorded or LinearScanSettings, k, None) if v is None else v)
                for k, v in given.items()}
    library, settings = scan_args(a, b, h0, **keywords)
    if recorded is not None:
        for name, value in given.items():
            if value is None:
                continue
            mine, theirs = getattr(settings, name), getattr(recorded, name)
            same = _same(mine, theirs) if name in ("seq_len", "resets") else mine == theirs
            if not same:
                raise ValueError(f"{name} contradicts the forward's record ({theirs!r}), got "
                                 f"{value!r}")
        settings = recorded
    result = _checked_result(result, a, b, h0, library)
    for name, value in upstream.items():
        _check_like(name, value, getattr(result, name.removeprefix("d_")), library)
    return library, settings, result


def _checked_result(result, a, b, h0, library):
    """``result`` as a ``LinearScan``: two arrays of the states' dtype and shapes."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"result must be a LinearScan (h, h_final), got {type(result).__name__}")
    result = LinearScan(*result) if type(result) is not LinearScan else result
    dtype = np.result_type(a.dtype, b.dtype)
    for name, value in zip(LinearScan._fields, result, strict=True):
        array_library(f"result.{name}", value)
        if arrays.library_of(value) != library or value.dtype != dtype:
            raise TypeError(f"result.{name} must be a {library} array of dtype {dtype}, got "
                            f"{type(value).__name__} of {getattr(value, 'dtype', None)}")
    for name, like in (("h", b), ("h_final", h0)):
        if tuple(getattr(result, name).shape) != tuple(like.shape):
            raise ValueError(f"result.{name} must have shape {tuple(like.shape)}, got "
                             f"{tuple(getattr(result, name).shape)}")
    return result


def _check_like(name, value, like, library):
    """An upstream gradient (or tangent) ``name``: None, or an array of ``like``'s library,
    dtype and shape."""
    if value is None:
        return
    if array_library(name, value) != library:
        raise TypeError(arrays.two_libraries("b", library, name, arrays.library_of(value)))
    if value.dtype != like.dtype:
        raise TypeError(f"{name} must have dtype {like.dtype}, got {value.dtype}")
    if tuple(value.shape) != tuple(like.shape):
        raise ValueError(f"{name} must have shape {tuple(like.shape)}, got "
                         f"{tuple(value.shape)}")


def scan_tangents(tangents, a, b, h0, library):
    """``tangents`` checked: None (all zero), or a ``LinearScanGrads`` (or a triple) whose
    fields are None or arrays of their primal's dtype and shape. Returns a
    ``LinearScanGrads``."""
    if tangents is None:
        return LinearScanGrads(None, None, None)
    if not isinstance(tangents, tuple) or len(tangents) != 3:
        raise TypeError("tangents must be a LinearScanGrads (a, b, h0), got "
                        f"{type(tangents).__name__}")
    tangents = LinearScanGrads(*tangents)
    for name, t, primal in zip(LinearScanGrads._fields, tangents, (a, b, h0), strict=True):
        _check_like(f"tangents.{name}", t, primal, library)
    return tangents


def scan_upstream_tangents(result, given, library):
    """The upstream gradients' tangents (``d_h_tangent``, ``d_h_final_tangent``) checked
    against ``result``'s fields."""
    for name, value in given.items():
        field = name.removeprefix("d_").removesuffix("_tangent")
        _check_like(name, value, getattr(result, field), library)

