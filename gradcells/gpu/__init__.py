"""The GPU backend: CuPy arrays, fused CUDA kernels, cuBLAS matmuls.

The kernels are the ``.cu`` files beside this module (``lstm.cu``, ``gru.cu``, ``rnn.cu``:
one fused elementwise kernel per cell step forward, one for its gate gradients;
``reduce.cu``: a deterministic column-sum kernel for the bias and peephole gradients;
``common.cuh``; the layer-normalised LSTM adds row kernels, one thread per row, for its
norms), compiled by NVRTC through CuPy on first use, for float32, float64 and
float16 (float16 storage, float32 arithmetic). Matmuls are CuPy's (cuBLAS).

One module per cell, with the backend protocol's names and signatures
(``gradcells._core.types.LSTMBackend``, ``GRUBackend``, ``RNNBackend``): ``lstm``, ``gru``
and ``rnn`` hold the operations and their matmul plans; ``_launch`` the runtime they run on
and the helpers they share; ``_kernels`` the one table of kernel names, argument lists and
launch shapes; ``_sources`` the source text the compilers get; ``_runtime`` CuPy and NVRTC.
Arguments arrive validated by the public layer, as one weight set and one settings record.
The sequence masks (docs/spec.md §11.3) run inside that plan: the input mask is one multiply
of the whole input, the recurrent mask one of each step's matmul input (and of its gradient),
and zoneout's mix and split happen inside the step kernels (the step's mask and a flag); the
masks are materialised once per call (``_launch.sequence_mask``).
Forward mode (docs/spec.md §12, the ``*_jvp`` operations at the ends of the cell modules)
runs the forward's own plan and a tangent step kernel per step (``_jvp``); the second
order (the ``*_grad_jvp`` operations) runs the backward's plan with a tangent step kernel
beside each step's backward kernel (``_grad_jvp``).
Importing this package imports no CuPy and compiles nothing: CuPy is imported on the first
call.
"""

from __future__ import annotations
