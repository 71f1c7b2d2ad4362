"""Hypothesis strategies over the cases of ``gradcells.testing.cases``.

Hypothesis is imported only when a strategy is built, so importing ``gradcells.testing``
needs no Hypothesis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..cells.lstm.spec import LN_CARRIES
from ..cells.mingru.spec import ACTIVATIONS as MINGRU_ACTIVATIONS
from ..cells.rnn.spec import ACTIVATIONS
from ..cells.slstm.spec import FORGETS
from .cases import (
    FORGET_BIASES,
    SCALES,
    gru_cell_case,
    gru_sequence_case,
    lstm_cell_case,
    lstm_sequence_case,
    mingru_cell_case,
    mingru_sequence_case,
    minlstm_cell_case,
    minlstm_sequence_case,
    rglru_cell_case,
    rglru_sequence_case,
    rnn_cell_case,
    rnn_sequence_case,
    slstm_cell_case,
    slstm_sequence_case,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from .cases import Case


def _sizes(st, min_size, max_batch, max_input, max_hidden):
    return (st.integers(min_size, max_batch), st.integers(min_size, max_input),
            st.integers(max(1, min_size), max_hidden))


def _flag(st, value):
    """Drawn when ``value`` is None, else fixed."""
    return st.booleans() if value is None else st.just(value)


def _activation(st, value):
    """Drawn from ``ACTIVATIONS`` when ``value`` is None, else fixed."""
    return st.sampled_from(ACTIVATIONS) if value is None else st.just(value)


def _lstm_options(st, projection, layer_norm, max_hidden):
    """The strategies of the LSTM's optional parts: a projection (``proj_size`` from 1 to
    ``max_hidden + 1``, its clip drawn) and a layer norm (either carry), each drawn when its
    flag is None, always there when True, never when False."""
    options = {}
    if projection is not False:
        sizes = st.integers(1, max_hidden + 1)
        options["proj_size"] = sizes if projection else st.none() | sizes
        options["proj_clip"] = st.booleans()
    if layer_norm is not False:
        options["layer_norm"] = _flag(st, layer_norm)
        options["ln_carry"] = st.sampled_from(LN_CARRIES)
    return options


def _order_options(st, reverse, batch_first, masks=False):
    """The strategies of a sequence's time order, layout and masks: each drawn when None,
    fixed when True, left out (the defaults) when False."""
    return {name: _flag(st, value) for name, value in
            (("reverse", reverse), ("batch_first", batch_first), ("masks", masks))
            if value is not False}


def _seeded(st, make, dtype, **strategies):
    """Cases from ``make(rng, dtype=dtype, **drawn)`` with a drawn seed for ``rng``."""
    return st.builds(lambda seed, **kw: make(np.random.default_rng(seed), dtype=dtype, **kw),
                     seed=st.integers(0, 2**32 - 1), **strategies)


def lstm_cell_inputs(*, dtype: Any = np.float64, peephole: bool | None = None,
                     clip: bool | None = None, projection: bool | None = False,
                     layer_norm: bool | None = False, min_size: int = 1, max_batch: int = 4,
                     max_input: int = 5, max_hidden: int = 5) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``lstm_cell`` keyword arguments (``peephole``, ``clip``,
    ``projection``, ``layer_norm`` None: drawn; the last two are off by default, so that a
    test written for the block cell gets block-cell cases). ``min_size=0`` admits empty
    batches and inputs."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, lstm_cell_case, dtype, batch=batch, input_size=input_size,
                   hidden=hidden, peephole=_flag(st, peephole), clip=_flag(st, clip),
                   forget_bias=st.sampled_from(FORGET_BIASES), scale=st.sampled_from(SCALES),
                   **_lstm_options(st, projection, layer_norm, max_hidden))


def gru_cell_inputs(*, dtype: Any = np.float64, reset_after: bool | None = None,
                    min_size: int = 1, max_batch: int = 4, max_input: int = 5,
                    max_hidden: int = 5) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``gru_cell`` keyword arguments."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, gru_cell_case, dtype, batch=batch, input_size=input_size,
                   hidden=hidden, reset_after=_flag(st, reset_after),
                   scale=st.sampled_from(SCALES))


def lstm_sequence_inputs(*, dtype: Any = np.float64, peephole: bool | None = None,
                         clip: bool | None = None, ragged: bool | None = None,
                         projection: bool | None = False, layer_norm: bool | None = False,
                         reverse: bool | None = False, batch_first: bool | None = False,
                         masks: bool | None = False, min_size: int = 1, max_steps: int = 4,
                         max_batch: int = 4,
                         max_input: int = 4,
                         max_hidden: int = 4) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``lstm_sequence`` keyword arguments (``peephole``, ``clip``,
    ``ragged``, ``projection``, ``layer_norm``, ``reverse``, ``batch_first``, ``masks``
    None: drawn; the last five off by default, as for ``lstm_cell_inputs``; the masks are
    docs/spec.md §11.3's). ``min_size=0`` admits empty
    sequences, batches and inputs."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, lstm_sequence_case, dtype, steps=st.integers(min_size, max_steps),
                   batch=batch, input_size=input_size, hidden=hidden,
                   peephole=_flag(st, peephole), clip=_flag(st, clip),
                   ragged=_flag(st, ragged), forget_bias=st.sampled_from(FORGET_BIASES),
                   scale=st.sampled_from(SCALES),
                   **_lstm_options(st, projection, layer_norm, max_hidden),
                   **_order_options(st, reverse, batch_first, masks))


def gru_sequence_inputs(*, dtype: Any = np.float64, reset_after: bool | None = None,
                        ragged: bool | None = None, reverse: bool | None = False,
                        batch_first: bool | None = False, masks: bool | None = False,
                        min_size: int = 1, max_steps: int = 4, max_batch: int = 4,
                        max_input: int = 4, max_hidden: int = 4) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``gru_sequence`` keyword arguments (``reverse``,
    ``batch_first`` and ``masks`` off by default, None: drawn)."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, gru_sequence_case, dtype, steps=st.integers(min_size, max_steps),
                   batch=batch, input_size=input_size, hidden=hidden,
                   reset_after=_flag(st, reset_after), ragged=_flag(st, ragged),
                   scale=st.sampled_from(SCALES),
                   **_order_options(st, reverse, batch_first, masks))


def rnn_cell_inputs(*, dtype: Any = np.float64, activation: str | None = None,
                    min_size: int = 1, max_batch: int = 4, max_input: int = 5,
                    max_hidden: int = 5) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``rnn_cell`` keyword arguments (``activation`` None: drawn,
    "tanh" or "relu"); relu cases keep their pre-activations away from the kink."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, rnn_cell_case, dtype, batch=batch, input_size=input_size,
                   hidden=hidden, activation=_activation(st, activation),
                   scale=st.sampled_from(SCALES))


def rnn_sequence_inputs(*, dtype: Any = np.float64, activation: str | None = None,
                        ragged: bool | None = None, reverse: bool | None = False,
                        batch_first: bool | None = False, masks: bool | None = False,
                        min_size: int = 1, max_steps: int = 4, max_batch: int = 4,
                        max_input: int = 4, max_hidden: int = 4) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``rnn_sequence`` keyword arguments (``activation``,
    ``ragged`` None: drawn; ``reverse``, ``batch_first``, ``masks`` off by default, None:
    drawn)."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, rnn_sequence_case, dtype, steps=st.integers(min_size, max_steps),
                   batch=batch, input_size=input_size, hidden=hidden,
                   activation=_activation(st, activation), ragged=_flag(st, ragged),
                   scale=st.sampled_from(SCALES),
                   **_order_options(st, reverse, batch_first, masks))


def _slstm_settings(st, forget, stabilizer_grad, max_hidden):
    """The strategies of an sLSTM case's heads (1 to ``max_hidden``, as many of them as
    divide H: ``slstm_cell_case``) and settings (None: drawn; ``stabilizer_grad`` "exact"
    unless given)."""
    return {"heads": st.integers(1, max(1, max_hidden)),
            "forget": st.sampled_from(FORGETS) if forget is None else st.just(forget),
            "stabilizer_grad": st.just(stabilizer_grad), "scale": st.sampled_from(SCALES)}


def slstm_cell_inputs(*, dtype: Any = np.float64, forget: str | None = None,
                      stabilizer_grad: str = "exact", min_size: int = 1, max_batch: int = 3,
                      max_input: int = 4, max_hidden: int = 4) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``slstm_cell`` keyword arguments (``forget`` None: drawn;
    the heads drawn)."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, slstm_cell_case, dtype, batch=batch, input_size=input_size,
                   hidden=hidden, **_slstm_settings(st, forget, stabilizer_grad, max_hidden))


def slstm_sequence_inputs(*, dtype: Any = np.float64, forget: str | None = None,
                          stabilizer_grad: str = "exact", ragged: bool | None = None,
                          reverse: bool | None = False, batch_first: bool | None = False,
                          masks: bool | None = False, min_size: int = 1, max_steps: int = 4,
                          max_batch: int = 3, max_input: int = 4,
                          max_hidden: int = 4) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``slstm_sequence`` keyword arguments (``forget``,
    ``ragged`` None: drawn; ``reverse``, ``batch_first``, ``masks`` off by default, None:
    drawn)."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, slstm_sequence_case, dtype, steps=st.integers(min_size, max_steps),
                   batch=batch, input_size=input_size, hidden=hidden,
                   **_slstm_settings(st, forget, stabilizer_grad, max_hidden),
                   ragged=_flag(st, ragged),
                   **_order_options(st, reverse, batch_first, masks))


def mingru_cell_inputs(*, dtype: Any = np.float64, activation: str | None = None,
                       min_size: int = 1, max_batch: int = 4, max_input: int = 5,
                       max_hidden: int = 5) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``mingru_cell`` keyword arguments (``activation`` None:
    drawn, "g" or "identity"); "g" cases keep their candidate pre-activations away from the
    kink."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, mingru_cell_case, dtype, batch=batch, input_size=input_size,
                   hidden=hidden, scale=st.sampled_from(SCALES),
                   activation=st.sampled_from(MINGRU_ACTIVATIONS) if activation is None
                   else st.just(activation))


def mingru_sequence_inputs(*, dtype: Any = np.float64, activation: str | None = None,
                           method: str | None = None, ragged: bool | None = None,
                           reverse: bool | None = False, batch_first: bool | None = False,
                           min_size: int = 1, max_steps: int = 4, max_batch: int = 4,
                           max_input: int = 4, max_hidden: int = 4) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``mingru_sequence`` keyword arguments (``activation``,
    ``method`` ("sequential" or "parallel") and ``ragged`` None: drawn; ``reverse`` and
    ``batch_first`` off by default, None: drawn)."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, mingru_sequence_case, dtype, steps=st.integers(min_size, max_steps),
                   batch=batch, input_size=input_size, hidden=hidden,
                   activation=st.sampled_from(MINGRU_ACTIVATIONS) if activation is None
                   else st.just(activation),
                   method=st.sampled_from(("sequential", "parallel")) if method is None
                   else st.just(method),
                   ragged=_flag(st, ragged), scale=st.sampled_from(SCALES),
                   **_order_options(st, reverse, batch_first))


def minlstm_cell_inputs(*, dtype: Any = np.float64, activation: str | None = None,
                        min_size: int = 1, max_batch: int = 4, max_input: int = 5,
                        max_hidden: int = 5) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``minlstm_cell`` keyword arguments, as
    ``mingru_cell_inputs``."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, minlstm_cell_case, dtype, batch=batch, input_size=input_size,
                   hidden=hidden, scale=st.sampled_from(SCALES),
                   activation=st.sampled_from(MINGRU_ACTIVATIONS) if activation is None
                   else st.just(activation))


def minlstm_sequence_inputs(*, dtype: Any = np.float64, activation: str | None = None,
                            method: str | None = None, ragged: bool | None = None,
                            reverse: bool | None = False, batch_first: bool | None = False,
                            min_size: int = 1, max_steps: int = 4, max_batch: int = 4,
                            max_input: int = 4, max_hidden: int = 4) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``minlstm_sequence`` keyword arguments, as
    ``mingru_sequence_inputs``."""
    from hypothesis import strategies as st

    batch, input_size, hidden = _sizes(st, min_size, max_batch, max_input, max_hidden)
    return _seeded(st, minlstm_sequence_case, dtype, steps=st.integers(min_size, max_steps),
                   batch=batch, input_size=input_size, hidden=hidden,
                   activation=st.sampled_from(MINGRU_ACTIVATIONS) if activation is None
                   else st.just(activation),
                   method=st.sampled_from(("sequential", "parallel")) if method is None
                   else st.just(method),
                   ragged=_flag(st, ragged), scale=st.sampled_from(SCALES),
                   **_order_options(st, reverse, batch_first))


def rglru_cell_inputs(*, dtype: Any = np.float64, min_size: int = 1, max_batch: int = 4,
                      max_hidden: int = 6) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``rglru_cell`` keyword arguments (``x`` as wide as the
    state; 1 to 3 heads, as many as divide H; ``c`` 8 or 2; ``sqrt_grad_bound`` None or
    1000: drawn)."""
    from hypothesis import strategies as st

    return _seeded(st, rglru_cell_case, dtype, batch=st.integers(min_size, max_batch),
                   hidden=st.integers(min_size, max_hidden), heads=st.integers(1, 3),
                   c=st.sampled_from((8.0, 2.0)),
                   sqrt_grad_bound=st.sampled_from((None, 1000.0)),
                   scale=st.sampled_from(SCALES))


def rglru_sequence_inputs(*, dtype: Any = np.float64, method: str | None = None,
                          ragged: bool | None = None, resets: bool | None = None,
                          reverse: bool | None = False, batch_first: bool | None = False,
                          min_size: int = 1, max_steps: int = 4, max_batch: int = 4,
                          max_hidden: int = 6) -> SearchStrategy[Case]:
    """Hypothesis strategy for ``rglru_sequence`` keyword arguments, drawn like
    ``rglru_cell_inputs`` (``method``, ``ragged`` and ``resets`` None: drawn; ``reverse``
    and ``batch_first`` off by default, None: drawn)."""
    from hypothesis import strategies as st

    return _seeded(st, rglru_sequence_case, dtype, steps=st.integers(min_size, max_steps),
                   batch=st.integers(min_size, max_batch),
                   hidden=st.integers(min_size, max_hidden), heads=st.integers(1, 3),
                   c=st.sampled_from((8.0, 2.0)),
                   sqrt_grad_bound=st.sampled_from((None, 1000.0)),
                   method=st.sampled_from(("sequential", "parallel")) if method is None
                   else st.just(method),
                   ragged=_flag(st, ragged), resets=_flag(st, resets),
                   scale=st.sampled_from(SCALES), **_order_options(st, reverse, batch_first))
