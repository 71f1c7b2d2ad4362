"""The GRU on the GPU: ``gru.cu``'s fused step kernels around cuBLAS matmuls.

The matmul plan follows the reference's sequences: the input projection of all steps is one
matmul; per step only ``h·W_h`` and the fused elementwise kernels remain (reset before: two
kernels, since the candidate's matmul ``(r∘h)·W_ch`` needs r first; reset after: one, on
``h·[W_ruh, W_ch]``); after the backward loop ``dx`` is one matmul and the weight gradients
are two per weight (x part and h part); the bias gradients are column sums. A cell is the
same code with T = 1. Each operation runs on its arguments' device.

The masks (docs/spec.md §11.3, ``gradcells.reference.gru.gru_sequence``): the input mask
multiplies ``x`` once (and ``dx``); the matmuls read ``h_seen = h∘m_rec`` while the
interpolation reads ``h`` itself, so the reset-before gates kernel gets ``h_seen`` (for
``r∘h_seen``) and the candidate kernel ``h``; in the backward the matmuls' part of the carry
is masked (reset before: ``d_hr∘m_rec`` enters ``gru_backward_reset``, whose ``dr`` and
``dh`` terms then read ``h_prev``), and ``dW`` reads ``h_seen``. Zoneout is the kernels'
that form ``h`` (the mix) and ``gru_backward_candidate`` (the split: ``z∘g`` joins
``dh_direct``).

Forward mode (docs/spec.md §12, ``gru_*_jvp``: ``_jvp``) runs the forward's plan and step
objects with the tangent kernels ``gru_gates_tangent`` and ``gru_candidate_tangent`` after
each step's; the second order (``gru_*_grad_jvp``: ``_grad_jvp``) runs the backward's own
code with ``gru_backward_candidate_tangent`` (and reset before ``gru_backward_reset_tangent``)
beside each step's kernels (the step hook ``_Tangent``); what every cell's tangents share is
``gradcells.gpu._tangents``'s.
"""

from __future__ import annotations

from ..._core import plan
from ...gpu import _launch
from ...gpu._launch import Launcher, column_sum, contiguous, matmul, row_stride
from ...gpu._tangents import (
    input_tangent,
    recurrent_tangent,
    running,
    split_rows,
    state_buffers,
    upstream_pair,
    zeros_or,
)
from .spec import GRUCellGrads, GRUCellState, GRUSequence, GRUSequenceGrads, GRUWeights


def gru_cell(x, h_prev, weights, settings):
    """One GRU step; see ``gradcells.reference.gru.gru_cell``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, _ = _forward(rt, x[None], h_prev, weights, settings)
        return GRUCellState(*(a[0] for a in steps))


def gru_cell_grad(x, h_prev, weights, state, settings, *, d_r=None, d_u=None, d_c=None,
                  d_h=None):
    """Gradient of one GRU step; see ``gradcells.reference.gru.gru_cell_grad``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        d_r, d_u, d_c, d_h = (None if g is None else g[None] for g in (d_r, d_u, d_c, d_h))
        dx, dh0, dw_ru, dw_c, db_ru, db_c = _backward(
            rt, x[None], h_prev, weights, GRUCellState(*(a[None] for a in state)), settings,
            d_h=d_h, d_h_final=None, gates=(d_r, d_u, d_c))
        return GRUCellGrads(dx[0], dh0, dw_ru, dw_c, db_ru, db_c)


def gru_sequence(x, h0, weights, settings):
    """The GRU over ``x [T, B, I]``; see ``gradcells.reference.gru.gru_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, h = _forward(rt, x, h0, weights, settings)
        return GRUSequence(*steps, h_final=h.copy() if settings.seq_len is None else h)


def gru_sequence_grad(x, h0, weights, seq, settings, *, d_r=None, d_u=None, d_c=None,
                      d_h=None, d_h_final=None):
    """Backpropagation through time for ``gru_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return GRUSequenceGrads(*_backward(
            rt, x, h0, weights, _saved_steps(seq), settings, d_h=d_h, d_h_final=d_h_final,
            gates=(d_r, d_u, d_c)))


def _saved_steps(seq):
    """The steps a ``GRUSequence`` saved, a ``GRUCellState`` of ``[T, B, H]`` arrays."""
    return GRUCellState(seq.r, seq.u, seq.c, seq.h)


# --------------------------------------------------------------------------------------
# Forward


def _x_projection(xp, x, w_ru, w_c):
    """``(gx_ru, gx_c)`` as ``[T, B, ·]`` arrays (views with row stride 3H when T > 1,
    where the projection of all steps is one matmul against ``[W_rux, W_cx]``)."""
    n_steps, n_batch, n_in = x.shape
    n_hidden = w_c.shape[1]
    x_flat = plan.flat(x)
    if n_steps > 1:
        gx = (x_flat @ xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)).reshape(
            n_steps, n_batch, 3 * n_hidden)
        return gx[:, :, :2 * n_hidden], gx[:, :, 2 * n_hidden:]
    return ((x_flat @ w_ru[:n_in]).reshape(n_steps, n_batch, 2 * n_hidden),
            (x_flat @ w_c[:n_in]).reshape(n_steps, n_batch, n_hidden))


def _masks(xp, settings, n_steps, n_batch, n_hidden):
    """The kernels' ``(m_rec, z_h)`` (``_launch.sequence_mask``; None where absent)."""
    return (_launch.sequence_mask(xp, settings.recurrent_mask, (1, n_batch, n_hidden)),
            _launch.sequence_mask(xp, settings.zoneout_h, (n_steps, n_batch, n_hidden)))


def _forward(rt, x, h0, weights, settings):
    """Every step's outputs (a GRUCellState of ``[T, B, H]`` arrays) and the final h."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, plan.masked(x, settings.input_mask), lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    m_rec, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
    gx_ru, gx_c = _x_projection(xp, x, weights.w_ru, weights.w_c)
    steps = GRUCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                           for _ in GRUCellState._fields))
    h = h0.copy(order="C") if lengths is not None else xp.ascontiguousarray(h0)
    common = {"seq_len": _launch.lengths_argument(xp, lengths),
              "use_seq_len": lengths is not None, "batch": n_batch, "hidden": n_hidden}
    step = (_ResetAfterStep if settings.reset_after else _ResetBeforeStep)(
        rt, weights, n_in, n_steps, dtype, n_batch * n_hidden, common, z_h is not None)
    for t in range(n_steps):
        h_state = h if lengths is not None else steps.h[t]
        h_out = steps.h[t]
        step(t, gx_ru[t], gx_c[t], h, plan.masked(h, m_rec), _launch.at_step(z_h, t, h),
             steps.r[t], steps.u[t], steps.c[t], h_out, h_state)
        if lengths is None:
            h = h_out
    return steps, h


class _ResetAfterStep:
    """One reset-after step: ``h_seen·[W_ruh, W_ch]`` (one matmul when T > 1, viewed as its
    r, u and c blocks; two when T = 1) and the fused kernel, which interpolates with ``h``
    itself and zones with ``z`` (``use_zoneout``). ``h_seen`` is what the matmuls see
    (``h∘m_rec``)."""

    def __init__(self, rt, weights, n_in, n_steps, dtype, n, common, use_zoneout):
        xp = self.xp = rt.xp
        self.w_ruh, self.w_ch = weights.w_ru[n_in:], weights.w_c[n_in:]
        self.w_h = xp.concatenate([self.w_ruh, self.w_ch], axis=1) if n_steps > 1 else None
        self.kernel = Launcher(rt, "gru_forward_reset_after", dtype, n,
                               b_ru=xp.ascontiguousarray(weights.b_ru),
                               b_c=xp.ascontiguousarray(weights.b_c),
                               use_zoneout_h=use_zoneout, **common)

    def __call__(self, t, gx_ru, gx_c, h, h_seen, z, r, u, c, h_out, h_state):
        xp = self.xp
        if self.w_h is not None:
            n_ru = self.w_ruh.shape[1]
            gh = matmul(xp, h_seen, self.w_h)
            gh_ru, gh_c = gh[:, :n_ru], gh[:, n_ru:]
        else:
            gh_ru, gh_c = matmul(xp, h_seen, self.w_ruh), matmul(xp, h_seen, self.w_ch)
        self.kernel(gx_ru=gx_ru, ld_gx_ru=row_stride(gx_ru), gx_c=gx_c,
                    ld_gx_c=row_stride(gx_c), gh_ru=gh_ru, ld_gh_ru=row_stride(gh_ru),
                    gh_c=gh_c, ld_gh_c=row_stride(gh_c), h_prev=h, zoneout_h=z, step=t, r=r,
                    u=u, c=c, h=h_out, h_state=h_state)
        return gh_c  # the candidate's recurrent part (forward mode reads it)


class _ResetBeforeStep:
    """One reset-before step: ``h_seen·W_ruh``, the gates kernel (r, u and r∘h_seen),
    ``(r∘h_seen)·W_ch`` and the candidate kernel, which interpolates with ``h`` itself and
    zones with ``z`` (``use_zoneout``)."""

    def __init__(self, rt, weights, n_in, n_steps, dtype, n, common, use_zoneout):
        xp = self.xp = rt.xp
        self.dtype = dtype
        self.w_ruh, self.w_ch = weights.w_ru[n_in:], weights.w_c[n_in:]
        self.gates = Launcher(rt, "gru_gates", dtype, n,
                              b_ru=xp.ascontiguousarray(weights.b_ru), **common)
        self.candidate = Launcher(rt, "gru_candidate", dtype, n,
                                  b_c=xp.ascontiguousarray(weights.b_c),
                                  use_zoneout_h=use_zoneout, **common)

    def __call__(self, t, gx_ru, gx_c, h, h_seen, z, r, u, c, h_out, h_state):
        xp = self.xp
        rh = xp.empty(h.shape, dtype=self.dtype)
        gh_ru = matmul(xp, h_seen, self.w_ruh)
        self.gates(gx_ru=gx_ru, ld_gx_ru=row_stride(gx_ru), gh_ru=gh_ru,
                   ld_gh_ru=row_stride(gh_ru), h_prev=h_seen, step=t, r=r, u=u, rh=rh)
        gh_c = matmul(xp, rh, self.w_ch)
        self.candidate(gx_c=gx_c, ld_gx_c=row_stride(gx_c), gh_c=gh_c,
                       ld_gh_c=row_stride(gh_c), u=u, h_prev=h, zoneout_h=z, step=t, c=c,
                       h=h_out, h_state=h_state)
        return rh  # the candidate matmul's input (forward mode reads it)


# --------------------------------------------------------------------------------------
# Backward


def _backward(rt, x, h0, weights, steps, settings, *, d_h, d_h_final, gates=(None,) * 3,
              tangent=None):
    """Backpropagation through time; returns the fields of GRUSequenceGrads (``gates``: the
    gates' upstream gradients ``(d_r, d_u, d_c)``, each ``[T, B, H]`` or None; ``tangent``:
    ``_backward_steps``'s step hook)."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, plan.masked(x, settings.input_mask), lengths)
    r, u, c, h = (xp.ascontiguousarray(a) for a in steps)
    d_h, d_h_final = contiguous(xp, d_h), contiguous(xp, d_h_final)
    h_prev = _launch.previous(xp, h0, h)
    masks = _masks(xp, settings, *h.shape)
    h_seen = plan.masked(h_prev, masks[0])  # what the matmuls saw
    d_gates, d_n, rh, dh0 = _backward_steps(
        rt, x, h0, weights, settings, lengths, (r, u, c, h_prev, h_seen), masks,
        upstream=(d_h, d_h_final, tuple(contiguous(xp, g) for g in gates)), tangent=tangent)
    if rh is not None:  # the kernel's r∘h_prev; the matmul saw r∘h_seen
        rh = plan.masked(rh, masks[0])
    dx, dw_ru, dw_c, db_ru, db_c = _weight_grads(rt, x, weights, h_seen, d_gates, d_n, rh)
    dx = plan.running_inputs(xp, plan.masked(dx, settings.input_mask), lengths)
    return dx, dh0, dw_ru, dw_c, db_ru, db_c


def _backward_steps(rt, x, h0, weights, settings, lengths, steps, masks, *, upstream,
                    tangent=None):
    """The backward loop over ``steps = (r, u, c, h_prev, h_seen)`` (``h_seen``: what the
    matmuls saw, ``h_prev∘m_rec``): every step's gate gradients
    ``[T, B, 3H]`` (dR, dU, dC), reset after ``dN = dL/dn`` (else None), reset before
    ``r∘h_prev`` (else None), and ``dL/dh0``. ``upstream = (d_h, d_h_final, (d_r, d_u,
    d_c))``, C-contiguous or None; the gates' own join the gate gradients after the step's
    kernels (``_Gates``: reset before ``d_r`` after ``gru_backward_reset``). The masks
    ``(m_rec, z_h)`` (``_masks``): the matmuls saw ``h_seen``, so their part of the carry is
    masked (reset before: ``d_hr∘m_rec`` enters ``gru_backward_reset``, which then reads
    ``h_prev`` itself); the candidate kernel splits the zoned h's gradient. ``tangent(t,
    dh_next_a, (d_gates, d_n, rh, n_pre), d_hr, dh_direct)`` (second order: ``_Tangent``),
    when given, runs at the end of each step: the carry's matmul part the step's kernel
    read (None on the first step back), the arrays above (written from step t on; ``n_pre
    = h_seen·W_ch`` reset after), reset before the step's masked ``d_hr`` (else None), and
    the carry's direct part after the step."""
    xp = rt.xp
    r, u, c, h_prev, h_seen = steps
    m_rec, z_h = masks
    (n_steps, n_batch, n_in), n_hidden = x.shape, h0.shape[1]
    reset_after, d_h = settings.reset_after, upstream[0]
    w_ruh, w_ch = weights.w_ru[n_in:], weights.w_c[n_in:]
    shape = (n_steps, n_batch, n_hidden)
    d_gates, n_pre, d_n, rh = _backward_buffers(xp, h_seen, w_ch, shape, x.dtype, reset_after)
    dh_direct = xp.empty((n_batch, n_hidden), dtype=x.dtype)  # carry: dh∘u (+ d_hr∘r)
    dh_recurrent = None  # carry: the matmul part of dL/dh_prev
    placeholder = xp.ascontiguousarray(weights.b_c)
    candidate, reset, gates = _backward_kernels(rt, placeholder, dh_direct, upstream, shape,
                                                settings, lengths, z_h is not None)
    d_hr = None
    for t in reversed(range(n_steps)):
        dh_next_a = dh_recurrent
        at = {"r": r[t], "u": u[t], "c": c[t], "d_gates": d_gates[t],
              "n_pre": n_pre[t] if reset_after else placeholder,
              "d_n": d_n[t] if reset_after else placeholder}
        candidate(**at, h_prev=h_prev[t], d_h=placeholder if d_h is None else d_h[t],
                  dh_next_a=placeholder if dh_recurrent is None else dh_recurrent, step=t,
                  zoneout_h=_launch.at_step(z_h, t, placeholder),
                  rh=placeholder if reset_after else rh[t])
        gates(t, "r, u, c" if reset_after else "u, c", **at)
        if reset_after:
            dh_recurrent = matmul(xp, d_gates[t][:, :2 * n_hidden], w_ruh.T)
            dh_recurrent += d_n[t] @ w_ch.T
        else:
            d_hr = plan.masked(matmul(xp, d_gates[t][:, 2 * n_hidden:], w_ch.T), m_rec)
            reset(d_hr=d_hr, r=r[t], h_prev=h_prev[t], d_gates=d_gates[t])
            gates(t, "r", **at)
            dh_recurrent = matmul(xp, d_gates[t][:, :2 * n_hidden], w_ruh.T)
        dh_recurrent = plan.masked(dh_recurrent, m_rec)
        if tangent is not None:
            tangent(t, dh_next_a, (d_gates, d_n, rh, n_pre), d_hr, dh_direct)
    if n_steps == 0:
        dh0 = xp.zeros_like(h0) if upstream[1] is None else upstream[1].copy()
    else:
        dh0 = dh_recurrent + dh_direct
    return d_gates, d_n, rh, dh0


def _backward_kernels(rt, b_c, dh_direct, upstream, shape, settings, lengths, use_zoneout):
    """The backward loop's launchers: ``gru_backward_candidate``, ``gru_backward_reset``
    and the gates' ``_Gates`` (``b_c``: the bias, also the placeholder of absent arrays)."""
    xp, dtype = rt.xp, b_c.dtype
    n_steps, n_batch, n_hidden = shape
    d_h, d_h_final, gates = upstream
    common = {"seq_len": _launch.lengths_argument(xp, lengths), "b_c": b_c,
              "reset_after": settings.reset_after, "use_seq_len": lengths is not None,
              "batch": n_batch, "hidden": n_hidden}
    candidate = Launcher(
        rt, "gru_backward_candidate", dtype, n_batch * n_hidden,
        d_h_final=b_c if d_h_final is None else d_h_final, dh_next_b=dh_direct,
        has_d_h=d_h is not None, has_d_h_final=d_h_final is not None,
        use_zoneout_h=use_zoneout, n_steps=n_steps, dh_direct=dh_direct, **common)
    reset = Launcher(rt, "gru_backward_reset", dtype, n_batch * n_hidden, batch=n_batch,
                     hidden=n_hidden, dh_direct=dh_direct)
    given = dict(zip(("d_r", "d_u", "d_c"), gates, strict=True))
    return candidate, reset, _Gates(rt, "gru_backward_gates", given, common)


_PARTS = {"r, u, c": (True, True, True), "u, c": (False, True, True), "r": (True, False, False)}


class _Gates:
    """The gates' own upstream gradients (docs/spec.md §16.1) added to a step's gate
    gradients, ``gru_backward_gates`` (or, ``name``, its tangent's kernel): ``given`` maps
    the kernel's gate arguments (``d_r``, ``d_u``, ``d_c`` and their tangents ``d_r_t``,
    ...) to ``[T, B, H]`` arrays or None (a pair is both or neither: ``upstream_pair``);
    ``fixed`` the kernel's other arguments that stay. Called with a step, the gates of
    that step to add (a key of ``_PARTS``) and the step's arrays, it launches the kernel;
    nothing when no gate of the part is given, so a gradient without them does no more
    work than before."""

    def __init__(self, rt, name, given, fixed):
        self.arrays = {k: a for k, a in given.items() if a is not None}
        self.has = tuple(given[f"d_{g}"] is not None for g in "ruc")
        self.kernel = None
        if any(self.has):
            dtype = next(iter(self.arrays.values())).dtype
            n = fixed["batch"] * fixed["hidden"]
            self.kernel = Launcher(rt, name, dtype, n, **{k: fixed["b_c"] for k in given},
                                   **fixed)

    def __call__(self, t, part, **arrays):
        has = tuple(h and wanted for h, wanted in zip(self.has, _PARTS[part], strict=True))
        if self.kernel is None or not any(has):
            return
        self.kernel(**{k: a[t] for k, a in self.arrays.items()}, **arrays, step=t,
                    has_d_r=has[0], has_d_u=has[1], has_d_c=has[2])


def _backward_buffers(xp, h_seen, w_ch, shape, dtype, reset_after):
    """The backward loop's outputs ``(d_gates, n_pre, d_n, rh)``: ``d_gates [T, B, 3H]``
    (dR, dU, dC); reset after ``n_pre = h_seen·W_ch`` (n - b_ch, every step at once) and
    ``dN = dL/dn``, else both None; reset before ``r∘h_prev`` (the input of the h-rows of
    ``w_c``), else None."""
    n_steps, n_batch, n_hidden = shape
    d_gates = xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype)
    if reset_after:
        n_pre = matmul(xp, plan.flat(h_seen), w_ch).reshape(shape)
        return d_gates, n_pre, xp.empty(shape, dtype=dtype), None
    return d_gates, None, None, xp.empty(shape, dtype=dtype)


def _weight_grads(rt, x, weights, h_prev, d_gates, d_n, rh):
    """``(dx, dw_ru, dw_c, db_ru, db_c)`` from the gate gradients: ``dx`` one matmul (two
    when T = 1), each weight gradient its x part and its h part, the biases column sums."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    w_ru, w_c = weights.w_ru, weights.w_c
    n_hidden = w_c.shape[1]
    d_gates_flat = plan.flat(d_gates)
    d_ru_flat, d_c_flat = d_gates_flat[:, :2 * n_hidden], d_gates_flat[:, 2 * n_hidden:]
    if n_steps > 1:
        w_x = xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)
        dx_flat = d_gates_flat @ w_x.T
    else:
        dx_flat = d_ru_flat @ w_ru[:n_in].T + d_c_flat @ w_c[:n_in].T
    dw_x = plan.flat(x).T @ d_gates_flat
    dw_ru = xp.empty((n_in + n_hidden, 2 * n_hidden), dtype=x.dtype)
    dw_c = xp.empty((n_in + n_hidden, n_hidden), dtype=x.dtype)
    dw_ru[:n_in] = dw_x[:, :2 * n_hidden]
    dw_c[:n_in] = dw_x[:, 2 * n_hidden:]
    h_prev_flat = plan.flat(h_prev)
    xp.matmul(h_prev_flat.T, d_ru_flat, out=dw_ru[n_in:])
    sums = column_sum(rt, d_gates_flat)
    if d_n is not None:  # reset after
        xp.matmul(h_prev_flat.T, plan.flat(d_n), out=dw_c[n_in:])
        db_c = xp.concatenate([sums[2 * n_hidden:], column_sum(rt, plan.flat(d_n))])
    else:
        xp.matmul(plan.flat(rh).T, d_c_flat, out=dw_c[n_in:])
        db_c = sums[2 * n_hidden:]
    return dx_flat.reshape(n_steps, n_batch, n_in), dw_ru, dw_c, sums[:2 * n_hidden], db_c


# --------------------------------------------------------------------------------------
# Forward mode (docs/spec.md §12)


def gru_cell_jvp(x, h_prev, weights, tangents, settings):
    """One GRU step and its tangent along ``tangents`` (a ``GRUCellGrads``, None fields
    zero); see ``gradcells.reference.gru.gru_cell_jvp``. The primal is ``gru_cell``'s."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, _, t_steps, _ = _jvp(rt, x[None], None if tangents.x is None else
                                    tangents.x[None], h_prev, tangents.h_prev, weights,
                                    _weight_tangents(tangents), settings)
        return GRUCellState(*(a[0] for a in steps)), GRUCellState(*(a[0] for a in t_steps))


def gru_sequence_jvp(x, h0, weights, tangents, settings):
    """``gru_sequence`` and its tangent along ``tangents`` (a ``GRUSequenceGrads``, None
    fields zero); see ``gradcells.reference.gru.gru_sequence_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, h, t_steps, t_h = _jvp(rt, x, tangents.x, h0, tangents.h0, weights,
                                     _weight_tangents(tangents), settings)
        copy = settings.seq_len is None
        return (GRUSequence(*steps, h_final=h.copy() if copy else h),
                GRUSequence(*t_steps, h_final=t_h.copy() if copy else t_h))


def _gru_input_tangents(xp, x, t_x, weights, t_weights, reset_after):
    """The tangents of the gates' and the candidate's input parts, ``[T, B, 2H]`` and
    ``[T, B, H]`` (their biases' tangents in them), and the recurrent parts' weight and
    bias tangents ``(t_w_ruh, t_w_ch, t_b_ch)`` (None: zero; ``t_b_ch`` reset after only)."""
    n_in, n_hidden = x.shape[2], weights.w_c.shape[1]
    (t_w_rux, t_w_ruh), (t_w_cx, t_w_ch) = (split_rows(t_weights.w_ru, n_in),
                                            split_rows(t_weights.w_c, n_in))
    t_b_cx, t_b_ch = t_weights.b_c, None
    if reset_after and t_weights.b_c is not None:
        t_b_cx, t_b_ch = t_weights.b_c[:n_hidden], t_weights.b_c[n_hidden:]
    return (input_tangent(xp, x, t_x, weights.w_ru[:n_in], t_w_rux, t_weights.b_ru,
                          2 * n_hidden),
            input_tangent(xp, x, t_x, weights.w_c[:n_in], t_w_cx, t_b_cx, n_hidden),
            (t_w_ruh, t_w_ch, t_b_ch))


def _candidate_recurrent_tangent(xp, h_seen, t_h_seen, w_ch, t_w_ch, t_b_ch, reset_after):
    """Reset after, ``t_n = t_h_seen·W_ch + h_seen·t_W_ch + t_b_ch`` (before the step: the state
    buffer is updated in it); reset before None (its input is the step's ``r∘h_seen``)."""
    if not reset_after:
        return None
    t_n = recurrent_tangent(xp, h_seen, t_h_seen, w_ch, t_w_ch)
    if t_b_ch is not None:
        t_n += t_b_ch
    return t_n


def _jvp(rt, x, t_x, h0, t_h0, weights, t_weights, settings):
    """The GRU over ``x [T, B, I]`` and its tangent: ``(steps, h_final, t_steps,
    t_h_final)``, ``steps`` and ``t_steps`` GRUCellStates of ``[T, B, H]`` arrays; the
    primal is ``_forward``'s (its step objects and kernels). Per step,
    after the primal step's kernels: ``gru_gates_tangent`` (t_r, t_u and, reset before, the
    tangent of ``r∘h_seen``), the candidate's recurrent tangent matmul, then
    ``gru_candidate_tangent`` (t_c and t_h)."""
    xp = rt.xp
    reset_after = settings.reset_after
    lengths = _launch.lengths(xp, settings.seq_len)
    x, t_x = running(xp, x, settings, lengths), running(xp, t_x, settings, lengths)
    (n_steps, n_batch, n_in), n_hidden, dtype = x.shape, h0.shape[1], x.dtype
    w_ruh, w_ch = weights.w_ru[n_in:], weights.w_c[n_in:]
    m_rec, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
    gx_ru, gx_c = _x_projection(xp, x, weights.w_ru, weights.w_c)
    t_gx_ru, t_gx_c, (t_w_ruh, t_w_ch, t_b_ch) = _gru_input_tangents(xp, x, t_x, weights,
                                                                     t_weights, reset_after)
    steps, t_steps = (GRUCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                                     for _ in GRUCellState._fields)) for _ in range(2))
    h, t_h = state_buffers(xp, h0, t_h0, lengths)
    n = n_batch * n_hidden
    common = {"seq_len": _launch.lengths_argument(xp, lengths),
              "use_seq_len": lengths is not None, "batch": n_batch, "hidden": n_hidden}
    step = (_ResetAfterStep if reset_after else _ResetBeforeStep)(
        rt, weights, n_in, n_steps, dtype, n, common, z_h is not None)
    gates = Launcher(rt, "gru_gates_tangent", dtype, n, **common)
    candidate = Launcher(rt, "gru_candidate_tangent", dtype, n,
                         b_c=xp.ascontiguousarray(weights.b_c), reset_after=reset_after,
                         use_zoneout_h=z_h is not None, **common)
    t_rh = xp.empty((n_batch, n_hidden), dtype=dtype)
    for t in range(n_steps):
        # The primal step updates the state buffer in place (with lengths): keep h_prev.
        h_prev = h.copy() if lengths is not None else h
        h_seen, t_h_seen = plan.masked(h_prev, m_rec), plan.masked(t_h, m_rec)
        t_ru = t_gx_ru[t] + recurrent_tangent(xp, h_seen, t_h_seen, w_ruh, t_w_ruh)
        t_n = _candidate_recurrent_tangent(xp, h_seen, t_h_seen, w_ch, t_w_ch, t_b_ch,
                                           reset_after)
        h_state = h if lengths is not None else steps.h[t]
        z = _launch.at_step(z_h, t, h)
        saved = step(t, gx_ru[t], gx_c[t], h, plan.masked(h, m_rec), z, steps.r[t],
                     steps.u[t], steps.c[t], steps.h[t], h_state)
        gates(r=steps.r[t], u=steps.u[t], d_ru=xp.ascontiguousarray(t_ru),
              h_seen=xp.ascontiguousarray(h_seen), dh_seen=xp.ascontiguousarray(t_h_seen),
              step=t, dr=t_steps.r[t], du=t_steps.u[t], d_rh=t_rh)
        # saved: reset after the forward's gh_c; reset before its r∘h_seen, what
        # (r∘h_seen)·W_ch saw
        t_gh_c = t_n if reset_after else recurrent_tangent(xp, saved, t_rh, w_ch, t_w_ch)
        gh_c = saved if reset_after else t_gh_c
        candidate(r=steps.r[t], u=steps.u[t], c=steps.c[t], h_prev=h_prev, dr=t_steps.r[t],
                  du=t_steps.u[t], dgx_c=t_gx_c[t], dgh_c=xp.ascontiguousarray(t_gh_c),
                  gh_c=gh_c, ld_gh_c=_launch.row_stride(gh_c), step=t, dh_prev=t_h,
                  zoneout_h=z, dc=t_steps.c[t], dh=t_steps.h[t],
                  dh_state=t_steps.h[t] if lengths is None else t_h)
        if lengths is None:
            h, t_h = steps.h[t], t_steps.h[t]
    return steps, h, t_steps, t_h


def _weight_tangents(tangents):
    """The weights' tangents of a ``GRUCellGrads`` or ``GRUSequenceGrads``, a
    ``GRUWeights`` (None fields zero)."""
    return GRUWeights(tangents.w_ru, tangents.w_c, tangents.b_ru, tangents.b_c)


# --------------------------------------------------------------------------------------
# Second order (docs/spec.md §12)


def gru_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_r=None, d_u=None,
                      d_c=None, d_h=None, d_r_tangent=None, d_u_tangent=None,
                      d_c_tangent=None, d_h_tangent=None):
    """The JVP of ``gru_cell_grad`` along ``tangents`` (a ``GRUCellGrads``, None fields
    zero) and the upstream gradients' tangents: ``(grads, grads_tangent)``, ``grads``
    ``gru_cell_grad``'s; see ``gradcells.reference.gru.gru_cell_grad_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        xp = rt.xp
        d_h, t_d_h = (None if a is None else a[None]
                      for a in upstream_pair(xp, d_h, d_h_tangent, state.h))
        gates = _gate_pairs(xp, (d_r, d_u, d_c), (d_r_tangent, d_u_tangent, d_c_tangent),
                            state.h)
        pairs = _grad_jvp(
            rt, x[None], h_prev, weights, GRUCellState(*(a[None] for a in state)),
            GRUSequenceGrads(*tangents)._replace(
                x=None if tangents.x is None else tangents.x[None]), settings,
            (d_h, t_d_h, None, None,
             {k: None if a is None else a[None] for k, a in gates.items()}))
        return tuple(GRUCellGrads(dx[0], *rest) for dx, *rest in pairs)


def gru_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_r=None, d_u=None,
                          d_c=None, d_h=None, d_h_final=None, d_r_tangent=None,
                          d_u_tangent=None, d_c_tangent=None, d_h_tangent=None,
                          d_h_final_tangent=None):
    """The JVP of ``gru_sequence_grad`` along ``tangents`` (a ``GRUSequenceGrads``, None
    fields zero) and the upstream gradients' tangents: ``(grads, grads_tangent)``, ``grads``
    ``gru_sequence_grad``'s; see ``gradcells.reference.gru.gru_sequence_grad_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        xp = rt.xp
        upstream = (*upstream_pair(xp, d_h, d_h_tangent, seq.h),
                    *upstream_pair(xp, d_h_final, d_h_final_tangent, seq.h_final),
                    _gate_pairs(xp, (d_r, d_u, d_c), (d_r_tangent, d_u_tangent, d_c_tangent),
                                seq.h))
        pairs = _grad_jvp(rt, x, h0, weights, _saved_steps(seq), tangents, settings,
                          upstream)
        return tuple(GRUSequenceGrads(*fields) for fields in pairs)


def _gate_pairs(xp, gates, tangents, like):
    """The gates' upstream gradients and their tangents by ``gru_backward_gates_tangent``'s
    names (``d_r``, ``d_r_t``, ...): ``upstream_pair``s (zeros for the missing one of a
    given pair; None for neither) of arrays shaped as ``like``."""
    pairs = {}
    for name, g, t_g in zip(("d_r", "d_u", "d_c"), gates, tangents, strict=True):
        pairs[name], pairs[f"{name}_t"] = upstream_pair(xp, g, t_g, like)
    return pairs


def _grad_jvp(rt, x, h0, weights, steps, tangents, settings, upstream):
    """``gru_sequence_grad`` from the saved steps ``(r, u, c, h)`` and its tangent along
    ``tangents`` (a ``GRUSequenceGrads`` of ``[T, B, ·]`` x tangents,
    None fields zero) and ``upstream = (d_h, t_d_h, d_h_final, t_d_h_final, gates)``
    (``upstream_pair``s; ``gates``: ``_gate_pairs``'s): two lists of the fields of
    GRUSequenceGrads. The primal is ``_backward``'s, with ``_Tangent`` as its step hook;
    the saved steps' tangents are ``_jvp``'s."""
    xp = rt.xp
    t_x = tangents.x
    d_h, t_d_h, d_h_final, t_d_h_final, _ = upstream
    t_h0 = zeros_or(xp, tangents.h0, h0)
    t_weights = GRUWeights(*(zeros_or(xp, t, w) for t, w in zip(_weight_tangents(tangents),
                                                                 weights, strict=True)))
    t_steps = _jvp(rt, x, t_x, h0, t_h0, weights, t_weights, settings)[2]
    hook = _Tangent(rt, x, t_x, h0, t_h0, weights, t_weights, steps, t_steps, settings,
                       upstream)
    grads = _backward(rt, x, h0, weights, steps, settings, d_h=d_h, d_h_final=d_h_final,
                      gates=tuple(upstream[4][f"d_{g}"] for g in "ruc"), tangent=hook)
    if hook.carry is None:  # T = 0
        t_dh0 = xp.zeros_like(h0) if t_d_h_final is None else t_d_h_final.copy()
        d_gates, d_n, rh = hook.t_d_gates, hook.t_d_n, hook.t_rh  # empty
    else:
        t_dh0 = hook.carry + hook.t_dh_direct
        d_gates, d_n, rh = hook.primal
    m_rec = hook.m_rec
    rh, t_rh = (None, None) if rh is None else (plan.masked(rh, m_rec),
                                                plan.masked(hook.t_rh, m_rec))
    t_dx, t_dw_ru, t_dw_c, t_db_ru, t_db_c = _weight_grads(
        rt, hook.x, weights, hook.h_seen, hook.t_d_gates, hook.t_d_n, rh)
    t_dx_w, t_dw_ru_w, t_dw_c_w, _, _ = _weight_grads(rt, hook.t_x, t_weights, hook.t_seen,
                                                      d_gates, d_n, t_rh)
    t_dx = plan.running_inputs(xp, plan.masked(t_dx + t_dx_w, settings.input_mask),
                               hook.lengths)
    return list(grads), [t_dx, t_dh0, t_dw_ru + t_dw_ru_w, t_dw_c + t_dw_c_w, t_db_ru, t_db_c]


class _Tangent:
    """``_backward_steps``'s step hook: at the end of step t,
    ``gru_backward_candidate_tangent`` (on the carry that step's kernel read: its matmul
    part, and the direct part kept from step t + 1 in ``direct``, since the kernel writes
    its own over it), reset before the tangent of ``d_hr``, ``(dC'·W_chᵀ + dC·W_ch'ᵀ)∘m_rec``,
    and ``gru_backward_reset_tangent``, then the tangent carry ``([dR', dU']·W_ruhᵀ +
    [dR, dU]·W_ruh'ᵀ (+ dN'·W_chᵀ + dN·W_ch'ᵀ reset after))∘m_rec``, kept in ``carry``
    (its direct part in ``t_dh_direct``). Built from the call's arrays: the inputs and
    states as the matmuls saw them (``x``, ``h_seen`` and their tangents), the saved steps
    and theirs, reset after ``n_pre``'s tangent ``h_seen'·W_ch + h_seen·W_ch' + b_ch'``."""

    def __init__(self, rt, x, t_x, h0, t_h0, weights, t_weights, steps, t_steps, settings,
                 upstream):

        xp = self.xp = rt.xp
        self.reset_after = reset_after = settings.reset_after
        self.lengths = lengths = _launch.lengths(xp, settings.seq_len)
        self.x = running(xp, x, settings, lengths)
        self.t_x = running(xp, zeros_or(xp, t_x, x), settings, lengths)
        n_steps, n_batch, n_in = self.x.shape
        n_hidden = h0.shape[1]
        shape, dtype = (n_steps, n_batch, n_hidden), x.dtype
        self.m_rec, self.z_h = _masks(xp, settings, *shape)
        self.steps = GRUCellState(*(xp.ascontiguousarray(a) for a in steps))
        self.t_steps = t_steps
        self.h_prev = _launch.previous(xp, h0, self.steps.h)
        self.t_prev = _launch.previous(xp, t_h0, t_steps.h)
        self.h_seen = plan.masked(self.h_prev, self.m_rec)
        self.t_seen = plan.masked(self.t_prev, self.m_rec)
        self.w_ruh, self.w_ch = weights.w_ru[n_in:], weights.w_c[n_in:]
        self.t_w_ruh, self.t_w_ch = t_weights.w_ru[n_in:], t_weights.w_c[n_in:]
        self.t_n_pre = None
        if reset_after:
            self.t_n_pre = recurrent_tangent(xp, plan.flat(self.h_seen),
                                             plan.flat(self.t_seen), self.w_ch, self.t_w_ch)
            self.t_n_pre = (self.t_n_pre + t_weights.b_c[n_hidden:]).reshape(shape)
        self.t_d_gates = xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype)
        self.t_d_n = xp.empty(shape, dtype=dtype) if reset_after else None
        self.t_rh = None if reset_after else xp.empty(shape, dtype=dtype)
        self.t_dh_direct = xp.empty((n_batch, n_hidden), dtype=dtype)
        self.d_h, self.t_d_h = upstream[:2]
        self.carry = self.direct = self.primal = None
        self.placeholder = xp.ascontiguousarray(weights.b_c)
        self.candidate, self.reset, self.gates = _tangent_kernels(
            rt, self.placeholder, self.t_dh_direct, upstream, shape, settings, lengths,
            self.z_h is not None)

    def __call__(self, t, dh_next_a, arrays, d_hr, dh_direct):
        xp, placeholder, ra = self.xp, self.placeholder, self.reset_after
        d_gates, d_n, rh, n_pre = arrays
        self.primal = (d_gates, d_n, rh)
        (r, u, c, _), (t_r, t_u, t_c, _) = self.steps, self.t_steps
        given = self.d_h is not None

        def either(a):
            return placeholder if a is None else a

        self.candidate(
            r=r[t], u=u[t], c=c[t], h_prev=self.h_prev[t], r_t=t_r[t], u_t=t_u[t], c_t=t_c[t],
            h_prev_t=self.t_prev[t], n_pre=n_pre[t] if ra else placeholder,
            n_pre_t=self.t_n_pre[t] if ra else placeholder,
            d_h=self.d_h[t] if given else placeholder,
            d_h_t=self.t_d_h[t] if given else placeholder, dh_next_a=either(dh_next_a),
            dh_next_b=either(self.direct), dh_next_a_t=either(self.carry), step=t,
            zoneout_h=_launch.at_step(self.z_h, t, placeholder), d_gates_t=self.t_d_gates[t],
            d_n_t=self.t_d_n[t] if ra else placeholder, rh_t=placeholder if ra else self.t_rh[t])
        at = {"r": r[t], "u": u[t], "c": c[t], "r_t": t_r[t], "u_t": t_u[t], "c_t": t_c[t],
              "n_pre": n_pre[t] if ra else placeholder,
              "n_pre_t": self.t_n_pre[t] if ra else placeholder,
              "d_gates_t": self.t_d_gates[t], "d_n_t": self.t_d_n[t] if ra else placeholder}
        self.gates(t, "r, u, c" if ra else "u, c", **at)
        n_ru = self.w_ruh.shape[1]
        t_d_gates = self.t_d_gates[t]
        if not ra:
            t_d_hr = plan.masked(recurrent_tangent(xp, d_gates[t][:, n_ru:],
                                                   t_d_gates[:, n_ru:], self.w_ch.T,
                                                   self.t_w_ch.T), self.m_rec)
            self.reset(d_hr=d_hr, d_hr_t=xp.ascontiguousarray(t_d_hr), r=r[t], r_t=t_r[t],
                       h_prev=self.h_prev[t], h_prev_t=self.t_prev[t], d_gates_t=t_d_gates)
            self.gates(t, "r", **at)
        carry = recurrent_tangent(xp, d_gates[t][:, :n_ru], t_d_gates[:, :n_ru], self.w_ruh.T,
                                  self.t_w_ruh.T)
        if ra:
            carry += recurrent_tangent(xp, d_n[t], self.t_d_n[t], self.w_ch.T, self.t_w_ch.T)
        self.carry = plan.masked(carry, self.m_rec)
        self.direct = dh_direct.copy()


def _tangent_kernels(rt, b_c, t_dh_direct, upstream, shape, settings, lengths, use_zoneout):
    """``_Tangent``'s launchers: ``gru_backward_candidate_tangent``,
    ``gru_backward_reset_tangent`` and the gates' ``_Gates`` of
    ``gru_backward_gates_tangent`` (``upstream = (d_h, t_d_h, d_h_final, t_d_h_final,
    gates)``, ``gates`` by the kernel's names; ``b_c`` also the placeholder)."""
    xp, dtype = rt.xp, b_c.dtype
    n_steps, n_batch, n_hidden = shape
    d_h, _, d_h_final, t_d_h_final, gates = upstream
    n = n_batch * n_hidden
    common = {"seq_len": _launch.lengths_argument(xp, lengths), "b_c": b_c,
              "reset_after": settings.reset_after, "use_seq_len": lengths is not None,
              "batch": n_batch, "hidden": n_hidden}
    candidate = Launcher(
        rt, "gru_backward_candidate_tangent", dtype, n,
        d_h_final=b_c if d_h_final is None else d_h_final,
        d_h_final_t=b_c if t_d_h_final is None else t_d_h_final,
        has_d_h=d_h is not None, has_d_h_final=d_h_final is not None,
        use_zoneout_h=use_zoneout, n_steps=n_steps, dh_next_b_t=t_dh_direct,
        dh_direct_t=t_dh_direct, **common)
    reset = Launcher(rt, "gru_backward_reset_tangent", dtype, n, batch=n_batch,
                     hidden=n_hidden, dh_direct_t=t_dh_direct)
    return candidate, reset, _Gates(rt, "gru_backward_gates_tangent", gates, common)
