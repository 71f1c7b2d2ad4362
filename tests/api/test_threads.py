"""The BLAS threads of a gradcells call (docs/spec.md §17; ``gradcells.cpu._threads``):
decided per sequence call, never more than the cores, one while several threads call at
once, the caller's setting restored afterwards, and the caller's override obeyed."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import gradcells as gc
from gradcells import cpu
from gradcells.cpu import _threads

pytestmark = pytest.mark.skipif(not _threads._blas(), reason="no BLAS found by threadpoolctl")


def _blas_threads():
    return [lib.get_num_threads() for lib in _threads._blas()]


@pytest.fixture
def policy(monkeypatch):
    """The policy with other processes' load set by the test (``policy(busy_cores)``)."""
    def set_load(busy):
        monkeypatch.setattr(_threads, "_other_busy_cores", lambda: float(busy))
    yield set_load
    cpu.set_blas_threads(None)


def _sequence_args(rng):
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    h = np.zeros((2, 5), np.float32)
    w = rng.standard_normal((9, 20)).astype(np.float32)
    return x, h, h, w, np.zeros(20, np.float32)


def test_a_call_uses_at_most_the_idle_cores_and_restores_the_setting(policy, monkeypatch):
    monkeypatch.setattr(_threads, "_MACHINE_CORES", 4)
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    with threadpool_limits(3, user_api="blas"):
        for busy, expected in ((0, 3), (2, 2), (3.6, 1), (9, 1)):
            policy(busy)
            with _threads.blas_threads() as n:
                assert n == expected
                assert _blas_threads() == [expected] * len(_threads._blas())
            assert _blas_threads() == [3] * len(_threads._blas())


def test_the_process_cores_bound_the_threads(policy, monkeypatch):
    monkeypatch.setattr(_threads, "_MACHINE_CORES", 8)
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: {5})
    policy(0)
    with threadpool_limits(4, user_api="blas"), _threads.blas_threads() as n:
        assert n == 1


def test_the_callers_fixed_count_wins(policy):
    policy(64)
    cpu.set_blas_threads(2)
    with threadpool_limits(1, user_api="blas"):
        with _threads.blas_threads() as n:
            assert n == 2 and _blas_threads()[0] == 2
        assert _blas_threads()[0] == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_fixed_count_is_named(bad):
    with pytest.raises(ValueError, match="^n must be a positive int or None"):
        cpu.set_blas_threads(bad)


def test_the_environment_variable_is_read_and_named_when_bad(monkeypatch):
    monkeypatch.setenv("GRADCELLS_BLAS_THREADS", "3")
    try:
        _threads._from_environment()
        assert _threads._fixed == 3
        monkeypatch.setenv("GRADCELLS_BLAS_THREADS", "many")
        with pytest.raises(ValueError, match="GRADCELLS_BLAS_THREADS must be a positive"):
            _threads._from_environment()
    finally:
        cpu.set_blas_threads(None)


def test_nested_calls_restore_only_at_the_outermost(policy):
    policy(0)
    with threadpool_limits(2, user_api="blas"):
        with _threads.blas_threads():
            with _threads.blas_threads():
                pass
            assert _threads._inside          # the outer call is still inside
        assert not _threads._inside and _blas_threads()[0] == 2


def test_calls_from_a_pool_take_one_thread_each_and_the_last_restores(policy):
    policy(0)
    both_inside = threading.Barrier(2, timeout=10)
    seen = []

    def call():
        with _threads.blas_threads() as n:
            both_inside.wait()
            seen.append((n, _blas_threads()[0]))
            both_inside.wait()

    with threadpool_limits(2, user_api="blas"):
        workers = [threading.Thread(target=call) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert seen == [(1, 1), (1, 1)]
        assert _blas_threads()[0] == 2
        with _threads.blas_threads() as n:          # the main thread: the policy's count
            assert n == 2


def test_the_public_sequences_run_under_the_policy(policy, rng, monkeypatch):
    policy(0)
    cpu.set_blas_threads(1)
    seen = []
    original = _threads.blas_threads

    @contextlib.contextmanager
    def recording():
        with original() as n:
            seen.append(_blas_threads()[0])
            yield n

    monkeypatch.setattr(cpu, "blas_threads", recording)
    args = _sequence_args(rng)
    with threadpool_limits(2, user_api="blas"):
        seq = gc.lstm_sequence(*args, backend="cpu")
        gc.lstm_sequence_grad(*args, seq, d_h=np.ones_like(seq.h), backend="cpu")
        gc.lstm_cell(args[0][0], *args[1:], backend="cpu")       # a cell step: not wrapped
        assert seen == [1, 1]
        assert _blas_threads()[0] == 2
