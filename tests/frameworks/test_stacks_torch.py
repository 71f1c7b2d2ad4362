"""Conformance of the stacks (docs/spec.md §11.4) with PyTorch's multi-layer ``nn.LSTM``,
``nn.GRU`` and ``nn.RNN``, float64, on packed ragged batches: ``num_layers`` 1 to 3, one or
two directions, ``proj_size``, both layouts, weights (and their gradients) converted by
``gc.layouts.stack_from_torch`` and back by ``stack_to_torch``.

Compared: the top layer's padded outputs, the final states ``h_n`` (and ``c_n``) in PyTorch's
``[L·D, B, ·]`` order, and every gradient: the input's, the initial states' and every
parameter's. PyTorch's packed sequences cannot hold a length of 0 (``test_stacks.py`` covers
it); lengths here include T and 1, unsorted.
"""

import numpy as np
import pytest
from conftest import torch_leaf

import gradcells as gc
from gradcells import layouts

pytestmark = pytest.mark.conformance

BACKENDS = ["reference", "cpu"]
TOL = {"rtol": 1e-10, "atol": 1e-12}
# (cell, num_layers, bidirectional, proj_size, batch_first)
CONFIGS = [("lstm", 1, True, None, False), ("lstm", 2, True, None, True),
           ("lstm", 3, False, None, False), ("lstm", 2, True, 3, False),
           ("gru", 2, True, None, False), ("gru", 3, True, None, True),
           ("rnn_tanh", 2, True, None, False), ("rnn_relu", 3, False, None, True)]


def _module(torch, cell, layers, bidirectional, proj, batch_first, n_in, hidden):
    kind, _, activation = cell.partition("_")
    make = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[kind]
    extra = {"nonlinearity": activation} if kind == "rnn" else {}
    if proj:
        extra["proj_size"] = proj
    return make(n_in, hidden, num_layers=layers, bidirectional=bidirectional,
                batch_first=batch_first, dtype=torch.float64, **extra)


def _parameter_grads(module, cell):
    """The parameters' gradients as a state dict, the part of each bias pair that the
    converters sum zeroed in ``bias_hh`` (both hold the gradient of the sum: checked)."""
    grads = {name: p.grad.detach().numpy().copy() for name, p in module.named_parameters()}
    summed = slice(0, 2 * module.hidden_size) if cell == "gru" else slice(None)
    for name in [n for n in grads if n.startswith("bias_hh")]:
        partner = grads[name.replace("bias_hh", "bias_ih")]
        np.testing.assert_allclose(grads[name][summed], partner[summed], **TOL)
        grads[name][summed] = 0
    return grads


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_multi_layer_torch_on_a_packed_ragged_batch(torch, rng, backend, config):
    cell, layers, bidirectional, proj, batch_first = config
    steps, batch, n_in, hidden = 5, 4, 3, 4
    directions = 2 if bidirectional else 1
    module = _module(torch, cell, layers, bidirectional, proj, batch_first, n_in, hidden)
    conv = layouts.stack_from_torch(module)
    assert conv.options["bidirectional"] == bidirectional and len(conv) == layers * directions
    width = proj or hidden
    x = rng.standard_normal((batch, steps, n_in) if batch_first else (steps, batch, n_in))
    lengths = np.array([2, 5, 1, 4])
    torch_states = [rng.standard_normal((layers * directions, batch, width))]
    if cell == "lstm":
        torch_states.append(rng.standard_normal((layers * directions, batch, hidden)))
    x_t, states_t = torch_leaf(torch, x), [torch_leaf(torch, s) for s in torch_states]

    packed = torch.nn.utils.rnn.pack_padded_sequence(x_t, torch.tensor(lengths),
                                                     batch_first=batch_first,
                                                     enforce_sorted=False)
    out, finals = module(packed, tuple(states_t) if cell == "lstm" else states_t[0])
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=batch_first,
                                                    total_length=steps)
    finals = finals if isinstance(finals, tuple) else (finals,)
    cts = [rng.standard_normal(tuple(a.shape)) for a in (out, *finals)]
    sum((a * torch.from_numpy(c)).sum()
        for a, c in zip((out, *finals), cts, strict=True)).backward()

    kind = cell.split("_")[0]
    states = conv.gradcells_states(*torch_states)
    stack = getattr(gc, f"{kind}_stack")(x, *states, conv, seq_len=lengths,
                                         batch_first=batch_first, **conv.options,
                                         backend=backend)
    np.testing.assert_allclose(stack.h, out.detach().numpy(), **TOL)
    np.testing.assert_allclose(stack.h_final, finals[0].detach().numpy(), **TOL)
    upstream = {"d_h": cts[0], "d_h_final": cts[1]}
    if kind == "lstm":
        np.testing.assert_allclose(stack.cs_final, finals[1].detach().numpy(), **TOL)
        upstream["d_cs_final"] = cts[2]
    grads = getattr(gc, f"{kind}_stack_grad")(x, *states, conv, stack, **upstream,
                                              backend=backend)
    np.testing.assert_allclose(grads.x, x_t.grad.numpy(), **TOL)
    np.testing.assert_allclose(grads.h0, states_t[0].grad.numpy(), **TOL)
    if kind == "lstm":
        np.testing.assert_allclose(grads.cs0, states_t[1].grad.numpy(), **TOL)
    theirs = layouts.stack_from_torch(_parameter_grads(module, cell),
                                      nonlinearity=conv.options.get("activation"))
    for k, (ours, want) in enumerate(zip(grads.weights, theirs, strict=True)):
        for name, a in want._asdict().items():
            if a is not None:
                np.testing.assert_allclose(getattr(ours, name), a, **TOL,
                                           err_msg=f"weights[{k}].{name}")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_stack_to_torch_loads_into_the_module(torch, rng, config):
    cell, layers, bidirectional, proj, batch_first = config
    module = _module(torch, cell, layers, bidirectional, proj, batch_first, 3, 4)
    conv = layouts.stack_from_torch(module)
    other = _module(torch, cell, layers, bidirectional, proj, batch_first, 3, 4)
    state = layouts.stack_to_torch(conv, bidirectional=bidirectional)
    assert set(state) == set(other.state_dict())
    other.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    x = torch.from_numpy(rng.standard_normal((2, 5, 3)))
    np.testing.assert_allclose(other(x)[0].detach().numpy(), module(x)[0].detach().numpy(),
                               rtol=1e-13, atol=1e-14)
