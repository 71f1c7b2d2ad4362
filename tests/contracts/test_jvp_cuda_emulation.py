"""Forward mode (docs/spec.md §12) of the GPU backend run on the CPU: the cells' ``gpu.py``'s
``*_jvp`` operations with the host emulation of ``tests/contracts/test_cuda_emulation.py`` (the very
``.cu`` source, compiled for the host; NumPy standing in for CuPy), called through the
public layer with ``backend="gpu"``.

Checked on Hypothesis-drawn cases with every option of each cell (``gradcells.testing``
strategies: masks, both directions and layouts, ragged lengths, empty sizes), primal and
tangent, against the reference in float64 on the same (rounded) inputs and tangents, at
that file's agreement rule (16 eps(dtype) relative to the size of the reference's field;
the layer-normalised LSTM by its layer-norm rule, against the reference in long double);
in float64 also against finite differences (``gradcells.testing.jvp_check``), with tiny
launch grids; and on edge cases (T = 0, B = 0, I = 0, lengths 0 and T, all tangents None).
"""

import backend_calls
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cuda_emulation import (
    DTYPES,
    TINY,
    _assert_close_ln,
    _map_arrays,
    _split_case,
    assert_close,
    cast,
    cuda_host,
    emulated_gpu,
    public_gpu,
)

import gradcells as gc
from gradcells import _dispatch, _order, cells, reference
from gradcells.cells import OPS as OPS_SPECS
from gradcells.cells.lstm.spec import LSTMNorm
from gradcells.gpu import _launch
from gradcells.testing import (
    gru_cell_case,
    gru_cell_inputs,
    gru_sequence_case,
    gru_sequence_inputs,
    jvp_check,
    lstm_cell_case,
    lstm_cell_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    rnn_cell_case,
    rnn_cell_inputs,
    rnn_sequence_case,
    rnn_sequence_inputs,
)

# The GPU backend: every cell's ``gpu.py`` (``gradcells.cells.<cell>.gpu``).
gpu = _dispatch.backend_module("gpu")

pytestmark = pytest.mark.skipif(cuda_host.compiler() is None,
                                reason="no C++ compiler for the host emulation")

# The forward-mode ops the GPU backend runs (the others go to the reference by default and
# are a ValueError with backend="gpu": tests/contracts/test_jvp.py).
GPU_JVP_OPS = ("rnn_cell", "rnn_sequence", "gru_cell", "gru_sequence", "lstm_cell",
               "lstm_sequence")
_LSTM_OPTIONS = {"projection": None, "layer_norm": None}
_CELL_INPUTS = {"rnn_cell": rnn_cell_inputs, "gru_cell": gru_cell_inputs,
                "lstm_cell": lambda **k: lstm_cell_inputs(**k, **_LSTM_OPTIONS)}
_SEQUENCE_INPUTS = {"rnn_sequence": rnn_sequence_inputs, "gru_sequence": gru_sequence_inputs,
                    "lstm_sequence": lambda **k: lstm_sequence_inputs(**k, **_LSTM_OPTIONS)}
_CASES = {"rnn_cell": rnn_cell_case, "gru_cell": gru_cell_case, "lstm_cell": lstm_cell_case,
          "rnn_sequence": rnn_sequence_case, "gru_sequence": gru_sequence_case,
          "lstm_sequence": lstm_sequence_case}


def _strategy(op):
    """Drawn cases of ``op`` with every option: empty sizes forward, or both directions at
    sizes >= 1 (as tests/contracts/test_cuda_emulation.py's ``_masked_inputs``), masks drawn."""
    if op in _CELL_INPUTS:
        return _CELL_INPUTS[op](min_size=0)
    inputs = _SEQUENCE_INPUTS[op]
    return st.one_of(inputs(min_size=0, batch_first=None, masks=None),
                     inputs(reverse=None, batch_first=None, masks=None))


def _tangents(op, case, rng, wanted):
    """The op's gradient type of random tangents of the case's arrays (None where not
    ``wanted`` or the case has no such array)."""
    fields = OPS_SPECS[op].grads._fields

    def draw(a):
        if isinstance(a, LSTMNorm):
            return LSTMNorm(*(draw(p) for p in a))
        return rng.standard_normal(a.shape).astype(a.dtype)

    # strict=False: ``wanted`` holds a flag for each of the LSTM's ten fields; the GRU and the
    # plain RNN have fewer
    return OPS_SPECS[op].grads(**{
        name: draw(case[name]) if on and case.get(name) is not None else None
        for name, on in zip(fields, wanted, strict=False)})


def _as(tangents, dtype):
    return type(tangents)(*(None if t is None else _as(t, dtype) if isinstance(t, LSTMNorm)
                            else t.astype(dtype) for t in tangents))


def public_jvp(op, case, tangents, backend):
    positional, keywords = _split_case(op, case)
    return getattr(gc, f"{op}_jvp")(*positional, tangents, **keywords, backend=backend)


def backend_jvp(backend, op, case, tangents):
    """``backend.<op>_jvp`` on the case, in its time order and layout (the public layer's
    reordering around the time-major forward run, ``_order.jvp``, for a sequence)."""
    spec = OPS_SPECS[op]
    weights, settings = backend_calls.weights_and_settings(op, case)
    states = tuple(case[name] for name in spec.states)
    function = getattr(backend, f"{op}_jvp")
    if spec.sequence:
        return _order.jvp(spec, function, case["x"], states, weights, tangents, settings)
    return function(case["x"], *states, weights, tangents, settings)


def _check(op, case, dtype, seed, wanted):
    """The emulated GPU's JVP against the float64 reference's on the same inputs and
    tangents (rounded to ``dtype``), primal and tangent, the file's agreement rule."""
    case, case64 = cast(case, dtype), cast(case, np.float64)
    tangents = _tangents(op, case, np.random.default_rng(seed), wanted)
    with emulated_gpu() as backend:
        result, d_result = backend_jvp(backend, op, case, tangents)
    if case.get("layer_norm") is not None:
        # A norm amplifies rounding (the float64 reference's own too):
        # tests/contracts/test_cuda_emulation.py's layer-norm rule (the reference in long double,
        # allowed the sensitivity of perturbed reference runs).
        def run(function, k):
            return backend_jvp(reference, op, _map_arrays(case, function),
                               _map_arrays(tangents, function))[k]
        _assert_close_ln(result, lambda f: run(f, 0), dtype, f"{op} primal ")
        _assert_close_ln(d_result, lambda f: run(f, 1), dtype, f"{op} tangent ")
        return
    expected, d_expected = backend_jvp(reference, op, case64, _as(tangents, np.float64))
    assert_close(result, expected, dtype, f"{op} primal ")
    assert_close(d_result, d_expected, dtype, f"{op} tangent ")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", GPU_JVP_OPS)
@given(data=st.data(), wanted=st.tuples(*[st.booleans()] * 10), seed=st.integers(0, 2**16))
def test_jvp_matches_reference(op, dtype, data, wanted, seed):
    _check(op, data.draw(_strategy(op)), dtype, seed, wanted)


def test_the_gpu_backend_has_the_forward_mode_ops():
    for op in GPU_JVP_OPS:
        for name in (f"{op}_jvp",):
            assert hasattr(gpu, name) and name in vars(
                cells.implementation(op.split("_")[0], "gpu"))
            assert hasattr(gpu, name)
            assert _dispatch.backend_for("gpu", "cupy") is gpu


_ORACLE_CASES = [
    ("rnn_cell", {"activation": "tanh"}), ("rnn_cell", {"activation": "relu"}),
    ("rnn_sequence", {"activation": "tanh"}), ("rnn_sequence", {"activation": "relu"}),
    ("gru_cell", {}), ("gru_cell", {"reset_after": True}),
    ("gru_sequence", {}), ("gru_sequence", {"reset_after": True}),
    ("lstm_cell", {"peephole": True, "clip": True}),
    ("lstm_cell", {"layer_norm": True, "ln_carry": "normalized", "peephole": True,
                   "proj_size": 2}),
    ("lstm_sequence", {"peephole": True, "clip": True}),
    ("lstm_sequence", {"proj_size": 2, "proj_clip": True, "peephole": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "normalized", "peephole": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "raw", "proj_size": 2})]


def _oracle_case(op, options, rng, reverse, batch_first):
    if op in _CELL_INPUTS:
        return _CASES[op](rng, batch=3, input_size=2, hidden=3, **options)
    return _CASES[op](rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                      reverse=reverse, batch_first=batch_first, masks=True, **options)


@pytest.mark.parametrize("op, options", _ORACLE_CASES)
@pytest.mark.parametrize("reverse, batch_first", [(False, False), (True, True)])
def test_jvp_matches_finite_differences(op, options, reverse, batch_first):
    """float64, every mask, ragged lengths, tiny launch grids: against the oracle."""
    case = _oracle_case(op, options, np.random.default_rng(31), reverse, batch_first)
    with public_gpu(TINY):
        report = jvp_check(op, case, backend="gpu")
        assert _launch.runtime().launches
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("op", GPU_JVP_OPS)
@pytest.mark.parametrize("sizes", [dict(steps=0), dict(batch=0), dict(input_size=0),
                                   dict(hidden=0)])
@pytest.mark.parametrize("wanted", [(True,) * 10, (False,) * 10])
@pytest.mark.parametrize("variant", [0, 1])
def test_jvp_empty_sizes_and_no_tangents(op, sizes, wanted, variant):
    rng = np.random.default_rng(5)
    options = _VARIANTS[op.split("_")[0]][variant]
    if op in _CELL_INPUTS:
        if "steps" in sizes:
            return
        case = _CASES[op](rng, **{"batch": 2, "input_size": 3, "hidden": 2, **sizes},
                          **options)
    else:
        case = _CASES[op](rng, **{"steps": 3, "batch": 2, "input_size": 3, "hidden": 2,
                                  **sizes}, **options)
    _check(op, case, np.float64, 0, wanted)


_VARIANTS = {"rnn": ({"activation": "tanh"}, {"activation": "relu"}),
             "gru": ({}, {"reset_after": True}),
             "lstm": ({"peephole": True, "clip": True, "proj_size": 2, "proj_clip": True},
                      {"layer_norm": True, "ln_carry": "normalized", "peephole": True})}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [op for op in GPU_JVP_OPS if op in _SEQUENCE_INPUTS])
@pytest.mark.parametrize("variant", [0, 1])
def test_jvp_lengths_zero_and_full(dtype, op, variant):
    """Rows of length 0 keep their state and tangent; rows of length T run every step."""
    rng = np.random.default_rng(9)
    options = _VARIANTS[op.split("_")[0]][variant]
    case = _CASES[op](rng, steps=3, batch=3, input_size=2, hidden=3, masks=True, **options)
    case["seq_len"] = np.array([0, 3, 2])
    _check(op, case, dtype, 1, (True,) * 10)
    case = _CASES[op](rng, steps=3, batch=3, input_size=2, hidden=3, **options)
    case["seq_len"] = np.array([0, 0, 0])
    _check(op, case, dtype, 2, (True,) * 10)


@pytest.mark.parametrize("op", [op for op in GPU_JVP_OPS if op in _SEQUENCE_INPUTS])
def test_jvp_inputs_are_never_modified(op):
    rng = np.random.default_rng(3)
    case = _CASES[op](rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                      masks=True)
    tangents = _tangents(op, case, rng, (True,) * 10)
    saved = ({k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)},
             [None if t is None else t.copy() for t in tangents])
    with public_gpu():
        public_jvp(op, case, tangents, "gpu")
    with emulated_gpu() as backend:
        backend_jvp(backend, op, case, tangents)
    for k, v in saved[0].items():
        np.testing.assert_array_equal(case[k], v)
    for t, s in zip(tangents, saved[1], strict=True):
        if s is not None:
            np.testing.assert_array_equal(t, s)


_FULL_OPTIONS = {"rnn": {"activation": "relu"}, "gru": {"reset_after": True},
                 "lstm": {"peephole": True, "clip": True, "layer_norm": True,
                          "ln_carry": "normalized", "proj_size": 2, "proj_clip": True}}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", GPU_JVP_OPS)
def test_jvp_does_not_depend_on_launch_shape_or_thread_order(op, dtype):
    """Tiny blocks and grids (every grid-stride loop wraps), threads run in reverse: the
    same bits."""
    rng = np.random.default_rng(13)
    options = dict(_FULL_OPTIONS[op.split("_")[0]])
    if op in _SEQUENCE_INPUTS:
        options.update(steps=3, ragged=True, masks=True)
    case = cast(_CASES[op](rng, batch=3, input_size=2, hidden=3, **options), dtype)
    tangents = _tangents(op, case, rng, (True,) * 10)
    runs = []
    for policy, reverse in ((None, False), (TINY, False), (TINY, True)):
        with emulated_gpu(*(() if policy is None else (policy, reverse))) as backend:
            runs.append(backend_jvp(backend, op, case, tangents))
    for other in runs[1:]:
        for want, got in zip(runs[0], other, strict=True):       # primal, then tangent
            for a, b in zip(want, got, strict=True):
                np.testing.assert_array_equal(a, b)
