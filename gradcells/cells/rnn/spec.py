"""The plain (Elman) RNN's declarations (docs/spec.md §15): PyTorch's ``nn.RNN``, Keras'
``SimpleRNN``, ONNX's ``RNN``. Its types, its keywords, its shapes, its public functions'
contracts; its math is ``reference.py``, its kernels ``cpu.py`` and ``gpu.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.specs import CellSpec, Keyword, Labels, OpSpec, StackSpec
from ..._core.types import Array, Recorded

__all__ = [
    "RNNSettings", "RNNWeights", "RNNCellState", "RNNCellGrads", "RNNSequence",
    "RNNSequenceGrads", "RNNStack", "RNNStackGrads"]
"""The cell's public types (``gradcells`` exports them)."""


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


class RNNWeights(NamedTuple):
    """One plain RNN cell's parameters: ``w [I+H, H]`` (rows: the x part, then the h part)
    and ``b [H]``."""

    w: Array
    b: Array


class _RNNCellState(NamedTuple):
    h: Array


class RNNCellState(Recorded, _RNNCellState):
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


class RNNSequence(Recorded, _RNNSequence):
    """Every step's plain RNN output ``h [T, B, H]`` and the final state ``[B, H]``."""


class RNNSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rnn_sequence``."""

    x: Array
    h0: Array
    w: Array
    b: Array


class _RNNStack(NamedTuple):
    h: Array
    h_final: Array
    layers: tuple


class RNNStack(Recorded, _RNNStack):
    """A plain RNN stack's top-layer outputs ``h [T, B, D·H]``, the final states
    ``h_final [L·D, B, H]`` and the ``RNNSequence`` of each (layer, direction)."""


class RNNStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rnn_stack``."""

    x: Array
    h0: Array
    weights: list


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


ACTIVATIONS = ("tanh", "relu")
"""The plain RNN cell's activations."""

WEIGHT_LABELS: dict[str, Labels] = {"w": ("I+H", "H"), "b": ("H",)}
"""The shape labels of every weight."""


DOCS: dict[str, str] = {
    "rnn_cell": """
        One step of the plain (Elman) RNN cell: PyTorch's ``nn.RNNCell``, Keras' ``SimpleRNN``,
        ONNX's ``RNN``.

        Shapes: ``x [B, I]``, ``h_prev [B, H]``, ``w [I+H, H]`` (rows: the x part, then the h
        part), ``b [H]``; ``activation`` "tanh" or "relu".

            h = act([x, h_prev]·w + b)

        Returns ``RNNCellState(h)``, ``h [B, H]``, recording ``activation``.""",
    "rnn_cell_jvp": """
        Forward mode of ``rnn_cell`` (docs/spec.md §12): the step and its directional
        derivative along ``tangents``, an ``RNNCellGrads`` of the inputs' tangents (None:
        zero), each with its input's shape, library and dtype.

            dz = [dx, dh_prev]·w + [x, h_prev]·dw + db;   dh = act'(z)∘dz

        Returns ``(state, d_state)``: ``rnn_cell``'s ``RNNCellState`` and its tangent.""",
    "rnn_cell_grad": """
        Gradient of ``rnn_cell`` with respect to every input, given the forward's ``state``
        and the upstream gradient ``d_h`` of ``h`` (None: zeros).

            dz = d_h∘act'(z):  tanh' = 1 - h²;  relu' = 1 where h > 0, else 0 (relu'(0) = 0)
            d[x, h_prev] = dz·wᵀ;   dw = [x, h_prev]ᵀ·dz;   db = Σ_batch dz

        ``activation`` is the forward's, as ``state`` records it (None: the record's; for a
        tuple built by hand, "tanh"); a contradicting value raises ``ValueError``.

        Returns ``RNNCellGrads(x, h_prev, w, b)``.""",
    "rnn_cell_grad_jvp": """
        Second order: the JVP of ``rnn_cell_grad`` along ``tangents`` (an ``RNNCellGrads``)
        and ``d_h_tangent``, as ``lstm_cell_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "rnn_sequence": """
        The plain RNN cell (``rnn_cell``) run over ``x [T, B, I]`` from ``h0 [B, H]``.

        Weights as for ``rnn_cell``; ``seq_len``, ``reverse``, ``batch_first`` and the masks (no
        ``zoneout_cs``) as for ``lstm_sequence``.

            for t in 0..T-1:   h[t] = act([x[t], h]·w + b)

        Returns ``RNNSequence(h, h_final)``: steps ``[T, B, H]``, final state ``[B, H]``,
        recording ``activation`` and ``seq_len``.""",
    "rnn_sequence_jvp": """
        Forward mode of ``rnn_sequence`` (docs/spec.md §12): the sequence and its
        directional derivative along ``tangents``, an ``RNNSequenceGrads`` of the inputs'
        tangents (None: zero), as for ``lstm_sequence_jvp``; each step's is ``rnn_cell_jvp``'s.

        Returns ``(seq, d_seq)``: ``rnn_sequence``'s result and an ``RNNSequence`` of tangents.""",
    "rnn_sequence_grad": """
        Backpropagation through time for ``rnn_sequence``, given its result ``seq``.

        Upstream gradients (each optional, None meaning zeros): ``d_h [T, B, H]`` for the
        per-step ``h``, ``d_h_final [B, H]`` for the final state. ``activation``, ``seq_len``,
        ``reverse``, ``batch_first`` and the masks are the forward's, as ``seq`` records them
        (a contradicting value raises ``ValueError``;
        for a ``seq`` that records nothing, ``activation`` None means "tanh"). Entries of ``x``
        and ``d_h`` past a row's length are never read.

        Returns ``RNNSequenceGrads(x, h0, w, b)``.""",
    "rnn_sequence_grad_jvp": """
        Second order: the JVP of ``rnn_sequence_grad`` along ``tangents`` (a
        ``RNNSequenceGrads``) and the upstream gradients' tangents, as
        ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "rnn_stack": """
        A stack of plain RNN layers, as ``lstm_stack`` (``h0 [L·D, B, H]``). Returns
        ``RNNStack(h, h_final, layers)``.""",
    "rnn_stack_jvp": """
        Forward mode of ``rnn_stack``, as ``lstm_stack_jvp`` (``tangents`` an
        ``RNNStackGrads``). Returns ``(stack, d_stack)``.""",
    "rnn_stack_grad": """
        Backpropagation through ``rnn_stack``, as ``lstm_stack_grad``. Returns
        ``RNNStackGrads(x, h0, weights)``.""",
    "rnn_stack_grad_jvp": """
        Second order: the JVP of ``rnn_stack_grad``, as ``lstm_stack_grad_jvp``.""",
}
"""The public functions' docstrings: their contracts and math (``gradcells._public``
makes the functions)."""


CELL = CellSpec(
    "rnn",
    OpSpec("rnn_cell", False, ("h_prev",), RNNWeights, RNNSettings, RNNCellState,
           RNNCellGrads, ("d_h",)),
    OpSpec("rnn_sequence", True, ("h0",), RNNWeights, RNNSettings, RNNSequence,
           RNNSequenceGrads, ("d_h", "d_h_final")),
    StackSpec(RNNStack, RNNStackGrads),
    keywords=(Keyword("activation", "tanh", "str", "choice", ACTIVATIONS),),
    weight_labels=WEIGHT_LABELS, protocol=RNNBackend, docs=DOCS)
"""The plain RNN, as the registry (``gradcells.cells``) reads it."""
