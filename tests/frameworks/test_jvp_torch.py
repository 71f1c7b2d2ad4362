"""Conformance of forward mode and second order (docs/spec.md §12) with PyTorch's
``torch.func``, float64.

What is held to what:

1. **Forward mode.** ``gc.<op>_jvp``'s result and its tangent, every field, against
   ``torch.func.jvp`` of a transcription of the op in torch ops, written here from the spec
   (§2, §3, §9.1-§9.3, §11.1-§11.3), not from gradcells's code: the LSTM with peepholes,
   ``cell_clip`` (``torch.clamp``), a projection with ``proj_clip``, a layer norm
   (``F.layer_norm``, both ``ln_carry``); the GRU reset before and after; the plain RNN,
   tanh and relu; over sequences with ragged lengths (0 and T included; PyTorch's packed
   semantics: a finished row's outputs zero, its state frozen), ``reverse`` (the per-row
   time reversal ``π_b``), ``batch_first``, every mask as an explicit array (``input_mask``,
   ``recurrent_mask``, ``zoneout_h``, ``zoneout_cs``), and empty sizes (T, B or I of 0).
   The cases are Hypothesis-drawn by ``gc.testing``'s strategies (every option drawn) and
   seeded for each option with each order; their clip levels keep a margin from every
   unclipped value and their relu pre-activations keep away from 0, so both sides take the
   same branch. The stacks (``lstm/gru/rnn_stack_jvp``) are held to ``torch.nn.LSTM/GRU/RNN``
   themselves through ``torch.func.functional_call`` on packed ragged batches (weights and
   their tangents converted by ``gc.layouts.stack_from_torch``, which is linear, so a
   converted tangent is the tangent of the converted weights), and, for what the modules
   cannot hold (lengths of 0, dropout masks, peepholes, a layer norm), to a stack of the
   transcription's sequences. Two PyTorch limits shape the module test: its
   ``pack_padded_sequence`` has no forward-mode derivative (the batch is packed here by
   gathers, checked bit for bit against it), and ``_VF.lstm`` on a packed batch cannot take
   functorch's wrapper tensors, so that test uses ``torch.autograd.forward_ad``'s dual
   tensors, PyTorch's other forward mode.
2. **Forward over reverse.** ``gc.<op>_grad_jvp``'s gradient and its tangent against
   ``torch.func.jvp(torch.func.grad(loss))`` for ``loss = Σ <ct, outputs>`` over every
   upstream field (``d_h``, ``d_cs``, ``d_h_final``, ``d_cs_final``), the cotangents inputs
   of their own with tangents (``d_h_tangent``, ...), for the cell and sequence ops with the
   same options; and ``clip_grad="straight_through"`` through both clips, whose torch side
   is a ``torch.autograd.Function`` (clamp forward, identity backward, clamp's JVP).
3. **The Hessian-vector product** ``gc.hessian_vector_product`` of a squared loss through a
   GRU and an RNN sequence (tanh, relu; full and packed) against
   ``torch.autograd.functional.hvp`` through ``nn.GRU`` and ``nn.RNN`` (as
   tests/contracts/test_curvature.py does for ``nn.LSTM``), and the loss's gradient with it.

Tolerance: both sides evaluate the same float64 formulas in different orders, so they agree
to round-off: ``TOL`` is ``rtol=1e-10`` with ``atol=1e-12`` (the tangents grow along the
chain of steps, and an element that cancels to ~0 keeps only the absolute round-off of its
summands). Measured over the whole file under ``HYPOTHESIS_PROFILE=ci``: no element used
more than 4% of its bound; the error of each field relative to its largest value was at
most 1.3e-13 in forward mode and 8e-14 in second order (above that only for fields whose
values are themselves ~1e-3, at absolute errors below 3e-13); the largest absolute error
was 2.3e-12, a second-order tangent of size ~10² (an LSTM sequence with a layer norm and
both clips).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells import layouts
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.cells.lstm.spec import NORM_FIELDS
from gradcells.testing import (
    gru_cell_inputs,
    gru_sequence_inputs,
    lstm_cell_inputs,
    lstm_sequence_inputs,
    rnn_cell_inputs,
    rnn_sequence_inputs,
)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.conformance

TOL = {"rtol": 1e-10, "atol": 1e-12}
F = torch.nn.functional
UPSTREAM_FIELDS = {name: name.removeprefix("d_") for op in OPS for name in OPS[op].upstream}
"""Each upstream gradient's field: every field of a result has one (docs/spec.md §16.1)."""


def close(actual, expected, what):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), err_msg=what, **TOL)


def as_tensor(a):
    return None if a is None else torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64)


# -- the ops in torch ops, from the spec ----------------------------------------------------------


def _ln(z, gamma, beta, eps):
    return F.layer_norm(z, (z.shape[-1],), gamma, beta, eps)


class StraightThroughClamp(torch.autograd.Function):
    """``clamp`` whose backward passes the gradient unchanged (``clip_grad=
    "straight_through"``, TensorFlow's) and whose forward-mode derivative is ``clamp``'s
    (zero where the clip is active, passing on the boundary): the straight-through gradient
    of the true forward. (``z + (clamp(z) - z).detach()`` would give the right gradient but,
    under forward over reverse, the unclipped tangent.)"""

    @staticmethod
    def forward(z, level):
        return torch.clamp(z, -level, level)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.passes = inputs[0].abs() <= inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad, None

    @staticmethod
    def jvp(ctx, dz, _):
        return dz * ctx.passes


def clip(z, level, case):
    """The clip of ``z`` to ``[-level, level]`` with the case's ``clip_grad``."""
    if case.get("clip_grad", "exact") == "exact":
        return torch.clamp(z, -level, level)
    return StraightThroughClamp.apply(z, level)


def lstm_step(p, case, x, cs_prev, h_prev, m_rec=None, z_cs=None, z_h=None):
    """One LSTM step (docs/spec.md §2, §9.1, §9.2, §11.3) from the tensors ``p`` by name:
    ``(i, cs, f, o, ci, co, h)``. The recurrent matmul reads ``h_prev∘m_rec``; zoneout mixes
    the new ``cs`` and the projected ``h`` with the old states after the cell."""
    n_in = x.shape[-1]
    h_seen = h_prev if m_rec is None else h_prev * m_rec
    eps = case.get("ln_epsilon", 1e-5)
    if "gamma_x" in p:
        gates = (_ln(x @ p["w"][:n_in], p["gamma_x"], p["beta_x"], eps)
                 + _ln(h_seen @ p["w"][n_in:], p["gamma_h"], p["beta_h"], eps) + p["b"])
    else:
        gates = torch.cat([x, h_seen], -1) @ p["w"] + p["b"]
    gi, gc_, gf, go = gates.chunk(4, -1)
    peep = "wci" in p
    i = torch.sigmoid(gi + cs_prev * p["wci"] if peep else gi)
    ci = torch.tanh(gc_)
    f = torch.sigmoid(gf + case["forget_bias"] + (cs_prev * p["wcf"] if peep else 0))
    cs = i * ci + f * cs_prev
    if case.get("cell_clip") is not None:
        cs = clip(cs, case["cell_clip"], case)
    if "gamma_c" in p:
        normed = _ln(cs, p["gamma_c"], p["beta_c"], eps)
        co = torch.tanh(normed)
        if case.get("ln_carry", "raw") == "normalized":
            cs = normed
    else:
        co = torch.tanh(cs)
    o = torch.sigmoid(go + cs * p["wco"] if peep else go)
    h = o * co
    if "w_proj" in p:
        h = h @ p["w_proj"]
        if case.get("proj_clip") is not None:
            h = clip(h, case["proj_clip"], case)
    if z_cs is not None:
        cs = z_cs * cs_prev + (1 - z_cs) * cs
    if z_h is not None:
        h = z_h * h_prev + (1 - z_h) * h
    return (i, cs, f, o, ci, co, h), (cs, h)


def gru_step(p, case, x, h_prev, m_rec=None, z_h=None):
    """One GRU step (docs/spec.md §3, §11.3): ``(r, u, c, h)``; the matmuls read
    ``h_prev∘m_rec``, the interpolation the unmasked ``h_prev``."""
    n_in, n_hidden = x.shape[-1], h_prev.shape[-1]
    h_seen = h_prev if m_rec is None else h_prev * m_rec
    r, u = torch.sigmoid(torch.cat([x, h_seen], -1) @ p["w_ru"] + p["b_ru"]).chunk(2, -1)
    if case["reset_after"]:
        c = torch.tanh(x @ p["w_c"][:n_in] + p["b_c"][:n_hidden]
                       + r * (h_seen @ p["w_c"][n_in:] + p["b_c"][n_hidden:]))
    else:
        c = torch.tanh(torch.cat([x, r * h_seen], -1) @ p["w_c"] + p["b_c"])
    h = u * h_prev + (1 - u) * c
    if z_h is not None:
        h = z_h * h_prev + (1 - z_h) * h
    return (r, u, c, h), (h,)


def rnn_step(p, case, x, h_prev, m_rec=None, z_h=None):
    """One plain RNN step (docs/spec.md §9.3): ``(h,)``, ``act([x, h_prev∘m_rec]·w + b)``."""
    h_seen = h_prev if m_rec is None else h_prev * m_rec
    z = torch.cat([x, h_seen], -1) @ p["w"] + p["b"]
    h = torch.tanh(z) if case["activation"] == "tanh" else torch.relu(z)
    if z_h is not None:
        h = z_h * h_prev + (1 - z_h) * h
    return (h,), (h,)


STEPS = {"lstm": lstm_step, "gru": gru_step, "rnn": rnn_step}


def _time_major(mask, batch_first, shape):
    """A per-step mask as a full ``[T, B, n]`` tensor in time-major order."""
    if mask is None:
        return None
    if mask.ndim == 3 and batch_first:
        mask = mask.transpose(0, 1)
    return torch.broadcast_to(mask, shape)


def torch_sequence(cell, p, case):
    """The sequence of ``cell`` (docs/spec.md §4, §11): ``(per-step fields..., finals...)``
    in the result's field order. Row b runs its first ``L_b`` steps; ``reverse`` runs it
    over ``x[π_b(t)]``, ``π_b(t) = L_b - 1 - t``, and puts the outputs back through ``π_b``;
    a finished row's outputs are zero and its state frozen."""
    batch_first, reverse = case.get("batch_first", False), case.get("reverse", False)
    x = p["x"].transpose(0, 1) if batch_first else p["x"]
    steps, batch = x.shape[:2]
    lengths = (torch.full((batch,), steps) if case.get("seq_len") is None
               else torch.as_tensor(case["seq_len"]))
    t = torch.arange(steps)[:, None]
    source = torch.where(t < lengths, lengths - 1 - t, t) if reverse else t.expand(steps, batch)
    rows = torch.arange(batch)[None, :]
    states = [p["cs0"], p["h0"]] if cell == "lstm" else [p["h0"]]
    masks = {k: as_tensor(case.get(k)) for k in ("input_mask", "recurrent_mask", "zoneout_h",
                                                  "zoneout_cs")}
    m_in = _time_major(masks["input_mask"], batch_first, x.shape)
    x_run = (x if m_in is None else x * m_in)[source, rows]
    zone = {k: _time_major(masks[k], batch_first, (steps, batch, s.shape[-1]))
            for k, s in (("zoneout_h", states[-1]), ("zoneout_cs", states[0]))}
    zone = {k: None if z is None else z[source, rows] for k, z in zone.items()}
    outputs = []
    for step in range(steps):
        extra = {"m_rec": masks["recurrent_mask"],
                 "z_h": None if zone["zoneout_h"] is None else zone["zoneout_h"][step]}
        if cell == "lstm":
            extra["z_cs"] = None if zone["zoneout_cs"] is None else zone["zoneout_cs"][step]
        fields, new = STEPS[cell](p, case, x_run[step], *states, **extra)
        valid = (step < lengths)[:, None]
        outputs.append([torch.where(valid, a, torch.zeros_like(a)) for a in fields])
        states = [torch.where(valid, a, b) for a, b in zip(new, states, strict=True)]
    if not steps:              # no steps: empty outputs of the step's widths
        fields = STEPS[cell](p, case, x.new_zeros((batch, x.shape[-1])), *states)[0]
        stacked = [a.new_zeros((0, *a.shape)) for a in fields]
    else:
        stacked = [torch.stack(a)[source, rows] for a in zip(*outputs, strict=True)]
    if batch_first:
        stacked = [a.transpose(0, 1) for a in stacked]
    return (*stacked, *states)                  # finals: cs_final, h_final (LSTM)


def torch_op(op, p, case):
    """The result of ``op`` (a cell or sequence op) in its field order."""
    cell, _, kind = op.partition("_")
    if kind == "sequence":
        return torch_sequence(cell, p, case)
    states = (p["cs_prev"], p["h_prev"]) if cell == "lstm" else (p["h_prev"],)
    return STEPS[cell](p, case, p["x"], *states)[0]


# -- cases: flat arrays, gradcells's call and tangents --------------------------------------------


def flat_arrays(op, case):
    """``{name: array}`` of every float array of the call that has a tangent (the optional
    weights when given, ``layer_norm`` as its six fields)."""
    flat = {}
    for name in OPS[op].arrays:
        value = case.get(name)
        if value is None:
            continue
        if name == "layer_norm":
            flat.update(zip(NORM_FIELDS, value, strict=True))
        else:
            flat[name] = value
    return flat


def gc_call(op, case):
    """``(positional arrays, keywords)`` of ``gc.<op>`` for ``case``."""
    names = [n for n in OPS[op].arrays if n not in OPTIONAL_WEIGHTS]
    return [case[n] for n in names], {k: v for k, v in case.items() if k not in names}


def gc_tangents(op, tangents):
    """The op's gradient type holding the flat ``tangents`` (``layer_norm`` an ``LSTMNorm``)."""
    fields = {k: v for k, v in tangents.items() if k not in NORM_FIELDS}
    if "gamma_x" in tangents:
        fields["layer_norm"] = gc.LSTMNorm(*(tangents[k] for k in NORM_FIELDS))
    return OPS[op].grads(**{k: fields.get(k) for k in OPS[op].grads._fields})


def flat_grads(grads):
    """A gradient-type result as ``{name: array}`` like ``flat_arrays`` (None left out)."""
    flat = {}
    for name, value in grads._asdict().items():
        if name == "layer_norm" and value is not None:
            flat.update(zip(NORM_FIELDS, value, strict=True))
        elif value is not None:
            flat[name] = value
    return flat


def draw_tangents(rng, arrays):
    return {k: rng.standard_normal(np.shape(a)) for k, a in arrays.items()}


def torch_function(op, case, names):
    def f(*tensors):
        return torch_op(op, dict(zip(names, tensors, strict=True)), case)
    return f


def check_jvp(op, case, seed):
    rng = np.random.default_rng(seed)
    arrays = flat_arrays(op, case)
    tangents = draw_tangents(rng, arrays)
    names = list(arrays)
    out, d_out = torch.func.jvp(torch_function(op, case, names),
                                tuple(as_tensor(arrays[k]) for k in names),
                                tuple(as_tensor(tangents[k]) for k in names))
    positional, keywords = gc_call(op, case)
    result, d_result = getattr(gc, f"{op}_jvp")(*positional, gc_tangents(op, tangents),
                                                **keywords)
    fields = OPS[op].result._fields
    assert len(out) == len(fields)
    for name, ours, d_ours, theirs, d_theirs in zip(fields, result, d_result, out, d_out,
                                                    strict=True):
        close(ours, theirs.numpy(), f"{op} {name}")
        close(d_ours, d_theirs.numpy(), f"{op} d{name}")


def check_grad_jvp(op, case, seed, clip_grad="exact"):
    """Forward over reverse: the gradient of ``Σ <ct, outputs>`` and its tangent along the
    arrays' tangents and the cotangents' own (an LSTM's with ``clip_grad``)."""
    rng = np.random.default_rng(seed)
    arrays = flat_arrays(op, case)
    names = list(arrays)
    positional, keywords = gc_call(op, case)
    result = getattr(gc, op)(*positional, **keywords)
    upstream = {k: rng.standard_normal(np.shape(getattr(result, UPSTREAM_FIELDS[k])))
                for k in OPS[op].upstream}
    d_upstream = {k: rng.standard_normal(v.shape) for k, v in upstream.items()}
    tangents = draw_tangents(rng, arrays)
    fields = OPS[op].result._fields
    where = [fields.index(UPSTREAM_FIELDS[k]) for k in upstream]
    f = torch_function(op, {**case, "clip_grad": clip_grad}, names)

    def loss(primals, cts):
        out = f(*primals)
        return sum((out[k] * ct).sum() for k, ct in zip(where, cts, strict=True))

    def gradient(primals, cts):
        return torch.func.grad(loss)(primals, cts)

    grads, d_grads = torch.func.jvp(
        gradient, (tuple(as_tensor(arrays[k]) for k in names),
                   tuple(as_tensor(v) for v in upstream.values())),
        (tuple(as_tensor(tangents[k]) for k in names),
         tuple(as_tensor(v) for v in d_upstream.values())))
    ours, d_ours = getattr(gc, f"{op}_grad_jvp")(
        *positional, result, gc_tangents(op, tangents), **upstream,
        **{f"{k}_tangent": v for k, v in d_upstream.items()},
        **{k: v for k, v in keywords.items() if k in OPTIONAL_WEIGHTS},
        **({"clip_grad": clip_grad} if op.startswith("lstm") else {}))
    ours, d_ours = flat_grads(ours), flat_grads(d_ours)
    assert list(ours) == names
    for k, theirs, d_theirs in zip(names, grads, d_grads, strict=True):
        close(ours[k], theirs.numpy(), f"{op} grad {k}")
        close(d_ours[k], d_theirs.numpy(), f"{op} grad's tangent {k}")


# -- 1 and 2: the cells and sequences over drawn cases --------------------------------------------

CASES = {
    "lstm_cell": lstm_cell_inputs(peephole=None, clip=None, projection=None, layer_norm=None),
    "gru_cell": gru_cell_inputs(),
    "rnn_cell": rnn_cell_inputs(),
    "lstm_sequence": lstm_sequence_inputs(peephole=None, clip=None, ragged=None,
                                          projection=None, layer_norm=None, reverse=None,
                                          batch_first=None, masks=None),
    "gru_sequence": gru_sequence_inputs(ragged=None, reverse=None, batch_first=None,
                                        masks=None),
    "rnn_sequence": rnn_sequence_inputs(ragged=None, reverse=None, batch_first=None,
                                        masks=None),
}


@pytest.mark.parametrize("op", list(CASES))
@settings(deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_forward_mode_equals_torch_func_jvp(op, data, seed):
    check_jvp(op, data.draw(CASES[op], label="case"), seed)


@pytest.mark.parametrize("op", list(CASES))
@settings(deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_forward_over_reverse_equals_torch_func(op, data, seed):
    check_grad_jvp(op, data.draw(CASES[op], label="case"), seed)


LSTM_OPTIONS = {
    "plain": {},
    "peepholes+clip": {"peephole": True, "clip": True, "forget_bias": -0.5},
    "projection+clip": {"proj_size": 2, "proj_clip": True},
    "ln-raw": {"peephole": True, "layer_norm": True, "ln_carry": "raw"},
    "ln-normalized+everything": {"peephole": True, "clip": True, "proj_size": 2,
                                 "proj_clip": True, "layer_norm": True,
                                 "ln_carry": "normalized"},
}
ORDERS = {"forward": {}, "reverse": {"reverse": True},
          "reverse-batch_first-masks": {"reverse": True, "batch_first": True, "masks": True},
          "masks": {"masks": True}}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("options", LSTM_OPTIONS)
def test_every_lstm_option_both_ways(options, order):
    """Seeded cases, each option with each order on ragged lengths (0 and T): the clips
    bite, so the comparison passes through active and inactive clips alike."""
    rng = np.random.default_rng(zlib.crc32(f"{options} {order}".encode()))
    case = gc.testing.lstm_sequence_case(rng, steps=4, batch=4, input_size=3, hidden=4,
                                         ragged=True, **LSTM_OPTIONS[options], **ORDERS[order])
    assert 0 in case["seq_len"] and 4 in case["seq_len"]
    for name, flag in (("cell_clip", "clip"), ("proj_clip", "proj_clip")):
        assert (case.get(name) is not None) == (flag in LSTM_OPTIONS[options]), name
    check_jvp("lstm_sequence", case, 1)
    check_grad_jvp("lstm_sequence", case, 2)
    cell = gc.testing.lstm_cell_case(rng, **LSTM_OPTIONS[options])
    check_jvp("lstm_cell", cell, 3)
    check_grad_jvp("lstm_cell", cell, 4)


@pytest.mark.parametrize("layer_norm", [False, True], ids=["", "ln"])
@pytest.mark.parametrize("op", ["lstm_cell", "lstm_sequence"])
def test_the_straight_through_clip_gradients_tangent(op, layer_norm):
    """``clip_grad="straight_through"`` through both clips: the tangent of the gradient that
    passes active clips, the forward's tangent still exact."""
    rng = np.random.default_rng(5 + layer_norm)
    options = {"peephole": True, "clip": True, "proj_size": 3, "proj_clip": True,
               "layer_norm": layer_norm, "ln_carry": "normalized"}
    if op == "lstm_cell":
        case = gc.testing.lstm_cell_case(rng, batch=4, **options)
    else:
        case = gc.testing.lstm_sequence_case(rng, ragged=True, reverse=True, masks=True,
                                             **options)
    assert case["cell_clip"] is not None and case["proj_clip"] is not None
    check_grad_jvp(op, case, 6, clip_grad="straight_through")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("op, option", [("gru_sequence", {"reset_after": False}),
                                        ("gru_sequence", {"reset_after": True}),
                                        ("rnn_sequence", {"activation": "tanh"}),
                                        ("rnn_sequence", {"activation": "relu"})])
def test_every_gru_and_rnn_option_both_ways(op, option, order):
    """Seeded cases: reset before and after, tanh and relu, with each order on ragged
    lengths (0 and T), and the cell of each."""
    rng = np.random.default_rng(zlib.crc32(f"{op} {option} {order}".encode()))
    make = getattr(gc.testing, f"{op}_case")
    case = make(rng, steps=4, batch=4, input_size=3, hidden=4, ragged=True, **option,
                **ORDERS[order])
    check_jvp(op, case, 1)
    check_grad_jvp(op, case, 2)
    cell = op.replace("sequence", "cell")
    cell_case = getattr(gc.testing, f"{cell}_case")(rng, **option)
    check_jvp(cell, cell_case, 3)
    check_grad_jvp(cell, cell_case, 4)


@pytest.mark.parametrize("sizes", [{"steps": 0}, {"batch": 0}, {"input_size": 0},
                                   {"steps": 1, "batch": 1, "hidden": 1}], ids=str)
@pytest.mark.parametrize("op", ["lstm_sequence", "gru_sequence", "rnn_sequence"])
def test_empty_and_tiny_sizes(op, sizes):
    rng = np.random.default_rng(9)
    options = {"peephole": True, "masks": True} if op == "lstm_sequence" else {"masks": True}
    case = getattr(gc.testing, f"{op}_case")(rng, ragged=True, reverse=True, batch_first=True,
                                             **options, **sizes)
    check_jvp(op, case, 1)
    check_grad_jvp(op, case, 2)


# -- 1: the stacks against PyTorch's modules ------------------------------------------------------

# (cell, num_layers, bidirectional, proj_size, batch_first)
STACK_CONFIGS = [("lstm", 2, True, None, False), ("lstm", 3, False, None, True),
                 ("lstm", 2, True, 3, True), ("gru", 2, True, None, False),
                 ("gru", 3, False, None, True), ("rnn_tanh", 2, True, None, True),
                 ("rnn_relu", 2, False, None, False)]


def _module(cell, layers, bidirectional, proj, batch_first, n_in, hidden):
    kind, _, activation = cell.partition("_")
    make = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[kind]
    extra = {"nonlinearity": activation} if kind == "rnn" else {}
    if proj:
        extra["proj_size"] = proj
    return make(n_in, hidden, num_layers=layers, bidirectional=bidirectional,
                batch_first=batch_first, dtype=torch.float64, **extra)


def forward_ad_jvp(f, primals, tangents):
    """``torch.func.jvp`` by ``torch.autograd.forward_ad``'s dual tensors: functorch's
    wrappers have no storage, which ``nn.LSTM``'s packed kernel (``_VF.lstm``) needs; a
    dual tensor is a plain tensor with a tangent. Arguments may be tuples of tensors."""
    fwd = torch.autograd.forward_ad

    def dual(p, t):
        return tuple(map(dual, p, t)) if isinstance(p, tuple) else fwd.make_dual(p, t)

    with fwd.dual_level():
        unpacked = [fwd.unpack_dual(a) for a in f(*map(dual, primals, tangents))]
        return ([u.primal.detach().clone() for u in unpacked],
                [u.tangent.detach().clone() for u in unpacked])


def _packing(lengths):
    """``(sorted, batch_sizes, rows)`` of a packed batch: the rows by decreasing length,
    how many run at each step, and for each ``(t, b)`` its row of the packed data (the
    index one past the data, a zero row appended, past the row's length)."""
    order = np.argsort(-lengths, kind="stable")
    batch_sizes = (lengths[None, :] > np.arange(lengths.max())[:, None]).sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(batch_sizes)])
    rows = np.full((lengths.max(), len(lengths)), offsets[-1])
    for t, size in enumerate(batch_sizes):
        rows[t, order[:size]] = offsets[t] + np.arange(size)
    return order, batch_sizes, rows


def pack(x, lengths, batch_first):
    """``pack_padded_sequence(x, lengths, enforce_sorted=False)`` written with gathers:
    PyTorch's own has no forward-mode derivative (``_pack_padded_sequence``)."""
    order, batch_sizes, _ = _packing(lengths)
    x = x.transpose(0, 1) if batch_first else x
    data = torch.cat([x[t, torch.as_tensor(order[:size])] for t, size in enumerate(batch_sizes)])
    inverse = np.argsort(order)
    return torch.nn.utils.rnn.PackedSequence(data, torch.as_tensor(batch_sizes),
                                             torch.as_tensor(order), torch.as_tensor(inverse))


def unpack(packed, lengths, batch_first):
    """``pad_packed_sequence(packed, total_length=T)[0]`` of ``pack``'s batch, by a gather
    (zero past each row's length)."""
    rows = torch.as_tensor(_packing(lengths)[2])
    data = torch.cat([packed.data, torch.zeros_like(packed.data[:1])])
    padded = data[rows]
    return padded.transpose(0, 1) if batch_first else padded


@pytest.mark.parametrize("config", STACK_CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_stack_forward_mode_equals_torch_modules(config):
    """``<cell>_stack_jvp`` against ``torch.func.jvp`` of the module on a packed ragged
    batch (lengths 1 to T, unsorted: PyTorch's packed sequences cannot hold 0), in the
    inputs, the initial states and every parameter at once."""
    cell, layers, bidirectional, proj, batch_first = config
    kind = cell.split("_")[0]
    rng = np.random.default_rng(sum(map(ord, "-".join(map(str, config)))))
    torch.manual_seed(int(rng.integers(2**31)))
    steps, batch, n_in, hidden = 5, 4, 3, 4
    directions = 2 if bidirectional else 1
    width = proj or hidden
    module = _module(cell, layers, bidirectional, proj, batch_first, n_in, hidden)
    direction = _module(cell, layers, bidirectional, proj, batch_first, n_in, hidden)
    with torch.no_grad():
        for p in direction.parameters():
            p.copy_(torch.randn_like(p))
    names = [n for n, _ in module.named_parameters()]
    lengths = np.array([2, 5, 1, 4])
    x = rng.standard_normal((batch, steps, n_in) if batch_first else (steps, batch, n_in))
    states = [rng.standard_normal((layers * directions, batch, width))]
    if kind == "lstm":
        states.append(rng.standard_normal((layers * directions, batch, hidden)))
    d_x, d_states = rng.standard_normal(x.shape), [rng.standard_normal(s.shape) for s in states]

    def run(x, params, *states):
        out, finals = torch.func.functional_call(
            module, dict(zip(names, params, strict=True)),
            (pack(x, lengths, batch_first), tuple(states) if kind == "lstm" else states[0]))
        return (unpack(out, lengths, batch_first), *(finals if kind == "lstm" else (finals,)))

    primals = (as_tensor(x), tuple(p.detach() for p in module.parameters()),
               *map(as_tensor, states))
    tangents = (as_tensor(d_x), tuple(p.detach() for p in direction.parameters()),
                *map(as_tensor, d_states))
    out, d_out = forward_ad_jvp(run, primals, tangents)
    with torch.no_grad():     # the packing by gathers is pack_padded_sequence's
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            primals[0], torch.as_tensor(lengths), batch_first=batch_first, enforce_sorted=False)
        theirs, _ = torch.nn.utils.rnn.pad_packed_sequence(
            module(packed, tuple(primals[2:]) if kind == "lstm" else primals[2])[0],
            batch_first=batch_first, total_length=steps)
    np.testing.assert_array_equal(out[0].numpy(), theirs.numpy())

    conv, d_conv = layouts.stack_from_torch(module), layouts.stack_from_torch(direction)
    ours, d_ours = getattr(gc, f"{kind}_stack_jvp")(
        x, *conv.gradcells_states(*states), conv,
        getattr(gc, f"{kind.upper()}StackGrads")(
            d_x, *conv.gradcells_states(*d_states), list(d_conv)),
        seq_len=lengths, batch_first=batch_first, **conv.options)
    close(ours.h, out[0].numpy(), "h")
    close(d_ours.h, d_out[0].numpy(), "dh")
    close(ours.h_final, out[1].numpy(), "h_final")
    close(d_ours.h_final, d_out[1].numpy(), "dh_final")
    if kind == "lstm":
        close(ours.cs_final, out[2].numpy(), "cs_final")
        close(d_ours.cs_final, d_out[2].numpy(), "dcs_final")


def torch_stack(cell, weights, case):
    """A stack (docs/spec.md §11.4) in the transcription's sequences: each (layer,
    direction) one ``torch_sequence``, the reverse direction with ``reverse``; layer l reads
    the two directions' outputs of layer l-1, forward first, times ``dropout_masks[l-1]``.
    ``(h, cs_final, h_final)`` (``(h, h_final)`` without a cell state)."""
    directions = 2 if case["bidirectional"] else 1
    options = {k: case[k] for k in ("seq_len", "batch_first", "reset_after", "activation")
               if k in case}
    options["forget_bias"] = case.get("forget_bias", 1.0)
    layer_input, finals = weights["x"], []
    masks = case.get("dropout_masks") or []
    for layer in range(len(case["weights"]) // directions):
        if layer:
            layer_input = layer_input * as_tensor(masks[layer - 1])
        runs = []
        for d in range(directions):
            k = layer * directions + d
            p = {**weights[k], "x": layer_input, "h0": weights["h0"][k]}
            if cell == "lstm":
                p["cs0"] = weights["cs0"][k]
            out = torch_sequence(cell, p, {**options, "reverse": d == 1})
            runs.append(out)
            finals.append(out[-2:] if cell == "lstm" else out[-1:])
        h_field = -3 if cell == "lstm" else -2
        layer_input = torch.cat([run[h_field] for run in runs], -1)
    stacked = [torch.stack(list(a)) for a in zip(*finals, strict=True)]
    return (layer_input, *stacked)


def _weight_tensors(weights):
    """Each weight set's arrays as ``{name: array}`` (``layer_norm`` as its six)."""
    sets = []
    for w in weights:
        flat = {k: v for k, v in w._asdict().items() if v is not None and k != "layer_norm"}
        if getattr(w, "layer_norm", None) is not None:
            flat.update(zip(NORM_FIELDS, w.layer_norm, strict=True))
        sets.append(flat)
    return sets


def _weight_set(template, flat):
    """``flat`` (as ``_weight_tensors``) as a weight set of ``template``'s type."""
    fields = {k: flat.get(k) for k in type(template)._fields if k != "layer_norm"}
    if "gamma_x" in flat:
        fields["layer_norm"] = gc.LSTMNorm(*(flat[k] for k in NORM_FIELDS))
    return type(template)(**fields)


STACK_CASES = [(cell, options) for cell in ("lstm", "gru", "rnn")
               for options in ({}, {"batch_first": True, "layers": 3},
                               {"bidirectional": False, "ragged": True})] + [
    ("lstm", {"bidirectional": False, "proj_size": 2}),
    ("lstm", {"layer_norm": True, "proj_size": 3, "batch_first": True})]


@pytest.mark.parametrize("cell, options", STACK_CASES,
                         ids=[f"{c}-{'-'.join(map(str, o.items()))}" for c, o in STACK_CASES])
def test_stack_forward_mode_equals_the_transcriptions_stack(cell, options):
    """What the modules cannot hold: lengths of 0, the dropout masks between layers, an
    LSTM's peepholes (layer 0) and layer norm (top layer), through a stack of the
    transcription's sequences (``gc.testing.stack_case``)."""
    rng = np.random.default_rng(zlib.crc32(f"{cell} {options}".encode()))
    case = gc.testing.stack_case(rng, cell, **options)
    if case["seq_len"] is not None:
        assert 0 in case["seq_len"]
    states = ("cs0", "h0") if cell == "lstm" else ("h0",)
    sets = _weight_tensors(case["weights"])
    arrays = {"x": case["x"], **{k: case[k] for k in states},
              **{f"{k}.{n}": a for k, flat in enumerate(sets) for n, a in flat.items()}}
    names = list(arrays)
    tangents = draw_tangents(rng, arrays)

    def f(*tensors):
        p = dict(zip(names, tensors, strict=True))
        weights = {k: p[k] for k in ("x", *states)}
        for k, flat in enumerate(sets):
            weights[k] = {n: p[f"{k}.{n}"] for n in flat}
        return torch_stack(cell, weights, case)

    out, d_out = torch.func.jvp(f, tuple(as_tensor(arrays[k]) for k in names),
                                tuple(as_tensor(tangents[k]) for k in names))
    d_weights = [_weight_set(w, {n: tangents[f"{k}.{n}"] for n in flat})
                 for k, (w, flat) in enumerate(zip(case["weights"], sets, strict=True))]
    keywords = {k: v for k, v in case.items() if k not in ("x", *states, "weights")}
    ours, d_ours = getattr(gc, f"{cell}_stack_jvp")(
        case["x"], *(case[k] for k in states), case["weights"],
        getattr(gc, f"{cell.upper()}StackGrads")(
            tangents["x"], *(tangents[k] for k in states), d_weights), **keywords)
    fields = ("h", "cs_final", "h_final") if cell == "lstm" else ("h", "h_final")
    for name, theirs, d_theirs in zip(fields, out, d_out, strict=True):
        close(getattr(ours, name), theirs.numpy(), name)
        close(getattr(d_ours, name), d_theirs.numpy(), f"d{name}")


# -- 3: Hessian-vector products through nn.GRU and nn.RNN -----------------------------------------


@pytest.mark.parametrize("cell", ["gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "packed"])
def test_hessian_vector_product_equals_torch_hvp_through_the_module(cell, ragged):
    """``L = ½|out - y|² + ½|h_n - y_n|²`` through ``nn.GRU`` / ``nn.RNN`` (one layer):
    ``torch.autograd.functional.hvp`` (and the gradient) in the parameters, the input and
    the initial state against ``gc.hessian_vector_product`` of ``gru_sequence`` /
    ``rnn_sequence``, the
    direction carried over by ``stack_from_torch``. PyTorch's two biases enter as their sum
    (the GRU's candidate bias: ``b_c = [b_in, b_hn]``, kept apart), so each summed one's
    HVP is all of gradcells's bias HVP."""
    kind, _, activation = cell.partition("_")
    rng = np.random.default_rng(11 if ragged else 12)
    torch.manual_seed(7)
    steps, batch, n_in, hidden = 5, 3, 3, 4
    module = _module(cell, 1, False, None, False, n_in, hidden)
    names = [n for n, _ in module.named_parameters()]
    x, h0 = rng.standard_normal((steps, batch, n_in)), rng.standard_normal((batch, hidden))
    y, y_n = rng.standard_normal((steps, batch, hidden)), rng.standard_normal((batch, hidden))
    lengths = np.array([5, 2, 4]) if ragged else None
    valid = (np.ones((steps, batch)) if lengths is None
             else (np.arange(steps)[:, None] < lengths)).astype(float)[:, :, None]

    def loss(x_t, h0_t, *params):
        inputs = x_t if lengths is None else torch.nn.utils.rnn.pack_padded_sequence(
            x_t, torch.as_tensor(lengths), enforce_sorted=False)
        out, h_n = torch.func.functional_call(module, dict(zip(names, params, strict=True)),
                                              (inputs, h0_t[None]))
        if lengths is not None:
            out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=steps)
        return (0.5 * ((out - as_tensor(y * valid)) ** 2).sum()
                + 0.5 * ((h_n[0] - as_tensor(y_n)) ** 2).sum())

    params = tuple(p.detach().clone() for p in module.parameters())
    d_x, d_h0 = rng.standard_normal(x.shape), rng.standard_normal(h0.shape)
    directions = tuple(torch.randn_like(p) for p in params)
    primals = (as_tensor(x), as_tensor(h0), *params)
    leaves = [a.clone().requires_grad_() for a in primals]   # functorch: no packed kernel
    loss_grads = torch.autograd.grad(loss(*leaves), leaves)
    _, expected = torch.autograd.functional.hvp(
        loss, primals, (as_tensor(d_x), as_tensor(d_h0), *directions))

    conv = layouts.stack_from_torch(module)
    moved = _module(cell, 1, False, None, False, n_in, hidden)
    with torch.no_grad():
        for p, d in zip(moved.parameters(), directions, strict=True):
            p.copy_(d)
    d_w = layouts.stack_from_torch(moved)[0]
    op = f"{kind}_sequence"
    arrays = [x, h0, *conv[0]]
    tangents = OPS[op].grads(d_x, d_h0, *d_w)
    # Past a row's length the output is zero whatever y: the target there is 0 for both.
    target = y * valid
    gradient, hvp = gc.hessian_vector_product(
        op, arrays, tangents,
        loss_grad=lambda r: {"d_h": r.h - target, "d_h_final": r.h_final - y_n},
        loss_hvp=lambda r, d: {"d_h": d.h, "d_h_final": d.h_final},
        seq_len=lengths, **{k: v for k, v in conv.options.items() if k != "bidirectional"})
    summed = slice(0, 2 * hidden) if kind == "gru" else slice(None)
    for what, ours, theirs in (("∇L", gradient, loss_grads), ("H·t", hvp, expected)):
        close(ours.x, theirs[0].numpy(), f"{what} x")
        close(ours.h0, theirs[1].numpy(), f"{what} h0")
        back = layouts.stack_to_torch([type(conv[0])(*ours[2:])], bidirectional=False)
        for name, e in zip(names, theirs[2:], strict=True):
            got = np.array(back[name])
            if name.startswith("bias"):
                got[summed] = (back["bias_ih_l0"] + back["bias_hh_l0"])[summed]
            close(got, e.numpy(), f"{what} {name}")
