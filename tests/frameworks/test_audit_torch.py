"""The extended PyTorch audit (``gradcells.audit.torch``): whole modules on packed ragged
sequences, the cells' double backward and forward mode agree with the oracle and gradcells;
PyTorch's missing forward AD through ``pack_padded_sequence`` is fault 50; an injected wrong
double backward or forward-mode tangent is an unexpected mismatch. The whole audit (the
first edition's rows too) runs once, in ``tests/audit_runs.py``.

Every test skips without PyTorch.
"""

import re

import numpy as np
import pytest
from audit_runs import whole_audit

from gradcells import audit
from gradcells.audit.faults import FAULTS
from gradcells.oracle import check_jvp

pytestmark = pytest.mark.conformance

EXTENDED = ("packed", "double backward", "forward AD")
ROW = re.compile(r"^(?P<name>.+?)\s{2,}(?P<cases>\d+)\s{2,}(?P<result>agrees|known fault \d+"
                 r"(?: \(\d+/\d+\))?|UNEXPECTED MISMATCH \(\d+/\d+\))(?:\s{2,}(?P<detail>.*))?$")


@pytest.fixture(scope="module")
def audit_torch(torch):
    from gradcells.audit import torch as audit_torch

    return audit_torch


def _rows(checks, select=None, examples=1):
    """{check name: Row} of the checks whose name contains ``select``."""
    rng = np.random.default_rng(0)
    return {c.name: audit.run_check(c, rng, examples) for c in checks
            if select is None or select in c.name}


@pytest.fixture(scope="module")
def torch_audit(audit_torch):
    """The whole PyTorch audit, one case per check (``tests/audit_runs.py``: CI's only run
    of it): ``(exit status, {check name: result}, text)``."""
    status, text = whole_audit("torch")
    return status, {m["name"]: m["result"] for m in map(ROW.match, text.splitlines()) if m}, text


def test_the_torch_audit_agrees_or_shows_its_known_fault(audit_torch, torch_audit):
    """Exit status 0, a row per check in order, each 'agrees' or the fault its check
    expects."""
    status, rows, text = torch_audit
    assert status == 0, text
    assert list(rows) == [c.name for c in audit_torch.CHECKS], text
    for check in audit_torch.CHECKS:
        assert rows[check.name] == (f"known fault {check.fault}" if check.fault else
                                    "agrees"), text


def test_the_extended_checks_agree_or_show_fault_50(torch_audit):
    _, rows, text = torch_audit
    extended = {n: r for n, r in rows.items() if any(k in n for k in EXTENDED)}
    assert len(extended) == 33
    for name, result in rows.items():     # (an unexpected row's result: UNEXPECTED MISMATCH)
        expected = "known fault 50" if name == FAULTS[50].checks[0] else "agrees"
        assert result == expected, (name, result, text)


def test_the_first_editions_rows_keep_their_names(audit_torch):
    names = [c.name for c in audit_torch.BASIC]
    assert len(names) == 12 and names == [c.name for c in audit_torch.CHECKS[:12]]
    assert "nn.GRUCell autograd vs gradcells" in names


def test_every_row_of_fault_50_is_a_torch_row_expecting_it(audit_torch):
    expected = {c.name: c.fault for c in audit_torch.CHECKS if c.fault is not None}
    assert expected == {name: 50 for name in FAULTS[50].checks}
    assert FAULTS[50].kind == "fault" and FAULTS[50].test in globals()


def test_ragged_lengths_run_from_1_to_T(audit_torch):
    rng = np.random.default_rng(1)
    for batch in range(1, 5):
        for steps in range(1, 5):
            lengths = audit_torch.ragged_lengths(rng, batch, steps)
            assert lengths.max() == steps and lengths.min() >= 1
            assert batch == 1 or lengths.min() == 1


@pytest.mark.parametrize("cell, nonlinearity", [("lstm", None), ("gru", None),
                                                ("rnn", "tanh"), ("rnn", "relu")])
def test_a_packed_stack_check_runs_alone(audit_torch, cell, nonlinearity):
    rng = np.random.default_rng(2)
    for check in (audit_torch.stack_forward_verdict, audit_torch.stack_gradcells_verdict,
                  audit_torch.stack_hvp_gradcells_verdict):
        assert check(rng, cell, nonlinearity).kind(None) == "agrees"


def test_an_injected_wrong_double_backward_is_unexpected(torch, audit_torch, monkeypatch):
    """First gradients built for a double backward keep their values, but their own
    derivative is scaled by 1.001: the second-order rows notice, and only they."""
    real = torch.autograd.grad

    def wrong(outputs, inputs, grad_outputs=None, **kwargs):
        grads = real(outputs, inputs, grad_outputs, **kwargs)
        if not kwargs.get("create_graph"):
            return grads
        return tuple(g.detach() + 1.001 * (g - g.detach()) for g in grads)

    monkeypatch.setattr(torch.autograd, "grad", wrong)
    rows = _rows(audit_torch.CHECKS, "Cell") | _rows(audit_torch.CHECKS, "nn.GRU packed")
    assert sum("double backward" in name for name in rows) == 6
    for name, row in rows.items():
        assert row.unexpected == ("double backward" in name), (name, row)


@pytest.mark.parametrize("inject", ["func.jvp", "forward_ad"])
def test_an_injected_wrong_forward_mode_tangent_is_unexpected(torch, audit_torch, monkeypatch,
                                                              inject):
    """A tangent 0.1% off in ``torch.func.jvp`` (or in ``forward_ad.unpack_dual``, which
    ``torch.func.jvp`` also reads through) fails every forward-mode row that reads it."""
    import torch.autograd.forward_ad as fwad
    import torch.func

    if inject == "func.jvp":
        real = torch.func.jvp

        def wrong(f, primals, tangents):
            out, tangent = real(f, primals, tangents)
            return out, (tangent[0] * 1.001,) + tuple(tangent[1:])

        monkeypatch.setattr(torch.func, "jvp", wrong)
    else:
        real = fwad.unpack_dual

        def wrong(tensor):
            unpacked = real(tensor)
            return unpacked._replace(tangent=unpacked.tangent * 1.001)

        monkeypatch.setattr(fwad, "unpack_dual", wrong)
    rows = _rows(audit_torch.CHECKS, "forward AD")
    assert not rows[FAULTS[50].checks[0]].unexpected                # still refused
    for name, row in rows.items():
        if "packed" not in name and (inject == "func.jvp" or "forward_ad" in name):
            assert row.unexpected, (name, row)


def test_fault_50_no_forward_ad_through_pack_padded_sequence(torch, audit_torch):
    """PyTorch refuses the JVP of a packed nn.LSTM; gradcells's ``lstm_stack_jvp`` with
    ``seq_len`` gives it, and the oracle's differences of PyTorch's packed forward agree."""
    from torch.nn.utils.rnn import pack_padded_sequence

    x = torch.ones(2, 1, 1, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match=audit_torch.PACKED_FORWARD_AD):
        torch.func.jvp(lambda x: pack_padded_sequence(x, torch.tensor([2])).data, (x,), (x,))
    case = audit_torch.StackCase(np.random.default_rng(5), "lstm")
    assert case.lengths.min() < case.lengths.max()         # ragged
    with pytest.raises(NotImplementedError, match=audit_torch.PACKED_FORWARD_AD):
        audit_torch.torch_tangent(case, case.tangent, *case.args)
    gradcells = audit_torch.gradcells_stack_tangent(case)
    report = check_jvp(case.forward, lambda t, *a: gradcells, case.args,
                       tangents=case.tangent)
    assert report.passed, report
    assert audit_torch.packed_jvp_verdict(np.random.default_rng(5)).kind(50) == "fault"
    for cell, nonlinearity in (("gru", None), ("rnn", "relu")):        # as the evidence says
        case = audit_torch.StackCase(np.random.default_rng(5), cell, nonlinearity)
        with pytest.raises(NotImplementedError, match=audit_torch.PACKED_FORWARD_AD):
            audit_torch.torch_dual_tangent(case, case.tangent, *case.args)


def test_fault_50_is_unexpected_when_the_ragged_tangent_is_wrong(audit_torch, monkeypatch):
    """The fault's model is the truth PyTorch cannot give: a wrong gradcells tangent
    makes the refusal an unexpected mismatch, not fault 50."""
    real = audit_torch.gradcells_stack_tangent
    monkeypatch.setattr(audit_torch, "gradcells_stack_tangent",
                        lambda case: tuple(1.001 * t for t in real(case)))
    row = _rows(audit_torch.CHECKS, FAULTS[50].checks[0]).popitem()[1]
    assert row.unexpected and row.result.startswith("UNEXPECTED"), row
    assert audit_torch.packed_jvp_verdict(np.random.default_rng(5)).kind(50) == "unexpected"
