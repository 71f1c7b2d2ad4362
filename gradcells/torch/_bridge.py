"""What the two ways into gradcells's ops share (``_functions``: autograd Functions in eager
mode; ``_library``: the ``torch.library`` custom ops torch.compile sees): the op, the device
context, tensors viewed as backend arrays and back, a result's arrays, and the one place that
turns the gradients arriving on a result's arrays into ``gc.<op>_grad``'s upstream keywords.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

import gradcells as gc

from .._core import trees
from .._interop import cupy_module, from_backend, torch_to_backend
from ..cells import OPS, SCAN_SPECS, SPECS, STACKS, cell_of

_TORCH = "torch"


@dataclass(frozen=True)
class Op:
    """One forward op: its gc functions, the result's argument name and the upstreams."""

    name: str

    @property
    def stack(self) -> bool:
        return self.name in STACKS

    @property
    def spec(self):
        return SCAN_SPECS.get(self.name) or OPS[STACKS.get(self.name, self.name)]

    @property
    def primal_args(self) -> tuple[str, ...]:
        """The arguments that are primals: ``x``, the states and the weights."""
        if self.stack:
            return (*self.spec.arrays[:1 + len(self.spec.states)], "weights")
        return self.spec.grads._fields

    @property
    def result_arg(self) -> str:
        return "stack" if self.stack else self.spec.result_arg

    def upstream(self, result) -> tuple[str, ...]:
        """The upstream keywords of ``_grad``: ``d_<field>`` for the fields that have one; a
        stack's runs' fields as ``d_layers[k].<field>`` (``nested_upstream`` gathers them
        into ``d_layers``)."""
        if not self.stack:
            return self.spec.upstream
        return (*(f"d_{field}" for field in result._fields if field != "layers"),
                *(f"d_layers[{k}].{u.removeprefix('d_')}" for k in range(len(result.layers))
                  for u in self.spec.upstream))

    def call(self, suffix, primals, config, **keywords):
        """``gc.<op><suffix>`` on the primal tree's arrays, ``config`` and ``keywords`` (a
        stack's flat per-run upstreams gathered, ``nested_upstream``)."""
        if self.stack and "stack" in keywords:
            keywords = nested_upstream(keywords, keywords["stack"])
        return getattr(gc, self.name + suffix)(**primals._asdict(), **config, **keywords)


def nested_upstream(keywords: dict, stack) -> dict:
    """``keywords`` with each flat ``d_layers[k].<field>`` (and ``d_layers_tangent[k]...``)
    gathered into the list a stack's gradient takes: one entry per run of
    ``stack.layers``, None or a result of the run's type holding the given fields."""
    out: dict = {}
    runs: dict = {}
    for key, value in keywords.items():
        name, _, rest = key.partition("[")
        if name not in ("d_layers", "d_layers_tangent") or not rest:
            out[key] = value
            continue
        k, _, field = rest.partition("].")
        runs.setdefault(name, {}).setdefault(int(k), {})[field] = value
    for name, by_run in runs.items():
        out[name] = [None if k not in by_run else
                     type(run)(**{f: by_run[k].get(f) for f in run._fields})
                     for k, run in enumerate(stack.layers)]
    return out


def tangent_name(name: str) -> str:
    """The keyword of an upstream's tangent: ``d_h_tangent``, ``d_layers_tangent[1].i``."""
    if name.startswith("d_layers["):
        return name.replace("d_layers[", "d_layers_tangent[", 1)
    return f"{name}_tangent"


def upstream_path(name: str) -> tuple:
    """The path in a result of the field an upstream keyword is the gradient of:
    ``d_h`` -> ``("h",)``, ``d_layers[1].i`` -> ``("layers", 1, "i")``."""
    head, _, rest = name.removeprefix("d_").partition("[")
    if not rest:
        return (head,)
    k, _, field = rest.partition("].")
    return (head, int(k), field)


# -- trees of arrays (gradcells._core.trees) ----------------------------------------------


def named_arrays(result):
    """(name, array) for each array of a result: ``h``, ``layers[0].i``, ..."""
    return ((name, a) for name, a in trees.named_leaves(result) if hasattr(a, "shape"))


def arrays(result) -> list:
    """A result's arrays, in order (the forward's outputs)."""
    return [a for _, a in named_arrays(result)]


def like(template, leaves):
    """``template`` (a result) rebuilt with the next leaves of ``leaves`` as its arrays, its
    recorded settings kept."""
    return trees.map_leaves(lambda a: next(leaves) if hasattr(a, "shape") else a, template)


def upstream_keywords(op: Op, result, grads) -> dict:
    """``gc.<op>_grad``'s upstream keywords (``d_h``, ``d_cs_final``, ...) for ``grads``, the
    gradients arriving on ``arrays(result)`` in order (None: none arrived). Every gradient
    of a result's array passes through here (a stack's runs' as ``d_layers[k].<field>``).
    A nonzero gradient on a field ``_grad`` takes no upstream for raises ValueError:
    dropping it would be a silently wrong gradient; a zero one adds nothing and is
    dropped."""
    accepted, upstream = op.upstream(result), {}
    for (name, _), grad in zip(named_arrays(result), grads, strict=True):
        if grad is None:
            continue
        if f"d_{name}" in accepted:
            upstream[f"d_{name}"] = grad
        elif bool(grad.any()):
            raise ValueError(
                f"gradcells.torch.{op.name}: a gradient reached the result's field "
                f"{name!r}, and {op.name}_grad takes no upstream gradient for it "
                f"(only {', '.join(accepted)}): use those fields in the loss")
    return upstream


def backend_only(config: dict) -> dict:
    """The keywords ``_grad`` and ``_grad_jvp`` need besides the result (which records the
    settings): the backend."""
    return {"backend": config["backend"]}


# -- devices --------------------------------------------------------------------------------


def on_device(device: torch.device):
    """The context gc runs in for tensors on ``device``: CuPy's device and PyTorch's current
    stream on CUDA, nothing on the CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    cupy = cupy_module()
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(device.index))
    stack.enter_context(cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream))
    return stack


def view(t, name="array"):
    """A NumPy/CuPy view of tensor ``t`` (None and non-tensors as they are); a real CPU
    tensor by ``numpy()``, the shortest way (no conjugate or negative bit to resolve)."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type == "cpu" and t.is_floating_point():
        return t.detach().numpy()
    return torch_to_backend(name, t)


def to_tensor(a):
    """Backend array ``a`` as a tensor sharing its memory (``_interop.from_backend`` copies
    one with a negative stride, a reversed sequence's time axis, which PyTorch has no
    tensor for)."""
    if a is None:
        return None
    if type(a) is np.ndarray and a.flags.writeable and min(a.strides, default=0) >= 0:
        return torch.from_numpy(a)
    return from_backend(a, _TORCH)


def primals_of(structure, leaves):
    """The primal tree of backend views of the tensor ``leaves``."""
    return trees.unflatten(structure, [view(t) for t in leaves])


def stack_types(name):
    """A stack's weight set, result and gradient types (``LSTMWeights``, ``LSTMStack``,
    ``LSTMStackGrads``)."""
    spec = SPECS[cell_of(name)]
    return spec.sequence.weights, spec.stack.result, spec.stack.grads
