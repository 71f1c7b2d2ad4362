# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 8. Layer normalisation, its backward pass, and the layer-normalised LSTM
#
# Layer normalisation (Ba, Kiros and Hinton 2016) rescales each row of a layer's
# pre-activations to mean 0 and variance 1, then applies a learned gain and shift. Its
# forward pass is three lines; its backward pass is where implementations go wrong,
# because every output depends on every input of its row through the row's mean and
# variance. This notebook
#
# 1. derives the backward pass of one layer norm, term by term, beside the code of
#    `gradcells/_core/xpmath.py`;
# 2. shows where the three norms sit inside gradcells's layer-normalised LSTM
#    (docs/spec.md §9.2), and what the two `ln_carry` variants are;
# 3. lets the oracle `gc.check_vjp` catch the two classic bugs, the mean term missing and
#    the variance term dropped, first in the layer norm alone and then inside the full LSTM
#    gradient;
# 4. looks at what the norm does to the gradient through time.
#
# Every call names `backend="reference"`: the code shown is the code checked.

# %%
import contextlib
import inspect

import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc
from gradcells._core import xpmath as common
from gradcells.cells.lstm import reference as ref

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
# ## One layer norm, forward
#
# For a row $z \in \mathbb{R}^N$ (one example's pre-activations),
#
# $$\mu = \tfrac1N \textstyle\sum_k z_k, \qquad
#   \sigma^2 = \tfrac1N \textstyle\sum_k (z_k - \mu)^2, \qquad
#   r = \frac{1}{\sqrt{\sigma^2 + \varepsilon}}, \qquad
#   \hat z = (z - \mu)\, r, \qquad
#   y = \mathrm{LN}(z; \gamma, \beta) = \gamma \circ \hat z + \beta .$$
#
# The variance is the biased one (divided by $N$), as in PyTorch's `layer_norm` and Keras'
# `LayerNormalization`; $\varepsilon$ keeps $r$ finite for a constant row. The forward
# returns $\hat z$ and $r$ beside $y$: they are all the backward needs.

# %%
show(common.layer_norm_stats, "centred = z - z.sum", "rstd = 1 / xp.sqrt",
     "return centred * rstd, rstd")
show(common.layer_norm, "return gamma * z_hat + beta")

# %% [markdown]
# ## One layer norm, backward
#
# Let $\bar y = \partial L/\partial y$ and write $g = \bar y \circ \gamma$, the gradient
# that reaches $\hat z$. The parameters are easy, $\bar\gamma = \sum \bar y \circ \hat z$
# and $\bar\beta = \sum \bar y$ (summed over the batch). For $z$, each $\hat z_j$ depends on
# $z_k$ three ways: directly, through $\mu$, and through $r$:
#
# $$\frac{\partial \hat z_j}{\partial z_k}
#   = r\,\delta_{jk} \;-\; \frac{r}{N} \;+\; (z_j - \mu)\,\frac{\partial r}{\partial z_k},
#   \qquad \frac{\partial \mu}{\partial z_k} = \frac1N, \qquad
#   \frac{\partial \sigma^2}{\partial z_k} = \frac{2 (z_k - \mu)}{N} .$$
#
# (In $\partial\sigma^2/\partial z_k$ the terms through $\mu$ cancel, since the deviations
# sum to zero.) With $r = (\sigma^2+\varepsilon)^{-1/2}$,
# $\partial r/\partial z_k = -\tfrac12 r^3 \cdot 2(z_k-\mu)/N = -r^2 \hat z_k / N$, so the
# third term is $-r\,\hat z_j \hat z_k / N$. Summing against $g$:
#
# $$\bar z_k = \sum_j g_j \frac{\partial \hat z_j}{\partial z_k}
#   = r\Big(g_k \;-\; \underbrace{\tfrac1N \textstyle\sum_j g_j}_{\text{mean term}}
#     \;-\; \underbrace{\hat z_k\, \tfrac1N \textstyle\sum_j g_j \hat z_j}_{\text{variance
#     term}}\Big).$$
#
# Both extra terms are there for a reason one can see without any algebra:
#
# * **The mean term.** Adding a constant to every $z_k$ does not change $y$, so the
#   gradient has no component along $(1, \dots, 1)$: $\sum_k \bar z_k = 0$. Without the
#   mean term the gradient keeps $r \sum_k g_k$ of it.
# * **The variance term.** Scaling $z - \mu$ by a factor $s$ changes $y$ only through
#   $\varepsilon$ (exactly not at all for $\varepsilon = 0$), so the gradient is (almost)
#   orthogonal to $\hat z$: $\sum_k \bar z_k \hat z_k = r \sum_j g_j\hat z_j \cdot
#   \varepsilon/(\sigma^2 + \varepsilon)$. Without the variance term it keeps
#   $r\sum_j g_j \hat z_j$ of that direction.

# %%
show(common.layer_norm_grad, "g = dy * gamma", "dz = rstd * (g - g.sum",
     "- z_hat * (g * z_hat).sum", "return dz, (dy * z_hat).sum")

rng = np.random.default_rng(8)
B, N, EPS = 4, 12, 1e-5
z = rng.standard_normal((B, N)) * 2 + 3
gamma, beta = 1 + 0.2 * rng.standard_normal(N), 0.1 * rng.standard_normal(N)
dy = rng.standard_normal((B, N))
y, z_hat, rstd = common.layer_norm(np, z, gamma, beta, EPS)
dz, dgamma, dbeta = common.layer_norm_grad(dy, gamma, z_hat, rstd)
print("mean and variance of each row of ẑ:", z_hat.mean(axis=1).round(12), z_hat.var(axis=1))
print("Σ_k dz_k per row (the mean term makes it 0):    ", dz.sum(axis=1))
print("Σ_k dz_k ẑ_k per row (the variance term, ~ ε):  ", (dz * z_hat).sum(axis=1))

# %% [markdown]
# ## The oracle catches the classic bugs
#
# Two backward passes with one term each left out, both plausible at a glance: the one
# that treats $\mu$ as a constant (the mean term missing), and the one that treats $r$ as a
# constant (the variance term dropped, as if each row were divided by a fixed number).
# The oracle compares each with central differences of
# $L = \langle \bar y, \mathrm{LN}(z)\rangle$:

# %%
def ln_forward(z, gamma, beta):
    return common.layer_norm(np, z, gamma, beta, EPS)[0]


def ln_backward(grad):
    """A vjp for the oracle from a layer-norm backward ``grad(dy, gamma, z_hat, rstd)``."""
    def vjp(ct, z, gamma, beta):
        _, z_hat, rstd = common.layer_norm(np, z, gamma, beta, EPS)
        return grad(ct, gamma, z_hat, rstd)
    return vjp


def parameter_grads(dy, z_hat):
    """dγ and dβ, summed over every axis but the last (the batch; for a sequence, time too)."""
    axes = tuple(range(dy.ndim - 1))
    return (dy * z_hat).sum(axis=axes), dy.sum(axis=axes)


def grad_without_mean_term(dy, gamma, z_hat, rstd):
    g = dy * gamma
    dz = rstd * (g - z_hat * (g * z_hat).mean(axis=-1, keepdims=True))    # no mean(g)
    return dz, *parameter_grads(dy, z_hat)


def grad_without_variance_term(dy, gamma, z_hat, rstd):
    g = dy * gamma
    dz = rstd * (g - g.mean(axis=-1, keepdims=True))                      # no ẑ∘mean(g∘ẑ)
    return dz, *parameter_grads(dy, z_hat)


LN_NAMES = ("z", "gamma", "beta")
reports = {}
for label, grad in (("correct", common.layer_norm_grad),
                    ("mean term missing", grad_without_mean_term),
                    ("variance term dropped", grad_without_variance_term)):
    reports[label] = gc.check_vjp(ln_forward, ln_backward(grad), (z, gamma, beta),
                                  names=LN_NAMES)
    print(f"--- {label}\n{reports[label]}\n")
assert reports["correct"].passed, "UNEXPECTED: the reference's layer norm failed the oracle"
assert not reports["mean term missing"].passed, "UNEXPECTED: a wrong gradient passed"
assert not reports["variance term dropped"].passed, "UNEXPECTED: a wrong gradient passed"

# %% [markdown]
# Both bugs leave $\bar\gamma$ and $\bar\beta$ right (they do not involve $\partial \hat
# z/\partial z$) and get every element of $\bar z$ wrong. *How* they are wrong tells them
# apart. The error of the first is $r \cdot \mathrm{mean}(g)$, one constant per row; the
# error of the second is $r\,\hat z_k \cdot \mathrm{mean}(g \circ \hat z)$, proportional to
# $\hat z_k$. Plotted against $\hat z_k$, one row per colour:

# %%
right = common.layer_norm_grad(dy, gamma, z_hat, rstd)[0]
fig, axes = plt.subplots(1, 2, sharey=True)
for ax, (label, grad) in zip(axes, (("mean term missing", grad_without_mean_term),
                                    ("variance term dropped", grad_without_variance_term))):
    error = grad(dy, gamma, z_hat, rstd)[0] - right
    for row in range(B):
        ax.plot(z_hat[row], error[row], "o", ms=4, label=f"row {row}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_title(label)
    ax.set_xlabel("ẑ_k")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("buggy dz_k − correct dz_k")
axes[1].legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Flat lines on the left: a constant offset per row, the component along $(1,\dots,1)$
# that the true gradient does not have. Lines through the origin on the right: the
# component along $\hat z$. A test that only checked $\sum_k \bar z_k = 0$ would catch the
# first bug and miss the second; the oracle, comparing every element, catches both.
#
# ## Where the norms sit in the LSTM
#
# gradcells's layer-normalised LSTM (docs/spec.md §9.2) normalises the two parts of the
# pre-activations separately, each over all $4H$ columns, and the cell state before its
# tanh:
#
# $$G = \mathrm{LN}(x W_x;\ \gamma_x, \beta_x) + \mathrm{LN}(h_{prev} W_h;\ \gamma_h,
#   \beta_h) + b, \qquad \tilde c = \operatorname{clip}(i \circ \mathrm{ci} + f \circ
#   \mathrm{cs}_{prev}), \qquad n = \mathrm{LN}(\tilde c;\ \gamma_c, \beta_c), \qquad
#   \mathrm{co} = \tanh(n).$$
#
# The gates $i, \mathrm{ci}, f, o$ come from $G$ as in notebook 1 (forget bias, peepholes,
# clip). Normalising $x W_x$ and $h_{prev} W_h$ apart means neither part can drown the
# other, and it makes the gates independent of the scale of $W$ (below).

# %%
show(ref.lstm_input_gates, "return _layer_norm(xp, z, norm.gamma_x")
show(ref.lstm_recurrent_gates, "_layer_norm(xp, z_h, norm.gamma_h")
show(ref.lstm_activations, "normed = _layer_norm(xp, cs", "co = xp.tanh(normed)",
     "cs = normed if ln_carry")

# %% [markdown]
# **Two carries.** What the cell passes on to the next step as its state is a choice, and
# published implementations differ:
#
# * `ln_carry="raw"`: the cell carries $\mathrm{cs} = \tilde c$ and only the output sees the
#   norm, $h = o \circ \tanh(\mathrm{LN}(\tilde c))$. This is the layer-normalised LSTM of
#   Ba, Kiros and Hinton (2016), whose equations keep $c_t$ unnormalised and write
#   $h_t = \sigma(o_t) \odot \tanh(\mathrm{LN}(c_t))$, and of Haste's `LayerNormLSTM`.
# * `ln_carry="normalized"`: the cell carries $\mathrm{cs} = n = \mathrm{LN}(\tilde c)$, so
#   the next step's forget gate multiplies the normalised state. This is TF Addons'
#   `LayerNormLSTMCell` (its `call` applies `state_norm` to `c` and returns that `c` as the
#   state); tests/test_layer_norm_conformance.py runs a port of it on Keras 3 against
#   gradcells.
#
# The output peephole reads the carried state in both. The two are different models: from
# the same weights (and no peepholes) they agree on the first step's $h$ and part ways
# after it.

# %%
rng = np.random.default_rng(2016)
case = gc.testing.lstm_sequence_case(rng, steps=6, batch=2, input_size=3, hidden=4,
                                     layer_norm=True, ln_carry="raw")
raw = gc.lstm_sequence(**case, **REF)
normalized = gc.lstm_sequence(**{**case, "ln_carry": "normalized"}, **REF)
print("max |h_raw - h_normalized| per step:", np.abs(raw.h - normalized.h).max(axis=(1, 2)))

# %% [markdown]
# ## The backward pass of the LSTM's norms
#
# **The gate norms.** $G$ is the sum of the two normalised parts, so the gradient $\bar G$
# (the `dG` of notebook 1) reaches both unchanged, and each goes back through its own norm:
# $\bar z_x = \mathrm{LN}'^\top_x \bar G$ and $\bar z_h = \mathrm{LN}'^\top_h \bar G$, with
# $\bar\gamma_x = \sum \bar G \circ \hat z_x$, $\bar\beta_x = \sum \bar G$ and the same for
# $h$. Then the matmuls as before: $\bar x = \bar z_x W_x^\top$, $\bar h_{prev} = \bar z_h
# W_h^\top$, $\bar W = [x^\top \bar z_x;\ h_{prev}^\top \bar z_h]$; the bias, added after
# the norms, still gets $\bar b = \sum \bar G$. (So $\bar\beta_x = \bar\beta_h = \bar b$:
# three shifts of the same sum, which only the parametrisation tells apart.)

# %%
show(ref.lstm_gate_norm_grads, "dz_x, dgamma_x, dbeta_x = layer_norm_grad(d_gates",
     "dz_h, dgamma_h, dbeta_h = layer_norm_grad(d_gates")
show(ref.lstm_cell_grad, "x=dz_x @ w[:n_in].T", "w=xp.concatenate([x.T @ dz_x")

# %% [markdown]
# **The cell norm.** $\mathrm{co} = \tanh(n)$ sends $\overline{\mathrm{co}}$ (called `dco`,
# already through the tanh) to $n$. The carried state's gradient $\overline{\mathrm{cs}}$
# (from the next step, the output peephole and any upstream `d_cs`) goes where the carried
# state came from:
#
# * raw: $\mathrm{cs} = \tilde c$, so $\bar n = \overline{\mathrm{co}}$ and $\bar{\tilde c}
#   = \overline{\mathrm{cs}} + \mathrm{LN}'^\top_c\, \bar n$;
# * normalized: $\mathrm{cs} = n$, so $\bar n = \overline{\mathrm{co}} +
#   \overline{\mathrm{cs}}$ and $\bar{\tilde c} = \mathrm{LN}'^\top_c\, \bar n$: the whole
#   carry passes through the norm's backward.
#
# Then the clip mask and $\bar i, \overline{\mathrm{ci}}, \bar f$ follow from $\bar{\tilde
# c}$ as in notebook 1.

# %%
show(ref.lstm_cell_norm_grad, "dn = dco + dcs if carry", "layer_norm_grad(dn, norm.gamma_c",
     "return (d_tilde if carry")

# %% [markdown]
# **What is saved.** The forward result keeps the same arrays with and without the norm
# (the seven of `LSTMCellState`); nothing is added for the backward. The gradient
# recomputes what the norms' backward needs: $\hat z_x, r_x$ and $\hat z_h, r_h$ from the
# inputs, by one matmul each (over all steps at once for a sequence), and $\tilde c$ from
# the saved gates, as the clip mask already was, with $\hat c, r_c$ from it:

# %%
show(ref.lstm_gate_norm_stats, "return (layer_norm_stats(xp, x @ w[:n_in]",
     "layer_norm_stats(xp, h_prev @ w[n_in:]")
show(ref.lstm_cell_candidate, "c_tilde = state.i * state.ci + state.f * cs_prev")
show(ref.lstm_cell_norm_grad, "c_tilde = lstm_cell_candidate(", "_, c_hat, rstd = _layer_norm(")

# %% [markdown]
# ## The oracle on the whole layer-normalised LSTM
#
# `gc.testing.lstm_cell_vjp_pair` and `lstm_sequence_vjp_pair` turn a case into the
# oracle's `(f, vjp, args, names)`, the six norm parameters checked one by one as
# `layer_norm.gamma_x`, ... Both carries, with peepholes, a clip and a projection, on a
# cell and on a ragged sequence:

# %%
def lstm_reports(ln_carry, seed=3):
    r = np.random.default_rng(seed)
    options = {"peephole": True, "clip": True, "proj_size": 3, "proj_clip": True,
               "layer_norm": True, "ln_carry": ln_carry}
    cell = gc.testing.lstm_cell_case(r, batch=3, input_size=3, hidden=4, **options)
    seq = gc.testing.lstm_sequence_case(r, steps=4, batch=4, input_size=2, hidden=3,
                                        ragged=True, **options)
    pairs = {"cell": gc.testing.lstm_cell_vjp_pair(cell, **REF),
             "sequence": gc.testing.lstm_sequence_vjp_pair(seq, **REF)}
    return {kind: gc.check_vjp(f, vjp, args, names=names)
            for kind, (f, vjp, args, names) in pairs.items()}


for ln_carry in ("raw", "normalized"):
    for kind, report in lstm_reports(ln_carry).items():
        print(f"{ln_carry:>10} {kind:>8}: passed={report.passed}, {len(report.checks)} "
              f"arguments, worst abs error {report.max_abs_error:.1e}")
        assert report.passed, "UNEXPECTED: the reference's gradient failed the oracle"

# %% [markdown]
# ## The same bugs inside the LSTM
#
# The reference's LSTM gradient calls `layer_norm_grad` for all three norms (the forward
# never does). Swapping in a buggy one for the length of a `with` block puts the bug in
# every norm's backward at once, and the oracle says which gradients it reaches:

# %%
@contextlib.contextmanager
def patched(name, replacement):
    """Run the reference LSTM with its function ``name`` replaced, for one ``with`` block."""
    saved = getattr(ref, name)
    setattr(ref, name, replacement)
    try:
        yield
    finally:
        setattr(ref, name, saved)


def failing_arguments(report):
    return [c.name for c in report.checks if not c.passed]


for label, grad in (("mean term missing", grad_without_mean_term),
                    ("variance term dropped", grad_without_variance_term)):
    with patched("layer_norm_grad", grad):
        reports = lstm_reports("normalized")
    for kind, report in reports.items():
        assert not report.passed, "UNEXPECTED: a wrong gradient passed"
        print(f"{label}, {kind}: fails {', '.join(failing_arguments(report))}")
assert all(r.passed for r in lstm_reports("normalized").values()), "UNEXPECTED: not restored"
print("\nthe cell's report for the missing mean term:")
with patched("layer_norm_grad", grad_without_mean_term):
    print(lstm_reports("normalized")["cell"])

# %% [markdown]
# In the cell, the gradients that pass are exactly those computed *before* any layer-norm
# backward runs: $\bar w_{proj}$ and $\bar w_{co}$ (from $\bar h$ and $\bar o$), and the
# cell norm's own $\bar\gamma_c = \sum \bar n \circ \hat c$, $\bar\beta_c = \sum \bar n$,
# which need $\bar n$ but not $\partial \hat c / \partial \tilde c$. Everything after the
# cell norm's backward fails: the wrong $\bar{\tilde c}$ goes into $\bar i, \bar f,
# \overline{\mathrm{ci}}$, so into $\bar G$, and from $\bar G$ into every weight, the gate
# norms' gains and shifts included. (Some arguments fail in only part of their elements:
# where the cell clip is active, $\bar{\tilde c}$ is zeroed, right or wrong.) Over a
# sequence all fifteen fail: the wrong carry reaches the earlier steps' $\bar h$ and
# $\overline{\mathrm{cs}}$, and with them everything computed from those.
# A bug in one norm only is pinned down more closely. Put the missing mean term in the
# input part's norm alone (the recurrent part's and the cell's stay right):

# %%
def gate_norm_grads_with_input_bug(d_gates, norm, x_stats, h_stats):
    dz_x, dgamma_x, dbeta_x = grad_without_mean_term(d_gates, norm.gamma_x, *x_stats)
    dz_h, dgamma_h, dbeta_h = common.layer_norm_grad(d_gates, norm.gamma_h, *h_stats)
    return dz_x, dz_h, dgamma_x, dbeta_x, dgamma_h, dbeta_h


with patched("lstm_gate_norm_grads", gate_norm_grads_with_input_bug):
    reports = lstm_reports("normalized")
for kind, report in reports.items():
    print(f"input norm only, {kind}: fails {', '.join(failing_arguments(report))}")
    assert failing_arguments(report) == ["x", "w"], "UNEXPECTED: other arguments failed"

c = gc.testing.lstm_cell_case(np.random.default_rng(4), batch=3, input_size=3, hidden=4,
                              layer_norm=True, ln_carry="normalized")
arrays = {k: v for k, v in c.items() if k not in ("forget_bias", "ln_epsilon", "ln_carry")}
d_h = np.random.default_rng(5).standard_normal(c["h_prev"].shape)
right_w = gc.lstm_cell_grad(**arrays, state=gc.lstm_cell(**c, **REF), d_h=d_h, **REF).w
with patched("lstm_gate_norm_grads", gate_norm_grads_with_input_bug):
    buggy_w = gc.lstm_cell_grad(**arrays, state=gc.lstm_cell(**c, **REF), d_h=d_h, **REF).w
wrong_rows = np.flatnonzero(np.abs(buggy_w - right_w).max(axis=1) > 0)
print(f"rows of dW that differ: {wrong_rows} (the x rows are 0..{c['x'].shape[1] - 1})")
assert list(wrong_rows) == list(range(c["x"].shape[1])), "UNEXPECTED: an h row changed"

# %% [markdown]
# Only $\bar x$ and $\bar W$ fail: $\bar z_x$ feeds nothing else, not even the carry
# (the input part of $G$ does not depend on the state), so over a sequence the bug stays
# where it is too.
#
# ## What the norm does to the gradient through time
#
# $\mathrm{LN}(x \cdot sW) = \mathrm{LN}(x W)$ for any scale $s > 0$ (up to
# $\varepsilon$, taken tiny here, $10^{-10}$): the gates of the layer-normalised LSTM do
# not depend on the scale of the weights, and neither do their gradients with respect to
# the inputs. Below, the gradient that a loss on the last output sends to each step's input,
# $\|\partial L / \partial x_t\|$ (batch mean), for one draw of the weights scaled by $s$,
# without and with the norm (`ln_carry="raw"`, gains 1 and shifts 0):

# %%
def input_gradient_norms(scale, layer_norm, steps=40, batch=16, size=8, seed=11):
    """‖∂L/∂x_t‖ (batch mean) against the steps back, for L = <d_h_final, h_T> and the
    weights w of one fixed draw scaled by ``scale`` (the inputs, states and bias unchanged)."""
    r = np.random.default_rng(seed)
    c = gc.testing.lstm_sequence_case(r, steps=steps, batch=batch, input_size=size,
                                      hidden=size, layer_norm=True, ln_carry="raw")
    c["w"], c["ln_epsilon"] = scale * c["w"], 1e-10    # ε small: only the scale differs
    if layer_norm:  # gains 1, shifts 0: the plain LN
        c["layer_norm"] = gc.LSTMNorm(*(np.ones_like(a) if k % 2 == 0 else np.zeros_like(a)
                                        for k, a in enumerate(c["layer_norm"])))
    else:
        c = {k: v for k, v in c.items() if k not in ("layer_norm", "ln_epsilon", "ln_carry")}
    seq = gc.lstm_sequence(**c, **REF)
    d_h_final = r.standard_normal(c["h0"].shape)
    arrays = {k: v for k, v in c.items() if k not in ("forget_bias", "ln_epsilon", "ln_carry")}
    g = gc.lstm_sequence_grad(**arrays, seq=seq, d_h_final=d_h_final, **REF)
    return np.linalg.norm(g.x, axis=2).mean(axis=1)[::-1]      # index k: k steps back


SCALES = (0.25, 1.0, 4.0, 16.0)
curves = {(ln, s): input_gradient_norms(s, ln) for ln in (False, True) for s in SCALES}
fig, axes = plt.subplots(1, 2, sharey=True)
for ax, ln in zip(axes, (False, True)):
    for s in SCALES:
        ax.semilogy(curves[ln, s], label=f"s = {s}")
    ax.set_title("with layer norm" if ln else "without layer norm")
    ax.set_xlabel("steps back from the last output")
    ax.grid(True, alpha=0.3)
axes[0].set_ylabel("‖∂L/∂x_t‖ (batch mean)")
axes[0].legend(fontsize=8)
fig.tight_layout()
plt.show()

spread = {ln: max(np.abs(np.log(curves[ln, s] / curves[ln, 1.0])).max() for s in SCALES)
          for ln in (False, True)}
print("largest factor between the curves, without the norm: "
      f"{np.exp(spread[False]):.1e}, with it: {np.exp(spread[True]):.8f}")
assert spread[True] < 1e-5 and spread[False] > 1, "UNEXPECTED: the scale mattered with LN"

# %% [markdown]
# Without the norm the scale of the weights sets both the size of the gradient and how
# fast it dies going back: 40 steps back it is about $2\cdot10^{-6}$ of a unit-size loss
# gradient at $s = 1/4$ and about $2\cdot10^{-2}$ at $s = 16$, four orders of magnitude
# apart, and every change of scale during training moves it. With the norm the four curves
# are one: every gate sees pre-activations of unit scale whatever the scale of $W$, so the
# optimiser can change the weights' scale without changing how the gradient flows (here it
# is still about half the size 40 steps back). With the default $\varepsilon = 10^{-5}$ the
# curves part by several percent at $s = 1/4$, where the rows' variances are small enough
# for $\varepsilon$ to count and its effect compounds over the steps.
