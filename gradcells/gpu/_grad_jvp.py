"""Second order (docs/spec.md §12) on the GPU: the JVP of each gradient op, ``(grads,
grads_tangent)``, along the inputs' tangents and the upstream gradients' tangents.

The saved result's tangent is the backend's own forward mode (``_jvp``); then the gradient
runs as the cell module's backward does (its own code: the primal is ``*_grad``'s, bit for
bit) with a tangent beside every value. Per step a tangent kernel runs beside the backward's
kernel (``rnn_backward_tangent``, ...): it reads the step's primal values, their tangents and
the tangents of the upstream gradient and the carry, recomputes the primal gate gradients and
writes their tangents (branches follow the primals: relu'(z) = [z > 0]). The matmuls are
cuBLAS ones, by the product rule:

    g_prev' = (dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec             the recurrent carry, per step
    dx' = dz'·W_xᵀ + dz·W_x'ᵀ;   dW' = x'ᵀ·dz + xᵀ·dz';   db' = Σ dz'

the last line the cell module's input-and-weight gradient function called twice, (x, W, dZ')
and (x', W', dZ), and summed. Everything linear in the state (masks, zoneout's split, rows
past their length) acts on the tangents exactly as on the gradients. A None tangent or
upstream gradient is zero (an upstream gradient given only by its tangent, or only itself,
is the pair with zeros for the other).
"""

from __future__ import annotations

from .._core import plan
from . import _launch
from ._jvp import _zeros_or, input_tangent, recurrent_tangent, running


def upstream_pair(xp, g, g_t, like):
    """An upstream gradient and its tangent as C-contiguous arrays, ``(None, None)`` when
    both are None, else zeros (shaped as ``like``) for the missing one."""
    if g is None and g_t is None:
        return None, None
    return _zeros_or(xp, g, like), _zeros_or(xp, g_t, like)


# ---- RNN


def rnn_grad_jvp(rt, x, h0, weights, h, tangents, settings, upstream):
    """``rnn_sequence_grad`` from the saved steps ``h`` and its tangent along ``tangents``
    (an ``RNNSequenceGrads`` or ``RNNCellGrads`` of ``[T, B, ·]`` x tangents, None fields
    zero) and ``upstream = (d_h, d_h_t, d_h_final, d_h_final_t)`` (``upstream_pair``s):
    two lists of the fields of RNNSequenceGrads. The primal is ``gpu.rnn._backward``'s, with
    ``_RNNTangent`` as its step hook; the saved steps' tangent is ``_jvp.rnn_jvp``'s."""
    from ._jvp import rnn_jvp
    from .rnn import _backward, _initial_state_grad, _input_and_weight_grads

    xp = rt.xp
    t_x, t_h0, t_w, t_b = tangents
    d_h, d_h_t, d_h_final, d_h_final_t = upstream
    t_h0, t_w = _zeros_or(xp, t_h0, h0), _zeros_or(xp, t_w, weights.w)
    t_steps = rnn_jvp(rt, x, t_x, h0, t_h0, weights, t_w, t_b, settings)[2]
    hook = _RNNTangent(rt, x, t_x, h0, t_h0, weights, (t_w, t_b), xp.ascontiguousarray(h),
                       t_steps, settings, upstream)
    grads = _backward(rt, x, h0, weights, h, settings, d_h=d_h, d_h_final=d_h_final,
                      tangent=hook)
    dh0_t = _initial_state_grad(xp, h0, hook.carry, hook.lengths, d_h_final_t)
    d_z = hook.d_z_t if hook.d_z is None else hook.d_z  # T = 0: both empty
    dx_t, dw_t, db_t = _input_and_weight_grads(rt, hook.x, hook.h_seen, weights.w, hook.d_z_t)
    dx_w, dw_w, _ = _input_and_weight_grads(rt, hook.t_x, hook.t_seen, t_w, d_z)
    dx_t = plan.running_inputs(xp, plan.masked(dx_t + dx_w, settings.input_mask),
                               hook.lengths)
    return list(grads), [dx_t, dh0_t, dw_t + dw_w, db_t]


def _rnn_outputs(rt, x, t_x, h_seen, t_seen, weights, t_w, t_b, settings):
    """Every step's own output ``act(z_t)`` (``gpu.rnn._unzoned``) and its tangent, ``[T, B,
    H]``: ``rnn_forward_tangent`` over the T·B rows on the tangent's input part (x'·W_x +
    x·W_x' + b') and recurrent part (h_seen'·W_h + h_seen·W_h'), no lengths."""
    from .rnn import _input_part, _unzoned, _use_relu

    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = h_seen.shape[2]
    out = _unzoned(rt, x, h_seen, weights, settings)
    t_out = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    rows = n_steps * n_batch
    w_x, w_h = weights.w[:n_in], weights.w[n_in:]
    _launch.Launcher(rt, "rnn_forward_tangent", x.dtype, rows * n_hidden)(
        gx=_input_part(xp, x, w_x), gh=_launch.matmul(xp, plan.flat(h_seen), w_h),
        b=xp.ascontiguousarray(weights.b),
        dgx=input_tangent(xp, x, t_x, w_x, t_w[:n_in], t_b, n_hidden),
        dgh=recurrent_tangent(xp, plan.flat(h_seen), plan.flat(t_seen), w_h, t_w[n_in:]),
        seq_len=_launch.lengths_argument(xp, None), use_relu=_use_relu(settings),
        use_seq_len=False, step=0, batch=rows, hidden=n_hidden, dh=t_out, dh_state=t_out)
    return out, t_out


class _RNNTangent:
    """``gpu.rnn._backward_steps``'s step hook: after step t's ``rnn_backward``,
    ``rnn_backward_tangent`` (the tangent of its ``dz``, into ``d_z_t[t]``) and the tangent
    carry ``(dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec`` (plus zoneout's ``z∘g'``), kept in ``carry``.
    Built from the call's arrays: the inputs and states as the matmuls saw them (``x``,
    ``h_seen`` and their tangents) and each step's own output ``act(z_t)`` and tangent."""

    def __init__(self, rt, x, t_x, h0, t_h0, weights, t_weights, h, t_steps, settings,
                 upstream):
        from .rnn import _masks, _use_relu

        xp = self.xp = rt.xp
        t_w, t_b = t_weights
        self.lengths = lengths = _launch.lengths(xp, settings.seq_len)
        self.x = running(xp, x, settings, lengths)
        self.t_x = running(xp, _zeros_or(xp, t_x, x), settings, lengths)
        n_steps, n_batch, n_in = self.x.shape
        n_hidden = h0.shape[1]
        self.m_rec, self.z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
        self.h_seen = plan.masked(_launch.previous(xp, h0, h), self.m_rec)
        self.t_seen = plan.masked(_launch.previous(xp, t_h0, t_steps), self.m_rec)
        self.w_h, self.t_w_h = weights.w[n_in:], t_w[n_in:]
        self.outputs, self.t_outputs = (h, t_steps) if self.z_h is None else _rnn_outputs(
            rt, self.x, self.t_x, self.h_seen, self.t_seen, weights, t_w, t_b, settings)
        self.d_h, self.d_h_t, d_h_final, d_h_final_t = upstream
        self.carry = self.d_z = None
        self.d_z_t = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
        self.placeholder = placeholder = self.outputs
        self.dh_zoned_t = (placeholder if self.z_h is None
                           else xp.empty((n_batch, n_hidden), dtype=x.dtype))
        self.kernel = _launch.Launcher(
            rt, "rnn_backward_tangent", x.dtype, n_batch * n_hidden,
            d_h_final=placeholder if d_h_final is None else d_h_final,
            d_h_final_t=placeholder if d_h_final_t is None else d_h_final_t,
            seq_len=_launch.lengths_argument(xp, lengths), use_relu=_use_relu(settings),
            has_d_h=self.d_h is not None, has_d_h_final=d_h_final is not None,
            use_seq_len=lengths is not None, use_zoneout_h=self.z_h is not None,
            n_steps=n_steps, batch=n_batch, hidden=n_hidden, dh_zoned_t=self.dh_zoned_t)

    def __call__(self, t, dh_next, d_z):
        placeholder = self.placeholder
        self.d_z = d_z
        given = self.d_h is not None
        self.kernel(h=self.outputs[t], h_t=self.t_outputs[t],
                    d_h=self.d_h[t] if given else placeholder,
                    d_h_t=self.d_h_t[t] if given else placeholder,
                    dh_next=placeholder if dh_next is None else dh_next,
                    dh_next_t=placeholder if self.carry is None else self.carry, step=t,
                    zoneout_h=_launch.at_step(self.z_h, t, placeholder), d_z_t=self.d_z_t[t])
        carry = recurrent_tangent(self.xp, d_z[t], self.d_z_t[t], self.w_h.T, self.t_w_h.T)
        carry = plan.masked(carry, self.m_rec)
        self.carry = carry if self.z_h is None else carry + self.dh_zoned_t


# ---- GRU


def gru_grad_jvp(rt, x, h0, weights, steps, tangents, settings, upstream):
    """``gru_sequence_grad`` from the saved steps ``(r, u, c, h)`` and its tangent along
    ``tangents`` (a ``GRUSequenceGrads`` or ``GRUCellGrads`` of ``[T, B, ·]`` x tangents,
    None fields zero) and ``upstream = (d_h, d_h_t, d_h_final, d_h_final_t)``
    (``upstream_pair``s): two lists of the fields of GRUSequenceGrads. The primal is
    ``gpu.gru._backward``'s, with ``_GRUTangent`` as its step hook; the saved steps'
    tangents are ``_jvp.gru_jvp``'s."""
    from .._core.types import GRUWeights
    from ._jvp import gru_jvp
    from .gru import _backward, _weight_grads

    xp = rt.xp
    t_x, t_h0 = tangents[:2]
    d_h, d_h_t, d_h_final, d_h_final_t = upstream
    t_h0 = _zeros_or(xp, t_h0, h0)
    t_weights = GRUWeights(*(_zeros_or(xp, t, w) for t, w in zip(tangents[2:], weights)))
    t_steps = gru_jvp(rt, x, t_x, h0, t_h0, weights, tuple(t_weights), settings)[2]
    hook = _GRUTangent(rt, x, t_x, h0, t_h0, weights, t_weights, steps, t_steps, settings,
                       upstream)
    grads = _backward(rt, x, h0, weights, steps, settings, d_h=d_h, d_h_final=d_h_final,
                      tangent=hook)
    if hook.carry is None:  # T = 0
        dh0_t = xp.zeros_like(h0) if d_h_final_t is None else d_h_final_t.copy()
        d_gates, d_n, rh = hook.d_gates_t, hook.d_n_t, hook.rh_t  # empty
    else:
        dh0_t = hook.carry + hook.dh_direct_t
        d_gates, d_n, rh = hook.primal
    m_rec = hook.m_rec
    rh, rh_t = (None, None) if rh is None else (plan.masked(rh, m_rec),
                                                plan.masked(hook.rh_t, m_rec))
    dx_t, dw_ru_t, dw_c_t, db_ru_t, db_c_t = _weight_grads(
        rt, hook.x, weights, hook.h_seen, hook.d_gates_t, hook.d_n_t, rh)
    dx_w, dw_ru_w, dw_c_w, _, _ = _weight_grads(rt, hook.t_x, t_weights, hook.t_seen, d_gates,
                                                d_n, rh_t)
    dx_t = plan.running_inputs(xp, plan.masked(dx_t + dx_w, settings.input_mask),
                               hook.lengths)
    return list(grads), [dx_t, dh0_t, dw_ru_t + dw_ru_w, dw_c_t + dw_c_w, db_ru_t, db_c_t]


class _GRUTangent:
    """``gpu.gru._backward_steps``'s step hook: at the end of step t,
    ``gru_backward_candidate_tangent`` (on the carry that step's kernel read: its matmul
    part, and the direct part kept from step t + 1 in ``direct``, since the kernel writes
    its own over it), reset before the tangent of ``d_hr``, ``(dC'·W_chᵀ + dC·W_ch'ᵀ)∘m_rec``,
    and ``gru_backward_reset_tangent``, then the tangent carry ``([dR', dU']·W_ruhᵀ +
    [dR, dU]·W_ruh'ᵀ (+ dN'·W_chᵀ + dN·W_ch'ᵀ reset after))∘m_rec``, kept in ``carry``
    (its direct part in ``dh_direct_t``). Built from the call's arrays: the inputs and
    states as the matmuls saw them (``x``, ``h_seen`` and their tangents), the saved steps
    and theirs, reset after ``n_pre``'s tangent ``h_seen'·W_ch + h_seen·W_ch' + b_ch'``."""

    def __init__(self, rt, x, t_x, h0, t_h0, weights, t_weights, steps, t_steps, settings,
                 upstream):
        from .gru import _masks

        xp = self.xp = rt.xp
        self.reset_after = reset_after = settings.reset_after
        self.lengths = lengths = _launch.lengths(xp, settings.seq_len)
        self.x = running(xp, x, settings, lengths)
        self.t_x = running(xp, _zeros_or(xp, t_x, x), settings, lengths)
        n_steps, n_batch, n_in = self.x.shape
        n_hidden = h0.shape[1]
        shape, dtype = (n_steps, n_batch, n_hidden), x.dtype
        self.m_rec, self.z_h = _masks(xp, settings, *shape)
        self.steps = [xp.ascontiguousarray(a) for a in steps[:4]]
        self.t_steps = t_steps
        self.h_prev = _launch.previous(xp, h0, self.steps[3])
        self.t_prev = _launch.previous(xp, t_h0, t_steps.h)
        self.h_seen = plan.masked(self.h_prev, self.m_rec)
        self.t_seen = plan.masked(self.t_prev, self.m_rec)
        self.w_ruh, self.w_ch = weights.w_ru[n_in:], weights.w_c[n_in:]
        self.t_w_ruh, self.t_w_ch = t_weights.w_ru[n_in:], t_weights.w_c[n_in:]
        self.n_pre_t = None
        if reset_after:
            self.n_pre_t = recurrent_tangent(xp, plan.flat(self.h_seen), plan.flat(self.t_seen),
                                             self.w_ch, self.t_w_ch)
            self.n_pre_t = (self.n_pre_t + t_weights.b_c[n_hidden:]).reshape(shape)
        self.d_gates_t = xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype)
        self.d_n_t = xp.empty(shape, dtype=dtype) if reset_after else None
        self.rh_t = None if reset_after else xp.empty(shape, dtype=dtype)
        self.dh_direct_t = xp.empty((n_batch, n_hidden), dtype=dtype)
        self.d_h, self.d_h_t, d_h_final, d_h_final_t = upstream
        self.carry = self.direct = self.primal = None
        self.placeholder = placeholder = xp.ascontiguousarray(weights.b_c)
        n = n_batch * n_hidden
        self.candidate = _launch.Launcher(
            rt, "gru_backward_candidate_tangent", dtype, n, b_c=placeholder,
            d_h_final=placeholder if d_h_final is None else d_h_final,
            d_h_final_t=placeholder if d_h_final_t is None else d_h_final_t,
            seq_len=_launch.lengths_argument(xp, lengths), reset_after=reset_after,
            has_d_h=self.d_h is not None, has_d_h_final=d_h_final is not None,
            use_seq_len=lengths is not None, use_zoneout_h=self.z_h is not None,
            n_steps=n_steps, batch=n_batch, hidden=n_hidden, dh_next_b_t=self.dh_direct_t,
            dh_direct_t=self.dh_direct_t)
        self.reset = _launch.Launcher(rt, "gru_backward_reset_tangent", dtype, n,
                                      batch=n_batch, hidden=n_hidden,
                                      dh_direct_t=self.dh_direct_t)

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
            n_pre_t=self.n_pre_t[t] if ra else placeholder,
            d_h=self.d_h[t] if given else placeholder,
            d_h_t=self.d_h_t[t] if given else placeholder, dh_next_a=either(dh_next_a),
            dh_next_b=either(self.direct), dh_next_a_t=either(self.carry), step=t,
            zoneout_h=_launch.at_step(self.z_h, t, placeholder), d_gates_t=self.d_gates_t[t],
            d_n_t=self.d_n_t[t] if ra else placeholder, rh_t=placeholder if ra else self.rh_t[t])
        n_ru = self.w_ruh.shape[1]
        d_gates_t = self.d_gates_t[t]
        if not ra:
            d_hr_t = plan.masked(recurrent_tangent(xp, d_gates[t][:, n_ru:], d_gates_t[:, n_ru:],
                                                   self.w_ch.T, self.t_w_ch.T), self.m_rec)
            self.reset(d_hr=d_hr, d_hr_t=xp.ascontiguousarray(d_hr_t), r=r[t], r_t=t_r[t],
                       h_prev=self.h_prev[t], h_prev_t=self.t_prev[t], d_gates_t=d_gates_t)
        carry = recurrent_tangent(xp, d_gates[t][:, :n_ru], d_gates_t[:, :n_ru], self.w_ruh.T,
                                  self.t_w_ruh.T)
        if ra:
            carry += recurrent_tangent(xp, d_n[t], self.d_n_t[t], self.w_ch.T, self.t_w_ch.T)
        self.carry = plan.masked(carry, self.m_rec)
        self.direct = dh_direct.copy()
