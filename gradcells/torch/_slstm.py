"""``gradcells.torch.sLSTM``: xLSTM's sLSTM (docs/spec.md §19) as a ``torch.nn`` module on
``gradcells.torch.slstm_sequence``.

Parameters in gradcells's layout, ``w [I, 4H]``, ``r [N, H/N, 4H/N]``, ``b [4H]``
(gate-major blocks i, f, z, o); autograd reaches them through the op's gradient, the exact
one of the stabiliser unless ``stabilizer_grad="stop"`` (xLSTM's CUDA backward).
``sLSTM.from_xlstm(cell)`` loads an xlstm ``sLSTMCell``'s parameters
(``gradcells.layouts.slstm_from_xlstm``): the module then takes the cell's input ``Wx``
(``input_size = 4H``, ``w`` the identity).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..cells.slstm.spec import FORGETS, STABILIZER_GRADS
from ..layouts import slstm_from_xlstm
from ._functions import FUNCTIONS

_sequence = FUNCTIONS["slstm_sequence"]


class sLSTM(nn.Module):  # noqa: N801 (xLSTM's name)
    """``sLSTM(input_size, hidden_size, num_heads=4, *, forget="sigmoid",
    stabilizer_grad="exact", batch_first=False, device=None, dtype=None)``;
    ``forward(input, state=None, seq_len=None) -> (output, (c_n, n_n, m_n, h_n))``: ``input
    [T, B, I]`` (``[B, T, I]`` with ``batch_first``), ``state`` a tuple ``(c, n, m, h)`` of
    ``[B, H]`` tensors (None: zeros), ``output`` every step's ``h``. Initialisation:
    ``w``, ``r`` uniform in ``±1/sqrt(fan_in)`` (I and H/N), ``b`` zero."""

    def __init__(self, input_size, hidden_size, num_heads=4, *, forget="sigmoid",
                 stabilizer_grad="exact", batch_first=False, device=None, dtype=None):
        super().__init__()
        if num_heads < 1 or hidden_size % num_heads:
            raise ValueError(f"num_heads must divide hidden_size = {hidden_size}, got "
                             f"{num_heads}")
        if forget not in FORGETS:
            raise ValueError(f"forget must be one of {FORGETS}, got {forget!r}")
        if stabilizer_grad not in STABILIZER_GRADS:
            raise ValueError(f"stabilizer_grad must be one of {STABILIZER_GRADS}, got "
                             f"{stabilizer_grad!r}")
        d = hidden_size // num_heads
        kw = {"device": device, "dtype": dtype}
        self.input_size, self.hidden_size, self.num_heads = input_size, hidden_size, num_heads
        self.forget, self.stabilizer_grad, self.batch_first = forget, stabilizer_grad, batch_first
        self.w = nn.Parameter(torch.empty(input_size, 4 * hidden_size, **kw))
        self.r = nn.Parameter(torch.empty(num_heads, d, 4 * d, **kw))
        self.b = nn.Parameter(torch.empty(4 * hidden_size, **kw))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            for p, fan_in in ((self.w, self.input_size), (self.r, self.r.shape[1])):
                bound = 1 / math.sqrt(max(fan_in, 1))
                p.uniform_(-bound, bound)
            self.b.zero_()

    @classmethod
    def from_xlstm(cls, cell, **options):
        """A module with an xlstm ``sLSTMCell``'s parameters (its ``recurrent_kernel`` and
        ``bias``): input ``Wx [.., 4H]``, ``w`` the identity."""
        kernel, bias = cell.recurrent_kernel.clone().detach(), cell.bias.clone().detach()
        w, r, b = slstm_from_xlstm(kernel, bias)
        module = cls(w.shape[0], r.shape[0] * r.shape[1], r.shape[0], dtype=kernel.dtype,
                     **options)
        with torch.no_grad():
            for p, a in zip((module.w, module.r, module.b), (w, r, b), strict=True):
                p.copy_(torch.from_numpy(a))
        return module

    def forward(self, input, state=None, seq_len=None):  # noqa: A002 (nn's name)
        batch = input.shape[0 if self.batch_first else 1]
        if state is None:
            zeros = input.new_zeros(batch, self.hidden_size)
            state = (zeros, zeros, zeros, zeros)
        seq = _sequence(input, *state, self.w, self.r, self.b, forget=self.forget,
                        stabilizer_grad=self.stabilizer_grad, seq_len=seq_len,
                        batch_first=self.batch_first)
        return seq.h, (seq.c_final, seq.n_final, seq.m_final, seq.h_final)

    def extra_repr(self):
        return (f"{self.input_size}, {self.hidden_size}, num_heads={self.num_heads}, "
                f"forget={self.forget!r}, stabilizer_grad={self.stabilizer_grad!r}")
