"""Every public operation under malformed arguments (docs/spec.md §7, §16.3): Hypothesis
spoils a valid call of each (an array's shape, dtype or library, None, NaN, lengths, a
setting that is wrong or contradicts the forward's, the weight sets, the result, the
tangents); every call either succeeds or raises ``TypeError``/``ValueError``, nothing else,
and changes none of its arguments. The number of calls is reported at the end of the run
(and a last test asserts it reached its floor)."""

from __future__ import annotations

import copy
import inspect
import re
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells._core import trees
from gradcells.cells import CELLS, OPS, SPECS, STACKS
from gradcells.testing import cases

SUFFIXES = ("", "_grad", "_jvp", "_grad_jvp")
PUBLIC = re.compile(rf"^({'|'.join(CELLS)})_(cell|sequence|stack)(_grad)?(_jvp)?$")
FUNCTIONS = sorted(n for n in gc.__all__ if PUBLIC.match(n) and callable(getattr(gc, n)))
CALLS = {"calls": 0, "succeeded": 0, "TypeError": 0, "ValueError": 0, "other": 0}
FLOOR = 20 * len(FUNCTIONS)         # the dev profile draws 25 examples per function


def test_the_fuzzed_functions_are_every_operation():
    assert FUNCTIONS == sorted(f"{base}{suffix}" for base in (*OPS, *STACKS)
                               for suffix in SUFFIXES)


# --------------------------------------------------------------------------------------
# One valid call of each function


def _case(base, rng):
    """Keyword arguments of a valid forward call of ``base`` (small sizes, every option the
    case helpers offer that the reference backend runs quickly)."""
    cell, kind = base.split("_")
    if kind == "stack":
        return cases.stack_case(rng, cell, batch=3, steps=3, hidden=4,
                                proj_size=2 if cell == "lstm" else None)
    extra = {"lstm": {"peephole": True, "proj_size": 2}, "gru": {"reset_after": True},
             "slstm": {"heads": 2}}.get(cell, {})
    if kind == "sequence":
        extra.update(ragged=True, **({"masks": True} if SPECS[cell].masks else {}))
    return getattr(cases, f"{base}_case")(rng, batch=3, input_size=3, **extra)


def _taken(function, arguments):
    names = inspect.signature(function).parameters
    return {k: a for k, a in arguments.items() if k in names}


def _valid_call(name):
    """``name``'s keyword arguments for a valid call (``backend="reference"``)."""
    base = next(b for b in (*OPS, *STACKS) if name == b or name.startswith(b + "_"))
    case = {**_case(base, np.random.default_rng(0)), "backend": "reference"}
    forward = getattr(gc, base)
    result = forward(**_taken(forward, case))
    function = getattr(gc, name)
    extra = {"state": result, "seq": result, "stack": result, "tangents": None,
             "d_h": np.ones(result.h.shape)}
    return _taken(function, {**case, **extra})


VALID = {}


def valid_call(name):
    if name not in VALID:
        VALID[name] = _valid_call(name)
    return copy.deepcopy(VALID[name])


# --------------------------------------------------------------------------------------
# The spoilers: each draws one change of a valid call's keyword arguments


def _arrays(arguments):
    return [(path, a) for path, a in trees.leaves_with_path(arguments)
            if isinstance(a, np.ndarray) and path[:2] != ("stack", "layers")]


def _replaced(arguments, path, value):
    return trees.map_with_path(lambda leaf, at: value if at == path else leaf, arguments)


def _pick_array(data, arguments):
    return data.draw(st.sampled_from(_arrays(arguments)))


def spoil_shape(data, arguments):
    path, a = _pick_array(data, arguments)
    shape = list(a.shape)
    how = data.draw(st.sampled_from(["drop", "add", "change"] if shape else ["add"]))
    if how == "drop":
        shape.pop(data.draw(st.integers(0, len(shape) - 1)))
    elif how == "add":
        shape.insert(data.draw(st.integers(0, len(shape))), data.draw(st.integers(0, 3)))
    else:
        k = data.draw(st.integers(0, len(shape) - 1))
        shape[k] = max(0, shape[k] + data.draw(st.sampled_from([-1, 1, 2])))
    return _replaced(arguments, path, np.ones(shape, a.dtype))


def spoil_dtype(data, arguments):
    path, a = _pick_array(data, arguments)
    dtype = data.draw(st.sampled_from([np.float32, np.float16, np.int64, np.int32, np.bool_,
                                       np.complex128, object, np.float64]))
    with warnings.catch_warnings():             # NaN, inf or complex numbers cast
        warnings.simplefilter("ignore")
        return _replaced(arguments, path, a.astype(dtype))


def spoil_library(data, arguments):
    path, a = _pick_array(data, arguments)
    how = data.draw(st.sampled_from(["list", "torch", "scalar", "bytes"]))
    if how == "torch" and a.dtype.kind in "biuf":
        torch = pytest.importorskip("torch")
        return _replaced(arguments, path, torch.from_numpy(a.copy()))
    value = {"list": a.tolist(), "scalar": 1.5, "bytes": a.tobytes(), "torch": a.tolist()}[how]
    return _replaced(arguments, path, value)


def spoil_none(data, arguments):
    paths = [p for p, _ in trees.leaves_with_path(arguments) if p[:2] != ("stack", "layers")]
    return _replaced(arguments, data.draw(st.sampled_from(paths)), None)


def spoil_nan(data, arguments):
    path, a = _pick_array(data, arguments)
    if a.dtype.kind != "f":
        return arguments
    return _replaced(arguments, path, np.full_like(a, np.nan))


def spoil_lengths(data, arguments, name):
    valid = VALID[name]
    rows, steps = valid["x"].shape[:2][::-1 if not valid.get("batch_first") else 1]
    lengths = data.draw(st.sampled_from([
        np.full(rows, -1), np.full(rows, steps + 1), np.zeros(rows + 1, np.int64),
        np.full(rows, 1.0), [1.5] * rows, np.ones((rows, 1), np.int64), [True] * rows,
        np.full(rows, 2**62), [2**70] * rows, np.zeros(rows, np.uint8), 3, "3"]))
    return {**arguments, "seq_len": lengths}


BAD_VALUES = [True, False, None, 0, -1.0, 0.5, np.nan, np.inf, 1e300, 2**80, "nope", "relu",
              "raw", "exact", [1], np.float32(2.0), np.array([1.0, 2.0]), object()]


def spoil_setting(data, arguments, function):
    """A keyword (not an array argument) set to a wrong or contradicting value."""
    names = [n for n, p in inspect.signature(function).parameters.items()
             if p.kind is p.KEYWORD_ONLY and not n.startswith("d_")]
    name = data.draw(st.sampled_from(names))
    return {**arguments, name: data.draw(st.sampled_from(BAD_VALUES))}


def spoil_weights(data, arguments):
    """A stack's list of weight sets changed: one dropped, added, swapped, of another
    cell, or not a list."""
    if not isinstance(arguments["weights"], list) or not arguments["weights"]:
        return arguments
    weights = list(arguments["weights"])
    kinds = [SPECS[cell].cell.weights for cell in CELLS]      # the next cell's weight set
    other = kinds[(kinds.index(type(weights[0])) + 1) % len(kinds)]
    arrays = [a for a in weights[0] if isinstance(a, np.ndarray)]
    changes = {
        "drop": weights[:-1], "add": [*weights, weights[-1]], "swap": weights[::-1],
        "other": [other(*(arrays[k % len(arrays)] for k in range(len(other._fields)))),
                  *weights[1:]],
        "one": weights[0], "tuple": tuple(weights), "empty": []}
    return {**arguments, "weights": changes[data.draw(st.sampled_from(sorted(changes)))]}


def spoil_result(data, arguments, name):
    """A gradient's forward result as a plain tuple (no record), cut short, another op's,
    or another object."""
    key = next(k for k in ("state", "seq", "stack") if k in arguments)
    result = arguments[key]
    if not isinstance(result, tuple) or not result:
        return arguments
    other = valid_call(data.draw(st.sampled_from([n for n in FUNCTIONS if n.endswith("_grad")
                                                  and n != name])))
    other_result = next(other[k] for k in ("state", "seq", "stack") if k in other)
    value = data.draw(st.sampled_from([tuple(result), tuple(result)[:-1], other_result,
                                       result[-1], "result"]))
    return {**arguments, key: value}


def spoil_tangents(data, arguments, name):
    """A JVP's tangents: the gradient type with a wrong entry, too short, or no tuple."""
    base = name.removesuffix("_jvp").removesuffix("_grad")
    kind = OPS[base].grads if base in OPS else SPECS[base.removesuffix("_stack")].stack.grads
    zero, x = kind(*(None for _ in kind._fields)), VALID[name]["x"]
    value = data.draw(st.sampled_from([zero._replace(x=np.ones((*x.shape, 1))),
                                       zero._replace(x=x.astype(np.float32)),
                                       zero._replace(x=[1.0]), (None,), "zero", np.ones(3)]))
    return {**arguments, "tangents": value}


def _spoilers(name, arguments):
    function = getattr(gc, name)
    spoilers = [spoil_shape, spoil_dtype, spoil_library, spoil_none, spoil_nan,
                lambda data, a: spoil_setting(data, a, function)]
    if "seq_len" in arguments or "seq_len" in inspect.signature(function).parameters:
        spoilers.append(lambda data, a: spoil_lengths(data, a, name))
    if "weights" in arguments:
        spoilers.append(spoil_weights)
    if name.endswith(("_grad", "_grad_jvp")):
        spoilers.append(lambda data, a: spoil_result(data, a, name))
    if name.endswith("_jvp"):
        spoilers.append(lambda data, a: spoil_tangents(data, a, name))
    return spoilers


# --------------------------------------------------------------------------------------
# The call and its checks


def _same(before, after):
    """Whether every leaf of ``after`` equals ``before``'s (arrays by dtype, shape and
    values, numbers and strings by value, NaN equal to NaN; ``before`` is a deep copy)."""
    if type(before) is not type(after):
        return False
    if trees.is_node(before):
        pairs = zip(trees.children(before), trees.children(after), strict=False)
        return (len(trees.children(before)) == len(trees.children(after))
                and all(_same(b, a) for (_, b), (_, a) in pairs))
    if hasattr(before, "numpy") and not isinstance(before, np.ndarray):  # a tensor
        before, after = before.numpy(), after.numpy()
    if isinstance(before, np.ndarray):
        return (before.dtype == after.dtype and before.shape == after.shape
                and (before.dtype == object or np.array_equal(before, after, equal_nan=True)))
    if isinstance(before, (int, float, str, bytes, np.generic)):
        return before == after or (before != before and after != after)  # NaN
    return True                                 # an object: the copy is another one


def checked_call(name, arguments):
    """``gc.<name>(**arguments)``: it succeeds or raises TypeError or ValueError, and it
    changes no argument; counted in ``CALLS``."""
    kept = copy.deepcopy(arguments)
    CALLS["calls"] += 1
    try:
        getattr(gc, name)(**arguments)
        CALLS["succeeded"] += 1
    except (TypeError, ValueError) as error:
        CALLS["TypeError" if isinstance(error, TypeError) else "ValueError"] += 1
    except BaseException:
        CALLS["other"] += 1
        raise
    assert _same(kept, arguments), f"{name} changed its arguments"


@pytest.mark.parametrize("name", FUNCTIONS)
@given(data=st.data())
def test_malformed_arguments_raise_type_or_value_errors_and_change_nothing(name, data):
    arguments = valid_call(name)
    spoilers = _spoilers(name, arguments)
    for _ in range(data.draw(st.integers(1, 2), label="changes")):
        arguments = data.draw(st.sampled_from(spoilers))(data, arguments)
    checked_call(name, arguments)


def spoil_layers(data, arguments):
    """A stack's result with one layer's outputs replaced by a list (a rebuilt result)."""
    stack = arguments["stack"]
    k = data.draw(st.integers(0, len(stack.layers) - 1))
    return _replaced(arguments, ("stack", "layers", k, "h"), stack.layers[k].h.tolist())


@pytest.mark.parametrize("name", [n for n in FUNCTIONS if n.endswith("_stack_grad")])
@given(data=st.data())
def test_a_stack_gradients_spoiled_weight_sets_raise_type_or_value_errors(name, data):
    spoil = data.draw(st.sampled_from([spoil_weights, spoil_layers]))
    checked_call(name, spoil(data, valid_call(name)))


def test_the_calls_reached_their_floor(record_property):
    """Run last in this module: the number of calls, reported in the terminal summary at the
    end of the session (``summary`` properties: tests/conftest.py prints them, from xdist's
    workers too)."""
    record_property("summary", (
        f"gradcells fuzz: {CALLS['calls']} calls of {len(FUNCTIONS)} public functions: "
        f"{CALLS['succeeded']} succeeded, {CALLS['TypeError']} TypeError, "
        f"{CALLS['ValueError']} ValueError, {CALLS['other']} other"))
    assert CALLS["calls"] >= FLOOR, CALLS
