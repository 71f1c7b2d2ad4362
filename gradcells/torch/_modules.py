"""``gradcells.torch.LSTM``, ``GRU`` and ``RNN``: drop-in ``torch.nn`` recurrent modules that
run gradcells's fused stacks (docs/spec.md §13).

Each module takes its ``torch.nn`` namesake's constructor and forward, holds parameters of
the same names, shapes and initialisation (``load_state_dict(nn_module.state_dict())`` works
both ways), and computes the same outputs and gradients. gradcells's options are keyword-only
constructor arguments; those with weights of their own add parameters beside nn's.

**The forward** converts nn's layout to gradcells's with differentiable torch ops, so autograd
carries every gradient back to the parameters:

    LSTM   w = [W_ihᵀ; W_hhᵀ]  [I+P, 4H]   gate blocks from PyTorch's order to gradcells's
           b = b_ih + b_hh     [4H]        (both orders: ``gradcells.layouts``'s constants)
           w_proj = W_hrᵀ      [H, P]
    GRU    w_ru, w_c from [W_ihᵀ; W_hhᵀ]; b_ru = (b_ih + b_hh)[r, u];
           b_c = [b_ih[c], b_hh[c]] (reset after, PyTorch's) or b_ih[c] + b_hh[c] (before)
    RNN    w = [W_ihᵀ; W_hhᵀ], b = b_ih + b_hh

then calls ``gradcells.torch.<cell>_stack`` (``forget_bias=0``, PyTorch's convention). In
training mode ``dropout`` draws the stack's ``dropout_masks`` with torch's RNG (Bernoulli
``1 - p``, scaled by ``1/(1 - p)``, a fresh mask per step and element as ``nn.LSTM`` has
them); in eval mode there are none. A module with ``zoneout`` (each of the three has it)
runs its layers one ``gradcells.torch.<cell>_sequence`` call per direction, since the stack
takes no zoneout masks: in training mode Bernoulli(``zoneout``) masks per step and unit drawn
with torch's RNG, in eval mode the expectation ``zoneout·old + (1 - zoneout)·new``.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..cells import OPS, STACKS
from ..cells.gru.spec import GRUWeights
from ..cells.lstm.spec import LN_CARRIES, NORM_FIELDS, PEEPHOLES, LSTMNorm, LSTMWeights
from ..cells.rnn.spec import ACTIVATIONS, RNNWeights
from ..layouts._common import LSTM_GRADCELLS
from ..layouts.torch import GRU_TORCH, LSTM_TORCH
from ._functions import FUNCTIONS

__all__ = ["LSTM", "GRU", "RNN"]

_NN_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
_PEEPHOLE_NAMES = {name: f"weight_{name[1:]}" for name in PEEPHOLES}   # wci -> weight_ci
_NORM_NAMES = {name: f"ln_{name}" for name in NORM_FIELDS}              # gamma_x -> ln_gamma_x


def _reorder(a, source, target, dim):
    """``a`` with its gate blocks along ``dim`` moved from order ``source`` to ``target``
    (strings of gate letters), by differentiable torch ops."""
    blocks = dict(zip(source, a.chunk(len(source), dim=dim), strict=True))
    return torch.cat([blocks[g] for g in target], dim=dim)


def _gate_wide(field):
    """Whether a layer norm's field is 4H wide (the gate parts' norms) or H (the cell's)."""
    return not field.endswith("_c")


def _is_number(value):
    """A real number, not a bool (NumPy's scalars included)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _probability(name, value, top_open=False):
    """``value`` as a float in [0, 1] ([0, 1) with ``top_open``), else ValueError."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a number in [0, 1], got {type(value).__name__}")
    if not (0 <= value < 1 if top_open else 0 <= value <= 1):
        raise ValueError(f"{name} must be in [0, {'1)' if top_open else '1]'}, got {value!r}")
    return float(value)


def _clip(name, value):
    if value is not None and not _is_number(value):
        raise TypeError(f"{name} must be None or a number, got {type(value).__name__}")
    return None if value is None else float(value)


class _RecurrentBase(nn.Module):
    """What the three modules share: nn's constructor arguments, its parameters, the
    PackedSequence and state handling, dropout; a subclass adds the cell's weight sets."""

    _cell = ""           # "lstm", "gru", "rnn": the stack function's prefix
    _gates = 1           # gate blocks in weight_ih
    _state_names = ("h0",)

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None, zoneout=0.0):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                            ("num_layers", num_layers), ("proj_size", proj_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if input_size < 1 or hidden_size < 1 or num_layers < 1:
            raise ValueError("input_size, hidden_size and num_layers must be positive, got "
                             f"{input_size}, {hidden_size}, {num_layers}")
        if proj_size < 0 or (proj_size and proj_size >= hidden_size):
            raise ValueError(f"proj_size must be 0 or in [1, hidden_size = {hidden_size}), "
                             f"got {proj_size}")
        self.mode = mode
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first = bool(bias), bool(batch_first)
        self.bidirectional, self.proj_size = bool(bidirectional), proj_size
        self.dropout = _probability("dropout", dropout)
        self.zoneout = _probability("zoneout", zoneout, top_open=True)
        if self.dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          f"non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=3)
        factory = {"device": device, "dtype": dtype}
        self._nn_names = []
        for suffix, width_in in self._layer_suffixes():
            for name, shape in self._nn_shapes(width_in):
                self._register(f"{name}{suffix}", shape, factory)
                self._nn_names.append(f"{name}{suffix}")

    def __prepare_scriptable__(self):
        """``torch.jit.script`` calls this first: TorchScript cannot compile a forward that
        calls gradcells's kernels (Python, NumPy, Numba), so it is refused here, by name."""
        raise RuntimeError(
            f"torch.jit.script does not support gradcells.torch.{type(self).__name__}: its "
            "forward runs gradcells's kernels, which TorchScript cannot compile. Use "
            "torch.compile(module) instead (the gradcells ops are torch.library custom ops), "
            "or call the module eagerly")

    @property
    def _directions(self):
        return 2 if self.bidirectional else 1

    @property
    def _width(self):
        """The recurrent state's width: P (a projection) or H."""
        return self.proj_size or self.hidden_size

    def _layer_suffixes(self):
        """``(suffix, input width)`` per (layer, direction), PyTorch's order."""
        return [(f"_l{layer}{'_reverse' if d else ''}",
                 self.input_size if layer == 0 else self._directions * self._width)
                for layer in range(self.num_layers) for d in range(self._directions)]

    def _nn_shapes(self, width_in):
        gates = self._gates * self.hidden_size
        shapes = [("weight_ih", (gates, width_in)), ("weight_hh", (gates, self._width))]
        if self.bias:
            shapes += [("bias_ih", (gates,)), ("bias_hh", (gates,))]
        if self.proj_size:
            shapes.append(("weight_hr", (self.proj_size, self.hidden_size)))
        return shapes

    def _register(self, name, shape, factory):
        self.register_parameter(name, nn.Parameter(torch.empty(shape, **factory)))

    def reset_parameters(self):
        """nn's initialisation: every nn parameter uniform in ``±1/√H``, drawn in nn's order
        (so a seed gives nn's weights); then the options' parameters (``_reset_options``)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for name in self._nn_names:
                getattr(self, name).uniform_(-bound, bound)
        self._reset_options(bound)

    def _reset_options(self, bound):
        """The options' parameters' initialisation (none here)."""

    def flatten_parameters(self):
        """nn's cuDNN weight flattening; gradcells has nothing to flatten (a no-op)."""

    def _parameters_of(self, suffix):
        """nn's parameters of one (layer, direction): name -> tensor (None: not built)."""
        return {name: self._tensor(f"{name}{suffix}") if f"{name}{suffix}" in self._nn_names
                else None for name in _NN_NAMES}

    def _tensor(self, name):
        """The parameter ``name`` (TypeError when it was set to None or replaced by a
        non-tensor: the forward needs every weight the module was built with)."""
        value = getattr(self, name, None)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a tensor (the module was built with it), got "
                            f"{type(value).__name__}")
        return value

    @property
    def all_weights(self):
        """nn's ``all_weights``: each (layer, direction)'s parameters, in nn's order."""
        return [[getattr(self, f"{name}{suffix}") for name in _NN_NAMES
                 if f"{name}{suffix}" in self._nn_names] for suffix, _ in self._layer_suffixes()]

    def _rows(self, p):
        """``[W_ihᵀ; W_hhᵀ]`` (gate blocks in PyTorch's order) and ``(b_ih, b_hh)`` (zeros
        without biases)."""
        rows = torch.cat([p["weight_ih"].t(), p["weight_hh"].t()], dim=0)
        if p["bias_ih"] is None:
            zeros = rows.new_zeros(rows.shape[1])
            return rows, (zeros, zeros)
        return rows, (p["bias_ih"], p["bias_hh"])

    def weight_sets(self):
        """The gradcells weight sets the forward passes to the stack, one per (layer,
        direction) in PyTorch's order, built from the parameters by differentiable ops."""
        return [self._weight_set(suffix) for suffix, _ in self._layer_suffixes()]

    # -- the forward ------------------------------------------------------------------------

    def forward(self, input, hx=None):  # noqa: A002 (nn's name)
        """nn's forward: ``input [T, B, I]`` (``[B, T, I]`` with ``batch_first``, ``[T, I]``
        unbatched) or a ``PackedSequence``, and the initial states (None: zeros). Returns
        ``(output, states)`` as nn does, a PackedSequence for a PackedSequence."""
        x, lengths, packed = self._input(input)
        unbatched = x.ndim == 2
        if unbatched:  # nn's unbatched input: a batch of one
            x = x.unsqueeze(self._batch_axis)
        states = self._initial_states(hx, x, unbatched)
        out, finals = self._run(x, states, lengths)
        if packed is not None:
            out = self._repacked(out, lengths, packed)
        elif unbatched:
            out, finals = out.squeeze(self._batch_axis), [f.squeeze(1) for f in finals]
        return out, self._nn_states(finals)

    def _input(self, input):  # noqa: A002
        """``(x, lengths or None, the PackedSequence or None)``, ``x`` checked."""
        if isinstance(input, PackedSequence):
            x, lengths = pad_packed_sequence(input, batch_first=self.batch_first)
            packed = input
        elif isinstance(input, torch.Tensor):
            x, lengths, packed = input, None, None
            if x.ndim not in (2, 3):
                raise ValueError(f"input must be a 3-D tensor [{self._layout}, I] or a 2-D "
                                 f"unbatched one [T, I], got shape {tuple(x.shape)}")
        else:
            raise TypeError("input must be a torch.Tensor or a PackedSequence, got "
                            f"{type(input).__name__}")
        first = self._tensor("weight_ih_l0")
        if x.dtype != first.dtype:
            raise TypeError(f"input must have the parameters' dtype {first.dtype}, got "
                            f"{x.dtype}")
        if x.device != first.device:
            raise ValueError(f"input is on {x.device}, the parameters on {first.device}")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"input must have input_size = {self.input_size} features (its "
                             f"last axis), got shape {tuple(x.shape)}")
        return x, lengths, packed

    @property
    def _batch_axis(self):
        return 0 if self.batch_first else 1

    @property
    def _layout(self):
        return "B, T" if self.batch_first else "T, B"

    def _state_shapes(self, batch):
        """The initial states' shapes, in gradcells's order (the LSTM's ``cs0`` first)."""
        return [(self.num_layers * self._directions, batch, self._width)]

    def _initial_states(self, hx, x, unbatched):
        """gradcells's initial states ``[L·D, B, ·]`` from nn's ``hx`` (None: zeros)."""
        batch = x.shape[self._batch_axis]
        shapes = self._state_shapes(batch)
        if hx is None:
            return [x.new_zeros(shape) for shape in shapes]
        given = self._gradcells_order(hx)
        states = []
        for name, state, shape in zip(self._state_names, given, shapes, strict=True):
            if not isinstance(state, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(state).__name__}")
            if unbatched and state.ndim == 2:
                state = state.unsqueeze(1)
            elif unbatched:
                raise ValueError(f"{name} must be 2-D [L·D, ·] for an unbatched input, got "
                                 f"shape {tuple(state.shape)}")
            if tuple(state.shape) != shape:
                raise ValueError(f"{name} must have shape [L·D, B, ·] = {shape}, got "
                                 f"{tuple(state.shape)}")
            if state.dtype != x.dtype or state.device != x.device:
                raise TypeError(f"{name} must be a {x.dtype} tensor on {x.device} as the input "
                                f"is, got {state.dtype} on {state.device}")
            states.append(state)
        return states

    def _gradcells_order(self, hx):
        """nn's ``hx`` as a list in gradcells's order (one tensor here)."""
        return [hx]

    def _nn_states(self, finals):
        """nn's final states from gradcells's (``[h_n]``: ``h_n``)."""
        return finals[0]

    def _dropout_masks(self, x):
        """The stack's ``dropout_masks``: None in eval mode or without dropout, else one
        Bernoulli(1 - p) / (1 - p) mask of a layer's outputs per layer boundary."""
        if not self.training or self.dropout == 0 or self.num_layers == 1:
            return None
        shape = (*x.shape[:2], self._directions * self._width)
        keep = 1.0 - self.dropout
        return [x.new_empty(shape).bernoulli_(keep) / keep if keep else x.new_zeros(shape)
                for _ in range(self.num_layers - 1)]

    def _run(self, x, states, lengths):
        """``(top outputs, final states in gradcells's order)`` of the stack."""
        if self.zoneout:
            return self._run_zoned(x, states, lengths)
        stack = FUNCTIONS[f"{self._cell}_stack"](
            x, *states, self.weight_sets(), bidirectional=self.bidirectional,
            seq_len=None if lengths is None else lengths.tolist(),
            batch_first=self.batch_first, dropout_masks=self._dropout_masks(x),
            **self._attributes())
        states = OPS[STACKS[f"{self._cell}_stack"]].states                  # cs0, h0
        return stack.h, [getattr(stack, f"{s.removesuffix('0')}_final") for s in states]

    def _attributes(self):
        """The cell's settings the stack takes by keyword."""
        return {}

    def _zoneout_mask(self, x, width):
        """Zoneout's mask of one state ``width`` wide: Bernoulli(zoneout) per step and unit
        in training mode, its expectation (a constant) in eval mode."""
        if self.training:
            return x.new_empty((*x.shape[:2], width)).bernoulli_(self.zoneout)
        return x.new_full((), self.zoneout)

    def _run_zoned(self, x, states, lengths):
        """``_run`` with zoneout: the stack layer by layer, one ``gradcells.torch.<cell>_
        sequence`` per direction with its zoneout masks; each layer reads the one below
        (directions concatenated, forward first) times that boundary's dropout mask, as
        ``gc.<cell>_stack`` composes them."""
        name = STACKS[f"{self._cell}_stack"]
        state_names = [s.removesuffix("0") for s in OPS[name].states]     # cs, h
        widths = {"cs": self.hidden_size, "h": self._width}
        directions, weights, masks = self._directions, self.weight_sets(), self._dropout_masks(x)
        seq_len = None if lengths is None else lengths.tolist()
        layer_input, finals = x, {s: [] for s in state_names}
        for layer in range(self.num_layers):
            outputs = []
            for k in range(layer * directions, (layer + 1) * directions):
                seq = FUNCTIONS[name](layer_input, *(s[k] for s in states),
                                      **weights[k]._asdict(), seq_len=seq_len,
                                      reverse=k % directions == 1,
                                      batch_first=self.batch_first, **self._attributes(),
                                      **{f"zoneout_{s}": self._zoneout_mask(x, widths[s])
                                         for s in state_names})
                outputs.append(seq.h)
                for s in state_names:
                    finals[s].append(getattr(seq, f"{s}_final"))
            layer_input = outputs[0] if directions == 1 else torch.cat(outputs, dim=-1)
            if masks is not None and layer < self.num_layers - 1:
                layer_input = layer_input * masks[layer]
        return layer_input, [torch.stack(finals[s]) for s in state_names]

    def _repacked(self, out, lengths, packed):
        """``out`` (padded, in the input's batch order) as a PackedSequence with the input's
        ``batch_sizes`` and sort indices."""
        if packed.sorted_indices is not None:
            out = out.index_select(self._batch_axis, packed.sorted_indices)
            lengths = lengths.index_select(0, packed.sorted_indices.cpu())
        data = pack_padded_sequence(out, lengths, batch_first=self.batch_first).data
        return PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                              packed.unsorted_indices)

    def extra_repr(self):
        text = f"{self.input_size}, {self.hidden_size}"
        defaults = {"proj_size": 0, "num_layers": 1, "bias": True, "batch_first": False,
                    "dropout": 0.0, "bidirectional": False}
        for name, default in {**defaults, **self._option_defaults()}.items():
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)!r}"
        return text

    def _option_defaults(self):
        return {}


class LSTM(_RecurrentBase):
    """``torch.nn.LSTM`` on gradcells's fused LSTM stack.

    ``LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0, device=None, dtype=None, *, peepholes=False,
    cell_clip=None, proj_clip=None, layer_norm=False, ln_epsilon=1e-5, ln_carry="raw",
    zoneout=0.0)``; ``forward(input, (h0, c0)=None) -> (output, (h_n, c_n))`` as nn's.

    The options (docs/spec.md §2, §9):

    - ``peepholes``: parameters ``weight_ci, weight_cf, weight_co [H]`` per layer and
      direction (``weight_ci_l0``, ...), uniform in ``±1/√H`` as the others;
    - ``cell_clip``, ``proj_clip`` (needs ``proj_size``): clip the cell state / the
      projected output to ``±clip`` (None: no clip);
    - ``layer_norm``: the layer-normalised LSTM (§9.2), parameters ``ln_gamma_x, ln_beta_x,
      ln_gamma_h, ln_beta_h [4H]`` (in PyTorch's gate order, like ``weight_ih``'s rows) and
      ``ln_gamma_c, ln_beta_c [H]`` per layer and direction, gains 1 and shifts 0;
      ``ln_epsilon`` and ``ln_carry`` as for ``gc.lstm_sequence``;
    - ``zoneout`` (a probability in [0, 1)): each step keeps each unit of the cell state and
      of ``h`` at its old value with probability ``zoneout`` (Krueger et al. 2016). Training
      mode draws the masks with torch's RNG; eval mode uses the expectation
      ``zoneout·old + (1 - zoneout)·new``.
    """

    _cell, _gates, _state_names = "lstm", 4, ("c0", "h0")

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None, *,
                 peepholes=False, cell_clip=None, proj_clip=None, layer_norm=False,
                 ln_epsilon=1e-5, ln_carry="raw", zoneout=0.0):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype, zoneout)
        self.peepholes, self.layer_norm = bool(peepholes), bool(layer_norm)
        self.cell_clip, self.proj_clip = _clip("cell_clip", cell_clip), _clip("proj_clip",
                                                                              proj_clip)
        if self.proj_clip is not None and not proj_size:
            raise ValueError("proj_clip clips the projection: it needs proj_size > 0")
        if ln_carry not in LN_CARRIES:
            raise ValueError(f"ln_carry must be one of {LN_CARRIES}, got {ln_carry!r}")
        if not _is_number(ln_epsilon) or not ln_epsilon > 0:
            raise ValueError(f"ln_epsilon must be a positive number, got {ln_epsilon!r}")
        self.ln_epsilon, self.ln_carry = float(ln_epsilon), ln_carry
        factory = {"device": device, "dtype": dtype}
        for suffix, _ in self._layer_suffixes():
            for name, shape in self._option_shapes():
                self._register(f"{name}{suffix}", shape, factory)
        self.reset_parameters()

    def _option_shapes(self):
        hidden, gates = self.hidden_size, 4 * self.hidden_size
        shapes = [(name, (hidden,)) for name in _PEEPHOLE_NAMES.values()] if self.peepholes \
            else []
        if self.layer_norm:
            shapes += [(_NORM_NAMES[f], (gates if _gate_wide(f) else hidden,))
                       for f in NORM_FIELDS]
        return shapes

    def _reset_options(self, bound):
        with torch.no_grad():
            for suffix, _ in self._layer_suffixes():
                for name, _ in self._option_shapes():
                    p = getattr(self, f"{name}{suffix}")
                    if name in _PEEPHOLE_NAMES.values():
                        p.uniform_(-bound, bound)
                    else:  # a layer norm's gain 1, shift 0
                        p.fill_(1.0 if "gamma" in name else 0.0)

    def _option_defaults(self):
        return {"peepholes": False, "cell_clip": None, "proj_clip": None,
                "layer_norm": False, "ln_epsilon": 1e-5, "ln_carry": "raw", "zoneout": 0.0}

    def _weight_set(self, suffix):
        p = self._parameters_of(suffix)
        rows, biases = self._rows(p)
        w = _reorder(rows, LSTM_TORCH, LSTM_GRADCELLS, dim=1)
        b = _reorder(biases[0] + biases[1], LSTM_TORCH, LSTM_GRADCELLS, dim=0)
        options = {}
        if self.peepholes:
            options.update({k: self._tensor(f"{n}{suffix}") for k, n in _PEEPHOLE_NAMES.items()})
        if self.proj_size:
            options["w_proj"] = p["weight_hr"].t().contiguous()
        if self.layer_norm:
            norm = {f: self._tensor(f"{n}{suffix}") for f, n in _NORM_NAMES.items()}
            options["layer_norm"] = LSTMNorm(**{
                f: _reorder(a, LSTM_TORCH, LSTM_GRADCELLS, dim=0) if _gate_wide(f) else a
                for f, a in norm.items()})
        return LSTMWeights(w, b, **options)

    def _state_shapes(self, batch):
        layers = self.num_layers * self._directions
        return [(layers, batch, self.hidden_size), (layers, batch, self._width)]

    def _gradcells_order(self, hx):
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError("hx must be a tuple (h0, c0) of tensors, got "
                            f"{type(hx).__name__}")
        return [hx[1], hx[0]]

    def _nn_states(self, finals):
        cs_final, h_final = finals
        return h_final, cs_final

    def _attributes(self):
        return {"forget_bias": 0.0, "cell_clip": self.cell_clip, "proj_clip": self.proj_clip,
                "ln_epsilon": self.ln_epsilon, "ln_carry": self.ln_carry}

class GRU(_RecurrentBase):
    """``torch.nn.GRU`` on gradcells's fused GRU stack.

    ``GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None, *, reset_after=True, zoneout=0.0)``;
    ``forward(input, h0=None) -> (output, h_n)`` as nn's; ``zoneout`` as ``LSTM``'s (on h).
    ``reset_after=True`` is PyTorch's GRU (``n = tanh(W_in x + b_in + r∘(W_hn h + b_hn))``);
    ``reset_after=False`` is TensorFlow's ``GRUBlockCell`` (``n = tanh(W_in x + W_hn (r∘h) +
    b_in + b_hn)``): the same parameters, its candidate bias the sum of the two.
    """

    _cell, _gates = "gru", 3

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, *,
                 reset_after=True, zoneout=0.0):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype, zoneout)
        self.reset_after = bool(reset_after)
        self.reset_parameters()

    def _option_defaults(self):
        return {"reset_after": True, "zoneout": 0.0}

    def _weight_set(self, suffix):
        rows, biases = self._rows(self._parameters_of(suffix))
        w = dict(zip(GRU_TORCH, rows.chunk(3, dim=1), strict=True))
        b_x, b_h = (dict(zip(GRU_TORCH, b.chunk(3), strict=True)) for b in biases)
        b_c = (torch.cat([b_x["c"], b_h["c"]]) if self.reset_after else b_x["c"] + b_h["c"])
        return GRUWeights(torch.cat([w["r"], w["u"]], dim=1), w["c"].contiguous(),
                          torch.cat([b_x["r"] + b_h["r"], b_x["u"] + b_h["u"]]), b_c)

    def _attributes(self):
        return {"reset_after": self.reset_after}


class RNN(_RecurrentBase):
    """``torch.nn.RNN`` on gradcells's fused plain-RNN stack: ``RNN(input_size, hidden_size,
    num_layers=1, nonlinearity="tanh", bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None, *, zoneout=0.0)``; ``forward(input,
    h0=None) -> (output, h_n)`` as nn's; ``zoneout`` as ``LSTM``'s (on h)."""

    _cell, _gates = "rnn", 1

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None,
                 *, zoneout=0.0):
        if nonlinearity not in ACTIVATIONS:
            raise ValueError(f"nonlinearity must be one of {ACTIVATIONS}, got {nonlinearity!r}")
        super().__init__(f"RNN_{nonlinearity.upper()}", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, 0, device, dtype, zoneout)
        self.nonlinearity = nonlinearity
        self.reset_parameters()

    def _option_defaults(self):
        return {"nonlinearity": "tanh", "zoneout": 0.0}

    def _weight_set(self, suffix):
        rows, biases = self._rows(self._parameters_of(suffix))
        return RNNWeights(rows, biases[0] + biases[1])

    def _attributes(self):
        return {"activation": self.nonlinearity}
