"""The audit of xLSTM's sLSTM (NX-AI/xlstm, ``xlstm.blocks.slstm.cell.sLSTMCell``) in
float64, against the oracle (central differences of xLSTM's own float64 forward) and against
gradcells's ``slstm_sequence`` (docs/spec.md §19).

xLSTM's cell takes the input's gate pre-activations ``Wx [B, S, 4H]`` (its layer computes them
outside the cell), so gradcells runs with ``I = 4H`` and ``w`` the identity; its parameters
and states come through ``gc.layouts.slstm_from_xlstm``.

The vanilla backend (PyTorch, any device) is checked: its forward from a carried state and
from the zero state, its autograd under a loss on the outputs and under a loss on the
returned state (truncated BPTT), against the oracle and against gradcells's exact gradient
(``stabilizer_grad="exact"``; the vanilla backend differentiates ``m`` as computed), its
``lengths`` and its ``step``. The CUDA backend needs a GPU and its compiled extension; where
neither is here the row is skipped with the reason.
"""

from __future__ import annotations

import functools
from importlib.metadata import version

import numpy as np

from .. import layouts, sequences
from ..oracle import check_vjp
from ._engine import FLOAT64, Check, Skipped, compare, judge, oracle_outcome

SECTION = "xLSTM's sLSTM (xlstm.blocks.slstm)"
STATE_ORDER = ("h", "c", "n", "m")
"""xLSTM's state ``[4, B, H]``, by its first axis."""


def _modules():
    import torch
    from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig

    return torch, sLSTMCell, sLSTMCellConfig


def _sizes(rng):
    """``(steps, batch, heads, head_dim)`` of one case."""
    return (int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 3)),
            int(rng.integers(1, 4)))


def _case(rng, *, zero_state=False):
    """One case: xLSTM's external parameters and inputs (float64 NumPy) and its sizes."""
    steps, batch, heads, head = _sizes(rng)
    hidden = heads * head
    case = {
        "sizes": (steps, batch, heads, head),
        "kernel": rng.standard_normal((heads, head, 4, head)) / np.sqrt(hidden),
        "bias": rng.standard_normal((heads, 4, head)) * 0.5,
        "wx": rng.standard_normal((batch, steps, 4 * hidden)),
    }
    if zero_state:   # some units' ĩ_1 below log σ(f̃_1): there the two first steps differ
        case["state"] = np.zeros((4, batch, hidden))
        lowered = rng.random((batch, hidden)) < 0.5
        lowered[0, 0] = True
        case["wx"][:, 0, :hidden] -= 3.0 * lowered
    else:
        h, c = rng.standard_normal((2, batch, hidden)) * 0.5
        n = rng.uniform(0.5, 2.0, (batch, hidden))
        m = rng.standard_normal((batch, hidden))
        case["state"] = np.stack([h, c, n, m])
    return case


def _cell(case):
    """xLSTM's vanilla ``sLSTMCell`` in float64 holding the case's parameters (made once
    per case, its parameters set on every call)."""
    torch, cell_type, config_type = _modules()
    if "cell" not in case:
        _, _, heads, head = case["sizes"]
        config = config_type(hidden_size=heads * head, num_heads=heads, backend="vanilla",
                             dtype="float32", output_shape="SBH",
                             enable_automatic_mixed_precision=False)
        case["cell"] = cell_type(config).double()
    cell = case["cell"]
    with torch.no_grad():
        kernel = torch.from_numpy(case["kernel"])
        cell._recurrent_kernel_.copy_(cell._recurrent_kernel_ext2int(kernel))
        cell._bias_.copy_(cell._bias_ext2int(torch.from_numpy(case["bias"])))
    return cell


def _weights(case):
    """gradcells's ``(w, r, b)`` for the case (``layouts.slstm_from_xlstm``: ``w`` the
    identity, x is xLSTM's ``Wx``)."""
    return layouts.slstm_from_xlstm(case["kernel"], case["bias"])


def _states(case):
    """The case's state (xLSTM's ``h, c, n, m``) in gradcells's order ``(c, n, m, h)``."""
    return _weights(case).gradcells_states(*case["state"])


def _gradcells(case, **options):
    """gradcells's sequence on the case, time-major ``x``."""
    x = np.ascontiguousarray(case["wx"].transpose(1, 0, 2))
    return sequences.slstm_sequence(x, *_states(case), *_weights(case), **options)


def _xlstm(case, wx=None, state=None, **call):
    """xLSTM's ``(outputs [S, B, H], final state [4, B, H])`` as tensors."""
    torch = _modules()[0]
    cell = _cell(case)
    wx = torch.from_numpy(case["wx"]) if wx is None else wx
    state = torch.from_numpy(case["state"]) if state is None else state
    return cell, cell(wx, state, **call)


def _final(seq):
    """gradcells's final state in xLSTM's order."""
    return np.stack([seq.h_final, seq.c_final, seq.n_final, seq.m_final])


def forward_verdict(rng, *, zero_state=False):
    """xLSTM's forward against gradcells's; from the zero state the convention's model is
    gradcells run from ``m0 = -inf`` (its first step then takes ``m_1 = ĩ_1``)."""
    case = _case(rng, zero_state=zero_state)
    _, (out, state) = _xlstm(case)
    seq = _gradcells(case, backend="reference")
    claim = _forward_outcome(out, state, seq)
    if not zero_state:
        return judge(claim, None)
    c0, n0, m0, h0 = _states(case)
    x = np.ascontiguousarray(case["wx"].transpose(1, 0, 2))
    model = functools.partial(sequences.slstm_sequence, x, c0, n0, np.full_like(m0, -np.inf),
                              h0, *_weights(case), backend="reference")
    return judge(claim, lambda: _forward_outcome(out, state, model()))


def _forward_outcome(out, state, seq):
    return compare([("h", out.detach().numpy(), seq.h),
                    ("state", state.detach().numpy(), _final(seq))], FLOAT64)


def _outputs(case, with_state, wx, state, kernel, bias):
    """xLSTM's outputs (and final state) as NumPy: the function the oracle differences."""
    torch = _modules()[0]
    run = _with(case, kernel=kernel, bias=bias)
    _, (out, final) = _xlstm(run, torch.from_numpy(wx), torch.from_numpy(state))
    outputs = (out.detach().numpy(),)
    return outputs + (final.detach().numpy(),) if with_state else outputs[0]


def _claimed_vjp(case, with_state, ct, wx, state, kernel, bias):
    """xLSTM's autograd as the vector-Jacobian product the oracle checks."""
    run = _with(case, wx=wx, state=state, kernel=kernel, bias=bias)
    return _autograd(run, ct if with_state else (ct,), with_state)


def _with(case, **arrays):
    """The case with some arrays replaced, sharing its cell."""
    case.setdefault("cell", _cell(case))
    return {**case, **arrays}


def _autograd(case, cotangents, with_state):
    """xLSTM's autograd gradients of ``<ct, outputs>`` for ``(wx, state, kernel, bias)``."""
    torch = _modules()[0]
    wx = torch.from_numpy(case["wx"]).requires_grad_()
    state = torch.from_numpy(case["state"]).requires_grad_()
    cell, (out, final) = _xlstm(case, wx, state)
    loss = (out * torch.from_numpy(cotangents[0])).sum()
    if with_state:
        loss = loss + (final * torch.from_numpy(cotangents[1])).sum()
    kernel_int, bias_int = cell._recurrent_kernel_, cell._bias_
    d_wx, d_state, d_kernel, d_bias = torch.autograd.grad(loss, (wx, state, kernel_int,
                                                                  bias_int))
    shape = case["kernel"].shape
    return (d_wx.numpy(), d_state.numpy(),
            cell._recurrent_kernel_int2ext(d_kernel).reshape(shape).numpy(),
            cell._bias_int2ext(d_bias).reshape(case["bias"].shape).numpy())


def oracle_verdict(rng, *, with_state):
    """xLSTM's autograd against central differences of its own float64 forward."""
    case = _case(rng)
    args = (case["wx"], case["state"], case["kernel"], case["bias"])
    report = check_vjp(functools.partial(_outputs, case, with_state),
                       functools.partial(_claimed_vjp, case, with_state), args,
                       names=("wx", "state", "kernel", "bias"), seed=0)
    return judge(oracle_outcome(report), None)


def gradients_verdict(rng):
    """xLSTM's autograd under a loss on the outputs and the final state against gradcells's
    exact gradient (``stabilizer_grad="exact"``)."""
    case = _case(rng)
    steps, batch, heads, head = case["sizes"]
    hidden = heads * head
    d_out = rng.standard_normal((steps, batch, hidden))
    d_state = rng.standard_normal((4, batch, hidden))
    want = _autograd(case, (d_out, d_state), with_state=True)
    seq = _gradcells(case, backend="reference")
    x = np.ascontiguousarray(case["wx"].transpose(1, 0, 2))
    d_h_final, d_c, d_n, d_m = d_state
    grads = sequences.slstm_sequence_grad(
        x, *_states(case), *_weights(case), seq, d_h=d_out, d_h_final=d_h_final,
        d_c_final=d_c, d_n_final=d_n, d_m_final=d_m, backend="reference")
    kernel = grads.r.reshape(case["kernel"].shape)
    bias = grads.b.reshape(4, heads, head).transpose(1, 0, 2)
    return judge(compare([("wx", want[0], grads.x.transpose(1, 0, 2)),
                          ("state", want[1], np.stack([grads.h0, grads.c0, grads.n0,
                                                        grads.m0])),
                          ("kernel", want[2], kernel), ("bias", want[3], bias)], FLOAT64),
                 None)


def lengths_verdict(rng):
    """``sLSTMCell(x, state, lengths=...)`` against gradcells's ``seq_len``; fault 60's
    model: gradcells run over every step (the lengths ignored)."""
    torch = _modules()[0]
    case = _case(rng)
    steps, batch = case["sizes"][:2]
    lengths = rng.integers(0, steps + 1, size=batch)
    lengths[0] = max(steps - 1, 0)          # one row shorter than T at least
    _, (out, state) = _xlstm(case, lengths=torch.from_numpy(lengths))
    seq = _gradcells(case, seq_len=lengths, backend="reference")
    valid = np.arange(steps)[:, None, None] < lengths[None, :, None]
    claim = compare([("h", np.where(valid, out.detach().numpy(), 0.0), seq.h),
                     ("state", state.detach().numpy(), _final(seq))], FLOAT64)
    full = _gradcells(case, backend="reference")
    return judge(claim, lambda: compare([("h", out.detach().numpy(), full.h),
                                         ("state", state.detach().numpy(), _final(full))],
                                        FLOAT64))


def step_verdict(rng):
    """``sLSTMCell.step`` (one step from a state): its output and the state it returns
    against gradcells's step; fault 61's model: the state returned is the one passed in."""
    torch = _modules()[0]
    case = _case(rng)
    case["wx"] = case["wx"][:, :1]
    cell = _cell(case)
    out, state = cell.step(torch.from_numpy(case["wx"]), torch.from_numpy(case["state"]))
    seq = _gradcells(case, backend="reference")
    claim = compare([("h", out.detach().numpy().reshape(seq.h.shape), seq.h),
                     ("state", state.detach().numpy(), _final(seq))], FLOAT64)
    return judge(claim, lambda: compare([
        ("h", out.detach().numpy().reshape(seq.h.shape), seq.h),
        ("state", state.detach().numpy(), case["state"])], FLOAT64))


def cuda_verdict(rng):
    """The CUDA backend needs a GPU and xLSTM's compiled extension."""
    torch = _modules()[0]
    if not torch.cuda.is_available():
        raise Skipped("the CUDA backend needs a CUDA device (none here)")
    raise Skipped("the CUDA backend's check is not written yet: it has never run on a "
                  "device (docs/audit.md)")


CHECKS = (
    Check("sLSTMCell (vanilla) forward from a carried state vs gradcells",
          lambda rng: forward_verdict(rng)),
    Check("sLSTMCell (vanilla) forward from the zero state vs gradcells",
          lambda rng: forward_verdict(rng, zero_state=True), fault=62),
    Check("sLSTMCell (vanilla) autograd, loss on the outputs, vs oracle",
          lambda rng: oracle_verdict(rng, with_state=False)),
    Check("sLSTMCell (vanilla) autograd, loss on the outputs and the returned state, "
          "vs oracle", lambda rng: oracle_verdict(rng, with_state=True)),
    Check("sLSTMCell (vanilla) autograd vs gradcells (slstm_sequence_grad, exact)",
          gradients_verdict),
    Check("sLSTMCell (vanilla) lengths vs gradcells (seq_len)", lengths_verdict, fault=60),
    Check("sLSTMCell (vanilla) step vs gradcells", step_verdict, fault=61),
    Check("sLSTMCell (cuda) vs gradcells (stabilizer_grad='stop')", cuda_verdict, cases=1),
)


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the xLSTM audit; ImportError without xlstm."""
    _modules()
    return (f"gradcells audit of {SECTION} {version('xlstm')} (CPU, float64)", CHECKS, [])
