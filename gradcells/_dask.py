"""Dask arrays in (docs/spec.md §13): every public cell, sequence and stack function, and its
``_grad``, ``_jvp`` and ``_grad_jvp``, runs on dask arrays chunked along the batch axis;
so does the linear scan (docs/spec.md §18.1; ``SCAN_SPECS``: its ``a`` and ``b`` are read as
``x``, its ``resets`` as a per-step constant), and Mamba's selective scan (§18.4), whose
arrays are labelled by its spec (``OpSpec.labels``: ``u, delta, z, B, C`` and the result
chunked along ``Bt``, their other axes, ``L`` among them, one chunk; ``A``, ``D`` and
``delta_bias`` whole, their gradients summed as the weights' are).

A call whose first argument (``x``) is a dask array comes here from
``gradcells._interop.accepts_any_array``. The contract:

* **Chunks.** Every argument with a batch axis (``x``, the states, a result's fields, the
  upstream gradients and their tangents, the tangents of ``x`` and the states, ``seq_len``,
  the masks that have the batch axis) is one chunk along every other axis and chunked along
  the batch like ``x``; which axis is the batch comes from the op's shape labels in
  ``gradcells._core.specs`` (``("T", "B", "I")``, ``("B", "H")``, ..., T and B swapped with
  ``batch_first``; an optional axis an array lacks dropped, ``specs.shaped``; a mask
  broadcast along the batch has none). Weights, and their tangents,
  have no batch axis: one chunk each. Anything else is a ``ValueError`` naming the argument
  and the ``rechunk`` that fixes it; so are unknown chunk sizes (NaN).
* **Mixed arguments.** Any argument but ``x`` may be a NumPy (or CuPy) array instead: one with
  a batch axis is chunked like ``x`` (``dask.array.from_array``), a weight is given whole to
  every chunk; ``seq_len`` may be a list. A dask array with a NumPy ``x`` is not routed here
  (the validation refuses it).
* **Compute.** One ``dask.array.blockwise`` call over the batch blocks runs the public
  function itself on each block's NumPy or CuPy chunks (so the chunk type picks the backend:
  cpu or gpu); nothing computes until the results do. Every result array is a lazy dask
  array: with a batch axis, chunked like ``x``; without (the weight gradients and their
  tangents), the per-block values summed by dask's tree reduction (``Array.sum``), which for
  a gradient is exact since the batch loss is the sum of the blocks' losses.
* **Checked at call time** (docs/spec.md §16.3). Before anything is built, the public
  function runs once on a zero-row stand-in of the call, made from the arguments' metadata
  alone: each array with a batch axis as an empty array of its chunk type and dtype, 0 rows
  on that axis; each array without one as a zero-stride array of its shape; a forward's
  dask result as its forward's zero-row result (``DaskRecord.meta``), so a gradient is
  checked against its forward's record; ``backend=None`` as ``"reference"`` (nothing to
  compile). Whatever that call raises (a wrong shape, dtype, setting, weight chain) is
  raised here, the message the NumPy call gives (its shapes read 0 rows on the batch axis;
  a note says so). A ``seq_len`` given as a NumPy array or list has its values checked here
  too; a dask ``seq_len``'s values only at ``compute()``, which raises the same named
  ``ValueError`` from the block that holds the bad length.
* **Records.** A forward's (and a ``_jvp``'s primal) dask result records a ``DaskRecord`` as
  its ``settings``: its gradient, given that result, needs only arrays and upstreams, as for
  NumPy (docs/spec.md §10); each block's gradient reads that block's forward result with its
  own record, so it must be chunked as the forward was. A result tuple of dask arrays built
  by hand records nothing and the keywords decide (stacks always need the record).

``dask`` is never imported here: the caller imported it to make the array
(``sys.modules``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import sys

import numpy as np

from . import _validate as v
from ._core import arrays, trees
from ._core.specs import MASKS, shaped
from ._core.types import record_settings
from .cells import OPS, SCAN_SPECS, SPECS, STACKS, cell_of

_SUFFIXES = ("_grad_jvp", "_grad", "_jvp", "")
_BATCH = "B"
_BLOCK = "b"                  # the blockwise index of the batch blocks


@dataclasses.dataclass(frozen=True, eq=False)
class DaskRecord:
    """What a dask result records as its ``settings``: ``blocks``, a one-dimensional dask
    array of objects whose block k is block k's NumPy (or CuPy) result, recording its
    settings; ``batch_chunks``, the batch's chunk sizes; ``keywords``, the forward's scalar
    keywords as given (``batch_first``, ``bidirectional``, ...); ``meta``, the forward's
    result on the zero-row stand-in of its call, recording its settings (the call-time
    check of a gradient reads it)."""

    blocks: object
    batch_chunks: tuple
    keywords: dict
    meta: object = None


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where block k's chunk of the ``index``-th blockwise argument goes."""

    index: int


@dataclasses.dataclass(frozen=True)
class _Out:
    """One result array: its full shape and its batch axis (None: summed over blocks)."""

    shape: tuple
    axis: int | None


@dataclasses.dataclass
class _Call:
    """One routed call: the op, its layout, the batch blocks, the blockwise arguments."""

    suffix: str
    spec: object
    stack: bool
    batch_first: bool
    batch: int
    chunks: tuple
    arguments: dict = dataclasses.field(default_factory=dict)
    pairs: list = dataclasses.field(default_factory=list)
    inputs: dict = dataclasses.field(default_factory=dict)      # path -> _Out


def _da():
    return sys.modules["dask.array"]


def _resolve(name):
    """``(base op, suffix)`` of a public function's name (``"lstm_sequence", "_grad"``)."""
    for suffix in _SUFFIXES:
        base = name[:len(name) - len(suffix)] if suffix else name
        if name.endswith(suffix) and (base in OPS or base in STACKS or base in SCAN_SPECS):
            return base, suffix
    raise TypeError(f"{name} does not take dask arrays: the public cell, sequence and stack "
                    "functions (gc.lstm_sequence, ..., their _grad, _jvp, _grad_jvp) do")


def _labels(call, path):
    """The shape labels of the array at ``path`` (``()`` for a weight: no batch axis), in
    the call's layout, read from the op's specs."""
    spec, names = call.spec, [p for p in path if isinstance(p, str)]
    head, rest = names[0], names[1:]
    if head == "tangents" and rest:
        head, rest = rest[0], rest[1:]
    width = ("T", _BATCH, "W")                          # a stack's joined outputs
    if head == spec.result_arg and rest:
        labels = dict(zip(spec.result._fields, spec.result_labels(), strict=True))[rest[0]]
    elif head in spec.inputs:
        labels = spec.input_labels(head)
    elif head in spec.states:
        labels = spec.state_labels[spec.states.index(head)]
        labels = ("L", *labels) if call.stack else labels
    elif head in ("d_layers", "d_layers_tangent") and rest:
        labels = spec.upstream_labels(f"d_{rest[0]}")    # a stack's run's field, per run
    elif head.startswith("d_"):
        upstream = head.removesuffix("_tangent")
        labels = spec.upstream_labels(upstream)
        if call.stack:
            labels = width if upstream == "d_h" else ("L", *labels)
    elif head == "seq_len":
        labels = (_BATCH,)
    elif head in MASKS or head in spec.constants:        # data with labels of its own
        labels = {**MASKS, **spec.constants}[head]
    elif head == "dropout_masks":
        labels = width
    else:
        labels = ()
    if call.batch_first and labels[:1] == ("T",):
        labels = (labels[1], labels[0], *labels[2:])
    return labels


def _batch_axis(call, path, shape):
    """The batch axis of an array of ``shape`` at ``path``, or None (none, or broadcast:
    the labels, an optional axis the array lacks dropped, are aligned from the right, as
    broadcasting does)."""
    labels = shaped(_labels(call, path), len(shape))
    labels = labels[max(0, len(labels) - len(shape)):]
    if _BATCH not in labels:
        return None
    axis = len(shape) - len(labels) + labels.index(_BATCH)
    if shape[axis] == call.batch:
        return axis
    if shape[axis] == 1 and path[0] in (*MASKS, "dropout_masks"):
        return None                                         # a mask broadcast over rows
    raise ValueError(f"{trees.label(path)} has {shape[axis]} rows on its batch axis {axis}, "
                     f"{call.spec.inputs[0]} has {call.batch}")


def _rechunk_hint(name, a, axis, chunk):
    spelled = ", ".join(f"{k}: {chunk if k == axis else -1}" for k in range(a.ndim))
    return f"rechunk it: {name}.rechunk({{{spelled}}})"


def _checked_chunks(call, path, a, axis):
    """ValueError unless dask array ``a`` is one chunk off the batch axis ``axis`` and, on
    it, chunked like ``x``."""
    name = trees.label(path)
    chunk = call.chunks[0] if call.chunks else 1
    for k, dim in enumerate(a.chunks):
        if k != axis and len(dim) > 1:
            what = "it has no batch axis" if axis is None else f"its batch axis is {axis}"
            raise ValueError(f"{name} is chunked along axis {k} ({what}); gradcells chunks "
                             f"only along the batch: {_rechunk_hint(name, a, axis, chunk)}")
    if axis is not None and a.chunks[axis] != call.chunks:
        raise ValueError(f"{name}'s batch chunks {a.chunks[axis]} differ from "
                         f"{call.spec.inputs[0]}'s {call.chunks}: "
                         f"{_rechunk_hint(name, a, axis, call.chunks)}")


def _array_slot(call, path, value):
    """``value`` (an array at ``path``) as the call's template holds it: a ``_Slot`` for a
    blockwise argument, or the array itself (a NumPy weight, given whole)."""
    da = _da()
    if arrays.is_dask(value) and any(math.isnan(c) for dim in value.chunks for c in dim):
        raise ValueError(f"{trees.label(path)} has unknown chunk sizes (NaN); call "
                         f"{trees.label(path)}.compute_chunk_sizes() first")
    axis = _batch_axis(call, path, value.shape)
    call.inputs[path] = _Out(tuple(value.shape), axis)
    if arrays.is_dask(value):
        _checked_chunks(call, path, value, axis)
    elif axis is None:
        return value
    else:
        value = da.from_array(value, chunks=tuple(call.chunks if k == axis else -1
                                                  for k in range(value.ndim)))
    index = tuple(_BLOCK if k == axis else f"{len(call.pairs)}.{k}" for k in range(value.ndim))
    call.pairs.append((value, index))
    return _Slot(len(call.pairs) - 1)


def _records_blocks(value):
    return isinstance(getattr(value, "settings", None), DaskRecord)


def _template(call, value, path):
    """The argument ``value`` at ``path`` with every array replaced as ``_array_slot``
    says and a dask result (its record) by its forward blocks, its nodes rebuilt."""
    return trees.map_with_path(functools.partial(_template_leaf, call), _argument(value, path),
                               path, is_leaf=_records_blocks)


def _argument(value, path):
    """An argument as the call reads it: a ``seq_len`` list as an array, else as given."""
    return np.asarray(value) if path == ("seq_len",) and isinstance(value, (list, tuple)) else value


def _template_leaf(call, value, path):
    record = getattr(value, "settings", None)
    if isinstance(record, DaskRecord):
        if record.batch_chunks != call.chunks:
            raise ValueError(f"{trees.label(path)} was computed on batch chunks "
                             f"{record.batch_chunks}, x has {call.chunks}: chunk the "
                             "gradient's arrays as the forward's")
        call.pairs.append((record.blocks, (_BLOCK,)))
        return _Slot(len(call.pairs) - 1)
    if arrays.is_dask(value) or arrays.library_of(value) in arrays.NATIVE:
        return _array_slot(call, path, value)
    return value


def _filled(template, blocks):
    """``template`` with each ``_Slot`` replaced by its block (lists of one block, as
    blockwise passes an axis it does not concatenate, unwrapped)."""
    return trees.map_leaves(lambda leaf: _block(leaf, blocks) if isinstance(leaf, _Slot)
                            else leaf, template)


def _block(slot, blocks):
    block = blocks[slot.index]
    while isinstance(block, list):
        block = block[0]
    return block


def _run_block(*blocks, function, template):
    """One batch block: the public function ``function`` (module, name) on its chunks."""
    module, name = function
    return getattr(importlib.import_module(module), name)(**_filled(template, blocks))


def _part(block, path, expand):
    """Field ``path`` of a block's result; with ``expand``, with a leading axis of one."""
    block = trees.at(block, path)
    return block[None] if expand else block


def call(func, args, kwargs):
    """``func`` (a public function) on dask arguments, as the module docstring says."""
    base, suffix = _resolve(func.__name__)
    bound = inspect.signature(func).bind(*args, **kwargs).arguments
    stack = base in STACKS
    spec = SCAN_SPECS[base] if base in SCAN_SPECS else OPS[STACKS.get(base, base)]
    record = next((v.settings for v in bound.values()
                   if isinstance(getattr(v, "settings", None), DaskRecord)), None)
    keywords = {**(record.keywords if record else {}),
                **{k: v for k, v in bound.items() if v is not None and _scalar(v)}}
    if stack and "stack" in bound and not isinstance(getattr(bound["stack"], "settings", None),
                                                     DaskRecord):
        raise ValueError("stack must be the dask result its forward returned, which records "
                         "its blocks")
    first = spec.inputs[0]                              # x (a, the linear scan's)
    x = bound[first]
    call = _Call(suffix, spec, stack, bool(keywords.get("batch_first")), 0, (), bound)
    labels = _labels(call, (first,))
    if x.ndim != len(labels):
        raise ValueError(f"{first} must be [{', '.join(labels)}], got shape {x.shape}")
    axis = labels.index(_BATCH)
    call.batch, call.chunks = x.shape[axis], x.chunks[axis]
    template = {name: _template(call, value, (name,)) for name, value in bound.items()}
    meta = _checked(call, func, bound)
    return _results(call, func, template, x, keywords, meta)


_NOTE = ("gradcells checked this dask call at call time on its arguments' metadata: shapes "
         "above read 0 rows on the batch axis")


def _checked(call, func, bound):
    """The call-time check (see the module): ``func`` run on the zero-row stand-in of the
    call, whose result it returns (a forward's is its ``DaskRecord.meta``); a NumPy or
    list ``seq_len``'s values checked against x's T."""
    stand_in = {name: trees.map_with_path(functools.partial(_stand_in, call),
                                          _argument(value, (name,)), (name,),
                                          is_leaf=_records_blocks)
                for name, value in bound.items()}
    if "backend" in inspect.signature(func).parameters and bound.get("backend") is None:
        stand_in["backend"] = "reference"
    lengths = bound.get("seq_len")
    try:
        if isinstance(lengths, (list, tuple)) or arrays.library_of(lengths) == "numpy":
            x = bound[call.spec.inputs[0]]
            v.seq_len_value(lengths, "numpy",
                            np.broadcast_to(np.zeros((), x.dtype), x.shape), call.batch_first)
        return func(**stand_in)
    except (TypeError, ValueError) as error:
        if hasattr(error, "add_note"):                  # Python 3.11 on
            error.add_note(_NOTE)
        raise


def _stand_in(call, value, path):
    """The argument ``value`` at ``path`` in the zero-row stand-in of the call."""
    record = getattr(value, "settings", None)
    if isinstance(record, DaskRecord):
        return record.meta
    out = call.inputs.get(path)
    if out is None:
        return value                                    # not an array
    if arrays.is_dask(value):
        xp = arrays.namespace_of(value._meta)
        if out.axis is None:
            return xp.broadcast_to(xp.zeros((), value.dtype), value.shape)
        return xp.empty(tuple(0 if k == out.axis else n for k, n in enumerate(value.shape)),
                        value.dtype)
    return value if out.axis is None else value[(slice(None),) * out.axis + (slice(0, 0),)]


def _scalar(value):
    return isinstance(value, (bool, int, float, str))


def _results(call, func, template, x, keywords, meta):
    """The blockwise call over the batch blocks and the result's dask arrays (``meta``: the
    call-time check's result, which a forward's record keeps)."""
    da = _da()
    xp = arrays.namespace_of(x._meta)
    packed = da.blockwise(_run_block, (_BLOCK,), *(item for pair in call.pairs for item in pair),
                          dtype=object, meta=np.empty((0,), dtype=object),
                          concatenate=False, align_arrays=False,
                          function=(func.__module__, func.__name__), template=template)
    result = trees.map_with_path(
        lambda node, path: (_result_array(packed, path, node, x.dtype, xp)
                            if isinstance(node, _Out) else node),
        _out_template(call, keywords, meta))
    if call.suffix in ("", "_jvp"):
        primal = result if call.suffix == "" else result[0]   # a _jvp's (primal, tangent)
        blocks = packed if call.suffix == "" else da.blockwise(
            _part, (_BLOCK,), packed, (_BLOCK,), dtype=object,
            meta=np.empty((0,), dtype=object), path=(0,), expand=False)
        record_settings(primal, DaskRecord(blocks, call.chunks, keywords,
                                           meta if call.suffix == "" else meta[0]))
    return result


def _result_array(packed, path, out, dtype, xp):
    """The dask array of result field ``path``: the blocks' fields joined along the batch,
    or (no batch axis) summed over the blocks by a tree reduction."""
    da = _da()
    names = tuple(f"o{k}" for k in range(len(out.shape)))
    new_axes = {n: size for k, (n, size) in enumerate(zip(names, out.shape, strict=True))
                if k != out.axis}
    meta = xp.empty((0,) * len(out.shape), dtype=dtype)
    if out.axis is not None:
        index = tuple(_BLOCK if k == out.axis else n for k, n in enumerate(names))
        return da.blockwise(_part, index, packed, (_BLOCK,), new_axes=new_axes, dtype=dtype,
                            meta=meta, path=path, expand=False)
    parts = da.blockwise(_part, (_BLOCK, *names), packed, (_BLOCK,), new_axes=new_axes,
                         adjust_chunks={_BLOCK: 1}, dtype=dtype,
                         meta=xp.empty((0,) * (len(out.shape) + 1), dtype=dtype), path=path,
                         expand=True)
    return parts.sum(axis=0, dtype=dtype)


def _out_template(call, keywords, meta):
    """The result's structure, an ``_Out`` for every array: a forward's fields from the
    result labels and the sizes of the inputs and the states (None where the call-time
    check's result ``meta`` has none); a gradient's, its inputs'."""
    if call.suffix in ("_grad", "_grad_jvp"):
        grads = _grads_template(call)
        return grads if call.suffix == "_grad" else (grads, grads)
    result = (_stack_template(call, keywords) if call.stack
              else _sequence_template(call, meta if call.suffix == "" else meta[0]))
    return result if call.suffix == "" else (result, result)


def _sizes(call):
    """Every label's size, from the inputs and the states given (T, B, I, H, P; the
    selective scan's Dm and N)."""
    sizes = {}
    for name in (*call.spec.inputs, *call.spec.states):
        given = call.inputs.get((name,))
        if given is not None:
            labels = shaped(_labels(call, (name,)), len(given.shape))
            sizes.update(zip(labels, given.shape, strict=True))
    return sizes


def _fields_out(call, labels_of, sizes):
    return [_Out(tuple(sizes[a] for a in labels), labels.index(_BATCH))
            for labels in labels_of]


def _sequence_template(call, meta=None):
    """An op's result: its fields' labels (per-step ones in the call's layout); a field
    the call-time check's result ``meta`` holds as None (the selective scan's
    ``last_state`` not asked for) None."""
    spec, sizes = call.spec, _sizes(call)
    labels = [(lab[1], lab[0], *lab[2:]) if call.batch_first and lab[:1] == ("T",) else lab
              for lab in spec.result_labels()]
    outs = _fields_out(call, labels, sizes)
    if meta is not None:
        outs = [None if field is None else out for out, field in zip(outs, meta, strict=True)]
    return spec.result(*outs)


def _stack_type(call, grads):
    """The stack's result or gradient type (``LSTMStack``, ``LSTMStackGrads``, ...)."""
    stack = SPECS[cell_of(call.spec.name)].stack
    return stack.grads if grads else stack.result


def _stack_template(call, keywords):
    """A stack's result: its top outputs ``[T, B, D·P]``, the final states (the initial
    states' shapes) and one sequence result per weight set."""
    layer = _sequence_template(call)
    x, h0 = call.inputs[("x",)], call.inputs[(call.spec.states[-1],)]
    directions = 2 if keywords.get("bidirectional") else 1
    top = list(x.shape[:2]) + [directions * h0.shape[-1]]
    n_sets = len(call.arguments["weights"])
    finals = [call.inputs[(name,)] for name in call.spec.states]
    return _stack_type(call, False)(_Out(tuple(top), x.axis), *finals, (layer,) * n_sets)


def _grads_template(call):
    """A gradient's structure: each input's ``_Out`` (None for one not given)."""
    def outs(path, value):
        return trees.map_with_path(lambda _, leaf_path: call.inputs.get(leaf_path), value, path)
    if call.stack:
        weights = call.arguments.get("weights", ())
        return _stack_type(call, True)(
            call.inputs[("x",)], *(call.inputs[(s,)] for s in call.spec.states),
            [call.spec.weights(*outs(("weights", k), ws)) for k, ws in enumerate(weights)])
    return call.spec.grads(*(outs((name,), call.arguments.get(name))
                             for name in call.spec.arrays))
