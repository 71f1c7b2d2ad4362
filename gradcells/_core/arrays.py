"""Array-library detection, once for the whole package.

An array is recognised by its type and ``sys.modules`` only, in the manner of
einops' ``_backends.py`` and array-api-compat: a library the caller has not imported is never
imported here, so a NumPy-only call never imports CuPy, PyTorch or JAX.
"""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np

from .dual import Dual

LIBRARIES = ("numpy", "cupy", "torch", "jax")
"""Every array library gradcells recognises; the backends compute on the first two."""
NATIVE = ("numpy", "cupy")
# The array type of each library, found in its (already imported) module.
_ARRAY_TYPE = {"cupy": ("cupy", "ndarray"), "torch": ("torch", "Tensor"), "jax": ("jax", "Array")}


def library_of(a) -> str | None:
    """The library ``a`` belongs to ("numpy", "cupy", "torch", "jax"), or None for anything
    that is not an array of one of them (a number, None, a list)."""
    if isinstance(a, np.ndarray):
        return "numpy"
    for library, (module_name, type_name) in _ARRAY_TYPE.items():
        module = sys.modules.get(module_name)
        if module is not None and isinstance(a, getattr(module, type_name)):
            return library
    return None


def is_dask(a) -> bool:
    """Whether ``a`` is a dask array (never importing dask: only when the caller has)."""
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(a, module.Array)


def namespace_of(a) -> ModuleType:
    """The array namespace (``numpy`` or ``cupy``) that owns ``a``, an array the backends
    compute on (a ``Dual``'s: ``gradcells._core.dual``'s namespace over its library)."""
    if isinstance(a, np.ndarray):
        return np
    if library_of(a) == "cupy":
        return sys.modules["cupy"]
    if isinstance(a, Dual):                     # forward mode over the reference
        return a.__array_namespace__()
    raise TypeError(f"expected a NumPy or CuPy array, got {type(a).__name__}")


def is_float(a) -> bool:
    """Whether ``a`` (an array of any recognised library) has a floating-point dtype,
    bfloat16 and the float8 types included."""
    dtype = getattr(a, "dtype", None)
    if dtype is None:
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return dtype.is_floating_point
    try:
        dtype = np.dtype(dtype)
    except TypeError:          # a dtype NumPy does not know
        return True
    # bfloat16 and the float8 types (ml_dtypes, JAX's) are floats NumPy files as kind "V"
    return dtype.kind == "f" or dtype.name.startswith(("bfloat16", "float8"))


def refused_subclass(a) -> bool:
    """``np.matrix`` (``*`` is a matmul) and ``np.ma.MaskedArray`` (the backends would
    ignore the mask) change what an array means; they are refused, not silently taken as
    plain arrays. A masked array can only exist once ``numpy.ma`` is imported."""
    masked = sys.modules.get("numpy.ma")
    return isinstance(a, np.matrix) or (masked is not None and isinstance(a, masked.MaskedArray))


def two_libraries(name_a, library_a, name_b, library_b) -> str:
    """The one message for float arrays of two libraries in one call, whichever argument
    comes first (the validation and the interop layer both raise it)."""
    return (f"{name_a} and {name_b} come from two array libraries ({library_a} and "
            f"{library_b}); pass arrays of one library")
