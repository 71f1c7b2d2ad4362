"""What the time order and the layout cost (docs/spec.md §11.1, §11.2; docs/performance.md):
a sequence's forward + BPTT with ``reverse=True`` and with ``batch_first=True`` against the
same call time-major and forward, side by side, float32, on full and on ragged batches.

    python benchmarks/directions.py                    # LSTM, GRU, RNN at the default sizes
    python benchmarks/directions.py --cells lstm --sizes 50,32,128,128 --repeats 15

``reverse`` is a per-row time reversal around the backend's forward run
(``gradcells._order``): a flip (a view) without lengths, a gather with them; ``batch_first``
is a transpose (a view) of the per-step arrays. The ratios are what those cost.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _harness import limit_threads, summarize, table, time_interleaved
from sequences import gru_inputs, lstm_inputs, rnn_inputs

SIZES = [(50, 32, 128, 128), (100, 32, 256, 256)]
CELLS = {"lstm": ("lstm_sequence", ("x", "cs0", "h0", "w", "b"), lstm_inputs),
         "gru": ("gru_sequence", ("x", "h0", "w_ru", "w_c", "b_ru", "b_c"),
                 lambda *size: gru_inputs(*size, reset_after=True)),
         "rnn": ("rnn_sequence", ("x", "h0", "w", "b"), rnn_inputs)}
VARIANTS = ("forward", "reverse", "batch_first")


def contestant(cell, size, variant, ragged, backend):
    """Forward + BPTT of ``cell`` at ``size`` in one ``variant`` (the arrays laid out for
    it beforehand, so that only the call is timed)."""
    import gradcells as gc

    op, names, inputs = CELLS[cell]
    a = inputs(*size)
    keywords = {"reset_after": True} if cell == "gru" else {}
    if ragged:  # lengths from T down to T/4, in no order
        keywords["seq_len"] = np.random.default_rng(1).integers(size[0] // 4, size[0] + 1,
                                                                size[1])
    x, d_h = a["x"], a["d_h"]
    if variant == "batch_first":
        keywords["batch_first"] = True
        x, d_h = (np.ascontiguousarray(v.transpose(1, 0, 2)) for v in (x, d_h))
    keywords["reverse"] = variant == "reverse"
    arrays = (x, *(a[n] for n in names[1:]))
    forward, gradient = getattr(gc, op), getattr(gc, f"{op}_grad")

    def run():
        seq = forward(*arrays, **keywords, backend=backend)
        return gradient(*arrays, seq, d_h=d_h, backend=backend)

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None, help="T,B,I,H tuples")
    parser.add_argument("--cells", default="lstm,gru,rnn")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    limiter = limit_threads(args.threads)  # noqa: F841 - keeps the limits in force
    print(f"float32, {args.backend}, forward + BPTT; {args.threads} thread(s); median of "
          f"{args.repeats} interleaved rounds; ratios against the forward time-major call\n")
    rows = []
    for cell in args.cells.split(","):
        for size in sizes:
            for ragged in (False, True):
                contestants = {v: contestant(cell, size, v, ragged, args.backend)
                               for v in VARIANTS}
                stats = summarize(time_interleaved(contestants, args.repeats))
                base = stats["forward"].median
                rows.append((cell, str(size), "ragged" if ragged else "full",
                             f"{base * 1e3:.1f}",
                             *(f"{stats[v].median / base:.2f}×" for v in VARIANTS[1:])))
    print(table(rows, ("cell", "(T, B, I, H)", "lengths", "forward ms", "reverse",
                       "batch_first")))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
