"""Weight converters: round trips are the identity, and converted weights run in the real
framework (PyTorch, Keras 3, TensorFlow's BlockLSTMV2, ONNX Runtime; ONNX also by a
transcription of its documented equations, which runs without the extra) give gradcells's
forward with ``forget_bias=0``; the reset-after GRU matches PyTorch's
forward and every autograd gradient.

Framework tests skip when the framework is not installed (``pip install gradcells[conformance]``).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells import layouts
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import gru_cell_case, lstm_cell_case

SIZES = [(3, 4, 5), (2, 1, 1), (4, 6, 2)]          # (batch, input size, hidden)
F64_TOL = {"rtol": 1e-12, "atol": 1e-13}
# TensorFlow's ops run in float32 only; gradcells runs the same float32 inputs in float64.
F32_TOL = {"rtol": 2e-6, "atol": 2e-6}


def _lstm_weights(rng, input_size, hidden, dtype=np.float64):
    case = lstm_cell_case(rng, batch=1, input_size=input_size, hidden=hidden, dtype=dtype)
    return case["w"], case["b"]


def _gru_weights(rng, input_size, hidden, reset_after, dtype=np.float64):
    case = gru_cell_case(rng, batch=1, input_size=input_size, hidden=hidden, dtype=dtype,
                         reset_after=reset_after)
    return case["w_ru"], case["w_c"], case["b_ru"], case["b_c"]


def _lstm_steps(x, cs, h, w, b, **attrs):
    """gradcells over ``x [T, B, I]`` step by step: every h ``[T, B, H]`` and the final states."""
    hs = []
    for x_t in x:
        state = gc.lstm_cell(x_t, cs, h, w, b, forget_bias=0.0, **attrs)
        cs, h = state.cs, state.h
        hs.append(h)
    return np.stack(hs) if hs else np.zeros((0,) + h.shape, h.dtype), cs, h


def _gru_steps(x, h, w_ru, w_c, b_ru, b_c, reset_after):
    hs = []
    for x_t in x:
        h = gc.gru_cell(x_t, h, w_ru, w_c, b_ru, b_c, reset_after=reset_after).h
        hs.append(h)
    return np.stack(hs), h


# ---------------------------------------------------------------------------------------------
# Round trips

LSTM_FRAMEWORKS = ["torch", "keras", "onnx", "tf_v2"]
GRU_FRAMEWORKS = {"torch": [True], "keras": [False, True], "onnx": [False, True]}


@given(seed=st.integers(0, 2**32 - 1), input_size=st.integers(0, 5),
       hidden=st.integers(1, 5), framework=st.sampled_from(LSTM_FRAMEWORKS),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_lstm_round_trip_is_identity(seed, input_size, hidden, framework, dtype):
    w, b = _lstm_weights(np.random.default_rng(seed), input_size, hidden, dtype)
    to = getattr(layouts, f"lstm_to_{framework}")
    back = getattr(layouts, f"lstm_from_{framework}")(*to(w, b))
    assert len(back) == 2
    for original, result in zip((w, b), back, strict=True):
        assert result.dtype == original.dtype
        np.testing.assert_array_equal(result, original)


@given(seed=st.integers(0, 2**32 - 1), input_size=st.integers(0, 5),
       hidden=st.integers(1, 5),
       variant=st.sampled_from([(f, r) for f, rs in GRU_FRAMEWORKS.items() for r in rs]))
def test_gru_round_trip_is_identity(seed, input_size, hidden, variant):
    framework, reset_after = variant
    weights = _gru_weights(np.random.default_rng(seed), input_size, hidden, reset_after)
    arrays = getattr(layouts, f"gru_to_{framework}")(*weights)
    kwargs = {"linear_before_reset": int(reset_after)} if framework == "onnx" else {}
    back = getattr(layouts, f"gru_from_{framework}")(*arrays, **kwargs)
    for original, result in zip(weights, back, strict=True):
        np.testing.assert_array_equal(result, original)


def test_framework_round_trip_keeps_weights_and_sums_biases(rng):
    """torch -> gradcells -> torch: weights unchanged; the bias sum lands in ``bias_ih``."""
    H, I = 3, 2
    weight_ih, weight_hh = rng.standard_normal((4 * H, I)), rng.standard_normal((4 * H, H))
    bias_ih, bias_hh = rng.standard_normal(4 * H), rng.standard_normal(4 * H)
    w, b = layouts.lstm_from_torch(weight_ih, weight_hh, bias_ih, bias_hh)
    back = layouts.lstm_to_torch(w, b)
    np.testing.assert_array_equal(back[0], weight_ih)
    np.testing.assert_array_equal(back[1], weight_hh)
    np.testing.assert_allclose(back[2], bias_ih + bias_hh, rtol=0, atol=0)
    np.testing.assert_array_equal(back[3], np.zeros(4 * H))


def test_lstm_gate_orders_by_hand():
    """Columns tagged with their gate: each framework's documented order, by name."""
    H, I = 2, 1
    tags = {"i": 1.0, "c": 2.0, "f": 3.0, "o": 4.0}
    w = np.concatenate([np.full((I + H, H), tags[g]) for g in "icfo"], axis=1)
    b = np.concatenate([np.full(H, tags[g]) for g in "icfo"])

    def order(bias):
        return "".join({v: k for k, v in tags.items()}[v] for v in bias[::H])

    assert order(layouts.lstm_to_torch(w, b)[2]) == "ifco"
    assert order(layouts.lstm_to_keras(w, b)[2]) == "ifco"
    assert order(layouts.lstm_to_onnx(w, b)[2][0, :4 * H]) == "iofc"
    assert order(layouts.lstm_to_tf_v2(w, b)[1]) == "ifco"
    assert order(layouts.lstm_to_torch(w, b)[0][:, 0]) == "ifco"


def test_results_are_new_arrays_and_inputs_untouched(rng):
    w, b = _lstm_weights(rng, 3, 2)
    w0, b0 = w.copy(), b.copy()
    for framework in LSTM_FRAMEWORKS:
        out = getattr(layouts, f"lstm_to_{framework}")(w, b)
        for a in out:
            assert a.flags.c_contiguous
            assert not np.shares_memory(a, w) and not np.shares_memory(a, b)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(b, b0)
    # Fortran-ordered and non-contiguous inputs give the same results.
    same = layouts.lstm_to_torch(np.asfortranarray(w), b[::1])
    for a, c in zip(same, layouts.lstm_to_torch(w, b), strict=True):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("framework", LSTM_FRAMEWORKS + ["gru_" + f for f in GRU_FRAMEWORKS])
def test_every_converter_returns_new_c_contiguous_arrays(rng, framework):
    """Both directions, from arrays as the frameworks hold them (PyTorch's transposes make
    Fortran-ordered intermediates)."""
    if framework.startswith("gru_"):
        framework = framework[4:]
        reset_after = GRU_FRAMEWORKS[framework][-1]
        weights = _gru_weights(rng, 3, 2, reset_after)
        native = getattr(layouts, f"gru_to_{framework}")(*weights)
        back = getattr(layouts, f"gru_from_{framework}")
        extra = {"reset_after": reset_after} if framework == "keras" else {}
        if framework == "onnx":
            extra = {"linear_before_reset": int(reset_after)}
        outputs = [*native, *back(*native, **extra)]
    else:
        weights = _lstm_weights(rng, 3, 2)
        native = getattr(layouts, f"lstm_to_{framework}")(*weights)
        outputs = [*native, *getattr(layouts, f"lstm_from_{framework}")(*native)]
    for k, a in enumerate(outputs):
        assert a.flags.c_contiguous, k
        assert not any(np.shares_memory(a, b) for b in (*weights, *native) if b is not a), k


@pytest.mark.parametrize("call, message", [
    (lambda: layouts.lstm_to_torch(np.zeros((5, 7)), np.zeros(7)), "w"),
    (lambda: layouts.lstm_to_torch(np.zeros((5, 8)), np.zeros(4)), "b"),
    (lambda: layouts.lstm_to_torch(np.zeros(8), np.zeros(8)), "w"),
    (lambda: layouts.lstm_from_torch(np.zeros((8, 3)), np.zeros((8, 3))), "weight_hh"),
    (lambda: layouts.lstm_from_torch(np.zeros((12, 3)), np.zeros((8, 2))), "weight_ih"),
    (lambda: layouts.lstm_from_torch(np.zeros((8, 3)), np.zeros((8, 2)), np.zeros(4)),
     "bias_ih"),
    (lambda: layouts.lstm_from_keras(np.zeros((3, 8)), np.zeros((2, 8)), np.zeros((2, 8))),
     "bias"),
    (lambda: layouts.lstm_from_onnx(np.zeros((2, 8, 3)), np.zeros((1, 8, 2))), "W"),
    (lambda: layouts.lstm_from_onnx(np.zeros((1, 8, 3)), np.zeros((1, 8, 2)),
                                    np.zeros((1, 8))), "B"),
    (lambda: layouts.gru_to_torch(np.zeros((5, 4)), np.zeros((5, 2)), np.zeros(4),
                                  np.zeros(2)), "b_c"),
    (lambda: layouts.gru_to_keras(np.zeros((5, 6)), np.zeros((5, 2)), np.zeros(4),
                                  np.zeros(2)), "w_ru"),
    (lambda: layouts.gru_from_keras(np.zeros((3, 6)), np.zeros((2, 6))), "reset_after"),
    (lambda: layouts.gru_from_onnx(np.zeros((1, 6, 3)), np.zeros((1, 6, 2)),
                                   linear_before_reset=2), "linear_before_reset"),
])
def test_bad_shapes_raise_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call, name", [
    (lambda: layouts.lstm_to_torch(np.zeros((5, 8)), None), "b"),
    (lambda: layouts.lstm_to_keras(None, np.zeros(8)), "w"),
    (lambda: layouts.lstm_from_torch(None, np.zeros((8, 2))), "weight_ih"),
    (lambda: layouts.lstm_from_onnx(np.zeros((1, 8, 3)), None), "R"),
    (lambda: layouts.gru_to_onnx(np.zeros((5, 4)), np.zeros((5, 2)), None, np.zeros(2)),
     "b_ru"),
    (lambda: layouts.gru_from_keras(np.zeros((3, 6)), None, reset_after=False),
     "recurrent_kernel"),
])
def test_a_missing_required_array_is_a_type_error_naming_it(call, name):
    with pytest.raises(TypeError, match=f"^{name} must be an array, got None$"):
        call()


def test_missing_biases_are_zeros(rng):
    """PyTorch ``bias=False``, Keras ``use_bias=False``, ONNX without ``B``."""
    H, I = 2, 3
    w, b = layouts.lstm_from_torch(rng.standard_normal((4 * H, I)),
                                   rng.standard_normal((4 * H, H)))
    np.testing.assert_array_equal(b, np.zeros(4 * H))
    for weights in (layouts.gru_from_keras(rng.standard_normal((I, 3 * H)),
                                           rng.standard_normal((H, 3 * H)), reset_after=True),
                    layouts.gru_from_onnx(rng.standard_normal((1, 3 * H, I)),
                                          rng.standard_normal((1, 3 * H, H)),
                                          linear_before_reset=1)):
        np.testing.assert_array_equal(weights[2], np.zeros(2 * H))
        np.testing.assert_array_equal(weights[3], np.zeros(2 * H))


def test_bad_dtypes_raise_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="b must have the same dtype as w"):
        layouts.lstm_to_torch(np.zeros((5, 8)), np.zeros(8, np.float32))
    with pytest.raises(TypeError, match="weight_ih must be a floating-point"):
        layouts.lstm_from_torch(np.zeros((8, 3), int), np.zeros((8, 2)))


# ---------------------------------------------------------------------------------------------
# PyTorch


def _t(torch, a):
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.conformance
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_lstm_from_torch_lstm_cell_forward(torch, rng, batch, input_size, hidden):
    cell = torch.nn.LSTMCell(input_size, hidden, dtype=torch.float64)
    with torch.no_grad():
        for p in cell.parameters():        # both biases nonzero: the sum rule is exercised
            p.normal_()
    x, h, c = (rng.standard_normal(s) for s in ((batch, input_size), (batch, hidden),
                                                 (batch, hidden)))
    with torch.no_grad():
        h_torch, c_torch = cell(_t(torch, x), (_t(torch, h), _t(torch, c)))
    w, b = layouts.lstm_from_torch(*cell.parameters())
    state = gc.lstm_cell(x, c, h, w, b, forget_bias=0.0)
    np.testing.assert_allclose(state.h, h_torch.numpy(), **F64_TOL)
    np.testing.assert_allclose(state.cs, c_torch.numpy(), **F64_TOL)


@pytest.mark.conformance
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_lstm_to_torch_lstm_sequence_forward(torch, rng, batch, input_size, hidden):
    T = 4
    w, b = _lstm_weights(rng, input_size, hidden)
    lstm = torch.nn.LSTM(input_size, hidden, dtype=torch.float64)
    with torch.no_grad():
        for p, a in zip(lstm.parameters(), layouts.lstm_to_torch(w, b), strict=True):
            p.copy_(_t(torch, a))
    x = rng.standard_normal((T, batch, input_size))
    h0, c0 = rng.standard_normal((2, batch, hidden))
    with torch.no_grad():
        out, (h_n, c_n) = lstm(_t(torch, x), (_t(torch, h0[None]), _t(torch, c0[None])))
    hs, cs, h = _lstm_steps(x, c0, h0, w, b)
    np.testing.assert_allclose(hs, out.numpy(), **F64_TOL)
    np.testing.assert_allclose(h, h_n.numpy()[0], **F64_TOL)
    np.testing.assert_allclose(cs, c_n.numpy()[0], **F64_TOL)


def _torch_gru_cell_and_case(torch, rng, batch, input_size, hidden):
    cell = torch.nn.GRUCell(input_size, hidden, dtype=torch.float64)
    with torch.no_grad():
        for p in cell.parameters():
            p.normal_()
    x, h = rng.standard_normal((batch, input_size)), rng.standard_normal((batch, hidden))
    return cell, x, h


@pytest.mark.conformance
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_gru_from_torch_gru_cell_forward_and_every_gradient(torch, rng, batch, input_size,
                                                            hidden):
    """Reset-after GRU: PyTorch's GRUCell forward and autograd gradients of x, h and all four
    parameters equal gradcells's ``gru_cell``/``gru_cell_grad(reset_after=True)``."""
    cell, x, h = _torch_gru_cell_and_case(torch, rng, batch, input_size, hidden)
    x_t = _t(torch, x).requires_grad_()
    h_t = _t(torch, h).requires_grad_()
    h_new = cell(x_t, h_t)
    d_h = rng.standard_normal((batch, hidden))
    h_new.backward(_t(torch, d_h))

    weights = layouts.gru_from_torch(*cell.parameters())
    assert weights[3].shape == (2 * hidden,)
    state = gc.gru_cell(x, h, *weights, reset_after=True)
    np.testing.assert_allclose(state.h, h_new.detach().numpy(), **F64_TOL)
    g = gc.gru_cell_grad(x, h, *weights, state, d_h=d_h, reset_after=True)
    np.testing.assert_allclose(g.x, x_t.grad.numpy(), **F64_TOL)
    np.testing.assert_allclose(g.h_prev, h_t.grad.numpy(), **F64_TOL)
    _assert_gru_parameter_grads(g, cell.parameters(), hidden)


def _assert_gru_parameter_grads(g, parameters, hidden):
    """gradcells's ``(w_ru, w_c, b_ru, b_c)`` gradients against PyTorch's parameter grads:
    the weights map one to one; each r/z bias grad appears in both PyTorch biases, and the
    candidate's two biases get ``db_c``'s two halves."""
    weight_ih, weight_hh, bias_ih, bias_hh = (p.grad.numpy() for p in parameters)
    d_weight_ih, d_weight_hh, _, _ = layouts.gru_to_torch(g.w_ru, g.w_c, g.b_ru, g.b_c)
    np.testing.assert_allclose(d_weight_ih, weight_ih, **F64_TOL)
    np.testing.assert_allclose(d_weight_hh, weight_hh, **F64_TOL)
    np.testing.assert_allclose(np.concatenate([g.b_ru, g.b_c[:hidden]]), bias_ih, **F64_TOL)
    np.testing.assert_allclose(np.concatenate([g.b_ru, g.b_c[hidden:]]), bias_hh, **F64_TOL)


@pytest.mark.conformance
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_gru_to_torch_gru_sequence_forward_and_every_gradient(torch, rng, batch, input_size,
                                                              hidden):
    """nn.GRU over T steps with weights from gradcells; gradients by backpropagation through
    time with ``gru_cell_grad(reset_after=True)`` step by step."""
    T = 3
    weights = _gru_weights(rng, input_size, hidden, reset_after=True)
    gru = torch.nn.GRU(input_size, hidden, dtype=torch.float64)
    with torch.no_grad():
        for p, a in zip(gru.parameters(), layouts.gru_to_torch(*weights), strict=True):
            p.copy_(_t(torch, a))
    x, h0 = rng.standard_normal((T, batch, input_size)), rng.standard_normal((batch, hidden))
    x_t, h0_t = _t(torch, x).requires_grad_(), _t(torch, h0[None]).requires_grad_()
    out, h_n = gru(x_t, h0_t)
    d_out = rng.standard_normal(out.shape)
    out.backward(_t(torch, d_out))

    hs, h_final = _gru_steps(x, h0, *weights, reset_after=True)
    np.testing.assert_allclose(hs, out.detach().numpy(), **F64_TOL)
    np.testing.assert_allclose(h_final, h_n.detach().numpy()[0], **F64_TOL)

    h_prevs = [h0] + list(hs[:-1])
    d_h = np.zeros_like(h0)
    totals = None
    dx = np.zeros_like(x)
    for t in reversed(range(T)):
        state = gc.gru_cell(x[t], h_prevs[t], *weights, reset_after=True)
        g = gc.gru_cell_grad(x[t], h_prevs[t], *weights, state, d_h=d_h + d_out[t],
                             reset_after=True)
        dx[t], d_h = g.x, g.h_prev
        totals = g if totals is None else type(g)(*(a + c for a, c in zip(totals, g, strict=True)))
    np.testing.assert_allclose(dx, x_t.grad.numpy(), **F64_TOL)
    np.testing.assert_allclose(d_h, h0_t.grad.numpy()[0], **F64_TOL)
    _assert_gru_parameter_grads(totals, gru.parameters(), hidden)


def test_gru_to_torch_rejects_reset_before(rng):
    weights = _gru_weights(rng, 3, 2, reset_after=False)
    with pytest.raises(ValueError, match="b_c must have shape \\[2H\\]"):
        layouts.gru_to_torch(*weights)


@pytest.mark.conformance
def test_converters_take_tensors_that_require_grad(torch):
    cell = torch.nn.LSTMCell(3, 2, dtype=torch.float64)
    w, b = layouts.lstm_from_torch(*cell.parameters())
    assert isinstance(w, np.ndarray) and w.shape == (5, 8)
    np.testing.assert_array_equal(layouts.lstm_to_torch(w, b)[0],
                                  cell.weight_ih.detach().numpy())


# ---------------------------------------------------------------------------------------------
# Keras 3 (TensorFlow backend) and TensorFlow's BlockLSTMV2


@pytest.fixture(scope="module")
def keras():
    pytest.importorskip("tensorflow")
    return pytest.importorskip("keras")


@pytest.mark.conformance
@pytest.mark.parametrize("batch, input_size, hidden", SIZES[:2])
def test_lstm_to_keras_forward(keras, rng, batch, input_size, hidden):
    T = 3
    w, b = _lstm_weights(rng, input_size, hidden)
    layer = keras.layers.LSTM(hidden, return_sequences=True, return_state=True,
                              dtype="float64")
    x = rng.standard_normal((batch, T, input_size))
    h0, c0 = rng.standard_normal((2, batch, hidden))
    layer.build((batch, T, input_size))
    layer.set_weights(layouts.lstm_to_keras(w, b))
    out, h_n, c_n = (np.asarray(a) for a in layer(x, initial_state=[h0, c0]))
    hs, cs, h = _lstm_steps(np.swapaxes(x, 0, 1), c0, h0, w, b)
    np.testing.assert_allclose(hs, np.swapaxes(out, 0, 1), **F64_TOL)
    np.testing.assert_allclose(cs, c_n, **F64_TOL)
    back = layouts.lstm_from_keras(*layer.get_weights())
    np.testing.assert_array_equal(back[0], w)


@pytest.mark.conformance
@pytest.mark.parametrize("reset_after", [True, False])
@pytest.mark.parametrize("batch, input_size, hidden", SIZES[:2])
def test_gru_from_keras_forward(keras, rng, reset_after, batch, input_size, hidden):
    T = 3
    layer = keras.layers.GRU(hidden, return_sequences=True, reset_after=reset_after,
                             dtype="float64", bias_initializer="random_normal")
    layer.build((batch, T, input_size))
    x = rng.standard_normal((batch, T, input_size))
    h0 = rng.standard_normal((batch, hidden))
    out = np.asarray(layer(x, initial_state=[h0]))
    weights = layouts.gru_from_keras(*layer.get_weights())
    assert weights[3].shape == ((2 if reset_after else 1) * hidden,)
    hs, _ = _gru_steps(np.swapaxes(x, 0, 1), h0, *weights, reset_after=reset_after)
    np.testing.assert_allclose(hs, np.swapaxes(out, 0, 1), **F64_TOL)


@pytest.mark.conformance
@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("batch, input_size, hidden", SIZES[:2])
def test_lstm_to_tf_v2_block_lstm_v2_forward(keras, rng, peephole, batch, input_size, hidden):
    import tensorflow as tf

    T = 3
    case = lstm_cell_case(rng, batch=batch, input_size=input_size, hidden=hidden,
                          dtype=np.float32, peephole=peephole)
    w_v2, b_v2 = layouts.lstm_to_tf_v2(case["w"], case["b"])
    x = rng.standard_normal((T, batch, input_size)).astype(np.float32)
    zeros = np.zeros(hidden, np.float32)
    peeps = {k: zeros if case[k] is None else case[k] for k in PEEPHOLES}
    out = tf.raw_ops.BlockLSTMV2(
        seq_len_max=np.int64(T), x=x, cs_prev=case["cs_prev"], h_prev=case["h_prev"],
        w=w_v2, b=b_v2, use_peephole=peephole, **peeps)
    as64 = {k: case[k].astype(np.float64) if case[k] is not None else None
            for k in ("cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")}
    hs, _, _ = _lstm_steps(x.astype(np.float64), as64["cs_prev"], as64["h_prev"], as64["w"],
                           as64["b"], wci=as64["wci"], wcf=as64["wcf"], wco=as64["wco"])
    np.testing.assert_allclose(out[6].numpy(), hs, **F32_TOL)


# ---------------------------------------------------------------------------------------------
# ONNX, by the operator documentation's equations (onnx.ai, LSTM-22 / GRU-22): a literal
# transcription, with f = sigmoid and g = h = tanh, the default activations.


def _sigmoid(z):
    return 0.5 * np.tanh(0.5 * z) + 0.5


def _onnx_lstm(X, W, R, B, P, initial_h, initial_c):
    """ONNX LSTM, one direction: W [1,4H,I], R [1,4H,H], B [1,8H], P [1,3H]; gates iofc."""
    Wi, Wo, Wf, Wc = np.split(W[0], 4)
    Ri, Ro, Rf, Rc = np.split(R[0], 4)
    Wbi, Wbo, Wbf, Wbc, Rbi, Rbo, Rbf, Rbc = np.split(B[0], 8)
    Pi, Po, Pf = np.split(P[0], 3)
    H, C, Y = initial_h, initial_c, []
    for Xt in X:
        it = _sigmoid(Xt @ Wi.T + H @ Ri.T + Pi * C + Wbi + Rbi)
        ft = _sigmoid(Xt @ Wf.T + H @ Rf.T + Pf * C + Wbf + Rbf)
        ct = np.tanh(Xt @ Wc.T + H @ Rc.T + Wbc + Rbc)
        C = ft * C + it * ct
        ot = _sigmoid(Xt @ Wo.T + H @ Ro.T + Po * C + Wbo + Rbo)
        H = ot * np.tanh(C)
        Y.append(H)
    return np.stack(Y), C


def _onnx_gru(X, W, R, B, initial_h, linear_before_reset):
    """ONNX GRU, one direction: W [1,3H,I], R [1,3H,H], B [1,6H]; gates zrh."""
    Wz, Wr, Wh = np.split(W[0], 3)
    Rz, Rr, Rh = np.split(R[0], 3)
    Wbz, Wbr, Wbh, Rbz, Rbr, Rbh = np.split(B[0], 6)
    H, Y = initial_h, []
    for Xt in X:
        zt = _sigmoid(Xt @ Wz.T + H @ Rz.T + Wbz + Rbz)
        rt = _sigmoid(Xt @ Wr.T + H @ Rr.T + Wbr + Rbr)
        if linear_before_reset:
            ht = np.tanh(Xt @ Wh.T + rt * (H @ Rh.T + Rbh) + Wbh)
        else:
            ht = np.tanh(Xt @ Wh.T + (rt * H) @ Rh.T + Rbh + Wbh)
        H = (1 - zt) * ht + zt * H
        Y.append(H)
    return np.stack(Y)


@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_lstm_onnx_forward_with_peepholes_and_two_biases(rng, batch, input_size, hidden):
    T = 3
    case = lstm_cell_case(rng, batch=batch, input_size=input_size, hidden=hidden,
                          peephole=True)
    x = rng.standard_normal((T, batch, input_size))
    W, R, B, P = layouts.lstm_to_onnx(case["w"], case["b"], case["wci"], case["wcf"],
                                      case["wco"])
    B = B + np.concatenate([np.zeros(4 * hidden), rng.standard_normal(4 * hidden)])[None]
    y, c = _onnx_lstm(x, W, R, B, P, case["h_prev"], case["cs_prev"])
    w, b, wci, wcf, wco = layouts.lstm_from_onnx(W, R, B, P)
    hs, cs, _ = _lstm_steps(x, case["cs_prev"], case["h_prev"], w, b, wci=wci, wcf=wcf,
                            wco=wco)
    np.testing.assert_allclose(hs, y, **F64_TOL)
    np.testing.assert_allclose(cs, c, **F64_TOL)


@pytest.mark.parametrize("reset_after", [False, True])
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_gru_onnx_forward(rng, reset_after, batch, input_size, hidden):
    T = 3
    W, R, B = (rng.standard_normal(s) for s in ((1, 3 * hidden, input_size),
                                                 (1, 3 * hidden, hidden), (1, 6 * hidden)))
    x, h0 = rng.standard_normal((T, batch, input_size)), rng.standard_normal((batch, hidden))
    y = _onnx_gru(x, W, R, B, h0, linear_before_reset=int(reset_after))
    weights = layouts.gru_from_onnx(W, R, B, linear_before_reset=int(reset_after))
    hs, _ = _gru_steps(x, h0, *weights, reset_after=reset_after)
    np.testing.assert_allclose(hs, y, **F64_TOL)


# ---------------------------------------------------------------------------------------------
# ONNX Runtime itself: the converted weights in a one-node ONNX graph give gradcells's forward


@pytest.fixture(scope="module")
def onnx_run():
    """``run(op, inputs, **attributes)``: one ONNX ``LSTM``/``GRU`` node (one direction, all
    outputs) executed by ONNX Runtime's CPU provider on float32 ``inputs`` (a dict in the
    operator's input order; an empty name is an omitted optional input)."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    def run(op, inputs, **attributes):
        steps, batch, _ = inputs["X"].shape
        state = (1, batch, attributes["hidden_size"])
        outputs = {"Y": (steps, *state), "Y_h": state}
        if op == "LSTM":
            outputs["Y_c"] = state
        node = helper.make_node(op, list(inputs), list(outputs), **attributes)
        graph = helper.make_graph(
            [node], f"one_{op}",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
             for n, a in inputs.items() if n],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
             for n, shape in outputs.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        onnx.checker.check_model(model)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        feed = {n: np.asarray(a, np.float32) for n, a in inputs.items() if n}
        return dict(zip(outputs, session.run(None, feed), strict=True))

    return run


@pytest.mark.conformance
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_lstm_to_onnx_runs_in_onnxruntime(onnx_run, rng, batch, input_size, hidden):
    T = 3
    case = lstm_cell_case(rng, batch=batch, input_size=input_size, hidden=hidden,
                          peephole=True)
    x = rng.standard_normal((T, batch, input_size)).astype(np.float32)
    W, R, B, P = layouts.lstm_to_onnx(case["w"], case["b"], case["wci"], case["wcf"],
                                      case["wco"])
    out = onnx_run("LSTM", {"X": x, "W": W, "R": R, "B": B, "": None,
                            "initial_h": case["h_prev"][None], "initial_c": case["cs_prev"][None],
                            "P": P}, hidden_size=hidden)
    as64 = {k: np.asarray(case[k], np.float32).astype(np.float64) for k in case}
    hs, cs, h = _lstm_steps(x.astype(np.float64), as64["cs_prev"], as64["h_prev"], as64["w"],
                            as64["b"], wci=as64["wci"], wcf=as64["wcf"], wco=as64["wco"])
    np.testing.assert_allclose(out["Y"][:, 0], hs, **F32_TOL)       # Y [T, 1, B, H]
    np.testing.assert_allclose(out["Y_h"][0], h, **F32_TOL)
    np.testing.assert_allclose(out["Y_c"][0], cs, **F32_TOL)


@pytest.mark.conformance
@pytest.mark.parametrize("reset_after", [False, True])
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_gru_from_onnx_runs_in_onnxruntime(onnx_run, rng, reset_after, batch, input_size,
                                           hidden):
    T = 3
    W, R, B = (rng.standard_normal(s).astype(np.float32)
               for s in ((1, 3 * hidden, input_size), (1, 3 * hidden, hidden), (1, 6 * hidden)))
    x = rng.standard_normal((T, batch, input_size)).astype(np.float32)
    h0 = rng.standard_normal((batch, hidden)).astype(np.float32)
    out = onnx_run("GRU", {"X": x, "W": W, "R": R, "B": B, "": None,
                           "initial_h": h0[None]},
                   hidden_size=hidden, linear_before_reset=int(reset_after))
    weights = layouts.gru_from_onnx(*(a.astype(np.float64) for a in (W, R, B)),
                                    linear_before_reset=int(reset_after))
    hs, h = _gru_steps(x.astype(np.float64), h0.astype(np.float64), *weights,
                       reset_after=reset_after)
    np.testing.assert_allclose(out["Y"][:, 0], hs, **F32_TOL)
    np.testing.assert_allclose(out["Y_h"][0], h, **F32_TOL)


def test_masked_arrays_are_refused_not_unmasked():
    with pytest.raises(TypeError, match="^w must be an array, got MaskedArray$"):
        layouts.lstm_to_torch(np.ma.masked_array(np.zeros((5, 8))), np.zeros(8))


def test_selective_from_and_to_mamba_round_trip_and_name_what_they_cannot_hold():
    """A ``Mamba`` block's ``A_log``, ``D`` and ``dt_proj.bias`` as the selective scan's
    ``A = -exp(A_log)``, ``D`` and ``delta_bias`` (with its ``delta_softplus``), and back; a
    non-negative ``A`` (no ``A_log``) and a wrong shape are named."""
    rng = np.random.default_rng(12)
    a_log, d, bias = rng.standard_normal((4, 3)), rng.standard_normal(4), rng.standard_normal(4)
    converted = gc.layouts.selective_from_mamba(a_log, d, bias)
    a, d_out, bias_out = converted
    np.testing.assert_allclose(a, -np.exp(a_log), rtol=1e-15)
    np.testing.assert_array_equal(d_out, d)
    np.testing.assert_array_equal(bias_out, bias)
    assert converted.options == {"delta_softplus": True}
    back = gc.layouts.selective_to_mamba(*converted)
    np.testing.assert_allclose(back["A_log"], a_log, rtol=1e-14, atol=1e-15)
    assert set(back) == {"A_log", "D", "dt_proj.bias"}
    with pytest.raises(ValueError, match="^A must be negative everywhere"):
        gc.layouts.selective_to_mamba(np.abs(a), d, bias)
    with pytest.raises(ValueError, match=r"^D must have shape \[Dm\] = \(4,\)"):
        gc.layouts.selective_from_mamba(a_log, d[:3], bias)

