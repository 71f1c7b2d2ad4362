# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 4. Backpropagation through time
#
# A recurrent network applies one cell $T$ times with the same weights. Its gradient is the
# cell's gradient (notebooks 1 and 2) applied $T$ times backwards, with the state's gradient
# carried from step to step. This notebook writes that loop, checks it against
# `gc.lstm_sequence_grad` and the oracle, measures how gradients with respect to earlier steps
# vanish or explode, and shows per-example sequence lengths.

# %%
import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc

plt.rcParams.update({"figure.dpi": 80, "figure.figsize": (9, 3.4)})

# %% [markdown]
# ## The loop
#
# The forward pass is
# $(\mathrm{cs}_t, h_t) = \mathrm{cell}(x_t, \mathrm{cs}_{t-1}, h_{t-1};\ W, b)$ for
# $t = 0, \dots, T-1$. The loss may read every $h_t$ and $\mathrm{cs}_t$ and the final
# states.
# Walking back, the state after step $t$ receives gradient from two places, the loss directly
# and step $t+1$, and the chain rule adds them:
#
# $$\bar h_t \leftarrow \frac{\partial L}{\partial h_t}\Big|_{\text{direct}}
#   + \frac{\partial L}{\partial h_t}\Big|_{\text{via step } t+1},
#   \qquad
#   \overline{\mathrm{cs}}_t
#   \leftarrow \frac{\partial L}{\partial \mathrm{cs}_t}\Big|_{\text{direct}}
#   + \frac{\partial L}{\partial \mathrm{cs}_t}\Big|_{\text{via step } t+1}.$$
#
# (The loss below reads only the $h_t$ and the final $h$, so its direct $\mathrm{cs}$ terms
# are zero; the library's `d_cs` and `d_cs_final` are those terms.)
#
# One call of `lstm_cell_grad` with these upstream gradients returns the step's contribution
# to $\partial L/\partial x_t$, the gradients to carry to step $t-1$ (its `cs_prev`, `h_prev`),
# and the step's share of $\partial L/\partial W$ and $\partial L/\partial b$. The weights are
# shared by all steps, so their gradient is the sum of the shares.

# %%
def bptt_with_cells(x, cs0, h0, w, b, d_h, d_h_final):
    """The LSTM over x [T, B, I], and the gradients of
    L = Σ_t <d_h[t], h_t> + <d_h_final, h_{T-1}> (h_{T-1}: the final state)."""
    saved, cs, h = [], cs0, h0
    for t in range(len(x)):
        state = gc.lstm_cell(x[t], cs, h, w, b)
        saved.append((cs, h, state))
        cs, h = state.cs, state.h
    dx, dw, db = np.zeros_like(x), np.zeros_like(w), np.zeros_like(b)
    carry_cs, carry_h = np.zeros_like(cs0), d_h_final
    for t in reversed(range(len(x))):
        cs_prev, h_prev, state = saved[t]
        g = gc.lstm_cell_grad(x[t], cs_prev, h_prev, w, b, state,
                              d_h=d_h[t] + carry_h, d_cs=carry_cs)
        dx[t], dw, db = g.x, dw + g.w, db + g.b
        carry_cs, carry_h = g.cs_prev, g.h_prev
    return dx, carry_cs, carry_h, dw, db

# %% [markdown]
# The library's `lstm_sequence_grad` computes the same sum with a better plan: the input part
# of every step's pre-activations is one large matmul $[x_0; \dots; x_{T-1}]\,W_x$, and after the
# backward loop $\partial L/\partial x$ and $\partial L/\partial W$ are single large matmuls over
# all steps; per step only $h_{t-1} W_h$ and its transpose remain. Same numbers, up to rounding:

# %%
rng = np.random.default_rng(0)
T, B, I, H = 12, 4, 3, 6
case = gc.testing.lstm_sequence_case(rng, steps=T, batch=B, input_size=I, hidden=H)
x, cs0, h0, w, b = (case[k] for k in ("x", "cs0", "h0", "w", "b"))
d_h, d_h_final = rng.standard_normal((T, B, H)), rng.standard_normal((B, H))

loop = bptt_with_cells(x, cs0, h0, w, b, d_h, d_h_final)
seq = gc.lstm_sequence(x, cs0, h0, w, b)
lib = gc.lstm_sequence_grad(x, cs0, h0, w, b, seq, d_h=d_h, d_h_final=d_h_final)
for name, ours, theirs in zip(("x", "cs0", "h0", "w", "b"), loop, lib):
    print(f"{name:4} max |loop - lstm_sequence_grad| = {np.max(np.abs(ours - theirs)):.1e}")

# %% [markdown]
# And the oracle, on a sequence with peepholes, clipping and per-example lengths, through all
# four outputs ($h_t$, $\mathrm{cs}_t$ and both final states):

# %%
case = gc.testing.lstm_sequence_case(np.random.default_rng(3), steps=5, peephole=True,
                                     clip=True, ragged=True)
print("seq_len =", case["seq_len"], "  cell_clip =", case["cell_clip"])
print(gc.testing.vjp_check("lstm_sequence", case))

# %% [markdown]
# ## Vanishing and exploding gradients
#
# How much does the loss at the last step depend on the input $k$ steps earlier? The carried
# gradient is multiplied by one step's Jacobian per step. Along the cell state alone that
# Jacobian is diagonal,
# $\partial\mathrm{cs}_t/\partial\mathrm{cs}_{t-1} = \operatorname{diag}(f_t)$ (step 5 of
# notebook 1), so that path scales as $\prod f$ over the $k$ steps: it vanishes
# geometrically unless the forget gates stay near 1. This is why the forget gate is biased
# towards 1 at initialisation (`forget_bias`, default 1; Gers et al. 2000, Jozefowicz et al.
# 2015). The path through $h_{t-1} W_h$ multiplies by the recurrent weights, whose scale can make
# it shrink or grow.
#
# We measure $\|\partial L/\partial x_{T-1-k}\|$ for $L = \langle \bar h, h_{T-1}\rangle$,
# $T = 100$, with weights $\sim \mathcal N(0, s^2/(I+H))$.

# %%
T, B, I, H = 100, 16, 8, 32


def gradient_norms(forget_bias, scale, seed=0):
    """||dL/dx_t|| for t = T-1, T-2, ..., 0 (lag 0 first), L reading only the last h."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I))
    w = scale * rng.standard_normal((I + H, 4 * H)) / np.sqrt(I + H)
    b, zeros = np.zeros(4 * H), np.zeros((B, H))
    seq = gc.lstm_sequence(x, zeros, zeros, w, b, forget_bias=forget_bias)
    grads = gc.lstm_sequence_grad(x, zeros, zeros, w, b, seq,
                                  d_h_final=rng.standard_normal((B, H)))
    mean_f = float(seq.f.mean())
    return np.linalg.norm(grads.x.reshape(T, -1), axis=1)[::-1], mean_f

# %%
by_bias = {fb: gradient_norms(fb, 1.0) for fb in (-2.0, 0.0, 1.0, 3.0, 6.0)}
by_scale = {s: gradient_norms(1.0, s) for s in (0.5, 1.0, 2.0, 4.0, 8.0)}
for label, runs in (("forget_bias", by_bias), ("weight scale", by_scale)):
    for value, (norms, mean_f) in runs.items():
        print(f"{label} {value:4g}: mean f {mean_f:.2f},"
              f"  ||dL/dx|| 99 steps back / at the last step = {norms[-1] / norms[0]:.1e}")

# %%
fig, (left, right) = plt.subplots(1, 2)
lags = np.arange(T)
for fb, (norms, mean_f) in by_bias.items():
    left.semilogy(lags, norms, label=f"forget_bias {fb:g} (mean f {mean_f:.2f})")
for scale, (norms, _) in by_scale.items():
    right.semilogy(lags, norms, label=f"weight scale {scale:g}")
left.set_title("weight scale 1")
right.set_title("forget_bias 1")
for ax in (left, right):
    ax.set_xlabel("k (steps before the loss)")
    ax.set_ylabel(r"$\|\partial L / \partial x_{T-1-k}\|$")
    ax.legend(fontsize=7)
plt.tight_layout()
plt.show()

# %% [markdown]
# With forget biases of 0 or less the gradient from 99 steps back is $10^{-15}$ or less of the
# gradient at the last step: the network cannot learn a dependence that long, whatever the
# data. Biases of 3 or more keep $f$ near 1 and the signal alive; the gradient even grows
# slowly with $k$, since many paths now add up. The weight scale sets the rate too: small
# weights shrink the signal at every step, and at scale 8 it grows by about seven orders of
# magnitude: the exploding regime, where practitioners clip the *gradient's* norm (not the
# cell state).
#
# ## Per-example lengths
#
# A batch often holds sequences of different lengths padded to $T$. With `seq_len` (integers in
# $[0, T]$), row $b$ runs steps $0, \dots, $ `seq_len[b]` $- 1$ and stops: its later outputs are
# zero and its state is frozen, so `h_final` is the state after its own last step (PyTorch's
# packed-sequence semantics); its padding in `x` is never read. In the backward pass a frozen step
# passes the carried gradient through unchanged. So each row's gradient equals that of its own
# unpadded sequence, run alone:

# %%
T, B, I, H = 30, 6, 4, 8
case = gc.testing.lstm_sequence_case(np.random.default_rng(4), steps=T, batch=B,
                                     input_size=I, hidden=H, forget_bias=2.0)
x, cs0, h0, w, b = (case[k] for k in ("x", "cs0", "h0", "w", "b"))
seq_len = np.array([30, 24, 17, 9, 3, 0])
d_h_final = np.random.default_rng(5).standard_normal((B, H))
seq = gc.lstm_sequence(x, cs0, h0, w, b, forget_bias=2.0, seq_len=seq_len)
grads = gc.lstm_sequence_grad(x, cs0, h0, w, b, seq, d_h_final=d_h_final, seq_len=seq_len)

for row, n in enumerate(seq_len):
    alone = gc.lstm_sequence(x[:n, row:row + 1], cs0[row:row + 1], h0[row:row + 1], w, b,
                             forget_bias=2.0)
    g = gc.lstm_sequence_grad(x[:n, row:row + 1], cs0[row:row + 1], h0[row:row + 1], w, b,
                              alone, d_h_final=d_h_final[row:row + 1])
    same_final = np.allclose(seq.h_final[row], alone.h_final[0], rtol=0, atol=1e-14)
    same_dx = np.allclose(grads.x[:n, row], g.x[:, 0], rtol=0, atol=1e-14)
    print(f"row {row}: seq_len {n:2}  h_final as alone: {same_final}  dx as alone: {same_dx}"
          f"  dx past its length all zero: {not grads.x[n:, row].any()}")

# %%
magnitude = np.linalg.norm(grads.x, axis=2).T  # [B, T]
with np.errstate(divide="ignore"):
    image = np.log10(np.where(magnitude > 0, magnitude, np.nan))
fig, ax = plt.subplots(figsize=(8, 2.6))
shown = ax.imshow(image, aspect="auto", cmap="viridis", interpolation="nearest")
ax.scatter(seq_len - 0.5, np.arange(B), marker="|", s=300, color="red", label="seq_len")
ax.set_xlabel("step t")
ax.set_ylabel("example")
ax.set_title(r"$\log_{10}\|\partial L/\partial x_t\|$, loss on the final state (blank: exactly 0)")
fig.colorbar(shown, ax=ax)
ax.legend(loc="lower right", fontsize=8)
plt.show()

# %% [markdown]
# Each row's gradient is largest at its own last step and decays backwards from there; past
# its length it is exactly zero, and the example of length 0 returns its initial state, whose
# gradient is the upstream one:

# %%
print("row 5 (length 0): d h0 == d_h_final:", np.array_equal(grads.h0[5], d_h_final[5]))

# %% [markdown]
# **Summary.** BPTT is the cell's gradient in a loop, with the state's gradient carried back
# and the shared weights' gradients summed; a library does the same arithmetic with fewer,
# larger matmuls. The product of per-step Jacobians makes gradients with respect to early
# steps vanish or explode; the forget gate's additive path, biased open, is what lets an LSTM
# carry them. Padding is handled by freezing finished rows, which makes each row's gradient
# that of its own sequence.
