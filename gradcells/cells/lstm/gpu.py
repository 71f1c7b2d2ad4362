"""The LSTM on the GPU: ``lstm.cu``'s fused step kernels around cuBLAS matmuls.

The matmul plan follows the reference's sequences: the input projection of all steps is one
matmul; per step only ``h·W_h`` and one fused elementwise kernel remain (forward: bias,
forget bias, peepholes, clip, activations and every output; backward: the gate gradients,
the clip mask, ``dcs_prev`` and the peephole terms); after the backward loop ``dx`` is one
matmul and ``dW`` two (x part and h part); the bias and peephole gradients are column sums.
A cell is the same code with T = 1. Each operation runs on its arguments' device.

The layer-normalised LSTM (docs/spec.md §9.2) keeps that plan: the x part's norm
``LN(x·W_x)`` is one ``layer_norm_rows`` launch over all T·B rows after the input matmul;
per step, ``LN(h·W_h)`` is one more launch and the cell step is ``lstm_forward_ln``, which
also normalises ``c̃``. The backward recomputes ``x·W_x`` and ``h_prev·W_h`` of all steps
(one matmul each; the results keep only the arrays they keep without a norm) and ``c̃``
from the saved gates: per step ``lstm_backward_ln`` (the cell norm inside) and one
``layer_norm_grad_rows`` launch for the recurrent part's norm before ``dz_h·W_hᵀ``; after
the loop one more over all T·B rows for the x part. A row reduction must not let threads
talk (the host emulation runs them one after another), so these four kernels give one
thread a whole row (B or T·B threads, not B·H): see ``lstm.cu``.

The masks (docs/spec.md §11.3, ``gradcells.reference.lstm.lstm_sequence``): the input mask
multiplies ``x`` once before the input matmul (and ``dx`` after the gradient's); the
recurrent mask multiplies each step's ``h`` before ``h·W_h`` and the matmul's part of the
``dh`` carry after ``dz_h·W_hᵀ`` (``dW_h`` and the norm's recompute read ``h_prev∘m_rec``);
``zoneout_cs`` and ``zoneout_h`` are the step kernels' (the forward stores the zoned states,
``co`` and the o-peephole read the unzoned ``c̃``; the backward splits the zoned states'
gradients, adds ``z_cs∘g`` to ``dcs_prev`` and writes ``z_h∘g`` for the ``dh`` carry, and
recomputes the unzoned ``c̃``, or with a normalising carry its norm, for ``dwco``). With a
projection ``h``'s zoneout is the projection step's (``_project``, ``_ProjectionGrad``).

Forward mode (docs/spec.md §12, ``lstm_*_jvp``: ``_jvp``) runs the forward's plan with the
tangent step kernel ``lstm_forward_tangent`` (``_ln`` with a layer norm, which normalises
the cell's tangent inside; the gate norms' tangents are ``layer_norm_tangent_rows``) after
each step's; the second order (``lstm_*_grad_jvp``: ``_grad_jvp``) runs the backward's plan
with ``lstm_backward_tangent`` before each step's ``lstm_backward``, which overwrites the
``dcs`` carry it reads (``_TangentLoop``; the gate norms' backward tangents are
``layer_norm_grad_tangent_rows``, ``_NormTangent``); what every cell's tangents share is
``gradcells.gpu._tangents``'s.
"""

from __future__ import annotations

from ..._core import plan
from ...gpu import _launch
from ...gpu._launch import Launcher, column_sum, contiguous, matmul
from ...gpu._tangents import (
    input_tangent,
    recurrent_tangent,
    running,
    state_buffers,
    sum_pairs,
    upstream_pair,
    zeros_filled,
)
from .spec import PEEPHOLES, LSTMCellGrads, LSTMCellState, LSTMNorm, LSTMSequence, LSTMSequenceGrads


def lstm_cell(x, cs_prev, h_prev, weights, settings):
    """One LSTM step; see ``gradcells.reference.lstm.lstm_cell``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, _, _ = _forward(rt, x[None], cs_prev, h_prev, weights, settings)
        return LSTMCellState(*(a[0] for a in steps))


def lstm_cell_grad(x, cs_prev, h_prev, weights, state, settings, *, d_h=None, d_cs=None,
                   d_i=None, d_f=None, d_o=None, d_ci=None, d_co=None, clip_grad="exact"):
    """Gradient of one LSTM step; see ``gradcells.reference.lstm.lstm_cell_grad`` (the
    gates' upstream gradients through ``_gate_upstreams``)."""

    def step(a):
        return None if a is None else a[None]

    rt, on_device = _launch.runtime_on(x)
    with on_device:
        dx, *rest = _backward(
            rt, x[None], cs_prev, h_prev, weights, LSTMCellState(*(a[None] for a in state)),
            settings, d_h=step(d_h), d_cs=step(d_cs), d_h_final=None, d_cs_final=None,
            gates=tuple(map(step, (d_i, d_f, d_o, d_ci, d_co))), clip_grad=clip_grad)
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
                       d_h_final=None, d_cs_final=None, d_i=None, d_f=None, d_o=None,
                       d_ci=None, d_co=None, clip_grad="exact"):
    """Backpropagation through time for ``lstm_sequence``, from the upstream gradients of
    every field (the gates' through ``_gate_upstreams``)."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        return LSTMSequenceGrads(*_backward(
            rt, x, cs0, h0, weights, _saved_steps(seq), settings, d_h=d_h, d_cs=d_cs,
            d_h_final=d_h_final, d_cs_final=d_cs_final, gates=(d_i, d_f, d_o, d_ci, d_co),
            clip_grad=clip_grad))


def _gate_upstreams(xp, gates, like):
    """The gates' upstream gradients ``(d_i, d_f, d_o, d_ci, d_co)`` (each ``[T, B, H]`` or
    None) as the backward kernels read them: one C-contiguous ``[T, 5, B, H]``, a step's
    ``[5, B, H]`` the kernel's ``d_gate_up`` (zeros for a None among given ones); None when
    all are None (the kernels' ``has_d_gate_up`` off). The kernels never read a row past its
    length."""
    given = [g for g in gates if g is not None]
    if not given:
        return None
    out = xp.zeros((like.shape[0], len(gates), *like.shape[1:]), dtype=like.dtype)
    for k, g in enumerate(gates):
        if g is not None:
            out[:, k] = g
    return out


def _saved_steps(seq):
    """The steps an ``LSTMSequence`` saved, an ``LSTMCellState`` of ``[T, B, ·]`` arrays."""
    return LSTMCellState(*(getattr(seq, name) for name in LSTMCellState._fields))


# --------------------------------------------------------------------------------------
# The algorithm


def _peepholes(xp, weights, settings, placeholder):
    """The kernels' ``wci, wcf, wco`` arguments: the peephole vectors (contiguous), or
    ``placeholder`` three times without peepholes."""
    if settings.peepholes:
        return [contiguous(xp, p) for p in (weights.wci, weights.wcf, weights.wco)]
    return [placeholder] * 3


def _step_kernel(name, rt, weights, settings, n_batch, n_hidden):
    """The step kernel's name and thread count, and its layer-norm arguments as a
    dict: ``name`` over B·H elements without a layer norm; ``name + "_ln"`` over the B rows
    (one thread per row: the cell norm reduces over it) with one."""
    norm = weights.layer_norm
    if norm is None:
        return name, n_batch * n_hidden, {}
    xp = rt.xp
    extra = {"gamma_c": xp.ascontiguousarray(norm.gamma_c),
             "beta_c": xp.ascontiguousarray(norm.beta_c), "epsilon": settings.ln_epsilon,
             "carry_normalized": settings.ln_carry == "normalized"}
    return f"{name}_ln", n_batch if n_hidden else 0, extra


def _norm_rows(rt, z, gamma, beta, epsilon):
    """``LN(z; γ, β)`` over the last axis of ``z`` (``layer_norm_rows``, a thread per row)."""
    xp = rt.xp
    z = xp.ascontiguousarray(z)
    cols = z.shape[-1]
    rows = z.size // cols if cols else 0
    y = xp.empty_like(z)
    Launcher(rt, "layer_norm_rows", z.dtype, rows)(
        z=z, gamma=xp.ascontiguousarray(gamma), beta=xp.ascontiguousarray(beta),
        epsilon=epsilon, rows=rows, cols=cols, y=y)
    return y


def _norm_grad_rows(rt, dy, z, gamma, epsilon, dz=None, terms=None):
    """The layer norm's backward over the last axis (``layer_norm_grad_rows``, a thread per
    row): ``(dz, dy∘ẑ)``, ``z`` the norm's input (written into ``dz`` and ``terms`` when
    given: C-contiguous)."""
    xp = rt.xp
    cols = z.shape[-1]
    rows = z.size // cols if cols else 0
    dz = xp.empty_like(dy) if dz is None else dz
    terms = xp.empty_like(dy) if terms is None else terms
    Launcher(rt, "layer_norm_grad_rows", dy.dtype, rows)(
        dy=dy, z=xp.ascontiguousarray(z), gamma=xp.ascontiguousarray(gamma), epsilon=epsilon,
        rows=rows, cols=cols, dz=dz, dgamma_terms=terms)
    return dz, terms


def _forward(rt, x, cs0, h0, weights, settings):
    """Every step's outputs (an LSTMCellState of ``[T, B, H]`` arrays) and the final
    ``(cs, h)`` (views of the last step when ``seq_len`` is None)."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, plan.masked(x, settings.input_mask), lengths)
    n_steps, n_batch, n_in = x.shape
    n_hidden = cs0.shape[1]
    m_rec, z_cs, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden, h0.shape[1])
    dtype = x.dtype
    w_h = weights.w[n_in:]
    x_gates = (plan.flat(x) @ weights.w[:n_in]).reshape(n_steps, n_batch, 4 * n_hidden)
    norm = weights.layer_norm
    if norm is not None:
        x_gates = _norm_rows(rt, x_gates, norm.gamma_x, norm.beta_x, settings.ln_epsilon)
    b = xp.ascontiguousarray(weights.b)
    steps = LSTMCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                            for _ in LSTMCellState._fields))
    if lengths is None:
        cs, h = xp.ascontiguousarray(cs0), xp.ascontiguousarray(h0)
    else:  # the state buffers the kernel updates in the rows still running
        cs, h = cs0.copy(order="C"), h0.copy(order="C")
    projection = weights.w_proj is not None
    if projection:  # the kernel's h is m = o∘co; the steps' h is the projected one
        m_steps = xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
        steps = steps._replace(h=xp.empty((n_steps, n_batch, h0.shape[1]), dtype=dtype))
        m_state = xp.empty((n_batch, n_hidden), dtype=dtype)
    forward = _forward_step_kernel(rt, weights, settings, lengths, (m_rec, z_cs, z_h),
                                   n_batch, n_hidden, b, cs, m_state if projection else h)
    for t in range(n_steps):
        outputs = dict(zip(LSTMCellState._fields, (a[t] for a in steps), strict=True))
        if projection:
            outputs["h"] = m_steps[t]
        gh = matmul(xp, plan.masked(h, m_rec), w_h)
        if norm is not None:
            gh = _norm_rows(rt, gh, norm.gamma_h, norm.beta_h, settings.ln_epsilon)
        forward(gx=x_gates[t], gh=gh, cs_prev=cs, step=t, h_prev=b if projection else h,
                zoneout_cs=_launch.at_step(z_cs, t, b),
                zoneout_h=b if projection else _launch.at_step(z_h, t, b), **outputs)
        if projection:
            h = _project(xp, m_steps[t], weights.w_proj, settings.proj_clip,
                         plan.at_step(z_h, t), lengths, t, steps.h[t], h)
        if lengths is None:
            cs, h = steps.cs[t], steps.h[t]
    return steps, cs, h


def _forward_step_kernel(rt, weights, settings, lengths, masks, n_batch, n_hidden, b,
                         cs_state, h_state):
    """The step kernel (``lstm_forward``, ``_ln`` with a layer norm), its arguments that
    stay the same from step to step settled; ``cs_state, h_state``: the state buffers it
    updates with lengths (``h_state`` the projection's ``m`` buffer with one)."""
    xp = rt.xp
    _, z_cs, z_h = masks
    wci, wcf, wco = _peepholes(xp, weights, settings, b)
    cell_clip = settings.cell_clip
    name, n_threads, extra = _step_kernel("lstm_forward", rt, weights, settings, n_batch,
                                          n_hidden)
    return Launcher(
        rt, name, b.dtype, n_threads, **extra, b=b, wci=wci, wcf=wcf, wco=wco,
        seq_len=_launch.lengths_argument(xp, lengths), forget_bias=settings.forget_bias,
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=settings.peepholes,
        use_clip=cell_clip is not None, use_seq_len=lengths is not None,
        use_zoneout_cs=z_cs is not None,
        use_zoneout_h=z_h is not None and weights.w_proj is None, batch=n_batch,
        hidden=n_hidden, cs_state=cs_state,
        h_state=cs_state if lengths is None else h_state)  # (written with lengths only)


def _masks(xp, settings, n_steps, n_batch, n_hidden, width):
    """The kernels' ``(m_rec, z_cs, z_h)`` (``_launch.sequence_mask``; None where absent)."""
    return (_launch.sequence_mask(xp, settings.recurrent_mask, (1, n_batch, width)),
            _launch.sequence_mask(xp, settings.zoneout_cs, (n_steps, n_batch, n_hidden)),
            _launch.sequence_mask(xp, settings.zoneout_h, (n_steps, n_batch, width)))


def _project(xp, m, w_proj, proj_clip, z_h, lengths, t, out, h):
    """Step t's projected ``h = clip(m·w_proj, ±proj_clip)``, zoned with the carried ``h``
    by ``z_h`` (None: no zoneout), into ``out`` (zero in the rows past their length);
    returns the carried state (``h`` kept in those rows)."""
    projected = m @ w_proj
    if proj_clip is not None:
        projected = xp.clip(projected, -proj_clip, proj_clip)
    projected = plan.zoned(z_h, h, projected)
    if lengths is None:
        out[...] = projected
        return out
    valid = (t < lengths)[:, None]
    out[...] = xp.where(valid, projected, xp.zeros((), dtype=out.dtype))
    return xp.where(valid, projected, h)


def _backward(rt, x, cs0, h0, weights, steps, settings, *, d_h, d_cs, d_h_final, d_cs_final,
              gates, clip_grad):
    """Backpropagation through time; returns the fields of LSTMSequenceGrads (``gates``:
    the gates' upstream gradients ``(d_i, ..., d_co)``, each None or ``[T, B, H]``)."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x = plan.running_inputs(xp, plan.masked(x, settings.input_mask), lengths)
    steps = LSTMCellState(*(xp.ascontiguousarray(a) for a in steps))
    cs0 = xp.ascontiguousarray(cs0)
    d_h, d_cs, d_h_final, d_cs_final = (contiguous(xp, a) for a in (d_h, d_cs, d_h_final,
                                                                     d_cs_final))
    masks = _masks(xp, settings, x.shape[0], x.shape[1], cs0.shape[1], h0.shape[1])
    h_prev = plan.masked(_launch.previous(xp, h0, steps.h), masks[0])  # the matmul saw this
    proj = None if weights.w_proj is None else _ProjectionGrad(
        xp, weights.w_proj, settings.proj_clip, clip_grad, lengths, steps, d_h, d_h_final,
        masks[2])
    norm = None if weights.layer_norm is None else _NormGrad(
        rt, x, h_prev, weights, settings.ln_epsilon)
    d_gates, terms, dcs, dh_recurrent = _backward_steps(
        rt, x, cs0, weights, steps, settings, lengths, masks, d_h=d_h, d_cs=d_cs,
        d_h_final=d_h_final, d_cs_final=d_cs_final,
        gate_up=_gate_upstreams(xp, gates, steps.i), clip_grad=clip_grad, proj=proj,
        norm=norm)
    if x.shape[0] == 0:
        dcs0 = xp.zeros_like(cs0) if d_cs_final is None else d_cs_final.copy()
        dh0 = (xp.zeros_like(cs0) if proj is None else xp.zeros(h0.shape, dtype=x.dtype)
               ) if d_h_final is None else d_h_final.copy()
    else:
        dcs0, dh0 = dcs, dh_recurrent
        if lengths is not None and d_h_final is not None:  # rows that never ran
            dh0 = dh0 + xp.where((lengths == 0)[:, None], d_h_final, xp.zeros_like(d_h_final))
    dz_x = dz_h = d_gates
    if norm is not None:
        dz_x, dz_h = norm.input_grad(d_gates), norm.dz_h
    dx, dw, db, dwci, dwcf, dwco = _input_and_weight_grads(rt, x, h_prev, weights.w, d_gates,
                                                           terms, dz_x, dz_h)
    dx = plan.running_inputs(xp, plan.masked(dx, settings.input_mask), lengths)
    dw_proj = None if proj is None else proj.weight_grad()
    d_norm = None if norm is None else norm.parameter_grads(db)
    return dx, dcs0, dh0, dw, db, dwci, dwcf, dwco, dw_proj, d_norm


def _backward_steps(rt, x, cs0, weights, steps, settings, lengths, masks, *, d_h, d_cs,
                    d_h_final, d_cs_final, gate_up, clip_grad, proj=None, norm=None):
    """The backward loop: every step's gate gradients ``[T, B, 4H]``, the peephole terms
    ``[T, B, 3H]`` (None without peepholes), and the carries before step 0: ``dL/dcs``
    and ``dL/dh`` (None when T = 0). With a projection (``proj``) the
    kernel's ``d_h`` is ``proj``'s ``dm`` and it reads no ``dh`` carry of its own. With a
    layer norm (``norm``, a ``_NormGrad``) the step kernel is ``lstm_backward_ln`` and the
    carry is ``dz_h·W_hᵀ``, ``dz_h`` through the recurrent part's norm. The masks
    (``(m_rec, z_cs, z_h)``, ``_masks``): the carry is ``(dz_h·W_hᵀ)∘m_rec``, plus the
    old state's part ``z_h∘g`` of the zoned h's gradient (the kernel's ``dh_zoned``, or
    ``proj``'s); the kernel splits the zoned cs's itself. ``gate_up``: the gates' upstream
    gradients ``[T, 5, B, H]`` (``_gate_upstreams``) or None."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = cs0.shape[1]
    dtype = x.dtype
    w_h = weights.w[n_in:]
    peephole = settings.peepholes
    d_gates = xp.empty((n_steps, n_batch, 4 * n_hidden), dtype=dtype)
    terms = xp.empty((n_steps, n_batch, 3 * n_hidden), dtype=dtype) if peephole else None
    dcs = xp.empty((n_batch, n_hidden), dtype=dtype)  # carry: dL/dcs before step t
    dh_recurrent = None  # dL/dh before step t: (dz_h·W_hᵀ)∘m_rec (+ z_h∘g with zoneout)
    placeholder = cs0
    m_rec, z_cs, z_h = masks
    zone_h = z_h is not None and proj is None  # the kernel splits the zoned h's gradient
    dh_zoned = xp.empty((n_batch, n_hidden), dtype=dtype) if zone_h else placeholder
    backward = _backward_kernel(rt, weights, settings, lengths, masks, proj, clip_grad,
                                (d_h, d_cs, d_h_final, d_cs_final), x.shape, placeholder,
                                dh_zoned=dh_zoned, dcs_next=dcs, dcs_prev=dcs,
                                has_d_gate_up=gate_up is not None)
    saved = [name for name in LSTMCellState._fields if name != "h"]
    for t in reversed(range(n_steps)):
        backward(cs_prev=cs0 if t == 0 else steps.cs[t - 1],
                 **{k: getattr(steps, k)[t] for k in saved},
                 **_dh_arguments(proj, t, d_h, dh_recurrent, placeholder),
                 d_cs=placeholder if d_cs is None else d_cs[t], step=t,
                 d_gate_up=placeholder if gate_up is None else gate_up[t],
                 zoneout_cs=_launch.at_step(z_cs, t, placeholder),
                 zoneout_h=_launch.at_step(z_h if zone_h else None, t, placeholder),
                 d_gates=d_gates[t], peephole_terms=terms[t] if peephole else placeholder,
                 **({} if norm is None else {"norm_terms": norm.cell_terms[t]}))
        dz_h = d_gates[t] if norm is None else norm.recurrent_grad(t, d_gates[t])
        dh_recurrent = plan.masked(matmul(xp, dz_h, w_h.T), m_rec)
        if z_h is not None:  # the old state's part of the zoned h's gradient
            dh_recurrent = dh_recurrent + (dh_zoned if proj is None else proj.dh_old)
    return d_gates, terms, dcs, dh_recurrent


def _backward_kernel(rt, weights, settings, lengths, masks, proj, clip_grad, upstream,
                     shape, placeholder, name="lstm_backward", **arguments):
    """The backward step kernel (``name``, ``_ln`` with a layer norm), the arguments that
    stay the same from step to step settled: the peepholes, the final-state gradients
    (``upstream``: ``(d_h, d_cs, d_h_final, d_cs_final)``), ``_backward_flags`` and
    ``arguments``; ``shape`` is ``x``'s ``[T, B, I]``."""
    xp = rt.xp
    d_h, d_cs, d_h_final, d_cs_final = upstream
    n_steps, n_batch, _ = shape
    n_hidden = placeholder.shape[1]
    wci, wcf, wco = _peepholes(xp, weights, settings, placeholder)
    name, n_threads, extra = _step_kernel(name, rt, weights, settings, n_batch, n_hidden)
    return Launcher(
        rt, name, placeholder.dtype, n_threads, **extra, wci=wci, wcf=wcf, wco=wco,
        d_h_final=placeholder if d_h_final is None else d_h_final,
        d_cs_final=placeholder if d_cs_final is None else d_cs_final,
        **_backward_flags(xp, settings, lengths, masks, proj, clip_grad, d_h, d_cs, d_h_final,
                          d_cs_final, n_steps, n_batch, n_hidden), **arguments)


def _backward_flags(xp, settings, lengths, masks, proj, clip_grad, d_h, d_cs, d_h_final,
                    d_cs_final, n_steps, n_batch, n_hidden):
    """The backward step kernel's flags, sizes and ``seq_len`` (``lstm_backward``'s, also
    its tangent's, ``_TangentLoop``): which upstream gradients there are (with a projection
    the kernel's ``d_h`` is always given and ``d_h_final`` is the projection's), the clip
    and its exact mask, zoneout, lengths."""
    _, z_cs, z_h = masks
    cell_clip = settings.cell_clip
    return dict(
        seq_len=_launch.lengths_argument(xp, lengths),
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=settings.peepholes,
        use_clip=cell_clip is not None, mask_clip=cell_clip is not None and clip_grad == "exact",
        use_zoneout_cs=z_cs is not None, use_zoneout_h=z_h is not None and proj is None,
        has_d_h=d_h is not None or proj is not None, has_d_cs=d_cs is not None,
        has_d_h_final=d_h_final is not None and proj is None,
        has_d_cs_final=d_cs_final is not None, use_seq_len=lengths is not None,
        n_steps=n_steps, batch=n_batch, hidden=n_hidden)


def _dh_arguments(proj, t, d_h, dh_recurrent, placeholder):
    """The backward kernel's ``d_h`` and ``dh_next`` at step t."""
    if proj is not None:
        return {"d_h": proj.step(t, dh_recurrent), "dh_next": proj.zero_carry}
    return {"d_h": placeholder if d_h is None else d_h[t],
            "dh_next": placeholder if dh_recurrent is None else dh_recurrent}


class _ProjectionGrad:
    """The projection's backward (docs/spec.md §9.1), step by step: the gradient of the
    projected ``h`` (the step's ``d_h``, plus ``d_h_final`` on a row's last step and the
    carry from step t+1 before it; zero past a row's length), masked by the exact clip
    (``dh_raw``; ``|m·w_proj| <= proj_clip`` passes), gives ``dm = dh_raw·w_projᵀ``, the
    kernel's ``d_h``; ``dw_proj = M_flatᵀ·DHraw_flat`` after the loop. With zoneout
    (``z_h``, a ``_launch.sequence_mask``) that gradient g of the zoned h splits first:
    ``(1-z)∘g`` goes on, ``z∘g`` is ``dh_old``, the old state's part of the carry."""

    def __init__(self, xp, w_proj, proj_clip, clip_grad, lengths, steps, d_h, d_h_final,
                 z_h):
        self.xp, self.w_proj, self.lengths, self.d_h, self.d_h_final, self.z_h = (
            xp, w_proj, lengths, d_h, d_h_final, z_h)
        self.dh_old = None
        self.mask_clip = proj_clip if proj_clip is not None and clip_grad == "exact" else None
        self.m = steps.o * steps.co  # the kernel's stored m = o∘co, rounded alike
        n_steps, n_batch, _ = self.m.shape
        self.dh_raw = xp.zeros((n_steps, n_batch, w_proj.shape[1]), dtype=self.m.dtype)
        self.zero_carry = xp.zeros(self.m.shape[1:], dtype=self.m.dtype)

    def step(self, t, carry):
        """``dm`` of step t from the carry (None on the last step)."""
        xp, n_steps = self.xp, self.m.shape[0]
        zero = xp.zeros((), dtype=self.dh_raw.dtype)
        length = n_steps if self.lengths is None else self.lengths[:, None]
        last = t + 1 >= length
        final = zero if self.d_h_final is None else self.d_h_final
        dh = xp.where(last, final, zero if carry is None else carry)
        if self.d_h is not None:
            dh = dh + self.d_h[t]
        running = t < length
        if self.z_h is not None:  # after the split: z past a row's length is never read
            dh, dh_old = plan.zoneout_grad(plan.at_step(self.z_h, t), dh)
            self.dh_old = xp.where(running, dh_old, zero)
        dh = xp.where(running, dh, zero)
        if self.mask_clip is not None:
            dh = xp.where(abs(self.m[t] @ self.w_proj) <= self.mask_clip, dh, zero)
        self.dh_raw[t] = dh
        return matmul(xp, self.dh_raw[t], self.w_proj.T)

    def weight_grad(self):
        """``dw_proj = M_flatᵀ·DHraw_flat``."""
        return plan.flat(self.m).T @ plan.flat(self.dh_raw)


class _NormGrad:
    """The gate norms' backward (docs/spec.md §9.2) around the loop, and the cell norm's
    per-step terms. ``x·W_x`` and ``h_prev·W_h`` of every step are recomputed (one matmul
    each); per step ``recurrent_grad`` takes ``dG_t`` through ``LN(h_prev·W_h)``, after the
    loop ``input_grad`` takes every step's ``dG`` through ``LN(x·W_x)`` at once; the γ
    gradients are column sums of the kernels' ``dy∘ẑ`` terms, and each β gradient is the
    bias gradient (``dG`` reaches ``b`` and both norms' ``β`` alike). ``h_prev`` is what the
    recurrent matmul saw (``h_prev∘m_rec`` with a recurrent mask)."""

    def __init__(self, rt, x, h_prev, weights, epsilon):
        xp = self.xp = rt.xp
        self.rt, self.norm, self.epsilon = rt, weights.layer_norm, epsilon
        self.x, self.h_prev = x, h_prev  # what the matmuls saw (the second order reads them)
        n_steps, n_batch, n_in = x.shape
        width = weights.w.shape[1]
        self.z_x = (plan.flat(x) @ weights.w[:n_in]).reshape(n_steps, n_batch, width)
        self.z_h = (plan.flat(h_prev) @ weights.w[n_in:]).reshape(n_steps, n_batch, width)
        self.dz_h = xp.empty((n_steps, n_batch, width), dtype=x.dtype)
        self.h_terms = xp.empty_like(self.dz_h)
        self.x_terms = None
        self.cell_terms = xp.empty((n_steps, n_batch, width // 2), dtype=x.dtype)

    def recurrent_grad(self, t, d_gates):
        """``dz_h`` of step t (kept for ``dW_h``) from its gate gradients ``dG_t``."""
        return _norm_grad_rows(self.rt, d_gates, self.z_h[t], self.norm.gamma_h, self.epsilon,
                               self.dz_h[t], self.h_terms[t])[0]

    def input_grad(self, d_gates):
        """``dz_x`` of every step from every step's ``dG``."""
        dz_x, self.x_terms = _norm_grad_rows(self.rt, d_gates, self.z_x, self.norm.gamma_x,
                                             self.epsilon)
        return dz_x

    def parameter_grads(self, db):
        """The six parameter gradients, an ``LSTMNorm``, given the bias gradient ``db``."""
        rt, hidden = self.rt, self.cell_terms.shape[2] // 2
        cell = column_sum(rt, plan.flat(self.cell_terms))
        return LSTMNorm(column_sum(rt, plan.flat(self.x_terms)), db.copy(),
                        column_sum(rt, plan.flat(self.h_terms)), db.copy(),
                        cell[:hidden].copy(), cell[hidden:].copy())


def _input_and_weight_grads(rt, x, h_prev, w, d_gates, terms, dz_x, dz_h):
    """``dx = dz_x·W_xᵀ`` (one matmul), ``dW`` (its x and h parts, from ``dz_x`` and
    ``dz_h``: ``d_gates`` itself without a layer norm; ``x`` and ``h_prev`` as the matmuls
    saw them), the bias gradient and the peephole gradients (column sums of ``d_gates``
    and ``terms``; None when ``terms`` is None)."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    n_hidden = d_gates.shape[2] // 4
    d_gates_flat, dz_x_flat = plan.flat(d_gates), plan.flat(dz_x)
    dx = (dz_x_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = xp.empty(w.shape, dtype=x.dtype)
    xp.matmul(plan.flat(x).T, dz_x_flat, out=dw[:n_in])
    xp.matmul(plan.flat(h_prev).T, plan.flat(dz_h), out=dw[n_in:])
    db = column_sum(rt, d_gates_flat)
    dwci = dwcf = dwco = None
    if terms is not None:
        sums = column_sum(rt, plan.flat(terms))
        dwci, dwcf, dwco = sums[:n_hidden], sums[n_hidden:2 * n_hidden], sums[2 * n_hidden:]
    return dx, dw, db, dwci, dwcf, dwco


# --------------------------------------------------------------------------------------
# Forward mode (docs/spec.md §12)


def lstm_cell_jvp(x, cs_prev, h_prev, weights, tangents, settings):
    """One LSTM step and its tangent along ``tangents`` (an ``LSTMCellGrads``, None fields
    zero); see ``gradcells.reference.lstm.lstm_cell_jvp``. The primal is ``lstm_cell``'s."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        tangents = LSTMSequenceGrads(*tangents)._replace(
            x=None if tangents.x is None else tangents.x[None])
        steps, _, _, t_steps, _, _ = _jvp(rt, x[None], tangents.x, cs_prev, h_prev, weights,
                                          tangents, settings)
        return LSTMCellState(*(a[0] for a in steps)), LSTMCellState(*(a[0] for a in t_steps))


def lstm_sequence_jvp(x, cs0, h0, weights, tangents, settings):
    """``lstm_sequence`` and its tangent along ``tangents`` (an ``LSTMSequenceGrads``, None
    fields zero); see ``gradcells.reference.lstm.lstm_sequence_jvp``."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        steps, cs, h, t_steps, t_cs, t_h = _jvp(rt, x, tangents.x, cs0, h0, weights, tangents,
                                                settings)
        if settings.seq_len is None:  # views of the last step (or the inputs when T = 0)
            cs, h, t_cs, t_h = cs.copy(), h.copy(), t_cs.copy(), t_h.copy()
        return (LSTMSequence(*steps, cs_final=cs, h_final=h),
                LSTMSequence(*t_steps, cs_final=t_cs, h_final=t_h))


def _norm_field(t_norm, name):
    """A field of a layer norm's tangent (an ``LSTMNorm`` or None; None: zero)."""
    return None if t_norm is None else getattr(t_norm, name)


def _norm_tangent_rows(rt, z, t_z, gamma, t_gamma, t_beta, epsilon):
    """The tangent of ``LN(z; γ, β)`` over the last axis of ``z`` for ``t_z``, ``t_γ`` and
    ``t_β`` (None: zero): ``layer_norm_tangent_rows``, a thread per row."""
    xp = rt.xp
    z, t_z = xp.ascontiguousarray(z), xp.ascontiguousarray(t_z)
    cols = z.shape[-1]
    rows = z.size // cols if cols else 0
    gamma = xp.ascontiguousarray(gamma)
    t_y = xp.empty_like(z)
    Launcher(rt, "layer_norm_tangent_rows", z.dtype, rows)(
        z=z, dz=t_z, gamma=gamma, d_gamma=gamma if t_gamma is None else contiguous(xp, t_gamma),
        d_beta=gamma if t_beta is None else contiguous(xp, t_beta), epsilon=epsilon,
        use_d_gamma=t_gamma is not None, use_d_beta=t_beta is not None, rows=rows,
        cols=cols, dy=t_y)
    return t_y


def _peephole_tangents(xp, t, placeholder):
    """The kernels' ``dwci, dwcf, dwco``, the peepholes' tangents ``t_wci, t_wcf, t_wco``
    (zeros for a None among given ones), and whether there are any."""
    given = [t.wci, t.wcf, t.wco]
    if all(p is None for p in given):
        return [placeholder] * 3, False
    shape = next(p for p in given if p is not None).shape
    return [xp.zeros(shape, dtype=placeholder.dtype) if p is None else xp.ascontiguousarray(p)
            for p in given], True


def _gate_tangents(rt, x, t_x, weights, t, settings):
    """The input part of every step and its tangent, ``[T, B, 4H]``: ``x·W_x`` (its norm
    with a layer norm, ``layer_norm_rows`` as the forward's) and ``t_x·W_x + x·t_W_x + t_b``
    (through the norm's tangent before the bias's)."""
    xp = rt.xp
    n_steps, n_batch, n_in = x.shape
    width = weights.w.shape[1]
    w_x = weights.w[:n_in]
    t_w_x = None if t.w is None else t.w[:n_in]
    x_gates = (plan.flat(x) @ w_x).reshape(n_steps, n_batch, width)
    norm = weights.layer_norm
    if norm is None:
        return x_gates, input_tangent(xp, x, t_x, w_x, t_w_x, t.b, width)
    eps, t_norm = settings.ln_epsilon, t.layer_norm
    t_gates = _norm_tangent_rows(rt, x_gates, input_tangent(xp, x, t_x, w_x, t_w_x, None, width),
                                 norm.gamma_x, _norm_field(t_norm, "gamma_x"),
                                 _norm_field(t_norm, "beta_x"), eps)
    if t.b is not None:
        t_gates += t.b
    return _norm_rows(rt, x_gates, norm.gamma_x, norm.beta_x, eps), t_gates


def _recurrent_part(rt, h_seen, t_h_seen, weights, t, settings, n_in):
    """A step's recurrent part ``h_seen·W_h`` (its norm with a layer norm) and its tangent
    ``t_h_seen·W_h + h_seen·t_W_h`` (through the norm's)."""
    xp = rt.xp
    w_h = weights.w[n_in:]
    gh = matmul(xp, h_seen, w_h)
    t_gh = recurrent_tangent(xp, h_seen, t_h_seen, w_h, None if t.w is None else t.w[n_in:])
    norm = weights.layer_norm
    if norm is None:
        return gh, t_gh
    eps, t_norm = settings.ln_epsilon, t.layer_norm
    return (_norm_rows(rt, gh, norm.gamma_h, norm.beta_h, eps),
            _norm_tangent_rows(rt, gh, t_gh, norm.gamma_h, _norm_field(t_norm, "gamma_h"),
                              _norm_field(t_norm, "beta_h"), eps))


def _project_tangent(xp, m, t_m, w_proj, t_w_proj, proj_clip, z_h, lengths, t, out, t_h):
    """Step t's projected tangent ``t_m·w_proj + m·t_w_proj`` (zero where the projection's
    clip is active), zoned with the carried ``t_h`` by ``z_h``, into ``out`` (zero past a
    row's length); returns the carried tangent (``t_h`` kept in those rows)."""
    t_raw = t_m @ w_proj
    if t_w_proj is not None:
        t_raw = t_raw + m @ t_w_proj
    if proj_clip is not None:
        t_raw = xp.where(abs(m @ w_proj) <= proj_clip, t_raw, xp.zeros((), dtype=t_raw.dtype))
    t_raw = plan.zoned(z_h, t_h, t_raw)
    if lengths is None:
        out[...] = t_raw
        return out
    valid = (t < lengths)[:, None]
    out[...] = xp.where(valid, t_raw, xp.zeros((), dtype=out.dtype))
    return xp.where(valid, t_raw, t_h)


def _tangent_step_kernel(rt, weights, t, settings, n_batch, n_hidden, lengths, masks,
                         placeholder):
    """The step's tangent kernel (``lstm_forward_tangent``, ``_ln`` with a layer norm: a
    thread per row), its arguments that stay the same from step to step settled."""
    xp = rt.xp
    name, n_threads, extra = _step_kernel("lstm_forward_tangent", rt, weights, settings,
                                          n_batch, n_hidden)
    if weights.layer_norm is not None:
        t_gamma, t_beta = (_norm_field(t.layer_norm, f) for f in ("gamma_c", "beta_c"))
        extra.update(d_gamma_c=placeholder if t_gamma is None else contiguous(xp, t_gamma),
                     d_beta_c=placeholder if t_beta is None else contiguous(xp, t_beta),
                     use_d_gamma=t_gamma is not None, use_d_beta=t_beta is not None)
    wci, wcf, wco = _peepholes(xp, weights, settings, placeholder)
    (t_wci, t_wcf, t_wco), use_d_peephole = _peephole_tangents(xp, t, placeholder)
    _, z_cs, z_h = masks
    cell_clip = settings.cell_clip
    return Launcher(
        rt, name, placeholder.dtype, n_threads, **extra, wci=wci, wcf=wcf, wco=wco,
        dwci=t_wci, dwcf=t_wcf, dwco=t_wco, seq_len=_launch.lengths_argument(xp, lengths),
        cell_clip=0.0 if cell_clip is None else cell_clip, use_peephole=settings.peepholes,
        use_d_peephole=use_d_peephole and settings.peepholes, use_clip=cell_clip is not None,
        use_seq_len=lengths is not None, use_zoneout_cs=z_cs is not None,
        use_zoneout_h=z_h is not None and weights.w_proj is None, batch=n_batch,
        hidden=n_hidden)


def _jvp(rt, x, t_x, cs0, h0, weights, t, settings):
    """The LSTM over ``x [T, B, I]`` and its tangent along ``t`` (an ``LSTMSequenceGrads``;
    the input's tangent is ``t_x``, ``[T, B, I]``): ``(steps, cs, h, t_steps, t_cs, t_h)``, the
    primal as ``_forward`` computes it (its step kernel, norms and projection).
    Per step: ``_recurrent_part``, the forward's kernel, the tangent kernel
    (``_tangent_step_kernel``), then with a projection ``_project_tangent``."""
    xp = rt.xp
    lengths = _launch.lengths(xp, settings.seq_len)
    x, t_x = running(xp, x, settings, lengths), running(xp, t_x, settings, lengths)
    (n_steps, n_batch, n_in), n_hidden, dtype = x.shape, cs0.shape[1], x.dtype
    masks = m_rec, z_cs, z_h = _masks(xp, settings, n_steps, n_batch, n_hidden, h0.shape[1])
    x_gates, t_x_gates = _gate_tangents(rt, x, t_x, weights, t, settings)
    steps, t_steps = (LSTMCellState(*(xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                                      for _ in LSTMCellState._fields)) for _ in range(2))
    (cs, t_cs), (h, t_h) = (state_buffers(xp, cs0, t.cs0, lengths),
                          state_buffers(xp, h0, t.h0, lengths))
    projection = weights.w_proj is not None
    if projection:  # the kernels' h is m = o∘co; the steps' h is the projected one
        m_steps, t_m_steps = (xp.empty((n_steps, n_batch, n_hidden), dtype=dtype)
                             for _ in range(2))
        steps, t_steps = (s._replace(h=xp.empty((n_steps, n_batch, h0.shape[1]), dtype=dtype))
                          for s in (steps, t_steps))
        m_state, t_m_state = (xp.empty((n_batch, n_hidden), dtype=dtype) for _ in range(2))
    b = xp.ascontiguousarray(weights.b)
    forward = _forward_step_kernel(rt, weights, settings, lengths, masks, n_batch, n_hidden, b,
                                   cs, m_state if projection else h)
    tangent = _tangent_step_kernel(rt, weights, t, settings, n_batch, n_hidden, lengths,
                                   masks, b)
    for step in range(n_steps):
        outputs = dict(zip(LSTMCellState._fields, (a[step] for a in steps), strict=True))
        t_outputs = dict(zip(LSTMCellState._fields, (a[step] for a in t_steps), strict=True))
        if projection:
            outputs["h"], t_outputs["h"] = m_steps[step], t_m_steps[step]
        gh, t_gh = _recurrent_part(rt, plan.masked(h, m_rec), plan.masked(t_h, m_rec),
                                  weights, t, settings, n_in)
        t_gates = t_x_gates[step] + t_gh
        cs_prev = cs.copy() if lengths is not None else cs  # the step updates the buffer
        zone_cs = _launch.at_step(z_cs, step, b)
        zone_h = b if projection else _launch.at_step(z_h, step, b)
        forward(gx=x_gates[step], gh=gh, cs_prev=cs, step=step, h_prev=b if projection else h,
                zoneout_cs=zone_cs, zoneout_h=zone_h, **outputs)
        tangent(d_gates=t_gates, cs_prev=cs_prev, dcs_prev=t_cs, dh_prev=b if projection else t_h,
                zoneout_cs=zone_cs, zoneout_h=zone_h, step=step,
                **{k: outputs[k] for k in ("i", "f", "o", "ci", "co")},
                **{_TANGENT_NAMES[k]: v for k, v in t_outputs.items()},
                dcs_state=t_cs if lengths is not None else b,
                dh_state=(t_m_state if projection else t_h) if lengths is not None else b)
        if projection:
            z = plan.at_step(z_h, step)
            t_h = _project_tangent(xp, m_steps[step], t_m_steps[step], weights.w_proj, t.w_proj,
                                   settings.proj_clip, z, lengths, step, t_steps.h[step], t_h)
            h = _project(xp, m_steps[step], weights.w_proj, settings.proj_clip, z, lengths,
                         step, steps.h[step], h)
        if lengths is None:
            cs, h, t_cs, t_h = steps.cs[step], steps.h[step], t_steps.cs[step], t_steps.h[step]
    return steps, cs, h, t_steps, t_cs, t_h


# The tangent kernels' names of the LSTMCellState fields' tangents.
_TANGENT_NAMES = {"i": "di", "cs": "dcs", "f": "df", "o": "d_o", "ci": "dci", "co": "dco",
                  "h": "dh"}


# --------------------------------------------------------------------------------------
# Second order (docs/spec.md §12)


def lstm_cell_grad_jvp(x, cs_prev, h_prev, weights, state, tangents, settings, *, d_h=None,
                       d_cs=None, d_i=None, d_f=None, d_o=None, d_ci=None, d_co=None,
                       d_h_tangent=None, d_cs_tangent=None, d_i_tangent=None,
                       d_f_tangent=None, d_o_tangent=None, d_ci_tangent=None,
                       d_co_tangent=None, clip_grad="exact"):
    """The JVP of ``lstm_cell_grad`` along ``tangents`` (an ``LSTMCellGrads``, None fields
    zero) and the upstream gradients' tangents (every field's): ``(grads, grads_tangent)``,
    two ``LSTMCellGrads``; see ``gradcells.reference.lstm.lstm_cell_grad_jvp``. A cell is
    the sequence's plan with T = 1 (``_grad_jvp``), every option included."""

    def step(a):
        return None if a is None else a[None]

    rt, on_device = _launch.runtime_on(x)
    with on_device:
        upstream = {"d_h": (step(d_h), step(d_h_tangent)),
                    "d_cs": (step(d_cs), step(d_cs_tangent)),
                    "d_h_final": (None, None), "d_cs_final": (None, None),
                    "gates": (tuple(map(step, (d_i, d_f, d_o, d_ci, d_co))),
                              tuple(map(step, (d_i_tangent, d_f_tangent, d_o_tangent,
                                               d_ci_tangent, d_co_tangent))))}
        pair = _grad_jvp(rt, x[None], cs_prev, h_prev, weights,
                         LSTMCellState(*(a[None] for a in state)),
                         LSTMSequenceGrads(*tangents)._replace(x=step(tangents.x)),
                         settings, upstream, clip_grad)
        return tuple(LSTMCellGrads(g[0][0], *g[1:]) for g in pair)


def lstm_sequence_grad_jvp(x, cs0, h0, weights, seq, tangents, settings, *, d_h=None,
                           d_cs=None, d_h_final=None, d_cs_final=None, d_i=None, d_f=None,
                           d_o=None, d_ci=None, d_co=None, d_h_tangent=None,
                           d_cs_tangent=None, d_h_final_tangent=None, d_cs_final_tangent=None,
                           d_i_tangent=None, d_f_tangent=None, d_o_tangent=None,
                           d_ci_tangent=None, d_co_tangent=None, clip_grad="exact"):
    """The JVP of ``lstm_sequence_grad`` along ``tangents`` (an ``LSTMSequenceGrads``, None
    fields zero) and the upstream gradients' tangents (every field's): ``(grads,
    grads_tangent)``; see ``gradcells.reference.lstm.lstm_sequence_grad_jvp`` and
    ``_grad_jvp`` (every option, the layer norm included)."""
    rt, on_device = _launch.runtime_on(x)
    with on_device:
        upstream = {"d_h": (d_h, d_h_tangent), "d_cs": (d_cs, d_cs_tangent),
                    "d_h_final": (d_h_final, d_h_final_tangent),
                    "d_cs_final": (d_cs_final, d_cs_final_tangent),
                    "gates": ((d_i, d_f, d_o, d_ci, d_co),
                              (d_i_tangent, d_f_tangent, d_o_tangent, d_ci_tangent,
                               d_co_tangent))}
        pair = _grad_jvp(rt, x, cs0, h0, weights, _saved_steps(seq), tangents, settings,
                         upstream, clip_grad)
        return tuple(LSTMSequenceGrads(*g) for g in pair)


def _grad_jvp(rt, x, cs0, h0, weights, seq, t, settings, upstream, clip_grad):
    """The JVP of ``_backward`` along ``t`` (an
    ``LSTMSequenceGrads`` of the inputs' tangents, ``x``'s ``[T, B, I]``) and the upstream
    gradients' tangents (``upstream``: name -> ``(gradient, tangent)``, ``d_h``, ``d_cs``,
    ``d_h_final``, ``d_cs_final``, and ``gates``: the pair of the gates' five ``(d_i, ...,
    d_co)``): two lists of the fields of LSTMSequenceGrads. The
    saved steps' tangents are ``_jvp``'s; per step ``lstm_backward_tangent`` runs
    before ``lstm_backward`` (it reads the ``dcs`` carry that kernel overwrites)."""
    xp = rt.xp
    t = zeros_filled(xp, t, (x, cs0, h0, *weights))
    t_steps = _jvp_steps(rt, x, cs0, h0, weights, t, settings)
    lengths = _launch.lengths(xp, settings.seq_len)
    x_run, t_x = running(xp, x, settings, lengths), running(xp, t.x, settings, lengths)
    steps = LSTMCellState(*(xp.ascontiguousarray(a) for a in seq))
    dtype, (n_steps, n_batch, _), n_hidden = x.dtype, x.shape, cs0.shape[1]
    likes = {"d_h": steps.h, "d_cs": steps.cs, "d_h_final": h0, "d_cs_final": cs0}
    pairs = {k: upstream_pair(xp, *upstream[k], likes[k]) for k in likes}
    ups, t_ups = ([pairs[k][j] for k in likes] for j in (0, 1))
    masks = _masks(xp, settings, n_steps, n_batch, n_hidden, h0.shape[1])
    h_prev = plan.masked(_launch.previous(xp, h0, steps.h), masks[0])
    t_h_prev = plan.masked(_launch.previous(xp, t.h0, t_steps.h), masks[0])
    norm = t_norm = None
    if weights.layer_norm is not None:
        norm = _NormGrad(rt, x_run, h_prev, weights, settings.ln_epsilon)
        t_norm = _NormTangent(rt, norm, t_x, t_h_prev, weights, t)
    proj = t_proj = None
    if weights.w_proj is not None:
        proj, t_proj = (_ProjectionGrad(xp, weights.w_proj, settings.proj_clip, clip_grad,
                                        lengths, steps, u[0], u[2], masks[2])
                        for u in (ups, t_ups))
    loop = _TangentLoop(rt, weights, t, settings, lengths, masks, (proj, t_proj),
                        (norm, t_norm), clip_grad, (ups, t_ups),
                        _gate_pair(xp, upstream["gates"], steps.i), x.shape, cs0)
    d_gates, terms, dcs0, dh0, t_d_gates, t_terms, t_dcs0, t_dh0 = loop.run(
        steps, t_steps, cs0, t.cs0)
    if n_steps == 0:
        (dcs0, t_dcs0), (dh0, t_dh0) = (
            [xp.zeros(like.shape, dtype=dtype) if g is None else g.copy() for g in pair]
            for pair, like in ((pairs["d_cs_final"], cs0), (pairs["d_h_final"], h0)))
    elif lengths is not None and ups[2] is not None:  # rows that never ran
        never = (lengths == 0)[:, None]
        dh0, t_dh0 = (d + xp.where(never, g, xp.zeros_like(g))
                      for d, g in ((dh0, ups[2]), (t_dh0, t_ups[2])))
    primal, tangent = _products(rt, x_run, t_x, h_prev, t_h_prev, weights, t,
                                     (d_gates, terms, t_d_gates, t_terms), (norm, t_norm))
    dx, t_dx = (plan.running_inputs(xp, plan.masked(a, settings.input_mask), lengths)
                for a in (primal[0], tangent[0]))
    dw_proj = t_dw_proj = None
    if proj is not None:
        t_m = t_steps.o * steps.co + steps.o * t_steps.co
        dw_proj = proj.weight_grad()
        t_dw_proj = t_proj.weight_grad() + plan.flat(t_m).T @ plan.flat(proj.dh_raw)
    d_norm = t_d_norm = None
    if norm is not None:
        d_norm, t_d_norm = norm.parameter_grads(primal[2]), t_norm.parameter_grads(tangent[2])
    return ([dx, dcs0, dh0, *primal[1:], dw_proj, d_norm],
            [t_dx, t_dcs0, t_dh0, *tangent[1:], t_dw_proj, t_d_norm])


def _gate_pair(xp, gates, like):
    """The gates' upstreams and their tangents as ``_gate_upstreams`` gives them: ``(None,
    None)`` when all ten are None, else two ``[T, 5, B, H]`` arrays (zeros for the
    absent), as the tangent kernel's ``has_d_gate_up`` covers both."""
    pair = [_gate_upstreams(xp, g, like) for g in gates]
    if pair[0] is None and pair[1] is None:
        return None, None
    return tuple(xp.zeros((like.shape[0], 5, *like.shape[1:]), dtype=like.dtype)
                 if a is None else a for a in pair)


def _products(rt, x, t_x, h_prev, t_h_prev, weights, t, loop, norms):
    """``_input_and_weight_grads`` and its tangent, the product rule ``(x, W, dz') + (x', W',
    dz)`` (``db'`` and the peepholes' from ``dz'`` alone); ``loop``: the gate gradients,
    the peephole terms and their tangents; with a layer norm (``norms``: the ``_NormGrad``
    and its ``_NormTangent``) ``dz`` through the gate norms."""
    d_gates, terms, t_d_gates, t_terms = loop
    norm, t_norm = norms
    dz_x, dz_h, t_dz_x, t_dz_h = d_gates, d_gates, t_d_gates, t_d_gates
    if norm is not None:
        dz_x, dz_h = norm.input_grad(d_gates), norm.dz_h
        t_dz_x, t_dz_h = t_norm.input_grad(d_gates, t_d_gates), t_norm.dz_h
    primal = _input_and_weight_grads(rt, x, h_prev, weights.w, d_gates, terms, dz_x, dz_h)
    tangent = sum_pairs(
        _input_and_weight_grads(rt, x, h_prev, weights.w, t_d_gates, t_terms, t_dz_x, t_dz_h),
        [*_input_and_weight_grads(rt, t_x, t_h_prev, t.w, d_gates, None, dz_x, dz_h)[:2],
         None, None, None, None])
    return primal, tangent


def _jvp_steps(rt, x, cs0, h0, weights, t, settings):
    """The saved steps' tangents (an LSTMCellState of ``[T, B, H]`` arrays), by
    ``_jvp``."""
    return _jvp(rt, x, t.x, cs0, h0, weights, t, settings)[3]


class _TangentLoop:
    """The backward loop of ``_backward_steps`` with its tangent: per
    step (from the last) ``lstm_backward_tangent`` then ``lstm_backward``, then the carries
    ``dh = (dz·W_hᵀ)∘m_rec`` and ``dh' = (dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec``, plus zoneout's old
    state's parts (the kernels' ``dh_zoned`` or the projections'). With a projection
    (``proj``, ``t_proj``: ``_ProjectionGrad``s of the upstream gradients and of their
    tangents, the same clip mask) the kernels' ``d_h`` is ``dm`` and its tangent
    ``dm' = dh_raw'·w_projᵀ + dh_raw·w_proj'ᵀ``."""

    def __init__(self, rt, weights, t, settings, lengths, masks, projections, norms,
                 clip_grad, upstream, gate_up, shape, cs0):

        proj, t_proj = projections
        ups, t_ups = upstream
        self.gate_up = gate_up       # the gates' upstreams and tangents (_gate_pair)
        has_gate_up = gate_up[0] is not None
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
                                         dcs_next=self.dcs, dcs_prev=self.dcs,
                                         has_d_gate_up=has_gate_up)
        t_peepholes = _peepholes(xp, t, settings, cs0)
        t_cell_norm = {} if self.norm is None else {
            "t_gamma_c": t.layer_norm.gamma_c, "t_beta_c": t.layer_norm.beta_c}
        self.tangent = _backward_kernel(
            *common, ups, shape, cs0, name="lstm_backward_tangent", **t_cell_norm,
            **{f"t_{k}": v for k, v in zip(PEEPHOLES, t_peepholes, strict=True)},
            t_d_h_final=cs0 if t_ups[2] is None else t_ups[2],
            t_d_cs_final=cs0 if t_ups[3] is None else t_ups[3], t_dh_zoned=self.t_dh_zoned,
            dcs_next=self.dcs, t_dcs_next=self.t_dcs, t_dcs_prev=self.t_dcs,
            has_d_gate_up=has_gate_up)

    def run(self, steps, t_steps, cs0, t_cs0):
        """The loop: ``(d_gates, terms, dcs0, dh0)`` and their tangents (``dcs0``, ``dh0``
        None when T = 0)."""
        z_cs = self.masks[1]
        dh = t_dh = None
        at = _launch.at_step
        for step in reversed(range(self.n_steps)):
            state = {k: getattr(steps, k)[step] for k in ("i", "cs", "f", "o", "ci", "co")}
            t_state = {f"t_{k}": getattr(t_steps, k)[step] for k in state}
            dh_args, t_dh_args = self._dh_arguments(step, dh, t_dh)
            zones = {"zoneout_cs": at(z_cs, step, self.placeholder),
                     "zoneout_h": at(self.masks[2] if self.zone_h else None, step,
                                     self.placeholder)}
            d_cs, t_d_cs, gate_up, t_gate_up = (
                self.placeholder if a is None else a[step]
                for a in (self.ups[1], self.t_ups[1], *self.gate_up))
            self.tangent(cs_prev=cs0 if step == 0 else steps.cs[step - 1],
                         t_cs_prev=t_cs0 if step == 0 else t_steps.cs[step - 1],
                         **state, **t_state, **dh_args, **t_dh_args, d_cs=d_cs,
                         t_d_cs=t_d_cs, d_gate_up=gate_up, t_d_gate_up=t_gate_up, step=step,
                         **zones,
                         t_d_gates=self.t_d_gates[step],
                         t_peephole_terms=self._at(self.t_terms, step),
                         **self._norm_terms(self.t_norm, step, "t_norm_terms"))
            self.backward(cs_prev=cs0 if step == 0 else steps.cs[step - 1], **state,
                          **dh_args, d_cs=d_cs, d_gate_up=gate_up, step=step, **zones,
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
    """The tangent of ``_NormGrad`` (``norm``): the recomputed gate
    norms' inputs' tangents ``z_x' = x'·W_x + x·W_x'`` and ``z_h' = h_prev'·W_h +
    h_prev·W_h'`` (one matmul pair each), ``layer_norm_grad_tangent_rows`` per step for the
    recurrent part and after the loop for the x part, and the parameter gradients'
    tangents (column sums of the terms' tangents; each β's is the bias's)."""

    def __init__(self, rt, norm, t_x, t_h_prev, weights, t):
        xp = rt.xp
        self.rt, self.norm, self.t_norm = rt, norm, t.layer_norm
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
                                       self.z_h[step], norm.norm.gamma_h, self.t_norm.gamma_h,
                                       norm.epsilon, self.dz_h[step], self.h_terms[step])

    def input_grad(self, d_gates, t_d_gates):
        """``dz_x'`` of every step."""
        norm = self.norm
        self.x_terms = self.rt.xp.empty_like(t_d_gates)
        return _norm_grad_tangent_rows(self.rt, d_gates, t_d_gates, norm.z_x, self.z_x,
                                       norm.norm.gamma_x, self.t_norm.gamma_x, norm.epsilon,
                                       self.rt.xp.empty_like(t_d_gates), self.x_terms)

    def parameter_grads(self, t_db):
        """The six parameter gradients' tangents, an ``LSTMNorm``."""
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
