"""The public sequence operations (SPEC 4): validate, pick the backend, call it. No math here.

The formulas are in ``gradcells.reference.sequences``; the accelerated backends compute the
same functions with the same matmul plan (one input projection for all steps, per step only
``h·W_h``; after the backward loop, the weight gradients as two large matmuls).
"""

from __future__ import annotations

from . import _validate as v
from ._interop import accepts_any_array
from ._types import GRUSequence, GRUSequenceGrads, LSTMSequence, LSTMSequenceGrads


@accepts_any_array
def lstm_sequence(x, cs0, h0, w, b, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
                  cell_clip=None, seq_len=None, backend=None) -> LSTMSequence:
    """The LSTM block cell (``lstm_cell``) run over ``x [T, B, I]`` from ``cs0, h0 [B, H]``.

    ``w [I+H, 4H]`` and ``b [4H]`` in gate order i, ci, f, o; peepholes ``wci, wcf, wco [H]``
    (all or none). ``seq_len [B]``: optional integer lengths in [0, T]; for ``t >= seq_len[b]``
    row b's outputs are zero and its state is frozen (PyTorch packed-sequence semantics), and
    ``x[t, b]`` is never read (padding may hold anything, NaN included).

        for t in 0..T-1:   (i, cs, f, o, ci, co, h)[t] = lstm_cell(x[t], cs, h, w, b, ...)

    Returns ``LSTMSequence(i, cs, f, o, ci, co, h, cs_final, h_final)``: steps ``[T, B, H]``,
    final states ``[B, H]`` (each row's state after its last valid step).
    """
    impl, seq_len = v.lstm_sequence_args(x, cs0, h0, w, b, wci, wcf, wco, seq_len=seq_len,
                                         backend=backend)
    return impl.lstm_sequence(x, cs0, h0, w, b, wci=wci, wcf=wcf, wco=wco,
                              forget_bias=v.forget_bias_value(forget_bias, x.dtype),
                              cell_clip=v.cell_clip_value(cell_clip, x.dtype),
                              seq_len=seq_len)


@accepts_any_array
def lstm_sequence_grad(x, cs0, h0, w, b, seq, *, d_h=None, d_cs=None, d_h_final=None,
                       d_cs_final=None, wci=None, wcf=None, wco=None, cell_clip=None,
                       clip_grad="exact", seq_len=None, backend=None) -> LSTMSequenceGrads:
    """Backpropagation through time for ``lstm_sequence``, given its result ``seq``.

    Upstream gradients (each optional, None meaning zeros): ``d_h, d_cs [T, B, H]`` for the
    per-step ``h`` and ``cs``, ``d_h_final, d_cs_final [B, H]`` for the final states.
    ``cell_clip`` and ``seq_len`` must be those of the forward; ``clip_grad`` as for
    ``lstm_cell_grad`` ("exact": zero through an active clip; "straight_through": TF's).
    Entries of ``x``, ``d_h`` and ``d_cs`` past a row's length are never read.

    Returns ``LSTMSequenceGrads(x, cs0, h0, w, b, wci, wcf, wco)`` (peepholes None when
    absent).
    """
    impl, seq_len = v.lstm_sequence_args(
        x, cs0, h0, w, b, wci, wcf, wco, seq_len=seq_len, grad=True, seq=seq, d_h=d_h,
        d_cs=d_cs, d_h_final=d_h_final, d_cs_final=d_cs_final, backend=backend)
    return impl.lstm_sequence_grad(
        x, cs0, h0, w, b, LSTMSequence(*seq), d_h=d_h, d_cs=d_cs, d_h_final=d_h_final,
        d_cs_final=d_cs_final, wci=wci, wcf=wcf, wco=wco,
        cell_clip=v.cell_clip_value(cell_clip, x.dtype),
        clip_grad=v.clip_grad_value(clip_grad), seq_len=seq_len)


@accepts_any_array
def gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, *, reset_after=False, seq_len=None,
                 backend=None) -> GRUSequence:
    """The GRU block cell (``gru_cell``) run over ``x [T, B, I]`` from ``h0 [B, H]``.

    Weights as for ``gru_cell`` (``b_c [2H]`` with ``reset_after=True``); ``seq_len`` as for
    ``lstm_sequence``.

        for t in 0..T-1:   (r, u, c, h)[t] = gru_cell(x[t], h, w_ru, w_c, b_ru, b_c, ...)

    Returns ``GRUSequence(r, u, c, h, h_final)``: steps ``[T, B, H]``, final state ``[B, H]``.
    """
    reset_after = v.reset_after_value(reset_after)
    impl, seq_len = v.gru_sequence_args(x, h0, w_ru, w_c, b_ru, b_c, reset_after=reset_after,
                                        seq_len=seq_len, backend=backend)
    return impl.gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, reset_after=reset_after,
                             seq_len=seq_len)


@accepts_any_array
def gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, seq, *, d_h=None, d_h_final=None,
                      reset_after=False, seq_len=None, backend=None) -> GRUSequenceGrads:
    """Backpropagation through time for ``gru_sequence``, given its result ``seq``.

    Upstream gradients (each optional, None meaning zeros): ``d_h [T, B, H]`` for the
    per-step ``h``, ``d_h_final [B, H]`` for the final state. ``reset_after`` and ``seq_len``
    must be those of the forward. Entries of ``x`` and ``d_h`` past a row's length are never
    read.

    Returns ``GRUSequenceGrads(x, h0, w_ru, w_c, b_ru, b_c)``.
    """
    reset_after = v.reset_after_value(reset_after)
    impl, seq_len = v.gru_sequence_args(
        x, h0, w_ru, w_c, b_ru, b_c, reset_after=reset_after, seq_len=seq_len, grad=True,
        seq=seq, d_h=d_h, d_h_final=d_h_final, backend=backend)
    return impl.gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, GRUSequence(*seq), d_h=d_h,
                                  d_h_final=d_h_final, reset_after=reset_after,
                                  seq_len=seq_len)
