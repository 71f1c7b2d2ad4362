"""``python -m gradcells check``: a table, and an exit status that reflects failures."""

import io
import subprocess
import sys

import pytest

import gradcells.reference
from gradcells import _dispatch, cli


def test_check_passes_and_prints_a_table(capsys):
    status = cli.main(["check", "--examples", "2", "--backends", "reference",
                       "--ops", "lstm_cell", "gru_cell"])
    out = capsys.readouterr().out
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["op", "backend", "arrays", "dtype"]
    rows = [line.split() for line in lines[2:6]]
    assert {(r[0], r[3]) for r in rows} == {(op, dt) for op in ("lstm_cell", "gru_cell")
                                            for dt in ("float64", "float32")}
    assert all(r[-1] == "pass" for r in rows)
    assert "4 of 4 combinations pass" in out


def test_check_fails_on_a_wrong_gradient(monkeypatch, capsys):
    right = gradcells.reference.gru_cell_grad

    def wrong(*args, **kwargs):
        grads = right(*args, **kwargs)
        return grads._replace(b_c=grads.b_c * 1.001)

    monkeypatch.setattr(_dispatch.backend_module("reference"), "gru_cell_grad", wrong)
    status = cli.main(["check", "--examples", "2", "--backends", "reference",
                       "--ops", "gru_cell", "--dtypes", "float64"])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAIL (2 of 2)" in out and "0 of 1 combinations pass" in out


def test_check_reports_an_exception_as_a_failure(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(_dispatch.backend_module("reference"), "lstm_cell_grad", broken)
    status = cli.main(["check", "--examples", "1", "--backends", "reference",
                       "--ops", "lstm_cell", "--dtypes", "float64"])
    assert status == 1
    assert "ERROR RuntimeError: boom" in capsys.readouterr().out


def test_check_covers_the_plain_rnn(capsys):
    """``check --ops rnn_cell rnn_sequence``: both ops, both dtypes, on the reference."""
    status = cli.main(["check", "--examples", "3", "--backends", "reference",
                       "--ops", "rnn_cell", "rnn_sequence"])
    out = capsys.readouterr().out
    assert status == 0
    rows = [line.split() for line in out.splitlines()[2:6]]
    assert {(r[0], r[1], r[3]) for r in rows} == {
        (op, "reference", dt) for op in ("rnn_cell", "rnn_sequence")
        for dt in ("float64", "float32")}
    assert all(r[4] == "3" and int(r[5]) > 0 and r[-1] == "pass" for r in rows)
    assert "4 of 4 combinations pass" in out


def test_check_fails_on_a_wrong_rnn_gradient(monkeypatch, capsys):
    right = gradcells.reference.rnn_sequence_grad

    def wrong(*args, **kwargs):
        grads = right(*args, **kwargs)
        return grads._replace(h0=grads.h0 + 1e-3)  # wrong whatever the case draws

    monkeypatch.setattr(_dispatch.backend_module("reference"), "rnn_sequence_grad", wrong)
    status = cli.main(["check", "--examples", "2", "--backends", "reference",
                       "--ops", "rnn_sequence", "--dtypes", "float64"])
    assert status == 1
    assert "FAIL (2 of 2)" in capsys.readouterr().out


def test_unknown_op_and_bad_examples(capsys):
    assert cli.main(["check", "--ops", "elman_cell"]) == 2
    assert "unknown op(s): elman_cell" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["check", "--examples", "0"], "argument --examples: must be a positive integer, got 0"),
    (["check", "--examples", "x"], "argument --examples: must be a positive integer, got 'x'"),
    (["check", "--seed", "-1"], "argument --seed: must be a non-negative integer, got -1"),
    (["check", "--backends", "nope"], "argument --backends: invalid choice: 'nope'"),
    (["check", "--jobs", "0"], "argument --jobs: must be a positive integer, got 0"),
    (["audit", "torch", "--seed", "-1"], "argument --seed: must be a non-negative integer"),
    (["audit", "torch", "--examples", "0"], "argument --examples: must be a positive integer"),
])
def test_bad_arguments_are_usage_errors_of_their_subcommand(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and f"usage: gradcells {argv[0]}" in err


def test_an_unavailable_backend_or_an_empty_selection_is_an_error_not_a_pass(monkeypatch,
                                                                              capsys):
    monkeypatch.setattr(cli, "_cuda_device_present", lambda: False)
    assert cli.main(["check", "--backends", "gpu"]) == 2
    assert "backend(s) not available here: gpu" in capsys.readouterr().err
    assert cli.main(["check", "--backends", "reference", "cpu", "gpu"]) == 2
    assert cli.main(["check", "--dtypes", "float16"]) == 2      # no CPU backend runs it
    assert "nothing to check" in capsys.readouterr().err


def test_seed_makes_runs_repeatable(capsys):
    argv = ["check", "--examples", "2", "--backends", "reference", "--ops", "lstm_cell",
            "--dtypes", "float64", "--seed", "5"]
    cli.main(argv)
    first = capsys.readouterr().out.splitlines()[2]
    cli.main(argv)
    assert capsys.readouterr().out.splitlines()[2] == first


def test_jobs_give_the_one_process_table_in_its_order(capsys):
    """``--jobs 2``: the rows checked in two processes are the one-process run's, row for
    row (each row draws from its own generator), in the same order."""
    argv = ["check", "--examples", "2", "--backends", "reference", "--ops", "rnn_cell",
            "gru_cell", "--seed", "3"]
    assert cli.main(argv) == 0
    alone = capsys.readouterr().out.splitlines()[:-1]       # the last line has the time
    assert cli.main([*argv, "--jobs", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[:-1] == alone


def test_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "gradcells", "check", "--examples", "1", "--ops", "gru_cell",
         "--dtypes", "float64"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gru_cell" in done.stdout and "pass" in done.stdout
    assert "[1/" in done.stderr  # progress indication


def test_import_is_light():
    """``import gradcells`` imports no CuPy, TensorFlow, PyTorch, JAX, and no Numba."""
    code = ("import sys, gradcells; "
            "print(sorted(m for m in ('cupy', 'tensorflow', 'torch', 'jax', 'numba') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_numpy_call_never_imports_cupy():
    code = ("import sys, numpy as np, gradcells as gc; "
            "gc.gru_cell(np.ones((1, 1)), np.ones((1, 1)), np.ones((2, 2)), np.ones((2, 1)), "
            "np.ones(2), np.ones(1)); print('cupy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"gradcells {gradcells.__version__}"


def test_module_entry_point_prints_the_version():
    done = subprocess.run([sys.executable, "-m", "gradcells", "--version"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"gradcells {gradcells.__version__}"


def test_ops_help_lists_every_op_and_its_gradient(capsys):
    from gradcells.cells import OPS

    with pytest.raises(SystemExit):
        cli.main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())       # argparse wraps the help
    for name, spec in OPS.items():
        assert name in text and spec.grad_name in text


def test_an_op_named_by_its_gradient_runs_the_same_check(capsys):
    argv = ["check", "--examples", "1", "--backends", "reference", "--dtypes", "float64",
            "--ops"]
    assert cli.main(argv + ["gru_cell_grad"]) == 0
    by_gradient = capsys.readouterr().out.splitlines()[2]
    assert cli.main(argv + ["gru_cell"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == by_gradient
    assert by_gradient.split()[0] == "gru_cell"


def test_the_check_ops_are_the_specified_ops_and_the_stacks_and_their_forward_modes():
    from gradcells import cli, testing
    from gradcells.cells import OPS, SCAN_OPS, STACKS

    first_order = list(OPS) + list(STACKS) + list(SCAN_OPS)
    assert list(testing.OPS) == first_order
    assert list(cli.CHECKED) == (first_order + [f"{op}_jvp" for op in first_order]
                                 + [f"{op}_grad_jvp" for op in first_order])
    assert all(cli.CHECKED[stack] == sequence for stack, sequence in STACKS.items())
    assert all(cli.CHECKED[f"{stack}_jvp"] == f"{sequence}_jvp"
               for stack, sequence in STACKS.items())


def test_check_runs_the_forward_mode_and_fails_a_wrong_tangent(monkeypatch, capsys):
    assert cli.main(["check", "--examples", "2", "--ops", "rnn_cell_jvp"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:4]
    assert [r.split()[:2] for r in rows] == [["rnn_cell_jvp", "reference"]] * 2
    right = gradcells.reference.rnn_cell_jvp

    def wrong(*args, **kwargs):
        state, d_state = right(*args, **kwargs)
        return state, d_state._replace(h=d_state.h + 1e-3)

    monkeypatch.setattr(_dispatch.backend_module("reference"), "rnn_cell_jvp", wrong)
    assert cli.main(["check", "--examples", "2", "--ops", "rnn_cell_jvp", "--dtypes",
                     "float64"]) == 1
    assert "FAIL (2 of 2)" in capsys.readouterr().out


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_rewrites_one_line_on_a_terminal_and_writes_lines_elsewhere():
    from gradcells._core.report import Progress

    log = _Stream(tty=False)
    bar = Progress(3, prefix="audit ", stream=log)
    for label in ("a", "a", "bb"):
        bar.step(label)
    bar.close()
    assert log.getvalue() == "audit [1/3] a\naudit [3/3] bb\n"

    terminal = _Stream(tty=True)
    bar = Progress(2, stream=terminal)
    bar.step("long label")
    bar.step("x")
    bar.close()
    first = "[1/2] long label"
    assert terminal.getvalue() == ("\r" + first + "\r" + "[2/2] x".ljust(len(first))
                                   + "\r" + " " * len(first) + "\r")

    quiet = _Stream(tty=True)
    Progress(1, stream=quiet, enabled=False).step("a")
    assert quiet.getvalue() == ""


def test_the_one_table():
    from gradcells._core.report import table

    assert table(("a", "bb"), [("xyz", "1"), ("", "22")]) == [
        "a    bb", "---  --", "xyz  1", "     22"]
    assert table(("name", "detail"), [("n", "a long free text")], free_last=True) == [
        "name  detail", "----  ------", "n     a long free text"]


def test_check_covers_the_linear_scan_and_catches_a_conjugated_gradient(monkeypatch, capsys):
    """``check --ops linear_scan linear_scan_grad_jvp`` passes on the reference and the CPU
    (complex cases split into real and imaginary parts), and fails a gradient that returns
    ``a_0∘g_0`` for ``d_h0`` instead of ``conj(a_0)∘g_0`` (the other complex convention)."""
    argv = ["check", "--examples", "4", "--backends", "reference", "cpu", "--dtypes",
            "float64", "--ops", "linear_scan", "linear_scan_grad_jvp"]
    assert cli.main(argv) == 0
    assert "4 of 4 combinations pass" in capsys.readouterr().out
    right = gradcells.reference.linear_scan_grad

    def conjugated(*args, **kwargs):
        grads = right(*args, **kwargs)
        return grads._replace(h0=grads.h0.conj())

    monkeypatch.setattr(_dispatch.backend_module("reference"), "linear_scan_grad", conjugated)
    assert cli.main(argv[:5] + ["reference"] + argv[6:9] + ["linear_scan"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_check_covers_the_selective_scan_and_catches_a_dropped_last_state(monkeypatch, capsys):
    """``check --ops selective_scan selective_scan_jvp selective_scan_grad_jvp`` passes on
    the reference and the CPU, and fails a gradient that ignores the last state's cotangent
    (what mamba_ssm's backward does)."""
    argv = ["check", "--examples", "3", "--backends", "reference", "cpu", "--dtypes",
            "float64", "--ops", "selective_scan", "selective_scan_jvp",
            "selective_scan_grad_jvp"]
    assert cli.main(argv) == 0
    assert "6 of 6 combinations pass" in capsys.readouterr().out
    right = gradcells.cells.implementation("selective", "cpu").selective_scan_grad

    def dropped(*args, **kwargs):
        return right(*args, **{**kwargs, "d_last_state": None})

    monkeypatch.setattr(_dispatch.backend_module("cpu"), "selective_scan_grad", dropped)
    assert cli.main(argv[:5] + ["cpu"] + argv[6:9] + ["selective_scan"]) == 1
    assert "FAIL" in capsys.readouterr().out
