"""gradcells's minGRU against minGRU-pytorch (lucidrains; PyPI ``mingru-pytorch``, 0.2.1
when written), its sequential mode (one step per call) and its parallel, log-space mode
(docs/spec.md §18.2): the audit of minGRU-pytorch #9, whose two modes once differed.

Its layer is batch-first, bias-free, with ``to_hidden_and_gate.weight [2H, D]`` holding the
candidate's rows, then the gate's; gradcells's ``w [I, 2H]`` holds the gate's columns, then
the candidate's. Its parallel mode takes logarithms of the initial state and of ``g(h̃)``,
so it needs ``h0 > 0``; gradcells's scan takes any sign. Its minLSTM (``minLSTM``) is held
to gradcells's ``minlstm_sequence`` the same way: its sequential mode from any ``h0``, its
parallel mode from 0 (given an ``h0`` it starts from ``g(h0)``, fault 71). The torch
modules ``gradcells.torch.MinGRU`` and ``MinLSTM`` load its layers' state dicts and are held
to its sequential mode, forward and every gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
from audit_runs import whole_audit

import gradcells as gc

torch = pytest.importorskip("torch")
mingru_pytorch = pytest.importorskip("minGRU_pytorch.minGRU")

STEPS, BATCH, DIM = 6, 3, 4


def _layer_and_weights():
    torch.manual_seed(0)
    layer = mingru_pytorch.minGRU(DIM).double()
    rows = layer.to_hidden_and_gate.weight.detach().numpy()         # [2H, D]
    w = np.concatenate([rows[DIM:].T, rows[:DIM].T], axis=1)         # gate, then candidate
    return layer, w, np.zeros(2 * DIM)


def _their_modes(layer, x, h0):
    """Its parallel mode, and its sequential mode run step by step, ``[B, T, H]`` each."""
    with torch.no_grad():
        parallel = layer(x, h0)
        h, steps = h0, []
        for t in range(x.shape[1]):
            h = layer(x[:, t:t + 1], h)
            steps.append(h)
    return parallel.numpy(), torch.cat(steps, 1).numpy()


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_both_of_its_modes_equal_gradcells(method):
    layer, w, b = _layer_and_weights()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, STEPS, DIM))
    h0 = rng.uniform(0.1, 1.0, (BATCH, 1, DIM))                     # positive: its log space
    parallel, sequential = _their_modes(layer, torch.tensor(x), torch.tensor(h0))
    seq = gc.mingru_sequence(x, h0[:, 0], w, b, method=method, batch_first=True)
    np.testing.assert_allclose(seq.h, sequential, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(seq.h, parallel, rtol=1e-12, atol=1e-13)   # its log space
    np.testing.assert_allclose(seq.h_final, sequential[:, -1], rtol=1e-13, atol=1e-14)


def test_fault_70_parallel_mode_is_nan_for_a_negative_initial_state():
    """Its log-space scan takes ``log h0``: with ``h0 < 0`` its parallel mode is NaN, with no
    error; its sequential mode and gradcells's two methods are finite and equal."""
    layer, w, b = _layer_and_weights()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((BATCH, STEPS, DIM))
    h0 = -rng.uniform(0.1, 1.0, (BATCH, 1, DIM))
    parallel, sequential = _their_modes(layer, torch.tensor(x), torch.tensor(h0))
    assert np.isnan(parallel).any()
    for method in ("sequential", "parallel"):
        seq = gc.mingru_sequence(x, h0[:, 0], w, b, method=method, batch_first=True)
        np.testing.assert_allclose(seq.h, sequential, rtol=1e-13, atol=1e-14)


def test_fault_71_minlstm_parallel_mode_starts_from_g_of_h0():
    """Its parallel minLSTM runs from ``g(h0)``; its sequential mode (the paper) from
    ``h0``: they differ, and the sequential mode run from ``g(h0)`` equals the parallel."""
    from gradcells.audit import mingru as audit_mingru

    case = audit_mingru._case(np.random.default_rng(3), gates=3)
    with torch.no_grad():
        parallel = audit_mingru._parallel(case, kind="minLSTM").numpy()
    sequential = audit_mingru._sequential(case, kind="minLSTM")
    assert np.abs(parallel - sequential).max() > 1e-2
    h0 = case["h0"]
    g_h0 = np.where(h0 >= 0, h0 + 0.5, 1 / (1 + np.exp(-h0)))
    np.testing.assert_allclose(parallel, audit_mingru._sequential(case, h0=g_h0,
                                                                  kind="minLSTM"),
                               rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------------------
# its minLSTM: rows of ``to_hidden_and_f_i_gate.weight [3H, D]`` the candidate's, then f's,
# then i's; gradcells's ``w [I, 3H]`` columns f, i, then h̃


def _minlstm_and_weights():
    from minGRU_pytorch.minLSTM import minLSTM

    torch.manual_seed(4)
    layer = minLSTM(DIM).double()
    rows = layer.to_hidden_and_f_i_gate.weight.detach().numpy()       # [3H, D]
    w = np.concatenate([rows[DIM:2 * DIM].T, rows[2 * DIM:].T, rows[:DIM].T], axis=1)
    return layer, w, np.zeros(3 * DIM)


def _its_minlstm_step_by_step(layer, x, h0):
    """Its sequential mode (one step per call, the paper's recurrence from ``h0``),
    ``[B, T, H]``."""
    h, steps = h0, []
    for t in range(x.shape[1]):
        h = layer(x[:, t:t + 1], h)
        steps.append(h)
    return torch.cat(steps, 1)


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_its_minlstm_sequential_mode_equals_gradcells_forward_and_gradients(method):
    """Forward and every gradient (autograd through its sequential mode) equal gradcells's,
    float64, from an ``h0`` of both signs (its sequential mode needs no logarithm)."""
    layer, w, b = _minlstm_and_weights()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((BATCH, STEPS, DIM))
    h0 = rng.standard_normal((BATCH, 1, DIM))
    up = rng.standard_normal((BATCH, STEPS, DIM))
    x_t, h0_t = torch.tensor(x, requires_grad=True), torch.tensor(h0, requires_grad=True)
    theirs = _its_minlstm_step_by_step(layer, x_t, h0_t)
    (theirs * torch.tensor(up)).sum().backward()
    seq = gc.minlstm_sequence(x, h0[:, 0], w, b, method=method, batch_first=True)
    np.testing.assert_allclose(seq.h, theirs.detach().numpy(), rtol=1e-13, atol=1e-14)
    grads = gc.minlstm_sequence_grad(x, h0[:, 0], w, b, seq, d_h=up)
    np.testing.assert_allclose(grads.x, x_t.grad.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(grads.h0, h0_t.grad.numpy()[:, 0], rtol=1e-12, atol=1e-13)
    rows = layer.to_hidden_and_f_i_gate.weight.grad.numpy()
    np.testing.assert_allclose(grads.w, np.concatenate(
        [rows[DIM:2 * DIM].T, rows[2 * DIM:].T, rows[:DIM].T], axis=1), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_its_minlstm_parallel_mode_from_zero_equals_gradcells(method):
    """Without ``prev_hidden`` both of its modes start from 0 (fault 71 needs an ``h0``): its
    log-space parallel mode then equals gradcells from ``h0 = 0``."""
    layer, w, b = _minlstm_and_weights()
    x = np.random.default_rng(6).standard_normal((BATCH, STEPS, DIM))
    with torch.no_grad():
        parallel = layer(torch.tensor(x)).numpy()
        first = layer(torch.tensor(x[:, :1])).numpy()                 # its one-step mode
    seq = gc.minlstm_sequence(x, np.zeros((BATCH, DIM)), w, b, method=method,
                              batch_first=True)
    np.testing.assert_allclose(seq.h, parallel, rtol=1e-12, atol=1e-13)   # its log space
    np.testing.assert_allclose(seq.h[:, :1], first, rtol=1e-13, atol=1e-14)


@pytest.mark.conformance
def test_the_mingru_audit_agrees_or_shows_its_listed_faults():
    from gradcells.audit import mingru as audit_mingru

    status, text = whole_audit("mingru")
    assert status == 0, text
    for check in audit_mingru.CHECKS:
        line = next(row for row in text.splitlines() if row.startswith(check.name + "  "))
        result = line[len(check.name):].split(None, 1)[1]
        expected = f"known fault {check.fault}" if check.fault else "agrees"
        assert result.startswith(expected), (check.name, result)



def test_the_converters_are_its_layout_and_round_trip():
    """``gc.layouts.{mingru,minlstm}_{from,to}_mingru_pytorch`` equal this file's own reading
    of its layout (rows: candidate, then gate; candidate, f, i), both ways; a bias it cannot
    hold and a weight of no whole number of blocks are named."""
    for (layer, w, b), linear, convert, back in (
            (_layer_and_weights(), "to_hidden_and_gate", gc.layouts.mingru_from_mingru_pytorch,
             gc.layouts.mingru_to_mingru_pytorch),
            (_minlstm_and_weights(), "to_hidden_and_f_i_gate",
             gc.layouts.minlstm_from_mingru_pytorch, gc.layouts.minlstm_to_mingru_pytorch)):
        weight = getattr(layer, linear).weight
        converted = convert(weight)
        np.testing.assert_array_equal(converted[0], w)
        np.testing.assert_array_equal(converted[1], b)
        assert converted.options == {"batch_first": True}
        np.testing.assert_array_equal(back(*converted), weight.detach().numpy())
        with pytest.raises(ValueError, match="^b must be zero"):
            back(w, b + 1)
        with pytest.raises(ValueError, match=f"^{linear}_weight must have"):
            convert(np.zeros((len(b) + 1, DIM)))


# --------------------------------------------------------------------------------------
# gradcells.torch.MinGRU and MinLSTM: its layers' parameters, forward and returns on
# gradcells's sequences


def _their_layer(kind, expansion_factor, seed):
    from minGRU_pytorch.minLSTM import minLSTM

    torch.manual_seed(seed)
    layer = {"minGRU": mingru_pytorch.minGRU, "minLSTM": minLSTM}[kind]
    return layer(DIM, expansion_factor).double()


def _step_by_step(layer, x, prev_hidden):
    """Its sequential mode with ``return_next_prev_hidden``: one call per step (the first
    without a state when ``prev_hidden`` is None, as its own first call is)."""
    h, outs = prev_hidden, []
    for t in range(x.shape[1]):
        out, h = layer(x[:, t:t + 1], h, return_next_prev_hidden=True)
        outs.append(out)
    return torch.cat(outs, 1), h


def _forward_and_gradients(run, params, x, prev_hidden, up, up_last):
    """``run(x, prev_hidden) -> (out, next_prev_hidden)`` and the gradients of ``⟨up, out⟩ +
    ⟨up_last, next_prev_hidden⟩`` in the input, the state (if given) and ``params``."""
    leaves = [x, *([] if prev_hidden is None else [prev_hidden]), *params.values()]
    for t in leaves:
        t.grad = None
    out, last = run(x, prev_hidden)
    ((out * up).sum() + (last * up_last).sum()).backward()
    names = ["x", *([] if prev_hidden is None else ["prev_hidden"]), *params]
    return out.detach(), last.detach(), {n: t.grad.clone() for n, t in zip(names, leaves,
                                                                           strict=True)}


@pytest.mark.parametrize("prev", [False, True], ids=["from-zero", "prev_hidden"])
@pytest.mark.parametrize("kind", ["minGRU", "minLSTM"])
def test_the_torch_modules_load_its_state_dict_and_equal_its_sequential_mode(kind, prev):
    """``gradcells.torch.MinGRU``/``MinLSTM`` take its layer's state dict as it is (its
    parameter names; ``to_out`` too with ``expansion_factor=1.5``) and give, float64, its
    sequential mode's ``out`` and ``next_prev_hidden`` and the gradients of a loss on both
    in every parameter, the input and ``prev_hidden`` (of both signs): the mode that is
    right for both layers from any state (its parallel mode is NaN for a negative state,
    fault 70, and its minLSTM's starts from ``g(h0)``, fault 71)."""
    import gradcells.torch as gtorch

    expansion = 1.5 if prev else 1.0
    layer = _their_layer(kind, expansion, seed=7)
    module = getattr(gtorch, kind.replace("min", "Min"))(DIM, expansion, dtype=torch.float64)
    assert [k for k, _ in module.named_parameters()] == [k for k, _ in layer.named_parameters()]
    module.load_state_dict(layer.state_dict())
    rng = np.random.default_rng(8)
    inner = int(DIM * expansion)
    x = torch.tensor(rng.standard_normal((BATCH, STEPS, DIM)), requires_grad=True)
    prev_hidden = (torch.tensor(rng.standard_normal((BATCH, 1, inner)), requires_grad=True)
                   if prev else None)
    up = torch.tensor(rng.standard_normal((BATCH, STEPS, DIM)))
    up_last = torch.tensor(rng.standard_normal((BATCH, 1, inner)))
    want = _forward_and_gradients(lambda x, h: _step_by_step(layer, x, h),
                                  dict(layer.named_parameters()), x, prev_hidden, up, up_last)
    got = _forward_and_gradients(
        lambda x, h: module(x, h, return_next_prev_hidden=True),
        dict(module.named_parameters()), x, prev_hidden, up, up_last)
    for a, b, name in ((got[0], want[0], "out"), (got[1], want[1], "next_prev_hidden")):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-13, err_msg=name)
    assert list(got[2]) == list(want[2]) == [
        "x", *(["prev_hidden"] if prev else []), *dict(layer.named_parameters())]
    for name, grad in want[2].items():
        np.testing.assert_allclose(got[2][name].numpy(), grad.numpy(), rtol=1e-12, atol=1e-13,
                                   err_msg=name)
    with torch.no_grad():   # without return_next_prev_hidden: out alone
        alone = module(x, prev_hidden)
        assert isinstance(alone, torch.Tensor)
        torch.testing.assert_close(alone, got[0], rtol=0, atol=0)
        if not prev:   # from zero its parallel mode is right too (faults 70, 71 need a state)
            np.testing.assert_allclose(alone.numpy(), layer(x).numpy(), rtol=1e-12,
                                       atol=1e-13)


@pytest.mark.parametrize("kind", ["MinGRU", "MinLSTM"])
def test_the_torch_modules_pass_gradcheck(kind):
    """Every parameter (``to_out`` too), the input and ``prev_hidden``, both outputs,
    reverse and forward mode, on a tiny float64 size; a ``prev_hidden`` of another shape is
    named."""
    import gradcells.torch as gtorch

    torch.manual_seed(9)
    module = getattr(gtorch, kind)(2, 1.5, dtype=torch.float64)
    names = [k for k, _ in module.named_parameters()]
    x = torch.randn(1, 3, 2, dtype=torch.float64, requires_grad=True)
    prev_hidden = torch.randn(1, 1, 3, dtype=torch.float64, requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]

    def f(x, prev_hidden, *p):
        return torch.func.functional_call(module, dict(zip(names, p, strict=True)),
                                          (x, prev_hidden), {"return_next_prev_hidden": True})

    assert torch.autograd.gradcheck(f, (x, prev_hidden, *params), check_forward_ad=True)
    with pytest.raises(ValueError, match=r"prev_hidden must have shape \[B, 1, H\] = \[1, 1, 3\]"):
        module(x, prev_hidden[:, 0])
