"""Converted weights carry the framework's conventions (docs/spec.md §8, §10): a converted
set runs the framework's forward in one call with nothing left to remember."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc


def _torch_lstm(torch, input_size, hidden):
    torch.manual_seed(0)
    return torch.nn.LSTM(input_size, hidden, dtype=torch.float64)


def test_a_converted_torch_lstm_runs_torchs_forward_with_its_options_and_state_order():
    torch = pytest.importorskip("torch")
    module = _torch_lstm(torch, 3, 4)
    conv = gc.layouts.lstm_from_torch(*module.parameters())
    w, b = conv  # unpacks as before
    assert conv.framework == "torch" and conv.options == {"forget_bias": 0.0}
    assert conv.state_order == ("h", "c")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 3))
    h0, c0 = rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    with torch.no_grad():
        out, (h_n, c_n) = module(torch.from_numpy(x), (torch.from_numpy(h0)[None],
                                                       torch.from_numpy(c0)[None]))
    seq = gc.lstm_sequence(x, *conv.gradcells_states(h0, c0), *conv, **conv.options)
    np.testing.assert_allclose(seq.h, out.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(seq.cs_final, c_n[0].numpy(), rtol=1e-12, atol=1e-13)
    # What the conventions prevent: gradcells's default forget_bias and (h, c) as (cs, h).
    assert not np.allclose(gc.lstm_sequence(x, c0, h0, w, b).h, out.numpy(), atol=1e-3)
    assert not np.allclose(gc.lstm_sequence(x, h0, c0, w, b, forget_bias=0.0).h, out.numpy(),
                           atol=1e-3)


@pytest.mark.parametrize(("convert", "arrays", "framework", "options", "order"), [
    ("lstm_from_keras", [np.zeros((3, 8)), np.zeros((2, 8)), np.zeros(8)], "keras",
     {"forget_bias": 0.0}, ("h", "c")),
    ("lstm_from_onnx", [np.zeros((1, 8, 3)), np.zeros((1, 8, 2))], "onnx",
     {"forget_bias": 0.0}, ("h", "c")),
    ("lstm_from_tf_v2", [np.zeros((5, 8)), np.zeros(8)], "tf_v2", {"forget_bias": 0.0},
     ("c", "h")),
    ("gru_from_torch", [np.zeros((6, 3)), np.zeros((6, 2)), np.zeros(6), np.zeros(6)],
     "torch", {"reset_after": True}, ("h",)),
    ("gru_from_onnx", [np.zeros((1, 6, 3)), np.zeros((1, 6, 2))], "onnx",
     {"reset_after": False}, ("h",)),
])
def test_every_converter_states_its_conventions(convert, arrays, framework, options, order):
    conv = getattr(gc.layouts, convert)(*arrays)
    assert (conv.framework, conv.options, conv.state_order) == (framework, options, order)
    assert isinstance(conv, tuple) and all(isinstance(a, np.ndarray) for a in conv)
    states = [np.full((1, 2), k, float) for k in range(len(order))]
    mapped = conv.gradcells_states(*states)
    named = dict(zip(order, states, strict=True))
    assert mapped[-1] is named["h"] and (len(order) == 1 or mapped[0] is named["c"])
    with pytest.raises(TypeError, match=f"{framework} passes {len(order)} states"):
        conv.gradcells_states(*states, states[0])


def test_the_layouts_namespace_shows_only_its_public_names():
    assert set(dir(gc.layouts)) == set(gc.layouts.__all__)
    assert "np" not in dir(gc.layouts)
