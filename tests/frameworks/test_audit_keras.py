"""The Keras audit (``gradcells.audit.keras``): on every backend the rows agree or show the
known faults and conventions 30-33; a wrong gradient, forward-mode tangent or Hessian-vector
product injected into gradcells's side is an unexpected mismatch; each new entry is shown by
its model, and fully masked rows (length 0) by the same models. Skips without Keras."""

import io
import re

import numpy as np
import pytest
from audit_runs import whole_audit
from installed import needs

from gradcells import audit
from gradcells.audit import faults
from gradcells.audit import keras as audit_keras

pytestmark = needs("keras")        # imported by the audit's subprocesses, not here

ENTRY = r"(?:known fault|convention) \d+"
ROW = re.compile(r"^(?P<name>keras\[.+?)\s{2,}(?P<cases>\d+)\s{2,}"
                 rf"(?P<result>agrees|skipped|{ENTRY}(?: \+ {ENTRY})*(?: \(\d+/\d+\))?"
                 r"|UNEXPECTED MISMATCH \(\d+/\d+\))")


def _parsed(text):
    """{check name: result} of the audit's printed text."""
    return {m["name"].rstrip(): m["result"] for m in map(ROW.match, text.splitlines()) if m}


def _audit(**options):
    out = io.StringIO()
    status = audit.run("keras", stream=out, progress=False, examples=1, **options)
    text = out.getvalue()
    return status, _parsed(text), text


@pytest.fixture(scope="module")
def keras_audit():
    """The whole Keras audit, one case per check (``tests/audit_runs.py``: CI's only run of
    it): ``(exit status, {check name: result}, text)``."""
    status, text = whole_audit("keras")
    return status, _parsed(text), text


@pytest.mark.conformance
def test_keras_audit_agrees_or_shows_known_faults(keras_audit):
    status, rows, text = keras_audit
    assert status == 0, text
    assert len(rows) == len(audit_keras.CHECKS), text
    for check in audit_keras.CHECKS:
        allowed = {"agrees", "skipped"} | {faults.FAULTS[e].label for e in check.entries}
        shown = set(rows[check.name].split(" (")[0].split(" + "))
        assert shown <= allowed, (check.name, rows[check.name])


def _wrong(real):
    return lambda *a, **k: [g * 1.001 for g in real(*a, **k)]


@pytest.mark.conformance
@pytest.mark.parametrize(("function", "rows_of"), [
    ("gradcells_grads", "gradient vs"), ("expected_tangents", "forward mode vs"),
    ("gradcells_hvp", "HVP vs")])
def test_keras_injected_wrong_derivative_is_unexpected(monkeypatch, function, rows_of):
    """A 0.1% error in gradcells's side of a derivative makes its row unexpected; the
    backend's own row against the oracle, where there is one, still agrees."""
    monkeypatch.setattr(audit_keras, function, _wrong(getattr(audit_keras, function)))
    prefix = f"keras[tensorflow] GRU(reset_after=True) {rows_of}"
    status, rows, text = _audit(select=prefix)
    assert status == 1, text
    assert rows[f"{prefix} gradcells"].startswith("UNEXPECTED"), text
    assert rows.get(f"{prefix} oracle", "agrees") == "agrees", text


def _case(rng, cell="rnn", reset_after=None, **options):
    case = audit_keras.Case(rng, cell, reset_after, masked=True, **options)
    case.lengths[:] = 1
    case.lengths[0] = case.steps        # one full row, the others of length 1
    return case


@pytest.mark.conformance
def test_convention_30_masked_steps_repeat_the_previous_output():
    case = _case(np.random.default_rng(3), return_sequences=True, go_backwards=False)
    out = audit_keras.keras_outputs(audit_keras.keras_result("tensorflow", case), case)[0]
    zeros = audit_keras.expected_outputs(case)[0]
    carried = audit_keras.expected_outputs(case, frozenset({30}))[0]
    np.testing.assert_allclose(out, carried, atol=1e-12)
    if case.steps > 1 and case.args["x"].shape[0] > 1:
        assert not np.allclose(out, zeros)


@pytest.mark.conformance
def test_fault_31_jax_carries_h0_before_the_first_unmasked_step():
    case = _case(np.random.default_rng(4), cell="lstm", return_sequences=True,
                 go_backwards=True, unroll=False)
    out = audit_keras.keras_outputs(audit_keras.keras_result("jax", case), case)[0]
    h0_carry = audit_keras.expected_outputs(case, frozenset({30, 31}))[0]
    np.testing.assert_allclose(out, h0_carry, atol=1e-6)


@pytest.mark.conformance
def test_fault_32_and_33_float64_computed_in_float32_on_jax():
    rng = np.random.default_rng(5)
    verdict = audit_keras.forward_verdict(rng, "jax", "gru", False, False)
    assert not verdict.truth.agrees and verdict.fault_model.agrees
    assert verdict.truth.abs_error > 1e-10
    assert audit_keras.jax_rnn_scan(rng).kind(33) == "fault"


@pytest.mark.conformance
@pytest.mark.parametrize("backend", audit_keras.BACKENDS)
@pytest.mark.parametrize("return_sequences", [False, True])
def test_length_0_rows_follow_the_masking_entries(backend, return_sequences):
    """A fully masked row keeps h0 as its state (gradcells's final state for seq_len=0). Its
    every-step outputs are zeros (gradcells's), h0 on JAX's scan path (fault 31); so its last
    output is zeros (convention 30: gradcells's last output is the final state, h0) or h0.
    The forward and its first derivatives (gradient, forward mode) need exactly those entries
    of the masking; the HVP none (those outputs are zeros or h0, linear in the arguments: no
    second derivative either way)."""
    case = _case(np.random.default_rng(6), cell="gru", reset_after=True,
                 return_sequences=return_sequences, return_state=True, go_backwards=False,
                 unroll=False)
    case.lengths[1:] = 0
    out = audit_keras.keras_outputs(audit_keras.keras_result(backend, case), case)
    empty, h0 = case.lengths == 0, case.args["h0"]
    first = h0[empty] if backend == "jax" else np.zeros_like(h0[empty])
    shown = out[0][empty] if not return_sequences else out[0][empty][:, -1]
    np.testing.assert_allclose(out[1][empty], h0[empty], atol=1e-6)
    np.testing.assert_allclose(shown, first, atol=1e-6)
    if backend == "jax":
        needed = {31} if return_sequences else set()
    else:
        needed = set() if return_sequences else {30}
    entries = audit_keras.case_entries(backend, case, "forward")
    for judged, masking in ((audit_keras.judge_forward(backend, case), needed),
                            (audit_keras.judge_gradient(backend, case), needed),
                            (audit_keras.judge_jvp(backend, case), needed),
                            (audit_keras.judge_hvp(backend, case), set())):
        kind = judged.kind(entries)
        assert kind != "unexpected", judged
        shown = set() if kind == "agrees" else set(judged.entries)
        assert shown & audit_keras.MASKING == masking, judged


def test_the_keras_entries_name_keras_rows_expecting_them():
    """Each of entries 30-33 names Keras rows that expect it."""
    expected = {check.name: check.entries for check in audit_keras.CHECKS}
    for number in (30, 31, 32, 33):
        assert faults.FAULTS[number].checks
        for name in faults.FAULTS[number].checks:
            assert number in expected[name], (number, name)
