# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 3. Clipping the cell state, and its gradient
#
# TensorFlow's LSTM block ops can clip the cell state to $[-C, C]$ (`cell_clip`). The
# forward is simple; the gradient is where TensorFlow goes wrong (docs/spec.md §6, fault 3):
# every one of its LSTM gradient ops passes the gradient through the clip as if it were not
# there.
# This notebook plots the loss along a line that crosses the clip boundary, against the
# slopes two gradients predict, and explains when the wrong one is still useful.

# %%
import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc

plt.rcParams.update({"figure.dpi": 80, "figure.figsize": (9, 3.4)})

# %% [markdown]
# ## The clip and its derivative
#
# With $\mathrm{cs}_{raw} = i\circ\mathrm{ci} + f\circ\mathrm{cs}_{prev}$ and
# $\mathrm{cs} = \operatorname{clip}(\mathrm{cs}_{raw}, -C, C)$,
#
# $$\frac{\partial\,\mathrm{cs}}{\partial\,\mathrm{cs}_{raw}} =
#   \begin{cases} 1 & |\mathrm{cs}_{raw}| < C \\ 0 & |\mathrm{cs}_{raw}| > C \end{cases}$$
#
# and at $|\mathrm{cs}_{raw}| = C$ the function has a kink: the two one-sided derivatives are 1
# and 0. gradcells takes 1 there (PyTorch's `clamp` convention; any value in $[0, 1]$ is a
# valid subgradient). So the exact backward pass masks the gradient where the clip was
# active:
#
# $$d_{cs,raw} = d_{cs}\circ \mathbb{1}\big[|\mathrm{cs}_{raw}| \le C\big]
#   \qquad (\texttt{clip\_grad="exact"}, \text{ the default})$$
#
# TensorFlow's kernels use $d_{cs,raw} = d_{cs}$ everywhere, which gradcells offers as
# `clip_grad="straight_through"`. Where no element is clipped the two agree; where one is, the
# straight-through gradient is the gradient of a *different* function: the cell without a clip,
# evaluated at the clipped state.

# %% [markdown]
# ## A line across the boundary
#
# Take one example ($B = 1$, $H = 3$), a random direction $v$ through all the inputs
# $\theta = (x, \mathrm{cs}_{prev}, h_{prev}, W, b)$, random cotangents, and the scalar
#
# $$\varphi(t) = L(\theta + t v), \qquad
#   L = \langle\bar{\mathrm{cs}}, \mathrm{cs}\rangle + \langle\bar h, h\rangle .$$
#
# Its slope is the directional derivative $\varphi'(t) = \langle\nabla L(\theta + t v), v\rangle$,
# so each gradient *predicts* a slope. We set $C$ to the largest $|\mathrm{cs}_{raw}|$ at $t = 0$,
# so that exactly one unit crosses the boundary there.

# %%
rng = np.random.default_rng(8)
case = gc.testing.lstm_cell_case(rng, batch=1, input_size=3, hidden=3)
names = ("x", "cs_prev", "h_prev", "w", "b")
theta = [case[k] for k in names]
v = [0.5 * rng.standard_normal(a.shape) for a in theta]
d_cs, d_h = rng.standard_normal((2, 1, 3))


def point(t):
    return [a + t * d for a, d in zip(theta, v)]


def cs_raw(t):
    st = gc.lstm_cell(*point(t))
    return st.i * st.ci + st.f * point(t)[1]


unit = int(np.argmax(np.abs(cs_raw(0.0))))
clip = float(np.abs(cs_raw(0.0))[0, unit])
print(f"cell_clip C = {clip:.4f}, reached by unit {unit} at t = 0")

# %% [markdown]
# $\varphi$, and the slope each gradient predicts:

# %%
def phi(t):
    st = gc.lstm_cell(*point(t), cell_clip=clip)
    return float(np.sum(d_cs * st.cs) + np.sum(d_h * st.h))


def predicted_slope(t, clip_grad):
    st = gc.lstm_cell(*point(t), cell_clip=clip)
    grads = gc.lstm_cell_grad(*point(t), st, d_h=d_h, d_cs=d_cs, cell_clip=clip,
                              clip_grad=clip_grad)
    return sum(float(np.vdot(g, d)) for g, d in zip(grads, v))


ts = np.linspace(-1, 1, 201)
raw = np.array([np.abs(cs_raw(t))[0] for t in ts])
others_clipped = np.delete(raw, unit, axis=1).max() > clip
print("another unit clipped somewhere on the line:", others_clipped)
values = np.array([phi(t) for t in ts])
measured = np.gradient(values, ts, edge_order=2)
exact = np.array([predicted_slope(t, "exact") for t in ts])
straight = np.array([predicted_slope(t, "straight_through") for t in ts])

# %%
active = raw[:, unit] > clip
fig, (left, right) = plt.subplots(1, 2)
for ax in (left, right):
    ax.fill_between(ts, 0, 1, where=active, color="0.9", transform=ax.get_xaxis_transform(),
                    label="clip active")
    ax.set_xlabel("t")
left.plot(ts, values, "k", label=r"$\varphi(t)$")
inside = np.flatnonzero(active)          # t0: half a unit inside the clipped stretch
t0 = ts[inside[0]] + 0.5 if active[-1] else ts[inside[-1]] - 0.5
span = np.linspace(t0 - 0.3, t0 + 0.3, 2)
for slopes, style, label in ((exact, "C0--", "exact tangent"),
                             (straight, "C3:", "straight-through tangent")):
    k = np.argmin(np.abs(ts - t0))
    left.plot(span, values[k] + slopes[k] * (span - t0), style, lw=2, label=label)
left.set_title("loss along the line")
left.legend(fontsize=8)
right.plot(ts, measured, "k", lw=3, alpha=0.35, label=r"measured $\varphi'$")
right.plot(ts, exact, "C0--", label="exact gradient")
right.plot(ts, straight, "C3:", lw=2, label="straight-through")
right.set_title("slope")
right.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Where the clip is inactive (white) the two predictions coincide with the measured slope.
# Where it is active (grey), the clipped unit's cell state is frozen at $C$: moving along $v$
# no longer changes it, and the measured slope jumps by that unit's contribution. The exact
# gradient jumps with it; the straight-through gradient goes on predicting the slope of the
# unclipped cell. Its tangent visibly leaves the curve.
#
# Numerically, away from the kink (the `np.gradient` estimate has an $O(\Delta t^2)$ error,
# and a large one in the two grid cells that straddle the kink):

# %%
away = np.abs(ts) > 0.02
print(f"max |measured - exact|            = {np.abs(measured - exact)[away].max():.1e}")
print(f"max |measured - straight-through| = {np.abs(measured - straight)[away].max():.1e}")

# %% [markdown]
# ## What the oracle says
#
# `gc.testing.lstm_cell_case(..., clip=True)` chooses a clip level that clips part of the cell
# state and stays at least $10^{-2}$ from every $|\mathrm{cs}_{raw}|$, so no finite-difference
# step crosses the kink. The exact gradient passes; the straight-through one fails, by
# errors of order one, wherever the gradient reaches an input through a clipped unit:

# %%
case = gc.testing.lstm_cell_case(np.random.default_rng(0), batch=4, clip=True, peephole=True)
print(f"cell_clip = {case['cell_clip']:.3f}")
for clip_grad in ("exact", "straight_through"):
    report = gc.testing.vjp_check("lstm_cell", case, clip_grad=clip_grad)
    print(f"\nclip_grad={clip_grad!r}\n{report}")

# %% [markdown]
# $W$'s $o$ columns, and $w_{co}$, pass even with the straight-through gradient: they are
# computed before the clip is reached in the backward pass. Everything behind it is wrong
# where it depends on a clipped unit: the elementwise $\mathrm{cs}_{prev}$ only in the
# clipped units' entries, the matmul-mixed $x$, $h_{prev}$ and the other columns of $W$
# almost everywhere.
#
# ## A wrong default on top
#
# TensorFlow's raw ops default to `cell_clip=3.0` (fault 2): a caller who passes nothing gets
# a clipped cell state, and with it fault 3's gradient. gradcells defaults to no clipping;
# only its TensorFlow mirrors (`gc.tf_compat`) keep 3.0, because they mirror the ops. How
# often does a cell state pass 3? With forget gates near 1 the cell integrates its inputs, so
# over a sequence it can grow well past that. One long run of a cell with a large forget bias:

# %%
rng = np.random.default_rng(1)
case = gc.testing.lstm_cell_case(rng, batch=64, input_size=8, hidden=16, forget_bias=3.0)
cs, h = np.zeros_like(case["cs_prev"]), np.zeros_like(case["h_prev"])
for _ in range(50):
    x = rng.standard_normal(case["x"].shape)
    st = gc.lstm_cell(x, cs, h, case["w"], case["b"], forget_bias=3.0)
    cs, h = st.cs, st.h
print(f"after 50 steps: {np.mean(np.abs(cs) > 3.0):.0%} of cell states exceed 3.0 in magnitude")

# %% [markdown]
# ## When might you still want the straight-through gradient?
#
# The exact gradient of a clipped unit is zero with respect to $i$, $\mathrm{ci}$, $f$ and
# $\mathrm{cs}_{prev}$. A unit that stays clipped receives no signal that would bring it back, as
# a ReLU with a negative input receives none. Passing the gradient straight through, as in
# straight-through estimators for quantised networks (Bengio et al., 2013), is a *surrogate*:
# a deliberate bias that keeps signal flowing through saturated units. Reproducing a model
# trained with TensorFlow's ops step for step is another honest reason.
#
# Either way it should be a choice, named as what it is: `clip_grad="straight_through"`. It is
# not the gradient, the oracle says so, and its error is not small: it is the whole
# contribution of every clipped unit.
