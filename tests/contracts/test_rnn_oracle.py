"""The plain RNN cell under the gradient oracle (docs/spec.md §9.3): every gradient output of
``rnn_cell`` and ``rnn_sequence`` against float64 central differences on cases drawn by the
Hypothesis strategies ``rnn_cell_inputs`` / ``rnn_sequence_inputs`` (tanh and relu, relu's
pre-activations kept away from the kink; ragged lengths on and off), through
``vjp_check("rnn_cell" | "rnn_sequence", case)``. Every NumPy backend that has the cell is
held to the same tests; a wrong gradient is caught."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells.reference
from gradcells import _dispatch
from gradcells.testing import (
    OPS,
    RNN_SEQUENCE_OUTPUTS,
    rnn_cell_case,
    rnn_cell_inputs,
    rnn_sequence_case,
    rnn_sequence_inputs,
    vjp_check,
)
from gradcells.testing.cases import KINK_MARGIN, _preactivations

BACKENDS = ["reference", "cpu"]          # every NumPy backend; "cpu" fails until it has rnn
OUTPUT_SETS = [("h", "h_final"), ("h",), ("h_final",)]


@pytest.mark.parametrize("backend", BACKENDS)
@given(case=rnn_cell_inputs())
def test_rnn_cell_grad_matches_finite_differences(backend, case):
    report = vjp_check("rnn_cell", case, backend=backend)
    assert report.passed, f"\n{report}"
    assert {c.name for c in report.checks} >= {"x", "h_prev", "w", "b"}


@pytest.mark.parametrize("backend", BACKENDS)
@given(case=rnn_sequence_inputs(), outputs=st.sampled_from(OUTPUT_SETS))
def test_rnn_sequence_grad_matches_finite_differences(backend, case, outputs):
    report = vjp_check("rnn_sequence", case, backend=backend, outputs=outputs)
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("ragged", [False, True])
def test_rnn_every_configuration_to_1e9(backend, activation, ragged):
    """Each configuration explicitly (not left to the draw), float64, to about 1e-9."""
    rng = np.random.default_rng(17)
    cell = rnn_cell_case(rng, batch=3, input_size=4, hidden=5, activation=activation)
    seq = rnn_sequence_case(rng, steps=5, batch=4, input_size=3, hidden=4,
                            activation=activation, ragged=ragged)
    for op, case in (("rnn_cell", cell), ("rnn_sequence", seq)):
        report = vjp_check(op, case, backend=backend)
        assert report.passed, f"\n{op}\n{report}"
        assert report.max_abs_error < 1e-9, op


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@given(data=st.data())
def test_the_strategies_draw_what_they_are_asked(activation, data):
    cell = data.draw(rnn_cell_inputs(activation=activation, max_hidden=3))
    seq = data.draw(rnn_sequence_inputs(activation=activation, ragged=True, max_steps=3))
    for case in (cell, seq):
        assert case["activation"] == activation
        assert case["x"].dtype == np.float64
        if activation == "relu":
            assert not (np.abs(_preactivations(case)) < KINK_MARGIN).any()
    assert cell["h_prev"].shape[1] <= 3 and cell["w"].shape == (
        cell["x"].shape[1] + cell["h_prev"].shape[1], cell["h_prev"].shape[1])
    assert seq["seq_len"] is not None and seq["x"].shape[0] <= 3


@given(case=rnn_sequence_inputs(dtype=np.float32, min_size=0))
def test_the_strategies_take_a_dtype_and_empty_sizes(case):
    assert case["x"].dtype == np.float32 and case["w"].dtype == np.float32
    assert min(case["x"].shape) >= 0


def test_rnn_ops_are_in_the_op_table():
    assert {"rnn_cell", "rnn_sequence"} <= set(OPS)
    assert RNN_SEQUENCE_OUTPUTS == ("h", "h_final")
    rng = np.random.default_rng(3)
    for op in ("rnn_cell", "rnn_sequence"):
        draw, _ = OPS[op]
        assert vjp_check(op, draw(rng), backend="reference").passed


@pytest.mark.parametrize("op, field", [("rnn_cell", "w"), ("rnn_cell", "h_prev"),
                                       ("rnn_sequence", "b"), ("rnn_sequence", "h0")])
def test_the_oracle_catches_a_wrong_rnn_gradient(monkeypatch, op, field):
    right = getattr(gradcells.reference, f"{op}_grad")

    def wrong(*args, **kwargs):
        grads = right(*args, **kwargs)
        return grads._replace(**{field: getattr(grads, field) * 1.001})

    monkeypatch.setattr(_dispatch.backend_module("reference"), f"{op}_grad", wrong)
    case = OPS[op][0](np.random.default_rng(4))
    report = vjp_check(op, case, backend="reference")
    assert not report.passed
    assert [c.name for c in report.checks if not c.passed] == [field]
