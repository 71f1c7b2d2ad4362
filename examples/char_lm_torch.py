"""A character-level language model in PyTorch, its LSTM gradcells's: ``gradcells.torch.LSTM``
with peepholes and layer normalisation, a drop-in for ``torch.nn.LSTM``, inside an ordinary
training loop.

What it shows: the module takes ``nn.LSTM``'s constructor and forward; gradcells's options
are keyword-only (``peepholes=True, layer_norm=True``); ``loss.backward()`` runs gradcells's
hand-derived gradients through autograd, so ``nn.Embedding``, ``nn.Linear``,
``clip_grad_norm_`` and ``torch.optim.Adam`` work as with any module. The task is
``char_lm_numpy.py``'s: the repository's ``docs/*.md``, random windows of ``--seq-len``
characters, zero initial states; the loss starts near ``ln(vocab)`` and falls, and a short
sample of generated text ends the run.

Run it from the repository root (needs PyTorch)::

    PYTHONPATH=. python examples/char_lm_torch.py                 # 300 steps, hidden 128
    PYTHONPATH=. python examples/char_lm_torch.py --steps 2000 --layers 2 --sample 400
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _corpus import Vocabulary, common_arguments, describe, load_text, random_windows
from torch import nn

import gradcells.torch as gct


def parse_args(argv=None) -> argparse.Namespace:
    parser = common_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return parser.parse_args(argv)


class CharLM(nn.Module):
    """Embedding, a gradcells LSTM stack (peepholes, layer norm), a dense output layer."""

    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = gct.LSTM(hidden, hidden, layers, peepholes=True, layer_norm=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, state=None):
        """Logits ``[T, B, V]`` for the characters ``ids [T, B]`` and the final ``(h, c)``."""
        h, state = self.lstm(self.embed(ids), state)
        return self.out(h), state


@torch.no_grad()
def sample(model: CharLM, vocab: Vocabulary, prompt: str, length: int, generator,
           temperature: float = 0.8) -> str:
    """``length`` characters after ``prompt``, one step at a time, the state carried over."""
    model.eval()
    feed, state, out = torch.as_tensor(vocab.encode(prompt))[:, None], None, []
    while len(out) < length:
        logits, state = model(feed, state)
        p = torch.softmax(logits[-1, 0].double() / temperature, dim=0)
        out.append(int(torch.multinomial(p, 1, generator=generator)))
        feed = torch.tensor([[out[-1]]])
    model.train()
    return prompt + vocab.decode(out)


def main(argv=None) -> list[float]:
    """Train as ``argv`` says (``None``: the command line); returns the loss of every step."""
    args = parse_args(argv)
    text = load_text(args.docs)
    vocab = Vocabulary(text)
    data = vocab.encode(text)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = CharLM(len(vocab), args.hidden, args.layers).to(getattr(torch, args.dtype))
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    print(describe(vocab, data))
    losses = []
    for step in range(1, args.steps + 1):
        inputs, targets = (torch.as_tensor(a) for a in
                           random_windows(data, args.seq_len, args.batch, rng))
        logits, _ = model(inputs)
        loss = nn.functional.cross_entropy(logits.reshape(-1, len(vocab)), targets.reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimiser.step()
        losses.append(loss.item())
        if step % args.print_every == 0 or step == 1:
            print(f"step {step:5d}  loss {losses[-1]:.3f}")
    if args.sample > 0:
        generator = torch.Generator().manual_seed(args.seed)
        print("---\n" + sample(model, vocab, "The ", args.sample, generator))
    return losses


if __name__ == "__main__":
    main()
