"""The LSTM's declarations (docs/spec.md §2-§4, §9): TensorFlow's block cell with peepholes,
a projection (LSTMP) and a layer norm. Its types, its keywords, its shapes, its public
functions' contracts; its math is ``reference.py``, its kernels ``cpu.py`` and ``gpu.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..._core.specs import CellSpec, Keyword, Labels, OpSpec, StackSpec
from ..._core.types import Array, Recorded

__all__ = [
    "LSTMSettings", "LSTMNorm", "LSTMWeights", "LSTMCellState", "LSTMCellGrads",
    "LSTMSequence", "LSTMSequenceGrads", "LSTMStack", "LSTMStackGrads"]
"""The cell's public types (``gradcells`` exports them)."""


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


class _LSTMCellState(NamedTuple):
    i: Array
    cs: Array
    f: Array
    o: Array
    ci: Array
    co: Array
    h: Array


class LSTMCellState(Recorded, _LSTMCellState):
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


class LSTMSequence(Recorded, _LSTMSequence):
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


class _LSTMStack(NamedTuple):
    h: Array
    cs_final: Array
    h_final: Array
    layers: tuple


class LSTMStack(Recorded, _LSTMStack):
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


class LSTMBackend(Protocol):
    def lstm_cell(self, x, cs_prev, h_prev, weights: LSTMWeights,
                  settings: LSTMSettings) -> LSTMCellState: ...

    def lstm_cell_grad(self, x, cs_prev, h_prev, weights: LSTMWeights, state: LSTMCellState,
                       settings: LSTMSettings, *, d_h=None, d_cs=None, d_i=None, d_f=None,
                       d_o=None, d_ci=None, d_co=None,
                       clip_grad="exact") -> LSTMCellGrads: ...

    def lstm_sequence(self, x, cs0, h0, weights: LSTMWeights,
                      settings: LSTMSettings) -> LSTMSequence: ...

    def lstm_sequence_grad(self, x, cs0, h0, weights: LSTMWeights, seq: LSTMSequence,
                           settings: LSTMSettings, *, d_h=None, d_cs=None, d_h_final=None,
                           d_cs_final=None, d_i=None, d_f=None, d_o=None, d_ci=None,
                           d_co=None, clip_grad="exact") -> LSTMSequenceGrads: ...

    def lstm_cell_jvp(self, x, cs_prev, h_prev, weights: LSTMWeights, tangents: LSTMCellGrads,
                      settings: LSTMSettings) -> tuple[LSTMCellState, LSTMCellState]: ...

    def lstm_sequence_jvp(self, x, cs0, h0, weights: LSTMWeights, tangents: LSTMSequenceGrads,
                          settings: LSTMSettings) -> tuple[LSTMSequence, LSTMSequence]: ...

    def lstm_cell_grad_jvp(self, x, cs_prev, h_prev, weights: LSTMWeights,
                           state: LSTMCellState, tangents: LSTMCellGrads,
                           settings: LSTMSettings, *, d_h=None, d_cs=None, d_i=None,
                           d_f=None, d_o=None, d_ci=None, d_co=None, d_h_tangent=None,
                           d_cs_tangent=None, d_i_tangent=None, d_f_tangent=None,
                           d_o_tangent=None, d_ci_tangent=None, d_co_tangent=None,
                           clip_grad="exact") -> tuple[LSTMCellGrads, LSTMCellGrads]: ...

    def lstm_sequence_grad_jvp(self, x, cs0, h0, weights: LSTMWeights, seq: LSTMSequence,
                               tangents: LSTMSequenceGrads, settings: LSTMSettings, *,
                               d_h=None, d_cs=None, d_h_final=None, d_cs_final=None,
                               d_i=None, d_f=None, d_o=None, d_ci=None, d_co=None,
                               d_h_tangent=None, d_cs_tangent=None, d_h_final_tangent=None,
                               d_cs_final_tangent=None, d_i_tangent=None, d_f_tangent=None,
                               d_o_tangent=None, d_ci_tangent=None, d_co_tangent=None,
                               clip_grad="exact"
                               ) -> tuple[LSTMSequenceGrads, LSTMSequenceGrads]: ...


GATE_FIELDS: tuple[str, ...] = tuple(name for name in _LSTMCellState._fields
                                     if name not in ("cs", "h"))
"""The gate activations of a result, ``("i", "f", "o", "ci", "co")``: each can carry an
upstream gradient ``d_<field>`` (docs/spec.md §16.1), as ``h`` and ``cs`` can."""

GATE_UPSTREAM: tuple[str, ...] = tuple(f"d_{name}" for name in GATE_FIELDS)
"""Their upstream gradients' keywords, ``("d_i", "d_f", "d_o", "d_ci", "d_co")``."""

PEEPHOLES: tuple[str, ...] = LSTMWeights._fields[2:5]
"""The peephole vectors ``("wci", "wcf", "wco")``: all three or none."""

NORM_FIELDS: tuple[str, ...] = LSTMNorm._fields
"""The layer-normalised LSTM's parameters, fields of ``layer_norm`` (an ``LSTMNorm``)."""

NORM_ARRAYS: tuple[str, ...] = tuple(f"layer_norm.{name}" for name in NORM_FIELDS)
"""Their names as arrays of a call: ``layer_norm.gamma_x``, ..."""

OPTIONAL_WEIGHTS: tuple[str, ...] = LSTMWeights._fields[2:] + NORM_ARRAYS
"""The weights a call may leave out (None): the peepholes, the projection and the layer
norm (``layer_norm``, whose six arrays are then absent too)."""

LN_CARRIES = ("raw", "normalized")
"""Which cell state a layer-normalised LSTM carries: ``c̃`` (Ba et al.) or ``LN(c̃)`` (TF
Addons)."""

CLIP_GRADS = ("exact", "straight_through")
"""How a gradient passes an active clip: zero (the true gradient) or unchanged (TF's)."""

WEIGHT_LABELS: dict[str, Labels] = {
    "w": ("I+P", "4H"), "b": ("4H",), "wci": ("H",), "wcf": ("H",), "wco": ("H",),
    "w_proj": ("H", "P"), **{name: ("4H",) for name in NORM_ARRAYS[:4]},
    **{name: ("H",) for name in NORM_ARRAYS[4:]}}
"""The shape labels of every weight (``gradcells._core.specs``)."""


DOCS: dict[str, str] = {
    "lstm_cell": """
        One step of TensorFlow's LSTM block cell (gate layout i, ci, f, o), with an optional
        projection (LSTMP: PyTorch's ``proj_size``, TF1's ``num_proj``).

        Shapes: ``x [B, I]``, ``cs_prev [B, H]``, ``h_prev [B, P]``, ``w [I+P, 4H]``, ``b [4H]``,
        peepholes ``wci, wcf, wco [H]`` (all or none), ``w_proj [H, P]`` (None: no projection,
        P = H). ``cell_clip``, ``proj_clip`` None, 0 or negative: no clipping.

            G = [x, h_prev]·w + b;   i = σ(Gi + cs_prev∘wci);   ci = tanh(Gc)
            f = σ(Gf + forget_bias + cs_prev∘wcf);   cs = clip(i∘ci + f∘cs_prev)
            co = tanh(cs);   o = σ(Go + cs∘wco);   m = o∘co
            h = m   (no projection),   h = clip(m·w_proj, ±proj_clip)   (projection)

        ``layer_norm=LSTMNorm(gamma_x, beta_x, gamma_h, beta_h, gamma_c, beta_c)`` (``[4H]``
        four times, then ``[H]`` twice) makes it the layer-normalised LSTM (docs/spec.md §9.2),
        each LN over its row with biased variance and ``ln_epsilon``:

            G = LN(x·w_x; γ_x, β_x) + LN(h_prev·w_h; γ_h, β_h) + b     (w_x, w_h: w's rows)
            c̃ = clip(i∘ci + f∘cs_prev);   n = LN(c̃; γ_c, β_c);   co = tanh(n)
            cs = c̃ (ln_carry="raw", Ba et al.)  or  n ("normalized", TF Addons)

        Returns ``LSTMCellState(i, cs, f, o, ci, co, h)``, ``[B, H]`` each but ``h [B, P]``,
        recording its settings (``forget_bias``, ``cell_clip``, ``proj_clip``, ``ln_epsilon``,
        ``ln_carry``, whether peepholes, a projection and a layer norm were given).""",
    "lstm_cell_jvp": """
        Forward mode of ``lstm_cell`` (docs/spec.md §12): the step and its directional
        derivative along ``tangents``.

        ``tangents`` is an ``LSTMCellGrads`` of the inputs' tangents, each with its input's
        shape, library and dtype (None: zero; ``layer_norm`` an ``LSTMNorm``, or None); None
        for all of them zero. Arguments and keywords are ``lstm_cell``'s. The tangents of the
        gates follow their chain rule (``gradcells.cells.lstm.reference.lstm_activations_jvp``),
        exact through an active clip: zero there, as the exact gradient is.

        Returns ``(state, d_state)``: ``lstm_cell``'s ``LSTMCellState`` and one of the tangents
        of its fields.""",
    "lstm_cell_grad": """
        Gradient of ``lstm_cell`` with respect to every input, given the forward's ``state``
        and the upstream gradients of its fields (docs/spec.md §16.1; each keyword-only,
        None: zeros, ``[B, H]`` as its field, ``d_h [B, P]``): ``d_h``, ``d_cs`` and the
        gates' ``d_i``, ``d_f``, ``d_o``, ``d_ci``, ``d_co``. Each gate's enters where its
        pre-activation's gradient is formed, through its activation (σ' = σ(1-σ),
        tanh' = 1-tanh²; ``dcs`` the clipped state's gradient, before the clip's mask):

            dGo = (d_h∘co + d_o)∘o(1-o);   dcs = (d_h∘o + d_co)∘(1-co²) + d_cs + dGo∘wco
            dGi = (dcs∘ci + d_i)∘i(1-i);   dGc = (dcs∘i + d_ci)∘(1-ci²)
            dGf = (dcs∘cs_prev + d_f)∘f(1-f)

        With a layer norm ``(d_h∘o + d_co)∘(1-co²)`` is the gradient of ``n = LN(c̃)``, taken
        through the norm's backward (§9.2).

        ``cell_clip``, ``proj_clip``, ``ln_epsilon``, ``ln_carry``, the peepholes, the
        projection and the layer norm are the forward's, as ``state`` records them; passing a
        setting again is allowed, a contradicting value raises ``ValueError``, and so do
        peepholes, a projection or a layer norm missing (or extra) against the record. For a
        ``state`` that records nothing (a tuple built by hand), the keywords are as for
        ``lstm_cell``.

        ``clip_grad="exact"`` (default) is the true gradient: zero through a clip (the cell's or
        the projection's) where it was active. ``"straight_through"`` passes it unchanged, as
        TensorFlow's ops do. With a projection, ``d_h`` is ``[B, P]`` and the gradient gains
        ``w_proj = mᵀ·dh_raw`` (docs/spec.md §9.1); with a layer norm, ``layer_norm``, an
        ``LSTMNorm`` of the six parameters' gradients (§9.2).

        Returns ``LSTMCellGrads(x, cs_prev, h_prev, w, b, wci, wcf, wco, w_proj, layer_norm)``
        (None for what was not given).""",
    "lstm_cell_grad_jvp": """
        Second order (docs/spec.md §12): the JVP of ``lstm_cell_grad`` in all its array
        inputs, along ``tangents`` (an ``LSTMCellGrads`` of the inputs' tangents, as for
        ``lstm_cell_jvp``) and the upstream gradients' tangents ``d_h_tangent``,
        ``d_cs_tangent``, ``d_i_tangent``, ``d_f_tangent``, ``d_o_tangent``,
        ``d_ci_tangent``, ``d_co_tangent`` (None: zero). Arguments and keywords are
        ``lstm_cell_grad``'s; the saved ``state`` moves with the inputs, by
        ``lstm_cell_jvp``.

        With the upstream gradients of a loss and their tangents its Hessian applied to
        the state's tangent, the second result is the Hessian-vector product of the loss; by
        the symmetry of second derivatives it is also the double backward.

        Returns ``(grads, grads_tangent)``: ``lstm_cell_grad``'s result and its tangent.""",
    "lstm_sequence": """
        The LSTM block cell (``lstm_cell``) run over ``x [T, B, I]`` from ``cs0 [B, H]`` and
        ``h0 [B, P]``.

        ``w [I+P, 4H]`` and ``b [4H]`` in gate order i, ci, f, o; peepholes ``wci, wcf, wco [H]``
        (all or none); ``w_proj [H, P]`` and ``proj_clip``, ``layer_norm``, ``ln_epsilon`` and
        ``ln_carry`` as for ``lstm_cell`` (None: P = H; no layer norm).
        ``seq_len [B]``: optional integer lengths in [0, T] (an array or a list);
        for ``t >= seq_len[b]`` row b's outputs are zero and its state is frozen (PyTorch
        packed-sequence semantics), and ``x[t, b]`` is never read (padding may hold anything,
        NaN included).

            for t in 0..T-1:   (i, cs, f, o, ci, co, h)[t] = lstm_cell(x[t], cs, h, w, b, ...)

        ``reverse=True`` runs each row over its own valid steps from last to first (PyTorch's
        packed reverse direction; outputs stay at their time positions, the final states are
        those after time 0); ``batch_first=True`` takes and returns ``[B, T, ·]`` per-step
        arrays (docs/spec.md §11.1, §11.2). The masks (§11.3; None: none) are arrays of ``x``'s
        dtype, constants to the gradient: ``input_mask`` (broadcast to ``x``) multiplies the
        input, ``recurrent_mask [B, P]`` the state the recurrent matmul reads,
        ``zoneout_cs``/``zoneout_h`` (broadcast to ``[T, B, H]``/``[T, B, P]``) mix each new
        state with the old, ``z∘old + (1-z)∘new``.

        Returns ``LSTMSequence(i, cs, f, o, ci, co, h, cs_final, h_final)``: steps ``[T, B, H]``
        (``h [T, B, P]``), final states ``cs_final [B, H]``, ``h_final [B, P]`` (each row's state
        after its last valid step), recording its settings (``seq.settings``: forget_bias,
        cell_clip, proj_clip, ln_epsilon, ln_carry, peepholes, projection, layer_norm,
        seq_len, reverse, batch_first and the masks).""",
    "lstm_sequence_jvp": """
        Forward mode of ``lstm_sequence`` (docs/spec.md §12): the sequence and its
        directional derivative along ``tangents``, an ``LSTMSequenceGrads`` of the inputs'
        tangents (None: zero; ``x``'s in ``x``'s layout), each with its input's shape, library
        and dtype. Arguments and keywords are ``lstm_sequence``'s; each step's tangent is
        ``lstm_cell_jvp``'s, carried through the steps with the states (the masks, zoneout and
        the frozen rows are linear in them, constants to the tangent).

        Returns ``(seq, d_seq)``: ``lstm_sequence``'s result and an ``LSTMSequence`` of the
        tangents of its fields.""",
    "lstm_sequence_grad": """
        Backpropagation through time for ``lstm_sequence``, given its result ``seq``.

        Upstream gradients (each keyword-only and optional, None meaning zeros): ``d_h
        [T, B, P]``, ``d_cs [T, B, H]`` for the per-step ``h`` and ``cs``, ``d_h_final
        [B, P]``, ``d_cs_final [B, H]`` for the final states, and ``d_i``, ``d_f``, ``d_o``,
        ``d_ci``, ``d_co [T, B, H]`` for the per-step gates (docs/spec.md §16.1): each step's
        enter that step's gate gradients as in ``lstm_cell_grad``, the step's own gates (with
        zoneout too, and ``d_co`` through the step's own unzoned cell state).

        ``cell_clip``, ``proj_clip``, ``ln_epsilon``, ``ln_carry``, ``seq_len``, ``reverse``,
        ``batch_first``, the masks, the peepholes, the projection and the layer norm are the
        forward's, as ``seq`` records them (the per-step arrays in the forward's layout):
        passing them again is allowed, a contradicting value raises ``ValueError`` naming it
        (for a ``seq`` that records nothing, the keywords decide as for ``lstm_sequence``).
        ``clip_grad`` as for ``lstm_cell_grad`` ("exact": zero through an active clip;
        "straight_through": TF's). Entries of ``x`` and of the per-step upstream gradients past
        a row's length are never read.

        Returns ``LSTMSequenceGrads(x, cs0, h0, w, b, wci, wcf, wco, w_proj, layer_norm)`` (None
        for what was not given; ``layer_norm`` an ``LSTMNorm`` of the six gradients).""",
    "lstm_sequence_grad_jvp": """
        Second order (docs/spec.md §12): the JVP of ``lstm_sequence_grad`` in all its array
        inputs, along ``tangents`` (an ``LSTMSequenceGrads`` of the inputs' tangents, as for
        ``lstm_sequence_jvp``) and the upstream gradients' tangents ``d_h_tangent``, ...,
        ``d_co_tangent``, one per upstream gradient (None: zero; in the forward's layout).
        Arguments and keywords are ``lstm_sequence_grad``'s; the saved ``seq`` moves with the
        inputs, by ``lstm_sequence_jvp``.

        With the upstream gradients a loss's gradient and their tangents its Hessian applied
        to the result's tangent, the second result is the loss's Hessian-vector product.

        Returns ``(grads, grads_tangent)``: ``lstm_sequence_grad``'s result and its tangent.""",
    "lstm_stack": """
        A stack of LSTM layers (``lstm_sequence`` per layer and direction) over ``x [T, B, I]``.

        ``weights``: one ``LSTMWeights`` per (layer, direction), PyTorch's order; each may have
        peepholes, a projection (``w_proj``) and a layer norm; layer 0's ``w`` has ``I + P``
        rows, a higher layer's ``D·P + P`` (D = 2 when ``bidirectional``). ``cs0 [L·D, B, H]``
        and ``h0 [L·D, B, P]``. The attributes (``forget_bias``, the clips, the layer norm's
        settings) are every layer's; ``seq_len`` and ``batch_first`` as for ``lstm_sequence``;
        the reverse direction runs with ``reverse=True``. ``dropout_masks``: ``L - 1`` arrays,
        each broadcastable to a layer's outputs ``[T, B, D·P]``, multiplying the input of the
        layer above (no random numbers inside: pass the masks you drew; a mask ``[B, D·P]``, or
        ``[B, 1, D·P]`` with ``batch_first``, is the same at every step).

        Returns ``LSTMStack(h [T, B, D·P], cs_final [L·D, B, H], h_final [L·D, B, P], layers)``.""",
    "lstm_stack_jvp": """
        Forward mode of ``lstm_stack`` (docs/spec.md §12): the stack and its directional
        derivative along ``tangents``, an ``LSTMStackGrads(x, cs0, h0, weights)`` of the
        inputs' tangents (None: zero; ``weights`` a list of ``LSTMWeights`` of tangents, each
        entry or field None for zero). Arguments and keywords are ``lstm_stack``'s; each layer
        and direction is one ``lstm_sequence_jvp``, its input's tangent the layer below's
        output tangents times the boundary's dropout mask.

        Returns ``(stack, d_stack)``: ``lstm_stack``'s result and an ``LSTMStack`` of the
        tangents (its ``layers`` the per-layer sequence tangents).""",
    "lstm_stack_grad": """
        Backpropagation through ``lstm_stack``, given its result ``stack`` (its layers record
        their settings, the stack its directions, layout and masks). Upstream gradients (None:
        zeros): ``d_h [T, B, D·P]`` of the top outputs, ``d_h_final [L·D, B, P]`` and
        ``d_cs_final [L·D, B, H]`` of the final states.

        Returns ``LSTMStackGrads(x, cs0, h0, weights)``, ``weights`` a list of ``LSTMWeights`` of
        gradients in the order of ``weights``.""",
    "lstm_stack_grad_jvp": """
        Second order (docs/spec.md §12): the JVP of ``lstm_stack_grad`` along ``tangents``
        (as for ``lstm_stack_jvp``) and the upstream gradients' tangents (None: zero). Each
        layer and direction is one ``lstm_sequence_grad_jvp``, the layers' input tangents from
        the stack's forward JVP. Returns ``(grads, grads_tangent)``, ``LSTMStackGrads`` both.""",
}
"""The public functions' docstrings: their contracts and math (``gradcells._public``
makes the functions)."""


CELL = CellSpec(
    "lstm",
    OpSpec("lstm_cell", False, ("cs_prev", "h_prev"), LSTMWeights, LSTMSettings,
           LSTMCellState, LSTMCellGrads, ("d_h", "d_cs", *GATE_UPSTREAM), "P",
           {"layer_norm": LSTMNorm}),
    OpSpec("lstm_sequence", True, ("cs0", "h0"), LSTMWeights, LSTMSettings, LSTMSequence,
           LSTMSequenceGrads, ("d_h", "d_cs", "d_h_final", "d_cs_final", *GATE_UPSTREAM), "P",
           {"layer_norm": LSTMNorm}),
    StackSpec(LSTMStack, LSTMStackGrads),
    keywords=(Keyword("forget_bias", 1.0, "float", "real", forward_only=True),
              Keyword("cell_clip", None, "float | None", "clip"),
              Keyword("proj_clip", None, "float | None", "clip",
                      requires=("w_proj", "clips the projection")),
              Keyword("ln_epsilon", 1e-5, "float", "positive",
                      requires=("layer_norm", "is a setting of the layer norm")),
              Keyword("ln_carry", "raw", "str", "choice", LN_CARRIES,
                      requires=("layer_norm", "is a setting of the layer norm"))),
    grad_options=(Keyword("clip_grad", "exact", "str", "choice", CLIP_GRADS),),
    flags={"peepholes": PEEPHOLES, "projection": ("w_proj",), "layer_norm": ("layer_norm",)},
    masks=("input_mask", "recurrent_mask", "zoneout_cs", "zoneout_h"),
    weight_labels=WEIGHT_LABELS, protocol=LSTMBackend, docs=DOCS)
"""The LSTM, as the registry (``gradcells.cells``) reads it."""
