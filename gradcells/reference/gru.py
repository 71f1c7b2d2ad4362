"""The GRU block cell, forward and gradient, written once for any array namespace.

TensorFlow's layout (SPEC 3): ``w_ru [I+H, 2H]`` holds the columns of r then u, ``w_c [I+H, H]``
the candidate; rows are the x part then the h part. Reset before the candidate matmul:

    [r, u] = σ([x, h_prev]·w_ru + b_ru)
    c      = tanh([x, r∘h_prev]·w_c + b_c)
    h      = u∘h_prev + (1-u)∘c

Reset after (``reset_after=True``; cuDNN, PyTorch, Keras): ``w_c`` rows split into W_cx, W_ch
and ``b_c [2H]`` into b_cx, b_ch:

    c      = tanh(x·W_cx + b_cx + r∘(h_prev·W_ch + b_ch))
"""

from __future__ import annotations

from .._dispatch import namespace_of
from .._types import GRUCellGrads, GRUCellState
from ._math import blocks, sigmoid


def _recurrent_candidate(h_prev, w_c, b_c):
    """n = h_prev·W_ch + b_ch, the reset-after candidate's recurrent part."""
    n_hidden = h_prev.shape[1]
    return h_prev @ w_c[w_c.shape[0] - n_hidden:] + b_c[n_hidden:]


def gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c, *, reset_after=False):
    """One GRU step; returns ``GRUCellState(r, u, c, h)``."""
    xp = namespace_of(x)
    n_in, n_hidden = x.shape[1], h_prev.shape[1]
    r, u = blocks(sigmoid(xp, xp.concatenate([x, h_prev], axis=1) @ w_ru + b_ru), 2)
    if reset_after:
        n = _recurrent_candidate(h_prev, w_c, b_c)
        c = xp.tanh(x @ w_c[:n_in] + b_c[:n_hidden] + r * n)
    else:
        c = xp.tanh(xp.concatenate([x, r * h_prev], axis=1) @ w_c + b_c)
    h = u * h_prev + (1 - u) * c
    return GRUCellState(r, u, c, h)


def gru_gate_grads(x, h_prev, w_c, b_c, state, d_h=None, *, reset_after=False):
    """The backward step up to the pre-activations of one GRU step:
    ``(dc_bar [B, H], d_ru [B, 2H], dx_c [B, I], dh_c [B, H])``, where ``d_ru`` is
    ``[dr_bar, du_bar]`` and ``dx_c``, ``dh_c`` are what reaches x and h_prev through the
    candidate's matmul.

        dc_bar = d_h∘(1-u)∘(1-c²);    du_bar = d_h∘(h_prev-c)∘u(1-u)
        [dx_c, d_hr] = dc_bar·w_cᵀ                   (d_hr = dL/d(r∘h_prev))
        dr_bar = d_hr∘h_prev∘r(1-r);   dh_c = d_hr∘r

    Reset after, with n = h_prev·W_ch + b_ch and d_n = dc_bar∘r:
        dr_bar = dc_bar∘n∘r(1-r);   dx_c = dc_bar·W_cxᵀ;   dh_c = d_n·W_chᵀ
    """
    xp = namespace_of(x)
    r, u, c, _ = state
    n_in = x.shape[1]
    if d_h is None:
        d_h = xp.zeros_like(h_prev)
    dc_bar = d_h * (1 - u) * (1 - c * c)
    du_bar = d_h * (h_prev - c) * u * (1 - u)
    if reset_after:
        dr_bar = dc_bar * _recurrent_candidate(h_prev, w_c, b_c) * r * (1 - r)
        dx_c = dc_bar @ w_c[:n_in].T
        dh_c = (dc_bar * r) @ w_c[n_in:].T
    else:
        dxhr = dc_bar @ w_c.T
        dx_c, d_hr = dxhr[:, :n_in], dxhr[:, n_in:]
        dr_bar = d_hr * h_prev * r * (1 - r)
        dh_c = d_hr * r
    return dc_bar, xp.concatenate([dr_bar, du_bar], axis=1), dx_c, dh_c


def gru_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, state, d_h=None, *, reset_after=False):
    """Gradient of one GRU step with respect to every input.

        dc_bar, [dr_bar, du_bar], dx_c, dh_c = gru_gate_grads(...)
        [dx_1, dh_1] = [dr_bar, du_bar]·w_ruᵀ
        dx = dx_1 + dx_c;   dh_prev = dh_1 + dh_c + d_h∘u
        dw_ru = [x, h_prev]ᵀ·[dr_bar, du_bar];   db_ru = Σ_batch [dr_bar, du_bar]
        dw_c  = [x, r∘h_prev]ᵀ·dc_bar;           db_c  = Σ_batch dc_bar
    Reset after, with d_n = dc_bar∘r:
        dw_c = [xᵀ·dc_bar; h_prevᵀ·d_n];  db_c = [Σ dc_bar, Σ d_n]
    """
    xp = namespace_of(x)
    r, u = state.r, state.u
    n_in = x.shape[1]
    if d_h is None:
        d_h = xp.zeros_like(h_prev)
    dc_bar, d_ru, dx_c, dh_c = gru_gate_grads(x, h_prev, w_c, b_c, state, d_h,
                                              reset_after=reset_after)
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
