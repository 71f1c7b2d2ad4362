"""The minGRU's declarations (docs/spec.md §18.2; Feng et al. 2024, "Were RNNs All We
Needed?"): its types, its keywords, its shapes, its public functions' contracts; its math is
``reference.py``, its kernels ``cpu.py`` and ``gpu.py``.

The gates read ``x`` only, so over a sequence the state is the diagonal linear recurrence
``h_t = a_t∘h_{t-1} + c_t`` (docs/spec.md §18.1), which runs sequentially or as an
associative scan over time (``method``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.scan import PARALLEL_FROM_STEPS, scan_method  # noqa: F401 (the cell's names)
from ..._core.specs import CellSpec, Keyword, Labels, OpSpec, StackSpec
from ..._core.types import Array, Recorded

__all__ = [
    "MinGRUSettings", "MinGRUWeights", "MinGRUCellState", "MinGRUCellGrads", "MinGRUSequence",
    "MinGRUSequenceGrads", "MinGRUStack", "MinGRUStackGrads"]
"""The cell's public types (``gradcells`` exports them)."""


@dataclass(frozen=True, eq=False)
class MinGRUSettings:
    """What a minGRU forward was computed with: ``activation`` ("g" or "identity"),
    ``method`` ("sequential", "parallel" or "auto"), ``seq_len``, ``reverse`` and
    ``batch_first``."""

    activation: str = "g"
    method: str = "auto"
    seq_len: Array | None = None
    reverse: bool = False
    batch_first: bool = False


class MinGRUWeights(NamedTuple):
    """One minGRU's parameters: ``w [I, 2H]`` (columns: the gate z, then the candidate h̃)
    and ``b [2H]``."""

    w: Array
    b: Array


class _MinGRUCellState(NamedTuple):
    z: Array
    hc: Array
    h: Array


class MinGRUCellState(Recorded, _MinGRUCellState):
    """One minGRU step: the gate ``z``, the candidate ``hc`` (h̃) and the state ``h``, each
    ``[B, H]``."""


class MinGRUCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``mingru_cell``."""

    x: Array
    h_prev: Array
    w: Array
    b: Array


class _MinGRUSequence(NamedTuple):
    z: Array
    hc: Array
    h: Array
    h_final: Array


class MinGRUSequence(Recorded, _MinGRUSequence):
    """Every step's gate ``z``, candidate ``hc`` and state ``h`` (``[T, B, H]``, zero past a
    row's length) and the final state ``h_final [B, H]``."""


class MinGRUSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``mingru_sequence``."""

    x: Array
    h0: Array
    w: Array
    b: Array


class _MinGRUStack(NamedTuple):
    h: Array
    h_final: Array
    layers: tuple


class MinGRUStack(Recorded, _MinGRUStack):
    """A minGRU stack's top-layer outputs ``h [T, B, D·H]``, the final states
    ``h_final [L·D, B, H]`` and the ``MinGRUSequence`` of each (layer, direction)."""


class MinGRUStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``mingru_stack``."""

    x: Array
    h0: Array
    weights: list


class MinGRUBackend(Protocol):
    def mingru_cell(self, x, h_prev, weights: MinGRUWeights,
                    settings: MinGRUSettings) -> MinGRUCellState: ...

    def mingru_cell_grad(self, x, h_prev, weights: MinGRUWeights, state: MinGRUCellState,
                         settings: MinGRUSettings, *, d_z=None, d_hc=None,
                         d_h=None) -> MinGRUCellGrads: ...

    def mingru_sequence(self, x, h0, weights: MinGRUWeights,
                        settings: MinGRUSettings) -> MinGRUSequence: ...

    def mingru_sequence_grad(self, x, h0, weights: MinGRUWeights, seq: MinGRUSequence,
                             settings: MinGRUSettings, *, d_z=None, d_hc=None, d_h=None,
                             d_h_final=None) -> MinGRUSequenceGrads: ...

    def mingru_cell_jvp(self, x, h_prev, weights: MinGRUWeights, tangents: MinGRUCellGrads,
                        settings: MinGRUSettings
                        ) -> tuple[MinGRUCellState, MinGRUCellState]: ...

    def mingru_sequence_jvp(self, x, h0, weights: MinGRUWeights,
                            tangents: MinGRUSequenceGrads, settings: MinGRUSettings
                            ) -> tuple[MinGRUSequence, MinGRUSequence]: ...

    def mingru_cell_grad_jvp(self, x, h_prev, weights: MinGRUWeights, state: MinGRUCellState,
                             tangents: MinGRUCellGrads, settings: MinGRUSettings, *,
                             d_z=None, d_hc=None, d_h=None, d_z_tangent=None,
                             d_hc_tangent=None, d_h_tangent=None
                             ) -> tuple[MinGRUCellGrads, MinGRUCellGrads]: ...

    def mingru_sequence_grad_jvp(self, x, h0, weights: MinGRUWeights, seq: MinGRUSequence,
                                 tangents: MinGRUSequenceGrads, settings: MinGRUSettings, *,
                                 d_z=None, d_hc=None, d_h=None, d_h_final=None,
                                 d_z_tangent=None, d_hc_tangent=None, d_h_tangent=None,
                                 d_h_final_tangent=None
                                 ) -> tuple[MinGRUSequenceGrads, MinGRUSequenceGrads]: ...


ACTIVATIONS = ("g", "identity")
"""The candidate's activations: the paper's ``g`` (``v + 0.5`` for ``v >= 0``, ``σ(v)``
below) or none."""

METHODS = ("auto", "sequential", "parallel")
"""How a sequence runs its recurrence: step by step, or as an associative scan over time
(docs/spec.md §18.1); "auto" chooses by the number of steps (``scan_method``)."""

WEIGHT_LABELS: dict[str, Labels] = {"w": ("I", "2H"), "b": ("2H",)}
"""The shape labels of every weight."""


DOCS: dict[str, str] = {
    "mingru_cell": """
        One step of the minGRU (Feng et al. 2024, docs/spec.md §18.2).

        Shapes: ``x [B, I]``, ``h_prev [B, H]``, ``w [I, 2H]`` (columns: the gate z, then the
        candidate h̃), ``b [2H]``; ``activation`` "g" (the paper's) or "identity".

            [p_z, p_h] = x·w + b
            z = σ(p_z);   h̃ = act(p_h);   h = (1 - z)∘h_prev + z∘h̃
            g(v) = v + 0.5 (v >= 0),  σ(v) (v < 0)

        Returns ``MinGRUCellState(z, hc, h)``, each ``[B, H]``, recording ``activation``.""",
    "mingru_cell_jvp": """
        Forward mode of ``mingru_cell`` (docs/spec.md §12): the step and its directional
        derivative along ``tangents``, a ``MinGRUCellGrads`` of the inputs' tangents (None:
        zero).

            dp = dx·w + x·dw + db;   dz = z∘(1 - z)∘dp_z;   dh̃ = act'(p_h)∘dp_h
            dh = (1 - z)∘dh_prev + dz∘(h̃ - h_prev) + z∘dh̃

        Returns ``(state, d_state)``: ``mingru_cell``'s ``MinGRUCellState`` and its
        tangent.""",
    "mingru_cell_grad": """
        Gradient of ``mingru_cell`` with respect to every input, given the forward's
        ``state`` and the upstream gradients ``d_z``, ``d_hc``, ``d_h`` of its fields (None:
        zeros).

            dp_z = (d_z + d_h∘(h̃ - h_prev))∘z∘(1 - z);   dp_h = (d_hc + d_h∘z)∘act'(p_h)
            dx = dp·wᵀ;   dh_prev = d_h∘(1 - z);   dw = xᵀ·dp;   db = Σ_batch dp

        ``act'`` is 1 for the identity and for ``p_h >= 0``, ``σ(p_h)(1 - σ(p_h))`` below;
        ``p_h`` is recomputed from the arguments. ``activation`` is the forward's, as
        ``state`` records it (a contradicting value raises ``ValueError``).

        Returns ``MinGRUCellGrads(x, h_prev, w, b)``.""",
    "mingru_cell_grad_jvp": """
        Second order: the JVP of ``mingru_cell_grad`` along ``tangents`` (a
        ``MinGRUCellGrads``) and the upstream gradients' tangents, as
        ``lstm_cell_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "mingru_sequence": """
        The minGRU (``mingru_cell``) over ``x [T, B, I]`` from ``h0 [B, H]``
        (docs/spec.md §18.2): the gates of every step from one input product, then the
        diagonal linear recurrence (docs/spec.md §18.1)

            h_t = a_t∘h_{t-1} + c_t,   a = 1 - z,   c = z∘h̃

        run by ``method``: "sequential" (step by step), "parallel" (an associative scan over
        time; it equals the sequential method to a few units in the last place times
        log2 T, relative to the recurrence run on ``|a|``, ``|c|``, ``|h0|``) or "auto"
        (parallel from ``PARALLEL_FROM_STEPS`` steps on). No log space: the scan is valid
        for any sign of ``h0`` and h̃. ``seq_len``, ``reverse`` and ``batch_first`` as for
        ``lstm_sequence`` (no masks).

        Returns ``MinGRUSequence(z, hc, h, h_final)``: steps ``[T, B, H]`` (zero past a
        row's length), final state ``[B, H]``, recording ``activation``, ``method`` and
        ``seq_len``.""",
    "mingru_sequence_jvp": """
        Forward mode of ``mingru_sequence`` (docs/spec.md §12): the sequence and its
        directional derivative along ``tangents``, a ``MinGRUSequenceGrads`` of the inputs'
        tangents (None: zero). The state's tangent is the same linear recurrence,

            dh_t = a_t∘dh_{t-1} + dz_t∘(h̃_t - h_{t-1}) + z_t∘dh̃_t

        Returns ``(seq, d_seq)``: ``mingru_sequence``'s result and a ``MinGRUSequence`` of
        tangents.""",
    "mingru_sequence_grad": """
        Backpropagation through time for ``mingru_sequence``, given its result ``seq``: the
        adjoint recurrence (docs/spec.md §18.1) runs backwards, itself a linear scan (by
        the forward's ``method``),

            g_t = d_h_t + a_{t+1}∘g_{t+1}   (g_{T-1} = d_h_{T-1} + d_h_final)
            dp_z = (d_z + g∘(h̃ - h_prev))∘z∘(1 - z);   dp_h = (d_hc + g∘z)∘act'(p_h)
            dh0 = a_0∘g_0;   dx = dp·wᵀ;   dw = xᵀ·dp;   db = Σ dp

        Upstream gradients (each optional, None meaning zeros): ``d_z``, ``d_hc``, ``d_h``
        ``[T, B, H]`` and ``d_h_final [B, H]``. ``activation``, ``method``, ``seq_len``,
        ``reverse`` and ``batch_first`` are the forward's, as ``seq`` records them (a
        contradicting value raises ``ValueError``). Entries of ``x`` and the upstream
        gradients past a row's length are never read.

        Returns ``MinGRUSequenceGrads(x, h0, w, b)``.""",
    "mingru_sequence_grad_jvp": """
        Second order: the JVP of ``mingru_sequence_grad`` along ``tangents`` (a
        ``MinGRUSequenceGrads``) and the upstream gradients' tangents, as
        ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "mingru_stack": """
        A stack of minGRU layers, as ``lstm_stack`` (``h0 [L·D, B, H]``). Returns
        ``MinGRUStack(h, h_final, layers)``.""",
    "mingru_stack_jvp": """
        Forward mode of ``mingru_stack``, as ``lstm_stack_jvp`` (``tangents`` a
        ``MinGRUStackGrads``). Returns ``(stack, d_stack)``.""",
    "mingru_stack_grad": """
        Backpropagation through ``mingru_stack``, as ``lstm_stack_grad``. Returns
        ``MinGRUStackGrads(x, h0, weights)``.""",
    "mingru_stack_grad_jvp": """
        Second order: the JVP of ``mingru_stack_grad``, as ``lstm_stack_grad_jvp``.""",
}
"""The public functions' docstrings: their contracts and math (``gradcells._public``
makes the functions)."""


CELL = CellSpec(
    "mingru",
    OpSpec("mingru_cell", False, ("h_prev",), MinGRUWeights, MinGRUSettings, MinGRUCellState,
           MinGRUCellGrads, ("d_z", "d_hc", "d_h")),
    OpSpec("mingru_sequence", True, ("h0",), MinGRUWeights, MinGRUSettings, MinGRUSequence,
           MinGRUSequenceGrads, ("d_z", "d_hc", "d_h", "d_h_final")),
    StackSpec(MinGRUStack, MinGRUStackGrads),
    keywords=(Keyword("activation", "g", "str", "choice", ACTIVATIONS),
              Keyword("method", "auto", "str", "choice", METHODS, sequence_only=True)),
    weight_labels=WEIGHT_LABELS, protocol=MinGRUBackend, docs=DOCS, masks=())
"""The minGRU, as the registry (``gradcells.cells``) reads it."""
