"""What a stack call adds to its layers' calls (docs/spec.md §11.4): the flags, the list of
weight sets and the sizes that chain the layers, the states' ``L·D`` axis, the dropout masks
and the upstream gradients' shapes; each layer's sequence call checks its own arrays.
"""

from __future__ import annotations

import numpy as np

from ..cells.gru.spec import GRUWeights
from ..cells.lstm.spec import LSTMWeights
from .arrays import described, library_and_dtype
from .settings import bool_value


def stack_args(weights_type, x, states, weights, *, bidirectional, batch_first,
               dropout_masks):
    """Check what a stack call adds to its layers' calls: the flags, the list of weight sets
    (their number, type and the sizes that chain the layers), the initial states' leading
    ``L·D`` axis and the dropout masks. Returns ``(directions, widths, masks)``: 1 or 2,
    each layer's state width (P for an LSTM, else H) and the masks as a tuple (or None)."""
    directions = 2 if bool_value("bidirectional", bidirectional) else 1
    bool_value("batch_first", batch_first)
    widths = _stack_widths(weights_type, weights, directions)
    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"x must be a 3-D array [{'B, T' if batch_first else 'T, B'}, I], "
                         f"got {described(x)}")
    _check_chain(weights_type, weights, widths, directions, x.shape[-1])
    for name, state in states.items():
        if getattr(state, "ndim", None) != 3 or state.shape[0] != len(weights):
            raise ValueError(
                f"{name} must be a 3-D array [L·D, B, ·] with L·D = {len(weights)} (one state "
                f"per weight set), got {described(state)}")
    return directions, widths, _stack_masks(dropout_masks, x, widths, directions, batch_first)


def _stack_widths(weights_type, weights, directions):
    """Each layer's state width, after checking the list's type, length and directions."""
    if not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError(f"weights must be a non-empty list of gradcells.{weights_type.__name__}, "
                        f"got {type(weights).__name__}")
    for k, w in enumerate(weights):
        if not isinstance(w, weights_type):
            raise TypeError(f"weights[{k}] must be a gradcells.{weights_type.__name__}, got "
                            f"{type(w).__name__}")
    if len(weights) % directions:
        raise ValueError(f"weights holds {len(weights)} weight sets; a bidirectional stack "
                         "needs two per layer (layer 0, layer 0 reverse, layer 1, ...)")
    widths = [_state_width(w) for w in weights]
    for k, width in enumerate(widths):
        if width != widths[0]:
            raise ValueError(f"weights[{k}] has a state {width} wide but weights[0] one "
                             f"{widths[0]} wide: the states [L·D, B, ·] give every layer and "
                             "direction one width")
    return widths[::directions]


def _state_width(weights):
    """The recurrent state's width of one weight set: P (an LSTM's projection) or H."""
    if isinstance(weights, LSTMWeights):
        return (weights.w_proj.shape[1] if weights.w_proj is not None
                else weights.b.shape[0] // 4)
    return weights.w_c.shape[1] if isinstance(weights, GRUWeights) else weights.w.shape[1]


def _check_chain(weights_type, weights, widths, directions, n_in):
    """ValueError unless each layer's first weight has rows for its input (x's ``I`` for
    layer 0, ``D·P`` of the layer below after it) and its own state."""
    for k, w in enumerate(weights):
        layer = k // directions
        width_in = n_in if layer == 0 else directions * widths[layer - 1]
        name = weights_type._fields[0]                  # w, or a GRU's w_ru
        rows = getattr(w, name).shape[0]
        if rows != width_in + widths[layer]:
            source = ("x's input size" if layer == 0 else
                      f"{directions} × {widths[layer - 1]}, layer {layer - 1}'s outputs")
            raise ValueError(
                f"weights[{k}].{name} has {rows} rows, but layer {layer}'s input is {width_in} "
                f"wide ({source}) and its state {widths[layer]}: it needs "
                f"{width_in + widths[layer]}")


def _stack_masks(masks, x, widths, directions, batch_first):
    """The dropout masks as a tuple (None when not given), each checked against the layer
    outputs it multiplies."""
    if masks is None:
        return None
    n_layers = len(widths)
    if not isinstance(masks, (list, tuple)) or len(masks) != n_layers - 1:
        raise ValueError(f"dropout_masks must hold num_layers - 1 = {n_layers - 1} arrays (one "
                         "per boundary between layers), got "
                         + (f"{len(masks)}" if isinstance(masks, (list, tuple))
                            else type(masks).__name__))
    leading = tuple(x.shape[:2])
    for k, mask in enumerate(masks):
        name, outputs = f"dropout_masks[{k}]", (*leading, directions * widths[k])
        library_and_dtype([("x", x), (name, mask)])
        try:
            np.broadcast_shapes(tuple(mask.shape), outputs)
        except ValueError:
            labels = "B, T" if batch_first else "T, B"
            raise ValueError(f"{name} of shape {tuple(mask.shape)} does not broadcast to layer "
                             f"{k}'s outputs [{labels}, D·P] = {outputs}") from None
    return tuple(masks)


def stack_upstream(stack, upstream):
    """ValueError unless each upstream gradient of a stack's gradient call has the shape of
    what it is the gradient of (``d_h``: the top outputs; ``d_*_final``: the final
    states)."""
    for name, g in upstream.items():
        if g is None:
            continue
        like = getattr(stack, name.removeprefix("d_"))
        if tuple(getattr(g, "shape", ())) != tuple(like.shape):
            raise ValueError(f"{name} must have the shape of stack.{name.removeprefix('d_')} "
                             f"{tuple(like.shape)}, got {described(g)}")

