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
on the tangent arrays. A None tangent is zero. The layer-normalised LSTM adds the norms'
backward tangents (``lstm_backward_tangent_ln`` for the cell norm inside the step,
``layer_norm_grad_tangent_rows`` for the gate norms, a thread per row), around the
tangents of the recomputed norm inputs ``z' = x'·W + x·W'``.
"""

from __future__ import annotations

from .._core import plan
from .._core.specs import PEEPHOLES
from . import _launch
from ._jvp import running
from ._launch import Launcher, column_sum, matmul


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
    shapes = {"d_h": steps.h.shape, "d_cs": steps.cs.shape, "d_h_final": h0.shape,
              "d_cs_final": cs0.shape}
    pairs = {k: _paired(xp, *upstream[k], shapes[k], dtype) for k in shapes}
    ups, t_ups = ([pairs[k][j] for k in shapes] for j in (0, 1))
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
