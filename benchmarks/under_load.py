"""Sequences on a quiet machine and on a loaded one: the loaded/quiet ratio of each contestant.

    python benchmarks/under_load.py                          # LSTM, (50, 32, 128, 128)
    python benchmarks/under_load.py --cells lstm gru rnn --sizes 50,32,128,128 100,32,256,256

Each contestant is a sequence's forward plus BPTT, float32, at every library's default
threads (all the cores it may use: the configuration a user has). gradcells runs with its
BLAS-thread policy (``gradcells.cpu._threads``) and, as ``gradcells fixed``, with the BLAS's
own threads fixed for every call (``set_blas_threads``), which is what gradcells did before
the policy. The quiet phase times every contestant (rounds interleaved, medians); the loaded
phase starts one busy-loop process per core (each ends by itself after ``--load-s`` seconds
at most, and is stopped as soon as the phase is done) and times them again. Each
contestant's calls start ``PAUSE_S`` after the previous contestant's last: its threads
(OpenBLAS's, PyTorch's) keep spinning for a while after a call, and on cores the busy loops
already hold they would be a load on the next contestant that no user of that library
alone has (gradcells's LSTM measured 3.43× beside them, 1.87× alone). The ratio
loaded/quiet is the figure (docs/spec.md §17: at most 2.5). The machine's other work, if
any, is in both phases; the table names the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cells as cell_bench  # noqa: E402
import sequences as seq_bench  # noqa: E402
from _harness import missing, summarize, table, time_interleaved  # noqa: E402

PEERS = {"lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}


def busy_loop(deadline: float) -> None:
    """Spin until ``deadline`` (``time.time()``): one core's worth of other work."""
    while time.time() < deadline:
        pass


def fixed(run):
    """``run`` with the BLAS's own threads fixed for every gradcells call."""
    from threadpoolctl import threadpool_info

    from gradcells import cpu

    threads = max((lib["num_threads"] for lib in threadpool_info()
                   if lib["user_api"] == "blas"), default=1)

    def run_fixed():
        cpu.set_blas_threads(threads)
        try:
            return run()
        finally:
            cpu.set_blas_threads(None)

    return run_fixed


def contestants(cell, size):
    ours = (seq_bench.gradcells_gru("cpu", size, True) if cell == "gru"
            else getattr(seq_bench, f"gradcells_{cell}")("cpu", size))
    out = {"gradcells": ours, "gradcells fixed": fixed(ours)}
    if missing("torch") is None:
        out[f"torch nn.{PEERS[cell]}"] = seq_bench.torch_rnn(PEERS[cell], size)
    return out


PAUSE_S = 0.5
"""Sleep before each contestant's calls, so that the one before it has stopped spinning
(``_harness.time_interleaved``): the load is the busy loops, not the other contestants."""


def timed(runs, repeats, min_round_s):
    return {name: stats.median for name, stats in
            summarize(time_interleaved(runs, repeats, min_round_s=min_round_s,
                                       pause_s=PAUSE_S)).items()}


@contextlib.contextmanager
def busy_loops(count, lifetime_s=600.0):
    """``count`` busy-loop processes running for the body (each ends by itself after
    ``lifetime_s`` at most, and is stopped when the body ends)."""
    deadline = time.time() + lifetime_s
    context = multiprocessing.get_context("spawn")
    loads = [context.Process(target=busy_loop, args=(deadline,), daemon=True)
             for _ in range(count)]
    for process in loads:
        process.start()
    try:
        time.sleep(0.5)                       # the loops are running before timing starts
        yield
    finally:
        for process in loads:
            process.terminate()
            process.join()


def loaded(runs, repeats, min_round_s, load_s):
    """``timed`` with one busy-loop process per core running."""
    with busy_loops(os.cpu_count() or 1, load_s):
        return timed(runs, repeats, min_round_s)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", choices=tuple(PEERS), default=["lstm"])
    parser.add_argument("--sizes", nargs="+", default=["50,32,128,128"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-round", type=float, default=0.25,
                        help="seconds of calls per contestant and round at least: many of "
                             "the scheduler's time slices, whose share is the figure")
    parser.add_argument("--load-s", type=float, default=120.0,
                        help="the busy loops' lifetime at most (they stop with the phase)")
    args = parser.parse_args(argv)
    print(f"# {cell_bench.describe_machine(os.cpu_count() or 1)}; default threads; "
          f"medians of {args.repeats} rounds; load: {os.cpu_count()} busy-loop processes")
    rows = []
    for cell in args.cells:
        for text in args.sizes:
            size = tuple(int(n) for n in text.split(","))
            runs = contestants(cell, size)
            quiet = timed(runs, args.repeats, args.min_round)
            busy = loaded(runs, args.repeats, args.min_round, args.load_s)
            rows += [(cell, str(size), name, f"{quiet[name] * 1e3:.1f}",
                      f"{busy[name] * 1e3:.1f}", f"{busy[name] / quiet[name]:.2f}×")
                     for name in runs]
    print(table(rows, ("cell", "size", "contestant", "quiet ms", "loaded ms",
                       "loaded/quiet")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
