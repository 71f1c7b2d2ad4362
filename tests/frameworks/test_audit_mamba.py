"""The audit of Mamba's ``selective_scan_ref`` (``gradcells.audit.mamba``; docs/spec.md
§18.4, §20): its two known faults shown directly, and the whole audit agreeing or showing
only them. Skipped without mamba-ssm (installed with ``MAMBA_FORCE_BUILD=TRUE
MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-deps --no-build-isolation mamba-ssm``), torch
or einops; nothing of the package is imported (its definition is read from the file)."""

from __future__ import annotations

import numpy as np
import pytest
from audit_runs import whole_audit

import gradcells as gc

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="module")
def reference():
    from gradcells.audit import mamba

    try:
        return mamba._reference()
    except ImportError as error:
        pytest.skip(f"mamba-ssm's selective_scan_ref is not available: {error}")


def _arrays(dtype):
    rng = np.random.default_rng(0)
    return [v.astype(dtype) for v in (
        rng.standard_normal((2, 4, 6)), rng.uniform(0.05, 0.6, (2, 4, 6)),
        -np.exp(rng.standard_normal((4, 3))), rng.standard_normal((2, 3, 6)),
        rng.standard_normal((2, 2, 3, 6)))]


def test_fault_90_float64_is_computed_in_float32(reference):
    """Float64 ``u, delta, B, C`` (``A`` float32): a float64 ``out`` that misses gradcells's
    float64 result by float32's rounding and equals gradcells's float32 one."""
    torch, ref = reference
    arrays = _arrays(np.float64)
    tensors = [torch.from_numpy(v.astype(np.float32) if k == 2 else v)
               for k, v in enumerate(arrays)]
    out, last = ref(*tensors, delta_softplus=True, return_last_state=True)
    assert out.dtype == torch.float64 and last.dtype == torch.float32
    ours64 = gc.selective_scan(*arrays[:2], arrays[2].astype(np.float32).astype(np.float64),
                               *arrays[3:], delta_softplus=True)
    ours32 = gc.selective_scan(*(v.astype(np.float32) for v in arrays), delta_softplus=True)
    assert np.abs(out.numpy() - ours64.y).max() > 1e-12
    np.testing.assert_allclose(out.numpy(), ours32.y, rtol=1e-5, atol=1e-6)


def test_fault_91_float64_throughout_raises(reference):
    torch, ref = reference
    with pytest.raises(RuntimeError, match="expected scalar type"):
        ref(*(torch.from_numpy(v) for v in _arrays(np.float64)))
    arrays = _arrays(np.float64)
    gc.check_vjp(lambda *a: gc.selective_scan(*a).y,
                 lambda ct, *a: tuple(gc.selective_scan_grad(*a, gc.selective_scan(*a),
                                                             d_y=ct))[:5],
                 arrays).raise_if_failed()


def test_the_mamba_audit_agrees_or_shows_its_listed_faults(reference):
    from gradcells.audit import mamba as audit_mamba

    status, text = whole_audit("mamba", examples=2)
    assert status == 0, text
    for check in audit_mamba.CHECKS:
        line = next(row for row in text.splitlines() if row.startswith(check.name + "  "))
        result = line[len(check.name):].split(None, 1)[1]
        if check.fault is None:
            assert result.startswith(("agrees", "skipped")), (check.name, result)
        else:
            assert result.startswith("known fault"), (check.name, result)
