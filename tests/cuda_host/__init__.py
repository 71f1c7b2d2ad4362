"""Host emulation of the GPU backend's kernels: the same ``.cu`` source, compiled for the CPU.

``load(code, entries)`` compiles a kernel module, the way ``cupy.RawModule(code=...)`` would
for the device, with the system C++ compiler after ``gradcells_host_shim.h`` into a shared
library holding one ``extern "C"`` launcher per entry point, and caches it under a build
directory keyed by the hash of everything that went into it; ``library(source)`` does so
for one ``.cu`` file as the GPU backend compiles it (``gradcells.gpu._kernels.module_code``).
``HostRuntime`` is a drop-in for the GPU backend's CuPy runtime (``gradcells.gpu._runtime``),
installed with ``gradcells.gpu._launch.use_runtime``: NumPy arrays, and ``launch`` calls the
host launcher with the grid, block and argument tuple the GPU gets.

Build directory: ``$GRADCELLS_HOST_BUILD_DIR``, else ``<tmp>/gradcells-cuda-host``.
Compiler: ``$CXX``, else ``g++``, else ``c++``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from gradcells.gpu import _kernels, _sources

SHIM = Path(__file__).resolve().parent / "gradcells_host_shim.h"
CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-Wall",
             "-Wextra", "-Werror", "-Wno-unused-parameter", "-Wno-unused-function")

_libraries: dict[str, ctypes.CDLL] = {}


def compiler() -> str | None:
    """The C++ compiler to use, or None when there is none."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def symbol(entry: str) -> str:
    """The C symbol of the host launcher for an entry point:
    ``column_sum__gc_half__float`` -> ``gc_launch__column_sum__gc_half__float``."""
    return f"gc_launch__{entry}"


def translation_unit(code: str, entries) -> str:
    """The C++ text compiled for one kernel module: the shim, the module's ``code`` (as
    NVRTC gets it, entry points included), and one launcher per entry point."""
    launchers = "\n".join(
        f"void {symbol(e)}(const unsigned int* grid, const unsigned int* block, int reverse, "
        f"void** args) {{ gc_host::launch(&{e}, grid, block, reverse, args); }}"
        for e in entries)
    return (f'#include "{SHIM}"\n'
            f"// ==== the kernel source, as NVRTC gets it\n{code}\n"
            f'// ==== host launchers\nextern "C" {{\n{launchers}\n}}\n')


def _build_dir() -> Path:
    return Path(os.environ.get("GRADCELLS_HOST_BUILD_DIR")
                or Path(tempfile.gettempdir()) / "gradcells-cuda-host")


def build(code: str, entries) -> Path:
    """Compile a kernel module for the host (or reuse the cached build); return the path of
    the shared library."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    unit = translation_unit(code, entries)
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = _sources.fingerprint(unit, SHIM.read_text(), cxx, version, " ".join(CXX_FLAGS))
    directory = _build_dir() / key
    target = directory / "libgc_kernels.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    # Process-private names, renamed into place: concurrent test runs never see half a file.
    unit_path = directory / f"kernels_host.{os.getpid()}.cpp"
    unit_path.write_text(unit)
    partial = directory / f".{target.name}.{os.getpid()}.tmp"
    result = subprocess.run([cxx, *CXX_FLAGS, "-o", str(partial), str(unit_path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"host compilation failed ({unit_path}):\n{result.stderr}")
    os.replace(unit_path, directory / "kernels_host.cpp")
    os.replace(partial, target)
    return target


def load(code: str, entries) -> ctypes.CDLL:
    """The host library of a kernel module (built once per process and code)."""
    key = _sources.fingerprint(code, *entries)
    lib = _libraries.get(key)
    if lib is None:
        lib = ctypes.CDLL(str(build(code, entries)))
        _libraries[key] = lib
    return lib


@functools.cache
def library(source: str) -> ctypes.CDLL:
    """The host library of one ``.cu`` file, with every instantiation the GPU backend uses
    (its code composed once per process, not at every launch)."""
    return load(_kernels.module_code(source), _kernels.source_entries(source))


def call(lib, entry, grid, block, args, reverse=False):
    """Launch ``entry`` from ``lib`` as ``RawKernel.__call__(grid, block, args)`` would."""
    launcher = getattr(lib, symbol(entry))
    launcher.restype = None
    values = [_c_value(a) for a in args]
    pointers = (ctypes.c_void_p * len(values))(
        *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
    grid3 = (ctypes.c_uint * 3)(*(tuple(grid) + (1, 1))[:3])
    block3 = (ctypes.c_uint * 3)(*(tuple(block) + (1, 1))[:3])
    launcher(grid3, block3, ctypes.c_int(int(reverse)), pointers)


_SCALARS = {np.float32: ctypes.c_float, np.float64: ctypes.c_double,
            np.int32: ctypes.c_int32, np.int64: ctypes.c_int64}


def _c_value(value):
    """The ctypes object holding one kernel argument, as the device would receive it."""
    if isinstance(value, np.ndarray):
        return ctypes.c_void_p(value.ctypes.data)
    c_type = _SCALARS.get(type(value))
    if c_type is None:
        raise TypeError(f"kernel argument of type {type(value).__name__}: the GPU launch "
                        "would not pass it with an exact C type")
    return c_type(value.item())


class _PoisonedNumpy:
    """NumPy, except that ``empty``/``empty_like`` fill floats with NaN: an output element
    a kernel forgets to write shows up instead of passing by luck."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=float, order="C"):
        a = np.empty(shape, dtype=dtype, order=order)
        if a.dtype.kind == "f":
            a.fill(np.nan)
        return a

    @staticmethod
    def empty_like(prototype, dtype=None, order="K", shape=None):
        a = np.empty_like(prototype, dtype=dtype, order=order, shape=shape)
        if a.dtype.kind == "f":
            a.fill(np.nan)
        return a


class HostRuntime:
    """The runtime of the GPU backend's operations with the kernels compiled for the CPU.

    ``policy`` shapes the launches (``_kernels.DEFAULT_POLICY`` is the GPU's); ``reverse``
    runs blocks and threads in reverse order. ``launches`` counts launches by kernel name.
    """

    xp = _PoisonedNumpy()

    def __init__(self, policy=_kernels.DEFAULT_POLICY, reverse=False):
        self.policy = policy
        self.reverse = reverse
        self.launches: dict[str, int] = {}

    @staticmethod
    def device_of(a):
        """The host is one device."""
        return contextlib.nullcontext()

    def launch(self, binding, grid, block, args):
        call(library(binding.kernel.source), binding.entry, grid, block, args,
             self.reverse)
        name = binding.kernel.name
        self.launches[name] = self.launches.get(name, 0) + 1
