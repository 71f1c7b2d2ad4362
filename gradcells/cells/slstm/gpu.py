"""xLSTM's sLSTM on the GPU (docs/spec.md §19). For now the reference's math on CuPy arrays
(``gradcells.cells.slstm.reference``, written for any array namespace): the fused CUDA
kernels are still to come."""

from __future__ import annotations

from .reference import (
    slstm_cell as slstm_cell,
)
from .reference import (
    slstm_cell_grad as slstm_cell_grad,
)
from .reference import (
    slstm_cell_grad_jvp as slstm_cell_grad_jvp,
)
from .reference import (
    slstm_cell_jvp as slstm_cell_jvp,
)
from .reference import (
    slstm_sequence as slstm_sequence,
)
from .reference import (
    slstm_sequence_grad as slstm_sequence_grad,
)
from .reference import (
    slstm_sequence_grad_jvp as slstm_sequence_grad_jvp,
)
from .reference import (
    slstm_sequence_jvp as slstm_sequence_jvp,
)
