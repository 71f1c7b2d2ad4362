"""Weight converters between gradcells (TensorFlow's block layout) and other frameworks.

gradcells's layouts (docs/spec.md §2, §3):

* LSTM: ``w [I+H, 4H]`` (rows: the x part, then the h part), ``b [4H]``; gate blocks in the
  order **i, ci, f, o**. With a projection (§9.1) ``w [I+P, 4H]`` and ``w_proj [H, P]``;
  PyTorch's ``proj_size`` is the one framework here that has it (``weight_hr = w_projᵀ``),
  and ``lstm_from_torch`` carries ``w_proj`` in ``options``.
* plain RNN: ``w [I+H, H]``, ``b [H]`` (one block, so no gate order); the activation
  ("tanh" or "relu") is a setting of the framework's layer, not a weight.
* GRU: ``w_ru [I+H, 2H]`` (columns r then u), ``w_c [I+H, H]``, ``b_ru [2H]``, and ``b_c [H]``
  (reset before the candidate matmul, TensorFlow's ``GRUBlockCell``) or ``b_c [2H]`` =
  ``[b_cx, b_ch]`` (reset after, ``reset_after=True``: cuDNN, PyTorch, Keras' default).
  The update gate u is what PyTorch calls z and Keras and ONNX call z: ``h = u∘h_prev + (1-u)∘c``
  in all four.

Every function is named ``{lstm,gru,rnn}_{from,to}_<framework>``. ``lstm_from_X`` and
``rnn_from_X`` return ``(w, b)``; ``gru_from_X`` returns ``(w_ru, w_c, b_ru, b_c)``, each
as a ``Converted`` tuple that also carries the framework's conventions, the two things a
caller must not forget:

* ``converted.options``: the keywords that make gradcells's op compute the framework's
  forward: ``{"forget_bias": 0.0}`` for an LSTM (gradcells's default is TensorFlow's 1.0),
  ``{"reset_after": ...}`` for a GRU, ``{"activation": ...}`` for a plain RNN (from the
  ``nonlinearity`` / ``activation`` keyword the converter takes);
* ``converted.state_order`` and ``converted.gradcells_states(*states)``: the framework's
  order of the recurrent states, e.g. PyTorch's ``(h, c)`` against gradcells's ``(cs, h)``.

So ``gc.lstm_sequence(x, *conv.gradcells_states(h0, c0), *conv, **conv.options)`` runs
PyTorch's forward. ``..._to_X`` take the plain arrays and
return the framework's arrays in its own order, so that ``lstm_from_torch(*cell.parameters())``
and ``layer.set_weights(lstm_to_keras(w, b))`` work as written.

**The two-bias rule.** Where a framework has two biases for a gate (an input and a recurrent
one) and gradcells one, ``from`` sums them and ``to`` puts the sum in the first (input) bias
and zeros in the second. The reset-after GRU candidate is the exception that proves the rule:
its recurrent bias sits inside ``r∘(...)``, so it cannot be summed and gradcells keeps both
(``b_c [2H]``).

The converted weights reproduce the framework's forward with gradcells's ``forget_bias=0``
(none of these frameworks adds a constant to the forget gate at run time).

Inputs may be NumPy arrays or anything ``numpy.asarray`` takes; PyTorch tensors (even with
``requires_grad``) are detached and copied to the host first. Outputs are new, C-contiguous
NumPy arrays of the inputs' (common) float dtype; inputs are never modified. Shapes are
checked, and a mismatch raises ``ValueError`` naming the argument with the expected and
actual shape.

There is no ``gru_{from,to}_tf_v2``: TensorFlow has no second GRU block op (its
``GRUBlockCell`` already uses gradcells's layout, reset before), so there is nothing to convert.

* sLSTM (§19): ``w [I, 4H]``, ``r [N, H/N, 4H/N]``, ``b [4H]``, gate-major blocks i, f, z,
  o; ``slstm_{from,to}_xlstm`` convert xlstm's ``sLSTMCell`` parameters.
* RG-LRU (§18.3): ``w_a, w_x [N, H/N, H/N]``, ``b_a, b_x, lam [H]``;
  ``rglru_{from,to}_recurrentgemma`` convert recurrentgemma's ``RGLRU`` parameters.
* minGRU and minLSTM (§18.2): ``w [I, 2H]`` (gate, candidate) and ``[I, 3H]`` (f, i,
  candidate), ``b``; ``{mingru,minlstm}_{from,to}_mingru_pytorch`` convert minGRU-pytorch's
  bias-free layers.
* the selective scan (§18.4): ``A [Dm, N]``, ``D``, ``delta_bias [Dm]``;
  ``selective_{from,to}_mamba`` convert a ``Mamba`` block's ``A_log``, ``D`` and
  ``dt_proj.bias``.

One module per framework: ``torch``, ``keras``, ``onnx``, ``tensorflow`` (``BlockLSTMV2``),
``xlstm``, ``recurrentgemma``, ``mingru_pytorch``, ``mamba``,
what they share in ``_common``; every name of ``__all__`` is re-exported here.
"""

from ._common import Converted
from .keras import (
    gru_from_keras,
    gru_to_keras,
    lstm_from_keras,
    lstm_to_keras,
    rnn_from_keras,
    rnn_to_keras,
)
from .mamba import selective_from_mamba, selective_to_mamba
from .mingru_pytorch import (
    mingru_from_mingru_pytorch,
    mingru_to_mingru_pytorch,
    minlstm_from_mingru_pytorch,
    minlstm_to_mingru_pytorch,
)
from .onnx import (
    gru_from_onnx,
    gru_to_onnx,
    lstm_from_onnx,
    lstm_to_onnx,
    rnn_from_onnx,
    rnn_to_onnx,
)
from .recurrentgemma import rglru_from_recurrentgemma, rglru_to_recurrentgemma
from .tensorflow import lstm_from_tf_v2, lstm_to_tf_v2
from .torch import (
    ConvertedStack,
    gru_from_torch,
    gru_to_torch,
    lstm_from_torch,
    lstm_to_torch,
    rnn_from_torch,
    rnn_to_torch,
    stack_from_torch,
    stack_to_torch,
)
from .xlstm import slstm_from_xlstm, slstm_to_xlstm

__all__ = [
    "Converted",
    "lstm_from_torch", "lstm_to_torch", "lstm_from_keras", "lstm_to_keras",
    "lstm_from_onnx", "lstm_to_onnx", "lstm_from_tf_v2", "lstm_to_tf_v2",
    "gru_from_torch", "gru_to_torch", "gru_from_keras", "gru_to_keras",
    "gru_from_onnx", "gru_to_onnx",
    "rnn_from_torch", "rnn_to_torch", "rnn_from_keras", "rnn_to_keras",
    "rnn_from_onnx", "rnn_to_onnx",
    "ConvertedStack", "stack_from_torch", "stack_to_torch",
    "slstm_from_xlstm", "slstm_to_xlstm",
    "rglru_from_recurrentgemma", "rglru_to_recurrentgemma",
    "mingru_from_mingru_pytorch", "mingru_to_mingru_pytorch",
    "minlstm_from_mingru_pytorch", "minlstm_to_mingru_pytorch",
    "selective_from_mamba", "selective_to_mamba",
]



def __dir__():
    return __all__

