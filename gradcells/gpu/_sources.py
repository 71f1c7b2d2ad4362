"""The CUDA sources of the GPU backend, as the compilers see them.

The kernels live in ``.cu`` files: each cell's in its folder (``gradcells/cells/<cell>/
<cell>.cu``), what cells share beside this module (``reduce.cu``, ``scan.cu``, ``common.cuh``, which
every ``.cu`` includes); ``path`` maps a file name to its place. ``compose``
returns a file's text with its local ``#include "..."`` lines replaced by the included text
(found by ``path`` too, so a cell's ``#include "common.cuh"`` reaches this folder's);
``_kernels.module_code`` appends the generated ``extern "C"`` entry points, so that every
consumer compiles one self-contained string (the host emulation's build is keyed by its
``fingerprint``). An edited header or kernel can never leave a stale kernel behind.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
"""The backend machinery's sources: ``reduce.cu`` and ``common.cuh``."""
CELLS_DIR = SOURCE_DIR.parent / "cells"
"""The cells' folders: ``<cell>/<cell>.cu``."""
KERNEL_FILES = (*sorted(p.name for p in CELLS_DIR.glob("*/*.cu")), "reduce.cu", "scan.cu")
"""Every ``.cu`` file: each cell folder's and the machinery's (``scan.cu``: the linear
recurrence the minGRU and the minLSTM share)."""

_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.MULTILINE)


def path(name: str) -> Path:
    """Where the source file ``name`` lives: a cell's ``.cu`` (``<cell>.cu``) in that cell's
    folder, anything else (``reduce.cu``, ``common.cuh``) beside this module."""
    stem, _, suffix = name.partition(".")
    in_cell = CELLS_DIR / stem / name
    return in_cell if suffix == "cu" and in_cell.is_file() else SOURCE_DIR / name


def read(name: str) -> str:
    """The text of one source file (``path``)."""
    return path(name).read_text(encoding="utf-8")


def compose(name: str) -> str:
    """``name``'s text with each local include inlined (once; nested includes too)."""
    seen: set[str] = set()

    def expand(file_name: str) -> str:
        def include(match: re.Match) -> str:
            included = match.group(1)
            if included in seen:
                return f"// {included}: already included above"
            seen.add(included)
            return f"// ---- begin {included}\n{expand(included)}\n// ---- end {included}"

        return _LOCAL_INCLUDE.sub(include, read(file_name))

    seen.add(name)
    return expand(name)


def fingerprint(*texts: str) -> str:
    """A short hash of some texts (build caches are keyed by it)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:20]
