"""What is the selective scan's own (docs/spec.md §18.4): ``gc.selective_scan`` and its
gradient, forward mode and second order on every backend (the reference, the CPU, and the
GPU's kernels on the host through ``tests/cuda_host``), against a float64 PyTorch autograd
transcription of mamba_ssm's ``selective_scan_ref``, finite differences through the oracle,
grouped B/C, the optional D/z/delta_bias with and without softplus, reverse,
return_last_state, purity, empty sizes, dtypes and named errors.

Like the linear scan it is registered apart from the cells (``gradcells.cells.SCANS``), so
the cell contract tests do not draw it; this file holds each of those contracts for it."""

from __future__ import annotations

import cuda_host
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells import _dispatch, cells
from gradcells.cells.selective import spec
from gradcells.gpu import _kernels, _launch

torch = pytest.importorskip("torch")
F = torch.nn.functional

BACKENDS = ("reference", "cpu", "gpu")
TINY = _kernels.LaunchPolicy(block=3, max_grid=2, rows_per_part=2, min_threads=1 << 30)
NAMES = spec.SelectiveScanGrads._fields


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """A backend name for ``backend=``; "gpu" runs ``gpu.py`` and ``selective.cu`` on the
    host (NumPy arrays reach it through a patched dispatch)."""
    name = request.param
    if name != "gpu":
        yield name
        return
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    monkeypatch.setattr(gc.scans._dispatch, "backend_for",
                        lambda backend, library: _dispatch.backend_module(backend or "cpu"))
    saved = _launch.use_runtime(cuda_host.HostRuntime(TINY))
    try:
        yield name
    finally:
        _launch.use_runtime(saved)


def _case(seed, *, batch=2, channels=4, state=3, steps=5, groups=(None, None), optional=True,
          dtype=np.float64):
    """``(arrays, keywords)``: u, delta, A, B, C positionally, D, z, delta_bias as keywords
    (None without ``optional``); ``groups`` (G_B, G_C), None for ungrouped. delta is
    positive (and A negative), so Δ > 0 with or without softplus, as in Mamba."""
    rng = np.random.default_rng(seed)

    def bc(g):
        return rng.standard_normal((batch, state, steps) if g is None
                                   else (batch, g, state, steps))
    arrays = [rng.standard_normal((batch, channels, steps)),
              rng.uniform(0.05, 0.6, (batch, channels, steps)),
              -np.exp(0.5 * rng.standard_normal((channels, state))), bc(groups[0]),
              bc(groups[1])]
    keywords = dict(D=rng.standard_normal(channels), z=rng.standard_normal(arrays[0].shape),
                    delta_bias=rng.uniform(0.0, 0.3, channels)) if optional else {}
    return ([a.astype(dtype) for a in arrays],
            {k: v.astype(dtype) for k, v in keywords.items()})


def _mamba_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
               reverse=False):
    """mamba_ssm's ``selective_scan_ref`` (selective_scan_interface.py) transcribed for real
    A and variable B, C, computing in the inputs' dtype (float64 here: the reference casts
    to float32) and with ``reverse`` (which it lacks: time flipped around it).
    Returns ``(out, last_state)``."""
    if reverse:
        u, delta, B, C = (v.flip(-1) for v in (u, delta, B, C))
        z = None if z is None else z.flip(-1)
    if delta_bias is not None:
        delta = delta + delta_bias[..., None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, dim, dstate = u.shape[0], A.shape[0], A.shape[1]
    x = A.new_zeros((batch, dim, dstate))
    ys = []
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    if B.dim() == 3:
        deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    else:
        B = B.repeat_interleave(dim // B.shape[1], dim=1)     # einops' "B (G H) N L"
        deltaB_u = torch.einsum("bdl,bdnl,bdl->bdln", delta, B, u)
    if C.dim() == 4:
        C = C.repeat_interleave(dim // C.shape[1], dim=1)
    last_state = x
    for i in range(u.shape[2]):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        if C.dim() == 3:
            y = torch.einsum("bdn,bn->bd", x, C[:, :, i])
        else:
            y = torch.einsum("bdn,bdn->bd", x, C[:, :, :, i])
        last_state = x
        ys.append(y)
    y = torch.stack(ys, dim=2) if ys else u.new_zeros(u.shape)
    out = y if D is None else y + u * D[:, None]
    if z is not None:
        out = out * F.silu(z)
    return (out.flip(-1) if reverse else out), last_state


CONFIGS = [
    dict(groups=(None, None), optional=False, delta_softplus=False, reverse=False),
    dict(groups=(None, None), optional=True, delta_softplus=True, reverse=False),
    dict(groups=(2, 2), optional=True, delta_softplus=False, reverse=True),
    dict(groups=(2, None), optional=False, delta_softplus=True, reverse=True),
    dict(groups=(4, 2), optional=True, delta_softplus=True, reverse=False),
]
IDS = ["plain", "D-z-bias-softplus", "grouped-reverse", "B-grouped-softplus-reverse",
       "groups-4-2-all"]


def _torch_grads(arrays, keywords, settings, d_y, d_last):
    leaves = {name: torch.tensor(v, requires_grad=True)
              for name, v in zip(NAMES, (*arrays, keywords.get("D"), keywords.get("z"),
                                         keywords.get("delta_bias")), strict=True) if v is not None}
    out, last = _mamba_ref(**leaves, **settings)
    ((out * torch.tensor(d_y)).sum() + (last * torch.tensor(d_last)).sum()).backward()
    return out.detach().numpy(), last.detach().numpy(), {
        k: v.grad.numpy() for k, v in leaves.items()}


def _close(actual, expected, tolerance, what):
    scale = 1 + (np.abs(expected).max() if expected.size else 0)
    assert actual.shape == expected.shape, what
    error = np.abs(actual - expected).max() if expected.size else 0.0
    assert error <= tolerance * scale, f"{what}: {error:.3g} > {tolerance:.0e}·{scale:.3g}"


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_forward_and_gradient_equal_torch_autograd(config, backend):
    """y, last_state and every gradient (the last state's included) equal autograd through
    the transcription of ``selective_scan_ref``, in float64, on 70 steps (two of the
    backends' 64-step checkpoint chunks)."""
    config = dict(config)
    arrays, keywords = _case(1, steps=70, groups=config.pop("groups"),
                             optional=config.pop("optional"))
    rng = np.random.default_rng(2)
    result = gc.selective_scan(*arrays, **keywords, **config, return_last_state=True,
                               backend=backend)
    d_y, d_last = rng.standard_normal(result.y.shape), rng.standard_normal(
        result.last_state.shape)
    out, last, expected = _torch_grads(arrays, keywords, config, d_y, d_last)
    _close(result.y, out, 1e-12, "y")
    _close(result.last_state, last, 1e-12, "last_state")
    grads = gc.selective_scan_grad(*arrays, result, **keywords, d_y=d_y, d_last_state=d_last,
                                   backend=backend)
    for name in NAMES:
        got = getattr(grads, name)
        if name not in expected:
            assert got is None, name
            continue
        assert got.dtype == np.float64
        _close(got, expected[name], 1e-11, f"d_{name}")


def test_float32_agrees_with_float64(backend):
    """Every backend computes float32 in float32 (mamba_ssm's reference computes in float32
    whatever it is given): results in float32 within a float32 bound of float64's."""
    arrays, keywords = _case(3, groups=(2, 2), steps=9)
    single = ([a.astype(np.float32) for a in arrays],
              {k: v.astype(np.float32) for k, v in keywords.items()})
    r64 = gc.selective_scan(*arrays, **keywords, delta_softplus=True, backend=backend)
    r32 = gc.selective_scan(*single[0], **single[1], delta_softplus=True, backend=backend)
    assert r32.y.dtype == np.float32 and r32.last_state is None
    _close(r32.y.astype(np.float64), r64.y, 1e-5, "y")
    d_y = np.ones_like(r64.y)
    g64 = gc.selective_scan_grad(*arrays, r64, **keywords, d_y=d_y, backend=backend)
    g32 = gc.selective_scan_grad(*single[0], r32, **single[1], d_y=d_y.astype(np.float32),
                                 backend=backend)
    for name, a, b in zip(NAMES, g32, g64, strict=True):
        assert a.dtype == np.float32, name
        _close(a.astype(np.float64), b, 1e-5, name)


@pytest.mark.parametrize("config", [CONFIGS[2], CONFIGS[4]], ids=[IDS[2], IDS[4]])
def test_gradients_pass_the_oracle(config, backend):
    """``check_vjp`` in float64 over every input (the last state's cotangent included)."""
    config = dict(config)
    arrays, keywords = _case(5, steps=4, channels=4, state=2, groups=config.pop("groups"),
                             optional=config.pop("optional"))
    names = [*NAMES[:5], *keywords]

    def split(args):
        return args[:5], dict(zip(keywords, args[5:], strict=True))

    def f(*args):
        a, kw = split(args)
        r = gc.selective_scan(*a, **kw, **config, return_last_state=True, backend=backend)
        return r.y, r.last_state

    def vjp(cotangent, *args):
        a, kw = split(args)
        r = gc.selective_scan(*a, **kw, **config, return_last_state=True, backend=backend)
        g = gc.selective_scan_grad(*a, r, **kw, d_y=cotangent[0], d_last_state=cotangent[1],
                                   backend=backend)
        return tuple(getattr(g, name) for name in names)

    gc.check_vjp(f, vjp, [*arrays, *keywords.values()], names=names).raise_if_failed()


EPS = 1e-6
"""The step of the central differences below."""


def test_forward_mode_and_second_order_pass_finite_differences(backend):
    """``selective_scan_jvp`` against central differences along the tangents, and
    ``selective_scan_grad_jvp`` against central differences of ``selective_scan_grad``,
    every input and both upstream gradients moved, grouped, softplus, reverse."""
    rng = np.random.default_rng(7)
    arrays, keywords = _case(8, steps=4, groups=(2, 1))
    settings = dict(delta_softplus=True, reverse=True, return_last_state=True)
    primals = [*arrays, keywords["D"], keywords["z"], keywords["delta_bias"]]
    t = gc.SelectiveScanGrads(*(rng.standard_normal(v.shape) for v in primals))
    result = gc.selective_scan(*arrays, **keywords, **settings)
    up = (rng.standard_normal(result.y.shape), rng.standard_normal(result.last_state.shape))
    t_up = tuple(rng.standard_normal(v.shape) for v in up)

    def at(sign):
        moved = [v + sign * EPS * tv for v, tv in zip(primals, t, strict=True)]
        kw = dict(zip(("D", "z", "delta_bias"), moved[5:], strict=True))
        r = gc.selective_scan(*moved[:5], **kw, **settings, backend=backend)
        g = gc.selective_scan_grad(*moved[:5], r, **kw, d_y=up[0] + sign * EPS * t_up[0],
                                   d_last_state=up[1] + sign * EPS * t_up[1], backend=backend)
        return r, g

    (r_hi, g_hi), (r_lo, g_lo) = at(1), at(-1)
    _, tangent = gc.selective_scan_jvp(*arrays, t, **keywords, **settings, backend=backend)
    for name in ("y", "last_state"):
        numeric = (getattr(r_hi, name) - getattr(r_lo, name)) / (2 * EPS)
        _close(getattr(tangent, name), numeric, 1e-7, f"t_{name}")
    _, t_grads = gc.selective_scan_grad_jvp(*arrays, result, t, **keywords, d_y=up[0],
                                            d_last_state=up[1], d_y_tangent=t_up[0],
                                            d_last_state_tangent=t_up[1], backend=backend)
    for name, got, hi, lo in zip(NAMES, t_grads, g_hi, g_lo, strict=True):
        _close(got, (hi - lo) / (2 * EPS), 1e-7, f"t_d_{name}")


@pytest.mark.parametrize("name", ["D", "delta_bias", "A"])
def test_a_tangent_of_one_small_array_alone(name, backend):
    """Forward mode along one ``[Dm]`` or ``[Dm, N]`` array only (the others' tangents
    None), without softplus: the tangent broadcast over batch and time as its array is."""
    arrays, keywords = _case(18, steps=4)
    primals = dict(zip(NAMES, [*arrays, keywords["D"], keywords["z"], keywords["delta_bias"]],
                       strict=True))
    direction = np.random.default_rng(19).standard_normal(primals[name].shape)
    _, tangent = gc.selective_scan_jvp(*arrays, gc.SelectiveScanGrads(
        **{k: (direction if k == name else None) for k in NAMES}), **keywords,
        return_last_state=True, backend=backend)

    def moved(sign):
        p = {**primals, name: primals[name] + sign * EPS * direction}
        return gc.selective_scan(*(p[k] for k in NAMES[:5]), **{k: p[k] for k in NAMES[5:]},
                                 return_last_state=True, backend=backend)
    hi, lo = moved(1), moved(-1)
    _close(tangent.y, (hi.y - lo.y) / (2 * EPS), 1e-7, "t_y")
    _close(tangent.last_state, (hi.last_state - lo.last_state) / (2 * EPS), 1e-7, "t_last")


def test_inputs_are_never_modified_and_outputs_never_alias_them(backend):
    arrays, keywords = _case(9, groups=(2, 2))
    everything = [*arrays, *keywords.values()]
    before = [v.copy() for v in everything]
    result = gc.selective_scan(*arrays, **keywords, return_last_state=True, backend=backend)
    grads = gc.selective_scan_grad(*arrays, result, **keywords, d_y=np.ones_like(result.y),
                                   backend=backend)
    for v, w in zip(everything, before, strict=True):
        np.testing.assert_array_equal(v, w)
    for out in (*result, *grads):
        assert not any(np.shares_memory(out, v) for v in everything)


@pytest.mark.parametrize("shape", [(0, 4, 5, 3), (2, 0, 5, 3), (2, 4, 0, 3), (2, 4, 5, 0)],
                         ids=["Bt0", "Dm0", "L0", "N0"])
def test_empty_sizes(shape, backend):
    """Empty batch, channels, steps or states: results of the right shapes (zeros: no step
    run leaves the state at zero, no state makes y = D u)."""
    batch, channels, steps, state = shape
    arrays, keywords = _case(10, batch=batch, channels=channels, steps=steps, state=state)
    result = gc.selective_scan(*arrays, **keywords, return_last_state=True, backend=backend)
    assert result.y.shape == (batch, channels, steps)
    assert result.last_state.shape == (batch, channels, state)
    np.testing.assert_array_equal(result.last_state, 0)
    u, z = arrays[0], keywords["z"]
    if state == 0:
        _close(result.y, u * keywords["D"][:, None] * z / (1 + np.exp(-z)), 1e-14, "y = D u")
    grads = gc.selective_scan_grad(*arrays, result, **keywords, d_y=np.ones_like(result.y),
                                   d_last_state=np.ones_like(result.last_state),
                                   backend=backend)
    for name, g, v in zip(NAMES, grads, [*arrays, *keywords.values()], strict=True):
        assert g.shape == v.shape, name


def test_numpy_float16_is_computed_in_float32():
    arrays, keywords = _case(12)
    half = [a.astype(np.float16) for a in arrays]
    result = gc.selective_scan(*half, delta_softplus=True)
    single = gc.selective_scan(*(a.astype(np.float32) for a in half), delta_softplus=True)
    assert result.y.dtype == np.float16
    np.testing.assert_array_equal(result.y, single.y.astype(np.float16))


def test_the_result_records_its_settings_and_a_contradiction_is_named():
    arrays, keywords = _case(13)
    result = gc.selective_scan(*arrays, **keywords, delta_softplus=True, reverse=True)
    assert result.settings.delta_softplus and result.settings.reverse
    assert not result.settings.return_last_state and result.last_state is None
    recorded = gc.selective_scan_grad(*arrays, result, **keywords, d_y=np.ones_like(result.y))
    bare = gc.selective_scan_grad(*arrays, spec.SelectiveScan(*result), **keywords,
                                  d_y=np.ones_like(result.y), delta_softplus=True,
                                  reverse=True)
    for a, b in zip(recorded, bare, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="reverse"):
        gc.selective_scan_grad(*arrays, result, **keywords, reverse=False)
    with pytest.raises(ValueError, match="d_last_state"):
        gc.selective_scan_grad(*arrays, result, **keywords,
                               d_last_state=np.zeros((2, 4, 3)))


def _errors():
    """(what, call, error, the name the message must hold)."""
    (u, delta, A, B, C), kw = _case(14)
    return [
        ("u list", lambda: gc.selective_scan(u.tolist(), delta, A, B, C), TypeError, "u"),
        ("u int", lambda: gc.selective_scan(u.astype(int), delta, A, B, C), TypeError, "u"),
        ("u rank", lambda: gc.selective_scan(u[0], delta, A, B, C), ValueError, "u"),
        ("delta dtype", lambda: gc.selective_scan(u, delta.astype(np.float32), A, B, C),
         TypeError, "delta"),
        ("delta shape", lambda: gc.selective_scan(u, delta[:, :, :2], A, B, C), ValueError,
         "delta"),
        ("A shape", lambda: gc.selective_scan(u, delta, A[:1], B, C), ValueError, "A"),
        ("B rank", lambda: gc.selective_scan(u, delta, A, B[0], C), ValueError, "B"),
        ("B groups", lambda: gc.selective_scan(u, delta, A, np.stack([B] * 3, 1), C),
         ValueError, "B"),
        ("C steps", lambda: gc.selective_scan(u, delta, A, B, C[..., :1]), ValueError, "C"),
        ("C None", lambda: gc.selective_scan(u, delta, A, B, None), TypeError, "C"),
        ("D shape", lambda: gc.selective_scan(u, delta, A, B, C, D=kw["D"][:2]), ValueError,
         "D"),
        ("z shape", lambda: gc.selective_scan(u, delta, A, B, C, z=u[:1]), ValueError, "z"),
        ("delta_bias dtype", lambda: gc.selective_scan(
            u, delta, A, B, C, delta_bias=kw["delta_bias"].astype(np.float32)), TypeError,
         "delta_bias"),
        ("softplus", lambda: gc.selective_scan(u, delta, A, B, C, delta_softplus=1),
         TypeError, "delta_softplus"),
        ("torch among numpy", lambda: gc.selective_scan(u, torch.tensor(delta), A, B, C),
         TypeError, "delta"),
        ("result", lambda: gc.selective_scan_grad(u, delta, A, B, C, "r"), TypeError,
         "result"),
        ("d_y shape", lambda: gc.selective_scan_grad(
            u, delta, A, B, C, gc.selective_scan(u, delta, A, B, C), d_y=u[:1]), ValueError,
         "d_y"),
        ("tangent of absent D", lambda: gc.selective_scan_jvp(
            u, delta, A, B, C, gc.SelectiveScanGrads(*[None] * 5, u[0, 0], None, None)),
         ValueError, "D"),
    ]


def test_bad_arguments_raise_named_errors():
    for what, call, error, name in _errors():
        with pytest.raises(error) as info:
            call()
        assert name in str(info.value), f"{what}: {info.value}"


def test_torch_tensors_in_torch_tensors_out():
    arrays, keywords = _case(16)
    result = gc.selective_scan(*(torch.tensor(a) for a in arrays),
                               **{k: torch.tensor(v) for k, v in keywords.items()})
    assert isinstance(result.y, torch.Tensor)
    np.testing.assert_allclose(result.y.numpy(), gc.selective_scan(*arrays, **keywords).y)


def test_every_backend_module_follows_the_protocol():
    """The registry reaches the op on every backend, with the protocol's signatures."""
    import inspect
    assert cells.cell_of("selective_scan_grad_jvp") == "selective"
    for name in cells.BACKENDS:
        module = cells.implementation("selective", name)
        for op in ("selective_scan", "selective_scan_grad", "selective_scan_jvp",
                   "selective_scan_grad_jvp"):
            expected = inspect.signature(getattr(spec.SelectiveScanBackend, op))
            got = inspect.signature(getattr(module, op))
            assert list(got.parameters)[: len(expected.parameters) - 1] == list(
                expected.parameters)[1:], (name, op)


# --------------------------------------------------------------------------------------
# fuzzing (docs/spec.md §16.3): malformed arguments raise TypeError or ValueError, nothing
# else, and change nothing

_FUNCTIONS = ("selective_scan", "selective_scan_grad", "selective_scan_jvp",
              "selective_scan_grad_jvp")
_SETTINGS = ("delta_softplus", "reverse", "return_last_state")


def _valid(name):
    (u, delta, A, B, C), kw = _case(17, batch=2, channels=2, state=2, steps=3, groups=(2, 1))
    arguments = {"u": u, "delta": delta, "A": A, "B": B, "C": C, **kw, "backend": "reference"}
    settings = {"delta_softplus": True, "reverse": True, "return_last_state": True}
    if name in ("selective_scan", "selective_scan_jvp"):
        arguments.update(settings)
    if name.endswith("_jvp"):
        arguments["tangents"] = gc.SelectiveScanGrads(u.copy(), None, A.copy(), None, None,
                                                      None, None, kw["delta_bias"].copy())
    if "grad" in name:
        arguments["result"] = gc.selective_scan(u, delta, A, B, C, **kw, **settings)
        arguments["d_y"] = np.ones_like(u)
        arguments["d_last_state"] = np.ones_like(arguments["result"].last_state)
    return arguments


def _spoiled(data, name):
    """One valid call with one argument replaced by a drawn malformed value (a tensor
    among NumPy arrays too)."""
    arguments = _valid(name)
    key = data.draw(st.sampled_from(sorted(k for k in arguments if k != "backend")))
    value = arguments[key]
    bad = [None, "a", 1.0, [[1.0]], np.nan]
    if isinstance(value, np.ndarray):
        bad += [value[:1], value[..., None], value.astype(np.int32), value.astype(np.float32),
                value.T, torch.tensor(value), np.full_like(value, np.nan)]
    if isinstance(value, tuple):
        bad += [tuple(value)[:1], (None,) * len(value), tuple(value) + (value[0],)]
    if key in _SETTINGS:
        bad += ["yes", 1, not value]
    return {**arguments, key: data.draw(st.sampled_from(bad))}


@pytest.mark.parametrize("name", _FUNCTIONS)
@given(data=st.data())
def test_malformed_arguments_raise_named_errors_and_change_nothing(name, data):
    arguments = _spoiled(data, name)
    kept = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in arguments.items()}
    try:
        getattr(gc, name)(**arguments)
    except (TypeError, ValueError):
        pass
    for key, before in kept.items():
        if isinstance(before, np.ndarray):
            assert np.array_equal(before, arguments[key], equal_nan=True), key
