"""Activations shared by the reference cells, for any array namespace."""

from __future__ import annotations


def sigmoid(xp, z):
    """σ(z) = 0.5·tanh(0.5·z) + 0.5: equal to 1/(1+e^-z), with no overflow for any finite z."""
    return 0.5 * xp.tanh(0.5 * z) + 0.5


def blocks(a, n: int):
    """Split the last axis of ``a`` into ``n`` equal column blocks (views)."""
    width = a.shape[-1] // n
    return tuple(a[..., k * width : (k + 1) * width] for k in range(n))
