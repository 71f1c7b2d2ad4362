"""Empty sizes (docs/spec.md §7), one contract for every op on every backend: a batch of no
rows (B = 0), no input features (I = 0) and, for sequences, no steps (T = 0), with H >= 1.

Every op of ``gradcells.cells.OPS`` on every backend of ``contract_cases.BACKENDS``
(the reference, the CPU, the GPU backend through the host emulation), below the public
layer, in float64 and float32, on a fixed grid of each cell's options
(``contract_cases.OPTIONS``: the LSTM plain, with peepholes and clip, with a projection,
with a layer norm of either carry; the GRU both variants; the RNN both activations) and,
for sequences, once more with ragged lengths, reversed and every mask:

- the forward's result, ``_jvp``'s result and its tangent have the shapes the spec's labels
  give (``OpSpec.result_labels``, time major) and the case's dtype;
- the gradient, and ``_grad_jvp``'s gradient and its tangent, hold one array of the input's
  shape and dtype for every input the case gives (None for every optional weight it leaves
  out);
- nothing flows where nothing runs: with B = 0 or T = 0 every weight's gradient (and its
  tangent) is zero; with T = 0 a sequence's initial states' gradients are the final
  states' upstream gradients (its result's final states are its initial states).
"""

import numpy as np
import pytest
from contract_cases import BACKENDS as BACKEND_NAMES
from contract_cases import OP_NAMES, OPTIONS, arrays_in, calls, cell_of, fixed_case, tangents
from contract_cases import upstream as draw_upstream

from gradcells.cells import OPS
from gradcells.cells.lstm.spec import LSTMNorm

CELL_SIZES = [(1, 0, 3), (1, 2, 0), (1, 0, 0)]
SEQUENCE_SIZES = [(0, 2, 3), (3, 0, 2), (2, 2, 0), (0, 0, 0)]
HIDDEN = 3
ORDERED = {"ragged": True, "reverse": True, "masks": True}
# Time major: the public layer brings a batch-first call to time major (gradcells._order)
# before any backend runs, so a backend is never called batch-first.


def _grid():
    for op in OP_NAMES:
        sequence = OPS[op].sequence
        for steps, batch, input_size in SEQUENCE_SIZES if sequence else CELL_SIZES:
            options = list(OPTIONS[cell_of(op)])
            if sequence:
                options.append({**options[-1], **ORDERED})
            for n, option in enumerate(options):
                label = f"T{steps}B{batch}I{input_size}" if sequence else f"B{batch}I{input_size}"
                yield pytest.param(op, (steps, batch, input_size), option,
                                   id=f"{op}-{label}-options{n}")


def _shape(op, labels, sizes, case):
    shape = tuple(sizes[label] for label in labels)
    if case.get("batch_first") and labels[0] == "T":
        shape = (shape[1], shape[0], *shape[2:])
    return shape


def _assert_result(op, result, sizes, case, dtype, what):
    spec = OPS[op]
    assert type(result) is spec.result, what
    for name, labels, value in zip(spec.result._fields, spec.result_labels(), result,
                                   strict=True):
        assert value.dtype == dtype, f"{what}.{name}: {value.dtype}"
        assert value.shape == _shape(op, labels, sizes, case), f"{what}.{name}: {value.shape}"


def _assert_grads(op, grads, case, dtype, what):
    spec = OPS[op]
    assert type(grads) is spec.grads, what
    for name in spec.grads._fields:
        given, got = case.get(name), getattr(grads, name)
        if given is None:
            assert got is None, f"{what}.{name}: a gradient of an argument not given"
            continue
        assert isinstance(got, LSTMNorm) == isinstance(given, LSTMNorm), f"{what}.{name}"
        for (path, want), (_, have) in zip(arrays_in(given, name), arrays_in(got, name),
                                           strict=True):
            assert have.dtype == dtype and have.shape == want.shape, (
                f"{what}.{path}: {have.dtype}{have.shape}, the input {want.shape}")


def _assert_nothing_flows(op, grads, sizes, up, what):
    """Zero weight gradients where no row or no step runs; the initial states' gradients
    the final states' upstream ones where no step runs."""
    spec = OPS[op]
    if sizes["B"] == 0 or sizes["T"] == 0:
        for name in spec.weights._fields:
            for path, a in arrays_in(getattr(grads, name), name):
                assert not np.any(a), f"{what}.{path} is not zero"
    if spec.sequence and sizes["T"] == 0:
        for state in spec.states:                   # cs0, h0 <- d_cs_final, d_h_final
            final = up.get(f"d_{state.removesuffix('0')}_final")
            want = np.zeros_like(getattr(grads, state)) if final is None else final
            np.testing.assert_array_equal(getattr(grads, state), want, err_msg=f"{what}.{state}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", BACKEND_NAMES, ids=lambda name: name.split()[0])
@pytest.mark.parametrize(("op", "size", "options"), list(_grid()))
def test_every_mode_at_empty_sizes(op, size, options, backend, dtype):
    steps, batch, input_size = size
    rng = np.random.default_rng(26)
    case = fixed_case(op, rng, steps=steps, batch=batch, input_size=input_size,
                      hidden=HIDDEN, dtype=dtype, **options)
    sizes = {"T": steps, "B": batch, "I": input_size, "H": HIDDEN,
             "P": options.get("proj_size", HIDDEN)}
    with calls(backend) as c:
        result = c.forward(op, case)
        _assert_result(op, result, sizes, case, dtype, "forward")
        up = draw_upstream(op, result, rng)
        grads = c.grad(op, case, result, **up)
        _assert_grads(op, grads, case, dtype, "grad")
        _assert_nothing_flows(op, grads, sizes, up, "grad")
        t = tangents(op, case, rng)
        primal, d_primal = c.jvp(op, case, t)
        _assert_result(op, primal, sizes, case, dtype, "jvp")
        _assert_result(op, d_primal, sizes, case, dtype, "jvp tangent")
        up_t = {f"{k}_tangent": v for k, v in draw_upstream(op, result, rng).items()}
        second, d_second = c.grad_jvp(op, case, result, t, **up, **up_t)
        _assert_grads(op, second, case, dtype, "grad_jvp")
        _assert_grads(op, d_second, case, dtype, "grad_jvp tangent")
        _assert_nothing_flows(op, second, sizes, up, "grad_jvp")
        _assert_nothing_flows(op, d_second, sizes,
                              {k.removesuffix("_tangent"): v for k, v in up_t.items()},
                              "grad_jvp tangent")
