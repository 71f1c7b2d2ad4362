"""One forward or gradient call checked whole: ``forward_args`` and ``grad_args`` return
the arrays' library and the call's settings record.

A gradient call resolves each setting from the forward's record (``result.settings``) and
from its own keywords: a keyword left at None takes the recorded value; one that contradicts
the record raises ``ValueError`` naming it; a result that records nothing (a tuple built by
hand) leaves the keywords to decide, with their documented defaults.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .._core.specs import MASKS
from ..cells import OPS
from ..cells.gru.spec import GRUSettings
from ..cells.lstm.spec import PEEPHOLES, LSTMSettings
from ..cells.rnn.spec import RNNSettings
from .arrays import checked_library
from .settings import (
    activation_value,
    bool_value,
    cell_clip_value,
    ln_carry_value,
    ln_epsilon_value,
    mask_value,
    proj_clip_value,
    recorded_copy,
    reset_after_value,
    seq_len_value,
    settings_record,
)


def forward_args(op: str, x, states, weights, *, forget_bias=1.0, cell_clip=None,
                 proj_clip=None, ln_epsilon=1e-5, ln_carry="raw", reset_after=False,
                 activation="tanh", seq_len=None, reverse=False, batch_first=False,
                 masks=None):
    """Check a forward call of ``op``; return ``(library, settings)``. The keywords are the
    op's attributes as the caller gave them (those the op does not have keep their
    defaults)."""
    spec = OPS[op]
    kind = spec.settings
    reset_after = reset_after_value(reset_after) if kind is GRUSettings else False
    if kind is RNNSettings:
        activation = activation_value(activation)
    order = ((bool_value("reverse", reverse), bool_value("batch_first", batch_first))
             if spec.sequence else (False, False))
    library = checked_library(spec, x, states, weights, reset_after=reset_after,
                               batch_first=order[1])
    seq_len = (recorded_copy(seq_len_value(seq_len, library, x, order[1]))
               if spec.sequence else None)
    settings = settings_record(spec, x, weights, seq_len, reset_after=reset_after,
                               activation=activation, forget_bias=forget_bias, cell_clip=cell_clip,
                               proj_clip=proj_clip, ln_epsilon=ln_epsilon, ln_carry=ln_carry)
    if order != (False, False):
        settings = dataclasses.replace(settings, reverse=order[0], batch_first=order[1])
    if masks and any(m is not None for m in masks.values()):
        settings = dataclasses.replace(settings, **{
            name: recorded_copy(mask_value(name, m, x, states, batch_first=order[1]))
            for name, m in masks.items() if m is not None})
    return library, settings


def grad_args(op: str, x, states, weights, result, upstream, *, cell_clip=None,
              proj_clip=None, ln_epsilon=None, ln_carry=None, reset_after=None,
              activation=None, seq_len=None, reverse=None, batch_first=None, masks=None):
    """Check a gradient call of ``op``; return ``(library, settings)``: the forward's record,
    each setting given again (None: not given) checked against it; for a result that
    records nothing, the record the keywords make.

    ``upstream``: the upstream gradients by name (None where absent).
    """
    spec = OPS[op]
    recorded = result.settings if type(result) is spec.result else None
    settings = recorded
    if settings is None:
        settings = (LSTMSettings(peepholes=weights.wci is not None,
                                 projection=weights.w_proj is not None,
                                 layer_norm=weights.layer_norm is not None)
                    if spec.settings is LSTMSettings else spec.settings())
    settings = _given_again(spec, recorded, settings, {  # the shapes depend on these
        "reset_after": (reset_after, reset_after_value),
        "activation": (activation, activation_value),
        "reverse": (reverse, functools.partial(bool_value, "reverse")),
        "batch_first": (batch_first, functools.partial(bool_value, "batch_first"))})
    if spec.settings is LSTMSettings:  # before the shapes, which depend on the projection
        check_optional(spec, recorded, weights)
    library = checked_library(spec, x, states, weights,
                               reset_after=getattr(settings, "reset_after", False),
                               batch_first=settings.batch_first, result=result,
                               upstream=upstream)
    batch_first = settings.batch_first
    return library, _given_again(spec, recorded, settings, {
        "seq_len": (seq_len, lambda value: seq_len_value(value, library, x, batch_first)),
        "cell_clip": (cell_clip, lambda value: cell_clip_value(value, x.dtype)),
        "proj_clip": (proj_clip, lambda value: proj_clip_value(value, weights, x.dtype)[1]),
        "ln_epsilon": (ln_epsilon, lambda value: ln_epsilon_value(value, x.dtype)),
        "ln_carry": (ln_carry, ln_carry_value),
        **{name: (m, functools.partial(mask_value, name, x=x, states=states,
                                       batch_first=batch_first))
           for name, m in (masks or {}).items()}})


def _given_again(spec, recorded, settings, given):
    """``settings`` with each setting of ``given`` (name: (value or None, its
    normalisation)) that the call gives again checked against the record (``_agreeing``)."""
    for name, (value, normalised) in given.items():
        if value is not None:
            settings = _agreeing(spec, recorded, settings, name, normalised(value))
    return settings


def check_optional(spec, recorded, weights, record=None):
    """ValueError unless the peepholes, the projection and the layer norm are present as the
    forward's record says (``record``: what messages call it, by default
    ``<result>.settings``)."""
    peepholes, projection, norm = (a is not None
                                   for a in (weights.wci, weights.w_proj, weights.layer_norm))
    if recorded is None or (peepholes == recorded.peepholes
                            and projection == recorded.projection
                            and norm == recorded.layer_norm):
        return
    for given, flag, names in ((peepholes, "peepholes", ", ".join(PEEPHOLES)),
                               (projection, "projection", "w_proj"),
                               (norm, "layer_norm", "layer_norm")):
        ran = getattr(recorded, flag)
        if given != ran:
            raise ValueError(
                f"the forward ran with {flag}; pass {names} again" if ran else
                f"{names} {'were' if ',' in names else 'was'} given but the forward ran "
                f"without {flag} ({record or spec.result_arg + '.settings'}.{flag} is False)")


def _agreeing(spec, recorded, settings, name, value):
    """``settings`` with setting ``name`` given again as ``value``: unchanged when it agrees
    with the forward's record, ValueError naming it when it contradicts the record; with no
    record, ``settings`` with ``name`` set."""
    if recorded is None:
        return dataclasses.replace(settings, **{name: value})
    before = getattr(recorded, name)
    agrees = (_same_arrays(value, before) if name == "seq_len" or name in MASKS
              else value == before)
    if not agrees:
        raise ValueError(
            f"{name}={_setting_text(value)} contradicts the forward's {name}="
            f"{_setting_text(before)} recorded in {spec.result_arg}.settings; leave "
            f"{name} out to use the forward's")
    return settings


def _same_arrays(a, b):
    """Whether two arrays (lengths, masks) or Nones are the same, NaN equal to NaN (a mask
    may hold NaN past the lengths, where it is never read: docs/spec.md §11.3)."""
    if a is None or b is None:
        return a is b
    return a is b or (a.shape == b.shape and np.array_equal(a, b, equal_nan=True))


def _setting_text(value):
    if value is None or isinstance(value, (bool, float, int, str)):
        return repr(value)
    if value.ndim != 1 or value.dtype.kind not in "iu":
        return f"<an array of shape {tuple(value.shape)}>"
    return f"[{', '.join(str(int(n)) for n in value.tolist())}]"

