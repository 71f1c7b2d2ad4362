"""The linear scan on the GPU (docs/spec.md §18.1): ``scan.cu``'s ``linear_scan`` kernel,
one thread per element of the ``[B, D]`` state running its column over time, resets,
lengths and the adjoint's conjugate read in the kernel; complex arrays are passed as their
interleaved (re, im) pairs of float or double (a real ``a`` with a complex ``b`` as it is).

    linear_scan(a, b, h0)                                    h_t = m_t∘h_{t-1} + b_t
    linear_scan(a, d_h, d_h_final, conj, post, backwards)    g, and d_h0 = conj(m_0)∘g_0
    d_a = g∘conj(h_prev) (0 at a reset and past a length),   d_b = g

"sequential" runs one thread per column over all T steps; "parallel" the chunked two-level
scan (``linear_scan_maps``, ``_carries``, ``_chunks``: one thread per (chunk of ``CHUNK``
steps, column) in its first and last pass, so that ``T/CHUNK·B·D`` threads run where
``B·D`` alone would not fill the device), within the stated bound of the sequential one.
Forward mode is the same launches for the tangent's recurrence; second order runs the
reference's on the device's arrays.
"""

from __future__ import annotations

from ...gpu import _kernels, _launch
from ...gpu._launch import Launcher
from . import reference
from .spec import LinearScan, LinearScanGrads, scan_method

CHUNK = 64
"""Steps per chunk of the GPU's parallel scan."""


def _real_view(xp, v):
    """``v`` C-contiguous, a complex array as its real pairs ``[..., 2D]``."""
    v = xp.ascontiguousarray(v)
    return v.view(v.real.dtype) if v.dtype.kind == "c" else v


def _scan(rt, a, c, s0, settings, *, post, conj):
    """The recurrence over ``a``, ``c`` from ``s0``: ``(out, s_final)`` in ``c``'s dtype (the
    forward runs backwards in time with ``reverse``, the adjoint, ``post``, the other way);
    one ``linear_scan`` launch, or the chunked scan's three when the method resolves to
    "parallel" and there are more than ``CHUNK`` steps."""
    xp = rt.xp
    n_steps, n_batch, width = c.shape
    out, final = xp.empty(c.shape, dtype=c.dtype), xp.empty(s0.shape, dtype=c.dtype)
    lengths = _launch.lengths(xp, settings.seq_len)
    storage = _real_view(xp, c).dtype
    arrays = {"a": _real_view(xp, a), "c": _real_view(xp, c),
              "seq_len": _launch.lengths_argument(xp, lengths),
              "resets": xp.empty(0, dtype=xp.int32) if settings.resets is None
              else xp.ascontiguousarray(settings.resets, dtype=xp.int32)}
    flags = {"use_seq_len": lengths is not None, "use_resets": settings.resets is not None,
             "use_complex_a": a.dtype.kind == "c", "use_complex_state": c.dtype.kind == "c",
             "use_conj": conj, "use_post": post, "use_backward": settings.reverse != post,
             "n_steps": n_steps, "batch": n_batch, "width": width}
    s0 = _real_view(xp, s0.astype(c.dtype, copy=False))
    if scan_method(settings.method, n_steps) != "parallel" or n_steps <= CHUNK:
        Launcher(rt, "linear_scan", storage, n_batch * width)(
            **arrays, **flags, s0=s0, out=_real_view(xp, out), s_final=_real_view(xp, final))
        return out, final
    n_chunks = -(-n_steps // CHUNK)
    compute = _kernels.COMPUTE_DTYPE[storage]
    agg_a, agg_c, carries = (xp.empty((n_chunks, n_batch * width, 2), dtype=compute)
                             for _ in range(3))
    chunks = {"chunk": CHUNK, "n_chunks": n_chunks}
    Launcher(rt, "linear_scan_maps", storage, n_chunks * n_batch * width)(
        **arrays, **flags, **chunks, agg_a=agg_a, agg_c=agg_c)
    Launcher(rt, "linear_scan_carries", storage, n_batch * width)(
        agg_a=agg_a, agg_c=agg_c, s0=s0, use_complex_state=flags["use_complex_state"],
        batch=n_batch, width=width, n_chunks=n_chunks, carries=carries)
    Launcher(rt, "linear_scan_chunks", storage, n_chunks * n_batch * width)(
        **arrays, **flags, **chunks, carries=carries, out=_real_view(xp, out),
        s_final=_real_view(xp, final))
    return out, final


def linear_scan(a, b, h0, settings):
    """``LinearScan(h, h_final)``; see ``gradcells.reference``'s ``linear_scan``."""
    rt, on_device = _launch.runtime_on(b)
    with on_device:
        c = b.astype(rt.xp.result_type(a, b), copy=False)
        return LinearScan(*_scan(rt, a, c, h0, settings, post=False, conj=False))


def _masks(xp, a, settings):
    """``[T, B, 1]`` booleans of the steps whose multiplier is ``a`` (running, no reset), or
    None when every step's is."""
    keep = None
    if settings.seq_len is not None:
        keep = xp.arange(a.shape[0])[:, None] < xp.asarray(settings.seq_len)[None, :]
    if settings.resets is not None:
        keep = ~settings.resets if keep is None else keep & ~settings.resets
    return None if keep is None else keep[:, :, None]


def linear_scan_grad(a, b, h0, result, settings, *, d_h=None, d_h_final=None):
    """``LinearScanGrads(a, b, h0)`` by the adjoint launch (the module docstring)."""
    rt, on_device = _launch.runtime_on(b)
    with on_device:
        xp = rt.xp
        dtype = xp.result_type(a, b)
        d_h = xp.zeros(b.shape, dtype) if d_h is None else d_h
        final = xp.zeros(h0.shape, dtype) if d_h_final is None else d_h_final
        g, d_h0 = _scan(rt, a, d_h, final, settings, post=True, conj=True)
        h_prev = reference.previous_in_run_order(
            xp, h0.astype(dtype, copy=False), result.h,
            None if settings.seq_len is None else xp.asarray(settings.seq_len),
            settings.reverse)
        d_a = g * xp.conj(h_prev)
        keep = _masks(xp, a, settings)
        if keep is not None:
            d_a = xp.where(keep, d_a, xp.zeros((), dtype))
        if a.dtype.kind != "c":
            d_a = xp.ascontiguousarray(d_a.real)
        return LinearScanGrads(a=d_a, b=g, h0=d_h0)


def linear_scan_jvp(a, b, h0, tangents, settings):
    """``linear_scan`` and its tangent along ``tangents`` (None fields zero): one more
    launch, ``t_h_t = m_t∘t_h_{t-1} + t_m_t∘h_{t-1} + t_b_t``."""
    rt, on_device = _launch.runtime_on(b)
    with on_device:
        xp = rt.xp
        dtype = xp.result_type(a, b)
        h0 = h0.astype(dtype, copy=False)
        h, h_final = _scan(rt, a, b.astype(dtype, copy=False), h0, settings, post=False,
                           conj=False)
        addend = xp.zeros(b.shape, dtype)
        if tangents.a is not None:
            keep = _masks(xp, a, settings)
            t_m = tangents.a if keep is None else xp.where(keep, tangents.a, 0)
            addend += t_m * reference.previous_in_run_order(
                xp, h0, h, None if settings.seq_len is None else xp.asarray(settings.seq_len),
                settings.reverse)
        if tangents.b is not None:
            addend += tangents.b
        t_h0 = xp.zeros_like(h0) if tangents.h0 is None else tangents.h0
        t_h, t_final = _scan(rt, a, addend, t_h0, settings, post=False, conj=False)
        return LinearScan(h, h_final), LinearScan(t_h, t_final)


linear_scan_grad_jvp = reference.linear_scan_grad_jvp
"""Second order: the reference's, on the device's arrays."""
