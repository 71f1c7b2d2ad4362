"""Choosing the backend for a call: the only place that knows the backends' names.

By array type (NumPy arrays run on ``cpu``, CuPy arrays on ``gpu``) or by the caller's
``backend=``. A backend is a ``Backend``: every registered cell's operations on it
(``gradcells.cells``), each cell's module imported on its first use, so a NumPy-only
program never imports CuPy.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _interop, cells
from .cells import BACKENDS

# Which backend serves an array library when the caller passes ``backend=None``.
_DEFAULT_BACKEND = {"numpy": "cpu", "cupy": "gpu"}
# Which array library each accelerated backend accepts.
_BACKEND_LIBRARY = {"cpu": "numpy", "gpu": "cupy"}



_SEQUENCES = tuple(op for op, spec in cells.OPS.items() if spec.sequence)
"""The sequence operations' names: each of their modes' names starts with one."""


class Backend:
    """One backend's operations over every registered cell: ``impl.lstm_cell`` is
    ``gradcells.cells.lstm.<name>.lstm_cell`` (the backend contract, ``_core.types``).
    ``NATIVE_REVERSE``: whether its machinery package (``gradcells.<name>``) runs
    ``reverse=True`` itself (``gradcells._order``); the machinery's ``around_sequences``,
    where it has one, wraps every mode of every sequence operation (the CPU's decides the
    BLAS threads of each call)."""

    def __init__(self, name: str):
        self.name = name
        machinery = importlib.import_module(f"gradcells.{name}")
        self.NATIVE_REVERSE: bool = getattr(machinery, "NATIVE_REVERSE", False)
        self._around_sequences = getattr(machinery, "around_sequences", None)

    def __getattr__(self, operation: str) -> Any:
        if operation.startswith("_"):
            raise AttributeError(operation)
        function = getattr(cells.implementation(cells.cell_of(operation), self.name), operation)
        if self._around_sequences is not None and operation.startswith(_SEQUENCES):
            function = self._around_sequences(function)   # the CPU's BLAS threads
        setattr(self, operation, function)       # found once
        return function

    def __repr__(self) -> str:
        return f"<gradcells backend {self.name!r}>"


_loaded: dict[str, Backend] = {}


def backend_module(name: str) -> Backend:
    """The ``Backend`` called ``name`` (one of ``BACKENDS``), made once."""
    backend = _loaded.get(name)
    if backend is None:
        backend = _loaded[name] = Backend(name)
    return backend


def default_backend(library: str) -> str:
    """The backend that serves arrays of ``library`` ("numpy" or "cupy") by default."""
    return _DEFAULT_BACKEND[library]


def backend_library(name: str) -> str | None:
    """The one array library an accelerated backend accepts (None: any)."""
    return _BACKEND_LIBRARY.get(name)


def backend_for(backend: str | None, library: str) -> Backend:
    """The backend module serving arrays of ``library`` under the caller's ``backend``;
    ``ValueError`` for an unknown backend or one that cannot take those arrays. Every
    backend runs every operation of every cell, forward mode and second order included."""
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
