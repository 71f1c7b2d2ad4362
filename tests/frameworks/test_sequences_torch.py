"""Conformance with ``torch.nn.LSTM`` and ``torch.nn.GRU`` (forward and every gradient),
in float64, with ragged lengths through ``pack_padded_sequence``.

The weights are converted inline: PyTorch's LSTM gates are (i, f, g, o) in the rows of
``weight_ih [4H, I]`` / ``weight_hh [4H, H]`` with two biases; gradcells's are the columns
(i, ci, f, o) of ``w [I+H, 4H]`` with one bias and ``forget_bias=0``. PyTorch's GRU is
(r, z, n) reset-after, z playing gradcells's u.
"""


import numpy as np
import pytest
from conftest import NUMPY_BACKENDS

import gradcells as gc

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.conformance

TORCH_TO_ICFO = [0, 2, 1, 3]  # torch block k of (i, f, g, o) -> gradcells block order


def to_numpy(t):
    return t.detach().numpy().copy()


def lstm_from_torch(module):
    """``(w, b)`` in gradcells's layout from an ``nn.LSTM`` (one layer)."""
    hidden = module.hidden_size

    def reorder(a):  # [4H, ...] in torch gate order -> gradcells gate order
        return np.concatenate([a[k * hidden:(k + 1) * hidden] for k in TORCH_TO_ICFO])

    w_ih, w_hh = to_numpy(module.weight_ih_l0), to_numpy(module.weight_hh_l0)
    bias = to_numpy(module.bias_ih_l0) + to_numpy(module.bias_hh_l0)
    return np.concatenate([reorder(w_ih).T, reorder(w_hh).T]), reorder(bias)


def lstm_grads_from_torch(module):
    """The gradients of an ``nn.LSTM``'s weights in gradcells's layout (``dw, db``)."""
    hidden = module.hidden_size

    def reorder(a):
        return np.concatenate([a[k * hidden:(k + 1) * hidden] for k in TORCH_TO_ICFO])

    grad = {name: to_numpy(p.grad) for name, p in module.named_parameters()}
    # Either bias's gradient is the gradient of their sum.
    np.testing.assert_allclose(grad["bias_ih_l0"], grad["bias_hh_l0"], rtol=1e-12)
    dw = np.concatenate([reorder(grad["weight_ih_l0"]).T, reorder(grad["weight_hh_l0"]).T])
    return dw, reorder(grad["bias_ih_l0"])


def gru_from_torch(module):
    """``(w_ru, w_c, b_ru, b_c)`` (reset-after) from an ``nn.GRU``; torch rows r, z, n."""
    hidden = module.hidden_size
    w_ih, w_hh = to_numpy(module.weight_ih_l0), to_numpy(module.weight_hh_l0)
    b_ih, b_hh = to_numpy(module.bias_ih_l0), to_numpy(module.bias_hh_l0)
    ru, n = slice(0, 2 * hidden), slice(2 * hidden, 3 * hidden)
    return (np.concatenate([w_ih[ru].T, w_hh[ru].T]), np.concatenate([w_ih[n].T, w_hh[n].T]),
            b_ih[ru] + b_hh[ru], np.concatenate([b_ih[n], b_hh[n]]))


def run_torch(module, x, states, lengths, d_out, d_finals):
    """Forward and backward through ``module`` on packed ``x``; returns the padded outputs,
    the final states, and the gradients of ``x`` and the initial states."""
    x_t = torch.tensor(x, requires_grad=True)
    states_t = [torch.tensor(s[None], requires_grad=True) for s in states]
    packed = torch.nn.utils.rnn.pack_padded_sequence(x_t, torch.tensor(lengths),
                                                     enforce_sorted=False)
    out, finals = module(packed, states_t[0] if len(states_t) == 1 else tuple(states_t))
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
    finals = (finals,) if len(states_t) == 1 else finals
    loss = (out * torch.tensor(d_out)).sum()
    loss = loss + sum((f[0] * torch.tensor(d)).sum() for f, d in zip(finals, d_finals, strict=True))
    loss.backward()
    return (to_numpy(out), [to_numpy(f[0]) for f in finals], to_numpy(x_t.grad),
            [to_numpy(s.grad[0]) for s in states_t])


def draw(rng, steps, batch, input_size, hidden):
    """Inputs, lengths (>= 1: PyTorch rejects empty rows) and upstream gradients."""
    lengths = rng.integers(1, steps + 1, size=batch)
    lengths[0] = steps
    return (rng.standard_normal((steps, batch, input_size)), lengths,
            rng.standard_normal((steps, batch, hidden)))


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("ragged", [False, True])
def test_lstm_matches_torch(backend, ragged):
    rng = np.random.default_rng(41)
    steps, batch, input_size, hidden = 5, 4, 3, 6
    torch.manual_seed(0)
    module = torch.nn.LSTM(input_size, hidden).double()
    x, lengths, d_h = draw(rng, steps, batch, input_size, hidden)
    if not ragged:
        lengths[:] = steps
    h0, c0 = 0.5 * rng.standard_normal((2, batch, hidden))
    d_h_final, d_cs_final = rng.standard_normal((2, batch, hidden))
    out, (h_n, c_n), dx, (dh0, dc0) = run_torch(module, x, (h0, c0), lengths, d_h,
                                                (d_h_final, d_cs_final))

    w, b = lstm_from_torch(module)
    seq_len = lengths.astype(np.int64)
    seq = gc.lstm_sequence(x, c0, h0, w, b, forget_bias=0.0, seq_len=seq_len, backend=backend)
    np.testing.assert_allclose(seq.h, out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(seq.h_final, h_n, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(seq.cs_final, c_n, rtol=1e-10, atol=1e-12)

    grads = gc.lstm_sequence_grad(x, c0, h0, w, b, seq, d_h=d_h, d_h_final=d_h_final,
                                  d_cs_final=d_cs_final, seq_len=seq_len, backend=backend)
    dw, db = lstm_grads_from_torch(module)
    for name, got, want in [("x", grads.x, dx), ("h0", grads.h0, dh0), ("cs0", grads.cs0, dc0),
                            ("w", grads.w, dw), ("b", grads.b, db)]:
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("ragged", [False, True])
def test_gru_matches_torch(backend, ragged):
    rng = np.random.default_rng(43)
    steps, batch, input_size, hidden = 5, 4, 3, 6
    torch.manual_seed(1)
    module = torch.nn.GRU(input_size, hidden).double()
    x, lengths, d_h = draw(rng, steps, batch, input_size, hidden)
    if not ragged:
        lengths[:] = steps
    h0 = 0.5 * rng.standard_normal((batch, hidden))
    d_h_final = rng.standard_normal((batch, hidden))
    out, (h_n,), dx, (dh0,) = run_torch(module, x, (h0,), lengths, d_h, (d_h_final,))

    w_ru, w_c, b_ru, b_c = gru_from_torch(module)
    seq_len = lengths.astype(np.int32)
    seq = gc.gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, reset_after=True, seq_len=seq_len,
                          backend=backend)
    np.testing.assert_allclose(seq.h, out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(seq.h_final, h_n, rtol=1e-10, atol=1e-12)

    grads = gc.gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, seq, d_h=d_h,
                                 d_h_final=d_h_final, reset_after=True, seq_len=seq_len,
                                 backend=backend)
    g = {name: to_numpy(p.grad) for name, p in module.named_parameters()}
    hidden_ru, hidden_n = slice(0, 2 * hidden), slice(2 * hidden, 3 * hidden)
    np.testing.assert_allclose(g["bias_ih_l0"][hidden_ru], g["bias_hh_l0"][hidden_ru],
                               rtol=1e-12)
    expected = {
        "x": dx, "h0": dh0,
        "w_ru": np.concatenate([g["weight_ih_l0"][hidden_ru].T, g["weight_hh_l0"][hidden_ru].T]),
        "w_c": np.concatenate([g["weight_ih_l0"][hidden_n].T, g["weight_hh_l0"][hidden_n].T]),
        "b_ru": g["bias_ih_l0"][hidden_ru],
        "b_c": np.concatenate([g["bias_ih_l0"][hidden_n], g["bias_hh_l0"][hidden_n]]),
    }
    for name, want in expected.items():
        np.testing.assert_allclose(getattr(grads, name), want, rtol=1e-9, atol=1e-11,
                                   err_msg=name)
