"""``gradcells.torch`` where PyTorch users are (docs/adapters.md): torch.compile through the
``torch.library`` custom ops, TorchScript refused with a clear message.

The custom-op path runs under torch.compile; here it also runs eagerly, with
``torch.compiler.is_compiling`` reporting True, so that every op on ``gc.testing``'s cases
is held to the eager path (results and gradients equal) and its fake implementation to the
real one (shapes and dtypes) without a compile per case. One fresh process compiles a
module and a function with ``fullgraph=True`` for real.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gradcells as gc  # noqa: E402
import gradcells.testing as gt  # noqa: E402
from gradcells.cells import OPS, STACKS  # noqa: E402

gtorch = pytest.importorskip("gradcells.torch")

from test_torch_functions import _as_function, _case, _taken, _torch_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NAMES = (*OPS, *STACKS, "selective_scan")


@pytest.fixture
def custom_ops(monkeypatch):
    """``gradcells.torch.<op>`` through its custom op, eagerly."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


def _outputs_and_grads(name, case):
    f, leaves = _as_function(name, case)
    outputs = f(*leaves)
    rng = np.random.default_rng(11)
    upstream = [torch.tensor(rng.standard_normal(o.shape)) for o in outputs]
    grads = torch.autograd.grad(sum((o * u).sum() for o, u in zip(outputs, upstream,
                                                                   strict=True)), leaves)
    return outputs, grads


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_custom_op_equals_the_eager_function(name, seed, monkeypatch):
    """Every field of the result and every gradient, bit for bit."""
    case = _torch_case(_case(name, seed))
    want = _outputs_and_grads(name, case)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    f, leaves = _as_function(name, case)
    assert f"gradcells_{name}_default" in f(*leaves)[0].grad_fn.name()
    got = _outputs_and_grads(name, case)
    for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_fake_implementation_has_the_real_shapes(name, seed, custom_ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = _case(name, seed)
    real = getattr(gtorch, name)(**_torch_case(case, grad=False))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_case = {k: _fake(v, mode) for k, v in _torch_case(case, grad=False).items()}
        fake = getattr(gtorch, name)(**fake_case)
    assert type(fake) is type(real)
    got, want = _tensors(fake), _tensors(real)
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in want]


def _fake(value, mode):
    if isinstance(value, torch.Tensor):
        return mode.from_tensor(value)
    if isinstance(value, (tuple, list)):
        items = [_fake(v, mode) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def test_a_gradient_on_a_gate_goes_through_the_custom_op(custom_ops):
    """docs/spec.md §16.1 under torch.compile's custom op: a loss on a gate is gc's gradient
    with ``d_i``."""
    case = gt.lstm_sequence_case(np.random.default_rng(0))
    tcase = _torch_case(case)
    result = gtorch.lstm_sequence(**tcase)
    assert "gradcells_lstm_sequence_default" in result.h.grad_fn.name()
    weight = np.random.default_rng(1).standard_normal(result.i.shape)
    ((result.i * torch.tensor(weight)).sum() + result.h.sum()).backward()
    want = gc.lstm_sequence_grad(**_taken("lstm_sequence_grad", case),
                                 seq=gc.lstm_sequence(**case), d_i=weight,
                                 d_h=np.ones(result.h.shape))
    np.testing.assert_allclose(tcase["x"].grad.numpy(), want.x, rtol=1e-12, atol=1e-12)


def test_a_field_not_asked_for_is_none_through_the_custom_op(custom_ops):
    """``OpSpec.optional_results``: the selective scan without ``return_last_state`` has no
    ``last_state``, real or fake, and its gradient is gc's with ``d_y`` alone."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = {**gt.selective_scan_case(np.random.default_rng(4), groups_c=2),
            "return_last_state": False}
    tcase = _torch_case(case)
    result = gtorch.selective_scan(**tcase)
    assert "gradcells_selective_scan_default" in result.y.grad_fn.name()
    assert result.last_state is None
    weight = np.random.default_rng(5).standard_normal(result.y.shape)
    (result.y * torch.tensor(weight)).sum().backward()
    want = gc.selective_scan_grad(**_taken("selective_scan_grad", case),
                                  result=gc.selective_scan(**case), d_y=weight)
    for name in ("u", "A", "B", "C", "delta_bias"):
        np.testing.assert_allclose(tcase[name].grad.numpy(), getattr(want, name),
                                   rtol=1e-12, atol=1e-12)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = gtorch.selective_scan(**{k: _fake(v, mode)
                                        for k, v in _torch_case(case, grad=False).items()})
    assert fake.y.shape == result.y.shape and fake.last_state is None


def test_second_order_through_the_custom_op_raises(custom_ops):
    case = _torch_case(gt.rnn_cell_case(np.random.default_rng(0)))
    h = gtorch.rnn_cell(**case).h
    (gx,) = torch.autograd.grad(h.sum(), case["x"], create_graph=True)
    with pytest.raises(RuntimeError, match="torch.compile does not differentiate twice"):
        gx.sum().backward()


_COMPILE_SCRIPT = textwrap.dedent("""
    import torch
    import gradcells.torch as gtorch

    torch.manual_seed(0)
    module = gtorch.LSTM(3, 4, bidirectional=True).double()
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    w = [torch.randn(s, dtype=torch.float64) for s in ((5, 2, 8), (2, 2, 4), (2, 2, 4))]

    def module_run(run):
        module.zero_grad()
        out, (h, c) = run(x)
        loss = sum((a * b).sum() for a, b in zip((out, h, c), w))
        loss.backward()
        return [out, h, c, *(p.grad for p in module.parameters())]

    g = torch.Generator().manual_seed(1)
    arrays = [torch.randn(s, generator=g, dtype=torch.float64) for s in
              ((4, 3, 2), (3, 3), (3, 3), (5, 12), (12,), (3,), (3,), (3,))]

    def sequence(x, cs0, h0, w, b, wci, wcf, wco):
        seq = gtorch.lstm_sequence(x, cs0, h0, w, b, wci=wci, wcf=wcf, wco=wco,
                                   cell_clip=0.5, seq_len=torch.tensor([4, 2, 3]),
                                   reverse=True)
        return seq.h, seq.cs_final

    def sequence_run(run):
        leaves = [a.clone().requires_grad_() for a in arrays]
        h, cs_final = run(*leaves)
        (h.sin().sum() + cs_final.sum()).backward()
        return [h, cs_final, *(a.grad for a in leaves)]

    # Mamba's selective scan: grouped B, D, z, delta_bias, softplus, reverse, last state
    shapes = ((2, 4, 3), (2, 4, 3), (4, 2), (2, 2, 2, 3), (2, 2, 3), (4,), (2, 4, 3), (4,))
    scan_arrays = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    scan_arrays[1], scan_arrays[2] = scan_arrays[1].abs(), -scan_arrays[2].exp()

    def selective(u, delta, A, B, C, D, z, delta_bias):
        result = gtorch.selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
                                       delta_softplus=True, reverse=True,
                                       return_last_state=True)
        return result.y, result.last_state

    def selective_run(run):
        leaves = [a.clone().requires_grad_() for a in scan_arrays]
        y, last_state = run(*leaves)
        (y.sin().sum() + last_state.square().sum()).backward()
        return [y, last_state, *(a.grad for a in leaves)]

    eager = {module_run: module, sequence_run: sequence, selective_run: selective}
    for run, compiled in ((module_run, torch.compile(module, fullgraph=True)),
                          (sequence_run, torch.compile(sequence, fullgraph=True)),
                          (selective_run, torch.compile(selective, fullgraph=True))):
        got = run(compiled)
        want = run(eager[run])
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    print("compiled equals eager")
""")


def test_compile_fullgraph_in_a_fresh_process():
    """No eager call first: Dynamo must never reach Numba or CuPy. A module, a sequence and
    the selective scan (Mamba's layout: its fake shapes from its spec's labels)."""
    done = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiled equals eager" in done.stdout


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("module", [gtorch.LSTM, gtorch.GRU, gtorch.RNN])
def test_torchscript_is_refused_by_name(module):
    with pytest.raises(RuntimeError, match=rf"torch.jit.script does not support "
                                           rf"gradcells.torch.{module.__name__}.*torch.compile"):
        torch.jit.script(module(2, 3))


def test_threads_call_the_custom_ops_at_once(custom_ops):
    """Four threads, each its own forward and backward through the custom ops (the handle
    registry shared): each equals the same call made alone."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [_torch_case(_case("lstm_sequence", seed)) for seed in range(4)]
    f, leaves = _as_function("lstm_sequence", cases[0])
    assert "gradcells_lstm_sequence_default" in f(*leaves)[0].grad_fn.name()
    alone = [_outputs_and_grads("lstm_sequence", case) for case in cases]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda case: _outputs_and_grads("lstm_sequence", case),
                                 cases * 3))
    for got, want in zip(together, alone * 3, strict=True):
        for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
