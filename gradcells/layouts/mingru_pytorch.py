"""minGRU-pytorch's layout (lucidrains, PyPI ``mingru-pytorch``): the minGRU's and the
minLSTM's parameters (docs/spec.md §18.2).

Its ``minGRU(dim)`` holds one bias-free ``to_hidden_and_gate`` linear layer, ``weight [2H,
D]`` whose rows are the candidate's, then the gate's; its ``minLSTM(dim)`` holds
``to_hidden_and_f_i_gate.weight [3H, D]``, rows the candidate's, then the forget gate's, then
the input gate's. gradcells's ``w [I, 2H]`` has the gate's columns, then the candidate's
(``[I, 3H]``: f, i, candidate), and a bias ``b``, zero for its layers. With
``expansion_factor`` other than 1 the layers also hold an output projection, which is theirs
to apply (``to_out``); these converters take the recurrence's weight alone. Both layers are
batch first; their state ``prev_hidden [B, 1, H]`` is gradcells's ``h0 [B, H]``.
"""

from __future__ import annotations

import numpy as np

from .._core.types import Array
from ._common import Converted, check_ndim, checked_arrays, gate_width, new_array

STATE_ORDER = ("h",)
"""minGRU-pytorch's state: ``prev_hidden`` alone."""

ROWS = {"mingru": ("hidden", "gate"), "minlstm": ("hidden", "f", "i")}
"""Their rows' blocks, in order, by cell (``gradcells.torch.MinGRU`` and ``MinLSTM`` read
them too, to reorder the weight inside autograd)."""
COLUMNS = {"mingru": ("gate", "hidden"), "minlstm": ("f", "i", "hidden")}
"""gradcells's columns' blocks, in order."""


def _from(cell, weight, name):
    a = checked_arrays(**{name: weight})[name]
    n_blocks = len(ROWS[cell])
    check_ndim(name, a, 2, f"{n_blocks}H, D")
    width = gate_width(name, a.shape[0], n_blocks, f"{n_blocks}H, D")
    rows = dict(zip(ROWS[cell], np.split(a, n_blocks), strict=True))
    w = np.concatenate([rows[k].T for k in COLUMNS[cell]], axis=1)
    return Converted((new_array(w), np.zeros(n_blocks * width, a.dtype)),
                     framework="minGRU-pytorch", options={"batch_first": True},
                     state_order=STATE_ORDER)


def _to(cell, w, b):
    a = checked_arrays(w=w, b=b)
    n_blocks = len(COLUMNS[cell])
    check_ndim("w", a["w"], 2, f"I, {n_blocks}H")
    gate_width("w", a["w"].shape[1], n_blocks, f"I, {n_blocks}H")
    if np.any(a["b"] != 0):
        raise ValueError("b must be zero: minGRU-pytorch's layers have no bias")
    columns = dict(zip(COLUMNS[cell], np.split(a["w"], n_blocks, axis=1), strict=True))
    return new_array(np.concatenate([columns[k].T for k in ROWS[cell]]))


def mingru_from_mingru_pytorch(to_hidden_and_gate_weight: Array) -> Converted:
    """gradcells ``(w [D, 2H], b [2H])`` from minGRU-pytorch's
    ``minGRU.to_hidden_and_gate.weight [2H, D]`` (rows: candidate, gate); ``b`` is zero.
    ``converted.options`` is ``{"batch_first": True}``, its layout; its parallel mode is
    gradcells's ``method="parallel"`` (which also takes a negative ``h0``: known fault 70)."""
    return _from("mingru", to_hidden_and_gate_weight, "to_hidden_and_gate_weight")


def mingru_to_mingru_pytorch(w: Array, b: Array) -> np.ndarray:
    """minGRU-pytorch's ``to_hidden_and_gate.weight [2H, D]`` from gradcells's ``w [D, 2H]``;
    ``b`` must be zero (ValueError otherwise: its layer has no bias)."""
    return _to("mingru", w, b)


def minlstm_from_mingru_pytorch(to_hidden_and_f_i_gate_weight: Array) -> Converted:
    """gradcells ``(w [D, 3H], b [3H])`` from minGRU-pytorch's
    ``minLSTM.to_hidden_and_f_i_gate.weight [3H, D]`` (rows: candidate, f, i); ``b`` is
    zero; ``options`` as ``mingru_from_mingru_pytorch``'s. Its parallel mode given a
    ``prev_hidden`` starts from ``g(h0)`` (known fault 71); gradcells's methods from
    ``h0``."""
    return _from("minlstm", to_hidden_and_f_i_gate_weight, "to_hidden_and_f_i_gate_weight")


def minlstm_to_mingru_pytorch(w: Array, b: Array) -> np.ndarray:
    """minGRU-pytorch's ``to_hidden_and_f_i_gate.weight [3H, D]`` from gradcells's
    ``w [D, 3H]``; ``b`` must be zero."""
    return _to("minlstm", w, b)
