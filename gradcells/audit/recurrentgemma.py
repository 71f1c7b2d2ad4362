"""The audit of google-deepmind/recurrentgemma's RG-LRU (docs/spec.md §18.3, §20): its torch
layer (``recurrentgemma.torch.layers.RGLRU``) and its JAX layer
(``recurrentgemma.jax.layers.RGLRU``, Flax linen, each CPU-runnable scan) against gradcells's
``rglru_sequence`` and ``rglru_sequence_grad``, with document boundaries (``segment_pos == 0``)
mid-sequence; a loss on the outputs and on the final state the layers return.

Their parameters come through ``gc.layouts.rglru_from_recurrentgemma``: ``a_param`` and the
two block-diagonal gates as they are, the biases flattened. Their layers are batch first. The
gradient bounds the square root's derivative at 1000 in both (torch's
``SqrtBoundDerivative``, JAX's ``sqrt_bound_derivative``: convention 81), which the
converter's options carry (``sqrt_grad_bound=1000``); where the bound does not act, that is
the true gradient.

* torch, float64: its scan accumulates in float32 whatever the input's dtype (fault 80).
* JAX, float64 (``jax.enable_x64`` around each call, so the audit leaves JAX's setting as it
  found it): ``scan.linear_scan``'s ``acc_float_dtype`` defaults to float32 and the layer
  passes none, so both scans accumulate in float32 too (fault 82).
* JAX, float32 (x64 off): the layer as it is trained; the truth is gradcells in float64 on the
  same float32 numbers, to float32's tolerances.

Of ``common.ScanType``, ``LINEAR_NATIVE`` (``jax.lax.scan``; ``AUTO`` off a TPU) and
``ASSOCIATIVE_NATIVE`` (``jax.lax.associative_scan``) run on a CPU; ``LINEAR_PALLAS`` is a
``pallas_call`` without ``interpret=True``, which JAX refuses on a CPU ("Only interpret mode
is supported on CPU backend"): its rows are skipped there with that reason, and run where JAX
has another backend (its widths a multiple of 128, as its kernel needs).
"""

from __future__ import annotations

import functools
import operator
from importlib.metadata import version

import numpy as np

from .. import layouts, sequences
from ._engine import (
    FLOAT32_FORWARD,
    FLOAT32_GRADIENT,
    FLOAT64,
    Check,
    Skipped,
    compare,
    judge_entries,
)

SECTION = "recurrentgemma's RG-LRU (recurrentgemma.torch, recurrentgemma.jax)"
PARAMETERS = ("a_param", "input_gate.w", "input_gate.b", "a_gate.w", "a_gate.b")
"""Its layers' parameters, in ``rglru_from_recurrentgemma``'s order (the JAX layer's tree
reads each name's dots as levels)."""
SCANS = ("LINEAR_NATIVE", "ASSOCIATIVE_NATIVE")
"""The JAX layer's scans (``common.ScanType``) a CPU runs."""
BOUND = 81
"""Convention 81: the square root's derivative bounded at 1000."""


def _modules():
    import torch
    from recurrentgemma.torch.layers import RGLRU

    return torch, RGLRU


def _jax_modules():
    import jax
    from recurrentgemma import common
    from recurrentgemma.jax.layers import RGLRU

    return jax, common, RGLRU


def _imported(modules, name):
    """``modules()``, or ``Skipped`` with the reason where ``name`` does not import."""
    try:
        return modules()
    except ImportError as error:
        raise Skipped(f"{name} does not import here ({error})") from error


def _sizes(rng, even):
    """``(steps, batch, heads, head)``; ``even``: an even width (the JAX layer asserts it)."""
    steps, batch, heads, head = (int(rng.integers(2, 6)), int(rng.integers(1, 4)),
                                 int(rng.integers(1, 3)), int(rng.integers(1, 4)))
    if even and heads * head % 2:
        head += 1
    return steps, batch, heads, head


def _case(rng, *, long_memory=False, even=False, width=None):
    """One case: sizes, its layer's parameters (float64 NumPy), ``x [B, T, D]`` and
    ``segment_pos [B, T]`` (each row's documents of random lengths). ``a_param`` as its
    initialisation draws it (``σ(-a_param)`` on the ring 0.9..0.999), or, ``long_memory``,
    from -24 to -19: ``1 - a²`` below ``1/(4·1000²)``, where its bound acts. ``width``: that
    width (its heads dividing it) instead of a drawn one."""
    steps, batch, heads, head = _sizes(rng, even)
    if width is not None:
        head = width // heads
    width = heads * head
    radius = np.sqrt(rng.uniform(0.9 ** 2, 0.999 ** 2, width))
    a_param = (rng.uniform(-24.0, -19.0, width) if long_memory
               else np.log(1 / radius - 1))
    starts = rng.random((batch, steps)) < 0.3
    starts[:, 0] = True
    positions = np.zeros((batch, steps), np.int64)
    for t in range(1, steps):
        positions[:, t] = np.where(starts[:, t], 0, positions[:, t - 1] + 1)
    return {"a_param": a_param,
            "input_gate.w": rng.standard_normal((heads, head, head)) / np.sqrt(head),
            "input_gate.b": 0.5 * rng.standard_normal((heads, head)),
            "a_gate.w": rng.standard_normal((heads, head, head)) / np.sqrt(head),
            "a_gate.b": 0.5 * rng.standard_normal((heads, head)),
            "x": rng.standard_normal((batch, steps, width)), "segment_pos": positions,
            "sizes": (width, heads)}


def _float32(array):
    """``array`` rounded to float32, held in float64 (what a float32 layer is given)."""
    return np.asarray(array, np.float32).astype(np.float64)


def _theirs(case, d_y, d_last):
    """Their torch layer (float64 parameters and input) forward and autograd of ``<d_y, y>
    + <d_last, last_h>``: ``(y, last_h, {argument: gradient})``."""
    torch, rglru = _imported(_modules, "recurrentgemma.torch")
    width, heads = case["sizes"]
    layer = rglru(width=width, num_heads=heads, dtype=torch.float64)
    layer.load_state_dict({k: torch.from_numpy(case[k]) for k in PARAMETERS})
    x = torch.from_numpy(case["x"]).requires_grad_()
    y, last = layer(x, torch.from_numpy(case["segment_pos"]))
    torch.autograd.backward((y, last), (torch.from_numpy(d_y),
                                        torch.from_numpy(d_last).to(last.dtype)))
    grads = {"x": x.grad.numpy(), **{k: p.grad.numpy() for k, p in layer.named_parameters()}}
    return y.detach().numpy(), last.detach().double().numpy(), grads


def _jax_tree(case, dtype):
    """The JAX layer's parameters, ``{"params": {...}}``, from the case's (NumPy)."""
    params = {}
    for name in PARAMETERS:
        *modules, leaf = name.split(".")
        node = params
        for module in modules:
            node = node.setdefault(module, {})
        node[leaf] = np.asarray(case[name], dtype)
    return {"params": params}


def _leaf(tree, name):
    return np.asarray(functools.reduce(operator.getitem, name.split("."), tree["params"]),
                      np.float64)


def _jax_apply(layer, segment_pos, params, x):
    return layer.apply(params, x, segment_pos)


def _jax_run(layer, segment_pos, params, x, d_y, d_last):
    """``(y, last_h, d_params, d_x)``: the layer's forward and ``jax.vjp`` of ``(y,
    last_h)`` at ``(d_y, d_last)`` (one function, to be compiled once)."""
    import jax

    forward = functools.partial(_jax_apply, layer, segment_pos)
    (y, last), pullback = jax.vjp(forward, params, x)
    d_params, d_x = pullback((d_y.astype(y.dtype), d_last.astype(last.dtype)))
    return y, last, d_params, d_x


def _jax_layer(scan, dtype, case, d_y, d_last):
    """Their JAX layer with ``scan`` (a ``ScanType`` name) in ``dtype`` (``"float64"``: x64
    on for the call, ``"float32"``: off), forward and ``jax.vjp`` of ``(y, last_h)`` at
    ``(d_y, d_last)``, jitted: ``(y, last_h, {argument: gradient})``, in float64 NumPy."""
    jax, common, rglru = _imported(_jax_modules, "recurrentgemma.jax")
    width, heads = case["sizes"]
    layer = rglru(width=width, num_heads=heads, scan_type=common.ScanType[scan],
                  dtype=dtype, param_dtype=dtype)
    with jax.enable_x64(dtype == "float64"):
        arrays = [jax.numpy.asarray(a, dtype) for a in (case["x"], d_y, d_last)]
        y, last, d_params, d_x = jax.jit(functools.partial(_jax_run, layer))(
            jax.numpy.asarray(case["segment_pos"]), _jax_tree(case, dtype), *arrays)
        grads = {"x": np.asarray(d_x, np.float64),
                 **{name: _leaf(d_params, name) for name in PARAMETERS}}
        return np.asarray(y, np.float64), np.asarray(last, np.float64), grads


def _gradcells(case, d_y, d_last, bound):
    """gradcells's float64 reference on the converted parameters, the gradients in its
    layer's names: ``(y, last_h, {argument: gradient})``."""
    converted = layouts.rglru_from_recurrentgemma(*(case[k] for k in PARAMETERS))
    x, h0 = case["x"], np.zeros((case["x"].shape[0], case["sizes"][0]))
    keywords = {"c": converted.options["c"], "sqrt_grad_bound": bound,
                "resets": case["segment_pos"] == 0, "batch_first": True,
                "backend": "reference"}
    seq = sequences.rglru_sequence(x, h0, *converted, **keywords)
    g = sequences.rglru_sequence_grad(x, h0, *converted, seq, d_h=d_y, d_h_final=d_last,
                                      backend="reference")
    params = layouts.rglru_to_recurrentgemma(g.w_a, g.b_a, g.w_x, g.b_x, g.lam)
    return seq.h, seq.h_final, {"x": g.x, **params}


def _pairs(theirs, ours, gradients):
    y, last, grads = theirs
    y_g, last_g, grads_g = ours
    if not gradients:
        return [("y", y, y_g), ("last_h", last, last_g)]
    return [(name, grads[name], grads_g[name]) for name in ("x", *PARAMETERS)]


def verdict(rng, *, gradients, long_memory=False, layer=_theirs, fault=80, float32=False,
            width=None):
    """A layer (``layer(case, d_y, d_last)``: the torch one, or a JAX one by
    ``functools.partial(_jax_layer, scan, dtype)``) against gradcells, the forward
    (``gradients`` False) or every gradient: the truth is gradcells's float64 true gradient
    to ``FLOAT64``, or, ``float32`` (a float32 layer, given the case rounded to float32), to
    ``FLOAT32_FORWARD`` / ``FLOAT32_GRADIENT``. ``fault``'s model (80, 82: a float32 scan)
    allows float32's rounding, convention 81's is gradcells with ``sqrt_grad_bound=1000``
    (the converter's option)."""
    case = _case(rng, long_memory=long_memory, even=layer is not _theirs, width=width)
    d_y = rng.standard_normal(case["x"].shape)
    d_last = rng.standard_normal(case["x"].shape[::2])
    if float32:
        case = {k: _float32(v) if k in ("x", *PARAMETERS) else v for k, v in case.items()}
        d_y, d_last = _float32(d_y), _float32(d_last)
    theirs = layer(case, d_y, d_last)
    entries = (() if float32 else (fault,)) + ((BOUND,) if gradients else ())
    return judge_entries(functools.partial(_model, case, d_y, d_last, theirs, gradients,
                                           float32), entries)


def _model(case, d_y, d_last, theirs, gradients, float32, active):
    """The comparison with the entries in ``active`` applied: 81, gradcells with
    ``sqrt_grad_bound=1000``; any other (a float32 scan), float32's tolerance, as is a
    ``float32`` layer's."""
    ours = _gradcells(case, d_y, d_last, 1000.0 if BOUND in active else None)
    tolerance = (FLOAT64 if not float32 and not active - {BOUND}
                 else FLOAT32_GRADIENT if gradients else FLOAT32_FORWARD)
    return compare(_pairs(theirs, ours, gradients), tolerance)


def jax_verdict(scan, rng, *, dtype, gradients, long_memory=False):
    """The JAX layer with ``scan`` in ``dtype`` against gradcells (``verdict``): in float64,
    fault 82 (its float32 scan) and convention 81 may show; in float32, convention 81."""
    return verdict(rng, gradients=gradients, long_memory=long_memory, fault=82,
                   layer=functools.partial(_jax_layer, scan, dtype),
                   float32=dtype == "float32")


def pallas_verdict(rng, *, gradients):
    """``LINEAR_PALLAS`` in float32 (its kernel accumulates in float32 alone), width 128:
    skipped where JAX refuses its ``pallas_call`` (a CPU: no interpret mode)."""
    try:
        return verdict(rng, gradients=gradients, float32=True, width=128,
                       layer=functools.partial(_jax_layer, "LINEAR_PALLAS", "float32"))
    except ValueError as error:
        if "interpret mode" not in str(error):
            raise
        raise Skipped("its pallas_call has no interpret=True, and JAX's CPU backend runs "
                      "Pallas in interpret mode only") from error


def _jax_checks(scan):
    """The rows of the JAX layer with ``scan``."""
    run = functools.partial(jax_verdict, scan)
    name = f"RGLRU (JAX, {scan})"
    return (
        Check(f"{name} forward (float64) vs gradcells (rglru_sequence, resets)",
              functools.partial(run, dtype="float64", gradients=False), fault=82),
        Check(f"{name} vjp (float64) vs gradcells (rglru_sequence_grad)",
              functools.partial(run, dtype="float64", gradients=True), fault=(82, 81)),
        Check(f"{name} vjp where its sqrt bound acts vs gradcells (rglru_sequence_grad)",
              functools.partial(run, dtype="float64", gradients=True, long_memory=True),
              fault=(82, 81)),
        Check(f"{name} forward (float32) vs gradcells (rglru_sequence, resets)",
              functools.partial(run, dtype="float32", gradients=False)),
        Check(f"{name} vjp (float32) vs gradcells (rglru_sequence_grad)",
              functools.partial(run, dtype="float32", gradients=True), fault=81),
    )


TORCH_CHECKS = (
    Check("RGLRU forward (float64) vs gradcells (rglru_sequence, resets)",
          functools.partial(verdict, gradients=False), fault=80),
    Check("RGLRU autograd (float64) vs gradcells (rglru_sequence_grad)",
          functools.partial(verdict, gradients=True), fault=(80, 81)),
    Check("RGLRU autograd where its sqrt bound acts vs gradcells (rglru_sequence_grad)",
          functools.partial(verdict, gradients=True, long_memory=True), fault=(80, 81)),
)
JAX_CHECKS = (*(check for scan in SCANS for check in _jax_checks(scan)),
              Check("RGLRU (JAX, LINEAR_PALLAS) forward (float32) vs gradcells",
                    functools.partial(pallas_verdict, gradients=False)),
              Check("RGLRU (JAX, LINEAR_PALLAS) vjp (float32) vs gradcells",
                    functools.partial(pallas_verdict, gradients=True), fault=81))
CHECKS = TORCH_CHECKS + JAX_CHECKS


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the recurrentgemma audit; ImportError where neither its
    torch nor its JAX layer imports (the rows of the one that does not are skipped)."""
    try:
        _modules()
    except ImportError:
        _jax_modules()
    return (f"gradcells audit of {SECTION} {version('recurrentgemma')} (CPU; torch in "
            "float64, JAX in float64 and float32)", CHECKS, [])
