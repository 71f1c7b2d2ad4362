"""The CPU backend's machinery: what every cell's ``cpu.py`` (``gradcells.cells.<cell>``) runs
on, for NumPy arrays, Numba-jitted fused passes around BLAS matmuls. Nothing here is
cell-specific: ``_sequence`` (the sequence plan: lengths, direction, masks, the time walk),
``_tangents`` (the plumbing of forward mode and second order), ``_workspace`` (scratch),
``_compile`` and ``_activations`` (how kernels compile; vectorizable activations),
``_walk_kernels`` and ``_zoneout_kernels`` (the passes every cell shares). The public layer
has validated and normalised every argument. Results agree with the reference to round-off:
float64 within ~1e-15 relative per operation, float32 within a few float32 ulp (the
activations are vectorizable approximations, see ``_activations``).

Each cell step is its matmuls (NumPy's BLAS, on the caller's thread pool) around one fused
elementwise pass per direction (two for the reset-before GRU, whose reset gate feeds the
candidate's matmul; each cell's ``_cpu_kernels``, whose kernels are documented for reuse
per time step; ``_sequence`` holds the sequence plan the cells share). The
kernels run serially on the calling thread, release the GIL, and are SIMD-vectorized: a
``prange`` version's threads and OpenBLAS's wait on each other for the cores (measured in
docs/performance.md, "The CPU backend: accuracy and threads"), so the matmuls alone use
the BLAS's threads, as many as ``_threads`` decides for each sequence call (the BLAS's own
setting, ``threadpoolctl`` or ``OPENBLAS_NUM_THREADS``, is its upper bound).

The sequence operations take their scratch (O(T·B·4H): the input projection, every step's
gate gradients) from a buffer each thread keeps between calls (``_workspace``): fresh arrays
of that size can cost a page fault per 4 KiB page in every call, as they did in a process
running only a sequence op. ``release_scratch()`` frees the calling thread's buffer.

The sequence masks (docs/spec.md §11.3) are NumPy ops around the same kernels plus one fused
zoneout pass per step each way (``_zoneout_kernels``); ``_sequence`` states their plan and
its scratch (a ``[B, H']`` per step, every step's own cell state ``[T, B, H]`` for the LSTM's
gradient, and the plain RNN's recomputed outputs under a fractional zoneout mask).

``reverse=True`` with lengths runs natively (``NATIVE_REVERSE``, read by ``gradcells._order``):
the sequence ops and gradients take ``x``, the masks and the upstream gradients at their time
positions and return every per-step output at its time position; each row runs its own
valid steps from last to first (``_sequence.Walk``), so the public layer gathers nothing.

Importing this module compiles nothing; each kernel compiles on its first call (once per
dtype) and is cached on disk (``cache=True``), so later processes load it.
"""

import functools

from ._threads import blas_threads, set_blas_threads
from ._workspace import release_scratch

# This backend runs ``reverse=True`` itself (``gradcells._order``): with lengths its sequence
# ops and gradients take and return every per-step array at its time position.
NATIVE_REVERSE = True



def around_sequences(function):
    """``function``, a mode of a cell's sequence operation, run under ``blas_threads()``
    (``_threads``: the BLAS threads of each call decided, then restored)."""
    @functools.wraps(function)
    def with_blas_threads(*args, **kwargs):
        with blas_threads():
            return function(*args, **kwargs)

    return with_blas_threads


__all__ = ["release_scratch", "set_blas_threads", "around_sequences", "NATIVE_REVERSE"]
