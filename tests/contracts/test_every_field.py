"""Every field of a result is differentiable (docs/spec.md §16.1): each ``<op>_grad`` takes
an upstream gradient ``d_<field>`` for every array field of its forward's result, and its
``_grad_jvp`` their tangents.

Written once over the ops of ``gradcells.cells.OPS`` that have the fields (``FIELD_OPS``):

- the spec: the gradient's upstream keywords name every field of the result, and the public
  functions take them (and their tangents);
- the reference's gradient, random cotangents on every field at once, against float64
  central differences (``gc.check_vjp`` through ``gc.testing.vjp_check``), over each cell's
  options (``OPTIONS``: for the LSTM peepholes, the cell clip, the projection and its clip,
  the layer norm with both carries; for sequences ragged lengths, both directions, both
  layouts, every mask and zoneout); the straight-through clip gradient where it is the
  gradient (no clip active) and, where a clip is active, as the exact gradient of the same
  saved step with the clip's mask left out;
- each gate field's upstream on its own: never dropped (a nonzero gradient) and the true
  gradient;
- the CPU and the GPU (its kernels through the host emulation ``tests/cuda_host``) agree
  with the reference, gradient and second order, with random upstreams on every field
  (each None at random) and their tangents, on Hypothesis-drawn cases with every option;
- second order with the gates' upstream tangents against central differences of the
  gradient (``gc.testing.grad_jvp_check``), and a gate upstream's tangent alone.
"""

from __future__ import annotations

import contextlib
import inspect

import cuda_host
import numpy as np
import pytest
from contract_cases import (
    BACKENDS,
    CONTRACT_EXAMPLES,
    EMULATED_GPU,
    BackendCalls,
    PublicCalls,
    backend,
    cases,
    fixed_case,
    tangents,
    upstream,
)
from hypothesis import given
from hypothesis import strategies as st
from test_cuda_emulation import public_gpu

import gradcells as gc
from gradcells import testing
from gradcells.cells import OPS

FIELD_OPS = tuple(op for op in OPS if op.startswith("lstm_"))
"""The ops whose every result field takes an upstream gradient (the GRU's join with theirs)."""

SIZES = {"steps": 3, "batch": 3, "input_size": 3, "hidden": 3}

OPTIONS = {
    "lstm": {
        "plain": {},
        "peepholes, clip": {"peephole": True, "clip": True},
        "projection, clip": {"proj_size": 2, "proj_clip": True, "clip": True},
        "layer norm raw": {"layer_norm": True, "ln_carry": "raw", "peephole": True,
                           "clip": True},
        "layer norm normalized": {"layer_norm": True, "ln_carry": "normalized",
                                  "peephole": True, "proj_size": 2, "clip": True},
    },
}
"""Each cell's options, every one on the cell and the sequence."""

ORDER = {
    "time major": {},
    "ragged, masks": {"ragged": True, "masks": True},
    "reverse, ragged, masks": {"reverse": True, "ragged": True, "masks": True},
    "reverse, batch first": {"reverse": True, "batch_first": True},
}
"""A sequence's orders, layouts, lengths and masks (zoneout among them)."""


def _cell(op):
    return op.split("_")[0]


def _grid():
    for op in FIELD_OPS:
        orders = ORDER if OPS[op].sequence else {"": {}}
        for name, options in OPTIONS[_cell(op)].items():
            for order, more in orders.items():
                yield pytest.param(op, {**options, **more}, id=f"{op}-{name}-{order}".strip("-"))


def _case(op, options, seed):
    return fixed_case(op, np.random.default_rng(seed), **SIZES, **options)


@contextlib.contextmanager
def public(name):
    """The four modes through the public face on backend ``name``: the GPU's kernels on
    the host (``tests/cuda_host``) taking NumPy arrays, as ``test_cuda_emulation`` runs
    them."""
    if name != EMULATED_GPU:
        yield PublicCalls(name)
        return
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    with public_gpu():
        yield PublicCalls("gpu")


def _fields(op):
    """The result's array fields that an upstream gradient reaches (all of them)."""
    return OPS[op].result._fields


def _gate_fields(op):
    """The fields other than the states (those the gradient took before §16.1)."""
    states = {"h", "cs", "h_final", "cs_final"}
    return tuple(f for f in _fields(op) if f not in states)


# -- the spec and the public functions -------------------------------------------------------


@pytest.mark.parametrize("op", FIELD_OPS)
def test_the_gradient_takes_an_upstream_for_every_field(op):
    spec = OPS[op]
    assert sorted(spec.upstream) == sorted(f"d_{f}" for f in _fields(op))
    grad = inspect.signature(getattr(gc, spec.grad_name)).parameters
    grad_jvp = inspect.signature(getattr(gc, f"{spec.grad_name}_jvp")).parameters
    for name in spec.upstream:
        assert grad[name].kind is inspect.Parameter.KEYWORD_ONLY and grad[name].default is None
        assert grad_jvp[f"{name}_tangent"].default is None


# -- the reference against finite differences -------------------------------------------------


@pytest.mark.parametrize(("op", "options"), list(_grid()))
def test_the_reference_gradient_of_every_field_is_the_gradient(op, options):
    """Random cotangents on every field at once (the pairs' default), float64 differences."""
    case = _case(op, options, 5)
    report = testing.vjp_check(op, case, backend="reference")
    assert {c.name for c in report.checks} and report.passed, f"\n{report}"
    f, _, args, _ = testing.OPS[op][1](case)
    assert len(f(*args)) == len(_fields(op))        # every field has a cotangent


@pytest.mark.parametrize(("op", "options"), [p for p in _grid()
                                             if "masks" not in p.id and "plain" not in p.id])
def test_straight_through_is_the_gradient_where_no_clip_is_active(op, options):
    case = {**_case(op, options, 6), "cell_clip": 1e3}
    if case.get("proj_clip") is not None:
        case["proj_clip"] = 1e3
    report = testing.vjp_check(op, case, backend="reference", clip_grad="straight_through")
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend_name", ["reference", *(b for b in BACKENDS
                                                         if b != "reference")])
@pytest.mark.parametrize("options", [{"peephole": True}, {"proj_size": 2}])
def test_straight_through_is_the_unmasked_gradient_where_the_clip_is_active(backend_name,
                                                                            options):
    """On a step whose clip is active, the straight-through gradient of every field is the
    exact gradient of the same saved step with no clip to mask (a result that records
    nothing: its keywords decide), and differs from the exact one."""
    case = fixed_case("lstm_cell", np.random.default_rng(7), **SIZES, clip=True, **options)
    with backend(backend_name) as impl:
        calls = BackendCalls(impl)
        state = calls.forward("lstm_cell", case)
        up = upstream("lstm_cell", state, np.random.default_rng(8))
        straight = calls.grad("lstm_cell", case, state, **up, clip_grad="straight_through")
        exact = calls.grad("lstm_cell", case, state, **up)
        unmasked = calls.grad("lstm_cell", {**case, "cell_clip": None}, state, **up)
    _assert_equal(straight, unmasked)
    assert not np.allclose(straight.cs_prev, exact.cs_prev)


@pytest.mark.parametrize("op", FIELD_OPS)
@pytest.mark.parametrize("options", ["peepholes, clip", "layer norm normalized"])
def test_each_gate_field_alone_is_never_dropped(op, options):
    """A cotangent on one gate field only: a nonzero gradient, and the true one."""
    case = _case(op, {**OPTIONS[_cell(op)][options],
                      **({"ragged": True} if OPS[op].sequence else {})}, 9)
    for field in _gate_fields(op):
        pair_options = ({"outputs": (field,)} if OPS[op].sequence else
                        {"d_h": False, "d_cs": False, "gates": True})
        report = testing.vjp_check(op, case, backend="reference", **pair_options)
        assert report.passed, f"\n{field}:\n{report}"
        result = getattr(gc, op)(**_forward_keywords(op, case), backend="reference")
        grads = getattr(gc, OPS[op].grad_name)(
            **_grad_keywords(op, case), **{OPS[op].result_arg: result},
            **{f"d_{field}": np.ones_like(getattr(result, field))}, backend="reference")
        assert np.any(grads.x) and np.any(grads.w), field


def _forward_keywords(op, case):
    taken = inspect.signature(getattr(gc, op)).parameters
    return {k: v for k, v in case.items() if k in taken}


def _grad_keywords(op, case):
    taken = inspect.signature(getattr(gc, OPS[op].grad_name)).parameters
    return {k: v for k, v in case.items() if k in taken}


# -- the fused backends against the reference --------------------------------------------------


def _assert_equal(got, want, err_msg=""):
    for name, a, b in zip(want._fields, got, want, strict=True):
        if b is None:
            assert a is None, name
        elif hasattr(b, "_fields"):
            _assert_equal(a, b, f"{err_msg}{name}.")
        else:
            np.testing.assert_array_equal(a, b, err_msg=err_msg + name)


def _assert_close(got, want, err_msg="", rel=1e-12):
    """Each array to ``rel`` of its own scale (the largest magnitude of the reference's)."""
    for name, a, b in zip(want._fields, got, want, strict=True):
        if b is None:
            assert a is None, err_msg + name
        elif hasattr(b, "_fields"):
            _assert_close(a, b, f"{err_msg}{name}.", rel)
        else:
            scale = float(np.max(np.abs(b), initial=0.0))
            np.testing.assert_allclose(a, b, rtol=0, atol=rel * (1.0 + scale),
                                       err_msg=err_msg + name)


FUSED = [b for b in BACKENDS if b != "reference"]


@pytest.mark.parametrize("backend_name", FUSED)
@pytest.mark.parametrize("op", FIELD_OPS)
@CONTRACT_EXAMPLES
@given(data=st.data(), seed=st.integers(0, 2**32 - 1),
       clip_grad=st.sampled_from(["exact", "straight_through"]),
       none_rate=st.sampled_from([0.0, 0.5]))
def test_the_fused_backends_agree_with_the_reference_on_every_field(
        backend_name, op, data, seed, clip_grad, none_rate):
    """Gradient and second order, upstreams (and their tangents) on every field, each None
    at random: the backend's against the reference's at the reference's forward result."""
    case = data.draw(cases(op, layer="public"))
    rng = np.random.default_rng(seed)
    with public("reference") as ref:
        result = ref.forward(op, case)
        up = upstream(op, result, rng, none_rate)
        up_t = {f"{k}_tangent": v for k, v in upstream(op, result, rng, none_rate).items()}
        t = tangents(op, case, rng, none_rate)
        want = ref.grad(op, case, result, **up, clip_grad=clip_grad)
        want_jvp = ref.grad_jvp(op, case, result, t, **up, **up_t, clip_grad=clip_grad)
    with public(backend_name) as calls:
        got = calls.grad(op, case, result, **up, clip_grad=clip_grad)
        got_jvp = calls.grad_jvp(op, case, result, t, **up, **up_t, clip_grad=clip_grad)
    _assert_close(got, want, "grad: ")
    for name, a, b in zip(("grads", "tangent"), got_jvp, want_jvp, strict=True):
        _assert_close(a, b, f"grad_jvp {name}: ")


@pytest.mark.parametrize("backend_name", FUSED)
@pytest.mark.parametrize(("op", "options"), list(_grid()))
def test_the_fused_backends_agree_on_every_option(backend_name, op, options):
    """The grid of ``OPTIONS`` (both clip modes), every field's upstream given."""
    case = _case(op, options, 11)
    rng = np.random.default_rng(12)
    for clip_grad in ("exact", "straight_through"):
        with public("reference") as ref:
            result = ref.forward(op, case)
            up = upstream(op, result, rng)
            want = ref.grad(op, case, result, **up, clip_grad=clip_grad)
        with public(backend_name) as calls:
            got = calls.grad(op, case, result, **up, clip_grad=clip_grad)
        _assert_close(got, want, f"{clip_grad}: ")


@pytest.mark.parametrize("backend_name", FUSED)
@pytest.mark.parametrize("op", FIELD_OPS)
def test_without_gate_upstreams_nothing_changes(backend_name, op):
    """Gate upstreams of zeros give the gradient of none, bit for bit (the fused kernels'
    path without them is the one they ran before)."""
    case = _case(op, {"peephole": True, "clip": True}, 13)
    with public(backend_name) as calls:
        result = calls.forward(op, case)
        up = upstream(op, result, np.random.default_rng(14))
        states = {k: v for k, v in up.items() if k[2:] not in _gate_fields(op)}
        zeros = {f"d_{f}": np.zeros_like(getattr(result, f)) for f in _gate_fields(op)}
        none = calls.grad(op, case, result, **states)
        given_zeros = calls.grad(op, case, result, **states, **zeros)
    _assert_close(given_zeros, none, rel=0.0)


# -- second order -------------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "options"), [p for p in _grid()
                                             if "peepholes" in p.id or "normalized" in p.id])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_second_order_of_every_field_is_the_gradients_derivative(op, options,
                                                                    backend_name):
    """``<op>_grad_jvp`` along tangents of the inputs and of every field's cotangent
    against central differences of the gradient (``grad_jvp_check``)."""
    case = _case(op, options, 15)
    with public(backend_name) as calls:
        report = testing.grad_jvp_check(op, case, backend=calls.name, seed=16)
    assert report.passed, f"\n{report}"


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("op", FIELD_OPS)
def test_a_gate_upstreams_tangent_alone(backend_name, op):
    """With the inputs' tangents zero, the gradient's tangent along ``d_<gate>_tangent`` is
    the gradient of that tangent as the upstream (the gradient is linear in it)."""
    case = _case(op, {"peephole": True, "clip": True, **({"ragged": True, "masks": True}
                                                         if OPS[op].sequence else {})}, 17)
    rng = np.random.default_rng(18)
    with public(backend_name) as calls:
        result = calls.forward(op, case)
        zero = OPS[op].grads(*(None for _ in OPS[op].grads._fields))
        for field in _gate_fields(op):
            d = rng.standard_normal(getattr(result, field).shape)
            _, tangent = calls.grad_jvp(op, case, result, zero, **{f"d_{field}_tangent": d})
            direct = calls.grad(op, case, result, **{f"d_{field}": d})
            _assert_close(tangent, direct, f"{field}: ")
