"""xLSTM's sLSTM declarations (docs/spec.md §19; Beck et al. 2024, NX-AI/xlstm's vanilla
backend): exponential input gate, sigmoid or exponential forget gate, the stabiliser ``m``,
block-diagonal recurrent weights per head. Its types, its keywords, its shapes, its public
functions' contracts; its math is ``reference.py``, its kernels ``cpu.py`` and ``gpu.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.specs import CellSpec, Keyword, Labels, OpSpec, StackSpec
from ..._core.types import Array, Recorded

__all__ = [
    "SLSTMSettings", "SLSTMWeights", "SLSTMCellState", "SLSTMCellGrads", "SLSTMSequence",
    "SLSTMSequenceGrads", "SLSTMStack", "SLSTMStackGrads"]
"""The cell's public types (``gradcells`` exports them)."""


@dataclass(frozen=True, eq=False)
class SLSTMSettings:
    """What an sLSTM forward was computed with: ``forget`` ("sigmoid": the log forget gate
    is ``log σ(f̃)``; "exp": it is ``f̃``), ``stabilizer_grad`` ("exact": the stabiliser
    ``m`` differentiated as computed; "stop": held constant, xLSTM's CUDA backward),
    ``seq_len``, ``reverse``, ``batch_first`` and the masks ``input_mask`` and
    ``recurrent_mask`` (as for ``LSTMSettings``; the sLSTM takes no zoneout)."""

    forget: str = "sigmoid"
    stabilizer_grad: str = "exact"
    seq_len: Array | None = None
    reverse: bool = False
    batch_first: bool = False
    input_mask: Array | None = None
    recurrent_mask: Array | None = None


class SLSTMWeights(NamedTuple):
    """One sLSTM cell's parameters: ``w [I, 4H]`` (input weights, gate-major columns: blocks
    i, f, z, o of width H), ``r [N, H/N, 4H/N]`` (the recurrent weights of each of N heads:
    head k's ``h[:, k·H/N:(k+1)·H/N]·r[k]`` gives its four gate blocks, gate-major, landing at
    columns ``g·H + k·H/N + j``) and ``b [4H]``."""

    w: Array
    r: Array
    b: Array


class _SLSTMCellState(NamedTuple):
    i: Array
    f: Array
    z: Array
    o: Array
    c: Array
    n: Array
    m: Array
    h: Array


class SLSTMCellState(Recorded, _SLSTMCellState):
    """Outputs of one sLSTM step, each ``[B, H]``: the stabilised gates ``i, f``,
    ``z = tanh(z̃)``, ``o = σ(õ)`` and the new state ``c, n, m, h``."""


class SLSTMCellGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``slstm_cell``."""

    x: Array
    c_prev: Array
    n_prev: Array
    m_prev: Array
    h_prev: Array
    w: Array
    r: Array
    b: Array


class _SLSTMSequence(NamedTuple):
    i: Array
    f: Array
    z: Array
    o: Array
    c: Array
    n: Array
    m: Array
    h: Array
    c_final: Array
    n_final: Array
    m_final: Array
    h_final: Array


class SLSTMSequence(Recorded, _SLSTMSequence):
    """Every step's sLSTM outputs ``[T, B, H]`` and the final states ``[B, H]``."""


class SLSTMSequenceGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``slstm_sequence``."""

    x: Array
    c0: Array
    n0: Array
    m0: Array
    h0: Array
    w: Array
    r: Array
    b: Array


class _SLSTMStack(NamedTuple):
    h: Array
    c_final: Array
    n_final: Array
    m_final: Array
    h_final: Array
    layers: tuple


class SLSTMStack(Recorded, _SLSTMStack):
    """An sLSTM stack's top-layer outputs ``h [T, B, D·H]``, the final states
    ``c_final, n_final, m_final, h_final [L·D, B, H]`` and the ``SLSTMSequence`` of each
    (layer, direction)."""


class SLSTMStackGrads(NamedTuple):
    """Gradient of the loss with respect to every input of ``slstm_stack``."""

    x: Array
    c0: Array
    n0: Array
    m0: Array
    h0: Array
    weights: list


class SLSTMBackend(Protocol):
    def slstm_cell(self, x, c_prev, n_prev, m_prev, h_prev, weights: SLSTMWeights,
                   settings: SLSTMSettings) -> SLSTMCellState: ...

    def slstm_cell_grad(self, x, c_prev, n_prev, m_prev, h_prev, weights: SLSTMWeights,
                        state: SLSTMCellState, settings: SLSTMSettings, *, d_h=None,
                        d_c=None, d_n=None, d_m=None, d_i=None, d_f=None, d_z=None,
                        d_o=None) -> SLSTMCellGrads: ...

    def slstm_sequence(self, x, c0, n0, m0, h0, weights: SLSTMWeights,
                       settings: SLSTMSettings) -> SLSTMSequence: ...

    def slstm_sequence_grad(self, x, c0, n0, m0, h0, weights: SLSTMWeights,
                            seq: SLSTMSequence, settings: SLSTMSettings, *, d_h=None,
                            d_c=None, d_n=None, d_m=None, d_h_final=None, d_c_final=None,
                            d_n_final=None, d_m_final=None, d_i=None, d_f=None, d_z=None,
                            d_o=None) -> SLSTMSequenceGrads: ...

    def slstm_cell_jvp(self, x, c_prev, n_prev, m_prev, h_prev, weights: SLSTMWeights,
                       tangents: SLSTMCellGrads, settings: SLSTMSettings
                       ) -> tuple[SLSTMCellState, SLSTMCellState]: ...

    def slstm_sequence_jvp(self, x, c0, n0, m0, h0, weights: SLSTMWeights,
                           tangents: SLSTMSequenceGrads, settings: SLSTMSettings
                           ) -> tuple[SLSTMSequence, SLSTMSequence]: ...

    def slstm_cell_grad_jvp(self, x, c_prev, n_prev, m_prev, h_prev, weights: SLSTMWeights,
                            state: SLSTMCellState, tangents: SLSTMCellGrads,
                            settings: SLSTMSettings, *, d_h=None, d_c=None, d_n=None,
                            d_m=None, d_i=None, d_f=None, d_z=None, d_o=None,
                            d_h_tangent=None, d_c_tangent=None, d_n_tangent=None,
                            d_m_tangent=None, d_i_tangent=None, d_f_tangent=None,
                            d_z_tangent=None, d_o_tangent=None
                            ) -> tuple[SLSTMCellGrads, SLSTMCellGrads]: ...

    def slstm_sequence_grad_jvp(self, x, c0, n0, m0, h0, weights: SLSTMWeights,
                                seq: SLSTMSequence, tangents: SLSTMSequenceGrads,
                                settings: SLSTMSettings, *, d_h=None, d_c=None, d_n=None,
                                d_m=None, d_h_final=None, d_c_final=None, d_n_final=None,
                                d_m_final=None, d_i=None, d_f=None, d_z=None, d_o=None,
                                d_h_tangent=None, d_c_tangent=None, d_n_tangent=None,
                                d_m_tangent=None, d_h_final_tangent=None,
                                d_c_final_tangent=None, d_n_final_tangent=None,
                                d_m_final_tangent=None, d_i_tangent=None, d_f_tangent=None,
                                d_z_tangent=None, d_o_tangent=None
                                ) -> tuple[SLSTMSequenceGrads, SLSTMSequenceGrads]: ...


FORGETS = ("sigmoid", "exp")
"""The sLSTM's forget gates: ``log f = log σ(f̃)`` or ``log f = f̃``."""

STABILIZER_GRADS = ("exact", "stop")
"""How the gradient treats the stabiliser ``m``: differentiated (the max's branch taken, a
tie to ĩ) or held constant (xLSTM's CUDA backward)."""

STATE_FIELDS: tuple[str, ...] = ("c", "n", "m", "h")
"""The state, in argument order."""

GATE_FIELDS: tuple[str, ...] = ("i", "f", "z", "o")
"""The gate fields of a result, each with an upstream gradient ``d_<field>`` (§16.1)."""

WEIGHT_LABELS: dict[str, Labels] = {"w": ("I", "4H"), "r": ("N", "H/N", "4H/N"),
                                    "b": ("4H",)}
"""The shape labels of every weight (``N``: the heads, read from ``r``)."""

_STEP = """
            (ĩ, f̃, z̃, õ) = x·w + (h_prev per head)·r + b
            lf = log σ(f̃)  (forget="sigmoid"),   lf = f̃  (forget="exp")
            m = max(ĩ, lf + m_prev);   i = exp(ĩ - m);   f = exp(lf + m_prev - m)
            z = tanh(z̃);   o = σ(õ);   c = f∘c_prev + i∘z;   n = f∘n_prev + i;   h = o∘c/n"""

DOCS: dict[str, str] = {
    "slstm_cell": f"""
        One step of xLSTM's sLSTM cell (docs/spec.md §19; Beck et al. 2024).

        Shapes: ``x [B, I]``, ``c_prev, n_prev, m_prev, h_prev [B, H]``, ``w [I, 4H]``
        (gate-major blocks i, f, z, o), ``r [N, H/N, 4H/N]`` (N heads, H divisible by N),
        ``b [4H]``.
{_STEP}

        ``forget`` "sigmoid" or "exp"; ``stabilizer_grad`` "exact" or "stop" (how the
        gradient treats ``m``, recorded for it).

        Returns ``SLSTMCellState(i, f, z, o, c, n, m, h)``, ``[B, H]`` each, recording its
        settings.""",
    "slstm_cell_jvp": """
        Forward mode of ``slstm_cell`` (docs/spec.md §12): the step and its directional
        derivative along ``tangents`` (an ``SLSTMCellGrads`` of the inputs' tangents, None:
        zero). With ``stabilizer_grad="stop"`` the tangent of ``m`` is zero (``m`` held
        constant), as the gradient holds it.

        Returns ``(state, d_state)``.""",
    "slstm_cell_grad": """
        Gradient of ``slstm_cell`` with respect to every input, given the forward's ``state``
        and the upstream gradients of its fields (docs/spec.md §16.1; each keyword-only,
        None: zeros): ``d_h``, ``d_c``, ``d_n``, ``d_m`` and the gates' ``d_i``, ``d_f``,
        ``d_z``, ``d_o``. With ``gc``, ``gn`` the gradients of ``c``, ``n``:

            gc = d_c + d_h∘o/n;   gn = d_n - d_h∘h/n;   dõ = (d_o + d_h∘c/n)∘o(1-o)
            gi = d_i + gc∘z + gn;   gf = d_f + gc∘c_prev + gn∘n_prev;   dz̃ = (d_z + gc∘i)∘(1-z²)
            gm = d_m - gi∘i - gf∘f        (stabilizer_grad="exact"; "stop": gm = 0)
            dĩ = gi∘i + [ĩ branch]∘gm;   dlf = gf∘f + [lf branch]∘gm
            dm_prev = gf∘f + [lf branch]∘gm   ("stop": 0)
            df̃ = dlf∘(1 - σ(f̃)) (sigmoid),  dlf (exp);   dc_prev = gc∘f;   dn_prev = gn∘f

        The branch of ``m = max(ĩ, lf + m_prev)`` is the one taken, a tie going to ``ĩ``.

        Returns ``SLSTMCellGrads(x, c_prev, n_prev, m_prev, h_prev, w, r, b)``.""",
    "slstm_cell_grad_jvp": """
        Second order: the JVP of ``slstm_cell_grad`` along ``tangents`` (an
        ``SLSTMCellGrads``) and the upstream gradients' tangents ``d_h_tangent``, ...,
        ``d_o_tangent``, as ``lstm_cell_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "slstm_sequence": f"""
        The sLSTM cell (``slstm_cell``) run over ``x [T, B, I]`` from ``c0, n0, m0, h0
        [B, H]``.

        Weights as for ``slstm_cell``; ``seq_len``, ``reverse``, ``batch_first``,
        ``input_mask`` and ``recurrent_mask`` as for ``lstm_sequence`` (no zoneout).

            for t in 0..T-1:
{_STEP}

        Returns ``SLSTMSequence(i, f, z, o, c, n, m, h, c_final, n_final, m_final,
        h_final)``: steps ``[T, B, H]`` (zero past a row's length), final states ``[B, H]``,
        recording its settings.""",
    "slstm_sequence_jvp": """
        Forward mode of ``slstm_sequence`` (docs/spec.md §12): the sequence and its
        directional derivative along ``tangents`` (an ``SLSTMSequenceGrads``, None: zero);
        each step's is ``slstm_cell_jvp``'s. Returns ``(seq, d_seq)``.""",
    "slstm_sequence_grad": """
        Backpropagation through time for ``slstm_sequence``, given its result ``seq``.

        Upstream gradients (each keyword-only and optional, None meaning zeros): ``d_h``,
        ``d_c``, ``d_n``, ``d_m``, ``d_i``, ``d_f``, ``d_z``, ``d_o [T, B, H]`` for the
        per-step fields and ``d_h_final``, ``d_c_final``, ``d_n_final``, ``d_m_final
        [B, H]`` for the final states; each step as ``slstm_cell_grad``, the state's
        gradients carried back. ``forget``, ``stabilizer_grad``, ``seq_len``, ``reverse``,
        ``batch_first`` and the masks are the forward's, as ``seq`` records them (a
        contradicting value raises ``ValueError``). With ``stabilizer_grad="stop"`` ``m`` is
        held constant: the gradient of a loss on ``h`` alone is unchanged but for ``m0``'s
        (zero); a loss on the returned ``c``, ``n`` or ``m`` gets xLSTM's CUDA backward.

        Returns ``SLSTMSequenceGrads(x, c0, n0, m0, h0, w, r, b)``.""",
    "slstm_sequence_grad_jvp": """
        Second order: the JVP of ``slstm_sequence_grad`` along ``tangents`` (an
        ``SLSTMSequenceGrads``) and the upstream gradients' tangents, as
        ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``.""",
    "slstm_stack": """
        A stack of sLSTM layers, as ``lstm_stack`` (``c0, n0, m0, h0 [L·D, B, H]``). Returns
        ``SLSTMStack(h, c_final, n_final, m_final, h_final, layers)``.""",
    "slstm_stack_jvp": """
        Forward mode of ``slstm_stack``, as ``lstm_stack_jvp`` (``tangents`` an
        ``SLSTMStackGrads``). Returns ``(stack, d_stack)``.""",
    "slstm_stack_grad": """
        Backpropagation through ``slstm_stack``, as ``lstm_stack_grad``. Returns
        ``SLSTMStackGrads(x, c0, n0, m0, h0, weights)``.""",
    "slstm_stack_grad_jvp": """
        Second order: the JVP of ``slstm_stack_grad``, as ``lstm_stack_grad_jvp``.""",
}
"""The public functions' docstrings: their contracts and math (``gradcells._public``
makes the functions)."""

_UPSTREAM = ("d_h", "d_c", "d_n", "d_m")
_GATE_UPSTREAM = tuple(f"d_{name}" for name in GATE_FIELDS)

CELL = CellSpec(
    "slstm",
    OpSpec("slstm_cell", False, ("c_prev", "n_prev", "m_prev", "h_prev"), SLSTMWeights,
           SLSTMSettings, SLSTMCellState, SLSTMCellGrads, (*_UPSTREAM, *_GATE_UPSTREAM)),
    OpSpec("slstm_sequence", True, ("c0", "n0", "m0", "h0"), SLSTMWeights, SLSTMSettings,
           SLSTMSequence, SLSTMSequenceGrads,
           (*_UPSTREAM, *(f"{d}_final" for d in _UPSTREAM), *_GATE_UPSTREAM)),
    StackSpec(SLSTMStack, SLSTMStackGrads),
    keywords=(Keyword("forget", "sigmoid", "str", "choice", FORGETS),
              Keyword("stabilizer_grad", "exact", "str", "choice", STABILIZER_GRADS)),
    masks=("input_mask", "recurrent_mask"),
    weight_labels=WEIGHT_LABELS, protocol=SLSTMBackend, docs=DOCS)
"""The sLSTM, as the registry (``gradcells.cells``) reads it."""
