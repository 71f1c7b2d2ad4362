"""Forward mode of the cell and sequence operations (docs/spec.md §12): ``op_jvp`` returns the
forward's result and its directional derivative along the inputs' tangents.

- the stacks' (``op_jvp`` of every layer and direction) too;
- the tangents equal central differences along them (``check_jvp``, float64 and float32)
  on random cases with every option: peepholes, clips, projection, layer norm and both
  carries, reset-after, relu, ragged lengths, both directions and layouts, every mask;
- they are the same linear map as the gradients: ``<ct, J·t> = <Jᵀ·ct, t>`` to round-off
  with the ``_grad`` ops' cotangent (an independent derivation, checked to 1e-12);
- the result is the forward's, recording its settings; the tangent is linear in the
  tangents; None tangents are zeros; bad tangents are named; PyTorch tensors come back as
  tensors; every backend runs forward mode and the second order (NumPy arrays on the cpu).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells import _dispatch, testing
from gradcells.cells import OPS, OPTIONAL_WEIGHTS

FORWARD_OPS = ["lstm_cell", "gru_cell", "rnn_cell", "lstm_sequence", "gru_sequence",
               "rnn_sequence"]
STACKS = ["lstm_stack", "gru_stack", "rnn_stack"]


def _jvp_pair(op, case, **options):
    return testing.OPS[op][1](case, mode="jvp", **options)


@pytest.mark.parametrize("op", FORWARD_OPS + STACKS)
@given(seed=st.integers(0, 2**32 - 1))
def test_tangents_equal_central_differences(op, seed):
    case = testing.OPS[op][0](np.random.default_rng(seed))
    testing.jvp_check(op, case, seed=seed).raise_if_failed()


@pytest.mark.parametrize("op", FORWARD_OPS)
def test_float32_tangents_are_held_to_float32(op, rng):
    for _ in range(5):
        case = testing.OPS[op][0](rng, np.float32)
        report = testing.jvp_check(op, case)
        assert report.passed, report
        assert report.rtol == 1e-3


@pytest.mark.parametrize("op", FORWARD_OPS + STACKS)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_tangent_and_the_gradient_are_one_linear_map(op, seed):
    """<ct, J·t> (the JVP) equals <Jᵀ·ct, t> (the VJP) for random t and ct: the forward and
    reverse derivations, written independently, agree to round-off."""
    rng = np.random.default_rng(seed)
    case = testing.OPS[op][0](rng)
    f, jvp, args, _ = _jvp_pair(op, case)
    _, vjp, _, _ = testing.OPS[op][1](case)
    tangents = [rng.standard_normal(a.shape) for a in args]
    outputs = f(*args)
    cotangents = [rng.standard_normal(o.shape) for o in outputs]
    forward = sum(float(np.sum(c * d))
                  for c, d in zip(cotangents, jvp(tangents, *args), strict=True))
    grads = vjp(tuple(cotangents), *args)
    reverse = sum(float(np.sum(g * t))
                  for g, t in zip(grads, tangents, strict=True) if g is not None)
    scale = sum(float(np.sum(np.abs(c * d))) for c, d in zip(cotangents,
                                                              jvp(tangents, *args), strict=True))
    assert abs(forward - reverse) <= 1e-12 * max(scale, 1.0), (forward, reverse)


def _split(op, case):
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


@pytest.mark.parametrize("op", FORWARD_OPS)
def test_the_result_is_the_forwards_and_records_its_settings(op, rng):
    case = testing.OPS[op][0](rng)
    positional, keywords = _split(op, case)
    result, d_result = getattr(gc, f"{op}_jvp")(*positional, None, **keywords)
    expected = getattr(gc, op)(*positional, **keywords)
    for a, b in zip(result, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    assert repr(result.settings) == repr(expected.settings)
    for d in d_result:           # tangents None: every tangent zero
        assert not np.any(d)
    # The result is one its gradient takes as the forward's.
    getattr(gc, f"{op}_grad")(*positional, result, **{
        k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS})


@pytest.mark.parametrize("op", ["lstm_sequence", "gru_sequence", "rnn_sequence"])
def test_the_tangent_is_linear_in_the_tangents(op, rng):
    case = testing.OPS[op][0](rng)
    f, jvp, args, _ = _jvp_pair(op, case)
    t1, t2 = ([rng.standard_normal(a.shape) for a in args] for _ in range(2))
    combined = jvp([2.5 * a + b for a, b in zip(t1, t2, strict=True)], *args)
    for c, a, b in zip(combined, jvp(t1, *args), jvp(t2, *args), strict=True):
        np.testing.assert_allclose(c, 2.5 * a + b, rtol=1e-12, atol=1e-12)
    # A None tangent is a zero one.
    with_none = jvp([None] + t1[1:], *args)
    with_zero = jvp([np.zeros_like(args[0])] + t1[1:], *args)
    for a, b in zip(with_none, with_zero, strict=True):
        np.testing.assert_array_equal(a, b)


def _lstm_case(rng, **options):
    return testing.lstm_sequence_case(rng, peephole=True, **options)


def _lstm_jvp(case, tangents, backend=None):
    return gc.lstm_sequence_jvp(case["x"], case["cs0"], case["h0"], case["w"], case["b"],
                                tangents, wci=case["wci"], wcf=case["wcf"], wco=case["wco"],
                                backend=backend)


def test_bad_tangents_are_named(rng):
    case = _lstm_case(rng)
    zeros = {k: np.zeros_like(v) for k, v in case.items() if isinstance(v, np.ndarray)}
    good = gc.LSTMSequenceGrads(x=zeros["x"], cs0=None, h0=None, w=None, b=None)
    _lstm_jvp(case, good)
    with pytest.raises(ValueError, match=r"tangents.x must have its primal's shape"):
        _lstm_jvp(case, good._replace(x=zeros["x"][:, :1]))
    with pytest.raises(TypeError, match="tangents.w must have the same dtype as w"):
        _lstm_jvp(case, good._replace(w=zeros["w"].astype(np.float32)))
    with pytest.raises(ValueError, match="tangents.w_proj is given, but the call has no w_proj"):
        _lstm_jvp(case, good._replace(w_proj=np.zeros((5, 2))))
    with pytest.raises(TypeError, match="tangents must be a LSTMSequenceGrads"):
        _lstm_jvp(case, {"x": zeros["x"]})
    with pytest.raises(TypeError, match="tangents.layer_norm must be None or a gradcells.LSTMNorm"):
        gc.lstm_sequence_jvp(case["x"], case["cs0"], case["h0"], case["w"], case["b"],
                             good._replace(layer_norm=np.zeros(3)),
                             layer_norm=gc.LSTMNorm(*(np.ones(n) for n in (20,) * 4 + (5,) * 2)))


def test_inputs_are_not_modified(rng):
    case = _lstm_case(rng, ragged=True)
    tangents = gc.LSTMSequenceGrads(*(rng.standard_normal(case[k].shape)
                                      for k in ("x", "cs0", "h0", "w", "b", "wci", "wcf",
                                                "wco")))
    before = [a.copy() for a in (*tangents[:8], case["x"], case["w"])]
    _lstm_jvp(case, tangents)
    for a, b in zip((*tangents[:8], case["x"], case["w"]), before, strict=True):
        np.testing.assert_array_equal(a, b)


# The forward-mode and second-order ops: every backend runs all of them.
JVP_OPS = tuple(f"{cell}_{kind}_{mode}" for cell in ("rnn", "gru", "lstm")
                for kind in ("cell", "sequence") for mode in ("jvp", "grad_jvp"))


def test_the_cpu_and_the_gpu_run_forward_mode_and_the_second_order(rng):
    case = _lstm_case(rng)
    tangents = gc.LSTMSequenceGrads(x=np.ones_like(case["x"]), cs0=None, h0=None, w=None,
                                    b=None)
    assert _dispatch.backend_for(None, "numpy") is (
        _dispatch.backend_module("cpu"))               # by default on NumPy arrays: the cpu
    cpu = _lstm_jvp(case, tangents)
    reference = _lstm_jvp(case, tangents, backend="reference")
    for got, want in zip(cpu, reference, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    for backend, library in (("cpu", "numpy"), ("gpu", "cupy")):
        module = _dispatch.backend_module(backend)
        for op in JVP_OPS:
            assert hasattr(module, op)
            assert _dispatch.backend_for(backend, library) is module
            assert hasattr(module, op)
            assert _dispatch.backend_for(None, library) is module


def test_torch_tensors_come_back_as_tensors(rng):
    torch = pytest.importorskip("torch")
    case = _lstm_case(rng)
    as_torch = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    tangents = gc.LSTMSequenceGrads(x=torch.ones_like(as_torch["x"]), cs0=None, h0=None,
                                    w=None, b=None)
    seq, d_seq = _lstm_jvp(as_torch, tangents)
    assert isinstance(seq.h, torch.Tensor) and isinstance(d_seq.h, torch.Tensor)
    _, expected = _lstm_jvp(case, tangents._replace(x=np.ones_like(case["x"])))
    np.testing.assert_array_equal(d_seq.h.numpy(), expected.h)


def test_a_stacks_tangents_are_checked(rng):
    case = testing.stack_case(rng, "gru")
    keywords = {k: v for k, v in case.items() if k not in ("x", "h0", "weights")}
    args = (case["x"], case["h0"], case["weights"])
    stack, d_stack = gc.gru_stack_jvp(*args, None, **keywords)
    np.testing.assert_allclose(stack.h, gc.gru_stack(*args, **keywords).h, rtol=1e-13, atol=1e-15)
    assert not np.any(d_stack.h) and len(d_stack.layers) == len(case["weights"])
    with pytest.raises(ValueError, match="one weight set of tangents"):
        gc.gru_stack_jvp(*args, gc.GRUStackGrads(None, None, [None]), **keywords)
    with pytest.raises(ValueError, match=r"tangents.h0 must have its primal's shape"):
        gc.gru_stack_jvp(*args, gc.GRUStackGrads(None, case["h0"][:1], None), **keywords)
    with pytest.raises(TypeError, match="tangents must be a GRUStackGrads"):
        gc.gru_stack_jvp(*args, (None,), **keywords)


def test_tangents_of_another_library_or_dtype_are_named(rng):
    torch = pytest.importorskip("torch")
    case = testing.rnn_sequence_case(rng)
    positional, keywords = _split("rnn_sequence", case)
    for tangent, error in ((torch.ones(case["x"].shape, dtype=torch.float64),
                            "x and tangents.x come from two array libraries"),
                           (np.ones(case["x"].shape, np.float32),
                            r"tangents.x must have the same dtype as x \(float64\)")):
        with pytest.raises(TypeError, match=error):
            gc.rnn_sequence_jvp(*positional, gc.RNNSequenceGrads(tangent, None, None, None),
                                **keywords)
    as_torch = [torch.tensor(a) for a in positional]
    with pytest.raises(TypeError, match=r"x and tangents.x come from two array libraries"):
        gc.rnn_sequence_jvp(*as_torch, gc.RNNSequenceGrads(case["x"], None, None, None),
                            **keywords)


def test_an_empty_batch_has_empty_tangents(rng):
    case = testing.lstm_sequence_case(rng, batch=0, steps=3)
    positional, keywords = _split("lstm_sequence", case)
    seq, d_seq = gc.lstm_sequence_jvp(*positional, None, **keywords)
    assert d_seq.h.shape == seq.h.shape == (3, 0, case["h0"].shape[1])
    grads, d_grads = gc.lstm_sequence_grad_jvp(*positional, seq, None, d_h=np.ones(seq.h.shape),
                                               d_h_tangent=np.ones(seq.h.shape))
    assert d_grads.x.shape == case["x"].shape and not np.any(d_grads.w)
