# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 6. Auditing a framework
#
# How far can you trust a framework's fused recurrent ops? This notebook runs TensorFlow's
# LSTM and GRU block ops and PyTorch's `nn.LSTM` and `nn.GRU` against gradcells and the oracle,
# reproduces each of TensorFlow's known faults (docs/spec.md §6) that a CPU can show, and ends
# with a table of what agrees. TensorFlow and PyTorch are optional: a part whose framework is not
# installed is skipped, and the table says so.
#
# The method has two steps.
#
# 1. **Match the forward.** Run the framework's op and gradcells on the same inputs. If the
#    outputs agree to rounding, the two compute the same function, layout included.
# 2. **Check the gradient against the oracle.** `check_vjp(f, vjp, args)` with `f` the
#    forward, evaluated in float64, and `vjp` the framework's gradient. Where the framework
#    has no float64 (TensorFlow's block ops, fault 10) `f` is gradcells's forward, which step 1
#    showed to be the same function; the claimed float32 gradient is then held to float32
#    tolerances.

# %%
import os

import numpy as np

import gradcells as gc

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ log quiet
try:
    import tensorflow as tf
except ImportError:
    tf = None
try:
    import torch
except ImportError:
    torch = None

results = []


def needs(module, name):
    """True if the framework is installed; otherwise say so (and record the skip once)."""
    if module is None:
        print(f"{name} is not installed: this part is skipped")
        if (name, "(all checks)", "skipped: not installed") not in results:
            results.append((name, "(all checks)", "skipped: not installed"))
    return module is not None


def record(framework, check, agrees, fault=None):
    """Record one audit row: agreement, a known fault (docs/spec.md §6 number), or a surprise."""
    if agrees:
        verdict = "agrees" if fault is None else f"agrees (fault {fault} not seen)"
    else:
        verdict = f"known fault {fault}" if fault is not None else "UNEXPECTED mismatch"
    results.append((framework, check, verdict))
    print(f"{framework} | {check}: {verdict}")


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


print("TensorFlow:", tf.__version__ if tf else "absent", "  PyTorch:",
      torch.__version__ if torch else "absent")

# %% [markdown]
# ## TensorFlow: the LSTM block cell
#
# One float32 case with peephole vectors. `tf.raw_ops.LSTMBlockCell` takes the peepholes by
# name and returns `(i, cs, f, o, ci, co, h)`, like `gc.lstm_cell`.

# %%
rng = np.random.default_rng(0)
case = gc.testing.lstm_cell_case(rng, batch=4, input_size=3, hidden=4, dtype=np.float32,
                                 peephole=True)
x, cs_prev, h_prev, w, b, wci, wcf, wco = (case[k] for k in gc.testing.LSTM_ARG_NAMES)


def tf_lstm_cell(w, b, **attrs):
    return tf.raw_ops.LSTMBlockCell(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf,
                                    wco=wco, b=b, use_peephole=True, **attrs)

# %% [markdown]
# **Gate order (fault 1).** TensorFlow's op documentation says the four column blocks of
# `w` are i, f, ci, o; gradcells reads i, ci, f, o. If the documentation were right, TF's
# output would match gradcells given `w` with its middle blocks exchanged:

# %%
def swap_middle_blocks(a):
    i, ci, f, o = np.split(a, 4, axis=-1)
    return np.concatenate([i, f, ci, o], axis=-1)


if needs(tf, "TensorFlow"):
    ours = gc.lstm_cell(x, cs_prev, h_prev, w, b, wci=wci, wcf=wcf, wco=wco)
    as_documented = gc.lstm_cell(x, cs_prev, h_prev, swap_middle_blocks(w),
                                 swap_middle_blocks(b), wci=wci, wcf=wcf, wco=wco)
    theirs = tf_lstm_cell(w, b, cell_clip=0.0)
    print("max |TF - gradcells (i, ci, f, o)|:       ", max_diff(theirs.h, ours.h))
    print("max |TF - documented order (i, f, ci, o)|:", max_diff(theirs.h, as_documented.h))
    record("TensorFlow", "LSTMBlockCell forward = gradcells", max_diff(theirs.h, ours.h) < 1e-5)
    record("TensorFlow", "LSTMBlockCell documented gate order",
           max_diff(theirs.h, as_documented.h) < 1e-5, fault=1)

# %% [markdown]
# The kernel uses i, ci, f, o, agreeing with gradcells to float32 rounding; the
# documentation is wrong.
#
# **The default clip (fault 2).** A caller who passes no `cell_clip` gets 3.0. With a large
# previous cell state the output is clipped, though nobody asked:

# %%
if needs(tf, "TensorFlow"):
    big = 4 * cs_prev
    theirs = tf.raw_ops.LSTMBlockCell(x=x, cs_prev=big, h_prev=h_prev, w=w, wci=wci, wcf=wcf,
                                      wco=wco, b=b, use_peephole=True)
    print("max |cs| from TF with no cell_clip given:", float(np.max(np.abs(theirs.cs))))
    unclipped = gc.lstm_cell(x, big, h_prev, w, b, wci=wci, wcf=wcf, wco=wco)
    print("max |cs| without clipping:               ", float(np.max(np.abs(unclipped.cs))))
    record("TensorFlow", "LSTMBlockCell default cell_clip",
           max_diff(theirs.cs, unclipped.cs) < 1e-5, fault=2)

# %% [markdown]
# **The clip gradient (fault 3).** `tf.raw_ops.LSTMBlockCellGrad` returns the gate gradient
# `dicfo` and the gradients of `cs_prev` and the peepholes; TensorFlow's Python gradient
# function forms the rest from `dicfo` by matmuls. We wrap the raw op the same way, so the
# oracle sees TensorFlow's gradient for all eight inputs. The forward is gradcells's, in float64.
# `seed_wrapper=True` reproduces the seed's Python wrapper, which reads the inputs as
# `(wci, wco, wcf)` and then passes them as `(wci, wcf, wco)` (fault 4).

# %%
def tf_cell_vjp(cell_clip, seed_wrapper=False):
    def vjp(ct, x, cs_prev, h_prev, w, b, wci, wcf, wco):
        d_cs, d_h = ct
        i, cs, f, o, ci, co, _ = tf.raw_ops.LSTMBlockCell(
            x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b,
            cell_clip=cell_clip, use_peephole=True)
        if seed_wrapper:
            wcf, wco = wco, wcf
        cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad = (g.numpy() for g in
            tf.raw_ops.LSTMBlockCellGrad(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci,
                                         wcf=wcf, wco=wco, b=b, i=i, cs=cs, f=f, o=o, ci=ci,
                                         co=co, cs_grad=d_cs, h_grad=d_h, use_peephole=True))
        xh_grad = dicfo @ w.T
        n_in = x.shape[1]
        w_grad = np.concatenate([x, h_prev], axis=1).T @ dicfo
        return (xh_grad[:, :n_in], cs_prev_grad, xh_grad[:, n_in:], w_grad, dicfo.sum(axis=0),
                wci_grad, wcf_grad, wco_grad)
    return vjp


def cell_forward(cell_clip):
    def f(x, cs_prev, h_prev, w, b, wci, wcf, wco):
        st = gc.lstm_cell(x, cs_prev, h_prev, w, b, wci=wci, wcf=wcf, wco=wco,
                          cell_clip=cell_clip)
        return st.cs, st.h
    return f

# %% [markdown]
# First without clipping in effect (a clip level above every $|\mathrm{cs}|$), then with a clip
# level that clips part of the cell state (chosen at least $10^{-2}$ from every unclipped
# value, so the finite differences stay on one side of the kink):

# %%
if needs(tf, "TensorFlow"):
    args = tuple(case[k] for k in gc.testing.LSTM_ARG_NAMES)
    names = gc.testing.LSTM_ARG_NAMES
    report = gc.check_vjp(cell_forward(100.0), tf_cell_vjp(100.0), args, names=names)
    print(f"clip inactive: passed={report.passed}")
    record("TensorFlow", "LSTMBlockCellGrad, no clipping", report.passed)
    clipped = gc.testing.lstm_cell_case(np.random.default_rng(1), batch=4, input_size=3,
                                        hidden=4, dtype=np.float32, peephole=True, clip=True)
    clip = clipped["cell_clip"]
    args_c = tuple(clipped[k] for k in names)
    report = gc.check_vjp(cell_forward(clip), tf_cell_vjp(clip), args_c, names=names)
    print(f"clip active (cell_clip={clip:.3f}):\n{report}")
    record("TensorFlow", "LSTMBlockCellGrad with the clip active", report.passed, fault=3)

# %% [markdown]
# Every input behind the clip fails by errors of order one: TensorFlow passes the gradient
# straight through the clip (notebook 3). gradcells's `clip_grad="straight_through"`, and
# the mirror `gc.tf_compat.lstm_block_cell_grad` (which returns the op's own outputs:
# `cs_prev_grad`, the gate gradient and the peephole gradients), reproduce TensorFlow's
# numbers on purpose:

# %%
if needs(tf, "TensorFlow"):
    st = gc.lstm_cell(*args_c[:5], wci=args_c[5], wcf=args_c[6], wco=args_c[7], cell_clip=clip)
    d_cs, d_h = rng.standard_normal((2, 4, 4)).astype(np.float32)
    tf_grads = tf_cell_vjp(clip)((d_cs, d_h), *args_c)
    straight = gc.lstm_cell_grad(*args_c[:5], st, d_h=d_h, d_cs=d_cs, wci=args_c[5],
                                 wcf=args_c[6], wco=args_c[7], cell_clip=clip,
                                 clip_grad="straight_through")
    print("max |TF - gradcells straight_through| over all eight gradients:",
          max(max_diff(a, b) for a, b in zip(tf_grads, straight)))
    mirror = gc.tf_compat.lstm_block_cell_grad(*args_c[:4], *args_c[5:8], args_c[4], *st[:6],
                                               d_cs, d_h, True)
    print("max |TF - tf_compat mirror| over cs_prev and the peepholes:",
          max(max_diff(tf_grads[k], g) for k, g in
              zip((1, 5, 6, 7), (mirror.cs_prev_grad, *mirror[2:]))))

# %% [markdown]
# **The seed's peephole swap (fault 4).** TensorFlow 2 registers no gradient for
# `LSTMBlockCell` at all (fault 9; `tf.GradientTape` raises `LookupError`). The TensorFlow 1
# wrapper that the seed holds did register one, with `wcf` and `wco` exchanged on the way to
# the kernel. Emulating it:

# %%
if needs(tf, "TensorFlow"):
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = tf.raw_ops.LSTMBlockCell(x=xt, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci,
                                       wcf=wcf, wco=wco, b=b, use_peephole=True)
    try:
        tape.gradient(out[6], xt)
        record("TensorFlow", "gradient registered for LSTMBlockCell", True, fault=9)
    except LookupError as error:
        print("LookupError:", error)
        record("TensorFlow", "gradient registered for LSTMBlockCell", False, fault=9)
    report = gc.check_vjp(cell_forward(100.0), tf_cell_vjp(100.0, seed_wrapper=True), args,
                          names=names)
    print(report)
    record("TensorFlow", "seed's LSTMBlockCell gradient wrapper, peepholes", report.passed,
           fault=4)

# %% [markdown]
# With the swapped values, every gradient that depends on the *values* of $w_{cf}$ or $w_{co}$
# fails, $w_{ci}$'s too (through $d_i$, which sees the wrong $d_{cs}$). Only $w_{co}$'s own
# gradient, $\sum d_o\circ\mathrm{cs}$, depends on neither and passes.
#
# **Float64 (fault 10).** The block ops accept float16 and float32 only, so there is nothing
# to check them against in float64 but another implementation:

# %%
if needs(tf, "TensorFlow"):
    try:
        tf.raw_ops.LSTMBlockCell(**{k: case[k].astype(np.float64) for k in
                                    ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")})
        record("TensorFlow", "LSTMBlockCell in float64", True, fault=10)
    except tf.errors.InvalidArgumentError as error:
        print(str(error).splitlines()[0][:110])
        record("TensorFlow", "LSTMBlockCell in float64", False, fault=10)

# %% [markdown]
# ## TensorFlow: sequences
#
# `BlockLSTM` runs the cell over time with the same layout (i, ci, f, o); `BlockLSTMV2` takes the
# blocks as i, f, ci, o (Keras's order) and has no forget bias. Both have
# registered gradients; we check them through `tf.GradientTape`, with gradcells's sequence as the
# float64 forward (`gc.layouts.lstm_from_tf_v2` converts V2's weights).

# %%
T, B, I, H = 5, 4, 3, 4
seq_case = gc.testing.lstm_sequence_case(np.random.default_rng(2), steps=T, batch=B,
                                         input_size=I, hidden=H, dtype=np.float32)
zeros_h = np.zeros(H, np.float32)
seq_names = ("x", "cs0", "h0", "w", "b")
seq_args = tuple(seq_case[k] for k in seq_names)


def tape_vjp(op, **attrs):
    def vjp(d_h, x, cs0, h0, w, b):
        tensors = [tf.constant(a) for a in (x, cs0, h0, w, b)]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            xt, cs0t, h0t, wt, bt = tensors
            out = op(seq_len_max=np.int64(len(x)), x=xt, cs_prev=cs0t, h_prev=h0t, w=wt,
                     wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=bt, use_peephole=False, **attrs)
        return [g.numpy() for g in tape.gradient(out[6], tensors, output_gradients=d_h)]
    return vjp


def sequence_h(forget_bias, layout=None):
    def f(x, cs0, h0, w, b):
        if layout is not None:
            w, b = layout(w, b)
        return gc.lstm_sequence(x, cs0, h0, w, b, forget_bias=forget_bias).h
    return f

# %%
if needs(tf, "TensorFlow"):
    v1_forward = tf.raw_ops.BlockLSTM(
        seq_len_max=np.int64(T), x=seq_args[0], cs_prev=seq_args[1], h_prev=seq_args[2],
        w=seq_args[3], wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=seq_args[4], cell_clip=0.0,
        use_peephole=False)
    print("BlockLSTM forward, max |TF - gradcells|:",
          max_diff(v1_forward.h, sequence_h(1.0)(*seq_args)))
    report = gc.check_vjp(sequence_h(1.0), tape_vjp(tf.raw_ops.BlockLSTM, cell_clip=0.0),
                          seq_args, names=seq_names)
    print(f"BlockLSTM through GradientTape: passed={report.passed}")
    record("TensorFlow", "BlockLSTM gradient (GradientTape)", report.passed)
    w_v2, b_v2 = gc.layouts.lstm_to_tf_v2(seq_case["w"], seq_case["b"])
    v2_args = seq_args[:3] + (w_v2, b_v2)
    v2_forward = tf.raw_ops.BlockLSTMV2(
        seq_len_max=np.int64(T), x=v2_args[0], cs_prev=v2_args[1], h_prev=v2_args[2], w=w_v2,
        wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=b_v2, cell_clip=0.0, use_peephole=False)
    print("BlockLSTMV2 forward, max |TF - gradcells|:",
          max_diff(v2_forward.h, sequence_h(0.0, gc.layouts.lstm_from_tf_v2)(*v2_args)))
    report = gc.check_vjp(sequence_h(0.0, gc.layouts.lstm_from_tf_v2),
                          tape_vjp(tf.raw_ops.BlockLSTMV2, cell_clip=0.0), v2_args,
                          names=seq_names)
    print(report)
    record("TensorFlow", "BlockLSTMV2 gradient (GradientTape)", report.passed, fault=6)

# %% [markdown]
# V2's forward is right, and V1's gradient is right; V2's registered gradient calls the V1
# gradient op, which reads the gate blocks in V1's order, so every gradient is wrong. Any
# model differentiated through `BlockLSTMV2` with `tf.GradientTape` trains on these.
#
# **Uninitialised padding (fault 8).** With `seq_len_max` below $T$, `BlockLSTM` zeroes `cs`
# and `h` past `seq_len_max` but never writes `i, f, o, ci, co` there. Whatever the memory
# held shows through. We run it a few times after a full-length run has left values in
# freed memory, and count the non-zero entries past `seq_len_max` (what you see varies from
# run to run; it is undefined):

# %%
if needs(tf, "TensorFlow"):
    def block_lstm(steps):
        return tf.raw_ops.BlockLSTM(seq_len_max=np.int64(steps), x=seq_args[0],
                                    cs_prev=seq_args[1], h_prev=seq_args[2], w=seq_args[3],
                                    wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=seq_args[4],
                                    cell_clip=0.0, use_peephole=False)

    block_lstm(T)
    stale = 0
    for _ in range(5):
        out = block_lstm(2)
        stale += sum(np.count_nonzero(out[k].numpy()[2:]) for k in (0, 2, 3, 4, 5))
    print(f"non-zero gate entries past seq_len_max over 5 runs: {stale}")
    mirror = gc.tf_compat.block_lstm(np.int64(2), *seq_args[:4], zeros_h, zeros_h, zeros_h,
                                     seq_args[4], cell_clip=0.0)
    print("gc.tf_compat.block_lstm past seq_len_max: all zero =",
          not any(np.any(a[2:]) for a in mirror))
    record("TensorFlow", "BlockLSTM outputs past seq_len_max", stale == 0, fault=8)

# %% [markdown]
# ## TensorFlow: the GRU block cell
#
# The GRU op's docstring is wrong (notebook 2), but its code is right. The raw gradient op
# returns `d_x`, `d_h_prev` and the pre-activation gradients; the wrapper's weight gradients
# (which the seed's code gets right) are two matmuls:

# %%
gru_case = gc.testing.gru_cell_case(np.random.default_rng(3), batch=4, input_size=3,
                                    hidden=4, dtype=np.float32)
gru_names = gc.testing.GRU_ARG_NAMES
gru_args = tuple(gru_case[k] for k in gru_names)


def tf_gru_vjp(d_h, x, h_prev, w_ru, w_c, b_ru, b_c):
    r, u, c, _ = tf.raw_ops.GRUBlockCell(x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru,
                                         b_c=b_c)
    d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = (g.numpy() for g in tf.raw_ops.GRUBlockCellGrad(
        x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c, r=r, u=u, c=c, d_h=d_h))
    x_h_prev = np.concatenate([x, h_prev], axis=1)
    x_h_prevr = np.concatenate([x, h_prev * r.numpy()], axis=1)
    return (d_x, d_h_prev, x_h_prev.T @ d_r_bar_u_bar, x_h_prevr.T @ d_c_bar,
            d_r_bar_u_bar.sum(axis=0), d_c_bar.sum(axis=0))

# %%
if needs(tf, "TensorFlow"):
    theirs = tf.raw_ops.GRUBlockCell(**dict(zip(gru_names, gru_args)))
    print("GRUBlockCell forward, max |TF - gradcells|:",
          max_diff(theirs.h, gc.gru_cell(*gru_args).h))
    report = gc.check_vjp(lambda *a: gc.gru_cell(*a).h, tf_gru_vjp, gru_args, names=gru_names)
    print(report)
    record("TensorFlow", "GRUBlockCell forward = gradcells",
           max_diff(theirs.h, gc.gru_cell(*gru_args).h) < 1e-5)
    record("TensorFlow", "GRUBlockCellGrad", report.passed)

# %% [markdown]
# ## PyTorch
#
# PyTorch has float64, so here the oracle checks PyTorch's autograd against PyTorch's own
# forward, in PyTorch's own layout (`weight_ih [4H, I]`, `weight_hh [4H, H]`, two biases, gates
# i, f, g, o). Then gradcells is compared with it through `gc.layouts`, with `forget_bias=0`
# (PyTorch adds no constant to the forget gate).

# %%
def torch_sequence_fns(module):
    """(f, vjp) over (x, h0, [c0,] *parameters) for a one-layer torch RNN module."""
    params = [name for name, _ in module.named_parameters()]
    is_lstm = isinstance(module, torch.nn.LSTM)

    def run(*arrays, requires_grad=False):
        t = [torch.tensor(a, dtype=torch.float64, requires_grad=requires_grad) for a in arrays]
        state = (t[1][None], t[2][None]) if is_lstm else t[1][None]
        n_states = 2 if is_lstm else 1
        weights = dict(zip(params, t[1 + n_states:]))
        out, _ = torch.func.functional_call(module, weights, (t[0], state))
        return out, t

    def f(*arrays):
        return run(*arrays)[0].detach().numpy()

    def vjp(ct, *arrays):
        out, t = run(*arrays, requires_grad=True)
        grads = torch.autograd.grad(out, t, grad_outputs=torch.tensor(ct))
        return [g.numpy() for g in grads]

    return f, vjp

# %%
if needs(torch, "PyTorch"):
    torch.manual_seed(0)
    module = torch.nn.LSTM(I, H).double()
    weights = [p.detach().numpy().copy() for p in module.parameters()]
    x = seq_case["x"].astype(np.float64)
    c0, h0 = np.random.default_rng(4).standard_normal((2, B, H))
    f, vjp = torch_sequence_fns(module)
    torch_args = (x, h0, c0, *weights)
    report = gc.check_vjp(f, vjp, torch_args,
                          names=("x", "h0", "c0", "weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    print(report)
    record("PyTorch", "nn.LSTM autograd (float64)", report.passed)

    w, b = gc.layouts.lstm_from_torch(*weights)
    seq = gc.lstm_sequence(x, c0, h0, w, b, forget_bias=0.0)
    record("PyTorch", "nn.LSTM forward = gradcells", max_diff(seq.h, f(*torch_args)) < 1e-12)
    d_h = np.random.default_rng(5).standard_normal(seq.h.shape)
    ours = gc.lstm_sequence_grad(x, c0, h0, w, b, seq, d_h=d_h)
    g_x, g_h0, g_c0, g_wih, g_whh, g_bih, _ = vjp(d_h, *torch_args)
    g_w, g_b = gc.layouts.lstm_from_torch(g_wih, g_whh, g_bih, np.zeros_like(g_bih))
    worst = max(max_diff(ours.x, g_x), max_diff(ours.h0, g_h0), max_diff(ours.cs0, g_c0),
                max_diff(ours.w, g_w), max_diff(ours.b, g_b))
    print(f"max |gradcells - PyTorch| over every gradient: {worst:.1e}")
    record("PyTorch", "nn.LSTM gradient = gradcells", worst < 1e-12)

# %% [markdown]
# (The weight layouts are permutations and transposes, so a gradient converts like the weight
# itself. PyTorch's two biases receive the same gradient; `b` takes one of them.)
#
# PyTorch's GRU resets *after* the recurrent matmul, gradcells's `reset_after=True`:

# %%
if needs(torch, "PyTorch"):
    module = torch.nn.GRU(I, H).double()
    weights = [p.detach().numpy().copy() for p in module.parameters()]
    f, vjp = torch_sequence_fns(module)
    report = gc.check_vjp(f, vjp, (x, h0, *weights))
    record("PyTorch", "nn.GRU autograd (float64)", report.passed)
    gru_weights = gc.layouts.gru_from_torch(*weights)
    seq = gc.gru_sequence(x, h0, *gru_weights, reset_after=True)
    record("PyTorch", "nn.GRU forward = gradcells (reset_after)",
           max_diff(seq.h, f(x, h0, *weights)) < 1e-12)

# %% [markdown]
# ## What agrees
#
# Faults 5 (the GRU docstring, notebook 2) and 7 (a doubled peephole term in the GPU kernel)
# need no framework run here: one is text, the other needs a GPU.

# %%
width = max(len(check) for _, check, _ in results)
print(f"{'framework':11} {'check':{width}}  verdict")
print(f"{'-' * 11} {'-' * width}  {'-' * 30}")
for framework, check, verdict in results:
    print(f"{framework:11} {check:{width}}  {verdict}")

# %% [markdown]
# **Summary.** Forward results agree everywhere: TensorFlow and PyTorch compute the cells they
# claim to, once the layouts are right. PyTorch's gradients pass the oracle. TensorFlow's fail
# wherever a fault touches them: the clip (faults 2 and 3), the V2 gradient (6), the padding
# (8), and, in the seed's wrapper, the peepholes (4); the documentation misstates the gate
# order (1) and the GRU gradient (5). Apart from the seed's wrapper (fault 4), which had to
# be read to be emulated, none of this needed TensorFlow's source: a float64 forward and a
# finite-difference oracle found it from outside.
#
# The same checks, over many generated cases and with each mismatch compared against the
# model of its fault, are `python -m gradcells audit tensorflow` and
# `python -m gradcells audit torch`; only a mismatch that no known fault explains makes their
# exit status non-zero.
