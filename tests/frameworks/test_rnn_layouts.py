"""The plain RNN cell's weight converters (``gc.layouts.rnn_{from,to}_{torch,keras,onnx}``):
round trips are the identity, the two-bias rule, the activation carried in ``options``,
shapes and activations checked with errors naming the argument. The frameworks' own modules
run the converted weights in tests/frameworks/test_rnn_conformance.py."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradcells import layouts
from gradcells.testing import rnn_cell_case

FRAMEWORKS = ["torch", "keras", "onnx"]
# The activation keyword each ``rnn_from_X`` takes, and its spelling of gradcells's names.
ACTIVATION_KEYWORD = {"torch": ("nonlinearity", {"tanh": "tanh", "relu": "relu"}),
                      "keras": ("activation", {"tanh": "tanh", "relu": "relu"}),
                      "onnx": ("activation", {"tanh": "Tanh", "relu": "Relu"})}


def _rnn_weights(rng, input_size, hidden, dtype=np.float64):
    case = rnn_cell_case(rng, batch=1, input_size=input_size, hidden=hidden, dtype=dtype)
    return case["w"], case["b"]


@given(seed=st.integers(0, 2**32 - 1), input_size=st.integers(0, 5),
       hidden=st.integers(1, 5), framework=st.sampled_from(FRAMEWORKS),
       dtype=st.sampled_from([np.float32, np.float64]),
       activation=st.sampled_from(["tanh", "relu"]))
def test_rnn_round_trip_is_identity(seed, input_size, hidden, framework, dtype, activation):
    w, b = _rnn_weights(np.random.default_rng(seed), input_size, hidden, dtype)
    keyword, spelling = ACTIVATION_KEYWORD[framework]
    native = getattr(layouts, f"rnn_to_{framework}")(w, b)
    back = getattr(layouts, f"rnn_from_{framework}")(*native, **{keyword: spelling[activation]})
    assert len(back) == 2
    assert back.framework == framework and back.state_order == ("h",)
    assert back.options == {"activation": activation}
    assert back.gradcells_states("h0") == ("h0",)
    for original, result in zip((w, b), back, strict=True):
        assert result.dtype == original.dtype
        np.testing.assert_array_equal(result, original)


def test_default_activation_is_tanh(rng):
    H, I = 2, 3
    assert layouts.rnn_from_torch(rng.standard_normal((H, I)),
                                  rng.standard_normal((H, H))).options == {"activation": "tanh"}
    assert layouts.rnn_from_keras(rng.standard_normal((I, H)),
                                  rng.standard_normal((H, H))).options == {"activation": "tanh"}
    assert layouts.rnn_from_onnx(rng.standard_normal((1, H, I)),
                                 rng.standard_normal((1, H, H))).options == {"activation": "tanh"}


def test_the_two_bias_rule(rng):
    """``from`` sums the input and recurrent biases; ``to`` puts the sum in the first."""
    H, I = 3, 2
    weight_ih, weight_hh = rng.standard_normal((H, I)), rng.standard_normal((H, H))
    bias_ih, bias_hh = rng.standard_normal(H), rng.standard_normal(H)
    w, b = layouts.rnn_from_torch(weight_ih, weight_hh, bias_ih, bias_hh)
    np.testing.assert_array_equal(b, bias_ih + bias_hh)
    np.testing.assert_array_equal(w, np.concatenate([weight_ih.T, weight_hh.T]))
    back = layouts.rnn_to_torch(w, b)
    np.testing.assert_array_equal(back[0], weight_ih)
    np.testing.assert_array_equal(back[1], weight_hh)
    np.testing.assert_array_equal(back[2], bias_ih + bias_hh)
    np.testing.assert_array_equal(back[3], np.zeros(H))

    W, R = weight_ih[None], weight_hh[None]
    B = np.concatenate([bias_ih, bias_hh])[None]
    w, b = layouts.rnn_from_onnx(W, R, B)
    np.testing.assert_array_equal(b, bias_ih + bias_hh)
    W2, R2, B2 = layouts.rnn_to_onnx(w, b)
    np.testing.assert_array_equal(W2, W)
    np.testing.assert_array_equal(R2, R)
    np.testing.assert_array_equal(B2, np.concatenate([bias_ih + bias_hh, np.zeros(H)])[None])


def test_missing_biases_are_zeros(rng):
    """PyTorch ``bias=False``, Keras ``use_bias=False``, ONNX without ``B``."""
    H, I = 2, 3
    for conv in (layouts.rnn_from_torch(rng.standard_normal((H, I)), rng.standard_normal((H, H))),
                 layouts.rnn_from_keras(rng.standard_normal((I, H)), rng.standard_normal((H, H))),
                 layouts.rnn_from_onnx(rng.standard_normal((1, H, I)),
                                       rng.standard_normal((1, H, H)))):
        assert conv[0].shape == (I + H, H)
        np.testing.assert_array_equal(conv[1], np.zeros(H))


@pytest.mark.parametrize("input_size, hidden", [(3, 2), (1, 1), (1, 3), (0, 2)])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_rnn_converter_returns_new_c_contiguous_arrays(rng, framework, input_size,
                                                             hidden):
    """Both directions; single rows and columns, whose transposes are views, included."""
    weights = _rnn_weights(rng, input_size, hidden)
    w0, b0 = (a.copy() for a in weights)
    native = getattr(layouts, f"rnn_to_{framework}")(*weights)
    outputs = [*native, *getattr(layouts, f"rnn_from_{framework}")(*native)]
    for k, a in enumerate(outputs):
        assert a.flags.c_contiguous, k
        assert not any(np.shares_memory(a, b) for b in (*weights, *native) if b is not a), k
    np.testing.assert_array_equal(weights[0], w0)
    np.testing.assert_array_equal(weights[1], b0)


@pytest.mark.parametrize("call, message", [
    (lambda: layouts.rnn_to_torch(np.zeros((5, 7)), np.zeros(7)), r"^w must have shape"),
    (lambda: layouts.rnn_to_torch(np.zeros(8), np.zeros(8)), r"^w must be a 2-D"),
    (lambda: layouts.rnn_to_keras(np.zeros((5, 2)), np.zeros(3)), r"^b must have shape \[H\]"),
    (lambda: layouts.rnn_to_onnx(np.zeros((1, 2)), np.zeros(2)), r"^w must have shape"),
    (lambda: layouts.rnn_from_torch(np.zeros((3, 2)), np.zeros((3, 2))),
     r"^weight_hh must have shape \[H, H\]"),
    (lambda: layouts.rnn_from_torch(np.zeros((4, 2)), np.zeros((3, 3))),
     r"^weight_ih must have shape \[H, I\]"),
    (lambda: layouts.rnn_from_torch(np.zeros((3, 2)), np.zeros((3, 3)), np.zeros(4)),
     r"^bias_ih must have shape \[H\]"),
    (lambda: layouts.rnn_from_torch(np.zeros((3, 2)), np.zeros((3, 3)), None, np.zeros(2)),
     r"^bias_hh must have shape \[H\]"),
    (lambda: layouts.rnn_from_keras(np.zeros((2, 4)), np.zeros((3, 3))), r"^kernel must have"),
    (lambda: layouts.rnn_from_keras(np.zeros((2, 3)), np.zeros((3, 4))),
     r"^recurrent_kernel must have"),
    (lambda: layouts.rnn_from_keras(np.zeros((2, 3)), np.zeros((3, 3)), np.zeros((2, 3))),
     r"^bias must have shape \[H\]"),
    (lambda: layouts.rnn_from_onnx(np.zeros((2, 3, 2)), np.zeros((1, 3, 3))),
     r"^W must have num_directions = 1"),
    (lambda: layouts.rnn_from_onnx(np.zeros((1, 3, 2)), np.zeros((3, 3))), r"^R must be a 3-D"),
    (lambda: layouts.rnn_from_onnx(np.zeros((1, 3, 2)), np.zeros((1, 3, 3)), np.zeros((1, 3))),
     r"^B must have shape \[1, 2H\]"),
    (lambda: layouts.rnn_from_torch(np.zeros((3, 2)), np.zeros((3, 3)), nonlinearity="gelu"),
     r"^nonlinearity must be 'tanh' or 'relu', got 'gelu'"),
    (lambda: layouts.rnn_from_keras(np.zeros((2, 3)), np.zeros((3, 3)), activation="Relu"),
     r"^activation must be 'tanh' or 'relu', got 'Relu'"),
    (lambda: layouts.rnn_from_onnx(np.zeros((1, 3, 2)), np.zeros((1, 3, 3)), activation="relu"),
     r"^activation must be 'Tanh' or 'Relu', got 'relu'"),
])
def test_rnn_bad_shapes_and_activations_raise_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call, name", [
    (lambda: layouts.rnn_to_torch(np.zeros((5, 2)), None), "b"),
    (lambda: layouts.rnn_to_keras(None, np.zeros(2)), "w"),
    (lambda: layouts.rnn_from_torch(None, np.zeros((2, 2))), "weight_ih"),
    (lambda: layouts.rnn_from_keras(np.zeros((3, 2)), None), "recurrent_kernel"),
    (lambda: layouts.rnn_from_onnx(np.zeros((1, 2, 3)), None), "R"),
])
def test_a_missing_required_rnn_array_is_a_type_error_naming_it(call, name):
    with pytest.raises(TypeError, match=f"^{name} must be an array, got None$"):
        call()


def test_rnn_bad_dtypes_raise_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="b must have the same dtype as w"):
        layouts.rnn_to_onnx(np.zeros((5, 2)), np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="kernel must be a floating-point"):
        layouts.rnn_from_keras(np.zeros((3, 2), int), np.zeros((2, 2)))


def test_rnn_converters_are_public():
    for framework in FRAMEWORKS:
        for direction in ("from", "to"):
            assert f"rnn_{direction}_{framework}" in layouts.__all__
            assert f"rnn_{direction}_{framework}" in dir(layouts)
