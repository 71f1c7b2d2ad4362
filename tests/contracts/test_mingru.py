"""What is the minGRU's own (docs/spec.md §18.2): its formula, its two methods as one
function, its gradients against finite differences and a float64 PyTorch autograd
transcription, its named errors. The contracts every cell owes (purity, empty sizes,
padding, every field) run it through ``tests/contract_cases.py``."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells import testing
from gradcells.cells.mingru import reference as ref
from gradcells.cpu import _scan as cpu_scan

ACTIVATIONS = ("g", "identity")
BACKENDS = ("reference", "cpu")


def _case(seed, activation="g", *, steps=5, batch=3, hidden=4, dtype=np.float64, **kw):
    return testing.mingru_sequence_case(np.random.default_rng(seed), steps=steps, batch=batch,
                                        input_size=3, hidden=hidden, dtype=dtype,
                                        activation=activation, **kw)


def _arrays(case):
    return case["x"], case["h0"], case["w"], case["b"]


def _settings(case):
    return {k: case[k] for k in ("activation", "method", "seq_len", "reverse", "batch_first")
            if k in case}


# --------------------------------------------------------------------------------------
# the formula


def _by_hand(x, h0, w, b, activation):
    """The paper's recurrence, one step at a time, in plain NumPy (float64)."""
    hidden = h0.shape[1]
    h, out = h0, []
    for x_t in x:
        p = x_t @ w + b
        z = 1 / (1 + np.exp(-p[:, :hidden]))
        v = p[:, hidden:]
        hc = v if activation == "identity" else np.where(v >= 0, v + 0.5,
                                                         1 / (1 + np.exp(-v)))
        h = (1 - z) * h + z * hc
        out.append((z, hc, h))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["sequential", "parallel"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_forward_is_the_papers_recurrence(activation, method, backend):
    case = _case(1, activation)
    seq = gc.mingru_sequence(*_arrays(case), activation=activation, method=method,
                             backend=backend)
    for t, (z, hc, h) in enumerate(_by_hand(*_arrays(case), activation)):
        np.testing.assert_allclose(seq.z[t], z, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(seq.hc[t], hc, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(seq.h[t], h, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(seq.h_final, seq.h[-1], rtol=0, atol=0)
    assert seq.settings.method == method and seq.settings.activation == activation


def test_the_candidate_activation_is_g():
    v = np.array([-30.0, -1.0, -1e-300, 0.0, 1e-300, 2.0, 1e4])
    g = ref.candidate(np, v, "g")
    np.testing.assert_array_equal(g[3:], v[3:] + 0.5)
    np.testing.assert_allclose(g[:3], 1 / (1 + np.exp(-v[:3])), rtol=0, atol=2e-16)
    assert g[2] == 0.5 and ref.candidate_grad(np, v, g, np.ones(7), "g")[2] == 0.25


# --------------------------------------------------------------------------------------
# the two methods are one function (docs/spec.md §18.1)


def _abs_scan(a, c, h0):
    """The recurrence on ``|a|, |c|, |h0|``: the scale of every h_t's terms."""
    return ref.scan(np, np.abs(a), np.abs(c), np.abs(h0), "sequential")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("steps", [1, 7, 64, 300])
def test_the_parallel_scan_equals_the_sequential_one(steps, dtype):
    """Every h_t within 4 ulp × (⌈log2 T⌉ + 1) of the sequential scan, relative to the
    recurrence on the terms' magnitudes; the reference's Hillis-Steele scan and the CPU's
    chunked scan (chunks of 8 here, so that several chunks run at these lengths)."""
    rng = np.random.default_rng(steps)
    a = rng.uniform(0, 1, (steps, 3, 5)).astype(dtype)
    c = rng.standard_normal((steps, 3, 5)).astype(dtype)
    h0 = rng.standard_normal((3, 5)).astype(dtype)
    sequential = ref.scan(np, a, c, h0, "sequential")
    bound = 4 * np.finfo(dtype).eps * (np.ceil(np.log2(steps)) + 1) * _abs_scan(a, c, h0)
    parallel = ref.scan(np, a, c, h0, "parallel")
    assert np.all(np.abs(parallel - sequential) <= bound)
    chunked, final = np.empty_like(a), np.empty_like(h0)
    rows = (steps, 15)
    cpu_scan.linear_scan_kernel(a.reshape(rows), c.reshape(rows), h0.ravel(), False, False,
                                  8, chunked.reshape(rows), final.ravel())
    assert np.all(np.abs(chunked - sequential) <= bound)
    np.testing.assert_array_equal(final, chunked[-1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", [{}, {"ragged": True}, {"ragged": True, "reverse": True},
                                   {"reverse": True, "batch_first": True}])
def test_both_methods_agree_in_every_mode(order, backend, monkeypatch):
    """Forward, gradient, forward mode and second order of "parallel" equal "sequential"'s
    (float64, 1e-13 relative), with lengths, reverse and batch-first; the CPU's chunks of
    2 steps."""
    monkeypatch.setattr(cpu_scan, "CHUNK", 2)
    case = _case(3, steps=6, **order)
    rng = np.random.default_rng(4)
    runs = {}
    for method in ("sequential", "parallel"):
        kw = {**_settings(case), "method": method}
        seq = gc.mingru_sequence(*_arrays(case), **kw, backend=backend)
        up = {f"d_{f}": rng.standard_normal(getattr(seq, f).shape) for f in seq._fields}
        t = gc.MinGRUSequenceGrads(*(rng.standard_normal(a.shape) for a in _arrays(case)))
        runs[method] = (seq, gc.mingru_sequence_grad(*_arrays(case), seq, **up,
                                                     backend=backend),
                        gc.mingru_sequence_jvp(*_arrays(case), t, **kw, backend=backend)[1],
                        gc.mingru_sequence_grad_jvp(*_arrays(case), seq, t, **up,
                                                    backend=backend)[1])
        rng = np.random.default_rng(4)
    for got, want in zip(runs["parallel"], runs["sequential"], strict=True):
        for name, a, b in zip(got._fields, got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13, err_msg=name)


# --------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["sequential", "parallel"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_gradient_against_finite_differences(activation, method, backend):
    """Every input under a loss on every output field (z, hc, h, h_final), with lengths
    and reverse; the cell step too."""
    case = _case(5, activation, method=method, ragged=True, reverse=True)
    report = testing.vjp_check("mingru_sequence", case, backend=backend)
    assert report.passed, report
    cell = testing.mingru_cell_case(np.random.default_rng(6), activation=activation)
    assert testing.vjp_check("mingru_cell", cell, backend=backend).passed


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forward_mode_and_second_order_against_finite_differences(activation):
    case = _case(7, activation, ragged=True, method="parallel")
    assert testing.jvp_check("mingru_sequence", case, backend="cpu").passed
    assert testing.grad_jvp_check("mingru_sequence", case, backend="cpu").passed
    cell = testing.mingru_cell_case(np.random.default_rng(8), activation=activation)
    assert testing.grad_jvp_check("mingru_cell", cell, backend="reference").passed


def _torch_mingru(x, h0, w, b, activation):
    """The minGRU transcribed in PyTorch, step by step, float64."""
    import torch

    hidden = h0.shape[1]
    h, zs, hcs, hs = h0, [], [], []
    for x_t in x:
        p = x_t @ w + b
        z = torch.sigmoid(p[:, :hidden])
        v = p[:, hidden:]
        hc = v if activation == "identity" else torch.where(v >= 0, v + 0.5, torch.sigmoid(v))
        h = (1 - z) * h + z * hc
        zs.append(z)
        hcs.append(hc)
        hs.append(h)
    return torch.stack(zs), torch.stack(hcs), torch.stack(hs), h


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forward_and_gradients_equal_torch_autograd(activation, backend):
    torch = pytest.importorskip("torch")
    case = _case(9, activation)
    arrays = [torch.tensor(a, requires_grad=True) for a in _arrays(case)]
    outs = _torch_mingru(*arrays, activation)
    seq = gc.mingru_sequence(*_arrays(case), activation=activation, method="parallel",
                             backend=backend)
    rng = np.random.default_rng(10)
    up = [rng.standard_normal(o.shape) for o in outs]
    torch.autograd.backward(outs, [torch.tensor(u) for u in up])
    grads = gc.mingru_sequence_grad(*_arrays(case), seq, **{
        f"d_{f}": u for f, u in zip(seq._fields, up, strict=True)}, backend=backend)
    for name, mine, theirs in zip(seq._fields, seq, outs, strict=True):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=name)
    for name, mine, a in zip(grads._fields, grads, arrays, strict=True):
        np.testing.assert_allclose(mine, a.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)


# --------------------------------------------------------------------------------------
# bad input (docs/spec.md §7)


@pytest.mark.parametrize(("keywords", "error", "match"), [
    ({"method": "scan"}, ValueError, "method must be one of"),
    ({"activation": "tanh"}, ValueError, "activation must be one of"),
    ({"method": 1}, ValueError, "method"),
    ({"seq_len": np.array([9, 0, 1])}, ValueError, "seq_len"),
])
def test_bad_settings_are_named(keywords, error, match):
    with pytest.raises(error, match=match):
        gc.mingru_sequence(*_arrays(_case(11)), **keywords)


def test_bad_shapes_are_named():
    x, h0, w, b = _arrays(_case(12))
    with pytest.raises(ValueError, match="w must"):
        gc.mingru_sequence(x, h0, w[:, :-1], b)
    with pytest.raises(ValueError, match="b must"):
        gc.mingru_sequence(x, h0, w, b[:-2])
    with pytest.raises(ValueError, match="h0"):
        gc.mingru_sequence(x, h0[:, :-1], w, b)
    with pytest.raises(TypeError, match="dtype"):
        gc.mingru_sequence(x, h0.astype(np.float32), w, b)
    with pytest.raises(TypeError, match="method"):
        gc.mingru_cell(x[0], h0, w, b, method="parallel")


def test_a_gradient_given_another_method_is_named():
    case = _case(13)
    seq = gc.mingru_sequence(*_arrays(case), method="parallel")
    with pytest.raises(ValueError, match="method='sequential' contradicts"):
        gc.mingru_sequence_grad(*_arrays(case), seq, method="sequential")


# --------------------------------------------------------------------------------------
# the GPU's kernels, on the host (tests/cuda_host)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_gpu_kernels_equal_the_reference_in_every_mode(activation, dtype):
    """``mingru.cu`` through the host emulation: forward, gradient (every upstream field),
    forward mode and second order, with lengths, against the float64 reference."""
    from contract_cases import EMULATED_GPU, BackendCalls, backend

    case = _case(14, activation, dtype=dtype, ragged=True)
    as64 = {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
            else v for k, v in case.items()}
    rng = np.random.default_rng(15)
    tol = {"rtol": 1e-12, "atol": 1e-13} if dtype == np.float64 else {"rtol": 2e-5,
                                                                        "atol": 2e-6}
    with backend("reference") as impl:
        want = _four_modes(BackendCalls(impl), as64, rng, np.float64)
    with backend(EMULATED_GPU) as impl:
        got = _four_modes(BackendCalls(impl), case, np.random.default_rng(15), dtype)
    for mode, (a_tuple, b_tuple) in enumerate(zip(got, want, strict=True)):
        for name, a, b in zip(a_tuple._fields, a_tuple, b_tuple, strict=True):
            assert a.dtype == dtype, name
            np.testing.assert_allclose(a, b, **tol, err_msg=f"mode {mode}: {name}")


def _four_modes(calls, case, rng, dtype):
    op = "mingru_sequence"
    seq = calls.forward(op, case)
    up = {f"d_{f}": rng.standard_normal(getattr(seq, f).shape).astype(dtype)
          for f in seq._fields}
    t = gc.MinGRUSequenceGrads(*(rng.standard_normal(a.shape).astype(dtype)
                                 for a in _arrays(case)))
    return (seq, calls.grad(op, case, seq, **up), calls.jvp(op, case, t)[1],
            calls.grad_jvp(op, case, seq, t, **up)[1])
