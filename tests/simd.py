"""The CPU kernels' hot loops are SIMD: a check of the machine code Numba compiled.

``assert_packed(kernels, dtype)`` asserts that each kernel, as compiled for the first
signature of ``dtype`` the cells called it with (the very overload they ran, from Numba's
disk cache or compiled in this process), holds a packed instruction of its main loop on
ymm/zmm registers: ``kernels`` maps each kernel to that instruction's stem ("vdiv": the
division in tanh; "vsub": the subtraction in σ' = σ(1-σ) and tanh' = 1-tanh²; "vmul").

The machine code is read back from the overload's optimised LLVM module, lowered again by
Numba's own target machine (``emit_assembly``): the disk cache keeps object code, not
assembly, and compiling the kernel a second time to ask ``inspect_asm`` cost about ten
times as long (docs/performance.md, "CI time"). Vectorisation happens in the optimisation
passes, whose output that module is, so the packed instructions are the ones the overload
runs.
"""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np


def host_has_avx() -> bool:
    """Whether this CPU has AVX (ymm registers), which the check looks for."""
    return bool(llvm.get_host_cpu_features().get("avx", False))


def assembly(kernel, signature) -> str:
    """The assembly of ``kernel``'s compiled overload for ``signature``."""
    library = kernel.overloads[signature].library
    return str(library._codegen._tm.emit_assembly(library._get_module_for_linking()))


def assert_packed(kernels, dtype) -> None:
    """Each kernel of ``kernels`` (kernel -> instruction stem) has its stem's packed form
    for ``dtype`` (``ps``/``pd``) on ymm/zmm in its first ``dtype`` overload."""
    suffix = "ps" if dtype == np.float32 else "pd"
    for kernel, stem in kernels.items():
        signatures = [s for s in kernel.signatures if str(s[0].dtype) == np.dtype(dtype).name]
        assert signatures, f"{kernel.__name__} was not compiled for {np.dtype(dtype).name}"
        packed = re.findall(rf"\b{stem}\w*{suffix}\s+[^\n]*%[yz]mm",
                            assembly(kernel, signatures[0]))
        assert packed, f"{kernel.__name__}{signatures[0]}: no packed {stem}{suffix} on ymm/zmm"
