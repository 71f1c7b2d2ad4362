"""The GPU backend's LSTM second order on a CUDA device (marker ``gpu``; the module is
skipped without CuPy or a device), as ``tests/contracts/test_gpu.py``'s forward-mode tests:

- dispatch: ``lstm_cell_grad_jvp`` and ``lstm_sequence_grad_jvp`` on CuPy arrays run on
  the GPU backend (``gradcells.cells.<cell>.gpu``) by default, and return CuPy arrays;
- agreement (Hypothesis cases with every option but the layer norm, moved to CuPy, the three
  dtypes): ``(grads, grads_tangent)`` against the reference run on CuPy in float64 on the
  same rounded inputs, 16 eps(dtype) relative to each field's size, and the grads against
  the GPU's own ``*_grad`` bit for bit;
- finite differences (``gc.testing.grad_jvp_check(op, case, backend="gpu")``) in float64;
- the layer-normalised LSTM (fused too) against the reference in float64;
- the device and the host emulation of the same kernels agree (when a C++ compiler exists).
"""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _device_count():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: all mean "skip"
        return 0


if _device_count() == 0:
    pytest.skip("needs CuPy and a CUDA device", allow_module_level=True)

import cupy as cp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_gpu import (  # noqa: E402
    GPU_DTYPES,
    LSTM_CELL,
    LSTM_SEQ,
    assert_close,
    float64,
    on_gpu,
)

import gradcells as gc  # noqa: E402
from gradcells.cells import OPTIONAL_WEIGHTS  # noqa: E402
from gradcells.gpu import _launch  # noqa: E402
from gradcells.testing import (  # noqa: E402
    lstm_cell_case,
    lstm_cell_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    on_library,
)

# The GPU backend: every cell's ``gpu.py`` (``gradcells.cells.<cell>.gpu``).
GPU_BACKEND = gc._dispatch.backend_module("gpu")

_ARRAYS = {"lstm_cell": LSTM_CELL, "lstm_sequence": LSTM_SEQ}
_STRATEGY = {
    "lstm_cell": lstm_cell_inputs(min_size=0, projection=None, layer_norm=False),
    "lstm_sequence": st.one_of(
        lstm_sequence_inputs(min_size=0, batch_first=None, masks=None, projection=None,
                             layer_norm=False),
        lstm_sequence_inputs(reverse=None, batch_first=None, masks=None, projection=None,
                             layer_norm=False))}
_UPSTREAM = {"lstm_cell": ("d_h", "d_cs"),
             "lstm_sequence": ("d_h", "d_cs", "d_h_final", "d_cs_final")}


def _forward(op, case, backend=None):
    arrays = _ARRAYS[op]
    return getattr(gc, op)(*(case[k] for k in arrays),
                           **{k: v for k, v in case.items() if k not in arrays},
                           backend=backend)


def _call(op, case, result, tangents, up, clip_grad, backend=None, suffix="_grad_jvp"):
    """``gc.<op>_grad_jvp`` (or ``_grad``) with the settings ``result`` records."""
    arrays = _ARRAYS[op]
    weights = {k: v for k, v in case.items() if k in OPTIONAL_WEIGHTS}
    leading = [case[k] for k in arrays]
    if suffix == "_grad":
        up = {k: v for k, v in up.items() if not k.endswith("_tangent")}
        return getattr(gc, f"{op}_grad")(*leading, result, **weights, **up,
                                         clip_grad=clip_grad, backend=backend)
    return getattr(gc, f"{op}_grad_jvp")(*leading, result, tangents, **weights, **up,
                                         clip_grad=clip_grad, backend=backend)


def _draws(op, case, result, rng, dtype, wanted):
    """Tangents of the case's arrays and the upstream gradients with their tangents, each
    drawn or None."""
    grads = gc.cells.OPS[op].grads

    def draw(a):
        if isinstance(a, gc.LSTMNorm):
            return gc.LSTMNorm(*map(draw, a))
        return cp.asarray(rng.standard_normal(a.shape).astype(dtype))

    tangents = grads(*(draw(case[k]) if on and case.get(k) is not None else None
                       for k, on in zip(grads._fields, wanted[:10], strict=True)))
    like = {"d_h": result.h, "d_cs": result.cs}
    if op == "lstm_sequence":
        like.update(d_h_final=result.h_final, d_cs_final=result.cs_final)
    up = {}
    # strict=False: ``wanted`` holds pairs for a sequence's four upstream gradients; a cell
    # has two
    for k, g, dg in zip(_UPSTREAM[op], wanted[10::2], wanted[11::2], strict=False):
        up[k] = draw(like[k]) if g else None
        up[f"{k}_tangent"] = draw(like[k]) if dg else None
    return tangents, up


def _to64(a):
    if a is None:
        return None
    if isinstance(a, gc.LSTMNorm):
        return gc.LSTMNorm(*map(_to64, a))
    return a.astype(cp.float64)


def test_the_lstm_second_order_runs_on_the_gpu():
    for op in ("lstm_cell_grad_jvp", "lstm_sequence_grad_jvp"):
        assert hasattr(GPU_BACKEND, op)
        assert gc._dispatch.backend_for(None, "cupy") is GPU_BACKEND
        assert hasattr(GPU_BACKEND, op)
        assert gc._dispatch.backend_for("gpu", "cupy") is GPU_BACKEND


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("op", sorted(_STRATEGY))
@given(data=st.data(), wanted=st.tuples(*[st.booleans()] * 18), seed=st.integers(0, 2**16),
       clip_grad=st.sampled_from(("exact", "straight_through")))
def test_gpu_second_order_agrees_with_reference(op, dtype, data, wanted, seed, clip_grad):
    case = on_gpu(data.draw(_STRATEGY[op]), dtype)
    case64 = float64(case)
    result = _forward(op, case)
    tangents, up = _draws(op, case, result, np.random.default_rng(seed), dtype, wanted)
    grads, d_grads = _call(op, case, result, tangents, up, clip_grad)
    own = _call(op, case, result, None, up, clip_grad, suffix="_grad")
    for a, b in zip(grads, own, strict=True):
        if b is not None:
            cp.testing.assert_array_equal(a, b)
    expected, d_expected = _call(op, case64, _forward(op, case64, "reference"),
                                 type(tangents)(*map(_to64, tangents)),
                                 {k: _to64(v) for k, v in up.items()}, clip_grad, "reference")
    assert_close(grads, expected, dtype, "grads ")
    assert_close(d_grads, d_expected, dtype, "grads' tangent ")


@pytest.mark.parametrize("op, options", [
    ("lstm_cell", {"peephole": True, "clip": True}),
    ("lstm_cell", {"peephole": True, "proj_size": 2, "proj_clip": True}),
    ("lstm_sequence", {"peephole": True, "clip": True}),
    ("lstm_sequence", {"proj_size": 2, "proj_clip": True, "peephole": True})])
def test_gpu_second_order_matches_finite_differences(op, options):
    rng = np.random.default_rng(31)
    if op == "lstm_cell":
        case = lstm_cell_case(rng, batch=3, input_size=2, hidden=3, **options)
    else:
        case = lstm_sequence_case(rng, steps=3, batch=3, input_size=2, hidden=3, ragged=True,
                                  reverse=True, batch_first=True, masks=True, **options)
    gc.testing.grad_jvp_check(op, on_library(case, "cupy"), backend="gpu").raise_if_failed()


@pytest.mark.parametrize("op", sorted(_STRATEGY))
def test_gpu_second_order_with_a_layer_norm_agrees_with_reference(op):
    rng = np.random.default_rng(4)
    if op == "lstm_cell":
        case = lstm_cell_case(rng, batch=2, input_size=2, hidden=3, layer_norm=True,
                              peephole=True)
    else:
        case = lstm_sequence_case(rng, steps=3, batch=2, input_size=2, hidden=3,
                                  layer_norm=True, ragged=True, masks=True)
    case = on_gpu(case, np.float64)
    result = _forward(op, case)
    tangents, up = _draws(op, case, result, rng, np.float64, (True,) * 18)
    got = _call(op, case, result, tangents, up, "exact")
    want = _call(op, case, result, tangents, up, "exact", "reference")
    for g, w in zip(got, want, strict=True):
        assert_close(g._replace(layer_norm=None), w._replace(layer_norm=None), np.float64)
        assert_close(g.layer_norm, w.layer_norm, np.float64, "layer_norm.")


def test_device_and_host_emulation_agree():
    """The same kernels, compiled by NVRTC for the device and by the host compiler
    (float64, below the public layer, as tests/contracts/test_gpu.py's)."""
    cuda_host = pytest.importorskip("cuda_host")
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    from test_grad_jvp_cuda_emulation_lstm import _below

    rng = np.random.default_rng(12)
    case = lstm_sequence_case(rng, steps=4, batch=3, input_size=2, hidden=3, ragged=True,
                              masks=True, peephole=True, clip=True, proj_size=2,
                              proj_clip=True)
    saved = _launch.use_runtime(cuda_host.HostRuntime())
    try:  # the host first: NumPy arrays
        result = _below(GPU_BACKEND, "lstm_sequence", case, "forward")
        tangents, up = _draws("lstm_sequence", case, result, rng, np.float64, (True,) * 18)
        tangents = type(tangents)(*(None if t is None else t.get() for t in tangents))
        up = {k: None if v is None else v.get() for k, v in up.items()}
        host = _below(GPU_BACKEND, "lstm_sequence", case, "grad_jvp", result, tangents, up,
                      "exact")
    finally:
        _launch.use_runtime(saved)

    def device_array(a):
        return None if a is None else cp.asarray(a)

    device = _below(GPU_BACKEND, "lstm_sequence", on_library(case, "cupy"), "grad_jvp",
                    type(result)(*map(device_array, result)),
                    type(tangents)(*map(device_array, tangents)),
                    {k: device_array(v) for k, v in up.items()}, "exact")
    for d, h in zip(device, host, strict=True):
        for a, b in zip(d, h, strict=True):
            if b is not None:
                np.testing.assert_allclose(a.get(), b, rtol=16 * np.finfo(np.float64).eps,
                                           atol=16 * np.finfo(np.float64).eps)
