"""Every gradient output of both cells against central differences in float64.

The cases come from the Hypothesis strategies in ``gradcells.testing``: sizes down to 1,
peepholes on and off, clipping on and off (levels kept away from the kink), several forget
biases and weight scales. float32 gradients are checked against the same float64 differences
at ``FLOAT32_TOLERANCES``, 10x and 100x tighter than the oracle's float32 defaults: over 600
random cell cases the worst element used an eighth of it.
"""

import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import (
    gru_cell_case,
    gru_cell_inputs,
    lstm_cell_case,
    lstm_cell_inputs,
    vjp_check,
)

UPSTREAM = {"both": {}, "h only": {"d_cs": False}, "cs only": {"d_h": False}}
FLOAT32_TOLERANCES = {"rtol": 1e-4, "atol": 1e-6}


def tolerances(dtype):
    return FLOAT32_TOLERANCES if dtype == np.float32 else {}


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@given(case=lstm_cell_inputs(), upstream=st.sampled_from(sorted(UPSTREAM)))
def test_lstm_cell_grad_matches_finite_differences(backend, dtype, case, upstream):
    case = {k: v.astype(dtype) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    report = vjp_check("lstm_cell", case, backend=backend, **tolerances(dtype),
                       **UPSTREAM[upstream])
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@given(case=gru_cell_inputs())
def test_gru_cell_grad_matches_finite_differences(backend, dtype, case):
    case = {k: v.astype(dtype) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    report = vjp_check("gru_cell", case, backend=backend, **tolerances(dtype))
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("forget_bias", [0.0, 1.0, 3.0])
def test_lstm_every_configuration_to_1e9(backend, peephole, clip, forget_bias):
    """Each configuration explicitly (not left to the draw), float64, to about 1e-9."""
    case = lstm_cell_case(np.random.default_rng(7), batch=3, input_size=4, hidden=5,
                          peephole=peephole, clip=clip, forget_bias=forget_bias)
    assert (case["cell_clip"] is not None) == clip
    report = vjp_check("lstm_cell", case, backend=backend)
    assert report.passed, f"\n{report}"
    assert report.max_abs_error < 1e-9


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("reset_after", [False, True])
def test_gru_every_configuration_to_1e9(backend, reset_after):
    case = gru_cell_case(np.random.default_rng(8), batch=3, input_size=4, hidden=5,
                         reset_after=reset_after)
    report = vjp_check("gru_cell", case, backend=backend)
    assert report.passed, f"\n{report}"
    assert report.max_abs_error < 1e-9


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("sizes", [(1, 1, 1), (1, 3, 1), (2, 1, 3)])
def test_smallest_sizes(backend, sizes):
    batch, input_size, hidden = sizes
    rng = np.random.default_rng(9)
    lstm = lstm_cell_case(rng, batch=batch, input_size=input_size, hidden=hidden,
                          peephole=True)
    gru = gru_cell_case(rng, batch=batch, input_size=input_size, hidden=hidden)
    assert vjp_check("lstm_cell", lstm, backend=backend).passed
    assert vjp_check("gru_cell", gru, backend=backend).passed


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_straight_through_equals_exact_without_active_clipping(backend):
    case = lstm_cell_case(np.random.default_rng(10), peephole=True)
    case["cell_clip"] = 100.0  # far above every |cs|: clipping never active
    args = [case[k] for k in ("x", "cs_prev", "h_prev", "w", "b")]
    peeps = {k: case[k] for k in PEEPHOLES}
    state = gc.lstm_cell(*args, **peeps, cell_clip=100.0, backend=backend)
    d_h = np.ones_like(state.h)
    exact = gc.lstm_cell_grad(*args, state, d_h=d_h, **peeps, cell_clip=100.0, backend=backend)
    straight = gc.lstm_cell_grad(*args, state, d_h=d_h, **peeps, cell_clip=100.0,
                                 clip_grad="straight_through", backend=backend)
    for a, b in zip(exact, straight, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_exact_clip_gradient_blocks_where_clipped(backend):
    """Where the clip is active, nothing flows from cs back to the gates or to cs_prev."""
    case = lstm_cell_case(np.random.default_rng(11), batch=4, hidden=6)
    case["cell_clip"] = 1e-3  # below every |cs|: clipping active everywhere
    args = [case[k] for k in ("x", "cs_prev", "h_prev", "w", "b")]
    state = gc.lstm_cell(*args, cell_clip=1e-3, backend=backend)
    assert np.all(np.abs(state.cs) == np.float64(1e-3))
    grads = gc.lstm_cell_grad(*args, state, d_cs=np.ones_like(state.cs), cell_clip=1e-3,
                              backend=backend)
    assert not np.any(grads.cs_prev) and not np.any(grads.x) and not np.any(grads.w)
    assert vjp_check("lstm_cell", case, backend=backend).passed


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_gradient_passes_exactly_on_the_clip_boundary(backend):
    """PyTorch's clamp convention: at |cs| == cell_clip the gradient passes."""
    case = lstm_cell_case(np.random.default_rng(12), batch=1, hidden=1)
    args = [case[k] for k in ("x", "cs_prev", "h_prev", "w", "b")]
    unclipped = gc.lstm_cell(*args, backend=backend)
    clip = float(abs(unclipped.cs[0, 0]))
    state = gc.lstm_cell(*args, cell_clip=clip, backend=backend)
    d_cs = np.ones_like(state.cs)
    on_boundary = gc.lstm_cell_grad(*args, state, d_cs=d_cs, cell_clip=clip, backend=backend)
    free = gc.lstm_cell_grad(*args, unclipped, d_cs=d_cs, backend=backend)
    for a, b in zip(on_boundary, free, strict=True):
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_missing_upstream_gradients_are_zeros():
    case = lstm_cell_case(np.random.default_rng(13), peephole=True)
    args = [case[k] for k in ("x", "cs_prev", "h_prev", "w", "b")]
    peeps = {k: case[k] for k in PEEPHOLES}
    state = gc.lstm_cell(*args, **peeps)
    zeros = np.zeros_like(state.h)
    none = gc.lstm_cell_grad(*args, state, **peeps)
    explicit = gc.lstm_cell_grad(*args, state, d_h=zeros, d_cs=zeros, **peeps)
    for a, b in zip(none, explicit, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.any(a)
