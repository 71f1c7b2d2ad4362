"""Conformance with PyTorch autograd (float64): the LSTM block cell, the GRU block cell (reset
before and after) and both over sequences with ragged lengths, written here in torch ops
straight from docs/spec.md §2-4, differentiated by autograd, against every gradient gradcells
returns on every NumPy backend (the default, the reference and, once built, the CPU one).

Clipping uses ``torch.clamp``, whose gradient passes at the boundary like gradcells's
(``clip_grad="exact"``); ``clip_grad="straight_through"`` is compared with the usual
``cs + (clamp(cs) - cs).detach()`` trick. Both sides evaluate the same float64 formulas in
different orders, so they agree to round-off: ``TOL`` is ~45 float64 ulps (1e-14 relative
plus 1e-14 absolute); the worst seen over 600 drawn examples was about 6 ulps.
"""


import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import (
    gru_cell_inputs,
    gru_sequence_inputs,
    lstm_cell_inputs,
    lstm_sequence_inputs,
)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.conformance

TOL = {"rtol": 1e-14, "atol": 1e-14}
STEP_FIELDS = ("i", "cs", "f", "o", "ci", "co", "h")
GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")


def backends(op):
    """None (the default for NumPy arrays), "reference", and "cpu" once it provides ``op``."""
    names = [None, "reference"]
    return names + (["cpu"] if "cpu" in NUMPY_BACKENDS else [])


def leaves(arrays):
    return [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]


def autograd(outputs, inputs, cotangents):
    """d<cotangents, outputs>/d inputs, as NumPy arrays (zeros for an unused input)."""
    grads = torch.autograd.grad(outputs, inputs, [torch.tensor(c) for c in cotangents],
                                allow_unused=True)
    return [np.zeros(tuple(a.shape)) if g is None else g.numpy()
            for a, g in zip(inputs, grads, strict=True)]


def close(actual, expected, what=""):
    np.testing.assert_allclose(actual, expected, err_msg=what, **TOL)


# -- the cells in torch ops -----------------------------------------------------------------------


def torch_lstm_cell(x, cs_prev, h_prev, w, b, wci=None, wcf=None, wco=None, *, forget_bias,
                    cell_clip, clip_grad):
    """docs/spec.md §2 in torch ops: gate blocks i, ci, f, o; the output peephole sees the
    clipped cs."""
    gi, gc_, gf, go = (torch.cat([x, h_prev], 1) @ w + b).chunk(4, 1)
    peephole = wci is not None
    i = torch.sigmoid(gi + cs_prev * wci if peephole else gi)
    ci = torch.tanh(gc_)
    f = torch.sigmoid(gf + forget_bias + cs_prev * wcf if peephole else gf + forget_bias)
    cs = i * ci + f * cs_prev
    if cell_clip is not None:
        clipped = torch.clamp(cs, -cell_clip, cell_clip)
        cs = clipped if clip_grad == "exact" else cs + (clipped - cs).detach()
    co = torch.tanh(cs)
    o = torch.sigmoid(go + cs * wco if peephole else go)
    return i, cs, f, o, ci, co, o * co


def torch_gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c, *, reset_after):
    """docs/spec.md §3 in torch ops, reset before the candidate matmul or (reset_after) after it."""
    n_in, n_hidden = x.shape[1], h_prev.shape[1]
    r, u = torch.sigmoid(torch.cat([x, h_prev], 1) @ w_ru + b_ru).chunk(2, 1)
    if reset_after:
        recurrent = h_prev @ w_c[n_in:] + b_c[n_hidden:]
        c = torch.tanh(x @ w_c[:n_in] + b_c[:n_hidden] + r * recurrent)
    else:
        c = torch.tanh(torch.cat([x, r * h_prev], 1) @ w_c + b_c)
    return r, u, c, u * h_prev + (1 - u) * c


# -- cells ----------------------------------------------------------------------------------------


@settings(max_examples=20)
@given(case=lstm_cell_inputs(), upstream=st.sampled_from(["both", "h", "cs"]),
       clip_grad=st.sampled_from(["exact", "straight_through"]), seed=st.integers(0, 2**16))
def test_lstm_cell(case, upstream, clip_grad, seed):
    peephole = case["wci"] is not None
    names = ("x", "cs_prev", "h_prev", "w", "b") + (PEEPHOLES if peephole else ())
    arrays = [case[k] for k in names]
    attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}
    rng = np.random.default_rng(seed)
    shape = case["cs_prev"].shape
    d_h = rng.standard_normal(shape) if upstream in ("both", "h") else None
    d_cs = rng.standard_normal(shape) if upstream in ("both", "cs") else None

    inputs = leaves(arrays)
    out = torch_lstm_cell(*inputs, **attrs, clip_grad=clip_grad)
    expected = autograd([out[1], out[6]], inputs,
                        [np.zeros(shape) if d is None else d for d in (d_cs, d_h)])
    peeps = {k: case[k] for k in PEEPHOLES}
    for backend in backends("lstm_cell"):
        state = gc.lstm_cell(*arrays[:5], **peeps, **attrs, backend=backend)
        for k, theirs in zip(STEP_FIELDS, out, strict=True):
            close(getattr(state, k), theirs.detach().numpy(), f"{backend} {k}")
        grads = gc.lstm_cell_grad(*arrays[:5], state, d_h=d_h, d_cs=d_cs, **peeps,
                                  cell_clip=case["cell_clip"], clip_grad=clip_grad,
                                  backend=backend)
        for k, theirs in zip(names, expected, strict=True):
            close(getattr(grads, k), theirs, f"{backend} d{k}")
        if not peephole:
            assert grads.wci is None and grads.wcf is None and grads.wco is None


@settings(max_examples=20)
@given(case=gru_cell_inputs(), seed=st.integers(0, 2**16))
def test_gru_cell(case, seed):
    arrays = [case[k] for k in GRU_ARGS]
    reset_after = case["reset_after"]
    d_h = np.random.default_rng(seed).standard_normal(case["h_prev"].shape)
    inputs = leaves(arrays)
    out = torch_gru_cell(*inputs, reset_after=reset_after)
    expected = autograd([out[3]], inputs, [d_h])
    for backend in backends("gru_cell"):
        state = gc.gru_cell(*arrays, reset_after=reset_after, backend=backend)
        for k, theirs in zip(("r", "u", "c", "h"), out, strict=True):
            close(getattr(state, k), theirs.detach().numpy(), f"{backend} {k}")
        grads = gc.gru_cell_grad(*arrays, state, d_h=d_h, reset_after=reset_after, backend=backend)
        for k, theirs in zip(GRU_ARGS, expected, strict=True):
            close(getattr(grads, k), theirs, f"{backend} d{k}")


# -- sequences: the cells in a torch loop with packed-sequence lengths ----------------------------


def lengths_mask(case, steps, batch):
    lengths = np.full(batch, steps) if case["seq_len"] is None else case["seq_len"]
    return torch.tensor(np.arange(steps)[:, None] < lengths)[:, :, None]


@settings(max_examples=15)
@given(case=lstm_sequence_inputs(), clip_grad=st.sampled_from(["exact", "straight_through"]),
       seed=st.integers(0, 2**16))
def test_lstm_sequence(case, clip_grad, seed):
    """BPTT over ragged lengths: a row past its length outputs zeros and keeps its state."""
    peephole = case["wci"] is not None
    names = ("x", "cs0", "h0", "w", "b") + (PEEPHOLES if peephole else ())
    arrays = [case[k] for k in names]
    attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}
    steps, batch = case["x"].shape[:2]
    running = lengths_mask(case, steps, batch)

    inputs = leaves(arrays)
    x, cs, h, w, b, *peeps = inputs
    outputs = {k: [] for k in STEP_FIELDS}
    for t in range(steps):
        state = torch_lstm_cell(x[t], cs, h, w, b, *peeps, **attrs, clip_grad=clip_grad)
        for k, value in zip(STEP_FIELDS, state, strict=True):
            outputs[k].append(torch.where(running[t], value, torch.zeros_like(value)))
        cs = torch.where(running[t], state[1], cs)
        h = torch.where(running[t], state[6], h)
    hidden = case["h0"].shape[1]
    stacked = {k: torch.stack(v) if v else torch.zeros(0, batch, hidden)
               for k, v in outputs.items()}

    rng = np.random.default_rng(seed)
    d = {"d_h": rng.standard_normal((steps, batch, hidden)),
         "d_cs": rng.standard_normal((steps, batch, hidden)),
         "d_h_final": rng.standard_normal((batch, hidden)),
         "d_cs_final": rng.standard_normal((batch, hidden))}
    expected = autograd([stacked["h"], stacked["cs"], h, cs], inputs,
                        [d["d_h"], d["d_cs"], d["d_h_final"], d["d_cs_final"]])
    peep_kw = {k: case[k] for k in PEEPHOLES}
    for backend in backends("lstm_sequence"):
        seq = gc.lstm_sequence(*arrays[:5], **peep_kw, **attrs, seq_len=case["seq_len"],
                               backend=backend)
        for k in STEP_FIELDS:
            close(getattr(seq, k), stacked[k].detach().numpy(), f"{backend} {k}")
        close(seq.h_final, h.detach().numpy(), f"{backend} h_final")
        close(seq.cs_final, cs.detach().numpy(), f"{backend} cs_final")
        grads = gc.lstm_sequence_grad(*arrays[:5], seq, **d, **peep_kw,
                                      cell_clip=case["cell_clip"], clip_grad=clip_grad,
                                      seq_len=case["seq_len"], backend=backend)
        for k, theirs in zip(names, expected, strict=True):
            close(getattr(grads, k), theirs, f"{backend} d{k}")


@settings(max_examples=15)
@given(case=gru_sequence_inputs(), seed=st.integers(0, 2**16))
def test_gru_sequence(case, seed):
    names = ("x", "h0", "w_ru", "w_c", "b_ru", "b_c")
    arrays = [case[k] for k in names]
    reset_after = case["reset_after"]
    steps, batch = case["x"].shape[:2]
    hidden = case["h0"].shape[1]
    running = lengths_mask(case, steps, batch)

    inputs = leaves(arrays)
    x, h, *weights = inputs
    outputs = {k: [] for k in ("r", "u", "c", "h")}
    for t in range(steps):
        state = torch_gru_cell(x[t], h, *weights, reset_after=reset_after)
        for k, value in zip(outputs, state, strict=True):
            outputs[k].append(torch.where(running[t], value, torch.zeros_like(value)))
        h = torch.where(running[t], state[3], h)
    stacked = {k: torch.stack(v) for k, v in outputs.items()}

    rng = np.random.default_rng(seed)
    d_h = rng.standard_normal((steps, batch, hidden))
    d_h_final = rng.standard_normal((batch, hidden))
    expected = autograd([stacked["h"], h], inputs, [d_h, d_h_final])
    for backend in backends("gru_sequence"):
        seq = gc.gru_sequence(*arrays, reset_after=reset_after, seq_len=case["seq_len"],
                              backend=backend)
        for k in outputs:
            close(getattr(seq, k), stacked[k].detach().numpy(), f"{backend} {k}")
        close(seq.h_final, h.detach().numpy(), f"{backend} h_final")
        grads = gc.gru_sequence_grad(*arrays, seq, d_h=d_h, d_h_final=d_h_final,
                                     reset_after=reset_after, seq_len=case["seq_len"],
                                     backend=backend)
        for k, theirs in zip(names, expected, strict=True):
            close(getattr(grads, k), theirs, f"{backend} d{k}")
