"""The audit of Keras 3's recurrent layers (``keras.layers.LSTM``, ``GRU`` with
``reset_after=True`` and ``False``, ``SimpleRNN``) on every Keras backend (TensorFlow, JAX,
PyTorch), in float64: the forward against gradcells through ``gc.layouts``
(``*_from_keras``), each backend's own autodiff against the oracle (central differences of
the Keras forward itself) and against gradcells's ``*_sequence_grad``.

Keras picks its backend at import, so each backend's layers run in a subprocess of their
own (``_keras_runner``), started once per run and given every case of that backend; a case
(sizes, weights, ``go_backwards``, ``unroll``, ``return_sequences``, ``return_state``, and
for the masked rows a ``mask`` of right-padded ragged lengths, which gradcells reads as
``seq_len``) is drawn once per run and shared by the three rows of its cell and by the three
backends, and its result is computed once. ``go_backwards=True`` is gradcells's
``reverse=True`` with the outputs in reversed time order. ``checks()`` raises ImportError
when Keras is not installed; a backend that fails to import makes its rows skipped.
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
    Skipped,
    Verdict,
    compare,
    judge,
    oracle_outcome,
    refused,
)

BACKENDS = ("tensorflow", "jax", "torch")
CELLS = (("LSTM", "lstm", None), ("GRU(reset_after=True)", "gru", True),
         ("GRU(reset_after=False)", "gru", False), ("SimpleRNN", "rnn", None))
GATES = {"lstm": 4, "gru": 3, "rnn": 1}
FLAGS = ("go_backwards", "unroll", "return_sequences", "return_state")
MASK_FAULT = {"tensorflow": 30, "jax": 31, "torch": 30}
"""The entry of ``faults`` that each backend's outputs at masked steps follow."""
FLOAT32_PATH = 32
"""The fault of the layers that compute float64 in float32 (``float32_path``)."""


def float32_path(backend, cell, reset_after, masked) -> bool:
    """Whether the backend runs the layer through float32 (fault 32): JAX always; PyTorch in
    its generic loop (masked, GRU reset-before, SimpleRNN), not its fused LSTM and GRU."""
    if backend == "jax":
        return True
    return backend == "torch" and (masked or cell == "rnn" or reset_after is False)


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
        self.jobs, self._error = 0, None

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

    def run(self, arrays: dict, spec: dict) -> dict:
        """The runner's result for one job: outputs, gradients, the oracle's rows."""
        self.jobs += 1
        path = str(Path(self.dir.name) / f"job{self.jobs}.npz")
        np.savez(path, spec=json.dumps(spec), **arrays)
        self.process.stdin.write(path + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        if answer.startswith("error"):
            raise RuntimeError(answer[len("error: "):])
        with np.load(answer) as stored:
            return {k: stored[k] for k in stored.files}

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)
        self.log.close()
        self.dir.cleanup()


_WORKERS: dict[str, Worker] = {}
_RUN = {"rng": None, "base": 0, "counts": {}, "results": {}}
"""This run's state: its generator, the seed its cases derive from, each row's count of
cases, and the results of the cases run so far, by backend and case."""


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
        _RUN.update(rng=rng, base=int(rng.integers(2**31)), counts={}, results={})
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
    """One drawn case of one cell: the Keras arguments (batch first), the layer's options,
    the right-padded lengths (None: unmasked) and a cotangent of each output."""

    def __init__(self, rng, cell, reset_after, masked):
        drawn = sizes(rng)
        batch, n_in, hidden = drawn["batch"], drawn["input_size"], drawn["hidden"]
        steps = int(rng.integers(1, 5))
        self.cell, self.reset_after, self.hidden = cell, reset_after, hidden
        self.options = {f: bool(rng.integers(2)) for f in FLAGS}
        self.args = {"x": rng.standard_normal((batch, steps, n_in)),
                     "h0": 0.5 * rng.standard_normal((batch, hidden))}
        if cell == "lstm":
            self.args["c0"] = rng.standard_normal((batch, hidden))
        self.args.update(keras_weights(rng, cell, reset_after, n_in, hidden))
        self.lengths = rng.integers(1, steps + 1, batch) if masked else None
        shapes = [(batch, steps, hidden) if self.options["return_sequences"] else
                  (batch, hidden)]
        if self.options["return_state"]:
            shapes += [(batch, hidden)] * (2 if cell == "lstm" else 1)
        self.cotangent = [rng.standard_normal(s) for s in shapes]
        self.seed = int(rng.integers(2**31))

    @property
    def steps(self) -> int:
        return self.args["x"].shape[1]

    def job(self) -> tuple[dict, dict]:
        """The runner's arrays and spec."""
        arrays = dict(self.args, **{f"ct{k}": c for k, c in enumerate(self.cotangent)})
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
    """The runner's result for the case (once per run)."""
    key = (backend, case.cell, case.reset_after, case.lengths is not None, case.seed)
    if key not in _RUN["results"]:
        arrays, spec = case.job()
        if backend == "jax" and case.cell == "rnn":
            spec["unroll"] = True          # fault 33: the scan raises; its own row
        _RUN["results"][key] = worker(backend).run(arrays, spec)
    return _RUN["results"][key]


# ---------------------------------------------------------------------------------------------
# gradcells's view of the same case


def converted(case):
    a = case.args
    if case.cell == "lstm":
        return layouts.lstm_from_keras(a["kernel"], a["recurrent_kernel"], a["bias"])
    if case.cell == "gru":
        return layouts.gru_from_keras(a["kernel"], a["recurrent_kernel"], a["bias"],
                                      reset_after=case.reset_after)
    return layouts.rnn_from_keras(a["kernel"], a["recurrent_kernel"], a["bias"])


def gradcells_call(case, op):
    """gradcells's ``<cell>_sequence`` (op ``""``) or its inputs for ``_grad`` (the
    positional arrays and keywords)."""
    conv, a = converted(case), case.args
    states = (a["c0"], a["h0"]) if case.cell == "lstm" else (a["h0"],)
    keywords = dict(conv.options, seq_len=case.lengths, reverse=case.options["go_backwards"],
                    batch_first=True)
    return getattr(gc, f"{case.cell}_sequence{op}"), (a["x"], *states, *conv), keywords


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


def carried(case, seq, first):
    """Keras's masking convention applied to gradcells's outputs (in Keras's order): a
    masked step repeats the previous step's output, ``first`` before any."""
    out, keep = seq.copy(), valid(case)
    prev = first.copy()
    for t in range(case.steps):
        out[:, t] = np.where(keep[:, t, None], seq[:, t], prev)
        prev = out[:, t]
    return out


def expected_outputs(case, first=None) -> list:
    """Keras's outputs as gradcells computes them (masked steps: zeros, or with ``first``,
    the convention ``carried``)."""
    seq = gradcells_sequence(case)
    out = keras_order(case, seq.h)
    if first is not None:
        out = carried(case, out, first)
    outputs = [out if case.options["return_sequences"] else seq.h_final]
    if case.options["return_state"]:
        outputs += [seq.h_final] + ([seq.cs_final] if case.cell == "lstm" else [])
    return outputs


def mask_first(backend, case):
    """The output before the first valid step under the backend's masking (faults 30, 31)."""
    return case.args["h0"] if h0_carried(backend, case) else np.zeros_like(case.args["h0"])


def h0_carried(backend, case) -> bool:
    """Fault 31: JAX's ``lax.scan`` path (``unroll=False``) carries h0, not zeros."""
    return MASK_FAULT[backend] == 31 and not (case.options["unroll"] or case.cell == "rnn")


def keras_cotangents(case, h0_too: bool):
    """The case's cotangent as gradcells's ``d_h [B, T, H]`` (gradcells's time order),
    ``d_h_final``, ``d_cs_final`` and ``d_h0`` (added to h0's gradient). With ``h0_too`` is
    None, every-step cotangents at masked steps are dropped (gradcells's outputs there are
    zeros); else they go where Keras's masked outputs come from (the convention
    ``carried``): the previous valid step's output, or h0 (``h0_too``) or nothing before."""
    hidden, batch = case.hidden, case.args["x"].shape[0]
    d_h, d_h0 = np.zeros((batch, case.steps, hidden)), np.zeros((batch, hidden))
    d_h_final, d_cs_final = np.zeros((batch, hidden)), np.zeros((batch, hidden))
    ct = list(case.cotangent)
    if case.options["return_sequences"]:
        d_h = ct.pop(0).copy()
        if h0_too is not None:
            _carry_back(case, d_h, d_h0 if h0_too else None)
    else:
        d_h_final += ct.pop(0)
    if ct:
        d_h_final += ct.pop(0)
    if ct:
        d_cs_final += ct.pop(0)
    return keras_order(case, d_h), d_h_final, d_cs_final, d_h0


def _carry_back(case, d_h, d_h0):
    """Moves ``d_h``'s masked steps (Keras's order) onto the steps their outputs repeat."""
    keep = valid(case)
    for b in range(d_h.shape[0]):
        source = None
        for t in range(case.steps):
            if keep[b, t]:
                source = t
            elif source is not None:
                d_h[b, source] += d_h[b, t]
            elif d_h0 is not None:
                d_h0[b] += d_h[b, t]
        d_h[b, ~keep[b]] = 0.0


def gradcells_grads(case, h0_too=None) -> list:
    """gradcells's gradients in Keras's layout, aligned with the case's arguments, for the
    cotangent as ``keras_cotangents`` reads it."""
    fn, arrays, keywords = gradcells_call(case, "_grad")
    keywords.pop("forget_bias", None)
    d_h, d_h_final, d_cs_final, d_h0 = keras_cotangents(case, h0_too)
    extra = {"d_cs_final": d_cs_final} if case.cell == "lstm" else {}
    grads = fn(*arrays, gradcells_sequence(case), d_h=d_h, d_h_final=d_h_final, **extra,
               **keywords)
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


def keras_outputs(result, case) -> list:
    return [result[f"out{k}"] for k in range(len(case.cotangent))]


def output_names(case) -> list:
    names = ["output"] + (["h", "c"] if case.cell == "lstm" else ["h"])
    return names[:len(case.cotangent)]


def tolerances(backend, case) -> tuple:
    """(forward, gradient) tolerances of the case's comparisons: float64's, or float32's
    where the backend computes the layer in float32 (fault 32)."""
    if float32_path(backend, case.cell, case.reset_after, case.lengths is not None):
        return FLOAT32_FORWARD, FLOAT32_GRADIENT
    return FLOAT64, FLOAT64


def forward_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    """Keras's outputs against gradcells's (``seq_len`` for the mask, zeros at masked
    steps). The models: masked, Keras's masking convention (``carried``, faults 30, 31);
    unmasked, gradcells's to float32 round-off (fault 32)."""
    case = drawn_case(rng, "forward", backend, cell, reset_after, masked)
    claim = keras_outputs(keras_result(backend, case), case)
    names, tolerance = output_names(case), tolerances(backend, case)[0]
    truth = compare(zip(names, claim, expected_outputs(case)), FLOAT64)
    first = mask_first(backend, case) if masked else None
    return judge(truth, lambda: compare(
        zip(names, claim, expected_outputs(case, first)), tolerance))


def gradient_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    """The backend's autodiff against gradcells's ``_grad`` (in Keras's layout). The
    models: masked, gradcells's for the cotangent moved as the masking convention moves it
    (faults 30, 31); unmasked, gradcells's to float32 round-off (fault 32)."""
    case = drawn_case(rng, "gradient", backend, cell, reset_after, masked)
    result = keras_result(backend, case)
    claim = [result[f"grad_{n}"] for n in case.args]
    truth = compare(zip(case.args, claim, gradcells_grads(case)), FLOAT64)
    h0_too = h0_carried(backend, case) if masked else None
    return judge(truth, lambda: compare(
        zip(case.args, claim, gradcells_grads(case, h0_too)), tolerances(backend, case)[1]))


def oracle_verdict(rng, backend, cell, reset_after, masked) -> Verdict:
    """The backend's autodiff against the oracle (central differences of the Keras
    forward), as the runner reported it. Fault 32's model, where the forward is float32's
    (its differences in float64 are round-off): gradcells's gradient to float32 round-off,
    the cotangent moved as the masking convention moves it."""
    case = drawn_case(rng, "oracle", backend, cell, reset_after, masked)
    result = keras_result(backend, case)
    rows = json.loads(str(result["oracle"]))
    report = SimpleNamespace(checks=[SimpleNamespace(name=n, checked=c, abs_error=e, bound=b)
                                     for n, c, e, b in rows])
    if not float32_path(backend, cell, reset_after, masked):
        return Verdict(oracle_outcome(report))
    claim = [result[f"grad_{n}"] for n in case.args]
    h0_too = h0_carried(backend, case) if masked else None
    return judge(oracle_outcome(report), lambda: compare(
        zip(case.args, claim, gradcells_grads(case, h0_too)), FLOAT32_GRADIENT))


def row_fault(backend, cell, reset_after, masked, verdict) -> int | None:
    """The entry a row may show: the masking convention for masked outputs and gradients;
    fault 32 for the rest where the backend computes in float32."""
    if masked and verdict is not oracle_verdict:
        return MASK_FAULT[backend]
    return FLOAT32_PATH if float32_path(backend, cell, reset_after, masked) else None


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
    return Verdict(compare(zip(output_names(case), claim, expected_outputs(case)), FLOAT64))


KINDS = (("forward vs gradcells", forward_verdict), ("gradient vs oracle", oracle_verdict),
         ("gradient vs gradcells", gradient_verdict))


def _rows(backend, label, cell, reset_after) -> list[Check]:
    via = f"layouts.{cell}_from_keras"
    return [Check(f"keras[{backend}] {label}{' masked' if masked else ''} {kind}"
                  + (f" ({via})" if kind == "forward vs gradcells" and not masked else ""),
                  lambda rng, v=verdict, m=masked: v(rng, backend, cell, reset_after, m),
                  fault=row_fault(backend, cell, reset_after, masked, verdict))
            for masked in (False, True) for kind, verdict in KINDS]


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
              "by its cell's rows and by the three backends",
              "keras[jax] SimpleRNN rows run with unroll=True (fault 33: its own row)"]
    return title, CHECKS, footer
