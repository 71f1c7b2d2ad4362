"""The GPU backend on a CUDA device (marker ``gpu``; the module is skipped without CuPy or a
device). ``benchmarks/gpu_check.sh`` runs it on a GPU machine.

- Dispatch: CuPy arrays go to the GPU backend (``gradcells.cells.<cell>.gpu``, with
  ``backend=None``), results are CuPy arrays.
- Agreement, every op (LSTM, GRU, plain RNN), forward and backward, float64 and float32
  (Hypothesis cases moved to CuPy): the GPU backend against the reference backend run on
  CuPy in float64 on the same (rounded) inputs, max |gpu - reference| <= 16 eps(dtype)
  (1 + max |reference|) per output, the tolerance the host emulation of the same kernels
  meets with 5x to spare.
- float16 (CuPy only; float32 arithmetic inside): the same comparison, 16 eps(float16) =
  1.6e-2 relative to the output's largest magnitude.
- Finite differences: ``gradcells.testing.vjp_check(op, case, backend="gpu")`` on every op,
  float64, at the oracle's default tolerances.
- Bad input (NumPy mixed with CuPy, NumPy float16), purity (inputs never modified, results
  never alias them), layouts, empty sizes, extreme pre-activations, the clip boundary.
- The device and the host emulation of the same kernels agree (when a C++ compiler exists).
- The layer-normalised LSTM (its own section): agreement on a grid of its options, both
  carries, the three dtypes (against the reference in long double on the host), finite
  differences, and device against host emulation.
- The sequence masks (docs/spec.md §11.3): masked sequences of the three cells (drawn masks,
  directions, layouts and options) against the reference on CuPy, the three dtypes; finite
  differences with every option; masks past a row's length never read.
- Forward mode and second order (docs/spec.md §12) on CuPy arrays, where they run on the
  reference: CuPy results equal to NumPy's, and the oracle.
"""

import inspect

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _device_count():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: all mean "skip"
        return 0


if _device_count() < 1:
    pytest.skip("needs CuPy and a CUDA device", allow_module_level=True)

import backend_calls  # noqa: E402
import cupy as cp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import gradcells as gc  # noqa: E402
from gradcells.cells import OPTIONAL_WEIGHTS  # noqa: E402
from gradcells.cells.lstm.spec import PEEPHOLES  # noqa: E402
from gradcells.cells.rnn.spec import ACTIVATIONS  # noqa: E402
from gradcells.gpu import _launch, _runtime  # noqa: E402
from gradcells.testing import (  # noqa: E402
    OPS,
    gru_cell_case,
    gru_cell_inputs,
    gru_sequence_case,
    gru_sequence_inputs,
    lstm_cell_case,
    lstm_cell_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    on_library,
    random_rnn_cell_case,
    random_rnn_sequence_case,
    rnn_cell_case,
    rnn_cell_inputs,
    rnn_sequence_case,
    rnn_sequence_inputs,
    vjp_check,
)

# The GPU backend: every cell's ``gpu.py`` (``gradcells.cells.<cell>.gpu``).
GPU_BACKEND = gc._dispatch.backend_module("gpu")

LSTM_CELL = ("x", "cs_prev", "h_prev", "w", "b")
GRU_CELL = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
LSTM_SEQ = ("x", "cs0", "h0", "w", "b")
GRU_SEQ = ("x", "h0", "w_ru", "w_c", "b_ru", "b_c")
RNN_CELL = ("x", "h_prev", "w", "b")
RNN_SEQ = ("x", "h0", "w", "b")




def on_gpu(case, dtype):
    """``case`` with its float arrays cast to ``dtype`` and every array moved to CuPy."""
    case = {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}
    return on_library(case, "cupy")


def float64(case):
    return {k: v.astype(cp.float64) if isinstance(v, cp.ndarray) and v.dtype.kind == "f"
            else v for k, v in case.items()}


def as64(arrays):
    return type(arrays)(*(None if a is None else a.astype(cp.float64) for a in arrays))


def assert_close(actual, expected, dtype, what=""):
    tolerance = 16 * np.finfo(dtype).eps
    for field, a, e in zip(expected._fields, actual, expected, strict=True):
        if e is None:
            assert a is None, f"{what}{field}"
            continue
        assert isinstance(a, cp.ndarray), f"{what}{field}: {type(a).__name__}"
        assert a.dtype == np.dtype(dtype) and a.shape == e.shape, f"{what}{field}"
        if e.size == 0:
            continue
        error = float(cp.max(cp.abs(a.astype(cp.float64) - e)))
        scale = 1 + float(cp.max(cp.abs(e)))
        assert error <= tolerance * scale, (
            f"{what}{field}: max error {error:.3g} ({error / np.finfo(dtype).eps:.1f} eps)")


def upstream(seed, dtype, shapes, wanted):
    rng = np.random.default_rng(seed)
    return {name: cp.asarray(rng.standard_normal(shape).astype(dtype)) if on else None
            for (name, shape), on in zip(shapes.items(), wanted, strict=True)}


def up64(up):
    return {k: None if v is None else v.astype(cp.float64) for k, v in up.items()}


GPU_DTYPES = [np.float64, np.float32, np.float16]


# --------------------------------------------------------------------------------------
# Dispatch


def test_cupy_arrays_dispatch_to_the_gpu_backend():
    case = on_gpu(lstm_cell_case(np.random.default_rng(1), peephole=True), np.float32)
    automatic = gc.lstm_cell(**case)
    explicit = gc.lstm_cell(**case, backend="gpu")
    assert all(isinstance(a, cp.ndarray) for a in automatic)
    for a, b in zip(automatic, explicit, strict=True):
        cp.testing.assert_array_equal(a, b)
    assert gc._dispatch.backend_module("gpu") is GPU_BACKEND
    assert isinstance(_launch._active, _runtime.CupyRuntime)
    reference = gc.lstm_cell(**case, backend="reference")
    assert all(isinstance(a, cp.ndarray) for a in reference)


# --------------------------------------------------------------------------------------
# Agreement with the reference backend on CuPy


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@given(case=lstm_cell_inputs(min_size=0), clip_grad=st.sampled_from(["exact", "straight_through"]),
       wanted=st.tuples(st.booleans(), st.booleans()), seed=st.integers(0, 2**16))
def test_lstm_cell_agrees_with_reference(dtype, case, clip_grad, wanted, seed):
    case = on_gpu(case, dtype)
    case64 = float64(case)
    state = gc.lstm_cell(**case)
    assert_close(state, gc.lstm_cell(**case64, backend="reference"), dtype, "forward ")
    up = upstream(seed, dtype, {"d_h": state.h.shape, "d_cs": state.h.shape}, wanted)
    grads = gc.lstm_cell_grad(*(case[k] for k in LSTM_CELL), state, **up,
                              **{k: case[k] for k in PEEPHOLES}, cell_clip=case["cell_clip"],
                              clip_grad=clip_grad)
    expected = gc.lstm_cell_grad(*(case64[k] for k in LSTM_CELL), as64(state), **up64(up),
                                 **{k: case64[k] for k in PEEPHOLES},
                                 cell_clip=case["cell_clip"], clip_grad=clip_grad,
                                 backend="reference")
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@given(case=gru_cell_inputs(min_size=0), wanted=st.tuples(*[st.booleans()] * 4),
       seed=st.integers(0, 2**16))
def test_gru_cell_agrees_with_reference(dtype, case, wanted, seed):
    """An upstream gradient on each field (docs/spec.md §16.1), each drawn or None."""
    case = on_gpu(case, dtype)
    case64 = float64(case)
    reset_after = case["reset_after"]
    state = gc.gru_cell(**case)
    assert_close(state, gc.gru_cell(**case64, backend="reference"), dtype, "forward ")
    up = upstream(seed, dtype, {f"d_{k}": getattr(state, k).shape for k in state._fields},
                  wanted)
    grads = gc.gru_cell_grad(*(case[k] for k in GRU_CELL), state, **up,
                             reset_after=reset_after)
    expected = gc.gru_cell_grad(*(case64[k] for k in GRU_CELL), as64(state), **up64(up),
                                reset_after=reset_after, backend="reference")
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@given(case=lstm_sequence_inputs(min_size=0),
       clip_grad=st.sampled_from(["exact", "straight_through"]),
       wanted=st.tuples(*[st.booleans()] * 4), seed=st.integers(0, 2**16))
def test_lstm_sequence_agrees_with_reference(dtype, case, clip_grad, wanted, seed):
    case = on_gpu(case, dtype)
    case64 = float64(case)
    options = {k: case[k] for k in (*PEEPHOLES, "cell_clip", "seq_len")}
    seq = gc.lstm_sequence(**case)
    assert_close(seq, gc.lstm_sequence(**case64, backend="reference"), dtype, "forward ")
    steps, state = seq.h.shape, seq.h_final.shape
    up = upstream(seed, dtype, {"d_h": steps, "d_cs": steps, "d_h_final": state,
                                "d_cs_final": state}, wanted)
    grads = gc.lstm_sequence_grad(*(case[k] for k in LSTM_SEQ), seq, **up, **options,
                                  clip_grad=clip_grad)
    expected = gc.lstm_sequence_grad(
        *(case64[k] for k in LSTM_SEQ), as64(seq), **up64(up),
        **{k: case64[k] for k in (*PEEPHOLES, "cell_clip", "seq_len")}, clip_grad=clip_grad,
        backend="reference")
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@given(case=gru_sequence_inputs(min_size=0), wanted=st.tuples(*[st.booleans()] * 5),
       seed=st.integers(0, 2**16))
def test_gru_sequence_agrees_with_reference(dtype, case, wanted, seed):
    """An upstream gradient on each field (docs/spec.md §16.1), each drawn or None."""
    case = on_gpu(case, dtype)
    case64 = float64(case)
    options = {k: case[k] for k in ("reset_after", "seq_len")}
    seq = gc.gru_sequence(**case)
    assert_close(seq, gc.gru_sequence(**case64, backend="reference"), dtype, "forward ")
    up = upstream(seed, dtype, {f"d_{k}": getattr(seq, k).shape for k in seq._fields}, wanted)
    grads = gc.gru_sequence_grad(*(case[k] for k in GRU_SEQ), seq, **up, **options)
    expected = gc.gru_sequence_grad(*(case64[k] for k in GRU_SEQ), as64(seq), **up64(up),
                                    **options, backend="reference")
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@given(case=rnn_cell_inputs(min_size=0), with_d_h=st.booleans(), seed=st.integers(0, 2**16))
def test_rnn_cell_agrees_with_reference(dtype, case, with_d_h, seed):
    case = on_gpu(case, dtype)
    case64 = float64(case)
    state = gc.rnn_cell(**case)
    assert_close(state, gc.rnn_cell(**case64, backend="reference"), dtype, "forward ")
    d_h = upstream(seed, dtype, {"d_h": state.h.shape}, [with_d_h])["d_h"]
    grads = gc.rnn_cell_grad(*(case[k] for k in RNN_CELL), state, d_h=d_h)
    # The reference gradient at the device's forward state (relu's mask from the same h).
    expected = gc.rnn_cell_grad(*(case64[k] for k in RNN_CELL), as64(state),
                                d_h=None if d_h is None else d_h.astype(cp.float64),
                                activation=case["activation"], backend="reference")
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@given(case=rnn_sequence_inputs(min_size=0), wanted=st.tuples(st.booleans(), st.booleans()),
       seed=st.integers(0, 2**16))
def test_rnn_sequence_agrees_with_reference(dtype, case, wanted, seed):
    case = on_gpu(case, dtype)
    case64 = float64(case)
    options = {k: case[k] for k in ("activation", "seq_len")}
    seq = gc.rnn_sequence(**case)
    assert_close(seq, gc.rnn_sequence(**case64, backend="reference"), dtype, "forward ")
    up = upstream(seed, dtype, {"d_h": seq.h.shape, "d_h_final": seq.h_final.shape}, wanted)
    grads = gc.rnn_sequence_grad(*(case[k] for k in RNN_SEQ), seq, **up, **options)
    expected = gc.rnn_sequence_grad(*(case64[k] for k in RNN_SEQ), as64(seq), **up64(up),
                                    **options, backend="reference")
    assert_close(grads, expected, dtype, "gradient ")


# --------------------------------------------------------------------------------------
# Finite differences


@pytest.mark.parametrize("op", sorted(OPS))
@given(seed=st.integers(0, 2**32 - 1))
def test_gradients_match_finite_differences(op, seed):
    draw_case = OPS[op][0]
    case = on_library(draw_case(np.random.default_rng(seed)), "cupy")
    report = vjp_check(op, case, backend="gpu")
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("op", sorted(OPS))
def test_float32_gradients_match_finite_differences(op):
    case = on_gpu(OPS[op][0](np.random.default_rng(7)), np.float32)
    report = vjp_check(op, case, backend="gpu")
    assert report.passed, f"\n{report}"


def _rnn_pair(case, sequence):
    """``(f, vjp, args, names)`` for the oracle: the public RNN ops on the GPU backend."""
    names = RNN_SEQ if sequence else RNN_CELL
    options = {"activation": case["activation"]}
    if sequence:
        options["seq_len"] = case["seq_len"]

    def run(*arrays):
        op = gc.rnn_sequence if sequence else gc.rnn_cell
        return op(*arrays, **options, backend="gpu")

    def f(*arrays):
        result = run(*arrays)
        return (result.h, result.h_final) if sequence else result.h

    def vjp(ct, *arrays):
        if sequence:
            return tuple(gc.rnn_sequence_grad(*arrays, run(*arrays), d_h=ct[0],
                                              d_h_final=ct[1], backend="gpu"))
        return tuple(gc.rnn_cell_grad(*arrays, run(*arrays), d_h=ct, backend="gpu"))

    return f, vjp, tuple(case[n] for n in names), names


@pytest.mark.parametrize("sequence", [False, True], ids=["cell", "sequence"])
@given(seed=st.integers(0, 2**32 - 1))
def test_rnn_gradients_match_finite_differences(sequence, seed):
    draw_case = random_rnn_sequence_case if sequence else random_rnn_cell_case
    case = on_library(draw_case(np.random.default_rng(seed)), "cupy")
    f, vjp, args, names = _rnn_pair(case, sequence)
    report = gc.check_vjp(f, vjp, args, names=names)
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("sequence", [False, True], ids=["cell", "sequence"])
def test_float32_rnn_gradients_match_finite_differences(sequence):
    draw_case = random_rnn_sequence_case if sequence else random_rnn_cell_case
    case = on_gpu(draw_case(np.random.default_rng(7)), np.float32)
    f, vjp, args, names = _rnn_pair(case, sequence)
    report = gc.check_vjp(f, vjp, args, names=names)
    assert report.passed, f"\n{report}"


# --------------------------------------------------------------------------------------
# Bad input, purity, layouts, sizes, extremes


def test_numpy_mixed_with_cupy_names_both_arguments():
    case = on_gpu(lstm_cell_case(np.random.default_rng(2)), np.float32)
    with pytest.raises(TypeError, match="x and cs_prev come from two array libraries"):
        gc.lstm_cell(**{**case, "cs_prev": case["cs_prev"].get()})
    with pytest.raises(TypeError, match="x and h_prev come from two array libraries"):
        gc.gru_cell(**{**on_gpu(gru_cell_case(np.random.default_rng(3)), np.float32),
                       "h_prev": np.zeros((3, 5), np.float32)})
    seq = on_gpu(lstm_sequence_case(np.random.default_rng(4)), np.float32)
    with pytest.raises(TypeError, match="x and w come from two array libraries"):
        gc.lstm_sequence(**{**seq, "w": seq["w"].get()})
    with pytest.raises(ValueError, match="backend='cpu' takes numpy arrays"):
        gc.lstm_cell(**case, backend="cpu")


def test_float16_is_accepted_on_cupy_only():
    case = lstm_cell_case(np.random.default_rng(5))
    half = {k: v.astype(np.float16) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    with pytest.raises(TypeError, match="x must have dtype float32 or float64, got float16"):
        gc.lstm_cell(**half)
    state = gc.lstm_cell(**on_library(half, "cupy"))
    assert state.h.dtype == cp.float16


def _snapshot(case):
    return {k: v.copy() for k, v in case.items() if isinstance(v, cp.ndarray)}


def _assert_untouched(case, snapshot, results):
    for k, v in snapshot.items():
        cp.testing.assert_array_equal(case[k], v, err_msg=k)
        for result in results:
            if result is not None:
                assert not cp.shares_memory(result, case[k]), k


def test_inputs_are_never_modified_and_results_never_alias_them():
    rng = np.random.default_rng(6)
    lstm = on_gpu(lstm_sequence_case(rng, peephole=True, clip=True, ragged=True), np.float32)
    gru = on_gpu(gru_sequence_case(rng, reset_after=True, ragged=True), np.float32)
    cell = on_gpu(lstm_cell_case(rng, peephole=True, clip=True), np.float32)
    rnn = on_gpu(rnn_sequence_case(rng, activation="relu", ragged=True), np.float32)
    rnn_cell = on_gpu(rnn_cell_case(rng), np.float32)
    snapshots = [_snapshot(c) for c in (lstm, gru, cell, rnn, rnn_cell)]
    seq = gc.lstm_sequence(**lstm)
    seq_copy = [a.copy() for a in seq]
    d_h = cp.ones_like(seq.h)
    grads = gc.lstm_sequence_grad(*(lstm[k] for k in LSTM_SEQ), seq, d_h=d_h, d_cs=d_h,
                                  d_h_final=seq.h_final, d_cs_final=seq.cs_final,
                                  **{k: lstm[k] for k in (*PEEPHOLES, "cell_clip", "seq_len")})
    gseq = gc.gru_sequence(**gru)
    ggrads = gc.gru_sequence_grad(*(gru[k] for k in GRU_SEQ), gseq, d_h=cp.ones_like(gseq.h),
                                  d_h_final=gseq.h_final, reset_after=True,
                                  seq_len=gru["seq_len"])
    state = gc.lstm_cell(**cell)
    cgrads = gc.lstm_cell_grad(*(cell[k] for k in LSTM_CELL), state, d_h=state.h,
                               **{k: cell[k] for k in PEEPHOLES}, cell_clip=cell["cell_clip"])
    rseq = gc.rnn_sequence(**rnn)
    rgrads = gc.rnn_sequence_grad(*(rnn[k] for k in RNN_SEQ), rseq, d_h=cp.ones_like(rseq.h),
                                  d_h_final=rseq.h_final)
    rstate = gc.rnn_cell(**rnn_cell)
    rcgrads = gc.rnn_cell_grad(*(rnn_cell[k] for k in RNN_CELL), rstate, d_h=rstate.h)
    for c, snap, results in ((lstm, snapshots[0], (*seq, *grads)),
                             (gru, snapshots[1], (*gseq, *ggrads)),
                             (cell, snapshots[2], (*state, *cgrads)),
                             (rnn, snapshots[3], (*rseq, *rgrads)),
                             (rnn_cell, snapshots[4], (*rstate, *rcgrads))):
        _assert_untouched(c, snap, results)
    for a, b in zip(seq, seq_copy, strict=True):  # the saved forward is an input of the gradient
        cp.testing.assert_array_equal(a, b)


def test_layout_does_not_change_results():
    rng = np.random.default_rng(8)
    case = on_gpu(lstm_sequence_case(rng, peephole=True, ragged=True), np.float64)
    fortran = {k: cp.asfortranarray(v) if isinstance(v, cp.ndarray) and v.ndim >= 2 else v
               for k, v in case.items()}
    strided = {k: cp.repeat(v, 2, axis=-1)[..., ::2] if isinstance(v, cp.ndarray)
               and v.dtype.kind == "f" else v for k, v in case.items()}
    base = gc.lstm_sequence(**case)
    for variant in (fortran, strided):
        for a, b in zip(base, gc.lstm_sequence(**variant), strict=True):
            cp.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("sizes", [(0, 2, 3), (2, 0, 3), (2, 2, 0)])
def test_empty_sizes(sizes):
    steps, batch, n_in = sizes
    rng = np.random.default_rng(9)
    lstm = on_gpu(lstm_sequence_case(rng, steps=steps, batch=batch, input_size=n_in,
                                     hidden=3, peephole=True), np.float32)
    seq = gc.lstm_sequence(**lstm)
    assert seq.h.shape == (steps, batch, 3) and seq.cs_final.shape == (batch, 3)
    d_h_final = cp.ones((batch, 3), cp.float32)
    grads = gc.lstm_sequence_grad(*(lstm[k] for k in LSTM_SEQ), seq, d_h_final=d_h_final,
                                  **{k: lstm[k] for k in PEEPHOLES})
    assert grads.x.shape == (steps, batch, n_in) and grads.w.shape == (n_in + 3, 12)
    if steps == 0:
        cp.testing.assert_array_equal(grads.h0, d_h_final)
    gru = on_gpu(gru_sequence_case(rng, steps=steps, batch=batch, input_size=n_in, hidden=3),
                 np.float32)
    gseq = gc.gru_sequence(**gru)
    ggrads = gc.gru_sequence_grad(*(gru[k] for k in GRU_SEQ), gseq)
    assert ggrads.w_ru.shape == (n_in + 3, 6)
    if steps:
        cell = on_gpu(lstm_cell_case(rng, batch=batch, input_size=n_in, hidden=3), np.float32)
        state = gc.lstm_cell(**cell)
        assert state.h.shape == (batch, 3)
    rnn = on_gpu(rnn_sequence_case(rng, steps=steps, batch=batch, input_size=n_in, hidden=3,
                                   ragged=True), np.float32)
    rseq = gc.rnn_sequence(**rnn)
    assert rseq.h.shape == (steps, batch, 3) and rseq.h_final.shape == (batch, 3)
    rgrads = gc.rnn_sequence_grad(*(rnn[k] for k in RNN_SEQ), rseq, d_h_final=d_h_final)
    assert rgrads.x.shape == (steps, batch, n_in) and rgrads.w.shape == (n_in + 3, 3)
    if steps == 0:
        cp.testing.assert_array_equal(rgrads.h0, d_h_final)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_extreme_preactivations_stay_finite(dtype):
    rng = np.random.default_rng(10)
    lstm = on_gpu(lstm_cell_case(rng, peephole=True), dtype)
    lstm["w"] = lstm["w"] * 4e3  # pre-activations of order 1e4
    state = gc.lstm_cell(**lstm)
    grads = gc.lstm_cell_grad(*(lstm[k] for k in LSTM_CELL), state, d_h=cp.ones_like(state.h),
                              d_cs=cp.ones_like(state.h), **{k: lstm[k] for k in PEEPHOLES})
    gru = on_gpu(gru_cell_case(rng, reset_after=True), dtype)
    gru["w_ru"], gru["w_c"] = gru["w_ru"] * 4e3, gru["w_c"] * 4e3
    gstate = gc.gru_cell(**gru)
    ggrads = gc.gru_cell_grad(*(gru[k] for k in GRU_CELL), gstate, d_h=cp.ones_like(gstate.h),
                              reset_after=True)
    rnns = [on_gpu(rnn_cell_case(rng, activation=activation), dtype)
            for activation in ACTIVATIONS]
    rnn_results = []
    for rnn in rnns:
        rnn["w"] = rnn["w"] * 4e3
        rstate = gc.rnn_cell(**rnn)
        rnn_results += [*rstate, *gc.rnn_cell_grad(*(rnn[k] for k in RNN_CELL), rstate,
                                                   d_h=cp.ones_like(rstate.h))]
    for a in (*state, *grads, *gstate, *ggrads, *rnn_results):
        assert a is None or bool(cp.isfinite(a).all())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gradient_passes_exactly_on_the_clip_boundary(dtype):
    case = on_gpu(lstm_cell_case(np.random.default_rng(11), batch=3, hidden=4), dtype)
    arrays = [case[k] for k in LSTM_CELL]
    free = gc.lstm_cell(*arrays)
    magnitudes = cp.abs(free.cs)
    level = float(cp.sort(magnitudes.ravel())[magnitudes.size // 2])
    clipped = gc.lstm_cell(*arrays, cell_clip=level)
    d_cs = cp.ones_like(free.cs)
    on = gc.lstm_cell_grad(*arrays, clipped, d_cs=d_cs, cell_clip=level)
    off = gc.lstm_cell_grad(*arrays, free, d_cs=d_cs)
    passes = magnitudes <= level
    cp.testing.assert_array_equal(on.cs_prev, cp.where(passes, off.cs_prev, 0))
    assert bool(cp.all(on.cs_prev[magnitudes == level] != 0))


def test_device_and_host_emulation_agree():
    """The same kernels, compiled by NVRTC for the device and by the host compiler."""
    cuda_host = pytest.importorskip("cuda_host")
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    rng = np.random.default_rng(12)
    lstm = lstm_sequence_case(rng, peephole=True, clip=True, ragged=True)
    gru = gru_sequence_case(rng, ragged=True)
    rnn = rnn_sequence_case(rng, ragged=True)
    gpu = GPU_BACKEND
    device = [*backend_calls.forward(gpu, "lstm_sequence", on_library(lstm, "cupy")),
              *backend_calls.forward(gpu, "gru_sequence", on_library(gru, "cupy")),
              *backend_calls.forward(gpu, "rnn_sequence", on_library(rnn, "cupy"))]
    saved = _launch.use_runtime(cuda_host.HostRuntime())
    try:
        host = [*backend_calls.forward(gpu, "lstm_sequence", lstm),
                *backend_calls.forward(gpu, "gru_sequence", gru),
                *backend_calls.forward(gpu, "rnn_sequence", rnn)]
    finally:
        _launch.use_runtime(saved)
    for a, b in zip(device, host, strict=True):
        np.testing.assert_allclose(a.get(), b, rtol=16 * np.finfo(np.float64).eps,
                                   atol=16 * np.finfo(np.float64).eps)


@pytest.mark.skipif(_device_count() < 2, reason="needs two CUDA devices")
def test_arrays_on_another_device_run_there():
    """Each op runs on its arguments' device whatever device is current; arguments on two
    devices are rejected, naming them."""
    case = lstm_sequence_case(np.random.default_rng(13), peephole=True, ragged=True)
    with cp.cuda.Device(0):
        expected = gc.lstm_sequence(**on_gpu(case, np.float64))
    with cp.cuda.Device(1):
        on_one = on_gpu(case, np.float64)
    with cp.cuda.Device(0):
        seq = gc.lstm_sequence(**on_one)
        grads = gc.lstm_sequence_grad(*(on_one[k] for k in LSTM_SEQ), seq,
                                      d_h=cp.ones_like(seq.h), seq_len=on_one["seq_len"],
                                      **{k: on_one[k] for k in PEEPHOLES})
        assert all(a.device.id == 1 for a in (*seq, *grads) if a is not None)
        for a, b in zip(seq, expected, strict=True):
            np.testing.assert_array_equal(a.get(), b.get())
        mixed = {**on_one, "h0": cp.asarray(case["h0"])}          # h0 on device 0
        with pytest.raises(ValueError, match="h0 is on CUDA device 0 but x is on device 1"):
            gc.lstm_sequence(**mixed)
        lengths_here = {**on_one, "seq_len": cp.asarray(case["seq_len"])}    # on device 0
        with pytest.raises(ValueError, match="seq_len is on CUDA device 0 but x is on device 1"):
            gc.lstm_sequence(**lengths_here)


_CACHE_RUN = """
import numpy as np
import gradcells as gc
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import gru_sequence_case, lstm_sequence_case, on_library, rnn_sequence_case

lstm = on_library(lstm_sequence_case(np.random.default_rng(1), peephole=True), "cupy")
seq = gc.lstm_sequence(**lstm)                                  # lstm.cu
gc.lstm_sequence_grad(*(lstm[k] for k in ("x", "cs0", "h0", "w", "b")), seq,
                      d_h=seq.h, **{k: lstm[k] for k in PEEPHOLES})  # reduce.cu
gc.gru_sequence(**on_library(gru_sequence_case(np.random.default_rng(2)), "cupy"))  # gru.cu
gc.rnn_sequence(**on_library(rnn_sequence_case(np.random.default_rng(3)), "cupy"))  # rnn.cu
"""


def test_a_new_process_loads_the_kernels_from_cupys_disk_cache(tmp_path):
    """The first process compiles each .cu module and CuPy stores it in ``CUPY_CACHE_DIR``;
    a second process loads every file from there and rewrites none (a cache miss would).
    The generated entry points exist for this: CuPy before 14.2 does not read its disk cache
    for modules compiled with name expressions."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path)}

    def cache():
        subprocess.run([sys.executable, "-c", _CACHE_RUN], env=env, check=True)
        return {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}

    first = cache()
    for entry in (b"lstm_forward__float", b"column_sum__float__float", b"gru_gates__float",
                  b"rnn_forward__double"):
        assert any(entry in path.read_bytes() for path in first), entry
    assert cache() == first


# --------------------------------------------------------------------------------------
# The LSTM projection (docs/spec.md §9.1)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("clip_grad", ["exact", "straight_through"])
def test_lstm_projection_agrees_with_reference(dtype, ragged, clip_grad):
    from gradcells import reference

    rng = np.random.default_rng(80)
    seq_case = on_gpu(lstm_sequence_case(rng, steps=4, batch=4, input_size=3, hidden=5,
                                         proj_size=3, proj_clip=True, clip=True,
                                         peephole=True, ragged=ragged), dtype)
    case64 = float64(seq_case)
    seq = backend_calls.forward(GPU_BACKEND, "lstm_sequence", seq_case)
    assert seq.h.shape == (4, 4, 3) and seq.cs.shape == (4, 4, 5)
    assert_close(seq, backend_calls.forward(reference, "lstm_sequence", case64), dtype,
                 "forward ")
    up = upstream(81, dtype, {"d_h": seq.h.shape, "d_cs": seq.cs.shape,
                              "d_h_final": seq.h_final.shape,
                              "d_cs_final": seq.cs_final.shape}, (True,) * 4)
    grads = backend_calls.grad(GPU_BACKEND, "lstm_sequence", seq_case, seq, **up,
                               clip_grad=clip_grad)
    assert grads.w_proj is not None
    expected = backend_calls.grad(reference, "lstm_sequence", case64, as64(seq), **up64(up),
                                  clip_grad=clip_grad)
    assert_close(grads, expected, dtype, "gradient ")


# --------------------------------------------------------------------------------------
# The layer-normalised LSTM (docs/spec.md §9.2)
#
# As in tests/contracts/test_cuda_emulation.py (see there): a layer norm amplifies rounding errors,
# so the device is compared with the reference in NumPy long double on the host ("exact"),
# allowing 16 eps(dtype) (1 + max |exact|) plus 4 times the output's sensitivity at the
# dtype's rounding level (the float64 reference on inputs perturbed by eps(dtype)).

LN_OPTIONS = [  # (peephole, clip, projection)
    (False, False, False), (True, False, False), (False, True, False), (False, False, True),
    (True, True, True)]


def _map_arrays(value, function):
    """``value`` (an array, None, a result or a case dict) with ``function`` applied to
    every float array in it (CuPy arrays moved to the host first)."""
    if isinstance(value, dict):
        return {k: _map_arrays(v, function) for k, v in value.items()}
    if isinstance(value, tuple):
        return type(value)(*(_map_arrays(v, function) for v in value))
    if isinstance(value, cp.ndarray):
        value = value.get()
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return function(value)
    return value


def _ln_case(case, dtype):
    """An LN case (NumPy) with its float arrays, the norm's too, cast to ``dtype``."""
    return _map_arrays(case, lambda a: a.astype(dtype))


def _perturbed(dtype, draw):
    """``a`` in float64 times ``1 + eps(dtype)·u``, u in {-1, 0, 1} (draw 0: unperturbed)."""
    rng = np.random.default_rng(draw)
    eps = np.finfo(dtype).eps if draw else 0.0
    return lambda a: a.astype(np.float64) * (1 + eps * rng.integers(-1, 2, a.shape))


def _ln_fields(result, prefix=""):
    for field, value in zip(result._fields, result, strict=True):
        if isinstance(value, gc.LSTMNorm):
            yield from _ln_fields(value, f"{prefix}{field}.")
        else:
            yield prefix + field, value


def _assert_close_ln(actual, run_reference, dtype, what=""):
    """``actual`` (CuPy) against ``run_reference(function)``, the reference on its inputs
    mapped by ``function``, to the tolerance above."""
    exact = run_reference(lambda a: a.astype(np.longdouble))
    runs = [run_reference(_perturbed(dtype, draw)) for draw in range(4)]
    tolerance = 16 * np.finfo(dtype).eps
    for (field, a), (_, e), *others in zip(_ln_fields(actual), _ln_fields(exact),
                                           *(_ln_fields(r) for r in runs), strict=True):
        if e is None:
            assert a is None, f"{what}{field}"
            continue
        assert isinstance(a, cp.ndarray), f"{what}{field}: {type(a).__name__}"
        assert a.dtype == np.dtype(dtype) and a.shape == e.shape, f"{what}{field}"
        if e.size == 0:
            continue
        a = a.get().astype(np.longdouble)
        error = np.max(np.abs(a - e))
        sensitivity = max(np.max(np.abs(o.astype(np.longdouble) - e)) for _, o in others)
        allowed = tolerance * (1 + np.max(np.abs(e))) + 4 * sensitivity
        assert np.all(np.isfinite(a)) and error <= allowed, (
            f"{what}{field}: max error {float(error):.3g} "
            f"({float(error) / np.finfo(dtype).eps:.1f} eps, allowed {float(allowed):.3g})")


def _check_ln_on_device(rng, op, case, dtype):
    """One LN op on the device, forward and both gradient modes, against the reference."""
    from gradcells import reference

    case = _ln_case(case, dtype)
    on_device = on_library(case, "cupy")
    result = backend_calls.forward(GPU_BACKEND, op, on_device)
    _assert_close_ln(result, lambda f: backend_calls.forward(reference, op,
                                                             _map_arrays(case, f)),
                     dtype, f"{op} forward ")
    fields = ("h", "cs") if op == "lstm_cell" else ("h", "cs", "h_final", "cs_final")
    up = {f"d_{k}": rng.standard_normal(getattr(result, k).shape).astype(dtype)
          for k in fields}
    for clip_grad in ("exact", "straight_through"):
        grads = backend_calls.grad(GPU_BACKEND, op, on_device, result,
                                   **{k: cp.asarray(v) for k, v in up.items()},
                                   clip_grad=clip_grad)
        assert isinstance(grads.layer_norm, gc.LSTMNorm)

        def expected(f, clip_grad=clip_grad):  # the reference at the device's forward
            return backend_calls.grad(reference, op, _map_arrays(case, f),
                                      _map_arrays(result, f), **_map_arrays(up, f),
                                      clip_grad=clip_grad)

        _assert_close_ln(grads, expected, dtype, f"{op} gradient ({clip_grad}) ")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("ln_carry", ["raw", "normalized"])
@pytest.mark.parametrize("peephole, clip, projection", LN_OPTIONS)
@pytest.mark.parametrize("ragged", [False, True])
def test_layer_norm_lstm_agrees_with_reference(dtype, ln_carry, peephole, clip, projection,
                                               ragged):
    rng = np.random.default_rng(90)
    options = {"peephole": peephole, "clip": clip, "layer_norm": True, "ln_carry": ln_carry}
    if projection:
        options.update(proj_size=3, proj_clip=True)
    _check_ln_on_device(rng, "lstm_cell", lstm_cell_case(rng, batch=4, hidden=5, **options),
                        dtype)
    _check_ln_on_device(rng, "lstm_sequence",
                        lstm_sequence_case(rng, steps=4, batch=4, input_size=3, hidden=5,
                                           ragged=ragged, **options), dtype)


@pytest.mark.parametrize("op", ["lstm_cell", "lstm_sequence"])
@pytest.mark.parametrize("ln_carry", ["raw", "normalized"])
@pytest.mark.parametrize("everything", [False, True])
def test_layer_norm_gradients_match_finite_differences(op, ln_carry, everything):
    rng = np.random.default_rng(91)
    options = {"layer_norm": True, "ln_carry": ln_carry}
    if everything:
        options.update(peephole=True, clip=True, proj_size=3, proj_clip=True)
    case = (lstm_cell_case(rng, **options) if op == "lstm_cell" else
            lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                               **options))
    report = vjp_check(op, on_library(case, "cupy"), backend="gpu")
    assert report.passed, f"\n{report}"


def test_layer_norm_device_and_host_emulation_agree():
    cuda_host = pytest.importorskip("cuda_host")
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    rng = np.random.default_rng(92)
    gpu = GPU_BACKEND
    cases = [lstm_sequence_case(rng, peephole=True, clip=True, ragged=True, layer_norm=True,
                                ln_carry=carry, proj_size=3, proj_clip=True)
             for carry in ("raw", "normalized")]

    def run(case):
        seq = backend_calls.forward(gpu, "lstm_sequence", case)
        xp = cp if isinstance(case["x"], cp.ndarray) else np
        grads = backend_calls.grad(gpu, "lstm_sequence", case, seq, d_h=xp.ones_like(seq.h),
                                   d_cs=xp.ones_like(seq.cs))
        return [a for _, a in (*_ln_fields(seq), *_ln_fields(grads)) if a is not None]

    device = [a for case in cases for a in run(on_library(case, "cupy"))]
    saved = _launch.use_runtime(cuda_host.HostRuntime())
    try:
        host = [a for case in cases for a in run(case)]
    finally:
        _launch.use_runtime(saved)
    for a, b in zip(device, host, strict=True):
        np.testing.assert_allclose(a.get(), b, rtol=64 * np.finfo(np.float64).eps,
                                   atol=64 * np.finfo(np.float64).eps)


# --- direction, layout and stacks (docs/spec.md §11.1, §11.2, §11.4) on CuPy arrays -------

@pytest.mark.parametrize("op", ["lstm_sequence", "gru_sequence", "rnn_sequence"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_reverse_and_batch_first_on_the_device(op, batch_first):
    """The per-row reversal and the layout run on CuPy arrays (``xp.take`` of the rows): the
    GPU backend equals the reference run on the same CuPy arrays, and the oracle passes it."""
    make = {"lstm_sequence": lstm_sequence_case, "gru_sequence": gru_sequence_case,
            "rnn_sequence": rnn_sequence_case}[op]
    case = on_library(make(np.random.default_rng(3), steps=5, batch=4, ragged=True,
                           reverse=True, batch_first=batch_first), "cupy")
    vjp_check(op, case, backend="gpu").raise_if_failed()
    f_gpu = gc.testing.OPS[op][1](case, backend="gpu")[0]
    f_ref, _, args, _ = gc.testing.OPS[op][1](case, backend="reference")
    for a, b in zip(f_gpu(*args), f_ref(*args), strict=True):
        assert isinstance(a, cp.ndarray)
        cp.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_stacks_on_the_device(cell):
    """A 2-layer bidirectional stack with masks and ragged lengths on CuPy arrays: the oracle
    passes the GPU backend's gradients (eight elements of every argument)."""
    case = on_library(gc.testing.stack_case(np.random.default_rng(4), cell), "cupy")
    f, vjp, args, names = gc.testing.stack_vjp_pair(cell, case, backend="gpu")
    assert isinstance(f(*args)[0], cp.ndarray)
    gc.check_vjp(f, vjp, args, names=names, samples=8).raise_if_failed()


# --- the sequence masks (docs/spec.md §11.3) on CuPy arrays ----------------------------------

_MASKED = {  # sizes >= 1: the reversal with lengths cannot reshape an input of width 0
    "lstm_sequence": (lstm_sequence_inputs(projection=None, reverse=None, batch_first=None,
                                           masks=True), LSTM_SEQ),
    "gru_sequence": (gru_sequence_inputs(reverse=None, batch_first=None, masks=True), GRU_SEQ),
    "rnn_sequence": (rnn_sequence_inputs(reverse=None, batch_first=None, masks=True), RNN_SEQ)}
_MASKED_CASES = {"lstm_sequence": lstm_sequence_case, "gru_sequence": gru_sequence_case,
                 "rnn_sequence": rnn_sequence_case}


def _masked_call(op, case, arrays, backend=None):
    """``gc.<op>`` on a case; CuPy arrays with masks go to the GPU backend by default."""
    return getattr(gc, op)(*(case[k] for k in arrays),
                           **{k: v for k, v in case.items() if k not in arrays},
                           backend=backend)


def _masked_grad(op, case, arrays, seq, backend=None, **upstream):
    """``gc.<op>_grad`` with the case's settings passed explicitly (``seq`` need not record
    them: the reference's is the device's forward in float64)."""
    function = getattr(gc, f"{op}_grad")
    accepted = inspect.signature(function).parameters
    settings = {k: v for k, v in case.items() if k not in arrays and k in accepted}
    return function(*(case[k] for k in arrays), seq, **settings, **upstream, backend=backend)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("op", sorted(_MASKED))
@given(data=st.data(), wanted=st.tuples(*[st.booleans()] * 4), seed=st.integers(0, 2**16))
def test_masked_sequences_agree_with_reference(op, dtype, data, wanted, seed):
    """Every mask (per step or broadcast over time), both directions and layouts, ragged
    lengths and the cells' options: the GPU backend, chosen by default for CuPy arrays with
    masks, against the reference on CuPy in float64, forward and every gradient."""
    strategy, arrays = _MASKED[op]
    case = on_gpu(data.draw(strategy), dtype)
    case64 = float64(case)
    assert gc._dispatch.backend_for(None, "cupy") is GPU_BACKEND
    seq = _masked_call(op, case, arrays)
    assert_close(seq, _masked_call(op, case64, arrays, "reference"), dtype, "forward ")
    fields = ("h", "cs", "h_final", "cs_final") if op == "lstm_sequence" else ("h", "h_final")
    up = upstream(seed, dtype, {f"d_{k}": getattr(seq, k).shape for k in fields},
                  wanted[:len(fields)])
    grads = _masked_grad(op, case, arrays, seq, **up)
    expected = _masked_grad(op, case64, arrays, as64(seq), "reference", **up64(up))
    assert_close(grads, expected, dtype, "gradient ")


_MASKED_ORACLE = [
    ("lstm_sequence", {"peephole": True, "clip": True}),
    ("lstm_sequence", {"proj_size": 2, "proj_clip": True, "peephole": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "normalized", "peephole": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "raw", "proj_size": 2}),
    ("gru_sequence", {}), ("gru_sequence", {"reset_after": True}),
    ("rnn_sequence", {"activation": "tanh"}), ("rnn_sequence", {"activation": "relu"})]


@pytest.mark.parametrize("op, options", _MASKED_ORACLE)
@pytest.mark.parametrize("reverse, batch_first", [(False, False), (True, True)])
def test_masked_gradients_match_finite_differences(op, options, reverse, batch_first):
    case = on_library(_MASKED_CASES[op](np.random.default_rng(5), steps=3, batch=3,
                                        input_size=2, hidden=3, ragged=True, reverse=reverse,
                                        batch_first=batch_first, masks=True, **options),
                      "cupy")
    vjp_check(op, case, backend="gpu").raise_if_failed()


@pytest.mark.parametrize("op, options", _MASKED_ORACLE)
def test_masks_past_a_rows_length_are_never_read_on_the_device(op, options):
    """NaN in the input and zoneout masks past each row's length changes nothing."""
    arrays = _MASKED[op][1]
    case = on_library(_MASKED_CASES[op](np.random.default_rng(6), steps=5, batch=4,
                                        input_size=2, hidden=3, ragged=True, masks=True,
                                        **options), "cupy")
    valid = cp.arange(5)[:, None] < case["seq_len"]
    poisoned = dict(case)
    for name in ("input_mask", "zoneout_h", "zoneout_cs"):
        if name in case:
            full = cp.array(cp.broadcast_to(case[name], (5, 4, case[name].shape[-1])))
            poisoned[name] = cp.where(valid[:, :, None], full, cp.nan)
    runs = []
    for c in (case, poisoned):
        seq = _masked_call(op, c, arrays)
        up = {"d_h": cp.ones(seq.h.shape), "d_h_final": cp.ones(seq.h_final.shape)}
        weights = {k: v for k, v in c.items() if k in OPTIONAL_WEIGHTS}
        grads = getattr(gc, f"{op}_grad")(*(c[k] for k in arrays), seq, **weights, **up)
        runs.append([*seq, *(g for g in grads if isinstance(g, cp.ndarray))])
    for want, got in zip(*runs, strict=True):
        assert not bool(cp.isnan(want).any())
        cp.testing.assert_array_equal(got, want)


# --- forward mode and second order (docs/spec.md §12) ----------------------------------

@pytest.mark.parametrize("op", ["lstm_sequence", "gru_sequence", "rnn_sequence",
                                "lstm_stack"])
def test_forward_mode_and_second_order_on_cupy_arrays(op):
    """The forward-mode and second-order ops on CuPy arrays (the cells' and sequences'
    forward mode on the GPU backend, the rest on the reference, on the arrays' device, dual numbers
    included): CuPy results, equal to the same calls on NumPy, and the oracle passes them."""
    rng = np.random.default_rng(21)
    case = OPS[op][0](rng)
    on_device = gc.testing.on_library(case, "cupy")
    for check in (gc.testing.jvp_check, gc.testing.grad_jvp_check):
        check(op, on_device).raise_if_failed()
    f, jvp, args, _ = OPS[op][1](on_device, mode="jvp")
    tangents = [cp.asarray(rng.standard_normal(a.shape)) for a in args]
    got = jvp(tangents, *args)
    f64, jvp64, args64, _ = OPS[op][1](case, mode="jvp")
    want = jvp64([t.get() for t in tangents], *args64)
    for a, b in zip(got, want, strict=True):
        assert isinstance(a, cp.ndarray)
        np.testing.assert_allclose(a.get(), b, rtol=1e-12, atol=1e-12)


# The forward-mode ops the GPU backend runs (docs/spec.md §12; the cells' gpu.py).
_GPU_JVP = {
    "rnn_cell": (rnn_cell_inputs(min_size=0), RNN_CELL),
    "gru_cell": (gru_cell_inputs(min_size=0), GRU_CELL),
    "rnn_sequence": (st.one_of(rnn_sequence_inputs(min_size=0, batch_first=None, masks=None),
                               rnn_sequence_inputs(reverse=None, batch_first=None,
                                                   masks=None)), RNN_SEQ),
    "gru_sequence": (st.one_of(gru_sequence_inputs(min_size=0, batch_first=None, masks=None),
                               gru_sequence_inputs(reverse=None, batch_first=None,
                                                   masks=None)), GRU_SEQ),
    "lstm_cell": (lstm_cell_inputs(min_size=0, projection=None, layer_norm=None), LSTM_CELL),
    "lstm_sequence": (st.one_of(
        lstm_sequence_inputs(min_size=0, batch_first=None, masks=None, projection=None,
                             layer_norm=None),
        lstm_sequence_inputs(reverse=None, batch_first=None, masks=None, projection=None,
                             layer_norm=None)), LSTM_SEQ)}


def _jvp_call(op, case, arrays, tangents, backend=None):
    """``gc.<op>_jvp`` on the case (its optional weights and settings by keyword)."""
    return getattr(gc, f"{op}_jvp")(*(case[k] for k in arrays), tangents,
                                    **{k: v for k, v in case.items() if k not in arrays},
                                    backend=backend)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("op", sorted(_GPU_JVP))
@given(data=st.data(), wanted=st.tuples(*[st.booleans()] * 10), seed=st.integers(0, 2**16))
def test_gpu_forward_mode_agrees_with_reference(op, dtype, data, wanted, seed):
    """The GPU backend's JVPs (chosen by default for CuPy arrays) against the reference's on
    CuPy in float64, primal and tangent, every option of the cell."""
    strategy, arrays = _GPU_JVP[op]
    case = data.draw(strategy)
    if dtype != np.float64 and case.get("layer_norm") is not None:
        return  # a norm amplifies rounding: the layer norm at float64 here (the emulation
        # checks float32 and float16 with its layer-norm rule,
        # tests/contracts/test_jvp_cuda_emulation.py)
    case = on_gpu(case, dtype)
    case64 = float64(case)
    assert hasattr(GPU_BACKEND, f"{op}_jvp")
    assert gc._dispatch.backend_for(None, "cupy") is GPU_BACKEND
    grads = gc.cells.OPS[op].grads
    rng = np.random.default_rng(seed)
    def draw(a):
        if isinstance(a, gc.LSTMNorm):
            return gc.LSTMNorm(*(draw(p) for p in a))
        return cp.asarray(rng.standard_normal(a.shape).astype(dtype))

    # strict=False: ``wanted`` holds a flag for each of the LSTM's ten fields; the GRU and the
    # plain RNN have fewer
    tangents = grads(*(draw(case[k]) if on and case.get(k) is not None else None
                       for k, on in zip(grads._fields, wanted, strict=False)))
    result, d_result = _jvp_call(op, case, arrays, tangents)
    tangents64 = type(tangents)(*(None if t is None else type(t)(*(p.astype(cp.float64)
                                  for p in t)) if isinstance(t, gc.LSTMNorm)
                                  else t.astype(cp.float64) for t in tangents))
    expected, d_expected = _jvp_call(op, case64, arrays, tangents64, "reference")
    assert_close(result, expected, dtype, "primal ")
    assert_close(d_result, d_expected, dtype, "tangent ")


@pytest.mark.parametrize("op", sorted(_GPU_JVP))
def test_gpu_forward_mode_matches_finite_differences(op):
    case = on_library(OPS[op][0](np.random.default_rng(8)), "cupy")
    gc.testing.jvp_check(op, case, backend="gpu").raise_if_failed()
