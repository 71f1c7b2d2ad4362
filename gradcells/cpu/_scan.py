"""The diagonal linear recurrence on the CPU (docs/spec.md §18.1): ``s_t = a_t∘s_{t-1} +
c_t`` over ``[T, N]`` columns, sequential or as a chunked two-level scan whose per-chunk
passes run on threads (``linear_scan``). The minGRU, the minLSTM and the public
``linear_scan`` run their states, tangents and adjoints through one entry point,
``sequence_scan`` (a sequence op's ``method`` and direction read from its settings), with
``identity_past_lengths`` and ``upstream_steps`` for the steps past each row's length; its
math is ``gradcells._core.scan``'s. Real or complex (one compiled specialization per pair of
dtypes: a real ``a`` with a complex ``c`` runs without widening ``a``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os

import numpy as np

from .._core.scan import scan_method
from ._compile import helper, kernel, kernel_array

CHUNK = 64
"""Steps per chunk of every sequence op's parallel scan (``sequence_scan``)."""

PARALLEL_FROM_CORES = 3
""""auto" runs the chunked scan only where the process may use at least this many cores
(and the sequence has ``PARALLEL_FROM_STEPS`` steps): on two cores the sequential scan was
the faster at every size measured (docs/performance.md, "the linear scan")."""


def _rows(a):
    """``[T, B, H]`` as ``[T, B·H]`` (a view)."""
    return a.reshape(a.shape[0], a.shape[1] * a.shape[2])


@helper
def _time(position, n_steps, backward):
    return n_steps - 1 - position if backward else position


@helper
def _run(a, c, s, backward, post, first, last, out, write):
    """Positions ``first..last-1`` of the run order from the state ``s [N]`` (updated in
    place); writes each step's output into ``out`` when ``write``. ``post`` False:
    ``s = a∘s + c``, the output ``s``; True (the adjoint): the output ``s + c``, then
    ``s = a∘(s + c)``."""
    n_steps, n = a.shape
    for position in range(first, last):
        t = _time(position, n_steps, backward)
        a_t, c_t, o_t = a[t], c[t], out[t]
        if post:
            for j in range(n):
                v = s[j] + c_t[j]
                if write:
                    o_t[j] = v
                s[j] = a_t[j] * v
        else:
            for j in range(n):
                s[j] = a_t[j] * s[j] + c_t[j]
                if write:
                    o_t[j] = s[j]


@kernel
def linear_scan_kernel(a, c, s0, backward, post, chunk, out, s_final):
    """The linear recurrence over ``a, c [T, N]`` from ``s0 [N]`` in the run order
    (``backward``: from time T-1 down to 0); writes every step's output into ``out [T, N]``
    and the state after the last step into ``s_final [N]``. ``post`` as ``_run``.

    ``chunk`` 0 (or at least T): sequential. Otherwise the chunked two-level scan, on the
    calling thread: (1) ``scan_maps_kernel``: each chunk of ``chunk`` consecutive steps
    reduced to its affine map ``s -> A∘s + C``, (2) ``scan_carries_kernel``: a sequential
    pass over the chunks' maps gives each chunk's incoming state, (3)
    ``scan_chunks_kernel``: each chunk scanned again from its incoming state, writing the
    outputs. Steps (1) and (3) are independent per chunk (``cpu.py`` runs them on threads
    over ranges of chunks); within a chunk the outputs are the sequential scan's from that
    chunk's incoming state, which differs from the sequential method's only by the rounding
    of the composed maps."""
    n_steps, n = a.shape
    if chunk <= 0 or chunk >= n_steps:
        sequential_scan_kernel(a, c, s0, backward, post, out, s_final)
        return
    n_chunks = (n_steps + chunk - 1) // chunk
    agg_a, agg_c = np.empty((n_chunks, n), a.dtype), np.empty((n_chunks, n), out.dtype)
    carries = np.empty((n_chunks, n), out.dtype)
    first = np.int64(0)    # not a literal 0: the signature of the threaded scan's calls
    scan_maps_kernel(a, c, backward, post, chunk, first, n_chunks, agg_a, agg_c)
    scan_carries_kernel(agg_a, agg_c, s0, carries, s_final)
    scan_chunks_kernel(a, c, backward, post, chunk, first, n_chunks, carries, out, s_final)


@kernel
def sequential_scan_kernel(a, c, s0, backward, post, out, s_final):
    """``linear_scan_kernel`` with ``chunk`` 0: the recurrence step by step (a kernel of its
    own, so that a sequential scan compiles none of the chunked scan's kernels)."""
    s_final[:] = s0
    _run(a, c, s_final, backward, post, 0, a.shape[0], out, True)


@kernel
def scan_maps_kernel(a, c, backward, post, chunk, first, last, agg_a, agg_c):
    """Step (1) of ``linear_scan_kernel`` for the chunks ``first..last-1``: each chunk's map
    ``s -> agg_a[k]∘s + agg_c[k]`` (``agg_c``: the chunk scanned from 0; ``agg_a``: its
    multipliers' product)."""
    n_steps, n = a.shape
    for k in range(first, last):
        lo, hi = k * chunk, min((k + 1) * chunk, n_steps)
        agg_c[k] = 0
        _run(a, c, agg_c[k], backward, post, lo, hi, c, False)   # c: never written
        product = agg_a[k]
        product[:] = 1
        for position in range(lo, hi):
            a_t = a[_time(position, n_steps, backward)]
            for j in range(n):
                product[j] *= a_t[j]


@kernel
def scan_carries_kernel(agg_a, agg_c, s0, carries, s_final):
    """Step (2) of ``linear_scan_kernel``: each chunk's incoming state ``carries[k]``, from
    ``s0`` through the maps of the chunks before it; ``s_final``: through all of them."""
    n_chunks, n = agg_a.shape
    s_final[:] = s0
    for k in range(n_chunks):
        carries[k] = s_final
        for j in range(n):
            s_final[j] = agg_a[k, j] * s_final[j] + agg_c[k, j]


@kernel
def scan_chunks_kernel(a, c, backward, post, chunk, first, last, carries, out, s_final):
    """Step (3) of ``linear_scan_kernel`` for the chunks ``first..last-1``: each scanned from
    ``carries[k]`` (updated in place), writing ``out``; the last chunk's own last state
    into ``s_final`` (so that it is the last output, bitwise)."""
    n_steps = a.shape[0]
    n_chunks = carries.shape[0]
    for k in range(first, last):
        _run(a, c, carries[k], backward, post, k * chunk, min((k + 1) * chunk, n_steps),
             out, True)
        if k == n_chunks - 1:
            s_final[:] = carries[k]



def linear_scan(a, c, s0, *, chunk, backward, post):
    """The linear recurrence over ``a, c [T, B, H]`` from ``s0 [B, H]`` (of
    ``c``'s dtype; ``a`` may be real with a complex ``c``): ``(out, final)``, fresh arrays
    of ``c``'s dtype (arrays that are not C-contiguous, aligned and writeable, as a
    read-only one, are copied: the kernels are compiled for writeable arrays);
    ``backward``: time runs from T-1 down to 0; ``post`` as ``_run``. ``chunk`` 0 (or at
    least T): sequential (``sequential_scan_kernel``); otherwise the chunked scan, its
    chunks on ``_workers`` threads."""
    out, final = np.empty(c.shape, c.dtype), np.empty(s0.shape, c.dtype)
    a, c, s0 = kernel_array(a), kernel_array(c), kernel_array(s0)   # one typing per dtype
    arguments = (_rows(a), _rows(c), s0.ravel(), backward, post,
                 chunk, _rows(out), final.ravel())
    workers = _workers(a.shape[0], chunk)
    if chunk <= 0 or chunk >= a.shape[0]:
        sequential_scan_kernel(*arguments[:5], *arguments[6:])
    elif workers < 2:
        linear_scan_kernel(*arguments)
    else:
        _threaded_scan(*arguments, workers)
    return out, final


def _workers(n_steps, chunk):
    """The threads a chunked scan of ``n_steps`` runs on: one per core this process may
    use, at most one per chunk (1: the calling thread alone)."""
    if chunk <= 0 or n_steps <= chunk:
        return 1
    return max(1, min(_cores(), -(-n_steps // chunk)))


def _cores():
    """The cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _threaded_scan(a, c, s0, backward, post, chunk, out, s_final, workers):
    """``linear_scan_kernel``'s chunked scan with its steps (1) and (3) split into
    ``workers`` ranges of chunks, run at once (the kernels release the GIL)."""
    n_chunks = -(-a.shape[0] // chunk)
    agg_a = np.empty((n_chunks, a.shape[1]), a.dtype)
    agg_c, carries = np.empty((2, n_chunks, a.shape[1]), out.dtype)
    bounds = np.linspace(0, n_chunks, workers + 1).astype(int)
    ranges = list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))
    _at_once([functools.partial(scan_maps_kernel, a, c, backward, post, chunk, lo, hi,
                                agg_a, agg_c) for lo, hi in ranges])
    scan_carries_kernel(agg_a, agg_c, s0, carries, s_final)
    _at_once([functools.partial(scan_chunks_kernel, a, c, backward, post, chunk, lo, hi,
                                carries, out, s_final) for lo, hi in ranges])


_pool: list[concurrent.futures.ThreadPoolExecutor] = []


def _at_once(calls):
    """Run ``calls``: the first on the calling thread, the others on a shared pool."""
    if not _pool:
        _pool.append(concurrent.futures.ThreadPoolExecutor(
            thread_name_prefix="gradcells-scan"))
    pending = [_pool[0].submit(call) for call in calls[1:]]
    calls[0]()
    for future in pending:
        future.result()


# --------------------------------------------------------------------------------------
# the entry point of the sequence ops


def sequence_scan(a, c, s0, settings, *, post):
    """The recurrence of a sequence op over ``a, c [T, B, H]`` from ``s0 [B, H]``:
    ``(out, final)`` (``linear_scan``), chunked (``CHUNK`` steps a chunk) when the op's
    ``settings.method`` is "parallel", or "auto" where ``scan_method`` resolves it so and the
    process may use ``PARALLEL_FROM_CORES`` cores. The forward (``post`` False)
    runs backwards in time when ``settings.reverse`` (the backends run ``reverse`` with
    lengths natively), the adjoint (``post`` True) the other way."""
    method = scan_method(settings.method, a.shape[0])
    if settings.method == "auto" and _cores() < PARALLEL_FROM_CORES:
        method = "sequential"
    chunk = CHUNK if method == "parallel" else 0
    return linear_scan(a, c, s0, chunk=chunk, backward=settings.reverse != post, post=post)


def identity_past_lengths(a, lengths):
    """``a`` (a fresh multiplier array, changed in place) with the identity multiplier 1 at
    every step past its row's length (``lengths`` None: as it is)."""
    if lengths is not None:
        a[np.arange(a.shape[0])[:, None] >= lengths[None, :]] = 1
    return a


def upstream_steps(d, shape, dtype, lengths):
    """A per-step upstream gradient (or addend) ``d`` as a fresh C-contiguous array of
    ``dtype`` with zeros past each row's length (zeros for None): none of it is read
    there."""
    if d is None:
        return np.zeros(shape, dtype)
    out = np.array(d, dtype=dtype, order="C")
    if lengths is not None:
        out[np.arange(out.shape[0])[:, None] >= lengths[None, :]] = 0
    return out
