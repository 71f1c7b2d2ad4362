"""Pure functions (docs/spec.md §1, §7): inputs never modified, results never alias inputs, memory
order irrelevant, extreme pre-activations finite and warning-free."""

import warnings

import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from hypothesis import given

import gradcells as gc
from gradcells._core.specs import PEEPHOLES
from gradcells.testing import (
    gru_cell_inputs,
    gru_sequence_case,
    lstm_cell_case,
    lstm_cell_inputs,
    lstm_sequence_case,
)

LSTM_ARGS = ("x", "cs_prev", "h_prev", "w", "b")
GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")


def run_lstm(case, backend, clip_grad="exact"):
    args = [case[k] for k in LSTM_ARGS]
    peeps = {k: case[k] for k in PEEPHOLES}
    attrs = {"cell_clip": case["cell_clip"]}
    state = gc.lstm_cell(*args, **peeps, **attrs, forget_bias=case["forget_bias"],
                         backend=backend)
    grads = gc.lstm_cell_grad(*args, state, d_h=case["d_h"], d_cs=case["d_cs"], **peeps,
                              **attrs, clip_grad=clip_grad, backend=backend)
    return state, grads


def run_gru(case, backend):
    args = [case[k] for k in GRU_ARGS]
    state = gc.gru_cell(*args, reset_after=case["reset_after"], backend=backend)
    grads = gc.gru_cell_grad(*args, state, d_h=case["d_h"], reset_after=case["reset_after"],
                             backend=backend)
    return state, grads


def with_upstream(case, seed, lstm=True):
    rng = np.random.default_rng(seed)
    shape = case["h_prev"].shape
    dtype = case["x"].dtype
    case = dict(case, d_h=rng.standard_normal(shape).astype(dtype))
    if lstm:
        case["d_cs"] = rng.standard_normal(shape).astype(dtype)
    return case


def arrays_of(case):
    return {k: v for k, v in case.items() if isinstance(v, np.ndarray)}


def assert_pure(case, results):
    before = {k: v.copy() for k, v in arrays_of(case).items()}
    outputs = [a for result in results() for a in result if a is not None]
    for k, v in arrays_of(case).items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} was modified")
        for out in outputs:
            assert not np.shares_memory(out, v), f"a result aliases input {k}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@given(case=lstm_cell_inputs(min_size=0))
def test_lstm_never_modifies_inputs(backend, case):
    case = with_upstream(case, 0)
    assert_pure(case, lambda: run_lstm(case, backend))
    assert_pure(case, lambda: run_lstm(case, backend, "straight_through"))


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@given(case=gru_cell_inputs(min_size=0))
def test_gru_never_modifies_inputs(backend, case):
    case = with_upstream(case, 1, lstm=False)
    assert_pure(case, lambda: run_gru(case, backend))


def reordered(case, how):
    """The same values in another memory layout: Fortran order, or strided views."""
    out = dict(case)
    for k, v in arrays_of(case).items():
        if how == "fortran":
            out[k] = np.asfortranarray(v)
        else:
            padded = np.zeros(tuple(2 * n for n in v.shape), dtype=v.dtype)
            padded[tuple(slice(None, None, 2) for _ in v.shape)] = v
            out[k] = padded[tuple(slice(None, None, 2) for _ in v.shape)]
            assert v.size <= 1 or not out[k].flags.c_contiguous
    return out


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("how", ["fortran", "strided"])
@given(case=lstm_cell_inputs())
def test_lstm_memory_layout_does_not_matter(backend, how, case):
    case = with_upstream(case, 2)
    expected = run_lstm(case, backend)
    actual = run_lstm(reordered(case, how), backend)
    for want, got in zip(expected, actual, strict=True):
        for a, b in zip(want, got, strict=True):
            if a is not None:
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("how", ["fortran", "strided"])
@given(case=gru_cell_inputs())
def test_gru_memory_layout_does_not_matter(backend, how, case):
    case = with_upstream(case, 3, lstm=False)
    expected = run_gru(case, backend)
    actual = run_gru(reordered(case, how), backend)
    for want, got in zip(expected, actual, strict=True):
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("magnitude", [1e2, 1e4])
def test_extreme_preactivations_are_finite_and_silent(backend, dtype, magnitude):
    """Pre-activations of either sign up to |z| = 1e4: no overflow, no NaN, no warning."""
    rng = np.random.default_rng(4)
    case = lstm_cell_case(rng, batch=4, input_size=3, hidden=6, dtype=dtype, peephole=True)
    case["b"] = (magnitude * np.sign(rng.standard_normal(case["b"].shape))).astype(dtype)
    case["x"] = (magnitude * case["x"]).astype(dtype)
    case = with_upstream(case, 5)
    gcases = [{k: v.astype(dtype) if isinstance(v, np.ndarray) else v for k, v in
               with_upstream({"x": case["x"], "h_prev": case["h_prev"],
                              "w_ru": rng.standard_normal((9, 12)),
                              "w_c": rng.standard_normal((9, 6)),
                              "b_ru": magnitude * np.sign(rng.standard_normal(12)),
                              "b_c": magnitude * np.sign(rng.standard_normal(width)),
                              "reset_after": width == 12}, 6, lstm=False).items()}
              for width in (6, 12)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            results = [*run_lstm(case, backend), *(r for g in gcases for r in run_gru(g, backend))]
    for result in results:
        for a in result:
            if a is not None:
                assert np.all(np.isfinite(a))


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_extreme_preactivations_in_sequences_are_finite_and_silent(backend, dtype):
    """The same over time, ragged rows, both GRU variants: forward and BPTT at |z| ~ 1e4."""
    rng = np.random.default_rng(8)
    lengths = np.array([5, 0, 3])
    lstm = {k: v.astype(dtype) if isinstance(v, np.ndarray) and k != "seq_len" else v
            for k, v in lstm_sequence_case(rng, steps=5, batch=3, input_size=2, hidden=4,
                                           peephole=True, clip=True).items()}
    lstm["x"], lstm["b"] = 1e4 * lstm["x"], 1e4 * np.sign(lstm["b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            args = [lstm[k] for k in ("x", "cs0", "h0", "w", "b")]
            peeps = {k: lstm[k] for k in PEEPHOLES}
            seq = gc.lstm_sequence(*args, **peeps, cell_clip=lstm["cell_clip"], seq_len=lengths,
                                   backend=backend)
            results = [seq, gc.lstm_sequence_grad(*args, seq, d_h=np.ones_like(seq.h), **peeps,
                                                  cell_clip=lstm["cell_clip"], seq_len=lengths,
                                                  backend=backend)]
            for reset_after in (False, True):
                gru = gru_sequence_case(rng, steps=5, batch=3, input_size=2, hidden=4,
                                        reset_after=reset_after)
                gargs = [gru[k].astype(dtype) for k in ("x", "h0", "w_ru", "w_c", "b_ru", "b_c")]
                gargs[0], gargs[4], gargs[5] = (1e4 * gargs[0], 1e4 * np.sign(gargs[4]),
                                                1e4 * np.sign(gargs[5]))
                gseq = gc.gru_sequence(*gargs, reset_after=reset_after, seq_len=lengths,
                                       backend=backend)
                results += [gseq, gc.gru_sequence_grad(*gargs, gseq, d_h=np.ones_like(gseq.h),
                                                       reset_after=reset_after, seq_len=lengths,
                                                       backend=backend)]
    for result in results:
        for a in result:
            assert a is None or (a.dtype == dtype and np.all(np.isfinite(a)))
