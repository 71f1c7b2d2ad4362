"""Zoneout's elementwise passes (docs/spec.md §11.3), one per step each way, for every cell's
sequence (``_sequence.zone``, ``_sequence.zoneout_split``).

Each takes the step's mask ``z`` and ``keep = 1 - z`` as C-contiguous ``[B, N]`` arrays
(``_sequence.sequence_masks`` lays them out so), the expressions of ``gradcells._core.plan``'s
``zoned`` and ``zoneout_grad`` with the same roundings (no fastmath, so no contraction).
"""

from __future__ import annotations

from ._compile import kernel


@kernel
def zoneout_kernel(z, keep, old, new):
    """``new ← z∘old + keep∘new`` in place; all ``[B, N]``."""
    n_batch, width = new.shape
    for row in range(n_batch):
        z_r, k_r, o_r, n_r = z[row], keep[row], old[row], new[row]
        for j in range(width):
            n_r[j] = z_r[j] * o_r[j] + k_r[j] * n_r[j]


@kernel
def zoneout_grad_kernel(z, keep, grad, new_out, old_out):
    """The gradient ``grad`` of a zoned state split: ``new_out = keep∘grad`` (the new
    state's; ``new_out`` may be ``grad``) and ``old_out = z∘grad`` (the old one's); all
    ``[B, N]``."""
    n_batch, width = grad.shape
    for row in range(n_batch):
        z_r, k_r, g_r, n_r, o_r = z[row], keep[row], grad[row], new_out[row], old_out[row]
        for j in range(width):
            g = g_r[j]
            o_r[j] = z_r[j] * g
            n_r[j] = k_r[j] * g
