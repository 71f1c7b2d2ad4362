"""The oracle's second edition (docs/spec.md §12): ``check_vjp``'s kink detection, errors in
ulps, repeat (determinism) check and fast directional mode, and ``taylor_test``."""

import numpy as np
import pytest

import gradcells as gc


def relu(a):
    return np.maximum(a, 0.0)


def relu_vjp(ct, a):
    return (ct * (a > 0),)


def tanh_xw(x, w):
    return np.tanh(x @ w)


def tanh_xw_vjp(ct, x, w):
    dz = ct * (1 - np.tanh(x @ w) ** 2)
    return dz @ w.T, x.T @ dz


@pytest.fixture
def xw(rng):
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 2))


# kinks ---------------------------------------------------------------------------------


def test_a_relus_kink_is_reported_as_a_kink_not_a_failure():
    a = np.array([-1.0, 0.0, 2.0, 0.0])
    report = gc.check_vjp(relu, relu_vjp, (a,))
    assert report.passed, report
    assert report.checks[0].kinks == 2
    assert "2 kinks, not differentiable" in str(report)


def test_a_clip_boundary_is_a_kink_and_either_one_sided_claim_passes():
    a = np.array([0.3, 1.0, -1.0])
    for passes_at_boundary in (True, False):
        def vjp(ct, a, passes=passes_at_boundary):
            inside = (np.abs(a) <= 1) if passes else (np.abs(a) < 1)
            return (ct * inside,)
        report = gc.check_vjp(lambda a: np.clip(a, -1, 1), vjp, (a,))
        assert report.passed and report.checks[0].kinks == 2, report


def test_a_wrong_claim_at_a_kink_still_fails():
    a = np.array([0.0, 1.0])
    report = gc.check_vjp(relu, lambda ct, a: (ct * 5.0,), (a,))
    assert not report.passed


def test_a_strongly_curved_smooth_function_is_never_a_kink(rng):
    a = rng.uniform(-1, 1, 20)
    report = gc.check_vjp(lambda a: np.sin(1000 * a),
                          lambda ct, a: (1000 * np.cos(1000 * a) * ct * (1 + 1e-5),), (a,))
    assert not report.passed and report.checks[0].kinks == 0


# ulps and the repeat -------------------------------------------------------------------


def test_a_float32_claims_error_is_given_in_its_ulps(xw):
    x32, w32 = (a.astype(np.float32) for a in xw)
    report = gc.check_vjp(tanh_xw, tanh_xw_vjp, (x32, w32))
    assert report.passed
    assert all(c.max_ulp is not None and 0 <= c.max_ulp < 64 for c in report.checks), report
    assert "max ulps" in str(report)
    assert all(c.max_ulp is None for c in gc.check_vjp(tanh_xw, tanh_xw_vjp, xw).checks)


def test_a_claim_that_differs_when_computed_again_fails(xw, rng):
    def noisy(ct, x, w):
        dx, dw = tanh_xw_vjp(ct, x, w)
        return dx + 1e-15 * rng.standard_normal(dx.shape), dw

    report = gc.check_vjp(tanh_xw, noisy, xw)
    assert not report.passed and not report.checks[0].deterministic
    assert report.checks[1].passed
    assert "not deterministic" in str(report)
    assert gc.check_vjp(tanh_xw, noisy, xw, repeat=False).passed


# the fast mode -------------------------------------------------------------------------


def test_the_fast_mode_checks_one_direction_and_reports_one_row(xw):
    calls = []

    def counted(x, w):
        calls.append(1)
        return tanh_xw(x, w)

    report = gc.check_vjp(counted, tanh_xw_vjp, xw, fast=True)
    assert report.passed and [c.name for c in report.checks] == ["<g, u>"]
    assert report.checks[0].checked == 1
    assert len(calls) == 3                     # f(a), then f(a ± h·u)


def test_the_fast_mode_gives_the_full_report_on_a_failure(xw):
    def off(ct, x, w):
        dx, dw = tanh_xw_vjp(ct, x, w)
        dw = dw.copy()
        dw[1, 0] += 1e-4
        return dx, dw

    report = gc.check_vjp(tanh_xw, off, xw, fast=True)
    assert [c.name for c in report.checks] == ["arg0", "arg1"]
    assert report["arg1"].failures == 1 and report["arg1"].index == (1, 0)


# the Taylor test -----------------------------------------------------------------------


def test_the_taylor_test_passes_a_right_gradient_at_slope_two(xw):
    report = gc.taylor_test(tanh_xw, tanh_xw_vjp, xw)
    assert report.passed and abs(report.slope - 2) < 0.05, report
    assert "slope" in str(report)


@pytest.mark.parametrize("error", [1e-4, 1e-2])
def test_the_taylor_test_fails_a_wrong_gradient_at_slope_one(xw, error):
    def off(ct, x, w):
        dx, dw = tanh_xw_vjp(ct, x, w)
        return dx * (1 + error), dw

    report = gc.taylor_test(tanh_xw, off, xw)
    assert not report.passed and report.slope < 1.6, report
    with pytest.raises(gc.GradientCheckError, match="Taylor test failed"):
        report.raise_if_failed()


def test_the_taylor_test_needs_no_step_for_any_scale(rng):
    a = rng.standard_normal(6)
    for scale in (1e-8, 1.0, 1e8):
        report = gc.taylor_test(lambda a, s=scale: s * np.sin(a),
                                lambda ct, a, s=scale: (s * np.cos(a) * ct,), (a,))
        assert report.passed, report


def test_the_taylor_test_of_a_linear_function_passes_on_noise_alone(rng):
    a = rng.standard_normal(5)
    assert gc.taylor_test(lambda a: 3 * a, lambda ct, a: (3 * ct,), (a,)).passed
    assert not gc.taylor_test(lambda a: 3 * a, lambda ct, a: (3.01 * ct,), (a,)).passed


def test_the_taylor_test_of_a_gradcells_sequence(rng):
    case = gc.testing.lstm_sequence_case(rng, peephole=True, ragged=True, layer_norm=True)
    f, vjp, args, _ = gc.testing.lstm_sequence_vjp_pair(case)
    assert gc.taylor_test(f, vjp, args).passed
