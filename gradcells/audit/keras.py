"""The audit of Keras 3's recurrent layers (``keras.layers.LSTM``, ``GRU`` with
``reset_after=True`` and ``False``, ``SimpleRNN``) on every Keras backend (TensorFlow, JAX,
PyTorch), in float64: the forward against gradcells through ``gc.layouts``
(``*_from_keras``); each backend's own autodiff, reverse mode and forward mode, against the
oracle (central differences of the Keras forward itself) and against gradcells's
``*_sequence_grad`` and ``*_sequence_jvp``; and its second derivative, the tangent of the
gradient (the Hessian of ``<cotangent, outputs>`` times the tangents), against
``*_sequence_grad_jvp``. Forward mode is TensorFlow's ``ForwardAccumulator``, ``jax.jvp`` and
PyTorch's dual tensors (``torch.autograd.forward_ad``); the second derivative is
reverse-over-reverse on TensorFlow and PyTorch (the Hessian is symmetric) and ``jax.jvp`` of
``jax.vjp`` on JAX.

Keras picks its backend at import, so each backend's layers run in a subprocess of their
own (``_keras_runner``), started once per run and given every case of that backend; a case
(sizes, weights, ``go_backwards``, ``unroll``, ``return_sequences``, ``return_state``, and
for the masked rows a ``mask`` of right-padded ragged lengths, which gradcells reads as
``seq_len``) is drawn once per run and shared by the three rows of its cell and by the three
backends, and its result is computed once. On JAX the layer runs under ``jax.jit``, as JAX
users run it (eagerly, ``lax.scan`` compiles anew on every call). ``go_backwards=True`` is
gradcells's ``reverse=True`` with the outputs in reversed time order.

A row's models are built from the entries of ``faults`` that apply to it (``row_entries``):
Keras's masking (convention 30: a masked step repeats the previous output; fault 31: on
JAX's scan path, h0 before the first valid step) and float32 round-off (fault 32). A case
that misses gradcells's result is explained by the smallest set of them whose model agrees,
and the row names that set. Masked rows draw lengths from 0: a fully masked row keeps h0 as
its state, and its outputs follow the same models. ``checks()`` raises ImportError when
Keras is not installed; a backend that fails to import makes its rows skipped.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import gradcells as gc

from .. import layouts
from ._cases import sizes
from ._engine import (
    FLOAT32_FORWARD,
    FLOAT32_GRADIENT,
    FLOAT64,
    Check,
    Outcome,
    Skipped,
    Verdict,
    compare,
    judge,
    judge_entries,
    oracle_outcome,
    refused,
)

BACKENDS = ("tensorflow", "jax", "torch")
CELLS = (("LSTM", "lstm", None), ("GRU(reset_after=True)", "gru", True),
         ("GRU(reset_after=False)", "gru", False), ("SimpleRNN", "rnn", None))
GATES = {"lstm": 4, "gru": 3, "rnn": 1}
FLAGS = ("go_backwards", "unroll", "return_sequences", "return_state")
REPEATED, H0_FIRST, FLOAT32_PATH = 30, 31, 32
"""The entries of ``faults`` that Keras's results follow: a masked step repeats the previous
output (convention 30), on JAX's ``lax.scan`` path masked steps before the first valid one
output h0 (fault 31), the layers compute float64 in float32 (fault 32, ``float32_path``)."""
MASKING = frozenset((REPEATED, H0_FIRST))


def float32_path(backend, cell, reset_after, masked) -> bool:
    """Whether the backend runs the layer through float32 (fault 32): JAX always; PyTorch in
    its generic loop (masked, GRU reset-before, SimpleRNN), not its fused LSTM and GRU."""
    if backend == "jax":
        return True
    return backend == "torch" and (masked or cell == "rnn" or reset_after is False)


def row_entries(backend, cell, reset_after, masked, kind) -> tuple[int, ...]:
    """The entries a row of ``kind`` (a key of ``KINDS``) may show: the masking's (30; on
    JAX's scan path, which SimpleRNN never takes there, also 31) where masked outputs are
    compared with gradcells's, and fault 32 where the backend computes in float32."""
    entries = ()
    if masked and kind not in ORACLES:
        entries = (REPEATED, H0_FIRST) if backend == "jax" and cell != "rnn" else (REPEATED,)
    return entries + ((FLOAT32_PATH,) if float32_path(backend, cell, reset_after, masked)
                      else ())


def case_entries(backend, case, kind) -> tuple[int, ...]:
    """``row_entries`` for one case: fault 31 only where it takes JAX's scan path
    (``unroll=False``)."""
    entries = row_entries(backend, case.cell, case.reset_after, case.lengths is not None, kind)
    return tuple(e for e in entries if e != H0_FIRST or not case.options["unroll"])


# ---------------------------------------------------------------------------------------------
# The subprocesses, one per backend


class Worker:
    """A ``_keras_runner`` subprocess for one backend; ``version`` is Keras's, or ``error``
    says why the backend could not start."""

    def __init__(self, backend):
        self.dir = tempfile.TemporaryDirectory(prefix=f"gradcells-keras-{backend}-")
        self.log = open(Path(self.dir.name) / "stderr.txt", "w+")
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, KERAS_BACKEND=backend,
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gradcells.audit._keras_runner", backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=env, cwd=root)
        self.jobs, self.answered, self.answers, self._error = 0, 0, {}, None

    @property
    def error(self) -> str | None:
        """Why the backend could not start, or None (waits for the runner's first line)."""
        if self._error is None:
            first = self._answer()
            self._error = first[len("error: "):] if first.startswith("error") else ""
        return self._error or None

    def _answer(self) -> str:
        line = self.process.stdout.readline().strip()
        if line:
            return line
        self.log.seek(0)
        tail = self.log.read().strip().splitlines()[-1:] or ["no output"]
        return f"error: the subprocess ended ({tail[0][:100]})"

    def submit(self, arrays: dict, spec: dict) -> int:
        """Send a job to the runner, which works on while the caller goes on; returns the
        job's number for ``result``."""
        self.jobs += 1
        path = str(Path(self.dir.name) / f"job{self.jobs}.npz")
        np.savez(path, spec=json.dumps(spec), **arrays)
        self.process.stdin.write(path + "\n")
        self.process.stdin.flush()
        return self.jobs

    def result(self, job: int) -> dict:
        """Job ``job``'s result (outputs, derivatives, the oracle's rows), waiting for it;
        the runner answers in order, so the answers before it are kept."""
        while self.answered < job:
            self.answered += 1
            self.answers[self.answered] = self._answer()
        answer = self.answers.pop(job)
        if answer.startswith("error"):
            raise RuntimeError(answer[len("error: "):])
        with np.load(answer) as stored:
            return {k: stored[k] for k in stored.files}

    def run(self, arrays: dict, spec: dict) -> dict:
        return self.result(self.submit(arrays, spec))

    def close(self):
        if self.process.poll() is None:
            if self.answered < self.jobs:      # jobs sent ahead and not needed: drop them
                self.process.kill()
            else:
                self.process.stdin.close()
            self.process.wait(timeout=30)
        self.log.close()
        self.dir.cleanup()


_WORKERS: dict[str, Worker] = {}
_RUN = {"rng": None, "base": 0, "counts": {}, "jobs": {}, "results": {}}
"""This run's state: its generator, the seed its cases derive from, each row's count of
cases, the jobs sent, and the results of the cases run so far, by backend and case."""


def worker(backend) -> Worker:
    """The backend's subprocess (started on first use); Skipped when the backend cannot
    import."""
    if backend not in _WORKERS:          # start every backend at once: their imports overlap
        _WORKERS.update({b: Worker(b) for b in BACKENDS if b not in _WORKERS})
    found = _WORKERS[backend]
    if found.error is not None:
        raise Skipped(f"the {backend} backend does not import: {found.error}"[:150])
    return found


@atexit.register
def close_workers():
    for w in _WORKERS.values():
        w.close()
    _WORKERS.clear()


def _case_index(rng, row) -> tuple[int, int]:
    """``(base, k)``: this run's seed and the number of this row's cases so far (a new
    generator is a new run)."""
    if _RUN["rng"] is not rng:
        _RUN.update(rng=rng, base=int(rng.integers(2**31)), counts={}, jobs={}, results={})
    k = _RUN["counts"].get(row, 0)
    _RUN["counts"][row] = k + 1
    return _RUN["base"], k


# ---------------------------------------------------------------------------------------------
# The cases


def keras_weights(rng, cell, reset_after, n_in, hidden) -> dict:
    """Keras-layout weights with every bias nonzero (GRU reset-after: both bias rows)."""
    width = GATES[cell] * hidden
    scale = 1 / np.sqrt(hidden)
    bias_shape = (2, width) if reset_after else (width,)
    return {"kernel": scale * rng.standard_normal((n_in, width)),
            "recurrent_kernel": scale * rng.standard_normal((hidden, width)),
            "bias": 0.3 * rng.standard_normal(bias_shape)}


class Case:
    """One drawn case of one cell: the Keras arguments (batch first), the layer's options
    (drawn, but for those given in ``options``), the right-padded lengths from 0, not all 0
    (None: unmasked), a cotangent of each output and a tangent of each argument."""

    def __init__(self, rng, cell, reset_after, masked, **options):
        drawn = sizes(rng)
        batch, n_in, hidden = drawn["batch"], drawn["input_size"], drawn["hidden"]
        steps = int(rng.integers(1, 5))
        self.cell, self.reset_after, self.hidden = cell, reset_after, hidden
        self.options = {f: bool(rng.integers(2)) for f in FLAGS} | options
        self.args = {"x": rng.standard_normal((batch, steps, n_in)),
                     "h0": 0.5 * rng.standard_normal((batch, hidden))}
        if cell == "lstm":
            self.args["c0"] = rng.standard_normal((batch, hidden))
        self.args.update(keras_weights(rng, cell, reset_after, n_in, hidden))
        self.lengths = rng.integers(0, steps + 1, batch) if masked else None
        if masked and not self.lengths.any():      # all empty would check nothing past h0
            self.lengths[rng.integers(batch)] = steps
        shapes = [(batch, steps, hidden) if self.options["return_sequences"] else
                  (batch, hidden)]
        if self.options["return_state"]:
            shapes += [(batch, hidden)] * (2 if cell == "lstm" else 1)
        self.cotangent = [rng.standard_normal(s) for s in shapes]
        self.seed = int(rng.integers(2**31))
        self.tangents = {n: rng.standard_normal(a.shape) for n, a in self.args.items()}

    @property
    def steps(self) -> int:
        return self.args["x"].shape[1]

    @property
    def key(self) -> tuple:
        """What tells the case's job from another's (the tests set options and lengths)."""
        lengths = None if self.lengths is None else tuple(self.lengths.tolist())
        return self.cell, self.reset_after, self.seed, tuple(self.options.items()), lengths

    def job(self) -> tuple[dict, dict]:
        """The runner's arrays and spec."""
        arrays = dict(self.args, **{f"ct{k}": c for k, c in enumerate(self.cotangent)},
                      **{f"t_{n}": t for n, t in self.tangents.items()})
        if self.lengths is not None:
            arrays["mask"] = np.arange(self.steps) < self.lengths[:, None]
        spec = dict(self.options, cell=self.cell, reset_after=self.reset_after,
                    hidden=self.hidden, names=list(self.args), outputs=len(self.cotangent),
                    seed=self.seed)
        return arrays, spec


def drawn_case(rng, row, backend, cell, reset_after, masked) -> Case:
    """Case k of this run for the cell (k: the count of cases of the row named ``row``),
    the same for every row and backend asking for it."""
    base, k = _case_index(rng, (row, backend, cell, reset_after, masked))
    index = [base, [c[1:] for c in CELLS].index((cell, reset_after)), int(masked), k]
    return Case(np.random.default_rng(index), cell, reset_after, masked)


def keras_result(backend, case) -> dict:
    """The runner's result for the case (once per run). The case goes to every backend's
    runner at once: their rows come later, and the runners work meanwhile."""
    key = case.key
    if (backend, key) not in _RUN["results"]:
        for other in (backend, *BACKENDS):
            if (other, key) not in _RUN["jobs"] and _available(other):
                _RUN["jobs"][other, key] = worker(other).submit(*backend_job(other, case))
        _RUN["results"][backend, key] = worker(backend).result(_RUN["jobs"][backend, key])
    return _RUN["results"][backend, key]


def _available(backend) -> bool:
    """Whether the backend's runner started (its Keras imports)."""
    try:
        worker(backend)
    except Skipped:
        return False
    return True


def backend_job(backend, case) -> tuple[dict, dict]:
    """The case's job for the backend's runner."""
    arrays, spec = case.job()
    if backend == "jax" and case.cell == "rnn":
        spec["unroll"] = True          # fault 33: the scan raises; its own row
    return arrays, spec


# ---------------------------------------------------------------------------------------------
# gradcells's view of the same case


def gradcells_arrays(case, named) -> tuple[tuple, dict]:
    """``named`` (the case's arguments, or their tangents: the converters are linear) as
    gradcells's positional arrays, and the converted set's options."""
    weights = (named["kernel"], named["recurrent_kernel"], named["bias"])
    if case.cell == "lstm":
        conv = layouts.lstm_from_keras(*weights)
    elif case.cell == "gru":
        conv = layouts.gru_from_keras(*weights, reset_after=case.reset_after)
    else:
        conv = layouts.rnn_from_keras(*weights)
    states = (named["c0"], named["h0"]) if case.cell == "lstm" else (named["h0"],)
    return (named["x"], *states, *conv), conv.options


def gradcells_call(case, op):
    """gradcells's ``<cell>_sequence<op>`` and its inputs (the positional arrays and
    keywords)."""
    arrays, options = gradcells_arrays(case, case.args)
    keywords = dict(options, seq_len=case.lengths, reverse=case.options["go_backwards"],
                    batch_first=True)
    return getattr(gc, f"{case.cell}_sequence{op}"), arrays, keywords


def gradcells_tangents(case):
    """The case's tangents as gradcells's ``*SequenceGrads`` (the fields it lacks None)."""
    grads = getattr(gc, f"{case.cell.upper()}SequenceGrads")
    arrays, _ = gradcells_arrays(case, case.tangents)
    return grads(*arrays, *(None,) * (len(grads._fields) - len(arrays)))


def gradcells_sequence(case):
    fn, arrays, keywords = gradcells_call(case, "")
    return fn(*arrays, **keywords)


def keras_order(case, seq):
    """gradcells's every-step outputs ``[B, T, H]`` in Keras's time order."""
    return seq[:, ::-1] if case.options["go_backwards"] else seq


def valid(case) -> np.ndarray:
    """``[B, T]``: the steps that are not masked, in Keras's time order."""
    lengths = np.full(case.args["x"].shape[0], case.steps) if case.lengths is None \
        else case.lengths
    return keras_order(case, (np.arange(case.steps) < lengths[:, None])[..., None])[..., 0]


def masked_outputs(case, out, active, h0):
    """gradcells's every-step outputs ``out [B, T, H]`` (Keras's order; or their tangents,
    with ``h0`` h0's tangent) with the masked steps as the entries in ``active`` make them:
    after a valid step the previous output (convention 30), before any the initial state
    ``h0`` (fault 31), zeros otherwise (gradcells's ``seq_len``)."""
    keep, out = valid(case), out.copy()
    started = np.zeros(len(keep), dtype=bool)
    for t in range(case.steps):
        repeated = out[:, t - 1] if REPEATED in active and t else 0.0
        first = h0 if H0_FIRST in active else 0.0
        out[:, t] = np.where(keep[:, t, None], out[:, t],
                             np.where(started[:, None], repeated, first))
        started |= keep[:, t]
    return out


def expected_outputs(case, active=frozenset()) -> list:
    """Keras's outputs as gradcells computes them with the entries in ``active`` applied
    (none: gradcells's convention, zeros at masked steps and the final state as the last
    output; with the masking's entries the last output is the last step's, as Keras's)."""
    return keras_view(case, gradcells_sequence(case), case.args["h0"], active)


def expected_tangents(case, active=frozenset()) -> list:
    """The tangents of Keras's outputs along the case's tangents, as gradcells's
    ``*_sequence_jvp`` computes them, the entries in ``active`` applied."""
    fn, arrays, keywords = gradcells_call(case, "_jvp")
    _, tangent = fn(*arrays, gradcells_tangents(case), **keywords)
    return keras_view(case, tangent, case.tangents["h0"], active)


def keras_view(case, seq, h0, active) -> list:
    """Keras's outputs made of gradcells's sequence ``seq`` (a forward's result, or its
    tangent with ``h0`` h0's tangent), the entries in ``active`` applied."""
    out = keras_order(case, seq.h)
    if active & MASKING:
        out = masked_outputs(case, out, active, h0)
    last = out[:, -1] if active & MASKING else seq.h_final
    outputs = [out if case.options["return_sequences"] else last]
    if case.options["return_state"]:
        outputs += [seq.h_final] + ([seq.cs_final] if case.cell == "lstm" else [])
    return outputs


def keras_cotangents(case, active=frozenset()):
    """The case's cotangent as gradcells's ``d_h [B, T, H]`` (gradcells's time order),
    ``d_h_final``, ``d_cs_final`` and ``d_h0`` (added to h0's gradient), for the outputs
    ``expected_outputs(case, active)`` computes: with the masking's entries, a masked step's
    cotangent goes where its output comes from (``carry_back``)."""
    hidden, batch = case.hidden, case.args["x"].shape[0]
    d_h, d_h0 = np.zeros((batch, case.steps, hidden)), np.zeros((batch, hidden))
    d_h_final, d_cs_final = np.zeros((batch, hidden)), np.zeros((batch, hidden))
    ct = list(case.cotangent)
    if case.options["return_sequences"]:
        d_h += ct.pop(0)
    elif active & MASKING:
        d_h[:, -1] += ct.pop(0)            # the last output is the last step's
    else:
        d_h_final += ct.pop(0)
    if active & MASKING:
        carry_back(case, d_h, d_h0, active)
    if ct:
        d_h_final += ct.pop(0)
    if ct:
        d_cs_final += ct.pop(0)
    return keras_order(case, d_h), d_h_final, d_cs_final, d_h0


def carry_back(case, d_h, d_h0, active):
    """Moves the cotangents ``d_h`` (Keras's order) of the masked steps onto what their
    outputs are under ``masked_outputs``: the last valid step (convention 30), h0 (fault 31),
    or nothing (zeros)."""
    keep = valid(case)
    for b in range(d_h.shape[0]):
        source = None
        for t in range(case.steps):
            if keep[b, t]:
                source = t
            elif source is not None and REPEATED in active:
                d_h[b, source] += d_h[b, t]
            elif source is None and H0_FIRST in active:
                d_h0[b] += d_h[b, t]
        d_h[b, ~keep[b]] = 0.0


def gradcells_grads(case, active=frozenset()) -> list:
    """gradcells's gradients in Keras's layout, aligned with the case's arguments, for the
    cotangent as ``keras_cotangents`` reads it."""
    fn, arrays, keywords = gradcells_call(case, "_grad")
    upstream, d_h0 = _upstream(case, active, keywords)
    return keras_layout(case, fn(*arrays, gradcells_sequence(case), **upstream), d_h0)


def gradcells_hvp(case, active=frozenset()) -> list:
    """gradcells's ``*_sequence_grad_jvp``: the tangent of ``gradcells_grads`` along the
    case's tangents (the cotangent, moved as ``active`` moves it, held fixed), in Keras's
    layout."""
    fn, arrays, keywords = gradcells_call(case, "_grad_jvp")
    upstream, d_h0 = _upstream(case, active, keywords)
    _, tangent = fn(*arrays, gradcells_sequence(case), gradcells_tangents(case), **upstream)
    return keras_layout(case, tangent, np.zeros_like(d_h0))


def _upstream(case, active, keywords) -> tuple[dict, np.ndarray]:
    """The keywords of ``*_sequence_grad`` (the upstream gradients and the settings), and the
    cotangent that reaches h0 directly (fault 31)."""
    keywords.pop("forget_bias", None)
    d_h, d_h_final, d_cs_final, d_h0 = keras_cotangents(case, active)
    extra = {"d_cs_final": d_cs_final} if case.cell == "lstm" else {}
    return dict(keywords, d_h=d_h, d_h_final=d_h_final, **extra), d_h0


def keras_layout(case, grads, d_h0) -> list:
    """gradcells's ``*SequenceGrads`` in Keras's layout, aligned with the case's arguments
    (``d_h0`` added to h0's)."""
    if case.cell == "lstm":
        weights = layouts.lstm_to_keras(grads.w, grads.b)
        return [grads.x, grads.h0 + d_h0, grads.cs0, *weights]
    if case.cell == "rnn":
        return [grads.x, grads.h0 + d_h0, *layouts.rnn_to_keras(grads.w, grads.b)]
    kernel, recurrent, bias = layouts.gru_to_keras(grads.w_ru, grads.w_c, grads.b_ru,
                                                   grads.b_c)
    if case.reset_after:              # both rows of z and r biases are summed: one gradient
        bias[1, :2 * case.hidden] = bias[0, :2 * case.hidden]
    return [grads.x, grads.h0 + d_h0, kernel, recurrent, bias]


# ---------------------------------------------------------------------------------------------
# The checks


def keras_outputs(result, case, prefix="out") -> list:
    """The runner's outputs (``prefix`` ``"jvp"``: their tangents), in order."""
    return [result[f"{prefix}{k}"] for k in range(len(case.cotangent))]


def output_names(case) -> list:
    names = ["output"] + (["h", "c"] if case.cell == "lstm" else ["h"])
    return names[:len(case.cotangent)]


def tolerance(active, float32) -> tuple:
    """The tolerance of a comparison: float64's, or ``float32``'s where the model applies
    fault 32 (the backend computes the layer in float32)."""
    return float32 if FLOAT32_PATH in active else FLOAT64


def forward_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    return judge_forward(backend, drawn_case(rng, "forward", backend, cell, reset_after, masked))


def judge_forward(backend, case) -> Verdict:
    """Keras's outputs against gradcells's (``seq_len`` for the mask, zeros at masked
    steps). The models: Keras's masking (convention 30, fault 31), float32 round-off
    (fault 32)."""
    claim = keras_outputs(keras_result(backend, case), case)
    names = output_names(case)
    return judge_entries(lambda active: compare(
        zip(names, claim, expected_outputs(case, active), strict=True), tolerance(active,
                                                                                  FLOAT32_FORWARD)),
        case_entries(backend, case, "forward"))


def gradient_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    return judge_gradient(backend,
                          drawn_case(rng, "gradient", backend, cell, reset_after, masked))


def judge_gradient(backend, case) -> Verdict:
    """The backend's autodiff against gradcells's ``_grad`` (in Keras's layout). The models:
    gradcells's for the cotangent moved as Keras's masking moves it (convention 30, fault
    31), float32 round-off (fault 32)."""
    result = keras_result(backend, case)
    claim = [result[f"grad_{n}"] for n in case.args]
    return judge_entries(lambda active: compare(
        zip(case.args, claim, gradcells_grads(case, active), strict=True),
        tolerance(active, FLOAT32_GRADIENT)), case_entries(backend, case, "gradient"))


def oracle_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    return judge_oracle(backend, drawn_case(rng, "oracle", backend, cell, reset_after, masked),
                        "oracle")


def jvp_oracle_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    return judge_oracle(backend,
                        drawn_case(rng, "jvp oracle", backend, cell, reset_after, masked),
                        "jvp oracle")


def judge_oracle(backend, case, kind) -> Verdict:
    """The backend's autodiff (``"oracle"``: reverse mode; ``"jvp oracle"``: forward mode)
    against the oracle (central differences of the Keras forward), as the runner reported
    it. Fault 32's model, where the forward is float32's (its differences in float64 are
    round-off): gradcells's derivative to float32 round-off, the masking as the backend's."""
    result = keras_result(backend, case)
    rows = json.loads(str(result[ORACLES[kind]]))
    report = SimpleNamespace(checks=[SimpleNamespace(name=n, checked=c, abs_error=e, bound=b)
                                     for n, c, e, b in rows])
    if not float32_path(backend, case.cell, case.reset_after, case.lengths is not None):
        return Verdict(oracle_outcome(report))
    masking = frozenset(case_entries(backend, case, "gradient")) & MASKING
    return judge(oracle_outcome(report), lambda: float32_model(case, result, kind, masking))


def float32_model(case, result, kind, masking) -> Outcome:
    """Fault 32's model of an oracle row: the backend's derivative (``"oracle"``: its
    gradient; ``"jvp oracle"``: its tangents) against gradcells's to float32 round-off."""
    if kind == "oracle":
        return compare(zip(case.args, [result[f"grad_{n}"] for n in case.args],
                           gradcells_grads(case, masking), strict=True), FLOAT32_GRADIENT)
    return compare(zip(output_names(case), keras_outputs(result, case, "jvp"),
                       expected_tangents(case, masking), strict=True), FLOAT32_GRADIENT)


def jvp_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    return judge_jvp(backend, drawn_case(rng, "jvp", backend, cell, reset_after, masked))


def judge_jvp(backend, case) -> Verdict:
    """The backend's forward mode against gradcells's ``*_sequence_jvp`` along the same
    tangents. The models: Keras's masking (convention 30, fault 31: a masked step's tangent
    is the tangent of the output it repeats, or h0's), float32 round-off (fault 32)."""
    claim = keras_outputs(keras_result(backend, case), case, "jvp")
    names = output_names(case)
    return judge_entries(lambda active: compare(
        zip(names, claim, expected_tangents(case, active), strict=True),
        tolerance(active, FLOAT32_GRADIENT)), case_entries(backend, case, "jvp"))


def hvp_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    return judge_hvp(backend, drawn_case(rng, "hvp", backend, cell, reset_after, masked))


def judge_hvp(backend, case) -> Verdict:
    """The backend's second derivative, the tangent of its gradient (the Hessian-vector
    product of ``<cotangent, outputs>``), against gradcells's ``*_sequence_grad_jvp``. The
    models: the cotangent moved as Keras's masking moves it (convention 30, fault 31),
    float32 round-off (fault 32)."""
    result = keras_result(backend, case)
    claim = [result[f"hvp_{n}"] for n in case.args]
    return judge_entries(lambda active: compare(
        zip(case.args, claim, gradcells_hvp(case, active), strict=True),
        tolerance(active, FLOAT32_GRADIENT)), case_entries(backend, case, "hvp"))


def jax_rnn_scan(rng) -> Verdict:
    """JAX's float64 SimpleRNN with ``unroll=False`` (a ``lax.scan``): runs (agrees with
    gradcells) or raises as fault 33 predicts."""
    case = drawn_case(rng, "scan", "jax", "rnn", None, False)
    case.options.update(unroll=False)
    arrays, spec = case.job()
    try:
        claim = keras_outputs(worker("jax").run(arrays, spec), case)
    except RuntimeError as error:
        if "carry" not in str(error):
            raise
        return refused("SimpleRNN", str(error)[:90])
    return Verdict(compare(zip(output_names(case), claim, expected_outputs(case), strict=True),
                           FLOAT64))


KINDS = (("forward", "forward vs gradcells", forward_verdict),
         ("oracle", "gradient vs oracle", oracle_verdict),
         ("gradient", "gradient vs gradcells", gradient_verdict),
         ("jvp oracle", "forward mode vs oracle", jvp_oracle_verdict),
         ("jvp", "forward mode vs gradcells", jvp_verdict),
         ("hvp", "HVP vs gradcells", hvp_verdict))
"""Each cell's rows (unmasked, then masked): ``(kind, title, verdict)``."""
ORACLES = {"oracle": "oracle", "jvp oracle": "jvp_oracle"}
"""The kinds checked against the oracle, each to the runner's report of it."""


def _rows(backend, label, cell, reset_after) -> list[Check]:
    via = f" (layouts.{cell}_from_keras)"
    return [Check(f"keras[{backend}] {label}{' masked' if masked else ''} {title}"
                  + (via if kind == "forward" and not masked else ""),
                  lambda rng, v=verdict, m=masked: v(rng, backend, cell, reset_after, m),
                  fault=row_entries(backend, cell, reset_after, masked, kind) or None)
            for masked in (False, True) for kind, title, verdict in KINDS]


CHECKS = tuple(check for backend in BACKENDS for cell in CELLS
               for check in _rows(backend, *cell)) + (
    Check("keras[jax] SimpleRNN float64, unroll=False (lax.scan)", jax_rnn_scan, fault=33,
          cases=1),)
"""Every Keras row, in order: by backend, cell, unmasked then masked."""


SECTION = "Keras"
"""The framework's name, as the audit's title (and its docs/audit.md section) begins."""


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the Keras audit; ImportError without Keras."""
    if importlib.util.find_spec("keras") is None:
        raise ImportError("No module named 'keras'")
    version = importlib.metadata.version("keras")
    title = (f"gradcells audit of {SECTION} {version} ({', '.join(BACKENDS)} backends, CPU, "
             "float64)")
    footer = ["each backend runs in a subprocess of its own (KERAS_BACKEND); a case is shared "
              "by its cell's rows and by the three backends; the jax backend's layers run "
              "under jax.jit",
              "forward mode: tf.autodiff.ForwardAccumulator, jax.jvp, torch.autograd.forward_ad;"
              " HVP: nested GradientTapes, jax.jvp of jax.vjp, torch double backward",
              "keras[jax] SimpleRNN rows run with unroll=True (fault 33: its own row)"]
    return title, CHECKS, footer
