"""gradcells under PyTorch's autograd (docs/spec.md §13).

``gradcells.torch.LSTM``, ``GRU``, ``RNN``: drop-in ``torch.nn`` modules on the stacks
(``gradcells.torch._modules``).

``gradcells.torch.<op>`` for the nine forward operations (``lstm_cell``, ``gru_cell``,
``rnn_cell``, ``lstm_sequence``, ``gru_sequence``, ``rnn_sequence``, ``lstm_stack``,
``gru_stack``, ``rnn_stack``): ``gc.<op>``'s signature and result on tensors, differentiable
in reverse mode (``backward``, second order included) and forward mode
(``torch.autograd.forward_ad``); under ``torch.compile`` they are the custom ops
``torch.ops.gradcells.<op>`` (``_library``). Importing this module imports PyTorch;
``import gradcells`` does not.
"""

from ._functions import FUNCTIONS
from ._modules import GRU, LSTM, RNN

lstm_cell = FUNCTIONS["lstm_cell"]
gru_cell = FUNCTIONS["gru_cell"]
rnn_cell = FUNCTIONS["rnn_cell"]
lstm_sequence = FUNCTIONS["lstm_sequence"]
gru_sequence = FUNCTIONS["gru_sequence"]
rnn_sequence = FUNCTIONS["rnn_sequence"]
lstm_stack = FUNCTIONS["lstm_stack"]
gru_stack = FUNCTIONS["gru_stack"]
rnn_stack = FUNCTIONS["rnn_stack"]

__all__ = ["lstm_cell", "gru_cell", "rnn_cell", "lstm_sequence", "gru_sequence",
           "rnn_sequence", "lstm_stack", "gru_stack", "rnn_stack", "LSTM", "GRU", "RNN"]
