"""Sequence plumbing every backend shares, for any array namespace ``xp``.

Per-example lengths ``seq_len [B]`` follow PyTorch's packed sequences: for ``t >= seq_len[b]``
row b's per-step outputs are zero and its state is frozen. The public layer passes
``seq_len=None`` when every row runs all T steps.
"""

from __future__ import annotations


def flat(a):
    """``[T, B, n] -> [T·B, n]`` (a view when ``a`` is contiguous)."""
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2])


def running_mask(xp, n_steps, seq_len):
    """``[T, B]`` booleans: whether row b still runs at step t."""
    return xp.arange(n_steps)[:, None] < seq_len[None, :]


def running_inputs(xp, x, seq_len):
    """``x [T, B, I]`` with every step past its row's length zeroed (``x`` itself when
    ``seq_len`` is None).

    Those steps' outputs are discarded and their gate gradients are zero, so their inputs
    never matter, except that padding which is NaN or inf would still reach the input
    projection (with a warning) and ``dW_x = x_flatᵀ·dG`` (0·NaN is NaN). Every sequence
    operation starts from this, so the padding is never read.
    """
    if seq_len is None:
        return x
    running = running_mask(xp, x.shape[0], seq_len)
    return xp.where(running[:, :, None], x, xp.zeros((), dtype=x.dtype))


def previous_states(xp, first, steps):
    """The state each step starts from: ``[first, steps[0], ..., steps[T-2]]`` ``[T, B, H]``.

    In a row that has stopped, ``steps[t-1]`` is zero rather than the frozen state, but the
    gradients of such a step are zero, so the value never matters.
    """
    return xp.concatenate([first[None], steps], axis=0)[:-1]


def input_projection(x, w_x, b):
    """``x·W_x + b`` for all T steps at once, one matmul, as ``[T, B, width]``."""
    n_steps, n_batch, _ = x.shape
    return (flat(x) @ w_x + b).reshape(n_steps, n_batch, w_x.shape[1])


# The masks of a sequence (docs/spec.md §11.3), in run order: None, or arrays that
# broadcast to their shapes (a time axis of T or 1, or none).


def at_step(mask, t):
    """Step ``t``'s slice of a mask that broadcasts to ``[T, B, ·]`` (None stays None)."""
    if mask is None or mask.ndim < 3:
        return mask
    return mask[t if mask.shape[0] > 1 else 0]


def masked(a, mask):
    """``a∘mask``, or ``a`` without a mask."""
    return a if mask is None else a * mask


def zoned(z, old, new):
    """Zoneout (Krueger et al. 2016): ``z∘old + (1-z)∘new`` (``new`` without a mask)."""
    return new if z is None else z * old + (1 - z) * new


def zoneout_grad(z, grad):
    """The two parts of the gradient ``grad`` of a zoned state: ``((1-z)∘grad, z∘grad)``,
    the new state's and the old one's (``(grad, None)`` without a mask)."""
    return (grad, None) if z is None else ((1 - z) * grad, z * grad)
