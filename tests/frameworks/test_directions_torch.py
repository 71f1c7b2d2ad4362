"""Conformance of ``reverse`` and ``batch_first`` (docs/spec.md §11.1, §11.2) with PyTorch's
bidirectional ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` on packed ragged batches, float64:
PyTorch's forward direction is a gradcells sequence, its reverse direction the same call
with ``reverse=True`` on the ``_reverse`` weights.

Per-step outputs (both halves of PyTorch's ``[·, ·, 2H]``), the final states of both
directions (PyTorch's ``h_n[0]``, ``h_n[1]``), and every gradient: the input's (the sum of
both directions'), the initial states' and every weight's, the weights converted by
``gc.layouts`` (so the converters are held to it too). Lengths include T and 1 (PyTorch's
packed sequences cannot hold a length of 0; ``test_directions.py`` covers it), in unsorted
order, and both layouts.
"""

import numpy as np
import pytest
from conftest import torch_leaf

import gradcells as gc
from gradcells import layouts

pytestmark = pytest.mark.conformance

BACKENDS = ["reference", "cpu"]
TOL = {"rtol": 1e-11, "atol": 1e-12}
CELLS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]


def _module(torch, cell, input_size, hidden, batch_first):
    kind, _, activation = cell.partition("_")
    make = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[kind]
    extra = {"nonlinearity": activation} if kind == "rnn" else {}
    return make(input_size, hidden, bidirectional=True, batch_first=batch_first,
                dtype=torch.float64, **extra)


def _converted(module, cell, suffix, grads=False):
    """The direction's weights (``suffix`` "" or "_reverse") in gradcells's layout; with
    ``grads``, the parameters' gradients converted the same way, the part of each bias
    pair that the converter sums zeroed in one of them (both hold the same gradient: the
    gradient of their sum, checked here)."""
    p = {n: getattr(module, f"{n}_l0{suffix}") for n in
         ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    p = {n: (t.grad if grads else t).detach().numpy().copy() for n, t in p.items()}
    kind = cell.split("_")[0]
    if grads:
        summed = slice(0, 2 * module.hidden_size) if kind == "gru" else slice(None)
        np.testing.assert_allclose(p["bias_ih"][summed], p["bias_hh"][summed], **TOL)
        p["bias_hh"][summed] = 0
    if kind == "lstm":
        return layouts.lstm_from_torch(*p.values())
    if kind == "gru":
        return layouts.gru_from_torch(*p.values())
    return layouts.rnn_from_torch(*p.values(), nonlinearity=cell.split("_")[1])


def _draw(rng, torch, cell, batch_first):
    steps, batch, input_size, hidden = 5, 4, 3, 4
    module = _module(torch, cell, input_size, hidden, batch_first)
    x = rng.standard_normal((batch, steps, input_size) if batch_first
                            else (steps, batch, input_size))
    lengths = np.array([2, 5, 1, 4])
    states = [rng.standard_normal((2, batch, hidden)) for _ in range(2 if cell == "lstm" else 1)]
    return module, x, lengths, states


def _run_torch(torch, module, x, lengths, states, batch_first, cotangents):
    """PyTorch's padded outputs and final states, after backpropagating ``cotangents``."""
    pack = torch.nn.utils.rnn.pack_padded_sequence
    packed = pack(x, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)
    out, finals = module(packed, tuple(states) if len(states) == 2 else states[0])
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=batch_first,
                                                    total_length=x.shape[1 if batch_first else 0])
    finals = finals if isinstance(finals, tuple) else (finals,)
    loss = sum((a * torch.from_numpy(c)).sum()
               for a, c in zip((out, *finals), cotangents, strict=True))
    loss.backward()
    return out.detach().numpy(), [f.detach().numpy() for f in finals]


def _gradcells(cell, module, x, lengths, states, batch_first, reverse, backend):
    """One direction in gradcells: its forward and the call that gives its gradient."""
    conv = _converted(module, cell, "_reverse" if reverse else "")
    d = 1 if reverse else 0
    initial = (states[1][d], states[0][d]) if cell == "lstm" else (states[0][d],)  # (cs, h)
    op = {"lstm": gc.lstm_sequence, "gru": gc.gru_sequence}.get(cell.split("_")[0],
                                                               gc.rnn_sequence)
    seq = op(x, *initial, *conv, **conv.options, seq_len=lengths, reverse=reverse,
             batch_first=batch_first, backend=backend)
    grad = getattr(gc, f"{op.__name__}_grad")

    def gradient(**upstream):
        return grad(x, *initial, *conv, seq, **upstream, backend=backend)

    return seq, gradient


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("batch_first", [False, True])
def test_bidirectional_torch_on_a_packed_ragged_batch(torch, rng, backend, cell, batch_first):
    module, x, lengths, states = _draw(rng, torch, cell, batch_first)
    x_t = torch_leaf(torch, x)
    states_t = [torch_leaf(torch, s) for s in states]
    hidden = module.hidden_size
    out_shape = x.shape[:2] + (2 * hidden,)
    cotangents = [rng.standard_normal(out_shape)] + [rng.standard_normal(s.shape)
                                                     for s in states]
    out, finals = _run_torch(torch, module, x_t, lengths, states_t, batch_first, cotangents)

    d_x = np.zeros_like(x)
    for d, reverse in enumerate((False, True)):
        seq, gradient = _gradcells(cell, module, x, lengths, states, batch_first, reverse,
                                   backend)
        half = slice(d * hidden, (d + 1) * hidden)
        np.testing.assert_allclose(seq.h, out[..., half], **TOL, err_msg=f"h, direction {d}")
        np.testing.assert_allclose(seq.h_final, finals[0][d], **TOL)
        upstream = {"d_h": cotangents[0][..., half], "d_h_final": cotangents[1][d]}
        if cell == "lstm":
            np.testing.assert_allclose(seq.cs_final, finals[1][d], **TOL)
            upstream["d_cs_final"] = cotangents[2][d]
        grads = gradient(**upstream)
        d_x += grads.x
        np.testing.assert_allclose(grads.h0, states_t[0].grad.numpy()[d], **TOL)
        if cell == "lstm":
            np.testing.assert_allclose(grads.cs0, states_t[1].grad.numpy()[d], **TOL)
        theirs = _converted(module, cell, "_reverse" if reverse else "", grads=True)
        ours = [getattr(grads, name) for name in type(grads)._fields[2 if cell != "lstm"
                                                                     else 3:][:len(theirs)]]
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            np.testing.assert_allclose(a, b, **TOL, err_msg=f"weight {k}, direction {d}")
    np.testing.assert_allclose(d_x, x_t.grad.numpy(), **TOL)
