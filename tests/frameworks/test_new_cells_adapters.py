"""The cells added through the registry alone (the sLSTM, the minGRU, the minLSTM) under
``gradcells.jax`` and on dask arrays (docs/spec.md §13): the same results and gradients as
the NumPy call, with nothing in the adapters written for them."""

from __future__ import annotations

import numpy as np
import pytest

import gradcells as gc
from gradcells.cells import SPECS
from gradcells.testing import cases

pytestmark = pytest.mark.conformance

NEW = ("slstm", "mingru", "minlstm")


def _case(cell):
    make = getattr(cases, f"{cell}_sequence_case")
    case = make(np.random.default_rng(7), steps=3, batch=4, input_size=3)
    return {k: case[k] for k in SPECS[cell].sequence.arrays}, case


def _settings(cell, case):
    return {k.name: case[k.name] for k in SPECS[cell].keywords
            if k.name in case and not k.forward_only}


@pytest.mark.parametrize("cell", NEW)
def test_jax_forward_and_grad_equal_numpy(cell):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import gradcells.jax as gj

    arrays, case = _case(cell)
    settings = _settings(cell, case)
    op = f"{cell}_sequence"
    seq = getattr(gc, op)(**arrays, **settings)
    d_h = np.random.default_rng(8).standard_normal(seq.h.shape)
    grads = getattr(gc, f"{op}_grad")(**arrays, seq=seq, d_h=d_h)

    def loss(a):
        return (getattr(gj, op)(**a, **settings).h * d_h).sum()

    jax_arrays = {k: jax.numpy.asarray(v) for k, v in arrays.items()}
    np.testing.assert_allclose(getattr(gj, op)(**jax_arrays, **settings).h, seq.h,
                               rtol=1e-13, atol=1e-14)
    got = jax.jit(jax.grad(loss))(jax_arrays)
    for name in arrays:
        np.testing.assert_allclose(got[name], getattr(grads, name), rtol=1e-12, atol=1e-13,
                                   err_msg=f"{cell}: {name}")


@pytest.mark.parametrize("cell", NEW)
def test_dask_chunked_along_the_batch_equals_numpy(cell):
    da = pytest.importorskip("dask.array")
    arrays, case = _case(cell)
    settings = _settings(cell, case)
    op = f"{cell}_sequence"
    seq = getattr(gc, op)(**arrays, **settings)
    states = set(SPECS[cell].sequence.states)
    chunked = {k: (da.from_array(v, chunks=(v.shape[0], 2, v.shape[2])) if k == "x"
                   else da.from_array(v, chunks=(2, v.shape[1])) if k in states
                   else v) for k, v in arrays.items()}
    lazy = getattr(gc, op)(**chunked, **settings)
    np.testing.assert_allclose(np.asarray(lazy.h), seq.h, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(np.asarray(lazy.h_final), seq.h_final, rtol=1e-13, atol=1e-14)
