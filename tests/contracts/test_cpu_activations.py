"""Accuracy of the CPU backend's vectorizable activations (``gradcells.cpu._activations``).

float32 tanh: every float32 input in [2^-14, 9.02] is checked against the C library's
float64 tanh (an independent reference, within 2 float64 ulp); below 2^-14 the correctly
rounded tanh(x) is x itself (x³/3 is under half an ulp) and above 9.02 it is 1, and both
are checked on samples, so the bound holds over the whole float32 range. float64 tanh is
checked against NumPy and against mpmath.
"""

import math

import numpy as np
import pytest
from numba import njit

from gradcells.cpu import _activations as act

F32_EXHAUSTIVE_FROM = np.float32(2.0**-14)


@njit(cache=True, error_model="numpy")
def _max_ulp_error_float32(first_bits, last_bits):
    """Max error, in float32 ulps of the exact value, of tanh32 over a range of bit patterns
    of positive float32 numbers; returns (error, worst input)."""
    worst, worst_x = 0.0, np.float32(0.0)
    for bits in range(first_bits, last_bits + 1):
        x = act._from_bits(np.uint32(bits))
        exact = math.tanh(np.float64(x))
        ulp = math.ldexp(1.0, math.frexp(exact)[1] - 24)      # float32 ulp at the exact value
        error = abs(np.float64(act.tanh32(x)) - exact) / ulp
        if error > worst:
            worst, worst_x = error, x
    return worst, worst_x


@njit(cache=True, error_model="numpy")
def _tanh_array(z, out):
    for k in range(z.shape[0]):
        out[k] = act.tanh(z[k])


@njit(cache=True, error_model="numpy")
def _sigmoid_array(z, out):
    for k in range(z.shape[0]):
        out[k] = act.sigmoid(z[k])


def _tanh(z):
    out = np.empty_like(z)
    _tanh_array(z, out)
    return out


def _sigmoid(z):
    out = np.empty_like(z)
    _sigmoid_array(z, out)
    return out


def _bits(value):
    return int(np.float32(value).view(np.uint32))


def test_tanh_float32_error_bound_over_every_input():
    clamp = act._CLAMP32
    worst, worst_x = _max_ulp_error_float32(_bits(F32_EXHAUSTIVE_FROM), _bits(clamp))
    assert worst <= act.TANH32_MAX_ULP, (worst, worst_x)
    # The bound is tight (not a loose constant): the measured maximum is above 1 ulp.
    assert worst > 1.0


def test_tanh_float32_below_the_exhaustive_range_returns_its_input():
    # For 0 < x < 2^-14 the correctly rounded tanh(x) is x: |tanh x - x| < x³/3 < ulp(x)/2.
    patterns = np.arange(1, _bits(F32_EXHAUSTIVE_FROM), 997, dtype=np.uint32)
    x = np.concatenate([patterns.view(np.float32), [np.float32(1e-45), np.float32(2.0**-14)]])
    x = np.concatenate([x, -x]).astype(np.float32)
    np.testing.assert_array_equal(_tanh(x), x)


def test_tanh_float32_beyond_the_clamp_is_exactly_one():
    assert np.float32(np.tanh(np.float64(act._CLAMP32))) == 1.0   # float32 tanh is 1 there
    beyond = np.float32([act._CLAMP32, 9.5, 20.0, 1e4, 3.4e38, np.inf])
    np.testing.assert_array_equal(_tanh(beyond), np.ones_like(beyond))
    np.testing.assert_array_equal(_tanh(-beyond), -np.ones_like(beyond))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_special_values(dtype):
    z = np.array([0.0, -0.0, np.nan, np.inf, -np.inf], dtype=dtype)
    t = _tanh(z)
    assert t.dtype == dtype
    assert t[0] == 0 and not np.signbit(t[0]) and t[1] == 0 and np.signbit(t[1])
    assert np.isnan(t[2]) and t[3] == 1 and t[4] == -1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_is_odd_and_monotone(dtype):
    z = np.linspace(0, 12, 200_001).astype(dtype)
    t = _tanh(z)
    np.testing.assert_array_equal(_tanh(-z), -t)
    assert np.all(np.diff(t) >= 0)
    assert np.all(np.abs(t) <= 1)


def _float64_samples():
    rng = np.random.default_rng(7)
    return np.concatenate([
        rng.standard_normal(200_000) * 3,
        rng.uniform(-25, 25, 200_000),
        rng.uniform(-1e-3, 1e-3, 50_000),
        np.linspace(0.6, 0.65, 50_001),          # the switch between the two branches
        np.linspace(-1.5, 1.5, 100_001),
        np.geomspace(1e-300, 30, 20_000),
        [5e-324, 1e-310, 0.625, np.nextafter(0.625, 0), 19.0, 22.0, 23.0],
    ])


def test_tanh_float64_within_1e15_relative_of_numpy():
    z = _float64_samples()
    expected = np.tanh(z)
    rel = np.abs(_tanh(z) - expected) / np.maximum(np.abs(expected), np.finfo(float).tiny)
    assert rel.max() <= act.TANH64_MAX_REL, (rel.max(), z[np.argmax(rel)])


def test_tanh_float64_against_mpmath():
    mpmath = pytest.importorskip("mpmath")
    z = _float64_samples()
    rel = np.abs(_tanh(z) - np.tanh(z)) / np.maximum(np.abs(np.tanh(z)), 1e-300)
    worst = z[np.argsort(rel)[-200:]]                 # where we differ most from NumPy
    mpmath.mp.prec = 120
    for value, got in zip(worst, _tanh(worst), strict=True):
        exact = mpmath.tanh(mpmath.mpf(float(value)))
        assert abs((mpmath.mpf(float(got)) - exact) / exact) <= act.TANH64_MAX_REL, value


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_is_the_tanh_formula_and_bounded(dtype):
    z = np.concatenate([np.linspace(-40, 40, 100_001), [-1e4, 1e4, -3e38, 3e38]]).astype(dtype)
    s = _sigmoid(z)
    assert s.dtype == dtype and np.all(np.isfinite(s))
    assert np.all((s >= 0) & (s <= 1))
    half = dtype(0.5)
    np.testing.assert_array_equal(s, half * _tanh(half * z) + half)
    assert s[-4] == 0 and s[-3] == 1


def test_sigmoid_float32_absolute_error():
    z = np.linspace(-40, 40, 400_001).astype(np.float32)
    exact = 0.5 * np.tanh(0.5 * z.astype(np.float64)) + 0.5
    # 0.5·(tanh's error, <= TANH32_MAX_ULP ulps of a value below 1) + the final rounding.
    bound = 0.5 * act.TANH32_MAX_ULP * 2.0**-24 + 2.0**-24
    assert np.max(np.abs(_sigmoid(z).astype(np.float64) - exact)) <= bound
