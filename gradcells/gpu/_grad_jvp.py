"""Second order (docs/spec.md §12) on the GPU: the JVP of each gradient op, ``(grads,
grads_tangent)``, along the inputs' tangents and the upstream gradients' tangents: the
gradient's own plan with a tangent beside every value.

The saved result's tangent is the backend's own forward mode (``_jvp``); then the gradient
runs as the cell module's backward does (its own code: the primal is ``*_grad``'s, bit for
bit) with a tangent beside every value. Per step a tangent kernel runs beside the backward's
kernel (``rnn_backward_tangent``, ``gru_backward_candidate_tangent``,
``lstm_backward_tangent``, ...; the LSTM's before ``lstm_backward``, which overwrites the
``dcs`` carry it reads): it reads the step's primal values, their tangents and the tangents
of the upstream gradients, the carries and the weights, and writes the tangents of the gate
gradients, each branch as the primal takes it (relu'(z) = [z > 0], a clip's mask). The
matmuls are cuBLAS ones, by the product rule:

    g_prev' = (dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec             the recurrent carry, per step
    dx' = dz'·W_xᵀ + dz·W_x'ᵀ;   dW' = x'ᵀ·dz + xᵀ·dz';   db' = Σ dz'

the last line the cell module's input-and-weight gradient function called twice, (x, W, dZ')
and (x', W', dZ), and summed. Everything linear in the gradients (masks, zoneout's split,
rows past their length, the projection's clip mask) acts on the tangents exactly as on the
gradients: the same helpers run on the tangent arrays. The layer-normalised LSTM adds the
norms' backward tangents (``lstm_backward_tangent_ln`` for the cell norm inside the step,
``layer_norm_grad_tangent_rows`` for the gate norms, a thread per row), around the tangents
of the recomputed norm inputs ``z' = x'·W + x·W'``. A None tangent or upstream gradient is
zero (an upstream gradient given only by its tangent, or only itself, is the pair with
zeros for the other).
"""

from __future__ import annotations

from .._core import plan
from .._core.specs import PEEPHOLES
from . import _launch
from ._jvp import _zeros_or, input_tangent, recurrent_tangent, running
from ._launch import Launcher, column_sum, matmul


def upstream_pair(xp, g, g_t, like):
    """An upstream gradient and its tangent as C-contiguous arrays, ``(None, None)`` when
    both are None, else zeros (shaped as ``like``) for the missing one."""
    if g is None and g_t is None:
        return None, None
    return _zeros_or(xp, g, like), _zeros_or(xp, g_t, like)


def _zeros_filled(xp, tangents, primals):
    """``tangents`` with every None a zero tangent of its primal (None where the primal is;
    an ``LSTMNorm`` field by field), C-contiguous."""
    def fill(t, p):
        if p is None:
            return None
        if hasattr(p, "_fields"):
            return type(p)(*(fill(a, b) for a, b in zip(t or (None,) * len(p), p)))
        return xp.zeros_like(p, order="C") if t is None else xp.ascontiguousarray(t)

    return type(tangents)(*(fill(t, p) for t, p in zip(tangents, primals)))


def _sum_pairs(a, b):
    """Field by field ``a + b`` of two tuples of arrays (None stays None)."""
    return [x if y is None else x + y for x, y in zip(a, b)]


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


# ---- LSTM


def lstm_grad_jvp(rt, x, cs0, h0, weights, seq, t, settings, upstream, clip_grad):
    """The JVP of ``gradcells.gpu.lstm._backward`` along ``t`` (an
    ``LSTMSequenceGrads`` of the inputs' tangents, ``x``'s ``[T, B, I]``) and the upstream
    gradients' tangents (``upstream``: name -> ``(gradient, tangent)``, ``d_h``, ``d_cs``,
    ``d_h_final``, ``d_cs_final``): two lists of the fields of LSTMSequenceGrads. The
    saved steps' tangents are ``_jvp.lstm_jvp``'s; per step ``lstm_backward_tangent`` runs
    before ``lstm_backward`` (it reads the ``dcs`` carry that kernel overwrites)."""
    from .lstm import _masks, _NormGrad, _ProjectionGrad

    xp = rt.xp
    t = _zeros_filled(xp, t, (x, cs0, h0, *weights))
    d_steps = _jvp_steps(rt, x, cs0, h0, weights, t, settings)
    lengths = _launch.lengths(xp, settings.seq_len)
    x_run, t_x = running(xp, x, settings, lengths), running(xp, t.x, settings, lengths)
    steps = type(d_steps)(*(xp.ascontiguousarray(a) for a in seq[:len(d_steps)]))
    dtype, (n_steps, n_batch, _), n_hidden = x.dtype, x.shape, cs0.shape[1]
    likes = {"d_h": steps.h, "d_cs": steps.cs, "d_h_final": h0, "d_cs_final": cs0}
    pairs = {k: upstream_pair(xp, *upstream[k], likes[k]) for k in likes}
    ups, t_ups = ([pairs[k][j] for k in likes] for j in (0, 1))
    masks = _masks(xp, settings, n_steps, n_batch, n_hidden, h0.shape[1])
    h_prev = plan.masked(_launch.previous(xp, h0, steps.h), masks[0])
    t_h_prev = plan.masked(_launch.previous(xp, t.h0, d_steps.h), masks[0])
    norm = t_norm = None
    if weights.layer_norm is not None:
        norm = _NormGrad(rt, x_run, h_prev, weights, settings.ln_epsilon)
        t_norm = _NormTangent(rt, norm, t_x, t_h_prev, weights, t)
    proj = t_proj = None
    if weights.w_proj is not None:
        proj, t_proj = (_ProjectionGrad(xp, weights.w_proj, settings.proj_clip, clip_grad,
                                        lengths, steps, u[0], u[2], masks[2])
                        for u in (ups, t_ups))
    loop = _LSTMTangentLoop(rt, weights, t, settings, lengths, masks, (proj, t_proj),
                            (norm, t_norm), clip_grad, ups, t_ups, x.shape, cs0)
    d_gates, terms, dcs0, dh0, t_d_gates, t_terms, t_dcs0, t_dh0 = loop.run(
        steps, d_steps, cs0, t.cs0)
    if n_steps == 0:
        (dcs0, t_dcs0), (dh0, t_dh0) = (
            [xp.zeros(like.shape, dtype=dtype) if g is None else g.copy() for g in pair]
            for pair, like in ((pairs["d_cs_final"], cs0), (pairs["d_h_final"], h0)))
    elif lengths is not None and ups[2] is not None:  # rows that never ran
        never = (lengths == 0)[:, None]
        dh0, t_dh0 = (d + xp.where(never, g, xp.zeros_like(g))
                      for d, g in ((dh0, ups[2]), (t_dh0, t_ups[2])))
    primal, tangent = _lstm_products(rt, x_run, t_x, h_prev, t_h_prev, weights, t,
                                     (d_gates, terms, t_d_gates, t_terms), (norm, t_norm))
    dx, t_dx = (plan.running_inputs(xp, plan.masked(a, settings.input_mask), lengths)
                for a in (primal[0], tangent[0]))
    dw_proj = t_dw_proj = None
    if proj is not None:
        t_m = d_steps.o * steps.co + steps.o * d_steps.co
        dw_proj = proj.weight_grad()
        t_dw_proj = t_proj.weight_grad() + plan.flat(t_m).T @ plan.flat(proj.dh_raw)
    d_norm = t_d_norm = None
    if norm is not None:
        d_norm, t_d_norm = norm.parameter_grads(primal[2]), t_norm.parameter_grads(tangent[2])
    return ([dx, dcs0, dh0, *primal[1:], dw_proj, d_norm],
            [t_dx, t_dcs0, t_dh0, *tangent[1:], t_dw_proj, t_d_norm])


def _lstm_products(rt, x, t_x, h_prev, t_h_prev, weights, t, loop, norms):
    """``_input_and_weight_grads`` and its tangent, the product rule ``(x, W, dz') + (x', W',
    dz)`` (``db'`` and the peepholes' from ``dz'`` alone); ``loop``: the gate gradients,
    the peephole terms and their tangents; with a layer norm (``norms``: the ``_NormGrad``
    and its ``_NormTangent``) ``dz`` through the gate norms."""
    from .lstm import _input_and_weight_grads

    d_gates, terms, t_d_gates, t_terms = loop
    norm, t_norm = norms
    dz_x, dz_h, t_dz_x, t_dz_h = d_gates, d_gates, t_d_gates, t_d_gates
    if norm is not None:
        dz_x, dz_h = norm.input_grad(d_gates), norm.dz_h
        t_dz_x, t_dz_h = t_norm.input_grad(d_gates, t_d_gates), t_norm.dz_h
    primal = _input_and_weight_grads(rt, x, h_prev, weights.w, d_gates, terms, dz_x, dz_h)
    tangent = _sum_pairs(
        _input_and_weight_grads(rt, x, h_prev, weights.w, t_d_gates, t_terms, t_dz_x, t_dz_h),
        [*_input_and_weight_grads(rt, t_x, t_h_prev, t.w, d_gates, None, dz_x, dz_h)[:2],
         None, None, None, None])
    return primal, tangent


def _jvp_steps(rt, x, cs0, h0, weights, t, settings):
    """The saved steps' tangents (an LSTMCellState of ``[T, B, H]`` arrays), by
    ``_jvp.lstm_jvp``."""
    from ._jvp import lstm_jvp

    return lstm_jvp(rt, x, t.x, cs0, h0, weights, t, settings)[3]


class _LSTMTangentLoop:
    """The backward loop of ``gradcells.gpu.lstm._backward_steps`` with its tangent: per
    step (from the last) ``lstm_backward_tangent`` then ``lstm_backward``, then the carries
    ``dh = (dz·W_hᵀ)∘m_rec`` and ``dh' = (dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec``, plus zoneout's old
    state's parts (the kernels' ``dh_zoned`` or the projections'). With a projection
    (``proj``, ``t_proj``: ``_ProjectionGrad``s of the upstream gradients and of their
    tangents, the same clip mask) the kernels' ``d_h`` is ``dm`` and its tangent
    ``dm' = dh_raw'·w_projᵀ + dh_raw·w_proj'ᵀ``."""

    def __init__(self, rt, weights, t, settings, lengths, masks, projections, norms,
                 clip_grad, ups, t_ups, shape, cs0):
        from .lstm import _backward_kernel, _peepholes

        proj, t_proj = projections
        self.norm, self.t_norm = norms

        xp = self.xp = rt.xp
        n_steps, n_batch, n_in = shape
        n_hidden, dtype = cs0.shape[1], cs0.dtype
        self.w_h, self.t_w_h = weights.w[n_in:], t.w[n_in:]
        self.t_w_proj, self.proj, self.t_proj = t.w_proj, proj, t_proj
        self.masks, self.ups, self.t_ups, self.placeholder = masks, ups, t_ups, cs0
        self.peephole = settings.peepholes
        self.n_steps = n_steps
        self.d_gates, self.t_d_gates = (xp.empty((n_steps, n_batch, 4 * n_hidden), dtype=dtype)
                                        for _ in range(2))
        self.terms, self.t_terms = ((xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype)
                                     if self.peephole else None) for _ in range(2))
        self.dcs, self.t_dcs = (xp.empty((n_batch, n_hidden), dtype=dtype) for _ in range(2))
        self.zone_h = masks[2] is not None and proj is None
        self.dh_zoned, self.t_dh_zoned = (
            xp.empty((n_batch, n_hidden), dtype=dtype) if self.zone_h else cs0
            for _ in range(2))
        common = (rt, weights, settings, lengths, masks, proj, clip_grad)
        self.backward = _backward_kernel(*common, ups, shape, cs0, dh_zoned=self.dh_zoned,
                                         dcs_next=self.dcs, dcs_prev=self.dcs)
        t_peepholes = _peepholes(xp, t, settings, cs0)
        t_cell_norm = {} if self.norm is None else {
            "t_gamma_c": t.layer_norm.gamma_c, "t_beta_c": t.layer_norm.beta_c}
        self.tangent = _backward_kernel(
            *common, ups, shape, cs0, name="lstm_backward_tangent", **t_cell_norm,
            **{f"t_{k}": v for k, v in zip(PEEPHOLES, t_peepholes)},
            t_d_h_final=cs0 if t_ups[2] is None else t_ups[2],
            t_d_cs_final=cs0 if t_ups[3] is None else t_ups[3], t_dh_zoned=self.t_dh_zoned,
            dcs_next=self.dcs, t_dcs_next=self.t_dcs, t_dcs_prev=self.t_dcs)

    def run(self, steps, d_steps, cs0, t_cs0):
        """The loop: ``(d_gates, terms, dcs0, dh0)`` and their tangents (``dcs0``, ``dh0``
        None when T = 0)."""
        z_cs = self.masks[1]
        dh = t_dh = None
        at = _launch.at_step
        for step in reversed(range(self.n_steps)):
            state = {k: getattr(steps, k)[step] for k in ("i", "cs", "f", "o", "ci", "co")}
            d_state = {f"t_{k}": getattr(d_steps, k)[step] for k in state}
            dh_args, t_dh_args = self._dh_arguments(step, dh, t_dh)
            zones = {"zoneout_cs": at(z_cs, step, self.placeholder),
                     "zoneout_h": at(self.masks[2] if self.zone_h else None, step,
                                     self.placeholder)}
            d_cs, t_d_cs = (self.placeholder if a is None else a[step]
                            for a in (self.ups[1], self.t_ups[1]))
            self.tangent(cs_prev=cs0 if step == 0 else steps.cs[step - 1],
                         t_cs_prev=t_cs0 if step == 0 else d_steps.cs[step - 1],
                         **state, **d_state, **dh_args, **t_dh_args, d_cs=d_cs,
                         t_d_cs=t_d_cs, step=step, **zones,
                         t_d_gates=self.t_d_gates[step],
                         t_peephole_terms=self._at(self.t_terms, step),
                         **self._norm_terms(self.t_norm, step, "t_norm_terms"))
            self.backward(cs_prev=cs0 if step == 0 else steps.cs[step - 1], **state,
                          **dh_args, d_cs=d_cs, step=step, **zones,
                          d_gates=self.d_gates[step],
                          peephole_terms=self._at(self.terms, step),
                          **self._norm_terms(self.norm, step, "norm_terms"))
            dh, t_dh = self._carries(step)
        return (self.d_gates, self.terms, self.dcs, dh, self.t_d_gates, self.t_terms,
                self.t_dcs, t_dh)

    @staticmethod
    def _norm_terms(norm, step, name):
        """The layer-normalised kernels' cell-norm terms of ``step`` (none without)."""
        return {} if norm is None else {name: norm.cell_terms[step]}

    def _at(self, terms, step):
        return terms[step] if terms is not None else self.placeholder

    def _dh_arguments(self, step, dh, t_dh):
        """Both kernels' ``d_h`` and ``dh_next`` at ``step`` (and their tangents')."""
        if self.proj is not None:
            t_dm = self.t_proj.step(step, t_dh)
            dm = self.proj.step(step, dh)
            t_dm += matmul(self.xp, self.proj.dh_raw[step], self.t_w_proj.T)
            zero = self.proj.zero_carry
            return {"d_h": dm, "dh_next": zero}, {"t_d_h": t_dm, "t_dh_next": zero}
        pick = [self.placeholder if a is None else a[step]
                for a in (self.ups[0], self.t_ups[0])]
        return ({"d_h": pick[0], "dh_next": self.placeholder if dh is None else dh},
                {"t_d_h": pick[1], "t_dh_next": self.placeholder if t_dh is None else t_dh})

    def _carries(self, step):
        """The carries ``dh`` and ``dh'`` before ``step``."""
        xp, m_rec, z_h = self.xp, self.masks[0], self.masks[2]
        dz, t_dz = self.d_gates[step], self.t_d_gates[step]
        if self.norm is not None:  # through the recurrent part's norm
            dz, t_dz = (self.norm.recurrent_grad(step, dz),
                        self.t_norm.recurrent_grad(step, dz, t_dz))
        dh = plan.masked(matmul(xp, dz, self.w_h.T), m_rec)
        t_dh = plan.masked(matmul(xp, t_dz, self.w_h.T) + dz @ self.t_w_h.T, m_rec)
        if z_h is not None:  # the old state's part of the zoned h's gradient
            if self.proj is None:
                dh, t_dh = dh + self.dh_zoned, t_dh + self.t_dh_zoned
            else:
                dh, t_dh = dh + self.proj.dh_old, t_dh + self.t_proj.dh_old
        return xp.ascontiguousarray(dh), xp.ascontiguousarray(t_dh)


class _NormTangent:
    """The tangent of ``gradcells.gpu.lstm._NormGrad`` (``norm``): the recomputed gate
    norms' inputs' tangents ``z_x' = x'·W_x + x·W_x'`` and ``z_h' = h_prev'·W_h +
    h_prev·W_h'`` (one matmul pair each), ``layer_norm_grad_tangent_rows`` per step for the
    recurrent part and after the loop for the x part, and the parameter gradients'
    tangents (column sums of the terms' tangents; each β's is the bias's)."""

    def __init__(self, rt, norm, t_x, t_h_prev, weights, t):
        xp = rt.xp
        self.rt, self.norm, self.d_norm = rt, norm, t.layer_norm
        n_steps, n_batch, n_in = t_x.shape
        width = weights.w.shape[1]
        w, t_w, x, h_prev = weights.w, t.w, norm.x, norm.h_prev
        self.z_x = (plan.flat(t_x) @ w[:n_in] + plan.flat(x) @ t_w[:n_in]).reshape(
            n_steps, n_batch, width)
        self.z_h = (plan.flat(t_h_prev) @ w[n_in:] + plan.flat(h_prev) @ t_w[n_in:]).reshape(
            n_steps, n_batch, width)
        self.dz_h, self.h_terms = (xp.empty((n_steps, n_batch, width), dtype=t_x.dtype)
                                   for _ in range(2))
        self.x_terms = None
        self.cell_terms = xp.empty((n_steps, n_batch, width // 2), dtype=t_x.dtype)

    def recurrent_grad(self, step, d_gates, t_d_gates):
        """``dz_h'`` of ``step`` (kept for ``dW_h'``)."""
        norm = self.norm
        return _norm_grad_tangent_rows(self.rt, d_gates, t_d_gates, norm.z_h[step],
                                       self.z_h[step], norm.norm.gamma_h, self.d_norm.gamma_h,
                                       norm.epsilon, self.dz_h[step], self.h_terms[step])

    def input_grad(self, d_gates, t_d_gates):
        """``dz_x'`` of every step."""
        norm = self.norm
        self.x_terms = self.rt.xp.empty_like(t_d_gates)
        return _norm_grad_tangent_rows(self.rt, d_gates, t_d_gates, norm.z_x, self.z_x,
                                       norm.norm.gamma_x, self.d_norm.gamma_x, norm.epsilon,
                                       self.rt.xp.empty_like(t_d_gates), self.x_terms)

    def parameter_grads(self, t_db):
        """The six parameter gradients' tangents, an ``LSTMNorm``."""
        from .._core.types import LSTMNorm

        rt, hidden = self.rt, self.cell_terms.shape[2] // 2
        cell = column_sum(rt, plan.flat(self.cell_terms))
        return LSTMNorm(column_sum(rt, plan.flat(self.x_terms)), t_db.copy(),
                        column_sum(rt, plan.flat(self.h_terms)), t_db.copy(),
                        cell[:hidden].copy(), cell[hidden:].copy())


def _norm_grad_tangent_rows(rt, dy, t_dy, z, t_z, gamma, t_gamma, epsilon, t_dz, t_terms):
    """The tangent of the layer norm's backward over the last axis
    (``layer_norm_grad_tangent_rows``, a thread per row) into ``t_dz`` and ``t_terms``
    (C-contiguous); returns ``t_dz``."""
    xp = rt.xp
    cols = z.shape[-1]
    rows = z.size // cols if cols else 0
    Launcher(rt, "layer_norm_grad_tangent_rows", dy.dtype, rows)(
        dy=xp.ascontiguousarray(dy), t_dy=xp.ascontiguousarray(t_dy),
        z=xp.ascontiguousarray(z), t_z=xp.ascontiguousarray(t_z),
        gamma=xp.ascontiguousarray(gamma), t_gamma=xp.ascontiguousarray(t_gamma),
        epsilon=epsilon, rows=rows, cols=cols, t_dz=t_dz, t_dgamma_terms=t_terms)
    return t_dz
