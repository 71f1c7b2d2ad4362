"""Mamba's selective scan's declarations (docs/spec.md §18.4): its types, its settings and its
public functions' contracts; its math is ``reference.py``, its kernels ``cpu.py`` (with
``_cpu_kernels.py``) and ``gpu.py`` (with ``selective.cu``).

Like the linear scan it is no cell: no input ``x``, no weights, no step op and no stack. Its
arrays are in Mamba's layout (``selective_scan_ref``'s): ``u, delta, z: [Bt, Dm, L]``, ``A:
[Dm, N]``, ``B, C: [Bt, N, L]`` or grouped ``[Bt, G, N, L]``, ``D, delta_bias: [Dm]``; the
state is ``[Bt, Dm, N]`` and starts at zero. It is registered apart from the cells
(``gradcells.cells.SCANS``); the public functions are ``gradcells.scans``'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.specs import Labels, OpSpec
from ..._core.types import Array, Recorded

__all__ = ["SelectiveScanSettings", "SelectiveScan", "SelectiveScanGrads"]
"""The op's public types (``gradcells`` exports them)."""

ARRAYS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
"""The op's array arguments in signature order (the last three optional)."""

OPTIONAL = ("D", "z", "delta_bias")
"""The array arguments a call may leave out (None)."""


@dataclass(frozen=True, eq=False)
class SelectiveScanSettings:
    """What a selective scan was computed with: ``delta_softplus`` (Δ = softplus(delta +
    delta_bias), else delta + delta_bias), ``reverse`` (time runs from L-1 down to 0) and
    ``return_last_state`` (the result's ``last_state`` is computed, else None)."""

    delta_softplus: bool = False
    reverse: bool = False
    return_last_state: bool = False


class _SelectiveScan(NamedTuple):
    y: Array
    last_state: Array | None


class SelectiveScan(Recorded, _SelectiveScan):
    """The output ``y [Bt, Dm, L]`` (after the gate ``silu(z)`` when ``z`` is given) and the
    state after the last step run, ``last_state [Bt, Dm, N]`` (None unless the forward was
    asked for it with ``return_last_state``; Mamba's ``selective_scan_fn`` returns it the
    same way)."""


class SelectiveScanWeights(NamedTuple):
    """No weights of its own (an empty set: what ``OpSpec`` reads)."""


class SelectiveScanGrads(NamedTuple):
    """Gradient of the loss with respect to every array argument of ``selective_scan``, in
    its shape (None for an optional argument the forward was not given)."""

    u: Array
    delta: Array
    A: Array
    B: Array
    C: Array
    D: Array | None
    z: Array | None
    delta_bias: Array | None


class SelectiveScanBackend(Protocol):
    def selective_scan(self, u, delta, A, B, C, D, z, delta_bias,
                       settings: SelectiveScanSettings) -> SelectiveScan: ...

    def selective_scan_grad(self, u, delta, A, B, C, D, z, delta_bias, result: SelectiveScan,
                            settings: SelectiveScanSettings, *, d_y=None, d_last_state=None
                            ) -> SelectiveScanGrads: ...

    def selective_scan_jvp(self, u, delta, A, B, C, D, z, delta_bias,
                           tangents: SelectiveScanGrads, settings: SelectiveScanSettings
                           ) -> tuple[SelectiveScan, SelectiveScan]: ...

    def selective_scan_grad_jvp(self, u, delta, A, B, C, D, z, delta_bias,
                                result: SelectiveScan, tangents: SelectiveScanGrads,
                                settings: SelectiveScanSettings, *, d_y=None,
                                d_last_state=None, d_y_tangent=None,
                                d_last_state_tangent=None
                                ) -> tuple[SelectiveScanGrads, SelectiveScanGrads]: ...


PER_STEP: Labels = ("B", "Dm", "T")
"""``u, delta, z`` and ``y``: ``[Bt, Dm, L]``."""

GROUPED: Labels = ("B", "G?", "N", "T")
"""``B`` and ``C``: ``[Bt, N, L]``, or grouped ``[Bt, G, N, L]`` (``G?`` an optional axis,
``gradcells._core.specs.shaped``)."""

LABELS: dict[str, Labels] = {
    "u": PER_STEP, "delta": PER_STEP, "z": PER_STEP, "A": ("Dm", "N"), "B": GROUPED,
    "C": GROUPED, "D": ("Dm",), "delta_bias": ("Dm",), "y": PER_STEP,
    "last_state": ("B", "Dm", "N")}
"""Each array's shape labels, in Mamba's layout (``B`` the batch ``Bt``, ``Dm`` the
channels, ``N`` the state size, ``T`` the steps ``L``): the inputs, the result's fields
(their upstreams alike). ``A``, ``D`` and ``delta_bias`` have no batch axis: the weights'
part (a dask call gives them whole to every block and sums their gradients)."""

SCAN = OpSpec("selective_scan", True, (), SelectiveScanWeights, SelectiveScanSettings,
              SelectiveScan, SelectiveScanGrads, ("d_y", "d_last_state"),
              inputs=ARRAYS, result_name="result", labels=LABELS,
              optional_results={"last_state": "return_last_state"})
"""The op as the registry reads it; its arrays are not time-major, so it declares their
labels (``LABELS``), which the adapters that read ``OpSpec``'s labels (``gradcells._dask``,
``gradcells.jax``) read."""

OPS = (SCAN.name,)
"""The forward operations (each with ``_grad``, ``_jvp`` and ``_grad_jvp``)."""
