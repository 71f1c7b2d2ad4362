"""What the framework audits share: generated cases, and gradcells over time by looping the
public cells (``gradcells.testing.unrolled``), so the audit does not depend on the sequence
backends."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.types import Array
from ..cells import OPS
from ..cells.lstm.spec import PEEPHOLES
from ..testing import unrolled
from ..testing.cases import FORGET_BIASES, lstm_cell_case


def sizes(rng: np.random.Generator) -> dict[str, int]:
    return {"batch": int(rng.integers(1, 5)), "input_size": int(rng.integers(1, 6)),
            "hidden": int(rng.integers(1, 6))}


def f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def lstm_case(rng: np.random.Generator, dtype, **options) -> dict[str, Any]:
    """An ``lstm_cell`` case with sizes (and, unless given, peepholes and forget_bias) drawn."""
    options.setdefault("peephole", bool(rng.integers(2)))
    options.setdefault("forget_bias", float(rng.choice(FORGET_BIASES)))
    return lstm_cell_case(rng, dtype=dtype, **sizes(rng), **options)


def sequence(rng: np.random.Generator, case, dtype) -> np.ndarray:
    """An input sequence ``x [T, B, I]`` for a cell case, T drawn from 1..4."""
    steps = int(rng.integers(1, 5))
    return rng.standard_normal((steps,) + case["x"].shape).astype(dtype)


def stack(states, field: str) -> np.ndarray:
    return np.stack([getattr(s, field) for s in states])


def lstm_steps(x, cs0, h0, w, b, *, wci=None, wcf=None, wco=None, forget_bias=0.0,
               cell_clip=None) -> list:
    """Every step's ``LSTMCellState`` of gradcells's LSTM over ``x [T, B, I]``."""
    return unrolled.lstm_forward(x, cs0, h0, w, b, wci=wci, wcf=wcf, wco=wco,
                                 forget_bias=forget_bias, cell_clip=cell_clip).steps


def lstm_backprop(x, cs0, h0, w, b, states, d_cs, d_h, *, wci=None, wcf=None, wco=None,
                  cell_clip=None, clip_grad="exact") -> list[Array]:
    """Backpropagation through time over ``lstm_steps``'s ``states`` for upstream gradients
    ``d_cs, d_h [T, B, H]`` of every step's cs and h. Returns the gradients of
    ``(x, cs0, h0, w, b[, wci, wcf, wco])``."""
    weights = {"w": w, "b": b, **dict(zip(PEEPHOLES, (wci, wcf, wco), strict=True))}
    starts = [(cs0, h0)] + [(s.cs, s.h) for s in states[:-1]]
    run = unrolled.Unrolled("lstm", x, weights, {"cell_clip": cell_clip}, None, None,
                            list(states), starts, {"cs_final": cs0, "h_final": h0})
    grads = unrolled.lstm_backprop(run, d_h=d_h, d_cs=d_cs, clip_grad=clip_grad)
    names = OPS["lstm_sequence"].arrays[:5] + (PEEPHOLES if wci is not None else ())
    return [grads[k] for k in names]


def gru_steps(x, h0, w_ru, w_c, b_ru, b_c, *, reset_after) -> list:
    """Every step's ``GRUCellState`` of gradcells's GRU over ``x [T, B, I]``."""
    return unrolled.gru_forward(x, h0, w_ru, w_c, b_ru, b_c, reset_after=reset_after).steps


def gru_backprop(x, h0, w_ru, w_c, b_ru, b_c, states, d_h, *, reset_after) -> list[Array]:
    """Backpropagation through time over ``gru_steps``'s ``states`` for ``d_h [T, B, H]``.
    Returns the gradients of ``(x, h0, w_ru, w_c, b_ru, b_c)``."""
    weights = {"w_ru": w_ru, "w_c": w_c, "b_ru": b_ru, "b_c": b_c}
    starts = [h0] + [s.h for s in states[:-1]]
    run = unrolled.Unrolled("gru", x, weights, {"reset_after": reset_after}, None, None,
                            list(states), starts, {"h_final": h0})
    return list(unrolled.gru_backprop(run, d_h=d_h).values())
