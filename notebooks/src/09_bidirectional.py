# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 9. Bidirectional over a ragged batch
#
# A bidirectional recurrent layer reads its sequence twice: once forward, once backward, and
# concatenates the two at every step. Over a batch of sequences of different lengths, padded
# to a common T, the backward direction is where code goes wrong: reversing the *padded*
# array makes every short row start its backward pass on padding. PyTorch #517 and #3662,
# Flax #2170 and MXNet #19323 are this bug. This notebook shows the wrong states it gives,
# the per-row reversal that is right (`reverse=True`, docs/spec.md §11.1), that it is
# PyTorch's packed reverse direction, and the oracle checking a whole two-layer
# bidirectional stack (§11.4) in one call.

# %%
import importlib.util
import inspect

import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc
from gradcells import _order

plt.rcParams.update({"figure.dpi": 80, "figure.figsize": (9, 3.4)})
REF = {"backend": "reference"}


def show(func, *fragments):
    """Print the one source line of `func` that contains each fragment, with its line number."""
    lines, first = inspect.getsourcelines(func)
    path = inspect.getsourcefile(func).split("gradcells")[-1]
    for fragment in fragments:
        hits = [k for k, line in enumerate(lines) if fragment in line]
        assert len(hits) == 1, f"{fragment!r} found {len(hits)} times in {func.__name__}"
        print(f"gradcells{path}:{first + hits[0]}:  {lines[hits[0]].strip()}")

# %% [markdown]
# ## A ragged batch
#
# Four sequences of lengths 8, 5, 3 and 1, padded with zeros to T = 8, time-major
# (`[T, B, I]`), and one LSTM direction's weights. `seq_len` tells every sequence op which
# steps are real: past a row's length its outputs are zero and its state is frozen
# (PyTorch's packed-sequence semantics), and the padding is never read.

# %%
rng = np.random.default_rng(0)
T, B, I, H = 8, 4, 3, 5
lengths = np.array([8, 5, 3, 1])
x = rng.standard_normal((T, B, I)) * (np.arange(T)[:, None] < lengths)[:, :, None]
cs0, h0 = np.zeros((B, H)), np.zeros((B, H))
w = rng.standard_normal((I + H, 4 * H)) / np.sqrt(I + H)
b = 0.3 * rng.standard_normal(4 * H)
print("valid steps per row:", lengths)

# %% [markdown]
# ## The naive reversal, and its wrong states
#
# The tempting backward direction flips the padded array in time, runs forward, and flips
# the outputs back: `x[::-1]`. For the full row that is right. For a row of length L < T
# the flipped array starts with T - L steps of padding, and the run treats them as input:
# by the time it reaches the row's last real step, its state has already been through
# T - L steps of a zero input. Every output of that row is then wrong, and so is its final
# state, which is what a bidirectional encoder hands to the next stage.

# %%
def naive_backward(x):
    seq = gc.lstm_sequence(x[::-1], cs0, h0, w, b, **REF)   # lengths ignored: padding read
    return seq.h[::-1], seq.h_final


right = gc.lstm_sequence(x, cs0, h0, w, b, seq_len=lengths, reverse=True, **REF)
naive_h, naive_final = naive_backward(x)
valid = np.arange(T)[:, None] < lengths
error = np.abs(naive_h - right.h).max(axis=2) * valid
for row, length in enumerate(lengths):
    print(f"row {row} (length {length}): max |naive - right| over its steps = "
          f"{error[:, row].max():.3f}, final state off by "
          f"{np.abs(naive_final[row] - right.h_final[row]).max():.3f}")

# %%
fig, ax = plt.subplots()
im = ax.imshow(np.where(valid, error, np.nan).T, aspect="auto", cmap="magma_r")
ax.set_xlabel("time step t")
ax.set_ylabel("row (length 8, 5, 3, 1)")
ax.set_yticks(range(B))
ax.set_title("naive reversal: |h_naive - h_right| at each valid step (blank: padding)")
fig.colorbar(im)
plt.show()

# %% [markdown]
# Only the full-length row is right. The shorter the row, the more padding its backward
# direction read before its first real step.
#
# A test with zero biases and zero initial states would not see any of this: a zero input
# to a zero state with a zero bias gives `i = f = o = 1/2`, `ci = 0` and so `cs = h = 0`
# again, so the padding leaves the state where it was. Trained biases are not zero.
#
# ## The per-row reversal
#
# `reverse=True` runs each row over its own valid steps from last to first. Written as a
# loop over the public cell it is the forward loop with time descending, where row b runs
# at time t when t < L_b: so it starts from the initial state at its own last step, not at
# T - 1. `gradcells.testing.unrolled` holds that loop, and the sequence op equals it:

# %%
run = gc.testing.unrolled.lstm_forward(x, cs0, h0, w, b, seq_len=lengths, reverse=True, **REF)
print("max |sequence op - descending cell loop| =",
      float(np.abs(run.outputs["h"] - right.h).max()))

# %% [markdown]
# The sequence op runs it as a forward run of a reordered batch: the per-row time reversal
# $\pi_b(t) = L_b - 1 - t$ for $t < L_b$ (identity past the row's length, where nothing is
# read or written) puts each row's valid steps in reverse order at the start of the batch.
# A backend runs that forward with the same lengths, and $\pi$, which is its own inverse,
# puts the outputs back at their time positions. One line computes it:

# %%
show(_order._RunOrder.__init__, "source_time = xp.where")

# %% [markdown]
# ## PyTorch's packed reverse direction
#
# PyTorch gets this right with packed sequences, and gradcells's reverse direction is that
# direction exactly: the second half of a bidirectional `nn.LSTM`'s outputs, with the
# `_reverse` weights converted by `gc.layouts`. (This part needs PyTorch and is skipped
# without it; `tests/test_directions_torch.py` checks every gradient too.)

# %%
if importlib.util.find_spec("torch") is None:
    print("PyTorch is not installed: skipped")
else:
    import torch

    lstm = torch.nn.LSTM(I, H, bidirectional=True, dtype=torch.float64)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.from_numpy(x), torch.tensor(lengths))
    out, (h_n, _) = lstm(packed)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    conv = gc.layouts.stack_from_torch(lstm)
    reverse = gc.lstm_sequence(x, cs0, h0, *conv[1][:2], seq_len=lengths, reverse=True,
                               forget_bias=0.0, **REF)
    print("max |gradcells reverse - torch's reverse half| =",
          float(np.abs(reverse.h - out.detach().numpy()[..., H:]).max()))
    print("max |final states - torch's h_n[1]|          =",
          float(np.abs(reverse.h_final - h_n.detach().numpy()[1]).max()))

# %% [markdown]
# ## A whole two-layer bidirectional stack, checked in one call
#
# `gc.lstm_stack` composes the sequences: each layer's input is the layer below's two
# directions concatenated (forward first), times that boundary's dropout mask when one is
# given (explicit arrays: no random numbers inside, so the gradient is deterministic and
# checkable). Its gradient returns the input's, the initial states' and a list of weight
# gradients in the order of the weights. The oracle checks all of it against central
# differences at once: the function is the whole stack, the claimed vjp the whole gradient.

# %%
def stack_weights(rng, layers=2, n_in=I, hidden=H):
    weights = []
    for layer in range(layers):
        for _ in range(2):
            rows = (n_in if layer == 0 else 2 * hidden) + hidden
            weights.append(gc.LSTMWeights(rng.standard_normal((rows, 4 * hidden)) / np.sqrt(rows),
                                          0.1 * rng.standard_normal(4 * hidden)))
    return weights


weights = stack_weights(rng)
states0 = [0.5 * rng.standard_normal((4, B, H)) for _ in range(2)]       # cs0, h0 [L·D, B, H]
mask = [rng.integers(0, 2, (B, 2 * H)) / 0.75]                          # one boundary, 0/1
flat = [a for wt in weights for a in wt[:2]]


def unflatten(arrays):
    return [gc.LSTMWeights(arrays[2 * k], arrays[2 * k + 1]) for k in range(len(weights))]


def f(x, cs0, h0, *arrays):
    s = gc.lstm_stack(x, cs0, h0, unflatten(arrays), bidirectional=True, seq_len=lengths,
                      dropout_masks=mask, **REF)
    return s.h, s.h_final, s.cs_final


def vjp(ct, x, cs0, h0, *arrays):
    s = gc.lstm_stack(x, cs0, h0, unflatten(arrays), bidirectional=True, seq_len=lengths,
                      dropout_masks=mask, **REF)
    g = gc.lstm_stack_grad(x, cs0, h0, unflatten(arrays), s, d_h=ct[0], d_h_final=ct[1],
                           d_cs_final=ct[2], **REF)
    return (g.x, g.cs0, g.h0, *[a for wt in g.weights for a in wt[:2]])


names = ["x", "cs0", "h0"] + [f"{n}[{k}]" for k in range(4) for n in ("w", "b")]
report = gc.check_vjp(f, vjp, (x, *states0, *flat), names=names, samples=20)
print(report)

# %% [markdown]
# Every argument passes: the per-row reversal, the concatenation of the directions, the
# mask between the layers and the sums of the two directions' input gradients are all
# where the chain rule puts them.
#
# What the oracle cannot say is whether the function is the right one: a stack built on
# the naive reversal, with a gradient true to it, would pass too. That is what the
# comparisons above are for, against the descending cell loop and against PyTorch's packed
# sequences: the oracle vouches for the gradient, the conformance tests for the function.
