"""A result carries its settings (docs/spec.md §10).

A forward's result records what its gradient needs; the gradient called with only the
arrays, the result and the upstream gradients equals the full call on every backend; a
setting passed again that contradicts the record raises ValueError naming it; a tuple built
by hand records nothing and leaves the keywords to decide.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells.cells import OPS, OPTIONAL_WEIGHTS
from gradcells.cells.lstm.spec import PEEPHOLES
from gradcells.testing import (
    gru_cell_case,
    gru_sequence_case,
    lstm_cell_case,
    lstm_sequence_case,
    mingru_cell_case,
    mingru_sequence_case,
    minlstm_cell_case,
    minlstm_sequence_case,
    rglru_cell_case,
    rglru_sequence_case,
    rnn_cell_case,
    rnn_sequence_case,
    slstm_cell_case,
    slstm_sequence_case,
)

BACKENDS = ["reference", "cpu"]


def _activation(variant):
    return "identity" if variant else "g"


def _rglru_settings(variant):   # c and sqrt_grad_bound other than the defaults
    return {"c": 2.0, "sqrt_grad_bound": 2.0} if variant else {}


_OWN_CASES = {
    "mingru_cell": lambda rng, v: mingru_cell_case(rng, activation=_activation(v)),
    "minlstm_cell": lambda rng, v: minlstm_cell_case(rng, activation=_activation(v)),
    "minlstm_sequence": lambda rng, v: minlstm_sequence_case(
        rng, steps=5, batch=4, ragged=True, activation=_activation(v)),
    "mingru_sequence": lambda rng, v: mingru_sequence_case(
        rng, steps=5, batch=4, ragged=True, activation=_activation(v)),
    "rglru_cell": lambda rng, v: rglru_cell_case(rng, **_rglru_settings(v)),
    "rglru_sequence": lambda rng, v: rglru_sequence_case(
        rng, steps=5, batch=4, ragged=True, resets=True, **_rglru_settings(v)),
}
"""The cases of the cells whose variant is one setting's value (the minimal RNNs'
activation, the RG-LRU's ``c`` and ``sqrt_grad_bound``)."""


def _case(op, rng, variant):
    """A case for ``op`` with every setting that matters for its gradient switched on."""
    if op == "lstm_cell":
        return lstm_cell_case(rng, peephole=variant, clip=True, forget_bias=0.5)
    if op == "lstm_sequence":
        return lstm_sequence_case(rng, steps=5, batch=4, peephole=variant, clip=True,
                                  forget_bias=0.5, ragged=True)
    if op == "gru_cell":
        return {**gru_cell_case(rng, reset_after=variant), "reset_after": variant}
    if op == "gru_sequence":
        return {**gru_sequence_case(rng, steps=5, batch=4, reset_after=variant, ragged=True),
                "reset_after": variant}
    if op in _OWN_CASES:
        return _OWN_CASES[op](rng, variant)
    if op.startswith("slstm"):  # settings other than the defaults, both of them recorded
        settings = ({"forget": "sigmoid", "stabilizer_grad": "stop"} if variant
                    else {"forget": "exp", "stabilizer_grad": "exact"})
        if op == "slstm_cell":
            return slstm_cell_case(rng, **settings)
        return slstm_sequence_case(rng, steps=5, batch=4, **settings)
    activation = "relu" if variant else "tanh"
    if op == "rnn_cell":
        return rnn_cell_case(rng, activation=activation)
    return rnn_sequence_case(rng, steps=5, batch=4, activation=activation, ragged=True)


def _split(op, case):
    """(positional arrays, forward keywords, the settings a full gradient call repeats)."""
    spec = OPS[op]
    positional = [case[name] for name in spec.arrays if name not in OPTIONAL_WEIGHTS]
    peepholes = {name: case[name] for name in OPTIONAL_WEIGHTS if case.get(name) is not None}
    keywords = {name: case[name] for name in
                ("forget_bias", "cell_clip", "reset_after", "activation", "forget",
                 "stabilizer_grad", "seq_len", "c", "sqrt_grad_bound", "resets")
                if name in case}
    repeated = {name: value for name, value in keywords.items() if name != "forget_bias"}
    return positional, {**peepholes, **keywords}, {**peepholes, **repeated}, peepholes


def _upstream(op, rng, result):
    spec = OPS[op]   # every field's upstream gradient (docs/spec.md §16.1), by its field
    return {name: rng.standard_normal(getattr(result, name.removeprefix("d_")).shape)
            for name in spec.upstream}


def _assert_same(got, want):
    fields = getattr(type(want), "_fields", range(len(want)))
    for field, a, b in zip(fields, got, want, strict=True):
        if b is None:
            assert a is None, field
        else:
            np.testing.assert_array_equal(a, b, err_msg=field)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("variant", [False, True])
def test_the_gradient_needs_only_the_arrays_the_result_and_the_upstream(op, backend, variant):
    rng = np.random.default_rng(7)
    case = _case(op, rng, variant)
    positional, keywords, repeated, peepholes = _split(op, case)
    forward, grad = getattr(gc, op), getattr(gc, OPS[op].grad_name)
    result = forward(*positional, **keywords, backend=backend)
    upstream = _upstream(op, rng, result)
    full = grad(*positional, result, **upstream, **repeated, backend=backend)
    short = grad(*positional, result, **upstream, **peepholes, backend=backend)
    _assert_same(short, full)
    # Without the record (a plain tuple) the keywords' defaults rule, and they are wrong.
    def plain():
        return grad(*positional, tuple(result), **upstream, **peepholes, backend=backend)

    if op.startswith("gru") and variant:
        with pytest.raises(ValueError, match=r"b_c has shape \[2H\] .*: pass reset_after=True"):
            plain()
    elif (op in ("gru_cell", "rnn_cell", "mingru_cell", "minlstm_cell", "rglru_cell")
          and not (op in ("rnn_cell", "mingru_cell", "minlstm_cell", "rglru_cell")
                   and variant)):
        _assert_same(plain(), full)  # nothing to remember
    else:
        assert any(not np.array_equal(a, b)
                   for a, b in zip(plain(), full, strict=True) if a is not None)


def test_results_record_their_settings_and_unpack_as_before():
    rng = np.random.default_rng(0)
    case = lstm_sequence_case(rng, peephole=True, clip=True, forget_bias=0.25, ragged=True)
    seq = gc.lstm_sequence(**case)
    assert seq.settings.forget_bias == 0.25
    assert seq.settings.cell_clip == case["cell_clip"] and seq.settings.peepholes
    np.testing.assert_array_equal(seq.settings.seq_len, case["seq_len"])
    i, cs, f, o, ci, co, h, cs_final, h_final = seq
    assert len(seq) == 9 and h is seq.h and isinstance(seq, tuple)
    with pytest.raises(AttributeError):
        seq.settings = None
    assert seq._replace(h=h).settings is None
    state = gc.gru_cell(**gru_cell_case(rng, reset_after=True))
    assert state.settings.reset_after is True and state.settings.seq_len is None


def test_the_record_keeps_its_own_lengths():
    rng = np.random.default_rng(9)
    case = lstm_sequence_case(rng, steps=4, batch=3, ragged=True)
    lengths = case["seq_len"].copy()
    seq = gc.lstm_sequence(**case)
    case["seq_len"][:] = 4  # the caller reuses their array
    np.testing.assert_array_equal(seq.settings.seq_len, lengths)
    with pytest.raises(ValueError, match="read-only"):
        seq.settings.seq_len[0] = 0


def test_lengths_that_cover_every_step_are_recorded_as_none():
    rng = np.random.default_rng(1)
    case = lstm_sequence_case(rng, steps=3, batch=2)
    seq = gc.lstm_sequence(**{**case, "seq_len": np.array([3, 3])})
    assert seq.settings.seq_len is None
    gc.lstm_sequence_grad(*(case[k] for k in ("x", "cs0", "h0", "w", "b")), seq,
                          d_h_final=np.ones((2, 5)), seq_len=np.array([3, 3]))


def test_seq_len_may_be_a_list():
    rng = np.random.default_rng(2)
    case = gru_sequence_case(rng, steps=4, batch=3, ragged=True)
    as_array = gc.gru_sequence(**case)
    as_list = gc.gru_sequence(**{**case, "seq_len": [int(n) for n in case["seq_len"]]})
    _assert_same(as_list, as_array)
    assert isinstance(as_list.settings.seq_len, np.ndarray)


def _lstm_sequence_call(rng, **forward):
    case = lstm_sequence_case(rng, steps=4, batch=3, peephole=True, clip=True, ragged=True)
    positional = [case[k] for k in ("x", "cs0", "h0", "w", "b")]
    peepholes = {k: case[k] for k in PEEPHOLES}
    seq = gc.lstm_sequence(*positional, **peepholes, cell_clip=case["cell_clip"],
                           seq_len=case["seq_len"], **forward)
    return case, positional, peepholes, seq


@pytest.mark.parametrize(("given", "pattern"), [
    ({"cell_clip": 1e3}, r"cell_clip=1000.0 contradicts the forward's cell_clip="),
    ({"cell_clip": 0}, r"cell_clip=None contradicts the forward's cell_clip="),
    ({"seq_len": np.array([4, 4, 0])}, r"seq_len=\[4, 4, 0\] contradicts the forward's seq_len="),
    ({"seq_len": np.array([4, 4, 4])}, r"seq_len=None contradicts the forward's seq_len=\["),
])
def test_a_contradicting_setting_is_named(given, pattern):
    case, positional, peepholes, seq = _lstm_sequence_call(np.random.default_rng(3))
    with pytest.raises(ValueError, match=pattern):
        gc.lstm_sequence_grad(*positional, seq, d_h_final=np.ones((3, 5)), **peepholes,
                              **given)


def test_peepholes_must_be_passed_as_the_forward_had_them():
    case, positional, peepholes, seq = _lstm_sequence_call(np.random.default_rng(4))
    with pytest.raises(ValueError, match=r"the forward ran with peepholes; pass wci, wcf, wco"):
        gc.lstm_sequence_grad(*positional, seq, d_h_final=np.ones((3, 5)))
    state = gc.lstm_cell(*(lstm_cell_case(np.random.default_rng(5))[k]
                           for k in ("x", "cs_prev", "h_prev", "w", "b")))
    cell = lstm_cell_case(np.random.default_rng(5), peephole=True)
    with pytest.raises(ValueError, match=r"wci, wcf, wco were given but the forward ran "
                                         r"without peepholes \(state.settings.peepholes"):
        gc.lstm_cell_grad(*(cell[k] for k in ("x", "cs_prev", "h_prev", "w", "b")), state,
                          d_h=np.ones((3, 5)), **{k: cell[k] for k in PEEPHOLES})


@pytest.mark.parametrize("op", ["gru_cell", "gru_sequence"])
def test_reset_after_contradicting_the_record_is_named(op):
    rng = np.random.default_rng(6)
    case = _case(op, rng, True)
    positional, keywords, _, _ = _split(op, case)
    result = getattr(gc, op)(*positional, **keywords)
    with pytest.raises(ValueError, match=r"reset_after=False contradicts the forward's "
                                         r"reset_after=True recorded in"):
        getattr(gc, OPS[op].grad_name)(*positional, result, reset_after=False)


def test_settings_travel_with_torch_results():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    case = lstm_sequence_case(rng, steps=4, batch=3, clip=True, ragged=True)
    tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
               for k, v in case.items()}
    positional = [tensors[k] for k in ("x", "cs0", "h0", "w", "b")]
    seq = gc.lstm_sequence(*positional, cell_clip=case["cell_clip"], seq_len=tensors["seq_len"])
    assert isinstance(seq.h, torch.Tensor) and seq.settings.cell_clip == case["cell_clip"]
    d_h_final = torch.ones(3, 5, dtype=torch.float64)
    short = gc.lstm_sequence_grad(*positional, seq, d_h_final=d_h_final)
    full = gc.lstm_sequence_grad(*positional, seq, d_h_final=d_h_final,
                                 cell_clip=case["cell_clip"], seq_len=tensors["seq_len"])
    _assert_same([g.numpy() for g in short[:5]], [g.numpy() for g in full[:5]])
