"""``benchmarks/directions.py`` and ``benchmarks/second_order.py`` run and print their
tables (tiny sizes, one round: what is checked is that it works, never how fast anything
is)."""

import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def _rows(text):
    return [line for line in text.splitlines() if line.startswith("| ")][1:]


def test_the_direction_benchmark_prints_a_row_per_cell_size_and_lengths(capsys):
    import directions

    directions.main(["--sizes", "4,3,2,5", "--repeats", "1", "--cells", "lstm,gru,rnn"])
    rows = _rows(capsys.readouterr().out)
    assert [row.split("|")[1].strip() for row in rows] == ["lstm", "lstm", "gru", "gru",
                                                           "rnn", "rnn"]
    assert all(row.count("×") == 2 for row in rows)


def test_the_stack_contestants_agree_with_each_other():
    """The gradcells stack and the PyTorch peer compute the same network: the input
    gradients they return for one upstream gradient (ones) are equal."""
    torch = pytest.importorskip("torch")
    import directions
    import numpy as np

    size = (6, 3, 4, 5)
    peer, module = directions.torch_stack(size)
    ours = directions.gradcells_stack(size, module, "cpu")
    peer()                       # the peer's own upstream gradient is random: use ones
    x = torch.tensor(directions.lstm_inputs(*size)["x"], requires_grad=True)
    lengths = torch.tensor(directions._stack_lengths(size))
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(module(packed)[0], total_length=size[0])
    out.backward(torch.ones_like(out))
    np.testing.assert_allclose(ours().x, x.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_stack_benchmark_prints_time_and_memory(capsys):
    pytest.importorskip("torch")
    import directions

    directions.main(["--stack", "--sizes", "4,3,2,5", "--repeats", "1"])
    rows = _rows(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0].startswith("| (4, 3, 2, 5)")
    assert "MiB" in rows[0] and "T·B·4H" in rows[0]


def test_the_masks_benchmark_prints_a_row_per_cell(capsys):
    import directions

    directions.main(["--masks", "--sizes", "4,3,2,5", "--repeats", "1"])
    rows = _rows(capsys.readouterr().out)
    assert [row.split("|")[1].strip() for row in rows] == ["lstm", "gru", "rnn"]


def test_the_second_order_benchmark_prints_a_row_per_size(capsys):
    import second_order

    second_order.main(["--sizes", "4,3,2,5", "--repeats", "1"])
    rows = _rows(capsys.readouterr().out)
    assert [row.split("|")[1].strip() for row in rows] == ["(4, 3, 2, 5)"]
    assert rows[0].count("×") == (3 if importlib.util.find_spec("torch") else 2)
