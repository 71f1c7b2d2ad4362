"""The audit of PyTorch's recurrent modules (``nn.LSTMCell``, ``nn.GRUCell``, ``nn.LSTM``,
``nn.GRU``) in float64: forward against gradcells through ``gc.layouts``, autograd against
the oracle (central differences of PyTorch's own forward) and against gradcells.

Every check is ``<kind>_check(cell, sequence)``'s function of a seeded generator; ``checks()``
imports PyTorch (ImportError when it is absent) and lists the rows in order.
"""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..oracle import check_vjp
from ._cases import gru_backprop, gru_steps, lstm_backprop, lstm_steps, sizes, stack
from ._engine import FLOAT64, Check, Verdict, compare, oracle_outcome

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

        named = dict(zip(self.names, tensors))
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
        d_weight_ih, d_weight_hh, d_bias, _ = layouts.lstm_to_torch(d_w, d_b)
        inputs = [d_x if self.sequence else d_x[0], d_h0, d_c]
        return inputs + [d_weight_ih, d_weight_hh, d_bias, d_bias]

    def _gru_grads(self, xs, states, d_h):
        d_x, d_h0, d_w_ru, d_w_c, d_b_ru, d_b_c = gru_backprop(
            xs, self.inputs["h"], *self.gradcells_weights(), states, d_h, reset_after=True)
        d_weight_ih, d_weight_hh, _, _ = layouts.gru_to_torch(d_w_ru, d_w_c, d_b_ru, d_b_c)
        hidden = self.hidden
        return [d_x if self.sequence else d_x[0], d_h0, d_weight_ih, d_weight_hh,
                np.concatenate([d_b_ru, d_b_c[:hidden]]),
                np.concatenate([d_b_ru, d_b_c[hidden:]])]


def forward_verdict(rng, kind, sequence) -> Verdict:
    """PyTorch's forward against gradcells's on the converted weights."""
    case = Case(rng, kind, sequence)
    names = ("h", "c") if kind == "lstm" else ("h",)
    return Verdict(compare(zip(names, case.forward(*case.args), case.gradcells_forward()),
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
    return Verdict(compare(zip(case.names, claim, case.gradcells_grads()), FLOAT64))


def _rows(label, kind, sequence) -> list[Check]:
    via = "lstm" if kind == "lstm" else "gru"
    return [
        Check(f"{label} forward vs gradcells (layouts.{via}_from_torch)",
              lambda rng: forward_verdict(rng, kind, sequence)),
        Check(f"{label} autograd vs oracle", lambda rng: oracle_verdict(rng, kind, sequence)),
        Check(f"{label} autograd vs gradcells",
              lambda rng: gradcells_verdict(rng, kind, sequence)),
    ]


CHECKS = tuple(check for module in MODULES for check in _rows(*module))
"""Every PyTorch row, in order."""


def checks() -> tuple[str, tuple[Check, ...], list[str]]:
    """``(title, checks, footer)`` of the PyTorch audit; ImportError without PyTorch."""
    torch = _torch()
    return f"gradcells audit of PyTorch {torch.__version__} (CPU, float64)", CHECKS, []
