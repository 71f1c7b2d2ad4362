# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 5. Finite differences done right
#
# The oracle trusts one thing: a difference quotient of the forward pass. This notebook shows
# how accurate that quotient can be, why the oracle computes it in float64 with the step
# $\sqrt[3]{\varepsilon}$, why a check along one random direction is cheap and still strong,
# and why no difference quotient may straddle a kink.

# %%
import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc

plt.rcParams.update({"figure.dpi": 80, "figure.figsize": (7, 3.8)})

# %% [markdown]
# ## Two errors that pull in opposite directions
#
# Taylor's theorem gives, for a smooth $\varphi$,
#
# $$\frac{\varphi(t+h) - \varphi(t)}{h} = \varphi'(t) + \frac{h}{2}\varphi''(t) + O(h^2), \qquad
#   \frac{\varphi(t+h) - \varphi(t-h)}{2h} = \varphi'(t) + \frac{h^2}{6}\varphi'''(t) + O(h^4).$$
#
# That is the **truncation** error, which shrinks with $h$. But $\varphi$ is computed in floating
# point with a relative error of about $\varepsilon$ (the machine epsilon), and the difference of
# two nearly equal values keeps that absolute error while the quotient divides it by $h$: a
# **round-off** error of about $\varepsilon|\varphi|/h$, which grows as $h$ shrinks. For the
# central difference the sum $\tfrac{h^2}{6}|\varphi'''| + \varepsilon|\varphi|/h$ is smallest at
#
# $$h^\ast = \Big(\frac{3\varepsilon|\varphi|}{|\varphi'''|}\Big)^{1/3} \sim \sqrt[3]{\varepsilon},
#   \qquad \text{error}(h^\ast) \sim \varepsilon^{2/3},$$
#
# and for the forward difference at $h^\ast \sim \sqrt{\varepsilon}$ with error
# $\sim\varepsilon^{1/2}$.

# %%
for dtype in (np.float32, np.float64):
    eps = np.finfo(dtype).eps
    print(f"{np.dtype(dtype).name}: eps = {eps:.1e}   cbrt(eps) = {np.cbrt(eps):.1e}"
          f"   eps^(2/3) = {eps ** (2 / 3):.1e}   sqrt(eps) = {np.sqrt(eps):.1e}")

# %% [markdown]
# ## Measured on an LSTM cell
#
# Take $\varphi(t) = L(\theta + t v)$ for one LSTM cell, a random direction $v$ through all
# inputs and random cotangents. The exact slope $\varphi'(0) = \langle\nabla L, v\rangle$ comes
# from the analytic gradient in float64 (checked in notebook 1). Evaluating $\varphi$ in float32
# or float64, we measure the relative error of both quotients over fifteen decades of $h$.

# %%
rng = np.random.default_rng(5)
case = gc.testing.lstm_cell_case(rng, batch=4, input_size=6, hidden=8, peephole=True)
names = ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")
theta = [case[k] for k in names]
v = [rng.standard_normal(a.shape) for a in theta]
d_cs, d_h = rng.standard_normal((2, 4, 8))


def lstm(x, cs_prev, h_prev, w, b, wci, wcf, wco):
    return gc.lstm_cell(x, cs_prev, h_prev, w, b, wci=wci, wcf=wcf, wco=wco)


def phi(t, dtype=np.float64):
    st = lstm(*[(a + t * d).astype(dtype) for a, d in zip(theta, v)])
    return np.sum(d_cs * st.cs, dtype=np.float64) + np.sum(d_h * st.h, dtype=np.float64)


grads = gc.lstm_cell_grad(*theta[:5], lstm(*theta), d_h=d_h, d_cs=d_cs,
                          wci=theta[5], wcf=theta[6], wco=theta[7])
exact = sum(float(np.vdot(g, d)) for g, d in zip(grads, v))
print(f"phi'(0) = {exact:.12f}")

# %%
steps = np.logspace(-15, 0, 61)
errors = {}
for dtype in (np.float32, np.float64):
    p0 = phi(0.0, dtype)
    central = np.array([(phi(h, dtype) - phi(-h, dtype)) / (2 * h) for h in steps])
    forward = np.array([(phi(h, dtype) - p0) / h for h in steps])
    errors[np.dtype(dtype).name] = (np.abs(central - exact) / abs(exact),
                                    np.abs(forward - exact) / abs(exact))

# %%
fig, ax = plt.subplots()
for (name, (central, forward)), color in zip(errors.items(), ("C3", "C0")):
    eps = np.finfo(name).eps
    ax.loglog(steps, np.maximum(central, 1e-17), color=color, label=f"{name} central")
    ax.loglog(steps, np.maximum(forward, 1e-17), color=color, ls=":", label=f"{name} forward")
    ax.axvline(np.cbrt(eps), color=color, lw=0.8, ls="--")
    ax.text(np.cbrt(eps), 3e-15, r" $\sqrt[3]{\varepsilon}$", color=color)
ax.set_xlabel("step h")
ax.set_ylabel("relative error of the quotient")
ax.set_ylim(1e-15, 1e2)
ax.legend(fontsize=8, loc="lower left", ncol=2)
ax.set_title("truncation (right) against round-off (left)")
plt.show()

# %% [markdown]
# Each curve is a V: to the right of its minimum the truncation error falls with $h$ (slope 2
# on log axes for the central difference, slope 1 for the forward one); to the left the
# round-off error rises as $1/h$, ragged because it is rounding noise. (Below $h \approx 10^{-10}$
# the float32 step is lost entirely when added to $\theta$: the quotient is 0, a relative
# error of 1.) The minima sit where the analysis puts them, within a decade of
# $\sqrt[3]{\varepsilon}$ for the
# central difference:

# %%
for name, (central, forward) in errors.items():
    best = np.argmin(central)
    eps = np.finfo(name).eps
    at_cbrt = np.argmin(np.abs(steps - np.cbrt(eps)))
    print(f"{name}: best central error {central[best]:.1e} at h = {steps[best]:.0e};"
          f"  at h = cbrt(eps): {central[at_cbrt]:.1e};  best forward: {forward.min():.1e}")

# %% [markdown]
# ## Why the oracle works in float64
#
# In float32 the best a difference quotient does here is a relative error of a few $10^{-6}$, and
# only at a step found by scanning; at the step chosen in advance, $\sqrt[3]{\varepsilon}$, it is
# about twenty times worse, and on other functions worse still. A gradient bug whose effect is
# smaller than that is invisible, and a test tolerance must sit above it. In float64 the quotient is
# good to about $10^{-10}$, so the oracle can demand agreement to a relative $10^{-7}$ (a
# thousandfold margin over its own noise) and catch any error larger than that.
#
# So `check_vjp` evaluates `f` on float64 copies of the arguments whatever their dtype, and
# compares with the claimed gradient at a tolerance set by the *gradient's* dtype: a float32
# gradient is allowed a relative $10^{-3}$ (float32 round-off, with room for its accumulation
# through a whole forward and backward pass) against a float64 reference.

# %%
for dtype, (rtol, atol) in gc.oracle.DEFAULT_TOLERANCES.items():
    print(f"{dtype.name:8} gradient: pass if |analytic - numeric| <= {atol:g} + {rtol:g}·|numeric|")

# %%
case32 = gc.testing.lstm_cell_case(np.random.default_rng(0), dtype=np.float32, peephole=True)
print(gc.testing.vjp_check("lstm_cell", case32))

# %% [markdown]
# ## Two details of the step
#
# **Scale.** The step is relative to the argument: $h = \sqrt[3]{\varepsilon}\cdot\max(1, |a_j|)$.
# The balance above was struck for an argument of size about 1. For a function that varies on
# the scale of its argument, an entry of size $10^4$ moves the whole V four decades to the
# right: an absolute step of $6\cdot10^{-6}$ would sit far down its round-off side, with an
# error thousands of times the scaled step's. For $e^{a/10^4}$ at $a = 10^4$:

# %%
def quotient_error(f, derivative, a, h):
    a_plus, a_minus = a + h, a - h
    return abs((f(a_plus) - f(a_minus)) / (a_plus - a_minus) - derivative) / abs(derivative)


a = 1e4
cbrt_eps = np.cbrt(np.finfo(np.float64).eps)
for label, h in [("absolute step", cbrt_eps), ("scaled step  ", cbrt_eps * a)]:
    error = quotient_error(lambda v: np.exp(v / 1e4), np.e / 1e4, a, h)
    print(f"{label} h = {h:.1e}: relative error {error:.1e}")

# %% [markdown]
# **The step actually taken.** $a_j + h$ is rounded, so the distance between the two evaluation
# points is not exactly $2h$. The oracle divides by the representable difference
# $(a_j + h) - (a_j - h)$, which floating point computes exactly once $|a_j| \ge 3h$ (Sterbenz's
# lemma) and to within one rounding nearer 0. The discrepancy it removes is
# of order $\varepsilon|a_j|/h$, the size of the whole error budget at $h = \sqrt[3]{\varepsilon}$:

# %%
eps = np.finfo(np.float64).eps
a = np.random.default_rng(0).uniform(1, 100, 100_000)
h = np.cbrt(eps) * a
taken = (a + h) - (a - h)
print(f"largest relative difference between 2h and the step taken: "
      f"{np.max(np.abs(taken - 2 * h) / (2 * h)):.1e}")

# %% [markdown]
# ## The round-off floor
#
# The round-off in the analysis above is that of the outputs. How it reaches the quotient
# depends on where the differencing happens. Differencing $L = \sum_k\langle\bar y_k,
# y_k\rangle$ as one number rounds every term, so a large output spoils the quotient of every
# argument, even one that does not move it: $L$ is known only to about $\varepsilon$ times the
# sum of its terms' magnitudes. The oracle instead differences each output on its own and
# then weighs the differences, $\langle\bar y, f(a + h) - f(a - h)\rangle$: an output the step
# does not move contributes exactly zero. Here is $f(a, b) = (10^5 a, b)$ with its exact VJP,
# both ways, at the plain tolerance:

# %%
a, b = np.array([0.3, -1.2, 0.8]), np.array([0.5, 0.1, -0.7])
exact = lambda ct, a, b: (1e5 * ct[0], ct[1])  # noqa: E731
eps = np.finfo(np.float64).eps
failing_sum = 0
for seed in range(20):
    ct_a, ct_b = np.random.default_rng(seed).standard_normal((2, 3))   # the oracle's draws
    for j in range(3):
        h = np.cbrt(eps) * max(1.0, abs(b[j]))
        up, down = b.copy(), b.copy()
        up[j] += h
        down[j] -= h
        loss_up = np.dot(ct_a, 1e5 * a) + np.dot(ct_b, up)
        loss_down = np.dot(ct_a, 1e5 * a) + np.dot(ct_b, down)
        quotient = (loss_up - loss_down) / (up[j] - down[j])
        failing_sum += abs(quotient - ct_b[j]) > 1e-9 + 1e-7 * abs(ct_b[j])
failing_oracle = sum(not gc.check_vjp(lambda a, b: (1e5 * a, b), exact, (a, b), atol=1e-9,
                                      seed=seed).passed for seed in range(20))
print(f"L differenced as one sum: {failing_sum} of 60 entries of b fail")
print(f"outputs differenced one by one (the oracle): {failing_oracle} of 20 checks fail")

# %% [markdown]
# What remains is the rounding of the outputs the step does move: an output $f_i$ is known
# only to about $\varepsilon|f_i|$, so the quotient only to about
# $\varepsilon\sum_i|\bar y_i|\,|f_i|/h$ over them. For $f(a) = 10^5 + \sin a$ that is far
# above the plain tolerance, and no finite difference can do better. The oracle adds this
# floor to `atol` by default (an `atol` passed explicitly replaces both):

# %%
x = np.linspace(-1.0, 1.0, 6)
exact_sine = lambda ct, a: (ct * np.cos(a),)  # noqa: E731
for label, atol in [("atol 1e-9 alone  ", 1e-9), ("default, floor on", None)]:
    failing = sum(not gc.check_vjp(lambda a: 1e5 + np.sin(a), exact_sine, (x,), atol=atol,
                                   seed=seed).passed for seed in range(20))
    print(f"{label}: the exact gradient fails for {failing} of 20 cotangents")

# %% [markdown]
# ## Directional checks
#
# Checking every entry of the gradient costs two evaluations of $L$ per entry. One random
# direction $v$ costs two in total:
#
# $$\langle \nabla L, v\rangle \;\approx\; \frac{L(\theta + h v) - L(\theta - h v)}{2h}.$$
#
# If the claimed gradient is $\nabla L + e$ with an error $e \neq 0$, the check sees
# $\langle e, v\rangle$, which for a Gaussian $v$ is zero with probability zero. The price: one
# number, which says *that* something is wrong but not *where*, and a small error can hide
# behind the size of $\langle\nabla L, v\rangle$. The usual workflow is a directional check in
# large sizes, and `check_vjp` (optionally with `samples=` per argument) to locate a fault.
#
# A larger cell, with the true gradient and with the straight-through clip gradient of
# notebook 3:

# %%
rng = np.random.default_rng(11)
big = gc.testing.lstm_cell_case(rng, batch=16, input_size=32, hidden=64, clip=True)
theta = [big[k] for k in names[:5]]
v = [rng.standard_normal(a.shape) for a in theta]
d_cs, d_h = rng.standard_normal((2, 16, 64))
clip = big["cell_clip"]


def loss(t):
    st = gc.lstm_cell(*[a + t * d for a, d in zip(theta, v)], cell_clip=clip)
    return np.sum(d_cs * st.cs) + np.sum(d_h * st.h)


step = np.cbrt(eps)
numeric = (loss(step) - loss(-step)) / (2 * step)
print(f"{sum(a.size for a in theta)} inputs; the elementwise check needs "
      f"{2 * sum(a.size for a in theta)} evaluations, the directional one 2")
for clip_grad in ("exact", "straight_through"):
    g = gc.lstm_cell_grad(*theta, gc.lstm_cell(*theta, cell_clip=clip), d_h=d_h, d_cs=d_cs,
                          cell_clip=clip, clip_grad=clip_grad)
    claimed = sum(float(np.vdot(gk, vk)) for gk, vk in zip(g, v))
    print(f"{clip_grad:17} <grad, v> = {claimed:+.10f}   numeric = {numeric:+.10f}"
          f"   rel. difference {abs(claimed - numeric) / abs(numeric):.1e}")

# %% [markdown]
# (This direction stays clear of the clip boundary over $\pm h$: a step of
# $6\cdot10^{-6}$ along $v$ moves each $\mathrm{cs}_{raw}$ by far less than its distance to the
# boundary, which `lstm_cell_case` keeps above $10^{-2}$.)
#
# ## Kinks
#
# A difference quotient assumes $\varphi$ is smooth between its two evaluation points. The clip
# makes $\varphi$ piecewise smooth: across the boundary the slope jumps (notebook 3). A central
# difference that straddles the kink returns a blend of the two one-sided slopes, which is
# neither of them. Put a kink at a distance $\delta$ from the point of evaluation and vary $h$:

# %%
rng = np.random.default_rng(8)
small = gc.testing.lstm_cell_case(rng, batch=1, input_size=3, hidden=3)
theta = [small[k] for k in names[:5]]
v = [0.5 * rng.standard_normal(a.shape) for a in theta]
d_cs, d_h = rng.standard_normal((2, 1, 3))
start = gc.lstm_cell(*theta)
raw = np.abs(start.i * start.ci + start.f * theta[1])
kink_clip = float(raw.max())  # the largest unit reaches the clip exactly at t = 0


def phi_kink(t):
    st = gc.lstm_cell(*[a + t * d for a, d in zip(theta, v)], cell_clip=kink_clip)
    return np.sum(d_cs * st.cs) + np.sum(d_h * st.h)


def slope_at(t):
    point = [a + t * d for a, d in zip(theta, v)]
    g = gc.lstm_cell_grad(*point, gc.lstm_cell(*point, cell_clip=kink_clip), d_h=d_h,
                          d_cs=d_cs, cell_clip=kink_clip)
    return sum(float(np.vdot(gk, vk)) for gk, vk in zip(g, v))


steps = np.logspace(-9, -1, 33)
fig, ax = plt.subplots()
for delta, color in ((1e-6, "C0"), (1e-4, "C1"), (1e-2, "C2")):
    for side in (-1, 1):
        t = side * delta
        fd = np.array([(phi_kink(t + h) - phi_kink(t - h)) / (2 * h) for h in steps])
        ax.loglog(steps, np.abs(fd - slope_at(t)) / abs(slope_at(t)), color=color,
                  ls="-" if side > 0 else ":",
                  label=rf"$\delta = {delta:g}$, {'clipped' if side > 0 else 'unclipped'} side")
    ax.axvline(delta, color=color, lw=0.8, ls="--")
ax.set_xlabel("step h")
ax.set_ylabel("relative error against the exact slope")
ax.legend(fontsize=7, loc="upper left")
ax.set_title(r"central differences at distance $\delta$ from the clip boundary")
plt.show()

# %% [markdown]
# For $h < \delta$ the quotient is as accurate as anywhere else. Once $h > \delta$ one of the two
# evaluation points lies across the kink: the error grows as $(1 - \delta/h)\,J/2$, with $J$ the
# jump in slope, and levels off at $J/2$, where the quotient is the average of the two one-sided
# slopes, whatever the precision. So a test point must be farther from every kink than the step
# moves it. The oracle's step moves an input by $6\cdot10^{-6}\max(1, |a_j|)$, and so moves
# $\mathrm{cs}_{raw}$ by about that times a derivative of order one; `gc.testing` keeps every
# unclipped value at least `CLIP_MARGIN` from the clip level:

# %%
print("CLIP_MARGIN =", gc.testing.CLIP_MARGIN)

# %% [markdown]
# **Summary.** Central differences in float64 at $h = \sqrt[3]{\varepsilon}\max(1,|a|)$, divided by
# the step actually taken, are accurate to about $10^{-10}$ relative, which lets the oracle use a
# tolerance of $10^{-7}$, a thousandfold margin over its own noise and hundreds of times tighter
# than any float32 difference could support. Directional checks make
# large cases affordable; elementwise checks locate faults; and no check means anything across a
# kink.
