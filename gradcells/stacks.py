"""The stacks (docs/spec.md §11.4): layers of sequences, each direction of each layer one call
of the public sequence operation, composed here. No math of their own: a layer's input is the
layer below's outputs, both directions concatenated (forward first) on the feature axis, times
that boundary's dropout mask when one is given; the gradient walks the layers down, summing
the two directions' input gradients.

``weights`` lists one weight set per (layer, direction) in PyTorch's order (layer 0, layer 0
reverse, layer 1, ...), and the initial and final states are ``[L·D, B, ·]`` in that order,
so a PyTorch module's states carry over (``gc.layouts.stack_from_torch``).
"""

from __future__ import annotations

import dataclasses

from . import _public, sequences
from . import _validate as v
from ._core.arrays import namespace_of
from ._core.specs import CellSpec
from ._core.types import StackSettings, record_settings
from .cells import OPTIONAL_WEIGHTS, SPECS


@dataclasses.dataclass(frozen=True)
class StackCell:
    """What a stack of one cell calls: its sequence op and gradient and its types, read from
    the cell's spec."""

    spec: CellSpec

    @property
    def op(self) -> str:
        return self.spec.sequence.name

    @property
    def weights(self) -> type:
        return self.spec.sequence.weights

    @property
    def result(self) -> type:
        return self.spec.stack.result

    @property
    def grads(self) -> type:
        return self.spec.stack.grads

    @property
    def attrs(self) -> tuple[str, ...]:
        """The forward's settings every layer shares, by keyword."""
        return tuple(k.name for k in self.spec.keywords)

    @property
    def states(self) -> tuple[str, ...]:
        return self.spec.sequence.states

    def forward(self, x, states, weights, **keywords):
        positional, optional = split_weights(weights)
        return getattr(sequences, self.op)(x, *states, *positional, **optional, **keywords)

    def jvp(self, x, states, weights, tangents, **keywords):
        """The sequence's JVP, ``tangents`` a ``(dx, d_states, d_weights)`` triple."""
        positional, optional = split_weights(weights)
        return getattr(sequences, f"{self.op}_jvp")(x, *states, *positional,
                                                    self._given(weights, tangents),
                                                    **optional, **keywords)

    def gradient(self, x, states, weights, seq, **keywords):
        positional, optional = split_weights(weights)
        return getattr(sequences, f"{self.op}_grad")(x, *states, *positional, seq,
                                                     **optional, **keywords)

    def grad_jvp(self, x, states, weights, seq, tangents, **keywords):
        """The sequence gradient's JVP, ``tangents`` a ``(dx, d_states, d_weights)``
        triple."""
        positional, optional = split_weights(weights)
        return getattr(sequences, f"{self.op}_grad_jvp")(
            x, *states, *positional, seq, self._given(weights, tangents), **optional,
            **keywords)

    def _given(self, weights, tangents):
        """``(dx, d_states, d_weights)`` as the sequence op's gradient type."""
        dx, d_states, d_weights = tangents
        d_weights = self.weights(*(None,) * len(weights)) if d_weights is None else d_weights
        return self.spec.sequence.grads(dx, *d_states, *d_weights)


STACK_CELLS: dict[str, StackCell] = {spec.stack_name: StackCell(spec) for spec in SPECS.values()}
"""Each registered cell's stack, by the stack's name."""


def split_weights(weights):
    """A weight set as the sequence op takes it: the required arrays, the optional ones."""
    named = weights._asdict()
    return ([a for n, a in named.items() if n not in OPTIONAL_WEIGHTS],
            {n: a for n, a in named.items() if n in OPTIONAL_WEIGHTS and a is not None})


def _forward(cell, x, states, weights, *, bidirectional, seq_len, batch_first, dropout_masks,
             backend, **attrs):
    """Every layer and direction in turn; returns the stack's result, recorded."""
    directions, widths, masks = v.stack_args(
        cell.weights, x, dict(zip(cell.states, states,
                                  strict=True)), weights, bidirectional=bidirectional,
        batch_first=batch_first, dropout_masks=dropout_masks)
    xp = namespace_of(x)
    layers = []
    for layer in range(len(widths)):
        layer_input = _layer_input(x, layers, layer, directions, masks)
        layers += [cell.forward(layer_input, [s[k] for s in states], weights[k],
                                reverse=k % directions == 1, seq_len=seq_len,
                                batch_first=batch_first, backend=backend, **attrs)
                   for k in range(layer * directions, (layer + 1) * directions)]
    return record_settings(stacked(cell, xp, layers, directions),
                           StackSettings(directions == 2, batch_first, masks))


def stacked(cell, xp, runs, directions):
    """A stack's result from its sequence results ``runs``: the top layer's outputs, the
    final states ``[L·D, B, ·]`` and the runs."""
    finals = [xp.stack([getattr(run, f"{name.removesuffix('0')}_final") for run in runs])
              for name in cell.states]
    return cell.result(joined(xp, runs[-directions:]), *finals, tuple(runs))


def _forward_jvp(cell, x, states, weights, tangents, *, bidirectional, seq_len, batch_first,
                 dropout_masks, backend, **attrs):
    """``_forward`` and its tangent: each layer's input and its tangent (the masks are
    constants) through the layer's sequence JVPs. Returns ``(result, result_tangent)``."""
    directions, widths, masks = v.stack_args(
        cell.weights, x, dict(zip(cell.states, states,
                                  strict=True)), weights, bidirectional=bidirectional,
        batch_first=batch_first, dropout_masks=dropout_masks)
    dx, d_states, d_weights = v.stack_tangents(cell.grads, tangents, x, states, weights)
    xp = namespace_of(x)
    layers, d_layers = [], []
    for layer in range(len(widths)):
        pair = (_layer_input(x, layers, layer, directions, masks),
                _layer_input(dx, d_layers, layer, directions, masks))
        for k in range(layer * directions, (layer + 1) * directions):
            run, d_run = cell.jvp(pair[0], [s[k] for s in states], weights[k],
                                  (pair[1], [None if d is None else d[k] for d in d_states],
                                   d_weights[k]),
                                  reverse=k % directions == 1, seq_len=seq_len,
                                  batch_first=batch_first, backend=backend, **attrs)
            layers.append(run)
            d_layers.append(d_run)
    return (record_settings(stacked(cell, xp, layers, directions),
                            StackSettings(directions == 2, batch_first, masks)),
            stacked(cell, xp, d_layers, directions))


def joined(xp, runs):
    """The per-step outputs of a layer's directions, concatenated (forward first)."""
    return runs[0].h if len(runs) == 1 else xp.concatenate([r.h for r in runs], axis=-1)


def _layer_input(x, layers, layer, directions, masks):
    """What layer ``layer`` reads: ``x`` for layer 0, else the layer below's outputs
    (``layers``: the sequence results so far) times that boundary's mask."""
    if layer == 0:
        return x
    below = joined(namespace_of(layers[0].h), layers[(layer - 1) * directions:layer * directions])
    return below if masks is None else below * masks[layer - 1]


def _backward(cell, x, states, weights, stack, upstream, backend, **options):
    """The layers from the top down; returns the stack's gradients."""
    v.stack_weights(cell.weights, x, weights, stack)
    v.stack_states(dict(zip(cell.states, states, strict=True)), len(weights))
    record = stack.settings
    directions = 2 if record.bidirectional else 1
    layers, masks = stack.layers, record.dropout_masks
    n_layers = len(layers) // directions
    per_layer = v.stack_layer_upstream(stack, upstream.pop("d_layers"))
    v.stack_upstream(stack, upstream)
    d_out, finals = upstream["d_h"], {s.removesuffix("0"): upstream.get(
        f"d_{s.removesuffix('0')}_final") for s in cell.states}
    state_grads = {name: [None] * len(layers) for name in cell.states}
    weight_grads = [None] * len(layers)
    for layer in reversed(range(n_layers)):
        layer_input = _layer_input(x, layers, layer, directions, masks)
        d_input = None
        for k in range(layer * directions, (layer + 1) * directions):
            given = _summed({"d_h": _direction_part(d_out, layers[k], k, directions)},
                            _final_grads(finals, k, cell), per_layer[k])
            g = cell.gradient(layer_input, [s[k] for s in states], weights[k], layers[k],
                              backend=backend, **given, **options)
            d_input = g.x if d_input is None else d_input + g.x
            for name in cell.states:
                state_grads[name][k] = getattr(g, name)
            weight_grads[k] = cell.weights(*g[1 + len(cell.states):])
        d_out = d_input if masks is None or layer == 0 else d_input * masks[layer - 1]
    xp = namespace_of(x)
    return cell.grads(d_out, *(xp.stack(state_grads[n]) for n in cell.states), weight_grads)


def _backward_jvp(cell, x, states, weights, stack, tangents, upstream, backend, **options):
    """``_backward`` and its tangent: the layers' input tangents from the forward JVP (its
    settings from the record), then from the top down each direction's sequence gradient
    JVP, its upstream gradient's tangent the slice of the one above. Returns ``(grads,
    grads_tangent)``."""
    v.stack_weights(cell.weights, x, weights, stack)
    v.stack_states(dict(zip(cell.states, states, strict=True)), len(weights))
    record = stack.settings
    directions = 2 if record.bidirectional else 1
    layers, masks = stack.layers, record.dropout_masks
    per_layer = [{**d, **{f"{k}_tangent": t for k, t in d_t.items()}} for d, d_t in zip(
        v.stack_layer_upstream(stack, upstream.pop("d_layers")),
        v.stack_layer_upstream(stack, upstream.pop("d_layers_tangent"), "d_layers_tangent"),
        strict=True)]
    v.stack_upstream(stack, {k: g for k, g in upstream.items() if not k.endswith("_tangent")})
    shared = {a: getattr(layers[0].settings, a) for a in cell.attrs}
    _, d_stack = _forward_jvp(cell, x, states, weights, tangents,
                              bidirectional=record.bidirectional,
                              seq_len=layers[0].settings.seq_len,
                              batch_first=record.batch_first, dropout_masks=masks,
                              backend=backend, **shared)
    dx, d_states, d_weights = v.stack_tangents(cell.grads, tangents, x, states, weights)
    d_out, d_out_t = upstream["d_h"], upstream["d_h_tangent"]
    state_grads = {name: [[None] * len(layers) for _ in range(2)] for name in cell.states}
    weight_grads = [[None] * len(layers) for _ in range(2)]
    for layer in reversed(range(len(layers) // directions)):
        inputs = (_layer_input(x, layers, layer, directions, masks),
                  _layer_input(dx, d_stack.layers, layer, directions, masks))
        d_input = [None, None]
        for k in range(layer * directions, (layer + 1) * directions):
            part = [_direction_part(g, layers[k], k, directions) for g in (d_out, d_out_t)]
            given = _summed({"d_h": part[0], "d_h_tangent": part[1]},
                            _final_grads(upstream, k, cell, tangents=True), per_layer[k])
            pair = cell.grad_jvp(inputs[0], [s[k] for s in states], weights[k], layers[k],
                                 (inputs[1], [None if d is None else d[k] for d in d_states],
                                  d_weights[k]), backend=backend, **given, **options)
            for j, g in enumerate(pair):
                d_input[j] = g.x if d_input[j] is None else d_input[j] + g.x
                for name in cell.states:
                    state_grads[name][j][k] = getattr(g, name)
                weight_grads[j][k] = cell.weights(*g[1 + len(cell.states):])
        d_out, d_out_t = (d if masks is None or layer == 0 else d * masks[layer - 1]
                          for d in d_input)
    xp = namespace_of(x)
    return tuple(cell.grads((d_out, d_out_t)[j], *(xp.stack(state_grads[n][j])
                                                     for n in cell.states), weight_grads[j])
                 for j in range(2))


def _summed(*upstreams):
    """Upstream gradients by keyword, those given under one keyword more than once summed
    (a layer's ``d_h`` from the layer above and from ``d_layers``); None: not given."""
    out = {}
    for upstream in upstreams:
        for name, g in upstream.items():
            if g is not None:
                out[name] = g if out.get(name) is None else out[name] + g
    return out


def _direction_part(d_out, run, k, directions):
    """Direction ``k``'s columns of the gradient of a layer's joined outputs (None: none)."""
    if d_out is None:
        return None
    width = run.h.shape[-1]
    return d_out[..., (k % directions) * width:(k % directions + 1) * width]


def _final_grads(finals, k, cell, tangents=False):
    """The upstream gradients of direction ``k``'s final states, by the gradient's names
    (``finals``: by state, ``h`` and ``cs``; with ``tangents``, the upstream keywords
    ``d_h_final``, ``d_h_final_tangent``, ... and both are given)."""
    names = {s: s.removesuffix("0") for s in cell.states}
    suffixes = ("_final", "_final_tangent") if tangents else ("_final",)
    out = {}
    for s in cell.states:
        for suffix in suffixes:
            given = finals.get(f"d_{names[s]}{suffix}") if tangents else finals[names[s]]
            out[f"d_{names[s]}{suffix}"] = None if given is None else given[k]
    return out


# --------------------------------------------------------------------------------------
# The public stacks, made from each cell's spec (``gradcells._public``)

_STACK_KEYWORDS = [("bidirectional", "bool", False), ("seq_len", "Array | None", None),
                   ("batch_first", "bool", False), ("dropout_masks", "list | None", None)]


def _stack_functions(spec):
    """The four public functions of ``spec``'s stack, by name."""
    cell, name, kw = STACK_CELLS[spec.stack_name], spec.stack_name, _public.keyword_dict
    result, grads = cell.result.__name__, cell.grads.__name__
    positional = [("x", "Array"), *((s, "Array") for s in cell.states),
                  ("weights", f"list[{cell.weights.__name__}]")]
    settings = _STACK_KEYWORDS + [
        (k.name, k.annotation, spec.stack.defaults.get(k.name, k.default))
        for k in spec.keywords]
    upstream = [*((f"d_{n}", "Array | None", None)
                  for n in ("h", *(f"{s.removesuffix('0')}_final" for s in cell.states))),
                ("d_layers", "list | None", None)]
    upstream_t = [(f"{d}_tangent", a, default) for d, a, default in upstream]
    options = [(k.name, k.annotation, k.default) for k in spec.grad_options]
    tangents, saved = [("tangents", f"{grads} | None")], [("stack", result)]
    a, checked = f"_cell, x, ({', '.join(cell.states)},), weights", "_checked(stack, _result)"
    kinds = {  # suffix: positional, keywords, returns, call
        "": (positional, settings, result, f"_forward({a}, backend=backend, **{kw(settings)})"),
        "_jvp": (positional + tangents, settings, f"tuple[{result}, {result}]",
                 f"_forward_jvp({a}, tangents, backend=backend, **{kw(settings)})"),
        "_grad": (positional + saved, upstream + options, grads,
                  f"_backward({a}, {checked}, {kw(upstream)}, backend, **{kw(options)})"),
        "_grad_jvp": (positional + saved + tangents, upstream + upstream_t + options,
                      f"tuple[{grads}, {grads}]",
                      f"_backward_jvp({a}, {checked}, tangents, {kw(upstream + upstream_t)}, "
                      f"backend, **{kw(options)})")}
    namespace = {"_cell": cell, "_result": cell.result, "_forward": _forward,
                 "_forward_jvp": _forward_jvp, "_backward": _backward,
                 "_backward_jvp": _backward_jvp, "_checked": _checked}
    return {f"{name}{suffix}": _public.function(
                f"{name}{suffix}", given, [*keywords, ("backend", "str | None", None)],
                returns, f"return {call}", namespace, spec.docs[f"{name}{suffix}"], __name__)
            for suffix, (given, keywords, returns, call) in kinds.items()}


def _checked(stack, kind):
    """TypeError unless ``stack`` is the result of the stack's forward, with its record (its
    directions and masks cannot be told from its arrays)."""
    if not isinstance(stack, kind):
        raise TypeError(f"stack must be the {kind.__name__} its forward returned, got "
                        f"{type(stack).__name__}")
    if stack.settings is None:
        raise ValueError(f"stack records nothing (a {kind.__name__} rebuilt by hand?): pass "
                         "the result its forward returned, which records its directions "
                         "and masks")
    return stack


globals().update({name: made for spec in SPECS.values()
                  for name, made in _stack_functions(spec).items()})

__all__ = [f"{spec.stack_name}{mode}" for spec in SPECS.values()
           for mode in ("", "_jvp", "_grad", "_grad_jvp")]
