"""The known faults of TensorFlow's fused recurrent ops and of the seed's code around them:
the one list.

The audit names them in its rows (``known fault N``) and under its table, the tests in
``tests/test_faults.py`` show each one (one test per fault, found by its number), and
``docs/faults.md`` is generated from this list by ``markdown()`` (a test keeps the stored
file equal to it). A new fault found by an audit is added here, with its evidence and a
minimal reproduction, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    """One known fault.

    ``title``: the fault in a line (what the audit prints); ``evidence``: what the audit and
    the tests show; ``reproduction``: a minimal Python reproduction with TensorFlow (or the
    seed's code); ``checks``: the audit rows that recognise it (empty when the audit cannot
    run it here); ``test``: the test in ``tests/test_faults.py`` that shows it, or None with
    the reason in ``evidence``. ``kind``: ``"fault"`` (a wrong result) or ``"convention"`` (a
    documented difference of convention: the framework's result is right by its own
    definition, and the row says so instead of calling it a fault).
    """

    number: int
    title: str
    evidence: str
    reproduction: str
    checks: tuple[str, ...] = ()
    test: str | None = None
    kind: str = "fault"

    @property
    def label(self) -> str:
        """What an audit row calls it: ``known fault N`` or ``convention N``."""
        return f"{'known fault' if self.kind == 'fault' else 'convention'} {self.number}"

    def __str__(self) -> str:
        return self.title        # as the first edition's FAULTS[n], a line


_LIST = (
    Fault(
        1, "LSTMBlockCell's docs give gate order i, f, ci, o; the kernel uses i, ci, f, o",
        "The op's documentation says `[i, f, ci, o] = xh * w + b`. TensorFlow's forward equals "
        "gradcells's with the blocks of `w` and `b` read as i, ci, f, o, and differs (|Δh| "
        "about 0.1 to 1) when they are read as documented.",
        "import numpy as np, tensorflow as tf\n"
        "print('[i, f, ci, o] = xh * w + b' in tf.raw_ops.LSTMBlockCell.__doc__)   # True\n"
        "# the kernel: G = [x, h_prev]·w + b split as i, ci, f, o (see the audit's row)",
        ("LSTMBlockCell forward, gates as documented (i, f, ci, o)",),
        "test_fault_1_gate_order_is_i_ci_f_o"),
    Fault(
        2, "the raw LSTM ops default to cell_clip=3.0: callers that pass nothing are clipped",
        "Called without `cell_clip`, `LSTMBlockCell` clips the cell state to [-3, 3]: where "
        "|cs| passes 3 its outputs differ from the unclipped LSTM and equal gradcells's with "
        "`cell_clip=3.0`. `gradcells.tf_compat` mirrors the default; the public API clips only "
        "when asked.",
        "import numpy as np, tensorflow as tf\n"
        "f = np.float32; B, H = 1, 1\n"
        "out = tf.raw_ops.LSTMBlockCell(x=np.zeros((B, 1), f), cs_prev=np.full((B, H), 6, f),\n"
        "    h_prev=np.zeros((B, H), f), w=np.zeros((1 + H, 4 * H), f), b=np.zeros(4 * H, f),\n"
        "    wci=np.zeros(H, f), wcf=np.zeros(H, f), wco=np.zeros(H, f))\n"
        "print(out.cs.numpy())        # [[3.]]: 0.5·0 + σ(0 + 1)·6 = 4.39, clipped to 3",
        ("LSTMBlockCell forward, default cell_clip vs none",),
        "test_fault_2_default_cell_clip_silently_clips"),
    Fault(
        3, "every LSTM gradient op passes the gradient straight through an active clip",
        "Where the clip is active, `LSTMBlockCellGrad`'s gradient misses the oracle's central "
        "differences (|Δ| of order 1 in `w` and `cs_prev`) and equals gradcells's "
        "`clip_grad=\"straight_through\"` gradient; with the clip off it agrees.",
        "# a cell whose |cs| passes cell_clip, e.g. gc.testing.lstm_cell_case(rng, clip=True):\n"
        "# tf.raw_ops.LSTMBlockCellGrad(...) returns dcs unmasked where cs was clipped, while\n"
        "# d cs_clipped / d cs_raw is 0 there (gc.lstm_cell_grad(..., clip_grad='exact'))",
        ("LSTMBlockCellGrad, clipping active, vs oracle",),
        "test_fault_3_clip_gradient_is_straight_through"),
    Fault(
        4, "the seed's _LSTMBlockCellGrad passes wcf and wco swapped",
        "The seed unpacks `op.inputs` as (x, cs_prev, h_prev, w, wci, wco, wcf, b) and passes "
        "them on as (wci, wcf, wco): with peepholes every gradient through the cell state "
        "misses the oracle, and equals gradcells's gradient with wcf and wco exchanged; "
        "named in the op's real order the same code agrees.",
        "# the seed's line:\n"
        "(x, cs_prev, h_prev, w, wci, wco, wcf, b) = op.inputs   # the op's order is wci, wcf, "
        "wco\n"
        "gen_lstm_ops.lstm_block_cell_grad(..., wci=wci, wcf=wcf, wco=wco, ...)",
        ("seed _LSTMBlockCellGrad wrapper (peepholes) vs oracle",),
        "test_fault_4_seed_swaps_wcf_and_wco"),
    Fault(
        5, "the seed's GRU gradient docstring has three errors (its code is right)",
        "Written as code, the docstring's formulas fail the oracle: `+ u` should be "
        "`+ d_h ∘ u`, the d_w_ru and d_w_c formulas are swapped, and `(h - c)` should be "
        "`(h_prev - c)`. The seed's code computes the right gradient. A docstring is not an "
        "op, so the audit has no row for it; the tests and the GRU notebook derive the right "
        "formulas.",
        "# _GRUBlockCellGrad's docstring:\n"
        "#   d_h_prev = ... + u            (should be + d_h ∘ u)\n"
        "#   d_u_bar  = d_h ∘ (h - c) ...  (should be (h_prev - c))\n"
        "#   d_w_ru / d_w_c                (the two formulas exchanged)",
        (),
        "test_fault_5_gru_docstring_formulas_fail_the_oracle"),
    Fault(
        6, "BlockLSTMV2's registered gradient calls the V1 gradient op (other gate order)",
        "Through `tf.GradientTape`, `BlockLSTMV2`'s gradient misses the oracle (|Δ| of order "
        "1 to 10 in `b` and `w`) and equals backpropagation with V2's weights (i, f, ci, o) "
        "read in V1's order (i, ci, f, o); the `BlockLSTMGradV2` op itself agrees.",
        "# tensorflow/python/ops/rnn_grad.py:\n"
        "@ops.RegisterGradient(\"BlockLSTMV2\")\n"
        "def _block_lstm_grad_v2(op, *grads):\n"
        "    return gen_rnn_ops.block_lstm_grad(...)     # V1's op, V1's gate order",
        ("BlockLSTMV2 gradient (GradientTape) vs oracle",),
        "test_fault_6_block_lstm_v2_registered_gradient_is_wrong"),
    Fault(
        7, "on GPU, LSTMBlockCellGrad adds the peephole term to cs_prev_grad twice",
        "TensorFlow's CUDA kernel adds `di ∘ wci + df ∘ wcf` to `cs_prev_grad` a second time. "
        "It needs TensorFlow's GPU kernels: the audit reports it as not checked where "
        "TensorFlow sees no GPU, and the tests (run with tensorflow-cpu) have none.",
        "# on a GPU: tf.raw_ops.LSTMBlockCellGrad(..., use_peephole=True) on /GPU:0 and on\n"
        "# /CPU:0 give cs_prev_grad differing by di ∘ wci + df ∘ wcf",
        (),
        None),
    Fault(
        8, "BlockLSTM leaves i, f, o, ci, co uninitialised past seq_len_max",
        "Past `seq_len_max` TensorFlow's outputs are not zero: `cs` and `h` are, the gate "
        "outputs hold whatever the memory held (tiny denormals or garbage). gradcells's "
        "mirrors (`tf_compat.block_lstm`, `block_lstm_v2`) return zeros there.",
        "import numpy as np, tensorflow as tf\n"
        "# T = 3 steps, seq_len_max = 1: tf.raw_ops.BlockLSTM(seq_len_max=np.int64(1), ...)\n"
        "# outputs i, f, o, ci, co at steps 1 and 2 are not zero",
        ("BlockLSTM outputs past seq_len_max are zero",),
        "test_fault_8_outputs_past_seq_len_max_are_zero"),
    Fault(
        9, "TensorFlow 2 registers no gradient for LSTMBlockCell or GRUBlockCell",
        "`tf.GradientTape` through `LSTMBlockCell` or `GRUBlockCell` raises `LookupError: "
        "gradient registry has no entry for: LSTMBlockCell`; gradcells's gradients of the "
        "same cells agree with the oracle.",
        "import numpy as np, tensorflow as tf\n"
        "x = tf.constant(np.ones((1, 1), np.float32))\n"
        "with tf.GradientTape() as tape:\n"
        "    tape.watch(x)\n"
        "    h = tf.raw_ops.GRUBlockCell(x=x, h_prev=np.zeros((1, 1), np.float32),\n"
        "        w_ru=np.zeros((2, 2), np.float32), w_c=np.zeros((2, 1), np.float32),\n"
        "        b_ru=np.zeros(2, np.float32), b_c=np.zeros(1, np.float32))[3]\n"
        "tape.gradient(h, x)          # LookupError",
        ("registered gradient (LSTMBlockCell, GRUBlockCell)",),
        "test_fault_9_no_gradient_registered_for_the_cells"),
    Fault(
        10, "the ops take float16/float32 only (GRU float32 only): no float64",
        "Given float64 inputs, `LSTMBlockCell`, `BlockLSTMV2` and `GRUBlockCell` raise "
        "`InvalidArgumentError` (`GRUBlockCell` also refuses float16), so there is no float64 "
        "result to check a gradient against; gradcells runs all of them in float64.",
        "import numpy as np, tensorflow as tf\n"
        "tf.raw_ops.GRUBlockCell(x=np.ones((1, 1)), h_prev=np.zeros((1, 1)),\n"
        "    w_ru=np.zeros((2, 2)), w_c=np.zeros((2, 1)), b_ru=np.zeros(2), b_c=np.zeros(1))\n"
        "# InvalidArgumentError: Value for attr 'T' of double is not in the list of allowed "
        "values",
        ("float64 inputs (LSTMBlockCell, GRUBlockCell, BlockLSTMV2)",),
        "test_fault_10_tensorflow_rejects_float64"),
    # Keras 3 (gradcells.audit.keras): 30-39
    Fault(
        30, "Keras's masked steps repeat the previous output (zeros before any); gradcells's "
        "seq_len gives zeros",
        "With `mask=` (right-padded ragged lengths) Keras's every-step output at a masked step "
        "is the previous step's output (zeros before the first unmasked step, which "
        "`go_backwards=True` puts first), as its RNN documentation says masked steps are "
        "skipped and carry the state and output; gradcells's outputs past `seq_len` are zeros. "
        "The unmasked steps, the final states and the gradients agree once the cotangent at a "
        "masked step is moved onto the output it repeats. On the PyTorch backend the masked "
        "rows compare at float32 tolerances (fault 32).",
        "import numpy as np, keras\n"
        "layer = keras.layers.SimpleRNN(1, return_sequences=True)\n"
        "x, mask = np.ones((1, 3, 1)), np.array([[True, False, False]])\n"
        "print(layer(x, mask=mask))    # three equal outputs; gradcells (seq_len=[1]): h, 0, 0",
        ("keras[tensorflow] LSTM masked forward vs gradcells",), None, kind="convention"),
    Fault(
        31, "Keras on JAX: masked steps before the first unmasked one output h0, not zeros",
        "With `go_backwards=True` (or a fully masked sequence) right-padded steps come before "
        "any unmasked one; there the JAX backend outputs the initial state h0 where the "
        "TensorFlow and PyTorch backends output zeros (convention 30), so the same layer and "
        "weights give different outputs, and a gradient reaching h0 through them, by backend. "
        "The rows compare at float32 tolerances (fault 32).",
        "# KERAS_BACKEND=jax, then tensorflow:\n"
        "import numpy as np, keras\n"
        "layer = keras.layers.SimpleRNN(1, return_sequences=True, go_backwards=True, "
        "unroll=True)\n"
        "x, mask, h0 = np.ones((1, 2, 1)), np.array([[True, False]]), np.ones((1, 1))\n"
        "print(layer(x, mask=mask, initial_state=[h0])[0, 0])   # jax: h0 = 1; tensorflow: 0",
        ("keras[jax] LSTM masked forward vs gradcells",), None),
    Fault(
        32, "Keras on JAX and PyTorch computes float64 layers in float32",
        "With `keras.config.set_floatx('float64')` the layers' weights and outputs are "
        "float64, but `keras.backend.result_type` maps float64 to float32 on every backend "
        "but TensorFlow (`BIT64_TO_BIT32_DTYPE`), and ops cast to it: on JAX `ops.tanh` "
        "(every layer), on PyTorch `ops.matmul` (the generic loop: masked layers, "
        "`GRU(reset_after=False)`, `SimpleRNN`; the fused LSTM and GRU paths are float64). "
        "The outputs and gradients then match gradcells's float64 only to float32 round-off "
        "(|Δ| about 1e-8), and the oracle's float64 differences of that forward are noise.",
        "import keras\n"
        "keras.config.set_floatx('float64')\n"
        "print(keras.backend.result_type('float64', 'float64'))   # float32 unless tensorflow\n"
        "x = keras.ops.ones((2, 2), dtype='float64')\n"
        "print(keras.ops.matmul(x, x).dtype)     # torch: float32\n"
        "print(keras.ops.tanh(x).dtype)          # jax: float32",
        ("keras[jax] LSTM forward vs gradcells (layouts.lstm_from_keras)",), None),
    Fault(
        33, "Keras on JAX: a float64 SimpleRNN with unroll=False raises in lax.scan",
        "The scan's carry enters as float64 and leaves as float32 (`ops.tanh`, fault 32), and "
        "`lax.scan` raises `TypeError: scan body function carry input and carry output must "
        "have equal types`; with `unroll=True` it runs (at float32 precision).",
        "# KERAS_BACKEND=jax JAX_ENABLE_X64=1\n"
        "import numpy as np, keras\n"
        "keras.config.set_floatx('float64')\n"
        "keras.layers.SimpleRNN(2)(np.ones((1, 3, 2)))   # TypeError: ... carry ... float32",
        ("keras[jax] SimpleRNN float64, unroll=False (lax.scan)",), None),
)

FAULTS: dict[int, Fault] = {fault.number: fault for fault in _LIST}
"""Every known fault by its number."""


def _section(fault: Fault) -> list[str]:
    shown = (", ".join(f"`{c}`" for c in fault.checks) if fault.checks
             else "none (not checked by the audit)")
    test = f"`tests/test_faults.py::{fault.test}`" if fault.test else "none"
    return [f"## {fault.number}. {fault.title}", "", fault.evidence, "",
            f"Audit rows: {shown}.", "", f"Test: {test}.", "",
            "```python", fault.reproduction, "```", ""]


def markdown() -> str:
    """``docs/faults.md``: every known fault with its evidence and reproduction."""
    lines = ["# Known faults", "",
             "TensorFlow's fused recurrent ops (and the seed's Python around them) have these "
             "known faults. `python -m gradcells audit tensorflow` recognises each one it can "
             "run (a row `known fault N`); `tests/test_faults.py` shows each one against the "
             "oracle.", "",
             "This file is generated from `gradcells/audit/faults.py` by "
             "`python -c \"import gradcells.audit.faults as f; print(f.markdown(), end='')\" "
             "> docs/faults.md`; a test keeps it equal.", ""]
    for fault in _LIST:
        lines += _section(fault)
    return "\n".join(lines).rstrip() + "\n"
