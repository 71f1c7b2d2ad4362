"""The linear scan (docs/spec.md §18.5): ``gc.linear_scan`` + ``gc.linear_scan_grad``,
float32, against the machine's copy bandwidth.

    python benchmarks/linear_scan.py                       # (T, B, D) = (4096, 8, 1024)
    python benchmarks/linear_scan.py --size 512,8,256 --repeats 9
    python benchmarks/linear_scan.py --sweep          # parallel / sequential over sizes

Contestants, each on NumPy arrays with ``backend="cpu"``:

- ``gradcells <method>``: the forward and the gradient of ``<d_h, h>`` with respect to
  ``a``, ``b`` and ``h0``, ``method`` sequential and parallel;
- ``copy``: ``numpy.copyto`` of one ``[T, B, D]`` array (the bandwidth bound).

The bytes a fused forward and backward cannot avoid are eight ``[T, B, D]`` arrays (read
``a``, ``b``, write ``h``; read ``a``, ``d_h``, ``h``, write ``d_a``, ``d_b``); each
method's bandwidth is those bytes over its median time, and its fraction of the copy's
bandwidth (read and write) is what §18.5 asks to be at least 0.5. Rounds are interleaved
(``_harness.time_interleaved``), medians.

``--sweep`` times the two methods alone over ``SWEEP``'s sizes (T steps, B·D columns from one
to thousands) and prints the parallel method's time over the sequential's, and what
``method="auto"`` runs there on this machine: the measurement behind the CPU's "auto"
(``gradcells.cpu._scan.PARALLEL_FROM_CORES``).
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


SWEEP = [(t, 1, d) for t in (1024, 8192, 65536) for d in (1, 8, 64, 512, 4096)
         if t * d <= 2 ** 25]
"""``--sweep``'s sizes: at most 2^25 elements an array."""


def auto_method(n_steps):
    """What ``method="auto"`` runs on this machine's CPU for ``n_steps`` (the rule of
    ``gradcells.cpu._scan.sequence_scan``)."""
    from gradcells._core import scan
    from gradcells.cpu import _scan

    method = scan.scan_method("auto", n_steps)
    return "sequential" if _scan._cores() < _scan.PARALLEL_FROM_CORES else method


def sweep(repeats, threads):
    """``--sweep``'s table: each size's two medians, their ratio and "auto"'s choice."""
    rows = []
    for size in SWEEP:
        runs = {m: gradcells_scan(size, m) for m in ("sequential", "parallel")}
        stats = summarize(time_interleaved(runs, repeats, min_round_s=0.05))
        seq, par = stats["sequential"].median, stats["parallel"].median
        rows.append((f"{size}", f"{seq * 1e3:.2f}", f"{par * 1e3:.2f}", f"{par / seq:.2f}",
                     auto_method(size[0])))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(f"# {describe_machine(threads)}; linear scan, float32, forward + backward; "
          f"medians of {repeats} rounds\n")
    print(table(rows, ("(T, B, D)", "sequential ms", "parallel ms", "parallel/sequential",
                       "auto runs")))


def copy(size):
    source, target = np.ones(size, np.float32), np.empty(size, np.float32)
    return lambda: np.copyto(target, source)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4096,8,1024", help="T,B,D")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sweep", action="store_true",
                        help="the two methods over SWEEP's sizes, and what auto runs")
    args = parser.parse_args(argv)
    size = tuple(int(n) for n in args.size.split(","))
    limiter = limit_threads(args.threads)
    if args.sweep:
        sweep(args.repeats, args.threads)
        return 0
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
