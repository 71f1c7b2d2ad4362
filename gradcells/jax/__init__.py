"""gradcells's ops as JAX functions (docs/spec.md §13): ``jax.jit``, ``jax.grad``/``vjp``,
``jax.jvp`` and ``jax.vmap`` accept them, and compose.

``gradcells.jax.<op>`` for every registered cell's step, sequence and stack (``lstm_cell``,
``gru_sequence``, ``rnn_stack``, ...) takes ``gc.<op>``'s arguments (JAX arrays) and
returns the op's result NamedTuple of JAX arrays. The primal is ``gc.<op>``'s, reverse mode
``gc.<op>_grad``'s, forward mode ``gc.<op>_jvp``'s (``gradcells.jax._primitives``); the
kernels run on the host through ``jax.pure_callback``. ``seq_len`` and the masks are
constants to the derivative; the other keywords are static. ``linear_scan`` (docs/spec.md
§18.1) too, real and complex (its ``a``, ``b`` read as ``x``, ``resets`` a constant; JAX's
complex convention, the conjugate of gradcells's: ``_primitives``), and ``selective_scan``
(§18.4, Mamba's layout, its arrays' labels its spec's; ``vmap`` folds into ``Bt``;
``last_state`` None unless ``return_last_state``). Importing this module imports JAX;
``import gradcells`` does not.

Errors (docs/spec.md §16.3): shapes, dtypes and settings are checked at trace time, each the
``TypeError``/``ValueError`` the NumPy call gives. Values known only at run time (a traced
``seq_len``) are checked by the host call; in an eager call (``vmap``, ``grad`` without
``jit``) its error is raised as gradcells's own, while a ``jax.jit``-compiled function's
surfaces as JAX's ``JaxRuntimeError`` ending with it, unless the call is wrapped in
``with gradcells.jax.named_errors():``, which raises gradcells's error instead.
"""

from __future__ import annotations

from ._ops import FORWARD
from ._primitives import named_errors

globals().update(FORWARD)

__all__ = ["named_errors", *FORWARD]
