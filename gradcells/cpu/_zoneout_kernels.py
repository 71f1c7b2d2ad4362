"""Zoneout's elementwise passes (docs/spec.md §11.3), one per step each way, for every cell's
sequence (``_sequence.zone``, ``_sequence.zoneout_split``).

Each takes the step's mask ``z`` as a C-contiguous ``[B, N]`` array
(``_sequence.sequence_masks`` lays it out so) and forms ``1 - z`` itself, with
``gradcells._core.plan``'s ``zoned`` and ``zoneout_grad`` expressions and their roundings
(no fastmath, so no contraction): the masks' memory is read once per step, not twice.
"""

from __future__ import annotations

from ._activations import typed
from ._compile import kernel


@kernel
def zoneout_kernel(z, old, new):
    """``new ← z∘old + (1-z)∘new`` in place; all ``[B, N]``."""
    n_batch, width = new.shape
    one = typed(1.0, new)
    for row in range(n_batch):
        z_r, o_r, n_r = z[row], old[row], new[row]
        for j in range(width):
            n_r[j] = z_r[j] * o_r[j] + (one - z_r[j]) * n_r[j]


@kernel
def zoneout_grad_kernel(z, grad, new_out, old_out):
    """The gradient ``grad`` of a zoned state split: ``new_out = (1-z)∘grad`` (the new
    state's; ``new_out`` may be ``grad``) and ``old_out = z∘grad`` (the old one's); all
    ``[B, N]``."""
    n_batch, width = grad.shape
    one = typed(1.0, grad)
    for row in range(n_batch):
        z_r, g_r, n_r, o_r = z[row], grad[row], new_out[row], old_out[row]
        for j in range(width):
            g = g_r[j]
            o_r[j] = z_r[j] * g
            n_r[j] = (one - z_r[j]) * g
