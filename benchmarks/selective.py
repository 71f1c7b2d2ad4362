"""Mamba's selective scan (docs/spec.md §18.4, §18.5): ``gc.selective_scan`` against
mamba_ssm's ``selective_scan_ref`` (plain PyTorch), forward + backward, float32.

    python benchmarks/selective.py                     # (Bt, Dm, N, L) = (4, 256, 16, 1024)
    python benchmarks/selective.py --size 2,64,16,256 --threads 2 --repeats 5

Contestants, each a forward (D, z, delta_bias, softplus: Mamba's block's call) and the
gradient of ``<d_y, y>`` with respect to every input:

- ``gradcells cpu``: ``gc.selective_scan`` + ``gc.selective_scan_grad`` on NumPy arrays;
- ``selective_scan_ref``: mamba_ssm's reference under autograd (the target: gradcells at
  most 0.5× its time), its definition read from the installed file
  (``gradcells.audit.mamba``: nothing of the package imported, no Triton, no CUDA).

Every library is limited to ``--threads`` threads; rounds are interleaved
(``_harness.time_interleaved``), medians; ratios against the reference's. At the default
size the reference takes tens of seconds a call on a CPU (its einsums materialise
``[Bt, Dm, L, N]``, its loop runs L small steps): keep ``--repeats`` small.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (  # noqa: E402
    limit_threads,
    pin_peer_threads,
    ratio,
    summarize,
    table,
    time_interleaved,
)
from cells import describe_machine  # noqa: E402

PEER = "selective_scan_ref"
ARGS = ("u", "delta", "A", "B", "C")


def inputs(batch, channels, state, steps, seed=0):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return {"u": rng.standard_normal((batch, channels, steps), dtype=f32),
            "delta": rng.standard_normal((batch, channels, steps), dtype=f32),
            "A": -np.exp(rng.standard_normal((channels, state))).astype(f32),
            "B": rng.standard_normal((batch, state, steps), dtype=f32),
            "C": rng.standard_normal((batch, state, steps), dtype=f32),
            "D": np.ones(channels, f32), "z": rng.standard_normal((batch, channels, steps),
                                                                  dtype=f32),
            "delta_bias": np.zeros(channels, f32),
            "d_y": rng.standard_normal((batch, channels, steps), dtype=f32)}


def gradcells_selective(size):
    import gradcells as gc

    a = inputs(*size)
    args = [a[n] for n in ARGS]
    kw = {"D": a["D"], "z": a["z"], "delta_bias": a["delta_bias"]}

    def run():
        result = gc.selective_scan(*args, **kw, delta_softplus=True, backend="cpu")
        return gc.selective_scan_grad(*args, result, **kw, d_y=a["d_y"], backend="cpu")

    return run


def reference_selective(size):
    from gradcells.audit.mamba import _reference

    torch, reference = _reference()
    a = inputs(*size)
    names = (*ARGS, "D", "z", "delta_bias")
    tensors = {n: torch.from_numpy(a[n]).requires_grad_() for n in names}
    d_y = torch.from_numpy(a["d_y"])

    def run():
        for t in tensors.values():
            t.grad = None
        out = reference(**tensors, delta_softplus=True)
        out.backward(d_y)
        return tensors["u"].grad

    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4,256,16,1024", help="Bt,Dm,N,L")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    size = tuple(int(n) for n in args.size.split(","))
    pin_peer_threads(args.threads, tensorflow=False)
    limiter = limit_threads(args.threads)
    runs = {"gradcells cpu": gradcells_selective(size)}
    try:
        runs[PEER] = reference_selective(size)
    except ImportError as error:
        print(f"# {PEER} not run: {error}")
    stats = summarize(time_interleaved(runs, args.repeats))
    print(f"# {describe_machine(args.threads)}; selective scan (Bt, Dm, N, L) = {size}, "
          f"float32, forward + backward; medians of {args.repeats} rounds\n")
    peer = stats[PEER].median if PEER in stats else None
    print(table([(name, f"{s.median * 1e3:.1f}", f"{s.minimum * 1e3:.1f}",
                  ratio(s.median, peer)) for name, s in stats.items()],
                ("contestant", "median ms", "min ms", f"vs {PEER}")))
    del limiter
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
