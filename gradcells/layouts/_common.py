"""What every framework's converters share (``gradcells.layouts``): the ``Converted`` tuple
and the conventions it carries, the checking of the arrays a converter takes, the reordering
of gate blocks and the moves between gradcells's weights and a framework's x-rows, h-rows
and biases.

Gate orders are strings of one letter per block: i input, c candidate (ci / g), f forget,
o output for an LSTM; r reset, u update, c candidate for a GRU. Each framework's module
holds its own orders.
"""

from __future__ import annotations

import numpy as np

from .. import _interop
from .._core.arrays import refused_subclass

# Gate orders, one letter per block: i input, c candidate (ci / g), f forget, o output.
LSTM_GRADCELLS = "icfo"


class Converted(tuple):
    """The arrays a ``..._from_X`` converter returns (unpack it as a tuple), carrying the
    framework's conventions: ``framework``, ``options`` (the gradcells keywords that
    reproduce its forward) and ``state_order`` (its order of the recurrent states)."""

    framework: str
    options: dict
    state_order: tuple[str, ...]

    def __new__(cls, arrays, *, framework, options, state_order):
        converted = super().__new__(cls, arrays)
        converted.framework, converted.state_order = framework, tuple(state_order)
        converted.options = dict(options)
        return converted

    def gradcells_states(self, *states):
        """The framework's recurrent states (in ``state_order``) in gradcells's order:
        ``(cs, h)`` for an LSTM, ``(h,)`` for a GRU, ``(c, n, m, h)`` for an sLSTM."""
        if len(states) != len(self.state_order):
            raise TypeError(f"{self.framework} passes {len(self.state_order)} states "
                            f"({', '.join(self.state_order)}), got {len(states)}")
        named = dict(zip(self.state_order, states, strict=True))
        order = ("c", "n", "m", "h") if "n" in named else ("c", "h") if "c" in named else ("h",)
        return tuple(named[k] for k in order)

    def __repr__(self):
        options = ", ".join(f"{k!r}: {_short(v)}" for k, v in self.options.items())
        return (f"Converted(<{len(self)} arrays>, framework={self.framework!r}, "
                f"options={{{options}}}, state_order={self.state_order!r})")


def _short(value):
    """``repr`` of an option, an array (a projection's ``w_proj``) by its shape only."""
    return f"<array {tuple(value.shape)}>" if isinstance(value, np.ndarray) else repr(value)


# The recurrent states each framework passes, in its order.
LSTM_STATE_ORDER = {"torch": ("h", "c"), "keras": ("h", "c"), "onnx": ("h", "c"),
                     "tf_v2": ("c", "h")}


def lstm_converted(arrays, framework):
    return Converted(arrays, framework=framework, options={"forget_bias": 0.0},
                     state_order=LSTM_STATE_ORDER[framework])


def gru_converted(arrays, framework, reset_after):
    return Converted(arrays, framework=framework, options={"reset_after": reset_after},
                     state_order=("h",))


RNN_ACTIVATIONS = ("tanh", "relu")


def rnn_converted(arrays, framework, activation):
    return Converted(arrays, framework=framework, options={"activation": activation},
                     state_order=("h",))


def rnn_activation(name, value):
    """gradcells's activation for a framework's ``tanh``/``relu`` keyword ``name``."""
    if not isinstance(value, str) or value not in RNN_ACTIVATIONS:
        raise ValueError(f"{name} must be 'tanh' or 'relu', got {value!r}")
    return value


def checked_arrays(optional=(), **named):
    """NumPy float arrays of one dtype for the given (name -> array) arguments; those named
    in ``optional`` may be None."""
    out, first = {}, None
    for name, a in named.items():
        if a is None:
            if name not in optional:
                raise TypeError(f"{name} must be an array, got None")
            out[name] = None
            continue
        if refused_subclass(a):
            raise TypeError(f"{name} must be an array, got {type(a).__name__}")
        a = _interop.to_numpy(a)
        if a.dtype.kind != "f":
            raise TypeError(f"{name} must be a floating-point array, got dtype {a.dtype}")
        if first is None:
            first = (name, a.dtype)
        elif a.dtype != first[1]:
            raise TypeError(f"{name} must have the same dtype as {first[0]} ({first[1]}), "
                            f"got {a.dtype}")
        out[name] = a
    return out


def dtype_of(arrays):
    return next(a.dtype for a in arrays.values() if a is not None)


def check_shape(name, a, expected, labels):
    """Require ``a.shape == expected``; ``labels`` spell the expected shape for the message."""
    if a is not None and tuple(a.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape [{labels}] = {tuple(expected)}, "
                         f"got {tuple(a.shape)}")


def check_ndim(name, a, ndim, labels):
    if a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array [{labels}], got shape {a.shape}")


def gate_width(name, size, n_gates, labels):
    """The block width H of an axis of ``size`` holding ``n_gates`` gate blocks."""
    if size % n_gates:
        raise ValueError(f"{name} must have {labels} with a length divisible by {n_gates}, "
                         f"got {size}")
    return size // n_gates


def reorder(a, source, target, axis):
    """``a`` with its gate blocks along ``axis`` moved from order ``source`` to ``target``
    (strings of gate letters); always a new C-contiguous array (``np.concatenate`` keeps
    the layout of transposed inputs such as PyTorch's ``weight_ih.T``)."""
    blocks = dict(zip(source, np.split(a, len(source), axis=axis), strict=True))
    return np.ascontiguousarray(np.concatenate([blocks[g] for g in target], axis=axis))


def zero_array(shape, dtype):
    return np.zeros(shape, dtype=dtype)


def sum_or_zeros(first, second, shape, dtype):
    """The two-bias rule's ``from`` half: their sum (a missing bias counts as zeros)."""
    total = np.zeros(shape, dtype=dtype)
    for a in (first, second):
        if a is not None:
            total += a
    return total


def new_array(a):
    """A new C-contiguous copy of ``a`` (``np.ascontiguousarray`` would return a row slice,
    or the transpose of a single row or column, as a view)."""
    return np.array(a, order="C", copy=True)


def check_lstm(w, b):
    """(I, H) of gradcells's LSTM ``w [I+H, 4H]``, ``b [4H]``."""
    check_ndim("w", w, 2, "I+H, 4H")
    n_hidden = gate_width("w", w.shape[1], 4, "4H columns")
    n_in = w.shape[0] - n_hidden
    if n_in < 0:
        raise ValueError(f"w must have shape [I+H, 4H] with at least H = {n_hidden} rows, "
                         f"got {w.shape}")
    check_shape("b", b, (4 * n_hidden,), "4H")
    return n_in, n_hidden


def check_gru(w_ru, w_c, b_ru, b_c):
    """(I, H, reset_after) of gradcells's GRU weights."""
    check_ndim("w_c", w_c, 2, "I+H, H")
    n_hidden = w_c.shape[1]
    n_in = w_c.shape[0] - n_hidden
    if n_in < 0:
        raise ValueError(f"w_c must have shape [I+H, H] with at least H = {n_hidden} rows, "
                         f"got {w_c.shape}")
    check_shape("w_ru", w_ru, (n_in + n_hidden, 2 * n_hidden), "I+H, 2H")
    check_shape("b_ru", b_ru, (2 * n_hidden,), "2H")
    if b_c.shape not in ((n_hidden,), (2 * n_hidden,)):
        raise ValueError(f"b_c must have shape [H] = ({n_hidden},) (reset before) or [2H] = "
                         f"({2 * n_hidden},) (reset after), got {b_c.shape}")
    return n_in, n_hidden, b_c.shape[0] == 2 * n_hidden


def check_rnn(w, b):
    """(I, H) of gradcells's plain RNN ``w [I+H, H]``, ``b [H]``."""
    check_ndim("w", w, 2, "I+H, H")
    n_hidden = w.shape[1]
    n_in = w.shape[0] - n_hidden
    if n_in < 0:
        raise ValueError(f"w must have shape [I+H, H] with at least H = {n_hidden} rows, "
                         f"got {w.shape}")
    check_shape("b", b, (n_hidden,), "H")
    return n_in, n_hidden


def gradcells_lstm(rows_x, rows_h, bias, order):
    """gradcells ``(w, b)`` from x-rows ``[I, 4H]``, h-rows ``[H, 4H]`` and ``bias [4H]``,
    all with gate blocks in ``order``."""
    w = reorder(np.concatenate([rows_x, rows_h], axis=0), order, LSTM_GRADCELLS, axis=1)
    return w, reorder(bias, order, LSTM_GRADCELLS, axis=0)


def framework_lstmp(w, b, w_proj, order):
    """As ``framework_lstm`` for an LSTM with a projection: ``w [I+P, 4H]``,
    ``w_proj [H, P]``; the h-rows are ``[P, 4H]``."""
    check_ndim("w", w, 2, "I+P, 4H")
    n_hidden = gate_width("w", w.shape[1], 4, "4H columns")
    check_ndim("w_proj", w_proj, 2, "H, P")
    check_shape("w_proj", w_proj, (n_hidden, w_proj.shape[1]), "H, P")
    n_in = w.shape[0] - w_proj.shape[1]
    if n_in < 0:
        raise ValueError(f"w must have shape [I+P, 4H] with at least P = {w_proj.shape[1]} "
                         f"rows, got {w.shape}")
    check_shape("b", b, (4 * n_hidden,), "4H")
    w = reorder(w, LSTM_GRADCELLS, order, axis=1)
    return w[:n_in], w[n_in:], reorder(b, LSTM_GRADCELLS, order, axis=0)


def framework_lstm(w, b, order):
    """x-rows ``[I, 4H]``, h-rows ``[H, 4H]`` and bias ``[4H]`` in ``order`` from gradcells's."""
    n_in, _ = check_lstm(w, b)
    w = reorder(w, LSTM_GRADCELLS, order, axis=1)
    return w[:n_in], w[n_in:], reorder(b, LSTM_GRADCELLS, order, axis=0)


def gradcells_gru(rows_x, rows_h, bias_x, bias_h, order, reset_after):
    """gradcells ``(w_ru, w_c, b_ru, b_c)`` from x-rows ``[I, 3H]``, h-rows ``[H, 3H]`` and
    input/recurrent biases ``[3H]`` (None: zeros), all with gate blocks in ``order``."""
    dtype = rows_x.dtype
    w = reorder(np.concatenate([rows_x, rows_h], axis=0), order, "ruc", axis=1)
    n_hidden = w.shape[1] // 3
    zeros = zero_array((3 * n_hidden,), dtype)
    bias_x = zeros if bias_x is None else reorder(bias_x, order, "ruc", axis=0)
    bias_h = zeros if bias_h is None else reorder(bias_h, order, "ruc", axis=0)
    w_ru = np.ascontiguousarray(w[:, :2 * n_hidden])
    w_c = np.ascontiguousarray(w[:, 2 * n_hidden:])
    b_ru = bias_x[:2 * n_hidden] + bias_h[:2 * n_hidden]
    if reset_after:
        b_c = np.concatenate([bias_x[2 * n_hidden:], bias_h[2 * n_hidden:]])
    else:
        b_c = bias_x[2 * n_hidden:] + bias_h[2 * n_hidden:]
    return w_ru, w_c, b_ru, b_c


def framework_gru(w_ru, w_c, b_ru, b_c, order):
    """x-rows ``[I, 3H]``, h-rows ``[H, 3H]``, input bias ``[3H]`` and recurrent bias
    ``[3H]`` in ``order`` from gradcells's GRU; returns them and ``reset_after``."""
    n_in, n_hidden, reset_after = check_gru(w_ru, w_c, b_ru, b_c)
    w = reorder(np.concatenate([w_ru, w_c], axis=1), "ruc", order, axis=1)
    dtype = w.dtype
    bias_x = np.concatenate([b_ru, b_c[:n_hidden]])
    bias_h = np.concatenate([zero_array((2 * n_hidden,), dtype),
                             b_c[n_hidden:] if reset_after else zero_array((n_hidden,), dtype)])
    return (w[:n_in], w[n_in:], reorder(bias_x, "ruc", order, axis=0),
            reorder(bias_h, "ruc", order, axis=0), reset_after)


def gradcells_rnn(rows_x, rows_h, bias):
    """gradcells ``(w, b)`` from x-rows ``[I, H]``, h-rows ``[H, H]`` and ``bias [H]``."""
    return np.ascontiguousarray(np.concatenate([rows_x, rows_h], axis=0)), bias
