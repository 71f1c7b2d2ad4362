"""xLSTM's layouts (NX-AI/xlstm): the sLSTM cell's recurrent kernel and bias (docs/spec.md
§19).

xlstm's ``sLSTMCell`` (either backend) exposes its parameters in an external layout,
``cell.recurrent_kernel [N, d, 4, d]`` (head, input unit, gate, output unit; d = H/N) and
``cell.bias [N, 4, d]`` (head-major); it takes the gate pre-activations' input part ``Wx``
as its input, ``[B, T, 4H]`` gate-major (its layer's projections make it), and its state
``[4, B, H]`` in the order ``(h, c, n, m)``. gradcells's ``r [N, d, 4d]`` is the kernel with
its last two axes joined; ``b [4H]`` is gate-major.
"""

from __future__ import annotations

import numpy as np

from .._core.types import Array
from ._common import Converted, check_ndim, check_shape, checked_arrays, new_array

STATE_ORDER = ("h", "c", "n", "m")
"""xlstm's order of the sLSTM state."""


def slstm_from_xlstm(recurrent_kernel: Array, bias: Array,
                     input_weight: Array | None = None) -> Converted:
    """gradcells ``(w, r, b)`` from xlstm's ``sLSTMCell``: ``recurrent_kernel [N, d, 4, d]``
    and ``bias [N, 4, d]`` as ``cell.recurrent_kernel`` and ``cell.bias`` give them (tensors
    are detached and copied). ``input_weight [I, 4H]``: the projection whose product is the
    cell's input ``Wx``; None (the cell alone) gives ``w = I_{4H}``, so that ``x`` is ``Wx``.

    ``converted.state_order`` is ``("h", "c", "n", "m")``; ``gradcells_states(h, c, n, m)``
    gives them in gradcells's order ``(c, n, m, h)``. The forward is xlstm's with
    ``forget="sigmoid"`` (its ``"slstm"`` function), with a state whose ``n`` is not all
    zero (from an all-zero state xlstm's vanilla code takes ``m_1 = ĩ_1``: ``h`` agrees, the
    state differs by the stabiliser's scale, docs/spec.md §19)."""
    a = checked_arrays(recurrent_kernel=recurrent_kernel, bias=bias,
                       input_weight=input_weight, optional=("input_weight",))
    kernel = a["recurrent_kernel"]
    check_ndim("recurrent_kernel", kernel, 4, "N, d, 4, d")
    n_heads, d = kernel.shape[0], kernel.shape[1]
    check_shape("recurrent_kernel", kernel, (n_heads, d, 4, d), "N, d, 4, d")
    check_shape("bias", a["bias"], (n_heads, 4, d), "N, 4, d")
    hidden = n_heads * d
    w = (np.eye(4 * hidden, dtype=kernel.dtype) if a["input_weight"] is None
         else new_array(a["input_weight"]))
    check_shape("input_weight", w, (w.shape[0], 4 * hidden), "I, 4H")
    b = new_array(a["bias"].transpose(1, 0, 2).reshape(4 * hidden))
    return Converted((w, new_array(kernel.reshape(n_heads, d, 4 * d)), b), framework="xlstm",
                     options={"forget": "sigmoid"}, state_order=STATE_ORDER)


def slstm_to_xlstm(r: Array, b: Array) -> tuple[np.ndarray, np.ndarray]:
    """xlstm's ``(recurrent_kernel [N, d, 4, d], bias [N, 4, d])`` from gradcells's
    ``r [N, d, 4d]`` and ``b [4H]`` (``cell.recurrent_kernel``, ``cell.bias``; the input
    weights are the layer's, not the cell's)."""
    a = checked_arrays(r=r, b=b)
    check_ndim("r", a["r"], 3, "N, H/N, 4H/N")
    n_heads, d = a["r"].shape[0], a["r"].shape[1]
    check_shape("r", a["r"], (n_heads, d, 4 * d), "N, H/N, 4H/N")
    check_shape("b", a["b"], (4 * n_heads * d,), "4H")
    return (new_array(a["r"].reshape(n_heads, d, 4, d)),
            new_array(a["b"].reshape(4, n_heads, d).transpose(1, 0, 2)))
