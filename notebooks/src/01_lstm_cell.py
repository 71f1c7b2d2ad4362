# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 1. The LSTM cell, forward and backward
#
# This notebook derives the gradient of one step of TensorFlow's LSTM block cell, one line
# at a time, puts each derived line beside the line of `gradcells/cells/lstm/reference.py` that
# computes it, and then lets the finite-difference oracle `gc.check_vjp` decide whether the
# derivation is right. The chain rule is all you need.
#
# We pass `backend="reference"` throughout, so that the code we check is the code we read.

# %%
import inspect

import numpy as np

import gradcells as gc
from gradcells.cells.lstm import reference as ref


def show(func, *fragments):
    """Print the one source line of `func` that contains each fragment, with its line number."""
    lines, first = inspect.getsourcelines(func)
    path = inspect.getsourcefile(func).split("gradcells")[-1]
    for fragment in fragments:
        hits = [k for k, line in enumerate(lines) if fragment in line]
        assert len(hits) == 1, f"{fragment!r} found {len(hits)} times in {func.__name__}"
        print(f"gradcells{path}:{first + hits[0]}:  {lines[hits[0]].strip()}")

# %% [markdown]
# ## The forward pass
#
# Notation: batch $B$, input size $I$, cell size $H$; $\sigma$ is the logistic sigmoid,
# $\circ$ the elementwise product, $[a, b]$ concatenation along features. Row vectors
# (biases, peephole weights) broadcast over the batch. The names are those of the code:
# $\mathrm{cs}$ is the cell state, $\mathrm{ci}$ the candidate ("cell input"), $\mathrm{co}$
# the squashed cell state ("cell output").
#
# $$G = [x,\ h_{prev}]\,W + b, \qquad
#   G = [G_i,\ G_c,\ G_f,\ G_o] \quad (\text{blocks of width } H)$$
#
# $$i = \sigma(G_i + \mathrm{cs}_{prev}\circ w_{ci}), \qquad
#   \mathrm{ci} = \tanh(G_c), \qquad
#   f = \sigma(G_f + b_f + \mathrm{cs}_{prev}\circ w_{cf})$$
#
# $$\mathrm{cs} = \operatorname{clip}_{[-C,\,C]}\big(i\circ \mathrm{ci}
#   + f\circ \mathrm{cs}_{prev}\big), \qquad
#   \mathrm{co} = \tanh(\mathrm{cs}), \qquad
#   o = \sigma(G_o + \mathrm{cs}\circ w_{co}), \qquad
#   h = o\circ \mathrm{co}$$
#
# $b_f$ is the `forget_bias` attribute (default 1), $C$ the optional `cell_clip`, and
# $w_{ci}, w_{cf}, w_{co}$ the optional peephole vectors. Note the order of the blocks:
# **i, ci, f, o**. TensorFlow's op documentation says i, f, ci, o; its kernel uses i, ci, f, o
# (docs/spec.md §6, fault 1), and so does gradcells.

# %%
rng = np.random.default_rng(2024)
case = gc.testing.lstm_cell_case(rng, batch=3, input_size=4, hidden=5, peephole=True)
x, cs_prev, h_prev, w, b = (case[k] for k in ("x", "cs_prev", "h_prev", "w", "b"))
wci, wcf, wco = case["wci"], case["wcf"], case["wco"]
peepholes = dict(wci=wci, wcf=wcf, wco=wco)

st = gc.lstm_cell(x, cs_prev, h_prev, w, b, **peepholes, backend="reference")
print({name: value.shape for name, value in st._asdict().items()})

# %% [markdown]
# The block order is visible from outside: recompute two of the gates from the columns of
# $W$ by hand, taking the blocks as i, ci, f, o.

# %%
G = np.concatenate([x, h_prev], axis=1) @ w + b
G_i, G_c, G_f, G_o = np.split(G, 4, axis=1)
sigmoid = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
print("ci = tanh(second block):    ", np.allclose(st.ci, np.tanh(G_c)))
print("f  = sigmoid(third block+1):", np.allclose(st.f, sigmoid(G_f + 1.0 + cs_prev * wcf)))

# %% [markdown]
# ## The backward pass
#
# A scalar loss $L$ depends on the step's outputs; the step receives the upstream gradients
# $\bar h = \partial L/\partial h$ (`d_h`) and
# $\overline{\mathrm{cs}} = \partial L/\partial \mathrm{cs}$ (`d_cs`, non-zero when the cell
# state feeds a later step) and must return $\partial L$ with respect to every input. Two
# derivatives are used throughout, written in terms of the saved outputs so that the
# backward pass never evaluates an exponential:
#
# $$\sigma'(z) = \sigma(z)\,(1-\sigma(z)), \qquad \tanh'(z) = 1 - \tanh^2(z).$$
#
# We name the gradient with respect to a gate's *pre-activation* after the gate: `do` is
# $\partial L/\partial(G_o + \mathrm{cs}\circ w_{co})$, and so on.

# %% [markdown]
# **Step 1: the output gate.** $h = o\circ\mathrm{co}$ gives
# $\partial L/\partial o = \bar h\circ\mathrm{co}$; through $o = \sigma(\cdot)$:
#
# $$d_o = \bar h\circ \mathrm{co}\circ o\,(1-o)$$

# %%
show(ref.lstm_gate_grads, "do = d_h")

# %% [markdown]
# **Step 2: the cell state.** $\mathrm{cs}$ reaches $L$ along three paths: through
# $\mathrm{co} = \tanh(\mathrm{cs})$ into $h$, directly (the upstream $\overline{\mathrm{cs}}$),
# and through the output gate's peephole $\mathrm{cs}\circ w_{co}$. The chain rule sums the paths:
#
# $$d_{cs} = \bar h\circ o\circ(1-\mathrm{co}^2) + \overline{\mathrm{cs}} + d_o\circ w_{co}$$

# %%
show(ref.lstm_gate_grads, "dco = d_h *", "dcs = d_cs +", "dcs = dco + dcs")

# %% [markdown]
# **Step 3: the clip.** With $\mathrm{cs} = \operatorname{clip}(\mathrm{cs}_{raw})$, the derivative
# is 1 where $|\mathrm{cs}_{raw}| \le C$ and 0 where the clip was active, so the gradient of
# the unclipped state is the masked one,
#
# $$d_{cs,raw} = d_{cs}\circ\mathbb{1}\left[|\mathrm{cs}_{raw}| \le C\right]$$
#
# (without clipping, $d_{cs,raw} = d_{cs}$; the code overwrites `dcs` with it). The saved
# $\mathrm{cs}$ is already clipped, so the mask is recomputed from the saved gates with the
# forward's own expression. (Notebook 3 is about this line and why TensorFlow gets it wrong.)

# %%
show(ref.lstm_gate_grads, "clip_pass_mask(state")
show(ref.clip_pass_mask, "cs_raw =", "return abs")

# %% [markdown]
# **Step 4: input gate, candidate, forget gate.** All three enter only through
# $\mathrm{cs}_{raw} = i\circ\mathrm{ci} + f\circ\mathrm{cs}_{prev}$:
#
# $$d_i = d_{cs,raw}\circ\mathrm{ci}\circ i(1-i), \qquad
#   d_{ci} = d_{cs,raw}\circ i\circ(1-\mathrm{ci}^2), \qquad
#   d_f = d_{cs,raw}\circ \mathrm{cs}_{prev}\circ f(1-f)$$

# %%
show(ref.lstm_gate_grads, "di = dcs *", "dci = dcs *", "df = dcs *")

# %% [markdown]
# **Step 5: the previous cell state.** $\mathrm{cs}_{prev}$ appears in $f\circ\mathrm{cs}_{prev}$
# and in the peephole terms of the $i$ and $f$ pre-activations:
#
# $$\frac{\partial L}{\partial \mathrm{cs}_{prev}}
#   = d_{cs,raw}\circ f + d_i\circ w_{ci} + d_f\circ w_{cf}$$
#
# The first term is the one that carries gradients across many steps: it is multiplied by
# $f$ at every step (notebook 4).

# %%
show(ref.lstm_gate_grads, "dcs_prev = dcs * f", "dcs_prev = dcs_prev + ")

# %% [markdown]
# **Step 6: the peephole weights.** A peephole vector multiplies every row of the batch, so
# its gradient is summed over the batch; the output peephole sees the *new* cell state:
#
# $$\frac{\partial L}{\partial w_{ci}} = \sum_{batch} d_i\circ\mathrm{cs}_{prev}, \qquad
#   \frac{\partial L}{\partial w_{cf}} = \sum_{batch} d_f\circ\mathrm{cs}_{prev}, \qquad
#   \frac{\partial L}{\partial w_{co}} = \sum_{batch} d_o\circ\mathrm{cs}$$

# %%
show(ref.lstm_gate_grads, "dwci = (", "dwcf = (", "dwco = (")

# %% [markdown]
# **Step 7: the matmul.** $d_G = [d_i, d_{ci}, d_f, d_o]$ in the same block order as the
# columns of $W$. For $G = A\,W + b$ with $A = [x, h_{prev}]$:
#
# $$\frac{\partial L}{\partial A} = d_G\,W^\top, \qquad
#   \frac{\partial L}{\partial W} = A^\top d_G, \qquad
#   \frac{\partial L}{\partial b} = \sum_{batch} d_G,$$
#
# and $\partial L/\partial A$ splits into its $x$ part ($d_G W_x^\top$, with $W_x$ the first
# $I$ rows of $W$) and its $h_{prev}$ part ($d_G W_h^\top$). (The layer-normalised LSTM of
# notebook 08 puts a layer norm between each part and $G$; then the two parts get different
# gradients, $d_{z_x}$ and $d_{z_h}$, which is why the code names them apart.)

# %%
show(ref.lstm_gate_grads, "d_gates = xp.concatenate")
show(ref.lstm_cell_grad, "dz_x = dz_h = gg.gates", "x=dz_x @ w[:n_in].T", "w=xp.concatenate(")

# %% [markdown]
# ## Checking the derivation
#
# A derivation on paper is a claim. The oracle tests it: for random cotangents
# $\bar{\mathrm{cs}}, \bar h$ it forms the scalar
# $L = \langle\bar{\mathrm{cs}}, \mathrm{cs}\rangle + \langle\bar h, h\rangle$,
# whose gradient is exactly what `lstm_cell_grad` returns for `d_cs`, `d_h`, and compares every
# entry with a central difference computed in float64,
#
# $$\frac{\partial L}{\partial \theta_j}
#   \approx \frac{L(\theta + \delta e_j) - L(\theta - \delta e_j)}{2\delta},
#   \qquad \delta = \sqrt[3]{\varepsilon}\,\max(1, |\theta_j|).$$
#
# (Notebook 5 explains that step size, and why the oracle divides by the distance
# $(\theta_j + \delta) - (\theta_j - \delta)$ as rounded rather than by $2\delta$.) `f` maps
# the inputs to the outputs; `vjp` maps a cotangent and the inputs to one gradient per input.

# %%
names = ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")
args = (x, cs_prev, h_prev, w, b, wci, wcf, wco)


def step(x, cs_prev, h_prev, w, b, wci, wcf, wco):
    return gc.lstm_cell(x, cs_prev, h_prev, w, b, wci=wci, wcf=wcf, wco=wco, backend="reference")


def f(*args):
    state = step(*args)
    return state.cs, state.h


def vjp(ct, x, cs_prev, h_prev, w, b, wci, wcf, wco):
    d_cs, d_h = ct
    state = step(x, cs_prev, h_prev, w, b, wci, wcf, wco)
    grads = gc.lstm_cell_grad(x, cs_prev, h_prev, w, b, state, d_h=d_h, d_cs=d_cs,
                              wci=wci, wcf=wcf, wco=wco, backend="reference")
    return tuple(getattr(grads, name) for name in names)  # the gradients are named as the inputs


report = gc.check_vjp(f, vjp, args, names=names)
print(report)

# %% [markdown]
# Every entry of every gradient passes. The absolute errors, around $10^{-11}$, are the
# accuracy of the finite differences themselves (the relative error is largest on the
# smallest entries).
#
# ## What a wrong line looks like
#
# Drop one term: forget that $\mathrm{cs}$ also reaches $L$ through the output peephole
# (step 2 without $d_o\circ w_{co}$). We do it by handing the gradient a zero $w_{co}$, which
# removes exactly that term.

# %%
def vjp_missing_term(ct, x, cs_prev, h_prev, w, b, wci, wcf, wco):
    d_cs, d_h = ct
    state = step(x, cs_prev, h_prev, w, b, wci, wcf, wco)
    grads = gc.lstm_cell_grad(x, cs_prev, h_prev, w, b, state, d_h=d_h, d_cs=d_cs,
                              wci=wci, wcf=wcf, wco=np.zeros_like(wco), backend="reference")
    return tuple(getattr(grads, name) for name in names)


print(gc.check_vjp(f, vjp_missing_term, args, names=names))

# %% [markdown]
# The table localises the fault. Every input whose gradient flows through $d_{cs}$ fails;
# $w_{co}$ passes, because $\partial L/\partial w_{co} = \sum d_o\circ\mathrm{cs}$ does not
# involve $d_{cs}$; and of the 180 entries of $W$, the 45 in the $o$ block pass, since $d_o$
# is still right. A bug on one path shows up in exactly the gradients that depend on it.
#
# ## With clipping, and on the default backend
#
# `gc.testing.lstm_cell_case(..., clip=True)` draws a `cell_clip` that clips part of the
# cell state while keeping every unclipped value at least 0.01 away from the boundary (a
# difference quotient across the kink would be meaningless: notebook 5).
# `gc.testing.vjp_check` wraps the `f`/`vjp` pair written above. Here it runs on the default
# backend for NumPy arrays, over a few random cases with and without peepholes and clipping.

# %%
for seed in range(4):
    case = gc.testing.lstm_cell_case(np.random.default_rng(seed), peephole=seed % 2 == 1,
                                     clip=seed >= 2)
    report = gc.testing.vjp_check("lstm_cell", case)
    clip = "none " if case["cell_clip"] is None else f"{case['cell_clip']:.3f}"
    print(f"seed {seed}: peephole={case['wci'] is not None!s:5}  cell_clip={clip}"
          f"  passed={report.passed}  worst abs err={report.max_abs_error:.1e}")

# %% [markdown]
# **Summary.** Each gradient line is one application of the chain rule to one forward line;
# sums appear where a value is used more than once ($\mathrm{cs}$, $\mathrm{cs}_{prev}$) or
# broadcast over the batch (biases, peepholes), and transposed matmuls undo the one matmul.
# The oracle checks all of it with nothing but evaluations of the forward pass.
