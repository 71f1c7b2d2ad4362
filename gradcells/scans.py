"""The public linear scan (docs/spec.md §18.1): ``linear_scan``, its gradient, forward mode
and second order. No math here: validate (``gradcells._validate.scans``), dispatch
(``gradcells._dispatch``), run in the caller's order and layout (``gradcells._order``),
record the settings. The math is ``gradcells.cells.linear.reference``; the backends
``gradcells.cells.linear.cpu`` and ``gpu`` compute the same functions.

The linear scan is not a cell: it has no input ``x``, no weights, no step and no stack, so
its four functions are written here instead of being compiled from a ``CellSpec``
(``gradcells._public``); docs/design.md counts what that costs.
"""

from __future__ import annotations

from . import _dispatch, _order
from ._core.types import Array, record_settings
from ._interop import accepts_any_array, computes_half_in_single
from ._validate.scans import scan_args, scan_grad_args, scan_tangents, scan_upstream_tangents
from .cells.linear.spec import LinearScan, LinearScanGrads

__all__ = ["linear_scan", "linear_scan_grad", "linear_scan_jvp", "linear_scan_grad_jvp"]


def _any_array(function):
    """``function`` taking PyTorch tensors, JAX arrays and dask arrays chunked along the
    batch (``accepts_any_array``; dask through ``gradcells._dask``, which reads the op from
    ``gradcells.cells.SCAN_SPECS``), and NumPy float16 computed in float32
    (``computes_half_in_single``, docs/spec.md §16.4)."""
    return accepts_any_array(computes_half_in_single(function))


@_any_array
def linear_scan(a: Array, b: Array, h0: Array, *, seq_len: Array | None = None,
                reverse: bool = False, resets: Array | None = None, batch_first: bool = False,
                method: str = "auto", backend: str | None = None) -> LinearScan:
    """The diagonal linear recurrence (docs/spec.md §18.1) over ``a, b [T, B, D]`` from
    ``h0 [B, D]``:

        h_t = a_t∘h_{t-1} + b_t,   h_{-1} = h0

    ``resets [T, B]`` (bool, optional): where true, ``h_{t-1}`` is replaced by zeros (a
    document boundary; ``a_t`` is then not used). ``seq_len``, ``reverse`` and
    ``batch_first`` as for ``lstm_sequence`` (docs/spec.md §11): steps past a row's length
    are not run (their ``h`` is zero, ``a``, ``b`` and ``resets`` are not read there); with
    ``reverse`` each row runs its own steps from last to first and a reset at ``t`` zeros
    the state coming from ``t + 1``; with ``batch_first`` every ``[T, B, ·]`` array is
    ``[B, T, ·]`` and ``resets`` ``[B, T]``.

    Dtypes: ``b`` and ``h0`` float32, float64, complex64 or complex128; ``a`` the same, or
    real with a complex ``b``. ``method``: "sequential" (step by step), "parallel" (an
    associative scan over time: the chunked two-level scan, its chunks on the CPU's cores
    or on one GPU thread per chunk and column) or "auto" (parallel from
    ``PARALLEL_FROM_STEPS`` steps). Every method agrees with the sequential one elementwise within
    ``PARALLEL_BOUND_ULPS·(log2 T + 2)·eps`` times the sequential scan of ``|a|``, ``|b|``,
    ``|h0|``.

    Returns ``LinearScan(h [T, B, D], h_final [B, D])`` recording its settings.
    """
    library, settings = scan_args(a, b, h0, seq_len=seq_len, reverse=reverse, resets=resets,
                                  batch_first=batch_first, method=method)
    impl = _dispatch.backend_for(backend, library)
    return record_settings(_order.scan_forward(impl.linear_scan, a, b, h0, settings,
                                               package=impl), settings)


@_any_array
def linear_scan_grad(a: Array, b: Array, h0: Array, result: LinearScan, *,
                     d_h: Array | None = None, d_h_final: Array | None = None,
                     seq_len: Array | None = None, reverse: bool | None = None,
                     resets: Array | None = None, batch_first: bool | None = None,
                     method: str | None = None, backend: str | None = None
                     ) -> LinearScanGrads:
    """Gradient of ``linear_scan`` given its ``result`` and the upstream gradients ``d_h
    [T, B, D]`` and ``d_h_final [B, D]`` (None: zeros; entries past a row's length are not
    read). The adjoint recurrence runs backwards in time, itself a linear scan (by the
    forward's ``method``):

        g_t = d_h_t + conj(a_{t+1})∘g_{t+1},   g_{T-1} = d_h_{T-1} + d_h_final
        d_b = g,   d_a_t = g_t∘conj(h_{t-1}),   d_h0 = conj(a_0)∘g_0

    where a reset at step t makes ``a_t`` 0 in the recurrence and ``d_a_t`` 0 (the reset
    step's multiplier passes nothing to ``h_{t-1}``).

    Complex arrays follow PyTorch's convention: for a real loss ``L`` the gradient of a
    complex ``z`` is ``∂L/∂Re z + i ∂L/∂Im z`` (what ``z.grad`` holds after
    ``L.backward()``). With ``h_t = a_t h_{t-1} + b_t`` holomorphic that gives the
    conjugates above: ``d_a_t = g_t∘conj(h_{t-1})`` and ``d_h_{t-1} += conj(a_t)∘g_t``; for
    real arrays they are the identity, and a real ``a`` with a complex ``b`` gets
    ``Re(g_t∘conj(h_{t-1}))``.

    ``seq_len``, ``reverse``, ``resets``, ``batch_first`` and ``method`` are the forward's,
    as ``result`` records them (a contradicting value raises ``ValueError``; a result that
    records nothing takes them from here). Returns ``LinearScanGrads(a, b, h0)``.
    """
    upstream = {"d_h": d_h, "d_h_final": d_h_final}
    library, settings, result = scan_grad_args(
        a, b, h0, result, upstream, given={"seq_len": seq_len, "reverse": reverse,
                                           "resets": resets, "batch_first": batch_first,
                                           "method": method})
    impl = _dispatch.backend_for(backend, library)
    return _order.scan_grad(impl.linear_scan_grad, a, b, h0, result, settings, upstream,
                            package=impl)


@_any_array
def linear_scan_jvp(a: Array, b: Array, h0: Array, tangents: LinearScanGrads | None, *,
                    seq_len: Array | None = None, reverse: bool = False,
                    resets: Array | None = None, batch_first: bool = False,
                    method: str = "auto", backend: str | None = None
                    ) -> tuple[LinearScan, LinearScan]:
    """Forward mode of ``linear_scan`` (docs/spec.md §12): the scan and its directional
    derivative along ``tangents`` (a ``LinearScanGrads`` of the inputs' tangents; None
    fields, or None: zero). The tangent is the same recurrence,

        t_h_t = a_t∘t_h_{t-1} + t_a_t∘h_{t-1} + t_b_t

    (at a reset ``a_t`` and ``t_a_t`` are 0). Returns ``(result, result_tangent)``, two
    ``LinearScan``s."""
    library, settings = scan_args(a, b, h0, seq_len=seq_len, reverse=reverse, resets=resets,
                                  batch_first=batch_first, method=method)
    tangents = scan_tangents(tangents, a, b, h0, library)
    impl = _dispatch.backend_for(backend, library)
    result, t_result = _order.scan_jvp(impl.linear_scan_jvp, a, b, h0, tangents, settings)
    return record_settings(result, settings), t_result


@_any_array
def linear_scan_grad_jvp(a: Array, b: Array, h0: Array, result: LinearScan,
                         tangents: LinearScanGrads | None, *, d_h: Array | None = None,
                         d_h_final: Array | None = None, d_h_tangent: Array | None = None,
                         d_h_final_tangent: Array | None = None,
                         seq_len: Array | None = None, reverse: bool | None = None,
                         resets: Array | None = None, batch_first: bool | None = None,
                         method: str | None = None, backend: str | None = None
                         ) -> tuple[LinearScanGrads, LinearScanGrads]:
    """Second order (docs/spec.md §12): the JVP of ``linear_scan_grad`` along ``tangents``
    (the inputs' tangents, a ``LinearScanGrads``) and the upstream gradients' tangents
    ``d_h_tangent``, ``d_h_final_tangent`` (None: zero). The gradient is real-linear in
    the conjugates (``t(conj z) = conj(t_z)``):

        t_g_t = t_d_h_t + conj(a_{t+1})∘t_g_{t+1} + conj(t_a_{t+1})∘g_{t+1}
        t_d_b = t_g,   t_d_a_t = t_g_t∘conj(h_{t-1}) + g_t∘conj(t_h_{t-1})
        t_d_h0 = conj(a_0)∘t_g_0 + conj(t_a_0)∘g_0

    Returns ``(grads, grads_tangent)``, two ``LinearScanGrads``."""
    upstream = {"d_h": d_h, "d_h_final": d_h_final}
    library, settings, result = scan_grad_args(
        a, b, h0, result, upstream, given={"seq_len": seq_len, "reverse": reverse,
                                           "resets": resets, "batch_first": batch_first,
                                           "method": method})
    tangents = scan_tangents(tangents, a, b, h0, library)
    upstream_t = {"d_h_tangent": d_h_tangent, "d_h_final_tangent": d_h_final_tangent}
    scan_upstream_tangents(result, upstream_t, library)
    impl = _dispatch.backend_for(backend, library)
    return _order.scan_grad_jvp(impl.linear_scan_grad_jvp, a, b, h0, result, tangents,
                                settings, {**upstream, **upstream_t})
