"""Reduced precision in ``gradcells.torch`` (docs/adapters.md): float16 and bfloat16
tensors on the CPU are computed in float32 and returned in their own dtype, as PyTorch's CPU
LSTM does; their gradients come back in their dtype too.

The functions: the result and the gradients of a half-precision call equal, bit for bit,
the float32 call on the same (exactly widened) values rounded to the dtype, eagerly and
through the custom ops torch.compile runs. The modules: a half-precision module equals a
float32 module holding its weights within the dtype's epsilon: the module forms its gradcells
weights (``b_ih + b_hh``, the gate blocks) in its own dtype.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gradcells.cells import OPS, STACKS  # noqa: E402

gtorch = pytest.importorskip("gradcells.torch")

from test_torch_functions import _as_function, _case, _torch_case  # noqa: E402

REDUCED = (torch.float16, torch.bfloat16)


def _cast(value, dtype):
    """The case's float tensors in ``dtype`` (leaves again, requiring grad as before)."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            return value
        return value.detach().to(dtype).requires_grad_(value.requires_grad)
    if isinstance(value, (tuple, list)):
        items = [_cast(v, dtype) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _run(name, case, dtype):
    """The outputs and the gradients of ``Σ <u, output>``, ``u`` values of ``dtype``."""
    f, leaves = _as_function(name, case)
    outputs = f(*leaves)
    rng = np.random.default_rng(3)
    upstream = [torch.tensor(rng.standard_normal(o.shape)).to(dtype).to(o.dtype)
                for o in outputs]
    grads = torch.autograd.grad(sum((o * u).sum() for o, u in zip(outputs, upstream,
                                                                   strict=True)), leaves)
    return outputs, grads


@pytest.mark.parametrize("custom_op", [False, True], ids=["eager", "custom-op"])
@pytest.mark.parametrize("dtype", REDUCED, ids=str)
@pytest.mark.parametrize("name", (*OPS, *STACKS))
def test_functions_compute_in_float32(name, dtype, custom_op, monkeypatch):
    if custom_op:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    reduced = {k: _cast(v, dtype) for k, v in _torch_case(_case(name, 0)).items()}
    outputs, grads = _run(name, reduced, dtype)
    want_outputs, want_grads = _run(name, {k: _cast(v, torch.float32)
                                           for k, v in reduced.items()}, dtype)
    for got, want in zip([*outputs, *grads], [*want_outputs, *want_grads], strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got, want.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
@pytest.mark.parametrize("module", [gtorch.LSTM, gtorch.GRU, gtorch.RNN])
def test_modules_compute_in_float32(module, dtype):
    """A gradient element sums products over steps and batch, so its error is measured
    against the largest element of its tensor (``atol``), as a rounding bound is."""
    torch.manual_seed(0)
    reduced = module(3, 4, num_layers=2, bidirectional=True, dtype=dtype)
    wide = module(3, 4, num_layers=2, bidirectional=True)
    wide.load_state_dict({k: v.float() for k, v in reduced.state_dict().items()})
    x = torch.randn(5, 2, 3).to(dtype)
    runs = []
    for m, inputs in ((reduced, x.clone()), (wide, x.float())):
        inputs.requires_grad_()
        out, finals = m(inputs)
        outputs = [out, *(finals if isinstance(finals, tuple) else (finals,))]
        generator = torch.Generator().manual_seed(1)
        upstream = [torch.randn(o.shape, generator=generator).to(dtype).float() for o in outputs]
        sum((o.float() * u).sum() for o, u in zip(outputs, upstream, strict=True)).backward()
        runs.append([*outputs, inputs.grad, *(p.grad for p in m.parameters())])
    eps = torch.finfo(dtype).eps
    for got, want in zip(*runs, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, rtol=eps,
                                   atol=eps * want.abs().max().item())
