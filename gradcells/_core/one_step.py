"""A cell's step as its sequence of one step, on any backend.

The cells whose work is fused over time (the minGRU, the minLSTM, the RG-LRU: gates for
every step at once, then a linear scan) run a step as a sequence of one, so that the step
and the sequence are one function by construction. ``OneStep`` builds a backend's
``<cell>_cell``, ``<cell>_cell_grad`` and ``<cell>_cell_jvp`` from that backend's sequence
modes and the cell's spec, once for every such cell and backend: the step's state is the
sequence's per-step fields at its one step, its upstream gradients and tangents gain a
leading time axis of one, ``h_prev`` is the sequence's ``h0``, and the settings are the
step's own, run sequentially (a step has no time to scan over in parallel).
"""

from __future__ import annotations

import dataclasses
import inspect

from .specs import CellSpec


def one_step(settings):
    """The settings of a step run as a sequence of one: the step's own, sequentially."""
    return dataclasses.replace(settings, method="sequential")


def _stepped(a):
    """``a`` with a leading time axis of one (None stays None)."""
    return None if a is None else a[None]


class OneStep:
    """``cell``, ``cell_grad`` and ``cell_jvp`` of ``spec``'s cell on one backend, from the
    backend's ``sequence``, ``sequence_grad`` and ``sequence_jvp``; ``ops()`` gives them as
    the backend's functions, each with the signature the cell's backend protocol gives it."""

    def __init__(self, spec: CellSpec, sequence, sequence_grad, sequence_jvp):
        self.spec = spec
        self.sequence, self.sequence_grad, self.sequence_jvp = (sequence, sequence_grad,
                                                                 sequence_jvp)

    def ops(self) -> tuple:
        """``(<cell>_cell, <cell>_cell_grad, <cell>_cell_jvp)``."""
        made = []
        for mode in ("cell", "cell_grad", "cell_jvp"):
            name = f"{self.spec.name}_{mode}"
            contract = inspect.signature(getattr(self.spec.protocol, name))  # (self, ...)
            made.append(_function(getattr(self, mode), name, _DOCS[mode].format(
                name=self.spec.name), contract.replace(
                    parameters=list(contract.parameters.values())[1:])))
        return tuple(made)

    def _state(self, seq):
        """The step's state: the sequence's per-step fields at its one step."""
        kind = self.spec.cell.result
        return kind(*(getattr(seq, name)[0] for name in kind._fields))

    def cell(self, x, h_prev, weights, settings):
        return self._state(self.sequence(x[None], h_prev, weights, one_step(settings)))

    def cell_grad(self, x, h_prev, weights, state, settings, **upstream):
        per_step = [getattr(state, name)[None] for name in self.spec.cell.result._fields]
        seq = self.spec.sequence.result(*per_step, state.h)
        g = self.sequence_grad(x[None], h_prev, weights, seq, one_step(settings),
                               **{name: _stepped(d) for name, d in upstream.items()})
        named = g._asdict()
        named["x"], named["h_prev"] = named.pop("x")[0], named.pop("h0")
        return self.spec.cell.grads(**named)

    def cell_jvp(self, x, h_prev, weights, tangents, settings):
        named = tangents._asdict()
        named["x"], named["h0"] = _stepped(named.pop("x")), named.pop("h_prev")
        pair = self.sequence_jvp(x[None], h_prev, weights, self.spec.sequence.grads(**named),
                                 one_step(settings))
        return tuple(self._state(s) for s in pair)


def _function(method, name, doc, signature):
    """``method`` as a plain function named ``name`` with ``doc`` and ``signature``: what a
    backend module serves (a function, as its other operations are)."""
    def op(*args, **kwargs):
        return method(*args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.__doc__, op.__signature__ = doc, signature  # type: ignore[attr-defined]
    return op


_DOCS = {
    "cell": "One step: ``{name}_sequence`` of one step; the step's state.",
    "cell_grad": "Gradient of one step with respect to every input: ``{name}_sequence_grad`` "
                 "of one step, the upstream gradients each the step's.",
    "cell_jvp": "One step and its tangent along ``tangents`` (the step's gradient type, None "
                "fields zero): ``{name}_sequence_jvp`` of one step.",
}
