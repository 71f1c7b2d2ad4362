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


def backend_for(backend: str | None, library: str, *, masks: bool = False,
                op: str | None = None) -> ModuleType:
    """The backend module serving arrays of ``library`` under the caller's ``backend``;
    ``ValueError`` for an unknown backend or one that cannot take those arrays. A call that
    needs what not every backend has, sequence masks (docs/spec.md §11.3, a backend
    package's ``SEQUENCE_MASKS``) or the operation ``op`` (such as the forward-mode ops,
    §12), goes to a backend that has it: by default the library's own when it does, else
    the reference."""
    if masks or op is not None:
        return _capable_backend(backend, library, masks, op)
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


def _capable_backend(backend, library, masks, op):
    """The backend of a call with masks or of the operation ``op``: the one asked for if it
    has what the call needs, the library's default when none is asked for and it has it,
    else the reference."""
    if backend is None:
        module = backend_module(default_backend(library))
        return backend_module("reference") if _lacking(module, masks, op) else module
    module = backend_for(backend, library)
    lacking = _lacking(module, masks, op)
    if lacking:
        raise ValueError(f"backend={backend!r} does not run {' with '.join(lacking)} yet: "
                         "leave backend out, or pass backend='reference'")
    return module


def _lacking(module, masks, op):
    """What of ``op`` and the sequence masks the backend ``module`` does not run."""
    return [what for what, missing in (
        (op, op is not None and not hasattr(module, op)),
        ("the sequence masks (docs/spec.md §11.3)",
         masks and not getattr(module, "SEQUENCE_MASKS", False))) if missing]
