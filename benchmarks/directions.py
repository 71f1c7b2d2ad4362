"""What the time order and the layout cost (docs/spec.md §11.1, §11.2; docs/performance.md):
a sequence's forward + BPTT with ``reverse=True`` and with ``batch_first=True`` against the
same call time-major and forward, side by side, float32, on full and on ragged batches.

    python benchmarks/directions.py                    # LSTM, GRU, RNN at the default sizes
    python benchmarks/directions.py --cells lstm --sizes 50,32,128,128 --repeats 15
    python benchmarks/directions.py --stack            # a 2-layer bidirectional LSTM stack
                                                       # on a ragged batch against PyTorch
    python benchmarks/directions.py --masks            # what the masks of §11.3 cost

``reverse`` is a per-row time reversal around the backend's forward run
(``gradcells._order``): a flip (a view) without lengths, a gather with them, except on a
backend that runs it natively (``NATIVE_REVERSE``: the CPU backend, whose loops then walk
each row's steps from last to first); ``batch_first`` is a transpose (a view) of the
per-step arrays. The ratios are what those cost.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _harness import (
    limit_threads,
    missing,
    peak_mib,
    pin_peer_threads,
    summarize,
    table,
    time_interleaved,
)
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


STACK_LAYERS = 2


def _stack_lengths(size):
    """Ragged lengths from T down to T/4, in no order (the first row runs all T)."""
    lengths = np.random.default_rng(1).integers(size[0] // 4, size[0] + 1, size[1])
    lengths[0] = size[0]
    return lengths


def torch_stack(size):
    """A 2-layer bidirectional ``nn.LSTM`` on a packed sequence: forward + backward."""
    import torch

    steps, batch, n_in, hidden = size
    torch.manual_seed(0)
    module = torch.nn.LSTM(n_in, hidden, num_layers=STACK_LAYERS, bidirectional=True)
    a = lstm_inputs(*size)
    x = torch.tensor(a["x"], requires_grad=True)
    lengths = torch.tensor(_stack_lengths(size))
    d_out = torch.randn(steps, batch, 2 * hidden)

    def run():
        module.zero_grad(set_to_none=True)
        x.grad = None
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, _ = module(packed)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=steps)
        out.backward(d_out)
        return x.grad

    return run, module


def gradcells_stack(size, module, backend):
    """The same stack in gradcells, its weights converted from the PyTorch module."""
    import gradcells as gc
    from gradcells import layouts

    steps, batch, n_in, hidden = size
    conv = layouts.stack_from_torch(module)
    weights = [type(w)(*(None if a is None else a.astype(np.float32) for a in w))
               for w in conv]
    x = lstm_inputs(*size)["x"]
    zeros = np.zeros((2 * STACK_LAYERS, batch, hidden), np.float32)
    lengths, d_out = _stack_lengths(size), np.ones((steps, batch, 2 * hidden), np.float32)

    def run():
        stack = gc.lstm_stack(x, zeros, zeros, weights, seq_len=lengths, backend=backend,
                              **conv.options)
        return gc.lstm_stack_grad(x, zeros, zeros, weights, stack, d_h=d_out,
                                  backend=backend)

    def saved_mib():
        """What the stack's result keeps for its gradient (every layer's sequence)."""
        stack = gc.lstm_stack(x, zeros, zeros, weights, seq_len=lengths, backend=backend,
                              **conv.options)
        return sum(a.nbytes for seq in stack.layers for a in seq) / 2**20

    run.saved_mib = saved_mib
    return run


def stack_table(sizes, repeats, backend):
    """Rows: the stack against PyTorch's packed ``nn.LSTM``, medians and their ratio, and
    the stack's peak memory (forward + gradient) in units of what its result keeps."""
    from gradcells.cpu import release_scratch

    rows = []
    for size in sizes:
        peer, module = torch_stack(size)
        ours_run = gradcells_stack(size, module, backend)
        stats = summarize(time_interleaved({"gradcells": ours_run, "torch": peer}, repeats))
        ours, theirs = stats["gradcells"].median, stats["torch"].median
        release_scratch()
        peak = peak_mib(ours_run)
        kept = ours_run.saved_mib()
        steps, batch, _, hidden = size
        scratch = (peak - kept) / (steps * batch * 4 * hidden * 4 / 2**20)
        rows.append((str(size), f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}",
                     f"{ours / theirs:.2f}×", f"{peak:.1f} MiB",
                     f"{kept:.1f} MiB + {scratch:.1f} T·B·4H"))
    return table(rows, ("(T, B, I, H)", "gradcells ms", "torch packed ms", "ratio",
                        "peak memory", "= result kept + scratch"))


def masked_contestants(cell, size, backend="cpu"):
    """Forward + BPTT of ``cell`` on ``backend``: without masks ("plain"), with each mask
    alone and with all of them ("masked"): an input mask and a recurrent mask of 0/1 over
    0.75 per row, zoneout of h (and for the LSTM of cs) as trained, 0/1 per step and
    element with probability 0.1; and zoneout by the fraction 0.1 everywhere ("fractional",
    not in "masked")."""
    import gradcells as gc

    op, names, inputs = CELLS[cell]
    a = inputs(*size)
    keywords = {"reset_after": True} if cell == "gru" else {}
    arrays = [a[n] for n in names]
    rng = np.random.default_rng(0)
    steps, batch, n_in, hidden = size
    zoned = ("zoneout_h", "zoneout_cs") if cell == "lstm" else ("zoneout_h",)
    masks = {"input": {"input_mask": (rng.integers(0, 2, (batch, n_in)) / 0.75)
                       .astype(np.float32)},
             "recurrent": {"recurrent_mask": (rng.integers(0, 2, (batch, hidden)) / 0.75)
                           .astype(np.float32)},
             "zoneout": {name: (rng.random((steps, batch, hidden)) < 0.1).astype(np.float32)
                         for name in zoned}}
    masks["masked"] = {k: v for m in masks.values() for k, v in m.items()}
    masks["fractional"] = {name: np.full(hidden, 0.1, np.float32) for name in zoned}
    forward, gradient = getattr(gc, op), getattr(gc, f"{op}_grad")

    def contestant(extra):
        def run():
            seq = forward(*arrays, **keywords, **extra, backend=backend)
            return gradient(*arrays, seq, d_h=a["d_h"], backend=backend)
        return run

    return {"plain": contestant({}), **{name: contestant(m) for name, m in masks.items()}}


MASK_COLUMNS = ("input", "recurrent", "zoneout", "masked", "fractional")


def masks_table(cells, sizes, repeats, backend="cpu"):
    rows = []
    for cell in cells:
        for size in sizes:
            stats = summarize(time_interleaved(masked_contestants(cell, size, backend),
                                               repeats))
            plain = stats["plain"].median
            rows.append((cell, str(size), f"{plain * 1e3:.1f}",
                         f"{stats['masked'].median * 1e3:.1f}",
                         *(f"{stats[k].median / plain - 1:+.1%}" for k in MASK_COLUMNS)))
    return table(rows, ("cell", "(T, B, I, H)", "no masks ms", "all masks ms",
                        "input mask", "recurrent mask", "zoneout", "all masks",
                        "fractional zoneout"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None, help="T,B,I,H tuples")
    parser.add_argument("--cells", default="lstm,gru,rnn")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--stack", action="store_true",
                        help="a 2-layer bidirectional LSTM stack against torch's packed nn.LSTM")
    parser.add_argument("--masks", action="store_true",
                        help="the sequences with masks (input, recurrent, zoneout of h)")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    if args.stack:
        if missing("torch"):
            print(missing("torch"))
            return
        pin_peer_threads(args.threads, tensorflow=False)
        limiter = limit_threads(args.threads)  # noqa: F841 - keeps the limits in force
        print(f"float32, {args.backend}, a {STACK_LAYERS}-layer bidirectional LSTM over a "
              f"ragged batch, forward + BPTT; {args.threads} thread(s); median of "
              f"{args.repeats} interleaved rounds\n")
        print(stack_table(sizes, args.repeats, args.backend))
        return
    limiter = limit_threads(args.threads)  # noqa: F841 - keeps the limits in force
    if args.masks:
        print(f"float32, {args.backend}, forward + BPTT; {args.threads} thread(s); median "
              f"of {args.repeats} interleaved rounds; what each mask adds to the call without "
              "masks\n")
        print(masks_table(args.cells.split(","), sizes, args.repeats, args.backend))
        return
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
