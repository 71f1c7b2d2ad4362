"""Time order and layout of the sequence operations (docs/spec.md §11.1, §11.2): ``reverse``
and ``batch_first`` on ``lstm_sequence``, ``gru_sequence``, ``rnn_sequence`` and their
gradients, on every NumPy backend.

- ``reverse=True`` equals the cell loop run with time descending, each row starting from the
  initial state at its own last valid step (``gradcells.testing.unrolled``), forward and
  every gradient, over ragged lengths that include 0 and T;
- without lengths it equals the forward run on the flipped sequence, flipped back;
- ``batch_first=True`` equals the time-major call on the transposed arrays, ``[B, T, ·]`` in
  and out, shape errors named in that layout;
- the reference's float64 gradients equal central differences with both, every cell option
  drawn (the CPU's: ``test_reverse_cpu.py``, ``test_masks_cpu.py``);
- the result records both; a contradiction is named; bad flags are a ``TypeError``; inputs
  are never modified; empty sequences and batches are valid.

Conformance with PyTorch's bidirectional layers on packed sequences is
``test_directions_torch.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.testing import (
    gru_sequence_case,
    lstm_sequence_case,
    rnn_sequence_case,
    unrolled,
    vjp_check,
)

BACKENDS = ["reference", "cpu"]
OPS_ = ["lstm_sequence", "gru_sequence", "rnn_sequence"]
_CASES = {"lstm_sequence": lstm_sequence_case, "gru_sequence": gru_sequence_case,
          "rnn_sequence": rnn_sequence_case}
_LOOPS = {"lstm_sequence": (unrolled.lstm_forward, unrolled.lstm_backprop),
          "gru_sequence": (unrolled.gru_forward, unrolled.gru_backprop),
          "rnn_sequence": (unrolled.rnn_forward, unrolled.rnn_backprop)}


def _case(op, rng, **kw):
    if op == "lstm_sequence":
        kw.setdefault("peephole", True)
        kw.setdefault("clip", True)
    if op == "gru_sequence":
        kw.setdefault("reset_after", True)
    return _CASES[op](rng, **kw)


def _split(op, case):
    """(positional arrays, keywords) of a case for the public op."""
    spec = OPS[op]
    names = [n for n in spec.arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def _forward(op, case, backend):
    positional, keywords = _split(op, case)
    return getattr(gc, op)(*positional, **keywords, backend=backend)


def _grad(op, case, result, backend, **kw):
    positional, keywords = _split(op, case)
    optional = {k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS}
    return getattr(gc, f"{op}_grad")(*positional, result, **optional, **kw, backend=backend)


def _upstream(op, result, seed):
    rng = np.random.default_rng(seed)
    return {f"d_{k}": rng.standard_normal(getattr(result, k).shape)
            for k in ("h", "cs", "h_final", "cs_final") if hasattr(result, k)}


def _assert_close(got, want, what, rtol=1e-12, atol=1e-13):
    for name in want._fields if hasattr(want, "_fields") else want:
        a, b = getattr(got, name), (getattr(want, name) if hasattr(want, "_fields")
                                    else want[name])
        if b is None:
            assert a is None, f"{what}: {name}"
        elif isinstance(b, tuple):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"{what}: {name}")
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{what}: {name}")


# --- reverse -----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS_)
def test_reverse_is_the_cell_loop_run_backwards(backend, op):
    rng = np.random.default_rng(31)
    for k in range(4):
        extra = {"layer_norm": k == 1, "proj_size": 3 if k == 2 else None, "proj_clip": True}
        case = _case(op, rng, steps=5, batch=5, ragged=k != 3, reverse=True,
                     **(extra if op == "lstm_sequence" else {}))
        seq = _forward(op, case, backend)
        assert seq.settings.reverse
        forward, backprop = _LOOPS[op]
        positional, keywords = _split(op, case)
        run = forward(*positional, **keywords, backend=backend)
        _assert_close(seq, run.outputs, f"{op} case {k} forward")
        up = _upstream(op, seq, k)
        grads = _grad(op, case, seq, backend, **up)
        _assert_close(grads, backprop(run, **up), f"{op} case {k} gradient", 1e-11, 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS_)
def test_reverse_without_lengths_is_the_flipped_sequence(backend, op):
    case = _case(op, np.random.default_rng(5), steps=4, batch=3)
    flipped = {**case, "x": case["x"][::-1].copy()}
    want, got = _forward(op, flipped, backend), _forward(op, {**case, "reverse": True}, backend)
    for name, a, b in zip(want._fields, got, want, strict=True):
        np.testing.assert_array_equal(a, b[::-1] if b.ndim == 3 else b, err_msg=name)
    up = _upstream(op, got, 2)
    flipped_up = {k: v[::-1] if v.ndim == 3 else v for k, v in up.items()}
    np.testing.assert_array_equal(_grad(op, {**case, "reverse": True}, got, backend, **up).x,
                                  _grad(op, flipped, want, backend, **flipped_up).x[::-1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS_)
def test_rows_of_length_zero_and_t_and_empty_sizes(backend, op):
    """Rows of length 0 and T, and T = 0, B = 0 and I = 0 (a per-row reversal of an input
    of width 0 included) in both layouts."""
    rng = np.random.default_rng(8)
    case = _case(op, rng, steps=4, batch=3, reverse=True)
    case["seq_len"] = np.array([0, 4, 2])
    seq = _forward(op, case, backend)
    np.testing.assert_array_equal(seq.h[:, 0], 0)          # nothing ran: zeros ...
    np.testing.assert_array_equal(seq.h_final[0], case["h0"][0])   # ... and the initial state
    assert np.all(seq.h[2:, 2] == 0) and np.all(seq.h[:2, 2] != 0)
    for steps, batch, n_in in ((0, 3, 2), (3, 0, 2), (3, 2, 0)):
        for batch_first in (False, True):
            empty = _case(op, rng, steps=steps, batch=batch, input_size=n_in, reverse=True,
                          batch_first=batch_first, ragged=batch > 0)
            result = _forward(op, empty, backend)
            assert result.h.shape[:2] == ((batch, steps) if batch_first else (steps, batch))
            grads = _grad(op, empty, result, backend, **_upstream(op, result, 0))
            assert grads.x.shape == empty["x"].shape


# --- batch_first ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize("reverse", [False, True])
def test_batch_first_is_the_transposed_call(backend, op, reverse):
    seed = 13
    time_major = _case(op, np.random.default_rng(seed), steps=5, batch=4, ragged=True,
                       reverse=reverse)
    batch_major = _case(op, np.random.default_rng(seed), steps=5, batch=4, ragged=True,
                        reverse=reverse, batch_first=True)
    np.testing.assert_array_equal(batch_major["x"], time_major["x"].transpose(1, 0, 2))
    want, got = _forward(op, time_major, backend), _forward(op, batch_major, backend)
    assert got.settings.batch_first and not want.settings.batch_first
    for name, a, b in zip(want._fields, got, want, strict=True):
        np.testing.assert_array_equal(a, b.transpose(1, 0, 2) if b.ndim == 3 else b,
                                      err_msg=name)
    up = _upstream(op, want, 4)
    up_bt = {k: v.transpose(1, 0, 2) if v.ndim == 3 else v for k, v in up.items()}
    g_want = _grad(op, time_major, want, backend, **up)
    g_got = _grad(op, batch_major, got, backend, **up_bt)
    np.testing.assert_array_equal(g_got.x, g_want.x.transpose(1, 0, 2))
    for name in g_want._fields[1:]:
        a, b = getattr(g_got, name), getattr(g_want, name)
        if b is not None and not isinstance(b, tuple):
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("op", OPS_)
def test_batch_first_shapes_are_named_in_its_layout(op):
    case = _case(op, np.random.default_rng(2), steps=5, batch=3, batch_first=True)
    seq = _forward(op, case, "reference")
    with pytest.raises(ValueError, match=r"d_h must have shape \[B, T, [HP]\] = \(3, 5, "):
        _grad(op, case, seq, "reference", d_h=np.zeros((5, 3, seq.h.shape[2])))
    with pytest.raises(ValueError, match=r"seq_len must have shape \[B\] = \(3,\)"):
        _forward(op, {**case, "seq_len": np.array([1, 2, 3, 4, 5])}, "reference")
    with pytest.raises(ValueError, match=r"seq_len must hold lengths in \[0, T\] = \[0, 5\]"):
        _forward(op, {**case, "seq_len": np.array([1, 6, 2])}, "reference")
    first_state = OPS[op].states[0]
    with pytest.raises(ValueError, match=rf"{first_state} must have shape \[B, H\] = \(3,"):
        _forward(op, {**case, first_state: case[first_state][:2]}, "reference")


# --- the oracle, settings, bad input -------------------------------------------------------

@pytest.mark.parametrize("op", OPS_)
@given(seed=st.integers(0, 2**32 - 1), reverse=st.booleans(), batch_first=st.booleans(),
       ragged=st.booleans(), variant=st.booleans())
def test_gradients_equal_central_differences(op, seed, reverse, batch_first, ragged, variant):
    """On the reference. The CPU's float64 gradients of the same option space pass the
    oracle in ``test_reverse_cpu.py`` and equal the reference's to 1e-12 there (its
    emulated GPU's in ``test_cuda_emulation.py``): differencing them again here re-proved
    both."""
    backend = "reference"
    rng = np.random.default_rng(seed)
    options = {"lstm_sequence": {"layer_norm": variant, "proj_size": 2 if variant else None},
               "gru_sequence": {"reset_after": variant},
               "rnn_sequence": {"activation": "relu" if variant else "tanh"}}[op]
    case = _case(op, rng, steps=4, batch=3, ragged=ragged, reverse=reverse,
                 batch_first=batch_first, **options)
    vjp_check(op, case, backend=backend).raise_if_failed()


@pytest.mark.parametrize("op", OPS_)
def test_the_record_decides_and_contradictions_are_named(op):
    case = _case(op, np.random.default_rng(3), steps=4, batch=3, ragged=True, reverse=True)
    seq = _forward(op, case, "reference")
    up = _upstream(op, seq, 1)
    short = _grad(op, case, seq, "reference", **up)
    full = _grad(op, case, seq, "reference", reverse=True, batch_first=False, **up)
    np.testing.assert_array_equal(short.x, full.x)
    attrs = {k: case[k] for k in ("reset_after", "activation", "cell_clip") if k in case}
    bare = _grad(op, case, type(seq)(*seq), "reference", **attrs, **up)   # records nothing
    assert not np.allclose(bare.x, short.x)
    told = _grad(op, case, type(seq)(*seq), "reference", reverse=True,
                 seq_len=case["seq_len"], **attrs, **up)
    np.testing.assert_array_equal(told.x, short.x)
    with pytest.raises(ValueError, match="reverse=False contradicts the forward's reverse=True"):
        _grad(op, case, seq, "reference", reverse=False, **up)
    with pytest.raises(ValueError, match="batch_first=True contradicts"):
        _grad(op, case, seq, "reference", batch_first=True, **up)


@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize("flag", ["reverse", "batch_first"])
def test_flags_must_be_bools(op, flag):
    case = _case(op, np.random.default_rng(4))
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match=f"{flag} must be a bool"):
            _forward(op, {**case, flag: bad}, "reference")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS_)
def test_inputs_are_never_modified(backend, op):
    case = _case(op, np.random.default_rng(6), steps=4, batch=4, ragged=True, reverse=True,
                 batch_first=True)
    before = {n: v.copy() for n, v in case.items() if isinstance(v, np.ndarray)}
    seq = _forward(op, case, backend)
    saved = [a.copy() for a in seq]
    up = _upstream(op, seq, 3)
    kept = {n: v.copy() for n, v in up.items()}
    _grad(op, case, seq, backend, **up)
    for name, value in before.items():
        np.testing.assert_array_equal(case[name], value, err_msg=name)
    for name, value in kept.items():
        np.testing.assert_array_equal(up[name], value, err_msg=name)
    for a, b in zip(seq, saved, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize("batch_first", [False, True])
def test_padding_is_never_read_in_either_direction(backend, op, batch_first):
    import warnings

    case = _case(op, np.random.default_rng(9), steps=5, batch=4, ragged=True, reverse=True,
                 batch_first=batch_first)
    lengths = case["seq_len"]
    valid = np.arange(5)[:, None] < lengths
    padded = case["x"].copy()
    (padded.transpose(1, 0, 2) if batch_first else padded)[~valid] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seq = _forward(op, {**case, "x": padded}, backend)
        grads = _grad(op, {**case, "x": padded}, seq, backend, **_upstream(op, seq, 1))
    clean = _forward(op, case, backend)
    for a, b in zip(seq, clean, strict=True):
        np.testing.assert_array_equal(a, b)
    assert all(np.isfinite(g).all() for g in grads if isinstance(g, np.ndarray))
