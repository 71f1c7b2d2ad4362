"""The Numba CPU backend against the reference backend, and its own guarantees.

Agreement: every output and every gradient of the LSTM and GRU cells, on the Hypothesis
strategies of ``gradcells.testing`` (sizes from 0, hidden sizes past the SIMD width so that
both the vector loop and its scalar remainder run): float64 to 1e-12 relative; float32 no
further from the exact (float64) result than three times the float32 reference's own error
plus four float32 ulps of the array's scale. The plain RNN's cell and sequence are held to
the same bounds on many seeded random cases (``gradcells.testing.random_rnn_cell_case``,
``random_rnn_sequence_case``) and on sizes past the SIMD width. Finite differences, purity,
memory layouts and extreme inputs are also covered for ``backend="cpu"`` by
test_gradients.py and test_purity.py (parametrized over every NumPy backend); the checks
here are the CPU backend's own: empty sizes, read-only inputs, threads, the kernels'
contracts and that the hot loops are SIMD.
"""

import re
import subprocess
import sys
import threading

import backend_calls
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from simd import assert_packed, host_has_avx

import gradcells as gc
from gradcells import _dispatch
from gradcells.cells.gru import _cpu_kernels as _gru_kernels
from gradcells.cells.lstm import _cpu_kernels as _lstm_kernels
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.cells.rnn import _cpu_kernels as _rnn_kernels
from gradcells.testing import (
    gru_cell_case,
    gru_cell_inputs,
    lstm_cell_case,
    lstm_cell_inputs,
    random_rnn_cell_case,
    random_rnn_sequence_case,
    rnn_cell_case,
    rnn_sequence_case,
    vjp_check,
)

cpu_backend = _dispatch.backend_module("cpu")

LSTM_ARGS = ("x", "cs_prev", "h_prev", "w", "b")
GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
RNN_ARGS = ("x", "h_prev", "w", "b")
RNN_SEQ_ARGS = ("x", "h0", "w", "b")
RNN_CASES = 150                      # seeded random cases per RNN agreement test
SIZES = {"min_size": 0, "max_batch": 6, "max_input": 6, "max_hidden": 21}
UPSTREAM = st.sampled_from(["both", "h", "cs", "none"])


def _cast(case, dtype):
    """The case's float arrays in ``dtype`` (integer lengths stay as they are)."""
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}


def _upstream(case, which, seed=0):
    rng = np.random.default_rng(seed)
    shape, dtype = case["h_prev"].shape, case["x"].dtype
    draw = lambda on: rng.standard_normal(shape).astype(dtype) if on else None  # noqa: E731
    return {"d_h": draw(which in ("both", "h")), "d_cs": draw(which in ("both", "cs"))}


def run_lstm(case, upstream, backend, clip_grad="exact"):
    args = [case[k] for k in LSTM_ARGS]
    peeps = {k: case[k] for k in PEEPHOLES}
    state = gc.lstm_cell(*args, **peeps, forget_bias=case["forget_bias"],
                         cell_clip=case["cell_clip"], backend=backend)
    grads = gc.lstm_cell_grad(*args, state, **upstream, **peeps, cell_clip=case["cell_clip"],
                              clip_grad=clip_grad, backend=backend)
    return state, grads


def lstm_grads_at(case, state, upstream, backend, clip_grad="exact"):
    """The gradient at a given forward state (so both backends mask the same clip)."""
    return gc.lstm_cell_grad(*[case[k] for k in LSTM_ARGS], state, **upstream,
                             **{k: case[k] for k in PEEPHOLES}, cell_clip=case["cell_clip"],
                             clip_grad=clip_grad, backend=backend)


def run_gru(case, d_h, backend):
    args = [case[k] for k in GRU_ARGS]
    state = gc.gru_cell(*args, reset_after=case["reset_after"], backend=backend)
    grads = gc.gru_cell_grad(*args, state, d_h=d_h, reset_after=case["reset_after"],
                             backend=backend)
    return state, grads


def assert_float64_agrees(actual, expected, name):
    assert actual.dtype == expected.dtype == np.float64, name
    assert actual.shape == expected.shape, name
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12 * scale, err_msg=name)


def assert_float32_agrees(actual, reference32, exact, name, amplification=1.0):
    """``actual`` (CPU, float32) is as close to ``exact`` (float64 reference on the same
    float32 inputs) as the float32 reference is, up to 4 ulps of the array's scale (times
    ``amplification``: what the computation multiplies a rounding error by, as a layer
    norm does by its row's ``r``).

    "As close" allows 3× the reference's error: the CPU's float32 tanh is within 1.33 ulp
    (``tests/contracts/test_cpu_activations.py``, every float32 input) where NumPy's is within about
    0.5 ulp, so every activation-borne error may be up to 2.7× larger."""
    assert actual.dtype == reference32.dtype == np.float32, name
    assert actual.shape == reference32.shape == exact.shape, name
    if actual.size == 0:
        return
    scale = float(np.abs(exact).max())
    reference_error = float(np.abs(reference32.astype(np.float64) - exact).max())
    error = float(np.abs(actual.astype(np.float64) - exact).max())
    bound = 3 * reference_error + 4 * amplification * np.finfo(np.float32).eps * scale
    assert error <= bound, f"{name}: error {error:.3g} > {bound:.3g}"


def pairs(*results):
    """(field name, arrays...) for every non-None field of matching NamedTuples."""
    for fields in zip(*results, strict=True):
        for name, *arrays in zip(fields[0]._fields, *fields, strict=True):
            if arrays[0] is not None:
                yield name, arrays


# --- agreement with the reference ----------------------------------------------------------

@given(case=lstm_cell_inputs(**SIZES), upstream=UPSTREAM,
       clip_grad=st.sampled_from(["exact", "straight_through"]))
def test_lstm_agrees_with_reference_float64(case, upstream, clip_grad):
    up = _upstream(case, upstream)
    want = run_lstm(case, up, "reference", clip_grad)
    got = run_lstm(case, up, "cpu", clip_grad)
    for name, (a, b) in pairs(got, want):
        assert_float64_agrees(a, b, name)


@given(case=lstm_cell_inputs(dtype=np.float32, **SIZES), upstream=UPSTREAM,
       clip_grad=st.sampled_from(["exact", "straight_through"]))
def test_lstm_agrees_with_reference_float32(case, upstream, clip_grad):
    up = _upstream(case, upstream)
    state32 = run_lstm(case, up, "reference")[0]
    exact_state = run_lstm(_cast(case, np.float64), _cast(up, np.float64), "reference")[0]
    got_state = run_lstm(case, up, "cpu")[0]
    for name, (a, b, e) in pairs([got_state], [state32], [exact_state]):
        assert_float32_agrees(a, b, e, name)
    # Gradients at one forward state, so that the clip masks are the same.
    want = lstm_grads_at(case, state32, up, "reference", clip_grad)
    got = lstm_grads_at(case, state32, up, "cpu", clip_grad)
    state64 = gc.LSTMCellState(*[a.astype(np.float64) for a in state32])
    exact = lstm_grads_at(_cast(case, np.float64), state64, _cast(up, np.float64),
                          "reference", clip_grad)
    for name, (a, b, e) in pairs([got], [want], [exact]):
        assert_float32_agrees(a, b, e, name)


@given(case=gru_cell_inputs(**SIZES), with_d_h=st.booleans())
def test_gru_agrees_with_reference_float64(case, with_d_h):
    d_h = _upstream(case, "h")["d_h"] if with_d_h else None
    for name, (a, b) in pairs(run_gru(case, d_h, "cpu"), run_gru(case, d_h, "reference")):
        assert_float64_agrees(a, b, name)


@given(case=gru_cell_inputs(dtype=np.float32, **SIZES))
def test_gru_agrees_with_reference_float32(case):
    d_h = _upstream(case, "h")["d_h"]
    args = [case[k] for k in GRU_ARGS]
    ra = case["reset_after"]
    state32 = gc.gru_cell(*args, reset_after=ra, backend="reference")
    args64 = [a.astype(np.float64) for a in args]
    state64 = gc.GRUCellState(*[a.astype(np.float64) for a in state32])
    results = {
        "cpu": (gc.gru_cell(*args, reset_after=ra, backend="cpu"),
                gc.gru_cell_grad(*args, state32, d_h=d_h, reset_after=ra, backend="cpu")),
        "reference": (state32,
                      gc.gru_cell_grad(*args, state32, d_h=d_h, reset_after=ra,
                                       backend="reference")),
        "exact": (gc.gru_cell(*args64, reset_after=ra, backend="reference"),
                  gc.gru_cell_grad(*args64, state64, d_h=d_h.astype(np.float64), reset_after=ra,
                                   backend="reference")),
    }
    for name, (a, b, e) in pairs(results["cpu"], results["reference"], results["exact"]):
        assert_float32_agrees(a, b, e, name)


def run_rnn(case, d_h, backend, state=None):
    """``(state, grads)`` of one RNN cell; the gradient at ``state`` when given."""
    args = [case[k] for k in RNN_ARGS]
    activation = case["activation"]
    if state is None:
        state = gc.rnn_cell(*args, activation=activation, backend=backend)
    return state, gc.rnn_cell_grad(*args, state, d_h=d_h, activation=activation,
                                   backend=backend)


def run_rnn_sequence(case, d_h, d_h_final, backend, seq=None):
    """``(seq, grads)`` of one RNN sequence; the gradient at ``seq`` when given."""
    args = [case[k] for k in RNN_SEQ_ARGS]
    options = {"activation": case["activation"], "seq_len": case["seq_len"]}
    if seq is None:
        seq = gc.rnn_sequence(*args, **options, backend=backend)
    return seq, gc.rnn_sequence_grad(*args, seq, d_h=d_h, d_h_final=d_h_final, **options,
                                     backend=backend)


def _rnn_cell_cases(dtype):
    """Seeded random cases, then sizes past the SIMD width (vector loop and remainder)."""
    rng = np.random.default_rng(20)
    cases = [random_rnn_cell_case(rng, dtype) for _ in range(RNN_CASES)]
    for activation in ("tanh", "relu"):
        for batch, hidden in ((3, 17), (2, 40), (0, 9)):
            cases.append(rnn_cell_case(rng, batch=batch, input_size=5, hidden=hidden,
                                       dtype=dtype, activation=activation))
    return cases


def _rnn_sequence_cases(dtype):
    rng = np.random.default_rng(21)
    cases = [random_rnn_sequence_case(rng, dtype) for _ in range(RNN_CASES)]
    for activation in ("tanh", "relu"):
        for ragged in (False, True):
            cases.append(rnn_sequence_case(rng, steps=6, batch=5, input_size=7, hidden=19,
                                           dtype=dtype, activation=activation,
                                           ragged=ragged))
    return cases


def _rnn_upstream(shape, dtype, seed, on=True):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype) if on else None


def test_rnn_cell_agrees_with_reference_float64():
    for k, case in enumerate(_rnn_cell_cases(np.float64)):
        d_h = _rnn_upstream(case["h_prev"].shape, np.float64, k, on=k % 4 != 3)
        got, want = run_rnn(case, d_h, "cpu"), run_rnn(case, d_h, "reference")
        for name, (a, b) in pairs(got, want):
            assert_float64_agrees(a, b, f"case {k}: {name}")


def test_rnn_cell_agrees_with_reference_float32():
    for k, case in enumerate(_rnn_cell_cases(np.float32)):
        d_h = _rnn_upstream(case["h_prev"].shape, np.float32, k)
        state32 = run_rnn(case, d_h, "reference")[0]
        case64 = _cast(case, np.float64)
        state64 = gc.RNNCellState(state32.h.astype(np.float64))
        results = {
            "cpu": run_rnn(case, d_h, "cpu")[:1] + run_rnn(case, d_h, "cpu", state32)[1:],
            "reference": run_rnn(case, d_h, "reference", state32),
            "exact": (run_rnn(case64, None, "reference")[0],
                      run_rnn(case64, d_h.astype(np.float64), "reference", state64)[1]),
        }
        for name, (a, b, e) in pairs(results["cpu"], results["reference"], results["exact"]):
            assert_float32_agrees(a, b, e, f"case {k}: {name}")


def _rnn_sequence_upstream(case, dtype, k):
    steps, batch = case["x"].shape[:2]
    hidden = case["h0"].shape[1]
    return (_rnn_upstream((steps, batch, hidden), dtype, k, on=k % 4 != 1),
            _rnn_upstream((batch, hidden), dtype, k + 1, on=k % 4 != 2))


def test_rnn_sequence_agrees_with_reference_float64():
    for k, case in enumerate(_rnn_sequence_cases(np.float64)):
        d_h, d_h_final = _rnn_sequence_upstream(case, np.float64, k)
        got = run_rnn_sequence(case, d_h, d_h_final, "cpu")
        want = run_rnn_sequence(case, d_h, d_h_final, "reference")
        for name, (a, b) in pairs(got, want):
            assert_float64_agrees(a, b, f"case {k}: {name}")


def test_rnn_sequence_agrees_with_reference_float32():
    for k, case in enumerate(_rnn_sequence_cases(np.float32)):
        d_h, d_h_final = _rnn_sequence_upstream(case, np.float32, k)
        seq32 = run_rnn_sequence(case, d_h, d_h_final, "reference")[0]
        case64 = _cast(case, np.float64)
        up64 = [None if a is None else a.astype(np.float64) for a in (d_h, d_h_final)]
        seq64 = gc.RNNSequence(*[a.astype(np.float64) for a in seq32])
        results = {
            "cpu": (run_rnn_sequence(case, d_h, d_h_final, "cpu")[0],
                    run_rnn_sequence(case, d_h, d_h_final, "cpu", seq32)[1]),
            "reference": run_rnn_sequence(case, d_h, d_h_final, "reference", seq32),
            "exact": (run_rnn_sequence(case64, None, None, "reference")[0],
                      run_rnn_sequence(case64, *up64, "reference", seq64)[1]),
        }
        for name, (a, b, e) in pairs(results["cpu"], results["reference"], results["exact"]):
            assert_float32_agrees(a, b, e, f"case {k}: {name}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_finite_differences_on_sizes_past_the_simd_width(dtype):
    """The oracle on the CPU backend itself, where the vector loops do the work."""
    rng = np.random.default_rng(11)
    for peephole, clip in [(False, False), (True, True)]:
        case = _cast(lstm_cell_case(rng, batch=3, input_size=3, hidden=19, peephole=peephole,
                                    clip=clip), dtype)
        report = vjp_check("lstm_cell", case, backend="cpu")
        assert report.passed, f"\n{report}"
    for reset_after in (False, True):
        case = _cast(gru_cell_case(rng, batch=3, input_size=3, hidden=19,
                                   reset_after=reset_after), dtype)
        report = vjp_check("gru_cell", case, backend="cpu")
        assert report.passed, f"\n{report}"


# --- dispatch, empties, purity ---------------------------------------------------------------

def test_numpy_arrays_default_to_the_cpu_backend():
    assert _dispatch.default_backend("numpy") == "cpu"
    case = lstm_cell_case(np.random.default_rng(0), batch=2, input_size=3, hidden=17)
    args = [case[k] for k in LSTM_ARGS]
    by_default = gc.lstm_cell(*args)
    on_cpu = backend_calls.forward(cpu_backend, "lstm_cell", case)
    for a, b in zip(by_default, on_cpu, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sizes", [(0, 3, 4), (2, 0, 17), (0, 0, 4)])
def test_empty_sizes(dtype, sizes):
    """A batch of 0 rows and an input size of 0: same shapes, dtypes and values as the
    reference (for I=0 the rows still have values, through h_prev)."""
    batch, n_in, hidden = sizes
    rng = np.random.default_rng(1)
    cases = [("lstm", lstm_cell_case(rng, batch=batch, input_size=n_in, hidden=hidden,
                                     peephole=True))]
    cases += [("gru", gru_cell_case(rng, batch=batch, input_size=n_in, hidden=hidden,
                                    reset_after=ra)) for ra in (False, True)]
    for kind, case64 in cases:
        up64 = _upstream(case64, "both")
        case, up = _cast(case64, dtype), _cast(up64, dtype)
        if kind == "lstm":
            got, want = run_lstm(case, up, "cpu"), run_lstm(case, up, "reference")
            exact = run_lstm(_cast(case, np.float64), _cast(up, np.float64), "reference")
        else:
            got, want = run_gru(case, up["d_h"], "cpu"), run_gru(case, up["d_h"], "reference")
            exact = run_gru(_cast(case, np.float64), up["d_h"].astype(np.float64), "reference")
        for name, (a, b, e) in pairs(got, want, exact):
            assert a.shape == b.shape, name
            if dtype == np.float64:
                assert_float64_agrees(a, b, name)
            else:
                assert_float32_agrees(a, b, e, name)


def _read_only(case):
    out = {}
    for k, v in case.items():
        if isinstance(v, np.ndarray):
            v = v.copy()
            v.flags.writeable = False
        out[k] = v
    return out


def test_read_only_inputs_are_accepted():
    """Nothing is written to any input: NumPy would raise on a write to these."""
    rng = np.random.default_rng(2)
    lcase = _read_only(lstm_cell_case(rng, batch=3, input_size=4, hidden=18, peephole=True,
                                      clip=True))
    up = _read_only(_upstream(lcase, "both"))
    state, _ = run_lstm(lcase, up, "cpu")
    for a in state:
        a.flags.writeable = False
    lstm_grads_at(lcase, state, up, "cpu")
    for reset_after in (False, True):
        gcase = _read_only(gru_cell_case(rng, batch=3, input_size=4, hidden=18,
                                         reset_after=reset_after))
        args = [gcase[k] for k in GRU_ARGS]
        gstate = gc.gru_cell(*args, reset_after=reset_after, backend="cpu")
        for a in gstate:
            a.flags.writeable = False
        gc.gru_cell_grad(*args, gstate, d_h=up["d_h"], reset_after=reset_after, backend="cpu")


_ONE_COMPILE_SCRIPT = """
import sys, numpy as np, numba, inspect
from numba.core import types
import gradcells as gc
from gradcells import testing
from gradcells.cells import OPS, SCAN_SPECS
from gradcells.cpu import _scan
rng = np.random.default_rng(0)
def ro(v):
    if isinstance(v, np.ndarray):
        v = v.copy(); v.flags.writeable = False
    elif isinstance(v, tuple) and hasattr(v, "_fields"):
        return type(v)(*map(ro, v))
    return v
def four_modes(op, case):
    spec = {**OPS, **SCAN_SPECS}[op]
    case = {k: ro(v) for k, v in case.items()}
    result = getattr(gc, op)(**case, backend="cpu")
    grad = getattr(gc, f"{op}_grad")
    accepted = inspect.signature(grad).parameters
    upstream = {u: ro(np.ones_like(getattr(result, u[2:]))) for u in spec.upstream
                if getattr(result, u[2:], None) is not None}
    kept = {k: v for k, v in case.items() if k in accepted}
    g = grad(**kept, **{spec.result_arg: ro(result)}, **upstream, backend="cpu")
    getattr(gc, f"{op}_jvp")(**case, tangents=ro(g), backend="cpu")
    getattr(gc, f"{op}_grad_jvp")(**kept, **{spec.result_arg: ro(result)}, tangents=ro(g),
                                  **upstream, backend="cpu")
for op in {**OPS, **SCAN_SPECS}:
    for dtype in (np.float64, np.float32):
        four_modes(op, testing.OPS[op][0](rng, dtype))
# the options with kernels of their own: reset-after GRUs, zoneout, the chunked scans
for op in ("gru_cell", "gru_sequence"):
    four_modes(op, {**testing.OPS[op][0](rng), "reset_after": True})
for op, names in (("lstm_sequence", ("zoneout_h", "zoneout_cs")),
                  ("gru_sequence", ("zoneout_h",))):
    case = testing.OPS[op][0](rng)
    four_modes(op, {**case, **{n: np.full(case["h0"].shape, 0.25) for n in names}})
scan = {**testing.OPS["linear_scan"][0](rng), "method": "parallel"}
scan.update(a=np.repeat(scan["a"], 400, axis=1), b=np.repeat(scan["b"], 400, axis=1))
for cores in (1, 2):            # the chunked scan on one thread and on two
    _scan._cores = lambda: cores
    four_modes("linear_scan", scan)
kernels = {d for name, module in list(sys.modules.items()) if name.startswith("gradcells")
           for d in vars(module).values() if isinstance(d, numba.core.dispatcher.Dispatcher)
           and d.stats.cache_path is not None}   # kernels; helpers compile within them
def key(t):      # what a kernel's math depends on: the dtypes, not layouts or literals
    if isinstance(t, types.Array):
        return str(t.dtype)
    if isinstance(t, types.BaseTuple):
        return tuple(map(key, t.types))
    return str(types.unliteral(t))
read_only = sorted({d.py_func.__name__ for d in kernels for s in d.signatures
                    if any(isinstance(t, types.Array) and not t.mutable for t in s)})
twice = sorted({d.py_func.__name__ for d in kernels
                if len({tuple(map(key, s)) for s in d.signatures}) < len(d.signatures)})
print(len(kernels), "kernels,", sum(len(d.signatures) for d in kernels), "signatures")
print("read-only signatures:", read_only)
print("compiled twice for the same dtypes:", twice)
"""


def test_each_kernel_compiles_once_per_dtype():
    """Every op's four modes through the public functions, in float64 and float32, on
    read-only arrays (inputs, lengths, results, upstreams and tangents), and the options
    with kernels of their own (reset-after GRUs, zoneout, the chunked scan on one thread and
    on two), in a fresh process: no kernel has two signatures with the same dtypes, as a
    layout (an ``[N]`` bias against a ``[1, N]`` one), a read-only array (JAX hands its
    arrays over read-only) or a literal argument would give: each would be a second compile
    of the same math in every process with a cold cache. The public layer's copies and the
    CPU's ``kernel_array`` (lengths and zoneout included) give the kernels writeable arrays."""
    done = subprocess.run([sys.executable, "-c", _ONE_COMPILE_SCRIPT], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = re.search(r"(\d+) kernels, (\d+) signatures", done.stdout)
    assert compiled and int(compiled[1]) >= 40 and int(compiled[2]) >= 80, done.stdout
    assert "read-only signatures: []" in done.stdout, done.stdout[-3000:]
    assert "compiled twice for the same dtypes: []" in done.stdout, done.stdout[-3000:]


def test_negative_strides_and_fortran_state():
    """The saved state and upstream gradients may come in any layout too."""
    rng = np.random.default_rng(3)
    case = lstm_cell_case(rng, batch=5, input_size=4, hidden=18, peephole=True, clip=True)
    up = _upstream(case, "both")
    state, grads = run_lstm(case, up, "cpu")
    flipped = {k: (np.asfortranarray(v) if isinstance(v, np.ndarray) else v)
               for k, v in case.items()}
    for k in ("cs_prev", "h_prev", "x"):
        flipped[k] = case[k][::-1][::-1]                       # a view with the same values
    odd_state = gc.LSTMCellState(*[np.asfortranarray(a) for a in state])
    odd_up = {k: v[:, ::-1][:, ::-1] for k, v in up.items()}
    again = lstm_grads_at(flipped, odd_state, odd_up, "cpu")
    for name, (a, b) in pairs([again], [grads]):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14, err_msg=name)


def _strided(a):
    """A view of a copy of ``a`` with the same values, strided in its last axis (neither C-
    nor Fortran-contiguous once it has two columns); read-only."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    view = wide[..., ::2]
    view.flags.writeable = False
    return view


@pytest.mark.parametrize("layout", ["read-only", "strided", "fortran"])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_rnn_inputs_in_any_layout_and_read_only(layout, activation):
    """Nothing is written to any input (NumPy would raise on a write to a read-only one),
    and every layout of the arrays, the saved outputs and the upstream gradients gives the
    contiguous inputs' results."""
    change = {"read-only": lambda a: _read_only({"a": a})["a"], "strided": _strided,
              "fortran": np.asfortranarray}[layout]
    odd = lambda case: {k: change(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f"  # noqa: E731
                        else v for k, v in case.items()}
    rng = np.random.default_rng(12)
    cell = rnn_cell_case(rng, batch=5, input_size=4, hidden=18, activation=activation)
    d_h = rng.standard_normal((5, 18))
    state, grads = run_rnn(cell, d_h, "cpu")
    again = run_rnn(odd(cell), change(d_h), "cpu", gc.RNNCellState(change(state.h)))[1]
    assert_array_equal(run_rnn(odd(cell), None, "cpu")[0].h, state.h, rtol=1e-13, name="h")
    for name, (a, b) in pairs([again], [grads]):
        assert_array_equal(a, b, rtol=1e-13, name=name)
    seq_case = rnn_sequence_case(rng, steps=5, batch=4, input_size=3, hidden=18,
                                 activation=activation, ragged=True)
    ups = rng.standard_normal((5, 4, 18)), rng.standard_normal((4, 18))
    seq, grads = run_rnn_sequence(seq_case, *ups, "cpu")
    odd_seq = gc.RNNSequence(*map(change, seq))
    odd_run = run_rnn_sequence(odd(seq_case), *map(change, ups), "cpu", odd_seq)[1]
    for name, (a, b) in pairs([run_rnn_sequence(odd(seq_case), None, None, "cpu")[0],
                               odd_run], [seq, grads]):
        assert_array_equal(a, b, rtol=1e-13, name=name)


def assert_array_equal(a, b, *, rtol, name):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol / 10, err_msg=name)


# --- threads ---------------------------------------------------------------------------------

def test_eight_threads_at_once_give_identical_results():
    rng = np.random.default_rng(4)
    lcase = _cast(lstm_cell_case(rng, batch=16, input_size=24, hidden=40, peephole=True,
                                 clip=True), np.float32)
    gcase = _cast(gru_cell_case(rng, batch=16, input_size=24, hidden=40), np.float32)
    up = _upstream(lcase, "both")
    rcase = rnn_cell_case(rng, batch=16, input_size=24, hidden=40, dtype=np.float32)
    scase = rnn_sequence_case(rng, steps=6, batch=16, input_size=24, hidden=40,
                              dtype=np.float32, ragged=True)
    d_steps = rng.standard_normal(scase["x"].shape[:2] + (40,)).astype(np.float32)

    def work():
        return [*run_lstm(lcase, up, "cpu"), *run_gru(gcase, up["d_h"], "cpu"),
                *run_rnn(rcase, up["d_h"], "cpu"),
                *run_rnn_sequence(scase, d_steps, up["d_h"], "cpu")]

    expected = work()
    n_threads, repeats = 8, 10
    start = threading.Barrier(n_threads)
    results, errors = [None] * n_threads, []

    def worker(k):
        try:
            start.wait()
            results[k] = [work() for _ in range(repeats)]
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for per_thread in results:
        for outcome in per_thread:
            for want, got in zip(expected, outcome, strict=True):
                for a, b in zip(want, got, strict=True):
                    if a is not None:
                        np.testing.assert_array_equal(b, a)


# --- the kernels' contracts (what the sequence ops in gradcells/cells/*/cpu.py rely on) --

def test_forward_kernel_takes_a_per_row_addend():
    rng = np.random.default_rng(5)
    case = lstm_cell_case(rng, batch=4, input_size=3, hidden=17, peephole=True, clip=True)
    n_batch, n_hidden = case["cs_prev"].shape
    gates = rng.standard_normal((n_batch, 4 * n_hidden))
    per_row = np.broadcast_to(case["b"], gates.shape).copy()

    def forward(addend):
        out = [np.empty((n_batch, n_hidden)) for _ in range(7)]
        _lstm_kernels.lstm_forward_kernel(gates, addend, case["cs_prev"], case["wci"],
                                          case["wcf"], case["wco"], True, 1.0,
                                          case["cell_clip"], *out)
        return out

    for a, b in zip(forward(case["b"]), forward(per_row), strict=True):
        np.testing.assert_array_equal(a, b)


def test_backward_kernel_accumulates_the_reductions():
    rng = np.random.default_rng(6)
    case = lstm_cell_case(rng, batch=4, input_size=3, hidden=17, peephole=True)
    state = backend_calls.forward(cpu_backend, "lstm_cell", case)
    n_batch, n_hidden = case["cs_prev"].shape
    d_h = rng.standard_normal((n_batch, n_hidden))
    sums = [rng.standard_normal(4 * n_hidden)] + [rng.standard_normal(n_hidden)
                                                  for _ in range(3)]
    start = [s.copy() for s in sums]
    d_fields = rng.standard_normal((5, n_batch, n_hidden))     # d_i, d_f, d_o, d_ci, d_co
    d_gates, dcs_prev = np.empty((n_batch, 4 * n_hidden)), np.empty((n_batch, n_hidden))
    _lstm_kernels.lstm_backward_kernel(case["cs_prev"], *state[:6], d_h, True, d_h, False,
                                       d_fields, True, case["wci"], case["wcf"], case["wco"],
                                       True, np.inf, d_gates, dcs_prev, *sums)
    gates = dict(zip(("d_i", "d_f", "d_o", "d_ci", "d_co"), d_fields, strict=True))
    grads = gc.lstm_cell_grad(*[case[k] for k in LSTM_ARGS], state, d_h=d_h, **gates,
                              **{k: case[k] for k in PEEPHOLES}, backend="reference")
    for total, before, expected in zip(sums, start, (grads.b, grads.wci, grads.wcf,
                                                     grads.wco), strict=True):
        np.testing.assert_allclose(total - before, expected, rtol=1e-12, atol=1e-13)


# --- the hot loops are SIMD ----------------------------------------------------------------

KERNELS = {
    # kernel -> a packed instruction only its main loop has: the division in tanh (forward
    # kernels), the subtraction in σ' = σ(1-σ) and tanh' = 1-tanh² (backward kernels)
    _lstm_kernels.lstm_forward_kernel: "vdiv",
    _lstm_kernels.lstm_backward_kernel: "vsub",
    _gru_kernels.gru_gates_kernel: "vdiv",
    _gru_kernels.gru_candidate_kernel: "vdiv",
    _gru_kernels.gru_reset_after_kernel: "vdiv",
    _gru_kernels.gru_candidate_grad_kernel: "vsub",
    _gru_kernels.gru_reset_grad_kernel: "vsub",
    _gru_kernels.gru_reset_after_grad_kernel: "vsub",
    _rnn_kernels.rnn_forward_kernel: "vdiv",
    _rnn_kernels.rnn_backward_kernel: "vsub",
}


@pytest.mark.skipif(not host_has_avx(), reason="the check looks for AVX (ymm/zmm) registers")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hot_loops_use_vector_registers(dtype):
    """Each kernel, as compiled for the signature the cells use, has packed SIMD
    arithmetic (``simd.assert_packed``)."""
    rng = np.random.default_rng(8)
    lcase = _cast(lstm_cell_case(rng, batch=2, input_size=3, hidden=17, peephole=True,
                                 clip=True), dtype)
    run_lstm(lcase, _upstream(lcase, "both"), "cpu")
    for reset_after in (False, True):
        gcase = _cast(gru_cell_case(rng, batch=2, input_size=3, hidden=17,
                                    reset_after=reset_after), dtype)
        run_gru(gcase, _upstream(gcase, "h")["d_h"], "cpu")
    rcase = rnn_cell_case(rng, batch=2, input_size=3, hidden=17, dtype=dtype)
    run_rnn(rcase, _upstream(rcase, "h")["d_h"], "cpu")
    assert_packed(KERNELS, dtype)


def test_first_call_leaves_numbas_blas_probe_for_later():
    """The first call does not import ``scipy.linalg`` (``_compile._DeferredBlasCheck``),
    and Numba's own BLAS check still gives its answer when Numba code asks for it."""
    code = "\n".join([
        "import importlib.util, sys",
        "import numpy as np, gradcells as gc",
        "shapes = ((1, 2), (1, 2), (1, 2), (4, 8), (8,))",
        "gc.lstm_cell(*(np.ones(s, np.float32) for s in shapes))",
        "print('scipy.linalg' in sys.modules)",
        "import numba",
        "from numba.np import arraymath",
        "correlate = numba.njit(lambda a, v: np.correlate(a, v))",
        "print(correlate(np.arange(4.0), np.ones(2)).tolist())",
        "print(bool(arraymath._HAVE_BLAS) == (importlib.util.find_spec('scipy') is not None))",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "[1.0,", "3.0,", "5.0]", "True"]
