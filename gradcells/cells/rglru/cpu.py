"""placeholder"""

from __future__ import annotations

from .reference import (
    rglru_cell,
    rglru_cell_grad,
    rglru_cell_grad_jvp,
    rglru_cell_jvp,
    rglru_sequence,
    rglru_sequence_grad,
    rglru_sequence_grad_jvp,
    rglru_sequence_jvp,
)

__all__ = ["rglru_cell", "rglru_cell_grad", "rglru_cell_jvp", "rglru_cell_grad_jvp",
           "rglru_sequence", "rglru_sequence_grad", "rglru_sequence_jvp",
           "rglru_sequence_grad_jvp"]
