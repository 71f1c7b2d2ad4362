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


def clip_away_from(values, margin=CLIP_MARGIN):
    """A clip level that clips some of ``|values|`` and keeps every one at least ``margin``
    away from it; None when no such level exists."""
    levels = np.sort(np.abs(np.asarray(values, dtype=np.float64)).ravel())
    if levels.size == 0 or levels[-1] <= 2 * margin:
        return None
    midpoints = 0.5 * (levels[1:] + levels[:-1])
    wide = midpoints[(levels[1:] - levels[:-1]) > 2 * margin]
    if wide.size:
        return float(wide[np.argmin(np.abs(wide - np.median(levels)))])
    return float(0.5 * levels[0]) if levels[0] > 2 * margin else None


def lstm_cell_case(rng, *, batch=3, input_size=4, hidden=5, dtype=np.float64, peephole=False,
                   clip=False, forget_bias=1.0, scale=1.0):
    """Keyword arguments for ``lstm_cell``: weights scaled by ``scale/sqrt(I+H)``, states and
    inputs standard normal; ``clip=True`` picks a ``cell_clip`` that clips part of ``cs``."""
    fan_in = max(1, input_size + hidden)
    case = {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "cs_prev": _normal(rng, (batch, hidden), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        "w": _normal(rng, (input_size + hidden, 4 * hidden), scale / np.sqrt(fan_in), dtype),
        "b": _normal(rng, (4 * hidden,), 0.1 * scale, dtype),
        "wci": None, "wcf": None, "wco": None,
        "forget_bias": float(forget_bias), "cell_clip": None,
    }
    if peephole:
        for name in ("wci", "wcf", "wco"):
            case[name] = _normal(rng, (hidden,), 0.5 * scale, dtype)
    if clip:
        as64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) else v)
                for k, v in case.items()}
        state = cells.lstm_cell(**as64, backend="reference")
        case["cell_clip"] = clip_away_from(state.i * state.ci + state.f * as64["cs_prev"])
    return case


def gru_cell_case(rng, *, batch=3, input_size=4, hidden=5, dtype=np.float64, reset_after=False,
                  scale=1.0):
    """Keyword arguments for ``gru_cell``."""
    fan_in = max(1, input_size + hidden)
    return {
        "x": _normal(rng, (batch, input_size), 1.0, dtype),
        "h_prev": _normal(rng, (batch, hidden), 0.5, dtype),
        "w_ru": _normal(rng, (input_size + hidden, 2 * hidden), scale / np.sqrt(fan_in), dtype),
        "w_c": _normal(rng, (input_size + hidden, hidden), scale / np.sqrt(fan_in), dtype),
        "b_ru": _normal(rng, (2 * hidden,), 0.1 * scale, dtype),
        "b_c": _normal(rng, ((2 if reset_after else 1) * hidden,), 0.1 * scale, dtype),
        "reset_after": bool(reset_after),
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


def lstm_cell_vjp_pair(case, *, backend=None, clip_grad="exact", d_h=True, d_cs=True):
    """``(f, vjp, args, names)`` for the oracle: ``f`` maps the case's arrays to
    ``(cs, h)`` (or the one of them that has an upstream gradient)."""
    attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}
    peephole = case["wci"] is not None
    names = LSTM_ARG_NAMES if peephole else LSTM_ARG_NAMES[:5]
    args = tuple(case[n] for n in names)
    outputs = [k for k, on in (("cs", d_cs), ("h", d_h)) if on]

    def forward(*arrays):
        peeps = dict(zip(("wci", "wcf", "wco"), arrays[5:]))
        return cells.lstm_cell(*arrays[:5], **peeps, **attrs, backend=backend)

    def f(*arrays):
        state = forward(*arrays)
        return tuple(getattr(state, k) for k in outputs)

    def vjp(ct, *arrays):
        upstream = {f"d_{k}": c for k, c in zip(outputs, ct)}
        peeps = dict(zip(("wci", "wcf", "wco"), arrays[5:]))
        grads = cells.lstm_cell_grad(*arrays[:5], forward(*arrays), **upstream, **peeps,
                                     cell_clip=attrs["cell_clip"], clip_grad=clip_grad,
                                     backend=backend)
        return tuple(grads)[: len(arrays)]

    return f, vjp, args, names


def gru_cell_vjp_pair(case, *, backend=None):
    """``(f, vjp, args, names)`` for the oracle: ``f`` maps the case's arrays to ``h``."""
    reset_after = case["reset_after"]
    args = tuple(case[n] for n in GRU_ARG_NAMES)

    def f(*arrays):
        return cells.gru_cell(*arrays, reset_after=reset_after, backend=backend).h

    def vjp(ct, *arrays):
        state = cells.gru_cell(*arrays, reset_after=reset_after, backend=backend)
        return tuple(cells.gru_cell_grad(*arrays, state, ct, reset_after=reset_after,
                                         backend=backend))

    return f, vjp, args, GRU_ARG_NAMES


def vjp_check(op, case, *, seed=0, **options):
    """Run the oracle on public operation ``op`` ("lstm_cell" or "gru_cell") for ``case``.

    ``options`` go to ``lstm_cell_vjp_pair``/``gru_cell_vjp_pair`` (``backend``,
    ``clip_grad``, ...). Returns the ``VJPReport``.
    """
    pair = {"lstm_cell": lstm_cell_vjp_pair, "gru_cell": gru_cell_vjp_pair}[op]
    f, vjp, args, names = pair(case, **options)
    return check_vjp(f, vjp, args, names=names, seed=seed)
