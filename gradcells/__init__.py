"""gradcells: fused LSTM, GRU and plain RNN cells for NumPy and CuPy with hand-derived gradients,
checked against finite differences by a public oracle.

Importing gradcells imports NumPy only: the Numba backend compiles on first use, CuPy is
imported only when a CuPy array arrives, and TensorFlow/PyTorch/JAX are never imported here.
"""

import importlib

from ._core.types import (
    GRUCellGrads,
    GRUCellState,
    GRUSequence,
    GRUSequenceGrads,
    GRUSettings,
    GRUStack,
    GRUStackGrads,
    GRUWeights,
    LSTMCellGrads,
    LSTMCellState,
    LSTMNorm,
    LSTMSequence,
    LSTMSequenceGrads,
    LSTMSettings,
    LSTMStack,
    LSTMStackGrads,
    LSTMWeights,
    RNNCellGrads,
    RNNCellState,
    RNNSequence,
    RNNSequenceGrads,
    RNNSettings,
    RNNStack,
    RNNStackGrads,
    RNNWeights,
    StackSettings,
)
from .curvature import gauss_newton_vector_product, hessian_vector_product
from .oracle import (
    GradientCheckError,
    JVPReport,
    TaylorReport,
    VJPReport,
    check_jvp,
    check_vjp,
    taylor_test,
)
from .sequences import (
    gru_sequence,
    gru_sequence_grad,
    gru_sequence_grad_jvp,
    gru_sequence_jvp,
    lstm_sequence,
    lstm_sequence_grad,
    lstm_sequence_grad_jvp,
    lstm_sequence_jvp,
    rnn_sequence,
    rnn_sequence_grad,
    rnn_sequence_grad_jvp,
    rnn_sequence_jvp,
)
from .stacks import (
    gru_stack,
    gru_stack_grad,
    gru_stack_grad_jvp,
    gru_stack_jvp,
    lstm_stack,
    lstm_stack_grad,
    lstm_stack_grad_jvp,
    lstm_stack_jvp,
    rnn_stack,
    rnn_stack_grad,
    rnn_stack_grad_jvp,
    rnn_stack_jvp,
)
from .steps import (
    gru_cell,
    gru_cell_grad,
    gru_cell_grad_jvp,
    gru_cell_jvp,
    lstm_cell,
    lstm_cell_grad,
    lstm_cell_grad_jvp,
    lstm_cell_jvp,
    rnn_cell,
    rnn_cell_grad,
    rnn_cell_grad_jvp,
    rnn_cell_jvp,
)

__version__ = "0.2.0.dev0"

_SUBMODULES = ("tf_compat", "layouts", "testing", "reference", "audit")

__all__ = [
    "lstm_cell", "lstm_cell_grad", "gru_cell", "gru_cell_grad",
    "lstm_sequence", "lstm_sequence_grad", "gru_sequence", "gru_sequence_grad",
    "rnn_cell", "rnn_cell_grad", "rnn_sequence", "rnn_sequence_grad",
    "lstm_stack", "lstm_stack_grad", "gru_stack", "gru_stack_grad", "rnn_stack",
    "rnn_stack_grad",
    "lstm_cell_jvp", "gru_cell_jvp", "rnn_cell_jvp", "lstm_sequence_jvp", "gru_sequence_jvp",
    "rnn_sequence_jvp", "lstm_stack_jvp", "gru_stack_jvp", "rnn_stack_jvp",
    "lstm_cell_grad_jvp", "gru_cell_grad_jvp", "rnn_cell_grad_jvp", "lstm_sequence_grad_jvp",
    "gru_sequence_grad_jvp", "rnn_sequence_grad_jvp", "lstm_stack_grad_jvp",
    "gru_stack_grad_jvp", "rnn_stack_grad_jvp", "hessian_vector_product",
    "gauss_newton_vector_product",
    "LSTMCellState", "LSTMCellGrads", "GRUCellState", "GRUCellGrads",
    "LSTMSequence", "LSTMSequenceGrads", "GRUSequence", "GRUSequenceGrads",
    "RNNCellState", "RNNCellGrads", "RNNSequence", "RNNSequenceGrads",
    "LSTMWeights", "LSTMNorm", "GRUWeights", "RNNWeights",
    "LSTMSettings", "GRUSettings", "RNNSettings", "StackSettings",
    "LSTMStack", "LSTMStackGrads", "GRUStack", "GRUStackGrads", "RNNStack", "RNNStackGrads",
    "check_vjp", "VJPReport", "check_jvp", "JVPReport", "taylor_test", "TaylorReport",
    "GradientCheckError",
    "tf_compat", "layouts", "testing",
]


def __getattr__(name):
    # Submodules that are public but not needed at import time.
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
