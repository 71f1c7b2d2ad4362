"""``gradcells.torch``: the nine forward ops under autograd (docs/spec.md §13).

Every op on cases drawn by ``gc.testing`` (peepholes, clips, projection, layer norm, masks,
lengths, reverse, layout, bidirectional stacks): the result equals gc's NumPy op; reverse
and forward mode pass ``torch.autograd.gradcheck`` and the second order ``gradgradcheck``
(reverse over reverse and forward over reverse) in float64; the gradients equal
``gc.<op>_grad``'s; bad input raises named errors before anything runs; inputs are never
modified.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gradcells as gc  # noqa: E402
import gradcells.testing as gt  # noqa: E402
from gradcells._core.specs import MASKS  # noqa: E402
from gradcells.cells import (  # noqa: E402
    OPS,
    SCAN_SPECS,
    STACKS,
)

gtorch = pytest.importorskip("gradcells.torch")

_CONSTANTS = ("seq_len", *MASKS, "dropout_masks")
"""The arguments autograd never differentiates: lengths, every mask (the RG-LRU's boolean
``resets`` too) and a stack's dropout masks."""


def _case(name: str, seed: int, *, hidden: int = 3) -> dict:
    """A NumPy float64 case of op ``name`` drawn by ``gc.testing``; a stack's options
    (layers, directions, masks, lengths, layout, an LSTM's projection and layer norm) drawn
    here at small sizes (``hidden`` wide), finite differences costing one call per input
    element."""
    rng = np.random.default_rng(seed)
    cell, kind = name.split("_")
    if kind == "stack":
        layers = int(rng.integers(1, 3))
        lstm = cell == "lstm"
        return gt.stack_case(
            rng, cell, layers=layers, bidirectional=bool(rng.integers(2)),
            masks=layers > 1, ragged=bool(rng.integers(2)), batch_first=bool(rng.integers(2)),
            steps=3, batch=2, input_size=2, hidden=hidden,
            proj_size=hidden - 1 if lstm and seed % 2 == 0 else None,
            layer_norm=lstm and seed % 3 != 1)
    if kind == "sequence":
        return getattr(gt, f"random_{name}_case")(rng, order=True)
    return getattr(gt, f"random_{name}_case")(rng)


def _map(value, leaf):
    """``value`` with every NumPy array ``a`` replaced by ``leaf(a)`` (tuples, lists kept)."""
    if isinstance(value, np.ndarray):
        return leaf(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map(item, leaf) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map(item, leaf) for item in value)
    return value


def _torch_case(case: dict, *, grad: bool = True) -> dict:
    """The case with its primals as float64 leaves requiring grad and its masks and lengths
    as tensors that do not."""
    return {k: _map(v, torch.tensor if k in _CONSTANTS
                    else (lambda a: torch.tensor(a, requires_grad=grad)))
            for k, v in case.items()}


def _leaves(value) -> list:
    """The tensors requiring grad in ``value`` (dicts, tuples, lists), in order."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _leaves(item)]
    return []


def _replaced(value, new):
    """``value`` with its tensors requiring grad taken in order from iterator ``new``."""
    if isinstance(value, torch.Tensor):
        return next(new) if value.requires_grad else value
    if isinstance(value, dict):
        return {k: _replaced(v, new) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_replaced(item, new) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_replaced(item, new) for item in value)
    return value


def _as_function(name: str, case: dict):
    """``(f, leaves)``: ``f(*leaves)`` runs ``gradcells.torch.<name>`` on the case with
    those primals and returns every tensor of its result (docs/spec.md §16.1: the gate
    fields and a stack's runs in ``layers`` too)."""
    op = getattr(gtorch, name)

    def f(*leaves):
        out: list = []
        _collect(op(**_replaced(case, iter(leaves))), out)
        return tuple(out)

    return f, tuple(_leaves(case))


NAMES = (*OPS, *STACKS, "selective_scan")
SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", NAMES)
def test_result_equals_numpy_op(name, seed):
    case = _case(name, seed)
    expected = getattr(gc, name)(**case)
    result = getattr(gtorch, name)(**_torch_case(case))
    assert type(result) is type(expected)
    assert type(result.settings) is type(expected.settings)
    got, want = [], []
    _collect(result, got)
    _collect(expected, want)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert isinstance(a, torch.Tensor)
        np.testing.assert_array_equal(a.detach().numpy(), b)


def _collect(value, out):
    if isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, out)
    elif value is not None:
        out.append(value)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(name, seed):
    """Reverse and forward mode over every output against finite differences (a stack's
    hundreds of outputs, its runs' fields included, along random directions: torch's
    ``fast_mode``, each Jacobian checked as vᵀ·J·u)."""
    f, leaves = _as_function(name, _torch_case(_case(name, seed)))
    assert torch.autograd.gradcheck(f, leaves, check_forward_ad=True, fast_mode=name in STACKS)


@pytest.mark.parametrize("name", NAMES)
def test_gradgradcheck(name):
    """The second order, reverse over reverse and forward over reverse, against finite
    differences of the first. The LSTM stack's case: two one-way layers with a dropout mask,
    a projection and a layer norm (seed 2; the bidirectional stacks are the GRU's and the
    RNN's, seed 0)."""
    seed = 2 if name == "lstm_stack" else 0
    f, leaves = _as_function(name, _torch_case(_case(name, seed, hidden=2)))
    assert torch.autograd.gradgradcheck(f, leaves, check_fwd_over_rev=True,
                                        fast_mode=name in STACKS)


def _grad_fields(name: str) -> tuple[str, ...]:
    """The fields of ``<name>_grad``'s result: the primal arguments, in order."""
    return getattr(gc, inspect.signature(getattr(gc, f"{name}_grad")).return_annotation)._fields


@pytest.mark.parametrize("name", NAMES)
def test_gradients_equal_gc_grad(name):
    case = _case(name, 5)
    fields = _grad_fields(name)
    case = {**{k: case[k] for k in fields if k in case}, **case}   # primals first, in order
    expected = getattr(gc, name)(**case)
    tcase = _torch_case(case)
    result = getattr(gtorch, name)(**tcase)
    rng = np.random.default_rng(6)
    outputs = [f for f in expected._fields if f != "layers"]   # every field (§16.1)
    upstream = {f"d_{f}": rng.standard_normal(getattr(expected, f).shape) for f in outputs}
    loss = sum((getattr(result, f) * torch.tensor(upstream[f"d_{f}"])).sum() for f in outputs)
    loss.backward()
    result_arg = "stack" if name in STACKS else {**OPS, **SCAN_SPECS}[name].result_arg
    grads = getattr(gc, f"{name}_grad")(**{k: case[k] for k in fields if k in case},
                                        **{result_arg: expected}, **upstream)
    want = []
    _collect(grads, want)
    got = [t.grad for t in _leaves(tcase)]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)


def test_forward_mode_equals_gc_jvp(monkeypatch):
    """One call of ``gc.lstm_sequence_jvp``, the forward not run besides."""
    case = _case("lstm_sequence", 7)
    rng = np.random.default_rng(8)
    primals = {k: v for k, v in case.items()
               if k in OPS["lstm_sequence"].grads._fields and v is not None
               and k != "layer_norm"}
    tangents = {k: rng.standard_normal(v.shape) for k, v in primals.items()}
    _, want = gc.lstm_sequence_jvp(**case, tangents=OPS["lstm_sequence"].grads(
        **{f: tangents.get(f) for f in OPS["lstm_sequence"].grads._fields}))
    fwad = torch.autograd.forward_ad
    with fwad.dual_level():
        tcase = _torch_case(case, grad=False)
        for k in primals:
            tcase[k] = fwad.make_dual(tcase[k], torch.tensor(tangents[k]))
        monkeypatch.setattr(gc, "lstm_sequence", None)
        result = gtorch.lstm_sequence(**tcase)
        for field in ("h", "cs", "h_final", "cs_final"):
            np.testing.assert_allclose(fwad.unpack_dual(getattr(result, field)).tangent.numpy(),
                                       getattr(want, field), rtol=1e-12, atol=1e-12)


# -- errors --------------------------------------------------------------------------------


def _small():
    return _torch_case(gt.lstm_sequence_case(np.random.default_rng(0)))


def _taken(name, case):
    """The entries of ``case`` that ``gc.<name>`` takes."""
    return {k: v for k, v in case.items() if k in inspect.signature(getattr(gc, name)).parameters}


def test_a_gradient_on_a_gate_or_a_run_of_a_stack_is_gc_s():
    """docs/spec.md §16.1: a loss on a gate field (the LSTM's ``i``) and on a stack's run's
    gate (``layers[0].r``) backpropagates as ``gc``'s gradient with ``d_i`` / ``d_layers``."""
    case = gt.lstm_sequence_case(np.random.default_rng(0))
    tcase = _torch_case(case)
    result = gtorch.lstm_sequence(**tcase)
    weight = np.random.default_rng(1).standard_normal(result.i.shape)
    (result.i * torch.tensor(weight)).sum().backward()
    want = gc.lstm_sequence_grad(**_taken("lstm_sequence_grad", case),
                                 seq=gc.lstm_sequence(**case), d_i=weight)
    np.testing.assert_allclose(tcase["x"].grad.numpy(), want.x, rtol=1e-12, atol=1e-12)

    case = gt.stack_case(np.random.default_rng(0), "gru")
    tcase = _torch_case(case)
    stack = gtorch.gru_stack(**tcase)
    (stack.layers[0].r * torch.tensor(weight[..., :1])).sum().backward()
    expected = gc.gru_stack(**case)
    run = expected.layers[0]
    d_layers = [type(run)(None, None, None, None, None)] * len(expected.layers)
    d_layers[0] = run._replace(r=np.broadcast_to(weight[..., :1], run.r.shape), u=None,
                               c=None, h=None, h_final=None)
    want = gc.gru_stack_grad(case["x"], case["h0"], case["weights"], expected,
                             d_layers=d_layers)
    np.testing.assert_allclose(tcase["x"].grad.numpy(), want.x, rtol=1e-12, atol=1e-12)


def test_output_changed_in_place_raises_in_backward():
    result = gtorch.lstm_sequence(**_small())
    h = result.h
    with torch.no_grad():
        result.cs_final.mul_(2.0)
    with pytest.raises(RuntimeError, match="inplace"):
        h.sum().backward()


def test_two_devices_raise_before_running():
    case = _small()
    case["h0"] = torch.empty(case["h0"].shape, dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match="h0 is on meta and x on cpu"):
        gtorch.lstm_sequence(**case)


def test_mixed_dtypes_raise():
    case = _small()
    case["b"] = case["b"].detach().float().requires_grad_()
    with pytest.raises(TypeError, match="b is torch.float32 and x torch.float64"):
        gtorch.lstm_sequence(**case)


def test_non_tensor_and_integer_primals_raise():
    case = _small()
    case["w"] = case["w"].detach().numpy()
    with pytest.raises(TypeError, match="w must be a torch.Tensor"):
        gtorch.lstm_sequence(**case)
    case = _small()
    case["x"] = torch.zeros(case["x"].shape, dtype=torch.int64)
    with pytest.raises(TypeError, match="x is a torch.int64 tensor"):
        gtorch.lstm_sequence(**case)


@pytest.mark.parametrize("name", ["input_mask", "seq_len"])
def test_constants_requiring_grad_raise(name):
    case = _small()
    steps, batch = case["x"].shape[:2]
    case[name] = (torch.ones(case["x"].shape, dtype=torch.float64, requires_grad=True)
                  if name == "input_mask" else
                  torch.full((batch,), float(steps), requires_grad=True))
    with pytest.raises(ValueError, match=f"{name} requires grad"):
        gtorch.lstm_sequence(**case)


def test_bad_stack_weights_raise():
    case = _torch_case(gt.stack_case(np.random.default_rng(0), "rnn"))
    case["weights"] = case["weights"][0]
    with pytest.raises(TypeError, match="weights"):
        gtorch.rnn_stack(**case)


def test_masks_as_numpy_arrays():
    case = _case("rnn_sequence", 1)
    tcase = _torch_case(case)
    tcase["input_mask"] = case["input_mask"]
    np.testing.assert_array_equal(gtorch.rnn_sequence(**tcase).h.detach().numpy(),
                                  gc.rnn_sequence(**case).h)


def test_third_order_refused():
    case = _torch_case(gt.rnn_cell_case(np.random.default_rng(0)))
    h = gtorch.rnn_cell(**case).h
    (gx,) = torch.autograd.grad(h.sum(), case["x"], create_graph=True)
    (gxx,) = torch.autograd.grad(gx.pow(2).sum(), case["w"], create_graph=True)
    with pytest.raises(RuntimeError, match="third derivative"):
        torch.autograd.grad(gxx.sum(), case["x"])


@pytest.mark.parametrize("name", NAMES)
def test_inputs_never_modified(name):
    tcase = _torch_case(_case(name, 3))
    before = [t.detach().clone() for t in _tensors(tcase)]
    f, leaves = _as_function(name, tcase)
    outputs = f(*leaves)
    grads = torch.autograd.grad(sum(o.sum() for o in outputs), leaves, create_graph=True)
    torch.autograd.grad(sum((g * g).sum() for g in grads), leaves, allow_unused=True)
    for a, b in zip(_tensors(tcase), before, strict=True):
        assert torch.equal(a.detach(), b)


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def test_signatures_are_gc_s():
    for name in NAMES:
        assert inspect.signature(getattr(gtorch, name)) == inspect.signature(getattr(gc, name))


def test_import_gradcells_does_not_import_torch():
    code = "import sys, gradcells; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["lstm_sequence", "gru_stack", "rnn_cell"])
def test_cuda_matches_cpu(name):
    pytest.importorskip("cupy")
    case = _case(name, 0)
    cpu = _torch_case(case)
    cuda = {k: _map(v, lambda a, k=k: torch.tensor(a, device="cuda",
                                                   requires_grad=k not in _CONSTANTS))
            for k, v in case.items()}
    f_cpu, leaves_cpu = _as_function(name, cpu)
    f_cuda, leaves_cuda = _as_function(name, cuda)
    out_cpu, out_cuda = f_cpu(*leaves_cpu), f_cuda(*leaves_cuda)
    for a, b in zip(out_cpu, out_cuda, strict=True):
        assert b.device.type == "cuda"
        torch.testing.assert_close(b.cpu(), a)
    g_cpu = torch.autograd.grad(sum(o.sum() for o in out_cpu), leaves_cpu)
    g_cuda = torch.autograd.grad(sum(o.sum() for o in out_cuda), leaves_cuda)
    for a, b in zip(g_cpu, g_cuda, strict=True):
        torch.testing.assert_close(b.cpu(), a)
    assert torch.autograd.gradcheck(f_cuda, leaves_cuda, check_forward_ad=True)


def test_torch_func_grad_and_jvp():
    """torch.func.grad and torch.func.jvp agree with autograd (vmap is not supported;
    masks and lengths as NumPy arrays: torch.func wraps the tensors a call captures)."""
    case = _case("gru_sequence", 4)
    tcase = {**_torch_case(case), **{k: v for k, v in case.items() if k in _CONSTANTS}}
    w = tcase["w_ru"]

    def loss(w_ru):
        return gtorch.gru_sequence(**{**tcase, "w_ru": w_ru}).h.square().sum()

    loss(w).backward()
    torch.testing.assert_close(torch.func.grad(loss)(w.detach()), w.grad)
    v = torch.ones_like(w)
    _, tangent = torch.func.jvp(loss, (w.detach(),), (v,))
    torch.testing.assert_close(tangent, (w.grad * v).sum())


def test_float32_and_strided_tensors():
    """float32 runs as float32; a non-contiguous weight view gives the contiguous one's
    result and gradient."""
    case = gt.lstm_sequence_case(np.random.default_rng(9), dtype=np.float32, peephole=True)
    expected = gc.lstm_sequence(**case)
    tcase = _torch_case(case)
    strided = {**tcase, "w": tcase["w"].detach().T.contiguous().T.requires_grad_()}
    assert not strided["w"].is_contiguous()
    for arguments in (tcase, strided):
        result = gtorch.lstm_sequence(**arguments)
        assert result.h.dtype == torch.float32
        np.testing.assert_array_equal(result.h.detach().numpy(), expected.h)
        result.h.sum().backward()
    torch.testing.assert_close(strided["w"].grad, tcase["w"].grad, rtol=0, atol=0)


def test_adapters_benchmark_prints_every_contestant(capsys):
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import adapters

    threads = torch.get_num_threads()
    try:
        adapters.main(["--sizes", "3,2,3,4", "--repeats", "1"])
    finally:
        torch.set_num_threads(threads)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == [
        "gradcells numpy", "gradcells.torch", "gradcells.torch compiled"]
