"""Case generators: keyword arguments for the public operations, drawn from a NumPy
``Generator``.

``lstm_cell_case`` / ``gru_cell_case`` / ``lstm_sequence_case`` / ``gru_sequence_case`` take
the sizes and options; the ``random_*`` ones draw those too (what ``python -m gradcells
check`` runs).

Cases with clipping choose ``cell_clip`` at least ``CLIP_MARGIN`` away from every unclipped
``|cs|``, so that a finite-difference step never crosses the clip boundary: there the
function has a kink and no difference quotient means anything.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import sequences, steps
from .._core import trees
from .._core.plan import masked
from .._core.specs import MASKS
from ..cells.gru.spec import GRUWeights
from ..cells.lstm.spec import LN_CARRIES, PEEPHOLES, LSTMNorm, LSTMWeights
from ..cells.mingru.spec import ACTIVATIONS as MINGRU_ACTIVATIONS
from ..cells.mingru.spec import MinGRUWeights
from ..cells.minlstm.spec import MinLSTMWeights
from ..cells.rglru.spec import RGLRUWeights
from ..cells.rnn.spec import ACTIVATIONS, RNNWeights
from ..cells.slstm.spec import FORGETS, SLSTMWeights

CLIP_MARGIN = 1e-2
FORGET_BIASES = (0.0, 1.0, -0.5, 2.5)
SCALES = (0.5, 1.0, 2.0)

Case = dict[str, Any]
"""Keyword arguments for one public forward operation."""


def _normal(rng, shape, scale, dtype):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _as_float64(case):
    """``case`` with every float array (those of a ``layer_norm`` too) in float64."""
    def convert(v):
        if isinstance(v, LSTMNorm):
            return LSTMNorm(*map(convert, v))
        return v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
    return {k: convert(v) for k, v in case.items()}


def _lstm_options(rng, hidden, dtype, proj_size, layer_norm, ln_carry):
    """An LSTM case's optional parts, drawn after its other arrays: a projection ``w_proj
    [H, P]`` (its clip off until one is chosen) and a layer norm, when asked for."""
    options = {}
    if proj_size is not None:
        options["w_proj"] = _normal(rng, (hidden, proj_size), 1.0 / np.sqrt(max(1, hidden)),
                                    dtype)
        options["proj_clip"] = None
    if layer_norm:
        options.update(_norm_parameters(rng, hidden, dtype, ln_carry))
    return options


def _norm_parameters(rng, hidden, dtype, ln_carry):
    """A layer norm for an LSTM case: gains ``1 + 0.2·N(0, 1)``, shifts ``0.1·N(0, 1)``
    (``[4H]`` for the gate norms, ``[H]`` for the cell's), its ``ln_carry`` and the default
    ``ln_epsilon``."""
    arrays = []
    for width in (4 * hidden, 4 * hidden, hidden):
        arrays += [(1 + 0.2 * rng.standard_normal(width)).astype(dtype),
                   _normal(rng, (width,), 0.1, dtype)]
    return {"layer_norm": LSTMNorm(*arrays), "ln_carry": ln_carry, "ln_epsilon": 1e-5}


def clip_levels(values: Any, margin: float = CLIP_MARGIN) -> list[float]:
    """Every clip level that clips some of ``|values|`` and keeps each at least ``margin``
    away: midpoints of the gaps wider than ``2·margin`` between the sorted ``|values|``,
    nearest the median first, then half the smallest value (which clips them all)."""
    levels = np.sort(np.abs(np.asarray(values, dtype=np.float64)).ravel())
    if levels.size == 0:
        return []
    midpoints = 0.5 * (levels[1:] + levels[:-1])
    wide = midpoints[(levels[1:] - levels[:-1]) > 2 * margin]
    ordered = wide[np.argsort(np.abs(wide - np.median(levels)), kind="stable")]
    return [float(v) for v in ordered] + ([float(0.5 * levels[0])]
                                          if levels[0] > 2 * margin else [])


def clip_away_from(values: Any, margin: float = CLIP_MARGIN) -> float | None:
    """The first of ``clip_levels(values, margin)``; None when there is none."""
    levels = clip_levels(values, margin)
    return levels[0] if levels else None


def _lstm_parameters(rng, input_size, hidden, dtype, peephole, scale, width=None):
    """``w, b`` (and the peepholes, else None) drawn for an LSTM case, in a fixed order;
    ``width``: the recurrent width P (the projection's; None: H)."""
    width = hidden if width is None else width
    fan_in = max(1, input_size + width)
    params = {
        "w": _normal(rng, (input_size + width, 4 * hidden), scale / np.sqrt(fan_in), dtype),
        "b": _normal(rng, (4 * hidden,), 0.1 * scale, dtype),
        **dict.fromkeys(PEEPHOLES),
    }
    if peephole:
        for name in PEEPHOLES:
            params[name] = _normal(rng, (hidden,), 0.5 * scale, dtype)
    return params


def _gru_parameters(rng, input_size, hidden, dtype, reset_after, scale):
    """``w_ru, w_c, b_ru, b_c`` drawn for a GRU case (``b_c`` of 2H with ``reset_after``)."""
    fan_in = max(1, input_size + hidden)
    return {
        "w_ru": _normal(rng, (input_size + hidden, 2 * hidden), scale / np.sqrt(fan_in), dtype),
        "w_c": _normal(rng, (input_size + hidden, hidden), scale / np.sqrt(fan_in), dtype),
        "b_ru": _normal(rng, (2 * hidden,), 0.1 * scale, dtype),
        "b_c": _normal(rng, ((2 if reset_after else 1) * hidden,), 0.1 * scale, dtype),
        "reset_after": bool(reset_after),
    }


def lstm_cell_case(rng: np.random.Generator, *, batch: int = 3, input_size: int = 4,
                   hidden: int = 5, dtype: Any = np.float64, peephole: bool = False,
                   clip: bool = False, forget_bias: float = 1.0, scale: float = 1.0,
                   proj_size: int | None = None, proj_clip: bool = False,
                   layer_norm: bool = False, ln_carry: str = "raw") -> Case:
    """Keyword arguments for ``lstm_cell``: weights scaled by ``scale/sqrt(I+P)``, states and
    inputs standard normal; ``clip=True`` picks a ``cell_clip`` that clips part of ``cs``.
    ``proj_size=P`` adds a projection ``w_proj [H, P]`` (``h_prev`` then ``[B, P]``), and
    ``proj_clip=True`` a ``proj_clip`` that clips part of it, likewise away from the kink.
    ``layer_norm=True`` adds a layer norm (``_norm_parameters``) carrying ``ln_carry``, and
    keeps every row it normalises ``LN_MARGIN`` away from constant."""
    width = hidden if proj_size is None else proj_size

    def draw():
        case = {
            "x": _normal(rng, (batch, input_size), 1.0, dtype),
            "cs_prev": _normal(rng, (batch, hidden), 1.0, dtype),
            "h_prev": _normal(rng, (batch, width), 0.5, dtype),
            **_lstm_parameters(rng, input_size, hidden, dtype, peephole, scale, width),
            "forget_bias": float(forget_bias), "cell_clip": None,
        }
        case.update(_lstm_options(rng, hidden, dtype, proj_size, layer_norm, ln_carry))
        as64 = _as_float64(case)
        if clip:
            state = steps.lstm_cell(**as64, backend="reference")
            case["cell_clip"] = as64["cell_clip"] = clip_away_from(
                state.i * state.ci + state.f * as64["cs_prev"])
        if proj_clip and proj_size is not None:
            state = steps.lstm_cell(**as64, backend="reference")
            case["proj_clip"] = clip_away_from((state.o * state.co) @ as64["w_proj"])
        return case

    return _spread_rows(draw) if layer_norm else draw()


LN_MARGIN = 0.1
"""A layer-norm case keeps ``sqrt(var + ln_epsilon)`` of every row it normalises (of two
columns or more) at least this large. ``LN(z)`` follows the direction of ``z - mean(z)``,
which turns fast where that is small (with two columns, ``LN(z) ≈ ±1`` flips sign): a
difference quotient over a nearly constant row measures the curvature, not the
derivative."""


def _normalised_rows(case):
    """Every row that the case's three layer norms normalise, at the valid steps: ``x·W_x``,
    ``h_prev·W_h`` and the clipped ``c̃`` (float64, from the reference)."""
    as64 = _as_float64(case)
    x, w = as64["x"], as64["w"]
    if x.ndim == 2:
        result = steps.lstm_cell(**as64, backend="reference")
        x, h_prev, cs_prev = x[None], as64["h_prev"][None], as64["cs_prev"][None]
        per_step = [a[None] for a in result]
        valid = np.ones(x.shape[:2], dtype=bool)
    else:
        per_step = sequences.lstm_sequence(**as64, backend="reference")
        valid = _valid_steps(as64)
        cs_prev, h_prev = (_starts(as64[first], getattr(per_step, field), as64)
                           for first, field in (("cs0", "cs"), ("h0", "h")))
    i, _, f, _, ci = per_step[:5]
    c_tilde = i * ci + f * cs_prev
    if as64["cell_clip"] is not None:
        c_tilde = np.clip(c_tilde, -as64["cell_clip"], as64["cell_clip"])
    n_in = x.shape[-1]
    return [a[valid] for a in (x @ w[:n_in], h_prev @ w[n_in:], c_tilde)]


def _spread_rows(draw, attempts=10):
    """``draw()`` again until every normalised row of two columns or more keeps
    ``sqrt(var + ln_epsilon) >= LN_MARGIN``; when ``attempts`` draws do not, the last one
    with ``ln_epsilon = LN_MARGIN²``, which keeps every row so."""
    for _ in range(attempts):
        case = draw()
        if all(rows.shape[-1] < 2 or rows.size == 0
               or rows.var(axis=-1).min() + case["ln_epsilon"] >= LN_MARGIN**2
               for rows in _normalised_rows(case)):
            return case
    return {**case, "ln_epsilon": LN_MARGIN**2}


def gru_cell_case(rng: np.random.Generator, *, batch: int = 3, input_size: int = 4,
                  hidden: int = 5, dtype: Any = np.float64, reset_after: bool = False,
                  scale: float = 1.0) -> Case:
    """Keyword arguments for ``gru_cell``."""
    return {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        **_gru_parameters(rng, input_size, hidden, dtype, reset_after, scale),
    }


def random_lstm_cell_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """An ``lstm_cell`` case with sizes, peepholes, clipping, forget_bias, a projection and
    a layer norm drawn from ``rng``."""
    return lstm_cell_case(
        rng, batch=int(rng.integers(1, 5)), input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 6)), dtype=dtype, peephole=bool(rng.integers(2)),
        clip=bool(rng.integers(2)), forget_bias=float(rng.choice(FORGET_BIASES)),
        scale=float(rng.choice(SCALES)), **_random_options(rng))


def _random_options(rng):
    """A projection for a third of the random LSTM cases (P from 1 to 5), clipped or not,
    and a layer norm for a third of them, either carry."""
    options = {}
    if not rng.integers(3):
        options = {"proj_size": int(rng.integers(1, 6)), "proj_clip": bool(rng.integers(2))}
    if not rng.integers(3):
        options.update(layer_norm=True, ln_carry=str(rng.choice(LN_CARRIES)))
    return options


def _random_order(rng, order):
    """With ``order``: ``reverse`` for half the random sequence cases, ``batch_first`` for a
    quarter and every mask for a third (``python -m gradcells check`` draws them; a case for
    a caller that runs the backends directly, time-major, forward and unmasked, leaves them
    out)."""
    if not order:
        return {}
    return {"reverse": bool(rng.integers(2)), "batch_first": not rng.integers(4),
            "masks": not rng.integers(3)}


def random_gru_cell_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """A ``gru_cell`` case with sizes and ``reset_after`` drawn from ``rng``."""
    return gru_cell_case(
        rng, batch=int(rng.integers(1, 5)), input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 6)), dtype=dtype, reset_after=bool(rng.integers(2)),
        scale=float(rng.choice(SCALES)))


def on_library(case: Case, library: str) -> Case:
    """``case`` with every array moved to ``library`` ("numpy" or "cupy")."""
    if library == "numpy":
        return case
    import cupy

    # weight sets, an LSTMNorm, a stack's lists of weight sets or dropout masks: trees
    return trees.map_leaves(lambda a: cupy.asarray(a) if isinstance(a, np.ndarray) else a,
                            case)


# --------------------------------------------------------------------------------------
# Sequences

def _order(reverse):
    """The ``reverse`` keyword of a sequence case: present only when True, so that a case
    for a forward sequence holds the keywords it always held."""
    return {"reverse": True} if reverse else {}


def _in_layout(case, batch_first):
    """``case`` (built time-major) with ``batch_first``: ``x`` and the per-step masks as
    ``[B, T, ·]`` (C-contiguous copies; a mask of every row, the same at every step, as
    ``[B, 1, ·]``) and the keyword set; unchanged otherwise. A case is drawn and its clips
    chosen time-major, so the two layouts of one seed are the same case."""
    if not batch_first:
        return case
    moved = {"x": np.ascontiguousarray(case["x"].transpose(1, 0, 2)), "batch_first": True}
    for name in MASKS:
        mask = case.get(name)
        if mask is not None and MASKS[name][0] == "T" and mask.ndim >= 2:
            moved[name] = (np.ascontiguousarray(mask.swapaxes(0, 1))
                           if mask.ndim == len(MASKS[name]) else mask[:, None, :])
    return {**case, **moved}


def _draw_masks(rng, steps, batch, n_in, hidden, width, dtype, lstm):
    """Every mask of a sequence case (docs/spec.md §11.3), each either per step and
    fractional or the same at every step and 0/1 over the keep probability (drawn); a zoneout
    mask of the cell state for an LSTM."""
    def mask(n, low, high, binary_keep=None):
        if rng.integers(2):
            return rng.uniform(low, high, (steps, batch, n)).astype(dtype)
        if binary_keep is None:
            return rng.uniform(low, high, n).astype(dtype)
        return (rng.integers(0, 2, (batch, n)) / binary_keep).astype(dtype)

    masks = {"input_mask": mask(n_in, 0.5, 1.0, 0.8),
             "recurrent_mask": (rng.integers(0, 2, (batch, width)) / 0.8).astype(dtype),
             "zoneout_h": mask(width, 0.0, 0.5)}
    if lstm:
        masks["zoneout_cs"] = mask(hidden, 0.0, 0.5)
    return masks


def ragged_lengths(rng: np.random.Generator, steps: int, batch: int) -> np.ndarray:
    """Per-row lengths in [0, T] (int64): the first row runs all T steps, the second none
    (when the batch has two rows), the others are drawn."""
    lengths = rng.integers(0, steps + 1, size=batch)
    lengths[:1] = steps
    lengths[1:2] = 0
    return lengths.astype(np.int64)


def _sequence_clip(case, margin=CLIP_MARGIN, attempts=6, name="cell_clip"):
    """A ``cell_clip`` (or, ``name="proj_clip"``, a ``proj_clip``) for an LSTM sequence case
    that clips some of the values it clips and stays at least ``margin`` away from every
    unclipped one (``|i∘ci + f∘cs_prev|``, or ``|(o∘co)·w_proj|``) of every valid step; None
    when none is found. The case's other settings stay as they are.

    Clipping one step changes the states after it, so each candidate level (from the
    unclipped run) is refined by fixed-point iteration: rerun clipped at the level, and
    accept it when the rerun's raw values keep the margin, else move to the level
    ``clip_away_from`` picks for them.
    """
    as64 = _as_float64(case)
    steps, batch = as64["x"].shape[:2]
    if steps == 0 or batch == 0:
        return None
    valid = _valid_steps(as64)

    def raw_values(level):
        seq = sequences.lstm_sequence(**{**as64, name: level}, backend="reference")
        if name == "proj_clip":
            return np.abs((seq.o * seq.co) @ as64["w_proj"])[valid]
        cs_prev = _starts(as64["cs0"], seq.cs, as64)
        return np.abs(seq.i * seq.ci + seq.f * cs_prev)[valid]

    for level in clip_levels(raw_values(None), margin)[:attempts]:
        for _ in range(3):
            raw = raw_values(level)
            if raw.max() > level and np.min(np.abs(raw - level)) >= margin:
                return level
            level = clip_away_from(raw, margin)
            if level is None:
                break
    return None


def _valid_steps(case):
    """``[T, B]``: whether row b runs at time t in a (time-major) sequence case."""
    steps, batch = case["x"].shape[:2]
    lengths = np.full(batch, steps) if case["seq_len"] is None else case["seq_len"]
    return np.arange(steps)[:, None] < lengths


def _starts(first, steps, case):
    """The state each valid step of a (time-major) sequence case started from, at its time
    position: the previous time's state, or, with ``reverse``, the next time's (``first`` at
    each row's first step in run order)."""
    if not case.get("reverse"):
        return np.concatenate([first[None], steps])[:-1]
    later = np.concatenate([steps, first[None]])[1:]
    has_later = np.roll(_valid_steps(case), -1, axis=0)
    has_later[-1:] = False
    return np.where(has_later[:, :, None], later, first[None])


def _sequence_clips(case, cell_clip, proj_clip, rounds=3):
    """``case`` with its clips chosen: each is picked with the other fixed, until both keep
    their margin in the same run (a clip that finds none is left off, None)."""
    for _ in range(rounds if cell_clip and proj_clip else 1):
        changed = False
        for name, wanted in (("cell_clip", cell_clip), ("proj_clip", proj_clip)):
            if wanted:
                level = _sequence_clip(case, name=name)
                changed |= level != case[name]
                case[name] = level
        if not changed:
            break
    return case


def lstm_sequence_case(rng: np.random.Generator, *, steps: int = 4, batch: int = 3,
                       input_size: int = 4, hidden: int = 5, dtype: Any = np.float64,
                       peephole: bool = False, clip: bool = False, forget_bias: float = 1.0,
                       scale: float = 1.0, ragged: bool = False, proj_size: int | None = None,
                       proj_clip: bool = False, layer_norm: bool = False,
                       ln_carry: str = "raw", reverse: bool = False,
                       batch_first: bool = False, masks: bool = False) -> Case:
    """Keyword arguments for ``lstm_sequence``, drawn like ``lstm_cell_case``; ``ragged=True``
    adds ``seq_len`` from ``ragged_lengths``. ``clip=True`` picks a ``cell_clip`` that clips
    part of the cell states and stays ``CLIP_MARGIN`` away from every unclipped one (None
    when no such level exists); ``proj_size``, ``proj_clip``, ``layer_norm`` and
    ``ln_carry`` as for ``lstm_cell_case``; ``reverse`` and ``batch_first`` as
    ``_order`` and ``_in_layout`` say; ``masks=True`` adds every mask (``_draw_masks``)."""
    width = hidden if proj_size is None else proj_size

    def draw():
        case = {
            "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
            "cs0": _normal(rng, (batch, hidden), 1.0, dtype),
            "h0": _normal(rng, (batch, width), 0.5, dtype),
            **_lstm_parameters(rng, input_size, hidden, dtype, peephole, scale, width),
            "forget_bias": float(forget_bias), "cell_clip": None,
            "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
            **_order(reverse),
        }
        case.update(_lstm_options(rng, hidden, dtype, proj_size, layer_norm, ln_carry))
        if masks:  # before the clips are chosen: the clips see the masked run
            case.update(_draw_masks(rng, steps, batch, input_size, hidden, width, dtype, True))
        return _sequence_clips(case, clip, proj_clip and proj_size is not None)

    return _in_layout(_spread_rows(draw) if layer_norm else draw(), batch_first)


def gru_sequence_case(rng: np.random.Generator, *, steps: int = 4, batch: int = 3,
                      input_size: int = 4, hidden: int = 5, dtype: Any = np.float64,
                      reset_after: bool = False, scale: float = 1.0,
                      ragged: bool = False, reverse: bool = False,
                      batch_first: bool = False, masks: bool = False) -> Case:
    """Keyword arguments for ``gru_sequence``, drawn like ``gru_cell_case``; ``reverse``,
    ``batch_first`` and ``masks`` as for ``lstm_sequence_case``."""
    return _in_layout({
        "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
        "h0": _normal(rng, (batch, hidden), 0.5, dtype),
        **_gru_parameters(rng, input_size, hidden, dtype, reset_after, scale),
        "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
        **_order(reverse),
        **(_draw_masks(rng, steps, batch, input_size, hidden, hidden, dtype, False)
           if masks else {}),
    }, batch_first)


def random_lstm_sequence_case(rng: np.random.Generator, dtype: Any = np.float64, *,
                              order: bool = False) -> Case:
    """An ``lstm_sequence`` case (T <= 4) with sizes, peepholes, clipping, forget_bias,
    ragged lengths, a projection and a layer norm drawn from ``rng``, and with ``order`` the
    time order, the layout and the masks."""
    return lstm_sequence_case(
        rng, steps=int(rng.integers(1, 5)), batch=int(rng.integers(1, 5)),
        input_size=int(rng.integers(1, 5)), hidden=int(rng.integers(1, 5)), dtype=dtype,
        peephole=bool(rng.integers(2)), clip=bool(rng.integers(2)),
        forget_bias=float(rng.choice(FORGET_BIASES)),
        scale=float(rng.choice(SCALES)), ragged=bool(rng.integers(2)),
        **_random_options(rng), **_random_order(rng, order))


def random_gru_sequence_case(rng: np.random.Generator, dtype: Any = np.float64, *,
                             order: bool = False) -> Case:
    """A ``gru_sequence`` case (T <= 4) with sizes, ``reset_after`` and ragged lengths drawn
    from ``rng``, and with ``order`` the time order, the layout and the masks."""
    return gru_sequence_case(
        rng, steps=int(rng.integers(1, 5)), batch=int(rng.integers(1, 5)),
        input_size=int(rng.integers(1, 5)), hidden=int(rng.integers(1, 5)), dtype=dtype,
        reset_after=bool(rng.integers(2)), scale=float(rng.choice(SCALES)),
        ragged=bool(rng.integers(2)), **_random_order(rng, order))


# --------------------------------------------------------------------------------------
# The plain RNN cell

KINK_MARGIN = 1e-3
"""A relu case keeps every pre-activation at least this far from relu's kink at 0."""


def _rnn_parameters(rng, input_size, hidden, dtype, activation, scale):
    """``w, b`` drawn for a plain RNN case, and its ``activation``."""
    fan_in = max(1, input_size + hidden)
    return {"w": _normal(rng, (input_size + hidden, hidden), scale / np.sqrt(fan_in), dtype),
            "b": _normal(rng, (hidden,), 0.1 * scale, dtype), "activation": activation}


def _preactivations(case):
    """Every pre-activation ``z`` of a valid step of the case's forward (float64), what the
    masks make of the input and the state included."""
    as64 = _as_float64(case)
    if as64["x"].ndim == 2:
        z = np.concatenate([as64["x"], as64["h_prev"]], axis=1) @ as64["w"] + as64["b"]
        return z.ravel()
    seq = sequences.rnn_sequence(**as64, backend="reference")
    h_prev = _starts(as64["h0"], seq.h, as64)
    x = masked(as64["x"], as64.get("input_mask"))
    h_prev = masked(h_prev, as64.get("recurrent_mask"))
    z = np.concatenate([np.broadcast_to(x, (*h_prev.shape[:2], x.shape[2])), h_prev],
                       axis=2) @ as64["w"] + as64["b"]
    return z[_valid_steps(as64)].ravel()


def _away_from_the_kink(draw, attempts=20):
    """``draw()`` again until no relu pre-activation is within ``KINK_MARGIN`` of 0 (a
    difference quotient across the kink means nothing); tanh cases are taken at once."""
    for _ in range(attempts):
        case = draw()
        if case["activation"] != "relu" or not (
                np.abs(_preactivations(case)) < KINK_MARGIN).any():
            return case
    return case


def rnn_cell_case(rng: np.random.Generator, *, batch: int = 3, input_size: int = 4,
                  hidden: int = 5, dtype: Any = np.float64, activation: str = "tanh",
                  scale: float = 1.0) -> Case:
    """Keyword arguments for ``rnn_cell``; a relu case keeps its pre-activations
    ``KINK_MARGIN`` away from 0."""
    return _away_from_the_kink(lambda: {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        **_rnn_parameters(rng, input_size, hidden, dtype, activation, scale)})


def rnn_sequence_case(rng: np.random.Generator, *, steps: int = 4, batch: int = 3,
                      input_size: int = 4, hidden: int = 5, dtype: Any = np.float64,
                      activation: str = "tanh", scale: float = 1.0,
                      ragged: bool = False, reverse: bool = False,
                      batch_first: bool = False, masks: bool = False) -> Case:
    """Keyword arguments for ``rnn_sequence``, drawn like ``rnn_cell_case``; ``reverse``,
    ``batch_first`` and ``masks`` as for ``lstm_sequence_case``."""
    return _in_layout(_away_from_the_kink(lambda: {
        "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
        "h0": _normal(rng, (batch, hidden), 0.5, dtype),
        **_rnn_parameters(rng, input_size, hidden, dtype, activation, scale),
        "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
        **_order(reverse),
        **(_draw_masks(rng, steps, batch, input_size, hidden, hidden, dtype, False)
           if masks else {})}), batch_first)


def random_rnn_cell_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """An ``rnn_cell`` case with sizes and ``activation`` drawn from ``rng``."""
    return rnn_cell_case(
        rng, batch=int(rng.integers(1, 5)), input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 6)), dtype=dtype,
        activation=str(rng.choice(ACTIVATIONS)), scale=float(rng.choice(SCALES)))


def random_rnn_sequence_case(rng: np.random.Generator, dtype: Any = np.float64, *,
                             order: bool = False) -> Case:
    """An ``rnn_sequence`` case (T <= 4) with sizes, ``activation`` and ragged lengths drawn
    from ``rng``, and with ``order`` the time order, the layout and the masks."""
    return rnn_sequence_case(
        rng, steps=int(rng.integers(1, 5)), batch=int(rng.integers(1, 5)),
        input_size=int(rng.integers(1, 5)), hidden=int(rng.integers(1, 5)), dtype=dtype,
        activation=str(rng.choice(ACTIVATIONS)), scale=float(rng.choice(SCALES)),
        ragged=bool(rng.integers(2)), **_random_order(rng, order))


# --------------------------------------------------------------------------------------
# The minGRU (docs/spec.md §18.2)


def _mingru_parameters(rng, input_size, hidden, dtype, activation, scale):
    """``w [I, 2H]``, ``b [2H]`` drawn for a minGRU case, and its ``activation``."""
    return {"w": _normal(rng, (input_size, 2 * hidden), scale / np.sqrt(max(1, input_size)),
                         dtype),
            "b": _normal(rng, (2 * hidden,), 0.5 * scale, dtype), "activation": activation}


def _mingru_away_from_the_kink(draw, attempts=20, blocks=2):
    """``draw()`` again until no candidate pre-activation ``x·w_h + b_h`` (of any step) is
    within ``KINK_MARGIN`` of the paper's ``g``'s kink at 0 (its slope jumps from 1/4 to 1
    there); identity cases are taken at once. ``blocks``: the weight's column blocks, the
    candidate's last (2: the minGRU, 3: the minLSTM)."""
    for _ in range(attempts):
        case = draw()
        first = (blocks - 1) * case["b"].shape[0] // blocks     # the candidate's columns
        p_h = (np.asarray(case["x"], np.float64) @ np.asarray(case["w"], np.float64)[:, first:]
               + np.asarray(case["b"], np.float64)[first:])
        if case["activation"] != "g" or not (np.abs(p_h) < KINK_MARGIN).any():
            return case
    return case


def mingru_cell_case(rng: np.random.Generator, *, batch: int = 3, input_size: int = 4,
                     hidden: int = 5, dtype: Any = np.float64, activation: str = "g",
                     scale: float = 1.0) -> Case:
    """Keyword arguments for ``mingru_cell``; a ``g`` case keeps its candidate
    pre-activations ``KINK_MARGIN`` away from 0."""
    return _mingru_away_from_the_kink(lambda: {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        **_mingru_parameters(rng, input_size, hidden, dtype, activation, scale)})


def mingru_sequence_case(rng: np.random.Generator, *, steps: int = 4, batch: int = 3,
                         input_size: int = 4, hidden: int = 5, dtype: Any = np.float64,
                         activation: str = "g", method: str = "auto", scale: float = 1.0,
                         ragged: bool = False, reverse: bool = False,
                         batch_first: bool = False) -> Case:
    """Keyword arguments for ``mingru_sequence``, drawn like ``mingru_cell_case``;
    ``method`` (given only when not "auto"), ``reverse`` and ``batch_first`` as for
    ``lstm_sequence_case`` (the minGRU takes no masks)."""
    return _in_layout(_mingru_away_from_the_kink(lambda: {
        "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
        "h0": _normal(rng, (batch, hidden), 0.5, dtype),
        **_mingru_parameters(rng, input_size, hidden, dtype, activation, scale),
        **({} if method == "auto" else {"method": method}),
        "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
        **_order(reverse)}), batch_first)


def random_mingru_cell_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """A ``mingru_cell`` case with sizes and ``activation`` drawn from ``rng``."""
    return mingru_cell_case(
        rng, batch=int(rng.integers(1, 5)), input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 6)), dtype=dtype,
        activation=str(rng.choice(MINGRU_ACTIVATIONS)), scale=float(rng.choice(SCALES)))


def random_mingru_sequence_case(rng: np.random.Generator, dtype: Any = np.float64, *,
                                order: bool = False) -> Case:
    """A ``mingru_sequence`` case (T <= 4) with sizes, ``activation``, ``method`` and ragged
    lengths drawn from ``rng``, and with ``order`` the time order and the layout."""
    drawn = _random_order(rng, order)
    drawn.pop("masks", None)
    return mingru_sequence_case(
        rng, steps=int(rng.integers(1, 5)), batch=int(rng.integers(1, 5)),
        input_size=int(rng.integers(1, 5)), hidden=int(rng.integers(1, 5)), dtype=dtype,
        activation=str(rng.choice(MINGRU_ACTIVATIONS)),
        method=str(rng.choice(("sequential", "parallel"))), scale=float(rng.choice(SCALES)),
        ragged=bool(rng.integers(2)), **drawn)


# --------------------------------------------------------------------------------------
# xLSTM's sLSTM (docs/spec.md §19)

TIE_MARGIN = 1e-3
"""An sLSTM case keeps the two branches of every stabiliser ``m = max(ĩ, lf + m_prev)`` at
least this far apart: a difference quotient across the tie means nothing."""


def _slstm_parameters(rng, input_size, hidden, heads, dtype, forget, stabilizer_grad, scale):
    """``w [I, 4H]``, ``r [N, H/N, 4H/N]``, ``b [4H]`` drawn for an sLSTM case, and its
    settings; N is ``gcd(hidden, heads)``, the most heads up to ``heads`` that divide H."""
    heads = math.gcd(hidden, heads) or 1
    d = hidden // heads
    return {"w": _normal(rng, (input_size, 4 * hidden), scale / np.sqrt(max(1, input_size)),
                         dtype),
            "r": _normal(rng, (heads, d, 4 * d), scale / np.sqrt(max(1, d)), dtype),
            "b": _normal(rng, (4 * hidden,), 0.5 * scale, dtype),
            "forget": forget, "stabilizer_grad": stabilizer_grad}


def _slstm_states(rng, leading, hidden, dtype, names):
    """The state ``c, n, m, h`` of an sLSTM case: ``n`` positive (a normaliser)."""
    c, n, m, h = names
    return {c: _normal(rng, (*leading, hidden), 1.0, dtype),
            n: rng.uniform(0.5, 2.0, (*leading, hidden)).astype(dtype),
            m: _normal(rng, (*leading, hidden), 1.0, dtype),
            h: _normal(rng, (*leading, hidden), 0.5, dtype)}


def _branch_gaps(case):
    """``|ĩ - (lf + m_prev)|`` at every valid step of the case's forward (float64): the
    stabilised gates are ``e^{-gap}`` and 1, so the gap is ``|log i - log f|``."""
    as64 = _as_float64(case)
    if as64["x"].ndim == 2:
        result = steps.slstm_cell(**as64, backend="reference")
        i, f = result.i, result.f
    else:
        result = sequences.slstm_sequence(**as64, backend="reference")
        valid = _valid_steps(as64)   # the case is time-major here
        i, f = result.i[valid], result.f[valid]
    with np.errstate(divide="ignore"):
        return np.abs(np.log(i) - np.log(f)).ravel()


def _away_from_the_tie(draw, attempts=20):
    """``draw()`` again until every stabiliser's branches are ``TIE_MARGIN`` apart."""
    for _ in range(attempts):
        case = draw()
        if not (_branch_gaps(case) < TIE_MARGIN).any():
            return case
    return case


def slstm_cell_case(rng: np.random.Generator, *, batch: int = 3, input_size: int = 4,
                    hidden: int = 4, heads: int = 2, dtype: Any = np.float64,
                    forget: str = "sigmoid", stabilizer_grad: str = "exact",
                    scale: float = 1.0) -> Case:
    """Keyword arguments for ``slstm_cell`` (``heads``: ``gcd(hidden, heads)`` heads), its
    stabiliser's branches ``TIE_MARGIN`` apart."""
    return _away_from_the_tie(lambda: {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        **_slstm_states(rng, (batch,), hidden, dtype, ("c_prev", "n_prev", "m_prev", "h_prev")),
        **_slstm_parameters(rng, input_size, hidden, heads, dtype, forget, stabilizer_grad,
                            scale)})


def slstm_sequence_case(rng: np.random.Generator, *, steps: int = 4, batch: int = 3,
                        input_size: int = 4, hidden: int = 4, heads: int = 2,
                        dtype: Any = np.float64, forget: str = "sigmoid",
                        stabilizer_grad: str = "exact", scale: float = 1.0,
                        ragged: bool = False, reverse: bool = False,
                        batch_first: bool = False, masks: bool = False) -> Case:
    """Keyword arguments for ``slstm_sequence``, drawn like ``slstm_cell_case``;
    ``reverse``, ``batch_first`` and ``masks`` (the input and recurrent masks) as for
    ``lstm_sequence_case``."""
    def draw():
        case = {
            "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
            **_slstm_states(rng, (batch,), hidden, dtype, ("c0", "n0", "m0", "h0")),
            **_slstm_parameters(rng, input_size, hidden, heads, dtype, forget,
                                stabilizer_grad, scale),
            "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
            **_order(reverse)}
        if masks:
            drawn = _draw_masks(rng, steps, batch, input_size, hidden, hidden, dtype, False)
            case.update({k: drawn[k] for k in ("input_mask", "recurrent_mask")})
        return case

    return _in_layout(_away_from_the_tie(draw), batch_first)


def _slstm_sizes(rng):
    """Random sLSTM sizes: ``hidden`` 1 to 4 and a number of heads dividing it, and
    ``forget``. ``stabilizer_grad`` stays "exact": the oracle's cases are differentiated,
    and "stop" is by design not the derivative of a loss on the state (its tests compare
    it with "exact")."""
    hidden = int(rng.integers(1, 5))
    heads = int(rng.choice([k for k in range(1, hidden + 1) if hidden % k == 0]))
    return {"batch": int(rng.integers(1, 4)), "input_size": int(rng.integers(1, 4)),
            "hidden": hidden, "heads": heads, "forget": str(rng.choice(FORGETS)),
            "scale": float(rng.choice(SCALES))}


def random_slstm_cell_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """An ``slstm_cell`` case with sizes, heads and ``forget`` drawn from ``rng``."""
    return slstm_cell_case(rng, dtype=dtype, **_slstm_sizes(rng))


def random_slstm_sequence_case(rng: np.random.Generator, dtype: Any = np.float64, *,
                               order: bool = False) -> Case:
    """An ``slstm_sequence`` case (T <= 4) with sizes, heads, the settings and ragged
    lengths drawn from ``rng``, and with ``order`` the time order, the layout and the
    masks."""
    return slstm_sequence_case(rng, steps=int(rng.integers(1, 5)), dtype=dtype,
                               **_slstm_sizes(rng), ragged=bool(rng.integers(2)),
                               **_random_order(rng, order))


# --------------------------------------------------------------------------------------
# Stacks (docs/spec.md §11.4)

# --------------------------------------------------------------------------------------
# The minLSTM (docs/spec.md §18.2)


def _minlstm_parameters(rng, input_size, hidden, dtype, activation, scale):
    """``w [I, 3H]``, ``b [3H]`` drawn for a minLSTM case, and its ``activation``."""
    return {"w": _normal(rng, (input_size, 3 * hidden), scale / np.sqrt(max(1, input_size)),
                         dtype),
            "b": _normal(rng, (3 * hidden,), 0.5 * scale, dtype), "activation": activation}


def minlstm_cell_case(rng: np.random.Generator, *, batch: int = 3, input_size: int = 4,
                      hidden: int = 5, dtype: Any = np.float64, activation: str = "g",
                      scale: float = 1.0) -> Case:
    """Keyword arguments for ``minlstm_cell``; a ``g`` case keeps its candidate
    pre-activations ``KINK_MARGIN`` away from 0."""
    return _mingru_away_from_the_kink(lambda: {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        **_minlstm_parameters(rng, input_size, hidden, dtype, activation, scale)}, blocks=3)


def minlstm_sequence_case(rng: np.random.Generator, *, steps: int = 4, batch: int = 3,
                          input_size: int = 4, hidden: int = 5, dtype: Any = np.float64,
                          activation: str = "g", method: str = "auto", scale: float = 1.0,
                          ragged: bool = False, reverse: bool = False,
                          batch_first: bool = False) -> Case:
    """Keyword arguments for ``minlstm_sequence``, drawn like ``minlstm_cell_case``; the
    options as ``mingru_sequence_case``."""
    return _in_layout(_mingru_away_from_the_kink(lambda: {
        "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
        "h0": _normal(rng, (batch, hidden), 0.5, dtype),
        **_minlstm_parameters(rng, input_size, hidden, dtype, activation, scale),
        **({} if method == "auto" else {"method": method}),
        "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
        **_order(reverse)}, blocks=3), batch_first)


def random_minlstm_cell_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """A ``minlstm_cell`` case with sizes and ``activation`` drawn from ``rng``."""
    return minlstm_cell_case(
        rng, batch=int(rng.integers(1, 5)), input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 6)), dtype=dtype,
        activation=str(rng.choice(MINGRU_ACTIVATIONS)), scale=float(rng.choice(SCALES)))


def random_minlstm_sequence_case(rng: np.random.Generator, dtype: Any = np.float64, *,
                                 order: bool = False) -> Case:
    """A ``minlstm_sequence`` case (T <= 4) drawn as ``random_mingru_sequence_case``."""
    drawn = _random_order(rng, order)
    drawn.pop("masks", None)
    return minlstm_sequence_case(
        rng, steps=int(rng.integers(1, 5)), batch=int(rng.integers(1, 5)),
        input_size=int(rng.integers(1, 5)), hidden=int(rng.integers(1, 5)), dtype=dtype,
        activation=str(rng.choice(MINGRU_ACTIVATIONS)),
        method=str(rng.choice(("sequential", "parallel"))), scale=float(rng.choice(SCALES)),
        ragged=bool(rng.integers(2)), **drawn)


# --------------------------------------------------------------------------------------
# The RG-LRU (docs/spec.md §18.3)


def _rglru_parameters(rng, hidden, heads, dtype, scale):
    """``w_a, w_x [N, H/N, H/N]``, ``b_a, b_x, lam [H]`` drawn for an RG-LRU case; N is
    ``gcd(hidden, heads)``, the most heads up to ``heads`` that divide H. ``lam`` in
    [-2, 1]: ``a`` from about 0.02 to 0.99 at ``r = 1/2``."""
    heads = math.gcd(hidden, heads) or 1
    d = hidden // heads
    return {"w_a": _normal(rng, (heads, d, d), scale / np.sqrt(max(1, d)), dtype),
            "b_a": _normal(rng, (hidden,), 0.5 * scale, dtype),
            "w_x": _normal(rng, (heads, d, d), scale / np.sqrt(max(1, d)), dtype),
            "b_x": _normal(rng, (hidden,), 0.5 * scale, dtype),
            "lam": rng.uniform(-2.0, 1.0, hidden).astype(dtype)}


def _rglru_settings(c, sqrt_grad_bound):
    """The settings of an RG-LRU case, each given only when not its default."""
    return {**({} if c == 8.0 else {"c": c}),
            **({} if sqrt_grad_bound is None else {"sqrt_grad_bound": sqrt_grad_bound})}


def rglru_cell_case(rng: np.random.Generator, *, batch: int = 3, hidden: int = 4,
                    heads: int = 2, dtype: Any = np.float64, c: float = 8.0,
                    sqrt_grad_bound: float | None = None, scale: float = 1.0,
                    input_size: int | None = None) -> Case:
    """Keyword arguments for ``rglru_cell`` (``x [B, H]``: as wide as the state, so an
    ``input_size`` given, as callers of every cell's builder give it, is not used;
    ``gcd(hidden, heads)`` heads)."""
    return {"x": _normal(rng, (batch, hidden), 1.0, dtype),
            "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
            **_rglru_parameters(rng, hidden, heads, dtype, scale),
            **_rglru_settings(c, sqrt_grad_bound)}


def rglru_sequence_case(rng: np.random.Generator, *, steps: int = 4, batch: int = 3,
                        hidden: int = 4, heads: int = 2, dtype: Any = np.float64,
                        c: float = 8.0, sqrt_grad_bound: float | None = None,
                        method: str = "auto", scale: float = 1.0, ragged: bool = False,
                        resets: bool = False, reverse: bool = False,
                        batch_first: bool = False, input_size: int | None = None,
                        masks: bool = False) -> Case:
    """Keyword arguments for ``rglru_sequence``, drawn like ``rglru_cell_case``; ``resets``
    (or ``masks``, as callers of every cell's builder ask for a cell's masks): a ``[T, B]``
    boolean array, each flag true with probability 1/3; ``method`` (given only when not
    "auto"), ``reverse`` and ``batch_first`` as for ``lstm_sequence_case``."""
    resets = resets or masks
    return _in_layout({
        "x": _normal(rng, (steps, batch, hidden), 1.0, dtype),
        "h0": _normal(rng, (batch, hidden), 0.5, dtype),
        **_rglru_parameters(rng, hidden, heads, dtype, scale),
        **_rglru_settings(c, sqrt_grad_bound),
        **({} if method == "auto" else {"method": method}),
        "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
        **({"resets": rng.integers(0, 3, (steps, batch)) == 0} if resets else {}),
        **_order(reverse)}, batch_first)


def _rglru_sizes(rng):
    return {"batch": int(rng.integers(1, 5)), "hidden": int(rng.integers(1, 7)),
            "heads": int(rng.integers(1, 4)), "c": float(rng.choice((8.0, 2.0))),
            "sqrt_grad_bound": (None, 1000.0)[int(rng.integers(2))],
            "scale": float(rng.choice(SCALES))}


def random_rglru_cell_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """An ``rglru_cell`` case with sizes, heads, ``c`` and ``sqrt_grad_bound`` (None or
    recurrentgemma's 1000) drawn from ``rng``."""
    return rglru_cell_case(rng, dtype=dtype, **_rglru_sizes(rng))


def random_rglru_sequence_case(rng: np.random.Generator, dtype: Any = np.float64, *,
                               order: bool = False) -> Case:
    """An ``rglru_sequence`` case (T <= 4) drawn as ``random_rglru_cell_case``, with the
    method, ragged lengths and (with ``order``'s masks) resets drawn too."""
    drawn = _random_order(rng, order)
    resets = bool(drawn.pop("masks", False))
    return rglru_sequence_case(rng, steps=int(rng.integers(1, 5)), dtype=dtype,
                               **_rglru_sizes(rng),
                               method=str(rng.choice(("sequential", "parallel"))),
                               ragged=bool(rng.integers(2)), resets=resets, **drawn)


STACK_CELLS = {"lstm": LSTMWeights, "gru": GRUWeights, "rnn": RNNWeights,
               "mingru": MinGRUWeights, "slstm": SLSTMWeights,
               "minlstm": MinLSTMWeights, "rglru": RGLRUWeights}
"""The cells a stack is made of, and their weight sets."""


def _stack_layer_weights(rng, cell, n_in, hidden, dtype, proj_size, peephole, layer_norm):
    """One (layer, direction)'s weight set: a layer's input ``n_in`` wide."""
    if cell == "gru":
        params = _gru_parameters(rng, n_in, hidden, dtype, True, 1.0)
        return GRUWeights(**{k: params[k] for k in GRUWeights._fields})
    if cell == "rnn":
        params = _rnn_parameters(rng, n_in, hidden, dtype, "tanh", 1.0)
        return RNNWeights(params["w"], params["b"])
    if cell == "mingru":
        params = _mingru_parameters(rng, n_in, hidden, dtype, "identity", 1.0)
        return MinGRUWeights(params["w"], params["b"])
    if cell == "slstm":   # two heads where H is even
        params = _slstm_parameters(rng, n_in, hidden, 2 - hidden % 2, dtype, "sigmoid",
                                   "exact", 1.0)
        return SLSTMWeights(params["w"], params["r"], params["b"])
    if cell == "minlstm":
        params = _minlstm_parameters(rng, n_in, hidden, dtype, "identity", 1.0)
        return MinLSTMWeights(params["w"], params["b"])
    if cell == "rglru":     # the input as wide as the state (stack_case makes it so)
        return RGLRUWeights(**_rglru_parameters(rng, hidden, 2, dtype, 1.0))
    params = _lstm_parameters(rng, n_in, hidden, dtype, peephole, 1.0, proj_size or hidden)
    options = _lstm_options(rng, hidden, dtype, proj_size, layer_norm, "raw")
    return LSTMWeights(**{k: params[k] for k in ("w", "b", *PEEPHOLES)},
                       w_proj=options.get("w_proj"), layer_norm=options.get("layer_norm"))


def stack_case(rng: np.random.Generator, cell: str, *, layers: int = 2,
               bidirectional: bool = True, masks: bool = True, ragged: bool = True,
               batch_first: bool = False, steps: int = 4, batch: int = 3,
               input_size: int = 3, hidden: int = 4, dtype: Any = np.float64,
               proj_size: int | None = None, layer_norm: bool = False) -> Case:
    """Keyword arguments for ``gc.<cell>_stack`` (``cell`` "lstm", "gru" or "rnn"): one
    weight set per (layer, direction) in PyTorch's order, initial states ``[L·D, B, ·]``,
    ragged lengths with a row of 0 (``ragged``), ``dropout_masks`` of 0/1 over 0.8 at the
    first boundary and fractional ones after (``masks``, two layers or more). An LSTM's
    layer 0 has peepholes, ``proj_size`` is every layer's projection (the states have one
    width) and ``layer_norm`` gives its top layer a layer norm (the norm's conditioning is
    the sequence cases' business: ``LN_MARGIN``); the GRU resets after (PyTorch's), the
    plain RNN is tanh, the sLSTM has two heads where H is even and the sigmoid forget; the
    RG-LRU's stack runs one direction with ``input_size = hidden`` (its input is as wide
    as its state)."""
    if cell == "rglru":     # one direction, x as wide as the state: the RG-LRU's input
        bidirectional, input_size = False, hidden
    directions = 2 if bidirectional else 1
    width = proj_size or hidden
    weights = [_stack_layer_weights(rng, cell, input_size if k < directions
                                    else directions * width, hidden, dtype, proj_size,
                                    k < directions, layer_norm and k // directions == layers - 1)
               for k in range(layers * directions)]
    leading = (batch, steps) if batch_first else (steps, batch)
    case = {"x": _normal(rng, (*leading, input_size), 1.0, dtype), "weights": weights,
            "h0": _normal(rng, (layers * directions, batch, width), 0.5, dtype),
            "bidirectional": bidirectional, "batch_first": batch_first,
            "seq_len": (np.minimum(ragged_lengths(rng, steps, batch), steps)
                        if ragged and batch else None),
            **{"lstm": {}, "gru": {"reset_after": True}, "rnn": {"activation": "tanh"},
               "mingru": {"activation": "identity"}, "slstm": {"forget": "sigmoid"},
               "minlstm": {"activation": "identity"}, "rglru": {}}[cell]}
    if cell == "lstm":
        case["cs0"] = _normal(rng, (layers * directions, batch, hidden), 1.0, dtype)
    if cell == "slstm":
        case.update(_slstm_states(rng, (layers * directions, batch), hidden, dtype,
                                  ("c0", "n0", "m0", "h0")))
    if masks and layers > 1:
        per_row = (batch, 1, directions * width) if batch_first else (batch, directions * width)
        case["dropout_masks"] = [
            (rng.integers(0, 2, per_row) / 0.8).astype(dtype) if k == 0 else
            rng.uniform(0.5, 1.0, (*leading, directions * width)).astype(dtype)
            for k in range(layers - 1)]
    return case


def random_stack_case(rng: np.random.Generator, cell: str, dtype: Any = np.float64) -> Case:
    """A ``stack_case`` with 1 to 3 layers, directions, masks, lengths, layout and an LSTM's
    projection drawn from ``rng``."""
    layers = int(rng.integers(1, 4))
    proj = int(rng.integers(1, 4)) if cell == "lstm" and not rng.integers(3) else None
    return stack_case(rng, cell, layers=layers, bidirectional=bool(rng.integers(2)),
                      masks=bool(rng.integers(2)), ragged=bool(rng.integers(2)),
                      batch_first=not rng.integers(4), steps=int(rng.integers(1, 5)),
                      batch=int(rng.integers(1, 4)), input_size=int(rng.integers(1, 4)),
                      hidden=int(rng.integers(1, 4)), dtype=dtype, proj_size=proj)


# --------------------------------------------------------------------------------------
# The linear scan (docs/spec.md §18.1)

LINEAR_SCAN_KINDS = ("real", "complex", "real_a")
"""The linear scan's dtype families: real; complex (``a`` too); a real ``a`` with a complex
``b`` and state."""


def linear_scan_case(rng: np.random.Generator, *, steps: int = 5, batch: int = 3,
                     width: int = 2, dtype: Any = np.float64, kind: str = "real",
                     ragged: bool = False, reverse: bool = False, resets: bool = False,
                     batch_first: bool = False, method: str = "sequential") -> Case:
    """A ``linear_scan`` case: keyword arguments of ``gc.linear_scan``. ``|a|`` in [0.5, 1]
    (a complex ``a`` with a random phase), ``b`` and ``h0`` standard normal; ``dtype`` the
    real precision (complex ones are its complex counterpart); ``ragged`` lengths, a reset
    at about one step in four, both in the ``batch_first`` layout when asked."""
    shape = (steps, batch, width)
    complex_dtype = np.result_type(dtype, np.complex64)
    a = rng.uniform(0.5, 1.0, shape)
    b, h0 = rng.standard_normal(shape), rng.standard_normal((batch, width))
    if kind != "real":
        b = (b + 1j * rng.standard_normal(shape)).astype(complex_dtype)
        h0 = (h0 + 1j * rng.standard_normal(h0.shape)).astype(complex_dtype)
    if kind == "complex":
        a = (a * np.exp(1j * rng.uniform(-1, 1, shape))).astype(complex_dtype)
    case: Case = {"a": a.astype(a.dtype if a.dtype.kind == "c" else dtype),
                  "b": b.astype(b.dtype if b.dtype.kind == "c" else dtype),
                  "h0": h0.astype(h0.dtype if h0.dtype.kind == "c" else dtype),
                  "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
                  "reverse": reverse, "batch_first": batch_first, "method": method,
                  "resets": (rng.random((steps, batch)) < 0.25) if resets else None}
    if batch_first:
        case["a"], case["b"] = (np.ascontiguousarray(case[k].swapaxes(0, 1)) for k in "ab")
        if resets:
            case["resets"] = np.ascontiguousarray(case["resets"].T)
    return case


def random_linear_scan_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """A ``linear_scan`` case (T <= 5) with sizes, dtype family, method, lengths, resets,
    direction and layout drawn from ``rng``."""
    return linear_scan_case(
        rng, steps=int(rng.integers(1, 6)), batch=int(rng.integers(1, 5)),
        width=int(rng.integers(1, 4)), dtype=dtype,
        kind=str(rng.choice(LINEAR_SCAN_KINDS)), ragged=bool(rng.integers(2)),
        reverse=bool(rng.integers(2)), resets=bool(rng.integers(2)),
        batch_first=not rng.integers(4), method=str(rng.choice(("sequential", "parallel"))))


# --------------------------------------------------------------------------------------
# Mamba's selective scan (docs/spec.md §18.4)


def selective_scan_case(rng: np.random.Generator, *, batch: int = 2, channels: int = 4,
                        state: int = 2, steps: int = 4, groups_b: int | None = None,
                        groups_c: int | None = None, optional: bool = True,
                        delta_softplus: bool = False, reverse: bool = False,
                        dtype: Any = np.float64) -> Case:
    """A ``selective_scan`` case: keyword arguments of ``gc.selective_scan`` (with
    ``return_last_state``). ``delta`` in [0.05, 0.6] and ``A`` negative (Δ > 0, a decaying
    state, as in Mamba), the rest standard normal (``delta_bias`` in [0, 0.3]); ``B``, ``C``
    grouped by ``groups_b``, ``groups_c`` (None: ``[Bt, N, L]``); ``optional``: D, z and
    delta_bias given."""
    def bc(groups):
        shape = (batch, state, steps) if groups is None else (batch, groups, state, steps)
        return rng.standard_normal(shape).astype(dtype)
    case: Case = {
        "u": rng.standard_normal((batch, channels, steps)).astype(dtype),
        "delta": rng.uniform(0.05, 0.6, (batch, channels, steps)).astype(dtype),
        "A": (-np.exp(0.5 * rng.standard_normal((channels, state)))).astype(dtype),
        "B": bc(groups_b), "C": bc(groups_c), "D": None, "z": None, "delta_bias": None,
        "delta_softplus": delta_softplus, "reverse": reverse, "return_last_state": True}
    if optional:
        case["D"] = rng.standard_normal(channels).astype(dtype)
        case["z"] = rng.standard_normal((batch, channels, steps)).astype(dtype)
        case["delta_bias"] = rng.uniform(0.0, 0.3, channels).astype(dtype)
    return case


def random_selective_scan_case(rng: np.random.Generator, dtype: Any = np.float64) -> Case:
    """A ``selective_scan`` case (L <= 5) with sizes, groups, the optional arrays, softplus
    and direction drawn from ``rng``."""
    channels = int(rng.choice((2, 4)))
    return selective_scan_case(
        rng, batch=int(rng.integers(1, 3)), channels=channels, state=int(rng.integers(1, 4)),
        steps=int(rng.integers(1, 6)), groups_b=[None, 1, 2][int(rng.integers(3))],
        groups_c=[None, 1, channels][int(rng.integers(3))], optional=bool(rng.integers(2)),
        delta_softplus=bool(rng.integers(2)), reverse=bool(rng.integers(2)), dtype=dtype)
