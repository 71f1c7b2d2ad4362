"""gradcells.jax (docs/spec.md §13): the ops as JAX functions under jit, grad, vjp, jvp, vmap
and their compositions, against JAX's own autodiff of a ``jax.numpy`` transcription of the
math (``gradcells.reference``'s, the spec), and equal to gradcells's NumPy ops. float64."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import gradcells as gc  # noqa: E402
import gradcells.jax as gj  # noqa: E402
from gradcells.cells import OPS  # noqa: E402
from gradcells.cells.lstm.spec import PEEPHOLES  # noqa: E402

T, B, I, H = 5, 3, 4, 6
TOL = dict(rtol=1e-9, atol=1e-10)


@pytest.fixture(autouse=True, scope="module")
def _float64():
    """float64 for this file's tests, JAX's setting restored after (other files rely on
    JAX's float32 default)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def trees_close(a, b):
    jax.tree_util.tree_map(close, a, b)


# --------------------------------------------------------------------------------------
# The transcription: gradcells.reference's formulas in jax.numpy, differentiated by JAX


def lstm_step(x, cs, h, w, b, wci=None, wcf=None, wco=None, forget_bias=1.0,
              cell_clip=None):
    gi, gc_, gf, go = jnp.split(jnp.concatenate([x, h], 1) @ w + b, 4, axis=1)
    peep = wci is not None
    i = jax.nn.sigmoid(gi + (cs * wci if peep else 0))
    ci = jnp.tanh(gc_)
    f = jax.nn.sigmoid(gf + forget_bias + (cs * wcf if peep else 0))
    cs = i * ci + f * cs
    if cell_clip is not None:
        cs = jnp.clip(cs, -cell_clip, cell_clip)
    co = jnp.tanh(cs)
    o = jax.nn.sigmoid(go + (cs * wco if peep else 0))
    return (cs, o * co), (i, cs, f, o, ci, co, o * co)


def gru_step(x, h, w_ru, w_c, b_ru, b_c, reset_after=False):
    r, u = jnp.split(jax.nn.sigmoid(jnp.concatenate([x, h], 1) @ w_ru + b_ru), 2, axis=1)
    if reset_after:
        n_in = x.shape[1]
        c = jnp.tanh(x @ w_c[:n_in] + b_c[:H] + r * (h @ w_c[n_in:] + b_c[H:]))
    else:
        c = jnp.tanh(jnp.concatenate([x, r * h], 1) @ w_c + b_c)
    h = u * h + (1 - u) * c
    return (h,), (r, u, c, h)


def rnn_step(x, h, w, b, activation="tanh"):
    z = jnp.concatenate([x, h], 1) @ w + b
    h = jnp.tanh(z) if activation == "tanh" else jnp.maximum(z, 0)
    return (h,), (h,)


def run(step, x, states, seq_len=None, reverse=False, **kw):
    """A sequence of ``step``: rows past their length output zeros and keep their state;
    ``reverse`` runs each row's valid steps last to first (outputs at their positions)."""
    lengths = jnp.full(x.shape[1], x.shape[0]) if seq_len is None else jnp.asarray(seq_len)
    outs = [None] * x.shape[0]
    for t in (reversed(range(x.shape[0])) if reverse else range(x.shape[0])):
        valid = (t < lengths)[:, None]
        new, out = step(x[t], *states, **kw)
        states = tuple(jnp.where(valid, n, s) for n, s in zip(new, states, strict=True))
        outs[t] = tuple(jnp.where(valid, o, 0) for o in out)
    return tuple(jnp.stack(field) for field in zip(*outs, strict=True)) + states


# --------------------------------------------------------------------------------------
# Inputs


def inputs(cell, seed=0, reset_after=False, peepholes=False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, B, I))
    if cell == "lstm":
        arrays = dict(x=x, cs0=rng.normal(size=(B, H)), h0=rng.normal(size=(B, H)),
                      w=rng.normal(size=(I + H, 4 * H)) * 0.4, b=rng.normal(size=4 * H) * 0.2)
        if peepholes:
            arrays.update(wci=rng.normal(size=H), wcf=rng.normal(size=H),
                          wco=rng.normal(size=H))
    elif cell == "gru":
        arrays = dict(x=x, h0=rng.normal(size=(B, H)),
                      w_ru=rng.normal(size=(I + H, 2 * H)) * 0.4,
                      w_c=rng.normal(size=(I + H, H)) * 0.4, b_ru=rng.normal(size=2 * H) * 0.2,
                      b_c=rng.normal(size=(2 if reset_after else 1) * H) * 0.2)
    else:
        arrays = dict(x=x, h0=rng.normal(size=(B, H)), w=rng.normal(size=(I + H, H)) * 0.4,
                      b=rng.normal(size=H) * 0.2)
    return {k: jnp.asarray(a) for k, a in arrays.items()}


STEPS = {"lstm": lstm_step, "gru": gru_step, "rnn": rnn_step}
STATES = {"lstm": ("cs0", "h0"), "gru": ("h0",), "rnn": ("h0",)}

CASES = [
    ("lstm", {}, {}),
    ("lstm", {"peepholes": True}, {"forget_bias": 0.5, "cell_clip": 0.7}),
    ("lstm", {"peepholes": True}, {"seq_len": [5, 2, 0], "reverse": True}),
    ("lstm", {}, {"seq_len": [3, 5, 1], "cell_clip": 0.5}),
    ("gru", {}, {"reset_after": False}),
    ("gru", {"reset_after": True}, {"reset_after": True, "seq_len": [4, 0, 5]}),
    ("gru", {"reset_after": True}, {"reset_after": True, "reverse": True,
                                    "seq_len": [1, 5, 3]}),
    ("rnn", {}, {"activation": "tanh", "reverse": True}),
    ("rnn", {}, {"activation": "relu", "seq_len": [2, 5, 4]}),
]


def split_kw(kw):
    """The keywords of a case: the sequence's, and the transcription's (its step's and the
    loop's)."""
    loop = {k: kw[k] for k in ("seq_len", "reverse") if k in kw}
    step = {k: a for k, a in kw.items() if k not in loop}
    return loop, step


def gc_call(cell, arrays, kw):
    """The JAX op's call: ``arrays`` by name, the optional weights as keywords."""
    return call_op(getattr(gj, f"{cell}_sequence"), cell, arrays, kw)


def call_op(op, cell, arrays, kw):
    """``op`` (gradcells.jax's or gc's sequence) of ``arrays`` by name (JAX sorts a dict's
    keys: the positions come from the spec)."""
    order = OPS[f"{cell}_sequence"].arrays
    optional = {n: arrays[n] for n in PEEPHOLES if n in arrays}
    return op(*(arrays[n] for n in order if n in arrays and n not in optional), **optional,
              **kw)


def ref_call(cell, arrays, kw):
    """The transcription's sequence: the step's outputs per step, then the final states."""
    loop, step = split_kw(kw)
    weights = {n: a for n, a in arrays.items() if n not in ("x", *STATES[cell])}
    return run(lambda x, *s: STEPS[cell](x, *s, **weights, **step), arrays["x"],
               tuple(arrays[s] for s in STATES[cell]), **loop)


def loss_of(cell, result, seed=7):
    """A scalar of every field of the result (docs/spec.md §16.1: the gates, the per-step
    h and cs, the final states), random weights, so each gradient path counts."""
    rng = np.random.default_rng(seed)
    return sum(jnp.sum(a * rng.normal(size=a.shape)) for a in result)


def ref_result(cell, arrays, kw):
    """The transcription's sequence as the op's result NamedTuple."""
    result_type = {"lstm": gc.LSTMSequence, "gru": gc.GRUSequence, "rnn": gc.RNNSequence}[cell]
    return result_type(*ref_call(cell, arrays, kw))


RESULTS = {"lstm": gc.LSTMSequence, "gru": gc.GRUSequence, "rnn": gc.RNNSequence}


def fns(cell, arrays, kw):
    """The loss as a function of the arrays, through gradcells.jax and the transcription."""
    def ours(a):
        return loss_of(cell, gc_call(cell, a, kw))

    def theirs(a):
        return loss_of(cell, ref_result(cell, a, kw))
    return ours, theirs


def tangent(arrays, seed=3):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.normal(size=a.shape)) for k, a in arrays.items()}


# --------------------------------------------------------------------------------------
# Sequences against the transcription


@pytest.mark.parametrize("cell, init, kw", CASES)
def test_sequence_equals_numpy_op_and_transcription(cell, init, kw):
    arrays = inputs(cell, **init)
    ours = gc_call(cell, arrays, kw)
    assert type(ours) is RESULTS[cell]
    assert all(isinstance(f, jax.Array) for f in ours)
    numpy = call_op(getattr(gc, f"{cell}_sequence"), cell,
                    {k: np.asarray(a) for k, a in arrays.items()}, kw)
    for a, b in zip(ours, numpy, strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    trees_close(tuple(ours), tuple(ref_result(cell, arrays, kw)))
    trees_close(tuple(jax.jit(lambda a: gc_call(cell, a, kw))(arrays)), tuple(numpy))


@pytest.mark.parametrize("cell, init, kw", CASES)
def test_grad_and_jit_grad(cell, init, kw):
    arrays = inputs(cell, **init)
    ours, theirs = fns(cell, arrays, kw)
    expected = jax.grad(theirs)(arrays)
    trees_close(jax.grad(ours)(arrays), expected)
    trees_close(jax.jit(jax.grad(ours))(arrays), expected)
    value, vjp = jax.vjp(ours, arrays)
    close(value, theirs(arrays))
    trees_close(vjp(2.0)[0], jax.tree_util.tree_map(lambda g: 2 * g, expected))


@pytest.mark.parametrize("cell, init, kw", CASES)
def test_jvp_and_jvp_of_jit(cell, init, kw):
    arrays = inputs(cell, **init)
    ours, theirs = fns(cell, arrays, kw)
    t = tangent(arrays)
    expected = jax.jvp(theirs, (arrays,), (t,))
    trees_close(jax.jvp(ours, (arrays,), (t,)), expected)
    trees_close(jax.jvp(jax.jit(ours), (arrays,), (t,)), expected)
    # the whole result's tangent, every field
    whole = jax.jvp(lambda a: tuple(gc_call(cell, a, kw)), (arrays,), (t,))[1]
    trees_close(whole, jax.jvp(lambda a: tuple(ref_result(cell, a, kw)), (arrays,), (t,))[1])


@pytest.mark.parametrize("cell, init, kw", CASES[2::3])
def test_vmap_and_vmap_of_grad(cell, init, kw):
    """vmap over x and the states (weights shared), and over everything."""
    arrays = inputs(cell, **init)
    other = inputs(cell, seed=1, **init)
    ours, theirs = fns(cell, arrays, kw)
    per_step = [n for n in arrays if n == "x" or n in STATES[cell]]
    batched = {k: jnp.stack([arrays[k], other[k]]) for k in arrays}
    axes = ({k: 0 if k in per_step else None for k in arrays},)
    some = {k: batched[k] if k in per_step else arrays[k] for k in arrays}
    for args, in_axes in ((some, axes), (batched, 0)):     # folded, then sequential
        trees_close(jax.vmap(ours, in_axes)(args), jax.vmap(theirs, in_axes)(args))
        trees_close(jax.jit(jax.vmap(jax.grad(ours), in_axes))(args),
                    jax.vmap(jax.grad(theirs), in_axes)(args))
    t = tangent(arrays)
    tangents = {k: jnp.stack([t[k], -t[k]]) for k in t}
    trees_close(jax.vmap(lambda d: jax.jvp(ours, (arrays,), (d,))[1])(tangents),
                jax.vmap(lambda d: jax.jvp(theirs, (arrays,), (d,))[1])(tangents))


def test_grad_of_vmap_and_jacobians():
    arrays = inputs("gru", reset_after=True)
    kw = {"reset_after": True, "seq_len": [4, 0, 5]}
    ours, theirs = fns("gru", arrays, kw)
    xs = jnp.stack([arrays["x"], 2 * arrays["x"]])

    def batched(f):
        return lambda w: jnp.sum(jax.vmap(lambda x: f({**arrays, "x": x, "w_c": w}))(xs))
    close(jax.grad(batched(ours))(arrays["w_c"]), jax.grad(batched(theirs))(arrays["w_c"]))

    def of_b(f):
        return lambda b: f({**arrays, "b_c": b})
    expected = jax.grad(of_b(theirs))(arrays["b_c"])
    close(jax.jacrev(of_b(ours))(arrays["b_c"]), expected)
    close(jax.jacfwd(of_b(ours))(arrays["b_c"]), expected)  # vmap of jvp, a weight mapped


# --------------------------------------------------------------------------------------
# Constants: seq_len and the masks as (traced) arrays; layouts


def test_traced_seq_len_and_masks_are_constants():
    arrays = inputs("lstm", peepholes=True)
    rng = np.random.default_rng(5)
    masks = {"input_mask": jnp.asarray(rng.integers(0, 2, (T, B, I)) * 2.0),
             "zoneout_h": jnp.asarray(rng.uniform(size=(T, B, H))),
             "recurrent_mask": jnp.asarray(rng.integers(0, 2, (B, H)) * 1.0)}
    seq_len = jnp.asarray([5, 1, 3])
    numpy = {k: np.asarray(a) for k, a in arrays.items()}
    names = ("x", "cs0", "h0", "w", "b")

    def loss(a, lengths, m):
        return loss_of("lstm", gj.lstm_sequence(*(a[n] for n in names), wci=a["wci"],
                                                wcf=a["wcf"], wco=a["wco"], seq_len=lengths,
                                                **m))
    seq = gc.lstm_sequence(*(numpy[n] for n in names), wci=numpy["wci"], wcf=numpy["wcf"],
                           wco=numpy["wco"], seq_len=np.asarray(seq_len),
                           **{k: np.asarray(m) for k, m in masks.items()})
    g = jax.jit(jax.grad(loss))(arrays, seq_len, masks)
    close(jax.jit(loss)(arrays, seq_len, masks), loss_of("lstm", seq))
    rng = np.random.default_rng(7)
    upstream = {f"d_{n}": rng.normal(size=getattr(seq, n).shape) for n in seq._fields}
    expected = gc.lstm_sequence_grad(*(numpy[n] for n in names), seq, wci=numpy["wci"],
                                     wcf=numpy["wcf"], wco=numpy["wco"], **upstream)
    for n in arrays:
        close(g[n], getattr(expected, n))
    lengths = jnp.stack([seq_len, jnp.asarray([0, 5, 2])])
    per_row = jax.vmap(jax.grad(loss), (None, 0, None))(arrays, lengths, masks)
    close(per_row["w"][0], g["w"])
    close(per_row["w"][1], jax.grad(loss)(arrays, lengths[1], masks)["w"])


def test_batch_first_and_cells():
    arrays = inputs("rnn")
    kw = {"activation": "tanh", "seq_len": [2, 5, 4]}
    ours, _ = fns("rnn", arrays, kw)
    first = {**arrays, "x": jnp.swapaxes(arrays["x"], 0, 1)}

    def bf(a):
        seq = gj.rnn_sequence(a["x"], a["h0"], a["w"], a["b"], batch_first=True, **kw)
        return loss_of("rnn", gc.RNNSequence(jnp.swapaxes(seq.h, 0, 1), seq.h_final))
    close(bf(first), ours(arrays))
    close(jax.grad(bf)(first)["x"], jnp.swapaxes(jax.grad(ours)(arrays)["x"], 0, 1))
    # one step of each cell against its transcribed step
    lstm = inputs("lstm", peepholes=True)
    gru = inputs("gru", reset_after=True)
    cells = [
        (lambda a: gj.lstm_cell(a["x"][0], a["cs0"], a["h0"], a["w"], a["b"], wci=a["wci"],
                                wcf=a["wcf"], wco=a["wco"], cell_clip=0.6),
         lambda a: gc.LSTMCellState(*lstm_step(a["x"][0], a["cs0"], a["h0"], a["w"], a["b"],
                                               a["wci"], a["wcf"], a["wco"],
                                               cell_clip=0.6)[1]), lstm),
        (lambda a: gj.gru_cell(a["x"][0], a["h0"], a["w_ru"], a["w_c"], a["b_ru"], a["b_c"],
                               reset_after=True),
         lambda a: gc.GRUCellState(*gru_step(a["x"][0], a["h0"], a["w_ru"], a["w_c"],
                                             a["b_ru"], a["b_c"], True)[1]), gru),
        (lambda a: gj.rnn_cell(a["x"][0], a["h0"], a["w"], a["b"], activation="relu"),
         lambda a: gc.RNNCellState(*rnn_step(a["x"][0], a["h0"], a["w"], a["b"],
                                             "relu")[1]), arrays),
    ]
    for ours_cell, ref_cell, a in cells:
        assert type(ours_cell(a)) is type(ref_cell(a))
        trees_close(tuple(ours_cell(a)), tuple(ref_cell(a)))
        t = tangent(a)
        trees_close(jax.jit(jax.grad(cell_loss(ours_cell)))(a),
                    jax.grad(cell_loss(ref_cell))(a))
        trees_close(jax.jvp(cell_loss(ours_cell), (a,), (t,)),
                    jax.jvp(cell_loss(ref_cell), (a,), (t,)))


def cell_loss(cell):
    """A scalar of every field of a cell step (the gates too, docs/spec.md §16.1)."""
    def loss(a):
        state = cell(a)
        return sum(jnp.sum(field * (k + 1) * jnp.arange(H)) for k, field in enumerate(state))
    return loss


# --------------------------------------------------------------------------------------
# Stacks: composed of the sequences; equal to gc's stacks and their gradients


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_stacks(cell):
    """Two bidirectional layers with lengths and a dropout mask: jit, grad (all inputs, the
    weights a list of weight sets), jvp and vmap."""
    rng = np.random.default_rng(11)

    def weight_set(n_in):
        if cell == "lstm":
            return gc.LSTMWeights(rng.normal(size=(n_in + H, 4 * H)) * 0.4,
                                  rng.normal(size=4 * H) * 0.1)
        if cell == "gru":
            return gc.GRUWeights(rng.normal(size=(n_in + H, 2 * H)) * 0.4,
                                 rng.normal(size=(n_in + H, H)) * 0.4,
                                 rng.normal(size=2 * H) * 0.1, rng.normal(size=2 * H) * 0.1)
        return gc.RNNWeights(rng.normal(size=(n_in + H, H)) * 0.4, rng.normal(size=H) * 0.1)
    weights = [weight_set(I), weight_set(I), weight_set(2 * H), weight_set(2 * H)]
    x = rng.normal(size=(T, B, I))
    states = [rng.normal(size=(4, B, H)) for _ in STATES[cell]]
    mask = rng.integers(0, 2, (B, 2 * H)) * 2.0
    kw = dict(bidirectional=True, seq_len=[5, 3, 1], dropout_masks=[mask])
    stack_np = getattr(gc, f"{cell}_stack")(x, *states, weights, **kw)
    jweights = jax.tree_util.tree_map(jnp.asarray, weights)
    op = getattr(gj, f"{cell}_stack")
    stack = jax.jit(lambda x, s, w: op(x, *s, w, **kw))(x, states, jweights)
    assert type(stack) is type(stack_np)
    close(stack.h, stack_np.h)
    close(stack.layers[1].h, stack_np.layers[1].h)
    d_h = rng.normal(size=stack_np.h.shape)
    d_final = rng.normal(size=stack_np.h_final.shape)

    def loss(x, s, w):
        out = op(x, *s, w, **kw)
        return jnp.sum(out.h * d_h) + jnp.sum(out.h_final * d_final)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, states, jweights)
    expected = getattr(gc, f"{cell}_stack_grad")(x, *states, weights, stack_np, d_h=d_h,
                                                 d_h_final=d_final)
    close(g[0], expected.x)
    close(g[1][-1], expected[len(states)])
    trees_close(g[2], expected.weights)
    dx = rng.normal(size=x.shape)
    _, d_stack = getattr(gc, f"{cell}_stack_jvp")(x, *states, weights,
                                                  (dx, *[None] * len(states), None), **kw)
    value, d_value = jax.jvp(lambda x: loss(x, states, jweights), (x,), (dx,))
    close(d_value, np.sum(d_stack.h * d_h) + np.sum(d_stack.h_final * d_final))
    xs = np.stack([x, -x])
    batched = jax.vmap(lambda x: loss(x, states, jweights))(xs)
    close(batched[0], value)


# --------------------------------------------------------------------------------------
# Bad input: gradcells's named errors, at trace time


def test_errors():
    a = inputs("lstm")
    args = [a[n] for n in ("x", "cs0", "h0", "w", "b")]
    with pytest.raises(ValueError, match="h0"):
        gj.lstm_sequence(args[0], args[1], args[2][:, :2], *args[3:])
    with pytest.raises(ValueError, match="activation"):
        r = inputs("rnn")
        jax.jit(lambda x: gj.rnn_sequence(x, r["h0"], r["w"], r["b"], activation="foo"))(r["x"])
    with pytest.raises(ValueError, match="seq_len"):
        gj.lstm_sequence(*args, seq_len=jnp.asarray([9, 1, 1]))
    with pytest.raises(ValueError, match="seq_len"):
        jax.jit(lambda s: gj.lstm_sequence(*args, seq_len=s))(jnp.asarray([1, 1]))
    with pytest.raises(TypeError, match="layer_norm"):
        gj.lstm_sequence(*args, layer_norm=(1, 2))
    with pytest.raises(TypeError, match="static"):
        gj.lstm_sequence(*args, cell_clip=jnp.asarray(0.5))
    with pytest.raises(ValueError, match="backend"):
        gj.lstm_sequence(*args, backend="nope")
    with pytest.raises(ValueError, match="input_mask"):
        gj.lstm_sequence(*args, input_mask=jnp.ones((T, B, I + 1)))
    with pytest.raises(TypeError):
        gj.lstm_sequence(*args[:4])
    with pytest.raises(TypeError, match="x must"):
        gj.lstm_sequence([[1.0]], *args[1:])
    with pytest.raises(TypeError, match="dtype"):
        gj.lstm_sequence(args[0].astype(int), *args[1:])
    with pytest.raises(ValueError, match="peepholes"):
        gj.lstm_cell(args[0][0], *args[1:], wci=args[1][0])
    with pytest.raises(TypeError, match="weights"):
        gj.lstm_stack(args[0], args[1][None], args[2][None], args[3])
    with pytest.raises(ValueError, match="dropout_masks"):
        gj.lstm_stack(args[0], args[1][None], args[2][None], [gc.LSTMWeights(*args[3:])],
                      dropout_masks=[jnp.ones(3)])
    # cotangents of zero for the gates are fine (vjp of the whole result)
    seq, vjp = jax.vjp(lambda x: gj.lstm_sequence(x, *args[1:]), args[0])
    ct = jax.tree_util.tree_map(jnp.zeros_like, seq)._replace(h=jnp.ones_like(seq.h))
    close(vjp(ct)[0], jax.grad(lambda x: jnp.sum(gj.lstm_sequence(x, *args[1:]).h))(args[0]))


def test_import_gradcells_does_not_import_jax():
    code = "import sys, gradcells; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------
# Second order: forward over reverse (gc.<op>_grad_jvp)


@pytest.mark.parametrize("cell, init, kw", CASES[1::4])
def test_jvp_of_grad_is_the_transcriptions_hessian_vector_product(cell, init, kw):
    arrays = inputs(cell, **init)
    ours, theirs = fns(cell, arrays, kw)
    v = tangent(arrays)
    expected = jax.jvp(jax.grad(theirs), (arrays,), (v,))
    trees_close(jax.jvp(jax.grad(ours), (arrays,), (v,)), expected)
    trees_close(jax.jit(lambda a, d: jax.jvp(jax.grad(ours), (a,), (d,)))(arrays, v), expected)


def test_hessian_and_unsupported_orders():
    a = inputs("rnn")

    def loss(f):
        return lambda b: loss_of("rnn", f({**a, "b": b}))
    ours = loss(lambda a: gj.rnn_sequence(a["x"], a["h0"], a["w"], a["b"], activation="tanh"))
    theirs = loss(lambda a: ref_result("rnn", a, {}))
    close(jax.hessian(ours)(a["b"]), jax.hessian(theirs)(a["b"]))
    with pytest.raises(NotImplementedError, match="grad of grad"):
        jax.grad(lambda b: jnp.sum(jax.grad(ours)(b) ** 2))(a["b"])
    with pytest.raises(NotImplementedError, match="jvp of jvp"):
        jax.jvp(lambda b: jax.jvp(ours, (b,), (b,))[1], (a["b"],), (a["b"],))


def test_vmap_folds_per_row_arrays_into_one_call(monkeypatch):
    """x and the states mapped, the weights shared: one call on N·B rows; a mapped weight:
    one call per index."""
    calls = []
    real = gc.rnn_sequence

    def counted(*args, **kwargs):
        calls.append(kwargs["x"].shape)
        return real(*args, **kwargs)
    monkeypatch.setattr(gc, "rnn_sequence", counted)
    a = inputs("rnn")
    xs = jnp.stack([a["x"]] * 4)
    lengths = jnp.asarray([[5, 1, 0]] * 4)
    out = jax.vmap(lambda x, n: gj.rnn_sequence(x, a["h0"], a["w"], a["b"], seq_len=n))(
        xs, lengths)
    assert calls == [(T, 4 * B, I)]
    close(out.h[3], real(*(np.asarray(a[n]) for n in ("x", "h0", "w", "b")),
                         seq_len=[5, 1, 0]).h)
    calls.clear()
    jax.vmap(lambda w: gj.rnn_sequence(a["x"], a["h0"], w, a["b"]))(jnp.stack([a["w"]] * 3))
    assert calls == [(T, B, I)] * 3


def test_projection_and_layer_norm_equal_gc():
    """The LSTM's projection and layer norm (weights gc's ops take as keywords, the norm an
    LSTMNorm of arrays): jit of grad and jvp equal gc's gradient and JVP."""
    rng = np.random.default_rng(2)
    p = 3
    x, cs0, h0 = (rng.normal(size=s) for s in ((T, B, I), (B, H), (B, p)))
    w, b, w_proj = rng.normal(size=(I + p, 4 * H)) * 0.3, rng.normal(size=4 * H), \
        rng.normal(size=(H, p))
    norm = gc.LSTMNorm(*(rng.normal(size=n) for n in (4 * H,) * 4 + (H,) * 2))
    kw = dict(w_proj=w_proj, proj_clip=0.8, ln_carry="normalized", seq_len=[4, 2, 5])
    seq = gc.lstm_sequence(x, cs0, h0, w, b, layer_norm=norm, **kw)

    def loss(x, w, norm):
        return jnp.sum(gj.lstm_sequence(x, cs0, h0, w, b, layer_norm=norm, **kw).h ** 2)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, norm)
    expected = gc.lstm_sequence_grad(x, cs0, h0, w, b, seq, d_h=2 * seq.h, layer_norm=norm,
                                     **kw)
    trees_close(g, (expected.x, expected.w, expected.layer_norm))
    _, d_seq = gc.lstm_sequence_jvp(x, cs0, h0, w, b, gc.LSTMSequenceGrads(
        x, None, None, w, None, layer_norm=norm), layer_norm=norm, **kw)
    close(jax.jvp(loss, (x, w, norm), (x, w, norm))[1], np.sum(2 * seq.h * d_seq.h))
