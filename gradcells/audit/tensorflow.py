"""The audit of TensorFlow's fused recurrent ops (``tf.raw_ops``): every check a function of a
seeded generator returning a ``Verdict``, importable and runnable alone.

TensorFlow's ops take float32 only (fault 10), so the truth for a gradient is the oracle's
central differences of gradcells's float64 forward, which the forward rows show equal to
TensorFlow's to float32 round-off, and TensorFlow's float32 gradient is the claim, checked
with the oracle's float32 tolerances. ``checks()`` imports TensorFlow (ImportError when it
is absent) and lists the rows in order.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

from .. import layouts, steps
from ..cells import OPS
from ..cells.lstm.spec import PEEPHOLES
from ..oracle import VJPReport, check_vjp
from ..testing.cases import gru_cell_case
from ._cases import f64, lstm_backprop, lstm_case, lstm_steps, sequence, sizes, stack
from ._engine import (
    FLOAT32_FORWARD,
    FLOAT32_GRADIENT,
    FLOAT64,
    Check,
    Outcome,
    Verdict,
    compare,
    judge,
    oracle_outcome,
    refused,
    worst_verdict,
)

CELL_ARGS = OPS["lstm_cell"].arrays[:5]                  # x, cs_prev, h_prev, w, b
GRU_ARGS = OPS["gru_cell"].arrays                        # x, h_prev, w_ru, w_c, b_ru, b_c
STEP_FIELDS = OPS["lstm_cell"].result._fields            # i, cs, f, o, ci, co, h
GRU_FIELDS = OPS["gru_cell"].result._fields              # r, u, c, h
KEPT_LSTM, KEPT_GRU = ("cs", "h"), ("h",)
"""The outputs whose upstream gradients TensorFlow's block gradients use (fault 11: the
seed's ``(_, cs_grad, _, _, _, _, h_grad) = grad`` and ``_, _, _, d_h = grad``,
``rnn_grad.py``'s ``_block_lstm_grad`` likewise); the others are the gate outputs."""


def import_tensorflow():
    """TensorFlow, imported quietly (no C++ INFO/WARNING lines)."""
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def _raw():
    return import_tensorflow().raw_ops


def tf_peepholes(case):
    """TensorFlow's peephole arguments: the vectors (zeros when off) and ``use_peephole``."""
    hidden = int(case["cs_prev"].shape[1])
    zeros = np.zeros(hidden, dtype=np.dtype(case["cs_prev"].dtype.name))
    on = case["wci"] is not None
    return {k: case[k] if on else zeros for k in PEEPHOLES}, on


# ---------------------------------------------------------------------------------------------
# LSTMBlockCell and gradcells's view of it


def block_cell(case, **attrs) -> list:
    peeps, on = tf_peepholes(case)
    out = _raw().LSTMBlockCell(x=case["x"], cs_prev=case["cs_prev"], h_prev=case["h_prev"],
                               w=case["w"], b=case["b"], use_peephole=on, **peeps, **attrs)
    return [o.numpy() for o in out]


def clip_attr(case) -> dict:
    return {"cell_clip": 0.0 if case["cell_clip"] is None else case["cell_clip"]}


def reference_cell(case, **overrides):
    args = {k: f64(case[k]) for k in CELL_ARGS + PEEPHOLES}
    attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}
    attrs.update(overrides)
    return steps.lstm_cell(**args, **attrs)


def state_pairs(tf_out, state) -> list:
    return list(zip(state._fields, tf_out, state, strict=True))


def lstm_forward(rng) -> Verdict:
    case = lstm_case(rng, np.float32, clip=bool(rng.integers(2)))
    out = block_cell(case, forget_bias=case["forget_bias"], **clip_attr(case))
    return Verdict(compare(state_pairs(out, reference_cell(case)), FLOAT32_FORWARD))


def lstm_documented_order(rng) -> Verdict:
    case = lstm_case(rng, np.float32)
    out = block_cell(case, forget_bias=case["forget_bias"], cell_clip=0.0)
    documented = dict(case)      # the docs: columns i, f, ci, o, which gradcells reads as
    documented["w"], documented["b"] = layouts.lstm_from_tf_v2(case["w"], case["b"])
    return judge(compare(state_pairs(out, reference_cell(documented)), FLOAT32_FORWARD),
                 lambda: compare(state_pairs(out, reference_cell(case)), FLOAT32_FORWARD))


def lstm_default_clip(rng) -> Verdict:
    case = lstm_case(rng, np.float32)
    case["cs_prev"] = (5 * case["cs_prev"]).astype(np.float32)   # |cs| past 3 somewhere
    out = block_cell(case, forget_bias=case["forget_bias"])      # cell_clip not passed
    truth = compare(state_pairs(out, reference_cell(case, cell_clip=None)), FLOAT32_FORWARD)
    return judge(truth, lambda: compare(
        state_pairs(out, reference_cell(case, cell_clip=3.0)), FLOAT32_FORWARD))


# ---------------------------------------------------------------------------------------------
# LSTMBlockCellGrad, assembled as the seed's wrapper does


def swapped(peeps: dict) -> dict:
    """The peepholes with wcf and wco exchanged, as the seed's wrapper passes them."""
    wci, wcf, wco = (peeps[k] for k in PEEPHOLES)
    return dict(zip(PEEPHOLES, (wci, wco, wcf), strict=True))


def block_cell_grad(case, state, d_cs, d_h, swap_peepholes=False) -> list:
    """The gradient of every input, as the seed's ``_LSTMBlockCellGrad`` builds it (with
    ``swap_peepholes``, passing wcf and wco swapped as the seed does)."""
    tf = import_tensorflow()
    peeps, on = tf_peepholes(case)
    peeps = swapped(peeps) if swap_peepholes else peeps
    x, h_prev, w = case["x"], case["h_prev"], case["w"]
    cs_prev_grad, dicfo, *peephole_grads = tf.raw_ops.LSTMBlockCellGrad(
        x=x, cs_prev=case["cs_prev"], h_prev=h_prev, w=w, b=case["b"], **peeps,
        **dict(zip(STEP_FIELDS[:6], state[:6], strict=True)),
        cs_grad=d_cs, h_grad=d_h, use_peephole=on)
    xh_grad = tf.matmul(dicfo, w, transpose_b=True)
    n_in = x.shape[1]
    w_grad = tf.matmul(tf.concat([x, h_prev], 1), dicfo, transpose_a=True)
    grads = [xh_grad[:, :n_in], cs_prev_grad, xh_grad[:, n_in:], w_grad,
             tf.reduce_sum(dicfo, 0)] + (peephole_grads if on else [])
    return [g.numpy() for g in grads]


def cell_names(case) -> tuple[str, ...]:
    return CELL_ARGS + (PEEPHOLES if case["wci"] is not None else ())


def gradcells_cell(attrs, *arrays, fields=KEPT_LSTM):
    """``fields`` (by default ``(cs, h)``) of gradcells's reference cell for arrays ``x,
    cs_prev, h_prev, w, b[, wci, wcf, wco]``."""
    # strict=False: the peepholes follow only when the case has them
    peepholes = dict(zip(PEEPHOLES, arrays[5:], strict=False))
    state = steps.lstm_cell(*arrays[:5], **peepholes, **attrs, backend="reference")
    return tuple(getattr(state, k) for k in fields)


def tf_cell_vjp(case, swap_peepholes, ct, *arrays) -> list:
    """TensorFlow's claimed vjp of ``gradcells_cell`` for the case (its arrays as given)."""
    state = block_cell(case, forget_bias=case["forget_bias"], **clip_attr(case))
    return block_cell_grad(case, state, ct[0], ct[1], swap_peepholes)


def lstm_grad_oracle(case, swap_peepholes=False) -> VJPReport:
    """The oracle's report on TensorFlow's gradient for ``case`` (float32 arrays)."""
    names = cell_names(case)
    attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}
    return check_vjp(functools.partial(gradcells_cell, attrs),
                     functools.partial(tf_cell_vjp, case, swap_peepholes),
                     [case[n] for n in names], names=names, seed=case["_seed"])


def reference_cell_grad(case, ct, clip_grad="exact", swap_peepholes=False) -> list:
    args = {k: f64(case[k]) for k in CELL_ARGS}
    peeps = {k: f64(case[k]) for k in PEEPHOLES}
    state = steps.lstm_cell(**args, **peeps, forget_bias=case["forget_bias"],
                            cell_clip=case["cell_clip"])
    peeps = swapped(peeps) if swap_peepholes else peeps
    g = steps.lstm_cell_grad(*args.values(), state, d_cs=f64(ct[0]), d_h=f64(ct[1]),
                             **peeps, cell_clip=case["cell_clip"], clip_grad=clip_grad)
    return [a for a in g if a is not None]


def grad_vs_model(case, tf_grads, **model) -> Outcome:
    # strict=False: without peepholes the reference's gradients stop at b
    return compare(zip(CELL_ARGS + PEEPHOLES, tf_grads,
                       reference_cell_grad(case, case["_cotangent"], **model), strict=False),
                   FLOAT32_GRADIENT)


def with_cotangent(case, rng):
    hidden = case["cs_prev"].shape
    case["_cotangent"] = tuple(rng.standard_normal(hidden).astype(np.float32)
                               for _ in range(2))
    case["_seed"] = int(rng.integers(2**31))
    return case


def tf_grads_for(case, swap_peepholes=False) -> list:
    state = block_cell(case, forget_bias=case["forget_bias"], **clip_attr(case))
    return block_cell_grad(case, state, *case["_cotangent"], swap_peepholes)


def lstm_grad_vs_oracle(rng) -> Verdict:
    case = with_cotangent(lstm_case(rng, np.float32, clip=False), rng)
    return Verdict(oracle_outcome(lstm_grad_oracle(case)))


def lstm_grad_vs_gradcells(rng) -> Verdict:
    case = with_cotangent(lstm_case(rng, np.float32, clip=False), rng)
    return Verdict(grad_vs_model(case, tf_grads_for(case)))


def lstm_grad_clipped(rng) -> Verdict:
    case = with_cotangent(lstm_case(rng, np.float32, clip=True), rng)
    if case["cell_clip"] is None:        # nothing to clip in this draw: still a check
        return Verdict(oracle_outcome(lstm_grad_oracle(case)))
    return judge(oracle_outcome(lstm_grad_oracle(case)),
                 lambda: grad_vs_model(case, tf_grads_for(case),
                                       clip_grad="straight_through"))


def lstm_grad_seed_wrapper(rng) -> Verdict:
    case = with_cotangent(lstm_case(rng, np.float32, clip=False, peephole=True), rng)
    return judge(oracle_outcome(lstm_grad_oracle(case, swap_peepholes=True)),
                 lambda: grad_vs_model(case, tf_grads_for(case, swap_peepholes=True),
                                       swap_peepholes=True))


# ---------------------------------------------------------------------------------------------
# GRUBlockCell


def gru_case(rng):
    return gru_cell_case(rng, dtype=np.float32, reset_after=False, **sizes(rng))


def gru_block(case) -> list:
    return [o.numpy() for o in _raw().GRUBlockCell(**{n: case[n] for n in GRU_ARGS})]


def gru_block_grad(case, d_h) -> list:
    """Every input's gradient, as the seed's ``_GRUBlockCellGrad`` code builds it."""
    tf = import_tensorflow()
    r, u, c, _ = gru_block(case)
    x, h_prev = case["x"], case["h_prev"]
    d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = tf.raw_ops.GRUBlockCellGrad(
        **{n: case[n] for n in GRU_ARGS}, r=r, u=u, c=c, d_h=d_h)
    d_w_ru = tf.matmul(tf.concat([x, h_prev], 1), d_r_bar_u_bar, transpose_a=True)
    d_w_c = tf.matmul(tf.concat([x, h_prev * r], 1), d_c_bar, transpose_a=True)
    return [g.numpy() for g in (d_x, d_h_prev, d_w_ru, d_w_c,
                                tf.reduce_sum(d_r_bar_u_bar, 0), tf.reduce_sum(d_c_bar, 0))]


def gru_reference(case):
    return steps.gru_cell(*(f64(case[n]) for n in GRU_ARGS))


def gru_forward(rng) -> Verdict:
    case = gru_case(rng)
    return Verdict(compare(zip(GRU_FIELDS, gru_block(case), gru_reference(case), strict=True),
                           FLOAT32_FORWARD))


def gru_grad_vs_oracle(rng) -> Verdict:
    case = gru_case(rng)
    report = check_vjp(lambda *a: steps.gru_cell(*a, backend="reference").h,
                       lambda ct, *a: gru_block_grad(case, ct),
                       [case[n] for n in GRU_ARGS], names=GRU_ARGS,
                       seed=int(rng.integers(2**31)))
    return Verdict(oracle_outcome(report))


def gru_grad_vs_gradcells(rng) -> Verdict:
    case = gru_case(rng)
    d_h = rng.standard_normal(case["h_prev"].shape).astype(np.float32)
    args = [f64(case[n]) for n in GRU_ARGS]
    truth = steps.gru_cell_grad(*args, steps.gru_cell(*args), d_h=f64(d_h))
    return Verdict(compare(zip(GRU_ARGS, gru_block_grad(case, d_h), truth, strict=True),
                           FLOAT32_GRADIENT))


# ---------------------------------------------------------------------------------------------
# BlockLSTM / BlockLSTMV2


def seq_case(rng, version):
    case = lstm_case(rng, np.float32, clip=False)
    if version == 2:
        case["forget_bias"] = 0.0
        case["w"], case["b"] = layouts.lstm_to_tf_v2(case["w"], case["b"])
    case["x"] = sequence(rng, case, np.float32)
    return case


def block_lstm(case, version, arrays=None, seq_len_max=None):
    raw, arrays = _raw(), dict(case, **(arrays or {}))
    peeps, on = tf_peepholes(arrays)
    steps = arrays["x"].shape[0] if seq_len_max is None else seq_len_max
    common = dict(seq_len_max=np.int64(steps), **{k: arrays[k] for k in CELL_ARGS},
                  use_peephole=on, **peeps)
    if version == 1:
        return raw.BlockLSTM(**common, forget_bias=case["forget_bias"], cell_clip=0.0)
    return raw.BlockLSTMV2(**common)


def gradcells_weights(arrays, version):
    """``(w, b)`` in gradcells's layout for the case's layout (V2: i, f, ci, o)."""
    if version == 2:
        return layouts.lstm_from_tf_v2(arrays["w"], arrays["b"])
    return arrays["w"], arrays["b"]


def gradcells_states(case, version, arrays):
    """Every step's state of gradcells over ``arrays`` (in ``case``'s weight layout)."""
    w, b = gradcells_weights(arrays, version)
    return lstm_steps(arrays["x"], arrays["cs_prev"], arrays["h_prev"], w, b,
                      **{k: arrays.get(k) for k in PEEPHOLES}, forget_bias=case["forget_bias"])


def gradcells_seq(case, version, arrays, fields=KEPT_LSTM):
    """``fields`` (by default cs, h) of every step, gradcells in the arrays' dtype."""
    states = gradcells_states(case, version, arrays)
    return tuple(stack(states, k) for k in fields)


def seq_forward(rng, version) -> Verdict:
    """BlockLSTM's (``version`` 1) or BlockLSTMV2's (2) forward against gradcells's."""
    case = seq_case(rng, version)
    out = [o.numpy() for o in block_lstm(case, version)]
    states = gradcells_states(case, version, {k: f64(case[k]) for k in CELL_ARGS + PEEPHOLES})
    return Verdict(compare([(n, o, stack(states, n))
                            for n, o in zip(STEP_FIELDS, out, strict=True)],
                           FLOAT32_FORWARD))


def tape_grads(case, version, ct, fields=KEPT_LSTM) -> list:
    """``tf.GradientTape``'s gradient of every input for upstream gradients ``ct`` of the
    outputs ``fields`` (by default cs, h)."""
    tf = import_tensorflow()
    names = cell_names(case)
    tensors = [tf.constant(case[n]) for n in names]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = block_lstm(case, version, dict(zip(names, tensors, strict=True)))
    grads = tape.gradient([getattr(out, k) for k in fields], tensors,
                          output_gradients=list(ct))
    return [None if g is None else g.numpy() for g in grads]


def seq_forward_of(case, version, fields=KEPT_LSTM):
    """``f`` for the oracle: ``gradcells_seq`` of the case's arrays, in ``cell_names`` order."""
    names = cell_names(case)
    return lambda *arrays: gradcells_seq(case, version, dict(zip(names, arrays, strict=True)),
                                         fields)


def seq_oracle(case, version, vjp) -> VJPReport:
    names = cell_names(case)
    return check_vjp(seq_forward_of(case, version), vjp, [case[n] for n in names],
                     names=names, seed=int(case["_seed"]))


def seq_case_with_cotangent(rng, version):
    case = seq_case(rng, version)
    shape = case["x"].shape[:2] + (case["cs_prev"].shape[1],)
    case["_cotangent"] = tuple(rng.standard_normal(shape).astype(np.float32)
                               for _ in range(2))
    case["_seed"] = int(rng.integers(2**31))
    return case


def v1_tape_gradient(rng) -> Verdict:
    case = seq_case_with_cotangent(rng, 1)
    return Verdict(oracle_outcome(seq_oracle(case, 1, lambda ct, *a: tape_grads(case, 1, ct))))


def v1_order_model(case) -> Outcome:
    """Fault 6's model: the V1 gradient op reads V2's weights (i, f, ci, o) as if they were
    i, ci, f, o: backpropagation through the true states with the weight matrix as is."""
    a = {k: f64(case[k]) for k in CELL_ARGS + PEEPHOLES}
    peeps = {k: a[k] for k in PEEPHOLES}
    w, b = layouts.lstm_from_tf_v2(a["w"], a["b"])
    states = lstm_steps(a["x"], a["cs_prev"], a["h_prev"], w, b, **peeps)
    model = lstm_backprop(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], states,
                          *(f64(c) for c in case["_cotangent"]), **peeps,
                          clip_grad="straight_through")
    return compare(zip(cell_names(case), tape_grads(case, 2, case["_cotangent"]), model,
                       strict=True),
                   FLOAT32_GRADIENT)


def v2_tape_gradient(rng) -> Verdict:
    case = seq_case_with_cotangent(rng, 2)
    report = seq_oracle(case, 2, lambda ct, *a: tape_grads(case, 2, ct))
    return judge(oracle_outcome(report), lambda: v1_order_model(case))


def v2_grad_op_vjp(case, ct) -> list:
    """TensorFlow's ``BlockLSTMGradV2`` for the case's forward and cotangent ``(cs, h)``."""
    out = block_lstm(case, 2)
    peeps, on = tf_peepholes(case)
    grads = _raw().BlockLSTMGradV2(
        seq_len_max=np.int64(case["x"].shape[0]), **{k: case[k] for k in CELL_ARGS}, **peeps,
        **dict(zip(STEP_FIELDS, out, strict=True)), cs_grad=ct[0], h_grad=ct[1], use_peephole=on)
    x_g, cs_g, h_g, w_g, wci_g, wcf_g, wco_g, b_g = (g.numpy() for g in grads)
    return [x_g, cs_g, h_g, w_g, b_g] + ([wci_g, wcf_g, wco_g] if on else [])


def v2_grad_op(rng) -> Verdict:
    case = seq_case_with_cotangent(rng, 2)
    return Verdict(oracle_outcome(seq_oracle(case, 2, lambda ct, *a: v2_grad_op_vjp(case, ct))))


def past_seq_len_max(rng) -> Verdict:
    case = seq_case(rng, 1)
    steps = case["x"].shape[0]
    case["x"] = np.concatenate([case["x"], case["x"][-1:]])      # at least one step past
    seq_len_max = int(rng.integers(0, steps))
    out = [o.numpy()[seq_len_max:] for o in block_lstm(case, 1, seq_len_max=seq_len_max)]
    zeros = [(n, o, np.zeros_like(o)) for n, o in zip(STEP_FIELDS, out, strict=True)]
    truth = compare(zeros, (0.0, 0.0))
    return judge(truth, lambda: compare([z for z in zeros if z[0] in ("cs", "h")], (0.0, 0.0)))


# ---------------------------------------------------------------------------------------------
# A loss on every output, the gate outputs too (fault 11)


def gates_zeroed(forward, fields, kept, *arrays) -> tuple:
    """``forward(*arrays)`` with its outputs but ``kept`` zeroed: fault 11's model, for the
    oracle, of a gradient that drops the gate outputs' upstream gradients."""
    return tuple(v if k in kept else 0 * v
                 for k, v in zip(fields, forward(*arrays), strict=True))


def every_output_oracle(forward, vjp, args, names, fields, kept, seed) -> Verdict:
    """The oracle's check of ``vjp`` for a loss on every one of ``forward``'s ``fields`` (its
    default cotangent, drawn from ``seed``, on each); on a mismatch, fault 11's model: the
    same claim checked against ``gates_zeroed``. No gradcells gradient is compared."""
    check = functools.partial(check_vjp, vjp=vjp, args=args, names=names, seed=seed)
    model = functools.partial(gates_zeroed, forward, fields, kept)
    return judge(oracle_outcome(check(forward)), lambda: oracle_outcome(check(model)))


def seed_cell_grad(case, grad) -> list:
    """The seed's ``_LSTMBlockCellGrad`` given ``grad``, the upstream gradient of every output
    (peepholes named in the op's order: fault 4 is another row's)."""
    (_, cs_grad, _, _, _, _, h_grad) = grad                     # the seed's line
    state = block_cell(case, forget_bias=case["forget_bias"], **clip_attr(case))
    return block_cell_grad(case, state, cs_grad, h_grad)


def lstm_every_output(rng) -> Verdict:
    case = lstm_case(rng, np.float32, clip=False)
    names = cell_names(case)
    attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}
    forward = functools.partial(gradcells_cell, attrs, fields=STEP_FIELDS)
    return every_output_oracle(forward, lambda ct, *a: seed_cell_grad(case, ct),
                               [case[n] for n in names], names, STEP_FIELDS, KEPT_LSTM,
                               int(rng.integers(2**31)))


def seed_gru_grad(case, grad) -> list:
    """The seed's ``_GRUBlockCellGrad`` given the upstream gradient of every output."""
    _, _, _, d_h = grad                                         # the seed's line
    return gru_block_grad(case, d_h)


def gru_every_output(rng) -> Verdict:
    case = gru_case(rng)
    return every_output_oracle(lambda *a: tuple(steps.gru_cell(*a, backend="reference")),
                               lambda ct, *a: seed_gru_grad(case, ct),
                               [case[n] for n in GRU_ARGS], GRU_ARGS, GRU_FIELDS, KEPT_GRU,
                               int(rng.integers(2**31)))


def v1_every_output(rng) -> Verdict:
    case = seq_case(rng, 1)
    names = cell_names(case)
    return every_output_oracle(seq_forward_of(case, 1, STEP_FIELDS),
                               lambda ct, *a: tape_grads(case, 1, ct, STEP_FIELDS),
                               [case[n] for n in names], names, STEP_FIELDS, KEPT_LSTM,
                               int(rng.integers(2**31)))


# ---------------------------------------------------------------------------------------------
# What TensorFlow does not offer


def _float64_attempts(rng):
    """``(op, call, judge)`` for each op given float64 inputs."""
    case64 = lstm_case(rng, np.float64)
    gru64 = gru_cell_case(rng, dtype=np.float64, **sizes(rng))
    seq64 = dict(case64, x=sequence(rng, case64, np.float64))
    truth_v2 = {k: seq64[k] for k in CELL_ARGS + PEEPHOLES}
    return [
        ("LSTMBlockCell", lambda: block_cell(case64, forget_bias=case64["forget_bias"],
                                             cell_clip=0.0),
         lambda out: compare(state_pairs(out, reference_cell(case64, cell_clip=None)),
                             FLOAT64)),
        ("GRUBlockCell", lambda: gru_block(gru64),
         lambda out: compare(zip(GRU_FIELDS, out, gru_reference(gru64), strict=True), FLOAT64)),
        ("BlockLSTMV2", lambda: [o.numpy() for o in block_lstm(seq64, 2)],
         lambda out: compare([("h", out[6], gradcells_seq(
             dict(seq64, forget_bias=0.0), 2, truth_v2)[1])], FLOAT64)),
    ]


def float64_inputs(rng) -> Verdict:
    errors = import_tensorflow().errors
    verdicts = []
    for name, call, judge_output in _float64_attempts(rng):
        try:
            out = call()
        except (errors.InvalidArgumentError, errors.NotFoundError) as error:
            reason = str(error).splitlines()[0].split(";")[0][:90]
            verdicts.append(refused(name, f"{type(error).__name__} ({name}: {reason})"))
            continue
        verdicts.append(Verdict(judge_output(out)))
    return worst_verdict(verdicts)


def _lstm_cell_h(lstm, x):
    state = _raw().LSTMBlockCell(x=x, **{k: lstm[k] for k in CELL_ARGS[1:]},
                                 **tf_peepholes(lstm)[0], forget_bias=lstm["forget_bias"],
                                 cell_clip=0.0)
    return state[6]


def _gru_cell_h(gru, x):
    return _raw().GRUBlockCell(x=x, **{k: gru[k] for k in GRU_ARGS[1:]})[3]


def _true_x_gradient(name, lstm, gru):
    """gradcells's float64 gradient of ``sum(h)`` with respect to ``x``."""
    if name == "LSTMBlockCell":
        args = {k: f64(lstm[k]) for k in CELL_ARGS}
        peeps = {k: f64(lstm[k]) for k in PEEPHOLES}
        state = steps.lstm_cell(**args, **peeps, forget_bias=lstm["forget_bias"])
        return steps.lstm_cell_grad(*args.values(), state, d_h=np.ones_like(state.h),
                                    **peeps).x
    args = [f64(gru[n]) for n in GRU_ARGS]
    state = steps.gru_cell(*args)
    return steps.gru_cell_grad(*args, state, d_h=np.ones_like(state.h)).x


def registered_gradient(rng) -> Verdict:
    tf = import_tensorflow()
    lstm = lstm_case(rng, np.float32, peephole=False)
    gru = gru_case(rng)
    verdicts = []
    for name, case, call in (("LSTMBlockCell", lstm, _lstm_cell_h),
                             ("GRUBlockCell", gru, _gru_cell_h)):
        x = tf.constant(case["x"])
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = call(case, x)
        try:
            grad = tape.gradient(h, x).numpy()
        except LookupError as error:
            verdicts.append(refused(name, f"LookupError ({error})"))
            continue
        truth = _true_x_gradient(name, lstm, gru)
        verdicts.append(Verdict(compare([("x", grad, truth)], FLOAT32_GRADIENT)))
    return worst_verdict(verdicts)


# ---------------------------------------------------------------------------------------------
# The rows


SECTION = "TensorFlow"
"""The framework's name, as the audit's title (and its docs/audit.md section) begins."""

CHECKS = (
    Check("LSTMBlockCell forward", lstm_forward),
    Check("LSTMBlockCell forward, gates as documented (i, f, ci, o)", lstm_documented_order,
          fault=1),
    Check("LSTMBlockCell forward, default cell_clip vs none", lstm_default_clip, fault=2),
    Check("LSTMBlockCellGrad vs oracle", lstm_grad_vs_oracle),
    Check("LSTMBlockCellGrad vs gradcells", lstm_grad_vs_gradcells),
    Check("LSTMBlockCellGrad, clipping active, vs oracle", lstm_grad_clipped, fault=3),
    Check("seed _LSTMBlockCellGrad wrapper (peepholes) vs oracle", lstm_grad_seed_wrapper,
          fault=4),
    Check("GRUBlockCell forward", gru_forward),
    Check("GRUBlockCellGrad (+ seed wrapper) vs oracle", gru_grad_vs_oracle),
    Check("GRUBlockCellGrad (+ seed wrapper) vs gradcells", gru_grad_vs_gradcells),
    Check("BlockLSTM forward", lambda rng: seq_forward(rng, 1)),
    Check("BlockLSTMV2 forward (via layouts.lstm_from_tf_v2)", lambda rng: seq_forward(rng, 2)),
    Check("BlockLSTM gradient (GradientTape) vs oracle", v1_tape_gradient),
    Check("BlockLSTMV2 gradient (GradientTape) vs oracle", v2_tape_gradient, fault=6),
    Check("BlockLSTMGradV2 op vs oracle", v2_grad_op),
    Check("BlockLSTM outputs past seq_len_max are zero", past_seq_len_max, fault=8),
    Check("float64 inputs (LSTMBlockCell, GRUBlockCell, BlockLSTMV2)", float64_inputs,
          fault=10, cases=1),
    Check("registered gradient (LSTMBlockCell, GRUBlockCell)", registered_gradient,
          fault=9, cases=1),
    Check("seed _LSTMBlockCellGrad, a loss on every output, vs oracle", lstm_every_output,
          fault=11),
    Check("seed _GRUBlockCellGrad, a loss on every output, vs oracle", gru_every_output,
          fault=11),
    Check("BlockLSTM gradient (GradientTape), a loss on every output, vs oracle",
          v1_every_output, fault=11),
)
"""Every TensorFlow row, in order."""


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the TensorFlow audit; ImportError without TensorFlow."""
    tf = import_tensorflow()
    devices = [d.device_type for d in tf.config.list_physical_devices()]
    footer = ["not checked here: fault 5 (a docstring; the notebooks derive the right formulas)"]
    if "GPU" not in devices:
        footer.append("not checked here: fault 7 (GPU kernel; this TensorFlow sees no GPU)")
    title = f"gradcells audit of {SECTION} {tf.__version__} ({', '.join(sorted(set(devices)))})"
    return title, CHECKS, footer
