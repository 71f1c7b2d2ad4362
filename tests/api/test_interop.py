"""Any array in: PyTorch tensors and JAX arrays on the CPU give the NumPy path's values,
come back in the caller's library, and cross through DLPack without copies where it allows.

Skips cleanly without PyTorch or JAX. Importing gradcells imports neither.
"""

import subprocess
import sys
import warnings

import numpy as np
import pytest

import gradcells as gc
from gradcells import _interop
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import gru_cell_case, lstm_cell_case

CELL_OPS = ["lstm_cell", "lstm_cell_grad", "gru_cell", "gru_cell_grad"]


def _numpy_call(op, rng, dtype):
    """(function, args, kwargs) of one public cell op on a NumPy case, forward state included."""
    if op.startswith("lstm"):
        case = lstm_cell_case(rng, dtype=dtype, peephole=True, clip=True)
        arrays = [case[k] for k in ("x", "cs_prev", "h_prev", "w", "b")]
        peeps = {k: case[k] for k in PEEPHOLES}
        if op == "lstm_cell":
            return gc.lstm_cell, arrays, {**peeps, "forget_bias": 0.5,
                                          "cell_clip": case["cell_clip"]}
        state = gc.lstm_cell(*arrays, **peeps, cell_clip=case["cell_clip"])
        d_h = rng.standard_normal(state.h.shape).astype(dtype)
        return gc.lstm_cell_grad, arrays + [state], {**peeps, "d_h": d_h, "d_cs": None,
                                                    "cell_clip": case["cell_clip"]}
    case = gru_cell_case(rng, dtype=dtype, reset_after=True)
    arrays = [case[k] for k in ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")]
    if op == "gru_cell":
        return gc.gru_cell, arrays, {"reset_after": True}
    state = gc.gru_cell(*arrays, reset_after=True)
    d_h = rng.standard_normal(state.h.shape).astype(dtype)
    return gc.gru_cell_grad, arrays + [state], {"d_h": d_h, "reset_after": True}


def _convert(value, to_library):
    if isinstance(value, tuple):
        items = [_convert(v, to_library) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return to_library(value) if isinstance(value, np.ndarray) else value


def _assert_same_values(result, expected, is_foreign, to_numpy):
    assert type(result) is type(expected)
    for got, want in zip(result, expected, strict=True):
        if want is None:
            assert got is None
            continue
        assert is_foreign(got), type(got)
        np.testing.assert_array_equal(to_numpy(got), want)


def test_import_gradcells_imports_neither_torch_nor_jax():
    code = ("import sys, numpy as np, gradcells as gc; "
            "x = np.zeros((2, 3)); h = np.zeros((2, 4)); "
            "gc.lstm_cell(x, h, h, np.zeros((7, 16)), np.zeros(16)); "
            "print(sorted(m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_numpy_calls_pass_through_untouched(rng):
    seen = []

    @_interop.accepts_any_array
    def identity(*args, **kwargs):
        seen.append((args, kwargs))
        return args

    a, b = rng.standard_normal(3), rng.standard_normal(2)
    assert identity(a, None, 1.0, (a, b), key=b)[0] is a
    args, kwargs = seen[0]
    assert args[0] is a and args[3][1] is b and kwargs["key"] is b


# ---------------------------------------------------------------------------------------------
# PyTorch


@pytest.mark.conformance
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", CELL_OPS)
def test_torch_tensors_give_numpy_values_as_tensors(torch, rng, op, dtype):
    func, args, kwargs = _numpy_call(op, rng, dtype)
    expected = func(*args, **kwargs)
    result = func(*_convert(tuple(args), torch.from_numpy),
                  **{k: _convert(v, torch.from_numpy) for k, v in kwargs.items()})
    _assert_same_values(result, expected, lambda a: isinstance(a, torch.Tensor),
                        lambda a: a.numpy())


@pytest.fixture
def unwarned(monkeypatch):
    """The once-per-process detach warning not yet given (whatever ran before)."""
    monkeypatch.setattr(_interop, "_warned_detached", False, raising=False)


DETACHED = r"requires grad, but the result is detached from autograd.*use gradcells\.torch"


def _detach_warnings(call):
    """The detach warnings ``call()`` gives, every warning recorded (no filter hides one)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if "detached from autograd" in str(w.message)]


@pytest.mark.conformance
def test_torch_tensors_that_require_grad_are_detached(torch, rng, unwarned):
    func, args, kwargs = _numpy_call("gru_cell", rng, np.float64)
    tensors = [torch.from_numpy(a).requires_grad_() for a in args]
    with pytest.warns(UserWarning, match=DETACHED):
        state = func(*tensors, **kwargs)
    assert not any(t.requires_grad for t in state)
    np.testing.assert_array_equal(state.h.numpy(), func(*args, **kwargs).h)


@pytest.mark.conformance
def test_detaching_a_tensor_that_requires_grad_warns_once(torch, rng, unwarned):
    func, args, kwargs = _numpy_call("gru_cell", rng, np.float64)
    plain = [torch.from_numpy(a) for a in args]
    assert _detach_warnings(lambda: func(*args, **kwargs)) == []     # NumPy: nothing
    assert _detach_warnings(lambda: func(*plain, **kwargs)) == []    # no grad: nothing
    leaves = [torch.from_numpy(a).requires_grad_() for a in args]
    with pytest.warns(UserWarning, match="^x " + DETACHED) as record:
        func(*leaves, **kwargs)
    assert [w.filename for w in record if "detached" in str(w.message)] == [__file__]
    # Once per process: not again, for this function or another.
    again = [t.detach().requires_grad_() for t in plain]
    assert _detach_warnings(lambda: func(*again, **kwargs)) == []
    grad, grad_args, grad_kwargs = _numpy_call("gru_cell_grad", rng, np.float64)
    as_leaf = lambda a: torch.from_numpy(a).requires_grad_()  # noqa: E731
    assert _detach_warnings(lambda: grad(*_convert(tuple(grad_args), as_leaf), **{
        k: _convert(v, as_leaf) for k, v in grad_kwargs.items()})) == []


@pytest.mark.conformance
def test_torch_inputs_and_results_cross_without_copies(torch):
    @_interop.accepts_any_array
    def identity(a, pair):
        assert isinstance(a, np.ndarray) and isinstance(pair[0], np.ndarray)
        return a, pair[0], np.ones(3)

    t, u = torch.randn(4, 3, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    same_t, same_u, fresh = identity(t.t(), (u, None))          # a strided view, too
    assert same_t.data_ptr() == t.data_ptr() and same_t.stride() == t.t().stride()
    assert same_u.data_ptr() == u.data_ptr()
    assert isinstance(fresh, torch.Tensor) and fresh.dtype == torch.float64


@pytest.mark.conformance
def test_torch_results_share_the_backend_arrays_memory(torch):
    produced = []

    @_interop.accepts_any_array
    def compute(a):
        produced.append(np.asarray(a) * 2.0)
        return produced[-1], (produced[-1][1:], None)

    result, (tail, nothing) = compute(torch.arange(4, dtype=torch.float64))
    assert result.data_ptr() == produced[0].ctypes.data
    assert tail.data_ptr() == produced[0][1:].ctypes.data and nothing is None
    np.testing.assert_array_equal(result.numpy(), [0.0, 2.0, 4.0, 6.0])


@pytest.mark.conformance
def test_torch_tensor_mixed_with_numpy_array_is_a_type_error(torch, rng):
    _, args, kwargs = _numpy_call("lstm_cell", rng, np.float64)
    mixed = [torch.from_numpy(args[0])] + args[1:]
    with pytest.raises(TypeError, match=r"^x and cs_prev come from two array libraries "
                                        r"\(torch and numpy\); pass arrays of one library$"):
        gc.lstm_cell(*mixed)


@pytest.mark.conformance
def test_numpy_x_with_a_torch_weight_is_the_validation_type_error(torch, rng):
    _, args, _ = _numpy_call("lstm_cell", rng, np.float64)
    args[3] = torch.from_numpy(args[3])
    with pytest.raises(TypeError, match=r"^x and w come from two array libraries "
                                        r"\(numpy and torch\); pass arrays of one library$"):
        gc.lstm_cell(*args)


@pytest.mark.conformance
def test_torch_sequences_and_integer_seq_len(torch, rng):
    T, B, I, H = 3, 4, 2, 5
    case = gru_cell_case(rng, batch=B, input_size=I, hidden=H, reset_after=True)
    weights = [case[k] for k in ("w_ru", "w_c", "b_ru", "b_c")]
    x, seq_len = rng.standard_normal((T, B, I)), np.array([3, 0, 2, 1])
    d_h = rng.standard_normal((T, B, H))
    seq = gc.gru_sequence(x, case["h_prev"], *weights, reset_after=True, seq_len=seq_len)
    grads = gc.gru_sequence_grad(x, case["h_prev"], *weights, seq, d_h=d_h, reset_after=True,
                                 seq_len=seq_len)
    t = torch.from_numpy
    seq_t = gc.gru_sequence(t(x), t(case["h_prev"]), *map(t, weights), reset_after=True,
                            seq_len=t(seq_len))
    _assert_same_values(seq_t, seq, lambda a: isinstance(a, torch.Tensor), lambda a: a.numpy())
    grads_t = gc.gru_sequence_grad(t(x), t(case["h_prev"]), *map(t, weights), seq_t,
                                   d_h=t(d_h), reset_after=True, seq_len=t(seq_len))
    _assert_same_values(grads_t, grads, lambda a: isinstance(a, torch.Tensor),
                        lambda a: a.numpy())


_REVERSED_SEQUENCE = """
import numpy as np, torch, jax, jax.numpy as jnp
import gradcells as gc
jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(0)
a = [rng.standard_normal(s) for s in ((3, 2, 2), (2, 4), (6, 4), (4,))]
want = gc.rnn_sequence(*a, reverse=True)
for convert in (torch.from_numpy, jnp.asarray):
    got = gc.rnn_sequence(*map(convert, a), reverse=True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
print("ok")
"""


@pytest.mark.conformance
def test_reversed_sequences_come_back_as_tensors_and_jax_arrays(torch, jax):
    """A reversed sequence's per-step results are flipped views (negative strides), which
    PyTorch's DLPack import aborts the process on; they come back copied. In a subprocess,
    so that a regression fails this test instead of ending the run."""
    run = subprocess.run([sys.executable, "-c", _REVERSED_SEQUENCE], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


@pytest.mark.conformance
def test_torch_validation_errors_name_the_argument(torch, rng):
    _, args, _ = _numpy_call("lstm_cell", rng, np.float64)
    tensors = [torch.from_numpy(a) for a in args]
    tensors[3] = tensors[3][:-1]
    with pytest.raises(ValueError, match="w must have shape"):
        gc.lstm_cell(*tensors)
    with pytest.raises(TypeError, match="x: a torch.bfloat16 tensor"):
        gc.lstm_cell(torch.zeros(2, 3, dtype=torch.bfloat16), *tensors[1:])
    # The backend mismatch is of the converted arrays, and says what they were passed as.
    with pytest.raises(ValueError, match=r"backend='gpu' takes cupy arrays, got numpy arrays "
                                         r"\(converted from the torch arrays passed\)"):
        gc.lstm_cell(*(torch.from_numpy(a) for a in args), backend="gpu")


@pytest.mark.conformance
def test_torch_empty_batch(torch, rng):
    _, args, kwargs = _numpy_call("gru_cell", rng, np.float64)
    args = [a[:0] if k < 2 else a for k, a in enumerate(args)]
    state = gc.gru_cell(*(torch.from_numpy(np.ascontiguousarray(a)) for a in args), **kwargs)
    assert all(isinstance(t, torch.Tensor) and t.shape == (0, args[1].shape[1]) for t in state)


# ---------------------------------------------------------------------------------------------
# JAX (float32: JAX's default without jax_enable_x64, which this file leaves alone)


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_platforms", "cpu")
    return jax


@pytest.mark.conformance
@pytest.mark.parametrize("op", CELL_OPS)
def test_jax_arrays_give_numpy_values_as_jax_arrays(jax, rng, op):
    func, args, kwargs = _numpy_call(op, rng, np.float32)
    expected = func(*args, **kwargs)
    result = func(*_convert(tuple(args), jax.numpy.asarray),
                  **{k: _convert(v, jax.numpy.asarray) for k, v in kwargs.items()})
    _assert_same_values(result, expected, lambda a: isinstance(a, jax.Array), np.asarray)


@pytest.mark.conformance
def test_jax_inputs_cross_without_copies(jax):
    seen = []

    @_interop.accepts_any_array
    def identity(a):
        seen.append(a)
        return a

    a = jax.numpy.arange(12, dtype=jax.numpy.float32).reshape(3, 4)
    out = identity(a)
    assert isinstance(seen[0], np.ndarray)
    assert seen[0].ctypes.data == a.unsafe_buffer_pointer()
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(a))


@pytest.mark.conformance
def test_jax_tracers_are_a_type_error(jax, rng):
    _, args, kwargs = _numpy_call("gru_cell", rng, np.float32)

    rest = [jax.numpy.asarray(a) for a in args[1:]]

    def h_of(x):
        return gc.gru_cell(x, *rest, **kwargs).h

    with pytest.raises(TypeError, match="x is a traced JAX value"):
        jax.jit(h_of)(jax.numpy.asarray(args[0]))


# ---------------------------------------------------------------------------------------------
# The TensorFlow mirrors take tensors and JAX arrays like the public API


def _tf_compat_calls(rng):
    """(name, args) of every ``tf_compat`` mirror on one float32 NumPy case; the sequence
    ops with ``seq_len_max`` = 2 of T = 4 and TF-style garbage past it in the saved outputs."""
    from gradcells import tf_compat as tc

    T, B, I, H = 4, 3, 2, 5
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    x, cs, h, w, b = f32(T, B, I), f32(B, H), f32(B, H), 0.3 * f32(I + H, 4 * H), f32(4 * H)
    peepholes = [f32(H), f32(H), f32(H)]
    lstm = (cs, h, w, *peepholes, b)
    cell = tc.lstm_block_cell(x[0], *lstm, cell_clip=1.0, use_peephole=True)
    gru = (x[0], h, 0.3 * f32(I + H, 2 * H), 0.3 * f32(I + H, H), f32(2 * H), f32(H))
    r, u, c, _ = tc.gru_block_cell(*gru)
    block = tc.block_lstm(2, x, *lstm, use_peephole=True)
    garbage = [a.copy() for a in block]
    for a in garbage:
        a[2:] = 1e3
    d = f32(T, B, H)
    return [
        ("lstm_block_cell", (x[0], *lstm, 1.0, 1.0, True)),
        ("lstm_block_cell_grad", (x[0], *lstm, *cell[:6], f32(B, H), f32(B, H), True)),
        ("gru_block_cell", gru),
        ("gru_block_cell_grad", (*gru, r, u, c, f32(B, H))),
        ("block_lstm", (2, x, *lstm, 1.0, 3.0, True)),
        ("block_lstm_v2", (2, x, *lstm, 0.5, False)),
        ("block_lstm_grad", (2, x, *lstm, *garbage, d, d, True)),
        ("block_lstm_grad_v2", (2, x, *lstm, *garbage, d, d, False)),
    ]


@pytest.mark.conformance
@pytest.mark.parametrize("index", range(8))
def test_tf_compat_mirrors_take_torch_tensors(torch, rng, index):
    from gradcells import tf_compat as tc

    name, args = _tf_compat_calls(rng)[index]
    expected = getattr(tc, name)(*args)
    result = getattr(tc, name)(*_convert(args, torch.from_numpy))
    _assert_same_values(result, expected, lambda a: isinstance(a, torch.Tensor),
                        lambda a: a.numpy())


@pytest.mark.conformance
@pytest.mark.parametrize("index", range(8))
def test_tf_compat_mirrors_take_jax_arrays(jax, rng, index):
    from gradcells import tf_compat as tc

    name, args = _tf_compat_calls(rng)[index]
    expected = getattr(tc, name)(*args)
    result = getattr(tc, name)(*_convert(args, jax.numpy.asarray))
    _assert_same_values(result, expected, lambda a: isinstance(a, jax.Array), np.asarray)


@pytest.mark.conformance
def test_tf_compat_seq_len_max_is_checked_for_tensors(torch, rng):
    from gradcells import tf_compat as tc

    name, args = _tf_compat_calls(rng)[4]
    tensors = _convert(args, torch.from_numpy)
    with pytest.raises(ValueError, match=r"seq_len_max must be in \[0, T\] = \[0, 4\], got 7"):
        tc.block_lstm(7, *tensors[1:])
    short = tc.block_lstm(torch.tensor(2), *tensors[1:])     # a 0-d integer tensor
    assert not short.h[2:].any() and short.h[:2].any()


@pytest.mark.conformance
def test_the_float_arrays_decide_the_library_not_an_integer_one(torch, jax, rng):
    """A torch ``seq_len`` passed first (by keyword) among NumPy floats is the validation's
    TypeError, as in any other position; among JAX floats the results are JAX arrays."""
    T, B, I, H = 3, 2, 2, 4
    x, cs0, h0 = rng.standard_normal((T, B, I)), np.zeros((B, H)), np.zeros((B, H))
    w, b = 0.3 * rng.standard_normal((I + H, 4 * H)), np.zeros(4 * H)
    lengths = torch.tensor([3, 1])
    with pytest.raises(TypeError, match="seq_len must be a numpy integer array"):
        gc.lstm_sequence(seq_len=lengths, x=x, cs0=cs0, h0=h0, w=w, b=b)
    x32, cs32, h32, w32, b32 = (jax.numpy.asarray(a.astype(np.float32))
                                for a in (x, cs0, h0, w, b))
    seq = gc.lstm_sequence(seq_len=lengths, x=x32, cs0=cs32, h0=h32, w=w32, b=b32)
    assert isinstance(seq.h, jax.Array)
    expected = gc.lstm_sequence(*(np.asarray(a) for a in (x32, cs32, h32, w32, b32)),
                                seq_len=np.array([3, 1]))
    np.testing.assert_array_equal(np.asarray(seq.h), expected.h)
