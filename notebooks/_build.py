"""Build the teaching notebooks from their sources and execute them, storing the outputs.

Each notebook is written as a plain Python file in ``notebooks/src/`` in jupytext's
"percent" format (``# %%`` starts a code cell, ``# %% [markdown]`` a text cell written as
comments) and paired with the ``.ipynb`` beside this script through jupytext: the source's
header and the stored notebook's metadata both name the pair
(``formats: ipynb,src//py:percent``), so ``jupytext --sync`` from either half and Jupyter's
jupytext extension know both. The sources are what
reviewers read and lint; the ``.ipynb`` files are built from them by jupytext, executed top
to bottom by nbclient, and stored with their outputs so that they read well on a repository
page.

    python notebooks/_build.py              # build and execute every notebook
    python notebooks/_build.py 03 05        # only those whose name starts with 03 or 05
    python notebooks/_build.py --check      # exit 1 if a stored notebook's cells differ
                                            # from its source (nothing is executed)

``tests/test_notebooks.py`` executes the stored notebooks and checks them against the
sources, so an edit to a source without a rebuild fails the tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat

NOTEBOOK_DIR = Path(__file__).resolve().parent
REPO_ROOT = NOTEBOOK_DIR.parent
SOURCE_DIR = NOTEBOOK_DIR / "src"
SOURCE_FORMAT = "py:percent"
PAIRING = "ipynb,src//py:percent"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 120
# Inline figures are rendered by Agg into PNG; no display or GUI toolkit is needed.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def source_paths():
    """Every notebook source, in order."""
    return sorted(SOURCE_DIR.glob("[0-9][0-9]_*.py"))


def notebook_path(source: Path) -> Path:
    return NOTEBOOK_DIR / (source.stem + ".ipynb")


def read_source(source: Path) -> nbformat.NotebookNode:
    """The notebook jupytext reads from a percent-format source (nothing executed)."""
    return jupytext.read(source, fmt=SOURCE_FORMAT)


def read_stored(path: Path) -> nbformat.NotebookNode:
    """A stored ``.ipynb``, read by jupytext like its source."""
    return jupytext.read(path, fmt="ipynb")


def build(source: Path) -> nbformat.NotebookNode:
    """The unexecuted notebook for one source file, with its pairing and kernel named."""
    nb = read_source(source)
    nb.metadata = {
        "kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "jupytext": {"formats": PAIRING},
    }
    # Stable cell ids keep the stored files' diffs to what changed.
    for k, cell in enumerate(nb.cells):
        cell["id"] = f"{source.stem[:2]}-{k:03d}"
        cell.metadata = {}
    return nb


def cell_sources(nb):
    """``[(cell_type, source)]`` of a notebook, for comparing stored against built."""
    return [(c.cell_type, c.source) for c in nb.cells]


def kernel_environment():
    """The kernel's environment: this process's, with the inline backend by default and this
    checkout's ``gradcells`` first on the path (whatever copy is installed elsewhere)."""
    env = dict(os.environ)
    env.setdefault("MPLBACKEND", INLINE_BACKEND)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                      env.get("PYTHONPATH")]))
    return env


def execute(nb, *, cwd=NOTEBOOK_DIR, timeout=CELL_TIMEOUT_S):
    """Run ``nb`` top to bottom in a fresh ``python3`` kernel; raises on the first error."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME,
                            resources={"metadata": {"path": str(cwd)}}, record_timing=False)
    client.execute(env=kernel_environment())
    return nb


def stale_notebooks(sources):
    """Names of the stored notebooks whose cells differ from their sources (or are missing)."""
    stale = []
    for source in sources:
        target = notebook_path(source)
        if not target.exists() or cell_sources(read_stored(target)) != cell_sources(
                read_source(source)):
            stale.append(target.name)
    return stale


def build_and_store(source: Path) -> None:
    """Build one notebook, execute it and write it beside this script."""
    start = time.perf_counter()
    built = execute(build(source))
    nbformat.validate(built)
    target = notebook_path(source)
    nbformat.write(built, target)
    print(f"{target.name}: {len(built.cells)} cells, "
          f"executed in {time.perf_counter() - start:.1f} s", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="build only notebooks starting with these")
    parser.add_argument("--check", action="store_true",
                        help="compare stored notebooks with their sources; execute nothing")
    args = parser.parse_args(argv)
    sources = [s for s in source_paths()
               if not args.prefixes or any(s.stem.startswith(p) for p in args.prefixes)]
    if args.check:
        stale = stale_notebooks(sources)
        if stale:
            print("stale (rebuild with notebooks/_build.py): " + ", ".join(stale))
            return 1
        return 0
    for source in sources:
        build_and_store(source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
