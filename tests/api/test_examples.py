"""The examples train: each character model, at a tiny size for a few seconds, brings its
loss well down from ~ln(vocab) and below the text's unigram entropy (so it uses context);
the NumPy model's hand-written gradient (the dense softmax layer, the embedding's scatter,
the stack's gradient wired in) matches finite differences in float64, array by array."""

import functools
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

import _corpus  # noqa: E402
import char_lm_numpy  # noqa: E402

# A fixed text (docs/design.md as it stood when the thresholds were set): trained on the live
# docs, a docs edit would move the losses.
CORPUS = Path(__file__).resolve().parents[1] / "data" / "char_lm"
TINY = ["--hidden", "32", "--seq-len", "16", "--batch", "16", "--steps", "60",
        "--print-every", "20", "--docs", str(CORPUS)]


@functools.cache
def _unigram_entropy():
    text = _corpus.load_text(CORPUS)
    return _corpus.unigram_entropy(_corpus.Vocabulary(text).encode(text))


def _assert_trained(losses, steps):
    """The loss fell by over a nat and ends half a nat below the unigram entropy (3.25
    nats on ``CORPUS``; ln V = 4.49). Calibrated by breaking the gradient of the NumPy model:
    with the LSTM's weight gradients negated the loss ends near 4.84, with them zeroed (a
    random LSTM, the embedding and the output layer trained) near 2.89, above the bound of
    2.75; trained, near 2.53."""
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    first, last = np.mean(losses[:5]), np.mean(losses[-10:])
    assert last < first - 1.0, (first, last)
    assert last < _unigram_entropy() - 0.5, (last, _unigram_entropy())


def test_the_numpy_model_learns_and_samples(capsys):
    losses = char_lm_numpy.main([*TINY, "--lr", "2e-2", "--sample", "40"])
    _assert_trained(losses, 60)
    out = capsys.readouterr().out
    assert "step    60  loss" in out
    assert len(out.split("---\n", 1)[1]) >= 40


def test_the_numpy_model_is_deterministic_in_its_seed():
    run = ["--hidden", "8", "--seq-len", "8", "--batch", "4", "--steps", "5", "--sample", "0"]
    first = char_lm_numpy.main([*run, "--seed", "3"])
    assert char_lm_numpy.main([*run, "--seed", "3"]) == first
    assert char_lm_numpy.main([*run, "--seed", "4"]) != first


@pytest.mark.parametrize("layers", [1, 2])
def test_the_numpy_gradient_matches_finite_differences(layers):
    """Along a random direction in each parameter array alone, the central difference of
    the loss equals the gradient's inner product with it (float64)."""
    m = char_lm_numpy
    text = _corpus.load_text(CORPUS)
    vocab = _corpus.Vocabulary(text)
    rng = np.random.default_rng(7)
    params = m.init_params(len(vocab), 5, layers, rng, np.float64)
    inputs, targets = _corpus.random_windows(vocab.encode(text), 6, 3, rng)
    _, grads = m.loss_and_grads(params, inputs, targets)
    arrays = m.flatten(params)
    assert [g.shape for g in grads] == [a.shape for a in arrays]
    eps = 1e-6
    for k, (a, g) in enumerate(zip(arrays, grads, strict=True)):
        u = rng.standard_normal(a.shape)
        a += eps * u
        plus = m.loss_and_grads(params, inputs, targets)[0]
        a -= 2 * eps * u
        minus = m.loss_and_grads(params, inputs, targets)[0]
        a += eps * u
        numeric, analytic = (plus - minus) / (2 * eps), float(np.vdot(g, u))
        assert numeric == pytest.approx(analytic, rel=1e-6, abs=1e-9), (k, a.shape)


def test_adam_takes_its_first_step_of_size_lr_against_the_gradient():
    p = np.array([1.0, -2.0, 3.0])
    m = char_lm_numpy.Adam([p], lr=0.1)
    m.step([np.array([0.5, -4.0, 0.0])])
    np.testing.assert_allclose(p, [0.9, -1.9, 3.0], atol=1e-6)


def test_clipping_scales_the_global_norm_down_to_its_cap_only():
    grads = [np.array([3.0, 0.0]), np.array([4.0])]
    char_lm_numpy.clip_by_global_norm(grads, 1.0)
    np.testing.assert_allclose(np.concatenate(grads), [0.6, 0.0, 0.8])
    char_lm_numpy.clip_by_global_norm(grads, 2.0)
    np.testing.assert_allclose(np.concatenate(grads), [0.6, 0.0, 0.8])


@pytest.fixture
def char_lm_torch():
    torch = pytest.importorskip("torch")
    import char_lm_torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # tiny tensors: threads only contend on a shared machine
    yield char_lm_torch
    torch.set_num_threads(threads)


def test_the_torch_model_learns_and_samples(char_lm_torch, capsys):
    losses = char_lm_torch.main([*TINY, "--lr", "2e-2", "--sample", "40"])
    _assert_trained(losses, 60)
    out = capsys.readouterr().out
    assert "step    60  loss" in out
    assert len(out.split("---\n", 1)[1]) >= 40


def test_the_torch_model_runs_gradcells_lstm_with_its_options(char_lm_torch):
    import torch

    import gradcells.torch as gct

    model = char_lm_torch.CharLM(10, 6, 2)
    assert isinstance(model.lstm, gct.LSTM)
    assert model.lstm.peepholes and model.lstm.layer_norm
    names = {n for n, _ in model.named_parameters()}
    assert {"lstm.weight_ci_l1", "lstm.ln_gamma_c_l1"} <= names
    logits, (h, c) = model(torch.zeros(7, 3, dtype=torch.long))
    assert logits.shape == (7, 3, 10) and h.shape == c.shape == (2, 3, 6)
    assert logits.dtype == torch.float32


def test_the_torch_model_is_deterministic_in_its_seed(char_lm_torch):
    run = ["--hidden", "8", "--seq-len", "8", "--batch", "4", "--steps", "4", "--sample", "0"]
    first = char_lm_torch.main([*run, "--seed", "3"])
    assert char_lm_torch.main([*run, "--seed", "3"]) == first
    assert char_lm_torch.main([*run, "--seed", "4"]) != first
