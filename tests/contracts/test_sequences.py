"""Sequences (docs/spec.md §4): results equal a Python loop over the cell API, per-example lengths
follow PyTorch's packed semantics, empty sizes are valid, inputs are never modified, float32
tracks float64, the CPU backend agrees with the reference, and bad input is rejected."""


import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import (
    gru_sequence_case,
    gru_sequence_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    unrolled,
)

LSTM_ARGS = ("x", "cs0", "h0", "w", "b")
GRU_ARGS = ("x", "h0", "w_ru", "w_c", "b_ru", "b_c")
STEP_FIELDS = ("i", "cs", "f", "o", "ci", "co", "h")


def lengths_of(case):
    steps, batch = case["x"].shape[:2]
    return np.full(batch, steps) if case["seq_len"] is None else case["seq_len"]


def upstream(case, seed, lstm=True, present=("h", "cs", "h_final", "cs_final")):
    """Random upstream gradients for the outputs in ``present`` (others None)."""
    rng = np.random.default_rng(seed)
    steps, batch = case["x"].shape[:2]
    hidden = case["h0"].shape[1]
    dtype = case["x"].dtype
    names = ("h", "cs", "h_final", "cs_final") if lstm else ("h", "h_final")
    shapes = {"h": (steps, batch, hidden), "cs": (steps, batch, hidden),
              "h_final": (batch, hidden), "cs_final": (batch, hidden)}
    return {f"d_{k}": rng.standard_normal(shapes[k]).astype(dtype) if k in present else None
            for k in names}


# -- the sequence ops through the public API ----------------------------------------------


def run_lstm(case, backend, d=None, clip_grad="exact"):
    args = [case[k] for k in LSTM_ARGS]
    peeps = {k: case[k] for k in PEEPHOLES}
    seq = gc.lstm_sequence(*args, **peeps, forget_bias=case["forget_bias"],
                           cell_clip=case["cell_clip"], seq_len=case["seq_len"],
                           backend=backend)
    if d is None:
        return seq, None
    grads = gc.lstm_sequence_grad(*args, seq, **d, **peeps, cell_clip=case["cell_clip"],
                                  clip_grad=clip_grad, seq_len=case["seq_len"],
                                  backend=backend)
    return seq, grads


def run_gru(case, backend, d=None):
    args = [case[k] for k in GRU_ARGS]
    attrs = {"reset_after": case["reset_after"], "seq_len": case["seq_len"]}
    seq = gc.gru_sequence(*args, **attrs, backend=backend)
    if d is None:
        return seq, None
    return seq, gc.gru_sequence_grad(*args, seq, **d, **attrs, backend=backend)


# -- the same computations as Python loops over the cell API ---------------------------------


def loop_lstm(case, backend, d, clip_grad="exact"):
    """Forward and BPTT step by step with ``lstm_cell`` / ``lstm_cell_grad``; a stopped row
    keeps its state and passes its state gradient through (``gradcells.testing.unrolled``)."""
    run = unrolled.lstm_forward(*[case[k] for k in LSTM_ARGS],
                                **{k: case[k] for k in PEEPHOLES},
                                forget_bias=case["forget_bias"], cell_clip=case["cell_clip"],
                                seq_len=case["seq_len"], backend=backend)
    grads = unrolled.lstm_backprop(run, **d, clip_grad=clip_grad)
    return run.outputs, grads


def loop_gru(case, backend, d):
    """Forward and BPTT step by step with ``gru_cell`` / ``gru_cell_grad``
    (``gradcells.testing.unrolled``)."""
    run = unrolled.gru_forward(*[case[k] for k in GRU_ARGS], reset_after=case["reset_after"],
                               seq_len=case["seq_len"], backend=backend)
    return run.outputs, unrolled.gru_backprop(run, **d)


def assert_matches(result, expected, rtol=1e-13, atol=1e-14):
    for name, value in expected.items():
        got = getattr(result, name)
        assert got.shape == value.shape, name
        np.testing.assert_allclose(got, value, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@settings(max_examples=15)
@given(case=lstm_sequence_inputs(), clip_grad=st.sampled_from(["exact", "straight_through"]),
       seed=st.integers(0, 99))
def test_lstm_sequence_equals_cell_loop(backend, case, clip_grad, seed):
    d = upstream(case, seed)
    seq, grads = run_lstm(case, backend, d, clip_grad)
    forward, expected = loop_lstm(case, backend, d, clip_grad)
    assert_matches(seq, forward)
    assert_matches(grads, expected)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@settings(max_examples=15)
@given(case=gru_sequence_inputs(), seed=st.integers(0, 99))
def test_gru_sequence_equals_cell_loop(backend, case, seed):
    d = upstream(case, seed, lstm=False)
    seq, grads = run_gru(case, backend, d)
    forward, expected = loop_gru(case, backend, d)
    assert_matches(seq, forward)
    assert_matches(grads, expected)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("present", [(), ("h",), ("cs",), ("h_final",), ("cs_final",)])
def test_lstm_each_upstream_alone(backend, present):
    """Each upstream gradient on its own (the rest None), with ragged lengths and peepholes."""
    case = lstm_sequence_case(np.random.default_rng(3), steps=4, batch=4, peephole=True,
                              ragged=True)
    d = upstream(case, 5, present=present)
    _, grads = run_lstm(case, backend, d)
    _, expected = loop_lstm(case, backend, d)
    assert_matches(grads, expected)
    if not present:
        assert all(not np.any(g) for g in grads)


# -- packed-sequence semantics -------------------------------------------------------------


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_lstm_rows_stop_at_their_length(backend):
    case = lstm_sequence_case(np.random.default_rng(11), steps=5, batch=4, peephole=True,
                              ragged=True)
    case["seq_len"] = np.array([5, 0, 2, 4])
    seq, _ = run_lstm(case, backend)
    full, _ = run_lstm({**case, "seq_len": None}, backend)
    for row, length in enumerate(case["seq_len"]):
        for k in STEP_FIELDS:
            # Valid steps equal the unmasked run (the first steps of a row do not depend on
            # its length); steps past the length are exactly zero.
            np.testing.assert_allclose(getattr(seq, k)[:length, row],
                                       getattr(full, k)[:length, row], rtol=1e-14)
            assert not np.any(getattr(seq, k)[length:, row])
        last_cs = case["cs0"][row] if length == 0 else full.cs[length - 1, row]
        last_h = case["h0"][row] if length == 0 else full.h[length - 1, row]
        np.testing.assert_array_equal(seq.cs_final[row], last_cs)
        np.testing.assert_array_equal(seq.h_final[row], last_h)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_gru_rows_stop_at_their_length(backend):
    case = gru_sequence_case(np.random.default_rng(12), steps=5, batch=3, reset_after=True)
    case["seq_len"] = np.array([0, 3, 5], dtype=np.int32)
    seq, _ = run_gru(case, backend)
    full, _ = run_gru({**case, "seq_len": None}, backend)
    for row, length in enumerate(case["seq_len"]):
        for k in ("r", "u", "c", "h"):
            np.testing.assert_allclose(getattr(seq, k)[:length, row],
                                       getattr(full, k)[:length, row], rtol=1e-14)
            assert not np.any(getattr(seq, k)[length:, row])
        last = case["h0"][row] if length == 0 else full.h[length - 1, row]
        np.testing.assert_array_equal(seq.h_final[row], last)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_full_lengths_equal_no_lengths(backend):
    case = lstm_sequence_case(np.random.default_rng(13), steps=3, batch=2)
    d = upstream(case, 1)
    with_lengths = run_lstm({**case, "seq_len": np.array([3, 3], dtype=np.uint8)}, backend, d)
    without = run_lstm(case, backend, d)
    for a, b in zip(with_lengths, without, strict=True):
        for u, v in zip(a, b, strict=True):
            if u is not None:
                np.testing.assert_array_equal(u, v)


def _padded(a, lengths, values):
    """A copy of per-step ``a [T, B, ·]`` with the steps past each row's length set to
    ``values`` cycled (NaN, inf, ...)."""
    out = a.copy()
    for row, length in enumerate(lengths):
        pad = out[length:, row]
        pad[...] = np.resize(np.array(values, dtype=a.dtype), pad.shape)
    return out


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("cell", ["lstm", "gru", "gru-reset-after"])
def test_padding_past_the_lengths_is_never_read(backend, cell):
    """NaN and inf past each row's length, in x and in the upstream gradients, give exactly
    the results of zero padding (PyTorch's packed sequences never read it either)."""
    rng = np.random.default_rng(14)
    if cell == "lstm":
        case = lstm_sequence_case(rng, steps=4, batch=4, peephole=True, ragged=True)
        run, present = run_lstm, ("h", "cs", "h_final", "cs_final")
    else:
        case = gru_sequence_case(rng, steps=4, batch=4, reset_after=cell.endswith("after"),
                                 ragged=True)
        run, present = run_gru, ("h", "h_final")
    case["seq_len"] = np.array([4, 0, 1, 3])
    lengths = case["seq_len"]
    d = upstream(case, 2, lstm=cell == "lstm", present=present)
    zero = {**case, "x": _padded(case["x"], lengths, [0.0])}
    poisoned = {**case, "x": _padded(case["x"], lengths, [np.nan, np.inf, -np.inf])}
    d_poisoned = {k: v if v is None or v.ndim == 2 else _padded(v, lengths, [np.nan, np.inf])
                  for k, v in d.items()}
    expected, actual = run(zero, backend, d), run(poisoned, backend, d_poisoned)
    for want, got in zip(expected, actual, strict=True):
        for field, u, v in zip(want._fields, want, got, strict=True):
            if u is not None:
                np.testing.assert_array_equal(v, u, err_msg=field)


# -- empty sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize(("steps", "batch", "input_size"),
                         [(0, 3, 2), (3, 0, 2), (3, 2, 0), (0, 0, 0)])
def test_lstm_empty_sizes(backend, steps, batch, input_size):
    case = lstm_sequence_case(np.random.default_rng(0), steps=steps, batch=batch,
                              input_size=input_size, hidden=3, peephole=True)
    case["seq_len"] = np.full(batch, steps, dtype=np.int64)
    d = upstream(case, 2)
    seq, grads = run_lstm(case, backend, d)
    forward, expected = loop_lstm(case, backend, d)
    assert_matches(seq, forward)
    assert_matches(grads, expected)
    if steps == 0:
        np.testing.assert_array_equal(seq.cs_final, case["cs0"])
        np.testing.assert_array_equal(grads.h0, d["d_h_final"])
        np.testing.assert_array_equal(grads.cs0, d["d_cs_final"])
        assert not np.any(grads.w) and not np.any(grads.b) and not np.any(grads.wci)
    assert grads.x.shape == (steps, batch, input_size)
    assert grads.w.shape == case["w"].shape
    assert_fresh((*seq, *grads), all_inputs(case, d))


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("reset_after", [False, True])
@pytest.mark.parametrize(("steps", "batch", "input_size"), [(0, 3, 2), (3, 0, 2), (3, 2, 0)])
def test_gru_empty_sizes(backend, reset_after, steps, batch, input_size):
    case = gru_sequence_case(np.random.default_rng(0), steps=steps, batch=batch,
                             input_size=input_size, hidden=3, reset_after=reset_after)
    d = upstream(case, 2, lstm=False)
    seq, grads = run_gru(case, backend, d)
    forward, expected = loop_gru(case, backend, d)
    assert_matches(seq, forward)
    assert_matches(grads, expected)
    assert grads.b_c.shape == case["b_c"].shape
    assert_fresh((*seq, *grads), all_inputs(case, d))


# -- purity, memory order, dtypes --------------------------------------------------------------


def all_inputs(case, d):
    return {k: v for k, v in {**case, **d}.items() if isinstance(v, np.ndarray)}


def assert_fresh(outputs, inputs):
    """No output shares memory with an input or another output (with T = 0 the final state
    is the initial one's value, and its gradient the final-state gradient's: still copies)."""
    outputs = [a for a in outputs if a is not None]
    for k, out in enumerate(outputs):
        for name, v in inputs.items():
            assert not np.shares_memory(out, v), f"output {k} shares memory with {name}"
        for other in outputs[k + 1:]:
            assert not np.shares_memory(out, other), f"output {k} shares memory with another"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_lstm_pure_and_order_independent(backend):
    case = lstm_sequence_case(np.random.default_rng(21), steps=4, batch=3, peephole=True,
                              ragged=True, clip=True)
    d = upstream(case, 3)
    before = {k: v.copy() for k, v in all_inputs(case, d).items()}
    seq, grads = run_lstm(case, backend, d)
    for k, v in all_inputs(case, d).items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} was modified")
        for out in (*seq, *grads):
            assert out is None or not np.shares_memory(out, v)
    assert not np.shares_memory(seq.cs_final, seq.h_final)
    assert not np.shares_memory(grads.cs0, grads.h0)

    # Fortran-ordered and strided inputs give the same results.
    def odd_layout(a, k):
        if a.ndim == 1:
            return np.repeat(a, 2)[::2]
        return np.asfortranarray(a) if k % 2 else np.swapaxes(np.swapaxes(a, 0, 1).copy(), 0, 1)

    odd = {**case}
    odd_d = {**d}
    for k, (name, v) in enumerate(all_inputs(case, d).items()):
        if name != "seq_len":
            (odd if name in case else odd_d)[name] = odd_layout(v, k)
    seq2, grads2 = run_lstm(odd, backend, odd_d)
    for a, b in zip((*seq, *grads), (*seq2, *grads2), strict=True):
        if backend == "cpu" or a is None:
            np.testing.assert_array_equal(a, b)
        else:       # NumPy's matmul hands BLAS a Fortran-ordered w as a transposed operand,
            # and OpenBLAS's kernels (SkylakeX's) may then round x's gradient otherwise
            eps = np.finfo(a.dtype).eps
            np.testing.assert_allclose(a, b, rtol=0, atol=64 * eps * np.abs(a).max())


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_gru_pure(backend):
    case = gru_sequence_case(np.random.default_rng(22), steps=3, batch=3, reset_after=False,
                             ragged=True)
    d = upstream(case, 3, lstm=False)
    before = {k: v.copy() for k, v in all_inputs(case, d).items()}
    seq, grads = run_gru(case, backend, d)
    for k, v in all_inputs(case, d).items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} was modified")
        for out in (*seq, *grads):
            assert not np.shares_memory(out, v)


def as_dtype(case, dtype):
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("seed", range(3))
def test_lstm_float32_tracks_float64(backend, seed):
    case = lstm_sequence_case(np.random.default_rng(seed), steps=6, batch=4, input_size=5,
                              hidden=6, peephole=True, clip=True, ragged=True)
    d = upstream(case, seed)
    seq64, grads64 = run_lstm(case, backend, d)
    seq32, grads32 = run_lstm(as_dtype(case, np.float32), backend, as_dtype(d, np.float32))
    for g in (grads32, grads64):  # no projection and no layer norm here
        assert g.w_proj is None and g.layer_norm is None
    for a32, a64 in zip((*seq32, *grads32[:-2]), (*seq64, *grads64[:-2]), strict=True):
        assert a32.dtype == np.float32
        np.testing.assert_allclose(a32, a64, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("reset_after", [False, True])
def test_gru_float32_tracks_float64(backend, reset_after):
    case = gru_sequence_case(np.random.default_rng(4), steps=6, batch=4, input_size=5,
                             hidden=6, reset_after=reset_after, ragged=True)
    d = upstream(case, 4, lstm=False)
    seq64, grads64 = run_gru(case, backend, d)
    seq32, grads32 = run_gru(as_dtype(case, np.float32), backend, as_dtype(d, np.float32))
    for a32, a64 in zip((*seq32, *grads32), (*seq64, *grads64), strict=True):
        assert a32.dtype == np.float32
        np.testing.assert_allclose(a32, a64, rtol=2e-4, atol=2e-5)


# -- the CPU backend against the reference ----------------------------------------------------

needs_cpu = pytest.mark.skipif("cpu" not in NUMPY_BACKENDS, reason="CPU backend not built")


def assert_cpu_agrees(dtype, run, case, d, **kwargs):
    """The CPU backend against the reference on the same inputs, every field: float64 within
    1e-12; float32 within rtol 1e-4, atol 1e-5, of which the worst of 800 random cases at up
    to (T, B, I, H) = (8, 6, 6, 8) used a fifth (a row sum). A bound scaled by the float32
    reference's own error, as the cell tests use, does not hold here: errors carried over
    the steps and sums over T·B rows in another order exceeded it in 4 of those cases."""
    case, d = as_dtype(case, dtype), as_dtype(d, dtype)
    tol = {"rtol": 1e-12, "atol": 1e-13} if dtype == np.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for result, expected in zip(run(case, "cpu", d, **kwargs), run(case, "reference", d, **kwargs),
                                strict=True):
        for name, a, b in zip(result._fields, result, expected, strict=True):
            if b is None:
                assert a is None, name
                continue
            assert a.dtype == b.dtype and a.shape == b.shape, name
            np.testing.assert_allclose(a, b, **tol, err_msg=name)


# Non-empty sizes (the empty ones have their own tests above), so that every example runs.
@needs_cpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=15)
@given(case=lstm_sequence_inputs(min_size=1, max_steps=6), seed=st.integers(0, 99),
       clip_grad=st.sampled_from(["exact", "straight_through"]))
def test_lstm_cpu_agrees_with_reference(dtype, case, seed, clip_grad):
    assert_cpu_agrees(dtype, run_lstm, case, upstream(case, seed), clip_grad=clip_grad)


@needs_cpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=15)
@given(case=gru_sequence_inputs(min_size=1, max_steps=6), seed=st.integers(0, 99))
def test_gru_cpu_agrees_with_reference(dtype, case, seed):
    assert_cpu_agrees(dtype, run_gru, case, upstream(case, seed, lstm=False))


# -- bad input ---------------------------------------------------------------------------------


def lstm_call(**changes):
    case = lstm_sequence_case(np.random.default_rng(0), steps=4, batch=3, input_size=2,
                              hidden=3)
    case.update(changes)
    return lambda: run_lstm(case, None)


def lstm_grad_call(**changes):
    case = lstm_sequence_case(np.random.default_rng(0), steps=4, batch=3, input_size=2,
                              hidden=3)
    seq, _ = run_lstm(case, None)
    d = upstream(case, 0)
    args = [case[k] for k in LSTM_ARGS]
    kwargs = {**d, "seq_len": None}
    kwargs.update(changes)
    seq = kwargs.pop("seq", seq)
    return lambda: gc.lstm_sequence_grad(*args, seq, **kwargs)


def gru_call(**changes):
    case = gru_sequence_case(np.random.default_rng(0), steps=4, batch=3, input_size=2,
                             hidden=3)
    case.update(changes)
    return lambda: run_gru(case, None)


BAD_SEQ_LEN = [
    (np.array([4, 1]), ValueError, r"seq_len must have shape \[B\] = \(3,\), got \(2,\)"),
    (np.array([[4], [1], [0]]), ValueError,
     r"seq_len must have shape \[B\] = \(3,\), got \(3, 1\)"),
    (np.array([4, -1, 0]), ValueError, r"seq_len must hold lengths in \[0, T\] = \[0, 4\], got -1"),
    (np.array([4, 5, 0]), ValueError, r"seq_len must hold lengths in \[0, T\] = \[0, 4\], got 5"),
    (np.array([4.0, 1.0, 0.0]), TypeError, r"seq_len must have an integer dtype, got float64"),
    (np.array([True, True, False]), TypeError, r"seq_len must have an integer dtype, got bool"),
    # A list is taken as lengths (test_settings.py), but only a list of integers.
    ([4.0, 1.0, 0.0], TypeError, r"seq_len must hold integers, got \['float'\]"),
    ([4, 5, 0], ValueError, r"seq_len must hold lengths in \[0, T\] = \[0, 4\], got 5"),
    ("401", TypeError, r"seq_len must be a numpy integer array \[B\] \(or a list of integers\)"),
]


@pytest.mark.parametrize(("seq_len", "error", "pattern"), BAD_SEQ_LEN)
@pytest.mark.parametrize("call", [lstm_call, gru_call, lstm_grad_call])
def test_bad_seq_len_rejected(call, seq_len, error, pattern):
    with pytest.raises(error, match=pattern):
        call(seq_len=seq_len)()


@pytest.mark.parametrize("call", [lstm_call, gru_call])
@pytest.mark.parametrize("x", [np.zeros((3, 2)), np.zeros((4, 3, 2, 1))])
def test_x_must_be_rank_3(call, x):
    with pytest.raises(ValueError, match=r"x must be a 3-D array \[T, B, I\], got shape"):
        call(x=x)()


@pytest.mark.parametrize(("changes", "error", "pattern"), [
    ({"cs0": np.zeros((3, 3, 1))}, ValueError, r"cs0 must be a 2-D array \[B, H\]"),
    ({"h0": np.zeros((3, 4))}, ValueError, r"h0 must have shape \[B, H\] = \(3, 3\)"),
    ({"h0": np.zeros((2, 3))}, ValueError, r"h0 must have shape \[B, H\] = \(3, 3\)"),
    ({"w": np.zeros((6, 12))}, ValueError, r"w must have shape \[I\+H, 4H\] = \(5, 12\)"),
    ({"wci": np.zeros(3)}, ValueError, r"peepholes need all of wci, wcf and wco"),
    ({"h0": np.zeros((3, 3), np.float32)}, TypeError, r"h0 must have the same dtype as x"),
    ({"cell_clip": float("nan")}, ValueError, r"cell_clip must be finite"),
    ({"forget_bias": "1"}, TypeError, r"forget_bias must be a real number"),
])
def test_lstm_bad_arguments(changes, error, pattern):
    with pytest.raises(error, match=pattern):
        lstm_call(**changes)()


@pytest.mark.parametrize(("changes", "error", "pattern"), [
    ({"d_h": np.zeros((3, 3, 3))}, ValueError, r"d_h must have shape \[T, B, H\] = \(4, 3, 3\)"),
    ({"d_cs": np.zeros((4, 3))}, ValueError, r"d_cs must have shape \[T, B, H\] = \(4, 3, 3\)"),
    ({"d_h_final": np.zeros((4, 3, 3))}, ValueError, r"d_h_final must have shape \[B, H\]"),
    ({"d_cs_final": np.zeros((3, 4))}, ValueError, r"d_cs_final must have shape \[B, H\]"),
    ({"seq": (np.zeros((4, 3, 3)),) * 7}, TypeError, r"seq must be a tuple of 9 arrays"),
    ({"clip_grad": "none"}, ValueError, r"clip_grad must be one of"),
    ({"backend": "tpu"}, ValueError, r"backend must be None or one of"),
])
def test_lstm_grad_bad_arguments(changes, error, pattern):
    with pytest.raises(error, match=pattern):
        lstm_grad_call(**changes)()


def test_lstm_grad_bad_saved_state():
    case = lstm_sequence_case(np.random.default_rng(0), steps=4, batch=3, input_size=2,
                              hidden=3)
    seq, _ = run_lstm(case, None)
    seq = seq._replace(f=seq.f[:3])
    with pytest.raises(ValueError, match=r"seq.f must have shape \[T, B, H\] = \(4, 3, 3\)"):
        gc.lstm_sequence_grad(*[case[k] for k in LSTM_ARGS], seq)


@pytest.mark.parametrize(("changes", "error", "pattern"), [
    ({"b_c": np.zeros(6)}, ValueError, r"b_c has shape \[2H\] = \(6,\), the reset-after"),
    ({"reset_after": 1}, TypeError, r"reset_after must be a bool"),
    ({"w_ru": np.zeros((5, 6), np.float32)}, TypeError, r"w_ru must have the same dtype"),
])
def test_gru_bad_arguments(changes, error, pattern):
    with pytest.raises(error, match=pattern):
        gru_call(**changes)()


@pytest.mark.parametrize(("changes", "error", "pattern"), [
    ({"d_h": np.zeros((4, 3))}, ValueError, r"d_h must have shape \[T, B, H\] = \(4, 3, 3\)"),
    ({"d_h_final": np.zeros((1, 3))}, ValueError,
     r"d_h_final must have shape \[B, H\] = \(3, 3\), got \(1, 3\)"),
    ({"d_h_final": np.zeros(3)}, ValueError,
     r"d_h_final must have shape \[B, H\] = \(3, 3\), got \(3,\)"),
    ({"d_h_final": np.zeros((4, 3, 3))}, ValueError,
     r"d_h_final must have shape \[B, H\] = \(3, 3\), got \(4, 3, 3\)"),
    ({"d_h_final": np.zeros((3, 3), np.float32)}, TypeError,
     r"d_h_final must have the same dtype as x"),
    ({"backend": "tpu"}, ValueError, r"backend must be None or one of"),
])
def test_gru_grad_bad_upstream(changes, error, pattern):
    case = gru_sequence_case(np.random.default_rng(0), steps=4, batch=3, input_size=2,
                             hidden=3)
    seq, _ = run_gru(case, None)
    with pytest.raises(error, match=pattern):
        gc.gru_sequence_grad(*[case[k] for k in GRU_ARGS], seq, **changes)


def test_gru_grad_bad_arguments():
    case = gru_sequence_case(np.random.default_rng(0), steps=4, batch=3, input_size=2,
                             hidden=3)
    seq, _ = run_gru(case, None)
    args = [case[k] for k in GRU_ARGS]
    with pytest.raises(ValueError, match=r"seq.h_final must have shape \[B, H\] = \(3, 3\)"):
        gc.gru_sequence_grad(*args, seq._replace(h_final=seq.h))
    with pytest.raises(TypeError, match=r"seq must be a tuple of 5 arrays"):
        gc.gru_sequence_grad(*args, seq[:4])
