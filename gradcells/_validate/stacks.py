"""What a stack call adds to its layers' calls (docs/spec.md §11.4): the flags, the list of
weight sets and the sizes that chain the layers, the states' ``L·D`` axis, the dropout masks,
a gradient's weight sets against what its forward ran (§16.3) and the upstream gradients'
shapes; each layer's sequence call checks its own arrays.
"""

from __future__ import annotations

import re

import numpy as np

from ..cells import OPS, OPTIONAL_WEIGHTS, SPECS, WEIGHT_LABELS, cell_of
from .arrays import (
    check_shapes,
    checked_heads,
    described,
    expected_shapes,
    flat_weights,
    heads_index,
    layout_of,
    library_and_dtype,
    require_arrays,
)
from .records import check_optional
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
    _check_chain(weights_type, weights, widths, directions, _input_width(x, batch_first))
    stack_states(states, len(weights))
    return directions, widths, _stack_masks(dropout_masks, x, widths, directions, batch_first)


def stack_states(states, n_sets):
    """ValueError unless each initial state (by name) is ``[L·D, B, ·]``, one per weight
    set."""
    for name, state in states.items():
        if getattr(state, "ndim", None) != 3 or state.shape[0] != n_sets:
            raise ValueError(
                f"{name} must be a 3-D array [L·D, B, ·] with L·D = {n_sets} (one state "
                f"per weight set), got {described(state)}")


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
    widths = [_state_width(k, w) for k, w in enumerate(weights)]
    for k, width in enumerate(widths):
        if width != widths[0]:
            raise ValueError(f"weights[{k}] has a state {width} wide but weights[0] one "
                             f"{widths[0]} wide: the states [L·D, B, ·] give every layer and "
                             "direction one width")
    return widths[::directions]


_MULTIPLE_OF_H = re.compile(r"^(\d*)H$")


def _state_width(k, weights):
    """The recurrent state's width of weight set ``k``, read by the weights' shape labels:
    the last axis of a given weight labelled ``P`` (an LSTM's projection), else of the
    first one labelled ``H`` or ``nH``, divided by n (an LSTM's ``w``: ``4H``)."""
    labels = WEIGHT_LABELS[type(weights)]
    projected = [n for n, lab in labels.items() if lab[-1:] == ("P",)
                 and getattr(weights, n, None) is not None]
    if projected:
        return _dims(k, weights, projected[0], len(labels[projected[0]]))[-1]
    for name, lab in labels.items():
        match = _MULTIPLE_OF_H.match(lab[-1]) if "." not in name else None
        if match and name not in OPTIONAL_WEIGHTS:
            return _dims(k, weights, name, len(lab))[-1] // int(match[1] or 1)
    raise TypeError(f"weights[{k}]: no weight gives the state's width")


def _dims(k, weights, name, rank):
    """The shape of array ``name`` of weight set ``k``, after checking that it is an array
    of rank ``rank`` (the sizes that chain the layers are read from it)."""
    a = getattr(weights, name)
    if not hasattr(a, "shape"):
        raise TypeError(f"weights[{k}].{name} must be an array, got {type(a).__name__}")
    if len(a.shape) != rank:
        raise ValueError(f"weights[{k}].{name} must be a {rank}-D array, got shape "
                         f"{tuple(a.shape)}")
    return a.shape


def _check_chain(weights_type, weights, widths, directions, n_in):
    """ValueError unless each layer's first weight has rows for its input (x's ``I`` for
    layer 0, ``D·P`` of the layer below after it) and, where its rows are labelled
    ``I+H``/``I+P``, its own state (an sLSTM's ``w [I, 4H]`` has the input's rows only)."""
    name = weights_type._fields[0]                      # w, or a GRU's w_ru
    if WEIGHT_LABELS[weights_type][name][0] not in ("I", "I+H", "I+P"):
        return   # no input rows (an RG-LRU's w_a [N, H/N, H/N]): each layer's sequence
        #          call holds its input to its state's width
    with_state = WEIGHT_LABELS[weights_type][name][0] != "I"
    for k, w in enumerate(weights):
        layer = k // directions
        width_in = n_in if layer == 0 else directions * widths[layer - 1]
        rows = _dims(k, w, name, 2)[0]
        needed = width_in + (widths[layer] if with_state else 0)
        if rows != needed:
            source = ("x's input size" if layer == 0 else
                      f"{directions} × {widths[layer - 1]}, layer {layer - 1}'s outputs")
            state = f" and its state {widths[layer]}" if with_state else ""
            raise ValueError(
                f"weights[{k}].{name} has {rows} rows, but layer {layer}'s input is {width_in} "
                f"wide ({source}){state}: it needs {needed}")


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
        require_arrays([(name, mask, None)])
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
        like = _recorded(stack, (name.removeprefix("d_"),))
        if tuple(getattr(g, "shape", ())) != tuple(like):
            raise ValueError(f"{name} must have the shape of stack.{name.removeprefix('d_')} "
                             f"{tuple(like)}, got {described(g)}")



def stack_layer_upstream(stack, d_layers, name="d_layers"):
    """A stack gradient's upstream gradients of its per-layer results (docs/spec.md §16.1):
    ``d_layers`` None, or one entry per run of ``stack.layers`` (None, or a tuple of the
    run's result type whose fields are None or arrays of the field's shape). Returns, per
    run, the given ones by the sequence gradient's keyword (``d_i``, ``d_h_final``, ...)."""
    runs = stack.layers
    if d_layers is None:
        return [{} for _ in runs]
    if not isinstance(d_layers, (list, tuple)) or hasattr(d_layers, "_fields"):
        raise TypeError(f"{name} must be a list with one entry per stack.layers, got "
                        f"{type(d_layers).__name__}")
    if len(d_layers) != len(runs):
        raise ValueError(f"{name} must have one entry per stack.layers ({len(runs)}), got "
                         f"{len(d_layers)}")
    return [_layer_upstream(f"{name}[{k}]", run, entry)
            for k, (run, entry) in enumerate(zip(runs, d_layers, strict=True))]


def _layer_upstream(name, run, entry):
    if entry is None:
        return {}
    if not isinstance(entry, tuple) or len(entry) != len(run):
        raise TypeError(f"{name} must be None or a gradcells.{type(run).__name__} of "
                        f"gradients, got {type(entry).__name__}")
    given = {}
    for field, g, like in zip(run._fields, entry, run, strict=True):
        if g is None:
            continue
        if tuple(getattr(g, "shape", ())) != tuple(like.shape):
            raise ValueError(f"{name}.{field} must have the shape of stack.layers "
                             f"{tuple(like.shape)}, got {described(g)}")
        given[f"d_{field}"] = g
    return given


def stack_weights(weights_type, x, weights, stack):
    """Check a stack gradient's ``weights`` against what its forward ran (docs/spec.md
    §16.3): ``stack.layers`` holds one sequence result per weight set, each recording its
    settings, so the number of sets, each set's type, the optional arrays it has (an LSTM's
    peepholes, projection, layer norm) and every array's library, dtype and shape (the sizes
    read from the layer's result and its input's width) must agree. A mismatch is a
    ``ValueError`` naming ``weights`` and the set's layer and direction, ``weights[1] (layer
    0, reverse): ...``; a ``weights`` that is no list, or an array that is none or not an
    array, a ``TypeError`` named alike."""
    if not isinstance(weights, (list, tuple)) or hasattr(weights, "_fields"):
        raise TypeError(f"weights must be the list of gradcells.{weights_type.__name__} the "
                        f"forward ran, got {type(weights).__name__}")
    runs, directions = stack.layers, 2 if stack.settings.bidirectional else 1
    if len(weights) != len(runs):
        first = min(len(weights), len(runs))
        raise ValueError(
            f"weights holds {len(weights)} weight sets but the forward ran {len(runs)} "
            f"({len(runs) // directions} layers × {directions} directions, stack.layers): "
            f"weights[{first}] {where(first, directions)} "
            + ("is missing" if len(weights) < len(runs) else "has no layer"))
    n_in = _input_width(x, stack.settings.batch_first)
    spec = next(s for s in OPS.values() if s.sequence and s.weights is weights_type)
    for k, (w, run) in enumerate(zip(weights, runs, strict=True)):
        _recorded(stack, ("layers", k, "h"))           # each layer's outputs are read
        if not isinstance(w, weights_type):
            raise ValueError(f"weights[{k}] {where(k, directions)} must be a gradcells."
                             f"{weights_type.__name__}, as the forward ran it (stack.layers"
                             f"[{k}]), got {type(w).__name__}")
        layer = k // directions
        if layer:
            n_in = directions * _recorded(stack, ("layers", (layer - 1) * directions, "h"))[-1]
        try:
            _check_set(spec, x, w, run, n_in, f"stack.layers[{k}]")
        except (TypeError, ValueError) as error:
            raise type(error)(f"weights[{k}] {where(k, directions)}: {error}") from None


def where(k, directions):
    """Weight set ``k``'s place in a stack of ``directions`` directions, ``(layer 0,
    reverse)``."""
    return f"(layer {k // directions}{', reverse' if k % directions else ''})"


def _input_width(x, batch_first):
    """``x``'s input size ``I``, after checking that it is a 3-D array."""
    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"x must be a 3-D array [{'B, T' if batch_first else 'T, B'}, I], "
                         f"got {described(x)}")
    return x.shape[-1]


def _check_set(spec, x, weights, run, n_in, record):
    """One weight set against the sequence result ``run`` its forward gave (named
    ``record`` in messages), whose input was ``n_in`` wide: the optional arrays present
    as recorded, every array given where required, of ``x``'s library and dtype and of the
    shape the sizes make."""
    settings = run.settings
    check_optional(SPECS[cell_of(spec.name)], spec, settings, weights, f"{record}.settings")
    variant = (spec.name, getattr(settings, "reset_after", False),
               getattr(settings, "projection", False))
    layout, n_states = layout_of(*variant), 1 + len(spec.states)
    forward = layout.forward
    specs = list(zip(forward.names[n_states:], flat_weights(spec, weights),
                     forward.labels[n_states:], strict=True))
    require_arrays(specs[:forward.n_required - n_states])
    library_and_dtype([("x", x), *specs])
    width = _recorded(run, ("h_final",), record)[-1]
    sizes = (n_in, _recorded(run, ("cs_final",), record)[-1] if "cs_final" in run._fields
             else width, width)
    heads = heads_index(forward.labels[n_states:])
    n_heads = 1 if heads is None else checked_heads(*specs[heads][:2], sizes[1],
                                                    specs[heads][2])
    shapes = expected_shapes(("stack", *variant), (("I",), *forward.labels[n_states:]),
                              sizes[:1], *sizes[1:], n_heads)

    def origin():
        return (f"I = {n_in}, H = {sizes[1]}" + (f", P = {width}" if variant[2] else "")
                + f" as the forward ran, {record}")

    check_shapes(specs, shapes[1:], origin)


def _recorded(result, path, name="stack"):
    """The shape of the array at ``path`` in a forward's ``result`` (called ``name``), after
    checking that it is one (a result rebuilt by hand may hold anything)."""
    a = result
    for key in path:
        a = a[key] if isinstance(key, int) else getattr(a, key, None)
    if not hasattr(a, "shape"):
        where = name + "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path)
        raise TypeError(f"{where} must be the array its forward returned, got "
                        f"{type(a).__name__}")
    return a.shape
