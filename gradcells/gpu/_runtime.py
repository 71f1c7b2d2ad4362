"""The device side of the GPU backend: CuPy, and the kernels compiled by NVRTC.

Kept as thin as possible, because nothing here can run without a GPU: one ``RawModule`` per
``.cu`` file (``_sources.module_code``: the kernels and an ``extern "C"`` entry point for
each dtype's instantiation), compiled on first use and kept by CuPy in its disk cache, keyed
by the code and options, so that later processes load it instead of compiling again (CuPy
before 14.2 does not read its disk cache for a module compiled with name expressions, which
is why there are entry points); one
``launch`` that looks a kernel up by its entry point, the name the emulation harness uses
too, and calls it with the argument tuple ``_kernels.arguments`` built. Everything else
(argument lists, launch shapes, the step loops) is shared with the emulation tests.
Imported, and CuPy with it, only when the first operation runs (``_launch.runtime``).
"""

from __future__ import annotations

import cupy

from . import _kernels, _sources

_modules: dict[str, cupy.RawModule] = {}
_functions: dict[tuple[int, str], object] = {}


def _module(source: str) -> cupy.RawModule:
    module = _modules.get(source)
    if module is None:
        module = cupy.RawModule(code=_sources.module_code(source),
                                options=_kernels.NVRTC_OPTIONS)
        _modules[source] = module
    return module


class CupyRuntime:
    """``xp``, ``policy``, ``device_of`` and ``launch`` for the operations (``lstm``, ``gru``,
    ``rnn``; see ``_launch``) on the current device."""

    xp = cupy
    policy = _kernels.DEFAULT_POLICY

    @staticmethod
    def device_of(a):
        """A context in which ``a``'s device is the current one: kernels launch, and CuPy
        allocates and runs cuBLAS, where the arguments live (all on one device: validated)."""
        return a.device

    def launch(self, binding, grid, block, args):
        key = (cupy.cuda.runtime.getDevice(), binding.entry)
        function = _functions.get(key)
        if function is None:
            function = _module(binding.kernel.source).get_function(binding.entry)
            _functions[key] = function
        function(grid, block, args)
