"""The GPU backend: CuPy arrays, fused CUDA kernels, cuBLAS matmuls.

The kernels are the ``.cu`` files beside this module (one fused elementwise kernel per cell
step forward, one for its gate gradients, a deterministic column-sum kernel for the bias and
peephole gradients), compiled by NVRTC through CuPy on first use, for float32, float64 and
float16 (float16 storage, float32 arithmetic). Matmuls are CuPy's (cuBLAS). The algorithms
are in ``_ops`` and follow the reference's matmul plan; a cell is a sequence of one step.

The eight public operations, with the names and keyword signatures of
``gradcells.reference``'s; arguments arrive
validated by the public layer. CuPy is imported on the first call, never at import time.
"""

from __future__ import annotations

from . import _ops

_runtime = None


def _runtime_on(x):
    """The CuPy runtime (created, and CuPy imported, on first use) and the context that makes
    x's device the current one for the call."""
    global _runtime
    if _runtime is None:
        from ._cupy_runtime import CupyRuntime

        _runtime = CupyRuntime()
    return _runtime, _runtime.device_of(x)


def lstm_cell(x, cs_prev, h_prev, w, b, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
              cell_clip=None):
    """One LSTM step; see ``gradcells.reference.lstm.lstm_cell``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.lstm_cell(runtime, x, cs_prev, h_prev, w, b, wci=wci, wcf=wcf, wco=wco,
                              forget_bias=forget_bias, cell_clip=cell_clip)


def lstm_cell_grad(x, cs_prev, h_prev, w, b, state, *, d_h=None, d_cs=None, wci=None,
                   wcf=None, wco=None, cell_clip=None, clip_grad="exact"):
    """Gradient of one LSTM step; see ``gradcells.reference.lstm.lstm_cell_grad``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.lstm_cell_grad(runtime, x, cs_prev, h_prev, w, b, state, d_h=d_h,
                                   d_cs=d_cs, wci=wci, wcf=wcf, wco=wco, cell_clip=cell_clip,
                                   clip_grad=clip_grad)


def gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c, *, reset_after=False):
    """One GRU step; see ``gradcells.reference.gru.gru_cell``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.gru_cell(runtime, x, h_prev, w_ru, w_c, b_ru, b_c, reset_after=reset_after)


def gru_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, state, d_h=None, *, reset_after=False):
    """Gradient of one GRU step; see ``gradcells.reference.gru.gru_cell_grad``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.gru_cell_grad(runtime, x, h_prev, w_ru, w_c, b_ru, b_c, state, d_h,
                                  reset_after=reset_after)


def lstm_sequence(x, cs0, h0, w, b, *, wci=None, wcf=None, wco=None, forget_bias=1.0,
                  cell_clip=None, seq_len=None):
    """The LSTM over ``x [T, B, I]``; see ``gradcells.reference.sequences``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.lstm_sequence(runtime, x, cs0, h0, w, b, wci=wci, wcf=wcf, wco=wco,
                                  forget_bias=forget_bias, cell_clip=cell_clip, seq_len=seq_len)


def lstm_sequence_grad(x, cs0, h0, w, b, seq, *, d_h=None, d_cs=None, d_h_final=None,
                       d_cs_final=None, wci=None, wcf=None, wco=None, cell_clip=None,
                       clip_grad="exact", seq_len=None):
    """Backpropagation through time for ``lstm_sequence``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.lstm_sequence_grad(runtime, x, cs0, h0, w, b, seq, d_h=d_h, d_cs=d_cs,
                                       d_h_final=d_h_final, d_cs_final=d_cs_final, wci=wci,
                                       wcf=wcf, wco=wco, cell_clip=cell_clip,
                                       clip_grad=clip_grad, seq_len=seq_len)


def gru_sequence(x, h0, w_ru, w_c, b_ru, b_c, *, reset_after=False, seq_len=None):
    """The GRU over ``x [T, B, I]``; see ``gradcells.reference.sequences``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.gru_sequence(runtime, x, h0, w_ru, w_c, b_ru, b_c, reset_after=reset_after,
                                 seq_len=seq_len)


def gru_sequence_grad(x, h0, w_ru, w_c, b_ru, b_c, seq, *, d_h=None, d_h_final=None,
                      reset_after=False, seq_len=None):
    """Backpropagation through time for ``gru_sequence``."""
    runtime, on_device = _runtime_on(x)
    with on_device:
        return _ops.gru_sequence_grad(runtime, x, h0, w_ru, w_c, b_ru, b_c, seq, d_h=d_h,
                                      d_h_final=d_h_final, reset_after=reset_after,
                                      seq_len=seq_len)


__all__ = ["lstm_cell", "lstm_cell_grad", "gru_cell", "gru_cell_grad", "lstm_sequence",
           "lstm_sequence_grad", "gru_sequence", "gru_sequence_grad"]
