"""Choosing the backend for a call: the only place that knows the backends' names.

By array type (NumPy arrays run on ``cpu``, CuPy arrays on ``gpu``) or by the caller's
``backend=``; a backend package is imported on its first use, so a NumPy-only program never
imports CuPy. Each backend package has one module per cell (``gradcells._core.specs.CELLS``)
and re-exports their operations.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from . import _interop

BACKENDS = ("reference", "cpu", "gpu")

# Which backend serves an array library when the caller passes ``backend=None``.
_DEFAULT_BACKEND = {"numpy": "cpu", "cupy": "gpu"}
# Which array library each accelerated backend accepts.
_BACKEND_LIBRARY = {"cpu": "numpy", "gpu": "cupy"}

_loaded: dict[str, ModuleType] = {}


def backend_module(name: str) -> ModuleType:
    """Import (once) and return ``gradcells.<name>``; ``name`` is one of ``BACKENDS``."""
    module = _loaded.get(name)
    if module is None:
        module = importlib.import_module(f"gradcells.{name}")
        _loaded[name] = module
    return module


def default_backend(library: str) -> str:
    """The backend that serves arrays of ``library`` ("numpy" or "cupy") by default."""
    return _DEFAULT_BACKEND[library]


def backend_library(name: str) -> str | None:
    """The one array library an accelerated backend accepts (None: any)."""
    return _BACKEND_LIBRARY.get(name)


def backend_for(backend: str | None, library: str) -> ModuleType:
    """The backend module serving arrays of ``library`` under the caller's ``backend``;
    ``ValueError`` for an unknown backend or one that cannot take those arrays. Every
    backend runs every operation (``gradcells._core.types``' protocol), forward mode and
    second order included."""
    if backend is None:
        return backend_module(default_backend(library))
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {BACKENDS}, got {backend!r}")
    wanted = backend_library(backend)
    if wanted is not None and wanted != library:
        caller = _interop.CALLER_LIBRARY.get()
        converted = f" (converted from the {caller} arrays passed)" if caller else ""
        raise ValueError(
            f"backend={backend!r} takes {wanted} arrays, got {library} arrays{converted}")
    return backend_module(backend)
