"""The CUDA sources of the GPU backend, as the compilers see them.

The kernels live in ``.cu`` files beside this module and share ``common.cuh``. ``compose``
returns a file's text with its local ``#include "..."`` lines replaced by the included text,
so that every consumer compiles one self-contained string: NVRTC through CuPy, ``nvcc --ptx``
in the compile test, and the host C++ compiler in the emulation tests (whose build cache is
keyed by that string's ``fingerprint``, so an edited header can never leave a stale build
behind).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
KERNEL_FILES = ("lstm.cu", "gru.cu", "reduce.cu")

_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.MULTILINE)


def read(name: str) -> str:
    """The text of one source file beside this module."""
    return (SOURCE_DIR / name).read_text(encoding="utf-8")


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
