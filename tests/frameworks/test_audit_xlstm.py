"""The audit of xLSTM's sLSTM (``gradcells.audit.xlstm``): its vanilla cell's forward and
autograd agree with gradcells and the oracle, under a loss on the outputs and on the
returned state; faults 60 (``lengths`` ignored) and 61 (``step`` returns the state it was
given) and convention 62 (the zero state's first step), each shown here on its own. The
whole audit runs once (``tests/audit_runs.py``).

Every test skips without xlstm (``pip install xlstm``).
"""

import numpy as np
import pytest
from audit_runs import whole_audit

import gradcells as gc

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="module")
def xlstm_audit():
    pytest.importorskip("xlstm")
    from gradcells.audit import xlstm

    return xlstm


def _row(text, name):
    line = next(line for line in text.splitlines() if line.startswith(name + "  "))
    return line[len(name):].split(None, 1)[1]


def test_the_xlstm_audit_agrees_or_shows_its_listed_faults(xlstm_audit):
    status, text = whole_audit("xlstm")
    assert status == 0, text
    for check in xlstm_audit.CHECKS:
        result = _row(text, check.name)
        if check.entries:
            expected = ("known fault", "convention", "agrees")
        elif "cuda" in check.name:
            expected = ("skipped",)
        else:
            expected = ("agrees",)
        assert result.startswith(expected), (check.name, result)
    for number in (60, 61):      # always triggered: a shorter row, a step's new state
        assert f"known fault {number}" in text


def _case(xlstm_audit, seed, **kw):
    return xlstm_audit._case(np.random.default_rng(seed), **kw)


def test_fault_60_lengths_are_ignored(xlstm_audit):
    torch = pytest.importorskip("torch")
    case = _case(xlstm_audit, 1)
    steps, batch = case["sizes"][:2]
    lengths = np.zeros(batch, np.int64)
    _, (out, state) = xlstm_audit._xlstm(case)
    _, (out_l, state_l) = xlstm_audit._xlstm(case, lengths=torch.from_numpy(lengths))
    assert torch.equal(out, out_l) and torch.equal(state, state_l)
    # gradcells with every length 0 returns the initial state; xLSTM ran every step
    seq = xlstm_audit._gradcells(case, seq_len=lengths, backend="reference")
    np.testing.assert_array_equal(seq.c_final, case["state"][1])
    assert np.abs(state.detach().numpy()[1] - case["state"][1]).max() > 1e-3


def test_fault_61_step_returns_the_state_given(xlstm_audit):
    torch = pytest.importorskip("torch")
    case = _case(xlstm_audit, 2)
    case["wx"] = case["wx"][:, :1]
    given = torch.from_numpy(case["state"])
    out, returned = xlstm_audit._cell(case).step(torch.from_numpy(case["wx"]), given)
    assert returned is given
    seq = xlstm_audit._gradcells(case, backend="reference")
    np.testing.assert_allclose(out.detach().numpy().reshape(seq.h.shape), seq.h,
                               rtol=1e-12, atol=1e-14)        # the step itself is right


def test_convention_62_zero_state_starts_from_the_input_gate(xlstm_audit):
    case = _case(xlstm_audit, 3, zero_state=True)
    case["wx"] = case["wx"][:, :1]        # the first step: where the conventions differ
    _, (out, state) = xlstm_audit._xlstm(case)
    seq = xlstm_audit._gradcells(case, backend="reference")
    np.testing.assert_allclose(out.detach().numpy(), seq.h, rtol=1e-12, atol=1e-14)
    assert np.abs(state.detach().numpy()[1:] - xlstm_audit._final(seq)[1:]).max() > 1e-3
    c0, n0, m0, h0 = xlstm_audit._states(case)
    x = np.ascontiguousarray(case["wx"].transpose(1, 0, 2))
    model = gc.slstm_sequence(x, c0, n0, np.full_like(m0, -np.inf), h0,
                              *xlstm_audit._weights(case), backend="reference")
    np.testing.assert_allclose(state.detach().numpy(), xlstm_audit._final(model),
                               rtol=1e-12, atol=1e-14)


def test_a_wrong_gradient_is_an_unexpected_mismatch(xlstm_audit, monkeypatch):
    """The audit can fail: gradcells's gradient with ``stabilizer_grad="stop"`` (not what
    the vanilla backend differentiates) under a loss on the state is flagged."""
    real = gc.sequences.slstm_sequence_grad

    def stopped(*args, **kwargs):
        seq = args[8]
        redone = gc.slstm_sequence(*args[:8], stabilizer_grad="stop", backend="reference")
        assert seq.settings.stabilizer_grad == "exact"
        return real(*args[:8], redone, **kwargs)

    monkeypatch.setattr(xlstm_audit.sequences, "slstm_sequence_grad", stopped)
    verdict = xlstm_audit.gradients_verdict(np.random.default_rng(4))
    assert verdict.kind(None) == "unexpected"
