"""One cell step, forward + full gradient, float32, side by side in one process.

    python benchmarks/cells.py                        # LSTM, GRU (both variants), four sizes
    python benchmarks/cells.py --sizes 64,256,256 --cells lstm --repeats 31
    python benchmarks/cells.py --threads 2 --skip tf

Each contestant computes one step's outputs and the gradient with respect to every input
(x, the states, the weights and the biases) from upstream gradients on h (and cs for LSTM):

- ``cpu``: ``gc.lstm_cell`` + ``gc.lstm_cell_grad`` (``gc.gru_cell`` + ``gc.gru_cell_grad``)
  with ``backend="cpu"``, through the public API, validation included;
- ``reference``: the same calls with ``backend="reference"``;
- ``torch``: ``nn.LSTMCell`` / ``nn.GRUCell`` forward and ``torch.autograd.grad`` with
  respect to the input, the states and all four parameter tensors (GRUCell is the
  reset-after variant: it is compared with gradcells's ``reset_after=True``);
- ``tf``: ``tf.raw_ops.LSTMBlockCell`` + ``LSTMBlockCellGrad`` (``GRUBlockCell`` +
  ``GRUBlockCellGrad``, reset before) plus the matmuls and bias sums that TensorFlow's
  Python gradient wrapper adds, all in one ``tf.function``;
- ``BLAS``: the lower bound, the matmuls of the math alone (``np.dot`` into preallocated
  outputs, contiguous operands): LSTM [x,h]·w, dG·wᵀ, [x,h]ᵀ·dG; GRU the six (reset before)
  or ten (reset after, with the gradient's recompute of h·W_ch) products of its forward and
  gradient, no elementwise work.
  (``np.dot``, not ``np.matmul``: for a batch of one, ``np.matmul`` computes the outer
  product [x,h]ᵀ·dG in a non-BLAS loop about ten times slower.)

Every library is limited to ``--threads`` threads (default 1, so that on a shared machine the
figures compare implementations rather than thread scheduling); rounds are interleaved and
each figure is the median time per call over ``--repeats`` rounds (calls shorter than
``--min-round`` are repeated within a round). The ratios are what to read: cpu/BLAS is the
cost of everything that is not a matmul (elementwise kernels, validation, dispatch,
allocation); cpu/torch and cpu/tf compare with the peers. The last column is cpu's FLOP rate:
the model's matmuls (``model_flops``) over its median, and its fraction of the peak, one large
matmul's rate with the same threads, measured first (``_harness.matmul_peak``).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (  # noqa: E402
    describe_machine,
    describe_peak,
    duration,
    flop_rate,
    gate_flops,
    limit_threads,
    matmul_peak,
    missing,
    pin_peer_threads,
    ratio,
    summarize,
    table,
    time_interleaved,
)

SIZES = [(1, 32, 32), (16, 128, 128), (64, 256, 256), (128, 512, 512)]
CELLS = ("lstm", "gru", "gru-reset-after")
DTYPE = np.float32


def model_flops(cell, size):
    """The FLOPs of one step's gate products, forward and full gradient
    (``_harness.gate_flops``): the LSTM's 4H wide, the GRU's 3H (the reset-after gradient's
    recompute of ``h·W_ch`` is not counted)."""
    batch, n_in, hidden = size
    return gate_flops(batch, n_in, hidden, (4 if cell == "lstm" else 3) * hidden)


# -- inputs -----------------------------------------------------------------------------------


def lstm_inputs(batch, n_in, hidden, seed=0):
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(n_in + hidden)
    return {
        "x": rng.standard_normal((batch, n_in), dtype=DTYPE),
        "cs_prev": rng.standard_normal((batch, hidden), dtype=DTYPE),
        "h_prev": 0.5 * rng.standard_normal((batch, hidden), dtype=DTYPE),
        "w": (scale * rng.standard_normal((n_in + hidden, 4 * hidden))).astype(DTYPE),
        "b": 0.1 * rng.standard_normal(4 * hidden, dtype=DTYPE),
        "d_h": rng.standard_normal((batch, hidden), dtype=DTYPE),
        "d_cs": rng.standard_normal((batch, hidden), dtype=DTYPE),
    }


def gru_inputs(batch, n_in, hidden, reset_after, seed=0):
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(n_in + hidden)
    return {
        "x": rng.standard_normal((batch, n_in), dtype=DTYPE),
        "h_prev": 0.5 * rng.standard_normal((batch, hidden), dtype=DTYPE),
        "w_ru": (scale * rng.standard_normal((n_in + hidden, 2 * hidden))).astype(DTYPE),
        "w_c": (scale * rng.standard_normal((n_in + hidden, hidden))).astype(DTYPE),
        "b_ru": 0.1 * rng.standard_normal(2 * hidden, dtype=DTYPE),
        "b_c": 0.1 * rng.standard_normal((2 if reset_after else 1) * hidden, dtype=DTYPE),
        "d_h": rng.standard_normal((batch, hidden), dtype=DTYPE),
    }


# -- gradcells --------------------------------------------------------------------------------


def gradcells_lstm(backend, size):
    import gradcells as gc

    a = lstm_inputs(*size)
    args = (a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])

    def run():
        state = gc.lstm_cell(*args, backend=backend)
        return gc.lstm_cell_grad(*args, state, d_h=a["d_h"], d_cs=a["d_cs"], backend=backend)

    return run


def gradcells_gru(backend, size, reset_after):
    import gradcells as gc

    a = gru_inputs(*size, reset_after)
    args = (a["x"], a["h_prev"], a["w_ru"], a["w_c"], a["b_ru"], a["b_c"])

    def run():
        state = gc.gru_cell(*args, reset_after=reset_after, backend=backend)
        return gc.gru_cell_grad(*args, state, d_h=a["d_h"], reset_after=reset_after,
                                backend=backend)

    return run


# -- the BLAS lower bound ---------------------------------------------------------------------


def blas_lstm(size):
    """[x,h]·w, dG·wᵀ, [x,h]ᵀ·dG into preallocated outputs."""
    batch, n_in, hidden = size
    a = lstm_inputs(*size)
    xh = np.concatenate([a["x"], a["h_prev"]], axis=1)
    w = a["w"]
    gates = np.empty((batch, 4 * hidden), DTYPE)
    d_gates = np.random.default_rng(1).standard_normal((batch, 4 * hidden), dtype=DTYPE)
    dxh = np.empty((batch, n_in + hidden), DTYPE)
    dw = np.empty_like(w)

    def run():
        np.dot(xh, w, out=gates)
        np.dot(d_gates, w.T, out=dxh)
        np.dot(xh.T, d_gates, out=dw)
        return dw

    return run


def blas_gru(size, reset_after):
    """Reset before: [x,h]·w_ru, [x,r∘h]·w_c, dc·w_cᵀ, [x,r∘h]ᵀ·dc, d_ru·w_ruᵀ, [x,h]ᵀ·d_ru.
    Reset after: [x,h]·w_ru, x·W_cx, h·W_ch, then for the gradient h·W_ch once more (the
    saved (r, u, c, h) do not hold it, so gradcells recomputes it, as the sequence bound in
    ``sequences.py`` counts it too), dc·W_cxᵀ, dn·W_chᵀ, d_ru·w_ruᵀ, xᵀ·dc, hᵀ·dn,
    [x,h]ᵀ·d_ru."""
    batch, n_in, hidden = size
    a = gru_inputs(*size, reset_after)
    rng = np.random.default_rng(1)
    x, h = a["x"], a["h_prev"]
    xh = np.concatenate([x, h], axis=1)
    w_ru, w_c = a["w_ru"], a["w_c"]
    w_cx, w_ch = w_c[:n_in], w_c[n_in:]
    ru = np.empty((batch, 2 * hidden), DTYPE)
    cand = np.empty((batch, hidden), DTYPE)
    rec = np.empty((batch, hidden), DTYPE)
    d_ru = rng.standard_normal((batch, 2 * hidden), dtype=DTYPE)
    d_c = rng.standard_normal((batch, hidden), dtype=DTYPE)
    d_n = rng.standard_normal((batch, hidden), dtype=DTYPE)
    dxh_1 = np.empty((batch, n_in + hidden), DTYPE)
    dxh_2 = np.empty((batch, n_in + hidden), DTYPE)
    dx_2 = np.empty((batch, n_in), DTYPE)
    dh_2 = np.empty((batch, hidden), DTYPE)
    dw_ru = np.empty_like(w_ru)
    dw_c = np.empty_like(w_c)

    def run_before():
        np.dot(xh, w_ru, out=ru)
        np.dot(xh, w_c, out=cand)           # [x, r∘h] has the shape of [x, h]
        np.dot(d_c, w_c.T, out=dxh_2)
        np.dot(xh.T, d_c, out=dw_c)
        np.dot(d_ru, w_ru.T, out=dxh_1)
        np.dot(xh.T, d_ru, out=dw_ru)
        return dw_ru

    def run_after():
        np.dot(xh, w_ru, out=ru)
        np.dot(x, w_cx, out=cand)
        np.dot(h, w_ch, out=rec)
        np.dot(h, w_ch, out=rec)            # the gradient's recompute
        np.dot(d_c, w_cx.T, out=dx_2)
        np.dot(d_n, w_ch.T, out=dh_2)
        np.dot(d_ru, w_ru.T, out=dxh_1)
        np.dot(x.T, d_c, out=dw_c[:n_in])
        np.dot(h.T, d_n, out=dw_c[n_in:])
        np.dot(xh.T, d_ru, out=dw_ru)
        return dw_ru

    return run_after if reset_after else run_before


# -- peers ------------------------------------------------------------------------------------


def torch_cell(kind, size):
    import torch

    batch, n_in, hidden = size
    torch.manual_seed(0)
    cell = getattr(torch.nn, kind)(n_in, hidden)
    params = tuple(cell.parameters())
    a = lstm_inputs(*size)
    x = torch.tensor(a["x"], requires_grad=True)
    h0 = torch.tensor(a["h_prev"], requires_grad=True)
    c0 = torch.tensor(a["cs_prev"], requires_grad=True)
    d_h, d_cs = torch.tensor(a["d_h"]), torch.tensor(a["d_cs"])

    if kind == "LSTMCell":
        def run():
            h, c = cell(x, (h0, c0))
            return torch.autograd.grad((h, c), (x, h0, c0, *params), (d_h, d_cs))
    else:
        def run():
            h = cell(x, h0)
            return torch.autograd.grad((h,), (x, h0, *params), (d_h,))

    return run


def tf_lstm(size):
    import tensorflow as tf

    batch, n_in, hidden = size
    a = {k: tf.constant(v) for k, v in lstm_inputs(*size).items()}
    zeros = tf.zeros(hidden, DTYPE)

    @tf.function
    def step(x, cs_prev, h_prev, w, b, d_h, d_cs):
        i, cs, f, o, ci, co, _ = tf.raw_ops.LSTMBlockCell(
            x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=zeros, wcf=zeros, wco=zeros, b=b,
            forget_bias=1.0, cell_clip=0.0, use_peephole=False)
        cs_prev_grad, dicfo, _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
            x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=zeros, wcf=zeros, wco=zeros, b=b,
            i=i, cs=cs, f=f, o=o, ci=ci, co=co, cs_grad=d_cs, h_grad=d_h, use_peephole=False)
        xh_grad = tf.matmul(dicfo, w, transpose_b=True)
        w_grad = tf.matmul(tf.concat([x, h_prev], 1), dicfo, transpose_a=True)
        b_grad = tf.raw_ops.BiasAddGrad(out_backprop=dicfo)
        return xh_grad[:, :n_in], cs_prev_grad, xh_grad[:, n_in:], w_grad, b_grad

    def run():
        return step(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], a["d_h"], a["d_cs"])

    return run


def tf_gru(size):
    import tensorflow as tf

    a = {k: tf.constant(v) for k, v in gru_inputs(*size, reset_after=False).items()}

    @tf.function
    def step(x, h_prev, w_ru, w_c, b_ru, b_c, d_h):
        r, u, c, _ = tf.raw_ops.GRUBlockCell(x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru,
                                             b_c=b_c)
        d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = tf.raw_ops.GRUBlockCellGrad(
            x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c, r=r, u=u, c=c, d_h=d_h)
        d_w_ru = tf.matmul(tf.concat([x, h_prev], 1), d_r_bar_u_bar, transpose_a=True)
        d_b_ru = tf.raw_ops.BiasAddGrad(out_backprop=d_r_bar_u_bar)
        d_w_c = tf.matmul(tf.concat([x, h_prev * r], 1), d_c_bar, transpose_a=True)
        d_b_c = tf.raw_ops.BiasAddGrad(out_backprop=d_c_bar)
        return d_x, d_h_prev, d_w_ru, d_w_c, d_b_ru, d_b_c

    def run():
        return step(a["x"], a["h_prev"], a["w_ru"], a["w_c"], a["b_ru"], a["b_c"], a["d_h"])

    return run


# -- the table --------------------------------------------------------------------------------


def contestants_for(cell, size, skip):
    """``{column: run}`` for one cell and size; a peer that cannot run is left out."""
    out = {}
    if cell == "lstm":
        out["cpu"] = gradcells_lstm("cpu", size)
        out["BLAS"] = blas_lstm(size)
        if "torch" not in skip:
            out["torch"] = torch_cell("LSTMCell", size)
        if "tf" not in skip:
            out["tf"] = tf_lstm(size)
        if "reference" not in skip:
            out["reference"] = gradcells_lstm("reference", size)
        return out
    reset_after = cell == "gru-reset-after"
    out["cpu"] = gradcells_gru("cpu", size, reset_after)
    out["BLAS"] = blas_gru(size, reset_after)
    if reset_after and "torch" not in skip:
        out["torch"] = torch_cell("GRUCell", size)
    if not reset_after and "tf" not in skip:
        out["tf"] = tf_gru(size)
    if "reference" not in skip:
        out["reference"] = gradcells_gru("reference", size, reset_after)
    return out


PEER_LABELS = {
    "lstm": {"torch": "torch LSTMCell", "tf": "tf LSTMBlockCell"},
    "gru": {"tf": "tf GRUBlockCell"},
    "gru-reset-after": {"torch": "torch GRUCell"},
}
COLUMNS = ("cpu", "BLAS", "torch", "tf", "reference")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None, help="B,I,H triples")
    parser.add_argument("--cells", default=",".join(CELLS),
                        help="comma list of " + ", ".join(CELLS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--min-round", type=float, default=0.005,
                        help="seconds: shorter calls are repeated within a round")
    parser.add_argument("--skip", default="", help="comma list of: reference, torch, tf")
    parser.add_argument("--peak-size", type=int, default=2048,
                        help="N of the N³ matmul whose rate is the peak (matmul_peak)")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    cells = [c for c in args.cells.split(",") if c]
    skip = set(filter(None, args.skip.split(",")))
    for peer, module in (("torch", "torch"), ("tf", "tensorflow")):
        reason = missing(module) if peer not in skip else None
        if reason:
            print(f"skipping {peer}: {reason}")
            skip.add(peer)

    pin_peer_threads(args.threads, torch="torch" not in skip, tensorflow="tf" not in skip)
    limiter = limit_threads(args.threads)  # noqa: F841 (kept alive for the whole run)
    peak = matmul_peak(args.peak_size)
    print(f"One step, forward + full gradient, float32. {describe_machine(args.threads)}.")
    print(describe_peak(peak, args.peak_size, args.threads))
    print(f"Median time per call over {args.repeats} interleaved rounds; "
          "ratios are cpu's time over the column's.\n")

    for cell in cells:
        labels = PEER_LABELS[cell]
        present = [c for c in COLUMNS if c in ("cpu", "BLAS", "reference") or c in labels]
        present = [c for c in present if c not in skip]
        rows = []
        for size in sizes:
            stats = summarize(time_interleaved(contestants_for(cell, size, skip),
                                               args.repeats, min_round_s=args.min_round))
            median = {name: s.median for name, s in stats.items()}
            spread = max(s.median / s.minimum for s in stats.values())
            rows.append(["({}, {}, {})".format(*size)]
                        + [duration(median[c]) if c in median else "-" for c in present]
                        + [ratio(median["cpu"], median.get(c)) for c in present[1:]]
                        + [flop_rate(model_flops(cell, size), median["cpu"], peak),
                           f"{spread:.2f}"])
            sys.stdout.flush()
        title = {"lstm": "LSTM", "gru": "GRU (reset before, TensorFlow's)",
                 "gru-reset-after": "GRU reset_after=True (PyTorch's)"}[cell]
        header = (["(B, I, H)"] + [labels.get(c, c) for c in present]
                  + [f"cpu/{c}" for c in present[1:]] + ["cpu GFLOP/s (of peak)", "median/min"])
        print(title)
        print(table(rows, header))
        print()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
