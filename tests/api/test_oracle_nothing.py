"""The oracle never vouches for what it did not compare (docs/spec.md §16.2): ``check_vjp``,
``check_jvp`` and ``taylor_test`` with no float element to differentiate with respect to
raise ``ValueError("nothing to check: ...")``, the arguments skipped for their dtype are
listed in the report, and a report that compared no element does not pass."""

import numpy as np
import pytest

import gradcells as gc
from gradcells.oracle import ArgumentCheck, GradientCheckError, JVPReport, VJPReport


def double(a):
    return 2.0 * a


# Deliberately wrong claims for ``double`` (the right ones are 2·ct and 2·t): each would be
# caught if anything were compared.
def wrong_vjp(ct, *args):
    return (3.0 * ct,) + (None,) * (len(args) - 1)


def wrong_jvp(t, *args):
    return 3.0 * np.ones(np.shape(args[0]))


CHECKS = {"check_vjp": (gc.check_vjp, wrong_vjp), "check_jvp": (gc.check_jvp, wrong_jvp),
          "taylor_test": (gc.taylor_test, wrong_vjp)}


@pytest.fixture(params=list(CHECKS))
def check(request):
    """``(oracle function, a wrong claim for double)``, for each of the three."""
    return CHECKS[request.param]


def scaled(a, k):
    """``sin(a)`` times the sum of the integer array ``k`` (an argument the oracle skips)."""
    return np.sin(a) * k.sum()


def scaled_vjp(ct, a, k):
    return ct * np.cos(a) * k.sum(), None


def scaled_jvp(t, a, k):
    return t[0] * np.cos(a) * k.sum()


# nothing to check: raised, never a passing report -------------------------------------------


@pytest.mark.parametrize("args, named", [
    ((np.arange(4),), "arg0: int64 array"),
    ((np.array([True, False]),), "arg0: bool array"),
    ((np.arange(3), 2.0, "label"), "arg0: int64 array, arg1: float, arg2: str"),
], ids=["integer", "boolean", "integer, scalar, string"])
def test_no_float_array_is_nothing_to_check(check, args, named):
    oracle, claim = check
    with pytest.raises(ValueError, match="^nothing to check: no float array among the "
                                         rf"arguments \({named}\)"):
        oracle(double, claim, args)


def test_a_wrong_claim_on_integer_arguments_raises_instead_of_passing():
    # The claims are wrong (3 for the derivative 2): what was a passing empty report is an
    # error, for each of the three.
    for oracle, claim in CHECKS.values():
        with pytest.raises(ValueError, match="^nothing to check"):
            report = oracle(double, claim, (np.arange(4),))
            pytest.fail(f"{oracle.__name__} returned a report (passed={report.passed})")


def test_a_wrt_that_selects_nothing_is_nothing_to_check(check):
    oracle, claim = check
    with pytest.raises(ValueError, match=r"^nothing to check: wrt=\[\] selects no argument"):
        oracle(double, claim, (np.ones(3),), wrt=[])


@pytest.mark.parametrize("args", [(np.zeros((0, 3)),), (np.zeros(0), np.zeros((2, 0)))],
                         ids=["one", "two"])
def test_only_empty_float_arrays_are_nothing_to_check(check, args):
    oracle, _ = check
    with pytest.raises(ValueError, match="^nothing to check: every float array selected is "
                                         r"empty \(arg0: shape \(0,"):
        oracle(lambda *a: tuple(2.0 * x for x in a), lambda c, *a: c, args)


def test_a_wrt_that_selects_only_empty_arrays_is_nothing_to_check(check):
    oracle, _ = check
    with pytest.raises(ValueError, match=r"^nothing to check: every float array selected is "
                                         r"empty \(arg1: shape \(0,\)\)"):
        oracle(lambda a, b: (2.0 * a, 2.0 * b), lambda c, a, b: c,
               (np.ones(2), np.zeros(0)), wrt=[1])


@pytest.mark.parametrize("oracle, keyword", [(gc.check_jvp, "tangents"),
                                             (gc.taylor_test, "direction")])
@pytest.mark.parametrize("given", [(None, None), (np.zeros(3), None)], ids=["None", "zero"])
def test_tangents_that_move_nothing_are_nothing_to_check(oracle, keyword, given):
    claim = scaled_jvp if oracle is gc.check_jvp else scaled_vjp
    with pytest.raises(ValueError, match=f"^nothing to check: no element is moved along the "
                                         rf"{keyword} \(arg0: "):
        oracle(scaled, claim, (np.ones(3), np.arange(2)), **{keyword: given})


# skipped arguments are listed; the float ones still checked -------------------------------


def test_check_vjp_lists_an_integer_argument_as_skipped_and_checks_the_float_one(rng):
    args = (rng.standard_normal(5), np.arange(1, 4))
    report = gc.check_vjp(scaled, scaled_vjp, args)
    assert report.passed and report.skipped == (("arg1", "int64"),)
    assert [(c.name, c.checked) for c in report.checks] == [("arg0", 5)]
    assert "(skipped for their dtype, not checked: arg1 (int64))" in str(report)
    wrong = gc.check_vjp(scaled, lambda ct, a, k: (1.01 * scaled_vjp(ct, a, k)[0], None), args)
    assert not wrong.passed and wrong.skipped == (("arg1", "int64"),)
    fast = gc.check_vjp(scaled, scaled_vjp, args, fast=True)
    assert fast.passed and fast.skipped == (("arg1", "int64"),)


def test_check_jvp_lists_an_integer_argument_as_skipped_and_checks_the_float_one(rng):
    args = (rng.standard_normal(5), np.arange(1, 4))
    report = gc.check_jvp(scaled, scaled_jvp, args)
    assert report.passed and report.skipped == (("arg1", "int64"),)
    assert report.checks[0].checked == 5
    assert "(skipped for their dtype, not checked: arg1 (int64))" in str(report)
    assert not gc.check_jvp(scaled, lambda t, a, k: 1.01 * scaled_jvp(t, a, k), args).passed


def test_taylor_test_lists_an_integer_argument_as_skipped_and_checks_the_float_one(rng):
    args = (rng.standard_normal(5), np.arange(1, 4))
    report = gc.taylor_test(scaled, scaled_vjp, args)
    assert report.passed and report.skipped == (("arg1", "int64"),)
    assert "(skipped for their dtype, not checked: arg1 (int64))" in str(report)
    wrong = lambda ct, a, k: (1.01 * scaled_vjp(ct, a, k)[0], None)  # noqa: E731
    assert not gc.taylor_test(scaled, wrong, args).passed


def test_a_boolean_argument_is_listed_with_its_dtype_and_names_are_used(rng):
    report = gc.check_vjp(lambda a, m: np.where(m, a, 0.0), lambda ct, a, m: (ct * m, None),
                          (rng.standard_normal(4), np.array([True, False, True, True])),
                          names=["a", "mask"])
    assert report.passed and report.skipped == (("mask", "bool"),)
    assert report["a"].checked == 4


def test_a_report_without_skipped_arguments_says_nothing_of_them(rng):
    report = gc.check_vjp(double, lambda ct, a: (2.0 * ct,), (rng.standard_normal(3),))
    assert report.passed and report.skipped == () and "skipped" not in str(report)


def test_torch_integer_tensors_are_listed_as_skipped(torch, rng):
    args = (torch.tensor(rng.standard_normal(4)), torch.arange(1, 4))
    report = gc.check_vjp(lambda a, k: torch.sin(a) * k.sum(),
                          lambda ct, a, k: (ct * torch.cos(a) * k.sum(), None), args)
    assert report.passed and report.skipped == (("arg1", "torch.int64"),)
    with pytest.raises(ValueError, match=r"^nothing to check: .*\(arg0: torch.int64 array\)"):
        gc.check_vjp(double, wrong_vjp, (torch.arange(4),))


# a report that compared nothing does not pass --------------------------------------------


def test_a_jvp_report_whose_every_output_is_empty_does_not_pass(rng):
    report = gc.check_jvp(lambda a: 2.0 * a[:0], lambda t, a: 2.0 * t[0][:0],
                          (rng.standard_normal(3),))
    assert [c.checked for c in report.checks] == [0]
    assert not report.passed
    assert "(nothing compared: every output has zero elements): FAIL" in str(report)
    assert "empty (nothing compared)" in str(report)
    with pytest.raises(GradientCheckError):
        report.raise_if_failed()


def test_a_report_of_zero_checked_elements_or_no_checks_does_not_pass():
    empty = ArgumentCheck("a", 0, 0, None, 0.0, 0.0, 0.0, 0.0)
    assert empty.passed          # one empty argument among others fails nothing ...
    for report in (VJPReport((empty, empty), 1e-7, 1e-9), VJPReport((), 1e-7, 1e-9),
                   JVPReport((empty,), 1e-7, 1e-9)):
        assert not report.passed  # ... but a report of nothing vouches for nothing


def test_an_empty_argument_beside_a_checked_one_is_shown_empty_and_the_report_passes(rng):
    report = gc.check_vjp(lambda a, b: (2.0 * a, 2.0 * b), lambda ct, a, b: (2.0 * ct[0],
                                                                             2.0 * ct[1]),
                          (rng.standard_normal(3), np.zeros((0, 2))))
    assert [c.checked for c in report.checks] == [3, 0]
    assert report.passed
    assert "empty (nothing compared)" in str(report)
