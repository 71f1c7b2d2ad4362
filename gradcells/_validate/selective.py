"""The selective scan's calls checked (docs/spec.md §18.4, §10, §16.3): ``selective_args``
and ``selective_grad_args`` return the arrays' library and the call's
``SelectiveScanSettings``; ``selective_tangents`` and ``selective_upstream_tangents`` check
forward-mode and second-order tangents. Checks only: nothing here computes or copies an
array.

Every array is of ``u``'s library and dtype (float32 or float64): ``u, delta, z [Bt, Dm,
L]``, ``A [Dm, N]``, ``B, C [Bt, N, L]`` or ``[Bt, G, N, L]`` with G dividing Dm (each its
own G), ``D, delta_bias [Dm]``. Every error names its argument.
"""

from __future__ import annotations

import numpy as np

from .._core import arrays
from ..cells.selective.spec import (
    ARRAYS,
    SelectiveScan,
    SelectiveScanGrads,
    SelectiveScanSettings,
)
from .arrays import array_library
from .settings import bool_value

DTYPES = tuple(map(np.dtype, (np.float32, np.float64)))
"""The dtypes every array of a call shares."""


def _check_like(name, value, shape, dtype, library, device=None):
    """``value``: an array of ``library``, ``dtype`` and ``shape`` (TypeError or ValueError
    naming ``name``)."""
    lib = array_library(name, value)
    if lib != library:
        raise TypeError(arrays.two_libraries("u", library, name, lib))
    if device is not None and value.device.id != device:
        raise ValueError(f"{name} is on CUDA device {value.device.id} but u is on device "
                         f"{device}; pass arrays on one device")
    if value.dtype != dtype:
        raise TypeError(f"{name} must have u's dtype ({dtype}), got {value.dtype}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")


def _grouped_shape(name, M, batch, channels, n_steps, n_state):
    """The shape ``B`` or ``C`` must have: ``[Bt, N, L]``, or ``[Bt, G, N, L]`` with G
    dividing Dm."""
    ndim = getattr(M, "ndim", None)
    if ndim == 3:
        return (batch, n_state, n_steps)
    if ndim == 4:
        groups = M.shape[1]
        if groups < 1 or channels % groups:
            raise ValueError(f"{name} has {groups} groups ([Bt, G, N, L]), which must divide "
                             f"Dm = {channels}")
        return (batch, groups, n_state, n_steps)
    raise ValueError(f"{name} must have rank 3 ([Bt, N, L]) or 4 ([Bt, G, N, L]), got shape "
                     f"{tuple(getattr(M, 'shape', ()))}")


def check_arrays(u, delta, A, B, C, D, z, delta_bias):
    """Check the forward's arrays (the module docstring). Returns the library."""
    library = array_library("u", u)
    if u.dtype not in DTYPES:
        raise TypeError(f"u must have dtype float32 or float64, got {u.dtype}")
    if u.ndim != 3:
        raise ValueError(f"u must have rank 3 ([Bt, Dm, L]), got shape {tuple(u.shape)}")
    array_library("A", A)
    if getattr(A, "ndim", None) != 2 or A.shape[0] != u.shape[1]:
        raise ValueError(f"A must have shape [Dm, N] with Dm = {u.shape[1]}, got "
                         f"{tuple(A.shape)}")
    batch, channels, n_steps = u.shape
    n_state = A.shape[1]
    device = u.device.id if library == "cupy" else None
    shapes = {"delta": u.shape, "A": A.shape, "z": u.shape, "D": (channels,),
              "delta_bias": (channels,)}
    for name, value in zip(ARRAYS[1:], (delta, A, B, C, D, z, delta_bias), strict=True):
        if value is None:
            if name in ("D", "z", "delta_bias"):
                continue
            raise TypeError(f"{name} must be an array, got None")
        array_library(name, value)
        shape = (shapes[name] if name in shapes
                 else _grouped_shape(name, value, batch, channels, n_steps, n_state))
        _check_like(name, value, shape, u.dtype, library, device)
    return library


def selective_args(u, delta, A, B, C, D, z, delta_bias, *, delta_softplus, reverse,
                   return_last_state):
    """Check a ``selective_scan`` call; return ``(library, settings)``."""
    settings = SelectiveScanSettings(
        delta_softplus=bool_value("delta_softplus", delta_softplus),
        reverse=bool_value("reverse", reverse),
        return_last_state=bool_value("return_last_state", return_last_state))
    return check_arrays(u, delta, A, B, C, D, z, delta_bias), settings


def _state_shape(u, A):
    return (u.shape[0], u.shape[1], A.shape[1])


def selective_grad_args(u, delta, A, B, C, D, z, delta_bias, result, upstream, *, given):
    """Check a ``selective_scan_grad`` call: ``result`` (a ``SelectiveScan``), ``upstream``
    (``d_y``, ``d_last_state``; None for zeros) and the settings ``given`` again (None: not
    given), each against the forward's record (``ValueError`` naming a contradiction); a
    result that records nothing takes them, with their defaults. ``d_last_state`` needs a
    forward that returned ``last_state``. Returns ``(library, settings, result)``."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError("result must be a SelectiveScan (y, last_state), got "
                        f"{type(result).__name__}")
    recorded = result.settings if type(result) is SelectiveScan else None
    keywords = {k: (getattr(recorded or SelectiveScanSettings, k) if v is None else v)
                for k, v in given.items()}
    if recorded is None and "return_last_state" not in given:
        keywords["return_last_state"] = result[1] is not None
    library, settings = selective_args(u, delta, A, B, C, D, z, delta_bias, **keywords)
    if recorded is not None:
        for name, value in given.items():
            if value is not None and getattr(settings, name) != getattr(recorded, name):
                raise ValueError(f"{name} contradicts the forward's record "
                                 f"({getattr(recorded, name)!r}), got {value!r}")
        settings = recorded
    result = SelectiveScan(*result) if type(result) is not SelectiveScan else result
    _check_like("result.y", result.y, u.shape, u.dtype, library)
    if result.last_state is not None:
        _check_like("result.last_state", result.last_state, _state_shape(u, A), u.dtype,
                    library)
    selective_upstream(upstream, u, A, settings, library)
    return library, settings, result


def selective_upstream(upstream, u, A, settings, library):
    """The upstream gradients or their tangents (``d_y[_tangent]``,
    ``d_last_state[_tangent]``) checked; a ``d_last_state`` needs ``return_last_state``."""
    for name, value in upstream.items():
        if value is None:
            continue
        if name.startswith("d_last_state"):
            if not settings.return_last_state:
                raise ValueError(f"{name} is given but the forward returned no last_state "
                                 "(return_last_state=False)")
            _check_like(name, value, _state_shape(u, A), u.dtype, library)
        else:
            _check_like(name, value, u.shape, u.dtype, library)


def selective_tangents(tangents, primals, library):
    """``tangents`` checked: None (all zero), or a ``SelectiveScanGrads`` (or an 8-tuple)
    whose fields are None or arrays of their primal's dtype and shape (a tangent of an
    absent optional array is a ``ValueError``). Returns a ``SelectiveScanGrads``."""
    if tangents is None:
        return SelectiveScanGrads(*([None] * len(ARRAYS)))
    if not isinstance(tangents, tuple) or len(tangents) != len(ARRAYS):
        raise TypeError("tangents must be a SelectiveScanGrads (u, delta, A, B, C, D, z, "
                        f"delta_bias), got {type(tangents).__name__}")
    tangents = SelectiveScanGrads(*tangents)
    for name, t, primal in zip(ARRAYS, tangents, primals, strict=True):
        if t is None:
            continue
        if primal is None:
            raise ValueError(f"tangents.{name} is given but {name} is None")
        _check_like(f"tangents.{name}", t, primal.shape, primal.dtype, library)
    return tangents
