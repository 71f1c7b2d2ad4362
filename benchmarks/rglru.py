"""The RG-LRU (docs/spec.md §18.3, §18.5): ``gc.rglru_sequence`` against recurrentgemma's
torch ``RGLRU`` layer, forward + backward, float32.

    python benchmarks/rglru.py                        # (T, B, D, N) = (512, 16, 256, 4)
    python benchmarks/rglru.py --size 64,4,64,2 --threads 2 --repeats 9

Contestants, each a forward and the gradient of ``<d_h, h>`` with respect to the input,
the initial state and every weight, with document boundaries (a reset every 128 steps):

- ``gradcells cpu``: ``gc.rglru_sequence`` + ``gc.rglru_sequence_grad`` on NumPy arrays,
  the true gradient (the bound changes no time);
- ``recurrentgemma torch``: ``recurrentgemma.torch.layers.RGLRU`` under autograd (the
  target: gradcells at most 0.5× its time), its parameters those of gradcells's run
  (``gc.layouts.rglru_to_recurrentgemma``), batch first as it takes it.

Every library is limited to ``--threads`` threads; rounds are interleaved
(``_harness.time_interleaved``), medians; ratios against recurrentgemma's.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import against_peer  # noqa: E402

PEER = "recurrentgemma torch"
ARGS = ("x", "h0", "w_a", "b_a", "w_x", "b_x", "lam")


def inputs(steps, batch, width, heads, seed=0):
    rng = np.random.default_rng(seed)
    d = width // heads
    f32 = np.float32
    resets = np.zeros((steps, batch), bool)
    resets[::128] = True
    return {"x": rng.standard_normal((steps, batch, width), dtype=f32),
            "h0": np.zeros((batch, width), f32),
            "w_a": (rng.standard_normal((heads, d, d)) / np.sqrt(d)).astype(f32),
            "b_a": np.zeros(width, f32),
            "w_x": (rng.standard_normal((heads, d, d)) / np.sqrt(d)).astype(f32),
            "b_x": np.zeros(width, f32),
            "lam": rng.uniform(-7.0, -2.0, width).astype(f32),
            "resets": resets, "d_h": rng.standard_normal((steps, batch, width), dtype=f32)}


def gradcells_rglru(size):
    import gradcells as gc

    a = inputs(*size)
    args = [a[n] for n in ARGS]

    def run():
        seq = gc.rglru_sequence(*args, resets=a["resets"], backend="cpu")
        return gc.rglru_sequence_grad(*args, seq, d_h=a["d_h"], backend="cpu")

    return run


def recurrentgemma_torch(size):
    import torch
    from recurrentgemma.torch.layers import RGLRU

    import gradcells as gc

    steps, batch, width, heads = size
    a = inputs(*size)
    layer = RGLRU(width=width, num_heads=heads, dtype=torch.float32)
    params = gc.layouts.rglru_to_recurrentgemma(*(a[n] for n in ARGS[2:]))
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    x = torch.from_numpy(np.ascontiguousarray(a["x"].transpose(1, 0, 2))).requires_grad_()
    positions = np.arange(steps) % 128
    segment_pos = torch.from_numpy(np.broadcast_to(positions, (batch, steps)).copy())
    d_h = torch.from_numpy(np.ascontiguousarray(a["d_h"].transpose(1, 0, 2)))

    def run():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        y, _ = layer(x, segment_pos)
        y.backward(d_h)
        return x.grad

    return run


def main(argv=None) -> int:
    return against_peer(argv, __doc__, what="RG-LRU", size="512,16,256,4", labels="T,B,D,N",
                        repeats=5, ours={"gradcells cpu": gradcells_rglru},
                        peer=(PEER, "recurrentgemma", recurrentgemma_torch))


if __name__ == "__main__":
    raise SystemExit(main())
