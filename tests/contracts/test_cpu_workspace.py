"""The CPU backend's per-thread scratch buffer (``gradcells/cpu/_workspace.py``): what it
hands out, that it is kept and reused, and that no result of a sequence op ever lives in it
(a later call must not change an earlier call's results)."""

import threading

import numpy as np
import pytest

import gradcells as gc
from gradcells import cpu as cpu_backend
from gradcells.cpu import _workspace
from gradcells.testing import gru_sequence_case, lstm_sequence_case

LSTM_ARGS = ("x", "cs0", "h0", "w", "b")
GRU_ARGS = ("x", "h0", "w_ru", "w_c", "b_ru", "b_c")


def test_scratch_arrays_have_the_asked_shapes_dtype_and_alignment():
    shapes = [(3, 5, 7), (0,), (2, 9), (1,), (4, 0, 2)]
    arrays = _workspace.scratch(np.float32, *shapes)
    assert [a.shape for a in arrays] == shapes
    for a in arrays:
        assert a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % 64 == 0
    for k, a in enumerate(arrays):   # disjoint: filling one leaves the others as they were
        a.fill(k)
    for k, a in enumerate(arrays):
        assert (a == k).all()


def test_scratch_is_kept_grown_and_released():
    _workspace.release_scratch()
    small = _workspace.scratch(np.float64, (10, 10))[0]
    again = _workspace.scratch(np.float64, (5, 5))[0]
    assert again.base is small.base                      # reused, not reallocated
    large = _workspace.scratch(np.float64, (100, 100))[0]
    assert large.base is not small.base                  # grown
    assert _workspace.scratch(np.float32, (10,))[0].base is large.base
    cpu_backend.release_scratch()
    assert _workspace.scratch(np.float32, (10,))[0].base is not large.base


def test_scratch_over_the_limit_is_not_kept(monkeypatch):
    _workspace.release_scratch()
    kept = _workspace.scratch(np.float64, (8,))[0]
    monkeypatch.setattr(_workspace, "KEEP_LIMIT_BYTES", 1024)
    huge = _workspace.scratch(np.float64, (1000,))[0]
    assert huge.base is not kept.base
    assert _workspace.scratch(np.float64, (8,))[0].base is kept.base


def test_each_thread_has_its_own_buffer():
    mine = _workspace.scratch(np.float64, (16,))[0]
    theirs = []
    worker = threading.Thread(
        target=lambda: theirs.append(_workspace.scratch(np.float64, (16,))[0]))
    worker.start()
    worker.join()
    assert not np.shares_memory(mine, theirs[0])


def _lstm(case, d_h):
    args = [case[k] for k in LSTM_ARGS]
    seq = gc.lstm_sequence(*args, seq_len=case["seq_len"], backend="cpu")
    grads = gc.lstm_sequence_grad(*args, seq, d_h=d_h, seq_len=case["seq_len"],
                                  backend="cpu")
    return [*seq, *(g for g in grads if g is not None)]


def _gru(case, d_h):
    args = [case[k] for k in GRU_ARGS]
    attrs = {"reset_after": case["reset_after"], "seq_len": case["seq_len"]}
    seq = gc.gru_sequence(*args, **attrs, backend="cpu")
    return [*seq, *gc.gru_sequence_grad(*args, seq, d_h=d_h, **attrs, backend="cpu")]


@pytest.mark.parametrize("cell", ["lstm", "gru", "gru-reset-after"])
def test_results_never_live_in_the_scratch_buffer(cell):
    """A second call, of the same sizes and then of larger ones, leaves the first call's
    results as they were."""
    rng = np.random.default_rng(11)

    def run(steps, batch, seed):
        sizes = {"steps": steps, "batch": batch, "input_size": 6, "hidden": 9,
                 "dtype": np.float32, "ragged": True}
        local = np.random.default_rng(seed)
        if cell == "lstm":
            case = lstm_sequence_case(local, **sizes)
        else:
            case = gru_sequence_case(local, **sizes, reset_after=cell == "gru-reset-after")
        d_h = rng.standard_normal((steps, batch, 9)).astype(np.float32)
        return (_lstm if cell == "lstm" else _gru)(case, d_h)

    first = run(5, 4, seed=1)
    kept = [a.copy() for a in first]
    run(5, 4, seed=2)
    run(12, 7, seed=3)
    for a, b in zip(first, kept, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not any(np.shares_memory(a, b) for k, a in enumerate(first) for b in first[k + 1:])


def test_eight_threads_running_sequences_at_once_give_the_serial_results():
    """Each thread carves its scratch from its own buffer: sequences of different sizes run
    concurrently (buffers growing as they go) give exactly what they give one at a time."""
    cases = []
    for k in range(8):
        rng = np.random.default_rng(20 + k)
        steps, batch = 3 + k, 2 + k % 3
        d_h = rng.standard_normal((steps, batch, 9)).astype(np.float32)
        sizes = {"steps": steps, "batch": batch, "input_size": 5, "hidden": 9,
                 "dtype": np.float32, "ragged": k % 2 == 1}
        if k % 3 == 0:
            cases.append((_lstm, lstm_sequence_case(rng, **sizes), d_h))
        else:
            cases.append((_gru, gru_sequence_case(rng, **sizes, reset_after=k % 3 == 2), d_h))
    expected = [run(case, d_h) for run, case, d_h in cases]
    start = threading.Barrier(len(cases))
    results, errors = [None] * len(cases), []

    def worker(k):
        try:
            run, case, d_h = cases[k]
            start.wait()
            results[k] = [run(case, d_h) for _ in range(5)]
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for want, got_runs in zip(expected, results, strict=True):
        for got in got_runs:
            for a, b in zip(want, got, strict=True):
                np.testing.assert_array_equal(b, a)
