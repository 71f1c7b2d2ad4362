"""Forward mode on the CPU backend (docs/spec.md §12; the cells' ``cpu`` modules) against the
reference's, and its own guarantees.

- agreement with the reference's ``op_jvp``, result and tangent, on Hypothesis-drawn cases
  with every option (``gradcells.testing`` strategies, sizes from 0 and hidden sizes past
  the SIMD width; masks, ragged lengths, both orders and layouts) and on seeded random
  cases (``gradcells.testing.OPS``), tangents of every input drawn or None: float64 to
  1e-12 relative to each array's scale; float32 no further from the float64 result than
  three times the float32 reference's own error plus four float32 ulps of the scale (at
  least 1; the errors and the scale each array's largest, as tests/contracts/test_cpu_backend.py);
  the
  tangents four times the reference's error plus eight ulps: their derivative factors
  σ(1-σ), 1-t² are read from the CPU's primal, whose activations carry up to 2.7× the
  reference's error, and the tangent's own arithmetic adds its round-off at every step
  (the worst seen over 400 random cases per op: a layer-normalised LSTM two columns wide,
  4.4× the reference's error);
- the primal is the CPU forward's, bitwise (cells and sequences);
- the oracle (``jvp_check``: central differences) on drawn cases with ``backend="cpu"``;
- dispatch: NumPy arrays go to the CPU for the ops it implements, to the reference for the
  others; explicit edge cases (T = 0, B = 0, I = 0, lengths 0 and T, all-None tangents),
  read-only inputs that are never written;
- every forward-mode kernel has packed SIMD arithmetic (as tests/contracts/test_cpu_backend.py
checks
  the others').
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simd import assert_packed, host_has_avx

import gradcells as gc
from gradcells import _dispatch, testing
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.cells.gru import _cpu_kernels as gru_kernels
from gradcells.cells.lstm import _cpu_kernels as lstm_kernels
from gradcells.cells.lstm.spec import LSTMNorm
from gradcells.cells.rnn import _cpu_kernels as rnn_kernels

CPU_OPS = ["rnn_cell", "rnn_sequence", "gru_cell", "gru_sequence", "lstm_cell",
           "lstm_sequence"]
SIZES = {"min_size": 0, "max_batch": 5, "max_input": 5, "max_hidden": 21}
STRATEGIES = {
    "rnn_cell": lambda **k: testing.rnn_cell_inputs(
        min_size=0, max_batch=5, max_input=5, max_hidden=21, **k),
    "rnn_sequence": lambda **k: testing.rnn_sequence_inputs(
        ragged=None, reverse=None, batch_first=None, masks=None, **SIZES, **k),
    "gru_cell": lambda **k: testing.gru_cell_inputs(**SIZES, **k),
    "gru_sequence": lambda **k: testing.gru_sequence_inputs(
        ragged=None, reverse=None, batch_first=None, masks=None, **SIZES, **k),
    "lstm_cell": lambda **k: testing.lstm_cell_inputs(
        peephole=None, clip=None, projection=None, layer_norm=None, **SIZES, **k),
    "lstm_sequence": lambda **k: testing.lstm_sequence_inputs(
        peephole=None, clip=None, ragged=None, projection=None, layer_norm=None, reverse=None,
        batch_first=None, masks=None, **SIZES, **k),
}


def _split(op, case):
    """``(positional arrays, keywords)`` of ``gc.<op>_jvp`` for a case."""
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def _tangents(op, case, seed, none_rate=0.25):
    """The op's gradient type of random tangents (each field None with ``none_rate``)."""
    rng = np.random.default_rng(seed)
    spec = OPS[op]

    def draw(value):
        if value is None or rng.random() < none_rate:
            return None
        if isinstance(value, LSTMNorm):
            return LSTMNorm(*(draw(v) for v in value))
        return rng.standard_normal(np.shape(value)).astype(value.dtype)

    return spec.grads(**{n: draw(case.get(n)) for n in spec.grads._fields})


def _jvp(op, case, tangents, backend):
    positional, keywords = _split(op, case)
    return getattr(gc, f"{op}_jvp")(*positional, tangents, **keywords, backend=backend)


def _cast(value, dtype):
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_cast(v, dtype) for v in value))
    return value


def _fields(result):
    return {k: np.asarray(v) for k, v in result._asdict().items()
            if isinstance(v, np.ndarray)}


def _assert_agree64(got, expected, what):
    for name, want in _fields(expected).items():
        have = getattr(got, name)
        assert have.shape == want.shape and have.dtype == want.dtype, (what, name)
        scale = max(float(np.max(np.abs(want), initial=0.0)), 1.0)
        np.testing.assert_allclose(have, want, rtol=1e-12, atol=1e-12 * scale,
                                   err_msg=f"{what}.{name}")


def _assert_agree32(got, ref32, exact, what, ulps=4, times=3):
    """``got`` (float32) no further from ``exact`` (float64 on the same float32 inputs) than
    ``times`` × the float32 reference's error plus ``ulps`` float32 ulps of the array's scale, at
    least 1 (both errors the array's largest, as tests/contracts/test_cpu_backend.py measures
    them)."""
    for name, want in _fields(exact).items():
        have, ref = getattr(got, name), getattr(ref32, name)
        assert have.dtype == np.float32, (what, name)
        if not want.size:
            continue
        scale = max(float(np.max(np.abs(want))), 1.0)
        ref_error = float(np.max(np.abs(ref.astype(np.float64) - want)))
        error = float(np.max(np.abs(have.astype(np.float64) - want)))
        bound = times * ref_error + ulps * np.finfo(np.float32).eps * scale
        assert error <= bound, f"{what}.{name}: error {error:.3g} > {bound:.3g}"


def _check_case(op, case, seed):
    tangents = _tangents(op, case, seed)
    seq, d_seq = _jvp(op, case, tangents, "cpu")
    ref, d_ref = _jvp(op, case, tangents, "reference")
    _assert_agree64(seq, ref, "result")
    _assert_agree64(d_seq, d_ref, "tangent")
    positional, keywords = _split(op, case)     # the primal is the CPU forward's, bitwise
    forward = getattr(gc, op)(*positional, **keywords, backend="cpu")
    for name, value in _fields(forward).items():
        np.testing.assert_array_equal(getattr(seq, name), value, err_msg=name)


def _ill_conditioned32(case):
    """A layer-normalised LSTM whose norms are at most two columns wide (H <= 2, or an input
    or state one column wide): in float32 not compared, as tests/contracts/test_layer_norm_cpu.py
    does not (its ``_WIDTHS``). Over two columns ``LN(c̃)`` is ±γ + β whatever ``c̃`` is and
    its derivative is ``r ~ 1/|c̃₁ - c̃₂|``, so the tangent's error is the primal's relative
    error in ``c̃₁ - c̃₂`` amplified (measured: 20 ulps, where the reference happened to be
    within 1); float64 and the oracle cover these cases."""
    if case.get("layer_norm") is None:
        return False
    cs = case["cs0"] if "cs0" in case else case["cs_prev"]
    h = case["h0"] if "h0" in case else case["h_prev"]
    return cs.shape[-1] <= 2 or case["x"].shape[-1] == 1 or h.shape[-1] == 1


def _check_case32(op, case, seed):
    if _ill_conditioned32(case):
        return
    case32 = {k: _cast(v, np.float32) for k, v in case.items()}
    t64 = _tangents(op, case, seed)
    t32 = _cast(t64, np.float32)
    case_exact = {k: _cast(v, np.float64) for k, v in case32.items()}
    exact = _jvp(op, case_exact, _cast(t32, np.float64), "reference")
    got = _jvp(op, case32, t32, "cpu")
    ref = _jvp(op, case32, t32, "reference")
    for k in range(2):
        _assert_agree32(got[k], ref[k], exact[k], ("result", "tangent")[k], ulps=4 + 4 * k,
                        times=3 + k)


@pytest.mark.parametrize("op", CPU_OPS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_agrees_with_the_reference_on_drawn_cases(op, data, seed):
    _check_case(op, data.draw(STRATEGIES[op]()), seed)


@pytest.mark.parametrize("op", CPU_OPS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_float32_agrees_with_the_reference_on_drawn_cases(op, data, seed):
    _check_case32(op, data.draw(STRATEGIES[op]()), seed)


@pytest.mark.parametrize("op", CPU_OPS)
def test_agrees_with_the_reference_on_random_cases(op):
    rng = np.random.default_rng(11)
    for k in range(60):
        case = testing.OPS[op][0](rng)
        _check_case(op, case, k)
        _check_case32(op, case, k)


@pytest.mark.parametrize("op", CPU_OPS)
@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_oracle_passes_on_the_cpu(op, seed):
    case = testing.OPS[op][0](np.random.default_rng(seed))
    testing.jvp_check(op, case, seed=seed, backend="cpu").raise_if_failed()


@pytest.mark.parametrize("op", CPU_OPS)
def test_numpy_arrays_run_forward_mode_on_the_cpu(op):
    cpu = _dispatch.backend_module("cpu")
    assert hasattr(cpu, f"{op}_jvp")
    assert _dispatch.backend_for(None, "numpy") is cpu
    assert _dispatch.backend_for("cpu", "numpy") is cpu


def test_the_gpu_runs_forward_mode_and_the_gradients_jvps_too():
    gpu = _dispatch.backend_module("gpu")
    for op in CPU_OPS:
        assert hasattr(gpu, f"{op}_jvp")
        assert _dispatch.backend_for("gpu", "cupy") is gpu
        assert hasattr(gpu, f"{op}_grad_jvp")
        assert _dispatch.backend_for("gpu", "cupy") is gpu


def _sequence_case(op, steps, batch, n_in, hidden, **options):
    rng = np.random.default_rng(5)
    make = {"rnn_sequence": testing.rnn_sequence_case,
            "gru_sequence": testing.gru_sequence_case,
            "lstm_sequence": testing.lstm_sequence_case}[op]
    return make(rng, steps=steps, batch=batch, input_size=n_in, hidden=hidden, **options)


@pytest.mark.parametrize("op", ["rnn_sequence", "gru_sequence", "lstm_sequence"])
@pytest.mark.parametrize("sizes", [(0, 3, 2, 4), (3, 0, 2, 4), (3, 2, 0, 4), (3, 2, 2, 0),
                                   (0, 0, 0, 0), (1, 1, 1, 1), (5, 3, 4, 19)])
def test_edge_sizes(op, sizes):
    case = _sequence_case(op, *sizes)
    _check_case(op, case, 0)
    _check_case(op, case, 1)


@pytest.mark.parametrize("op", ["rnn_sequence", "gru_sequence", "lstm_sequence"])
@pytest.mark.parametrize("lengths", [[0, 0, 0], [4, 4, 4], [0, 4, 2], [1, 0, 3]])
def test_lengths_zero_and_full(op, lengths):
    case = _sequence_case(op, 4, 3, 2, 5, masks=True)
    case["seq_len"] = np.array(lengths)
    _check_case(op, case, 2)


@pytest.mark.parametrize("op", CPU_OPS)
def test_all_none_tangents_give_zero_tangents(op):
    case = testing.OPS[op][0](np.random.default_rng(3))
    seq, d_seq = _jvp(op, case, None, "cpu")
    for name, value in _fields(d_seq).items():
        assert not np.any(value), name
    _check_case(op, case, 3)


@pytest.mark.parametrize("op", CPU_OPS)
def test_every_tangent_alone(op):
    case = testing.OPS[op][0](np.random.default_rng(4))
    spec = OPS[op]
    full = _tangents(op, case, 4, none_rate=0.0)
    for field in spec.grads._fields:
        if getattr(full, field) is None:
            continue
        only = spec.grads(**{f: getattr(full, f) if f == field else None
                             for f in spec.grads._fields})
        got = _jvp(op, case, only, "cpu")[1]
        want = _jvp(op, case, only, "reference")[1]
        _assert_agree64(got, want, field)


@pytest.mark.parametrize("op", CPU_OPS)
def test_inputs_are_never_written(op):
    case = testing.OPS[op][0](np.random.default_rng(6))
    tangents = _tangents(op, case, 6, none_rate=0.0)
    frozen = []
    for value in (*case.values(), *tangents):
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
            frozen.append((value, value.copy()))
    seq, d_seq = _jvp(op, case, tangents, "cpu")
    for value, copy in frozen:
        np.testing.assert_array_equal(value, copy)
    for value in (*_fields(seq).values(), *_fields(d_seq).values()):
        assert value.flags.writeable and not any(value is v for v, _ in frozen)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("reset_after", [False, True])
def test_large_hidden_sizes(activation, reset_after):
    rng = np.random.default_rng(7)
    for op, options in (("rnn_sequence", {"activation": activation}),
                        ("gru_sequence", {"reset_after": reset_after})):
        make = {"rnn_sequence": testing.rnn_sequence_case,
                "gru_sequence": testing.gru_sequence_case}[op]
        case = make(rng, steps=6, batch=5, input_size=9, hidden=37, ragged=True, masks=True,
                    **options)
        _check_case(op, case, 7)
        _check_case32(op, case, 7)


@pytest.mark.parametrize("layer_norm, ln_carry", [(False, "raw"), (True, "raw"),
                                                  (True, "normalized")])
@pytest.mark.parametrize("proj_size", [None, 7])
def test_lstm_every_option_at_large_sizes(layer_norm, ln_carry, proj_size):
    rng = np.random.default_rng(8)
    case = testing.lstm_sequence_case(
        rng, steps=5, batch=4, input_size=9, hidden=37, peephole=True, clip=True,
        forget_bias=0.5, ragged=True, proj_size=proj_size, proj_clip=proj_size is not None,
        layer_norm=layer_norm, ln_carry=ln_carry, masks=True)
    _check_case("lstm_sequence", case, 8)
    _check_case32("lstm_sequence", case, 8)
    cell = {"x": case["x"][0], "cs_prev": case["cs0"], "h_prev": case["h0"],
            **{k: case[k] for k in ("w", "b", "wci", "wcf", "wco", "forget_bias", "cell_clip")},
            **{k: case[k] for k in ("w_proj", "proj_clip", "layer_norm", "ln_carry")
               if k in case}}
    _check_case("lstm_cell", cell, 9)


# What shows each kernel is vectorized: the tanh's division where it computes the primal,
# the subtraction in σ' = σ(1-σ) and tanh' = 1-tanh² where it computes only the tangent.
JVP_KERNELS = {
    rnn_kernels.rnn_jvp_kernel: "vdiv",
    gru_kernels.gru_gates_jvp_kernel: "vdiv",
    gru_kernels.gru_candidate_jvp_kernel: "vdiv",
    gru_kernels.gru_reset_after_tangent_kernel: "vsub",
    lstm_kernels.lstm_tangent_kernel: "vsub",
}


@pytest.mark.skipif(not host_has_avx(), reason="the check looks for AVX (ymm/zmm) registers")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_forward_mode_kernels_use_vector_registers(dtype):
    rng = np.random.default_rng(9)
    for op in CPU_OPS:
        for _ in range(4):                              # both GRU variants, peepholes or not
            case = {k: _cast(v, dtype) for k, v in testing.OPS[op][0](rng).items()}
            _jvp(op, case, _tangents(op, case, 0, none_rate=0.0), "cpu")
    for reset_after in (False, True):
        case = {k: _cast(v, dtype) for k, v in testing.gru_sequence_case(
            rng, reset_after=reset_after).items()}
        _jvp("gru_sequence", case, None, "cpu")
    assert_packed(JVP_KERNELS, dtype)


@pytest.mark.parametrize("sizes", [(0, 3, 2, 4), (3, 0, 2, 4), (3, 2, 0, 4), (1, 1, 1, 1)])
@pytest.mark.parametrize("layer_norm, proj_size", [(False, None), (True, None), (False, 2),
                                                   (True, 1)])
def test_lstm_options_at_edge_sizes(sizes, layer_norm, proj_size):
    steps, batch, n_in, hidden = sizes
    case = testing.lstm_sequence_case(
        np.random.default_rng(10), steps=steps, batch=batch, input_size=n_in, hidden=hidden,
        peephole=True, clip=True, ragged=True, proj_size=proj_size,
        proj_clip=proj_size is not None, layer_norm=layer_norm, ln_carry="normalized",
        masks=True)
    _check_case("lstm_sequence", case, 10)
    _check_case("lstm_sequence", case, 11)
