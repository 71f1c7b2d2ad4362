"""The GPU backend run on the CPU: the cells' ``gpu.py`` (``gradcells/cells/<cell>/``) and the
machinery of ``gradcells.gpu`` themselves, with its CuPy runtime swapped for
``tests/cuda_host.HostRuntime``, which runs the very ``.cu`` source the GPU runs (compiled
by the system C++ compiler through a shim header) with the grid, block and argument tuples
the GPU would get. Every line of the GPU backend runs here: the public backend functions,
the matmul plans and step loops of the cells' ``gpu.py``, the shared launch helpers
of ``_launch``, the kernel table, the kernels in all three dtypes (float16 through the
shim's conversions, checked against NumPy's), and ``_runtime`` with a stand-in for CuPy that
compiles what it is given for the host. What cannot run here
is CuPy itself: NVRTC, cuBLAS and the device (``tests/contracts/test_gpu.py``).

Checked on Hypothesis-drawn inputs (``gradcells.testing`` strategies; the RNN's drawn here
from its cases), against the reference in float64 on the same (rounded) inputs (both
backends called through ``tests/backend_calls.py`` with the cases' public keywords), forward
and backward, the three cells and their sequences: clipping in both gradient modes,
peepholes, reset-after, tanh and relu (relu's slope 0 at the kink), ragged lengths, empty
sizes; the sequence masks (docs/spec.md §11.3) with every option, both directions and
layouts, each mask alone and all together, never read past a row's length; the
layer-normalised LSTM on a grid of its options (both carries, also masked), against the
reference in long double (see its section: a norm amplifies rounding, so the float64
reference itself is off by tens of eps there). Agreement: max |emulated - reference| <= 16
eps(dtype) (1 + max |reference|) per output (measured: at most 3 eps). float64 gradients
are also checked against finite differences with the oracle (element by element on the
reference, which the emulation equals at that point, and along a random direction through
the emulation: ``assert_gradients_pass_the_oracle``), launches with tiny and
reversed grids must agree, and unwritten outputs cannot pass by luck (the emulated
``empty`` fills NaN).
"""

import contextlib
import ctypes
import importlib.util
import inspect
import math
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import backend_calls
import cuda_host
import numpy as np
import pytest
from conftest import layer_norm_amplification
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells import _dispatch, _order, cells, reference
from gradcells.cells import CELL_PROTOCOLS, OPTIONAL_WEIGHTS
from gradcells.cells import OPS as OPS_SPECS
from gradcells.cells.lstm.spec import PEEPHOLES, LSTMNorm, LSTMSequence
from gradcells.cells.rnn.spec import ACTIVATIONS, RNNSequence
from gradcells.cells.selective.spec import SelectiveScanGrads, SelectiveScanSettings
from gradcells.gpu import _kernels, _launch, _runtime, _sources
from gradcells.oracle import check_vjp
from gradcells.testing import OPS as PAIRS
from gradcells.testing import (
    gru_cell_case,
    gru_cell_inputs,
    gru_sequence_case,
    gru_sequence_inputs,
    lstm_cell_case,
    lstm_cell_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    mingru_sequence_case,
    minlstm_sequence_case,
    rglru_sequence_case,
    rnn_cell_case,
    rnn_cell_inputs,
    rnn_sequence_case,
    rnn_sequence_inputs,
    selective_scan_case,
    slstm_sequence_case,
)

pytestmark = pytest.mark.skipif(cuda_host.compiler() is None,
                                reason="no C++ compiler for the host emulation")

DTYPES = [np.float64, np.float32, np.float16]
# Tiny blocks and grids: every grid-stride loop wraps and every column sum takes two passes.
TINY = _kernels.LaunchPolicy(block=3, max_grid=2, rows_per_part=2, min_threads=1 << 30)
OPS = ("lstm_cell", "lstm_cell_grad", "gru_cell", "gru_cell_grad", "lstm_sequence",
       "lstm_sequence_grad", "gru_sequence", "gru_sequence_grad", "rnn_cell", "rnn_cell_grad",
       "rnn_sequence", "rnn_sequence_grad", "mingru_cell", "mingru_cell_grad", "mingru_sequence",
       "mingru_sequence_grad", "slstm_cell", "slstm_cell_grad", "slstm_sequence",
       "slstm_sequence_grad", "minlstm_cell", "minlstm_cell_grad", "minlstm_sequence",
       "minlstm_sequence_grad", "rglru_cell", "rglru_cell_grad", "rglru_sequence",
       "rglru_sequence_grad")
# The forward-mode and second-order ops (docs/spec.md §12) the GPU backend runs
# (tests/contracts/test_jvp_cuda_emulation.py, tests/contracts/test_grad_jvp_cuda_emulation_*.py).
JVP_OPS = tuple(f"{cell}_{kind}_{mode}" for cell in ("gru", "rnn", "lstm", "mingru", "slstm",
                                                     "minlstm", "rglru")
                for kind in ("cell", "sequence") for mode in ("jvp", "grad_jvp"))
LSTM_ARRAYS = ("x", "cs_prev", "h_prev", "w", "b")
# The GPU backend: every cell's ``gpu.py`` (``gradcells.cells.<cell>.gpu``), through the registry.
gpu = _dispatch.backend_module("gpu")




@contextlib.contextmanager
def emulated_gpu(policy=_kernels.DEFAULT_POLICY, reverse=False):
    """The GPU backend (``gpu``) with its kernels running on the host."""
    saved = _launch.use_runtime(cuda_host.HostRuntime(policy, reverse))
    try:
        yield gpu
    finally:
        _launch.use_runtime(saved)


def forward(backend, op, case, **changes):
    """``backend.<op>`` on ``case`` with ``changes`` applied (public keywords)."""
    return backend_calls.forward(backend, op, {**case, **changes})


def grad(backend, op, case, result, **upstream):
    """``backend.<op>_grad`` on ``case`` (public keywords) and the forward's ``result``."""
    return backend_calls.grad(backend, op, case, result, **upstream)


def cast(case, dtype):
    def convert(v):
        if isinstance(v, LSTMNorm):
            return LSTMNorm(*map(convert, v))
        return v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
    return {k: convert(v) for k, v in case.items()}


def assert_close(actual, expected, dtype, what=""):
    """Each field within 16 eps(dtype) of the float64 reference, relative to its size."""
    tolerance = 16 * np.finfo(dtype).eps
    for field, a, e in zip(getattr(expected, "_fields", range(len(expected))), actual,
                           expected, strict=True):
        if e is None:
            assert a is None, f"{what}{field}: expected None"
            continue
        if isinstance(e, LSTMNorm):
            assert isinstance(a, LSTMNorm), f"{what}{field}: expected an LSTMNorm"
            assert_close(a, e, dtype, f"{what}{field}.")
            continue
        assert a.dtype == np.dtype(dtype), f"{what}{field}: dtype {a.dtype}"
        assert a.shape == e.shape, f"{what}{field}: shape {a.shape} != {e.shape}"
        if e.size == 0:
            continue
        error = np.max(np.abs(a.astype(np.float64) - e))
        assert error <= tolerance * (1 + np.max(np.abs(e))), (
            f"{what}{field}: max error {error:.3g} ({error / np.finfo(dtype).eps:.1f} eps)")


def upstream(rng, dtype, shapes, wanted):
    return {name: rng.standard_normal(shape).astype(dtype) if on else None
            for (name, shape), on in zip(shapes.items(), wanted, strict=True)}


def as64(arrays, dtype=np.float64):
    return type(arrays)(*(None if a is None else as64(a, dtype) if isinstance(a, LSTMNorm)
                          else a.astype(dtype) for a in arrays))


def up64(up):
    return {k: None if v is None else v.astype(np.float64) for k, v in up.items()}


# --------------------------------------------------------------------------------------
# The backend module itself


def test_backend_module_mirrors_the_reference():
    for name in OPS + JVP_OPS:
        assert inspect.signature(getattr(gpu, name)) == inspect.signature(
            getattr(reference, name)), name


def _parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()
            if p.name != "self"]


def test_cell_modules_follow_the_backend_protocol():
    """``gradcells.cells.lstm.gpu``, ``gru.gpu`` and ``rnn.gpu`` have the protocol's
    functions, parameter by parameter, the backend serves them, and they are all it serves."""
    served = []
    for cell, protocol in CELL_PROTOCOLS.items():
        module = cells.implementation(cell, "gpu")
        assert module is importlib.import_module(f"gradcells.cells.{cell}.gpu")
        served += [n for n, v in vars(module).items()
                   if n.startswith(f"{cell}_") and inspect.isfunction(v)]
        names = [n for n in vars(protocol) if n.startswith(cell)]
        assert names
        for name in names:
            assert _parameters(getattr(module, name)) == _parameters(getattr(protocol, name)), name
            assert getattr(gpu, name) is getattr(module, name)
    assert sorted(served) == sorted(OPS + JVP_OPS)
    for name in JVP_OPS:
        cell = name.split("_")[0]
        module = importlib.import_module(f"gradcells.cells.{cell}.gpu")
        assert getattr(gpu, name) is getattr(module, name)


def test_importing_the_backend_imports_no_cupy_and_compiles_nothing():
    code = ("import sys, gradcells.gpu, gradcells.cells.lstm.gpu, gradcells.cells.gru.gpu, "
            "gradcells.cells.rnn.gpu, gradcells.gpu._launch, gradcells.gpu._kernels, "
            "gradcells.gpu._sources, gradcells.gpu._tangents, gradcells.gpu._runtime; "
            "from gradcells import _dispatch; "
            "_dispatch.backend_module('gpu').lstm_sequence_grad_jvp; "
            "assert 'cupy' not in sys.modules; "
            "assert gradcells.gpu._launch._active is None")
    subprocess.run([sys.executable, "-c", code], check=True)


class _StandInCupy(types.ModuleType):
    """Just enough of CuPy for ``gradcells/gpu/_runtime.py``: NumPy for the arrays, and
    a ``RawModule`` that compiles the code it is given for the host (``cuda_host.load``)
    and launches an entry point of it by name as ``RawKernel.__call__(grid, block, args)``."""

    def __init__(self):
        super().__init__("cupy")
        compiled = self.compiled = []

        class RawModule:
            def __init__(self, code=None, *, options=(), name_expressions=None):
                # With name expressions CuPy before 14.2 would bypass its disk cache.
                assert name_expressions is None
                self.code, self.options = code, options
                self.entries = tuple(re.findall(r"__global__ void (\w+)\(", code))
                self.library = None
                compiled.append(self)

            def get_function(self, name):
                assert name in self.entries, name

                def kernel(grid, block, args):
                    assert all(isinstance(v, tuple) for v in (grid, block, args))
                    if self.library is None:
                        self.library = cuda_host.load(self.code, self.entries)
                    cuda_host.call(self.library, name, grid, block, args)
                return kernel

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))

    def __getattr__(self, name):
        return getattr(np, name)


def test_the_cupy_runtime_compiles_and_launches_what_the_emulation_runs(monkeypatch):
    """``_runtime`` itself, with CuPy replaced by a stand-in: one module per .cu file,
    given its module code (entry points for every dtype included), no name expressions and
    no fast-math option, and each launch by the entry point the table gives."""
    stand_in = _StandInCupy()
    monkeypatch.setitem(sys.modules, "cupy", stand_in)
    monkeypatch.setattr(_launch, "_active", None)  # the next call makes one, on the stand-in

    # The stand-in's arrays are NumPy's, on no device: nothing to switch to.
    monkeypatch.setattr(_runtime.CupyRuntime, "device_of",
                        staticmethod(lambda a: contextlib.nullcontext()))
    rng = np.random.default_rng(58)
    small = {"steps": 3, "batch": 3, "ragged": True}
    cases = {   # every .cu file (the minGRU's, the minLSTM's and the RG-LRU's with scan.cu)
        "lstm_sequence": lstm_sequence_case(rng, input_size=2, hidden=4, peephole=True,
                                            clip=True, **small),
        "gru_sequence": gru_sequence_case(rng, input_size=2, hidden=4, **small),
        "rnn_sequence": rnn_sequence_case(rng, input_size=2, hidden=4, activation="relu",
                                          **small),
        "slstm_sequence": slstm_sequence_case(rng, input_size=2, hidden=4, heads=2, **small),
        "mingru_sequence": mingru_sequence_case(rng, input_size=2, hidden=4, **small),
        "minlstm_sequence": minlstm_sequence_case(rng, input_size=2, hidden=4, **small),
        "rglru_sequence": rglru_sequence_case(rng, hidden=4, resets=True, **small)}
    ran = {}
    for op, case in cases.items():
        case = cast(case, np.float32)
        seq = forward(gpu, op, case)
        ran[op] = case, seq, grad(gpu, op, case, seq, d_h=np.ones_like(seq.h))
    # Mamba's selective scan: selective.cu (its validation and backends: test_selective_scan)
    selective = cast(selective_scan_case(rng, groups_b=2, delta_softplus=True), np.float32)
    sel_args = [selective[k] for k in SelectiveScanGrads._fields]
    sel_settings = SelectiveScanSettings(delta_softplus=True, return_last_state=True)
    sel_seq = gpu.selective_scan(*sel_args, sel_settings)
    sel_grads = gpu.selective_scan_grad(*sel_args, sel_seq, sel_settings,
                                        d_y=np.ones_like(sel_seq.y))
    assert type(_launch.runtime()).__module__ == "gradcells.gpu._runtime"
    assert _launch.runtime().xp is stand_in
    for op, (case, seq, grads) in ran.items():
        case64 = cast(case, np.float64)
        assert_close(seq, forward(reference, op, case64), np.float32)
        assert_close(grads, grad(reference, op, case64, as64(seq), d_h=np.ones(seq.h.shape)),
                     np.float32)
    sel64 = [None if a is None else a.astype(np.float64) for a in sel_args]
    assert_close(sel_seq, reference.selective_scan(*sel64, sel_settings), np.float32)
    assert_close(sel_grads, reference.selective_scan_grad(
        *sel64, None, sel_settings, d_y=np.ones(sel_seq.y.shape)), np.float32)
    assert sorted(m.code for m in stand_in.compiled) == sorted(
        _kernels.module_code(name) for name in _sources.KERNEL_FILES)
    for module in stand_in.compiled:
        source = next(n for n in _sources.KERNEL_FILES if _kernels.module_code(n) == module.code)
        assert module.entries == _kernels.source_entries(source)
        assert module.options == _kernels.NVRTC_OPTIONS
        assert not any("fast_math" in option for option in module.options)


def test_the_gpu_benchmarks_bandwidth_launches_run(monkeypatch):
    """``benchmarks/gpu.py``'s bandwidth section builds its launches through the backend's
    own runtime and table: on the stand-in CuPy, every one of them runs."""
    monkeypatch.setitem(sys.modules, "cupy", _StandInCupy())
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"
    spec = importlib.util.spec_from_file_location("gradcells_gpu_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    for dtype in (np.float32, np.float16):
        launches = benchmark.kernel_launches(4, 8, dtype)
        assert set(launches) == {"lstm_forward", "lstm_backward",
                                 "gru_forward_reset_after", "rnn_forward", "rnn_backward",
                                 "column_sum [B, 4H]"}
        for launch, n_bytes in launches.values():
            launch()
            assert n_bytes > 0


def test_host_half_conversions_round_like_the_device():
    """The shim's float16 <-> float32 conversions (the host's stand-in for PTX cvt.f32.f16
    and cvt.rn.f16.f32) against NumPy's: every half value, every tie, neighbours, extremes."""
    lib = cuda_host.load("", ())

    def run(function, values, out_dtype):
        out = np.empty(values.shape, out_dtype)
        function(ctypes.c_void_p(values.ctypes.data), ctypes.c_void_p(out.ctypes.data),
                 ctypes.c_longlong(values.size))
        return out

    def assert_same(actual, expected):
        nan = np.isnan(expected)
        np.testing.assert_array_equal(np.isnan(actual), nan)
        np.testing.assert_array_equal(actual[~nan].view(f"u{actual.itemsize}"),
                                      expected[~nan].view(f"u{expected.itemsize}"))

    halves = np.arange(1 << 16, dtype=np.uint16)
    as_float = halves.view(np.float16).astype(np.float32)
    assert_same(run(lib.gc_host_halves_to_floats, halves, np.float32), as_float)

    magnitudes = np.unique(np.abs(as_float[np.isfinite(as_float)])).astype(np.float64)
    ties = ((magnitudes[:-1] + magnitudes[1:]) / 2).astype(np.float32)  # exact in float32
    rng = np.random.default_rng(59)
    randoms = (rng.standard_normal(20000) * 10.0 ** rng.uniform(-9, 6, 20000)).astype(np.float32)
    special = np.array([65504, 65519.996, 65520, 65536, 1e10, np.inf, np.nan, 0, 2**-24,
                        2**-25, 3 * 2**-26, 2**-14, 2**-14 - 2**-25, 1e-30], np.float32)
    values = np.concatenate([as_float, ties, np.nextafter(ties, np.float32(0)),
                             np.nextafter(ties, np.float32(np.inf)), randoms, special])
    values = np.concatenate([values, -values])
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    assert_same(run(lib.gc_host_floats_to_halves, values, np.uint16).view(np.float16), expected)


# --------------------------------------------------------------------------------------
# Cells


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=lstm_cell_inputs(min_size=0), clip_grad=st.sampled_from(["exact", "straight_through"]),
       wanted=st.tuples(st.booleans(), st.booleans()), seed=st.integers(0, 2**16))
def test_lstm_cell_matches_reference(dtype, case, clip_grad, wanted, seed):
    case = cast(case, dtype)
    case64 = cast(case, np.float64)
    with emulated_gpu() as backend:
        state = forward(backend, "lstm_cell", case)
        assert_close(state, forward(reference, "lstm_cell", case64), dtype, "forward ")
        shape = state.h.shape
        up = upstream(np.random.default_rng(seed), dtype, {"d_h": shape, "d_cs": shape}, wanted)
        grads = grad(backend, "lstm_cell", case, state, **up, clip_grad=clip_grad)
    # The reference gradient at the emulated forward state: the backward's own rounding only.
    expected = grad(reference, "lstm_cell", case64, as64(state), **up64(up),
                    clip_grad=clip_grad)
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=gru_cell_inputs(min_size=0), wanted=st.tuples(*[st.booleans()] * 4),
       seed=st.integers(0, 2**16))
def test_gru_cell_matches_reference(dtype, case, wanted, seed):
    """An upstream gradient on each field of the result (docs/spec.md §16.1), each drawn or
    None."""
    case = cast(case, dtype)
    case64 = cast(case, np.float64)
    with emulated_gpu() as backend:
        state = forward(backend, "gru_cell", case)
        assert_close(state, forward(reference, "gru_cell", case64), dtype, "forward ")
        up = upstream(np.random.default_rng(seed), dtype,
                      {f"d_{k}": getattr(state, k).shape for k in state._fields}, wanted)
        grads = grad(backend, "gru_cell", case, state, **up)
    expected = grad(reference, "gru_cell", case64, as64(state), **up64(up))
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=rnn_cell_inputs(min_size=0), with_d_h=st.booleans(), seed=st.integers(0, 2**16))
def test_rnn_cell_matches_reference(dtype, case, with_d_h, seed):
    case = cast(case, dtype)
    case64 = cast(case, np.float64)
    with emulated_gpu() as backend:
        state = forward(backend, "rnn_cell", case)
        assert_close(state, forward(reference, "rnn_cell", case64), dtype, "forward ")
        up = upstream(np.random.default_rng(seed), dtype, {"d_h": state.h.shape}, [with_d_h])
        grads = grad(backend, "rnn_cell", case, state, **up)
    # The reference gradient at the emulated forward state (relu's mask from the same h).
    expected = grad(reference, "rnn_cell", case64, as64(state), **up64(up))
    assert_close(grads, expected, dtype, "gradient ")


# --------------------------------------------------------------------------------------
# Sequences


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=lstm_sequence_inputs(min_size=0),
       clip_grad=st.sampled_from(["exact", "straight_through"]),
       wanted=st.tuples(*[st.booleans()] * 4), seed=st.integers(0, 2**16))
def test_lstm_sequence_matches_reference(dtype, case, clip_grad, wanted, seed):
    case = cast(case, dtype)
    case64 = cast(case, np.float64)
    with emulated_gpu() as backend:
        seq = forward(backend, "lstm_sequence", case)
        assert_close(seq, forward(reference, "lstm_sequence", case64), dtype, "forward ")
        steps, state = seq.h.shape, seq.h_final.shape
        up = upstream(np.random.default_rng(seed), dtype,
                      {"d_h": steps, "d_cs": steps, "d_h_final": state, "d_cs_final": state},
                      wanted)
        grads = grad(backend, "lstm_sequence", case, seq, **up, clip_grad=clip_grad)
    expected = grad(reference, "lstm_sequence", case64, as64(seq), **up64(up),
                    clip_grad=clip_grad)
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=gru_sequence_inputs(min_size=0), wanted=st.tuples(*[st.booleans()] * 5),
       seed=st.integers(0, 2**16))
def test_gru_sequence_matches_reference(dtype, case, wanted, seed):
    """An upstream gradient on each field of the result (``d_r, d_u, d_c, d_h, d_h_final``,
    docs/spec.md §16.1), each drawn or None."""
    case = cast(case, dtype)
    case64 = cast(case, np.float64)
    with emulated_gpu() as backend:
        seq = forward(backend, "gru_sequence", case)
        assert_close(seq, forward(reference, "gru_sequence", case64), dtype, "forward ")
        up = upstream(np.random.default_rng(seed), dtype,
                      {f"d_{k}": getattr(seq, k).shape for k in seq._fields}, wanted)
        grads = grad(backend, "gru_sequence", case, seq, **up)
    expected = grad(reference, "gru_sequence", case64, as64(seq), **up64(up))
    assert_close(grads, expected, dtype, "gradient ")


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=rnn_sequence_inputs(min_size=0), wanted=st.tuples(st.booleans(), st.booleans()),
       seed=st.integers(0, 2**16))
def test_rnn_sequence_matches_reference(dtype, case, wanted, seed):
    case = cast(case, dtype)
    case64 = cast(case, np.float64)
    with emulated_gpu() as backend:
        seq = forward(backend, "rnn_sequence", case)
        assert_close(seq, forward(reference, "rnn_sequence", case64), dtype, "forward ")
        up = upstream(np.random.default_rng(seed), dtype,
                      {"d_h": seq.h.shape, "d_h_final": seq.h_final.shape}, wanted)
        grads = grad(backend, "rnn_sequence", case, seq, **up)
    expected = grad(reference, "rnn_sequence", case64, as64(seq), **up64(up))
    assert_close(grads, expected, dtype, "gradient ")


# --------------------------------------------------------------------------------------
# Finite differences (float64): the emulated gradients against the oracle
#
# An element-wise check through the emulation costs two emulated forwards per element of
# every argument (it was three quarters of this file's time), so it is split in two halves
# that together assert it: the element-wise check on the reference, and the emulation equal
# to the reference at the same point and cotangent, then checked end to end along a random
# direction (``assert_gradients_pass_the_oracle``).


def _cotangent(value, rng):
    """A standard normal cotangent with the structure of ``f``'s output ``value``."""
    if isinstance(value, tuple):
        return tuple(rng.standard_normal(np.shape(v)) for v in value)
    return rng.standard_normal(np.shape(value))


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def assert_gradients_pass_the_oracle(pair, emulation, *, seed, bound=None, amplification=1.0):
    """The element-wise finite-difference check of the emulated gradient, asserted as:

    - the reference's ``pair(reference)`` passes ``check_vjp`` element by element at a
      seeded cotangent ``ct`` (with ``bound``: every element's error below it);
    - under ``emulation()`` (a context giving the emulated backend), ``pair(backend)``'s
      forward and its gradient at ``ct`` equal the reference's within
      ``16 · amplification · eps (1 + max |reference|)`` per output (the file's agreement;
      ``amplification``: a layer norm's, ``layer_norm_amplification``), and a second call
      gives the same bits (``check_vjp``'s ``repeat``);
    - the emulated pair passes ``check_vjp(fast=True)``: along one random direction of every
      argument at once, its gradient against the central difference of its own forward, end
      to end (where that misses, the oracle falls back to the element-wise check).

    Each element of the emulated gradient is then within 16 eps of one that passed its own
    central difference: the element-wise check, at two emulated forwards instead of two per
    element."""
    f, vjp, args, names = pair(reference)
    value = f(*args)
    ct = _cotangent(value, np.random.default_rng(seed))
    report = check_vjp(f, vjp, args, names=names, cotangent=ct, seed=seed)
    assert report.passed, f"\nreference\n{report}"
    if bound is not None:
        assert report.max_abs_error < bound, f"\nreference\n{report}"
    expected = vjp(ct, *args)
    with emulation() as backend:
        f, vjp, _, names = pair(backend)
        tolerance = 16 * amplification * np.finfo(np.float64).eps
        for what, actual, wanted in (("forward", _as_tuple(f(*args)), _as_tuple(value)),
                                     ("gradient", vjp(ct, *args), expected)):
            for name, a, e in zip(names if what == "gradient" else range(len(wanted)),
                                  actual, wanted, strict=True):
                assert (a is None) == (e is None), f"{what} {name}"
                if e is not None and e.size:
                    error = np.max(np.abs(np.asarray(a, np.float64) - e))
                    assert error <= tolerance * (1 + np.max(np.abs(e))), (
                        f"{what} {name}: {error:.3g} ({error / np.finfo(np.float64).eps:.1f} "
                        "eps) from the reference")
        again = vjp(ct, *args)
        assert all((a is None and b is None) or a.tobytes() == b.tobytes()
                   for a, b in zip(actual, again, strict=True)), (
            "the emulated gradient is not deterministic")
        emulated = check_vjp(f, vjp, args, names=names, cotangent=ct, seed=seed, fast=True)
        assert emulated.passed, f"\nemulated\n{emulated}"
        assert _launch.runtime().launches           # the emulated kernels did run


def _lstm_cell_pair(backend, case):
    peephole = case["wci"] is not None
    names = LSTM_ARRAYS + (PEEPHOLES if peephole else ())

    def forward_on(*arrays):
        return forward(backend, "lstm_cell", case, **dict(zip(names, arrays, strict=True)))

    def f(*arrays):
        state = forward_on(*arrays)
        return state.cs, state.h

    def vjp(ct, *arrays):
        grads = grad(backend, "lstm_cell", {**case, **dict(zip(names, arrays, strict=True))},
                     forward_on(*arrays), d_cs=ct[0], d_h=ct[1])
        return tuple(grads)[: len(arrays)]

    return f, vjp, tuple(case[n] for n in names), names


def _lstm_sequence_pair(backend, case):
    peephole = case["wci"] is not None
    names = ("x", "cs0", "h0", "w", "b") + (PEEPHOLES if peephole else ())

    def forward_on(*arrays):
        return forward(backend, "lstm_sequence", case, **dict(zip(names, arrays, strict=True)))

    def f(*arrays):
        seq = forward_on(*arrays)
        return seq.h, seq.cs, seq.h_final, seq.cs_final

    def vjp(ct, *arrays):
        grads = grad(backend, "lstm_sequence", {**case, **dict(zip(names, arrays, strict=True))},
                     forward_on(*arrays), d_h=ct[0], d_cs=ct[1], d_h_final=ct[2],
                     d_cs_final=ct[3])
        return tuple(grads)[: len(arrays)]

    return f, vjp, tuple(case[n] for n in names), names


def _gru_pair(backend, case, sequence):
    names = ("x", "h0" if sequence else "h_prev", "w_ru", "w_c", "b_ru", "b_c")
    op = "gru_sequence" if sequence else "gru_cell"

    def forward_on(*arrays):
        return forward(backend, op, case, **dict(zip(names, arrays, strict=True)))

    if sequence:
        def f(*arrays):
            seq = forward_on(*arrays)
            return seq.h, seq.h_final

        def vjp(ct, *arrays):
            return tuple(grad(backend, op, {**case, **dict(zip(names, arrays, strict=True))},
                              forward_on(*arrays), d_h=ct[0], d_h_final=ct[1]))
    else:
        def f(*arrays):
            return forward_on(*arrays).h

        def vjp(ct, *arrays):
            return tuple(grad(backend, op, {**case, **dict(zip(names, arrays, strict=True))},
                              forward_on(*arrays), d_h=ct))

    return f, vjp, tuple(case[n] for n in names), names


def _rnn_pair(backend, case, sequence):
    names = ("x", "h0" if sequence else "h_prev", "w", "b")
    op = "rnn_sequence" if sequence else "rnn_cell"

    def forward_on(*arrays):
        return forward(backend, op, case, **dict(zip(names, arrays, strict=True)))

    def f(*arrays):
        result = forward_on(*arrays)
        return (result.h, result.h_final) if sequence else result.h

    def vjp(ct, *arrays):
        upstream = {"d_h": ct[0], "d_h_final": ct[1]} if sequence else {"d_h": ct}
        return tuple(grad(backend, op, {**case, **dict(zip(names, arrays, strict=True))},
                          forward_on(*arrays), **upstream))

    return f, vjp, tuple(case[n] for n in names), names


@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("clip", [False, True])
def test_lstm_gradients_match_finite_differences(peephole, clip):
    rng = np.random.default_rng(51)
    cell = lstm_cell_case(rng, peephole=peephole, clip=clip, forget_bias=0.5)
    sequence = lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3,
                                  peephole=peephole, clip=clip, ragged=True)
    assert (cell["cell_clip"] is not None) == clip
    for pair in (lambda b: _lstm_cell_pair(b, cell), lambda b: _lstm_sequence_pair(b, sequence)):
        assert_gradients_pass_the_oracle(pair, lambda: emulated_gpu(TINY), seed=1, bound=1e-8)


@pytest.mark.parametrize("reset_after", [False, True])
def test_gru_gradients_match_finite_differences(reset_after):
    rng = np.random.default_rng(52)
    cell = gru_cell_case(rng, reset_after=reset_after)
    sequence = gru_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3,
                                 reset_after=reset_after, ragged=True)
    for pair in (lambda b: _gru_pair(b, cell, False), lambda b: _gru_pair(b, sequence, True)):
        assert_gradients_pass_the_oracle(pair, lambda: emulated_gpu(TINY), seed=2, bound=1e-8)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_rnn_gradients_match_finite_differences(activation):
    rng = np.random.default_rng(66)
    cell = rnn_cell_case(rng, activation=activation)
    sequence = rnn_sequence_case(rng, steps=4, batch=4, input_size=2, hidden=3,
                                 activation=activation, ragged=True)
    for pair in (lambda b: _rnn_pair(b, cell, False), lambda b: _rnn_pair(b, sequence, True)):
        assert_gradients_pass_the_oracle(pair, lambda: emulated_gpu(TINY), seed=3, bound=1e-8)


# --------------------------------------------------------------------------------------
# Launch shapes, thread order, exactness


def _arrays_only(case, names):
    """The arrays ``names`` of ``case``: every other argument left at its default."""
    return {k: case[k] for k in names}


def _run_everything(backend, dtype):
    """Every operation on one fixed ragged case; returns all outputs, flattened."""
    rng = np.random.default_rng(53)
    lstm = cast(lstm_sequence_case(rng, steps=3, batch=4, input_size=3, hidden=5,
                                   peephole=True, clip=True, ragged=True), dtype)
    gru = cast(gru_sequence_case(rng, steps=3, batch=4, input_size=3, hidden=5, ragged=True),
               dtype)
    gru_after = cast(gru_sequence_case(rng, steps=1, batch=7, input_size=2, hidden=3,
                                       reset_after=True), dtype)
    rnns = [cast(rnn_sequence_case(rng, steps=3, batch=4, input_size=3, hidden=5,
                                   activation=activation, ragged=True), dtype)
            for activation in ACTIVATIONS]
    rnn_cell_tanh = cast(rnn_cell_case(rng, batch=7, input_size=2, hidden=3), dtype)
    outputs = []
    seq = forward(backend, "lstm_sequence", lstm)
    d_h = rng.standard_normal(seq.h.shape).astype(dtype)
    outputs += [*seq, *grad(backend, "lstm_sequence", lstm, seq, d_h=d_h, d_cs=d_h)]
    for case in (gru, gru_after):
        seq = forward(backend, "gru_sequence", case)
        outputs += [*seq, *grad(backend, "gru_sequence", case, seq, d_h=np.ones_like(seq.h))]
    for case in rnns:
        seq = forward(backend, "rnn_sequence", case)
        outputs += [*seq, *grad(backend, "rnn_sequence", case, seq, d_h=d_h,
                                d_h_final=d_h[0])]
    state = forward(backend, "rnn_cell", rnn_cell_tanh)
    outputs += [*state, *grad(backend, "rnn_cell", rnn_cell_tanh, state,
                              d_h=np.ones_like(state.h))]
    return outputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_do_not_depend_on_launch_shape_or_thread_order(dtype):
    """Tiny grids (wrapping grid-stride loops, two-pass column sums) and reversed thread
    order give the default launch's elementwise results bit for bit; only the column sums
    (bias and peephole gradients) may differ, by their summation order."""
    with emulated_gpu() as backend:
        default = _run_everything(backend, dtype)
    with emulated_gpu(TINY) as backend:
        tiny = _run_everything(backend, dtype)
        assert _launch.runtime().launches["column_sum"] > 0
    with emulated_gpu(TINY, reverse=True) as backend:
        reverse = _run_everything(backend, dtype)
    for a, b, c in zip(default, tiny, reverse, strict=True):
        if a is None:
            continue
        assert not np.isnan(a).any()
        np.testing.assert_array_equal(b, c)  # same launch shape, opposite thread order
        if a.ndim == 1:  # bias and peephole gradients: column sums
            np.testing.assert_allclose(b.astype(np.float64), a, rtol=16 * np.finfo(dtype).eps,
                                       atol=16 * np.finfo(dtype).eps)
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gradient_passes_exactly_on_the_clip_boundary(dtype):
    """The backward kernel recomputes i∘ci + f∘cs_prev exactly as the forward did: with the
    clip level set to an unclipped |cs| the gradient passes there, and nowhere beyond."""
    case = _arrays_only(cast(lstm_cell_case(np.random.default_rng(54), batch=3, hidden=4),
                             dtype), LSTM_ARRAYS)
    with emulated_gpu() as backend:
        free = forward(backend, "lstm_cell", case)
        magnitudes = np.abs(free.cs)
        level = float(np.sort(magnitudes.ravel())[magnitudes.size // 2])  # a median |cs|
        clipped_case = {**case, "cell_clip": level}
        clipped = forward(backend, "lstm_cell", clipped_case)
        d_cs = np.ones_like(free.cs)
        on = grad(backend, "lstm_cell", clipped_case, clipped, d_cs=d_cs)
        off = grad(backend, "lstm_cell", case, free, d_cs=d_cs)
        low = float(np.sort(magnitudes.ravel())[magnitudes.size // 4])
        low_case = {**case, "cell_clip": low}
        lower = grad(backend, "lstm_cell", low_case, forward(backend, "lstm_cell", low_case),
                     d_cs=d_cs)
    passes = magnitudes <= level
    assert passes.sum() >= 1 and (~passes).sum() >= 1
    np.testing.assert_array_equal(on.cs_prev, np.where(passes, off.cs_prev, 0))
    assert np.all(on.cs_prev[magnitudes == level] != 0)
    np.testing.assert_array_equal(lower.cs_prev, np.where(magnitudes <= low, off.cs_prev, 0))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_extreme_rnn_preactivations(dtype, activation):
    """Pre-activations of order 1e4: tanh saturates at +-1 with a zero slope (finite
    gradients), relu stays exact; both against the reference."""
    rng = np.random.default_rng(67)
    case = cast(rnn_cell_case(rng, batch=4, hidden=6, activation=activation), dtype)
    case["w"] = (case["w"] * 4e3).astype(dtype)
    case64 = cast(case, np.float64)
    with emulated_gpu() as backend:
        state = forward(backend, "rnn_cell", case)
        grads = grad(backend, "rnn_cell", case, state, d_h=np.ones_like(state.h))
    for a in (*state, *grads):
        assert np.isfinite(a).all()
    assert_close(state, forward(reference, "rnn_cell", case64), dtype, "forward ")
    assert_close(grads, grad(reference, "rnn_cell", case64, as64(state),
                             d_h=np.ones(state.h.shape)), dtype, "gradient ")
    if activation == "tanh":
        assert np.all(np.abs(state.h) <= 1) and np.any(np.abs(state.h) == 1)
    else:
        assert np.any(state.h == 0) and np.any(state.h > 1e3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_slope_is_zero_at_the_kink(dtype):
    """z exactly 0 (zero inputs and state, zero bias columns): h = 0 and no gradient passes
    there (relu'(0) = 0, as PyTorch); where z > 0 the upstream gradient passes unchanged."""
    case = cast(rnn_cell_case(np.random.default_rng(68), batch=3, hidden=4,
                              activation="relu"), dtype)
    case["x"], case["h_prev"] = np.zeros_like(case["x"]), np.zeros_like(case["h_prev"])
    case["b"] = np.array([0.0, 0.5, -0.5, 0.0], dtype)
    d_h = np.arange(1, 13, dtype=dtype).reshape(3, 4)
    with emulated_gpu() as backend:
        state = forward(backend, "rnn_cell", case)
        grads = grad(backend, "rnn_cell", case, state, d_h=d_h)
    np.testing.assert_array_equal(state.h, np.maximum(case["b"], 0)[None].repeat(3, axis=0))
    np.testing.assert_array_equal(grads.b, np.array([0, d_h[:, 1].sum(), 0, 0], dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_extreme_preactivations_stay_finite(dtype):
    rng = np.random.default_rng(55)
    lstm = cast(lstm_cell_case(rng, peephole=True, scale=1.0), dtype)
    lstm["w"] = (lstm["w"] * 4e3).astype(dtype)  # pre-activations of order 1e4
    gru = cast(gru_cell_case(rng, reset_after=True), dtype)
    gru["w_ru"], gru["w_c"] = (gru["w_ru"] * 4e3).astype(dtype), (gru["w_c"] * 4e3).astype(dtype)
    with emulated_gpu() as backend:
        state = forward(backend, "lstm_cell", lstm)
        grads = grad(backend, "lstm_cell", lstm, state, d_h=np.ones_like(state.h),
                     d_cs=np.ones_like(state.h))
        gstate = forward(backend, "gru_cell", gru)
        ggrads = grad(backend, "gru_cell", gru, gstate, d_h=np.ones_like(gstate.h))
    for a in (*state, *grads, *gstate, *ggrads):
        assert a is None or np.isfinite(a).all()
    assert np.all((state.i >= 0) & (state.i <= 1)) and np.all(np.abs(gstate.c) <= 1)


def _rnn_layouts(backend, case):
    """Every RNN op on ``case`` (ragged, then with full lengths, then its first step as a
    cell) and on the same values in Fortran order and as strided views, with upstream
    gradients that are themselves strided views; checks that the saved forward is not
    modified by the gradient. Returns (result, result of the other layout) pairs."""
    fortran = {k: np.asfortranarray(v) if isinstance(v, np.ndarray) and v.ndim >= 2 else v
               for k, v in case.items()}
    strided = {k: np.repeat(v, 2, axis=-1)[..., ::2] if isinstance(v, np.ndarray)
               and v.dtype.kind == "f" else v for k, v in case.items()}
    cell = {"x": case["x"][0], "h_prev": case["h0"], "w": case["w"], "b": case["b"],
            "activation": case["activation"]}
    cell_strided = {k: np.repeat(v, 2, axis=-1)[..., ::2] if isinstance(v, np.ndarray)
                    else v for k, v in cell.items()}
    pairs = []
    for variant in (fortran, strided):
        for changes in ({}, {"seq_len": None}):
            base = forward(backend, "rnn_sequence", case, **changes)
            other = forward(backend, "rnn_sequence", variant, **changes)
            d_h = np.repeat(np.ones_like(base.h), 2, axis=-1)[..., ::2]
            saved = [a.copy() for a in base]
            grads = grad(backend, "rnn_sequence", {**case, **changes}, base, d_h=d_h,
                         d_h_final=base.h_final)
            for a, b in zip(base, saved, strict=True):
                np.testing.assert_array_equal(a, b)
            pairs += zip((*base, *grads), (*other, *grad(
                backend, "rnn_sequence", {**variant, **changes}, other, d_h=d_h,
                d_h_final=other.h_final)), strict=True)
    state = forward(backend, "rnn_cell", cell)
    state_s = forward(backend, "rnn_cell", cell_strided)
    pairs += zip((*state, *grad(backend, "rnn_cell", cell, state, d_h=state.h)),
                 (*state_s, *grad(backend, "rnn_cell", cell_strided, state_s,
                                  d_h=state_s.h)), strict=True)
    return pairs


def test_inputs_are_never_modified_and_layout_does_not_matter():
    rng = np.random.default_rng(56)
    lstm = lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=4, peephole=True,
                              clip=True, ragged=True)
    gru = gru_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=4, reset_after=True,
                            ragged=True)
    snapshot = {k: v.copy() for k, v in {**lstm, **gru}.items() if isinstance(v, np.ndarray)}
    rnn = rnn_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=4, activation="relu",
                            ragged=True)
    rnn_snapshot = {k: v.copy() for k, v in rnn.items() if isinstance(v, np.ndarray)}
    fortran = {k: np.asfortranarray(v) if isinstance(v, np.ndarray) and v.ndim == 2 else v
               for k, v in lstm.items()}
    strided = {k: np.repeat(v, 2, axis=-1)[..., ::2] if isinstance(v, np.ndarray)
               and v.dtype.kind == "f" else v for k, v in gru.items()}
    def first_step(case):  # the sequence case's first step as a plain cell case
        return {"x": case["x"][0], "cs_prev": case["cs0"], "h_prev": case["h0"],
                "w": case["w"], "b": case["b"]}

    with emulated_gpu() as backend:
        seq = forward(backend, "lstm_sequence", lstm)
        seq_f = forward(backend, "lstm_sequence", fortran)
        full = forward(backend, "lstm_sequence", lstm, seq_len=None)
        full_f = forward(backend, "lstm_sequence", fortran, seq_len=None)
        cell = forward(backend, "lstm_cell", first_step(lstm))
        cell_f = forward(backend, "lstm_cell", first_step(fortran))
        grads = grad(backend, "lstm_sequence", lstm, seq, d_h=np.ones_like(seq.h),
                     d_cs_final=seq.cs_final)
        gseq = forward(backend, "gru_sequence", gru)
        gseq_s = forward(backend, "gru_sequence", strided)
        grad(backend, "gru_sequence", gru, gseq, d_h_final=np.ones_like(gseq.h_final))
        seq_snapshot = [a.copy() for a in seq]
        grad(backend, "lstm_sequence", lstm, seq, d_h=np.ones_like(seq.h))
        rnn_layouts = _rnn_layouts(backend, rnn)
    for k, v in snapshot.items():
        np.testing.assert_array_equal({**lstm, **gru}[k], v, err_msg=k)
    for k, v in rnn_snapshot.items():
        np.testing.assert_array_equal(rnn[k], v, err_msg=k)
    for a, b in rnn_layouts:
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)
    for a, b in zip(seq, seq_snapshot, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip((*seq, *gseq, *full, *cell), (*seq_f, *gseq_s, *full_f, *cell_f), strict=True):
        # BLAS may order the sums differently for another layout
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)
    assert isinstance(seq, LSTMSequence) and all(g is not None for g in grads[:-2])
    assert grads.w_proj is None and grads.layer_norm is None  # no projection, no layer norm


@pytest.mark.parametrize("cell", ["lstm", "gru", "gru-reset-after", "rnn-tanh", "rnn-relu"])
def test_padding_past_the_lengths_is_never_read(cell):
    """NaN and inf in x past each row's length give exactly the results of zero padding,
    forward and backward (upstream gradients there are zero, as the public layer's tests
    check for every backend with NaN upstream too)."""
    rng = np.random.default_rng(5)
    if cell == "lstm":
        case = lstm_sequence_case(rng, steps=4, batch=4, peephole=True, ragged=True)
        op = "lstm_sequence"
    elif cell.startswith("rnn"):
        case = rnn_sequence_case(rng, steps=4, batch=4, activation=cell[4:], ragged=True)
        op = "rnn_sequence"
    else:
        case = gru_sequence_case(rng, steps=4, batch=4, reset_after=cell.endswith("after"),
                                 ragged=True)
        op = "gru_sequence"
    lengths = np.array([4, 0, 1, 3])
    past = np.arange(4)[:, None] >= lengths             # [T, B]
    zero, poisoned = case["x"].copy(), case["x"].copy()
    zero[past] = 0.0
    poisoned[past] = np.resize([np.nan, np.inf, -np.inf], (int(past.sum()), 1))
    d_h = rng.standard_normal((4, 4, case["h0"].shape[1]))
    d_h[past] = 0.0
    results = []
    with emulated_gpu() as backend:
        for x in (zero, poisoned):
            padded = {**case, "x": x, "seq_len": lengths}
            seq = forward(backend, op, padded)
            grads = grad(backend, op, padded, seq, d_h=d_h)
            results.append((*seq, *grads))
    for want, got in zip(*results, strict=True):
        if want is not None:
            np.testing.assert_array_equal(got, want)


def _check_empty_rnn(backend, rng, steps, batch, n_in):
    for ragged in (False, True):
        case = rnn_sequence_case(rng, steps=steps, batch=batch, input_size=n_in, hidden=3,
                                 activation="relu", ragged=ragged)
        seq = forward(backend, "rnn_sequence", case)
        assert seq.h.shape == (steps, batch, 3) and seq.h_final.shape == (batch, 3)
        d_h_final = np.ones((batch, 3))
        grads = grad(backend, "rnn_sequence", case, seq, d_h_final=d_h_final)
        assert grads.x.shape == (steps, batch, n_in) and grads.h0.shape == (batch, 3)
        assert grads.w.shape == (n_in + 3, 3) and grads.b.shape == (3,)
        expected = grad(reference, "rnn_sequence", case, seq, d_h_final=d_h_final)
        for a, e in zip(grads, expected, strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-14, atol=1e-15)
        if steps == 0:
            np.testing.assert_array_equal(grads.h0, d_h_final)
            np.testing.assert_array_equal(seq.h_final, case["h0"])
        if steps == 0 or batch == 0:
            assert not np.any(grads.w) and not np.any(grads.b)
    cell = rnn_cell_case(rng, batch=batch, input_size=n_in, hidden=3)
    state = forward(backend, "rnn_cell", cell)
    cgrads = grad(backend, "rnn_cell", cell, state)
    assert state.h.shape == (batch, 3) and cgrads.x.shape == (batch, n_in)
    assert not np.any(cgrads.w) and not np.any(cgrads.h_prev)


def test_empty_sizes_give_correctly_shaped_results():
    rng = np.random.default_rng(57)
    with emulated_gpu() as backend:
        for steps, batch, n_in in ((0, 2, 3), (2, 0, 3), (2, 2, 0)):
            lstm = lstm_sequence_case(rng, steps=steps, batch=batch, input_size=n_in, hidden=3,
                                      peephole=True)
            seq = forward(backend, "lstm_sequence", lstm)
            assert seq.h.shape == (steps, batch, 3) and seq.h_final.shape == (batch, 3)
            grads = grad(backend, "lstm_sequence", lstm, seq, d_h_final=np.ones((batch, 3)))
            assert grads.x.shape == (steps, batch, n_in) and grads.w.shape == (n_in + 3, 12)
            if steps == 0:
                np.testing.assert_array_equal(grads.h0, np.ones((batch, 3)))
                np.testing.assert_array_equal(seq.cs_final, lstm["cs0"])
            if steps == 0 or batch == 0:
                assert not np.any(grads.w) and not np.any(grads.b) and not np.any(grads.wci)
            gru = gru_sequence_case(rng, steps=steps, batch=batch, input_size=n_in, hidden=3)
            gseq = forward(backend, "gru_sequence", gru)
            ggrads = grad(backend, "gru_sequence", gru, gseq)
            assert ggrads.w_c.shape == (n_in + 3, 3) and ggrads.b_c.shape == (3,)
            _check_empty_rnn(backend, rng, steps, batch, n_in)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("policy", [_kernels.DEFAULT_POLICY,
                                    _kernels.LaunchPolicy(rows_per_part=1 << 20)],
                         ids=["default", "one long part"])
def test_column_sums_stay_accurate_over_many_rows(dtype, policy):
    """The bias and peephole gradients sum T·B rows; in float32 a plain running sum over
    100k rows drifts by hundreds of eps. Compensated summation keeps every column within a
    few eps of its exact sum (measured against float64, relative to Σ|a|), whatever the
    split into parts."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((120_000, 3)) + np.array([0.0, 5.0, -1e3])).astype(dtype)
    runtime = cuda_host.HostRuntime(policy)
    sums = _launch.column_sum(runtime, a)
    exact = np.array([math.fsum(column) for column in a.T.astype(np.float64)])
    scale = np.abs(a.astype(np.float64)).sum(axis=0)
    assert np.all(np.abs(sums - exact) <= 4 * np.finfo(dtype).eps * scale)


# --------------------------------------------------------------------------------------
# What the small cases above cannot reach (found by mutating the kernels): the 64-bit index
# path, float16 outputs computed from the stored (rounded) values, the clip mask at every
# boundary, non-finite column sums, float16 two-pass partial sums, fresh final states.

F16 = np.float16


class _WideIndexRuntime(cuda_host.HostRuntime):
    """The kernels with the 32-bit index path switched off: every launch takes the 64-bit
    one, which the GPU takes above ``GC_UINT32_SAFE_COUNT`` elements (2^30)."""

    def launch(self, binding, grid, block, args):
        source = binding.kernel.source
        code, found = re.subn(r"#define GC_UINT32_SAFE_COUNT \S+",
                              "#define GC_UINT32_SAFE_COUNT -1LL", _kernels.module_code(source))
        assert found == 1
        library = cuda_host.load(code, _kernels.source_entries(source))
        cuda_host.call(library, binding.entry, grid, block, args, self.reverse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_64_bit_index_path_gives_the_same_results(dtype):
    with emulated_gpu() as backend:
        narrow = _run_everything(backend, dtype) + _run_ln(backend, dtype)
    saved = _launch.use_runtime(_WideIndexRuntime())
    try:
        wide = _run_everything(gpu, dtype) + _run_ln(gpu, dtype)
    finally:
        _launch.use_runtime(saved)
    for a, b in zip(narrow, wide, strict=True):
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_the_32_bit_index_path_keeps_every_offset_in_range():
    """The largest offset a kernel forms is g + 3H = 4n - 1 for n = B·H elements."""
    text = _sources.read("common.cuh")
    limit = int(re.search(r"#define GC_UINT32_SAFE_COUNT (\d+)LL", text).group(1))
    assert 4 * limit - 1 <= 2**32 - 1


def assert_rounds_to(actual, exact):
    """float16 ``actual`` is float64 ``exact`` rounded to half, except where ``exact`` lies
    within 8 float32 ulps of a midpoint between halves (float32 tanh's error may decide)."""
    want = exact.astype(F16)
    nearest = want.astype(np.float64)
    up = np.nextafter(want, F16(np.inf)).astype(np.float64)
    down = np.nextafter(want, F16(-np.inf)).astype(np.float64)
    to_midpoint = np.minimum(np.abs(exact - (nearest + up) / 2),
                             np.abs(exact - (nearest + down) / 2))
    undecided = to_midpoint <= 8 * 2.0**-24 * np.abs(exact)
    wrong = (actual != want) & ~undecided
    assert not wrong.any(), f"{wrong.sum()} of {wrong.size} differ"


def _previous(first, steps):
    return np.concatenate([first[None], steps[:-1]])


def test_float16_lstm_outputs_come_from_the_stored_values():
    """cs from the stored i, ci, f (one fma in float32, then half), h from the stored o and
    co: what the backward kernel reloads is what the forward used."""
    case = cast(lstm_sequence_case(np.random.default_rng(60), steps=3, batch=16, input_size=8,
                                   hidden=32, peephole=True), F16)
    with emulated_gpu() as backend:
        seq = forward(backend, "lstm_sequence", case)
    i, ci, f, cs, o, co = (a.astype(np.float64) for a in (seq.i, seq.ci, seq.f, seq.cs, seq.o,
                                                          seq.co))
    cs_prev = _previous(case["cs0"], seq.cs).astype(np.float64)
    # i·ci and f·cs_prev of halves are exact in float64: one rounding to float32 is the fma's.
    np.testing.assert_array_equal(seq.cs, (i * ci + f * cs_prev).astype(np.float32).astype(F16))
    np.testing.assert_array_equal(seq.h, (o.astype(np.float32) * co.astype(np.float32)).astype(F16))
    assert_rounds_to(seq.co, np.tanh(cs))


@pytest.mark.parametrize("reset_after", [False, True])
def test_float16_gru_state_comes_from_the_stored_values(reset_after):
    """h = u·h_prev + (1 - u)·c from the stored u and c, in float32 (the host compiles
    without contraction)."""
    case = cast(gru_sequence_case(np.random.default_rng(61), steps=3, batch=16, input_size=8,
                                  hidden=32, reset_after=reset_after), F16)
    with emulated_gpu() as backend:
        seq = forward(backend, "gru_sequence", case)
    u, c = seq.u.astype(np.float32), seq.c.astype(np.float32)
    h_prev = _previous(case["h0"], seq.h).astype(np.float32)
    np.testing.assert_array_equal(seq.h, (u * h_prev + (np.float32(1) - u) * c).astype(F16))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_float16_rnn_state_comes_from_the_stored_projections(activation):
    """h = act(gx + gh + b) in float32 from the half projections (x·W_x of all steps, then
    h_prev·W_h of the stored previous h) and the half bias: relu exactly, tanh rounded."""
    case = cast(rnn_sequence_case(np.random.default_rng(69), steps=3, batch=16, input_size=8,
                                  hidden=32, activation=activation), F16)
    with emulated_gpu() as backend:
        seq = forward(backend, "rnn_sequence", case)
    n_in = case["x"].shape[2]
    gx = case["x"] @ case["w"][:n_in]
    gh = np.stack([h @ case["w"][n_in:] for h in _previous(case["h0"], seq.h)])
    pre = gx.astype(np.float32) + gh.astype(np.float32) + case["b"].astype(np.float32)
    if activation == "relu":
        np.testing.assert_array_equal(seq.h, np.maximum(pre, 0).astype(F16))
    else:
        assert_rounds_to(seq.h, np.tanh(pre.astype(np.float64)))


def test_float16_gru_candidate_comes_from_the_stored_reset_gate():
    """Reset before: the candidate's matmul takes r∘h_prev rounded to half from the stored r."""
    case = cast(gru_cell_case(np.random.default_rng(62), batch=16, input_size=8, hidden=32), F16)
    with emulated_gpu() as backend:
        state = forward(backend, "gru_cell", case)
    n_in = case["x"].shape[1]
    reset_h = (state.r.astype(np.float32) * case["h_prev"].astype(np.float32)).astype(F16)
    gx_c = case["x"] @ case["w_c"][:n_in]
    gh_c = reset_h @ case["w_c"][n_in:]
    pre = (gx_c.astype(np.float32) + gh_c.astype(np.float32) + case["b_c"].astype(np.float32))
    assert_rounds_to(state.c, np.tanh(pre.astype(np.float64)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_clip_mask_is_exact_at_many_boundaries(dtype):
    """With cell_clip set to a quarter of the |cs| values in turn, the gradient passes exactly
    where |i·ci + f·cs_prev| <= cell_clip: the backward's fma recomputes the forward's."""
    case = _arrays_only(cast(lstm_cell_case(np.random.default_rng(63), batch=16, hidden=16),
                             dtype), LSTM_ARRAYS)
    with emulated_gpu() as backend:
        free = forward(backend, "lstm_cell", case)
        d_cs = np.ones_like(free.cs)
        unclipped = grad(backend, "lstm_cell", case, free, d_cs=d_cs)
        for level in np.unique(np.abs(free.cs))[::4]:
            clipped_case = {**case, "cell_clip": float(level)}
            clipped = forward(backend, "lstm_cell", clipped_case)
            grads = grad(backend, "lstm_cell", clipped_case, clipped, d_cs=d_cs)
            np.testing.assert_array_equal(
                grads.cs_prev, np.where(np.abs(free.cs) <= level, unclipped.cs_prev, 0))


@pytest.mark.parametrize("policy", [_kernels.DEFAULT_POLICY, TINY,
                                    _kernels.LaunchPolicy(rows_per_part=1 << 20)])
def test_column_sums_propagate_infinities(policy):
    a = np.ones((300, 4), np.float32)
    a[7, 0] = np.inf
    a[9, 1] = -np.inf
    a[5, 2], a[250, 2] = np.inf, -np.inf
    sums = _launch.column_sum(cuda_host.HostRuntime(policy), a)
    np.testing.assert_array_equal(sums, np.array([np.inf, -np.inf, np.nan, 300], np.float32))


def test_float16_two_pass_column_sums_keep_their_partial_sums_in_float32():
    """Parts of two rows of about ±2000 each: partial sums stored in float16 would lose the
    small total."""
    rng = np.random.default_rng(64)
    rows = 4096
    sign = np.where((np.arange(rows) // 2) % 2 == 0, 1.0, -1.0)
    a = np.stack([sign * (1000 + rng.standard_normal(rows)), rng.standard_normal(rows)],
                 axis=1).astype(F16)
    sums = _launch.column_sum(cuda_host.HostRuntime(TINY), a).astype(np.float64)
    exact = np.array([math.fsum(column) for column in a.T.astype(np.float64)])
    assert np.all(np.abs(sums - exact) <= np.finfo(F16).eps * np.abs(exact)), (sums, exact)


def test_final_states_are_not_views_of_the_steps():
    case = lstm_sequence_case(np.random.default_rng(65), steps=2, batch=2, input_size=2,
                              hidden=3)
    with emulated_gpu() as backend:
        seq = forward(backend, "lstm_sequence", case)
    assert not np.shares_memory(seq.h_final, seq.h)
    assert not np.shares_memory(seq.cs_final, seq.cs)
    rnn = rnn_sequence_case(np.random.default_rng(70), steps=2, batch=2, input_size=2,
                            hidden=3)
    with emulated_gpu() as backend:
        for steps in (rnn["x"], rnn["x"][:0]):
            rseq = forward(backend, "rnn_sequence", rnn, x=steps)
            assert isinstance(rseq, RNNSequence)
            assert not np.shares_memory(rseq.h_final, rseq.h)
            assert not np.shares_memory(rseq.h_final, rnn["h0"])


# --------------------------------------------------------------------------------------
# The LSTM projection (docs/spec.md §9.1)

def _projection_cases(rng, dtype, ragged):
    cell = cast(lstm_cell_case(rng, batch=4, hidden=5, proj_size=3, proj_clip=True, clip=True,
                               peephole=True), dtype)
    seq = cast(lstm_sequence_case(rng, steps=4, batch=4, input_size=3, hidden=5, proj_size=3,
                                  proj_clip=True, clip=True, peephole=True, ragged=ragged),
               dtype)
    return cell, seq


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("clip_grad", ["exact", "straight_through"])
def test_lstm_projection_matches_reference(dtype, ragged, clip_grad):
    rng = np.random.default_rng(70)
    cell, seq_case = _projection_cases(rng, dtype, ragged)
    assert cell["proj_clip"] is not None and seq_case["proj_clip"] is not None
    with emulated_gpu() as backend:
        state = forward(backend, "lstm_cell", cell)
        assert state.h.shape == (4, 3)
        assert_close(state, forward(reference, "lstm_cell", cast(cell, np.float64)), dtype,
                     "cell forward ")
        up = upstream(rng, dtype, {"d_h": state.h.shape, "d_cs": state.cs.shape}, (True, True))
        grads = grad(backend, "lstm_cell", cell, state, **up, clip_grad=clip_grad)
        seq = forward(backend, "lstm_sequence", seq_case)
        assert seq.h.shape == (4, 4, 3) and seq.h_final.shape == (4, 3)
        assert_close(seq, forward(reference, "lstm_sequence", cast(seq_case, np.float64)),
                     dtype, "sequence forward ")
        seq_up = upstream(rng, dtype, {"d_h": seq.h.shape, "d_cs": seq.cs.shape,
                                       "d_h_final": seq.h_final.shape,
                                       "d_cs_final": seq.cs_final.shape}, (True,) * 4)
        seq_grads = grad(backend, "lstm_sequence", seq_case, seq, **seq_up, clip_grad=clip_grad)
    assert grads.w_proj is not None and seq_grads.w_proj is not None
    assert_close(grads, grad(reference, "lstm_cell", cast(cell, np.float64), as64(state),
                             **up64(up), clip_grad=clip_grad), dtype, "cell gradient ")
    assert_close(seq_grads, grad(reference, "lstm_sequence", cast(seq_case, np.float64),
                                 as64(seq), **up64(seq_up), clip_grad=clip_grad),
                 dtype, "sequence gradient ")


def test_lstm_projection_gradients_match_finite_differences():
    rng = np.random.default_rng(71)
    cell, seq = _projection_cases(rng, np.float64, True)
    names = LSTM_ARRAYS + PEEPHOLES + ("w_proj",)
    seq_names = ("x", "cs0", "h0", "w", "b") + PEEPHOLES + ("w_proj",)
    for op, case, keys in (("lstm_cell", cell, names), ("lstm_sequence", seq, seq_names)):
        def pair(backend, op=op, case=case, keys=keys):
            return (*_projection_pair(backend, op, case, keys), tuple(case[n] for n in keys),
                    keys)

        assert_gradients_pass_the_oracle(pair, lambda: emulated_gpu(TINY), seed=1, bound=1e-8)


def _projection_pair(backend, op, case, names):
    fields = ("h", "cs") if op == "lstm_cell" else ("h", "cs", "h_final", "cs_final")
    ups = ("d_h", "d_cs") if op == "lstm_cell" else ("d_h", "d_cs", "d_h_final", "d_cs_final")

    def forward_on(*arrays):
        return forward(backend, op, case, **dict(zip(names, arrays, strict=True)))

    def f(*arrays):
        result = forward_on(*arrays)
        return tuple(getattr(result, k) for k in fields)

    def vjp(ct, *arrays):
        grads = grad(backend, op, {**case, **dict(zip(names, arrays, strict=True))},
                     forward_on(*arrays),
                     **dict(zip(ups, ct, strict=True)))
        return tuple(grads)[:len(names) - 1] + (grads.w_proj,)

    return f, vjp


def _projection_run(backend, case, d_h):
    seq = forward(backend, "lstm_sequence", case)
    grads = grad(backend, "lstm_sequence", case, seq, d_h=d_h, d_h_final=d_h[0])
    return (*seq, *grads)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lstm_projection_does_not_depend_on_launch_shape(dtype):
    rng = np.random.default_rng(72)
    _, case = _projection_cases(rng, dtype, True)
    d_h = rng.standard_normal((4, 4, 3)).astype(dtype)
    runs = []
    for policy, reverse in ((_kernels.DEFAULT_POLICY, False), (TINY, False), (TINY, True)):
        with emulated_gpu(policy, reverse) as backend:
            runs.append(_projection_run(backend, case, d_h))
    for a, b, c in zip(*runs, strict=True):
        if a is None:
            continue
        np.testing.assert_array_equal(b, c)  # same launch shape, opposite thread order
        if a.ndim == 1:  # bias and peephole gradients: column sums, in another order
            np.testing.assert_allclose(b.astype(np.float64), a, rtol=16 * np.finfo(dtype).eps,
                                       atol=16 * np.finfo(dtype).eps)
        else:  # everything else, w_proj included, bit for bit
            np.testing.assert_array_equal(a, b)


def test_lstm_projection_never_reads_padding_nor_modifies_inputs():
    rng = np.random.default_rng(73)
    _, case = _projection_cases(rng, np.float64, False)
    lengths = np.array([4, 0, 1, 3])
    past = np.arange(4)[:, None] >= lengths
    zero, poisoned = case["x"].copy(), case["x"].copy()
    zero[past] = 0.0
    poisoned[past] = np.resize([np.nan, np.inf, -np.inf], (int(past.sum()), 1))
    d_h = rng.standard_normal((4, 4, 3))
    d_h[past] = 0.0
    runs = []
    with emulated_gpu() as backend:
        for x in (zero, poisoned):
            padded = {**case, "x": x, "seq_len": lengths}
            before = {k: v.copy() for k, v in padded.items() if isinstance(v, np.ndarray)}
            runs.append(_projection_run(backend, padded, d_h))
            for k, v in before.items():
                np.testing.assert_array_equal(padded[k], v, err_msg=k)
    for want, got in zip(*runs, strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.all(runs[0][6][past] == 0.0)  # h past the lengths
    np.testing.assert_array_equal(runs[0][8][1], case["h0"][1])  # h_final of a row of length 0


def test_lstm_projection_empty_sizes():
    rng = np.random.default_rng(74)
    with emulated_gpu() as backend:
        for steps, batch in ((0, 3), (3, 0), (0, 0)):
            case = lstm_sequence_case(rng, steps=steps, batch=batch, input_size=2, hidden=5,
                                      proj_size=3, proj_clip=True)
            seq = forward(backend, "lstm_sequence", case)
            assert seq.h.shape == (steps, batch, 3) and seq.h_final.shape == (batch, 3)
            assert seq.cs.shape == (steps, batch, 5)
            grads = grad(backend, "lstm_sequence", case, seq,
                         d_h_final=np.ones((batch, 3)))
            assert grads.h0.shape == (batch, 3) and grads.w.shape == (2 + 3, 20)
            assert grads.w_proj.shape == (5, 3)
            expected = grad(reference, "lstm_sequence", case, seq,
                            d_h_final=np.ones((batch, 3)))
            for got, want in zip(grads, expected, strict=True):
                if want is not None:
                    np.testing.assert_allclose(got, want, atol=1e-12)


# --------------------------------------------------------------------------------------
# The layer-normalised LSTM (docs/spec.md §9.2)
#
# A layer norm divides by the row's deviation (down to LN_MARGIN = 0.1 in the cases) and
# its gradient subtracts nearly equal terms (with two columns, almost all of g), so rounding
# errors grow through each norm and compound over a sequence's steps: the float64 reference
# itself is off by tens of eps in places. So the LN checks compare with the reference in
# long double ("exact"), and allow 16 eps(dtype) (1 + max |exact|), times the largest r of
# the rows the case normalises (``layer_norm_amplification``: a norm multiplies its row's
# rounding by r, at most 1/LN_MARGIN = 10), plus 4 times the
# sensitivity of the output at the dtype's rounding level: the largest deviation from
# "exact" of the float64 reference run on inputs (upstream gradients and saved forward
# state included) perturbed by eps(dtype) relative, three draws (``_perturbed``), or, when
# larger, the error of the reference itself run in the dtype: perturbing the inputs misses
# the rounding the norms amplify inside (a row clipped to nearly constant, r up to 10), so a
# kernel is held to the reference's own accuracy in its dtype. Measured on the fixed grid
# below, the emulation stays within 14 eps of the exact values; on drawn cases within 4
# times the reference's own float32 error.

LN_OPTIONS = [  # (peephole, clip, projection)
    (False, False, False), (True, False, False), (False, True, False), (False, False, True),
    (True, True, True)]
_EXACT = np.longdouble


def _flat_fields(result, prefix=""):
    """``(name, array or None)`` of a result, a layer norm's fields one by one."""
    for field, value in zip(result._fields, result, strict=True):
        if isinstance(value, LSTMNorm):
            yield from _flat_fields(value, f"{prefix}{field}.")
        else:
            yield prefix + field, value


def _ln_cases(rng, dtype, peephole, clip, projection, ln_carry, ragged):
    options = {"peephole": peephole, "clip": clip, "layer_norm": True, "ln_carry": ln_carry}
    if projection:
        options.update(proj_size=3, proj_clip=True)
    cell = lstm_cell_case(rng, batch=4, hidden=5, **options)
    seq = lstm_sequence_case(rng, steps=4, batch=4, input_size=3, hidden=5, ragged=ragged,
                             **options)
    return cast(cell, dtype), cast(seq, dtype)


def _map_arrays(value, function):
    """``value`` (an array, None, a result or a case dict) with ``function`` applied to
    every float array in it."""
    if isinstance(value, dict):
        return {k: _map_arrays(v, function) for k, v in value.items()}
    if isinstance(value, tuple):
        return type(value)(*(_map_arrays(v, function) for v in value))
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return function(value)
    return value


def _perturbed(dtype, draw):
    """``function(a)``: ``a`` in float64 times ``1 + eps(dtype)·u``, u in {-1, 0, 1} drawn
    (draw 0: ``a`` in float64 unperturbed)."""
    rng = np.random.default_rng(draw)
    eps = np.finfo(dtype).eps if draw else 0.0

    def function(a):
        return a.astype(np.float64) * (1 + eps * rng.integers(-1, 2, a.shape))
    return function


def _assert_close_ln(actual, run_reference, dtype, what="", amplification=1.0):
    """``actual`` against ``run_reference(function)`` (the reference on its inputs mapped by
    ``function``), to the tolerance above, its eps term times ``amplification``."""
    exact = run_reference(lambda a: a.astype(_EXACT))
    runs = [run_reference(_perturbed(dtype, draw)) for draw in range(4)]
    runs.append(run_reference(lambda a: a.astype(dtype)))   # the reference in the dtype
    tolerance = 16 * amplification * np.finfo(dtype).eps
    for (field, a), (_, e), *others in zip(_flat_fields(actual), _flat_fields(exact),
                                           *(_flat_fields(r) for r in runs), strict=True):
        if e is None:
            assert a is None, f"{what}{field}: expected None"
            continue
        assert a.dtype == np.dtype(dtype) and a.shape == e.shape, f"{what}{field}"
        if e.size == 0:
            continue
        error = np.max(np.abs(a.astype(_EXACT) - e))
        sensitivity = max(np.max(np.abs(o.astype(_EXACT) - e)) for _, o in others)
        allowed = tolerance * (1 + np.max(np.abs(e))) + 4 * sensitivity
        assert np.all(np.isfinite(a)) and error <= allowed, (
            f"{what}{field}: max error {float(error):.3g} "
            f"({float(error) / np.finfo(dtype).eps:.1f} eps, allowed {float(allowed):.3g})")


def _ln_upstream(rng, dtype, op, result):
    fields = ("h", "cs") if op == "lstm_cell" else ("h", "cs", "h_final", "cs_final")
    return {f"d_{k}": rng.standard_normal(getattr(result, k).shape).astype(dtype)
            for k in fields}


def _check_ln_op(backend, rng, op, case, dtype):
    """One op's forward and both gradient modes against the reference."""
    result = forward(backend, op, case)
    amplification = layer_norm_amplification(case)
    _assert_close_ln(result, lambda f: forward(reference, op, _map_arrays(case, f)), dtype,
                     f"{op} forward ", amplification)
    up = _ln_upstream(rng, dtype, op, result)
    for clip_grad in ("exact", "straight_through"):
        grads = grad(backend, op, case, result, **up, clip_grad=clip_grad)
        assert isinstance(grads.layer_norm, LSTMNorm)

        def expected(f, clip_grad=clip_grad):  # the reference at the emulated forward
            return grad(reference, op, _map_arrays(case, f), _map_arrays(result, f),
                        **_map_arrays(up, f), clip_grad=clip_grad)

        _assert_close_ln(grads, expected, dtype, f"{op} gradient ({clip_grad}) ",
                         amplification)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ln_carry", ["raw", "normalized"])
@pytest.mark.parametrize("peephole, clip, projection", LN_OPTIONS)
@pytest.mark.parametrize("ragged", [False, True])
def test_layer_norm_lstm_matches_reference(dtype, ln_carry, peephole, clip, projection,
                                           ragged):
    rng = np.random.default_rng(80)
    cell, seq = _ln_cases(rng, dtype, peephole, clip, projection, ln_carry, ragged)
    assert (seq["cell_clip"] is not None) == clip and (seq["seq_len"] is not None) == ragged
    with emulated_gpu() as backend:
        _check_ln_op(backend, rng, "lstm_cell", cell, dtype)
        _check_ln_op(backend, rng, "lstm_sequence", seq, dtype)
        launches = _launch.runtime().launches
        assert launches["lstm_forward_ln"] and launches["lstm_backward_ln"]
        assert "lstm_forward" not in launches and "lstm_backward" not in launches


@pytest.mark.parametrize("dtype", DTYPES)
@given(sizes=st.tuples(*[st.integers(0, 4)] * 4),
       options=st.tuples(*[st.booleans()] * 4, st.sampled_from(["raw", "normalized"])),
       seed=st.integers(0, 2**16))
def test_layer_norm_lstm_matches_reference_on_drawn_cases(dtype, sizes, options, seed):
    """Drawn sizes (any of them 0) and options: the cell and the sequence."""
    steps, batch, n_in, hidden = sizes
    peephole, clip, projection, ragged, ln_carry = options
    rng = np.random.default_rng(seed)
    keywords = {"batch": batch, "input_size": n_in, "hidden": hidden, "peephole": peephole,
                "clip": clip, "layer_norm": True, "ln_carry": ln_carry}
    if projection:
        keywords.update(proj_size=2, proj_clip=True)
    cell = cast(lstm_cell_case(rng, **keywords), dtype)
    seq = cast(lstm_sequence_case(rng, steps=steps, ragged=ragged, **keywords), dtype)
    with emulated_gpu() as backend:
        _check_ln_op(backend, rng, "lstm_cell", cell, dtype)
        _check_ln_op(backend, rng, "lstm_sequence", seq, dtype)


def _ln_pair(backend, op, case):
    """``(f, vjp, args, names)`` over every array of an LN case, the norm's six included."""
    names = [k for k in (*LSTM_ARRAYS, *PEEPHOLES, "w_proj") if case.get(k) is not None]
    if op == "lstm_sequence":
        names = [{"cs_prev": "cs0", "h_prev": "h0"}.get(k, k) for k in names]
    n_plain = len(names)
    fields = ("h", "cs") if op == "lstm_cell" else ("h", "cs", "h_final", "cs_final")

    def with_arrays(arrays):
        return {**case, **dict(zip(names, arrays[:n_plain], strict=True)),
                "layer_norm": LSTMNorm(*arrays[n_plain:])}

    def f(*arrays):
        result = forward(backend, op, with_arrays(arrays))
        return tuple(getattr(result, k) for k in fields)

    def vjp(ct, *arrays):
        grads = grad(backend, op, with_arrays(arrays), forward(backend, op, with_arrays(arrays)),
                     **{f"d_{k}": c for k, c in zip(fields, ct, strict=True)})
        return (*(getattr(grads, k) for k in names), *grads.layer_norm)

    args = (*(case[k] for k in names), *case["layer_norm"])
    return f, vjp, args, (*names, *(f"layer_norm.{k}" for k in LSTMNorm._fields))


@pytest.mark.parametrize("ln_carry", ["raw", "normalized"])
@pytest.mark.parametrize("peephole, clip, projection", [(False, False, False),
                                                        (True, True, True)])
def test_layer_norm_gradients_match_finite_differences(ln_carry, peephole, clip, projection):
    rng = np.random.default_rng(81)
    cell, seq = _ln_cases(rng, np.float64, peephole, clip, projection, ln_carry, True)
    for op, case in (("lstm_cell", cell), ("lstm_sequence", seq)):
        # (No absolute bound as above: through the norms the difference quotients
        # themselves are off by up to ~4e-7 here, the reference's exactly as much.)
        assert_gradients_pass_the_oracle(lambda b, op=op, case=case: _ln_pair(b, op, case),
                                         lambda: emulated_gpu(TINY), seed=4,
                                         amplification=layer_norm_amplification(case))


def _run_ln(backend, dtype):
    """Both LN ops with every option on fixed ragged cases; all outputs, flattened."""
    rng = np.random.default_rng(82)
    outputs = []
    for ln_carry in ("raw", "normalized"):
        cell, seq = _ln_cases(rng, dtype, True, True, True, ln_carry, True)
        for op, case in (("lstm_cell", cell), ("lstm_sequence", seq)):
            result = forward(backend, op, case)
            up = _ln_upstream(np.random.default_rng(83), dtype, op, result)
            grads = grad(backend, op, case, result, **up)
            outputs += [a for _, a in (*_flat_fields(result), *_flat_fields(grads))]
    return outputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_does_not_depend_on_launch_shape_or_thread_order(dtype):
    """As for the plain cells: the row kernels' results bit for bit, the column sums (bias,
    peephole and norm parameter gradients) up to their summation order."""
    runs = []
    for policy, reverse in ((_kernels.DEFAULT_POLICY, False), (TINY, False), (TINY, True)):
        with emulated_gpu(policy, reverse) as backend:
            runs.append(_run_ln(backend, dtype))
    for a, b, c in zip(*runs, strict=True):
        if a is None:
            continue
        assert not np.isnan(a).any()
        np.testing.assert_array_equal(b, c)
        if a.ndim == 1:
            np.testing.assert_allclose(b.astype(np.float64), a, rtol=16 * np.finfo(dtype).eps,
                                       atol=16 * np.finfo(dtype).eps)
        else:
            np.testing.assert_array_equal(a, b)


def test_layer_norm_never_reads_padding_nor_modifies_inputs():
    rng = np.random.default_rng(84)
    _, case = _ln_cases(rng, np.float64, True, False, False, "normalized", False)
    lengths = np.array([4, 0, 1, 3])
    past = np.arange(4)[:, None] >= lengths
    zero, poisoned = case["x"].copy(), case["x"].copy()
    zero[past] = 0.0
    poisoned[past] = np.resize([np.nan, np.inf, -np.inf], (int(past.sum()), 3))
    runs = []
    with emulated_gpu() as backend:
        for x in (zero, poisoned):
            padded = {**case, "x": x, "seq_len": lengths}
            before = {k: v.copy() for k, v in padded.items() if isinstance(v, np.ndarray)}
            before.update({f"layer_norm.{k}": v.copy()
                           for k, v in case["layer_norm"]._asdict().items()})
            seq = forward(backend, "lstm_sequence", padded)
            grads = grad(backend, "lstm_sequence", padded, seq, d_h=np.ones_like(seq.h),
                         d_h_final=np.ones_like(seq.h_final))
            runs.append([a for _, a in (*_flat_fields(seq), *_flat_fields(grads))])
            after = {**padded, **{f"layer_norm.{k}": v
                                  for k, v in case["layer_norm"]._asdict().items()}}
            for k, v in before.items():
                np.testing.assert_array_equal(after[k], v, err_msg=k)
    for want, got in zip(*runs, strict=True):
        if want is not None:
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(runs[0][7][1], case["cs0"][1])  # cs_final, length 0


def test_layer_norm_empty_sizes():
    rng = np.random.default_rng(85)
    with emulated_gpu() as backend:
        for steps, batch, n_in, proj in ((0, 3, 2, None), (3, 0, 2, None), (2, 3, 0, None),
                                         (0, 0, 2, 3), (3, 2, 2, 3)):
            case = lstm_sequence_case(rng, steps=steps, batch=batch, input_size=n_in, hidden=4,
                                      peephole=True, layer_norm=True, proj_size=proj)
            width = 4 if proj is None else proj
            seq = forward(backend, "lstm_sequence", case)
            assert seq.h.shape == (steps, batch, width) and seq.cs.shape == (steps, batch, 4)
            up = {"d_h_final": np.ones((batch, width)), "d_cs_final": np.ones((batch, 4))}
            grads = grad(backend, "lstm_sequence", case, seq, **up)
            expected = grad(reference, "lstm_sequence", case, seq, **up)
            for (field, got), (_, want) in zip(_flat_fields(grads), _flat_fields(expected),
                                               strict=True):
                if want is not None:
                    assert got.shape == want.shape, field
                    np.testing.assert_allclose(got, want, atol=1e-12, err_msg=field)


# --------------------------------------------------------------------------------------
# The sequence masks (docs/spec.md §11.3): input_mask, recurrent_mask, zoneout_h and the
# LSTM's zoneout_cs. The comparisons with the reference call both backends below the public
# layer, through its own reordering for reverse and batch_first (``gradcells._order``), in
# every dtype; the oracle and the unread padding go through the public layer itself, with
# backend="gpu" on NumPy arrays (float64), the emulated backend serving them.

SEQUENCE_OPS = ("lstm_sequence", "gru_sequence", "rnn_sequence")
_SEQUENCE_CASES = {"lstm_sequence": lstm_sequence_case, "gru_sequence": gru_sequence_case,
                   "rnn_sequence": rnn_sequence_case}
_STRATEGIES = {"lstm_sequence": (lstm_sequence_inputs, {"projection": None}),
               "gru_sequence": (gru_sequence_inputs, {}), "rnn_sequence": (rnn_sequence_inputs, {})}


def _masked_inputs(op):
    """Cases with every mask in either layout, with empty sizes forward or with both
    directions at sizes >= 1 (the reversal with lengths cannot reshape an input of width 0,
    whatever the backend: gradcells/_order.py, not the masks)."""
    strategy, options = _STRATEGIES[op]
    return st.one_of(strategy(min_size=0, batch_first=None, masks=True, **options),
                     strategy(reverse=None, batch_first=None, masks=True, **options))


_MASK_NAMES = ("input_mask", "recurrent_mask", "zoneout_h", "zoneout_cs")


@contextlib.contextmanager
def public_gpu(policy=_kernels.DEFAULT_POLICY, reverse=False):
    """The public operations with ``backend="gpu"`` taking NumPy arrays, served by the
    emulated GPU backend (the dispatcher's table of which library a backend takes is
    patched for the duration)."""
    libraries = _dispatch._BACKEND_LIBRARY
    saved = libraries["gpu"]
    libraries["gpu"] = "numpy"
    try:
        with emulated_gpu(policy, reverse) as backend:
            yield backend
    finally:
        libraries["gpu"] = saved


def _split_case(op, case):
    """The public op's positional arrays and its keywords."""
    names = [n for n in OPS_SPECS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def public_forward(op, case, backend):
    positional, keywords = _split_case(op, case)
    return getattr(gc, op)(*positional, **keywords, backend=backend)


def recorded_grad(op, case, result, backend, **upstream):
    """``gc.<op>_grad`` with the settings ``result`` records (the case's optional weights
    passed)."""
    positional, keywords = _split_case(op, case)
    weights = {k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS}
    return getattr(gc, f"{op}_grad")(*positional, result, **weights, **upstream,
                                     backend=backend)


def _ordered(op, case):
    """``(spec, x, states, weights, settings)`` of a sequence case for ``_order``."""
    spec = OPS_SPECS[op]
    weights, settings = backend_calls.weights_and_settings(op, case)
    return spec, case["x"], tuple(case[name] for name in spec.states), weights, settings


def ordered_forward(backend, op, case):
    """``backend.<op>`` on the case, in its time order and layout (the public layer's
    reordering around the time-major forward run)."""
    spec, x, states, weights, settings = _ordered(op, case)
    return _order.forward(spec, getattr(backend, op), x, states, weights, settings)


def ordered_grad(backend, op, case, result, *, clip_grad=None, **upstream):
    spec, x, states, weights, settings = _ordered(op, case)
    options = {} if clip_grad is None else {"clip_grad": clip_grad}
    return _order.grad(spec, getattr(backend, spec.grad_name), x, states, weights, result,
                       settings, upstream, **options)


def _upstream_of(op, result, rng, dtype, wanted):
    fields = ("h", "cs", "h_final", "cs_final") if op == "lstm_sequence" else ("h", "h_final")
    return upstream(rng, dtype, {f"d_{k}": getattr(result, k).shape for k in fields},
                    wanted[:len(fields)])


def _check_masked(op, case, dtype, seed, wanted=(True,) * 4, clip_grad=None):
    """The emulated GPU against the float64 reference on ``case`` (cast to ``dtype``):
    forward, then every gradient at the emulated forward, the file's agreement rule."""
    case, case64 = cast(case, dtype), cast(case, np.float64)
    with emulated_gpu() as backend:
        seq = ordered_forward(backend, op, case)
        up = _upstream_of(op, seq, np.random.default_rng(seed), dtype, wanted)
        grads = ordered_grad(backend, op, case, seq, clip_grad=clip_grad, **up)
    assert_close(seq, ordered_forward(reference, op, case64), dtype, f"{op} forward ")
    expected = ordered_grad(reference, op, case64, as64(seq), clip_grad=clip_grad, **up64(up))
    assert_close(grads, expected, dtype, f"{op} gradient ")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", SEQUENCE_OPS)
@given(data=st.data(), clip_grad=st.sampled_from(["exact", "straight_through"]),
       wanted=st.tuples(*[st.booleans()] * 4), seed=st.integers(0, 2**16))
def test_masked_sequences_match_reference(op, dtype, data, clip_grad, wanted, seed):
    """Drawn cases with every mask (per step and fractional, or the same at every step;
    binary recurrent masks), both directions and layouts, ragged lengths, empty sizes and
    (LSTM) peepholes, clips and projections."""
    case = data.draw(_masked_inputs(op))
    _check_masked(op, case, dtype, seed, wanted,
                  clip_grad if op == "lstm_sequence" else None)


def _mask_variants(op):
    """(name, case options) of every option of ``op`` worth crossing with the masks."""
    if op == "gru_sequence":
        return [("reset_before", {}), ("reset_after", {"reset_after": True})]
    if op == "rnn_sequence":
        return [(a, {"activation": a}) for a in ACTIVATIONS]
    return [("plain", {}), ("peephole_clip", {"peephole": True, "clip": True}),
            ("forget_bias", {"forget_bias": 0.0}),
            ("projection", {"proj_size": 3, "proj_clip": True, "peephole": True})]


_MASK_CASES = [(op, name, options, only) for op in SEQUENCE_OPS
               for name, options in _mask_variants(op)
               for only in (*_MASK_NAMES[:3 + (op == "lstm_sequence")], "all")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op, variant, options, only", _MASK_CASES,
                         ids=[f"{op}-{name}-{only}" for op, name, _, only in _MASK_CASES])
def test_each_mask_alone_and_all_together(op, variant, options, only, dtype):
    """Each mask alone and all four (three) together, with each option of the cell."""
    rng = np.random.default_rng(len(variant) + 7 * len(only))
    case = _SEQUENCE_CASES[op](rng, steps=4, batch=4, input_size=3, hidden=4, ragged=True,
                               masks=True, **options)
    if only != "all":
        case = {k: v for k, v in case.items() if k not in _MASK_NAMES or k == only}
    grad_modes = ["exact", "straight_through"] if options.get("clip") else ["exact"]
    for clip_grad in grad_modes:
        _check_masked(op, case, dtype, 1, clip_grad=clip_grad if op == "lstm_sequence" else None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ln_carry", ["raw", "normalized"])
@pytest.mark.parametrize("peephole, clip, projection", [(False, False, False),
                                                        (True, True, True)])
def test_masked_layer_norm_lstm_matches_reference(dtype, ln_carry, peephole, clip,
                                                  projection):
    """With a layer norm, against the long-double reference as above (both clip modes)."""
    rng = np.random.default_rng(80)
    options = {"peephole": peephole, "clip": clip, "layer_norm": True, "ln_carry": ln_carry}
    if projection:
        options.update(proj_size=3, proj_clip=True)
    case = cast(lstm_sequence_case(rng, steps=4, batch=4, input_size=3, hidden=5,
                                   ragged=True, masks=True, **options), dtype)
    with emulated_gpu() as backend:
        _check_ln_op(backend, rng, "lstm_sequence", case, dtype)
        assert _launch.runtime().launches["lstm_backward_ln"]


_ORACLE_VARIANTS = [
    ("lstm_sequence", {"peephole": True, "clip": True}),
    ("lstm_sequence", {"proj_size": 2, "proj_clip": True, "peephole": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "normalized", "peephole": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "raw", "proj_size": 2}),
    ("gru_sequence", {}), ("gru_sequence", {"reset_after": True}),
    ("rnn_sequence", {"activation": "tanh"}), ("rnn_sequence", {"activation": "relu"})]


@pytest.mark.parametrize("op, options", _ORACLE_VARIANTS)
@pytest.mark.parametrize("reverse, batch_first", [(False, False), (True, True)])
def test_masked_gradients_match_finite_differences(op, options, reverse, batch_first):
    """float64, every mask, ragged lengths: the emulated gradients against the oracle."""
    rng = np.random.default_rng(87)
    case = _SEQUENCE_CASES[op](rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                               reverse=reverse, batch_first=batch_first, masks=True, **options)
    def pair(backend):
        return PAIRS[op][1](case, backend="gpu" if backend is gpu else "reference")

    assert_gradients_pass_the_oracle(pair, lambda: public_gpu(TINY), seed=0)


@pytest.mark.parametrize("op, options", _ORACLE_VARIANTS)
@pytest.mark.parametrize("reverse", [False, True])
def test_masks_past_a_rows_length_are_never_read(op, options, reverse):
    """NaN in the input and zoneout masks past each row's length changes nothing, bit for
    bit, with no warning."""
    rng = np.random.default_rng(88)
    case = _SEQUENCE_CASES[op](rng, steps=5, batch=4, input_size=2, hidden=3, ragged=True,
                               reverse=reverse, masks=True, **options)
    valid = np.arange(5)[:, None] < case["seq_len"]  # either direction, as the public layout
    poisoned = dict(case)
    for name in ("input_mask", "zoneout_h", "zoneout_cs"):
        if name in case:  # every step's mask, NaN past each row's length
            poisoned[name] = np.array(np.broadcast_to(case[name], (5, 4, case[name].shape[-1])))
            poisoned[name][~valid] = np.nan
    runs = []
    with public_gpu(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for c in (case, poisoned):
            seq = public_forward(op, c, "gpu")
            up = {"d_h": np.ones(seq.h.shape), "d_h_final": np.ones(seq.h_final.shape)}
            grads = recorded_grad(op, c, seq, "gpu", **up)
            runs.append([a for _, a in (*_flat_fields(seq), *_flat_fields(grads))])
    for want, got in zip(*runs, strict=True):
        if want is not None:
            assert not np.isnan(want).any()
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", SEQUENCE_OPS)
def test_masked_empty_sizes(op):
    """T = 0, an empty batch, an empty input, each with every mask, as the reference."""
    rng = np.random.default_rng(89)
    for steps, batch, n_in in ((0, 3, 2), (3, 0, 2), (2, 3, 0), (0, 0, 0)):
        case = _SEQUENCE_CASES[op](rng, steps=steps, batch=batch, input_size=n_in, hidden=3,
                                   masks=True)
        _check_masked(op, case, np.float64, 2)


def _run_masked(dtype):
    """Every cell with every mask on fixed ragged cases; all outputs, flattened."""
    rng = np.random.default_rng(90)
    outputs = []
    for op, options in _ORACLE_VARIANTS:
        case = cast(_SEQUENCE_CASES[op](rng, steps=3, batch=4, input_size=3, hidden=4,
                                        ragged=True, masks=True, **options), dtype)
        seq = ordered_forward(gpu, op, case)
        up = _upstream_of(op, seq, np.random.default_rng(91), dtype, (True,) * 4)
        grads = ordered_grad(gpu, op, case, seq, **up)
        outputs += [a for _, a in (*_flat_fields(seq), *_flat_fields(grads))]
    return outputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_results_do_not_depend_on_launch_shape_or_thread_order(dtype):
    runs = []
    for policy, reverse in ((_kernels.DEFAULT_POLICY, False), (TINY, False), (TINY, True)):
        with emulated_gpu(policy, reverse):
            runs.append(_run_masked(dtype))
    for a, b, c in zip(*runs, strict=True):
        if a is None:
            continue
        assert not np.isnan(a).any()
        np.testing.assert_array_equal(b, c)
        if a.ndim == 1:  # column sums, up to their summation order
            np.testing.assert_allclose(b.astype(np.float64), a, rtol=16 * np.finfo(dtype).eps,
                                       atol=16 * np.finfo(dtype).eps)
        else:
            np.testing.assert_array_equal(a, b)
