"""recurrentgemma's layout (google-deepmind/recurrentgemma): the RG-LRU's parameters
(docs/spec.md §18.3).

Its ``RGLRU`` layer (torch ``recurrentgemma.torch.layers.RGLRU``, JAX/Flax
``recurrentgemma.jax.layers.RGLRU``) holds ``a_param [D]`` and two ``BlockDiagonalLinear``
layers, ``input_gate`` and ``a_gate``, each ``w [N, D/N, D/N]`` and ``b [N, D/N]``; its
state (``cache``) is the one ``[B, D]`` array. gradcells's ``w_a``/``w_x`` are the layers'
``w`` as they are, ``b_a``/``b_x`` their ``b`` flattened head-major, ``lam`` is
``a_param``. Its forward takes ``segment_pos [B, T]``, batch first: ``resets =
segment_pos == 0`` with ``batch_first=True``.
"""

from __future__ import annotations

import numpy as np

from .._core.types import Array
from ._common import Converted, check_ndim, check_shape, checked_arrays, new_array

STATE_ORDER = ("h",)
"""recurrentgemma's RG-LRU state: ``h`` alone (its ``cache``)."""

MAX_SQRT_GRADIENT = 1000.0
"""recurrentgemma's ``_MAX_SQRT_GRADIENT``: the bound of its ``SqrtBoundDerivative``."""


def rglru_from_recurrentgemma(a_param: Array, input_gate_w: Array, input_gate_b: Array,
                              a_gate_w: Array, a_gate_b: Array) -> Converted:
    """gradcells ``(w_a, b_a, w_x, b_x, lam)`` from recurrentgemma's ``RGLRU``: its
    ``a_param [D]``, ``input_gate.w [N, D/N, D/N]``, ``input_gate.b [N, D/N]``,
    ``a_gate.w`` and ``a_gate.b`` (tensors are detached and copied; a state dict's
    ``"a_param"``, ``"input_gate.w"``, ... in that order).

    ``converted.options`` is ``{"c": 8.0, "sqrt_grad_bound": 1000.0}``: recurrentgemma's
    forward and its gradient, whose square root's derivative it bounds
    (``SqrtBoundDerivative``); leave ``sqrt_grad_bound`` out for the true gradient (the
    forward is the same). ``state_order`` is ``("h",)``."""
    a = checked_arrays(a_param=a_param, input_gate_w=input_gate_w, input_gate_b=input_gate_b,
                       a_gate_w=a_gate_w, a_gate_b=a_gate_b)
    w_x = a["input_gate_w"]
    check_ndim("input_gate_w", w_x, 3, "N, D/N, D/N")
    n_heads, d = w_x.shape[0], w_x.shape[1]
    check_shape("input_gate_w", w_x, (n_heads, d, d), "N, D/N, D/N")
    check_shape("a_gate_w", a["a_gate_w"], (n_heads, d, d), "N, D/N, D/N")
    for name in ("input_gate_b", "a_gate_b"):
        check_shape(name, a[name], (n_heads, d), "N, D/N")
    check_shape("a_param", a["a_param"], (n_heads * d,), "D")
    arrays = (new_array(a["a_gate_w"]), new_array(a["a_gate_b"].reshape(-1)),
              new_array(w_x), new_array(a["input_gate_b"].reshape(-1)),
              new_array(a["a_param"]))
    return Converted(arrays, framework="recurrentgemma",
                     options={"c": 8.0, "sqrt_grad_bound": MAX_SQRT_GRADIENT},
                     state_order=STATE_ORDER)


def rglru_to_recurrentgemma(w_a: Array, b_a: Array, w_x: Array, b_x: Array,
                            lam: Array) -> dict[str, np.ndarray]:
    """recurrentgemma's ``RGLRU`` parameters from gradcells's, as its torch state dict
    names them: ``{"a_param", "input_gate.w", "input_gate.b", "a_gate.w", "a_gate.b"}``
    (load with ``layer.load_state_dict({k: torch.from_numpy(v) ...})``)."""
    a = checked_arrays(w_a=w_a, b_a=b_a, w_x=w_x, b_x=b_x, lam=lam)
    check_ndim("w_a", a["w_a"], 3, "N, H/N, H/N")
    n_heads, d = a["w_a"].shape[0], a["w_a"].shape[1]
    check_shape("w_a", a["w_a"], (n_heads, d, d), "N, H/N, H/N")
    check_shape("w_x", a["w_x"], (n_heads, d, d), "N, H/N, H/N")
    for name in ("b_a", "b_x", "lam"):
        check_shape(name, a[name], (n_heads * d,), "H")
    return {"a_param": new_array(a["lam"]),
            "input_gate.w": new_array(a["w_x"]),
            "input_gate.b": new_array(a["b_x"].reshape(n_heads, d)),
            "a_gate.w": new_array(a["w_a"]),
            "a_gate.b": new_array(a["b_a"].reshape(n_heads, d))}
