"""gradcells's ``linear_scan`` against flash-linear-attention's HGRN references (PyPI
``flash-linear-attention``, 0.6.0 when written; docs/spec.md §18.1, §20): HGRN's
``h_t = exp(g_t)∘h_{t-1} + x_t`` is ``linear_scan(exp(g), x, h0, batch_first=True)``.

Its references are plain PyTorch in ``fla/ops/hgrn/naive.py``, loaded by path as the audit
does (``fla.ops`` imports Triton first). Faults 100 (float64 computed in float32) and 101 (the
chunked reference runs only at one chunk) are shown here; the whole audit runs once.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from audit_runs import whole_audit

import gradcells as gc

pytest.importorskip("torch")
if importlib.util.find_spec("fla") is None:
    pytest.skip("flash-linear-attention is not installed", allow_module_level=True)

from gradcells.audit import fla as audit_fla  # noqa: E402  (after the skip)


def _case(steps=8):
    rng = np.random.default_rng(3)
    return {"x": rng.standard_normal((2, steps, 3)),
            "g": -rng.uniform(0.05, 1.0, (2, steps, 3)), "h0": rng.standard_normal((2, 3))}


def test_fault_100_float64_is_computed_in_float32():
    case = _case()
    out, final = audit_fla._theirs(case, np.float64)
    ours = gc.linear_scan(np.exp(case["g"]), case["x"], case["h0"], batch_first=True)
    error = np.abs(out - ours.h).max()
    assert out.dtype == np.float64 and 1e-9 < error < 1e-5
    in32 = gc.linear_scan(*(a.astype(np.float32) for a in (np.exp(case["g"]), case["x"],
                                                           case["h0"])), batch_first=True)
    np.testing.assert_allclose(out, in32.h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final, in32.h_final, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("steps", [100, 128])
def test_fault_101_chunked_reference_needs_one_chunk(steps):
    with pytest.raises(RuntimeError, match="is invalid for input of size"):
        audit_fla._theirs(_case(steps), np.float32, chunk=True)


def test_the_chunked_reference_of_one_chunk_is_the_recurrence():
    case = _case(audit_fla.CHUNK)
    for theirs, stepped in zip(audit_fla._theirs(case, np.float32, chunk=True),
                               audit_fla._theirs(case, np.float32), strict=True):
        np.testing.assert_allclose(theirs, stepped, rtol=1e-5, atol=1e-6)


@pytest.mark.conformance
def test_the_fla_audit_agrees_or_shows_its_listed_faults():
    status, text = whole_audit("fla")
    assert status == 0, text
    for check in audit_fla.CHECKS:
        line = next(row for row in text.splitlines() if row.startswith(check.name + "  "))
        result = line[len(check.name):].split(None, 1)[1]
        expected = ("skipped" if "Triton" in check.name
                    else f"known fault {check.fault}" if check.fault else "agrees")
        assert result.startswith(expected), (check.name, result)
