"""How every CPU kernel is compiled, and the helpers shared by the kernels and their callers.

``kernel`` is ``numba.njit(**KERNEL_OPTIONS)``:

- ``cache=True``: compiled machine code is kept beside the sources (``__pycache__``), so a
  new process loads it instead of compiling; importing gradcells compiles nothing (each
  kernel compiles on its first call, once per dtype). Numba checks only the kernel's own
  source file for changes: after editing ``_activations.py``, delete ``__pycache__``.
- ``error_model="numpy"``: division follows IEEE (no ZeroDivisionError checks), which is what
  lets the loops vectorize;
- ``nogil=True``: the kernels release the GIL, so Python threads run them concurrently;
- no ``fastmath``: NaN and infinities propagate exactly as IEEE says;
- no ``parallel``: each kernel runs on the calling thread (see ``__init__`` for why).

Kernels take C-contiguous, aligned, writeable arrays (``kernel_array`` makes one when the
caller's is not, so that Numba compiles one specialization per dtype, not one per layout)
and loop over one contiguous row at a time through row views: that is what LLVM
vectorizes, where 2-D indexing ``a[row, n + j]`` compiles to scalar code several times
slower.

Importing this module also imports ``numba.np.arraymath`` with its SciPy probe deferred
(``_DeferredBlasCheck``): Numba's first cache load would otherwise import ``scipy.linalg``,
0.25–0.5 s here, where a first call now takes about 0.75 s (``python benchmarks/startup.py``).
"""

from __future__ import annotations

import sys

import numba
import numpy as np
from numba import types
from numba.core.compiler_lock import global_compiler_lock
from numba.extending import overload


class _DeferredBlasCheck:
    """Numba's "is SciPy's BLAS importable" flag, answered when it is first asked.

    ``numba.np.arraymath`` sets ``_HAVE_BLAS`` at import by importing
    ``scipy.linalg.cython_blas``; the flag is read only when ``np.correlate`` or
    ``np.convolve`` is compiled. Importing ``scipy.linalg`` costs 0.25–0.5 s here, for a flag
    gradcells never reads. This object gives the same
    answer, from the same check, when (if ever) it is read.
    """

    def __init__(self, ensure_blas):
        self._ensure_blas = ensure_blas
        self._answer = None

    def __bool__(self):
        if self._answer is None:
            try:
                self._ensure_blas()
                self._answer = True
            except ImportError:
                self._answer = False
        return self._answer


def _import_arraymath_with_deferred_blas_check():
    """Import ``numba.np.arraymath`` (which Numba's first compile or cache load imports)
    with its SciPy probe deferred (``_DeferredBlasCheck``). A no-op when it is already
    imported or SciPy's BLAS already is (then the probe is free), or when this Numba
    version lays the module out differently. Holds Numba's compiler lock, so no thread
    compiles while ``ensure_blas`` is swapped."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg.cython_blas" in sys.modules:
        return
    from numba.np import linalg

    ensure_blas = getattr(linalg, "ensure_blas", None)
    if ensure_blas is None:
        return

    def report_missing():
        raise ImportError("deferred by gradcells")

    with global_compiler_lock:
        linalg.ensure_blas = report_missing
        try:
            from numba.np import arraymath
        finally:
            linalg.ensure_blas = ensure_blas
        if getattr(arraymath, "ensure_blas", None) is report_missing:
            arraymath.ensure_blas = ensure_blas
        if getattr(arraymath, "_HAVE_BLAS", None) is False:
            arraymath._HAVE_BLAS = _DeferredBlasCheck(ensure_blas)


_import_arraymath_with_deferred_blas_check()

KERNEL_OPTIONS = {"cache": True, "error_model": "numpy", "nogil": True}
kernel = numba.njit(**KERNEL_OPTIONS)
# A kernel's scalar helpers: compiled with the kernels' error model, inlined by LLVM into the
# loops that call them (cached with their callers).
helper = numba.njit(error_model="numpy")


def kernel_array(a):
    """``a`` itself when C-contiguous, aligned and writeable; else a copy that is."""
    return a if a.flags.carray else np.array(a, order="C")


def row_of(addend, row):
    """Row ``row`` of a ``[B, N]`` addend; its one row for a ``[1, N]`` addend or the
    ``[N]`` addend itself (broadcast). A cell passes its bias as ``one_row(b)``, where a
    sequence passes each step's ``[B, N]`` input projection, so that both compile the same
    kernel signature."""
    if addend.ndim == 1:
        return addend
    return addend[0] if addend.shape[0] == 1 else addend[row]


@overload(row_of)
def _row_of_impl(addend, row):
    if isinstance(addend, types.Array) and addend.ndim == 1:
        return lambda addend, row: addend
    if isinstance(addend, types.Array) and addend.ndim == 2:
        return lambda addend, row: addend[0] if addend.shape[0] == 1 else addend[row]
    return None


def one_row(b):
    """A bias ``[N]`` as the ``[1, N]`` addend ``row_of`` broadcasts (a view, C-ordered)."""
    return kernel_array(b)[None]
