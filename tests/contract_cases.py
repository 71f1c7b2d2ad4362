"""What the contract tests (``tests/contracts/``) share: every op, every backend that takes
NumPy arrays here, drawn cases with every option, and the four modes called below the public
layer (``backend_calls``).

A contract test is written once and parametrized over ``OP_NAMES`` (every forward op of
``gradcells.cells.OPS``: every registered cell, cell and sequence) and ``BACKENDS``
(the reference, the CPU once built, and the GPU backend through the host emulation
``tests/cuda_host`` when a C++ compiler is there); ``backend(name)`` enters one.
"""

from __future__ import annotations

import contextlib
import inspect

import backend_calls
import cuda_host
import numpy as np
import pytest
from conftest import NUMPY_BACKENDS
from hypothesis import settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells import _dispatch, testing
from gradcells.cells import OPS, SPECS
from gradcells.cells.lstm.spec import LSTMNorm

CONTRACT_EXAMPLES = settings(max_examples=min(settings.default.max_examples, 6))
"""A contract runs every op on every backend in every mode: a few drawn cases each (the
profile's count where that is fewer), so the folder's contracts stay fast."""

OP_NAMES = tuple(OPS)
"""Every forward op (each has a gradient, a forward mode and a second order)."""

EMULATED_GPU = "gpu (host emulation)"
BACKENDS = (*NUMPY_BACKENDS, EMULATED_GPU)
"""The backends the contracts run on: the GPU one through ``tests/cuda_host``."""


@contextlib.contextmanager
def backend(name):
    """The backend module ``name`` (the GPU's with its kernels running on the host)."""
    if name != EMULATED_GPU:
        yield _dispatch.backend_module(name)
        return
    if cuda_host.compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    from gradcells.gpu import _launch

    saved = _launch.use_runtime(cuda_host.HostRuntime())
    try:
        yield _dispatch.backend_module("gpu")
    finally:
        _launch.use_runtime(saved)


def cell_of(op):
    return op.split("_")[0]


_SIZES = {"max_batch": 3, "max_input": 3, "max_hidden": 4}
_ORDER = {"ragged": None, "reverse": None, "masks": None}
_STRATEGIES = {
    "lstm_cell": lambda min_size: testing.lstm_cell_inputs(
        peephole=None, clip=None, projection=None, layer_norm=None, min_size=min_size,
        **_SIZES),
    "gru_cell": lambda min_size: testing.gru_cell_inputs(min_size=min_size, **_SIZES),
    "rnn_cell": lambda min_size: testing.rnn_cell_inputs(min_size=min_size, **_SIZES),
    "lstm_sequence": lambda min_size, batch_first=None: testing.lstm_sequence_inputs(
        peephole=None, clip=None, projection=None, layer_norm=None, min_size=min_size,
        max_steps=3, batch_first=batch_first, **_ORDER, **_SIZES),
    "gru_sequence": lambda min_size, batch_first=None: testing.gru_sequence_inputs(
        min_size=min_size, max_steps=3, batch_first=batch_first, **_ORDER, **_SIZES),
    "rnn_sequence": lambda min_size, batch_first=None: testing.rnn_sequence_inputs(
        min_size=min_size, max_steps=3, batch_first=batch_first, **_ORDER, **_SIZES),
    "mingru_cell": lambda min_size: testing.mingru_cell_inputs(min_size=min_size, **_SIZES),
    "mingru_sequence": lambda min_size, batch_first=None: testing.mingru_sequence_inputs(
        min_size=min_size, max_steps=3, batch_first=batch_first, ragged=None, reverse=None,
        **_SIZES),
    "slstm_cell": lambda min_size: testing.slstm_cell_inputs(min_size=min_size, **_SIZES),
    "slstm_sequence": lambda min_size, batch_first=None: testing.slstm_sequence_inputs(
        min_size=min_size, max_steps=3, batch_first=batch_first, **_ORDER, **_SIZES),
    "minlstm_cell": lambda min_size: testing.minlstm_cell_inputs(min_size=min_size, **_SIZES),
    "minlstm_sequence": lambda min_size, batch_first=None: testing.minlstm_sequence_inputs(
        min_size=min_size, max_steps=3, batch_first=batch_first, ragged=None, reverse=None,
        **_SIZES),
    "rglru_cell": lambda min_size: testing.rglru_cell_inputs(
        min_size=min_size, max_batch=3, max_hidden=4),
    "rglru_sequence": lambda min_size, batch_first=None: testing.rglru_sequence_inputs(
        min_size=min_size, max_steps=3, batch_first=batch_first, ragged=None, reverse=None,
        resets=None, max_batch=3, max_hidden=4),
}
assert set(_STRATEGIES) == set(OPS), "a contract strategy for every op"


def cases(op, min_size=0, layer="backend"):
    """Hypothesis cases of ``op`` (float64) with every option drawn: for the LSTM peepholes,
    clips, a projection and a layer norm; the GRU's reset-after; the RNN's activation; the
    sLSTM's forget gate and heads; for
    sequences ragged lengths, both directions, every mask and, through the public layer
    (``layer="public"``), both layouts: the public layer brings a batch-first call to time
    major (``gradcells._order``) before any backend runs, so a backend is called time-major."""
    if not OPS[op].sequence:
        return _STRATEGIES[op](min_size)
    if layer != "public":
        return _STRATEGIES[op](min_size, batch_first=False)
    if min_size > 0:
        return _STRATEGIES[op](min_size)
    return st.one_of(_STRATEGIES[op](0, batch_first=False), _STRATEGIES[op](1))


_CELL_CASES = {"lstm_cell": testing.lstm_cell_case, "gru_cell": testing.gru_cell_case,
               "rnn_cell": testing.rnn_cell_case, "mingru_cell": testing.mingru_cell_case,
               "slstm_cell": testing.slstm_cell_case,
               "minlstm_cell": testing.minlstm_cell_case,
               "rglru_cell": testing.rglru_cell_case}
_SEQUENCE_CASES = {"lstm_sequence": testing.lstm_sequence_case,
                   "gru_sequence": testing.gru_sequence_case,
                   "rnn_sequence": testing.rnn_sequence_case,
                   "mingru_sequence": testing.mingru_sequence_case,
                   "slstm_sequence": testing.slstm_sequence_case,
                   "minlstm_sequence": testing.minlstm_sequence_case,
                   "rglru_sequence": testing.rglru_sequence_case}

OPTIONS = {
    "lstm": [{}, {"peephole": True, "clip": True}, {"proj_size": 2, "proj_clip": True},
             {"layer_norm": True, "ln_carry": "raw"},
             {"layer_norm": True, "ln_carry": "normalized", "peephole": True,
              "proj_size": 3}],
    "gru": [{"reset_after": False}, {"reset_after": True}],
    "rnn": [{"activation": "tanh"}, {"activation": "relu"}],
    "mingru": [{"activation": "g"}, {"activation": "identity"}],
    "slstm": [{"forget": "sigmoid", "heads": 2}, {"forget": "exp", "heads": 1},
              {"forget": "sigmoid", "heads": 2, "stabilizer_grad": "stop"}],
    "minlstm": [{"activation": "g"}, {"activation": "identity"}],
    "rglru": [{"heads": 2}, {"heads": 1, "c": 2.0, "sqrt_grad_bound": 1000.0}],
}
"""A fixed grid of each cell's options (the LSTM's layer norm both carries; the sLSTM's
"stop" is compared with the other backends, never with finite differences; the RG-LRU's
``sqrt_grad_bound`` of 1000 is recurrentgemma's, inactive at these cases' gates, where it
is the derivative)."""


def fixed_case(op, rng, *, steps, batch, input_size, hidden, dtype=np.float64, **options):
    """A case of ``op`` from the builders of ``gradcells.testing`` at the given sizes."""
    if op in _CELL_CASES:
        return _CELL_CASES[op](rng, batch=batch, input_size=input_size, hidden=hidden,
                               dtype=dtype, **options)
    if not SPECS[cell_of(op)].masks:     # a cell without masks (the minGRU) draws none
        options.pop("masks", None)
    return _SEQUENCE_CASES[op](rng, steps=steps, batch=batch, input_size=input_size,
                               hidden=hidden, dtype=dtype, **options)


# --------------------------------------------------------------------------------------
# The four modes


def upstream(op, result, rng, none_rate=0.0):
    """Random upstream gradients of ``result`` (each None with ``none_rate``), by name."""
    spec = OPS[op]
    out = {}
    for name in spec.upstream:
        field = getattr(result, name.removeprefix("d_"))
        out[name] = (None if rng.random() < none_rate
                     else rng.standard_normal(field.shape).astype(field.dtype))
    return out


def tangents(op, case, rng, none_rate=0.0):
    """The op's gradient type of random tangents of the case's arrays."""
    def draw(value):
        if value is None or rng.random() < none_rate:
            return None
        if isinstance(value, LSTMNorm):
            return LSTMNorm(*(draw(v) for v in value))
        return rng.standard_normal(np.shape(value)).astype(value.dtype)

    spec = OPS[op]
    return spec.grads(**{name: draw(case.get(name)) for name in spec.grads._fields})


class BackendCalls:
    """The four modes of an op on a backend module, below the public layer."""

    def __init__(self, impl):
        self.impl = impl

    def forward(self, op, case):
        return backend_calls.forward(self.impl, op, case)

    def grad(self, op, case, result, **upstream):
        return backend_calls.grad(self.impl, op, case, result, **upstream)

    def _call(self, name, op, case, *middle, **keywords):
        spec = OPS[op]
        weights, settings = backend_calls.weights_and_settings(op, case)
        leading = (case["x"], *(case[state] for state in spec.states))
        return getattr(self.impl, name)(*leading, weights, *middle, settings, **keywords)

    def jvp(self, op, case, tangents):
        return self._call(f"{op}_jvp", op, case, tangents)

    def grad_jvp(self, op, case, result, tangents, **upstream):
        return self._call(f"{op}_grad_jvp", op, case, result, tangents, **upstream)


def _public(name, case, **keywords):
    """``gc.<name>`` with the case's keywords that it takes (a gradient takes no forward-only
    setting: its result carries them)."""
    function = getattr(gc, name)
    taken = inspect.signature(function).parameters
    return function(**{k: v for k, v in case.items() if k in taken}, **keywords)


class PublicCalls:
    """The four modes of an op through the public face (``gc.<op>...``), on a backend."""

    def __init__(self, name):
        self.name = name

    def forward(self, op, case):
        return _public(op, case, backend=self.name)

    def grad(self, op, case, result, **upstream):
        return _public(f"{op}_grad", case, **{OPS[op].result_arg: result}, **upstream,
                       backend=self.name)

    def jvp(self, op, case, tangents):
        return _public(f"{op}_jvp", case, tangents=tangents, backend=self.name)

    def grad_jvp(self, op, case, result, tangents, **upstream):
        return _public(f"{op}_grad_jvp", case, **{OPS[op].result_arg: result},
                       tangents=tangents, **upstream, backend=self.name)


@contextlib.contextmanager
def calls(name, layer="backend"):
    """The four modes on backend ``name``, below the public layer (``layer="backend"``)
    or through it (``"public"``, the NumPy backends only)."""
    if layer == "public":
        yield PublicCalls(name)
        return
    with backend(name) as impl:
        yield BackendCalls(impl)


def arrays_in(value, path="case"):
    """Every NumPy array inside ``value`` (dicts, NamedTuples, tuples), by path."""
    if isinstance(value, np.ndarray):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from arrays_in(v, f"{path}.{k}")
    elif isinstance(value, tuple):
        names = getattr(value, "_fields", range(len(value)))
        for k, v in zip(names, value, strict=True):
            yield from arrays_in(v, f"{path}.{k}")
