"""Sequence forward + backpropagation through time, float32, side by side in one process.

    python benchmarks/sequences.py                    # LSTM and GRU, the issue's three sizes
    python benchmarks/sequences.py --sizes 50,32,128,128 --cells lstm --repeats 9
    python benchmarks/sequences.py --sizes 50,32,128,128 --cells rnn   # the plain (tanh) RNN
    python benchmarks/sequences.py --sizes 50,32,128,128 --cells lstm-proj   # P = H/2
    python benchmarks/sequences.py --sizes 50,32,128,128 --cells lstm-ln     # layer norm

Contestants, each doing one forward over all T steps and the full backward from an upstream
gradient on every step's h (gradients for x, the initial states and all weights):

- ``gradcells cpu``: ``gc.lstm_sequence`` + ``gc.lstm_sequence_grad`` (``backend="cpu"``);
  GRU with ``reset_after=True`` (PyTorch's variant) and ``False`` (TensorFlow's); the plain
  RNN with ``activation="tanh"``;
- ``gradcells reference``: the same on the reference backend;
- ``lstm-proj``: the LSTM with a projection ``w_proj [H, P]``, P = H/2 (``gradcells cpu``
  and ``torch nn.LSTM(proj_size=P)``; its BLAS bound adds the projection's matmuls);
- ``lstm-ln``: the layer-normalised LSTM (docs/spec.md §9.2, ``ln_carry="raw"``) on
  ``gradcells cpu`` and ``gradcells reference``, against ``torch LN-LSTM``: what PyTorch
  users write today, torch ops under autograd (``torch_ln_lstm``: per step
  ``F.layer_norm`` of ``x_t·W_x`` and of ``h·W_h``, the gates and ``F.layer_norm`` of the
  cell state; the ratios are taken against it), ``torch LN-LSTM, x hoisted`` (the input
  part for all steps at once: a faster peer), and against its own BLAS bound, which adds
  the gradient's recompute of ``x·W_x`` and ``h_prev·W_h`` (one matmul each over all
  steps);
- ``torch nn.LSTM`` / ``torch nn.GRU`` / ``torch nn.RNN`` (tanh): forward and ``backward``
  (x, h0, c0 require grad);
- ``tf BlockLSTM``: ``tf.raw_ops.BlockLSTM`` under ``tf.GradientTape`` in a ``tf.function``;
- ``BLAS bound``: only the matmuls of gradcells's plan (same shapes, same ``np.matmul``
  calls with ``out=``, the same C-contiguous copies of the recurrent weights' transposes
  made once per call for the backward's per-step products), no elementwise work: the floor
  the fused kernels are measured against.

Every library is limited to ``--threads`` threads (default 1: the figures then compare
implementations, not thread scheduling on a shared machine). Rounds are interleaved (each
round runs every contestant once) and the table shows medians over ``--repeats`` rounds and
each median's ratio to the peers (the minimum is shown too: on a shared machine the spread
between the two says how much the figures were disturbed), and the median's FLOP rate: the
model's matmuls (``model_flops``) over it, and its fraction of the peak, the rate of one
large matmul with the same threads, measured first (``_harness.matmul_peak``; its size
``--peak-size``). The first lines name the CPU (model, Numba's name, vector ISA).

Peak memory is the ``tracemalloc`` high-water mark of one forward + backward (NumPy
reports its buffers to tracemalloc), in MiB and in units of one ``[T, B, H]`` float32 array
("TBH"); the inputs are allocated before the measurement starts, and the CPU backend's
per-thread scratch buffer (kept between calls, ``gradcells.cpu.release_scratch``) is released
first, so that it counts.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from gradcells.cpu import release_scratch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (  # noqa: E402
    describe_machine,
    describe_peak,
    flop_rate,
    gate_flops,
    limit_threads,
    matmul_peak,
    peak_mib,
    pin_peer_threads,
    ratio,
    summarize,
    table,
    time_interleaved,
)

SIZES = [(50, 32, 128, 128), (100, 32, 256, 256), (100, 64, 512, 512)]
DTYPE = np.float32
GATES = {"lstm": 4, "lstm-ln": 4, "gru": 3, "rnn": 1}   # each gate a [I+H, H] block of w


def model_flops(cell, size):
    """The FLOPs of the model's matmuls over one forward and its full backward
    (``_harness.gate_flops``): the LSTM's 24, the GRU's 18 and the RNN's 6 ·T·B·(I+H)·H,
    and for a projection to P = H/2 (whose state is then P wide) ``m·w_proj`` too. What a
    plan computes again (the GRU's ``h_prev·W_ch``, the layer norm's inputs) is not
    counted: the rate is of the model's work."""
    steps, batch, n_in, hidden = size
    rows = steps * batch
    if cell == "lstm-proj":
        proj = hidden // 2
        return gate_flops(rows, n_in, proj, 4 * hidden) + gate_flops(rows, hidden, 0, proj)
    return gate_flops(rows, n_in, hidden, GATES[cell] * hidden)


# -- inputs -----------------------------------------------------------------------------------


def lstm_inputs(steps, batch, n_in, hidden, seed=0):
    rng = np.random.default_rng(seed)
    scale = float(1.0 / np.sqrt(n_in + hidden))
    return {
        "x": rng.standard_normal((steps, batch, n_in), dtype=DTYPE),
        "cs0": rng.standard_normal((batch, hidden), dtype=DTYPE),
        "h0": 0.5 * rng.standard_normal((batch, hidden), dtype=DTYPE),
        "w": scale * rng.standard_normal((n_in + hidden, 4 * hidden), dtype=DTYPE),
        "b": 0.1 * rng.standard_normal(4 * hidden, dtype=DTYPE),
        "d_h": rng.standard_normal((steps, batch, hidden), dtype=DTYPE),
    }


def lstm_proj_inputs(steps, batch, n_in, hidden, seed=0):
    """``lstm_inputs`` with a projection ``w_proj [H, P]``, P = H/2: h0, d_h and w's h rows
    are P wide."""
    rng = np.random.default_rng(seed)
    proj = max(1, hidden // 2)
    a = lstm_inputs(steps, batch, n_in, hidden, seed)
    scale = float(1.0 / np.sqrt(n_in + proj))
    a["h0"] = 0.5 * rng.standard_normal((batch, proj), dtype=DTYPE)
    a["w"] = scale * rng.standard_normal((n_in + proj, 4 * hidden), dtype=DTYPE)
    a["w_proj"] = float(1.0 / np.sqrt(hidden)) * rng.standard_normal((hidden, proj),
                                                                      dtype=DTYPE)
    a["d_h"] = rng.standard_normal((steps, batch, proj), dtype=DTYPE)
    return a


def lstm_ln_inputs(steps, batch, n_in, hidden, seed=0):
    """``lstm_inputs`` with a layer norm's six parameters: gains ``1 + 0.1·N(0, 1)``, shifts
    ``0.1·N(0, 1)`` (``[4H]`` for the gate norms, ``[H]`` for the cell's)."""
    rng = np.random.default_rng(seed + 1)
    a = lstm_inputs(steps, batch, n_in, hidden, seed)
    for name, width in (("x", 4 * hidden), ("h", 4 * hidden), ("c", hidden)):
        a[f"gamma_{name}"] = (1 + 0.1 * rng.standard_normal(width)).astype(DTYPE)
        a[f"beta_{name}"] = 0.1 * rng.standard_normal(width, dtype=DTYPE)
    return a


LN_ARRAYS = tuple(f"{kind}_{name}" for name in "xhc" for kind in ("gamma", "beta"))


def rnn_inputs(steps, batch, n_in, hidden, seed=0):
    rng = np.random.default_rng(seed)
    scale = float(1.0 / np.sqrt(n_in + hidden))
    return {
        "x": rng.standard_normal((steps, batch, n_in), dtype=DTYPE),
        "h0": 0.5 * rng.standard_normal((batch, hidden), dtype=DTYPE),
        "w": scale * rng.standard_normal((n_in + hidden, hidden), dtype=DTYPE),
        "b": 0.1 * rng.standard_normal(hidden, dtype=DTYPE),
        "d_h": rng.standard_normal((steps, batch, hidden), dtype=DTYPE),
    }


def gru_inputs(steps, batch, n_in, hidden, reset_after, seed=0):
    rng = np.random.default_rng(seed)
    scale = float(1.0 / np.sqrt(n_in + hidden))
    return {
        "x": rng.standard_normal((steps, batch, n_in), dtype=DTYPE),
        "h0": 0.5 * rng.standard_normal((batch, hidden), dtype=DTYPE),
        "w_ru": scale * rng.standard_normal((n_in + hidden, 2 * hidden), dtype=DTYPE),
        "w_c": scale * rng.standard_normal((n_in + hidden, hidden), dtype=DTYPE),
        "b_ru": 0.1 * rng.standard_normal(2 * hidden, dtype=DTYPE),
        "b_c": 0.1 * rng.standard_normal((2 if reset_after else 1) * hidden, dtype=DTYPE),
        "d_h": rng.standard_normal((steps, batch, hidden), dtype=DTYPE),
    }


# -- contestants: each returns a zero-argument callable doing forward + backward --------------


def gradcells_lstm(backend, size):
    import gradcells as gc

    a = lstm_inputs(*size)
    args = (a["x"], a["cs0"], a["h0"], a["w"], a["b"])

    def run():
        seq = gc.lstm_sequence(*args, backend=backend)
        return gc.lstm_sequence_grad(*args, seq, d_h=a["d_h"], backend=backend)

    return run


def gradcells_lstm_proj(backend, size):
    import gradcells as gc

    a = lstm_proj_inputs(*size)
    args = (a["x"], a["cs0"], a["h0"], a["w"], a["b"])

    def run():
        seq = gc.lstm_sequence(*args, w_proj=a["w_proj"], backend=backend)
        return gc.lstm_sequence_grad(*args, seq, d_h=a["d_h"], w_proj=a["w_proj"],
                                     backend=backend)

    return run


def gradcells_lstm_ln(backend, size):
    import gradcells as gc

    a = lstm_ln_inputs(*size)
    args = (a["x"], a["cs0"], a["h0"], a["w"], a["b"])
    norm = gc.LSTMNorm(*(a[name] for name in LN_ARRAYS))

    def run():
        seq = gc.lstm_sequence(*args, layer_norm=norm, backend=backend)
        return gc.lstm_sequence_grad(*args, seq, d_h=a["d_h"], layer_norm=norm,
                                     backend=backend)

    return run


def gradcells_gru(backend, size, reset_after):
    import gradcells as gc

    a = gru_inputs(*size, reset_after=reset_after)
    args = (a["x"], a["h0"], a["w_ru"], a["w_c"], a["b_ru"], a["b_c"])

    def run():
        seq = gc.gru_sequence(*args, reset_after=reset_after, backend=backend)
        return gc.gru_sequence_grad(*args, seq, d_h=a["d_h"], reset_after=reset_after,
                                    backend=backend)

    return run


def gradcells_rnn(backend, size):
    import gradcells as gc

    a = rnn_inputs(*size)
    args = (a["x"], a["h0"], a["w"], a["b"])

    def run():
        seq = gc.rnn_sequence(*args, activation="tanh", backend=backend)
        return gc.rnn_sequence_grad(*args, seq, d_h=a["d_h"], backend=backend)

    return run


def torch_rnn(kind, size, proj=False):
    import torch

    steps, batch, n_in, hidden = size
    torch.manual_seed(0)
    extra = {"proj_size": max(1, hidden // 2)} if proj else {}
    module = getattr(torch.nn, kind)(n_in, hidden, **extra)
    a = (lstm_proj_inputs if proj else lstm_inputs)(*size)
    x = torch.tensor(a["x"], requires_grad=True)
    h0 = torch.tensor(a["h0"][None], requires_grad=True)
    c0 = torch.tensor(a["cs0"][None], requires_grad=True)
    d_h = torch.tensor(a["d_h"])

    def run():
        module.zero_grad(set_to_none=True)
        x.grad = h0.grad = c0.grad = None
        out, _ = module(x, (h0, c0) if kind == "LSTM" else h0)
        out.backward(d_h)
        return x.grad

    return run


def torch_ln_lstm(size, hoisted=False):
    """The layer-normalised LSTM as PyTorch users write it, torch ops under autograd (the
    model of ``gradcells_lstm_ln``: gate blocks i, ci, f, o, forget bias 1, the bias ``b``
    beside the norms' shifts, ``ln_carry="raw"``): per step ``F.layer_norm`` of ``x_t·W_x``
    and of ``h·W_h``, the gates, ``F.layer_norm`` of the cell state, as PyTorch's own
    ``benchmarks/fastrnns/custom_lstms.py`` ``LayerNormLSTMCell`` does. ``hoisted``: the
    input part's matmul and norm for all steps at once before the loop instead (fewer,
    larger ops: a faster peer)."""
    import torch
    import torch.nn.functional as F

    steps, batch, n_in, hidden = size
    a = lstm_ln_inputs(*size)
    leaf = {k: torch.tensor(v, requires_grad=k != "d_h") for k, v in a.items()}
    gates, cells = (4 * hidden,), (hidden,)

    def input_part(x, w_x):
        return F.layer_norm(x @ w_x, gates, leaf["gamma_x"], leaf["beta_x"]) + leaf["b"]

    def run():
        for value in leaf.values():
            value.grad = None
        w_x, w_h = leaf["w"][:n_in], leaf["w"][n_in:]
        # unbind, not z_x[t]: each indexing's backward would add a zero [T, B, 4H] tensor
        z_x = input_part(leaf["x"], w_x).unbind(0) if hoisted else None
        h, c, out = leaf["h0"], leaf["cs0"], []
        for t in range(steps):
            g = ((z_x[t] if hoisted else input_part(leaf["x"][t], w_x))
                 + F.layer_norm(h @ w_h, gates, leaf["gamma_h"], leaf["beta_h"]))
            i, ci, f, o = g.chunk(4, 1)
            c = torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(ci)
            h = torch.sigmoid(o) * torch.tanh(F.layer_norm(c, cells, leaf["gamma_c"],
                                                           leaf["beta_c"]))
            out.append(h)
        torch.stack(out).backward(leaf["d_h"])
        return leaf["x"].grad

    return run


def tf_block_lstm(size):
    import tensorflow as tf

    steps, batch, n_in, hidden = size
    a = {k: tf.constant(v) for k, v in lstm_inputs(*size).items()}
    zeros = tf.zeros(hidden, DTYPE)
    seq_len_max = tf.constant(steps, tf.int64)

    @tf.function
    def forward_backward(x, cs0, h0, w, b, d_h):
        with tf.GradientTape() as tape:
            tape.watch([x, cs0, h0, w, b])
            outputs = tf.raw_ops.BlockLSTM(
                seq_len_max=seq_len_max, x=x, cs_prev=cs0, h_prev=h0, w=w, wci=zeros,
                wcf=zeros, wco=zeros, b=b, forget_bias=1.0, cell_clip=0.0, use_peephole=False)
            loss = tf.reduce_sum(outputs[6] * d_h)
        return tape.gradient(loss, [x, cs0, h0, w, b])

    def run():
        return [g.numpy() for g in forward_backward(a["x"], a["cs0"], a["h0"], a["w"], a["b"],
                                                    a["d_h"])]

    return run


def blas_bound_lstm(size):
    """The matmuls of gradcells's LSTM plan and nothing else (see the module docstring)."""
    return _matmul_plan(lstm_inputs(*size), size, 4 * size[3])


def blas_bound_lstm_ln(size):
    """The matmuls of gradcells's layer-normalised LSTM plan (``gradcells/cells/lstm/cpu.py``):
    the LSTM's, and before the backward loop the recompute of ``x·W_x`` and ``h_prev·W_h``
    for every step (the ``ẑ`` and ``r`` of the gate norms; three matmuls)."""
    return _matmul_plan(lstm_ln_inputs(*size), size, 4 * size[3], recompute=True)


def _matmul_plan(a, size, width, recompute=False):
    """The matmul plan of a cell whose pre-activations are ``width`` wide and whose state
    is H wide (the LSTM's 4H, the plain RNN's H): the input projection, one ``h·W_h`` per
    step forward and one ``dZ_t·W_hᵀ`` back, then ``dx`` and the two weight products;
    with ``recompute`` also ``x·W_x`` and ``h_prev·W_h`` of every step again before the
    backward loop."""
    steps, batch, n_in, hidden = size
    w_x, w_h = a["w"][:n_in], a["w"][n_in:]
    flat = steps * batch
    x_flat = a["x"].reshape(flat, n_in)
    h_steps = np.zeros((steps, batch, hidden), DTYPE)
    h_flat = h_steps.reshape(flat, hidden)
    gates = np.empty((flat, width), DTYPE)
    h_gates = np.empty((batch, width), DTYPE)
    d_gates = np.random.default_rng(1).standard_normal((steps, batch, width), dtype=DTYPE)
    d_flat = d_gates.reshape(flat, width)
    dh_prev = np.empty((batch, hidden), DTYPE)
    dx = np.empty((flat, n_in), DTYPE)
    dw = np.empty((n_in + hidden, width), DTYPE)
    first = (steps - 1) * batch

    again = np.empty((flat, width), DTYPE) if recompute else None

    def run():
        np.matmul(x_flat, w_x, out=gates)
        h = a["h0"]
        for t in range(steps):
            np.matmul(h, w_h, out=h_gates)
            h = h_steps[t]
        if recompute:
            np.matmul(x_flat, w_x, out=gates)
            np.matmul(a["h0"], w_h, out=again[:batch])
            np.matmul(h_flat[:first], w_h, out=again[batch:])
        w_h_t = np.ascontiguousarray(w_h.T)
        for t in reversed(range(steps)):
            np.matmul(d_gates[t], w_h_t, out=dh_prev)
        np.matmul(d_flat, w_x.T, out=dx)
        np.matmul(x_flat.T, d_flat, out=dw[:n_in])
        np.matmul(h_flat[:first].T, d_flat[batch:], out=dw[n_in:])
        dw[n_in:] += a["h0"].T @ d_gates[0]
        return dw

    return run


def blas_bound_lstm_proj(size):
    """The matmuls of gradcells's LSTM plan with a projection (``gradcells/cells/lstm/cpu.py``):
    per step also ``m·w_proj`` forward and ``dh·w_projᵀ`` backward, and ``dw_proj`` after
    the loop."""
    steps, batch, n_in, hidden = size
    a = lstm_proj_inputs(*size)
    proj = a["w_proj"].shape[1]
    w_x, w_h, w_proj = a["w"][:n_in], a["w"][n_in:], a["w_proj"]
    x_flat = a["x"].reshape(steps * batch, n_in)
    h_steps = np.zeros((steps, batch, proj), DTYPE)
    m_steps = np.zeros((steps, batch, hidden), DTYPE)
    gates = np.empty((steps * batch, 4 * hidden), DTYPE)
    h_gates = np.empty((batch, 4 * hidden), DTYPE)
    d_gates = np.random.default_rng(1).standard_normal((steps, batch, 4 * hidden), dtype=DTYPE)
    d_flat = d_gates.reshape(steps * batch, 4 * hidden)
    dh_prev, d_m = np.empty((batch, proj), DTYPE), np.empty((batch, hidden), DTYPE)
    dx = np.empty((steps * batch, n_in), DTYPE)
    dw = np.empty((n_in + proj, 4 * hidden), DTYPE)

    def run():
        np.matmul(x_flat, w_x, out=gates)
        h = a["h0"]
        for t in range(steps):
            np.matmul(h, w_h, out=h_gates)
            np.matmul(m_steps[t], w_proj, out=h_steps[t])
            h = h_steps[t]
        w_h_t, w_proj_t = np.ascontiguousarray(w_h.T), np.ascontiguousarray(w_proj.T)
        for t in reversed(range(steps)):
            np.matmul(a["d_h"][t], w_proj_t, out=d_m)
            np.matmul(d_gates[t], w_h_t, out=dh_prev)
        dw_proj = m_steps.reshape(-1, hidden).T @ a["d_h"].reshape(-1, proj)
        np.matmul(d_flat, w_x.T, out=dx)
        np.matmul(x_flat.T, d_flat, out=dw[:n_in])
        h_flat = h_steps.reshape(steps * batch, proj)
        np.matmul(h_flat[: (steps - 1) * batch].T, d_flat[batch:], out=dw[n_in:])
        dw[n_in:] += a["h0"].T @ d_gates[0]
        return dw, dw_proj

    return run


def blas_bound_gru(size, reset_after):
    """The matmuls of gradcells's GRU plan (``gradcells/cells/gru/cpu.py``) and nothing else."""
    steps, batch, n_in, hidden = size
    a = gru_inputs(*size, reset_after=reset_after)
    w_rux, w_ruh = a["w_ru"][:n_in], a["w_ru"][n_in:]
    w_cx, w_ch = a["w_c"][:n_in], a["w_c"][n_in:]
    x_flat = a["x"].reshape(steps * batch, n_in)
    flat = steps * batch
    h_steps = np.zeros((steps, batch, hidden), DTYPE)
    h_flat = h_steps.reshape(flat, hidden)
    x_ru = np.empty((flat, 2 * hidden), DTYPE)
    x_c = np.empty((flat, hidden), DTYPE)
    gates_ru = np.empty((batch, 2 * hidden), DTYPE)
    gates_c = np.empty((batch, hidden), DTYPE)
    recurrent = np.empty((flat, hidden), DTYPE)
    rng = np.random.default_rng(1)
    d_ru = rng.standard_normal((steps, batch, 2 * hidden), dtype=DTYPE)
    d_c = rng.standard_normal((steps, batch, hidden), dtype=DTYPE)
    d_n = rng.standard_normal((steps, batch, hidden), dtype=DTYPE)
    d_ru_flat, d_c_flat = d_ru.reshape(flat, 2 * hidden), d_c.reshape(flat, hidden)
    dh_prev = np.empty((batch, hidden), DTYPE)
    direct = np.empty((batch, hidden), DTYPE)
    dx = np.empty((flat, n_in), DTYPE)
    first = (steps - 1) * batch

    def run():
        np.matmul(x_flat, w_rux, out=x_ru)
        np.matmul(x_flat, w_cx, out=x_c)
        h = a["h0"]
        for t in range(steps):
            np.matmul(h, w_ruh, out=gates_ru)
            np.matmul(h, w_ch, out=gates_c)     # reset before: (r∘h_prev)·W_ch
            h = h_steps[t]
        if reset_after:                          # n's recurrent part for every step
            np.matmul(a["h0"], w_ch, out=recurrent[:batch])
            np.matmul(h_flat[:first], w_ch, out=recurrent[batch:])
        w_ch_t, w_ruh_t = np.ascontiguousarray(w_ch.T), np.ascontiguousarray(w_ruh.T)
        for t in reversed(range(steps)):
            np.matmul(d_n[t] if reset_after else d_c[t], w_ch_t, out=direct)
            np.matmul(d_ru[t], w_ruh_t, out=dh_prev)
        np.matmul(d_ru_flat, w_rux.T, out=dx)
        np.add(dx, d_c_flat @ w_cx.T, out=dx)
        dw = [x_flat.T @ d_ru_flat, x_flat.T @ d_c_flat,
              h_flat[:first].T @ d_ru_flat[batch:] + a["h0"].T @ d_ru[0]]
        if reset_after:
            dw.append(h_flat[:first].T @ d_n.reshape(flat, hidden)[batch:] + a["h0"].T @ d_n[0])
        else:
            dw.append(h_flat.T @ d_c_flat)       # (r∘h_prev)ᵀ·dC
        return dw

    return run


def blas_bound_rnn(size):
    """The matmuls of gradcells's plain RNN plan (``gradcells/cells/rnn/cpu.py``) and nothing
    else."""
    return _matmul_plan(rnn_inputs(*size), size, size[3])


# -- measurement ------------------------------------------------------------------------------


def contestants_for(cell, size, skip):
    """name -> callable, plus the names of the torch peer and the BLAS bound."""
    out = {}
    if cell == "lstm":
        out["gradcells cpu"] = gradcells_lstm("cpu", size)
        if "reference" not in skip:
            out["gradcells reference"] = gradcells_lstm("reference", size)
        if "torch" not in skip:
            out["torch nn.LSTM"] = torch_rnn("LSTM", size)
        if "tf" not in skip:
            out["tf BlockLSTM"] = tf_block_lstm(size)
        out["BLAS bound"] = blas_bound_lstm(size)
        return out
    if cell in OWN_CONTESTANTS:
        return OWN_CONTESTANTS[cell](size, skip)
    if cell == "rnn":
        out["gradcells cpu"] = gradcells_rnn("cpu", size)
        if "reference" not in skip:
            out["gradcells reference"] = gradcells_rnn("reference", size)
        if "torch" not in skip:
            out["torch nn.RNN"] = torch_rnn("RNN", size)
        out["BLAS bound"] = blas_bound_rnn(size)
        return out
    for reset_after, label in ((True, "reset-after"), (False, "reset-before")):
        out[f"gradcells cpu {label}"] = gradcells_gru("cpu", size, reset_after)
        if "reference" not in skip:
            out[f"gradcells reference {label}"] = gradcells_gru("reference", size, reset_after)
        out[f"BLAS bound {label}"] = blas_bound_gru(size, reset_after)
    if "torch" not in skip:
        out["torch nn.GRU"] = torch_rnn("GRU", size)
    return out


def lstm_proj_contestants(size, skip):
    """``contestants_for``'s LSTM with a projection (P = H/2)."""
    out = {"gradcells cpu": gradcells_lstm_proj("cpu", size)}
    if "reference" not in skip:
        out["gradcells reference"] = gradcells_lstm_proj("reference", size)
    if "torch" not in skip:
        out["torch nn.LSTM"] = torch_rnn("LSTM", size, proj=True)
    out["BLAS bound"] = blas_bound_lstm_proj(size)
    return out


def lstm_ln_contestants(size, skip):
    """``contestants_for``'s layer-normalised LSTM."""
    out = {"gradcells cpu": gradcells_lstm_ln("cpu", size)}
    if "reference" not in skip:
        out["gradcells reference"] = gradcells_lstm_ln("reference", size)
    if "torch" not in skip:
        out["torch LN-LSTM"] = torch_ln_lstm(size)
        out["torch LN-LSTM, x hoisted"] = torch_ln_lstm(size, hoisted=True)
    out["BLAS bound"] = blas_bound_lstm_ln(size)
    return out


OWN_CONTESTANTS = {"lstm-proj": lstm_proj_contestants, "lstm-ln": lstm_ln_contestants}


def peer_names(cell, name):
    """(torch peer, BLAS bound) that ``name``'s ratios are taken against. ``torch.nn.GRU``
    is the reset-after GRU: the reset-before rows, another model with one matmul fewer, have
    no PyTorch peer (None)."""
    if cell == "lstm-ln":
        return "torch LN-LSTM", "BLAS bound"
    if cell in ("lstm", "rnn", "lstm-proj"):
        return f"torch nn.{cell.split('-')[0].upper()}", "BLAS bound"
    if name.endswith("reset-before"):
        return None, "BLAS bound reset-before"
    return "torch nn.GRU", "BLAS bound reset-after"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None,
                        help="T,B,I,H tuples (default: the issue's three sizes)")
    parser.add_argument("--cells", default="lstm,gru",
                        help="comma list of: lstm, gru, rnn, lstm-proj (P = H/2), lstm-ln")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip", default="", help="comma list of: reference, torch, tf")
    parser.add_argument("--peak-size", type=int, default=2048,
                        help="N of the N³ matmul whose rate is the peak (matmul_peak)")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    skip = set(filter(None, args.skip.split(",")))

    # Start the peers' thread pools limited, then limit every BLAS/OpenMP pool and Numba.
    pin_peer_threads(args.threads, torch="torch" not in skip, tensorflow="tf" not in skip)
    limiter = limit_threads(args.threads)  # noqa: F841 - keeps the limits in force
    peak = matmul_peak(args.peak_size)
    print(f"float32, forward + BPTT with an upstream gradient on every h; median of "
          f"{args.repeats} interleaved rounds. {describe_machine(args.threads)}.")
    print(describe_peak(peak, args.peak_size, args.threads) + "\n")

    for cell in args.cells.split(","):
        for size in sizes:
            steps, batch, n_in, hidden = size
            contestants = contestants_for(cell, size, skip)
            stats = summarize(time_interleaved(contestants, args.repeats))
            unit = steps * batch * hidden * 4 / 2**20
            flops = model_flops(cell, size)
            rows = []
            for name, stat in stats.items():
                torch_name, bound_name = peer_names(cell, name)
                torch_time = stats[torch_name].median if torch_name in stats else None
                memory = "-"
                if name.startswith("gradcells"):
                    release_scratch()
                    mib = peak_mib(contestants[name])
                    memory = f"{mib:.1f} MiB ({mib / unit:.1f} TBH)"
                rows.append((name, f"{stat.median * 1e3:.1f}", f"{stat.minimum * 1e3:.1f}",
                             ratio(stat.median, torch_time),
                             ratio(stat.median, stats[bound_name].median),
                             flop_rate(flops, stat.median, peak), memory))
            print(f"{cell.upper()} (T, B, I, H) = {size}")
            print(table(rows, ("contestant", "median ms", "min ms", "vs torch", "vs BLAS bound",
                               "GFLOP/s (of peak)", "peak memory")))
            print()
            sys.stdout.flush()


if __name__ == "__main__":
    main()
