"""Array type -> array namespace and backend module.

Detection looks at ``type(a).__module__`` and ``sys.modules`` only, in the manner of einops'
``_backends.py``: a library the caller has not imported is never imported here, so a
NumPy-only call never imports CuPy.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import numpy as np

BACKENDS = ("reference", "cpu", "gpu")

# Which backend serves an array library when the caller passes ``backend=None``.
_DEFAULT_BACKEND = {"numpy": "cpu", "cupy": "gpu"}
# Which array library each accelerated backend accepts.
_BACKEND_LIBRARY = {"cpu": "numpy", "gpu": "cupy"}

_loaded: dict[str, ModuleType] = {}


def library_of(a) -> str | None:
    """Name of the array library ``a`` belongs to ("numpy", "cupy"), or None."""
    if isinstance(a, np.ndarray):
        return "numpy"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(a, cupy.ndarray):
        return "cupy"
    return None


def namespace_of(a) -> ModuleType:
    """The array namespace (``numpy`` or ``cupy``) that owns array ``a``."""
    if isinstance(a, np.ndarray):
        return np
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(a, cupy.ndarray):
        return cupy
    raise TypeError(f"expected a NumPy or CuPy array, got {type(a).__name__}")


def backend_module(name: str) -> ModuleType:
    """Import (once) and return ``gradcells.<name>``; ``name`` is already validated."""
    module = _loaded.get(name)
    if module is None:
        module = importlib.import_module(f"gradcells.{name}")
        _loaded[name] = module
    return module


def default_backend(library: str) -> str:
    return _DEFAULT_BACKEND[library]


def backend_library(name: str) -> str | None:
    """The one array library an accelerated backend accepts (None: any)."""
    return _BACKEND_LIBRARY.get(name)
