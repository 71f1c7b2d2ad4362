"""What the reference cells share, for any array namespace: the overflow-free sigmoid, gate
blocks, and the per-row bookkeeping of sequences with lengths."""

from __future__ import annotations

from .._core.arrays import namespace_of


def sigmoid(xp, z):
    """σ(z) = 0.5·tanh(0.5·z) + 0.5: equal to 1/(1+e^-z), with no overflow for any finite z."""
    return 0.5 * xp.tanh(0.5 * z) + 0.5


def blocks(a, n: int):
    """Split the last axis of ``a`` into ``n`` equal column blocks (views)."""
    width = a.shape[-1] // n
    return tuple(a[..., k * width : (k + 1) * width] for k in range(n))


def valid_rows(seq_len, t):
    """``[B, 1]`` mask of the rows still running at step t, or None when all rows run."""
    return None if seq_len is None else (t < seq_len)[:, None]


def keep(valid, new, old):
    """``new`` in the running rows, ``old`` in the frozen ones."""
    return new if valid is None else namespace_of(new).where(valid, new, old)
