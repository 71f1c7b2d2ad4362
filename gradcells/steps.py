"""The public cell operations: one step of each registered cell, its gradient, forward mode
and second order (``lstm_cell``, ``lstm_cell_grad``, ``lstm_cell_jvp``,
``lstm_cell_grad_jvp``, ``gru_cell``, ...). No math and no per-cell code here: each
function is made from its cell's spec by ``gradcells._public`` (validate, dispatch, call,
record the settings), and its docstring is the spec's.

The formulas are in ``gradcells.reference`` (and restated in each docstring); the
accelerated backends compute the same functions. A forward's result records its settings
(``state.settings``), so its gradient needs only the arrays, the result and the upstream
gradients (docs/spec.md §10).
"""

from __future__ import annotations

from . import _public
from .cells import SPECS

globals().update({name: made for spec in SPECS.values()
                  for name, made in _public.operations(spec, spec.cell, __name__).items()})

__all__ = [f"{spec.cell.name}{mode}" for spec in SPECS.values()
           for mode in ("", "_jvp", "_grad", "_grad_jvp")]
