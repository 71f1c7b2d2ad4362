"""gradcells against itself at another commit, side by side in one process (an A/B).

    python benchmarks/ab.py --against fc6b40a                 # sequences and cells, 1 thread
    python benchmarks/ab.py --against HEAD~3 --what sequences --repeats 21 --threads 2

The package at ``--against`` is taken from git (``git archive``) into a temporary folder
under the name ``gradcells_ab`` (every ``gradcells`` module name in it renamed), so both
versions run in the same process on the same inputs, with the same BLAS and threads: what
a change of the library's code costs or saves, with the machine's noise shared. Each
contestant is the public API, forward plus full gradient, float32, ``backend="cpu"``:

- ``sequences``: ``<cell>_sequence`` + ``<cell>_sequence_grad`` (``d_h`` upstream) at
  ``benchmarks/sequences.py``'s sizes and inputs;
- ``cells``: ``<cell>_cell`` + ``<cell>_cell_grad`` at ``benchmarks/cells.py``'s sizes.

Rounds are interleaved (``_harness.time_interleaved``), each at least 20 ms of calls (so a
call of a few µs is not one timer reading); each figure is the median per call;
``this/ref`` below 1 means this checkout is faster. Both packages compile their kernels on
first use (the reference's into its temporary folder), which the warm-up absorbs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cells as cell_bench  # noqa: E402
import sequences as seq_bench  # noqa: E402
from _harness import limit_threads, ratio, summarize, table, time_interleaved  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ALIAS = "gradcells_ab"
KINDS = ("lstm", "gru", "gru-reset-after", "rnn")


def package_at(ref: str, folder: Path):
    """``gradcells`` as it is at git ``ref``, imported as ``gradcells_ab`` from ``folder``."""
    archive = subprocess.run(["git", "archive", ref, "gradcells"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "gradcells").rename(folder / ALIAS)
    for path in (folder / ALIAS).rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"\bgradcells(?=[.\"'\s]|$)", ALIAS, text), encoding="utf-8")
    sys.path.insert(0, str(folder))
    return importlib.import_module(ALIAS)


def _cell(kind):
    return ("gru", {"reset_after": kind == "gru-reset-after"}) if kind.startswith("gru") \
        else (kind, {})


def _inputs(what, kind, size):
    cell, options = _cell(kind)
    bench = seq_bench if what == "sequences" else cell_bench
    if cell == "rnn" and what == "cells":
        rng = np.random.default_rng(0)
        batch, n_in, hidden = size
        return {"x": rng.standard_normal((batch, n_in), np.float32),
                "h_prev": rng.standard_normal((batch, hidden), np.float32),
                "w": rng.standard_normal((n_in + hidden, hidden), np.float32) * 0.1,
                "b": np.zeros(hidden, np.float32),
                "d_h": rng.standard_normal((batch, hidden), np.float32)}
    make = getattr(bench, f"{cell}_inputs")
    return make(*size, **options)


def contestant(gc, what, kind, size):
    """A zero-argument call of ``gc``'s forward plus full gradient for one case."""
    cell, options = _cell(kind)
    a = _inputs(what, kind, size)
    op = f"{cell}_{'sequence' if what == 'sequences' else 'cell'}"
    forward, gradient = getattr(gc, op), getattr(gc, f"{op}_grad")
    names = [n for n in ("x", "cs0", "h0", "cs_prev", "h_prev", "w", "b", "w_ru", "w_c",
                         "b_ru", "b_c") if n in a]
    args = [a[n] for n in names]

    def run():
        result = forward(*args, **options, backend="cpu")
        return gradient(*args, result, d_h=a["d_h"], **options, backend="cpu")

    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the git commit to compare with")
    parser.add_argument("--what", nargs="+", choices=("sequences", "cells"),
                        default=["sequences", "cells"])
    parser.add_argument("--cells", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    limit_threads(args.threads)
    import gradcells

    with tempfile.TemporaryDirectory() as folder:
        reference = package_at(args.against, Path(folder))
        print(f"# {cell_bench.describe_machine(args.threads)}; this checkout against "
              f"{args.against}, medians of {args.repeats} rounds")
        for what in args.what:
            sizes = seq_bench.SIZES if what == "sequences" else cell_bench.SIZES
            rows = []
            for kind in args.cells:
                for size in sizes:
                    runs = {"this": contestant(gradcells, what, kind, size),
                            "ref": contestant(reference, what, kind, size)}
                    stats = summarize(time_interleaved(runs, args.repeats, min_round_s=0.02))
                    rows.append((kind, str(size), f"{stats['this'].median * 1e3:.3f}",
                                 f"{stats['ref'].median * 1e3:.3f}",
                                 ratio(stats["this"].median, stats["ref"].median)))
            print(f"\n{what} (forward + gradient, float32, ms per call)\n")
            print(table(rows, ("cell", "size", "this ms", "ref ms", "this/ref")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
