"""What is the RG-LRU's own (docs/spec.md §18.3): its formula (recurrentgemma's layout,
resets, ``c``), its two methods as one function, its gradients against finite differences
and a float64 PyTorch autograd transcription (with recurrentgemma's ``SqrtBoundDerivative``
for the ``sqrt_grad_bound`` convention), its named errors. The contracts every cell owes
(purity, empty sizes, padding, settings, fuzz) run it through ``tests/contract_cases.py``."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells import testing
from gradcells.cpu import _scan as cpu_scan

BACKENDS = ("reference", "cpu")
ARRAYS = ("x", "h0", "w_a", "b_a", "w_x", "b_x", "lam")


def _case(seed, *, steps=5, batch=3, hidden=6, heads=3, dtype=np.float64, **kw):
    return testing.rglru_sequence_case(np.random.default_rng(seed), steps=steps, batch=batch,
                                       hidden=hidden, heads=heads, dtype=dtype, **kw)


def _arrays(case):
    return tuple(case[k] for k in ARRAYS)


def _settings(case):
    return {k: v for k, v in case.items() if k not in ARRAYS}


# --------------------------------------------------------------------------------------
# the formula


def _blocks(x, w):
    n, d = w.shape[0], w.shape[1]
    return np.concatenate([x[..., k * d:(k + 1) * d] @ w[k] for k in range(n)], axis=-1)


def _by_hand(x, h0, w_a, b_a, w_x, b_x, lam, resets=None, c=8.0):
    """recurrentgemma's RG-LRU as it writes it, one step at a time, plain NumPy float64:
    ``a² = exp(2·log a)``, the multiplier ``sqrt(1 - a²)``, 1 at a reset where ``a`` is
    multiplied by 0."""
    h, out = h0, []
    for t, x_t in enumerate(x):
        r = 1 / (1 + np.exp(-(_blocks(x_t, w_a) + b_a)))
        i = 1 / (1 + np.exp(-(_blocks(x_t, w_x) + b_x)))
        log_a = -c * r * np.logaddexp(0, lam)
        a, m = np.exp(log_a), np.sqrt(1 - np.exp(2 * log_a))
        if resets is not None:
            reset = resets[t][:, None]
            a, m = np.where(reset, 0, a), np.where(reset, 1, m)
        h = a * h + m * (i * x_t)
        out.append((r, i, h))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["sequential", "parallel"])
@pytest.mark.parametrize("c", [8.0, 2.5])
def test_the_forward_is_recurrentgemmas_formula(c, method, backend):
    case = _case(1, resets=True)
    seq = gc.rglru_sequence(*_arrays(case), resets=case["resets"], c=c, method=method,
                            backend=backend)
    assert case["resets"].any() and not case["resets"].all()
    for t, want in enumerate(_by_hand(*_arrays(case), case["resets"], c)):
        for name, got, w in zip(("r", "i", "h"), seq[:3], want, strict=True):
            np.testing.assert_allclose(got[t], w, rtol=1e-12, atol=1e-14, err_msg=name)
    np.testing.assert_array_equal(seq.h_final, seq.h[-1])
    assert seq.settings.c == c and seq.settings.method == method
    np.testing.assert_array_equal(seq.settings.resets, case["resets"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reset_starts_a_new_document(backend):
    """With a reset at step 2 the steps from 2 on are those of the second document alone
    (from any state: h0 is not read), and neither ``h0`` nor the first document's steps
    get any gradient from them; run in reverse, the reset cuts at the step's right."""
    case = _case(2)
    x, h0, *weights = _arrays(case)
    resets = np.zeros(x.shape[:2], bool)
    resets[2] = True
    whole = gc.rglru_sequence(x, h0, *weights, resets=resets, backend=backend)
    second = gc.rglru_sequence(x[2:], 0 * h0, *weights, resets=resets[2:], backend=backend)
    np.testing.assert_allclose(whole.h[2:], second.h, rtol=1e-14, atol=0)
    g = gc.rglru_sequence_grad(x, h0, *weights, whole, d_h=np.ones_like(whole.h[:, :, :])
                               * (np.arange(5) >= 2)[:, None, None], backend=backend)
    np.testing.assert_array_equal(g.h0, 0)
    np.testing.assert_array_equal(g.x[:2], 0)
    back = gc.rglru_sequence(x, h0, *weights, resets=resets, reverse=True, backend=backend)
    first = gc.rglru_sequence(x[:3], 0 * h0, *weights, resets=resets[:3], reverse=True,
                              backend=backend)
    np.testing.assert_allclose(back.h[:3], first.h, rtol=1e-14, atol=0)


# --------------------------------------------------------------------------------------
# the methods


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", [{}, {"ragged": True, "resets": True},
                                   {"ragged": True, "reverse": True, "resets": True},
                                   {"reverse": True, "batch_first": True, "resets": True}])
def test_both_methods_agree_in_every_mode(order, backend, monkeypatch):
    """Forward, gradient, forward mode and second order of "parallel" equal "sequential"'s
    (float64, 1e-13), with lengths, resets, reverse and batch-first; the CPU's chunks of
    2 steps (several chunks run)."""
    monkeypatch.setattr(cpu_scan, "CHUNK", 2)
    case = _case(3, steps=6, **order)
    runs = {}
    for method in ("sequential", "parallel"):
        rng = np.random.default_rng(4)
        kw = {**_settings(case), "method": method}
        seq = gc.rglru_sequence(*_arrays(case), **kw, backend=backend)
        up = {f"d_{f}": rng.standard_normal(getattr(seq, f).shape) for f in seq._fields}
        t = gc.RGLRUSequenceGrads(*(rng.standard_normal(a.shape) for a in _arrays(case)))
        runs[method] = (seq, gc.rglru_sequence_grad(*_arrays(case), seq, **up,
                                                    backend=backend),
                        gc.rglru_sequence_jvp(*_arrays(case), t, **kw, backend=backend)[1],
                        gc.rglru_sequence_grad_jvp(*_arrays(case), seq, t, **up,
                                                   backend=backend)[1])
    for got, want in zip(runs["parallel"], runs["sequential"], strict=True):
        for name, a, b in zip(got._fields, got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", [{"ragged": True, "resets": True, "sqrt_grad_bound": 2.0},
                                   {"ragged": True, "reverse": True, "resets": True},
                                   {"reverse": True, "batch_first": True}])
def test_the_cpu_equals_the_reference_in_every_mode(order, dtype):
    """Every field of the forward and of the gradient (every upstream given), forward mode
    and second order: the CPU's kernels against the reference, in the dtype (float64
    1e-12; float32 to a few ulps of the values' scale)."""
    case = _case(5, steps=6, dtype=dtype, **order)
    tol = ({"rtol": 1e-12, "atol": 1e-13} if dtype == np.float64
           else {"rtol": 2e-5, "atol": 2e-6})
    runs = {}
    for backend in BACKENDS:
        rng = np.random.default_rng(6)
        seq = gc.rglru_sequence(*_arrays(case), **_settings(case), backend=backend)
        up = {f"d_{f}": rng.standard_normal(getattr(seq, f).shape).astype(dtype)
              for f in seq._fields}
        t = gc.RGLRUSequenceGrads(*(rng.standard_normal(a.shape).astype(dtype)
                                    for a in _arrays(case)))
        runs[backend] = (seq, gc.rglru_sequence_grad(*_arrays(case), seq, **up,
                                                     backend=backend),
                         gc.rglru_sequence_jvp(*_arrays(case), t, **_settings(case),
                                               backend=backend)[1],
                         gc.rglru_sequence_grad_jvp(*_arrays(case), seq, t, **up,
                                                    backend=backend)[1])
    for mode, (got, want) in enumerate(zip(runs["cpu"], runs["reference"], strict=True)):
        for name, a, b in zip(got._fields, got, want, strict=True):
            assert a.dtype == dtype, name
            np.testing.assert_allclose(a, b, **tol, err_msg=f"mode {mode}: {name}")


# --------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_every_gradient_against_finite_differences(method, backend):
    """Every input under a loss on every output field (r, i, h, h_final), with lengths,
    resets and reverse; the cell step too (float64, the public oracle)."""
    case = _case(7, method=method, ragged=True, resets=True, reverse=True)
    report = testing.vjp_check("rglru_sequence", case, backend=backend)
    assert report.passed, report
    cell = testing.rglru_cell_case(np.random.default_rng(8), c=3.0)
    assert testing.vjp_check("rglru_cell", cell, backend=backend).passed


def test_forward_mode_and_second_order_against_finite_differences():
    case = _case(9, ragged=True, resets=True, method="parallel")
    assert testing.jvp_check("rglru_sequence", case, backend="cpu").passed
    assert testing.grad_jvp_check("rglru_sequence", case, backend="cpu").passed
    cell = testing.rglru_cell_case(np.random.default_rng(10))
    assert testing.jvp_check("rglru_cell", cell, backend="reference").passed
    assert testing.grad_jvp_check("rglru_cell", cell, backend="reference").passed


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gradient_stays_exact_where_a_is_near_one(backend):
    """Tiny gates ``r`` and ``softplus(λ)`` (``1 - a`` from 1e-10 to 1e-8, where ``1 -
    exp(2 log a)`` keeps few digits and ``sqrt``'s slope grows without bound): the first
    state to 1e-13 against the series ``1 - a² = y - y²/2 + y³/6`` (``y = -2 log a``), and
    every gradient passes the oracle; a gate ``r`` that rounds to 0 (``b_a = -1e4``) gives
    a finite gradient, its limit 0 through ``m``."""
    case = _case(11, steps=3, batch=2, hidden=4, heads=2, scale=0.1)
    case["b_a"] = np.array([-22.0, -18.0, 0.0, -1e4])
    case["lam"] = np.array([0.5, -20.0, -22.0, 0.3])
    seq = gc.rglru_sequence(*_arrays(case), backend=backend)
    y = 2 * 8.0 * seq.r[0] * np.log1p(np.exp(case["lam"]))
    x0, h0 = case["x"][0], case["h0"]
    want = np.exp(-y / 2) * h0 + np.sqrt(y - y * y / 2 + y ** 3 / 6) * seq.i[0] * x0
    assert np.all(y[:, :3] < 1e-7) and np.all(seq.r[0][:, 3] == 0)
    np.testing.assert_allclose(seq.h[0], want, rtol=1e-13, atol=0)
    assert testing.vjp_check("rglru_sequence", case, backend=backend).passed
    g = gc.rglru_sequence_grad(*_arrays(case), seq, d_h=np.ones_like(seq.h), backend=backend)
    assert all(np.all(np.isfinite(a)) for a in g)


# --------------------------------------------------------------------------------------
# the sqrt_grad_bound convention


def _torch_rglru(x, h0, w_a, b_a, w_x, b_x, lam, resets, c, bound):
    """recurrentgemma's torch ``RGLRU.forward`` transcribed (time-major, float64, ``h0``
    given), its ``SqrtBoundDerivative`` with ``_MAX_SQRT_GRADIENT = bound`` (None: torch's
    own ``sqrt``)."""
    import torch

    class SqrtBoundDerivative(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            ctx.save_for_backward(z)
            return torch.sqrt(z)

        @staticmethod
        def backward(ctx, grad_output):
            (z,) = ctx.saved_tensors
            return grad_output / torch.sqrt(torch.clip(4.0 * z, min=1 / bound**2))

    def blocks(v, w):
        n, d = w.shape[0], w.shape[1]
        return torch.einsum("...hi,hij->...hj", v.reshape(*v.shape[:-1], n, d),
                            w).reshape(v.shape)

    reset = torch.as_tensor(resets)[..., None]
    r = torch.sigmoid(blocks(x, w_a) + b_a)
    i = torch.sigmoid(blocks(x, w_x) + b_x)
    log_a = -c * r * torch.nn.functional.softplus(lam)
    a, a_square = torch.exp(log_a), torch.exp(2 * log_a)
    z = 1 - a_square
    multiplier = torch.sqrt(z) if bound is None else SqrtBoundDerivative.apply(z)
    multiplier = reset + ~reset * multiplier
    normalized = x * i * multiplier
    a = a * ~reset
    h, hs = h0, []
    for t in range(x.shape[0]):
        h = a[t] * h + normalized[t]
        hs.append(h)
    hs = torch.stack(hs)
    return r, i, hs, h


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bound", [None, 2.0])
def test_forward_and_gradients_equal_torch_autograd(bound, backend):
    """Every field and every gradient against the transcription, float64: the true gradient
    (``bound`` None) and the convention, with a bound of 2 so that it acts (``1 - a² <
    1/16`` at some elements, checked)."""
    torch = pytest.importorskip("torch")
    case = _case(12, resets=True, c=8.0)
    case["lam"] = np.linspace(-6.0, 1.0, case["lam"].size)
    kw = {"resets": case["resets"], "sqrt_grad_bound": bound}
    seq = gc.rglru_sequence(*_arrays(case), **kw, backend=backend)
    tensors = [torch.tensor(a, requires_grad=True) for a in _arrays(case)]
    outs = _torch_rglru(*tensors, case["resets"], 8.0, bound)
    rng = np.random.default_rng(13)
    up = [rng.standard_normal(o.shape) for o in outs]
    torch.autograd.backward(outs, [torch.tensor(u) for u in up])
    grads = gc.rglru_sequence_grad(*_arrays(case), seq, **{
        f"d_{f}": u for f, u in zip(seq._fields, up, strict=True)}, backend=backend)
    for name, mine, theirs in zip(seq._fields, seq, outs, strict=True):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=name)
    for name, mine, t in zip(grads._fields, grads, tensors, strict=True):
        np.testing.assert_allclose(mine, t.grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)
    z = 1 - np.exp(-2 * 8.0 * seq.r * np.logaddexp(0, case["lam"]))
    assert (z < 1 / 16).any() and (z > 1 / 16).any()


def test_the_bound_is_a_convention_the_result_carries():
    """The forward is the same whatever the bound; the gradient differs from the true one
    exactly where ``1 - a² < 1/(4·bound²)`` acts (here through ``lam``, ``w_a``, ``b_a``
    and ``x``, never ``h0``); the gradient, its JVP and the forward's JVP follow the
    record, and a contradicting bound given again is named."""
    case = _case(14)
    case["lam"] = np.linspace(-6.0, 1.0, case["lam"].size)
    true = gc.rglru_sequence(*_arrays(case))
    bounded = gc.rglru_sequence(*_arrays(case), sqrt_grad_bound=2.0)
    for a, b in zip(true, bounded, strict=True):
        np.testing.assert_array_equal(a, b)
    assert bounded.settings.sqrt_grad_bound == 2.0 and true.settings.sqrt_grad_bound is None
    d_h = np.ones_like(true.h)
    g_true = gc.rglru_sequence_grad(*_arrays(case), true, d_h=d_h)
    g_bound = gc.rglru_sequence_grad(*_arrays(case), bounded, d_h=d_h)
    np.testing.assert_array_equal(g_bound.h0, g_true.h0)
    assert not np.allclose(g_bound.lam, g_true.lam)
    report = testing.vjp_check("rglru_sequence", {**case, "sqrt_grad_bound": 2.0})
    assert not report.passed            # the oracle tells a convention from the derivative
    assert testing.vjp_check("rglru_sequence", case).passed
    rng = np.random.default_rng(15)
    t = gc.RGLRUSequenceGrads(*(rng.standard_normal(a.shape) for a in _arrays(case)))
    _, d_seq = gc.rglru_sequence_jvp(*_arrays(case), t, sqrt_grad_bound=2.0)
    vjp = sum(float(np.sum(g * d)) for g, d in zip(g_bound, t, strict=True))
    np.testing.assert_allclose(vjp, float(np.sum(d_h * d_seq.h)), rtol=1e-12)
    with pytest.raises(ValueError, match="sqrt_grad_bound=1000.0 contradicts"):
        gc.rglru_sequence_grad(*_arrays(case), bounded, d_h=d_h, sqrt_grad_bound=1000.0)


# --------------------------------------------------------------------------------------
# bad input (docs/spec.md §7)


@pytest.mark.parametrize(("keywords", "error", "match"), [
    ({"method": "scan"}, ValueError, "method must be one of"),
    ({"c": 0.0}, ValueError, "c must be positive"),
    ({"c": "8"}, TypeError, "c must be a real number"),
    ({"sqrt_grad_bound": 0.0}, ValueError, "sqrt_grad_bound must be positive"),
    ({"sqrt_grad_bound": -1.0}, ValueError, "sqrt_grad_bound must be positive"),
    ({"resets": np.zeros((5, 3))}, TypeError, "resets must have dtype bool"),
    ({"resets": np.zeros((3, 5), bool)}, ValueError, r"resets must have shape \[T, B\]"),
    ({"resets": [[True] * 3] * 5}, TypeError, "resets must be a boolean array"),
    ({"resets": np.zeros((5, 3), bool), "batch_first": True}, ValueError,
     r"resets must have shape \[B, T\]"),
])
def test_bad_settings_are_named(keywords, error, match):
    case = _case(16)
    x = case["x"].transpose(1, 0, 2) if keywords.get("batch_first") else case["x"]
    with pytest.raises(error, match=match):
        gc.rglru_sequence(x, *_arrays(case)[1:], **keywords)


def test_bad_shapes_are_named():
    x, h0, w_a, b_a, w_x, b_x, lam = _arrays(_case(17))
    with pytest.raises(ValueError, match=r"x must have shape \[T, B, H\]"):
        gc.rglru_sequence(x[..., :-1], h0, w_a, b_a, w_x, b_x, lam)
    with pytest.raises(ValueError, match=r"w_a must have shape \[N, H/N, H/N\] with N >= 1"):
        gc.rglru_sequence(x, h0, np.ones((4, 1, 1)), b_a, w_x, b_x, lam)
    with pytest.raises(ValueError, match="w_x must have shape"):
        gc.rglru_sequence(x, h0, w_a, b_a, w_x[:1], b_x, lam)
    with pytest.raises(ValueError, match="lam must have shape"):
        gc.rglru_sequence(x, h0, w_a, b_a, w_x, b_x, lam[:-1])
    with pytest.raises(TypeError, match="dtype"):
        gc.rglru_sequence(x, h0, w_a, b_a, w_x, b_x, lam.astype(np.float32))
    with pytest.raises(TypeError, match="resets"):
        gc.rglru_cell(x[0], h0, w_a, b_a, w_x, b_x, lam, resets=np.zeros(3, bool))
    with pytest.raises(TypeError, match="method"):
        gc.rglru_cell(x[0], h0, w_a, b_a, w_x, b_x, lam, method="parallel")


# --------------------------------------------------------------------------------------
# the GPU's kernels, on the host (tests/cuda_host)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", [{"ragged": True, "resets": True, "sqrt_grad_bound": 2.0},
                                   {"resets": True}])
def test_the_gpu_kernels_equal_the_reference_in_every_mode(order, dtype):
    """``rglru.cu`` and the shared ``scan.cu`` through the host emulation: forward, gradient
    (every upstream field), forward mode and second order, with lengths, resets and the
    bound acting, against the float64 reference."""
    from contract_cases import EMULATED_GPU, BackendCalls, backend

    case = _case(18, steps=4, dtype=dtype, **order)
    case["lam"] = np.linspace(-6.0, 1.0, case["lam"].size).astype(dtype)
    as64 = {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
            else v for k, v in case.items()}
    tol = {"rtol": 1e-12, "atol": 1e-13} if dtype == np.float64 else {"rtol": 2e-5,
                                                                        "atol": 2e-6}
    with backend("reference") as impl:
        want = _four_modes(BackendCalls(impl), as64, np.random.default_rng(19), np.float64)
    with backend(EMULATED_GPU) as impl:
        got = _four_modes(BackendCalls(impl), case, np.random.default_rng(19), dtype)
    for mode, (a_tuple, b_tuple) in enumerate(zip(got, want, strict=True)):
        for name, a, b in zip(a_tuple._fields, a_tuple, b_tuple, strict=True):
            assert a.dtype == dtype, name
            np.testing.assert_allclose(a, b, **tol, err_msg=f"mode {mode}: {name}")


def _four_modes(calls, case, rng, dtype):
    op = "rglru_sequence"
    seq = calls.forward(op, case)
    up = {f"d_{f}": rng.standard_normal(getattr(seq, f).shape).astype(dtype)
          for f in seq._fields}
    t = gc.RGLRUSequenceGrads(*(rng.standard_normal(a.shape).astype(dtype)
                                for a in _arrays(case)))
    return (seq, calls.grad(op, case, seq, **up), calls.jvp(op, case, t)[1],
            calls.grad_jvp(op, case, seq, t, **up)[1])


# --------------------------------------------------------------------------------------
# stacks (docs/spec.md §11.4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stack_of_rglru_layers_against_finite_differences(backend):
    """Two layers, one direction (each input as wide as its state), ragged lengths and
    dropout masks: every gradient by the oracle; two bidirectional layers are refused by
    the upper layer's shape check, named."""
    case = testing.stack_case(np.random.default_rng(20), "rglru", layers=2)
    assert testing.vjp_check("rglru_stack", case, backend=backend).passed
    x = case["x"]
    weights = [case["weights"][0]] * 4
    h0 = np.zeros((4, *case["h0"].shape[1:]))
    with pytest.raises(ValueError, match=r"x must have shape \[T, B, H\]"):
        gc.rglru_stack(x, h0, weights, bidirectional=True, backend=backend)
