"""The stacks (docs/spec.md §11.4): ``lstm_stack``, ``gru_stack``, ``rnn_stack`` and their
gradients, on every NumPy backend.

- float64 gradients of the whole stack on the reference (the input, the initial states, every
  weight of every layer and direction, eight drawn elements of each) equal central
  differences, and the CPU's stack equals the reference's, forward and gradient: 1 to
  3 layers, one or two directions, dropout masks of 0/1 and fractional values, ragged
  lengths with 0 and T, both layouts, and per layer the LSTM's peepholes, projection and
  layer norm;
- a stack is its layers: the top outputs and final states are those of the sequences in
  ``stack.layers``, each layer fed the one below (both directions, forward first, times the
  boundary's mask);
- bad input is named (the number of weight sets, the sizes that chain the layers, the
  states' leading axis, the masks); empty batches and sequences are valid; inputs are
  never modified.

Conformance with PyTorch's multi-layer modules is ``test_stacks_torch.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells.testing import stack_case, stack_vjp_pair

BACKENDS = ["reference", "cpu"]
CELLS = ["lstm", "gru", "rnn"]
_CELL_ATTRS = {"lstm": {}, "gru": {"reset_after": True}, "rnn": {"activation": "tanh"}}


def _case(rng, cell, *, layers=2, **kw):
    """A stack case: with two layers a projection (every layer's), else a layer norm on an
    LSTM's top layer."""
    proj = 2 if layers == 2 and cell == "lstm" else None
    return stack_case(rng, cell, layers=layers, proj_size=proj, layer_norm=proj is None, **kw)


def _states(cell, case):
    return (case["cs0"], case["h0"]) if cell == "lstm" else (case["h0"],)


def _run(cell, case, backend):
    keywords = {k: v for k, v in case.items() if k not in ("x", "weights", "h0", "cs0")}
    return getattr(gc, f"{cell}_stack")(case["x"], *_states(cell, case), case["weights"],
                                         **keywords, backend=backend)


def _grad(cell, case, stack, backend, **upstream):
    return getattr(gc, f"{cell}_stack_grad")(case["x"], *_states(cell, case), case["weights"],
                                              stack, **upstream, backend=backend)


_DRAWN = {"seed": st.integers(0, 2**32 - 1), "layers": st.integers(1, 3),
          "bidirectional": st.booleans(), "batch_first": st.booleans(), "masks": st.booleans(),
          "ragged": st.booleans()}


def _drawn_case(cell, seed, **options):
    return _case(np.random.default_rng(seed), cell, **options)


@pytest.mark.parametrize("cell", CELLS)
@given(**_DRAWN)
def test_gradients_equal_central_differences(cell, seed, **options):
    """On the reference; the CPU's stack is held to it on the same cases below."""
    f, vjp, args, names = stack_vjp_pair(cell, _drawn_case(cell, seed, **options),
                                         backend="reference")
    gc.check_vjp(f, vjp, args, names=names, samples=8, seed=seed % 1000).raise_if_failed()


@pytest.mark.parametrize("cell", CELLS)
@given(**_DRAWN)
def test_the_cpu_stack_and_its_gradient_equal_the_reference(cell, seed, **options):
    """The CPU's stack, forward and gradient of every array, to 1e-12 relative on the cases
    the reference passes the oracle on: a stack is backend-independent code around its
    layers' sequences, whose CPU gradients pass the oracle themselves
    (``test_sequences_grad.py``, ``test_masks_cpu.py``, ``test_reverse_cpu.py``)."""
    case = _drawn_case(cell, seed, **options)
    (f_ref, vjp_ref, args, _), (f_cpu, vjp_cpu, _, names) = (
        stack_vjp_pair(cell, case, backend=b) for b in ("reference", "cpu"))
    want = f_ref(*args)
    cotangent = tuple(np.random.default_rng(seed % 1000).standard_normal(np.shape(v))
                      for v in want)
    pairs = [*zip(f_cpu(*args), want, strict=True),
             *zip(vjp_cpu(cotangent, *args), vjp_ref(cotangent, *args), strict=True)]
    labels = [f"output {k}" for k in range(len(want))] + [f"d_{n}" for n in names]
    for name, (got, expected) in zip(labels, pairs, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", CELLS)
def test_a_stack_is_its_layers(backend, cell):
    case = _case(np.random.default_rng(3), cell, layers=3)
    stack = _run(cell, case, backend)
    assert stack.settings.bidirectional and len(stack.layers) == 6
    layer_input = case["x"]
    for layer in range(3):
        runs = stack.layers[2 * layer:2 * layer + 2]
        assert not runs[0].settings.reverse and runs[1].settings.reverse
        op = getattr(gc, f"{cell}_sequence")
        for d, run in enumerate(runs):
            k = 2 * layer + d
            states = [s[k] for s in _states(cell, case)]
            w = case["weights"][k]
            positional = [a for n, a in w._asdict().items()
                          if n in ("w", "b", "w_ru", "w_c", "b_ru", "b_c")]
            optional = {n: a for n, a in w._asdict().items()
                        if n not in ("w", "b", "w_ru", "w_c", "b_ru", "b_c") and a is not None}
            alone = op(layer_input, *states, *positional, **optional, reverse=d == 1,
                       seq_len=case["seq_len"], **_CELL_ATTRS[cell], backend=backend)
            for a, b in zip(run, alone, strict=True):
                np.testing.assert_array_equal(a, b)
        layer_input = np.concatenate([r.h for r in runs], axis=-1)
        if layer < 2:
            layer_input = layer_input * case["dropout_masks"][layer]
    np.testing.assert_array_equal(stack.h, layer_input)
    np.testing.assert_array_equal(stack.h_final, np.stack([r.h_final for r in stack.layers]))


@pytest.mark.parametrize("cell", CELLS)
def test_one_direction_runs_every_layer_forward(cell):
    case = _case(np.random.default_rng(6), cell, layers=3, bidirectional=False)
    stack = _run(cell, case, "reference")
    assert not stack.settings.bidirectional and len(stack.layers) == 3
    assert not any(run.settings.reverse for run in stack.layers)


@pytest.mark.parametrize("cell", CELLS)
def test_bad_input_is_named(cell):
    case = _case(np.random.default_rng(4), cell, layers=2)
    with pytest.raises(ValueError, match="a bidirectional stack needs two per layer"):
        _run(cell, {**case, "weights": case["weights"][:3]}, "reference")
    swapped = [case["weights"][0], case["weights"][1], case["weights"][0], case["weights"][1]]
    with pytest.raises(ValueError, match=r"weights\[2\]\.w(_ru)? has \d+ rows, but layer 1's "
                                         r"input is \d+ wide"):
        _run(cell, {**case, "weights": swapped}, "reference")
    with pytest.raises(ValueError, match=r"h0 must be a 3-D array \[L·D, B, ·\] with L·D = 4"):
        _run(cell, {**case, "h0": case["h0"][:2]}, "reference")
    with pytest.raises(ValueError, match=r"dropout_masks must hold num_layers - 1 = 1"):
        _run(cell, {**case, "dropout_masks": case["dropout_masks"] * 2}, "reference")
    with pytest.raises(ValueError, match=r"dropout_masks\[0\] of shape \(2, 3\) does not "
                                         r"broadcast"):
        _run(cell, {**case, "dropout_masks": [np.ones((2, 3))]}, "reference")
    with pytest.raises(TypeError, match=r"dropout_masks\[0\] must have the same dtype as x"):
        _run(cell, {**case, "dropout_masks": [case["dropout_masks"][0].astype(np.float32)]},
             "reference")
    with pytest.raises(TypeError, match=r"weights\[1\] must be a gradcells\."):
        _run(cell, {**case, "weights": [case["weights"][0], tuple(case["weights"][1]),
                                        *case["weights"][2:]]}, "reference")
    with pytest.raises(TypeError, match="bidirectional must be a bool"):
        _run(cell, {**case, "bidirectional": "yes"}, "reference")
    if cell == "lstm":
        widened = case["weights"][:2] + [w._replace(w_proj=None) for w in case["weights"][2:]]
        with pytest.raises(ValueError, match=r"weights\[2\] has a state 4 wide but weights\[0\] "
                                             r"one 2 wide"):
            _run(cell, {**case, "weights": widened}, "reference")
    stack = _run(cell, case, "reference")
    wide = stack.h.shape[:2] + (stack.h.shape[2] + 1,)
    with pytest.raises(ValueError, match=rf"d_h must have the shape of stack\.h "
                                         rf"\({stack.h.shape[0]}, {stack.h.shape[1]}, "):
        _grad(cell, case, stack, "reference", d_h=np.zeros(wide))
    with pytest.raises(ValueError, match=r"d_h_final must have the shape of stack\.h_final"):
        _grad(cell, case, stack, "reference", d_h_final=stack.h_final[:2])
    with pytest.raises(TypeError, match="stack must be the"):
        _grad(cell, case, tuple(_run(cell, case, "reference")), "reference")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", CELLS)
def test_empty_sizes_and_purity(backend, cell):
    rng = np.random.default_rng(5)
    for steps, batch in ((0, 3), (3, 0), (4, 3)):
        case = _case(rng, cell, steps=steps, batch=batch, batch_first=True)
        before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
        masks = [m.copy() for m in case.get("dropout_masks", [])]
        stack = _run(cell, case, backend)
        assert stack.h.shape == (batch, steps, 2 * case["h0"].shape[2])
        grads = _grad(cell, case, stack, backend, d_h=np.ones(stack.h.shape))
        assert grads.x.shape == case["x"].shape and len(grads.weights) == 4
        for k, v in before.items():
            np.testing.assert_array_equal(case[k], v, err_msg=k)
        for a, b in zip(case.get("dropout_masks", []), masks, strict=True):
            np.testing.assert_array_equal(a, b)


def test_torch_tensors_in_and_out_and_a_rebuilt_stack_is_refused(torch):
    case = _case(np.random.default_rng(7), "lstm")
    tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
               for k, v in case.items()}
    tensors["weights"] = [type(w)(*(None if a is None else torch.from_numpy(a) for a in w))
                          for w in case["weights"]]
    tensors["dropout_masks"] = [torch.from_numpy(m) for m in case["dropout_masks"]]
    stack = _run("lstm", tensors, None)
    assert isinstance(stack.h, torch.Tensor) and stack.settings.bidirectional
    grads = _grad("lstm", tensors, stack, None, d_h=torch.ones_like(stack.h))
    assert isinstance(grads.weights, list) and isinstance(grads.weights[0].w, torch.Tensor)
    want = _grad("lstm", case, _run("lstm", case, None), None, d_h=np.ones(stack.h.shape))
    np.testing.assert_array_equal(grads.x.numpy(), want.x)
    with pytest.raises(ValueError, match="stack records nothing"):
        _grad("lstm", case, gc.LSTMStack(*_run("lstm", case, None)), None)


def _every_array(stack):
    """Every array a stack returns: its top outputs, final states and each run's fields."""
    return (*(a for a in stack[:-1]), *(a for run in stack.layers for a in run))


def _upstream(stack, cts):
    """The stack gradient's upstream keywords for cotangents ``cts`` of ``_every_array``."""
    top = len(stack) - 1
    runs, rest = [], iter(cts[top:])
    for run in stack.layers:
        runs.append(type(run)(*(next(rest) for _ in run)))
    return {**{f"d_{f}": c for f, c in zip(stack._fields[:top], cts[:top], strict=True)},
            "d_layers": runs}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", CELLS)
def test_every_array_a_stack_returns_carries_a_gradient(backend, cell):
    """docs/spec.md §16.1: cotangents on the top outputs, the final states and every field of
    every run in ``stack.layers`` (``d_layers``), against central differences in the input,
    the initial states and the weights, and the second order (``d_layers_tangent``) against
    central differences of the gradient."""
    rng = np.random.default_rng(11)
    case = _case(rng, cell, layers=2, steps=3, batch=2, hidden=3)
    keywords = {k: v for k, v in case.items() if k not in ("x", "weights", "h0", "cs0")}
    n_states = len(_states(cell, case))

    def stack_of(x, *states_and_weights):
        states, weights = states_and_weights[:n_states], states_and_weights[n_states:]
        return getattr(gc, f"{cell}_stack")(x, *states, _sets(case, weights), **keywords,
                                             backend=backend)

    def vjp(cts, x, *states_and_weights):
        stack = stack_of(x, *states_and_weights)
        states = dict(zip(("cs0", "h0")[2 - n_states:], states_and_weights, strict=False))
        at = {**case, "x": x, **states,
              "weights": _sets(case, states_and_weights[n_states:])}
        g = _grad(cell, at, stack, backend, **_upstream(stack, cts))
        return (g.x, *(getattr(g, s) for s in ("cs0", "h0")[2 - n_states:]),
                *_flat_sets(g.weights))

    def grad_jvp(tangents, *a):
        primals, cts = a[:n], a[n:]
        stack = stack_of(*primals)
        t_states = tangents[1:1 + n_states]
        given = getattr(gc, f"{cell.upper()}StackGrads")(
            tangents[0], *t_states, _sets(case, tangents[1 + n_states:n]))
        upstream = _upstream(stack, cts)
        upstream.update({f"{k}_tangent": v for k, v in _upstream(stack, tangents[n:]).items()})
        _, d_grads = getattr(gc, f"{cell}_stack_grad_jvp")(
            primals[0], *primals[1:1 + n_states], _sets(case, primals[1 + n_states:]), stack,
            given, **upstream, backend=backend)
        return (d_grads.x, *(getattr(d_grads, s) for s in ("cs0", "h0")[2 - n_states:]),
                *_flat_sets(d_grads.weights))

    args = (case["x"], *_states(cell, case), *_flat_sets(case["weights"]))
    n = len(args)
    gc.check_vjp(lambda *a: _every_array(stack_of(*a)), vjp, args,
                 samples=6).raise_if_failed()
    cts = tuple(rng.standard_normal(a.shape) for a in _every_array(stack_of(*args)))
    gc.check_jvp(lambda *a: vjp(a[n:], *a[:n]), grad_jvp, args + cts).raise_if_failed()


def _flat_sets(weights):
    return tuple(a for ws in weights for a in gc._core.trees.leaves(ws) if a is not None)


def _sets(case, flat):
    """``case``'s weight sets with their arrays taken in order from ``flat``."""
    rest = iter(flat)
    return [gc._core.trees.map_leaves(lambda a: None if a is None else next(rest), ws)
            for ws in case["weights"]]
