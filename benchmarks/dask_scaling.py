"""Scale-out over the batch with dask (docs/spec.md §13): ``gc.lstm_sequence`` forward +
``gc.lstm_sequence_grad`` on a ``dask.distributed`` cluster of worker processes against one
process on the whole batch, float32.

    python benchmarks/dask_scaling.py                          # (50, 4096, 128, 128), 5 rounds
    python benchmarks/dask_scaling.py --sizes 20,512,32,32 --repeats 1    # a quick look

Contestants, every one with one BLAS (and Numba) thread per process:

- ``one process``: ``gc.lstm_sequence`` + ``gc.lstm_sequence_grad`` on NumPy arrays, the
  whole batch (every gradient, ``x``'s included, in memory);
- ``dask, N workers``: the same calls on dask arrays chunked into N batch blocks, on a
  ``LocalCluster(n_workers=N, threads_per_worker=1, processes=True)``. The inputs (``x``, the
  initial states, the upstream ``d_h``) are persisted on the workers first, as a user's data
  would be; each call builds the graph, runs the forward and the gradient in the workers and
  gathers the weight gradients (tree-reduced over the blocks); the per-row results stay on
  the workers.

Rounds are interleaved (``_harness.time_interleaved``); the table shows the median and the
minimum over the rounds and each contestant's speed-up over ``one process`` (the 1-worker
cluster's is its overhead): the ratio of the medians, and the median over the rounds of
the ratio within a round (contestants of one round ran seconds apart, so on a busy machine
this one is the steadier). On a machine with fewer free cores than workers the speed-up
cannot reach N.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import warnings

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_name] = "1"          # before NumPy loads BLAS; the workers inherit it

import numpy as np  # noqa: E402
from _harness import (  # noqa: E402
    duration,
    limit_threads,
    missing,
    ratio,
    summarize,
    table,
    time_interleaved,
)

import gradcells as gc  # noqa: E402


def _inputs(steps, batch, n_in, hidden, seed=0):
    """The sequence's arguments and the upstream gradient, float32."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(n_in + hidden)
    return {"x": rng.standard_normal((steps, batch, n_in), dtype=np.float32),
            "cs0": rng.standard_normal((batch, hidden), dtype=np.float32),
            "h0": rng.standard_normal((batch, hidden), dtype=np.float32),
            "w": (rng.standard_normal((n_in + hidden, 4 * hidden)) * scale).astype(np.float32),
            "b": np.zeros(4 * hidden, dtype=np.float32),
            "d_h": rng.standard_normal((steps, batch, hidden), dtype=np.float32)}


def _forward_and_gradient(args):
    """One forward and the gradient from ``d_h``: the gradient tuple."""
    d_h, arrays = args["d_h"], {k: v for k, v in args.items() if k != "d_h"}
    seq = gc.lstm_sequence(**arrays)
    return gc.lstm_sequence_grad(**arrays, seq=seq, d_h=d_h)


def _cluster(n_workers, inputs):
    """A LocalCluster of ``n_workers`` processes, its client and the inputs persisted on it
    in ``n_workers`` batch blocks."""
    import dask.array as da
    from dask.distributed import Client, LocalCluster
    from dask.distributed import wait as distributed_wait

    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                           dashboard_address=":0", memory_limit=0,
                           silence_logs=logging.ERROR)
    client = Client(cluster, set_as_default=False)
    batch = inputs["x"].shape[1]
    chunk = -(-batch // n_workers)
    lazy = {}
    for name, a in inputs.items():
        if batch in a.shape[:2]:
            axis = a.shape.index(batch)
            lazy[name] = da.from_array(a, chunks=tuple(chunk if k == axis else -1
                                                       for k in range(a.ndim)))
        else:
            lazy[name] = a                   # the weights: NumPy, given whole to each block
    arrays = [k for k, v in lazy.items() if isinstance(v, da.Array)]
    with warnings.catch_warnings():     # "Sending large graph": the inputs, shipped once
        warnings.simplefilter("ignore", UserWarning)
        persisted = client.persist([lazy[k] for k in arrays])
        with client.as_current():
            distributed_wait(persisted)
    lazy.update(zip(arrays, persisted, strict=True))
    return cluster, client, lazy


def _runner(client, lazy):
    def run():
        grads = _forward_and_gradient(lazy)
        client.gather(client.compute([grads.w, grads.b]))
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,4096,128,128", help="T,B,I,H")
    parser.add_argument("--workers", default="1,2", help="cluster sizes to time")
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args(argv)
    reason = missing("distributed")
    if reason:
        print(f"dask_scaling: {reason}")
        return
    steps, batch, n_in, hidden = (int(s) for s in options.sizes.split(","))
    limiter = limit_threads(1)   # noqa: F841 (kept: it restores the limits when collected)
    inputs = _inputs(steps, batch, n_in, hidden)
    contestants = {"one process": lambda: _forward_and_gradient(inputs)}
    clusters = []
    try:
        for n in (int(s) for s in options.workers.split(",")):
            cluster, client, lazy = _cluster(n, inputs)
            clusters.append((cluster, client))
            contestants[f"dask, {n} worker{'s' * (n > 1)}"] = _runner(client, lazy)
        times = time_interleaved(contestants, options.repeats, settle=0)
    finally:
        for cluster, client in clusters:
            client.close()
            cluster.close()
    stats, base = summarize(times), times["one process"]
    rows = [[name, duration(s.median), duration(s.minimum),
             ratio(stats["one process"].median, s.median),
             f"{statistics.median(b / t for b, t in zip(base, times[name], strict=True)):.2f}×"]
            for name, s in stats.items()]
    print(f"LSTM sequence forward + gradient, float32, (T, B, I, H) = {options.sizes}, "
          f"one BLAS thread per process, {os.cpu_count()} CPUs, median of {options.repeats}")
    print()
    print(table(rows, ["contestant", "median", "minimum", "speed-up (medians)",
                       "speed-up (median of rounds)"]))


if __name__ == "__main__":
    main()
