"""Calling a backend below the public layer, with a test case's keywords.

A backend op takes the arrays, one weight set and one settings record (the backend protocol
in ``gradcells._core.types``); test cases are dicts of the public keywords. ``forward`` and
``grad`` build the record the way the public layer does (a clip <= 0: None; peepholes
present when ``wci`` is, a projection when ``w_proj`` is, a layer norm when
``layer_norm`` is) and call ``<backend>.<op>`` /
``<backend>.<op>_grad``.
"""

from __future__ import annotations

from gradcells.cells import OPS
from gradcells.cells.lstm.spec import LSTMSettings


def weights_and_settings(op, case):
    """``(weights, settings)`` for op ``op`` from the case dict ``case``."""
    spec = OPS[op]
    weights = spec.weights(*(case.get(name) for name in spec.weights._fields))
    values = {name: case[name] for name in spec.settings.__dataclass_fields__
              if case.get(name) is not None}
    if spec.settings is LSTMSettings:
        values["peepholes"] = weights.wci is not None
        values["projection"] = weights.w_proj is not None
        values["layer_norm"] = weights.layer_norm is not None
        for clip in ("cell_clip", "proj_clip"):
            if values.get(clip) is not None and values[clip] <= 0:
                del values[clip]
    return weights, spec.settings(**values)


def _leading(spec, case):
    return (case["x"], *(case[name] for name in spec.states))


def forward(backend, op, case):
    """``backend.<op>`` on the case's arrays."""
    spec = OPS[op]
    weights, settings = weights_and_settings(op, case)
    return getattr(backend, op)(*_leading(spec, case), weights, settings)


def grad(backend, op, case, result, **upstream):
    """``backend.<op>_grad`` on the case's arrays, the forward's ``result`` and the upstream
    gradients (and ``clip_grad``) given as keywords."""
    spec = OPS[op]
    weights, settings = weights_and_settings(op, case)
    return getattr(backend, spec.grad_name)(*_leading(spec, case), weights, result, settings,
                                            **upstream)
