# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 7. The plain RNN cell, and why BPTT vanishes or explodes
#
# The plain (Elman) RNN cell is the smallest recurrent cell: one matmul and one
# nonlinearity. Its backward pass takes four lines, which makes it the clearest place to
# see the first step of backpropagation through time: the gradient carried from one step to
# the one before is multiplied by the step's Jacobian, and over many steps by a product of
# Jacobians. This notebook derives the backward line by line beside the code of
# `gradcells/cells/rnn/reference.py`, lets the oracle `gc.check_vjp` judge it, then follows the
# gradient back through time for a few spectral radii of $W_h$, with tanh and with relu.
#
# Every call names `backend="reference"`: the code shown is the reference's.

# %%
import inspect

import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc
from gradcells.cells.rnn import reference as ref

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
# ## The forward pass
#
# One weight matrix $W$ of shape $[I+H, H]$ (the rows for $x$, then the rows for
# $h_{prev}$; write them $W_x$ and $W_h$) and one bias $b$ of length $H$:
#
# $$z = [x,\ h_{prev}]\,W + b = x\,W_x + h_{prev}\,W_h + b, \qquad h = \mathrm{act}(z),
#   \qquad \mathrm{act} \in \{\tanh,\ \mathrm{relu}\}.$$
#
# This is PyTorch's `nn.RNNCell`, Keras' `SimpleRNN` and ONNX's `RNN`; `gc.layouts` converts
# their weights (`rnn_from_torch`, `rnn_to_keras`, `rnn_from_onnx`, ...), summing their two
# biases into $b$.

# %%
show(ref.rnn_cell, "z = xp.concatenate")
show(ref.rnn_activation, "return xp.tanh(z)")

rng = np.random.default_rng(7)
case = gc.testing.rnn_cell_case(rng, batch=3, input_size=4, hidden=5)
names = ("x", "h_prev", "w", "b")
args = tuple(case[k] for k in names)
x, h_prev, w, b = args
state = gc.rnn_cell(*args, **REF)
print("h:", state.h.shape, " recorded settings:", state.settings)

# %% [markdown]
# ## The backward pass, line by line
#
# Let $\bar h = \partial L/\partial h$ be the upstream gradient and
# $\bar z = \partial L/\partial z$. Since $h = \mathrm{act}(z)$ elementwise,
#
# $$\bar z = \bar h \circ \mathrm{act}'(z).$$
#
# Both derivatives can be written with the saved output $h$ instead of $z$, so the forward
# need keep nothing else: $\tanh'(z) = 1 - \tanh^2(z) = 1 - h^2$, and
# $\mathrm{relu}'(z) = 1$ where $z > 0$, which is where $h > 0$. At $z = 0$ relu has a
# kink; gradcells takes the slope there to be 0, as PyTorch does.

# %%
show(ref.rnn_preactivation_grad, "return d_h * (1 - h * h)", "return d_h * (h > 0)")

# %% [markdown]
# Next $z = [x, h_{prev}]\,W + b$ is a matmul. For $Z = A W$ the chain rule gives
# $\bar A = \bar Z\,W^\top$ and $\bar W = A^\top \bar Z$, and a bias broadcast over the
# batch sums its gradient over the batch:
#
# $$[\bar x,\ \bar h_{prev}] = \bar z\,W^\top, \qquad
#   \bar W = [x,\ h_{prev}]^\top\,\bar z, \qquad
#   \bar b = \textstyle\sum_{\text{batch}} \bar z.$$
#
# The first result is split by columns: the first $I$ are $\bar x$, the last $H$ are
# $\bar h_{prev}$.

# %%
show(ref.rnn_cell_grad, "dz = rnn_preactivation_grad", "dxh = dz @ w.T",
     "return RNNCellGrads(x=dxh")

# %% [markdown]
# ## The oracle's verdict
#
# `gc.check_vjp(f, vjp, args)` draws a random cotangent $\bar h$, computes
# $L = \langle \bar h, f(\text{args})\rangle$ and compares every gradient `vjp` returns
# with float64 central differences of $L$. Both activations (the relu case keeps every
# pre-activation away from the kink, where a difference quotient would mean nothing):

# %%
def pair(activation):
    def f(*arrays):
        return gc.rnn_cell(*arrays, activation=activation, **REF).h

    def vjp(d_h, *arrays):
        st = gc.rnn_cell(*arrays, activation=activation, **REF)
        return gc.rnn_cell_grad(*arrays, st, d_h=d_h, **REF)

    return f, vjp


for activation in ("tanh", "relu"):
    c = gc.testing.rnn_cell_case(np.random.default_rng(1), activation=activation)
    f, vjp = pair(activation)
    report = gc.check_vjp(f, vjp, tuple(c[k] for k in names), names=names)
    print(f"{activation}: passed={report.passed}, worst abs error {report.max_abs_error:.1e}")
    assert report.passed, "UNEXPECTED: the reference's gradient failed the oracle"

# %% [markdown]
# And a gradient with a plausible slip, $\tanh'(z)$ written as $1 - h$ instead of
# $1 - h^2$: every gradient that passes through $\bar z$ is wrong, and the oracle names them.

# %%
def vjp_slipped(d_h, *arrays):
    xs, hs, ws, _ = arrays
    h = np.tanh(np.concatenate([xs, hs], axis=1) @ ws + arrays[3])
    dz = d_h * (1 - h)                                   # the slip: should be 1 - h * h
    dxh = dz @ ws.T
    return (dxh[:, :xs.shape[1]], dxh[:, xs.shape[1]:],
            np.concatenate([xs, hs], axis=1).T @ dz, dz.sum(axis=0))


f, _ = pair("tanh")
slipped = gc.check_vjp(f, vjp_slipped, args, names=names)
print(slipped)
assert not slipped.passed, "UNEXPECTED: the oracle passed a wrong gradient"

# %% [markdown]
# ## The first step of backpropagation through time
#
# Over a sequence, $h_t = \mathrm{act}(x_t W_x + h_{t-1} W_h + b)$ with the same weights at
# every step. The state $h_t$ feeds the loss directly (upstream $\bar h_t^{\,\text{direct}}$)
# and through step $t+1$; the chain rule adds the two. One call of the cell's gradient
# turns the total into what goes one step further back:
#
# $$\bar z_t = \big(\bar h_t^{\,\text{direct}} + \bar h_t^{\,\text{carried}}\big)\circ
#   \mathrm{act}'(z_t), \qquad
#   \bar h_{t-1}^{\,\text{carried}} = \bar z_t\,W_h^\top .$$
#
# That is exactly the cell's $\bar h_{prev}$. Written with the cell, BPTT is a loop over
# `rnn_cell_grad`, summing the weight gradients of all steps:

# %%
def bptt_with_cells(x, h0, w, b, d_h, d_h_final, activation):
    """The RNN over x [T, B, I] and the gradients of L = Σ_t <d_h[t], h_t> + <d_h_final, h_T>."""
    saved, h = [], h0
    for t in range(len(x)):
        st = gc.rnn_cell(x[t], h, w, b, activation=activation, **REF)
        saved.append((h, st))
        h = st.h
    dx, dw, db, carry = np.zeros_like(x), np.zeros_like(w), np.zeros_like(b), d_h_final
    for t in reversed(range(len(x))):
        h_prev, st = saved[t]
        g = gc.rnn_cell_grad(x[t], h_prev, w, b, st, d_h=d_h[t] + carry, **REF)
        dx[t], dw, db, carry = g.x, dw + g.w, db + g.b, g.h_prev
    return dx, carry, dw, db


T, B, I, H = 10, 4, 3, 6
seq_case = gc.testing.rnn_sequence_case(rng, steps=T, batch=B, input_size=I, hidden=H)
xs, h0 = seq_case["x"], seq_case["h0"]
d_h, d_h_final = rng.standard_normal((T, B, H)), rng.standard_normal((B, H))
loop = bptt_with_cells(xs, h0, w := seq_case["w"], seq_case["b"], d_h, d_h_final, "tanh")
seq = gc.rnn_sequence(xs, h0, w, seq_case["b"], **REF)
fused = gc.rnn_sequence_grad(xs, h0, w, seq_case["b"], seq, d_h=d_h, d_h_final=d_h_final,
                             **REF)
for name, a, c in zip(("x", "h0", "w", "b"), loop, fused):
    print(f"d{name}: max |loop - rnn_sequence_grad| = {np.max(np.abs(a - c)):.1e}")

# %% [markdown]
# `rnn_sequence_grad` does the same with one large matmul for all steps' $\bar x$ and
# $\bar W$ after the backward loop; inside the loop only the carry remains:

# %%
show(ref.rnn_sequence_grad, "d_z[t] = rnn_preactivation_grad", "dh_next = keep(valid")

# %% [markdown]
# ## A product of Jacobians
#
# Unrolling the carry, the gradient that reaches $h_{T-k}$ from the last state is
#
# $$\bar h_{T-k} = \bar h_T\, J_T J_{T-1} \cdots J_{T-k+1}, \qquad
#   J_t = \frac{\partial h_t}{\partial h_{t-1}} = \mathrm{diag}\big(\mathrm{act}'(z_t)\big)\,
#   W_h^\top \quad(\text{as a right factor on row vectors}).$$
#
# $|\mathrm{act}'| \le 1$ for both activations, so the size of $W_h$ sets the scale: if
# all singular values of $W_h$ are $\rho$, each factor shrinks the gradient by at least
# $\rho$ times the largest slope, and with $\rho < 1$ the gradient from far back
# **vanishes** geometrically. With $\rho > 1$ it can **explode**, unless the activation's
# slopes pull it back down: tanh saturates when the state grows, $1 - h^2 \to 0$, while relu
# has slope exactly 1 on every unit that is on.
#
# Below, $W_h = \rho\,Q$ with $Q$ a random orthogonal matrix (every singular value, and the
# spectral radius, equal to $\rho$), small random inputs, and the norm of the carried
# gradient $\|\bar h_{T-k}\|$ (averaged over a batch of unit-norm $\bar h_T$) against the
# number of steps back $k$. The carry is read off the cell loop, one `rnn_cell_grad` per
# step.

# %%
def carried_norms(rho, activation, steps=60, batch=32, hidden=32, inputs=4, seed=0):
    """‖h̄_{T-k}‖ for k = 0..steps: the carry of BPTT from a unit-norm h̄_T, batch mean."""
    r = np.random.default_rng(seed)
    q, _ = np.linalg.qr(r.standard_normal((hidden, hidden)))
    w = np.concatenate([r.standard_normal((inputs, hidden)) * 0.1, rho * q])
    b = np.zeros(hidden)
    x = r.standard_normal((steps, batch, inputs))
    h = r.standard_normal((batch, hidden)) * 0.1
    saved = []
    for t in range(steps):
        st = gc.rnn_cell(x[t], h, w, b, activation=activation, **REF)
        saved.append((h, st))
        h = st.h
    carry = r.standard_normal((batch, hidden))
    carry /= np.linalg.norm(carry, axis=1, keepdims=True)
    norms = [1.0]
    for t in reversed(range(steps)):
        h_prev, st = saved[t]
        carry = gc.rnn_cell_grad(x[t], h_prev, w, b, st, d_h=carry, **REF).h_prev
        norms.append(float(np.linalg.norm(carry, axis=1).mean()))
    return np.array(norms)


RHOS = (0.5, 0.9, 1.0, 1.2, 1.5, 2.0)
norms = {(act, rho): carried_norms(rho, act) for act in ("tanh", "relu") for rho in RHOS}

fig, axes = plt.subplots(1, 2, sharey=True)
for ax, act in zip(axes, ("tanh", "relu")):
    for rho in RHOS:
        ax.semilogy(norms[act, rho], label=f"ρ = {rho}")
    ax.set_title(f"{act}: $W_h = ρQ$")
    ax.set_xlabel("steps back k")
    ax.grid(True, which="major", alpha=0.3)
axes[0].set_ylabel("‖h̄_{T-k}‖ (batch mean)")
axes[1].legend(fontsize=8, loc="lower left")
fig.tight_layout()
plt.show()

print("‖h̄_{T-k}‖ at k = 60, and the mean factor per step over the last 30 steps:")
def per_step(n):
    return (n[-1] / n[30]) ** (1 / 30)


for act in ("tanh", "relu"):
    print(f"  {act}: " + "  ".join(
        f"ρ={rho}: {norms[act, rho][-1]:.0e} (×{per_step(norms[act, rho]):.2f})"
        for rho in RHOS))
for act in ("tanh", "relu"):
    assert all(norms[act, rho][-1] < 1e-3 for rho in (0.5, 0.9, 1.0)), "UNEXPECTED: no vanishing"
    assert all(norms[act, rho][-1] > 10 for rho in (1.5, 2.0)), "UNEXPECTED: no explosion"
assert norms["relu", 2.0][-1] > 1e6 * norms["tanh", 2.0][-1], "UNEXPECTED: tanh as fast as relu"

# %% [markdown]
# What the picture shows:
#
# * **$\rho \le 1$ vanishes, with either activation.** Each step multiplies by at most
#   $\rho$ times the largest slope, and the slopes are mostly below 1 (tanh's $1 - h^2 < 1$;
#   relu's units that are off pass nothing), so even $\rho = 1$ decays: after 60 steps the
#   gradient from the first steps is a small fraction of one percent of the last one's, and
#   from $\rho = 0.5$ it is below $10^{-19}$. The early inputs have practically no say in
#   the gradient, which is why a plain RNN struggles to learn long-range dependencies.
# * **$\rho$ well above 1 explodes, relu much faster than tanh.** relu's slope is exactly 1
#   on every unit that is on, so the factor per step stays large (about 1.7 at $\rho = 2$);
#   tanh's state saturates as it grows and the slopes $1 - h^2$ shrink, which slows the
#   growth to about 1.2 per step at $\rho = 2$, but does not stop it here. The boundary
#   between vanishing and exploding lies somewhat above $\rho = 1$ for both (near 1.2 in
#   this draw).
#
# Gating (the LSTM's additive cell state, notebook 1; the GRU's interpolation, notebook 2)
# and gradient clipping (notebook 3) are the usual remedies; notebook 4 measures the same
# effect for the LSTM.
