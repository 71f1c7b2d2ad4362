"""TensorFlow's ``BlockLSTMV2`` layout (gate blocks i, f, ci, o). ``BlockLSTM``,
``LSTMBlockCell`` and ``GRUBlockCell`` use gradcells's own layouts: nothing to convert.
"""

from __future__ import annotations

import numpy as np

from .._core.types import Array
from ._common import LSTM_GRADCELLS, Converted, check_lstm, checked_arrays, lstm_converted, reorder

LSTM_TF_V2 = "ifco"      # BlockLSTMV2: i, f, ci, o


def lstm_from_tf_v2(w: Array, b: Array) -> Converted:
    """gradcells ``(w, b)`` from TensorFlow's ``BlockLSTMV2`` weights.

    ``BlockLSTMV2``: ``w [I+H, 4H]``, ``b [4H]``, gate blocks **i, f, ci, o** (``BlockLSTM``,
    ``LSTMBlockCell`` and gradcells use i, ci, f, o). ``BlockLSTMV2`` has no ``forget_bias``
    (it is 0) and defaults to ``cell_clip=0`` (none). Peephole vectors ``wci, wcf, wco`` mean
    the same in both and need no conversion.
    """
    a = checked_arrays(w=w, b=b)
    check_lstm(a["w"], a["b"])
    return lstm_converted((reorder(a["w"], LSTM_TF_V2, LSTM_GRADCELLS, axis=1),
                            reorder(a["b"], LSTM_TF_V2, LSTM_GRADCELLS, axis=0)), "tf_v2")


def lstm_to_tf_v2(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """``BlockLSTMV2``'s ``(w [I+H, 4H], b [4H])``, gate blocks i, f, ci, o, from gradcells
    ``(w, b)``."""
    a = checked_arrays(w=w, b=b)
    check_lstm(a["w"], a["b"])
    return (reorder(a["w"], LSTM_GRADCELLS, LSTM_TF_V2, axis=1),
            reorder(a["b"], LSTM_GRADCELLS, LSTM_TF_V2, axis=0))
