"""The LSTM projection (LSTMP, docs/spec.md §9.1) on every NumPy backend: ``w_proj [H, P]``
and ``proj_clip`` on the cell and the sequence.

- float64 gradients equal central differences (with and without ``proj_clip``, with
  peepholes, ``cell_clip`` and ragged lengths);
- ``clip_grad="straight_through"`` equals the exact gradient where no clip is active and
  differs where the projection clip is;
- the CPU backend equals the reference (float64 to 1e-12, float32 as
  ``tests/contracts/test_cpu_backend.py`` holds it) for P < H, P = H, P > H, P = 1, batch 0, T = 0;
- a sequence equals its cell loop (``gradcells.testing.unrolled``);
- bad input raises ``ValueError``; inputs are never modified.

Parametrized over ``BACKENDS`` so that further backends can join.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend import assert_float32_agrees

import gradcells as gc
from gradcells.testing import (
    lstm_cell_case,
    lstm_cell_vjp_pair,
    lstm_sequence_case,
    lstm_sequence_vjp_pair,
    unrolled,
)

BACKENDS = ["reference", "cpu"]
OTHERS = [b for b in BACKENDS if b != "reference"]
# (steps, batch, input_size, hidden, proj_size): P < H, P = H, P > H, P = 1, B = 0, T = 0
SHAPES = [(4, 3, 4, 5, 3), (3, 2, 3, 4, 4), (3, 3, 2, 3, 6), (5, 4, 3, 6, 1),
          (3, 0, 3, 4, 2), (0, 3, 3, 4, 2), (6, 9, 7, 17, 11)]


def _case(kind, rng, shape, **kw):
    steps, batch, n_in, hidden, proj = shape
    if kind == "cell":
        return lstm_cell_case(rng, batch=batch, input_size=n_in, hidden=hidden,
                              proj_size=proj, **kw)
    return lstm_sequence_case(rng, steps=steps, batch=batch, input_size=n_in, hidden=hidden,
                              proj_size=proj, **kw)


def _pair(kind, case, **kw):
    return (lstm_cell_vjp_pair if kind == "cell" else lstm_sequence_vjp_pair)(case, **kw)


def _vjp_at(kind, case, backend, clip_grad="exact", seed=1):
    """The pair's vjp at the case for one fixed random cotangent, by name."""
    f, vjp, args, names = _pair(kind, case, backend=backend, clip_grad=clip_grad)
    rng = np.random.default_rng(seed)
    ct = tuple(rng.standard_normal(o.shape).astype(o.dtype) for o in f(*args))
    return dict(zip(names, vjp(ct, *args), strict=True))


def _clip_is_active(case, backend):
    kind = "cell" if "cs_prev" in case else "sequence"
    run = gc.lstm_cell if kind == "cell" else gc.lstm_sequence
    unclipped = run(**{**case, "proj_clip": None}, backend=backend).h
    return bool((np.abs(unclipped) > case["proj_clip"]).any())


# --- gradients -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
@pytest.mark.parametrize("proj_clip", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_gradients_equal_central_differences(backend, kind, proj_clip, seed):
    rng = np.random.default_rng(seed)
    shape = SHAPES[seed % 4]
    extra = {} if kind == "cell" else {"ragged": True}
    case = _case(kind, rng, shape, peephole=True, clip=True, proj_clip=proj_clip, **extra)
    f, vjp, args, names = _pair(kind, case, backend=backend)
    assert "w_proj" in names
    report = gc.check_vjp(f, vjp, args, names=names)
    assert report.passed, f"\n{report}"
    assert report.max_abs_error < 1e-8


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_straight_through_equals_exact_without_an_active_clip(backend, kind):
    case = _case(kind, np.random.default_rng(3), SHAPES[0], peephole=True)
    exact = _vjp_at(kind, case, backend)
    through = _vjp_at(kind, case, backend, "straight_through")
    for name in exact:
        np.testing.assert_array_equal(through[name], exact[name], err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_straight_through_differs_where_the_projection_clip_is_active(backend, kind):
    case = _case(kind, np.random.default_rng(4), SHAPES[0], proj_clip=True)
    assert case["proj_clip"] is not None and _clip_is_active(case, backend)
    exact = _vjp_at(kind, case, backend)
    through = _vjp_at(kind, case, backend, "straight_through")
    assert not np.allclose(exact["w_proj"], through["w_proj"])
    assert not np.allclose(exact["w"], through["w"])


# --- the CPU against the reference ---------------------------------------------------------

def _cases(kind, dtype, count=24):
    rng = np.random.default_rng(11 if kind == "cell" else 12)
    for k in range(count):
        extra = {} if kind == "cell" else {"ragged": k % 2 == 0}
        yield k, _case(kind, rng, SHAPES[k % len(SHAPES)], dtype=dtype,
                       peephole=k % 3 != 0, clip=k % 4 < 2, proj_clip=k % 5 < 3,
                       forget_bias=0.5 * (k % 3), **extra)


def _forward(kind, case, backend):
    return (gc.lstm_cell if kind == "cell" else gc.lstm_sequence)(**case, backend=backend)


def _grads_at(kind, case, record, up, backend, clip_grad):
    """The gradient call at a given forward record (so that clip masks are shared)."""
    case = {n: v for n, v in case.items() if n != "forget_bias"}
    if kind == "cell":
        return gc.lstm_cell_grad(**case, state=record, **up, clip_grad=clip_grad,
                                 backend=backend)
    return gc.lstm_sequence_grad(**case, seq=record, **up, clip_grad=clip_grad,
                                 backend=backend)


def _upstream(kind, record, seed):
    rng = np.random.default_rng(seed)
    names = ("h", "cs") if kind == "cell" else ("h", "cs", "h_final", "cs_final")
    return {f"d_{n}": rng.standard_normal(getattr(record, n).shape).astype(
        getattr(record, n).dtype) for n in names}


def _as64(tree):
    return {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
            else v for k, v in tree.items()}


def _fields(result):
    return {n: v for n, v in result._asdict().items() if v is not None}


@pytest.mark.parametrize("backend", OTHERS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
@pytest.mark.parametrize("clip_grad", ["exact", "straight_through"])
def test_agrees_with_reference_float64(backend, kind, clip_grad):
    for k, case in _cases(kind, np.float64):
        want = _forward(kind, case, "reference")
        got = _forward(kind, case, backend)
        up = _upstream(kind, want, k)
        want_g = _grads_at(kind, case, want, up, "reference", clip_grad)
        got_g = _grads_at(kind, case, got, up, backend, clip_grad)
        assert got_g.w_proj is not None
        expected_all = {**_fields(want), **{f"d{n}": v for n, v in _fields(want_g).items()}}
        actual_all = {**_fields(got), **{f"d{n}": v for n, v in _fields(got_g).items()}}
        assert actual_all.keys() == expected_all.keys()
        for name, expected in expected_all.items():
            actual = actual_all[name]
            assert actual.shape == expected.shape, (k, name)
            scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
            np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12 * scale,
                                       err_msg=f"case {k}: {name}")


@pytest.mark.parametrize("backend", OTHERS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
@pytest.mark.parametrize("clip_grad", ["exact", "straight_through"])
def test_agrees_with_reference_float32(backend, kind, clip_grad):
    for k, case in _cases(kind, np.float32):
        ref32 = _forward(kind, case, "reference")
        exact = _forward(kind, _as64(case), "reference")
        got = _forward(kind, case, backend)
        for name, value in _fields(got).items():
            assert_float32_agrees(value, getattr(ref32, name), getattr(exact, name),
                                  f"case {k}: {name}")
        up = _upstream(kind, ref32, k)
        record64 = type(ref32)(*(a.astype(np.float64) for a in ref32))
        want_g = _grads_at(kind, case, ref32, up, "reference", clip_grad)
        got_g = _grads_at(kind, case, ref32, up, backend, clip_grad)
        exact_g = _grads_at(kind, _as64(case), record64, _as64(up), "reference", clip_grad)
        for name, value in _fields(got_g).items():
            assert_float32_agrees(value, getattr(want_g, name), getattr(exact_g, name),
                                  f"case {k}: d{name}")


# --- the sequence against its cell loop ----------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("proj_clip", [False, True])
def test_sequence_equals_its_cell_loop(backend, proj_clip):
    rng = np.random.default_rng(21)
    for k, shape in enumerate(SHAPES):
        case = _case("sequence", rng, shape, peephole=True, clip=True, proj_clip=proj_clip,
                     ragged=k % 2 == 0)
        seq = gc.lstm_sequence(**case, backend=backend)
        arrays = ("x", "cs0", "h0", "w", "b")
        run = unrolled.lstm_forward(*(case[n] for n in arrays),
                                    **{n: v for n, v in case.items() if n not in arrays},
                                    backend=backend)
        for name, value in run.outputs.items():
            np.testing.assert_allclose(getattr(seq, name), value, rtol=1e-12, atol=1e-13,
                                       err_msg=f"{k}: {name}")
        up = _upstream("sequence", seq, k)
        grads = _grads_at("sequence", case, seq, up, backend, "exact")
        loop = unrolled.lstm_backprop(run, **up)
        assert set(loop) == {n for n, v in grads._asdict().items() if v is not None}
        for name, value in loop.items():
            np.testing.assert_allclose(getattr(grads, name), value, rtol=1e-11, atol=1e-12,
                                       err_msg=f"{k}: d{name}")


# --- bad input, purity ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_bad_input_raises(backend, kind):
    case = _case(kind, np.random.default_rng(5), SHAPES[0], proj_clip=True)
    h_name = "h_prev" if kind == "cell" else "h0"
    forward = gc.lstm_cell if kind == "cell" else gc.lstm_sequence
    bad = [{"w_proj": case["w_proj"][:, :-1]}, {"w_proj": case["w_proj"][:-1]},
           {"w_proj": case["w_proj"][0]}, {h_name: case[h_name][:, :-1]},
           {"proj_clip": np.inf}, {"proj_clip": np.nan}]
    for change in bad:
        with pytest.raises(ValueError):
            forward(**{**case, **change}, backend=backend)
    with pytest.raises(ValueError, match="proj_clip clips the projection"):
        forward(**{**_case(kind, np.random.default_rng(5), SHAPES[1]), "w_proj": None,
                   "proj_clip": 1.0}, backend=backend)
    case = _case(kind, np.random.default_rng(6), SHAPES[1], proj_clip=True)     # P = H
    record = forward(**case, backend=backend)
    up = _upstream(kind, record, 0)
    with pytest.raises(ValueError, match="the forward ran with projection"):
        _grads_at(kind, {**case, "w_proj": None, "proj_clip": None}, record, up, backend,
                  "exact")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_inputs_are_never_modified(backend, kind):
    for k, case in _cases(kind, np.float64, count=6):
        before = {n: v.copy() for n, v in case.items() if isinstance(v, np.ndarray)}
        record = _forward(kind, case, backend)
        up = _upstream(kind, record, k)
        kept = {n: v.copy() for n, v in up.items()}
        saved = [a.copy() for a in record]
        for clip_grad in ("exact", "straight_through"):
            _grads_at(kind, case, record, up, backend, clip_grad)
        for name, value in before.items():
            np.testing.assert_array_equal(case[name], value, err_msg=name)
        for name, value in kept.items():
            np.testing.assert_array_equal(up[name], value, err_msg=name)
        for a, b in zip(record, saved, strict=True):
            np.testing.assert_array_equal(a, b)
