"""Second order (docs/spec.md §12) of the GPU backend's LSTM run on the CPU:
``gradcells.cells.lstm.gpu.lstm_cell_grad_jvp`` and ``lstm_sequence_grad_jvp`` with the host
emulation of ``tests/contracts/test_cuda_emulation.py`` (the very ``.cu`` source, compiled for the
host; NumPy
standing in for CuPy), called through the public layer with ``backend="gpu"``.

Checked on Hypothesis-drawn cases with every option but the layer norm (peepholes, clips,
both ``clip_grad`` modes, projection, masks and zoneout, ragged lengths, both directions and
layouts, empty sizes; upstream gradients and their tangents drawn or None), the gradient
and its tangent, against the float64 reference on the same (rounded) inputs at
``tests/contracts/test_jvp_cuda_emulation.py``'s agreement rule (16 eps(dtype) relative to the size
of the reference's field), and the primal half against the emulated GPU's own ``*_grad``
bit for bit; in float64 also against finite differences (``gc.testing.grad_jvp_check``).
The layer-normalised LSTM on its own cases (both carries, projection, clip, masks, lengths):
by the emulation file's layer-norm rule in float64 and float32, and finite differences.
"""

import backend_calls
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cuda_emulation import (
    DTYPES,
    OPTIONAL_WEIGHTS,
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
    grad_jvp_check,
    lstm_cell_case,
    lstm_cell_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
)

# The GPU backend: every cell's ``gpu.py`` (``gradcells.cells.<cell>.gpu``).
gpu = _dispatch.backend_module("gpu")

pytestmark = pytest.mark.skipif(cuda_host.compiler() is None,
                                reason="no C++ compiler for the host emulation")

OPS = ("lstm_cell", "lstm_sequence")
# The projection drawn (the strategies' default: off); the layer norm on its own cases below.
_DRAWN = {"layer_norm": False, "projection": None}
_UPSTREAM = {op: OPS_SPECS[op].upstream for op in OPS}  # every field's (§16.1)


def _strategy(op):
    """Drawn cases with every option but the layer norm (as test_jvp_cuda_emulation.py's)."""
    if op == "lstm_cell":
        return lstm_cell_inputs(min_size=0, **_DRAWN)
    return st.one_of(lstm_sequence_inputs(min_size=0, batch_first=None, masks=None, **_DRAWN),
                     lstm_sequence_inputs(reverse=None, batch_first=None, masks=None,
                                          **_DRAWN))


def _tangents(op, case, rng, wanted):
    """The op's gradient type of random tangents of the case's arrays (None where not
    ``wanted``)."""
    fields = OPS_SPECS[op].grads._fields

    def draw(a):
        if isinstance(a, LSTMNorm):
            return LSTMNorm(*map(draw, a))
        return rng.standard_normal(a.shape).astype(a.dtype)

    return OPS_SPECS[op].grads(**{name: draw(case[name]) if on and case.get(name) is not None
                                  else None for name, on in zip(fields, wanted, strict=True)})


def _upstream(op, result, rng, wanted):
    """The upstream gradients and their tangents (keywords), each drawn or None."""
    like = {name: getattr(result, name.removeprefix("d_")) for name in _UPSTREAM[op]}
    up = {}
    # strict=False: ``wanted`` holds pairs for a sequence's nine upstream gradients (every
    # field's); a cell has seven
    pairs = zip(wanted[::2], wanted[1::2], strict=True)
    for k, (g, dg) in zip(_UPSTREAM[op], pairs, strict=False):
        up[k] = rng.standard_normal(like[k].shape).astype(like[k].dtype) if g else None
        up[f"{k}_tangent"] = rng.standard_normal(like[k].shape).astype(like[k].dtype) \
            if dg else None
    return up


def _public(op, case, result, tangents, up, backend, clip_grad, suffix="_grad_jvp"):
    """``gc.<op>_grad_jvp`` (or ``_grad``) with the settings ``result`` records."""
    positional, keywords = _split_case(op, case)
    keywords = {k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS}
    if suffix == "_grad":
        up = {k: v for k, v in up.items() if not k.endswith("_tangent")}
        return getattr(gc, f"{op}_grad")(*positional, result, **keywords, **up,
                                         clip_grad=clip_grad, backend=backend)
    return getattr(gc, f"{op}{suffix}")(*positional, result, tangents, **keywords, **up,
                                        clip_grad=clip_grad, backend=backend)


def _below(backend, op, case, kind, result=None, tangents=None, up=None, clip_grad=None):
    """``backend``'s forward, gradient or gradient JVP (``kind``) on the case, a sequence's
    in its time order and layout (the public layer's ``_order``)."""
    spec = OPS_SPECS[op]
    weights, settings = backend_calls.weights_and_settings(op, case)
    x, states = case["x"], tuple(case[name] for name in spec.states)
    if kind == "forward":
        function = getattr(backend, op)
        if spec.sequence:
            return _order.forward(spec, function, x, states, weights, settings)
        return function(x, *states, weights, settings)
    if kind == "grad":
        up = {k: v for k, v in up.items() if not k.endswith("_tangent")}
    name = f"{op}_grad_jvp" if kind == "grad_jvp" else spec.grad_name
    function = getattr(backend, name)
    arrays = (result, tangents) if kind == "grad_jvp" else (result,)
    if spec.sequence:
        ordered = getattr(_order, kind)
        return ordered(spec, function, x, states, weights, *arrays, settings, up,
                       clip_grad=clip_grad)
    return function(x, *states, weights, *arrays, settings, **up, clip_grad=clip_grad)


def _forward(op, case, backend):
    positional, keywords = _split_case(op, case)
    return getattr(gc, op)(*positional, **keywords, backend=backend)


def _as64(a):
    return None if a is None else a.astype(np.float64)


def _check(op, case, dtype, seed, wanted, clip_grad):
    """The emulated GPU's (grads, grads_tangent) against the float64 reference's on the
    same rounded inputs, and its grads against its own gradient op, bit for bit."""
    rng = np.random.default_rng(seed)
    case, case64 = cast(case, dtype), cast(case, np.float64)
    with public_gpu() as backend:
        if dtype == np.float16:  # below the public layer (it takes float32 and float64)
            result = _below(backend, op, case, "forward")
            tangents = _tangents(op, case, rng, wanted[:10])
            up = _upstream(op, result, rng, wanted[10:])
            grads, d_grads = _below(backend, op, case, "grad_jvp", result, tangents, up,
                                    clip_grad)
            own = _below(backend, op, case, "grad", result, None, up, clip_grad)
        else:
            result = _forward(op, case, "gpu")
            tangents = _tangents(op, case, rng, wanted[:10])
            up = _upstream(op, result, rng, wanted[10:])
            grads, d_grads = _public(op, case, result, tangents, up, "gpu", clip_grad)
            own = _public(op, case, result, None, up, "gpu", clip_grad, "_grad")
    for a, b in zip(grads, own, strict=True):
        for a_part, b_part in zip(*((x,) if isinstance(x, np.ndarray) else x
                                    for x in (a, b)), strict=True) if b is not None else ():
            np.testing.assert_array_equal(a_part, b_part)
    if case.get("layer_norm") is not None:
        # A norm amplifies rounding (the float64 reference's own too):
        # tests/contracts/test_cuda_emulation.py's layer-norm rule (the reference in long double,
        # allowed the sensitivity of perturbed reference runs).
        def run(function, k):
            mapped = _map_arrays(case, function)
            return _below(reference, op, mapped, "grad_jvp",
                          _below(reference, op, mapped, "forward"),
                          _map_arrays(tangents, function), _map_arrays(up, function),
                          clip_grad)[k]
        _assert_close_ln(grads, lambda f: run(f, 0), dtype, f"{op} grads ")
        _assert_close_ln(d_grads, lambda f: run(f, 1), dtype, f"{op} grads' tangent ")
        return
    result64 = _forward(op, case64, "reference")  # it records the settings
    expected, d_expected = _public(
        op, case64, result64, type(tangents)(*map(_as64, tangents)),
        {k: _as64(v) for k, v in up.items()}, "reference", clip_grad)
    assert_close(grads, expected, dtype, f"{op} grads ")
    assert_close(d_grads, d_expected, dtype, f"{op} grads' tangent ")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), wanted=st.tuples(*[st.booleans()] * 28), seed=st.integers(0, 2**16),
       clip_grad=st.sampled_from(("exact", "straight_through")))
def test_grad_jvp_matches_reference(op, dtype, data, wanted, seed, clip_grad):
    _check(op, data.draw(_strategy(op)), dtype, seed, wanted, clip_grad)


def test_the_gpu_backend_has_the_lstm_second_order():
    for op in OPS:
        name = f"{op}_grad_jvp"
        assert hasattr(gpu, name) and name in vars(
            cells.implementation(op.split("_")[0], "gpu"))
        assert hasattr(gpu, name)
        assert _dispatch.backend_for("gpu", "cupy") is gpu


_LN_CASES = [
    ("lstm_cell", {"layer_norm": True, "ln_carry": "normalized", "peephole": True,
                   "proj_size": 2}),
    ("lstm_cell", {"layer_norm": True, "ln_carry": "raw", "peephole": True, "clip": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "normalized", "peephole": True}),
    ("lstm_sequence", {"layer_norm": True, "ln_carry": "raw", "proj_size": 2,
                       "peephole": True})]
_ORACLE_CASES = [
    ("lstm_cell", {"peephole": True, "clip": True}),
    ("lstm_cell", {"peephole": True, "proj_size": 2, "proj_clip": True}),
    ("lstm_sequence", {"peephole": True, "clip": True}),
    ("lstm_sequence", {"proj_size": 2, "proj_clip": True, "peephole": True}), *_LN_CASES]


@pytest.mark.parametrize("op, options", _ORACLE_CASES)
def test_grad_jvp_matches_finite_differences(op, options):
    """float64, every mask, ragged lengths, reversed and batch-first, tiny launch grids."""
    rng = np.random.default_rng(31)
    if op == "lstm_cell":
        case = lstm_cell_case(rng, batch=3, input_size=2, hidden=3, **options)
    else:
        case = lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                                  reverse=True, batch_first=True, masks=True, **options)
    with public_gpu(TINY):
        report = grad_jvp_check(op, case, backend="gpu")
        assert _launch.runtime().launches
    assert report.passed, f"\n{report}"


_VARIANT = {"peephole": True, "clip": True, "proj_size": 2, "proj_clip": True}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sizes", [dict(steps=0), dict(batch=0), dict(input_size=0),
                                   dict(hidden=0)])
@pytest.mark.parametrize("on", [True, False])
def test_grad_jvp_empty_sizes_and_no_tangents(op, sizes, on):
    rng = np.random.default_rng(5)
    if op == "lstm_cell":
        if "steps" in sizes:
            return
        case = lstm_cell_case(rng, **{"batch": 2, "input_size": 3, "hidden": 2, **sizes},
                              **_VARIANT)
    else:
        case = lstm_sequence_case(rng, **{"steps": 3, "batch": 2, "input_size": 3,
                                          "hidden": 2, **sizes}, **_VARIANT)
    _check(op, case, np.float64, 0, (on,) * 18, "exact")


@pytest.mark.parametrize("dtype", DTYPES)
def test_grad_jvp_lengths_zero_and_full(dtype):
    rng = np.random.default_rng(9)
    case = lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3, masks=True,
                              **_VARIANT)
    for lengths in ([0, 3, 2], [0, 0, 0], [3, 3, 3]):
        case["seq_len"] = np.array(lengths)
        _check("lstm_sequence", case, dtype, 1, (True,) * 18, "exact")


def test_grad_jvp_inputs_are_never_modified():
    rng = np.random.default_rng(3)
    case = lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                              masks=True, **_VARIANT)
    result = _forward("lstm_sequence", case, "reference")
    tangents = _tangents("lstm_sequence", case, rng, (True,) * 10)
    up = _upstream("lstm_sequence", result, rng, (True,) * 18)
    arrays = [*(v for v in case.values() if isinstance(v, np.ndarray)), *result,
              *(t for t in tangents if t is not None), *up.values()]
    saved = [a.copy() for a in arrays]
    for a in arrays:
        a.flags.writeable = False
    with public_gpu():
        _public("lstm_sequence", case, result, tangents, up, "gpu", "exact")
    for a, s in zip(arrays, saved, strict=True):
        np.testing.assert_array_equal(a, s)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op, options", _LN_CASES)
def test_layer_norm_grad_jvp_matches_reference(op, options, dtype):
    """The layer-normalised LSTM runs fused (no handover), masks, zoneout and ragged
    lengths on the sequences: against the reference by the emulation file's layer-norm
    rule (float16: the norm's second order leaves its range at small variances)."""
    rng = np.random.default_rng(17)
    if op == "lstm_cell":
        case = lstm_cell_case(rng, batch=3, input_size=2, hidden=3, **options)
    else:
        case = lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                                  masks=True, **options)
    _check(op, case, dtype, 2, (True,) * 18, "exact")


@pytest.mark.parametrize("dtype", DTYPES)
def test_grad_jvp_does_not_depend_on_launch_shape_or_thread_order(dtype):
    """Tiny blocks and grids (every grid-stride loop wraps), threads run in reverse: the
    same bits."""
    rng = np.random.default_rng(13)
    case = cast(lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                                   masks=True, **_VARIANT), dtype)
    runs = []
    for policy, reverse in ((None, False), (TINY, False), (TINY, True)):
        with emulated_gpu(*(() if policy is None else (policy, reverse))) as backend:
            result = _below(backend, "lstm_sequence", case, "forward")
            draws = np.random.default_rng(1)
            tangents = _tangents("lstm_sequence", case, draws, (True,) * 10)
            # The states' upstreams only: with the gates' too the bias gradient's column sum
            # (parts by the launch policy) may round otherwise; every field's elementwise
            # agreement is test_every_field's.
            up = _upstream("lstm_sequence", result, draws, (True,) * 8 + (False,) * 10)
            runs.append(_below(backend, "lstm_sequence", case, "grad_jvp", result, tangents,
                               up, "exact"))
    for other in runs[1:]:
        for want, got in zip(runs[0], other, strict=True):       # grads, then their tangent
            for a, b in zip(want, got, strict=True):
                if a is not None:
                    np.testing.assert_array_equal(a, b)
