"""The gradient oracle: a claimed vector-Jacobian product against central differences.

``check_vjp`` works for any function of NumPy or CuPy arrays, not only gradcells's own: give
it ``f``, the ``vjp`` you claim for it, and the arguments, and it reports, per argument, the
element where the two disagree most. It depends on no backend.

For a cotangent ``ct`` (one array per output of ``f``; seeded random normal when not given)
the loss is ``L(args) = Σ_k <ct_k, f_k(args)>``, so ``dL/d args = vjp(ct, *args)``. Each
element of each checked argument is stepped both ways in float64, whatever the input dtype:

    numeric = (L(a + h·e_j) - L(a - h·e_j)) / ((a_j + h) - (a_j - h)),   h = cbrt(eps)·max(1, |a_j|)

Dividing by the representable difference ``(a_j + h) - (a_j - h)`` instead of ``2h`` makes
the step exact. ``cbrt(eps)`` balances the O(h²) truncation error of the central difference
against the O(eps/h) round-off of evaluating L, so both are about eps^(2/3) ≈ 4e-11 relative.
An element passes when ``|analytic - numeric| <= atol + rtol·|numeric|``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Default tolerances by the dtype of the claimed gradient: float64 gradients must match the
# finite differences to their own accuracy; float32 ones to float32 round-off.
DEFAULT_TOLERANCES = {
    np.dtype(np.float64): (1e-7, 1e-9),
    np.dtype(np.float32): (1e-3, 1e-5),
    np.dtype(np.float16): (3e-2, 3e-2),
}


class GradientCheckError(AssertionError):
    """Raised by ``VJPReport.raise_if_failed`` when a claimed gradient is wrong."""


@dataclass(frozen=True)
class ArgumentCheck:
    """The finite-difference check of one argument: its worst element and the verdict.

    ``index``, ``analytic``, ``numeric`` and ``abs_error`` describe the worst element (the one
    furthest past, or nearest to, its own bound ``atol + rtol·|numeric|``); ``rel_error`` is
    the largest relative error ``|analytic - numeric| / max(|analytic|, |numeric|)`` over all
    checked elements, which may be another element's.
    """

    name: str
    checked: int
    failures: int
    index: tuple | None
    analytic: float
    numeric: float
    abs_error: float
    rel_error: float

    @property
    def passed(self) -> bool:
        return self.failures == 0


@dataclass(frozen=True)
class VJPReport:
    """Per-argument results of ``check_vjp``; ``str(report)`` is a table."""

    checks: tuple
    rtol: float
    atol: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def max_abs_error(self) -> float:
        return max((c.abs_error for c in self.checks), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((c.rel_error for c in self.checks), default=0.0)

    def __getitem__(self, name) -> ArgumentCheck:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def raise_if_failed(self) -> VJPReport:
        if not self.passed:
            raise GradientCheckError(f"gradient check failed\n{self}")
        return self

    def __str__(self) -> str:
        header = ("argument", "checked", "worst index", "analytic", "numeric", "abs err",
                  "max rel err", "result")
        rows = [header]
        for c in self.checks:
            rows.append((
                c.name, str(c.checked), "-" if c.index is None else str(c.index),
                f"{c.analytic:.10g}", f"{c.numeric:.10g}", f"{c.abs_error:.2e}",
                f"{c.rel_error:.2e}", "pass" if c.passed else f"FAIL ({c.failures})"))
        widths = [max(len(r[k]) for r in rows) for k in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"(pass: |analytic - numeric| <= {self.atol:g} + {self.rtol:g}·|numeric|)")
        return "\n".join(lines)

    __repr__ = __str__


def _to_numpy(a):
    """A NumPy view or copy of a NumPy/CuPy (or array-like) value."""
    return np.asarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a)


def _as_outputs(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _is_float_array(a) -> bool:
    dtype = getattr(a, "dtype", None)
    return hasattr(a, "shape") and dtype is not None and np.dtype(dtype).kind == "f"


def _float64(a):
    return a.astype(np.float64, copy=True) if _is_float_array(a) else a


def check_vjp(f, vjp, args, *, wrt=None, cotangent=None, names=None, rtol=None, atol=None,
              seed=0, samples=None) -> VJPReport:
    """Check a claimed vector-Jacobian product ``vjp`` of ``f`` at ``args`` by central
    differences in float64.

    Parameters
    ----------
    f : callable
        ``f(*args)`` returns an array or a tuple of arrays. It is evaluated on float64 copies
        of the float arguments for the differences, so it must accept float64.
    vjp : callable
        ``vjp(cotangent, *args)`` returns one gradient per argument (a sequence aligned with
        ``args``; None counts as zero). ``cotangent`` has the structure of ``f``'s output:
        an array, or a tuple of arrays. It is called once, on ``args`` as given.
    args : sequence
        The arguments; non-array entries are passed through unchanged.
    wrt : sequence of int, optional
        Indices of the arguments to check; default every floating-point array.
    cotangent : array or tuple of arrays, optional
        Default: standard normal draws from ``numpy.random.default_rng(seed)``.
    names : sequence of str, optional
        Names for the report; default ``arg0, arg1, ...``.
    rtol, atol : float, optional
        Pass criterion ``|analytic - numeric| <= atol + rtol·|numeric|``; defaults by the
        gradient's dtype (``DEFAULT_TOLERANCES``).
    samples : int, optional
        Check at most this many elements per argument, chosen at random (seeded); default all.

    Returns a ``VJPReport``; call ``.raise_if_failed()`` to turn a failure into an exception.
    An element whose numeric or analytic derivative is not finite (``f`` gives NaN or inf
    near ``args``, or the claimed gradient does) fails: the oracle never vouches for what it
    could not compare.
    """
    args = tuple(args)
    names = tuple(names) if names is not None else tuple(f"arg{k}" for k in range(len(args)))
    if len(names) != len(args):
        raise ValueError(f"names has {len(names)} entries but args has {len(args)}")
    if wrt is None:
        wrt = [k for k, a in enumerate(args) if _is_float_array(a)]
    for k in wrt:
        if not _is_float_array(args[k]):
            raise TypeError(f"wrt names argument {names[k]}, which is not a float array")
    rng = np.random.default_rng(seed)

    value = f(*args)
    single_output = not isinstance(value, (tuple, list))
    outputs = _as_outputs(value)
    if cotangent is None:
        cts = tuple(rng.standard_normal(np.shape(o)) for o in outputs)
    else:
        cts = tuple(_to_numpy(c).astype(np.float64) for c in _as_outputs(cotangent))
    if len(cts) != len(outputs) or any(c.shape != tuple(np.shape(o)) for c, o in zip(cts, outputs)):
        raise ValueError("cotangent must match the shapes of f's outputs "
                         f"{[tuple(np.shape(o)) for o in outputs]}")
    # The cotangent in each output's own library and dtype, for the claimed vjp.
    cts_native = tuple(_like(o, c) for o, c in zip(outputs, cts))
    cts = tuple(_to_numpy(c).astype(np.float64) for c in cts_native)
    grads = vjp(cts_native[0] if single_output else cts_native, *args)
    grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    if len(grads) != len(args):
        raise ValueError(f"vjp returned {len(grads)} gradients for {len(args)} arguments")

    args64 = [_float64(a) for a in args]

    def loss():
        outs = _as_outputs(f(*args64))
        return sum(float(np.dot(c.ravel(), _to_numpy(o).astype(np.float64).ravel()))
                   for c, o in zip(cts, outs))

    analytic = {}
    for k in wrt:
        shape = tuple(args[k].shape)
        g = np.zeros(shape) if grads[k] is None else _to_numpy(grads[k])
        if g.shape != shape:
            raise ValueError(f"the gradient for {names[k]} has shape {g.shape}, expected {shape}")
        analytic[k] = g
    rtol, atol = _tolerances([g.dtype for g in analytic.values()], rtol, atol)

    checks = tuple(
        _compare(names[k], analytic[k].astype(np.float64),
                 *_numeric_gradient(loss, args64[k], rng, samples), rtol, atol)
        for k in wrt)
    return VJPReport(checks, rtol, atol)


def _like(output, values):
    """``values`` (NumPy float64) converted to ``output``'s array library and dtype."""
    dtype = getattr(output, "dtype", np.float64)
    if isinstance(output, np.ndarray) or not hasattr(output, "__array_namespace__"):
        return np.asarray(values, dtype=dtype)
    return output.__array_namespace__().asarray(values, dtype=dtype)


def _tolerances(dtypes, rtol, atol):
    """The caller's tolerances, or the defaults of the least precise gradient dtype."""
    defaults = [DEFAULT_TOLERANCES.get(np.dtype(d), DEFAULT_TOLERANCES[np.dtype(np.float16)])
                for d in dtypes] or [DEFAULT_TOLERANCES[np.dtype(np.float64)]]
    default_rtol, default_atol = max(defaults)
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _numeric_gradient(loss, a, rng, samples):
    """Central differences of ``loss`` with respect to each (or ``samples``) element of the
    float64 array ``a``, which is perturbed in place and restored. Returns the differences
    and the mask of the elements differenced (the others hold 0)."""
    numeric = np.zeros(a.shape)
    differenced = np.zeros(a.shape, dtype=bool)
    flat_indices = np.arange(a.size)
    if samples is not None and samples < a.size:
        flat_indices = np.sort(rng.choice(a.size, size=samples, replace=False))
    eps = np.finfo(np.float64).eps
    for flat in flat_indices:
        index = np.unravel_index(flat, a.shape)
        x0 = float(a[index])
        step = np.cbrt(eps) * max(1.0, abs(x0))
        x_plus, x_minus = x0 + step, x0 - step
        a[index] = x_plus
        loss_plus = loss()
        a[index] = x_minus
        loss_minus = loss()
        a[index] = x0
        numeric[index] = (loss_plus - loss_minus) / (x_plus - x_minus)
        differenced[index] = True
    return numeric, differenced


def _compare(name, analytic, numeric, differenced, rtol, atol) -> ArgumentCheck:
    """The verdict on one argument's ``differenced`` elements. One whose analytic or numeric
    value is not finite fails (a NaN loss, say, leaves nothing to vouch for)."""
    n_checked = int(differenced.sum())
    if n_checked == 0:
        return ArgumentCheck(name, 0, 0, None, 0.0, 0.0, 0.0, 0.0)
    shape = numeric.shape
    analytic, numeric, differenced = (np.ravel(v) for v in (analytic, numeric, differenced))
    with np.errstate(all="ignore"):
        abs_err = np.abs(analytic - numeric)
        finite = np.isfinite(abs_err)
        abs_err[~finite] = np.inf
        abs_err[~differenced] = 0.0
        bound = atol + rtol * np.abs(numeric)
        failing = differenced & ~(abs_err <= bound)
        scale = np.maximum(np.abs(analytic), np.abs(numeric))
        rel_err = np.divide(abs_err, scale, out=np.zeros_like(abs_err), where=scale > 0)
        rel_err[~finite] = np.inf
        # The worst element is the one furthest past (or nearest to) its own bound.
        badness = np.divide(abs_err, bound, out=np.where(abs_err > 0, np.inf, 0.0),
                            where=bound > 0)
    badness[~finite] = np.inf
    badness[~differenced] = -1.0
    worst = int(np.argmax(badness))
    return ArgumentCheck(
        name=name, checked=n_checked, failures=int(failing.sum()),
        index=tuple(int(i) for i in np.unravel_index(worst, shape)),
        analytic=float(analytic[worst]), numeric=float(numeric[worst]),
        abs_error=float(abs_err[worst]), rel_error=float(rel_err[differenced].max()))
