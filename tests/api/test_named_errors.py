"""Named errors at call time (docs/spec.md §16.3): a stack gradient's weight sets checked
against what its forward ran, and a GRU candidate bias of the other variant's shape saying
which variant it is. (Dask: tests/frameworks/test_dask.py; JAX:
tests/frameworks/test_jax_adapter.py; every public function under malformed arguments:
tests/api/test_fuzz.py.)"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import gradcells as gc
from gradcells import _validate as v
from gradcells.testing import cases

CELLS = {"lstm": gc.LSTMWeights, "gru": gc.GRUWeights, "rnn": gc.RNNWeights}
OTHER = {"lstm": gc.GRUWeights, "gru": gc.LSTMWeights, "rnn": gc.GRUWeights}

def _stack(cell, rng):
    """A two-layer bidirectional stack case (layer 0 of an LSTM with peepholes) and its
    forward's result."""
    case = cases.stack_case(rng, cell, batch=3, steps=4, hidden=5,
                            proj_size=3 if cell == "lstm" else None)
    forward = getattr(gc, f"{cell}_stack")
    taken = inspect.signature(forward).parameters
    return case, forward(**{k: a for k, a in case.items() if k in taken})


def _other_set(cell, weights):
    """A weight set of another cell, its arrays taken from ``weights``."""
    arrays = [a for a in weights if a is not None]
    kind = OTHER[cell]
    return kind(*(arrays[k % len(arrays)] if name in kind._fields[:4] else None
                  for k, name in enumerate(kind._fields)))


def _one_row_short(weights):
    """``weights`` with its first array one row short."""
    first = weights._fields[0]
    return weights._replace(**{first: getattr(weights, first)[:-1]})


# (how the list is spoiled, the message it must give, matched from its start)
SPOILED = {
    "fewer": (lambda cell, ws: ws[:-1],
              r"weights holds 3 weight sets but the forward ran 4 \(2 layers × 2 directions, "
              r"stack.layers\): weights\[3\] \(layer 1, reverse\) is missing"),
    "more": (lambda cell, ws: [*ws, ws[0]],
             r"weights holds 5 weight sets but the forward ran 4 .*: weights\[4\] \(layer 2\) "
             r"has no layer"),
    "another cell's set": (lambda cell, ws: [ws[0], _other_set(cell, ws[1]), *ws[2:]],
                           r"weights\[1\] \(layer 0, reverse\) must be a gradcells\.\w+Weights, "
                           r"as the forward ran it \(stack.layers\[1\]\), got \w+Weights"),
    "an array's shape": (lambda cell, ws: [*ws[:3], _one_row_short(ws[3])],
                         r"weights\[3\] \(layer 1, reverse\): (w|w_ru) must have shape "
                         r"\[I\+(H|P), \w+\] = \(\d+, \d+\), got .* as the forward ran, "
                         r"stack.layers\[3\]\)"),
    "two layers swapped": (lambda cell, ws: [ws[2], ws[3], ws[0], ws[1]],
                           r"weights\[0\] \(layer 0\): "),
}


@pytest.mark.parametrize("spoil", SPOILED)
@pytest.mark.parametrize("cell", CELLS)
def test_a_stack_gradients_weights_are_checked_against_its_forward(cell, spoil, rng):
    case, stack = _stack(cell, rng)
    change, message = SPOILED[spoil]
    with pytest.raises(ValueError, match="^" + message):
        v.stack_weights(CELLS[cell], case["x"], change(cell, case["weights"]), stack)
    v.stack_weights(CELLS[cell], case["x"], case["weights"], stack)  # the forward's own pass


def test_a_stack_gradients_lstm_sets_have_the_optional_arrays_the_forward_ran(rng):
    case, stack = _stack("lstm", rng)
    weights = case["weights"]
    without = [weights[0]._replace(wci=None, wcf=None, wco=None), *weights[1:]]
    with pytest.raises(ValueError, match=r"^weights\[0\] \(layer 0\): the forward ran with "
                                         r"peepholes; pass wci, wcf, wco again"):
        v.stack_weights(gc.LSTMWeights, case["x"], without, stack)
    added = [*weights[:2], weights[2]._replace(wci=weights[0].wci, wcf=weights[0].wcf,
                                              wco=weights[0].wco), weights[3]]
    with pytest.raises(ValueError, match=r"^weights\[2\] \(layer 1\): wci, wcf, wco were given "
                                         r"but the forward ran without peepholes "
                                         r"\(stack.layers\[2\].settings.peepholes is False\)"):
        v.stack_weights(gc.LSTMWeights, case["x"], added, stack)


def test_a_stack_gradients_arrays_are_named_with_their_layer(rng):
    case, stack = _stack("gru", rng)
    weights = case["weights"]
    with pytest.raises(TypeError, match=r"^weights\[1\] \(layer 0, reverse\): b_c must be an "
                                        r"array, got None"):
        v.stack_weights(gc.GRUWeights, case["x"],
                        [weights[0], weights[1]._replace(b_c=None), *weights[2:]], stack)
    single = [weights[0], weights[1]._replace(w_c=weights[1].w_c.astype(np.float32)),
              *weights[2:]]
    with pytest.raises(TypeError, match=r"^weights\[1\] \(layer 0, reverse\): w_c must have "
                                        r"the same dtype as x \(float64\), got float32"):
        v.stack_weights(gc.GRUWeights, case["x"], single, stack)
    with pytest.raises(TypeError, match="^weights must be the list of gradcells.GRUWeights"):
        v.stack_weights(gc.GRUWeights, case["x"], weights[0], stack)


def _gradient_call(cell, suffix, case, stack, weights):
    """``gc.<cell>_stack<suffix>`` on the case with ``weights``."""
    function = getattr(gc, f"{cell}_stack{suffix}")
    taken = inspect.signature(function).parameters
    extra = {"tangents": None} if "tangents" in taken else {}
    return function(**{k: a for k, a in case.items() if k in taken and k != "weights"},
                    weights=weights, stack=stack, d_h=np.ones(stack.h.shape), **extra)


@pytest.mark.parametrize("suffix", ["_grad", "_grad_jvp"])
@pytest.mark.parametrize("spoil", SPOILED)
@pytest.mark.parametrize("cell", CELLS)
def test_the_public_stack_gradients_check_their_weights(cell, spoil, suffix, rng):
    case, stack = _stack(cell, rng)
    change, message = SPOILED[spoil]
    with pytest.raises(ValueError, match="^" + message):
        _gradient_call(cell, suffix, case, stack, change(cell, case["weights"]))


# A GRU candidate bias of the other variant's shape (docs/spec.md §3)
AFTER = r"^b_c has shape \[2H\] = \(10,\), the reset-after layout: pass reset_after=True \("
BEFORE = (r"^b_c has shape \[H\] = \(5,\), the reset-before layout \(TensorFlow's block cell\): "
          r"pass reset_after=False \(")
OP_RESULTS = {"gru_cell": "state", "gru_sequence": "seq"}


@pytest.mark.parametrize("op", ["gru_cell", "gru_sequence"])
def test_a_reset_after_bias_by_default_says_pass_reset_after(op, rng):
    make = cases.gru_cell_case if op == "gru_cell" else cases.gru_sequence_case
    case = make(rng, batch=3, input_size=3, hidden=5, reset_after=True)
    function = getattr(gc, op)
    taken = inspect.signature(function).parameters
    arguments = {k: a for k, a in case.items() if k in taken and k != "reset_after"}
    with pytest.raises(ValueError, match=AFTER):
        function(**arguments)
    unrecorded = tuple(function(**arguments, reset_after=True))  # the keywords decide
    with pytest.raises(ValueError, match=AFTER):
        getattr(gc, f"{op}_grad")(**arguments, **{OP_RESULTS[op]: unrecorded})
    narrow = {**arguments, "b_c": case["b_c"][:5]}
    with pytest.raises(ValueError, match=BEFORE):
        function(**narrow, reset_after=True)


def test_a_stacks_reset_before_bias_says_pass_reset_after_false(rng):
    case, stack = _stack("gru", rng)
    weights = [w._replace(b_c=w.b_c[:5]) for w in case["weights"]]
    taken = inspect.signature(gc.gru_stack).parameters
    with pytest.raises(ValueError, match=BEFORE):
        gc.gru_stack(**{k: a for k, a in case.items() if k in taken and k != "weights"},
                     weights=weights)
    with pytest.raises(ValueError, match=r"^weights\[0\] \(layer 0\): " + BEFORE[1:]):
        v.stack_weights(gc.GRUWeights, case["x"], weights, stack)
    odd = [case["weights"][0]._replace(b_c=case["weights"][0].b_c[:3]), *case["weights"][1:]]
    with pytest.raises(ValueError, match=r"^weights\[0\] \(layer 0\): b_c must have shape "
                                         r"\[2H\] = \(10,\), got \(3,\)"):
        v.stack_weights(gc.GRUWeights, case["x"], odd, stack)
