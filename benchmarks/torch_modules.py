"""``gradcells.torch.LSTM(peepholes=True, layer_norm=True)`` against the LN-LSTM a PyTorch user
writes with torch ops (docs/spec.md §13, §15): forward + backward, float32.

Contestants, each one forward and ``backward`` with an upstream gradient on every output
(the input, the initial states and every parameter require grad):

- ``gradcells.torch.LSTM, peepholes + LN``: the module with both options (its peepholes
  add three ``[B, H]`` products per step that the torch peer does not compute);
- ``gradcells.torch.LSTM, LN``: the module with the layer norm only, the peer's model
  (``ln_carry="raw"``; the module's forget bias is PyTorch's 0, the peer's 1: the same
  work);
- ``torch LN-LSTM`` and ``torch LN-LSTM, x hoisted``: ``benchmarks/sequences.py``'s
  ``torch_ln_lstm``, torch ops under autograd, without peepholes; the ratios are taken
  against the first;
- ``gradcells cpu, LN (NumPy)``: ``gc.lstm_sequence`` + ``gc.lstm_sequence_grad`` on NumPy
  arrays, the op the module wraps, so that the module's overhead (the layout conversion
  under autograd, the adapter's views) reads off as the ratio of the ``LN`` row to it.

Every library is limited to ``--threads`` threads (default 1); rounds are interleaved
(``_harness.time_interleaved``) and the table shows medians and minima over ``--repeats``
rounds. Run: ``PYTHONPATH=. python benchmarks/torch_modules.py [--size 50,32,128,128]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (  # noqa: E402
    limit_threads,
    missing,
    pin_peer_threads,
    ratio,
    summarize,
    table,
    time_interleaved,
)
from sequences import gradcells_lstm_ln, torch_ln_lstm  # noqa: E402

PEER = "torch LN-LSTM"
OP = "gradcells cpu, LN (NumPy)"


def gradcells_module(size, **options):
    """One forward + backward of ``gradcells.torch.LSTM(I, H, **options)`` (float32)."""
    import torch

    from gradcells.torch import LSTM

    steps, batch, n_in, hidden = size
    torch.manual_seed(0)
    module = LSTM(n_in, hidden, **options)
    x = torch.randn(steps, batch, n_in, requires_grad=True)
    h0 = (0.5 * torch.randn(1, batch, hidden)).requires_grad_()
    c0 = (0.5 * torch.randn(1, batch, hidden)).requires_grad_()
    d_h = torch.randn(steps, batch, hidden)

    def run():
        module.zero_grad(set_to_none=True)
        x.grad = h0.grad = c0.grad = None
        out, _ = module(x, (h0, c0))
        out.backward(d_h)
        return x.grad

    return run


def contestants_for(size):
    out = {
        "gradcells.torch.LSTM, peepholes + LN": gradcells_module(size, peepholes=True,
                                                                 layer_norm=True),
        "gradcells.torch.LSTM, LN": gradcells_module(size, layer_norm=True),
        PEER: torch_ln_lstm(size),
        f"{PEER}, x hoisted": torch_ln_lstm(size, hoisted=True),
        OP: gradcells_lstm_ln("cpu", size),
    }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="50,32,128,128", help="T,B,I,H")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--min-round-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    if missing("torch"):
        print(f"skipped: {missing('torch')}")
        return
    size = tuple(int(v) for v in args.size.split(","))
    pin_peer_threads(args.threads, tensorflow=False)
    limiter = limit_threads(args.threads)  # noqa: F841 - keeps the limits in force
    contestants = contestants_for(size)
    stats = summarize(time_interleaved(contestants, args.repeats,
                                       min_round_s=args.min_round_s))
    rows = [(name, f"{s.median * 1e3:.2f}", f"{s.minimum * 1e3:.2f}",
             ratio(s.median, stats[PEER].median), ratio(s.median, stats[OP].median))
            for name, s in stats.items()]
    print(f"float32, forward + backward, (T, B, I, H) = {size}; {args.threads} thread(s); "
          f"median of {args.repeats} interleaved rounds\n")
    print(table(rows, ("contestant", "median ms", "min ms", f"vs {PEER}", f"vs {OP}")))


if __name__ == "__main__":
    main()
