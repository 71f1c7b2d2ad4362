"""The nine forward ops as ``torch.library`` custom ops: what torch.compile sees
(docs/adapters.md).

Under ``torch.compile`` ``gradcells.torch.<op>`` calls ``torch.ops.gradcells.<op>``, an op
Dynamo and AOTAutograd treat as opaque (they never trace into gc, Numba or CuPy), with a
fake implementation that gives the outputs' shapes from the op's shape labels
(``gradcells.cells``) and an autograd formula that calls
``torch.ops.gradcells.<op>_grad``. Both ops are built here from the op table, each with one
flat schema read from ``gc.<op>``'s signature:

    gradcells::<op>(Tensor[] primals, bool[] given, Tensor?[] constants, <settings>)
        -> Tensor[]
    gradcells::<op>_grad(Tensor[] primals, bool[] given, Tensor?[] constants,
                         Tensor[] outputs, Tensor[] upstream, <settings>) -> Tensor[]

* ``primals``: the primals given, and ``given`` which they are of the op's full list:
  ``x``, the states, then each weight set's arrays in ``spec.flat_arrays`` order (an LSTM's
  ``layer_norm`` as its six arrays); a stack has one such run per weight set. (Not one
  ``Tensor?[]`` with Nones: AOTAutograd then takes no output of the op to require grad.)
* ``constants``: the masks and ``seq_len`` the op takes (None: not given), then a stack's
  ``dropout_masks``.
* ``<settings>``: every other keyword of ``gc.<op>``, typed by its annotation.
* ``outputs``: the result's arrays (``_bridge.arrays`` order), then a one-element int64
  **handle** that keeps the gc result (with the settings it records, which ``_grad``
  needs) alive as long as the handle tensor lives.
* ``upstream``: the gradients of the result's arrays, all of them, in order;
  ``_bridge.upstream_keywords`` maps them to ``_grad``'s keywords.
* ``_grad``'s outputs: the gradients of ``primals``, in order.

The fake implementation reads the result's shapes from the op's shape labels: the
time-major ones derived from ``x`` and the states, or those an op in its own layout
declares (``OpSpec.labels``: the selective scan's ``[Bt, Dm, L]``); a field computed only
on request (``OpSpec.optional_results``: the selective scan's ``last_state``) is None, real
and fake, unless asked for.

Under torch.compile the result records no settings (``result.settings`` is None), and
there is no forward mode or second order (torch.compile has neither for custom ops); eager
calls keep all of them (``_functions``).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import weakref

import numpy as np
import torch

import gradcells as gc

from .._core import trees
from .._core.specs import MASKS, shaped
from ..cells import OPS, SCAN_SPECS, STACKS
from ._bridge import (
    Op,
    arrays,
    backend_only,
    like,
    on_device,
    stack_types,
    to_tensor,
    upstream_keywords,
    view,
)

_NAMESPACE = "gradcells"
_SCHEMA_TYPES = {"float": "float", "float | None": "float?", "bool": "bool", "str": "str",
                 "str | None": "str?"}
"""The schema type of each settings keyword's annotation."""


class _Out:
    """One result array's shape, where the fake implementation makes an empty tensor."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)


def _time_second(labels):
    """A per-step field's labels in the batch-first layout (``T, B`` swapped)."""
    return (labels[1], labels[0], *labels[2:]) if labels[:1] == ("T",) else labels


class _Layout:
    """One op's flat schema: where each primal, constant and setting goes."""

    def __init__(self, name: str):
        self.op = op = Op(name)
        parameters = inspect.signature(getattr(gc, name)).parameters
        self.n_head = len(op.spec.inputs) + len(op.spec.states)   # x (or a, b) and the states
        self.set_names = op.spec.flat_arrays[self.n_head:]        # one weight set's arrays
        self.constants = tuple(n for n in (*MASKS, "seq_len", *op.spec.constants)
                               if n in parameters)
        self.dropout = "dropout_masks" in parameters
        skip = (*op.primal_args, *self.constants, "dropout_masks")
        self.settings = tuple(p for p in parameters.values() if p.name not in skip)
        _, self.stack_result, self.stack_grads = stack_types(name) if op.stack else (None,) * 3

    def schema(self, grad: bool) -> str:
        settings = ", ".join(f"{_SCHEMA_TYPES[p.annotation]} {p.name}" for p in self.settings)
        middle = "Tensor[] outputs, Tensor[] upstream, " if grad else ""
        return (f"(Tensor[] primals, bool[] given, Tensor?[] constants, {middle}{settings}) "
                "-> Tensor[]")

    def flat(self, tree) -> list:
        """A primal (or gradient) tree's arrays in the schema's order."""
        nested = self.op.spec.nested
        if self.op.stack:
            tree = tree._replace(weights=[_padded(ws, nested) for ws in tree.weights])
            return trees.leaves(tree)
        return trees.leaves(_padded(tree, nested))

    def tree(self, primals, given):
        """The primal tree of the schema's ``primals`` and ``given``."""
        flat = _padded_list(primals, given)
        width, rest = len(self.set_names), flat[self.n_head:]
        sets = ([self._weight_set(rest[k:k + width]) for k in range(0, len(rest), width)]
                if width else [()])                               # an op without weights
        if self.op.stack:
            return self.stack_grads(*flat[:self.n_head], sets)
        return self.op.spec.grads(*flat[:self.n_head], *sets[0])

    def _weight_set(self, items):
        fields = dict(zip(self.set_names, items, strict=True))
        for name, kind in self.op.spec.nested.items():   # the LSTM's layer_norm
            parts = [fields.pop(f"{name}.{n}") for n in kind._fields]
            fields[name] = None if all(a is None for a in parts) else kind(*parts)
        return self.op.spec.weights(**fields)

    def config(self, constants, settings) -> dict:
        """``gc.<op>``'s keywords: the settings and the constants as backend arrays."""
        config = {p.name: value for p, value in zip(self.settings, settings, strict=True)}
        named, masks = constants[:len(self.constants)], constants[len(self.constants):]
        config.update((n, view(c, n)) for n, c in zip(self.constants, named, strict=True))
        if self.dropout:
            config["dropout_masks"] = [view(m, "dropout_masks") for m in masks] or None
        return config

    def setting(self, settings, name, default=False):
        names = [p.name for p in self.settings]
        return settings[names.index(name)] if name in names else default

    def template(self, primals, given, settings):
        """The result's structure, an ``_Out`` for each array (None for a field computed
        only on request and not requested: ``OpSpec.optional_results``): shapes from the
        op's shape labels and the sizes of ``x`` and the states, or of every input given
        where the op declares its arrays' labels (``OpSpec.labels``: the selective scan's
        Mamba layout, an optional axis dropped by ``shaped``). Symbolic sizes stay
        symbolic."""
        spec, x = self.op.spec, primals[0]
        head = _padded_list(primals, given)[:self.n_head]
        inputs, states = head[:len(spec.inputs)], head[len(spec.inputs):]
        batch_first = self.setting(settings, "batch_first")
        order = _time_second if batch_first else (lambda labels: labels)
        if spec.labels:
            sizes = {}
            for name, array in zip(spec.inputs, inputs, strict=True):
                if array is not None:
                    labels = shaped(order(spec.input_labels(name)), array.dim())
                    sizes.update(zip(labels, array.shape, strict=True))
        else:
            sizes = dict(zip(order(spec.x_labels), x.shape, strict=True))
        for labels, state in zip(spec.state_labels, states, strict=True):
            sizes.update(zip(labels, state.shape[-2:], strict=True))
        asked = {f: bool(self.setting(settings, flag))
                 for f, flag in spec.optional_results.items()}
        one = spec.result(*(_Out(sizes[a] for a in order(labels)) if asked.get(f, True)
                            else None
                            for f, labels in zip(spec.result._fields, spec.result_labels(),
                                                 strict=True)))
        if not self.op.stack:
            return one
        directions = 2 if self.setting(settings, "bidirectional") else 1
        n_sets = (len(given) - self.n_head) // len(self.set_names)
        return self.stack_result(_Out((*x.shape[:2], directions * states[-1].shape[-1])),
                                 *(_Out(s.shape) for s in states), (one,) * n_sets)


def _padded_list(primals, given) -> list:
    """The op's full list of primals: ``primals`` where ``given``, None elsewhere."""
    items = iter(primals)
    return [next(items) if k else None for k in given]


def _padded(weights, nested):
    """A weight set (or a cell's primal tree) with each missing nested weight set (``nested``:
    the op's, the LSTM's ``layer_norm``) as a tuple of Nones."""
    missing = {name: kind(*(None,) * len(kind._fields)) for name, kind in nested.items()
               if getattr(weights, name) is None}
    return weights._replace(**missing) if missing else weights


# -- the handle: the gc result beside the outputs --------------------------------------------


class _Held(np.ndarray):
    """The handle's one int64 (a key of ``_RESULTS``), holding the gc result as ``.result``;
    the tensor made from it keeps it alive, and ``_RESULTS`` forgets it when it dies."""


_RESULTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def _handle(result) -> torch.Tensor:
    key = next(_KEYS)
    held = np.array([key], dtype=np.int64).view(_Held)
    held.result = result
    _RESULTS[key] = held
    return torch.from_numpy(held)


def _result_of(handle: torch.Tensor, name: str):
    held = _RESULTS.get(int(handle[0]))
    if held is None:
        raise RuntimeError(f"gradcells::{name}_grad: the forward's result is gone (its "
                           f"handle, the last output of gradcells::{name}, was copied or freed)")
    return held.result


# -- outputs a custom op may return ----------------------------------------------------------


def _span(t):
    """The bytes tensor ``t`` reaches, ``(device, first, end)`` (an empty range if empty)."""
    if t.numel() == 0:
        return t.device, 0, 0
    low = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if s > 0)
    size = t.element_size()
    return t.device, t.data_ptr() + low * size, t.data_ptr() + (high + 1) * size


def _fresh(tensors, inputs) -> list:
    """``tensors`` as a custom op must return them: contiguous (as the fake ones are) and
    sharing memory with no input and no other output (a copy where one would)."""
    taken, out = [_span(t) for t in inputs if t is not None], []
    for t in tensors:
        span = _span(t)
        if not t.is_contiguous() or any(d == span[0] and a < span[2] and span[1] < b
                                        for d, a, b in taken):
            t = t.clone(memory_format=torch.contiguous_format)
            span = _span(t)
        taken.append(span)
        out.append(t)
    return out


# -- the two ops -----------------------------------------------------------------------------


def _forward_impl(layout: _Layout):
    def forward(primals, given, constants, *settings):
        with on_device(primals[0].device):
            config = layout.config(constants, settings)
            result = layout.op.call("", layout.tree([view(t) for t in primals], given), config)
            outputs = _fresh([to_tensor(a) for a in arrays(result)], [*primals, *constants])
        return [*outputs, _handle(result)]

    def fake(primals, given, constants, *settings):
        shapes = arrays(layout.template(primals, given, settings))
        dtype = functools.reduce(torch.promote_types,   # a real a with a complex b: b's
                                 (p.dtype for p in primals[:len(layout.op.spec.inputs)]))
        return [*(primals[0].new_empty(o.shape, dtype=dtype) for o in shapes),
                torch.empty(1, dtype=torch.int64)]

    return forward, fake


def _grad_impl(layout: _Layout):
    op = layout.op

    def grad(primals, given, constants, outputs, upstream, *settings):
        result = _result_of(outputs[-1], op.name)
        with on_device(primals[0].device):
            # AOTAutograd hands every unused output a zero gradient: those add nothing, and
            # left out, the gradient runs no pass for them (the gates' when no loss reads them)
            keywords = {k: view(u) for k, u in upstream_keywords(op, result, upstream).items()
                        if bool(u.any())}
            grads = op.call("_grad", layout.tree([view(t) for t in primals], given),
                            backend_only(layout.config(constants, settings)),
                            **{op.result_arg: result}, **keywords)
            grads = [to_tensor(g) for g, k in zip(layout.flat(grads), given, strict=True) if k]
            return _fresh(grads, [*primals, *constants, *outputs, *upstream])

    def fake(primals, given, constants, outputs, upstream, *settings):
        return [p.new_empty(p.shape) for p in primals]

    return grad, fake


def _autograd(layout: _Layout):
    """The forward op's ``(backward, setup_context)``: ``gradcells::<op>_grad`` on every
    output's gradient (the handle's dropped)."""
    grad_op = f"{layout.op.name}_grad"

    def setup_context(ctx, inputs, output):
        primals, given, constants, *settings = inputs
        ctx.save_for_backward(*primals, *constants, *output)
        ctx.sizes, ctx.given, ctx.settings = (len(primals), len(constants)), given, settings
        # torch.library matches the backward's return to the inputs' pytree, where a list
        # holding a None is one leaf and a list of tensors a node.
        ctx.no_constants = [None] * len(constants) if all(c is not None for c in constants) \
            else None

    def backward(ctx, grads):
        (n, m), saved = ctx.sizes, list(ctx.saved_tensors)
        d = getattr(torch.ops.gradcells, grad_op)(saved[:n], ctx.given, saved[n:n + m],
                                                  saved[n + m:], list(grads[:-1]),
                                                  *ctx.settings)
        return (list(d), None, ctx.no_constants, *(None,) * len(ctx.settings))

    return backward, setup_context


def _no_second_order(layout: _Layout):
    name = layout.op.name

    def backward(ctx, grads):
        raise RuntimeError(f"gradcells::{name}_grad: a second derivative under torch.compile; "
                           "torch.compile does not differentiate twice: call "
                           f"gradcells.torch.{name} eagerly for second order")

    return backward, lambda ctx, inputs, output: None


def _define(name: str) -> _Layout:
    layout = _Layout(name)
    for suffix, (impl, fake), (backward, setup) in (
            ("", _forward_impl(layout), _autograd(layout)),
            ("_grad", _grad_impl(layout), _no_second_order(layout))):
        qualified = f"{_NAMESPACE}::{name}{suffix}"
        op = torch.library.custom_op(qualified, impl, mutates_args=(),
                                     schema=layout.schema(grad=bool(suffix)))
        op.register_fake(fake)
        op.register_autograd(backward, setup_context=setup)
    return layout


_LAYOUTS = {name: _define(name) for name in (*OPS, *STACKS, *SCAN_SPECS)}
"""Every forward op's flat schema, its two custom ops defined."""


def _as_tensor(value):
    """A constant for the schema: None, a tensor (checked by the caller), or anything
    ``torch.as_tensor`` takes (a NumPy array, a list of lengths)."""
    return value if value is None or isinstance(value, torch.Tensor) else torch.as_tensor(value)


def call(op: Op, tree, settings: dict, constants: dict):
    """``gradcells.torch.<op>`` under torch.compile: ``torch.ops.gradcells.<op>`` on the
    primal ``tree``, the ``settings`` keywords given (the others at their defaults) and the
    ``constants`` given (checked); the result (recording no settings) of its outputs."""
    layout = _LAYOUTS[op.name]
    flat = layout.flat(tree)
    primals, given = [p for p in flat if p is not None], [p is not None for p in flat]
    flat_constants = [_as_tensor(constants.get(n)) for n in layout.constants]
    flat_constants += [_as_tensor(m) for m in constants.get("dropout_masks") or ()]
    values = [settings.get(p.name, p.default) for p in layout.settings]
    outputs = getattr(torch.ops.gradcells, op.name)(primals, given, flat_constants, *values)
    return like(layout.template(primals, given, values), iter(outputs))
