"""The audit of ONNX Runtime's ``LSTM``, ``GRU`` and ``RNN`` operators (CPU provider): each
case a single-node model built with ``onnx.helper`` and run by ``onnxruntime.InferenceSession``.

ONNX Runtime offers no gradient for these operators, so every row is a forward: ORT's float32
outputs ``Y``, ``Y_h`` (and ``Y_c``) against gradcells's float64 sequence ops (bidirectional:
its stacks) on the same weights, converted by ``gc.layouts`` (``*_from_onnx``; one row per
operator the other way, ``*_to_onnx``), within ``FLOAT32_FORWARD``. ONNX's ``clip`` bounds the
input of every activation, which no gradcells option does (``cell_clip`` clips the carried
cell state): the clip rows compare ORT with a transcription of the ONNX equations written with
gradcells's reference math (``spec_lstm``, ``spec_gru``, ``spec_rnn``), itself checked equal
to gradcells without the clip. ``checks()`` imports ONNX Runtime (ImportError when it or
``onnx`` is absent) and lists the rows in order.
"""

from __future__ import annotations

import numpy as np

from .. import layouts, sequences, stacks
from .._core.xpmath import blocks, sigmoid
from ..cells.gru.spec import GRUWeights
from ..cells.lstm.spec import PEEPHOLES, LSTMWeights
from ..cells.rnn.spec import RNNWeights
from ._cases import f64, sizes
from ._engine import (
    FLOAT32_FORWARD,
    FLOAT64,
    Check,
    Outcome,
    Verdict,
    compare,
    judge,
    refused,
    worst_verdict,
)

OPERATORS = {"lstm": ("LSTM", 4), "gru": ("GRU", 3), "rnn": ("RNN", 1)}
"""gradcells's cell -> the ONNX operator and its number of gate blocks."""
INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
"""The LSTM's inputs in ONNX's order; the GRU and the RNN take the first six."""
DIRECTIONS = ("forward", "reverse", "bidirectional")
DEFAULT_ACTIVATIONS = {"lstm": ["Sigmoid", "Tanh", "Tanh"], "gru": ["Sigmoid", "Tanh"],
                       "rnn": ["Tanh"]}
OPSET, IR_VERSION = 22, 10


def _ort():
    import onnx  # noqa: F401  (the model builder: ImportError without it)
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # the refusals the rows expect print no ERROR
    return onnxruntime


def _value_info(name, a):
    from onnx import helper

    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                         a.shape)


def run_node(op: str, feeds: dict, outputs, **attrs) -> dict:
    """ORT's outputs ``{name: array}`` of one ``op`` node on ``feeds`` (ONNX input name ->
    array; optional inputs left out are absent) with the node attributes ``attrs``."""
    from onnx import helper

    ort = _ort()
    inputs = [n if n in feeds else "" for n in INPUTS[:8 if op == "LSTM" else 6]]
    while not inputs[-1]:
        inputs.pop()
    node = helper.make_node(op, inputs, list(outputs), **attrs)
    elem = helper.np_dtype_to_tensor_dtype(feeds["X"].dtype)
    graph = helper.make_graph([node], op, [_value_info(n, feeds[n]) for n in inputs if n],
                              [helper.make_tensor_value_info(n, elem, None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return dict(zip(outputs, session.run(None, {n: feeds[n] for n in inputs if n}), strict=True))


def draw_lengths(rng, steps, batch, lengths):
    """``sequence_lens [B]`` (int32): ``"ragged"`` in 1..T, ``"zeros"`` in 0..T with a 0."""
    low = 0 if lengths == "zeros" else 1
    drawn = rng.integers(low, steps + 1, size=batch).astype(np.int32)
    if lengths == "zeros":
        drawn[rng.integers(batch)] = 0
    return drawn


# ---------------------------------------------------------------------------------------------
# One generated case of one operator, and gradcells's view of it


class Case:
    """ONNX inputs ``feeds`` (``dtype``) and attributes ``attrs`` of one node, drawn from
    ``rng``; an option left None is drawn. ``lengths``: ``"full"`` (no ``sequence_lens``),
    ``"ragged"`` or ``"zeros"``; ``initial``: pass ``initial_h`` (and ``initial_c``)."""

    def __init__(self, rng, kind, *, direction=None, lengths=None, initial=None,
                 peephole=None, linear_before_reset=None, activation=None,
                 dtype=np.float32):
        self.kind, (self.op, gates) = kind, OPERATORS[kind]
        self.direction = direction or DIRECTIONS[int(rng.integers(3))]
        drawn = sizes(rng)
        batch, hidden, self.hidden = drawn["batch"], drawn["hidden"], drawn["hidden"]
        self.steps, self.d = int(rng.integers(1, 5)), 2 if self.direction == DIRECTIONS[2] else 1
        d, k, scale = self.d, gates * hidden, 1 / np.sqrt(hidden)
        feeds = {"X": rng.standard_normal((self.steps, batch, drawn["input_size"])),
                 "W": scale * rng.standard_normal((d, k, drawn["input_size"])),
                 "R": scale * rng.standard_normal((d, k, hidden)),
                 "B": 0.3 * rng.standard_normal((d, 2 * k))}
        lengths = lengths or ("full", "ragged")[int(rng.integers(2))]
        if initial if initial is not None else rng.integers(2):
            feeds["initial_h"] = 0.5 * rng.standard_normal((d, batch, hidden))
            if kind == "lstm":
                feeds["initial_c"] = rng.standard_normal((d, batch, hidden))
        if kind == "lstm" and (peephole if peephole is not None else rng.integers(2)):
            feeds["P"] = 0.5 * rng.standard_normal((d, 3 * hidden))
        self.feeds = {n: a.astype(dtype) for n, a in feeds.items()}
        if lengths != "full":
            self.feeds["sequence_lens"] = draw_lengths(rng, self.steps, batch, lengths)
        self.attrs = {"hidden_size": hidden}
        if self.direction != "forward" or rng.integers(2):     # ONNX's default, given or not
            self.attrs["direction"] = self.direction
        self._attributes(rng, linear_before_reset, activation)

    def _attributes(self, rng, linear_before_reset, activation):
        if self.kind == "gru":
            lbr = int(rng.integers(2)) if linear_before_reset is None else linear_before_reset
            self.attrs["linear_before_reset"] = lbr
        self.activation = "Tanh"                 # the LSTM's and GRU's: ONNX's defaults
        if self.kind == "rnn":
            self.activation = activation or ("Tanh", "Relu")[int(rng.integers(2))]
            if activation is not None or self.activation != "Tanh":
                self.attrs["activations"] = [self.activation] * self.d

    @property
    def outputs(self) -> tuple[str, ...]:
        return ("Y", "Y_h", "Y_c") if self.kind == "lstm" else ("Y", "Y_h")

    def run(self, **attrs) -> list:
        """ORT's outputs in ``outputs``' order (``attrs`` added to the node's)."""
        out = run_node(self.op, self.feeds, self.outputs, **{**self.attrs, **attrs})
        return [out[n] for n in self.outputs]

    @property
    def seq_len(self):
        lens = self.feeds.get("sequence_lens")
        return None if lens is None else lens.astype(np.int64)

    def converted(self, d, via=layouts):
        """gradcells's weights of direction ``d`` through ``layouts.*_from_onnx``."""
        a = {n: f64(self.feeds[n][d:d + 1]) for n in ("W", "R", "B", "P") if n in self.feeds}
        if self.kind == "lstm":
            return via.lstm_from_onnx(a["W"], a["R"], a["B"], a.get("P"))
        if self.kind == "gru":
            return via.gru_from_onnx(a["W"], a["R"], a["B"],
                                     linear_before_reset=self.attrs["linear_before_reset"])
        return via.rnn_from_onnx(a["W"], a["R"], a["B"], activation=self.activation)

    def initial(self, name):
        """``initial_h`` / ``initial_c [D, B, H]`` in float64 (zeros when not given)."""
        batch = self.feeds["X"].shape[1]
        given = self.feeds.get(name)
        return np.zeros((self.d, batch, self.hidden)) if given is None else f64(given)

    def gradcells(self) -> list:
        """gradcells's ``Y [T, D, B, H]``, ``Y_h [D, B, H]`` (and ``Y_c``), float64."""
        if self.d == 2:
            return self._stack()
        seq = self._sequence(0, reverse=self.direction == "reverse")
        finals = [seq.h_final[None]] + ([seq.cs_final[None]] if self.kind == "lstm" else [])
        return [seq.h[:, None]] + finals

    def _sequence(self, d, reverse, batch_first=False):
        conv, x = self.converted(d), f64(self.feeds["X"])
        x = np.ascontiguousarray(x.swapaxes(0, 1)) if batch_first else x
        common = dict(conv.options, seq_len=self.seq_len, reverse=reverse,
                      batch_first=batch_first)
        h0 = self.initial("initial_h")[d]
        if self.kind == "lstm":
            cs0, h0 = conv.gradcells_states(h0, self.initial("initial_c")[d])
            # the peepholes follow (w, b) only when ONNX's P is given
            peeps = dict(zip(PEEPHOLES, conv[2:], strict=False))
            return sequences.lstm_sequence(x, cs0, h0, *conv[:2], **peeps, **common)
        op = sequences.gru_sequence if self.kind == "gru" else sequences.rnn_sequence
        return op(x, h0, *conv, **common)

    def _stack(self):
        x, h0, hidden = f64(self.feeds["X"]), self.initial("initial_h"), self.hidden
        convs = [self.converted(d) for d in range(2)]
        common = dict(convs[0].options, seq_len=self.seq_len, bidirectional=True)
        if self.kind == "lstm":
            out = stacks.lstm_stack(x, self.initial("initial_c"), h0,
                                    [LSTMWeights(*c) for c in convs], **common)
        else:
            weights = [(GRUWeights if self.kind == "gru" else RNNWeights)(*c) for c in convs]
            op = stacks.gru_stack if self.kind == "gru" else stacks.rnn_stack
            out = op(x, h0, weights, **common)
        y = out.h.reshape(out.h.shape[:2] + (2, hidden)).transpose(0, 2, 1, 3)
        return [y, out.h_final] + ([out.cs_final] if self.kind == "lstm" else [])

    def verdict(self, claim, truth, tolerance=FLOAT32_FORWARD) -> Outcome:
        return compare(zip(self.outputs, claim, truth, strict=True), tolerance)


# ---------------------------------------------------------------------------------------------
# The forward against gradcells


def forward_verdict(rng, kind, **options) -> Verdict:
    """ORT's outputs against gradcells's on the weights of ``layouts.*_from_onnx``."""
    case = Case(rng, kind, **options)
    return Verdict(case.verdict(case.run(), case.gradcells()))


def default_activations(rng, kind) -> Verdict:
    """The node given ONNX's default ``activations`` explicitly, against gradcells."""
    case = Case(rng, kind, activation="Tanh" if kind == "rnn" else None)
    out = case.run(activations=DEFAULT_ACTIVATIONS[kind] * case.d)
    return Verdict(case.verdict(out, case.gradcells()))


def to_onnx(rng, kind) -> Verdict:
    """ORT on gradcells's weights written by ``layouts.*_to_onnx`` (Wb the summed bias, Rb
    zero), against gradcells on those weights."""
    case = Case(rng, kind, direction="forward")
    conv = case.converted(0)
    names = {"lstm": ("W", "R", "B", "P"), "gru": ("W", "R", "B"), "rnn": ("W", "R", "B")}
    truth = case.gradcells()
    if kind == "gru":
        case.attrs["linear_before_reset"] = int(conv[3].shape[0] == 2 * case.hidden)
    arrays = zip(names[kind], getattr(layouts, f"{kind}_to_onnx")(*conv), strict=True)
    case.feeds.update({n: a.astype(np.float32) for n, a in arrays})
    return Verdict(case.verdict(case.run(), truth))


def zero_lengths(rng, kind) -> Verdict:
    """Rows of length 0: gradcells's final state is the initial state; ORT's model (convention
    43) is zeros there, everything else as gradcells."""
    case = Case(rng, kind, lengths="zeros", initial=True)
    out, truth = case.run(), case.gradcells()
    empty = case.seq_len == 0
    model = [truth[0]] + [np.where(empty[None, :, None], 0.0, t) for t in truth[1:]]
    return judge(case.verdict(out, truth), lambda: case.verdict(out, model))


def output_conventions(rng, kind) -> Verdict:
    """ORT's own outputs, bidirectional with ragged lengths: ``Y`` is zero past each row's
    length, ``Y_h`` is ``Y`` at the row's last valid step (forward) and at step 0 (reverse)."""
    case = Case(rng, kind, direction="bidirectional", lengths="ragged")
    y, y_h = case.run()[:2]
    lens, rows = case.seq_len, np.arange(y.shape[2])
    past = np.arange(case.steps)[:, None] >= lens[None, :]          # [T, B]
    expected_y_h = np.stack([y[lens - 1, 0, rows], y[0, 1]])
    return Verdict(compare([("Y past the length", y[past.nonzero()[0], :, past.nonzero()[1]],
                             np.zeros_like(y[past.nonzero()[0], :, past.nonzero()[1]])),
                            ("Y_h", y_h, expected_y_h)], (0.0, 0.0)))


# ---------------------------------------------------------------------------------------------
# clip: the ONNX equations, transcribed with gradcells's reference math (gate order and
# weights as gradcells has them; one direction, every row the full length)


def _clipped(z, clip):
    return z if clip is None else np.clip(z, -clip, clip)


def spec_lstm(x, cs, h, conv, clip, clip_cell=True):
    """ONNX's LSTM: every activation's input clipped to [-clip, clip], ``h(Ct)``'s too (with
    ``clip_cell=False`` not: ORT's kernel, onnxruntime issue 27224). Returns ``(Y, Y_h, Y_c)``."""
    w, b = conv[:2]
    wci, wcf, wco = conv[2:] if len(conv) > 2 else (0.0, 0.0, 0.0)
    ys = []
    for x_t in x:
        g_i, g_c, g_f, g_o = blocks(np.concatenate([x_t, h], 1) @ w + b, 4)
        i = sigmoid(np, _clipped(g_i + cs * wci, clip))
        f = sigmoid(np, _clipped(g_f + cs * wcf, clip))
        cs = f * cs + i * np.tanh(_clipped(g_c, clip))
        o = sigmoid(np, _clipped(g_o + cs * wco, clip))
        h = o * np.tanh(_clipped(cs, clip) if clip_cell else cs)
        ys.append(h)
    return np.stack(ys), h, cs


def spec_gru(x, h, conv, clip):
    """ONNX's GRU (``b_c [H]``: linear_before_reset=0; ``[2H]``: 1), every activation's input
    clipped. Returns ``(Y, Y_h)``."""
    w_ru, w_c, b_ru, b_c = conv
    n_in, ys = x.shape[2], []
    for x_t in x:
        r, u = (sigmoid(np, _clipped(g, clip))
                for g in blocks(np.concatenate([x_t, h], 1) @ w_ru + b_ru, 2))
        if b_c.shape[0] == h.shape[1]:
            g_c = np.concatenate([x_t, r * h], 1) @ w_c + b_c
        else:
            b_cx, b_ch = blocks(b_c, 2)
            g_c = x_t @ w_c[:n_in] + b_cx + r * (h @ w_c[n_in:] + b_ch)
        h = u * h + (1 - u) * np.tanh(_clipped(g_c, clip))
        ys.append(h)
    return np.stack(ys), h


def spec_rnn(x, h, conv, clip, activation):
    """ONNX's RNN, the activation's input clipped. Returns ``(Y, Y_h)``."""
    act = np.tanh if activation == "tanh" else (lambda z: np.maximum(z, 0.0))
    ys = []
    for x_t in x:
        h = act(_clipped(np.concatenate([x_t, h], 1) @ conv[0] + conv[1], clip))
        ys.append(h)
    return np.stack(ys), h


def spec_outputs(case, clip, **model) -> list:
    """The transcription's outputs for a one-direction ``case`` in ONNX's shapes."""
    conv, x = case.converted(0), f64(case.feeds["X"])
    reverse = case.direction == "reverse"
    x = x[::-1] if reverse else x
    h0 = case.initial("initial_h")[0]
    if case.kind == "lstm":
        out = spec_lstm(x, case.initial("initial_c")[0], h0, conv, clip, **model)
    elif case.kind == "gru":
        out = spec_gru(x, h0, conv, clip)
    else:
        out = spec_rnn(x, h0, conv, clip, conv.options["activation"])
    y = out[0][::-1] if reverse else out[0]
    return [y[:, None]] + [o[None] for o in out[1:]]


def clip_verdict(rng, kind) -> Verdict:
    """ORT with an active ``clip`` against the ONNX equations (the transcription, checked
    equal to gradcells without the clip); the LSTM's fault 40 model leaves ``Ct`` unclipped
    before ``h``."""
    case = Case(rng, kind, direction=DIRECTIONS[int(rng.integers(2))], lengths="full",
                initial=True)
    if kind == "lstm":
        case.feeds["initial_c"] = 3 * case.feeds["initial_c"]        # |Ct| past the clip
    clip = float(rng.uniform(0.2, 1.0))
    anchor = Verdict(case.verdict(spec_outputs(case, None), case.gradcells(), FLOAT64))
    out = case.run(clip=clip)
    model = (lambda: case.verdict(out, spec_outputs(case, clip, clip_cell=False))
             ) if kind == "lstm" else None
    if not anchor.truth.agrees:                 # the transcription itself is wrong
        return anchor
    return judge(case.verdict(out, spec_outputs(case, clip)), model)


# ---------------------------------------------------------------------------------------------
# What ONNX Runtime's CPU kernels refuse


def _refusal(error, words) -> str | None:
    """The sentence of ORT's error that names one of ``words`` (its last clause), or None
    when none does (then the error is not the refusal expected)."""
    sentences = str(error).replace("\n", " ").split(". ")
    named = [t for t in sentences if any(w in t for w in words)]
    return named[0].split(" : ")[-1].split("Status Message: ")[-1] if named else None


def batch_first_case(rng, kind) -> tuple[Case, list]:
    """A forward case with ``layout=1`` inputs (``X [B, T, I]``, states ``[B, D, H]``) and
    gradcells's ``batch_first=True`` outputs in layout 1's shapes."""
    case = Case(rng, kind, direction="forward", initial=True)
    seq = case._sequence(0, reverse=False, batch_first=True)
    truth = [seq.h[:, :, None], seq.h_final[:, None]]
    truth += [seq.cs_final[:, None]] if kind == "lstm" else []
    for name in ("X", "initial_h", "initial_c"):
        if name in case.feeds:
            case.feeds[name] = np.ascontiguousarray(case.feeds[name].swapaxes(0, 1))
    return case, truth


def layout_1(rng) -> Verdict:
    """``layout=1`` (batch first) against gradcells; fault 42: ORT refuses it."""
    verdicts = []
    for kind in OPERATORS:
        case, truth = batch_first_case(rng, kind)
        try:
            out = case.run(layout=1)
        except Exception as error:              # ORT's Fail, with its message
            reason = _refusal(error, ("Batchwise",))
            if reason is None:
                raise
            verdicts.append(refused(case.op, f"{case.op}: {reason[:70]}"))
            continue
        verdicts.append(Verdict(case.verdict(out, truth)))
    return worst_verdict(verdicts)


def float64_inputs(rng) -> Verdict:
    """float64 nodes against gradcells in float64; fault 41: ORT refuses them."""
    verdicts = []
    for kind in OPERATORS:
        case = Case(rng, kind, dtype=np.float64)
        try:
            out = case.run()
        except Exception as error:              # ORT's RuntimeException / NotImplemented
            reason = _refusal(error, ("double", "implementation"))
            if reason is None:
                raise
            verdicts.append(refused(case.op, f"{case.op}: {reason[:70]}"))
            continue
        verdicts.append(Verdict(case.verdict(out, case.gradcells(), FLOAT64)))
    return worst_verdict(verdicts)


# ---------------------------------------------------------------------------------------------
# The rows


def _rows(kind) -> list[Check]:
    op = OPERATORS[kind][0]
    via = f"layouts.{kind}_from_onnx"
    rows = [Check(f"{op} forward, direction={d} vs gradcells ({via})",
                  lambda rng, d=d: forward_verdict(rng, kind, direction=d)) for d in DIRECTIONS]
    rows += {"lstm": [Check("LSTM peepholes (P) vs gradcells wci, wcf, wco",
                            lambda rng: forward_verdict(rng, "lstm", peephole=True))],
             "gru": [Check(f"GRU linear_before_reset={n} vs gradcells reset_after={n == 1}",
                           lambda rng, n=n: forward_verdict(rng, "gru", linear_before_reset=n))
                     for n in (0, 1)],
             "rnn": [Check("RNN activations=[Relu] vs gradcells activation='relu'",
                           lambda rng: forward_verdict(rng, "rnn", activation="Relu"))]}[kind]
    return rows + [
        Check(f"{op} ragged sequence_lens (bidirectional) vs gradcells seq_len",
              lambda rng: forward_verdict(rng, kind, direction="bidirectional",
                                          lengths="ragged")),
        Check(f"{op} sequence_lens with zeros: Y_h of an empty row", lambda rng: zero_lengths(
            rng, kind), fault=43),
        Check(f"{op} activations given as ONNX's defaults ({', '.join(DEFAULT_ACTIVATIONS[kind])})",
              lambda rng: default_activations(rng, kind)),
        Check(f"{op} clip vs the ONNX equations (transcription)",
              lambda rng: clip_verdict(rng, kind), fault=40 if kind == "lstm" else None),
        Check(f"{op} weights from gradcells (layouts.{kind}_to_onnx)",
              lambda rng: to_onnx(rng, kind)),
        Check(f"{op} Y zero past each length, Y_h at the last valid step (reverse: step 0)",
              lambda rng: output_conventions(rng, kind)),
    ]


SECTION = "ONNX Runtime"
"""The framework's name, as the audit's title (and its docs/audit.md section) begins."""

CHECKS = tuple(check for kind in OPERATORS for check in _rows(kind)) + (
    Check("layout=1 (batch first) vs gradcells batch_first=True (LSTM, GRU, RNN)", layout_1,
          fault=42, cases=1),
    Check("float64 inputs (LSTM, GRU, RNN)", float64_inputs, fault=41, cases=1),
)
"""Every ONNX Runtime row, in order."""


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the ONNX Runtime audit; ImportError without it."""
    import onnx

    ort = _ort()
    title = (f"gradcells audit of {SECTION} {ort.__version__} (onnx {onnx.__version__}, "
             f"opset {OPSET}, CPUExecutionProvider, float32)")
    footer = ["no gradient rows: ONNX Runtime offers no gradient for LSTM, GRU or RNN",
              "not checked: input_forget, activation_alpha/beta and activations other than "
              "the defaults and Relu (gradcells has no such options)"]
    return title, CHECKS, footer
