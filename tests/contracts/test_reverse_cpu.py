"""``reverse=True`` with lengths run natively by the CPU backend (docs/spec.md §11.1,
``gradcells.cpu.NATIVE_REVERSE``) against the reference's reverse, which the public layer
still runs as a gathered forward run (``gradcells._order``).

- agreement on Hypothesis-drawn reversed ragged cases of the three cells, every other
  option drawn (masks, layout, the LSTM's peepholes, clip, projection and layer norm, the
  GRU's reset gate, the RNN's activation): float64 to 1e-12 relative, float32 as
  ``tests/contracts/test_masks_cpu.py`` holds it, forward and every gradient, every subset of
  upstream gradients, both ``clip_grad`` modes;
- the CPU's float64 gradients pass the oracle (``vjp_check``) on drawn reversed ragged cases;
- the native path is taken: no gather for a CPU call (the reference still gathers), and the
  backend is told ``reverse=True`` with ``x`` at its time positions;
- explicit edge cases: lengths 0 and T, every row full length, T = 0, B = 0, I = 0,
  ``batch_first``, every option of each cell, inputs never modified; the backend's reverse
  without lengths (which the public layer runs as a flip view) agrees too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cpu_backend import assert_float64_agrees
from test_masks_cpu import (
    _forward,
    _not_cancelled,
    _split,
    _which,
    assert_cpu_agrees,
    assert_cpu_agrees_float32,
)

import gradcells as gc
from gradcells import _dispatch, _order
from gradcells.testing import (
    gru_sequence_case,
    gru_sequence_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    rnn_sequence_case,
    rnn_sequence_inputs,
    vjp_check,
)

cpu_backend = _dispatch.backend_module("cpu")

OPS_ = ("lstm_sequence", "gru_sequence", "rnn_sequence")
_CASES = {"lstm_sequence": lstm_sequence_case, "gru_sequence": gru_sequence_case,
          "rnn_sequence": rnn_sequence_case}


def _strategy(op, dtype=np.float64, masks=None, layer_norm=None, **sizes):
    """Reversed ragged cases of ``op``, the other options drawn."""
    options = {"reverse": True, "ragged": True, "masks": masks, "batch_first": None,
               "dtype": dtype, **sizes}
    if op == "lstm_sequence":
        return lstm_sequence_inputs(projection=None, layer_norm=layer_norm, **options)
    return {"gru_sequence": gru_sequence_inputs,
            "rnn_sequence": rnn_sequence_inputs}[op](**options)


# --- agreement on drawn cases ----------------------------------------------------------------

@pytest.mark.parametrize("op", OPS_)
@given(data=st.data())
def test_drawn_reversed_ragged_cases_agree_with_reference_float64(op, data):
    case = data.draw(_strategy(op, max_steps=6, max_batch=5))
    clip_grad = data.draw(st.sampled_from(("exact", "straight_through")))
    assert_cpu_agrees(op, case, data.draw(_which(op)), clip_grad)


@pytest.mark.parametrize("op", OPS_)
@given(data=st.data())
def test_drawn_reversed_ragged_cases_agree_with_reference_float32(op, data):
    case = data.draw(_strategy(op, np.float32, layer_norm=False, max_steps=6, max_hidden=6)
                     .filter(_not_cancelled))
    assert_cpu_agrees_float32(op, case, data.draw(_which(op)))


@pytest.mark.parametrize("op", OPS_)
def test_the_cpu_passes_the_oracle_on_drawn_reversed_ragged_cases(op):
    @settings(max_examples=8, deadline=None, database=None)
    @given(case=_strategy(op, max_steps=5))
    def check(case):
        vjp_check(op, case, backend="cpu").raise_if_failed()

    check()


# --- the native path is taken ----------------------------------------------------------------

def _case(op, steps=5, batch=4, input_size=3, hidden=4, dtype=np.float64, seed=0, **options):
    """A reversed ragged case of ``op`` (``seq_len`` from ``ragged_lengths``: rows of
    length T and 0 among them), with ``options``."""
    return _CASES[op](np.random.default_rng(seed), steps=steps, batch=batch,
                      input_size=input_size, hidden=hidden, dtype=dtype, ragged=True,
                      reverse=True, **options)


def _forward_and_grad(op, case, backend):
    """The forward and its gradient with an upstream gradient on every h."""
    positional, keywords = _split(op, case)
    seq = getattr(gc, op)(*positional, **keywords, backend=backend)
    optional = {k: v for k, v in keywords.items() if k in ("wci", "wcf", "wco", "w_proj",
                                                           "layer_norm")}
    d_h = np.ones_like(seq.h)
    return seq, getattr(gc, f"{op}_grad")(*positional, seq, d_h=d_h, **optional,
                                           backend=backend)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("op", OPS_)
def test_a_cpu_call_gathers_nothing_and_the_reference_still_does(op, batch_first,
                                                                 monkeypatch):
    gathers = []
    original = _order._RunOrder._gather

    def counted(self, a, rows, shape):
        gathers.append(shape)
        return original(self, a, rows, shape)

    monkeypatch.setattr(_order._RunOrder, "_gather", counted)
    case = _case(op, batch_first=batch_first, masks=True)
    _forward_and_grad(op, case, "cpu")
    assert gathers == []
    _forward_and_grad(op, case, "reference")
    assert gathers


@pytest.mark.parametrize("op", OPS_)
def test_the_backend_is_told_reverse_and_gets_x_at_its_time_positions(op, monkeypatch):
    seen = []
    original = getattr(cpu_backend, op)

    def spy(x, *rest):
        seen.append((x, rest[-1]))
        return original(x, *rest)

    monkeypatch.setattr(cpu_backend, op, spy)
    case = _case(op)
    _forward(op, case, "cpu")
    (x, record), = seen
    assert record.reverse and not record.batch_first
    assert x is case["x"]
    assert cpu_backend.NATIVE_REVERSE is True
    assert not hasattr(gc.reference, "NATIVE_REVERSE")


# --- edge cases ------------------------------------------------------------------------------

def _with_lengths(case, lengths):
    return {**case, "seq_len": np.asarray(lengths, dtype=np.int64)}


@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize("lengths", [[5, 0, 3, 1], [5, 5, 5, 5], [0, 0, 0, 0], [1, 5, 0, 5],
                                     [2, 2, 2, 2]])
def test_lengths_from_0_to_T(op, lengths):
    case = _with_lengths(_case(op), lengths)
    assert_cpu_agrees(op, case, ("h", "h_final"))


@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize("sizes", [{"steps": 0}, {"batch": 0}, {"input_size": 0},
                                   {"steps": 1}, {"steps": 0, "batch": 0}])
def test_empty_sizes(op, sizes):
    case = _case(op, **sizes)
    assert_cpu_agrees(op, case, ("h", "h_final"))


OPTIONS = {
    "lstm_sequence": [{}, {"peephole": True}, {"clip": True, "peephole": True},
                      {"proj_size": 2, "proj_clip": True, "clip": True},
                      {"proj_size": 6, "peephole": True},
                      {"layer_norm": True}, {"layer_norm": True, "ln_carry": "normalized"},
                      {"layer_norm": True, "ln_carry": "normalized", "proj_size": 3,
                       "peephole": True, "clip": True}],
    "gru_sequence": [{"reset_after": False}, {"reset_after": True}],
    "rnn_sequence": [{"activation": "tanh"}, {"activation": "relu"}],
}


@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("op,options", [(op, o) for op, opts in OPTIONS.items() for o in opts])
def test_every_option_in_both_layouts(op, options, batch_first, masks):
    case = _case(op, steps=6, batch=5, seed=3, batch_first=batch_first, masks=masks,
                 **options)
    which = ("h", "cs", "h_final", "cs_final") if op == "lstm_sequence" else ("h", "h_final")
    for clip_grad in ("exact", "straight_through"):
        assert_cpu_agrees(op, case, which, clip_grad)


@pytest.mark.parametrize("op", OPS_)
def test_float32_edge_lengths(op):
    case = _with_lengths(_case(op, steps=6, batch=5, hidden=6, dtype=np.float32),
                         [6, 0, 1, 5, 6])
    assert_cpu_agrees_float32(op, case, ("h", "h_final"))


@pytest.mark.parametrize("op", OPS_)
def test_inputs_are_never_modified(op):
    case = _case(op, masks=True, peephole=True) if op == "lstm_sequence" else _case(
        op, masks=True)
    before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
    seq, _ = _forward_and_grad(op, case, "cpu")
    for name, value in before.items():
        np.testing.assert_array_equal(case[name], value, err_msg=name)


@pytest.mark.parametrize("op", OPS_)
def test_the_backends_reverse_without_lengths_is_the_flip(op):
    """Below the public layer (which flips a call without lengths itself), the backend's
    own reverse run of a full batch is the public reverse run too."""
    import backend_calls

    case = {**_case(op), "seq_len": None}
    want = _forward(op, case, "reference")
    got = backend_calls.forward(cpu_backend, op, case)
    for name, value in want._asdict().items():
        if isinstance(value, np.ndarray):
            assert_float64_agrees(getattr(got, name), value, name)
    d_h = np.ones_like(want.h)
    positional, keywords = _split(op, case)
    optional = {k: v for k, v in keywords.items() if k in ("wci", "wcf", "wco", "w_proj",
                                                           "layer_norm")}
    want_g = getattr(gc, f"{op}_grad")(*positional, want, d_h=d_h, **optional,
                                        backend="reference")
    got_g = backend_calls.grad(cpu_backend, op, case, got, d_h=d_h)
    for name, value in want_g._asdict().items():
        if isinstance(value, np.ndarray):
            assert_float64_agrees(getattr(got_g, name), value, f"d{name}")
