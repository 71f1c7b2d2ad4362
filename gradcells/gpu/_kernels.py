"""The GPU kernels as the launches see them: names, template parameters, argument lists,
launch shapes, all read from the ``.cu`` files (``KERNELS``: each ``GC_KERNEL``'s signature
is written once, in its source; a cell's kernels are in its folder).

The backend launches a kernel through a ``Binding`` (``binding(kernel, dtypes)``): the name of
its entry point (generated here, ``entry_points``: an ``extern "C" __global__`` function per
instantiation, which CuPy's ``get_function`` and the host harness look up) and its argument
tuple, built from keyword values. The CuPy
runtime and the host-emulation harness (``tests/cuda_host``) receive the same bindings and
tuples (``tests/contracts/test_cuda_compile.py`` compiles every entry point), so the
emulation calls the kernels exactly as the GPU does. Nothing here
imports CuPy or touches a device.

Types in a parameter list: ``T`` is the storage type of the arrays (``float``, ``double`` or
``gc_half`` for float16), ``A`` the arithmetic type (``float`` for float16), ``TIn``/``TOut``
the input and output types of ``column_sum``. Scalars are passed as NumPy scalars of the
exact C type (``np.int32`` for ``int``, ``np.int64`` for ``long long``, ``np.float32`` or
``np.float64`` for ``A``); arrays as C-contiguous arrays of the exact dtype, except that an
array followed by ``long long ld_<name>`` may be a 2-D view with unit column stride and row
stride ``ld_<name>`` elements.

A kernel's ``optional`` parameters, named on a ``// gc-optional (zoneout): ...`` line above
its template, are the zoneout ones (docs/spec.md §11.3) and those only zoneout reads: a
launch may leave them out, and then runs without zoneout (its flags 0, its
mask and output arrays any array of the launch's, never read nor written).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from . import _sources

FLOAT16, FLOAT32, FLOAT64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
STORAGE_DTYPES = (FLOAT32, FLOAT64, FLOAT16)
C_TYPE = {FLOAT16: "gc_half", FLOAT32: "float", FLOAT64: "double"}
COMPUTE_DTYPE = {FLOAT16: FLOAT32, FLOAT32: FLOAT32, FLOAT64: FLOAT64}
INT32, INT64 = np.dtype(np.int32), np.dtype(np.int64)

# Options for NVRTC. No --use_fast_math: the activations must stay accurate and overflow-free.
# (CuPy itself appends -ftz=true, so float32 subnormal results flush to zero on the GPU.)
NVRTC_OPTIONS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Param:
    ctype: str  # as written in the .cu signature, e.g. "const T*", "long long"
    name: str

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def base(self) -> str:
        """The C type without const and pointer: "T", "A", "int", "long long", ..."""
        return self.ctype.replace("const ", "").rstrip("*").strip()


@dataclass(frozen=True)
class Kernel:
    name: str
    source: str
    template: tuple[str, ...]
    params: tuple[Param, ...]
    optional: frozenset[str] = frozenset()

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


def _params(text: str) -> tuple[Param, ...]:
    """Parse "const T* a, long long b, ..." into Params (the .cu spelling)."""
    params = []
    for declaration in text.split(","):
        words = declaration.split()
        name = words[-1]
        ctype = " ".join(words[:-1])
        params.append(Param(ctype, name))
    return tuple(params)


# A kernel's declaration in its .cu file: its "gc-optional" line, if any, its template line,
# its signature.
_DECLARATION = re.compile(
    r"^(?://[ \t]*gc-optional[^:\n]*:(?P<optional>[^\n]*)\n)?"
    r"template[ \t]*<(?P<template>[^\n]*)>[ \t]*\n"
    r"GC_KERNEL[ \t]+void[ \t]+(?P<name>\w+)\((?P<params>[^)]*)\)", re.MULTILINE)


def declared(source: str, text: str) -> tuple[Kernel, ...]:
    """The kernels the ``.cu`` text ``text`` (the file ``source``) declares: each
    ``GC_KERNEL`` template, its template parameters (those without a default: ``T``, or
    ``TIn, TOut``; ``A`` follows from ``T``), its parameters as written, and the names on
    the ``// gc-optional (...): ...`` line above it."""
    found = []
    for m in _DECLARATION.finditer(text):
        template = tuple(part.split()[-1] for part in m["template"].split(",")
                         if "=" not in part)
        found.append(Kernel(m["name"], source, template, _params(" ".join(m["params"].split())),
                            frozenset((m["optional"] or "").split())))
    return tuple(found)


KERNELS: dict[str, Kernel] = {k.name: k for source in _sources.KERNEL_FILES
                              for k in declared(source, _sources.read(source))}
"""Every kernel of every ``.cu`` file, by name: read from the sources, the one place each
signature is written."""


def template_dtypes(kernel: Kernel, dtypes) -> dict[str, np.dtype]:
    """The dtype each C type name of ``kernel`` stands for, given its template dtypes."""
    dtypes = tuple(np.dtype(d) for d in dtypes)
    if len(dtypes) != len(kernel.template):
        raise ValueError(f"{kernel.name} takes {len(kernel.template)} template dtypes, "
                         f"got {len(dtypes)}")
    for d in dtypes:
        if d not in C_TYPE:
            raise TypeError(f"{kernel.name}: no kernel for dtype {d}")
    bound = dict(zip(kernel.template, dtypes, strict=True))
    if kernel.template == ("T",):
        bound["A"] = COMPUTE_DTYPE[dtypes[0]]
    bound["int"] = INT32
    bound["long long"] = INT64
    return bound


def entry_name(kernel: Kernel, dtypes) -> str:
    """The name of one instantiation's entry point, e.g. ``lstm_forward__float`` or
    ``column_sum__gc_half__float`` (CuPy's ``get_function`` and the host harness look it up)."""
    bound = template_dtypes(kernel, dtypes)
    return "__".join((kernel.name, *(C_TYPE[bound[t]] for t in kernel.template)))


_TYPE_NAME = re.compile(r"\b(TIn|TOut|T|A)\b")


def entry_point(kernel: Kernel, dtypes) -> str:
    """The C text of one instantiation's entry point: an ``extern "C" __global__`` function
    with the kernel's parameters in concrete types that runs the ``GC_KERNEL`` template, e.g.
    ``__global__ void column_sum__float__double(const float* in, ..., double* out)
    { column_sum<float, double>(in, ..., out); }`` (inside an ``extern "C"`` block)."""
    bound = template_dtypes(kernel, dtypes)
    types = {name: C_TYPE[bound[name]] for name in (*kernel.template, "A") if name in bound}
    params = ", ".join(f"{_TYPE_NAME.sub(lambda m: types[m.group(1)], p.ctype)} {p.name}"
                       for p in kernel.params)
    template = ", ".join(types[t] for t in kernel.template)
    return (f"__global__ void {entry_name(kernel, dtypes)}({params})\n"
            f"{{ {kernel.name}<{template}>({', '.join(kernel.param_names)}); }}")


def column_sum_dtypes(dtype) -> tuple[tuple[np.dtype, np.dtype], ...]:
    """The (TIn, TOut) instantiations a storage dtype needs: one-pass (T, T) and two-pass
    (T, A) then (A, T)."""
    dtype = np.dtype(dtype)
    compute = COMPUTE_DTYPE[dtype]
    pairs = [(dtype, dtype), (dtype, compute), (compute, dtype)]
    return tuple(dict.fromkeys(pairs))


def instantiations(source: str) -> tuple[tuple[Kernel, tuple[np.dtype, ...]], ...]:
    """Every (kernel, template dtypes) that the source file ``source`` is compiled for."""
    found = []
    for kernel in KERNELS.values():
        if kernel.source != source:
            continue
        if kernel.template == ("T",):
            found += [(kernel, (d,)) for d in STORAGE_DTYPES]
        else:
            pairs = dict.fromkeys(p for d in STORAGE_DTYPES for p in column_sum_dtypes(d))
            found += [(kernel, pair) for pair in pairs]
    return tuple(found)


def source_entries(source: str) -> tuple[str, ...]:
    """The names of the entry points ``source`` is compiled with (every dtype)."""
    return tuple(entry_name(k, d) for k, d in instantiations(source))


def entry_points(source: str) -> str:
    """The generated entry points of ``source``'s kernels, for every dtype, as C text to be
    compiled after the source (``module_code``)."""
    points = "\n".join(entry_point(k, d) for k, d in instantiations(source))
    return f'extern "C" {{\n{points}\n}}\n'


def module_code(name: str) -> str:
    """The text one ``.cu`` file is compiled from: ``_sources.compose(name)`` and its entry
    points. Every consumer compiles this one self-contained string: NVRTC through CuPy
    (whose disk cache is keyed by it and the options), ``nvcc --ptx`` in the compile test,
    and the host C++ compiler in the emulation tests."""
    return (f"{_sources.compose(name)}\n// ---- entry points, generated by "
            f"gradcells.gpu._kernels\n{entry_points(name)}")


class Binding:
    """One instantiation of a kernel (``binding(kernel, dtypes)``): its entry point and
    the checks and conversions that turn keyword values into its argument tuple."""

    def __init__(self, kernel: Kernel, dtypes):
        bound = template_dtypes(kernel, dtypes)
        self.kernel = kernel
        self.dtypes = tuple(bound[t] for t in kernel.template)
        self.entry = entry_name(kernel, dtypes)
        names = set(kernel.param_names)
        self._plan = []  # (name, array dtype or None, scalar type, (lo, hi) or None, ld name)
        for param in kernel.params:
            expected = bound[param.base]
            ld = f"ld_{param.name}" if f"ld_{param.name}" in names else None
            if param.is_pointer:
                self._plan.append((param.name, expected, None, None, ld))
            elif expected.kind == "f":
                self._plan.append((param.name, None, expected.type, None, None))
            else:
                info = np.iinfo(expected)
                self._plan.append((param.name, None, expected.type,
                                   (int(info.min), int(info.max)), None))

    def arguments(self, values: dict) -> tuple:
        """The argument tuple, in the .cu order: arrays checked for dtype and layout, scalars
        converted to exact NumPy types. TypeError/ValueError name the kernel and parameter."""
        name = self.kernel.name
        if len(values) != len(self._plan):
            values = self._without_zoneout(values)
        args = []
        for param, array_dtype, scalar, limits, ld in self._plan:
            try:
                value = values[param]
            except KeyError:
                raise TypeError(f"{name}: missing arguments [{param!r}]") from None
            if array_dtype is not None:
                _check_array(name, param, value, array_dtype, None if ld is None else values[ld])
                args.append(value)
                continue
            key = (scalar, type(value), value)
            converted = _scalars.get(key)
            if converted is None:
                converted = _convert_scalar(name, param, value, scalar, limits)
                if len(_scalars) > 4096:
                    _scalars.clear()
                _scalars[key] = converted
            args.append(converted)
        return tuple(args)

    def _without_zoneout(self, values: dict) -> dict:
        """``values`` with the optional parameters it leaves out filled in (``Kernel.
        optional``); TypeError for any other missing or an unknown parameter."""
        kernel = self.kernel
        missing = [p for p in kernel.param_names if p not in values]
        extra = sorted(set(values) - set(kernel.param_names))
        if extra or not kernel.optional.issuperset(missing):
            missing = [p for p in missing if p not in kernel.optional]
            raise TypeError(f"{kernel.name}: missing arguments {missing}, unknown {extra}")
        some_array = next(values[p.name] for p in kernel.params
                          if p.is_pointer and p.base == "T" and p.name in values)
        filled = dict(values)
        for param in kernel.params:
            if param.name not in values:
                filled[param.name] = some_array if param.is_pointer else 0
        return filled


# NumPy scalars already made, by (type, Python type, value): making one costs ~1 us, and a
# step loop passes the same few flags and sizes to every launch.
_scalars: dict = {}


def _convert_scalar(kernel, param, value, scalar, limits):
    if limits is None:
        if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.floating, np.integer)):
            raise TypeError(f"{kernel}: {param} must be a real number, "
                            f"got {type(value).__name__}")
        return scalar(value)
    if not isinstance(value, (int, np.integer)):  # bool is an int: 0 or 1
        raise TypeError(f"{kernel}: {param} must be an integer, got {type(value).__name__}")
    if not limits[0] <= value <= limits[1]:
        raise ValueError(f"{kernel}: {param}={value} does not fit {np.dtype(scalar).name}")
    return scalar(value)


_bindings: dict = {}


def binding(kernel: Kernel, dtypes) -> Binding:
    """The (cached) Binding of ``kernel`` for its template dtypes."""
    key = (kernel.name, *dtypes)
    found = _bindings.get(key)
    if found is None:
        found = _bindings[key] = Binding(kernel, dtypes)
    return found


def arguments(kernel: Kernel, dtypes, **values) -> tuple:
    """``binding(kernel, dtypes).arguments(values)``."""
    return binding(kernel, dtypes).arguments(values)


def _check_array(kernel, param, a, dtype, ld):
    try:
        a_dtype = a.dtype
        strides = a.strides
    except AttributeError:
        raise TypeError(f"{kernel}: {param} must be an array, got {type(a).__name__}") from None
    if a_dtype is not dtype and a_dtype != dtype:
        raise TypeError(f"{kernel}: {param} must have dtype {dtype}, got {a_dtype}")
    if ld is None:
        if not a.flags.c_contiguous:
            raise ValueError(f"{kernel}: {param} must be C-contiguous")
        return
    if a.ndim != 2 or (a.shape[1] > 1 and strides[1] != a.itemsize) or (
            a.shape[0] > 1 and strides[0] != int(ld) * a.itemsize):
        raise ValueError(f"{kernel}: {param} must be rows of stride ld_{param}="
                         f"{ld}, got shape {a.shape} strides {strides}")


# --------------------------------------------------------------------------------------
# Launch shapes


@dataclass(frozen=True)
class LaunchPolicy:
    """How launches are shaped. The GPU uses the defaults; the emulation tests also use
    tiny values so that every grid-stride loop and the two-pass column sum run."""

    block: int = 256
    max_grid: int = 65535
    rows_per_part: int = 64  # column_sum: rows one thread sums before a second pass
    min_threads: int = 1 << 15  # column_sum: split rows into parts until this many threads


DEFAULT_POLICY = LaunchPolicy()


def elementwise_shape(n: int, policy: LaunchPolicy = DEFAULT_POLICY):
    """``(grid, block)`` for a grid-stride loop over ``n >= 1`` elements."""
    grid = min(policy.max_grid, math.ceil(n / policy.block))
    return (grid, 1, 1), (policy.block, 1, 1)


def column_sum_plan(rows: int, cols: int, policy: LaunchPolicy = DEFAULT_POLICY):
    """``(parts, rows_per_part)``: one part when the rows are few or the columns many
    enough to fill the device, else parts of at least ``policy.rows_per_part`` rows."""
    if rows <= policy.rows_per_part or cols >= policy.min_threads:
        return 1, max(rows, 1)
    parts = min(math.ceil(rows / policy.rows_per_part), math.ceil(policy.min_threads / cols))
    rows_per_part = math.ceil(rows / parts)
    return math.ceil(rows / rows_per_part), rows_per_part


def column_sum_shape(cols: int, parts: int, policy: LaunchPolicy = DEFAULT_POLICY):
    """``(grid, block)`` for ``column_sum``: x over columns, y over parts."""
    grid_x = min(policy.max_grid, math.ceil(cols / policy.block))
    return (grid_x, min(policy.max_grid, parts), 1), (policy.block, 1, 1)
