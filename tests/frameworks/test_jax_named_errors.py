"""JAX run-time errors named (docs/spec.md §16.3, ``gradcells.jax``): a traced ``seq_len``'s
values are known only when the kernels run; an eager call (``vmap``, ``grad``) raises
gradcells's own ``ValueError`` then, and a ``jax.jit``-compiled call does inside
``gradcells.jax.named_errors()``, which leaves other run-time errors as JAX raised them."""

from __future__ import annotations

import numpy as np
import pytest

from gradcells.testing import cases

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
gj = pytest.importorskip("gradcells.jax")

# the first line (JAX may add its note on filtered frames after it)
NAMED = r"^seq_len must hold lengths in \[0, T\] = \[0, 4\], got 9(\n|$)"
BAD, GOOD = [1, 9, 2], [1, 4, 2]


@pytest.fixture(scope="module")
def final_state():
    """``seq_len -> h_final`` of a plain RNN sequence (T = 4, B = 3), and its ``x``."""
    case = cases.rnn_sequence_case(np.random.default_rng(0), batch=3, input_size=3)
    a = {k: jnp.asarray(case[k]) for k in ("x", "h0", "w", "b")}

    def run(seq_len, x=a["x"]):
        return gj.rnn_sequence(x, a["h0"], a["w"], a["b"], seq_len=seq_len).h_final
    return run, a["x"]


def test_eager_transforms_raise_the_named_error_for_traced_lengths(final_state):
    run, x = final_state
    lengths = jnp.asarray([BAD, GOOD])
    with pytest.raises(ValueError, match=NAMED):
        jax.vmap(run)(lengths)
    with pytest.raises(ValueError, match=NAMED):
        jax.vmap(jax.grad(lambda x, n: run(n, x).sum()))(jnp.stack([x, x]), lengths)


def test_a_jitted_call_raises_the_named_error_inside_named_errors(final_state):
    run, x = final_state
    jitted = jax.jit(run)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"\nValueError: seq_len must hold "):
        jitted(jnp.asarray(BAD)).block_until_ready()      # what JAX surfaces without it
    with pytest.raises(ValueError, match=NAMED), gj.named_errors():
        jitted(jnp.asarray(BAD)).block_until_ready()
    with pytest.raises(ValueError, match=NAMED):
        gj.named_errors()(jax.jit(jax.grad(lambda x, n: run(n, x).sum())))(x, jnp.asarray(BAD))
    with gj.named_errors():
        np.testing.assert_array_equal(jitted(jnp.asarray(GOOD)), run(jnp.asarray(GOOD)))


def test_named_errors_leaves_other_run_time_errors_alone():
    def host(a):
        raise ValueError("not gradcells's")

    broken = jax.jit(lambda a: jax.pure_callback(host, jax.ShapeDtypeStruct((2,), a.dtype), a))
    with pytest.raises(jax.errors.JaxRuntimeError, match="ValueError: not gradcells's"), \
            gj.named_errors():
        broken(jnp.zeros(2)).block_until_ready()
