"""The RG-LRU (docs/spec.md §18.3) against google-deepmind/recurrentgemma's torch ``RGLRU``
layer (``recurrentgemma.torch.layers``), where the package imports (it needs ``einops``,
``jaxtyping``, ``typeguard<3`` and ``sentencepiece``; ``pip install --no-deps
recurrentgemma`` and those).

Its scan accumulates in float32 whatever the input's dtype (``rnn_scan``'s ``acc_dtype``,
and a cache must be float32), so the comparison is in float32: recurrentgemma's layer and
gradcells's ``rglru_sequence`` on the same float32 arrays, to a tolerance of float32's
rounding over a few steps (the two evaluate the same formulas in different orders).
Its gradient bounds the square root's derivative at 1000 (``SqrtBoundDerivative``): the
converter's options carry ``sqrt_grad_bound=1000``; the bound acts only where ``1 - a²``
is below ``1/(4·1000²)``, which its own initialisation never reaches, so its effect is
shown on a case made to reach it."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc

torch = pytest.importorskip("torch")
layers = pytest.importorskip("recurrentgemma.torch.layers",
                             reason="recurrentgemma's torch layers do not import here")

WIDTH, HEADS, BATCH, STEPS = 8, 2, 3, 6
TOL = {"rtol": 2e-5, "atol": 2e-6}
"""float32: a few units in the last place of the values' scale over six steps."""


def _layer(seed, a_param=None):
    torch.manual_seed(seed)
    layer = layers.RGLRU(width=WIDTH, num_heads=HEADS, dtype=torch.float32)
    if a_param is not None:
        with torch.no_grad():
            layer.a_param.copy_(torch.as_tensor(a_param, dtype=torch.float32))
    return layer


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, STEPS, WIDTH)).astype(np.float32)
    segment_pos = np.array([[0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 2, 0], [3, 4, 5, 0, 1, 2]])
    return x, segment_pos


def _theirs(layer, x, segment_pos, cotangents):
    x_t = torch.tensor(x, requires_grad=True)
    y, last_h = layer(x_t, torch.as_tensor(segment_pos))
    torch.autograd.backward((y, last_h), tuple(torch.as_tensor(c) for c in cotangents))
    grads = {"x": x_t.grad.numpy(), **{k: p.grad.numpy() for k, p in layer.named_parameters()}}
    return y.detach().numpy(), last_h.detach().numpy(), grads


def _mine(layer, x, segment_pos, cotangents, **options):
    params = {k: p.detach().numpy() for k, p in layer.named_parameters()}
    converted = gc.layouts.rglru_from_recurrentgemma(
        params["a_param"], params["input_gate.w"], params["input_gate.b"],
        params["a_gate.w"], params["a_gate.b"])
    keywords = {**converted.options, **options, "resets": segment_pos == 0,
                "batch_first": True}
    h0 = np.zeros((BATCH, WIDTH), np.float32)
    seq = gc.rglru_sequence(x, h0, *converted, **keywords)
    d_h, d_final = cotangents
    g = gc.rglru_sequence_grad(x, h0, *converted, seq, d_h=d_h, d_h_final=d_final)
    theirs = gc.layouts.rglru_to_recurrentgemma(g.w_a, g.b_a, g.w_x, g.b_x, g.lam)
    return seq, {"x": g.x, **theirs}


@pytest.mark.parametrize("seed", [0, 1])
def test_forward_and_gradients_equal_recurrentgemmas(seed):
    """Every output and every parameter's and the input's gradient, with document
    boundaries mid-sequence (``segment_pos == 0``), batch first, from recurrentgemma's own
    initialisation (``a`` on the ring 0.9..0.999)."""
    layer = _layer(seed)
    x, segment_pos = _inputs(seed)
    rng = np.random.default_rng(seed + 10)
    cotangents = (rng.standard_normal((BATCH, STEPS, WIDTH)).astype(np.float32),
                  rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    y, last_h, grads = _theirs(layer, x, segment_pos, cotangents)
    seq, mine = _mine(layer, x, segment_pos, cotangents)
    np.testing.assert_allclose(seq.h, y, **TOL)
    np.testing.assert_allclose(seq.h_final, last_h, **TOL)
    assert set(mine) == set(grads)
    for name, value in grads.items():
        np.testing.assert_allclose(mine[name], value, **TOL, err_msg=name)


def test_its_bound_is_the_convention_the_converter_carries():
    """A case where recurrentgemma's bound acts at every element (``a_param`` from -24 to
    -19: ``softplus`` below 6e-9, ``1 - a²`` below ``1/(4·1000²)``): its ``a_param``
    gradient equals gradcells's with the converter's ``sqrt_grad_bound=1000`` and differs
    from the true gradient. (Above the bound, ``1 - a²`` below about 1e-4, recurrentgemma's
    float32 ``1 - exp(2·log a)`` loses digits (one left at 1e-6) where gradcells's
    ``-expm1(2·log a)`` keeps all: there the two differ by its rounding.)"""
    a_param = np.linspace(-24.0, -19.0, WIDTH)
    layer = _layer(2, a_param)
    x, segment_pos = _inputs(2)
    cotangents = (np.ones((BATCH, STEPS, WIDTH), np.float32),
                  np.zeros((BATCH, WIDTH), np.float32))
    _, _, grads = _theirs(layer, x, segment_pos, cotangents)
    _, bounded = _mine(layer, x, segment_pos, cotangents)
    _, true = _mine(layer, x, segment_pos, cotangents, sqrt_grad_bound=None)
    np.testing.assert_allclose(bounded["a_param"], grads["a_param"], **TOL)
    assert not np.allclose(true["a_param"], grads["a_param"], **TOL)


def test_the_torch_module_loads_recurrentgemmas_state_dict():
    """``gradcells.torch.RGLRU`` takes an ``RGLRU``'s state dict as it is and gives its
    forward and, with ``sqrt_grad_bound=1000``, its parameters' gradients."""
    import gradcells.torch as gt

    layer = _layer(3)
    module = gt.RGLRU(WIDTH, HEADS, sqrt_grad_bound=1000.0, dtype=torch.float32)
    module.load_state_dict(layer.state_dict())
    x, segment_pos = _inputs(3)
    cotangents = (np.ones((BATCH, STEPS, WIDTH), np.float32),
                  np.ones((BATCH, WIDTH), np.float32))
    y, last_h, grads = _theirs(layer, x, segment_pos, cotangents)
    y_m, last_m, grads_m = _theirs(module, x, segment_pos, cotangents)
    np.testing.assert_allclose(y_m, y, **TOL)
    np.testing.assert_allclose(last_m, last_h, **TOL)
    for name, value in grads.items():
        np.testing.assert_allclose(grads_m[name], value, **TOL, err_msg=name)
