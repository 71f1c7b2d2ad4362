"""The public cell operations: validate, pick the backend, call it. No math here.

The formulas are in ``gradcells.reference`` (and restated in each docstring below); the
accelerated backends compute the same functions.
"""

from __future__ import annotations

from . import _validate as v
from ._interop import accepts_any_array
from ._types import GRUCellGrads, GRUCellState, LSTMCellGrads, LSTMCellState


@accepts_any_array
def lstm_cell(x, cs_prev, h_prev, w, b, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
              cell_clip=None, backend=None) -> LSTMCellState:
    """One step of TensorFlow's LSTM block cell (gate layout i, ci, f, o).

    Shapes: ``x [B, I]``, ``cs_prev, h_prev [B, H]``, ``w [I+H, 4H]``, ``b [4H]``, peepholes
    ``wci, wcf, wco [H]`` (all or none). ``cell_clip`` None, 0 or negative: no clipping.

        G = [x, h_prev]·w + b;   i = σ(Gi + cs_prev∘wci);   ci = tanh(Gc)
        f = σ(Gf + forget_bias + cs_prev∘wcf);   cs = clip(i∘ci + f∘cs_prev)
        co = tanh(cs);   o = σ(Go + cs∘wco);   h = o∘co

    Returns ``LSTMCellState(i, cs, f, o, ci, co, h)``, each ``[B, H]``.
    """
    impl = v.lstm_cell_args(x, cs_prev, h_prev, w, b, wci, wcf, wco, backend=backend)
    return impl.lstm_cell(x, cs_prev, h_prev, w, b, wci=wci, wcf=wcf, wco=wco,
                          forget_bias=v.forget_bias_value(forget_bias, x.dtype),
                          cell_clip=v.cell_clip_value(cell_clip, x.dtype))


@accepts_any_array
def lstm_cell_grad(x, cs_prev, h_prev, w, b, state, *, d_h=None, d_cs=None, wci=None,
                   wcf=None, wco=None, cell_clip=None, clip_grad="exact",
                   backend=None) -> LSTMCellGrads:
    """Gradient of ``lstm_cell`` with respect to every input, given the forward's ``state``
    and the upstream gradients ``d_h`` and ``d_cs`` (None: zeros).

    ``clip_grad="exact"`` (default) is the true gradient: zero through the clip where it was
    active. ``"straight_through"`` passes it unchanged, as TensorFlow's ops do.

    Returns ``LSTMCellGrads(x, cs_prev, h_prev, w, b, wci, wcf, wco)`` (peepholes None
    when absent).
    """
    impl = v.lstm_cell_args(x, cs_prev, h_prev, w, b, wci, wcf, wco, grad=True, state=state,
                            d_h=d_h, d_cs=d_cs, backend=backend)
    return impl.lstm_cell_grad(x, cs_prev, h_prev, w, b, LSTMCellState(*state), d_h=d_h,
                               d_cs=d_cs, wci=wci, wcf=wcf, wco=wco,
                               cell_clip=v.cell_clip_value(cell_clip, x.dtype),
                               clip_grad=v.clip_grad_value(clip_grad))


@accepts_any_array
def gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c, *, reset_after=False,
             backend=None) -> GRUCellState:
    """One step of TensorFlow's GRU block cell.

    Shapes: ``x [B, I]``, ``h_prev [B, H]``, ``w_ru [I+H, 2H]`` (r then u), ``w_c [I+H, H]``,
    ``b_ru [2H]``, ``b_c [H]`` (``[2H]`` with ``reset_after=True``).

        [r, u] = σ([x, h_prev]·w_ru + b_ru);   c = tanh([x, r∘h_prev]·w_c + b_c)
        h = u∘h_prev + (1-u)∘c
        reset_after:  c = tanh(x·W_cx + b_cx + r∘(h_prev·W_ch + b_ch))

    Returns ``GRUCellState(r, u, c, h)``, each ``[B, H]``.
    """
    reset_after = v.reset_after_value(reset_after)
    impl = v.gru_cell_args(x, h_prev, w_ru, w_c, b_ru, b_c, reset_after=reset_after,
                           backend=backend)
    return impl.gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c, reset_after=reset_after)


@accepts_any_array
def gru_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, state, d_h=None, *, reset_after=False,
                  backend=None) -> GRUCellGrads:
    """Gradient of ``gru_cell`` with respect to every input, given the forward's ``state``
    and the upstream gradient ``d_h`` of ``h`` (None: zeros).

    Returns ``GRUCellGrads(x, h_prev, w_ru, w_c, b_ru, b_c)``.
    """
    reset_after = v.reset_after_value(reset_after)
    impl = v.gru_cell_args(x, h_prev, w_ru, w_c, b_ru, b_c, reset_after=reset_after,
                           grad=True, state=state, d_h=d_h, backend=backend)
    return impl.gru_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, GRUCellState(*state), d_h,
                              reset_after=reset_after)
