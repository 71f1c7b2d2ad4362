"""Bad input (docs/spec.md §7): every case raises TypeError or ValueError naming the argument,
before anything is computed; empty inputs are valid."""

import sys
import types

import numpy as np
import pytest
from conftest import StandInDevice

import gradcells as gc
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import gru_cell_case, lstm_cell_case

LSTM_ARGS = ("x", "cs_prev", "h_prev", "w", "b")
GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")


def lstm_inputs(peephole=False, **kw):
    case = lstm_cell_case(np.random.default_rng(0), peephole=peephole, **kw)
    args = {k: case[k] for k in LSTM_ARGS}
    peeps = {k: case[k] for k in PEEPHOLES} if peephole else {}
    return args, peeps


def gru_inputs(reset_after=False):
    case = gru_cell_case(np.random.default_rng(0), reset_after=reset_after)
    return {k: case[k] for k in GRU_ARGS}


@pytest.mark.parametrize(("name", "bad", "pattern"), [
    ("x", np.zeros(3), r"x must be a 2-D array \[B, I\], got shape \(3,\)"),
    ("cs_prev", np.zeros((3, 5, 1)), r"cs_prev must be a 2-D array \[B, H\]"),
    ("h_prev", np.zeros((2, 5)), r"h_prev must have shape \[B, H\] = \(3, 5\), got \(2, 5\)"),
    ("h_prev", np.zeros((3, 4)), r"h_prev must have shape \[B, H\] = \(3, 5\), got \(3, 4\)"),
    ("w", np.zeros((8, 20)), r"w must have shape \[I\+H, 4H\] = \(9, 20\), got \(8, 20\)"),
    ("w", np.zeros((9, 16)), r"w must have shape \[I\+H, 4H\] = \(9, 20\), got \(9, 16\)"),
    ("b", np.zeros((1, 20)), r"b must have shape \[4H\] = \(20,\), got \(1, 20\)"),
    ("b", np.zeros(5), r"b must have shape \[4H\] = \(20,\), got \(5,\)"),
])
def test_lstm_shapes(name, bad, pattern):
    args, _ = lstm_inputs()
    args[name] = bad
    with pytest.raises(ValueError, match=pattern):
        gc.lstm_cell(*args.values())


@pytest.mark.parametrize("name", list(PEEPHOLES))
def test_lstm_peephole_shape(name):
    args, peeps = lstm_inputs(peephole=True)
    peeps[name] = np.zeros(4)
    with pytest.raises(ValueError, match=rf"{name} must have shape \[H\] = \(5,\), got \(4,\)"):
        gc.lstm_cell(*args.values(), **peeps)


@pytest.mark.parametrize("given", [("wci",), ("wcf", "wco"), ("wco",)])
def test_partial_peepholes(given):
    args, peeps = lstm_inputs(peephole=True)
    partial = {k: peeps[k] for k in given}
    with pytest.raises(ValueError, match="peepholes need all of wci, wcf and wco or none"):
        gc.lstm_cell(*args.values(), **partial)
    state = gc.lstm_cell(*args.values())
    with pytest.raises(ValueError, match="without"):
        gc.lstm_cell_grad(*args.values(), state, **partial)


@pytest.mark.parametrize("name", LSTM_ARGS)
def test_mixed_dtypes(name):
    args, _ = lstm_inputs()
    args[name] = args[name].astype(np.float32)
    with pytest.raises(TypeError, match=r"must have the same dtype as") as error:
        gc.lstm_cell(*args.values())
    message = str(error.value)
    assert name in message and "float32" in message and "float64" in message


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.complex128, np.bool_, object])
@pytest.mark.parametrize("name", ["x", "w"])
def test_unsupported_dtypes(dtype, name):
    """The first array (x, which sets the dtype the others must share) and a later one."""
    args, _ = lstm_inputs()
    args[name] = args[name].astype(dtype)
    with pytest.raises(TypeError, match=rf"{name} must have dtype float32 or float64, got"):
        gc.lstm_cell(*args.values())


@pytest.mark.parametrize("op", ["gru_cell", "lstm_sequence", "gru_sequence"])
def test_an_integer_x_is_named_by_every_op(op):
    x = np.zeros((2, 3, 4), np.int64) if op.endswith("sequence") else np.zeros((3, 4), np.int64)
    h = np.zeros((3, 5))
    args = {"gru_cell": (x, h, np.zeros((9, 10)), np.zeros((9, 5)), np.zeros(10), np.zeros(5)),
            "lstm_sequence": (x, h, h, np.zeros((9, 20)), np.zeros(20)),
            "gru_sequence": (x, h, np.zeros((9, 10)), np.zeros((9, 5)), np.zeros(10),
                             np.zeros(5))}[op]
    with pytest.raises(TypeError, match=r"^x must have dtype float32 or float64, got int64"):
        getattr(gc, op)(*args)


@pytest.mark.parametrize("bad", [[[1.0, 2.0]], 3.0, "x", "matrix", "masked"])
def test_non_arrays(bad):
    args, _ = lstm_inputs()
    if bad == "matrix":
        with pytest.warns(PendingDeprecationWarning):
            bad = np.matrix(np.zeros((3, 4)))
    elif bad == "masked":
        bad = np.ma.masked_array(args["x"], mask=np.zeros(args["x"].shape, bool))
    args["x"] = bad
    with pytest.raises(TypeError, match="x must be a NumPy or CuPy array, got"):
        gc.lstm_cell(*args.values())


def test_required_array_missing():
    args, _ = lstm_inputs()
    args["b"] = None
    with pytest.raises(TypeError, match="b must be an array, got None"):
        gc.lstm_cell(*args.values())


class _FakeCupyArray:
    """Stands in for a CuPy array: the check must refuse to mix libraries before any math."""

    def __init__(self, a):
        self.shape, self.dtype, self.ndim = a.shape, a.dtype, a.ndim


def test_arrays_from_two_libraries(monkeypatch):
    fake = types.ModuleType("cupy")
    fake.ndarray = _FakeCupyArray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    args, _ = lstm_inputs()
    args["h_prev"] = _FakeCupyArray(args["h_prev"])
    with pytest.raises(TypeError, match=r"x and h_prev come from two array libraries "
                                        r"\(numpy and cupy\)"):
        gc.lstm_cell(*args.values())


class _FakeCupyLengths:
    """Stands in for a CuPy ``seq_len`` that records the current device when it is reduced
    (CuPy reduces on the current device, which needs peer access to another)."""

    def __init__(self, values, device):
        self.values, self.shape, self.dtype = values, values.shape, values.dtype
        self.device = StandInDevice(device)
        self.reduced_on = []

    def min(self):
        self.reduced_on.append(StandInDevice.current)
        return self.values.min()

    def max(self):
        self.reduced_on.append(StandInDevice.current)
        return self.values.max()


def test_cupy_lengths_are_read_on_their_own_device(monkeypatch):
    from gradcells import _validate

    fake = types.ModuleType("cupy")
    fake.ndarray = _FakeCupyLengths
    monkeypatch.setitem(sys.modules, "cupy", fake)
    x = types.SimpleNamespace(shape=(3, 2, 1), device=StandInDevice(1))
    lengths = _FakeCupyLengths(np.array([1, 2], np.int32), device=1)
    assert _validate.seq_len_value(lengths, "cupy", x) is lengths
    assert lengths.reduced_on == [1, 1]
    elsewhere = _FakeCupyLengths(np.array([1, 2], np.int32), device=0)
    with pytest.raises(ValueError, match="seq_len is on CUDA device 0 but x is on device 1"):
        _validate.seq_len_value(elsewhere, "cupy", x)


@pytest.mark.parametrize(("attr", "value", "error", "pattern"), [
    ("forget_bias", float("nan"), ValueError, "forget_bias must be finite, got nan"),
    ("forget_bias", float("inf"), ValueError, "forget_bias must be finite"),
    ("forget_bias", "1.0", TypeError, "forget_bias must be a real number, got str"),
    ("forget_bias", True, TypeError, "forget_bias must be a real number, got bool"),
    ("cell_clip", float("nan"), ValueError, "cell_clip must be finite, got nan"),
    ("cell_clip", float("-inf"), ValueError, "cell_clip must be finite"),
    ("cell_clip", [3.0], TypeError, "cell_clip must be a real number, got list"),
    ("backend", "gpu", ValueError, r"backend='gpu' takes cupy arrays, got numpy arrays"),
    ("backend", "numba", ValueError, r"backend must be None or one of"),
])
def test_bad_attributes(attr, value, error, pattern):
    args, _ = lstm_inputs()
    with pytest.raises(error, match=pattern):
        gc.lstm_cell(*args.values(), **{attr: value})


def test_numpy_scalar_attributes_keep_the_dtype():
    args, _ = lstm_inputs()
    args = {k: v.astype(np.float32) for k, v in args.items()}
    state = gc.lstm_cell(*args.values(), forget_bias=np.float64(1.0),
                         cell_clip=np.float64(0.5))
    assert all(a.dtype == np.float32 for a in state)


@pytest.mark.parametrize("clip", [None, 0, 0.0, -1.0])
def test_no_clipping_spellings(clip):
    args, _ = lstm_inputs(scale=4.0)
    unclipped = gc.lstm_cell(*args.values())
    np.testing.assert_array_equal(gc.lstm_cell(*args.values(), cell_clip=clip).cs,
                                  unclipped.cs)


def test_bad_clip_grad():
    args, _ = lstm_inputs()
    state = gc.lstm_cell(*args.values())
    with pytest.raises(ValueError, match=r"clip_grad must be one of \('exact', "
                                         r"'straight_through'\), got 'straight'"):
        gc.lstm_cell_grad(*args.values(), state, clip_grad="straight")


def test_bad_state():
    args, _ = lstm_inputs()
    state = gc.lstm_cell(*args.values())
    with pytest.raises(TypeError, match=r"state must be a tuple of 7 arrays .* of length 4"):
        gc.lstm_cell_grad(*args.values(), tuple(state)[:4])
    with pytest.raises(TypeError, match="state must be a tuple of 7 arrays"):
        gc.lstm_cell_grad(*args.values(), None)
    bad = state._replace(co=state.co[:, :2])
    with pytest.raises(ValueError, match=r"state.co must have shape \[B, H\] = \(3, 5\)"):
        gc.lstm_cell_grad(*args.values(), bad)
    bad = state._replace(f=state.f.astype(np.float32))
    with pytest.raises(TypeError, match=r"state.f must have the same dtype"):
        gc.lstm_cell_grad(*args.values(), bad)


@pytest.mark.parametrize("name", ["d_h", "d_cs"])
def test_bad_upstream_gradient(name):
    args, _ = lstm_inputs()
    state = gc.lstm_cell(*args.values())
    with pytest.raises(ValueError, match=rf"{name} must have shape \[B, H\] = \(3, 5\)"):
        gc.lstm_cell_grad(*args.values(), state, **{name: np.zeros((3, 4))})
    with pytest.raises(TypeError, match=rf"{name} must have the same dtype"):
        gc.lstm_cell_grad(*args.values(), state,
                          **{name: np.zeros((3, 5), dtype=np.float32)})


@pytest.mark.parametrize(("name", "bad", "pattern"), [
    ("x", np.zeros((3, 4, 1)), r"x must be a 2-D array \[B, I\]"),
    ("h_prev", np.zeros((2, 5)), r"h_prev must have shape \[B, H\] = \(3, 5\), got \(2, 5\)"),
    ("w_ru", np.zeros((9, 5)), r"w_ru must have shape \[I\+H, 2H\] = \(9, 10\), got \(9, 5\)"),
    ("w_c", np.zeros((9, 10)), r"w_c must have shape \[I\+H, H\] = \(9, 5\), got \(9, 10\)"),
    ("b_ru", np.zeros(5), r"b_ru must have shape \[2H\] = \(10,\), got \(5,\)"),
    ("b_c", np.zeros(10), r"^b_c has shape \[2H\] = \(10,\), the reset-after layout: pass "
                          r"reset_after=True \(B, I from x"),
])
def test_gru_shapes(name, bad, pattern):
    args = gru_inputs()
    args[name] = bad
    with pytest.raises(ValueError, match=pattern):
        gc.gru_cell(*args.values())


def test_gru_reset_after_bias_and_flag():
    args = gru_inputs(reset_after=False)
    with pytest.raises(ValueError, match=r"^b_c has shape \[H\] = \(5,\), the reset-before "
                                         r"layout \(TensorFlow's block cell\): pass "
                                         r"reset_after=False"):
        gc.gru_cell(*args.values(), reset_after=True)
    with pytest.raises(TypeError, match="reset_after must be a bool, got str"):
        gc.gru_cell(*args.values(), reset_after="yes")


def test_gru_grad_bad_inputs():
    args = gru_inputs()
    state = gc.gru_cell(*args.values())
    with pytest.raises(ValueError, match=r"d_h must have shape \[B, H\] = \(3, 5\)"):
        gc.gru_cell_grad(*args.values(), state, d_h=np.zeros((3, 1)))
    with pytest.raises(TypeError, match=r"state must be a tuple of 4 arrays"):
        gc.gru_cell_grad(*args.values(), tuple(state) + (state.h,), d_h=state.h)
    with pytest.raises(TypeError, match=r"d_h must have the same dtype"):
        gc.gru_cell_grad(*args.values(), state, d_h=state.h.astype(np.float32))


@pytest.mark.parametrize(("batch", "input_size"), [(0, 4), (3, 0), (0, 0)])
def test_empty_inputs_are_valid(batch, input_size):
    rng = np.random.default_rng(1)
    case = lstm_cell_case(rng, batch=batch, input_size=input_size, hidden=3, peephole=True)
    args = [case[k] for k in LSTM_ARGS]
    peeps = {k: case[k] for k in PEEPHOLES}
    state = gc.lstm_cell(*args, **peeps, cell_clip=1.0)
    assert all(a.shape == (batch, 3) for a in state)
    grads = gc.lstm_cell_grad(*args, state, d_h=np.ones((batch, 3)), **peeps, cell_clip=1.0)
    for name, g in zip(gc.LSTMCellGrads._fields, grads, strict=True):
        assert g.shape == case[name].shape if name in case else g is None  # no w_proj
    if batch == 0:
        assert not np.any(grads.w) and not np.any(grads.b) and not np.any(grads.wci)

    g = gru_cell_case(rng, batch=batch, input_size=input_size, hidden=3)
    gargs = [g[k] for k in GRU_ARGS]
    gstate = gc.gru_cell(*gargs)
    assert all(a.shape == (batch, 3) for a in gstate)
    ggrads = gc.gru_cell_grad(*gargs, gstate, d_h=np.ones((batch, 3)))
    for name, grad in zip(gc.GRUCellGrads._fields, ggrads, strict=True):
        assert grad.shape == g[name].shape


def test_errors_leave_inputs_untouched():
    args, peeps = lstm_inputs(peephole=True)
    before = {k: v.copy() for k, v in {**args, **peeps}.items()}
    with pytest.raises(ValueError, match="forget_bias must be finite, got nan"):
        gc.lstm_cell(*args.values(), **peeps, forget_bias=float("nan"))
    for k, v in {**args, **peeps}.items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_attributes_beyond_the_dtype_range(backend):
    """float32 arrays: a forget bias that float32 cannot hold is rejected (it would be inf);
    a clip beyond float32's range can never act, so it means no clipping, without warnings."""
    args, _ = lstm_inputs()
    args = {k: v.astype(np.float32) for k, v in args.items()}
    message = (r"forget_bias must be finite in the arrays' dtype float32 "
               r"\(\|forget_bias\| <= 3\.403e\+38\), got 1e\+300")
    with pytest.raises(ValueError, match=message):
        gc.lstm_cell(*args.values(), forget_bias=1e300, backend=backend)
    unclipped = gc.lstm_cell(*args.values(), backend=backend)
    huge = gc.lstm_cell(*args.values(), cell_clip=1e300, backend=backend)
    for a, b in zip(huge, unclipped, strict=True):
        np.testing.assert_array_equal(a, b)
    assert gc.lstm_cell(*(a.astype(np.float64) for a in args.values()), forget_bias=1e300,
                        backend=backend).f.dtype == np.float64      # float64 holds it


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_integers_beyond_float64_are_judged_not_overflowed(backend):
    """A Python integer no float can hold is a ValueError for forget_bias and no clipping for
    cell_clip, as any number beyond the dtype's range is; never an OverflowError."""
    args, _ = lstm_inputs()
    with pytest.raises(ValueError, match=r"forget_bias must be finite in the arrays' dtype "
                                         r"float64 .*got an integer of 1329 bits"):
        gc.lstm_cell(*args.values(), forget_bias=-10**400, backend=backend)
    unclipped = gc.lstm_cell(*args.values(), backend=backend)
    for clip in (10**400, -10**400):
        for a, b in zip(gc.lstm_cell(*args.values(), cell_clip=clip, backend=backend), unclipped,
                        strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_shape_error_says_where_the_sizes_came_from():
    """H is read from cs_prev: when cs_prev is the wrong one, the message must still name it."""
    args, _ = lstm_inputs()
    B, H = args["cs_prev"].shape
    args["cs_prev"] = np.zeros((B, H + 1))
    with pytest.raises(ValueError, match=rf"h_prev must have shape \[B, H\] = \({B}, {H + 1}\), "
                                         rf"got \({B}, {H}\) \(B, I from x \({B}, \d+\), "
                                         rf"H from cs_prev \({B}, {H + 1}\)\)"):
        gc.lstm_cell(*args.values())


def test_zero_dimensional_attributes_are_numbers():
    """0-d integer or float arrays (a PyTorch or JAX scalar arrives as one) count as numbers;
    a 1-element vector or a 0-d bool does not."""
    args, _ = lstm_inputs()
    plain = gc.lstm_cell(*args.values(), forget_bias=0.5, cell_clip=0.75)
    as_arrays = gc.lstm_cell(*args.values(), forget_bias=np.array(0.5), cell_clip=np.array(0.75))
    for a, b in zip(as_arrays, plain, strict=True):
        np.testing.assert_array_equal(a, b)
    for bad in (np.array([0.5]), np.array(True)):
        with pytest.raises(TypeError, match="forget_bias must be a real number, got ndarray"):
            gc.lstm_cell(*args.values(), forget_bias=bad)
