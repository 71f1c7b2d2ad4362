"""The common call's check (``_validate.arrays.fits_function``: one expression written per
operation, variant and mode) accepts exactly what the full checks accept. Run on the arrays
that a valid public forward and gradient call of every operation check, with every option
of the fixed grid, and on those arrays with any one of them spoiled: one size off, one axis
more, the other float dtype, float16, a list, None."""

import numpy as np
import pytest
from contract_cases import OPTIONS, PublicCalls, cell_of, fixed_case, upstream

from gradcells._validate import arrays
from gradcells.cells import OPS

GRID = [(op, options) for op in OPS for options in OPTIONS[cell_of(op)]]


def checked_calls(monkeypatch, op, options):
    """Every ``(values, checks, key)`` that ``op``'s public forward and gradient check."""
    seen = []
    check = arrays._check_arrays

    def spy(values, checks, key):
        seen.append((values, checks, key))
        return check(values, checks, key)

    monkeypatch.setattr(arrays, "_check_arrays", spy)
    rng = np.random.default_rng(0)
    case = fixed_case(op, rng, steps=3, batch=2, input_size=3, hidden=4, **options)
    public = PublicCalls("cpu")
    result = public.forward(op, case)
    public.grad(op, case, result, **upstream(op, result, rng))
    monkeypatch.undo()
    return seen


def full_checks_accept(values, checks, key):
    try:
        arrays._check_arrays(values, checks._replace(fits=lambda *_: False), key)
    except (TypeError, ValueError):
        return False
    return True


def spoiled(a, labels, n_hidden):
    """``a`` (shaped as ``labels``) made wrong in each way the checks look at (some are
    right where it is optional: None); the heads array with one head more, its other sizes
    from H by floor division (N must divide H)."""
    other = np.float32 if a.dtype == np.float64 else np.float64
    if labels[0] == "N":
        n = a.shape[0] + 1
        sizes = {"N": n, "H/N": n_hidden // n, "4H/N": 4 * n_hidden // n}
        yield np.zeros(tuple(sizes[label] for label in labels), a.dtype)
    yield np.zeros((*a.shape[:-1], a.shape[-1] + 1), a.dtype)
    yield a[..., None]
    yield a.astype(other)
    yield a.astype(np.float16)
    yield a.tolist()
    yield None


@pytest.mark.parametrize(("op", "options"), GRID, ids=[f"{op}-{o}" for op, o in GRID])
def test_the_fast_check_accepts_what_the_full_checks_accept(monkeypatch, op, options):
    seen = checked_calls(monkeypatch, op, options)
    assert {key[-1] for _, _, key in seen} == {False, True}   # a forward and a gradient
    for values, checks, key in seen:
        assert checks.fits(*values), (key, checks.names)
        for k, a in enumerate(values):
            if a is None:
                continue
            for bad in spoiled(a, checks.labels[k], values[1].shape[1]):
                if bad is None and k == checks.proj:    # its presence chose the checks
                    continue
                changed = (*values[:k], bad, *values[k + 1:])
                assert checks.fits(*changed) == full_checks_accept(changed, checks, key), (
                    key, checks.names[k], np.shape(bad))
