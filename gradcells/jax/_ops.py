"""``gradcells.jax.<op>``: every forward op as a JAX function, built from the op's spec.

Each wrapper takes ``gc.<op>``'s signature (JAX arrays where it takes arrays; NumPy arrays
are taken too), checks its arguments with gradcells's own validation (on zero-stride NumPy
stand-ins of the arrays' shapes and dtypes, so a traced array is checked too), and binds
``forward_p`` (``gradcells.jax._primitives``) with the arrays as operands: the
differentiable ones (x, the states, the weights), then the constants (``seq_len`` and the
masks: arrays, no derivative flows into them). The other keywords are static. A stack is
its sequences composed in JAX (each layer and direction one ``<cell>_sequence`` call, the
layers' outputs joined and masked by ``jax.numpy``), so every result field, its ``layers``
too, is differentiable. The scans (``SCAN_SPECS``) too, each checked by its own validation
(``SCAN_ARGS``), the selective scan with its arrays' labels from its spec (Mamba's
layout). A result field computed only on request (``OpSpec.optional_results``: the
selective scan's ``last_state``) is always computed by the primitives and returned as None
unless asked for, so a loss on it is differentiated when it is.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np

import gradcells as gc

from .. import _dispatch, stacks
from .. import _validate as v
from .._core import trees
from .._core.specs import MASKS, shaped
from .._validate.scans import scan_args
from .._validate.selective import selective_args
from ..cells import OPS, SCAN_SPECS, STACKS
from ..cells.lstm.spec import NORM_ARRAYS, LSTMNorm
from ._primitives import Call, forward_p

CONSTANTS = ("seq_len", *MASKS)
"""The array keywords that are constants to the derivative."""


def _stand_in(a, values=False):
    """A NumPy array of ``a``'s shape and dtype for the validation: zero-stride zeros, or
    with ``values`` ``a``'s own values when ``a`` is concrete (``seq_len``, the masks,
    whose values are checked); anything else unchanged (the validation names it)."""
    if isinstance(a, (list, tuple)) and values:
        return a
    if not (isinstance(a, (np.ndarray, jax.Array))):
        return a
    if values and not isinstance(a, jax.core.Tracer):
        return np.asarray(a)
    return np.broadcast_to(np.zeros((), np.dtype(a.dtype)), a.shape)


def _weights_in(spec, named):
    """The op's weight set from flat ``named`` arrays (``layer_norm`` one ``LSTMNorm``)."""
    fields = {f: named.get(f) for f in spec.weights._fields if f != "layer_norm"}
    if "layer_norm" in spec.weights._fields:
        norm = [named.get(n) for n in NORM_ARRAYS]
        fields["layer_norm"] = None if norm[0] is None else LSTMNorm(*norm)
    return spec.weights(**fields)


def _flat_arrays(spec, arguments):
    """The call's arrays by flat name (``layer_norm`` read as its six), None when absent."""
    named = {n: arguments[n] for n in spec.arrays if n != "layer_norm"}
    if "layer_norm" in spec.arrays:
        norm = arguments["layer_norm"]
        if norm is not None and not isinstance(norm, LSTMNorm):
            raise TypeError(f"layer_norm must be None or a gradcells.LSTMNorm, got "
                            f"{type(norm).__name__}")
        named.update(zip(NORM_ARRAYS, (None,) * 6 if norm is None else norm, strict=True))
    return named


SCAN_ARGS = {"linear_scan": scan_args, "selective_scan": selective_args}
"""The validation of each op of ``SCAN_SPECS`` (no x, no weights: its own), taking its
arrays in ``OpSpec.arrays`` order and its keywords and constants by name."""


def _checked(spec, arrays, constants, options):
    """Validate the call as ``gc.<op>`` would (``ValueError``/``TypeError`` naming the
    argument); returns the settings record of the stand-ins."""
    stand = {n: _stand_in(a) for n, a in arrays.items()}
    keywords = {k: o for k, o in options.items() if k != "backend"}
    values = {n: _stand_in(c, True) for n, c in constants.items()}
    if spec.name in SCAN_SPECS:
        _, settings = SCAN_ARGS[spec.name](*(stand[n] for n in spec.arrays), **keywords,
                                           **values)
    else:
        if spec.sequence:
            masks = {n: values[n] for n in MASKS if n in values}
            keywords.update(seq_len=values["seq_len"], masks=masks)
        _, settings = v.forward_args(spec.name, stand["x"], [stand[s] for s in spec.states],
                                     _weights_in(spec, stand), **keywords)
    _dispatch.backend_for(options.get("backend"), "numpy")
    return settings


def _result_shapes(spec, arrays, batch_first):
    """Each result field's shape, from the spec's labels and the sizes of the inputs and
    states given."""
    def ordered(labels):
        return (labels[1], labels[0], *labels[2:]) if batch_first and len(labels) == 3 else labels

    sizes = {}
    labelled = [(spec.input_labels(n), n) for n in spec.inputs]
    for labels, name in [*labelled, *zip(spec.state_labels, spec.states, strict=True)]:
        if arrays[name] is not None:
            shape = np.shape(arrays[name])
            sizes.update(zip(shaped(ordered(labels), len(shape)), shape, strict=True))
    return [tuple(sizes[label] for label in ordered(labels))
            for labels in spec.result_labels()]


def _op(name):
    """``gradcells.jax.<name>``: ``gc.<name>`` as a JAX function (see the module)."""
    spec, function = SCAN_SPECS.get(name) or OPS[name], getattr(gc, name)
    signature = inspect.signature(function)
    constants = tuple(n for n in (*CONSTANTS, *spec.constants) if n in signature.parameters)
    array_args = {*spec.arrays}

    @functools.wraps(function)
    def op(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        arguments = dict(arguments.arguments)
        arrays = _flat_arrays(spec, arguments)
        given = {n: arguments[n] for n in constants}
        options = {k: o for k, o in arguments.items()
                   if k not in array_args and k not in constants}
        settings = _checked(spec, arrays, given, options)
        # a field computed only when asked for is always computed (so that every call of
        # the op has its result's every field), and returned only when asked for
        asked = {f: bool(getattr(settings, flag)) for f, flag in spec.optional_results.items()}
        options.update(dict.fromkeys(spec.optional_results.values(), True))
        diff = tuple(n for n in spec.flat_arrays if arrays[n] is not None)
        const = tuple(n for n in constants if given[n] is not None)
        operands = [jnp.asarray(arrays[n]) for n in diff] + [jnp.asarray(given[n]) for n in const]
        dtype = np.result_type(*(operands[k].dtype for k, n in enumerate(diff)
                                 if n in spec.inputs))    # a real a with a complex b: b's
        shapes = _result_shapes(spec, arrays, options.get("batch_first", False))
        try:
            call = Call(name, diff, const, tuple(options.items()),
                        tuple((s, dtype) for s in shapes))
            hash(call)
        except TypeError:
            raise TypeError(f"{name}'s keywords {sorted(options)} must be Python values "
                            "(numbers, strings, bools, None): they are static to JAX") from None
        result = forward_p.bind(*operands, call=call, grad=())
        return spec.result(*(r if asked.get(f, True) else None
                             for f, r in zip(spec.result._fields, result, strict=True)))

    op.__doc__ = (f"``gc.{name}`` as a JAX function (jit, grad, vjp, jvp, vmap): the primal "
                  f"from ``gc.{name}``, reverse mode from ``gc.{name}_grad``, forward mode "
                  f"from ``gc.{name}_jvp``; {', '.join(constants) or 'no array'} constant "
                  f"to the derivative. Returns a ``{spec.result.__name__}`` of JAX arrays."
                  f"\n\ngc.{name}:\n{function.__doc__}")
    op.__module__ = "gradcells.jax"
    return op


_CELLS = stacks.STACK_CELLS
_STACK_KEYS = ("x", "weights", "bidirectional", "seq_len", "batch_first", "dropout_masks",
               "backend")


def _weights_stand_in(weights, kind):
    """A stack's list of weight sets with stand-ins for the arrays (anything else, as
    given, for the validation to name)."""
    if not isinstance(weights, (list, tuple)):
        return weights
    return [trees.map_leaves(_stand_in, w) if isinstance(w, kind) else w for w in weights]


def _stack(name, sequence):
    """``gradcells.jax.<name>``: the stack composed of ``sequence`` (the JAX sequence op)."""
    cell, function = _CELLS[name], getattr(gc, name)
    signature = inspect.signature(function)

    @functools.wraps(function)
    def op(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        a = dict(arguments.arguments)
        states = [a[n] for n in cell.states]
        weights, masks = a["weights"], a["dropout_masks"]
        directions, widths, _ = v.stack_args(
            cell.weights, _stand_in(a["x"]),
            {n: _stand_in(s) for n, s in zip(cell.states, states, strict=True)},
            _weights_stand_in(weights, cell.weights), bidirectional=a["bidirectional"],
            batch_first=a["batch_first"],
            dropout_masks=masks if not isinstance(masks, (list, tuple))
            else [_stand_in(m) for m in masks])
        attrs = {k: o for k, o in a.items() if k not in _STACK_KEYS and k not in cell.states}
        layers = []
        for layer in range(len(widths)):
            below = layers[(layer - 1) * directions:layer * directions]
            layer_input = (a["x"] if layer == 0 else stacks.joined(jnp, below)
                           if masks is None else stacks.joined(jnp, below) * masks[layer - 1])
            for k in range(layer * directions, (layer + 1) * directions):
                positional, optional = stacks.split_weights(weights[k])
                layers.append(sequence(layer_input, *(s[k] for s in states), *positional,
                                       **optional, reverse=k % directions == 1,
                                       seq_len=a["seq_len"], batch_first=a["batch_first"],
                                       backend=a["backend"], **attrs))
        return stacks.stacked(cell, jnp, layers, directions)

    op.__doc__ = (f"``gc.{name}`` as a JAX function: each layer and direction one "
                  f"``gradcells.jax.{sequence.__name__}`` call, so jit, grad, jvp and vmap "
                  f"apply as to it. Returns a ``{cell.result.__name__}`` of JAX arrays."
                  f"\n\ngc.{name}:\n{function.__doc__}")
    op.__module__ = "gradcells.jax"
    return op


FORWARD = {name: _op(name) for name in (*OPS, *SCAN_SPECS)}
FORWARD.update({name: _stack(name, FORWARD[seq]) for name, seq in STACKS.items()})
