"""The layer-normalised LSTM (docs/spec.md §9.2) on the CPU backend against the reference.

- agreement on Hypothesis-drawn cases, cells and sequences, every option drawn (sizes from 0,
  hidden sizes past the SIMD width, peepholes, ``cell_clip``, a projection with or without
  ``proj_clip``, ragged lengths with rows of length 0, ``forget_bias``, both ``ln_carry``,
  both ``clip_grad``, every subset of upstream gradients): float64 to 1e-12 relative,
  float32 as ``tests/contracts/test_cpu_backend.py`` holds it (no further from the exact float64
  result than three times the float32 reference's own error plus four float32 ulps of the
  array's scale, times the largest ``r`` of the rows the case normalises: a layer norm
  multiplies its row's rounding by it), forward and every gradient, the layer norm's six
  included;
- the CPU's float64 gradients pass the oracle (``vjp_check``) for every option combination;
- ``clip_grad="straight_through"`` equals the exact gradient where no clip is active and
  differs where the cell clip is;
- inputs (the layer norm's arrays included), upstream gradients and saved results are
  never modified; read-only, strided and Fortran-ordered inputs give the same results;
- empty sizes (B = 0, T = 0, I = 0) give the reference's shapes and values;
- the new kernels' hot loops are SIMD.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import layer_norm_amplification
from hypothesis import given
from hypothesis import strategies as st
from simd import assert_packed, host_has_avx
from test_cpu_backend import assert_float32_agrees, assert_float64_agrees

import gradcells as gc
from gradcells.cells.lstm import _cpu_kernels as _lstm_kernels
from gradcells.cells.lstm.spec import LSTMNorm
from gradcells.testing import lstm_cell_case, lstm_sequence_case, vjp_check
from gradcells.testing.cases import FORGET_BIASES, SCALES

CARRIES = ("raw", "normalized")
CLIP_GRADS = ("exact", "straight_through")
CELL_STATES = ("h", "cs")
SEQUENCE_STATES = ("h", "cs", "h_final", "cs_final")


# --- cases -----------------------------------------------------------------------------------

def _options(draw, max_hidden, dtype):
    """The drawn options every LN case shares (``_widths`` says which widths)."""
    one = dtype == np.float64
    proj = draw(st.one_of(st.none(), st.integers(1 if one else 2, 5)))
    return {"hidden": draw(st.integers(1 if one or proj else 2, max_hidden)),
            "peephole": draw(st.booleans()), "clip": draw(st.booleans()), "proj_size": proj,
            "proj_clip": proj is not None and draw(st.booleans()),
            "forget_bias": draw(st.sampled_from(FORGET_BIASES)),
            "scale": draw(st.sampled_from(SCALES)), "ln_carry": draw(st.sampled_from(CARRIES))}


def _input_size(draw, most, dtype):
    """From 0; in float32 never 1 (``_options``)."""
    return draw(st.integers(0, most).filter(lambda n: dtype == np.float64 or n != 1))


# In float32 the input and the recurrent state are never one column wide ("_WIDTHS"). Then
# x·W_x (h_prev·W_h) is one scalar times a fixed row and the layer norm removes the scalar's
# size: the exact gradient of x (h_prev) is of the size of ε, what any float32 computation
# returns for it is the round-off of terms that cancel, and an error relative to that
# gradient's own size says nothing (measured: 2e-13 against a bound of 1.2e-13, on a gradient
# of size 3e-7 made of terms of size 1e-3). Widths of one are covered in float64 and by the
# oracle.


@st.composite
def ln_cells(draw, dtype=np.float64):
    """``lstm_cell`` cases with a layer norm, every option drawn; batch and input from 0
    (``_WIDTHS``)."""
    options = _options(draw, 21, dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return lstm_cell_case(rng, batch=draw(st.integers(0, 6)),
                          input_size=_input_size(draw, 6, dtype), dtype=dtype,
                          layer_norm=True, **options)


@st.composite
def ln_sequences(draw, dtype=np.float64):
    """``lstm_sequence`` cases with a layer norm, every option drawn; T, B and I from 0
    (``_WIDTHS``)."""
    options = _options(draw, 19, dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return lstm_sequence_case(rng, steps=draw(st.integers(0, 5)),
                              batch=draw(st.integers(0, 5)),
                              input_size=_input_size(draw, 5, dtype), dtype=dtype,
                              ragged=draw(st.booleans()), layer_norm=True, **options)


def _kind(case):
    return "cell" if "cs_prev" in case else "sequence"


def _forward(case, backend):
    run = gc.lstm_cell if _kind(case) == "cell" else gc.lstm_sequence
    return run(**case, backend=backend)


def _grads_at(case, record, up, backend, clip_grad):
    """The gradient at a given forward record (so that both backends mask the same clips)."""
    kw = {n: v for n, v in case.items() if n != "forget_bias"}
    if _kind(case) == "cell":
        return gc.lstm_cell_grad(**kw, state=record, **up, clip_grad=clip_grad,
                                 backend=backend)
    return gc.lstm_sequence_grad(**kw, seq=record, **up, clip_grad=clip_grad,
                                 backend=backend)


def _upstream(case, record, which, seed=0):
    """Upstream gradients for the states named in ``which`` (the others None)."""
    rng = np.random.default_rng(seed)
    names = CELL_STATES if _kind(case) == "cell" else SEQUENCE_STATES
    return {f"d_{n}": rng.standard_normal(getattr(record, n).shape).astype(
        getattr(record, n).dtype) if n in which else None for n in names}


def _cast(tree, dtype):
    def convert(v):
        if isinstance(v, LSTMNorm):
            return LSTMNorm(*map(convert, v))
        return v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
    return {k: convert(v) for k, v in tree.items()}


def _fields(result):
    """Every array of a result or gradient by name, the layer norm's as ``layer_norm.*``."""
    out = {}
    for name, value in result._asdict().items():
        if isinstance(value, LSTMNorm):
            out.update({f"layer_norm.{n}": v for n, v in value._asdict().items()})
        elif value is not None:
            out[name] = value
    return out


def _upstream_subsets(kind):
    names = CELL_STATES if kind == "cell" else SEQUENCE_STATES
    return st.sets(st.sampled_from(names))


# --- agreement with the reference ------------------------------------------------------------

def _check_float64(case, which, clip_grad):
    want = _forward(case, "reference")
    got = _forward(case, "cpu")
    up = _upstream(case, want, which)
    expected = {**_fields(want), **{f"d{n}": v for n, v in
                                    _fields(_grads_at(case, want, up, "reference",
                                                      clip_grad)).items()}}
    actual = {**_fields(got), **{f"d{n}": v for n, v in
                                 _fields(_grads_at(case, got, up, "cpu", clip_grad)).items()}}
    assert actual.keys() == expected.keys()
    assert "dlayer_norm.gamma_c" in actual
    for name, value in expected.items():
        assert_float64_agrees(actual[name], value, name)


def _check_float32(case, which, clip_grad):
    ref32 = _forward(case, "reference")
    exact = _forward(_cast(case, np.float64), "reference")
    got = _forward(case, "cpu")
    amplification = layer_norm_amplification(case)
    for name, value in _fields(got).items():
        assert_float32_agrees(value, getattr(ref32, name), getattr(exact, name), name,
                              amplification)
    # Gradients at one forward record, so that the clip masks are the same.
    up = _upstream(case, ref32, which)
    record64 = type(ref32)(*(a.astype(np.float64) for a in ref32))
    want = _fields(_grads_at(case, ref32, up, "reference", clip_grad))
    actual = _fields(_grads_at(case, ref32, up, "cpu", clip_grad))
    exact_g = _fields(_grads_at(_cast(case, np.float64), record64, _cast(up, np.float64),
                                "reference", clip_grad))
    assert actual.keys() == want.keys() == exact_g.keys()
    for name, value in actual.items():
        assert_float32_agrees(value, want[name], exact_g[name], f"d{name}", amplification)


@given(case=ln_cells(), which=_upstream_subsets("cell"), clip_grad=st.sampled_from(CLIP_GRADS))
def test_cell_agrees_with_reference_float64(case, which, clip_grad):
    _check_float64(case, which, clip_grad)


@given(case=ln_cells(np.float32), which=_upstream_subsets("cell"),
       clip_grad=st.sampled_from(CLIP_GRADS))
def test_cell_agrees_with_reference_float32(case, which, clip_grad):
    _check_float32(case, which, clip_grad)


@given(case=ln_sequences(), which=_upstream_subsets("sequence"),
       clip_grad=st.sampled_from(CLIP_GRADS))
def test_sequence_agrees_with_reference_float64(case, which, clip_grad):
    _check_float64(case, which, clip_grad)


@given(case=ln_sequences(np.float32), which=_upstream_subsets("sequence"),
       clip_grad=st.sampled_from(CLIP_GRADS))
def test_sequence_agrees_with_reference_float32(case, which, clip_grad):
    _check_float32(case, which, clip_grad)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("carry", CARRIES)
def test_sizes_past_the_simd_width_agree(dtype, carry):
    """Wide rows (4H = 164, 260): the vector loops and the eight-way sums do the work."""
    rng = np.random.default_rng(30)
    check = _check_float64 if dtype == np.float64 else _check_float32
    for hidden in (41, 65):
        cell = lstm_cell_case(rng, batch=5, input_size=7, hidden=hidden, dtype=dtype,
                              peephole=True, clip=True, layer_norm=True, ln_carry=carry)
        seq = lstm_sequence_case(rng, steps=4, batch=5, input_size=7, hidden=hidden,
                                 dtype=dtype, peephole=True, clip=True, ragged=True,
                                 proj_size=hidden // 2, layer_norm=True, ln_carry=carry)
        check(cell, CELL_STATES, "exact")
        check(seq, SEQUENCE_STATES, "exact")


# --- the oracle ------------------------------------------------------------------------------

COMBINATIONS = [  # (peephole, clip, proj_size, proj_clip, ragged)
    (False, False, None, False, False), (True, False, None, False, True),
    (False, True, None, False, True), (True, True, None, False, False),
    (False, False, 3, False, True), (True, True, 2, True, True),
    (False, True, 6, True, False), (True, False, 1, False, True),
]


@pytest.mark.parametrize("kind", ["cell", "sequence"])
@pytest.mark.parametrize("carry", CARRIES)
@pytest.mark.parametrize("combination", range(len(COMBINATIONS)))
def test_cpu_gradients_pass_the_oracle(kind, carry, combination):
    peephole, clip, proj_size, proj_clip, ragged = COMBINATIONS[combination]
    rng = np.random.default_rng(100 + combination)
    options = {"peephole": peephole, "clip": clip, "proj_size": proj_size,
               "proj_clip": proj_clip, "layer_norm": True, "ln_carry": carry,
               "forget_bias": FORGET_BIASES[combination % len(FORGET_BIASES)]}
    if kind == "cell":
        case = lstm_cell_case(rng, batch=3, input_size=4, hidden=5, **options)
    else:
        case = lstm_sequence_case(rng, steps=4, batch=3, input_size=3, hidden=5,
                                  ragged=ragged, **options)
    assert case["cell_clip"] is not None or not clip
    report = vjp_check(f"lstm_{kind}", case, backend="cpu")
    assert report.passed, f"\n{report}"
    assert any(c.name.startswith("layer_norm.") for c in report.checks)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_oracle_on_sizes_past_the_simd_width(dtype):
    rng = np.random.default_rng(31)
    for carry in CARRIES:
        case = _cast(lstm_cell_case(rng, batch=3, input_size=3, hidden=19, peephole=True,
                                    clip=True, layer_norm=True, ln_carry=carry), dtype)
        report = vjp_check("lstm_cell", case, backend="cpu")
        assert report.passed, f"\n{report}"


# --- clip_grad -------------------------------------------------------------------------------

def _vjp(case, record, clip_grad, seed=3):
    up = _upstream(case, record, CELL_STATES if _kind(case) == "cell" else SEQUENCE_STATES,
                   seed)
    return _fields(_grads_at(case, record, up, "cpu", clip_grad))


@pytest.mark.parametrize("kind", ["cell", "sequence"])
@pytest.mark.parametrize("carry", CARRIES)
def test_straight_through_equals_exact_without_an_active_clip(kind, carry):
    rng = np.random.default_rng(40)
    make = lstm_cell_case if kind == "cell" else lstm_sequence_case
    case = make(rng, peephole=True, layer_norm=True, ln_carry=carry)
    record = _forward(case, "cpu")
    exact, through = _vjp(case, record, "exact"), _vjp(case, record, "straight_through")
    for name in exact:
        np.testing.assert_array_equal(through[name], exact[name], err_msg=name)


@pytest.mark.parametrize("kind", ["cell", "sequence"])
@pytest.mark.parametrize("carry", CARRIES)
def test_straight_through_differs_where_the_cell_clip_is_active(kind, carry):
    rng = np.random.default_rng(41)
    make = lstm_cell_case if kind == "cell" else lstm_sequence_case
    case = make(rng, hidden=6, peephole=True, clip=True, layer_norm=True, ln_carry=carry)
    assert case["cell_clip"] is not None
    record = _forward(case, "cpu")
    exact, through = _vjp(case, record, "exact"), _vjp(case, record, "straight_through")
    # dγ_c is taken before the clip's mask: in a cell it cannot differ, in a sequence the
    # steps before see the masked gradient.
    differ = ("w", "layer_norm.gamma_x") + (() if kind == "cell" else ("layer_norm.gamma_c",))
    for name in differ:
        assert not np.allclose(exact[name], through[name]), name
    for clip_grad, mine in (("exact", exact), ("straight_through", through)):
        up = _upstream(case, record,
                       CELL_STATES if kind == "cell" else SEQUENCE_STATES, 3)
        want = _fields(_grads_at(case, record, up, "reference", clip_grad))
        for name, value in want.items():
            assert_float64_agrees(mine[name], value, f"{clip_grad}: {name}")


# --- purity, read-only inputs ----------------------------------------------------------------

def _copies(tree):
    return {k: (LSTMNorm(*(a.copy() for a in v)) if isinstance(v, LSTMNorm)
                else v.copy() if isinstance(v, np.ndarray) else v) for k, v in tree.items()}


def _assert_same(a, b):
    for name in a:
        if isinstance(a[name], LSTMNorm):
            for x, y in zip(a[name], b[name], strict=True):
                np.testing.assert_array_equal(x, y, err_msg=name)
        elif isinstance(a[name], np.ndarray):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _read_only(tree):
    def frozen(a):
        a = a.copy()
        a.flags.writeable = False
        return a
    return {k: (LSTMNorm(*map(frozen, v)) if isinstance(v, LSTMNorm)
                else frozen(v) if isinstance(v, np.ndarray) else v) for k, v in tree.items()}


@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_inputs_are_never_modified(kind):
    rng = np.random.default_rng(50)
    make = lstm_cell_case if kind == "cell" else lstm_sequence_case
    extra = {} if kind == "cell" else {"ragged": True}
    for k, carry in enumerate(CARRIES * 2):
        case = make(rng, hidden=17, peephole=True, clip=True, proj_size=(None, 4)[k // 2],
                    proj_clip=k >= 2, layer_norm=True, ln_carry=carry, **extra)
        before = _copies(case)
        record = _forward(case, "cpu")
        saved = [a.copy() for a in record]
        up = _upstream(case, record, CELL_STATES + SEQUENCE_STATES, k)
        kept = _copies(up)
        for clip_grad in CLIP_GRADS:
            _grads_at(case, record, up, "cpu", clip_grad)
        _assert_same(before, case)
        _assert_same(kept, up)
        for a, b in zip(record, saved, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_read_only_inputs_are_accepted(kind):
    """Nothing is written to any input: NumPy would raise on a write to these."""
    rng = np.random.default_rng(51)
    make = lstm_cell_case if kind == "cell" else lstm_sequence_case
    case = _read_only(make(rng, hidden=18, peephole=True, clip=True, layer_norm=True,
                           ln_carry="normalized"))
    record = _forward(case, "cpu")
    for a in record:
        a.flags.writeable = False
    up = _read_only(_upstream(case, record, CELL_STATES + SEQUENCE_STATES))
    got = _fields(_grads_at(case, record, up, "cpu", "exact"))
    want = _fields(_grads_at(case, record, up, "reference", "exact"))
    for name, value in want.items():
        assert_float64_agrees(got[name], value, name)


# --- empty sizes -----------------------------------------------------------------------------

EMPTY_CELLS = [(0, 3, 4), (2, 0, 17), (0, 0, 4)]                  # (B, I, H)
EMPTY_SEQUENCES = [(0, 3, 3, 4), (3, 0, 3, 4), (3, 2, 0, 17), (0, 0, 0, 5)]   # (T, B, I, H)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("carry", CARRIES)
def test_empty_sizes(dtype, carry):
    """B = 0, T = 0 and I = 0 (for I = 0 the rows still have values, through h_prev): the
    reference's shapes, dtypes and values, every gradient field included."""
    rng = np.random.default_rng(60)
    options = {"peephole": True, "layer_norm": True, "ln_carry": carry, "dtype": dtype}
    cases = [lstm_cell_case(rng, batch=b, input_size=i, hidden=h, **options)
             for b, i, h in EMPTY_CELLS]
    cases += [lstm_sequence_case(rng, steps=t, batch=b, input_size=i, hidden=h, ragged=True,
                                 **options) for t, b, i, h in EMPTY_SEQUENCES]
    check = _check_float64 if dtype == np.float64 else _check_float32
    for case in cases:
        names = CELL_STATES if _kind(case) == "cell" else SEQUENCE_STATES
        check(case, names, "exact")
        grads = _grads_at(case, _forward(case, "cpu"), _upstream(case, _forward(case, "cpu"),
                                                                 names), "cpu", "exact")
        assert grads.layer_norm is not None
        for mine, given_ in zip(grads.layer_norm, case["layer_norm"], strict=True):
            assert mine.shape == given_.shape and mine.dtype == dtype


# --- the hot loops are SIMD ------------------------------------------------------------------

LN_KERNELS = {   # kernel -> a packed instruction its main loop has (see test_cpu_backend.py)
    _lstm_kernels.lstm_ln_forward_kernel: "vdiv",
    _lstm_kernels.lstm_ln_backward_kernel: "vsub",
    _lstm_kernels.layer_norm_forward_kernel: "vmul",
    _lstm_kernels.layer_norm_stats_kernel: "vmul",
    _lstm_kernels.layer_norm_grad_kernel: "vsub",
}


@pytest.mark.skipif(not host_has_avx(), reason="the check looks for AVX (ymm/zmm) registers")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hot_loops_use_vector_registers(dtype):
    rng = np.random.default_rng(70)
    case = lstm_sequence_case(rng, steps=3, batch=2, input_size=3, hidden=17, dtype=dtype,
                              peephole=True, clip=True, layer_norm=True)
    record = _forward(case, "cpu")
    _grads_at(case, record, _upstream(case, record, SEQUENCE_STATES), "cpu", "exact")
    assert_packed(LN_KERNELS, dtype)


def _strided(a):
    """A read-only view with the same values, strided in its last axis (neither C- nor
    Fortran-contiguous once it has two columns)."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    view = wide[..., ::2]
    view.flags.writeable = False
    return view


@pytest.mark.parametrize("layout", ["strided", "fortran"])
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_inputs_in_any_layout(layout, kind):
    """Every layout of the arrays (the layer norm's included), the saved results and the
    upstream gradients gives the contiguous inputs' results."""
    change = _strided if layout == "strided" else np.asfortranarray

    def odd(tree):
        return {k: (LSTMNorm(*map(change, v)) if isinstance(v, LSTMNorm)
                    else change(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                    else v) for k, v in tree.items()}

    rng = np.random.default_rng(52)
    make = lstm_cell_case if kind == "cell" else lstm_sequence_case
    extra = {} if kind == "cell" else {"ragged": True}
    case = make(rng, hidden=18, peephole=True, clip=True, proj_size=5, layer_norm=True,
                ln_carry="normalized", **extra)
    record = _forward(case, "cpu")
    up = _upstream(case, record, CELL_STATES + SEQUENCE_STATES)
    want = {**_fields(record), **{f"d{n}": v for n, v in
                                  _fields(_grads_at(case, record, up, "cpu", "exact")).items()}}
    odd_record = type(record)(*map(change, record))
    got = {**_fields(_forward(odd(case), "cpu")),
           **{f"d{n}": v for n, v in _fields(_grads_at(odd(case), odd_record, odd(up), "cpu",
                                                       "exact")).items()}}
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-13, atol=1e-14, err_msg=name)
