"""placeholder"""

from __future__ import annotations

from .reference import (
    minlstm_cell,
    minlstm_cell_grad,
    minlstm_cell_grad_jvp,
    minlstm_cell_jvp,
    minlstm_sequence,
    minlstm_sequence_grad,
    minlstm_sequence_grad_jvp,
    minlstm_sequence_jvp,
)

__all__ = ["minlstm_cell", "minlstm_cell_grad", "minlstm_cell_jvp", "minlstm_cell_grad_jvp",
           "minlstm_sequence", "minlstm_sequence_grad", "minlstm_sequence_jvp",
           "minlstm_sequence_grad_jvp"]
