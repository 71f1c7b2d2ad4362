"""Conformance of the plain RNN cell (docs/spec.md §9.3) with the frameworks' own modules,
in float64 where the framework runs it: PyTorch's ``nn.RNNCell`` and ``nn.RNN`` (tanh and
relu; forward and every autograd gradient, also on a packed ragged batch), Keras 3's
``SimpleRNN`` (forward and every ``tf.GradientTape`` gradient) and ONNX Runtime's ``RNN``
operator (forward with ``sequence_lens``, float32: ONNX Runtime's RNN kernel is float only).

The weights travel through ``gc.layouts`` (``rnn_from_torch``, ``rnn_to_keras``,
``rnn_to_onnx``), so these tests check the converters too. Every test runs on each NumPy
backend that has the cell. Tolerances are those of the other module conformance tests
(tests/frameworks/test_layouts.py): the frameworks' kernels sum in their own order.

Framework tests skip when the framework is not installed (``pip install gradcells[conformance]``).
"""

import numpy as np
import pytest
from conftest import torch_leaf
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells import layouts

pytestmark = pytest.mark.conformance

BACKENDS = ["reference", "cpu"]         # every NumPy backend; "cpu" fails until it has rnn
ACTIVATIONS = ["tanh", "relu"]
SIZES = [(3, 4, 5), (2, 1, 1), (4, 6, 2)]          # (batch, input size, hidden)
F64_TOL = {"rtol": 1e-12, "atol": 1e-13}
F32_TOL = {"rtol": 2e-6, "atol": 2e-6}
GRAD_FIELDS = ("x", "h_prev", "w", "b")


def close(actual, expected, what="", tol=F64_TOL):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), err_msg=what, **tol)


# ---------------------------------------------------------------------------------------------
# PyTorch


def _torch_parameter_grads(module):
    """gradcells ``(dw, db)`` from a module's parameter gradients: ``dw`` by the same
    converter as the weights, ``db`` the gradient of either bias (they receive the same)."""
    g = [p.grad.numpy() for p in module.parameters()]
    close(g[2], g[3], "bias_ih and bias_hh gradients")
    return layouts.rnn_from_torch(g[0], g[1])[0], g[2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_torch_rnn_cell_forward_and_every_gradient(torch, rng, backend, activation, batch,
                                                   input_size, hidden):
    cell = torch.nn.RNNCell(input_size, hidden, nonlinearity=activation, dtype=torch.float64)
    conv = layouts.rnn_from_torch(*cell.parameters(), nonlinearity=activation)
    assert conv.options == {"activation": activation}
    x = torch_leaf(torch, rng.standard_normal((batch, input_size)))
    h_prev = torch_leaf(torch, rng.standard_normal((batch, hidden)))
    d_h = rng.standard_normal((batch, hidden))
    h = cell(x, h_prev)
    h.backward(torch.from_numpy(d_h))

    arrays = (x.detach().numpy(), h_prev.detach().numpy(), *conv)
    state = gc.rnn_cell(*arrays, **conv.options, backend=backend)
    close(state.h, h.detach().numpy(), "h")
    grads = gc.rnn_cell_grad(*arrays, state, d_h=d_h, backend=backend)
    dw, db = _torch_parameter_grads(cell)
    for k, theirs in zip(GRAD_FIELDS, (x.grad.numpy(), h_prev.grad.numpy(), dw, db), strict=True):
        close(getattr(grads, k), theirs, f"d{k}")


def _torch_rnn(torch, module, x, h0, lengths):
    """``nn.RNN`` on ``x [T, B, I]``: per-step outputs ``[T, B, H]`` (packed by ``lengths``,
    padded back with zeros past each row's length; None: not packed) and ``h_n [B, H]``."""
    steps = x.shape[0]
    if lengths is None:
        out, h_n = module(x, h0[None])
        return out, h_n[0]
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths),
                                                     enforce_sorted=False)
    out, h_n = module(packed, h0[None])
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=steps)
    return out, h_n[0]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 5), batch=st.integers(1, 4),
       input_size=st.integers(1, 4), hidden=st.integers(1, 4),
       activation=st.sampled_from(ACTIVATIONS), packed=st.booleans())
def test_torch_rnn_over_a_ragged_batch_forward_and_every_gradient(
        torch, backend, seed, steps, batch, input_size, hidden, activation, packed):
    """``nn.RNN`` on a packed batch with lengths in 1..T (T included; PyTorch refuses 0)
    against ``gc.rnn_sequence(..., seq_len=lengths)``: per-step outputs, zero past a row's
    length, the final state, and every gradient from upstream ones on both."""
    rng = np.random.default_rng(seed)
    module = torch.nn.RNN(input_size, hidden, nonlinearity=activation, dtype=torch.float64)
    torch.nn.init.normal_(module.weight_hh_l0, std=0.7 / np.sqrt(hidden))
    conv = layouts.rnn_from_torch(*module.parameters(), nonlinearity=activation)
    lengths = rng.integers(1, steps + 1, batch) if packed else None
    if packed:
        lengths[rng.integers(batch)] = steps
    x = torch_leaf(torch, rng.standard_normal((steps, batch, input_size)))
    h0 = torch_leaf(torch, rng.standard_normal((batch, hidden)))
    d_h = rng.standard_normal((steps, batch, hidden))
    d_h_final = rng.standard_normal((batch, hidden))
    out, h_n = _torch_rnn(torch, module, x, h0, lengths)
    ((out * torch.from_numpy(d_h)).sum() + (h_n * torch.from_numpy(d_h_final)).sum()).backward()

    arrays = (x.detach().numpy(), h0.detach().numpy(), *conv)
    seq = gc.rnn_sequence(*arrays, **conv.options, seq_len=lengths, backend=backend)
    close(seq.h, out.detach().numpy(), "h")
    close(seq.h_final, h_n.detach().numpy(), "h_final")
    if packed:
        past = np.arange(steps)[:, None] >= lengths[None, :]
        assert not seq.h[past].any()
    grads = gc.rnn_sequence_grad(*arrays, seq, d_h=d_h, d_h_final=d_h_final, backend=backend)
    dw, db = _torch_parameter_grads(module)
    for k, theirs in zip(("x", "h0", "w", "b"), (x.grad.numpy(), h0.grad.numpy(), dw, db),
                         strict=True):
        close(getattr(grads, k), theirs, f"d{k}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_torch_rnn_runs_weights_converted_to_torch(torch, rng, backend, activation):
    """The other direction: gradcells weights set into ``nn.RNN`` by ``rnn_to_torch``."""
    steps, batch, input_size, hidden = 4, 3, 2, 5
    case = gc.testing.rnn_sequence_case(rng, steps=steps, batch=batch, input_size=input_size,
                                        hidden=hidden, activation=activation)
    module = torch.nn.RNN(input_size, hidden, nonlinearity=activation, dtype=torch.float64)
    with torch.no_grad():
        for p, a in zip(module.parameters(), layouts.rnn_to_torch(case["w"], case["b"]),
                        strict=True):
            p.copy_(torch.from_numpy(a))
    out, h_n = module(torch.from_numpy(case["x"]), torch.from_numpy(case["h0"])[None])
    seq = gc.rnn_sequence(**case, backend=backend)
    close(seq.h, out.detach().numpy(), "h")
    close(seq.h_final, h_n[0].detach().numpy(), "h_final")


# ---------------------------------------------------------------------------------------------
# Keras 3 (TensorFlow backend)


@pytest.fixture(scope="module")
def keras():
    pytest.importorskip("tensorflow")
    return pytest.importorskip("keras")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("batch, input_size, hidden", SIZES[:2])
def test_keras_simple_rnn_forward_and_every_gradient(keras, rng, backend, activation, batch,
                                                     input_size, hidden):
    import tensorflow as tf

    steps = 4
    case = gc.testing.rnn_sequence_case(rng, steps=steps, batch=batch, input_size=input_size,
                                        hidden=hidden, activation=activation)
    layer = keras.layers.SimpleRNN(hidden, activation=activation, return_sequences=True,
                                   return_state=True, dtype="float64")
    layer.build((batch, steps, input_size))
    layer.set_weights(layouts.rnn_to_keras(case["w"], case["b"]))
    d_h = rng.standard_normal((steps, batch, hidden))
    d_h_final = rng.standard_normal((batch, hidden))
    x = tf.constant(np.swapaxes(case["x"], 0, 1))                  # Keras: [B, T, I]
    h0 = tf.constant(case["h0"])
    with tf.GradientTape() as tape:
        tape.watch([x, h0])
        out, h_n = layer(x, initial_state=[h0])
        loss = (tf.reduce_sum(out * np.swapaxes(d_h, 0, 1))
                + tf.reduce_sum(h_n * d_h_final))
    kernels = layer.trainable_weights
    g_x, g_h0, *g_weights = tape.gradient(loss, [x, h0, *kernels])

    seq = gc.rnn_sequence(**case, backend=backend)
    close(seq.h, np.swapaxes(np.asarray(out), 0, 1), "h")
    close(seq.h_final, np.asarray(h_n), "h_final")
    conv = layouts.rnn_from_keras(*(np.asarray(g) for g in g_weights), activation=activation)
    grads = gc.rnn_sequence_grad(case["x"], case["h0"], case["w"], case["b"], seq, d_h=d_h,
                                 d_h_final=d_h_final, backend=backend)
    expected = (np.swapaxes(np.asarray(g_x), 0, 1), np.asarray(g_h0), *conv)
    for k, theirs in zip(("x", "h0", "w", "b"), expected, strict=True):
        close(getattr(grads, k), theirs, f"d{k}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_keras_weights_convert_back(keras, rng, activation):
    layer = keras.layers.SimpleRNN(3, activation=activation, dtype="float64")
    layer.build((2, 4, 2))
    conv = layouts.rnn_from_keras(*layer.get_weights(), activation=activation)
    assert conv.options == {"activation": activation}
    for theirs, ours in zip(layer.get_weights(), layouts.rnn_to_keras(*conv), strict=True):
        np.testing.assert_array_equal(ours, theirs)


# ---------------------------------------------------------------------------------------------
# ONNX Runtime's RNN operator


@pytest.fixture(scope="module")
def onnx_rnn():
    """``run(inputs, **attributes)``: one ONNX ``RNN`` node (one direction, both outputs)
    executed by ONNX Runtime's CPU provider (a dict of inputs in the operator's order)."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    def run(inputs, **attributes):
        steps, batch, _ = inputs["X"].shape
        state = (1, batch, attributes["hidden_size"])
        outputs = {"Y": (steps, *state), "Y_h": state}
        types = {n: TensorProto.INT32 if n == "sequence_lens" else TensorProto.FLOAT
                 for n in inputs}
        node = helper.make_node("RNN", list(inputs), list(outputs), **attributes)
        graph = helper.make_graph(
            [node], "one_RNN",
            [helper.make_tensor_value_info(n, types[n], a.shape) for n, a in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
             for n, shape in outputs.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        onnx.checker.check_model(model)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        feed = {n: np.asarray(a, np.int32 if n == "sequence_lens" else np.float32)
                for n, a in inputs.items()}
        return dict(zip(outputs, session.run(None, feed), strict=True))

    return run


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
def test_onnx_rnn_with_sequence_lens(onnx_rnn, rng, backend, activation, batch, input_size,
                                     hidden):
    steps = 4
    W, R, B = (rng.standard_normal(s).astype(np.float32) * 0.5
               for s in ((1, hidden, input_size), (1, hidden, hidden), (1, 2 * hidden)))
    x = rng.standard_normal((steps, batch, input_size)).astype(np.float32)
    h0 = rng.standard_normal((batch, hidden)).astype(np.float32)
    lengths = rng.integers(1, steps + 1, batch).astype(np.int32)
    lengths[0] = steps
    onnx_activation = {"tanh": "Tanh", "relu": "Relu"}[activation]
    out = onnx_rnn({"X": x, "W": W, "R": R, "B": B, "sequence_lens": lengths,
                    "initial_h": h0[None]}, hidden_size=hidden, activations=[onnx_activation])
    conv = layouts.rnn_from_onnx(*(a.astype(np.float64) for a in (W, R, B)),
                                 activation=onnx_activation)
    assert conv.options == {"activation": activation}
    seq = gc.rnn_sequence(x.astype(np.float64), h0.astype(np.float64), *conv, **conv.options,
                          seq_len=lengths, backend=backend)
    close(out["Y"][:, 0], seq.h, "Y", F32_TOL)             # Y [T, 1, B, H], zero past length
    close(out["Y_h"][0], seq.h_final, "Y_h", F32_TOL)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_onnx_rnn_runs_weights_converted_to_onnx(onnx_rnn, rng, activation):
    steps, batch, input_size, hidden = 3, 2, 3, 4
    case = gc.testing.rnn_sequence_case(rng, steps=steps, batch=batch, input_size=input_size,
                                        hidden=hidden, activation=activation, dtype=np.float32)
    W, R, B = layouts.rnn_to_onnx(case["w"], case["b"])
    out = onnx_rnn({"X": case["x"], "W": W, "R": R, "B": B, "sequence_lens":
                    np.full(batch, steps, np.int32), "initial_h": case["h0"][None]},
                   hidden_size=hidden, activations=[activation.capitalize()])
    as64 = {k: v.astype(np.float64) for k, v in case.items() if isinstance(v, np.ndarray)}
    seq = gc.rnn_sequence(**as64, activation=activation, backend="reference")
    close(out["Y"][:, 0], seq.h, "Y", F32_TOL)
    close(out["Y_h"][0], seq.h_final, "Y_h", F32_TOL)
