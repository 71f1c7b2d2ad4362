"""The command line: ``python -m gradcells check`` and ``python -m gradcells audit``.

``check`` runs the gradient oracle over every differentiable operation × every backend
available here × every dtype, on randomly drawn cases, and prints one row per combination;
its exit status is 1 if any case fails. ``audit`` checks another framework's fused recurrent
ops against the oracle (``gradcells.audit``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import __version__, _dispatch, audit, testing
from ._core.report import Progress, table
from ._dispatch import BACKENDS
from .audit import ALL
from .cells import OPS, SCAN_OPS, STACKS, cell_of

DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16}

# Every op the check runs, with the backend operation it needs (a stack: its sequence's;
# the linear scan, registered apart from the cells, its own):
# each forward with its gradient (check_vjp), its forward mode ``<op>_jvp`` and its second
# order ``<op>_grad_jvp`` (check_jvp), by the suffix that names the check.
_FIRST_ORDER = {**{name: name for name in OPS}, **STACKS, **{name: name for name in SCAN_OPS}}
_CHECKS = {"_grad_jvp": "grad_jvp_check", "_jvp": "jvp_check", "": "vjp_check"}
CHECKED = {f"{op}{suffix}": f"{needs}{suffix}" for suffix in ("", "_jvp", "_grad_jvp")
           for op, needs in _FIRST_ORDER.items()}


def available_backends():
    """(backend, array library, dtypes) for each backend usable on this machine."""
    found = [("reference", "numpy", ("float64", "float32"))]
    try:
        _dispatch.backend_module("cpu")        # the face reaches a backend through dispatch
    except ImportError:
        pass
    else:
        found.append(("cpu", "numpy", ("float64", "float32")))
    if _cuda_device_present():
        found.append(("reference", "cupy", ("float64", "float32")))
        found.append(("gpu", "cupy", ("float64", "float32", "float16")))
    return found


def _cuda_device_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU backend here"
        return False


def _usage_error(message) -> int:
    print(f"gradcells check: {message}", file=sys.stderr)
    return 2


def _op_name(name: str) -> str:
    """An op as named on the command line: a forward, or its ``_grad`` (the same check)."""
    return name[: -len("_grad")] if name.endswith("_grad") and name[:-5] in CHECKED else name


def _ops_help() -> str:
    listed = ", ".join(f"{name} ({name}_grad, {name}_jvp, {name}_grad_jvp)"
                       for name in _FIRST_ORDER)
    return ("only these ops: each forward checked with its gradient, or its forward mode "
            f"(<op>_jvp) or second order (<op>_grad_jvp): {listed}")


def _selection(args):
    """The ``(op, backend, library, dtype)`` rows to check, or an exit status (int)."""
    ops = [_op_name(op) for op in args.ops] if args.ops else list(CHECKED)
    unknown = sorted(set(ops) - set(CHECKED))
    if unknown:
        return _usage_error(f"unknown op(s): {', '.join(unknown)}; known: {', '.join(CHECKED)} "
                            "(or their _grad)")
    available = available_backends()
    missing = sorted(set(args.backends or ()) - {backend for backend, _, _ in available})
    if missing:
        return _usage_error(f"backend(s) not available here: {', '.join(missing)} "
                            "(cpu needs Numba; gpu needs CuPy and a CUDA device)")
    rows = [(op, backend, library, dtype)
            for op in dict.fromkeys(ops)
            for backend, library, dtypes in available
            if (not args.backends or backend in args.backends)
            and hasattr(_dispatch.backend_module(backend), CHECKED[op])
            for dtype in dtypes
            if not args.dtypes or dtype in args.dtypes]
    if not rows:
        return _usage_error("nothing to check: no available backend runs the dtypes "
                            f"{', '.join(args.dtypes)}")
    return rows


@dataclass
class _Result:
    """One row of ``check``: the cases run on one op, backend, library and dtype."""

    op: str
    backend: str
    library: str
    dtype: str
    cases: int = 0
    elements: int = 0
    worst_abs: float = 0.0
    failures: int = 0
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.op} / {self.backend} ({self.library}) / {self.dtype}"

    def cells(self) -> tuple[str, ...]:
        verdict = "pass" if not self.failures else (
            f"ERROR {self.error}" if self.error else f"FAIL ({self.failures} of {self.cases})")
        return (self.op, self.backend, self.library, self.dtype, str(self.cases),
                str(self.elements), f"{self.worst_abs:.1e}", verdict)


def _check_row(row, row_index, args, progress: Progress) -> _Result:
    result = _Result(*row)
    suffix = next(s for s in _CHECKS if result.op.endswith(s))
    op, check = result.op.removesuffix(suffix), getattr(testing, _CHECKS[suffix])
    drawer = testing.OPS[op][0]
    rng = np.random.default_rng([args.seed, row_index])
    for _ in range(args.examples):
        progress.step(result.label)
        case = testing.on_library(drawer(rng, DTYPES[result.dtype]), result.library)
        try:
            report = check(op, case, backend=result.backend, seed=args.seed)
        except Exception as exc:  # an exception is a failed check, reported as such
            result.error = f"{type(exc).__name__}: {exc}"
            result.failures += 1
            break
        result.cases += 1
        result.failures += not report.passed
        result.elements += sum(c.checked for c in report.checks)
        result.worst_abs = max(result.worst_abs, report.max_abs_error)
        if not report.passed and args.verbose:
            print(f"\n{result.label}: failing case\n{report}", file=sys.stderr)
    return result


def _quiet_rows(indexed_rows, args) -> list[_Result]:
    return [_check_row(row, k, args, Progress(0, enabled=False)) for k, row in indexed_rows]


def _in_processes(rows, args, progress: Progress) -> list[_Result]:
    """``_check_row`` of every row in ``args.jobs`` new processes (spawned: CUDA and the
    threaded libraries do not survive a fork). The rows of one cell and dtype run in one
    process, in turn, so that no two processes compile the same kernels at once (a cold
    Numba cache is most of a first run's time); the largest groups go first. Each row draws
    from its own generator, so the results are the one-process run's; the progress counts
    a group's cases as it ends."""
    groups: dict[tuple, list] = {}
    for k, row in enumerate(rows):
        op, _, _, dtype = row
        groups.setdefault((cell_of(op), dtype), []).append((k, row))
    results: list = [None] * len(rows)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {pool.submit(_quiet_rows, group, args): group
                   for group in sorted(groups.values(), key=len, reverse=True)}
        for future in concurrent.futures.as_completed(futures):
            for (k, _), result in zip(futures[future], future.result(), strict=True):
                results[k] = result
                for _ in range(args.examples):
                    progress.step(result.label)
    return results


CHECK_HEADER = ("op", "backend", "arrays", "dtype", "cases", "elements", "max abs err",
                "result")


def _run_check(args) -> int:
    rows = _selection(args)
    if isinstance(rows, int):
        return rows
    progress = Progress(len(rows) * args.examples)
    start = time.perf_counter()
    results = (_in_processes(rows, args, progress) if args.jobs > 1
               else [_check_row(row, k, args, progress) for k, row in enumerate(rows)])
    progress.close()
    for line in table(CHECK_HEADER, [r.cells() for r in results]):
        print(line)
    failed = sum(1 for r in results if r.failures)
    elapsed = time.perf_counter() - start
    print(f"\n{len(results) - failed} of {len(results)} combinations pass "
          f"({sum(r.cases for r in results)} cases, seed {args.seed}, {elapsed:.1f} s); "
          "derivatives against float64 central differences.")
    return 1 if failed else 0


def _run_audit(args) -> int:
    return audit.run(args.framework, examples=args.examples, seed=args.seed,
                     select=args.select, markdown=args.markdown)


def _integer(text, least, what):
    """``text`` as an int of at least ``least``; argparse reports the error as a usage one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def _positive_int(text):
    return _integer(text, 1, "a positive integer")


def _seed(text):
    return _integer(text, 0, "a non-negative integer")


def _version() -> str:
    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradcells",
        description="Gradient checks and framework audits for fused LSTM/GRU cells.")
    parser.add_argument("--version", action="version", version=f"gradcells {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check", help="run the gradient oracle over every op, "
                                              "backend and dtype")
    check.add_argument("--examples", type=_positive_int, default=10, metavar="N",
                       help="random cases per op/backend/dtype (default 10)")
    check.add_argument("--seed", type=_seed, default=0)
    check.add_argument("--ops", nargs="+", metavar="OP", help=_ops_help())
    check.add_argument("--backends", nargs="+", choices=BACKENDS, metavar="NAME",
                       help=f"only these backends ({', '.join(BACKENDS)})")
    check.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), help="only these dtypes")
    check.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                       help="check the combinations in N processes (default 1)")
    check.add_argument("-v", "--verbose", action="store_true", help="print failing reports")
    check.set_defaults(run=_run_check)

    audit = commands.add_parser("audit", help="check a framework's fused recurrent ops "
                                              "against the oracle")
    audit.add_argument("framework", choices=["all", *ALL],
                       help="the framework whose recurrent layers to audit (all: each one "
                            "installed)")
    audit.add_argument("--examples", type=_positive_int, default=3, metavar="N")
    audit.add_argument("--seed", type=_seed, default=0)
    audit.add_argument("--select", metavar="TEXT",
                       help="only the checks whose name contains TEXT (case-insensitive)")
    audit.add_argument("--markdown", action="store_true",
                       help="print the audit as a Markdown section with the versions it ran "
                            "on (docs/audit.md)")
    audit.set_defaults(run=_run_audit)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status:
    0 when everything passes, 1 on a failure, 2 on a usage error."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
