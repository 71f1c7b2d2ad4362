"""TensorFlow's fused recurrent raw ops, mirrored by name, argument names, defaults and
output tuples: swap ``tf.raw_ops.LSTMBlockCell(...)`` for ``lstm_block_cell(...)`` and get
the same numbers, from NumPy or CuPy arrays (or PyTorch tensors and JAX arrays, which come
back in their own library, as from the public API), in float32 or float64.

Each mirror is a thin adapter over the public API (``lstm_cell``, ``gru_cell``,
``lstm_sequence`` and their gradients), which validates every argument; error messages name
the TensorFlow argument. The two cell-gradient mirrors also return the gate gradients
(``dicfo``; ``d_c_bar``, ``d_r_bar_u_bar``), which the public API keeps inside: those come
from the reference's ``lstm_gate_grads`` / ``gru_gate_grads``, written for any array
namespace, so they run on NumPy or CuPy arrays alike but never on the fast backends.
Mirrored faithfully, faults included (docs/spec.md §6):

- gate layout: ``w`` columns and ``b`` are i, ci, f, o (the kernel's order; TF's op docs
  say i, f, ci, o). ``block_lstm_v2`` and ``block_lstm_grad_v2`` use i, f, ci, o.
- ``cell_clip`` defaults to 3.0 in ``lstm_block_cell`` and ``block_lstm``: a caller who
  passes nothing silently clips the cell state to [-3, 3] (0 or negative: no clipping;
  None: the default, as in TF).
- TF's LSTM gradient ops take no ``cell_clip``: their gradient passes straight through the
  clip, which is wrong wherever the clip was active. The ``..._grad`` mirrors reproduce
  that; ``gradcells.lstm_cell_grad`` / ``lstm_sequence_grad`` give the true gradient.
- With ``use_peephole=False`` the peephole vectors are not read, but each must still be a
  1-D array of x's library and dtype, as TF checks (None is accepted too); their gradients
  are zeros shaped like them (``[H]`` when None), as TF returns.

Where TensorFlow reads out of bounds or aborts the process (``seq_len_max`` negative or
above T), the mirrors raise ``ValueError``; where it leaves outputs uninitialised (``i, f,
o, ci, co`` past ``seq_len_max`` in ``BlockLSTM``), they return zeros. TF's ops take
float16/float32 (GRU: float32 only); the mirrors take float32 and float64.
"""

from __future__ import annotations

import numbers
import re
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from . import _validate as _v
from ._core import arrays
from ._core.types import Array
from ._interop import accepts_any_array
from .cells.gru.spec import GRUCellState
from .cells.lstm.spec import (
    GATE_UPSTREAM,
    PEEPHOLES,
    LSTMCellState,
    LSTMSequence,
    LSTMWeights,
)
from .reference import gru_gate_grads, lstm_gate_grads
from .sequences import lstm_sequence, lstm_sequence_grad
from .steps import gru_cell, gru_cell_grad, lstm_cell

__all__ = [
    "lstm_block_cell", "lstm_block_cell_grad", "gru_block_cell", "gru_block_cell_grad",
    "block_lstm", "block_lstm_grad", "block_lstm_v2", "block_lstm_grad_v2",
    "LSTMBlockCellOutput", "LSTMBlockCellGradOutput", "GRUBlockCellOutput",
    "GRUBlockCellGradOutput", "BlockLSTMOutput", "BlockLSTMGradOutput",
]


class LSTMBlockCellOutput(LSTMCellState):
    """``tf.raw_ops.LSTMBlockCell``'s outputs ``(i, cs, f, o, ci, co, h)``, each ``[B, H]``."""

    __slots__ = ()


class LSTMBlockCellGradOutput(NamedTuple):
    """``tf.raw_ops.LSTMBlockCellGrad``'s outputs: ``cs_prev_grad [B, H]``, the gate
    gradient ``dicfo [B, 4H]`` (dL/dG, layout i, ci, f, o) and the peephole gradients."""

    cs_prev_grad: Array
    dicfo: Array
    wci_grad: Array
    wcf_grad: Array
    wco_grad: Array


class GRUBlockCellOutput(GRUCellState):
    """``tf.raw_ops.GRUBlockCell``'s outputs ``(r, u, c, h)``, each ``[B, H]``."""

    __slots__ = ()


class GRUBlockCellGradOutput(NamedTuple):
    """``tf.raw_ops.GRUBlockCellGrad``'s outputs: ``d_x [B, I]``, ``d_h_prev [B, H]``, the
    candidate pre-activation gradient ``d_c_bar [B, H]`` and ``d_r_bar_u_bar [B, 2H]``."""

    d_x: Array
    d_h_prev: Array
    d_c_bar: Array
    d_r_bar_u_bar: Array


class BlockLSTMOutput(LSTMCellState):
    """``tf.raw_ops.BlockLSTM`` / ``BlockLSTMV2``'s outputs ``(i, cs, f, o, ci, co, h)``, each
    ``[T, B, H]``."""

    __slots__ = ()


class BlockLSTMGradOutput(NamedTuple):
    """``tf.raw_ops.BlockLSTMGrad`` / ``BlockLSTMGradV2``'s outputs."""

    x_grad: Array
    cs_prev_grad: Array
    h_prev_grad: Array
    w_grad: Array
    wci_grad: Array
    wcf_grad: Array
    wco_grad: Array
    b_grad: Array


# --------------------------------------------------------------------------------------
# Argument handling shared by the mirrors


_PEEPHOLES = PEEPHOLES
_LSTM_GRAD_NAMES = {"d_h": "h_grad", "d_cs": "cs_grad"}
_SEQUENCE_NAMES = {"cs0": "cs_prev", "h0": "h_prev", "seq.cs_final": "cs",
                   "seq.h_final": "h", **_LSTM_GRAD_NAMES}


_NAME = re.compile(r"(?<![\w.])(?:(?:state|seq)\.)?\w+(?!\w)")


@contextmanager
def _tf_argument_names(names):
    """Re-raise the public layer's TypeError/ValueError with TensorFlow's argument names:
    ``names`` maps a gradcells name to TF's; otherwise ``state.X`` and ``seq.X`` become ``X``."""
    try:
        yield
    except (TypeError, ValueError) as error:
        def tf_name(match):
            name = match.group(0)
            return names.get(name, name.split(".")[-1])

        message = _NAME.sub(tf_name, str(error))
        if message == str(error):
            raise
        raise type(error)(message) from error


def _default(value, default):
    """TF's attributes: None means the op's default."""
    return default if value is None else value


def _use_peephole_value(use_peephole):
    if use_peephole is None:
        return False
    if not isinstance(use_peephole, (bool, np.bool_)):
        raise TypeError(f"use_peephole must be a bool, got {type(use_peephole).__name__}")
    return bool(use_peephole)


def _peepholes(use_peephole, wci, wcf, wco, like):
    """The peephole keyword arguments for the public API: all three when used, else none.

    Unused vectors are never read, but, as TF does, each one given must still be an array
    of rank 1 (any length), here also of ``like``'s library and dtype when ``like`` (x) is
    an array; None is accepted too."""
    if not use_peephole:
        for name, vector in zip(_PEEPHOLES, (wci, wcf, wco), strict=True):
            if vector is not None:
                _check_unused_peephole(name, vector, like)
        return {}
    given = dict(zip(_PEEPHOLES, (wci, wcf, wco), strict=True))
    for name, vector in given.items():
        if vector is None:
            raise TypeError(f"{name} must be an array [H] when use_peephole=True, got None")
    return given


def _check_unused_peephole(name, vector, like):
    library = _native_library(vector)
    if library is None:
        raise TypeError(f"{name} must be an array [H] or None, got {type(vector).__name__}")
    like_library = _native_library(like)
    if like_library is not None and library != like_library:
        raise TypeError(f"{name} must come from the same array library as x ({like_library}), "
                        f"got {library}")
    if like_library is not None and vector.dtype != like.dtype:
        raise TypeError(f"{name} must have the same dtype as x ({like.dtype}), got {vector.dtype}")
    if vector.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array [H] (TF checks its rank even when "
                         f"use_peephole=False), got shape {tuple(vector.shape)}")


def _unused_peephole_grads(wci, wcf, wco, like, n_hidden):
    """TF's gradients of unused peephole vectors (each None or checked by ``_peepholes``):
    zeros shaped like them, ``[H]`` for None."""
    xp = arrays.namespace_of(like)
    return tuple(xp.zeros((n_hidden,) if p is None else tuple(p.shape), dtype=like.dtype)
                 for p in (wci, wcf, wco))


def _native_library(a):
    """"numpy" or "cupy" for such an array (the mirrors see converted arrays), else None."""
    library = arrays.library_of(a)
    return library if library in arrays.NATIVE else None


def _is_array(a):
    return _native_library(a) is not None


def _seq_len_max_value(seq_len_max, x):
    """Check TF's ``seq_len_max`` (an int64 scalar, in [0, T]); return it as an int.

    TensorFlow reads out of bounds or aborts the process on a value outside [0, T]. When
    ``x`` is not a 3-D array the bound is left to the public layer, which rejects ``x``."""
    if isinstance(seq_len_max, (bool, np.bool_)):
        raise TypeError("seq_len_max must be an integer, got bool")
    if isinstance(seq_len_max, numbers.Integral):
        steps = int(seq_len_max)
    elif (getattr(seq_len_max, "shape", None) == () and
          getattr(getattr(seq_len_max, "dtype", None), "kind", None) in ("i", "u")):
        steps = int(seq_len_max)
    else:
        raise TypeError(
            f"seq_len_max must be an integer (TF's int64 scalar), got "
            f"{type(seq_len_max).__name__}"
            + (f" of dtype {seq_len_max.dtype} and shape {tuple(seq_len_max.shape)}"
               if hasattr(seq_len_max, "dtype") and hasattr(seq_len_max, "shape") else ""))
    if steps < 0:
        raise ValueError(f"seq_len_max must be in [0, T], got {steps}")
    if _is_array(x) and x.ndim == 3 and steps > x.shape[0]:
        raise ValueError(
            f"seq_len_max must be in [0, T] = [0, {x.shape[0]}], got {steps}")
    return steps


def _rows_running(steps, x):
    """``seq_len`` for the public API: every row runs ``steps`` steps (None: all T)."""
    if not (_is_array(x) and x.ndim == 3) or steps == x.shape[0]:
        return None
    return arrays.namespace_of(x).full((x.shape[1],), steps, dtype=np.int64)


def _zero_past(a, steps, n_steps):
    """A copy of per-step ``a [T, ...]`` with steps ``>= steps`` zeroed (``a`` itself when
    nothing is past, or when ``a`` is malformed and left to the public layer to reject)."""
    if steps >= n_steps or not (_is_array(a) and a.ndim == 3 and a.shape[0] == n_steps):
        return a
    out = a.copy()
    out[steps:] = 0
    return out


def _last_state(per_step, first, steps):
    """The state after the last run step: ``per_step[steps-1]``, or ``first`` at 0 steps.
    A malformed ``per_step`` gives ``first``; the public layer then rejects ``per_step``."""
    if steps == 0 or not (_is_array(per_step) and per_step.ndim == 3
                          and per_step.shape[0] >= steps):
        return first
    return per_step[steps - 1]


def _swap_gate_blocks(a):
    """Swap the 2nd and 3rd of four column blocks on the last axis: V2's i, f, ci, o <->
    gradcells's i, ci, f, o (its own inverse). Malformed arrays are returned as they are."""
    if not (_is_array(a) and a.ndim in (1, 2) and a.shape[-1] % 4 == 0):
        return a
    xp = arrays.namespace_of(a)
    width = a.shape[-1] // 4
    i, first, second, o = (a[..., k * width:(k + 1) * width] for k in range(4))
    return xp.concatenate([i, second, first, o], axis=-1)


# --------------------------------------------------------------------------------------
# Cells


@accepts_any_array
def lstm_block_cell(x: Array, cs_prev: Array, h_prev: Array, w: Array, wci: Array | None,
                    wcf: Array | None, wco: Array | None, b: Array, forget_bias: float = 1.0,
                    cell_clip: float | None = 3.0,
                    use_peephole: bool = False) -> LSTMBlockCellOutput:
    """``tf.raw_ops.LSTMBlockCell``: one LSTM step, gate layout i, ci, f, o.

        G = [x, h_prev]·w + b;   i = σ(Gi + cs_prev∘wci);   ci = tanh(Gc)
        f = σ(Gf + forget_bias + cs_prev∘wcf);   cs = clip(i∘ci + f∘cs_prev, ±cell_clip)
        co = tanh(cs);   o = σ(Go + cs∘wco);   h = o∘co     (peephole terms iff use_peephole)

    TF's default ``cell_clip=3.0`` clips silently; pass 0 (or a negative value) for none.
    Returns ``LSTMBlockCellOutput(i, cs, f, o, ci, co, h)``, each ``[B, H]``.
    """
    use_peephole = _use_peephole_value(use_peephole)
    state = lstm_cell(x, cs_prev, h_prev, w, b, **_peepholes(use_peephole, wci, wcf, wco, x),
                      forget_bias=_default(forget_bias, 1.0),
                      cell_clip=_default(cell_clip, 3.0))
    return LSTMBlockCellOutput(*state)


@accepts_any_array
def lstm_block_cell_grad(x: Array, cs_prev: Array, h_prev: Array, w: Array, wci: Array | None,
                         wcf: Array | None, wco: Array | None, b: Array, i: Array, cs: Array,
                         f: Array, o: Array, ci: Array, co: Array, cs_grad: Array | None,
                         h_grad: Array | None, use_peephole: bool) -> LSTMBlockCellGradOutput:
    """``tf.raw_ops.LSTMBlockCellGrad``: the elementwise backward step of one LSTM cell.

        do = h_grad∘co∘o(1-o);   dcs = h_grad∘o∘(1-co²) + cs_grad + do∘wco
        di = dcs∘ci∘i(1-i);  dci = dcs∘i∘(1-ci²);  df = dcs∘cs_prev∘f(1-f)
        dicfo = [di, dci, df, do];   cs_prev_grad = dcs∘f + di∘wci + df∘wcf
        wci_grad = Σ_batch di∘cs_prev;  wcf_grad = Σ_batch df∘cs_prev;  wco_grad = Σ_batch do∘cs

    TF's op takes no ``cell_clip``: ``dcs`` passes straight through the clip, so the result
    is wrong wherever the forward clipped (``gradcells.lstm_cell_grad`` is exact). The
    gradients of x, h_prev, w and b follow from ``dicfo`` by matmuls (``dicfo·wᵀ``, ...), as
    TF's Python gradient computes them. ``cs_grad``/``h_grad`` None mean zeros.
    Returns ``LSTMBlockCellGradOutput(cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad)``.
    """
    use_peephole = _use_peephole_value(use_peephole)
    peepholes = _peepholes(use_peephole, wci, wcf, wco, x)
    # TF's op takes no h, and the gradient never reads it: co fills the state's h slot; it
    # takes no gradients of the gates either (docs/spec.md §16.1: they are dropped).
    state = LSTMCellState(i, cs, f, o, ci, co, co)
    with _tf_argument_names(_LSTM_GRAD_NAMES):
        _v.grad_args("lstm_cell", x, (cs_prev, h_prev),
                     LSTMWeights(w, b, *(peepholes.get(name) for name in _PEEPHOLES)), state,
                     {"d_h": h_grad, "d_cs": cs_grad, **dict.fromkeys(GATE_UPSTREAM)})
    grads = lstm_gate_grads(cs_prev, state, d_h=h_grad, d_cs=cs_grad, **peepholes,
                            cell_clip=None)
    peephole_grads = (grads.wci, grads.wcf, grads.wco) if use_peephole else (
        _unused_peephole_grads(wci, wcf, wco, cs_prev, cs_prev.shape[1]))
    return LSTMBlockCellGradOutput(grads.cs_prev, grads.gates, *peephole_grads)


@accepts_any_array
def gru_block_cell(x: Array, h_prev: Array, w_ru: Array, w_c: Array, b_ru: Array,
                   b_c: Array) -> GRUBlockCellOutput:
    """``tf.raw_ops.GRUBlockCell``: one GRU step, reset before the candidate matmul.

        [r, u] = σ([x, h_prev]·w_ru + b_ru);   c = tanh([x, r∘h_prev]·w_c + b_c)
        h = u∘h_prev + (1-u)∘c

    Returns ``GRUBlockCellOutput(r, u, c, h)``, each ``[B, H]``.
    """
    return GRUBlockCellOutput(*gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c))


@accepts_any_array
def gru_block_cell_grad(x: Array, h_prev: Array, w_ru: Array, w_c: Array, b_ru: Array, b_c: Array,
                        r: Array, u: Array, c: Array, d_h: Array | None) -> GRUBlockCellGradOutput:
    """``tf.raw_ops.GRUBlockCellGrad``: the kernel part of one GRU step's gradient.

        d_c_bar = d_h∘(1-u)∘(1-c²);   d_u_bar = d_h∘(h_prev-c)∘u(1-u)
        d_hr = (d_c_bar·w_cᵀ)[:, I:];   d_r_bar = d_hr∘h_prev∘r(1-r)
        d_x = ([d_r_bar, d_u_bar]·w_ruᵀ)[:, :I] + (d_c_bar·w_cᵀ)[:, :I]
        d_h_prev = ([d_r_bar, d_u_bar]·w_ruᵀ)[:, I:] + d_hr∘r + d_h∘u

    (TF's own docstring of this gradient has three errors, docs/spec.md §6 fault 5; its kernel and
    these formulas agree.) ``d_h`` None means zeros.
    Returns ``GRUBlockCellGradOutput(d_x, d_h_prev, d_c_bar, d_r_bar_u_bar)``.
    """
    # TF's op takes no h, and the gradient never reads it: c fills the state's h slot.
    with _tf_argument_names({}):
        grads = gru_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, GRUCellState(r, u, c, c),
                              d_h=d_h)
    d_c_bar, d_r_bar_u_bar, _, _ = gru_gate_grads(x, h_prev, w_c, b_c,
                                                  GRUCellState(r, u, c, c), d_h)
    return GRUBlockCellGradOutput(grads.x, grads.h_prev, d_c_bar, d_r_bar_u_bar)


# --------------------------------------------------------------------------------------
# Sequences


def _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias,
                cell_clip, use_peephole):
    steps = _seq_len_max_value(seq_len_max, x)
    use_peephole = _use_peephole_value(use_peephole)
    with _tf_argument_names(_SEQUENCE_NAMES):
        seq = lstm_sequence(x, cs_prev, h_prev, w, b,
                            **_peepholes(use_peephole, wci, wcf, wco, x),
                            forget_bias=forget_bias, cell_clip=cell_clip,
                            seq_len=_rows_running(steps, x))
    return BlockLSTMOutput(*seq[:7])


def _block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                     h, cs_grad, h_grad, use_peephole):
    steps = _seq_len_max_value(seq_len_max, x)
    use_peephole = _use_peephole_value(use_peephole)
    peepholes = _peepholes(use_peephole, wci, wcf, wco, x)
    n_steps = x.shape[0] if _is_array(x) and x.ndim == 3 else 0
    # Steps past seq_len_max hold whatever TF left there: never read them.
    i, cs, f, o, ci, co, h, cs_grad, h_grad = (
        _zero_past(a, steps, n_steps) for a in (i, cs, f, o, ci, co, h, cs_grad, h_grad))
    seq = LSTMSequence(i, cs, f, o, ci, co, h, _last_state(cs, cs_prev, steps),
                       _last_state(h, h_prev, steps))
    with _tf_argument_names(_SEQUENCE_NAMES):
        grads = lstm_sequence_grad(x, cs_prev, h_prev, w, b, seq, d_h=h_grad, d_cs=cs_grad,
                                   **peepholes, clip_grad="straight_through",
                                   seq_len=_rows_running(steps, x))
    peephole_grads = (grads.wci, grads.wcf, grads.wco) if use_peephole else \
        _unused_peephole_grads(wci, wcf, wco, cs_prev, cs_prev.shape[1])
    return BlockLSTMGradOutput(grads.x, grads.cs0, grads.h0, grads.w, *peephole_grads, grads.b)


@accepts_any_array
def block_lstm(seq_len_max: Array | int, x: Array, cs_prev: Array, h_prev: Array, w: Array,
               wci: Array | None, wcf: Array | None, wco: Array | None, b: Array,
               forget_bias: float = 1.0, cell_clip: float | None = 3.0,
               use_peephole: bool = False) -> BlockLSTMOutput:
    """``tf.raw_ops.BlockLSTM``: ``lstm_block_cell`` over ``x [T, B, I]`` for the first
    ``seq_len_max`` steps, from ``cs_prev, h_prev [B, H]``; gate layout i, ci, f, o.

    Past ``seq_len_max`` every output is zero: TF zeroes ``cs`` and ``h`` there but leaves
    ``i, f, o, ci, co`` uninitialised (docs/spec.md §6 fault 8); gradcells returns zeros for
    them too.
    ``seq_len_max`` outside [0, T] raises ValueError (TF aborts the process). TF's default
    ``cell_clip=3.0`` clips silently; pass 0 for none.
    Returns ``BlockLSTMOutput(i, cs, f, o, ci, co, h)``, each ``[T, B, H]``.
    """
    return _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                       _default(forget_bias, 1.0),
                       _default(cell_clip, 3.0), use_peephole)


@accepts_any_array
def block_lstm_grad(seq_len_max: Array | int, x: Array, cs_prev: Array, h_prev: Array, w: Array,
                    wci: Array | None, wcf: Array | None, wco: Array | None, b: Array, i: Array,
                    cs: Array, f: Array, o: Array, ci: Array, co: Array, h: Array,
                    cs_grad: Array | None, h_grad: Array | None,
                    use_peephole: bool) -> BlockLSTMGradOutput:
    """``tf.raw_ops.BlockLSTMGrad``: backpropagation through ``block_lstm``'s first
    ``seq_len_max`` steps, given its outputs and the upstream gradients ``cs_grad, h_grad
    [T, B, H]`` of every step's ``cs`` and ``h`` (entries past ``seq_len_max`` are ignored).

    Like TF's op, the gradient passes straight through the cell clip (no ``cell_clip``
    argument): wrong wherever the forward clipped; ``gradcells.lstm_sequence_grad`` is
    exact. ``x_grad`` is zero past ``seq_len_max``.
    Returns ``BlockLSTMGradOutput(x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad,
    wcf_grad, wco_grad, b_grad)``.
    """
    return _block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o,
                            ci, co, h, cs_grad, h_grad, use_peephole)


@accepts_any_array
def block_lstm_v2(seq_len_max: Array | int, x: Array, cs_prev: Array, h_prev: Array, w: Array,
                  wci: Array | None, wcf: Array | None, wco: Array | None, b: Array,
                  cell_clip: float | None = 0.0, use_peephole: bool = False) -> BlockLSTMOutput:
    """``tf.raw_ops.BlockLSTMV2``: ``block_lstm`` with the columns of ``w`` and ``b`` in the
    gate order i, f, ci, o (Keras's) and no forget bias (``forget_bias`` 0, no attribute);
    ``cell_clip`` defaults to 0.0 (no clipping). Outputs past ``seq_len_max`` are zero
    (TF leaves ``i, f, o, ci, co`` there uninitialised).
    Returns ``BlockLSTMOutput(i, cs, f, o, ci, co, h)``, each ``[T, B, H]``.
    """
    return _block_lstm(seq_len_max, x, cs_prev, h_prev, _swap_gate_blocks(w), wci, wcf, wco,
                       _swap_gate_blocks(b), 0.0, _default(cell_clip, 0.0),
                       use_peephole)


@accepts_any_array
def block_lstm_grad_v2(seq_len_max: Array | int, x: Array, cs_prev: Array, h_prev: Array, w: Array,
                       wci: Array | None, wcf: Array | None, wco: Array | None, b: Array, i: Array,
                       cs: Array, f: Array, o: Array, ci: Array, co: Array, h: Array,
                       cs_grad: Array | None, h_grad: Array | None,
                       use_peephole: bool) -> BlockLSTMGradOutput:
    """``tf.raw_ops.BlockLSTMGradV2``: ``block_lstm_grad`` for ``block_lstm_v2``'s gate order
    i, f, ci, o (``w_grad`` and ``b_grad`` come back in that order).

    This is the gradient TF's own registered gradient of ``BlockLSTMV2`` gets wrong: it calls
    the V1 op, whose gate order differs (docs/spec.md §6 fault 6). The straight-through clip
    gradient is TF's, as in ``block_lstm_grad``.
    Returns ``BlockLSTMGradOutput(x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad,
    wcf_grad, wco_grad, b_grad)``.
    """
    grads = _block_lstm_grad(seq_len_max, x, cs_prev, h_prev, _swap_gate_blocks(w), wci, wcf,
                             wco, _swap_gate_blocks(b), i, cs, f, o, ci, co, h, cs_grad, h_grad,
                             use_peephole)
    return grads._replace(w_grad=_swap_gate_blocks(grads.w_grad),
                          b_grad=_swap_gate_blocks(grads.b_grad))
