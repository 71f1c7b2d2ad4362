"""Forward mode and second order on the CPU (docs/spec.md §12): the plumbing every cell's
``*_jvp`` and ``*_grad_jvp`` share, around the cells' own step kernels.

Forward mode runs the forward's plan (``_sequence``) with a tangent beside every value:

- the input part of every step at once: the forward's ``x·W_x (+ b)`` and its tangent
  ``t_x·W_x + x·t_W_x (+ t_b)`` as ONE BLAS call over ``[t_x, x]·[W_x; t_W_x]`` (K = 2I;
  the stacked rows a scratch copy), a term whose tangent is None left out (``Linear``,
  ``input_tangent``);
- per step: the forward's ``h_seen·W_h`` and the tangent's ``t_h_seen·W_h + h_seen·t_W_h``,
  again one call on ``[t_h_seen, h_seen]``;
- the cell's elementwise step (its folder's ``_cpu_kernels``).

The masks, zoneout and the rows past their length are linear in the state, so the tangent
takes them exactly as the state does (``finish``). A cell takes the CPU cell's own matmuls
(``cell_gates``: ``[x, h_prev]·w``, one BLAS call), so every result's primal is bitwise the
CPU forward's, cell or sequence.

The second order runs the gradient's plan with a tangent beside every value: the saved
result's tangent from forward mode, per step the cell's backward kernel and its tangent
pass, the carry ``dZ_t·W_hᵀ`` and its tangent (``back_linear``), and after the loop ``dx``,
``dW`` and their tangents by the product rule (``product_grads``). Branches follow the
primals (relu' = [h > 0]; a clip's mask zeroes the tangent where it zeroes the gradient).
Scratch comes from ``_workspace.scratch``; results are fresh arrays; inputs are never
written.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._core.plan import flat, masked
from ._sequence import (
    Masks,
    contiguous,
    final_state,
    initial_carry,
    input_and_weight_grads,
    lengths_of,
    running_inputs,
    sequence_masks,
    upstream,
    zero_stopped,
    zoneout_split,
)


def tangent_or_zeros(tangent, primal):
    """A C-contiguous tangent: ``tangent``, or zeros of ``primal``'s shape and dtype."""
    return np.zeros_like(primal) if tangent is None else contiguous(tangent)


def optional(tangent):
    """A C-contiguous tangent, or None (a zero tangent whose products are left out)."""
    return None if tangent is None else contiguous(tangent)


class Linear(NamedTuple):
    """The tangent of ``a·w`` along ``(t_a, t_w)``: ``t_a·w + a·t_w``, each term left out when
    its tangent is None (``t_a``: a per-call array; ``w``, ``t_w`` fixed for the call).
    ``stacked_w``: ``[w; t_w]`` when both terms can be there (one BLAS call, K doubled)."""

    w: np.ndarray
    t_w: np.ndarray | None
    stacked_w: np.ndarray | None

    @classmethod
    def of(cls, w, t_w):
        w = contiguous(w)
        t_w = optional(t_w)
        return cls(w, t_w, None if t_w is None else np.concatenate((w, t_w)))

    def stacks(self):
        """Whether ``into`` may stack ``[t_a, a]`` (both terms can be there)."""
        return self.t_w is not None

    def into(self, t_a, a, out, stack):
        """``out = t_a·w + a·t_w`` (``t_a`` None: ``a·t_w``; both None: zeros); ``stack``: a
        ``[rows, 2K]`` scratch for ``[t_a, a]`` (read only when both terms are there)."""
        if self.t_w is None:
            if t_a is None:
                out[...] = 0
            else:
                np.matmul(t_a, self.w, out=out)
        elif t_a is None:
            np.matmul(a, self.t_w, out=out)
        else:
            k = t_a.shape[1]
            stack[:, :k] = t_a
            stack[:, k:] = a
            np.matmul(stack, self.stacked_w, out=out)
        return out


def input_tangent(linear, t_x, x, t_bias, out, stack):
    """``t_x·W_x + x·t_W_x (+ t_b)`` for every step at once into ``out [T, B, N]`` (``stack``:
    a ``[T·B, 2I]`` scratch, or an empty one when ``linear`` needs none)."""
    linear.into(None if t_x is None else flat(t_x), flat(x), flat(out), stack)
    if t_bias is not None:
        out += t_bias
    return out


def stack_shape(linear, rows):
    """The scratch shape of ``linear``'s stacked operand ``[da, a]`` for ``rows`` rows."""
    return (rows, linear.stacked_w.shape[0]) if linear.stacks() else (0, 0)


def step_pair(t, first, steps):
    """The state (or tangent) a step starts from: ``first`` at step 0, else ``steps[t-1]``."""
    return first if t == 0 else steps[t - 1]


def finish(steps, t_steps, first, t_first, lengths):
    """The final state and tangent (``final_state``), then the stopped rows zeroed."""
    final, t_final = final_state(steps[-1], first, lengths), final_state(t_steps[-1], t_first,
                                                                        lengths)
    zero_stopped((*steps, *t_steps), lengths)
    return final, t_final


class Inputs(NamedTuple):
    """A sequence's inputs as the loops take them: the masked running ``x`` and its tangent
    (None: zero), the lengths and the masks."""

    x: np.ndarray
    t_x: np.ndarray | None
    lengths: np.ndarray | None
    masks: Masks


def sequence_inputs(x, t_x, settings, width, n_hidden=0):
    """``Inputs`` of a sequence (a cell's settings: no masks or lengths)."""
    x = contiguous(x)
    t_x = optional(t_x)
    n_steps, n_batch = x.shape[:2]
    lengths = lengths_of(settings.seq_len)
    masks = sequence_masks(settings, n_steps, lengths, n_batch, width, n_hidden)
    def run(a):
        return running_inputs(masked(a, masks.input), lengths)
    return Inputs(run(x), None if t_x is None else run(t_x), lengths, masks)


def cell_gates(x, h_prev, w, tangent):
    """``[x, h_prev]·w`` as the CPU cell computes it (``np.dot``) and its tangent
    ``[t_x, t_h_prev]·w + [x, h_prev]·t_w`` (one stacked BLAS call; ``tangent = (t_x, t_h_prev,
    t_w)``, None fields zero)."""
    t_x, t_h_prev, t_w = tangent
    xh = np.concatenate((x, h_prev), axis=1)
    gates = np.dot(xh, w)
    t_xh = np.concatenate((tangent_or_zeros(t_x, x), tangent_or_zeros(t_h_prev, h_prev)), axis=1)
    linear = Linear.of(w, t_w)
    stack = np.empty(stack_shape(linear, xh.shape[0]), gates.dtype)
    return gates, linear.into(t_xh, xh, np.empty_like(gates), stack)


def cell_linear(w, t_w, t_a, a):
    """``t_a·w + a·t_w`` for one cell step (``Linear``), a fresh array."""
    linear = Linear.of(w, t_w)
    out = np.empty((a.shape[0], linear.w.shape[1]), a.dtype)
    return linear.into(t_a, a, out, np.empty(stack_shape(linear, a.shape[0]), a.dtype))


def upstream_pair(gradient, tangent):
    """An upstream gradient and its tangent, each C-contiguous or None (zero)."""
    return (None if gradient is None else contiguous(gradient),
            None if tangent is None else contiguous(tangent))


def carry_pair(final, t_final, shape, dtype):
    """The carried state gradient and its tangent before the backward loop
    (``initial_carry`` of each)."""
    return initial_carry(final, shape, dtype), initial_carry(t_final, shape, dtype)


def back_linear(w_h, t_w_h):
    """``Linear`` of the carried gradient's matmul: ``[W_hᵀ; t_W_hᵀ]`` (C-contiguous)."""
    return Linear.of(np.ascontiguousarray(w_h.T), None if t_w_h is None else t_w_h.T)


def sequence_of_one(x, h_prev, state, tangents, d_h, d_h_tangent):
    """A cell's arguments as a sequence of one step's: ``(x [1, B, I], h0, the result's
    fields (``state.h`` also the final state), the tangents' fields, the upstreams
    (d_h, d_h_final, d_h_tangent, d_h_final_tangent))``, each step array with a time
    axis."""
    def step(a):
        return None if a is None else a[None]

    return (x[None], h_prev, (*map(step, state), state.h), tangents._replace(x=step(tangents.x)),
            (step(d_h), None, step(d_h_tangent), None))


def product_grads(walk, primal, tangent, d_parts):
    """``(dx, dw)`` and their tangents from the gradients of the matmuls' outputs:
    ``primal = (x, h0_seen, w, h_seen)`` and ``tangent`` its tangents (arrays),
    ``d_parts = (dZ, dZ')``, each an array or a pair ``(dZ_x, dZ_h)`` (the gradients of
    ``x·W_x`` and ``h_prev·W_h`` where they differ); the tangents by the product rule,
    ``input_and_weight_grads`` on ``(x, W, dZ')`` plus on ``(x', W', dZ)``."""
    d_z, t_z = (p if isinstance(p, tuple) else (p,) for p in d_parts)
    dx, dw = input_and_weight_grads(walk, *primal, *d_z)
    tx, tw = input_and_weight_grads(walk, *primal, *t_z)
    tx2, tw2 = input_and_weight_grads(walk, *tangent, *d_z)
    return (dx, dw), (tx + tx2, tw + tw2)


def state_step(zoneout, t, carried, d_steps, stopped, buffers):
    """The gradient of step t's new state (``upstream``) split by zoneout
    (``zoneout_split``): ``(to the step's kernel, to the old state or None)``; ``buffers``:
    two ``[B, N]`` scratch arrays."""
    total = upstream(carried, d_steps, t, buffers[0], stopped)
    return zoneout_split(zoneout, t, total, buffers[0], buffers[1])

def recurrent_product(walk, h0, h, w):
    """``h_prev·w`` for every step (``Walk.recurrent_projection``), a fresh array."""
    out = np.zeros((*h.shape[:2], w.shape[1]), h.dtype)
    walk.recurrent_projection(h0, h, w, out)
    return out
