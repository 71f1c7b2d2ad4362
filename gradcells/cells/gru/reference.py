"""The GRU block cell and the GRU over time, forward and gradient, written once for any array
namespace.

TensorFlow's layout (docs/spec.md §3): ``w_ru [I+H, 2H]`` holds the columns of r then u,
``w_c [I+H, H]`` the candidate; rows are the x part then the h part. Reset before the
candidate matmul:

    [r, u] = σ([x, h_prev]·w_ru + b_ru)
    c      = tanh([x, r∘h_prev]·w_c + b_c)
    h      = u∘h_prev + (1-u)∘c

Reset after (``reset_after=True``; cuDNN, PyTorch, Keras): ``w_c`` rows split into W_cx, W_ch
and ``b_c [2H]`` into b_cx, b_ch:

    c      = tanh(x·W_cx + b_cx + r∘(h_prev·W_ch + b_ch))

The sequence ops follow the matmul plan of ``gradcells.cells.lstm.reference`` (one input
projection for all steps; after the backward loop, the weight gradients as large matmuls)
and its per-row lengths. The four ops take the backend protocol's arguments
(``.spec.GRUBackend``): the arrays, a ``GRUWeights`` and a ``GRUSettings``.
"""

from __future__ import annotations

from ..._core import plan
from ..._core.arrays import namespace_of
from ..._core.xpmath import (
    at_step,
    blocks,
    filled,
    gradient_jvp,
    keep,
    masked,
    sigmoid,
    valid_rows,
    zoned,
    zoneout_grad,
)
from .spec import GRUCellGrads, GRUCellState, GRUSequence, GRUSequenceGrads


def _recurrent_candidate(h_prev, w_c, b_c):
    """n = h_prev·W_ch + b_ch, the reset-after candidate's recurrent part."""
    n_hidden = h_prev.shape[1]
    return h_prev @ w_c[w_c.shape[0] - n_hidden:] + b_c[n_hidden:]


def gru_cell(x, h_prev, weights, settings):
    """One GRU step; returns ``GRUCellState(r, u, c, h)``."""
    xp = namespace_of(x)
    w_ru, w_c, b_ru, b_c = weights
    n_in, n_hidden = x.shape[1], h_prev.shape[1]
    r, u = blocks(sigmoid(xp, xp.concatenate([x, h_prev], axis=1) @ w_ru + b_ru), 2)
    if settings.reset_after:
        n = _recurrent_candidate(h_prev, w_c, b_c)
        c = xp.tanh(x @ w_c[:n_in] + b_c[:n_hidden] + r * n)
    else:
        c = xp.tanh(xp.concatenate([x, r * h_prev], axis=1) @ w_c + b_c)
    h = u * h_prev + (1 - u) * c
    return GRUCellState(r, u, c, h)


def _plus(a, b):
    """``a + b``, ``a`` alone when the upstream gradient ``b`` is None (zero)."""
    return a if b is None else a + b


def gru_gate_grads(x, h_prev, w_c, b_c, state, d_h=None, *, reset_after=False, d_r=None,
                   d_u=None, d_c=None):
    """The backward step up to the pre-activations of one GRU step:
    ``(dc_bar [B, H], d_ru [B, 2H], dx_c [B, I], dh_c [B, H])``, where ``d_ru`` is
    ``[dr_bar, du_bar]`` and ``dx_c``, ``dh_c`` are what reaches x and h_prev through the
    candidate's matmul. ``d_r, d_u, d_c`` (None: zero) are upstream gradients of the
    step's gates themselves (docs/spec.md §16.1), each added to its gate's gradient before
    the activation's derivative:

        dc_bar = (d_h∘(1-u) + d_c)∘(1-c²);    du_bar = (d_h∘(h_prev-c) + d_u)∘u(1-u)
        [dx_c, d_hr] = dc_bar·w_cᵀ                   (d_hr = dL/d(r∘h_prev))
        dr_bar = (d_hr∘h_prev + d_r)∘r(1-r);   dh_c = d_hr∘r

    Reset after, with n = h_prev·W_ch + b_ch and d_n = dc_bar∘r:
        dr_bar = (dc_bar∘n + d_r)∘r(1-r);   dx_c = dc_bar·W_cxᵀ;   dh_c = d_n·W_chᵀ
    """
    xp = namespace_of(x)
    r, u, c, _ = state
    n_in = x.shape[1]
    if d_h is None:
        d_h = xp.zeros_like(h_prev)
    dc_bar = _plus(d_h * (1 - u), d_c) * (1 - c * c)
    du_bar = _plus(d_h * (h_prev - c), d_u) * u * (1 - u)
    if reset_after:
        dr_bar = _plus(dc_bar * _recurrent_candidate(h_prev, w_c, b_c), d_r) * r * (1 - r)
        dx_c = dc_bar @ w_c[:n_in].T
        dh_c = (dc_bar * r) @ w_c[n_in:].T
    else:
        dxhr = dc_bar @ w_c.T
        dx_c, d_hr = dxhr[:, :n_in], dxhr[:, n_in:]
        dr_bar = _plus(d_hr * h_prev, d_r) * r * (1 - r)
        dh_c = d_hr * r
    return dc_bar, xp.concatenate([dr_bar, du_bar], axis=1), dx_c, dh_c


def gru_cell_grad(x, h_prev, weights, state, settings, *, d_r=None, d_u=None, d_c=None,
                  d_h=None):
    """Gradient of one GRU step with respect to every input, from the upstream gradients
    of every field of its ``GRUCellState`` (None: zero).

        dc_bar, [dr_bar, du_bar], dx_c, dh_c = gru_gate_grads(..., d_r, d_u, d_c)
        [dx_1, dh_1] = [dr_bar, du_bar]·w_ruᵀ
        dx = dx_1 + dx_c;   dh_prev = dh_1 + dh_c + d_h∘u
        dw_ru = [x, h_prev]ᵀ·[dr_bar, du_bar];   db_ru = Σ_batch [dr_bar, du_bar]
        dw_c  = [x, r∘h_prev]ᵀ·dc_bar;           db_c  = Σ_batch dc_bar
    Reset after, with d_n = dc_bar∘r:
        dw_c = [xᵀ·dc_bar; h_prevᵀ·d_n];  db_c = [Σ dc_bar, Σ d_n]
    """
    xp = namespace_of(x)
    w_ru, w_c, _, b_c = weights
    reset_after = settings.reset_after
    r, u = state.r, state.u
    n_in = x.shape[1]
    if d_h is None:
        d_h = xp.zeros_like(h_prev)
    dc_bar, d_ru, dx_c, dh_c = gru_gate_grads(x, h_prev, w_c, b_c, state, d_h,
                                              reset_after=reset_after, d_r=d_r, d_u=d_u,
                                              d_c=d_c)
    if reset_after:
        d_n = dc_bar * r
        dw_c = xp.concatenate([x.T @ dc_bar, h_prev.T @ d_n], axis=0)
        db_c = xp.concatenate([dc_bar.sum(axis=0), d_n.sum(axis=0)])
    else:
        dw_c = xp.concatenate([x, r * h_prev], axis=1).T @ dc_bar
        db_c = dc_bar.sum(axis=0)
    dxh_1 = d_ru @ w_ru.T
    return GRUCellGrads(
        x=dxh_1[:, :n_in] + dx_c,
        h_prev=dxh_1[:, n_in:] + dh_c + d_h * u,
        w_ru=xp.concatenate([x, h_prev], axis=1).T @ d_ru,
        w_c=dw_c,
        b_ru=d_ru.sum(axis=0),
        b_c=db_c,
    )


def _gru_input_projection(xp, x, w_ru, w_c, b_ru, b_c):
    """The x parts of every step's r, u and candidate pre-activations, one matmul:
    ``x·[W_rux, W_cx] + [b_ru, b_c(x part)]`` as ``[T, B, 3H]``."""
    n_in, n_hidden = x.shape[2], w_c.shape[1]
    w_x = xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)
    return plan.input_projection(x, w_x, xp.concatenate([b_ru, b_c[:n_hidden]]))


def gru_sequence(x, h0, weights, settings):
    """The GRU block cell over ``x [T, B, I]`` from ``h0``.

    Per step, with ``xr, xu, xc`` the step's slice of the input projection:

        [r, u] = σ([xr, xu] + h_prev·W_ruh);   c = tanh(xc + (r∘h_prev)·W_ch)
        reset_after:                            c = tanh(xc + r∘(h_prev·W_ch + b_ch))
        h = u∘h_prev + (1-u)∘c

    Returns ``GRUSequence(r, u, c, h, h_final)``: steps ``[T, B, H]`` (zero past a row's
    length) and the final state ``[B, H]``.
    """
    xp = namespace_of(x)
    w_ru, w_c, b_ru, b_c = weights
    seq_len = settings.seq_len
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    w_ruh, w_ch = w_ru[n_in:], w_c[n_in:]
    x_gates = _gru_input_projection(xp, x, w_ru, w_c, b_ru, b_c)
    steps = [xp.zeros((n_steps, n_batch, n_hidden), dtype=x.dtype) for _ in range(4)]
    h = h0
    for t in range(n_steps):
        x_ru, x_c = x_gates[t, :, : 2 * n_hidden], x_gates[t, :, 2 * n_hidden :]
        h_seen = masked(h, settings.recurrent_mask)   # what the matmuls see (§11.3)
        r, u = blocks(sigmoid(xp, x_ru + h_seen @ w_ruh), 2)
        if settings.reset_after:
            c = xp.tanh(x_c + r * (h_seen @ w_ch + b_c[n_hidden:]))
        else:
            c = xp.tanh(x_c + (r * h_seen) @ w_ch)
        h_new = zoned(at_step(settings.zoneout_h, t), h, u * h + (1 - u) * c)
        valid = valid_rows(seq_len, t)
        for out, value in zip(steps, (r, u, c, h_new), strict=True):
            out[t] = keep(valid, value, 0)
        h = keep(valid, h_new, h)
    return GRUSequence(*steps, h_final=h.copy())


def gru_sequence_grad(x, h0, weights, seq, settings, *, d_r=None, d_u=None, d_c=None,
                      d_h=None, d_h_final=None):
    """Backpropagation through time for ``gru_sequence``, from the upstream gradients of
    every field of its ``GRUSequence`` (None: zero): ``d_r, d_u, d_c, d_h [T, B, H]`` per
    step and ``d_h_final [B, H]``.

    Per step, with ``dh`` the gradient of the step's new state (carry plus ``d_h[t]``) and
    ``d_r, d_u, d_c`` the step's own gradients of its gates (docs/spec.md §16.1):

        dc_bar = (dh∘(1-u) + d_c)∘(1-c²);   du_bar = (dh∘(h_prev-c) + d_u)∘u(1-u)
        d_hr = dc_bar·W_chᵀ;  dr_bar = (d_hr∘h_prev + d_r)∘r(1-r)
        dh_prev = [dr_bar, du_bar]·W_ruhᵀ + d_hr∘r + dh∘u
    reset_after, with n = h_prev·W_ch + b_ch (recomputed for all steps in one matmul):
        d_n = dc_bar∘r;  dr_bar = (dc_bar∘n + d_r)∘r(1-r)
        dh_prev = [dr_bar, du_bar]·W_ruhᵀ + d_n·W_chᵀ + dh∘u

    Masks (§11.3): the matmuls read ``h_prev∘m_rec`` (their part of ``dh_prev`` and the
    weight gradients use it), the interpolation ``h_prev``; zoneout splits ``dh`` (the gates
    are the step's own values: their gradients are not split). Entries of the upstream
    gradients past a row's length are never read.
    After the loop, with ``dR, dU, dC`` (and ``dN = d_n``) stacked over all steps:
        dx = [dR, dU, dC]·[W_rux, W_cx]ᵀ;   dw_ru = [x_flatᵀ·[dR, dU] ; h_prev_flatᵀ·[dR, dU]]
        dw_c = [x_flatᵀ·dC ; (r∘h_prev)_flatᵀ·dC]   (reset_after: [x_flatᵀ·dC ; h_prev_flatᵀ·dN])
    """
    xp = namespace_of(x)
    w_ru, w_c, _, b_c = weights
    seq_len, reset_after = settings.seq_len, settings.reset_after
    x = plan.running_inputs(xp, masked(x, settings.input_mask), seq_len)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    w_ruh, w_ch = w_ru[n_in:], w_c[n_in:]
    h_prev = plan.previous_states(xp, h0, seq.h)
    h_seen = masked(h_prev, settings.recurrent_mask)   # what the matmuls saw
    recurrent = None
    if reset_after:
        recurrent = (plan.flat(h_seen) @ w_ch + b_c[n_hidden:]).reshape(h_prev.shape)
    zeros = xp.zeros_like(h0)
    dh_next = zeros if d_h_final is None else d_h_final.copy()
    # Gradients of the pre-activations [r, u, c] of every step, [dR, dU, dC], and dN.
    d_gates = xp.zeros((n_steps, n_batch, 3 * n_hidden), dtype=x.dtype)
    d_recurrent = xp.zeros((n_steps, n_batch, n_hidden), dtype=x.dtype)

    for t in reversed(range(n_steps)):
        valid = valid_rows(seq_len, t)
        dh, dh_old = zoneout_grad(at_step(settings.zoneout_h, t),
                                  dh_next if d_h is None else dh_next + d_h[t])
        dh = keep(valid, dh, zeros)   # after the split: z past a row's length is unread
        gates = [None if d is None else keep(valid, d[t], zeros) for d in (d_r, d_u, d_c)]
        d_gates[t], d_n, dh_candidate = _gru_step_grads(
            xp, dh, gates, (seq.r[t], seq.u[t], seq.c[t]), (h_prev[t], h_seen[t]),
            None if recurrent is None else recurrent[t], w_ch)
        if d_n is not None:
            d_recurrent[t] = d_n
        dh_prev = masked(d_gates[t, :, : 2 * n_hidden] @ w_ruh.T + dh_candidate,
                         settings.recurrent_mask) + dh * seq.u[t]
        dh_next = keep(valid, dh_prev if dh_old is None else dh_prev + dh_old, dh_next)

    grads = _gru_weight_grads(xp, x, h_seen, seq.r, weights, d_gates, d_recurrent, reset_after)
    grads["x"] = plan.running_inputs(xp, masked(grads["x"], settings.input_mask), seq_len)
    return GRUSequenceGrads(h0=dh_next, **grads)


def _gru_step_grads(xp, dh, gates, saved, states, recurrent, w_ch):
    """One step of ``gru_sequence_grad``'s loop: ``([dr_bar, du_bar, dc_bar] [B, 3H], d_n,
    dh_candidate)`` from the step's state gradient ``dh``, its gates' own upstream
    gradients ``gates = (d_r, d_u, d_c)`` (None: zero), ``saved = (r, u, c)``, ``states =
    (h_prev, h_seen)`` and, reset after, ``recurrent`` = n (reset before None, and d_n
    None). ``dh_candidate``: what reaches ``h_seen`` through the candidate, before the mask."""
    (d_r, d_u, d_c), (r, u, c), (h_prev, h_seen) = gates, saved, states
    dc_bar = _plus(dh * (1 - u), d_c) * (1 - c * c)
    du_bar = _plus(dh * (h_prev - c), d_u) * u * (1 - u)
    if recurrent is not None:
        d_n = dc_bar * r
        dr_bar = _plus(dc_bar * recurrent, d_r) * r * (1 - r)
        dh_candidate = d_n @ w_ch.T
    else:
        d_n = None
        d_hr = dc_bar @ w_ch.T
        dr_bar = _plus(d_hr * h_seen, d_r) * r * (1 - r)
        dh_candidate = d_hr * r
    return xp.concatenate([dr_bar, du_bar, dc_bar], axis=1), d_n, dh_candidate


def _gru_weight_grads(xp, x, h_prev, r, weights, d_gates, d_recurrent, reset_after):
    """After the backward loop, from every step's ``[dR, dU, dC] [T, B, 3H]`` and ``dN``:
    the gradients of ``x`` and of the four weights, as large matmuls over all steps."""
    w_ru, w_c, _, _ = weights
    n_steps, n_batch, n_in = x.shape
    n_hidden = w_c.shape[1]
    d_flat = plan.flat(d_gates)
    d_ru_flat, d_c_flat = d_flat[:, : 2 * n_hidden], d_flat[:, 2 * n_hidden :]
    w_x = xp.concatenate([w_ru[:n_in], w_c[:n_in]], axis=1)
    dw_x = plan.flat(x).T @ d_flat
    h_prev_flat = plan.flat(h_prev)
    if reset_after:  # the h-rows of w_c multiply h_prev, and n has its own bias b_ch
        dw_c_h = h_prev_flat.T @ plan.flat(d_recurrent)
        db_c = xp.concatenate([d_c_flat.sum(axis=0), plan.flat(d_recurrent).sum(axis=0)])
    else:  # the h-rows of w_c multiply r∘h_prev
        dw_c_h = (plan.flat(r) * h_prev_flat).T @ d_c_flat
        db_c = d_c_flat.sum(axis=0)
    return {"x": (d_flat @ w_x.T).reshape(n_steps, n_batch, n_in),
            "w_ru": xp.concatenate([dw_x[:, : 2 * n_hidden], h_prev_flat.T @ d_ru_flat], axis=0),
            "w_c": xp.concatenate([dw_x[:, 2 * n_hidden :], dw_c_h], axis=0),
            "b_ru": d_ru_flat.sum(axis=0), "b_c": db_c}


# --------------------------------------------------------------------------------------
# Forward mode (docs/spec.md §12)


def gru_cell_jvp(x, h_prev, weights, tangents, settings):
    """One GRU step and its tangent for ``tangents``, a ``GRUCellGrads`` of the inputs'
    tangents (None: zero). Returns ``(GRUCellState(r, u, c, h), GRUCellState(dr, du, dc,
    dh))``; the formulas are ``_gru_step_jvp``'s."""
    xp = namespace_of(x)
    t = filled(xp, tangents, (x, h_prev, *weights))
    return _gru_step_jvp(xp, (x, t.x), (h_prev, t.h_prev), (h_prev, t.h_prev), weights, t,
                         settings.reset_after)


def _gru_step_jvp(xp, x, h_prev, h_seen, weights, t, reset_after):
    """One step, each of ``x``, ``h_prev`` and ``h_seen`` a ``(primal, tangent)`` pair:
    ``h_seen`` is the state the matmuls see (``h_prev∘m_rec`` in a masked sequence),
    ``h_prev`` the one the update interpolates. With ``dp = σ'∘d(pre-activation)``:

        d[r_pre, u_pre] = [dx, dh_seen]·w_ru + [x, h_seen]·dw_ru + db_ru
        dc_pre = [dx, dr∘h_seen + r∘dh_seen]·w_c + [x, r∘h_seen]·dw_c + db_c
        reset_after: dn = dh_seen·W_ch + h_seen·dW_ch + db_ch,
                     dc_pre = dx·W_cx + x·dW_cx + db_cx + dr∘n + r∘dn
        dc = (1-c²)∘dc_pre;   dh = du∘(h_prev - c) + u∘dh_prev + (1-u)∘dc
    """
    (x, dx), (h_prev, dh_prev), (h_seen, dh_seen) = x, h_prev, h_seen
    w_ru, w_c, b_ru, b_c = weights
    n_in, n_hidden = x.shape[1], h_prev.shape[1]
    xh, dxh = xp.concatenate([x, h_seen], axis=1), xp.concatenate([dx, dh_seen], axis=1)
    ru = sigmoid(xp, xh @ w_ru + b_ru)
    d_ru = ru * (1 - ru) * (dxh @ w_ru + xh @ t.w_ru + t.b_ru)
    (r, u), (dr, du) = blocks(ru, 2), blocks(d_ru, 2)
    if reset_after:
        w_cx, w_ch, b_cx, b_ch = w_c[:n_in], w_c[n_in:], b_c[:n_hidden], b_c[n_hidden:]
        n = h_seen @ w_ch + b_ch
        dn = dh_seen @ w_ch + h_seen @ t.w_c[n_in:] + t.b_c[n_hidden:]
        c = xp.tanh(x @ w_cx + b_cx + r * n)
        dc_pre = dx @ w_cx + x @ t.w_c[:n_in] + t.b_c[:n_hidden] + dr * n + r * dn
    else:
        xr = xp.concatenate([x, r * h_seen], axis=1)
        c = xp.tanh(xr @ w_c + b_c)
        dc_pre = (xp.concatenate([dx, dr * h_seen + r * dh_seen], axis=1) @ w_c
                  + xr @ t.w_c + t.b_c)
    dc = (1 - c * c) * dc_pre
    state = GRUCellState(r, u, c, u * h_prev + (1 - u) * c)
    return state, GRUCellState(dr, du, dc, du * (h_prev - c) + u * dh_prev + (1 - u) * dc)


def gru_sequence_jvp(x, h0, weights, tangents, settings):
    """``gru_sequence`` and its tangent for ``tangents``, a ``GRUSequenceGrads`` of the
    inputs' tangents (None: zero). Returns ``(GRUSequence, GRUSequence of tangents)``.

    Each step is ``_gru_step_jvp``, the matmuls seeing ``h∘m_rec``; the masks, zoneout and
    the frozen rows are linear in the state, so the tangent takes them as the state does."""
    xp = namespace_of(x)
    t = filled(xp, tangents, (x, h0, *weights))
    seq_len, m_rec = settings.seq_len, settings.recurrent_mask
    x, dx = (plan.running_inputs(xp, masked(a, settings.input_mask), seq_len) for a in (x, t.x))
    outs = xp.zeros((4, *x.shape[:2], h0.shape[1]), dtype=x.dtype)   # r, u, c, h
    d_outs = xp.zeros_like(outs)
    h, dh = h0, t.h0
    for step in range(x.shape[0]):
        state, d_state = _gru_step_jvp(xp, (x[step], dx[step]), (h, dh),
                                       (masked(h, m_rec), masked(dh, m_rec)), weights, t,
                                       settings.reset_after)
        z, valid = at_step(settings.zoneout_h, step), valid_rows(seq_len, step)
        h_new, dh_new = zoned(z, h, state.h), zoned(z, dh, d_state.h)
        pairs = zip((state.r, state.u, state.c, h_new), (d_state.r, d_state.u, d_state.c, dh_new),
                    strict=True)
        for k, (a, da) in enumerate(pairs):
            outs[k, step], d_outs[k, step] = keep(valid, a, 0), keep(valid, da, 0)
        h, dh = keep(valid, h_new, h), keep(valid, dh_new, dh)
    return GRUSequence(*outs, h_final=h.copy()), GRUSequence(*d_outs, h_final=dh.copy())


def gru_cell_grad_jvp(x, h_prev, weights, state, tangents, settings, *, d_r=None, d_u=None,
                      d_c=None, d_h=None, d_r_tangent=None, d_u_tangent=None,
                      d_c_tangent=None, d_h_tangent=None):
    """The JVP of ``gru_cell_grad`` along ``tangents`` (a ``GRUCellGrads`` of the inputs'
    tangents) and the upstream gradients' tangents ``d_<field>_tangent``: ``(grads,
    grads_tangent)``, by ``gradient_jvp``."""
    upstream = {"d_r": (d_r, d_r_tangent, state.r), "d_u": (d_u, d_u_tangent, state.u),
                "d_c": (d_c, d_c_tangent, state.c), "d_h": (d_h, d_h_tangent, state.h)}
    return gradient_jvp(gru_cell_jvp, gru_cell_grad, (x, h_prev), weights, state, tangents,
                        settings, upstream)


def gru_sequence_grad_jvp(x, h0, weights, seq, tangents, settings, *, d_r=None, d_u=None,
                          d_c=None, d_h=None, d_h_final=None, d_r_tangent=None,
                          d_u_tangent=None, d_c_tangent=None, d_h_tangent=None,
                          d_h_final_tangent=None):
    """The JVP of ``gru_sequence_grad`` along ``tangents`` (a ``GRUSequenceGrads``) and the
    upstream gradients' tangents ``d_<field>_tangent``: ``(grads, grads_tangent)``, by
    ``gradient_jvp``."""
    upstream = {"d_r": (d_r, d_r_tangent, seq.r), "d_u": (d_u, d_u_tangent, seq.u),
                "d_c": (d_c, d_c_tangent, seq.c), "d_h": (d_h, d_h_tangent, seq.h),
                "d_h_final": (d_h_final, d_h_final_tangent, seq.h_final)}
    return gradient_jvp(gru_sequence_jvp, gru_sequence_grad, (x, h0), weights, seq, tangents,
                        settings, upstream)
