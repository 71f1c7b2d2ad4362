"""PyTorch's layouts: ``nn.LSTM``/``nn.LSTMCell`` (with ``proj_size``), ``nn.GRU``/``nn.GRUCell``,
``nn.RNN``/``nn.RNNCell``, and whole multi-layer, bidirectional modules as stacks
(docs/spec.md §11.4). Two biases per gate (``bias_ih``, ``bias_hh``): the two-bias rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _interop
from .._core.types import Array
from ..cells.gru.spec import GRUWeights
from ..cells.lstm.spec import LSTMWeights
from ..cells.rnn.spec import RNNWeights
from ._common import (
    LSTM_STATE_ORDER,
    Converted,
    check_ndim,
    check_rnn,
    check_shape,
    checked_arrays,
    dtype_of,
    framework_gru,
    framework_lstm,
    framework_lstmp,
    gate_width,
    gradcells_gru,
    gradcells_lstm,
    gradcells_rnn,
    gru_converted,
    lstm_converted,
    new_array,
    rnn_activation,
    rnn_converted,
    sum_or_zeros,
    zero_array,
)

# Gate orders, one letter per block, named by gradcells's letters (see ._common).
LSTM_TORCH = "ifco"      # i, f, g, o
GRU_TORCH = "ruc"        # r, z, n


def _check_torch(a, n_gates):
    """Check PyTorch's ``weight_ih [kH, I]``, ``weight_hh [kH, H]``, ``bias_ih, bias_hh [kH]``
    (k = ``n_gates``); return H."""
    gates = f"{n_gates}H" if n_gates > 1 else "H"
    check_ndim("weight_hh", a["weight_hh"], 2, f"{gates}, H")
    n_hidden = a["weight_hh"].shape[1]
    check_shape("weight_hh", a["weight_hh"], (n_gates * n_hidden, n_hidden), f"{gates}, H")
    check_ndim("weight_ih", a["weight_ih"], 2, f"{gates}, I")
    check_shape("weight_ih", a["weight_ih"], (n_gates * n_hidden, a["weight_ih"].shape[1]),
                f"{gates}, I")
    for name in ("bias_ih", "bias_hh"):
        check_shape(name, a[name], (n_gates * n_hidden,), gates)
    return n_hidden


def _check_torch_lstm(a):
    """Check PyTorch's LSTM arrays, with or without ``weight_hr [P, H]`` (then
    ``weight_hh [4H, P]``); return H."""
    if a["weight_hr"] is None:
        return _check_torch(a, 4)
    check_ndim("weight_hh", a["weight_hh"], 2, "4H, P")
    check_ndim("weight_hr", a["weight_hr"], 2, "P, H")
    n_hidden = gate_width("weight_hh", a["weight_hh"].shape[0], 4, "4H rows")
    n_proj = a["weight_hh"].shape[1]
    check_shape("weight_hr", a["weight_hr"], (n_proj, n_hidden), "P, H")
    check_ndim("weight_ih", a["weight_ih"], 2, "4H, I")
    check_shape("weight_ih", a["weight_ih"], (4 * n_hidden, a["weight_ih"].shape[1]), "4H, I")
    for name in ("bias_ih", "bias_hh"):
        check_shape(name, a[name], (4 * n_hidden,), "4H")
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
    a = checked_arrays(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh,
                       weight_hr=weight_hr, optional=("bias_ih", "bias_hh", "weight_hr"))
    n_hidden = _check_torch_lstm(a)
    bias = sum_or_zeros(a["bias_ih"], a["bias_hh"], (4 * n_hidden,), dtype_of(a))
    conv = lstm_converted(
        gradcells_lstm(a["weight_ih"].T, a["weight_hh"].T, bias, LSTM_TORCH), "torch")
    if a["weight_hr"] is not None:
        conv.options["w_proj"] = new_array(a["weight_hr"].T)
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
    a = checked_arrays(w=w, b=b, w_proj=w_proj, optional=("w_proj",))
    if a["w_proj"] is None:
        rows_x, rows_h, bias = framework_lstm(a["w"], a["b"], LSTM_TORCH)
    else:
        rows_x, rows_h, bias = framework_lstmp(a["w"], a["b"], a["w_proj"], LSTM_TORCH)
    out = (np.ascontiguousarray(rows_x.T), np.ascontiguousarray(rows_h.T), bias,
           zero_array(bias.shape, bias.dtype))
    return out if a["w_proj"] is None else (*out, new_array(a["w_proj"].T))


def gru_from_torch(weight_ih: Array, weight_hh: Array, bias_ih: Array | None = None,
                   bias_hh: Array | None = None) -> Converted:
    """gradcells reset-after GRU ``(w_ru, w_c, b_ru, b_c [2H])`` from PyTorch's ``nn.GRU``
    (one layer, one direction) or ``nn.GRUCell``; use it with ``reset_after=True``.

    PyTorch: ``weight_ih [3H, I]``, ``weight_hh [3H, H]``, ``bias_ih, bias_hh [3H]`` (None:
    ``bias=False``), gate blocks **r, z, n** (z is gradcells's u, n the candidate c), reset
    after: ``n = tanh(W_in x + b_in + r∘(W_hn h + b_hn))``. Two biases: ``b_ru`` sums the
    r and z parts; ``b_c = [b_in, b_hn]`` keeps both.
    """
    a = checked_arrays(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh,
                       optional=("bias_ih", "bias_hh"))
    _check_torch(a, 3)
    return gru_converted(gradcells_gru(a["weight_ih"].T, a["weight_hh"].T, a["bias_ih"],
                                        a["bias_hh"], GRU_TORCH, reset_after=True),
                         "torch", True)


def gru_to_torch(w_ru: Array, w_c: Array, b_ru: Array, b_c: Array) -> tuple[np.ndarray, ...]:
    """PyTorch's ``(weight_ih [3H, I], weight_hh [3H, H], bias_ih [3H], bias_hh [3H])``, gate
    blocks r, z, n, from a gradcells reset-after GRU (``b_c [2H]``). Two biases:
    ``bias_ih = [b_ru, b_cx]``, ``bias_hh = [0, 0, b_ch]``.

    A reset-before GRU (``b_c [H]``) has no PyTorch equivalent: ``ValueError``.
    """
    a = checked_arrays(w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    rows_x, rows_h, bias_x, bias_h, reset_after = framework_gru(
        a["w_ru"], a["w_c"], a["b_ru"], a["b_c"], GRU_TORCH)
    if not reset_after:
        n_hidden = a["w_c"].shape[1]
        raise ValueError(
            f"b_c must have shape [2H] = ({2 * n_hidden},): PyTorch's GRU resets after the "
            f"candidate matmul, and a reset-before GRU (b_c of shape [H] = ({n_hidden},)) "
            "has no PyTorch equivalent")
    return (np.ascontiguousarray(rows_x.T), np.ascontiguousarray(rows_h.T), bias_x, bias_h)


def rnn_from_torch(weight_ih: Array, weight_hh: Array, bias_ih: Array | None = None,
                   bias_hh: Array | None = None, *, nonlinearity: str = "tanh") -> Converted:
    """gradcells ``(w, b)`` from PyTorch's ``nn.RNN`` (one layer, one direction) or
    ``nn.RNNCell``.

    PyTorch: ``weight_ih [H, I]``, ``weight_hh [H, H]``, ``bias_ih, bias_hh [H]`` (None:
    ``bias=False``). Two biases: ``b = bias_ih + bias_hh``. ``nonlinearity`` is the module's
    (``"tanh"`` or ``"relu"``) and lands in ``options`` as ``activation``:
    ``gc.rnn_cell(x, h, *conv, **conv.options)`` runs the module's forward.
    """
    activation = rnn_activation("nonlinearity", nonlinearity)
    a = checked_arrays(weight_ih=weight_ih, weight_hh=weight_hh, bias_ih=bias_ih, bias_hh=bias_hh,
                       optional=("bias_ih", "bias_hh"))
    n_hidden = _check_torch(a, 1)
    bias = sum_or_zeros(a["bias_ih"], a["bias_hh"], (n_hidden,), dtype_of(a))
    return rnn_converted(gradcells_rnn(a["weight_ih"].T, a["weight_hh"].T, bias), "torch",
                         activation)


def rnn_to_torch(w: Array, b: Array) -> tuple[np.ndarray, ...]:
    """PyTorch's ``(weight_ih [H, I], weight_hh [H, H], bias_ih [H], bias_hh [H])`` from
    gradcells ``(w, b)``. Two biases: ``bias_ih = b``, ``bias_hh = 0``. The activation is the
    module's ``nonlinearity``, set when it is built."""
    a = checked_arrays(w=w, b=b)
    n_in, _ = check_rnn(a["w"], a["b"])
    w = a["w"]
    return (new_array(w[:n_in].T), new_array(w[n_in:].T), a["b"].copy(),
            zero_array(a["b"].shape, a["b"].dtype))


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
                          state_order=LSTM_STATE_ORDER["torch"] if cell == "lstm" else ("h",))


def _torch_state(module, nonlinearity):
    """``(state dict, the RNN's activation or None)`` from a module or a state dict."""
    if hasattr(module, "state_dict"):
        mode = getattr(module, "mode", "")
        activation = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}.get(mode, nonlinearity)
        return module.state_dict(), activation
    if not hasattr(module, "keys"):
        raise TypeError("module must be an nn.LSTM, nn.GRU or nn.RNN, or its state_dict(), got "
                        f"{type(module).__name__}")
    return module, None if nonlinearity is None else rnn_activation("nonlinearity", nonlinearity)


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
        names = _TORCH_PARAMETERS[:len(arrays)]        # weight_hr: a projection's only
        state.update({f"{n}{suffix}": a for n, a in zip(names, arrays, strict=True)})
    return state
