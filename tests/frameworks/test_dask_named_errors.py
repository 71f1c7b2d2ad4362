"""Dask calls are checked at call time from their arguments' metadata (docs/spec.md §16.3,
``gradcells._dask``): a wrong shape, dtype, setting or weight chain raises the NumPy call's
named error before any block is computed; only a dask ``seq_len``'s values wait for
``compute()``, which raises the same named ``ValueError``."""

from __future__ import annotations

import inspect
import re
import sys

import numpy as np
import pytest

import gradcells as gc
from gradcells.testing import cases

da = pytest.importorskip("dask.array")

B, CHUNK = 7, 3


class Spy:
    """Counts the blocks dask computes of the arrays it wraps (``lazy``)."""

    def __init__(self):
        self.blocks = 0

    def _seen(self, block):
        self.blocks += 1
        return block

    def lazy(self, a):
        """``a`` as a dask array chunked along its axis of B rows (one chunk without)."""
        chunks = tuple(CHUNK if n == B else -1 for n in a.shape)
        return da.from_array(a, chunks=chunks).map_blocks(
            self._seen, dtype=a.dtype, meta=np.empty((0,) * a.ndim, a.dtype))


def _sequence(rng):
    case = cases.rnn_sequence_case(rng, batch=B, input_size=3)
    return {k: case[k] for k in ("x", "h0", "w", "b")}


def _numpy_message(function, **arguments):
    with pytest.raises((TypeError, ValueError)) as error:
        function(**arguments)
    return error.type, str(error.value).split(" (T, B, I from")[0]


@pytest.mark.parametrize("change", [
    {"w": lambda a: a[:, :-1]},
    {"b": lambda a: a.astype(np.float32)},
    {"h0": lambda a: a[:, :-1]},
], ids=["w's shape", "b's dtype", "h0's width"])
def test_a_forwards_bad_array_is_named_at_call_time_before_any_block_runs(change, rng):
    spy, args = Spy(), _sequence(rng)
    bad = {k: change[k](a) if k in change else a for k, a in args.items()}
    kind, message = _numpy_message(gc.rnn_sequence, **bad)
    with pytest.raises(kind, match="^" + re.escape(message)) as error:
        gc.rnn_sequence(**{k: spy.lazy(a) for k, a in bad.items()})
    assert spy.blocks == 0
    if sys.version_info >= (3, 11):                     # exception notes
        assert "read 0 rows on the batch axis" in error.value.__notes__[0]


def test_lengths_beyond_t_are_named_at_call_time_or_for_dask_lengths_at_compute(rng):
    spy, args = Spy(), _sequence(rng)
    lazy = {k: spy.lazy(a) for k, a in args.items()}
    lengths = np.full(B, 2)
    lengths[4] = 9
    named = r"^seq_len must hold lengths in \[0, T\] = \[0, 4\], got 9"
    for given in (lengths, lengths.tolist()):
        with pytest.raises(ValueError, match=named):
            gc.rnn_sequence(**lazy, seq_len=given)
    assert spy.blocks == 0
    seq = gc.rnn_sequence(**lazy, seq_len=da.from_array(lengths, chunks=CHUNK))
    with pytest.raises(ValueError, match=named + "$"):
        seq.h_final.compute()


def test_a_gradient_is_checked_against_its_forwards_record_at_call_time(rng):
    spy, args = Spy(), _sequence(rng)
    lazy = {k: spy.lazy(a) for k, a in args.items()}
    seq = gc.rnn_sequence(**lazy, reverse=True)
    with pytest.raises(ValueError, match=r"^reverse=False contradicts the forward's "
                                         r"reverse=True recorded in seq.settings"):
        gc.rnn_sequence_grad(**lazy, seq=seq, reverse=False)
    with pytest.raises(ValueError, match=r"^d_h must have shape \[T, B, H\] = \(4, 0, 5\), "
                                         r"got \(4, 0, 4\)"):
        gc.rnn_sequence_grad(**lazy, seq=seq, d_h=spy.lazy(np.ones((4, B, 4))))
    assert spy.blocks == 0


def test_a_broken_stack_weight_chain_is_named_at_call_time(rng):
    spy = Spy()
    case = cases.stack_case(rng, "gru", batch=B, steps=4, hidden=5)
    weights = case["weights"]
    broken = [*weights[:2], weights[2]._replace(w_ru=weights[2].w_ru[:-1]), weights[3]]
    taken = inspect.signature(gc.gru_stack).parameters
    lazy = {k: spy.lazy(a) if isinstance(a, np.ndarray) else a
            for k, a in case.items() if k in taken and k != "dropout_masks"}
    with pytest.raises(ValueError, match=r"^weights\[2\].w_ru has 14 rows, but layer 1's "
                                         r"input is 10 wide"):
        gc.gru_stack(**{**lazy, "weights": broken})
    assert spy.blocks == 0
