"""Any array in: PyTorch tensors and JAX arrays go to the backends through DLPack, and the
results come back in the caller's library.

``accepts_any_array`` wraps a public function. A call whose first argument is a NumPy array
goes straight through after one type test; one whose arguments are all NumPy or CuPy arrays
(or scalars, strings, None) after one set-membership test per argument. When a PyTorch
tensor or a JAX array arrives:

* every array argument (inside tuples and lists too, such as a ``state`` or a stack's
  weight sets) is viewed without copying
  through DLPack: CPU tensors and arrays as NumPy arrays (``numpy.from_dlpack``), CUDA ones
  as CuPy arrays (``cupy.from_dlpack``), so they run on the CPU or GPU backend;
* PyTorch tensors that require grad are **detached** first: gradcells does not take part in
  autograd; its gradients come from the explicit ``..._grad`` functions. The first such
  call in a process warns (``UserWarning``: the result is detached from autograd; use
  ``gradcells.torch`` for gradients through autograd); the check runs only on this
  converting path, never on a NumPy or CuPy call's;
* every array in the result goes back the same way: ``torch.from_dlpack`` (no copy; on the
  input's device) or ``jax.dlpack.from_dlpack`` (no copy when JAX accepts the buffer: it
  wants compact strides, 64-byte alignment and a dtype it has enabled; otherwise one copy).

Float arrays of two libraries in one call raise ``TypeError`` naming both arguments with one
message whichever comes first (here when the first argument is a tensor or JAX array, in the
public layer's validation when it is a NumPy array). Integer arrays (``seq_len``,
``seq_len_max``) may come from any of these libraries in a PyTorch or JAX call; in a NumPy or
CuPy call they are NumPy or CuPy arrays (or Python integers), as the validation requires.

``gradcells.tf_compat``'s mirrors are wrapped too, so they take the same arrays.

A call whose first argument is a dask array goes to ``gradcells._dask`` (chunked along the
batch, each chunk on its chunk type's backend, lazy dask results; it imports dask only from
``sys.modules``).

Nested arguments and results (a stack's weight sets, a result NamedTuple and the settings
it records) are walked by ``gradcells._core.trees``.

PyTorch and JAX are never imported here: an array is recognised by ``gradcells._core.arrays``
(its type against the library's module in ``sys.modules``, where it must already be since
the caller made the array).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import warnings

import numpy as np

from . import _dask
from ._core import arrays, trees

# Argument types that never need converting: the fast path tests membership in this set.
_NATIVE_TYPES = frozenset({np.ndarray, type(None), float, int, bool, str})
_FOREIGN = ("torch", "jax")
_is_float = arrays.is_float
_library_of = arrays.library_of


def _foreign_library(a) -> str | None:
    """"torch" or "jax" when ``a`` is (or a tree holding) such an array, else None."""
    if type(a) in _NATIVE_TYPES:
        return None
    for leaf in trees.leaves(a):
        library = arrays.library_of(leaf)
        if library in _FOREIGN:
            return library
    return None


def _any_foreign(values) -> bool:
    """Whether any value (or item of a tuple value) is a PyTorch or JAX array; written for
    speed, as every public call runs it."""
    for value in values:
        if type(value) in _NATIVE_TYPES:
            continue
        if isinstance(value, (tuple, list)):
            for item in value:
                if type(item) not in _NATIVE_TYPES and _foreign_library(item) is not None:
                    return True
        elif _foreign_library(value) is not None:
            return True
    return False


def cupy_module():
    try:
        import cupy
    except ImportError as error:
        raise TypeError("GPU tensors need CuPy: install gradcells[gpu]") from error
    return cupy


def torch_to_backend(name, t):
    """A NumPy (CPU) or CuPy (CUDA) view of torch tensor ``t``, detached."""
    t = t.detach().resolve_conj().resolve_neg()
    device = t.device.type
    try:
        if device == "cpu":
            return np.from_dlpack(t)
        if device == "cuda":
            return cupy_module().from_dlpack(t)
    except (BufferError, RuntimeError, TypeError) as error:
        raise TypeError(f"{name}: a {t.dtype} tensor cannot be viewed as an array "
                        f"({error}); pass float32 or float64") from error
    raise TypeError(f"{name} is a tensor on device {t.device}; gradcells runs on the CPU "
                    "(NumPy) and on CUDA GPUs (CuPy)")


def _jax_to_backend(name, a):
    """A NumPy (CPU) or CuPy (GPU) view of the JAX array ``a``."""
    if isinstance(a, sys.modules["jax"].core.Tracer):
        raise TypeError(f"{name} is a traced JAX value: gradcells runs eagerly on concrete "
                        "arrays, not inside jax.jit, jax.grad or jax.vmap")
    platforms = {d.platform for d in a.devices()}
    try:
        if platforms == {"cpu"}:
            return np.from_dlpack(a)
        if platforms <= {"gpu", "cuda"}:
            return cupy_module().from_dlpack(a)
    except (BufferError, RuntimeError, TypeError) as error:
        raise TypeError(f"{name}: a JAX array of dtype {a.dtype} cannot be viewed as an "
                        f"array ({error}); pass float32 or float64") from error
    raise TypeError(f"{name} is a JAX array on {sorted(platforms)}; gradcells runs on the "
                    "CPU (NumPy) and on CUDA GPUs (CuPy)")


_TO_BACKEND = {"torch": torch_to_backend, "jax": _jax_to_backend}


def from_backend(a, library):
    """Backend result ``a`` (NumPy or CuPy array) as an array of ``library``. A view with a
    negative stride (``_order``'s flip of a reversed sequence) is copied first: PyTorch's
    DLPack import aborts the process on one instead of raising."""
    if any(stride < 0 for stride in a.strides):
        a = a.copy()
    if library == "torch":
        torch = sys.modules["torch"]
        try:
            return torch.from_dlpack(a)
        except (BufferError, RuntimeError, TypeError):
            return torch.as_tensor(np.array(a) if isinstance(a, np.ndarray) else a.get())
    jax = sys.modules["jax"]
    try:
        return jax.dlpack.from_dlpack(a)
    except (BufferError, RuntimeError, TypeError, ValueError):
        # JAX takes only compact strides over DLPack; anything else is copied.
        return jax.numpy.asarray(a)


def _convert_results(value, library):
    return trees.map_leaves(
        lambda a: from_backend(a, library) if _library_of(a) in arrays.NATIVE else a, value)


def _named_arrays(names, args, kwargs):
    """(name, value) for every argument, tree leaves named ``name[k]``/``name.field``."""
    for k, value in enumerate(args):
        yield from trees.named_leaves(value, (names[k] if k < len(names) else f"args[{k}]",))
    for name, value in kwargs.items():
        yield from trees.named_leaves(value, (name,))


def _check_one_library(names, args, kwargs):
    """TypeError when float arrays of two libraries come in one call."""
    first = {}
    for name, value in _named_arrays(names, args, kwargs):
        library = _library_of(value)
        if library is None or not _is_float(value):
            continue
        first.setdefault(library, name)
        if len(first) > 1:
            (lib_a, name_a), (lib_b, name_b) = list(first.items())[:2]
            raise TypeError(arrays.two_libraries(name_a, lib_a, name_b, lib_b))


def _leaf_to_backend(value, path, library):
    other = _foreign_library(value)
    return value if other is None else _TO_BACKEND[other](trees.label(path), value)


def _to_backend(value, name, library):
    return trees.map_with_path(
        lambda leaf, path: _leaf_to_backend(leaf, path, library), value, (name,))


# Whether a tensor that requires grad has been detached (and warned of) in this process.
_warned_detached = False


def _warn_if_detaching(named) -> None:
    """Warn, once per process (``UserWarning``), when a PyTorch tensor among ``named``
    (``(name, value)`` pairs) requires grad: the call detaches it, so the result is not part
    of autograd, and ``gradcells.torch`` is what differentiates through it."""
    global _warned_detached
    if _warned_detached:
        return
    name = next((n for n, v in named if _library_of(v) == "torch" and v.requires_grad), None)
    if name is None:
        return
    _warned_detached = True
    warnings.warn(f"{name} requires grad, but the result is detached from autograd: gradcells's "
                  "NumPy-level functions do not take part in it; use gradcells.torch for "
                  "gradients through autograd (warned once per process)", UserWarning,
                  stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside gradcells, seen from a ``warn`` in the
    caller of this function: a warning names the user's line, however many of gradcells's
    frames (a public function, its wrappers) lie between."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("gradcells"):
        level, frame = level + 1, frame.f_back
    return level


# The library of the arrays the caller passed, while a converted call runs (None otherwise),
# for the messages that would else name the library they were converted to.
CALLER_LIBRARY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "gradcells_caller_library", default=None)


def accepts_any_array(func):
    """Let ``func`` take PyTorch tensors and JAX arrays and return results in their library.

    A call whose first argument is a NumPy array pays one type test; other NumPy and CuPy
    calls one set-membership test per argument.
    """
    names = tuple(inspect.signature(func).parameters)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        # The first argument (x) decides in a valid call; a NumPy x means a NumPy call, and a
        # tensor among NumPy arrays is then the validation's TypeError, naming it.
        first = args[0] if args else next(iter(kwargs.values()), None)
        if type(first) is not np.ndarray and arrays.is_dask(first):
            return _dask.call(func, args, kwargs)  # dask arrays: gradcells._dask's blockwise
        if type(first) is np.ndarray or not (
                _any_foreign(args) or (kwargs and _any_foreign(kwargs.values()))):
            return func(*args, **kwargs)
        _check_one_library(names, args, kwargs)
        # The float arrays decide the library; a foreign integer array (seq_len) among NumPy
        # or CuPy floats is left to the validation, which names it.
        named = list(_named_arrays(names, args, kwargs))
        library = next((lib for _, value in named
                        if (lib := _foreign_library(value)) and _is_float(value)), None)
        if library is None:
            if any(_library_of(value) in arrays.NATIVE and _is_float(value)
                   for _, value in named):
                return func(*args, **kwargs)
            # No float array at all: convert anyway, so that the validation names the dtype.
            library = next(lib for _, value in named if (lib := _foreign_library(value)))
        _warn_if_detaching(named)
        args = tuple(_to_backend(value, names[k] if k < len(names) else f"args[{k}]", library)
                     for k, value in enumerate(args))
        kwargs = {name: _to_backend(value, name, library) for name, value in kwargs.items()}
        token = CALLER_LIBRARY.set(library)
        try:
            results = func(*args, **kwargs)
        finally:
            CALLER_LIBRARY.reset(token)
        return _convert_results(results, library)

    return wrapper


def to_numpy(a):
    """A NumPy array of ``a``: NumPy arrays as they are; PyTorch tensors detached and moved to
    the host; CuPy arrays copied to the host; anything else through ``numpy.asarray``."""
    if isinstance(a, np.ndarray):
        return a
    library = _library_of(a)
    if library == "torch":
        return a.detach().cpu().resolve_conj().resolve_neg().numpy()
    if library == "cupy":
        return a.get()
    return np.asarray(a)


_HALF, _SINGLE = np.dtype(np.float16), np.dtype(np.float32)


def _retyped(tree, source, target):
    """``tree`` with every NumPy array of dtype ``source`` as a copy in ``target``."""
    return trees.map_leaves(
        lambda a: a.astype(target) if type(a) is np.ndarray and a.dtype == source else a, tree)


def computes_half_in_single(func):
    """Let ``func`` take NumPy float16 arrays (docs/spec.md §16.4): a call whose ``x`` is a
    NumPy float16 array runs in float32 (every float16 array widened, exactly) and returns
    its arrays rounded to float16, as PyTorch's CPU LSTM does. Every float array of such a
    call must be float16 (``TypeError`` naming the one that is not). Other calls pay one
    type test. CuPy float16 is not touched: the GPU backend computes it natively."""
    names = tuple(inspect.signature(func).parameters)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()), None)
        if type(first) is not np.ndarray or first.dtype.char != "e":   # "e": float16
            return func(*args, **kwargs)
        for name, value in _named_arrays(names, args, kwargs):
            if type(value) is np.ndarray and value.dtype.kind == "f" and value.dtype != _HALF:
                raise TypeError(f"{name} must have the same dtype as x (float16), got "
                                f"{value.dtype}")
        result = func(*(_retyped(a, _HALF, _SINGLE) for a in args),
                      **{k: _retyped(v, _HALF, _SINGLE) for k, v in kwargs.items()})
        return _retyped(result, _SINGLE, _HALF)

    return wrapper
