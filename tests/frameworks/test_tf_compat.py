"""The TensorFlow mirrors (``gradcells.tf_compat``) without TensorFlow: output tuples and
shapes, TF's defaults, agreement with the public API they adapt, TF's straight-through clip
gradient, zeros past ``seq_len_max``, errors naming TF's arguments, and no crash where TF's
own ops abort. Conformance with TensorFlow itself is in ``test_conformance_tf.py``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells import tf_compat as tc
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import gru_cell_case, lstm_cell_case, lstm_sequence_case

STEP_FIELDS = ("i", "cs", "f", "o", "ci", "co", "h")
EXACT = {"rtol": 1e-12, "atol": 1e-12}  # the same float64 formulas, different matmul grouping


def assert_close(actual, expected, **tol):
    np.testing.assert_allclose(actual, expected, **(tol or EXACT))


def swap_ci_f(a):
    """Blocks i, f, ci, o <-> i, ci, f, o on the last axis."""
    i, first, second, o = np.split(a, 4, axis=-1)
    return np.concatenate([i, second, first, o], axis=-1)


def cell_args(case, use_peephole):
    """The TF argument list ``x, cs_prev, h_prev, w, wci, wcf, wco, b`` of an LSTM case."""
    hidden = case["cs_prev"].shape[1]
    peeps = [case[k] if use_peephole else np.zeros(hidden, case["x"].dtype) for k in PEEPHOLES]
    return [case["x"], case["cs_prev"], case["h_prev"], case["w"], *peeps, case["b"]]


def sequence_args(case, use_peephole):
    hidden = case["cs0"].shape[1]
    peeps = [case[k] if use_peephole else np.zeros(hidden, case["x"].dtype) for k in PEEPHOLES]
    return [case["x"], case["cs0"], case["h0"], case["w"], *peeps, case["b"]]


def upstream(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)


# -- cells ----------------------------------------------------------------------------------------


@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1), use_peephole=st.booleans(), clip=st.booleans(),
       forget_bias=st.sampled_from([0.0, 1.0, -0.5]))
def test_lstm_block_cell_is_lstm_cell(seed, use_peephole, clip, forget_bias):
    case = lstm_cell_case(np.random.default_rng(seed), peephole=use_peephole, clip=clip,
                          forget_bias=forget_bias)
    cell_clip = case["cell_clip"] or 0.0
    out = tc.lstm_block_cell(*cell_args(case, use_peephole), forget_bias=forget_bias,
                             cell_clip=cell_clip, use_peephole=use_peephole)
    expected = gc.lstm_cell(case["x"], case["cs_prev"], case["h_prev"], case["w"], case["b"],
                            **({k: case[k] for k in PEEPHOLES} if use_peephole else {}),
                            forget_bias=forget_bias, cell_clip=case["cell_clip"])
    assert isinstance(out, tc.LSTMBlockCellOutput) and out._fields == STEP_FIELDS
    for k in STEP_FIELDS:
        np.testing.assert_array_equal(getattr(out, k), getattr(expected, k))


def test_lstm_block_cell_defaults_are_tensorflows(rng):
    """forget_bias=1.0, cell_clip=3.0, use_peephole=False; None means the default, as in TF."""
    case = lstm_cell_case(rng, batch=4, hidden=6)
    case["cs_prev"] = 6.0 * case["cs_prev"]  # large enough that a clip at 3 is active
    args = cell_args(case, False)
    defaults = tc.lstm_block_cell(*args)
    nones = tc.lstm_block_cell(*args, forget_bias=None, cell_clip=None, use_peephole=None)
    explicit = gc.lstm_cell(case["x"], case["cs_prev"], case["h_prev"], case["w"], case["b"],
                            forget_bias=1.0, cell_clip=3.0)
    unclipped = gc.lstm_cell(case["x"], case["cs_prev"], case["h_prev"], case["w"], case["b"])
    assert np.abs(unclipped.cs).max() > 3.0
    assert np.abs(defaults.cs).max() == 3.0
    for k in STEP_FIELDS:
        np.testing.assert_array_equal(getattr(defaults, k), getattr(explicit, k))
        np.testing.assert_array_equal(getattr(nones, k), getattr(explicit, k))
    for no_clip in (0.0, -1.0):
        out = tc.lstm_block_cell(*args, cell_clip=no_clip)
        np.testing.assert_array_equal(out.cs, unclipped.cs)


def test_unused_peepholes_are_ignored(rng):
    """With use_peephole=False the peephole vectors are not read (TF accepts e.g. empty
    ones); their gradients are zeros shaped like them ([H] when None)."""
    case = lstm_cell_case(rng, peephole=True)
    hidden = case["cs_prev"].shape[1]
    x, cs_prev, h_prev, w, _, _, _, b = cell_args(case, True)
    reference = tc.lstm_block_cell(x, cs_prev, h_prev, w, None, None, None, b)
    for peeps in ((case["wci"], case["wcf"], case["wco"]), (np.zeros(0),) * 3,
                  (None, np.zeros(0), np.ones(hidden))):
        out = tc.lstm_block_cell(x, cs_prev, h_prev, w, *peeps, b)
        for k in STEP_FIELDS:
            np.testing.assert_array_equal(getattr(out, k), getattr(reference, k))
        d_cs, d_h = upstream(rng, cs_prev.shape)
        grads = tc.lstm_block_cell_grad(x, cs_prev, h_prev, w, *peeps, b, *out[:6], d_cs, d_h,
                                        False)
        for p, g in zip(peeps, grads[2:], strict=True):
            assert g.shape == ((hidden,) if p is None else p.shape)
            assert not g.any()


@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1), use_peephole=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_lstm_block_cell_grad_is_tensorflows_composition(seed, use_peephole, dtype):
    """TF's Python gradient turns the op's outputs into x, h_prev, w and b gradients by
    matmuls with ``dicfo``; with a clip active the result is the public API's
    ``clip_grad="straight_through"`` gradient, which differs from the exact one."""
    rng = np.random.default_rng(seed)
    case = lstm_cell_case(rng, peephole=use_peephole, clip=True, dtype=dtype, batch=4)
    args = cell_args(case, use_peephole)
    out = tc.lstm_block_cell(*args, forget_bias=case["forget_bias"],
                             cell_clip=case["cell_clip"] or 0.0, use_peephole=use_peephole)
    d_cs, d_h = upstream(rng, case["cs_prev"].shape, dtype)
    grad = tc.lstm_block_cell_grad(*args, *out[:6], d_cs, d_h, use_peephole)
    assert isinstance(grad, tc.LSTMBlockCellGradOutput)
    assert grad.dicfo.shape == (case["x"].shape[0], case["w"].shape[1])
    assert all(g.dtype == dtype for g in grad)

    peeps = {k: case[k] for k in PEEPHOLES} if use_peephole else {}
    public = {mode: gc.lstm_cell_grad(case["x"], case["cs_prev"], case["h_prev"], case["w"],
                                      case["b"], out, d_h=d_h, d_cs=d_cs, **peeps,
                                      cell_clip=case["cell_clip"], clip_grad=mode)
              for mode in ("straight_through", "exact")}
    tol = EXACT if dtype == np.float64 else {"rtol": 1e-5, "atol": 1e-6}
    straight = public["straight_through"]
    n_in = case["x"].shape[1]
    xh_grad = grad.dicfo @ case["w"].T
    assert_close(xh_grad[:, :n_in], straight.x, **tol)
    assert_close(xh_grad[:, n_in:], straight.h_prev, **tol)
    assert_close(np.concatenate([case["x"], case["h_prev"]], 1).T @ grad.dicfo, straight.w,
                 **tol)
    assert_close(grad.dicfo.sum(0), straight.b, **tol)
    assert_close(grad.cs_prev_grad, straight.cs_prev, **tol)
    if use_peephole:
        for k, g in zip(PEEPHOLES, grad[2:], strict=True):
            assert_close(g, getattr(straight, k), **tol)
    if case["cell_clip"] is not None:  # the clip is active somewhere: straight-through is wrong
        assert not np.allclose(straight.cs_prev, public["exact"].cs_prev)


def test_gru_block_cell_is_gru_cell(rng):
    case = gru_cell_case(rng)
    args = [case[k] for k in ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")]
    out = tc.gru_block_cell(*args)
    assert isinstance(out, tc.GRUBlockCellOutput) and out._fields == ("r", "u", "c", "h")
    for got, expected in zip(out, gc.gru_cell(*args), strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gru_block_cell_grad_is_tensorflows_composition(rng, dtype):
    """TF's Python gradient: d_w_ru = [x, h_prev]ᵀ·d_r_bar_u_bar, d_w_c = [x, r∘h_prev]ᵀ·d_c_bar,
    biases the batch sums; with d_x and d_h_prev from the op this is the full gradient."""
    case = gru_cell_case(rng, batch=4, dtype=dtype)
    args = [case[k] for k in ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")]
    out = tc.gru_block_cell(*args)
    d_h = rng.standard_normal(out.h.shape).astype(dtype)
    grad = tc.gru_block_cell_grad(*args, out.r, out.u, out.c, d_h)
    assert isinstance(grad, tc.GRUBlockCellGradOutput)
    assert grad.d_r_bar_u_bar.shape == (4, 2 * out.h.shape[1])
    assert all(g.dtype == dtype for g in grad)
    public = gc.gru_cell_grad(*args, out, d_h=d_h)
    x, h_prev = case["x"], case["h_prev"]
    tol = EXACT if dtype == np.float64 else {"rtol": 1e-5, "atol": 1e-6}
    assert_close(grad.d_x, public.x, **tol)
    assert_close(grad.d_h_prev, public.h_prev, **tol)
    assert_close(np.concatenate([x, h_prev], 1).T @ grad.d_r_bar_u_bar, public.w_ru, **tol)
    assert_close(np.concatenate([x, out.r * h_prev], 1).T @ grad.d_c_bar, public.w_c, **tol)
    assert_close(grad.d_r_bar_u_bar.sum(0), public.b_ru, **tol)
    assert_close(grad.d_c_bar.sum(0), public.b_c, **tol)


def test_cell_grads_pass_the_oracle_without_clipping(rng):
    """Composed like TF's Python gradients, the mirrors' gradients are the true ones when no
    clip is active (float64, against finite differences)."""
    case = lstm_cell_case(rng, peephole=True)
    n_in = case["x"].shape[1]

    def forward(x, cs_prev, h_prev, w, wci, wcf, wco, b):
        out = tc.lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0,
                                 use_peephole=True)
        return out.cs, out.h

    def vjp(ct, x, cs_prev, h_prev, w, wci, wcf, wco, b):
        out = tc.lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0,
                                 use_peephole=True)
        g = tc.lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, *out[:6], *ct,
                                    True)
        xh_grad = g.dicfo @ w.T
        return (xh_grad[:, :n_in], g.cs_prev_grad, xh_grad[:, n_in:],
                np.concatenate([x, h_prev], 1).T @ g.dicfo, g.wci_grad, g.wcf_grad, g.wco_grad,
                g.dicfo.sum(0))

    gc.check_vjp(forward, vjp, cell_args(case, True)).raise_if_failed()

    gru = gru_cell_case(rng)
    gru_args = [gru[k] for k in ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")]

    def gru_vjp(d_h, x, h_prev, w_ru, w_c, b_ru, b_c):
        out = tc.gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c)
        g = tc.gru_block_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, out.r, out.u, out.c, d_h)
        return (g.d_x, g.d_h_prev, np.concatenate([x, h_prev], 1).T @ g.d_r_bar_u_bar,
                np.concatenate([x, out.r * h_prev], 1).T @ g.d_c_bar,
                g.d_r_bar_u_bar.sum(0), g.d_c_bar.sum(0))

    gc.check_vjp(lambda *a: tc.gru_block_cell(*a).h, gru_vjp, gru_args).raise_if_failed()


# -- sequences ------------------------------------------------------------------------------------


def test_block_lstm_is_a_loop_over_lstm_block_cell(rng):
    case = lstm_sequence_case(rng, steps=4, peephole=True)
    x, cs, h, w, wci, wcf, wco, b = sequence_args(case, True)
    out = tc.block_lstm(4, x, cs, h, w, wci, wcf, wco, b, cell_clip=0.5, use_peephole=True)
    assert isinstance(out, tc.BlockLSTMOutput) and out._fields == STEP_FIELDS
    for t in range(4):
        step = tc.lstm_block_cell(x[t], cs, h, w, wci, wcf, wco, b, cell_clip=0.5,
                                  use_peephole=True)
        for k in STEP_FIELDS:
            assert_close(getattr(out, k)[t], getattr(step, k))
        cs, h = step.cs, step.h


@pytest.mark.parametrize("seq_len_max", [0, 1, 3])
def test_block_lstm_is_zero_past_seq_len_max(rng, seq_len_max):
    """TF zeroes cs and h past seq_len_max and leaves i, f, o, ci, co uninitialised
    (docs/spec.md §6 fault 8): gradcells returns zeros for all seven."""
    case = lstm_sequence_case(rng, steps=5, peephole=True)
    args = sequence_args(case, True)
    full = tc.block_lstm(5, *args, use_peephole=True)
    short = tc.block_lstm(seq_len_max, *args, use_peephole=True)
    for k in STEP_FIELDS:
        assert_close(getattr(short, k)[:seq_len_max], getattr(full, k)[:seq_len_max])
        assert not getattr(short, k)[seq_len_max:].any(), k


@pytest.mark.parametrize("use_peephole", [False, True])
def test_block_lstm_grad_is_the_straight_through_bptt(rng, use_peephole):
    case = lstm_sequence_case(rng, steps=4, peephole=use_peephole, clip=True, forget_bias=0.5)
    args = sequence_args(case, use_peephole)
    clip = case["cell_clip"]
    out = tc.block_lstm(4, *args, forget_bias=0.5, cell_clip=clip or 0.0,
                        use_peephole=use_peephole)
    d_cs, d_h = upstream(rng, out.h.shape)
    grad = tc.block_lstm_grad(4, *args, *out, d_cs, d_h, use_peephole)
    assert isinstance(grad, tc.BlockLSTMGradOutput)
    peeps = {k: case[k] for k in PEEPHOLES} if use_peephole else {}
    seq = gc.lstm_sequence(case["x"], case["cs0"], case["h0"], case["w"], case["b"], **peeps,
                           forget_bias=0.5, cell_clip=clip)
    public = gc.lstm_sequence_grad(case["x"], case["cs0"], case["h0"], case["w"], case["b"],
                                   seq, d_h=d_h, d_cs=d_cs, **peeps, cell_clip=clip,
                                   clip_grad="straight_through")
    for mine, theirs in ((grad.x_grad, public.x), (grad.cs_prev_grad, public.cs0),
                         (grad.h_prev_grad, public.h0), (grad.w_grad, public.w),
                         (grad.b_grad, public.b)):
        assert_close(mine, theirs)
    for k, g in zip(PEEPHOLES, grad[4:7], strict=True):
        if use_peephole:
            assert_close(g, getattr(public, k))
        else:
            assert g.shape == case["h0"].shape[1:] and not g.any()


def test_block_lstm_grad_ignores_steps_past_seq_len_max(rng):
    """Past seq_len_max TF's saved outputs hold garbage: the gradient never reads them (not
    even NaN or inf), ignores the upstream gradients there, and equals the gradient of the
    truncated sequence; x_grad is zero there. The inputs are not modified."""
    case = lstm_sequence_case(rng, steps=5, peephole=True)
    args = sequence_args(case, True)
    out = tc.block_lstm(3, *args, use_peephole=True)
    d_cs, d_h = upstream(rng, out.h.shape)
    garbage = [a.copy() for a in (*out, d_cs, d_h)]
    for k, a in enumerate(garbage):
        a[3:] = (np.nan, np.inf, -3.7e36)[k % 3]
    before = [a.copy() for a in garbage]
    grad = tc.block_lstm_grad(3, *args, *garbage, True)
    for a, b in zip(garbage, before, strict=True):
        np.testing.assert_array_equal(a, b)

    truncated = [a[:3] for a in (*out, d_cs, d_h)]
    short = tc.block_lstm_grad(3, case["x"][:3], *args[1:], *truncated, True)
    assert np.isfinite(grad.x_grad).all() and not grad.x_grad[3:].any()
    assert_close(grad.x_grad[:3], short.x_grad)
    for g, s in zip(grad[1:], short[1:], strict=True):
        assert_close(g, s)


def test_block_lstm_v2_is_block_lstm_in_keras_gate_order(rng):
    """V2: columns i, f, ci, o, no forget bias, cell_clip default 0 (no clipping); its
    gradient returns w_grad and b_grad in the same order."""
    case = lstm_sequence_case(rng, steps=3, peephole=True)
    x, cs, h, w, wci, wcf, wco, b = sequence_args(case, True)
    w_v2, b_v2 = swap_ci_f(w), swap_ci_f(b)
    v2 = tc.block_lstm_v2(3, x, cs, h, w_v2, wci, wcf, wco, b_v2, use_peephole=True)
    v1 = tc.block_lstm(3, x, cs, h, w, wci, wcf, wco, b, forget_bias=0.0, cell_clip=0.0,
                       use_peephole=True)
    for k in STEP_FIELDS:
        np.testing.assert_array_equal(getattr(v2, k), getattr(v1, k))
    d_cs, d_h = upstream(rng, v1.h.shape)
    g2 = tc.block_lstm_grad_v2(3, x, cs, h, w_v2, wci, wcf, wco, b_v2, *v2, d_cs, d_h, True)
    g1 = tc.block_lstm_grad(3, x, cs, h, w, wci, wcf, wco, b, *v1, d_cs, d_h, True)
    assert_close(g2.w_grad, swap_ci_f(g1.w_grad))
    assert_close(g2.b_grad, swap_ci_f(g1.b_grad))
    for k in ("x_grad", "cs_prev_grad", "h_prev_grad", "wci_grad", "wcf_grad", "wco_grad"):
        assert_close(getattr(g2, k), getattr(g1, k))


@pytest.mark.parametrize("seq_len_max", [3, 1])
def test_block_lstm_grad_v2_passes_the_oracle(rng, seq_len_max):
    """Without clipping (V2's default) the V2 gradient is the true one (float64)."""
    case = lstm_sequence_case(rng, steps=3, peephole=True)
    x, cs, h, w, wci, wcf, wco, b = sequence_args(case, True)
    w, b = swap_ci_f(w), swap_ci_f(b)

    def forward(*a):
        out = tc.block_lstm_v2(seq_len_max, *a, use_peephole=True)
        return out.cs, out.h

    def vjp(ct, *a):
        g = tc.block_lstm_grad_v2(seq_len_max, *a, *forward_all(*a), *ct, True)
        return g.x_grad, g.cs_prev_grad, g.h_prev_grad, g.w_grad, *g[4:]

    def forward_all(*a):
        return tc.block_lstm_v2(seq_len_max, *a, use_peephole=True)

    gc.check_vjp(forward, vjp, [x, cs, h, w, wci, wcf, wco, b]).raise_if_failed()


@pytest.mark.parametrize("steps, batch, input_size", [(0, 2, 3), (3, 0, 3), (3, 2, 0)])
def test_empty_sizes_are_valid(rng, steps, batch, input_size):
    """T = 0 (seq_len_max 0), B = 0 and I = 0 work (docs/spec.md §7 lists an empty batch among the
    inputs that crash TF's BlockLSTMGrad; TF 2.21 returns empty results there, as the mirror
    does)."""
    hidden = 3
    x = rng.standard_normal((steps, batch, input_size))
    cs, h = rng.standard_normal((batch, hidden)), rng.standard_normal((batch, hidden))
    w, b = rng.standard_normal((input_size + hidden, 4 * hidden)), np.zeros(4 * hidden)
    p = np.zeros(hidden)
    out = tc.block_lstm(steps, x, cs, h, w, p, p, p, b)
    assert all(a.shape == (steps, batch, hidden) for a in out)
    d = np.ones((steps, batch, hidden))
    grad = tc.block_lstm_grad(steps, x, cs, h, w, p, p, p, b, *out, d, d, False)
    assert grad.x_grad.shape == x.shape and grad.w_grad.shape == w.shape
    assert grad.cs_prev_grad.shape == cs.shape and grad.b_grad.shape == b.shape
    if steps == 0 or batch == 0:
        assert not grad.w_grad.any() and not grad.b_grad.any()


# -- bad input ------------------------------------------------------------------------------------


@pytest.fixture
def seq_case(rng):
    case = lstm_sequence_case(rng, steps=3, batch=2, input_size=3, hidden=4)
    args = sequence_args(case, False)
    out = tc.block_lstm(3, *args)
    return args, out


@pytest.mark.parametrize("op", ["block_lstm", "block_lstm_v2", "block_lstm_grad",
                                "block_lstm_grad_v2"])
@pytest.mark.parametrize("seq_len_max, error, pattern", [
    (4, ValueError, r"seq_len_max must be in \[0, T\] = \[0, 3\], got 4"),
    (-1, ValueError, r"seq_len_max must be in \[0, T\], got -1"),
    (2.0, TypeError, "seq_len_max must be an integer"),
    (True, TypeError, "seq_len_max must be an integer, got bool"),
    (np.array([2]), TypeError, r"seq_len_max must be an integer .*shape \(1,\)"),
    (np.array(2.0), TypeError, "seq_len_max must be an integer"),
    (None, TypeError, "seq_len_max must be an integer"),
])
def test_bad_seq_len_max_raises(seq_case, op, seq_len_max, error, pattern):
    """TensorFlow aborts the process on seq_len_max above T or negative; the mirrors raise."""
    args, out = seq_case
    extra = [*out, np.ones_like(out.h), np.ones_like(out.h), False] if "grad" in op else []
    with pytest.raises(error, match=pattern):
        getattr(tc, op)(seq_len_max, *args, *extra)


def test_seq_len_max_integer_spellings(seq_case):
    args, _ = seq_case
    expected = tc.block_lstm(2, *args)
    for spelling in (np.int64(2), np.int32(2), np.array(2), np.uint8(2)):
        np.testing.assert_array_equal(tc.block_lstm(spelling, *args).h, expected.h)


def test_errors_name_tensorflows_arguments(rng, seq_case):
    case = lstm_cell_case(rng, batch=2, hidden=4)
    args = cell_args(case, False)
    out = tc.lstm_block_cell(*args)
    good = np.ones((2, 4))
    with pytest.raises(ValueError, match=r"^h_grad must have shape \[B, H\] = \(2, 4\), got"):
        tc.lstm_block_cell_grad(*args, *out[:6], good, np.ones((2, 5)), False)
    with pytest.raises(ValueError, match=r"^cs_grad must have shape"):
        tc.lstm_block_cell_grad(*args, *out[:6], np.ones((3, 4)), good, False)
    with pytest.raises(ValueError, match=r"^ci must have shape \[B, H\]"):
        tc.lstm_block_cell_grad(*args, *out[:4], np.ones((2, 1)), out.co, good, good, False)
    with pytest.raises(TypeError, match=r"^co must have the same dtype as x"):
        tc.lstm_block_cell_grad(*args, *out[:5], out.co.astype(np.float32), good, good, False)

    gru = gru_cell_case(rng, batch=2, hidden=4)
    gru_args = [gru[k] for k in ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")]
    r, u, c, _ = tc.gru_block_cell(*gru_args)
    with pytest.raises(ValueError, match=r"^u must have shape \[B, H\]"):
        tc.gru_block_cell_grad(*gru_args, r, u[:1], c, good)

    seq_args, seq = seq_case
    ones = np.ones_like(seq.h)
    with pytest.raises(ValueError, match=r"^cs_prev must have shape \[B, H\]"):
        tc.block_lstm(3, seq_args[0], seq_args[1][:1], *seq_args[2:])
    with pytest.raises(ValueError, match=r"^h_prev must have shape \[B, H\]"):
        tc.block_lstm_grad(3, *seq_args[:2], seq_args[2][:, :2], *seq_args[3:], *seq, ones,
                           ones, False)
    with pytest.raises(ValueError, match=r"^f must have shape \[T, B, H\] = \(3, 2, 4\)"):
        tc.block_lstm_grad(3, *seq_args, *seq[:2], seq.f[:, :1], *seq[3:], ones, ones, False)
    with pytest.raises(ValueError, match=r"^h_grad must have shape \[T, B, H\]"):
        tc.block_lstm_grad_v2(3, *seq_args, *seq, ones, ones[:2], False)
    with pytest.raises(ValueError, match=r"^x must be a 3-D array"):
        tc.block_lstm(1, seq_args[0][0], *seq_args[1:])


@pytest.mark.parametrize("use_peephole", [1, "yes", np.array([True])])
def test_use_peephole_must_be_a_bool(rng, use_peephole):
    case = lstm_cell_case(rng)
    with pytest.raises(TypeError, match="use_peephole must be a bool"):
        tc.lstm_block_cell(*cell_args(case, False), use_peephole=use_peephole)


def test_used_peepholes_are_validated(rng):
    case = lstm_cell_case(rng, hidden=4)
    x, cs, h, w, _, _, _, b = cell_args(case, False)
    p = np.zeros(4)
    with pytest.raises(ValueError, match=r"wcf must have shape \[H\] = \(4,\), got \(0,\)"):
        tc.lstm_block_cell(x, cs, h, w, p, np.zeros(0), p, b, use_peephole=True)
    for missing in range(3):
        peeps = [p, p, p]
        peeps[missing] = None
        with pytest.raises(TypeError, match=f"{PEEPHOLES[missing]} must be an array \\[H\\] "
                                            "when use_peephole=True, got None"):
            tc.lstm_block_cell(x, cs, h, w, *peeps, b, use_peephole=True)
    with pytest.raises(TypeError, match="wci must be an array"):
        tc.block_lstm(1, x[None], cs, h, w, None, None, None, b, use_peephole=True)


@pytest.mark.parametrize("bad, error, message", [
    ("junk", TypeError, "wcf must be an array \\[H\\] or None, got str"),
    (np.zeros((3, 3)), ValueError, r"wcf must be a 1-D array \[H\] \(TF checks its rank even "
                                   r"when use_peephole=False\), got shape \(3, 3\)"),
    (np.zeros(5, np.int8), TypeError, r"wcf must have the same dtype as x \(float64\), got int8"),
])
@pytest.mark.parametrize("op", ["lstm_block_cell", "lstm_block_cell_grad", "block_lstm",
                                "block_lstm_grad"])
def test_unused_peepholes_must_still_be_vectors(rng, bad, error, message, op):
    """TF checks the rank of the peephole inputs even when they are unused (its
    LSTMBlockCellGrad aborts the process on a matrix); the mirrors raise."""
    case = lstm_cell_case(rng, hidden=5)
    x, cs, h, w, wci, _, wco, b = cell_args(case, False)
    call = {
        "lstm_block_cell": lambda: tc.lstm_block_cell(x, cs, h, w, wci, bad, wco, b),
        "lstm_block_cell_grad": lambda: tc.lstm_block_cell_grad(
            x, cs, h, w, wci, bad, wco, b, *([cs] * 6), cs, h, False),
        "block_lstm": lambda: tc.block_lstm(1, x[None], cs, h, w, wci, bad, wco, b),
        "block_lstm_grad": lambda: tc.block_lstm_grad(
            1, x[None], cs, h, w, wci, bad, wco, b, *([cs[None]] * 7), cs[None], h[None],
            False),
    }[op]
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("attr, value, error", [
    ("cell_clip", float("nan"), ValueError), ("cell_clip", "3", TypeError),
    ("forget_bias", float("inf"), ValueError),
])
def test_bad_attributes(rng, attr, value, error):
    case = lstm_cell_case(rng)
    with pytest.raises(error, match=attr):
        tc.lstm_block_cell(*cell_args(case, False), **{attr: value})
    seq = lstm_sequence_case(rng, steps=2)
    with pytest.raises(error, match=attr):
        tc.block_lstm(2, *sequence_args(seq, False), **{attr: value})


def test_float16_and_float64_are_accepted(rng):
    """TF takes float16/float32, gradcells float32/float64 and NumPy float16 computed in
    float32 (docs/spec.md §6 fault 10, §16.4): a float16 mirror call is the float32 call
    rounded."""
    case = lstm_cell_case(rng, dtype=np.float16)
    args = [*cell_args(case, False)[:4], *[np.zeros(5, np.float16)] * 3, case["b"]]
    half = tc.lstm_block_cell(*args)
    single = tc.lstm_block_cell(*(a.astype(np.float32) for a in args))
    for a, b in zip(half, single, strict=True):
        assert a.dtype == np.float16
        np.testing.assert_array_equal(a, b.astype(np.float16))
    case = lstm_cell_case(rng, dtype=np.float64)
    assert tc.lstm_block_cell(*cell_args(case, False)).h.dtype == np.float64


def test_mirrors_do_not_modify_inputs(rng):
    case = lstm_sequence_case(rng, steps=3, peephole=True)
    args = sequence_args(case, True)
    out = tc.block_lstm(2, *args, use_peephole=True)
    d = upstream(rng, out.h.shape)
    everything = [*args, *out, *d]
    before = [a.copy() for a in everything]
    tc.block_lstm_grad(2, *args, *out, *d, True)
    tc.block_lstm_grad_v2(2, *args, *out, *d, True)
    tc.block_lstm_v2(2, *args, use_peephole=True)
    tc.lstm_block_cell_grad(args[0][0], *args[1:], *(a[0] for a in out[:6]), d[0][0], d[1][0],
                            True)
    for a, b in zip(everything, before, strict=True):
        np.testing.assert_array_equal(a, b)
