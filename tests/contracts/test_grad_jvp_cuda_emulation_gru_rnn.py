"""Second order (docs/spec.md §12) of the GPU backend's plain RNN and GRU run on the CPU:
the cells' ``gpu.py``'s ``rnn_*_grad_jvp`` and ``gru_*_grad_jvp`` with the host emulation of
``tests/contracts/test_cuda_emulation.py`` (the very ``.cu`` source, compiled for the host; NumPy
standing in for CuPy), called through the public layer with ``backend="gpu"``.

- Hypothesis-drawn cases with every option of each cell (``gradcells.testing`` strategies:
  tanh and relu, both GRU variants, masks and zoneout, both directions and layouts, ragged
  lengths, empty sizes), tangents and upstream gradients (and their tangents) drawn or None:
  the gradient and its tangent against the reference's ``*_grad_jvp`` in float64 on the same
  (rounded) inputs, by ``tests/contracts/test_jvp_cuda_emulation.py``'s agreement rule (16
  eps(dtype)
  relative to the size of the reference's field), float64, float32 and float16; the
  gradient also equal to the emulated GPU's own ``*_grad``.
- float64 finite differences (``gradcells.testing.grad_jvp_check``) with tiny launch grids.
- Edge cases: T = 0, B = 0, I = 0, H = 0, lengths 0 and T, no tangents, read-only inputs
  never modified; the same bits for every launch shape and thread order.
"""

import importlib
import inspect

import backend_calls
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cuda_emulation import (
    DTYPES,
    TINY,
    _split_case,
    assert_close,
    cast,
    cuda_host,
    emulated_gpu,
    public_gpu,
)
from test_jvp_cuda_emulation import _strategy, _tangents

import gradcells as gc
from gradcells import _dispatch, _order, cells, reference
from gradcells.cells import OPS as OPS_SPECS
from gradcells.gpu import _launch
from gradcells.testing import (
    grad_jvp_check,
    gru_cell_case,
    gru_sequence_case,
    rnn_cell_case,
    rnn_sequence_case,
)

# The GPU backend: every cell's ``gpu.py`` (``gradcells.cells.<cell>.gpu``).
gpu = _dispatch.backend_module("gpu")

pytestmark = pytest.mark.skipif(cuda_host.compiler() is None,
                                reason="no C++ compiler for the host emulation")

OPS = ("rnn_cell", "rnn_sequence", "gru_cell", "gru_sequence")
_CASES = {"rnn_cell": rnn_cell_case, "rnn_sequence": rnn_sequence_case,
          "gru_cell": gru_cell_case, "gru_sequence": gru_sequence_case}
_VARIANTS = {"rnn": ({"activation": "tanh"}, {"activation": "relu"}),
             "gru": ({"reset_after": False}, {"reset_after": True})}
# The kernels that only the second order launches.
_TANGENT_KERNELS = {"rnn": {"rnn_backward_tangent"},
                    "gru": {"gru_backward_candidate_tangent", "gru_backward_gates_tangent"}}


def _is_sequence(op):
    return op.endswith("_sequence")


def _upstream_names(op):
    """Every upstream gradient the op's gradient takes (the GRU's gates too, docs/spec.md
    §16.1)."""
    return OPS_SPECS[op].upstream


UPSTREAM_FLAGS = 2 * max(len(_upstream_names(op)) for op in OPS)
"""How many upstream gradients and tangents an op takes at most: the ``wanted`` flags'."""


def _as64(value):
    return None if value is None else value.astype(np.float64)


def _tuple64(values):
    return type(values)(*(_as64(v) for v in values))


def _public(case):
    """Whether the public layer takes the case's arrays (NumPy float16 it does not: those
    cases call the backend's functions as the public layer would, ``_order``)."""
    return case["x"].dtype != np.float16


def _ordered_call(backend, suffix, op, case, *args, **upstream):
    """``backend.<op><suffix>`` (suffix "", "_grad" or "_grad_jvp"; ``args``: the result,
    then the tangents) on the case, in its time order and layout (``_order``, as the public
    layer runs it)."""
    spec = OPS_SPECS[op]
    function = getattr(backend, spec.grad_name if suffix == "_grad" else f"{op}{suffix}")
    weights, settings = backend_calls.weights_and_settings(op, case)
    x, states = case["x"], tuple(case[name] for name in spec.states)
    if not _is_sequence(op):
        return function(x, *states, weights, *args, settings, **upstream)
    if suffix == "":
        return _order.forward(spec, function, x, states, weights, settings)
    order = _order.grad if suffix == "_grad" else _order.grad_jvp
    return order(spec, function, x, states, weights, *args, settings, upstream)


def _forward(op, case):
    """The op's result on the emulated GPU (in the case's dtype and layout)."""
    if not _public(case):
        with emulated_gpu() as backend:
            return _ordered_call(backend, "", op, case)
    positional, keywords = _split_case(op, case)
    with public_gpu():
        return getattr(gc, op)(*positional, **keywords, backend="gpu")


def _upstream(op, result, rng, dtype, wanted):
    """Upstream gradients and their tangents, each drawn or None (``wanted``)."""
    drawn = {}
    for k, name in enumerate(_upstream_names(op)):
        shape = getattr(result, name.removeprefix("d_")).shape
        for key, on in ((name, wanted[2 * k]), (f"{name}_tangent", wanted[2 * k + 1])):
            drawn[key] = rng.standard_normal(shape).astype(dtype) if on else None
    return drawn


def grad_jvp(op, case, result, tangents, upstream, backend, policy=None, reverse=False):
    """``gc.<op>_grad_jvp`` on the case (``backend="gpu"``: the emulated GPU; float16: its
    function, as the public layer calls it)."""
    launch = () if policy is None else (policy, reverse)
    if backend == "gpu" and not _public(case):
        with emulated_gpu(*launch) as gpu_backend:
            return _ordered_call(gpu_backend, "_grad_jvp", op, case, result, tangents,
                                 **upstream)
    positional, keywords = _split_case(op, case)
    call = getattr(gc, f"{op}_grad_jvp")
    if backend != "gpu":
        return call(*positional, result, tangents, **upstream, **keywords, backend=backend)
    with public_gpu(*launch):
        return call(*positional, result, tangents, **upstream, **keywords, backend="gpu")


def _own_grad(op, case, result, upstream):
    """The emulated GPU's own ``<op>_grad`` (the primal half must be it)."""
    gradients = {k: v for k, v in upstream.items() if not k.endswith("_tangent")}
    with emulated_gpu() as backend:
        return _ordered_call(backend, "_grad", op, case, result, **gradients)


def _check(op, case, dtype, seed, wanted, upstream_wanted):
    """The emulated GPU's second order against the float64 reference's on the same inputs,
    tangents and upstream gradients (rounded to ``dtype``), gradient and tangent, the
    file's agreement rule; the gradient bit for bit the GPU's own."""
    case = cast(case, dtype)
    rng = np.random.default_rng(seed)
    result = _forward(op, case)
    tangents = _tangents(op, case, rng, wanted)
    upstream = _upstream(op, result, rng, dtype, upstream_wanted)
    grads, d_grads = grad_jvp(op, case, result, tangents, upstream, "gpu")
    expected, d_expected = grad_jvp(op, cast(case, np.float64), _tuple64(result),
                                    _tuple64(tangents),
                                    {k: _as64(v) for k, v in upstream.items()}, "reference")
    assert_close(grads, expected, dtype, f"{op} gradient ")
    assert_close(d_grads, d_expected, dtype, f"{op} gradient's tangent ")
    for got, own in zip(grads, _own_grad(op, case, result, upstream), strict=True):
        np.testing.assert_array_equal(got, own)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), wanted=st.tuples(*[st.booleans()] * 6),
       upstream=st.tuples(*[st.booleans()] * UPSTREAM_FLAGS), seed=st.integers(0, 2**16))
def test_grad_jvp_matches_reference(op, dtype, data, wanted, upstream, seed):
    _check(op, data.draw(_strategy(op)), dtype, seed, wanted, upstream)


def test_the_gpu_backend_has_the_second_order_ops():
    for op in OPS:
        name = f"{op}_grad_jvp"
        assert hasattr(gpu, name) and name in vars(
            cells.implementation(op.split("_")[0], "gpu"))
        assert getattr(gpu, name) is getattr(importlib.import_module(
            f"gradcells.cells.{op.split('_')[0]}.gpu"), name)
        assert inspect.signature(getattr(gpu, name)) == inspect.signature(
            getattr(reference, name))
        assert hasattr(gpu, name)
        assert _dispatch.backend_for("gpu", "cupy") is gpu
        assert hasattr(gpu, name)
        assert _dispatch.backend_for(None, "cupy") is gpu


def _options_case(op, variant, rng, **sizes):
    options = _VARIANTS[op.split("_")[0]][variant]
    if _is_sequence(op):
        return _CASES[op](rng, **{"steps": 3, "batch": 3, "input_size": 2, "hidden": 3,
                                  **sizes}, **options)
    return _CASES[op](rng, **{"batch": 3, "input_size": 2, "hidden": 3, **sizes}, **options)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("reverse, batch_first", [(False, False), (True, True)])
def test_grad_jvp_matches_finite_differences(op, variant, reverse, batch_first):
    """float64, every mask, ragged lengths, tiny launch grids: against the oracle, the
    tangent kernels launched."""
    if not _is_sequence(op) and reverse:
        return
    extra = (dict(ragged=True, masks=True, reverse=reverse, batch_first=batch_first)
             if _is_sequence(op) else {})
    case = _options_case(op, variant, np.random.default_rng(31), **extra)
    with public_gpu(TINY):
        report = grad_jvp_check(op, case, backend="gpu")
        launched = set(_launch.runtime().launches)
    assert _TANGENT_KERNELS[op.split("_")[0]] <= launched
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sizes", [dict(steps=0), dict(batch=0), dict(input_size=0),
                                   dict(hidden=0)])
@pytest.mark.parametrize("wanted", [(True,) * 6, (False,) * 6])
@pytest.mark.parametrize("variant", [0, 1])
def test_grad_jvp_empty_sizes_and_no_tangents(op, sizes, wanted, variant):
    if not _is_sequence(op) and "steps" in sizes:
        return
    case = _options_case(op, variant, np.random.default_rng(5), **sizes)
    _check(op, case, np.float64, 0, wanted, wanted[:1] * UPSTREAM_FLAGS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["rnn_sequence", "gru_sequence"])
@pytest.mark.parametrize("variant", [0, 1])
def test_grad_jvp_lengths_zero_and_full(dtype, op, variant):
    """Rows of length 0 pass the final state's gradient and its tangent to h0; rows of
    length T run every step."""
    rng = np.random.default_rng(9)
    case = _options_case(op, variant, rng, masks=True)
    case["seq_len"] = np.array([0, 3, 2])
    _check(op, case, dtype, 1, (True,) * 6, (True,) * UPSTREAM_FLAGS)
    case = _options_case(op, variant, rng)
    case["seq_len"] = np.array([0, 0, 0])
    _check(op, case, dtype, 2, (True,) * 6, (True,) * UPSTREAM_FLAGS)


@pytest.mark.parametrize("op", OPS)
def test_read_only_inputs_are_never_modified(op):
    rng = np.random.default_rng(3)
    extra = dict(ragged=True, masks=True) if _is_sequence(op) else {}
    case = _options_case(op, 1, rng, **extra)
    result = _forward(op, case)
    tangents = _tangents(op, case, rng, (True,) * 6)
    upstream = _upstream(op, result, rng, np.float64, (True,) * UPSTREAM_FLAGS)
    arrays = [a for a in (*case.values(), *result, *tangents, *upstream.values())
              if isinstance(a, np.ndarray)]
    saved = [a.copy() for a in arrays]
    for a in arrays:
        a.flags.writeable = False
    for pair in grad_jvp(op, case, result, tangents, upstream, "gpu"):
        for g in pair:
            assert not any(np.shares_memory(g, a) for a in arrays)
    for a, s in zip(arrays, saved, strict=True):
        np.testing.assert_array_equal(a, s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("variant", [0, 1])
def test_grad_jvp_does_not_depend_on_launch_shape_or_thread_order(op, dtype, variant):
    """Tiny blocks and grids (every grid-stride loop wraps, two-pass column sums), threads
    run in reverse: the same bits, but for the bias gradients and their tangents (column
    sums: their summation order) at another launch shape."""
    rng = np.random.default_rng(13)
    extra = dict(ragged=True, masks=True) if _is_sequence(op) else {}
    case = cast(_options_case(op, variant, rng, **extra), dtype)
    result = _forward(op, case)
    tangents = _tangents(op, case, rng, (True,) * 6)
    upstream = _upstream(op, result, rng, dtype, (True,) * UPSTREAM_FLAGS)
    runs = [grad_jvp(op, case, result, tangents, upstream, "gpu", policy, reverse)
            for policy, reverse in ((None, False), (TINY, False), (TINY, True))]
    eps = np.finfo(dtype).eps
    for default, tiny, tiny_reversed in zip(*runs, strict=True):  # gradient, then its tangent
        for a, b, c in zip(default, tiny, tiny_reversed, strict=True):
            assert not np.isnan(a).any()
            np.testing.assert_array_equal(b, c)
            if a.ndim == 1:
                np.testing.assert_allclose(b.astype(np.float64), a, rtol=16 * eps,
                                           atol=16 * eps * (1 + np.max(np.abs(a), initial=0)))
            else:
                np.testing.assert_array_equal(a, b)
