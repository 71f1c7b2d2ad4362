"""The masks of the sequence operations (docs/spec.md §11.3): ``input_mask``,
``recurrent_mask``, ``zoneout_h`` and the LSTM's ``zoneout_cs``, explicit arrays, constants to
the gradient. Every backend runs them (``tests/contracts/test_masks_cpu.py`` and the masks sections
of
``tests/contracts/test_cuda_emulation.py`` hold the CPU and GPU backends to the reference; the tests
here run on the default backend).

- float64 gradients equal central differences with every mask, binary and fractional, full
  ``[T, B, ·]`` and broadcast, with ragged lengths, both directions and both layouts, and the
  cells' options (peepholes, clip, projection, layer norm and both carries, reset-after,
  relu);
- what each mask means, written out: an input mask of zeros is a zero input; a recurrent
  mask of zeros cuts the recurrent matmul (an LSTM with ``W_h = 0``), while a GRU's and a
  plain RNN's states still carry; zoneout of ones keeps the initial states, of zeros is no
  zoneout; masks of ones change nothing;
- past a row's length the masks are never read (NaN there changes nothing), in either
  direction;
- the result records the masks; a contradiction is named; bad shapes and dtypes are named.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.testing import gru_sequence_case, lstm_sequence_case, rnn_sequence_case, vjp_check

OPS_ = ["lstm_sequence", "gru_sequence", "rnn_sequence"]
_CASES = {"lstm_sequence": lstm_sequence_case, "gru_sequence": gru_sequence_case,
          "rnn_sequence": rnn_sequence_case}


def _sizes(case):
    """(T, B, I, H, P) of a sequence case, whatever its layout."""
    x = case["x"]
    steps, batch = x.shape[1::-1] if case.get("batch_first") else x.shape[:2]
    width = case["h0"].shape[1]
    hidden = case["cs0"].shape[1] if "cs0" in case else width
    return steps, batch, x.shape[2], hidden, width


def _masks(rng, op, case, *, full):
    """Every mask of ``op`` for ``case``: per step (``full``) or broadcast over time."""
    steps, batch, n_in, hidden, width = _sizes(case)
    lead = (batch, steps) if case.get("batch_first") else (steps, batch)
    per_row = (batch, 1) if case.get("batch_first") else (batch,)   # the same every step
    masks = {"input_mask": rng.uniform(0.5, 1.0, (*lead, n_in)) if full
             else rng.integers(0, 2, (*per_row, n_in)) / 0.7,
             "recurrent_mask": rng.integers(0, 2, (batch, width)) / 0.8,
             "zoneout_h": rng.uniform(0.0, 0.6, (*lead, width)) if full
             else rng.uniform(0.0, 0.5, width)}
    if op == "lstm_sequence":
        masks["zoneout_cs"] = (rng.uniform(0.0, 0.6, (*lead, hidden)) if full
                               else rng.integers(0, 2, (*per_row, hidden)).astype(float))
    return masks


def _split(op, case):
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def _forward(op, case, backend=None):
    positional, keywords = _split(op, case)
    return getattr(gc, op)(*positional, **keywords, backend=backend)


def _grad(op, case, seq, **kw):
    positional, keywords = _split(op, case)
    optional = {k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS}
    return getattr(gc, f"{op}_grad")(*positional, seq, **optional, **kw)


@pytest.mark.parametrize("op", OPS_)
@given(seed=st.integers(0, 2**32 - 1), ragged=st.booleans(), reverse=st.booleans(),
       batch_first=st.booleans(), variant=st.booleans())
def test_gradients_equal_central_differences(op, seed, ragged, reverse, batch_first, variant):
    """The cases' own masks (each per step or broadcast, drawn), drawn before the clips are
    chosen: a clip chosen without them may sit at a kink of the masked run."""
    rng = np.random.default_rng(seed)
    options = {"lstm_sequence": {"peephole": True, "clip": variant, "layer_norm": variant,
                                 "ln_carry": "normalized" if seed % 2 else "raw",
                                 "proj_size": None if variant else 2},
               "gru_sequence": {"reset_after": variant},
               "rnn_sequence": {"activation": "tanh"}}[op]
    case = _CASES[op](rng, steps=4, batch=3, ragged=ragged, reverse=reverse,
                      batch_first=batch_first, masks=True, **options)
    vjp_check(op, case).raise_if_failed()


@pytest.mark.parametrize("op", OPS_)
def test_what_each_mask_means(op):
    rng = np.random.default_rng(2)
    case = _CASES[op](rng, steps=4, batch=3, **({"peephole": True} if op == "lstm_sequence"
                                                 else {}))
    steps, batch, n_in, hidden, width = _sizes(case)
    plain = _forward(op, case)
    ones = {name: np.ones(mask.shape) for name, mask in _masks(rng, op, case, full=True).items()
            if not name.startswith("zoneout")}
    for a, b in zip(_forward(op, {**case, **ones}), plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)
    zero_input = _forward(op, {**case, "input_mask": np.zeros(n_in)})
    np.testing.assert_allclose(zero_input.h, _forward(op, {**case, "x": 0 * case["x"]}).h,
                               rtol=1e-14, atol=1e-15)
    zoneouts = {"zoneout_h": 1.0 + np.zeros(width)}
    if op == "lstm_sequence":
        zoneouts["zoneout_cs"] = np.ones(hidden)
        cut = case["w"].copy()
        cut[n_in:] = 0
        np.testing.assert_allclose(
            _forward(op, {**case, "recurrent_mask": np.zeros((batch, width))}).h,
            _forward(op, {**case, "w": cut}).h, rtol=1e-14, atol=1e-15)
    frozen = _forward(op, {**case, **zoneouts})
    np.testing.assert_array_equal(frozen.h, np.broadcast_to(case["h0"], frozen.h.shape))
    no_zoneout = _forward(op, {**case, **{k: 0 * v for k, v in zoneouts.items()}})
    np.testing.assert_allclose(no_zoneout.h, plain.h, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize("reverse", [False, True])
def test_masks_past_a_rows_length_are_never_read(op, reverse):
    rng = np.random.default_rng(5)
    case = _CASES[op](rng, steps=5, batch=4, ragged=True, reverse=reverse)
    case.update(_masks(rng, op, case, full=True))
    valid = np.arange(5)[:, None] < case["seq_len"]
    poisoned = dict(case)
    for name in ("input_mask", "zoneout_h", "zoneout_cs"):
        if name in case:
            poisoned[name] = case[name].copy()
            poisoned[name][~valid] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seq = _forward(op, poisoned)
        up = {"d_h": np.ones(seq.h.shape)}
        grads = _grad(op, poisoned, seq, **up)
    for a, b in zip(seq, _forward(op, case), strict=True):
        np.testing.assert_array_equal(a, b)
    want = _grad(op, case, _forward(op, case), **up)
    for name, a in grads._asdict().items():
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, getattr(want, name), err_msg=name)


@pytest.mark.parametrize("op", OPS_)
def test_the_record_dispatch_and_bad_input(op):
    rng = np.random.default_rng(6)
    case = _CASES[op](rng, steps=4, batch=3)
    masks = _masks(rng, op, case, full=False)
    seq = _forward(op, {**case, **masks})
    assert seq.settings.recurrent_mask.shape == masks["recurrent_mask"].shape
    np.testing.assert_array_equal(
        _grad(op, case, seq, d_h=np.ones(seq.h.shape)).x,
        _grad(op, case, seq, d_h=np.ones(seq.h.shape), **masks).x)
    with pytest.raises(ValueError, match="recurrent_mask=<an array of shape .*> contradicts"):
        _grad(op, case, seq, recurrent_mask=2 * masks["recurrent_mask"])
    for backend in ("reference", "cpu"):   # both run the masks, to round-off of each other
        np.testing.assert_allclose(_forward(op, {**case, **masks}, backend=backend).h, seq.h,
                                   rtol=1e-12, atol=1e-13)
    batch, width = masks["recurrent_mask"].shape
    with pytest.raises(ValueError, match=r"recurrent_mask must broadcast to \[B, H\] = "):
        _forward(op, {**case, "recurrent_mask": np.ones((batch + 1, width))})
    with pytest.raises(ValueError, match=r"input_mask must broadcast to \[T, B, I\]"):
        _forward(op, {**case, "input_mask": np.ones((2, 1, 1, 1))})
    with pytest.raises(TypeError, match="zoneout_h must have the same dtype as x"):
        _forward(op, {**case, "zoneout_h": masks["zoneout_h"].astype(np.float32)})


@pytest.mark.parametrize("op", OPS_)
def test_the_strategies_draw_masked_cases_the_oracle_passes(op):
    """``gc.testing``'s sequence strategies with ``masks=True`` (every other option drawn):
    the masks are in the case before its clips are chosen, so the oracle's steps stay away
    from the clips' kinks under the masked run."""
    from hypothesis import settings

    from gradcells.testing import gru_sequence_inputs, lstm_sequence_inputs, rnn_sequence_inputs

    options = {"reverse": None, "batch_first": None, "masks": True, "ragged": None}
    strategy = {"lstm_sequence": lstm_sequence_inputs(projection=None, layer_norm=None,
                                                      **options),
                "gru_sequence": gru_sequence_inputs(**options),
                "rnn_sequence": rnn_sequence_inputs(**options)}[op]

    @settings(max_examples=15, deadline=None, database=None)
    @given(case=strategy)
    def check(case):
        assert all(case.get(name) is not None for name in ("input_mask", "recurrent_mask",
                                                             "zoneout_h"))
        vjp_check(op, case).raise_if_failed()

    check()
