"""What every cell's forward mode and second order on the GPU share (docs/spec.md §12).

Forward mode runs the forward's own plan with a tangent beside every value: the tangent's
matmuls are cuBLAS ones, the input part ``t_x·W_x + x·t_W_x + t_b`` of all steps at once
(``input_tangent``; the input mask and the zeroed inputs past a row's length applied to
``t_x`` as to ``x``: ``running``), and per step ``t_h·W_h + h·t_W_h`` (``recurrent_tangent``,
both states through the recurrent mask). The second order runs the backward's plan the same
way, by the product rule; an upstream gradient and its tangent travel as a pair
(``upstream_pair``). A None tangent is zero: its matmul terms are left out, or it is
zeros where a kernel needs an array (``zeros_or``, ``zeros_filled``). The cells' own parts
are in their ``gpu.py`` (``gradcells/cells/<cell>/``).
"""

from __future__ import annotations

from .._core import plan
from ._launch import matmul


def zeros_or(xp, tangent, like):
    """``tangent`` as a C-contiguous array, or zeros shaped as ``like``."""
    return xp.zeros_like(like, order="C") if tangent is None else xp.ascontiguousarray(tangent)


def state_buffers(xp, state, tangent, lengths):
    """The carried state and its tangent as C-contiguous arrays: copies with lengths (the
    kernels update them in the rows still running), else the inputs themselves."""
    if lengths is None:
        return xp.ascontiguousarray(state), zeros_or(xp, tangent, state)
    return (state.copy(order="C"),
            xp.zeros_like(state, order="C") if tangent is None else tangent.copy(order="C"))


def input_tangent(xp, x, t_x, w_x, t_w_x, t_b, width):
    """``t_x·W_x + x·t_W_x + t_b`` of every step, ``[T, B, width]`` (C-contiguous); ``x`` and
    ``t_x`` as the input matmul sees them, None terms left out."""
    n_steps, n_batch, _ = x.shape
    out = xp.zeros((n_steps * n_batch, width), dtype=x.dtype)
    if t_x is not None:
        out += plan.flat(t_x) @ w_x
    if t_w_x is not None:
        out += plan.flat(x) @ t_w_x
    if t_b is not None:
        out += t_b
    return out.reshape(n_steps, n_batch, width)


def recurrent_tangent(xp, h, t_h, w_h, t_w_h):
    """``t_h·W_h + h·t_W_h`` (C-contiguous), the states as the matmul sees them."""
    out = matmul(xp, t_h, w_h)
    if t_w_h is not None:
        out += h @ t_w_h
    return out


def running(xp, a, settings, lengths):
    """An input (or its tangent) as the matmul sees it: masked, zero past the lengths."""
    return None if a is None else plan.running_inputs(
        xp, plan.masked(a, settings.input_mask), lengths)


def split_rows(a, n_in):
    """``(a[:n_in], a[n_in:])`` (a weight's x and h parts), or ``(None, None)`` for a zero
    tangent."""
    return (None, None) if a is None else (a[:n_in], a[n_in:])


def upstream_pair(xp, g, t_g, like):
    """An upstream gradient and its tangent as C-contiguous arrays, ``(None, None)`` when
    both are None, else zeros (shaped as ``like``) for the missing one."""
    if g is None and t_g is None:
        return None, None
    return zeros_or(xp, g, like), zeros_or(xp, t_g, like)


def zeros_filled(xp, tangents, primals):
    """``tangents`` with every None a zero tangent of its primal (None where the primal is;
    a NamedTuple field, such as an ``LSTMNorm``, field by field), C-contiguous."""
    def fill(t, p):
        if p is None:
            return None
        if hasattr(p, "_fields"):
            return type(p)(*(fill(a, b) for a, b in zip(t or (None,) * len(p), p,
                                                         strict=True)))
        return xp.zeros_like(p, order="C") if t is None else xp.ascontiguousarray(t)

    return type(tangents)(*(fill(t, p) for t, p in zip(tangents, primals, strict=True)))


def sum_pairs(a, b):
    """Field by field ``a + b`` of two tuples of arrays (None stays None)."""
    return [x if y is None else x + y for x, y in zip(a, b, strict=True)]
