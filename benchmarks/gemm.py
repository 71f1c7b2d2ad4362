"""The recurrent products alone: float32 GFLOP/s of a sequence's per-step matmuls, against
the peak, side by side in one process.

    python benchmarks/gemm.py                      # the LSTM's products at the three sizes
    python benchmarks/gemm.py --threads 2 --repeats 15

A sequence's forward multiplies each step's state by the recurrent weights, ``h·W_h``
(B × 4H × H for the LSTM), and its backward each step's gate gradients by their transpose,
``dZ·W_hᵀ`` (B × H × 4H): T products each, in turn, that no batching can merge. They are
the matmuls whose rate decides how close a sequence can come to its peers (docs/
performance.md, "Issue 28's targets, remeasured"). Contestants, each doing the T forward and
the T backward products of one sequence into preallocated outputs:

- ``numpy [B, H]``: as ``gradcells/cells/lstm/cpu.py`` calls them, ``np.matmul(h, W_h)`` and
  ``np.matmul(dZ_t, W_hᵀ)`` with ``W_hᵀ`` copied C-contiguous once;
- ``numpy [H, B]``: the same products with the states held transposed, ``W_hᵀ·hᵀ`` and
  ``W_h·dZ_tᵀ``, which hands OpenBLAS the other operand order;
- ``torch.mm``: the first layout through PyTorch's BLAS (when installed).

Every library is limited to ``--threads`` threads; rounds are interleaved and the table
shows each contestant's median and its FLOP rate as a fraction of the peak, NumPy's float32
2048³ matmul with the same threads (``_harness.matmul_peak``).
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
    flop_rate,
    limit_threads,
    matmul_peak,
    missing,
    pin_peer_threads,
    summarize,
    table,
    time_interleaved,
)

SIZES = [(50, 32, 128), (100, 32, 256), (100, 64, 512)]   # (T, B, H) of sequences.py's sizes
DTYPE = np.float32


def operands(steps, batch, hidden, seed=0):
    """The LSTM's recurrent weights ``[H, 4H]``, a state ``[B, H]`` and every step's gate
    gradients ``[T, B, 4H]``."""
    rng = np.random.default_rng(seed)
    w_h = rng.standard_normal((hidden, 4 * hidden), dtype=DTYPE)
    h = rng.standard_normal((batch, hidden), dtype=DTYPE)
    d_gates = rng.standard_normal((steps, batch, 4 * hidden), dtype=DTYPE)
    return w_h, h, d_gates


def _products(mm, forward, backward):
    """``run()`` for one sequence's products: ``mm(a, b, out=out)`` of ``forward = (a, b,
    out)`` once a step, then of each step's ``(a, b, out)`` in ``backward``; it returns the
    two outputs."""

    def run():
        a, b, out = forward
        for _ in backward:
            mm(a, b, out=out)
        for a_t, b_t, out_t in backward:
            mm(a_t, b_t, out=out_t)
        return out, backward[-1][2]

    return run


def numpy_rows(size):
    """The products with the states ``[B, H]``, as gradcells calls them."""
    w_h, h, d_gates = operands(*size)
    w_h_t, d_h = np.ascontiguousarray(w_h.T), np.empty(h.shape, DTYPE)
    return _products(np.matmul, (h, w_h, np.empty(d_gates.shape[1:], DTYPE)),
                     [(d_step, w_h_t, d_h) for d_step in d_gates])


def numpy_columns(size):
    """The same products with the states held transposed, ``[H, B]``."""
    w_h, h, d_gates = operands(*size)
    w_h_t, d_h_t = np.ascontiguousarray(w_h.T), np.empty(h.T.shape, DTYPE)
    gates_t = np.empty(d_gates.shape[:0:-1], DTYPE)
    return _products(np.matmul, (w_h_t, np.ascontiguousarray(h.T), gates_t),
                     [(w_h, np.ascontiguousarray(d_step.T), d_h_t) for d_step in d_gates])


def torch_rows(size):
    """``numpy_rows`` through ``torch.mm``."""
    import torch

    w_h, h, d_gates = (torch.from_numpy(a) for a in operands(*size))
    w_h_t, d_h = w_h.T.contiguous(), torch.empty(h.shape)
    return _products(torch.mm, (h, w_h, torch.empty(d_gates.shape[1:])),
                     [(d_step, w_h_t, d_h) for d_step in d_gates])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None, help="T,B,H triples")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--skip", default="", help="comma list of: torch")
    parser.add_argument("--peak-size", type=int, default=2048,
                        help="N of the N³ matmul whose rate is the peak (matmul_peak)")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    use_torch = "torch" not in args.skip.split(",") and missing("torch") is None

    pin_peer_threads(args.threads, torch=use_torch, tensorflow=False)
    limiter = limit_threads(args.threads)  # noqa: F841 - keeps the limits in force
    peak = matmul_peak(args.peak_size)
    print(f"The LSTM's per-step products of one sequence, T of h·W_h and T of dZ·W_hᵀ, "
          f"float32; median of {args.repeats} interleaved rounds. "
          f"{describe_machine(args.threads)}.")
    print(describe_peak(peak, args.peak_size, args.threads) + "\n")
    rows = []
    for size in sizes:
        steps, batch, hidden = size
        contestants = {"numpy [B, H]": numpy_rows(size), "numpy [H, B]": numpy_columns(size)}
        if use_torch:
            contestants["torch.mm"] = torch_rows(size)
        stats = summarize(time_interleaved(contestants, args.repeats))
        flops = 2 * 2 * steps * batch * 4 * hidden * hidden
        rows.extend((f"({steps}, {batch}, {hidden})", name, f"{s.median * 1e3:.2f}",
                     flop_rate(flops, s.median, peak)) for name, s in stats.items())
    print(table(rows, ("(T, B, H)", "contestant", "median ms", "GFLOP/s (of peak)")))


if __name__ == "__main__":
    main()
