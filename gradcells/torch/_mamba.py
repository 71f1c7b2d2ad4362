"""``gradcells.torch.Mamba``: Mamba's block (Gu and Dao 2023) as a ``torch.nn`` module whose
selective scan (docs/spec.md §18.4) is ``gradcells.torch.selective_scan``, shaped like
mamba_ssm's ``Mamba`` (``mamba_ssm/modules/mamba_simple.py``, mamba-ssm 2.3.2).

Its parameters are mamba_ssm's, by the same names and shapes: ``in_proj``, the depthwise
causal ``conv1d``, ``x_proj``, ``dt_proj``, ``A_log [d_inner, d_state]``, ``D [d_inner]``,
``out_proj``, so that a mamba_ssm ``Mamba``'s state dict loads as it is; its initialisation
is mamba_ssm's, drawn in the same order (the same seed gives the same parameters). Its
``forward(hidden_states)`` is mamba_ssm's path without the fused kernels (``use_fast_path``
off, no ``causal_conv1d``): the convolution, SiLU, ``x_proj`` split into ``dt, B, C``, the
scan with ``D``, the gate ``z``, ``delta_bias = dt_proj.bias`` and softplus, ``out_proj``;
everything but the scan is torch's own ops, the scan's gradient is gradcells's exact one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from ._functions import FUNCTIONS


class Mamba(nn.Module):
    """``Mamba(d_model, d_state=16, d_conv=4, expand=2, dt_rank="auto", dt_min=0.001,
    dt_max=0.1, dt_init="random", dt_scale=1.0, dt_init_floor=1e-4, conv_bias=True,
    bias=False, device=None, dtype=None)``; ``forward(hidden_states [B, L, d_model]) ->
    [B, L, d_model]``.

    ``d_inner = expand·d_model``, ``dt_rank = ceil(d_model/16)`` for ``"auto"``. As
    mamba_ssm's: ``dt_proj.weight`` uniform in ``±dt_rank^-½·dt_scale`` (or that constant
    for ``dt_init="constant"``), ``dt_proj.bias`` the inverse softplus of a ``dt``
    log-uniform in ``[dt_min, dt_max]`` (floored at ``dt_init_floor``; marked
    ``_no_reinit``), ``A_log = log(1..d_state)`` on every channel (S4D real), ``D = 1``
    (both marked ``_no_weight_decay``), the linear layers and the convolution torch's
    defaults.

    ``A_log`` and ``D`` stay in float32 for a float32, float16 or bfloat16 module, as
    mamba_ssm keeps them ("Keep in fp32"), and are float64 in a float64 one (mamba_ssm's
    stay float32 there too; its state dict loads either way). The scan runs in
    ``promote_types(hidden_states.dtype, float32)`` (float32 for half precision, as
    mamba_ssm's kernel computes) and its result is cast back; a float64 module is float64
    throughout, its gradient exact (mamba_ssm's ``selective_scan_ref`` computes in float32
    whatever it is given: the audit's fault 90).

    Not here: the inference cache (``inference_params``, ``step``,
    ``allocate_inference_cache``: each call runs the whole sequence from a zero state),
    ``use_fast_path`` and ``layer_idx`` (which only the cache reads).
    """

    def __init__(self, d_model, d_state=16, d_conv=4, expand=2, dt_rank="auto", dt_min=0.001,
                 dt_max=0.1, dt_init="random", dt_scale=1.0, dt_init_floor=1e-4,
                 conv_bias=True, bias=False, device=None, dtype=None):
        super().__init__()
        if dt_init not in ("random", "constant"):
            raise ValueError(f'dt_init must be "random" or "constant", got {dt_init!r}')
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = int(expand * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else dt_rank
        self.dt_min, self.dt_max, self.dt_init_floor = dt_min, dt_max, dt_init_floor
        self.dt_init, self.dt_scale = dt_init, dt_scale
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=bias, **kw)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, kernel_size=d_conv,
                                groups=self.d_inner, padding=d_conv - 1, bias=conv_bias, **kw)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False, **kw)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True, **kw)
        kept = torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)
        self.A_log = nn.Parameter(torch.empty(self.d_inner, d_state, device=device,
                                              dtype=kept))
        self.D = nn.Parameter(torch.empty(self.d_inner, device=device, dtype=kept))
        self.dt_proj.bias._no_reinit = True   # type: ignore[union-attr]
        self.A_log._no_weight_decay = True   # type: ignore[attr-defined]
        self.D._no_weight_decay = True   # type: ignore[attr-defined]
        self._init_ssm()
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **kw)

    def _init_ssm(self):
        """mamba_ssm's: ``dt_proj`` (after its default initialisation, in the same order of
        draws), ``A_log``, ``D``."""
        with torch.no_grad():
            std = self.dt_rank ** -0.5 * self.dt_scale
            if self.dt_init == "constant":
                self.dt_proj.weight.fill_(std)
            else:
                self.dt_proj.weight.uniform_(-std, std)
            bias = self.dt_proj.bias
            low, high = math.log(self.dt_min), math.log(self.dt_max)
            dt = torch.exp(torch.rand(self.d_inner, device=bias.device, dtype=bias.dtype)
                           * (high - low) + low).clamp(min=self.dt_init_floor)
            bias.copy_(dt + torch.log(-torch.expm1(-dt)))   # softplus's inverse
            self.A_log.copy_(torch.log(torch.arange(1, self.d_state + 1, dtype=self.A_log.dtype,
                                                    device=self.A_log.device)).expand_as(self.A_log))
            self.D.fill_(1.0)

    def reset_parameters(self):
        """Draws every parameter afresh, as the constructor does (in its order)."""
        self.in_proj.reset_parameters()
        self.conv1d.reset_parameters()
        self.x_proj.reset_parameters()
        self.dt_proj.reset_parameters()
        self._init_ssm()
        self.out_proj.reset_parameters()

    def forward(self, hidden_states):
        steps = hidden_states.shape[1]
        x, z = self.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)   # [B, d_inner, L]
        x = F.silu(self.conv1d(x)[..., :steps])   # causal: the first L of L + d_conv - 1
        dt, b, c = torch.split(self.x_proj(x.transpose(1, 2)),
                               [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.linear(dt, self.dt_proj.weight).transpose(1, 2)   # [B, d_inner, L]
        scan_dtype = torch.promote_types(x.dtype, torch.float32)
        y = FUNCTIONS["selective_scan"](
            x.to(scan_dtype), delta.to(scan_dtype), -torch.exp(self.A_log.to(scan_dtype)),
            b.transpose(1, 2).to(scan_dtype).contiguous(),
            c.transpose(1, 2).to(scan_dtype).contiguous(),
            D=self.D.to(scan_dtype), z=z.to(scan_dtype),
            delta_bias=self.dt_proj.bias.to(scan_dtype),  # type: ignore[union-attr]
            delta_softplus=True).y
        return self.out_proj(y.to(hidden_states.dtype).transpose(1, 2))

    def extra_repr(self):
        return (f"{self.d_model}, d_state={self.d_state}, d_conv={self.d_conv}, "
                f"expand={self.expand}, dt_rank={self.dt_rank}")
