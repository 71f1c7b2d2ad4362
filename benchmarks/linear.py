"""The linear recurrences (docs/spec.md §18.5): ``gc.mingru_sequence`` against
minGRU-pytorch's minGRU, forward + backward, float32.

    python benchmarks/linear.py                          # (T, B, I, H) = (1024, 16, 256, 256)
    python benchmarks/linear.py --size 256,8,64,64 --threads 2 --repeats 9

Contestants, each a forward and the gradient of ``<d_h, h>`` with respect to the input, the
initial state and the weights:

- ``gradcells <method>``: ``gc.mingru_sequence`` + ``gc.mingru_sequence_grad`` on NumPy
  arrays, ``method`` sequential, parallel and auto (``backend="cpu"``);
- ``minGRU-pytorch parallel``: its ``minGRU`` layer (bias-free, as gradcells's ``b = 0``)
  on the whole sequence, its log-space scan, under autograd (the target: gradcells at most
  0.5× its time). Its initial state is positive, as its log space needs.

Every library is limited to ``--threads`` threads; rounds are interleaved
(``_harness.time_interleaved``), medians; ratios against minGRU-pytorch's.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import against_peer  # noqa: E402

PEER = "minGRU-pytorch parallel"


def inputs(steps, batch, n_in, hidden, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, steps, n_in), dtype=np.float32),
            "h0": rng.uniform(0.1, 1.0, (batch, hidden)).astype(np.float32),
            "w": (rng.standard_normal((n_in, 2 * hidden)) / np.sqrt(n_in)).astype(np.float32),
            "b": np.zeros(2 * hidden, np.float32),
            "d_h": rng.standard_normal((batch, steps, hidden), dtype=np.float32)}


def gradcells_mingru(size, method):
    import gradcells as gc

    a = inputs(*size)
    args = (a["x"], a["h0"], a["w"], a["b"])

    def run():
        seq = gc.mingru_sequence(*args, method=method, batch_first=True, backend="cpu")
        return gc.mingru_sequence_grad(*args, seq, d_h=a["d_h"], backend="cpu")

    return run


def mingru_pytorch(size):
    import torch
    from minGRU_pytorch.minGRU import minGRU

    a = inputs(*size)
    hidden = size[3]
    layer = minGRU(size[2])
    if size[2] != hidden:
        raise ValueError("minGRU-pytorch's layer has I = H (without its projection)")
    with torch.no_grad():     # gradcells's w: gate columns, then the candidate's
        layer.to_hidden_and_gate.weight.copy_(torch.from_numpy(
            np.concatenate([a["w"][:, hidden:].T, a["w"][:, :hidden].T])))
    x = torch.from_numpy(a["x"]).requires_grad_()
    h0 = torch.from_numpy(a["h0"][:, None]).requires_grad_()
    d_h = torch.from_numpy(a["d_h"])

    def run():
        layer.zero_grad(set_to_none=True)
        x.grad = h0.grad = None
        layer(x, h0).backward(d_h)
        return x.grad

    return run


def main(argv=None) -> int:
    ours = {f"gradcells {m}": functools.partial(gradcells_mingru, method=m)
            for m in ("sequential", "parallel", "auto")}
    return against_peer(argv, __doc__, what="minGRU", size="1024,16,256,256",
                        labels="T,B,I,H", repeats=7, ours=ours,
                        peer=(PEER, "minGRU_pytorch", mingru_pytorch), digits=2)


if __name__ == "__main__":
    raise SystemExit(main())
