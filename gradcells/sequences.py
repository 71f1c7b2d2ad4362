"""The public sequence operations (docs/spec.md §4, §11): each registered cell run over
``x [T, B, I]``, with lengths, direction, layout and masks; its gradient (backpropagation
through time), forward mode and second order (``lstm_sequence``, ``lstm_sequence_grad``,
...). No math and no per-cell code here: each function is made from its cell's spec by
``gradcells._public``, and its docstring is the spec's.

The formulas are in ``gradcells.reference``; the accelerated backends compute the same
functions with the same matmul plan (one input projection for all steps, per step only
``h·W_h``; after the backward loop, the weight gradients as two large matmuls). A forward's
result records its settings (``seq.settings``, ``seq_len`` included), so its gradient needs
only the arrays, the result and the upstream gradients (§10).
"""

from __future__ import annotations

from . import _public
from .cells import SPECS

globals().update({name: made for spec in SPECS.values()
                  for name, made in _public.operations(spec, spec.sequence, __name__).items()})

__all__ = [f"{spec.sequence.name}{mode}" for spec in SPECS.values()
           for mode in ("", "_jvp", "_grad", "_grad_jvp")]
