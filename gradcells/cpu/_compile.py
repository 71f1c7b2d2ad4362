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
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import overload

KERNEL_OPTIONS = {"cache": True, "error_model": "numpy", "nogil": True}
kernel = numba.njit(**KERNEL_OPTIONS)


def kernel_array(a):
    """``a`` itself when C-contiguous, aligned and writeable; else a copy that is."""
    return a if a.flags.carray else np.array(a, order="C")


def row_of(addend, row):
    """Row ``row`` of a ``[B, N]`` addend, or the ``[N]`` addend itself (broadcast)."""
    return addend if addend.ndim == 1 else addend[row]


@overload(row_of)
def _row_of_impl(addend, row):
    if isinstance(addend, types.Array) and addend.ndim == 1:
        return lambda addend, row: addend
    if isinstance(addend, types.Array) and addend.ndim == 2:
        return lambda addend, row: addend[row]
    return None
