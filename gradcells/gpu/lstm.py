"""The LSTM on the GPU: ``lstm.cu``'s fused step kernels around cuBLAS matmuls.

The matmul plan follows the reference's sequences: the input projection of all steps is one
matmul; per step only ``h·W_h`` and one fused elementwise kernel remain (forward: bias,
forget bias, peepholes, clip, activations and every output; backward: the gate gradients,
the clip mask, ``dcs_prev`` and the peephole terms); after the backward loop ``dx`` is one
matmul and ``dW`` two (x part and h part); the bias and peephole gradients are column sums.
A cell is the same code with T = 1. Each operation runs on its arguments' device.
"""

from __future__ import annotations

from .._core import plan
from .._core.types import LSTMCellGrads, LSTMCellState, LSTMSequence, LSTMSequenceGrads
from . import _launch
from ._launch import Launcher, column_sum, contiguous, matmul


def lstm_cell(x, cs_prev, h_prev, weights, settings):
    """One LSTM step; see ``gradcells.reference.lstm.lstm_cell``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, _, _ = _forward(rt, x[None], cs_prev, h_prev, weights, settings)
        return LSTMCellState(*(a[0] for a in steps))


def lstm_cell_grad(x, cs_prev, h_prev, weights, state, settings, *, d_h=None, d_cs=None,
                   clip_grad="exact"):
    """Gradient of one LSTM step; see ``gradcells.reference.lstm.lstm_cell_grad``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        dx, *rest = _backward(
            rt, x[None], cs_prev, h_prev, weights, [a[None] for a in state], settings,
            d_h=None if d_h is None else d_h[None], d_cs=None if d_cs is None else d_cs[None],
            d_h_final=None, d_cs_final=None, clip_grad=clip_grad)
        return LSTMCellGrads(dx[0], *rest)


def lstm_sequence(x, cs0, h0, weights, settings):
    """The LSTM over ``x [T, B, I]``; see ``gradcells.reference.lstm.lstm_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, cs, h = _forward(rt, x, cs0, h0, weights, settings)
        if settings.seq_len is None:  # views of the last step (or the inputs when T = 0)
            cs, h = cs.copy(), h.copy()
        return LSTMSequence(*steps, cs_final=cs, h_final=h)


def lstm_sequence_grad(x, cs0, h0, weights, seq, settings, *, d_h=None, d_cs=None,
                       d_h_final=None, d_cs_final=None, clip_grad="exact"):
    """Backpropagation through time for ``lstm_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return LSTMSequenceGrads(*_backward(
            rt, x, cs0, h0, weights, tuple(seq)[:len(LSTMCellState._fields)], settings,
            d_h=d_h, d_cs=d_cs, d_h_final=d_h_final, d_cs_final=d_cs_final,
            clip_grad=clip_grad))


# --------------------------------------------------------------------------------------
# The algorithm


def _peepholes(xp, weights, settings, placeholder):
    """The kernels' ``wci, wcf, wco`` arguments: the peephole vectors (contiguous), or
    ``placeholder`` three times without peepholes."""
    if settings.peepholes:
        return [contiguous(xp, p) for p in (weights.wci, weights.wcf, weights.wco)]
    return [placeholder] * 3


def _forward(rt, x, cs0, h0, weights, settings):
    """Every step's outputs (an LSTMCellState of ``[T, B, H]`` arrays) and the final
    ``(cs, h)`` (views of the last step when ``seq_len`` is None)."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, x, lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = cs0.shape[1]
    dtype = x.dtype
    w_h = weights.w[n_in:]
    x_gates = (plan.flat(x) @ weights.w[:n_in]).reshape(n_steps, n_batch, 4 * n_hidden)
    b = xp.ascontiguousarray(weights.b)
    wci, wcf, wco = _peepholes(xp, weights, settings, b)
    steps = LSTMCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                            for _ in LSTMCellState._fields))
    if lengths is None:
        cs, h = xp.ascontiguousarray(cs0), h0
    else:  # the state buffers the kernel updates in the rows still running
        cs, h = cs0.copy(order="C"), h0.copy(order="C")
    projection = weights.w_proj is not None
    if projection:  # the kernel's h is m = o∘co; the steps' h is the projected one
        m_steps = xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
        steps = steps._replace(h=xp.empty((n_steps, n_batch, h0.shape[1]), dtype=dtype))
        m_state = xp.empty((n_batch, n_hidden), dtype=dtype)
    cell_clip = settings.cell_clip
    forward = Launcher(
        rt, "lstm_forward", dtype, n_batch * n_hidden, b=b, wci=wci, wcf=wcf, wco=wco,
        seq_len=_launch.lengths_argument(xp, lengths), forget_bias=settings.forget_bias,
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=settings.peepholes,
        use_clip=cell_clip is not None, use_seq_len=lengths is not None, batch=n_batch,
        hidden=n_hidden, cs_state=cs,
        h_state=cs if lengths is None else (m_state if projection else h))  # (lengths only)
    for t in range(n_steps):
        outputs = dict(zip(LSTMCellState._fields, (a[t] for a in steps)))
        if projection:
            outputs["h"] = m_steps[t]
        forward(gx=x_gates[t], gh=matmul(xp, h, w_h), cs_prev=cs, step=t, **outputs)
        if projection:
            h = _project(xp, m_steps[t], weights.w_proj, settings.proj_clip, lengths, t,
                         steps.h[t], h)
        if lengths is None:
            cs, h = steps.cs[t], steps.h[t]
    return steps, cs, h


def _project(xp, m, w_proj, proj_clip, lengths, t, out, h):
    """Step t's projected ``h = clip(m·w_proj, ±proj_clip)`` into ``out`` (zero in the rows
    past their length); returns the carried state (``h`` kept in those rows)."""
    projected = m @ w_proj
    if proj_clip is not None:
        projected = xp.clip(projected, -proj_clip, proj_clip)
    if lengths is None:
        out[...] = projected
        return out
    valid = (t < lengths)[:, None]
    out[...] = xp.where(valid, projected, xp.zeros((), dtype=out.dtype))
    return xp.where(valid, projected, h)


def _backward(rt, x, cs0, h0, weights, steps, settings, *, d_h, d_cs, d_h_final, d_cs_final,
              clip_grad):
    """Backpropagation through time; returns the fields of LSTMSequenceGrads."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, x, lengths)
    steps = LSTMCellState(*(xp.ascontiguousarray(a) for a in steps))
    cs0 = xp.ascontiguousarray(cs0)
    d_h, d_cs, d_h_final, d_cs_final = (contiguous(xp, a) for a in (d_h, d_cs, d_h_final,
                                                                     d_cs_final))
    proj = None if weights.w_proj is None else _ProjectionGrad(
        xp, weights.w_proj, settings.proj_clip, clip_grad, lengths, steps, d_h, d_h_final)
    d_gates, terms, dcs, dh_recurrent = _backward_steps(
        rt, x, cs0, weights, steps, settings, lengths, d_h=d_h, d_cs=d_cs,
        d_h_final=d_h_final, d_cs_final=d_cs_final, clip_grad=clip_grad, proj=proj)
    if x.shape[0] == 0:
        dcs0 = xp.zeros_like(cs0) if d_cs_final is None else d_cs_final.copy()
        dh0 = (xp.zeros_like(cs0) if proj is None else xp.zeros(h0.shape, dtype=x.dtype)
               ) if d_h_final is None else d_h_final.copy()
    else:
        dcs0, dh0 = dcs, dh_recurrent
        if lengths is not None and d_h_final is not None:  # rows that never ran
            dh0 = dh0 + xp.where((lengths == 0)[:, None], d_h_final, xp.zeros_like(d_h_final))
    dx, dw, db, dwci, dwcf, dwco = _input_and_weight_grads(rt, x, h0, weights.w, steps.h,
                                                           d_gates, terms)
    dw_proj = None if proj is None else proj.weight_grad()
    return dx, dcs0, dh0, dw, db, dwci, dwcf, dwco, dw_proj


def _backward_steps(rt, x, cs0, weights, steps, settings, lengths, *, d_h, d_cs, d_h_final,
                    d_cs_final, clip_grad, proj=None):
    """The backward loop: every step's gate gradients ``[T, B, 4H]``, the peephole terms
    ``[T, B, 3H]`` (None without peepholes), and the carries before step 0: ``dL/dcs``
    and the matmul part of ``dL/dh`` (None when T = 0). With a projection (``proj``) the
    kernel's ``d_h`` is ``proj``'s ``dm`` and it reads no ``dh`` carry of its own."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = cs0.shape[1]
    dtype = x.dtype
    w_h = weights.w[n_in:]
    peephole = settings.peepholes
    wci, wcf, wco = _peepholes(xp, weights, settings, cs0)
    d_gates = xp.empty((n_steps, n_batch, 4 * n_hidden), dtype=dtype)
    terms = xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype) if peephole else None
    dcs = xp.empty((n_batch, n_hidden), dtype=dtype)  # carry: dL/dcs before step t
    dh_recurrent = None  # dL/dh before step t through the gates: dG_t·W_hᵀ
    placeholder = cs0
    cell_clip = settings.cell_clip
    backward = Launcher(
        rt, "lstm_backward", dtype, n_batch * n_hidden, wci=wci, wcf=wcf, wco=wco,
        d_h_final=placeholder if d_h_final is None else d_h_final,
        d_cs_final=placeholder if d_cs_final is None else d_cs_final,
        seq_len=_launch.lengths_argument(xp, lengths),
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=peephole,
        mask_clip=cell_clip is not None and clip_grad == "exact",
        has_d_h=d_h is not None or proj is not None, has_d_cs=d_cs is not None,
        has_d_h_final=d_h_final is not None and proj is None,
        has_d_cs_final=d_cs_final is not None,
        use_seq_len=lengths is not None, n_steps=n_steps, batch=n_batch, hidden=n_hidden,
        dcs_next=dcs, dcs_prev=dcs)
    saved = LSTMCellState._fields[:-1]  # every output but h
    for t in reversed(range(n_steps)):
        backward(cs_prev=cs0 if t == 0 else steps.cs[t - 1],
                 **{k: getattr(steps, k)[t] for k in saved},
                 **_dh_arguments(proj, t, d_h, dh_recurrent, placeholder),
                 d_cs=placeholder if d_cs is None else d_cs[t], step=t,
                 d_gates=d_gates[t], peephole_terms=terms[t] if peephole else placeholder)
        dh_recurrent = matmul(xp, d_gates[t], w_h.T)
    return d_gates, terms, dcs, dh_recurrent


def _dh_arguments(proj, t, d_h, dh_recurrent, placeholder):
    """The backward kernel's ``d_h`` and ``dh_next`` at step t."""
    if proj is not None:
        return {"d_h": proj.step(t, dh_recurrent), "dh_next": proj.zero_carry}
    return {"d_h": placeholder if d_h is None else d_h[t],
            "dh_next": placeholder if dh_recurrent is None else dh_recurrent}


class _ProjectionGrad:
    """The projection's backward (docs/spec.md §9.1), step by step: the gradient of the
    projected ``h`` (the step's ``d_h``, plus ``d_h_final`` on a row's last step and the
    carry ``dG_{t+1}·W_hᵀ`` before it; zero past a row's length), masked by the exact clip
    (``dh_raw``; ``|m·w_proj| <= proj_clip`` passes), gives ``dm = dh_raw·w_projᵀ``, the
    kernel's ``d_h``; ``dw_proj = M_flatᵀ·DHraw_flat`` after the loop."""

    def __init__(self, xp, w_proj, proj_clip, clip_grad, lengths, steps, d_h, d_h_final):
        self.xp, self.w_proj, self.lengths, self.d_h, self.d_h_final = (
            xp, w_proj, lengths, d_h, d_h_final)
        self.mask_clip = proj_clip if proj_clip is not None and clip_grad == "exact" else None
        self.m = steps.o * steps.co  # the kernel's stored m = o∘co, rounded alike
        n_steps, n_batch, _ = self.m.shape
        self.dh_raw = xp.zeros((n_steps, n_batch, w_proj.shape[1]), dtype=self.m.dtype)
        self.zero_carry = xp.zeros(self.m.shape[1:], dtype=self.m.dtype)

    def step(self, t, carry):
        """``dm`` of step t from the carry ``dG_{t+1}·W_hᵀ`` (None on the last step)."""
        xp, n_steps = self.xp, self.m.shape[0]
        zero = xp.zeros((), dtype=self.dh_raw.dtype)
        length = n_steps if self.lengths is None else self.lengths[:, None]
        last = t + 1 >= length
        final = zero if self.d_h_final is None else self.d_h_final
        dh = xp.where(last, final, zero if carry is None else carry)
        if self.d_h is not None:
            dh = dh + self.d_h[t]
        dh = xp.where(t < length, dh, zero)
        if self.mask_clip is not None:
            dh = xp.where(abs(self.m[t] @ self.w_proj) <= self.mask_clip, dh, zero)
        self.dh_raw[t] = dh
        return matmul(xp, self.dh_raw[t], self.w_proj.T)

    def weight_grad(self):
        """``dw_proj = M_flatᵀ·DHraw_flat``."""
        return plan.flat(self.m).T @ plan.flat(self.dh_raw)


def _input_and_weight_grads(rt, x, h0, w, h, d_gates, terms):
    """``dx`` (one matmul), ``dW`` (its x and h parts), the bias gradient and the peephole
    gradients (column sums; None when ``terms`` is None)."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = d_gates.shape[2] // 4
    d_gates_flat = plan.flat(d_gates)
    dx = (d_gates_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = xp.empty(w.shape, dtype=x.dtype)
    xp.matmul(plan.flat(x).T, d_gates_flat, out=dw[:n_in])
    xp.matmul(plan.flat(_launch.previous(xp, h0, h)).T, d_gates_flat, out=dw[n_in:])
    db = column_sum(rt, d_gates_flat)
    dwci = dwcf = dwco = None
    if terms is not None:
        sums = column_sum(rt, plan.flat(terms))
        dwci, dwcf, dwco = sums[:n_hidden], sums[n_hidden:2 * n_hidden], sums[2 * n_hidden:]
    return dx, dw, db, dwci, dwcf, dwco
