"""The gradient oracle: a claimed vector-Jacobian product against central differences.

``check_vjp`` works for any function of NumPy, CuPy, PyTorch or JAX arrays, not only
gradcells's own: give it ``f``, the ``vjp`` you claim for it, and the arguments, and it
reports, per argument, the element where the two disagree most. It depends on no backend and
imports no array library the caller has not.

For a cotangent ``ct`` (one array per output of ``f``; seeded random normal when not given)
the loss is ``L(args) = Σ_k <ct_k, f_k(args)>``, so ``dL/d args = vjp(ct, *args)``. Each
element of each checked argument is stepped both ways in float64, whatever the input dtype,
and the outputs are differenced one by one before the cotangent weighs them:

    numeric = <ct, f(a + h·e_j) - f(a - h·e_j)> / ((a_j + h) - (a_j - h)),
    h = cbrt(eps)·max(1, |a_j|)

(so an output the step does not move contributes exactly nothing, where differencing L as
one sum would add its rounding).

Dividing by the representable difference ``(a_j + h) - (a_j - h)`` instead of ``2h`` makes
the step exact. ``cbrt(eps)`` balances the O(h²) truncation error of the central difference
against the O(eps/h) round-off of evaluating L, so both are about eps^(2/3) ≈ 4e-11 relative
for a function that curves moderately. For one that curves strongly over the step, the
elements the central difference does not pass are differenced again with step 2h and
judged on the Richardson extrapolation ``(4·D(h) - D(2h))/3``, whose truncation error is
O(h⁴) (its round-off floor is the same combination of the two floors).

``check_vjp(fast=True)`` first checks one random direction ``u`` of all the arguments at
once: ``<vjp(ct), u>`` against ``<ct, f(a + h·u) - f(a - h·u)>/(2h)`` (``check_jvp``'s step,
two evaluations of ``f``). An element that fails both the central difference and its
extrapolation is differenced one-sidedly with steps h and h/2: where the two one-sided
differences keep their gap as the step halves (they converge to two limits, as at an active
clip's boundary or ReLU(0); a smooth function's gap is its truncation error and halves) and
the claim lies between them, the element is a kink, counted and not failed.

An element passes when ``|analytic - numeric| <= atol + rtol·|numeric| + floor``. ``floor``
is the round-off floor of the difference itself: an output ``f_i`` the step moves is known
only to about ``eps·|f_i|``, so the quotient only to about ``eps·Σ |ct_i|·|f_i| / h`` over
those outputs. Below that no finite difference can tell two gradients apart; without it, the
exact gradient of ``1e5 + sin(a)`` fails. The floor is added with the default ``atol`` only:
an ``atol`` given is the whole absolute tolerance.

The oracle never vouches for what it did not compare: given no float element to
differentiate with respect to (integer, boolean or empty arguments only; a ``wrt`` that
selects none) the checks raise ``ValueError("nothing to check: ...")``, the array arguments
skipped for their dtype are listed in each report, and a report whose every check compared
zero elements does not pass.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import numbers
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from . import _interop
from ._core import trees
from ._core.arrays import is_float, library_of
from ._core.report import table

# (rtol, atol): a check passes where |analytic - numeric| <= atol + rtol·|numeric|.
_Tolerances = tuple[float, float]

# Default tolerances by the dtype of the claimed gradient: float64 gradients must match the
# finite differences to their own accuracy; float32 ones to float32 round-off.
DEFAULT_TOLERANCES: dict[np.dtype, _Tolerances] = {
    np.dtype(np.float64): (1e-7, 1e-9),
    np.dtype(np.float32): (1e-3, 1e-5),
    np.dtype(np.float16): (3e-2, 3e-2),
}


class GradientCheckError(AssertionError):
    """Raised by ``VJPReport.raise_if_failed`` when a claimed gradient is wrong."""


@dataclass(frozen=True)
class ArgumentCheck:
    """The finite-difference check of one argument: its worst element and the verdict.

    ``index``, ``analytic``, ``numeric``, ``abs_error`` and ``bound`` (the tolerance there)
    describe the worst element, the one furthest past, or nearest to, its own bound;
    ``max_abs_error`` and ``rel_error`` are the largest absolute and relative errors
    ``|analytic - numeric| / max(|analytic|, |numeric|)`` over all checked elements, which
    may be other elements'.
    """

    name: str
    checked: int
    failures: int
    index: tuple | None
    analytic: float
    numeric: float
    abs_error: float
    rel_error: float
    bound: float = 0.0
    max_abs_error: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0
    kinks: int = 0                 # elements judged non-differentiable, not failed
    max_ulp: float | None = None   # the largest error in ulps of a float16/32 claim
    deterministic: bool = True     # the claim computed twice was the same, bit for bit

    @property
    def passed(self) -> bool:
        return self.failures == 0 and self.deterministic


@dataclass(frozen=True)
class VJPReport:
    """Per-argument results of ``check_vjp``; ``str(report)`` is a table. ``rtol`` and
    ``atol`` are the loosest of the arguments' own (each check holds its own)."""

    checks: tuple
    rtol: float
    atol: float
    floor: bool = False    # whether each bound includes the round-off floor
    skipped: tuple[tuple[str, str], ...] = ()   # (name, dtype) of each skipped for its dtype

    _subject: ClassVar[str] = "argument"   # what each check is of, for the table
    _claim: ClassVar[str] = "gradient"
    _floor_note: ClassVar[str] = ("(floor: the rounding of the outputs the step moves, "
                                  "eps·Σ|ct_i·f_i|/step over them)")

    @property
    def passed(self) -> bool:
        """Every check passed, and at least one element was compared: a report whose every
        check compared none vouches for nothing and does not pass."""
        return any(c.checked for c in self.checks) and all(c.passed for c in self.checks)

    @property
    def max_abs_error(self) -> float:
        return max((c.max_abs_error for c in self.checks), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((c.rel_error for c in self.checks), default=0.0)

    def __getitem__(self, name: str) -> ArgumentCheck:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def raise_if_failed(self) -> VJPReport:
        if not self.passed:
            raise GradientCheckError(f"{self._claim} check failed\n{self}")
        return self

    def __str__(self) -> str:
        ulps = any(c.max_ulp is not None for c in self.checks)
        header = (self._subject, "checked", "worst index", "analytic", "numeric", "abs err",
                  "bound", "max rel err", *(("max ulps",) if ulps else ()), "result")
        rows = [(c.name, str(c.checked), "-" if c.index is None else str(c.index),
                 f"{c.analytic:.10g}", f"{c.numeric:.10g}", f"{c.abs_error:.2e}",
                 f"{c.bound:.2e}", f"{c.rel_error:.2e}",
                 *((("-" if c.max_ulp is None else f"{c.max_ulp:.3g}"),) if ulps else ()),
                 _verdict(c)) for c in self.checks]
        return "\n".join(table(header, rows) + self._legend())

    def _legend(self) -> list[str]:
        """The lines under the table: what ``bound`` is, per group of tolerances."""
        floor = " + floor" if self.floor else ""
        groups: dict[tuple[float, float], list[str]] = {}
        for c in self.checks:
            groups.setdefault((c.atol, c.rtol), []).append(c.name)
        if len(groups) <= 1:
            lines = [f"(pass: |analytic - numeric| <= {self.atol:g} + "
                     f"{self.rtol:g}·|numeric|{floor}, the bound at the worst element)"]
        else:
            rules = "; ".join(f"{', '.join(group)}: {a:g} + {r:g}·|numeric|"
                              for (a, r), group in groups.items())
            lines = [f"(pass: |analytic - numeric| <= atol + rtol·|numeric|{floor}, the bound "
                     f"at the worst element; {rules})"]
        if self.floor:
            lines.append(self._floor_note)
        if not any(c.checked for c in self.checks):
            lines.append(f"(nothing compared: every {self._subject} has zero elements): FAIL")
        return lines + _skipped_note(self.skipped)

    __repr__ = __str__


def _skipped_note(skipped) -> list[str]:
    """The line naming the arguments skipped for their dtype (none when none was)."""
    if not skipped:
        return []
    return ["(skipped for their dtype, not checked: "
            + ", ".join(f"{name} ({dtype})" for name, dtype in skipped) + ")"]


def _verdict(c: ArgumentCheck) -> str:
    """``pass``, or ``FAIL`` with how many of the checked elements failed; the kinks (not
    failures) and a claim that differed when computed again (one) said too; ``empty`` for a
    check that compared no element."""
    if not c.deterministic:
        return "FAIL (not deterministic: a second call differed)"
    if c.checked == 0:
        return "empty (nothing compared)"
    kinks = f"; {c.kinks} kink{'s' * (c.kinks != 1)}, not differentiable" if c.kinks else ""
    if c.failures == 0:
        return f"pass{' (' + kinks[2:] + ')' if kinks else ''}"
    return f"FAIL ({c.failures} of {c.checked} elements{kinks})"


def _to_numpy(a):
    """A NumPy array of ``a`` (NumPy, CuPy, PyTorch, JAX or array-like), copied to the host
    where it lives elsewhere (PyTorch's bfloat16, which NumPy lacks, as float32)."""
    if _library(a) == "torch" and a.dtype == sys.modules["torch"].bfloat16:
        a = a.float()
    return _interop.to_numpy(a)


def _tolerance_dtype(a):
    """The NumPy dtype whose default tolerances a gradient ``a`` gets; None (the loosest)
    for one NumPy lacks, such as PyTorch's bfloat16."""
    if _library(a) == "torch":
        torch = sys.modules["torch"]
        return {torch.float64: np.float64, torch.float32: np.float32,
                torch.float16: np.float16}.get(a.dtype)
    return getattr(a, "dtype", None)


def _as_outputs(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _library(a) -> str | None:
    return library_of(a)


def _is_float_array(a) -> bool:
    """A floating-point array of NumPy, CuPy, PyTorch or JAX (a NumPy scalar is not one)."""
    return _library(a) is not None and is_float(a)


def _arguments(args) -> tuple:
    """``args`` as a tuple; TypeError for a bare array (or anything else not a sequence of
    arguments), which would otherwise be unpacked row by row into ``f``."""
    if isinstance(args, (tuple, list)):
        return tuple(args)
    if library_of(args) is not None or hasattr(args, "shape") or not hasattr(args, "__iter__"):
        name = type(args).__name__
        raise TypeError(f"args must be a tuple or list of arrays, got {name}; pass (w,) for "
                        "a function of one array w (NumPy, CuPy, PyTorch or JAX)")
    return tuple(args)


def _float64_copy(a):
    """A float64 copy of the float array ``a`` in its own library, for differencing."""
    library = _library(a)
    if library == "torch":
        return a.detach().to(dtype=sys.modules["torch"].float64, copy=True)
    if library == "jax":
        jnp = sys.modules["jax"].numpy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy = jnp.asarray(a, dtype=jnp.float64)
        if copy.dtype != np.float64:
            raise TypeError("JAX arrays can only be checked in float64: enable it with "
                            "jax.config.update('jax_enable_x64', True)")
        return copy
    return a.astype(np.float64, copy=True)


def _like(output, values):
    """``values`` (NumPy float64) converted to ``output``'s array library, device and dtype.
    CuPy gets its own branch: before CuPy 14 its arrays have no ``__array_namespace__``, and
    the array API's ``asarray`` would allocate on the current device, not ``output``'s."""
    library = _library(output)
    if library == "torch":
        return sys.modules["torch"].as_tensor(values, dtype=output.dtype, device=output.device)
    dtype = getattr(output, "dtype", np.float64)
    if library == "cupy":
        with output.device:
            return sys.modules["cupy"].asarray(values, dtype=dtype)
    if isinstance(output, np.ndarray) or not hasattr(output, "__array_namespace__"):
        return np.asarray(values, dtype=dtype)
    return output.__array_namespace__().asarray(values, dtype=dtype)


def _shaped_like(value, items):
    """``items`` in the container type of ``f``'s output ``value`` (a tuple, a NamedTuple or
    a list; a result's settings record not carried over), for the claimed vjp's
    cotangent."""
    return trees.rebuilt(value, items, settings=False)


def _index(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_selection(args, names, wrt, samples):
    """The indices to check (``wrt``, default every float array); TypeError/ValueError
    naming ``wrt`` or ``samples`` when they are malformed, ValueError ("nothing to check")
    when they hold no float element (``_something_to_check``)."""
    if samples is not None and not _index(samples):
        raise TypeError(f"samples must be a positive integer or None, got {samples!r}")
    if samples is not None and samples < 1:
        raise ValueError(f"samples must be a positive integer or None, got {samples}")
    if wrt is None:
        return _something_to_check(
            args, names, [k for k, a in enumerate(args) if _is_float_array(a)], None)
    if _index(wrt) or isinstance(wrt, str) or not hasattr(wrt, "__iter__"):
        raise TypeError(f"wrt must be a sequence of argument indices, got {wrt!r}")
    wrt = list(wrt)
    for k in wrt:
        if not _index(k) or not -len(args) <= k < len(args):
            raise ValueError(f"wrt must hold argument indices in [0, {len(args)}), got {k!r}")
    wrt = [int(k) % len(args) for k in wrt]
    if len(set(wrt)) != len(wrt):
        raise ValueError(f"wrt names an argument twice: {wrt}")
    for k in wrt:
        if not _is_float_array(args[k]):
            raise TypeError(f"wrt names argument {names[k]}, which is not a float array")
    return _something_to_check(args, names, wrt, "wrt")


def _something_to_check(args, names, selected, given):
    """``selected`` (argument indices), or ValueError ("nothing to check: ...") when it holds
    no float element: no float array among ``args``, a ``wrt`` (``given``) selecting none, or
    only empty arrays. The oracle never vouches for what it did not compare."""
    if not selected and given is not None:
        raise ValueError(f"nothing to check: {given}=[] selects no argument")
    if not selected:
        kinds = ", ".join(f"{n}: {_kind(a)}" for n, a in zip(names, args, strict=True))
        raise ValueError("nothing to check: no float array among the arguments "
                         f"({kinds or 'none given'}); pass the float arrays to differentiate")
    if all(math.prod(args[k].shape) == 0 for k in selected):
        shapes = ", ".join(f"{names[k]}: shape {tuple(args[k].shape)}" for k in selected)
        raise ValueError(f"nothing to check: every float array selected is empty ({shapes})")
    return selected


def _something_moved(directions, names, what):
    """ValueError ("nothing to check: ...") when ``directions`` (``what``: the tangents or
    the direction, float64 NumPy arrays or None) move no element: all None, empty or zero."""
    if not any(v is not None and np.any(v != 0) for v in directions):
        given = ", ".join(f"{n}: {'None' if v is None else 'zero' if v.size else 'empty'}"
                          for n, v in zip(names, directions, strict=True))
        raise ValueError(f"nothing to check: no element is moved along the {what} ({given})")


def _kind(a) -> str:
    """What an argument is, for a message: an array's dtype, or its type's name."""
    return f"{a.dtype} array" if _library(a) is not None else type(a).__name__


def _skipped(args, names) -> tuple[tuple[str, str], ...]:
    """``(name, dtype)`` of each array argument skipped for its dtype (integer, boolean,
    complex: any but a float dtype)."""
    return tuple((n, str(a.dtype)) for n, a in zip(names, args, strict=True)
                 if _library(a) is not None and not _is_float_array(a))


def check_vjp(f: Callable[..., Any], vjp: Callable[..., Any], args: Sequence[Any], *,
              wrt: Sequence[int] | None = None, cotangent: Any = None,
              names: Sequence[str] | None = None, rtol: float | None = None,
              atol: float | None = None, seed: int = 0, samples: int | None = None,
              fast: bool = False, repeat: bool = True) -> VJPReport:
    """Check a claimed vector-Jacobian product ``vjp`` of ``f`` at ``args`` by central
    differences in float64 (the method: the module docstring).

    - ``f(*args)`` returns an array or a tuple of arrays; it is evaluated on float64 copies
      of the float arguments for the differences, so it must accept float64 (JAX: enable
      ``jax_enable_x64``).
    - ``vjp(cotangent, *args)`` returns one gradient per argument (None counts as zero);
      ``cotangent`` has the structure of ``f``'s output, each array in its output's
      library, device and dtype.
    - ``args``: NumPy, CuPy, PyTorch or JAX arrays; any other entry (a scalar, a string)
      passes through unchecked. A function of one array ``w`` takes ``(w,)``; a bare array
      is refused (TypeError). ``wrt``: the indices to check (default every float array);
      ``names``: for the report (default ``arg0, arg1, ...``).
    - ``cotangent``: default standard normal draws from ``numpy.random.default_rng(seed)``.
    - ``rtol``, ``atol``: ``|analytic - numeric| <= atol + rtol·|numeric|`` (plus the
      round-off floor with the default ``atol``), by default by each gradient's own dtype
      (``DEFAULT_TOLERANCES``). ``samples``: at most this many elements per argument
      (seeded); default all.
    - ``fast``: one random direction of all the arguments first; its one row when it passes,
      the full report when it fails. ``repeat``: call ``vjp`` again; a gradient that
      differs, bit for bit, fails as not deterministic.

    Returns a ``VJPReport`` (``.raise_if_failed()``), listing the array arguments skipped for
    their dtype (``skipped``). An element whose numeric or analytic derivative is not finite
    fails; one at a kink of ``L`` is counted as one, not failed; a float16/32 gradient's error
    is also given in its ulps. ValueError ("nothing to check: ...") when no float element is
    selected (only integer, boolean or empty arguments; a ``wrt`` that selects none): the
    oracle never vouches for what it did not compare.
    """
    args = _arguments(args)
    names = _names(args, names)
    wrt = _check_selection(args, names, wrt, samples)
    rng = np.random.default_rng(seed)

    value = f(*args)
    cts, cts_native = _cotangents(value, cotangent, rng)
    grads = _claimed(vjp, value, cts_native, args)
    analytic, tolerances = _analytic(grads, args, wrt, names, rtol, atol)
    floor_used = atol is None
    args64 = [_float64_copy(a) if k in analytic else a for k, a in enumerate(args)]
    cotangent_vector = np.concatenate([c.ravel() for c in cts]) if cts else np.zeros(0)
    outputs_at = functools.partial(_flat_outputs, f, args64)
    loosest = max(tolerances.values(), default=_tolerances(np.float64, rtol, atol))
    if fast:
        directional = _directional_vjp(f, args64, cotangent_vector, analytic, rng, floor_used,
                                       *loosest)
        if directional.passed:
            return VJPReport((directional,), *loosest, floor_used, _skipped(args, names))
    checks = tuple(_checked_argument(names[k], analytic[k].astype(np.float64), outputs_at,
                                     cotangent_vector, args64, k, rng, samples, floor_used,
                                     *tolerances[k], claim_dtype=_claim_dtype(grads[k]))
                   for k in wrt)
    if repeat:
        checks = _repeated(checks, grads, _claimed(vjp, value, cts_native, args), wrt)
    return VJPReport(checks, *loosest, floor_used, _skipped(args, names))


def _repeated(checks, claims, again, indices):
    """``checks`` with each one's ``deterministic``: whether the claim at its index in
    ``claims`` was the same, bit for bit, when computed ``again``."""
    return tuple(dataclasses.replace(c, deterministic=_same(claims[k], again[k]))
                 for c, k in zip(checks, indices, strict=True))


@dataclass(frozen=True)
class TaylorReport:
    """What ``taylor_test`` saw: per step ``h``, the Taylor remainders of first order,
    ``|L(a + h·u) - L(a)|``, and of second, ``|L(a + h·u) - L(a) - h·<g, u>|``; the slopes
    of the second between successive steps (in powers of two: 2 for a right gradient, 1 for a
    wrong one) and the median of the last three, ``slope``. ``str(report)`` is a table."""

    steps: tuple
    first_order: tuple
    remainders: tuple
    slopes: tuple
    slope: float
    noise: float
    passed: bool
    skipped: tuple[tuple[str, str], ...] = ()   # (name, dtype) of each skipped for its dtype

    def raise_if_failed(self) -> TaylorReport:
        if not self.passed:
            raise GradientCheckError(f"Taylor test failed\n{self}")
        return self

    def __str__(self) -> str:
        rows = [(f"{h:.3e}", f"{r1:.3e}", f"{r2:.3e}",
                 "-" if k == 0 or self.slopes[k - 1] is None else f"{self.slopes[k - 1]:.2f}")
                for k, (h, r1, r2) in enumerate(zip(self.steps, self.first_order,
                                                    self.remainders, strict=True))]
        verdict = "pass" if self.passed else "FAIL"
        return "\n".join(table(("h", "|L(a+hu) - L(a)|", "|... - h<g, u>|", "slope"), rows) + [
            f"(slope {self.slope:.2f} at the smallest steps, 2 for a right gradient; noise "
            f"{self.noise:.1e}, remainders below 1000x it not used): {verdict}"]
            + _skipped_note(self.skipped))

    __repr__ = __str__


def taylor_test(f: Callable[..., Any], vjp: Callable[..., Any], args: Sequence[Any], *,
                direction: Sequence[Any] | None = None, cotangent: Any = None,
                wrt: Sequence[int] | None = None, seed: int = 0,
                steps: int = 20) -> TaylorReport:
    """The Taylor test of a claimed gradient (Farrell et al., dolfin-adjoint): with
    ``L = <ct, f>`` and ``g = vjp(ct, *args)``, the remainder

        r(h) = |L(a + h·u) - L(a) - h·<g, u>|

    falls as h² when ``g`` is right and only as h when it is wrong, whatever the function's
    scale: the test reads the slope of ``log r`` against ``log h`` over ``steps`` halvings of
    ``h`` (from ``0.1·max(1, |a|_max)/|u|_max``), with no step size to tune. An error ``e``
    in ``<g, u>`` adds ``e·h``, which wins over the ``h²`` term as ``h`` shrinks, so the
    test passes when the median of the last three slopes, over the remainders above 1000
    times the rounding noise of ``L``, is at least 1.8 (or when every remainder is below
    that: nothing shows an error). ``u`` is
    ``direction`` (one entry per argument, None for zero) or seeded normal draws for the
    arguments ``wrt``; ``args`` and ``cotangent`` as for ``check_vjp``. Returns a
    ``TaylorReport``, listing the array arguments skipped for their dtype (``skipped``).
    ValueError ("nothing to check: ...") when there is no float element to move: no float
    array among ``args``, a ``wrt`` that selects none, only empty arrays, or a ``direction``
    that is None, empty or zero for every argument."""
    args = _arguments(args)
    names = _names(args, None)
    wrt = _check_selection(args, names, wrt, None)
    rng = np.random.default_rng(seed)
    value = f(*args)
    cts, cts_native = _cotangents(value, cotangent, rng)
    grads = _claimed(vjp, value, cts_native, args)
    directions = _tangents(args, direction, wrt, rng, "direction")
    moved = [k for k, u in enumerate(directions) if u is not None]
    args64 = [_float64_copy(a) if k in moved else a for k, a in enumerate(args)]
    claimed = sum(float(np.sum(np.zeros(1) if grads[k] is None
                               else _to_numpy(grads[k]).astype(np.float64) * directions[k]))
                  for k in moved)
    ct = np.concatenate([c.ravel() for c in cts]) if cts else np.zeros(0)

    def loss(h):
        return float(np.dot(ct, np.concatenate(
            _outputs_along(f, args64, directions, h) or [np.zeros(0)])))

    base = loss(0.0)
    noise = np.finfo(np.float64).eps * (abs(base) + float(np.dot(np.abs(ct), np.abs(
        np.concatenate(_outputs_along(f, args64, directions, 0.0) or [np.zeros(0)])))))
    hs = [0.1 * _step_along(args64, directions) / np.cbrt(np.finfo(np.float64).eps) / 2 ** j
          for j in range(steps)]
    first = [abs(loss(h) - base) for h in hs]
    second = [abs(loss(h) - base - h * claimed) for h in hs]
    return _taylor_report(hs, first, second, noise, _skipped(args, names))


def _taylor_report(hs, first, second, noise, skipped=()):
    """The slopes of ``second`` between successive halvings and the verdict."""
    usable = [r > 1e3 * noise for r in second]
    slopes = [float(np.log2(a / b)) if ok_a and ok_b else None
              for (a, ok_a), (b, ok_b) in itertools.pairwise(zip(second, usable, strict=True))]
    measured = [v for v in slopes if v is not None][-3:]   # the smallest steps tell
    slope = float(np.median(measured)) if measured else float("nan")
    passed = (not any(usable)) or (len(measured) >= 2 and slope >= 1.8)
    return TaylorReport(tuple(hs), tuple(first), tuple(second), tuple(slopes), slope, noise,
                        passed, skipped)


def _claim_dtype(g):
    """The NumPy dtype of a claimed derivative (None for None or one NumPy lacks)."""
    return None if g is None else _tolerance_dtype(g)


def _same(a, b) -> bool:
    """Whether two claims of one derivative are equal bit for bit (NaN equal to NaN)."""
    if a is None or b is None:
        return a is None and b is None
    a, b = _to_numpy(a), _to_numpy(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _directional_vjp(f, args64, cotangent, analytic, rng, with_floor, rtol, atol):
    """``check_vjp``'s fast mode: ``<vjp(ct), u> = Σ_k <g_k, u_k>`` for a random direction
    ``u`` of the checked arguments against ``<ct, f(a + h·u) - f(a - h·u)>/(2h)`` (the step
    of ``check_jvp``), judged again on the Richardson extrapolation when it does not pass.
    One ``ArgumentCheck``, named ``<g, u>``."""
    directions = [rng.standard_normal(a.shape) if k in analytic else None
                  for k, a in enumerate(args64)]
    claimed = np.array([sum(float(np.dot(analytic[k].astype(np.float64).ravel(), u.ravel()))
                            for k, u in enumerate(directions) if u is not None)])
    step = _step_along(args64, directions)
    along = functools.partial(_outputs_along, f, args64, directions)
    eps = np.finfo(np.float64).eps

    def difference(h):
        plus, minus = (np.concatenate(along(s) or [np.zeros(0)]) for s in (h, -h))
        floor = eps * float(np.dot(np.abs(cotangent), np.maximum(np.abs(plus), np.abs(minus))))
        with np.errstate(invalid="ignore", over="ignore"):
            return float(np.dot(cotangent, plus - minus)) / (2 * h), floor / h

    numeric, floor = difference(step)
    if not abs(claimed[0] - numeric) <= atol + rtol * abs(numeric) + floor:
        wide, wide_floor = difference(2 * step)
        numeric, floor = (4 * numeric - wide) / 3, (4 * floor + wide_floor) / 3
    return _compare("<g, u>", claimed, np.array([numeric]),
                    np.array([floor if with_floor else 0.0]), np.ones(1, dtype=bool), rtol,
                    atol)


@dataclass(frozen=True)
class JVPReport(VJPReport):
    """Per-output results of ``check_jvp``, one ``ArgumentCheck`` per output of ``f``:
    ``analytic`` is the claimed tangent, ``numeric`` the central difference along the
    tangents; ``str(report)`` is a table."""

    _subject: ClassVar[str] = "output"
    _claim: ClassVar[str] = "JVP"
    _floor_note: ClassVar[str] = "(floor: the rounding of the output itself, eps·|f_i|/step)"


def check_jvp(f: Callable[..., Any], jvp: Callable[..., Any], args: Sequence[Any], *,
              tangents: Sequence[Any] | None = None, wrt: Sequence[int] | None = None,
              names: Sequence[str] | None = None, rtol: float | None = None,
              atol: float | None = None, seed: int = 0, repeat: bool = True) -> JVPReport:
    """Check a claimed Jacobian-vector product ``jvp`` of ``f`` at ``args`` by central
    differences along the tangents, in float64.

    ``jvp(tangents, *args)`` returns the tangent of ``f``'s output, in its structure (an
    array, or a tuple, NamedTuple or list of arrays; None counts as zero). ``tangents`` is
    one entry per argument, None for a zero tangent (and for every argument that is not a
    float array); by default standard normal draws (``numpy.random.default_rng(seed)``) for
    the arguments ``wrt`` (default every float array). ``jvp`` gets them in each
    argument's own library, device and dtype; ``args``, ``rtol`` and ``atol`` are as for
    ``check_vjp``. ``names`` names ``f``'s outputs (default a NamedTuple's fields, else
    ``out0, out1, ...``).

    Every element of every output is checked at once, against

        numeric = (f(a + h·v) - f(a - h·v)) / (2h),   h = cbrt(eps)·max(1, |a|_max)/|v|_max

    over the perturbed arguments (the largest element moves as ``check_vjp``'s step); an
    element it does not pass is judged again on the Richardson extrapolation
    ``(4·D(h) - D(2h))/3``. The floor (with the default ``atol``) is each output's own
    rounding, ``eps·max|f_i(a ± h·v)|/h``. The ulps and ``repeat`` as for ``check_vjp``.
    Returns a ``JVPReport``: the arguments skipped for their dtype in ``skipped``; one whose
    every output is empty does not pass. ValueError ("nothing to check: ...") when no float
    element moves (only integer, boolean or empty arguments; a ``wrt`` selecting none;
    ``tangents`` None, empty or zero for every argument).
    """
    args = _arguments(args)
    wrt = _check_selection(args, _names(args, None), wrt, None)
    directions = _tangents(args, tangents, wrt, np.random.default_rng(seed))
    value = f(*args)
    outputs = _as_outputs(value)
    claimed = _claimed_tangents(jvp, value, directions, args)
    names = _output_names(value, names)
    moved = [k for k, v in enumerate(directions) if v is not None]
    args64 = [_float64_copy(a) if k in moved else a for k, a in enumerate(args)]
    step = _step_along(args64, directions)
    along = functools.partial(_outputs_along, f, args64, directions)
    numeric, floor = _directional(along, step, atol is None)
    analytic = [np.zeros(np.shape(o)).ravel() if t is None
                else _to_numpy(t).astype(np.float64).ravel()
                for o, t in zip(outputs, claimed, strict=True)]
    tolerances = [_tolerances(_tolerance_dtype(o if t is None else t), rtol, atol)
                  for o, t in zip(outputs, claimed, strict=True)]
    with np.errstate(all="ignore"):
        failing = [~(np.abs(an - d) <= a + r * np.abs(d) + fl)
                   for an, d, fl, (r, a) in zip(analytic, numeric, floor, tolerances, strict=True)]
    if any(m.any() for m in failing):   # Richardson, from the differences with 2·step
        wide, wide_floor = _directional(along, 2 * step, atol is None)
        for k, m in enumerate(failing):
            numeric[k][m] = (4 * numeric[k][m] - wide[k][m]) / 3
            floor[k][m] = (4 * floor[k][m] + wide_floor[k][m]) / 3
    checks = _jvp_checks(names, outputs, claimed, (analytic, numeric, floor), tolerances)
    if repeat:
        checks = _repeated(checks, claimed, _claimed_tangents(jvp, value, directions, args),
                           range(len(checks)))
    loosest = max(tolerances, default=_tolerances(np.float64, rtol, atol))
    return JVPReport(checks, *loosest, atol is None, _skipped(args, _names(args, None)))


def _jvp_checks(names, outputs, claimed, flat, tolerances):
    """One ``_compare`` per output of ``check_jvp``: ``flat = (analytic, numeric, floor)``,
    each a list of raveled float64 arrays, reshaped to the output's shape."""
    shapes = [np.shape(o) for o in outputs]
    return tuple(_compare(name, an.reshape(s), d.reshape(s), fl.reshape(s),
                          np.ones(s, dtype=bool), r, a, claim_dtype=_claim_dtype(t))
                 for name, s, t, an, d, fl, (r, a)
                 in zip(names, shapes, claimed, *flat, tolerances, strict=True))


def _tangents(args, tangents, wrt, rng, what="tangents"):
    """The tangent of each argument as a float64 NumPy array, or None (zero): drawn from
    ``rng`` for the arguments ``wrt`` when ``tangents`` is None, else the caller's, checked
    (``ValueError``/``TypeError`` naming the argument; "nothing to check" when they move no
    element, ``what`` naming them)."""
    if tangents is None:
        return [rng.standard_normal(tuple(a.shape)) if k in wrt else None
                for k, a in enumerate(args)]
    if not isinstance(tangents, (tuple, list)) or len(tangents) != len(args):
        raise ValueError(f"tangents must give one entry per argument ({len(args)}), got "
                         f"{type(tangents).__name__}")
    out = []
    for k, (a, t) in enumerate(zip(args, tangents, strict=True)):
        if t is None:
            out.append(None)
            continue
        if not _is_float_array(a):
            raise TypeError(f"tangents[{k}] is given for argument {k}, which is not a float "
                            "array (pass None)")
        t = _to_numpy(t).astype(np.float64)
        if t.shape != tuple(a.shape):
            raise ValueError(f"tangents[{k}] has shape {t.shape}, argument {k} has shape "
                             f"{tuple(a.shape)}")
        out.append(t)
    _something_moved(out, _names(args, None), what)
    return out


def _claimed_tangents(jvp, value, directions, args) -> tuple:
    """The claimed output tangents, one per output of ``f`` (None: zero): ``jvp`` called
    once with the tangents in each argument's library, device and dtype."""
    native = tuple(None if v is None else _like(a, v)
                   for a, v in zip(args, directions, strict=True))
    claimed = jvp(native, *args)
    outputs = _as_outputs(value)
    claimed = (claimed,) if not isinstance(value, (tuple, list)) else tuple(claimed)
    if len(claimed) != len(outputs):
        raise ValueError(f"jvp returned {len(claimed)} tangents for {len(outputs)} outputs")
    for k, (t, o) in enumerate(zip(claimed, outputs, strict=True)):
        if t is not None and tuple(np.shape(t)) != tuple(np.shape(o)):
            raise ValueError(f"the tangent of output {k} has shape {tuple(np.shape(t))}, "
                             f"expected {tuple(np.shape(o))}")
    return claimed


def _output_names(value, names) -> tuple[str, ...]:
    """One name per output of ``f``: the caller's, a NamedTuple's fields, or ``out<k>``."""
    outputs = _as_outputs(value)
    if names is None:
        fields = getattr(value, "_fields", None)
        return tuple(fields) if fields else tuple(f"out{k}" for k in range(len(outputs)))
    if isinstance(names, str) or len(names) != len(outputs):
        raise ValueError(f"names must give one name per output ({len(outputs)}), got "
                         f"{names!r}")
    return tuple(names)


def _step_along(args64, directions):
    """``h = cbrt(eps)·max(1, |a|_max)/|v|_max`` over the arguments with a tangent (1 when
    none has one): the largest element moves by ``check_vjp``'s step."""
    moved = [k for k, v in enumerate(directions) if v is not None]
    size = max([1.0] + [float(np.max(np.abs(_to_numpy(args64[k])), initial=0)) for k in moved])
    largest = max([float(np.max(np.abs(directions[k]), initial=0)) for k in moved] + [0.0])
    return np.cbrt(np.finfo(np.float64).eps) * size / (largest or 1.0)


def _outputs_along(f, args64, directions, step):
    """Every output of ``f`` at ``args64 + step·directions``, one float64 vector each."""
    shifted = [a if v is None else a + step * _like(a, v)
               for a, v in zip(args64, directions, strict=True)]
    return [_to_numpy(o).astype(np.float64).ravel() for o in _as_outputs(f(*shifted))]


def _directional(along, step, with_floor):
    """Per output, the central difference along the tangents with ``step`` and its
    round-off floor (zeros without ``with_floor``)."""
    plus, minus = along(step), along(-step)
    eps = np.finfo(np.float64).eps
    with np.errstate(invalid="ignore", over="ignore"):
        numeric = [(p - m) / (2 * step) for p, m in zip(plus, minus, strict=True)]
        floor = [eps * np.maximum(np.abs(p), np.abs(m)) / step if with_floor
                 else np.zeros_like(p) for p, m in zip(plus, minus, strict=True)]
    return numeric, floor


def _claimed(vjp, value, cts_native, args) -> tuple:
    """The claimed gradients, one per argument: ``vjp`` called once with the cotangent in
    the structure of ``f``'s output ``value``."""
    single_output = not isinstance(value, (tuple, list))
    grads = vjp(cts_native[0] if single_output else _shaped_like(value, cts_native), *args)
    grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    if len(grads) != len(args):
        raise ValueError(f"vjp returned {len(grads)} gradients for {len(args)} arguments")
    return grads


def _names(args, names) -> tuple[str, ...]:
    """One name per argument (default ``arg0, arg1, ...``); ValueError otherwise."""
    if names is None:
        return tuple(f"arg{k}" for k in range(len(args)))
    if isinstance(names, str) or len(names) != len(args):
        raise ValueError(f"names must give one name per argument ({len(args)}), got {names!r}")
    return tuple(names)


def _cotangents(value, cotangent, rng):
    """The cotangents for ``f``'s output ``value``: float64 NumPy arrays, and the same in
    each output's own library and dtype (for the claimed vjp). Drawn from ``rng`` when
    ``cotangent`` is None."""
    outputs = _as_outputs(value)
    if cotangent is None:
        cts = tuple(rng.standard_normal(np.shape(o)) for o in outputs)
    else:
        cts = tuple(_to_numpy(c).astype(np.float64) for c in _as_outputs(cotangent))
    if len(cts) != len(outputs) or any(c.shape != tuple(np.shape(o))
                                       for c, o in zip(cts, outputs, strict=True)):
        raise ValueError("cotangent must match the shapes of f's outputs "
                         f"{[tuple(np.shape(o)) for o in outputs]}")
    cts_native = tuple(_like(o, c) for o, c in zip(outputs, cts, strict=True))
    return tuple(_to_numpy(c).astype(np.float64) for c in cts_native), cts_native


def _analytic(grads, args, wrt, names, rtol, atol
              ) -> tuple[dict[int, np.ndarray], dict[int, _Tolerances]]:
    """The claimed gradients of the checked arguments as NumPy arrays (None as zeros), and
    each one's ``(rtol, atol)``; ValueError naming a gradient of the wrong shape."""
    analytic: dict[int, np.ndarray] = {}
    tolerances: dict[int, _Tolerances] = {}
    for k in wrt:
        shape = tuple(args[k].shape)
        g = np.zeros(shape) if grads[k] is None else _to_numpy(grads[k])
        if g.shape != shape:
            raise ValueError(f"the gradient for {names[k]} has shape {g.shape}, expected {shape}")
        analytic[k] = g
        tolerances[k] = _tolerances(
            g.dtype if grads[k] is None else _tolerance_dtype(grads[k]), rtol, atol)
    return analytic, tolerances


def _flat_outputs(f, args64):
    """Every output of ``f`` at ``args64``, as one float64 vector."""
    outs = [_to_numpy(o).astype(np.float64).ravel() for o in _as_outputs(f(*args64))]
    return np.concatenate(outs) if outs else np.zeros(0)


def _tolerances(dtype: Any, rtol: float | None, atol: float | None) -> _Tolerances:
    """``(rtol, atol)`` for a gradient of ``dtype``: the caller's, or the dtype's defaults
    (None or a dtype without defaults gets float16's, the loosest)."""
    loosest = DEFAULT_TOLERANCES[np.dtype(np.float16)]
    default_rtol, default_atol = (loosest if dtype is None
                                  else DEFAULT_TOLERANCES.get(np.dtype(dtype), loosest))
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _numeric_gradient(outputs_at, cotangent, args64, k, rng, samples, with_floor):
    """Central differences of ``L = <cotangent, f>`` with respect to each (or ``samples``)
    element of the float64 argument ``args64[k]``, which is perturbed in place and restored
    (a JAX array, immutable, is replaced by perturbed copies and then put back).

    The outputs are differenced one by one before they are weighted by the cotangent,
    ``<ct, f(a + h) - f(a - h)>``, so an output the element does not move contributes exactly
    zero, not its rounding. The floor, when asked for, is the rounding of those it does move:
    ``eps·Σ |ct_i|·max(|f_i(a + h)|, |f_i(a - h)|) / h`` over them. Returns the differences,
    the floors and the mask of the elements differenced (the others hold 0).
    """
    shape = tuple(args64[k].shape)
    size = math.prod(shape)
    numeric, floor = np.zeros(shape), np.zeros(shape)
    differenced = np.zeros(shape, dtype=bool)
    flat_indices = np.arange(size)
    if samples is not None and samples < size:
        flat_indices = np.sort(rng.choice(size, size=samples, replace=False))
    indices = [tuple(int(i) for i in np.unravel_index(flat, shape)) for flat in flat_indices]
    for index, (value, rounding) in zip(indices, _differences(
            outputs_at, cotangent, args64, k, indices, 1.0, with_floor), strict=True):
        numeric[index], floor[index] = value, rounding
        differenced[index] = True
    return numeric, floor, differenced


def _stepped(outputs_at, args64, k, index, scale):
    """``f``'s outputs with element ``index`` of ``args64[k]`` stepped up and down by
    ``scale·cbrt(eps)·max(1, |x0|)``, and ``(x0, x0 + h, x0 - h)`` as represented; the
    argument is restored after (a JAX array, immutable, is replaced by perturbed copies and
    then put back)."""
    base = args64[k]

    def put(value):
        if _library(base) != "jax":
            base[index] = value
        else:
            args64[k] = base.at[index].set(value)

    x0 = float(base[index])
    step = scale * np.cbrt(np.finfo(np.float64).eps) * max(1.0, abs(x0))
    x_plus, x_minus = x0 + step, x0 - step
    put(x_plus)
    plus = outputs_at()
    put(x_minus)
    minus = outputs_at()
    put(x0)
    args64[k] = base
    return plus, minus, x0, x_plus, x_minus


def _differences(outputs_at, cotangent, args64, k, indices, scale, with_floor):
    """``(difference, floor)`` for each element ``index`` of ``args64[k]``, differenced with
    ``scale`` times the step (``_numeric_gradient``); the argument is restored after."""
    eps = np.finfo(np.float64).eps
    weights = np.abs(cotangent)
    results = []
    for index in indices:
        plus, minus, _, x_plus, x_minus = _stepped(outputs_at, args64, k, index, scale)
        taken = x_plus - x_minus
        rounding = 0.0
        with np.errstate(invalid="ignore", over="ignore"):
            moved = plus - minus
            value = float(np.dot(cotangent, moved)) / taken
            if with_floor:
                changed = moved != 0
                magnitude = np.maximum(np.abs(plus[changed]), np.abs(minus[changed]))
                rounding = eps * float(np.dot(weights[changed], magnitude)) / (taken / 2)
        results.append((value, rounding))
    return results


def _extrapolated(outputs_at, cotangent, args64, k, numeric, floor, indices, with_floor):
    """``numeric`` and ``floor`` with the elements ``indices`` taken again by Richardson
    extrapolation: from the central differences with steps h and 2h,

        D = (4·D(h) - D(2h)) / 3,   floor = (4·floor(h) + floor(2h)) / 3

    whose truncation error is O(h⁴) instead of O(h²). A gradient that is right but whose
    function curves strongly over the step (a layer norm of a row that is nearly constant,
    a long chain of steps) passes with it; a wrong one does not."""
    numeric, floor = numeric.copy(), floor.copy()
    for index, (wide, wide_floor) in zip(indices, _differences(
            outputs_at, cotangent, args64, k, indices, 2.0, with_floor), strict=True):
        numeric[index] = (4 * numeric[index] - wide) / 3
        floor[index] = (4 * floor[index] + wide_floor) / 3
    return numeric, floor


def _checked_argument(name, analytic, outputs_at, cotangent, args64, k, rng, samples,
                      with_floor, rtol, atol, claim_dtype=None) -> ArgumentCheck:
    """The verdict on argument ``k``: its central differences, for the elements they do not
    pass the Richardson-extrapolated ones (``_extrapolated``), and for those still failing
    the test for a kink (``_kinks``)."""
    numeric, floor, differenced = _numeric_gradient(outputs_at, cotangent, args64, k, rng,
                                                    samples, with_floor)
    failing = _failing(analytic, numeric, floor, differenced, rtol, atol)
    kinks = None
    if failing:
        numeric, floor = _extrapolated(outputs_at, cotangent, args64, k, numeric, floor,
                                       failing, with_floor)
        failing = _failing(analytic, numeric, floor, differenced, rtol, atol)
    if failing:
        kinks = _kinks(outputs_at, cotangent, args64, k, analytic, floor, failing, rtol, atol)
    return _compare(name, analytic, numeric, floor, differenced, rtol, atol, kinks,
                    claim_dtype)


def _failing(analytic, numeric, floor, differenced, rtol, atol):
    """The indices of the ``differenced`` elements outside their bound."""
    with np.errstate(all="ignore"):
        passing = np.abs(analytic - numeric) <= atol + rtol * np.abs(numeric) + floor
    return [tuple(int(i) for i in index) for index in np.argwhere(differenced & ~passing)]


def _kinks(outputs_at, cotangent, args64, k, analytic, floor, indices, rtol, atol):
    """The mask of the elements ``indices`` (failing the central differences) that sit at a
    kink: ``L`` is not differentiable there, as at an active clip's boundary or ReLU(0).

    At a kink the one-sided differences converge to two different limits, so their gap
    stays as the step halves; on a smooth function that merely curves, the gap is the
    truncation error ``h·L''`` and halves with the step. An element is a kink when the gap
    at step h/2 is at least 3/4 of the one at h and above the bound, and the claimed value
    lies between the two one-sided derivatives (within the bound and their own change from
    h to h/2): the claim is one of the one-sided derivatives, or between them."""
    mask = np.zeros(analytic.shape, dtype=bool)
    wide, narrow = (_one_sided(outputs_at, cotangent, args64, k, indices, scale)
                    for scale in (1.0, 0.5))
    for index, (p1, m1), (p2, m2) in zip(indices, wide, narrow, strict=True):
        bound = atol + rtol * max(abs(p2), abs(m2)) + 2 * floor[index]
        slack = bound + abs(p1 - p2) + abs(m1 - m2)
        gap1, gap2 = abs(p1 - m1), abs(p2 - m2)
        mask[index] = bool(gap2 >= 0.75 * gap1 and gap2 > 2 * bound
                           and min(p2, m2) - slack <= analytic[index] <= max(p2, m2) + slack)
    return mask


def _one_sided(outputs_at, cotangent, args64, k, indices, scale):
    """``(D+, D-)`` for each element: ``<ct, f(a + h) - f(a)>/h`` and ``<ct, f(a) - f(a -
    h)>/h`` with ``scale`` times the central differences' step."""
    base_outputs = outputs_at()
    results = []
    for index in indices:
        plus, minus, x0, x_plus, x_minus = _stepped(outputs_at, args64, k, index, scale)
        with np.errstate(invalid="ignore", over="ignore"):
            results.append((float(np.dot(cotangent, plus - base_outputs)) / (x_plus - x0),
                            float(np.dot(cotangent, base_outputs - minus)) / (x0 - x_minus)))
    return results


def _compare(name, analytic, numeric, floor, differenced, rtol, atol, kinks=None,
             claim_dtype=None) -> ArgumentCheck:
    """The verdict on one argument's ``differenced`` elements, each within
    ``atol + rtol·|numeric| + floor``, but the ``kinks`` (counted, not failed). One whose
    analytic or numeric value is not finite fails (a NaN output, say, leaves nothing to
    vouch for). For a float16 or float32 claim, the largest error in its own ulps."""
    n_checked = int(differenced.sum())
    if n_checked == 0:
        return ArgumentCheck(name, 0, 0, None, 0.0, 0.0, 0.0, 0.0, rtol=rtol, atol=atol)
    shape = numeric.shape
    kinks = np.zeros(shape, dtype=bool) if kinks is None else kinks
    analytic, numeric, floor, differenced, kinks = (
        np.ravel(v) for v in (analytic, numeric, floor, differenced, kinks))
    judged = differenced & ~kinks
    with np.errstate(all="ignore"):
        abs_err = np.abs(analytic - numeric)
        finite = np.isfinite(abs_err)
        abs_err[~finite] = np.inf
        abs_err[~judged] = 0.0
        bound = atol + rtol * np.abs(numeric) + floor
        failing = judged & ~(abs_err <= bound)
        scale = np.maximum(np.abs(analytic), np.abs(numeric))
        rel_err = np.divide(abs_err, scale, out=np.zeros_like(abs_err), where=scale > 0)
        rel_err[~finite] = np.inf
        # The worst element is the one furthest past (or nearest to) its own bound.
        badness = np.divide(abs_err, bound, out=np.where(abs_err > 0, np.inf, 0.0),
                            where=bound > 0)
    badness[~finite] = np.inf
    badness[~judged] = -1.0
    worst = int(np.argmax(badness))
    return ArgumentCheck(
        name=name, checked=n_checked, failures=int(failing.sum()),
        index=tuple(int(i) for i in np.unravel_index(worst, shape)),
        analytic=float(analytic[worst]), numeric=float(numeric[worst]),
        abs_error=float(abs_err[worst]), rel_error=float(rel_err[judged].max(initial=0)),
        bound=float(bound[worst]), max_abs_error=float(abs_err[judged].max(initial=0)),
        rtol=rtol, atol=atol, kinks=int(kinks.sum()),
        max_ulp=_max_ulp(abs_err[judged], numeric[judged], claim_dtype))


def _max_ulp(abs_err, numeric, claim_dtype):
    """The largest of ``abs_err`` in ulps of ``claim_dtype`` at ``numeric`` (None unless the
    claim is float16 or float32): what a float32 kernel's error is in its own terms."""
    if claim_dtype is None or np.dtype(claim_dtype) not in (np.float16, np.float32):
        return None
    if abs_err.size == 0:
        return 0.0
    with np.errstate(all="ignore"):
        spacing = np.spacing(np.abs(numeric).astype(claim_dtype)).astype(np.float64)
        return float(np.max(abs_err / spacing))
