"""The results of every public operation, as NamedTuples.

Cell results hold ``[B, H]`` arrays; sequence results hold ``[T, B, H]`` arrays per step
plus ``[B, H]`` final states. Gradient tuples are named after the inputs they belong to
and hold ``None`` for inputs that were not given (peepholes off).
"""

from __future__ import annotations

from typing import Any, NamedTuple

Array = Any


class LSTMCellState(NamedTuple):
    """Outputs of one LSTM block cell step, all post-activation ``[B, H]``."""

    i: Array
    cs: Array
    f: Array
    o: Array
    ci: Array
    co: Array
    h: Array


class LSTMCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``lstm_cell``."""

    x: Array
    cs_prev: Array
    h_prev: Array
    w: Array
    b: Array
    wci: Array | None = None
    wcf: Array | None = None
    wco: Array | None = None


class GRUCellState(NamedTuple):
    """Outputs of one GRU block cell step, all ``[B, H]``."""

    r: Array
    u: Array
    c: Array
    h: Array


class GRUCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_cell``."""

    x: Array
    h_prev: Array
    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array


class LSTMSequence(NamedTuple):
    """Every step's LSTM outputs ``[T, B, H]`` and the final states ``[B, H]``."""

    i: Array
    cs: Array
    f: Array
    o: Array
    ci: Array
    co: Array
    h: Array
    cs_final: Array
    h_final: Array


class LSTMSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``lstm_sequence``."""

    x: Array
    cs0: Array
    h0: Array
    w: Array
    b: Array
    wci: Array | None = None
    wcf: Array | None = None
    wco: Array | None = None


class GRUSequence(NamedTuple):
    """Every step's GRU outputs ``[T, B, H]`` and the final state ``[B, H]``."""

    r: Array
    u: Array
    c: Array
    h: Array
    h_final: Array


class GRUSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_sequence``."""

    x: Array
    h0: Array
    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array
