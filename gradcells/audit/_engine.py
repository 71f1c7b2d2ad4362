"""The audit's engine: outcomes of comparisons, verdicts of cases, checks, rows, and the run
that prints them as one table (``gradcells._core.report``).

A check is a function ``case(rng) -> Verdict`` run on ``examples`` generated cases; its row is
**agrees** (every case matches the truth), **known fault N** or **convention N** (a case
misses the truth but matches the model of entry N of ``gradcells.audit.faults``: a fault, or
a documented difference of convention; where a row may show several entries, it names those
the cases needed, e.g. ``convention 30 + known fault 32``), **skipped** (the case raised
``Skipped``: the installed framework cannot run the check, with the reason; never a pass) or
**unexpected mismatch** (a case matches none of these, or the framework raised). Only unexpected
mismatches make the exit status 1.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import TextIO

import numpy as np

from .. import __version__
from .._core.report import Progress, count, markdown_table, table
from .faults import FAULTS

# |claim - truth| <= atol + rtol·|truth|, by what is compared: (rtol, atol).
FLOAT32_FORWARD = (1e-5, 1e-6)      # TensorFlow float32 vs gradcells float64, same inputs
FLOAT32_GRADIENT = (1e-4, 1e-5)     # TensorFlow float32 gradient vs gradcells float64
FLOAT64 = (1e-10, 1e-12)            # PyTorch float64 vs gradcells float64


class Skipped(Exception):
    """Raised by a check's case when the installed framework cannot run it (too old a
    version, an absent backend); its message is the reason the row gives."""


@dataclass(frozen=True)
class Outcome:
    """The worst disagreement of one comparison: its ratio to the tolerance (<= 1 agrees),
    the absolute error there and the output or argument it was in."""

    ratio: float
    abs_error: float
    where: str

    @property
    def agrees(self) -> bool:
        return self.ratio <= 1.0


AGREES = Outcome(0.0, 0.0, "-")
FAILED = Outcome(np.inf, np.inf, "-")


def _worst_element(name, claim, truth, rtol, atol) -> Outcome | None:
    """The worst element of ``claim`` against ``truth`` (float64 arrays of one shape); None
    when they are empty."""
    if claim.size == 0:
        return None
    error = np.abs(claim - truth)
    error = np.where(np.isnan(error), np.inf, error)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0.0, error / (atol + rtol * np.abs(truth)))
    k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return Outcome(float(ratio[k]), float(error[k]), name)


def compare(pairs: Iterable[tuple[str, object, object]],
            tolerance: tuple[float, float]) -> Outcome:
    """Worst of ``(name, claim, truth)`` comparisons under ``tolerance = (rtol, atol)``; a
    shape mismatch is an infinite disagreement and ends the comparison."""
    rtol, atol = tolerance
    worst = AGREES
    for name, claim, truth in pairs:
        claim = np.asarray(claim, dtype=np.float64)
        truth = np.asarray(truth, dtype=np.float64)
        if claim.shape != truth.shape:
            return Outcome(np.inf, np.inf, f"{name} (shape {claim.shape}, not {truth.shape})")
        outcome = _worst_element(name, claim, truth, rtol, atol)
        if outcome is None:
            continue
        if outcome.ratio > worst.ratio or worst is AGREES:
            worst = outcome
    return worst


def oracle_outcome(report) -> Outcome:
    """The oracle's ``VJPReport`` as an ``Outcome``."""
    worst = AGREES
    for c in report.checks:
        if not c.checked:
            continue
        ratio = c.abs_error / c.bound if c.bound > 0 else (0.0 if c.abs_error == 0 else np.inf)
        if ratio > worst.ratio or worst is AGREES:
            worst = Outcome(float(ratio), float(c.abs_error), c.name)
    return worst


@dataclass(frozen=True)
class Verdict:
    """One case's result: the outcome against the truth and, when a known fault is
    expected, against the fault's model (None when not needed or not modelled);
    ``entries``: the entries that model needed (None: every entry the check names)."""

    truth: Outcome
    fault_model: Outcome | None = None
    raised: str | None = None
    entries: tuple[int, ...] | None = None

    def kind(self, fault: int | tuple[int, ...] | None) -> str:
        """``"agrees"``, ``"fault"`` or ``"unexpected"`` (``fault``: the check's entries)."""
        if self.raised is None and self.truth.agrees:
            return "agrees"
        if fault and self.fault_model is not None and self.fault_model.agrees:
            return "fault"
        return "unexpected"


def judge(claim: Outcome, fault_model: Callable[[], Outcome] | None) -> Verdict:
    """The verdict for ``claim``; the fault model is evaluated only on a mismatch."""
    if claim.agrees or fault_model is None:
        return Verdict(claim)
    return Verdict(claim, fault_model())


def judge_entries(model: Callable[[frozenset[int]], Outcome],
                  entries: Sequence[int]) -> Verdict:
    """The verdict of a case whose model is built from independent entries: ``model(active)``
    is the comparison with the entries in ``active`` applied (``model(frozenset())`` is the
    truth). On a mismatch the verdict names the smallest set of ``entries`` whose model
    agrees (sets of one first, the whole set last, which is the model reported otherwise)."""
    claim = model(frozenset())
    if claim.agrees or not entries:
        return Verdict(claim)
    subsets = [s for size in range(1, len(entries) + 1) for s in combinations(entries, size)]
    for subset in subsets:
        outcome = model(frozenset(subset))
        if outcome.agrees:
            break
    return Verdict(claim, outcome, entries=subset)


def refused(name: str, message: str) -> Verdict:
    """The verdict of a call that the framework refused as the fault predicts (the refusal
    is the fault's model, so it matches)."""
    return Verdict(Outcome(np.inf, np.inf, name), Outcome(0, 0, name), raised=message)


def worst_verdict(verdicts: Sequence[Verdict]) -> Verdict:
    """The verdict to report of several sub-checks of one case: a real mismatch before a
    refusal before an agreement."""
    return max(verdicts, key=lambda v: (v.raised is None and not v.truth.agrees,
                                        v.raised is not None))


@dataclass(frozen=True)
class Check:
    """A row: ``case(rng) -> Verdict`` run ``cases`` times (None: ``examples``); ``fault``:
    the entry of ``faults`` it may show, or a tuple of entries when it may show several."""

    name: str
    case: Callable[[np.random.Generator], Verdict]
    fault: int | tuple[int, ...] | None = None
    cases: int | None = None

    @property
    def entries(self) -> tuple[int, ...]:
        """``fault`` as a tuple (empty: the row expects agreement)."""
        if self.fault is None:
            return ()
        return self.fault if isinstance(self.fault, tuple) else (self.fault,)


@dataclass
class Row:
    name: str
    cases: int
    result: str
    detail: str
    unexpected: bool
    entries: tuple[int, ...] = ()
    """The entries of ``faults`` the row shows."""


def _raised(error: Exception) -> Verdict:
    first = str(error).splitlines()[0] if str(error) else ""
    return Verdict(FAILED, raised=f"{type(error).__name__}: {first}"[:120])


def _verdicts(check: Check, rng, n: int) -> list[Verdict]:
    verdicts = []
    for _ in range(n):
        try:
            verdicts.append(check.case(rng))
        except Skipped:
            raise
        except Exception as error:       # the framework failing is a finding, not a crash
            verdicts.append(_raised(error))
    return verdicts


def _named(entries: tuple[int, ...]) -> str:
    """``fault N`` or ``entries N + M``: a row's entries in its detail."""
    return (f"fault {entries[0]}" if len(entries) == 1
            else "entries " + " + ".join(map(str, entries)))


def _unexpected_row(check: Check, n: int, verdicts, kinds) -> Row:
    bad = next(v for v, k in zip(verdicts, kinds, strict=True) if k == "unexpected")
    detail = (f"raised {bad.raised}" if bad.raised else
              f"|Δ| {bad.truth.abs_error:.2g} in {bad.truth.where} "
              f"({bad.truth.ratio:.3g}× tolerance)")
    if check.fault is not None and bad.fault_model is not None and not bad.raised:
        detail += f"; not {_named(check.entries)} either"
    return Row(check.name, n, f"UNEXPECTED MISMATCH ({kinds.count('unexpected')}/{n})",
               detail, True)


def _fault_row(check: Check, n: int, verdicts, kinds) -> Row:
    shown = [v for v, k in zip(verdicts, kinds, strict=True) if k == "fault"]
    entries = tuple(sorted({e for v in shown
                            for e in (check.entries if v.entries is None else v.entries)}))
    share = "" if len(shown) == n else f" ({len(shown)}/{n})"
    worst = max(shown, key=lambda v: (v.raised is not None, v.truth.ratio))
    detail = (f"raises {worst.raised}" if worst.raised else
              f"|Δ| {worst.truth.abs_error:.2g} in {worst.truth.where}; matches the "
              + ("fault" if len(entries) == 1 else "entries' joint model"))
    label = " + ".join(FAULTS[e].label for e in entries)
    return Row(check.name, n, f"{label}{share}", detail, False, entries)


def _agrees_row(check: Check, n: int, worst: Verdict) -> Row:
    detail = (f"max |Δ| {worst.truth.abs_error:.2g} ({worst.truth.ratio:.2g}× tolerance)"
              if worst.truth is not AGREES else "-")
    if check.fault is not None:
        detail += f"; {_named(check.entries)} not triggered"
    return Row(check.name, n, "agrees", detail, False)


def run_check(check: Check, rng: np.random.Generator, examples: int) -> Row:
    """Run ``check`` on its cases and sum them up in a row."""
    n = check.cases or examples
    try:
        verdicts = _verdicts(check, rng, n)
    except Skipped as reason:
        return Row(check.name, 0, "skipped", str(reason), False)
    kinds = [v.kind(check.fault) for v in verdicts]
    worst = max(verdicts, key=lambda v: (v.raised is not None, v.truth.ratio))
    if "unexpected" in kinds:
        return _unexpected_row(check, n, verdicts, kinds)
    if "fault" in kinds:
        return _fault_row(check, n, verdicts, kinds)
    return _agrees_row(check, n, worst)


def rows_table(rows: Sequence[Row]) -> list[str]:
    """The audit's table: one line per row, the detail last and unpadded."""
    return table(("check", "cases", "result", "detail"),
                 [(r.name, str(r.cases), r.result, r.detail) for r in rows], free_last=True)


def summary(rows: Sequence[Row], seconds: float | None) -> list[str]:
    """The lines under the table: the counts (and the time taken, unless None), and each
    fault shown, in a line."""
    unexpected = sum(r.unexpected for r in rows)
    agreeing = sum(r.result == "agrees" for r in rows)
    skipped = sum(r.result == "skipped" for r in rows)
    shown = sorted({e for r in rows for e in r.entries})
    faults = sum(any(FAULTS[e].kind == "fault" for e in r.entries) for r in rows)
    conventions = sum(bool(r.entries) for r in rows) - faults
    lines = [f"{count(len(rows), 'check')}: {agreeing} agree, {faults} show known faults, "
             + (f"{conventions} show documented conventions, " if conventions else "")
             + (f"{skipped} skipped, " if skipped else "")
             + f"{count(unexpected, 'unexpected mismatch', 'unexpected mismatches')}"
             + ("" if seconds is None else f" ({seconds:.1f} s)")]
    return lines + [f"  {FAULTS[n].kind} {n}: {FAULTS[n].title}" for n in shown]


def _versions() -> str:
    return (f"gradcells {__version__}, NumPy {np.__version__}, "
            f"Python {platform.python_version()}")


def text_report(title: str, rows: Sequence[Row], footer: Sequence[str], *, examples: int,
                seed: int, seconds: float) -> list[str]:
    """The audit as text: the title, the table, the counts, the faults shown, the footer."""
    return ([f"{title}; {examples} generated cases per check, seed {seed}", ""]
            + rows_table(rows) + [""] + summary(rows, seconds) + [f"  {f}" for f in footer])


def markdown_report(title: str, rows: Sequence[Row], footer: Sequence[str], *, examples: int,
                    seed: int, seconds: float, command: str | None = None) -> list[str]:
    """The audit as a Markdown section (``docs/audit.md``), with the versions it ran on and
    the ``command`` that gives it."""
    header = ("check", "cases", "result", "detail")
    cells = [(r.name, str(r.cases), r.result, r.detail) for r in rows]
    counts, *shown = summary(rows, None)       # no time: the section is stored
    ran = f"{_versions()}; {examples} generated cases per check, seed {seed}"
    return ([f"## {title.removeprefix('gradcells audit of ')}", "",
             ran + (f", by `{command}`." if command else "."), ""]
            + markdown_table(header, cells) + ["", counts + ".", ""]
            + [f"- {line.strip()}" for line in [*shown, *footer]])


def run_checks(title: str, checks: Sequence[Check], footer: Sequence[str], *, examples: int,
               seed: int, stream: TextIO, progress: bool, markdown: bool = False,
               command: str | None = None) -> int:
    """Run ``checks`` and print the audit to ``stream`` (as text, or as Markdown, naming
    ``command``, the command line that gives it); returns the exit status (0 or 1)."""
    rng = np.random.default_rng(seed)
    bar = Progress(len(checks), prefix="audit ", stream=sys.stderr, enabled=progress)
    rows, start = [], time.perf_counter()
    for check in checks:
        bar.step(check.name)
        rows.append(run_check(check, rng, examples))
    bar.close()
    seconds = time.perf_counter() - start
    lines = (markdown_report(title, rows, footer, examples=examples, seed=seed,
                             seconds=seconds, command=command) if markdown else
             text_report(title, rows, footer, examples=examples, seed=seed, seconds=seconds))
    for line in lines:
        print(line, file=stream)
    return 1 if any(r.unexpected for r in rows) else 0
