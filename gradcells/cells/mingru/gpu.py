"""The minGRU on the GPU: for now the reference (``gradcells.cells.mingru.reference``, written
for any array namespace) run on CuPy arrays: whole-array CuPy operations, one cuBLAS product
for every step's gates, and the linear recurrence as the reference's sequential loop or its
parallel (Hillis-Steele) scan of ``⌈log2 T⌉`` whole-array rounds. No fused ``.cu`` kernels
yet: a per-(b, j) scan kernel and a block scan are the next step (docs/spec.md §18.2)."""

from __future__ import annotations

from .reference import (
    mingru_cell,
    mingru_cell_grad,
    mingru_cell_grad_jvp,
    mingru_cell_jvp,
    mingru_sequence,
    mingru_sequence_grad,
    mingru_sequence_grad_jvp,
    mingru_sequence_jvp,
)

__all__ = ["mingru_cell", "mingru_cell_grad", "mingru_cell_jvp", "mingru_cell_grad_jvp",
           "mingru_sequence", "mingru_sequence_grad", "mingru_sequence_jvp",
           "mingru_sequence_grad_jvp"]
