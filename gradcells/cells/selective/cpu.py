"""Mamba's selective scan on the CPU (docs/spec.md §18.4): ``_cpu_kernels``' fused passes,
one pass over time per (batch, channel) in the forward, a checkpointed forward and the
adjoint in the backward (the kernels' docstring); NumPy only prepares the arguments (B and C
as ``[Bt, G, N, L]``, empty arrays for the absent optional ones) and sums the per-batch-row
partials of ``d_A``, ``d_D`` and ``d_delta_bias``.

Forward mode and second order run the reference's on NumPy arrays (they materialise the
``[Bt, Dm, N]`` states of every step, as the reference does).
"""

from __future__ import annotations

import numpy as np

from ...cpu._compile import kernel_array
from . import reference
from ._cpu_kernels import selective_backward_kernel, selective_forward_kernel
from .spec import SelectiveScan, SelectiveScanGrads


def _grouped(M):
    """``B`` or ``C`` as ``[Bt, G, N, L]`` (ungrouped: G = 1), C-contiguous."""
    return kernel_array(M[:, None] if M.ndim == 3 else M)


def _arguments(u, delta, A, B, C, D, z, delta_bias, settings):
    empty = np.zeros(0, dtype=u.dtype)
    empty3 = np.zeros((0, 0, 0), dtype=u.dtype)
    return (kernel_array(u), kernel_array(delta), kernel_array(A), _grouped(B), _grouped(C),
            empty if D is None else kernel_array(D), empty3 if z is None else kernel_array(z),
            empty if delta_bias is None else kernel_array(delta_bias),
            D is not None, z is not None, delta_bias is not None,
            bool(settings.delta_softplus), bool(settings.reverse))


def selective_scan(u, delta, A, B, C, D, z, delta_bias, settings):
    """``SelectiveScan(y, last_state)``; see ``gradcells.reference``'s ``selective_scan``."""
    y = np.empty(u.shape, dtype=u.dtype)
    last = np.empty((u.shape[0], u.shape[1], A.shape[1]), dtype=u.dtype)
    if y.size or last.size:
        selective_forward_kernel(*_arguments(u, delta, A, B, C, D, z, delta_bias, settings),
                                 y, last)
    return SelectiveScan(y, last if settings.return_last_state else None)


def selective_scan_grad(u, delta, A, B, C, D, z, delta_bias, result, settings, *, d_y=None,
                        d_last_state=None):
    """``SelectiveScanGrads`` by the fused adjoint (the kernels' docstring); ``result`` is not
    read (the states are recomputed)."""
    n_batch, channels, _ = u.shape
    n_state = A.shape[1]
    dtype = u.dtype
    d_y = np.zeros(u.shape, dtype) if d_y is None else kernel_array(d_y)
    d_last = (np.zeros((0, 0, 0), dtype) if d_last_state is None
              else kernel_array(d_last_state))
    d_u, d_delta = np.zeros(u.shape, dtype), np.zeros(u.shape, dtype)
    d_z = np.zeros(u.shape if z is not None else (0, 0, 0), dtype)
    Bg, Cg = _grouped(B), _grouped(C)
    d_B, d_C = np.zeros(Bg.shape, dtype), np.zeros(Cg.shape, dtype)
    d_A = np.zeros((n_batch, channels, n_state), dtype)
    d_D, d_bias = np.zeros((n_batch, channels), dtype), np.zeros((n_batch, channels), dtype)
    if u.size:
        selective_backward_kernel(*_arguments(u, delta, A, B, C, D, z, delta_bias, settings),
                                  d_y, d_last, d_last_state is not None, d_u, d_delta, d_A,
                                  d_B, d_C, d_D, d_z, d_bias)
    return SelectiveScanGrads(
        u=d_u, delta=d_delta, A=d_A.sum(axis=0), B=d_B.reshape(B.shape),
        C=d_C.reshape(C.shape), D=None if D is None else d_D.sum(axis=0),
        z=None if z is None else d_z,
        delta_bias=None if delta_bias is None else d_bias.sum(axis=0))


selective_scan_jvp = reference.selective_scan_jvp
"""Forward mode: the reference's, on NumPy arrays."""

selective_scan_grad_jvp = reference.selective_scan_grad_jvp
"""Second order: the reference's, on NumPy arrays."""
