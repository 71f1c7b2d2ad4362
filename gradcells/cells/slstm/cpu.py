"""xLSTM's sLSTM on the CPU (docs/spec.md §19). For now the reference's math on NumPy
arrays (``gradcells.cells.slstm.reference``); the fused Numba passes are still to come.

The CPU backend runs the reverse direction natively (``gradcells.cpu.NATIVE_REVERSE``): a
sequence op is handed ``reverse=True`` with the lengths, every per-step array at its time
position. Here that is the reference run on each row's valid steps put in run order
(``_RowFlip``, the permutation ``t -> L_b-1-t`` of the steps ``t < L_b``, an involution)
and the per-step results put back.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import reference
from .reference import (
    slstm_cell as slstm_cell,
)
from .reference import (
    slstm_cell_grad as slstm_cell_grad,
)
from .reference import (
    slstm_cell_grad_jvp as slstm_cell_grad_jvp,
)
from .reference import (
    slstm_cell_jvp as slstm_cell_jvp,
)
from .spec import SLSTMSequence


class _RowFlip:
    """Each row's first ``L_b`` steps in reverse, the others in place (None: no reversal)."""

    def __init__(self, settings, n_steps):
        self.on = bool(settings.reverse) and settings.seq_len is not None
        if self.on:
            lengths = np.asarray(settings.seq_len, dtype=np.int64)
            t = np.arange(n_steps)[:, None]
            self.rows = np.where(t < lengths, lengths - 1 - t, t)

    def __call__(self, a):
        """A per-step array ``[T, B, ·]`` (a mask broadcast there first) in the other order;
        anything else unchanged."""
        if not self.on or a is None or a.ndim < 3 or a.shape[0] == 1:
            return a
        a = np.broadcast_to(a, (self.rows.shape[0], self.rows.shape[1], a.shape[-1]))
        return a[self.rows, np.arange(self.rows.shape[1])[None, :]]

    def settings(self, settings):
        """The settings of the run in run order: forward, the per-step input mask flipped."""
        if not self.on:
            return settings
        return dataclasses.replace(settings, reverse=False,
                                   input_mask=self(settings.input_mask))

    def sequence(self, seq):
        """A sequence result (or its tangent) with every per-step field flipped."""
        return SLSTMSequence(*(self(a) if k < 8 else a for k, a in enumerate(seq)))


def slstm_sequence(x, c0, n0, m0, h0, weights, settings):
    """``reference.slstm_sequence``, the reverse direction natively."""
    flip = _RowFlip(settings, x.shape[0])
    return flip.sequence(reference.slstm_sequence(flip(x), c0, n0, m0, h0, weights,
                                                  flip.settings(settings)))


def slstm_sequence_grad(x, c0, n0, m0, h0, weights, seq, settings, *, d_h=None, d_c=None,
                        d_n=None, d_m=None, d_h_final=None, d_c_final=None, d_n_final=None,
                        d_m_final=None, d_i=None, d_f=None, d_z=None, d_o=None):
    """``reference.slstm_sequence_grad``, the reverse direction natively."""
    flip = _RowFlip(settings, x.shape[0])
    upstream = {k: flip(v) for k, v in locals().items() if k.startswith("d_")}
    grads = reference.slstm_sequence_grad(flip(x), c0, n0, m0, h0, weights,
                                          flip.sequence(seq), flip.settings(settings),
                                          **upstream)
    return grads._replace(x=flip(grads.x))


def slstm_sequence_jvp(x, c0, n0, m0, h0, weights, tangents, settings):
    """``reference.slstm_sequence_jvp``, the reverse direction natively."""
    flip = _RowFlip(settings, x.shape[0])
    pair = reference.slstm_sequence_jvp(flip(x), c0, n0, m0, h0, weights,
                                        tangents._replace(x=flip(tangents.x)),
                                        flip.settings(settings))
    return tuple(flip.sequence(s) for s in pair)


def slstm_sequence_grad_jvp(x, c0, n0, m0, h0, weights, seq, tangents, settings, *,
                            d_h=None, d_c=None, d_n=None, d_m=None, d_h_final=None,
                            d_c_final=None, d_n_final=None, d_m_final=None, d_i=None,
                            d_f=None, d_z=None, d_o=None, d_h_tangent=None, d_c_tangent=None,
                            d_n_tangent=None, d_m_tangent=None, d_h_final_tangent=None,
                            d_c_final_tangent=None, d_n_final_tangent=None,
                            d_m_final_tangent=None, d_i_tangent=None, d_f_tangent=None,
                            d_z_tangent=None, d_o_tangent=None):
    """``reference.slstm_sequence_grad_jvp``, the reverse direction natively."""
    flip = _RowFlip(settings, x.shape[0])
    upstream = {k: flip(v) for k, v in locals().items() if k.startswith("d_")}
    pair = reference.slstm_sequence_grad_jvp(
        flip(x), c0, n0, m0, h0, weights, flip.sequence(seq),
        tangents._replace(x=flip(tangents.x)), flip.settings(settings), **upstream)
    return tuple(g._replace(x=flip(g.x)) for g in pair)
