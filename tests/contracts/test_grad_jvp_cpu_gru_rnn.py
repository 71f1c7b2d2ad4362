"""The second order of the plain RNN and the GRU on the CPU backend (docs/spec.md §12;
the cells' ``cpu`` modules) against the reference's, and its own guarantees.

- agreement with the reference's ``op_grad_jvp`` (the hand-derived gradient on dual
  numbers), gradient and tangent, on Hypothesis-drawn cases with every option (relu and
  tanh, both GRU variants, masks and zoneout, ragged lengths, both orders and layouts,
  sizes from 0) and on seeded random cases, the inputs' tangents and the upstream
  gradients and their tangents each drawn or None: float64 to 1e-12 relative to each
  array's scale; float32 by tests/contracts/test_jvp_cpu.py's rule for tangents (four times the
  float32 reference's error from the float64 result, plus eight float32 ulps of the scale);
- the primal half is the CPU's own ``op_grad`` (bitwise for the sequences in run order;
  to 1e-12 for the cells, which run as a sequence of one step, and for reversed
  sequences, which the CPU's gradient runs natively);
- the oracle (``grad_jvp_check``: central differences of the gradient) with
  ``backend="cpu"``;
- the RNN's zoneout both ways: a binary mask reads the saved states, a fractional one
  recomputes every step's own output and its tangent;
- long sequences (30 steps) in both dtypes; edge cases (T = 0, B = 0, I = 0, H = 0,
  lengths 0 and T, all tangents None, all upstream gradients None), read-only inputs never
  written, dispatch, and packed SIMD arithmetic in every new kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simd import assert_packed, host_has_avx
from test_jvp_cpu import (
    STRATEGIES,
    _assert_agree32,
    _assert_agree64,
    _cast,
    _fields,
    _split,
    _tangents,
)

import gradcells as gc
from gradcells import _dispatch, testing
from gradcells.cells import OPS
from gradcells.cells.gru import _cpu_kernels as gru_kernels
from gradcells.cells.rnn import _cpu_kernels as rnn_kernels
from gradcells.cells.rnn.cpu import _reads_saved_states

CPU_OPS = ["rnn_cell", "rnn_sequence", "gru_cell", "gru_sequence"]
SEQUENCES = ["rnn_sequence", "gru_sequence"]


def _upstreams(op, result, seed, none_rate=0.25):
    """The gradient op's upstream gradients and their tangents, each drawn or None: one for
    every field of the result that the spec names (the GRU's gates too, docs/spec.md §16.1)."""
    rng = np.random.default_rng(seed + 1)
    names = [name.removeprefix("d_") for name in OPS[op].upstream]
    out = {}
    for name in names:
        for key in (f"d_{name}", f"d_{name}_tangent"):
            if rng.random() >= none_rate:
                value = getattr(result, name)
                out[key] = rng.standard_normal(value.shape).astype(value.dtype)
    return out


def _result(op, case):
    positional, keywords = _split(op, case)
    return getattr(gc, op)(*positional, **keywords, backend="cpu")


def _grad_jvp(op, case, result, tangents, upstreams, backend):
    positional, keywords = _split(op, case)
    return getattr(gc, f"{op}_grad_jvp")(*positional, result, tangents, **keywords,
                                         **upstreams, backend=backend)


def _grad(op, case, result, upstreams):
    positional, keywords = _split(op, case)
    gradients = {k: v for k, v in upstreams.items() if not k.endswith("_tangent")}
    return getattr(gc, f"{op}_grad")(*positional, result, **keywords, **gradients,
                                     backend="cpu")


def _check_case(op, case, seed, none_rate=0.25):
    result = _result(op, case)
    tangents = _tangents(op, case, seed, none_rate)
    upstreams = _upstreams(op, result, seed, none_rate)
    got = _grad_jvp(op, case, result, tangents, upstreams, "cpu")
    want = _grad_jvp(op, case, result, tangents, upstreams, "reference")
    _assert_agree64(got[0], want[0], "grads")
    _assert_agree64(got[1], want[1], "grads_tangent")
    own = _grad(op, case, result, upstreams)
    _assert_agree64(got[0], own, "the cpu's grads")
    if op in SEQUENCES and not case.get("reverse"):
        for name, value in _fields(own).items():
            np.testing.assert_array_equal(getattr(got[0], name), value, err_msg=name)
    return got


def _check_case32(op, case, seed):
    case32 = {k: _cast(v, np.float32) for k, v in case.items()}
    result = _result(op, case32)
    tangents = _cast(_tangents(op, case, seed), np.float32)
    upstreams = {k: v.astype(np.float32) for k, v in _upstreams(op, result, seed).items()}

    def as64(value):
        return _cast(value, np.float64)

    exact = _grad_jvp(op, {k: as64(v) for k, v in case32.items()}, as64(result),
                      as64(tangents), {k: as64(v) for k, v in upstreams.items()}, "reference")
    got = _grad_jvp(op, case32, result, tangents, upstreams, "cpu")
    ref = _grad_jvp(op, case32, result, tangents, upstreams, "reference")
    for k, what in enumerate(("grads", "grads_tangent")):
        _assert_agree32(got[k], ref[k], exact[k], what, ulps=8, times=4)


@pytest.mark.parametrize("op", CPU_OPS)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_agrees_with_the_reference_on_drawn_cases(op, data, seed):
    _check_case(op, data.draw(STRATEGIES[op]()), seed)


@pytest.mark.parametrize("op", CPU_OPS)
@settings(max_examples=15)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_float32_agrees_with_the_reference_on_drawn_cases(op, data, seed):
    _check_case32(op, data.draw(STRATEGIES[op]()), seed)


@pytest.mark.parametrize("op", CPU_OPS)
def test_agrees_with_the_reference_on_random_cases(op):
    rng = np.random.default_rng(21)
    for k in range(25):
        case = testing.OPS[op][0](rng)
        _check_case(op, case, k)
        _check_case32(op, case, k)


@pytest.mark.parametrize("op", CPU_OPS)
@settings(max_examples=6)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_oracle_passes_on_the_cpu(op, seed):
    case = testing.OPS[op][0](np.random.default_rng(seed))
    testing.grad_jvp_check(op, case, seed=seed, backend="cpu").raise_if_failed()


@pytest.mark.parametrize("op", CPU_OPS)
def test_numpy_arrays_run_the_second_order_on_the_cpu(op):
    cpu = _dispatch.backend_module("cpu")
    assert hasattr(cpu, f"{op}_grad_jvp")
    assert _dispatch.backend_for(None, "numpy") is cpu
    assert hasattr(cpu, f"{op}_grad_jvp")
    assert _dispatch.backend_for("cpu", "numpy") is cpu


def _sequence_case(op, steps, batch, n_in, hidden, seed=5, **options):
    make = {"rnn_sequence": testing.rnn_sequence_case,
            "gru_sequence": testing.gru_sequence_case}[op]
    return make(np.random.default_rng(seed), steps=steps, batch=batch, input_size=n_in,
                hidden=hidden, **options)


def _variants(op):
    """Each activation or GRU variant of ``op`` as the case's keywords."""
    if op.startswith("rnn"):
        return [{"activation": "tanh"}, {"activation": "relu"}]
    return [{"reset_after": False}, {"reset_after": True}]


@pytest.mark.parametrize("op", SEQUENCES)
@pytest.mark.parametrize("sizes", [(0, 3, 2, 4), (3, 0, 2, 4), (3, 2, 0, 4), (3, 2, 2, 0),
                                   (0, 0, 0, 0), (1, 1, 1, 1), (5, 3, 4, 19)])
def test_edge_sizes(op, sizes):
    for options in _variants(op):
        case = _sequence_case(op, *sizes, ragged=True, masks=True, **options)
        _check_case(op, case, 0)
        _check_case(op, case, 1, none_rate=0.0)


@pytest.mark.parametrize("op", SEQUENCES)
@pytest.mark.parametrize("lengths", [[0, 0, 0], [4, 4, 4], [0, 4, 2], [1, 0, 3]])
def test_lengths_zero_and_full(op, lengths):
    for options in _variants(op):
        case = _sequence_case(op, 4, 3, 2, 5, masks=True, **options)
        case["seq_len"] = np.array(lengths)
        _check_case(op, case, 2, none_rate=0.0)


@pytest.mark.parametrize("op", SEQUENCES)
@pytest.mark.parametrize("kind", ["fractional", "binary", "one step"])
def test_zoneout_binary_reads_the_saved_states_fractional_recomputes(op, kind):
    for options in _variants(op):
        case = _sequence_case(op, 5, 4, 3, 6, ragged=True, masks=True, **options)
        rng = np.random.default_rng(12)
        shape = (5, 4, 6) if kind != "one step" else (4, 6)
        zoneout = rng.uniform(0.0, 1.0, shape)
        if kind == "binary":
            zoneout = np.round(zoneout)
        case["zoneout_h"] = zoneout
        assert _reads_saved_states(zoneout) == (kind == "binary")
        _check_case(op, case, 12, none_rate=0.0)
        _check_case32(op, case, 12)


@pytest.mark.parametrize("op", CPU_OPS)
def test_zero_tangents_give_zero_tangents(op):
    case = testing.OPS[op][0](np.random.default_rng(3))
    result = _result(op, case)
    upstreams = {k: v for k, v in _upstreams(op, result, 3, 0.0).items()
                 if not k.endswith("_tangent")}
    grads, d_grads = _grad_jvp(op, case, result, None, upstreams, "cpu")
    for name, value in _fields(d_grads).items():
        assert not np.any(value), name
    none = _grad_jvp(op, case, result, None, {}, "cpu")      # no upstream gradients at all
    for part in none:
        for name, value in _fields(part).items():
            assert not np.any(value), name


@pytest.mark.parametrize("op", CPU_OPS)
def test_every_tangent_alone(op):
    case = testing.OPS[op][0](np.random.default_rng(4))
    result = _result(op, case)
    spec = OPS[op]
    full = _tangents(op, case, 4, none_rate=0.0)
    upstreams = _upstreams(op, result, 4, none_rate=0.0)
    gradients = {k: v for k, v in upstreams.items() if not k.endswith("_tangent")}
    alone = [(spec.grads(**{f: getattr(full, f) if f == field else None
                            for f in spec.grads._fields}), gradients, field)
             for field in spec.grads._fields if getattr(full, field) is not None]
    alone += [(None, {**gradients, key: value}, key)
              for key, value in upstreams.items() if key.endswith("_tangent")]
    for tangents, ups, what in alone:
        got = _grad_jvp(op, case, result, tangents, ups, "cpu")[1]
        want = _grad_jvp(op, case, result, tangents, ups, "reference")[1]
        _assert_agree64(got, want, what)


@pytest.mark.parametrize("op", CPU_OPS)
def test_inputs_are_never_written(op):
    case = testing.OPS[op][0](np.random.default_rng(6))
    result = _result(op, case)
    tangents = _tangents(op, case, 6, none_rate=0.0)
    upstreams = _upstreams(op, result, 6, none_rate=0.0)
    frozen = []
    for value in (*case.values(), *result, *tangents, *upstreams.values()):
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
            frozen.append((value, value.copy()))
    pair = _grad_jvp(op, case, result, tangents, upstreams, "cpu")
    for value, copy in frozen:
        np.testing.assert_array_equal(value, copy)
    for value in (*_fields(pair[0]).values(), *_fields(pair[1]).values()):
        assert value.flags.writeable and not any(value is v for v, _ in frozen)


@pytest.mark.parametrize("op", SEQUENCES)
def test_large_hidden_sizes(op):
    for options in _variants(op):
        case = _sequence_case(op, 6, 5, 9, 37, seed=7, ragged=True, masks=True, **options)
        _check_case(op, case, 7)
        _check_case32(op, case, 7)


@pytest.mark.parametrize("op", SEQUENCES)
def test_long_sequences(op):
    """30 steps: the tangent's round-off, carried back through every step, stays within
    the float32 rule."""
    for options in _variants(op):
        case = _sequence_case(op, 30, 8, 16, 33, seed=13, ragged=True, masks=True, **options)
        _check_case(op, case, 13)
        _check_case32(op, case, 13)


# What shows each kernel is vectorized: the products of its tangent's terms.
GRAD_JVP_KERNELS = [
    rnn_kernels.rnn_backward_tangent_kernel,
    gru_kernels.gru_reset_after_grad_tangent_kernel,
    gru_kernels.gru_candidate_grad_tangent_kernel,
    gru_kernels.gru_reset_grad_tangent_kernel,
]


@pytest.mark.skipif(not host_has_avx(), reason="the check looks for AVX (ymm/zmm) registers")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_second_order_kernels_use_vector_registers(dtype):
    for op in SEQUENCES:
        for options in _variants(op):
            case = {k: _cast(v, dtype) for k, v in _sequence_case(op, 2, 3, 2, 4,
                                                                  **options).items()}
            result = _result(op, case)
            _grad_jvp(op, case, result, None, {"d_h": np.ones_like(result.h)}, "cpu")
    assert_packed(dict.fromkeys(GRAD_JVP_KERNELS, "vmul"), dtype)
