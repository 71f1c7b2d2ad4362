"""The oracle itself: it must pass right gradients, catch wrong ones, and work for any
function of arrays, not only gradcells's own."""

import sys
import types

import numpy as np
import pytest
from conftest import StandInDevice

import gradcells as gc
from gradcells.oracle import GradientCheckError


def tanh_sum(x, w):
    return np.tanh(x @ w), (x * x).sum(axis=0)


def tanh_sum_vjp(ct, x, w):
    ct_tanh, ct_square = ct
    dz = ct_tanh * (1 - np.tanh(x @ w) ** 2)
    return dz @ w.T + 2 * x * ct_square, x.T @ dz


@pytest.fixture
def xw(rng):
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 2))


def test_right_vjp_passes(xw):
    report = gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, names=["x", "w"])
    assert report.passed
    assert report.max_abs_error < 1e-9
    assert [c.name for c in report.checks] == ["x", "w"]
    assert report["x"].checked == 12 and report["w"].checked == 8


def test_wrong_vjp_is_caught_at_the_right_element(xw):
    def off_by_one_element(ct, x, w):
        dx, dw = tanh_sum_vjp(ct, x, w)
        dw = dw.copy()
        dw[2, 1] += 1e-5
        return dx, dw

    report = gc.check_vjp(tanh_sum, off_by_one_element, xw, names=["x", "w"])
    assert not report.passed
    assert report["x"].passed
    assert report["w"].failures == 1 and report["w"].index == (2, 1)
    assert report["w"].abs_error == pytest.approx(1e-5, rel=1e-3)
    with pytest.raises(GradientCheckError, match="FAIL"):
        report.raise_if_failed()
    assert isinstance(GradientCheckError(), AssertionError)


def test_report_prints_a_table(xw):
    text = str(gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, names=["x", "w"]))
    header = text.splitlines()[0].split()
    assert header[:3] == ["argument", "checked", "worst"]
    assert "pass" in text and "FAIL" not in text


def test_differences_are_float64_for_float32_inputs(xw):
    seen = []

    def f(x, w):
        seen.append(x.dtype)
        return np.tanh(x @ w)

    def vjp(ct, x, w):
        assert ct.dtype == np.float32  # the cotangent comes in the output's own dtype
        dz = ct * (1 - np.tanh(x @ w) ** 2)
        return dz @ w.T, x.T @ dz

    x32, w32 = (a.astype(np.float32) for a in xw)
    report = gc.check_vjp(f, vjp, (x32, w32))
    assert report.passed and report.rtol == gc.oracle.DEFAULT_TOLERANCES[np.dtype("float32")][0]
    assert seen[0] == np.float32 and set(seen[1:]) == {np.dtype(np.float64)}


@pytest.mark.parametrize("x0", [1e-8, 0.3, -7.0, 1e4, -3e7])
def test_step_scales_with_the_value_and_is_exact(x0):
    """d(x³ + x)/dx = 3x² + 1 to ~1e-9 relative at every magnitude: the step grows with
    |x|, so the truncation error h² stays small against 3x²."""
    x = np.array([x0])
    report = gc.check_vjp(lambda a: a ** 3 + a, lambda ct, a: ((3 * a ** 2 + 1) * ct,), (x,))
    assert report.passed, report
    assert report.checks[0].rel_error < 1e-8


def test_cotangent_is_seeded_and_can_be_given(xw):
    first = gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, seed=3)
    again = gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, seed=3)
    assert first == again
    ct = (np.ones((3, 2)), np.zeros(4))
    given = gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, cotangent=ct)
    assert given.passed
    with pytest.raises(ValueError, match="cotangent must match"):
        gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, cotangent=(np.ones((3, 3)), np.zeros(4)))


def test_non_array_arguments_pass_through_and_wrt_selects(xw):
    x, w = xw

    def f(x, scale, w):
        return scale * np.tanh(x @ w)

    def vjp(ct, x, scale, w):
        dz = scale * ct * (1 - np.tanh(x @ w) ** 2)
        return dz @ w.T, None, None  # w's gradient deliberately absent: wrt excludes it

    report = gc.check_vjp(f, vjp, (x, 2.5, w), wrt=[0], names=["x", "scale", "w"])
    assert report.passed and [c.name for c in report.checks] == ["x"]
    with pytest.raises(TypeError, match="scale, which is not a float array"):
        gc.check_vjp(f, vjp, (x, 2.5, w), wrt=[1], names=["x", "scale", "w"])


def test_missing_gradient_counts_as_zero_and_fails(xw):
    report = gc.check_vjp(tanh_sum, lambda ct, x, w: (None, None), xw)
    assert not report.passed


def test_bad_gradient_shape_is_named(xw):
    with pytest.raises(ValueError, match=r"gradient for w has shape \(2, 4\), expected"):
        gc.check_vjp(tanh_sum, lambda ct, x, w: (x, np.zeros((2, 4))), xw, names=["x", "w"])
    with pytest.raises(ValueError, match="vjp returned 1 gradients for 2 arguments"):
        gc.check_vjp(tanh_sum, lambda ct, x, w: (x,), xw)


def test_samples_limits_the_work(xw):
    report = gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, samples=5, names=["x", "w"])
    assert report["x"].checked == 5 and report["w"].checked == 5 and report.passed


def test_inputs_are_not_modified(xw):
    before = [a.copy() for a in xw]
    gc.check_vjp(tanh_sum, tanh_sum_vjp, xw)
    for a, b in zip(xw, before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_tolerances_can_be_tightened_to_fail(xw):
    report = gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, rtol=0.0, atol=0.0)
    assert not report.passed  # finite differences are never exact


@pytest.mark.parametrize("f", [lambda x: x * np.nan, np.sqrt, lambda x: np.where(x > 0, np.inf, x)],
                         ids=["nan everywhere", "nan at one element", "inf at one element"])
def test_a_non_finite_numeric_derivative_fails_instead_of_passing_unchecked(f):
    x = np.array([-1.0, 4.0, 2.0])
    with np.errstate(invalid="ignore"):
        report = gc.check_vjp(f, lambda ct, x: (ct * 0.5,), (x,))
    assert report["arg0"].checked == 3
    assert not report.passed and report["arg0"].abs_error == np.inf
    with pytest.raises(gc.GradientCheckError):
        report.raise_if_failed()


def test_a_non_finite_claimed_gradient_fails():
    x = np.array([1.0, 2.0])
    report = gc.check_vjp(lambda x: 2 * x, lambda ct, x: (np.array([2 * ct[0], np.nan]),), (x,))
    assert report["arg0"].failures == 1 and report["arg0"].index == (1,)


def test_zero_dimensional_arguments_are_checked():
    a = np.array(1.5)
    assert gc.check_vjp(lambda a: a * a, lambda ct, a: (2 * a * ct,), (a,)).passed
    report = gc.check_vjp(lambda a: a * a, lambda ct, a: (3 * a * ct,), (a,))
    assert report["arg0"].checked == 1 and report["arg0"].index == () and not report.passed


# -- the round-off floor -----------------------------------------------------------------------


def large_and_small(a, b):
    return 1e5 * a, b


@pytest.mark.parametrize("seed", range(20))
def test_an_unrelated_large_output_costs_no_accuracy(seed):
    """Outputs are differenced one by one before the cotangent weighs them, so 1e5·a, which
    b does not move, adds nothing to b's quotient: b's exact gradient passes even at the
    plain atol (no floor). Differencing L as one sum failed it for 18 of these 20 seeds."""
    a, b = np.array([0.3, -1.2, 0.8]), np.array([0.5, 0.1, -0.7])
    exact = lambda ct, a, b: (1e5 * ct[0], ct[1])  # noqa: E731
    report = gc.check_vjp(large_and_small, exact, (a, b), seed=seed, atol=1e-9,
                          names=["a", "b"])
    assert report.passed and not report.floor, report
    assert report["b"].max_abs_error < 1e-9


def offset_sine(a):
    return 1e5 + np.sin(a)


@pytest.mark.parametrize("seed", range(20))
def test_the_floor_covers_the_rounding_of_a_large_moved_output(seed):
    """1e5 + sin(a) is known only to eps·1e5, so its quotient only to about eps·1e5/h:
    the exact gradient fails the plain tolerance for most cotangents and passes with the
    floor for all of them."""
    a = np.linspace(-1.0, 1.0, 6)
    exact = lambda ct, a: (ct * np.cos(a),)  # noqa: E731
    assert gc.check_vjp(offset_sine, exact, (a,), seed=seed).passed
    plain = gc.check_vjp(offset_sine, exact, (a,), seed=seed, atol=1e-9)
    assert not plain.floor and "floor" not in str(plain)


def test_the_plain_tolerance_fails_the_large_moved_output():
    a = np.linspace(-1.0, 1.0, 6)
    exact = lambda ct, a: (ct * np.cos(a),)  # noqa: E731
    reports = [gc.check_vjp(offset_sine, exact, (a,), seed=s, atol=1e-9) for s in range(20)]
    assert sum(not r.passed for r in reports) >= 10


def test_an_error_above_the_floor_is_still_caught():
    a, b = np.array([0.3, -1.2, 0.8]), np.array([0.5, 0.1, -0.7])
    off = lambda ct, a, b: (1e5 * ct[0], ct[1] * (1 + 1e-6))  # noqa: E731
    report = gc.check_vjp(large_and_small, off, (a, b), names=["a", "b"])
    assert report["a"].passed and not report["b"].passed
    x = np.linspace(-1.0, 1.0, 6)
    off_sine = lambda ct, a: (ct * np.cos(a) * (1 + 1e-3),)  # noqa: E731
    assert not gc.check_vjp(offset_sine, off_sine, (x,)).passed


# -- report fields, arguments ----------------------------------------------------------------


def _fast_sine(a):
    return (np.sin(1000.0 * a),)


def test_a_strongly_curved_function_passes_by_extrapolation(rng, monkeypatch):
    # sin(1000·a): the central difference's truncation error h²·1000²/6 ≈ 6e-6 relative is
    # far above rtol 1e-7; the Richardson extrapolation for those elements is not.
    from gradcells import oracle

    a = rng.uniform(-1, 1, size=6)
    def right(ct, a):
        return (ct[0] * 1000.0 * np.cos(1000.0 * a),)

    assert gc.check_vjp(_fast_sine, right, (a,)).passed
    monkeypatch.setattr(oracle, "_extrapolated", lambda *args: args[4:6])
    assert not gc.check_vjp(_fast_sine, right, (a,)).passed  # what central differences say


def test_extrapolation_still_catches_a_small_error(rng):
    a = rng.uniform(-1, 1, size=6)
    def off(ct, a):
        return (ct[0] * 1000.0 * np.cos(1000.0 * a) * (1 + 1e-5),)

    report = gc.check_vjp(_fast_sine, off, (a,))
    assert not report.passed and report.checks[0].failures == 6


def test_max_abs_error_is_the_largest_error_anywhere():
    """The worst element is judged against its own bound; the largest absolute error can be
    another element's, and ``max_abs_error`` reports that one."""
    a = np.array([3.0, 0.0])
    f = lambda a: np.array([1e6 * a[0] ** 2 / 2, 0.5 * a[1] ** 2])  # noqa: E731
    claimed = lambda ct, a: (np.array([ct[0] * 1e6 * a[0] + 1e-2, 5e-10]),)  # noqa: E731
    report = gc.check_vjp(f, claimed, (a,), cotangent=np.ones(2), atol=1e-9)
    assert report.checks[0].index == (1,)                # nearest to its bound
    assert report.max_abs_error == pytest.approx(1e-2, rel=1e-2)
    assert report.checks[0].max_abs_error == report.max_abs_error


def test_numpy_scalars_pass_through_unchecked():
    x = np.array([0.5, -2.0])
    report = gc.check_vjp(lambda x, s: x * s, lambda ct, x, s: (ct * s, None), (x, np.float64(2.0)))
    assert report.passed and [c.name for c in report.checks] == ["arg0"]


@pytest.mark.parametrize("samples, error, message", [
    (0, ValueError, "samples must be a positive integer or None, got 0"),
    (-1, ValueError, "samples must be a positive integer or None, got -1"),
    (2.0, TypeError, "samples must be a positive integer or None, got 2.0"),
])
def test_bad_samples_are_rejected_before_f_runs(samples, error, message):
    def f(x):
        raise AssertionError("f ran")

    with pytest.raises(error, match=message):
        gc.check_vjp(f, None, (np.ones(2),), samples=samples)


@pytest.mark.parametrize("wrt, error, message", [
    ([5], ValueError, r"wrt must hold argument indices in \[0, 2\), got 5"),
    ([0, 0], ValueError, r"wrt names an argument twice: \[0, 0\]"),
    ([1], TypeError, "wrt names argument arg1, which is not a float array"),
])
def test_bad_wrt_is_rejected(wrt, error, message):
    with pytest.raises(error, match=message):
        gc.check_vjp(lambda x, n: x, lambda ct, x, n: (ct, None), (np.ones(2), 3), wrt=wrt)


# -- other array libraries -----------------------------------------------------------------


@pytest.mark.conformance
def test_torch_functions_are_checked_in_float64(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((4, 2)).astype(np.float32))

    def f(x, w):
        assert x.dtype == w.dtype
        return torch.tanh(x @ w)

    def autograd_vjp(ct, x, w):
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        return torch.autograd.grad(f(x, w), (x, w), ct)

    report = gc.check_vjp(f, autograd_vjp, (x, w), names=["x", "w"])
    assert report.passed and report.rtol == gc.oracle.DEFAULT_TOLERANCES[np.dtype("float32")][0]
    wrong = gc.check_vjp(f, lambda ct, x, w: (autograd_vjp(ct, x, w)[0], x.T @ ct), (x, w),
                         names=["x", "w"])
    assert wrong["x"].passed and not wrong["w"].passed
    assert x.dtype == torch.float32                       # inputs untouched


@pytest.mark.conformance
def test_jax_functions_are_checked_in_float64(rng):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_platforms", "cpu")
    x = rng.standard_normal((3, 4))
    f = lambda x: jax.numpy.sin(x) * x  # noqa: E731
    with pytest.raises(TypeError, match="jax_enable_x64"):
        gc.check_vjp(f, lambda ct, x: jax.vjp(f, x)[1](ct), (jax.numpy.asarray(x),))
    jax.config.update("jax_enable_x64", True)
    try:
        x64 = jax.numpy.asarray(x)
        report = gc.check_vjp(f, lambda ct, x: jax.vjp(f, x)[1](ct), (x64,))
        assert report.passed and report.checks[0].checked == 12
        wrong = gc.check_vjp(f, lambda ct, x: (ct * jax.numpy.cos(x) * x,), (x64,))
        assert not wrong.passed
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("names", ["xy", ["x"], ("x", "y", "z")])
def test_names_must_name_each_argument(xw, names):
    with pytest.raises(ValueError, match="names must give one name per argument"):
        gc.check_vjp(tanh_sum, tanh_sum_vjp, xw, names=names)


def test_each_argument_is_held_to_its_own_gradients_dtype(xw):
    """A float32 gradient beside a float64 one no longer loosens the float64 one to float32
    tolerances: a 1e-4 relative error there fails."""
    x, w = xw

    def mixed(ct, x, w):
        dx, dw = tanh_sum_vjp(ct, x, w)
        return dx.astype(np.float32), dw * (1 + 1e-4)

    report = gc.check_vjp(tanh_sum, mixed, (x, w), names=["x", "w"])
    assert report["x"].passed and report["x"].rtol == 1e-3
    assert not report["w"].passed and report["w"].rtol == 1e-7
    assert report.rtol == 1e-3                         # the loosest, as before
    assert "x: 1e-05 + 0.001·|numeric|; w: 1e-09 + 1e-07·|numeric|" in str(report)


def test_numpy_integers_select_and_a_bare_index_is_refused():
    x = np.linspace(-1.0, 1.0, 4)
    vjp = lambda ct, x: (ct * np.cos(x),)  # noqa: E731
    assert gc.check_vjp(np.sin, vjp, (x,), wrt=np.arange(1), samples=np.int64(2)).passed
    with pytest.raises(TypeError, match="wrt must be a sequence of argument indices, got 0"):
        gc.check_vjp(np.sin, vjp, (x,), wrt=0)


def test_the_cotangent_has_the_structure_of_the_output():
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    x = np.linspace(-1.0, 1.0, 4)
    report = gc.check_vjp(lambda x: Pair(np.sin(x), 2 * x),
                          lambda ct, x: (ct.a * np.cos(x) + 2 * ct.b,), (x,))
    assert report.passed
    assert gc.check_vjp(lambda x: [np.sin(x), 2 * x],
                        lambda ct, x: (ct[0] * np.cos(x) + 2 * ct[1],), (x,)).passed


@pytest.mark.conformance
def test_bfloat16_gradients_are_checked_at_the_loosest_tolerance(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.standard_normal(6)).to(torch.bfloat16)
    right = lambda ct, x: (ct * torch.cos(x),)  # noqa: E731
    report = gc.check_vjp(torch.sin, right, (x,))
    assert report.checks[0].checked == 6 and report.passed and report.rtol == 3e-2
    assert not gc.check_vjp(torch.sin, lambda ct, x: (2 * ct * torch.cos(x),), (x,)).passed


class _StandInCupyArray:
    """A CuPy 13 array as the oracle sees it: no ``__array_namespace__``, a device of its
    own, copied to the host by ``get``."""

    def __init__(self, values, device):
        self.values, self.device = np.asarray(values), StandInDevice(device)
        self.shape, self.dtype, self.ndim = self.values.shape, self.values.dtype, self.values.ndim

    def astype(self, dtype, copy=True):
        return _StandInCupyArray(self.values.astype(dtype, copy=copy), self.device.id)

    def get(self):
        return self.values.copy()

    def __getitem__(self, index):
        return self.values[index]

    def __setitem__(self, index, value):
        self.values[index] = value


_StandInCupyArray.__module__ = "cupy._core.core"


def test_a_cupy_output_gets_its_cotangent_on_its_own_device(monkeypatch):
    """The claimed vjp of a CuPy function receives CuPy cotangents on the output's device,
    not NumPy arrays (CuPy 13 arrays lack ``__array_namespace__``) and not arrays on the
    current device."""
    fake = types.ModuleType("cupy")
    fake.ndarray = _StandInCupyArray
    fake.asarray = lambda values, dtype: _StandInCupyArray(
        np.asarray(values, dtype), StandInDevice.current)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    a = _StandInCupyArray(np.random.default_rng(3).standard_normal(4), device=1)

    def f(a):
        return _StandInCupyArray(np.sin(a.values), a.device.id)

    def vjp(ct, a):
        assert isinstance(ct, _StandInCupyArray) and ct.device.id == a.device.id == 1
        return (_StandInCupyArray(ct.values * np.cos(a.values), a.device.id),)

    assert gc.check_vjp(f, vjp, (a,)).passed


def test_a_bare_array_as_args_is_a_clear_type_error(xw):
    x, _ = xw
    with pytest.raises(TypeError, match=r"args must be a tuple or list of arrays, got ndarray; "
                                        r"pass \(w,\)") as error:
        gc.check_vjp(np.tanh, lambda ct, a: (ct * (1 - np.tanh(a) ** 2),), x)
    assert "PyTorch" in str(error.value) and "JAX" in str(error.value)
    assert gc.check_vjp(np.tanh, lambda ct, a: (ct * (1 - np.tanh(a) ** 2),), (x,)).passed
    assert gc.check_vjp(np.tanh, lambda ct, a: (ct * (1 - np.tanh(a) ** 2),), [x]).passed


def test_a_bare_tensor_as_args_is_a_clear_type_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="got Tensor; pass"):
        gc.check_vjp(torch.tanh, lambda ct, a: (ct,), torch.zeros(3, dtype=torch.float64))


def test_the_report_labels_the_failing_count_and_shows_the_bound(xw):
    def off(ct, x, w):
        dx, dw = tanh_sum_vjp(ct, x, w)
        return dx, dw + 1e-3

    report = gc.check_vjp(tanh_sum, off, xw, names=["x", "w"])
    lines = str(report).splitlines()
    header = lines[0].split("  ")
    assert "bound" in [h.strip() for h in header if h.strip()]
    x_row, w_row = lines[2], lines[3]
    assert w_row.endswith("FAIL (8 of 8 elements)") and x_row.endswith("pass")
    assert f"{report['w'].bound:.2e}" in w_row.split() and f"{report['x'].bound:.2e}" in x_row
    assert "the bound at the worst element" in str(report)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_unrolled_loop_of_the_testing_tools_passes_the_oracle(seed):
    """``gradcells.testing.unrolled``, what the sequence operations are tested against, is
    itself right: its backpropagation through ragged lengths, peepholes and a clip matches
    central differences of its forward."""
    from gradcells.cells import OPS
    from gradcells.testing import lstm_sequence_case, unrolled

    case = lstm_sequence_case(np.random.default_rng(seed), steps=3, batch=3, hidden=3,
                              peephole=True, clip=True, ragged=True)
    names = tuple(n for n in OPS["lstm_sequence"].arrays if n in case)
    attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"],
             "seq_len": case["seq_len"]}

    def run(*arrays):
        return unrolled.lstm_forward(*arrays[:5], **dict(zip(names[5:], arrays[5:], strict=True)),
                                     **attrs)

    def f(*arrays):
        outputs = run(*arrays).outputs
        return outputs["h"], outputs["cs"], outputs["h_final"], outputs["cs_final"]

    def vjp(ct, *arrays):
        grads = unrolled.lstm_backprop(run(*arrays), d_h=ct[0], d_cs=ct[1], d_h_final=ct[2],
                                       d_cs_final=ct[3])
        return tuple(grads[k] for k in names)

    assert case["cell_clip"] is not None
    gc.check_vjp(f, vjp, [case[k] for k in names], names=names).raise_if_failed()
