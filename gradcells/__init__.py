"""gradcells: fused LSTM, GRU and plain RNN cells for NumPy and CuPy with hand-derived gradients,
checked against finite differences by a public oracle.

Importing gradcells imports NumPy only: the Numba backend compiles on first use, CuPy is
imported only when a CuPy array arrives, and TensorFlow/PyTorch/JAX are never imported here.
"""

import importlib

from . import scans, sequences, stacks, steps
from ._core.types import StackSettings
from .cells import CELLS, SCANS
from .curvature import gauss_newton_vector_product, hessian_vector_product
from .oracle import (
    GradientCheckError,
    JVPReport,
    TaylorReport,
    VJPReport,
    check_jvp,
    check_vjp,
    taylor_test,
)

# The registered cells' public functions and types (generated from their specs).
_SPECS = [importlib.import_module(f"{__name__}.cells.{cell}.spec") for cell in (*CELLS, *SCANS)]
_FUNCTIONS = [name for module in (steps, sequences, stacks, scans) for name in module.__all__]
globals().update({name: getattr(module, name) for module in (steps, sequences, stacks, scans,
                                                             *_SPECS) for name in module.__all__})

__version__ = "0.2.0.dev0"

_SUBMODULES = ("tf_compat", "layouts", "testing", "reference", "audit")

__all__ = [
    *_FUNCTIONS, "hessian_vector_product", "gauss_newton_vector_product",
    *(name for spec in _SPECS for name in spec.__all__), "StackSettings",
    "check_vjp", "VJPReport", "check_jvp", "JVPReport", "taylor_test", "TaylorReport",
    "GradientCheckError",
    "tf_compat", "layouts", "testing",
]


def __getattr__(name):
    # Submodules that are public but not needed at import time.
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
