"""The known faults of TensorFlow's fused recurrent ops (docs/spec.md §6, docs/faults.md), one
test each: TensorFlow (or the seed's code, re-enacted with ``tf.raw_ops``) shown wrong,
against the oracle where the fault is a gradient, and gradcells shown right. Tests that need
TensorFlow skip without it.

Fault 7 (on GPU, ``LSTMBlockCellGrad`` adds the peephole term to ``cs_prev_grad`` twice) needs
TensorFlow's CUDA kernels and has no test here: the conformance extra installs
``tensorflow-cpu``.

The oracle compares a claimed vector-Jacobian product with central differences of the
forward in float64. TensorFlow's ops take no float64 (fault 10), so their gradients are
judged against the float64 forward at float32 tolerance (the oracle's default for float32
gradients); the forwards agree to float32 round-off (``test_conformance_tf.py``).
"""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import gradcells as gc
from gradcells import tf_compat as tc
from gradcells.audit.faults import FAULTS
from gradcells.audit.tensorflow import KEPT_GRU, KEPT_LSTM
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import gru_cell_case, lstm_cell_case, lstm_sequence_case, vjp_check

LSTM_ARGS = ("x", "cs_prev", "h_prev", "w", "b")
GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
STEP_FIELDS = ("i", "cs", "f", "o", "ci", "co", "h")
F32 = {"rtol": 2e-6, "atol": 2e-6}  # float32 round-off, as in test_conformance_tf.py


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def swap_ci_f(a):
    """Blocks i, f, ci, o <-> i, ci, f, o on the last axis."""
    i, first, second, o = np.split(a, 4, axis=-1)
    return np.concatenate([i, second, first, o], axis=-1)


def f32(a):
    return np.asarray(a, dtype=np.float32)


def lstm_forward(case, peephole=False, cell_clip=None):
    """``f`` for the oracle: the LSTM cell's ``(cs, h)`` from its arrays, in gradcells order
    ``x, cs_prev, h_prev, w, b[, wci, wcf, wco]``, with the case's attributes."""
    def f(*arrays):
        peeps = dict(zip(PEEPHOLES, arrays[5:], strict=True)) if peephole else {}
        state = gc.lstm_cell(*arrays[:5], **peeps, forget_bias=case["forget_bias"],
                             cell_clip=cell_clip)
        return state.cs, state.h
    return f


TF_LSTM_INPUTS = ("x", "cs_prev", "h_prev", "w", *PEEPHOLES, "b")


def tf_lstm_inputs(tf, arrays, peephole):
    """The op's input list ``x, cs_prev, h_prev, w, wci, wcf, wco, b`` (float32 tensors)."""
    x, cs_prev, h_prev, w, b, *peeps = (tf.constant(f32(a)) for a in arrays)
    if not peephole:
        peeps = [tf.zeros(cs_prev.shape[1])] * 3
    return [x, cs_prev, h_prev, w, *peeps, b]


def tf_lstm_cell(tf, arrays, peephole=False, **attrs):
    """TF's LSTMBlockCell on gradcells-ordered arrays (keyword arguments only, as raw ops are)."""
    inputs = tf_lstm_inputs(tf, arrays, peephole)
    return tf.raw_ops.LSTMBlockCell(**dict(zip(TF_LSTM_INPUTS, inputs, strict=True)), **attrs,
                                    use_peephole=peephole)


def seed_lstm_block_cell_grad(tf, op_inputs, op_outputs, grad, use_peephole, *,
                              seed_naming=True):
    """The seed's ``_LSTMBlockCellGrad`` line for line, with ``tf.raw_ops`` for
    ``gen_lstm_ops`` and TF2's shape access. ``seed_naming=False`` names ``op.inputs`` in the
    op's real order (x, cs_prev, h_prev, w, wci, wcf, wco, b) instead of the seed's."""
    if seed_naming:
        (x, cs_prev, h_prev, w, wci, wco, wcf, b) = op_inputs  # the seed's line
    else:
        (x, cs_prev, h_prev, w, wci, wcf, wco, b) = op_inputs
    (i, cs, f, o, ci, co, _) = op_outputs
    (_, cs_grad, _, _, _, _, h_grad) = grad
    batch_size, input_size = x.shape
    cell_size = cs_prev.shape[1]
    (cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad) = tf.raw_ops.LSTMBlockCellGrad(
        x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b, i=i, cs=cs,
        f=f, o=o, ci=ci, co=co, cs_grad=cs_grad, h_grad=h_grad, use_peephole=use_peephole)
    xh_grad = tf.matmul(dicfo, w, transpose_b=True)
    x_grad = tf.slice(xh_grad, (0, 0), (batch_size, input_size))
    h_prev_grad = tf.slice(xh_grad, (0, input_size), (batch_size, cell_size))
    xh = tf.concat([x, h_prev], 1)
    w_grad = tf.matmul(xh, dicfo, transpose_a=True)
    b_grad = tf.raw_ops.BiasAddGrad(out_backprop=dicfo)
    return (x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)


def tf_lstm_vjp(tf, case, peephole, cell_clip, seed_naming=True):
    """A claimed vjp for ``lstm_forward``: TF's forward op, then the seed's gradient."""
    def vjp(ct, *arrays):
        ct_cs, ct_h = (tf.constant(f32(c)) for c in ct)
        inputs = tf_lstm_inputs(tf, arrays, peephole)
        outputs = tf.raw_ops.LSTMBlockCell(**dict(zip(TF_LSTM_INPUTS, inputs, strict=True)),
                                           forget_bias=case["forget_bias"],
                                           cell_clip=cell_clip or 0.0, use_peephole=peephole)
        zeros = tf.zeros_like(ct_h)
        grads = seed_lstm_block_cell_grad(tf, inputs, outputs,
                                          (zeros, ct_cs, zeros, zeros, zeros, zeros, ct_h),
                                          peephole, seed_naming=seed_naming)
        x, cs_prev, h_prev, w, wci, wcf, wco, b = (g.numpy() for g in grads)
        return (x, cs_prev, h_prev, w, b) + ((wci, wcf, wco) if peephole else ())
    return vjp


def failing(report):
    return {c.name for c in report.checks if not c.passed}


# -- 1. gate order --------------------------------------------------------------------------------


def test_fault_1_gate_order_is_i_ci_f_o(tf, rng):
    """TF's docs give the blocks of w and b as i, f, ci, o; its kernel uses i, ci, f, o."""
    assert "[i, f, ci, o] = xh * w + b" in tf.raw_ops.LSTMBlockCell.__doc__
    case = lstm_cell_case(rng, batch=3, hidden=4, dtype=np.float32, scale=2.0)
    arrays = [case[k] for k in LSTM_ARGS]
    theirs = tf_lstm_cell(tf, arrays, cell_clip=0.0)
    kernel_order = gc.lstm_cell(*arrays)
    as_documented = gc.lstm_cell(case["x"], case["cs_prev"], case["h_prev"],
                                 swap_ci_f(case["w"]), swap_ci_f(case["b"]))
    for k, t in zip(STEP_FIELDS, theirs, strict=True):
        np.testing.assert_allclose(getattr(kernel_order, k), t.numpy(), **F32, err_msg=k)
    assert not np.allclose(as_documented.h, theirs.h.numpy(), atol=1e-3)


# -- 2. the default cell_clip=3.0 -----------------------------------------------------------------


def test_fault_2_default_cell_clip_silently_clips(tf, rng):
    """Called with its defaults, TF's op clips the cell state to [-3, 3]: on large states
    it differs from the unclipped LSTM, and equals a clip at 3. ``tf_compat`` mirrors the
    default; the public API clips only when asked."""
    case = lstm_cell_case(rng, batch=4, hidden=6, dtype=np.float32)
    case["cs_prev"] = f32(6.0 * case["cs_prev"])
    arrays = [case[k] for k in LSTM_ARGS]
    theirs = [t.numpy() for t in tf_lstm_cell(tf, arrays)]  # TF's defaults
    unclipped = gc.lstm_cell(*arrays)
    assert np.abs(unclipped.cs).max() > 3.5
    assert np.abs(theirs[1]).max() == np.float32(3.0)
    assert not np.allclose(theirs[6], unclipped.h, atol=1e-3)
    clipped = gc.lstm_cell(*arrays, cell_clip=3.0)
    mirror = tc.lstm_block_cell(*arrays[:4], *[np.zeros(6, np.float32)] * 3, arrays[4])
    for k, t in zip(STEP_FIELDS, theirs, strict=True):
        np.testing.assert_allclose(getattr(clipped, k), t, **F32, err_msg=k)
        np.testing.assert_allclose(getattr(mirror, k), t, **F32, err_msg=k)


# -- 3. the straight-through clip gradient --------------------------------------------------------


def test_fault_3_clip_gradient_is_straight_through(tf, rng):
    """Where the clip is active TF's gradient (op + the seed's Python) disagrees with finite
    differences; gradcells's exact gradient agrees. With the clip off TF's agrees too, so
    the clip is the fault."""
    case = lstm_cell_case(rng, batch=4, hidden=5, clip=True)
    clip = case["cell_clip"]
    assert clip is not None
    arrays = [case[k] for k in LSTM_ARGS]
    theirs = gc.check_vjp(lstm_forward(case, cell_clip=clip),
                          tf_lstm_vjp(tf, case, False, clip), arrays, names=LSTM_ARGS)
    assert not theirs.passed
    assert "cs_prev" in failing(theirs)
    ours = gc.check_vjp(
        lstm_forward(case, cell_clip=clip),
        lambda ct, *a: gc.lstm_cell_grad(*a, gc.lstm_cell(*a, forget_bias=case["forget_bias"],
                                                          cell_clip=clip),
                                         d_cs=ct[0], d_h=ct[1], cell_clip=clip)[:5],
        arrays, names=LSTM_ARGS)
    ours.raise_if_failed()
    gc.check_vjp(lstm_forward(case), tf_lstm_vjp(tf, case, False, None), arrays,
                 names=LSTM_ARGS).raise_if_failed()


# -- 4. the seed's wcf/wco swap -------------------------------------------------------------------


def test_fault_4_seed_swaps_wcf_and_wco(tf, rng):
    """The seed names ``op.inputs`` (x, cs_prev, h_prev, w, wci, wco, wcf, b) and passes them
    on as (wci, wcf, wco): the op sees wcf and wco swapped and every gradient through the
    cell state is wrong; only wco's (Σ do∘cs, which reads neither vector) survives. Named in
    the op's real order, the same code passes."""
    case = lstm_cell_case(rng, batch=4, hidden=5, peephole=True)
    names = LSTM_ARGS + PEEPHOLES
    arrays = [case[k] for k in names]
    forward = lstm_forward(case, peephole=True)
    seed = gc.check_vjp(forward, tf_lstm_vjp(tf, case, True, None), arrays, names=names)
    assert not seed.passed
    assert failing(seed) == set(names) - {"wco"}
    gc.check_vjp(forward, tf_lstm_vjp(tf, case, True, None, seed_naming=False), arrays,
                 names=names).raise_if_failed()
    vjp_check("lstm_cell", case).raise_if_failed()


# -- 5. the seed's GRU docstring ------------------------------------------------------------------


def docstring_gru_grad(errors):
    """The seed's ``_GRUBlockCellGrad`` docstring written as code, with the chosen subset of
    its three errors: "+u" (``+ u`` for ``+ d_h∘u``), "h-c" (``(h - c)`` for
    ``(h_prev - c)``) and "swap" (the d_w_ru and d_w_c formulas exchanged). The docstring
    gives no formula for d_r_bar; the kernel's is used."""
    def vjp(d_h, x, h_prev, w_ru, w_c, b_ru, b_c):
        r, u, c, h = gc.gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c)
        n_in = x.shape[1]
        d_c_bar = d_h * (1 - u) * (1 - c * c)
        d_u_bar = d_h * ((h if "h-c" in errors else h_prev) - c) * u * (1 - u)
        d_xh_r = d_c_bar @ w_c.T
        d_x_component_2, d_h_prevr = d_xh_r[:, :n_in], d_xh_r[:, n_in:]
        d_r_bar = d_h_prevr * h_prev * r * (1 - r)
        d_r_bar_u_bar = np.concatenate([d_r_bar, d_u_bar], 1)
        d_xh_1 = d_r_bar_u_bar @ w_ru.T
        d_x = d_xh_1[:, :n_in] + d_x_component_2
        d_h_prev = d_xh_1[:, n_in:] + d_h_prevr * r + (u if "+u" in errors else d_h * u)
        x_h_prev = np.concatenate([x, h_prev], 1)
        x_h_prevr = np.concatenate([x, h_prev * r], 1)
        if "swap" in errors:
            d_w_ru, d_w_c = x_h_prevr.T @ d_c_bar, x_h_prev.T @ d_r_bar_u_bar
        else:
            d_w_ru, d_w_c = x_h_prev.T @ d_r_bar_u_bar, x_h_prevr.T @ d_c_bar
        return d_x, d_h_prev, d_w_ru, d_w_c, d_r_bar_u_bar.sum(0), d_c_bar.sum(0)
    return vjp


def gru_h(*arrays):
    return gc.gru_cell(*arrays).h


@pytest.mark.parametrize("errors, wrong", [
    (("+u",), {"h_prev"}),
    (("h-c",), {"x", "h_prev", "w_ru", "b_ru"}),
])
def test_fault_5_gru_docstring_formulas_fail_the_oracle(rng, errors, wrong):
    case = gru_cell_case(rng, batch=4, hidden=5)
    arrays = [case[k] for k in GRU_ARGS]
    report = gc.check_vjp(gru_h, docstring_gru_grad(errors), arrays, names=GRU_ARGS)
    assert failing(report) == wrong
    gc.check_vjp(gru_h, docstring_gru_grad(()), arrays, names=GRU_ARGS).raise_if_failed()


@pytest.mark.parametrize("errors", [("swap",), ("+u", "h-c", "swap")])
def test_fault_5_gru_docstring_weight_gradients_are_swapped(rng, errors):
    """d_w_ru = x_h_prevrᵀ·d_c_bar has the shape of w_c, not w_ru: the oracle refuses it.
    ("+u", "h-c", "swap") is the docstring exactly as written."""
    case = gru_cell_case(rng, batch=4, hidden=5)
    arrays = [case[k] for k in GRU_ARGS]
    with pytest.raises(ValueError, match=r"the gradient for w_ru has shape \(9, 5\), "
                                         r"expected \(9, 10\)"):
        gc.check_vjp(gru_h, docstring_gru_grad(errors), arrays, names=GRU_ARGS)


def seed_gru_block_cell_grad(tf, op_inputs, grad):
    """The seed's ``_GRUBlockCellGrad`` code, with ``tf.raw_ops`` for ``gen_gru_ops``, given
    the upstream gradient of every output ``(r, u, c, h)``."""
    x, h_prev, w_ru, w_c, b_ru, b_c = op_inputs
    r, u, c, _ = tf.raw_ops.GRUBlockCell(x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru,
                                         b_c=b_c)
    _, _, _, d_h = grad                                         # the seed's line
    d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = tf.raw_ops.GRUBlockCellGrad(
        x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c, r=r, u=u, c=c, d_h=d_h)
    x_h_prev = tf.concat([x, h_prev], 1)
    d_w_ru = tf.matmul(x_h_prev, d_r_bar_u_bar, transpose_a=True)
    d_b_ru = tf.raw_ops.BiasAddGrad(out_backprop=d_r_bar_u_bar)
    x_h_prevr = tf.concat([x, h_prev * r], 1)
    d_w_c = tf.matmul(x_h_prevr, d_c_bar, transpose_a=True)
    d_b_c = tf.raw_ops.BiasAddGrad(out_backprop=d_c_bar)
    return [d_x, d_h_prev, d_w_ru, d_w_c, d_b_ru, d_b_c]


def test_fault_5_gru_seed_code_is_right(tf, rng):
    """The seed's ``_GRUBlockCellGrad`` code (TF's op, then its Python weight gradients)
    passes the oracle, and so does gradcells."""
    case = gru_cell_case(rng, batch=4, hidden=5)
    arrays = [case[k] for k in GRU_ARGS]

    def seed_vjp(d_h, *a):
        inputs = [tf.constant(f32(v)) for v in a]
        grads = seed_gru_block_cell_grad(tf, inputs, (None, None, None, tf.constant(f32(d_h))))
        return [g.numpy() for g in grads]

    gc.check_vjp(gru_h, seed_vjp, arrays, names=GRU_ARGS).raise_if_failed()
    vjp_check("gru_cell", case).raise_if_failed()


# -- 6. BlockLSTMV2's registered gradient ---------------------------------------------------------


def test_fault_6_block_lstm_v2_registered_gradient_is_wrong(tf, rng):
    """``tf.GradientTape`` through BlockLSTMV2 runs the V1 gradient op, whose gate order
    differs: it fails the oracle. TF's own BlockLSTMGradV2 op and ``tf_compat``'s mirror of
    it pass (no clipping: V2's default)."""
    case = lstm_sequence_case(rng, steps=3, batch=2, input_size=3, hidden=4)
    steps, hidden = 3, 4
    arrays = [case["x"], case["cs0"], case["h0"], swap_ci_f(case["w"]), swap_ci_f(case["b"])]
    names = ("x", "cs_prev", "h_prev", "w", "b")
    zeros = np.zeros(hidden)

    def forward(x, cs_prev, h_prev, w, b):
        out = tc.block_lstm_v2(steps, x, cs_prev, h_prev, w, zeros, zeros, zeros, b)
        return out.cs, out.h

    def tape_vjp(ct, *a):
        inputs = [tf.constant(f32(v)) for v in a]
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            x, cs_prev, h_prev, w, b = inputs
            p = tf.zeros(hidden)
            out = tf.raw_ops.BlockLSTMV2(seq_len_max=np.int64(steps), x=x, cs_prev=cs_prev,
                                         h_prev=h_prev, w=w, wci=p, wcf=p, wco=p, b=b)
            loss = tf.reduce_sum(f32(ct[0]) * out.cs) + tf.reduce_sum(f32(ct[1]) * out.h)
        return [g.numpy() for g in tape.gradient(loss, inputs)]

    def tf_op_vjp(ct, *a):
        x, cs_prev, h_prev, w, b = (f32(v) for v in a)
        p = np.zeros(hidden, np.float32)
        out = tf.raw_ops.BlockLSTMV2(seq_len_max=np.int64(steps), x=x, cs_prev=cs_prev,
                                     h_prev=h_prev, w=w, wci=p, wcf=p, wco=p, b=b)
        g = tf.raw_ops.BlockLSTMGradV2(
            seq_len_max=np.int64(steps), x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=p,
            wcf=p, wco=p, b=b, **{k: t for k, t in zip(STEP_FIELDS, out, strict=True)},
            cs_grad=f32(ct[0]), h_grad=f32(ct[1]), use_peephole=False)
        return [t.numpy() for t in (g.x_grad, g.cs_prev_grad, g.h_prev_grad, g.w_grad,
                                    g.b_grad)]

    def mirror_vjp(ct, x, cs_prev, h_prev, w, b):
        out = tc.block_lstm_v2(steps, x, cs_prev, h_prev, w, zeros, zeros, zeros, b)
        g = tc.block_lstm_grad_v2(steps, x, cs_prev, h_prev, w, zeros, zeros, zeros, b, *out,
                                  ct[0], ct[1], False)
        return g.x_grad, g.cs_prev_grad, g.h_prev_grad, g.w_grad, g.b_grad

    tape = gc.check_vjp(forward, tape_vjp, arrays, names=names)
    assert not tape.passed
    assert {"x", "h_prev", "w", "b"} <= failing(tape)
    gc.check_vjp(forward, tf_op_vjp, arrays, names=names).raise_if_failed()
    gc.check_vjp(forward, mirror_vjp, arrays, names=names).raise_if_failed()


# -- 8. uninitialised outputs past seq_len_max ----------------------------------------------------


@pytest.mark.parametrize("op", [tc.block_lstm, tc.block_lstm_v2])
def test_fault_8_outputs_past_seq_len_max_are_zero(rng, op):
    """TF's BlockLSTM zeroes cs and h past ``seq_len_max`` but leaves i, f, o, ci, co
    uninitialised (whatever the allocator held; not asserted on here). gradcells returns
    zeros for all seven, and the steps before are those of the full run."""
    case = lstm_sequence_case(rng, steps=5, batch=3, input_size=2, hidden=4, peephole=True)
    args = [case[k] for k in ("x", "cs0", "h0", "w", *PEEPHOLES, "b")]
    full = op(5, *args, use_peephole=True)
    short = op(2, *args, use_peephole=True)
    for k in STEP_FIELDS:
        np.testing.assert_array_equal(getattr(short, k)[2:], 0.0, err_msg=k)
        np.testing.assert_allclose(getattr(short, k)[:2], getattr(full, k)[:2], rtol=1e-15,
                                   err_msg=k)


# -- 9. no registered gradient for the cells ------------------------------------------------------


@pytest.mark.parametrize("op", ["LSTMBlockCell", "GRUBlockCell"])
def test_fault_9_no_gradient_registered_for_the_cells(tf, rng, op):
    """TF2 registers no gradient for LSTMBlockCell or GRUBlockCell; gradcells has one for
    each, and it passes the oracle."""
    if op == "LSTMBlockCell":
        case = lstm_cell_case(rng, dtype=np.float32)
        inputs = tf_lstm_inputs(tf, [case[k] for k in LSTM_ARGS], False)
        names = ("x", "cs_prev", "h_prev", "w", *PEEPHOLES, "b")
        check = ("lstm_cell", lstm_cell_case(rng))
    else:
        case = gru_cell_case(rng, dtype=np.float32)
        inputs = [tf.constant(case[k]) for k in GRU_ARGS]
        names = GRU_ARGS
        check = ("gru_cell", gru_cell_case(rng))
    with tf.GradientTape() as tape:
        tape.watch(inputs[0])
        h = getattr(tf.raw_ops, op)(**dict(zip(names, inputs, strict=True))).h
        loss = tf.reduce_sum(h)
    with pytest.raises(LookupError, match=f"no entry for: {op}"):
        tape.gradient(loss, inputs[0])
    vjp_check(*check).raise_if_failed()


# -- 10. float32 only -----------------------------------------------------------------------------


def float64_inputs(op):
    rng = np.random.default_rng(10)
    if op.startswith("GRU"):
        case = gru_cell_case(rng)
        return {k: case[k] for k in GRU_ARGS}
    hidden = 5
    peeps = dict.fromkeys(PEEPHOLES, np.zeros(hidden))
    if op == "LSTMBlockCell":
        case = lstm_cell_case(rng, hidden=hidden)
        return {**{k: case[k] for k in LSTM_ARGS}, **peeps}
    case = lstm_sequence_case(rng, hidden=hidden)
    return {"seq_len_max": np.int64(case["x"].shape[0]), "x": case["x"],
            "cs_prev": case["cs0"], "h_prev": case["h0"], "w": case["w"], "b": case["b"],
            **peeps}


@pytest.mark.parametrize("op, mirror", [
    ("LSTMBlockCell", tc.lstm_block_cell), ("GRUBlockCell", tc.gru_block_cell),
    ("BlockLSTM", tc.block_lstm), ("BlockLSTMV2", tc.block_lstm_v2),
])
def test_fault_10_tensorflow_rejects_float64(tf, op, mirror):
    """TF's ops take float16/float32 (GRU: float32 only), so their gradients cannot be checked
    by float64 finite differences; the mirrors take float64 and return float64, and the
    oracle checks gradcells's float64 gradients at float64 tolerance (faults 4, 5 and 9
    above; ``test_tf_compat.py`` for the mirrors)."""
    inputs = float64_inputs(op)
    with pytest.raises(tf.errors.InvalidArgumentError, match="double is not in the list"):
        getattr(tf.raw_ops, op)(**inputs)
    assert all(a.dtype == np.float64 for a in mirror(**inputs))


def test_fault_10_gru_rejects_float16(tf):
    inputs = {k: v.astype(np.float16) for k, v in float64_inputs("GRUBlockCell").items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match="half is not in the list"):
        tf.raw_ops.GRUBlockCell(**inputs)


# -- 11. the gate outputs' upstream gradients dropped ----------------------------------------------


BLOCK_OPS = ("LSTMBlockCell", "GRUBlockCell", "BlockLSTM", "BlockLSTMV2")
MIRRORS = {"LSTMBlockCell": tc.lstm_block_cell, "GRUBlockCell": tc.gru_block_cell,
           "BlockLSTM": tc.block_lstm, "BlockLSTMV2": tc.block_lstm_v2}


def block_case(rng, op):
    """``(names, arrays)``: a small float64 case of ``op`` (no peepholes, no clip)."""
    if op == "GRUBlockCell":
        case = gru_cell_case(rng, batch=2, input_size=3, hidden=4)
        return GRU_ARGS, [case[k] for k in GRU_ARGS]
    if op == "LSTMBlockCell":
        case = lstm_cell_case(rng, batch=2, input_size=3, hidden=4)
        return LSTM_ARGS, [case[k] for k in LSTM_ARGS]
    case = lstm_sequence_case(rng, steps=3, batch=2, input_size=3, hidden=4)
    return LSTM_ARGS, [case[k] for k in ("x", "cs0", "h0", "w", "b")]


def mirror_outputs(op, arrays):
    """Every output of ``op`` by ``tf_compat``'s float64 mirror (no peepholes, no clip)."""
    if op == "GRUBlockCell":
        return tc.gru_block_cell(*arrays)
    x, cs_prev, h_prev, w, b = arrays
    steps = () if op == "LSTMBlockCell" else (x.shape[0],)
    return MIRRORS[op](*steps, x, cs_prev, h_prev, w, None, None, None, b, cell_clip=0.0)


def tape_block_lstm_grad(tf, op, inputs, grad):
    """``tf.GradientTape``'s gradient (``rnn_grad.py``'s ``_block_lstm_grad``) of BlockLSTM's
    or BlockLSTMV2's inputs for ``grad``, the upstream gradient of every output."""
    x, cs_prev, h_prev, w, b = inputs
    p = tf.zeros(cs_prev.shape[1])
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = getattr(tf.raw_ops, op)(seq_len_max=np.int64(x.shape[0]), x=x, cs_prev=cs_prev,
                                      h_prev=h_prev, w=w, wci=p, wcf=p, wco=p, b=b,
                                      cell_clip=0.0)
    return tape.gradient(list(out), inputs, output_gradients=list(grad))


def tf_block_grad(tf, op, arrays, grad):
    """TF's gradient of ``op``'s inputs for ``grad`` (float32 tensors, one per output): the
    seed's ``_LSTMBlockCellGrad`` or ``_GRUBlockCellGrad`` for the cells (TF2 registers none,
    fault 9), ``tf.GradientTape`` for BlockLSTM and BlockLSTMV2."""
    if op == "LSTMBlockCell":
        inputs = tf_lstm_inputs(tf, arrays, False)
        outputs = tf.raw_ops.LSTMBlockCell(**dict(zip(TF_LSTM_INPUTS, inputs, strict=True)),
                                           cell_clip=0.0, use_peephole=False)
        x, cs_prev, h_prev, w, _, _, _, b = seed_lstm_block_cell_grad(tf, inputs, outputs,
                                                                      grad, False)
        return [x, cs_prev, h_prev, w, b]
    inputs = [tf.constant(f32(a)) for a in arrays]
    if op == "GRUBlockCell":
        return seed_gru_block_cell_grad(tf, inputs, grad)
    return tape_block_lstm_grad(tf, op, inputs, grad)


def block_fields(op, fields):
    """``f`` for the oracle: the outputs ``fields`` of ``op``'s float64 mirror."""
    return lambda *arrays: tuple(getattr(mirror_outputs(op, arrays), k) for k in fields)


def tf_block_vjp(tf, op, fields):
    """A claimed vjp of ``block_fields(op, fields)``: TF's gradient for the cotangent upstream
    of those outputs and zeros upstream of the others."""
    def vjp(ct, *arrays):
        upstream = dict(zip(fields, ct, strict=True))
        outputs = mirror_outputs(op, arrays)._asdict()
        grad = [tf.constant(f32(upstream.get(k, np.zeros_like(v)))) for k, v in outputs.items()]
        return [g.numpy() for g in tf_block_grad(tf, op, arrays, grad)]
    return vjp


@pytest.mark.parametrize("op", BLOCK_OPS)
def test_fault_11_gate_output_gradients_are_dropped(tf, rng, op):
    """A loss on one gate output, ``sum(gate ∘ w)`` (w: the oracle's cotangent): TF's
    gradient of every input is zero, the oracle's central differences of the float64 forward
    are not: it fails x, h_prev and the weights by more than 0.05 and 500 times its tolerance
    (the whole derivative lost; the float32 tolerance is rtol 1e-3). A loss on h (and cs)
    passes: only the gates' upstream gradients are lost (BlockLSTMV2's h and cs gradient is
    fault 6's)."""
    names, arrays = block_case(rng, op)
    kept = KEPT_GRU if op == "GRUBlockCell" else KEPT_LSTM
    weights = {"w_ru", "b_ru"} if op == "GRUBlockCell" else {"w", "b"}
    outputs = mirror_outputs(op, arrays)._asdict()
    for gate in [k for k in outputs if k not in kept]:
        vjp = tf_block_vjp(tf, op, (gate,))
        assert not any(g.any() for g in vjp((np.ones_like(outputs[gate]),), *arrays)), gate
        report = gc.check_vjp(block_fields(op, (gate,)), vjp, arrays, names=names)
        assert failing(report) >= {"x", "h_prev"} | weights, (gate, str(report))
        assert report.max_abs_error > 0.05, (gate, str(report))
        assert max(c.abs_error / c.bound for c in report.checks) > 500, (gate, str(report))
    if op != "BlockLSTMV2":
        gc.check_vjp(block_fields(op, kept), tf_block_vjp(tf, op, kept), arrays,
                     names=names).raise_if_failed()


# -- the one list of known faults -----------------------------------------------------------------


def test_every_known_fault_is_listed_once_and_shown_by_its_test():
    """``gradcells.audit.faults`` lists faults 1..11 (TensorFlow's, 1-19), then each
    framework's in its range, each with its test in its file (fault 7, which needs
    TensorFlow's GPU kernels, has none and says why); every fault test in this file names a
    listed fault."""
    import re
    from pathlib import Path

    from gradcells.audit.faults import FAULTS

    root = Path(__file__).resolve().parents[2]
    assert [n for n in sorted(FAULTS) if n < 20] == list(range(1, 12))
    assert all(1 <= n < 110 for n in FAULTS)      # ranges of ten, the last fla's 100-109
    for number, fault in FAULTS.items():
        assert fault.number == number and fault.title and fault.reproduction
        assert fault.kind in ("fault", "convention")
        if fault.test is None:
            assert number == 7 and "GPU" in fault.evidence
            continue
        prefix = "test_fault_" if fault.kind == "fault" else "test_convention_"
        assert re.match(rf"{prefix}(\d+_and_)*{number}_", fault.test), fault.test
        source = (root / fault.test_file).read_text(encoding="utf-8")
        assert re.search(rf"^def {fault.test}\(", source, re.M), (fault.test_file, fault.test)
    here = {name for name, value in globals().items()
            if name.startswith("test_fault_") and callable(value)}
    assert {int(name.split("_")[2]) for name in here} <= set(FAULTS)


def test_the_audit_rows_name_the_listed_faults():
    """Each fault's audit rows are rows of the audits that expect that fault, and every fault
    a row expects is listed: with all its rows, or (Keras's, whose many rows per backend and
    cell expect the same few entries) with a representative one."""
    import importlib

    from gradcells.audit import ALL
    from gradcells.audit.faults import FAULTS

    expecting = {}
    for name in ALL:
        module = importlib.import_module(f"gradcells.audit.{name}")
        expecting.update({check.name: check.entries for check in module.CHECKS
                          if check.entries})
    listed = {(name, fault.number) for fault in FAULTS.values() for name in fault.checks}
    assert {(name, e) for name, entries in expecting.items() for e in entries} >= listed
    assert {e for _, e in listed} == {e for entries in expecting.values() for e in entries}
    for name in expecting:
        assert name in {n for n, _ in listed} or name.startswith("keras["), name


def test_docs_faults_md_is_generated_from_the_list():
    from pathlib import Path

    from gradcells.audit.faults import FAULTS, markdown

    stored = Path(__file__).resolve().parents[2] / "docs" / "faults.md"
    assert stored.read_text(encoding="utf-8") == markdown(), (
        "docs/faults.md is stale: regenerate it with "
        "python -c \"import gradcells.audit.faults as f; print(f.markdown(), end='')\" "
        "> docs/faults.md")
    for fault in FAULTS.values():
        assert f"## {fault.number}. {fault.title}" in markdown()


def test_a_fault_prints_as_its_line():
    from gradcells.audit import FAULTS

    assert str(FAULTS[6]) == FAULTS[6].title
    assert str(FAULTS[6]).startswith("BlockLSTMV2's registered gradient")


RUNNABLE = [fault for fault in FAULTS.values() if fault.shows is not None]
ENVIRONMENT = re.compile(r"# ((?:\w+=\S+ ?)+)")


def _imported(source) -> set[str]:
    """The modules ``source`` imports, at any depth (a function's own imports included),
    by their full dotted names; relative imports are left out."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def _needed(reproduction) -> set[str]:
    """The top-level modules beyond the standard library that the reproduction needs: those
    it imports; those that each gradcells module it imports imports, in its functions too
    (gradcells imports a framework it audits only where it uses it: fault 41's ``run_node``
    needs onnx and onnxruntime); and the Keras backend its first line sets
    (``KERAS_BACKEND=jax`` needs jax)."""
    import importlib.util

    imported = _imported(reproduction)
    for name in [n for n in imported if n.split(".")[0] == "gradcells"]:
        imported |= _imported(Path(importlib.util.find_spec(name).origin).read_text("utf-8"))
    found = ENVIRONMENT.match(reproduction)
    backend = dict(kv.split("=", 1) for kv in found[1].split()).get("KERAS_BACKEND") \
        if found else None
    return ({n.split(".")[0] for n in imported} | {backend} - {None}) - set(
        sys.stdlib_module_names)


def _missing(reproduction) -> list[str]:
    """The modules the reproduction needs (``_needed``) that are not installed here."""
    import importlib.util

    return sorted(n for n in _needed(reproduction) if importlib.util.find_spec(n) is None)


_FORKED = r"""
import json, os, sys, traceback
for name in json.loads(sys.argv[1]):
    __import__(name)
outputs = []
for script in json.loads(sys.stdin.read()):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        status = 0
        try:
            exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        outputs.append(pipe.read().decode(errors="replace"))
    os.waitpid(pid, 0)
print("\n" + MARK + json.dumps(outputs))
"""
"""A process that imports ``argv[1]``'s modules once, then runs each script read from stdin
as ``__main__`` in a child forked from it (its stdout and stderr, an uncaught exception's
traceback included, in one pipe); prints the outputs as JSON after ``MARK``."""
MARK = "=== reproductions ===\n"


def _environment(reproduction) -> dict[str, str]:
    """The variables the reproduction's first line sets (``# NAME=value ...``)."""
    found = ENVIRONMENT.match(reproduction)
    return dict(kv.split("=", 1) for kv in found[1].split()) if found else {}


def _run_group(group) -> list[str]:
    """The outputs of reproductions that set the same environment: each run as a script in
    a fresh process, a child forked from one that imported the modules they import (at
    their top level) once."""
    import json
    import os
    import subprocess

    scripts = [f.reproduction for f in group]
    modules = sorted({n for s in scripts for n in _imported(s)
                      if n.split(".")[0] not in sys.stdlib_module_names})
    done = subprocess.run(
        [sys.executable, "-c", f"MARK = {MARK!r}\n" + _FORKED, json.dumps(modules)],
        input=json.dumps(scripts), capture_output=True, text=True, timeout=600,
        env=dict(os.environ, **_environment(scripts[0])))
    assert MARK in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.rsplit(MARK, 1)[1])


@pytest.fixture(scope="module")
def reproductions():
    """Each runnable reproduction's output (None: a module it needs is missing), run as a
    script in the environment its first line sets. Each runs in a process of its own,
    forked from one that set that environment and imported the frameworks every script of
    its group imports (the scripts that set the same environment: TensorFlow's import,
    seconds, is paid once for its five scripts, PyTorch's once for the eight that run with
    warnings off); the groups run concurrently, a process each."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    groups = {}
    for fault in RUNNABLE:
        if not _missing(fault.reproduction):
            key = tuple(sorted(_environment(fault.reproduction).items()))
            groups.setdefault(key, []).append(fault)
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        outputs = {f.number: out for group, outs in zip(groups.values(),
                                                        pool.map(_run_group, groups.values()),
                                                        strict=True)
                   for f, out in zip(group, outs, strict=True)}
    return {f.number: outputs.get(f.number) for f in RUNNABLE}


@pytest.mark.conformance
@pytest.mark.parametrize("fault", RUNNABLE, ids=lambda fault: str(fault.number))
def test_the_reproduction_runs_and_shows_the_fault(fault, reproductions):
    """docs/faults.md's reproductions are scripts that show what their comments say: run as
    written, in the environment their first line names, the output matches ``shows``."""
    if reproductions[fault.number] is None:
        pytest.skip(f"not installed: {', '.join(_missing(fault.reproduction))}")
    output = reproductions[fault.number]
    assert re.search(fault.shows, output), output[-3000:]


def test_a_reproduction_needs_what_the_gradcells_function_it_calls_imports(monkeypatch):
    """Fault 41's script imports NumPy and gradcells's ``run_node``, whose body imports onnx
    and onnxruntime: without onnx it is skipped as not installed (it used to run and fail
    with ModuleNotFoundError); a Keras reproduction needs the backend its first line sets."""
    import importlib.util

    assert _needed(FAULTS[41].reproduction) == {"numpy", "gradcells", "onnx", "onnxruntime"}
    assert _needed(FAULTS[31].reproduction) == {"numpy", "keras", "jax"}
    assert _needed(FAULTS[24].reproduction) == {"numpy", "gradcells"}
    real = importlib.util.find_spec

    def installed_but_onnx(name, *rest):
        return None if name == "onnx" else real("numpy" if name != "gradcells" and not
                                                name.startswith("gradcells.") else name, *rest)

    monkeypatch.setattr(importlib.util, "find_spec", installed_but_onnx)
    assert _missing(FAULTS[41].reproduction) == ["onnx"]
    assert _missing(FAULTS[43].reproduction) == ["onnx"]
    assert _missing(FAULTS[24].reproduction) == []
