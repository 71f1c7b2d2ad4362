"""GPU figures, side by side in one run: gradcells's CUDA backend against PyTorch CUDA.

    python benchmarks/gpu.py                      # everything, float32
    python benchmarks/gpu.py --repeats 21 --out results.txt

Three tables, each contestant timed in interleaved rounds (every round runs every
contestant once) and reported as the median over ``--repeats`` rounds, with its ratio to
the peer:

1. **cell step**, forward + gradient for every input: ``gc.lstm_cell`` +
   ``gc.lstm_cell_grad`` (CuPy arrays, so the GPU backend) against ``torch.nn.LSTMCell``
   forward + ``torch.autograd.grad`` for input, states and parameters (PyTorch's fused CUDA
   cell); GRU likewise with ``reset_after=True`` against ``torch.nn.GRUCell``, and the plain
   RNN (tanh) against ``torch.nn.RNNCell``. The row
   "gradcells backend" calls the cells' ``gpu.py`` directly (one weight set and one settings
   record, the backend protocol), without the public layer's argument checks.
2. **sequence**, forward over T steps + backpropagation through time from an upstream
   gradient on every step's h: ``gc.lstm_sequence(_grad)`` against ``torch.nn.LSTM``
   (cuDNN), ``gc.gru_sequence(_grad)`` (reset-after) against ``torch.nn.GRU`` (cuDNN),
   ``gc.rnn_sequence(_grad)`` (tanh) against ``torch.nn.RNN`` (cuDNN), and the
   layer-normalised LSTM (``layer_norm=gc.LSTMNorm(...)``, docs/spec.md §9.2) against the
   same LN-LSTM written with PyTorch ops (``torch.nn.functional.layer_norm`` in a step
   loop, autograd for the gradient: what a PyTorch user must write), with gradcells's
   plain LSTM beside it (the price of the norms: their kernels give one thread a row), at
   the first sequence size only (``LN_SEQUENCE_SIZES``).
3. **bandwidth** of the fused elementwise kernels alone (launched back to back through the
   backend's own runtime): bytes each launch must read and write divided by its median
   time, against a device-to-device ``cudaMemcpyAsync`` moving the same number of bytes.

Timing: CUDA events on the legacy default stream, which both CuPy and PyTorch use, around
``--inner`` back-to-back calls, so a figure is GPU-timeline time per call including any
idle gap the host's launch overhead leaves. float32 (``--dtype`` to change); TF32 is off
for PyTorch's matmuls and cuDNN, as it is by default in CuPy.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
from pathlib import Path

import cupy as cp
import numpy as np

import gradcells as gc
from gradcells._core import report
from gradcells._dispatch import backend_module
from gradcells.cells.gru.spec import GRUSettings, GRUWeights
from gradcells.cells.lstm.spec import LSTMSettings, LSTMWeights
from gradcells.cells.rnn.spec import RNNSettings, RNNWeights
from gradcells.gpu import _kernels
from gradcells.gpu._runtime import CupyRuntime

gpu = backend_module("gpu")  # every cell's gradcells/cells/<cell>/gpu.py

CELL_SIZES = [(64, 256, 256), (256, 512, 512), (1024, 1024, 1024)]  # (B, I, H)
SEQUENCE_SIZES = [(100, 32, 256, 256), (100, 64, 512, 512), (50, 256, 1024, 1024)]  # T,B,I,H
# The layer-normalised LSTM at the smallest sequence size only: its norm kernels give one
# thread a whole row (docs/backends.md), so at H = 1024 one call could take seconds and
# push benchmarks/gpu_check.sh past its time limit.
LN_SEQUENCE_SIZES = SEQUENCE_SIZES[:1]
BANDWIDTH_SIZES = [(1024, 1024), (8192, 1024)]  # (B, H): B·H = 2^20 and 2^23


def timed(contestants, repeats, inner):
    """Median milliseconds per call of each contestant, rounds interleaved."""
    for fn in contestants.values():  # warm-up: compile, allocate, autotune
        fn()
        fn()
    cp.cuda.runtime.deviceSynchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    samples = {name: [] for name in contestants}
    for _ in range(repeats):
        for name, fn in contestants.items():
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            samples[name].append(cp.cuda.get_elapsed_time(start, end) / inner)
    return {name: statistics.median(values) for name, values in samples.items()}


def rows_with_ratio(label, medians, peer):
    return [(label, name, f"{ms:.4f}", f"{ms / medians[peer]:.2f}" if peer in medians else "-")
            for name, ms in medians.items()]


def table(title, header, rows):
    """``title`` over the project's text table (``gradcells._core.report.table``)."""
    return "\n".join([title, *report.table(header, [[str(c) for c in r] for r in rows])])


def normal(rng, shape, dtype, scale=1.0):
    return cp.asarray((scale * rng.standard_normal(shape)).astype(dtype))


# -- 1. cell step -----------------------------------------------------------------------


def cell_contestants(batch, n_in, hidden, dtype, torch):
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(n_in + hidden)
    x, cs, h = normal(rng, (batch, n_in), dtype), normal(rng, (batch, hidden), dtype), \
        normal(rng, (batch, hidden), dtype, 0.5)
    w, b = normal(rng, (n_in + hidden, 4 * hidden), dtype, scale), normal(rng, 4 * hidden, dtype)
    d_h, d_cs = normal(rng, (batch, hidden), dtype), normal(rng, (batch, hidden), dtype)
    w_ru = normal(rng, (n_in + hidden, 2 * hidden), dtype, scale)
    w_c = normal(rng, (n_in + hidden, hidden), dtype, scale)
    b_ru, b_c = normal(rng, 2 * hidden, dtype), normal(rng, 2 * hidden, dtype)

    lstm_weights, lstm_settings = LSTMWeights(w, b), LSTMSettings()
    gru_weights, gru_settings = GRUWeights(w_ru, w_c, b_ru, b_c), GRUSettings(reset_after=True)

    def lstm():
        state = gc.lstm_cell(x, cs, h, w, b)
        return gc.lstm_cell_grad(x, cs, h, w, b, state, d_h=d_h, d_cs=d_cs)

    def lstm_backend():
        state = gpu.lstm_cell(x, cs, h, lstm_weights, lstm_settings)
        return gpu.lstm_cell_grad(x, cs, h, lstm_weights, state, lstm_settings, d_h=d_h,
                                  d_cs=d_cs)

    def gru():
        state = gc.gru_cell(x, h, w_ru, w_c, b_ru, b_c, reset_after=True)
        return gc.gru_cell_grad(x, h, w_ru, w_c, b_ru, b_c, state, d_h=d_h, reset_after=True)

    def gru_backend():
        state = gpu.gru_cell(x, h, gru_weights, gru_settings)
        return gpu.gru_cell_grad(x, h, gru_weights, state, gru_settings, d_h=d_h)

    lstm_rows = {"gradcells": lstm, "gradcells backend": lstm_backend}
    gru_rows = {"gradcells": gru, "gradcells backend": gru_backend}
    if torch is not None:
        tdtype = getattr(torch, np.dtype(dtype).name)
        tx, th, tc = (torch.as_tensor(a, device="cuda").requires_grad_() for a in (x, h, cs))
        tdh, tdc = torch.as_tensor(d_h, device="cuda"), torch.as_tensor(d_cs, device="cuda")
        lstm_cell = torch.nn.LSTMCell(n_in, hidden, device="cuda", dtype=tdtype)
        gru_cell = torch.nn.GRUCell(n_in, hidden, device="cuda", dtype=tdtype)

        def torch_lstm():
            h1, c1 = lstm_cell(tx, (th, tc))
            return torch.autograd.grad((h1, c1), [tx, th, tc, *lstm_cell.parameters()],
                                       (tdh, tdc))

        def torch_gru():
            h1 = gru_cell(tx, th)
            return torch.autograd.grad(h1, [tx, th, *gru_cell.parameters()], tdh)

        lstm_rows["torch LSTMCell"] = torch_lstm
        gru_rows["torch GRUCell"] = torch_gru
    return lstm_rows, gru_rows


def rnn_cell_contestants(batch, n_in, hidden, dtype, torch):
    """The plain RNN cell (tanh): the public functions, the backend, ``torch.nn.RNNCell``."""
    rng = np.random.default_rng(3)
    x, h = normal(rng, (batch, n_in), dtype), normal(rng, (batch, hidden), dtype, 0.5)
    w = normal(rng, (n_in + hidden, hidden), dtype, 1.0 / np.sqrt(n_in + hidden))
    b, d_h = normal(rng, hidden, dtype), normal(rng, (batch, hidden), dtype)
    weights, settings = RNNWeights(w, b), RNNSettings()

    def rnn():
        return gc.rnn_cell_grad(x, h, w, b, gc.rnn_cell(x, h, w, b), d_h=d_h)

    def rnn_backend():
        state = gpu.rnn_cell(x, h, weights, settings)
        return gpu.rnn_cell_grad(x, h, weights, state, settings, d_h=d_h)

    rows = {"gradcells": rnn, "gradcells backend": rnn_backend}
    if torch is not None:
        tx, th = (torch.as_tensor(a, device="cuda").requires_grad_() for a in (x, h))
        tdh = torch.as_tensor(d_h, device="cuda")
        cell = torch.nn.RNNCell(n_in, hidden, device="cuda",
                                dtype=getattr(torch, np.dtype(dtype).name))

        def torch_rnn():
            return torch.autograd.grad(cell(tx, th), [tx, th, *cell.parameters()], tdh)

        rows["torch RNNCell"] = torch_rnn
    return rows


# -- 2. sequences -----------------------------------------------------------------------


def sequence_contestants(steps, batch, n_in, hidden, dtype, torch):
    rng = np.random.default_rng(1)
    scale = 1.0 / np.sqrt(n_in + hidden)
    x = normal(rng, (steps, batch, n_in), dtype)
    cs0, h0 = normal(rng, (batch, hidden), dtype), normal(rng, (batch, hidden), dtype, 0.5)
    w, b = normal(rng, (n_in + hidden, 4 * hidden), dtype, scale), normal(rng, 4 * hidden, dtype)
    w_ru = normal(rng, (n_in + hidden, 2 * hidden), dtype, scale)
    w_c = normal(rng, (n_in + hidden, hidden), dtype, scale)
    b_ru, b_c = normal(rng, 2 * hidden, dtype), normal(rng, 2 * hidden, dtype)
    d_h = normal(rng, (steps, batch, hidden), dtype)

    def lstm():
        seq = gc.lstm_sequence(x, cs0, h0, w, b)
        return gc.lstm_sequence_grad(x, cs0, h0, w, b, seq, d_h=d_h)

    def gru():
        seq = gc.gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, reset_after=True)
        return gc.gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, seq, d_h=d_h, reset_after=True)

    lstm_rows, gru_rows = {"gradcells": lstm}, {"gradcells": gru}
    if torch is not None:
        tdtype = getattr(torch, np.dtype(dtype).name)
        tx = torch.as_tensor(x, device="cuda").requires_grad_()
        th0 = torch.as_tensor(h0, device="cuda")[None].contiguous().requires_grad_()
        tc0 = torch.as_tensor(cs0, device="cuda")[None].contiguous().requires_grad_()
        tdh = torch.as_tensor(d_h, device="cuda")
        lstm_net = torch.nn.LSTM(n_in, hidden, device="cuda", dtype=tdtype)
        gru_net = torch.nn.GRU(n_in, hidden, device="cuda", dtype=tdtype)

        def torch_lstm():
            y, _ = lstm_net(tx, (th0, tc0))
            return torch.autograd.grad(y, [tx, th0, tc0, *lstm_net.parameters()], tdh)

        def torch_gru():
            y, _ = gru_net(tx, th0)
            return torch.autograd.grad(y, [tx, th0, *gru_net.parameters()], tdh)

        lstm_rows["torch nn.LSTM (cuDNN)"] = torch_lstm
        gru_rows["torch nn.GRU (cuDNN)"] = torch_gru
    return lstm_rows, gru_rows


def rnn_sequence_contestants(steps, batch, n_in, hidden, dtype, torch):
    """The plain RNN (tanh) over T steps: ``gc.rnn_sequence(_grad)``, ``torch.nn.RNN``."""
    rng = np.random.default_rng(4)
    x, h0 = normal(rng, (steps, batch, n_in), dtype), normal(rng, (batch, hidden), dtype, 0.5)
    w = normal(rng, (n_in + hidden, hidden), dtype, 1.0 / np.sqrt(n_in + hidden))
    b, d_h = normal(rng, hidden, dtype), normal(rng, (steps, batch, hidden), dtype)

    def rnn():
        return gc.rnn_sequence_grad(x, h0, w, b, gc.rnn_sequence(x, h0, w, b), d_h=d_h)

    rows = {"gradcells": rnn}
    if torch is not None:
        tx = torch.as_tensor(x, device="cuda").requires_grad_()
        th0 = torch.as_tensor(h0, device="cuda")[None].contiguous().requires_grad_()
        tdh = torch.as_tensor(d_h, device="cuda")
        net = torch.nn.RNN(n_in, hidden, device="cuda", dtype=getattr(torch, np.dtype(dtype).name))

        def torch_rnn():
            y, _ = net(tx, th0)
            return torch.autograd.grad(y, [tx, th0, *net.parameters()], tdh)

        rows["torch nn.RNN (cuDNN)"] = torch_rnn
    return rows


def ln_sequence_contestants(steps, batch, n_in, hidden, dtype, torch):
    """The layer-normalised LSTM over T steps (``ln_carry="raw"``): gradcells with and
    without the norms, and a PyTorch LN-LSTM of torch ops."""
    rng = np.random.default_rng(5)
    x = normal(rng, (steps, batch, n_in), dtype)
    cs0, h0 = normal(rng, (batch, hidden), dtype), normal(rng, (batch, hidden), dtype, 0.5)
    w = normal(rng, (n_in + hidden, 4 * hidden), dtype, 1.0 / np.sqrt(n_in + hidden))
    b, d_h = normal(rng, 4 * hidden, dtype), normal(rng, (steps, batch, hidden), dtype)
    norm = gc.LSTMNorm(*(normal(rng, width, dtype, 0.1) + 1 if k % 2 == 0
                         else normal(rng, width, dtype, 0.1)
                         for k, width in enumerate((4 * hidden,) * 4 + (hidden,) * 2)))

    def ln_lstm():
        seq = gc.lstm_sequence(x, cs0, h0, w, b, layer_norm=norm)
        return gc.lstm_sequence_grad(x, cs0, h0, w, b, seq, d_h=d_h, layer_norm=norm)

    def plain_lstm():
        return gc.lstm_sequence_grad(x, cs0, h0, w, b, gc.lstm_sequence(x, cs0, h0, w, b),
                                     d_h=d_h)

    rows = {"gradcells": ln_lstm, "gradcells without LN": plain_lstm}
    if torch is not None:
        rows["torch ops LN-LSTM"] = _torch_ln_lstm(torch, x, cs0, h0, w, b, norm, d_h)
    return rows


def _torch_ln_lstm(torch, x, cs0, h0, w, b, norm, d_h):
    """A layer-normalised LSTM (raw carry, forget bias 1) of PyTorch ops, forward and
    autograd backward for every input."""
    fn = torch.nn.functional
    n_in, hidden = x.shape[2], cs0.shape[1]
    tx, tc0, th0, tw, tb, *tnorm = (torch.as_tensor(a, device="cuda").requires_grad_()
                                    for a in (x, cs0, h0, w, b, *norm))
    gx_, bx, gh_, bh, gc_, bc = tnorm
    tdh = torch.as_tensor(d_h, device="cuda")

    def run():
        zx = fn.layer_norm(tx @ tw[:n_in], (4 * hidden,), gx_, bx)
        cs, h, hs = tc0, th0, []
        for t in range(tx.shape[0]):
            g = zx[t] + fn.layer_norm(h @ tw[n_in:], (4 * hidden,), gh_, bh) + tb
            i, ci, f, o = g.split(hidden, dim=1)
            cs = torch.sigmoid(i) * torch.tanh(ci) + torch.sigmoid(f + 1.0) * cs
            h = torch.sigmoid(o) * torch.tanh(fn.layer_norm(cs, (hidden,), gc_, bc))
            hs.append(h)
        return torch.autograd.grad(torch.stack(hs), [tx, tc0, th0, tw, tb, *tnorm], tdh)

    return run


# -- 3. bandwidth -----------------------------------------------------------------------


def kernel_launches(batch, hidden, dtype):
    """name -> (launch function, bytes read + written per launch) for the fused kernels."""
    rt = CupyRuntime()
    rng = np.random.default_rng(2)
    n = batch * hidden
    item = np.dtype(dtype).itemsize

    def arrays(*shape_count):
        return [normal(rng, shape, dtype) for shape, count in shape_count for _ in range(count)]

    gates = (batch, 4 * hidden)
    state = (batch, hidden)
    no_lengths = cp.empty(0, cp.int32)
    gx, gh = arrays((gates, 2))
    b = normal(rng, 4 * hidden, dtype)
    cs_prev, i, cs, f, o, ci, co, h, d_h, d_cs, dcs = arrays((state, 11))
    d_gates = cp.empty(gates, dtype)

    def launch(name, values):
        binding = _kernels.binding(_kernels.KERNELS[name], (dtype,))
        args = binding.arguments(values)
        grid, block = _kernels.elementwise_shape(n)
        return lambda: rt.launch(binding, grid, block, args)

    forward = launch("lstm_forward", dict(
        gx=gx, gh=gh, b=b, cs_prev=cs_prev, wci=b, wcf=b, wco=b, seq_len=no_lengths,
        forget_bias=1.0, cell_clip=0.0, use_peephole=0, use_clip=0, use_seq_len=0, step=0,
        batch=batch, hidden=hidden, i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h, cs_state=cs,
        h_state=h))
    backward = launch("lstm_backward", dict(
        cs_prev=cs_prev, i=i, cs=cs, f=f, o=o, ci=ci, co=co, wci=b, wcf=b, wco=b, d_h=d_h,
        d_cs=d_cs, dh_next=d_h, dcs_next=dcs, d_h_final=d_h, d_cs_final=d_cs,
        seq_len=no_lengths, d_gate_up=d_h, cell_clip=0.0, use_peephole=0, mask_clip=0,
        has_d_h=1, has_d_cs=1, has_d_h_final=0, has_d_cs_final=0, use_seq_len=0,
        has_d_gate_up=0, step=0, n_steps=1,
        batch=batch, hidden=hidden, d_gates=d_gates, dcs_prev=dcs, peephole_terms=b))
    gx_ru, gh_ru = arrays(((batch, 2 * hidden), 2))
    gx_c, gh_c = arrays((state, 2))
    r, u, c = arrays((state, 3))
    gru_forward = launch("gru_forward_reset_after", dict(
        gx_ru=gx_ru, ld_gx_ru=2 * hidden, gx_c=gx_c, ld_gx_c=hidden, gh_ru=gh_ru,
        ld_gh_ru=2 * hidden, gh_c=gh_c, ld_gh_c=hidden, b_ru=b[:2 * hidden].copy(),
        b_c=b[2 * hidden:].copy(), h_prev=cs_prev, seq_len=no_lengths, use_seq_len=0,
        step=0, batch=batch, hidden=hidden, r=r, u=u, c=c, h=h, h_state=h))
    return {
        "lstm_forward": (forward, (9 + 7) * n * item),  # gx, gh, cs_prev; 7 outputs
        "lstm_backward": (backward, (9 + 5) * n * item),  # 7 saved + d_h, d_cs; dG, dcs_prev
        "gru_forward_reset_after": (gru_forward, (7 + 4) * n * item),  # 2+1+2+1+h; r,u,c,h
        **rnn_kernel_launches(launch, arrays((state, 6)), batch, hidden),
        "column_sum [B, 4H]": (column_sum_launch(rt, d_gates), 4 * n * item),
    }


def rnn_kernel_launches(launch, state_arrays, batch, hidden):
    """The plain RNN's launches (tanh, no lengths) on six ``[B, H]`` arrays, as
    ``kernel_launches``'s entries; ``launch(name, values)`` builds one."""
    gx, gh, h, d_h, dh_next, d_z = state_arrays
    n_bytes = batch * hidden * h.itemsize
    b, no_lengths = h[0].copy(), cp.empty(0, cp.int32)
    forward = launch("rnn_forward", dict(
        gx=gx, gh=gh, b=b, seq_len=no_lengths, use_relu=0, use_seq_len=0, step=0,
        batch=batch, hidden=hidden, h=h, h_state=h))
    backward = launch("rnn_backward", dict(
        h=h, d_h=d_h, dh_next=dh_next, d_h_final=d_h, seq_len=no_lengths, use_relu=0,
        has_d_h=1, has_d_h_final=0, use_seq_len=0, step=0, n_steps=2, batch=batch,
        hidden=hidden, d_z=d_z))
    return {"rnn_forward": (forward, 3 * n_bytes),  # gx, gh; h
            "rnn_backward": (backward, 4 * n_bytes)}  # h, d_h, dh_next; dz


def column_sum_launch(rt, a):
    """The launches of the column sum of ``a [rows, cols]`` (one pass or two), as one
    function."""
    rows, cols = a.shape
    column = cp.empty(cols, a.dtype)
    sum_kernel = _kernels.KERNELS["column_sum"]
    parts, per_part = _kernels.column_sum_plan(rows, cols)
    launches = []
    if parts == 1:
        stages = [(a, rows, per_part, 1, column)]
    else:
        partial = cp.empty((parts, cols), _kernels.COMPUTE_DTYPE[a.dtype])
        stages = [(a, rows, per_part, parts, partial), (partial, parts, parts, 1, column)]
    for source, n_rows, rows_per_part, n_parts, out in stages:
        binding = _kernels.binding(sum_kernel, (source.dtype, out.dtype))
        args = binding.arguments({
            "in": source, "rows": n_rows, "cols": cols, "rows_per_part": rows_per_part,
            "parts": n_parts, "out": out})
        grid, block = _kernels.column_sum_shape(cols, n_parts)
        launches.append((binding, grid, block, args))

    def column_sum():
        for binding, grid, block, args in launches:
            rt.launch(binding, grid, block, args)

    return column_sum


def bandwidth_rows(batch, hidden, dtype, repeats, inner):
    launches = kernel_launches(batch, hidden, dtype)
    rows = []
    for name, (launch, nbytes) in launches.items():
        half = nbytes // 2  # a copy of half the bytes reads and writes nbytes in all
        src, dst = cp.empty(half, cp.uint8), cp.empty(half, cp.uint8)

        def copy(dst=dst, src=src, half=half):
            dst.data.copy_from_device_async(src.data, half)

        medians = timed({"kernel": launch, "copy": copy}, repeats, inner)
        kernel_bw = nbytes / medians["kernel"] / 1e6  # GB/s
        copy_bw = nbytes / medians["copy"] / 1e6
        rows.append((f"B={batch} H={hidden}", name, f"{nbytes / 2**20:.1f}",
                     f"{medians['kernel'] * 1e3:.1f}", f"{kernel_bw:.0f}", f"{copy_bw:.0f}",
                     f"{kernel_bw / copy_bw:.2f}"))
    return rows


# -- main -------------------------------------------------------------------------------


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--inner", type=int, default=5, help="calls per timed sample")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "float64"])
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--skip", default="", help="comma list of: cell, sequence, bandwidth")
    return parser.parse_args(argv)


def _cuda_torch():
    """PyTorch with CUDA and TF32 off, or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _preamble(args, dtype, torch):
    """The report's first lines: date, device, versions, settings."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    peer = (f"{torch.__version__} (cuDNN {torch.backends.cudnn.version()})" if torch
            else "absent")
    return [
        f"gradcells GPU benchmark, {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"device: {name}; CuPy {cp.__version__}; CUDA runtime "
        f"{cp.cuda.runtime.runtimeGetVersion()}; PyTorch {peer}; "
        f"Python {platform.python_version()}; dtype {dtype.name}; TF32 off; "
        f"median of {args.repeats} rounds x {args.inner} calls",
        "ratio: time / the PyTorch peer's time (below 1: gradcells faster)"
        if torch else "PyTorch with CUDA absent: no peer rows",
    ]


_HEADER = ("size", "contestant", "ms/call", "ratio")


def _cell_table(args, dtype, torch):
    rows = []
    for batch, n_in, hidden in CELL_SIZES:
        lstm_rows, gru_rows = cell_contestants(batch, n_in, hidden, dtype, torch)
        size = f"B={batch} I={n_in} H={hidden}"
        rows += rows_with_ratio(f"LSTM {size}", timed(lstm_rows, args.repeats, args.inner),
                                "torch LSTMCell")
        rows += rows_with_ratio(f"GRU  {size}", timed(gru_rows, args.repeats, args.inner),
                                "torch GRUCell")
        rows += rows_with_ratio(f"RNN  {size}", timed(
            rnn_cell_contestants(batch, n_in, hidden, dtype, torch), args.repeats, args.inner),
            "torch RNNCell")
    return table("1. cell step, forward + gradient of every input", _HEADER, rows)


def _sequence_table(args, dtype, torch):
    rows = []
    for steps, batch, n_in, hidden in SEQUENCE_SIZES:
        lstm_rows, gru_rows = sequence_contestants(steps, batch, n_in, hidden, dtype, torch)
        size = f"T={steps} B={batch} I={n_in} H={hidden}"
        inner = max(1, args.inner // 2)
        rows += rows_with_ratio(f"LSTM {size}", timed(lstm_rows, args.repeats, inner),
                                "torch nn.LSTM (cuDNN)")
        rows += rows_with_ratio(f"GRU  {size}", timed(gru_rows, args.repeats, inner),
                                "torch nn.GRU (cuDNN)")
        rows += rows_with_ratio(f"RNN  {size}", timed(
            rnn_sequence_contestants(steps, batch, n_in, hidden, dtype, torch), args.repeats,
            inner), "torch nn.RNN (cuDNN)")
        if (steps, batch, n_in, hidden) in LN_SEQUENCE_SIZES:
            rows += rows_with_ratio(f"LN-LSTM {size}", timed(
                ln_sequence_contestants(steps, batch, n_in, hidden, dtype, torch),
                args.repeats, inner), "torch ops LN-LSTM")
    return table("2. sequence, forward + backpropagation through time", _HEADER, rows)


def _bandwidth_table(args, dtype, torch):
    rows = []
    for batch, hidden in BANDWIDTH_SIZES:
        rows += bandwidth_rows(batch, hidden, dtype, args.repeats, 20)
    return table(
        "3. elementwise kernels: effective bandwidth vs a device-to-device copy "
        "of the same bytes",
        ("size", "kernel", "MiB moved", "us/launch", "GB/s", "copy GB/s", "of copy"), rows)


_SECTIONS = {"cell": _cell_table, "sequence": _sequence_table, "bandwidth": _bandwidth_table}


def main(argv=None):
    args = _arguments(argv)
    dtype = np.dtype(args.dtype)
    skip = set(filter(None, args.skip.split(",")))
    torch = _cuda_torch()
    report = _preamble(args, dtype, torch)
    for line in report:
        print(line)
    for section, make_table in _SECTIONS.items():
        if section not in skip:
            text = "\n" + make_table(args, dtype, torch)
            print(text, flush=True)
            report.append(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(report) + "\n")
        print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
