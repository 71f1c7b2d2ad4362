"""Test-case generators and Hypothesis strategies for valid cell inputs.

``lstm_cell_case`` / ``gru_cell_case`` draw one set of keyword arguments from a NumPy
``Generator``; ``lstm_cell_inputs`` / ``gru_cell_inputs`` are Hypothesis strategies over the
same cases (Hypothesis is imported only when a strategy is built). ``vjp_check`` runs the
oracle on one public operation for one case.

Cases with clipping choose ``cell_clip`` at least ``CLIP_MARGIN`` away from every unclipped
``|cs|``, so that a finite-difference step never crosses the clip boundary: there the
function has a kink and no difference quotient means anything.
"""

from __future__ import annotations

import numpy as np

from . import cells
from .oracle import check_vjp

CLIP_MARGIN = 1e-2
LSTM_ARG_NAMES = ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")
GRU_ARG_NAMES = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")


def _normal(rng, shape, scale, dtype):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def clip_levels(values, margin=CLIP_MARGIN):
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


def clip_away_from(values, margin=CLIP_MARGIN):
    """The first of ``clip_levels(values, margin)``; None when there is none."""
    levels = clip_levels(values, margin)
    return levels[0] if levels else None


def _lstm_parameters(rng, input_size, hidden, dtype, peephole, scale):
    """``w, b`` (and the peepholes, else None) drawn for an LSTM case, in a fixed order."""
    fan_in = max(1, input_size + hidden)
    params = {
        "w": _normal(rng, (input_size + hidden, 4 * hidden), scale / np.sqrt(fan_in), dtype),
        "b": _normal(rng, (4 * hidden,), 0.1 * scale, dtype),
        "wci": None, "wcf": None, "wco": None,
    }
    if peephole:
        for name in ("wci", "wcf", "wco"):
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


def lstm_cell_case(rng, *, batch=3, input_size=4, hidden=5, dtype=np.float64, peephole=False,
                   clip=False, forget_bias=1.0, scale=1.0):
    """Keyword arguments for ``lstm_cell``: weights scaled by ``scale/sqrt(I+H)``, states and
    inputs standard normal; ``clip=True`` picks a ``cell_clip`` that clips part of ``cs``."""
    case = {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "cs_prev": _normal(rng, (batch, hidden), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        **_lstm_parameters(rng, input_size, hidden, dtype, peephole, scale),
        "forget_bias": float(forget_bias), "cell_clip": None,
    }
    if clip:
        as64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) else v)
                for k, v in case.items()}
        state = cells.lstm_cell(**as64, backend="reference")
        case["cell_clip"] = clip_away_from(state.i * state.ci + state.f * as64["cs_prev"])
    return case


def gru_cell_case(rng, *, batch=3, input_size=4, hidden=5, dtype=np.float64, reset_after=False,
                  scale=1.0):
    """Keyword arguments for ``gru_cell``."""
    return {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        **_gru_parameters(rng, input_size, hidden, dtype, reset_after, scale),
    }


def _sizes(st, min_size, max_batch, max_input, max_hidden):
    return (st.integers(min_size, max_batch), st.integers(min_size, max_input),
            st.integers(max(1, min_size), max_hidden))


def lstm_cell_inputs(*, dtype=np.float64, peephole=None, clip=None, min_size=1, max_batch=4,
                     max_input=5, max_hidden=5):
    """Hypothesis strategy for ``lstm_cell`` keyword arguments (``peephole``/``clip`` None:
    drawn). ``min_size=0`` admits empty batches and inputs."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return st.builds(
        lambda seed, **kw: lstm_cell_case(np.random.default_rng(seed), dtype=dtype, **kw),
        seed=st.integers(0, 2**32 - 1), batch=batch, input_size=input_size, hidden=hidden,
        peephole=st.booleans() if peephole is None else st.just(peephole),
        clip=st.booleans() if clip is None else st.just(clip),
        forget_bias=st.sampled_from([0.0, 1.0, -0.5, 2.5]),
        scale=st.sampled_from([0.5, 1.0, 2.0]))


def gru_cell_inputs(*, dtype=np.float64, reset_after=None, min_size=1, max_batch=4,
                    max_input=5, max_hidden=5):
    """Hypothesis strategy for ``gru_cell`` keyword arguments."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return st.builds(
        lambda seed, **kw: gru_cell_case(np.random.default_rng(seed), dtype=dtype, **kw),
        seed=st.integers(0, 2**32 - 1), batch=batch, input_size=input_size, hidden=hidden,
        reset_after=st.booleans() if reset_after is None else st.just(reset_after),
        scale=st.sampled_from([0.5, 1.0, 2.0]))


def _vjp_pair(forward, gradient, case, names, outputs, attrs, grad_attrs, backend):
    """``(f, vjp, args, names)`` for the oracle: ``f`` maps the arrays named ``names`` to
    the ``outputs`` fields of ``forward``'s result; ``vjp`` feeds the cotangents to
    ``gradient`` as ``d_<output>``. LSTM peepholes (the names after the fifth) are passed by
    keyword, and dropped when the case has none."""
    if "wci" in names and case["wci"] is None:
        names = names[:5]
    args = tuple(case[n] for n in names)
    outputs = tuple(outputs)
    n_positional = 5 if "wci" in names else len(names)

    def split(arrays):
        return arrays[:n_positional], dict(zip(names[n_positional:], arrays[n_positional:]))

    def run(*arrays):
        positional, peepholes = split(arrays)
        return forward(*positional, **peepholes, **attrs, backend=backend)

    def f(*arrays):
        result = run(*arrays)
        return tuple(getattr(result, k) for k in outputs)

    def vjp(ct, *arrays):
        positional, peepholes = split(arrays)
        upstream = {f"d_{k}": c for k, c in zip(outputs, ct)}
        grads = gradient(*positional, run(*arrays), **upstream, **peepholes, **grad_attrs,
                         backend=backend)
        return tuple(grads)[: len(arrays)]

    return f, vjp, args, names


def lstm_cell_vjp_pair(case, *, backend=None, clip_grad="exact", d_h=True, d_cs=True):
    """The oracle's ``(f, vjp, args, names)`` for ``lstm_cell``: ``f`` maps the case's arrays
    to ``(cs, h)`` (or the one of them that has an upstream gradient)."""
    outputs = [k for k, on in (("cs", d_cs), ("h", d_h)) if on]
    return _vjp_pair(
        cells.lstm_cell, cells.lstm_cell_grad, case, LSTM_ARG_NAMES, outputs,
        {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]},
        {"cell_clip": case["cell_clip"], "clip_grad": clip_grad}, backend)


def gru_cell_vjp_pair(case, *, backend=None):
    """The oracle's ``(f, vjp, args, names)`` for ``gru_cell``: ``f`` maps the case's arrays
    to ``(h,)``."""
    attrs = {"reset_after": case["reset_after"]}
    return _vjp_pair(cells.gru_cell, cells.gru_cell_grad, case, GRU_ARG_NAMES, ("h",), attrs,
                     attrs, backend)


def random_lstm_cell_case(rng, dtype=np.float64):
    """An ``lstm_cell`` case with sizes, peepholes, clipping and forget_bias drawn from ``rng``."""
    return lstm_cell_case(
        rng, batch=int(rng.integers(1, 5)), input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 6)), dtype=dtype, peephole=bool(rng.integers(2)),
        clip=bool(rng.integers(2)), forget_bias=float(rng.choice([0.0, 1.0, -0.5, 2.5])),
        scale=float(rng.choice([0.5, 1.0, 2.0])))


def random_gru_cell_case(rng, dtype=np.float64):
    """A ``gru_cell`` case with sizes and ``reset_after`` drawn from ``rng``."""
    return gru_cell_case(
        rng, batch=int(rng.integers(1, 5)), input_size=int(rng.integers(1, 6)),
        hidden=int(rng.integers(1, 6)), dtype=dtype, reset_after=bool(rng.integers(2)),
        scale=float(rng.choice([0.5, 1.0, 2.0])))


# Every public differentiable operation: (random case drawer, oracle pair builder).
OPS = {
    "lstm_cell": (random_lstm_cell_case, lstm_cell_vjp_pair),
    "gru_cell": (random_gru_cell_case, gru_cell_vjp_pair),
}


def on_library(case, library):
    """``case`` with every array moved to ``library`` ("numpy" or "cupy")."""
    if library == "numpy":
        return case
    import cupy

    return {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}


def vjp_check(op, case, *, seed=0, rtol=None, atol=None, **options):
    """Run the oracle on public operation ``op`` (a key of ``OPS``) for ``case``, with
    ``check_vjp``'s tolerances (None: its defaults for the gradients' dtype).

    ``options`` go to the op's pair builder (``backend``, ``clip_grad``, ...).
    Returns the ``VJPReport``.
    """
    f, vjp, args, names = OPS[op][1](case, **options)
    return check_vjp(f, vjp, args, names=names, seed=seed, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------
# Sequences (SPEC 4): cases, strategies and oracle pairs for lstm_sequence / gru_sequence.

from . import sequences as _sequences  # noqa: E402

LSTM_SEQUENCE_ARG_NAMES = ("x", "cs0", "h0", "w", "b", "wci", "wcf", "wco")
GRU_SEQUENCE_ARG_NAMES = ("x", "h0", "w_ru", "w_c", "b_ru", "b_c")
LSTM_SEQUENCE_OUTPUTS = ("h", "cs", "h_final", "cs_final")
GRU_SEQUENCE_OUTPUTS = ("h", "h_final")


def ragged_lengths(rng, steps, batch):
    """Per-row lengths in [0, T] (int64): the first row runs all T steps, the second none
    (when the batch has two rows), the others are drawn."""
    lengths = rng.integers(0, steps + 1, size=batch)
    lengths[:1] = steps
    lengths[1:2] = 0
    return lengths.astype(np.int64)


def _sequence_clip(case, margin=CLIP_MARGIN, attempts=6):
    """A ``cell_clip`` for an LSTM sequence case that clips some cell state and stays at least
    ``margin`` away from every unclipped ``|i∘ci + f∘cs_prev|`` of every valid step; None
    when none is found.

    Clipping one step changes the states after it, so each candidate level (from the
    unclipped run) is refined by fixed-point iteration: rerun clipped at the level, and
    accept it when the rerun's raw states keep the margin, else move to the level
    ``clip_away_from`` picks for them.
    """
    as64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                else v) for k, v in case.items()}
    steps, batch = as64["x"].shape[:2]
    if steps == 0 or batch == 0:
        return None
    lengths = np.full(batch, steps) if as64["seq_len"] is None else as64["seq_len"]
    valid = np.arange(steps)[:, None] < lengths

    def raw_states(cell_clip):
        seq = _sequences.lstm_sequence(**{**as64, "cell_clip": cell_clip}, backend="reference")
        cs_prev = np.concatenate([as64["cs0"][None], seq.cs[:-1]])
        return np.abs(seq.i * seq.ci + seq.f * cs_prev)[valid]

    for level in clip_levels(raw_states(None), margin)[:attempts]:
        for _ in range(3):
            raw = raw_states(level)
            if raw.max() > level and np.min(np.abs(raw - level)) >= margin:
                return level
            level = clip_away_from(raw, margin)
            if level is None:
                break
    return None


def lstm_sequence_case(rng, *, steps=4, batch=3, input_size=4, hidden=5, dtype=np.float64,
                       peephole=False, clip=False, forget_bias=1.0, scale=1.0, ragged=False):
    """Keyword arguments for ``lstm_sequence``, drawn like ``lstm_cell_case``; ``ragged=True``
    adds ``seq_len`` from ``ragged_lengths``. ``clip=True`` picks a ``cell_clip`` that clips
    part of the cell states and stays ``CLIP_MARGIN`` away from every unclipped one (None
    when no such level exists)."""
    case = {
        "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
        "cs0": _normal(rng, (batch, hidden), 1.0, dtype),
        "h0": _normal(rng, (batch, hidden), 0.5, dtype),
        **_lstm_parameters(rng, input_size, hidden, dtype, peephole, scale),
        "forget_bias": float(forget_bias), "cell_clip": None,
        "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
    }
    if clip:
        case["cell_clip"] = _sequence_clip(case)
    return case


def gru_sequence_case(rng, *, steps=4, batch=3, input_size=4, hidden=5, dtype=np.float64,
                      reset_after=False, scale=1.0, ragged=False):
    """Keyword arguments for ``gru_sequence``, drawn like ``gru_cell_case``."""
    return {
        "x": _normal(rng, (steps, batch, input_size), 1.0, dtype),
        "h0": _normal(rng, (batch, hidden), 0.5, dtype),
        **_gru_parameters(rng, input_size, hidden, dtype, reset_after, scale),
        "seq_len": ragged_lengths(rng, steps, batch) if ragged else None,
    }


def lstm_sequence_inputs(*, dtype=np.float64, peephole=None, clip=None, ragged=None,
                         min_size=1, max_steps=4, max_batch=4, max_input=4, max_hidden=4):
    """Hypothesis strategy for ``lstm_sequence`` keyword arguments (``peephole``, ``clip``,
    ``ragged`` None: drawn). ``min_size=0`` admits empty sequences, batches and inputs."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return st.builds(
        lambda seed, **kw: lstm_sequence_case(np.random.default_rng(seed), dtype=dtype, **kw),
        seed=st.integers(0, 2**32 - 1), steps=st.integers(min_size, max_steps), batch=batch,
        input_size=input_size, hidden=hidden,
        peephole=st.booleans() if peephole is None else st.just(peephole),
        clip=st.booleans() if clip is None else st.just(clip),
        ragged=st.booleans() if ragged is None else st.just(ragged),
        forget_bias=st.sampled_from([0.0, 1.0, -0.5, 2.5]),
        scale=st.sampled_from([0.5, 1.0, 2.0]))


def gru_sequence_inputs(*, dtype=np.float64, reset_after=None, ragged=None, min_size=1,
                        max_steps=4, max_batch=4, max_input=4, max_hidden=4):
    """Hypothesis strategy for ``gru_sequence`` keyword arguments."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return st.builds(
        lambda seed, **kw: gru_sequence_case(np.random.default_rng(seed), dtype=dtype, **kw),
        seed=st.integers(0, 2**32 - 1), steps=st.integers(min_size, max_steps), batch=batch,
        input_size=input_size, hidden=hidden,
        reset_after=st.booleans() if reset_after is None else st.just(reset_after),
        ragged=st.booleans() if ragged is None else st.just(ragged),
        scale=st.sampled_from([0.5, 1.0, 2.0]))


def lstm_sequence_vjp_pair(case, *, backend=None, clip_grad="exact",
                           outputs=LSTM_SEQUENCE_OUTPUTS):
    """The oracle's ``(f, vjp, args, names)`` for ``lstm_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (any of "h", "cs", "h_final", "cs_final"); the others
    get no upstream gradient (None)."""
    return _vjp_pair(
        _sequences.lstm_sequence, _sequences.lstm_sequence_grad, case, LSTM_SEQUENCE_ARG_NAMES,
        outputs, {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"],
                  "seq_len": case["seq_len"]},
        {"cell_clip": case["cell_clip"], "clip_grad": clip_grad, "seq_len": case["seq_len"]},
        backend)


def gru_sequence_vjp_pair(case, *, backend=None, outputs=GRU_SEQUENCE_OUTPUTS):
    """The oracle's ``(f, vjp, args, names)`` for ``gru_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` ("h", "h_final")."""
    attrs = {"reset_after": case["reset_after"], "seq_len": case["seq_len"]}
    return _vjp_pair(_sequences.gru_sequence, _sequences.gru_sequence_grad, case,
                     GRU_SEQUENCE_ARG_NAMES, outputs, attrs, attrs, backend)


def random_lstm_sequence_case(rng, dtype=np.float64):
    """An ``lstm_sequence`` case (T <= 4) with sizes, peepholes, clipping, forget_bias and
    ragged lengths drawn from ``rng``."""
    return lstm_sequence_case(
        rng, steps=int(rng.integers(1, 5)), batch=int(rng.integers(1, 5)),
        input_size=int(rng.integers(1, 5)), hidden=int(rng.integers(1, 5)), dtype=dtype,
        peephole=bool(rng.integers(2)), clip=bool(rng.integers(2)),
        forget_bias=float(rng.choice([0.0, 1.0, -0.5, 2.5])),
        scale=float(rng.choice([0.5, 1.0, 2.0])), ragged=bool(rng.integers(2)))


def random_gru_sequence_case(rng, dtype=np.float64):
    """A ``gru_sequence`` case (T <= 4) with sizes, ``reset_after`` and ragged lengths drawn
    from ``rng``."""
    return gru_sequence_case(
        rng, steps=int(rng.integers(1, 5)), batch=int(rng.integers(1, 5)),
        input_size=int(rng.integers(1, 5)), hidden=int(rng.integers(1, 5)), dtype=dtype,
        reset_after=bool(rng.integers(2)), scale=float(rng.choice([0.5, 1.0, 2.0])),
        ragged=bool(rng.integers(2)))


OPS.update({
    "lstm_sequence": (random_lstm_sequence_case, lstm_sequence_vjp_pair),
    "gru_sequence": (random_gru_sequence_case, gru_sequence_vjp_pair),
})
