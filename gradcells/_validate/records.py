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
import operator

import numpy as np

from .._core.specs import MASKS
from ..cells import OPS, SPECS, cell_of
from .arrays import checked_library, given_values, tuple_getter
from .settings import (
    bool_value,
    check_requires,
    checked_record,
    keyword_plan,
    keyword_value,
    mask_value,
    presence,
    recorded_copy,
    seq_len_value,
    weights_present,
)

_CELL = {op: SPECS[cell_of(op)] for op in OPS}
"""Each op's cell spec."""


def forward_args(op: str, x, states, weights, *, seq_len=None, reverse=False,
                 batch_first=False, masks=None, **keywords):
    """Check a forward call of ``op``; return ``(library, settings)``. ``keywords``: the
    cell's settings as the caller gave them (each a ``Keyword`` of its spec; those not
    given keep their defaults), checked by their ``check`` before the arrays or, where the
    check needs the arrays' dtype, after them."""
    spec, cell, plan, taken = _PLAN[op]
    if not taken.issuperset(keywords):
        _known(cell, keywords, grad=False)
    given = tuple(map(keywords.get, plan.early_names, plan.early_given))
    early = (plan.early_defaults if all(map(operator.is_, given, plan.early_given)) else
             _early(cell, given))
    late = tuple(map(keywords.get, plan.late_names, plan.late_defaults))
    order = ((bool_value("reverse", reverse), bool_value("batch_first", batch_first))
             if spec.sequence else (False, False))
    library = checked_library(spec, x, states, weights,
                              reset_after=bool(early) and dict(early).get("reset_after", False),
                              batch_first=order[1])
    present = presence(plan.named, weights)
    kinds = tuple(map(type, late))     # the key tells True from 1 and 1.0
    try:
        hash(late)
    except TypeError:      # a 0-d array (a tensor's scalar): checked, not looked up
        settings = checked_record.__wrapped__(cell, spec, early, late, kinds, x.dtype.char,
                                              present)
    else:
        settings = checked_record(cell, spec, early, late, kinds, x.dtype.char, present)
    if spec.sequence:
        settings = _ordered(settings, seq_len, library, x, states, order, masks)
    return library, settings


def _early(cell, given):
    """The keywords checked before the arrays, as ``given`` (in ``keyword_plan`` order),
    checked: looked up where they are hashable (a program repeats a few settings)."""
    kinds = tuple(map(type, given))     # the key tells True from 1
    try:
        hash(given)
    except TypeError:
        return _checked_early.__wrapped__(cell, given, kinds)
    return _checked_early(cell, given, kinds)


@functools.lru_cache(maxsize=256)
def _checked_early(cell, given, kinds):
    return tuple((k.name, keyword_value(k, v))
                 for k, v in zip(keyword_plan(cell).early, given, strict=True))


def _ordered(settings, seq_len, library, x, states, order, masks):
    """A sequence's record: its lengths, time order, layout and masks added."""
    seq_len = recorded_copy(seq_len_value(seq_len, library, x, order[1]))
    if seq_len is not None or order != (False, False):
        settings = dataclasses.replace(settings, seq_len=seq_len, reverse=order[0],
                                       batch_first=order[1])
    if masks and any(m is not None for m in masks.values()):
        settings = dataclasses.replace(settings, **{
            name: recorded_copy(mask_value(name, m, x, states, batch_first=order[1]))
            for name, m in masks.items() if m is not None})
    return settings


def _known(cell, keywords, *, grad):
    """TypeError for a keyword the cell does not take (a gradient takes no forward-only
    setting)."""
    if keywords and not _TAKEN[cell.name, grad].issuperset(keywords):
        unknown = sorted(set(keywords) - _TAKEN[cell.name, grad])
        raise TypeError(f"the {cell.name} takes no setting {unknown[0]!r}")


_TAKEN = {(name, grad): frozenset(k.name for k in cell.keywords
                                  if not (grad and k.forward_only))
          for name, cell in SPECS.items() for grad in (False, True)}

_PLAN = {op: (spec, _CELL[op], keyword_plan(_CELL[op]), _TAKEN[_CELL[op].name, False])
         for op, spec in OPS.items()}
"""What a forward call of each op checks: its spec, its cell, the cell's keyword plan and
the keywords it takes."""


def grad_args(op: str, x, states, weights, result, upstream, *, seq_len=None, reverse=None,
              batch_first=None, masks=None, **keywords):
    """Check a gradient call of ``op``; return ``(library, settings)``: the forward's record,
    each setting given again (None: not given) checked against it; for a result that
    records nothing, the record the keywords make (and the defaults).

    ``upstream``: the upstream gradients by name (None where absent).
    """
    spec, cell = OPS[op], _CELL[op]
    _known(cell, keywords, grad=True)
    given = {name: value for name, value in keywords.items() if value is not None}
    recorded = result.settings if type(result) is spec.result else None
    if given and recorded is not None and _repeats(recorded, given):
        given = {}
    settings = recorded or spec.settings(**{
        flag: getattr(weights, names[0]) is not None for flag, names in cell.flags.items()})
    if given or reverse is not None or batch_first is not None:
        settings = _given_again(spec, recorded, settings, {  # the shapes depend on these
            **{k.name: (given[k.name], functools.partial(keyword_value, k))
               for k in keyword_plan(cell).early if k.name in given},
            **{name: (value, functools.partial(bool_value, name))
               for name, value in (("reverse", reverse), ("batch_first", batch_first))
               if value is not None}})
    check_optional(cell, spec, recorded, weights)  # before the shapes (the projection's P)
    library = checked_library(spec, x, states, weights,
                               reset_after=getattr(settings, "reset_after", False),
                               batch_first=settings.batch_first, result=result,
                               upstream=upstream)
    if (given or recorded is None or seq_len is not None
            or (masks and any(m is not None for m in masks.values()))):
        settings = _given_late(cell, spec, recorded, settings, given, library, x, states,
                               weights, seq_len, masks)
    return library, settings


def _repeats(recorded, given):
    """Whether each setting ``given`` again is the ``recorded`` value itself, of its type
    (the forward's keywords passed again, the common call): it agrees without a check."""
    for name, value in given.items():
        before = getattr(recorded, name)
        if type(value) is not type(before) or value != before:
            return False
    return True


def _given_late(cell, spec, recorded, settings, given, library, x, states, weights, seq_len,
                masks):
    """``grad_args``' settings given again that need the arrays checked first: the lengths,
    the keywords whose check needs the dtype, the masks; and the requirements."""
    batch_first = settings.batch_first
    settings = _given_again(spec, recorded, settings, {
        "seq_len": (seq_len, lambda value: seq_len_value(value, library, x, batch_first)),
        **{k.name: (given[k.name], functools.partial(keyword_value, k, dtype=x.dtype))
           for k in keyword_plan(cell).late if k.name in given},
        **{name: (m, functools.partial(mask_value, name, x=x, states=states,
                                       batch_first=batch_first))
           for name, m in (masks or {}).items()}})
    check_requires(cell, settings, weights_present(cell, weights))
    return settings


def _given_again(spec, recorded, settings, given):
    """``settings`` with each setting of ``given`` (name: (value or None, its
    normalisation)) that the call gives again checked against the record (``_agreeing``)."""
    for name, (value, normalised) in given.items():
        if value is not None:
            settings = _agreeing(spec, recorded, settings, name, normalised(value))
    return settings


def check_optional(cell, spec, recorded, weights, record=None):
    """ValueError unless each group of optional weights (the cell's flags: an LSTM's
    peepholes, projection, layer norm) is present as the forward's record says
    (``record``: what messages call it, by default ``<result>.settings``)."""
    if recorded is None:
        return
    ran, first = _FLAGS[cell.name]
    if given_values(first(weights)) == ran(recorded):
        return
    for flag, names in cell.flags.items():
        given, ran = getattr(weights, names[0]) is not None, getattr(recorded, flag)
        if given != ran:
            listed = ", ".join(names)
            raise ValueError(
                f"the forward ran with {flag}; pass {listed} again" if ran else
                f"{listed} {'were' if len(names) > 1 else 'was'} given but the forward ran "
                f"without {flag} ({record or spec.result_arg + '.settings'}.{flag} is False)")


_FLAGS = {name: (tuple_getter(tuple(cell.flags)),
                 tuple_getter(tuple(names[0] for names in cell.flags.values())))
          for name, cell in SPECS.items()}
"""Each cell's getters of its flags (from a record) and of the weight whose presence decides
each (from the weights)."""


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

