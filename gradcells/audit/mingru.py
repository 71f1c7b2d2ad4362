"""The audit of minGRU-pytorch (lucidrains, PyPI ``mingru-pytorch``; Feng et al. 2024) in
float64: its minGRU's sequential mode (one step per call) and parallel mode (a log-space
associative scan) against gradcells's ``mingru_sequence`` and the oracle, and its minLSTM's
parallel mode against its own sequential mode (docs/spec.md §18.2, §20).

Its layers are batch-first and bias-free. The minGRU's ``to_hidden_and_gate.weight [2H, D]``
holds the candidate's rows, then the gate's; gradcells's ``w [I, 2H]`` holds the gate's
columns, then the candidate's (``_weights``). Its parallel modes take logarithms of the
initial state and of ``g(h̃)``: the paper's log-space form, which needs positive states.
"""

from __future__ import annotations

import functools
from importlib.metadata import version

import numpy as np

from .. import sequences
from ..layouts import mingru_from_mingru_pytorch
from ..oracle import check_vjp
from ._engine import FLOAT64, Check, compare, judge, oracle_outcome

SECTION = "minGRU-pytorch"


def _modules():
    import torch
    from minGRU_pytorch.minGRU import minGRU
    from minGRU_pytorch.minLSTM import minLSTM

    return torch, minGRU, minLSTM


def _case(rng, *, positive=True, gates=2):
    """Sizes, the layer's weight ``[gates·H, D]``, ``x [B, T, D]`` and ``h0 [B, 1, H]``
    (positive, or of either sign)."""
    steps, batch, dim = (int(rng.integers(2, 6)), int(rng.integers(1, 4)),
                         int(rng.integers(1, 5)))
    h0 = rng.uniform(0.1, 1.0, (batch, 1, dim))
    if not positive:
        h0 *= np.where(rng.random((batch, 1, dim)) < 0.5, -1.0, 1.0)
        h0[0, 0, 0] = -abs(h0[0, 0, 0])
    return {"weight": rng.standard_normal((gates * dim, dim)) / np.sqrt(dim),
            "x": rng.standard_normal((batch, steps, dim)), "h0": h0}


def _layer(case, kind="minGRU"):
    """Their layer in float64 holding the case's weight."""
    torch, mingru, minlstm = _modules()
    dim = case["x"].shape[2]
    layer = (mingru if kind == "minGRU" else minlstm)(dim).double()
    linear = layer.to_hidden_and_gate if kind == "minGRU" else layer.to_hidden_and_f_i_gate
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(case["weight"]))
    return layer


def _weights(case):
    """gradcells's ``(w, b)``: the gate's columns, then the candidate's; no bias
    (``gc.layouts.mingru_from_mingru_pytorch``)."""
    return tuple(mingru_from_mingru_pytorch(case["weight"]))


def _parallel(case, x=None, h0=None, kind="minGRU"):
    """Their parallel mode over the case (tensors in, a tensor out)."""
    torch = _modules()[0]
    x = torch.from_numpy(case["x"]) if x is None else x
    h0 = torch.from_numpy(case["h0"]) if h0 is None else h0
    return _layer(case, kind)(x, h0)


def _sequential(case, h0=None, kind="minGRU"):
    """Their sequential mode, one call per step, as NumPy ``[B, T, H]``."""
    torch = _modules()[0]
    layer = _layer(case, kind)
    h, steps = torch.from_numpy(case["h0"] if h0 is None else h0), []
    with torch.no_grad():
        for t in range(case["x"].shape[1]):
            h = layer(torch.from_numpy(case["x"][:, t:t + 1]), h)
            steps.append(h)
    return torch.cat(steps, 1).numpy()


def _gradcells(case, method):
    return sequences.mingru_sequence(case["x"], case["h0"][:, 0], *_weights(case),
                                     method=method, batch_first=True, backend="reference")


def mode_verdict(rng, *, parallel, positive=True):
    """One of their minGRU's modes against gradcells's (its ``parallel`` against
    ``method="parallel"``); with ``h0`` of either sign, fault 70's model: NaN exactly where
    a row's initial state is negative, gradcells elsewhere."""
    torch = _modules()[0]
    case = _case(rng, positive=positive)
    with torch.no_grad():
        theirs = _parallel(case).numpy() if parallel else _sequential(case)
    ours = _gradcells(case, "parallel" if parallel else "sequential").h
    claim = compare([("h", theirs, ours)], FLOAT64)
    negative = np.broadcast_to(case["h0"] < 0, theirs.shape)
    return judge(claim, None if positive else functools.partial(
        _nan_where_negative, theirs, ours, negative))


def _nan_where_negative(theirs, ours, negative):
    if not np.array_equal(np.isnan(theirs), negative):
        return compare([("NaN pattern", np.isnan(theirs), negative)], FLOAT64)
    return compare([("h", np.where(negative, 0.0, theirs), np.where(negative, 0.0, ours))],
                   FLOAT64)


def _outputs(case, x, h0, weight):
    """Their parallel minGRU's ``h`` as NumPy: the function the oracle differences."""
    torch = _modules()[0]
    with torch.no_grad():
        return _parallel({**case, "weight": weight}, torch.from_numpy(x),
                         torch.from_numpy(h0)).numpy()


def _claimed_vjp(case, ct, x, h0, weight):
    """Their autograd of ``<ct, h>`` for ``(x, h0, weight)``."""
    torch = _modules()[0]
    x, h0 = (torch.from_numpy(a).requires_grad_() for a in (x, h0))
    layer = _layer({**case, "weight": weight})
    out = layer(x, h0)
    parameter = layer.to_hidden_and_gate.weight
    grads = torch.autograd.grad((out * torch.from_numpy(ct)).sum(), (x, h0, parameter))
    return tuple(g.numpy() for g in grads)


def oracle_verdict(rng):
    """Their parallel minGRU's autograd against central differences of its forward."""
    case = _case(rng)
    report = check_vjp(functools.partial(_outputs, case), functools.partial(_claimed_vjp, case),
                       (case["x"], case["h0"], case["weight"]), names=("x", "h0", "weight"),
                       seed=0)
    return judge(oracle_outcome(report), None)


def gradients_verdict(rng):
    """Their parallel minGRU's autograd against ``mingru_sequence_grad``."""
    case = _case(rng)
    ct = rng.standard_normal(case["x"].shape)
    theirs = _claimed_vjp(case, ct, case["x"], case["h0"], case["weight"])
    seq = _gradcells(case, "parallel")
    grads = sequences.mingru_sequence_grad(case["x"], case["h0"][:, 0], *_weights(case), seq,
                                           d_h=ct, backend="reference")
    dim = case["x"].shape[2]
    weight = np.concatenate([grads.w[:, dim:].T, grads.w[:, :dim].T])
    return judge(compare([("x", theirs[0], grads.x), ("h0", theirs[1][:, 0], grads.h0),
                          ("weight", theirs[2], weight)], FLOAT64), None)


def minlstm_verdict(rng):
    """Their minLSTM's parallel mode against its sequential mode (which follows the paper's
    ``h_t = f'_t h_{t-1} + i'_t h̃_t`` from ``h0``); fault 71's model: the sequential mode
    run from ``g(h0)``."""
    torch = _modules()[0]
    case = _case(rng, gates=3)
    with torch.no_grad():
        parallel = _parallel(case, kind="minLSTM").numpy()
        g_h0 = np.where(case["h0"] >= 0, case["h0"] + 0.5, 1 / (1 + np.exp(-case["h0"])))
    claim = compare([("h", parallel, _sequential(case, kind="minLSTM"))], FLOAT64)
    return judge(claim, lambda: compare([("h", parallel, _sequential(
        case, h0=g_h0, kind="minLSTM"))], FLOAT64))


CHECKS = (
    Check("minGRU sequential mode vs gradcells (mingru_sequence, sequential)",
          functools.partial(mode_verdict, parallel=False)),
    Check("minGRU parallel mode, h0 > 0, vs gradcells (mingru_sequence, parallel)",
          functools.partial(mode_verdict, parallel=True)),
    Check("minGRU parallel mode, h0 of either sign, vs gradcells",
          functools.partial(mode_verdict, parallel=True, positive=False), fault=70),
    Check("minGRU parallel mode autograd vs oracle", oracle_verdict),
    Check("minGRU parallel mode autograd vs gradcells (mingru_sequence_grad)",
          gradients_verdict),
    Check("minLSTM parallel mode vs its sequential mode", minlstm_verdict, fault=71),
)


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the minGRU-pytorch audit; ImportError without it."""
    _modules()
    return (f"gradcells audit of {SECTION} {version('mingru-pytorch')} (CPU, float64)",
            CHECKS, [])
