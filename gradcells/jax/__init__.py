"""gradcells's ops as JAX functions (docs/spec.md §13): ``jax.jit``, ``jax.grad``/``vjp``,
``jax.jvp`` and ``jax.vmap`` accept them, and compose.

``gradcells.jax.<op>`` for every registered cell's step, sequence and stack (``lstm_cell``,
``gru_sequence``, ``rnn_stack``, ...) takes ``gc.<op>``'s arguments (JAX arrays) and
returns the op's result NamedTuple of JAX arrays. The primal is ``gc.<op>``'s, reverse mode
``gc.<op>_grad``'s, forward mode ``gc.<op>_jvp``'s (``gradcells.jax._primitives``); the
kernels run on the host through ``jax.pure_callback``. ``seq_len`` and the masks are
constants to the derivative; the other keywords are static. Importing this module imports
JAX; ``import gradcells`` does not.
"""

from __future__ import annotations

from ._ops import FORWARD

globals().update(FORWARD)

__all__ = list(FORWARD)
