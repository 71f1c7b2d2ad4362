"""The types every cell shares: the array alias, the settings record a result carries, the
stacks' own record. Each cell's own types (settings, weights, results, gradients, its backend
protocol) are in its folder (``gradcells/cells/<cell>/spec.py``).

Results are NamedTuples: they unpack into their arrays as they always have. A result made by
a public forward operation also records the settings it was computed with, as
``result.settings`` (an ``LSTMSettings``, ``GRUSettings``, ...), so that its gradient needs
only the arrays, the result and the upstream gradients (docs/spec.md, "A result carries its
settings"). A tuple built by hand, or rebuilt with ``_make``/``_replace``, records nothing
(``settings`` is None) and the gradient takes its settings from its keywords.

Gradient tuples are named after the inputs they belong to and hold ``None`` for inputs that
were not given (peepholes off).

The backend contract (each cell's ``spec.protocol``): every cell has one module per backend
with its protocol's functions, names and signatures, one per mode: the forward, the gradient
(``d_``: the upstream cotangents), forward mode (``_jvp``: ``tangents`` a gradient type
holding one tangent per argument, None for zero; returns the result and its tangent) and
second order (``_grad_jvp``: the JVP of the gradient, ``d_*_tangent`` the upstream
cotangents' tangents; returns the gradients and their tangent).
tests/docs/test_architecture.py holds every cell on every backend to them. Arguments arrive
validated and normalised by the public layer; results are plain result tuples (the public
layer records the settings on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Array = Any
"""Any array the library accepts: NumPy or CuPy (and, at the public face, PyTorch or JAX)."""


class Recorded:
    """The ``settings`` attribute of a result (a property, so the record cannot be replaced
    by assignment; ``record_settings`` writes it once)."""

    __slots__ = ()

    @property
    def settings(self):
        """The settings the forward recorded, or None for a tuple built by hand."""
        return self.__dict__.get("_settings")


def record_settings(result, settings):
    """``result`` (a result NamedTuple) with ``settings`` recorded; returns ``result``."""
    result.__dict__["_settings"] = settings
    return result


@dataclass(frozen=True, eq=False)
class StackSettings:
    """What a stack's forward was computed with beyond its layers' own records (each
    sequence in ``stack.layers`` records its cell's settings): ``bidirectional``,
    ``batch_first`` and the inter-layer ``dropout_masks`` (a tuple of ``num_layers - 1``
    arrays, or None)."""

    bidirectional: bool = False
    batch_first: bool = False
    dropout_masks: tuple | None = None
