"""What both character models share: the text (the repository's hand-written ``docs/*.md``,
read at run time), its vocabulary, the random training windows and the unigram entropy to
beat."""

from __future__ import annotations

from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parent.parent / "docs"
GENERATED = ("audit.md", "faults.md")
"""The pages that gradcells writes (``audit all --markdown``, ``audit.faults.markdown()``):
padded tables and repeated rows, a third of the text, whose share would grow with every
audited framework and move the corpus's statistics with it."""


def load_text(docs: Path = DOCS) -> str:
    """The repository's hand-written docs (not ``GENERATED``), concatenated in name order."""
    paths = sorted(p for p in docs.glob("*.md") if p.name not in GENERATED)
    if not paths:
        raise FileNotFoundError(f"no docs/*.md under {docs}")
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


class Vocabulary:
    """The characters of a text, each given an index (in code point order)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[c] for c in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def unigram_entropy(data: np.ndarray) -> float:
    """``-Σ p log p`` of the characters' frequencies: the loss of the best model that
    ignores context (a loss below it uses what came before)."""
    p = np.bincount(data) / len(data)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def random_windows(data: np.ndarray, seq_len: int, batch: int, rng):
    """``batch`` random windows of ``seq_len + 1`` characters: inputs and the next
    characters, both ``[seq_len, batch]`` (time first)."""
    starts = rng.integers(0, len(data) - seq_len - 1, batch)
    windows = data[starts[:, None] + np.arange(seq_len + 1)].T
    return windows[:-1], windows[1:]


def common_arguments(parser, *, steps=300, hidden=128, seq_len=64, batch=32, lr=3e-3):
    """The options both models take, on ``parser`` (an ``argparse.ArgumentParser``)."""
    parser.add_argument("--steps", type=int, default=steps, help="training steps")
    parser.add_argument("--hidden", type=int, default=hidden, help="LSTM width (and embedding)")
    parser.add_argument("--layers", type=int, default=1, help="LSTM layers")
    parser.add_argument("--seq-len", type=int, default=seq_len, help="window length (BPTT)")
    parser.add_argument("--batch", type=int, default=batch, help="windows per step")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and windows")
    parser.add_argument("--lr", type=float, default=lr, help="Adam's step size")
    parser.add_argument("--clip", type=float, default=1.0, help="global gradient norm cap")
    parser.add_argument("--print-every", type=int, default=25, help="print the loss every N")
    parser.add_argument("--sample", type=int, default=200, help="characters to generate")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--docs", type=Path, default=DOCS,
                        help="a folder of Markdown files to train on (default: docs/)")
    return parser


def describe(vocab: Vocabulary, data: np.ndarray) -> str:
    return (f"{len(data)} characters, vocabulary {len(vocab)}: ln V = {np.log(len(vocab)):.2f}, "
            f"unigram entropy {unigram_entropy(data):.2f} nats")
