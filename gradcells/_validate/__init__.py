"""Argument checking for every public operation (docs/spec.md §7 and §10): checks only.

``forward_args`` and ``grad_args`` check everything about one call's arguments before any
computation, raise ``TypeError`` or ``ValueError`` naming the offending argument with the
expected and actual shape or dtype, and return the arrays' library and the call's settings
record (``gradcells._core.types``). What an operation takes is read from
``gradcells._core.specs``. Nothing here computes or copies an array, and nothing here
chooses a backend (``_dispatch`` does).

One module per job: ``arrays`` (libraries, dtypes, shapes of one call's arrays),
``settings`` (each keyword checked and normalised; the settings record), ``records`` (a
forward or gradient call whole, a gradient's settings resolved against the forward's
record), ``stacks`` (what a stack adds to its layers' calls; a stack gradient's weight
sets checked against its forward) and ``tangents`` (forward-mode and second-order
tangents). The names the public layer calls are re-exported here.
"""

from .arrays import FLOAT_DTYPES, groups_given, refused_subclass
from .records import forward_args, grad_args
from .settings import (
    bool_value,
    choice_value,
    clip_value,
    grad_option,
    keyword_value,
    mask_value,
    positive_value,
    real_value,
    seq_len_value,
)
from .stacks import (
    stack_args,
    stack_layer_upstream,
    stack_states,
    stack_upstream,
    stack_weights,
)
from .tangents import stack_tangents, tangents_value, upstream_tangents

__all__ = [
    "FLOAT_DTYPES", "refused_subclass", "forward_args", "grad_args", "bool_value",
    "choice_value", "clip_value", "grad_option", "groups_given", "keyword_value",
    "mask_value", "positive_value", "real_value", "seq_len_value", "stack_args",
    "stack_layer_upstream", "stack_states", "stack_upstream", "stack_weights", "stack_tangents",
    "tangents_value", "upstream_tangents",
]
