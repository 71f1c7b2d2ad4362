"""Conformance of the LSTM projection (docs/spec.md §9.1) with PyTorch's
``nn.LSTM(proj_size=P)`` (one layer, one direction), in float64: per-step outputs on full
and packed ragged batches (zero past a row's length), the final ``(h, c)`` in PyTorch's
order, and every autograd gradient (``weight_ih, weight_hh, bias_ih, bias_hh, weight_hr``,
``x, h0, c0``) against ``gc.lstm_sequence_grad``.

The weights travel through ``gc.layouts.lstm_from_torch`` / ``lstm_to_torch`` (``w_proj =
weight_hrᵀ`` rides in ``conv.options``), so these tests check the converters too. The
tolerances are those of the LSTM sequence conformance test
(tests/frameworks/test_sequences_torch.py).
TensorFlow 1's ``LSTMCell(num_proj, proj_clip)``, written out with TensorFlow's ops, checks
that ``clip_by_value``'s gradient is gradcells's exact projection-clip gradient. Each test
skips when its framework is not installed.
"""

import numpy as np
import pytest
from conftest import torch_leaf
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells import layouts

pytestmark = pytest.mark.conformance

BACKENDS = ["reference", "cpu"]      # "cpu" fails until the CPU backend has the projection
FORWARD_TOL = {"rtol": 1e-10, "atol": 1e-12}
GRAD_TOL = {"rtol": 1e-9, "atol": 1e-11}


def close(actual, expected, what="", tol=GRAD_TOL):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), err_msg=what, **tol)


def _run_torch(torch, module, x, h0, c0, lengths):
    """The module's padded per-step outputs and final ``(h, c)`` (batch of states, no layer
    axis), through ``pack_padded_sequence`` when ``lengths`` is given."""
    states = (h0[None], c0[None])
    if lengths is None:
        out, (h_n, c_n) = module(x, states)
    else:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.from_numpy(lengths),
                                                         enforce_sorted=False)
        out, (h_n, c_n) = module(packed, states)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
    return out, h_n[0], c_n[0]


def _torch_parameter_grads(module):
    """gradcells ``(dw, db, dw_proj)`` from the module's parameter gradients: ``dw`` and
    ``dw_proj`` by the same converter as the weights, ``db`` from either bias (PyTorch's two
    biases receive the same gradient)."""
    g = [p.grad.numpy() for p in module.parameters()]
    close(g[2], g[3], "bias_ih and bias_hh gradients")
    conv = layouts.lstm_from_torch(g[0], g[1], g[2], None, g[4])
    return conv[0], conv[1], conv.options["w_proj"]


def _check_proj_lstm(torch, backend, seed, steps, batch, input_size, hidden, proj, packed):
    rng = np.random.default_rng(seed)
    module = torch.nn.LSTM(input_size, hidden, proj_size=proj, dtype=torch.float64)
    conv = layouts.lstm_from_torch(*module.parameters())
    assert set(conv.options) == {"forget_bias", "w_proj"} and conv.options["forget_bias"] == 0
    lengths = rng.integers(1, steps + 1, batch) if packed else None
    if packed:
        lengths[rng.integers(batch)] = steps
    x = torch_leaf(torch, rng.standard_normal((steps, batch, input_size)))
    h0 = torch_leaf(torch, rng.standard_normal((batch, proj)))
    c0 = torch_leaf(torch, rng.standard_normal((batch, hidden)))
    d_h = rng.standard_normal((steps, batch, proj))
    d_h_final = rng.standard_normal((batch, proj))
    d_c_final = rng.standard_normal((batch, hidden))
    out, h_n, c_n = _run_torch(torch, module, x, h0, c0, lengths)
    ((out * torch.from_numpy(d_h)).sum() + (h_n * torch.from_numpy(d_h_final)).sum()
     + (c_n * torch.from_numpy(d_c_final)).sum()).backward()

    x_np = x.detach().numpy()
    states = conv.gradcells_states(h0.detach().numpy(), c0.detach().numpy())
    seq = gc.lstm_sequence(x_np, *states, *conv, **conv.options, seq_len=lengths,
                           backend=backend)
    assert seq.settings.projection and seq.settings.proj_clip is None
    close(seq.h, out.detach().numpy(), "h", FORWARD_TOL)
    close(seq.h_final, h_n.detach().numpy(), "h_final", FORWARD_TOL)
    close(seq.cs_final, c_n.detach().numpy(), "c_final", FORWARD_TOL)
    if packed:
        past = np.arange(steps)[:, None] >= lengths[None, :]
        assert not seq.h[past].any()
    grads = gc.lstm_sequence_grad(x_np, *states, *conv, seq, d_h=d_h, d_h_final=d_h_final,
                                  d_cs_final=d_c_final, w_proj=conv.options["w_proj"],
                                  backend=backend)
    dw, db, dw_proj = _torch_parameter_grads(module)
    expected = {"x": x.grad.numpy(), "h0": h0.grad.numpy(), "cs0": c0.grad.numpy(),
                "w": dw, "b": db, "w_proj": dw_proj}
    for k, theirs in expected.items():
        close(getattr(grads, k), theirs, f"d{k}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("hidden, proj", [(6, 3), (5, 1), (2, 1)])
def test_torch_proj_lstm_forward_and_every_gradient(torch, backend, packed, hidden, proj):
    _check_proj_lstm(torch, backend, 7, 5, 4, 3, hidden, proj, packed)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 5), batch=st.integers(1, 4),
       input_size=st.integers(1, 4), hidden=st.integers(2, 5), data=st.data(),
       packed=st.booleans())
def test_torch_proj_lstm_over_drawn_sizes(torch, backend, seed, steps, batch, input_size,
                                          hidden, data, packed):
    """Sizes drawn by Hypothesis, P < H always (PyTorch requires it), P = 1 included."""
    proj = data.draw(st.integers(1, hidden - 1), label="proj")
    _check_proj_lstm(torch, backend, seed, steps, batch, input_size, hidden, proj, packed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_conventions_matter(torch, rng, backend):
    """Without ``**conv.options`` the result is not PyTorch's: gradcells's default
    ``forget_bias=1.0`` changes it, and the projection cannot be left out (``h0 [B, P]`` and
    ``w [I+P, 4H]`` do not fit an LSTM without one)."""
    steps, batch, input_size, hidden, proj = 4, 3, 2, 5, 2
    module = torch.nn.LSTM(input_size, hidden, proj_size=proj, dtype=torch.float64)
    conv = layouts.lstm_from_torch(*module.parameters())
    x = rng.standard_normal((steps, batch, input_size))
    h0, c0 = rng.standard_normal((batch, proj)), rng.standard_normal((batch, hidden))
    with torch.no_grad():
        out, _ = module(torch.from_numpy(x), (torch.from_numpy(h0[None]),
                                              torch.from_numpy(c0[None])))
    out = out.numpy()
    states = conv.gradcells_states(h0, c0)
    right = gc.lstm_sequence(x, *states, *conv, **conv.options, backend=backend)
    close(right.h, out, "h", FORWARD_TOL)
    wrong = gc.lstm_sequence(x, *states, *conv, w_proj=conv.options["w_proj"], backend=backend)
    assert np.abs(wrong.h - out).max() > 1e-3
    with pytest.raises(ValueError):
        gc.lstm_sequence(x, *states, *conv, forget_bias=0.0, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hidden, proj", [(5, 2), (3, 1)])
def test_torch_runs_weights_converted_to_torch(torch, rng, backend, hidden, proj):
    """The other direction: gradcells weights with a projection set into
    ``nn.LSTM(proj_size=P)`` by ``lstm_to_torch`` and ``load_state_dict``."""
    steps, batch, input_size = 4, 3, 2
    w = 0.5 * rng.standard_normal((input_size + proj, 4 * hidden))
    b = 0.5 * rng.standard_normal(4 * hidden)
    w_proj = 0.5 * rng.standard_normal((hidden, proj))
    arrays = layouts.lstm_to_torch(w, b, w_proj)
    module = torch.nn.LSTM(input_size, hidden, proj_size=proj, dtype=torch.float64)
    names = [name for name, _ in module.named_parameters()]
    assert names == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                     "weight_hr_l0"]
    module.load_state_dict({n: torch.from_numpy(a) for n, a in zip(names, arrays, strict=True)})
    x = rng.standard_normal((steps, batch, input_size))
    h0, c0 = rng.standard_normal((batch, proj)), rng.standard_normal((batch, hidden))
    with torch.no_grad():
        out, (h_n, c_n) = module(torch.from_numpy(x), (torch.from_numpy(h0[None]),
                                                       torch.from_numpy(c0[None])))
    seq = gc.lstm_sequence(x, c0, h0, w, b, forget_bias=0.0, w_proj=w_proj, backend=backend)
    close(seq.h, out.numpy(), "h", FORWARD_TOL)
    close(seq.h_final, h_n[0].numpy(), "h_final", FORWARD_TOL)
    close(seq.cs_final, c_n[0].numpy(), "c_final", FORWARD_TOL)
    back = layouts.lstm_from_torch(*module.parameters())
    np.testing.assert_array_equal(back[0], w)
    np.testing.assert_array_equal(back[1], b)
    np.testing.assert_array_equal(back.options["w_proj"], w_proj)


# ---------------------------------------------------------------------------------------------
# TensorFlow 1's LSTMCell(num_proj, proj_clip)
#
# Its class is gone under Keras 3, so the cell is written out with TensorFlow's ops as
# LSTMCell.call has it (kernel on [x, h], gates i, j, f, o, forget_bias added to f, then
# m·w_proj and clip_by_value): what is tested is that clip_by_value's gradient is
# gradcells's exact one, and not the straight-through one.


def _tf1_lstmp_cell(tf, x, c_prev, h_prev, w, b, w_proj, forget_bias, proj_clip):
    i, j, f, o = tf.split(tf.matmul(tf.concat([x, h_prev], axis=1), w) + b, 4, axis=1)
    c = tf.sigmoid(f + forget_bias) * c_prev + tf.sigmoid(i) * tf.tanh(j)
    m = tf.sigmoid(o) * tf.tanh(c)
    return c, tf.clip_by_value(tf.matmul(m, w_proj), -proj_clip, proj_clip)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hidden, proj", [(5, 2), (3, 4)])
def test_tf1_proj_clip_gradient_is_the_exact_one(rng, backend, hidden, proj):
    tf = pytest.importorskip("tensorflow")
    case = gc.testing.lstm_cell_case(rng, hidden=hidden, proj_size=proj, proj_clip=True)
    d_h = rng.standard_normal(case["h_prev"].shape)
    d_cs = rng.standard_normal(case["cs_prev"].shape)
    names = ("x", "cs_prev", "h_prev", "w", "b", "w_proj")
    leaves = [tf.Variable(case[k]) for k in names]
    with tf.GradientTape() as tape:
        c, h = _tf1_lstmp_cell(tf, *leaves, case["forget_bias"], case["proj_clip"])
        loss = tf.reduce_sum(h * d_h) + tf.reduce_sum(c * d_cs)
    theirs = tape.gradient(loss, leaves)

    state = gc.lstm_cell(**case, backend=backend)
    close(state.h, h.numpy(), "h", FORWARD_TOL)
    close(state.cs, c.numpy(), "cs", FORWARD_TOL)
    clipped = np.abs((state.o * state.co) @ case["w_proj"]) > case["proj_clip"]
    assert clipped.any() and not clipped.all()
    arrays = {k: case[k] for k in names}
    grads = gc.lstm_cell_grad(**arrays, state=state, d_h=d_h, d_cs=d_cs, backend=backend)
    for k, t in zip(names, theirs, strict=True):
        close(getattr(grads, k), t.numpy(), f"d{k}")
    straight = gc.lstm_cell_grad(**arrays, state=state, d_h=d_h, d_cs=d_cs,
                                 clip_grad="straight_through", backend=backend)
    assert np.abs(straight.w_proj - theirs[5].numpy()).max() > 1e-6
