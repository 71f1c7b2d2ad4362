"""The GPU backend's machinery: CuPy arrays, fused CUDA kernels, cuBLAS matmuls.

Each cell's operations live in its folder (``gradcells/cells/<cell>/gpu.py``, with the names and
signatures of the backend protocol in its ``spec.py``: forward, gradient, forward mode ``*_jvp``
and second order ``*_grad_jvp`` side by side) beside its kernels (``<cell>.cu``: one fused
elementwise kernel per cell step forward, one for its gate gradients, and their tangent kernels;
the layer-normalised LSTM adds row kernels, one thread per row, for its norms); the registry
(``gradcells.cells.implementation(cell, "gpu")``, ``gradcells._dispatch.backend_module("gpu")``)
finds them. This package holds what every cell uses: ``_launch`` the runtime they run on and the
helpers they share (launches, masks, lengths, column sums); ``_tangents`` what their forward
mode and second order share (the tangents' matmuls, zero tangents, upstream pairs); ``_kernels``
the one table of kernel names, argument lists and launch shapes; ``_sources`` the source text
the compilers get (a cell's ``.cu`` from its folder, ``reduce.cu``: a deterministic column-sum
kernel for the bias and peephole gradients, and ``common.cuh``, which every ``.cu`` includes,
from here); ``_runtime`` CuPy and NVRTC. The kernels are compiled by NVRTC through CuPy on first
use, for float32, float64 and float16 (float16 storage, float32 arithmetic).

Arguments arrive validated by the public layer, as one weight set and one settings record.
The sequence masks (docs/spec.md §11.3) run inside the matmul plan: the input mask is one
multiply of the whole input, the recurrent mask one of each step's matmul input (and of its
gradient), and zoneout's mix and split happen inside the step kernels (the step's mask and a
flag); the masks are materialised once per call (``_launch.sequence_mask``). Forward mode
(docs/spec.md §12) runs the forward's own plan and a tangent step kernel per step; the second
order runs the backward's plan with a tangent step kernel beside each step's backward kernel.
Importing this package, or a cell's ``gpu.py``, imports no CuPy and compiles nothing: CuPy
is imported on the first call.
"""

from __future__ import annotations
