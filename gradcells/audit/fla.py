"""The audit of flash-linear-attention's HGRN references (PyPI ``flash-linear-attention``,
package ``fla``; Qin et al. 2023's HGRN): its plain-PyTorch recurrences against gradcells's
``linear_scan`` and the oracle (docs/spec.md §18.1, §20).

HGRN's recurrence is the diagonal linear recurrence with its forget gate in log space,
batch-first:

    h_t = exp(g_t)∘h_{t-1} + x_t,        x, g: [B, T, D],  h0: [B, D]

which is ``linear_scan(a=exp(g), b=x, h0, batch_first=True)``; ``d_g = d_a∘exp(g)``.
``naive_recurrent_hgrn`` (step by step) and ``naive_chunk_hgrn`` (chunks of 64 steps) live in
``fla/ops/hgrn/naive.py``, plain PyTorch; the package's ``fla.ops`` imports Triton first, so
the audit loads that file from the installed package by its path and needs no Triton. The
Triton kernels (``fused_recurrent_hgrn``, ``chunk_hgrn``) run on a GPU only: their row is
skipped here, with the reason.
"""

from __future__ import annotations

import functools
import importlib.util
from importlib.metadata import version
from pathlib import Path

import numpy as np

from .. import scans
from ..oracle import check_vjp
from ._engine import (
    AGREES,
    FAILED,
    FLOAT32_FORWARD,
    FLOAT32_GRADIENT,
    FLOAT64,
    Check,
    Skipped,
    Verdict,
    compare,
    judge,
    oracle_outcome,
)

SECTION = "flash-linear-attention"
CHUNK = 64
"""``naive_chunk_hgrn``'s default chunk size."""


@functools.cache
def _naive():
    """``(torch, fla/ops/hgrn/naive.py as a module)``; ImportError without the package."""
    import torch

    found = importlib.util.find_spec("fla")
    if found is None or not found.submodule_search_locations:
        raise ImportError("No module named 'fla'")
    path = Path(found.submodule_search_locations[0], "ops", "hgrn", "naive.py")
    spec = importlib.util.spec_from_file_location("_gradcells_audit_fla_hgrn_naive", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no HGRN reference at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return torch, module


def _case(rng, *, steps=None):
    """``x, g [B, T, D]`` (``g = log σ(·)``: HGRN's gates, negative) and ``h0 [B, D]``."""
    steps = int(rng.integers(2, 7)) if steps is None else steps
    batch, dim = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    logits = rng.standard_normal((batch, steps, dim)) + 1.0
    return {"x": rng.standard_normal((batch, steps, dim)),
            "g": -np.logaddexp(0.0, -logits), "h0": rng.standard_normal((batch, dim))}


def _theirs(case, dtype, *, chunk=False):
    """Their ``(o [B, T, D], final [B, D])`` as NumPy, from tensors of ``dtype``."""
    torch, naive = _naive()
    function = naive.naive_chunk_hgrn if chunk else naive.naive_recurrent_hgrn
    x, g, h0 = (torch.from_numpy(case[k].astype(dtype)) for k in ("x", "g", "h0"))
    with torch.no_grad():
        out, final = function(x, g, h0, output_final_state=True)
    return out.numpy(), final.numpy()


def _ours(case, dtype):
    """gradcells's ``LinearScan`` of the case in ``dtype``."""
    x, g, h0 = (case[k].astype(dtype) for k in ("x", "g", "h0"))
    return scans.linear_scan(np.exp(g), x, h0, batch_first=True)


def forward_verdict(rng, *, dtype):
    """``naive_recurrent_hgrn`` against ``linear_scan`` in ``dtype``; for float64, fault
    100's model: gradcells computing in float32 (their outputs are float32 results)."""
    case = _case(rng)
    out, final = _theirs(case, dtype)
    ours = _ours(case, dtype)
    tolerance = FLOAT64 if dtype == np.float64 else FLOAT32_FORWARD
    claim = compare([("o", out, ours.h), ("final_state", final, ours.h_final)], tolerance)
    if dtype != np.float64:
        return judge(claim, None)
    in32 = _ours(case, np.float32)
    return judge(claim, lambda: compare(
        [("o", out, in32.h), ("final_state", final, in32.h_final)], FLOAT32_FORWARD))


def _claimed_vjp(case, dtype, ct_o, ct_final, x, g, h0):
    """Their autograd of ``<ct_o, o> + <ct_final, final>`` for ``(x, g, h0)``."""
    torch, naive = _naive()
    x, g, h0 = (torch.from_numpy(np.asarray(a, dtype)).requires_grad_() for a in (x, g, h0))
    out, final = naive.naive_recurrent_hgrn(x, g, h0, output_final_state=True)
    loss = (out * torch.from_numpy(ct_o.astype(dtype))).sum() + (
        final * torch.from_numpy(ct_final.astype(dtype))).sum()
    return tuple(d.numpy() for d in torch.autograd.grad(loss, (x, g, h0)))


def _our_vjp(case, dtype, ct_o, ct_final):
    """``linear_scan_grad``'s ``(d_x, d_g, d_h0)`` in ``dtype`` (``d_g = d_a∘exp(g)``)."""
    x, g, h0 = (case[k].astype(dtype) for k in ("x", "g", "h0"))
    a = np.exp(g)
    result = scans.linear_scan(a, x, h0, batch_first=True)
    grads = scans.linear_scan_grad(a, x, h0, result, d_h=ct_o.astype(dtype),
                                       d_h_final=ct_final.astype(dtype))
    return grads.b, grads.a * a, grads.h0


def gradients_verdict(rng):
    """Their float32 autograd of ``naive_recurrent_hgrn`` (the outputs and the final state)
    against ``linear_scan_grad`` in float32."""
    case = _case(rng)
    ct_o, ct_final = rng.standard_normal(case["x"].shape), rng.standard_normal(case["h0"].shape)
    theirs = _claimed_vjp(case, np.float32, ct_o, ct_final, case["x"], case["g"], case["h0"])
    ours = _our_vjp(case, np.float32, ct_o, ct_final)
    return judge(compare(list(zip(("x", "g", "h0"), theirs, ours, strict=True)),
                         FLOAT32_GRADIENT), None)


def _outputs(case, x, g, h0):
    torch, naive = _naive()
    with torch.no_grad():
        out, final = naive.naive_recurrent_hgrn(*(torch.from_numpy(a) for a in (x, g, h0)),
                                                output_final_state=True)
    return out.numpy(), final.numpy()


def _gradients_in_float32(case):
    """Fault 100's model of a gradient: their float64 autograd against gradcells's in
    float32."""
    ct_o = np.random.default_rng(1).standard_normal(case["x"].shape)
    ct_final = np.random.default_rng(2).standard_normal(case["h0"].shape)
    theirs = _claimed_vjp(case, np.float64, ct_o, ct_final, case["x"], case["g"], case["h0"])
    ours = _our_vjp(case, np.float32, ct_o, ct_final)
    return compare(list(zip(("x", "g", "h0"), theirs, ours, strict=True)), FLOAT32_GRADIENT)


def oracle_verdict(rng):
    """Their autograd of ``naive_recurrent_hgrn`` on float64 tensors against central
    differences of its forward; fault 100's model: their gradients equal gradcells's computed
    in float32."""
    case = _case(rng)
    report = check_vjp(functools.partial(_outputs, case),
                       lambda ct, *args: _claimed_vjp(case, np.float64, *ct, *args),
                       (case["x"], case["g"], case["h0"]), names=("x", "g", "h0"), seed=0)
    return judge(oracle_outcome(report), functools.partial(_gradients_in_float32, case))


def chunk_verdict(rng, *, steps):
    """``naive_chunk_hgrn`` against ``naive_recurrent_hgrn`` (float32) at ``steps`` steps;
    fault 101's model: it raises PyTorch's shape error unless ``steps`` is its chunk size."""
    case = _case(rng, steps=steps)
    try:
        chunked = _theirs(case, np.float32, chunk=True)
    except RuntimeError as error:
        shape_error = steps != CHUNK and "is invalid for input of size" in str(error)
        return Verdict(FAILED, AGREES if shape_error else FAILED,
                       raised=f"{type(error).__name__}: {error}")
    stepped = _theirs(case, np.float32)
    return judge(compare([("o", chunked[0], stepped[0]),
                          ("final_state", chunked[1], stepped[1])], FLOAT32_FORWARD), None)


def triton_verdict(rng):
    """The Triton kernels: GPU only."""
    raise Skipped("fused_recurrent_hgrn and chunk_hgrn are Triton kernels: they need a GPU "
                  "(on a CPU Triton finds no active driver)")


CHECKS = (
    Check("HGRN naive_recurrent_hgrn, float32, vs gradcells (linear_scan)",
          functools.partial(forward_verdict, dtype=np.float32)),
    Check("HGRN naive_recurrent_hgrn, float64, vs gradcells (linear_scan)",
          functools.partial(forward_verdict, dtype=np.float64), fault=100),
    Check("HGRN naive_recurrent_hgrn autograd, float32, vs gradcells (linear_scan_grad)",
          gradients_verdict),
    Check("HGRN naive_recurrent_hgrn autograd, float64, vs oracle", oracle_verdict,
          fault=100),
    Check(f"HGRN naive_chunk_hgrn, T = {CHUNK} (its chunk), vs naive_recurrent_hgrn",
          functools.partial(chunk_verdict, steps=CHUNK)),
    Check(f"HGRN naive_chunk_hgrn, T = {CHUNK + 36}, vs naive_recurrent_hgrn",
          functools.partial(chunk_verdict, steps=CHUNK + 36), fault=101),
    Check("HGRN Triton kernels (fused_recurrent_hgrn, chunk_hgrn)", triton_verdict),
)


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the flash-linear-attention audit; ImportError
    without it."""
    _naive()
    return (f"gradcells audit of {SECTION} {version('flash-linear-attention')} HGRN "
            "(CPU; fla/ops/hgrn/naive.py loaded by its path, no Triton)", CHECKS, [])
