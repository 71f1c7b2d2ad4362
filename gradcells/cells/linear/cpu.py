"""The linear scan on the CPU (docs/spec.md §18.1): NumPy prepares the multipliers and
addends, the shared Numba scan (``gradcells.cpu._scan``) runs the recurrence.

    m = a (0 at a reset, 1 past a row's length);   c = b (0 past a row's length)
    linear_scan(m, c, h0)                           h_t = m_t∘h_{t-1} + c_t
    linear_scan(conj(m), d_h, d_h_final, post)      the adjoint g, and d_h0 = conj(m_0)∘g_0
    d_a = g∘conj(h_prev) (0 at a reset),  d_b = g

``method`` "parallel" runs the scans chunked (``gradcells.cpu._scan.sequence_scan``, the
minGRU's and the minLSTM's entry point too: ``CHUNK`` steps a chunk, the chunks' two passes
spread over the cores this process may use), "sequential" step by step; "auto" as
``spec.scan_method``. With ``reverse`` and lengths the scans run backwards in time natively
(``gradcells.cpu.NATIVE_REVERSE``): each row's steps past its length are the identity, so
its state reaches its last valid step unchanged. The kernels are compiled for real and
complex dtypes (a real ``a`` with a complex ``b`` is not widened). Forward mode is NumPy
around the same scan; second order runs the reference's on NumPy arrays.
"""

from __future__ import annotations

import numpy as np

from ...cpu._scan import identity_past_lengths, sequence_scan, upstream_steps
from ...cpu._sequence import contiguous, lengths_of, zero_stopped
from . import reference
from .spec import LinearScan, LinearScanGrads


def _multipliers(a, settings, lengths):
    """``m``: ``a`` with 0 at a reset and 1 past a row's length (a fresh array; ``a``
    itself when neither applies)."""
    if settings.resets is None and lengths is None:
        return a
    m = np.array(a, order="C")
    if settings.resets is not None:
        m[settings.resets] = 0
    return identity_past_lengths(m, lengths)


def _addends(v, dtype, lengths):
    """A per-step addend ``v`` as ``dtype`` with zeros past each row's length (``v`` itself,
    C-contiguous, when nothing changes)."""
    if lengths is None and v.dtype == dtype:
        return contiguous(v)
    return upstream_steps(v, v.shape, dtype, lengths)


def linear_scan(a, b, h0, settings):
    """``LinearScan(h, h_final)``; see ``gradcells.reference``'s ``linear_scan``."""
    lengths = lengths_of(settings.seq_len)
    dtype = np.result_type(a, b)
    h, h_final = sequence_scan(_multipliers(a, settings, lengths), _addends(b, dtype, lengths),
                               h0.astype(dtype, copy=False), settings, post=False)
    zero_stopped((h,), lengths)
    return LinearScan(h, h_final)


def _previous(h0, h, lengths, backward):
    return reference.previous_in_run_order(np, h0, h, lengths, backward)


def _conj(v):
    return np.conj(v) if v.dtype.kind == "c" else v


def _multiplier_grad(g, h0, h, lengths, backward):
    """``d_m_t = g_t∘conj(h_prev_t)`` without materialising ``h_prev``: each step's
    product with the state before it in run order (``h_{t-1}``, or ``h_{t+1}`` with
    ``backward``), ``h0`` at a row's first step in run order; ``g`` is zero past a row's
    length, so those steps give 0 whatever they read."""
    out = np.empty(g.shape, np.result_type(g, h))
    if g.shape[0] == 0:
        return out
    now, before = (slice(None, -1), slice(1, None)) if backward else (slice(1, None),
                                                                      slice(None, -1))
    np.multiply(g[now], _conj(h[before]), out=out[now])
    first = -1 if backward else 0
    np.multiply(g[first], _conj(h0), out=out[first])
    if backward and lengths is not None:      # a row's first step in run order is L - 1
        rows = np.nonzero((lengths > 0) & (lengths < g.shape[0]))[0]
        out[lengths[rows] - 1, rows] = g[lengths[rows] - 1, rows] * _conj(h0[rows])
    return out


def _real_if(v, like):
    return v if like.dtype.kind == "c" else np.ascontiguousarray(v.real)


def linear_scan_grad(a, b, h0, result, settings, *, d_h=None, d_h_final=None):
    """``LinearScanGrads(a, b, h0)`` by the adjoint scan (the module docstring)."""
    lengths = lengths_of(settings.seq_len)
    dtype = np.result_type(a, b)
    m = _multipliers(a, settings, lengths)
    d_h = (np.zeros(b.shape, dtype) if d_h is None else _addends(d_h, dtype, lengths))
    final = np.zeros(h0.shape, dtype) if d_h_final is None else d_h_final
    g, d_h0 = sequence_scan(_conj(m), d_h, contiguous(final), settings, post=True)
    zero_stopped((g,), lengths)
    d_a = _multiplier_grad(g, h0.astype(dtype, copy=False), result.h, lengths,
                           settings.reverse)
    if settings.resets is not None:
        d_a[settings.resets] = 0
    return LinearScanGrads(a=_real_if(d_a, a), b=g, h0=d_h0)


def linear_scan_jvp(a, b, h0, tangents, settings):
    """``linear_scan`` and its tangent along ``tangents`` (``LinearScanGrads``, None fields
    zero), by the same scan: ``t_h_t = m_t∘t_h_{t-1} + t_m_t∘h_{t-1} + t_b_t``."""
    lengths = lengths_of(settings.seq_len)
    dtype = np.result_type(a, b)
    m = _multipliers(a, settings, lengths)
    h0 = h0.astype(dtype, copy=False)
    h, h_final = sequence_scan(m, _addends(b, dtype, lengths), h0, settings, post=False)
    addend = upstream_steps(tangents.b, b.shape, dtype, lengths)
    if tangents.a is not None:
        t_m = upstream_steps(tangents.a, a.shape, a.dtype, lengths)
        if settings.resets is not None:
            t_m[settings.resets] = 0
        addend += t_m * _previous(h0, h, lengths, settings.reverse)
    t_h0 = np.zeros_like(h0) if tangents.h0 is None else contiguous(tangents.h0)
    t_h, t_final = sequence_scan(m, addend, t_h0.astype(dtype, copy=False), settings,
                                 post=False)
    zero_stopped((h, t_h), lengths)
    return LinearScan(h, h_final), LinearScan(t_h, t_final)


linear_scan_grad_jvp = reference.linear_scan_grad_jvp
"""Second order: the reference's, on NumPy arrays."""
