"""The audit of google-deepmind/recurrentgemma's RG-LRU (``recurrentgemma.torch.layers.RGLRU``,
docs/spec.md §18.3, §20): its forward and autograd against gradcells's ``rglru_sequence``
in float64, with document boundaries (``segment_pos == 0``) mid-sequence.

Its parameters come through ``gc.layouts.rglru_from_recurrentgemma``: ``a_param`` and the
two block-diagonal gates as they are, the biases flattened. Its layer is batch first. Its
scan accumulates in float32 whatever the input's dtype (fault 80), and its gradient bounds
the square root's derivative at 1000 (``SqrtBoundDerivative``: convention 81), which the
converter's options carry (``sqrt_grad_bound=1000``); where the bound does not act, that is
the true gradient.
"""

from __future__ import annotations

import functools
from importlib.metadata import version

import numpy as np

from .. import layouts, sequences
from ._engine import FLOAT32_FORWARD, FLOAT32_GRADIENT, FLOAT64, Check, compare, judge_entries

SECTION = "recurrentgemma's RG-LRU (recurrentgemma.torch)"
PARAMETERS = ("a_param", "input_gate.w", "input_gate.b", "a_gate.w", "a_gate.b")
"""Its layer's parameters, in ``rglru_from_recurrentgemma``'s order."""


def _modules():
    import torch
    from recurrentgemma.torch.layers import RGLRU

    return torch, RGLRU


def _case(rng, *, long_memory=False):
    """One case: sizes, its layer's parameters (float64 NumPy), ``x [B, T, D]`` and
    ``segment_pos [B, T]`` (each row's documents of random lengths). ``a_param`` as its
    initialisation draws it (``σ(-a_param)`` on the ring 0.9..0.999), or, ``long_memory``,
    from -24 to -19: ``1 - a²`` below ``1/(4·1000²)``, where its bound acts."""
    steps, batch, heads, head = (int(rng.integers(2, 6)), int(rng.integers(1, 4)),
                                 int(rng.integers(1, 3)), int(rng.integers(1, 4)))
    width = heads * head
    radius = np.sqrt(rng.uniform(0.9 ** 2, 0.999 ** 2, width))
    a_param = (rng.uniform(-24.0, -19.0, width) if long_memory
               else np.log(1 / radius - 1))
    starts = rng.random((batch, steps)) < 0.3
    starts[:, 0] = True
    positions = np.zeros((batch, steps), np.int64)
    for t in range(1, steps):
        positions[:, t] = np.where(starts[:, t], 0, positions[:, t - 1] + 1)
    return {"a_param": a_param,
            "input_gate.w": rng.standard_normal((heads, head, head)) / np.sqrt(head),
            "input_gate.b": 0.5 * rng.standard_normal((heads, head)),
            "a_gate.w": rng.standard_normal((heads, head, head)) / np.sqrt(head),
            "a_gate.b": 0.5 * rng.standard_normal((heads, head)),
            "x": rng.standard_normal((batch, steps, width)), "segment_pos": positions,
            "sizes": (width, heads)}


def _theirs(case, d_y, d_last):
    """Their layer (float64 parameters and input) forward and autograd of ``<d_y, y> +
    <d_last, last_h>``: ``(y, last_h, {argument: gradient})``."""
    torch, rglru = _modules()
    width, heads = case["sizes"]
    layer = rglru(width=width, num_heads=heads, dtype=torch.float64)
    layer.load_state_dict({k: torch.from_numpy(case[k]) for k in PARAMETERS})
    x = torch.from_numpy(case["x"]).requires_grad_()
    y, last = layer(x, torch.from_numpy(case["segment_pos"]))
    torch.autograd.backward((y, last), (torch.from_numpy(d_y),
                                        torch.from_numpy(d_last).to(last.dtype)))
    grads = {"x": x.grad.numpy(), **{k: p.grad.numpy() for k, p in layer.named_parameters()}}
    return y.detach().numpy(), last.detach().double().numpy(), grads


def _gradcells(case, d_y, d_last, bound):
    """gradcells's float64 reference on the converted parameters, the gradients in its
    layer's names: ``(y, last_h, {argument: gradient})``."""
    converted = layouts.rglru_from_recurrentgemma(*(case[k] for k in PARAMETERS))
    x, h0 = case["x"], np.zeros((case["x"].shape[0], case["sizes"][0]))
    keywords = {"c": converted.options["c"], "sqrt_grad_bound": bound,
                "resets": case["segment_pos"] == 0, "batch_first": True,
                "backend": "reference"}
    seq = sequences.rglru_sequence(x, h0, *converted, **keywords)
    g = sequences.rglru_sequence_grad(x, h0, *converted, seq, d_h=d_y, d_h_final=d_last,
                                      backend="reference")
    params = layouts.rglru_to_recurrentgemma(g.w_a, g.b_a, g.w_x, g.b_x, g.lam)
    return seq.h, seq.h_final, {"x": g.x, **params}


def _pairs(theirs, ours, gradients):
    y, last, grads = theirs
    y_g, last_g, grads_g = ours
    if not gradients:
        return [("y", y, y_g), ("last_h", last, last_g)]
    return [(name, grads[name], grads_g[name]) for name in ("x", *PARAMETERS)]


def verdict(rng, *, gradients, long_memory=False):
    """Their layer against gradcells, the forward (``gradients`` False) or every gradient:
    the truth is gradcells's float64 true gradient to ``FLOAT64``; fault 80's model allows
    float32's rounding (``FLOAT32_FORWARD``, ``FLOAT32_GRADIENT``), convention 81's is
    gradcells with ``sqrt_grad_bound=1000`` (the converter's option)."""
    case = _case(rng, long_memory=long_memory)
    d_y = rng.standard_normal(case["x"].shape)
    d_last = rng.standard_normal(case["x"].shape[::2])
    theirs = _theirs(case, d_y, d_last)
    return judge_entries(functools.partial(_model, case, d_y, d_last, theirs, gradients),
                         (80, 81) if gradients else (80,))


def _model(case, d_y, d_last, theirs, gradients, active):
    """The comparison with the entries in ``active`` applied: 80, float32's tolerance; 81,
    gradcells with ``sqrt_grad_bound=1000``."""
    ours = _gradcells(case, d_y, d_last, 1000.0 if 81 in active else None)
    tolerance = (FLOAT64 if 80 not in active
                 else FLOAT32_GRADIENT if gradients else FLOAT32_FORWARD)
    return compare(_pairs(theirs, ours, gradients), tolerance)


CHECKS = (
    Check("RGLRU forward (float64) vs gradcells (rglru_sequence, resets)",
          lambda rng: verdict(rng, gradients=False), fault=80),
    Check("RGLRU autograd (float64) vs gradcells (rglru_sequence_grad)",
          lambda rng: verdict(rng, gradients=True), fault=(80, 81)),
    Check("RGLRU autograd where its sqrt bound acts vs gradcells (rglru_sequence_grad)",
          lambda rng: verdict(rng, gradients=True, long_memory=True), fault=(80, 81)),
)


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the recurrentgemma audit; ImportError without it."""
    _modules()
    return (f"gradcells audit of {SECTION} {version('recurrentgemma')} (CPU, float64)",
            CHECKS, [])
