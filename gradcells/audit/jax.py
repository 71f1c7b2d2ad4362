"""The audit of Flax's recurrent cells (``flax.linen`` and ``flax.nnx``: ``LSTMCell``,
``OptimizedLSTMCell``, ``GRUCell``, and ``RNN`` over ragged sequences) in float64
(``jax_enable_x64``): the forward against gradcells on the same weights, ``jax.vjp`` against
the oracle (central differences of Flax's own float64 forward) and gradcells's ``_grad``,
``jax.jvp`` against the oracle's ``check_jvp`` and gradcells's ``_jvp``, and the
Hessian-vector product (``jax.jvp`` of ``jax.grad``) against gradcells's ``_grad_jvp``.

Flax's conventions, as its source defines them (``flax/linen/recurrent.py``,
``flax/nnx/nn/recurrent.py``): kernels are ``[in, out]`` (``y = x·kernel``); the LSTM's
gate order is PyTorch's, i, f, g, o, with one bias (on the recurrent side) and no forget
bias (gradcells's ``forget_bias=0``); its carry is ``(c, h)``. The GRU is PyTorch's
reset-after GRU (gradcells's ``reset_after=True``, Flax's z is gradcells's u), with the r
and z biases on the input side only and ``b_hn`` inside the reset (linen; nnx has none,
fault 23). The converters below build gradcells's weights through ``gc.layouts``'s PyTorch
converters (Flax's blocks transposed).

Every check is a module-level function of a seeded generator; ``checks()`` imports JAX and
Flax (ImportError when absent) and lists the rows in order.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import layouts, sequences, steps
from ..cells.gru.spec import GRUCellGrads, GRUSequenceGrads
from ..cells.lstm.spec import LSTMCellGrads, LSTMSequenceGrads
from ..oracle import check_jvp, check_vjp
from ._cases import sizes
from ._engine import FLOAT64, Check, Skipped, Verdict, compare, judge, oracle_outcome

LSTM_X = ("ii", "if", "ig", "io")          # linen's names of the gate blocks, i, f, g, o
LSTM_H = ("hi", "hf", "hg", "ho")
GRU_X = ("ir", "iz", "in")                 # r, z, n
GRU_H = ("hr", "hz", "hn")
CELLS = (("linen.LSTMCell", "linen", "lstm", "LSTMCell"),
         ("linen.OptimizedLSTMCell", "linen", "lstm", "OptimizedLSTMCell"),
         ("linen.GRUCell", "linen", "gru", "GRUCell"),
         ("nnx.LSTMCell", "nnx", "lstm", "LSTMCell"),
         ("nnx.OptimizedLSTMCell", "nnx", "lstm", "OptimizedLSTMCell"),
         ("nnx.GRUCell", "nnx", "gru", "GRUCell"))
"""(label, API, kind, class name) of each cell audited."""


def _jax():
    """JAX with float64 enabled (the audit's precision)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


def _flax_version():
    import flax

    return flax.__version__


def _flax(api):
    if api == "linen":
        from flax import linen

        return linen
    from flax import nnx

    return nnx


# ---------------------------------------------------------------------------------------------
# Flax's parameter trees <-> gradcells's weights


def _path(name):
    return tuple(name.split("."))


def _blocks(api, kind, cls, p):
    """Flax's parameters ``p`` (name -> array) as ``(kx [I, nH], kh [H, nH], bias)``, gate
    blocks in Flax's order; ``bias``: the LSTM's ``[4H]``, the GRU's ``(bx [3H], b_hn [H] or
    None)``."""
    if kind == "lstm":
        if api == "nnx" and cls == "OptimizedLSTMCell":
            return p["dense_i.kernel"], p["dense_h.kernel"], p["dense_h.bias"]
        xs = [n.replace("if", "if_") if api == "nnx" else n for n in LSTM_X]
        return (np.concatenate([p[f"{n}.kernel"] for n in xs], 1),
                np.concatenate([p[f"{n}.kernel"] for n in LSTM_H], 1),
                np.concatenate([p[f"{n}.bias"] for n in LSTM_H]))
    if api == "nnx":
        return p["dense_i.kernel"], p["dense_h.kernel"], (p["dense_i.bias"], None)
    return (np.concatenate([p[f"{n}.kernel"] for n in GRU_X], 1),
            np.concatenate([p[f"{n}.kernel"] for n in GRU_H], 1),
            (np.concatenate([p[f"{n}.bias"] for n in GRU_X]), p["hn.bias"]))


def _unblocks(api, kind, cls, names, kx, kh, bias):
    """The inverse of ``_blocks``: name -> array for the parameter ``names``."""
    hidden = kh.shape[0]
    split = functools.partial(np.split, indices_or_sections=kh.shape[1] // hidden, axis=-1)
    if kind == "lstm" and not (api == "nnx" and cls == "OptimizedLSTMCell"):
        xs = [n.replace("if", "if_") if api == "nnx" else n for n in LSTM_X]
        out = {f"{n}.kernel": k for n, k in zip(xs, split(kx), strict=True)}
        out.update({f"{n}.kernel": k for n, k in zip(LSTM_H, split(kh), strict=True)})
        out.update({f"{n}.bias": v for n, v in zip(LSTM_H, split(bias), strict=True)})
    elif kind == "lstm":
        out = {"dense_i.kernel": kx, "dense_h.kernel": kh, "dense_h.bias": bias}
    elif api == "nnx":
        out = {"dense_i.kernel": kx, "dense_h.kernel": kh, "dense_i.bias": bias[0]}
    else:
        out = {f"{n}.kernel": k for n, k in zip(GRU_X + GRU_H, split(kx) + split(kh), strict=True)}
        out.update({f"{n}.bias": v for n, v in zip(GRU_X, split(bias[0]), strict=True)}, **{
            "hn.bias": bias[1]})
    return [out[n] for n in names]


def gradcells_weights(api, kind, cls, p):
    """gradcells's ``(w, b)`` or ``(w_ru, w_c, b_ru, b_c [2H])`` for Flax's parameters (a
    linear map: it also carries tangents)."""
    kx, kh, bias = _blocks(api, kind, cls, p)
    if kind == "lstm":
        return tuple(layouts.lstm_from_torch(kx.T, kh.T, np.zeros_like(bias), bias))
    bx, b_hn = bias
    hidden = kh.shape[0]
    bh = np.zeros(3 * hidden)
    if b_hn is not None:
        bh[2 * hidden:] = b_hn
    return tuple(layouts.gru_from_torch(kx.T, kh.T, bx, bh))


def flax_gradients(api, kind, cls, names, weights):
    """gradcells's weight gradients in Flax's layout (the transpose of
    ``gradcells_weights``), aligned with the parameter ``names``."""
    if kind == "lstm":
        wih, whh, bias, _ = layouts.lstm_to_torch(*weights)
        return _unblocks(api, kind, cls, names, wih.T, whh.T, bias)
    wih, whh, bih, bhh = layouts.gru_to_torch(*weights)
    hidden = whh.shape[1]
    return _unblocks(api, kind, cls, names, wih.T, whh.T, (bih, bhh[2 * hidden:]))


# ---------------------------------------------------------------------------------------------
# Flax's functions of flat arrays


def _nested(paths, arrays):
    tree: dict = {}
    for path, a in zip(paths, arrays, strict=True):
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = a
    return tree


def _flat(tree, prefix=()):
    for key in sorted(tree):
        value = tree[key]
        if isinstance(value, dict):
            yield from _flat(value, prefix + (key,))
        else:
            yield ".".join(prefix + (key,)), np.shape(value)


@functools.cache
def build_module(api, cls, n_in, hidden, rnn=False):
    """The Flax cell (wrapped in ``RNN(cell, return_carry=True)`` with ``rnn``) in float64,
    and its parameters' ``(name, shape)``, from abstract shapes (``eval_shape``: nothing is
    computed; the audit supplies the parameters)."""
    jax = _jax()
    jnp, flax = jax.numpy, _flax(api)
    for name in (cls, "RNN") if rnn else (cls,):
        if not hasattr(flax, name):
            raise Skipped(f"needs flax.{api}.{name}, absent from Flax {_flax_version()}")
    if api == "linen":
        cell = getattr(flax, cls)(features=hidden, param_dtype=jnp.float64)
        carry = cell.initialize_carry(jax.random.key(0), (1, n_in))
        tree = jax.eval_shape(cell.init, jax.random.key(0), carry, jnp.zeros((1, n_in)))
        module = flax.RNN(cell, return_carry=True) if rnn else cell
        return module, tuple(_flat(_unfreeze(tree["params"])))
    module = flax.eval_shape(lambda: _nnx_module(cls, n_in, hidden, rnn))
    graphdef, params, rest = flax.split(module, flax.Param, ...)
    pure = flax.to_pure_dict(params)
    return (graphdef, rest), tuple(_flat(pure["cell"] if rnn else pure))


def _nnx_module(cls, n_in, hidden, rnn):
    nnx = _flax("nnx")
    cell = getattr(nnx, cls)(n_in, hidden, rngs=nnx.Rngs(0), param_dtype=_jax().numpy.float64)
    return nnx.RNN(cell, return_carry=True) if rnn else cell


@functools.cache
def flax_function(api, kind, cls, n_in, hidden, rnn=None):
    """Flax's outputs as a function of flat arrays (``flax_outputs``) and the ``jax.jit`` of
    its forward, ``jax_vjp``, ``jax_jvp`` and ``jax_hvp``, once per module and sizes;
    ``rnn``: None for a cell, else ``(seq_lengths, reverse, keep_order)`` of the ``RNN``
    call. Returns ``(jitted, shapes)``, ``jitted`` a dict by those names."""
    jax = _jax()
    module, shapes = build_module(api, cls, n_in, hidden, rnn is not None)
    options = None if rnn is None else {"seq_lengths": jax.numpy.asarray(rnn[0]),
                                        "reverse": rnn[1], "keep_order": rnn[2]}
    fn = functools.partial(flax_outputs, api, kind, module, [_path(n) for n, _ in shapes],
                           2 if kind == "lstm" else 1, options)
    jitted = {"forward": jax.jit(fn)}
    jitted.update({k: jax.jit(functools.partial(f, fn)) for k, f in
                   (("vjp", jax_vjp), ("jvp", jax_jvp), ("hvp", jax_hvp))})
    return jitted, shapes


def _unfreeze(tree):
    return {k: _unfreeze(v) if hasattr(v, "keys") else v for k, v in tree.items()}


def flax_outputs(api, kind, module, paths, n_state, options, *arrays):
    """Flax's outputs for ``x, [c,] h, *params``: ``(h, c)`` or ``(h,)`` for a cell; for
    ``RNN`` (``options``: its call's keywords) ``(h [B, T, H], h_final[, c_final])``."""
    x, state, params = arrays[0], arrays[1:1 + n_state], arrays[1 + n_state:]
    carry = tuple(state) if kind == "lstm" else state[0]
    prefix = ("cell",) if options is not None else ()
    tree = _nested([prefix + p for p in paths], params)
    if api == "linen":
        out = module.apply({"params": tree}, *((x,) if options is not None else (carry, x)),
                           **_rnn_call(options, carry))
    else:
        graphdef, rest = module
        model = _flax("nnx").merge(graphdef, tree, rest)
        out = model(x, **_rnn_call(options, carry)) if options is not None else model(carry, x)
    final, ys = out
    if options is None:
        return (final[1], final[0]) if kind == "lstm" else (final,)
    return (ys, final[1], final[0]) if kind == "lstm" else (ys, final)


def _rnn_call(options, carry):
    return {} if options is None else dict(options, initial_carry=carry)


def _numpy(values):
    return tuple(np.asarray(v) for v in values)


def jax_vjp(fn, ct, *arrays):
    _, pullback = _jax().vjp(fn, *arrays)
    return pullback(tuple(ct))


def jax_jvp(fn, tangents, *arrays):
    return _jax().jvp(fn, tuple(arrays), tuple(tangents))[1]


def _loss(fn, ct, *arrays):
    return sum((o * c).sum() for o, c in zip(fn(*arrays), ct, strict=True))


def jax_hvp(fn, ct, tangents, *arrays):
    """``jax.jvp`` of ``jax.grad`` of ``<ct, fn(*arrays)>``: the Hessian-vector product."""
    jax = _jax()
    grad = jax.grad(functools.partial(_loss, fn, ct), argnums=tuple(range(len(arrays))))
    return jax.jvp(grad, tuple(arrays), tuple(tangents))[1]


# ---------------------------------------------------------------------------------------------
# One cell


class CellCase:
    """One generated case for one Flax cell: its inputs, parameters (Flax's layout, drawn
    from the generator), a cotangent and tangents, and Flax's functions of them (the
    forward jitted, once per sizes: the oracle calls it many times)."""

    def __init__(self, rng, api, kind, cls, rnn=None, steps=None):
        drawn = sizes(rng)
        batch, n_in, hidden = drawn["batch"], drawn["input_size"], drawn["hidden"]
        self.api, self.kind, self.cls = api, kind, cls
        rnn = None if rnn is None else rnn(batch)
        self.jitted, shapes = flax_function(api, kind, cls, n_in, hidden, rnn)
        states = ("c", "h") if kind == "lstm" else ("h",)
        self.params = {n: (0.3 if n.endswith("bias") else 1 / np.sqrt(hidden))
                       * rng.standard_normal(s) for n, s in shapes}
        self.names = ("x",) + states + tuple(self.params)
        x_shape = (batch, n_in) if steps is None else (batch, steps, n_in)
        self.args = [rng.standard_normal(x_shape)] + [
            0.5 * rng.standard_normal((batch, hidden)) for _ in states] + list(
            self.params.values())
        self.seed = int(rng.integers(2**31))
        self.cotangent = tuple(rng.standard_normal(s) for s in self.output_shapes(
            batch, hidden, steps))
        self.tangents = [rng.standard_normal(np.shape(a)) for a in self.args]

    outputs_lstm, outputs_gru = ("h", "c"), ("h",)

    @property
    def outputs(self):
        return self.outputs_lstm if self.kind == "lstm" else self.outputs_gru

    def output_shapes(self, batch, hidden, steps):
        return [(batch, hidden)] * len(self.outputs)

    def forward(self, *arrays):
        return _numpy(self.jitted["forward"](*arrays))

    def vjp(self, ct, *arrays):
        return _numpy(self.jitted["vjp"](tuple(ct), *arrays))

    def jvp(self, tangents, *arrays):
        tangents = [np.zeros(np.shape(a)) if t is None else t
                    for a, t in zip(arrays, tangents, strict=True)]
        return _numpy(self.jitted["jvp"](tangents, *arrays))

    def hvp(self):
        return _numpy(self.jitted["hvp"](self.cotangent, self.tangents, *self.args))

    def n_inputs(self):
        return 3 if self.kind == "lstm" else 2      # x and the states

    # gradcells's view of the same computation
    def gradcells_args(self, arrays):
        """gradcells's arrays ``(x, cs_prev, h_prev, w, b)`` or ``(x, h_prev, w_ru, w_c,
        b_ru, b_c)`` for arrays aligned with ``names`` (inputs or their tangents)."""
        n = self.n_inputs()
        params = dict(zip(self.params, arrays[n:], strict=True))
        return tuple(arrays[:n]) + gradcells_weights(self.api, self.kind, self.cls, params)

    def gradcells_state(self):
        args = self.gradcells_args(self.args)
        if self.kind == "lstm":
            return args, steps.lstm_cell(*args, forget_bias=0.0)
        return args, steps.gru_cell(*args, reset_after=True)

    def gradcells_forward(self):
        _, state = self.gradcells_state()
        return (state.h, state.cs) if self.kind == "lstm" else (state.h,)

    def in_flax_layout(self, grads):
        """gradcells's gradients (an ``LSTMCellGrads`` or ``GRUCellGrads``) aligned with
        ``names``."""
        n = self.n_inputs()
        weights = grads[3:5] if self.kind == "lstm" else grads[2:6]
        return list(grads[:n]) + flax_gradients(self.api, self.kind, self.cls,
                                                 list(self.params), weights)

    def upstream(self):
        if self.kind == "lstm":
            return {"d_h": self.cotangent[0], "d_cs": self.cotangent[1]}
        return {"d_h": self.cotangent[0]}

    def gradcells_grads(self):
        args, state = self.gradcells_state()
        grad = steps.lstm_cell_grad if self.kind == "lstm" else steps.gru_cell_grad
        return self.in_flax_layout(grad(*args, state, **self.upstream()))

    def gradcells_tangents(self):
        """The case's tangents in gradcells's layout, as its ``*Grads`` tuple."""
        t = self.gradcells_args(self.tangents)
        if self.kind == "lstm":
            return LSTMCellGrads(*t, *(None,) * 5)
        return GRUCellGrads(*t)

    def gradcells_jvp(self):
        args = self.gradcells_args(self.args)
        if self.kind == "lstm":
            _, d = steps.lstm_cell_jvp(*args, self.gradcells_tangents(), forget_bias=0.0)
            return d.h, d.cs
        _, d = steps.gru_cell_jvp(*args, self.gradcells_tangents(), reset_after=True)
        return (d.h,)

    def gradcells_hvp(self):
        args, state = self.gradcells_state()
        op = steps.lstm_cell_grad_jvp if self.kind == "lstm" else steps.gru_cell_grad_jvp
        _, d = op(*args, state, self.gradcells_tangents(), **self.upstream())
        return self.in_flax_layout(d)


def cell_forward(rng, api, kind, cls) -> Verdict:
    """Flax's float64 forward against gradcells's on the converted weights."""
    case = CellCase(rng, api, kind, cls)
    return Verdict(compare(zip(case.outputs, case.forward(*case.args),
                               case.gradcells_forward(), strict=True), FLOAT64))


def cell_vjp_oracle(rng, api, kind, cls) -> Verdict:
    """``jax.vjp`` against the oracle's central differences of Flax's forward."""
    case = CellCase(rng, api, kind, cls)
    return Verdict(oracle_outcome(check_vjp(case.forward, case.vjp, case.args,
                                            names=case.names, cotangent=case.cotangent,
                                            seed=case.seed)))


def cell_vjp_gradcells(rng, api, kind, cls) -> Verdict:
    """``jax.vjp`` against gradcells's ``*_cell_grad``, in Flax's layout."""
    case = CellCase(rng, api, kind, cls)
    return Verdict(compare(zip(case.names, case.vjp(case.cotangent, *case.args),
                               case.gradcells_grads(), strict=True), FLOAT64))


def cell_jvp_oracle(rng, api, kind, cls) -> Verdict:
    """``jax.jvp`` against the oracle's ``check_jvp`` (differences along the tangents)."""
    case = CellCase(rng, api, kind, cls)
    return Verdict(oracle_outcome(check_jvp(case.forward, case.jvp, case.args,
                                            tangents=case.tangents, names=case.outputs)))


def cell_jvp_gradcells(rng, api, kind, cls) -> Verdict:
    """``jax.jvp`` against gradcells's ``*_cell_jvp`` along the same tangents."""
    case = CellCase(rng, api, kind, cls)
    return Verdict(compare(zip(case.outputs, case.jvp(case.tangents, *case.args),
                               case.gradcells_jvp(), strict=True), FLOAT64))


def cell_hvp_gradcells(rng, api, kind, cls) -> Verdict:
    """``jax.jvp(jax.grad(<ct, f>))`` against gradcells's ``*_cell_grad_jvp``."""
    case = CellCase(rng, api, kind, cls)
    return Verdict(compare(zip(case.names, case.hvp(), case.gradcells_hvp(), strict=True), FLOAT64))


# ---------------------------------------------------------------------------------------------
# RNN over a ragged batch


class SeqCase(CellCase):
    """One generated case for ``RNN(cell)`` (``LSTMCell`` or ``GRUCell``) over ``x [B, T,
    I]`` (Flax's batch-major default), ``return_carry=True``, with ``seq_lengths`` drawn in
    ``[1, T]``, T in 2..4: one row shorter than T (with ``keep_order=False``, one of length
    T, to flip; with ``empty``, one of length 0); ``reverse`` drawn unless given."""

    outputs_lstm, outputs_gru = ("h", "h_final", "c_final"), ("h", "h_final")

    def __init__(self, rng, api, kind, *, keep_order=True, empty=False, reverse=None):
        steps = int(rng.integers(2, 5))
        self.reverse = bool(rng.integers(2)) if reverse is None else reverse
        self.keep_order = keep_order
        self._draw = (rng, steps, empty)
        super().__init__(rng, api, kind, "LSTMCell" if kind == "lstm" else "GRUCell",
                         rnn=self.rnn_options, steps=steps)
        self.cotangent = (self.cotangent[0] * self.valid[..., None],) + self.cotangent[1:]

    def rnn_options(self, batch):
        """Draw the lengths for ``batch`` rows; the ``RNN`` call's options."""
        rng, steps, empty = self._draw
        lengths = rng.integers(1, steps + 1, size=batch)
        shorter = int(rng.integers(1, steps)) if self.keep_order else steps   # a row to flip
        lengths[int(rng.integers(batch))] = 0 if empty else shorter
        self.lengths = lengths
        self.valid = np.arange(steps)[None, :] < lengths[:, None]        # [B, T]
        return tuple(int(n) for n in lengths), self.reverse, self.keep_order

    def output_shapes(self, batch, hidden, steps):
        return [(batch, steps, hidden)] + [(batch, hidden)] * (len(self.outputs) - 1)

    def options(self, lengths=None):
        return {"seq_len": self.lengths if lengths is None else lengths,
                "reverse": self.reverse, "batch_first": True}

    def gradcells_seq(self, lengths=None):
        args = self.gradcells_args(self.args)
        if self.kind == "lstm":
            return args, sequences.lstm_sequence(*args, forget_bias=0.0,
                                                 **self.options(lengths))
        return args, sequences.gru_sequence(*args, reset_after=True, **self.options(lengths))

    def gradcells_forward(self, lengths=None):
        _, seq = self.gradcells_seq(lengths)
        if self.kind == "lstm":
            return seq.h, seq.h_final, seq.cs_final
        return seq.h, seq.h_final

    def masked(self, outputs):
        """``outputs`` with the per-step ``h`` zero past each row's length."""
        return (outputs[0] * self.valid[..., None],) + tuple(outputs[1:])

    def upstream(self):
        ct = self.cotangent
        if self.kind == "lstm":
            return {"d_h": ct[0], "d_h_final": ct[1], "d_cs_final": ct[2]}
        return {"d_h": ct[0], "d_h_final": ct[1]}

    def gradcells_grads(self):
        args, seq = self.gradcells_seq()
        grad = (sequences.lstm_sequence_grad if self.kind == "lstm"
                else sequences.gru_sequence_grad)
        return self.in_flax_layout(grad(*args, seq, **self.upstream()))

    def gradcells_jvp(self):
        args = self.gradcells_args(self.args)
        t = self.gradcells_args(self.tangents)
        if self.kind == "lstm":
            _, d = sequences.lstm_sequence_jvp(*args, LSTMSequenceGrads(
                *t, *(None,) * 5), forget_bias=0.0, **self.options())
            return d.h, d.h_final, d.cs_final
        _, d = sequences.gru_sequence_jvp(*args, GRUSequenceGrads(*t),
                                          reset_after=True, **self.options())
        return d.h, d.h_final


    def gradcells_hvp(self):
        args, seq = self.gradcells_seq()
        t = self.gradcells_args(self.tangents)
        if self.kind == "lstm":
            _, d = sequences.lstm_sequence_grad_jvp(*args, seq, LSTMSequenceGrads(
                *t, *(None,) * 5), **self.upstream())
        else:
            _, d = sequences.gru_sequence_grad_jvp(*args, seq, GRUSequenceGrads(*t),
                                                   **self.upstream())
        return self.in_flax_layout(d)


def flipped(h, lengths):
    """``h [B, T, H]`` with each row's first ``lengths[b]`` steps in reverse order (Flax's
    ``flip_sequences``: the padding stays at the end)."""
    out = np.array(h)
    for b, n in enumerate(lengths):
        out[b, :n] = h[b, :n][::-1]
    return out


def seq_forward(rng, api, kind) -> Verdict:
    """``RNN(cell, return_carry=True)`` with ragged ``seq_lengths`` (>= 1), either direction,
    ``keep_order=True``: every valid step's output and the final carry against gradcells's
    ``seq_len``/``reverse`` (``batch_first``)."""
    case = SeqCase(rng, api, kind)
    return Verdict(compare(zip(case.outputs, case.masked(case.forward(*case.args)),
                               case.gradcells_forward(), strict=True), FLOAT64))


def seq_padding(rng, api, kind) -> Verdict:
    """The outputs past each row's length against gradcells's zeros (convention 20: Flax
    documents them as not zeroed; the model compares the valid steps only)."""
    case = SeqCase(rng, api, kind)
    out, truth = case.forward(*case.args), case.gradcells_forward()
    return judge(compare(zip(case.outputs, out, truth, strict=True), FLOAT64),
                 lambda: compare(zip(case.outputs, case.masked(out), truth, strict=True), FLOAT64))


def seq_order(rng, api, kind) -> Verdict:
    """``reverse=True, keep_order=False``: the valid outputs against gradcells's at their time
    positions (convention 21: Flax returns them in processing order; the model flips
    gradcells's within each row's length)."""
    case = SeqCase(rng, api, kind, keep_order=False, reverse=True)
    out, truth = case.masked(case.forward(*case.args)), case.gradcells_forward()
    model = (flipped(truth[0], case.lengths),) + tuple(truth[1:])
    return judge(compare(zip(case.outputs, out, truth, strict=True), FLOAT64),
                 lambda: compare(zip(case.outputs, out, model, strict=True), FLOAT64))


def seq_empty(rng, api, kind) -> Verdict:
    """A row of length 0: the final carry against gradcells's (the initial state; fault 22's
    model: the carry after all T padded steps, gradcells with that row's length T)."""
    case = SeqCase(rng, api, kind, empty=True)
    out = case.masked(case.forward(*case.args))
    full = np.where(case.lengths == 0, case.valid.shape[1], case.lengths)
    return judge(compare(zip(case.outputs, out, case.gradcells_forward(), strict=True), FLOAT64),
                 lambda: compare(zip(case.outputs[1:], out[1:],
                                     case.gradcells_forward(full)[1:], strict=True), FLOAT64))


def seq_vjp_oracle(rng, api, kind) -> Verdict:
    """``jax.vjp`` through ``RNN`` (ragged, either direction) against the oracle's central
    differences of Flax's forward."""
    case = SeqCase(rng, api, kind)
    return Verdict(oracle_outcome(check_vjp(case.forward, case.vjp, case.args,
                                            names=case.names, cotangent=case.cotangent,
                                            seed=case.seed)))


def seq_vjp_gradcells(rng, api, kind) -> Verdict:
    """``jax.vjp`` through ``RNN`` (cotangent zero past the lengths) against gradcells's
    ``*_sequence_grad`` with ``seq_len``/``reverse``."""
    case = SeqCase(rng, api, kind)
    return Verdict(compare(zip(case.names, case.vjp(case.cotangent, *case.args),
                               case.gradcells_grads(), strict=True), FLOAT64))


def seq_jvp_gradcells(rng, api, kind) -> Verdict:
    """``jax.jvp`` through ``RNN`` (valid steps, final carry) against gradcells's
    ``*_sequence_jvp``."""
    case = SeqCase(rng, api, kind)
    return Verdict(compare(zip(case.outputs, case.masked(case.jvp(case.tangents, *case.args)),
                               case.gradcells_jvp(), strict=True), FLOAT64))


def seq_hvp_gradcells(rng, api, kind) -> Verdict:
    """``jax.jvp(jax.grad(<ct, RNN>))`` (cotangent zero past the lengths) against
    gradcells's ``*_sequence_grad_jvp``: second order through time."""
    case = SeqCase(rng, api, kind)
    return Verdict(compare(zip(case.names, case.hvp(), case.gradcells_hvp(), strict=True), FLOAT64))


# ---------------------------------------------------------------------------------------------
# Documented conventions and faults of the cells


def nnx_gru_documented(rng) -> Verdict:
    """``nnx.GRUCell`` on ``linen.GRUCell``'s parameters (the formula both document, with
    ``b_hn`` inside the reset) against linen's result through gradcells; fault 23's model:
    gradcells with ``b_hn = 0``, nnx having no place for it."""
    case = CellCase(rng, "linen", "gru", "GRUCell")
    kx, kh, (bx, b_hn) = _blocks("linen", "gru", "GRUCell", case.params)
    jitted, shapes = flax_function("nnx", "gru", "GRUCell", kx.shape[0], kh.shape[0])
    params = _unblocks("nnx", "gru", "GRUCell", [n for n, _ in shapes], kx, kh, (bx, None))
    out = _numpy(jitted["forward"](*case.args[:2], *params))
    truth = case.gradcells_forward()
    case.args[case.names.index("hn.bias")] = np.zeros_like(b_hn)
    return judge(compare(zip(case.outputs, out, truth, strict=True), FLOAT64),
                 lambda: compare(zip(case.outputs, out, case.gradcells_forward(), strict=True),
                                 FLOAT64))


def lstm_forget_bias(rng) -> Verdict:
    """``linen.LSTMCell`` against gradcells's ``lstm_cell`` at its default ``forget_bias``
    (1.0, TensorFlow's); convention 24's model: ``forget_bias=0`` (Flax adds none)."""
    case = CellCase(rng, "linen", "lstm", "LSTMCell")
    out = case.forward(*case.args)
    state = steps.lstm_cell(*case.gradcells_args(case.args))
    return judge(compare(zip(case.outputs, out, (state.h, state.cs), strict=True), FLOAT64),
                 lambda: compare(zip(case.outputs, out, case.gradcells_forward(), strict=True),
                                 FLOAT64))


# ---------------------------------------------------------------------------------------------
# The rows


def _cell_rows(label, api, kind, cls) -> list[Check]:
    spec = {"api": api, "kind": kind, "cls": cls}
    op = "lstm_cell" if kind == "lstm" else "gru_cell"
    return [Check(f"{label} forward vs gradcells {op}", functools.partial(cell_forward, **spec)),
            Check(f"{label} jax.vjp vs oracle", functools.partial(cell_vjp_oracle, **spec)),
            Check(f"{label} jax.vjp vs gradcells {op}_grad",
                  functools.partial(cell_vjp_gradcells, **spec)),
            Check(f"{label} jax.jvp vs oracle (check_jvp)",
                  functools.partial(cell_jvp_oracle, **spec)),
            Check(f"{label} jax.jvp vs gradcells {op}_jvp",
                  functools.partial(cell_jvp_gradcells, **spec)),
            Check(f"{label} jvp of grad (HVP) vs gradcells {op}_grad_jvp",
                  functools.partial(cell_hvp_gradcells, **spec))]


def _seq_rows(api, kind) -> list[Check]:
    label = f"{api}.RNN({'LSTMCell' if kind == 'lstm' else 'GRUCell'})"
    op = f"{kind}_sequence"
    spec = {"api": api, "kind": kind}
    return [Check(f"{label} ragged, either direction: forward vs gradcells {op}",
                  functools.partial(seq_forward, **spec)),
            Check(f"{label} outputs past seq_lengths vs zeros",
                  functools.partial(seq_padding, **spec), fault=20),
            Check(f"{label} reverse, keep_order=False vs time positions",
                  functools.partial(seq_order, **spec), fault=21),
            Check(f"{label} a length-0 row: final carry vs initial state",
                  functools.partial(seq_empty, **spec), fault=22),
            Check(f"{label} ragged jax.vjp vs oracle", functools.partial(seq_vjp_oracle, **spec)),
            Check(f"{label} ragged jax.vjp vs gradcells {op}_grad",
                  functools.partial(seq_vjp_gradcells, **spec)),
            Check(f"{label} ragged jax.jvp vs gradcells {op}_jvp",
                  functools.partial(seq_jvp_gradcells, **spec)),
            Check(f"{label} ragged jvp of grad (HVP) vs gradcells {op}_grad_jvp",
                  functools.partial(seq_hvp_gradcells, **spec), cases=1)]   # compiles slowly


CHECKS = tuple([check for cell in CELLS for check in _cell_rows(*cell)]
               + [Check("nnx.GRUCell on linen.GRUCell's parameters (documented b_hn)",
                        nnx_gru_documented, fault=23),
                  Check("linen.LSTMCell vs gradcells's default forget_bias=1",
                        lstm_forget_bias, fault=24)]
               + [check for api in ("linen", "nnx") for kind in ("lstm", "gru")
                  for check in _seq_rows(api, kind)])
"""Every Flax row, in order."""


SECTION = "Flax"
"""The framework's name, as the audit's title (and its docs/audit.md section) begins."""


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the Flax audit; ImportError without JAX or Flax."""
    jax = _jax()
    import flax

    devices = sorted({d.platform.upper() for d in jax.devices()})
    title = (f"gradcells audit of {SECTION} {flax.__version__} (JAX {jax.__version__}, "
             f"{', '.join(devices)}, float64)")
    return title, CHECKS, ["Flax's LSTM gate order is i, f, g, o (PyTorch's); its GRU is "
                           "reset-after (gradcells's reset_after=True)"]
