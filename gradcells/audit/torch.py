"""The audit of PyTorch's recurrent modules in float64, against the oracle (central
differences of PyTorch's own float64 forward, or of its gradient for second order) and
against gradcells through ``gc.layouts``:

* the first edition's rows (``BASIC``): ``nn.LSTMCell``, ``nn.GRUCell``, one-layer
  ``nn.LSTM``, ``nn.GRU``: forward, autograd;
* whole modules (``STACK_CHECKS``): 2-layer bidirectional ``nn.LSTM`` (``proj_size``),
  ``nn.GRU``, ``nn.RNN`` (tanh, relu) on ragged sequences packed by
  ``pack_padded_sequence(enforce_sorted=False)`` (lengths 1..T, 1 and T among them): the
  padded outputs and final states against ``gc.*_stack(seq_len=...)`` on
  ``layouts.stack_from_torch``'s weights, every gradient against ``*_stack_grad``;
* second order (``SECOND_ORDER_CHECKS``, ``PACKED_SECOND_ORDER_CHECKS``): the double backward
  (``grad(..., create_graph=True)``, then ``grad`` of that along a tangent: a Hessian-vector
  product) of the cells and the packed modules against ``*_grad_jvp``;
* forward mode (``FORWARD_AD_CHECKS``): ``torch.func.jvp`` and ``torch.autograd.forward_ad``
  of the cells and of ``nn.LSTM`` against ``*_jvp`` and ``check_jvp``; through a packed
  sequence PyTorch refuses (fault 50).

Every check is a module-level function of a seeded generator; ``checks()`` imports PyTorch
(ImportError when it is absent) and lists the rows in order.
"""

from __future__ import annotations

import numpy as np

from .. import layouts, stacks, steps
from ..cells.gru.spec import GRUCellGrads, GRUStackGrads
from ..cells.lstm.spec import LSTMCellGrads, LSTMStackGrads
from ..cells.rnn.spec import RNNStackGrads
from ..oracle import check_jvp, check_vjp
from ._cases import gru_backprop, gru_steps, lstm_backprop, lstm_steps, sizes, stack
from ._engine import (
    FAILED,
    FLOAT64,
    Check,
    Verdict,
    compare,
    oracle_outcome,
    worst_verdict,
)

PARAM_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
MODULES = (("nn.LSTMCell", "lstm", False), ("nn.GRUCell", "gru", False),
           ("nn.LSTM", "lstm", True), ("nn.GRU", "gru", True))


def _torch():
    import torch

    return torch


def tensor(a):
    return _torch().from_numpy(np.ascontiguousarray(a))


def torch_params(rng, gates, input_size, hidden):
    """PyTorch-layout parameters of ``gates`` blocks with both biases nonzero."""
    scale = 1 / np.sqrt(hidden)
    return {"weight_ih": scale * rng.standard_normal((gates * hidden, input_size)),
            "weight_hh": scale * rng.standard_normal((gates * hidden, hidden)),
            "bias_ih": 0.3 * rng.standard_normal(gates * hidden),
            "bias_hh": 0.3 * rng.standard_normal(gates * hidden)}


def _module(kind, sequence, input_size, hidden):
    nn = _torch().nn
    module_type = {(True, False): nn.LSTMCell, (True, True): nn.LSTM,
                   (False, False): nn.GRUCell, (False, True): nn.GRU}
    return module_type[kind == "lstm", sequence](input_size, hidden,
                                                  dtype=_torch().float64)


class Case:
    """One generated case for one module: its inputs, parameters and cotangents."""

    def __init__(self, rng, kind, sequence):
        drawn = sizes(rng)
        batch, n_in, hidden = drawn["batch"], drawn["input_size"], drawn["hidden"]
        self.kind, self.sequence, self.hidden = kind, sequence, hidden
        self.module = _module(kind, sequence, n_in, hidden)
        self.suffix = "_l0" if sequence else ""
        steps = int(rng.integers(1, 5))
        x_shape = (steps, batch, n_in) if sequence else (batch, n_in)
        self.inputs = {"x": rng.standard_normal(x_shape),
                       "h": 0.5 * rng.standard_normal((batch, hidden))}
        if kind == "lstm":
            self.inputs["c"] = rng.standard_normal((batch, hidden))
        self.params = torch_params(rng, 4 if kind == "lstm" else 3, n_in, hidden)
        self.seed = int(rng.integers(2**31))
        self.names = tuple(self.inputs) + PARAM_NAMES
        self.args = [self.inputs[k] for k in self.inputs] + [self.params[k]
                                                             for k in PARAM_NAMES]
        self.cotangent = tuple(rng.standard_normal(o.shape) for o in self.forward(*self.args))

    def torch_outputs(self, tensors):
        """PyTorch's outputs for tensors aligned with ``names``: (h, c) or h for a cell;
        (every step's h, final c) or every step's h for a sequence."""
        from torch.func import functional_call

        named = dict(zip(self.names, tensors, strict=True))
        params = {k + self.suffix: named[k] for k in PARAM_NAMES}
        x, h, lstm = named["x"], named["h"], self.kind == "lstm"
        if self.sequence:
            h = h[None]
            state = (h, named["c"][None]) if lstm else h
            out, final = functional_call(self.module, params, (x, state))
            return (out, final[1][0]) if lstm else (out,)
        state = (h, named["c"]) if lstm else h
        out = functional_call(self.module, params, (x, state))
        return tuple(out) if lstm else (out,)

    def forward(self, *arrays):
        with _torch().no_grad():
            return tuple(o.numpy() for o in self.torch_outputs([tensor(a) for a in arrays]))

    def vjp(self, ct, *arrays):
        tensors = [tensor(a).requires_grad_() for a in arrays]
        outputs = self.torch_outputs(tensors)
        grads = _torch().autograd.grad(outputs, tensors, [tensor(c) for c in ct],
                                       allow_unused=True)
        return [None if g is None else g.numpy() for g in grads]

    # gradcells's view of the same computation
    def gradcells_weights(self):
        convert = layouts.lstm_from_torch if self.kind == "lstm" else layouts.gru_from_torch
        return convert(*(self.params[k] for k in PARAM_NAMES))

    def steps(self):
        """gradcells's states over the case's input (one step for a cell)."""
        x, h = self.inputs["x"], self.inputs["h"]
        xs = x if self.sequence else x[None]
        if self.kind == "lstm":
            return xs, lstm_steps(xs, self.inputs["c"], h, *self.gradcells_weights())
        return xs, gru_steps(xs, h, *self.gradcells_weights(), reset_after=True)

    def gradcells_forward(self):
        _, states = self.steps()
        if self.kind == "lstm":
            outs = (stack(states, "h"), states[-1].cs)
            return outs if self.sequence else (outs[0][0], outs[1])
        return (stack(states, "h") if self.sequence else states[0].h,)

    def gradcells_grads(self):
        """gradcells's gradients in PyTorch's parameter layout, aligned with ``names``."""
        xs, states = self.steps()
        d_h = self.cotangent[0] if self.sequence else self.cotangent[0][None]
        return (self._lstm_grads if self.kind == "lstm" else self._gru_grads)(xs, states, d_h)

    def _lstm_grads(self, xs, states, d_h):
        d_cs = np.zeros_like(d_h)
        d_cs[-1] = self.cotangent[1]
        d_x, d_c, d_h0, d_w, d_b = lstm_backprop(xs, self.inputs["c"], self.inputs["h"],
                                                 *self.gradcells_weights(), states, d_cs, d_h)
        named = torch_layout("lstm", (d_w, d_b))
        return [d_x if self.sequence else d_x[0], d_h0, d_c] + [named[k] for k in PARAM_NAMES]

    def _gru_grads(self, xs, states, d_h):
        d_x, d_h0, *d_weights = gru_backprop(
            xs, self.inputs["h"], *self.gradcells_weights(), states, d_h, reset_after=True)
        named = torch_layout("gru", d_weights)
        return [d_x if self.sequence else d_x[0], d_h0] + [named[k] for k in PARAM_NAMES]


def torch_layout(cell, d_weights) -> dict:
    """One (layer, direction)'s gradients (a gradcells weight set of ``cell``) as the
    gradients of PyTorch's parameters, by name without the layer suffix: both biases get
    the gradient of their sum (a GRU's candidate biases are kept apart, ``b_c = [b_in,
    b_hn]``)."""
    if cell == "lstm":
        w, b, *rest = d_weights
        arrays = layouts.lstm_to_torch(w, b, rest[3] if len(rest) > 3 else None)
        named = dict(zip(("weight_ih", "weight_hh", "bias_ih"), arrays[:3], strict=True))
        named.update(bias_hh=arrays[2], **({"weight_hr": arrays[4]} if len(arrays) > 4 else {}))
        return named
    if cell == "gru":
        w_ru, w_c, b_ru, b_c = d_weights[:4]
        arrays, hidden = layouts.gru_to_torch(w_ru, w_c, b_ru, b_c), w_c.shape[1]
        return {"weight_ih": arrays[0], "weight_hh": arrays[1],
                "bias_ih": np.concatenate([b_ru, b_c[:hidden]]),
                "bias_hh": np.concatenate([b_ru, b_c[hidden:]])}
    arrays = layouts.rnn_to_torch(*d_weights[:2])
    return {"weight_ih": arrays[0], "weight_hh": arrays[1], "bias_ih": arrays[2],
            "bias_hh": arrays[2]}


def forward_verdict(rng, kind, sequence) -> Verdict:
    """PyTorch's forward against gradcells's on the converted weights."""
    case = Case(rng, kind, sequence)
    names = ("h", "c") if kind == "lstm" else ("h",)
    return Verdict(compare(zip(names, case.forward(*case.args), case.gradcells_forward(),
                               strict=True),
                           FLOAT64))


def oracle_verdict(rng, kind, sequence) -> Verdict:
    """PyTorch's autograd against the oracle's differences of PyTorch's forward."""
    case = Case(rng, kind, sequence)
    report = check_vjp(case.forward, case.vjp, case.args, names=case.names,
                       cotangent=case.cotangent, seed=case.seed)
    return Verdict(oracle_outcome(report))


def gradcells_verdict(rng, kind, sequence) -> Verdict:
    """PyTorch's autograd against gradcells's gradient, in PyTorch's layout."""
    case = Case(rng, kind, sequence)
    claim = case.vjp(case.cotangent, *case.args)
    return Verdict(compare(zip(case.names, claim, case.gradcells_grads(), strict=True), FLOAT64))


def _rows(label, kind, sequence) -> list[Check]:
    via = "lstm" if kind == "lstm" else "gru"
    return [
        Check(f"{label} forward vs gradcells (layouts.{via}_from_torch)",
              lambda rng: forward_verdict(rng, kind, sequence)),
        Check(f"{label} autograd vs oracle", lambda rng: oracle_verdict(rng, kind, sequence)),
        Check(f"{label} autograd vs gradcells",
              lambda rng: gradcells_verdict(rng, kind, sequence)),
    ]


BASIC = tuple(check for module in MODULES for check in _rows(*module))
"""The first edition's rows: one layer, one direction, every step valid."""


# ---------------------------------------------------------------------------------------------
# Whole modules (2 layers, bidirectional, an LSTM's projection) on packed ragged sequences

STACKS = (("nn.LSTM", "lstm", None), ("nn.GRU", "gru", None), ("nn.RNN", "rnn", "tanh"),
          ("nn.RNN", "rnn", "relu"))


def stack_op(cell, suffix=""):
    """gradcells's ``<cell>_stack<suffix>`` (``""``, ``"_grad"``, ``"_jvp"``, ``"_grad_jvp"``)."""
    return getattr(stacks, f"{cell}_stack{suffix}")


def ragged_lengths(rng, batch, steps):
    """Lengths in 1..T, one of them T and (with two rows or more) another 1."""
    lengths = rng.integers(1, steps + 1, batch)
    rows = rng.permutation(batch)
    lengths[rows[0]] = steps
    if batch > 1:
        lengths[rows[1]] = 1
    return lengths


def _stack_module(cell, nonlinearity, n_in, hidden, proj, **drawn):
    nn, options = _torch().nn, {"num_layers": 2, "bidirectional": True,
                                "dtype": _torch().float64, **drawn}
    if cell == "lstm":
        return nn.LSTM(n_in, hidden, proj_size=proj, **options)
    if cell == "gru":
        return nn.GRU(n_in, hidden, **options)
    return nn.RNN(n_in, hidden, nonlinearity=nonlinearity, **options)


class StackCase:
    """One generated case of a 2-layer bidirectional module (``batch_first`` and ``bias``
    drawn): inputs ``x [T, B, I]`` (``[B, T, I]`` batch first) with ``lengths``, packed by
    ``pack_padded_sequence(enforce_sorted=False)`` unless ``packed=False`` (then every row is
    T long and nothing is packed), the initial states, the parameters (named as PyTorch
    names them), cotangents of ``(out, h_n[, c_n])`` and a tangent of every argument."""

    def __init__(self, rng, cell, nonlinearity=None, *, packed=True):
        drawn, steps = sizes(rng), int(rng.integers(1, 5))
        batch, n_in, hidden = drawn["batch"], drawn["input_size"], drawn["hidden"]
        hidden = max(hidden, 2) if cell == "lstm" else hidden    # proj_size < hidden_size
        proj = int(rng.integers(1, hidden)) if cell == "lstm" else 0
        self.cell, self.nonlinearity, self.packed = cell, nonlinearity, packed
        self.batch_first, bias = bool(rng.integers(2)), bool(rng.integers(4))  # 1/4 no bias
        self.module = _stack_module(cell, nonlinearity, n_in, hidden, proj, bias=bias,
                                    batch_first=self.batch_first)
        self.lengths = (ragged_lengths(rng, batch, steps) if packed
                        else np.full(batch, steps))
        x_shape = (batch, steps, n_in) if self.batch_first else (steps, batch, n_in)
        self.inputs = {"x": rng.standard_normal(x_shape),
                       "h0": 0.5 * rng.standard_normal((4, batch, proj or hidden))}
        if cell == "lstm":
            self.inputs["c0"] = rng.standard_normal((4, batch, hidden))
        self.params = {name: (0.3 if name.startswith("bias") else 1 / np.sqrt(hidden))
                       * rng.standard_normal(tuple(p.shape))
                       for name, p in self.module.named_parameters()}
        self.names = tuple(self.inputs) + tuple(self.params)
        self.args = list(self.inputs.values()) + list(self.params.values())
        self.seed = int(rng.integers(2**31))
        self.cotangent = tuple(rng.standard_normal(o.shape) for o in self.forward(*self.args))
        self.tangent = [rng.standard_normal(a.shape) for a in self.args]

    def torch_outputs(self, tensors):
        """PyTorch's ``(out [T, B, D·P] zero-padded, h_n[, c_n])``."""
        from torch.func import functional_call
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        named = dict(zip(self.names, tensors, strict=True))
        x, params = named["x"], {k: named[k] for k in self.params}
        state = (named["h0"], named["c0"]) if self.cell == "lstm" else named["h0"]
        if self.packed:
            x = pack_padded_sequence(x, _torch().from_numpy(self.lengths),
                                     batch_first=self.batch_first, enforce_sorted=False)
        out, final = functional_call(self.module, params, (x, state))
        if self.packed:
            out = pad_packed_sequence(out, batch_first=self.batch_first,
                                      total_length=self.lengths.max())[0]
        return (out, *final) if self.cell == "lstm" else (out, final)

    forward = Case.forward
    vjp = Case.vjp

    @property
    def seq_len(self):
        """gradcells's ``seq_len`` for the case (None unpacked)."""
        return self.lengths if self.packed else None

    def converted(self, named=None):
        """``layouts.stack_from_torch`` of the parameters, or of the arrays ``named`` by
        their names (the parameters' tangents: the conversion is linear)."""
        named = self.params if named is None else named
        return layouts.stack_from_torch({k: named[k] for k in self.params},
                                        nonlinearity=self.nonlinearity)

    def gradcells_run(self):
        """``(conv, states, stack)``: gradcells's stack on the converted weights."""
        conv = self.converted()
        states = conv.gradcells_states(*(self.inputs[k] for k in self.inputs if k != "x"))
        stack = stack_op(self.cell)(self.inputs["x"], *states, conv, seq_len=self.seq_len,
                                    batch_first=self.batch_first, **conv.options)
        return conv, states, stack

    def gradcells_forward(self):
        _, _, stack = self.gradcells_run()
        return (stack.h, stack.h_final) + ((stack.cs_final,) if self.cell == "lstm" else ())

    def gradcells_grads(self):
        """gradcells's gradients (``*_stack_grad``) in PyTorch's layout, aligned with
        ``names``."""
        conv, states, stack = self.gradcells_run()
        # strict=False: a GRU's or plain RNN's stack has no c_n, nor its cotangent
        upstream = dict(zip(("d_h", "d_h_final", "d_cs_final"), self.cotangent, strict=False))
        grads = stack_op(self.cell, "_grad")(self.inputs["x"], *states, conv, stack, **upstream)
        return [grads.x, grads.h0] + ([grads.cs0] if self.cell == "lstm" else []) + \
            self.torch_weights(grads.weights)

    def torch_weights(self, weight_sets):
        """Per-(layer, direction) gradcells weight sets as PyTorch's parameters, in
        ``params``'s order."""
        named = {}
        for k, w in enumerate(weight_sets):
            suffix = f"_l{k // 2}" + ("_reverse" if k % 2 else "")
            named.update({n + suffix: a for n, a in torch_layout(self.cell, w).items()})
        return [named[k] for k in self.params]


def stack_forward_verdict(rng, cell, nonlinearity=None) -> Verdict:
    """The packed module's outputs and final states against gradcells's ``*_stack``
    (``seq_len``) on ``layouts.stack_from_torch``'s weights."""
    case = StackCase(rng, cell, nonlinearity)
    names = ("out", "h_n", "c_n") if cell == "lstm" else ("out", "h_n")
    return Verdict(compare(zip(names, case.forward(*case.args), case.gradcells_forward(),
                               strict=True),
                           FLOAT64))


def stack_oracle_verdict(rng, cell, nonlinearity=None) -> Verdict:
    """The packed module's autograd against the oracle's differences of PyTorch's forward
    (every element of every argument, the padding's included: its gradient is zero)."""
    case = StackCase(rng, cell, nonlinearity)
    report = check_vjp(case.forward, case.vjp, case.args, names=case.names,
                       cotangent=case.cotangent, seed=case.seed)
    return Verdict(oracle_outcome(report))


def stack_gradcells_verdict(rng, cell, nonlinearity=None) -> Verdict:
    """The packed module's autograd against gradcells's ``*_stack_grad``, every element."""
    case = StackCase(rng, cell, nonlinearity)
    claim = case.vjp(case.cotangent, *case.args)
    return Verdict(compare(zip(case.names, claim, case.gradcells_grads(), strict=True), FLOAT64))


def stack_label(label, cell, nonlinearity, packed=True):
    """A module's rows' name: the module, packed or not, and its options."""
    what = {"lstm": "proj_size, ", "gru": "", "rnn": f"{nonlinearity}, "}[cell]
    return f"{label}{' packed' if packed else ''} ({what}bidirectional, 2 layers)"


def _stack_rows(label, cell, nonlinearity) -> list[Check]:
    name = stack_label(label, cell, nonlinearity)
    return [
        Check(f"{name} forward vs gradcells (layouts.stack_from_torch)",
              lambda rng: stack_forward_verdict(rng, cell, nonlinearity)),
        Check(f"{name} autograd vs oracle",
              lambda rng: stack_oracle_verdict(rng, cell, nonlinearity)),
        Check(f"{name} autograd vs gradcells ({cell}_stack_grad)",
              lambda rng: stack_gradcells_verdict(rng, cell, nonlinearity)),
    ]


STACK_CHECKS = tuple(check for module in STACKS for check in _stack_rows(*module))



# ---------------------------------------------------------------------------------------------
# Second order (double backward) and forward mode

def _tensors(arrays, grad=False):
    return [tensor(a).requires_grad_(grad) for a in arrays]


def torch_double_backward(case, tangent, *arrays):
    """PyTorch's double backward: ``g = grad(<ct, f>, args, create_graph=True)`` with the
    cotangent ``ct`` a tensor that requires grad too, then ``grad(g, (args, ct), tangent)``.
    Returns ``(hvp, jvp)``: the Hessian of ``<ct, f>`` times ``tangent`` (aligned with
    ``names``) and, by the cotangent, the forward tangent ``J·tangent`` of each output."""
    torch = _torch()
    tensors = _tensors(arrays, grad=True)
    cotangent = _tensors(case.cotangent, grad=True)
    first = torch.autograd.grad(case.torch_outputs(tensors), tensors, cotangent,
                                create_graph=True)
    second = torch.autograd.grad(first, tensors + cotangent, _tensors(tangent),
                                 allow_unused=True)
    arrays = list(arrays) + list(case.cotangent)
    out = [np.zeros_like(a) if g is None else g.detach().numpy()
           for g, a in zip(second, arrays, strict=True)]
    return tuple(out[:len(tensors)]), tuple(out[len(tensors):])


def torch_hvp(case, tangent, *arrays):
    """The Hessian-vector product of ``torch_double_backward``."""
    return torch_double_backward(case, tangent, *arrays)[0]


def torch_gradient(case, *arrays):
    """PyTorch's gradient of ``<ct, f>`` as a function of the arguments."""
    return tuple(case.vjp(case.cotangent, *arrays))


def torch_tangent(case, tangent, *arrays):
    """PyTorch's forward mode: ``torch.func.jvp`` of the case's outputs."""
    from torch.func import jvp

    _, out = jvp(lambda *t: case.torch_outputs(t), tuple(_tensors(arrays)),
                 tuple(_tensors(tangent)))
    return tuple(o.numpy() for o in out)


def torch_dual_tangent(case, tangent, *arrays):
    """PyTorch's forward mode by dual tensors (``torch.autograd.forward_ad``)."""
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        duals = [fwad.make_dual(a, t)
                 for a, t in zip(_tensors(arrays), _tensors(tangent), strict=True)]
        return tuple(fwad.unpack_dual(o).tangent.numpy() for o in case.torch_outputs(duals))


def cell_tangents(case):
    """The case's tangent (aligned with ``names``) as gradcells's cell gradient type."""
    named = dict(zip(case.names, case.tangent, strict=True))
    if case.kind == "lstm":
        w, b = layouts.lstm_from_torch(*(named[k] for k in PARAM_NAMES))
        return LSTMCellGrads(named["x"], named["c"], named["h"], w, b)
    return GRUCellGrads(named["x"], named["h"], *layouts.gru_from_torch(
        *(named[k] for k in PARAM_NAMES)))


def gradcells_hvp(case):
    """gradcells's ``*_cell_grad_jvp`` along the case's tangent (the cotangent fixed), in
    PyTorch's layout, aligned with ``names``."""
    x, h, weights = case.inputs["x"], case.inputs["h"], case.gradcells_weights()
    if case.kind == "lstm":
        c = case.inputs["c"]
        state = steps.lstm_cell(x, c, h, *weights, forget_bias=0.0)
        _, t = steps.lstm_cell_grad_jvp(x, c, h, *weights, state, cell_tangents(case),
                                        d_h=case.cotangent[0], d_cs=case.cotangent[1])
        named = torch_layout("lstm", (t.w, t.b))
        return [t.x, t.h_prev, t.cs_prev] + [named[k] for k in PARAM_NAMES]
    state = steps.gru_cell(x, h, *weights, reset_after=True)
    _, t = steps.gru_cell_grad_jvp(x, h, *weights, state, cell_tangents(case),
                                   d_h=case.cotangent[0])
    named = torch_layout("gru", t[2:])
    return [t.x, t.h_prev] + [named[k] for k in PARAM_NAMES]


def gradcells_cell_tangent(case):
    """gradcells's ``*_cell_jvp`` along the case's tangent: ``(dh, dc)`` or ``(dh,)``."""
    x, h, weights = case.inputs["x"], case.inputs["h"], case.gradcells_weights()
    if case.kind == "lstm":
        _, t = steps.lstm_cell_jvp(x, case.inputs["c"], h, *weights, cell_tangents(case),
                                   forget_bias=0.0)
        return t.h, t.cs
    _, t = steps.gru_cell_jvp(x, h, *weights, cell_tangents(case), reset_after=True)
    return (t.h,)


def cell_case(rng, kind) -> Case:
    """A cell ``Case`` with a tangent of every argument."""
    case = Case(rng, kind, False)
    case.tangent = [rng.standard_normal(np.shape(a)) for a in case.args]
    return case


def hvp_oracle_verdict(rng, kind) -> Verdict:
    """The cell's double backward against the oracle: central differences of PyTorch's
    gradient along the tangent (the Hessian is symmetric)."""
    case = cell_case(rng, kind)
    report = check_jvp(lambda *a: torch_gradient(case, *a),
                       lambda t, *a: torch_hvp(case, t, *a), case.args,
                       tangents=case.tangent, names=case.names, seed=case.seed)
    return Verdict(oracle_outcome(report))


def hvp_gradcells_verdict(rng, kind) -> Verdict:
    """The cell's double backward against gradcells: by the arguments, the HVP of
    ``*_cell_grad_jvp``; by the cotangent, the forward tangent of ``*_cell_jvp``."""
    case = cell_case(rng, kind)
    hvp, jvp = torch_double_backward(case, case.tangent, *case.args)
    outputs = [f"d {n} (by the cotangent)" for n in ("h", "c")[:len(jvp)]]
    return Verdict(compare(zip(list(case.names) + outputs, hvp + jvp,
                               gradcells_hvp(case) + list(gradcells_cell_tangent(case)),
                               strict=True), FLOAT64))


def jvp_oracle_verdict(rng, kind) -> Verdict:
    """The cell's forward mode (``torch.func.jvp``) against the oracle's ``check_jvp``
    (central differences of PyTorch's forward along the tangent)."""
    case = cell_case(rng, kind)
    report = check_jvp(case.forward, lambda t, *a: torch_tangent(case, t, *a), case.args,
                       tangents=case.tangent, seed=case.seed)
    return Verdict(oracle_outcome(report))


def jvp_gradcells_verdict(rng, kind) -> Verdict:
    """The cell's forward mode, ``torch.func.jvp`` and ``torch.autograd.forward_ad``'s dual
    tensors both, against gradcells's ``*_cell_jvp``."""
    case = cell_case(rng, kind)
    truth = gradcells_cell_tangent(case)
    names = ("h", "c") if kind == "lstm" else ("h",)
    return worst_verdict([Verdict(compare(zip([f"{n} ({how})" for n in names],
                                              claim(case, case.tangent,
                                                    *case.args), truth, strict=True),
                                          FLOAT64))
                          for how, claim in (("func.jvp", torch_tangent),
                                             ("forward_ad", torch_dual_tangent))])


STACK_GRADS = {"lstm": LSTMStackGrads, "gru": GRUStackGrads, "rnn": RNNStackGrads}


def stack_tangents(case, conv):
    """The case's tangent (aligned with ``names``) as gradcells's stack gradient type."""
    named = dict(zip(case.names, case.tangent, strict=True))
    d_states = conv.gradcells_states(*(named[k] for k in case.inputs if k != "x"))
    return STACK_GRADS[case.cell](named["x"], *d_states, case.converted(named))


def gradcells_stack_tangent(case):
    """gradcells's ``*_stack_jvp`` along the case's tangent: ``(out, h_n[, c_n])``."""
    conv, states, _ = case.gradcells_run()
    _, t = stack_op(case.cell, "_jvp")(case.inputs["x"], *states, conv,
                                       stack_tangents(case, conv), seq_len=case.seq_len,
                                       batch_first=case.batch_first, **conv.options)
    return (t.h, t.h_final) + ((t.cs_final,) if case.cell == "lstm" else ())


def gradcells_stack_hvp(case):
    """gradcells's ``*_stack_grad_jvp`` along the case's tangent (the cotangent fixed), in
    PyTorch's layout, aligned with ``names``."""
    conv, states, stack = case.gradcells_run()
    # strict=False: a GRU's or plain RNN's stack has no c_n, nor its cotangent
    upstream = dict(zip(("d_h", "d_h_final", "d_cs_final"), case.cotangent, strict=False))
    _, t = stack_op(case.cell, "_grad_jvp")(case.inputs["x"], *states, conv, stack,
                                            stack_tangents(case, conv), **upstream)
    return [t.x, t.h0] + ([t.cs0] if case.cell == "lstm" else []) + \
        case.torch_weights(t.weights)


def stack_hvp_oracle_verdict(rng, cell, nonlinearity=None) -> Verdict:
    """The packed module's double backward against the oracle: central differences of
    PyTorch's gradient along the tangent."""
    case = StackCase(rng, cell, nonlinearity)
    report = check_jvp(lambda *a: torch_gradient(case, *a),
                       lambda t, *a: torch_hvp(case, t, *a), case.args,
                       tangents=case.tangent, names=case.names, seed=case.seed)
    return Verdict(oracle_outcome(report))


def stack_hvp_gradcells_verdict(rng, cell, nonlinearity=None) -> Verdict:
    """The packed module's double backward against gradcells's ``*_stack_grad_jvp``."""
    case = StackCase(rng, cell, nonlinearity)
    claim = torch_hvp(case, case.tangent, *case.args)
    return Verdict(compare(zip(case.names, claim, gradcells_stack_hvp(case), strict=True), FLOAT64))


def stack_jvp_oracle_verdict(rng, cell, nonlinearity=None) -> Verdict:
    """The module's forward mode (unpacked) against the oracle's ``check_jvp``."""
    case = StackCase(rng, cell, nonlinearity, packed=False)
    report = check_jvp(case.forward, lambda t, *a: torch_tangent(case, t, *a), case.args,
                       tangents=case.tangent, seed=case.seed)
    return Verdict(oracle_outcome(report))


def stack_jvp_gradcells_verdict(rng, cell, nonlinearity=None) -> Verdict:
    """The module's forward mode (unpacked) against gradcells's ``*_stack_jvp``."""
    case = StackCase(rng, cell, nonlinearity, packed=False)
    claim = torch_tangent(case, case.tangent, *case.args)
    # strict=False: a GRU's or plain RNN's stack has no c_n
    return Verdict(compare(zip(("out", "h_n", "c_n"), claim, gradcells_stack_tangent(case),
                               strict=False), FLOAT64))


PACKED_FORWARD_AD = "forward AD with _pack_padded_sequence"


def packed_jvp_verdict(rng) -> Verdict:
    """``torch.func.jvp`` through ``pack_padded_sequence``: refused (fault 50; the fault's
    model holds when the tangent PyTorch refuses exists: gradcells's ``lstm_stack_jvp`` with
    ``seq_len`` passes the oracle's ``check_jvp`` of PyTorch's packed forward) or, once
    PyTorch implements it, against gradcells's ``lstm_stack_jvp``."""
    case = StackCase(rng, "lstm")
    try:
        claim = torch_tangent(case, case.tangent, *case.args)
    except NotImplementedError as error:
        if PACKED_FORWARD_AD not in str(error):
            raise
        tangent = gradcells_stack_tangent(case)
        report = check_jvp(case.forward, lambda t, *a: tangent, case.args,
                           tangents=case.tangent, seed=case.seed)
        return Verdict(FAILED, oracle_outcome(report),
                       raised=str(error).splitlines()[0][:120])
    return Verdict(compare(zip(("out", "h_n", "c_n"), claim, gradcells_stack_tangent(case),
                               strict=True), FLOAT64))


SECOND_ORDER_CHECKS = tuple(
    row for label, kind in (("nn.LSTMCell", "lstm"), ("nn.GRUCell", "gru")) for row in (
        Check(f"{label} double backward (HVP) vs oracle",
              lambda rng, kind=kind: hvp_oracle_verdict(rng, kind)),
        Check(f"{label} double backward (HVP) vs gradcells ({kind}_cell_grad_jvp, "
              f"{kind}_cell_jvp)",
              lambda rng, kind=kind: hvp_gradcells_verdict(rng, kind))))
PACKED_SECOND_ORDER_CHECKS = tuple(
    row for label, cell, nonlinearity in STACKS[:3] for row in (
        Check(f"{stack_label(label, cell, nonlinearity)} double backward (HVP) vs oracle",
              lambda rng, c=cell, n=nonlinearity: stack_hvp_oracle_verdict(rng, c, n)),
        Check(f"{stack_label(label, cell, nonlinearity)} double backward (HVP) vs gradcells "
              f"({cell}_stack_grad_jvp)",
              lambda rng, c=cell, n=nonlinearity: stack_hvp_gradcells_verdict(rng, c, n))))
FORWARD_AD_CHECKS = tuple(
    row for label, kind in (("nn.LSTMCell", "lstm"), ("nn.GRUCell", "gru")) for row in (
        Check(f"{label} forward AD (torch.func.jvp) vs oracle",
              lambda rng, kind=kind: jvp_oracle_verdict(rng, kind)),
        Check(f"{label} forward AD (torch.func.jvp) and forward_ad vs gradcells "
              f"({kind}_cell_jvp)",
              lambda rng, kind=kind: jvp_gradcells_verdict(rng, kind)))) + (
) + tuple(
    row for label, cell, nonlinearity in STACKS[:3] for row in (
        Check(f"{stack_label(label, cell, nonlinearity, packed=False)} forward AD vs oracle",
              lambda rng, c=cell, n=nonlinearity: stack_jvp_oracle_verdict(rng, c, n)),
        Check(f"{stack_label(label, cell, nonlinearity, packed=False)} forward AD vs "
              f"gradcells ({cell}_stack_jvp)",
              lambda rng, c=cell, n=nonlinearity: stack_jvp_gradcells_verdict(rng, c, n)))) + (
    Check("nn.LSTM packed forward AD (torch.func.jvp)", packed_jvp_verdict, fault=50),
)


SECTION = "PyTorch"
"""The framework's name, as the audit's title (and its docs/audit.md section) begins."""

CHECKS = (BASIC + STACK_CHECKS + SECOND_ORDER_CHECKS + PACKED_SECOND_ORDER_CHECKS
          + FORWARD_AD_CHECKS)
"""Every PyTorch row, in order."""


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the PyTorch audit; ImportError without PyTorch."""
    torch = _torch()
    return f"gradcells audit of {SECTION} {torch.__version__} (CPU, float64)", CHECKS, []
