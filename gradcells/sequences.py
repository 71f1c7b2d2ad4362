"""The public sequence operations (docs/spec.md §4): validate, dispatch, call, record the
settings. No math here.

The formulas are in ``gradcells.reference`` (``lstm``, ``gru``); the accelerated backends
compute the same functions with the same matmul plan (one input projection for all steps,
per step only ``h·W_h``; after the backward loop, the weight gradients as two large
matmuls). A forward's result records its settings (``seq.settings``, ``seq_len`` included),
so its gradient needs only the arrays, the result and the upstream gradients (§10).
"""

from __future__ import annotations

from . import _dispatch, _order
from . import _validate as v
from ._core.specs import OPS
from ._core.types import (
    Array,
    GRUSequence,
    GRUSequenceGrads,
    GRUWeights,
    LSTMNorm,
    LSTMSequence,
    LSTMSequenceGrads,
    LSTMWeights,
    RNNSequence,
    RNNSequenceGrads,
    RNNWeights,
    record_settings,
)
from ._interop import accepts_any_array

_LSTM, _GRU, _RNN = OPS["lstm_sequence"], OPS["gru_sequence"], OPS["rnn_sequence"]


def _masks(input_mask, recurrent_mask, zoneout_h, zoneout_cs=None):
    """A sequence's masks (docs/spec.md §11.3) by name; ``zoneout_cs`` the LSTM's only."""
    masks = {"input_mask": input_mask, "recurrent_mask": recurrent_mask,
             "zoneout_h": zoneout_h}
    return masks if zoneout_cs is None else {**masks, "zoneout_cs": zoneout_cs}


def _jvp(spec, library, settings, x, states, weights, tangents, backend):
    """A sequence's JVP: the tangents checked against the primals, the backend that runs
    it, the time order and layout (``_order.jvp``); the result records ``settings``."""
    tangents = v.tangents_value(spec.name, tangents, (x, *states, *weights))
    op = f"{spec.name}_jvp"
    impl = _dispatch.backend_for(backend, library)
    result, d_result = _order.jvp(spec, getattr(impl, op), x, states, weights, tangents,
                                  settings)
    return record_settings(result, settings), d_result


def _grad_jvp(spec, library, settings, arrays, weights, seq, tangents, upstream, backend,
              **options):
    """A sequence gradient's JVP: the tangents and the upstream gradients' tangents checked
    (``upstream``: every upstream keyword, ``d_h`` and ``d_h_tangent`` alike), the backend
    that runs it, the time order and layout (``_order.grad_jvp``)."""
    tangents = v.tangents_value(spec.name, tangents, (*arrays, *weights))
    v.upstream_tangents(spec.name, seq, {k: t for k, t in upstream.items()
                                         if k.endswith("_tangent")})
    op = f"{spec.grad_name}_jvp"
    impl = _dispatch.backend_for(backend, library)
    return _order.grad_jvp(spec, getattr(impl, op), arrays[0], arrays[1:], weights, seq,
                           tangents, settings, upstream, **options)


@accepts_any_array
def lstm_sequence(x: Array, cs0: Array, h0: Array, w: Array, b: Array, *,
                  wci: Array | None = None, wcf: Array | None = None,
                  wco: Array | None = None, forget_bias: float = 1.0,
                  cell_clip: float | None = None, w_proj: Array | None = None,
                  proj_clip: float | None = None, seq_len: Array | None = None,
                  layer_norm: LSTMNorm | None = None, ln_epsilon: float = 1e-5,
                  ln_carry: str = "raw", reverse: bool = False, batch_first: bool = False,
                  input_mask: Array | None = None, recurrent_mask: Array | None = None,
                  zoneout_cs: Array | None = None, zoneout_h: Array | None = None,
                  backend: str | None = None) -> LSTMSequence:
    """The LSTM block cell (``lstm_cell``) run over ``x [T, B, I]`` from ``cs0 [B, H]`` and
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
    seq_len, reverse, batch_first and the masks).
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    library, settings = v.forward_args("lstm_sequence", x, (cs0, h0), weights,
                                       forget_bias=forget_bias, cell_clip=cell_clip,
                                       proj_clip=proj_clip, ln_epsilon=ln_epsilon,
                                       ln_carry=ln_carry, seq_len=seq_len, reverse=reverse,
                                       batch_first=batch_first,
                                       masks=_masks(input_mask, recurrent_mask, zoneout_h,
                                                    zoneout_cs))
    impl = _dispatch.backend_for(backend, library)
    return record_settings(_order.forward(_LSTM, impl.lstm_sequence, x, (cs0, h0), weights,
                                          settings, package=impl), settings)


@accepts_any_array
def lstm_sequence_jvp(x: Array, cs0: Array, h0: Array, w: Array, b: Array,
                      tangents: LSTMSequenceGrads | None, *, wci: Array | None = None,
                      wcf: Array | None = None, wco: Array | None = None,
                      forget_bias: float = 1.0, cell_clip: float | None = None,
                      w_proj: Array | None = None, proj_clip: float | None = None,
                      seq_len: Array | None = None, layer_norm: LSTMNorm | None = None,
                      ln_epsilon: float = 1e-5, ln_carry: str = "raw", reverse: bool = False,
                      batch_first: bool = False, input_mask: Array | None = None,
                      recurrent_mask: Array | None = None, zoneout_cs: Array | None = None,
                      zoneout_h: Array | None = None,
                      backend: str | None = None) -> tuple[LSTMSequence, LSTMSequence]:
    """Forward mode of ``lstm_sequence`` (docs/spec.md §12): the sequence and its
    directional derivative along ``tangents``, an ``LSTMSequenceGrads`` of the inputs'
    tangents (None: zero; ``x``'s in ``x``'s layout), each with its input's shape, library
    and dtype. Arguments and keywords are ``lstm_sequence``'s; each step's tangent is
    ``lstm_cell_jvp``'s, carried through the steps with the states (the masks, zoneout and
    the frozen rows are linear in them, constants to the tangent).

    Returns ``(seq, d_seq)``: ``lstm_sequence``'s result and an ``LSTMSequence`` of the
    tangents of its fields.
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    library, settings = v.forward_args("lstm_sequence", x, (cs0, h0), weights,
                                       forget_bias=forget_bias, cell_clip=cell_clip,
                                       proj_clip=proj_clip, ln_epsilon=ln_epsilon,
                                       ln_carry=ln_carry, seq_len=seq_len, reverse=reverse,
                                       batch_first=batch_first,
                                       masks=_masks(input_mask, recurrent_mask, zoneout_h,
                                                    zoneout_cs))
    return _jvp(_LSTM, library, settings, x, (cs0, h0), weights, tangents, backend)


@accepts_any_array
def lstm_sequence_grad(x: Array, cs0: Array, h0: Array, w: Array, b: Array,
                       seq: LSTMSequence, *, d_h: Array | None = None,
                       d_cs: Array | None = None, d_h_final: Array | None = None,
                       d_cs_final: Array | None = None, wci: Array | None = None,
                       wcf: Array | None = None, wco: Array | None = None,
                       cell_clip: float | None = None, w_proj: Array | None = None,
                       proj_clip: float | None = None, layer_norm: LSTMNorm | None = None,
                       ln_epsilon: float | None = None, ln_carry: str | None = None,
                       clip_grad: str = "exact", seq_len: Array | None = None,
                       reverse: bool | None = None, batch_first: bool | None = None,
                       input_mask: Array | None = None, recurrent_mask: Array | None = None,
                       zoneout_cs: Array | None = None, zoneout_h: Array | None = None,
                       backend: str | None = None) -> LSTMSequenceGrads:
    """Backpropagation through time for ``lstm_sequence``, given its result ``seq``.

    Upstream gradients (each optional, None meaning zeros): ``d_h [T, B, P]``, ``d_cs
    [T, B, H]`` for the per-step ``h`` and ``cs``, ``d_h_final [B, P]``, ``d_cs_final
    [B, H]`` for the final states. ``cell_clip``, ``proj_clip``, ``ln_epsilon``,
    ``ln_carry``, ``seq_len``, ``reverse``, ``batch_first``, the masks, the peepholes, the
    projection and the layer norm are the forward's, as ``seq`` records them (the per-step
    arrays in the forward's layout): passing them again is
    allowed, a contradicting value raises ``ValueError`` naming it (for a ``seq`` that
    records nothing, the keywords decide as for ``lstm_sequence``).
    ``clip_grad`` as for ``lstm_cell_grad`` ("exact": zero through an active clip;
    "straight_through": TF's). Entries of ``x``, ``d_h`` and ``d_cs`` past a row's length
    are never read.

    Returns ``LSTMSequenceGrads(x, cs0, h0, w, b, wci, wcf, wco, w_proj, layer_norm)`` (None
    for what was not given; ``layer_norm`` an ``LSTMNorm`` of the six gradients).
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    upstream = {"d_h": d_h, "d_cs": d_cs, "d_h_final": d_h_final, "d_cs_final": d_cs_final}
    library, settings = v.grad_args("lstm_sequence", x, (cs0, h0), weights, seq, upstream,
                                    cell_clip=cell_clip, proj_clip=proj_clip,
                                    ln_epsilon=ln_epsilon, ln_carry=ln_carry, seq_len=seq_len,
                                    reverse=reverse, batch_first=batch_first,
                                    masks=_masks(input_mask, recurrent_mask, zoneout_h,
                                                 zoneout_cs))
    clip_grad = v.clip_grad_value(clip_grad)
    impl = _dispatch.backend_for(backend, library)
    return _order.grad(_LSTM, impl.lstm_sequence_grad, x, (cs0, h0), weights, seq, settings,
                       upstream, package=impl, clip_grad=clip_grad)


@accepts_any_array
def lstm_sequence_grad_jvp(x: Array, cs0: Array, h0: Array, w: Array, b: Array,
                           seq: LSTMSequence, tangents: LSTMSequenceGrads | None, *,
                           d_h: Array | None = None, d_cs: Array | None = None,
                           d_h_final: Array | None = None, d_cs_final: Array | None = None,
                           d_h_tangent: Array | None = None, d_cs_tangent: Array | None = None,
                           d_h_final_tangent: Array | None = None,
                           d_cs_final_tangent: Array | None = None, wci: Array | None = None,
                           wcf: Array | None = None, wco: Array | None = None,
                           cell_clip: float | None = None, w_proj: Array | None = None,
                           proj_clip: float | None = None, layer_norm: LSTMNorm | None = None,
                           ln_epsilon: float | None = None, ln_carry: str | None = None,
                           clip_grad: str = "exact", seq_len: Array | None = None,
                           reverse: bool | None = None, batch_first: bool | None = None,
                           input_mask: Array | None = None,
                           recurrent_mask: Array | None = None,
                           zoneout_cs: Array | None = None, zoneout_h: Array | None = None,
                           backend: str | None = None
                           ) -> tuple[LSTMSequenceGrads, LSTMSequenceGrads]:
    """Second order (docs/spec.md §12): the JVP of ``lstm_sequence_grad`` in all its array
    inputs, along ``tangents`` (an ``LSTMSequenceGrads`` of the inputs' tangents, as for
    ``lstm_sequence_jvp``) and the upstream gradients' tangents ``d_h_tangent``, ...
    (None: zero; in the forward's layout). Arguments and keywords are
    ``lstm_sequence_grad``'s; the saved ``seq`` moves with the inputs, by
    ``lstm_sequence_jvp``.

    With the upstream gradients a loss's gradient and their tangents its Hessian applied
    to the result's tangent, the second result is the loss's Hessian-vector product.

    Returns ``(grads, grads_tangent)``: ``lstm_sequence_grad``'s result and its tangent.
    """
    weights = LSTMWeights(w, b, wci, wcf, wco, w_proj, layer_norm)
    upstream = {"d_h": d_h, "d_cs": d_cs, "d_h_final": d_h_final, "d_cs_final": d_cs_final}
    library, settings = v.grad_args("lstm_sequence", x, (cs0, h0), weights, seq, upstream,
                                    cell_clip=cell_clip, proj_clip=proj_clip,
                                    ln_epsilon=ln_epsilon, ln_carry=ln_carry, seq_len=seq_len,
                                    reverse=reverse, batch_first=batch_first,
                                    masks=_masks(input_mask, recurrent_mask, zoneout_h,
                                                 zoneout_cs))
    upstream.update(d_h_tangent=d_h_tangent, d_cs_tangent=d_cs_tangent,
                    d_h_final_tangent=d_h_final_tangent, d_cs_final_tangent=d_cs_final_tangent)
    return _grad_jvp(_LSTM, library, settings, (x, cs0, h0), weights, seq, tangents, upstream,
                     backend, clip_grad=v.clip_grad_value(clip_grad))


@accepts_any_array
def gru_sequence(x: Array, h0: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array, *,
                 reset_after: bool = False, seq_len: Array | None = None,
                 reverse: bool = False, batch_first: bool = False,
                 input_mask: Array | None = None, recurrent_mask: Array | None = None,
                 zoneout_h: Array | None = None, backend: str | None = None) -> GRUSequence:
    """The GRU block cell (``gru_cell``) run over ``x [T, B, I]`` from ``h0 [B, H]``.

    Weights as for ``gru_cell`` (``b_c [2H]`` with ``reset_after=True``); ``seq_len``,
    ``reverse``, ``batch_first`` and the masks (no ``zoneout_cs``) as for ``lstm_sequence``.

        for t in 0..T-1:   (r, u, c, h)[t] = gru_cell(x[t], h, w_ru, w_c, b_ru, b_c, ...)

    Returns ``GRUSequence(r, u, c, h, h_final)``: steps ``[T, B, H]``, final state ``[B, H]``,
    recording ``reset_after`` and ``seq_len``.
    """
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    library, settings = v.forward_args("gru_sequence", x, (h0,), weights,
                                       reset_after=reset_after, seq_len=seq_len,
                                       reverse=reverse, batch_first=batch_first,
                                       masks=_masks(input_mask, recurrent_mask, zoneout_h))
    impl = _dispatch.backend_for(backend, library)
    return record_settings(_order.forward(_GRU, impl.gru_sequence, x, (h0,), weights,
                                          settings, package=impl), settings)


@accepts_any_array
def gru_sequence_jvp(x: Array, h0: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array,
                     tangents: GRUSequenceGrads | None, *, reset_after: bool = False,
                     seq_len: Array | None = None, reverse: bool = False,
                     batch_first: bool = False, input_mask: Array | None = None,
                     recurrent_mask: Array | None = None, zoneout_h: Array | None = None,
                     backend: str | None = None) -> tuple[GRUSequence, GRUSequence]:
    """Forward mode of ``gru_sequence`` (docs/spec.md §12): the sequence and its
    directional derivative along ``tangents``, a ``GRUSequenceGrads`` of the inputs'
    tangents (None: zero), as for ``lstm_sequence_jvp``; each step's is ``gru_cell_jvp``'s.

    Returns ``(seq, d_seq)``: ``gru_sequence``'s result and a ``GRUSequence`` of tangents.
    """
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    library, settings = v.forward_args("gru_sequence", x, (h0,), weights,
                                       reset_after=reset_after, seq_len=seq_len,
                                       reverse=reverse, batch_first=batch_first,
                                       masks=_masks(input_mask, recurrent_mask, zoneout_h))
    return _jvp(_GRU, library, settings, x, (h0,), weights, tangents, backend)


@accepts_any_array
def gru_sequence_grad(x: Array, h0: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array,
                      seq: GRUSequence, *, d_h: Array | None = None,
                      d_h_final: Array | None = None, reset_after: bool | None = None,
                      seq_len: Array | None = None, reverse: bool | None = None,
                      batch_first: bool | None = None, input_mask: Array | None = None,
                      recurrent_mask: Array | None = None, zoneout_h: Array | None = None,
                      backend: str | None = None) -> GRUSequenceGrads:
    """Backpropagation through time for ``gru_sequence``, given its result ``seq``.

    Upstream gradients (each optional, None meaning zeros): ``d_h [T, B, H]`` for the
    per-step ``h``, ``d_h_final [B, H]`` for the final state. ``reset_after``, ``seq_len``,
    ``reverse``, ``batch_first`` and the masks are the forward's, as ``seq`` records them
    (a contradicting value raises ``ValueError``;
    for a ``seq`` that records nothing, ``reset_after`` None means False). Entries of ``x``
    and ``d_h`` past a row's length are never read.

    Returns ``GRUSequenceGrads(x, h0, w_ru, w_c, b_ru, b_c)``.
    """
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    upstream = {"d_h": d_h, "d_h_final": d_h_final}
    library, settings = v.grad_args("gru_sequence", x, (h0,), weights, seq, upstream,
                                    reset_after=reset_after, seq_len=seq_len, reverse=reverse,
                                    batch_first=batch_first,
                                    masks=_masks(input_mask, recurrent_mask, zoneout_h))
    impl = _dispatch.backend_for(backend, library)
    return _order.grad(_GRU, impl.gru_sequence_grad, x, (h0,), weights, seq, settings,
                       upstream, package=impl)


@accepts_any_array
def gru_sequence_grad_jvp(x: Array, h0: Array, w_ru: Array, w_c: Array, b_ru: Array,
                          b_c: Array, seq: GRUSequence, tangents: GRUSequenceGrads | None, *,
                          d_h: Array | None = None, d_h_final: Array | None = None,
                          d_h_tangent: Array | None = None,
                          d_h_final_tangent: Array | None = None,
                          reset_after: bool | None = None, seq_len: Array | None = None,
                          reverse: bool | None = None, batch_first: bool | None = None,
                          input_mask: Array | None = None,
                          recurrent_mask: Array | None = None, zoneout_h: Array | None = None,
                          backend: str | None = None) -> tuple[GRUSequenceGrads, GRUSequenceGrads]:
    """Second order: the JVP of ``gru_sequence_grad`` along ``tangents`` (a
    ``GRUSequenceGrads``) and the upstream gradients' tangents, as
    ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``."""
    weights = GRUWeights(w_ru, w_c, b_ru, b_c)
    upstream = {"d_h": d_h, "d_h_final": d_h_final}
    library, settings = v.grad_args("gru_sequence", x, (h0,), weights, seq, upstream,
                                    reset_after=reset_after, seq_len=seq_len, reverse=reverse,
                                    batch_first=batch_first,
                                    masks=_masks(input_mask, recurrent_mask, zoneout_h))
    upstream.update(d_h_tangent=d_h_tangent, d_h_final_tangent=d_h_final_tangent)
    return _grad_jvp(_GRU, library, settings, (x, h0), weights, seq, tangents, upstream, backend)


@accepts_any_array
def rnn_sequence(x: Array, h0: Array, w: Array, b: Array, *, activation: str = "tanh",
                 seq_len: Array | None = None, reverse: bool = False,
                 batch_first: bool = False, input_mask: Array | None = None,
                 recurrent_mask: Array | None = None, zoneout_h: Array | None = None,
                 backend: str | None = None) -> RNNSequence:
    """The plain RNN cell (``rnn_cell``) run over ``x [T, B, I]`` from ``h0 [B, H]``.

    Weights as for ``rnn_cell``; ``seq_len``, ``reverse``, ``batch_first`` and the masks (no
    ``zoneout_cs``) as for ``lstm_sequence``.

        for t in 0..T-1:   h[t] = act([x[t], h]·w + b)

    Returns ``RNNSequence(h, h_final)``: steps ``[T, B, H]``, final state ``[B, H]``,
    recording ``activation`` and ``seq_len``.
    """
    weights = RNNWeights(w, b)
    library, settings = v.forward_args("rnn_sequence", x, (h0,), weights,
                                       activation=activation, seq_len=seq_len,
                                       reverse=reverse, batch_first=batch_first,
                                       masks=_masks(input_mask, recurrent_mask, zoneout_h))
    impl = _dispatch.backend_for(backend, library)
    return record_settings(_order.forward(_RNN, impl.rnn_sequence, x, (h0,), weights,
                                          settings, package=impl), settings)


@accepts_any_array
def rnn_sequence_jvp(x: Array, h0: Array, w: Array, b: Array,
                     tangents: RNNSequenceGrads | None, *, activation: str = "tanh",
                     seq_len: Array | None = None, reverse: bool = False,
                     batch_first: bool = False, input_mask: Array | None = None,
                     recurrent_mask: Array | None = None, zoneout_h: Array | None = None,
                     backend: str | None = None) -> tuple[RNNSequence, RNNSequence]:
    """Forward mode of ``rnn_sequence`` (docs/spec.md §12): the sequence and its
    directional derivative along ``tangents``, an ``RNNSequenceGrads`` of the inputs'
    tangents (None: zero), as for ``lstm_sequence_jvp``; each step's is ``rnn_cell_jvp``'s.

    Returns ``(seq, d_seq)``: ``rnn_sequence``'s result and an ``RNNSequence`` of tangents.
    """
    weights = RNNWeights(w, b)
    library, settings = v.forward_args("rnn_sequence", x, (h0,), weights,
                                       activation=activation, seq_len=seq_len,
                                       reverse=reverse, batch_first=batch_first,
                                       masks=_masks(input_mask, recurrent_mask, zoneout_h))
    return _jvp(_RNN, library, settings, x, (h0,), weights, tangents, backend)


@accepts_any_array
def rnn_sequence_grad(x: Array, h0: Array, w: Array, b: Array, seq: RNNSequence, *,
                      d_h: Array | None = None, d_h_final: Array | None = None,
                      activation: str | None = None, seq_len: Array | None = None,
                      reverse: bool | None = None, batch_first: bool | None = None,
                      input_mask: Array | None = None, recurrent_mask: Array | None = None,
                      zoneout_h: Array | None = None,
                      backend: str | None = None) -> RNNSequenceGrads:
    """Backpropagation through time for ``rnn_sequence``, given its result ``seq``.

    Upstream gradients (each optional, None meaning zeros): ``d_h [T, B, H]`` for the
    per-step ``h``, ``d_h_final [B, H]`` for the final state. ``activation``, ``seq_len``,
    ``reverse``, ``batch_first`` and the masks are the forward's, as ``seq`` records them
    (a contradicting value raises ``ValueError``;
    for a ``seq`` that records nothing, ``activation`` None means "tanh"). Entries of ``x``
    and ``d_h`` past a row's length are never read.

    Returns ``RNNSequenceGrads(x, h0, w, b)``.
    """
    weights = RNNWeights(w, b)
    upstream = {"d_h": d_h, "d_h_final": d_h_final}
    library, settings = v.grad_args("rnn_sequence", x, (h0,), weights, seq, upstream,
                                    activation=activation, seq_len=seq_len, reverse=reverse,
                                    batch_first=batch_first,
                                    masks=_masks(input_mask, recurrent_mask, zoneout_h))
    impl = _dispatch.backend_for(backend, library)
    return _order.grad(_RNN, impl.rnn_sequence_grad, x, (h0,), weights, seq, settings,
                       upstream, package=impl)


@accepts_any_array
def rnn_sequence_grad_jvp(x: Array, h0: Array, w: Array, b: Array, seq: RNNSequence,
                          tangents: RNNSequenceGrads | None, *,
                          d_h: Array | None = None, d_h_final: Array | None = None,
                          d_h_tangent: Array | None = None,
                          d_h_final_tangent: Array | None = None,
                          activation: str | None = None, seq_len: Array | None = None,
                          reverse: bool | None = None, batch_first: bool | None = None,
                          input_mask: Array | None = None,
                          recurrent_mask: Array | None = None, zoneout_h: Array | None = None,
                          backend: str | None = None) -> tuple[RNNSequenceGrads, RNNSequenceGrads]:
    """Second order: the JVP of ``rnn_sequence_grad`` along ``tangents`` (a
    ``RNNSequenceGrads``) and the upstream gradients' tangents, as
    ``lstm_sequence_grad_jvp``. Returns ``(grads, grads_tangent)``."""
    weights = RNNWeights(w, b)
    upstream = {"d_h": d_h, "d_h_final": d_h_final}
    library, settings = v.grad_args("rnn_sequence", x, (h0,), weights, seq, upstream,
                                    activation=activation, seq_len=seq_len, reverse=reverse,
                                    batch_first=batch_first,
                                    masks=_masks(input_mask, recurrent_mask, zoneout_h))
    upstream.update(d_h_tangent=d_h_tangent, d_h_final_tangent=d_h_final_tangent)
    return _grad_jvp(_RNN, library, settings, (x, h0), weights, seq, tangents, upstream, backend)
