"""The Keras audit (``gradcells.audit.keras``): on every backend the rows agree or show the
known faults and conventions 30-33; an injected wrong gradient is an unexpected mismatch; each
new entry is shown by its model. Skips without Keras."""

import io
import re

import numpy as np
import pytest

from gradcells import audit
from gradcells.audit import faults

pytest.importorskip("keras")
from gradcells.audit import keras as audit_keras  # noqa: E402

ROW = re.compile(r"^(?P<name>keras\[.+?)\s{2,}(?P<cases>\d+)\s{2,}"
                 r"(?P<result>agrees|skipped|(?:known fault|convention) \d+(?: \(\d+/\d+\))?"
                 r"|UNEXPECTED MISMATCH \(\d+/\d+\))")


def _audit(**options):
    out = io.StringIO()
    status = audit.run("keras", stream=out, progress=False, examples=1, **options)
    text = out.getvalue()
    rows = {m["name"].rstrip(): m["result"] for m in map(ROW.match, text.splitlines()) if m}
    return status, rows, text


@pytest.fixture(scope="module")
def keras_audit():
    return _audit()


@pytest.mark.conformance
def test_keras_audit_agrees_or_shows_known_faults(keras_audit):
    status, rows, text = keras_audit
    assert status == 0, text
    assert len(rows) == len(audit_keras.CHECKS), text
    for check in audit_keras.CHECKS:
        allowed = {"agrees", "skipped"} | ({faults.FAULTS[check.fault].label}
                                           if check.fault else set())
        assert rows[check.name].split(" (")[0] in allowed, (check.name, rows[check.name])


def _wrong(real):
    return lambda *a, **k: [g * 1.001 for g in real(*a, **k)]


@pytest.mark.conformance
def test_keras_injected_wrong_gradient_is_unexpected(monkeypatch):
    monkeypatch.setattr(audit_keras, "gradcells_grads", _wrong(audit_keras.gradcells_grads))
    status, rows, text = _audit(select="keras[tensorflow] GRU(reset_after=True) gradient vs")
    assert status == 1, text
    assert rows["keras[tensorflow] GRU(reset_after=True) gradient vs gradcells"].startswith(
        "UNEXPECTED"), text
    assert rows["keras[tensorflow] GRU(reset_after=True) gradient vs oracle"] == "agrees"


def _case(rng, cell="rnn", **options):
    case = audit_keras.Case(rng, cell, None, masked=True)
    case.options.update(options)
    case.lengths[:] = 1
    case.lengths[0] = case.steps        # one full row, the others of length 1
    return case


@pytest.mark.conformance
def test_convention_30_masked_steps_repeat_the_previous_output():
    case = _case(np.random.default_rng(3), return_sequences=True, go_backwards=False)
    out = audit_keras.keras_outputs(audit_keras.keras_result("tensorflow", case), case)[0]
    zeros = audit_keras.expected_outputs(case)[0]
    carried = audit_keras.expected_outputs(case, np.zeros_like(case.args["h0"]))[0]
    np.testing.assert_allclose(out, carried, atol=1e-12)
    if case.steps > 1 and case.args["x"].shape[0] > 1:
        assert not np.allclose(out, zeros)


@pytest.mark.conformance
def test_fault_31_jax_carries_h0_before_the_first_unmasked_step():
    case = _case(np.random.default_rng(4), cell="lstm", return_sequences=True,
                 go_backwards=True, unroll=False)
    out = audit_keras.keras_outputs(audit_keras.keras_result("jax", case), case)[0]
    h0_carry = audit_keras.expected_outputs(case, case.args["h0"])[0]
    np.testing.assert_allclose(out, h0_carry, atol=1e-6)


@pytest.mark.conformance
def test_fault_32_and_33_float64_computed_in_float32_on_jax():
    rng = np.random.default_rng(5)
    verdict = audit_keras.forward_verdict(rng, "jax", "gru", False, False)
    assert not verdict.truth.agrees and verdict.fault_model.agrees
    assert verdict.truth.abs_error > 1e-10
    assert audit_keras.jax_rnn_scan(rng).kind(33) == "fault"


def test_the_keras_entries_name_keras_rows_expecting_them():
    """Each of entries 30-33 names Keras rows that expect it."""
    expected = {check.name: check.fault for check in audit_keras.CHECKS}
    for number in (30, 31, 32, 33):
        assert faults.FAULTS[number].checks
        for name in faults.FAULTS[number].checks:
            assert expected[name] == number, (number, name)
