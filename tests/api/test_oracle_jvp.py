"""``check_jvp``, the oracle's forward-mode check (docs/spec.md §12): it must pass right
Jacobian-vector products, catch wrong ones at the right element, and work for any function
of arrays."""

from typing import NamedTuple

import numpy as np
import pytest

import gradcells as gc
from gradcells.oracle import GradientCheckError


class Out(NamedTuple):
    y: np.ndarray
    s: np.ndarray


def tanh_sum(x, w):
    return Out(np.tanh(x @ w), (x * x).sum(axis=0))


def tanh_sum_jvp(tangents, x, w):
    dx, dw = (np.zeros_like(a) if t is None else t for a, t in zip((x, w), tangents, strict=True))
    dz = dx @ w + x @ dw
    return Out((1 - np.tanh(x @ w) ** 2) * dz, 2 * (x * dx).sum(axis=0))


@pytest.fixture
def xw(rng):
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 2))


def test_a_right_jvp_passes_every_output_element(xw):
    report = gc.check_jvp(tanh_sum, tanh_sum_jvp, xw)
    assert report.passed, report
    assert [c.name for c in report.checks] == ["y", "s"]          # a NamedTuple's fields
    assert report["y"].checked == 6 and report["s"].checked == 4
    assert report.max_abs_error < 1e-8


def test_a_wrong_jvp_is_caught_at_the_right_element(xw):
    def off(tangents, x, w):
        y, s = tanh_sum_jvp(tangents, x, w)
        y = y.copy()
        y[2, 1] *= 1 + 1e-5
        return Out(y, s)

    report = gc.check_jvp(tanh_sum, off, xw)
    assert not report.passed and report["s"].passed
    assert report["y"].failures == 1 and report["y"].index == (2, 1)
    with pytest.raises(GradientCheckError, match="JVP check failed"):
        report.raise_if_failed()
    assert "output" in str(report).splitlines()[0]


def test_a_dropped_tangent_of_one_argument_is_caught(xw):
    def ignores_w(tangents, x, w):
        return tanh_sum_jvp((tangents[0], None), x, w)

    assert not gc.check_jvp(tanh_sum, ignores_w, xw).passed
    # ... and passes when that argument's tangent is zero: then nothing is dropped.
    assert gc.check_jvp(tanh_sum, ignores_w, xw, wrt=[0]).passed
    tangents = (np.ones((3, 4)), None)
    assert gc.check_jvp(tanh_sum, ignores_w, xw, tangents=tangents).passed


def test_the_tangents_are_seeded_and_can_be_given(xw, rng):
    seen = []

    def recording(tangents, x, w):
        seen.append([None if t is None else t.copy() for t in tangents])
        return tanh_sum_jvp(tangents, x, w)

    for seed in (0, 0, 1):
        gc.check_jvp(tanh_sum, recording, xw, seed=seed, repeat=False)
    np.testing.assert_array_equal(seen[0][0], seen[1][0])
    assert not np.array_equal(seen[0][0], seen[2][0])
    given = (rng.standard_normal((3, 4)), rng.standard_normal((4, 2)))
    gc.check_jvp(tanh_sum, recording, xw, tangents=given, repeat=False).raise_if_failed()
    np.testing.assert_array_equal(seen[-1][1], given[1])


def test_float32_claims_are_held_to_float32_and_differenced_in_float64(xw):
    x32, w32 = (a.astype(np.float32) for a in xw)
    dtypes = []

    def f(x, w):
        dtypes.append(x.dtype)
        return tanh_sum(x, w)

    report = gc.check_jvp(f, tanh_sum_jvp, (x32, w32))
    assert report.passed and report.rtol == 1e-3
    assert dtypes[0] == np.float32 and set(dtypes[1:]) == {np.dtype(np.float64)}


def test_a_strongly_curved_function_passes_by_extrapolation(rng, monkeypatch):
    steps = []
    differences = gc.oracle._directional
    monkeypatch.setattr(gc.oracle, "_directional",
                        lambda along, step, floor: steps.append(step) or differences(
                            along, step, floor))
    a = rng.uniform(-1, 1, 20)
    report = gc.check_jvp(lambda a: np.sin(1000 * a),
                          lambda t, a: 1000 * np.cos(1000 * a) * t[0], (a,))
    assert report.passed, report
    assert steps == [steps[0], 2 * steps[0]]   # the plain difference alone did not pass


def test_extrapolation_still_catches_a_small_error(rng):
    a = rng.uniform(-1, 1, 20)
    report = gc.check_jvp(lambda a: np.sin(1000 * a),
                          lambda t, a: 1000 * np.cos(1000 * a) * t[0] * (1 + 1e-5), (a,))
    assert not report.passed


def test_a_non_finite_claim_fails():
    report = gc.check_jvp(lambda a: 2 * a, lambda t, a: np.full_like(a, np.nan), (np.ones(3),))
    assert not report.passed


def test_a_single_output_and_non_array_arguments(rng):
    a = rng.standard_normal(5)
    report = gc.check_jvp(lambda a, k: a ** k, lambda t, a, k: k * a ** (k - 1) * t[0], (a, 3))
    assert report.passed and [c.name for c in report.checks] == ["out0"]
    with pytest.raises(ValueError, match=r"^nothing to check: wrt=\[\] selects no argument"):
        gc.check_jvp(lambda a, k: a ** k, lambda t, a, k: None, (a, 3), wrt=[])


def test_inputs_are_not_modified(xw):
    before = [a.copy() for a in xw]
    gc.check_jvp(tanh_sum, tanh_sum_jvp, xw)
    for a, b in zip(xw, before, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("tangents, error, message", [
    ((np.ones((3, 4)),), ValueError, "one entry per argument"),
    ((np.ones((4, 3)), None), ValueError, r"tangents\[0\] has shape \(4, 3\)"),
])
def test_bad_tangents_are_named(xw, tangents, error, message):
    with pytest.raises(error, match=message):
        gc.check_jvp(tanh_sum, tanh_sum_jvp, xw, tangents=tangents)


def test_a_tangent_for_a_non_array_is_refused(rng):
    with pytest.raises(TypeError, match="not a float array"):
        gc.check_jvp(lambda a, k: a * k, lambda t, a, k: t[0] * k, (rng.standard_normal(2), 3),
                     tangents=(None, 1.0))


def test_a_claim_of_the_wrong_structure_is_named(xw):
    with pytest.raises(ValueError, match="returned 1 tangents for 2 outputs"):
        gc.check_jvp(tanh_sum, lambda t, x, w: (x,), xw)
    with pytest.raises(ValueError, match="tangent of output 1 has shape"):
        gc.check_jvp(tanh_sum, lambda t, x, w: (x @ w, x), xw)
    with pytest.raises(ValueError, match="one name per output"):
        gc.check_jvp(tanh_sum, tanh_sum_jvp, xw, names=["y"])


def test_torch_functions_and_torch_func_jvp(rng):
    torch = pytest.importorskip("torch")
    x, w = (torch.tensor(a) for a in (rng.standard_normal((3, 4)), rng.standard_normal((4, 2))))

    def f(x, w):
        return torch.tanh(x @ w), (x * x).sum(dim=0)

    def jvp(tangents, x, w):
        return torch.func.jvp(f, (x, w), tuple(tangents))[1]

    gc.check_jvp(f, jvp, (x, w)).raise_if_failed()
    assert not gc.check_jvp(f, lambda t, x, w: tuple(1.001 * v for v in jvp(t, x, w)),
                            (x, w)).passed


def test_a_float32_claim_in_ulps_and_a_claim_that_differs_when_computed_again(xw, rng):
    x32, w32 = (a.astype(np.float32) for a in xw)
    assert all(c.max_ulp is not None for c in gc.check_jvp(tanh_sum, tanh_sum_jvp,
                                                           (x32, w32)).checks)

    def noisy(tangents, x, w):
        y, s = tanh_sum_jvp(tangents, x, w)
        return Out(y + 1e-15 * rng.standard_normal(y.shape), s)

    report = gc.check_jvp(tanh_sum, noisy, xw)
    assert not report.passed and not report["y"].deterministic and report["s"].passed
