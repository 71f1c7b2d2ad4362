"""Second order (docs/spec.md §12) on the GPU: the JVP of each gradient op, ``(grads,
grads_tangent)``, the gradient's own plan with a tangent beside every value.

The saved result's tangent is the GPU's own forward mode (``_jvp``). Then the backward loop
runs as the cell module's gradient runs it, and per step, before the step's backward kernel,
a tangent kernel (``lstm_backward_tangent``, ...) differentiates that kernel along the
tangents of everything it reads (the saved outputs', the upstream gradients', the carries'
and the weights'), each branch as the primal takes it. With dz the gate gradients and ' a
tangent, the matmuls are the product rule in cuBLAS:

    carry' = (dz'·W_hᵀ + dz·W_h'ᵀ)∘m_rec        dx' = dz'·W_xᵀ + dz·W_x'ᵀ
    dW'    = x'ᵀ·dz + xᵀ·dz'                    db' = Σ dz'

Everything linear in the gradients (masks, zoneout's split, the rows past their lengths,
the projection's clip mask) acts on the tangents as on the gradients: the same helpers run
on the tangent arrays. A None tangent is zero.
"""

from __future__ import annotations

from .._core import plan
from .._core.specs import PEEPHOLES
from . import _launch
from ._jvp import running
from ._launch import matmul


def _zeros_filled(xp, tangents, primals):
    """``tangents`` with every None a zero tangent of its primal (None where the primal is),
    C-contiguous."""
    return type(tangents)(*(None if p is None else xp.zeros_like(p, order="C") if t is None
                            else xp.ascontiguousarray(t) for t, p in zip(tangents, primals)))


def _paired(xp, gradient, tangent, shape, dtype):
    """An upstream gradient and its tangent, both arrays (zeros for a None one) or both
    None."""
    if gradient is None and tangent is None:
        return None, None
    zeros = xp.zeros(shape, dtype=dtype)
    return (zeros if gradient is None else xp.ascontiguousarray(gradient),
            zeros if tangent is None else xp.ascontiguousarray(tangent))


def _sum_pairs(a, b):
    """Field by field ``a + b`` of two tuples of arrays (None stays None)."""
    return [x if y is None else x + y for x, y in zip(a, b)]


# ---- LSTM


def lstm_grad_jvp(rt, x, cs0, h0, weights, seq, t, settings, upstream, clip_grad):
    """The JVP of ``gradcells.gpu.lstm._backward`` (no layer norm) along ``t`` (an
    ``LSTMSequenceGrads`` of the inputs' tangents, ``x``'s ``[T, B, I]``) and the upstream
    gradients' tangents (``upstream``: name -> ``(gradient, tangent)``, ``d_h``, ``d_cs``,
    ``d_h_final``, ``d_cs_final``): two lists of the fields of LSTMSequenceGrads. The
    saved steps' tangents are ``_jvp.lstm_jvp``'s; per step ``lstm_backward_tangent`` runs
    before ``lstm_backward`` (it reads the ``dcs`` carry that kernel overwrites)."""
    from .lstm import _input_and_weight_grads, _masks, _ProjectionGrad

    xp = rt.xp
    t = _zeros_filled(xp, t, (x, cs0, h0, *weights))
    d_steps = _jvp_steps(rt, x, cs0, h0, weights, t, settings)
    lengths = _launch.lengths(xp, settings.seq_len)
    x_run, t_x = running(xp, x, settings, lengths), running(xp, t.x, settings, lengths)
    steps = type(d_steps)(*(xp.ascontiguousarray(a) for a in seq[:len(d_steps)]))
    dtype, (n_steps, n_batch, _), n_hidden = x.dtype, x.shape, cs0.shape[1]
    shapes = {"d_h": steps.h.shape, "d_cs": steps.cs.shape, "d_h_final": h0.shape,
              "d_cs_final": cs0.shape}
    pairs = {k: _paired(xp, *upstream[k], shapes[k], dtype) for k in shapes}
    ups, t_ups = ([pairs[k][j] for k in shapes] for j in (0, 1))
    masks = _masks(xp, settings, n_steps, n_batch, n_hidden, h0.shape[1])
    h_prev = plan.masked(_launch.previous(xp, h0, steps.h), masks[0])
    t_h_prev = plan.masked(_launch.previous(xp, t.h0, d_steps.h), masks[0])
    proj = t_proj = None
    if weights.w_proj is not None:
        proj, t_proj = (_ProjectionGrad(xp, weights.w_proj, settings.proj_clip, clip_grad,
                                        lengths, steps, u[0], u[2], masks[2])
                        for u in (ups, t_ups))
    loop = _LSTMTangentLoop(rt, weights, t, settings, lengths, masks, proj, t_proj, clip_grad,
                            ups, t_ups, x.shape, cs0)
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
    primal = _input_and_weight_grads(rt, x_run, h_prev, weights.w, d_gates, terms, d_gates,
                                     d_gates)
    tangent = _sum_pairs(  # the product rule: (x, W, dz') + (x', W', dz); db' and the
        _input_and_weight_grads(rt, x_run, h_prev, weights.w, t_d_gates, t_terms,  # peep-
                                t_d_gates, t_d_gates),  # holes' from dz' alone
        [*_input_and_weight_grads(rt, t_x, t_h_prev, t.w, d_gates, None, d_gates,
                                  d_gates)[:2], None, None, None, None])
    dx, t_dx = (plan.running_inputs(xp, plan.masked(a, settings.input_mask), lengths)
                for a in (primal[0], tangent[0]))
    dw_proj = t_dw_proj = None
    if proj is not None:
        t_m = d_steps.o * steps.co + steps.o * d_steps.co
        dw_proj = proj.weight_grad()
        t_dw_proj = t_proj.weight_grad() + plan.flat(t_m).T @ plan.flat(proj.dh_raw)
    return ([dx, dcs0, dh0, *primal[1:], dw_proj, None],
            [t_dx, t_dcs0, t_dh0, *tangent[1:], t_dw_proj, None])


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

    def __init__(self, rt, weights, t, settings, lengths, masks, proj, t_proj, clip_grad,
                 ups, t_ups, shape, cs0):
        from .lstm import _backward_kernel, _peepholes

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
        self.tangent = _backward_kernel(
            *common, ups, shape, cs0, name="lstm_backward_tangent",
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
                         t_peephole_terms=self._at(self.t_terms, step))
            self.backward(cs_prev=cs0 if step == 0 else steps.cs[step - 1], **state,
                          **dh_args, d_cs=d_cs, step=step, **zones,
                          d_gates=self.d_gates[step],
                          peephole_terms=self._at(self.terms, step))
            dh, t_dh = self._carries(step)
        return (self.d_gates, self.terms, self.dcs, dh, self.t_d_gates, self.t_terms,
                self.t_dcs, t_dh)

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
        dh = plan.masked(matmul(xp, dz, self.w_h.T), m_rec)
        t_dh = plan.masked(matmul(xp, t_dz, self.w_h.T) + dz @ self.t_w_h.T, m_rec)
        if z_h is not None:  # the old state's part of the zoned h's gradient
            if self.proj is None:
                dh, t_dh = dh + self.dh_zoned, t_dh + self.t_dh_zoned
            else:
                dh, t_dh = dh + self.proj.dh_old, t_dh + self.t_proj.dh_old
        return xp.ascontiguousarray(dh), xp.ascontiguousarray(t_dh)
