"""The CPU backend's kept scratch buffer against fresh scratch arrays in every call.

Each configuration runs in new processes that run nothing else (float32, forward + BPTT,
one thread).

    python benchmarks/scratch.py
    python benchmarks/scratch.py --sizes 50,32,128,128 --cells gru-reset-after --repeats 5

Whether fresh arrays of a few MiB cost page faults depends on the process's history: glibc
returns freed blocks above its (adaptive) mmap threshold to the kernel, and every page of the
next such block then faults on first write. A process that runs only the sequence op shows
it; in ``benchmarks/sequences.py``, where other contestants' allocations have already raised
the threshold, both ways run alike. ``fresh`` replaces the backend's ``scratch`` with
``np.empty`` per array (the allocation of the code before the buffer was kept).

Each process times ``--calls`` calls after three untimed ones and counts its minor page
faults (``resource.getrusage``, so Unix only); the table gives, per configuration, the median
over ``--repeats`` processes (run alternately) of each process's median time per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import table  # noqa: E402

SIZES = [(50, 32, 128, 128), (100, 32, 256, 256)]
CELLS = ("lstm", "gru", "gru-reset-after")

# One process: build inputs, run the op, report median seconds per call and faults per call.
# It builds its own inputs rather than calling sequences.gradcells_lstm/_gru: whether fresh
# scratch faults depends on what the process allocated before, and with those builders no
# configuration faulted in two runs (GRUs at the two larger sizes), hiding what this measures.
_CHILD = r"""
import json, resource, statistics, sys, time
import numpy as np
from threadpoolctl import threadpool_limits
import gradcells as gc
from gradcells.cells.gru import cpu as gru
from gradcells.cells.lstm import cpu as lstm

cell, mode, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps, batch, n_in, hidden = map(int, sys.argv[4].split(","))
if mode == "fresh":
    lstm.scratch = gru.scratch = lambda dtype, *shapes: [np.empty(s, dtype) for s in shapes]
rng = np.random.default_rng(0)
f32 = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)
x, h0, d_h = f32(steps, batch, n_in), f32(batch, hidden), f32(steps, batch, hidden)
if cell == "lstm":
    cs0, w, b = f32(batch, hidden), f32(n_in + hidden, 4 * hidden), f32(4 * hidden)
    def run():
        seq = gc.lstm_sequence(x, cs0, h0, w, b)
        gc.lstm_sequence_grad(x, cs0, h0, w, b, seq, d_h=d_h)
else:
    after = cell == "gru-reset-after"
    w_ru, w_c = f32(n_in + hidden, 2 * hidden), f32(n_in + hidden, hidden)
    b_ru, b_c = f32(2 * hidden), f32((2 if after else 1) * hidden)
    def run():
        seq = gc.gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, reset_after=after)
        gc.gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, seq, d_h=d_h, reset_after=after)
with threadpool_limits(1):
    for _ in range(3):
        run()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(json.dumps({"seconds": statistics.median(times), "faults": faults / calls}))
"""


def measure(cell, mode, size, calls):
    done = subprocess.run([sys.executable, "-c", _CHILD, cell, mode, str(calls),
                           ",".join(map(str, size))],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None, help="T,B,I,H tuples")
    parser.add_argument("--cells", default=",".join(CELLS))
    parser.add_argument("--repeats", type=int, default=3, help="processes per configuration")
    parser.add_argument("--calls", type=int, default=15, help="timed calls per process")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    print(f"float32, forward + BPTT, one thread; median over {args.repeats} new processes of "
          f"each one's median of {args.calls} calls\n")
    rows = []
    for cell in args.cells.split(","):
        for size in sizes:
            runs = {"kept": [], "fresh": []}
            for _ in range(args.repeats):
                for mode in runs:
                    runs[mode].append(measure(cell, mode, size, args.calls))
            kept, fresh = ({key: statistics.median(r[key] for r in runs[mode])
                            for key in ("seconds", "faults")} for mode in ("kept", "fresh"))
            rows.append((cell, size, f"{kept['seconds'] * 1e3:.1f}", f"{kept['faults']:.0f}",
                         f"{fresh['seconds'] * 1e3:.1f}", f"{fresh['faults']:.0f}",
                         f"{fresh['seconds'] / kept['seconds']:.2f}×"))
    print(table(rows, ("cell", "(T, B, I, H)", "kept ms", "kept faults/call", "fresh ms",
                       "fresh faults/call", "fresh/kept")))


if __name__ == "__main__":
    main()
