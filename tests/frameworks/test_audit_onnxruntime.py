"""The audit of ONNX Runtime's LSTM, GRU and RNN operators: everything agrees with gradcells
or shows a known fault (40, 41, 42) or convention (43); an injected wrong output is an
unexpected mismatch; each fault and convention shown on its own. Skipped without
onnxruntime and onnx."""

import io
import re

import numpy as np
import pytest
from audit_runs import whole_audit

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from gradcells import audit, layouts, sequences  # noqa: E402
from gradcells.audit import onnxruntime as audit_ort  # noqa: E402
from gradcells.audit.faults import FAULTS  # noqa: E402

pytestmark = pytest.mark.conformance

ROW = re.compile(r"^(?P<name>.+?)\s{2,}(?P<cases>\d+)\s{2,}(?P<result>agrees|skipped|"
                 r"(?:known fault|convention) \d+(?: \(\d+/\d+\))?|UNEXPECTED MISMATCH "
                 r"\(\d+/\d+\))(?:\s{2,}(?P<detail>.*))?$")
OURS = (40, 41, 42, 43)


def _parsed(text):
    """{check name: result} of the audit's printed text."""
    return {m["name"]: m["result"] for m in map(ROW.match, text.splitlines()) if m}


def _audit(**options):
    """(exit status, {check name: result}, full text) of one ONNX Runtime audit run."""
    out = io.StringIO()
    status = audit.run("onnxruntime", stream=out, progress=False, **options)
    text = out.getvalue()
    return status, _parsed(text), text


@pytest.fixture(scope="module")
def onnxruntime_audit():
    """The whole ONNX Runtime audit, one case per check (``tests/audit_runs.py``: CI's only
    run of it): ``(exit status, {check name: result}, text)``."""
    status, text = whole_audit("onnxruntime")
    return status, _parsed(text), text


def test_the_audit_agrees_or_shows_the_known_faults(onnxruntime_audit):
    status, rows, text = onnxruntime_audit
    assert status == 0, text
    assert list(rows) == [c.name for c in audit_ort.CHECKS], text
    for check in audit_ort.CHECKS:
        expected = "agrees" if check.fault is None else FAULTS[check.fault].label
        assert rows[check.name] == expected, text
    assert "3 show known faults, 3 show documented conventions, 0 unexpected" in text


def test_the_rows_name_the_listed_faults():
    """Each of faults 40-43 lists exactly the ONNX Runtime rows that expect it, and its test
    is in this file."""
    expected = {c.name: c.fault for c in audit_ort.CHECKS if c.fault is not None}
    listed = {name: n for n in OURS for name in FAULTS[n].checks}
    assert listed == expected
    for n in OURS:
        assert FAULTS[n].test in globals() and f"_{n}_" in FAULTS[n].test


def test_an_injected_wrong_output_is_unexpected(monkeypatch):
    real = audit_ort.run_node

    def wrong(op, feeds, outputs, **attrs):
        out = real(op, feeds, outputs, **attrs)
        return dict(out, Y=out["Y"] * 1.001)

    monkeypatch.setattr(audit_ort, "run_node", wrong)
    status, rows, text = _audit(examples=1, select="GRU")
    assert status == 1, text
    assert rows["GRU linear_before_reset=1 vs gradcells reset_after=True"].startswith(
        "UNEXPECTED"), text
    assert rows["GRU weights from gradcells (layouts.gru_to_onnx)"].startswith("UNEXPECTED")


def test_a_mismatch_unlike_its_fault_is_unexpected(monkeypatch):
    """A wrong cell state on top of fault 40 is no longer 'known fault 40'."""
    real = audit_ort.run_node

    def wrong(op, feeds, outputs, **attrs):
        out = real(op, feeds, outputs, **attrs)
        return dict(out, Y_c=out["Y_c"] + 0.1) if "Y_c" in out else out

    monkeypatch.setattr(audit_ort, "run_node", wrong)
    status, rows, text = _audit(examples=1, select="LSTM clip")
    assert status == 1 and "not fault 40 either" in text, text


@pytest.mark.parametrize("kind", list(audit_ort.OPERATORS))
@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_the_transcription_equals_gradcells_without_clip_and_the_clip_acts(kind, direction):
    rng = np.random.default_rng(3)
    case = audit_ort.Case(rng, kind, direction=direction, lengths="full", initial=True)
    truth = case.gradcells()
    for got, want in zip(audit_ort.spec_outputs(case, None), truth, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    clipped = audit_ort.spec_outputs(case, 0.2)
    assert max(np.abs(c - t).max() for c, t in zip(clipped, truth, strict=True)) > 1e-3
    verdict = audit_ort.clip_verdict(rng, kind)
    assert verdict.kind(40 if kind == "lstm" else None) == ("fault" if kind == "lstm" else
                                                             "agrees")


def test_a_check_runs_alone():
    rng = np.random.default_rng(0)
    assert audit_ort.forward_verdict(rng, "lstm", direction="bidirectional",
                                     lengths="ragged", peephole=True).kind(None) == "agrees"
    assert audit_ort.output_conventions(rng, "gru").kind(None) == "agrees"
    assert audit_ort.zero_lengths(rng, "rnn").kind(43) == "fault"


# -- each fault and convention -----------------------------------------------------------------


def test_fault_40_lstm_clip_skips_the_cell_state():
    """The reproduction: Ct = 2.5 with clip = 1; ONNX's Ht is 0.5·tanh(1), ORT's 0.5·tanh(2.5)."""
    f = np.float32
    z = np.zeros((1, 4, 1), f)
    feeds = {"X": np.zeros((1, 1, 1), f), "W": z, "R": z, "initial_c": np.full((1, 1, 1), 5, f)}
    out = audit_ort.run_node("LSTM", feeds, ["Y", "Y_h", "Y_c"], hidden_size=1, clip=1.0)
    assert out["Y_c"].item() == pytest.approx(2.5)
    assert out["Y_h"].item() == pytest.approx(0.5 * np.tanh(2.5), rel=1e-6)
    assert out["Y_h"].item() != pytest.approx(0.5 * np.tanh(1.0), rel=1e-3)
    verdict = audit_ort.clip_verdict(np.random.default_rng(1), "lstm")
    assert not verdict.truth.agrees and verdict.fault_model.agrees


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_fault_41_onnxruntime_refuses_float64(op, gates):
    z = np.zeros((1, gates, 1))
    with pytest.raises(Exception, match="does not support double|Could not find an impl"):
        audit_ort.run_node(op, {"X": np.zeros((1, 1, 1)), "W": z, "R": z}, ["Y"],
                           hidden_size=1)
    assert audit_ort.float64_inputs(np.random.default_rng(0)).kind(41) == "fault"


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_fault_42_onnxruntime_refuses_layout_1(op, gates):
    f = np.float32
    z = np.zeros((1, gates, 1), f)
    with pytest.raises(Exception, match=r"layout == 1\) are not supported"):
        audit_ort.run_node(op, {"X": np.zeros((1, 1, 1), f), "W": z, "R": z}, ["Y"],
                           hidden_size=1, layout=1)


def test_convention_43_zero_length_rows_end_in_zeros():
    """A row of length 0 with initial_h = 1: ORT's Y_h is 0, gradcells's h_final is 1."""
    f = np.float32
    z = np.zeros((1, 1, 1), f)
    feeds = {"X": z, "W": z, "R": z, "sequence_lens": np.zeros(1, np.int32),
             "initial_h": np.ones((1, 1, 1), f)}
    out = audit_ort.run_node("RNN", feeds, ["Y", "Y_h"], hidden_size=1)
    assert out["Y_h"].item() == 0.0 and out["Y"].item() == 0.0
    w, b = layouts.rnn_from_onnx(z, z)
    seq = sequences.rnn_sequence(z, np.ones((1, 1), f), w, b, seq_len=[0])
    assert seq.h_final.item() == 1.0 and seq.h.item() == 0.0
