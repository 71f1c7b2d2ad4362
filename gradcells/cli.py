"""The command line: ``python -m gradcells check`` and ``python -m gradcells audit``.

``check`` runs the gradient oracle over every differentiable operation × every backend
available here × every dtype, on randomly drawn cases, and prints one row per combination;
its exit status is 1 if any case fails. ``audit`` checks another framework's fused recurrent
ops against the oracle (``gradcells.audit``).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ._dispatch import BACKENDS

DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16}


def available_backends():
    """(backend, array library, dtypes) for each backend usable on this machine."""
    found = [("reference", "numpy", ("float64", "float32"))]
    try:
        import gradcells.cpu  # noqa: F401
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


class _Progress:
    """A counter on stderr: rewritten in place on a terminal, one line per label otherwise."""

    def __init__(self, total):
        self.total, self.done, self.label = total, 0, None
        self.tty = sys.stderr.isatty()

    def step(self, label):
        self.done += 1
        if self.tty:
            print(f"\r[{self.done}/{self.total}] {label:<52}", end="", file=sys.stderr,
                  flush=True)
        elif label != self.label:
            print(f"[{self.done}/{self.total}] {label}", file=sys.stderr, flush=True)
        self.label = label

    def close(self):
        if self.tty:
            print(f"\r{' ' * 72}\r", end="", file=sys.stderr, flush=True)


def _usage_error(message) -> int:
    print(f"gradcells check: {message}", file=sys.stderr)
    return 2


def _run_check(args) -> int:
    from . import _dispatch, testing

    ops = args.ops or list(testing.OPS)
    unknown = sorted(set(ops) - set(testing.OPS))
    if unknown:
        return _usage_error(f"unknown op(s): {', '.join(unknown)}; known: "
                            f"{', '.join(testing.OPS)}")
    available = available_backends()
    missing = sorted(set(args.backends or ()) - {backend for backend, _, _ in available})
    if missing:
        return _usage_error(f"backend(s) not available here: {', '.join(missing)} "
                            "(cpu needs Numba; gpu needs CuPy and a CUDA device)")
    rows = [(op, backend, library, dtype)
            for op in ops
            for backend, library, dtypes in available
            if (not args.backends or backend in args.backends)
            and hasattr(_dispatch.backend_module(backend), op)
            for dtype in dtypes
            if not args.dtypes or dtype in args.dtypes]
    if not rows:
        return _usage_error("nothing to check: no available backend runs the dtypes "
                            f"{', '.join(args.dtypes)}")
    total = len(rows) * args.examples
    progress = _Progress(total)
    results, start = [], time.perf_counter()
    for row_index, (op, backend, library, dtype) in enumerate(rows):
        drawer = testing.OPS[op][0]
        rng = np.random.default_rng([args.seed, row_index])
        cases = failures = checked = 0
        worst_abs = 0.0
        error = None
        label = f"{op} / {backend} ({library}) / {dtype}"
        for _ in range(args.examples):
            progress.step(label)
            case = testing.on_library(drawer(rng, DTYPES[dtype]), library)
            try:
                report = testing.vjp_check(op, case, backend=backend, seed=args.seed)
            except Exception as exc:  # an exception is a failed check, reported as such
                error = f"{type(exc).__name__}: {exc}"
                failures += 1
                break
            cases += 1
            failures += not report.passed
            checked += sum(c.checked for c in report.checks)
            worst_abs = max(worst_abs, report.max_abs_error)
            if not report.passed and args.verbose:
                print(f"\n{label}: failing case\n{report}", file=sys.stderr)
        results.append((op, backend, library, dtype, cases, checked, worst_abs, failures, error))
    progress.close()

    header = ("op", "backend", "arrays", "dtype", "cases", "elements", "max abs err", "result")
    table = [header]
    for op, backend, library, dtype, cases, checked, worst_abs, failures, error in results:
        verdict = "pass" if not failures else (f"ERROR {error}" if error
                                               else f"FAIL ({failures} of {cases})")
        table.append((op, backend, library, dtype, str(cases), str(checked),
                      f"{worst_abs:.1e}", verdict))
    widths = [max(len(r[k]) for r in table) for k in range(len(header))]
    for k, r in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    failed = sum(1 for r in results if r[7])
    elapsed = time.perf_counter() - start
    print(f"\n{len(results) - failed} of {len(results)} combinations pass "
          f"({sum(r[4] for r in results)} cases, seed {args.seed}, {elapsed:.1f} s); "
          "gradients against float64 central differences.")
    return 1 if failed else 0


def _run_audit(args) -> int:
    from . import audit

    return audit.run(args.framework, examples=args.examples, seed=args.seed,
                     select=args.select)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradcells",
        description="Gradient checks and framework audits for fused LSTM/GRU cells.")
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check", help="run the gradient oracle over every op, "
                                              "backend and dtype")
    check.add_argument("--examples", type=_positive_int, default=10, metavar="N",
                       help="random cases per op/backend/dtype (default 10)")
    check.add_argument("--seed", type=_seed, default=0)
    check.add_argument("--ops", nargs="+", metavar="OP", help="only these ops")
    check.add_argument("--backends", nargs="+", choices=BACKENDS, metavar="NAME",
                       help=f"only these backends ({', '.join(BACKENDS)})")
    check.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), help="only these dtypes")
    check.add_argument("-v", "--verbose", action="store_true", help="print failing reports")
    check.set_defaults(run=_run_check)

    audit = commands.add_parser("audit", help="check a framework's fused recurrent ops "
                                              "against the oracle")
    audit.add_argument("framework", choices=["tensorflow", "torch"])
    audit.add_argument("--examples", type=_positive_int, default=3, metavar="N")
    audit.add_argument("--seed", type=_seed, default=0)
    audit.add_argument("--select", metavar="TEXT",
                       help="only the checks whose name contains TEXT (case-insensitive)")
    audit.set_defaults(run=_run_audit)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
