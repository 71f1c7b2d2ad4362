"""The reference backend: every operation written once for any array namespace (NumPy or
CuPy), as plainly as the math allows. It is the teaching text and the oracle the fast
backends are tested against.

Each cell's reference lives in its folder (``gradcells.cells.<cell>.reference``, with the
building blocks every cell shares in ``gradcells._core.xpmath``); this module gathers them
under one name. Its operations take the backend contract's arguments
(``gradcells._core.types``): the arrays, a weight set and a settings record, validated and
normalised by the public layer. ``lstm_activations``,
``lstm_gate_grads``, ``clip_pass_mask``, ``layer_norm``, ``layer_norm_grad``,
``lstm_cell_candidate``, ``lstm_cell_norm_grad``, ``lstm_gate_norm_grads``,
``gru_gate_grads``, ``rnn_activation``, ``rnn_preactivation_grad``, ``slstm_activations``
and ``slstm_step_grad`` are the reference's
own building blocks, which ``tf_compat`` and the notebooks also use.
"""

from ._core.xpmath import layer_norm, layer_norm_grad
from .cells.gru.reference import (
    gru_cell,
    gru_cell_grad,
    gru_cell_grad_jvp,
    gru_cell_jvp,
    gru_gate_grads,
    gru_sequence,
    gru_sequence_grad,
    gru_sequence_grad_jvp,
    gru_sequence_jvp,
)
from .cells.linear.reference import (
    linear_scan,
    linear_scan_grad,
    linear_scan_grad_jvp,
    linear_scan_jvp,
)
from .cells.lstm.reference import (
    clip_pass_mask,
    lstm_activations,
    lstm_cell,
    lstm_cell_candidate,
    lstm_cell_grad,
    lstm_cell_grad_jvp,
    lstm_cell_jvp,
    lstm_cell_norm_grad,
    lstm_gate_grads,
    lstm_gate_norm_grads,
    lstm_sequence,
    lstm_sequence_grad,
    lstm_sequence_grad_jvp,
    lstm_sequence_jvp,
)
from .cells.mingru.reference import (
    mingru_cell,
    mingru_cell_grad,
    mingru_cell_grad_jvp,
    mingru_cell_jvp,
    mingru_sequence,
    mingru_sequence_grad,
    mingru_sequence_grad_jvp,
    mingru_sequence_jvp,
)
from .cells.minlstm.reference import (
    minlstm_cell,
    minlstm_cell_grad,
    minlstm_cell_grad_jvp,
    minlstm_cell_jvp,
    minlstm_sequence,
    minlstm_sequence_grad,
    minlstm_sequence_grad_jvp,
    minlstm_sequence_jvp,
)
from .cells.rglru.reference import (
    rglru_cell,
    rglru_cell_grad,
    rglru_cell_grad_jvp,
    rglru_cell_jvp,
    rglru_sequence,
    rglru_sequence_grad,
    rglru_sequence_grad_jvp,
    rglru_sequence_jvp,
)
from .cells.rnn.reference import (
    rnn_activation,
    rnn_cell,
    rnn_cell_grad,
    rnn_cell_grad_jvp,
    rnn_cell_jvp,
    rnn_preactivation_grad,
    rnn_sequence,
    rnn_sequence_grad,
    rnn_sequence_grad_jvp,
    rnn_sequence_jvp,
)
from .cells.selective.reference import (
    selective_scan,
    selective_scan_grad,
    selective_scan_grad_jvp,
    selective_scan_jvp,
)
from .cells.slstm.reference import (
    slstm_activations,
    slstm_cell,
    slstm_cell_grad,
    slstm_cell_grad_jvp,
    slstm_cell_jvp,
    slstm_sequence,
    slstm_sequence_grad,
    slstm_sequence_grad_jvp,
    slstm_sequence_jvp,
    slstm_step_grad,
)

__all__ = ["lstm_cell", "lstm_cell_grad", "lstm_sequence", "lstm_sequence_grad",
           "gru_cell", "gru_cell_grad", "gru_sequence", "gru_sequence_grad",
           "rnn_cell", "rnn_cell_grad", "rnn_sequence", "rnn_sequence_grad",
           "rnn_activation", "rnn_preactivation_grad",
           "lstm_activations", "lstm_gate_grads", "clip_pass_mask", "gru_gate_grads",
           "layer_norm", "layer_norm_grad", "lstm_cell_candidate", "lstm_cell_norm_grad",
           "lstm_gate_norm_grads", "lstm_cell_jvp", "gru_cell_jvp", "rnn_cell_jvp",
           "lstm_sequence_jvp", "gru_sequence_jvp", "rnn_sequence_jvp",
           "lstm_cell_grad_jvp", "gru_cell_grad_jvp", "rnn_cell_grad_jvp",
           "lstm_sequence_grad_jvp", "gru_sequence_grad_jvp", "rnn_sequence_grad_jvp",
           "mingru_cell", "mingru_cell_grad", "mingru_cell_jvp", "mingru_cell_grad_jvp",
           "mingru_sequence", "mingru_sequence_grad", "mingru_sequence_jvp",
           "mingru_sequence_grad_jvp",
           "slstm_cell", "slstm_cell_grad", "slstm_cell_jvp", "slstm_cell_grad_jvp",
           "slstm_sequence", "slstm_sequence_grad", "slstm_sequence_jvp",
           "slstm_sequence_grad_jvp", "slstm_activations", "slstm_step_grad",
           "minlstm_cell", "minlstm_cell_grad", "minlstm_cell_jvp", "minlstm_cell_grad_jvp",
           "minlstm_sequence", "minlstm_sequence_grad", "minlstm_sequence_jvp",
           "minlstm_sequence_grad_jvp",
           "linear_scan", "linear_scan_grad", "linear_scan_jvp", "linear_scan_grad_jvp",
           "rglru_cell", "rglru_cell_grad", "rglru_cell_jvp", "rglru_cell_grad_jvp",
           "rglru_sequence", "rglru_sequence_grad", "rglru_sequence_jvp",
           "rglru_sequence_grad_jvp",
           "selective_scan", "selective_scan_grad", "selective_scan_jvp",
           "selective_scan_grad_jvp"]
