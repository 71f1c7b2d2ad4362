"""The layer-normalised LSTM (docs/spec.md §9.2) through the public operations, on every
NumPy backend: ``layer_norm=gc.LSTMNorm(...)``, ``ln_epsilon`` and ``ln_carry``.

- the reference's float64 gradients equal central differences, every option drawn
  (peepholes, cell clip, projection and its clip, forget bias, ragged lengths, both
  carries; the CPU's: ``test_layer_norm_cpu.py``);
- the forward is the formula of §9.2, written out here independently of the reference;
  the two carries differ exactly in what they carry;
- the gate norms make the forward invariant to the scale of the weights, and the weight
  gradient scales inversely (a property no formula-by-formula check can hide);
- a sequence equals its cell loop (``gradcells.testing.unrolled``);
- the result records the layer norm's settings; contradictions and a layer norm missing or
  extra in the gradient are named; bad input raises naming the argument; inputs are never
  modified; PyTorch tensors travel inside an ``LSTMNorm``.

The CPU backend's agreement with the reference case by case is ``test_layer_norm_cpu.py``;
the conformance with PyTorch and Keras is ``test_layer_norm_conformance.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcells as gc
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.cells.lstm.spec import LN_CARRIES
from gradcells.testing import lstm_cell_case, lstm_sequence_case, unrolled, vjp_check

BACKENDS = ["reference", "cpu"]
CELL_ARRAYS = OPS["lstm_cell"].arrays[:5]            # x, cs_prev, h_prev, w, b
SEQUENCE_ARRAYS = OPS["lstm_sequence"].arrays[:5]    # x, cs0, h0, w, b


def _case(kind, rng, **kw):
    if kind == "cell":
        return lstm_cell_case(rng, layer_norm=True, **kw)
    return lstm_sequence_case(rng, layer_norm=True, **kw)


def _forward(kind, case, backend, **kw):
    return (gc.lstm_cell if kind == "cell" else gc.lstm_sequence)(**case, **kw, backend=backend)


def _grad(kind, case, result, backend, **kw):
    """The gradient given the arrays, the result and the upstream only."""
    names = CELL_ARRAYS if kind == "cell" else SEQUENCE_ARRAYS
    optional = {n: case[n] for n in OPTIONAL_WEIGHTS if case.get(n) is not None}
    grad = gc.lstm_cell_grad if kind == "cell" else gc.lstm_sequence_grad
    return grad(*(case[n] for n in names), result, **optional, **kw, backend=backend)


def _upstream(result, seed):
    rng = np.random.default_rng(seed)
    fields = ("h", "cs", "h_final", "cs_final")
    return {f"d_{k}": rng.standard_normal(getattr(result, k).shape)
            for k in fields if hasattr(result, k)}


def _ln(z, gamma, beta, eps):
    mean = z.mean(axis=-1, keepdims=True)
    var = ((z - mean) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (z - mean) / np.sqrt(var + eps) + beta


# --- gradients -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["cell", "sequence"])
@given(seed=st.integers(0, 2**32 - 1), carry=st.sampled_from(LN_CARRIES),
       peephole=st.booleans(), clip=st.booleans(), proj=st.sampled_from([None, 1, 3, 6]),
       proj_clip=st.booleans(), ragged=st.booleans(),
       forget_bias=st.sampled_from([0.0, 1.0, -0.5]))
def test_gradients_equal_central_differences(kind, seed, carry, peephole, clip, proj,
                                             proj_clip, ragged, forget_bias):
    """On the reference. The CPU's float64 gradients pass the oracle for every option
    combination in ``test_layer_norm_cpu.py`` and equal the reference's to 1e-12 there:
    differencing them again here re-proved both."""
    backend = "reference"
    rng = np.random.default_rng(seed)
    extra = {"ragged": ragged} if kind == "sequence" else {}
    case = _case(kind, rng, ln_carry=carry, peephole=peephole, clip=clip, proj_size=proj,
                 proj_clip=proj_clip, forget_bias=forget_bias, **extra)
    op = "lstm_cell" if kind == "cell" else "lstm_sequence"
    vjp_check(op, case, backend=backend).raise_if_failed()


# --- the formula -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("carry", LN_CARRIES)
def test_the_cell_is_the_formula_of_the_spec(backend, carry):
    rng = np.random.default_rng(3)
    case = _case("cell", rng, batch=4, input_size=3, hidden=5, peephole=True, clip=True,
                 ln_carry=carry, forget_bias=0.5)
    x, cs_prev, h_prev, w, b = (case[n] for n in CELL_ARRAYS)
    gx, bx, gh, bh, gc_, bc = case["layer_norm"]
    eps, hidden = case["ln_epsilon"], cs_prev.shape[1]

    g = _ln(x @ w[:3], gx, bx, eps) + _ln(h_prev @ w[3:], gh, bh, eps) + b
    gi, gg, gf, go = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    i = sig(gi + cs_prev * case["wci"])
    f = sig(gf + 0.5 + cs_prev * case["wcf"])
    c_tilde = np.clip(i * np.tanh(gg) + f * cs_prev, -case["cell_clip"], case["cell_clip"])
    n = _ln(c_tilde, gc_, bc, eps)
    cs = n if carry == "normalized" else c_tilde
    o = sig(go + cs * case["wco"])

    state = _forward("cell", case, backend)
    for name, want in (("i", i), ("f", f), ("cs", cs), ("co", np.tanh(n)), ("o", o),
                       ("h", o * np.tanh(n))):
        np.testing.assert_allclose(getattr(state, name), want, rtol=1e-12, atol=1e-13,
                                   err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_carries_differ_only_in_what_they_carry(backend):
    case = _case("sequence", np.random.default_rng(4), steps=5, peephole=True)
    raw = _forward("sequence", {**case, "ln_carry": "raw"}, backend)
    normed = _forward("sequence", {**case, "ln_carry": "normalized"}, backend)
    # The first step reads the same state; from the second on, the carried state differs.
    np.testing.assert_allclose(raw.co[0], normed.co[0], rtol=1e-13, atol=1e-14)
    gamma_c, beta_c = case["layer_norm"][4:]
    np.testing.assert_allclose(np.tanh(_ln(raw.cs[0], gamma_c, beta_c, case["ln_epsilon"])),
                               raw.co[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.tanh(normed.cs[0]), normed.co[0], rtol=1e-12, atol=1e-13)
    assert not np.allclose(raw.h[1:], normed.h[1:])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_the_weights_scale_drops_out_and_their_gradient_scales_inversely(backend, kind):
    # LN(z·k) = LN(z) for k > 0 up to ε, so scaling w changes nothing but dL/dw by 1/k.
    case = _case(kind, np.random.default_rng(8), ln_carry="raw")
    case["ln_epsilon"] = 1e-12
    scaled = {**case, "w": 4.0 * case["w"]}
    base, big = _forward(kind, case, backend), _forward(kind, scaled, backend)
    for a, b in zip(base, big, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)
    up = _upstream(base, 1)
    g_base = _grad(kind, case, base, backend, **up)
    g_big = _grad(kind, scaled, big, backend, **up)
    np.testing.assert_allclose(4.0 * g_big.w, g_base.w, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(g_big.x, g_base.x, rtol=1e-8, atol=1e-9)


# --- the sequence against its cell loop ----------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("carry", LN_CARRIES)
def test_sequence_equals_its_cell_loop(backend, carry):
    rng = np.random.default_rng(21)
    for k, proj in enumerate((None, 2, None, 6)):
        case = _case("sequence", rng, steps=4, batch=3, input_size=3, hidden=4,
                     peephole=k % 2 == 0, clip=True, proj_size=proj, proj_clip=True,
                     ragged=k < 2, ln_carry=carry)
        seq = gc.lstm_sequence(**case, backend=backend)
        run = unrolled.lstm_forward(*(case[n] for n in SEQUENCE_ARRAYS),
                                    **{n: v for n, v in case.items() if n not in SEQUENCE_ARRAYS},
                                    backend=backend)
        for name, value in run.outputs.items():
            np.testing.assert_allclose(getattr(seq, name), value, rtol=1e-12, atol=1e-13,
                                       err_msg=f"{k}: {name}")
        up = _upstream(seq, k)
        grads = _grad("sequence", case, seq, backend, **up)
        loop = unrolled.lstm_backprop(run, **up)
        assert set(loop) == {n for n, v in grads._asdict().items() if v is not None}
        for name, value in loop.items():
            got = getattr(grads, name)
            for field, a, b in zip(getattr(value, "_fields", [name]),
                                   got if name == "layer_norm" else [got],
                                   value if name == "layer_norm" else [value], strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12, err_msg=f"{k}: {field}")


# --- settings, bad input, purity -----------------------------------------------------------

@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_the_result_records_the_layer_norm(kind):
    case = _case(kind, np.random.default_rng(2), ln_carry="normalized")
    result = _forward(kind, {**case, "ln_epsilon": 1e-3}, "reference")
    s = result.settings
    assert (s.layer_norm, s.ln_epsilon, s.ln_carry) == (True, 1e-3, "normalized")
    plain = _forward(kind, {**case, "layer_norm": None, "ln_carry": "raw"}, "reference")
    assert (plain.settings.layer_norm, plain.settings.ln_carry) == (False, "raw")
    up = _upstream(result, 0)
    short = _grad(kind, case, result, "reference", **up)  # the record decides
    full = _grad(kind, case, result, "reference", ln_epsilon=1e-3, ln_carry="normalized", **up)
    for a, b in zip(short.layer_norm, full.layer_norm, strict=True):
        np.testing.assert_array_equal(a, b)
    untold = _grad(kind, case, type(result)(*result), "reference", **up)  # a bare tuple
    assert not np.allclose(untold.x, short.x)
    with pytest.raises(ValueError, match=r"ln_carry='raw' contradicts the forward's "
                                         r"ln_carry='normalized'"):
        _grad(kind, case, result, "reference", ln_carry="raw", **up)
    with pytest.raises(ValueError, match="ln_epsilon=1e-05 contradicts"):
        _grad(kind, case, result, "reference", ln_epsilon=1e-5, **up)
    with pytest.raises(ValueError, match="the forward ran with layer_norm; pass layer_norm"):
        _grad(kind, {**case, "layer_norm": None}, result, "reference", **up)
    with pytest.raises(ValueError, match="layer_norm was given but the forward ran without"):
        _grad(kind, case, plain, "reference", **up)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_bad_input_is_named(backend, kind):
    case = _case(kind, np.random.default_rng(5))
    norm = case["layer_norm"]
    type_errors = [
        ({"layer_norm": tuple(norm)}, "layer_norm must be a gradcells.LSTMNorm"),
        ({"layer_norm": norm._replace(gamma_c=None)}, "layer_norm.gamma_c must be an array"),
        ({"layer_norm": norm._replace(beta_h=norm.beta_h.astype(np.float32))},
         r"layer_norm.beta_h must have the same dtype as x"),
        ({"layer_norm": norm._replace(beta_x=list(norm.beta_x))}, "layer_norm.beta_x must be"),
        ({"ln_epsilon": "small"}, "ln_epsilon must be a real number"),
    ]
    for change, message in type_errors:
        with pytest.raises(TypeError, match=message):
            _forward(kind, {**case, **change}, backend)
    value_errors = [
        ({"layer_norm": norm._replace(gamma_x=norm.gamma_x[:-1])},
         r"layer_norm.gamma_x must have shape \[4H\]"),
        ({"layer_norm": norm._replace(beta_c=norm.beta_x)},
         r"layer_norm.beta_c must have shape \[H\]"),
        ({"ln_epsilon": 0.0}, "ln_epsilon must be positive"),
        ({"ln_epsilon": -1e-5}, "ln_epsilon must be positive"),
        ({"ln_epsilon": np.nan}, "ln_epsilon must be finite"),
        ({"ln_epsilon": 1e-320}, "ln_epsilon must be positive and a normal number"),
        ({"ln_carry": "cell"}, r"ln_carry must be one of \('raw', 'normalized'\)"),
        ({"layer_norm": None, "ln_carry": "normalized"}, "ln_carry is a setting of the layer"),
        ({"layer_norm": None, "ln_epsilon": 1e-3}, "ln_epsilon is a setting of the layer"),
    ]
    for change, message in value_errors:
        with pytest.raises(ValueError, match=message):
            _forward(kind, {**case, **change}, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_inputs_are_never_modified(backend, kind):
    case = _case(kind, np.random.default_rng(9), peephole=True, clip=True, proj_size=2,
                 ln_carry="normalized", **({"ragged": True} if kind == "sequence" else {}))
    before = {n: v.copy() for n, v in case.items() if isinstance(v, np.ndarray)}
    norm_before = [a.copy() for a in case["layer_norm"]]
    result = _forward(kind, case, backend)
    saved = [a.copy() for a in result]
    up = _upstream(result, 3)
    kept = {n: v.copy() for n, v in up.items()}
    for clip_grad in ("exact", "straight_through"):
        _grad(kind, case, result, backend, clip_grad=clip_grad, **up)
    for name, value in before.items():
        np.testing.assert_array_equal(case[name], value, err_msg=name)
    for a, b in zip(case["layer_norm"], norm_before, strict=True):
        np.testing.assert_array_equal(a, b)
    for name, value in kept.items():
        np.testing.assert_array_equal(up[name], value, err_msg=name)
    for a, b in zip(result, saved, strict=True):
        np.testing.assert_array_equal(a, b)


def test_torch_tensors_travel_inside_the_norm(torch):
    case = _case("cell", np.random.default_rng(11), ln_carry="normalized")
    tensors = {n: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
               for n, v in case.items()}
    tensors["layer_norm"] = gc.LSTMNorm(*map(torch.from_numpy, case["layer_norm"]))
    state = gc.lstm_cell(**tensors)
    assert isinstance(state.h, torch.Tensor) and state.settings.ln_carry == "normalized"
    d_h = torch.ones_like(state.h)
    grads = gc.lstm_cell_grad(*(tensors[n] for n in CELL_ARRAYS),
                              state, d_h=d_h, layer_norm=tensors["layer_norm"])
    assert isinstance(grads.layer_norm, gc.LSTMNorm)
    assert all(isinstance(g, torch.Tensor) for g in grads.layer_norm)
    want = _grad("cell", case, gc.lstm_cell(**case), None, d_h=np.ones(state.h.shape))
    for a, b in zip(grads.layer_norm, want.layer_norm, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cell", "sequence"])
def test_constant_rows_and_huge_preactivations_are_finite_without_warnings(backend, kind):
    import warnings

    case = _case(kind, np.random.default_rng(12), peephole=True, clip=True,
                 ln_carry="normalized")
    constant = {**case, "x": np.zeros_like(case["x"]),
                ("h_prev" if kind == "cell" else "h0"): np.zeros_like(
                    case["h_prev" if kind == "cell" else "h0"])}   # x·W_x = h·W_h = 0: var 0
    huge = {**case, "w": 1e4 * case["w"] / np.abs(case["w"]).max()}   # |z| up to ~1e4
    for variant in (constant, huge):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = _forward(kind, variant, backend)
            grads = _grad(kind, variant, result, backend, **_upstream(result, 0))
        for a in (*result, *[g for g in grads if g is not None and not isinstance(g, tuple)],
                  *grads.layer_norm):
            assert np.all(np.isfinite(a))
