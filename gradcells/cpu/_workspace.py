"""Scratch memory for the sequence passes, kept by each thread between calls.

A sequence call needs O(T·B·4H) of scratch that never leaves it: the input projection of
every step, the gate gradients of every step. Fresh arrays of that size cost a page fault
per 4 KiB page on first write whenever glibc has returned such blocks to the kernel on
``free``, which depends on what the process allocated before (its mmap threshold adapts;
measured in docs/performance.md, "Scratch memory", by ``benchmarks/scratch.py``).

So each thread keeps one buffer, grown to the most scratch it has needed so far (oneDNN's
library-managed scratchpad works the same way), and every sequence call carves its scratch
arrays out of it. Results never come from it: they are fresh arrays. A buffer larger than
``KEEP_LIMIT_BYTES`` is not kept. ``release_scratch()`` frees the calling thread's buffer;
a thread's buffer is freed when the thread ends.
"""

from __future__ import annotations

import math
import threading

import numpy as np

KEEP_LIMIT_BYTES = 256 * 2**20
_ALIGN = 64                   # a cache line: every scratch array starts on one

_local = threading.local()


def scratch(dtype, *shapes):
    """One C-contiguous, 64-byte-aligned array of ``dtype`` per shape in ``shapes``, from
    the calling thread's buffer. Contents are undefined; the arrays are valid until this
    thread calls ``scratch`` again (so take all of a call's scratch at once)."""
    itemsize = np.dtype(dtype).itemsize
    nbytes = [math.prod(shape) * itemsize for shape in shapes]
    starts, total = [], 0
    for n in nbytes:
        starts.append(total)
        total += -(-n // _ALIGN) * _ALIGN
    buffer = _buffer(total)
    return [buffer[start:start + n].view(dtype).reshape(shape)
            for start, n, shape in zip(starts, nbytes, shapes, strict=True)]


def release_scratch():
    """Free the calling thread's scratch buffer (the next sequence call allocates anew)."""
    _local.buffer = None


def _buffer(nbytes):
    """At least ``nbytes`` bytes starting on an ``_ALIGN`` boundary: the thread's kept
    buffer when large enough, else a new one (kept when within ``KEEP_LIMIT_BYTES``)."""
    kept = getattr(_local, "buffer", None)
    if kept is not None and kept.nbytes >= nbytes:
        return kept
    if nbytes <= KEEP_LIMIT_BYTES:
        _local.buffer = kept = None   # freed before its successor exists: no two at once
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    skip = -raw.ctypes.data % _ALIGN
    buffer = raw[skip:skip + nbytes]
    if nbytes <= KEEP_LIMIT_BYTES:
        _local.buffer = buffer
    return buffer
