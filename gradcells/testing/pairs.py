"""Oracle pairs for the public operations: ``(f, vjp, args, names)`` for ``check_vjp``, and
``vjp_check``, which runs the oracle on one operation for one case; with ``mode="jvp"``
the pairs are ``(f, jvp, args, outputs)`` for ``check_jvp`` (``jvp_check``), with
``mode="grad_jvp"`` those of the gradient's JVP (``grad_jvp_check``).

``f`` maps a case's arrays to chosen fields of the forward's result; ``vjp`` feeds the
cotangents to the operation's gradient as ``d_<field>``. Settings are passed to the gradient
explicitly, so a pair means the same whether or not the result records them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import scans, sequences, stacks, steps
from .._core import trees
from .._core.specs import FLAG_MASKS, MASKS
from ..cells import OPS as SPECS
from ..cells import OPTIONAL_WEIGHTS
from ..cells.gru.spec import GRUStackGrads
from ..cells.lstm.spec import GATE_FIELDS, NORM_ARRAYS, LSTMCellState, LSTMNorm, LSTMStackGrads
from ..cells.mingru.spec import MinGRUStackGrads
from ..cells.minlstm.spec import MinLSTMStackGrads
from ..cells.rglru.spec import RGLRUStackGrads
from ..cells.rnn.spec import RNNStackGrads
from ..cells.slstm.spec import SLSTMStackGrads
from ..oracle import JVPReport, VJPReport, check_jvp, check_vjp
from .cases import (
    STACK_CELLS,
    random_gru_cell_case,
    random_gru_sequence_case,
    random_linear_scan_case,
    random_lstm_cell_case,
    random_lstm_sequence_case,
    random_mingru_cell_case,
    random_mingru_sequence_case,
    random_minlstm_cell_case,
    random_minlstm_sequence_case,
    random_rglru_cell_case,
    random_rglru_sequence_case,
    random_rnn_cell_case,
    random_rnn_sequence_case,
    random_selective_scan_case,
    random_slstm_cell_case,
    random_slstm_sequence_case,
    random_stack_case,
)


def _random_stack(cell, rng, dtype=np.float64):
    """``random_stack_case`` as the drawers of ``OPS`` are called: ``(rng, dtype)``."""
    return random_stack_case(rng, cell, dtype)

# The arrays of a case (an LSTM case has no w_proj or layer_norm unless drawn; the pairs
# take every array the case has, from the specs).
LSTM_ARG_NAMES: tuple[str, ...] = SPECS["lstm_cell"].arrays[:-2]
GRU_ARG_NAMES: tuple[str, ...] = SPECS["gru_cell"].arrays
LSTM_SEQUENCE_ARG_NAMES: tuple[str, ...] = SPECS["lstm_sequence"].arrays[:-2]
GRU_SEQUENCE_ARG_NAMES: tuple[str, ...] = SPECS["gru_sequence"].arrays
RNN_ARG_NAMES: tuple[str, ...] = SPECS["rnn_cell"].arrays
RNN_SEQUENCE_ARG_NAMES: tuple[str, ...] = SPECS["rnn_sequence"].arrays
LSTM_SEQUENCE_OUTPUTS = ("h", "cs", "h_final", "cs_final")
LSTM_SEQUENCE_FIELDS = (*LSTM_SEQUENCE_OUTPUTS, *GATE_FIELDS)
"""Every field of an LSTM sequence's result: the states' and the gates' (docs/spec.md
§16.1), each with its upstream gradient in the sequence pair (its default outputs)."""
GRU_CELL_OUTPUTS: tuple[str, ...] = SPECS["gru_cell"].result._fields   # every field (§16.1)
GRU_SEQUENCE_OUTPUTS: tuple[str, ...] = SPECS["gru_sequence"].result._fields
RNN_SEQUENCE_OUTPUTS = ("h", "h_final")
SLSTM_CELL_OUTPUTS: tuple[str, ...] = SPECS["slstm_cell"].result._fields   # every field
SLSTM_SEQUENCE_OUTPUTS: tuple[str, ...] = SPECS["slstm_sequence"].result._fields
MINGRU_ARG_NAMES: tuple[str, ...] = SPECS["mingru_cell"].arrays
MINGRU_SEQUENCE_ARG_NAMES: tuple[str, ...] = SPECS["mingru_sequence"].arrays
MINGRU_CELL_OUTPUTS: tuple[str, ...] = SPECS["mingru_cell"].result._fields   # every field
MINGRU_SEQUENCE_OUTPUTS: tuple[str, ...] = SPECS["mingru_sequence"].result._fields
MINLSTM_ARG_NAMES: tuple[str, ...] = SPECS["minlstm_cell"].arrays
MINLSTM_SEQUENCE_ARG_NAMES: tuple[str, ...] = SPECS["minlstm_sequence"].arrays
MINLSTM_CELL_OUTPUTS: tuple[str, ...] = SPECS["minlstm_cell"].result._fields  # every field
MINLSTM_SEQUENCE_OUTPUTS: tuple[str, ...] = SPECS["minlstm_sequence"].result._fields

Pair = tuple[Callable[..., Any], Callable[..., Any], tuple, tuple[str, ...]]
"""``(f, vjp, args, names)`` for ``check_vjp``."""


def _flat_case(case, names):
    """``(names, arrays)``: the case's arrays among ``names``, the optional ones only when
    given, its ``layer_norm`` as the six arrays ``layer_norm.gamma_x``, ..."""
    flat = {}
    for name in names:
        value = case.get(name)
        if name == "layer_norm" and value is not None:
            flat.update(zip(NORM_ARRAYS, value, strict=True))
        elif name not in OPTIONAL_WEIGHTS or value is not None:
            flat[name] = value
    return tuple(flat), tuple(flat.values())


def _gradient_of(grads, name):
    """The gradient named like the input ``name`` (``layer_norm.gamma_x``: a field of the
    gradient's ``layer_norm``)."""
    if name in NORM_ARRAYS:
        return getattr(grads.layer_norm, name.removeprefix("layer_norm."))
    return getattr(grads, name)


def _norm_attrs(case):
    """The layer-norm settings of an LSTM case that has a layer norm."""
    if case.get("layer_norm") is None:
        return {}
    return {"ln_epsilon": case["ln_epsilon"], "ln_carry": case["ln_carry"]}


def _sequence_attrs(case):
    """The time order, layout and masks of a sequence case (the keywords it has)."""
    return {k: case[k] for k in ("reverse", "batch_first", *MASKS) if k in case}


def _masks_as(keywords, x):
    """``keywords`` with their masks (constants to the gradient: the sequence masks and a
    stack's ``dropout_masks``) in the dtype of ``x``, the one ``f`` is evaluated in."""
    def cast(m):
        return None if m is None else m.astype(x.dtype, copy=False)

    out = {k: cast(v) if k in MASKS and k not in FLAG_MASKS else v
           for k, v in keywords.items()}
    if out.get("dropout_masks") is not None:
        out["dropout_masks"] = [cast(m) for m in out["dropout_masks"]]
    return out


def _vjp_pair(forward, gradient, case, names, outputs, attrs, grad_attrs, backend,
              mode="vjp") -> Pair:
    """``(f, vjp, args, names)`` for the oracle: ``f`` maps the arrays named ``names`` to
    the ``outputs`` fields of ``forward``'s result; ``vjp`` feeds the cotangents to
    ``gradient`` as ``d_<output>``. The LSTM's optional weights (peepholes, projection,
    layer norm; the last names) are passed by keyword, and dropped when the case has none;
    a layer norm's six arrays are checked one by one.

    ``mode="jvp"``: ``(f, jvp, args, outputs)`` for ``check_jvp`` instead, ``jvp`` giving
    the tangents, one per array, to ``forward``'s ``_jvp`` op as its gradient type.
    ``mode="grad_jvp"``: the same for the gradient (second order): ``f`` maps the arrays
    and one fixed cotangent per output (seeded draws, then arguments with tangents of their
    own) to the gradients, its ``jvp`` is the gradient op's ``_grad_jvp``."""
    names, args = _flat_case(case, names)
    outputs = tuple(outputs)
    n_positional = sum(n not in OPTIONAL_WEIGHTS for n in names)

    def split(arrays):
        optional = dict(zip(names[n_positional:], arrays[n_positional:], strict=True))
        if NORM_ARRAYS[0] in optional:
            optional["layer_norm"] = LSTMNorm(*(optional.pop(n) for n in NORM_ARRAYS))
        return arrays[:n_positional], optional

    def run(*arrays):
        positional, peepholes = split(arrays)
        return forward(*positional, **peepholes, **_masks_as(attrs, arrays[0]), backend=backend)

    def f(*arrays):
        result = run(*arrays)
        return tuple(getattr(result, k) for k in outputs)

    def vjp(ct, *arrays):
        positional, peepholes = split(arrays)
        upstream = {f"d_{k}": c for k, c in zip(outputs, ct, strict=True)}
        grads = gradient(*positional, run(*arrays), **upstream, **peepholes,
                         **_masks_as(grad_attrs, arrays[0]), backend=backend)
        return tuple(_gradient_of(grads, n) for n in names)  # named as the inputs

    def jvp(tangents, *arrays):
        positional, peepholes = split(arrays)
        t_positional, t_optional = split(tangents)
        spec = SPECS[forward.__name__]
        given = spec.grads(**dict(zip(names[:n_positional], t_positional, strict=True)),
                           **t_optional)
        _, d_result = getattr(sequences if spec.sequence else steps, f"{spec.name}_jvp")(
            *positional, given, **peepholes, **_masks_as(attrs, arrays[0]), backend=backend)
        return tuple(getattr(d_result, k) for k in outputs)

    if mode == "jvp":
        return f, jvp, args, outputs
    if mode == "grad_jvp":
        return _second_order(f, vjp, args, names, split, gradient, run, outputs,
                             lambda a: {**_masks_as(grad_attrs, a), "backend": backend})
    return f, vjp, args, names


def _fixed_cotangents(outputs):
    """One cotangent per output of ``f`` (seeded normal draws in its dtype): the upstream
    gradients a second-order pair differentiates the gradient at, and along."""
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(np.shape(o)).astype(o.dtype) for o in outputs)


def _second_order(f, vjp, args, names, split, gradient, run, outputs, keywords) -> Pair:
    """``_vjp_pair``'s ``mode="grad_jvp"``: the gradient as a function of the arrays and
    the cotangents, and its JVP from the gradient op's ``_grad_jvp``."""
    cotangents = _fixed_cotangents(f(*args))
    n = len(args)

    def gradient_of(*a):
        grads = vjp(a[n:], *a[:n])
        return tuple(np.zeros_like(x) if g is None else g
                     for g, x in zip(grads, a[:n], strict=True))

    def grad_jvp(tangents, *a):
        arrays, cts = a[:n], a[n:]
        positional, peepholes = split(arrays)
        t_positional, t_optional = split(tangents[:n])
        spec = SPECS[gradient.__name__.removesuffix("_grad")]
        given = spec.grads(**dict(zip(names[:len(t_positional)], t_positional, strict=True)),
                           **t_optional)
        upstream = {**{f"d_{k}": c for k, c in zip(outputs, cts, strict=True)},
                    **{f"d_{k}_tangent": t for k, t in zip(outputs, tangents[n:], strict=True)}}
        _, d_grads = getattr(sequences if spec.sequence else steps, f"{gradient.__name__}_jvp")(
            *positional, run(*arrays), given, **upstream, **peepholes, **keywords(arrays[0]))
        return tuple(_gradient_of(d_grads, name) for name in names)

    return gradient_of, grad_jvp, args + cotangents, tuple(names)


def lstm_cell_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                       clip_grad: str = "exact", d_h: bool = True, d_cs: bool = True,
                       gates: bool = True, mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``lstm_cell``: ``f`` maps the case's arrays
    to every field of the result that gets an upstream gradient, in the result's order:
    ``cs`` and ``h`` (``d_cs``, ``d_h``) and the gates ``i, f, o, ci, co`` (``gates``;
    docs/spec.md §16.1)."""
    on = {"cs": d_cs, "h": d_h, **dict.fromkeys(GATE_FIELDS, gates)}
    outputs = [k for k in LSTMCellState._fields if on[k]]
    return _vjp_pair(
        steps.lstm_cell, steps.lstm_cell_grad, case, SPECS["lstm_cell"].arrays, outputs,
        {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"],
         "proj_clip": case.get("proj_clip"), **_norm_attrs(case)},
        {"cell_clip": case["cell_clip"], "proj_clip": case.get("proj_clip"),
         "clip_grad": clip_grad, **_norm_attrs(case)}, backend, mode)


def gru_cell_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                      outputs: Sequence[str] = GRU_CELL_OUTPUTS, mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``gru_cell``: ``f`` maps the case's arrays
    to the chosen ``outputs`` (any of "r", "u", "c", "h": by default every field, so the
    gates carry cotangents too, docs/spec.md §16.1); the others get no upstream gradient."""
    attrs = {"reset_after": case["reset_after"]}
    return _vjp_pair(steps.gru_cell, steps.gru_cell_grad, case, GRU_ARG_NAMES, outputs, attrs,
                     attrs, backend, mode)


def lstm_sequence_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                           clip_grad: str = "exact",
                           outputs: Sequence[str] = LSTM_SEQUENCE_FIELDS,
                           mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``lstm_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (any of ``LSTM_SEQUENCE_FIELDS``: "h", "cs",
    "h_final", "cs_final" and the gates "i", "f", "o", "ci", "co"; all of them by default);
    the others get no upstream gradient (None)."""
    return _vjp_pair(
        sequences.lstm_sequence, sequences.lstm_sequence_grad, case,
        SPECS["lstm_sequence"].arrays,
        outputs, {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"],
                  "proj_clip": case.get("proj_clip"), "seq_len": case["seq_len"],
                  **_norm_attrs(case), **_sequence_attrs(case)},
        {"cell_clip": case["cell_clip"], "proj_clip": case.get("proj_clip"),
         "clip_grad": clip_grad, "seq_len": case["seq_len"], **_norm_attrs(case),
         **_sequence_attrs(case)},
        backend, mode)


def gru_sequence_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                          outputs: Sequence[str] = GRU_SEQUENCE_OUTPUTS,
                          mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``gru_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (any of "r", "u", "c", "h", "h_final": by default every
    field, the gates' included, docs/spec.md §16.1); the others get no upstream gradient."""
    attrs = {"reset_after": case["reset_after"], "seq_len": case["seq_len"],
             **_sequence_attrs(case)}
    return _vjp_pair(sequences.gru_sequence, sequences.gru_sequence_grad, case,
                     GRU_SEQUENCE_ARG_NAMES, outputs, attrs, attrs, backend, mode)


def rnn_cell_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                      mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``rnn_cell``: ``f`` maps the case's arrays
    to ``(h,)``."""
    attrs = {"activation": case["activation"]}
    return _vjp_pair(steps.rnn_cell, steps.rnn_cell_grad, case, RNN_ARG_NAMES, ("h",), attrs,
                     attrs, backend, mode)


def rnn_sequence_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                          outputs: Sequence[str] = RNN_SEQUENCE_OUTPUTS,
                          mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``rnn_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` ("h", "h_final")."""
    attrs = {"activation": case["activation"], "seq_len": case["seq_len"],
             **_sequence_attrs(case)}
    return _vjp_pair(sequences.rnn_sequence, sequences.rnn_sequence_grad, case,
                     RNN_SEQUENCE_ARG_NAMES, outputs, attrs, attrs, backend, mode)


def mingru_cell_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                         outputs: Sequence[str] = MINGRU_CELL_OUTPUTS,
                         mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``mingru_cell``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (by default every field: "z", "hc", "h")."""
    attrs = {"activation": case["activation"]}
    return _vjp_pair(steps.mingru_cell, steps.mingru_cell_grad, case, MINGRU_ARG_NAMES,
                     outputs, attrs, attrs, backend, mode)


def mingru_sequence_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                             outputs: Sequence[str] = MINGRU_SEQUENCE_OUTPUTS,
                             mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``mingru_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (by default every field: "z", "hc", "h",
    "h_final")."""
    attrs = {"activation": case["activation"], "seq_len": case["seq_len"],
             **({"method": case["method"]} if "method" in case else {}),
             **_sequence_attrs(case)}
    return _vjp_pair(sequences.mingru_sequence, sequences.mingru_sequence_grad, case,
                     MINGRU_SEQUENCE_ARG_NAMES, outputs, attrs, attrs, backend, mode)


def _slstm_attrs(case):
    """An sLSTM case's settings."""
    return {"forget": case["forget"], "stabilizer_grad": case["stabilizer_grad"]}


def slstm_cell_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                        outputs: Sequence[str] = SLSTM_CELL_OUTPUTS,
                        mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``slstm_cell``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (every field by default, docs/spec.md §16.1). A case
    with ``stabilizer_grad="stop"`` is the derivative only of ``h`` and only away from
    ``m_prev``: pass ``outputs=("h",)`` and disregard ``m_prev``'s row."""
    attrs = _slstm_attrs(case)
    return _vjp_pair(steps.slstm_cell, steps.slstm_cell_grad, case,
                     SPECS["slstm_cell"].arrays, outputs, attrs, attrs, backend, mode)


def slstm_sequence_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                            outputs: Sequence[str] = SLSTM_SEQUENCE_OUTPUTS,
                            mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``slstm_sequence``: ``f`` maps the
    case's arrays to the chosen ``outputs`` (every field by default), as
    ``slstm_cell_vjp_pair``."""
    attrs = {**_slstm_attrs(case), "seq_len": case["seq_len"], **_sequence_attrs(case)}
    return _vjp_pair(sequences.slstm_sequence, sequences.slstm_sequence_grad, case,
                     SPECS["slstm_sequence"].arrays, outputs, attrs, attrs, backend, mode)
def minlstm_cell_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                          outputs: Sequence[str] = MINLSTM_CELL_OUTPUTS,
                          mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``minlstm_cell``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (by default every field: "f", "i", "hc", "h")."""
    attrs = {"activation": case["activation"]}
    return _vjp_pair(steps.minlstm_cell, steps.minlstm_cell_grad, case, MINLSTM_ARG_NAMES,
                     outputs, attrs, attrs, backend, mode)


def minlstm_sequence_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                              outputs: Sequence[str] = MINLSTM_SEQUENCE_OUTPUTS,
                              mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``minlstm_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (by default every field: "f", "i", "hc", "h",
    "h_final")."""
    attrs = {"activation": case["activation"], "seq_len": case["seq_len"],
             **({"method": case["method"]} if "method" in case else {}),
             **_sequence_attrs(case)}
    return _vjp_pair(sequences.minlstm_sequence, sequences.minlstm_sequence_grad, case,
                     MINLSTM_SEQUENCE_ARG_NAMES, outputs, attrs, attrs, backend, mode)


RGLRU_ARG_NAMES: tuple[str, ...] = SPECS["rglru_cell"].arrays
RGLRU_SEQUENCE_ARG_NAMES: tuple[str, ...] = SPECS["rglru_sequence"].arrays
RGLRU_CELL_OUTPUTS: tuple[str, ...] = SPECS["rglru_cell"].result._fields
RGLRU_SEQUENCE_OUTPUTS: tuple[str, ...] = SPECS["rglru_sequence"].result._fields


def _rglru_attrs(case):
    return {k: case[k] for k in ("c", "sqrt_grad_bound") if k in case}


def rglru_cell_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                        outputs: Sequence[str] = RGLRU_CELL_OUTPUTS,
                        mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``rglru_cell``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (by default every field: "r", "i", "h")."""
    attrs = _rglru_attrs(case)
    return _vjp_pair(steps.rglru_cell, steps.rglru_cell_grad, case, RGLRU_ARG_NAMES,
                     outputs, attrs, attrs, backend, mode)


def rglru_sequence_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                            outputs: Sequence[str] = RGLRU_SEQUENCE_OUTPUTS,
                            mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``rglru_sequence``: ``f`` maps the case's
    arrays to the chosen ``outputs`` (by default every field: "r", "i", "h", "h_final");
    the ``resets`` flags are constants."""
    attrs = {**_rglru_attrs(case), "seq_len": case["seq_len"],
             **({"method": case["method"]} if "method" in case else {}),
             **_sequence_attrs(case)}
    return _vjp_pair(sequences.rglru_sequence, sequences.rglru_sequence_grad, case,
                     RGLRU_SEQUENCE_ARG_NAMES, outputs, attrs, attrs, backend, mode)


def _flat_weights(weights):
    """Every array of a list of weight sets with its name (``weights[k].w``,
    ``weights[k].layer_norm.gamma_x``, ...), and the arrays alone (absent weights, None,
    left out; ``_rebuilt`` puts arrays back in their places)."""
    named = [(name, a) for name, a in trees.named_leaves(weights, ("weights",))
             if a is not None]
    return [name for name, _ in named], [a for _, a in named]


def _rebuilt(weights, arrays):
    """``weights`` with its arrays (those ``_flat_weights`` lists) replaced by ``arrays``,
    in order."""
    given = iter(arrays)
    return trees.map_leaves(lambda a: None if a is None else next(given), weights)


_STACK_GRADS = {"lstm": LSTMStackGrads, "gru": GRUStackGrads, "rnn": RNNStackGrads,
                "mingru": MinGRUStackGrads, "slstm": SLSTMStackGrads,
                "minlstm": MinLSTMStackGrads, "rglru": RGLRUStackGrads}


def stack_vjp_pair(cell: str, case: dict[str, Any], *, backend: str | None = None,
                   clip_grad: str = "exact", mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``gc.<cell>_stack``: ``f`` maps the input,
    the initial states and every array of every weight set to the top outputs and the
    final states; ``vjp`` is ``<cell>_stack_grad`` (an LSTM's with ``clip_grad``). With
    ``mode="jvp"``, ``(f, jvp, args, outputs)`` for ``check_jvp``, ``jvp`` from
    ``<cell>_stack_jvp``."""
    forward, gradient = getattr(stacks, f"{cell}_stack"), getattr(stacks, f"{cell}_stack_grad")
    states = SPECS[f"{cell}_sequence"].states
    keywords = {k: v for k, v in case.items() if k not in ("x", "weights", *states)}
    weight_names, arrays = _flat_weights(case["weights"])
    finals = ("h_final", *(f"{s.removesuffix('0')}_final" for s in states if s != "h0"))
    extra = {"clip_grad": clip_grad} if cell == "lstm" else {}

    def run(args):
        rebuilt = _rebuilt(case["weights"], args[1 + len(states):])
        fixed = (args[0], *args[1:1 + len(states)], rebuilt)
        return fixed, forward(*fixed, **_masks_as(keywords, args[0]), backend=backend)

    def f(*args):
        stack = run(args)[1]
        return (stack.h, *(getattr(stack, k) for k in finals))

    def vjp(ct, *args):
        fixed, stack = run(args)
        upstream = dict(zip(("d_h", *(f"d_{k}" for k in finals)), ct, strict=True))
        g = gradient(*fixed, stack, **upstream, **extra, backend=backend)
        return (g.x, *(getattr(g, k) for k in states), *_flat_weights(g.weights)[1])

    def jvp(tangents, *args):
        fixed = run(args)[0]
        d_weights = _rebuilt(case["weights"], tangents[1 + len(states):])
        given = _STACK_GRADS[cell](tangents[0], *tangents[1:1 + len(states)], d_weights)
        _, d_stack = getattr(stacks, f"{cell}_stack_jvp")(
            *fixed, given, **_masks_as(keywords, args[0]), backend=backend)
        return (d_stack.h, *(getattr(d_stack, k) for k in finals))

    def grad_jvp(tangents, *a):
        n = len(a) - 1 - len(finals)
        fixed, stack = run(a[:n])
        d_weights = _rebuilt(case["weights"], tangents[1 + len(states):n])
        given = _STACK_GRADS[cell](tangents[0], *tangents[1:1 + len(states)], d_weights)
        upstream = dict(zip(("d_h", *(f"d_{k}" for k in finals)), a[n:], strict=True))
        upstream.update({f"{k}_tangent": t
                         for k, t in zip(upstream, tangents[n:], strict=True)})
        _, d_grads = getattr(stacks, f"{cell}_stack_grad_jvp")(*fixed, stack, given,
                                                                **upstream, **extra,
                                                                backend=backend)
        return (d_grads.x, *(getattr(d_grads, k) for k in states),
                *_flat_weights(d_grads.weights)[1])

    args = (case["x"], *(case[k] for k in states), *arrays)
    names = ("x", *states, *weight_names)
    if mode == "jvp":
        return f, jvp, args, ("h", *finals)
    if mode == "grad_jvp":
        return (lambda *a: vjp(a[len(args):], *a[:len(args)]), grad_jvp,
                args + _fixed_cotangents(f(*args)), names)
    return f, vjp, args, names


# --------------------------------------------------------------------------------------
# The linear scan (docs/spec.md §18.1): complex arrays as their real and imaginary parts


def _parts(v):
    return (np.ascontiguousarray(v.real), np.ascontiguousarray(v.imag)) \
        if v.dtype.kind == "c" else (v,)


def _joined(arrays, sizes):
    """The arrays of ``sizes`` parts each (2: a complex array's real and imaginary parts)."""
    out, k = [], 0
    for n in sizes:
        out.append(arrays[k] if n == 1 else arrays[k] + 1j * arrays[k + 1])
        k += n
    return out


def _named_parts(names, sizes):
    return tuple(p for name, n in zip(names, sizes, strict=True)
                 for p in ((name,) if n == 1 else (f"{name}.re", f"{name}.im")))


def linear_scan_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                         mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``linear_scan``: ``f`` maps ``a``, ``b``,
    ``h0`` to ``(h, h_final)``, every complex array as its real and imaginary parts (named
    ``a.re``, ``a.im``, ...), so that the differences check PyTorch's convention itself: the
    cotangent ``(u_re, u_im)`` of ``(Re h, Im h)`` is ``d_h = u_re + i u_im`` and the
    gradient of ``Re z`` and ``Im z`` are the real and imaginary parts of ``z``'s.
    ``mode`` "jvp" and "grad_jvp" as ``_vjp_pair``'s."""
    keywords = {k: case[k] for k in ("seq_len", "reverse", "resets", "batch_first", "method")}
    primals = (case["a"], case["b"], case["h0"])
    sizes = [len(_parts(v)) for v in primals]
    out_sizes = [sizes[1]] * 2
    names = _named_parts(scans.LinearScanGrads._fields, sizes)
    args = tuple(p for v in primals for p in _parts(v))

    def f(*arrays):
        result = scans.linear_scan(*_joined(arrays, sizes), **keywords, backend=backend)
        return tuple(p for v in result for p in _parts(v))

    def vjp(ct, *arrays):
        joined = _joined(arrays, sizes)
        d_h, d_final = _joined(ct, out_sizes)
        grads = scans.linear_scan_grad(*joined, scans.linear_scan(*joined, **keywords),
                                       d_h=d_h, d_h_final=d_final, backend=backend)
        return tuple(p for v in grads for p in _parts(v))

    def jvp(tangents, *arrays):
        _, t = scans.linear_scan_jvp(*_joined(arrays, sizes),
                                     scans.LinearScanGrads(*_joined(tangents, sizes)),
                                     **keywords, backend=backend)
        return tuple(p for v in t for p in _parts(v))

    if mode == "jvp":
        return f, jvp, args, _named_parts(("h", "h_final"), out_sizes)
    if mode != "grad_jvp":
        return f, vjp, args, names
    cotangents = _fixed_cotangents(f(*args))
    n = len(args)

    def grad_jvp(tangents, *a):
        joined = _joined(a[:n], sizes)
        d_h, d_final = _joined(a[n:], out_sizes)
        t_d_h, t_d_final = _joined(tangents[n:], out_sizes)
        _, t = scans.linear_scan_grad_jvp(
            *joined, scans.linear_scan(*joined, **keywords),
            scans.LinearScanGrads(*_joined(tangents[:n], sizes)), d_h=d_h,
            d_h_final=d_final, d_h_tangent=t_d_h, d_h_final_tangent=t_d_final,
            backend=backend)
        return tuple(p for v in t for p in _parts(v))

    return (lambda *a: vjp(a[n:], *a[:n])), grad_jvp, args + cotangents, names


# --------------------------------------------------------------------------------------
# Mamba's selective scan (docs/spec.md §18.4): the optional arrays given are arguments too


_SELECTIVE_SETTINGS = ("delta_softplus", "reverse", "return_last_state")


def selective_scan_vjp_pair(case: dict[str, Any], *, backend: str | None = None,
                            mode: str = "vjp") -> Pair:
    """The oracle's ``(f, vjp, args, names)`` for ``selective_scan``: ``f`` maps ``u``,
    ``delta``, ``A``, ``B``, ``C`` and those of ``D``, ``z``, ``delta_bias`` the case gives
    to ``(y, last_state)``. ``mode`` "jvp" and "grad_jvp" as ``_vjp_pair``'s."""
    settings = {k: case[k] for k in _SELECTIVE_SETTINGS}
    names = tuple(k for k in scans.SelectiveScanGrads._fields if case[k] is not None)
    args = tuple(case[k] for k in names)

    def split(arrays):
        named = dict(zip(names, arrays, strict=True))
        return [named.pop(k) for k in ("u", "delta", "A", "B", "C")], named

    def f(*arrays):
        positional, optional = split(arrays)
        return tuple(scans.selective_scan(*positional, **optional, **settings,
                                          backend=backend))

    def grads_of(grads):
        return tuple(getattr(grads, k) for k in names)

    def tangents_of(tangents):
        return scans.SelectiveScanGrads(**{k: dict(zip(names, tangents, strict=True)).get(k)
                                           for k in scans.SelectiveScanGrads._fields})

    def vjp(ct, *arrays):
        positional, optional = split(arrays)
        result = scans.selective_scan(*positional, **optional, **settings, backend=backend)
        return grads_of(scans.selective_scan_grad(*positional, result, **optional,
                                                  d_y=ct[0], d_last_state=ct[1],
                                                  backend=backend))

    def jvp(tangents, *arrays):
        positional, optional = split(arrays)
        _, t = scans.selective_scan_jvp(*positional, tangents_of(tangents), **optional,
                                        **settings, backend=backend)
        return tuple(t)

    if mode == "jvp":
        return f, jvp, args, ("y", "last_state")
    if mode != "grad_jvp":
        return f, vjp, args, names
    cotangents = _fixed_cotangents(f(*args))
    n = len(args)

    def grad_jvp(tangents, *a):
        positional, optional = split(a[:n])
        result = scans.selective_scan(*positional, **optional, **settings, backend=backend)
        _, t = scans.selective_scan_grad_jvp(
            *positional, result, tangents_of(tangents[:n]), **optional, d_y=a[n],
            d_last_state=a[n + 1], d_y_tangent=tangents[n], d_last_state_tangent=tangents[n + 1],
            backend=backend)
        return grads_of(t)

    return (lambda *a: vjp(a[n:], *a[:n])), grad_jvp, args + cotangents, names


# Every public differentiable operation: (random case drawer, oracle pair builder); the
# sequences' drawers draw the time order and the layout too.
OPS: dict[str, tuple[Callable[..., dict[str, Any]], Callable[..., Pair]]] = {
    "lstm_cell": (random_lstm_cell_case, lstm_cell_vjp_pair),
    "lstm_sequence": (functools.partial(random_lstm_sequence_case, order=True),
                      lstm_sequence_vjp_pair),
    "gru_cell": (random_gru_cell_case, gru_cell_vjp_pair),
    "gru_sequence": (functools.partial(random_gru_sequence_case, order=True),
                     gru_sequence_vjp_pair),
    "rnn_cell": (random_rnn_cell_case, rnn_cell_vjp_pair),
    "rnn_sequence": (functools.partial(random_rnn_sequence_case, order=True),
                     rnn_sequence_vjp_pair),
    "mingru_cell": (random_mingru_cell_case, mingru_cell_vjp_pair),
    "mingru_sequence": (functools.partial(random_mingru_sequence_case, order=True),
                        mingru_sequence_vjp_pair),
    "slstm_cell": (random_slstm_cell_case, slstm_cell_vjp_pair),
    "slstm_sequence": (functools.partial(random_slstm_sequence_case, order=True),
                       slstm_sequence_vjp_pair),
    "minlstm_cell": (random_minlstm_cell_case, minlstm_cell_vjp_pair),
    "minlstm_sequence": (functools.partial(random_minlstm_sequence_case, order=True),
                         minlstm_sequence_vjp_pair),
    "rglru_cell": (random_rglru_cell_case, rglru_cell_vjp_pair),
    "rglru_sequence": (functools.partial(random_rglru_sequence_case, order=True),
                       rglru_sequence_vjp_pair),
    **{f"{cell}_stack": (functools.partial(_random_stack, cell),
                         functools.partial(stack_vjp_pair, cell)) for cell in STACK_CELLS},
    "linear_scan": (random_linear_scan_case, linear_scan_vjp_pair),
    "selective_scan": (random_selective_scan_case, selective_scan_vjp_pair),
}


def jvp_check(op: str, case: dict[str, Any], *, seed: int = 0, rtol: float | None = None,
              atol: float | None = None, **options: Any) -> JVPReport:
    """Run ``check_jvp`` on the forward mode of the public operation ``op`` (a key of
    ``OPS``; its ``<op>_jvp``) for ``case``: every output the oracle pair names,
    along seeded random tangents of every array of the case. ``options`` go to the op's
    pair builder (``backend``, ``outputs``, ...). Returns the ``JVPReport``."""
    f, jvp, args, outputs = OPS[op][1](case, mode="jvp", **options)
    return check_jvp(f, jvp, args, names=outputs, seed=seed, rtol=rtol, atol=atol)


def grad_jvp_check(op: str, case: dict[str, Any], *, seed: int = 0,
                   rtol: float | None = None, atol: float | None = None,
                   **options: Any) -> JVPReport:
    """Run ``check_jvp`` on the second order of the public operation ``op``: its gradient
    as a function of the case's arrays and a fixed cotangent of every
    output, against ``<op>_grad_jvp``, along seeded random tangents of all of them (the
    cotangents' included). Returns the ``JVPReport`` (one row per gradient)."""
    f, jvp, args, names = OPS[op][1](case, mode="grad_jvp", **options)
    return check_jvp(f, jvp, args, names=names, seed=seed, rtol=rtol, atol=atol)


def vjp_check(op: str, case: dict[str, Any], *, seed: int = 0, rtol: float | None = None,
              atol: float | None = None, **options: Any) -> VJPReport:
    """Run the oracle on public operation ``op`` (a key of ``OPS``) for ``case``, with
    ``check_vjp``'s tolerances (None: its defaults for the gradients' dtype).

    ``options`` go to the op's pair builder (``backend``, ``clip_grad``, ...).
    Returns the ``VJPReport``.
    """
    f, vjp, args, names = OPS[op][1](case, **options)
    return check_vjp(f, vjp, args, names=names, seed=seed, rtol=rtol, atol=atol)
