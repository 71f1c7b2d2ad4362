"""gradcells under PyTorch's autograd (docs/spec.md §13).

``gradcells.torch.LSTM``, ``GRU``, ``RNN``: drop-in ``torch.nn`` modules on the stacks
(``gradcells.torch._modules``); ``sLSTM``: xLSTM's sLSTM on its sequence (``_slstm``);
``RGLRU``: recurrentgemma's RG-LRU layer on its sequence (``_rglru``); ``MinGRU``,
``MinLSTM``: minGRU-pytorch's ``minGRU`` and ``minLSTM`` layers on their sequences
(``_mingru``); ``Mamba``: mamba_ssm's Mamba block on ``selective_scan`` (``_mamba``).

``gradcells.torch.<op>`` for every registered cell's step, sequence and stack
(``lstm_cell``, ``gru_sequence``, ``rnn_stack``, ...; ``FUNCTIONS``) and for the scans
(``linear_scan``, real and complex: docs/spec.md §18.1; ``selective_scan``, Mamba's, in its
``[Bt, Dm, L]`` layout read from its spec's labels: §18.4): ``gc.<op>``'s
signature and result on tensors, differentiable in reverse mode (``backward``, second order
included) and forward mode (``torch.autograd.forward_ad``); under ``torch.compile`` they are
the custom ops ``torch.ops.gradcells.<op>`` (``_library``). Importing this module imports
PyTorch; ``import gradcells`` does not.
"""

from ._functions import FUNCTIONS
from ._mamba import Mamba
from ._mingru import MinGRU, MinLSTM
from ._modules import GRU, LSTM, RNN
from ._rglru import RGLRU
from ._slstm import sLSTM

globals().update(FUNCTIONS)

__all__ = [*FUNCTIONS, "LSTM", "GRU", "RNN", "sLSTM", "RGLRU", "MinGRU", "MinLSTM", "Mamba"]
