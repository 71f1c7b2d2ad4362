"""xLSTM's sLSTM (docs/spec.md §19): ``gc.slstm_sequence`` against xLSTM's vanilla PyTorch
``sLSTMCell``, forward + backward, float32.

    python benchmarks/slstm.py                        # (T, B, I, H, N) = (256, 16, 256, 256, 4)
    python benchmarks/slstm.py --size 64,8,64,64,2 --threads 2 --repeats 9

Contestants, each a forward and the gradient of ``<d_h, h>`` with respect to the input, the
initial state and every weight:

- ``gradcells cpu``: ``gc.slstm_sequence`` + ``gc.slstm_sequence_grad`` on NumPy arrays
  (``w [I, 4H]``: the input projection is part of the op);
- ``xlstm vanilla``: the input projection ``x·w`` as a torch product, then xLSTM's
  ``sLSTMCell(backend="vanilla")`` on it, under autograd (the target: gradcells at most
  0.5× its time), its parameters those of gradcells's run (``gc.layouts.slstm_to_xlstm``).

Every library is limited to ``--threads`` threads; rounds are interleaved
(``_harness.time_interleaved``), medians; ratios against xLSTM's.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import against_peer  # noqa: E402

PEER = "xlstm vanilla"


def inputs(steps, batch, n_in, hidden, heads, seed=0):
    rng = np.random.default_rng(seed)
    d = hidden // heads
    f32 = np.float32
    return {"x": rng.standard_normal((steps, batch, n_in), dtype=f32),
            "c0": np.zeros((batch, hidden), f32), "n0": np.zeros((batch, hidden), f32),
            "m0": np.zeros((batch, hidden), f32), "h0": np.zeros((batch, hidden), f32),
            "w": (rng.standard_normal((n_in, 4 * hidden)) / np.sqrt(n_in)).astype(f32),
            "r": (rng.standard_normal((heads, d, 4 * d)) / np.sqrt(d)).astype(f32),
            "b": (0.1 * rng.standard_normal(4 * hidden)).astype(f32),
            "d_h": rng.standard_normal((steps, batch, hidden), dtype=f32)}


ARGS = ("x", "c0", "n0", "m0", "h0", "w", "r", "b")


def gradcells_slstm(size):
    import gradcells as gc

    a = inputs(*size)
    args = [a[n] for n in ARGS]

    def run():
        seq = gc.slstm_sequence(*args, backend="cpu")
        return gc.slstm_sequence_grad(*args, seq, d_h=a["d_h"], backend="cpu")

    return run


def xlstm_vanilla(size):
    import torch
    from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig

    import gradcells as gc

    steps, batch, n_in, hidden, heads = size
    a = inputs(*size)
    cell = sLSTMCell(sLSTMCellConfig(hidden_size=hidden, num_heads=heads, backend="vanilla",
                                     dtype="float32", output_shape="SBH",
                                     enable_automatic_mixed_precision=False))
    kernel, bias = gc.layouts.slstm_to_xlstm(a["r"], a["b"])
    with torch.no_grad():
        cell._recurrent_kernel_.copy_(cell._recurrent_kernel_ext2int(torch.as_tensor(kernel)))
        cell._bias_.copy_(cell._bias_ext2int(torch.as_tensor(bias)))
    x = torch.from_numpy(np.ascontiguousarray(a["x"].transpose(1, 0, 2))).requires_grad_()
    w = torch.from_numpy(a["w"]).requires_grad_()
    state = torch.zeros((4, batch, hidden), requires_grad=True)
    d_h = torch.from_numpy(a["d_h"])

    def run():
        cell.zero_grad(set_to_none=True)
        x.grad = w.grad = state.grad = None
        out, _ = cell(x @ w, state)
        out.backward(d_h)
        return x.grad

    return run


def main(argv=None) -> int:
    return against_peer(argv, __doc__, what="sLSTM", size="256,16,256,256,4",
                        labels="T,B,I,H,N", repeats=5, ours={"gradcells cpu": gradcells_slstm},
                        peer=(PEER, "xlstm", xlstm_vanilla))


if __name__ == "__main__":
    raise SystemExit(main())
