"""Mamba's selective scan on the GPU (docs/spec.md §18.4): ``selective.cu``'s two kernels.

    selective_forward      one thread per (batch, channel), looping over time and the N
                           states: y and the last state in one launch
    selective_backward     one thread per (batch, part of Dm/gcd(G_B, G_C) channels): a
                           checkpointed forward, then the adjoint chunk by chunk (``CHUNK``
                           steps), every gradient in one launch

Nothing ``[Bt, Dm, L, N]`` is made: the forward's scratch is ``[Bt, Dm, N]``, the backward's
``(L/CHUNK + CHUNK + 2)·N`` per thread. The gradients are computed in the arithmetic type
(float32 for float16) and the per-batch-row sums of ``d_A``, ``d_D``, ``d_delta_bias`` added
here. The backward's parallelism is ``Bt·gcd(G_B, G_C)`` threads (the group sums need no
atomics that way): correct everywhere, slow where that is small (docs/spec.md §18.5's speed
is not claimed). Forward mode and second order run the reference's on the device's arrays.
"""

from __future__ import annotations

import math

from ...gpu import _kernels, _launch
from ...gpu._launch import Launcher
from . import reference
from .spec import SelectiveScan, SelectiveScanGrads

CHUNK = 64
"""Steps between the backward's checkpoints of the state."""


def _grouped(xp, M):
    return xp.ascontiguousarray(M[:, None] if M.ndim == 3 else M)


def _arguments(xp, u, delta, A, B, C, D, z, delta_bias, settings):
    """The two kernels' shared arguments (absent optional arrays: ``u``, never read)."""
    Bg, Cg = _grouped(xp, B), _grouped(xp, C)
    c = xp.ascontiguousarray
    return {"u": c(u), "delta": c(delta), "a_mat": c(A), "b_mat": Bg, "c_mat": Cg,
            "d_vec": u if D is None else c(D), "z": u if z is None else c(z),
            "bias": u if delta_bias is None else c(delta_bias), "use_d": D is not None,
            "use_z": z is not None, "use_bias": delta_bias is not None,
            "use_softplus": bool(settings.delta_softplus),
            "use_reverse": bool(settings.reverse), "batch": u.shape[0],
            "channels": u.shape[1], "n_steps": u.shape[2], "n_state": A.shape[1],
            "groups_b": Bg.shape[1], "groups_c": Cg.shape[1]}


def selective_scan(u, delta, A, B, C, D, z, delta_bias, settings):
    """``SelectiveScan(y, last_state)``; see ``gradcells.reference``'s ``selective_scan``."""
    rt, on_device = _launch.runtime_on(u)
    with on_device:
        xp = rt.xp
        n_batch, channels, _ = u.shape
        n_state = A.shape[1]
        y = xp.empty(u.shape, dtype=u.dtype)
        last = xp.empty((n_batch, channels, n_state), dtype=u.dtype)
        compute = _kernels.COMPUTE_DTYPE[u.dtype]
        Launcher(rt, "selective_forward", u.dtype, n_batch * channels)(
            **_arguments(xp, u, delta, A, B, C, D, z, delta_bias, settings),
            x=xp.empty(n_batch * channels * n_state, dtype=compute), y=y, last=last)
        return SelectiveScan(y, last if settings.return_last_state else None)


def selective_scan_grad(u, delta, A, B, C, D, z, delta_bias, result, settings, *, d_y=None,
                        d_last_state=None):
    """``SelectiveScanGrads`` by one adjoint launch (the module docstring); ``result`` is
    not read (the states are recomputed)."""
    rt, on_device = _launch.runtime_on(u)
    with on_device:
        xp = rt.xp
        args = _arguments(xp, u, delta, A, B, C, D, z, delta_bias, settings)
        n_batch, channels, n_steps = u.shape
        n_state = A.shape[1]
        parts = math.gcd(args["groups_b"], args["groups_c"])
        compute = _kernels.COMPUTE_DTYPE[u.dtype]
        n_chunks = -(-n_steps // CHUNK)

        def zeros(shape):
            return xp.zeros(shape, dtype=compute)
        out = {"d_u": zeros(u.shape), "d_delta": zeros(u.shape),
               "d_a": zeros((n_batch, channels, n_state)), "d_b": zeros(args["b_mat"].shape),
               "d_c": zeros(args["c_mat"].shape), "d_d": zeros((n_batch, channels)),
               "d_z": zeros(u.shape), "d_bias": zeros((n_batch, channels))}
        Launcher(rt, "selective_backward", u.dtype, n_batch * parts)(
            **args, parts=parts, chunk=CHUNK,
            d_y=xp.zeros(u.shape, u.dtype) if d_y is None else xp.ascontiguousarray(d_y),
            d_last=u if d_last_state is None else xp.ascontiguousarray(d_last_state),
            use_d_last=d_last_state is not None,
            scratch=zeros(max(1, n_batch * parts * (n_chunks + CHUNK + 2) * n_state)), **out)

        def cast(v):
            return v.astype(u.dtype, copy=False)
        return SelectiveScanGrads(
            u=cast(out["d_u"]), delta=cast(out["d_delta"]), A=cast(out["d_a"].sum(axis=0)),
            B=cast(out["d_b"].reshape(B.shape)), C=cast(out["d_c"].reshape(C.shape)),
            D=None if D is None else cast(out["d_d"].sum(axis=0)),
            z=None if z is None else cast(out["d_z"]),
            delta_bias=None if delta_bias is None else cast(out["d_bias"].sum(axis=0)))


selective_scan_jvp = reference.selective_scan_jvp
"""Forward mode: the reference's, on the device's arrays."""

selective_scan_grad_jvp = reference.selective_scan_grad_jvp
"""Second order: the reference's, on the device's arrays."""
