"""``gradcells.torch.RGLRU``: the RG-LRU (docs/spec.md §18.3) as a ``torch.nn`` module on
``gradcells.torch.rglru_sequence``, shaped like recurrentgemma's torch ``RGLRU`` layer.

Its parameters are recurrentgemma's, by the same names and shapes: ``a_param [D]`` and the
block-diagonal ``input_gate`` and ``a_gate`` (each ``w [N, D/N, D/N]``, ``b [N, D/N]``),
so that a recurrentgemma ``RGLRU``'s state dict loads as it is; its ``forward(x,
segment_pos, cache=None, return_cache=True)`` is recurrentgemma's (batch first, a reset
where ``segment_pos == 0``). Its gradient is the true one unless ``sqrt_grad_bound`` is set
(recurrentgemma's ``SqrtBoundDerivative`` bounds it at 1000, always).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._functions import FUNCTIONS

_sequence = FUNCTIONS["rglru_sequence"]


class BlockDiagonalLinear(nn.Module):
    """recurrentgemma's ``BlockDiagonalLinear``'s parameters: ``w [N, D/N, D/N]`` (normal,
    variance ``w_init_variance_scale/(D/N)``), ``b [N, D/N]`` (zero). The RG-LRU applies
    them inside its op; ``forward`` gives the product alone, ``x·W + b``."""

    def __init__(self, width, num_blocks, w_init_variance_scale=1.0, device=None,
                 dtype=None):
        super().__init__()
        self.width, self.num_blocks = width, num_blocks
        self.w_init_variance_scale = w_init_variance_scale
        self.block_width = width // num_blocks
        kw = {"device": device, "dtype": dtype}
        self.w = nn.Parameter(torch.empty(num_blocks, self.block_width, self.block_width,
                                          **kw))
        self.b = nn.Parameter(torch.empty(num_blocks, self.block_width, **kw))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            std = math.sqrt(self.w_init_variance_scale / max(self.block_width, 1))
            self.w.normal_(0.0, std)
            self.b.zero_()

    def forward(self, x):
        heads = x.reshape(*x.shape[:-1], self.num_blocks, self.block_width)
        y = torch.einsum("...hi,hij->...hj", heads, self.w) + self.b
        return y.reshape(x.shape)


class RGLRU(nn.Module):
    """``RGLRU(width, num_heads, w_init_variance_scale=1.0, *, c=8.0, sqrt_grad_bound=None,
    device=None, dtype=None)``; ``forward(x, segment_pos, cache=None, return_cache=True) ->
    (y, last_h)``: ``x [B, T, D]``, ``segment_pos [B, T]`` (a reset where it is 0),
    ``cache [B, D]`` the state before the first step (None: zeros), ``y`` every step's
    state, ``last_h`` the last one (None without ``return_cache``). Initialisation as
    recurrentgemma's: the gates' ``w`` normal, ``b`` zero, ``a_param`` such that
    ``σ(-a_param) = exp(-softplus(a_param))`` lies on the ring of radii 0.9 to 0.999
    (uniform in its area; ``a = σ(-a_param)^(c·r)``)."""

    def __init__(self, width, num_heads, w_init_variance_scale=1.0, *, c=8.0,
                 sqrt_grad_bound=None, device=None, dtype=None):
        super().__init__()
        if num_heads < 1 or width % num_heads:
            raise ValueError(f"num_heads must divide width = {width}, got {num_heads}")
        self.width, self.num_heads = width, num_heads
        self.c, self.sqrt_grad_bound = c, sqrt_grad_bound
        kw = {"device": device, "dtype": dtype}
        self.a_param = nn.Parameter(torch.empty(width, **kw))
        self.input_gate = BlockDiagonalLinear(width, num_heads, w_init_variance_scale, **kw)
        self.a_gate = BlockDiagonalLinear(width, num_heads, w_init_variance_scale, **kw)
        self.reset_parameters()

    def reset_parameters(self, min_rad=0.9, max_rad=0.999, eps=1e-8):
        self.input_gate.reset_parameters()
        self.a_gate.reset_parameters()
        with torch.no_grad():   # recurrentgemma's rnn_param_init (softplus transform)
            self.a_param.uniform_(min_rad ** 2 + eps, max_rad ** 2 + eps)
            self.a_param.log_().mul_(0.5).neg_().exp_().sub_(1.0).log_()

    def forward(self, x, segment_pos, cache=None, return_cache=True):
        if cache is None:
            cache = x.new_zeros(x.shape[0], self.width)
        seq = _sequence(x, cache.to(x.dtype), self.a_gate.w, self.a_gate.b.reshape(-1),
                        self.input_gate.w, self.input_gate.b.reshape(-1), self.a_param,
                        c=self.c, sqrt_grad_bound=self.sqrt_grad_bound,
                        resets=segment_pos == 0, batch_first=True)
        return seq.h, (seq.h_final if return_cache else None)

    def extra_repr(self):
        return (f"{self.width}, num_heads={self.num_heads}, c={self.c}, "
                f"sqrt_grad_bound={self.sqrt_grad_bound}")
