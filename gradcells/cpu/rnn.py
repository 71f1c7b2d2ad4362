"""The plain (Elman) RNN cell and sequence on the CPU: BLAS matmuls plus one fused Numba
pass each way (``_rnn_kernels``).

The math is ``gradcells.reference.rnn``. A cell's forward:

    Z = [x, h_prev]·w                      one BLAS call
    rnn_forward_kernel(Z, b, ...)          h = act(Z + b), one pass over [B, H]

and its gradient:

    rnn_backward_kernel(...)               dz [B, H] and the bias sum
    d[x, h_prev] = dz·wᵀ,  dw = [x, h_prev]ᵀ·dz       two BLAS calls

A sequence projects every step's input at once and runs the kernels once per step
(``_sequence`` describes the plan, its scratch and per-example lengths).
"""

from __future__ import annotations

import numpy as np

from .._core.types import RNNCellGrads, RNNCellState, RNNSequence, RNNSequenceGrads
from ._compile import kernel_array
from ._rnn_kernels import rnn_backward_kernel, rnn_forward_kernel
from ._sequence import (
    contiguous,
    final_state,
    initial_carry,
    input_and_weight_grads,
    lengths_of,
    projection,
    running_inputs,
    step_outputs,
    stopped_rows,
    upstream,
    zero_stopped,
)
from ._workspace import scratch


def _is_relu(settings):
    return settings.activation == "relu"


# --------------------------------------------------------------------------------------
# cell


def rnn_cell(x, h_prev, weights, settings):
    """One RNN step; returns ``RNNCellState(h)``."""
    gates = np.dot(np.concatenate((x, h_prev), axis=1), weights.w)
    h = np.empty_like(gates)
    rnn_forward_kernel(gates, kernel_array(weights.b), _is_relu(settings), h)
    return RNNCellState(h)


def rnn_cell_grad(x, h_prev, weights, state, settings, *, d_h=None):
    """Gradient of one RNN step with respect to every input (``RNNCellGrads``)."""
    n_batch, n_hidden = h_prev.shape
    n_in = x.shape[1]
    dtype = h_prev.dtype
    h = kernel_array(state.h)
    carry = np.zeros((n_batch, n_hidden), dtype) if d_h is None else kernel_array(d_h)
    d_z = np.empty((n_batch, n_hidden), dtype)
    d_bias = np.zeros(n_hidden, dtype)
    rnn_backward_kernel(h, carry, carry, False, _is_relu(settings), d_z, d_bias)
    dxh = np.dot(d_z, weights.w.T)
    dw = np.dot(np.concatenate((x, h_prev), axis=1).T, d_z)
    return RNNCellGrads(x=dxh[:, :n_in], h_prev=dxh[:, n_in:], w=dw, b=d_bias)


# --------------------------------------------------------------------------------------
# sequence


def rnn_sequence(x, h0, weights, settings):
    """The RNN cell over ``x [T, B, I]``; see ``gradcells.reference``'s ``rnn_sequence``.

    Per step: ``h_prev·W_h`` (BLAS) and ``rnn_forward_kernel`` with the step's slice of
    ``x·W_x + b`` as its per-row addend, writing the step's output in place.
    """
    x, h0, w, b = map(contiguous, (x, h0, weights.w, weights.b))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    lengths = lengths_of(settings.seq_len)
    x = running_inputs(x, lengths)
    relu = _is_relu(settings)
    x_z, h_z = scratch(x.dtype, (n_steps, n_batch, n_hidden), (n_batch, n_hidden))
    projection(x, w[:n_in], b, x_z)
    w_h = w[n_in:]
    (h,) = step_outputs(1, (n_steps, n_batch, n_hidden), x.dtype)
    for t in range(n_steps):
        np.matmul(h0 if t == 0 else h[t - 1], w_h, out=h_z)
        rnn_forward_kernel(h_z, x_z[t], relu, h[t])
    final = final_state(h, h0, lengths)
    zero_stopped((h,), lengths)
    return RNNSequence(h, final)


def rnn_sequence_grad(x, h0, weights, seq, settings, *, d_h=None, d_h_final=None):
    """Backpropagation through time for ``rnn_sequence``.

    ``grad_h``: the gradient of the state after the current step (``d_h_final`` before the
    loop). Per step (``_backward_steps``): ``rnn_backward_kernel`` from ``grad_h + d_h[t]``
    writes ``dz_t`` and accumulates the bias sum; ``dz_t·W_hᵀ`` (BLAS) is the new
    ``grad_h``. Then ``dx`` and ``dw`` over all steps at once
    (``_sequence.input_and_weight_grads``).
    """
    x, h0, w = map(contiguous, (x, h0, weights.w))
    n_steps, n_batch, n_in = x.shape
    n_hidden = h0.shape[1]
    dtype = x.dtype
    lengths = lengths_of(settings.seq_len)
    x = running_inputs(x, lengths)
    h = contiguous(seq.h)
    d_h = None if d_h is None else contiguous(d_h)
    grad_h = initial_carry(d_h_final, (n_batch, n_hidden), dtype)
    state = (n_batch, n_hidden)
    buffers = scratch(dtype, state, state, (n_steps, n_batch, n_hidden), (n_hidden, n_hidden))
    np.copyto(buffers[3], w[n_in:].T)     # W_hᵀ, C-contiguous: OpenBLAS packs it faster
    d_bias = np.zeros(n_hidden, dtype)
    _backward_steps(h, d_h, grad_h, lengths, buffers, _is_relu(settings), d_bias)
    dx, dw = input_and_weight_grads(x, h0, w, h, buffers[2])
    return RNNSequenceGrads(x=dx, h0=grad_h, w=dw, b=d_bias)


def _backward_steps(h, d_h, grad_h, lengths, buffers, relu, d_bias):
    """The backward loop over the steps, last first: updates ``grad_h`` in place to the
    gradient of ``h0``, leaves every step's ``dz_t`` in ``buffers[2]`` and accumulates
    ``d_bias``.

    ``buffers``: the scratch ``(upstream [B, H], dh_prev [B, H], d_z [T, B, H],
    w_h_t [H, H])``.
    """
    upstream_h, dh_prev, d_z, w_h_t = buffers
    for t in reversed(range(h.shape[0])):
        stopped = stopped_rows(lengths, t)
        if stopped is None:          # the kernel adds d_h[t] itself
            rnn_backward_kernel(h[t], grad_h, grad_h if d_h is None else d_h[t],
                                d_h is not None, relu, d_z[t], d_bias)
            np.matmul(d_z[t], w_h_t, out=grad_h)
        else:                        # stopped rows: no upstream, keep their state gradient
            up = upstream(grad_h, d_h, t, upstream_h, stopped)
            rnn_backward_kernel(h[t], up, up, False, relu, d_z[t], d_bias)
            np.matmul(d_z[t], w_h_t, out=dh_prev)
            np.copyto(grad_h, dh_prev, where=~stopped)
