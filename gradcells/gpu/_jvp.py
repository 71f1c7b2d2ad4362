"""Forward mode (docs/spec.md §12) on the GPU: the primal exactly as the forward computes it
(the cell modules' kernels and matmul plans), and its tangent by the same plan.

The tangent's matmuls are cuBLAS ones: the input part ``dx·W_x + x·dW_x + db`` of all steps
at once (the input mask and the zeroed inputs past a row's length applied to ``dx`` as to
``x``), and per step ``dh·W_h + h·dW_h`` (both states through the recurrent mask). A
tangent step kernel per cell (``rnn_forward_tangent``, ...) runs after the step's forward
kernel: it reads the step's primal values and the tangent pre-activation and writes the
tangent outputs; zoneout mixes the tangents as it mixes the states, and a row past its
length keeps its tangent state, as it keeps its state. Tangents are zero where a clip is
active (on its boundary they pass). The layer-normalised LSTM adds the gate norms' tangents
(``layer_norm_tangent_rows``, a thread per row) and its step's tangent kernel normalises the
cell's tangent inside (``lstm_forward_tangent_ln``, a thread per row). A None tangent is
zero: its matmul terms are left out.
"""

from __future__ import annotations

from .._core import plan
from . import _launch
from ._launch import Launcher, contiguous, matmul


def _zeros_or(xp, tangent, like):
    """``tangent`` as a C-contiguous array, or zeros shaped as ``like``."""
    return xp.zeros_like(like, order="C") if tangent is None else xp.ascontiguousarray(tangent)


def _state_buffers(xp, state, tangent, lengths):
    """The carried state and its tangent as C-contiguous arrays: copies with lengths (the
    kernels update them in the rows still running), else the inputs themselves."""
    if lengths is None:
        return xp.ascontiguousarray(state), _zeros_or(xp, tangent, state)
    return (state.copy(order="C"),
            xp.zeros_like(state, order="C") if tangent is None else tangent.copy(order="C"))


def input_tangent(xp, x, dx, w_x, dw_x, db, width):
    """``dx·W_x + x·dW_x + db`` of every step, ``[T, B, width]`` (C-contiguous); ``x`` and
    ``dx`` as the input matmul sees them, None terms left out."""
    n_steps, n_batch, _ = x.shape
    out = xp.zeros((n_steps * n_batch, width), dtype=x.dtype)
    if dx is not None:
        out += plan.flat(dx) @ w_x
    if dw_x is not None:
        out += plan.flat(x) @ dw_x
    if db is not None:
        out += db
    return out.reshape(n_steps, n_batch, width)


def recurrent_tangent(xp, h, dh, w_h, dw_h):
    """``dh·W_h + h·dW_h`` (C-contiguous), the states as the matmul sees them."""
    out = matmul(xp, dh, w_h)
    if dw_h is not None:
        out += h @ dw_h
    return out


def running(xp, a, settings, lengths):
    """An input (or its tangent) as the matmul sees it: masked, zero past the lengths."""
    return None if a is None else plan.running_inputs(
        xp, plan.masked(a, settings.input_mask), lengths)


def rnn_jvp(rt, x, dx, h0, dh0, weights, d_w, d_b, settings):
    """The RNN over ``x [T, B, I]`` and its tangent: ``(steps, h_final, d_steps,
    d_h_final)``, the primal as ``gradcells.gpu.rnn._forward`` computes it."""
    from .rnn import _input_part, _masks, _use_relu

    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x, dx = running(xp, x, settings, lengths), running(xp, dx, settings, lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    m_rec, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
    w_x, w_h = weights.w[:n_in], weights.w[n_in:]
    dw_x, dw_h = (None, None) if d_w is None else (d_w[:n_in], d_w[n_in:])
    x_z = _input_part(xp, x, w_x)
    dx_z = input_tangent(xp, x, dx, w_x, dw_x, d_b, n_hidden)
    steps = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    d_steps = xp.empty((n_steps, n_batch, n_hidden), dtype=x.dtype)
    h, dh = _state_buffers(xp, h0, dh0, lengths)
    b = xp.ascontiguousarray(weights.b)
    common = dict(seq_len=_launch.lengths_argument(xp, lengths), use_relu=_use_relu(settings),
                  use_seq_len=lengths is not None, use_zoneout_h=z_h is not None,
                  batch=n_batch, hidden=n_hidden)
    forward = Launcher(rt, "rnn_forward", x.dtype, n_batch * n_hidden, b=b, **common,
                       h_state=steps if lengths is None else h)
    tangent = Launcher(rt, "rnn_forward_tangent", x.dtype, n_batch * n_hidden, b=b, **common,
                       dh_state=d_steps if lengths is None else dh)
    for t in range(n_steps):
        h_seen = plan.masked(h, m_rec)
        gh = matmul(xp, h_seen, w_h)
        dgh = recurrent_tangent(xp, h_seen, plan.masked(dh, m_rec), w_h, dw_h)
        zoneout = _launch.at_step(z_h, t, h)
        forward(gx=x_z[t], gh=gh, step=t, h_prev=h, zoneout_h=zoneout, h=steps[t])
        tangent(gx=x_z[t], gh=gh, dgx=dx_z[t], dgh=dgh, step=t, dh_prev=dh,
                zoneout_h=zoneout, dh=d_steps[t])
        if lengths is None:
            h, dh = steps[t], d_steps[t]
    return steps, h, d_steps, dh


def _split(d_w, n_in):
    """``(d_w[:n_in], d_w[n_in:])``, or ``(None, None)`` for a zero tangent."""
    return (None, None) if d_w is None else (d_w[:n_in], d_w[n_in:])


def _gru_input_tangents(xp, x, dx, weights, d_weights, reset_after):
    """The tangents of the gates' and the candidate's input parts, ``[T, B, 2H]`` and
    ``[T, B, H]`` (their biases' tangents in them), and the recurrent parts' weight and
    bias tangents ``(dW_ruh, dW_ch, db_ch)`` (None: zero; ``db_ch`` reset after only)."""
    n_in, n_hidden = x.shape[2], weights.w_c.shape[1]
    d_w_ru, d_w_c, d_b_ru, d_b_c = d_weights
    (dw_rux, dw_ruh), (dw_cx, dw_ch) = _split(d_w_ru, n_in), _split(d_w_c, n_in)
    db_cx, db_ch = d_b_c, None
    if reset_after and d_b_c is not None:
        db_cx, db_ch = d_b_c[:n_hidden], d_b_c[n_hidden:]
    return (input_tangent(xp, x, dx, weights.w_ru[:n_in], dw_rux, d_b_ru, 2 * n_hidden),
            input_tangent(xp, x, dx, weights.w_c[:n_in], dw_cx, db_cx, n_hidden),
            (dw_ruh, dw_ch, db_ch))


def _candidate_recurrent_tangent(xp, h_seen, dh_seen, w_ch, dw_ch, db_ch, reset_after):
    """Reset after, ``dn = dh_seen·W_ch + h_seen·dW_ch + db_ch`` (before the step: the state
    buffer is updated in it); reset before None (its input is the step's ``r∘h_seen``)."""
    if not reset_after:
        return None
    dn = recurrent_tangent(xp, h_seen, dh_seen, w_ch, dw_ch)
    if db_ch is not None:
        dn += db_ch
    return dn


def gru_jvp(rt, x, dx, h0, dh0, weights, d_weights, settings):
    """The GRU over ``x [T, B, I]`` and its tangent: ``(steps, h_final, d_steps,
    d_h_final)``, ``steps`` and ``d_steps`` GRUCellStates of ``[T, B, H]`` arrays; the
    primal is ``gradcells.gpu.gru._forward``'s (its step objects and kernels). Per step,
    after the primal step's kernels: ``gru_gates_tangent`` (dr, du and, reset before, the
    tangent of ``r∘h_seen``), the candidate's recurrent tangent matmul, then
    ``gru_candidate_tangent`` (dc and dh)."""
    from .._core.types import GRUCellState
    from .gru import _masks, _ResetAfterStep, _ResetBeforeStep, _x_projection

    xp = rt.xp
    reset_after = settings.reset_after
    lengths = _launch.lengths(xp, settings.seq_len)
    x, dx = running(xp, x, settings, lengths), running(xp, dx, settings, lengths)
    (n_steps, n_batch, n_in), n_hidden, dtype = x.shape, h0.shape[1], x.dtype
    w_ruh, w_ch = weights.w_ru[n_in:], weights.w_c[n_in:]
    m_rec, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden)
    gx_ru, gx_c = _x_projection(xp, x, weights.w_ru, weights.w_c)
    d_gx_ru, d_gx_c, (dw_ruh, dw_ch, db_ch) = _gru_input_tangents(xp, x, dx, weights,
                                                                   d_weights, reset_after)
    steps, d_steps = (GRUCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                                     for _ in GRUCellState._fields)) for _ in range(2))
    h, dh = _state_buffers(xp, h0, dh0, lengths)
    n = n_batch * n_hidden
    common = {"seq_len": _launch.lengths_argument(xp, lengths),
              "use_seq_len": lengths is not None, "batch": n_batch, "hidden": n_hidden}
    step = (_ResetAfterStep if reset_after else _ResetBeforeStep)(
        rt, weights, n_in, n_steps, dtype, n, common, z_h is not None)
    gates = Launcher(rt, "gru_gates_tangent", dtype, n, **common)
    candidate = Launcher(rt, "gru_candidate_tangent", dtype, n,
                         b_c=xp.ascontiguousarray(weights.b_c), reset_after=reset_after,
                         use_zoneout_h=z_h is not None, **common)
    d_rh = xp.empty((n_batch, n_hidden), dtype=dtype)
    for t in range(n_steps):
        # The primal step updates the state buffer in place (with lengths): keep h_prev.
        h_prev = h.copy() if lengths is not None else h
        h_seen, dh_seen = plan.masked(h_prev, m_rec), plan.masked(dh, m_rec)
        d_ru = d_gx_ru[t] + recurrent_tangent(xp, h_seen, dh_seen, w_ruh, dw_ruh)
        dn = _candidate_recurrent_tangent(xp, h_seen, dh_seen, w_ch, dw_ch, db_ch,
                                          reset_after)
        h_state = h if lengths is not None else steps.h[t]
        z = _launch.at_step(z_h, t, h)
        saved = step(t, gx_ru[t], gx_c[t], h, plan.masked(h, m_rec), z,
                     *(a[t] for a in steps[:3]), steps.h[t], h_state)
        gates(r=steps.r[t], u=steps.u[t], d_ru=xp.ascontiguousarray(d_ru),
              h_seen=xp.ascontiguousarray(h_seen), dh_seen=xp.ascontiguousarray(dh_seen),
              step=t, dr=d_steps.r[t], du=d_steps.u[t], d_rh=d_rh)
        # saved: reset after the forward's gh_c; reset before its r∘h_seen, what
        # (r∘h_seen)·W_ch saw
        dgh_c = dn if reset_after else recurrent_tangent(xp, saved, d_rh, w_ch, dw_ch)
        gh_c = saved if reset_after else dgh_c
        candidate(r=steps.r[t], u=steps.u[t], c=steps.c[t], h_prev=h_prev, dr=d_steps.r[t],
                  du=d_steps.u[t], dgx_c=d_gx_c[t], dgh_c=xp.ascontiguousarray(dgh_c),
                  gh_c=gh_c, ld_gh_c=_launch.row_stride(gh_c), step=t, dh_prev=dh,
                  zoneout_h=z, dc=d_steps.c[t], dh=d_steps.h[t],
                  dh_state=d_steps.h[t] if lengths is None else dh)
        if lengths is None:
            h, dh = steps.h[t], d_steps.h[t]
    return steps, h, d_steps, dh


def _norm_field(d_norm, name):
    """A field of a layer norm's tangent (an ``LSTMNorm`` or None; None: zero)."""
    return None if d_norm is None else getattr(d_norm, name)


def norm_tangent_rows(rt, z, dz, gamma, d_gamma, d_beta, epsilon):
    """The tangent of ``LN(z; γ, β)`` over the last axis of ``z`` for ``dz``, ``dγ`` and
    ``dβ`` (None: zero): ``layer_norm_tangent_rows``, a thread per row."""
    xp = rt.xp
    z, dz = xp.ascontiguousarray(z), xp.ascontiguousarray(dz)
    cols = z.shape[-1]
    rows = z.size // cols if cols else 0
    gamma = xp.ascontiguousarray(gamma)
    dy = xp.empty_like(z)
    Launcher(rt, "layer_norm_tangent_rows", z.dtype, rows)(
        z=z, dz=dz, gamma=gamma, d_gamma=gamma if d_gamma is None else contiguous(xp, d_gamma),
        d_beta=gamma if d_beta is None else contiguous(xp, d_beta), epsilon=epsilon,
        use_d_gamma=d_gamma is not None, use_d_beta=d_beta is not None, rows=rows,
        cols=cols, dy=dy)
    return dy


def _peephole_tangents(xp, t, placeholder):
    """The kernels' ``dwci, dwcf, dwco`` (zeros for a None among given ones) and whether
    there are any."""
    given = [t.wci, t.wcf, t.wco]
    if all(p is None for p in given):
        return [placeholder] * 3, False
    shape = next(p for p in given if p is not None).shape
    return [xp.zeros(shape, dtype=placeholder.dtype) if p is None else xp.ascontiguousarray(p)
            for p in given], True


def _lstm_gate_tangents(rt, x, dx, weights, t, settings):
    """The input part of every step and its tangent, ``[T, B, 4H]``: ``x·W_x`` (its norm
    with a layer norm, ``layer_norm_rows`` as the forward's) and ``dx·W_x + x·dW_x + db``
    (through the norm's tangent before the bias's)."""
    from .lstm import _norm_rows

    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    width = weights.w.shape[1]
    w_x = weights.w[:n_in]
    dw_x = None if t.w is None else t.w[:n_in]
    x_gates = (plan.flat(x) @ w_x).reshape(n_steps, n_batch, width)
    norm = weights.layer_norm
    if norm is None:
        return x_gates, input_tangent(xp, x, dx, w_x, dw_x, t.b, width)
    eps, d_norm = settings.ln_epsilon, t.layer_norm
    d_gates = norm_tangent_rows(rt, x_gates, input_tangent(xp, x, dx, w_x, dw_x, None, width),
                                norm.gamma_x, _norm_field(d_norm, "gamma_x"),
                                _norm_field(d_norm, "beta_x"), eps)
    if t.b is not None:
        d_gates += t.b
    return _norm_rows(rt, x_gates, norm.gamma_x, norm.beta_x, eps), d_gates


def _lstm_recurrent(rt, h_seen, dh_seen, weights, t, settings, n_in):
    """A step's recurrent part ``h_seen·W_h`` (its norm with a layer norm) and its tangent
    ``dh_seen·W_h + h_seen·dW_h`` (through the norm's)."""
    from .lstm import _norm_rows

    xp = rt.xp
    w_h = weights.w[n_in:]
    gh = matmul(xp, h_seen, w_h)
    dgh = recurrent_tangent(xp, h_seen, dh_seen, w_h, None if t.w is None else t.w[n_in:])
    norm = weights.layer_norm
    if norm is None:
        return gh, dgh
    eps, d_norm = settings.ln_epsilon, t.layer_norm
    return (_norm_rows(rt, gh, norm.gamma_h, norm.beta_h, eps),
            norm_tangent_rows(rt, gh, dgh, norm.gamma_h, _norm_field(d_norm, "gamma_h"),
                              _norm_field(d_norm, "beta_h"), eps))


def _project_tangent(xp, m, dm, w_proj, dw_proj, proj_clip, z_h, lengths, t, out, dh):
    """Step t's projected tangent ``dm·w_proj + m·dw_proj`` (zero where the projection's
    clip is active), zoned with the carried ``dh`` by ``z_h``, into ``out`` (zero past a
    row's length); returns the carried tangent (``dh`` kept in those rows)."""
    d_raw = dm @ w_proj
    if dw_proj is not None:
        d_raw = d_raw + m @ dw_proj
    if proj_clip is not None:
        d_raw = xp.where(abs(m @ w_proj) <= proj_clip, d_raw, xp.zeros((), dtype=d_raw.dtype))
    d_raw = plan.zoned(z_h, dh, d_raw)
    if lengths is None:
        out[...] = d_raw
        return out
    valid = (t < lengths)[:, None]
    out[...] = xp.where(valid, d_raw, xp.zeros((), dtype=out.dtype))
    return xp.where(valid, d_raw, dh)


def _lstm_tangent_kernel(rt, weights, t, settings, n_batch, n_hidden, lengths, masks,
                         placeholder):
    """The step's tangent kernel (``lstm_forward_tangent``, ``_ln`` with a layer norm: a
    thread per row), its arguments that stay the same from step to step settled."""
    xp = rt.xp
    from .lstm import _peepholes, _step_kernel

    name, n_threads, extra = _step_kernel("lstm_forward_tangent", rt, weights, settings,
                                          n_batch, n_hidden)
    if weights.layer_norm is not None:
        d_gamma, d_beta = (_norm_field(t.layer_norm, f) for f in ("gamma_c", "beta_c"))
        extra.update(d_gamma_c=placeholder if d_gamma is None else contiguous(xp, d_gamma),
                     d_beta_c=placeholder if d_beta is None else contiguous(xp, d_beta),
                     use_d_gamma=d_gamma is not None, use_d_beta=d_beta is not None)
    wci, wcf, wco = _peepholes(xp, weights, settings, placeholder)
    (dwci, dwcf, dwco), use_d_peephole = _peephole_tangents(xp, t, placeholder)
    _, z_cs, z_h = masks
    cell_clip = settings.cell_clip
    return Launcher(
        rt, name, placeholder.dtype, n_threads, **extra, wci=wci, wcf=wcf, wco=wco,
        dwci=dwci, dwcf=dwcf, dwco=dwco, seq_len=_launch.lengths_argument(xp, lengths),
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=settings.peepholes,
        use_d_peephole=use_d_peephole and settings.peepholes, use_clip=cell_clip is not None,
        use_seq_len=lengths is not None, use_zoneout_cs=z_cs is not None,
        use_zoneout_h=z_h is not None and weights.w_proj is None, batch=n_batch,
        hidden=n_hidden)


def lstm_jvp(rt, x, dx, cs0, h0, weights, t, settings):
    """The LSTM over ``x [T, B, I]`` and its tangent along ``t`` (an ``LSTMSequenceGrads``
    or ``LSTMCellGrads``: the states' tangents are its fields 1 and 2, the input's is
    ``dx``, ``[T, B, I]``): ``(steps, cs, h, d_steps, dcs, dh)``, the primal as
    ``gradcells.gpu.lstm._forward`` computes it (its step kernel, norms and projection).
    Per step: ``_lstm_recurrent``, the forward's kernel, the tangent kernel
    (``_lstm_tangent_kernel``), then with a projection ``_project_tangent``."""
    from .._core.types import LSTMCellState
    from .lstm import _forward_step_kernel, _masks, _project

    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x, dx = running(xp, x, settings, lengths), running(xp, dx, settings, lengths)
    (n_steps, n_batch, n_in), n_hidden, dtype = x.shape, cs0.shape[1], x.dtype
    masks = m_rec, z_cs, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden, h0.shape[1])
    x_gates, d_x_gates = _lstm_gate_tangents(rt, x, dx, weights, t, settings)
    steps, d_steps = (LSTMCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                                      for _ in LSTMCellState._fields)) for _ in range(2))
    (cs, dcs), (h, dh) = _state_buffers(xp, cs0, t[1], lengths), _state_buffers(
        xp, h0, t[2], lengths)
    projection = weights.w_proj is not None
    if projection:  # the kernels' h is m = o∘co; the steps' h is the projected one
        m_steps, dm_steps = (xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                             for _ in range(2))
        steps, d_steps = (s._replace(h=xp.empty((n_steps, n_batch, h0.shape[1]), dtype=dtype))
                          for s in (steps, d_steps))
        m_state, dm_state = (xp.empty((n_batch, n_hidden), dtype=dtype) for _ in range(2))
    b = xp.ascontiguousarray(weights.b)
    forward = _forward_step_kernel(rt, weights, settings, lengths, masks, n_batch, n_hidden, b,
                                   cs, m_state if projection else h)
    tangent = _lstm_tangent_kernel(rt, weights, t, settings, n_batch, n_hidden, lengths,
                                   masks, b)
    for step in range(n_steps):
        outputs = dict(zip(LSTMCellState._fields, (a[step] for a in steps)))
        d_outputs = dict(zip(LSTMCellState._fields, (a[step] for a in d_steps)))
        if projection:
            outputs["h"], d_outputs["h"] = m_steps[step], dm_steps[step]
        gh, dgh = _lstm_recurrent(rt, plan.masked(h, m_rec), plan.masked(dh, m_rec),
                                  weights, t, settings, n_in)
        d_gates = d_x_gates[step] + dgh
        cs_prev = cs.copy() if lengths is not None else cs  # the step updates the buffer
        zone_cs = _launch.at_step(z_cs, step, b)
        zone_h = b if projection else _launch.at_step(z_h, step, b)
        forward(gx=x_gates[step], gh=gh, cs_prev=cs, step=step, h_prev=b if projection else h,
                zoneout_cs=zone_cs, zoneout_h=zone_h, **outputs)
        tangent(d_gates=d_gates, cs_prev=cs_prev, dcs_prev=dcs, dh_prev=b if projection else dh,
                zoneout_cs=zone_cs, zoneout_h=zone_h, step=step,
                **{k: outputs[k] for k in ("i", "f", "o", "ci", "co")},
                **{_TANGENT_NAMES[k]: v for k, v in d_outputs.items()},
                dcs_state=dcs if lengths is not None else b,
                dh_state=(dm_state if projection else dh) if lengths is not None else b)
        if projection:
            z = plan.at_step(z_h, step)
            dh = _project_tangent(xp, m_steps[step], dm_steps[step], weights.w_proj, t.w_proj,
                                  settings.proj_clip, z, lengths, step, d_steps.h[step], dh)
            h = _project(xp, m_steps[step], weights.w_proj, settings.proj_clip, z, lengths,
                         step, steps.h[step], h)
        if lengths is None:
            cs, h, dcs, dh = steps.cs[step], steps.h[step], d_steps.cs[step], d_steps.h[step]
    return steps, cs, h, d_steps, dcs, dh


# The tangent kernels' names of the LSTMCellState fields' tangents.
_TANGENT_NAMES = {"i": "di", "cs": "dcs", "f": "df", "o": "d_o", "ci": "dci", "co": "dco",
                  "h": "dh"}
