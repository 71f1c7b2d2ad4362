"""The LSTM's second order on the CPU backend (docs/spec.md §12; ``gradcells.cells.lstm.cpu``)
against the reference's ``lstm_*_grad_jvp``, and its own guarantees.

- agreement with the reference, gradient and tangent, on Hypothesis-drawn cases with every
  option (peepholes, cell and projection clips under both ``clip_grad`` modes, projection,
  layer norm with both carries, masks and zoneout, ragged lengths, both orders and layouts,
  sizes from 0), tangents of every input and every upstream gradient drawn or None:
  float64 to 1e-12 relative to each array's scale; float32 by tests/contracts/test_jvp_cpu.py's rule
  for tangents (four times the float32 reference's error plus eight ulps of the scale; its
  ill-conditioned layer norms two columns wide not compared in float32, as there);
- the primal half is the CPU's own ``lstm_*_grad`` (to round-off);
- the oracle (``grad_jvp_check``: central differences) on drawn cases with
  ``backend="cpu"``;
- dispatch: NumPy arrays run the CPU's, never the reference's; edge cases (T = 0, B = 0,
  I = 0, H = 0, lengths 0 and T), None tangents and upstreams; read-only inputs never
  written.
"""

from __future__ import annotations

import inspect
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells import _dispatch, reference, testing
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.cells.lstm.spec import LSTMNorm

SIZES = {"min_size": 0, "max_batch": 5, "max_input": 5, "max_hidden": 21}
STRATEGIES = {
    "lstm_cell": lambda **k: testing.lstm_cell_inputs(
        peephole=None, clip=None, projection=None, layer_norm=None, **SIZES, **k),
    "lstm_sequence": lambda **k: testing.lstm_sequence_inputs(
        peephole=None, clip=None, ragged=None, projection=None, layer_norm=None,
        reverse=None, batch_first=None, masks=None, **SIZES, **k),
}
OPS_HERE = list(STRATEGIES)
UPSTREAMS = {op: {name: name.removeprefix("d_") for name in OPS[op].upstream}
             for op in OPS_HERE}
"""Every field's upstream gradient (docs/spec.md §16.1: the gates' too), by its field."""


def _split(op, case):
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def _draw(rng, value, none_rate):
    if value is None or rng.random() < none_rate:
        return None
    if isinstance(value, LSTMNorm):
        return LSTMNorm(*(_draw(rng, v, none_rate) for v in value))
    return rng.standard_normal(np.shape(value)).astype(value.dtype)


def _inputs(op, case, seed, none_rate=0.25):
    """``(result, tangents, upstream keywords)`` of a case: the forward's result, random
    tangents of every input and random upstream gradients and tangents (each None with
    ``none_rate``)."""
    rng = np.random.default_rng(seed)
    positional, keywords = _split(op, case)
    result = getattr(gc, op)(*positional, **keywords, backend="reference")
    spec = OPS[op]
    tangents = spec.grads(**{n: _draw(rng, case.get(n), none_rate) for n in spec.grads._fields})
    upstream = {}
    for name, field in UPSTREAMS[op].items():
        like = getattr(result, field)
        upstream[name] = _draw(rng, like, none_rate)
        upstream[f"{name}_tangent"] = _draw(rng, like, none_rate)
    return result, tangents, upstream


def _accepted(function, keywords):
    """The keywords ``function`` takes (the forward's ``forget_bias`` is in the result)."""
    names = inspect.signature(function).parameters
    return {k: v for k, v in keywords.items() if k in names}


def _grad_jvp(op, case, result, tangents, upstream, backend, clip_grad="exact"):
    positional, keywords = _split(op, case)
    function = getattr(gc, f"{op}_grad_jvp")
    return function(*positional, result, tangents, **_accepted(function, keywords),
                    **upstream, clip_grad=clip_grad, backend=backend)


def _cast(value, dtype):
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_cast(v, dtype) for v in value))
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _fields(result):
    return {k: np.asarray(v) for k, v in result._asdict().items()
            if isinstance(v, np.ndarray)}


def _assert_agree64(got, expected, what, rtol=1e-12):
    assert type(got) is type(expected), what
    for name, value in got._asdict().items():
        assert (value is None) == (getattr(expected, name) is None), (what, name)
    for name, want in _fields(expected).items():
        have = getattr(got, name)
        assert have.shape == want.shape and have.dtype == want.dtype, (what, name)
        scale = max(float(np.max(np.abs(want), initial=0.0)), 1.0)
        np.testing.assert_allclose(have, want, rtol=rtol, atol=rtol * scale,
                                   err_msg=f"{what}.{name}")


def _assert_agree32(got, ref32, exact, what, ulps=8, times=4):
    """tests/contracts/test_jvp_cpu.py's rule for tangents: ``got`` (float32) no further from
    ``exact`` (float64 on the same float32 inputs) than ``times`` × the float32 reference's
    error plus ``ulps`` float32 ulps of the array's scale (at least 1)."""
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


def _check_case(op, case, seed, clip_grad):
    result, tangents, upstream = _inputs(op, case, seed)
    got = _grad_jvp(op, case, result, tangents, upstream, "cpu", clip_grad)
    want = _grad_jvp(op, case, result, tangents, upstream, "reference", clip_grad)
    _assert_agree64(got[0], want[0], "grads")
    _assert_agree64(got[1], want[1], "tangent")
    positional, keywords = _split(op, case)      # the primal half: the CPU's own gradient
    grads = {k: v for k, v in upstream.items() if not k.endswith("_tangent")}
    gradient = getattr(gc, f"{op}_grad")
    own = gradient(*positional, result, **_accepted(gradient, keywords), **grads,
                   clip_grad=clip_grad, backend="cpu")
    _assert_agree64(got[0], own, "primal vs the CPU gradient", rtol=1e-13)


def _ill_conditioned32(case):
    """tests/contracts/test_jvp_cpu.py's: a layer norm at most two columns wide (H <= 2, or an input
    or state one column wide), whose derivative ``r ~ 1/|c̃₁ - c̃₂|`` amplifies the primal's
    float32 error; float64 and the oracle cover these cases."""
    if case.get("layer_norm") is None:
        return False
    cs = case["cs0"] if "cs0" in case else case["cs_prev"]
    h = case["h0"] if "h0" in case else case["h_prev"]
    return cs.shape[-1] <= 2 or case["x"].shape[-1] == 1 or h.shape[-1] == 1


def _check_case32(op, case, seed, clip_grad):
    if _ill_conditioned32(case):
        return
    case32 = _cast(case, np.float32)
    result, tangents, upstream = _inputs(op, case32, seed)
    exact_case = _cast(case32, np.float64)
    exact = _grad_jvp(op, exact_case, _cast(result, np.float64), _cast(tangents, np.float64),
                      _cast(upstream, np.float64), "reference", clip_grad)
    got = _grad_jvp(op, case32, result, tangents, upstream, "cpu", clip_grad)
    ref = _grad_jvp(op, case32, result, tangents, upstream, "reference", clip_grad)
    for k in range(2):
        _assert_agree32(got[k], ref[k], exact[k], ("grads", "tangent")[k])


CLIP_GRADS = st.sampled_from(["exact", "straight_through"])


@pytest.mark.parametrize("op", OPS_HERE)
@settings(max_examples=150)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), clip_grad=CLIP_GRADS)
def test_agrees_with_the_reference_on_drawn_cases(op, data, seed, clip_grad):
    _check_case(op, data.draw(STRATEGIES[op]()), seed, clip_grad)


@pytest.mark.parametrize("op", OPS_HERE)
@settings(max_examples=60)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), clip_grad=CLIP_GRADS)
def test_float32_agrees_with_the_reference_on_drawn_cases(op, data, seed, clip_grad):
    _check_case32(op, data.draw(STRATEGIES[op]()), seed, clip_grad)


@pytest.mark.parametrize("op", OPS_HERE)
def test_agrees_with_the_reference_on_random_cases(op):
    rng = np.random.default_rng(21)
    for k in range(40):
        case = testing.OPS[op][0](rng)
        clip_grad = ("exact", "straight_through")[k % 2]
        _check_case(op, case, k, clip_grad)
        _check_case32(op, case, k, clip_grad)


@pytest.mark.parametrize("op", OPS_HERE)
@settings(max_examples=8)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_oracle_passes_on_the_cpu(op, seed):
    case = testing.OPS[op][0](np.random.default_rng(seed))
    testing.grad_jvp_check(op, case, seed=seed, backend="cpu").raise_if_failed()


@pytest.mark.parametrize("op", OPS_HERE)
def test_numpy_arrays_run_the_cpus_second_order(op):
    cpu = _dispatch.backend_module("cpu")
    assert hasattr(cpu, f"{op}_grad_jvp")
    assert _dispatch.backend_for(None, "numpy") is cpu
    case = testing.OPS[op][0](np.random.default_rng(12))
    result, tangents, upstream = _inputs(op, case, 12, none_rate=0.0)
    with mock.patch.object(reference, f"{op}_grad_jvp",
                           side_effect=AssertionError("the reference ran")):
        got = _grad_jvp(op, case, result, tangents, upstream, None)
    want = _grad_jvp(op, case, result, tangents, upstream, "reference")
    _assert_agree64(got[1], want[1], "tangent")


def _sequence_case(steps, batch, n_in, hidden, **options):
    return testing.lstm_sequence_case(np.random.default_rng(5), steps=steps, batch=batch,
                                      input_size=n_in, hidden=hidden, **options)


EVERY_OPTION = {"peephole": True, "clip": True, "forget_bias": 0.5, "ragged": True,
                "masks": True}


@pytest.mark.parametrize("sizes", [(0, 3, 2, 4), (3, 0, 2, 4), (3, 2, 0, 4), (3, 2, 2, 0),
                                   (0, 0, 0, 0), (1, 1, 1, 1), (5, 3, 4, 19)])
@pytest.mark.parametrize("layer_norm, proj_size", [(False, None), (False, 2), (True, None),
                                                   (True, 1)])
def test_edge_sizes(sizes, layer_norm, proj_size):
    case = _sequence_case(*sizes, **EVERY_OPTION, proj_size=proj_size,
                          proj_clip=proj_size is not None, layer_norm=layer_norm,
                          ln_carry="normalized")
    for seed, clip_grad in ((0, "exact"), (1, "straight_through")):
        _check_case("lstm_sequence", case, seed, clip_grad)


@pytest.mark.parametrize("lengths", [[0, 0, 0], [4, 4, 4], [0, 4, 2], [1, 0, 3]])
def test_lengths_zero_and_full(lengths):
    case = _sequence_case(4, 3, 2, 5, **EVERY_OPTION, proj_size=3, proj_clip=True,
                          layer_norm=True)
    case["seq_len"] = np.array(lengths)
    _check_case("lstm_sequence", case, 2, "exact")


@pytest.mark.parametrize("op", OPS_HERE)
def test_none_tangents_and_upstreams(op):
    """All tangents None (the public layer's None too) and no upstream gradients: a zero
    tangent where the upstream tangents are zero, the reference's otherwise."""
    case = testing.OPS[op][0](np.random.default_rng(3))
    result, tangents, upstream = _inputs(op, case, 3, none_rate=1.0)
    got = _grad_jvp(op, case, result, None, upstream, "cpu")
    for name, value in _fields(got[1]).items():
        assert not np.any(value), name
    _, _, upstream = _inputs(op, case, 3, none_rate=0.0)
    upstream = {k: v if k.endswith("_tangent") else None for k, v in upstream.items()}
    got = _grad_jvp(op, case, result, None, upstream, "cpu")
    want = _grad_jvp(op, case, result, None, upstream, "reference")
    _assert_agree64(got[0], want[0], "grads")
    _assert_agree64(got[1], want[1], "tangent")


@pytest.mark.parametrize("op", OPS_HERE)
def test_every_tangent_alone(op):
    case = testing.OPS[op][0](np.random.default_rng(4))
    result, full, upstream = _inputs(op, case, 4, none_rate=0.0)
    spec = OPS[op]
    for field in spec.grads._fields:
        if getattr(full, field) is None:
            continue
        only = spec.grads(**{f: getattr(full, f) if f == field else None
                             for f in spec.grads._fields})
        none = {k: None if k.endswith("_tangent") else v for k, v in upstream.items()}
        got = _grad_jvp(op, case, result, only, none, "cpu")[1]
        want = _grad_jvp(op, case, result, only, none, "reference")[1]
        _assert_agree64(got, want, field)


@pytest.mark.parametrize("op", OPS_HERE)
def test_inputs_are_never_written(op):
    case = testing.OPS[op][0](np.random.default_rng(6))
    result, tangents, upstream = _inputs(op, case, 6, none_rate=0.0)
    frozen = []
    for value in (*case.values(), *tangents, *result, *upstream.values()):
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
            frozen.append((value, value.copy()))
    got = _grad_jvp(op, case, result, tangents, upstream, "cpu")
    for value, copy in frozen:
        np.testing.assert_array_equal(value, copy)
    for value in (*_fields(got[0]).values(), *_fields(got[1]).values()):
        assert value.flags.writeable and not any(value is v for v, _ in frozen)


@pytest.mark.parametrize("layer_norm, ln_carry", [(False, "raw"), (True, "raw"),
                                                  (True, "normalized")])
@pytest.mark.parametrize("proj_size", [None, 7])
@pytest.mark.parametrize("clip_grad", ["exact", "straight_through"])
def test_every_option_at_large_sizes(layer_norm, ln_carry, proj_size, clip_grad):
    case = testing.lstm_sequence_case(
        np.random.default_rng(8), steps=5, batch=4, input_size=9, hidden=37,
        **EVERY_OPTION, proj_size=proj_size, proj_clip=proj_size is not None,
        layer_norm=layer_norm, ln_carry=ln_carry)
    _check_case("lstm_sequence", case, 8, clip_grad)
    _check_case32("lstm_sequence", case, 8, clip_grad)
    cell = {"x": case["x"][0], "cs_prev": case["cs0"], "h_prev": case["h0"],
            **{k: case[k] for k in ("w", "b", "wci", "wcf", "wco", "cell_clip")},
            **{k: case[k] for k in ("w_proj", "proj_clip", "layer_norm", "ln_carry",
                                    "ln_epsilon") if k in case}}
    _check_case("lstm_cell", cell, 9, clip_grad)
