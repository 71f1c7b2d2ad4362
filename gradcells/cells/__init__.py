"""The cells, one folder each: the unit of the code (docs/design.md, "Adding a cell").

A cell's folder holds everything that is that cell's and nothing else: ``spec.py`` (its
types, keywords, shapes and public functions' contracts: one ``CellSpec``),
``reference.py`` (its math for any array namespace, all four modes: the teaching text),
``cpu.py`` with ``_cpu_kernels.py`` (Numba around BLAS) and ``gpu.py`` with its ``.cu``
file (CuPy around cuBLAS), each with the backend contract's operations for the forward, the
gradient, forward mode (``_jvp``) and second order (``_grad_jvp``) side by side. What every
cell uses (the time loops, lengths, direction, masks, scratch, launches) lives in the
backend machinery (``gradcells.cpu``, ``gradcells.gpu``) and ``gradcells._core``, never in
a cell's folder.

This package is the registry: ``CELLS`` is the one line a new cell adds; everything else
here is read from the cells' specs. ``implementation(cell, backend)`` is the one way to a
cell's operations on a backend. It imports the specs (types and data) but no backend until
one is asked for, so a NumPy-only program never imports CuPy and compiles only the cells it
calls.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .._core.specs import CellSpec, Labels, OpSpec

CELLS: tuple[str, ...] = ("lstm", "gru", "rnn", "mingru", "slstm", "minlstm", "rglru")
"""The registered cells, by folder name: the one line a new cell adds to the library."""

SCANS: tuple[str, ...] = ("linear", "selective")
"""Operations registered apart from the cells, by folder name: the linear scan
(docs/spec.md §18.1) has no input ``x``, no weights, no step op and no stack, which every
``CellSpec`` declares. Its folder has the cells' shape (``spec.py``, ``reference.py``,
``cpu.py``, ``gpu.py``) and its backends are reached the same way (``cell_of``,
``implementation``); its public functions are ``gradcells.scans``'. Mamba's selective scan
(§18.4) likewise, in Mamba's ``[Bt, Dm, L]`` layout."""

SPECS: dict[str, CellSpec] = {
    cell: importlib.import_module(f"{__name__}.{cell}.spec").CELL for cell in CELLS}
"""Each cell's declarations (``gradcells.cells.<cell>.spec.CELL``)."""

SCAN_SPECS: dict[str, OpSpec] = {
    op.name: op for op in (importlib.import_module(f"{__name__}.{scan}.spec").SCAN
                           for scan in SCANS)}
"""The forward operations of ``SCANS`` (``linear_scan``) by name, each with its three modes:
an ``OpSpec`` whose per-step arrays are its ``inputs`` (the adapters read it)."""

SCAN_OPS: tuple[str, ...] = tuple(SCAN_SPECS)
"""Their names."""

BACKENDS: tuple[str, ...] = ("reference", "cpu", "gpu")
"""Every cell has one module per backend, named after it."""

OPS: dict[str, OpSpec] = {op.name: op for spec in SPECS.values() for op in spec.ops}
"""Every forward operation by name; each has a gradient ``<name>_grad``."""

STACKS: dict[str, str] = {spec.stack_name: spec.sequence.name for spec in SPECS.values()}
"""The stacks (docs/spec.md §11.4), each with the sequence operation it composes: a backend
runs a stack when it has that operation."""

WEIGHT_LABELS: dict[type, dict[str, Labels]] = {
    spec.cell.weights: dict(spec.weight_labels) for spec in SPECS.values()}
"""The shape labels of every weight, by weight set and name."""

OPTIONAL_WEIGHTS: tuple[str, ...] = tuple(dict.fromkeys(
    name for spec in SPECS.values() for op in spec.ops[:1]
    for name in (*spec.optional_weights,
                 *(f"{name}.{f}" for name, kind in op.nested.items() for f in kind._fields))))
"""The weights a call may leave out (None), each nested one's arrays too (the LSTM's
peepholes, projection and layer norm, ``layer_norm.gamma_x``, ...)."""

CELL_PROTOCOLS: dict[str, type] = {cell: spec.protocol for cell, spec in SPECS.items()}
"""Which backend contract each cell's modules follow."""


def cell_of(operation: str) -> str:
    """The registered cell whose operation ``operation`` is (``"gru_sequence_jvp"`` ->
    ``"gru"``); ``AttributeError`` for a name that is no cell's."""
    for cell in (*CELLS, *SCANS):
        if operation.startswith(f"{cell}_"):
            return cell
    raise AttributeError(f"{operation!r} is not an operation of a registered cell {CELLS}")


def implementation(cell: str, backend: str) -> ModuleType:
    """``gradcells.cells.<cell>.<backend>``: one cell's operations on one backend, imported
    on first use."""
    return importlib.import_module(f"{__name__}.{cell}.{backend}")
