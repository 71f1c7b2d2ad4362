"""The known faults and documented conventions the audits found (TensorFlow's fused ops and
the seed's code around them: 1-19; Flax: 20-29; Keras: 30-39; ONNX Runtime: 40-49;
PyTorch: 50-59; xLSTM: 60-69; minGRU-pytorch: 70-79; recurrentgemma: 80-89; Mamba: 90-99;
flash-linear-attention: 100-109): the one list.

The audits name them in their rows (``known fault N``, ``convention N``) and under their
tables, one test each shows it (``Fault.test`` in ``Fault.test_file``), and
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
    run it here); ``test``: the test that shows it (in ``test_file``), or None with the
    reason in ``evidence``. ``kind``: ``"fault"`` (a wrong result) or ``"convention"`` (a
    documented difference of convention: the framework's result is right by its own
    definition, and the row says so instead of calling it a fault). ``shows``: where the
    reproduction is a script, a regular expression its output (stdout and stderr) matches
    when run in the environment its first line sets (``# NAME=value ...``), which
    ``tests/frameworks/test_faults.py`` checks; None where it is a description.
    """

    number: int
    title: str
    evidence: str
    reproduction: str
    checks: tuple[str, ...] = ()
    test: str | None = None
    kind: str = "fault"
    test_file: str = "tests/frameworks/test_faults.py"
    shows: str | None = None

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
        "test_fault_1_gate_order_is_i_ci_f_o",
        shows=r"True"),
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
        "test_fault_2_default_cell_clip_silently_clips",
        shows=r"\[\[3\.\]\]"),
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
        "test_fault_9_no_gradient_registered_for_the_cells",
        shows=r"LookupError: gradient registry has no entry for: GRUBlockCell"),
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
        "test_fault_10_tensorflow_rejects_float64",
        shows="InvalidArgumentError: Value for attr 'T' of double is not in the list"),
    Fault(
        11, "the block gradients drop the upstream gradients of the gate outputs (LSTM i, f, "
        "o, ci, co; GRU r, u, c)",
        "`LSTMBlockCell`, `BlockLSTM` and `BlockLSTMV2` return their gates `i, f, o, ci, co` "
        "as outputs and `GRUBlockCell` returns `r, u, c`, but the gradients read only the "
        "upstream gradients of `cs` and `h` (GRU: `h`): the seed's `_LSTMBlockCellGrad` "
        "(`(_, cs_grad, _, _, _, _, h_grad) = grad`) and `_GRUBlockCellGrad` (`_, _, _, d_h = "
        "grad`), and TensorFlow 2's registered `_block_lstm_grad` for `BlockLSTM` and "
        "`BlockLSTMV2` (`rnn_grad.py`); the gradient ops take no gate gradient at all. For a "
        "loss on one gate output, `sum(gate ∘ w)`, TensorFlow's gradient of every input is "
        "zero, silently, and misses the oracle's central differences of the float64 forward "
        "by the whole derivative (|Δ| of order 0.1 to 3 in `x`, `h_prev`, `w`, `b`); a loss "
        "on `h` and `cs` agrees (`BlockLSTMV2`'s: fault 6). With a loss on every output the "
        "gradient equals the oracle's for the forward with its gate outputs zeroed.",
        "import numpy as np, tensorflow as tf\n"
        "f = np.float32; z, p = np.zeros((1, 1), f), np.zeros(1, f)\n"
        "args = dict(seq_len_max=np.int64(1), cs_prev=z, h_prev=z, w=np.ones((2, 4), f),\n"
        "            b=np.zeros(4, f), wci=p, wcf=p, wco=p, cell_clip=0.0)\n"
        "def i_at(x):                 # the input gate of one step at input x\n"
        "    return tf.raw_ops.BlockLSTM(x=x * np.ones((1, 1, 1), f), **args).i[0, 0, 0]\n"
        "x = tf.constant(1.0)\n"
        "with tf.GradientTape() as tape:\n"
        "    tape.watch(x)\n"
        "    i = i_at(x)\n"
        "print(float(tape.gradient(i, x)), round(float(i_at(1.01) - i_at(0.99)) / 0.02, 3))\n"
        "# 0.0 0.197: the tape's di/dx is zero, the central difference σ'(1) = 0.197",
        ("seed _LSTMBlockCellGrad, a loss on every output, vs oracle",
         "seed _GRUBlockCellGrad, a loss on every output, vs oracle",
         "BlockLSTM gradient (GradientTape), a loss on every output, vs oracle"),
        "test_fault_11_gate_output_gradients_are_dropped",
        shows=r"(?m)^0\.0 0\.197$"),
    # Flax (gradcells.audit.jax; tests/frameworks/test_audit_jax.py): numbers 20-29
    Fault(
        20, "Flax's RNN leaves the outputs past seq_lengths as the cell computed them "
        "(documented)",
        "`linen.RNN` and `nnx.RNN` run the cell over the padding too and return its outputs "
        "there; their docstring says \"The output elements corresponding to padding elements "
        "are NOT zeroed out\". gradcells's `seq_len` zeroes them (PyTorch's packed "
        "semantics). At the valid steps the outputs equal gradcells's to float64 round-off.",
        "import jax, jax.numpy as jnp, flax.linen as nn\n"
        "rnn = nn.RNN(nn.GRUCell(2))\n"
        "x = jnp.ones((1, 3, 1)); v = rnn.init(jax.random.key(0), x)\n"
        "y = rnn.apply(v, x, seq_lengths=jnp.array([1]))\n"
        "print(bool((y[0, 1:] != 0).all()))   # True: steps 1 and 2 are not zeroed",
        tuple(f"{api}.RNN({cell}) outputs past seq_lengths vs zeros"
              for api in ("linen", "nnx") for cell in ("LSTMCell", "GRUCell")),
        "test_convention_20_padding_outputs_are_not_zeroed", kind="convention",
        test_file="tests/frameworks/test_audit_jax.py",
        shows=r"True"),
    Fault(
        21, "Flax's RNN(reverse=True) returns the outputs in processing order unless "
        "keep_order=True (documented)",
        "With `reverse=True, keep_order=False` (the default) the output at position k of a row "
        "of length n is the step at time n-1-k (the padding stays at the end); the docstring "
        "says so. With `keep_order=True` the outputs are at their time positions and equal "
        "gradcells's `reverse=True`.",
        "import jax, jax.numpy as jnp, flax.linen as nn\n"
        "rnn = nn.RNN(nn.GRUCell(2), reverse=True)\n"
        "x = jnp.arange(3.).reshape(1, 3, 1); v = rnn.init(jax.random.key(0), x)\n"
        "y = rnn.apply(v, x); z = rnn.apply(v, x, keep_order=True)\n"
        "print(jnp.allclose(y, z[:, ::-1]))   # True: y is in processing order",
        tuple(f"{api}.RNN({cell}) reverse, keep_order=False vs time positions"
              for api in ("linen", "nnx") for cell in ("LSTMCell", "GRUCell")),
        "test_convention_21_reverse_outputs_in_processing_order", kind="convention",
        test_file="tests/frameworks/test_audit_jax.py",
        shows=r"True"),
    Fault(
        22, "Flax's RNN returns, for a row of seq_lengths 0, the carry after the T padded "
        "steps, not the initial carry",
        "`_select_last_carry` indexes the carries at `seq_lengths - 1`, which is -1 for an "
        "empty row: the carry after running the cell over all T padding steps (in either "
        "direction: gradcells's final state with that row's length T), where the initial "
        "carry (gradcells's, PyTorch's) is expected. The other rows' carries agree.",
        "import jax, jax.numpy as jnp, flax.linen as nn\n"
        "rnn = nn.RNN(nn.GRUCell(2), return_carry=True)\n"
        "x = jnp.ones((1, 3, 1)); v = rnn.init(jax.random.key(0), x)\n"
        "carry, y = rnn.apply(v, x, initial_carry=jnp.zeros((1, 2)), "
        "seq_lengths=jnp.array([0]))\n"
        "print(bool(jnp.allclose(carry, y[:, -1])), bool(carry.any()))   # True True: the\n"
        "# carry is the last padded step's, non-zero, though the initial carry was zero",
        tuple(f"{api}.RNN({cell}) a length-0 row: final carry vs initial state"
              for api in ("linen", "nnx") for cell in ("LSTMCell", "GRUCell")),
        "test_fault_22_empty_row_carry_is_the_last_padded_step",
        test_file="tests/frameworks/test_audit_jax.py",
        shows=r"True True"),
    Fault(
        23, "nnx.GRUCell documents r∘(W_hn h + b_hn) but has no b_hn (linen.GRUCell has)",
        "`nnx.GRUCell`'s docstring gives `n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`, as "
        "`linen.GRUCell`'s does, but its `dense_h` has `use_bias=False`: loaded with "
        "linen's parameters it misses linen's result wherever `hn.bias` is not zero, and "
        "equals gradcells's reset-after GRU with `b_hn = 0`.",
        "from flax import nnx\n"
        "cell = nnx.GRUCell(1, 2, rngs=nnx.Rngs(0))\n"
        "print('b_{hn}' in nnx.GRUCell.__doc__, cell.dense_h.bias)   # True None",
        ("nnx.GRUCell on linen.GRUCell's parameters (documented b_hn)",),
        "test_fault_23_nnx_gru_has_no_b_hn",
        test_file="tests/frameworks/test_audit_jax.py",
        shows=r"True None"),
    Fault(
        24, "Flax's LSTM cells add no forget bias (gradcells's lstm_cell defaults to 1.0)",
        "Flax's LSTM formula is `f = σ(W_if x + W_hf h + b_hf)` with `b_hf` initialised to "
        "zero; gradcells's `lstm_cell` adds `forget_bias=1.0` by default (TensorFlow's block "
        "cell). Flax's cells equal gradcells's with `forget_bias=0` (as `gc.layouts`' "
        "PyTorch converters set in `options`).",
        "import numpy as np, gradcells as gc\n"
        "x, c, h = np.zeros((1, 1)), np.ones((1, 1)), np.zeros((1, 1))\n"
        "w, b = np.zeros((2, 4)), np.zeros(4)   # zero weights: Flax's f = σ(0) = 0.5, c' = 0.5\n"
        "print(gc.lstm_cell(x, c, h, w, b).cs)                    # σ(1) = 0.73\n"
        "print(gc.lstm_cell(x, c, h, w, b, forget_bias=0.0).cs)   # 0.5, Flax's",
        ("linen.LSTMCell vs gradcells's default forget_bias=1",),
        "test_convention_24_no_forget_bias", kind="convention",
        test_file="tests/frameworks/test_audit_jax.py",
        shows=r"\[\[0\.731\d*\]\]\s+\[\[0\.5\]\]"),
    # Keras 3 (gradcells.audit.keras): 30-39
    Fault(
        30, "Keras's masked steps repeat the previous output (zeros before any); gradcells's "
        "seq_len gives zeros",
        "With `mask=` (right-padded ragged lengths) Keras's every-step output at a masked step "
        "is the previous step's output (zeros before the first unmasked step, which "
        "`go_backwards=True` puts first), as its RNN documentation says masked steps are "
        "skipped and carry the state and output; gradcells's outputs past `seq_len` are zeros. "
        "So a fully masked row (length 0) outputs zeros, and with `return_sequences=False` its "
        "output is zeros while its returned state is h0 (gradcells's final state for "
        "`seq_len=0`, which gradcells's last output is). The unmasked steps, the final states "
        "and the derivatives agree once the cotangent at a masked step is moved onto the "
        "output it repeats (gradients, second derivatives) and a masked step's tangent is the "
        "tangent it repeats (forward mode). On the PyTorch and JAX backends the masked rows "
        "compare at float32 tolerances (fault 32).",
        "import numpy as np, keras\n"
        "layer = keras.layers.SimpleRNN(1, return_sequences=True)\n"
        "x, mask = np.ones((1, 3, 1)), np.array([[True, False, False]])\n"
        "y = keras.ops.convert_to_numpy(layer(x, mask=mask))[0, :, 0]\n"
        "print(y[0] == y[1] == y[2] != 0)   # True; gradcells (seq_len=[1]): h, 0, 0",
        ("keras[tensorflow] LSTM masked forward vs gradcells",),
        "test_convention_30_masked_steps_repeat_the_previous_output", kind="convention",
        test_file="tests/frameworks/test_audit_keras.py",
        shows=r"True"),
    Fault(
        31, "Keras on JAX (lax.scan, unroll=False): masked steps before the first unmasked one "
        "output h0, not zeros",
        "With `go_backwards=True` (or a fully masked row, length 0) right-padded steps come "
        "before any unmasked one; there the JAX backend's `lax.scan` path (`unroll=False`) "
        "outputs the initial state h0 where its unrolled path and the TensorFlow and PyTorch "
        "backends output zeros (convention 30), so the same layer and weights give different "
        "outputs, and a gradient reaching h0 through them, by backend and `unroll`. A fully "
        "masked row's last output (`return_sequences=False`) is then h0 too. The rows compare "
        "at float32 tolerances (fault 32).",
        "# KERAS_BACKEND=jax (KERAS_BACKEND=tensorflow prints 0.0)\n"
        "import numpy as np, keras\n"
        "layer = keras.layers.GRU(1, return_sequences=True, go_backwards=True, unroll=False)\n"
        "x, mask, h0 = np.ones((1, 2, 1)), np.array([[True, False]]), np.ones((1, 1))\n"
        "print(float(layer(x, mask=mask, initial_state=[h0])[0, 0, 0]))   # 1.0: h0",
        ("keras[jax] LSTM masked forward vs gradcells",),
        "test_fault_31_jax_carries_h0_before_the_first_unmasked_step",
        test_file="tests/frameworks/test_audit_keras.py",
        shows=r"(?m)^1\.0$"),
    Fault(
        32, "Keras on JAX and PyTorch computes float64 layers in float32",
        "With `keras.config.set_floatx('float64')` the layers' weights and outputs are "
        "float64, but `keras.backend.result_type` maps float64 to float32 on every backend "
        "but TensorFlow (`BIT64_TO_BIT32_DTYPE`), and ops cast to it: on JAX `ops.tanh` "
        "(every layer), on PyTorch `ops.matmul` (the generic loop: masked layers, "
        "`GRU(reset_after=False)`, `SimpleRNN`; the fused LSTM and GRU paths are float64). "
        "The outputs and their first and second derivatives (reverse and forward mode) then "
        "match gradcells's float64 only to float32 round-off (|Δ| about 1e-8 to 1e-6), and the "
        "oracle's float64 differences of that forward are noise.",
        "# KERAS_BACKEND=jax JAX_ENABLE_X64=1 (and KERAS_BACKEND=torch)\n"
        "import keras\n"
        "keras.config.set_floatx('float64')\n"
        "print(keras.backend.result_type('float64', 'float64'))   # float32 unless tensorflow\n"
        "x = keras.ops.ones((2, 2), dtype='float64')\n"
        "print(keras.ops.matmul(x, x).dtype)     # jax: float64; torch: float32\n"
        "print(keras.ops.tanh(x).dtype)          # jax: float32; torch: float64",
        ("keras[jax] LSTM forward vs gradcells (layouts.lstm_from_keras)",),
        "test_fault_32_and_33_float64_computed_in_float32_on_jax",
        test_file="tests/frameworks/test_audit_keras.py",
        shows=r"float32\s+float64\s+float32"),
    Fault(
        33, "Keras on JAX: a float64 SimpleRNN with unroll=False raises in lax.scan",
        "The scan's carry enters as float64 and leaves as float32 (`ops.tanh`, fault 32), and "
        "`lax.scan` raises `TypeError: scan body function carry input and carry output must "
        "have equal types`; with `unroll=True` it runs (at float32 precision).",
        "# KERAS_BACKEND=jax JAX_ENABLE_X64=1\n"
        "import numpy as np, keras\n"
        "keras.config.set_floatx('float64')\n"
        "keras.layers.SimpleRNN(2)(np.ones((1, 3, 2)))   # TypeError: ... carry ... float32",
        ("keras[jax] SimpleRNN float64, unroll=False (lax.scan)",),
        "test_fault_32_and_33_float64_computed_in_float32_on_jax",
        test_file="tests/frameworks/test_audit_keras.py",
        shows=r"(?s)TypeError.*scan body function carry input and carry output must have equal"),
    # ONNX Runtime (gradcells.audit.onnxruntime): numbers 40-49
    Fault(
        40, "ONNX Runtime's LSTM does not clip Ct before h(Ct) (onnxruntime issue 27224)",
        "ONNX's `clip` bounds the input of every activation, `h(Ct)`'s included. With an "
        "active `clip`, ORT's LSTM outputs `Y`, `Y_h` miss a transcription of the ONNX "
        "equations (written with gradcells's reference math and equal to gradcells without "
        "the clip) by |Δ| of order 0.1, and equal it with `Ct` left unclipped before `h`; the "
        "gates' pre-activations are clipped as specified, and GRU and RNN agree. Reported "
        "upstream as microsoft/onnxruntime#27224 (closed as stale; fix PR #27239 open). "
        "gradcells's `cell_clip` clips the carried cell state, which is neither.",
        'import numpy as np, onnxruntime as ort\n'
        'from onnx import TensorProto as T, helper as oh\n'
        'node = oh.make_node("LSTM", ["X", "W", "R", "", "", "", "C0"], ["Y", "Y_h", "Y_c"],\n'
        '                    hidden_size=1, clip=1.0)\n'
        'ins = [oh.make_tensor_value_info(n, T.FLOAT, s) for n, s in\n'
        '       (("X", [1, 1, 1]), ("W", [1, 4, 1]), ("R", [1, 4, 1]), ("C0", [1, 1, 1]))]\n'
        'outs = [oh.make_tensor_value_info(n, T.FLOAT, None) for n in ("Y", "Y_h", "Y_c")]\n'
        'model = oh.make_model(oh.make_graph([node], "g", ins, outs),\n'
        '                      opset_imports=[oh.make_opsetid("", 22)], ir_version=10)\n'
        'f, z = np.float32, np.zeros((1, 4, 1), np.float32)\n'
        'y, y_h, y_c = ort.InferenceSession(model.SerializeToString()).run(None, {\n'
        '    "X": np.zeros((1, 1, 1), f), "W": z, "R": z, "C0": np.full((1, 1, 1), 5, f)})\n'
        'print(y_c, y_h)  # [[[2.5]]] [[[0.4933]]] = 0.5·tanh(2.5), unclipped\n'
        '# ONNX: i = f = o = σ(0) = 0.5, Ct = 0.5·5 = 2.5, Ht = 0.5·tanh(clip(2.5)) = 0.3808',
        ("LSTM clip vs the ONNX equations (transcription)",),
        "test_fault_40_lstm_clip_skips_the_cell_state",
        test_file="tests/frameworks/test_audit_onnxruntime.py",
        shows=r"\[\[\[2\.5\]\]\] \[\[\[0\.4933"),
    Fault(
        41, "ONNX Runtime's CPU LSTM, GRU and RNN refuse float64 (the spec allows it)",
        "The ONNX operators take `tensor(double)`; ORT's CPU `LSTM` and `GRU` build a "
        "session on float64 and raise at run time (`LSTM operator does not support double "
        "yet`), and `RNN` has no float64 kernel (`NOT_IMPLEMENTED: Could not find an "
        "implementation for RNN(22)`). The maintainers keep it so for binary size "
        "(microsoft/onnxruntime#28339). gradcells runs all three in float64.",
        "import numpy as np\n"
        "from gradcells.audit.onnxruntime import run_node     # one node, CPU provider\n"
        "z = np.zeros((1, 3, 1))                              # float64\n"
        "run_node('GRU', {'X': np.zeros((1, 1, 1)), 'W': z, 'R': z}, ['Y'], hidden_size=1)\n"
        "# RuntimeException: ... GRU operator does not support double yet",
        ("float64 inputs (LSTM, GRU, RNN)",),
        "test_fault_41_onnxruntime_refuses_float64",
        test_file="tests/frameworks/test_audit_onnxruntime.py",
        shows=r"GRU operator does not support double"),
    Fault(
        42, "ONNX Runtime's CPU LSTM, GRU and RNN refuse layout=1 (batch first)",
        "ONNX (opset 14 on) has `layout=1`: `X [B, T, I]`, states `[B, D, H]`, `Y [B, T, D, "
        "H]`. ORT's CPU kernels fail the session's initialisation: `layout_ == 0 was false. "
        "Batchwise recurrent operations (layout == 1) are not supported`. gradcells's "
        "`batch_first=True` is the same computation; the audit's row compares with it "
        "should ORT accept the attribute.",
        "import numpy as np\n"
        "from gradcells.audit.onnxruntime import run_node\n"
        "f = np.float32; z = np.zeros((1, 1, 1), f)\n"
        "run_node('RNN', {'X': z, 'W': z, 'R': z}, ['Y'], hidden_size=1, layout=1)\n"
        "# Fail: ... Batchwise recurrent operations (layout == 1) are not supported",
        ("layout=1 (batch first) vs gradcells batch_first=True (LSTM, GRU, RNN)",),
        "test_fault_42_onnxruntime_refuses_layout_1",
        test_file="tests/frameworks/test_audit_onnxruntime.py",
        shows=r"Batchwise recurrent operations \(layout == 1\) are not supported"),
    Fault(
        43, "a row of sequence length 0: ORT's Y_h and Y_c are zeros, not the initial state",
        "The ONNX spec does not say what `Y_h` holds for a row of length 0 (onnx/onnx#1674). "
        "ORT writes zeros there, as its ReverseSequence does (microsoft/onnxruntime#749, its "
        "tests since #28189), whatever `initial_h` / `initial_c` are; gradcells (PyTorch's "
        "and TensorFlow's convention) returns the initial state, the state after the row's "
        "last (no) step. Everything else agrees, `Y` is zero for the row in both.",
        "import numpy as np\n"
        "from gradcells.audit.onnxruntime import run_node\n"
        "f = np.float32; z = np.zeros((1, 1, 1), f)\n"
        "out = run_node('RNN', {'X': z, 'W': z, 'R': z, 'sequence_lens': np.zeros(1, np.int32),\n"
        "               'initial_h': np.ones((1, 1, 1), f)}, ['Y', 'Y_h'], hidden_size=1)\n"
        "print(out['Y_h'])          # [[[0.]]]; gradcells's h_final: the initial state, 1",
        ("LSTM sequence_lens with zeros: Y_h of an empty row",
         "GRU sequence_lens with zeros: Y_h of an empty row",
         "RNN sequence_lens with zeros: Y_h of an empty row"),
        "test_convention_43_zero_length_rows_end_in_zeros", kind="convention",
        test_file="tests/frameworks/test_audit_onnxruntime.py",
        shows=r"\[\[\[0\.\]\]\]"),
    Fault(
        50, "PyTorch has no forward-mode AD through pack_padded_sequence: no JVP of a packed "
        "nn.LSTM",
        "`torch.func.jvp` (and `torch.autograd.forward_ad`) of an `nn.LSTM` (or `nn.GRU`, "
        "`nn.RNN`) on a `PackedSequence` raises `NotImplementedError: Trying to use forward "
        "AD with _pack_padded_sequence that does not support it`; the same module unpacked "
        "agrees with the oracle's `check_jvp` and with gradcells's `lstm_stack_jvp`, and "
        "gradcells's `lstm_stack_jvp(seq_len=...)` gives the ragged tangent PyTorch cannot. "
        "A missing feature, not a wrong result: the row says fault 50 while PyTorch refuses "
        "and gradcells's ragged tangent passes the oracle's `check_jvp` of PyTorch's packed "
        "forward (the tangent refused exists), and compares with gradcells once PyTorch "
        "does not refuse.",
        "import torch\n"
        "from torch.nn.utils.rnn import pack_padded_sequence\n"
        "x = torch.ones(2, 1, 1)\n"
        "torch.func.jvp(lambda x: pack_padded_sequence(x, torch.tensor([2])).data, (x,), (x,))\n"
        "# NotImplementedError: Trying to use forward AD with _pack_padded_sequence that does "
        "not\n# support it because it has not been implemented yet.",
        ("nn.LSTM packed forward AD (torch.func.jvp)",),
        "test_fault_50_no_forward_ad_through_pack_padded_sequence",
        test_file="tests/frameworks/test_audit_torch.py",
        shows=r"NotImplementedError: Trying to use forward AD with _pack_padded_sequence"),
    Fault(
        60, "xLSTM's sLSTMCell.forward takes `lengths` and ignores them",
        "`sLSTMCell.forward(input, state=None, lengths=None)` never reads `lengths`: the "
        "outputs and the returned state are those of every step run, for every row, whatever "
        "the lengths (the audit's row: equal to gradcells without `seq_len`, |Δ| up to about "
        "1 against gradcells with it, in the padding and in the final state). A caller who "
        "passes a ragged batch's lengths gets the state after the padding, silently.",
        "# PYTHONWARNINGS=ignore\n"
        "import torch\n"
        "from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig\n"
        "cell = sLSTMCell(sLSTMCellConfig(hidden_size=4, num_heads=1, backend='vanilla',\n"
        "    dtype='float32', recurrent_weight_init='standard', bias_init='standard',\n"
        "    enable_automatic_mixed_precision=False))\n"
        "x = torch.randn(2, 5, 16)\n"
        "_, full = cell(x)\n"
        "_, short = cell(x, lengths=torch.tensor([1, 2]))\n"
        "print('lengths ignored:', torch.equal(full, short))   # True",
        ("sLSTMCell (vanilla) lengths vs gradcells (seq_len)",),
        "test_fault_60_lengths_are_ignored",
        test_file="tests/frameworks/test_audit_xlstm.py", shows=r"lengths ignored: True"),
    Fault(
        61, "xLSTM's sLSTMCell.step returns the state it was given, not the new one",
        "`sLSTMCell.step(input, state)` computes the step (its output equals gradcells's "
        "`h`) but returns `output, state` with the `state` argument unchanged (None when none "
        "was passed): the step's `c, n, m, h` are dropped, and a loop that feeds the returned "
        "state back runs every step from the first state.",
        "# PYTHONWARNINGS=ignore\n"
        "import torch\n"
        "from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig\n"
        "cell = sLSTMCell(sLSTMCellConfig(hidden_size=4, num_heads=1, backend='vanilla',\n"
        "    dtype='float32', enable_automatic_mixed_precision=False))\n"
        "state = torch.zeros(4, 2, 4)\n"
        "_, new = cell.step(torch.randn(2, 1, 16), state)\n"
        "print('state returned unchanged:', new is state)   # True",
        ("sLSTMCell (vanilla) step vs gradcells",),
        "test_fault_61_step_returns_the_state_given",
        test_file="tests/frameworks/test_audit_xlstm.py",
        shows=r"state returned unchanged: True"),
    Fault(
        62, "xLSTM's sLSTM starts from the zero state with m_1 = ĩ_1, for the whole batch",
        "When every `n` of the batch's state is 0 (`torch.all(n == 0.0)`, the state xLSTM "
        "starts from), the vanilla step takes `m_1 = ĩ_1` instead of "
        "`max(ĩ_1, log σ(f̃_1) + m_0)`. `h` agrees with the formula (the stabiliser cancels "
        "in `c/n`); `c`, `n` and `m` differ from it by the stabiliser's scale, and equal "
        "gradcells run from `m0 = -inf` (the audit's model). The test is batch-wide: a batch "
        "with any row's `n` nonzero takes the formula for every row. A documented convention "
        "(docs/spec.md §19), not a wrong `h`.",
        "# m_new = iraw if torch.all(n == 0.0) else torch.max(iraw, logsigmoid(fraw) + m)\n"
        "# (xlstm/blocks/slstm/src/vanilla/slstm.py, slstm_forward_pointwise)",
        ("sLSTMCell (vanilla) forward from the zero state vs gradcells",),
        "test_convention_62_zero_state_starts_from_the_input_gate", kind="convention",
        test_file="tests/frameworks/test_audit_xlstm.py"),
    Fault(
        70, "minGRU-pytorch's parallel mode returns NaN for a negative initial state, "
        "silently",
        "The parallel (log-space) minGRU concatenates `prev_hidden.log()` to its scan's "
        "values: a negative entry of the initial state gives NaN in that unit at every step, "
        "with no error. Its sequential mode and gradcells's two methods take any sign and "
        "agree (the audit's row: NaN exactly where `h0 < 0`, gradcells elsewhere to 1e-12). "
        "The paper's log-space form assumes positive states; the layer does not check them.",
        "# PYTHONWARNINGS=ignore\n"
        "import torch\n"
        "from minGRU_pytorch.minGRU import minGRU\n"
        "layer = minGRU(3)\n"
        "out = layer(torch.randn(1, 4, 3), -torch.ones(1, 1, 3))\n"
        "print('NaN:', bool(out.isnan().all()))   # True",
        ("minGRU parallel mode, h0 of either sign, vs gradcells",),
        "test_fault_70_parallel_mode_is_nan_for_a_negative_initial_state",
        test_file="tests/frameworks/test_mingru_pytorch.py", shows=r"NaN: True"),
    Fault(
        71, "minGRU-pytorch's minLSTM parallel mode starts from g(h0), not h0",
        "Given `prev_hidden`, the parallel minLSTM takes `log_g(prev_hidden)` as the log of "
        "its initial state, so it runs from `g(h0)` (`h0 + 0.5` for `h0 ≥ 0`, `σ(h0)` "
        "otherwise); its sequential mode, like the paper, runs from `h0`. The two modes "
        "differ at every step the initial state still weighs in (the audit's model: the "
        "sequential mode run from `g(h0)` equals the parallel one to 1e-12).",
        "# PYTHONWARNINGS=ignore\n"
        "import torch\n"
        "from minGRU_pytorch.minLSTM import minLSTM\n"
        "torch.manual_seed(0)\n"
        "layer = minLSTM(2).double()\n"
        "x, h0 = torch.randn(1, 3, 2).double(), torch.ones(1, 1, 2).double()\n"
        "parallel = layer(x, h0)\n"
        "h = h0\n"
        "for t in range(3):\n"
        "    h = layer(x[:, t:t + 1], h)\n"
        "print('modes differ:', not torch.allclose(parallel[:, -1:], h))   # True",
        ("minLSTM parallel mode vs its sequential mode",),
        "test_fault_71_minlstm_parallel_mode_starts_from_g_of_h0",
        test_file="tests/frameworks/test_mingru_pytorch.py", shows=r"modes differ: True"),
    Fault(
        80, "recurrentgemma's torch RG-LRU runs its scan in float32 whatever the input's "
        "dtype",
        "`rnn_scan` accumulates in `acc_dtype = torch.float32` (RGLRU.forward passes no other) "
        "and asserts that a given cache is float32: a float64 layer on float64 input returns "
        "float64 outputs rounded through float32 and a float32 final state, and its autograd "
        "carries float32's rounding too. The audit's rows: against gradcells's float64 "
        "forward and gradient they differ by float32's rounding (about 1e-7 relative) and "
        "agree to float32's tolerance (the model). float64 training, a float64 gradcheck or "
        "a float64 reference run are out of reach through the layer.",
        "# PYTHONWARNINGS=ignore\n"
        "import torch\n"
        "from recurrentgemma.torch.layers import RGLRU\n"
        "torch.manual_seed(0)\n"
        "layer = RGLRU(width=4, num_heads=2, dtype=torch.float64)\n"
        "y, last = layer(torch.randn(1, 3, 4, dtype=torch.float64), torch.arange(3)[None])\n"
        "print('output dtype:', y.dtype, '| final state dtype:', last.dtype)   # float32 state",
        ("RGLRU forward (float64) vs gradcells (rglru_sequence, resets)",
         "RGLRU autograd (float64) vs gradcells (rglru_sequence_grad)",
         "RGLRU autograd where its sqrt bound acts vs gradcells (rglru_sequence_grad)"),
        "test_fault_80_the_scan_runs_in_float32",
        test_file="tests/frameworks/test_audit_recurrentgemma.py",
        shows=r"final state dtype: torch\.float32"),
    Fault(
        81, "recurrentgemma's RG-LRU bounds the square root's derivative at 1000",
        "Its multiplier `sqrt(1 - a²)` goes through `SqrtBoundDerivative`, whose backward "
        "takes the derivative of `sqrt(z)` at `max(z, 1/(4·1000²))` (`_MAX_SQRT_GRADIENT`), "
        "to keep bfloat16 training from NaN: the gradient differs from the derivative where "
        "`1 - a² < 2.5e-7` (a tiny gate or `softplus(a_param)`, a very long memory). A "
        "documented convention (docs/spec.md §18.3): gradcells differentiates exactly by "
        "default and reproduces it with `sqrt_grad_bound=1000`, which "
        "`gc.layouts.rglru_from_recurrentgemma`'s options carry (the audit's model). Its JAX "
        "layer does the same: `sqrt_bound_derivative(1 - a_squared, 1000)`, a `jax.custom_vjp` "
        "whose backward is `jax.vjp(jnp.sqrt, jnp.maximum(x, 1 / (4 * max_gradient**2)))` "
        "(`recurrentgemma/jax/layers.py`), and the audit's JAX rows match the same model.",
        "# PYTHONWARNINGS=ignore\n"
        "import torch\n"
        "from recurrentgemma.torch.layers import SqrtBoundDerivative\n"
        "z = torch.tensor([1e-8], dtype=torch.float64, requires_grad=True)\n"
        "SqrtBoundDerivative.apply(z).backward()\n"
        "print('derivative of sqrt at 1e-8:', round(float(z.grad), 6))   # 1000.0, not 5000.0",
        ("RGLRU autograd (float64) vs gradcells (rglru_sequence_grad)",
         "RGLRU autograd where its sqrt bound acts vs gradcells (rglru_sequence_grad)",
         *(f"RGLRU (JAX, {scan}) {row}" for scan in ("LINEAR_NATIVE", "ASSOCIATIVE_NATIVE")
           for row in ("vjp (float64) vs gradcells (rglru_sequence_grad)",
                       "vjp where its sqrt bound acts vs gradcells (rglru_sequence_grad)",
                       "vjp (float32) vs gradcells (rglru_sequence_grad)")),
         "RGLRU (JAX, LINEAR_PALLAS) vjp (float32) vs gradcells"),
        "test_convention_81_the_sqrt_derivative_is_bounded_at_1000", kind="convention",
        test_file="tests/frameworks/test_audit_recurrentgemma.py",
        shows=r"derivative of sqrt at 1e-8: 1000\.0"),
    Fault(
        82, "recurrentgemma's JAX RG-LRU runs its scan in float32 whatever the input's dtype",
        "`scan.linear_scan` takes `acc_float_dtype: jnp.dtype = jnp.float32` and "
        "`RGLRU.__call__` (`recurrentgemma/jax/layers.py`) passes none: both scans a CPU runs "
        "(`lru_linear_scan`: `h_t = a_t.astype(acc_dtype) * h_prev + x_t.astype(acc_dtype)`, "
        "`h_out = h_t.astype(x.dtype)`; `lru_associative_scan`: `x = x.astype(acc_dtype)`, "
        "`a = a.astype(acc_dtype)`) accumulate in float32, and `get_acc_dtype` asserts that a "
        "given cache is float32 (`assert acc_float_dtype == h0.dtype`). With `jax_enable_x64` "
        "and a float64 layer on float64 input, every output is a float32 number held in "
        "float64, the final state is float32, and `jax.vjp` carries float32's rounding too. "
        "The JAX twin of torch's fault 80 (its own code, `recurrentgemma/jax/scan.py`). The "
        "audit's rows (float64, `LINEAR_NATIVE` and `ASSOCIATIVE_NATIVE`): against "
        "gradcells's float64 forward and gradient they differ by float32's rounding and agree "
        "to float32's tolerance (the model); its float32 rows agree with gradcells.",
        "# PYTHONWARNINGS=ignore\n"
        "import jax\n"
        "import jax.numpy as jnp\n"
        "from recurrentgemma.jax.layers import RGLRU\n"
        "with jax.enable_x64(True):\n"
        "    layer = RGLRU(width=4, num_heads=2, dtype=jnp.float64, param_dtype=jnp.float64)\n"
        "    x = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 4), jnp.float64)\n"
        "    pos = jnp.arange(3)[None]\n"
        "    y, last = layer.apply(layer.init(jax.random.PRNGKey(1), x, pos), x, pos)\n"
        "    print('output dtype:', y.dtype, '| final state dtype:', last.dtype)   # float32\n"
        "    print('outputs float32 numbers:', bool((y == y.astype(jnp.float32)).all()))",
        tuple(f"RGLRU (JAX, {scan}) {row}" for scan in ("LINEAR_NATIVE", "ASSOCIATIVE_NATIVE")
              for row in ("forward (float64) vs gradcells (rglru_sequence, resets)",
                          "vjp (float64) vs gradcells (rglru_sequence_grad)",
                          "vjp where its sqrt bound acts vs gradcells (rglru_sequence_grad)")),
        "test_fault_82_the_jax_scan_runs_in_float32",
        test_file="tests/frameworks/test_audit_recurrentgemma.py",
        shows=r"final state dtype: float32\noutputs float32 numbers: True"),
    Fault(
        90, "Mamba's selective_scan_ref computes in float32 whatever it is given",
        "`selective_scan_ref` casts `u`, `delta`, `delta_bias`, `B` and `C` to float32 "
        "(`.float()`) and returns `out` cast back to `u`'s dtype: float64 inputs (with a "
        "float32 `A`, the one float64 call it takes: fault 91) give a float64 `out` of "
        "float32 precision, and a float32 `last_state`. The audit's rows: against gradcells "
        "in float64 it misses by float32's rounding, and equals gradcells computed in "
        "float32; its float64 autograd fails the oracle's float64 differences of its own "
        "forward and equals gradcells's float32 gradients. A silent loss of precision, not "
        "a wrong formula: float32 against float32 it agrees.",
        "# out = selective_scan_ref(u.double(), delta.double(), A.float(), B.double(), "
        "C.double())\n"
        "# out.dtype == torch.float64, but every step ran in float32 (u = u.float(), ...;\n"
        "# out = out.to(dtype=dtype_in)): mamba_ssm/ops/selective_scan_interface.py",
        ("selective_scan_ref, float64 (A float32), vs gradcells (selective_scan)",
         "selective_scan_ref, every array float64",
         "selective_scan_ref autograd, float64 (A float32), vs oracle"),
        "test_fault_90_float64_is_computed_in_float32",
        test_file="tests/frameworks/test_audit_mamba.py"),
    Fault(
        91, "Mamba's selective_scan_ref raises for float64 arrays throughout",
        "With every array float64, `selective_scan_ref` raises `RuntimeError: expected "
        "scalar type Double but found Float` (or `Float but found Double`, by the path "
        "taken): `delta` was cast to float32 and meets the "
        "float64 `A` in `torch.einsum('bdl,dn->bdln', delta, A)` (where the einsum takes "
        "its batched-product path: most shapes; with a size-1 axis it promotes instead, and "
        "the call computes in float32: fault 90). A float64 model must keep `A` in float32 "
        "to call it. gradcells takes float64 throughout and agrees with the oracle.",
        "# selective_scan_ref(u, delta, A, B, C) with every tensor float64:\n"
        "# RuntimeError: expected scalar type Double but found Float",
        ("selective_scan_ref, every array float64",),
        "test_fault_91_float64_throughout_raises",
        test_file="tests/frameworks/test_audit_mamba.py"),
    Fault(
        100, "flash-linear-attention's naive_recurrent_hgrn computes in float32 whatever it is "
        "given, and returns the input's dtype",
        "The HGRN reference casts `x` and `g` to float32 (`i.float()`), runs the recurrence "
        "and its state in float32, and casts the output back: float64 inputs give a float64 "
        "tensor holding float32 results (errors near 1e-7 against gradcells's float64 "
        "`linear_scan`, where float64 agrees to 1e-12), and autograd's float64 gradients are "
        "float32 ones too. The audit's model, gradcells computing in float32, agrees "
        "within float32 tolerances. Its float32 forward and gradients agree with gradcells.",
        "# PYTHONWARNINGS=ignore\n"
        "import importlib.util, pathlib, torch\n"
        "import fla   # fla.ops imports Triton first; the reference is plain PyTorch\n"
        "spec = importlib.util.spec_from_file_location(\n"
        "    'naive', pathlib.Path(fla.__path__[0], 'ops', 'hgrn', 'naive.py'))\n"
        "naive = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(naive)\n"
        "x = torch.randn(1, 8, 2, dtype=torch.float64)\n"
        "g = -torch.rand(1, 8, 2, dtype=torch.float64)\n"
        "o, _ = naive.naive_recurrent_hgrn(x, g)\n"
        "h, exact = torch.zeros(1, 2, dtype=torch.float64), []\n"
        "for t in range(8):\n"
        "    h = g[:, t].exp() * h + x[:, t]\n"
        "    exact.append(h)\n"
        "error = (o - torch.stack(exact, 1)).abs().max().item()\n"
        "print(o.dtype, 'float32-sized error:', 1e-9 < error < 1e-5)   # torch.float64 True",
        ("HGRN naive_recurrent_hgrn, float64, vs gradcells (linear_scan)",
         "HGRN naive_recurrent_hgrn autograd, float64, vs oracle"),
        "test_fault_100_float64_is_computed_in_float32",
        test_file="tests/frameworks/test_fla.py", shows=r"torch.float64 float32-sized error: True"),
    Fault(
        101, "flash-linear-attention's naive_chunk_hgrn runs only when the sequence is one "
        "chunk long",
        "`naive_chunk_hgrn(x, g, chunk_size=64)` reshapes `g [B, T, D]` with "
        "`g.view(B, chunk_size, D)`: any `T` other than the chunk size raises PyTorch's "
        "shape error (`shape '[B, 64, D]' is invalid for input of size ...`), and its "
        "cumulative sum of `g` runs over the whole sequence rather than within each chunk, "
        "so the multi-chunk loop it is written for is never reached. At `T = 64` it equals "
        "`naive_recurrent_hgrn` (the audit's row). Its chunked Triton kernel is a separate "
        "code path, which the audit cannot run without a GPU.",
        "# PYTHONWARNINGS=ignore\n"
        "import importlib.util, pathlib, torch\n"
        "import fla   # fla.ops imports Triton first; the reference is plain PyTorch\n"
        "spec = importlib.util.spec_from_file_location(\n"
        "    'naive', pathlib.Path(fla.__path__[0], 'ops', 'hgrn', 'naive.py'))\n"
        "naive = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(naive)\n"
        "x, g = torch.randn(1, 128, 2), -torch.rand(1, 128, 2)\n"
        "try:\n"
        "    naive.naive_chunk_hgrn(x, g)\n"
        "except RuntimeError as error:\n"
        "    print('RuntimeError:', error)   # shape '[1, 64, 2]' is invalid ...",
        ("HGRN naive_chunk_hgrn, T = 100, vs naive_recurrent_hgrn",),
        "test_fault_101_chunked_reference_needs_one_chunk",
        test_file="tests/frameworks/test_fla.py", shows=r"RuntimeError: shape .* is invalid"),
)

FAULTS: dict[int, Fault] = {fault.number: fault for fault in _LIST}
"""Every known fault by its number."""


def _section(fault: Fault) -> list[str]:
    shown = (", ".join(f"`{c}`" for c in fault.checks) if fault.checks
             else "none (not checked by the audit)")
    test = f"`{fault.test_file}::{fault.test}`" if fault.test else "none"
    kind = "" if fault.kind == "fault" else " (a documented convention)"
    how = ("a script, which `tests/frameworks/test_faults.py` runs and whose output it checks"
           if fault.shows else "a description")
    return [f"## {fault.number}. {fault.title}{kind}", "", fault.evidence, "",
            f"Audit rows: {shown}.", "", f"Test: {test}.", "", f"Reproduction ({how}):", "",
            "```python", fault.reproduction, "```", ""]


def markdown() -> str:
    """``docs/faults.md``: every known fault with its evidence and reproduction."""
    lines = ["# Known faults", "",
             "The recurrent layers of the frameworks audited have these known faults (a wrong "
             "or missing result) and documented conventions (a result right by the "
             "framework's own definition that differs from gradcells's). "
             "`python -m gradcells audit <framework>` recognises each one it can run (a row "
             "`known fault N` or `convention N`), and a test shows each one against the "
             "oracle. Numbers 1-19 are TensorFlow's (and the seed's Python around its ops), "
             "20-29 Flax's, 30-39 Keras's, 40-49 ONNX Runtime's, 50-59 PyTorch's, "
             "60-69 xLSTM's, 70-79 minGRU-pytorch's, 80-89 recurrentgemma's, 90-99 Mamba's, "
             "100-109 flash-linear-attention's.", "",
             "This file is generated from `gradcells/audit/faults.py` by "
             "`python -c \"import gradcells.audit.faults as f; print(f.markdown(), end='')\" "
             "> docs/faults.md`; a test keeps it equal.", ""]
    for fault in _LIST:
        lines += _section(fault)
    return "\n".join(lines).rstrip() + "\n"
