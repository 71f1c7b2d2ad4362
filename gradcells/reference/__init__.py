"""The reference backend: every operation written once for any array namespace (NumPy or
CuPy), as plainly as the math allows. It is the teaching text and the oracle the fast
backends are tested against.

A backend is a module with the eight public operations' names and signatures (``lstm_cell``
... ``gru_sequence_grad``); the public layer has validated and normalised every argument
before calling it (``cell_clip`` is None or > 0, ``forget_bias`` a Python float, optional
arrays None or of the right shape and dtype). ``lstm_activations`` and the gate-gradient
helpers exported here are the reference's own building blocks, which ``tf_compat`` and the
notebooks also use.
"""

from .gru import gru_cell, gru_cell_grad, gru_gate_grads
from .lstm import lstm_activations, lstm_cell, lstm_cell_grad, lstm_gate_grads
from .sequences import gru_sequence, gru_sequence_grad, lstm_sequence, lstm_sequence_grad

__all__ = ["lstm_cell", "lstm_cell_grad", "lstm_gate_grads", "gru_cell", "gru_cell_grad",
           "gru_gate_grads", "lstm_activations",
           "lstm_sequence", "lstm_sequence_grad", "gru_sequence", "gru_sequence_grad"]
