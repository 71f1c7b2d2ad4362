"""The types every layer shares: results, weight sets, settings records, the backend protocol.

Results are NamedTuples: they unpack into their arrays as they always have. A result made by
a public forward operation also records the settings it was computed with, as
``result.settings`` (an ``LSTMSettings`` or ``GRUSettings``), so that its gradient needs only
the arrays, the result and the upstream gradients (docs/spec.md, "A result carries its
settings"). A tuple built by hand, or rebuilt with ``_make``/``_replace``, records nothing
(``settings`` is None) and the gradient takes its settings from its keywords.

Gradient tuples are named after the inputs they belong to and hold ``None`` for inputs that
were not given (peepholes off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

Array = Any
"""Any array the library accepts: NumPy or CuPy (and, at the public face, PyTorch or JAX)."""


# --------------------------------------------------------------------------------------
# Settings records


@dataclass(frozen=True, eq=False)
class LSTMSettings:
    """What an LSTM forward was computed with, normalised by the validation.

    ``forget_bias``: a float; ``cell_clip``: None (no clipping) or a positive float;
    ``peepholes``: whether ``wci, wcf, wco`` were given; ``seq_len``: None (every row ran all
    T steps; always None for a cell) or the integer lengths ``[B]``; ``projection``: whether
    ``w_proj`` was given; ``proj_clip``: None or a positive float, as ``cell_clip``;
    ``layer_norm``: whether an ``LSTMNorm`` was given; ``ln_epsilon``: the layer norms'
    positive ε; ``ln_carry``: "raw" or "normalized", which cell state the step carries
    (docs/spec.md §9.2). Without layer norm the last two keep their defaults.
    ``reverse`` and ``batch_first``: a sequence's time order and layout (docs/spec.md §11.1,
    §11.2); always False for a cell, and for what a backend is given (``gradcells._order``
    hands it the sequence time-major in the order it runs). ``input_mask``,
    ``recurrent_mask``, ``zoneout_cs``, ``zoneout_h``: a sequence's masks (§11.3; None: no
    mask), read-only copies, in the caller's order and layout (and the backend's, in what it
    is given).
    """

    forget_bias: float = 1.0
    cell_clip: float | None = None
    peepholes: bool = False
    seq_len: Array | None = None
    projection: bool = False
    proj_clip: float | None = None
    layer_norm: bool = False
    ln_epsilon: float = 1e-5
    ln_carry: str = "raw"
    reverse: bool = False
    batch_first: bool = False
    input_mask: Array | None = None
    recurrent_mask: Array | None = None
    zoneout_cs: Array | None = None
    zoneout_h: Array | None = None


@dataclass(frozen=True, eq=False)
class GRUSettings:
    """What a GRU forward was computed with: ``reset_after``, ``seq_len``, ``reverse``,
    ``batch_first`` and the masks but ``zoneout_cs`` (as for ``LSTMSettings``)."""

    reset_after: bool = False
    seq_len: Array | None = None
    reverse: bool = False
    batch_first: bool = False
    input_mask: Array | None = None
    recurrent_mask: Array | None = None
    zoneout_h: Array | None = None


@dataclass(frozen=True, eq=False)
class RNNSettings:
    """What a plain RNN forward was computed with: ``activation`` ("tanh" or "relu"),
    ``seq_len``, ``reverse``, ``batch_first`` and the masks but ``zoneout_cs`` (as for
    ``LSTMSettings``)."""

    activation: str = "tanh"
    seq_len: Array | None = None
    reverse: bool = False
    batch_first: bool = False
    input_mask: Array | None = None
    recurrent_mask: Array | None = None
    zoneout_h: Array | None = None


Settings = TypeVar("Settings", LSTMSettings, GRUSettings, RNNSettings)


class _Recorded:
    """The ``settings`` attribute of a result (a property, so the record cannot be replaced
    by assignment; ``record_settings`` writes it once)."""

    __slots__ = ()

    @property
    def settings(self):
        """The settings the forward recorded, or None for a tuple built by hand."""
        return self.__dict__.get("_settings")


def record_settings(result, settings):
    """``result`` (a result NamedTuple) with ``settings`` recorded; returns ``result``."""
    result.__dict__["_settings"] = settings
    return result


# --------------------------------------------------------------------------------------
# Weight sets


class LSTMNorm(NamedTuple):
    """The layer-normalised LSTM's six parameters (docs/spec.md §9.2): gain and shift of the
    input part's norm ``gamma_x, beta_x [4H]``, of the recurrent part's ``gamma_h, beta_h
    [4H]`` and of the cell state's ``gamma_c, beta_c [H]``. An LSTM gradient's
    ``layer_norm`` field is an ``LSTMNorm`` of their gradients."""

    gamma_x: Array
    beta_x: Array
    gamma_h: Array
    beta_h: Array
    gamma_c: Array
    beta_c: Array


class LSTMWeights(NamedTuple):
    """One LSTM cell's parameters: ``w [I+P, 4H]`` and ``b [4H]`` (gate blocks i, ci, f, o),
    the peephole vectors ``wci, wcf, wco [H]`` (all three or none), the projection
    ``w_proj [H, P]`` (None: no projection, P = H) and the layer norms' ``LSTMNorm`` (None:
    no layer norm)."""

    w: Array
    b: Array
    wci: Array | None = None
    wcf: Array | None = None
    wco: Array | None = None
    w_proj: Array | None = None
    layer_norm: LSTMNorm | None = None


class GRUWeights(NamedTuple):
    """One GRU cell's parameters: ``w_ru [I+H, 2H]`` (r then u), ``w_c [I+H, H]``,
    ``b_ru [2H]`` and ``b_c`` (``[H]``, or ``[2H]`` reset-after)."""

    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array


class RNNWeights(NamedTuple):
    """One plain RNN cell's parameters: ``w [I+H, H]`` (rows: the x part, then the h part)
    and ``b [H]``."""

    w: Array
    b: Array


# --------------------------------------------------------------------------------------
# Results


class _LSTMCellState(NamedTuple):
    i: Array
    cs: Array
    f: Array
    o: Array
    ci: Array
    co: Array
    h: Array


class LSTMCellState(_Recorded, _LSTMCellState):
    """Outputs of one LSTM block cell step, all post-activation ``[B, H]``."""


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
    w_proj: Array | None = None
    layer_norm: LSTMNorm | None = None


class _GRUCellState(NamedTuple):
    r: Array
    u: Array
    c: Array
    h: Array


class GRUCellState(_Recorded, _GRUCellState):
    """Outputs of one GRU block cell step, all ``[B, H]``."""


class GRUCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_cell``."""

    x: Array
    h_prev: Array
    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array


class _LSTMSequence(NamedTuple):
    i: Array
    cs: Array
    f: Array
    o: Array
    ci: Array
    co: Array
    h: Array
    cs_final: Array
    h_final: Array


class LSTMSequence(_Recorded, _LSTMSequence):
    """Every step's LSTM outputs ``[T, B, H]`` and the final states ``[B, H]``."""


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
    w_proj: Array | None = None
    layer_norm: LSTMNorm | None = None


class _GRUSequence(NamedTuple):
    r: Array
    u: Array
    c: Array
    h: Array
    h_final: Array


class GRUSequence(_Recorded, _GRUSequence):
    """Every step's GRU outputs ``[T, B, H]`` and the final state ``[B, H]``."""


class GRUSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_sequence``."""

    x: Array
    h0: Array
    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array


class _RNNCellState(NamedTuple):
    h: Array


class RNNCellState(_Recorded, _RNNCellState):
    """The output of one plain RNN step, ``h [B, H]``."""


class RNNCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rnn_cell``."""

    x: Array
    h_prev: Array
    w: Array
    b: Array


class _RNNSequence(NamedTuple):
    h: Array
    h_final: Array


class RNNSequence(_Recorded, _RNNSequence):
    """Every step's plain RNN output ``h [T, B, H]`` and the final state ``[B, H]``."""


class RNNSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rnn_sequence``."""

    x: Array
    h0: Array
    w: Array
    b: Array


# --------------------------------------------------------------------------------------
# Stacks (docs/spec.md §11.4): layers of sequences, composed by the public layer


@dataclass(frozen=True, eq=False)
class StackSettings:
    """What a stack's forward was computed with beyond its layers' own records (each
    sequence in ``stack.layers`` records its cell's settings): ``bidirectional``,
    ``batch_first`` and the inter-layer ``dropout_masks`` (a tuple of ``num_layers - 1``
    arrays, or None)."""

    bidirectional: bool = False
    batch_first: bool = False
    dropout_masks: tuple | None = None


class _LSTMStack(NamedTuple):
    h: Array
    cs_final: Array
    h_final: Array
    layers: tuple


class LSTMStack(_Recorded, _LSTMStack):
    """An LSTM stack's top-layer outputs ``h [T, B, D·P]`` (both directions, forward first),
    the final states ``cs_final [L·D, B, H]``, ``h_final [L·D, B, P]`` in PyTorch's order,
    and ``layers``: the ``LSTMSequence`` of each (layer, direction), what the gradient
    needs."""


class LSTMStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``lstm_stack``: ``weights`` is a
    list of ``LSTMWeights`` of gradients, in the order of the weights."""

    x: Array
    cs0: Array
    h0: Array
    weights: list


class _GRUStack(NamedTuple):
    h: Array
    h_final: Array
    layers: tuple


class GRUStack(_Recorded, _GRUStack):
    """A GRU stack's top-layer outputs ``h [T, B, D·H]``, the final states ``h_final
    [L·D, B, H]`` and the ``GRUSequence`` of each (layer, direction)."""


class GRUStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_stack``."""

    x: Array
    h0: Array
    weights: list


class _RNNStack(NamedTuple):
    h: Array
    h_final: Array
    layers: tuple


class RNNStack(_Recorded, _RNNStack):
    """A plain RNN stack's top-layer outputs ``h [T, B, D·H]``, the final states
    ``h_final [L·D, B, H]`` and the ``RNNSequence`` of each (layer, direction)."""


class RNNStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rnn_stack``."""

    x: Array
    h0: Array
    weights: list


# --------------------------------------------------------------------------------------
# The backend contract: every cell has one module per backend with these functions, names
# and signatures, one per mode: the forward, the gradient (``d_``: the upstream cotangents),
# forward mode (``_jvp``: ``tangents`` a gradient type holding one tangent per argument,
# None for zero; returns the result and its tangent) and second order (``_grad_jvp``: the
# JVP of the gradient, ``d_*_tangent`` the upstream cotangents' tangents; returns the
# gradients and their tangent). tests/test_architecture.py holds every cell on every backend
# to them. Arguments arrive validated and normalised by the public layer; results are plain
# result tuples (the public layer records the settings on them).


class LSTMBackend(Protocol):
    def lstm_cell(self, x, cs_prev, h_prev, weights: LSTMWeights,
                  settings: LSTMSettings) -> LSTMCellState: ...

    def lstm_cell_grad(self, x, cs_prev, h_prev, weights: LSTMWeights, state: LSTMCellState,
                       settings: LSTMSettings, *, d_h=None, d_cs=None,
                       clip_grad="exact") -> LSTMCellGrads: ...

    def lstm_sequence(self, x, cs0, h0, weights: LSTMWeights,
                      settings: LSTMSettings) -> LSTMSequence: ...

    def lstm_sequence_grad(self, x, cs0, h0, weights: LSTMWeights, seq: LSTMSequence,
                           settings: LSTMSettings, *, d_h=None, d_cs=None, d_h_final=None,
                           d_cs_final=None, clip_grad="exact") -> LSTMSequenceGrads: ...


    def lstm_cell_jvp(self, x, cs_prev, h_prev, weights: LSTMWeights, tangents: LSTMCellGrads,
                      settings: LSTMSettings) -> tuple[LSTMCellState, LSTMCellState]: ...

    def lstm_sequence_jvp(self, x, cs0, h0, weights: LSTMWeights, tangents: LSTMSequenceGrads,
                          settings: LSTMSettings) -> tuple[LSTMSequence, LSTMSequence]: ...

    def lstm_cell_grad_jvp(self, x, cs_prev, h_prev, weights: LSTMWeights,
                           state: LSTMCellState, tangents: LSTMCellGrads,
                           settings: LSTMSettings, *, d_h=None, d_cs=None, d_h_tangent=None,
                           d_cs_tangent=None,
                           clip_grad="exact") -> tuple[LSTMCellGrads, LSTMCellGrads]: ...

    def lstm_sequence_grad_jvp(self, x, cs0, h0, weights: LSTMWeights, seq: LSTMSequence,
                               tangents: LSTMSequenceGrads, settings: LSTMSettings, *,
                               d_h=None, d_cs=None, d_h_final=None, d_cs_final=None,
                               d_h_tangent=None, d_cs_tangent=None, d_h_final_tangent=None,
                               d_cs_final_tangent=None, clip_grad="exact"
                               ) -> tuple[LSTMSequenceGrads, LSTMSequenceGrads]: ...


class GRUBackend(Protocol):
    def gru_cell(self, x, h_prev, weights: GRUWeights, settings: GRUSettings) -> GRUCellState: ...

    def gru_cell_grad(self, x, h_prev, weights: GRUWeights, state: GRUCellState,
                      settings: GRUSettings, *, d_h=None) -> GRUCellGrads: ...

    def gru_sequence(self, x, h0, weights: GRUWeights, settings: GRUSettings) -> GRUSequence: ...

    def gru_sequence_grad(self, x, h0, weights: GRUWeights, seq: GRUSequence,
                          settings: GRUSettings, *, d_h=None,
                          d_h_final=None) -> GRUSequenceGrads: ...

    def gru_cell_jvp(self, x, h_prev, weights: GRUWeights, tangents: GRUCellGrads,
                     settings: GRUSettings) -> tuple[GRUCellState, GRUCellState]: ...

    def gru_sequence_jvp(self, x, h0, weights: GRUWeights, tangents: GRUSequenceGrads,
                         settings: GRUSettings) -> tuple[GRUSequence, GRUSequence]: ...

    def gru_cell_grad_jvp(self, x, h_prev, weights: GRUWeights, state: GRUCellState,
                          tangents: GRUCellGrads, settings: GRUSettings, *, d_h=None,
                          d_h_tangent=None) -> tuple[GRUCellGrads, GRUCellGrads]: ...

    def gru_sequence_grad_jvp(self, x, h0, weights: GRUWeights, seq: GRUSequence,
                              tangents: GRUSequenceGrads, settings: GRUSettings, *,
                              d_h=None, d_h_final=None, d_h_tangent=None,
                              d_h_final_tangent=None
                              ) -> tuple[GRUSequenceGrads, GRUSequenceGrads]: ...


class RNNBackend(Protocol):
    def rnn_cell(self, x, h_prev, weights: RNNWeights, settings: RNNSettings) -> RNNCellState: ...

    def rnn_cell_grad(self, x, h_prev, weights: RNNWeights, state: RNNCellState,
                      settings: RNNSettings, *, d_h=None) -> RNNCellGrads: ...

    def rnn_sequence(self, x, h0, weights: RNNWeights, settings: RNNSettings) -> RNNSequence: ...

    def rnn_sequence_grad(self, x, h0, weights: RNNWeights, seq: RNNSequence,
                          settings: RNNSettings, *, d_h=None,
                          d_h_final=None) -> RNNSequenceGrads: ...

    def rnn_cell_jvp(self, x, h_prev, weights: RNNWeights, tangents: RNNCellGrads,
                     settings: RNNSettings) -> tuple[RNNCellState, RNNCellState]: ...

    def rnn_sequence_jvp(self, x, h0, weights: RNNWeights, tangents: RNNSequenceGrads,
                         settings: RNNSettings) -> tuple[RNNSequence, RNNSequence]: ...

    def rnn_cell_grad_jvp(self, x, h_prev, weights: RNNWeights, state: RNNCellState,
                          tangents: RNNCellGrads, settings: RNNSettings, *, d_h=None,
                          d_h_tangent=None) -> tuple[RNNCellGrads, RNNCellGrads]: ...

    def rnn_sequence_grad_jvp(self, x, h0, weights: RNNWeights, seq: RNNSequence,
                              tangents: RNNSequenceGrads, settings: RNNSettings, *,
                              d_h=None, d_h_final=None, d_h_tangent=None,
                              d_h_final_tangent=None
                              ) -> tuple[RNNSequenceGrads, RNNSequenceGrads]: ...


# Which protocol each backend cell module follows.
CELL_PROTOCOLS = {"lstm": LSTMBackend, "gru": GRUBackend, "rnn": RNNBackend}
