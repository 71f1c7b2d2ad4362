"""Mamba's layout (state-spaces/mamba, PyPI ``mamba-ssm``): the selective scan's parameters
(docs/spec.md §18.4).

Its ``Mamba`` block holds ``A_log [Dm, N]`` (the scan's ``A = -exp(A_log)``, kept in log
space so that ``A`` stays negative), ``D [Dm]`` (the skip) and ``dt_proj``, whose bias is the
scan's ``delta_bias``: the block calls ``selective_scan_fn(x, dt_proj.weight @ dt, A, B, C,
D, z, delta_bias=dt_proj.bias, delta_softplus=True)``. The scan's other arguments (``u``,
``delta``, ``B``, ``C``, ``z``) are computed from the block's input by its projections and
convolution, which are the block's, not the scan's.
"""

from __future__ import annotations

import numpy as np

from .._core.types import Array
from ._common import Converted, check_ndim, check_shape, checked_arrays, new_array


def selective_from_mamba(A_log: Array, D: Array, dt_proj_bias: Array) -> Converted:  # noqa: N803
    """gradcells ``(A [Dm, N], D [Dm], delta_bias [Dm])`` for ``gc.selective_scan`` from a
    ``Mamba`` block's ``A_log [Dm, N]``, ``D [Dm]`` and ``dt_proj.bias [Dm]``
    (``A = -exp(A_log)``). ``converted.options`` is ``{"delta_softplus": True}``, the block's;
    the scan starts from zero, so ``state_order`` is empty."""
    a = checked_arrays(A_log=A_log, D=D, dt_proj_bias=dt_proj_bias)
    check_ndim("A_log", a["A_log"], 2, "Dm, N")
    channels = a["A_log"].shape[0]
    check_shape("D", a["D"], (channels,), "Dm")
    check_shape("dt_proj_bias", a["dt_proj_bias"], (channels,), "Dm")
    return Converted((new_array(-np.exp(a["A_log"])), new_array(a["D"]),
                      new_array(a["dt_proj_bias"])),
                     framework="mamba_ssm", options={"delta_softplus": True}, state_order=())


def selective_to_mamba(A: Array, D: Array, delta_bias: Array) -> dict[str, np.ndarray]:  # noqa: N803
    """A ``Mamba`` block's ``{"A_log", "D", "dt_proj.bias"}`` (its state dict's names) from
    gradcells's ``A``, ``D`` and ``delta_bias``; ``A`` must be negative everywhere
    (ValueError otherwise: ``A_log = log(-A)``)."""
    a = checked_arrays(A=A, D=D, delta_bias=delta_bias)
    check_ndim("A", a["A"], 2, "Dm, N")
    channels = a["A"].shape[0]
    check_shape("D", a["D"], (channels,), "Dm")
    check_shape("delta_bias", a["delta_bias"], (channels,), "Dm")
    if not np.all(a["A"] < 0):
        raise ValueError("A must be negative everywhere: Mamba keeps A_log = log(-A)")
    return {"A_log": new_array(np.log(-a["A"])), "D": new_array(a["D"]),
            "dt_proj.bias": new_array(a["delta_bias"])}
