"""How many BLAS threads a gradcells call uses: decided per call, restored afterwards
(docs/spec.md §17; the figures are in docs/performance.md, "Under load").

A sequence's time loop makes two small matrix products per step. OpenBLAS splits each over
its threads, and its threads busy-wait for their share: when other processes hold the cores,
every product waits for a descheduled thread, and a sequence that takes 20 ms on a quiet
machine took 0.2-1.5 s. So each sequence call (and each of a stack's layers) runs under
``blas_threads()``, which gives the BLAS

    min(its own setting, the cores this process may run on, the cores other processes leave
        idle),

at least one; a call from a thread other than the main one (dask's threaded scheduler, a
thread pool) takes one, so that a pool's calls never run cores × threads. The count is set
only when no other gradcells call of the process is running (changing OpenBLAS's threads
while another thread is inside it is not safe); a call that starts while others run shares
their setting, and the last to end restores the caller's. "Other processes" is
measured, not guessed: the machine's busy CPU time (``/proc/stat``) less this process's own
(which includes its BLAS threads' spinning), over the last tenth of a second or more; before
any such window exists, the instantaneous count of runnable tasks (``/proc/loadavg``) less
the caller's own. Where neither file exists (not Linux) only the first two bounds apply.

The caller decides over the policy: ``set_blas_threads(n)`` (or ``GRADCELLS_BLAS_THREADS``)
fixes the count for every call, ``set_blas_threads(None)`` restores the policy; a BLAS limit
set with ``threadpoolctl`` or ``OPENBLAS_NUM_THREADS`` is the policy's upper bound. The BLAS
libraries are found once, through ``threadpoolctl``, on the first call that needs them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

_WINDOW_S = 0.1
"""The shortest interval over which other processes' CPU time is measured."""

_MACHINE_CORES = os.cpu_count() or 1
"""The machine's cores, read once (``os.cpu_count()`` costs 13 µs a call on Linux)."""

_fixed: int | None = None
_lock = threading.Lock()
_inside: dict[int, int] = {}      # thread id -> depth of its gradcells calls
_saved: list[int] = []            # each BLAS library's threads before the outermost call
_controllers: list | None = None
_sample: tuple[float, float, float] | None = None   # (wall, machine busy s, process cpu s)
_others = 0.0                     # other processes' busy cores, last measured


def set_blas_threads(n: int | None) -> None:
    """Fix the BLAS threads of every gradcells call to ``n`` (a positive int), or, with
    None, let each call decide (the default; see the module's docstring)."""
    global _fixed
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive int or None, got {n!r}")
    _fixed = n


def _from_environment() -> None:
    value = os.environ.get("GRADCELLS_BLAS_THREADS", "").strip()
    if value:
        try:
            set_blas_threads(int(value))
        except ValueError as error:
            raise ValueError(f"GRADCELLS_BLAS_THREADS must be a positive integer, got "
                             f"{value!r}") from error


@contextlib.contextmanager
def blas_threads() -> Iterator[int]:
    """Run the body with the BLAS threads this call should use (the module's policy), set
    when no other gradcells call of the process is running and restored when the last one
    ends: a call that starts while another runs shares its setting. Yields the count."""
    me = threading.get_ident()
    with _lock:
        first = not _inside
        _inside[me] = _inside.get(me, 0) + 1
        libraries = _blas()
        if first:
            _saved[:] = [lib.get_num_threads() for lib in libraries]
            # A pool's worker thread (dask's threaded scheduler, a ThreadPoolExecutor) runs
            # beside others like it: one thread each, never cores × threads.
            n = (1 if threading.current_thread() is not threading.main_thread()
                 else _wanted(min(_saved, default=1)))
            _set(libraries, [n] * len(libraries))
        n = min((lib.get_num_threads() for lib in libraries), default=1)
    try:
        yield n
    finally:
        with _lock:
            _inside[me] -= 1
            if not _inside[me]:
                del _inside[me]
            if not _inside:
                _set(libraries, _saved)


def _set(libraries, counts) -> None:
    """Set each library's threads. ``threadpoolctl`` obeys only the first thread that ever
    set them (OpenBLAS must not be changed from two threads at once); here ``_lock``
    serialises every change, made only while no gradcells call runs, so any thread may."""
    for lib, n in zip(libraries, counts, strict=True):
        if lib.get_num_threads() != n:
            getattr(lib, "_real_set_num_threads", lib.set_num_threads)(n)


def _blas() -> list:
    """The BLAS libraries loaded in the process (``threadpoolctl``), found once."""
    global _controllers
    if _controllers is None:
        from threadpoolctl import ThreadpoolController
        _controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    return _controllers


def _wanted(configured: int) -> int:
    """The policy: the fixed count, else the BLAS's own setting bounded by this process's
    cores and the cores other processes leave idle (at least one)."""
    if _fixed is not None:
        return _fixed
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else _MACHINE_CORES)
    idle = _MACHINE_CORES - _other_busy_cores()
    return max(1, min(configured, cores, int(idle + 0.5)))


def _other_busy_cores() -> float:
    """How many cores other processes keep busy: measured over the last window of at least
    ``_WINDOW_S`` (machine busy time less this process's), else counted now. Within a
    window a call costs a clock reading, not a read of ``/proc/stat`` (30 µs: more than a
    small cell's step)."""
    global _sample, _others
    now = time.monotonic()
    if _sample is not None and now - _sample[0] < _WINDOW_S:
        return _others
    busy = _machine_busy_s()
    if busy is None:
        return 0.0
    mine = time.process_time()
    if _sample is None:
        _sample, _others = (now, busy, mine), _runnable_now()
    else:
        wall, before, mine_before = _sample
        _others = max(0.0, ((busy - before) - (mine - mine_before)) / (now - wall))
        _sample = (now, busy, mine)
    return _others


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_s() -> float | None:
    """Seconds every core of the machine has spent busy since boot (``/proc/stat``'s first
    line: user, nice, system, irq, softirq, steal), or None where there is no such file."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICKS


def _runnable_now() -> float:
    """Tasks runnable on the machine right now, the caller's own thread not counted
    (``/proc/loadavg``'s fourth field)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as loadavg:
            running = loadavg.read().split()[3].split("/")[0]
    except (OSError, IndexError):
        return 0.0
    return max(0.0, int(running) - 1.0)


_from_environment()
