"""Every operation's arguments, spelled once: names, shape labels, result and gradient types.

The validation (``gradcells._validate``), the public signatures' checks, the test helpers and
the architecture test read these tables; nothing else writes an argument name as a literal
list. Shape labels: ``T`` steps, ``B`` batch, ``I`` input size, ``H`` cell size, ``P`` the
LSTM's recurrent width (its projection's, else H), ``I+H``, ``I+P``,
``2H``, ``4H``, and ``C`` for the GRU candidate bias (``H``, or ``2H`` reset-after).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .types import (
    GRUCellGrads,
    GRUCellState,
    GRUSequence,
    GRUSequenceGrads,
    GRUSettings,
    GRUWeights,
    LSTMCellGrads,
    LSTMCellState,
    LSTMNorm,
    LSTMSequence,
    LSTMSequenceGrads,
    LSTMSettings,
    LSTMWeights,
    RNNCellGrads,
    RNNCellState,
    RNNSequence,
    RNNSequenceGrads,
    RNNSettings,
    RNNWeights,
)

Labels = tuple[str, ...]

PEEPHOLES: tuple[str, ...] = LSTMWeights._fields[2:5]
"""The peephole vectors ``("wci", "wcf", "wco")``: all three or none."""

NORM_FIELDS: tuple[str, ...] = LSTMNorm._fields
"""The layer-normalised LSTM's parameters, fields of ``layer_norm`` (an ``LSTMNorm``)."""

NORM_ARRAYS: tuple[str, ...] = tuple(f"layer_norm.{name}" for name in NORM_FIELDS)
"""Their names as arrays of a call: ``layer_norm.gamma_x``, ..."""

OPTIONAL_WEIGHTS: tuple[str, ...] = LSTMWeights._fields[2:] + NORM_ARRAYS
"""The weights a call may leave out (None): the peepholes, the LSTM's projection and its
layer norm (``layer_norm``, whose six arrays are then absent too)."""

LN_CARRIES = ("raw", "normalized")
"""Which cell state a layer-normalised LSTM carries: ``c̃`` (Ba et al.) or ``LN(c̃)`` (TF
Addons)."""

CLIP_GRADS = ("exact", "straight_through")
"""How a gradient passes an active clip: zero (the true gradient) or unchanged (TF's)."""

ACTIVATIONS = ("tanh", "relu")
"""The plain RNN cell's activations."""

# The shape labels of every weight, by weight set and name.
WEIGHT_LABELS: dict[type, dict[str, Labels]] = {
    LSTMWeights: {"w": ("I+P", "4H"), "b": ("4H",), "wci": ("H",), "wcf": ("H",),
                  "wco": ("H",), "w_proj": ("H", "P"),
                  **{name: ("4H",) for name in NORM_ARRAYS[:4]},
                  **{name: ("H",) for name in NORM_ARRAYS[4:]}},
    GRUWeights: {"w_ru": ("I+H", "2H"), "w_c": ("I+H", "H"), "b_ru": ("2H",), "b_c": ("C",)},
    RNNWeights: {"w": ("I+H", "H"), "b": ("H",)},
}


@dataclass(frozen=True)
class OpSpec:
    """One forward operation and its gradient.

    ``states``: the state arguments after ``x``; ``upstream``: the gradient's upstream
    arguments; ``h_width``: the label of the recurrent output's width (``P`` for the LSTM,
    whose projection makes ``h`` P wide, else ``H``); everything else is derived from the
    types.
    """

    name: str
    sequence: bool
    states: tuple[str, ...]
    weights: type[NamedTuple]
    settings: type
    result: type[NamedTuple]
    grads: type[NamedTuple]
    upstream: tuple[str, ...]
    h_width: str = "H"

    @property
    def grad_name(self) -> str:
        return f"{self.name}_grad"

    @property
    def result_arg(self) -> str:
        """The gradient's argument holding the forward's result."""
        return "seq" if self.sequence else "state"

    @property
    def x_labels(self) -> Labels:
        return ("T", "B", "I") if self.sequence else ("B", "I")

    def _labels(self, name: str) -> Labels:
        """``[B, ·]`` or ``[T, B, ·]`` for a result field or upstream gradient ``name``."""
        width = self.h_width if name.removeprefix("d_") in ("h", "h_final") else "H"
        return (("B", width) if not self.sequence or name.endswith("_final")
                else ("T", "B", width))

    def result_labels(self) -> tuple[Labels, ...]:
        """The shape labels of each field of the result."""
        return tuple(self._labels(field) for field in self.result._fields)

    def upstream_labels(self, name: str) -> Labels:
        return self._labels(name)

    @property
    def state_labels(self) -> tuple[Labels, ...]:
        """The shape labels of the state arguments (``cs`` H wide, ``h`` ``h_width``)."""
        return tuple(("B", self.h_width if name.startswith("h") else "H")
                     for name in self.states)

    @property
    def arrays(self) -> tuple[str, ...]:
        """The forward's array arguments in signature order (weights as their fields)."""
        return ("x", *self.states, *self.weights._fields)

    @property
    def flat_arrays(self) -> tuple[str, ...]:
        """``arrays`` with ``layer_norm`` read as its six arrays (``NORM_ARRAYS``): every
        array a call can hold, each one name."""
        return tuple(flat for name in self.arrays
                     for flat in (NORM_ARRAYS if name == "layer_norm" else (name,)))


OPS: dict[str, OpSpec] = {spec.name: spec for spec in (
    OpSpec("lstm_cell", False, ("cs_prev", "h_prev"), LSTMWeights, LSTMSettings,
           LSTMCellState, LSTMCellGrads, ("d_h", "d_cs"), "P"),
    OpSpec("gru_cell", False, ("h_prev",), GRUWeights, GRUSettings,
           GRUCellState, GRUCellGrads, ("d_h",)),
    OpSpec("lstm_sequence", True, ("cs0", "h0"), LSTMWeights, LSTMSettings,
           LSTMSequence, LSTMSequenceGrads, ("d_h", "d_cs", "d_h_final", "d_cs_final"), "P"),
    OpSpec("gru_sequence", True, ("h0",), GRUWeights, GRUSettings,
           GRUSequence, GRUSequenceGrads, ("d_h", "d_h_final")),
    OpSpec("rnn_cell", False, ("h_prev",), RNNWeights, RNNSettings,
           RNNCellState, RNNCellGrads, ("d_h",)),
    OpSpec("rnn_sequence", True, ("h0",), RNNWeights, RNNSettings,
           RNNSequence, RNNSequenceGrads, ("d_h", "d_h_final")),
)}
"""Every forward operation by name; each has a gradient ``<name>_grad``."""

CELLS = ("lstm", "gru", "rnn")
"""The cells; every backend has one module per cell (``gradcells.<backend>.<cell>``)."""

STACKS: dict[str, str] = {f"{cell}_stack": f"{cell}_sequence" for cell in CELLS}
"""The stacks (docs/spec.md §11.4), each with the sequence operation it composes: a backend
runs a stack when it has that operation."""

MASKS: dict[str, tuple[str, ...]] = {
    "input_mask": ("T", "B", "I"), "recurrent_mask": ("B", "P"),
    "zoneout_cs": ("T", "B", "H"), "zoneout_h": ("T", "B", "P")}
"""A sequence's masks (docs/spec.md §11.3) and the shape each broadcasts to (``P``: the
recurrent width; ``zoneout_cs`` the LSTM's only)."""
