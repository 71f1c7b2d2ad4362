"""What forward mode and second order cost (docs/spec.md §12, §15; docs/performance.md).

    python benchmarks/second_order.py                  # both sizes, LSTM, one thread
    python benchmarks/second_order.py --sizes 50,32,128,128 --repeats 7
    python benchmarks/second_order.py --cells lstm gru gru_ra rnn     # forward mode only

Per size, float32, side by side in one run (``_harness``): the LSTM sequence's forward and
``lstm_sequence_jvp`` (tangents of every input and weight), its forward + gradient and
``lstm_sequence_grad_jvp``, and the Hessian-vector product of a squared loss on ``h``:
``gc.hessian_vector_product`` against ``torch.autograd.functional.hvp`` through
``torch.nn.LSTM`` (PyTorch's double backward of its own module, on the same weights). The
forward, the gradient and both JVPs run on the default backend (cpu: ``gradcells.cpu._jvp``
and ``_grad_jvp``), and so does the Hessian-vector product built on them.

``--cells``: instead, a table per cell (``lstm``, ``gru``, ``gru_ra`` the reset-after GRU,
``rnn``), every op on the default backend (cpu): the forward, ``op_jvp`` with tangents of
every input and weight, ``op_jvp`` with tangents of the inputs and initial states only (no
weight tangents: the tangent's matmuls then cost what the forward's do, where the weights'
tangents double them), forward + gradient, and ``op_grad_jvp`` with tangents of every input,
weight and upstream gradient; each JVP also against its BLAS bound (``matmul_bound``: the
matmuls of its plan alone, with the same shapes, no elementwise work).
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
        out, _ = torch.func.functional_call(module, dict(zip(names, p, strict=True)), (x,))
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


# cell -> (its public name, its inputs at a size, the arrays' keys in argument order,
# keywords, the width of its pre-activations in units of H)
CELLS = {
    "lstm": ("lstm_sequence", lstm_inputs, ("x", "cs0", "h0", "w", "b"), {}, 4),
    "gru": ("gru_sequence", lambda *s: gru_inputs(*s, False),
            ("x", "h0", "w_ru", "w_c", "b_ru", "b_c"), {}, 3),
    "gru_ra": ("gru_sequence", lambda *s: gru_inputs(*s, True),
               ("x", "h0", "w_ru", "w_c", "b_ru", "b_c"), {"reset_after": True}, 3),
    "rnn": ("rnn_sequence", rnn_inputs, ("x", "h0", "w", "b"), {}, 1),
}
STATES = ("x", "cs0", "h0")


def matmul_bound(size, width, second_order):
    """The matmuls of a JVP's plan alone (``np.matmul`` into preallocated outputs), for a
    cell whose pre-activations are ``width`` wide: ``op_jvp``'s (``second_order`` False) or
    ``op_grad_jvp``'s (True), with tangents of every input and weight.

    ``op_jvp``: ``X·W_x`` and ``[dX, X]·[W_x; dW_x]`` over all steps, then per step
    ``h·W_h`` and ``[dh, h]·[W_h; dW_h]`` (the CPU's stacked calls, K doubled).
    ``op_grad_jvp`` adds the gradient's and its tangent's: per step ``dz·W_hᵀ`` and
    ``[dz', dz]·[W_hᵀ; dW_hᵀ]``, then over all steps ``dZ·W_xᵀ``,
    ``[dZ', dZ]·[W_xᵀ; dW_xᵀ]``, and for each weight block ``Aᵀ·dZ`` and
    ``[A'; A]ᵀ·[dZ; dZ']``. FLOPs: 3× the forward's matmuls, and 9× for the second
    order against forward + gradient's 3×: the floor either JVP is measured against."""
    steps, batch, n_in, hidden = size
    rng = np.random.default_rng(2)

    def draw(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    flat = steps * batch
    x2, h2 = draw(flat, 2 * n_in), draw(batch, 2 * hidden)
    wx2, wh2 = draw(2 * n_in, width), draw(2 * hidden, width)
    z, z2 = np.empty((flat, width), np.float32), np.empty((flat, width), np.float32)
    g, g2 = np.empty((batch, width), np.float32), np.empty((batch, width), np.float32)
    dz2, dz2_rows = draw(flat, 2 * width), draw(2 * flat, width)
    wht2, wxt2 = draw(2 * width, hidden), draw(2 * width, n_in)
    dh, dh2 = np.empty((batch, hidden), np.float32), np.empty((batch, hidden), np.float32)
    dx, dx2 = np.empty((flat, n_in), np.float32), np.empty((flat, n_in), np.float32)
    a_rows = {n: draw(2 * flat, n) for n in (n_in, hidden)}
    dw = {n: (np.empty((n, width), np.float32), np.empty((n, width), np.float32))
          for n in (n_in, hidden)}

    def run():
        np.matmul(x2[:, n_in:], wx2[:n_in], out=z)
        np.matmul(x2, wx2, out=z2)
        for _ in range(steps):
            np.matmul(h2[:, hidden:], wh2[:hidden], out=g)
            np.matmul(h2, wh2, out=g2)
        if not second_order:
            return
        for t in range(steps):
            rows = dz2[t * batch:(t + 1) * batch]
            np.matmul(rows[:, width:], wht2[:width], out=dh)
            np.matmul(rows, wht2, out=dh2)
        np.matmul(dz2[:, width:], wxt2[:width], out=dx)
        np.matmul(dz2, wxt2, out=dx2)
        for n, a in a_rows.items():
            np.matmul(a[flat:].T, dz2_rows[:flat], out=dw[n][0])
            np.matmul(a.T, dz2_rows, out=dw[n][1])

    return run


def forward_mode_contestants(cell, size):
    """A cell's forward, its JVP with every tangent and with the inputs' only, its forward +
    gradient, its gradient's JVP with every tangent, and the two JVPs' BLAS bounds."""
    import gradcells as gc
    from gradcells.cells import OPS

    name, inputs, keys, options, width = CELLS[cell]
    a = inputs(*size)
    arrays = [a[k] for k in keys]
    rng = np.random.default_rng(1)
    grads = OPS[name].grads
    every = grads(*(rng.standard_normal(v.shape).astype(np.float32) for v in arrays))
    states = every._replace(**{k: None for k in keys if k not in STATES})
    forward, jvp = getattr(gc, name), getattr(gc, f"{name}_jvp")
    grad, grad_jvp = getattr(gc, f"{name}_grad"), getattr(gc, f"{name}_grad_jvp")
    seq = forward(*arrays, **options)
    d_h, d_h_tangent = (rng.standard_normal(seq.h.shape).astype(np.float32) for _ in "12")
    return {"forward": lambda: forward(*arrays, **options),
            "jvp": lambda: jvp(*arrays, every, **options),
            "jvp (inputs only)": lambda: jvp(*arrays, states, **options),
            "jvp bound": matmul_bound(size, width * size[3], False),
            "forward + grad": lambda: grad(*arrays, forward(*arrays, **options), d_h=d_h,
                                           **options),
            "grad_jvp": lambda: grad_jvp(*arrays, seq, every, d_h=d_h,
                                         d_h_tangent=d_h_tangent, **options),
            "grad_jvp bound": matmul_bound(size, width * size[3], True)}


def forward_mode_table(cells, sizes, repeats):
    rows = []
    for cell in cells:
        for size in sizes:
            stats = summarize(time_interleaved(forward_mode_contestants(cell, size), repeats))
            ms = {k: s.median * 1e3 for k, s in stats.items()}
            rows.append((cell, str(size), f"{ms['forward']:.1f}",
                         f"{ms['jvp'] / ms['forward']:.2f}×",
                         f"{ms['jvp (inputs only)'] / ms['forward']:.2f}×",
                         f"{ms['jvp'] / ms['jvp bound']:.2f}×",
                         f"{ms['forward + grad']:.1f}",
                         f"{ms['grad_jvp'] / ms['forward + grad']:.2f}×",
                         f"{ms['grad_jvp'] / ms['grad_jvp bound']:.2f}×"))
    return table(rows, ("cell", "(T, B, I, H)", "forward ms", "jvp / forward",
                        "jvp (inputs only) / forward", "jvp / its BLAS bound",
                        "fwd + grad ms", "grad_jvp / (fwd + grad)",
                        "grad_jvp / its BLAS bound"))


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
