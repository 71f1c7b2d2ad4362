"""``python -m gradcells audit tensorflow|torch``: another framework's fused recurrent ops
against the oracle and gradcells, one row per check.

Each check runs on ``examples`` generated cases (sizes, peepholes, forget biases and weights
drawn from one seeded generator) and ends in one of three verdicts:

* **agrees**: every case matches the truth within tolerance;
* **known fault N**: a case misses the truth, but matches the model of fault N of
  ``gradcells.audit.faults`` (for instance, TensorFlow's clipped gradient equals gradcells's
  ``clip_grad="straight_through"`` gradient): the mismatch is the documented one, nothing
  more;
* **unexpected mismatch**: a case matches neither (or the framework raised). Only these make
  the exit status 1.

The truth for a gradient is the oracle, ``check_vjp``: central differences in float64. For
PyTorch they are taken of PyTorch's own forward (float64); for TensorFlow, whose ops take
float32 only, of gradcells's float64 forward (``gradcells.audit.tensorflow``).

The rooms: ``_engine`` (outcomes, verdicts, checks, the table), ``faults`` (the one list of
known faults), ``tensorflow`` and ``torch`` (each check a module-level function). The
sequence forward and its backpropagation are run by looping the public cells
(``gradcells.testing.unrolled``), so the audit does not depend on the sequence backends.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from typing import TextIO

from ._cases import gru_backprop, gru_steps, lstm_backprop, lstm_steps
from ._engine import (
    AGREES,
    FLOAT32_FORWARD,
    FLOAT32_GRADIENT,
    FLOAT64,
    Check,
    Outcome,
    Row,
    Skipped,
    Verdict,
    compare,
    judge,
    oracle_outcome,
    run_check,
    run_checks,
)
from .faults import FAULTS, Fault

FRAMEWORKS = {"tensorflow": "tensorflow", "tf": "tensorflow", "torch": "torch",
              "pytorch": "torch", "jax": "jax", "flax": "jax", "keras": "keras",
              "onnxruntime": "onnxruntime", "ort": "onnxruntime", "mingru": "mingru",
              "xlstm": "xlstm", "recurrentgemma": "recurrentgemma", "mamba": "mamba",
              "mamba-ssm": "mamba", "mamba_ssm": "mamba", "fla": "fla",
              "flash-linear-attention": "fla"}
"""The names ``audit`` takes, each to the module ``gradcells.audit.<module>`` that audits it."""
ALL = ("tensorflow", "torch", "jax", "keras", "onnxruntime", "mingru", "xlstm",
       "recurrentgemma", "mamba", "fla")
"""What ``audit all`` runs, in order."""
INSTALL = {"tensorflow": "pip install tensorflow-cpu", "torch": "pip install torch",
           "jax": "pip install jax flax", "keras": "pip install keras",
           "onnxruntime": "pip install onnx onnxruntime", "mingru": "pip install mingru-pytorch",
           "xlstm": "pip install xlstm", "fla": "pip install flash-linear-attention",
           "recurrentgemma": "pip install --no-deps recurrentgemma; pip install einops "
                             "jaxtyping 'typeguard<3' sentencepiece",
           "mamba": "MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-deps "
                    "--no-build-isolation mamba-ssm einops"}
"""How to install each framework (the message of a usage error naming it)."""

_run_check = run_check          # the names of the first edition
_judge = judge

__all__ = [
    "run", "FRAMEWORKS", "ALL", "INSTALL", "FAULTS", "Fault", "Outcome", "Verdict", "Check",
    "Row", "AGREES", "Skipped",
    "compare", "judge", "oracle_outcome", "run_check", "run_checks",
    "FLOAT32_FORWARD", "FLOAT32_GRADIENT", "FLOAT64",
    "lstm_steps", "lstm_backprop", "gru_steps", "gru_backprop",
]


def _positive(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _validate(framework: str, examples: int, seed: int) -> None:
    if framework != "all" and framework not in FRAMEWORKS:
        raise ValueError(f"framework must be 'all' or one of {list(ALL)}, got {framework!r}")
    if not _positive(examples, 1):
        raise ValueError(f"examples must be a positive integer, got {examples!r}")
    if not _positive(seed, 0):
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def run(framework: str, *, examples: int = 10, seed: int = 0, stream: TextIO | None = None,
        progress: bool = True, select: str | None = None, markdown: bool = False) -> int:
    """Audit ``framework`` (a name of ``FRAMEWORKS``, or ``"all"``: every one of ``ALL``
    installed here, in turn) and print one row per check to ``stream`` (default
    ``sys.stdout``); a progress line goes to stderr unless ``progress=False``. ``select``:
    run only the checks whose name contains this text (case-insensitive). ``markdown``:
    print a Markdown section with the versions it ran on instead (what ``docs/audit.md``
    holds; ``all`` prints one section per framework).

    Returns the exit status: 0 when every row agrees, is skipped or shows a known fault or
    convention, 1 when any row is an unexpected mismatch, 2 when the framework named is not
    installed (``all``: none is) or ``select`` matches no check.
    """
    stream = sys.stdout if stream is None else stream
    _validate(framework, examples, seed)
    if framework != "all":
        return _run_one(FRAMEWORKS[framework], examples, seed, stream, progress, select,
                        markdown, quiet=False)
    statuses = []
    for name in ALL:
        if statuses and statuses[-1] != 2:
            print("", file=stream)
        statuses.append(_run_one(name, examples, seed, stream, progress, select, markdown,
                                 quiet=True))
    ran = [s for s in statuses if s != 2]
    if not ran:
        print("gradcells audit: none of the frameworks is installed (or --select matches "
              "no check); pip install gradcells[conformance]", file=sys.stderr)
        return 2
    return max(ran)


def _run_one(framework, examples, seed, stream, progress, select, markdown, quiet) -> int:
    """One framework's audit; ``quiet``: a missing framework or empty selection is a note
    on stderr (``audit all``) rather than the usage error."""
    try:
        title, checks, footer = importlib.import_module(f"{__name__}.{framework}").checks()
    except ImportError as error:
        print(f"gradcells audit: {framework} is not installed ({error}); "
              f"{INSTALL[framework]}" + (" (skipped)" if quiet else ""), file=sys.stderr)
        return 2
    if select is not None:
        checks = [c for c in checks if select.lower() in c.name.lower()]
        if not checks:
            if not quiet:
                print(f"gradcells audit: --select {select!r} matches no {framework} check",
                      file=sys.stderr)
            return 2
    command = (f"python -m gradcells audit {framework} --examples {examples} --seed {seed}"
               + (f" --select {shlex.quote(select)}" if select is not None else "")
               + " --markdown")
    return run_checks(title, checks, footer, examples=examples, seed=seed, stream=stream,
                      progress=progress, markdown=markdown, command=command)
