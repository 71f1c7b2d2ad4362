"""What forward mode and second order cost (docs/spec.md §12, §15; docs/performance.md).

    python benchmarks/second_order.py                  # both sizes, LSTM, one thread
    python benchmarks/second_order.py --sizes 50,32,128,128 --repeats 7
    python benchmarks/second_order.py --cells lstm gru gru_ra rnn     # forward mode only

Per size, float32, side by side in one run (``_harness``): the LSTM sequence's forward and
``lstm_sequence_jvp`` (tangents of every input and weight), its forward + gradient and
``lstm_sequence_grad_jvp``, and the Hessian-vector product of a squared loss on ``h``:
``gc.hessian_vector_product`` against ``torch.autograd.functional.hvp`` through
``torch.nn.LSTM`` (PyTorch's double backward of its own module, on the same weights). The
forward and gradient run on the default backend (cpu), as do the forward-mode ops
(``gradcells.cpu._jvp``); the gradient's JVP and the Hessian-vector product run on the
reference (dual numbers through the hand-derived gradient).

``--cells``: instead, a forward-mode table per cell (``lstm``, ``gru``, ``gru_ra`` the
reset-after GRU, ``rnn``): the forward, ``op_jvp`` with tangents of every input and weight,
and ``op_jvp`` with tangents of the inputs and initial states only (no weight tangents: the
tangent's matmuls then cost what the forward's do, where the weights' tangents double them).
"""

from __future__ import annotations

import argparse

import numpy as np
from _harness import limit_threads, missing, pin_peer_threads, summarize, table, time_interleaved
from sequences import gru_inputs, lstm_inputs, rnn_inputs

SIZES = [(50, 32, 128, 128), (100, 32, 256, 256)]


def contestants(size):
    """Every contestant at ``size``: name -> a call."""
    import gradcells as gc

    a = lstm_inputs(*size)
    arrays = [a[k] for k in ("x", "cs0", "h0", "w", "b")]
    rng = np.random.default_rng(1)
    tangents = gc.LSTMSequenceGrads(*(rng.standard_normal(v.shape).astype(np.float32)
                                      for v in arrays))
    target = a["d_h"]
    seq = gc.lstm_sequence(*arrays)
    runs = {
        "forward": lambda: gc.lstm_sequence(*arrays),
        "jvp": lambda: gc.lstm_sequence_jvp(*arrays, tangents),
        "forward + grad": lambda: gc.lstm_sequence_grad(*arrays, gc.lstm_sequence(*arrays),
                                                        d_h=a["d_h"]),
        "grad_jvp": lambda: gc.lstm_sequence_grad_jvp(*arrays, seq, tangents, d_h=a["d_h"]),
        "hvp (gradcells)": lambda: gc.hessian_vector_product(
            gc.lstm_sequence, arrays, tangents._replace(x=None, cs0=None, h0=None),
            loss_grad=lambda r: {"d_h": r.h - target}, loss_hvp=lambda r, d: {"d_h": d.h}),
    }
    if missing("torch") is None:
        runs["hvp (torch nn.LSTM)"] = torch_hvp(size, a, target)
    return runs


def torch_hvp(size, a, target):
    """``torch.autograd.functional.hvp`` of ½|h - y|² through ``nn.LSTM`` in its
    parameters, along a random direction (PyTorch's way to a Hessian-vector product)."""
    import torch

    steps, batch, n_in, hidden = size
    torch.manual_seed(0)
    module = torch.nn.LSTM(n_in, hidden)
    names = [n for n, _ in module.named_parameters()]
    params = tuple(p.detach() for p in module.parameters())
    directions = tuple(torch.randn_like(p) for p in params)
    x, y = torch.tensor(a["x"]), torch.tensor(target)

    def loss(*p):
        out, _ = torch.func.functional_call(module, dict(zip(names, p)), (x,))
        return 0.5 * ((out - y) ** 2).sum()

    return lambda: torch.autograd.functional.hvp(loss, params, directions)


def second_order_table(sizes, repeats):
    rows = []
    for size in sizes:
        stats = summarize(time_interleaved(contestants(size), repeats))
        ms = {k: s.median * 1e3 for k, s in stats.items()}
        torch_ms = ms.get("hvp (torch nn.LSTM)")
        rows.append((str(size), f"{ms['forward']:.1f}", f"{ms['jvp'] / ms['forward']:.2f}×",
                     f"{ms['forward + grad']:.1f}",
                     f"{ms['grad_jvp'] / ms['forward + grad']:.2f}×",
                     f"{ms['hvp (gradcells)']:.1f}",
                     "-" if torch_ms is None else f"{torch_ms:.1f}",
                     "-" if torch_ms is None else f"{ms['hvp (gradcells)'] / torch_ms:.2f}×"))
    return table(rows, ("(T, B, I, H)", "forward ms", "jvp / forward", "fwd + grad ms",
                        "grad_jvp / (fwd + grad)", "hvp ms", "torch hvp ms",
                        "hvp vs torch"))


# cell -> (its public name, its inputs at a size, the arrays' keys in argument order)
CELLS = {
    "lstm": ("lstm_sequence", lstm_inputs, ("x", "cs0", "h0", "w", "b"), {}),
    "gru": ("gru_sequence", lambda *s: gru_inputs(*s, False),
            ("x", "h0", "w_ru", "w_c", "b_ru", "b_c"), {}),
    "gru_ra": ("gru_sequence", lambda *s: gru_inputs(*s, True),
               ("x", "h0", "w_ru", "w_c", "b_ru", "b_c"), {"reset_after": True}),
    "rnn": ("rnn_sequence", rnn_inputs, ("x", "h0", "w", "b"), {}),
}
STATES = ("x", "cs0", "h0")


def forward_mode_contestants(cell, size):
    """A cell's forward and its JVP with every tangent, and with the inputs' only."""
    import gradcells as gc
    from gradcells._core.specs import OPS

    name, inputs, keys, options = CELLS[cell]
    a = inputs(*size)
    arrays = [a[k] for k in keys]
    rng = np.random.default_rng(1)
    grads = OPS[name].grads
    every = grads(*(rng.standard_normal(v.shape).astype(np.float32) for v in arrays))
    states = every._replace(**{k: None for k in keys if k not in STATES})
    forward, jvp = getattr(gc, name), getattr(gc, f"{name}_jvp")
    return {"forward": lambda: forward(*arrays, **options),
            "jvp": lambda: jvp(*arrays, every, **options),
            "jvp (inputs only)": lambda: jvp(*arrays, states, **options)}


def forward_mode_table(cells, sizes, repeats):
    rows = []
    for cell in cells:
        for size in sizes:
            stats = summarize(time_interleaved(forward_mode_contestants(cell, size), repeats))
            ms = {k: s.median * 1e3 for k, s in stats.items()}
            rows.append((cell, str(size), f"{ms['forward']:.1f}", f"{ms['jvp']:.1f}",
                         f"{ms['jvp'] / ms['forward']:.2f}×",
                         f"{ms['jvp (inputs only)'] / ms['forward']:.2f}×"))
    return table(rows, ("cell", "(T, B, I, H)", "forward ms", "jvp ms", "jvp / forward",
                        "jvp (inputs only) / forward"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None, help="T,B,I,H tuples")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cells", nargs="*", default=None, choices=sorted(CELLS),
                        help="a forward-mode table for these cells instead")
    args = parser.parse_args(argv)
    sizes = ([tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes
             else SIZES)
    pin_peer_threads(args.threads, tensorflow=False)
    limiter = limit_threads(args.threads)
    if args.cells:
        print(forward_mode_table(args.cells, sizes, args.repeats))
    else:
        print(second_order_table(sizes, args.repeats))
    del limiter


if __name__ == "__main__":
    main()
