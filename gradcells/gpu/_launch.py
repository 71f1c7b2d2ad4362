"""What the GPU backend's cells share: the runtime they run on, kernel launches, helpers.

The operations (each cell's ``gpu.py``, ``gradcells/cells/<cell>/``) are written against a
runtime: ``rt.xp`` (the array namespace), ``rt.policy`` (launch shapes), ``rt.device_of(a)``
(a context making ``a``'s device the current one) and ``rt.launch(binding, grid, block,
args)`` (a ``_kernels.Binding`` and the argument tuple it built). On the GPU the runtime is
CuPy with the kernels compiled by NVRTC (``_runtime.CupyRuntime``), created, and CuPy
imported, on the first call. The host emulation (``tests/cuda_host``) installs its own with
``use_runtime``: NumPy with the same kernel source compiled for the CPU, so every line of the
operations (the matmul plan, the step loops, the kernel arguments) runs in CI without a GPU.

The sequence masks (docs/spec.md §11.3) reach the kernels through ``sequence_mask`` (each
materialised once per call) and ``at_step`` (step t's ``[B, W]`` slice, or the placeholder).

Bias and peephole gradients are column sums (``column_sum``: the ``column_sum`` kernel,
deterministic, accumulating in the arithmetic type, in one pass or two).
"""

from __future__ import annotations

from .._core import plan
from . import _kernels
from ._runtime import CupyRuntime

_active = None
"""The runtime the operations run on: None until the first call creates CuPy's."""


def runtime():
    """The runtime the operations run on (CuPy's, created on first use, unless another was
    installed with ``use_runtime``)."""
    global _active
    if _active is None:
        _active = CupyRuntime()
    return _active


def use_runtime(rt):
    """Make ``rt`` the runtime of every operation (None: CuPy's again, created on next use);
    returns the one it replaces, so that a caller can put it back."""
    global _active
    previous, _active = _active, rt
    return previous


def runtime_on(x):
    """The runtime and the context that makes ``x``'s device the current one for the call."""
    rt = runtime()
    return rt, rt.device_of(x)


class Launcher:
    """One kernel, launched over ``n`` elements once per step: the binding, the launch shape
    and the arguments that stay the same from step to step are settled once."""

    def __init__(self, rt, name, dtype, n, **fixed):
        self.rt = rt
        self.binding = _kernels.binding(_kernels.KERNELS[name], (dtype,))
        self.shape = _kernels.elementwise_shape(n, rt.policy) if n else None
        self.values = fixed

    def __call__(self, **changing):
        if self.shape is None:  # nothing to do (and a grid of 0 blocks is an error)
            return
        self.values.update(changing)
        self.rt.launch(self.binding, *self.shape, self.binding.arguments(self.values))


def column_sum(rt, a):
    """Σ over the rows of a C-contiguous ``[rows, cols]`` array, as ``[cols]``."""
    xp = rt.xp
    rows, cols = a.shape
    dtype = a.dtype
    out = xp.empty(cols, dtype=dtype)
    if cols == 0:
        return out
    kernel = _kernels.KERNELS["column_sum"]
    parts, rows_per_part = _kernels.column_sum_plan(rows, cols, rt.policy)
    if parts == 1:
        passes = [(a, rows, rows_per_part, out)]
    else:
        partial = xp.empty((parts, cols), dtype=_kernels.COMPUTE_DTYPE[dtype])
        passes = [(a, rows, rows_per_part, partial), (partial, parts, parts, out)]
    for source, n_rows, per_part, target in passes:
        n_parts = 1 if target is out else parts
        grid, block = _kernels.column_sum_shape(cols, n_parts, rt.policy)
        binding = _kernels.binding(kernel, (source.dtype, target.dtype))
        rt.launch(binding, grid, block, binding.arguments(
            {"in": source, "rows": n_rows, "cols": cols, "rows_per_part": per_part,
             "parts": n_parts, "out": target}))
    return out


def gated_scan(rt, z, c, s0, lengths, *, gated, post, backward):
    """One ``gated_scan`` launch (``gradcells/gpu/scan.cu``), the minGRU's and the minLSTM's
    recurrence with the gate ``z`` (multiplier ``1 - z``; ``gated``: addend ``z∘c``, else
    ``c``): ``(out [T, B, H], s_final [B, H])``; ``post``, ``backward`` as the kernel's."""
    xp = rt.xp
    n_steps, n_batch, n_hidden = z.shape
    out, final = xp.empty_like(z), xp.empty((n_batch, n_hidden), dtype=z.dtype)
    Launcher(rt, "gated_scan", z.dtype, n_batch * n_hidden)(
        z=z, c=c, s0=xp.ascontiguousarray(s0, dtype=z.dtype),
        seq_len=lengths_argument(xp, lengths), use_seq_len=lengths is not None,
        use_gated=gated, use_post=post, use_backward=backward, n_steps=n_steps,
        batch=n_batch, hidden=n_hidden, out=out, s_final=final)
    return out, final


def contiguous(xp, a):
    """``a`` as a C-contiguous array (None stays None)."""
    return None if a is None else xp.ascontiguousarray(a)


def matmul(xp, a, b):
    """``a·b`` as a C-contiguous array (kernels index it densely)."""
    return xp.ascontiguousarray(a @ b)


def lengths(xp, seq_len):
    """``seq_len`` as a contiguous int32 array on the device, or None."""
    return None if seq_len is None else xp.ascontiguousarray(xp.asarray(seq_len), dtype=xp.int32)


def lengths_argument(xp, lengths):
    """The kernels' ``seq_len`` argument: the lengths, or an empty int32 array without."""
    return xp.empty(0, dtype=xp.int32) if lengths is None else lengths


def previous(xp, first, steps):
    """``[first, steps[0], ..., steps[T-2]]`` as a contiguous ``[T, B, H]`` array."""
    if steps.shape[0] == 0:
        return xp.empty_like(steps)
    if steps.shape[0] == 1:
        return xp.ascontiguousarray(first)[None]
    return xp.concatenate([first[None], steps[:-1]], axis=0)


def row_stride(a):
    """Row stride, in elements, of a 2-D view with unit column stride."""
    return a.strides[0] // a.itemsize if a.shape[0] > 1 else a.shape[1]


def sequence_mask(xp, mask, shape):
    """A sequence's mask as the kernels read it, materialised once per call (``shape`` is
    ``(T, B, W)``, what the mask broadcasts to): a C-contiguous ``[T, B, W]`` array when it
    has a time axis of T != 1, else ``[B, W]``, the same at every step; None stays None."""
    if mask is None:
        return None
    if mask.ndim == 3 and mask.shape[0] != 1:
        return xp.ascontiguousarray(xp.broadcast_to(mask, shape))
    return xp.ascontiguousarray(xp.broadcast_to(mask if mask.ndim < 3 else mask[0], shape[1:]))


def at_step(mask, t, placeholder):
    """The kernels' argument for step t of a ``sequence_mask``: its ``[B, W]`` slice (C-
    contiguous), or ``placeholder`` (any array of the dtype; never read) without a mask."""
    return placeholder if mask is None else plan.at_step(mask, t)
