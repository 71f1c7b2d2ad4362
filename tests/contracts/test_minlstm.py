"""What is the minLSTM's own (docs/spec.md §18.2): its formula (the normalised gates
stable for any pre-activations), its two methods as one function, its gradients against
finite differences and a float64 PyTorch autograd transcription, its named errors. The
contracts every cell owes (purity, empty sizes, padding, every field) run it through
``tests/contract_cases.py``."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells import testing
from gradcells.cpu import _scan as cpu_scan

ACTIVATIONS = ("g", "identity")
BACKENDS = ("reference", "cpu")


def _case(seed, activation="g", *, steps=5, batch=3, hidden=4, dtype=np.float64, **kw):
    return testing.minlstm_sequence_case(np.random.default_rng(seed), steps=steps, batch=batch,
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
    """The paper's recurrence, one step at a time, in plain NumPy (float64): the gates
    normalised as written, ``f/(f+i)``."""
    hidden = h0.shape[1]
    h, out = h0, []
    for x_t in x:
        p = x_t @ w + b
        f, i = (1 / (1 + np.exp(-p[:, k * hidden:(k + 1) * hidden])) for k in (0, 1))
        v = p[:, 2 * hidden:]
        hc = v if activation == "identity" else np.where(v >= 0, v + 0.5,
                                                         1 / (1 + np.exp(-v)))
        f_n, i_n = f / (f + i), i / (f + i)
        h = f_n * h + i_n * hc
        out.append((f_n, i_n, hc, h))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["sequential", "parallel"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_forward_is_the_papers_recurrence(activation, method, backend):
    case = _case(1, activation)
    seq = gc.minlstm_sequence(*_arrays(case), activation=activation, method=method,
                              backend=backend)
    for t, want in enumerate(_by_hand(*_arrays(case), activation)):
        for name, got, w in zip(("f", "i", "hc", "h"), seq[:4], want, strict=True):
            np.testing.assert_allclose(got[t], w, rtol=1e-13, atol=1e-15, err_msg=name)
    np.testing.assert_allclose(seq.h_final, seq.h[-1], rtol=0, atol=0)
    assert seq.settings.method == method and seq.settings.activation == activation


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_normalised_gates_are_finite_and_exact_at_extreme_preactivations(dtype, backend):
    """``f' = f/(f+i)`` where ``f + i`` underflows or its terms lose every digit: both very
    negative (the ratio of the exponentials: ``f' = σ(p_f - p_i)``), one very positive,
    both very positive (0.5); no floating-point warning; ``f' = 1 - i'`` bitwise."""
    p_f = np.array([-1000.0, -1000.0, -800.0, 1000.0, 1000.0, -60.0, 40.0, 0.0])
    p_i = np.array([-1000.0, -1002.0, -798.0, -1000.0, 1000.0, 60.0, -40.0, 0.0])
    want_f = np.array([0.5, 1 / (1 + np.exp(-2.0)), 1 / (1 + np.exp(2.0)), 1.0, 0.5, 0.0,
                       1.0, 0.5])
    hidden = p_f.size
    w = np.zeros((1, 3 * hidden), dtype)
    b = np.concatenate([p_f, p_i, np.zeros(hidden)]).astype(dtype)
    x, h0 = np.zeros((2, 1, 1), dtype), np.ones((1, hidden), dtype)
    with np.errstate(all="raise"):
        seq = gc.minlstm_sequence(x, h0, w, b, backend=backend)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(seq.f[0, 0], want_f, rtol=0, atol=4 * eps)
    np.testing.assert_array_equal(seq.f, 1 - seq.i)
    assert np.isfinite(seq.h).all()


# --------------------------------------------------------------------------------------
# the two methods are one function (docs/spec.md §18.1)


def _abs_recurrence(seq, case):
    """The recurrence on the terms' magnitudes, ``|a| = f'``, ``|c| = |i'∘h̃|``, ``|h0|``,
    in the result's layout: the scale of every h_t's rounding (float64)."""
    f, i, hc = (np.asarray(a, np.float64) for a in (seq.f, seq.i, seq.hc))
    if case.get("batch_first"):
        f, i, hc = (a.transpose(1, 0, 2) for a in (f, i, hc))
    steps = range(f.shape[0] - 1, -1, -1) if case.get("reverse") else range(f.shape[0])
    s, out = np.abs(np.asarray(case["h0"], np.float64)), np.zeros_like(f)
    for t in steps:
        s = np.where(i[t] + f[t] > 0, f[t] * s + np.abs(i[t] * hc[t]), s)   # 0 past a length
        out[t] = s
    return out.transpose(1, 0, 2) if case.get("batch_first") else out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", [{}, {"ragged": True}, {"ragged": True, "reverse": True},
                                   {"reverse": True, "batch_first": True}])
def test_the_parallel_method_equals_the_sequential_one_to_the_bound(order, dtype, backend,
                                                                      monkeypatch):
    """Every h within 4 ulp × (⌈log2 T⌉ + 1) of the sequential method, relative to the
    recurrence on the terms' magnitudes; the gates bitwise equal; the CPU's chunks of 2
    steps (so that several chunks run)."""
    monkeypatch.setattr(cpu_scan, "CHUNK", 2)
    steps = 6
    case = _case(2, steps=steps, dtype=dtype, **order)
    kw = _settings(case)
    seq = gc.minlstm_sequence(*_arrays(case), **{**kw, "method": "sequential"},
                              backend=backend)
    par = gc.minlstm_sequence(*_arrays(case), **{**kw, "method": "parallel"}, backend=backend)
    bound = 4 * np.finfo(dtype).eps * (np.ceil(np.log2(steps)) + 1) * _abs_recurrence(
        seq, case)
    assert np.all(np.abs(par.h - seq.h) <= bound)
    bound_final = bound.max(axis=1 if case.get("batch_first") else 0)   # h_final is some h_t
    assert np.all(np.abs(par.h_final - seq.h_final) <= bound_final)
    for name in ("f", "i", "hc"):
        np.testing.assert_array_equal(getattr(par, name), getattr(seq, name), err_msg=name)


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
        seq = gc.minlstm_sequence(*_arrays(case), **kw, backend=backend)
        up = {f"d_{f}": rng.standard_normal(getattr(seq, f).shape) for f in seq._fields}
        t = gc.MinLSTMSequenceGrads(*(rng.standard_normal(a.shape) for a in _arrays(case)))
        runs[method] = (seq, gc.minlstm_sequence_grad(*_arrays(case), seq, **up,
                                                      backend=backend),
                        gc.minlstm_sequence_jvp(*_arrays(case), t, **kw, backend=backend)[1],
                        gc.minlstm_sequence_grad_jvp(*_arrays(case), seq, t, **up,
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
    """Every input under a loss on every output field (f, i, hc, h, h_final), with lengths
    and reverse; the cell step too."""
    case = _case(5, activation, method=method, ragged=True, reverse=True)
    report = testing.vjp_check("minlstm_sequence", case, backend=backend)
    assert report.passed, report
    cell = testing.minlstm_cell_case(np.random.default_rng(6), activation=activation)
    assert testing.vjp_check("minlstm_cell", cell, backend=backend).passed


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forward_mode_and_second_order_against_finite_differences(activation):
    case = _case(7, activation, ragged=True, method="parallel")
    assert testing.jvp_check("minlstm_sequence", case, backend="cpu").passed
    assert testing.grad_jvp_check("minlstm_sequence", case, backend="cpu").passed
    cell = testing.minlstm_cell_case(np.random.default_rng(8), activation=activation)
    assert testing.grad_jvp_check("minlstm_cell", cell, backend="reference").passed


def _torch_minlstm(x, h0, w, b, activation):
    """The minLSTM transcribed in PyTorch, step by step, float64, the gates normalised as
    the paper writes them."""
    import torch

    hidden = h0.shape[1]
    h, fs, is_, hcs, hs = h0, [], [], [], []
    for x_t in x:
        p = x_t @ w + b
        f, i = torch.sigmoid(p[:, :hidden]), torch.sigmoid(p[:, hidden:2 * hidden])
        v = p[:, 2 * hidden:]
        hc = v if activation == "identity" else torch.where(v >= 0, v + 0.5, torch.sigmoid(v))
        f_n, i_n = f / (f + i), i / (f + i)
        h = f_n * h + i_n * hc
        fs.append(f_n)
        is_.append(i_n)
        hcs.append(hc)
        hs.append(h)
    return torch.stack(fs), torch.stack(is_), torch.stack(hcs), torch.stack(hs), h


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forward_and_gradients_equal_torch_autograd(activation, backend):
    torch = pytest.importorskip("torch")
    case = _case(9, activation)
    arrays = [torch.tensor(a, requires_grad=True) for a in _arrays(case)]
    outs = _torch_minlstm(*arrays, activation)
    seq = gc.minlstm_sequence(*_arrays(case), activation=activation, method="parallel",
                             backend=backend)
    rng = np.random.default_rng(10)
    up = [rng.standard_normal(o.shape) for o in outs]
    torch.autograd.backward(outs, [torch.tensor(u) for u in up])
    grads = gc.minlstm_sequence_grad(*_arrays(case), seq, **{
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
        gc.minlstm_sequence(*_arrays(_case(11)), **keywords)


def test_bad_shapes_are_named():
    x, h0, w, b = _arrays(_case(12))
    with pytest.raises(ValueError, match="w must"):
        gc.minlstm_sequence(x, h0, w[:, :-1], b)
    with pytest.raises(ValueError, match="b must"):
        gc.minlstm_sequence(x, h0, w, b[:-2])
    with pytest.raises(ValueError, match="h0"):
        gc.minlstm_sequence(x, h0[:, :-1], w, b)
    with pytest.raises(TypeError, match="dtype"):
        gc.minlstm_sequence(x, h0.astype(np.float32), w, b)
    with pytest.raises(TypeError, match="method"):
        gc.minlstm_cell(x[0], h0, w, b, method="parallel")


def test_a_gradient_given_another_method_is_named():
    case = _case(13)
    seq = gc.minlstm_sequence(*_arrays(case), method="parallel")
    with pytest.raises(ValueError, match="method='sequential' contradicts"):
        gc.minlstm_sequence_grad(*_arrays(case), seq, method="sequential")


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
    op = "minlstm_sequence"
    seq = calls.forward(op, case)
    up = {f"d_{f}": rng.standard_normal(getattr(seq, f).shape).astype(dtype)
          for f in seq._fields}
    t = gc.MinLSTMSequenceGrads(*(rng.standard_normal(a.shape).astype(dtype)
                                 for a in _arrays(case)))
    return (seq, calls.grad(op, case, seq, **up), calls.jvp(op, case, t)[1],
            calls.grad_jvp(op, case, seq, t, **up)[1])
