"""Sequences by looping the public cells: the one copy, used by the audit and the tests.

``lstm_forward`` / ``gru_forward`` / ``rnn_forward`` run ``lstm_cell`` / ``gru_cell`` /
``rnn_cell`` over ``x [T, B, I]`` step by step and record every step's state;
``lstm_backprop`` / ``gru_backprop`` / ``rnn_backprop`` run backpropagation through time over
that record with the cells' gradient functions.
With per-example lengths ``seq_len [B]`` a row that has stopped keeps its state, its outputs
are zero, and its state gradient passes through unchanged (PyTorch's packed sequences, as
the sequence operations define them). ``reverse=True`` runs the same loop with time
descending: row b runs at time t when ``t < seq_len[b]``, so it starts from the initial
state at its own last step and ends at time 0 (docs/spec.md §11.1). Nothing here depends
on the sequence backends, which is the point: the sequence operations are tested against
it.

The arrays may be NumPy or CuPy (one library per call); ``backend`` goes to every cell call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import steps
from .._core.arrays import namespace_of
from .._core.types import Array
from ..cells import OPS
from ..cells.lstm.spec import PEEPHOLES, LSTMNorm

LSTM_STEP_FIELDS: tuple[str, ...] = OPS["lstm_cell"].result._fields


@dataclass(frozen=True, eq=False)
class Unrolled:
    """One unrolled forward: its inputs and settings, every step's cell state (``steps``), the
    states each step started from (``starts``) and the sequence outputs (``outputs``: each
    state field stacked ``[T, B, H]`` and zero past each row's length, and the final states
    ``cs_final`` / ``h_final``)."""

    cell: str
    x: Array
    weights: dict[str, Array]
    attrs: dict[str, Any]
    seq_len: Array | None
    backend: str | None
    steps: list = field(default_factory=list)
    starts: list = field(default_factory=list)
    outputs: dict[str, Array] = field(default_factory=dict)
    reverse: bool = False


def _times(n_steps: int, reverse: bool):
    """The time positions in the order the steps run."""
    return range(n_steps - 1, -1, -1) if reverse else range(n_steps)


def _running(xp, t: int, seq_len):
    """``[B, 1]`` booleans, whether each row runs at step ``t``; None for all rows."""
    return None if seq_len is None else (t < xp.asarray(seq_len))[:, None]


def _keep(xp, running, new, old):
    """``new`` where the row runs, ``old`` (the frozen value) where it has stopped."""
    return new if running is None else xp.where(running, new, old)


def _stack(xp, steps: list, name: str, seq_len, empty_shape, dtype) -> Array:
    """Field ``name`` of every step, ``[T, B, H]``, zero past each row's length."""
    if not steps:
        return xp.zeros(empty_shape, dtype=dtype)
    values = [_keep(xp, _running(xp, t, seq_len), getattr(s, name), 0)
              for t, s in enumerate(steps)]
    return xp.stack(values)


def _finish(run: Unrolled, fields: tuple[str, ...], finals: dict[str, Array]) -> Unrolled:
    xp = namespace_of(run.x)
    first = next(iter(finals.values()))
    for name in fields:        # h is P wide with a projection: its final state's width
        shape = tuple(run.x.shape[:2]) + tuple(finals.get(f"{name}_final", first).shape[1:])
        run.outputs[name] = _stack(xp, run.steps, name, run.seq_len, shape, first.dtype)
    run.outputs.update(finals)
    return run


def lstm_forward(x: Array, cs0: Array, h0: Array, w: Array, b: Array, *,
                 wci: Array | None = None, wcf: Array | None = None, wco: Array | None = None,
                 forget_bias: float = 1.0, cell_clip: float | None = None,
                 w_proj: Array | None = None, proj_clip: float | None = None,
                 layer_norm: LSTMNorm | None = None, ln_epsilon: float = 1e-5,
                 ln_carry: str = "raw", seq_len: Array | None = None,
                 reverse: bool = False, backend: str | None = None) -> Unrolled:
    """``lstm_cell`` over ``x [T, B, I]`` from ``(cs0, h0)``; see the module docstring.
    With a projection ``w_proj [H, P]`` (and ``proj_clip``) ``h0`` and every ``h`` are
    ``[B, P]``; ``layer_norm``, ``ln_epsilon`` and ``ln_carry`` as for ``lstm_cell``."""
    xp = namespace_of(x)
    weights = {"w": w, "b": b, **dict(zip(PEEPHOLES, (wci, wcf, wco), strict=True)),
               "w_proj": w_proj,
               "layer_norm": layer_norm}
    attrs = {"forget_bias": forget_bias, "cell_clip": cell_clip, "proj_clip": proj_clip,
             "ln_epsilon": ln_epsilon, "ln_carry": ln_carry}
    run = Unrolled("lstm", x, weights, attrs, seq_len, backend, [None] * x.shape[0],
                   [None] * x.shape[0], reverse=reverse)
    cs, h = cs0, h0
    for t in _times(x.shape[0], reverse):
        state = steps.lstm_cell(x[t], cs, h, w, b, wci=wci, wcf=wcf, wco=wco, w_proj=w_proj,
                                layer_norm=layer_norm, **attrs, backend=backend)
        run.steps[t], run.starts[t] = state, (cs, h)
        running = _running(xp, t, seq_len)
        cs, h = _keep(xp, running, state.cs, cs), _keep(xp, running, state.h, h)
    return _finish(run, LSTM_STEP_FIELDS, {"cs_final": cs, "h_final": h})


def _upstream(xp, total, per_step, t: int, running):
    """The gradient reaching step ``t``'s output: the carried one plus the step's own, zero
    for a row that has stopped."""
    value = total if per_step is None else total + per_step[t]
    return value if running is None else xp.where(running, value, 0)


def _zeros_or(xp, a, like):
    return xp.zeros_like(like) if a is None else a


def _zeros_like(xp, a):
    """Zeros like an array, or like each array of an ``LSTMNorm``."""
    return LSTMNorm(*map(xp.zeros_like, a)) if isinstance(a, LSTMNorm) else xp.zeros_like(a)


def _plus(total, g):
    """``total + g`` for arrays, fieldwise for ``LSTMNorm`` gradients."""
    if isinstance(g, LSTMNorm):
        return LSTMNorm(*(t + d for t, d in zip(total, g, strict=True)))
    return total + g


def lstm_backprop(run: Unrolled, *, d_h: Array | None = None, d_cs: Array | None = None,
                  d_h_final: Array | None = None, d_cs_final: Array | None = None,
                  clip_grad: str = "exact") -> dict[str, Array]:
    """Backpropagation through time over ``lstm_forward``'s ``run`` for upstream gradients
    of every step's ``h`` and ``cs`` (``[T, B, H]``) and of the final states (``[B, H]``),
    each optional. Returns the gradients by name: ``x, cs0, h0, w, b``, with peepholes
    ``wci, wcf, wco``, with a projection ``w_proj`` and with a layer norm ``layer_norm`` (an
    ``LSTMNorm``)."""
    xp, x, weights = namespace_of(run.x), run.x, run.weights
    cs0, h0 = run.starts[0] if run.starts else (run.outputs["cs_final"], run.outputs["h_final"])
    carry_h, carry_cs = _zeros_or(xp, d_h_final, h0), _zeros_or(xp, d_cs_final, cs0)
    d_x = xp.zeros(x.shape, dtype=xp.result_type(x, weights["w"]))
    names = ["w", "b"] + (list(PEEPHOLES) if weights["wci"] is not None else [])
    names += [k for k in ("w_proj", "layer_norm") if weights.get(k) is not None]
    totals = {k: _zeros_like(xp, weights[k]) for k in names}
    for t in reversed(_times(len(run.steps), run.reverse)):
        running = _running(xp, t, run.seq_len)
        g = steps.lstm_cell_grad(
            x[t], *run.starts[t], weights["w"], weights["b"], run.steps[t],
            d_h=_upstream(xp, carry_h, d_h, t, running),
            d_cs=_upstream(xp, carry_cs, d_cs, t, running),
            **{k: weights[k] for k in PEEPHOLES}, cell_clip=run.attrs["cell_clip"],
            w_proj=weights.get("w_proj"), proj_clip=run.attrs.get("proj_clip"),
            layer_norm=weights.get("layer_norm"), clip_grad=clip_grad, backend=run.backend)
        d_x[t] = g.x
        totals = {k: _plus(totals[k], getattr(g, k)) for k in names}
        carry_h = _keep(xp, running, g.h_prev, carry_h)
        carry_cs = _keep(xp, running, g.cs_prev, carry_cs)
    return {"x": d_x, "cs0": carry_cs, "h0": carry_h, **totals}


def _forward_h(cell, x, h0, weights, attrs, seq_len, reverse, backend) -> Unrolled:
    """A one-state cell (GRU, plain RNN) over ``x`` from ``h0``: ``cell`` is the public
    cell function, called with the weights in order and the attributes."""
    xp = namespace_of(x)
    run = Unrolled(cell.__name__.split("_")[0], x, weights, attrs, seq_len, backend,
                   [None] * x.shape[0], [None] * x.shape[0], reverse=reverse)
    h = h0
    for t in _times(x.shape[0], reverse):
        state = cell(x[t], h, *weights.values(), **attrs, backend=backend)
        run.steps[t], run.starts[t] = state, h
        h = _keep(xp, _running(xp, t, seq_len), state.h, h)
    return _finish(run, OPS[cell.__name__].result._fields, {"h_final": h})


def _backprop_h(cell_grad, run, d_h, d_h_final) -> dict[str, Array]:
    """Backpropagation through time over a one-state cell's ``run``; ``cell_grad`` is the
    public gradient function."""
    xp, x, weights = namespace_of(run.x), run.x, run.weights
    h0 = run.starts[0] if run.starts else run.outputs["h_final"]
    carry = _zeros_or(xp, d_h_final, h0)
    d_x = xp.zeros(x.shape, dtype=xp.result_type(x, next(iter(weights.values()))))
    totals = {k: xp.zeros_like(v) for k, v in weights.items()}
    for t in reversed(_times(len(run.steps), run.reverse)):
        running = _running(xp, t, run.seq_len)
        g = cell_grad(x[t], run.starts[t], *weights.values(), run.steps[t],
                      d_h=_upstream(xp, carry, d_h, t, running), **run.attrs,
                      backend=run.backend)
        d_x[t] = g.x
        totals = {k: totals[k] + getattr(g, k) for k in weights}
        carry = _keep(xp, running, g.h_prev, carry)
    return {"x": d_x, "h0": carry, **totals}


def gru_forward(x: Array, h0: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array, *,
                reset_after: bool = False, seq_len: Array | None = None,
                reverse: bool = False, backend: str | None = None) -> Unrolled:
    """``gru_cell`` over ``x [T, B, I]`` from ``h0``; see the module docstring."""
    weights = {"w_ru": w_ru, "w_c": w_c, "b_ru": b_ru, "b_c": b_c}
    return _forward_h(steps.gru_cell, x, h0, weights, {"reset_after": reset_after}, seq_len,
                      reverse, backend)


def gru_backprop(run: Unrolled, *, d_h: Array | None = None,
                 d_h_final: Array | None = None) -> dict[str, Array]:
    """Backpropagation through time over ``gru_forward``'s ``run`` for upstream gradients
    of every step's ``h`` (``[T, B, H]``) and of the final state (``[B, H]``), each optional.
    Returns the gradients by name: ``x, h0, w_ru, w_c, b_ru, b_c``."""
    return _backprop_h(steps.gru_cell_grad, run, d_h, d_h_final)


def rnn_forward(x: Array, h0: Array, w: Array, b: Array, *, activation: str = "tanh",
                seq_len: Array | None = None, reverse: bool = False,
                backend: str | None = None) -> Unrolled:
    """``rnn_cell`` over ``x [T, B, I]`` from ``h0``; see the module docstring."""
    return _forward_h(steps.rnn_cell, x, h0, {"w": w, "b": b}, {"activation": activation},
                      seq_len, reverse, backend)


def rnn_backprop(run: Unrolled, *, d_h: Array | None = None,
                 d_h_final: Array | None = None) -> dict[str, Array]:
    """Backpropagation through time over ``rnn_forward``'s ``run``, as ``gru_backprop``.
    Returns the gradients by name: ``x, h0, w, b``."""
    return _backprop_h(steps.rnn_cell_grad, run, d_h, d_h_final)
