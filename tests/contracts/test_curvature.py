"""Curvature products under a loss (docs/spec.md §12): ``gc.hessian_vector_product`` and
``gc.gauss_newton_vector_product`` for ``L(a) = ℓ(op(a))``.

- the Hessian-vector product equals central differences of the gradient ``∇L`` along the
  tangent (``check_jvp``), for the three cells' sequences with lengths and a squared loss
  on ``h`` and ``h_final``;
- it equals PyTorch's ``torch.autograd.functional.hvp`` through ``nn.LSTM`` itself, with the
  module's weights carried over by ``gc.layouts``;
- the Gauss-Newton product is symmetric and positive semi-definite for a convex loss, and
  ``<t, G·t>`` is the squared norm of the result's tangent, as ``G = Jᵀ·J`` says for a
  squared loss;
- names that are not upstream gradients are refused.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells import testing
from gradcells.cells import OPS, OPTIONAL_WEIGHTS

SEQUENCES = ["lstm_sequence", "gru_sequence", "rnn_sequence"]


def _split(op, case):
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def _squared_loss(rng, case, op):
    """ℓ = ½|h - y|² + ½|h_final - y_final|²: its gradient and Hessian-vector product."""
    steps, batch = case["x"].shape[:2]
    width = case["h0"].shape[1]
    y, y_final = rng.standard_normal((steps, batch, width)), rng.standard_normal((batch, width))

    def loss_grad(result):
        return {"d_h": result.h - y, "d_h_final": result.h_final - y_final}

    def loss_hvp(result, d_result):
        return {"d_h": d_result.h, "d_h_final": d_result.h_final}

    return loss_grad, loss_hvp


def _tangents(rng, op, arrays, keywords):
    spec = OPS[op]
    given = {**dict(zip(spec.arrays[:len(arrays)], arrays, strict=True)), **keywords}
    return spec.grads(*(None if given.get(n) is None else rng.standard_normal(given[n].shape)
                        for n in spec.grads._fields if n != "layer_norm"))


def _flat(grads):
    return tuple(g for g in grads if g is not None)


@pytest.mark.parametrize("op", SEQUENCES)
def test_the_hessian_vector_product_is_the_gradients_derivative(op, rng):
    case = testing.OPS[op][0](rng)
    for name in ("layer_norm", "ln_epsilon", "ln_carry"):   # the flat arrays' tangents only
        case.pop(name, None)
    arrays, keywords = _split(op, case)
    loss_grad, loss_hvp = _squared_loss(rng, case, op)
    tangents = _tangents(rng, op, arrays, keywords)
    gradient, hvp = gc.hessian_vector_product(getattr(gc, op), arrays, tangents,
                                              loss_grad=loss_grad, loss_hvp=loss_hvp, **keywords)
    optional = [k for k in OPTIONAL_WEIGHTS if keywords.get(k) is not None]

    def grad_of(*a):
        named = {**keywords, **dict(zip(optional, a[len(arrays):], strict=True))}
        result = getattr(gc, op)(*a[:len(arrays)], **named)
        g = getattr(gc, f"{op}_grad")(*a[:len(arrays)], result, **loss_grad(result),
                                      **{k: named[k] for k in optional})
        return _flat(g)

    args = (*arrays, *(keywords[k] for k in optional))
    report = gc.check_jvp(grad_of, lambda t, *a: _flat(hvp), args, tangents=_flat(tangents))
    assert report.passed, report
    for a, b in zip(_flat(gradient), grad_of(*args), strict=True):      # the loss's gradient itself
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("op", SEQUENCES)
def test_the_gauss_newton_product_is_symmetric_and_positive(op, rng):
    case = testing.OPS[op][0](rng)
    arrays, keywords = _split(op, case)
    _, loss_hvp = _squared_loss(rng, case, op)
    u, v = (_tangents(rng, op, arrays, keywords) for _ in range(2))
    gu, gv = (gc.gauss_newton_vector_product(op, arrays, t, loss_hvp=loss_hvp, **keywords)
              for t in (u, v))

    def dot(a, b):
        return sum(float(np.sum(x * y)) for x, y in zip(_flat(a), _flat(b), strict=True))

    assert abs(dot(v, gu) - dot(u, gv)) <= 1e-10 * (abs(dot(v, gu)) + 1)
    assert dot(u, gu) >= -1e-12 and dot(v, gv) >= -1e-12
    # G·u is Jᵀ(J·u): the squared norm of the result's tangent.
    _, d_result = getattr(gc, f"{op}_jvp")(*arrays, u, **keywords)
    assert np.isclose(dot(u, gu), float(np.sum(d_result.h ** 2) + np.sum(d_result.h_final ** 2)),
                      rtol=1e-10)


def test_the_hessian_vector_product_equals_pytorchs_through_nn_lstm(rng):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.nn.LSTM(3, 4).double()
    weights = gc.layouts.stack_from_torch(module)
    x = rng.standard_normal((5, 2, 3))
    y = rng.standard_normal((5, 2, 4))
    zeros = np.zeros((2, 4))
    w = weights[0]
    arrays = [x, zeros, zeros, w.w, w.b]
    keywords = {k: v for k, v in weights.options.items()
                if k in ("forget_bias", "cell_clip")}
    params = [p.detach().clone() for p in module.parameters()]
    directions = [torch.randn_like(p) for p in params]

    def loss(*p):
        out, _ = torch.func.functional_call(module, dict(zip(
            [n for n, _ in module.named_parameters()], p, strict=True)), (torch.tensor(x),))
        return 0.5 * ((out - torch.tensor(y)) ** 2).sum()

    _, expected = torch.autograd.functional.hvp(loss, tuple(params), tuple(directions))
    # The same direction in gradcells's layout: convert a module holding the direction.
    moved = torch.nn.LSTM(3, 4).double()
    with torch.no_grad():
        for p, d in zip(moved.parameters(), directions, strict=True):
            p.copy_(d)
    d_w = gc.layouts.stack_from_torch(moved)[0]
    # b = b_ih + b_hh: its tangent is the sum; the layout's forget_bias is 0 for torch.
    tangents = gc.LSTMSequenceGrads(None, None, None, d_w.w, d_w.b)
    _, hvp = gc.hessian_vector_product(
        gc.lstm_sequence, arrays, tangents, loss_grad=lambda r: {"d_h": r.h - y},
        loss_hvp=lambda r, d: {"d_h": d.h}, **keywords)
    # Back to PyTorch's parameters. Both biases enter as their sum b, so each one's HVP is
    # all of b's: stack_to_torch puts b in bias_ih and zeros in bias_hh.
    back = gc.layouts.stack_to_torch([gc.LSTMWeights(hvp.w, hvp.b)])
    for (name, _), e in zip(module.named_parameters(), expected, strict=True):
        got = back["bias_ih_l0"] + back["bias_hh_l0"] if name.startswith("bias") else back[name]
        np.testing.assert_allclose(got, e.numpy(), rtol=1e-9, atol=1e-11, err_msg=name)


def test_names_that_are_not_upstream_gradients_are_refused(rng):
    case = testing.rnn_sequence_case(rng)
    arrays, keywords = _split("rnn_sequence", case)
    with pytest.raises(ValueError, match="loss_hvp must map the gradient's upstream names"):
        gc.gauss_newton_vector_product(gc.rnn_sequence, arrays, None,
                                       loss_hvp=lambda r, d: {"d_cs": d.h}, **keywords)
    with pytest.raises(TypeError, match="op must be a cell, sequence or stack op"):
        gc.hessian_vector_product(gc.check_vjp, arrays, None, loss_grad=dict,
                                  loss_hvp=dict, **keywords)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_a_stacks_hessian_vector_product_is_its_gradients_derivative(cell, rng):
    """A 2-layer bidirectional stack with dropout masks and ragged lengths: H·t against
    central differences of the gradient of ½|h - y|² along t (every weight's tangent)."""
    case = testing.stack_case(rng, cell)
    states = ("cs0", "h0") if cell == "lstm" else ("h0",)
    keywords = {k: v for k, v in case.items() if k not in ("x", "weights", *states)}
    f, vjp, args, _ = testing.stack_vjp_pair(cell, case)
    y = rng.standard_normal(f(*args)[0].shape)
    _, jvp, _, _ = testing.stack_vjp_pair(cell, case, mode="jvp")
    tangents = [rng.standard_normal(a.shape) for a in args]
    weights_t = testing.pairs._rebuilt(case["weights"], tangents[1 + len(states):])
    given = testing.pairs._STACK_GRADS[cell](tangents[0], *tangents[1:1 + len(states)],
                                             weights_t)
    arrays = (case["x"], *(case[k] for k in states), case["weights"])
    _, hvp = gc.hessian_vector_product(getattr(gc, f"{cell}_stack"), arrays, given,
                                       loss_grad=lambda r: {"d_h": r.h - y},
                                       loss_hvp=lambda r, d: {"d_h": d.h}, **keywords)
    flat_hvp = (hvp.x, *(getattr(hvp, k) for k in states),
                *testing.pairs._flat_weights(hvp.weights)[1])

    def gradient(*a):
        outputs = f(*a)
        return vjp((outputs[0] - y, *(np.zeros_like(o) for o in outputs[1:])), *a)

    report = gc.check_jvp(gradient, lambda t, *a: flat_hvp, args, tangents=tangents)
    assert report.passed, report
