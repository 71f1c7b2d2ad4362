"""The nine forward operations as differentiable PyTorch functions (docs/spec.md §13).

``gradcells.torch.<op>`` has ``gc.<op>``'s signature and result; its arrays are tensors (a
stack's ``weights`` a list of weight sets of tensors; masks and ``seq_len`` tensors or NumPy
arrays). Two ``torch.autograd.Function`` classes serve every op (``_Forward``, and
``_Backward`` its backward), the op named by an ``_Op`` that reads its arguments, result
fields and upstreams from the cells' specs (``gradcells.cells``):

* **forward** calls ``gc.<op>`` on zero-copy views of the tensors (NumPy on the CPU; CuPy
  on CUDA, on the tensor's device and PyTorch's current stream) and returns the result's
  arrays as tensors sharing their memory; the result records the forward's settings as
  ``gc``'s does.
* **backward** (reverse mode): ``gc.<op>_grad`` with the upstream gradients of the fields
  ``_grad`` takes (``d_h``, ``d_cs``, ``d_h_final``, ...). A gradient arriving on any other
  field (a gate, a stack's per-layer sequences) raises ``ValueError``: ``_grad`` has no
  upstream for it, and dropping it would be a silently wrong gradient.
* **jvp** (forward mode): ``gc.<op>_jvp``, called in place of ``gc.<op>`` when an argument
  is a dual tensor, so that forward mode costs one call.
* **double backward**: the backward is itself a function ``G(p, u) = J(p)ᵀu`` of the primals
  ``p`` and the upstream gradients ``u`` (``_Backward``). For a cotangent ``v`` of its
  output, ``vᵀ∂G/∂p = (∂/∂ε) G(p + εv, u)`` (the Hessian of ``uᵀf`` is symmetric), which is
  ``gc.<op>_grad_jvp(p, u, tangents=v)`` with zero upstream tangents, and
  ``vᵀ∂G/∂u = J(p)v``, the upstream fields of ``gc.<op>_jvp(p, v)``'s result tangent. Its
  forward mode is ``gc.<op>_grad_jvp`` along (primal tangents, upstream tangents). Third
  order raises (``_NoThirdOrder``).

Under ``torch.compile`` (``torch.compiler.is_compiling()``) the public functions call the
``torch.library`` custom ops of ``_library`` instead: reverse mode only, no settings record.

Not supported: ``torch.func.vmap`` (and so ``jacrev``, ``jacfwd``, ``hessian``, which
vmap); ``torch.func.grad`` and ``torch.func.jvp`` work, masks and lengths then as NumPy
arrays.

The primals travel as the leaves of a tree shaped like the op's gradient type (``x``, the
states, the weights with ``layer_norm`` an ``LSTMNorm``; a stack's weights a list of weight
sets), so a gradient or tangent of the same type maps onto them leaf by leaf.
"""

from __future__ import annotations

import inspect

import torch

import gradcells as gc

from .._core import trees
from .._core.arrays import namespace_of
from .._core.specs import MASKS
from ..cells import OPS, SCAN_SPECS, STACKS
from ._bridge import (
    Op,
    arrays,
    backend_only,
    like,
    on_device,
    primals_of,
    stack_types,
    tangent_name,
    to_tensor,
    upstream_keywords,
    upstream_path,
    view,
)
from ._library import call as library_call

_CONSTANTS = (*MASKS, "seq_len", "dropout_masks")
"""The array keywords that are data, not primals: never differentiated."""


# -- trees of arrays (gradcells._core.trees) ----------------------------------------------


def _tangent_arrays(d_result, result) -> list:
    """The arrays of a result's tangent ``d_result``, aligned with ``arrays(result)``; zeros
    where a field's tangent is None."""
    return [namespace_of(r).zeros_like(r) if d is None else d
            for r, d in zip(trees.leaves(result), trees.leaves_like(result, d_result),
                            strict=True)
            if hasattr(r, "shape")]


# -- one operation --------------------------------------------------------------------------


class _Box:
    """What travels beside the tensors into a Function and back: the device, the gc result
    (with its recorded settings), forward-mode tangents. A plain object, not a dict or tuple,
    so that torch.func's pytree handling passes it through as it is."""

    def __init__(self, **attributes):
        self.result = self.d_result = None
        self.__dict__.update(attributes)


class _Forward(torch.autograd.Function):
    """``gc.<op>`` on the primal leaves; outputs: the result's array leaves."""

    @staticmethod
    def forward(op, structure, config, box, *leaves):
        with on_device(box.device):
            primals = primals_of(structure, leaves)
            if box.tangents is None:
                result = op.call("", primals, config)
            else:   # forward mode: the result with its tangent, for jvp, in one call
                result, box.d_result = op.call(
                    "_jvp", primals, config, tangents=primals_of(structure, box.tangents))
            box.result = result
            return tuple(to_tensor(a) for a in arrays(result))

    @staticmethod
    def setup_context(ctx, inputs, output):
        op, structure, config, box, *leaves = inputs
        ctx.set_materialize_grads(False)
        # The outputs too: they share memory with the result the backward reads, and saving
        # them makes an in-place change of one an error in backward, not a wrong gradient.
        ctx.save_for_backward(*leaves, *output)
        ctx.op, ctx.structure, ctx.config = op, structure, config
        ctx.device, ctx.result, ctx.leaves, ctx.box = box.device, box.result, leaves, box

    @staticmethod
    def backward(ctx, *grads):
        result, op = ctx.result, ctx.op
        upstream = upstream_keywords(op, result, grads)
        names = tuple(upstream)
        leaves = ctx.saved_tensors[:len(ctx.leaves)]
        d_leaves = _Backward.apply(op, ctx.structure, ctx.config,
                                   _Box(result=result, device=ctx.device, names=names),
                                   *leaves, *upstream.values())
        return (None, None, None, None,
                *(d if need else None
                  for d, need in zip(d_leaves, ctx.needs_input_grad[4:], strict=True)))

    @staticmethod
    def jvp(ctx, *tangents):
        with on_device(ctx.device):
            d_result, ctx.box.d_result = ctx.box.d_result, None
            if d_result is None:   # tangents the call did not see (not dual before it)
                _, d_result = ctx.op.call("_jvp", primals_of(ctx.structure, ctx.leaves),
                                          ctx.config,
                                          tangents=primals_of(ctx.structure, tangents[4:]))
            return tuple(to_tensor(a) for a in _tangent_arrays(d_result, ctx.result))


class _Backward(torch.autograd.Function):
    """``gc.<op>_grad``: inputs the primal leaves then the upstream gradients named in
    ``names``; outputs the gradient's leaves (None where a primal is absent)."""

    @staticmethod
    def forward(op, structure, config, saved, *tensors):
        result, device, names = saved.result, saved.device, saved.names
        n = len(tensors) - len(names)
        with on_device(device):
            primals = primals_of(structure, tensors[:n])
            upstream = {name: view(u) for name, u in zip(names, tensors[n:], strict=True)}
            grads = op.call("_grad", primals, backend_only(config),
                            **{op.result_arg: result}, **upstream)
            return tuple(to_tensor(a) for a in trees.leaves_like(structure, grads))

    @staticmethod
    def setup_context(ctx, inputs, output):
        op, structure, config, saved, *tensors = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors)
        ctx.op, ctx.structure, ctx.config = op, structure, config
        ctx.result, ctx.device, ctx.names = saved.result, saved.device, saved.names
        ctx.tensors = tensors

    @staticmethod
    def backward(ctx, *v):
        tensors = ctx.saved_tensors
        with torch.no_grad():
            d_inputs = _Backward._second_order(ctx, tensors, v)
        if not torch.is_grad_enabled():
            return d_inputs
        # create_graph=True: the second order's outputs, differentiated, raise.
        return (None,) * 4 + _NoThirdOrder.apply(ctx.op.name, len(d_inputs) - 4,
                                                 *d_inputs[4:], *tensors, *v)

    @staticmethod
    def _second_order(ctx, tensors, v):
        op, names = ctx.op, ctx.names
        n = len(tensors) - len(names)
        with on_device(ctx.device):
            primals = primals_of(ctx.structure, tensors[:n])
            upstream = {name: view(u) for name, u in zip(names, tensors[n:], strict=True)}
            dv = primals_of(ctx.structure, v)
            _, d_primals = op.call("_grad_jvp", primals, backend_only(ctx.config),
                                   **{op.result_arg: ctx.result}, tangents=dv, **upstream)
            _, d_result = op.call("_jvp", primals, ctx.config, tangents=dv)
            d_upstream = [trees.at(d_result, upstream_path(name)) for name in names]
            return (None, None, None, None,
                    *(to_tensor(a) for a in trees.leaves_like(ctx.structure, d_primals)),
                    *(to_tensor(a) for a in d_upstream))

    @staticmethod
    def jvp(ctx, *tangents):
        op, names = ctx.op, ctx.names
        tangents = tangents[4:]
        n = len(ctx.tensors) - len(names)
        with on_device(ctx.device):
            primals = primals_of(ctx.structure, ctx.tensors[:n])
            upstream = {name: view(u) for name, u in zip(names, ctx.tensors[n:], strict=True)}
            d_upstream = {tangent_name(name): view(t)
                          for name, t in zip(names, tangents[n:], strict=True)}
            _, d_grads = op.call("_grad_jvp", primals, backend_only(ctx.config),
                                 **{op.result_arg: ctx.result},
                                 tangents=primals_of(ctx.structure, tangents[:n]),
                                 **upstream, **d_upstream)
            return tuple(to_tensor(a) for a in trees.leaves_like(ctx.structure, d_grads))


class _NoThirdOrder(torch.autograd.Function):
    """The identity on the second order's ``n`` outputs, connected to the tensors after them
    (primals, upstreams, cotangents), whose backward raises: gradcells has no third order."""

    @staticmethod
    def forward(name, n, *tensors):
        return tuple(None if t is None else t.clone() for t in tensors[:n])

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.name = inputs[0]

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"gradcells.torch.{ctx.name}: a third derivative was asked for; "
                           "gradcells differentiates twice (backward of backward), not more")


# -- the public functions -------------------------------------------------------------------


_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
"""Each complex dtype's precision: a real ``a`` with a complex ``b`` (the linear scan) is
one precision."""


def _check_primals(name, named) -> torch.device:
    """The primals' one device; TypeError for a non-tensor, a non-float tensor or two
    dtypes, ValueError for two devices."""
    first = None
    for arg, t in named:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gradcells.torch.{name}: {arg} must be a torch.Tensor, got "
                            f"{type(t).__name__}")
        if not (t.is_floating_point() or t.is_complex()):
            raise TypeError(f"gradcells.torch.{name}: {arg} is a {t.dtype} tensor; pass "
                            "float16, bfloat16, float32 or float64 (or complex where the op "
                            "takes it)")
        if first is None:
            first = arg, t
        elif t.device != first[1].device:
            raise ValueError(f"gradcells.torch.{name}: {arg} is on {t.device} and "
                             f"{first[0]} on {first[1].device}: pass every tensor on one device")
        elif _REAL.get(t.dtype, t.dtype) != _REAL.get(first[1].dtype, first[1].dtype):
            raise TypeError(f"gradcells.torch.{name}: {arg} is {t.dtype} and {first[0]} "
                            f"{first[1].dtype}: pass every float tensor in one precision")
    if first is None:
        raise TypeError(f"gradcells.torch.{name}: x must be a torch.Tensor, got None")
    return first[1].device


def _constant(name, arg, value, device):
    """A mask or ``seq_len`` (or a tree of them: the dropout masks), checked: tensors must
    not require grad and must be on the primals' device."""
    return trees.map_with_path(
        lambda leaf, path: _constant_leaf(name, trees.label(path), leaf, device),
        value, (arg,))


def _constant_leaf(name, arg, value, device):
    if not isinstance(value, torch.Tensor):
        return value
    if value.requires_grad:
        raise ValueError(f"gradcells.torch.{name}: {arg} requires grad; it is data, not a "
                         "parameter: pass it detached")
    if value.device != device:
        raise ValueError(f"gradcells.torch.{name}: {arg} is on {value.device} and the "
                         f"arrays on {device}: pass every tensor on one device")
    return value


def _primal_tree(op: Op, arguments: dict):
    """The call's primals as a tree of the op's gradient type (weight sets and ``LSTMNorm``
    rebuilt as their types)."""
    if op.stack:
        kind, _, grads = stack_types(op.name)
        weights = arguments.get("weights")
        if not isinstance(weights, (list, tuple)):
            raise TypeError(f"gradcells.torch.{op.name}: weights must be a list of "
                            f"{kind.__name__}, got {type(weights).__name__}")
        layers = [_weight_set(op.name, kind, k, ws) for k, ws in enumerate(weights)]
        return grads(*(arguments.get(s) for s in ("x", *op.spec.states)), layers)
    fields = dict.fromkeys(op.spec.grads._fields)
    fields.update((k, v) for k, v in arguments.items() if k in fields)
    if fields.get("layer_norm") is not None:
        fields["layer_norm"] = gc.LSTMNorm(*fields["layer_norm"])
    return op.spec.grads(**fields)


def _weight_set(name, kind, k, ws):
    try:
        ws = ws if isinstance(ws, kind) else kind(*ws)
    except TypeError as error:
        raise TypeError(f"gradcells.torch.{name}: weights[{k}] must be a {kind.__name__} "
                        f"({error})") from error
    norm = getattr(ws, "layer_norm", None)
    return ws if norm is None else ws._replace(layer_norm=gc.LSTMNorm(*norm))


def _forward_tangents(leaves):
    """The leaves' forward-mode tangents (``forward_ad``'s current level), or None when no
    leaf has one."""
    unpack = torch.autograd.forward_ad.unpack_dual
    tangents = [None if t is None else unpack(t).tangent for t in leaves]
    return tangents if any(t is not None for t in tangents) else None


def _function(name: str):
    """``gradcells.torch.<name>``: ``gc.<name>`` under autograd (see the module)."""
    op, reference = Op(name), getattr(gc, name)
    signature = inspect.signature(reference)

    def function(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        tree = _primal_tree(op, arguments)
        device = _check_primals(name, trees.named_leaves(tree))
        settings = {k: v for k, v in arguments.items() if k not in op.primal_args}
        constants = {k: _constant(name, k, settings.pop(k), device)
                     for k in (*_CONSTANTS, *op.spec.constants) if k in settings}
        reduced = _reduced_dtype(tree, device)
        if reduced is not None:   # computed in float32, returned in the input's dtype
            tree, constants = (trees.map_leaves(_widened(reduced), t) for t in (tree, constants))
        result = _run(op, tree, settings, constants, device)
        if reduced is None:
            return result
        return trees.map_leaves(lambda a: a.to(reduced) if hasattr(a, "shape") else a, result)

    function.__name__ = function.__qualname__ = name
    function.__signature__ = signature
    function.__doc__ = (
        f"``gc.{name}`` on tensors, differentiable (reverse and forward mode, second order) "
        f"in every float tensor argument that requires grad.\n\nThe signature, the "
        f"arguments' meaning and the result (``{reference.__annotations__.get('return')}`` "
        f"of tensors, its settings recorded) are ``gc.{name}``'s; masks and ``seq_len`` may "
        "be tensors (not requiring grad) or NumPy arrays. Reverse mode takes the gradients "
        "of the fields ``gc." + name + "_grad`` has upstreams for, and raises ValueError "
        "for any other. See ``gradcells.torch._functions``.")
    return function


def _run(op: Op, tree, settings: dict, constants: dict, device):
    """The op on the primal ``tree``: the custom op under torch.compile, else ``_Forward``."""
    if torch.compiler.is_compiling():
        return library_call(op, tree, settings, constants)
    with on_device(device):
        constants = {k: trees.map_leaves(lambda t, k=k: view(t, k), v)
                     for k, v in constants.items()}
    leaves, structure = trees.flatten(tree)
    box = _Box(device=device, tangents=_forward_tangents(leaves))
    config = {"backend": None, **settings, **constants}
    outputs = _Forward.apply(op, structure, config, box, *leaves)
    return like(box.result, iter(outputs))


_REDUCED = {torch.float16: ("cpu",), torch.bfloat16: ("cpu", "cuda")}
"""The reduced precisions computed in float32, and where (float16 runs as itself on CUDA)."""


def _reduced_dtype(tree, device):
    """The primals' dtype if it is one computed in float32 on ``device``, else None."""
    dtype = next(t.dtype for t in trees.leaves(tree) if t is not None)
    return dtype if device.type in _REDUCED.get(dtype, ()) else None


def _widened(reduced):
    """Tensors of dtype ``reduced`` as float32 (a differentiable cast), anything else as is."""
    return lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == reduced else t


FUNCTIONS = {name: _function(name) for name in (*OPS, *STACKS, *SCAN_SPECS)}
"""``gradcells.torch.<op>`` for every forward op, by name (the package and its modules read
them here)."""
