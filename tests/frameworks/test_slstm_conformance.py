"""xLSTM's sLSTM (docs/spec.md §19) against NX-AI/xlstm's vanilla PyTorch backend
(``xlstm.blocks.slstm.src.vanilla``: ``slstm_forward`` with the ``"slstm"`` pointwise
function), in float64, where the package imports.

The vanilla cell takes the input projection ``Wx [T, B, 4H]`` (its layer's projections),
the recurrent kernel in its internal layout ``R [N, 4d, d]`` (gradcells's ``r[k]`` is
``R[k]ᵀ``) and the bias gate-major ``[4H]``, gradcells's; its state is ``(h, c, n, m)``.
Differentiated by autograd through ``torch.max``, it is the exact gradient of the
stabiliser, gradcells's ``stabilizer_grad="exact"``; holding ``m`` constant
(``"stop"``, xLSTM's CUDA backward) agrees with it on a loss on ``h`` but for ``m0`` and
not on a loss on the returned state.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells.testing import slstm_sequence_case

torch = pytest.importorskip("torch")
vanilla = pytest.importorskip("xlstm.blocks.slstm.src.vanilla")

ARRAYS = ("x", "c0", "n0", "m0", "h0", "w", "r", "b")


def _xlstm(case):
    """xlstm's vanilla forward on the case's arrays as float64 leaves: ``(leaves, h, c, n,
    m [T, B, H] each, and the gates i, f [T, B, H])``."""
    leaves = {k: torch.tensor(case[k], requires_grad=True) for k in ARRAYS}
    wx = leaves["x"] @ leaves["w"]
    big_r = leaves["r"].transpose(1, 2)                          # [N, 4d, d]
    states = torch.stack([leaves[k] for k in ("h0", "c0", "n0", "m0")])
    states_all, _, gates = vanilla.slstm_forward(
        wx, states, big_r, leaves["b"], vanilla.slstm_pointwise_function_registry["slstm"])
    h, c, n, m = (states_all[k, 1:] for k in range(4))
    return leaves, h, c, n, m, gates[:-1, 0], gates[:-1, 1]


def _case(seed, **options):
    return slstm_sequence_case(np.random.default_rng(seed), steps=4, batch=3, input_size=3,
                               hidden=4, heads=2, **options)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_forward_equals_xlstms_vanilla_cell(seed):
    case = _case(seed)
    _, h, c, n, m, i, f = _xlstm(case)
    seq = gc.slstm_sequence(**case)
    for name, theirs in {"h": h, "c": c, "n": n, "m": m, "i": i, "f": f}.items():
        np.testing.assert_allclose(getattr(seq, name), theirs.detach().numpy(), rtol=1e-12,
                                   atol=1e-13, err_msg=name)


@pytest.mark.parametrize("loss", ["h", "state"])
def test_the_gradients_equal_xlstms_vanilla_autograd(loss):
    """A loss on ``h`` (and ``h_final``) or on every returned state: "exact" equals xlstm's
    vanilla autograd for every input; "stop" does on ``h`` but for ``m0``, and not on the
    state."""
    rng = np.random.default_rng(2)
    case = _case(3)
    leaves, *fields = _xlstm(case)
    names = ("h", "c", "n", "m") if loss == "state" else ("h",)
    seq = gc.slstm_sequence(**case)
    up = {k: rng.standard_normal(getattr(seq, k).shape) for k in names}
    total = sum((fields[("h", "c", "n", "m").index(k)] * torch.tensor(u)).sum()
                for k, u in up.items())
    theirs = dict(zip(ARRAYS, torch.autograd.grad(total, [leaves[k] for k in ARRAYS]),
                      strict=True))
    arrays = {k: case[k] for k in ARRAYS}
    for convention in ("exact", "stop"):
        run = gc.slstm_sequence(**{**case, "stabilizer_grad": convention})
        ours = gc.slstm_sequence_grad(**arrays, seq=run, **{f"d_{k}": u for k, u in up.items()})
        agree = {k: np.allclose(getattr(ours, k), theirs[k].numpy(), rtol=1e-10, atol=1e-11)
                 for k in ARRAYS}
        if convention == "exact":
            assert all(agree.values()), agree
        elif loss == "h":
            assert agree == {**dict.fromkeys(ARRAYS, True), "m0": False}, agree
            assert not ours.m0.any()
        else:
            assert not any(agree[k] for k in ("x", "w", "b", "m0")), agree


def test_from_an_all_zero_state_h_agrees_and_the_state_is_scaled():
    """xlstm's vanilla cell takes ``m_1 = ĩ_1`` when the whole ``n`` is zero (a documented
    convention, docs/spec.md §19): ``h`` agrees, ``c``, ``n`` at step 0 differ by the
    stabiliser's scale ``e^{m' - m}``."""
    case = _case(4)
    case.update({k: np.zeros_like(case[k]) for k in STATE_ZEROS})
    _, h, c, n, m, _, _ = _xlstm(case)
    seq = gc.slstm_sequence(**case)
    np.testing.assert_allclose(seq.h, h.detach().numpy(), rtol=1e-12, atol=1e-13)
    scale = np.exp(m[0].detach().numpy() - seq.m[0])
    np.testing.assert_allclose(seq.c[0], c[0].detach().numpy() * scale, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(seq.n[0], n[0].detach().numpy() * scale, rtol=1e-12, atol=1e-13)
    assert not np.allclose(seq.m[0], m[0].detach().numpy())


STATE_ZEROS = ("c0", "n0", "m0", "h0")


def test_a_converted_xlstm_cell_runs_its_forward():
    """``gc.layouts.slstm_from_xlstm`` of an ``sLSTMCell`` (vanilla backend, float64, its
    parameters as ``cell.recurrent_kernel`` and ``cell.bias`` give them) reproduces the
    module's outputs and final state; ``slstm_to_xlstm`` gives its parameters back."""
    cell_module = pytest.importorskip("xlstm.blocks.slstm.cell")
    torch.manual_seed(0)
    config = cell_module.sLSTMCellConfig(
        hidden_size=4, num_heads=2, backend="vanilla", dtype="float32",
        enable_automatic_mixed_precision=False, recurrent_weight_init="standard")
    cell = cell_module.sLSTMCell_vanilla(config).double()
    kernel, bias = cell.recurrent_kernel.clone().detach(), cell.bias.clone().detach()
    x = torch.randn(3, 5, 16, dtype=torch.float64)                   # [B, T, 4H], Wx
    state = torch.randn(4, 3, 4, dtype=torch.float64)                # (h, c, n, m)
    state[2] = state[2].abs() + 0.5
    out, final = cell(x, state)
    conv = gc.layouts.slstm_from_xlstm(kernel, bias)
    seq = gc.slstm_sequence(x.numpy(), *conv.gradcells_states(*state.numpy()), *conv,
                            **conv.options, batch_first=True)
    heads = out.detach().numpy()                                      # [B, N, T, d]
    np.testing.assert_allclose(seq.h, heads.transpose(0, 2, 1, 3).reshape(3, 5, 4),
                               rtol=1e-12, atol=1e-13)
    for k, name in enumerate(("h_final", "c_final", "n_final", "m_final")):
        np.testing.assert_allclose(getattr(seq, name), final[k].detach().numpy(),
                                   rtol=1e-12, atol=1e-13, err_msg=name)
    back = gc.layouts.slstm_to_xlstm(conv[1], conv[2])
    np.testing.assert_array_equal(back[0], kernel.numpy())
    np.testing.assert_array_equal(back[1], bias.numpy())
    with pytest.raises(ValueError, match=r"bias must have shape \[N, 4, d\]"):
        gc.layouts.slstm_from_xlstm(kernel, bias[:, :3])


def test_the_torch_module_runs_the_op_and_loads_an_xlstm_cell():
    """``gradcells.torch.sLSTM``: its forward is ``gc.slstm_sequence`` on its parameters,
    autograd reaches them with the op's gradient, and ``from_xlstm`` reproduces an xlstm
    ``sLSTMCell``'s forward."""
    gtorch = pytest.importorskip("gradcells.torch")
    cell_module = pytest.importorskip("xlstm.blocks.slstm.cell")
    torch.manual_seed(1)
    module = gtorch.sLSTM(3, 4, num_heads=2, dtype=torch.float64, stabilizer_grad="stop")
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    out, (c, n, m, h) = module(x)
    (out.sum() + c.sum() + m.sum()).backward()
    zeros = np.zeros((2, 4))
    params = [p.detach().numpy() for p in (module.w, module.r, module.b)]
    seq = gc.slstm_sequence(x.numpy(), zeros, zeros, zeros, zeros, *params,
                            stabilizer_grad="stop")
    np.testing.assert_allclose(out.detach().numpy(), seq.h, rtol=1e-13, atol=1e-14)
    grads = gc.slstm_sequence_grad(x.numpy(), zeros, zeros, zeros, zeros, *params, seq,
                                   d_h=np.ones((5, 2, 4)), d_c_final=np.ones((2, 4)),
                                   d_m_final=np.ones((2, 4)))
    for name in ("w", "r", "b"):
        np.testing.assert_allclose(getattr(module, name).grad.numpy(), getattr(grads, name),
                                   rtol=1e-12, atol=1e-13, err_msg=name)
    with pytest.raises(ValueError, match="num_heads must divide hidden_size"):
        gtorch.sLSTM(3, 4, num_heads=3)
    config = cell_module.sLSTMCellConfig(
        hidden_size=4, num_heads=2, backend="vanilla", dtype="float32",
        enable_automatic_mixed_precision=False, recurrent_weight_init="standard")
    cell = cell_module.sLSTMCell_vanilla(config).double()
    wx = torch.randn(2, 5, 16, dtype=torch.float64)
    state = torch.randn(4, 2, 4, dtype=torch.float64)
    state[2] = state[2].abs() + 0.5
    theirs, final = cell(wx, state)
    ours, finals = gtorch.sLSTM.from_xlstm(cell, batch_first=True)(
        wx, (state[1], state[2], state[3], state[0]))
    np.testing.assert_allclose(ours.detach().numpy(),
                               theirs.detach().numpy().transpose(0, 2, 1, 3).reshape(2, 5, 4),
                               rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(finals[1].detach().numpy(), final[2].detach().numpy(),
                               rtol=1e-12, atol=1e-13)
