"""The plain RNN cell (docs/spec.md §9.3): forward against its formula, float64 gradients
against central differences, sequences against the cell loop, relu's kink, bad input.
Every NumPy backend that has the cell is held to the same tests."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells.testing import rnn_cell_case, rnn_sequence_case, unrolled

BACKENDS = ["reference", "cpu"]
ARGS = ("x", "h_prev", "w", "b")
SEQ_ARGS = ("x", "h0", "w", "b")


def _formula(case):
    z = np.concatenate([case["x"], case["h_prev"]], axis=1) @ case["w"] + case["b"]
    return np.tanh(z) if case["activation"] == "tanh" else np.maximum(z, 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_the_cell_is_its_formula(backend, activation):
    case = rnn_cell_case(np.random.default_rng(0), activation=activation)
    state = gc.rnn_cell(**case, backend=backend)
    np.testing.assert_allclose(state.h, _formula(case), rtol=1e-14, atol=1e-15)
    assert state.settings.activation == activation


def _cell_pair(case, backend):
    names = ARGS

    def f(*arrays):
        return gc.rnn_cell(*arrays, activation=case["activation"], backend=backend).h

    def vjp(ct, *arrays):
        state = gc.rnn_cell(*arrays, activation=case["activation"], backend=backend)
        return tuple(gc.rnn_cell_grad(*arrays, state, d_h=ct, backend=backend))

    return f, vjp, tuple(case[n] for n in names), names


def _sequence_pair(case, backend):
    names = SEQ_ARGS
    options = {"activation": case["activation"], "seq_len": case["seq_len"]}

    def f(*arrays):
        seq = gc.rnn_sequence(*arrays, **options, backend=backend)
        return seq.h, seq.h_final

    def vjp(ct, *arrays):
        seq = gc.rnn_sequence(*arrays, **options, backend=backend)
        return tuple(gc.rnn_sequence_grad(*arrays, seq, d_h=ct[0], d_h_final=ct[1],
                                          backend=backend))

    return f, vjp, tuple(case[n] for n in names), names


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("seed", range(4))
def test_gradients_equal_central_differences(backend, activation, seed):
    rng = np.random.default_rng(seed)
    cell = rnn_cell_case(rng, batch=3, input_size=2, hidden=4, activation=activation)
    f, vjp, args, names = _cell_pair(cell, backend)
    gc.check_vjp(f, vjp, args, names=names, seed=seed).raise_if_failed()
    seq = rnn_sequence_case(rng, steps=5, batch=4, input_size=2, hidden=3,
                            activation=activation, ragged=True)
    f, vjp, args, names = _sequence_pair(seq, backend)
    gc.check_vjp(f, vjp, args, names=names, seed=seed).raise_if_failed()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_sequence_is_its_cell_loop(backend, activation, ragged):
    rng = np.random.default_rng(3)
    case = rnn_sequence_case(rng, steps=6, batch=4, activation=activation, ragged=ragged)
    arrays = [case[k] for k in SEQ_ARGS]
    seq = gc.rnn_sequence(*arrays, activation=activation, seq_len=case["seq_len"],
                          backend=backend)
    run = unrolled.rnn_forward(*arrays, activation=activation, seq_len=case["seq_len"],
                               backend="reference")
    for name in gc.RNNSequence._fields:
        np.testing.assert_allclose(getattr(seq, name), run.outputs[name], rtol=1e-13,
                                   atol=1e-14, err_msg=name)
    d_h, d_h_final = rng.standard_normal(seq.h.shape), rng.standard_normal(seq.h_final.shape)
    grads = gc.rnn_sequence_grad(*arrays, seq, d_h=d_h, d_h_final=d_h_final, backend=backend)
    expected = unrolled.rnn_backprop(run, d_h=d_h, d_h_final=d_h_final)
    for name in gc.RNNSequenceGrads._fields:
        np.testing.assert_allclose(getattr(grads, name), expected[name], rtol=1e-12,
                                   atol=1e-13, err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_relu_has_zero_slope_at_zero_as_pytorch(backend):
    x, h = np.zeros((2, 1)), np.zeros((2, 2))
    w, b = np.ones((3, 2)), np.array([0.0, 1.0])
    state = gc.rnn_cell(x, h, w, b, activation="relu", backend=backend)
    grads = gc.rnn_cell_grad(x, h, w, b, state, d_h=np.ones((2, 2)), backend=backend)
    np.testing.assert_array_equal(grads.b, [0.0, 2.0])  # z = 0 passes nothing, z = 1 all


@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_preactivations_stay_finite(backend):
    case = rnn_sequence_case(np.random.default_rng(5), activation="tanh", scale=1.0)
    case["w"] = case["w"] * 1e4
    with np.errstate(all="raise"):
        seq = gc.rnn_sequence(**case, backend=backend)
        grads = gc.rnn_sequence_grad(*(case[k] for k in SEQ_ARGS), seq,
                                     d_h=np.ones_like(seq.h), backend=backend)
    assert all(np.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_sizes_give_shaped_results(backend):
    for steps, batch, n_in in ((0, 3, 2), (4, 0, 2), (4, 3, 0)):
        case = rnn_sequence_case(np.random.default_rng(6), steps=steps, batch=batch,
                                 input_size=n_in, hidden=3)
        seq = gc.rnn_sequence(**case, backend=backend)
        grads = gc.rnn_sequence_grad(*(case[k] for k in SEQ_ARGS), seq, backend=backend)
        assert seq.h.shape == (steps, batch, 3) and seq.h_final.shape == (batch, 3)
        assert [g.shape for g in grads] == [case[k].shape for k in SEQ_ARGS]


@pytest.mark.parametrize(("changes", "error", "pattern"), [
    ({"activation": "sigmoid"}, ValueError,
     r"activation must be one of \('tanh', 'relu'\), got 'sigmoid'"),
    ({"activation": None}, ValueError, r"activation must be one of"),
    ({"w": np.zeros((9, 4))}, ValueError, r"w must have shape \[I\+H, H\] = \(9, 5\), "
                                          r"got \(9, 4\)"),
    ({"b": np.zeros(4)}, ValueError, r"b must have shape \[H\] = \(5,\), got \(4,\)"),
    ({"h_prev": np.zeros((3, 5), np.float32)}, TypeError, r"h_prev must have the same dtype"),
])
def test_bad_input_is_named(changes, error, pattern):
    case = {**rnn_cell_case(np.random.default_rng(7)), **changes}
    with pytest.raises(error, match=pattern):
        gc.rnn_cell(**case)


def test_a_contradicting_activation_is_named():
    case = rnn_cell_case(np.random.default_rng(8), activation="relu")
    state = gc.rnn_cell(**case)
    with pytest.raises(ValueError, match=r"activation='tanh' contradicts the forward's "
                                         r"activation='relu'"):
        gc.rnn_cell_grad(*(case[k] for k in ARGS), state, activation="tanh")


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_are_never_modified(backend):
    case = rnn_sequence_case(np.random.default_rng(9), ragged=True)
    before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
    seq = gc.rnn_sequence(**case, backend=backend)
    gc.rnn_sequence_grad(*(case[k] for k in SEQ_ARGS), seq, d_h=np.ones_like(seq.h),
                         d_h_final=np.ones_like(seq.h_final), backend=backend)
    for k, v in before.items():
        np.testing.assert_array_equal(case[k], v, err_msg=k)
