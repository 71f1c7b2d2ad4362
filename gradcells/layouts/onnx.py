"""ONNX's layouts: the ``LSTM`` (with peepholes), ``GRU`` (``linear_before_reset``) and
``RNN`` nodes, one direction at a time. Two biases per gate (``Wb``, ``Rb``): the two-bias
rule.
"""

from __future__ import annotations

import numpy as np

from .._core.types import Array
from ..cells.lstm.spec import PEEPHOLES
from ._common import (
    Converted,
    check_ndim,
    check_rnn,
    check_shape,
    checked_arrays,
    dtype_of,
    framework_gru,
    framework_lstm,
    gradcells_gru,
    gradcells_lstm,
    gradcells_rnn,
    gru_converted,
    lstm_converted,
    new_array,
    rnn_converted,
    sum_or_zeros,
    zero_array,
)

# Gate orders, one letter per block, named by gradcells's letters (see ._common).
LSTM_ONNX = "iofc"       # i, o, f, c
GRU_ONNX = "urc"         # z, r, h
_ONNX_ACTIVATIONS = {"Tanh": "tanh", "Relu": "relu"}


def _single_direction(name, a, labels):
    """``a[0]`` of an ONNX ``[num_directions, ...]`` array with one direction."""
    if a.ndim >= 1 and a.shape[0] != 1:
        raise ValueError(
            f"{name} must have num_directions = 1 in [{labels}], got shape {a.shape}; "
            f"convert a bidirectional layer one direction at a time ({name}[d:d+1])")
    return a[0]


def _check_onnx(a, n_gates):
    """Check ONNX's ``W [1, kH, I]``, ``R [1, kH, H]`` and ``B [1, 2kH]`` (k = ``n_gates``);
    return ``(H, W[0])``."""
    gates = f"{n_gates}H" if n_gates > 1 else "H"
    check_ndim("R", a["R"], 3, f"1, {gates}, H")
    n_hidden = a["R"].shape[2]
    check_shape("R", a["R"], (1, n_gates * n_hidden, n_hidden), f"1, {gates}, H")
    check_ndim("W", a["W"], 3, f"1, {gates}, I")
    w_x = _single_direction("W", a["W"], f"num_directions, {gates}, I")
    check_shape("W", a["W"], (1, n_gates * n_hidden, w_x.shape[1]), f"1, {gates}, I")
    check_shape("B", a["B"], (1, 2 * n_gates * n_hidden), f"1, {2 * n_gates}H")
    return n_hidden, w_x


def lstm_from_onnx(W: Array, R: Array, B: Array | None = None, P: Array | None = None) -> Converted:
    """gradcells weights from an ONNX ``LSTM`` node (one direction).

    ONNX: ``W [1, 4H, I]``, ``R [1, 4H, H]``, ``B [1, 8H]`` = ``[Wb, Rb]`` (optional, zeros),
    ``P [1, 3H]`` peepholes in the order **i, o, f** (optional); gate blocks **i, o, f, c**.
    The node must use the default activations (sigmoid, tanh, tanh), ``input_forget=0`` and
    no ``clip`` (ONNX clips gate pre-activations, not the cell state). Two biases:
    ``b = Wb + Rb``.

    Returns ``(w, b)``, or ``(w, b, wci, wcf, wco)`` when ``P`` is given.
    """
    a = checked_arrays(W=W, R=R, B=B, P=P, optional=("B", "P"))
    n_hidden, w_x = _check_onnx(a, 4)
    check_shape("P", a["P"], (1, 3 * n_hidden), "1, 3H")
    bias = zero_array((4 * n_hidden,), dtype_of(a))
    if a["B"] is not None:
        bias = sum_or_zeros(a["B"][0, :4 * n_hidden], a["B"][0, 4 * n_hidden:],
                            (4 * n_hidden,), dtype_of(a))
    w, b = gradcells_lstm(w_x.T, a["R"][0].T, bias, LSTM_ONNX)
    if a["P"] is None:
        return lstm_converted((w, b), "onnx")
    p_i, p_o, p_f = (a["P"][0, k * n_hidden:(k + 1) * n_hidden].copy() for k in range(3))
    return lstm_converted((w, b, p_i, p_f, p_o), "onnx")


def lstm_to_onnx(w: Array, b: Array, wci: Array | None = None, wcf: Array | None = None,
                 wco: Array | None = None) -> tuple[np.ndarray, ...]:
    """An ONNX ``LSTM`` node's ``(W [1, 4H, I], R [1, 4H, H], B [1, 8H])``, gate blocks
    i, o, f, c, from gradcells ``(w, b)``; with peepholes (all three) also ``P [1, 3H]``
    (i, o, f). Two biases: ``Wb = b`` (reordered), ``Rb = 0``."""
    a = checked_arrays(w=w, b=b, wci=wci, wcf=wcf, wco=wco, optional=PEEPHOLES)
    rows_x, rows_h, bias = framework_lstm(a["w"], a["b"], LSTM_ONNX)
    n_hidden = bias.shape[0] // 4
    peepholes = [a[k] for k in PEEPHOLES]
    given = [p is not None for p in peepholes]
    if any(given) and not all(given):
        raise ValueError("peepholes need all of wci, wcf and wco or none")
    W = np.ascontiguousarray(rows_x.T)[None]
    R = np.ascontiguousarray(rows_h.T)[None]
    B = np.concatenate([bias, zero_array(bias.shape, bias.dtype)])[None]
    if not any(given):
        return W, R, B
    for name in PEEPHOLES:
        check_shape(name, a[name], (n_hidden,), "H")
    P = np.concatenate([a["wci"], a["wco"], a["wcf"]])[None]
    return W, R, B, P


def gru_from_onnx(W: Array, R: Array, B: Array | None = None, *,
                  linear_before_reset: int = 0) -> Converted:
    """gradcells ``(w_ru, w_c, b_ru, b_c)`` from an ONNX ``GRU`` node (one direction).

    ONNX: ``W [1, 3H, I]``, ``R [1, 3H, H]``, ``B [1, 6H]`` = ``[Wb, Rb]`` (optional, zeros),
    gate blocks **z, r, h** (z is gradcells's u); default activations (sigmoid, tanh), no
    ``clip``. ``linear_before_reset=0`` (ONNX's default) is reset before: ``b_c [H] = Wb_h +
    Rb_h``. ``linear_before_reset=1`` is reset after: ``b_c [2H] = [Wb_h, Rb_h]``. Two biases:
    ``b_ru`` sums ``Wb`` and ``Rb``'s z and r parts.
    """
    a = checked_arrays(W=W, R=R, B=B, optional=("B",))
    if linear_before_reset not in (0, 1) or isinstance(linear_before_reset, float):
        raise ValueError(f"linear_before_reset must be 0 or 1, got {linear_before_reset!r}")
    n_hidden, w_x = _check_onnx(a, 3)
    bias_x = bias_h = None
    if a["B"] is not None:
        bias_x, bias_h = a["B"][0, :3 * n_hidden], a["B"][0, 3 * n_hidden:]
    return gru_converted(gradcells_gru(w_x.T, a["R"][0].T, bias_x, bias_h, GRU_ONNX,
                                        reset_after=bool(linear_before_reset)),
                         "onnx", bool(linear_before_reset))


def gru_to_onnx(w_ru: Array, w_c: Array, b_ru: Array, b_c: Array) -> tuple[np.ndarray, ...]:
    """An ONNX ``GRU`` node's ``(W [1, 3H, I], R [1, 3H, H], B [1, 6H])``, gate blocks
    z, r, h, from gradcells's GRU. Two biases: ``Wb = [b_u, b_r, b_cx]``, ``Rb = [0, 0, b_ch]``
    (``b_ch = 0`` reset before). Set the node's ``linear_before_reset=1`` when ``b_c`` has
    length 2H (reset after) and leave it 0 when ``b_c`` has length H.
    """
    a = checked_arrays(w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    rows_x, rows_h, bias_x, bias_h, _ = framework_gru(
        a["w_ru"], a["w_c"], a["b_ru"], a["b_c"], GRU_ONNX)
    return (np.ascontiguousarray(rows_x.T)[None], np.ascontiguousarray(rows_h.T)[None],
            np.concatenate([bias_x, bias_h])[None])


def rnn_from_onnx(W: Array, R: Array, B: Array | None = None, *,
                  activation: str = "Tanh") -> Converted:
    """gradcells ``(w, b)`` from an ONNX ``RNN`` node (one direction).

    ONNX: ``W [1, H, I]``, ``R [1, H, H]``, ``B [1, 2H]`` = ``[Wb, Rb]`` (optional, zeros);
    no ``clip``. ``activation`` is the node's one activation, ``"Tanh"`` (ONNX's default) or
    ``"Relu"``, and lands in ``options`` as gradcells's ``"tanh"``/``"relu"``. Two biases:
    ``b = Wb + Rb``.
    """
    if not isinstance(activation, str) or activation not in _ONNX_ACTIVATIONS:
        raise ValueError(f"activation must be 'Tanh' or 'Relu', got {activation!r}")
    a = checked_arrays(W=W, R=R, B=B, optional=("B",))
    n_hidden, w_x = _check_onnx(a, 1)
    bias = zero_array((n_hidden,), dtype_of(a))
    if a["B"] is not None:
        bias = sum_or_zeros(a["B"][0, :n_hidden], a["B"][0, n_hidden:], (n_hidden,),
                            dtype_of(a))
    return rnn_converted(gradcells_rnn(w_x.T, a["R"][0].T, bias), "onnx",
                         _ONNX_ACTIVATIONS[activation])


def rnn_to_onnx(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """An ONNX ``RNN`` node's ``(W [1, H, I], R [1, H, H], B [1, 2H])`` from gradcells
    ``(w, b)``. Two biases: ``Wb = b``, ``Rb = 0``. Set the node's ``activations`` to
    ``["Tanh"]`` or ``["Relu"]`` to match gradcells's ``activation``."""
    a = checked_arrays(w=w, b=b)
    n_in, _ = check_rnn(a["w"], a["b"])
    w = a["w"]
    bias = np.concatenate([a["b"], zero_array(a["b"].shape, a["b"].dtype)])
    return new_array(w[:n_in].T)[None], new_array(w[n_in:].T)[None], bias[None]
