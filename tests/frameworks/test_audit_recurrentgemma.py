"""The audit of recurrentgemma's RG-LRU (``gradcells.audit.recurrentgemma``): its torch layer's
forward and autograd agree with gradcells's but for fault 80 (its scan in float32) and, where
its bound acts, convention 81 (``SqrtBoundDerivative``); its JAX layer's (both CPU scans) but
for fault 82 (its scan in float32 too) and convention 81 in float64, and agree in float32;
each shown here on its own. The whole audit runs once (``tests/audit_runs.py``).

The torch tests skip where recurrentgemma's torch layers do not import (``pip install
--no-deps recurrentgemma`` with ``einops``, ``jaxtyping``, ``typeguard<3``,
``sentencepiece``), the JAX ones where its JAX layers do not (``jax``, ``flax``).
"""

import sys

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


@pytest.fixture(scope="module")
def rg_jax():
    pytest.importorskip("recurrentgemma.jax.layers",
                        reason="recurrentgemma's JAX layers do not import here")
    from gradcells.audit import recurrentgemma

    return recurrentgemma


def test_the_recurrentgemma_audit_shows_only_its_listed_entries(rg_audit):
    status, text = whole_audit("recurrentgemma")
    assert status == 0, text
    for check in rg_audit.TORCH_CHECKS:
        result = _row(text, check.name)
        assert result.startswith(("known fault", "convention", "agrees")), (check.name, result)
    assert "known fault 80" in text and "convention 81" in text


def test_the_jax_rows_show_fault_82_in_float64_and_agree_in_float32(rg_jax):
    """Each CPU scan: its float64 rows show fault 82 (the bound's row with convention 81),
    its float32 rows agree; the Pallas scan's rows are skipped on a CPU, with the reason."""
    import jax

    status, text = whole_audit("recurrentgemma")
    assert status == 0, text
    for scan in rg_jax.SCANS:
        name = f"RGLRU (JAX, {scan})"
        assert _row(text, f"{name} forward (float64) vs gradcells (rglru_sequence, resets)"
                    ).startswith("known fault 82")
        assert _row(text, f"{name} vjp where its sqrt bound acts vs gradcells "
                    "(rglru_sequence_grad)").startswith("convention 81 + known fault 82")
        for row in ("forward (float32) vs gradcells (rglru_sequence, resets)",
                    "vjp (float32) vs gradcells (rglru_sequence_grad)"):
            assert _row(text, f"{name} {row}").startswith("agrees"), row
    pallas = [c for c in rg_jax.JAX_CHECKS if "LINEAR_PALLAS" in c.name]
    if jax.default_backend() == "cpu":
        assert all(_row(text, c.name).startswith("skipped") for c in pallas)
        assert "interpret mode" in _row(text, pallas[0].name)


def test_a_jax_row_leaves_jaxs_x64_setting_as_it_found_it(rg_jax):
    """A float64 row switches x64 on around its calls only: under the opposite of this
    process's setting (other test files set it), the setting is the same after the row."""
    import jax

    from gradcells.audit._engine import run_check

    setting = not jax.config.jax_enable_x64
    check = next(c for c in rg_jax.JAX_CHECKS if "forward (float64)" in c.name)
    with jax.enable_x64(setting):
        row = run_check(check, np.random.default_rng(0), 1)
        assert jax.config.jax_enable_x64 is setting
    assert row.result.startswith("known fault 82"), row


def test_a_jax_row_without_recurrentgemma_jax_is_skipped(rg_audit, monkeypatch):
    """Where ``recurrentgemma.jax`` does not import, its rows are skipped with the reason."""
    from gradcells.audit._engine import run_check

    monkeypatch.setitem(sys.modules, "recurrentgemma.jax.layers", None)
    row = run_check(rg_audit.JAX_CHECKS[0], np.random.default_rng(0), 1)
    assert row.result == "skipped" and "recurrentgemma.jax does not import" in row.detail
    assert not row.unexpected


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


def test_fault_82_the_jax_scan_runs_in_float32(rg_jax):
    """With x64 on, a float64 JAX layer (either CPU scan) on float64 input: the final state
    comes back float32, the outputs are float32 numbers, off gradcells's float64 ones by
    float32's rounding; in float32 it agrees with gradcells to float32's tolerance."""
    for scan in rg_jax.SCANS:
        rng = np.random.default_rng(5)
        case = rg_jax._case(rng, even=True)
        d_y, d_last = np.zeros(case["x"].shape), np.zeros(case["x"].shape[::2])
        y, last, _ = rg_jax._jax_layer(scan, "float64", case, d_y, d_last)
        y_g, last_g, _ = rg_jax._gradcells(case, d_y, d_last, None)
        np.testing.assert_array_equal(y, y.astype(np.float32))
        np.testing.assert_array_equal(last, last.astype(np.float32))
        error = np.abs(y - y_g).max()
        assert 1e-12 < error < 1e-5 * max(1.0, np.abs(y_g).max()), scan
        np.testing.assert_allclose(last, last_g, rtol=1e-5, atol=1e-6)


def test_convention_81_in_jax_the_sqrt_derivative_is_bounded_at_1000(rg_jax):
    """JAX's ``sqrt_bound_derivative``: where ``1 - a² < 1/(4·1000²)`` its ``a_param``
    gradient is gradcells's with ``sqrt_grad_bound=1000`` (to float32's rounding, fault 82)
    and far from the true one."""
    rng = np.random.default_rng(4)
    case = rg_jax._case(rng, long_memory=True, even=True)
    d_y = rng.standard_normal(case["x"].shape)
    d_last = np.zeros(case["x"].shape[::2])
    _, _, theirs = rg_jax._jax_layer("LINEAR_NATIVE", "float64", case, d_y, d_last)
    _, _, bounded = rg_jax._gradcells(case, d_y, d_last, 1000.0)
    _, _, true = rg_jax._gradcells(case, d_y, d_last, None)
    np.testing.assert_allclose(theirs["a_param"], bounded["a_param"], rtol=1e-4, atol=1e-5)
    assert np.abs(true["a_param"] - theirs["a_param"]).max() > 10 * np.abs(
        bounded["a_param"] - theirs["a_param"]).max()
