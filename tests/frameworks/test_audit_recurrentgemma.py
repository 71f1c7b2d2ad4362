"""The audit of recurrentgemma's RG-LRU (``gradcells.audit.recurrentgemma``): its torch layer's
forward and autograd agree with gradcells's but for fault 80 (its scan in float32) and, where
its bound acts, convention 81 (``SqrtBoundDerivative``), each shown here on its own. The
whole audit runs once (``tests/audit_runs.py``).

Every test skips where recurrentgemma's torch layers do not import (``pip install --no-deps
recurrentgemma`` with ``einops``, ``jaxtyping``, ``typeguard<3``, ``sentencepiece``).
"""

import numpy as np
import pytest
from audit_runs import whole_audit

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="module")
def rg_audit():
    pytest.importorskip("recurrentgemma.torch.layers",
                        reason="recurrentgemma's torch layers do not import here")
    from gradcells.audit import recurrentgemma

    return recurrentgemma


def _row(text, name):
    line = next(line for line in text.splitlines() if line.startswith(name + "  "))
    return line[len(name):].split(None, 1)[1]


def test_the_recurrentgemma_audit_shows_only_its_listed_entries(rg_audit):
    status, text = whole_audit("recurrentgemma")
    assert status == 0, text
    for check in rg_audit.CHECKS:
        result = _row(text, check.name)
        assert result.startswith(("known fault", "convention", "agrees")), (check.name, result)
    assert "known fault 80" in text and "convention 81" in text


def test_fault_80_the_scan_runs_in_float32(rg_audit):
    """A float64 layer on float64 input: the final state comes back float32 and the
    outputs differ from gradcells's float64 ones by float32's rounding, not more."""
    rng = np.random.default_rng(3)
    case = rg_audit._case(rng)
    d_y, d_last = np.zeros(case["x"].shape), np.zeros(case["x"].shape[::2])
    y, last, _ = rg_audit._theirs(case, d_y, d_last)
    y_g, last_g, _ = rg_audit._gradcells(case, d_y, d_last, None)
    error = np.abs(y - y_g).max()
    assert 1e-12 < error < 1e-5 * max(1.0, np.abs(y_g).max())
    np.testing.assert_allclose(last, last_g, rtol=1e-5, atol=1e-6)


def test_convention_81_the_sqrt_derivative_is_bounded_at_1000(rg_audit):
    """Where ``1 - a² < 1/(4·1000²)`` its ``a_param`` gradient is gradcells's with
    ``sqrt_grad_bound=1000`` (to float32's rounding, fault 80) and far from the true one."""
    rng = np.random.default_rng(4)
    case = rg_audit._case(rng, long_memory=True)
    d_y = rng.standard_normal(case["x"].shape)
    d_last = np.zeros(case["x"].shape[::2])
    _, _, theirs = rg_audit._theirs(case, d_y, d_last)
    _, _, bounded = rg_audit._gradcells(case, d_y, d_last, 1000.0)
    _, _, true = rg_audit._gradcells(case, d_y, d_last, None)
    np.testing.assert_allclose(theirs["a_param"], bounded["a_param"], rtol=1e-4, atol=1e-5)
    assert np.abs(true["a_param"] - theirs["a_param"]).max() > 10 * np.abs(
        bounded["a_param"] - theirs["a_param"]).max()
