"""The cells added through the registry alone (the sLSTM, the minGRU, the minLSTM, the
RG-LRU) under ``gradcells.jax``, on dask arrays and, for the RG-LRU with its resets, under
``gradcells.torch`` (docs/spec.md §13): the same results and gradients as the NumPy call,
with nothing in the adapters written for them."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells.cells import SPECS
from gradcells.testing import cases

pytestmark = pytest.mark.conformance

NEW = ("slstm", "mingru", "minlstm", "rglru")


def _case(cell):
    make = getattr(cases, f"{cell}_sequence_case")
    case = make(np.random.default_rng(7), steps=3, batch=4, input_size=3)
    return {k: case[k] for k in SPECS[cell].sequence.arrays}, case


def _settings(cell, case):
    return {k.name: case[k.name] for k in SPECS[cell].keywords
            if k.name in case and not k.forward_only}


@pytest.mark.parametrize("cell", NEW)
def test_jax_forward_and_grad_equal_numpy(cell):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import gradcells.jax as gj

    arrays, case = _case(cell)
    settings = _settings(cell, case)
    op = f"{cell}_sequence"
    seq = getattr(gc, op)(**arrays, **settings)
    d_h = np.random.default_rng(8).standard_normal(seq.h.shape)
    grads = getattr(gc, f"{op}_grad")(**arrays, seq=seq, d_h=d_h)

    def loss(a):
        return (getattr(gj, op)(**a, **settings).h * d_h).sum()

    jax_arrays = {k: jax.numpy.asarray(v) for k, v in arrays.items()}
    np.testing.assert_allclose(getattr(gj, op)(**jax_arrays, **settings).h, seq.h,
                               rtol=1e-13, atol=1e-14)
    got = jax.jit(jax.grad(loss))(jax_arrays)
    for name in arrays:
        np.testing.assert_allclose(got[name], getattr(grads, name), rtol=1e-12, atol=1e-13,
                                   err_msg=f"{cell}: {name}")


@pytest.mark.parametrize("cell", NEW)
def test_dask_chunked_along_the_batch_equals_numpy(cell):
    da = pytest.importorskip("dask.array")
    arrays, case = _case(cell)
    settings = _settings(cell, case)
    op = f"{cell}_sequence"
    seq = getattr(gc, op)(**arrays, **settings)
    states = set(SPECS[cell].sequence.states)
    chunked = {k: (da.from_array(v, chunks=(v.shape[0], 2, v.shape[2])) if k == "x"
                   else da.from_array(v, chunks=(2, v.shape[1])) if k in states
                   else v) for k, v in arrays.items()}
    lazy = getattr(gc, op)(**chunked, **settings)
    np.testing.assert_allclose(np.asarray(lazy.h), seq.h, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(np.asarray(lazy.h_final), seq.h_final, rtol=1e-13, atol=1e-14)


# --------------------------------------------------------------------------------------
# The linear scan (docs/spec.md §18.1): registered apart from the cells, its adapters are
# its own (``gradcells/torch/_scan.py``); these hold them to the NumPy call.

_SCAN_KINDS = ("real", "complex", "real_a")


def _scan_case(kind, seed=3, steps=5, batch=3, width=2):
    rng = np.random.default_rng(seed)
    shape = (steps, batch, width)
    a = rng.uniform(0.5, 1.0, shape)
    b, h0 = rng.standard_normal(shape), rng.standard_normal((batch, width))
    if kind != "real":
        b, h0 = b + 1j * rng.standard_normal(shape), h0 + 1j * rng.standard_normal(h0.shape)
    if kind == "complex":
        a = a * np.exp(1j * rng.uniform(-1, 1, shape))
    options = {"seq_len": np.array([steps, 2, 0][:batch]), "reverse": True,  # 2 < steps
               "resets": rng.random((steps, batch)) < 0.3}
    return (a, b, h0), options


@pytest.mark.parametrize("kind", _SCAN_KINDS)
def test_torch_linear_scan_passes_gradcheck_and_gradgradcheck(kind):
    """``gradcells.torch.linear_scan`` in float64/complex128 with lengths, reverse and
    resets: ``gradcheck`` with forward mode and ``gradgradcheck`` with forward-over-reverse
    over both outputs, and the forward equal to ``gc.linear_scan``'s."""
    torch = pytest.importorskip("torch")
    import gradcells.torch as gt

    arrays, options = _scan_case(kind, steps=3, width=1)
    tensors = tuple(torch.tensor(v, requires_grad=True) for v in arrays)

    def scan(a, b, h0):
        return tuple(gt.linear_scan(a, b, h0, **options))

    result = gt.linear_scan(*tensors, **options)
    expected = gc.linear_scan(*arrays, **options)
    assert result.settings.reverse and np.array_equal(result.settings.resets, options["resets"])
    for got, want in zip(result, expected, strict=True):
        np.testing.assert_array_equal(got.detach().numpy(), want)
    assert torch.autograd.gradcheck(scan, tensors, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(scan, tensors, check_fwd_over_rev=True,
                                        fast_mode=True)


def test_torch_linear_scan_backward_equals_the_numpy_gradient():
    """``loss.backward()`` through ``gradcells.torch.linear_scan`` gives
    ``gc.linear_scan_grad``'s gradients (PyTorch's complex convention on both sides)."""
    torch = pytest.importorskip("torch")
    import gradcells.torch as gt

    arrays, options = _scan_case("complex", seed=4)
    tensors = tuple(torch.tensor(v, requires_grad=True) for v in arrays)
    result = gt.linear_scan(*tensors, **options)
    u = np.random.default_rng(5).standard_normal(result.h.shape) * (1 + 2j)
    (result.h * torch.tensor(u).conj()).real.sum().backward()
    grads = gc.linear_scan_grad(*arrays, gc.linear_scan(*arrays, **options), d_h=u)
    for tensor, want in zip(tensors, grads, strict=True):
        np.testing.assert_allclose(tensor.grad.numpy(), want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("kind", _SCAN_KINDS)
def test_jax_linear_scan_equals_jax_autodiff_of_a_transcription(kind):
    """``jax.jit(jax.grad(...))``, ``jax.jvp`` and forward over reverse (Hessian-vector
    products) through ``gradcells.jax.linear_scan`` with resets equal JAX's own autodiff of
    a ``jax.numpy`` loop (JAX's complex convention, the conjugate of PyTorch's), and the
    forward and ``jax.vmap`` equal it too."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    import gradcells.jax as gj

    (a, b, h0), options = _scan_case(kind, seed=6)
    resets = options["resets"]

    def transcription(a, b, h0):
        states, state = [], h0
        for t in range(a.shape[0]):
            state = jnp.where(resets[t][:, None], 0, a[t] * state) + b[t]
            states.append(state)
        return jnp.stack(states), state

    u = np.random.default_rng(9).standard_normal(b.shape) * (1 + 1j if kind != "real" else 1)

    def loss(scan):
        def value(a, b, h0):
            h, h_final = scan(a, b, h0)
            return jnp.real(jnp.sum(h * jnp.conj(u))) + jnp.real(jnp.sum(h_final))
        return value

    def scan(*v):
        return tuple(gj.linear_scan(*v, resets=resets))

    rng = np.random.default_rng(12)
    primals = (a, b, h0)
    tangents = tuple((rng.standard_normal(v.shape) * (1 + 1j if v.dtype.kind == "c" else 1)
                      ).astype(v.dtype) for v in primals)
    for ours, theirs in [
            (jax.jit(jax.grad(loss(scan), argnums=(0, 1, 2)))(*primals),
             jax.grad(loss(transcription), argnums=(0, 1, 2))(*primals)),
            (jax.jvp(scan, primals, tangents)[1],
             jax.jvp(transcription, primals, tangents)[1]),
            (jax.jvp(jax.grad(loss(scan), argnums=(0, 1, 2)), primals, tangents)[1],
             jax.jvp(jax.grad(loss(transcription), argnums=(0, 1, 2)), primals, tangents)[1])]:
        for got, want in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    mapped = jax.vmap(lambda *v: gj.linear_scan(*v).h)(*(np.stack([v, 2 * v]) for v in primals))
    np.testing.assert_allclose(mapped[1], gc.linear_scan(2 * a, 2 * b, 2 * h0).h, rtol=1e-14)
    np.testing.assert_allclose(gj.linear_scan(a, b, h0, resets=resets).h,
                               transcription(a, b, h0)[0], rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="resets must"):
        gj.linear_scan(a, b, h0, resets=resets[:2])


def test_dask_linear_scan_chunked_along_the_batch_equals_numpy():
    """``gc.linear_scan`` and its gradient on complex dask arrays chunked along the batch
    (resets, lengths, reverse and ``batch_first``) equal the NumPy call; a gradient given
    the lazy result reads its record; a shape error is raised at call time, named."""
    da = pytest.importorskip("dask.array")
    (a, b, h0), options = _scan_case("complex", seed=10, steps=5, batch=3)
    a, b = (np.ascontiguousarray(v.swapaxes(0, 1)) for v in (a, b))
    options = {**options, "resets": options["resets"].T.copy(), "batch_first": True}
    result = gc.linear_scan(a, b, h0, **options)
    u = np.random.default_rng(11).standard_normal(b.shape) * (1 - 1j)
    grads = gc.linear_scan_grad(a, b, h0, result, d_h=u)
    chunked = (da.from_array(a, chunks=(2, -1, -1)), da.from_array(b, chunks=(2, -1, -1)),
               da.from_array(h0, chunks=(2, -1)))
    lazy = gc.linear_scan(*chunked, **options)
    assert isinstance(lazy.h, da.Array)
    for got, want in zip(lazy, result, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    lazy_grads = gc.linear_scan_grad(*chunked, lazy, d_h=u)
    for got, want in zip(lazy_grads, grads, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    with pytest.raises(ValueError, match="h0 has 2 rows on its batch axis 0, a has 3"):
        gc.linear_scan(*chunked[:2], chunked[2][:2], **options)


@pytest.mark.parametrize("kind", _SCAN_KINDS)
def test_torch_linear_scan_custom_op_equals_the_eager_function(kind, monkeypatch):
    """Under torch.compile ``gradcells.torch.linear_scan`` is ``torch.ops.gradcells.
    linear_scan`` (run here eagerly with ``is_compiling`` reporting True): the outputs and
    gradients equal the eager path's bit for bit, complex included, and its fake
    implementation gives the real shapes and dtypes (a real ``a`` with a complex ``b``:
    complex states)."""
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import gradcells.torch as gt

    arrays, options = _scan_case(kind, seed=13)
    u = np.random.default_rng(14).standard_normal(arrays[1].shape) * (1 + 1j)

    def run():
        tensors = [torch.tensor(v, requires_grad=True) for v in arrays]
        result = gt.linear_scan(*tensors, **options)
        loss = (result.h * torch.tensor(u.real if kind == "real" else u)).real.sum()
        return result, torch.autograd.grad(loss + result.h_final.real.sum(), tensors)

    eager = run()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    custom = run()
    assert "gradcells_linear_scan_default" in custom[0].h.grad_fn.name()
    for got, want in zip([*custom[0], *custom[1]], [*eager[0], *eager[1]], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = gt.linear_scan(*(mode.from_tensor(torch.tensor(v)) for v in arrays), **options)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in eager[0]]


# the RG-LRU's resets: a per-step boolean flag through every adapter


def _rglru_case(steps=4, batch=4, **options):
    case = cases.rglru_sequence_case(np.random.default_rng(9), steps=steps, batch=batch,
                                     hidden=4, resets=True, **options)
    arrays = {k: case[k] for k in SPECS["rglru"].sequence.arrays}
    return arrays, {k: v for k, v in case.items() if k not in arrays}


@pytest.mark.parametrize("options", [{}, {"reverse": True, "sqrt_grad_bound": 2.0}])
def test_rglru_resets_under_jax_equal_numpy(options):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import gradcells.jax as gj

    arrays, keywords = _rglru_case(**options)
    seq = gc.rglru_sequence(**arrays, **keywords)
    d_h = np.random.default_rng(10).standard_normal(seq.h.shape)
    grads = gc.rglru_sequence_grad(**arrays, seq=seq, d_h=d_h)

    def loss(a):
        return (gj.rglru_sequence(**a, **keywords).h * d_h).sum()

    jax_arrays = {k: jax.numpy.asarray(v) for k, v in arrays.items()}
    got = jax.jit(jax.grad(loss))(jax_arrays)
    for name in arrays:
        np.testing.assert_allclose(got[name], getattr(grads, name), rtol=1e-12, atol=1e-13,
                                   err_msg=name)


def test_rglru_resets_on_dask_chunked_along_the_batch_equal_numpy():
    da = pytest.importorskip("dask.array")
    arrays, keywords = _rglru_case(ragged=True)
    seq = gc.rglru_sequence(**arrays, **keywords)
    chunked = {k: (da.from_array(v, chunks=(v.shape[0], 2, v.shape[2])) if k == "x"
                   else da.from_array(v, chunks=(2, v.shape[1])) if k == "h0" else v)
               for k, v in arrays.items()}
    resets = da.from_array(keywords["resets"], chunks=(4, 2))
    lazy = gc.rglru_sequence(**chunked, **{**keywords, "resets": resets})
    np.testing.assert_allclose(np.asarray(lazy.h), seq.h, rtol=1e-13, atol=1e-14)
    d_h = np.ones_like(seq.h)
    want = gc.rglru_sequence_grad(**arrays, seq=seq, d_h=d_h)
    got = gc.rglru_sequence_grad(**chunked, seq=lazy, d_h=da.from_array(d_h,
                                                                        chunks=(4, 2, 4)))
    for name, a, b in zip(want._fields, got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-12, atol=1e-13, err_msg=name)


def test_rglru_under_torch_passes_gradcheck_and_gradgradcheck():
    """Every output, float64, forward mode too, with resets (a constant), lengths, reverse
    and the bound (``test_torch_functions`` runs the drawn cases without it)."""
    options = {"reverse": True, "ragged": True, "sqrt_grad_bound": 2.0}
    torch = pytest.importorskip("torch")
    import gradcells.torch as gt

    arrays, keywords = _rglru_case(steps=3, batch=2, **options)
    assert keywords["resets"].any()
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays.values()]
    keywords = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v
                for k, v in keywords.items()}

    def f(*t):
        return tuple(gt.rglru_sequence(*t, **keywords))

    assert torch.autograd.gradcheck(f, tensors, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, tensors)


def test_the_rglru_module_is_recurrentgemmas_layer_on_the_sequence():
    """``gradcells.torch.RGLRU``: recurrentgemma's parameter names and shapes, its
    ``forward(x, segment_pos, cache)`` (batch first, a reset where ``segment_pos == 0``)
    equal to ``gc.rglru_sequence`` on the converted parameters, its gradients reaching every
    parameter; ``a_param`` initialised as recurrentgemma's ``rnn_param_init``: ``σ(-a_param)
    = exp(-softplus(a_param))`` on the ring of radii 0.9 to 0.999."""
    torch = pytest.importorskip("torch")
    import gradcells.torch as gt

    torch.manual_seed(0)
    module = gt.RGLRU(6, 3, dtype=torch.float64)
    shapes = {k: tuple(p.shape) for k, p in module.named_parameters()}
    assert shapes == {"a_param": (6,), "input_gate.w": (3, 2, 2), "input_gate.b": (3, 2),
                      "a_gate.w": (3, 2, 2), "a_gate.b": (3, 2)}
    decay = np.exp(-np.logaddexp(0, module.a_param.detach().numpy()))
    assert np.all((decay >= 0.9 - 1e-12) & (decay <= 0.999 + 1e-12))
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    segment_pos = torch.tensor([[0, 1, 0, 1], [2, 3, 4, 0]])
    cache = torch.randn(2, 6, dtype=torch.float64)
    y, last = module(x, segment_pos, cache)
    p = {k: v.detach().numpy() for k, v in module.named_parameters()}
    converted = gc.layouts.rglru_from_recurrentgemma(
        p["a_param"], p["input_gate.w"], p["input_gate.b"], p["a_gate.w"], p["a_gate.b"])
    seq = gc.rglru_sequence(x.numpy(), cache.numpy(), *converted,
                            resets=(segment_pos == 0).numpy(), batch_first=True)
    np.testing.assert_allclose(y.detach().numpy(), seq.h, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(last.detach().numpy(), seq.h_final, rtol=1e-13, atol=1e-14)
    (y.sum() + last.sum()).backward()
    assert all(q.grad is not None and torch.isfinite(q.grad).all()
               for q in module.parameters())
    assert module(x, segment_pos, return_cache=False)[1] is None


def _selective_case(seed=21, optional=True, **sizes):
    case = cases.selective_scan_case(np.random.default_rng(seed), optional=optional, **sizes)
    names = [k for k in gc.SelectiveScanGrads._fields if case[k] is not None]
    return names, case


@pytest.mark.parametrize("optional", [False, True], ids=["plain", "D-z-bias"])
def test_torch_selective_scan_passes_gradcheck_and_gradgradcheck(optional):
    """``gradcells.torch.selective_scan`` in float64 (grouped B, softplus, reverse):
    ``gradcheck`` with forward mode and ``gradgradcheck`` with forward-over-reverse over
    both outputs and every input given, and the forward equal to ``gc.selective_scan``'s."""
    torch = pytest.importorskip("torch")
    import gradcells.torch as gt

    names, case = _selective_case(optional=optional, batch=1, channels=2, state=2, steps=3,
                                  groups_b=2, delta_softplus=True, reverse=True)
    settings = {k: case[k] for k in ("delta_softplus", "reverse", "return_last_state")}
    tensors = tuple(torch.tensor(case[k], requires_grad=True) for k in names)

    def scan(*t):
        named = dict(zip(names, t, strict=True))
        positional = [named.pop(k) for k in ("u", "delta", "A", "B", "C")]
        return tuple(gt.selective_scan(*positional, **named, **settings))

    result = gt.selective_scan(*tensors[:5], **dict(zip(names[5:], tensors[5:], strict=True)),
                               **settings)
    expected = gc.selective_scan(*(case[k] for k in ("u", "delta", "A", "B", "C")),
                                 **{k: case[k] for k in names[5:]}, **settings)
    assert result.settings.reverse and result.settings.delta_softplus
    for got, want in zip(result, expected, strict=True):
        np.testing.assert_array_equal(got.detach().numpy(), want)
    assert torch.autograd.gradcheck(scan, tensors, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(scan, tensors, check_fwd_over_rev=True,
                                        fast_mode=True)
    assert gt.selective_scan(*(t.detach() for t in tensors[:5])).last_state is None


def test_jax_selective_scan_jit_grad_equals_numpy():
    """``jax.jit(jax.grad(...))`` through ``gradcells.jax.selective_scan`` (a loss on both
    outputs) equals ``gc.selective_scan_grad``; a shape error is raised at trace time,
    named."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import gradcells.jax as gj

    names, case = _selective_case(seed=23, groups_c=2, delta_softplus=True)
    arrays = [case[k] for k in names]
    rng = np.random.default_rng(24)
    result = gc.selective_scan(*arrays[:5], **dict(zip(names[5:], arrays[5:], strict=True)),
                               delta_softplus=True, return_last_state=True)
    d_y, d_last = (rng.standard_normal(v.shape) for v in result)

    def loss(*a):
        r = gj.selective_scan(*a[:5], **dict(zip(names[5:], a[5:], strict=True)),
                              delta_softplus=True, return_last_state=True)
        return (r.y * d_y).sum() + (r.last_state * d_last).sum()

    got = jax.jit(jax.grad(loss, argnums=tuple(range(len(names)))))(*arrays)
    want = gc.selective_scan_grad(*arrays[:5], result,
                                  **dict(zip(names[5:], arrays[5:], strict=True)),
                                  d_y=d_y, d_last_state=d_last)
    for name, g in zip(names, got, strict=True):
        np.testing.assert_allclose(g, getattr(want, name), rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(gj.selective_scan(*arrays[:5]).y,
                                  gc.selective_scan(*arrays[:5]).y)
    with pytest.raises(ValueError, match="delta must have shape"):
        gj.selective_scan(arrays[0], arrays[1][:, :, :2], *arrays[2:5])


_SELECTIVE_JAX = {
    "grouped-D-z-bias-last_state": (dict(seed=25, batch=2, channels=4, state=2, steps=3,
                                         groups_b=2, groups_c=4, delta_softplus=True,
                                         reverse=True), True),
    "plain": (dict(seed=26, optional=False, batch=2, channels=2, state=3, steps=3), False),
}


@pytest.mark.parametrize("variant", _SELECTIVE_JAX)
def test_jax_selective_scan_jvp_vmap_and_hessian_vector_products_equal_numpy(variant,
                                                                             monkeypatch):
    """Through the generic primitives: ``jax.jvp`` equals ``gc.selective_scan_jvp``;
    ``jax.vmap`` over the per-row arrays (u, delta, z, B, C) is one call on N·Bt rows
    (folded into ``Bt``) and over ``A`` one call per index, each equal to a loop of
    ``gc.selective_scan``; ``jax.grad`` and its ``jax.jvp`` (a Hessian-vector product)
    equal ``gc.selective_scan_grad`` and ``_grad_jvp``; ``last_state`` is None unless
    asked for."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import gradcells.jax as gj

    sizes, last = _SELECTIVE_JAX[variant]
    names, case = _selective_case(**sizes)
    arrays = {k: case[k] for k in names}
    settings = {k: sizes.get(k, False) for k in ("delta_softplus", "reverse")}
    settings["return_last_state"] = last
    real = gc.selective_scan
    result = real(**arrays, **settings)
    assert (result.last_state is None) is not last
    rng = np.random.default_rng(27)
    t = {k: rng.standard_normal(v.shape) for k, v in arrays.items()}
    tangents = gc.SelectiveScanGrads(**{**dict.fromkeys(gc.SelectiveScanGrads._fields), **t})

    def scan(a):
        return tuple(gj.selective_scan(**a, **settings))

    _, got = jax.jvp(scan, (arrays,), (t,))
    _, want = gc.selective_scan_jvp(**arrays, tangents=tangents, **settings)
    assert (got[1] is None) is not last
    for g, w in zip(got, want, strict=True):
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)

    calls = []

    def counted(**kwargs):
        calls.append(kwargs["u"].shape[0])
        return real(**kwargs)

    monkeypatch.setattr(gc, "selective_scan", counted)
    per_row = [k for k in ("u", "delta", "z", "B", "C") if k in arrays]
    stacked = {k: np.stack([arrays[k], 1.5 * arrays[k]]) for k in arrays}
    mapped = jax.vmap(lambda m: scan({**arrays, **m}))({k: stacked[k] for k in per_row})
    assert calls == [2 * case["u"].shape[0]]
    calls.clear()
    by_a = jax.vmap(lambda A: scan({**arrays, "A": A}))(stacked["A"])
    assert calls == [case["u"].shape[0]] * 2
    for k in range(2):
        for got, want in ((tuple(f[k] for f in mapped if f is not None),
                           real(**{**arrays, **{n: stacked[n][k] for n in per_row}},
                                **settings)),
                          (tuple(f[k] for f in by_a if f is not None),
                           real(**{**arrays, "A": stacked["A"][k]}, **settings))):
            for g, w in zip(got, (w for w in want if w is not None), strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)

    d_y = rng.standard_normal(result.y.shape)
    d_last = rng.standard_normal(result.last_state.shape) if last else None

    def loss(a):
        r = gj.selective_scan(**a, **settings)
        return (r.y * d_y).sum() + ((r.last_state * d_last).sum() if last else 0.0)

    grads = gc.selective_scan_grad(**arrays, result=result, d_y=d_y, d_last_state=d_last)
    _, hvp = gc.selective_scan_grad_jvp(**arrays, result=result, tangents=tangents, d_y=d_y,
                                        d_last_state=d_last)
    got_grads = jax.jit(jax.grad(loss))(arrays)
    _, got_hvp = jax.jvp(jax.grad(loss), (arrays,), (t,))
    for name in names:
        np.testing.assert_allclose(got_grads[name], getattr(grads, name), rtol=1e-12,
                                   atol=1e-13, err_msg=name)
        np.testing.assert_allclose(got_hvp[name], getattr(hvp, name), rtol=1e-12,
                                   atol=1e-13, err_msg=name)
