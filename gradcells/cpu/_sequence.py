"""The NumPy plumbing of the CPU sequence ops (each cell's ``cpu.py``): the matmul plan of
``gradcells.reference``'s sequences with BLAS for the matmuls and the fused cell kernels for
each step's elementwise work.

- forward: the input projection ``x_flat·W_x + b`` of all steps first (one matmul per
  weight block), then per step ``h_prev·W_h`` and the cell kernel, which takes the step's
  slice of the projection as its per-row addend and writes the step's outputs in place;
- backward: per step (``Walk.back_times()``) the cell's backward kernel writes the step's
  gate gradients into ``[T, B, ·]`` arrays (and accumulates the bias and peephole sums),
  then ``dG_t·W_hᵀ`` gives the gradient of the previous state, with ``W_hᵀ`` copied
  C-contiguous once per call (OpenBLAS packs a contiguous operand about 10% faster at these
  shapes); after the loop ``dx``, ``dW_x`` and ``dW_h`` are large matmuls over all ``T·B``
  rows, written straight into their outputs.

Scratch (the projections, every step's gate gradients, the per-step buffers) comes from the
calling thread's reusable buffer (``_workspace``); results are always fresh arrays.

Per-example lengths: a row that runs step t ran every step before it, so every step starts
from the previous step's outputs and no state buffers are needed. Rows past their length
are computed as if they ran on and zeroed after the loop; their final state is gathered
from step ``L-1`` before that. Backwards, a stopped row gets zero upstream gradient (its
outputs are constants), so its gate gradients are zero, and keeps its state gradient.
Steps before the shortest length take the unmasked path.

The time order (``Walk``; docs/spec.md §11.1): with ``settings.reverse`` the sequence runs
natively, every per-step array at its time position (``gradcells.cpu.NATIVE_REVERSE``):
row b runs t = L_b-1 down to 0. The loops are the forward direction's with the iteration
order flipped and each step's previous state step t+1's, the rows not yet started holding
the initial state (``Walk.hold``); the positions t >= L_b are the same stopped positions in
both directions, so the zeroing, the upstream gradients and the masks past each row's
length are shared. The whole-array products of the previous states are ``Walk``'s.

The masks (docs/spec.md §11.3; ``sequence_masks``) are NumPy ops and one small kernel around
the cell kernels, which know nothing of them:

- the input mask: one whole-array multiply of ``x`` before the projection and one of ``dx``
  after the weight gradients;
- the recurrent mask: per step ``h_prev∘m_rec`` into a scratch ``[B, H']`` before the
  recurrent matmul (the kernels read the unmasked state); backwards, the matmul's part of
  the state gradient is multiplied by it in place, and the weight gradients and any
  recomputed ``h_prev·W`` read the masked states (``seen_states``, one whole-array
  multiply);
- zoneout: per step ``z∘old + (1-z)∘new`` in place over the kernel's new state (``zone``,
  one fused pass, ``_zoneout_kernels``); backwards the state gradient splits into
  ``(1-z)∘g`` for the step's kernel and ``z∘g`` (``zoneout_split``, one pass), added to the
  old state's gradient (``finish_state_grad``). ``z`` is laid out once per call as a
  C-contiguous ``[T or 1, B, N]`` array (a copy only when it is not one already).

With lengths, every mask with a time axis is first replaced by one that is zero past each
row's length (``np.where``), so such entries, NaN included, are never read.

Their memory: the per-step ``[B, ·]`` buffers (the masked ``h_prev``, zoneout's part for
the old state) come with each op's scratch; the whole-array products (``x∘m_in``, the
masked saved states of ``seen_states``, a zeroed or laid-out mask) are fresh arrays of an
input's or a result's size, made once per call.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from .._core.plan import at_step, flat, running_mask
from .._core.plan import running_inputs as _running_inputs
from ._compile import kernel_array
from ._walk_kernels import initial_rows_kernel
from ._zoneout_kernels import zoneout_grad_kernel, zoneout_kernel


def contiguous(a):
    """``a`` as a kernel takes it (``kernel_array``): C-contiguous, aligned and writeable,
    copied when it is not, so that a kernel compiles one signature per dtype (a read-only or
    Fortran-ordered array would type as another and compile again)."""
    return kernel_array(a)


def given_or_empty(arrays, dtype):
    """Optional per-step arrays (a cell's gates' upstream gradients ``[T, B, H]``) as the
    kernels take them: each ``contiguous``, or an empty ``[0, 0, 0]`` array of ``dtype``
    where not given (the kernel then reads none of it)."""
    return tuple(np.empty((0, 0, 0), dtype) if a is None else contiguous(a) for a in arrays)


def lengths_of(seq_len):
    """The lengths as ``int64 [B]`` (``contiguous``), or None when every row runs all T
    steps."""
    return None if seq_len is None else contiguous(np.asarray(seq_len, dtype=np.int64))


def kernel_lengths(lengths):
    """``lengths`` as a kernel takes them: ``int64 [B]`` (``contiguous``), or an empty array
    for None (every row runs all T steps)."""
    return _NO_LENGTHS if lengths is None else contiguous(lengths)


_NO_LENGTHS = np.empty(0, np.int64)


def running_inputs(x, lengths):
    """``x`` with every step past its row's length zeroed in ``x``'s dtype (``x`` itself
    without lengths): ``gradcells._core.plan.running_inputs`` on NumPy."""
    return _running_inputs(np, x, lengths)


def projection(x, w_x, b, out):
    """``x_flat·W_x (+ b)`` for all steps at once, into ``out [T, B, width]``."""
    np.matmul(flat(x), w_x, out=flat(out))
    if b is not None:
        out += b


def projection_of(x, w_x, b):
    """``x_flat·w_x + b`` as a fresh ``[T, B, width]``."""
    out = np.empty((x.shape[0], x.shape[1], w_x.shape[1]), x.dtype)
    projection(x, w_x, contiguous(b), out)
    return out


def input_tangent(x, weights, tangents, lengths):
    """The tangent of ``x_flat·w + b`` over all steps, ``dx·w + x·dw + db`` (None fields
    zero), for the running inputs ``x`` and a weight set ``(w, b)``: the gate
    pre-activations' tangent of a cell whose gates read ``x`` alone."""
    dp = np.zeros((*x.shape[:2], weights.w.shape[1]), x.dtype)
    if tangents.x is not None:
        dp += projection_of(running_inputs(contiguous(tangents.x), lengths), weights.w,
                            np.zeros_like(weights.b))
    if tangents.w is not None:
        dp += projection_of(x, tangents.w, np.zeros_like(weights.b))
    if tangents.b is not None:
        dp += tangents.b
    return dp


def step_outputs(count, shape, dtype):
    """``count`` new ``[T, B, H]`` arrays for a sequence's per-step outputs, as views of one
    block: NumPy asks the kernel for huge pages for allocations of 4 MiB and more, and one
    large block then costs a few hundred page faults where seven separate arrays of a few
    MiB cost thousands (measured: 2.9 ms against 17 ms to allocate and fill 7·[100, 32, 256]
    float32)."""
    return list(np.empty((count, *shape), dtype))


def input_and_weight_grads(walk, x, h0, w, h, d_x_part, d_h_part=None):
    """``dx = dZx·W_xᵀ`` and ``dw = [x_flatᵀ·dZx; h_prev_flatᵀ·dZh]`` over all ``T·B`` rows,
    ``h_prev`` each step's previous state in ``walk``'s order (``Walk.previous_rows_grad``):
    ``dZx`` and ``dZh`` the gradients of ``x·W_x`` and ``h_prev·W_h`` (one array,
    ``d_h_part`` None, when they are the same, as without a layer norm)."""
    n_steps, n_batch, n_in = x.shape
    d_flat = flat(d_x_part)
    dx = (d_flat @ w[:n_in].T).reshape(n_steps, n_batch, n_in)
    dw = np.empty_like(w)
    np.matmul(flat(x).T, d_flat, out=dw[:n_in])
    walk.previous_rows_grad(h0, h, d_x_part if d_h_part is None else d_h_part, out=dw[n_in:])
    return dx, dw


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


# --------------------------------------------------------------------------------------
# the time order (docs/spec.md §11.1)


class Walk:
    """The order a sequence's rows run their steps in, and the state each step starts from.

    Forward (``reverse`` False): every row runs t = 0, 1, ..., and step t starts from step
    t-1's state (the initial state at t = 0). Reverse: row b runs t = L_b-1 down to 0, and
    step t starts from step t+1's state where t+1 < L_b, else (its first step, t = L_b-1)
    from the initial state; the final state is step 0's (the initial state when L_b = 0).

    The forward loop walks ``times()``, computing every row as if it ran. In reverse,
    ``hold`` then copies the initial states into step t's states in the rows that have not
    started (t >= L_b), so that the next, earlier step reads the initial state there; the
    positions t >= L_b are the forward direction's stopped ones, zeroed after the loop
    (``zero_stopped``). The backward loop walks ``back_times()``; in either direction the
    rows with t >= L_b are ``stopped_rows`` (no gate gradients, the carry passes through).

    The whole-array products of the previous states (``previous_rows_grad``,
    ``recurrent_projection``, ``add_previous_product``) are one shifted product over the
    saved steps plus the initial state's part at each row's first step (``starts``). In
    reverse with lengths they read the saved states' zeros past each row's length (a
    sequence result's, docs/spec.md §11.1): ``steps[t+1]`` there contributes nothing at the
    row's first step, whose previous is the initial state.
    """

    def __init__(self, n_steps, lengths, reverse):
        self.n_steps, self.lengths, self.reverse = n_steps, lengths, reverse
        self.first = n_steps - 1 if reverse else 0   # every row's first step, ...
        self.starts = None                           # ... or (times [B'], rows [B'])
        if reverse and lengths is not None and lengths.min(initial=n_steps) < n_steps:
            self.lengths, self.shortest = np.ascontiguousarray(lengths), int(lengths.min())
            rows = np.flatnonzero(lengths > 0)
            self.starts = (lengths[rows] - 1, rows)
        # (previous, later): steps[previous] are the states the steps[later] start from
        self.shift = (slice(1, None), slice(None, -1)) if reverse else (slice(None, -1),
                                                                        slice(1, None))

    @functools.cached_property
    def starting(self):
        """The steps some row starts at, in reverse with lengths (a set; empty otherwise)."""
        return set() if self.starts is None else set(self.starts[0].tolist())

    def times(self):
        """The forward loop's steps, in run order."""
        return range(self.n_steps - 1, -1, -1) if self.reverse else range(self.n_steps)

    def back_times(self):
        """The backward loop's steps: run order reversed."""
        return range(self.n_steps) if self.reverse else range(self.n_steps - 1, -1, -1)

    def previous(self, steps, first, t):
        """The forward loop's state step t starts from (``first``: the initial state),
        ``hold`` having run after every earlier step."""
        if t == self.first:
            return first
        return steps[t + 1 if self.reverse else t - 1]

    def hold(self, t, *pairs):
        """After the forward loop's step t, each ``(steps, first)`` of ``pairs``: in reverse,
        ``steps[t] ← first`` in the rows that have not started (t >= L_b;
        ``initial_rows_kernel``)."""
        if self.starts is not None and t >= self.shortest:
            for steps, first in pairs:
                initial_rows_kernel(self.lengths, t, first, steps[t], steps[t])

    def final(self, steps, first):
        """Each row's final state (a fresh array), taken after the forward loop and before
        ``zero_stopped``: forward ``final_state``, reverse ``steps[0]`` (where ``hold``
        left the initial state in the rows with L_b = 0)."""
        if not self.reverse:
            return final_state(steps, first, self.lengths)
        return first.copy() if 0 in steps.shape[:2] else steps[0].copy()

    def previous_of_step(self, steps, first, t, out):
        """The backward loop's state step t started from, from the saved ``steps``:
        ``previous``'s, in reverse ``steps[t+1]`` with the initial state in the rows whose
        first step is t, into ``out`` (``steps[t+1]`` itself when there are none; the rows
        stopped at t, whose gradients are zero, get the initial state too)."""
        state = self.previous(steps, first, t)
        if state is first or t not in self.starting:
            return state
        initial_rows_kernel(self.lengths, t + 1, first, state, out)
        return out

    def _at_starts(self, first, steps):
        """``(first's rows, steps at those rows' first steps)``, the rows that start from
        ``first``: every row at ``self.first``, or ``starts``'s."""
        if self.starts is None:
            return first, steps[self.first]
        times, rows = self.starts
        return first[rows], steps[times, rows]

    def previous_rows_grad(self, first, steps, d_steps, out=None):
        """``h_prevᵀ·dG`` over all steps without stacking the states: the shifted
        ``steps[previous]_flatᵀ·dG[later]_flat`` plus ``firstᵀ·dG`` at each row's first
        step (into ``out``, a ``[H, width]`` array, when given)."""
        n_steps, n_batch, n_hidden = steps.shape
        if out is None:
            out = np.empty((n_hidden, d_steps.shape[2]), steps.dtype)
        if n_steps == 0 or n_batch == 0:
            out[...] = 0
            return out
        previous, later = self.shift
        np.matmul(flat(steps[previous]).T, flat(d_steps[later]), out=out)
        first_rows, d_first = self._at_starts(first, d_steps)
        out += first_rows.T @ d_first
        return out

    def recurrent_projection(self, first, steps, w, out):
        """``h_prev·W`` for every step at once (two matmuls and, in reverse with lengths,
        a row scatter of ``first·W``), into ``out [T, B, ·]``."""
        n_steps, n_batch = steps.shape[:2]
        if n_steps == 0 or n_batch == 0:
            return
        previous, later = self.shift
        np.matmul(flat(steps[previous]), w, out=flat(out[later]))
        np.matmul(first, w, out=out[self.first])
        if self.starts is not None:
            times, rows = self.starts
            out[times, rows] = out[self.first][rows]

    def add_previous_product(self, f, first, steps, out):
        """``out += f∘s_prev`` for every step, ``s_prev`` the state the step started from
        (``steps`` the saved states, ``first`` the initial one)."""
        previous, later = self.shift
        out[later] += f[later] * steps[previous]
        if self.starts is None:
            out[self.first] += f[self.first] * first
        else:
            times, rows = self.starts
            out[times, rows] += f[times, rows] * first[rows]


# --------------------------------------------------------------------------------------
# the masks (docs/spec.md §11.3)


class Masks(NamedTuple):
    """A sequence's masks as the CPU loops take them (``sequence_masks``): None, or arrays
    that broadcast to their shapes; each zoneout C-contiguous ``[T or 1, B, N]``."""

    input: Any = None          # m_in, broadcasting to [T, B, I]
    recurrent: Any = None      # m_rec, broadcasting to [B, H']
    zoneout_h: Any = None      # z of [T, B, H']
    zoneout_cs: Any = None     # z of [T, B, H] (the LSTM's)


def sequence_masks(settings, n_steps, lengths, n_batch, width, n_hidden=0):
    """The masks of ``settings`` (``input_mask``, ``recurrent_mask``, ``zoneout_h``, the
    LSTM's ``zoneout_cs``) for a sequence of ``n_steps`` over ``n_batch`` rows, states
    ``width`` (H') and ``n_hidden`` (the LSTM's H) wide. With ``lengths``, a mask with a time
    axis is zero past each row's length (``np.where``: what was there is never read)."""

    def unread_past_lengths(mask):
        if mask is None or lengths is None or mask.ndim < 3:
            return mask
        running = running_mask(np, n_steps, lengths)[:, :, None]
        return np.where(running, mask, np.zeros((), mask.dtype))

    def zoneout(mask, n):
        if mask is None:
            return None
        mask = unread_past_lengths(mask)
        steps = mask.shape[0] if mask.ndim == 3 else 1
        return contiguous(np.broadcast_to(mask, (steps, n_batch, n)))

    return Masks(unread_past_lengths(settings.input_mask), settings.recurrent_mask,
                 zoneout(settings.zoneout_h, width),
                 zoneout(getattr(settings, "zoneout_cs", None), n_hidden))


def masked_input_grad(dx, mask):
    """``dx∘m_in`` in place (``dx`` a fresh array; nothing without a mask)."""
    if mask is not None:
        np.multiply(dx, mask, out=dx)
    return dx


def seen(h_prev, mask, out):
    """What the recurrent matmul reads: ``h_prev∘m_rec`` into ``out``, or ``h_prev``."""
    return h_prev if mask is None else np.multiply(h_prev, mask, out=out)


def seen_states(h0, steps, mask):
    """``(h0, steps)`` as the recurrent matmuls saw them, ``∘m_rec`` (one multiply each;
    themselves without a mask): every ``h_prev`` of the gradient's matmuls."""
    if mask is None:
        return h0, steps
    return np.multiply(h0, mask), np.multiply(steps, mask)


def zone(zoneout, t, old, new):
    """Zoneout at step t in place: ``new ← z_t∘old + (1-z_t)∘new`` (``plan.zoned``'s
    expression, ``zoneout_kernel``; nothing without it)."""
    if zoneout is not None:
        zoneout_kernel(at_step(zoneout, t), old, new)


def zoneout_split(zoneout, t, grad, new_out, old_out):
    """The two parts of the gradient ``grad`` of step t's zoned state (``plan.zoneout_grad``,
    ``zoneout_grad_kernel``): ``((1-z_t)∘grad, z_t∘grad)`` into ``new_out`` and ``old_out``
    (``new_out`` may be ``grad``); ``(grad, None)`` without zoneout."""
    if zoneout is None:
        return grad, None
    zoneout_grad_kernel(at_step(zoneout, t), grad, new_out, old_out)
    return new_out, old_out


def finish_state_grad(out, mask, old):
    """The previous state's gradient from its recurrent matmul's part ``out`` (in place):
    ``out∘m_rec``, plus the zoned state's ``old`` part (each when there)."""
    if mask is not None:
        np.multiply(out, mask, out=out)
    if old is not None:
        out += old
    return out
