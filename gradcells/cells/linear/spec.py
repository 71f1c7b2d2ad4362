"""The linear scan's declarations (docs/spec.md §18.1): its types, its settings and its public
functions' contracts; its math is ``reference.py``, its kernels ``cpu.py`` and ``gpu.py``
(over the shared scans ``gradcells._core.scan``, ``gradcells.cpu._scan``,
``gradcells/gpu/scan.cu``).

Unlike a cell, the linear scan has no input ``x`` and no weights: its per-step arrays are the
multipliers ``a`` and the addends ``b``, its state ``h0``, and it has no step op and no stack
of its own. It is registered apart from the cells (``gradcells.cells.SCANS``): the backends
reach it through the registry (``implementation``), the public functions are
``gradcells.scans``'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.scan import PARALLEL_FROM_STEPS, scan_method  # noqa: F401 (the op's names)
from ..._core.specs import OpSpec
from ..._core.types import Array, Recorded

__all__ = ["LinearScanSettings", "LinearScan", "LinearScanGrads"]
"""The op's public types (``gradcells`` exports them)."""


@dataclass(frozen=True, eq=False)
class LinearScanSettings:
    """What a linear scan was computed with: ``method`` ("sequential", "parallel" or
    "auto"), ``seq_len``, ``reverse``, ``batch_first`` and ``resets`` (a ``[T, B]`` bool
    array, in the caller's layout, or None)."""

    method: str = "auto"
    seq_len: Array | None = None
    reverse: bool = False
    batch_first: bool = False
    resets: Array | None = None


class _LinearScan(NamedTuple):
    h: Array
    h_final: Array


class LinearScan(Recorded, _LinearScan):
    """Every step's state ``h [T, B, D]`` (zero past a row's length) and the final state
    ``h_final [B, D]``."""


class LinearScanWeights(NamedTuple):
    """The linear scan has no weights (an empty set: what ``OpSpec`` reads)."""


class LinearScanGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``linear_scan``: ``a`` (real when
    ``a`` is), ``b`` and ``h0``."""

    a: Array
    b: Array
    h0: Array


class LinearScanBackend(Protocol):
    def linear_scan(self, a, b, h0, settings: LinearScanSettings) -> LinearScan: ...

    def linear_scan_grad(self, a, b, h0, result: LinearScan, settings: LinearScanSettings, *,
                         d_h=None, d_h_final=None) -> LinearScanGrads: ...

    def linear_scan_jvp(self, a, b, h0, tangents: LinearScanGrads,
                        settings: LinearScanSettings) -> tuple[LinearScan, LinearScan]: ...

    def linear_scan_grad_jvp(self, a, b, h0, result: LinearScan, tangents: LinearScanGrads,
                             settings: LinearScanSettings, *, d_h=None, d_h_final=None,
                             d_h_tangent=None, d_h_final_tangent=None
                             ) -> tuple[LinearScanGrads, LinearScanGrads]: ...


SCAN = OpSpec("linear_scan", True, ("h0",), LinearScanWeights, LinearScanSettings, LinearScan,
              LinearScanGrads, ("d_h", "d_h_final"), inputs=("a", "b"),
              result_name="result", constants={"resets": ("T", "B")})
"""The op as the adapters read it (``gradcells._dask``): ``a``, ``b`` labelled as a
sequence's ``x`` (``[T, B, I]``, I = D), ``h0`` as its state, ``resets`` a per-step
constant."""

OPS = (SCAN.name,)
"""The forward operations (each with ``_grad``, ``_jvp`` and ``_grad_jvp``)."""

METHODS = ("auto", "sequential", "parallel")
"""How the recurrence runs: step by step, or as an associative scan over time; "auto"
chooses by the number of steps (``scan_method``)."""

PARALLEL_BOUND_ULPS = 4
"""The parallel method's bound against the sequential one (docs/spec.md §18.1): per element
``|h_parallel - h_sequential| <= PARALLEL_BOUND_ULPS · (log2 T + 2) · eps · |h|_abs``, where
``|h|_abs`` is the sequential scan run on ``|a|``, ``|b|``, ``|h0|`` (the same bound for
the gradients, on the adjoint's)."""
