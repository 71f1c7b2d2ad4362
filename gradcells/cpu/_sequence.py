"""The NumPy plumbing of the CPU sequence ops (``lstm.py``, ``gru.py``): the matmul plan of
``gradcells.reference``'s sequences with BLAS for the matmuls and the fused cell kernels for
each step's elementwise work.

- forward: the input projection ``x_flat·W_x + b`` of all steps first (one matmul per
  weight block), then per step ``h_prev·W_h`` and the cell kernel, which takes the step's
  slice of the projection as its per-row addend and writes the step's outputs in place;
- backward: per step the cell's backward kernel writes the step's gate gradients into
  ``[T, B, ·]`` arrays (and accumulates the bias and peephole sums), then ``dG_t·W_hᵀ``
  gives the gradient of the previous state, with ``W_hᵀ`` copied C-contiguous once per
  call (OpenBLAS packs a contiguous operand about 10% faster at these shapes); after the
  loop ``dx``, ``dW_x`` and ``dW_h`` are large matmuls over all ``T·B`` rows, written
  straight into their outputs.

Scratch (the projections, every step's gate gradients, the per-step buffers) comes from the
calling thread's reusable buffer (``_workspace``); results are always fresh arrays.

Per-example lengths: a row that runs step t ran every step before it, so every step starts
from the previous step's outputs and no state buffers are needed. Rows past their length
are computed as if they ran on and zeroed after the loop; their final state is gathered
from step ``L-1`` before that. Backwards, a stopped row gets zero upstream gradient (its
outputs are constants), so its gate gradients are zero, and keeps its state gradient.
Steps before the shortest length take the unmasked path.
"""

from __future__ import annotations

import numpy as np

from .._core.plan import flat, running_mask
from .._core.plan import running_inputs as _running_inputs


def contiguous(a):
    """``a`` itself when C-contiguous, else a C-contiguous copy."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def lengths_of(seq_len):
    """The lengths as ``int64 [B]``, or None when every row runs all T steps."""
    return None if seq_len is None else np.asarray(seq_len, dtype=np.int64)


def running_inputs(x, lengths):
    """``x`` with every step past its row's length zeroed in ``x``'s dtype (``x`` itself
    without lengths): ``gradcells._core.plan.running_inputs`` on NumPy."""
    return _running_inputs(np, x, lengths)


def projection(x, w_x, b, out):
    """``x_flat·W_x (+ b)`` for all steps at once, into ``out [T, B, width]``."""
    np.matmul(flat(x), w_x, out=flat(out))
    if b is not None:
        out += b


def step_outputs(count, shape, dtype):
    """``count`` new ``[T, B, H]`` arrays for a sequence's per-step outputs, as views of one
    block: NumPy asks the kernel for huge pages for allocations of 4 MiB and more, and one
    large block then costs a few hundred page faults where seven separate arrays of a few
    MiB cost thousands (measured: 2.9 ms against 17 ms to allocate and fill 7·[100, 32, 256]
    float32)."""
    return list(np.empty((count, *shape), dtype))


def previous_rows_grad(h0, steps, d_steps, out=None):
    """``h_prevᵀ·dG`` over all steps, ``h_prev = [h0, steps[0], ..., steps[T-2]]``, without
    stacking the states: ``steps[:-1]_flatᵀ·dG[1:]_flat + h0ᵀ·dG[0]`` (into ``out``, a
    ``[H, width]`` array, when given)."""
    n_steps, n_batch, n_hidden = steps.shape
    if out is None:
        out = np.empty((n_hidden, d_steps.shape[2]), steps.dtype)
    if n_steps == 0 or n_batch == 0:
        out[...] = 0
        return out
    np.matmul(flat(steps[:-1]).T, flat(d_steps[1:]), out=out)
    out += h0.T @ d_steps[0]
    return out


def input_and_weight_grads(x, h0, w, h, d_x_part, d_h_part=None):
    """``dx = dZx·W_xᵀ`` and ``dw = [x_flatᵀ·dZx; h_prev_flatᵀ·dZh]`` over all ``T·B`` rows,
    ``h_prev = [h0, h[0], ..., h[T-2]]``: ``dZx`` and ``dZh`` the gradients of ``x·W_x`` and
    ``h_prev·W_h`` (one array, ``d_h_part`` None, when they are the same, as without a layer
    norm)."""
    n_steps, n_batch, n_in = x.shape
    d_flat = flat(d_x_part)
    dx = (d_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = np.empty_like(w)
    np.matmul(flat(x).T, d_flat, out=dw[:n_in])
    previous_rows_grad(h0, h, d_x_part if d_h_part is None else d_h_part, out=dw[n_in:])
    return dx, dw


def recurrent_projection(h0, steps, w, out):
    """``h_prev·W`` for every step at once (two matmuls, no stacking), into ``out [T, B, ·]``."""
    n_steps, n_batch, n_hidden = steps.shape
    if n_steps and n_batch:
        np.matmul(h0, w, out=out[0])
        np.matmul(flat(steps[:-1]), w, out=flat(out[1:]))


def final_state(steps, first, lengths):
    """Each row's state after its last valid step: ``steps[L-1, b]``, or ``first[b]`` when
    ``L = 0`` (``lengths`` None: every row ran all T steps)."""
    n_steps, n_batch = steps.shape[:2]
    if n_steps == 0 or n_batch == 0:
        return first.copy()
    if lengths is None:
        return steps[-1].copy()
    last = steps[np.maximum(lengths - 1, 0), np.arange(n_batch)]
    return np.where((lengths > 0)[:, None], last, first)


def zero_stopped(steps, lengths):
    """Zero every step output in rows past their length."""
    if lengths is None:
        return
    stopped = ~running_mask(np, steps[0].shape[0], lengths)
    for a in steps:
        a[stopped] = 0


def stopped_rows(lengths, t):
    """``[B, 1]`` mask of the rows that stopped before step t; None when every row runs."""
    if lengths is None or t < lengths.min(initial=t + 1):
        return None
    return (t >= lengths)[:, None]


def upstream(carried, d_steps, t, buffer, stopped):
    """The gradient of step t's new state: carried from step t+1 plus the step's own
    upstream gradient, zero in stopped rows."""
    if d_steps is not None:
        total = np.add(carried, d_steps[t], out=buffer)
    elif stopped is not None:
        total = buffer
        np.copyto(total, carried)
    else:
        return carried
    if stopped is not None:
        np.copyto(total, 0, where=stopped)
    return total


def initial_carry(final, shape, dtype):
    """The carried state gradient before the backward loop: ``final`` (a C-contiguous copy),
    or zeros."""
    return np.zeros(shape, dtype) if final is None else np.array(final, dtype=dtype, order="C")
