"""Every field of a GRU result carries an upstream gradient (docs/spec.md §16.1): the gates
``r, u, c`` as well as ``h`` (and a sequence's ``h_final``), one contract for every GRU op
of ``gradcells.cells.OPS`` (the cell and the sequence).

- The gradient from random cotangents on every field, and on each gate's alone, equals
  float64 central differences (``gc.check_vjp`` through ``testing.vjp_check``) on the
  reference and the CPU: both variants, ragged lengths, reverse, batch-first, every mask
  and zoneout.
- Second order: the gradient's tangent, along the tangents of the arrays and of every
  field's cotangent (the gates' included), equals central differences of the gradient
  (``testing.grad_jvp_check``) on the same grid.
- No gate upstream, no extra work: without ``d_r, d_u, d_c`` (and their tangents) the
  CPU runs no gate pass and the GPU (its kernels on the host, ``tests/cuda_host``) launches
  no gate kernel; with one, they do (so the first half is not vacuous).

The CPU and the emulated GPU against the reference with an upstream gradient on every field
are the generic contracts (``tests/contracts/test_grad_jvp_cpu_gru_rnn.py``,
``test_grad_jvp_cuda_emulation_gru_rnn.py``, ``test_cuda_emulation.py``, and
``test_padding.py``/``test_purity.py``, whose ``contract_cases.upstream`` draws one per name
of the spec).
"""

from __future__ import annotations

import backend_calls
import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from contract_cases import EMULATED_GPU, backend, calls, fixed_case, tangents, upstream

from gradcells import testing
from gradcells.cells import OPS
from gradcells.gpu import _launch

GRU_OPS = [op for op in OPS if op.startswith("gru_")]
SIZES = {"steps": 3, "batch": 3, "input_size": 2, "hidden": 3}
ORDERS = {"plain": {}, "ragged": {"ragged": True},
          "reverse": {"ragged": True, "reverse": True},
          "masks": {"ragged": True, "masks": True},
          "reverse-masks-batch-first": {"ragged": True, "reverse": True, "masks": True,
                                        "batch_first": True}}
"""A sequence's time orders, layouts and masks (``masks``: input and recurrent masks and
zoneout); a cell takes none."""


GATE_UPSTREAMS = tuple(f"d_{k}" for k in OPS["gru_cell"].result._fields if k != "h")


def _grid(layouts=True):
    """``(op, options)`` for every GRU op, both variants and (a sequence) every order;
    ``layouts=False``: time-major only (a backend below the public layer takes no other)."""
    for op in GRU_OPS:
        for reset_after in (False, True):
            for name, order in (ORDERS.items() if OPS[op].sequence else [("cell", {})]):
                if layouts or not order.get("batch_first"):
                    yield pytest.param(
                        op, {"reset_after": reset_after, **order},
                        id=f"{op}-{'after' if reset_after else 'before'}-{name}")


def _case(op, options, seed):
    return fixed_case(op, np.random.default_rng(seed), **SIZES, **options)


def _every_field(op):
    return OPS[op].result._fields


@pytest.mark.parametrize("backend_name", NUMPY_BACKENDS)
@pytest.mark.parametrize(("op", "options"), _grid())
@pytest.mark.parametrize("fields", ["every", "r", "u", "c"])
def test_the_gradient_from_every_field_equals_finite_differences(backend_name, op, options,
                                                                 fields):
    outputs = _every_field(op) if fields == "every" else (fields,)
    case = _case(op, options, 41)
    report = testing.vjp_check(op, case, backend=backend_name, outputs=outputs)
    assert report.passed, f"\n{report}"
    assert report.max_abs_error < 1e-9


@pytest.mark.parametrize("backend_name", NUMPY_BACKENDS)
@pytest.mark.parametrize(("op", "options"), _grid())
def test_the_second_order_with_gate_tangents_equals_finite_differences(backend_name, op,
                                                                       options):
    case = _case(op, options, 43)
    report = testing.grad_jvp_check(op, case, backend=backend_name,
                                    outputs=_every_field(op))
    assert report.passed, f"\n{report}"


def _gradients(c, op, case, up, up_t):
    """The gradient and the second order with the upstream gradients ``up`` and their
    tangents ``up_t``."""
    result = c.forward(op, case)
    t = tangents(op, case, np.random.default_rng(2))
    return c.grad(op, case, result, **up), c.grad_jvp(op, case, result, t, **up, **up_t)


def _upstreams(op, case, gates):
    """Every upstream gradient and tangent of the op (``contract_cases.upstream``: one per
    name of the spec); the gates' only when ``gates``."""
    with backend("reference") as impl:
        result = backend_calls.forward(impl, op, case)
    up = upstream(op, result, np.random.default_rng(5))
    up_t = {f"{k}_tangent": v for k, v in upstream(op, result, np.random.default_rng(6)).items()}
    assert set(GATE_UPSTREAMS) <= set(up)
    if not gates:
        up = {k: v for k, v in up.items() if k not in GATE_UPSTREAMS}
        up_t = {k: v for k, v in up_t.items() if k.removesuffix("_tangent") not in GATE_UPSTREAMS}
    return up, up_t


CPU_PASSES = ("gru_gates_grad_kernel", "gru_gates_grad_tangent_kernel")
GPU_KERNELS = {"gru_backward_gates", "gru_backward_gates_tangent"}


@pytest.mark.skipif("cpu" not in NUMPY_BACKENDS, reason="CPU backend not built")
@pytest.mark.parametrize(("op", "options"), _grid(layouts=False))
def test_the_cpu_runs_no_gate_pass_without_gate_upstreams(op, options, monkeypatch):
    from gradcells.cells.gru import cpu

    case = _case(op, options, 47)
    ran = []
    for name in CPU_PASSES:
        kernel = getattr(cpu, name)
        monkeypatch.setattr(cpu, name, lambda *a, _k=kernel, _n=name: (ran.append(_n), _k(*a)))
    with calls("cpu") as c:
        _gradients(c, op, case, *_upstreams(op, case, gates=False))
        assert ran == []
        _gradients(c, op, case, *_upstreams(op, case, gates=True))
    assert set(ran) == set(CPU_PASSES)


@pytest.mark.parametrize(("op", "options"), _grid(layouts=False))
def test_the_gpu_launches_no_gate_kernel_without_gate_upstreams(op, options):
    case = _case(op, options, 53)
    with calls(EMULATED_GPU) as c:
        launches = _launch.runtime().launches
        _gradients(c, op, case, *_upstreams(op, case, gates=False))
        assert not GPU_KERNELS & set(launches)
        _gradients(c, op, case, *_upstreams(op, case, gates=True))
        assert GPU_KERNELS <= set(launches)
