"""Build the teaching notebooks from their sources and execute them, storing the outputs.

Each notebook is written as a plain Python file in ``notebooks/src/`` in the "percent"
format: a line ``# %%`` starts a code cell, ``# %% [markdown]`` a text cell whose lines are
comments (the leading ``# `` is removed). The sources are what reviewers read and lint; the
``.ipynb`` files beside this script are built from them, executed top to bottom, and stored
with their outputs so that they read well on a repository page.

    python notebooks/_build.py              # build and execute every notebook
    python notebooks/_build.py 03 05        # only those whose name starts with 03 or 05
    python notebooks/_build.py --check      # exit 1 if a stored notebook's cells differ
                                            # from its source (nothing is executed)

``tests/test_notebooks.py`` executes the stored notebooks and checks them against the
sources, so an edit to a source without a rebuild fails the tests.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat

NOTEBOOK_DIR = Path(__file__).resolve().parent
SOURCE_DIR = NOTEBOOK_DIR / "src"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 120
# Inline figures are rendered by Agg into PNG; no display or GUI toolkit is needed.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def source_paths():
    """Every notebook source, in order."""
    return sorted(SOURCE_DIR.glob("[0-9][0-9]_*.py"))


def notebook_path(source: Path) -> Path:
    return NOTEBOOK_DIR / (source.stem + ".ipynb")


def _markdown_line(line: str) -> str:
    if line.startswith("# "):
        return line[2:]
    if line.rstrip() == "#":
        return ""
    raise ValueError(f"a markdown line must start with '# ': {line!r}")


def parse_cells(text: str):
    """``[(kind, source)]`` for the percent-format ``text``; kind is "code" or "markdown"."""
    cells, kind, lines = [], None, []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(_markdown_line(line) for line in body.splitlines())
        if body.strip():
            cells.append((kind, body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind = "markdown" if "[markdown]" in line else "code"
            lines = []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def build(source: Path) -> nbformat.NotebookNode:
    """The unexecuted notebook for one source file."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, body in parse_cells(source.read_text(encoding="utf-8")):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make(body))
    # Stable cell ids keep the stored files' diffs to what changed.
    for k, cell in enumerate(nb.cells):
        cell["id"] = f"{source.stem[:2]}-{k:03d}"
    return nb


def cell_sources(nb):
    """``[(cell_type, source)]`` of a notebook, for comparing stored against built."""
    return [(c.cell_type, c.source) for c in nb.cells]


def execute(nb, *, cwd=NOTEBOOK_DIR, timeout=CELL_TIMEOUT_S):
    """Run ``nb`` top to bottom in a fresh ``python3`` kernel; raises on the first error."""
    import os

    from nbclient import NotebookClient

    os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME,
                            resources={"metadata": {"path": str(cwd)}}, record_timing=False)
    client.execute()
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="build only notebooks starting with these")
    parser.add_argument("--check", action="store_true",
                        help="compare stored notebooks with their sources; execute nothing")
    args = parser.parse_args(argv)
    sources = [s for s in source_paths()
               if not args.prefixes or any(s.stem.startswith(p) for p in args.prefixes)]
    stale = []
    for source in sources:
        built = build(source)
        target = notebook_path(source)
        if args.check:
            stored = nbformat.read(target, as_version=4) if target.exists() else None
            if stored is None or cell_sources(stored) != cell_sources(built):
                stale.append(target.name)
            continue
        start = time.perf_counter()
        execute(built)
        nbformat.validate(built)
        nbformat.write(built, target)
        print(f"{target.name}: {len(built.cells)} cells, "
              f"executed in {time.perf_counter() - start:.1f} s", flush=True)
    if stale:
        print("stale (rebuild with notebooks/_build.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
