"""The sequence masks (docs/spec.md §11.3) on the CPU backend against the reference.

- agreement on Hypothesis-drawn masked cases of the three cells (``gc.testing``'s sequence
  strategies with ``masks=True``, every option drawn: reverse, batch_first, ragged lengths,
  the LSTM's peepholes, clip, projection and layer norm): float64 to 1e-12 relative and
  float32 as ``tests/contracts/test_cpu_backend.py`` holds it, forward and every gradient, with
  every
  subset of upstream gradients;
- the CPU's float64 gradients pass the oracle (``vjp_check``) on drawn masked cases;
- past a row's length the masks are never read on the CPU (NaN there changes nothing);
- binary and fractional masks, full ``[T, B, ·]``, broadcast and non-contiguous ones;
- each mask alone and all together, with every option of each cell (peepholes,
  ``cell_clip`` in both ``clip_grad`` modes, projection and ``proj_clip``, layer norm with
  both carries, ``forget_bias``, reset-after, relu and tanh), ragged lengths with rows of
  length 0 and T, an empty batch and T = 0;
- inputs and masks are never modified.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cpu_backend import assert_float32_agrees as cpu_bound
from test_cpu_backend import assert_float64_agrees

import gradcells as gc
from gradcells._core.specs import MASKS
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.cells.lstm.spec import LSTMNorm
from gradcells.testing import (
    gru_sequence_case,
    gru_sequence_inputs,
    lstm_sequence_case,
    lstm_sequence_inputs,
    rnn_sequence_case,
    rnn_sequence_inputs,
    vjp_check,
)

OPS_ = ("lstm_sequence", "gru_sequence", "rnn_sequence")
_CASES = {"lstm_sequence": lstm_sequence_case, "gru_sequence": gru_sequence_case,
          "rnn_sequence": rnn_sequence_case}


def _strategy(op, dtype=np.float64, layer_norm=None, **sizes):
    """Masked cases of ``op``, every option drawn (the LSTM's layer norm as ``layer_norm``
    says: None, drawn)."""
    options = {"reverse": None, "batch_first": None, "masks": True, "ragged": None,
               "dtype": dtype, **sizes}
    if op == "lstm_sequence":
        return lstm_sequence_inputs(projection=None, layer_norm=layer_norm, **options)
    return {"gru_sequence": gru_sequence_inputs,
            "rnn_sequence": rnn_sequence_inputs}[op](**options)


# --- running the ops -------------------------------------------------------------------------

def _split(op, case):
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def _forward(op, case, backend):
    positional, keywords = _split(op, case)
    return getattr(gc, op)(*positional, **keywords, backend=backend)


def _grads(op, case, record, up, backend, clip_grad="exact"):
    """The gradient at a given forward record (so that both backends mask the same clips);
    a record built by hand records nothing, so the case's keywords come too."""
    positional, keywords = _split(op, case)
    optional = {k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS
                or (record.settings is None and k != "forget_bias")}
    extra = {"clip_grad": clip_grad} if op == "lstm_sequence" else {}
    return getattr(gc, f"{op}_grad")(*positional, record, **optional, **up, **extra,
                                      backend=backend)


def _states(op):
    return ("h", "cs", "h_final", "cs_final") if op == "lstm_sequence" else ("h", "h_final")


def _upstream(op, record, which, seed=0):
    """Upstream gradients of the states named in ``which`` (the others None)."""
    rng = np.random.default_rng(seed)
    return {f"d_{n}": rng.standard_normal(getattr(record, n).shape).astype(
        getattr(record, n).dtype) if n in which else None for n in _states(op)}


def _fields(result):
    """Every array of a result or gradient by name, the layer norm's as ``layer_norm.*``."""
    out = {}
    for name, value in result._asdict().items():
        if isinstance(value, LSTMNorm):
            out.update({f"layer_norm.{n}": v for n, v in value._asdict().items()})
        elif isinstance(value, np.ndarray):
            out[name] = value
    return out


def _cast(tree, dtype):
    def convert(v):
        if isinstance(v, LSTMNorm):
            return LSTMNorm(*map(convert, v))
        return v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
    return {k: convert(v) for k, v in tree.items()}


def _both(op, case, which=("h",), clip_grad="exact"):
    """``(reference, cpu)``: each a dict of the forward's and the gradient's arrays (the
    gradient at the reference's record)."""
    record = _forward(op, case, "reference")
    up = _upstream(op, record, which)
    out = []
    for backend in ("reference", "cpu"):
        forward = record if backend == "reference" else _forward(op, case, "cpu")
        grads = _grads(op, case, record, up, backend, clip_grad)
        out.append({**_fields(forward), **{f"d{n}": v for n, v in _fields(grads).items()}})
    return out


def assert_cpu_agrees(op, case, which=("h",), clip_grad="exact"):
    """float64: the CPU within 1e-12 relative of the reference, forward and gradients."""
    want, got = _both(op, case, which, clip_grad)
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert_float64_agrees(got[name], value, name)


def assert_float32_agrees(actual, reference32, exact, name):
    """``tests/contracts/test_cpu_backend.py``'s float32 bound (no further from ``exact``, the
    float64
    reference on the same inputs, than 3× the float32 reference's own error) with 8 rather
    than 4 float32 ulps of the array's scale: with zoneout each step's state gradient is the
    sum of two roundings (``z∘g`` and the matmul's part), and a drawn case (seed 830, a
    projection wider than H) took 1.07× the 4-ulp bound."""
    cpu_bound(actual, reference32, exact, name, amplification=2.0)


def assert_cpu_agrees_float32(op, case, which=("h",), clip_grad="exact"):
    """float32: the CPU as close to the exact result as ``assert_float32_agrees`` asks."""
    ref32 = _forward(op, case, "reference")
    exact = _forward(op, _cast(case, np.float64), "reference")
    for name, value in _fields(_forward(op, case, "cpu")).items():
        assert_float32_agrees(value, getattr(ref32, name), getattr(exact, name), name)
    up = _upstream(op, ref32, which)
    record64 = type(ref32)(*(a.astype(np.float64) if isinstance(a, np.ndarray) else a
                             for a in ref32))
    want = _fields(_grads(op, case, ref32, up, "reference", clip_grad))
    got = _fields(_grads(op, case, ref32, up, "cpu", clip_grad))
    exact_g = _fields(_grads(op, _cast(case, np.float64), record64, _cast(up, np.float64),
                             "reference", clip_grad))
    assert got.keys() == want.keys() == exact_g.keys()
    for name, value in got.items():
        assert_float32_agrees(value, want[name], exact_g[name], f"d{name}")


# --- agreement on drawn cases ----------------------------------------------------------------

def _which(op):
    return st.sets(st.sampled_from(_states(op)))


@pytest.mark.parametrize("op", OPS_)
@given(data=st.data())
def test_drawn_masked_cases_agree_with_reference_float64(op, data):
    case = data.draw(_strategy(op, max_steps=5))
    clip_grad = data.draw(st.sampled_from(("exact", "straight_through")))
    assert_cpu_agrees(op, case, data.draw(_which(op)), clip_grad)


def _not_cancelled(case):
    """In float32, no input or state one column wide: there a result can be the round-off
    of terms that cancel, and an error relative to the array's own scale says nothing (as
    ``tests/contracts/test_layer_norm_cpu.py`` says of widths of one). Measured over 1,500 drawn
    LSTM
    cases: ``dwci`` at 28 ulps of its scale with ``H = 1`` (a sum of T·B terms of both signs,
    summed in another order). For the same reason the float32 draws have no layer norm: a
    binary input or recurrent mask leaves a row one column (``LN(x·W_x)`` then removes its
    one scalar: ``dx`` at up to 4,000 ulps of its scale in either backend, the CPU's error
    sometimes the smaller), and a cell norm over 2 columns is ``±1`` up to ``ε``. The layer
    norm's masked float32 cases are ``test_all_masks_together_in_float32``'s; every width
    is covered in float64 and by the oracle."""
    widths = (case["x"].shape[2], case["h0"].shape[1], case.get("cs0", case["h0"]).shape[1])
    return min(widths) >= 2


@pytest.mark.parametrize("op", OPS_)
@given(data=st.data())
def test_drawn_masked_cases_agree_with_reference_float32(op, data):
    case = data.draw(_strategy(op, np.float32, layer_norm=False, max_hidden=6)
                     .filter(_not_cancelled))
    assert_cpu_agrees_float32(op, case, data.draw(_which(op)))


@pytest.mark.parametrize("op", OPS_)
def test_the_cpu_passes_the_oracle_on_drawn_masked_cases(op):
    from hypothesis import settings

    @settings(max_examples=8, deadline=None, database=None)
    @given(case=_strategy(op))
    def check(case):
        vjp_check(op, case, backend="cpu").raise_if_failed()

    check()


# --- the masks one by one, and every option ----------------------------------------------

def _sizes(case):
    """(T, B, I, H, P) of a time-major case."""
    steps, batch, n_in = case["x"].shape
    width = case["h0"].shape[1]
    return steps, batch, n_in, case["cs0"].shape[1] if "cs0" in case else width, width


def _masks(rng, op, case, shapes):
    """Every mask of ``op`` for a time-major ``case``: ``shapes`` "full" (fractional,
    ``[T, B, ·]``), "binary" (0/1, zoneout as trained; ``[T, B, ·]``, ``[T, 1, H]``),
    "broadcast" (``[B, ·]``, ``[B, 1]`` or ``[1, 1, ·]``) or "views" (full, but flipped,
    transposed or gathered views)."""
    steps, batch, n_in, hidden, width = _sizes(case)
    dtype = case["x"].dtype
    if shapes == "broadcast":
        masks = {"input_mask": rng.integers(0, 2, (batch, n_in)) / 0.7,
                 "zoneout_h": rng.uniform(0.0, 0.5, (1, 1, width)),
                 "zoneout_cs": rng.integers(0, 2, (batch, 1)).astype(float)}
    elif shapes == "binary":
        masks = {"input_mask": rng.integers(0, 2, (steps, batch, n_in)) / 0.7,
                 "zoneout_h": rng.integers(0, 2, (steps, batch, width)).astype(float),
                 "zoneout_cs": rng.integers(0, 2, (steps, 1, hidden)).astype(float)}
    else:
        masks = {"input_mask": rng.uniform(0.5, 1.0, (steps, batch, n_in)),
                 "zoneout_h": rng.uniform(0.0, 0.6, (steps, batch, width)),
                 "zoneout_cs": rng.uniform(0.0, 0.6, (steps, batch, hidden))}
    masks["recurrent_mask"] = rng.integers(0, 2, (batch, width)) / 0.8
    if shapes == "views":
        masks = {"input_mask": masks["input_mask"][::-1],
                 "zoneout_h": np.ascontiguousarray(masks["zoneout_h"].transpose(1, 0, 2))
                 .transpose(1, 0, 2),
                 "zoneout_cs": np.concatenate([masks["zoneout_cs"]] * 2, axis=2)[..., ::2],
                 "recurrent_mask": masks["recurrent_mask"][::-1]}
    if op != "lstm_sequence":
        del masks["zoneout_cs"]
    return {k: v.astype(dtype) for k, v in masks.items()}


OPTIONS = {
    "lstm_sequence": [{}, {"peephole": True}, {"clip": True}, {"clip": True, "peephole": True},
                      {"proj_size": 3}, {"proj_size": 2, "proj_clip": True, "clip": True},
                      {"layer_norm": True}, {"layer_norm": True, "ln_carry": "normalized"},
                      {"layer_norm": True, "ln_carry": "normalized", "proj_size": 2,
                       "peephole": True, "clip": True, "forget_bias": 0.0}],
    "gru_sequence": [{"reset_after": False}, {"reset_after": True}],
    "rnn_sequence": [{"activation": "tanh"}, {"activation": "relu"}],
}


def _cases_with_options(op):
    return [pytest.param(op, options, id=f"{op}-{i}") for i, options in enumerate(OPTIONS[op])]


ALL_OPTIONS = [p for op in OPS_ for p in _cases_with_options(op)]


def _mask_names(op):
    return [n for n in MASKS if op == "lstm_sequence" or n != "zoneout_cs"]


@pytest.mark.parametrize(("op", "options"), ALL_OPTIONS)
@pytest.mark.parametrize("shapes", ["full", "binary", "broadcast", "views"])
def test_each_mask_alone_and_all_together_with_every_option(op, options, shapes):
    rng = np.random.default_rng(len(str(options)) + 7 * len(shapes))
    case = _CASES[op](rng, steps=5, batch=4, ragged=True, **options)
    case["seq_len"] = np.array([0, 5, 3, 5])[:case["x"].shape[1]]
    masks = _masks(rng, op, case, shapes)
    clip_grads = ("exact", "straight_through") if options.get("clip") else ("exact",)
    for subset in [[n] for n in masks] + [list(masks)]:
        masked = {**case, **{n: masks[n] for n in subset}}
        for clip_grad in clip_grads:
            assert_cpu_agrees(op, masked, _states(op), clip_grad)


@pytest.mark.parametrize(("op", "options"), ALL_OPTIONS)
def test_all_masks_together_in_float32(op, options):
    rng = np.random.default_rng(11)
    case = _CASES[op](rng, steps=5, batch=4, ragged=True, dtype=np.float32, **options)
    assert_cpu_agrees_float32(op, {**case, **_masks(rng, op, case, "full")}, _states(op))


@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize(("steps", "batch"), [(0, 3), (4, 0), (0, 0), (1, 1)])
def test_empty_and_tiny_sequences(op, steps, batch):
    rng = np.random.default_rng(3)
    case = _CASES[op](rng, steps=steps, batch=batch)
    assert_cpu_agrees(op, {**case, **_masks(rng, op, case, "full")}, _states(op))


@pytest.mark.parametrize("op", OPS_)
@pytest.mark.parametrize("reverse", [False, True])
def test_masks_past_a_rows_length_are_never_read(op, reverse):
    rng = np.random.default_rng(5)
    case = _CASES[op](rng, steps=5, batch=4, ragged=True, reverse=reverse)
    case.update(_masks(rng, op, case, "full"))
    valid = np.arange(5)[:, None] < case["seq_len"]
    poisoned = dict(case)
    for name in ("input_mask", "zoneout_h", "zoneout_cs"):
        if name in case:
            poisoned[name] = case[name].copy()
            poisoned[name][~valid] = np.nan
    record = _forward(op, case, "cpu")
    up = _upstream(op, record, _states(op))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seq = _forward(op, poisoned, "cpu")
        grads = _grads(op, poisoned, seq, up, "cpu")
    for name, a in _fields(seq).items():
        np.testing.assert_array_equal(a, getattr(record, name), err_msg=name)
    want = _grads(op, case, record, up, "cpu")
    for name, a in _fields(grads).items():
        np.testing.assert_array_equal(a, _fields(want)[name], err_msg=name)


@pytest.mark.parametrize("op", OPS_)
def test_inputs_and_masks_are_never_modified(op):
    rng = np.random.default_rng(8)
    case = _CASES[op](rng, steps=4, batch=3, ragged=True)
    case.update(_masks(rng, op, case, "full"))
    before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
    record = _forward(op, case, "cpu")
    up = _upstream(op, record, _states(op))
    saved = [a.copy() for a in _fields(record).values()]
    up_before = {k: v.copy() for k, v in up.items()}
    _grads(op, case, record, up, "cpu")
    for k, v in before.items():
        np.testing.assert_array_equal(case[k], v, err_msg=k)
    for a, b in zip(_fields(record).values(), saved, strict=True):
        np.testing.assert_array_equal(a, b)
    for k, v in up_before.items():
        np.testing.assert_array_equal(up[k], v, err_msg=k)
