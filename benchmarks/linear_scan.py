"""The linear scan (docs/spec.md §18.5): ``gc.linear_scan`` + ``gc.linear_scan_grad``,
float32, against the machine's copy bandwidth.

    python benchmarks/linear_scan.py                       # (T, B, D) = (4096, 8, 1024)
    python benchmarks/linear_scan.py --size 512,8,256 --repeats 9

Contestants, each on NumPy arrays with ``backend="cpu"``:

- ``gradcells <method>``: the forward and the gradient of ``<d_h, h>`` with respect to
  ``a``, ``b`` and ``h0``, ``method`` sequential and parallel;
- ``copy``: ``numpy.copyto`` of one ``[T, B, D]`` array (the bandwidth bound).

The bytes a fused forward and backward cannot avoid are eight ``[T, B, D]`` arrays (read
``a``, ``b``, write ``h``; read ``a``, ``d_h``, ``h``, write ``d_a``, ``d_b``); each
method's bandwidth is those bytes over its median time, and its fraction of the copy's
bandwidth (read and write) is what §18.5 asks to be at least 0.5. Rounds are interleaved
(``_harness.time_interleaved``), medians.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (  # noqa: E402
    describe_machine,  # noqa: E402
    limit_threads,
    summarize,
    table,
    time_interleaved,
)

ARRAYS = 8
"""The ``[T, B, D]`` arrays a forward and backward read or write at the least."""


def gradcells_scan(size, method):
    import gradcells as gc

    rng = np.random.default_rng(0)
    a = rng.uniform(0.9, 1.0, size).astype(np.float32)
    b, d_h = (rng.standard_normal(size, dtype=np.float32) for _ in range(2))
    h0 = np.zeros(size[1:], np.float32)

    def run():
        result = gc.linear_scan(a, b, h0, method=method, backend="cpu")
        return gc.linear_scan_grad(a, b, h0, result, d_h=d_h, backend="cpu")

    return run


def copy(size):
    source, target = np.ones(size, np.float32), np.empty(size, np.float32)
    return lambda: np.copyto(target, source)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4096,8,1024", help="T,B,D")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    size = tuple(int(n) for n in args.size.split(","))
    limiter = limit_threads(args.threads)
    runs = {f"gradcells {m}": gradcells_scan(size, m) for m in ("sequential", "parallel")}
    runs["copy"] = copy(size)
    stats = summarize(time_interleaved(runs, args.repeats, min_round_s=0.05))
    array_bytes = 4 * int(np.prod(size))
    copy_rate = 2 * array_bytes / stats["copy"].median
    print(f"# {describe_machine(args.threads)}; linear scan (T, B, D) = {size}, float32, "
          f"forward + backward; medians of {args.repeats} rounds\n")
    rows = []
    for name, s in stats.items():
        moved = 2 * array_bytes if name == "copy" else ARRAYS * array_bytes
        rate = moved / s.median
        rows.append((name, f"{s.median * 1e3:.2f}", f"{rate / 1e9:.2f}",
                     f"{rate / copy_rate:.2f}"))
    print(table(rows, ("contestant", "median ms", "GB/s", "of the copy's")))
    del limiter
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
