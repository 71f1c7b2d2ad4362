"""Weight converters between gradcells (TensorFlow's block layout) and other frameworks.

gradcells's layouts (docs/spec.md §2, §3):

* LSTM: ``w [I+H, 4H]`` (rows: the x part, then the h part), ``b [4H]``; gate blocks in the
  order **i, ci, f, o**. With a projection (§9.1) ``w [I+P, 4H]`` and ``w_proj [H, P]``;
  PyTorch's ``proj_size`` is the one framework here that has it (``weight_hr = w_projᵀ``),
  and ``lstm_from_torch`` carries ``w_proj`` in ``options``.
* plain RNN: ``w [I+H, H]``, ``b [H]`` (one block, so no gate order); the activation
  ("tanh" or "relu") is a setting of the framework's layer, not a weight.
* GRU: ``w_ru [I+H, 2H]`` (columns r then u), ``w_c [I+H, H]``, ``b_ru [2H]``, and ``b_c [H]``
  (reset before the candidate matmul, TensorFlow's ``GRUBlockCell``) or ``b_c [2H]`` =
  ``[b_cx, b_ch]`` (reset after, ``reset_after=True``: cuDNN, PyTorch, Keras' default).
  The update gate u is what PyTorch calls z and Keras and ONNX call z: ``h = u∘h_prev + (1-u)∘c``
  in all four.

Every function is named ``{lstm,gru,rnn}_{from,to}_<framework>``. ``lstm_from_X`` and
``rnn_from_X`` return ``(w, b)``; ``gru_from_X`` returns ``(w_ru, w_c, b_ru, b_c)``, each
as a ``Converted`` tuple that also carries the framework's conventions, the two things a
caller must not forget:

* ``converted.options``: the keywords that make gradcells's op compute the framework's
  forward: ``{"forget_bias": 0.0}`` for an LSTM (gradcells's default is TensorFlow's 1.0),
  ``{"reset_after": ...}`` for a GRU, ``{"activation": ...}`` for a plain RNN (from the
  ``nonlinearity`` / ``activation`` keyword the converter takes);
* ``converted.state_order`` and ``converted.gradcells_states(*states)``: the framework's
  order of the recurrent states, e.g. PyTorch's ``(h, c)`` against gradcells's ``(cs, h)``.

So ``gc.lstm_sequence(x, *conv.gradcells_states(h0, c0), *conv, **conv.options)`` runs
PyTorch's forward. ``..._to_X`` take the plain arrays and
return the framework's arrays in its own order, so that ``lstm_from_torch(*cell.parameters())``
and ``layer.set_weights(lstm_to_keras(w, b))`` work as written.

**The two-bias rule.** Where a framework has two biases for a gate (an input and a recurrent
one) and gradcells one, ``from`` sums them and ``to`` puts the sum in the first (input) bias
and zeros in the second. The reset-after GRU candidate is the exception that proves the rule:
its recurrent bias sits inside ``r∘(...)``, so it cannot be summed and gradcells keeps both
(``b_c [2H]``).

The converted weights reproduce the framework's forward with gradcells's ``forget_bias=0``
(none of these frameworks adds a constant to the forget gate at run time).

Inputs may be NumPy arrays or anything ``numpy.asarray`` takes; PyTorch tensors (even with
``requires_grad``) are detached and copied to the host first. Outputs are new, C-contiguous
NumPy arrays of the inputs' (common) float dtype; inputs are never modified. Shapes are
checked, and a mismatch raises ``ValueError`` naming the argument with the expected and
actual shape.

There is no ``gru_{from,to}_tf_v2``: TensorFlow has no second GRU block op (its
``GRUBlockCell`` already uses gradcells's layout, reset before), so there is nothing to convert.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _interop
from ._core.arrays import refused_subclass
from ._core.specs import PEEPHOLES
from ._core.types import Array, GRUWeights, LSTMWeights, RNNWeights

# Gate orders, one letter per block: i input, c candidate (ci / g), f forget, o output.
_LSTM_GRADCELLS = "icfo"
_LSTM_TORCH = "ifco"      # i, f, g, o
_LSTM_KERAS = "ifco"      # i, f, c, o
_LSTM_ONNX = "iofc"       # i, o, f, c
_LSTM_TF_V2 = "ifco"      # BlockLSTMV2: i, f, ci, o

__all__ = [
    "Converted",
    "lstm_from_torch", "lstm_to_torch", "lstm_from_keras", "lstm_to_keras",
    "lstm_from_onnx", "lstm_to_onnx", "lstm_from_tf_v2", "lstm_to_tf_v2",
    "gru_from_torch", "gru_to_torch", "gru_from_keras", "gru_to_keras",
    "gru_from_onnx", "gru_to_onnx",
    "rnn_from_torch", "rnn_to_torch", "rnn_from_keras", "rnn_to_keras",
    "rnn_from_onnx", "rnn_to_onnx",
    "ConvertedStack", "stack_from_torch", "stack_to_torch",
]


# ---------------------------------------------------------------------------------------------
# The conventions a converted weight set carries


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
        ``(cs, h)`` for an LSTM, ``(h,)`` for a GRU."""
        if len(states) != len(self.state_order):
            raise TypeError(f"{self.framework} passes {len(self.state_order)} states "
                            f"({', '.join(self.state_order)}), got {len(states)}")
        named = dict(zip(self.state_order, states))
        return (named["c"], named["h"]) if "c" in named else (named["h"],)

    def __repr__(self):
        options = ", ".join(f"{k!r}: {_short(v)}" for k, v in self.options.items())
        return (f"Converted(<{len(self)} arrays>, framework={self.framework!r}, "
                f"options={{{options}}}, state_order={self.state_order!r})")


def _short(value):
    """``repr`` of an option, an array (a projection's ``w_proj``) by its shape only."""
    return f"<array {tuple(value.shape)}>" if isinstance(value, np.ndarray) else repr(value)


# The recurrent states each framework passes, in its order.
_LSTM_STATE_ORDER = {"torch": ("h", "c"), "keras": ("h", "c"), "onnx": ("h", "c"),
                     "tf_v2": ("c", "h")}


def _lstm_converted(arrays, framework):
    return Converted(arrays, framework=framework, options={"forget_bias": 0.0},
                     state_order=_LSTM_STATE_ORDER[framework])


def _gru_converted(arrays, framework, reset_after):
    return Converted(arrays, framework=framework, options={"reset_after": reset_after},
                     state_order=("h",))


def __dir__():
    return __all__


# ---------------------------------------------------------------------------------------------
# Checking and reordering


def _arrays(optional=(), **named):
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


def _dtype(arrays):
    return next(a.dtype for a in arrays.values() if a is not None)


def _shape(name, a, expected, labels):
    """Require ``a.shape == expected``; ``labels`` spell the expected shape for the message."""
    if a is not None and tuple(a.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape [{labels}] = {tuple(expected)}, "
                         f"got {tuple(a.shape)}")


def _ndim(name, a, ndim, labels):
    if a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array [{labels}], got shape {a.shape}")


def _gates(name, size, n_gates, labels):
    """The block width H of an axis of ``size`` holding ``n_gates`` gate blocks."""
    if size % n_gates:
        raise ValueError(f"{name} must have {labels} with a length divisible by {n_gates}, "
                         f"got {size}")
    return size // n_gates


def _reorder(a, source, target, axis):
    """``a`` with its gate blocks along ``axis`` moved from order ``source`` to ``target``
    (strings of gate letters); always a new C-contiguous array (``np.concatenate`` keeps
    the layout of transposed inputs such as PyTorch's ``weight_ih.T``)."""
    blocks = dict(zip(source, np.split(a, len(source), axis=axis)))
    return np.ascontiguousarray(np.concatenate([blocks[g] for g in target], axis=axis))


def _zeros(shape, dtype):
    return np.zeros(shape, dtype=dtype)


def _sum_or_zeros(first, second, shape, dtype):
    """The two-bias rule's ``from`` half: their sum (a missing bias counts as zeros)."""
    total = np.zeros(shape, dtype=dtype)
    for a in (first, second):
        if a is not None:
            total += a
    return total


def _single_direction(name, a, labels):
    """``a[0]`` of an ONNX ``[num_directions, ...]`` array with one direction."""
    if a.ndim >= 1 and a.shape[0] != 1:
        raise ValueError(
            f"{name} must have num_directions = 1 in [{labels}], got shape {a.shape}; "
            f"convert a bidirectional layer one direction at a time ({name}[d:d+1])")
    return a[0]


def _check_torch(a, n_gates):
    """Check PyTorch's ``weight_ih [kH, I]``, ``weight_hh [kH, H]``, ``bias_ih, bias_hh [kH]``
    (k = ``n_gates``); return H."""
    gates = f"{n_gates}H" if n_gates > 1 else "H"
    _ndim("weight_hh", a["weight_hh"], 2, f"{gates}, H")
    n_hidden = a["weight_hh"].shape[1]
    _shape("weight_hh", a["weight_hh"], (n_gates * n_hidden, n_hidden), f"{gates}, H")
    _ndim("weight_ih", a["weight_ih"], 2, f"{gates}, I")
    _shape("weight_ih", a["weight_ih"], (n_gates * n_hidden, a["weight_ih"].shape[1]),
           f"{gates}, I")
    for name in ("bias_ih", "bias_hh"):
        _shape(name, a[name], (n_gates * n_hidden,), gates)
    return n_hidden


def _check_keras_kernels(a, n_gates):
    """Check Keras' ``kernel [I, kH]`` and ``recurrent_kernel [H, kH]`` (k = ``n_gates``);
    return H."""
    gates = f"{n_gates}H" if n_gates > 1 else "H"
    _ndim("recurrent_kernel", a["recurrent_kernel"], 2, f"H, {gates}")
    n_hidden = a["recurrent_kernel"].shape[0]
    _shape("recurrent_kernel", a["recurrent_kernel"], (n_hidden, n_gates * n_hidden),
           f"H, {gates}")
    _ndim("kernel", a["kernel"], 2, f"I, {gates}")
    _shape("kernel", a["kernel"], (a["kernel"].shape[0], n_gates * n_hidden), f"I, {gates}")
    return n_hidden


def _check_onnx(a, n_gates):
    """Check ONNX's ``W [1, kH, I]``, ``R [1, kH, H]`` and ``B [1, 2kH]`` (k = ``n_gates``);
    return ``(H, W[0])``."""
    gates = f"{n_gates}H" if n_gates > 1 else "H"
    _ndim("R", a["R"], 3, f"1, {gates}, H")
    n_hidden = a["R"].shape[2]
    _shape("R", a["R"], (1, n_gates * n_hidden, n_hidden), f"1, {gates}, H")
    _ndim("W", a["W"], 3, f"1, {gates}, I")
    w_x = _single_direction("W", a["W"], f"num_directions, {gates}, I")
    _shape("W", a["W"], (1, n_gates * n_hidden, w_x.shape[1]), f"1, {gates}, I")
    _shape("B", a["B"], (1, 2 * n_gates * n_hidden), f"1, {2 * n_gates}H")
    return n_hidden, w_x


def _check_lstm(w, b):
    """(I, H) of gradcells's LSTM ``w [I+H, 4H]``, ``b [4H]``."""
    _ndim("w", w, 2, "I+H, 4H")
    n_hidden = _gates("w", w.shape[1], 4, "4H columns")
    n_in = w.shape[0] - n_hidden
    if n_in < 0:
        raise ValueError(f"w must have shape [I+H, 4H] with at least H = {n_hidden} rows, "
                         f"got {w.shape}")
    _shape("b", b, (4 * n_hidden,), "4H")
    return n_in, n_hidden


def _check_gru(w_ru, w_c, b_ru, b_c):
    """(I, H, reset_after) of gradcells's GRU weights."""
    _ndim("w_c", w_c, 2, "I+H, H")
    n_hidden = w_c.shape[1]
    n_in = w_c.shape[0] - n_hidden
    if n_in < 0:
        raise ValueError(f"w_c must have shape [I+H, H] with at least H = {n_hidden} rows, "
                         f"got {w_c.shape}")
    _shape("w_ru", w_ru, (n_in + n_hidden, 2 * n_hidden), "I+H, 2H")
    _shape("b_ru", b_ru, (2 * n_hidden,), "2H")
    if b_c.shape not in ((n_hidden,), (2 * n_hidden,)):
        raise ValueError(f"b_c must have shape [H] = ({n_hidden},) (reset before) or [2H] = "
                         f"({2 * n_hidden},) (reset after), got {b_c.shape}")
    return n_in, n_hidden, b_c.shape[0] == 2 * n_hidden


def _gradcells_lstm(rows_x, rows_h, bias, order):
    """gradcells ``(w, b)`` from x-rows ``[I, 4H]``, h-rows ``[H, 4H]`` and ``bias [4H]``,
    all with gate blocks in ``order``."""
    w = _reorder(np.concatenate([rows_x, rows_h], axis=0), order, _LSTM_GRADCELLS, axis=1)
    return w, _reorder(bias, order, _LSTM_GRADCELLS, axis=0)


def _framework_lstmp(w, b, w_proj, order):
    """As ``_framework_lstm`` for an LSTM with a projection: ``w [I+P, 4H]``,
    ``w_proj [H, P]``; the h-rows are ``[P, 4H]``."""
    _ndim("w", w, 2, "I+P, 4H")
    n_hidden = _gates("w", w.shape[1], 4, "4H columns")
    _ndim("w_proj", w_proj, 2, "H, P")
    _shape("w_proj", w_proj, (n_hidden, w_proj.shape[1]), "H, P")
    n_in = w.shape[0] - w_proj.shape[1]
    if n_in < 0:
        raise ValueError(f"w must have shape [I+P, 4H] with at least P = {w_proj.shape[1]} "
                         f"rows, got {w.shape}")
    _shape("b", b, (4 * n_hidden,), "4H")
    w = _reorder(w, _LSTM_GRADCELLS, order, axis=1)
    return w[:n_in], w[n_in:], _reorder(b, _LSTM_GRADCELLS, order, axis=0)


def _framework_lstm(w, b, order):
    """x-rows ``[I, 4H]``, h-rows ``[H, 4H]`` and bias ``[4H]`` in ``order`` from gradcells's."""
    n_in, _ = _check_lstm(w, b)
    w = _reorder(w, _LSTM_GRADCELLS, order, axis=1)
    return w[:n_in], w[n_in:], _reorder(b, _LSTM_GRADCELLS, order, axis=0)


# ---------------------------------------------------------------------------------------------
# LSTM


def _check_torch_lstm(a):
    """Check PyTorch's LSTM arrays, with or without ``weight_hr [P, H]`` (then
    ``weight_hh [4H, P]``); return H."""
    if a["weight_hr"] is None:
        return _check_torch(a, 4)
    _ndim("weight_hh", a["weight_hh"], 2, "4H, P")
    _ndim("weight_hr", a["weight_hr"], 2, "P, H")
    n_hidden = _gates("weight_hh", a["weight_hh"].shape[0], 4, "4H rows")
    n_proj = a["weight_hh"].shape[1]
    _shape("weight_hr", a["weight_hr"], (n_proj, n_hidden), "P, H")
    _ndim("weight_ih", a["weight_ih"], 2, "4H, I")
    _shape("weight_ih", a["weight_ih"], (4 * n_hidden, a["weight_ih"].shape[1]), "4H, I")
    for name in ("bias_ih", "bias_hh"):
        _shape(name, a[name], (4 * n_hidden,), "4H")
    return n_hidden


def lstm_from_torch(weight_ih: Array, weight_hh: Array, bias_ih: Array | None = None,
                    bias_hh: Array | None = None, weight_hr: Array | None = None) -> Converted:
    """gradcells ``(w, b)`` from PyTorch's ``nn.LSTM`` (one layer, one direction) or
    ``nn.LSTMCell``.

    PyTorch: ``weight_ih [4H, I]``, ``weight_hh [4H, H]``, ``bias_ih, bias_hh [4H]`` (None:
    ``bias=False``), gate blocks **i, f, g, o** (g is the candidate ci). Two biases:
    ``b = bias_ih + bias_hh``. ``lstm_from_torch(*cell.parameters())`` works as written.

    A module with ``proj_size=P`` (docs/spec.md §9.1) also has ``weight_hr [P, H]``, and its
    ``weight_hh`` is ``[4H, P]``; the result is still the two arrays ``(w [I+P, 4H], b)``,
    and ``options`` gains ``w_proj = weight_hrᵀ [H, P]`` (PyTorch does not clip the
    projection), so ``gc.lstm_sequence(x, *conv.gradcells_states(h0, c0), *conv,
    **conv.options)`` runs the module. ``lstm_from_torch(*module.parameters())`` works for it
    too (its parameter order ends with ``weight_hr``).
    """
    a = _arrays(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh,
                weight_hr=weight_hr, optional=("bias_ih", "bias_hh", "weight_hr"))
    n_hidden = _check_torch_lstm(a)
    bias = _sum_or_zeros(a["bias_ih"], a["bias_hh"], (4 * n_hidden,), _dtype(a))
    conv = _lstm_converted(
        _gradcells_lstm(a["weight_ih"].T, a["weight_hh"].T, bias, _LSTM_TORCH), "torch")
    if a["weight_hr"] is not None:
        conv.options["w_proj"] = _new(a["weight_hr"].T)
    return conv


def lstm_to_torch(w: Array, b: Array, w_proj: Array | None = None) -> tuple[np.ndarray, ...]:
    """PyTorch's ``(weight_ih [4H, I], weight_hh [4H, H], bias_ih [4H], bias_hh [4H])``, gate
    blocks i, f, g, o, from gradcells ``(w, b)``. Two biases: ``bias_ih = b`` (reordered),
    ``bias_hh = 0``.

    With a projection ``w_proj [H, P]`` (docs/spec.md §9.1; ``w`` is then ``[I+P, 4H]``) the
    result has a fifth array, ``weight_hr = w_projᵀ [P, H]``, and ``weight_hh`` is
    ``[4H, P]``: the parameters of an ``nn.LSTM(I, H, proj_size=P)`` in its order. PyTorch
    has no projection clip, so a gradcells ``proj_clip`` has no PyTorch equivalent.
    """
    a = _arrays(w=w, b=b, w_proj=w_proj, optional=("w_proj",))
    if a["w_proj"] is None:
        rows_x, rows_h, bias = _framework_lstm(a["w"], a["b"], _LSTM_TORCH)
    else:
        rows_x, rows_h, bias = _framework_lstmp(a["w"], a["b"], a["w_proj"], _LSTM_TORCH)
    out = (np.ascontiguousarray(rows_x.T), np.ascontiguousarray(rows_h.T), bias,
           _zeros(bias.shape, bias.dtype))
    return out if a["w_proj"] is None else (*out, _new(a["w_proj"].T))


def lstm_from_keras(kernel: Array, recurrent_kernel: Array, bias: Array | None = None) -> Converted:
    """gradcells ``(w, b)`` from Keras' ``LSTM`` / ``LSTMCell`` weights
    (``layer.get_weights()``).

    Keras: ``kernel [I, 4H]``, ``recurrent_kernel [H, 4H]``, ``bias [4H]`` (None:
    ``use_bias=False``), gate blocks **i, f, c, o**. One bias: copied (``unit_forget_bias``
    only initialises it; nothing is added at run time).
    """
    a = _arrays(kernel=kernel, recurrent_kernel=recurrent_kernel, bias=bias, optional=("bias",))
    n_hidden = _check_keras_kernels(a, 4)
    _shape("bias", a["bias"], (4 * n_hidden,), "4H")
    bias = _sum_or_zeros(a["bias"], None, (4 * n_hidden,), _dtype(a))
    return _lstm_converted(
        _gradcells_lstm(a["kernel"], a["recurrent_kernel"], bias, _LSTM_KERAS), "keras")


def lstm_to_keras(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """Keras' ``(kernel [I, 4H], recurrent_kernel [H, 4H], bias [4H])``, gate blocks
    i, f, c, o, from gradcells ``(w, b)``: ``layer.set_weights(lstm_to_keras(w, b))``."""
    a = _arrays(w=w, b=b)
    rows_x, rows_h, bias = _framework_lstm(a["w"], a["b"], _LSTM_KERAS)
    return np.ascontiguousarray(rows_x), np.ascontiguousarray(rows_h), bias


def lstm_from_onnx(W: Array, R: Array, B: Array | None = None, P: Array | None = None) -> Converted:
    """gradcells weights from an ONNX ``LSTM`` node (one direction).

    ONNX: ``W [1, 4H, I]``, ``R [1, 4H, H]``, ``B [1, 8H]`` = ``[Wb, Rb]`` (optional, zeros),
    ``P [1, 3H]`` peepholes in the order **i, o, f** (optional); gate blocks **i, o, f, c**.
    The node must use the default activations (sigmoid, tanh, tanh), ``input_forget=0`` and
    no ``clip`` (ONNX clips gate pre-activations, not the cell state). Two biases:
    ``b = Wb + Rb``.

    Returns ``(w, b)``, or ``(w, b, wci, wcf, wco)`` when ``P`` is given.
    """
    a = _arrays(W=W, R=R, B=B, P=P, optional=("B", "P"))
    n_hidden, w_x = _check_onnx(a, 4)
    _shape("P", a["P"], (1, 3 * n_hidden), "1, 3H")
    bias = _zeros((4 * n_hidden,), _dtype(a))
    if a["B"] is not None:
        bias = _sum_or_zeros(a["B"][0, :4 * n_hidden], a["B"][0, 4 * n_hidden:],
                             (4 * n_hidden,), _dtype(a))
    w, b = _gradcells_lstm(w_x.T, a["R"][0].T, bias, _LSTM_ONNX)
    if a["P"] is None:
        return _lstm_converted((w, b), "onnx")
    p_i, p_o, p_f = (a["P"][0, k * n_hidden:(k + 1) * n_hidden].copy() for k in range(3))
    return _lstm_converted((w, b, p_i, p_f, p_o), "onnx")


def lstm_to_onnx(w: Array, b: Array, wci: Array | None = None, wcf: Array | None = None,
                 wco: Array | None = None) -> tuple[np.ndarray, ...]:
    """An ONNX ``LSTM`` node's ``(W [1, 4H, I], R [1, 4H, H], B [1, 8H])``, gate blocks
    i, o, f, c, from gradcells ``(w, b)``; with peepholes (all three) also ``P [1, 3H]``
    (i, o, f). Two biases: ``Wb = b`` (reordered), ``Rb = 0``."""
    a = _arrays(w=w, b=b, wci=wci, wcf=wcf, wco=wco, optional=PEEPHOLES)
    rows_x, rows_h, bias = _framework_lstm(a["w"], a["b"], _LSTM_ONNX)
    n_hidden = bias.shape[0] // 4
    peepholes = [a[k] for k in PEEPHOLES]
    given = [p is not None for p in peepholes]
    if any(given) and not all(given):
        raise ValueError("peepholes need all of wci, wcf and wco or none")
    W = np.ascontiguousarray(rows_x.T)[None]
    R = np.ascontiguousarray(rows_h.T)[None]
    B = np.concatenate([bias, _zeros(bias.shape, bias.dtype)])[None]
    if not any(given):
        return W, R, B
    for name in PEEPHOLES:
        _shape(name, a[name], (n_hidden,), "H")
    P = np.concatenate([a["wci"], a["wco"], a["wcf"]])[None]
    return W, R, B, P


def lstm_from_tf_v2(w: Array, b: Array) -> Converted:
    """gradcells ``(w, b)`` from TensorFlow's ``BlockLSTMV2`` weights.

    ``BlockLSTMV2``: ``w [I+H, 4H]``, ``b [4H]``, gate blocks **i, f, ci, o** (``BlockLSTM``,
    ``LSTMBlockCell`` and gradcells use i, ci, f, o). ``BlockLSTMV2`` has no ``forget_bias``
    (it is 0) and defaults to ``cell_clip=0`` (none). Peephole vectors ``wci, wcf, wco`` mean
    the same in both and need no conversion.
    """
    a = _arrays(w=w, b=b)
    _check_lstm(a["w"], a["b"])
    return _lstm_converted((_reorder(a["w"], _LSTM_TF_V2, _LSTM_GRADCELLS, axis=1),
                            _reorder(a["b"], _LSTM_TF_V2, _LSTM_GRADCELLS, axis=0)), "tf_v2")


def lstm_to_tf_v2(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """``BlockLSTMV2``'s ``(w [I+H, 4H], b [4H])``, gate blocks i, f, ci, o, from gradcells
    ``(w, b)``."""
    a = _arrays(w=w, b=b)
    _check_lstm(a["w"], a["b"])
    return (_reorder(a["w"], _LSTM_GRADCELLS, _LSTM_TF_V2, axis=1),
            _reorder(a["b"], _LSTM_GRADCELLS, _LSTM_TF_V2, axis=0))


# ---------------------------------------------------------------------------------------------
# GRU
#
# Each framework's gate blocks, named by gradcells's letters: r reset, u update, c candidate.

_GRU_TORCH = "ruc"        # r, z, n
_GRU_KERAS = "urc"        # z, r, h
_GRU_ONNX = "urc"         # z, r, h


def _gradcells_gru(rows_x, rows_h, bias_x, bias_h, order, reset_after):
    """gradcells ``(w_ru, w_c, b_ru, b_c)`` from x-rows ``[I, 3H]``, h-rows ``[H, 3H]`` and
    input/recurrent biases ``[3H]`` (None: zeros), all with gate blocks in ``order``."""
    dtype = rows_x.dtype
    w = _reorder(np.concatenate([rows_x, rows_h], axis=0), order, "ruc", axis=1)
    n_hidden = w.shape[1] // 3
    zeros = _zeros((3 * n_hidden,), dtype)
    bias_x = zeros if bias_x is None else _reorder(bias_x, order, "ruc", axis=0)
    bias_h = zeros if bias_h is None else _reorder(bias_h, order, "ruc", axis=0)
    w_ru = np.ascontiguousarray(w[:, :2 * n_hidden])
    w_c = np.ascontiguousarray(w[:, 2 * n_hidden:])
    b_ru = bias_x[:2 * n_hidden] + bias_h[:2 * n_hidden]
    if reset_after:
        b_c = np.concatenate([bias_x[2 * n_hidden:], bias_h[2 * n_hidden:]])
    else:
        b_c = bias_x[2 * n_hidden:] + bias_h[2 * n_hidden:]
    return w_ru, w_c, b_ru, b_c


def _framework_gru(w_ru, w_c, b_ru, b_c, order):
    """x-rows ``[I, 3H]``, h-rows ``[H, 3H]``, input bias ``[3H]`` and recurrent bias
    ``[3H]`` in ``order`` from gradcells's GRU; returns them and ``reset_after``."""
    n_in, n_hidden, reset_after = _check_gru(w_ru, w_c, b_ru, b_c)
    w = _reorder(np.concatenate([w_ru, w_c], axis=1), "ruc", order, axis=1)
    dtype = w.dtype
    bias_x = np.concatenate([b_ru, b_c[:n_hidden]])
    bias_h = np.concatenate([_zeros((2 * n_hidden,), dtype),
                             b_c[n_hidden:] if reset_after else _zeros((n_hidden,), dtype)])
    return (w[:n_in], w[n_in:], _reorder(bias_x, "ruc", order, axis=0),
            _reorder(bias_h, "ruc", order, axis=0), reset_after)


def gru_from_torch(weight_ih: Array, weight_hh: Array, bias_ih: Array | None = None,
                   bias_hh: Array | None = None) -> Converted:
    """gradcells reset-after GRU ``(w_ru, w_c, b_ru, b_c [2H])`` from PyTorch's ``nn.GRU``
    (one layer, one direction) or ``nn.GRUCell``; use it with ``reset_after=True``.

    PyTorch: ``weight_ih [3H, I]``, ``weight_hh [3H, H]``, ``bias_ih, bias_hh [3H]`` (None:
    ``bias=False``), gate blocks **r, z, n** (z is gradcells's u, n the candidate c), reset
    after: ``n = tanh(W_in x + b_in + r∘(W_hn h + b_hn))``. Two biases: ``b_ru`` sums the
    r and z parts; ``b_c = [b_in, b_hn]`` keeps both.
    """
    a = _arrays(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh,
                optional=("bias_ih", "bias_hh"))
    _check_torch(a, 3)
    return _gru_converted(_gradcells_gru(a["weight_ih"].T, a["weight_hh"].T, a["bias_ih"],
                                         a["bias_hh"], _GRU_TORCH, reset_after=True),
                          "torch", True)


def gru_to_torch(w_ru: Array, w_c: Array, b_ru: Array, b_c: Array) -> tuple[np.ndarray, ...]:
    """PyTorch's ``(weight_ih [3H, I], weight_hh [3H, H], bias_ih [3H], bias_hh [3H])``, gate
    blocks r, z, n, from a gradcells reset-after GRU (``b_c [2H]``). Two biases:
    ``bias_ih = [b_ru, b_cx]``, ``bias_hh = [0, 0, b_ch]``.

    A reset-before GRU (``b_c [H]``) has no PyTorch equivalent: ``ValueError``.
    """
    a = _arrays(w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    rows_x, rows_h, bias_x, bias_h, reset_after = _framework_gru(
        a["w_ru"], a["w_c"], a["b_ru"], a["b_c"], _GRU_TORCH)
    if not reset_after:
        n_hidden = a["w_c"].shape[1]
        raise ValueError(
            f"b_c must have shape [2H] = ({2 * n_hidden},): PyTorch's GRU resets after the "
            f"candidate matmul, and a reset-before GRU (b_c of shape [H] = ({n_hidden},)) "
            "has no PyTorch equivalent")
    return (np.ascontiguousarray(rows_x.T), np.ascontiguousarray(rows_h.T), bias_x, bias_h)


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
    a = _arrays(kernel=kernel, recurrent_kernel=recurrent_kernel, bias=bias, optional=("bias",))
    n_hidden = _check_keras_kernels(a, 3)
    if reset_after is None:
        if a["bias"] is None:
            raise ValueError("reset_after must be given when bias is None")
        reset_after = a["bias"].ndim == 2
    elif not isinstance(reset_after, (bool, np.bool_)):
        raise TypeError(f"reset_after must be a bool or None, got {type(reset_after).__name__}")
    if reset_after:
        _shape("bias", a["bias"], (2, 3 * n_hidden), "2, 3H")
        bias_x, bias_h = (None, None) if a["bias"] is None else a["bias"]
    else:
        _shape("bias", a["bias"], (3 * n_hidden,), "3H")
        bias_x, bias_h = a["bias"], None
    return _gru_converted(_gradcells_gru(a["kernel"], a["recurrent_kernel"], bias_x, bias_h,
                                         _GRU_KERAS, reset_after=bool(reset_after)),
                          "keras", bool(reset_after))


def gru_to_keras(w_ru: Array, w_c: Array, b_ru: Array, b_c: Array) -> tuple[np.ndarray, ...]:
    """Keras' ``(kernel [I, 3H], recurrent_kernel [H, 3H], bias)``, gate blocks z, r, h, from
    gradcells's GRU. ``b_c [2H]`` (reset after): ``bias [2, 3H]`` with ``bias[0] = [b_u, b_r,
    b_cx]`` and ``bias[1] = [0, 0, b_ch]``, for a layer built with ``reset_after=True``.
    ``b_c [H]`` (reset before): ``bias [3H] = [b_u, b_r, b_c]``, for ``reset_after=False``.
    """
    a = _arrays(w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    rows_x, rows_h, bias_x, bias_h, reset_after = _framework_gru(
        a["w_ru"], a["w_c"], a["b_ru"], a["b_c"], _GRU_KERAS)
    bias = np.stack([bias_x, bias_h]) if reset_after else bias_x
    return np.ascontiguousarray(rows_x), np.ascontiguousarray(rows_h), bias


def gru_from_onnx(W: Array, R: Array, B: Array | None = None, *,
                  linear_before_reset: int = 0) -> Converted:
    """gradcells ``(w_ru, w_c, b_ru, b_c)`` from an ONNX ``GRU`` node (one direction).

    ONNX: ``W [1, 3H, I]``, ``R [1, 3H, H]``, ``B [1, 6H]`` = ``[Wb, Rb]`` (optional, zeros),
    gate blocks **z, r, h** (z is gradcells's u); default activations (sigmoid, tanh), no
    ``clip``. ``linear_before_reset=0`` (ONNX's default) is reset before: ``b_c [H] = Wb_h +
    Rb_h``. ``linear_before_reset=1`` is reset after: ``b_c [2H] = [Wb_h, Rb_h]``. Two biases:
    ``b_ru`` sums ``Wb`` and ``Rb``'s z and r parts.
    """
    a = _arrays(W=W, R=R, B=B, optional=("B",))
    if linear_before_reset not in (0, 1) or isinstance(linear_before_reset, float):
        raise ValueError(f"linear_before_reset must be 0 or 1, got {linear_before_reset!r}")
    n_hidden, w_x = _check_onnx(a, 3)
    bias_x = bias_h = None
    if a["B"] is not None:
        bias_x, bias_h = a["B"][0, :3 * n_hidden], a["B"][0, 3 * n_hidden:]
    return _gru_converted(_gradcells_gru(w_x.T, a["R"][0].T, bias_x, bias_h, _GRU_ONNX,
                                         reset_after=bool(linear_before_reset)),
                          "onnx", bool(linear_before_reset))


def gru_to_onnx(w_ru: Array, w_c: Array, b_ru: Array, b_c: Array) -> tuple[np.ndarray, ...]:
    """An ONNX ``GRU`` node's ``(W [1, 3H, I], R [1, 3H, H], B [1, 6H])``, gate blocks
    z, r, h, from gradcells's GRU. Two biases: ``Wb = [b_u, b_r, b_cx]``, ``Rb = [0, 0, b_ch]``
    (``b_ch = 0`` reset before). Set the node's ``linear_before_reset=1`` when ``b_c`` has
    length 2H (reset after) and leave it 0 when ``b_c`` has length H.
    """
    a = _arrays(w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    rows_x, rows_h, bias_x, bias_h, _ = _framework_gru(
        a["w_ru"], a["w_c"], a["b_ru"], a["b_c"], _GRU_ONNX)
    return (np.ascontiguousarray(rows_x.T)[None], np.ascontiguousarray(rows_h.T)[None],
            np.concatenate([bias_x, bias_h])[None])


# ---------------------------------------------------------------------------------------------
# The plain RNN cell
#
# One block of H columns, so no gate order: only the transposes, the two-bias rule and the
# activation, a setting of the framework's layer that the converter carries in ``options``.

_RNN_ACTIVATIONS = ("tanh", "relu")
_ONNX_ACTIVATIONS = {"Tanh": "tanh", "Relu": "relu"}


def _rnn_converted(arrays, framework, activation):
    return Converted(arrays, framework=framework, options={"activation": activation},
                     state_order=("h",))


def _rnn_activation(name, value):
    """gradcells's activation for a framework's ``tanh``/``relu`` keyword ``name``."""
    if not isinstance(value, str) or value not in _RNN_ACTIVATIONS:
        raise ValueError(f"{name} must be 'tanh' or 'relu', got {value!r}")
    return value


def _check_rnn(w, b):
    """(I, H) of gradcells's plain RNN ``w [I+H, H]``, ``b [H]``."""
    _ndim("w", w, 2, "I+H, H")
    n_hidden = w.shape[1]
    n_in = w.shape[0] - n_hidden
    if n_in < 0:
        raise ValueError(f"w must have shape [I+H, H] with at least H = {n_hidden} rows, "
                         f"got {w.shape}")
    _shape("b", b, (n_hidden,), "H")
    return n_in, n_hidden


def _new(a):
    """A new C-contiguous copy of ``a`` (``np.ascontiguousarray`` would return a row slice,
    or the transpose of a single row or column, as a view)."""
    return np.array(a, order="C", copy=True)


def _gradcells_rnn(rows_x, rows_h, bias):
    """gradcells ``(w, b)`` from x-rows ``[I, H]``, h-rows ``[H, H]`` and ``bias [H]``."""
    return np.ascontiguousarray(np.concatenate([rows_x, rows_h], axis=0)), bias


def rnn_from_torch(weight_ih: Array, weight_hh: Array, bias_ih: Array | None = None,
                   bias_hh: Array | None = None, *, nonlinearity: str = "tanh") -> Converted:
    """gradcells ``(w, b)`` from PyTorch's ``nn.RNN`` (one layer, one direction) or
    ``nn.RNNCell``.

    PyTorch: ``weight_ih [H, I]``, ``weight_hh [H, H]``, ``bias_ih, bias_hh [H]`` (None:
    ``bias=False``). Two biases: ``b = bias_ih + bias_hh``. ``nonlinearity`` is the module's
    (``"tanh"`` or ``"relu"``) and lands in ``options`` as ``activation``:
    ``gc.rnn_cell(x, h, *conv, **conv.options)`` runs the module's forward.
    """
    activation = _rnn_activation("nonlinearity", nonlinearity)
    a = _arrays(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh,
                optional=("bias_ih", "bias_hh"))
    n_hidden = _check_torch(a, 1)
    bias = _sum_or_zeros(a["bias_ih"], a["bias_hh"], (n_hidden,), _dtype(a))
    return _rnn_converted(_gradcells_rnn(a["weight_ih"].T, a["weight_hh"].T, bias), "torch",
                          activation)


def rnn_to_torch(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """PyTorch's ``(weight_ih [H, I], weight_hh [H, H], bias_ih [H], bias_hh [H])`` from
    gradcells ``(w, b)``. Two biases: ``bias_ih = b``, ``bias_hh = 0``. The activation is the
    module's ``nonlinearity``, set when it is built."""
    a = _arrays(w=w, b=b)
    n_in, _ = _check_rnn(a["w"], a["b"])
    w = a["w"]
    return _new(w[:n_in].T), _new(w[n_in:].T), a["b"].copy(), _zeros(a["b"].shape, a["b"].dtype)


def rnn_from_keras(kernel: Array, recurrent_kernel: Array, bias: Array | None = None, *,
                   activation: str = "tanh") -> Converted:
    """gradcells ``(w, b)`` from Keras' ``SimpleRNN`` / ``SimpleRNNCell`` weights
    (``layer.get_weights()``).

    Keras: ``kernel [I, H]``, ``recurrent_kernel [H, H]``, ``bias [H]`` (None:
    ``use_bias=False``). One bias: copied. ``activation`` is the layer's (``"tanh"`` or
    ``"relu"``) and lands in ``options``.
    """
    activation = _rnn_activation("activation", activation)
    a = _arrays(kernel=kernel, recurrent_kernel=recurrent_kernel, bias=bias, optional=("bias",))
    n_hidden = _check_keras_kernels(a, 1)
    _shape("bias", a["bias"], (n_hidden,), "H")
    bias = _sum_or_zeros(a["bias"], None, (n_hidden,), _dtype(a))
    return _rnn_converted(_gradcells_rnn(a["kernel"], a["recurrent_kernel"], bias), "keras",
                          activation)


def rnn_to_keras(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """Keras' ``(kernel [I, H], recurrent_kernel [H, H], bias [H])`` from gradcells
    ``(w, b)``: ``layer.set_weights(rnn_to_keras(w, b))`` for a ``SimpleRNN`` built with the
    same ``activation``."""
    a = _arrays(w=w, b=b)
    n_in, _ = _check_rnn(a["w"], a["b"])
    w = a["w"]
    return _new(w[:n_in]), _new(w[n_in:]), a["b"].copy()


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
    a = _arrays(W=W, R=R, B=B, optional=("B",))
    n_hidden, w_x = _check_onnx(a, 1)
    bias = _zeros((n_hidden,), _dtype(a))
    if a["B"] is not None:
        bias = _sum_or_zeros(a["B"][0, :n_hidden], a["B"][0, n_hidden:], (n_hidden,),
                             _dtype(a))
    return _rnn_converted(_gradcells_rnn(w_x.T, a["R"][0].T, bias), "onnx",
                          _ONNX_ACTIVATIONS[activation])


def rnn_to_onnx(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """An ONNX ``RNN`` node's ``(W [1, H, I], R [1, H, H], B [1, 2H])`` from gradcells
    ``(w, b)``. Two biases: ``Wb = b``, ``Rb = 0``. Set the node's ``activations`` to
    ``["Tanh"]`` or ``["Relu"]`` to match gradcells's ``activation``."""
    a = _arrays(w=w, b=b)
    n_in, _ = _check_rnn(a["w"], a["b"])
    w = a["w"]
    bias = np.concatenate([a["b"], _zeros(a["b"].shape, a["b"].dtype)])
    return _new(w[:n_in].T)[None], _new(w[n_in:].T)[None], bias[None]


# ---------------------------------------------------------------------------------------------
# Whole PyTorch modules: stacks (docs/spec.md §11.4)

_TORCH_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
_STACK_CELLS = {4: "lstm", 3: "gru", 1: "rnn"}  # gate blocks in weight_ih -> cell


class ConvertedStack(list):
    """The weight sets ``stack_from_torch`` returns, one per (layer, direction) in PyTorch's
    order (a list: pass it as a stack's ``weights``), carrying ``cell`` ("lstm", "gru" or
    "rnn"), ``options`` (the stack keywords that reproduce the module's forward) and
    ``state_order``, with ``gradcells_states`` as ``Converted`` has it."""

    def __init__(self, weights, *, cell, options, state_order):
        super().__init__(weights)
        self.cell, self.options, self.state_order = cell, dict(options), tuple(state_order)

    gradcells_states = Converted.gradcells_states
    framework = "torch"

    def __repr__(self):
        return (f"ConvertedStack(<{len(self)} {self.cell} weight sets>, "
                f"options={self.options!r}, state_order={self.state_order!r})")


def stack_from_torch(module: Any, *, nonlinearity: str | None = None) -> ConvertedStack:
    """The weight sets of a whole ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` (any ``num_layers``,
    ``bidirectional``, ``proj_size``, ``bias``), from the module or its ``state_dict()``.

    ``gc.lstm_stack(x, *conv.gradcells_states(h0, c0), conv, **conv.options)`` then runs the
    module's forward (``gru_stack``/``rnn_stack`` with ``(h0,)``). From a state dict the cell
    is read from the weights' shapes (4, 3 or 1 gate blocks), and a plain RNN's
    ``nonlinearity`` must be given (a module's own is read from it).
    """
    state, activation = _torch_state(module, nonlinearity)
    suffixes = sorted({name.split("_l", 1)[1] for name in state if "_l" in name},
                      key=lambda sfx: (int(sfx.split("_")[0]), sfx))
    first = _numpy(state["weight_ih_l0"])
    hidden = _numpy(state.get("weight_hr_l0", state["weight_hh_l0"])).shape[1]
    cell = _STACK_CELLS.get(first.shape[0] // hidden if first.shape[0] % hidden == 0 else 0)
    if cell is None:
        raise ValueError(f"weight_ih_l0 of shape {first.shape} for a state {hidden} wide: not "
                         "an nn.LSTM, nn.GRU or nn.RNN")
    if cell == "rnn" and activation is None:
        raise ValueError("an nn.RNN state dict does not say its nonlinearity: pass "
                         "nonlinearity='tanh' or 'relu'")
    weights = [_stack_layer(cell, {n: state.get(f"{n}_l{sfx}") for n in _TORCH_PARAMETERS},
                            activation) for sfx in suffixes]
    options = {"bidirectional": any(sfx.endswith("_reverse") for sfx in suffixes),
               **{"lstm": {"forget_bias": 0.0}, "gru": {"reset_after": True},
                  "rnn": {"activation": activation}}[cell]}
    return ConvertedStack(weights, cell=cell, options=options,
                          state_order=_LSTM_STATE_ORDER["torch"] if cell == "lstm" else ("h",))


def _torch_state(module, nonlinearity):
    """``(state dict, the RNN's activation or None)`` from a module or a state dict."""
    if hasattr(module, "state_dict"):
        mode = getattr(module, "mode", "")
        activation = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}.get(mode, nonlinearity)
        return module.state_dict(), activation
    if not hasattr(module, "keys"):
        raise TypeError("module must be an nn.LSTM, nn.GRU or nn.RNN, or its state_dict(), got "
                        f"{type(module).__name__}")
    return module, None if nonlinearity is None else _rnn_activation("nonlinearity", nonlinearity)


def _numpy(a):
    return _interop.to_numpy(a)


def _stack_layer(cell, p, activation):
    """One (layer, direction)'s weight set from its PyTorch parameters."""
    arrays = [None if p[n] is None else _numpy(p[n]) for n in _TORCH_PARAMETERS]
    if cell == "lstm":
        conv = lstm_from_torch(*arrays)
        return LSTMWeights(*conv, w_proj=conv.options.get("w_proj"))
    if cell == "gru":
        return GRUWeights(*gru_from_torch(*arrays[:4]))
    return RNNWeights(*rnn_from_torch(*arrays[:4], nonlinearity=activation))


def stack_to_torch(weights: Sequence[LSTMWeights | GRUWeights | RNNWeights], *,
                   bidirectional: bool = False) -> dict[str, np.ndarray]:
    """The ``state_dict`` of the ``nn.LSTM``/``nn.GRU``/``nn.RNN`` that computes a stack of
    these weight sets (PyTorch's names, NumPy arrays: ``module.load_state_dict({k:
    torch.from_numpy(v) for k, v in sd.items()})``). The biases follow each cell's
    ``..._to_torch`` (the sum in ``bias_ih``)."""
    directions = 2 if bidirectional else 1
    if not isinstance(weights, (list, tuple)) or not weights or len(weights) % directions:
        raise ValueError("weights must be a non-empty list of weight sets, two per layer when "
                         "bidirectional")
    state = {}
    for k, w in enumerate(weights):
        suffix = f"_l{k // directions}" + ("_reverse" if k % directions else "")
        if isinstance(w, LSTMWeights):
            arrays = lstm_to_torch(w.w, w.b, w.w_proj)
        elif isinstance(w, GRUWeights):
            arrays = gru_to_torch(*w)
        elif isinstance(w, RNNWeights):
            arrays = rnn_to_torch(*w)
        else:
            raise TypeError(f"weights[{k}] must be a gradcells LSTMWeights, GRUWeights or "
                            f"RNNWeights, got {type(w).__name__}")
        state.update({f"{n}{suffix}": a for n, a in zip(_TORCH_PARAMETERS, arrays)})
    return state
