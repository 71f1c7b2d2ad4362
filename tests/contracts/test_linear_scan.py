"""What is the linear scan's own (docs/spec.md §18.1): ``gc.linear_scan`` and its gradient,
forward mode and second order on every backend (the reference, the CPU, and the GPU's
kernels on the host through ``tests/cuda_host``), against a float64/complex128 PyTorch
autograd transcription, finite differences through the oracle, the parallel method's
stated bound, resets, lengths with both directions, both layouts, purity, empty sizes,
padding never read, dtypes and named errors.

The linear scan is registered apart from the cells (``gradcells.cells.SCANS``: no ``x``, no
weights, no step, no stack), so the cell contract tests do not draw it; this file holds
each of those contracts for it."""

from __future__ import annotations

import inspect
import math

import cuda_host
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells import _dispatch, cells, testing
from gradcells._core import scan as scan_core
from gradcells.cells.linear import gpu as linear_gpu
from gradcells.cells.linear import spec
from gradcells.cpu import _scan as cpu_scan
from gradcells.gpu import _kernels, _launch

torch = pytest.importorskip("torch")

BACKENDS = ("reference", "cpu", "gpu")
KINDS = ("real", "complex", "real_a")   # real_a: a real a with a complex b
TINY = _kernels.LaunchPolicy(block=3, max_grid=2, rows_per_part=2, min_threads=1 << 30)
OPTIONS = [dict(seq_len=s, reverse=r, resets=z, batch_first=f)
           for s in (None, "ragged") for r in (False, True) for z in (False, True)
           for f in (False, True) if not (f and z and s is None)]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """A backend name for the public functions' ``backend=``; "gpu" runs ``gpu.py`` and
    ``scan.cu`` on the host (NumPy arrays reach it through a patched dispatch)."""
    name = request.param
    if name != "gpu":
        yield name
        return
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    monkeypatch.setattr(gc.scans._dispatch, "backend_for",
                        lambda backend, library: _dispatch.backend_module(backend or "cpu"))
    saved = _launch.use_runtime(cuda_host.HostRuntime(TINY))
    try:
        yield name
    finally:
        _launch.use_runtime(saved)


def _case(seed, kind="real", *, steps=6, batch=3, width=2, dtype=np.float64, options=None,
          reset_rate=0.3, decay=(0.5, 1.0)):
    """``(a, b, h0, keywords)``: |a| in ``decay``, ragged lengths [T, 2, 0, ...] and random
    resets (at ``reset_rate``) where ``options`` ask for them (``batch_first``: arrays in
    that layout)."""
    rng = np.random.default_rng(seed)
    options = dict(options or {})
    shape = (steps, batch, width)
    a = rng.uniform(*decay, shape)
    b, h0 = rng.standard_normal(shape), rng.standard_normal((batch, width))
    if kind != "real":
        b, h0 = b + 1j * rng.standard_normal(shape), h0 + 1j * rng.standard_normal(h0.shape)
        if kind == "complex":
            a = a * np.exp(1j * rng.uniform(-1, 1, shape))
    complex_dtype = np.result_type(dtype, np.complex64)
    a = a.astype(complex_dtype if a.dtype.kind == "c" else dtype)
    b, h0 = (v.astype(complex_dtype if kind != "real" else dtype) for v in (b, h0))
    if options.get("seq_len") == "ragged":
        options["seq_len"] = np.array([steps, 2, 0, 1][:batch] + [steps] * max(0, batch - 4))
    options["resets"] = ((rng.random((steps, batch)) < reset_rate) if options.get("resets")
                         else None)
    if options.get("batch_first"):
        a, b = (np.ascontiguousarray(v.transpose(1, 0, 2)) for v in (a, b))
        if options["resets"] is not None:
            options["resets"] = np.ascontiguousarray(options["resets"].T)
    return a, b, h0, options


def _time_major(v, batch_first):
    if not batch_first:
        return v
    return v.transpose(0, 1) if isinstance(v, torch.Tensor) else v.swapaxes(0, 1)


def _torch_scan(a, b, h0, *, seq_len=None, reverse=False, resets=None, batch_first=False):
    """The recurrence as PyTorch ops, one row and one step at a time (float64/complex128):
    ``(leaves, h, h_final)`` with ``h`` in the caller's layout."""
    leaves = [torch.tensor(v, requires_grad=True) for v in (a, b, h0)]
    ta, tb = (_time_major(v, batch_first) for v in leaves[:2])
    th0 = leaves[2]
    resets = None if resets is None else _time_major(resets, batch_first)
    n_steps, n_batch, width = ta.shape[0], th0.shape[0], th0.shape[1]
    zero = torch.zeros(width, dtype=tb.dtype)
    rows, finals = [], []
    for r in range(n_batch):
        length = n_steps if seq_len is None else int(seq_len[r])
        state, out = th0[r], [zero] * n_steps
        for t in (range(length - 1, -1, -1) if reverse else range(length)):
            incoming = state * 0 if resets is not None and resets[t, r] else state
            state = ta[t, r] * incoming + tb[t, r]
            out[t] = state
        rows.append(torch.stack(out) if n_steps else torch.zeros(0, width, dtype=tb.dtype))
        finals.append(state)
    h = torch.stack(rows, dim=1)
    return leaves, (h.transpose(0, 1) if batch_first else h), torch.stack(finals)


def _upstream(rng, result, options):
    """Upstream gradients of ``result``'s dtype, NaN past each row's length (never read)."""
    def draw(v):
        d = rng.standard_normal(v.shape)
        return (d + 1j * rng.standard_normal(v.shape) if v.dtype.kind == "c" else d).astype(
            v.dtype)
    d_h, d_final = draw(result.h), draw(result.h_final)
    if options.get("seq_len") is not None:
        d_tm = _time_major(d_h, options.get("batch_first"))
        d_tm[np.arange(d_tm.shape[0])[:, None] >= options["seq_len"][None, :]] = np.nan
    return d_h, d_final


def _loss(h, h_final, d_h, d_final):
    """The real loss whose gradients in PyTorch's convention the upstream pair are:
    ``Σ Re(conj(d)·h)``."""
    def term(v, d):
        return (v * torch.tensor(np.nan_to_num(d)).conj()).real.sum()
    return term(h, d_h) + term(h_final, d_final)


def _close(actual, expected, tolerance, what):
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    error = np.max(np.abs(actual - expected), initial=0)
    assert error <= tolerance * (1 + np.max(np.abs(expected), initial=0)), f"{what}: {error:.3g}"


# --------------------------------------------------------------------------------------
# the formula and its gradient, against PyTorch autograd


@pytest.mark.parametrize("kind", KINDS)
def test_forward_and_gradient_equal_torch_autograd(kind, backend, monkeypatch):
    """Every option combination (lengths, reverse, resets, batch_first) and both methods
    (the CPU's and the GPU's parallel scans in chunks of 2 steps, so that several run):
    ``h``, ``h_final`` and the three gradients equal a float64/complex128 autograd
    transcription of the recurrence, complex gradients in PyTorch's convention."""
    monkeypatch.setattr(cpu_scan, "CHUNK", 2)
    monkeypatch.setattr(linear_gpu, "CHUNK", 2)
    rng = np.random.default_rng(7)
    for k, options in enumerate(OPTIONS):
        a, b, h0, kw = _case(k, kind, options=options)
        leaves, h, h_final = _torch_scan(a, b, h0, **kw)
        for method in ("sequential", "parallel"):
            result = gc.linear_scan(a, b, h0, method=method, backend=backend, **kw)
            what = f"{kind} {options} {method}"
            _close(result.h, h.detach().numpy(), 1e-13, f"h {what}")
            _close(result.h_final, h_final.detach().numpy(), 1e-13, f"h_final {what}")
            d_h, d_final = _upstream(rng, result, kw)
            grads = gc.linear_scan_grad(a, b, h0, result, d_h=d_h, d_h_final=d_final,
                                        backend=backend)
            for leaf in leaves:
                leaf.grad = None
            _loss(h, h_final, d_h, d_final).backward(retain_graph=True)
            for name, got, leaf in zip(gc.LinearScanGrads._fields, grads, leaves, strict=True):
                _close(got, leaf.grad.numpy(), 1e-13, f"d_{name} {what}")


def test_the_complex_convention_is_the_conjugate_one():
    """One step by hand: ``h = a·h0 + b`` with ``L = Re(conj(u)·h)`` has ``∂L/∂Re a +
    i ∂L/∂Im a = u·conj(h0)`` and ``∂L/∂Re h0 + i ∂L/∂Im h0 = conj(a)·u``."""
    a, b, h0 = (np.array([[[0.3 + 0.4j]]]), np.array([[[1.0 - 2.0j]]]),
                np.array([[0.5 + 0.25j]]))
    u = np.array([[[2.0 - 1.0j]]])
    grads = gc.linear_scan_grad(a, b, h0, gc.linear_scan(a, b, h0), d_h=u)
    assert grads.a[0, 0, 0] == pytest.approx(u[0, 0, 0] * np.conj(h0[0, 0]))
    assert grads.h0[0, 0] == pytest.approx(np.conj(a[0, 0, 0]) * u[0, 0, 0])
    assert grads.b[0, 0, 0] == pytest.approx(u[0, 0, 0])


# --------------------------------------------------------------------------------------
# finite differences (float64, through the oracle)


def _split(v):
    return (v.real.copy(), v.imag.copy()) if v.dtype.kind == "c" else (v,)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("options", [OPTIONS[0], OPTIONS[-1], OPTIONS[7]],
                         ids=["plain", "all", "ragged-reverse-resets"])
def test_gradients_pass_the_oracle(kind, options, backend):
    """``check_vjp`` in float64 with every complex array split into its real and imaginary
    parts: the cotangent ``(u_re, u_im)`` of ``(Re h, Im h)`` is ``d_h = u_re + i u_im``,
    and the gradient of a part is that part of the complex gradient (PyTorch's convention,
    checked against differences, not against PyTorch)."""
    a, b, h0, kw = _case(3, kind, steps=5, batch=3, width=2, options=options)
    parts = [_split(v) for v in (a, b, h0)]
    sizes = [len(p) for p in parts]

    def join(args):
        out, k = [], 0
        for n in sizes:
            out.append(args[k] if n == 1 else args[k] + 1j * args[k + 1])
            k += n
        return out

    def f(*args):
        r = gc.linear_scan(*join(args), backend=backend, **kw)
        return (*_split(r.h), *_split(r.h_final))

    def vjp(cotangent, *args):
        r = gc.linear_scan(*join(args), backend=backend, **kw)
        d = list(cotangent)
        if kind != "real":
            d = [d[0] + 1j * d[1], d[2] + 1j * d[3]]
        g = gc.linear_scan_grad(*join(args), r, d_h=d[0], d_h_final=d[1], backend=backend)
        return tuple(p for v in g for p in _split(v))

    args = [p for group in parts for p in group]
    gc.check_vjp(f, vjp, args).raise_if_failed()


@pytest.mark.parametrize("kind", ["real", "complex"])
def test_forward_mode_and_second_order_pass_finite_differences(kind, backend):
    """``linear_scan_jvp`` against central differences along the tangents, and
    ``linear_scan_grad_jvp`` against central differences of ``linear_scan_grad`` (the
    result recomputed at each point), with lengths, reverse, resets and both layouts."""
    rng = np.random.default_rng(11)
    for k, options in enumerate([OPTIONS[0], OPTIONS[-1], OPTIONS[7]]):
        a, b, h0, kw = _case(20 + k, kind, steps=5, options=options)
        t = gc.LinearScanGrads(*(_like(rng, v) for v in (a, b, h0)))
        result = gc.linear_scan(a, b, h0, **kw)
        up = tuple(np.nan_to_num(v) for v in _upstream(rng, result, kw))
        t_up = tuple(_like(rng, v) for v in up)
        _, tangent = gc.linear_scan_jvp(a, b, h0, t, backend=backend, **kw)
        plus, minus = (_moved(a, b, h0, t, up, t_up, s, kw)[0] for s in (1, -1))
        for name in ("h", "h_final"):
            numeric = (getattr(plus, name) - getattr(minus, name)) / (2 * EPS)
            _close(getattr(tangent, name), numeric, 1e-7, f"t_{name} {options}")
        _, t_grads = gc.linear_scan_grad_jvp(a, b, h0, result, t, d_h=up[0], d_h_final=up[1],
                                             d_h_tangent=t_up[0], d_h_final_tangent=t_up[1],
                                             backend=backend)
        hi, lo = (_moved(a, b, h0, t, up, t_up, s, kw)[1] for s in (1, -1))
        for name, got, g_hi, g_lo in zip(gc.LinearScanGrads._fields, t_grads, hi, lo,
                                         strict=True):
            _close(got, (g_hi - g_lo) / (2 * EPS), 1e-7, f"t_d_{name} {options}")


EPS = 1e-6
"""The step of the central differences above."""


def _moved(a, b, h0, t, up, t_up, sign, kw):
    """The forward and the gradient at the inputs and upstream gradients moved by
    ``sign·EPS`` along their tangents."""
    args = (a + sign * EPS * t.a, b + sign * EPS * t.b, h0 + sign * EPS * t.h0)
    result = gc.linear_scan(*args, **kw)
    return result, gc.linear_scan_grad(*args, result, d_h=up[0] + sign * EPS * t_up[0],
                                       d_h_final=up[1] + sign * EPS * t_up[1])


def _like(rng, v):
    d = rng.standard_normal(v.shape)
    return (d + 1j * rng.standard_normal(v.shape) if v.dtype.kind == "c" else d).astype(v.dtype)


# --------------------------------------------------------------------------------------
# the parallel method


def _bound(a, b, h0, dtype, **kw):
    """The stated bound (``spec.PARALLEL_BOUND_ULPS``): ulps · (log2 T + 2) · eps times the
    sequential scan of ``|a|``, ``|b|``, ``|h0|``."""
    magnitude = gc.linear_scan(np.abs(a), np.abs(b), np.abs(h0), method="sequential", **kw)
    eps = np.finfo(dtype).eps
    factor = spec.PARALLEL_BOUND_ULPS * (math.log2(max(a.shape[0], 1)) + 2) * eps
    return factor * magnitude.h.astype(np.float64), factor * magnitude.h_final


@pytest.mark.parametrize("kind", ["real", "complex"])   # a real a: test_read_only_and_...
def test_the_parallel_method_is_within_the_stated_bound(kind, backend):
    """float32 over 300 steps (the CPU's chunked scan runs five chunks on threads, the
    GPU's five chunks a column; the reference's Hillis-Steele nine rounds), with lengths,
    reverse and resets: forward and gradients, elementwise within the bound; and "auto" is
    one of the two."""
    backend_name = backend
    a, b, h0, kw = _case(5, kind, steps=300, batch=4, width=3, dtype=np.float32,
                         options=dict(seq_len="ragged", reverse=True, resets=True),
                         reset_rate=0.01, decay=(0.98, 1.0))
    # (a chunk with a reset, or whose incoming state has decayed below round-off, rescans
    # bitwise as the sequential method: the decay keeps the carries alive)
    seq = gc.linear_scan(a, b, h0, method="sequential", backend=backend_name, **kw)
    par = gc.linear_scan(a, b, h0, method="parallel", backend=backend_name, **kw)
    bound_h, bound_final = _bound(a, b, h0, np.float32, **kw)
    assert np.all(np.abs(par.h - seq.h) <= bound_h)
    assert np.all(np.abs(par.h_final - seq.h_final) <= bound_final)
    if backend_name == "cpu":
        assert np.any(par.h != seq.h), "the methods differ in their rounding: a bitwise "\
            "equality would mean the parallel scan did not run"
    if backend_name == "gpu":
        assert _launch.runtime().launches["linear_scan_chunks"] == 1
    d_h = np.ones_like(seq.h)
    g_seq = gc.linear_scan_grad(a, b, h0, seq, d_h=d_h, backend=backend_name)
    g_par = gc.linear_scan_grad(a, b, h0, par, d_h=d_h, backend=backend_name)
    # The adjoint's magnitude: the reverse-time scan of |a| over |d_h| (all ones).
    g_abs = gc.linear_scan_grad(np.abs(a), np.abs(b), np.abs(h0),
                                gc.linear_scan(np.abs(a), np.abs(b), np.abs(h0), **kw),
                                d_h=np.ones(seq.h.shape, np.abs(seq.h).dtype))
    factor = spec.PARALLEL_BOUND_ULPS * (math.log2(300) + 2) * np.finfo(np.float32).eps
    assert np.all(np.abs(g_par.b - g_seq.b) <= factor * np.abs(g_abs.b))
    auto = gc.linear_scan(a, b, h0, backend=backend_name, **kw)
    assert np.array_equal(auto.h, seq.h)     # 300 < PARALLEL_FROM_STEPS


@pytest.mark.parametrize("cores", [2, 4])
def test_auto_on_the_cpu_runs_the_chunked_scan_only_with_enough_cores(cores, monkeypatch):
    """With the step threshold lowered below T = 300, "auto" on the CPU is the parallel
    method, bit for bit, where the process may use ``PARALLEL_FROM_CORES`` cores, and the
    sequential method where it may not (two cores: docs/performance.md)."""
    monkeypatch.setattr(scan_core, "PARALLEL_FROM_STEPS", 100)
    monkeypatch.setattr(cpu_scan, "_cores", lambda: cores)
    a, b, h0, kw = _case(5, "real", steps=300, batch=2, width=3, dtype=np.float32,
                         options={}, decay=(0.98, 1.0))
    runs = {method: gc.linear_scan(a, b, h0, method=method, backend="cpu", **kw)
            for method in ("auto", "sequential", "parallel")}
    assert not np.array_equal(runs["parallel"].h, runs["sequential"].h)
    expected = "parallel" if cores >= cpu_scan.PARALLEL_FROM_CORES else "sequential"
    assert np.array_equal(runs["auto"].h, runs[expected].h)


# --------------------------------------------------------------------------------------
# the house's contracts: purity, empty sizes, padding, dtypes, settings, errors


def test_inputs_are_never_modified_and_outputs_never_alias_them(backend):
    a, b, h0, kw = _case(2, "complex", options=OPTIONS[-1])
    copies = [v.copy() for v in (a, b, h0, kw["seq_len"], kw["resets"])]
    result = gc.linear_scan(a, b, h0, backend=backend, **kw)
    d_h, d_final = (np.nan_to_num(v) for v in _upstream(np.random.default_rng(0), result, kw))
    up = (d_h.copy(), d_final.copy())
    grads = gc.linear_scan_grad(a, b, h0, result, d_h=d_h, d_h_final=d_final, backend=backend)
    t = gc.LinearScanGrads(a.copy(), b.copy(), h0.copy())
    gc.linear_scan_jvp(a, b, h0, t, backend=backend, **kw)
    gc.linear_scan_grad_jvp(a, b, h0, result, t, d_h=d_h, d_h_tangent=d_h, backend=backend)
    for before, after in zip(copies + list(up), [a, b, h0, kw["seq_len"], kw["resets"],
                                                 d_h, d_final], strict=True):
        assert np.array_equal(before, after, equal_nan=True)
    for out in (*result, *grads):
        assert not any(np.shares_memory(out, v) for v in (a, b, h0, d_h, d_final))


def test_read_only_and_strided_inputs(backend):
    """Read-only arrays (a JAX array's NumPy view, a record's copy) and strided views are
    taken as they are: the same results as contiguous writeable copies."""
    a, b, h0, kw = _case(12, "real_a", steps=70, options=dict(seq_len="ragged"))
    views = [v.copy() for v in (a, b, h0)]
    for v in views:
        v.flags.writeable = False
    strided = [np.repeat(v, 2, axis=-1)[..., ::2] for v in (a, b, h0)]
    for method in ("sequential", "parallel"):
        want = gc.linear_scan(a, b, h0, method=method, backend=backend, **kw)
        for args in (views, strided):
            got = gc.linear_scan(*args, method=method, backend=backend, **kw)
            assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
            grads = gc.linear_scan_grad(*args, got, d_h=np.ones_like(got.h), backend=backend)
            assert all(np.array_equal(x, y) for x, y in zip(grads, gc.linear_scan_grad(
                a, b, h0, want, d_h=np.ones_like(want.h), backend=backend), strict=True))


@pytest.mark.parametrize("shape", [(0, 3, 2), (4, 0, 2), (4, 3, 0)])
def test_empty_sizes(shape, backend):
    a, b, h0 = np.ones(shape), np.ones(shape), np.full((shape[1], shape[2]), 2.0)
    result = gc.linear_scan(a, b, h0, method="parallel", backend=backend)
    assert result.h.shape == shape and result.h_final.shape == h0.shape
    if shape[0] == 0:
        assert np.array_equal(result.h_final, h0) and not np.shares_memory(result.h_final, h0)
    grads = gc.linear_scan_grad(a, b, h0, result, d_h_final=np.ones_like(h0), backend=backend)
    assert [g.shape for g in grads] == [shape, shape, h0.shape]
    if shape[0] == 0:
        assert np.array_equal(grads.h0, np.ones_like(h0))


def test_padding_is_never_read(backend):
    """NaN in ``a``, ``b`` and the upstream gradient past each row's length (and a reset
    flag there) change nothing."""
    a, b, h0, kw = _case(4, "complex", options=dict(seq_len="ragged", reverse=True,
                                                    resets=True))
    past = np.arange(a.shape[0])[:, None] >= kw["seq_len"][None, :]
    clean = gc.linear_scan(a, b, h0, backend=backend, **kw)
    a2, b2, resets2 = a.copy(), b.copy(), kw["resets"].copy()
    a2[past], b2[past], resets2[past] = np.nan, np.nan, True
    dirty = gc.linear_scan(a2, b2, h0, backend=backend, **{**kw, "resets": resets2})
    assert np.array_equal(clean.h, dirty.h) and np.array_equal(clean.h_final, dirty.h_final)
    assert np.all(clean.h[past] == 0)
    d_h, d_final = _upstream(np.random.default_rng(1), clean, kw)   # NaN past the lengths
    g1 = gc.linear_scan_grad(a, b, h0, clean, d_h=d_h, d_h_final=d_final, backend=backend)
    g2 = gc.linear_scan_grad(a2, b2, h0, dirty, d_h=d_h, d_h_final=d_final, backend=backend)
    for x, y in zip(g1, g2, strict=True):
        assert np.all(np.isfinite(x)) and np.array_equal(x, y)


@pytest.mark.parametrize(("a_dtype", "b_dtype"), [
    (np.float32, np.float32), (np.float64, np.float64), (np.complex64, np.complex64),
    (np.float32, np.complex64), (np.float64, np.complex128), (np.complex128, np.complex128)])
def test_dtypes(a_dtype, b_dtype, backend):
    """The states have ``b``'s dtype, each gradient its input's (a real ``a``'s gradient is
    real); float32 agrees with float64 to float32 round-off."""
    rng = np.random.default_rng(6)
    shape = (7, 2, 3)
    a = rng.uniform(0.5, 1, shape).astype(a_dtype)
    b = (rng.standard_normal(shape) + (1j if np.dtype(b_dtype).kind == "c" else 0)
         * rng.standard_normal(shape)).astype(b_dtype)
    h0 = b[0].copy()
    result = gc.linear_scan(a, b, h0, backend=backend)
    assert result.h.dtype == b.dtype and result.h_final.dtype == b.dtype
    grads = gc.linear_scan_grad(a, b, h0, result, d_h=np.ones_like(b), backend=backend)
    assert (grads.a.dtype, grads.b.dtype, grads.h0.dtype) == (a.dtype, b.dtype, b.dtype)
    wide = gc.linear_scan(*(v.astype(np.result_type(v.dtype, np.float64)) for v in (a, b, h0)))
    _close(result.h.astype(wide.h.dtype), wide.h, 16 * np.finfo(b.real.dtype).eps, "h")


def test_numpy_float16_is_computed_in_float32():
    """docs/spec.md §16.4: NumPy float16 arrays in, float16 out, equal to the float32 call
    rounded."""
    a, b, h0, kw = _case(14, steps=4, options=dict(seq_len="ragged", resets=True))
    half = [v.astype(np.float16) for v in (a, b, h0)]
    result = gc.linear_scan(*half, **kw)
    single = gc.linear_scan(*(v.astype(np.float32) for v in half), **kw)
    assert result.h.dtype == np.float16
    np.testing.assert_array_equal(result.h, single.h.astype(np.float16))
    grads = gc.linear_scan_grad(*half, result, d_h=np.ones_like(result.h))
    assert [g.dtype for g in grads] == [np.float16] * 3


def test_the_result_records_its_settings_and_a_contradiction_is_named():
    a, b, h0, kw = _case(8, options=dict(seq_len="ragged", reverse=True, resets=True))
    result = gc.linear_scan(a, b, h0, method="parallel", **kw)
    settings = result.settings
    assert (settings.method, settings.reverse) == ("parallel", True)
    assert np.array_equal(settings.resets, kw["resets"]) and settings.resets is not kw["resets"]
    recorded = gc.linear_scan_grad(a, b, h0, result, d_h=np.ones_like(b))
    by_hand = gc.linear_scan_grad(a, b, h0, tuple(result), d_h=np.ones_like(b),
                                  method="parallel", **kw)
    for x, y in zip(recorded, by_hand, strict=True):
        assert np.array_equal(x, y)
    forgotten = gc.linear_scan_grad(a, b, h0, tuple(result), d_h=np.ones_like(b))
    assert not np.array_equal(forgotten.a, recorded.a)   # what the record protects from
    for name, value in (("reverse", False), ("method", "sequential"),
                        ("resets", ~kw["resets"]), ("seq_len", np.full(3, 6))):
        with pytest.raises(ValueError, match=name):
            gc.linear_scan_grad(a, b, h0, result, **{name: value})


def _errors():
    a, b, h0 = np.ones((4, 2, 3)), np.ones((4, 2, 3)), np.ones((2, 3))
    bad_resets = np.zeros((4, 3), bool)
    return [
        (TypeError, "a must", dict(a=a.astype(np.float32))),
        (TypeError, "a must", dict(a=a.astype(np.complex128))),   # complex a, real b
        (TypeError, "b must", dict(b=b.astype(np.int64))),
        (TypeError, "h0 must", dict(h0=h0.astype(np.float32))),
        (ValueError, "b must", dict(b=np.ones((4, 2, 2)))),
        (ValueError, "a must", dict(a=np.ones((4, 2)), b=np.ones((4, 2)))),
        (ValueError, "h0 must", dict(h0=np.ones((3, 3)))),
        (TypeError, "resets must", dict(resets=bad_resets.astype(np.int8))),
        (ValueError, "resets must", dict(resets=bad_resets)),
        (ValueError, "method", dict(method="fast")),
        (TypeError, "reverse", dict(reverse=1)),
        (ValueError, "seq_len", dict(seq_len=np.array([5, 1]))),
        (TypeError, "a must", dict(a=[[[1.0]]])),
    ], (a, b, h0)


def test_bad_arguments_raise_named_errors():
    cases, (a, b, h0) = _errors()
    for kind, name, change in cases:
        args = {"a": a, "b": b, "h0": h0, **change}
        with pytest.raises(kind, match=name):
            gc.linear_scan(args.pop("a"), args.pop("b"), args.pop("h0"), **args)
    result = gc.linear_scan(a, b, h0)
    for kind, name, keywords in [
            (ValueError, "d_h must", dict(d_h=np.ones((4, 2, 2)))),
            (TypeError, "d_h_final must", dict(d_h_final=np.ones((2, 3), np.float32))),
            (TypeError, "result must", dict(result=(result.h,))),
            (ValueError, "result.h must", dict(result=(result.h[:2], result.h_final)))]:
        keywords = {"result": result, **keywords}
        with pytest.raises(kind, match=name):
            gc.linear_scan_grad(a, b, h0, keywords.pop("result"), **keywords)
    with pytest.raises(ValueError, match="tangents.a must"):
        gc.linear_scan_jvp(a, b, h0, gc.LinearScanGrads(np.ones((1, 2, 3)), None, None))
    with pytest.raises(ValueError, match="d_h_tangent must"):
        gc.linear_scan_grad_jvp(a, b, h0, result, None, d_h_tangent=np.ones((2, 3)))


def test_torch_tensors_in_torch_tensors_out():
    a, b, h0, _ = _case(9, "complex")
    result = gc.linear_scan(*(torch.tensor(v) for v in (a, b, h0)))
    assert isinstance(result.h, torch.Tensor)
    assert np.array_equal(result.h.numpy(), gc.linear_scan(a, b, h0).h)


def test_every_backend_module_follows_the_protocol():
    for name in BACKENDS:
        module = cells.implementation("linear", name)
        for op, method in inspect.getmembers(spec.LinearScanBackend, inspect.isfunction):
            if not op.startswith("linear_scan"):
                continue
            expected = list(inspect.signature(method).parameters.values())[1:]
            actual = list(inspect.signature(getattr(module, op)).parameters.values())
            assert [(p.name, p.kind, p.default) for p in actual] == [
                (p.name, p.kind, p.default) for p in expected], f"{name}.{op}"
    assert cells.cell_of("linear_scan_grad_jvp") == "linear"


# --------------------------------------------------------------------------------------
# fuzzing (docs/spec.md §16.3): malformed arguments raise TypeError or ValueError, nothing
# else, and change nothing

_FUNCTIONS = ("linear_scan", "linear_scan_grad", "linear_scan_jvp", "linear_scan_grad_jvp")


def _valid(name):
    a, b, h0, kw = _case(13, "real_a", steps=3, batch=3, width=2,
                         options=dict(seq_len="ragged", resets=True))
    arguments = {"a": a, "b": b, "h0": h0, "backend": "reference"}
    if name in ("linear_scan", "linear_scan_jvp"):
        arguments.update(kw)
    if name.endswith("_jvp"):
        arguments["tangents"] = gc.LinearScanGrads(a.copy(), None, h0.copy())
    if "grad" in name:
        arguments["result"] = gc.linear_scan(a, b, h0, **kw)
        arguments["d_h"] = np.ones_like(arguments["result"].h)
    return arguments


def _spoiled(data, name):
    """One valid call with one argument replaced by a drawn malformed value (a tensor
    among NumPy arrays too)."""
    arguments = _valid(name)
    key = data.draw(st.sampled_from(sorted(k for k in arguments if k != "backend")))
    value = arguments[key]
    bad = [None, "a", 1.0, [[1.0]], np.nan]
    if isinstance(value, np.ndarray):
        real = value.real if value.dtype.kind == "c" else value
        bad += [value[:1], value[..., None], real.astype(np.int32), real.astype(np.float32),
                value.astype(np.complex64), value.T, torch.tensor(value)]
        if value.dtype.kind in "fc":
            bad.append(np.full_like(value, np.nan))
    if isinstance(value, tuple):
        bad += [tuple(value)[:1], (None,) * len(value), tuple(value) + (value[0],)]
    if key in ("seq_len",):
        bad += [np.array([9, 1, 0]), np.array([-1, 1, 0]), [1.5, 1, 0], np.zeros(3, bool)]
    bad += {"method": ["fast", 3], "reverse": ["yes", 1]}.get(key, [])
    return {**arguments, key: data.draw(st.sampled_from(bad))}


@pytest.mark.parametrize("name", _FUNCTIONS)
@given(data=st.data())
def test_malformed_arguments_raise_named_errors_and_change_nothing(name, data):
    arguments = _spoiled(data, name)
    kept = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in arguments.items()}
    try:
        getattr(gc, name)(**arguments)
    except (TypeError, ValueError):
        pass
    for key, before in kept.items():
        if isinstance(before, np.ndarray):
            assert np.array_equal(before, arguments[key], equal_nan=True), key


# --------------------------------------------------------------------------------------
# drawn cases: the CPU against the reference


@given(data=st.data())
def test_drawn_cases_agree_with_the_reference(data):
    """Hypothesis-drawn sizes (empty ones included), dtype families, methods, lengths,
    resets, directions and layouts: the CPU's forward, gradient and forward mode equal the
    reference's (float64, 1e-12 relative), its chunked scan in chunks of 2 steps."""
    case = testing.linear_scan_case(
        np.random.default_rng(data.draw(st.integers(0, 2**16))),
        steps=data.draw(st.integers(0, 9)), batch=data.draw(st.integers(0, 4)),
        width=data.draw(st.integers(0, 3)), kind=data.draw(st.sampled_from(KINDS)),
        ragged=data.draw(st.booleans()), reverse=data.draw(st.booleans()),
        resets=data.draw(st.booleans()), batch_first=data.draw(st.booleans()),
        method=data.draw(st.sampled_from(["sequential", "parallel"])))
    arrays = {k: case.pop(k) for k in ("a", "b", "h0")}
    saved, cpu_scan.CHUNK = cpu_scan.CHUNK, 2
    try:
        runs = {name: _every_mode(arrays, case, name) for name in ("reference", "cpu")}
    finally:
        cpu_scan.CHUNK = saved
    for got, want in zip(runs["cpu"], runs["reference"], strict=True):
        _close(got, want, 1e-12, "drawn case")


def _every_mode(arrays, case, backend):
    """Every array of the forward, the gradient and the forward mode on ``backend``."""
    result = gc.linear_scan(**arrays, **case, backend=backend)
    d_h = np.ones_like(result.h)
    grads = gc.linear_scan_grad(**arrays, result=result, d_h=d_h,
                                d_h_final=np.ones_like(result.h_final), backend=backend)
    tangents = gc.LinearScanGrads(*(np.ones_like(v) for v in arrays.values()))
    _, tangent = gc.linear_scan_jvp(**arrays, tangents=tangents, **case, backend=backend)
    return [*result, *grads, *tangent]
