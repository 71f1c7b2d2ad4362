"""The benchmark scripts run and print their tables (tiny sizes, one round: what is checked
is that they work, never how fast anything is), and the harness interleaves fairly."""

import importlib.util
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import _harness  # noqa: E402


def test_rounds_rotate_the_order_of_the_contestants():
    calls = []
    contestants = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = _harness.time_interleaved(contestants, repeats=3, warmup=0, settle=0)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: len(ts) for name, ts in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_the_settling_call_of_each_round_is_not_timed():
    calls = []

    def slow_after_a_switch():
        switched = not calls or calls[-1] != "slow"
        calls.append("slow")
        if switched:
            time.sleep(0.05)

    contestants = {"slow": slow_after_a_switch, "other": lambda: calls.append("other")}
    times = _harness.time_interleaved(contestants, repeats=2, warmup=0)
    assert calls == ["slow", "slow", "other", "other", "other", "other", "slow", "slow"]
    assert max(times["slow"]) < 0.025


def _table_rows(text):
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_cells_benchmark_prints_a_row_per_size(capsys):
    import cells

    cells.main(["--sizes", "2,3,5", "1,2,4", "--repeats", "1", "--min-round", "0",
                "--skip", "torch,tf", "--peak-size", "32"])
    out = capsys.readouterr().out
    assert "Peak: " in out and "cpu GFLOP/s (of peak)" in out
    for title in ("LSTM", "GRU (reset before", "GRU reset_after=True"):
        assert title in out
    rows = _table_rows(out)
    assert sum(row.startswith("| (2, 3, 5)") for row in rows) == 3
    assert sum(row.startswith("| (1, 2, 4)") for row in rows) == 3


def test_sequences_benchmark_prints_every_contestant(capsys):
    import sequences

    sequences.main(["--sizes", "3,2,3,5", "--repeats", "1", "--skip", "torch,tf",
                    "--peak-size", "32"])
    out = capsys.readouterr().out
    names = [row.split("|")[1].strip() for row in _table_rows(out)]
    assert {"gradcells cpu", "gradcells reference", "BLAS bound",
            "gradcells cpu reset-after", "BLAS bound reset-before"} <= set(names)
    assert "TBH" in out                   # peak memory is reported
    assert _harness.cpu_model() in out and _harness.vector_isa() in out
    assert "Peak: " in out and "GFLOP/s (of peak)" in out


def test_a_flop_rate_reads_as_gflops_and_a_fraction_of_the_peak():
    assert _harness.flop_rate(3e9, 1.5, 4e9) == "2.0 (50%)"
    assert _harness.flop_rate(1.2e11, 1.0, 1e11) == "120.0 (120%)"


def test_the_peak_is_the_rate_of_a_matmul_of_the_size_asked_for(monkeypatch):
    import numpy as np

    shapes = []
    real = np.matmul

    def spy(a, b, out=None):
        shapes.append(a.shape + b.shape[1:])
        return real(a, b, out=out)

    monkeypatch.setattr(_harness.np, "matmul", spy)
    peak = _harness.matmul_peak(16, repeats=3)
    assert shapes == [(16, 16, 16)] * 4           # one warm-up, then the timed calls
    assert 0 < peak < float("inf")


def test_sequences_benchmark_runs_the_plain_rnn(capsys):
    import sequences

    sequences.main(["--sizes", "3,2,3,5", "--cells", "rnn", "--repeats", "1", "--skip",
                    "torch,tf", "--peak-size", "32"])
    out = capsys.readouterr().out
    assert "RNN (T, B, I, H) = (3, 2, 3, 5)" in out
    names = [row.split("|")[1].strip() for row in _table_rows(out)]
    assert {"gradcells cpu", "gradcells reference", "BLAS bound"} <= set(names)
    assert sequences.peer_names("rnn", "gradcells cpu") == ("torch nn.RNN", "BLAS bound")


def test_sequences_benchmark_runs_the_projected_lstm(capsys):
    import sequences

    sequences.main(["--sizes", "3,2,3,6", "--cells", "lstm-proj", "--repeats", "1", "--skip",
                    "torch,tf", "--peak-size", "32"])
    out = capsys.readouterr().out
    assert "LSTM-PROJ (T, B, I, H) = (3, 2, 3, 6)" in out
    for name in ("gradcells cpu", "gradcells reference", "BLAS bound"):
        assert name in out
    assert sequences.peer_names("lstm-proj", "gradcells cpu") == ("torch nn.LSTM", "BLAS bound")
    dw, dw_proj = sequences.blas_bound_lstm_proj((3, 2, 3, 6))()
    assert dw.shape == (3 + 3, 24) and dw_proj.shape == (6, 3)


def test_sequences_benchmark_runs_the_layer_normalised_lstm(capsys):
    import sequences

    sequences.main(["--sizes", "3,2,3,5", "--cells", "lstm-ln", "--repeats", "1", "--skip",
                    "torch,tf", "--peak-size", "32"])
    out = capsys.readouterr().out
    assert "LSTM-LN (T, B, I, H) = (3, 2, 3, 5)" in out
    names = [row.split("|")[1].strip() for row in _table_rows(out)]
    assert {"gradcells cpu", "gradcells reference", "BLAS bound"} <= set(names)
    assert sequences.peer_names("lstm-ln", "gradcells cpu") == ("torch LN-LSTM", "BLAS bound")
    assert sequences.blas_bound_lstm_ln((3, 2, 3, 5))().shape == (3 + 5, 20)


def test_the_torch_ln_lstm_peer_computes_the_same_model():
    """The PyTorch LN-LSTM contestant's dx equals gradcells's (``main`` would pin this
    process's threads), to float32 round-off of the result's size."""
    pytest.importorskip("torch")
    import numpy as np
    import sequences

    import gradcells as gc

    size = (4, 3, 5, 6)
    a = sequences.lstm_ln_inputs(*size)
    norm = gc.LSTMNorm(*(a[name] for name in sequences.LN_ARRAYS))
    args = (a["x"], a["cs0"], a["h0"], a["w"], a["b"])
    seq = gc.lstm_sequence(*args, layer_norm=norm)
    want = gc.lstm_sequence_grad(*args, seq, d_h=a["d_h"], layer_norm=norm).x
    got = sequences.torch_ln_lstm(size)().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_gemm_benchmark_prints_every_layout(capsys):
    import gemm

    gemm.main(["--sizes", "3,2,4", "--repeats", "1", "--skip", "torch", "--peak-size", "32"])
    out = capsys.readouterr().out
    names = [row.split("|")[2].strip() for row in _table_rows(out)]
    assert names[1:] == ["numpy [B, H]", "numpy [H, B]"]        # after the header
    assert "Peak: " in out


def test_the_gemm_benchmarks_layouts_compute_the_same_products():
    import gemm
    import numpy as np

    gates, d_h = gemm.numpy_rows((3, 2, 4))()
    gates_t, d_h_t = gemm.numpy_columns((3, 2, 4))()
    np.testing.assert_allclose(gates_t.T, gates, rtol=1e-6)
    np.testing.assert_allclose(d_h_t.T, d_h, rtol=1e-6)
    if importlib.util.find_spec("torch") is not None:
        torch_gates, torch_d_h = gemm.torch_rows((3, 2, 4))()
        np.testing.assert_allclose(torch_gates.numpy(), gates, rtol=1e-5)
        np.testing.assert_allclose(torch_d_h.numpy(), d_h, rtol=1e-5)


def test_sequences_benchmarks_torch_rnn_peer_runs_forward_and_backward():
    """The ``torch nn.RNN`` contestant alone (``main`` would pin this process's threads)."""
    pytest.importorskip("torch")
    import sequences

    dx = sequences.torch_rnn("RNN", (3, 2, 3, 5))()
    assert tuple(dx.shape) == (3, 2, 3)


@pytest.mark.slow
def test_startup_benchmark_times_new_processes(capsys):
    import startup

    startup.main(["--repeats", "1", "--skip", "torch"])
    names = [row.split("|")[1].strip() for row in _table_rows(capsys.readouterr().out)]
    assert names[1:] == ["gradcells", "plain numba", "reference",    # after the header
                         "gradcells sequence + grad"]


def test_under_load_benchmark_times_quiet_and_loaded(capsys):
    import under_load

    under_load.main(["--sizes", "3,2,3,4", "--repeats", "1", "--min-round", "0.01",
                     "--load-s", "20"])
    rows = [row.split("|")[1:-1] for row in _table_rows(capsys.readouterr().out)][1:]
    assert [r[2].strip() for r in rows][:2] == ["gradcells", "gradcells fixed"]
    for row in rows:                 # quiet ms, loaded ms, their ratio: all measured
        assert min(float(row[3]), float(row[4]), float(row[5].strip().rstrip("×"))) > 0


def test_scratch_benchmark_compares_kept_and_fresh_scratch(capsys):
    import scratch

    scratch.main(["--sizes", "2,2,3,4", "--cells", "gru-reset-after", "--repeats", "1",
                  "--calls", "1"])
    rows = _table_rows(capsys.readouterr().out)
    assert len(rows) == 2 and rows[1].startswith("| gru-reset-after | (2, 2, 3, 4)")


def test_linear_benchmark_compares_the_methods_with_mingru_pytorch(capsys):
    pytest.importorskip("minGRU_pytorch")
    import linear

    linear.main(["--size", "8,2,4,4", "--repeats", "1"])
    rows = [row.split("|")[1].strip() for row in _table_rows(capsys.readouterr().out)]
    assert rows[1:] == ["gradcells sequential", "gradcells parallel", "gradcells auto",
                        "minGRU-pytorch parallel"]


def test_slstm_benchmark_compares_with_xlstm(capsys):
    pytest.importorskip("xlstm")
    import slstm

    slstm.main(["--size", "3,2,4,4,2", "--repeats", "1"])
    rows = [row.split("|")[1].strip() for row in _table_rows(capsys.readouterr().out)]
    assert rows[1:] == ["gradcells cpu", "xlstm vanilla"]


def test_linear_scan_benchmark_compares_the_methods_with_a_copy(capsys):
    import linear_scan

    linear_scan.main(["--size", "8,2,4", "--repeats", "1"])
    rows = [row.split("|")[1].strip() for row in _table_rows(capsys.readouterr().out)]
    assert rows[1:] == ["gradcells sequential", "gradcells parallel", "copy"]


def test_linear_scan_sweep_gives_each_size_and_what_auto_runs(capsys, monkeypatch):
    import linear_scan

    monkeypatch.setattr(linear_scan, "SWEEP", [(130, 1, 2), (8, 2, 4)])
    linear_scan.main(["--sweep", "--repeats", "1"])
    rows = [[cell.strip() for cell in row.split("|")[1:-1]]
            for row in _table_rows(capsys.readouterr().out)]
    assert [row[0] for row in rows[1:]] == ["(130, 1, 2)", "(8, 2, 4)"]
    assert all(row[4] in ("sequential", "parallel") for row in rows[1:])


def test_rglru_benchmark_compares_with_recurrentgemma(capsys):
    pytest.importorskip("recurrentgemma.torch.layers")
    import rglru

    rglru.main(["--size", "4,2,4,2", "--repeats", "1"])
    rows = [row.split("|")[1].strip() for row in _table_rows(capsys.readouterr().out)]
    assert rows[1:] == ["gradcells cpu", "recurrentgemma torch"]


def test_selective_benchmark_compares_with_selective_scan_ref(capsys):
    from gradcells.audit import mamba

    try:
        mamba._reference()
    except ImportError as error:
        pytest.skip(f"mamba-ssm's selective_scan_ref is not available: {error}")
    import selective

    selective.main(["--size", "1,2,2,3", "--repeats", "1"])
    rows = [row.split("|")[1].strip() for row in _table_rows(capsys.readouterr().out)]
    assert rows[1:] == ["gradcells cpu", "selective_scan_ref"]
