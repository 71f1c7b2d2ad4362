"""The minLSTM's declarations (docs/spec.md §18.2; Feng et al. 2024, "Were RNNs All We
Needed?"): its types, its keywords, its shapes, its public functions' contracts; its math is
``reference.py``, its kernels ``cpu.py`` and ``gpu.py``.

The gates read ``x`` only, so over a sequence the state is the diagonal linear recurrence
``h_t = a_t∘h_{t-1} + c_t`` (docs/spec.md §18.1) with ``a = f'``, ``c = i'∘h̃``, which runs
sequentially or as an associative scan over time (``method``), as the minGRU's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.scan import PARALLEL_FROM_STEPS, scan_method  # noqa: F401 (the cell's names)
from ..._core.specs import CellSpec, Keyword, Labels, OpSpec, StackSpec
from ..._core.types import Array, Recorded

__all__ = [
    "MinLSTMSettings", "MinLSTMWeights", "MinLSTMCellState", "MinLSTMCellGrads",
    "MinLSTMSequence", "MinLSTMSequenceGrads", "MinLSTMStack", "MinLSTMStackGrads"]
"""The cell's public types (``gradcells`` exports them)."""


@dataclass(frozen=True, eq=False)
class MinLSTMSettings:
    """What a minLSTM forward was computed with: ``activation`` ("g" or "identity"),
    ``method`` ("sequential", "parallel" or "auto"), ``seq_len``, ``reverse`` and
    ``batch_first``."""

    activation: str = "g"
    method: str = "auto"
    seq_len: Array | None = None
    reverse: bool = False
    batch_first: bool = False


class MinLSTMWeights(NamedTuple):
    """One minLSTM's parameters: ``w [I, 3H]`` (columns: the forget gate f, the input gate
    i, then the candidate h̃) and ``b [3H]``."""

    w: Array
    b: Array


class _MinLSTMCellState(NamedTuple):
    f: Array
    i: Array
    hc: Array
    h: Array


class MinLSTMCellState(Recorded, _MinLSTMCellState):
    """One minLSTM step: the normalised gates ``f`` (f' = f/(f+i)) and ``i`` (i' = i/(f+i)),
    the candidate ``hc`` (h̃) and the state ``h``, each ``[B, H]``."""


class MinLSTMCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``minlstm_cell``."""

    x: Array
    h_prev: Array
    w: Array
    b: Array


class _MinLSTMSequence(NamedTuple):
    f: Array
    i: Array
    hc: Array
    h: Array
    h_final: Array


class MinLSTMSequence(Recorded, _MinLSTMSequence):
    """Every step's normalised gates ``f``, ``i`` (f', i'), candidate ``hc`` and state ``h``
    (``[T, B, H]``, zero past a row's length) and the final state ``h_final [B, H]``."""


class MinLSTMSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``minlstm_sequence``."""

    x: Array
    h0: Array
    w: Array
    b: Array


class _MinLSTMStack(NamedTuple):
    h: Array
    h_final: Array
    layers: tuple


class MinLSTMStack(Recorded, _MinLSTMStack):
    """A minLSTM stack's top-layer outputs ``h [T, B, D·H]``, the final states
    ``h_final [L·D, B, H]`` and the ``MinLSTMSequence`` of each (layer, direction)."""


class MinLSTMStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``minlstm_stack``."""

    x: Array
    h0: Array
    weights: list


class MinLSTMBackend(Protocol):
    def minlstm_cell(self, x, h_prev, weights: MinLSTMWeights,
                     settings: MinLSTMSettings) -> MinLSTMCellState: ...

    def minlstm_cell_grad(self, x, h_prev, weights: MinLSTMWeights, state: MinLSTMCellState,
                          settings: MinLSTMSettings, *, d_f=None, d_i=None, d_hc=None,
                          d_h=None) -> MinLSTMCellGrads: ...

    def minlstm_sequence(self, x, h0, weights: MinLSTMWeights,
                         settings: MinLSTMSettings) -> MinLSTMSequence: ...

    def minlstm_sequence_grad(self, x, h0, weights: MinLSTMWeights, seq: MinLSTMSequence,
                              settings: MinLSTMSettings, *, d_f=None, d_i=None, d_hc=None,
                              d_h=None, d_h_final=None) -> MinLSTMSequenceGrads: ...

    def minlstm_cell_jvp(self, x, h_prev, weights: MinLSTMWeights, tangents: MinLSTMCellGrads,
                         settings: MinLSTMSettings
                         ) -> tuple[MinLSTMCellState, MinLSTMCellState]: ...

    def minlstm_sequence_jvp(self, x, h0, weights: MinLSTMWeights,
                             tangents: MinLSTMSequenceGrads, settings: MinLSTMSettings
                             ) -> tuple[MinLSTMSequence, MinLSTMSequence]: ...

    def minlstm_cell_grad_jvp(self, x, h_prev, weights: MinLSTMWeights,
                              state: MinLSTMCellState, tangents: MinLSTMCellGrads,
                              settings: MinLSTMSettings, *, d_f=None, d_i=None, d_hc=None,
                              d_h=None, d_f_tangent=None, d_i_tangent=None,
                              d_hc_tangent=None, d_h_tangent=None
                              ) -> tuple[MinLSTMCellGrads, MinLSTMCellGrads]: ...

    def minlstm_sequence_grad_jvp(self, x, h0, weights: MinLSTMWeights, seq: MinLSTMSequence,
                                  tangents: MinLSTMSequenceGrads, settings: MinLSTMSettings,
                                  *, d_f=None, d_i=None, d_hc=None, d_h=None, d_h_final=None,
                                  d_f_tangent=None, d_i_tangent=None, d_hc_tangent=None,
                                  d_h_tangent=None, d_h_final_tangent=None
                                  ) -> tuple[MinLSTMSequenceGrads, MinLSTMSequenceGrads]: ...


ACTIVATIONS = ("g", "identity")
"""The candidate's activations: the paper's ``g`` (``v + 0.5`` for ``v >= 0``, ``σ(v)``
below) or none."""

METHODS = ("auto", "sequential", "parallel")
"""How a sequence runs its recurrence: step by step, or as an associative scan over time
(docs/spec.md §18.1); "auto" chooses by the number of steps (``scan_method``)."""

WEIGHT_LABELS: dict[str, Labels] = {"w": ("I", "3H"), "b": ("3H",)}
"""The shape labels of every weight."""

_GATES = """
            [p_f, p_i, p_h] = x·w + b;   e = softplus(-p_f) - softplus(-p_i)
            i' = σ(e) = i/(f+i);   f' = 1 - i' = f/(f+i)   (f = σ(p_f), i = σ(p_i))
            h̃ = act(p_h);   h = f'∘h_prev + i'∘h̃
            g(v) = v + 0.5 (v >= 0),  σ(v) (v < 0)

        ``e = log i - log f`` in softplus form: no overflow or 0/0 for any finite
        pre-activations (``f + i`` may round to 0)."""

DOCS: dict[str, str] = {
    "minlstm_cell": """
        One step of the minLSTM (Feng et al. 2024, docs/spec.md §18.2).

        Shapes: ``x [B, I]``, ``h_prev [B, H]``, ``w [I, 3H]`` (columns: the forget gate f,
        the input gate i, then the candidate h̃), ``b [3H]``; ``activation`` "g" (the
        paper's) or "identity".
""" + _GATES + """

        Returns ``MinLSTMCellState(f, i, hc, h)`` (f', i', h̃, h), each ``[B, H]``,
        recording ``activation``.""",
    "minlstm_cell_jvp": """
        Forward mode of ``minlstm_cell`` (docs/spec.md §12): the step and its directional
        derivative along ``tangents``, a ``MinLSTMCellGrads`` of the inputs' tangents (None:
        zero).

            dp = dx·w + x·dw + db;   de = σ(-p_i)∘dp_i - σ(-p_f)∘dp_f
            di' = f'∘i'∘de;   df' = -di';   dh̃ = act'(p_h)∘dp_h
            dh = f'∘dh_prev + di'∘(h̃ - h_prev) + i'∘dh̃

        Returns ``(state, d_state)``: ``minlstm_cell``'s ``MinLSTMCellState`` and its
        tangent.""",
    "minlstm_cell_grad": """
        Gradient of ``minlstm_cell`` with respect to every input, given the forward's
        ``state`` and the upstream gradients ``d_f``, ``d_i``, ``d_hc``, ``d_h`` of its
        fields (None: zeros).

            de = (d_i - d_f + d_h∘(h̃ - h_prev))∘f'∘i'
            dp_f = -de∘σ(-p_f);   dp_i = de∘σ(-p_i);   dp_h = (d_hc + d_h∘i')∘act'(p_h)
            dx = dp·wᵀ;   dh_prev = d_h∘f';   dw = xᵀ·dp;   db = Σ_batch dp

        ``act'`` is 1 for the identity and for ``p_h >= 0``, ``σ(p_h)(1 - σ(p_h))`` below;
        ``p`` is recomputed from the arguments. ``activation`` is the forward's, as
        ``state`` records it (a contradicting value raises ``ValueError``).

        Returns ``MinLSTMCellGrads(x, h_prev, w, b)``.""",
    "minlstm_cell_grad_jvp": """
        Second order: the JVP of ``minlstm_cell_grad`` along ``tangents`` (a
        ``MinLSTMCellGrads``) and the upstream gradients' tangents, as
        ``lstm_cell_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "minlstm_sequence": """
        The minLSTM (``minlstm_cell``) over ``x [T, B, I]`` from ``h0 [B, H]``
        (docs/spec.md §18.2): the gates of every step from one input product, then the
        diagonal linear recurrence (docs/spec.md §18.1)

            h_t = a_t∘h_{t-1} + c_t,   a = f',   c = i'∘h̃

        run by ``method``: "sequential" (step by step), "parallel" (an associative scan over
        time; it equals the sequential method to a few units in the last place times
        log2 T, relative to the recurrence run on ``|a|``, ``|c|``, ``|h0|``) or "auto"
        (parallel from ``PARALLEL_FROM_STEPS`` steps on). No log space: the scan is valid
        for any sign of ``h0`` and h̃, and starts from ``h0`` (the paper's and
        minGRU-pytorch's sequential mode; its parallel mode starts from ``g(h0)``, fault
        71). ``seq_len``, ``reverse`` and ``batch_first`` as for ``lstm_sequence`` (no
        masks).

        Returns ``MinLSTMSequence(f, i, hc, h, h_final)``: steps ``[T, B, H]`` (zero past a
        row's length), final state ``[B, H]``, recording ``activation``, ``method`` and
        ``seq_len``.""",
    "minlstm_sequence_jvp": """
        Forward mode of ``minlstm_sequence`` (docs/spec.md §12): the sequence and its
        directional derivative along ``tangents``, a ``MinLSTMSequenceGrads`` of the inputs'
        tangents (None: zero). The state's tangent is the same linear recurrence,

            dh_t = f'_t∘dh_{t-1} + di'_t∘(h̃_t - h_{t-1}) + i'_t∘dh̃_t

        Returns ``(seq, d_seq)``: ``minlstm_sequence``'s result and a ``MinLSTMSequence`` of
        tangents.""",
    "minlstm_sequence_grad": """
        Backpropagation through time for ``minlstm_sequence``, given its result ``seq``: the
        adjoint recurrence (docs/spec.md §18.1) runs backwards, itself a linear scan (by
        the forward's ``method``),

            g_t = d_h_t + f'_{t+1}∘g_{t+1}   (g_{T-1} = d_h_{T-1} + d_h_final)
            de = (d_i - d_f + g∘(h̃ - h_prev))∘f'∘i'
            dp_f = -de∘σ(-p_f);   dp_i = de∘σ(-p_i);   dp_h = (d_hc + g∘i')∘act'(p_h)
            dh0 = f'_0∘g_0;   dx = dp·wᵀ;   dw = xᵀ·dp;   db = Σ dp

        Upstream gradients (each optional, None meaning zeros): ``d_f``, ``d_i``, ``d_hc``,
        ``d_h`` ``[T, B, H]`` and ``d_h_final [B, H]``. ``activation``, ``method``,
        ``seq_len``, ``reverse`` and ``batch_first`` are the forward's, as ``seq`` records
        them (a contradicting value raises ``ValueError``). Entries of ``x`` and the
        upstream gradients past a row's length are never read.

        Returns ``MinLSTMSequenceGrads(x, h0, w, b)``.""",
    "minlstm_sequence_grad_jvp": """
        Second order: the JVP of ``minlstm_sequence_grad`` along ``tangents`` (a
        ``MinLSTMSequenceGrads``) and the upstream gradients' tangents, as
        ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "minlstm_stack": """
        A stack of minLSTM layers, as ``lstm_stack`` (``h0 [L·D, B, H]``). Returns
        ``MinLSTMStack(h, h_final, layers)``.""",
    "minlstm_stack_jvp": """
        Forward mode of ``minlstm_stack``, as ``lstm_stack_jvp`` (``tangents`` a
        ``MinLSTMStackGrads``). Returns ``(stack, d_stack)``.""",
    "minlstm_stack_grad": """
        Backpropagation through ``minlstm_stack``, as ``lstm_stack_grad``. Returns
        ``MinLSTMStackGrads(x, h0, weights)``.""",
    "minlstm_stack_grad_jvp": """
        Second order: the JVP of ``minlstm_stack_grad``, as ``lstm_stack_grad_jvp``.""",
}
"""The public functions' docstrings: their contracts and math (``gradcells._public``
makes the functions)."""


CELL = CellSpec(
    "minlstm",
    OpSpec("minlstm_cell", False, ("h_prev",), MinLSTMWeights, MinLSTMSettings,
           MinLSTMCellState, MinLSTMCellGrads, ("d_f", "d_i", "d_hc", "d_h")),
    OpSpec("minlstm_sequence", True, ("h0",), MinLSTMWeights, MinLSTMSettings, MinLSTMSequence,
           MinLSTMSequenceGrads, ("d_f", "d_i", "d_hc", "d_h", "d_h_final")),
    StackSpec(MinLSTMStack, MinLSTMStackGrads),
    keywords=(Keyword("activation", "g", "str", "choice", ACTIVATIONS),
              Keyword("method", "auto", "str", "choice", METHODS, sequence_only=True)),
    weight_labels=WEIGHT_LABELS, protocol=MinLSTMBackend, docs=DOCS, masks=())
"""The minLSTM, as the registry (``gradcells.cells``) reads it."""
