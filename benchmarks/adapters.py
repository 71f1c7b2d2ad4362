"""The PyTorch adapter's overhead: ``gradcells.torch.lstm_sequence`` under autograd, eagerly
and under ``torch.compile``, against ``gc.lstm_sequence`` + ``gc.lstm_sequence_grad`` on
NumPy, float32, side by side.

    python benchmarks/adapters.py                          # (T, B, I, H) = (50, 32, 128, 128)
    python benchmarks/adapters.py --sizes 50,32,128,128 --repeats 15 --threads 1

Contestants, each one forward over all T steps and the full backward from an upstream
gradient ``g`` on every step's ``h`` (gradients for x, the initial states and the weights):

- ``gradcells numpy``: ``gc.lstm_sequence`` then ``gc.lstm_sequence_grad(..., d_h=g)``,
  its gradients held until the next call (as the ``.grad`` fields hold PyTorch's: the same
  buffers' lifetimes, so the allocator sees the same pattern);
- ``gradcells.torch``: ``gradcells.torch.lstm_sequence`` on leaf tensors requiring grad
  (zero-copy views of the same arrays), then ``(seq.h * g).sum().backward()`` (the ``.grad``
  fields cleared each call, so that PyTorch writes rather than accumulates);
- ``gradcells.torch compiled``: the same forward and loss as one
  ``torch.compile(fullgraph=True)`` function (the custom ops ``torch.ops.gradcells.*``,
  docs/adapters.md), then ``backward()``; compiled in the warm-up call, not timed.

The target (docs/spec.md §13): the adapter within 10 % of the NumPy call. Rounds interleaved,
medians over ``--repeats`` (``_harness``); inputs as ``benchmarks/sequences.py``'s.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (  # noqa: E402
    duration,
    limit_threads,
    missing,
    pin_peer_threads,
    ratio,
    summarize,
    table,
    time_interleaved,
)
from sequences import lstm_inputs  # noqa: E402


def contestants(size):
    import torch

    import gradcells as gc
    import gradcells.torch as gtorch

    arrays = lstm_inputs(*size)
    g = arrays.pop("d_h")
    leaves = {k: torch.from_numpy(v).requires_grad_() for k, v in arrays.items()}
    g_tensor = torch.from_numpy(g)

    held = {}

    def numpy_run():
        held.clear()
        seq = gc.lstm_sequence(**arrays, backend="cpu")
        held["grads"] = gc.lstm_sequence_grad(**arrays, seq=seq, d_h=g, backend="cpu")

    def loss(leaves):
        return (gtorch.lstm_sequence(**leaves, backend="cpu").h * g_tensor).sum()

    def runner(forward):
        def run():
            for t in leaves.values():
                t.grad = None
            forward(leaves).backward()
        return run

    return {"gradcells numpy": numpy_run, "gradcells.torch": runner(loss),
            "gradcells.torch compiled": runner(torch.compile(loss, fullgraph=True))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,32,128,128", help="T,B,I,H")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if missing("torch"):
        print(f"skipped: {missing('torch')}")
        return
    pin_peer_threads(args.threads, tensorflow=False)
    limiter = limit_threads(args.threads)  # noqa: F841 (kept while the benchmark runs)
    size = tuple(int(n) for n in args.sizes.split(","))
    stats = summarize(time_interleaved(contestants(size), args.repeats, min_round_s=0.05))
    base = stats["gradcells numpy"].median
    rows = [[name, duration(s.median), duration(s.minimum), ratio(s.median, base)]
            for name, s in stats.items()]
    print(f"LSTM sequence forward + backward, (T, B, I, H) = {size}, float32, "
          f"{args.threads} thread(s)\n")
    print(table(rows, ["contestant", "median", "min", "vs numpy"]))


if __name__ == "__main__":
    main()
