"""xLSTM's sLSTM on the GPU (docs/spec.md §19): ``slstm.cu``'s fused step kernels around
cuBLAS matmuls.

The matmul plan is the CPU's (``cpu.py`` beside this file): the input projection
``x·w + b`` of all steps is one matmul; per step the recurrent products of every head,
``rec [N, B, 4d]``, are one batched matmul ``[N, B, d]·[N, d, 4d]`` of the (masked) state,
and one fused kernel (``slstm_forward``) forms the gates, the stabiliser and the new state
in place. Backwards, per step one kernel (``slstm_backward``) forms the pre-activation
gradients (gate-major for ``dx, dw, db``, head-major for ``dh_prev`` and ``dr``) and
carries the state's gradients back, and ``dh_prev = (dG_k·r[k]ᵀ)∘m_rec`` is one batched
matmul; after the loop ``dx``, ``dw`` are one matmul each, ``dr`` one batched matmul and
the bias gradient a column sum. For the sigmoid forget ``f̃`` of every step is recomputed
(one matmul for the input part and one batched matmul for the recurrent part). A cell is
the same code with T = 1. Each operation runs on its arguments' device.

Forward mode (``_jvp``) runs the forward's plan with the tangents beside, one fused kernel
per step (``slstm_forward_tangent``; the tangent of ``rec`` is ``rec(dh, r) + rec(h, dr)``,
two more batched matmuls). The second order (``_grad_jvp``) takes the saved fields'
tangents from the forward mode and runs the backward's loop with a tangent beside every
value (``slstm_backward_tangent``), the matmuls' product rule after it.
"""

from __future__ import annotations

import math

from ..._core import plan
from ...gpu import _launch
from ...gpu._launch import Launcher, column_sum
from .spec import SLSTMCellGrads, SLSTMCellState, SLSTMSequence, SLSTMSequenceGrads

_UPSTREAM = ("d_i", "d_f", "d_z", "d_o", "d_c", "d_n", "d_m", "d_h")
"""The per-step upstream gradients in the order of the result's fields."""


def slstm_cell(x, c_prev, n_prev, m_prev, h_prev, weights, settings):
    """One sLSTM step; see ``gradcells.reference.slstm_cell``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        seq = _forward(rt, x[None], (c_prev, n_prev, m_prev, h_prev), weights, settings)
        return SLSTMCellState(*(a[0] for a in seq[:8]))


def slstm_cell_grad(x, c_prev, n_prev, m_prev, h_prev, weights, state, settings, *,
                    d_h=None, d_c=None, d_n=None, d_m=None, d_i=None, d_f=None, d_z=None,
                    d_o=None):
    """Gradient of one sLSTM step; see ``gradcells.reference.slstm_cell_grad``."""
    given = {k: None if v is None else v[None] for k, v in locals().items()
             if k.startswith("d_")}
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        seq = SLSTMSequence(*(a[None] for a in state), *state[4:])
        g = _backward(rt, x[None], (c_prev, n_prev, m_prev, h_prev), weights, seq, settings,
                      given)
        return SLSTMCellGrads(g.x[0], *g[1:])


def slstm_sequence(x, c0, n0, m0, h0, weights, settings):
    """The sLSTM over ``x [T, B, I]``; see ``gradcells.reference.slstm_sequence``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _forward(rt, x, (c0, n0, m0, h0), weights, settings)


def slstm_sequence_grad(x, c0, n0, m0, h0, weights, seq, settings, *, d_h=None, d_c=None,
                        d_n=None, d_m=None, d_h_final=None, d_c_final=None, d_n_final=None,
                        d_m_final=None, d_i=None, d_f=None, d_z=None, d_o=None):
    """Backpropagation through time for ``slstm_sequence``."""
    given = {k: v for k, v in locals().items() if k.startswith("d_")}
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _backward(rt, x, (c0, n0, m0, h0), weights, seq, settings, given)


def slstm_cell_jvp(x, c_prev, n_prev, m_prev, h_prev, weights, tangents, settings):
    """One sLSTM step and its tangent; see ``gradcells.reference.slstm_cell_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        t = SLSTMSequenceGrads(None if tangents.x is None else tangents.x[None], *tangents[1:])
        pair = _forward_jvp(rt, x[None], (c_prev, n_prev, m_prev, h_prev), weights, t, settings)
        return tuple(SLSTMCellState(*(a[0] for a in s[:8])) for s in pair)


def slstm_sequence_jvp(x, c0, n0, m0, h0, weights, tangents, settings):
    """The sLSTM over time and its tangent; see ``gradcells.reference.slstm_sequence_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _forward_jvp(rt, x, (c0, n0, m0, h0), weights, tangents, settings)


def slstm_cell_grad_jvp(x, c_prev, n_prev, m_prev, h_prev, weights, state, tangents,
                        settings, *, d_h=None, d_c=None, d_n=None, d_m=None, d_i=None,
                        d_f=None, d_z=None, d_o=None, d_h_tangent=None, d_c_tangent=None,
                        d_n_tangent=None, d_m_tangent=None, d_i_tangent=None,
                        d_f_tangent=None, d_z_tangent=None, d_o_tangent=None):
    """The JVP of ``slstm_cell_grad``; see ``gradcells.reference.slstm_cell_grad_jvp``."""
    given = {k: None if v is None else v[None] for k, v in locals().items()
             if k.startswith("d_")}
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        seq = SLSTMSequence(*(a[None] for a in state), *state[4:])
        t = SLSTMSequenceGrads(None if tangents.x is None else tangents.x[None], *tangents[1:])
        pair = _backward_jvp(rt, x[None], (c_prev, n_prev, m_prev, h_prev), weights, seq, t,
                             settings, given)
        return tuple(SLSTMCellGrads(g.x[0], *g[1:]) for g in pair)


def slstm_sequence_grad_jvp(x, c0, n0, m0, h0, weights, seq, tangents, settings, *,
                            d_h=None, d_c=None, d_n=None, d_m=None, d_h_final=None,
                            d_c_final=None, d_n_final=None, d_m_final=None, d_i=None,
                            d_f=None, d_z=None, d_o=None, d_h_tangent=None, d_c_tangent=None,
                            d_n_tangent=None, d_m_tangent=None, d_h_final_tangent=None,
                            d_c_final_tangent=None, d_n_final_tangent=None,
                            d_m_final_tangent=None, d_i_tangent=None, d_f_tangent=None,
                            d_z_tangent=None, d_o_tangent=None):
    """The JVP of ``slstm_sequence_grad``; see
    ``gradcells.reference.slstm_sequence_grad_jvp``."""
    given = {k: v for k, v in locals().items() if k.startswith("d_")}
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return _backward_jvp(rt, x, (c0, n0, m0, h0), weights, seq, tangents, settings,
                             given)


# --------------------------------------------------------------------------------------
# The algorithm


def _floor(xp, dtype):
    """The exponent below which a gate is 0 (``reference.flushed_exp``), in the kernels'
    arithmetic type (float32 for float16)."""
    compute = xp.float64 if dtype == xp.float64 else xp.float32
    return compute(2 * math.log(float(xp.finfo(dtype).eps)))


def _heads(xp, h, n_heads):
    """``h [rows, H]`` head-major, ``[N, rows, d]``, C-contiguous."""
    rows, hidden = h.shape
    return xp.ascontiguousarray(h.reshape(rows, n_heads, hidden // max(n_heads, 1))
                                .transpose(1, 0, 2))


def _inputs(xp, x, settings, lengths):
    """``x`` as the steps read it: masked, zero past each row's length."""
    return plan.running_inputs(xp, plan.masked(x, settings.input_mask), lengths)


def _forward(rt, x, states, weights, settings):
    """The forward time loop; returns an ``SLSTMSequence``."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = _inputs(xp, x, settings, lengths)
    n_steps, n_batch, _ = x.shape
    w, r, b = (xp.ascontiguousarray(a) for a in weights)
    hidden, n_heads = states[3].shape[1], r.shape[0]
    x_pre = (plan.flat(x) @ w + b).reshape(n_steps, n_batch, 4 * hidden)
    state = [xp.array(a, order="C", copy=True) for a in states]
    out = xp.empty((8, n_steps, n_batch, hidden), dtype=x.dtype)
    forward = Launcher(
        rt, "slstm_forward", x.dtype, n_batch * hidden,
        seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        exp_forget=settings.forget == "exp", floor=_floor(xp, x.dtype), batch=n_batch,
        hidden=hidden, heads=n_heads, c_state=state[0], n_state=state[1], m_state=state[2],
        h_state=state[3])
    m_rec = settings.recurrent_mask
    for t in range(n_steps):
        rec = xp.ascontiguousarray(xp.matmul(_heads(xp, plan.masked(state[3], m_rec),
                                                    n_heads), r))
        forward(x_pre=xp.ascontiguousarray(x_pre[t]), rec=rec, step=t,
                **{f"out_{k}": out[j, t] for j, k in enumerate("ifzocnmh")})
    return SLSTMSequence(*out, *state)


def _forward_jvp(rt, x, states, weights, tangents, settings):
    """The forward time loop with the tangents beside: ``(SLSTMSequence, SLSTMSequence of
    tangents)``; the tangent of ``rec`` is ``rec(dh, r) + rec(h, dr)``."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    primals = (x, *states, *weights)
    dx, *d_rest = (xp.zeros_like(p) if t is None else t
                   for t, p in zip(tangents, primals, strict=True))
    x, dx = (_inputs(xp, a, settings, lengths) for a in (x, dx))
    n_steps, n_batch, _ = x.shape
    w, r, b = (xp.ascontiguousarray(a) for a in weights)
    dw, dr, db = (xp.ascontiguousarray(a) for a in d_rest[4:])
    hidden, n_heads = states[3].shape[1], r.shape[0]
    x_pre = (plan.flat(x) @ w + b).reshape(n_steps, n_batch, 4 * hidden)
    dx_pre = (plan.flat(dx) @ w + plan.flat(x) @ dw + db).reshape(n_steps, n_batch, 4 * hidden)
    state = xp.ascontiguousarray(xp.stack(states))
    d_state = xp.ascontiguousarray(xp.stack(d_rest[:4]))
    out = xp.empty((2, n_steps, 8, n_batch, hidden), dtype=x.dtype)
    step = Launcher(
        rt, "slstm_forward_tangent", x.dtype, n_batch * hidden,
        seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        exp_forget=settings.forget == "exp", stop=settings.stabilizer_grad == "stop",
        floor=_floor(xp, x.dtype), batch=n_batch, hidden=hidden, heads=n_heads, state=state,
        d_state=d_state)
    m_rec = settings.recurrent_mask
    for t in range(n_steps):
        heads = _heads(xp, plan.masked(state[3], m_rec), n_heads)
        d_heads = _heads(xp, plan.masked(d_state[3], m_rec), n_heads)
        step(x_pre=xp.ascontiguousarray(x_pre[t]), rec=xp.ascontiguousarray(heads @ r),
             dx_pre=xp.ascontiguousarray(dx_pre[t]),
             drec=xp.ascontiguousarray(d_heads @ r + heads @ dr), step=t, out=out[0, t],
             d_out=out[1, t])
    return tuple(SLSTMSequence(*o.transpose(1, 0, 2, 3), *s)
                 for o, s in zip(out, (state, d_state), strict=True))


def _forget_preactivations(xp, x, h_prev, w, r, b, hidden):
    """``f̃`` of every step ``[T, B, H]`` from the inputs and the states the steps read."""
    n_steps, n_batch, _ = x.shape
    n_heads, d = r.shape[0], r.shape[1]
    x_f = plan.flat(x) @ w[:, hidden:2 * hidden] + b[hidden:2 * hidden]
    rec = xp.matmul(_heads(xp, plan.flat(h_prev), n_heads), r[:, :, d:2 * d])
    rec = rec.transpose(1, 0, 2).reshape(n_steps * n_batch, hidden)
    return xp.ascontiguousarray((x_f + rec).reshape(n_steps, n_batch, hidden))


def _upstream_steps(xp, given, shape, dtype):
    """The per-step upstream gradients as one ``[T, 8, B, H]`` array (zeros where none)."""
    up = xp.zeros((shape[0], 8, *shape[1:]), dtype=dtype)
    for k, name in enumerate(_UPSTREAM):
        if given.get(name) is not None:
            up[:, k] = given[name]
    return up


def _backward(rt, x, states, weights, seq, settings, given):
    """The backward time loop; returns an ``SLSTMSequenceGrads``."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = _inputs(xp, x, settings, lengths)
    n_steps, n_batch, n_in = x.shape
    w, r, b = (xp.ascontiguousarray(a) for a in weights)
    hidden, n_heads = states[3].shape[1], r.shape[0]
    fields = [xp.ascontiguousarray(a) for a in seq[:8]]
    m_rec = settings.recurrent_mask
    h_prev = xp.ascontiguousarray(plan.masked(_launch.previous(xp, states[3], fields[7]),
                                              m_rec))
    starts = [_launch.previous(xp, states[k], fields[k + 4]) for k in (0, 1)]
    f_pre = (_forget_preactivations(xp, x, h_prev, w, r, b, hidden)
             if settings.forget == "sigmoid" else fields[0])   # fields[0]: never read
    up = _upstream_steps(xp, given, (n_steps, n_batch, hidden), x.dtype)
    carry = [xp.zeros((n_batch, hidden), dtype=x.dtype) if given.get(f"d_{k}_final") is None
             else xp.array(given[f"d_{k}_final"], order="C", copy=True) for k in "cnmh"]
    d_gates = xp.empty((n_steps, n_batch, 4 * hidden), dtype=x.dtype)
    d_heads = xp.empty((n_steps, n_heads, n_batch, 4 * hidden // max(n_heads, 1)),
                       dtype=x.dtype)
    r_t = xp.ascontiguousarray(r.transpose(0, 2, 1))
    backward = Launcher(
        rt, "slstm_backward", x.dtype, n_batch * hidden,
        seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        exp_forget=settings.forget == "exp", stop=settings.stabilizer_grad == "stop",
        batch=n_batch, hidden=hidden, heads=n_heads, g_c=carry[0], g_n=carry[1],
        g_m=carry[2])
    for t in reversed(range(n_steps)):
        backward(**{f"{k}_t": fields[j][t] for j, k in enumerate("ifzocn")}, h_t=fields[7][t],
                 c_prev=starts[0][t], n_prev=starts[1][t], f_pre=f_pre[t], up=up[t], step=t,
                 g_h=carry[3], d_gates=d_gates[t], d_heads=d_heads[t])
        dh = xp.matmul(d_heads[t], r_t).transpose(1, 0, 2).reshape(n_batch, hidden)
        dh = plan.masked(dh, m_rec)
        carry[3] = dh if lengths is None else xp.where((t < lengths)[:, None], dh, carry[3])
        carry[3] = xp.ascontiguousarray(carry[3])
    return _weight_grads(rt, x, h_prev, weights, d_gates, d_heads, carry, settings, lengths)


def _head_major(xp, d_gates, n_heads):
    """Gate-major ``[..., B, 4H]`` pre-activation gradients as ``[..., N, B, 4d]``."""
    *lead, n_batch, width = d_gates.shape
    d = width // 4 // max(n_heads, 1)
    a = d_gates.reshape(*lead, n_batch, 4, n_heads, d)
    order = (*range(len(lead)), len(lead) + 2, len(lead), len(lead) + 1, len(lead) + 3)
    return xp.ascontiguousarray(a.transpose(order).reshape(*lead, n_heads, n_batch, 4 * d))


def _backward_jvp(rt, x, states, weights, seq, tangents, settings, given):
    """The backward time loop with the tangents beside: ``(grads, grads_tangent)``, the
    forward's tangent from ``_forward_jvp``."""
    xp = rt.xp
    t = SLSTMSequenceGrads(*(xp.zeros_like(p) if a is None else a for a, p in
                             zip(tangents, (x, *states, *weights), strict=True)))
    d_seq = _forward_jvp(rt, x, states, weights, t, settings)[1]
    lengths = _launch.lengths(xp, settings.seq_len)
    x, dx = (_inputs(xp, a, settings, lengths) for a in (x, t.x))
    n_steps, n_batch, _ = x.shape
    w, r, b = (xp.ascontiguousarray(a) for a in weights)
    hidden, n_heads = states[3].shape[1], r.shape[0]
    fields = xp.ascontiguousarray(xp.stack(list(seq[:8]), axis=1))
    d_fields = xp.ascontiguousarray(xp.stack(list(d_seq[:8]), axis=1))
    m_rec = settings.recurrent_mask
    h_prev, dh_prev = (xp.ascontiguousarray(plan.masked(_launch.previous(xp, h0, f[:, 7]),
                                                        m_rec))
                       for h0, f in ((states[3], fields), (t.h0, d_fields)))
    starts, d_starts = (xp.ascontiguousarray(xp.stack(
        [_launch.previous(xp, s0[0], f[:, 4]), _launch.previous(xp, s0[1], f[:, 5])], axis=1))
        for s0, f in (((states[0], states[1]), fields), ((t.c0, t.n0), d_fields)))
    f_pre = _forget_preactivations(xp, x, h_prev, w, r, b, hidden)
    d_f_pre = xp.ascontiguousarray(
        _forget_preactivations(xp, dx, dh_prev, w, r, t.b, hidden)
        + _forget_preactivations(xp, x, h_prev, t.w, t.r, 0 * t.b, hidden))
    shape = (n_steps, n_batch, hidden)
    up = _upstream_steps(xp, given, shape, x.dtype)
    d_up = _upstream_steps(xp, {k.removesuffix("_tangent"): v for k, v in given.items()
                                if k.endswith("_tangent")}, shape, x.dtype)
    carry, d_carry = (xp.ascontiguousarray(xp.stack(
        [xp.zeros((n_batch, hidden), dtype=x.dtype) if given.get(f"d_{k}_final{sfx}") is None
         else given[f"d_{k}_final{sfx}"] for k in "cnmh"])) for sfx in ("", "_tangent"))
    d_gates = xp.empty((2, n_steps, n_batch, 4 * hidden), dtype=x.dtype)
    r_t, dr_t = (xp.ascontiguousarray(a.transpose(0, 2, 1)) for a in (r, t.r))
    step = Launcher(
        rt, "slstm_backward_tangent", x.dtype, n_batch * hidden,
        seq_len=_launch.lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        exp_forget=settings.forget == "exp", stop=settings.stabilizer_grad == "stop",
        batch=n_batch, hidden=hidden, carry=carry, d_carry=d_carry)
    for k in reversed(range(n_steps)):
        step(fields=fields[k], d_fields=d_fields[k], starts=starts[k], d_starts=d_starts[k],
             f_pre=f_pre[k], d_f_pre=d_f_pre[k], up=up[k], d_up=d_up[k], step=k,
             d_gates=d_gates[0, k], d_gates_t=d_gates[1, k])
        heads, heads_t = (_head_major(xp, d_gates[j, k], n_heads) for j in (0, 1))
        for target, value in ((carry, xp.matmul(heads, r_t)),
                              (d_carry, xp.matmul(heads_t, r_t) + xp.matmul(heads, dr_t))):
            dh = plan.masked(value.transpose(1, 0, 2).reshape(n_batch, hidden), m_rec)
            target[3] = dh if lengths is None else xp.where((k < lengths)[:, None], dh,
                                                             target[3])
    return _weight_grads_jvp(rt, (x, dx), (h_prev, dh_prev), weights, t, d_gates,
                             (carry, d_carry), settings, lengths)


def _weight_grads_jvp(rt, xs, h_pair, weights, t, d_gates, carries, settings, lengths):
    """After the loop: the input and weight gradients and their tangents."""
    xp = rt.xp
    (x, dx), (h_prev, dh_prev) = xs, h_pair
    w, r, _ = weights
    n_steps, n_batch, n_in = x.shape
    n_heads = r.shape[0]
    g, g_t = (plan.flat(d_gates[j]) for j in (0, 1))
    rows = n_steps * n_batch
    heads, heads_t = (_head_major(xp, d_gates[j], n_heads).transpose(1, 0, 2, 3)
                      .reshape(n_heads, rows, 4 * r.shape[1]) for j in (0, 1))
    hp, dhp = (_heads(xp, plan.flat(a), n_heads).transpose(0, 2, 1)
               for a in (h_prev, dh_prev))

    def input_grad(a):
        a = a.reshape(n_steps, n_batch, n_in)
        return plan.running_inputs(xp, plan.masked(a, settings.input_mask), lengths)

    def bias_grad(a):
        return column_sum(rt, a) if rows else xp.zeros(a.shape[1], dtype=x.dtype)

    grads = SLSTMSequenceGrads(input_grad(g @ w.T), *carries[0], plan.flat(x).T @ g,
                               xp.matmul(hp, heads), bias_grad(g))
    tangent = SLSTMSequenceGrads(
        input_grad(g_t @ w.T + g @ t.w.T), *carries[1],
        plan.flat(dx).T @ g + plan.flat(x).T @ g_t,
        xp.matmul(dhp, heads) + xp.matmul(hp, heads_t), bias_grad(xp.ascontiguousarray(g_t)))
    return grads, tangent


def _weight_grads(rt, x, h_prev, weights, d_gates, d_heads, carry, settings, lengths):
    """After the loop: ``dx``, ``dw``, ``dr``, ``db`` from every step's pre-activation
    gradients, and the state's gradients ``carry``."""
    xp = rt.xp
    w, r, _ = weights
    n_steps, n_batch, n_in = x.shape
    n_heads = r.shape[0]
    d_flat = plan.flat(d_gates)
    dx = (d_flat @ w.T).reshape(n_steps, n_batch, n_in)
    dx = plan.running_inputs(xp, plan.masked(dx, settings.input_mask), lengths)
    rows = n_steps * n_batch
    dh_all = d_heads.transpose(1, 0, 2, 3).reshape(n_heads, rows, d_heads.shape[-1])
    hp = _heads(xp, plan.flat(h_prev), n_heads)                          # [N, T·B, d]
    dr = xp.matmul(hp.transpose(0, 2, 1), dh_all)
    db = column_sum(rt, d_flat) if rows else xp.zeros(d_flat.shape[1], dtype=x.dtype)
    return SLSTMSequenceGrads(dx, *carry, plan.flat(x).T @ d_flat, dr, db)
