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
