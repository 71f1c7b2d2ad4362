"""The audit of Mamba's selective scan (PyPI ``mamba-ssm``; Gu and Dao 2023): its PyTorch
reference ``selective_scan_ref`` against gradcells's ``selective_scan`` and the oracle
(docs/spec.md §18.4, §20).

``selective_scan_ref`` (``mamba_ssm/ops/selective_scan_interface.py``) is plain PyTorch with
einops, but the package imports Triton and the interface module loads its CUDA extension at
import. The audit reads that file from the installed distribution and executes only the
function's definition, with ``torch``, ``torch.nn.functional`` and einops' ``rearrange``,
``repeat``: nothing of the package is imported. What the reference does, as read there:

* it computes in float32 whatever it is given (``u.float()``, ``delta.float()``,
  ``B.float()``, ``C.float()``, and ``delta_bias`` too), and returns ``out`` in ``u``'s
  dtype: float64 inputs give float64 results of float32 precision (fault 90); with a float64
  ``A`` it raises (its einsum meets float32 ``delta``: fault 91);
* grouped ``B, C [Bt, G, N, L]`` are repeated to every channel (einops' ``repeat``, channel
  d reading group d // (Dm/G)), as gradcells does;
* ``last_state`` is the state after the last step, in float32; the reference is autograd
  through plain PyTorch, so a loss on it is differentiated (``selective_scan_fn``'s CUDA
  backward does not, by its docstring: GPU only, skipped);
* ``F.softplus`` returns its argument above 20 (gradcells's softplus is exact there: below
  float32's rounding, and the audit's Δ stay small);
* it has no ``reverse`` (gradcells's is checked by its own tests).

The CUDA kernel (``selective_scan_fn``, and mamba_ssm #368's reverse-with-padding
configuration) needs a GPU and the compiled extension: its row is skipped with the reason.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, distribution, version

import numpy as np

from .. import scans
from ..oracle import check_vjp
from ._engine import (
    FLOAT32_FORWARD,
    FLOAT32_GRADIENT,
    Check,
    Skipped,
    Verdict,
    compare,
    judge,
    oracle_outcome,
    refused,
)

SECTION = "mamba-ssm"
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


@functools.cache
def _reference():
    """``(torch, selective_scan_ref)``, its definition executed from the installed file;
    ImportError without the package (or without torch or einops)."""
    import torch
    import torch.nn.functional as F
    from einops import rearrange, repeat

    try:
        files = distribution("mamba-ssm").files or []
    except PackageNotFoundError:
        raise ImportError("No module named 'mamba_ssm'") from None
    found = [f for f in files if str(f).endswith("ops/selective_scan_interface.py")]
    if not found:
        raise ImportError("mamba-ssm has no ops/selective_scan_interface.py")
    path = str(found[0].locate())
    with open(path, encoding="utf-8") as source_file:
        source = source_file.read()
    definitions = [node for node in ast.parse(source).body
                   if isinstance(node, ast.FunctionDef) and node.name == "selective_scan_ref"]
    if not definitions:
        raise ImportError(f"no selective_scan_ref in {path}")
    namespace = {"torch": torch, "F": F, "rearrange": rearrange, "repeat": repeat}
    exec(compile(ast.Module(body=definitions, type_ignores=[]), path, "exec"), namespace)
    return torch, namespace["selective_scan_ref"]


def _bc(rng, batch, groups, state, steps):
    """``B`` or ``C``: grouped ``[Bt, G, N, L]`` or not ``[Bt, N, L]``, drawn."""
    grouped = rng.integers(2)
    return rng.standard_normal((batch, groups, state, steps) if grouped
                               else (batch, state, steps))


def _case(rng):
    """Mamba's arrays in float64 (A negative, delta positive), grouped B and C drawn, D, z,
    delta_bias each present or not, and ``delta_softplus``."""
    batch, groups = int(rng.integers(1, 3)), int(rng.choice((1, 2)))
    channels, state, steps = groups * int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(
        rng.integers(1, 6))
    case = {"u": rng.standard_normal((batch, channels, steps)),
            "delta": rng.uniform(0.05, 0.6, (batch, channels, steps)),
            "A": -np.exp(0.5 * rng.standard_normal((channels, state))),
            "B": _bc(rng, batch, groups, state, steps),
            "C": _bc(rng, batch, groups, state, steps),
            "D": rng.standard_normal(channels) if rng.integers(2) else None,
            "z": rng.standard_normal((batch, channels, steps)) if rng.integers(2) else None,
            "delta_bias": rng.uniform(0, 0.3, channels) if rng.integers(2) else None}
    return case, {"delta_softplus": bool(rng.integers(2))}


def _present(case):
    return tuple(n for n in NAMES if case[n] is not None)


def _theirs(case, settings, dtype, *, a_dtype=None, grad=None):
    """Their ``(out, last_state)`` as NumPy from tensors of ``dtype`` (``A`` of
    ``a_dtype``, default ``dtype``); with ``grad = (d_out, d_last)`` their autograd
    gradients of every array present instead."""
    torch, reference = _reference()
    tensors = {n: torch.from_numpy(np.asarray(case[n], a_dtype if n == "A" and a_dtype
                                              else dtype)).requires_grad_(grad is not None)
               for n in _present(case)}
    out, last = reference(**tensors, **settings, return_last_state=True)
    if grad is None:
        return out.detach().numpy(), last.detach().numpy()
    loss = (out * torch.from_numpy(grad[0]).to(out.dtype)).sum() + (
        last * torch.from_numpy(grad[1]).to(last.dtype)).sum()
    return tuple(g.numpy() for g in torch.autograd.grad(loss, tuple(tensors.values())))


def _ours(case, settings, dtype, *, grad=None):
    """gradcells's ``(y, last_state)`` in ``dtype``, or with ``grad`` its gradients of every
    array present."""
    arrays = {n: np.asarray(case[n], dtype) for n in _present(case)}
    positional = [arrays.pop(n) for n in NAMES[:5]]
    result = scans.selective_scan(*positional, **arrays, **settings, return_last_state=True)
    if grad is None:
        return tuple(result)
    grads = scans.selective_scan_grad(*positional, result, **arrays, d_y=grad[0].astype(dtype),
                                      d_last_state=grad[1].astype(dtype))
    return tuple(getattr(grads, n) for n in _present(case))


def forward_verdict(rng, *, dtype):
    """``selective_scan_ref`` against ``selective_scan`` in ``dtype`` (float64: ``A``
    float32 too, the one float64 call it takes); for float64, fault 90's model: gradcells
    computing in float32."""
    case, settings = _case(rng)
    theirs = _theirs(case, settings, dtype, a_dtype=np.float32)
    pairs = list(zip(("out", "last_state"), theirs, strict=True))
    claim = compare([(n, t, o) for (n, t), o in zip(pairs, _ours(case, settings, dtype),
                                                      strict=True)], FLOAT32_FORWARD
                    if dtype == np.float32 else (1e-10, 1e-12))
    if dtype == np.float32:
        return judge(claim, None)
    return judge(claim, lambda: compare(
        [(n, t, o) for (n, t), o in zip(pairs, _ours(case, settings, np.float32), strict=True)],
        FLOAT32_FORWARD))


def float64_verdict(rng):
    """``selective_scan_ref`` given every array in float64: fault 91's model, the
    RuntimeError of its einsum of float32 ``delta`` with float64 ``A``; where the einsum
    promotes instead (a size-1 axis takes another path), fault 90's: gradcells computing
    in float32."""
    case, settings = _case(rng)
    try:
        theirs = _theirs(case, settings, np.float64)
    except RuntimeError as error:
        if "expected scalar type" not in str(error):     # Double but found Float, or back
            raise
        return replace(refused("selective_scan_ref", f"{type(error).__name__}: {error}"),
                       entries=(91,))
    pairs = list(zip(("out", "last_state"), theirs, strict=True))
    claim = compare([(n, t, o) for (n, t), o in zip(pairs, _ours(case, settings, np.float64),
                                                      strict=True)], (1e-10, 1e-12))
    if claim.agrees:
        return Verdict(claim)
    model = compare([(n, t, o) for (n, t), o in zip(pairs, _ours(case, settings, np.float32),
                                                      strict=True)], FLOAT32_FORWARD)
    return Verdict(claim, model, entries=(90,))


def gradients_verdict(rng):
    """Their float32 autograd of ``selective_scan_ref`` (a loss on ``out`` and
    ``last_state``) against ``selective_scan_grad`` in float32."""
    case, settings = _case(rng)
    ours = _ours(case, settings, np.float32)
    grad = tuple(rng.standard_normal(v.shape) for v in ours)
    theirs = _theirs(case, settings, np.float32, grad=grad)
    mine = _ours(case, settings, np.float32, grad=grad)
    return judge(compare(list(zip(_present(case), theirs, mine, strict=True)),
                         FLOAT32_GRADIENT), None)


def _with_args(case, names, args):
    """The case with the arrays ``names`` replaced by ``args``."""
    return {**case, **dict(zip(names, args, strict=True))}


def _outputs(case, settings, names, *args):
    """Their forward at ``args`` (float64, ``A`` float32): what the oracle differences."""
    return _theirs(_with_args(case, names, args), settings, np.float64, a_dtype=np.float32)


def _claimed_vjp(case, settings, names, ct, *args):
    """Their autograd at ``args`` for the arrays ``names`` (``A``, float32, left out)."""
    grads = _theirs(_with_args(case, names, args), settings, np.float64, a_dtype=np.float32,
                    grad=ct)
    return tuple(g for n, g in zip(_present(case), grads, strict=True) if n != "A")


def _gradients_in_float32(case, settings):
    """Fault 90's model of a gradient: their float64 autograd against gradcells's in
    float32."""
    ours = _ours(case, settings, np.float32)
    grad = tuple(np.random.default_rng(1).standard_normal(v.shape) for v in ours)
    theirs = _theirs(case, settings, np.float64, a_dtype=np.float32, grad=grad)
    mine = _ours(case, settings, np.float32, grad=grad)
    return compare(list(zip(_present(case), theirs, mine, strict=True)), FLOAT32_GRADIENT)


def oracle_verdict(rng):
    """Their autograd of ``selective_scan_ref`` on float64 tensors (``A`` float32, the one
    float64 call it takes) against central differences of its forward; fault 90's model:
    their gradients equal gradcells's computed in float32."""
    case, settings = _case(rng)
    names = tuple(n for n in _present(case) if n != "A")
    report = check_vjp(functools.partial(_outputs, case, settings, names),
                       functools.partial(_claimed_vjp, case, settings, names),
                       [case[n] for n in names], names=names, seed=0)
    return judge(oracle_outcome(report),
                 functools.partial(_gradients_in_float32, case, settings))


def cuda_verdict(rng) -> Verdict:
    """The CUDA kernel: GPU only."""
    raise Skipped("selective_scan_fn (and mamba_ssm #368's reverse with padding) is the CUDA "
                  "extension: it needs a GPU and the extension built (installed here with "
                  "MAMBA_SKIP_CUDA_BUILD=TRUE); its backward ignores the last state's "
                  "gradient by its docstring")


CHECKS = (
    Check("selective_scan_ref, float32, vs gradcells (selective_scan)",
          functools.partial(forward_verdict, dtype=np.float32)),
    Check("selective_scan_ref, float64 (A float32), vs gradcells (selective_scan)",
          functools.partial(forward_verdict, dtype=np.float64), fault=90),
    Check("selective_scan_ref, every array float64", float64_verdict, fault=(90, 91)),
    Check("selective_scan_ref autograd, float32, vs gradcells (selective_scan_grad)",
          gradients_verdict),
    Check("selective_scan_ref autograd, float64 (A float32), vs oracle", oracle_verdict,
          fault=90),
    Check("selective_scan_fn (CUDA kernel)", cuda_verdict),
)


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the Mamba audit; ImportError without mamba-ssm."""
    _reference()
    return (f"gradcells audit of {SECTION} {version('mamba-ssm')} selective_scan_ref (CPU; "
            "its definition read from the installed file, nothing of the package imported)",
            CHECKS, [])
