"""``python -m gradcells audit tensorflow|torch``: another framework's fused recurrent ops
against the oracle and gradcells, one row per check.

Each check runs on ``examples`` generated cases (sizes, peepholes, forget biases and weights
drawn from one seeded generator) and ends in one of three verdicts:

* **agrees**: every case matches the truth within tolerance;
* **known fault N**: a case misses the truth, but matches the model of fault N of SPEC 6 (for
  instance, TensorFlow's clipped gradient equals gradcells's ``clip_grad="straight_through"``
  gradient): the mismatch is the documented one, nothing more;
* **unexpected mismatch**: a case matches neither (or the framework raised). Only these make
  the exit status 1.

The truth for a gradient is the oracle, ``check_vjp``: central differences in float64. For
PyTorch they are taken of PyTorch's own forward (float64). TensorFlow's ops take float32
only (fault 10), so their differences are taken of gradcells's float64 forward, which the
forward rows show equal to TensorFlow's to float32 round-off, and TensorFlow's float32
gradient is the claim, checked with the oracle's float32 tolerances.

The sequence forward and its backpropagation through time are run here step by step with
the public cell functions, so the audit does not depend on the sequence backends.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import cells, layouts
from .oracle import check_vjp
from .testing import gru_cell_case, lstm_cell_case

FRAMEWORKS = {"tensorflow": "tensorflow", "tf": "tensorflow", "torch": "torch",
              "pytorch": "torch"}

# SPEC 6, in a line each.
FAULTS = {
    1: "LSTMBlockCell's docs give gate order i, f, ci, o; the kernel uses i, ci, f, o",
    2: "the raw LSTM ops default to cell_clip=3.0: callers that pass nothing are clipped",
    3: "every LSTM gradient op passes the gradient straight through an active clip",
    4: "the seed's _LSTMBlockCellGrad passes wcf and wco swapped",
    5: "the seed's GRU gradient docstring has three errors (its code is right)",
    6: "BlockLSTMV2's registered gradient calls the V1 gradient op (other gate order)",
    7: "on GPU, LSTMBlockCellGrad adds the peephole term to cs_prev_grad twice",
    8: "BlockLSTM leaves i, f, o, ci, co uninitialised past seq_len_max",
    9: "TensorFlow 2 registers no gradient for LSTMBlockCell or GRUBlockCell",
    10: "the ops take float16/float32 only (GRU float32 only): no float64",
}

# |claim - truth| <= atol + rtol·|truth|, by what is compared.
FLOAT32_FORWARD = (1e-5, 1e-6)      # TensorFlow float32 vs gradcells float64, same inputs
FLOAT32_GRADIENT = (1e-4, 1e-5)     # TensorFlow float32 gradient vs gradcells float64
FLOAT64 = (1e-10, 1e-12)            # PyTorch float64 vs gradcells float64


# ---------------------------------------------------------------------------------------------
# Outcomes, checks and the table


@dataclass(frozen=True)
class Outcome:
    """The worst disagreement of one comparison: its ratio to the tolerance (<= 1 agrees),
    the absolute error there and the output or argument it was in."""

    ratio: float
    abs_error: float
    where: str

    @property
    def agrees(self) -> bool:
        return self.ratio <= 1.0


AGREES = Outcome(0.0, 0.0, "-")


def compare(pairs, tolerance) -> Outcome:
    """Worst of ``(name, claim, truth)`` comparisons under ``tolerance = (rtol, atol)``."""
    rtol, atol = tolerance
    worst = AGREES
    for name, claim, truth in pairs:
        claim = np.asarray(claim, dtype=np.float64)
        truth = np.asarray(truth, dtype=np.float64)
        if claim.shape != truth.shape:
            return Outcome(np.inf, np.inf, f"{name} (shape {claim.shape}, not {truth.shape})")
        if claim.size == 0:
            continue
        error = np.abs(claim - truth)
        error = np.where(np.isnan(error), np.inf, error)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(error == 0, 0.0, error / (atol + rtol * np.abs(truth)))
        k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        if ratio[k] > worst.ratio or worst is AGREES:
            worst = Outcome(float(ratio[k]), float(error[k]), name)
    return worst


def oracle_outcome(report) -> Outcome:
    """The oracle's ``VJPReport`` as an ``Outcome``."""
    worst = AGREES
    for c in report.checks:
        if not c.checked:
            continue
        ratio = c.abs_error / c.bound if c.bound > 0 else (0.0 if c.abs_error == 0 else np.inf)
        if ratio > worst.ratio or worst is AGREES:
            worst = Outcome(float(ratio), float(c.abs_error), c.name)
    return worst


@dataclass(frozen=True)
class Verdict:
    """One case's result: the outcome against the truth and, when a known fault is
    expected, against the fault's model (None when not needed or not modelled)."""

    truth: Outcome
    fault_model: Outcome | None = None
    raised: str | None = None

    def kind(self, fault) -> str:
        if self.raised is None and self.truth.agrees:
            return "agrees"
        if fault is not None and self.fault_model is not None and self.fault_model.agrees:
            return "fault"
        return "unexpected"


@dataclass(frozen=True)
class Check:
    """A row: ``case(rng) -> Verdict`` run ``cases`` times (None: ``examples``)."""

    name: str
    case: Callable
    fault: int | None = None
    cases: int | None = None


def _judge(claim: Outcome, fault_model: Callable[[], Outcome] | None) -> Verdict:
    """The verdict for ``claim``; the fault model is evaluated only on a mismatch."""
    if claim.agrees or fault_model is None:
        return Verdict(claim)
    return Verdict(claim, fault_model())


@dataclass
class Row:
    name: str
    cases: int
    result: str
    detail: str
    unexpected: bool


def _run_check(check: Check, rng, examples) -> Row:
    n = check.cases or examples
    verdicts = []
    for _ in range(n):
        try:
            verdicts.append(check.case(rng))
        except Exception as error:       # the framework failing is a finding, not a crash
            message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            verdicts.append(Verdict(Outcome(np.inf, np.inf, "-"), raised=message[:120]))
    kinds = [v.kind(check.fault) for v in verdicts]
    worst = max(verdicts, key=lambda v: (v.raised is not None, v.truth.ratio))
    if "unexpected" in kinds:
        bad = next(v for v, k in zip(verdicts, kinds) if k == "unexpected")
        detail = (f"raised {bad.raised}" if bad.raised else
                  f"|Δ| {bad.truth.abs_error:.2g} in {bad.truth.where} "
                  f"({bad.truth.ratio:.3g}× tolerance)")
        if check.fault is not None and bad.fault_model is not None and not bad.raised:
            detail += f"; not fault {check.fault} either"
        return Row(check.name, n, f"UNEXPECTED MISMATCH ({kinds.count('unexpected')}/{n})",
                   detail, True)
    if "fault" in kinds:
        count = kinds.count("fault")
        share = "" if count == n else f" ({count}/{n})"
        if worst.raised:
            detail = f"raises {worst.raised}"
        else:
            detail = f"|Δ| {worst.truth.abs_error:.2g} in {worst.truth.where}; matches the fault"
        return Row(check.name, n, f"known fault {check.fault}{share}", detail, False)
    detail = (f"max |Δ| {worst.truth.abs_error:.2g} ({worst.truth.ratio:.2g}× tolerance)"
              if worst.truth is not AGREES else "-")
    if check.fault is not None:
        detail += f"; fault {check.fault} not triggered"
    return Row(check.name, n, "agrees", detail, False)


class _Progress:
    """A one-line progress display on stderr (one line per check when not a terminal)."""

    def __init__(self, total, enabled, stream):
        self.total, self.enabled, self.stream = total, enabled, stream
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.width = 0

    def show(self, k, name):
        if not self.enabled:
            return
        text = f"audit [{k}/{self.total}] {name}"
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self):
        if self.tty:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()


def _table(rows):
    header = ("check", "cases", "result", "detail")
    cells_ = [header] + [(r.name, str(r.cases), r.result, r.detail) for r in rows]
    widths = [max(len(c[k]) for c in cells_) for k in range(3)]
    lines = []
    for k, c in enumerate(cells_):
        lines.append("  ".join(v.ljust(wd) for v, wd in zip(c[:3], widths)) + "  " + c[3])
        if k == 0:
            lines.append("  ".join("-" * wd for wd in widths) + "  " + "-" * 6)
    return [line.rstrip() for line in lines]


def run(framework, *, examples=10, seed=0, stream=None, progress=True, select=None) -> int:
    """Audit ``framework`` ("tensorflow" or "torch") and print one row per check to
    ``stream`` (default ``sys.stdout``); a progress line goes to stderr unless
    ``progress=False``. ``select``: run only the checks whose name contains this text
    (case-insensitive).

    Returns the exit status: 0 when every row agrees or shows a known fault, 1 when any row
    is an unexpected mismatch, 2 when the framework is not installed or ``select`` matches
    no check.
    """
    stream = sys.stdout if stream is None else stream
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {sorted(set(FRAMEWORKS.values()))}, "
                         f"got {framework!r}")
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples must be a positive integer, got {examples!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    framework = FRAMEWORKS[framework]
    try:
        title, checks, footer = (_tensorflow_checks() if framework == "tensorflow"
                                 else _torch_checks())
    except ImportError as error:
        print(f"gradcells audit: {framework} is not installed ({error}); "
              "pip install gradcells[conformance]", file=sys.stderr)
        return 2

    if select is not None:
        checks = [c for c in checks if select.lower() in c.name.lower()]
        if not checks:
            print(f"gradcells audit: --select {select!r} matches no {framework} check",
                  file=sys.stderr)
            return 2
    print(f"{title}; {examples} generated cases per check, seed {seed}", file=stream)
    print(file=stream)
    rng = np.random.default_rng(seed)
    bar = _Progress(len(checks), progress, sys.stderr)
    rows = []
    start = time.perf_counter()
    for k, check in enumerate(checks, 1):
        bar.show(k, check.name)
        rows.append(_run_check(check, rng, examples))
    bar.done()
    for line in _table(rows):
        print(line, file=stream)
    unexpected = sum(r.unexpected for r in rows)
    faults = sorted({int(r.result.split()[2]) for r in rows if r.result.startswith("known")})
    agreeing = sum(r.result == "agrees" for r in rows)
    print(file=stream)
    print(f"{_count(len(rows), 'check')}: {agreeing} agree, "
          f"{len(rows) - agreeing - unexpected} show known faults, "
          f"{_count(unexpected, 'unexpected mismatch', 'unexpected mismatches')} "
          f"({time.perf_counter() - start:.1f} s)", file=stream)
    for n in faults:
        print(f"  fault {n}: {FAULTS[n]}", file=stream)
    for line in footer:
        print(f"  {line}", file=stream)
    return 1 if unexpected else 0


def _count(n, singular, plural=None):
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


# ---------------------------------------------------------------------------------------------
# gradcells over time, step by step with the public cells


def lstm_steps(x, cs0, h0, w, b, *, wci=None, wcf=None, wco=None, forget_bias=0.0,
               cell_clip=None):
    """Every step's ``LSTMCellState`` of gradcells's LSTM over ``x [T, B, I]``."""
    states, cs, h = [], cs0, h0
    for x_t in x:
        state = cells.lstm_cell(x_t, cs, h, w, b, wci=wci, wcf=wcf, wco=wco,
                                forget_bias=forget_bias, cell_clip=cell_clip)
        states.append(state)
        cs, h = state.cs, state.h
    return states


def lstm_backprop(x, cs0, h0, w, b, states, d_cs, d_h, *, wci=None, wcf=None, wco=None,
                  cell_clip=None, clip_grad="exact"):
    """Backpropagation through time over ``lstm_steps``'s ``states`` for upstream gradients
    ``d_cs, d_h [T, B, H]`` of every step's cs and h. Returns the gradients of
    ``(x, cs0, h0, w, b[, wci, wcf, wco])``."""
    peepholes = wci is not None
    d_x = np.zeros(x.shape, dtype=np.result_type(x, w))
    carry_cs, carry_h = np.zeros_like(cs0), np.zeros_like(h0)
    totals = None
    for t in reversed(range(len(states))):
        cs_prev, h_prev = (cs0, h0) if t == 0 else (states[t - 1].cs, states[t - 1].h)
        g = cells.lstm_cell_grad(x[t], cs_prev, h_prev, w, b, states[t], d_h=d_h[t] + carry_h,
                                 d_cs=d_cs[t] + carry_cs, wci=wci, wcf=wcf, wco=wco,
                                 cell_clip=cell_clip, clip_grad=clip_grad)
        d_x[t], carry_cs, carry_h = g.x, g.cs_prev, g.h_prev
        params = [g.w, g.b] + ([g.wci, g.wcf, g.wco] if peepholes else [])
        totals = params if totals is None else [a + c for a, c in zip(totals, params)]
    if totals is None:
        totals = [np.zeros_like(w), np.zeros_like(b)] + (
            [np.zeros_like(wci)] * 3 if peepholes else [])
    return [d_x, carry_cs, carry_h] + totals


def gru_steps(x, h0, w_ru, w_c, b_ru, b_c, *, reset_after):
    """Every step's ``GRUCellState`` of gradcells's GRU over ``x [T, B, I]``."""
    states, h = [], h0
    for x_t in x:
        state = cells.gru_cell(x_t, h, w_ru, w_c, b_ru, b_c, reset_after=reset_after)
        states.append(state)
        h = state.h
    return states


def gru_backprop(x, h0, w_ru, w_c, b_ru, b_c, states, d_h, *, reset_after):
    """Backpropagation through time over ``gru_steps``'s ``states`` for ``d_h [T, B, H]``.
    Returns the gradients of ``(x, h0, w_ru, w_c, b_ru, b_c)``."""
    d_x = np.zeros(x.shape, dtype=np.result_type(x, w_ru))
    carry = np.zeros_like(h0)
    totals = [np.zeros_like(a) for a in (w_ru, w_c, b_ru, b_c)]
    for t in reversed(range(len(states))):
        h_prev = h0 if t == 0 else states[t - 1].h
        g = cells.gru_cell_grad(x[t], h_prev, w_ru, w_c, b_ru, b_c, states[t], d_h[t] + carry,
                                reset_after=reset_after)
        d_x[t], carry = g.x, g.h_prev
        totals = [a + c for a, c in zip(totals, (g.w_ru, g.w_c, g.b_ru, g.b_c))]
    return [d_x, carry] + totals


def _stack(states, field):
    return np.stack([getattr(s, field) for s in states])


# ---------------------------------------------------------------------------------------------
# Case generation

PEEPHOLES = ("wci", "wcf", "wco")


def _sizes(rng):
    return {"batch": int(rng.integers(1, 5)), "input_size": int(rng.integers(1, 6)),
            "hidden": int(rng.integers(1, 6))}


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _lstm_case(rng, dtype, **options):
    options.setdefault("peephole", bool(rng.integers(2)))
    options.setdefault("forget_bias", float(rng.choice([0.0, 1.0, -0.5, 2.5])))
    return lstm_cell_case(rng, dtype=dtype, **_sizes(rng), **options)


def _sequence(rng, case, dtype):
    """An input sequence ``x [T, B, I]`` for a cell case, T drawn from 1..4."""
    steps = int(rng.integers(1, 5))
    return rng.standard_normal((steps,) + case["x"].shape).astype(dtype)


# ---------------------------------------------------------------------------------------------
# TensorFlow


def _import_tensorflow():
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # no C++ INFO/WARNING lines
    import tensorflow as tf

    return tf


def _tf_peepholes(case):
    """TensorFlow's peephole arguments: the vectors (zeros when off) and ``use_peephole``."""
    hidden = int(case["cs_prev"].shape[1])
    zeros = np.zeros(hidden, dtype=np.dtype(case["cs_prev"].dtype.name))
    on = case["wci"] is not None
    return {k: case[k] if on else zeros for k in PEEPHOLES}, on


def _tensorflow_checks():
    tf = _import_tensorflow()
    raw = tf.raw_ops

    def block_cell(case, **attrs):
        peeps, on = _tf_peepholes(case)
        out = raw.LSTMBlockCell(x=case["x"], cs_prev=case["cs_prev"], h_prev=case["h_prev"],
                                w=case["w"], b=case["b"], use_peephole=on, **peeps, **attrs)
        return [o.numpy() for o in out]

    def clip_attr(case):
        return {"cell_clip": 0.0 if case["cell_clip"] is None else case["cell_clip"]}

    def reference_cell(case, **overrides):
        args = {k: _f64(case[k]) for k in ("x", "cs_prev", "h_prev", "w", "b") + PEEPHOLES}
        attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}
        attrs.update(overrides)
        return cells.lstm_cell(**args, **attrs)

    def state_pairs(tf_out, state):
        return list(zip(state._fields, tf_out, state))

    # -- LSTMBlockCell forward ---------------------------------------------------------------
    def lstm_forward(rng):
        case = _lstm_case(rng, np.float32, clip=bool(rng.integers(2)))
        out = block_cell(case, forget_bias=case["forget_bias"], **clip_attr(case))
        return Verdict(compare(state_pairs(out, reference_cell(case)), FLOAT32_FORWARD))

    def lstm_documented_order(rng):
        case = _lstm_case(rng, np.float32)
        out = block_cell(case, forget_bias=case["forget_bias"], cell_clip=0.0)
        documented = dict(case)      # the docs: columns i, f, ci, o, which gradcells reads as
        documented["w"], documented["b"] = layouts.lstm_from_tf_v2(case["w"], case["b"])
        return _judge(compare(state_pairs(out, reference_cell(documented)), FLOAT32_FORWARD),
                      lambda: compare(state_pairs(out, reference_cell(case)), FLOAT32_FORWARD))

    def lstm_default_clip(rng):
        case = _lstm_case(rng, np.float32)
        case["cs_prev"] = (5 * case["cs_prev"]).astype(np.float32)   # |cs| past 3 somewhere
        out = block_cell(case, forget_bias=case["forget_bias"])      # cell_clip not passed
        truth = compare(state_pairs(out, reference_cell(case, cell_clip=None)), FLOAT32_FORWARD)
        return _judge(truth, lambda: compare(
            state_pairs(out, reference_cell(case, cell_clip=3.0)), FLOAT32_FORWARD))

    # -- LSTMBlockCellGrad, assembled as the seed's wrapper does -------------------------------
    def block_cell_grad(case, state, d_cs, d_h, swap_peepholes=False):
        """The gradient of every input, as the seed's ``_LSTMBlockCellGrad`` builds it (with
        ``swap_peepholes``, passing wcf and wco swapped as the seed does)."""
        peeps, on = _tf_peepholes(case)
        if swap_peepholes:
            peeps = {"wci": peeps["wci"], "wcf": peeps["wco"], "wco": peeps["wcf"]}
        x, h_prev, w = case["x"], case["h_prev"], case["w"]
        cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad = raw.LSTMBlockCellGrad(
            x=x, cs_prev=case["cs_prev"], h_prev=h_prev, w=w, b=case["b"], **peeps,
            i=state[0], cs=state[1], f=state[2], o=state[3], ci=state[4], co=state[5],
            cs_grad=d_cs, h_grad=d_h, use_peephole=on)
        xh_grad = tf.matmul(dicfo, w, transpose_b=True)
        n_in = x.shape[1]
        w_grad = tf.matmul(tf.concat([x, h_prev], 1), dicfo, transpose_a=True)
        grads = [xh_grad[:, :n_in], cs_prev_grad, xh_grad[:, n_in:], w_grad,
                 tf.reduce_sum(dicfo, 0)]
        if on:
            grads += [wci_grad, wcf_grad, wco_grad]
        return [g.numpy() for g in grads]

    def lstm_grad_oracle(case, swap_peepholes=False):
        """The oracle's report on TensorFlow's gradient for ``case`` (float32 arrays)."""
        names = ("x", "cs_prev", "h_prev", "w", "b") + (PEEPHOLES if case["wci"] is not None
                                                         else ())
        attrs = {"forget_bias": case["forget_bias"], "cell_clip": case["cell_clip"]}

        def f(*arrays):
            state = cells.lstm_cell(*arrays[:5], **dict(zip(PEEPHOLES, arrays[5:])), **attrs,
                                    backend="reference")
            return state.cs, state.h

        def vjp(ct, *arrays):
            state = block_cell(case, forget_bias=case["forget_bias"], **clip_attr(case))
            return block_cell_grad(case, state, ct[0], ct[1], swap_peepholes)

        return check_vjp(f, vjp, [case[n] for n in names], names=names, seed=case["_seed"])

    def reference_cell_grad(case, ct, clip_grad="exact", swap_peepholes=False):
        args = {k: _f64(case[k]) for k in ("x", "cs_prev", "h_prev", "w", "b")}
        peeps = {k: _f64(case[k]) for k in PEEPHOLES}
        state = cells.lstm_cell(**args, **peeps, forget_bias=case["forget_bias"],
                                cell_clip=case["cell_clip"])
        if swap_peepholes:
            peeps = {"wci": peeps["wci"], "wcf": peeps["wco"], "wco": peeps["wcf"]}
        g = cells.lstm_cell_grad(*args.values(), state, d_cs=_f64(ct[0]), d_h=_f64(ct[1]),
                                 **peeps, cell_clip=case["cell_clip"], clip_grad=clip_grad)
        return [a for a in g if a is not None]

    def grad_vs_model(case, tf_grads, **model):
        ct = case["_cotangent"]
        names = ("x", "cs_prev", "h_prev", "w", "b") + PEEPHOLES
        return compare(zip(names, tf_grads, reference_cell_grad(case, ct, **model)),
                       FLOAT32_GRADIENT)

    def with_cotangent(case, rng):
        hidden = case["cs_prev"].shape
        case["_cotangent"] = tuple(rng.standard_normal(hidden).astype(np.float32)
                                   for _ in range(2))
        case["_seed"] = int(rng.integers(2**31))
        return case

    def tf_grads_for(case, swap_peepholes=False):
        state = block_cell(case, forget_bias=case["forget_bias"], **clip_attr(case))
        return block_cell_grad(case, state, *case["_cotangent"], swap_peepholes)

    def lstm_grad_vs_oracle(rng):
        case = with_cotangent(_lstm_case(rng, np.float32, clip=False), rng)
        return Verdict(oracle_outcome(lstm_grad_oracle(case)))

    def lstm_grad_vs_gradcells(rng):
        case = with_cotangent(_lstm_case(rng, np.float32, clip=False), rng)
        return Verdict(grad_vs_model(case, tf_grads_for(case)))

    def lstm_grad_clipped(rng):
        case = with_cotangent(_lstm_case(rng, np.float32, clip=True), rng)
        if case["cell_clip"] is None:        # nothing to clip in this draw: still a check
            return Verdict(oracle_outcome(lstm_grad_oracle(case)))
        return _judge(oracle_outcome(lstm_grad_oracle(case)),
                      lambda: grad_vs_model(case, tf_grads_for(case),
                                            clip_grad="straight_through"))

    def lstm_grad_seed_wrapper(rng):
        case = with_cotangent(_lstm_case(rng, np.float32, clip=False, peephole=True), rng)
        return _judge(oracle_outcome(lstm_grad_oracle(case, swap_peepholes=True)),
                      lambda: grad_vs_model(case, tf_grads_for(case, swap_peepholes=True),
                                            swap_peepholes=True))

    # -- GRUBlockCell ------------------------------------------------------------------------
    gru_names = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")

    def gru_case(rng):
        return gru_cell_case(rng, dtype=np.float32, reset_after=False, **_sizes(rng))

    def gru_block(case):
        return [o.numpy() for o in raw.GRUBlockCell(**{n: case[n] for n in gru_names})]

    def gru_block_grad(case, d_h):
        """Every input's gradient, as the seed's ``_GRUBlockCellGrad`` code builds it."""
        r, u, c, _ = gru_block(case)
        x, h_prev = case["x"], case["h_prev"]
        d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = raw.GRUBlockCellGrad(
            **{n: case[n] for n in gru_names}, r=r, u=u, c=c, d_h=d_h)
        d_w_ru = tf.matmul(tf.concat([x, h_prev], 1), d_r_bar_u_bar, transpose_a=True)
        d_w_c = tf.matmul(tf.concat([x, h_prev * r], 1), d_c_bar, transpose_a=True)
        return [g.numpy() for g in (d_x, d_h_prev, d_w_ru, d_w_c,
                                    tf.reduce_sum(d_r_bar_u_bar, 0), tf.reduce_sum(d_c_bar, 0))]

    def gru_reference(case):
        return cells.gru_cell(*(_f64(case[n]) for n in gru_names))

    def gru_forward(rng):
        case = gru_case(rng)
        return Verdict(compare(zip("ruch", gru_block(case), gru_reference(case)),
                               FLOAT32_FORWARD))

    def gru_grad_vs_oracle(rng):
        case = gru_case(rng)
        report = check_vjp(lambda *a: cells.gru_cell(*a, backend="reference").h,
                           lambda ct, *a: gru_block_grad(case, ct),
                           [case[n] for n in gru_names], names=gru_names,
                           seed=int(rng.integers(2**31)))
        return Verdict(oracle_outcome(report))

    def gru_grad_vs_gradcells(rng):
        case = gru_case(rng)
        d_h = rng.standard_normal(case["h_prev"].shape).astype(np.float32)
        args = [_f64(case[n]) for n in gru_names]
        truth = cells.gru_cell_grad(*args, cells.gru_cell(*args), _f64(d_h))
        return Verdict(compare(zip(gru_names, gru_block_grad(case, d_h), truth),
                               FLOAT32_GRADIENT))

    # -- BlockLSTM / BlockLSTMV2 -------------------------------------------------------------
    seq_names = ("x", "cs_prev", "h_prev", "w", "b")

    def seq_case(rng, version):
        case = _lstm_case(rng, np.float32, clip=False)
        if version == 2:
            case["forget_bias"] = 0.0
            case["w"], case["b"] = layouts.lstm_to_tf_v2(case["w"], case["b"])
        case["x"] = _sequence(rng, case, np.float32)
        return case

    def seq_names_of(case):
        return seq_names + (PEEPHOLES if case["wci"] is not None else ())

    def block_lstm(case, version, arrays=None, seq_len_max=None):
        arrays = dict(case, **(arrays or {}))
        peeps, on = _tf_peepholes(arrays)
        steps = arrays["x"].shape[0] if seq_len_max is None else seq_len_max
        common = dict(seq_len_max=np.int64(steps), x=arrays["x"], cs_prev=arrays["cs_prev"],
                      h_prev=arrays["h_prev"], w=arrays["w"], b=arrays["b"], use_peephole=on,
                      **peeps)
        if version == 1:
            return raw.BlockLSTM(**common, forget_bias=case["forget_bias"], cell_clip=0.0)
        return raw.BlockLSTMV2(**common)

    def gradcells_seq(case, version, arrays):
        """(cs, h) of every step, gradcells in the arrays' dtype, for ``arrays`` (in ``case``'s
        weight layout)."""
        a = dict(arrays)
        w, b = (layouts.lstm_from_tf_v2(a["w"], a["b"]) if version == 2 else (a["w"], a["b"]))
        states = lstm_steps(a["x"], a["cs_prev"], a["h_prev"], w, b,
                            **{k: a.get(k) for k in PEEPHOLES},
                            forget_bias=case["forget_bias"])
        return _stack(states, "cs"), _stack(states, "h")

    def seq_forward(version):
        def run_case(rng):
            case = seq_case(rng, version)
            out = [o.numpy() for o in block_lstm(case, version)]
            a = {k: _f64(case[k]) for k in seq_names + PEEPHOLES}
            w, b = ((layouts.lstm_from_tf_v2(a["w"], a["b"])) if version == 2
                    else (a["w"], a["b"]))
            states = lstm_steps(a["x"], a["cs_prev"], a["h_prev"], w, b,
                                **{k: a[k] for k in PEEPHOLES}, forget_bias=case["forget_bias"])
            fields = ("i", "cs", "f", "o", "ci", "co", "h")
            return Verdict(compare([(n, o, _stack(states, n)) for n, o in zip(fields, out)],
                                   FLOAT32_FORWARD))
        return run_case

    def tape_grads(case, version, ct):
        names = seq_names_of(case)
        tensors = [tf.constant(case[n]) for n in names]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            out = block_lstm(case, version, dict(zip(names, tensors)))
        grads = tape.gradient([out[1], out[6]], tensors, output_gradients=list(ct))
        return [None if g is None else g.numpy() for g in grads]

    def seq_oracle(case, version, vjp):
        names = seq_names_of(case)

        def f(*arrays):
            return gradcells_seq(case, version, dict(zip(names, arrays)))

        return check_vjp(f, vjp, [case[n] for n in names], names=names,
                         seed=int(case["_seed"]))

    def seq_case_with_cotangent(rng, version):
        case = seq_case(rng, version)
        shape = case["x"].shape[:2] + (case["cs_prev"].shape[1],)
        case["_cotangent"] = tuple(rng.standard_normal(shape).astype(np.float32)
                                   for _ in range(2))
        case["_seed"] = int(rng.integers(2**31))
        return case

    def v1_tape_gradient(rng):
        case = seq_case_with_cotangent(rng, 1)
        return Verdict(oracle_outcome(seq_oracle(
            case, 1, lambda ct, *a: tape_grads(case, 1, ct))))

    def v2_tape_gradient(rng):
        case = seq_case_with_cotangent(rng, 2)
        report = seq_oracle(case, 2, lambda ct, *a: tape_grads(case, 2, ct))

        def v1_order_model():
            # The V1 gradient op reads V2's weights (i, f, ci, o) as if they were i, ci, f, o:
            # backpropagation through the true states with the weight matrix taken as is.
            a = {k: _f64(case[k]) for k in seq_names + PEEPHOLES}
            peeps = {k: a[k] for k in PEEPHOLES}
            w, b = layouts.lstm_from_tf_v2(a["w"], a["b"])
            states = lstm_steps(a["x"], a["cs_prev"], a["h_prev"], w, b, **peeps)
            model = lstm_backprop(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], states,
                                  *(_f64(c) for c in case["_cotangent"]), **peeps,
                                  clip_grad="straight_through")
            return compare(zip(seq_names_of(case), tape_grads(case, 2, case["_cotangent"]),
                               model), FLOAT32_GRADIENT)

        return _judge(oracle_outcome(report), v1_order_model)

    def v2_grad_op(rng):
        case = seq_case_with_cotangent(rng, 2)

        def vjp(ct, *arrays):
            out = block_lstm(case, 2)
            peeps, on = _tf_peepholes(case)
            grads = raw.BlockLSTMGradV2(
                seq_len_max=np.int64(case["x"].shape[0]), x=case["x"], cs_prev=case["cs_prev"],
                h_prev=case["h_prev"], w=case["w"], b=case["b"], **peeps, i=out[0], cs=out[1],
                f=out[2], o=out[3], ci=out[4], co=out[5], h=out[6], cs_grad=ct[0],
                h_grad=ct[1], use_peephole=on)
            x_g, cs_g, h_g, w_g, wci_g, wcf_g, wco_g, b_g = (g.numpy() for g in grads)
            return [x_g, cs_g, h_g, w_g, b_g] + ([wci_g, wcf_g, wco_g] if on else [])

        return Verdict(oracle_outcome(seq_oracle(case, 2, vjp)))

    def past_seq_len_max(rng):
        case = seq_case(rng, 1)
        steps = case["x"].shape[0]
        case["x"] = np.concatenate([case["x"], case["x"][-1:]])      # at least one step past
        seq_len_max = int(rng.integers(0, steps))
        out = [o.numpy()[seq_len_max:] for o in block_lstm(case, 1, seq_len_max=seq_len_max)]
        fields = ("i", "cs", "f", "o", "ci", "co", "h")
        truth = compare([(n, o, np.zeros_like(o)) for n, o in zip(fields, out)], (0.0, 0.0))
        zero_state = [(n, o, np.zeros_like(o)) for n, o in zip(fields, out) if n in ("cs", "h")]
        return _judge(truth, lambda: compare(zero_state, (0.0, 0.0)))

    # -- What TensorFlow does not offer ------------------------------------------------------
    def float64_inputs(rng):
        verdicts = []
        case64 = _lstm_case(rng, np.float64)
        gru64 = gru_cell_case(rng, dtype=np.float64, **_sizes(rng))
        seq64 = dict(case64, x=_sequence(rng, case64, np.float64))
        attempts = [
            ("LSTMBlockCell", lambda: block_cell(case64, forget_bias=case64["forget_bias"],
                                                 cell_clip=0.0),
             lambda out: compare(state_pairs(out, reference_cell(case64, cell_clip=None)),
                                 FLOAT64)),
            ("GRUBlockCell", lambda: gru_block(gru64),
             lambda out: compare(zip("ruch", out, gru_reference(gru64)), FLOAT64)),
            ("BlockLSTMV2", lambda: [o.numpy() for o in block_lstm(seq64, 2)],
             lambda out: compare([("h", out[6], gradcells_seq(
                 dict(seq64, forget_bias=0.0), 2,
                 {k: seq64[k] for k in seq_names + PEEPHOLES})[1])], FLOAT64)),
        ]
        for name, call, judge in attempts:
            try:
                out = call()
            except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as error:
                reason = str(error).splitlines()[0].split(";")[0][:90]
                verdicts.append(Verdict(Outcome(np.inf, np.inf, name), Outcome(0, 0, name),
                                        raised=f"{type(error).__name__} ({name}: {reason})"))
                continue
            verdicts.append(Verdict(judge(out)))
        return max(verdicts, key=lambda v: (v.raised is None and not v.truth.agrees,
                                            v.raised is not None))

    def registered_gradient(rng):
        verdicts = []
        lstm = _lstm_case(rng, np.float32, peephole=False)
        gru = gru_case(rng)
        for name, call in (("LSTMBlockCell", lambda x: raw.LSTMBlockCell(
                                x=x, **{k: lstm[k] for k in ("cs_prev", "h_prev", "w", "b")},
                                **_tf_peepholes(lstm)[0], forget_bias=lstm["forget_bias"],
                                cell_clip=0.0)[6]),
                           ("GRUBlockCell", lambda x: raw.GRUBlockCell(
                               x=x, **{k: gru[k] for k in gru_names[1:]})[3])):
            x = tf.constant(lstm["x"] if name == "LSTMBlockCell" else gru["x"])
            with tf.GradientTape() as tape:
                tape.watch(x)
                h = call(x)
            try:
                grad = tape.gradient(h, x).numpy()
            except LookupError as error:
                verdicts.append(Verdict(Outcome(np.inf, np.inf, name), Outcome(0, 0, name),
                                        raised=f"LookupError ({error})"))
                continue
            if name == "LSTMBlockCell":
                args = {k: _f64(lstm[k]) for k in ("x", "cs_prev", "h_prev", "w", "b")}
                peeps = {k: _f64(lstm[k]) for k in PEEPHOLES}
                state = cells.lstm_cell(**args, **peeps, forget_bias=lstm["forget_bias"])
                truth = cells.lstm_cell_grad(*args.values(), state, d_h=np.ones_like(state.h),
                                             **peeps).x
            else:
                args = [_f64(gru[n]) for n in gru_names]
                state = cells.gru_cell(*args)
                truth = cells.gru_cell_grad(*args, state, np.ones_like(state.h)).x
            verdicts.append(Verdict(compare([("x", grad, truth)], FLOAT32_GRADIENT)))
        return max(verdicts, key=lambda v: (v.raised is None and not v.truth.agrees,
                                            v.raised is not None))

    checks = [
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
        Check("BlockLSTM forward", seq_forward(1)),
        Check("BlockLSTMV2 forward (via layouts.lstm_from_tf_v2)", seq_forward(2)),
        Check("BlockLSTM gradient (GradientTape) vs oracle", v1_tape_gradient),
        Check("BlockLSTMV2 gradient (GradientTape) vs oracle", v2_tape_gradient, fault=6),
        Check("BlockLSTMGradV2 op vs oracle", v2_grad_op),
        Check("BlockLSTM outputs past seq_len_max are zero", past_seq_len_max, fault=8),
        Check("float64 inputs (LSTMBlockCell, GRUBlockCell, BlockLSTMV2)", float64_inputs,
              fault=10, cases=1),
        Check("registered gradient (LSTMBlockCell, GRUBlockCell)", registered_gradient,
              fault=9, cases=1),
    ]
    devices = [d.device_type for d in tf.config.list_physical_devices()]
    footer = ["not checked here: fault 5 (a docstring; the notebooks derive the right formulas)"]
    if "GPU" not in devices:
        footer.append("not checked here: fault 7 (GPU kernel; this TensorFlow sees no GPU)")
    title = f"gradcells audit of TensorFlow {tf.__version__} ({', '.join(sorted(set(devices)))})"
    return title, checks, footer


# ---------------------------------------------------------------------------------------------
# PyTorch


def _torch_checks():
    import torch
    from torch.func import functional_call

    def tensor(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    def lstm_params(rng, input_size, hidden):
        """PyTorch-layout LSTM parameters with both biases nonzero."""
        scale = 1 / np.sqrt(hidden)
        return {"weight_ih": scale * rng.standard_normal((4 * hidden, input_size)),
                "weight_hh": scale * rng.standard_normal((4 * hidden, hidden)),
                "bias_ih": 0.3 * rng.standard_normal(4 * hidden),
                "bias_hh": 0.3 * rng.standard_normal(4 * hidden)}

    def gru_params(rng, input_size, hidden):
        scale = 1 / np.sqrt(hidden)
        return {"weight_ih": scale * rng.standard_normal((3 * hidden, input_size)),
                "weight_hh": scale * rng.standard_normal((3 * hidden, hidden)),
                "bias_ih": 0.3 * rng.standard_normal(3 * hidden),
                "bias_hh": 0.3 * rng.standard_normal(3 * hidden)}

    param_names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")

    class Case:
        """One generated case for one module: its inputs, parameters and cotangents."""

        def __init__(self, rng, kind, sequence):
            sizes = _sizes(rng)
            batch, n_in, hidden = sizes["batch"], sizes["input_size"], sizes["hidden"]
            self.kind, self.sequence, self.hidden = kind, sequence, hidden
            lstm = kind == "lstm"
            module_type = {(True, False): torch.nn.LSTMCell, (True, True): torch.nn.LSTM,
                           (False, False): torch.nn.GRUCell, (False, True): torch.nn.GRU}
            self.module = module_type[lstm, sequence](n_in, hidden, dtype=torch.float64)
            self.suffix = "_l0" if sequence else ""
            steps = int(rng.integers(1, 5))
            x_shape = (steps, batch, n_in) if sequence else (batch, n_in)
            self.inputs = {"x": rng.standard_normal(x_shape),
                           "h": 0.5 * rng.standard_normal((batch, hidden))}
            if lstm:
                self.inputs["c"] = rng.standard_normal((batch, hidden))
            self.params = (lstm_params if lstm else gru_params)(rng, n_in, hidden)
            self.seed = int(rng.integers(2**31))
            self.names = tuple(self.inputs) + param_names
            self.args = [self.inputs[k] for k in self.inputs] + [self.params[k]
                                                                 for k in param_names]
            self.cotangent = tuple(rng.standard_normal(o.shape) for o in self.forward(*self.args))

        def torch_outputs(self, tensors):
            """PyTorch's outputs for tensors aligned with ``names``: (h, c) or h for a cell;
            (every step's h, final c) or every step's h for a sequence."""
            named = dict(zip(self.names, tensors))
            params = {k + self.suffix: named[k] for k in param_names}
            x, h = named["x"], named["h"]
            if self.sequence:
                h = h[None]
                state = (h, named["c"][None]) if self.kind == "lstm" else h
                out, final = functional_call(self.module, params, (x, state))
                return (out, final[1][0]) if self.kind == "lstm" else (out,)
            state = (h, named["c"]) if self.kind == "lstm" else h
            out = functional_call(self.module, params, (x, state))
            return tuple(out) if self.kind == "lstm" else (out,)

        def forward(self, *arrays):
            with torch.no_grad():
                return tuple(o.numpy() for o in self.torch_outputs([tensor(a) for a in arrays]))

        def vjp(self, ct, *arrays):
            tensors = [tensor(a).requires_grad_() for a in arrays]
            outputs = self.torch_outputs(tensors)
            grads = torch.autograd.grad(outputs, tensors, [tensor(c) for c in ct],
                                        allow_unused=True)
            return [None if g is None else g.numpy() for g in grads]

        # gradcells's view of the same computation
        def gradcells_weights(self):
            convert = layouts.lstm_from_torch if self.kind == "lstm" else layouts.gru_from_torch
            return convert(*(self.params[k] for k in param_names))

        def gradcells_forward(self):
            x, h = self.inputs["x"], self.inputs["h"]
            weights = self.gradcells_weights()
            xs = x if self.sequence else x[None]
            if self.kind == "lstm":
                states = lstm_steps(xs, self.inputs["c"], h, *weights)
                outs = (_stack(states, "h"), states[-1].cs)
                return outs if self.sequence else (outs[0][0], outs[1])
            states = gru_steps(xs, h, *weights, reset_after=True)
            return (_stack(states, "h") if self.sequence else states[0].h,)

        def gradcells_grads(self):
            """gradcells's gradients in PyTorch's parameter layout, aligned with ``names``."""
            x, h = self.inputs["x"], self.inputs["h"]
            weights = self.gradcells_weights()
            xs = x if self.sequence else x[None]
            ct = self.cotangent
            d_h = ct[0] if self.sequence else ct[0][None]
            if self.kind == "lstm":
                states = lstm_steps(xs, self.inputs["c"], h, *weights)
                d_cs = np.zeros_like(d_h)
                d_cs[-1] = ct[1]
                d_x, d_c, d_h0, d_w, d_b = lstm_backprop(xs, self.inputs["c"], h, *weights,
                                                         states, d_cs, d_h)
                d_weight_ih, d_weight_hh, d_bias, _ = layouts.lstm_to_torch(d_w, d_b)
                inputs = [d_x if self.sequence else d_x[0], d_h0, d_c]
                return inputs + [d_weight_ih, d_weight_hh, d_bias, d_bias]
            states = gru_steps(xs, h, *weights, reset_after=True)
            d_x, d_h0, d_w_ru, d_w_c, d_b_ru, d_b_c = gru_backprop(
                xs, h, *weights, states, d_h, reset_after=True)
            d_weight_ih, d_weight_hh, _, _ = layouts.gru_to_torch(d_w_ru, d_w_c, d_b_ru, d_b_c)
            hidden = self.hidden
            return [d_x if self.sequence else d_x[0], d_h0, d_weight_ih, d_weight_hh,
                    np.concatenate([d_b_ru, d_b_c[:hidden]]),
                    np.concatenate([d_b_ru, d_b_c[hidden:]])]

    def forward_check(kind, sequence):
        def run_case(rng):
            case = Case(rng, kind, sequence)
            names = ("h", "c") if kind == "lstm" else ("h",)
            return Verdict(compare(zip(names, case.forward(*case.args),
                                       case.gradcells_forward()), FLOAT64))
        return run_case

    def oracle_check(kind, sequence):
        def run_case(rng):
            case = Case(rng, kind, sequence)
            report = check_vjp(case.forward, case.vjp, case.args, names=case.names,
                               cotangent=case.cotangent, seed=case.seed)
            return Verdict(oracle_outcome(report))
        return run_case

    def gradcells_check(kind, sequence):
        def run_case(rng):
            case = Case(rng, kind, sequence)
            claim = case.vjp(case.cotangent, *case.args)
            return Verdict(compare(zip(case.names, claim, case.gradcells_grads()), FLOAT64))
        return run_case

    checks = []
    for label, kind, sequence in (("nn.LSTMCell", "lstm", False), ("nn.GRUCell", "gru", False),
                                  ("nn.LSTM", "lstm", True), ("nn.GRU", "gru", True)):
        via = "lstm" if kind == "lstm" else "gru"
        checks += [
            Check(f"{label} forward vs gradcells (layouts.{via}_from_torch)",
                  forward_check(kind, sequence)),
            Check(f"{label} autograd vs oracle", oracle_check(kind, sequence)),
            Check(f"{label} autograd vs gradcells", gradcells_check(kind, sequence)),
        ]
    title = f"gradcells audit of PyTorch {torch.__version__} (CPU, float64)"
    return title, checks, []
