"""Second order (docs/spec.md §12): ``op_grad_jvp``, the JVP of each gradient op in all its
array inputs, and the dual numbers it runs on (``gradcells._core.dual``).

- the gradient's tangent equals central differences of the gradient (``check_jvp`` in
  float64) along random tangents of every array and of every upstream gradient, with every
  option, direction, layout and mask, for the cells, the sequences and whole stacks;
- it is symmetric, as a Hessian is: ``<u, H·v> = <v, H·u>`` for the scalar ``<ct, f>``;
- PyTorch's double backward of a transcription (``torch.func.jvp`` over ``torch.func.grad``)
  gives the same Hessian-vector product;
- the reference forward run on dual numbers gives the hand-derived JVPs to round-off (two
  derivations, one check of each other), and the dual namespace's own rules hold.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import gradcells as gc
from gradcells import reference, testing
from gradcells._core.dual import Dual, dual, namespace
from gradcells.cells import OPS, OPTIONAL_WEIGHTS

FORWARD_OPS = ["lstm_cell", "gru_cell", "rnn_cell", "lstm_sequence", "gru_sequence",
               "rnn_sequence"]


@pytest.mark.parametrize("op", FORWARD_OPS + ["lstm_stack", "gru_stack", "rnn_stack"])
@given(seed=st.integers(0, 2**32 - 1))
def test_the_gradients_tangent_equals_central_differences(op, seed):
    case = testing.OPS[op][0](np.random.default_rng(seed))
    testing.grad_jvp_check(op, case, seed=seed).raise_if_failed()


@pytest.mark.parametrize("op", FORWARD_OPS)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_hessian_is_symmetric(op, seed):
    """With the cotangents fixed, the gradient's tangent along (u, 0) is H·u for the scalar
    <ct, f>; <v, H·u> = <u, H·v> to round-off."""
    rng = np.random.default_rng(seed)
    case = testing.OPS[op][0](rng)
    _, jvp, args, _ = testing.OPS[op][1](case, mode="grad_jvp")
    gradient_args = len(testing.OPS[op][1](case)[2])      # the rest are the cotangents
    u, v = ([rng.standard_normal(a.shape) for a in args[:gradient_args]] for _ in range(2))
    zeros = [None] * (len(args) - gradient_args)
    hu, hv = (jvp(t + zeros, *args) for t in (u, v))
    forward = sum(float(np.sum(a * b)) for a, b in zip(v, hu, strict=True))
    backward = sum(float(np.sum(a * b)) for a, b in zip(u, hv, strict=True))
    scale = sum(float(np.sum(np.abs(a * b))) for a, b in zip(v, hu, strict=True)) + 1.0
    assert abs(forward - backward) <= 1e-11 * scale, (forward, backward)


def _split(op, case):
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def test_a_hessian_vector_product_equals_pytorchs_double_backward(rng):
    """L = Σ ct∘h over an LSTM sequence (peepholes, lengths) written in torch ops: its
    Hessian-vector product by torch.func (forward over reverse) against
    lstm_sequence_grad_jvp with the fixed cotangent (whose own tangent is zero)."""
    torch = pytest.importorskip("torch")
    case = testing.lstm_sequence_case(rng, peephole=True, ragged=True, steps=3, batch=3)
    ct = rng.standard_normal(case["x"].shape[:2] + (case["h0"].shape[1],))
    names = ("x", "cs0", "h0", "w", "b", "wci", "wcf", "wco")
    primals = [case[n] for n in names]
    tangents = [rng.standard_normal(a.shape) for a in primals]
    lengths = torch.tensor(case["seq_len"])

    def loss(x, cs, h, w, b, wci, wcf, wco):
        outputs = []
        for t in range(x.shape[0]):
            g = torch.cat([x[t], h], dim=1) @ w + b
            gi, gc_, gf, go = g.chunk(4, dim=1)
            i = torch.sigmoid(gi + cs * wci)
            f = torch.sigmoid(gf + 1.0 + cs * wcf)
            cs_new = i * torch.tanh(gc_) + f * cs
            h_new = torch.sigmoid(go + cs_new * wco) * torch.tanh(cs_new)
            running = (t < lengths)[:, None]
            outputs.append(torch.where(running, h_new, torch.zeros_like(h_new)))
            cs, h = torch.where(running, cs_new, cs), torch.where(running, h_new, h)
        return (torch.stack(outputs) * torch.tensor(ct)).sum()

    as_torch = [torch.tensor(a) for a in primals]
    _, expected = torch.func.jvp(torch.func.grad(loss, argnums=tuple(range(8))),
                                 tuple(as_torch), tuple(torch.tensor(t) for t in tangents))
    seq = gc.lstm_sequence(*primals[:5], wci=case["wci"], wcf=case["wcf"], wco=case["wco"],
                           seq_len=case["seq_len"])
    _, hvp = gc.lstm_sequence_grad_jvp(*primals[:5], seq, gc.LSTMSequenceGrads(*tangents),
                                       d_h=ct, wci=case["wci"], wcf=case["wcf"],
                                       wco=case["wco"])
    for name, a, b in zip(names, (getattr(hvp, n) for n in names), expected, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("op", ["lstm_sequence", "gru_sequence", "rnn_sequence"])
@given(seed=st.integers(0, 2**32 - 1))
def test_the_forward_on_dual_numbers_is_the_hand_derived_jvp(op, seed):
    """Two derivations of forward mode, each a check of the other: the reference's
    hand-written op_jvp, and its forward run on dual numbers."""
    rng = np.random.default_rng(seed)
    case = testing.OPS[op][0](rng)
    positional, keywords = _split(op, case)
    seq, d_seq = getattr(gc, f"{op}_jvp")(*positional, None, **keywords)
    spec = OPS[op]
    settings = seq.settings
    assume(not (settings.reverse or settings.batch_first))   # the backends' order and layout
    arrays = {**dict(zip(spec.arrays[:len(positional)], positional, strict=True)), **keywords}
    primals = [arrays.get(n) for n in spec.arrays]
    tangents = [None if p is None else (type(p)(*(rng.standard_normal(a.shape) for a in p))
                                        if hasattr(p, "_fields") else
                                        rng.standard_normal(p.shape)) for p in primals]
    n = 1 + len(spec.states)
    weights = spec.weights(*primals[n:])
    _, hand = getattr(reference, f"{op}_jvp")(*primals[:n], weights, spec.grads(*tangents),
                                             settings)
    duals = [None if p is None else (type(p)(*map(Dual, p, t)) if hasattr(p, "_fields")
                                     else Dual(p, t)) for p, t in zip(primals, tangents,
                                                                      strict=True)]
    run = getattr(reference, op)(*duals[:n], spec.weights(*duals[n:]), settings)
    for name, a, b in zip(spec.result._fields, run, hand, strict=True):
        np.testing.assert_allclose(a.t, b, rtol=1e-12, atol=1e-13, err_msg=name)


def test_the_dual_numbers_rules():
    xp = namespace(np)
    a, b = dual(np.array([0.5, -2.0, 3.0]), 1.0), dual(np.array([2.0, 4.0, -1.0]),
                                                       np.array([0.0, 1.0, 2.0]))
    np.testing.assert_allclose((a * b).t, a.t * b.p + a.p * b.t)
    np.testing.assert_allclose((a / b).t, (a.t * b.p - a.p * b.t) / b.p ** 2)
    np.testing.assert_allclose((1 - a).t, -a.t)
    np.testing.assert_allclose(xp.tanh(a).t, (1 - np.tanh(a.p) ** 2) * a.t)
    np.testing.assert_allclose(xp.sqrt(b * b).t, np.sign(b.p) * b.t)
    assert (a < b).dtype == bool and list(a < b) == [True, True, False]
    np.testing.assert_array_equal(xp.clip(a, -2.0, 1.0).t, [1.0, 1.0, 0.0])   # boundary: passes
    np.testing.assert_array_equal(xp.maximum(dual(np.array([-1.0, 0.0, 2.0]), 1.0), 0).t,
                                  [0.0, 0.0, 1.0])                            # relu'(0) = 0
    np.testing.assert_array_equal(abs(a).t, [1.0, -1.0, 1.0])
    m = dual(np.arange(6.0).reshape(2, 3), 1.0)
    np.testing.assert_allclose((m @ b).t, m.t @ b.p + m.p @ b.t)
    np.testing.assert_allclose((m.T.sum(axis=0, keepdims=True)).t, [[3.0, 3.0]])
    z = xp.zeros((2, 3))
    z[1] = a
    np.testing.assert_array_equal(z.t, [[0, 0, 0], [1, 1, 1]])
    z[0] = 5.0                                # a constant: zero tangent
    np.testing.assert_array_equal(z.p[0], [5, 5, 5])
    np.testing.assert_array_equal(z.t[0], [0, 0, 0])
    joined = xp.concatenate([a, np.ones(2)])
    np.testing.assert_array_equal(joined.t, [1, 1, 1, 0, 0])
