"""Conformance with TensorFlow's fused recurrent raw ops (float32): ``LSTMBlockCell``,
``LSTMBlockCellGrad``, ``GRUBlockCell``, ``GRUBlockCellGrad``, ``BlockLSTM``,
``BlockLSTMGrad``, ``BlockLSTMV2`` and ``BlockLSTMGradV2`` against ``gradcells.tf_compat``
and the public API, with peepholes on and off, clipping off, at TF's default 3.0 and at a
drawn level, and sizes drawn by Hypothesis.

Tolerance: both sides compute in float32, TF with Eigen's own tanh/sigmoid and matmul
order, so results differ by float32 round-off: a few ulps per operation, accumulated over
the ``I + H`` terms of a matmul and, for sequences, over the steps. ``F32`` allows about 17
float32 ulps of 1 (2e-6, relative, plus the same absolute amount near zero); the worst seen
over 600 drawn examples was 5 ulps (a sequence's ``w_grad``).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from installed import needs

import gradcells as gc
from gradcells import tf_compat as tc
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import gru_cell_case, lstm_cell_case, lstm_sequence_case

pytestmark = [pytest.mark.conformance, needs("tensorflow")]
tf = None
"""TensorFlow, imported by ``_tensorflow`` when this file's tests run (not at collection:
``installed``)."""

F32 = {"rtol": 2e-6, "atol": 2e-6}
STEP_FIELDS = ("i", "cs", "f", "o", "ci", "co", "h")
GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
TF_EXAMPLES = settings(max_examples=8)  # TF calls are slow; the sizes are few and small


@pytest.fixture(autouse=True, scope="module")
def _tensorflow():
    global tf
    tf = pytest.importorskip("tensorflow")


def numpy(outputs):
    return [t.numpy() for t in outputs]


def close(actual, expected, what=""):
    np.testing.assert_allclose(actual, expected, err_msg=what, **F32)


def swap_ci_f(a):
    """Blocks i, f, ci, o <-> i, ci, f, o on the last axis."""
    i, first, second, o = np.split(a, 4, axis=-1)
    return np.concatenate([i, second, first, o], axis=-1)


def lstm_case(seed, batch, input_size, hidden, use_peephole, clip_mode, forget_bias, steps=None):
    """A float32 case and TF's ``cell_clip`` for it: "off" (0.0), "default" (TF's 3.0, with
    the initial cell state scaled by 4 so that it often clips) or "drawn" (a level that clips
    part of cs)."""
    rng = np.random.default_rng(seed)
    sizes = {"batch": batch, "input_size": input_size, "hidden": hidden}
    if steps is None:
        case = lstm_cell_case(rng, **sizes, dtype=np.float32, peephole=use_peephole,
                              clip=clip_mode == "drawn", forget_bias=forget_bias)
    else:
        case = lstm_sequence_case(rng, steps=steps, **sizes, dtype=np.float32,
                                  peephole=use_peephole, clip=clip_mode == "drawn",
                                  forget_bias=forget_bias)
    state = "cs_prev" if steps is None else "cs0"
    if clip_mode == "default":
        case[state] = (4.0 * case[state]).astype(np.float32)
    tf_clip = {"off": 0.0, "default": 3.0, "drawn": case["cell_clip"] or 0.0}[clip_mode]
    return case, tf_clip


def tf_lstm_args(case, use_peephole, state="cs_prev", output="h_prev"):
    hidden = case[state].shape[1]
    peeps = {k: case[k] if use_peephole else np.zeros(hidden, np.float32) for k in PEEPHOLES}
    return {"x": case["x"], "cs_prev": case[state], "h_prev": case[output], "w": case["w"],
            **peeps, "b": case["b"]}


lstm_sizes = {"seed": st.integers(0, 2**32 - 1), "batch": st.integers(1, 4),
              "input_size": st.integers(1, 5), "hidden": st.integers(1, 5),
              "use_peephole": st.booleans(),
              "clip_mode": st.sampled_from(["off", "default", "drawn"]),
              "forget_bias": st.sampled_from([0.0, 1.0, -0.5])}


# -- cells ----------------------------------------------------------------------------------------


@TF_EXAMPLES
@given(**lstm_sizes)
def test_lstm_block_cell(seed, batch, input_size, hidden, use_peephole, clip_mode, forget_bias):
    case, tf_clip = lstm_case(seed, batch, input_size, hidden, use_peephole, clip_mode,
                              forget_bias)
    args = tf_lstm_args(case, use_peephole)
    attrs = {"forget_bias": forget_bias, "use_peephole": use_peephole}
    if clip_mode != "default":  # "default": pass nothing, to both
        attrs["cell_clip"] = tf_clip
    expected = numpy(tf.raw_ops.LSTMBlockCell(**args, **attrs))
    mirror = tc.lstm_block_cell(**args, **attrs)
    public = gc.lstm_cell(case["x"], case["cs_prev"], case["h_prev"], case["w"], case["b"],
                          **({k: case[k] for k in PEEPHOLES} if use_peephole else {}),
                          forget_bias=forget_bias, cell_clip=tf_clip)
    for k, theirs in zip(STEP_FIELDS, expected, strict=True):
        close(getattr(mirror, k), theirs, k)
        close(getattr(public, k), theirs, k)


@TF_EXAMPLES
@given(**lstm_sizes)
def test_lstm_block_cell_grad(seed, batch, input_size, hidden, use_peephole, clip_mode,
                              forget_bias):
    """Given TF's forward outputs, the op's five outputs; the public API's
    ``clip_grad="straight_through"`` gradient equals TF's op composed as its Python
    gradient does (``dicfo·wᵀ``, ``xhᵀ·dicfo``, ``Σ dicfo``)."""
    case, tf_clip = lstm_case(seed, batch, input_size, hidden, use_peephole, clip_mode,
                              forget_bias)
    args = tf_lstm_args(case, use_peephole)
    forward = numpy(tf.raw_ops.LSTMBlockCell(**args, forget_bias=forget_bias,
                                             cell_clip=tf_clip, use_peephole=use_peephole))
    rng = np.random.default_rng(seed + 1)
    cs_grad, h_grad = (rng.standard_normal(forward[1].shape).astype(np.float32) for _ in "ch")
    saved = dict(zip(STEP_FIELDS[:6], forward[:6], strict=True))
    expected = numpy(tf.raw_ops.LSTMBlockCellGrad(**args, **saved, cs_grad=cs_grad,
                                                  h_grad=h_grad, use_peephole=use_peephole))
    mirror = tc.lstm_block_cell_grad(**args, **saved, cs_grad=cs_grad, h_grad=h_grad,
                                     use_peephole=use_peephole)
    for name, mine, theirs in zip(tc.LSTMBlockCellGradOutput._fields, mirror, expected,
                                  strict=True):
        close(mine, theirs, name)

    public = gc.lstm_cell_grad(
        case["x"], case["cs_prev"], case["h_prev"], case["w"], case["b"],
        gc.LSTMCellState(*forward), d_h=h_grad, d_cs=cs_grad,
        **({k: case[k] for k in PEEPHOLES} if use_peephole else {}), cell_clip=tf_clip,
        clip_grad="straight_through")
    dicfo = expected[1]
    xh_grad = dicfo @ case["w"].T
    close(public.x, xh_grad[:, :input_size], "x")
    close(public.h_prev, xh_grad[:, input_size:], "h_prev")
    close(public.w, np.concatenate([case["x"], case["h_prev"]], 1).T @ dicfo, "w")
    close(public.b, dicfo.sum(0), "b")
    close(public.cs_prev, expected[0], "cs_prev")
    if use_peephole:
        for k, theirs in zip(PEEPHOLES, expected[2:], strict=True):
            close(getattr(public, k), theirs, k)


@TF_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4), input_size=st.integers(1, 5),
       hidden=st.integers(1, 5))
def test_gru_block_cell_and_grad(seed, batch, input_size, hidden):
    rng = np.random.default_rng(seed)
    case = gru_cell_case(rng, batch=batch, input_size=input_size, hidden=hidden,
                         dtype=np.float32)
    args = {k: case[k] for k in GRU_ARGS}
    expected = numpy(tf.raw_ops.GRUBlockCell(**args))
    mirror = tc.gru_block_cell(**args)
    public = gc.gru_cell(*args.values())
    for k, theirs in zip(("r", "u", "c", "h"), expected, strict=True):
        close(getattr(mirror, k), theirs, k)
        close(getattr(public, k), theirs, k)

    r, u, c, _ = expected
    d_h = rng.standard_normal(r.shape).astype(np.float32)
    expected_grad = numpy(tf.raw_ops.GRUBlockCellGrad(**args, r=r, u=u, c=c, d_h=d_h))
    mirror_grad = tc.gru_block_cell_grad(**args, r=r, u=u, c=c, d_h=d_h)
    for name, mine, theirs in zip(tc.GRUBlockCellGradOutput._fields, mirror_grad,
                                  expected_grad, strict=True):
        close(mine, theirs, name)
    # The seed's Python composition of the weight gradients (docs/spec.md §3) against the
    # public API.
    public_grad = gc.gru_cell_grad(*args.values(), gc.GRUCellState(*expected), d_h=d_h)
    d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = expected_grad
    close(public_grad.x, d_x, "x")
    close(public_grad.h_prev, d_h_prev, "h_prev")
    close(public_grad.w_ru, np.concatenate([case["x"], case["h_prev"]], 1).T @ d_r_bar_u_bar,
          "w_ru")
    close(public_grad.w_c, np.concatenate([case["x"], case["h_prev"] * r], 1).T @ d_c_bar,
          "w_c")
    close(public_grad.b_ru, d_r_bar_u_bar.sum(0), "b_ru")
    close(public_grad.b_c, d_c_bar.sum(0), "b_c")


# -- sequences ------------------------------------------------------------------------------------


BLOCK_OPS = {
    # version: (TF forward, TF gradient, mirror forward, mirror gradient, TF's cell_clip default)
    1: ("BlockLSTM", "BlockLSTMGrad", tc.block_lstm, tc.block_lstm_grad, 3.0),
    2: ("BlockLSTMV2", "BlockLSTMGradV2", tc.block_lstm_v2, tc.block_lstm_grad_v2, 0.0),
}


@TF_EXAMPLES
@given(**lstm_sizes, steps=st.integers(1, 4), data=st.data(), version=st.sampled_from([1, 2]))
def test_block_lstm_and_grad(seed, batch, input_size, hidden, use_peephole, clip_mode,
                             forget_bias, steps, data, version):
    """Forward and BPTT over ``seq_len_max <= T`` steps. The gradients are fed TF's own
    forward outputs, garbage past ``seq_len_max`` included."""
    tf_forward, tf_grad, mirror_forward, mirror_grad, default_clip = BLOCK_OPS[version]
    seq_len_max = data.draw(st.integers(0, steps), label="seq_len_max")
    case, tf_clip = lstm_case(seed, batch, input_size, hidden, use_peephole, clip_mode,
                              forget_bias, steps=steps)
    if clip_mode == "default":
        tf_clip = default_clip
    args = tf_lstm_args(case, use_peephole, "cs0", "h0")
    if version == 2:  # the same weights in V2's gate order
        args["w"], args["b"] = swap_ci_f(args["w"]), swap_ci_f(args["b"])
    attrs = {"use_peephole": use_peephole}
    if version == 1:
        attrs["forget_bias"] = forget_bias
    if clip_mode != "default":
        attrs["cell_clip"] = tf_clip
    expected = numpy(getattr(tf.raw_ops, tf_forward)(seq_len_max=np.int64(seq_len_max), **args,
                                                     **attrs))
    mirror = mirror_forward(seq_len_max, **args, **attrs)
    for k, mine, theirs in zip(STEP_FIELDS, mirror, expected, strict=True):
        close(mine[:seq_len_max], theirs[:seq_len_max], k)
        assert not mine[seq_len_max:].any(), k  # TF: zeros for cs, h; garbage for the rest
    for theirs in (expected[1], expected[6]):
        assert not theirs[seq_len_max:].any()
    if seq_len_max == steps:  # the public API directly
        public = gc.lstm_sequence(
            case["x"], case["cs0"], case["h0"], case["w"], case["b"],
            **({k: case[k] for k in PEEPHOLES} if use_peephole else {}),
            forget_bias=forget_bias if version == 1 else 0.0, cell_clip=tf_clip)
        for k, theirs in zip(STEP_FIELDS, expected, strict=True):
            close(getattr(public, k), theirs, k)

    rng = np.random.default_rng(seed + 1)
    cs_grad, h_grad = (rng.standard_normal(expected[0].shape).astype(np.float32) for _ in "ch")
    saved = dict(zip(STEP_FIELDS, expected, strict=True))
    grads = {"cs_grad": cs_grad, "h_grad": h_grad, "use_peephole": use_peephole}
    expected_grad = numpy(getattr(tf.raw_ops, tf_grad)(seq_len_max=np.int64(seq_len_max),
                                                       **args, **saved, **grads))
    mine = mirror_grad(seq_len_max, **args, **saved, **grads)
    for name, g, theirs in zip(tc.BlockLSTMGradOutput._fields, mine, expected_grad, strict=True):
        close(g, theirs, name)
