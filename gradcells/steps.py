"""The public cell operations: validate, dispatch, call, record the settings. No math here.

The formulas are in ``gradcells.reference`` (and restated in each docstring below); the
accelerated backends compute the same functions. A forward's result records its settings
(``state.settings``), so its gradient needs only the arrays, the result and the upstream
gradients (docs/spec.md §10).
"""

from __future__ import annotations

from . import _dispatch
from . import _validate as v
from ._core.specs import OPS
from ._core.types import (
    Array,
    GRUCellGrads,
    GRUCellState,
    GRUWeights,
    LSTMCellGrads,
    LSTMCellState,
    LSTMNorm,
    LSTMWeights,
    RNNCellGrads,
    RNNCellState,
    RNNWeights,
    record_settings,
)
from ._interop import accepts_any_array


def _grad_jvp(op, library, settings, arrays, weights, result, tangents, upstream, backend,
              **options):
    """A cell gradient's JVP: the tangents and the upstream gradients' tangents checked, the
    backend that runs it, the call. ``upstream``: every upstream keyword, ``d_h`` and
    ``d_h_tangent`` alike."""
    tangents = v.tangents_value(op, tangents, (*arrays, *weights))
    v.upstream_tangents(op, result, {k: t for k, t in upstream.items() if k.endswith("_tangent")})
    impl = _dispatch.backend_for(backend, library)
    return getattr(impl, f"{op}_grad_jvp")(*arrays, weights, OPS[op].result(*result), tangents,
                                           settings, **upstream, **options)


def _jvp(op, impl, arrays, weights, tangents, settings):
    """A cell's JVP on its backend: the state (recording ``settings``) and its tangent."""
    state, d_state = getattr(impl, f"{op}_jvp")(*arrays, weights, tangents, settings)
    return record_settings(state, settings), d_state


@accepts_any_array
def lstm_cell(x: Array, cs_prev: Array, h_prev: Array, w: Array, b: Array, *,
              wci: Array | None = None, wcf: Array | None = None, wco: Array | None = None,
              forget_bias: float = 1.0, cell_clip: float | None = None,
              w_proj: Array | None = None, proj_clip: float | None = None,
              layer_norm: LSTMNorm | None = None, ln_epsilon: float = 1e-5,
              ln_carry: str = "raw", backend: str | None = None) -> LSTMCellState:
    """One step of TensorFlow's LSTM block cell (gate layout i, ci, f, o), with an optional
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
    ``ln_carry``, whether peepholes, a projection and a layer norm were given).
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    library, settings = v.forward_args("lstm_cell", x, (cs_prev, h_prev), weights,
                                       forget_bias=forget_bias, cell_clip=cell_clip,
                                       proj_clip=proj_clip, ln_epsilon=ln_epsilon,
                                       ln_carry=ln_carry)
    impl = _dispatch.backend_for(backend, library)
    return record_settings(impl.lstm_cell(x, cs_prev, h_prev, weights, settings), settings)


@accepts_any_array
def lstm_cell_jvp(x: Array, cs_prev: Array, h_prev: Array, w: Array, b: Array,
                  tangents: LSTMCellGrads | None, *, wci: Array | None = None,
                  wcf: Array | None = None, wco: Array | None = None,
                  forget_bias: float = 1.0, cell_clip: float | None = None,
                  w_proj: Array | None = None, proj_clip: float | None = None,
                  layer_norm: LSTMNorm | None = None, ln_epsilon: float = 1e-5,
                  ln_carry: str = "raw",
                  backend: str | None = None) -> tuple[LSTMCellState, LSTMCellState]:
    """Forward mode of ``lstm_cell`` (docs/spec.md §12): the step and its directional
    derivative along ``tangents``.

    ``tangents`` is an ``LSTMCellGrads`` of the inputs' tangents, each with its input's
    shape, library and dtype (None: zero; ``layer_norm`` an ``LSTMNorm``, or None); None
    for all of them zero. Arguments and keywords are ``lstm_cell``'s. The tangents of the
    gates follow their chain rule (``gradcells.cells.lstm.reference.lstm_activations_jvp``),
    exact through an active clip: zero there, as the exact gradient is.

    Returns ``(state, d_state)``: ``lstm_cell``'s ``LSTMCellState`` and one of the tangents
    of its fields.
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    library, settings = v.forward_args("lstm_cell", x, (cs_prev, h_prev), weights,
                                       forget_bias=forget_bias, cell_clip=cell_clip,
                                       proj_clip=proj_clip, ln_epsilon=ln_epsilon,
                                       ln_carry=ln_carry)
    tangents = v.tangents_value("lstm_cell", tangents, (x, cs_prev, h_prev, *weights))
    impl = _dispatch.backend_for(backend, library)
    return _jvp("lstm_cell", impl, (x, cs_prev, h_prev), weights, tangents, settings)


@accepts_any_array
def lstm_cell_grad(x: Array, cs_prev: Array, h_prev: Array, w: Array, b: Array,
                   state: LSTMCellState, *, d_h: Array | None = None,
                   d_cs: Array | None = None, wci: Array | None = None,
                   wcf: Array | None = None, wco: Array | None = None,
                   cell_clip: float | None = None, w_proj: Array | None = None,
                   proj_clip: float | None = None, layer_norm: LSTMNorm | None = None,
                   ln_epsilon: float | None = None, ln_carry: str | None = None,
                   clip_grad: str = "exact", backend: str | None = None) -> LSTMCellGrads:
    """Gradient of ``lstm_cell`` with respect to every input, given the forward's ``state``
    and the upstream gradients ``d_h`` and ``d_cs`` (None: zeros).

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
    (None for what was not given).
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    library, settings = v.grad_args("lstm_cell", x, (cs_prev, h_prev), weights, state,
                                    {"d_h": d_h, "d_cs": d_cs}, cell_clip=cell_clip,
                                    proj_clip=proj_clip, ln_epsilon=ln_epsilon,
                                    ln_carry=ln_carry)
    clip_grad = v.clip_grad_value(clip_grad)
    impl = _dispatch.backend_for(backend, library)
    return impl.lstm_cell_grad(x, cs_prev, h_prev, weights, LSTMCellState(*state), settings,
                               d_h=d_h, d_cs=d_cs, clip_grad=clip_grad)


@accepts_any_array
def lstm_cell_grad_jvp(x: Array, cs_prev: Array, h_prev: Array, w: Array, b: Array,
                       state: LSTMCellState, tangents: LSTMCellGrads | None, *,
                       d_h: Array | None = None, d_cs: Array | None = None,
                       d_h_tangent: Array | None = None, d_cs_tangent: Array | None = None,
                       wci: Array | None = None, wcf: Array | None = None,
                       wco: Array | None = None, cell_clip: float | None = None,
                       w_proj: Array | None = None, proj_clip: float | None = None,
                       layer_norm: LSTMNorm | None = None, ln_epsilon: float | None = None,
                       ln_carry: str | None = None, clip_grad: str = "exact",
                       backend: str | None = None) -> tuple[LSTMCellGrads, LSTMCellGrads]:
    """Second order (docs/spec.md §12): the JVP of ``lstm_cell_grad`` in all its array
    inputs, along ``tangents`` (an ``LSTMCellGrads`` of the inputs' tangents, as for
    ``lstm_cell_jvp``) and the upstream gradients' tangents ``d_h_tangent``,
    ``d_cs_tangent`` (None: zero). Arguments and keywords are ``lstm_cell_grad``'s; the
    saved ``state`` moves with the inputs, by ``lstm_cell_jvp``.

    With ``d_h``, ``d_cs`` the gradient of a loss and their tangents its Hessian applied to
    the state's tangent, the second result is the Hessian-vector product of the loss; by
    the symmetry of second derivatives it is also the double backward.

    Returns ``(grads, grads_tangent)``: ``lstm_cell_grad``'s result and its tangent.
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    library, settings = v.grad_args("lstm_cell", x, (cs_prev, h_prev), weights, state,
                                    {"d_h": d_h, "d_cs": d_cs}, cell_clip=cell_clip,
                                    proj_clip=proj_clip, ln_epsilon=ln_epsilon,
                                    ln_carry=ln_carry)
    return _grad_jvp("lstm_cell", library, settings, (x, cs_prev, h_prev), weights, state,
                     tangents, {"d_h": d_h, "d_cs": d_cs, "d_h_tangent": d_h_tangent,
                                "d_cs_tangent": d_cs_tangent}, backend,
                     clip_grad=v.clip_grad_value(clip_grad))


@accepts_any_array
def gru_cell(x: Array, h_prev: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array, *,
             reset_after: bool = False, backend: str | None = None) -> GRUCellState:
    """One step of TensorFlow's GRU block cell.

    Shapes: ``x [B, I]``, ``h_prev [B, H]``, ``w_ru [I+H, 2H]`` (r then u), ``w_c [I+H, H]``,
    ``b_ru [2H]``, ``b_c [H]`` (``[2H]`` with ``reset_after=True``).

        [r, u] = σ([x, h_prev]·w_ru + b_ru);   c = tanh([x, r∘h_prev]·w_c + b_c)
        h = u∘h_prev + (1-u)∘c
        reset_after:  c = tanh(x·W_cx + b_cx + r∘(h_prev·W_ch + b_ch))

    Returns ``GRUCellState(r, u, c, h)``, each ``[B, H]``, recording ``reset_after``.
    """
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    library, settings = v.forward_args("gru_cell", x, (h_prev,), weights,
                                       reset_after=reset_after)
    impl = _dispatch.backend_for(backend, library)
    return record_settings(impl.gru_cell(x, h_prev, weights, settings), settings)


@accepts_any_array
def gru_cell_jvp(x: Array, h_prev: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array,
                 tangents: GRUCellGrads | None, *, reset_after: bool = False,
                 backend: str | None = None) -> tuple[GRUCellState, GRUCellState]:
    """Forward mode of ``gru_cell`` (docs/spec.md §12): the step and its directional
    derivative along ``tangents``, a ``GRUCellGrads`` of the inputs' tangents (None:
    zero), each with its input's shape, library and dtype.

        d[r_pre, u_pre] = [dx, dh_prev]·w_ru + [x, h_prev]·dw_ru + db_ru
        dc = (1-c²)∘dc_pre;   dh = du∘(h_prev - c) + u∘dh_prev + (1-u)∘dc

    Returns ``(state, d_state)``: ``gru_cell``'s ``GRUCellState`` and one of its tangents.
    """
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    library, settings = v.forward_args("gru_cell", x, (h_prev,), weights,
                                       reset_after=reset_after)
    tangents = v.tangents_value("gru_cell", tangents, (x, h_prev, *weights))
    impl = _dispatch.backend_for(backend, library)
    return _jvp("gru_cell", impl, (x, h_prev), weights, tangents, settings)


@accepts_any_array
def gru_cell_grad(x: Array, h_prev: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array,
                  state: GRUCellState, *, d_h: Array | None = None,
                  reset_after: bool | None = None,
                  backend: str | None = None) -> GRUCellGrads:
    """Gradient of ``gru_cell`` with respect to every input, given the forward's ``state``
    and the upstream gradient ``d_h`` of ``h`` (None: zeros).

    ``reset_after`` is the forward's, as ``state`` records it (None: the record's; for a
    tuple built by hand, False); a contradicting value raises ``ValueError``.

    Returns ``GRUCellGrads(x, h_prev, w_ru, w_c, b_ru, b_c)``.
    """
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    library, settings = v.grad_args("gru_cell", x, (h_prev,), weights, state, {"d_h": d_h},
                                    reset_after=reset_after)
    impl = _dispatch.backend_for(backend, library)
    return impl.gru_cell_grad(x, h_prev, weights, GRUCellState(*state), settings, d_h=d_h)


@accepts_any_array
def gru_cell_grad_jvp(x: Array, h_prev: Array, w_ru: Array, w_c: Array, b_ru: Array,
                      b_c: Array, state: GRUCellState, tangents: GRUCellGrads | None, *,
                      d_h: Array | None = None, d_h_tangent: Array | None = None,
                      reset_after: bool | None = None,
                      backend: str | None = None) -> tuple[GRUCellGrads, GRUCellGrads]:
    """Second order: the JVP of ``gru_cell_grad`` along ``tangents`` (a ``GRUCellGrads``)
    and ``d_h_tangent``, as ``lstm_cell_grad_jvp``. Returns ``(grads, grads_tangent)``."""
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    library, settings = v.grad_args("gru_cell", x, (h_prev,), weights, state, {"d_h": d_h},
                                    reset_after=reset_after)
    return _grad_jvp("gru_cell", library, settings, (x, h_prev), weights, state, tangents,
                     {"d_h": d_h, "d_h_tangent": d_h_tangent}, backend)


@accepts_any_array
def rnn_cell(x: Array, h_prev: Array, w: Array, b: Array, *, activation: str = "tanh",
             backend: str | None = None) -> RNNCellState:
    """One step of the plain (Elman) RNN cell: PyTorch's ``nn.RNNCell``, Keras' ``SimpleRNN``,
    ONNX's ``RNN``.

    Shapes: ``x [B, I]``, ``h_prev [B, H]``, ``w [I+H, H]`` (rows: the x part, then the h
    part), ``b [H]``; ``activation`` "tanh" or "relu".

        h = act([x, h_prev]·w + b)

    Returns ``RNNCellState(h)``, ``h [B, H]``, recording ``activation``.
    """
    weights = RNNWeights(w, b)
    library, settings = v.forward_args("rnn_cell", x, (h_prev,), weights, activation=activation)
    impl = _dispatch.backend_for(backend, library)
    return record_settings(impl.rnn_cell(x, h_prev, weights, settings), settings)


@accepts_any_array
def rnn_cell_jvp(x: Array, h_prev: Array, w: Array, b: Array, tangents: RNNCellGrads | None,
                 *, activation: str = "tanh",
                 backend: str | None = None) -> tuple[RNNCellState, RNNCellState]:
    """Forward mode of ``rnn_cell`` (docs/spec.md §12): the step and its directional
    derivative along ``tangents``, an ``RNNCellGrads`` of the inputs' tangents (None:
    zero), each with its input's shape, library and dtype.

        dz = [dx, dh_prev]·w + [x, h_prev]·dw + db;   dh = act'(z)∘dz

    Returns ``(state, d_state)``: ``rnn_cell``'s ``RNNCellState`` and one of its tangent (``h``'s).
    """
    weights = RNNWeights(w, b)
    library, settings = v.forward_args("rnn_cell", x, (h_prev,), weights, activation=activation)
    tangents = v.tangents_value("rnn_cell", tangents, (x, h_prev, *weights))
    impl = _dispatch.backend_for(backend, library)
    return _jvp("rnn_cell", impl, (x, h_prev), weights, tangents, settings)


@accepts_any_array
def rnn_cell_grad(x: Array, h_prev: Array, w: Array, b: Array, state: RNNCellState, *,
                  d_h: Array | None = None, activation: str | None = None,
                  backend: str | None = None) -> RNNCellGrads:
    """Gradient of ``rnn_cell`` with respect to every input, given the forward's ``state``
    and the upstream gradient ``d_h`` of ``h`` (None: zeros).

        dz = d_h∘act'(z):  tanh' = 1 - h²;  relu' = 1 where h > 0, else 0 (relu'(0) = 0)
        d[x, h_prev] = dz·wᵀ;   dw = [x, h_prev]ᵀ·dz;   db = Σ_batch dz

    ``activation`` is the forward's, as ``state`` records it (None: the record's; for a
    tuple built by hand, "tanh"); a contradicting value raises ``ValueError``.

    Returns ``RNNCellGrads(x, h_prev, w, b)``.
    """
    weights = RNNWeights(w, b)
    library, settings = v.grad_args("rnn_cell", x, (h_prev,), weights, state, {"d_h": d_h},
                                    activation=activation)
    impl = _dispatch.backend_for(backend, library)
    return impl.rnn_cell_grad(x, h_prev, weights, RNNCellState(*state), settings, d_h=d_h)


@accepts_any_array
def rnn_cell_grad_jvp(x: Array, h_prev: Array, w: Array, b: Array, state: RNNCellState,
                      tangents: RNNCellGrads | None, *, d_h: Array | None = None,
                      d_h_tangent: Array | None = None, activation: str | None = None,
                      backend: str | None = None) -> tuple[RNNCellGrads, RNNCellGrads]:
    """Second order: the JVP of ``rnn_cell_grad`` along ``tangents`` (an ``RNNCellGrads``)
    and ``d_h_tangent``, as ``lstm_cell_grad_jvp``. Returns ``(grads, grads_tangent)``."""
    weights = RNNWeights(w, b)
    library, settings = v.grad_args("rnn_cell", x, (h_prev,), weights, state, {"d_h": d_h},
                                    activation=activation)
    return _grad_jvp("rnn_cell", library, settings, (x, h_prev), weights, state, tangents,
                     {"d_h": d_h, "d_h_tangent": d_h_tangent}, backend)
