"""Dask arrays in (docs/spec.md §13, ``gradcells._dask``): every op family (Mamba's selective
scan among them, its batch ``Bt`` read from its spec's labels) on dask arrays chunked along
the batch equals the single-array call (forward, gradient with the weight
gradients tree-reduced over the chunks, JVP, the gradient's JVP; lengths and masks chunked
with the batch), float64, on the default threaded scheduler; nothing computes before
``.compute()``; each chunk runs once; chunkings gradcells cannot run are ``ValueError``s
that say how to rechunk; and a two-process ``dask.distributed`` cluster runs a sequence's
forward and gradient to the same values; on a device, CuPy blocks run the GPU backend.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import gradcells as gc
import gradcells.sequences
from gradcells.testing import cases

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

B, CHUNK = 7, 3                    # no other size of the cases below is 7
BLOCKS = -(-B // CHUNK)

FAMILIES = {
    "lstm_cell": lambda rng: cases.lstm_cell_case(rng, batch=B, input_size=3, peephole=True,
                                                  proj_size=2, layer_norm=True),
    "gru_cell": lambda rng: cases.gru_cell_case(rng, batch=B, input_size=3, reset_after=True),
    "rnn_cell": lambda rng: cases.rnn_cell_case(rng, batch=B, input_size=3),
    "lstm_sequence": lambda rng: cases.lstm_sequence_case(
        rng, batch=B, input_size=3, peephole=True, proj_size=2, ragged=True, masks=True),
    "gru_sequence": lambda rng: cases.gru_sequence_case(
        rng, batch=B, input_size=3, ragged=True, masks=True, batch_first=True,
        reverse=True),
    "rnn_sequence": lambda rng: cases.rnn_sequence_case(rng, batch=B, input_size=3,
                                                        ragged=True, masks=True),
    "lstm_stack": lambda rng: cases.stack_case(rng, "lstm", batch=B, steps=4, hidden=5),
    "gru_stack": lambda rng: cases.stack_case(rng, "gru", batch=B, steps=4, hidden=5,
                                              batch_first=True),
    "rnn_stack": lambda rng: cases.stack_case(rng, "rnn", batch=B, steps=4, hidden=5,
                                              bidirectional=False, layers=3),
    # Mamba's layout ([Bt, Dm, L], A [Dm, N], B and C 3-D or grouped 4-D): a variant's
    # name after "[" (docs/spec.md §18.4)
    "selective_scan[grouped]": lambda rng: cases.selective_scan_case(
        rng, batch=B, channels=4, state=2, steps=5, groups_b=2, groups_c=4,
        delta_softplus=True, reverse=True),
    "selective_scan[plain]": lambda rng: {**cases.selective_scan_case(
        rng, batch=B, channels=2, state=3, steps=4, optional=False), "return_last_state": False},
}


def _chunked(value, keep_numpy=False):
    """``value`` (an array, or tuples and lists of them) as dask arrays: chunked by CHUNK
    along its first axis of B rows, one chunk if it has none (``keep_numpy``: such arrays
    stay NumPy, the mixed call)."""
    if isinstance(value, dict):
        return {k: _chunked(v, keep_numpy) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        items = [_chunked(item, keep_numpy) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if not isinstance(value, np.ndarray):
        return value
    if B not in value.shape:
        return value if keep_numpy else da.from_array(value, chunks=value.shape)
    axis = value.shape.index(B)
    return da.from_array(value, chunks=tuple(CHUNK if k == axis else -1
                                             for k in range(value.ndim)))


def _leaves(tree, path=()):
    """``(path, array)`` for every array of a result (tuples and lists), None kept."""
    if isinstance(tree, (tuple, list)):
        return [leaf for k, item in enumerate(tree) for leaf in _leaves(item, path + (k,))]
    return [(path, tree)]


def _assert_equal(expected, lazy):
    want, got = _leaves(expected), _leaves(lazy)
    assert [p for p, _ in want] == [p for p, _ in got]
    assert all((a is None) == (b is None) for (_, a), (_, b) in zip(want, got, strict=True))
    arrays = [b for _, b in got if b is not None]
    assert all(isinstance(b, da.Array) for b in arrays)
    computed = iter(dask.compute(*arrays))
    for path, a in want:
        if a is not None:
            c = next(computed)
            assert c.shape == a.shape and c.dtype == a.dtype, path
            np.testing.assert_allclose(c, a, rtol=1e-10, atol=1e-12, err_msg=str(path))


def _like(rng, tree):
    """Random arrays shaped like ``tree``'s (None kept): upstreams and tangents."""
    if isinstance(tree, (tuple, list)):
        items = [_like(rng, item) for item in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return None if tree is None else rng.standard_normal(tree.shape)


def _upstream(rng, name, result):
    """Every upstream gradient of ``name``'s gradient (and its tangent), drawn."""
    params = inspect.signature(getattr(gc, f"{name.partition('[')[0]}_grad_jvp")).parameters
    fields = dict(zip(type(result)._fields, result, strict=True))
    return {p: _like(rng, fields[p.removeprefix("d_").removesuffix("_tangent")])
            for p in params if p.startswith("d_")}


def _call(name, suffix, case, **extra):
    """``gc.<name><suffix>`` on ``case``'s arguments that it takes, and ``extra`` (``name``
    a family's: a variant's ``[...]`` ignored)."""
    func = getattr(gc, name.partition("[")[0] + suffix)
    params = inspect.signature(func).parameters
    return func(**{k: v for k, v in {**case, **extra}.items() if k in params})


def _result_arg(name):
    return ("stack" if name.endswith("_stack") else "state" if name.endswith("_cell")
            else "result" if name.startswith("selective_scan") else "seq")


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_equals_the_single_array_call(name, rng):
    case = FAMILIES[name](rng)
    lazy = _chunked(case, keep_numpy=name.startswith("lstm"))
    result = _call(name, "", case)
    lazy_result = _call(name, "", lazy)
    _assert_equal(result, lazy_result)

    upstream = _upstream(rng, name, result)
    primal = {k: v for k, v in upstream.items() if not k.endswith("_tangent")}
    grads = _call(name, "_grad", case, **{_result_arg(name): result}, **primal)
    lazy_grads = _call(name, "_grad", lazy, **{_result_arg(name): lazy_result},
                       **_chunked(primal))
    _assert_equal(grads, lazy_grads)

    tangents = _like(rng, grads)
    _assert_equal(_call(name, "_jvp", case, tangents=tangents),
                  _call(name, "_jvp", lazy, tangents=_chunked(tangents)))
    _assert_equal(_call(name, "_grad_jvp", case, tangents=tangents,
                        **{_result_arg(name): result}, **upstream),
                  _call(name, "_grad_jvp", lazy, tangents=_chunked(tangents),
                        **{_result_arg(name): lazy_result}, **_chunked(upstream)))


def test_weight_gradients_are_summed_over_the_chunks_by_a_reduction(rng):
    case = FAMILIES["rnn_sequence"](rng)
    seq = gc.rnn_sequence(**_chunked(case))
    grads = gc.rnn_sequence_grad(**_chunked({k: case[k] for k in ("x", "h0", "w", "b")}),
                                 seq=seq, d_h=_chunked(rng.standard_normal(seq.h.shape)))
    assert grads.x.chunks[1] == (CHUNK, CHUNK, B - 2 * CHUNK)
    assert grads.w.numblocks == (1, 1) and grads.w.shape == case["w"].shape
    assert any("sum" in key for key in grads.w.dask.layers)


def test_nothing_computes_before_compute_and_each_chunk_runs_once(rng, monkeypatch):
    case = FAMILIES["lstm_sequence"](rng)
    lazy = _chunked(case)
    seq = gc.lstm_sequence(**lazy)
    grads = _call("lstm_sequence", "_grad", lazy, seq=seq,
                  d_h=_chunked(rng.standard_normal(seq.h.shape)))
    calls = {"lstm_sequence": 0, "lstm_sequence_grad": 0}
    for op in calls:
        original = getattr(gradcells.sequences, op)

        def counted(*args, _op=op, _original=original, **kwargs):
            calls[_op] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(gradcells.sequences, op, counted)
    assert calls == {"lstm_sequence": 0, "lstm_sequence_grad": 0}
    dask.compute(*[a for a in (*seq, *grads) if isinstance(a, da.Array)])
    assert calls == {"lstm_sequence": BLOCKS, "lstm_sequence_grad": BLOCKS}


def test_numpy_arrays_with_a_batch_axis_are_chunked_like_x(rng):
    case = cases.rnn_sequence_case(rng, batch=B, input_size=3, ragged=True)
    args = {k: case[k] for k in ("x", "h0", "w", "b", "seq_len")}
    seq, d_h = gc.rnn_sequence(**args), rng.standard_normal(case["x"].shape[:2] + (5,))
    lazy = {**args, "x": _chunked(args["x"]), "seq_len": list(args["seq_len"])}
    lazy_seq = gc.rnn_sequence(**lazy)
    assert lazy_seq.h.chunks[1] == lazy["x"].chunks[1]
    _assert_equal(seq, lazy_seq)
    _assert_equal(gc.rnn_sequence_grad(**args, seq=seq, d_h=d_h),
                  gc.rnn_sequence_grad(**lazy, seq=lazy_seq, d_h=d_h))


def _sequence_args(rng):
    case = cases.rnn_sequence_case(rng, batch=B, input_size=3)
    return {k: case[k] for k in ("x", "h0", "w", "b")}


@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "x": a["x"].rechunk({0: 2, 1: CHUNK, 2: -1})},
     r"x is chunked along axis 0 .*rechunk it: x.rechunk\(\{0: -1, 1: 3, 2: -1\}\)"),
    (lambda a: {**a, "h0": a["h0"].rechunk({0: 2})},
     r"h0's batch chunks \(2, 2, 2, 1\) differ from x's \(3, 3, 1\)"
     r".*h0.rechunk\(\{0: \(3, 3, 1\), 1: -1\}\)"),
    (lambda a: {**a, "w": da.from_array(a["w"].compute(), chunks=(2, -1))},
     r"w is chunked along axis 0 \(it has no batch axis\).*w.rechunk\(\{0: -1, 1: -1\}\)"),
    (lambda a: {**a, "x": a["x"][:, da.from_array(np.ones(B, bool), chunks=CHUNK)]},
     r"x has unknown chunk sizes \(NaN\); call x.compute_chunk_sizes\(\)"),
    (lambda a: {**a, "seq_len": np.zeros(B + 1, dtype=np.int64)},
     r"seq_len has 8 rows on its batch axis 0, x has 7"),
])
def test_chunkings_it_cannot_run_are_value_errors_saying_how_to_rechunk(rng, change, match):
    args = change(_chunked(_sequence_args(rng)))
    with pytest.raises(ValueError, match=match):
        gc.rnn_sequence(**args)


@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "u": a["u"].rechunk({2: 2})},
     r"u is chunked along axis 2 \(its batch axis is 0\).*"
     r"rechunk it: u.rechunk\(\{0: 3, 1: -1, 2: -1\}\)"),
    (lambda a: {**a, "B": a["B"].rechunk({0: 2})},
     r"B's batch chunks \(2, 2, 2, 1\) differ from u's \(3, 3, 1\)"
     r".*B.rechunk\(\{0: \(3, 3, 1\), 1: -1, 2: -1, 3: -1\}\)"),
    (lambda a: {**a, "A": a["A"].rechunk({0: 2})},
     r"A is chunked along axis 0 \(it has no batch axis\)"),
    (lambda a: {**a, "C": a["C"][:2]}, r"C has 2 rows on its batch axis 0, u has 7"),
])
def test_selective_scan_chunkings_it_cannot_run_are_named(rng, change, match):
    """The selective scan's time axis L, like every axis but ``Bt``, is one chunk; grouped
    ``B`` and ``C`` are chunked like ``u``; ``A`` has no batch axis."""
    args = change(_chunked(FAMILIES["selective_scan[grouped]"](rng)))
    with pytest.raises(ValueError, match=match):
        gc.selective_scan(**args)


def test_a_gradient_chunked_unlike_its_forward_is_a_value_error(rng):
    args = _chunked(_sequence_args(rng))
    seq = gc.rnn_sequence(**args)
    other = {k: v.rechunk({k_axis: 2}) if k in ("x", "h0") else v
             for k, v in args.items() for k_axis in [1 if k == "x" else 0]}
    with pytest.raises(ValueError, match=r"seq was computed on batch chunks \(3, 3, 1\)"):
        gc.rnn_sequence_grad(**other, seq=seq)


def test_a_stack_gradient_needs_the_recorded_result(rng):
    case = FAMILIES["gru_stack"](rng)
    stack = gc.gru_stack(**_chunked(case))
    with pytest.raises(ValueError, match="stack must be the dask result its forward returned"):
        _call("gru_stack", "_grad", _chunked(case), stack=tuple(stack))


def test_functions_without_dask_support_say_so(rng):
    args = _chunked(_sequence_args(rng))
    x = args["x"][0]
    with pytest.raises(TypeError, match="lstm_block_cell does not take dask arrays"):
        gc.tf_compat.lstm_block_cell(x, x, x, x, None, None, None, x)


@pytest.fixture(scope="module")
def cluster_client():
    """A two-process ``dask.distributed`` cluster (one thread each), closed after."""
    distributed = pytest.importorskip("dask.distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", timeout=30)
    client = distributed.Client(cluster, timeout=30, set_as_default=False)
    try:
        yield client
    finally:
        client.close(timeout=10)
        cluster.close(timeout=10)


def test_a_distributed_cluster_runs_a_sequence_forward_and_gradient(rng, cluster_client):
    case = FAMILIES["lstm_sequence"](rng)
    seq = gc.lstm_sequence(**case)
    d_h = rng.standard_normal(seq.h.shape)
    grads = _call("lstm_sequence", "_grad", case, seq=seq, d_h=d_h)
    lazy = _chunked(case)
    lazy_seq = gc.lstm_sequence(**lazy)
    lazy_grads = _call("lstm_sequence", "_grad", lazy, seq=lazy_seq, d_h=_chunked(d_h))
    futures = cluster_client.compute([lazy_seq.h, lazy_seq.h_final, lazy_grads.x, lazy_grads.w,
                                      lazy_grads.b, lazy_grads.cs0])
    computed = [f.result(timeout=30) for f in futures]
    for want, got in zip((seq.h, seq.h_final, grads.x, grads.w, grads.b, grads.cs0), computed,
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    workers = cluster_client.run(lambda: 1)
    assert len(workers) == 2


def _on_device(value, cupy):
    """``value`` with every array on the GPU: dask arrays' blocks as CuPy arrays, NumPy
    arrays as CuPy arrays (tuples, lists and dicts of them alike)."""
    if isinstance(value, dict):
        return {k: _on_device(v, cupy) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        items = [_on_device(item, cupy) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, da.Array):
        return value.map_blocks(cupy.asarray, dtype=value.dtype)
    return cupy.asarray(value) if isinstance(value, np.ndarray) else value


def test_cupy_chunks_run_on_the_gpu(rng):
    """CuPy blocks run the GPU backend (on a device only; tests/contracts/test_gpu.py's rule)."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("needs a CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("needs a CUDA device")
    case = FAMILIES["lstm_sequence"](rng)
    seq = gc.lstm_sequence(**case)
    d_h = rng.standard_normal(seq.h.shape)
    grads = _call("lstm_sequence", "_grad", case, seq=seq, d_h=d_h)
    lazy = _on_device(_chunked(case), cupy)
    lazy_seq = gc.lstm_sequence(**lazy)
    lazy_grads = _call("lstm_sequence", "_grad", lazy, seq=lazy_seq,
                       d_h=_on_device(_chunked(d_h), cupy))
    computed = dask.compute(lazy_seq.h, lazy_grads.x, lazy_grads.w)
    for want, got in zip((seq.h, grads.x, grads.w), computed, strict=True):
        assert isinstance(got, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-9, atol=1e-11)
