"""Second order (docs/spec.md §12) of the GPU backend's plain RNN and GRU on a CUDA device
(marker ``gpu``; the module is skipped without CuPy or a device), as
``tests/contracts/test_gpu.py``'s
forward-mode tests:

- Dispatch: ``rnn_*_grad_jvp`` and ``gru_*_grad_jvp`` on CuPy arrays run on
  the GPU backend (``gradcells.cells.<cell>.gpu``) by default.
- Agreement, float64, float32 and float16, Hypothesis-drawn cases with every option (tanh
  and relu, both GRU variants, masks and zoneout, directions, layouts, ragged lengths,
  empty sizes), tangents and upstream gradients (and theirs) drawn or None: the gradient
  and its tangent against the reference's on CuPy in float64 on the same (rounded) inputs,
  max |gpu - reference| <= 16 eps(dtype) (1 + max |reference|) per field; the gradient
  equal to the GPU's own ``*_grad``.
- Finite differences (``gradcells.testing.grad_jvp_check``), float64, masked ragged cases.
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


if _device_count() < 1:
    pytest.skip("needs CuPy and a CUDA device", allow_module_level=True)

import cupy as cp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import gradcells as gc  # noqa: E402
from gradcells.cells import OPS as OPS_SPECS  # noqa: E402
from gradcells.testing import (  # noqa: E402
    OPS,
    grad_jvp_check,
    gru_cell_case,
    gru_cell_inputs,
    gru_sequence_case,
    gru_sequence_inputs,
    on_library,
    rnn_cell_case,
    rnn_cell_inputs,
    rnn_sequence_case,
    rnn_sequence_inputs,
)

# The GPU backend: every cell's ``gpu.py`` (``gradcells.cells.<cell>.gpu``).
GPU_BACKEND = gc._dispatch.backend_module("gpu")

DTYPES = [np.float64, np.float32, np.float16]
_ARRAYS = {"rnn_cell": ("x", "h_prev", "w", "b"), "rnn_sequence": ("x", "h0", "w", "b"),
           "gru_cell": ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c"),
           "gru_sequence": ("x", "h0", "w_ru", "w_c", "b_ru", "b_c")}
_STRATEGIES = {
    "rnn_cell": rnn_cell_inputs(min_size=0),
    "gru_cell": gru_cell_inputs(min_size=0),
    "rnn_sequence": st.one_of(rnn_sequence_inputs(min_size=0, batch_first=None, masks=None),
                              rnn_sequence_inputs(reverse=None, batch_first=None,
                                                  masks=None)),
    "gru_sequence": st.one_of(gru_sequence_inputs(min_size=0, batch_first=None, masks=None),
                              gru_sequence_inputs(reverse=None, batch_first=None,
                                                  masks=None))}
_CASES = {"rnn_cell": rnn_cell_case, "rnn_sequence": rnn_sequence_case,
          "gru_cell": gru_cell_case, "gru_sequence": gru_sequence_case}
_VARIANTS = {"rnn": ({"activation": "tanh"}, {"activation": "relu"}),
             "gru": ({"reset_after": False}, {"reset_after": True})}


def _on_gpu(case, dtype):
    case = {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}
    return on_library(case, "cupy")


def _as64(a):
    return None if a is None else a.astype(cp.float64)


def _split(op, case):
    arrays = _ARRAYS[op]
    return [case[k] for k in arrays], {k: v for k, v in case.items() if k not in arrays}


def _forward(op, case, backend=None):
    positional, keywords = _split(op, case)
    return getattr(gc, op)(*positional, **keywords, backend=backend)


def _grad_jvp(op, case, result, tangents, upstream, backend=None):
    positional, keywords = _split(op, case)
    return getattr(gc, f"{op}_grad_jvp")(*positional, result, tangents, **upstream,
                                         **keywords, backend=backend)


def _assert_close(actual, expected, dtype, what):
    tolerance = 16 * np.finfo(dtype).eps
    for field, a, e in zip(expected._fields, actual, expected, strict=True):
        assert isinstance(a, cp.ndarray), f"{what}{field}: {type(a).__name__}"
        assert a.dtype == np.dtype(dtype) and a.shape == e.shape, f"{what}{field}"
        if e.size == 0:
            continue
        error = float(cp.max(cp.abs(a.astype(cp.float64) - e)))
        scale = 1 + float(cp.max(cp.abs(e)))
        assert error <= tolerance * scale, (
            f"{what}{field}: max error {error:.3g} ({error / np.finfo(dtype).eps:.1f} eps)")


UPSTREAM_FLAGS = 2 * max(len(OPS_SPECS[op].upstream) for op in _ARRAYS)
"""A flag for each upstream gradient and its tangent of the op that takes the most."""


def _draws(op, case, result, rng, dtype, wanted, upstream_wanted):
    """Tangents of the case's arrays and the upstream gradients and their tangents, each
    drawn (on the device, in ``dtype``) or None."""
    def draw(shape):
        return cp.asarray(rng.standard_normal(shape).astype(dtype))

    grads = OPS_SPECS[op].grads
    # strict=False: ``wanted`` holds a flag for each of the GRU's six arrays; the plain RNN
    # has four
    tangents = grads(*(draw(case[k].shape) if on else None
                       for k, on in zip(grads._fields, wanted, strict=False)))
    upstream = {}
    for k, name in enumerate(OPS_SPECS[op].upstream):   # every field's (§16.1)
        shape = getattr(result, name.removeprefix("d_")).shape
        upstream[name] = draw(shape) if upstream_wanted[2 * k] else None
        upstream[f"{name}_tangent"] = draw(shape) if upstream_wanted[2 * k + 1] else None
    return tangents, upstream


def test_cupy_arrays_run_the_second_order_on_the_gpu():
    for op in _ARRAYS:
        assert hasattr(GPU_BACKEND, f"{op}_grad_jvp")
        assert gc._dispatch.backend_for(None, "cupy") is GPU_BACKEND


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(_ARRAYS))
@given(data=st.data(), wanted=st.tuples(*[st.booleans()] * 6),
       upstream_wanted=st.tuples(*[st.booleans()] * UPSTREAM_FLAGS), seed=st.integers(0, 2**16))
def test_gpu_second_order_agrees_with_reference(op, dtype, data, wanted, upstream_wanted,
                                                seed):
    case = _on_gpu(data.draw(_STRATEGIES[op]), dtype)
    case64 = {k: _as64(v) if isinstance(v, cp.ndarray) and v.dtype.kind == "f" else v
              for k, v in case.items()}
    result = _forward(op, case)
    tangents, upstream = _draws(op, case, result, np.random.default_rng(seed), dtype,
                                wanted, upstream_wanted)
    grads, d_grads = _grad_jvp(op, case, result, tangents, upstream)
    expected, d_expected = _grad_jvp(
        op, case64, type(result)(*map(_as64, result)), type(tangents)(*map(_as64, tangents)),
        {k: _as64(v) for k, v in upstream.items()}, "reference")
    _assert_close(grads, expected, dtype, f"{op} gradient ")
    _assert_close(d_grads, d_expected, dtype, f"{op} gradient's tangent ")
    positional, keywords = _split(op, case)
    own = getattr(gc, f"{op}_grad")(*positional, result, **keywords,
                                    **{k: v for k, v in upstream.items()
                                       if not k.endswith("_tangent")})
    for a, b in zip(grads, own, strict=True):
        cp.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", sorted(_ARRAYS))
@pytest.mark.parametrize("variant", [0, 1])
def test_gpu_second_order_matches_finite_differences(op, variant):
    options = dict(_VARIANTS[op.split("_")[0]][variant])
    if op.endswith("sequence"):
        options.update(steps=3, ragged=True, masks=True, reverse=bool(variant),
                       batch_first=bool(variant))
    case = on_library(_CASES[op](np.random.default_rng(8), batch=3, input_size=2, hidden=3,
                                 **options), "cupy")
    grad_jvp_check(op, case, backend="gpu").raise_if_failed()


@pytest.mark.parametrize("op", sorted(_ARRAYS))
def test_gpu_second_order_of_the_default_cases(op):
    case = on_library(OPS[op][0](np.random.default_rng(21)), "cupy")
    grad_jvp_check(op, case, backend="gpu").raise_if_failed()
