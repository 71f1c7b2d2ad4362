"""Pure functions (docs/spec.md §1, §7), one contract for every op on every backend: inputs
never modified, results never alias inputs, memory order irrelevant, extreme pre-activations
finite and warning-free.

Every op of ``gradcells.cells.OPS`` (the LSTM, GRU and plain RNN, cell and sequence),
on every backend that takes NumPy arrays here (``contract_cases.BACKENDS``: the reference,
the CPU, the GPU backend through the host emulation), below the public layer and, on the
NumPy backends, through it; all four modes: the forward, the gradient (the LSTM's in both
``clip_grad`` modes), forward mode (``_jvp``) and second order (``_grad_jvp``). Cases are
drawn with every option (``contract_cases.cases``: sizes from 0, peepholes, clips, the
projection, the layer norm, reset-after, both activations, ragged lengths, both directions
and layouts, every mask).
"""

import warnings

import numpy as np
import pytest
from contract_cases import (
    BACKENDS,
    CONTRACT_EXAMPLES,
    EMULATED_GPU,
    OP_NAMES,
    OPTIONS,
    arrays_in,
    calls,
    cases,
    cell_of,
    fixed_case,
    tangents,
    upstream,
)
from hypothesis import given
from hypothesis import strategies as st

from gradcells.cells import OPS
from gradcells.cells.lstm.spec import CLIP_GRADS, LSTMNorm

LAYERS = [pytest.param(name, "backend", id=name.split()[0]) for name in BACKENDS] + [
    pytest.param(name, "public", id=f"{name}-public") for name in BACKENDS
    if name != EMULATED_GPU]


def _clip_grads(op):
    return CLIP_GRADS if cell_of(op) == "lstm" else (None,)


def _snapshot(inputs):
    return {path: a.copy() for path, a in arrays_in(inputs)}


def _assert_unmodified(inputs, before, call):
    for path, a in arrays_in(inputs):
        assert a.dtype == before[path].dtype and a.shape == before[path].shape, (call, path)
        np.testing.assert_array_equal(a, before[path], err_msg=f"{call} modified {path}")


def _assert_no_alias(outputs, inputs, call):
    given_arrays = list(arrays_in(inputs))
    for out_path, out in arrays_in(outputs, call):
        for path, a in given_arrays:
            assert not np.shares_memory(out, a), f"{out_path} aliases input {path}"


def _checked(call, inputs, run):
    """``run()``, with every array of ``inputs`` unmodified by it and none aliased by what
    it returns."""
    before = _snapshot(inputs)
    outputs = run()
    _assert_unmodified(inputs, before, call)
    _assert_no_alias(outputs, inputs, call)
    return outputs


def _all_modes_are_pure(c, op, case, seed, clip_grad):
    rng = np.random.default_rng(seed)
    extra = {} if clip_grad is None else {"clip_grad": clip_grad}
    result = _checked("forward", {"case": case}, lambda: c.forward(op, case))
    up = upstream(op, result, rng)
    _checked("grad", {"case": case, "result": result, "upstream": up},
             lambda: c.grad(op, case, result, **up, **extra))
    t = tangents(op, case, rng)
    _checked("jvp", {"case": case, "tangents": t}, lambda: c.jvp(op, case, t))
    up_t = {f"{k}_tangent": v for k, v in upstream(op, result, rng).items()}
    _checked("grad_jvp", {"case": case, "result": result, "tangents": t, "upstream": up,
                          "upstream tangents": up_t},
             lambda: c.grad_jvp(op, case, result, t, **up, **up_t, **extra))


@pytest.mark.parametrize(("backend", "layer"), LAYERS)
@pytest.mark.parametrize("op", OP_NAMES)
@CONTRACT_EXAMPLES
@given(data=st.data())
def test_no_mode_modifies_its_inputs_or_aliases_them(op, backend, layer, data):
    """The forward, the gradient (upstream gradients and the forward's result given), the
    forward mode and the second order (tangents and upstream tangents given): none writes an
    input (the case's arrays, masks and lengths included), none returns an array sharing
    memory with one."""
    case = data.draw(cases(op, layer=layer), label="case")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    with calls(backend, layer) as c:
        for clip_grad in _clip_grads(op):
            _all_modes_are_pure(c, op, case, seed, clip_grad)


# --------------------------------------------------------------------------------------
# Memory order


def _reordered(value, how):
    """The same values in another memory layout: Fortran order, or strided views."""
    if isinstance(value, LSTMNorm):
        return LSTMNorm(*(_reordered(v, how) for v in value))
    if not isinstance(value, np.ndarray):
        return value
    if how == "fortran":
        return np.asfortranarray(value)
    padded = np.zeros(tuple(2 * n for n in value.shape), dtype=value.dtype)
    padded[tuple(slice(None, None, 2) for _ in value.shape)] = value
    view = padded[tuple(slice(None, None, 2) for _ in value.shape)]
    assert value.size <= 1 or not view.flags.c_contiguous
    return view


def _assert_close(actual, expected, what):
    for (path, want), (_, got) in zip(arrays_in(expected, what), arrays_in(actual, what),
                                      strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=path)


@pytest.mark.parametrize("how", ["fortran", "strided"])
@pytest.mark.parametrize(("backend", "layer"), LAYERS)
@pytest.mark.parametrize("op", OP_NAMES)
@CONTRACT_EXAMPLES
@given(data=st.data())
def test_memory_layout_does_not_matter(op, backend, layer, how, data):
    """The forward and the gradient of a case in Fortran order or as strided views equal
    those of the C-contiguous case (1e-12), in every ``clip_grad`` mode."""
    case = data.draw(cases(op, min_size=1, layer=layer), label="case")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    moved = {k: _reordered(v, how) for k, v in case.items()}
    with calls(backend, layer) as c:
        result = c.forward(op, case)
        up = upstream(op, result, rng)
        _assert_close(c.forward(op, moved), result, "forward")
        moved_up = {k: _reordered(v, how) for k, v in up.items()}
        for clip_grad in _clip_grads(op):
            extra = {} if clip_grad is None else {"clip_grad": clip_grad}
            _assert_close(c.grad(op, moved, c.forward(op, moved), **moved_up, **extra),
                          c.grad(op, case, result, **up, **extra), "grad")


# --------------------------------------------------------------------------------------
# Extreme pre-activations


def _extreme(case, magnitude):
    """``x`` times ``magnitude`` and every bias ``±magnitude``: pre-activations of either
    sign up to about ``|z| = magnitude``."""
    out = dict(case)
    out["x"] = (magnitude * case["x"]).astype(case["x"].dtype)
    for name in ("b", "b_ru", "b_c", "b_a", "b_x", "lam"):
        if name in case:
            out[name] = (magnitude * np.sign(case[name])).astype(case[name].dtype)
    return out


def _assert_finite_and_silent(c, op, case, dtype):
    rng = np.random.default_rng(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            result = c.forward(op, case)
            up = {k: np.ones_like(v) for k, v in upstream(op, result, rng).items()}
            grads = c.grad(op, case, result, **up)
    for path, a in [*arrays_in(result, "result"), *arrays_in(grads, "grads")]:
        assert a.dtype == dtype, path
        assert np.all(np.isfinite(a)), path


_EXTREME_OPTIONS = {"lstm": [{"peephole": True}], "gru": OPTIONS["gru"], "rnn": OPTIONS["rnn"],
                    "mingru": OPTIONS["mingru"], "slstm": OPTIONS["slstm"],
                    "minlstm": OPTIONS["minlstm"], "rglru": OPTIONS["rglru"]}


@pytest.mark.parametrize(("backend", "layer"), LAYERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("magnitude", [1e2, 1e4])
@pytest.mark.parametrize("op", [op for op in OP_NAMES if not OPS[op].sequence])
def test_extreme_preactivations_are_finite_and_silent(op, magnitude, dtype, backend, layer):
    """Pre-activations of either sign up to |z| = 1e4 (the LSTM with peepholes, the GRU
    both variants, the RNN both activations): no overflow, no NaN, no warning."""
    with calls(backend, layer) as c:
        for options in _EXTREME_OPTIONS[cell_of(op)]:
            case = fixed_case(op, np.random.default_rng(4), steps=0, batch=4, input_size=3,
                              hidden=6, dtype=dtype, **options)
            _assert_finite_and_silent(c, op, _extreme(case, magnitude), dtype)


_SEQUENCE_EXTREME_OPTIONS = {"lstm": [{"peephole": True, "clip": True}],
                             "gru": OPTIONS["gru"], "rnn": OPTIONS["rnn"],
                             "mingru": OPTIONS["mingru"], "slstm": OPTIONS["slstm"],
                             "minlstm": OPTIONS["minlstm"], "rglru": OPTIONS["rglru"]}


@pytest.mark.parametrize(("backend", "layer"), LAYERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", [op for op in OP_NAMES if OPS[op].sequence])
def test_extreme_preactivations_in_sequences_are_finite_and_silent(op, dtype, backend,
                                                                   layer):
    """The same over time, ragged rows (lengths 5, 0, 3), every variant: forward and BPTT at
    |z| ~ 1e4."""
    with calls(backend, layer) as c:
        for options in _SEQUENCE_EXTREME_OPTIONS[cell_of(op)]:
            case = fixed_case(op, np.random.default_rng(8), steps=5, batch=3, input_size=2,
                              hidden=4, dtype=dtype, **options)
            case = dict(_extreme(case, 1e4), seq_len=np.array([5, 0, 3]))
            _assert_finite_and_silent(c, op, case, dtype)
