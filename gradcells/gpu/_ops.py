"""The GPU backend's operations, written against a runtime: ``rt.xp`` (the array namespace),
``rt.policy`` (launch shapes) and ``rt.launch(binding, grid, block, args)`` (a
``_kernels.Binding`` and the argument tuple it built).

On the GPU the runtime is CuPy with the kernels compiled by NVRTC (``_cupy_runtime``); in
the emulation tests it is NumPy with the same kernel source compiled for the CPU, so every
line here (the matmul plan, the step loops, the kernel arguments) runs in CI without a GPU.

The matmul plan follows ``gradcells.reference.sequences``: the input projection of all
steps is one matmul; per step only ``h·W_h`` (GRU reset-before: ``h·W_ruh`` and
``(r∘h)·W_ch``) and one fused elementwise kernel remain; after the backward loop ``dx`` is
one matmul and the weight gradients are two (x part and h part); bias and peephole
gradients are column sums (the ``column_sum`` kernel, deterministic, accumulating in the
arithmetic type). A cell is the same code with T = 1.
"""

from __future__ import annotations

from .._types import (
    GRUCellGrads,
    GRUCellState,
    GRUSequence,
    GRUSequenceGrads,
    LSTMCellGrads,
    LSTMCellState,
    LSTMSequence,
    LSTMSequenceGrads,
)
from . import _kernels


class _Launcher:
    """One kernel, launched over ``n`` elements once per step: the binding, the launch shape
    and the arguments that stay the same from step to step are settled once."""

    def __init__(self, rt, name, dtype, n, **fixed):
        self.rt = rt
        self.binding = _kernels.binding(_kernels.KERNELS[name], (dtype,))
        self.shape = _kernels.elementwise_shape(n, rt.policy) if n else None
        self.values = fixed

    def __call__(self, **changing):
        if self.shape is None:  # nothing to do (and a grid of 0 blocks is an error)
            return
        self.values.update(changing)
        self.rt.launch(self.binding, *self.shape, self.binding.arguments(self.values))


def _column_sum(rt, a):
    """Σ over the rows of a C-contiguous ``[rows, cols]`` array, as ``[cols]``."""
    xp = rt.xp
    rows, cols = a.shape
    dtype = a.dtype
    out = xp.empty(cols, dtype=dtype)
    if cols == 0:
        return out
    kernel = _kernels.KERNELS["column_sum"]
    parts, rows_per_part = _kernels.column_sum_plan(rows, cols, rt.policy)
    if parts == 1:
        passes = [(a, rows, rows_per_part, out)]
    else:
        partial = xp.empty((parts, cols), dtype=_kernels.COMPUTE_DTYPE[dtype])
        passes = [(a, rows, rows_per_part, partial), (partial, parts, parts, out)]
    for source, n_rows, per_part, target in passes:
        n_parts = 1 if target is out else parts
        grid, block = _kernels.column_sum_shape(cols, n_parts, rt.policy)
        binding = _kernels.binding(kernel, (source.dtype, target.dtype))
        rt.launch(binding, grid, block, binding.arguments(
            {"in": source, "rows": n_rows, "cols": cols, "rows_per_part": per_part,
             "parts": n_parts, "out": target}))
    return out


def _contiguous(xp, a):
    return None if a is None else xp.ascontiguousarray(a)


def _matmul(xp, a, b):
    """``a·b`` as a C-contiguous array (kernels index it densely)."""
    return xp.ascontiguousarray(a @ b)


def _lengths(xp, seq_len):
    """``seq_len`` as a contiguous int32 array on the device, or None."""
    return None if seq_len is None else xp.ascontiguousarray(xp.asarray(seq_len), dtype=xp.int32)


def _running_inputs(xp, x, lengths):
    """``x`` with every step past its row's length zeroed (``x`` itself without lengths), so
    that padding is never read: NaN or inf there would reach the input projection and
    ``dW_x = x_flatᵀ·dG`` (0·NaN is NaN), though those steps' outputs are discarded and their
    gate gradients are zero."""
    if lengths is None:
        return x
    running = xp.arange(x.shape[0])[:, None] < lengths[None, :]
    return xp.where(running[:, :, None], x, xp.zeros((), dtype=x.dtype))


def _no_lengths(xp):
    return xp.empty(0, dtype=xp.int32)


def _previous(xp, first, steps):
    """``[first, steps[0], ..., steps[T-2]]`` as a contiguous ``[T, B, H]`` array."""
    if steps.shape[0] == 0:
        return xp.empty_like(steps)
    if steps.shape[0] == 1:
        return xp.ascontiguousarray(first)[None]
    return xp.concatenate([first[None], steps[:-1]], axis=0)


def _flat(a):
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2])


# --------------------------------------------------------------------------------------
# LSTM


def _lstm_forward(rt, x, cs0, h0, w, b, wci, wcf, wco, forget_bias, cell_clip, seq_len):
    """Every step's outputs (an LSTMCellState of ``[T, B, H]`` arrays) and the final
    ``(cs, h)`` (views of the last step when ``seq_len`` is None)."""
    xp = rt.xp
    lengths = _lengths(xp, seq_len)
    x = _running_inputs(xp, x, lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    w_h = w[n_in:]
    x_gates = (_flat(x) @ w[:n_in]).reshape(n_steps, n_batch, 4 * n_hidden)
    b = xp.ascontiguousarray(b)
    peephole = wci is not None
    peepholes = [_contiguous(xp, p) for p in (wci, wcf, wco)] if peephole else [b, b, b]
    steps = LSTMCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                            for _ in LSTMCellState._fields))
    if lengths is None:
        cs, h = xp.ascontiguousarray(cs0), h0
    else:  # the state buffers the kernel updates in the rows still running
        cs, h = cs0.copy(order="C"), h0.copy(order="C")
    forward = _Launcher(
        rt, "lstm_forward", dtype, n_batch * n_hidden, b=b, wci=peepholes[0],
        wcf=peepholes[1], wco=peepholes[2],
        seq_len=_no_lengths(xp) if lengths is None else lengths, forget_bias=forget_bias,
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=peephole,
        use_clip=cell_clip is not None, use_seq_len=lengths is not None, batch=n_batch,
        hidden=n_hidden, cs_state=cs, h_state=cs if lengths is None else h)  # (lengths only)
    for t in range(n_steps):
        forward(gx=x_gates[t], gh=_matmul(xp, h, w_h), cs_prev=cs, step=t,
                **dict(zip(LSTMCellState._fields, (a[t] for a in steps))))
        if lengths is None:
            cs, h = steps.cs[t], steps.h[t]
    return steps, cs, h


def _lstm_backward(rt, x, cs0, h0, w, steps, *, d_h, d_cs, d_h_final, d_cs_final, wci, wcf,
                   wco, cell_clip, clip_grad, seq_len):
    """Backpropagation through time; returns the fields of LSTMSequenceGrads."""
    xp = rt.xp
    lengths = _lengths(xp, seq_len)
    x = _running_inputs(xp, x, lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    w_x, w_h = w[:n_in], w[n_in:]
    steps = LSTMCellState(*(xp.ascontiguousarray(a) for a in steps))
    cs0 = xp.ascontiguousarray(cs0)
    d_h, d_cs, d_h_final, d_cs_final = (_contiguous(xp, a) for a in (d_h, d_cs, d_h_final,
                                                                      d_cs_final))
    peephole = wci is not None
    peepholes = [_contiguous(xp, p) for p in (wci, wcf, wco)] if peephole else [cs0] * 3
    d_gates = xp.empty((n_steps, n_batch, 4 * n_hidden), dtype=dtype)
    terms = xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype) if peephole else None
    dcs = xp.empty((n_batch, n_hidden), dtype=dtype)  # carry: dL/dcs before step t
    dh_recurrent = None  # dL/dh before step t through the gates: dG_t·W_hᵀ
    placeholder = cs0
    backward = _Launcher(
        rt, "lstm_backward", dtype, n_batch * n_hidden,
        wci=peepholes[0], wcf=peepholes[1], wco=peepholes[2],
        d_h_final=placeholder if d_h_final is None else d_h_final,
        d_cs_final=placeholder if d_cs_final is None else d_cs_final,
        seq_len=_no_lengths(xp) if lengths is None else lengths,
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=peephole,
        mask_clip=cell_clip is not None and clip_grad == "exact",
        has_d_h=d_h is not None, has_d_cs=d_cs is not None,
        has_d_h_final=d_h_final is not None, has_d_cs_final=d_cs_final is not None,
        use_seq_len=lengths is not None, n_steps=n_steps, batch=n_batch, hidden=n_hidden,
        dcs_next=dcs, dcs_prev=dcs)
    for t in reversed(range(n_steps)):
        backward(cs_prev=cs0 if t == 0 else steps.cs[t - 1],
                 **{k: getattr(steps, k)[t] for k in ("i", "cs", "f", "o", "ci", "co")},
                 d_h=placeholder if d_h is None else d_h[t],
                 d_cs=placeholder if d_cs is None else d_cs[t],
                 dh_next=placeholder if dh_recurrent is None else dh_recurrent, step=t,
                 d_gates=d_gates[t], peephole_terms=terms[t] if peephole else placeholder)
        dh_recurrent = _matmul(xp, d_gates[t], w_h.T)

    if n_steps == 0:
        dcs0 = xp.zeros_like(cs0) if d_cs_final is None else d_cs_final.copy()
        dh0 = xp.zeros_like(cs0) if d_h_final is None else d_h_final.copy()
    else:
        dcs0, dh0 = dcs, dh_recurrent
        if lengths is not None and d_h_final is not None:  # rows that never ran
            dh0 = dh0 + xp.where((lengths == 0)[:, None], d_h_final, xp.zeros_like(d_h_final))
    d_gates_flat = _flat(d_gates)
    dx = (d_gates_flat @ w_x.T).reshape(n_steps, n_batch, n_in)
    dw = xp.empty((n_in + n_hidden, 4 * n_hidden), dtype=dtype)
    xp.matmul(_flat(x).T, d_gates_flat, out=dw[:n_in])
    xp.matmul(_flat(_previous(xp, h0, steps.h)).T, d_gates_flat, out=dw[n_in:])
    db = _column_sum(rt, d_gates_flat)
    dwci = dwcf = dwco = None
    if peephole:
        sums = _column_sum(rt, _flat(terms))
        dwci, dwcf, dwco = sums[:n_hidden], sums[n_hidden:2 * n_hidden], sums[2 * n_hidden:]
    return dx, dcs0, dh0, dw, db, dwci, dwcf, dwco


def lstm_cell(rt, x, cs_prev, h_prev, w, b, *, wci=None, wcf=None, wco=None,
              forget_bias=1.0, cell_clip=None):
    steps, _, _ = _lstm_forward(rt, x[None], cs_prev, h_prev, w, b, wci, wcf, wco,
                                forget_bias, cell_clip, None)
    return LSTMCellState(*(a[0] for a in steps))


def lstm_cell_grad(rt, x, cs_prev, h_prev, w, b, state, *, d_h=None, d_cs=None, wci=None,
                   wcf=None, wco=None, cell_clip=None, clip_grad="exact"):
    dx, dcs0, dh0, dw, db, dwci, dwcf, dwco = _lstm_backward(
        rt, x[None], cs_prev, h_prev, w, [a[None] for a in state],
        d_h=None if d_h is None else d_h[None], d_cs=None if d_cs is None else d_cs[None],
        d_h_final=None, d_cs_final=None, wci=wci, wcf=wcf, wco=wco, cell_clip=cell_clip,
        clip_grad=clip_grad, seq_len=None)
    return LSTMCellGrads(dx[0], dcs0, dh0, dw, db, dwci, dwcf, dwco)


def lstm_sequence(rt, x, cs0, h0, w, b, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
                  cell_clip=None, seq_len=None):
    steps, cs, h = _lstm_forward(rt, x, cs0, h0, w, b, wci, wcf, wco, forget_bias,
                                 cell_clip, seq_len)
    if seq_len is None:  # views of the last step (or the inputs when T = 0): copy
        cs, h = cs.copy(), h.copy()
    return LSTMSequence(*steps, cs_final=cs, h_final=h)


def lstm_sequence_grad(rt, x, cs0, h0, w, b, seq, *, d_h=None, d_cs=None, d_h_final=None,
                       d_cs_final=None, wci=None, wcf=None, wco=None, cell_clip=None,
                       clip_grad="exact", seq_len=None):
    return LSTMSequenceGrads(*_lstm_backward(
        rt, x, cs0, h0, w, tuple(seq)[:7], d_h=d_h, d_cs=d_cs, d_h_final=d_h_final,
        d_cs_final=d_cs_final, wci=wci, wcf=wcf, wco=wco, cell_clip=cell_clip,
        clip_grad=clip_grad, seq_len=seq_len))


# --------------------------------------------------------------------------------------
# GRU


def _gru_x_projection(xp, x, w_ru, w_c):
    """``(gx_ru, gx_c)`` as ``[T, B, ·]`` arrays (views with row stride 3H when T > 1,
    where the projection of all steps is one matmul against ``[W_rux, W_cx]``)."""
    n_steps, n_batch, n_in = x.shape
    n_hidden = w_c.shape[1]
    x_flat = _flat(x)
    if n_steps > 1:
        gx = (x_flat @ xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)).reshape(
            n_steps, n_batch, 3 * n_hidden)
        return gx[:, :, :2 * n_hidden], gx[:, :, 2 * n_hidden:]
    return ((x_flat @ w_ru[:n_in]).reshape(n_steps, n_batch, 2 * n_hidden),
            (x_flat @ w_c[:n_in]).reshape(n_steps, n_batch, n_hidden))


def _row_stride(a):
    """Row stride, in elements, of a 2-D view with unit column stride."""
    return a.strides[0] // a.itemsize if a.shape[0] > 1 else a.shape[1]


def _gru_forward(rt, x, h0, w_ru, w_c, b_ru, b_c, reset_after, seq_len):
    """Every step's outputs (a GRUCellState of ``[T, B, H]`` arrays) and the final h."""
    xp = rt.xp
    lengths = _lengths(xp, seq_len)
    x = _running_inputs(xp, x, lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    n = n_batch * n_hidden
    w_ruh, w_ch = w_ru[n_in:], w_c[n_in:]
    gx_ru, gx_c = _gru_x_projection(xp, x, w_ru, w_c)
    b_ru, b_c = xp.ascontiguousarray(b_ru), xp.ascontiguousarray(b_c)
    steps = GRUCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                           for _ in GRUCellState._fields))
    h = h0.copy(order="C") if lengths is not None else xp.ascontiguousarray(h0)
    w_h = xp.concatenate([w_ruh, w_ch], axis=1) if reset_after and n_steps > 1 else None
    common = {"seq_len": _no_lengths(xp) if lengths is None else lengths,
              "use_seq_len": lengths is not None, "batch": n_batch, "hidden": n_hidden}
    if reset_after:
        step_kernel = _Launcher(rt, "gru_forward_reset_after", dtype, n, b_ru=b_ru, b_c=b_c,
                                **common)
    else:
        gates = _Launcher(rt, "gru_gates", dtype, n, b_ru=b_ru, **common)
        candidate = _Launcher(rt, "gru_candidate", dtype, n, b_c=b_c, **common)
    for t in range(n_steps):
        h_state = h if lengths is not None else steps.h[t]
        r, u, c, h_out = (a[t] for a in steps)
        if reset_after:
            if w_h is not None:  # one matmul per step, viewed as its r, u and c blocks
                gh = _matmul(xp, h, w_h)
                gh_ru, gh_c = gh[:, :2 * n_hidden], gh[:, 2 * n_hidden:]
            else:
                gh_ru, gh_c = _matmul(xp, h, w_ruh), _matmul(xp, h, w_ch)
            step_kernel(gx_ru=gx_ru[t], ld_gx_ru=_row_stride(gx_ru[t]), gx_c=gx_c[t],
                        ld_gx_c=_row_stride(gx_c[t]), gh_ru=gh_ru, ld_gh_ru=_row_stride(gh_ru),
                        gh_c=gh_c, ld_gh_c=_row_stride(gh_c), h_prev=h, step=t, r=r, u=u,
                        c=c, h=h_out, h_state=h_state)
        else:
            rh = xp.empty((n_batch, n_hidden), dtype=dtype)
            gh_ru = _matmul(xp, h, w_ruh)
            gates(gx_ru=gx_ru[t], ld_gx_ru=_row_stride(gx_ru[t]), gh_ru=gh_ru,
                  ld_gh_ru=_row_stride(gh_ru), h_prev=h, step=t, r=r, u=u, rh=rh)
            gh_c = _matmul(xp, rh, w_ch)
            candidate(gx_c=gx_c[t], ld_gx_c=_row_stride(gx_c[t]), gh_c=gh_c,
                      ld_gh_c=_row_stride(gh_c), u=u, h_prev=h, step=t, c=c, h=h_out,
                      h_state=h_state)
        if lengths is None:
            h = h_out
    return steps, h


def _gru_backward(rt, x, h0, w_ru, w_c, b_c, steps, *, d_h, d_h_final, reset_after,
                  seq_len):
    """Backpropagation through time; returns the fields of GRUSequenceGrads."""
    xp = rt.xp
    lengths = _lengths(xp, seq_len)
    x = _running_inputs(xp, x, lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    n = n_batch * n_hidden
    w_ruh, w_ch = w_ru[n_in:], w_c[n_in:]
    r, u, c, h = (xp.ascontiguousarray(a) for a in steps)
    b_c = xp.ascontiguousarray(b_c)
    d_h, d_h_final = _contiguous(xp, d_h), _contiguous(xp, d_h_final)
    h_prev = _previous(xp, h0, h)
    h_prev_flat = _flat(h_prev)
    d_gates = xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype)  # [dR, dU, dC]
    if reset_after:  # n - b_ch for every step at once; dN = dL/dn
        n_pre = _matmul(xp, h_prev_flat, w_ch).reshape(n_steps, n_batch, n_hidden)
        d_n = xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
    else:  # r∘h_prev, the input of the h-rows of w_c
        rh = xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
    dh_direct = xp.empty((n_batch, n_hidden), dtype=dtype)  # carry: dh∘u (+ d_hr∘r)
    dh_recurrent = None  # carry: the matmul part of dL/dh_prev
    placeholder = b_c
    candidate = _Launcher(
        rt, "gru_backward_candidate", dtype, n, b_c=b_c,
        d_h_final=placeholder if d_h_final is None else d_h_final, dh_next_b=dh_direct,
        seq_len=_no_lengths(xp) if lengths is None else lengths, reset_after=reset_after,
        has_d_h=d_h is not None, has_d_h_final=d_h_final is not None,
        use_seq_len=lengths is not None, n_steps=n_steps, batch=n_batch, hidden=n_hidden,
        dh_direct=dh_direct)
    reset = _Launcher(rt, "gru_backward_reset", dtype, n, batch=n_batch, hidden=n_hidden,
                      dh_direct=dh_direct)
    for t in reversed(range(n_steps)):
        candidate(r=r[t], u=u[t], c=c[t], h_prev=h_prev[t],
                  n_pre=n_pre[t] if reset_after else placeholder,
                  d_h=placeholder if d_h is None else d_h[t],
                  dh_next_a=placeholder if dh_recurrent is None else dh_recurrent, step=t,
                  d_gates=d_gates[t], d_n=d_n[t] if reset_after else placeholder,
                  rh=placeholder if reset_after else rh[t])
        if reset_after:
            dh_recurrent = _matmul(xp, d_gates[t][:, :2 * n_hidden], w_ruh.T)
            dh_recurrent += d_n[t] @ w_ch.T
        else:
            d_hr = _matmul(xp, d_gates[t][:, 2 * n_hidden:], w_ch.T)
            reset(d_hr=d_hr, r=r[t], h_prev=h_prev[t], d_gates=d_gates[t])
            dh_recurrent = _matmul(xp, d_gates[t][:, :2 * n_hidden], w_ruh.T)

    if n_steps == 0:
        dh0 = xp.zeros_like(h0) if d_h_final is None else d_h_final.copy()
    else:
        dh0 = dh_recurrent + dh_direct
    d_gates_flat = _flat(d_gates)
    d_ru_flat, d_c_flat = d_gates_flat[:, :2 * n_hidden], d_gates_flat[:, 2 * n_hidden:]
    x_flat = _flat(x)
    if n_steps > 1:
        w_x = xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)
        dx_flat = d_gates_flat @ w_x.T
    else:
        dx_flat = d_ru_flat @ w_ru[:n_in].T + d_c_flat @ w_c[:n_in].T
    dw_x = x_flat.T @ d_gates_flat
    dw_ru = xp.empty((n_in + n_hidden, 2 * n_hidden), dtype=dtype)
    dw_c = xp.empty((n_in + n_hidden, n_hidden), dtype=dtype)
    dw_ru[:n_in] = dw_x[:, :2 * n_hidden]
    dw_c[:n_in] = dw_x[:, 2 * n_hidden:]
    xp.matmul(h_prev_flat.T, d_ru_flat, out=dw_ru[n_in:])
    sums = _column_sum(rt, d_gates_flat)
    if reset_after:
        xp.matmul(h_prev_flat.T, _flat(d_n), out=dw_c[n_in:])
        db_c = xp.concatenate([sums[2 * n_hidden:], _column_sum(rt, _flat(d_n))])
    else:
        xp.matmul(_flat(rh).T, d_c_flat, out=dw_c[n_in:])
        db_c = sums[2 * n_hidden:]
    return (dx_flat.reshape(n_steps, n_batch, n_in), dh0, dw_ru, dw_c,
            sums[:2 * n_hidden], db_c)


def gru_cell(rt, x, h_prev, w_ru, w_c, b_ru, b_c, *, reset_after=False):
    steps, _ = _gru_forward(rt, x[None], h_prev, w_ru, w_c, b_ru, b_c, reset_after, None)
    return GRUCellState(*(a[0] for a in steps))


def gru_cell_grad(rt, x, h_prev, w_ru, w_c, b_ru, b_c, state, d_h=None, *,
                  reset_after=False):
    dx, dh0, dw_ru, dw_c, db_ru, db_c = _gru_backward(
        rt, x[None], h_prev, w_ru, w_c, b_c, [a[None] for a in state],
        d_h=None if d_h is None else d_h[None], d_h_final=None, reset_after=reset_after,
        seq_len=None)
    return GRUCellGrads(dx[0], dh0, dw_ru, dw_c, db_ru, db_c)


def gru_sequence(rt, x, h0, w_ru, w_c, b_ru, b_c, *, reset_after=False, seq_len=None):
    steps, h = _gru_forward(rt, x, h0, w_ru, w_c, b_ru, b_c, reset_after, seq_len)
    return GRUSequence(*steps, h_final=h.copy() if seq_len is None else h)


def gru_sequence_grad(rt, x, h0, w_ru, w_c, b_ru, b_c, seq, *, d_h=None, d_h_final=None,
                      reset_after=False, seq_len=None):
    return GRUSequenceGrads(*_gru_backward(
        rt, x, h0, w_ru, w_c, b_c, tuple(seq)[:4], d_h=d_h, d_h_final=d_h_final,
        reset_after=reset_after, seq_len=seq_len))
