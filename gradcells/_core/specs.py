"""What a cell declares, as data: its operations' arguments, shapes, results and gradients,
its keywords, its stack. Each cell's folder spells its own (``gradcells/cells/<cell>/
spec.py``, one ``CellSpec``); the registry (``gradcells.cells``) collects them, and the
validation, the public functions, the adapters, the test helpers and the architecture test
read them; nothing else writes an argument name as a literal list.

Shape labels: ``T`` steps, ``B`` batch, ``I`` input size, ``H`` cell size, ``P`` the LSTM's
recurrent width (its projection's, else H), ``I+H``, ``I+P``, ``2H``, ``4H``, ``C`` for
the GRU candidate bias (``H``, or ``2H`` reset-after), and ``N``, ``H/N``, ``4H/N`` for the
sLSTM's heads (N read from the weight whose first axis it labels, ``r``; N divides H).

Ops whose arrays are not time-major declare each array's labels (``OpSpec.labels``); the
selective scan's (Mamba's layout): ``B`` its batch ``Bt``, ``Dm`` its channels, ``N`` its
state size, ``T`` its steps ``L``, and ``G?`` the groups of ``B`` and ``C``, an optional
axis (``OPTIONAL``): ``("B", "G?", "N", "T")`` labels both ``[Bt, N, L]`` and ``[Bt, G, N,
L]`` (``shaped``). The batch axis is the one labelled ``B`` wherever it stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Labels = tuple[str, ...]

OPTIONAL = "?"
"""The suffix of a label whose axis an array may lack (the selective scan's groups,
``G?``): ``shaped`` drops it from the labels of such an array."""


def shaped(labels: Labels, ndim: int) -> Labels:
    """The labels of an array of ``ndim`` axes labelled ``labels``: with fewer axes than
    labels, the optional ones (``OPTIONAL``) dropped as far as that goes, left to right;
    otherwise ``labels`` as they are (an array with still fewer axes is aligned from the
    right by its reader, as broadcasting does)."""
    missing = len(labels) - ndim
    if missing <= 0 or not any(label.endswith(OPTIONAL) for label in labels):
        return labels
    kept = []
    for label in labels:
        if missing > 0 and label.endswith(OPTIONAL):
            missing -= 1
        else:
            kept.append(label)
    return tuple(kept)


CHECKS = ("bool", "choice", "real", "clip", "positive", "bound")
"""How the validation checks a keyword (``gradcells._validate.settings.keyword_value``): a
bool; one of its ``choices``; a real number finite in the arrays' dtype; a clip (None, 0 or
negative: none, returned as None; else a positive float); a positive number normal in the
arrays' dtype; a bound (None, or a positive number normal in the arrays' dtype: unlike a
clip, 0 or a negative number is refused, not read as none). The first two need no array,
the others the arrays' dtype."""


@dataclass(frozen=True)
class Keyword:
    """A keyword of a cell's public functions: its ``name``, its ``default`` in a forward,
    the ``annotation`` its signature shows and how it is checked (``check``, one of
    ``CHECKS``; ``choices`` for ``"choice"``). ``requires``: ``(weight, what it does)`` when
    the setting means something only with that weight given (a value other than the
    default without it is refused: "proj_clip clips the projection: pass w_proj with it").

    A setting (``CellSpec.keywords``) is given to the gradient again as None by default
    (the forward's record decides), unless ``forward_only`` (``forget_bias``: the gradient
    does not take it); a gradient option (``CellSpec.grad_options``) is the gradient's only,
    with its default. ``sequence_only``: a setting of the sequence operation (and its
    stack) alone, which the cell step neither takes nor records other than at its default
    (the minGRU's ``method``: a step has no time to scan over)."""

    name: str
    default: Any
    annotation: str
    check: str
    choices: tuple[str, ...] = ()
    requires: tuple[str, str] | None = None
    forward_only: bool = False
    sequence_only: bool = False


@dataclass(frozen=True, eq=False)   # one object per op: hashed and compared by identity
class OpSpec:
    """One forward operation and its gradient.

    ``states``: the state arguments after ``x``; ``upstream``: the gradient's upstream
    arguments; ``h_width``: the label of the recurrent output's width (``P`` for the LSTM,
    whose projection makes ``h`` P wide, else ``H``); ``nested``: the weights that are
    themselves tuples of arrays, with their types (the LSTM's ``layer_norm``, an
    ``LSTMNorm``); everything else is derived from the types.

    An op with other per-step arrays than ``x`` names them in ``inputs`` (the linear
    scan's ``a``, ``b``: each labelled as ``x``), its gradient's result argument in
    ``result_name`` (else ``seq`` or ``state``), and the per-step arrays that are data, not
    differentiated, in ``constants`` with their labels (the linear scan's ``resets``,
    ``("T", "B")``).

    An op whose arrays are not time-major declares their shape labels in ``labels``, by
    name, one namespace for its ``inputs`` and its result's fields (a field's upstream
    ``d_<field>`` is labelled as the field): these replace the derived ones (the selective
    scan's, Mamba's ``[Bt, Dm, L]`` layout: ``"u": ("B", "Dm", "T")``, ``"A": ("Dm",
    "N")``, ``"B": ("B", "G?", "N", "T")``, ...). ``optional_results``: the result fields
    computed only when a setting is true, each with that setting (the selective scan's
    ``last_state``, by ``return_last_state``), None otherwise.
    """

    name: str
    sequence: bool
    states: tuple[str, ...]
    weights: type[NamedTuple]
    settings: type
    result: type[NamedTuple]
    grads: type[NamedTuple]
    upstream: tuple[str, ...]
    h_width: str = "H"
    nested: Mapping[str, type[NamedTuple]] = field(default_factory=dict)
    inputs: tuple[str, ...] = ("x",)
    result_name: str | None = None
    constants: Mapping[str, Labels] = field(default_factory=dict)
    x_width: str = "I"
    labels: Mapping[str, Labels] = field(default_factory=dict)
    optional_results: Mapping[str, str] = field(default_factory=dict)

    @property
    def grad_name(self) -> str:
        return f"{self.name}_grad"

    @property
    def result_arg(self) -> str:
        """The gradient's argument holding the forward's result."""
        return self.result_name or ("seq" if self.sequence else "state")

    @property
    def x_labels(self) -> Labels:
        return ("T", "B", self.x_width) if self.sequence else ("B", self.x_width)

    def input_labels(self, name: str) -> Labels:
        """The shape labels of the input ``name`` (``x_labels`` unless ``labels`` says)."""
        return self.labels.get(name, self.x_labels)

    def _labels(self, name: str) -> Labels:
        """``[B, ·]`` or ``[T, B, ·]`` for a result field or upstream gradient ``name``
        (unless ``labels`` gives the field's)."""
        own = self.labels.get(name.removeprefix("d_"))
        if own is not None:
            return own
        width = self.h_width if name.removeprefix("d_") in ("h", "h_final") else "H"
        return (("B", width) if not self.sequence or name.endswith("_final")
                else ("T", "B", width))

    def result_labels(self) -> tuple[Labels, ...]:
        """The shape labels of each field of the result."""
        return tuple(self._labels(field) for field in self.result._fields)

    def upstream_labels(self, name: str) -> Labels:
        return self._labels(name)

    @property
    def state_labels(self) -> tuple[Labels, ...]:
        """The shape labels of the state arguments (``cs`` H wide, ``h`` ``h_width``)."""
        return tuple(("B", self.h_width if name.startswith("h") else "H")
                     for name in self.states)

    @property
    def arrays(self) -> tuple[str, ...]:
        """The forward's array arguments in signature order (weights as their fields)."""
        return (*self.inputs, *self.states, *self.weights._fields)

    @property
    def flat_arrays(self) -> tuple[str, ...]:
        """``arrays`` with each nested weight read as its arrays (``layer_norm.gamma_x``,
        ...): every array a call can hold, each one name."""
        return tuple(flat for name in self.arrays
                     for flat in (tuple(f"{name}.{f}" for f in self.nested[name]._fields)
                                  if name in self.nested else (name,)))


@dataclass(frozen=True)
class StackSpec:
    """A cell's stack (docs/spec.md §11.4): its result and gradient types and the defaults
    where the stack differs from the sequence (the GRU stack is reset-after, PyTorch's)."""

    result: type[NamedTuple]
    grads: type[NamedTuple]
    defaults: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)   # one object per cell: hashed and compared by identity
class CellSpec:
    """Everything the library outside a cell's folder knows about the cell.

    ``cell`` and ``sequence``: its two operations; ``keywords``: its settings, in signature
    order; ``grad_options``: its gradients' own keywords; ``flags``: the settings record's
    fields that say whether optional weights were given, with those weights (all or none of
    them); ``masks``: the masks its sequence takes (of ``MASKS``); ``weight_labels``: each
    weight's shape labels; ``protocol``: the backend contract its modules follow (all four
    modes); ``docs``: the docstring of each public function, by name (the contract and the
    math: the public functions are generated from this spec, ``gradcells._public``).
    """

    name: str
    cell: OpSpec
    sequence: OpSpec
    stack: StackSpec
    keywords: tuple[Keyword, ...]
    weight_labels: Mapping[str, Labels]
    protocol: type
    docs: Mapping[str, str]
    grad_options: tuple[Keyword, ...] = ()
    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    masks: tuple[str, ...] = ("input_mask", "recurrent_mask", "zoneout_h")

    @property
    def ops(self) -> tuple[OpSpec, OpSpec]:
        return (self.cell, self.sequence)

    @property
    def stack_name(self) -> str:
        return f"{self.name}_stack"

    @property
    def optional_weights(self) -> tuple[str, ...]:
        """The weights a call may leave out (None), given by keyword."""
        return tuple(self.cell.weights._field_defaults)


MASKS: dict[str, tuple[str, ...]] = {
    "input_mask": ("T", "B", "I"), "recurrent_mask": ("B", "P"),
    "zoneout_cs": ("T", "B", "H"), "zoneout_h": ("T", "B", "P"), "resets": ("T", "B")}
"""A sequence's masks (docs/spec.md §11.3) and the shape each broadcasts to (``P``: the
recurrent width; ``zoneout_cs`` the LSTM's only), and its per-step flags (``FLAG_MASKS``).
Whatever carries a time axis (labels starting with ``T``) is reordered with the per-step
arrays (``gradcells._order``: ``[B, T, ·]`` with ``batch_first``, run order with
``reverse``)."""

FLAG_MASKS: tuple[str, ...] = ("resets",)
"""The masks that are per-step booleans of exactly their shape (no broadcasting) rather than
real numbers of x's dtype: ``resets [T, B]`` (docs/spec.md §18.3: where true, the state the
step receives is replaced by zeros, a document boundary). Like every mask they are
constants: no gradient, no tangent."""
