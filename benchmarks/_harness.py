"""Shared utilities for the side-by-side benchmarks in ``benchmarks/`` (never imported by
the library).

The rules every benchmark here follows, and that these helpers implement:

- **Side by side, interleaved.** Every contestant runs once per round, round after round,
  the order rotated each round (``time_interleaved``), so a disturbance from other
  processes hits all of them alike; the figures that matter are the **ratios** between
  contestants of one run.
- **Steady state.** In each round a contestant is called once untimed before its timed
  calls, so that the switch from the previous contestant (a peer's thread pool still
  spinning, caches and pages another contestant last used) is not charged to it.
- **Median of repeats**, with the minimum beside it (``summarize``): when the two differ much,
  the machine was busy and the figures are rough.
- **Short calls are batched**: a round calls a contestant enough times to last at least
  ``min_round_s`` (calibrated once), and the time per call is reported.
- **Same thread budget for everyone** (``limit_threads``, ``pin_peer_threads``): the
  comparison is between implementations, not between thread schedulers.
- **Peers are optional**: ``missing(module)`` says why a peer (torch, tensorflow) cannot run,
  and the benchmark prints that instead of failing.

Typical use::

    from _harness import limit_threads, pin_peer_threads, summarize, table, time_interleaved

    pin_peer_threads(1)            # torch / TensorFlow, before they start their pools
    limit_threads(1)               # BLAS/OpenMP pools already loaded, and Numba
    times = time_interleaved({"mine": run_mine, "peer": run_peer}, repeats=15,
                             min_round_s=0.005)
    stats = summarize(times)       # name -> Stats(median, minimum, calls)
    print(table(rows, header))
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from gradcells._core.report import markdown_table


def missing(module: str) -> str | None:
    """None when ``module`` can be imported, else a short reason (for the printed table)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{module} not installed"


def pin_peer_threads(n: int, *, torch: bool = True, tensorflow: bool = True) -> dict:
    """Import PyTorch and TensorFlow (when wanted and installed) and limit each to ``n``
    intra-op threads (TensorFlow: one inter-op thread). Call it before either has run an op:
    TensorFlow fixes its pools at first use. Returns ``{name: module}`` for those imported."""
    peers = {}
    if torch and missing("torch") is None:
        import torch as torch_module

        torch_module.set_num_threads(n)
        peers["torch"] = torch_module
    if tensorflow and missing("tensorflow") is None:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        peers["tensorflow"] = tf
    return peers


def limit_threads(n: int):
    """Limit the BLAS/OpenMP pools of every library loaded so far (threadpoolctl), and
    Numba's, to ``n`` threads. Returns the threadpoolctl limiter (keep a reference; it
    restores the old limits when closed)."""
    from threadpoolctl import threadpool_limits

    # Numba first: setting its threads starts its threading layer, which may load another
    # OpenMP runtime, and that must come under the limits set next.
    try:
        import numba

        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    except ImportError:
        pass
    return threadpool_limits(n)


def calls_per_round(run, min_round_s: float) -> int:
    """How many calls of ``run`` last at least ``min_round_s`` (from one timed call)."""
    if min_round_s <= 0:
        return 1
    start = time.perf_counter()
    run()
    single = time.perf_counter() - start
    return max(1, math.ceil(min_round_s / max(single, 1e-9)))


def time_interleaved(contestants: dict, repeats: int, *, min_round_s: float = 0.0,
                     warmup: int = 1, settle: int = 1, pause_s: float = 0.0) -> dict:
    """Seconds **per call** of each contestant in each round, rounds interleaved.

    ``contestants`` maps a name to a callable taking no arguments. Each is called ``warmup``
    times first (compilation, caches), then ``repeats`` rounds run every contestant in turn,
    the order rotated by one each round. A peer whose threads keep spinning after it returns
    (PyTorch's and TensorFlow's pools do, for a while) slows whoever runs next: rotation
    spreads that over every contestant instead of charging it to one (measured: 2.3× against
    1.3× the BLAS bound for the contestant that always followed PyTorch at 2 threads), and
    ``settle`` untimed calls before each contestant's timed ones keep it out of the figures
    (measured at 2 threads, GRU (50, 32, 128, 128): median 23.8 ms against a minimum of
    11.8 ms without them, 16.9 against 15.7 with one). Where other processes hold the
    cores, settling is not enough: the previous contestant's threads, still spinning, take
    the core from the next one (OpenBLAS's idle threads poll for a while before they sleep,
    ``OPENBLAS_THREAD_TIMEOUT``); ``pause_s`` of sleep before each contestant lets them
    sleep first (measured under load, gradcells's LSTM (50, 32, 128, 128): 3.43× its quiet
    time beside PyTorch and two fixed BLAS threads, 1.87× alone, 1.51× beside them with a
    0.5 s pause). In a round a contestant is then called ``calls_per_round(run,
    min_round_s)`` times (fixed at warm-up), timed, and the round's
    time divided by that count. Returns ``{name: [seconds]}``.
    """
    calls = {}
    for name, run in contestants.items():
        for _ in range(warmup):
            run()
        calls[name] = calls_per_round(run, min_round_s)
    times = {name: [] for name in contestants}
    order = list(contestants.items())
    for round_index in range(repeats):
        shift = round_index % len(order)
        for name, run in order[shift:] + order[:shift]:
            time.sleep(pause_s)
            for _ in range(settle):
                run()
            count = calls[name]
            start = time.perf_counter()
            for _ in range(count):
                run()
            times[name].append((time.perf_counter() - start) / count)
    return times


@dataclass(frozen=True)
class Stats:
    """Median and minimum seconds per call over the rounds, and how many rounds."""

    median: float
    minimum: float
    rounds: int


def summarize(times: dict) -> dict:
    """``{name: Stats}`` from the output of ``time_interleaved``."""
    return {name: Stats(statistics.median(ts), min(ts), len(ts)) for name, ts in times.items()}


def ratio(numerator: float | None, denominator: float | None) -> str:
    """``"0.83×"``, or ``"-"`` when either side is missing."""
    if numerator is None or denominator is None or denominator <= 0:
        return "-"
    return f"{numerator / denominator:.2f}×"


def duration(seconds: float) -> str:
    """Seconds in the unit that reads best: ``"37.2 µs"``, ``"4.10 ms"``, ``"1.25 s"``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def peak_mib(run) -> float:
    """``tracemalloc`` high-water mark of one call of ``run``, in MiB (NumPy reports its
    buffers to tracemalloc; PyTorch and TensorFlow do not)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def table(rows, header) -> str:
    """A Markdown table (pipes, padded columns) of ``rows`` under ``header``: the project's
    one table printer, ``gradcells._core.report``."""
    return "\n".join(markdown_table(header, rows))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``; else
    ``platform.processor()``, which may be empty)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# The vector extensions a table names, widest first, as LLVM (what Numba compiles for) sees
# the host: (feature, how a table writes it).
_VECTOR_FEATURES = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("fma", "FMA"),
                    ("amx-tile", "AMX"), ("neon", "NEON"), ("sve", "SVE"))


def vector_isa() -> str:
    """The host's vector instruction sets among ``_VECTOR_FEATURES``: ``"AVX2, FMA"``,
    ``"AVX-512, FMA, AMX"``."""
    from llvmlite import binding

    try:
        features = binding.get_host_cpu_features()
    except RuntimeError:          # LLVM cannot list them on this host
        return "vector ISA unknown"
    return ", ".join(label for name, label in _VECTOR_FEATURES if features.get(name)) or "none"


def describe_machine(threads):
    """The machine: its CPU's model, Numba's name for it and its vector ISA, the cores, the
    threads each library may use and the versions that ran: every table's first line."""
    import numba
    from llvmlite import binding

    cpu = numba.config.CPU_NAME or binding.get_host_cpu_name()
    versions = [f"numpy {np.__version__}", f"numba {numba.__version__}"]
    for name in ("torch", "tensorflow"):
        module = sys.modules.get(name)
        if module is not None:
            versions.append(f"{name} {module.__version__}")
    return (f"{cpu_model()}, {platform.machine()} ({cpu}: {vector_isa()}), "
            f"{os.cpu_count()} cores, {threads} thread(s) per library; {', '.join(versions)}")


PEAK_REPEATS = 5
"""The timed calls of ``matmul_peak``, of which the fastest counts."""


def matmul_peak(size: int = 2048, repeats: int = PEAK_REPEATS) -> float:
    """FLOP/s of NumPy's float32 ``size``³ matmul at the thread limits in force, the best of
    ``repeats`` calls after one warm-up: the practical peak that the benchmarks' fractions
    are of. A product this large runs the BLAS's kernels at their best, near the cores' FMA
    peak at the clock they really run (which a nominal peak from ``/proc/cpuinfo``'s clock
    misses: these cores boost above it)."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, a, out=out)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.matmul(a, a, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def describe_peak(peak: float, size: int, threads: int) -> str:
    """The line that states what the fractions of peak are of."""
    return (f"Peak: {peak / 1e9:.1f} GFLOP/s, NumPy's float32 {size}³ matmul with {threads} "
            f"thread(s) (best of {PEAK_REPEATS}); each GFLOP/s figure gives its fraction of "
            "that peak.")


def gate_flops(rows: int, n_in: int, n_state: int, width: int) -> int:
    """The FLOPs of a gate product ``[x, h]·W`` (``[rows, I+S]·[I+S, width]``) over a forward
    and its full gradient: once forward and three times back (``dX``, ``dH``, ``dW``), 2
    FLOPs a multiply-add, ``6·rows·(I+S)·width``."""
    return 6 * rows * (n_in + n_state) * width


def flop_rate(flops: float, seconds: float, peak: float) -> str:
    """``"74.1 (80%)"``: GFLOP/s of ``flops`` in ``seconds``, and its fraction of ``peak``
    (FLOP/s)."""
    rate = flops / seconds
    return f"{rate / 1e9:.1f} ({rate / peak:.0%})"


def against_peer(argv, doc, *, what, size, labels, repeats, ours, peer, digits=1) -> int:
    """The ``main`` of a benchmark of gradcells's contestants ``ours`` (``{name: make}``,
    ``make(size)`` returning one forward + backward call) against one peer package,
    ``peer = (name, module, make)``, run where ``module`` imports: ``--size`` (``labels``,
    default ``size``), ``--threads`` (every library limited to them), ``--repeats``
    interleaved rounds of at least 50 ms; prints the medians and the ratio to the peer's."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--size", default=size, help=labels)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=repeats)
    args = parser.parse_args(argv)
    shape = tuple(int(n) for n in args.size.split(","))
    pin_peer_threads(args.threads, tensorflow=False)
    limiter = limit_threads(args.threads)
    runs = {name: make(shape) for name, make in ours.items()}
    peer_name, module, make_peer = peer
    if missing(module) is None:
        runs[peer_name] = make_peer(shape)
    stats = summarize(time_interleaved(runs, args.repeats, min_round_s=0.05))
    print(f"# {describe_machine(args.threads)}; {what} ({labels.replace(',', ', ')}) = "
          f"{shape}, float32, forward + backward; medians of {args.repeats} rounds\n")
    reference = stats[peer_name].median if peer_name in stats else None
    print(table([(name, f"{s.median * 1e3:.{digits}f}", f"{s.minimum * 1e3:.{digits}f}",
                  ratio(s.median, reference)) for name, s in stats.items()],
                ("contestant", "median ms", "min ms", f"vs {peer_name}")))
    del limiter
    return 0
