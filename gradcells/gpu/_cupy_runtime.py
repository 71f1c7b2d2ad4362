"""The device side of the GPU backend: CuPy, and the kernels compiled by NVRTC.

Kept as thin as possible, because nothing here can run without a GPU: one ``RawModule`` per
``.cu`` file (all dtypes' instantiations, by name expression), compiled on first use in each
process and device. CuPy keeps no module compiled with name expressions in its disk cache (it
recompiles to learn the mangled names), so every new process compiles again: all three files
took about 5 s with NVRTC on a CPU of the development machine. One ``launch`` looks a kernel
up by the same name expression
the emulation harness uses and calls it with the argument tuple ``_kernels.arguments``
built. Everything else (argument lists, launch shapes, the step loops) is shared with the
emulation tests.
"""

from __future__ import annotations

import cupy

from . import _kernels, _sources

_modules: dict[str, cupy.RawModule] = {}
_functions: dict[tuple[int, str], object] = {}


def _module(source: str) -> cupy.RawModule:
    module = _modules.get(source)
    if module is None:
        module = cupy.RawModule(code=_sources.compose(source),
                                options=_kernels.NVRTC_OPTIONS,
                                name_expressions=_kernels.source_name_expressions(source))
        _modules[source] = module
    return module


class CupyRuntime:
    """``xp``, ``policy`` and ``launch`` for ``gradcells.gpu._ops`` on the current device."""

    xp = cupy
    policy = _kernels.DEFAULT_POLICY

    @staticmethod
    def device_of(a):
        """A context in which ``a``'s device is the current one: kernels launch, and CuPy
        allocates and runs cuBLAS, where the arguments live (all on one device: validated)."""
        return a.device

    def launch(self, binding, grid, block, args):
        key = (cupy.cuda.runtime.getDevice(), binding.expression)
        function = _functions.get(key)
        if function is None:
            function = _module(binding.kernel.source).get_function(binding.expression)
            _functions[key] = function
        function(grid, block, args)
