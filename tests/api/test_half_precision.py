"""NumPy float16 through the public functions (docs/spec.md §16.4): computed in float32,
returned in float16.

Every public function of every registered cell (step, sequence, stack; forward, gradient,
forward mode, second order) given float16 arrays returns exactly what the float32 call on
the same values (float16 widens exactly) returns, rounded to float16, and records the same
settings. A gradient's saved result is the float16 one its forward returned, so its float32
counterpart is called with that result widened. A float16 call with one float array of
another dtype is refused, naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
from contract_cases import PublicCalls, fixed_case, tangents, upstream

import gradcells as gc
from gradcells._core import trees
from gradcells.cells import OPS
from gradcells.testing import stack_case

HALF, SINGLE = np.float16, np.float32


def _as(value, dtype):
    """Every float array inside ``value`` (dicts, tuples, NamedTuples, a result keeping its
    recorded settings) in ``dtype``."""
    return trees.map_leaves(
        lambda a: a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a,
        value)


def _assert_rounded(half, single):
    """``half`` is ``single`` rounded to float16, array by array, None where None."""
    if isinstance(single, np.ndarray):
        assert half.dtype == HALF, half.dtype
        np.testing.assert_array_equal(half, single.astype(HALF))
    elif isinstance(single, (tuple, list)):
        assert len(half) == len(single)
        for h, s in zip(half, single, strict=True):
            _assert_rounded(h, s)
    else:
        assert half is single or half == single


def _case(op, rng):
    options = {"ragged": True, "reverse": True} if OPS[op].sequence else {}
    case = fixed_case(op, rng, steps=3, batch=2, input_size=3, hidden=4, **options)
    return _as(_as(case, SINGLE), HALF)          # values float16 can hold exactly


@pytest.mark.parametrize("op", list(OPS))
def test_every_mode_of_every_op_is_the_float32_call_rounded(op):
    rng = np.random.default_rng(7)
    case = _case(op, rng)
    calls = PublicCalls("cpu")
    single = _as(case, SINGLE)
    result, result32 = calls.forward(op, case), calls.forward(op, single)
    _assert_rounded(result, result32)
    assert result.settings.seq_len is None or np.array_equal(result.settings.seq_len,
                                                             result32.settings.seq_len)
    saved = _as(result, SINGLE)
    ups = _as(upstream(op, result32, rng), HALF)
    _assert_rounded(calls.grad(op, case, result, **ups),
                    calls.grad(op, single, saved, **_as(ups, SINGLE)))
    t = _as(tangents(op, single, rng), HALF)
    _assert_rounded(calls.jvp(op, case, t), calls.jvp(op, single, _as(t, SINGLE)))
    ups_t = {**ups, **{f"{k}_tangent": v for k, v in ups.items()}}
    _assert_rounded(calls.grad_jvp(op, case, result, t, **ups_t),
                    calls.grad_jvp(op, single, saved, _as(t, SINGLE), **_as(ups_t, SINGLE)))


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_a_stack_and_its_gradient_are_the_float32_calls_rounded(cell):
    rng = np.random.default_rng(3)
    case = _as(_as(stack_case(rng, cell, batch=2, steps=3, hidden=4), SINGLE), HALF)
    forward, grad = getattr(gc, f"{cell}_stack"), getattr(gc, f"{cell}_stack_grad")
    stack, stack32 = forward(**case), forward(**_as(case, SINGLE))
    _assert_rounded(stack, stack32)
    args = {k: case[k] for k in ("x", *OPS[f"{cell}_sequence"].states, "weights")}
    d_h = rng.standard_normal(stack32.h.shape).astype(HALF)
    _assert_rounded(grad(**args, stack=stack, d_h=d_h),
                    grad(**_as(args, SINGLE), stack=_as(stack, SINGLE), d_h=d_h.astype(SINGLE)))


def test_a_float16_call_names_the_array_of_another_dtype():
    x, h = np.zeros((2, 3), HALF), np.zeros((2, 4), HALF)
    with pytest.raises(TypeError, match=r"^w must have the same dtype as x \(float16\), "
                                        r"got float32$"):
        gc.rnn_cell(x, h, np.zeros((7, 4), SINGLE), np.zeros(4, HALF))
    with pytest.raises(TypeError, match=r"^w must have the same dtype as x \(float32\), "
                                        r"got float16$"):
        gc.rnn_cell(x.astype(SINGLE), h.astype(SINGLE), np.zeros((7, 4), HALF),
                    np.zeros(4, SINGLE))


def test_float16_inputs_are_not_modified():
    rng = np.random.default_rng(1)
    case = _case("lstm_sequence", rng)
    before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
    PublicCalls("cpu").forward("lstm_sequence", case)
    for k, v in before.items():
        np.testing.assert_array_equal(case[k], v)
        assert case[k].dtype == v.dtype
