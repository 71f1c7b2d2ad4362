"""The RG-LRU's declarations (docs/spec.md §18.3; De et al. 2024, "Griffin: Mixing Gated
Linear Recurrences with Local Attention"; google-deepmind/recurrentgemma): its types, its
keywords, its shapes, its public functions' contracts; its math is ``reference.py``, its
kernels ``cpu.py`` and ``gpu.py``.

The gates read ``x`` only, so over a sequence the state is the diagonal linear recurrence
``h_t = a_t∘h_{t-1} + c_t`` (docs/spec.md §18.1), which runs sequentially or as an
associative scan over time (``method``), as the minGRU's. The input is as wide as the state
(``x [T, B, H]``) and the gates' weights are block-diagonal, one ``[H/N, H/N]`` block per
head, recurrentgemma's ``BlockDiagonalLinear``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.scan import PARALLEL_FROM_STEPS, scan_method  # noqa: F401 (the cell's names)
from ..._core.specs import CellSpec, Keyword, Labels, OpSpec, StackSpec
from ..._core.types import Array, Recorded

__all__ = [
    "RGLRUSettings", "RGLRUWeights", "RGLRUCellState", "RGLRUCellGrads", "RGLRUSequence",
    "RGLRUSequenceGrads", "RGLRUStack", "RGLRUStackGrads"]
"""The cell's public types (``gradcells`` exports them)."""

C = 8.0
"""The default ``c`` of ``log a = -c·r∘softplus(λ)``: the paper's and recurrentgemma's 8."""


@dataclass(frozen=True, eq=False)
class RGLRUSettings:
    """What an RG-LRU forward was computed with: ``c``, ``sqrt_grad_bound`` (None: the true
    gradient), ``method`` ("sequential", "parallel" or "auto"), ``seq_len``, ``reverse``,
    ``batch_first`` and ``resets`` (a ``[T, B]`` boolean array or None)."""

    c: float = C
    sqrt_grad_bound: float | None = None
    method: str = "auto"
    seq_len: Array | None = None
    reverse: bool = False
    batch_first: bool = False
    resets: Array | None = None


class RGLRUWeights(NamedTuple):
    """One RG-LRU's parameters: the recurrence gate's ``w_a [N, H/N, H/N]`` and ``b_a [H]``,
    the input gate's ``w_x [N, H/N, H/N]`` and ``b_x [H]`` (block-diagonal: head k maps
    ``x[..., k·H/N:(k+1)·H/N]`` by ``w[k]``), and ``lam [H]``, recurrentgemma's ``a_param``
    (``a = exp(-c·r∘softplus(λ)) = σ(-λ)^(c·r)``: the paper's Λ is ``-λ``)."""

    w_a: Array
    b_a: Array
    w_x: Array
    b_x: Array
    lam: Array


class _RGLRUCellState(NamedTuple):
    r: Array
    i: Array
    h: Array


class RGLRUCellState(Recorded, _RGLRUCellState):
    """One RG-LRU step: the recurrence gate ``r``, the input gate ``i`` and the state ``h``,
    each ``[B, H]``."""


class RGLRUCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rglru_cell``."""

    x: Array
    h_prev: Array
    w_a: Array
    b_a: Array
    w_x: Array
    b_x: Array
    lam: Array


class _RGLRUSequence(NamedTuple):
    r: Array
    i: Array
    h: Array
    h_final: Array


class RGLRUSequence(Recorded, _RGLRUSequence):
    """Every step's gates ``r``, ``i`` and state ``h`` (``[T, B, H]``, zero past a row's
    length) and the final state ``h_final [B, H]``."""


class RGLRUSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rglru_sequence``."""

    x: Array
    h0: Array
    w_a: Array
    b_a: Array
    w_x: Array
    b_x: Array
    lam: Array


class _RGLRUStack(NamedTuple):
    h: Array
    h_final: Array
    layers: tuple


class RGLRUStack(Recorded, _RGLRUStack):
    """An RG-LRU stack's top-layer outputs ``h [T, B, H]``, the final states
    ``h_final [L, B, H]`` and the ``RGLRUSequence`` of each layer."""


class RGLRUStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``rglru_stack``."""

    x: Array
    h0: Array
    weights: list


class RGLRUBackend(Protocol):
    def rglru_cell(self, x, h_prev, weights: RGLRUWeights,
                   settings: RGLRUSettings) -> RGLRUCellState: ...

    def rglru_cell_grad(self, x, h_prev, weights: RGLRUWeights, state: RGLRUCellState,
                        settings: RGLRUSettings, *, d_r=None, d_i=None,
                        d_h=None) -> RGLRUCellGrads: ...

    def rglru_sequence(self, x, h0, weights: RGLRUWeights,
                       settings: RGLRUSettings) -> RGLRUSequence: ...

    def rglru_sequence_grad(self, x, h0, weights: RGLRUWeights, seq: RGLRUSequence,
                            settings: RGLRUSettings, *, d_r=None, d_i=None, d_h=None,
                            d_h_final=None) -> RGLRUSequenceGrads: ...

    def rglru_cell_jvp(self, x, h_prev, weights: RGLRUWeights, tangents: RGLRUCellGrads,
                       settings: RGLRUSettings
                       ) -> tuple[RGLRUCellState, RGLRUCellState]: ...

    def rglru_sequence_jvp(self, x, h0, weights: RGLRUWeights,
                           tangents: RGLRUSequenceGrads, settings: RGLRUSettings
                           ) -> tuple[RGLRUSequence, RGLRUSequence]: ...

    def rglru_cell_grad_jvp(self, x, h_prev, weights: RGLRUWeights, state: RGLRUCellState,
                            tangents: RGLRUCellGrads, settings: RGLRUSettings, *,
                            d_r=None, d_i=None, d_h=None, d_r_tangent=None,
                            d_i_tangent=None, d_h_tangent=None
                            ) -> tuple[RGLRUCellGrads, RGLRUCellGrads]: ...

    def rglru_sequence_grad_jvp(self, x, h0, weights: RGLRUWeights, seq: RGLRUSequence,
                                tangents: RGLRUSequenceGrads, settings: RGLRUSettings, *,
                                d_r=None, d_i=None, d_h=None, d_h_final=None,
                                d_r_tangent=None, d_i_tangent=None, d_h_tangent=None,
                                d_h_final_tangent=None
                                ) -> tuple[RGLRUSequenceGrads, RGLRUSequenceGrads]: ...


METHODS = ("auto", "sequential", "parallel")
"""How a sequence runs its recurrence: step by step, or as an associative scan over time
(docs/spec.md §18.1); "auto" chooses by the number of steps (``scan_method``)."""

WEIGHT_LABELS: dict[str, Labels] = {"w_a": ("N", "H/N", "H/N"), "b_a": ("H",),
                                    "w_x": ("N", "H/N", "H/N"), "b_x": ("H",),
                                    "lam": ("H",)}
"""The shape labels of every weight (N, the heads, read from ``w_a``)."""

_MATH = """
            p_a = x·W_a + b_a,   p_x = x·W_x + b_x        (block-diagonal: N heads)
            r = σ(p_a),   i = σ(p_x)
            log a = -c·r∘softplus(λ),   a = exp(log a)
            m = sqrt(1 - a²)   (computed as sqrt(-expm1(2·log a)))
            h = a∘h_prev + m∘(i∘x)"""

DOCS: dict[str, str] = {
    "rglru_cell": f"""
        One step of the RG-LRU (De et al. 2024, Griffin; docs/spec.md §18.3).

        Shapes: ``x [B, H]`` (the input is as wide as the state), ``h_prev [B, H]``,
        ``w_a, w_x [N, H/N, H/N]`` (block-diagonal, N heads dividing H; recurrentgemma's
        ``BlockDiagonalLinear`` layout), ``b_a, b_x, lam [H]``; ``c`` (default 8).
{_MATH}

        ``1 - a²`` is formed as ``-expm1(2·log a)``: where ``a`` is near 1 (a gate ``r``
        near 0, or a small ``softplus(λ)``) ``1 - exp(2·log a)`` would lose every digit.
        ``σ`` is evaluated as ``e/(1 + e)`` with ``e = exp(-|p|)`` below 0, so that a tiny
        ``r`` keeps its relative precision (``m ≈ sqrt(2c·r·softplus(λ))`` reads it).
        ``sqrt_grad_bound`` as ``rglru_sequence``'s.

        Returns ``RGLRUCellState(r, i, h)``, each ``[B, H]``, recording ``c`` and
        ``sqrt_grad_bound``.""",
    "rglru_cell_jvp": """
        Forward mode of ``rglru_cell`` (docs/spec.md §12): the step and its directional
        derivative along ``tangents``, an ``RGLRUCellGrads`` of the inputs' tangents (None:
        zero), by ``rglru_sequence_jvp``'s formulas (the ``sqrt_grad_bound`` convention
        included). Returns ``(state, d_state)``.""",
    "rglru_cell_grad": """
        Gradient of ``rglru_cell`` with respect to every input, given the forward's
        ``state`` and the upstream gradients ``d_r``, ``d_i``, ``d_h`` of its fields (None:
        zeros), by ``rglru_sequence_grad``'s formulas. ``c`` and ``sqrt_grad_bound`` are the
        forward's, as ``state`` records them (a contradicting value raises ``ValueError``).

        Returns ``RGLRUCellGrads(x, h_prev, w_a, b_a, w_x, b_x, lam)``.""",
    "rglru_cell_grad_jvp": """
        Second order: the JVP of ``rglru_cell_grad`` along ``tangents`` (an
        ``RGLRUCellGrads``) and the upstream gradients' tangents, as
        ``lstm_cell_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "rglru_sequence": f"""
        The RG-LRU over ``x [T, B, H]`` from ``h0 [B, H]`` (docs/spec.md §18.3; De et al.
        2024; recurrentgemma's ``RGLRU``): every step's gates from one block-diagonal
        product per gate, then the diagonal linear recurrence (docs/spec.md §18.1)
{_MATH}

        ``resets [T, B]`` (boolean, ``[B, T]`` with ``batch_first``; None: none): where
        true, the state the step receives is replaced by zeros and the multiplier ``m`` by
        1, ``h_t = i_t∘x_t`` (a document boundary: recurrentgemma's ``segment_pos == 0``).
        With ``reverse`` a step receives the state of the step after it, so a reset there
        cuts the sequence at that step's right. Past a row's length the flags are never
        read.

        ``sqrt_grad_bound``: None (default) differentiates ``m = sqrt(1 - a²)`` exactly. A
        positive number reproduces recurrentgemma's ``SqrtBoundDerivative`` (its
        ``_MAX_SQRT_GRADIENT`` is 1000): the derivative of ``sqrt(z)`` taken at
        ``max(z, 1/(4·bound²))``, so at most ``bound``. That is a convention, not the
        derivative: it differs from the true gradient wherever ``1 - a² < 1/(4·bound²)``.
        The result records it; the gradient, its JVP, this function's JVP and the adapters
        all follow it. The true gradient is finite for every finite input: the slope of
        ``m`` reaches ``p_a`` and ``λ`` through ``q = r/sqrt(1 - a²)``, which stays finite
        as ``r`` or ``softplus(λ)`` goes to 0 and is taken as its limit, 0, where
        ``1 - a²`` is 0.

        ``method``: "sequential" (step by step), "parallel" (an associative scan over
        time; equal to the sequential method to a few units in the last place times
        log2 T) or "auto" (parallel from ``PARALLEL_FROM_STEPS`` steps on). ``seq_len``,
        ``reverse`` and ``batch_first`` as for ``lstm_sequence``.

        Returns ``RGLRUSequence(r, i, h, h_final)``: steps ``[T, B, H]`` (zero past a row's
        length), final state ``[B, H]``, recording ``c``, ``sqrt_grad_bound``, ``method``,
        ``seq_len`` and ``resets``.""",
    "rglru_sequence_jvp": """
        Forward mode of ``rglru_sequence`` (docs/spec.md §12): the sequence and its
        directional derivative along ``tangents``, an ``RGLRUSequenceGrads`` of the inputs'
        tangents (None: zero). With ``q = r/sqrt(z*)`` (``z* = 1 - a²``, or ``max(1 - a²,
        1/(4·bound²))`` with ``sqrt_grad_bound``; ``q = 0`` where ``z*`` is 0):

            dr = r(1-r)∘dp_a;   di = i(1-i)∘dp_x;   dsp = σ(λ)∘dλ
            da = -c·a∘(dr∘softplus(λ) + r∘dsp)
            dm = c·a²∘q∘((1-r)∘softplus(λ)∘dp_a + dsp)
            dh_t = a_t∘dh_{t-1} + da_t∘h_{t-1} + dm∘(i∘x) + m∘(di∘x + i∘dx)

        (at a reset ``a = 0``, ``m = 1`` and their tangents 0). Returns ``(seq, d_seq)``.""",
    "rglru_sequence_grad": """
        Backpropagation through time for ``rglru_sequence``, given its result ``seq``: the
        adjoint recurrence (docs/spec.md §18.1) runs backwards, itself a linear scan (by
        the forward's ``method``), then per step (``q`` as in ``rglru_sequence_jvp``;
        ``h_prev`` is 0 and ``g_m`` is 0 at a reset):

            g_t = d_h_t + a_{t+1}∘g_{t+1}   (g_{T-1} = d_h_{T-1} + d_h_final)
            g_a = g∘h_prev∘a;   g_m = g∘i∘x
            dp_a = (d_r - c·softplus(λ)∘g_a)∘r(1-r) + c·softplus(λ)∘a²∘(1-r)∘q∘g_m
            dp_x = (d_i + g∘m∘x)∘i(1-i)
            dλ = σ(λ)∘Σ(c·a²∘q∘g_m - c·r∘g_a)
            dx = g∘m∘i + dp_a·W_aᵀ + dp_x·W_xᵀ;   dW = xᵀ·dp per head;   db = Σ dp
            dh0 = a_0∘g_0

        Upstream gradients (each optional, None meaning zeros): ``d_r``, ``d_i``, ``d_h``
        ``[T, B, H]`` and ``d_h_final [B, H]``. ``c``, ``sqrt_grad_bound``, ``method``,
        ``seq_len``, ``reverse``, ``batch_first`` and ``resets`` are the forward's, as
        ``seq`` records them (a contradicting value raises ``ValueError``). Entries of
        ``x``, ``resets`` and the upstream gradients past a row's length are never read.

        Returns ``RGLRUSequenceGrads(x, h0, w_a, b_a, w_x, b_x, lam)``.""",
    "rglru_sequence_grad_jvp": """
        Second order: the JVP of ``rglru_sequence_grad`` along ``tangents`` (an
        ``RGLRUSequenceGrads``) and the upstream gradients' tangents, as
        ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "rglru_stack": """
        A stack of RG-LRU layers, as ``lstm_stack`` (``h0 [L·D, B, H]``). Each layer's
        input must be as wide as its state: ``x [T, B, H]``, and a bidirectional stack of
        more than one layer (whose upper inputs are 2H wide) is refused by its layers'
        shape checks. Returns ``RGLRUStack(h, h_final, layers)``.""",
    "rglru_stack_jvp": """
        Forward mode of ``rglru_stack``, as ``lstm_stack_jvp`` (``tangents`` an
        ``RGLRUStackGrads``). Returns ``(stack, d_stack)``.""",
    "rglru_stack_grad": """
        Backpropagation through ``rglru_stack``, as ``lstm_stack_grad``. Returns
        ``RGLRUStackGrads(x, h0, weights)``.""",
    "rglru_stack_grad_jvp": """
        Second order: the JVP of ``rglru_stack_grad``, as ``lstm_stack_grad_jvp``.""",
}
"""The public functions' docstrings: their contracts and math (``gradcells._public``
makes the functions)."""


CELL = CellSpec(
    "rglru",
    OpSpec("rglru_cell", False, ("h_prev",), RGLRUWeights, RGLRUSettings, RGLRUCellState,
           RGLRUCellGrads, ("d_r", "d_i", "d_h"), x_width="H"),
    OpSpec("rglru_sequence", True, ("h0",), RGLRUWeights, RGLRUSettings, RGLRUSequence,
           RGLRUSequenceGrads, ("d_r", "d_i", "d_h", "d_h_final"), x_width="H"),
    StackSpec(RGLRUStack, RGLRUStackGrads),
    keywords=(Keyword("c", C, "float", "positive"),
              Keyword("sqrt_grad_bound", None, "float | None", "bound"),
              Keyword("method", "auto", "str", "choice", METHODS, sequence_only=True)),
    weight_labels=WEIGHT_LABELS, protocol=RGLRUBackend, docs=DOCS, masks=("resets",))
"""The RG-LRU, as the registry (``gradcells.cells``) reads it."""
