"""``gradcells.torch.MinGRU`` and ``MinLSTM``: the minGRU and the minLSTM (docs/spec.md
§18.2) as ``torch.nn`` modules on ``gradcells.torch.mingru_sequence`` and
``minlstm_sequence``, shaped like minGRU-pytorch's ``minGRU`` and ``minLSTM`` layers.

Their parameters are minGRU-pytorch's, by the same names and shapes: the bias-free
``to_hidden_and_gate`` (``weight [2H, D]``, rows the candidate's, then the gate's; the
minLSTM's ``to_hidden_and_f_i_gate``, ``[3H, D]``: candidate, f, i) and ``to_out`` (a
bias-free ``[D, H]`` projection, or ``Identity``: ``proj_out``, by default
``expansion_factor != 1``; ``H = int(D·expansion_factor)``), so that a minGRU-pytorch
layer's state dict loads as it is. The weight is reordered into gradcells's ``w [D, 2H]``
(``gc.layouts.mingru_from_mingru_pytorch``'s order) inside autograd, so its gradient is the
op's. ``forward(x, prev_hidden=None, return_next_prev_hidden=False)`` is minGRU-pytorch's
(batch first; ``prev_hidden [B, 1, H]`` the state before the first step, None: zeros;
``next_prev_hidden [B, 1, H]`` the last step's state, before ``to_out``), one formula
whatever the length: its sequential mode's recurrence (the paper's), from any initial
state (its parallel mode needs ``prev_hidden > 0``, known fault 70, and its minLSTM's starts
from ``g(prev_hidden)``, known fault 71).
"""

from __future__ import annotations

import torch
from torch import nn

from ..layouts.mingru_pytorch import COLUMNS, ROWS
from ._functions import FUNCTIONS


class _MinRNN(nn.Module):
    """What the two modules share; a subclass names its cell and its linear layer."""

    cell = ""
    linear = ""

    def __init__(self, dim, expansion_factor=1.0, proj_out=None, *, method="auto",
                 device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.dim, self.expansion_factor = dim, expansion_factor
        self.dim_inner = dim_inner = int(dim * expansion_factor)
        self.method = method
        proj_out = expansion_factor != 1.0 if proj_out is None else proj_out
        setattr(self, self.linear,
                nn.Linear(dim, dim_inner * len(ROWS[self.cell]), bias=False, **kw))
        self.to_out = (nn.Linear(dim_inner, dim, bias=False, **kw) if proj_out
                       else nn.Identity())

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """gradcells's ``(w [D, nH], b [nH])`` of the linear layer's weight (b zero), ``w``
        differentiable in it."""
        weight = getattr(self, self.linear).weight
        rows = dict(zip(ROWS[self.cell], weight.chunk(len(ROWS[self.cell])), strict=True))
        w = torch.cat([rows[k] for k in COLUMNS[self.cell]]).T
        return w, w.new_zeros(w.shape[1])

    def forward(self, x, prev_hidden=None, return_next_prev_hidden=False):
        batch = x.shape[0]
        if prev_hidden is None:
            h0 = x.new_zeros(batch, self.dim_inner)
        elif prev_hidden.shape == (batch, 1, self.dim_inner):
            h0 = prev_hidden[:, 0].to(x.dtype)
        else:
            raise ValueError(f"prev_hidden must have shape [B, 1, H] = "
                             f"[{batch}, 1, {self.dim_inner}], got {list(prev_hidden.shape)}")
        seq = FUNCTIONS[f"{self.cell}_sequence"](x, h0, *self.weights(), method=self.method,
                                                 batch_first=True)
        out = self.to_out(seq.h)
        if not return_next_prev_hidden:
            return out
        return out, seq.h_final[:, None]

    def extra_repr(self):
        return (f"{self.dim}, expansion_factor={self.expansion_factor}, "
                f"proj_out={not isinstance(self.to_out, nn.Identity)}, method={self.method!r}")


class MinGRU(_MinRNN):
    """``MinGRU(dim, expansion_factor=1.0, proj_out=None, *, method="auto", device=None,
    dtype=None)``, minGRU-pytorch's ``minGRU``; ``forward(x, prev_hidden=None,
    return_next_prev_hidden=False) -> out`` or ``(out, next_prev_hidden)``: ``x [B, T, D]``,
    ``out [B, T, D]`` (``to_out`` of every step's ``h``). ``h_t = (1 - z_t)∘h_{t-1} +
    z_t∘g(h̃_t)``; ``method`` is ``gc.mingru_sequence``'s. Initialisation: ``nn.Linear``'s
    (as minGRU-pytorch's)."""

    cell = "mingru"
    linear = "to_hidden_and_gate"


class MinLSTM(_MinRNN):
    """``MinLSTM(dim, expansion_factor=1.0, proj_out=None, *, method="auto", device=None,
    dtype=None)``, minGRU-pytorch's ``minLSTM``; ``forward`` as ``MinGRU``'s. ``h_t =
    f'_t∘h_{t-1} + i'_t∘g(h̃_t)`` with ``f' = f/(f + i)``, ``i' = i/(f + i)``; ``method`` is
    ``gc.minlstm_sequence``'s."""

    cell = "minlstm"
    linear = "to_hidden_and_f_i_gate"
