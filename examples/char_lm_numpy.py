"""A character-level language model in pure NumPy: gradcells' LSTM stack and its explicit
gradient, everything else written out here.

What it shows: ``gc.lstm_stack`` runs the recurrent part forward, ``gc.lstm_stack_grad``
backpropagates through it given the upstream gradient of its outputs; the embedding, the
dense softmax output layer (its gradient derived by hand below), gradient clipping and Adam
are a few lines of NumPy each. The text is the repository's own ``docs/*.md``, read at run
time; each step trains on ``--batch`` random windows of ``--seq-len`` characters (truncated
backpropagation through time, zero initial states). The loss starts near ``ln(vocab)`` and
falls; a short sample of generated text ends the run.

Run it from the repository root::

    PYTHONPATH=. python examples/char_lm_numpy.py                 # 300 steps, hidden 128
    PYTHONPATH=. python examples/char_lm_numpy.py --steps 2000 --layers 2 --sample 400
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from _corpus import (
    Vocabulary,
    common_arguments,
    describe,
    load_text,
    random_windows,
)

import gradcells as gc


def parse_args(argv=None) -> argparse.Namespace:
    parser = common_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return parser.parse_args(argv)


def init_params(vocab: int, hidden: int, layers: int, rng, dtype) -> dict:
    """PyTorch's initialisation: every weight uniform in ±1/√hidden, the embedding N(0, 1).

    ``params``: ``embed [V, H]``, ``lstm`` (one ``gc.LSTMWeights(w [H+H, 4H], b [4H])`` per
    layer), ``w_out [H, V]``, ``b_out [V]``.
    """
    bound = 1.0 / math.sqrt(hidden)

    def uniform(*shape):
        return rng.uniform(-bound, bound, shape).astype(dtype)

    return {"embed": rng.standard_normal((vocab, hidden)).astype(dtype),
            "lstm": [gc.LSTMWeights(uniform(2 * hidden, 4 * hidden), uniform(4 * hidden))
                     for _ in range(layers)],
            "w_out": uniform(hidden, vocab), "b_out": uniform(vocab)}


def flatten(params: dict) -> list[np.ndarray]:
    """The parameter arrays in one fixed order (the optimiser's view)."""
    return ([params["embed"]] + [a for w in params["lstm"] for a in w if a is not None]
            + [params["w_out"], params["b_out"]])


def softmax_cross_entropy(logits: np.ndarray, targets: np.ndarray):
    """Mean cross-entropy of ``logits [N, V]`` against integer ``targets [N]`` and its
    gradient: with ``p = softmax(z)``, ``L = -mean_n log p[n, y_n]`` and
    ``dL/dz = (p - onehot(y)) / N``."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    n = len(targets)
    loss = -log_p[np.arange(n), targets].mean()
    d_logits = np.exp(log_p)
    d_logits[np.arange(n), targets] -= 1.0
    return float(loss), d_logits / n


def loss_and_grads(params: dict, inputs: np.ndarray, targets: np.ndarray):
    """The loss of predicting ``targets [T, B]`` from ``inputs [T, B]`` and its gradient,
    as a list in ``flatten``'s order.

    Forward: ``x = embed[inputs]``, ``h = lstm_stack(x)``, ``z = h·w_out + b_out``. Backward
    (by hand): ``dw_out = hᵀ·dz``, ``db_out = Σ dz``, ``dh = dz·w_outᵀ``; the stack's
    gradient takes ``dh``; the embedding's rows gather ``dx`` (``np.add.at``: a character
    seen twice sums its two gradients).
    """
    steps, batch = inputs.shape
    lstm = params["lstm"]
    x = params["embed"][inputs]                                        # [T, B, H]
    zeros = np.zeros((len(lstm), batch, x.shape[-1]), x.dtype)
    stack = gc.lstm_stack(x, zeros, zeros, lstm)
    h = stack.h.reshape(steps * batch, -1)                              # [T·B, H]
    loss, dz = softmax_cross_entropy(h @ params["w_out"] + params["b_out"], targets.ravel())
    dz = dz.astype(h.dtype)
    d_h = (dz @ params["w_out"].T).reshape(stack.h.shape)
    g = gc.lstm_stack_grad(x, zeros, zeros, lstm, stack, d_h=d_h)
    d_embed = np.zeros_like(params["embed"])
    np.add.at(d_embed, inputs.ravel(), g.x.reshape(steps * batch, -1))
    grads = ([d_embed] + [a for w in g.weights for a in w if a is not None]
             + [h.T @ dz, dz.sum(axis=0)])
    return loss, grads


def clip_by_global_norm(grads: list[np.ndarray], max_norm: float) -> None:
    """Scale every gradient in place by ``min(1, max_norm / ‖all of them‖₂)``."""
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads))
    if norm > max_norm:
        for g in grads:
            g *= max_norm / norm


class Adam:
    """Adam (Kingma & Ba), updating the arrays in place: ``m ← β₁m + (1-β₁)g``,
    ``v ← β₂v + (1-β₂)g²``, ``θ ← θ - lr·m̂/(√v̂ + ε)`` with the bias corrections
    ``m̂ = m/(1-β₁ᵗ)``, ``v̂ = v/(1-β₂ᵗ)``."""

    def __init__(self, params: list[np.ndarray], lr: float, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, grads: list[np.ndarray]) -> None:
        (b1, b2), self.t = self.betas, self.t + 1
        scale = self.lr * math.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p -= (scale * m / (np.sqrt(v) + self.eps)).astype(p.dtype)


def sample(params: dict, vocab: Vocabulary, prompt: str, length: int, rng,
           temperature: float = 0.8) -> str:
    """``length`` characters after ``prompt``, one stack step at a time, the states carried
    over (``cs_final``, ``h_final`` become the next step's ``cs0``, ``h0``)."""
    lstm, embed = params["lstm"], params["embed"]
    cs = h = np.zeros((len(lstm), 1, embed.shape[1]), embed.dtype)
    feed, out = list(vocab.encode(prompt)), []
    while len(out) < length:
        stack = gc.lstm_stack(embed[feed][:, None], cs, h, lstm)       # [T, 1, H]
        cs, h = stack.cs_final, stack.h_final
        z = (stack.h[-1, 0] @ params["w_out"] + params["b_out"]) / temperature
        p = np.exp(z - z.max())
        feed = [int(rng.choice(len(p), p=p / p.sum()))]
        out += feed
    return prompt + vocab.decode(out)


def main(argv=None) -> list[float]:
    """Train as ``argv`` says (``None``: the command line); returns the loss of every step."""
    args = parse_args(argv)
    text = load_text(args.docs)
    vocab = Vocabulary(text)
    data = vocab.encode(text)
    rng = np.random.default_rng(args.seed)
    params = init_params(len(vocab), args.hidden, args.layers, rng, np.dtype(args.dtype))
    optimiser = Adam(flatten(params), args.lr)
    print(describe(vocab, data))
    losses = []
    for step in range(1, args.steps + 1):
        loss, grads = loss_and_grads(params, *random_windows(data, args.seq_len, args.batch,
                                                             rng))
        clip_by_global_norm(grads, args.clip)
        optimiser.step(grads)
        losses.append(loss)
        if step % args.print_every == 0 or step == 1:
            print(f"step {step:5d}  loss {loss:.3f}")
    if args.sample > 0:
        print("---\n" + sample(params, vocab, "The ", args.sample, rng))
    return losses


if __name__ == "__main__":
    main()
