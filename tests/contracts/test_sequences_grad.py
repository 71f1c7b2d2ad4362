"""Every gradient of the sequence ops against central differences (``gradcells.check_vjp``)
over short sequences (T <= 4): ragged lengths with zero-length rows, peepholes, clipping
(levels kept away from every unclipped cell state of every step), each upstream gradient,
both GRU variants, float64 and float32, every NumPy backend."""


import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from hypothesis import given, settings

import gradcells as gc
from gradcells.testing import (
    LSTM_SEQUENCE_OUTPUTS,
    gru_sequence_case,
    gru_sequence_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    lstm_sequence_vjp_pair,
    vjp_check,
)


def as_dtype(case, dtype):
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@settings(max_examples=20)
@given(case=lstm_sequence_inputs())
def test_lstm_sequence_grad_matches_finite_differences(backend, case):
    report = vjp_check("lstm_sequence", case, backend=backend)
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@settings(max_examples=20)
@given(case=gru_sequence_inputs())
def test_gru_sequence_grad_matches_finite_differences(backend, case):
    report = vjp_check("gru_sequence", case, backend=backend)
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("clip", [False, True])
def test_lstm_every_configuration(backend, peephole, clip):
    """Ragged lengths (one full row, one of length 0, two drawn), each configuration
    explicitly, float64 to about 1e-9."""
    case = lstm_sequence_case(np.random.default_rng(17), steps=4, batch=4, input_size=3,
                              hidden=3, peephole=peephole, clip=clip, ragged=True)
    assert (case["cell_clip"] is not None) == clip
    assert 0 in case["seq_len"] and 4 in case["seq_len"]
    report = vjp_check("lstm_sequence", case, backend=backend)
    assert report.passed, f"\n{report}"
    assert report.max_abs_error < 1e-9


def test_clipping_is_active_in_the_clipped_case():
    """The clip level of the case above really clips (the test would be vacuous otherwise)."""
    case = lstm_sequence_case(np.random.default_rng(17), steps=4, batch=4, input_size=3,
                              hidden=3, peephole=True, clip=True, ragged=True)
    seq = gc.lstm_sequence(*[case[k] for k in ("x", "cs0", "h0", "w", "b")],
                           wci=case["wci"], wcf=case["wcf"], wco=case["wco"],
                           forget_bias=case["forget_bias"], cell_clip=case["cell_clip"],
                           seq_len=case["seq_len"], backend="reference")
    assert np.any(np.abs(seq.cs) == case["cell_clip"])


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("output", LSTM_SEQUENCE_OUTPUTS)
def test_lstm_each_output_alone(backend, output):
    """The gradient from one output only (the other upstream gradients None)."""
    case = lstm_sequence_case(np.random.default_rng(29), steps=3, batch=3, input_size=2,
                              hidden=3, peephole=True, clip=True, ragged=True)
    report = vjp_check("lstm_sequence", case, backend=backend, outputs=(output,))
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("reset_after", [False, True])
@pytest.mark.parametrize("outputs", [("h",), ("h_final",), ("h", "h_final")])
def test_gru_every_configuration(backend, reset_after, outputs):
    case = gru_sequence_case(np.random.default_rng(31), steps=4, batch=4, input_size=3,
                             hidden=3, reset_after=reset_after, ragged=True)
    report = vjp_check("gru_sequence", case, backend=backend, outputs=outputs)
    assert report.passed, f"\n{report}"
    assert report.max_abs_error < 1e-9


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("seed", range(2))
def test_float32_gradients(backend, seed):
    """float32 gradients against the same float64 differences, at rtol 1e-4 and atol 1e-6
    (the oracle's float32 defaults are 1e-3 and 1e-5)."""
    tolerances = {"rtol": 1e-4, "atol": 1e-6}
    lstm = lstm_sequence_case(np.random.default_rng(seed), steps=4, batch=3, input_size=3,
                              hidden=4, peephole=True, clip=True, ragged=True)
    report = vjp_check("lstm_sequence", as_dtype(lstm, np.float32), backend=backend,
                       **tolerances)
    assert report.passed, f"\n{report}"
    gru = gru_sequence_case(np.random.default_rng(seed), steps=4, batch=3, input_size=3,
                            hidden=4, reset_after=bool(seed), ragged=True)
    report = vjp_check("gru_sequence", as_dtype(gru, np.float32), backend=backend,
                       **tolerances)
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
def test_straight_through_is_not_the_gradient_where_the_clip_is_active(backend):
    """TensorFlow's straight-through clip gradient fails the oracle when clipping is active,
    and equals the exact gradient when it is not."""
    case = lstm_sequence_case(np.random.default_rng(17), steps=4, batch=4, input_size=3,
                              hidden=3, peephole=True, clip=True, ragged=True)
    f, vjp, args, names = lstm_sequence_vjp_pair(case, backend=backend,
                                                 clip_grad="straight_through")
    assert not gc.check_vjp(f, vjp, args, names=names).passed
    unclipped = {**case, "cell_clip": 1e3}
    f, vjp, args, names = lstm_sequence_vjp_pair(unclipped, backend=backend,
                                                 clip_grad="straight_through")
    assert gc.check_vjp(f, vjp, args, names=names).passed
