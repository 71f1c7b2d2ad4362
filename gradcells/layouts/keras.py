"""Keras' layouts: ``LSTM``/``LSTMCell``, ``GRU``/``GRUCell`` (reset before and after),
``SimpleRNN``/``SimpleRNNCell``, as ``layer.get_weights()`` gives them and
``layer.set_weights`` takes them.
"""

from __future__ import annotations

import numpy as np

from .._core.types import Array
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
    rnn_activation,
    rnn_converted,
    sum_or_zeros,
)

# Gate orders, one letter per block, named by gradcells's letters (see ._common).
LSTM_KERAS = "ifco"      # i, f, c, o
GRU_KERAS = "urc"        # z, r, h


def _check_keras_kernels(a, n_gates):
    """Check Keras' ``kernel [I, kH]`` and ``recurrent_kernel [H, kH]`` (k = ``n_gates``);
    return H."""
    gates = f"{n_gates}H" if n_gates > 1 else "H"
    check_ndim("recurrent_kernel", a["recurrent_kernel"], 2, f"H, {gates}")
    n_hidden = a["recurrent_kernel"].shape[0]
    check_shape("recurrent_kernel", a["recurrent_kernel"], (n_hidden, n_gates * n_hidden),
                f"H, {gates}")
    check_ndim("kernel", a["kernel"], 2, f"I, {gates}")
    check_shape("kernel", a["kernel"], (a["kernel"].shape[0], n_gates * n_hidden), f"I, {gates}")
    return n_hidden


def lstm_from_keras(kernel: Array, recurrent_kernel: Array, bias: Array | None = None) -> Converted:
    """gradcells ``(w, b)`` from Keras' ``LSTM`` / ``LSTMCell`` weights
    (``layer.get_weights()``).

    Keras: ``kernel [I, 4H]``, ``recurrent_kernel [H, 4H]``, ``bias [4H]`` (None:
    ``use_bias=False``), gate blocks **i, f, c, o**. One bias: copied (``unit_forget_bias``
    only initialises it; nothing is added at run time).
    """
    a = checked_arrays(kernel=kernel, recurrent_kernel=recurrent_kernel, bias=bias,
                       optional=("bias",))
    n_hidden = _check_keras_kernels(a, 4)
    check_shape("bias", a["bias"], (4 * n_hidden,), "4H")
    bias = sum_or_zeros(a["bias"], None, (4 * n_hidden,), dtype_of(a))
    return lstm_converted(
        gradcells_lstm(a["kernel"], a["recurrent_kernel"], bias, LSTM_KERAS), "keras")


def lstm_to_keras(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """Keras' ``(kernel [I, 4H], recurrent_kernel [H, 4H], bias [4H])``, gate blocks
    i, f, c, o, from gradcells ``(w, b)``: ``layer.set_weights(lstm_to_keras(w, b))``."""
    a = checked_arrays(w=w, b=b)
    rows_x, rows_h, bias = framework_lstm(a["w"], a["b"], LSTM_KERAS)
    return np.ascontiguousarray(rows_x), np.ascontiguousarray(rows_h), bias


def gru_from_keras(kernel: Array, recurrent_kernel: Array, bias: Array | None = None, *,
                   reset_after: bool | None = None) -> Converted:
    """gradcells ``(w_ru, w_c, b_ru, b_c)`` from Keras' ``GRU`` / ``GRUCell`` weights
    (``layer.get_weights()``).

    Keras: ``kernel [I, 3H]``, ``recurrent_kernel [H, 3H]``, gate blocks **z, r, h** (z is
    gradcells's u, h the candidate c). ``reset_after=True`` (Keras' default): ``bias [2, 3H]``
    (input bias row, recurrent bias row), and the result has ``b_c [2H]``: ``b_ru`` sums the
    two rows' z and r parts, ``b_c = [bias[0]_h, bias[1]_h]``. ``reset_after=False``:
    ``bias [3H]``, result ``b_c [H]``. ``reset_after=None`` reads the variant from ``bias``'s
    rank; pass it explicitly when ``bias`` is None (``use_bias=False``).
    """
    a = checked_arrays(kernel=kernel, recurrent_kernel=recurrent_kernel, bias=bias,
                       optional=("bias",))
    n_hidden = _check_keras_kernels(a, 3)
    if reset_after is None:
        if a["bias"] is None:
            raise ValueError("reset_after must be given when bias is None")
        reset_after = a["bias"].ndim == 2
    elif not isinstance(reset_after, (bool, np.bool_)):
        raise TypeError(f"reset_after must be a bool or None, got {type(reset_after).__name__}")
    if reset_after:
        check_shape("bias", a["bias"], (2, 3 * n_hidden), "2, 3H")
        bias_x, bias_h = (None, None) if a["bias"] is None else a["bias"]
    else:
        check_shape("bias", a["bias"], (3 * n_hidden,), "3H")
        bias_x, bias_h = a["bias"], None
    return gru_converted(gradcells_gru(a["kernel"], a["recurrent_kernel"], bias_x, bias_h,
                                        GRU_KERAS, reset_after=bool(reset_after)),
                         "keras", bool(reset_after))


def gru_to_keras(w_ru: Array, w_c: Array, b_ru: Array, b_c: Array) -> tuple[np.ndarray, ...]:
    """Keras' ``(kernel [I, 3H], recurrent_kernel [H, 3H], bias)``, gate blocks z, r, h, from
    gradcells's GRU. ``b_c [2H]`` (reset after): ``bias [2, 3H]`` with ``bias[0] = [b_u, b_r,
    b_cx]`` and ``bias[1] = [0, 0, b_ch]``, for a layer built with ``reset_after=True``.
    ``b_c [H]`` (reset before): ``bias [3H] = [b_u, b_r, b_c]``, for ``reset_after=False``.
    """
    a = checked_arrays(w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    rows_x, rows_h, bias_x, bias_h, reset_after = framework_gru(
        a["w_ru"], a["w_c"], a["b_ru"], a["b_c"], GRU_KERAS)
    bias = np.stack([bias_x, bias_h]) if reset_after else bias_x
    return np.ascontiguousarray(rows_x), np.ascontiguousarray(rows_h), bias


def rnn_from_keras(kernel: Array, recurrent_kernel: Array, bias: Array | None = None, *,
                   activation: str = "tanh") -> Converted:
    """gradcells ``(w, b)`` from Keras' ``SimpleRNN`` / ``SimpleRNNCell`` weights
    (``layer.get_weights()``).

    Keras: ``kernel [I, H]``, ``recurrent_kernel [H, H]``, ``bias [H]`` (None:
    ``use_bias=False``). One bias: copied. ``activation`` is the layer's (``"tanh"`` or
    ``"relu"``) and lands in ``options``.
    """
    activation = rnn_activation("activation", activation)
    a = checked_arrays(kernel=kernel, recurrent_kernel=recurrent_kernel, bias=bias,
                       optional=("bias",))
    n_hidden = _check_keras_kernels(a, 1)
    check_shape("bias", a["bias"], (n_hidden,), "H")
    bias = sum_or_zeros(a["bias"], None, (n_hidden,), dtype_of(a))
    return rnn_converted(gradcells_rnn(a["kernel"], a["recurrent_kernel"], bias), "keras",
                         activation)


def rnn_to_keras(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """Keras' ``(kernel [I, H], recurrent_kernel [H, H], bias [H])`` from gradcells
    ``(w, b)``: ``layer.set_weights(rnn_to_keras(w, b))`` for a ``SimpleRNN`` built with the
    same ``activation``."""
    a = checked_arrays(w=w, b=b)
    n_in, _ = check_rnn(a["w"], a["b"])
    w = a["w"]
    return new_array(w[:n_in]), new_array(w[n_in:]), a["b"].copy()
