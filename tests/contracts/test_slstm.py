"""xLSTM's sLSTM (docs/spec.md §19): what is the sLSTM's own, beyond the contracts every op
owes (those run over ``gradcells.cells.OPS`` and pick the cell up by themselves).

- every input's gradient against float64 finite differences (the oracle) under a random
  loss on every field of the result, both forget gates, with heads, on every NumPy backend;
- ``stabilizer_grad``: "exact" and "stop" agree on a loss on ``h`` alone for every input
  but ``m0`` and differ on a loss on the returned state, where "exact" is the one the
  finite differences confirm;
- the forward mode and the second order against finite differences;
- a float64 transcription of the math into plain PyTorch, differentiated by
  ``torch.autograd`` (``m`` detached for "stop"), equal to the reference's forward and
  gradients;
- the backends agree with lengths, the reverse direction, masks and both layouts;
- bad input named;
- the GPU's CUDA kernels, run on the host (``tests/cuda_host``), against the float64
  reference in float64, float32 and float16.
"""

from __future__ import annotations

import contract_cases
import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from contract_cases import EMULATED_GPU, fixed_case

import gradcells as gc
from gradcells.gpu import _kernels, _launch
from gradcells.testing import (
    grad_jvp_check,
    jvp_check,
    slstm_cell_case,
    slstm_sequence_case,
    vjp_check,
)

STATES = ("c0", "n0", "m0", "h0")
ARRAYS = ("x", *STATES, "w", "r", "b")
FIELDS = gc.SLSTMSequence._fields
FORGETS = ("sigmoid", "exp")


def _sequence(rng, **options):
    return slstm_sequence_case(rng, steps=4, batch=3, input_size=3, hidden=4, heads=2,
                               **options)


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("forget", FORGETS)
def test_every_gradient_equals_finite_differences_under_every_field(forget, backend):
    """A random cotangent on every field (per-step and final) of the cell and the sequence
    (ragged, with masks), float64, to about 1e-8."""
    rng = np.random.default_rng(30)
    cases = {"slstm_cell": slstm_cell_case(rng, batch=3, input_size=3, hidden=4, heads=2,
                                           forget=forget),
             "slstm_sequence": _sequence(rng, forget=forget, ragged=True, masks=True)}
    for op, case in cases.items():
        report = vjp_check(op, case, backend=backend)
        assert report.passed, f"\n{op}\n{report}"
        assert {c.name for c in report.checks} == set(gc.cells.OPS[op].arrays)
        assert report.max_abs_error < 1e-8, op


def _grads(case, backend="reference", **upstream):
    seq = gc.slstm_sequence(**case, backend=backend)
    return seq, gc.slstm_sequence_grad(**{k: case[k] for k in ARRAYS}, seq=seq, **upstream,
                                       backend=backend)


@pytest.mark.parametrize("forget", FORGETS)
def test_stop_equals_exact_on_h_losses_but_for_m0(forget):
    """``m`` cancels in ``h``: on a loss on ``h`` and ``h_final`` the two conventions give
    the same gradients of every input but ``m0``, which "stop" sets to zero and the
    oracle confirms is not."""
    rng = np.random.default_rng(31)
    case = _sequence(rng, forget=forget, ragged=True)
    seq = gc.slstm_sequence(**case)
    up = {"d_h": rng.standard_normal(seq.h.shape),
          "d_h_final": rng.standard_normal(seq.h_final.shape)}
    _, exact = _grads(case, **up)
    _, stop = _grads({**case, "stabilizer_grad": "stop"}, **up)
    for name in ARRAYS:
        if name == "m0":
            assert not stop.m0.any() and np.abs(exact.m0).max() > 1e-3
        else:
            np.testing.assert_allclose(stop[ARRAYS.index(name)], exact[ARRAYS.index(name)],
                                       rtol=1e-12, atol=1e-13, err_msg=name)
    report = vjp_check("slstm_sequence", case, outputs=("h", "h_final"))
    assert report.passed and report["m0"].passed, f"\n{report}"
    stopped = vjp_check("slstm_sequence", {**case, "stabilizer_grad": "stop"},
                        outputs=("h", "h_final"))
    assert all(c.passed for c in stopped.checks if c.name != "m0"), f"\n{stopped}"
    assert not stopped["m0"].passed


@pytest.mark.parametrize("forget", FORGETS)
def test_stop_differs_from_exact_on_state_losses_where_exact_is_right(forget):
    """A loss on the returned state (truncated BPTT carrying ``c, n, m``): "stop" is not the
    derivative, "exact" is."""
    rng = np.random.default_rng(32)
    case = _sequence(rng, forget=forget)
    outputs = ("c_final", "n_final", "m_final")
    assert vjp_check("slstm_sequence", case, outputs=outputs).passed
    stop = vjp_check("slstm_sequence", {**case, "stabilizer_grad": "stop"}, outputs=outputs)
    assert not any(stop[name].passed for name in ("x", "w", "b", "m0")), f"\n{stop}"


@pytest.mark.parametrize("backend", NUMPY_BACKENDS)
@pytest.mark.parametrize("forget", FORGETS)
def test_forward_mode_and_second_order_equal_finite_differences(forget, backend):
    rng = np.random.default_rng(33)
    cases = {"slstm_cell": slstm_cell_case(rng, batch=2, input_size=3, hidden=4, heads=2,
                                           forget=forget),
             "slstm_sequence": _sequence(rng, forget=forget, ragged=True, masks=True,
                                         reverse=True)}
    for op, case in cases.items():
        for check in (jvp_check, grad_jvp_check):
            report = check(op, case, backend=backend)
            assert report.passed, f"\n{op} {check.__name__}\n{report}"


# --------------------------------------------------------------------------------------
# A float64 transcription into plain PyTorch, differentiated by autograd


def _torch_sequence(torch, a, forget, stop):
    """The sLSTM over time, written out in torch from docs/spec.md §19 (no gradcells)."""
    x, c, n, m, h, w, r, b = (a[k] for k in ARRAYS)
    n_heads, d = r.shape[0], r.shape[1]
    hidden = n_heads * d
    out = {k: [] for k in FIELDS[:8]}
    for t in range(x.shape[0]):
        rec = torch.zeros(x.shape[1], 4 * hidden, dtype=x.dtype)
        for k in range(n_heads):
            part = h[:, k * d:(k + 1) * d] @ r[k]
            for g in range(4):
                rec[:, g * hidden + k * d:g * hidden + (k + 1) * d] = part[:, g * d:(g + 1) * d]
        it, ft, zt, ot = (x[t] @ w + rec + b).split(hidden, dim=1)
        lf = torch.nn.functional.logsigmoid(ft) if forget == "sigmoid" else ft
        m_new = torch.maximum(it, lf + m)
        if stop:
            m_new = m_new.detach()
            i, f = torch.exp(it - m_new), torch.exp(lf + m.detach() - m_new)
        else:
            i, f = torch.exp(it - m_new), torch.exp(lf + m - m_new)
        z, o = torch.tanh(zt), torch.sigmoid(ot)
        c, n, m = f * c + i * z, f * n + i, m_new
        h = o * c / n
        for k, v in zip(FIELDS[:8], (i, f, z, o, c, n, m, h), strict=True):
            out[k].append(v)
    return {**{k: torch.stack(v) for k, v in out.items()},
            "c_final": c, "n_final": n, "m_final": m, "h_final": h}


@pytest.mark.parametrize("stabilizer_grad", ["exact", "stop"])
@pytest.mark.parametrize("forget", FORGETS)
def test_a_torch_autograd_transcription_agrees(forget, stabilizer_grad):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(34)
    case = _sequence(rng, forget=forget, stabilizer_grad=stabilizer_grad)
    tensors = {k: torch.tensor(case[k], requires_grad=True) for k in ARRAYS}
    fields = _torch_sequence(torch, tensors, forget, stabilizer_grad == "stop")
    seq = gc.slstm_sequence(**case, backend="reference")
    up = {k: rng.standard_normal(getattr(seq, k).shape) for k in FIELDS}
    loss = sum((fields[k] * torch.tensor(up[k])).sum() for k in FIELDS)
    expected = torch.autograd.grad(loss, [tensors[k] for k in ARRAYS], allow_unused=True)
    for backend in NUMPY_BACKENDS:
        seq, grads = _grads(case, backend, **{f"d_{k}": v for k, v in up.items()})
        for k in FIELDS:
            np.testing.assert_allclose(getattr(seq, k), fields[k].detach().numpy(),
                                       rtol=1e-12, atol=1e-12, err_msg=f"{backend} {k}")
        for k, g in zip(ARRAYS, expected, strict=True):
            want = np.zeros_like(case[k]) if g is None else g.numpy()
            np.testing.assert_allclose(getattr(grads, k), want, rtol=1e-10, atol=1e-11,
                                       err_msg=f"{backend} d{k}")


# --------------------------------------------------------------------------------------
# The backends and the orders


def _reversed_rows(a, lengths):
    """Each row's first ``L_b`` steps of ``[T, B, ·]`` in reverse, the rest in place."""
    t = np.arange(a.shape[0])[:, None]
    rows = np.where(t < lengths, lengths - 1 - t, t)
    return a[rows, np.arange(a.shape[1])[None, :]]


@pytest.mark.parametrize("stabilizer_grad", ["exact", "stop"])
def test_the_reverse_direction_runs_each_rows_valid_steps_backwards(stabilizer_grad):
    """On every backend: ``reverse=True`` with lengths is the forward run of each row's
    valid steps reversed (docs/spec.md §11.1), and its gradient that run's gradient."""
    rng = np.random.default_rng(35)
    case = _sequence(rng, ragged=True, stabilizer_grad=stabilizer_grad, forget="exp")
    lengths = case["seq_len"]
    forward = gc.slstm_sequence(**case, backend="reference")
    up = {f"d_{k}": rng.standard_normal(getattr(forward, k).shape) for k in FIELDS}
    want = gc.slstm_sequence_grad(**{k: case[k] for k in ARRAYS}, seq=forward, **up)
    flipped = {**case, "x": _reversed_rows(case["x"], lengths), "reverse": True}
    for backend in NUMPY_BACKENDS:
        run = gc.slstm_sequence(**flipped, backend=backend)
        for k in FIELDS:
            got = getattr(run, k)
            np.testing.assert_allclose(_reversed_rows(got, lengths) if got.ndim == 3 else got,
                                       getattr(forward, k), rtol=1e-13, atol=1e-13,
                                       err_msg=f"{backend} {k}")
        grads = gc.slstm_sequence_grad(
            **{k: flipped[k] for k in ARRAYS}, seq=run, backend=backend,
            **{k: _reversed_rows(v, lengths) if v.ndim == 3 else v for k, v in up.items()})
        for k in ARRAYS:
            got = getattr(grads, k)
            np.testing.assert_allclose(_reversed_rows(got, lengths) if k == "x" else got,
                                       getattr(want, k), rtol=1e-12, atol=1e-13,
                                       err_msg=f"{backend} d{k}")


@pytest.mark.parametrize("stabilizer_grad", ["exact", "stop"])
def test_every_backend_agrees_with_the_reference(stabilizer_grad):
    """Every mode, lengths, masks, reverse and batch-first, the "stop" convention too (the
    contracts' drawn cases are "exact")."""
    rng = np.random.default_rng(36)
    case = _sequence(rng, ragged=True, masks=True, reverse=True, batch_first=True,
                     stabilizer_grad=stabilizer_grad)
    arrays = {k: case[k] for k in ARRAYS}
    runs = {}
    for backend in NUMPY_BACKENDS:
        seq = gc.slstm_sequence(**case, backend=backend)
        up = {f"d_{k}": np.random.default_rng(1).standard_normal(getattr(seq, k).shape)
              for k in FIELDS}
        tangents = gc.SLSTMSequenceGrads(*(np.random.default_rng(2).standard_normal(
            case[k].shape) for k in ARRAYS))
        runs[backend] = (
            seq, gc.slstm_sequence_grad(**arrays, seq=seq, **up, backend=backend),
            *gc.slstm_sequence_jvp(**case, tangents=tangents, backend=backend),
            *gc.slstm_sequence_grad_jvp(**arrays, seq=seq, tangents=tangents, **up,
                                        backend=backend))
    for backend, results in runs.items():
        for result, want in zip(results, runs["reference"], strict=True):
            for k, a, b in zip(want._fields, result, want, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13,
                                           err_msg=f"{backend} {k}")


# --------------------------------------------------------------------------------------
# Bad input


def test_bad_input_is_named():
    rng = np.random.default_rng(37)
    case = slstm_cell_case(rng, batch=2, input_size=3, hidden=4, heads=2)
    r = case["r"]
    bad = [
        ({"r": r.reshape(4, 1, 8)[:3]}, ValueError, r"r must have shape \[N, H/N, 4H/N\] "
                                                     r"with N >= 1 heads dividing H = 4"),
        ({"r": r[0]}, ValueError, r"r must be a 3-D array \[N, H/N, 4H/N\]"),
        ({"r": r[:, :, :4]}, ValueError, r"r must have shape \[N, H/N, 4H/N\] = \(2, 2, 8\)"),
        ({"r": np.zeros((0, 2, 8))}, ValueError, r"N >= 1 heads"),
        ({"w": case["w"][:, :8]}, ValueError, r"w must have shape \[I, 4H\]"),
        ({"b": case["b"][:4]}, ValueError, r"b must have shape \[4H\]"),
        ({"n_prev": case["n_prev"][:, :2]}, ValueError, r"n_prev must have shape \[B, H\]"),
        ({"m_prev": case["m_prev"].astype(np.float32)}, TypeError, r"m_prev must have the "
                                                                   r"same dtype"),
        ({"c_prev": None}, TypeError, r"c_prev must be an array"),
        ({"forget": "relu"}, ValueError, r"forget"),
        ({"stabilizer_grad": "detach"}, ValueError, r"stabilizer_grad"),
    ]
    for change, error, pattern in bad:
        spoiled = {**case, **change}
        before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
        with pytest.raises(error, match=pattern):
            gc.slstm_cell(**spoiled)
        for k, v in before.items():
            np.testing.assert_array_equal(case[k], v)
    state = gc.slstm_cell(**case)
    arrays = {k: case[k] for k in ("x", "c_prev", "n_prev", "m_prev", "h_prev", "w", "r", "b")}
    with pytest.raises(ValueError, match=r"forget='exp' contradicts the forward's forget"):
        gc.slstm_cell_grad(**arrays, state=state, forget="exp")
    with pytest.raises(ValueError, match=r"stabilizer_grad='stop' contradicts"):
        gc.slstm_cell_grad(**arrays, state=state, stabilizer_grad="stop")


# --------------------------------------------------------------------------------------
# The GPU's kernels on the host (tests/cuda_host), against the float64 reference


TINY = _kernels.LaunchPolicy(block=3, max_grid=2, rows_per_part=2, min_threads=1 << 30)
"""Tiny blocks and grids: every grid-stride loop wraps."""


def _assert_near(actual, expected, dtype, what):
    """Each field within 16 eps(dtype) of the float64 reference, relative to its size (the
    emulation tests' bound)."""
    tolerance = 16 * np.finfo(dtype).eps
    for field, a, e in zip(expected._fields, actual, expected, strict=True):
        assert a.dtype == np.dtype(dtype) and a.shape == e.shape, f"{what}{field}"
        if e.size:
            error = np.max(np.abs(a.astype(np.float64) - e))
            assert error <= tolerance * (1 + np.max(np.abs(e))), (
                f"{what}{field}: max error {error:.3g} ({error / np.finfo(dtype).eps:.1f} eps)")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize(("forget", "stabilizer_grad"),
                         [("sigmoid", "exact"), ("exp", "stop")])
@pytest.mark.parametrize("name", ["cpu", EMULATED_GPU])
def test_the_fused_kernels_match_the_reference(name, forget, stabilizer_grad, dtype):
    """The CPU's Numba passes and the GPU's CUDA kernels (run on the host, at tiny launch
    shapes: every grid-stride loop wraps), cell and sequence (ragged, masks): the forward,
    the gradient under a cotangent on every field, the forward mode and the second order,
    against the float64 reference at the same rounded inputs (the gradients at the
    backend's forward). Float16 is the GPU's only."""
    if dtype == np.float16 and name == "cpu":
        pytest.skip("float16 reaches the CPU backend as float32 (the public layer widens it)")
    rng = np.random.default_rng(38)
    options = {"forget": forget, "stabilizer_grad": stabilizer_grad, "heads": 2}
    ops = {"slstm_cell": fixed_case("slstm_cell", rng, steps=0, batch=3, input_size=3,
                                    hidden=4, **options),
           "slstm_sequence": fixed_case("slstm_sequence", rng, steps=4, batch=3,
                                        input_size=3, hidden=4, ragged=True, masks=True,
                                        **options)}
    for op, case64 in ops.items():
        case = _cast(case64, dtype)
        case64 = _cast(case, np.float64)
        tangents = contract_cases.tangents(op, case, rng)
        with contract_cases.calls(name) as c:
            saved = _launch.use_runtime(type(_launch.runtime())(TINY)) if name != "cpu" else None
            try:
                result = c.forward(op, case)
                up = {f"d_{k}": rng.standard_normal(getattr(result, k).shape).astype(dtype)
                      for k in result._fields}
                grads, pair = c.grad(op, case, result, **up), c.jvp(op, case, tangents)
                second = c.grad_jvp(op, case, result, tangents, **up)
            finally:
                if saved is not None:
                    _launch.use_runtime(saved)
        with contract_cases.calls("reference") as ref:
            _assert_near(result, ref.forward(op, case64), dtype, f"{op} forward ")
            _assert_near(grads, ref.grad(op, case64, _cast(result, np.float64),
                                         **_cast(up, np.float64)), dtype, f"{op} gradient ")
            want = ref.jvp(op, case64, _cast(tangents, np.float64))
            for got, expected in zip(pair, want, strict=True):
                _assert_near(got, expected, dtype, f"{op} forward mode ")
            want = ref.grad_jvp(op, case64, _cast(result, np.float64),
                                _cast(tangents, np.float64), **_cast(up, np.float64))
            for got, expected in zip(second, want, strict=True):
                _assert_near(got, expected, dtype, f"{op} second order ")


def _cast(value, dtype):
    """The float arrays of a case dict or a NamedTuple in ``dtype``."""
    def cast(v):
        return v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
    if isinstance(value, dict):
        return {k: cast(v) for k, v in value.items()}
    return type(value)(*map(cast, value))
