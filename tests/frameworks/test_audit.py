"""The audit: TensorFlow's known faults are recognised as such and everything else agrees
(its whole audit, ``tests/audit_runs.py``; PyTorch's is in ``test_audit_torch.py``); an
injected wrong gradient is an unexpected mismatch (exit 1).

Each framework's tests skip when it is not installed.
"""

import ast
import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from audit_runs import whole_audit

from gradcells import audit
from gradcells.audit import tensorflow as audit_tensorflow
from gradcells.cells.lstm.spec import PEEPHOLES

ROW = re.compile(r"^(?P<name>.+?)\s{2,}(?P<cases>\d+)\s{2,}(?P<result>agrees|known fault \d+"
                 r"(?: \(\d+/\d+\))?|UNEXPECTED MISMATCH \(\d+/\d+\))(?:\s{2,}(?P<detail>.*))?$")


def _rows(text):
    """{check name: result} of an audit's printed text."""
    return {m["name"]: m["result"] for m in map(ROW.match, text.splitlines()) if m}


def _audit(framework, **options):
    """(exit status, {check name: result}, full text) of one audit run."""
    out = io.StringIO()
    status = audit.run(framework, stream=out, progress=False, **options)
    text = out.getvalue()
    return status, _rows(text), text


# ---------------------------------------------------------------------------------------------
# The comparison and the verdicts, without any framework


def test_compare_reports_the_worst_element_and_where():
    truth = np.array([1.0, 2.0, 3.0])
    outcome = audit.compare([("a", truth, truth), ("b", truth + [0, 0.5, 0], truth)],
                            (0.0, 0.1))
    assert outcome.where == "b" and outcome.abs_error == 0.5 and outcome.ratio == 5.0
    assert not outcome.agrees
    assert audit.compare([("a", truth + 1e-3, truth)], (0.0, 0.1)).agrees


def test_compare_treats_nan_and_wrong_shapes_as_mismatches():
    assert not audit.compare([("a", np.array([np.nan]), np.array([0.0]))], (1, 1)).agrees
    assert not audit.compare([("a", np.zeros(2), np.zeros(3))], (1, 1)).agrees
    assert audit.compare([("a", np.zeros(2), np.zeros(2))], (0.0, 0.0)).agrees


def test_a_mismatch_is_a_known_fault_only_when_the_fault_model_matches():
    miss, hit = audit.Outcome(3.0, 0.1, "w"), audit.Outcome(0.5, 1e-6, "w")
    assert audit.Verdict(hit).kind(None) == "agrees"
    assert audit.Verdict(miss, hit).kind(3) == "fault"
    assert audit.Verdict(miss, miss).kind(3) == "unexpected"
    assert audit.Verdict(miss, hit).kind(None) == "unexpected"
    assert audit.Verdict(miss).kind(3) == "unexpected"


def test_a_check_the_framework_cannot_run_is_skipped_with_its_reason_never_a_pass():
    def too_old(rng):
        raise audit.Skipped("needs torch >= 9.0, found 2.13")

    row = audit.run_check(audit.Check("new op", too_old), np.random.default_rng(0), 3)
    assert (row.result, row.detail, row.cases, row.unexpected) == (
        "skipped", "needs torch >= 9.0, found 2.13", 0, False)
    counts = audit._engine.summary([row], None)[0]
    assert counts == "1 check: 0 agree, 0 show known faults, 1 skipped, 0 unexpected mismatches"


def test_a_convention_row_names_the_convention_not_a_fault(monkeypatch):
    convention = audit.Fault(99, "a documented convention", "evidence", "repro",
                             kind="convention")
    monkeypatch.setitem(audit.FAULTS, 99, convention)
    miss, model = audit.Outcome(3.0, 0.1, "h"), audit.Outcome(0.1, 1e-9, "h")
    row = audit.run_check(audit.Check("conv", lambda rng: audit.Verdict(miss, model), 99),
                          np.random.default_rng(0), 2)
    assert row.result == "convention 99" and not row.unexpected
    lines = audit._engine.summary([row], None)
    assert lines == ["1 check: 0 agree, 0 show known faults, 1 show documented conventions, "
                     "0 unexpected mismatches", "  convention 99: a documented convention"]


def test_a_check_that_raises_is_an_unexpected_mismatch_not_a_crash():
    def broken(rng):
        raise RuntimeError("kernel exploded")

    row = audit._run_check(audit.Check("broken", broken), np.random.default_rng(0), 2)
    assert row.unexpected and "kernel exploded" in row.detail


def test_bad_arguments():
    with pytest.raises(ValueError, match="framework must be 'all' or one of"):
        audit.run("mxnet")
    with pytest.raises(ValueError, match="examples must be a positive integer"):
        audit.run("torch", examples=0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        audit.run("torch", seed=-1)


def test_a_selection_that_matches_nothing_is_exit_status_2(capsys):
    pytest.importorskip("torch")
    assert audit.run("torch", select="zzz", stream=io.StringIO(), progress=False) == 2
    assert "--select 'zzz' matches no torch check" in capsys.readouterr().err


def test_missing_framework_is_exit_status_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)        # import torch raises ImportError
    assert audit.run("torch", stream=io.StringIO(), progress=False) == 2
    assert "torch is not installed" in capsys.readouterr().err


def test_audit_all_fails_when_any_framework_shows_an_unexpected_mismatch(monkeypatch):
    """``python -m gradcells audit all`` runs each framework of ``ALL`` in turn and exits with
    the worst status of those installed: 1 when any shows an unexpected mismatch. (The suite
    runs each framework's whole audit through its own test file, ``tests/audit_runs.py``.)"""
    from gradcells import cli

    ran, statuses = [], dict.fromkeys(audit.ALL, 0) | {"jax": 2}      # jax not installed

    def one(framework, examples, *rest, **kwargs):
        ran.append((framework, examples))
        return statuses[framework]

    monkeypatch.setattr(audit, "_run_one", one)
    assert cli.main(["audit", "all", "--examples", "1"]) == 0
    assert ran == [(name, 1) for name in audit.ALL]
    statuses["keras"] = 1
    assert cli.main(["audit", "all", "--examples", "1"]) == 1
    statuses.update(dict.fromkeys(audit.ALL, 2))
    assert audit.run("all", stream=io.StringIO()) == 2


# ---------------------------------------------------------------------------------------------
# TensorFlow


@pytest.fixture(scope="module")
def tf():
    pytest.importorskip("tensorflow")
    return audit_tensorflow.import_tensorflow()


@pytest.fixture(scope="module")
def tensorflow_audit(tf):
    """The whole TensorFlow audit at two cases per check (CI's only run of it)."""
    status, text = whole_audit("tensorflow", examples=2)
    return status, _rows(text), text


@pytest.mark.conformance
def test_tensorflow_audit_agrees_or_shows_known_faults(tensorflow_audit):
    status, rows, text = tensorflow_audit
    assert status == 0, text
    assert len(rows) == 21, text
    assert not any(r.startswith("UNEXPECTED") for r in rows.values()), text
    for name in ("LSTMBlockCell forward", "LSTMBlockCellGrad vs oracle",
                 "LSTMBlockCellGrad vs gradcells", "GRUBlockCell forward",
                 "GRUBlockCellGrad (+ seed wrapper) vs oracle", "BlockLSTM forward",
                 "BlockLSTM gradient (GradientTape) vs oracle", "BlockLSTMGradV2 op vs oracle"):
        assert rows[name] == "agrees", text


@pytest.mark.conformance
def test_tensorflow_audit_recognises_the_faults(tensorflow_audit):
    _, rows, text = tensorflow_audit
    faults = {int(r.split()[2]) for r in rows.values() if r.startswith("known fault")}
    assert {1, 3, 4, 6, 9, 10, 11} <= faults, text
    assert rows["BlockLSTMV2 gradient (GradientTape) vs oracle"].startswith("known fault 6")
    assert "fault 6: BlockLSTMV2's registered gradient" in text
    for name in audit.FAULTS[11].checks:        # a loss on the gate outputs too, every case
        assert rows[name] == "known fault 11", text


@pytest.mark.conformance
def test_tensorflow_injected_wrong_gradient_is_unexpected(tf, monkeypatch):
    real = tf.raw_ops.GRUBlockCellGrad

    def wrong(**kwargs):
        d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = real(**kwargs)
        return d_x, d_h_prev * 1.01, d_c_bar, d_r_bar_u_bar

    monkeypatch.setattr(tf.raw_ops, "GRUBlockCellGrad", wrong)
    status, rows, text = _audit("tensorflow", examples=1, select="GRUBlockCell")
    assert status == 1, text
    assert rows["GRUBlockCellGrad (+ seed wrapper) vs oracle"].startswith("UNEXPECTED"), text
    assert rows["GRUBlockCellGrad (+ seed wrapper) vs gradcells"].startswith("UNEXPECTED")
    assert rows["GRUBlockCell forward"] == "agrees"
    gates = "seed _GRUBlockCellGrad, a loss on every output, vs oracle"      # not fault 11
    assert rows[gates].startswith("UNEXPECTED") and "not fault 11 either" in text, text


@pytest.mark.conformance
def test_tensorflow_mismatch_unlike_its_fault_is_unexpected(tf, monkeypatch):
    """A wrong LSTM gradient on top of the clip fault is no longer 'known fault 3'."""
    real = tf.raw_ops.LSTMBlockCellGrad

    def wrong(**kwargs):
        cs_prev_grad, *rest = real(**kwargs)
        return (cs_prev_grad + 0.1, *rest)

    monkeypatch.setattr(tf.raw_ops, "LSTMBlockCellGrad", wrong)
    status, rows, text = _audit("tensorflow", examples=1, select="clipping active")
    assert status == 1
    assert rows["LSTMBlockCellGrad, clipping active, vs oracle"].startswith("UNEXPECTED"), text
    assert "not fault 3 either" in text


# ---------------------------------------------------------------------------------------------
# PyTorch


@pytest.mark.conformance
def test_torch_injected_wrong_gradient_is_unexpected(torch, monkeypatch):
    real = torch.autograd.grad

    def wrong(outputs, inputs, grad_outputs, **kwargs):
        grads = real(outputs, inputs, grad_outputs, **kwargs)
        return (grads[0] * 1.001,) + tuple(grads[1:])

    monkeypatch.setattr(torch.autograd, "grad", wrong)
    status, rows, text = _audit("torch", examples=1, select="nn.GRUCell")
    assert status == 1, text
    assert rows["nn.GRUCell autograd vs oracle"].startswith("UNEXPECTED"), text
    assert rows["nn.GRUCell autograd vs gradcells"].startswith("UNEXPECTED"), text
    assert rows["nn.GRUCell forward vs gradcells (layouts.gru_from_torch)"] == "agrees"


# ---------------------------------------------------------------------------------------------
# The rooms: each check alone, the table, functions that fit on a screen


def test_the_table_is_the_shared_one_with_the_detail_unpadded():
    rows = [audit.Row("a check", 2, "agrees", "max |Δ| 1e-08", False),
            audit.Row("another, longer check", 2, "known fault 3", "-", False)]
    lines = audit._engine.rows_table(rows)
    assert lines[0].split() == ["check", "cases", "result", "detail"]
    assert lines[1].endswith("  ------")                  # the detail's rule: its header's width
    assert lines[2] == "a check                2      agrees         max |Δ| 1e-08"
    assert all(ROW.match(line) for line in lines[2:])


def test_the_summary_names_each_fault_shown_by_its_listed_title():
    rows = [audit.Row("x", 1, "known fault 6", "-", False, (6,)),
            audit.Row("y", 1, "agrees", "-", False)]
    lines = audit._engine.summary(rows, 1.0)
    assert lines[0] == ("2 checks: 1 agree, 1 show known faults, 0 unexpected mismatches "
                        "(1.0 s)")
    assert lines[1:] == [f"  fault 6: {audit.FAULTS[6].title}"]
    rows += [audit.Row("z", 1, "convention 30 + known fault 32", "-", False, (30, 32)),
             audit.Row("w", 1, "convention 30", "-", False, (30,))]
    lines = audit._engine.summary(rows, None)
    assert lines[0] == ("4 checks: 1 agree, 2 show known faults, 1 show documented "
                        "conventions, 0 unexpected mismatches")
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "fault 6", "convention 30", "fault 32"]


def test_a_row_names_the_entries_its_cases_needed():
    """A check that may show several entries: the row joins those its cases' verdicts
    needed, counts the cases that needed any, and a case no model explains is unexpected."""
    from gradcells.audit._engine import judge_entries

    def case_with(needed):
        def model(active):            # each needed entry halves the error; agrees when all
            return audit.Outcome(2.0 ** len(set(needed) - active), 0.1, "x")
        return lambda rng: judge_entries(model, (30, 31, 32))

    verdicts = iter([case_with(()), case_with((30,)), case_with((30, 32))])
    check = audit.Check("c", lambda rng: next(verdicts)(rng), fault=(30, 31, 32))
    row = audit.run_check(check, np.random.default_rng(0), 3)
    assert (row.result, row.entries) == ("convention 30 + known fault 32 (2/3)", (30, 32))
    assert "entries' joint model" in row.detail

    lone = audit.Check("d", case_with((30, 33)), fault=(30, 31, 32))
    row = audit.run_check(lone, np.random.default_rng(0), 1)
    assert row.unexpected and "not entries 30 + 31 + 32 either" in row.detail


@pytest.mark.conformance
def test_a_torch_check_runs_alone(torch):
    from gradcells.audit import torch as audit_torch

    rng = np.random.default_rng(0)
    for verdict in (audit_torch.forward_verdict(rng, "lstm", True),
                    audit_torch.oracle_verdict(rng, "gru", False),
                    audit_torch.gradcells_verdict(rng, "gru", True)):
        assert verdict.kind(None) == "agrees", verdict


@pytest.mark.conformance
def test_a_tensorflow_check_runs_alone(tf):
    from gradcells.audit import tensorflow as audit_tf

    assert audit_tf.lstm_forward(np.random.default_rng(0)).kind(None) == "agrees"
    documented = audit_tf.lstm_documented_order(np.random.default_rng(0))
    assert documented.kind(1) == "fault" and not documented.truth.agrees
    assert audit_tf.registered_gradient(np.random.default_rng(0)).kind(9) == "fault"


def _tree(path):
    return ast.parse(path.read_text(encoding="utf-8"))


def _functions(tree):
    return [node for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _lines(fn):
    """A function's lines, its decorators and docstring included."""
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    return fn.end_lineno - first + 1


OWN_MODULES = ["gradcells/audit", "gradcells/testing", "gradcells/oracle.py",
               "gradcells/cli.py", "gradcells/_core/report.py"]


def _own_files(names=OWN_MODULES):
    root = Path(__file__).resolve().parents[2]
    for name in names:
        path = root / name
        yield from (sorted(path.glob("*.py")) if path.is_dir() else [path])


def test_functions_fit_on_a_screen():
    """No function of the audit, the testing tools, the oracle, the CLI or the report printer
    is over 60 lines."""
    for path in _own_files():
        for fn in _functions(_tree(path)):
            assert _lines(fn) <= 60, f"{path.name}:{fn.name} has {_lines(fn)} lines"


def test_the_audit_checks_are_module_level_with_no_closures():
    """Every audit function is defined at module level or as a method: a check can be
    imported and run alone (closures are lambdas, one line)."""
    for path in _own_files(["gradcells/audit"]):
        tree = _tree(path)
        for fn in _functions(tree):
            inner = [n for n in _functions(fn) if n is not fn]
            assert not inner, f"{path.name}:{fn.name} defines {[n.name for n in inner]}"


def test_no_literal_tuple_of_the_peephole_names():
    """The peephole names are spelled once, in ``gradcells.cells.lstm.spec.PEEPHOLES``."""
    for path in _own_files():
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.Tuple, ast.List)):
                values = [getattr(e, "value", None) for e in node.elts]
                assert not set(PEEPHOLES) <= set(values), f"{path.name}:{node.lineno}"


def test_the_public_functions_of_the_tools_are_fully_annotated():
    """``check_vjp``, every public function of ``gradcells.testing``, ``audit.run`` and
    ``cli.main``: every parameter and the return annotated."""
    import inspect

    import gradcells.testing as testing
    from gradcells import cli, oracle

    functions = [oracle.check_vjp, audit.run, cli.main] + [
        value for name in testing.__all__
        if inspect.isfunction(value := getattr(testing, name))]
    assert len(functions) > 20
    for fn in functions:
        signature = inspect.signature(fn)
        missing = [p.name for p in signature.parameters.values()
                   if p.annotation is inspect.Parameter.empty]
        assert not missing, f"{fn.__module__}.{fn.__name__}: {missing} unannotated"
        assert signature.return_annotation is not inspect.Signature.empty, fn.__name__


# ---------------------------------------------------------------------------------------------
# Markdown: docs/audit.md


def _markdown_sections(text):
    """{section title: [(check, cases, result, detail)]} of an audit in Markdown."""
    sections, title = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:]
            sections[title] = []
        elif title and line.startswith("| "):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if cells[0] != "check":  # the header row
                sections[title].append(tuple(cells))
    return sections


def test_docs_audit_md_holds_every_check_with_an_expected_result():
    """The stored audit has one row per check of each framework, in order, and each row is
    'agrees' or the fault its check expects: nothing unexpected, nothing stale."""
    import importlib

    from gradcells.audit import ALL, FAULTS

    text = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text("utf-8")
    sections = _markdown_sections(text)
    by_framework = {}
    for name in ALL:
        module = importlib.import_module(f"gradcells.audit.{name}")
        by_framework[module.SECTION] = module.CHECKS
    def framework(title):
        return next(name for name in by_framework if title.startswith(f"{name} "))

    assert sorted(map(framework, sections)) == sorted(by_framework)
    for title, rows in sections.items():
        checks = by_framework[framework(title)]
        assert [r[0] for r in rows] == [c.name for c in checks], title
        for (name, _, result, _), check in zip(rows, checks, strict=True):
            allowed = {"agrees", "skipped"} | {FAULTS[e].label for e in check.entries}
            assert set(result.split(" (")[0].split(" + ")) <= allowed, (name, result)
    assert "UNEXPECTED" not in text


@pytest.mark.conformance
def test_the_markdown_audit_names_the_versions_and_escapes_the_table(torch):
    import gradcells

    out = io.StringIO()
    status = audit.run("torch", examples=1, select="nn.GRUCell autograd", stream=out,
                       progress=False, markdown=True)
    text = out.getvalue()
    assert status == 0, text
    assert text.startswith(f"## PyTorch {torch.__version__}")
    assert f"gradcells {gradcells.__version__}, NumPy {np.__version__}" in text
    assert ("by `python -m gradcells audit torch --examples 1 --seed 0 --select "
            "'nn.GRUCell autograd' --markdown`." in text)
    rows = _markdown_sections(text)[text.splitlines()[0][3:]]
    assert [r[2] for r in rows] == ["agrees"] * 2
    assert all(r[3].startswith("max |Δ| ") for r in rows)        # "|" escaped, read back
    assert "checks: 2 agree, 0 show known faults, 0 unexpected mismatches." in text


def test_the_cli_passes_markdown_to_the_audit(monkeypatch):
    from gradcells import cli

    seen = {}
    monkeypatch.setattr(audit, "run", lambda framework, **kw: seen.update(kw) or 0)
    assert cli.main(["audit", "torch", "--markdown"]) == 0
    assert seen["markdown"] is True
    assert cli.main(["audit", "torch"]) == 0 and seen["markdown"] is False
