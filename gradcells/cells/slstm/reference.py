"""xLSTM's sLSTM cell and the sLSTM over time, forward and gradient, written once for any
array namespace (docs/spec.md §19; Beck et al. 2024, NX-AI/xlstm's vanilla backend).

Layout: ``w [I, 4H]`` (gate-major column blocks i, f, z, o of width H), ``r [N, d, 4d]``
with ``d = H/N`` (head k's slice ``h[:, k·d:(k+1)·d]`` times ``r[k]`` gives its four gate
blocks, gate-major, landing at columns ``g·H + k·d + j``), ``b [4H]``.

    (ĩ, f̃, z̃, õ) = x·w + rec(h_prev, r) + b
    lf = log σ(f̃)   (forget="sigmoid"; written -softplus(-f̃) without overflow)
    lf = f̃          (forget="exp")
    m = max(ĩ, lf + m_prev)                 the stabiliser
    i = exp(ĩ - m);   f = exp(lf + m_prev - m)         both <= 1, one of them = 1
                                            (flushed to 0 below ε²: ``flushed_exp``)
    z = tanh(z̃);   o = σ(õ)
    c = f∘c_prev + i∘z;   n = f∘n_prev + i;   h = o∘c/n

The stabiliser cancels in ``h``: scaling ``(c, n)`` by ``e^{-m}`` leaves ``c/n`` alone, so
``h`` is that of the unstabilised cell ``c = e^{lf} c_prev + e^{ĩ} z`` in the scale
``c_prev·e^{m_prev}``. It does not cancel in the returned state ``c, n, m``.

The backward, in terms of the saved outputs (``i, f, z, o, c, n, h`` of the step and the
states it started from) and the forget pre-activation ``f̃`` (recomputed: one matmul),
with ``gc, gn, gm`` the total gradients of ``c, n, m`` (upstream plus what the next step
sends back) and ``gh`` that of ``h``:

    h = o c / n:      gc += gh∘o/n;   gn -= gh∘h/n;   go = d_o + gh∘c/n
    c, n:             gi = d_i + gc∘z + gn;   gf = d_f + gc∘c_prev + gn∘n_prev
                      gz = d_z + gc∘i;   dc_prev = gc∘f;   dn_prev = gn∘f
    i = exp(ĩ - m):   dĩ = gi∘i,   gm -= gi∘i
    f = exp(lf + m_prev - m):   dlf = gf∘f,   dm_prev = gf∘f,   gm -= gf∘f
    m = max(ĩ, lf + m_prev):    gm goes to ĩ where the ĩ branch was taken, else to lf and
                                m_prev (a tie to ĩ)
    dz̃ = gz∘(1 - z²);   dõ = go∘o(1 - o);   df̃ = dlf∘σ(-f̃) (sigmoid) or dlf (exp)

The branch is read from the saved ``i``: the ĩ branch is where ``i = 1``, that is where
``ĩ - m`` is exactly zero (a tie included; a forget branch within rounding of ĩ reads as
ĩ's too, where the two one-sided derivatives are equally valid). ``stabilizer_grad="stop"``
holds ``m`` constant: ``gm`` is dropped (``d_m`` too) and ``dm_prev = 0``; that is xLSTM's
CUDA backward. For a loss on ``h`` alone it changes nothing but the gradient of ``m0``
(zero instead of exact): ``h`` does not depend on the stabiliser, except through the scale
``e^{m0}`` of the initial ``c0, n0``.

The sequence ops take the backend protocol's arguments (``.spec.SLSTMBackend``): the
arrays, an ``SLSTMWeights`` and an ``SLSTMSettings``.
"""

from __future__ import annotations

import math

from ..._core import plan
from ..._core.arrays import namespace_of
from ..._core.xpmath import (
    blocks,
    filled,
    gradient_jvp,
    keep,
    masked,
    sigmoid,
    valid_rows,
)
from .spec import SLSTMCellGrads, SLSTMCellState, SLSTMSequence, SLSTMSequenceGrads

_GATES = ("d_i", "d_f", "d_z", "d_o")


def flushed_exp(xp, a):
    """``e^a`` for ``a <= 0``, flushed to exactly 0 below ``ε²`` (``a < 2·log ε``, ε the
    dtype's machine epsilon): a gate that small is below the rounding of the other gate, which
    is 1, and a flushed gate makes no underflow anywhere downstream (as the σ written with
    tanh is exactly 0 or 1 at its extremes)."""
    floor = 2 * math.log(float(xp.finfo(a.dtype).eps))
    return xp.where(a < floor, 0, xp.exp(xp.maximum(a, floor)))


def log_sigmoid(xp, z):
    """``log σ(z) = min(z, 0) - log1p(e^{-|z|})``: finite for every finite z, exact to
    rounding for large ``|z|`` (``-softplus(-z)``)."""
    return xp.minimum(z, 0) - xp.log1p(flushed_exp(xp, -abs(z)))


def head_columns(a, n_heads, k):
    """Head ``k``'s four gate blocks of ``a [..., 4H]``, side by side ``[..., 4H/N]``."""
    xp = namespace_of(a)
    width = a.shape[-1] // 4
    d = width // n_heads
    return xp.concatenate([a[..., g * width + k * d: g * width + (k + 1) * d]
                           for g in range(4)], axis=-1)


def recurrent(h, r):
    """``rec(h, r)``: each head's ``h[:, k·d:(k+1)·d]·r[k]``, its four gate blocks put at
    columns ``g·H + k·d + j`` ``[rows, 4H]``."""
    xp = namespace_of(h)
    n_heads, d = r.shape[0], r.shape[1]
    parts = [h[:, k * d:(k + 1) * d] @ r[k] for k in range(n_heads)]
    return xp.concatenate([p[:, g * d:(g + 1) * d] for g in range(4) for p in parts], axis=1)


def recurrent_grad_h(d_pre, r):
    """The gradient of ``h`` through ``rec(h, r)``: ``dh_k = dG_k·r[k]ᵀ`` per head."""
    xp = namespace_of(d_pre)
    n_heads = r.shape[0]
    return xp.concatenate([head_columns(d_pre, n_heads, k) @ r[k].T for k in range(n_heads)],
                          axis=1)


def recurrent_grad_r(h, d_pre, r):
    """The gradient of ``r`` through ``rec(h, r)`` (``h``, ``d_pre``: ``[rows, ·]``):
    ``dr[k] = h_kᵀ·dG_k``."""
    xp = namespace_of(d_pre)
    n_heads, d = r.shape[0], r.shape[1]
    dr = xp.zeros(r.shape, dtype=d_pre.dtype)
    for k in range(n_heads):
        dr[k] = h[:, k * d:(k + 1) * d].T @ head_columns(d_pre, n_heads, k)
    return dr


def slstm_activations(xp, pre, m_prev, c_prev, n_prev, forget):
    """The step from its pre-activations ``pre [B, 4H]`` and the previous state:
    ``(i, f, z, o, c, n, m, h)``."""
    it, ft, zt, ot = blocks(pre, 4)
    lfm = (log_sigmoid(xp, ft) if forget == "sigmoid" else ft) + m_prev
    m = xp.maximum(it, lfm)
    i, f = flushed_exp(xp, it - m), flushed_exp(xp, lfm - m)
    z, o = xp.tanh(zt), sigmoid(xp, ot)
    c = f * c_prev + i * z
    n = f * n_prev + i
    return i, f, z, o, c, n, m, o * c / n


def slstm_step_grad(xp, step, c_prev, n_prev, f_pre, up, settings):
    """One step's backward (the module docstring's), from the step's saved ``(i, f, z, o,
    c, n, h)`` (``step``, a mapping), the states it started from, the forget
    pre-activation ``f_pre`` (read for the sigmoid forget only) and the total upstream
    gradients ``up`` (``d_h, d_c, d_n, d_m, d_i, d_f, d_z, d_o``, arrays). Returns
    ``(dG [B, 4H], dc_prev, dn_prev, dm_prev)``."""
    i, f, z, o, c, n, h = (step[k] for k in ("i", "f", "z", "o", "c", "n", "h"))
    gc = up["d_c"] + up["d_h"] * o / n
    gn = up["d_n"] - up["d_h"] * h / n
    d_o = (up["d_o"] + up["d_h"] * c / n) * (o * (1 - o))
    gi = up["d_i"] + gc * z + gn
    gf = up["d_f"] + gc * c_prev + gn * n_prev
    d_z = (up["d_z"] + gc * i) * (1 - z * z)
    d_it, d_lf = gi * i, gf * f
    if settings.stabilizer_grad == "stop":
        dm_prev = xp.zeros_like(c_prev)
    else:
        gm = up["d_m"] - d_it - d_lf
        take_i = i >= 1
        zero = xp.zeros_like(gm)
        d_it = d_it + xp.where(take_i, gm, zero)
        d_lf = d_lf + xp.where(take_i, zero, gm)
        dm_prev = d_lf
    d_ft = d_lf * sigmoid(xp, -f_pre) if settings.forget == "sigmoid" else d_lf
    return xp.concatenate([d_it, d_ft, d_z, d_o], axis=-1), gc * f, gn * f, dm_prev


def _upstream(xp, given, like):
    """The upstream gradients by name, each given one or zeros like ``like``."""
    return {name: xp.zeros_like(like) if g is None else g for name, g in given.items()}


def slstm_cell(x, c_prev, n_prev, m_prev, h_prev, weights, settings):
    """One sLSTM step; returns ``SLSTMCellState(i, f, z, o, c, n, m, h)``."""
    xp = namespace_of(x)
    w, r, b = weights
    pre = x @ w + recurrent(h_prev, r) + b
    return SLSTMCellState(*slstm_activations(xp, pre, m_prev, c_prev, n_prev, settings.forget))


def slstm_cell_grad(x, c_prev, n_prev, m_prev, h_prev, weights, state, settings, *,
                    d_h=None, d_c=None, d_n=None, d_m=None, d_i=None, d_f=None, d_z=None,
                    d_o=None):
    """Gradient of one sLSTM step with respect to every input (the module docstring's
    backward), then

        dx = dG·wᵀ;   dh_prev = rec's transpose (dG_k·r[k]ᵀ per head);   dw = xᵀ·dG
        dr[k] = h_prev_kᵀ·dG_k;   db = Σ_batch dG
    """
    xp = namespace_of(x)
    w, r, b = weights
    up = _upstream(xp, {"d_h": d_h, "d_c": d_c, "d_n": d_n, "d_m": d_m, "d_i": d_i,
                        "d_f": d_f, "d_z": d_z, "d_o": d_o}, c_prev)
    f_pre = None
    if settings.forget == "sigmoid":
        f_pre = blocks(x @ w + recurrent(h_prev, r) + b, 4)[1]
    step = dict(zip(SLSTMCellState._fields, state, strict=True))
    d_pre, dc, dn, dm = slstm_step_grad(xp, step, c_prev, n_prev, f_pre, up, settings)
    return SLSTMCellGrads(x=d_pre @ w.T, c_prev=dc, n_prev=dn, m_prev=dm,
                          h_prev=recurrent_grad_h(d_pre, r), w=x.T @ d_pre,
                          r=recurrent_grad_r(h_prev, d_pre, r), b=d_pre.sum(axis=0))


def slstm_sequence(x, c0, n0, m0, h0, weights, settings):
    """The sLSTM cell over ``x [T, B, I]`` from ``(c0, n0, m0, h0)``; the input
    projection ``x·w + b`` for all steps at once, the recurrence per step. Steps past a
    row's length are zero, its state frozen. Returns an ``SLSTMSequence``."""
    xp = namespace_of(x)
    w, r, b = weights
    seq_len = settings.seq_len
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, _ = x.shape
    x_pre = plan.input_projection(x, w, b)
    out = xp.zeros((8, n_steps, n_batch, h0.shape[1]), dtype=x.dtype)
    state = (c0, n0, m0, h0)
    for t in range(n_steps):
        c, n, m, h = state
        new = slstm_activations(xp, x_pre[t] + recurrent(masked(h, settings.recurrent_mask), r),
                                m, c, n, settings.forget)
        valid = valid_rows(seq_len, t)
        for k, a in enumerate(new):
            out[k, t] = keep(valid, a, 0)
        state = tuple(keep(valid, a, old) for a, old in zip(new[4:], state, strict=True))
    return SLSTMSequence(*out, *(a.copy() for a in state))


def slstm_sequence_grad(x, c0, n0, m0, h0, weights, seq, settings, *, d_h=None, d_c=None,
                        d_n=None, d_m=None, d_h_final=None, d_c_final=None, d_n_final=None,
                        d_m_final=None, d_i=None, d_f=None, d_z=None, d_o=None):
    """Backpropagation through time for ``slstm_sequence``.

    Walking back from the final state, the gradients of the state after step t are carried
    in ``carry`` (``c, n, m, h``); a running row adds the step's upstream gradients and
    takes ``slstm_step_grad``, a frozen row passes the carry through unchanged:

        dG_t, dc, dn, dm = step_grad(step t, carry + d_·[t]);   dh = rec's transpose of dG_t
        dx = dG·wᵀ;   dw = x_flatᵀ·dG;   dr[k] = h_prev_kᵀ·dG_k;   db = Σ_{t,b} dG

    With masks (docs/spec.md §11.3) the matmuls saw ``x∘m_in`` and ``h_prev∘m_rec``.
    """
    xp = namespace_of(x)
    w, r, b = weights
    seq_len = settings.seq_len
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, n_in = x.shape
    h_prev = masked(plan.previous_states(xp, h0, seq[7]), settings.recurrent_mask)
    starts = {"c": plan.previous_states(xp, c0, seq[4]),
              "n": plan.previous_states(xp, n0, seq[5])}
    f_pre = None
    if settings.forget == "sigmoid":
        rec = recurrent(plan.flat(h_prev), r).reshape(n_steps, n_batch, 4 * h0.shape[1])
        f_pre = blocks(plan.input_projection(x, w, b) + rec, 4)[1]
    zeros = xp.zeros_like(h0)
    ones = zeros + 1
    finals = {"c": d_c_final, "n": d_n_final, "m": d_m_final, "h": d_h_final}
    carry = {k: zeros if g is None else g.copy() for k, g in finals.items()}
    per_step = {"d_h": d_h, "d_c": d_c, "d_n": d_n, "d_m": d_m, "d_i": d_i, "d_f": d_f,
                "d_z": d_z, "d_o": d_o}
    d_pre = xp.zeros((n_steps, n_batch, 4 * h0.shape[1]), dtype=x.dtype)
    for t in reversed(range(n_steps)):
        valid = valid_rows(seq_len, t)
        up = {name: _step_upstream(carry, name, g, t, valid, zeros)
              for name, g in per_step.items()}
        step = {k: seq[j][t] for j, k in enumerate(SLSTMSequence._fields[:8])}
        step["n"] = keep(valid, step["n"], ones)   # a frozen row's zeros: no 0/0
        d_pre[t], dc, dn, dm = slstm_step_grad(
            xp, step, starts["c"][t], starts["n"][t], None if f_pre is None else f_pre[t],
            up, settings)
        dh = masked(recurrent_grad_h(d_pre[t], r), settings.recurrent_mask)
        carry = {k: keep(valid, new, carry[k])
                 for k, new in zip("cnmh", (dc, dn, dm, dh), strict=True)}
    d_flat = plan.flat(d_pre)
    dx = plan.running_inputs(xp, masked((d_flat @ w.T).reshape(n_steps, n_batch, n_in),
                                        settings.input_mask), seq_len)
    return SLSTMSequenceGrads(x=dx, c0=carry["c"], n0=carry["n"], m0=carry["m"],
                              h0=carry["h"], w=plan.flat(x).T @ d_flat,
                              r=recurrent_grad_r(plan.flat(h_prev), d_flat, r),
                              b=d_flat.sum(axis=0))


def _step_upstream(carry, name, g, t, valid, zeros):
    """Step t's total upstream gradient ``name``: the carried state gradient (for ``d_c,
    d_n, d_m, d_h``) plus the step's given one, zero in a frozen row (its outputs are
    constants)."""
    total = carry.get(name.removeprefix("d_"), zeros) if name not in _GATES else zeros
    if g is not None:
        total = total + g[t]
    return keep(valid, total, zeros)


# --------------------------------------------------------------------------------------
# Forward mode (docs/spec.md §12)


def slstm_step_jvp(xp, pre, d_pre, state, d_state, settings):
    """One step and its tangent from the pre-activations ``pre`` and their tangent, the
    previous ``state = (c, n, m)`` and its tangent. Returns ``(fields, d_fields)``, each
    ``(i, f, z, o, c, n, m, h)``:

        dlf = df̃∘σ(-f̃) (sigmoid) or df̃ (exp)
        dm = dĩ where i = 1 (the ĩ branch), else dlf + dm_prev;   "stop": dm = dm_prev = 0
        di = i∘(dĩ - dm);   df = f∘(dlf + dm_prev - dm);   dz = (1-z²)∘dz̃;   do = o(1-o)∘dõ
        dc = df∘c_prev + f∘dc_prev + di∘z + i∘dz;   dn = df∘n_prev + f∘dn_prev + di
        dh = do∘c/n + (o∘dc - h∘dn)/n
    """
    c_prev, n_prev, m_prev = state
    dc_prev, dn_prev, dm_prev = d_state
    fields = slstm_activations(xp, pre, m_prev, c_prev, n_prev, settings.forget)
    i, f, z, o, c, n, _, h = fields
    d_it, d_ft, d_zt, d_ot = blocks(d_pre, 4)
    d_lf = d_ft * sigmoid(xp, -blocks(pre, 4)[1]) if settings.forget == "sigmoid" else d_ft
    if settings.stabilizer_grad == "stop":
        dm_prev = dm = xp.zeros_like(c_prev)
    else:
        dm = xp.where(i >= 1, d_it, d_lf + dm_prev)
    di, df = i * (d_it - dm), f * (d_lf + dm_prev - dm)
    dz, do = (1 - z * z) * d_zt, o * (1 - o) * d_ot
    dc = df * c_prev + f * dc_prev + di * z + i * dz
    dn = df * n_prev + f * dn_prev + di
    return fields, (di, df, dz, do, dc, dn, dm, do * c / n + (o * dc - h * dn) / n)


def slstm_cell_jvp(x, c_prev, n_prev, m_prev, h_prev, weights, tangents, settings):
    """One sLSTM step and its tangent for ``tangents``, an ``SLSTMCellGrads`` of the
    inputs' tangents (None: zero): ``dpre = dx·w + x·dw + rec(dh_prev, r) + rec(h_prev,
    dr) + db``, then ``slstm_step_jvp``. Returns ``(SLSTMCellState, SLSTMCellState)``."""
    xp = namespace_of(x)
    w, r, b = weights
    t = filled(xp, tangents, (x, c_prev, n_prev, m_prev, h_prev, w, r, b))
    pre = x @ w + recurrent(h_prev, r) + b
    d_pre = t.x @ w + x @ t.w + recurrent(t.h_prev, r) + recurrent(h_prev, t.r) + t.b
    fields, d_fields = slstm_step_jvp(xp, pre, d_pre, (c_prev, n_prev, m_prev),
                                      (t.c_prev, t.n_prev, t.m_prev), settings)
    return SLSTMCellState(*fields), SLSTMCellState(*d_fields)


def slstm_sequence_jvp(x, c0, n0, m0, h0, weights, tangents, settings):
    """``slstm_sequence`` and its tangent for ``tangents``, an ``SLSTMSequenceGrads`` of
    the inputs' tangents (None: zero); each step is ``slstm_step_jvp``, the masks and the
    frozen rows linear in the state, taken by the tangent as by the state. Returns
    ``(SLSTMSequence, SLSTMSequence of tangents)``."""
    xp = namespace_of(x)
    w, r, b = weights
    t = filled(xp, tangents, (x, c0, n0, m0, h0, w, r, b))
    seq_len, m_rec = settings.seq_len, settings.recurrent_mask
    x, dx = (plan.running_inputs(xp, masked(a, settings.input_mask), seq_len) for a in (x, t.x))
    x_pre = plan.input_projection(x, w, b)
    dx_pre = plan.input_projection(dx, w, t.b) + plan.input_projection(x, t.w, 0 * t.b)
    out = xp.zeros((2, 8, *x.shape[:2], h0.shape[1]), dtype=x.dtype)
    state, d_state = (c0, n0, m0, h0), (t.c0, t.n0, t.m0, t.h0)
    for step in range(x.shape[0]):
        h, dh = masked(state[3], m_rec), masked(d_state[3], m_rec)
        fields, d_fields = slstm_step_jvp(
            xp, x_pre[step] + recurrent(h, r),
            dx_pre[step] + recurrent(dh, r) + recurrent(h, t.r), state[:3], d_state[:3],
            settings)
        valid = valid_rows(seq_len, step)
        for k in range(8):
            out[0, k, step] = keep(valid, fields[k], 0)
            out[1, k, step] = keep(valid, d_fields[k], 0)
        state = tuple(keep(valid, a, old) for a, old in zip(fields[4:], state, strict=True))
        d_state = tuple(keep(valid, a, old) for a, old in zip(d_fields[4:], d_state, strict=True))
    return (SLSTMSequence(*out[0], *(a.copy() for a in state)),
            SLSTMSequence(*out[1], *(a.copy() for a in d_state)))


def slstm_cell_grad_jvp(x, c_prev, n_prev, m_prev, h_prev, weights, state, tangents,
                        settings, *, d_h=None, d_c=None, d_n=None, d_m=None, d_i=None,
                        d_f=None, d_z=None, d_o=None, d_h_tangent=None, d_c_tangent=None,
                        d_n_tangent=None, d_m_tangent=None, d_i_tangent=None,
                        d_f_tangent=None, d_z_tangent=None, d_o_tangent=None):
    """The JVP of ``slstm_cell_grad`` along ``tangents`` (an ``SLSTMCellGrads``) and the
    upstream gradients' tangents: ``(grads, grads_tangent)``, by ``gradient_jvp`` (the
    hand-derived gradient run on dual numbers; the branch of ``m`` follows the primal)."""
    given = locals()
    upstream = {name: (given[name], given[f"{name}_tangent"],
                       getattr(state, name.removeprefix("d_")))
                for name in ("d_h", "d_c", "d_n", "d_m", *_GATES)}
    return gradient_jvp(slstm_cell_jvp, slstm_cell_grad, (x, c_prev, n_prev, m_prev, h_prev),
                        weights, state, tangents, settings, upstream)


def slstm_sequence_grad_jvp(x, c0, n0, m0, h0, weights, seq, tangents, settings, *,
                            d_h=None, d_c=None, d_n=None, d_m=None, d_h_final=None,
                            d_c_final=None, d_n_final=None, d_m_final=None, d_i=None,
                            d_f=None, d_z=None, d_o=None, d_h_tangent=None, d_c_tangent=None,
                            d_n_tangent=None, d_m_tangent=None, d_h_final_tangent=None,
                            d_c_final_tangent=None, d_n_final_tangent=None,
                            d_m_final_tangent=None, d_i_tangent=None, d_f_tangent=None,
                            d_z_tangent=None, d_o_tangent=None):
    """The JVP of ``slstm_sequence_grad`` along ``tangents`` (an ``SLSTMSequenceGrads``)
    and the upstream gradients' tangents: ``(grads, grads_tangent)``, by
    ``gradient_jvp``."""
    given = locals()
    names = ("d_h", "d_c", "d_n", "d_m", "d_h_final", "d_c_final", "d_n_final", "d_m_final",
             *_GATES)
    upstream = {name: (given[name], given[f"{name}_tangent"],
                       getattr(seq, name.removeprefix("d_"))) for name in names}
    return gradient_jvp(slstm_sequence_jvp, slstm_sequence_grad, (x, c0, n0, m0, h0),
                        weights, seq, tangents, settings, upstream)
