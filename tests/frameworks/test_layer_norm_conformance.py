"""Conformance of the layer-normalised LSTM (docs/spec.md §9.2) with two frameworks, in
float64, for both ``ln_carry`` values.

* **PyTorch.** The cell of §9.2 transcribed into PyTorch's ops (``F.layer_norm`` for the
  three norms, ``torch.clamp`` for the clips), one step and a loop over time with PyTorch's
  packed-sequence semantics (a row's state frozen and its outputs zero past its length),
  differentiated by autograd: the forward (every step's gates, states and outputs, the
  final states) and every gradient (``x``, the states, ``w``, ``b``, the peepholes,
  ``w_proj`` and the six norm parameters) against ``gc.lstm_cell_grad`` and
  ``gc.lstm_sequence_grad``, with peepholes, ``cell_clip``, a projection with
  ``proj_clip``, ``forget_bias`` and ragged ``seq_len``, at fixed sizes and at sizes drawn
  by Hypothesis. The transcription is written from the spec's formulas, not from
  gradcells's code; PyTorch's ``layer_norm`` and its autograd are independent of both.
* **TF Addons' ``LayerNormLSTMCell``** (the ``ln_carry="normalized"`` model). TF Addons does
  not install with TensorFlow 2.21, so its published ``call`` is ported onto Keras 3 below
  (``keras.layers.LSTMCell`` with ``kernel_norm``, ``recurrent_norm`` and ``state_norm``
  ``LayerNormalization`` layers), run step by step and as a ``keras.layers.RNN`` layer,
  and compared, forward and ``tf.GradientTape`` gradients, with gradcells in normalized
  mode. Keras' gate order is i, f, c, o: the kernels go through
  ``gc.layouts.lstm_to_keras`` / ``lstm_from_keras`` and the ``[4H]`` gains and shifts of
  the gate norms are reordered the same way (``_keras_order``); Keras adds no forget bias
  (``forget_bias=0.0``), and ``LayerNormalization``'s epsilon (TF Addons' ``norm_epsilon``,
  1e-3 by default) is passed as ``ln_epsilon``.

Each framework part skips when its framework is not installed. The tolerances are those of
the other float64 conformance tests (tests/frameworks/test_projection_conformance.py): both sides
are
float64 and differ only in the order of summation.
"""

import numpy as np
import pytest
from conftest import torch_leaf
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcells as gc
from gradcells import layouts

pytestmark = pytest.mark.conformance

BACKENDS = ["reference", "cpu"]    # "cpu" fails until the CPU backend has the layer norm
CARRIES = ["raw", "normalized"]
FORWARD_TOL = {"rtol": 1e-10, "atol": 1e-12}
GRAD_TOL = {"rtol": 1e-9, "atol": 1e-11}
NORM_NAMES = gc.LSTMNorm._fields
STEP_FIELDS = ("i", "cs", "f", "o", "ci", "co", "h")


def close(actual, expected, what="", tol=GRAD_TOL):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), err_msg=what, **tol)


# ---------------------------------------------------------------------------------------------
# PyTorch: the cell of docs/spec.md §9.2 written with PyTorch's ops


class TorchLNLSTM:
    """The layer-normalised LSTM step of docs/spec.md §9.2 in PyTorch's ops, for the leaves
    of a gradcells case (peepholes, projection and clips optional):

        G  = LN(x·w_x; γ_x, β_x) + LN(h·w_h; γ_h, β_h) + b          (F.layer_norm, over 4H)
        i, ci, f, o (gates i, ci, f, o; forget_bias on f; peepholes on cs_prev and cs)
        c̃  = clamp(i∘ci + f∘cs_prev);  n = LN(c̃; γ_c, β_c);  co = tanh(n)
        cs = c̃ ("raw") or n ("normalized");  o = σ(Go + cs∘wco);  h = clamp((o∘co)·w_proj)
    """

    def __init__(self, torch, leaves, case):
        self.torch, self.leaves = torch, leaves
        self.forget_bias, self.cell_clip = case["forget_bias"], case["cell_clip"]
        self.proj_clip, self.eps = case.get("proj_clip"), case["ln_epsilon"]
        self.carry = case["ln_carry"]

    def _ln(self, z, gamma, beta):
        return self.torch.nn.functional.layer_norm(z, (z.shape[-1],), gamma, beta, self.eps)

    def step(self, x, cs_prev, h_prev):
        """``(i, cs, f, o, ci, co, h)`` of one step."""
        torch, p = self.torch, self.leaves
        n_in = x.shape[1]
        gates = (self._ln(x @ p["w"][:n_in], p["gamma_x"], p["beta_x"])
                 + self._ln(h_prev @ p["w"][n_in:], p["gamma_h"], p["beta_h"]) + p["b"])
        gi, gc_, gf, go = gates.chunk(4, dim=1)
        peep = "wci" in p
        i = torch.sigmoid(gi + cs_prev * p["wci"] if peep else gi)
        ci = torch.tanh(gc_)
        f = torch.sigmoid(gf + self.forget_bias + (cs_prev * p["wcf"] if peep else 0))
        c_tilde = i * ci + f * cs_prev
        if self.cell_clip is not None:
            c_tilde = torch.clamp(c_tilde, -self.cell_clip, self.cell_clip)
        n = self._ln(c_tilde, p["gamma_c"], p["beta_c"])
        cs = n if self.carry == "normalized" else c_tilde
        o = torch.sigmoid(go + cs * p["wco"] if peep else go)
        co = torch.tanh(n)
        h = o * co
        if "w_proj" in p:
            h = h @ p["w_proj"]
            if self.proj_clip is not None:
                h = torch.clamp(h, -self.proj_clip, self.proj_clip)
        return i, cs, f, o, ci, co, h

    def sequence(self, x, cs0, h0, lengths):
        """Every step's ``(i, cs, f, o, ci, co, h)`` stacked ``[T, B, ·]`` (zero past a row's
        length) and the final ``(cs, h)``: PyTorch's packed semantics, a finished row's
        state frozen."""
        torch = self.torch
        steps, cs, h = [], cs0, h0
        for t in range(x.shape[0]):
            state = self.step(x[t], cs, h)
            valid = (torch.ones(x.shape[1], dtype=torch.bool) if lengths is None
                     else torch.from_numpy(np.asarray(lengths) > t))[:, None]
            steps.append([torch.where(valid, a, torch.zeros_like(a)) for a in state])
            cs, h = torch.where(valid, state[1], cs), torch.where(valid, state[6], h)
        return [torch.stack(a) for a in zip(*steps, strict=True)], cs, h


PARAMETER_NAMES = ("w", "b", "wci", "wcf", "wco", "w_proj")


def _leaves(torch, case, names):
    """Autograd leaves of the case's arrays among ``names`` and of its six norm
    parameters (by their field names)."""
    leaves = {k: torch_leaf(torch, case[k]) for k in names if case.get(k) is not None}
    leaves.update({k: torch_leaf(torch, a)
                   for k, a in zip(NORM_NAMES, case["layer_norm"], strict=True)})
    return leaves


def _norm_grads(grads):
    return dict(zip(NORM_NAMES, grads.layer_norm, strict=True))


def _check_torch_cell(torch, backend, case):
    """Forward and every gradient of one step against the transcription."""
    rng = np.random.default_rng(17)
    leaves = _leaves(torch, case, ("x", "cs_prev", "h_prev", *PARAMETER_NAMES))
    model = TorchLNLSTM(torch, leaves, case)
    theirs = model.step(leaves["x"], leaves["cs_prev"], leaves["h_prev"])
    d_h = rng.standard_normal(case["h_prev"].shape)
    d_cs = rng.standard_normal(case["cs_prev"].shape)
    ((theirs[6] * torch.from_numpy(d_h)).sum()
     + (theirs[1] * torch.from_numpy(d_cs)).sum()).backward()

    state = gc.lstm_cell(**case, backend=backend)
    assert state.settings.layer_norm and state.settings.ln_carry == case["ln_carry"]
    for name, a in zip(STEP_FIELDS, theirs, strict=True):
        close(getattr(state, name), a.detach().numpy(), name, FORWARD_TOL)
    arrays = {k: v for k, v in case.items() if k not in ("forget_bias", "ln_epsilon",
                                                          "ln_carry")}
    grads = gc.lstm_cell_grad(**arrays, state=state, d_h=d_h, d_cs=d_cs, backend=backend)
    for k, leaf in leaves.items():
        ours = _norm_grads(grads)[k] if k in NORM_NAMES else getattr(grads, k)
        close(ours, leaf.grad.numpy(), f"d{k}")
    return state


def _check_torch_sequence(torch, backend, case):
    """Forward (every step, the final states) and every gradient of BPTT against the
    transcription's loop, from upstream gradients on every step's ``h`` and ``cs`` and on
    the final states."""
    rng = np.random.default_rng(23)
    leaves = _leaves(torch, case, ("x", "cs0", "h0", *PARAMETER_NAMES))
    model = TorchLNLSTM(torch, leaves, case)
    lengths = case["seq_len"]
    theirs, cs_n, h_n = model.sequence(leaves["x"], leaves["cs0"], leaves["h0"], lengths)
    steps, batch = case["x"].shape[:2]
    upstream = {"d_h": rng.standard_normal((steps, batch, case["h0"].shape[1])),
                "d_cs": rng.standard_normal((steps, batch, case["cs0"].shape[1])),
                "d_h_final": rng.standard_normal(case["h0"].shape),
                "d_cs_final": rng.standard_normal(case["cs0"].shape)}
    loss = sum((a * torch.from_numpy(upstream[k])).sum()
               for k, a in (("d_h", theirs[6]), ("d_cs", theirs[1]), ("d_h_final", h_n),
                            ("d_cs_final", cs_n)))
    loss.backward()

    seq = gc.lstm_sequence(**case, backend=backend)
    for name, a in zip(STEP_FIELDS, theirs, strict=True):
        close(getattr(seq, name), a.detach().numpy(), name, FORWARD_TOL)
    close(seq.h_final, h_n.detach().numpy(), "h_final", FORWARD_TOL)
    close(seq.cs_final, cs_n.detach().numpy(), "cs_final", FORWARD_TOL)
    if lengths is not None:
        past = np.arange(steps)[:, None] >= np.asarray(lengths)[None, :]
        assert not seq.h[past].any() and not seq.cs[past].any()
    arrays = {k: v for k, v in case.items() if k not in ("forget_bias", "ln_epsilon",
                                                          "ln_carry")}
    grads = gc.lstm_sequence_grad(**arrays, seq=seq, **upstream, backend=backend)
    for k, leaf in leaves.items():
        ours = _norm_grads(grads)[k] if k in NORM_NAMES else getattr(grads, k)
        close(ours, leaf.grad.numpy(), f"d{k}")
    return seq


OPTIONS = {
    "plain": {},
    "peepholes": {"peephole": True, "forget_bias": 0.0},
    "cell_clip": {"peephole": True, "clip": True, "forget_bias": -0.5},
    "projection": {"proj_size": 3, "proj_clip": True, "forget_bias": 2.5},
    "everything": {"peephole": True, "clip": True, "proj_size": 2, "proj_clip": True},
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ln_carry", CARRIES)
@pytest.mark.parametrize("options", OPTIONS, ids=list(OPTIONS))
def test_torch_cell_forward_and_every_gradient(torch, backend, ln_carry, options):
    rng = np.random.default_rng(101)
    case = gc.testing.lstm_cell_case(rng, batch=4, input_size=3, hidden=5, layer_norm=True,
                                     ln_carry=ln_carry, **OPTIONS[options])
    state = _check_torch_cell(torch, backend, case)
    if case["cell_clip"] is not None:  # the clip bites, and not everywhere
        raw = state.i * state.ci + state.f * case["cs_prev"]
        assert (np.abs(raw) > case["cell_clip"]).any()
        assert (np.abs(raw) < case["cell_clip"]).any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ln_carry", CARRIES)
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
@pytest.mark.parametrize("options", OPTIONS, ids=list(OPTIONS))
def test_torch_sequence_forward_and_every_gradient(torch, backend, ln_carry, ragged,
                                                   options):
    rng = np.random.default_rng(202)
    case = gc.testing.lstm_sequence_case(rng, steps=5, batch=4, input_size=3, hidden=4,
                                         layer_norm=True, ln_carry=ln_carry, ragged=ragged,
                                         **OPTIONS[options])
    if ragged:
        assert 0 in case["seq_len"] and 5 in case["seq_len"]
    _check_torch_sequence(torch, backend, case)


sizes = {"seed": st.integers(0, 2**32 - 1), "batch": st.integers(1, 4),
         "input_size": st.integers(1, 4), "hidden": st.integers(2, 5),
         "ln_carry": st.sampled_from(CARRIES), "peephole": st.booleans(),
         "clip": st.booleans(), "proj_size": st.sampled_from([None, 1, 3]),
         "forget_bias": st.sampled_from([0.0, 1.0, -0.5])}


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None)
@given(**sizes)
def test_torch_cell_over_drawn_sizes(torch, backend, seed, batch, input_size, hidden,
                                     ln_carry, peephole, clip, proj_size, forget_bias):
    case = gc.testing.lstm_cell_case(
        np.random.default_rng(seed), batch=batch, input_size=input_size, hidden=hidden,
        peephole=peephole, clip=clip, forget_bias=forget_bias, proj_size=proj_size,
        proj_clip=proj_size is not None, layer_norm=True, ln_carry=ln_carry)
    _check_torch_cell(torch, backend, case)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None)
@given(**sizes, steps=st.integers(1, 5), ragged=st.booleans())
def test_torch_sequence_over_drawn_sizes(torch, backend, seed, batch, input_size, hidden,
                                         ln_carry, peephole, clip, proj_size, forget_bias,
                                         steps, ragged):
    case = gc.testing.lstm_sequence_case(
        np.random.default_rng(seed), steps=steps, batch=batch, input_size=input_size,
        hidden=hidden, peephole=peephole, clip=clip, forget_bias=forget_bias,
        proj_size=proj_size, proj_clip=proj_size is not None, layer_norm=True,
        ln_carry=ln_carry, ragged=ragged)
    _check_torch_sequence(torch, backend, case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_the_carry_and_the_norms_matter(torch, backend):
    """The transcription tells the two carries apart and sees each norm parameter: the
    agreement above is not one of a model that ignores them."""
    rng = np.random.default_rng(5)
    case = gc.testing.lstm_sequence_case(rng, steps=4, batch=3, input_size=3, hidden=4,
                                         peephole=True, layer_norm=True, ln_carry="raw")
    raw = gc.lstm_sequence(**case, backend=backend)
    normalized = gc.lstm_sequence(**{**case, "ln_carry": "normalized"}, backend=backend)
    assert np.abs(raw.h - normalized.h).max() > 1e-3
    assert np.abs(raw.cs_final - normalized.cs_final).max() > 1e-3
    for k, name in enumerate(NORM_NAMES):
        changed = list(case["layer_norm"])
        changed[k] = changed[k] + 0.3
        other = gc.lstm_sequence(**{**case, "layer_norm": gc.LSTMNorm(*changed)},
                                 backend=backend)
        assert np.abs(other.h - raw.h).max() > 1e-4, name
    leaves = _leaves(torch, case, ("x", "cs0", "h0", *PARAMETER_NAMES))
    theirs, _, _ = TorchLNLSTM(torch, leaves, {**case, "ln_carry": "normalized"}).sequence(
        leaves["x"], leaves["cs0"], leaves["h0"], None)
    close(normalized.h, theirs[6].detach().numpy(), "h", FORWARD_TOL)
    assert np.abs(raw.h - theirs[6].detach().numpy()).max() > 1e-3


# ---------------------------------------------------------------------------------------------
# TF Addons' LayerNormLSTMCell, ported onto Keras 3


@pytest.fixture(scope="module")
def keras():
    """Keras 3 on TensorFlow (the test skips without them)."""
    pytest.importorskip("tensorflow")
    return pytest.importorskip("keras")


def layer_norm_lstm_cell_class(keras):
    """TF Addons' ``LayerNormLSTMCell`` (github.com/tensorflow/addons,
    tensorflow_addons/rnn/layer_norm_lstm_cell.py; the package does not install with
    TensorFlow 2.21), ported onto Keras 3: ``__init__``, ``build``, ``call`` and
    ``_create_norm_layer`` as published, with ``keras.backend.dot`` -> ``keras.ops.matmul``,
    ``keras.backend.bias_add`` -> ``+``, ``tf.split`` -> ``keras.ops.split``. Dropout is left
    out (TF Addons applies it only when ``dropout`` > 0; these tests use none), and the norm
    layers take the cell's dtype (TF 2's Keras cast sublayers by their own policy; Keras 3
    would build them in float32)."""

    class LayerNormLSTMCell(keras.layers.LSTMCell):
        def __init__(self, units, norm_gamma_initializer="ones",
                     norm_beta_initializer="zeros", norm_epsilon=1e-3, **kwargs):
            super().__init__(units, **kwargs)
            self.norm_gamma_initializer = keras.initializers.get(norm_gamma_initializer)
            self.norm_beta_initializer = keras.initializers.get(norm_beta_initializer)
            self.norm_epsilon = norm_epsilon
            self.kernel_norm = self._create_norm_layer("kernel_norm")
            self.recurrent_norm = self._create_norm_layer("recurrent_norm")
            self.state_norm = self._create_norm_layer("state_norm")

        def build(self, input_shape):
            super().build(input_shape)
            self.kernel_norm.build([input_shape[0], self.units * 4])
            self.recurrent_norm.build([input_shape[0], self.units * 4])
            self.state_norm.build([input_shape[0], self.units])

        def call(self, inputs, states, training=None):
            ops = keras.ops
            h_tm1 = states[0]  # previous memory state
            c_tm1 = states[1]  # previous carry state
            z = self.kernel_norm(ops.matmul(inputs, self.kernel))
            z += self.recurrent_norm(ops.matmul(h_tm1, self.recurrent_kernel))
            if self.use_bias:
                z = z + self.bias
            z = ops.split(z, 4, axis=1)
            c, o = self._compute_carry_and_output_fused(z, c_tm1)
            c = self.state_norm(c)
            h = o * self.activation(c)
            return h, [h, c]

        def _create_norm_layer(self, name):
            return keras.layers.LayerNormalization(
                beta_initializer=self.norm_beta_initializer,
                gamma_initializer=self.norm_gamma_initializer,
                epsilon=self.norm_epsilon, name=name, dtype=self.dtype_policy)

    return LayerNormLSTMCell


def _keras_order(a):
    """A ``[4H]`` vector (a gate norm's gain or shift) from gradcells's gate order i, ci, f, o
    to Keras' i, f, c, o."""
    i, ci, f, o = np.split(a, 4)
    return np.concatenate([i, f, ci, o])


def _gradcells_order(a):
    """The inverse of ``_keras_order``."""
    i, f, ci, o = np.split(a, 4)
    return np.concatenate([i, ci, f, o])


def _keras_cell(keras, case, batch):
    """The ported cell holding the case's weights (``lstm_to_keras`` for the kernels and
    the bias, ``_keras_order`` for the gate norms' gains and shifts)."""
    n_in, hidden = case["x"].shape[-1], case["w"].shape[1] // 4
    cell = layer_norm_lstm_cell_class(keras)(hidden, norm_epsilon=case["ln_epsilon"],
                                             dtype="float64")
    cell.build((batch, n_in))
    kernel, recurrent, bias = layouts.lstm_to_keras(case["w"], case["b"])
    norm = case["layer_norm"]
    for variable, value in (
            (cell.kernel, kernel), (cell.recurrent_kernel, recurrent), (cell.bias, bias),
            (cell.kernel_norm.gamma, _keras_order(norm.gamma_x)),
            (cell.kernel_norm.beta, _keras_order(norm.beta_x)),
            (cell.recurrent_norm.gamma, _keras_order(norm.gamma_h)),
            (cell.recurrent_norm.beta, _keras_order(norm.beta_h)),
            (cell.state_norm.gamma, norm.gamma_c), (cell.state_norm.beta, norm.beta_c)):
        assert tuple(variable.shape) == value.shape
        variable.assign(value)
    np.testing.assert_array_equal(_keras_order(case["b"]), bias)   # the same reordering
    return cell


def _keras_variables(cell):
    return [cell.kernel, cell.recurrent_kernel, cell.bias, cell.kernel_norm.gamma,
            cell.kernel_norm.beta, cell.recurrent_norm.gamma, cell.recurrent_norm.beta,
            cell.state_norm.gamma, cell.state_norm.beta]


def _gradcells_weight_grads(g):
    """``(dw, db, LSTMNorm)`` in gradcells's layout from the Keras variables' gradients."""
    dw, db = layouts.lstm_from_keras(*g[:3])
    return dw, db, gc.LSTMNorm(*map(_gradcells_order, g[3:7]), g[7], g[8])


def _keras_case(rng, *, steps=None, batch=3, input_size=4, hidden=5, ln_epsilon=1e-3):
    kind = gc.testing.lstm_cell_case if steps is None else gc.testing.lstm_sequence_case
    sizes = {} if steps is None else {"steps": steps}
    case = kind(rng, batch=batch, input_size=input_size, hidden=hidden, forget_bias=0.0,
                layer_norm=True, ln_carry="normalized", **sizes)
    return {**case, "ln_epsilon": max(ln_epsilon, case["ln_epsilon"])}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch, input_size, hidden, ln_epsilon",
                         [(3, 4, 5, 1e-3), (2, 1, 2, 1e-3), (4, 3, 3, 1e-5)])
def test_tf_addons_cell_forward_and_every_gradient(keras, backend, batch, input_size, hidden,
                                                   ln_epsilon):
    import tensorflow as tf

    rng = np.random.default_rng(31)
    case = _keras_case(rng, batch=batch, input_size=input_size, hidden=hidden,
                       ln_epsilon=ln_epsilon)
    cell = _keras_cell(keras, case, batch)
    d_h = rng.standard_normal(case["h_prev"].shape)
    d_cs = rng.standard_normal(case["cs_prev"].shape)
    x, h_prev, cs_prev = (tf.constant(case[k]) for k in ("x", "h_prev", "cs_prev"))
    with tf.GradientTape() as tape:
        tape.watch([x, h_prev, cs_prev])
        h, (_, c) = cell(x, [h_prev, cs_prev])
        loss = tf.reduce_sum(h * d_h) + tf.reduce_sum(c * d_cs)
    g_x, g_h, g_c, *g_vars = (np.asarray(g) for g in tape.gradient(
        loss, [x, h_prev, cs_prev, *_keras_variables(cell)]))

    state = gc.lstm_cell(**case, backend=backend)
    close(state.h, np.asarray(h), "h", FORWARD_TOL)
    close(state.cs, np.asarray(c), "cs (TF Addons' carried c: LN(c̃))", FORWARD_TOL)
    grads = gc.lstm_cell_grad(case["x"], case["cs_prev"], case["h_prev"], case["w"],
                              case["b"], state, d_h=d_h, d_cs=d_cs,
                              layer_norm=case["layer_norm"], backend=backend)
    dw, db, d_norm = _gradcells_weight_grads(g_vars)
    for name, ours, theirs in (("x", grads.x, g_x), ("h_prev", grads.h_prev, g_h),
                               ("cs_prev", grads.cs_prev, g_c), ("w", grads.w, dw),
                               ("b", grads.b, db),
                               *zip(NORM_NAMES, grads.layer_norm, d_norm, strict=True)):
        close(ours, theirs, f"d{name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "masked"])
def test_tf_addons_rnn_layer_forward_and_every_gradient(keras, backend, ragged):
    """The ported cell in ``keras.layers.RNN`` over a sequence (batch-major, as Keras
    wants it). ``masked``: the rows padded at the end and a Keras mask; with
    ``zero_output_for_mask`` Keras freezes the state and zeroes the outputs of a masked
    step, PyTorch's packed semantics and gradcells's ``seq_len``."""
    import tensorflow as tf

    steps, batch = 5, 4
    rng = np.random.default_rng(43)
    case = _keras_case(rng, steps=steps, batch=batch, input_size=3, hidden=4)
    lengths = np.array([steps, 2, 4, 1]) if ragged else None
    case["seq_len"] = lengths
    cell = _keras_cell(keras, case, batch)
    layer = keras.layers.RNN(cell, return_sequences=True, return_state=True,
                             zero_output_for_mask=True, dtype="float64")
    d_h = rng.standard_normal((steps, batch, case["h0"].shape[1]))
    d_h_final = rng.standard_normal(case["h0"].shape)
    d_cs_final = rng.standard_normal(case["cs0"].shape)
    x = tf.constant(np.swapaxes(case["x"], 0, 1))                  # Keras: [B, T, I]
    h0, c0 = tf.constant(case["h0"]), tf.constant(case["cs0"])
    mask = None if lengths is None else tf.constant(np.arange(steps)[None] < lengths[:, None])
    with tf.GradientTape() as tape:
        tape.watch([x, h0, c0])
        out, h_n, c_n = layer(x, initial_state=[h0, c0], mask=mask)
        loss = (tf.reduce_sum(out * np.swapaxes(d_h, 0, 1)) + tf.reduce_sum(h_n * d_h_final)
                + tf.reduce_sum(c_n * d_cs_final))
    g_x, g_h0, g_c0, *g_vars = (np.asarray(g) for g in tape.gradient(
        loss, [x, h0, c0, *_keras_variables(cell)]))

    seq = gc.lstm_sequence(**case, backend=backend)
    close(seq.h, np.swapaxes(np.asarray(out), 0, 1), "h", FORWARD_TOL)
    close(seq.h_final, np.asarray(h_n), "h_final", FORWARD_TOL)
    close(seq.cs_final, np.asarray(c_n), "c_final", FORWARD_TOL)
    grads = gc.lstm_sequence_grad(case["x"], case["cs0"], case["h0"], case["w"], case["b"],
                                  seq, d_h=d_h, d_h_final=d_h_final, d_cs_final=d_cs_final,
                                  layer_norm=case["layer_norm"], backend=backend)
    past = (np.arange(steps)[:, None] >= lengths[None, :]) if ragged else None
    dx = np.swapaxes(g_x, 0, 1)
    if ragged:  # gradcells never reads x past a row's length, and says its gradient is 0
        assert not grads.x[past].any()
    dw, db, d_norm = _gradcells_weight_grads(g_vars)
    for name, ours, theirs in (("x", grads.x, dx), ("h0", grads.h0, g_h0),
                               ("cs0", grads.cs0, g_c0), ("w", grads.w, dw),
                               ("b", grads.b, db),
                               *zip(NORM_NAMES, grads.layer_norm, d_norm, strict=True)):
        close(ours, theirs, f"d{name}")


def test_tf_addons_conventions_matter(keras):
    """Each conversion above is needed: TF Addons' cell carries ``LN(c̃)`` (gradcells in
    ``raw`` mode is a different model: the carried state differs at once), adds no forget
    bias (gradcells's default is 1.0), and normalises with its ``norm_epsilon`` (gradcells's
    default ``ln_epsilon`` is 1e-5, Keras' 1e-3)."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    case = _keras_case(rng)
    assert case["ln_epsilon"] == 1e-3
    cell = _keras_cell(keras, case, 3)
    assert cell.kernel_norm.epsilon == cell.state_norm.epsilon == 1e-3
    h, (_, c) = cell(tf.constant(case["x"]), [tf.constant(case["h_prev"]),
                                              tf.constant(case["cs_prev"])])
    h, c = np.asarray(h), np.asarray(c)
    right = gc.lstm_cell(**case, backend="reference")
    close(right.h, h, "h", FORWARD_TOL)
    close(right.cs, c, "cs", FORWARD_TOL)
    raw = gc.lstm_cell(**{**case, "ln_carry": "raw"}, backend="reference")
    assert np.abs(raw.cs - c).max() > 1e-2
    default_bias = gc.lstm_cell(**{**case, "forget_bias": 1.0}, backend="reference")
    assert np.abs(default_bias.h - h).max() > 1e-3
    default_eps = gc.lstm_cell(**{**case, "ln_epsilon": 1e-5}, backend="reference")
    assert np.abs(default_eps.h - h).max() > 1e-6
