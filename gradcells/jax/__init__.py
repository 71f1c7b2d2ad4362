"""gradcells's ops as JAX functions (docs/spec.md §13): ``jax.jit``, ``jax.grad``/``vjp``,
``jax.jvp`` and ``jax.vmap`` accept them, and compose.

``gradcells.jax.<op>`` takes ``gc.<op>``'s arguments (JAX arrays) and returns the op's result
NamedTuple of JAX arrays. The primal is ``gc.<op>``'s, reverse mode ``gc.<op>_grad``'s,
forward mode ``gc.<op>_jvp``'s (``gradcells.jax._primitives``); the kernels run on the host
through ``jax.pure_callback``. ``seq_len`` and the masks are constants to the derivative;
the other keywords are static. Importing this module imports JAX; ``import gradcells`` does
not.
"""

from __future__ import annotations

from ._ops import FORWARD

lstm_cell = FORWARD["lstm_cell"]
gru_cell = FORWARD["gru_cell"]
rnn_cell = FORWARD["rnn_cell"]
lstm_sequence = FORWARD["lstm_sequence"]
gru_sequence = FORWARD["gru_sequence"]
rnn_sequence = FORWARD["rnn_sequence"]
lstm_stack = FORWARD["lstm_stack"]
gru_stack = FORWARD["gru_stack"]
rnn_stack = FORWARD["rnn_stack"]

__all__ = ["lstm_cell", "gru_cell", "rnn_cell", "lstm_sequence", "gru_sequence",
           "rnn_sequence", "lstm_stack", "gru_stack", "rnn_stack"]
