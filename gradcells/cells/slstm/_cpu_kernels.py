"""The sLSTM's fused elementwise passes (Numba), one pass over ``[B, H]`` per step each way.

The math is ``gradcells.cells.slstm.reference`` (docs/spec.md §19):

    slstm_forward_kernel(...)     the gates, the stabiliser and the new state from the
                                  step's pre-activations, in place over the state
    slstm_forward_tangent_kernel  the same with the tangents beside (forward mode)
    slstm_backward_tangent_kernel the backward with the tangents beside (second order)
    slstm_backward_kernel(...)    the step's pre-activation gradients (gate-major for the
                                  input weights, head-major for the recurrent ones) and the
                                  state's gradients carried back, in place over the carry

``cpu.py`` calls them around its BLAS matmuls, once per time step. The recurrent products
come head-major, ``rec [N, B, 4d]`` (head k's ``h_k·r[k]``, d = H/N), so that each head's
weights stay one contiguous block through the time loop; a pre-activation of gate g, head
k, unit j is ``x_pre[b, g·H + k·d + j] + rec[k, b, g·d + j]``.

A gate's exponential is flushed to 0 below ``e^floor`` (``floor = 2·log ε``), as the
reference's ``flushed_exp``; the ĩ branch of the stabiliser is where ``i = 1`` (``ĩ - m``
exactly 0, a tie included), as the reference reads it.
"""

from __future__ import annotations

import numpy as np

from ...cpu._activations import sigmoid, tanh, typed
from ...cpu._compile import helper, kernel


@helper
def _flushed_exp(a, floor):
    """``e^a``, exactly 0 below ``e^floor``."""
    return a - a if a < floor else np.exp(a)


@helper
def _log_sigmoid(z):
    """``log σ(z) = min(z, 0) - log1p(e^{-|z|})``."""
    low = z if z < 0 else z - z
    return low - np.log1p(np.exp(-abs(z)))


@kernel
def slstm_forward_kernel(x_pre, rec, running, exp_forget, floor, c, n, m, h,
                         out_i, out_f, out_z, out_o, out_c, out_n, out_m, out_h):
    """One sLSTM step over the rows; the state ``c, n, m, h [B, H]`` is updated in place.

    Arguments (C-contiguous, one float dtype; B rows, H = ``c.shape[1]``, N heads):

    - ``x_pre [B, 4H]``: the step's ``x·w + b``, gate-major;
    - ``rec [N, B, 4d]``: each head's ``h_prev_k·r[k]`` (``h_prev`` masked as the caller
      wants), gate-major within the head;
    - ``running [B]``: whether each row runs this step (a stopped row keeps its state and
      gets zero outputs);
    - ``exp_forget``: True for ``lf = f̃``, False for ``lf = log σ(f̃)``;
    - ``floor``: the exponent below which a gate is 0 (a float of the dtype);
    - ``out_* [B, H]``: the step's fields ``i, f, z, o, c, n, m, h``, overwritten.
    """
    n_batch, hidden = c.shape
    n_heads = rec.shape[0]
    d = hidden // n_heads if n_heads else 0
    zero = typed(0.0, c)
    for row in range(n_batch):
        xr = x_pre[row]
        c_r, n_r, m_r, h_r = c[row], n[row], m[row], h[row]
        oi, of, oz, oo = out_i[row], out_f[row], out_z[row], out_o[row]
        oc, on, om, oh = out_c[row], out_n[row], out_m[row], out_h[row]
        if not running[row]:
            for j in range(hidden):
                oi[j] = of[j] = oz[j] = oo[j] = oc[j] = on[j] = om[j] = oh[j] = zero
            continue
        for k in range(n_heads):
            rk = rec[k, row]
            for j in range(d):
                col = k * d + j
                it = xr[col] + rk[j]
                ft = xr[hidden + col] + rk[d + j]
                lfm = (ft if exp_forget else _log_sigmoid(ft)) + m_r[col]
                m_new = it if it >= lfm else lfm
                i = _flushed_exp(it - m_new, floor)
                f = _flushed_exp(lfm - m_new, floor)
                z = tanh(xr[2 * hidden + col] + rk[2 * d + j])
                o = sigmoid(xr[3 * hidden + col] + rk[3 * d + j])
                c_new = f * c_r[col] + i * z
                n_new = f * n_r[col] + i
                h_new = o * c_new / n_new
                oi[col], of[col], oz[col], oo[col] = i, f, z, o
                oc[col], on[col], om[col], oh[col] = c_new, n_new, m_new, h_new
                c_r[col], n_r[col], m_r[col], h_r[col] = c_new, n_new, m_new, h_new


@kernel
def slstm_backward_kernel(i_t, f_t, z_t, o_t, c_t, n_t, h_t, c_prev, n_prev, f_pre, up,
                          running, exp_forget, stop, g_c, g_n, g_m, g_h, d_gates, d_heads):
    """One sLSTM step's backward over the rows (the reference's ``slstm_step_grad``).

    Arguments (C-contiguous, one float dtype; B rows, H, N heads of d):

    - ``i_t ... h_t [B, H]``: the step's saved fields; ``c_prev, n_prev [B, H]``: the state
      it started from; ``f_pre [B, H]``: the forget pre-activation (read for the sigmoid
      forget only);
    - ``up [8, B, H]``: the step's upstream gradients of ``i, f, z, o, c, n, m, h``;
    - ``running [B]``: whether each row ran the step (a stopped row's gradients are zero
      and its carry passes through);
    - ``exp_forget``, ``stop``: the settings (``stop``: ``m`` held constant);
    - ``g_c, g_n, g_m [B, H]``: the gradients of the state after the step carried in,
      overwritten with those of the state before it; ``g_h [B, H]``: ``h``'s carried in
      (read only: the caller forms the new one from ``d_heads``);
    - ``d_gates [B, 4H]`` and ``d_heads [N, B, 4d]``: the pre-activation gradients,
      gate-major and head-major, overwritten.
    """
    n_batch, hidden = c_t.shape
    n_heads = d_heads.shape[0]
    d = hidden // n_heads if n_heads else 0
    zero = typed(0.0, c_t)
    one = typed(1.0, c_t)
    for row in range(n_batch):
        dg = d_gates[row]
        if not running[row]:
            for j in range(4 * hidden):
                dg[j] = zero
            for k in range(n_heads):
                for j in range(4 * d):
                    d_heads[k, row, j] = zero
            continue
        for k in range(n_heads):
            dh_k = d_heads[k, row]
            for j in range(d):
                col = k * d + j
                i, f, z, o = i_t[row, col], f_t[row, col], z_t[row, col], o_t[row, col]
                c, n, h = c_t[row, col], n_t[row, col], h_t[row, col]
                gh = g_h[row, col] + up[7, row, col]
                gc = g_c[row, col] + up[4, row, col] + gh * o / n
                gn = g_n[row, col] + up[5, row, col] - gh * h / n
                d_o = (up[3, row, col] + gh * c / n) * (o * (one - o))
                gi = up[0, row, col] + gc * z + gn
                gf = up[1, row, col] + gc * c_prev[row, col] + gn * n_prev[row, col]
                d_z = (up[2, row, col] + gc * i) * (one - z * z)
                d_it = gi * i
                d_lf = gf * f
                dm_prev = zero
                if not stop:
                    gm = g_m[row, col] + up[6, row, col] - d_it - d_lf
                    if i >= one:
                        d_it += gm
                    else:
                        d_lf += gm
                    dm_prev = d_lf
                d_ft = d_lf if exp_forget else d_lf * sigmoid(-f_pre[row, col])
                dg[col], dg[hidden + col] = d_it, d_ft
                dg[2 * hidden + col], dg[3 * hidden + col] = d_z, d_o
                dh_k[j], dh_k[d + j], dh_k[2 * d + j], dh_k[3 * d + j] = d_it, d_ft, d_z, d_o
                g_c[row, col], g_n[row, col], g_m[row, col] = gc * f, gn * f, dm_prev


@kernel
def slstm_forward_tangent_kernel(x_pre, rec, dx_pre, drec, running, exp_forget, stop, floor,
                                 state, d_state, out, d_out):
    """One sLSTM step and its tangent (forward mode, the reference's ``slstm_step_jvp``);
    the state and its tangent are updated in place.

    Arguments (C-contiguous, one float dtype; B rows, H, N heads of d):

    - ``x_pre [B, 4H]``, ``rec [N, B, 4d]``: as ``slstm_forward_kernel``'s; ``dx_pre``,
      ``drec``: their tangents;
    - ``running [B]``, ``exp_forget``, ``floor``: as ``slstm_forward_kernel``'s; ``stop``:
      ``m`` held constant (its tangent zero, the previous one unread);
    - ``state, d_state [4, B, H]``: ``c, n, m, h`` and their tangents;
    - ``out, d_out [8, B, H]``: the step's fields ``i, f, z, o, c, n, m, h`` and their
      tangents, overwritten.

    Per element, with the forward's values:

        dlf = df̃·σ(-f̃) (sigmoid) or df̃;   dm = dĩ where i = 1, else dlf + dm_prev
        di = i·(dĩ - dm);   df = f·(dlf + dm_prev - dm);   dz = (1-z²)·dz̃;   do = o(1-o)·dõ
        dc = df·c_prev + f·dc_prev + di·z + i·dz;   dn = df·n_prev + f·dn_prev + di
        dh = do·c/n + (o·dc - h·dn)/n
    """
    n_batch, hidden = state.shape[1], state.shape[2]
    n_heads = rec.shape[0]
    d = hidden // n_heads if n_heads else 0
    zero = typed(0.0, state)
    one = typed(1.0, state)
    for row in range(n_batch):
        if not running[row]:
            for k in range(8):
                for j in range(hidden):
                    out[k, row, j] = zero
                    d_out[k, row, j] = zero
            continue
        for kh in range(n_heads):
            for j in range(d):
                col = kh * d + j
                pre = (x_pre[row, col] + rec[kh, row, j],
                       x_pre[row, hidden + col] + rec[kh, row, d + j])
                dpre = (dx_pre[row, col] + drec[kh, row, j],
                        dx_pre[row, hidden + col] + drec[kh, row, d + j])
                c_p, n_p, m_p = state[0, row, col], state[1, row, col], state[2, row, col]
                dc_p, dn_p = d_state[0, row, col], d_state[1, row, col]
                lfm = (pre[1] if exp_forget else _log_sigmoid(pre[1])) + m_p
                m_new = pre[0] if pre[0] >= lfm else lfm
                i = _flushed_exp(pre[0] - m_new, floor)
                f = _flushed_exp(lfm - m_new, floor)
                zt = x_pre[row, 2 * hidden + col] + rec[kh, row, 2 * d + j]
                ot = x_pre[row, 3 * hidden + col] + rec[kh, row, 3 * d + j]
                z, o = tanh(zt), sigmoid(ot)
                c_new = f * c_p + i * z
                n_new = f * n_p + i
                h_new = o * c_new / n_new
                d_lf = dpre[1] if exp_forget else dpre[1] * sigmoid(-pre[1])
                dm_p = zero if stop else d_state[2, row, col]
                dm = zero if stop else (dpre[0] if i >= one else d_lf + dm_p)
                di = i * (dpre[0] - dm)
                df = f * (d_lf + dm_p - dm)
                dz = (one - z * z) * (dx_pre[row, 2 * hidden + col] + drec[kh, row, 2 * d + j])
                do = o * (one - o) * (dx_pre[row, 3 * hidden + col] + drec[kh, row, 3 * d + j])
                dc = df * c_p + f * dc_p + di * z + i * dz
                dn = df * n_p + f * dn_p + di
                dh = do * c_new / n_new + (o * dc - h_new * dn) / n_new
                values = (i, f, z, o, c_new, n_new, m_new, h_new)
                tangents = (di, df, dz, do, dc, dn, dm, dh)
                for k in range(8):
                    out[k, row, col] = values[k]
                    d_out[k, row, col] = tangents[k]
                for k in range(4):
                    state[k, row, col] = values[4 + k]
                    d_state[k, row, col] = tangents[4 + k]


@kernel
def slstm_backward_tangent_kernel(fields, d_fields, starts, d_starts, f_pre, d_f_pre, up,
                                  d_up, running, exp_forget, stop, carry, d_carry, d_gates,
                                  d_gates_t):
    """One step's backward and its tangent (second order: the JVP of
    ``slstm_backward_kernel``, every line differentiated as written; the branch of ``m``
    follows the primal).

    Arguments (C-contiguous, one float dtype; B rows, H):

    - ``fields, d_fields [8, B, H]``: the step's saved ``i, f, z, o, c, n, m, h`` and their
      tangents; ``starts, d_starts [2, B, H]``: ``c_prev, n_prev`` and theirs;
      ``f_pre, d_f_pre [B, H]``: ``f̃`` and its tangent (read for the sigmoid forget);
    - ``up, d_up [8, B, H]``: the step's upstream gradients and their tangents;
    - ``running``, ``exp_forget``, ``stop``: as ``slstm_backward_kernel``'s;
    - ``carry, d_carry [4, B, H]``: the carried ``g_c, g_n, g_m, g_h`` and their tangents;
      the first three replaced by those of the state before the step (``g_h`` read only);
    - ``d_gates, d_gates_t [B, 4H]``: the pre-activation gradients, gate-major, and their
      tangents, overwritten.
    """
    n_batch, hidden = fields.shape[1], fields.shape[2]
    zero = typed(0.0, fields)
    one = typed(1.0, fields)
    two = typed(2.0, fields)
    for row in range(n_batch):
        if not running[row]:
            for j in range(4 * hidden):
                d_gates[row, j] = zero
                d_gates_t[row, j] = zero
            continue
        for col in range(hidden):
            i, f, z, o = (fields[0, row, col], fields[1, row, col], fields[2, row, col],
                          fields[3, row, col])
            c, n, h = fields[4, row, col], fields[5, row, col], fields[7, row, col]
            ti, tf, tz, to = (d_fields[0, row, col], d_fields[1, row, col],
                              d_fields[2, row, col], d_fields[3, row, col])
            tc, tn, th = d_fields[4, row, col], d_fields[5, row, col], d_fields[7, row, col]
            cp, np_ = starts[0, row, col], starts[1, row, col]
            tcp, tnp = d_starts[0, row, col], d_starts[1, row, col]
            gh = carry[3, row, col] + up[7, row, col]
            tgh = d_carry[3, row, col] + d_up[7, row, col]
            gc = carry[0, row, col] + up[4, row, col] + gh * o / n
            tgc = (d_carry[0, row, col] + d_up[4, row, col] + (tgh * o + gh * to) / n
                   - gh * o * tn / (n * n))
            gn = carry[1, row, col] + up[5, row, col] - gh * h / n
            tgn = (d_carry[1, row, col] + d_up[5, row, col] - (tgh * h + gh * th) / n
                   + gh * h * tn / (n * n))
            a = up[3, row, col] + gh * c / n
            ta = d_up[3, row, col] + (tgh * c + gh * tc) / n - gh * c * tn / (n * n)
            d_o = a * (o * (one - o))
            td_o = ta * (o * (one - o)) + a * (to * (one - two * o))
            gi = up[0, row, col] + gc * z + gn
            tgi = d_up[0, row, col] + tgc * z + gc * tz + tgn
            gf = up[1, row, col] + gc * cp + gn * np_
            tgf = d_up[1, row, col] + tgc * cp + gc * tcp + tgn * np_ + gn * tnp
            bz = up[2, row, col] + gc * i
            tbz = d_up[2, row, col] + tgc * i + gc * ti
            d_z = bz * (one - z * z)
            td_z = tbz * (one - z * z) - bz * (two * z * tz)
            d_it, td_it = gi * i, tgi * i + gi * ti
            d_lf, td_lf = gf * f, tgf * f + gf * tf
            dm_prev, tdm_prev = zero, zero
            if not stop:
                gm = carry[2, row, col] + up[6, row, col] - d_it - d_lf
                tgm = d_carry[2, row, col] + d_up[6, row, col] - td_it - td_lf
                if i >= one:
                    d_it, td_it = d_it + gm, td_it + tgm
                else:
                    d_lf, td_lf = d_lf + gm, td_lf + tgm
                dm_prev, tdm_prev = d_lf, td_lf
            if exp_forget:
                d_ft, td_ft = d_lf, td_lf
            else:
                s = sigmoid(-f_pre[row, col])
                d_ft = d_lf * s
                td_ft = td_lf * s - d_lf * (s * (one - s) * d_f_pre[row, col])
            d_gates[row, col], d_gates_t[row, col] = d_it, td_it
            d_gates[row, hidden + col], d_gates_t[row, hidden + col] = d_ft, td_ft
            d_gates[row, 2 * hidden + col], d_gates_t[row, 2 * hidden + col] = d_z, td_z
            d_gates[row, 3 * hidden + col], d_gates_t[row, 3 * hidden + col] = d_o, td_o
            carry[0, row, col], d_carry[0, row, col] = gc * f, tgc * f + gc * tf
            carry[1, row, col], d_carry[1, row, col] = gn * f, tgn * f + gn * tf
            carry[2, row, col], d_carry[2, row, col] = dm_prev, tdm_prev
