"""The cells, one folder each: the unit of the code (docs/design.md, "Adding a cell").

A cell's folder holds everything that is that cell's and nothing else: ``reference.py`` (its
math for any array namespace, all four modes: the teaching text), ``cpu.py`` with
``_cpu_kernels.py`` (Numba around BLAS) and ``gpu.py`` with its ``.cu`` file (CuPy around
cuBLAS), each with the backend contract's operations for the forward, the gradient, forward
mode (``_jvp``) and second order (``_grad_jvp``) side by side. What every cell uses (the
time loops, lengths, direction, masks, scratch, launches) lives in the backend machinery
(``gradcells.cpu``, ``gradcells.gpu``) and ``gradcells._core``, never in a cell's folder.

This package is the registry: ``implementation(cell, backend)`` is the one way to a cell's
operations on a backend. It imports no cell until one is asked for, so a NumPy-only program
never imports CuPy and loads only the cells it calls.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .._core.specs import CELLS

BACKENDS: tuple[str, ...] = ("reference", "cpu", "gpu")
"""Every cell has one module per backend, named after it."""


def cell_of(operation: str) -> str:
    """The registered cell whose operation ``operation`` is (``"gru_sequence_jvp"`` ->
    ``"gru"``); ``AttributeError`` for a name that is no cell's."""
    for cell in CELLS:
        if operation.startswith(f"{cell}_"):
            return cell
    raise AttributeError(f"{operation!r} is not an operation of a registered cell {CELLS}")


def implementation(cell: str, backend: str) -> ModuleType:
    """``gradcells.cells.<cell>.<backend>``: one cell's operations on one backend, imported
    on first use."""
    return importlib.import_module(f"{__name__}.{cell}.{backend}")
