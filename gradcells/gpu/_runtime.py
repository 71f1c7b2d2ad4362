"""The device side of the GPU backend: CuPy, and the kernels compiled by NVRTC.

Kept as thin as possible, because nothing here can run without a GPU: one ``RawModule`` per
``.cu`` file (``_kernels.module_code``: the kernels and an ``extern "C"`` entry point for
each dtype's instantiation), compiled on first use and kept by CuPy in its disk cache, keyed
by the code and options, so that later processes load it instead of compiling again (CuPy
before 14.2 does not read its disk cache for a module compiled with name expressions, which
is why there are entry points); one
``launch`` that looks a kernel up by its entry point, the name the emulation harness uses
too, and calls it with the argument tuple ``_kernels.arguments`` built. Everything else
(argument lists, launch shapes, the step loops) is shared with the emulation tests.
CuPy is imported when the first ``CupyRuntime`` is made, on the first operation
(``_launch.runtime``); importing this module imports no CuPy.
"""

from __future__ import annotations

from . import _kernels


class CupyRuntime:
    """``xp``, ``policy``, ``device_of`` and ``launch`` for the operations (the cells'
    ``gpu.py``; see ``_launch``) on the current device. Made on the first call, which
    imports CuPy; the compiled modules and the functions looked up in them are kept, one
    module per source file and one function per (device, entry point)."""

    policy = _kernels.DEFAULT_POLICY

    def __init__(self):
        import cupy

        self.xp = cupy
        self._modules: dict[str, object] = {}
        self._functions: dict[tuple[int, str], object] = {}

    @staticmethod
    def device_of(a):
        """A context in which ``a``'s device is the current one: kernels launch, and CuPy
        allocates and runs cuBLAS, where the arguments live (all on one device: validated)."""
        return a.device

    def _module(self, source: str):
        module = self._modules.get(source)
        if module is None:
            module = self.xp.RawModule(code=_kernels.module_code(source),
                                       options=_kernels.NVRTC_OPTIONS)
            self._modules[source] = module
        return module

    def launch(self, binding, grid, block, args):
        key = (self.xp.cuda.runtime.getDevice(), binding.entry)
        function = self._functions.get(key)
        if function is None:
            function = self._module(binding.kernel.source).get_function(binding.entry)
            self._functions[key] = function
        function(grid, block, args)
