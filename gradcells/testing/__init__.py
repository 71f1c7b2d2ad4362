"""Test tools for gradcells and for code built on it: case generators, Hypothesis strategies
for valid cell inputs, oracle pairs and ``vjp_check``, and the sequence loop over the public
cells that the sequence operations are tested against.

* ``cases``: ``lstm_cell_case``, ``gru_cell_case``, ``rnn_cell_case``,
  ``lstm_sequence_case``, ``gru_sequence_case``, ``rnn_sequence_case``, ``stack_case`` and
  their ``random_*`` variants, ``clip_levels``, ``on_library``;
* ``strategies``: ``lstm_cell_inputs``, ``gru_cell_inputs``, ``rnn_cell_inputs``,
  ``lstm_sequence_inputs``, ``gru_sequence_inputs``, ``rnn_sequence_inputs``
  (Hypothesis is imported only when a strategy is built);
* ``pairs``: ``(f, vjp, args, names)`` for the oracle (``stack_vjp_pair`` for the
  stacks), ``OPS`` and ``vjp_check``;
* ``unrolled``: ``lstm_forward``/``lstm_backprop``, ``gru_forward``/``gru_backprop``,
  ``rnn_forward``/``rnn_backprop``.

Every name is also available here, as ``gradcells.testing.<name>``.
"""

from . import cases, pairs, strategies, unrolled
from .cases import (
    CLIP_MARGIN,
    clip_away_from,
    clip_levels,
    gru_cell_case,
    gru_sequence_case,
    lstm_cell_case,
    lstm_sequence_case,
    mingru_cell_case,
    mingru_sequence_case,
    minlstm_cell_case,
    minlstm_sequence_case,
    on_library,
    ragged_lengths,
    random_gru_cell_case,
    random_gru_sequence_case,
    random_lstm_cell_case,
    random_lstm_sequence_case,
    random_mingru_cell_case,
    random_mingru_sequence_case,
    random_minlstm_cell_case,
    random_minlstm_sequence_case,
    random_rnn_cell_case,
    random_rnn_sequence_case,
    random_stack_case,
    rnn_cell_case,
    rnn_sequence_case,
    stack_case,
)
from .pairs import (
    GRU_ARG_NAMES,
    GRU_SEQUENCE_ARG_NAMES,
    GRU_SEQUENCE_OUTPUTS,
    LSTM_ARG_NAMES,
    LSTM_SEQUENCE_ARG_NAMES,
    LSTM_SEQUENCE_FIELDS,
    LSTM_SEQUENCE_OUTPUTS,
    MINGRU_ARG_NAMES,
    MINGRU_CELL_OUTPUTS,
    MINGRU_SEQUENCE_ARG_NAMES,
    MINGRU_SEQUENCE_OUTPUTS,
    MINLSTM_ARG_NAMES,
    MINLSTM_CELL_OUTPUTS,
    MINLSTM_SEQUENCE_ARG_NAMES,
    MINLSTM_SEQUENCE_OUTPUTS,
    OPS,
    RNN_ARG_NAMES,
    RNN_SEQUENCE_ARG_NAMES,
    RNN_SEQUENCE_OUTPUTS,
    grad_jvp_check,
    gru_cell_vjp_pair,
    gru_sequence_vjp_pair,
    jvp_check,
    lstm_cell_vjp_pair,
    lstm_sequence_vjp_pair,
    mingru_cell_vjp_pair,
    mingru_sequence_vjp_pair,
    minlstm_cell_vjp_pair,
    minlstm_sequence_vjp_pair,
    rnn_cell_vjp_pair,
    rnn_sequence_vjp_pair,
    stack_vjp_pair,
    vjp_check,
)
from .strategies import (
    gru_cell_inputs,
    gru_sequence_inputs,
    lstm_cell_inputs,
    lstm_sequence_inputs,
    mingru_cell_inputs,
    mingru_sequence_inputs,
    minlstm_cell_inputs,
    minlstm_sequence_inputs,
    rnn_cell_inputs,
    rnn_sequence_inputs,
)
from .unrolled import (
    gru_backprop,
    gru_forward,
    lstm_backprop,
    lstm_forward,
    rnn_backprop,
    rnn_forward,
)

__all__ = [
    "cases", "pairs", "strategies", "unrolled",
    "CLIP_MARGIN", "clip_away_from", "clip_levels", "on_library", "ragged_lengths",
    "lstm_cell_case", "gru_cell_case", "lstm_sequence_case", "gru_sequence_case",
    "random_lstm_cell_case", "random_gru_cell_case", "random_lstm_sequence_case",
    "random_gru_sequence_case", "rnn_cell_case", "rnn_sequence_case", "random_rnn_cell_case",
    "random_rnn_sequence_case", "stack_case", "random_stack_case", "stack_vjp_pair",
    "LSTM_ARG_NAMES", "GRU_ARG_NAMES", "LSTM_SEQUENCE_ARG_NAMES", "GRU_SEQUENCE_ARG_NAMES",
    "RNN_ARG_NAMES", "RNN_SEQUENCE_ARG_NAMES",
    "LSTM_SEQUENCE_OUTPUTS", "LSTM_SEQUENCE_FIELDS", "GRU_SEQUENCE_OUTPUTS",
    "RNN_SEQUENCE_OUTPUTS", "OPS",
    "lstm_cell_vjp_pair", "gru_cell_vjp_pair", "lstm_sequence_vjp_pair",
    "gru_sequence_vjp_pair", "rnn_cell_vjp_pair", "rnn_sequence_vjp_pair", "vjp_check",
    "jvp_check", "grad_jvp_check",
    "lstm_cell_inputs", "gru_cell_inputs", "lstm_sequence_inputs", "gru_sequence_inputs",
    "rnn_cell_inputs", "rnn_sequence_inputs",
    "lstm_forward", "lstm_backprop", "gru_forward", "gru_backprop", "rnn_forward",
    "rnn_backprop",
    "mingru_cell_case", "mingru_sequence_case", "random_mingru_cell_case",
    "random_mingru_sequence_case", "MINGRU_ARG_NAMES", "MINGRU_SEQUENCE_ARG_NAMES",
    "MINGRU_CELL_OUTPUTS", "MINGRU_SEQUENCE_OUTPUTS", "mingru_cell_vjp_pair",
    "mingru_sequence_vjp_pair", "mingru_cell_inputs", "mingru_sequence_inputs",
    "minlstm_cell_case", "minlstm_sequence_case", "random_minlstm_cell_case",
    "random_minlstm_sequence_case", "MINLSTM_ARG_NAMES", "MINLSTM_SEQUENCE_ARG_NAMES",
    "MINLSTM_CELL_OUTPUTS", "MINLSTM_SEQUENCE_OUTPUTS", "minlstm_cell_vjp_pair",
    "minlstm_sequence_vjp_pair", "minlstm_cell_inputs", "minlstm_sequence_inputs",
]
