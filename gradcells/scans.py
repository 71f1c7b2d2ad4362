"""The public linear scan (docs/spec.md §18.1) and Mamba's selective scan (§18.4):
``linear_scan``, ``selective_scan``, their gradients, forward modes and second orders. No
math here: validate (``gradcells._validate.scans``), dispatch (``gradcells._dispatch``),
run in the caller's order and layout (``gradcells._order``), record the settings. The math
is ``gradcells.cells.linear.reference``; the backends ``gradcells.cells.linear.cpu`` and
``gpu`` compute the same functions.

The selective scan's math is ``gradcells.cells.selective.reference``, its validation
``gradcells._validate.selective``; its arrays are in Mamba's layout, so ``gradcells._order``
has nothing to reorder for it; dask arrays chunked along ``Bt`` are taken as for the other
ops (``gradcells._dask`` reads its arrays' labels from its spec).

Neither is a cell: no input ``x``, no weights, no step and no stack, so their four
functions each are written here instead of being compiled from a ``CellSpec``
(``gradcells._public``); docs/design.md counts what that costs.
"""

from __future__ import annotations

from . import _dispatch, _order
from ._core.types import Array, record_settings
from ._interop import accepts_any_array, computes_half_in_single
from ._validate.scans import scan_args, scan_grad_args, scan_tangents, scan_upstream_tangents
from ._validate.selective import (
    selective_args,
    selective_grad_args,
    selective_tangents,
    selective_upstream,
)
from .cells.linear.spec import LinearScan, LinearScanGrads
from .cells.selective.spec import SelectiveScan, SelectiveScanGrads

__all__ = ["linear_scan", "linear_scan_grad", "linear_scan_jvp", "linear_scan_grad_jvp",
           "selective_scan", "selective_scan_grad", "selective_scan_jvp",
           "selective_scan_grad_jvp"]


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


_SELECTIVE_SETTINGS = ("delta_softplus", "reverse", "return_last_state")


@_any_array
def selective_scan(u: Array, delta: Array, A: Array, B: Array, C: Array, *,
                   D: Array | None = None, z: Array | None = None,
                   delta_bias: Array | None = None, delta_softplus: bool = False,
                   reverse: bool = False, return_last_state: bool = False,
                   backend: str | None = None) -> SelectiveScan:
    """Mamba's selective scan (Gu and Dao 2023; docs/spec.md §18.4), as mamba_ssm's
    ``selective_scan_ref``, in its layout: ``u, delta, z [Bt, Dm, L]``, ``A [Dm, N]``
    (real), ``B, C [Bt, N, L]`` or grouped ``[Bt, G, N, L]`` (G divides Dm; channel d reads
    group d // (Dm/G)), ``D, delta_bias [Dm]``:

        Δ_t = softplus(delta_t + delta_bias)   (delta_softplus; else delta_t + delta_bias)
        x_t = exp(Δ_t A)∘x_{t-1} + Δ_t B_t u_t,   x_{-1} = 0   (state [Bt, Dm, N])
        y_t = (C_t·x_t + D∘u_t) ∘ silu(z_t)      (D, z optional)

    ``reverse``: time runs from L-1 down to 0. ``return_last_state``: the result's
    ``last_state`` is the state after the last step run (else None). Every array float32 or
    float64, one dtype (NumPy float16: computed in float32), computed in that dtype
    (mamba_ssm's reference computes in float32 whatever it is given). Returns
    ``SelectiveScan(y [Bt, Dm, L], last_state)`` recording its settings. The gradient of
    ``last_state`` is part of ``selective_scan_grad`` (mamba_ssm's is not).
    """
    library, settings = selective_args(u, delta, A, B, C, D, z, delta_bias,
                                       delta_softplus=delta_softplus, reverse=reverse,
                                       return_last_state=return_last_state)
    impl = _dispatch.backend_for(backend, library)
    return record_settings(impl.selective_scan(u, delta, A, B, C, D, z, delta_bias, settings),
                           settings)


@_any_array
def selective_scan_grad(u: Array, delta: Array, A: Array, B: Array, C: Array,
                        result: SelectiveScan, *, D: Array | None = None,
                        z: Array | None = None, delta_bias: Array | None = None,
                        d_y: Array | None = None, d_last_state: Array | None = None,
                        delta_softplus: bool | None = None, reverse: bool | None = None,
                        return_last_state: bool | None = None, backend: str | None = None
                        ) -> SelectiveScanGrads:
    """Gradient of ``selective_scan`` given its ``result`` and the upstream gradients ``d_y
    [Bt, Dm, L]`` and ``d_last_state [Bt, Dm, N]`` (None: zeros; ``d_last_state`` needs a
    forward with ``return_last_state``). With ``p_t = C_t·x_t + D u_t`` and ``a_t =
    exp(Δ_t A)``, the adjoint runs backwards in run order:

        d_p_t = d_y_t silu(z_t),   d_z_t = d_y_t p_t silu'(z_t)
        g_t = C_t d_p_t + a_{t+1}∘g_{t+1},   g_last = C d_p + d_last_state
        d_u_t = D d_p_t + Σ_n g_t Δ_t B_t,   d_D = Σ_{b,t} d_p_t u_t
        d_B_t = Σ_{d in group} g_t Δ_t u_t,  d_C_t = Σ_{d in group} d_p_t x_t
        d_Δ_t = Σ_n g_t (B_t u_t + A a_t x_{t-1}),   d_A = Σ_{b,t} g_t Δ_t a_t x_{t-1}
        d_delta = d_Δ σ(delta + delta_bias) (delta_softplus; else d_Δ),
        d_delta_bias = Σ_{b,t} d_delta

    The settings are the forward's, as ``result`` records them (a contradicting value
    raises ``ValueError``). Returns ``SelectiveScanGrads(u, delta, A, B, C, D, z,
    delta_bias)`` (None for an optional array not given)."""
    given = dict(zip(_SELECTIVE_SETTINGS, (delta_softplus, reverse, return_last_state),
                     strict=True))
    upstream = {"d_y": d_y, "d_last_state": d_last_state}
    library, settings, result = selective_grad_args(u, delta, A, B, C, D, z, delta_bias,
                                                    result, upstream, given=given)
    impl = _dispatch.backend_for(backend, library)
    return impl.selective_scan_grad(u, delta, A, B, C, D, z, delta_bias, result, settings,
                                    **upstream)


@_any_array
def selective_scan_jvp(u: Array, delta: Array, A: Array, B: Array, C: Array,
                       tangents: SelectiveScanGrads | None, *, D: Array | None = None,
                       z: Array | None = None, delta_bias: Array | None = None,
                       delta_softplus: bool = False, reverse: bool = False,
                       return_last_state: bool = False, backend: str | None = None
                       ) -> tuple[SelectiveScan, SelectiveScan]:
    """Forward mode of ``selective_scan`` (docs/spec.md §12): the scan and its directional
    derivative along ``tangents`` (a ``SelectiveScanGrads`` of the inputs' tangents; None
    fields, or None: zero). The tangent runs the same recurrence,

        t_x_t = a_t∘t_x_{t-1} + a_t (t_Δ_t A + Δ_t t_A)∘x_{t-1} + t_(Δ_t B_t u_t)

    Returns ``(result, result_tangent)``, two ``SelectiveScan``s."""
    library, settings = selective_args(u, delta, A, B, C, D, z, delta_bias,
                                       delta_softplus=delta_softplus, reverse=reverse,
                                       return_last_state=return_last_state)
    tangents = selective_tangents(tangents, (u, delta, A, B, C, D, z, delta_bias), library)
    impl = _dispatch.backend_for(backend, library)
    result, t_result = impl.selective_scan_jvp(u, delta, A, B, C, D, z, delta_bias, tangents,
                                               settings)
    return record_settings(result, settings), t_result


@_any_array
def selective_scan_grad_jvp(u: Array, delta: Array, A: Array, B: Array, C: Array,
                            result: SelectiveScan, tangents: SelectiveScanGrads | None, *,
                            D: Array | None = None, z: Array | None = None,
                            delta_bias: Array | None = None, d_y: Array | None = None,
                            d_last_state: Array | None = None,
                            d_y_tangent: Array | None = None,
                            d_last_state_tangent: Array | None = None,
                            delta_softplus: bool | None = None, reverse: bool | None = None,
                            return_last_state: bool | None = None,
                            backend: str | None = None
                            ) -> tuple[SelectiveScanGrads, SelectiveScanGrads]:
    """Second order (docs/spec.md §12): the JVP of ``selective_scan_grad`` along
    ``tangents`` (the inputs' tangents, a ``SelectiveScanGrads``) and the upstream
    gradients' tangents ``d_y_tangent``, ``d_last_state_tangent`` (None: zero): every line
    of the gradient's math differentiated by the product rule
    (``gradcells.cells.selective.reference``). Returns ``(grads, grads_tangent)``, two
    ``SelectiveScanGrads``."""
    given = dict(zip(_SELECTIVE_SETTINGS, (delta_softplus, reverse, return_last_state),
                     strict=True))
    upstream = {"d_y": d_y, "d_last_state": d_last_state}
    library, settings, result = selective_grad_args(u, delta, A, B, C, D, z, delta_bias,
                                                    result, upstream, given=given)
    primals = (u, delta, A, B, C, D, z, delta_bias)
    tangents = selective_tangents(tangents, primals, library)
    upstream_t = {"d_y_tangent": d_y_tangent, "d_last_state_tangent": d_last_state_tangent}
    selective_upstream(upstream_t, u, A, settings, library)
    impl = _dispatch.backend_for(backend, library)
    return impl.selective_scan_grad_jvp(*primals, result, tangents, settings, **upstream,
                                        **upstream_t)
