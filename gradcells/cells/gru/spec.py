"""The GRU's declarations (docs/spec.md §2-§4): TensorFlow's GRU block cell, and the
reset-after variant (cuDNN's, PyTorch's, Keras's). Its types, its keywords, its shapes, its
public functions' contracts; its math is ``reference.py``, its kernels ``cpu.py`` and
``gpu.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.specs import CellSpec, Keyword, Labels, OpSpec, StackSpec
from ..._core.types import Array, Recorded

__all__ = [
    "GRUSettings", "GRUWeights", "GRUCellState", "GRUCellGrads", "GRUSequence",
    "GRUSequenceGrads", "GRUStack", "GRUStackGrads"]
"""The cell's public types (``gradcells`` exports them)."""


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


class GRUWeights(NamedTuple):
    """One GRU cell's parameters: ``w_ru [I+H, 2H]`` (r then u), ``w_c [I+H, H]``,
    ``b_ru [2H]`` and ``b_c`` (``[H]``, or ``[2H]`` reset-after)."""

    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array


class _GRUCellState(NamedTuple):
    r: Array
    u: Array
    c: Array
    h: Array


class GRUCellState(Recorded, _GRUCellState):
    """Outputs of one GRU block cell step, all ``[B, H]``."""


class GRUCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_cell``."""

    x: Array
    h_prev: Array
    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array


class _GRUSequence(NamedTuple):
    r: Array
    u: Array
    c: Array
    h: Array
    h_final: Array


class GRUSequence(Recorded, _GRUSequence):
    """Every step's GRU outputs ``[T, B, H]`` and the final state ``[B, H]``."""


class GRUSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_sequence``."""

    x: Array
    h0: Array
    w_ru: Array
    w_c: Array
    b_ru: Array
    b_c: Array


class _GRUStack(NamedTuple):
    h: Array
    h_final: Array
    layers: tuple


class GRUStack(Recorded, _GRUStack):
    """A GRU stack's top-layer outputs ``h [T, B, D·H]``, the final states ``h_final
    [L·D, B, H]`` and the ``GRUSequence`` of each (layer, direction)."""


class GRUStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``gru_stack``."""

    x: Array
    h0: Array
    weights: list


class GRUBackend(Protocol):
    def gru_cell(self, x, h_prev, weights: GRUWeights, settings: GRUSettings) -> GRUCellState: ...

    def gru_cell_grad(self, x, h_prev, weights: GRUWeights, state: GRUCellState,
                      settings: GRUSettings, *, d_r=None, d_u=None, d_c=None,
                      d_h=None) -> GRUCellGrads: ...

    def gru_sequence(self, x, h0, weights: GRUWeights, settings: GRUSettings) -> GRUSequence: ...

    def gru_sequence_grad(self, x, h0, weights: GRUWeights, seq: GRUSequence,
                          settings: GRUSettings, *, d_r=None, d_u=None, d_c=None,
                          d_h=None, d_h_final=None) -> GRUSequenceGrads: ...

    def gru_cell_jvp(self, x, h_prev, weights: GRUWeights, tangents: GRUCellGrads,
                     settings: GRUSettings) -> tuple[GRUCellState, GRUCellState]: ...

    def gru_sequence_jvp(self, x, h0, weights: GRUWeights, tangents: GRUSequenceGrads,
                         settings: GRUSettings) -> tuple[GRUSequence, GRUSequence]: ...

    def gru_cell_grad_jvp(self, x, h_prev, weights: GRUWeights, state: GRUCellState,
                          tangents: GRUCellGrads, settings: GRUSettings, *, d_r=None,
                          d_u=None, d_c=None, d_h=None, d_r_tangent=None,
                          d_u_tangent=None, d_c_tangent=None, d_h_tangent=None
                          ) -> tuple[GRUCellGrads, GRUCellGrads]: ...

    def gru_sequence_grad_jvp(self, x, h0, weights: GRUWeights, seq: GRUSequence,
                              tangents: GRUSequenceGrads, settings: GRUSettings, *,
                              d_r=None, d_u=None, d_c=None, d_h=None, d_h_final=None,
                              d_r_tangent=None, d_u_tangent=None, d_c_tangent=None,
                              d_h_tangent=None, d_h_final_tangent=None
                              ) -> tuple[GRUSequenceGrads, GRUSequenceGrads]: ...


WEIGHT_LABELS: dict[str, Labels] = {
    "w_ru": ("I+H", "2H"), "w_c": ("I+H", "H"), "b_ru": ("2H",), "b_c": ("C",)}
"""The shape labels of every weight (``C``: ``H``, or ``2H`` reset-after)."""


DOCS: dict[str, str] = {
    "gru_cell": """
        One step of TensorFlow's GRU block cell.

        Shapes: ``x [B, I]``, ``h_prev [B, H]``, ``w_ru [I+H, 2H]`` (r then u), ``w_c [I+H, H]``,
        ``b_ru [2H]``, ``b_c [H]`` (``[2H]`` with ``reset_after=True``).

            [r, u] = σ([x, h_prev]·w_ru + b_ru);   c = tanh([x, r∘h_prev]·w_c + b_c)
            h = u∘h_prev + (1-u)∘c
            reset_after:  c = tanh(x·W_cx + b_cx + r∘(h_prev·W_ch + b_ch))

        Returns ``GRUCellState(r, u, c, h)``, each ``[B, H]``, recording ``reset_after``.""",
    "gru_cell_jvp": """
        Forward mode of ``gru_cell`` (docs/spec.md §12): the step and its directional
        derivative along ``tangents``, a ``GRUCellGrads`` of the inputs' tangents (None:
        zero), each with its input's shape, library and dtype.

            d[r_pre, u_pre] = [dx, dh_prev]·w_ru + [x, h_prev]·dw_ru + db_ru
            dc = (1-c²)∘dc_pre;   dh = du∘(h_prev - c) + u∘dh_prev + (1-u)∘dc

        Returns ``(state, d_state)``: ``gru_cell``'s ``GRUCellState`` and one of its tangents.""",
    "gru_cell_grad": """
        Gradient of ``gru_cell`` with respect to every input, given the forward's ``state``
        and the upstream gradients of every field of it (docs/spec.md §16.1), each ``[B, H]``
        and optional (None: zeros): ``d_h`` of ``h`` and ``d_r``, ``d_u``, ``d_c`` of the
        gates themselves. Each gate's joins its pre-activation's gradient:

            dc_bar = (d_h∘(1-u) + d_c)∘(1-c²)          (the candidate's pre-activation)
            du_bar = (d_h∘(h_prev-c) + d_u)∘u(1-u)
            dr_bar = (d_hr∘h_prev + d_r)∘r(1-r),  d_hr = dL/d(r∘h_prev) = (dc_bar·w_cᵀ)[:, I:]
            reset_after:  dr_bar = (dc_bar∘n + d_r)∘r(1-r),  n = h_prev·W_ch + b_ch

        and flows on as ``h``'s does: ``[dr_bar, du_bar]`` through ``w_ru``, ``dc_bar``
        through ``w_c`` (reset after, ``dc_bar∘r`` through ``W_ch``).

        ``reset_after`` is the forward's, as ``state`` records it (None: the record's; for a
        tuple built by hand, False); a contradicting value raises ``ValueError``.

        Returns ``GRUCellGrads(x, h_prev, w_ru, w_c, b_ru, b_c)``.""",
    "gru_cell_grad_jvp": """
        Second order: the JVP of ``gru_cell_grad`` along ``tangents`` (a ``GRUCellGrads``)
        and the upstream gradients' tangents ``d_r_tangent``, ``d_u_tangent``,
        ``d_c_tangent``, ``d_h_tangent`` (None: zero), as ``lstm_cell_grad_jvp``. Returns
        ``(grads, grads_tangent)``.""",
    "gru_sequence": """
        The GRU block cell (``gru_cell``) run over ``x [T, B, I]`` from ``h0 [B, H]``.

        Weights as for ``gru_cell`` (``b_c [2H]`` with ``reset_after=True``); ``seq_len``,
        ``reverse``, ``batch_first`` and the masks (no ``zoneout_cs``) as for ``lstm_sequence``.

            for t in 0..T-1:   (r, u, c, h)[t] = gru_cell(x[t], h, w_ru, w_c, b_ru, b_c, ...)

        Returns ``GRUSequence(r, u, c, h, h_final)``: steps ``[T, B, H]``, final state ``[B, H]``,
        recording ``reset_after`` and ``seq_len``.""",
    "gru_sequence_jvp": """
        Forward mode of ``gru_sequence`` (docs/spec.md §12): the sequence and its
        directional derivative along ``tangents``, a ``GRUSequenceGrads`` of the inputs'
        tangents (None: zero), as for ``lstm_sequence_jvp``; each step's is ``gru_cell_jvp``'s.

        Returns ``(seq, d_seq)``: ``gru_sequence``'s result and a ``GRUSequence`` of tangents.""",
    "gru_sequence_grad": """
        Backpropagation through time for ``gru_sequence``, given its result ``seq``.

        Upstream gradients of every field of ``seq`` (docs/spec.md §16.1; each optional,
        None meaning zeros): ``d_r``, ``d_u``, ``d_c``, ``d_h [T, B, H]`` for every step's
        gates and ``h``, ``d_h_final [B, H]`` for the final state. Per step, a gate's own
        gradient joins its pre-activation's gradient as in ``gru_cell_grad`` (``dc_bar =
        (dh∘(1-u) + d_c)∘(1-c²)``, ``du_bar = (dh∘(h_prev-c) + d_u)∘u(1-u)``, ``dr_bar =
        (d_hr∘h_prev + d_r)∘r(1-r)``, reset after ``(dc_bar∘n + d_r)∘r(1-r)``), ``dh`` the
        gradient of the step's state; zoneout splits ``dh`` only (the gates are the step's
        own). ``reset_after``, ``seq_len``, ``reverse``, ``batch_first`` and the masks are
        the forward's, as ``seq`` records them (a contradicting value raises ``ValueError``;
        for a ``seq`` that records nothing, ``reset_after`` None means False). Entries of
        ``x`` and of the per-step upstream gradients past a row's length are never read.

        Returns ``GRUSequenceGrads(x, h0, w_ru, w_c, b_ru, b_c)``.""",
    "gru_sequence_grad_jvp": """
        Second order: the JVP of ``gru_sequence_grad`` along ``tangents`` (a
        ``GRUSequenceGrads``) and the upstream gradients' tangents (``d_r_tangent``,
        ``d_u_tangent``, ``d_c_tangent``, ``d_h_tangent``, ``d_h_final_tangent``; None:
        zero), as ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "gru_stack": """
        A stack of GRU layers, as ``lstm_stack`` (``h0 [L·D, B, H]``); ``reset_after``
        defaults to True, PyTorch's and Keras's GRU. Returns ``GRUStack(h, h_final, layers)``.""",
    "gru_stack_jvp": """
        Forward mode of ``gru_stack``, as ``lstm_stack_jvp`` (``tangents`` a
        ``GRUStackGrads``). Returns ``(stack, d_stack)``.""",
    "gru_stack_grad": """
        Backpropagation through ``gru_stack``, as ``lstm_stack_grad``. Returns
        ``GRUStackGrads(x, h0, weights)``.""",
    "gru_stack_grad_jvp": """
        Second order: the JVP of ``gru_stack_grad``, as ``lstm_stack_grad_jvp``.""",
}
"""The public functions' docstrings: their contracts and math (``gradcells._public``
makes the functions)."""


CELL = CellSpec(
    "gru",
    OpSpec("gru_cell", False, ("h_prev",), GRUWeights, GRUSettings, GRUCellState,
           GRUCellGrads, ("d_r", "d_u", "d_c", "d_h")),
    OpSpec("gru_sequence", True, ("h0",), GRUWeights, GRUSettings, GRUSequence,
           GRUSequenceGrads, ("d_r", "d_u", "d_c", "d_h", "d_h_final")),
    StackSpec(GRUStack, GRUStackGrads, {"reset_after": True}),
    keywords=(Keyword("reset_after", False, "bool", "bool"),),
    weight_labels=WEIGHT_LABELS, protocol=GRUBackend, docs=DOCS)
"""The GRU, as the registry (``gradcells.cells``) reads it. Its stack defaults to
reset-after, PyTorch's and Keras's GRU; its cell and sequence to TensorFlow's block cell."""
