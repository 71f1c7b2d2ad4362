# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 13. Linear recurrences, their adjoint, and the parallel scan
#
# The recurrences trained in 2024-2026 (minGRU and minLSTM, Griffin's RG-LRU, Mamba, HGRN)
# share one core, the diagonal linear recurrence
#
# $$h_t = a_t \circ h_{t-1} + b_t,\qquad h_{-1} = h_0,$$
#
# with the gates $a_t, b_t$ computed from the input alone, never from $h$. That is what makes
# them trainable in parallel over time. This notebook
#
# 1. derives the backward pass, which is the same recurrence run backwards (the *adjoint
#    recurrence*), and checks it against `gc.linear_scan_grad` and the oracle;
# 2. draws the parallel scan: the steps compose associatively, so a sequence of $T$ steps
#    needs $\lceil\log_2 T\rceil$ rounds (Hillis and Steele) or, on a CPU, two passes over
#    chunks (the two-level scan gradcells runs on its cores);
# 3. shows the sequential and parallel forms to be one function, for `gc.linear_scan` and
#    for the minGRU, whose paper computes its parallel form in log space;
# 4. lets the oracle catch two faults: minGRU-pytorch's minLSTM whose two modes differ
#    (known fault 71, when `mingru-pytorch` is installed), and a chunked scan that drops the
#    carry between chunks in its backward.
#
# Notation is docs/spec.md's (§2 and §18): $\bar v = \partial L/\partial v$, $\circ$ the
# elementwise product. Every call names `backend="reference"`.

# %%
import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc
from gradcells.oracle import check_vjp

plt.rcParams.update({"figure.dpi": 80, "figure.figsize": (7, 3.2)})
REF = {"backend": "reference"}
T, B, D = 12, 2, 3                      # steps, batch, width


def case(rng, steps=T):
    """``a`` in (0.5, 1) (a decay, as the gates give), ``b``, ``h0``: float64."""
    return (rng.uniform(0.5, 1.0, (steps, B, D)), rng.standard_normal((steps, B, D)),
            rng.standard_normal((B, D)))


# %% [markdown]
# ## 1. The adjoint recurrence
#
# Write $g_t = \partial L/\partial h_t$ for the *total* derivative of the loss with respect
# to the state $h_t$: through the output $h_t$ itself ($\bar h_t$, the upstream gradient)
# and through every later state. $h_t$ reaches the later states only through $h_{t+1} =
# a_{t+1}\circ h_t + b_{t+1}$, whose derivative with respect to $h_t$ is the diagonal
# $a_{t+1}$. So
#
# $$g_t = \bar h_t + a_{t+1}\circ g_{t+1},\qquad g_{T-1} = \bar h_{T-1} + \bar h_{\text{final}},$$
#
# a linear recurrence of the same form, run from $t = T-1$ down to 0. Every gradient is then
# one product away, each input appearing in one step only:
#
# $$\bar b_t = g_t,\qquad \bar a_t = g_t \circ h_{t-1},\qquad \bar h_0 = a_0 \circ g_0 .$$
#
# (For complex arrays PyTorch's convention, $\partial L/\partial\,\mathrm{Re}\,z +
# i\,\partial L/\partial\,\mathrm{Im}\,z$, conjugates: $\bar a_t = g_t \circ
# \overline{h_{t-1}}$; docs/spec.md §18.1.) Transcribed in NumPy:

# %%
rng = np.random.default_rng(0)
a, b, h0 = case(rng)
d_h, d_final = rng.standard_normal((T, B, D)), rng.standard_normal((B, D))

h = np.empty_like(b)                                   # the forward
state = h0
for t in range(T):
    state = h[t] = a[t] * state + b[t]

g = np.empty_like(b)                                   # the adjoint, backwards in time
carry = d_final
for t in reversed(range(T)):
    carry = g[t] = d_h[t] + carry                      # g_t = d_h_t + a_{t+1}∘g_{t+1}
    carry = a[t] * carry                               # what step t passes to t - 1
h_prev = np.concatenate([h0[None], h[:-1]])
by_hand = {"a": g * h_prev, "b": g, "h0": a[0] * g[0]}

result = gc.linear_scan(a, b, h0, **REF)
grads = gc.linear_scan_grad(a, b, h0, result, d_h=d_h, d_h_final=d_final, **REF)
for name, value in by_hand.items():
    print(f"d_{name:2s}: max |gc - by hand| = {np.abs(getattr(grads, name) - value).max():.1e}")

# %% [markdown]
# And the oracle, `check_vjp`: central differences of the forward in float64, every
# element of every argument, against the claimed vector-Jacobian product.

# %%
def forward(a, b, h0):
    r = gc.linear_scan(a, b, h0, **REF)
    return r.h, r.h_final


def vjp(ct, a, b, h0):
    r = gc.linear_scan(a, b, h0, **REF)
    return tuple(gc.linear_scan_grad(a, b, h0, r, d_h=ct[0], d_h_final=ct[1], **REF))


report = check_vjp(forward, vjp, (a, b, h0), names=("a", "b", "h0"))
print(report)

# %% [markdown]
# ## 2. The parallel scan
#
# A step is an affine map $s \mapsto a_t \circ s + b_t$. Two steps compose into one of the
# same form,
#
# $$(a, b)\ \text{then}\ (a', b') \;=\; (a' \circ a,\; a' \circ b + b'),$$
#
# and composition is associative, so the prefix "all steps up to $t$" can be formed in any
# bracketing. Hillis and Steele's scan does it in rounds: in round $k$ every step $t \ge
# 2^k$ composes with the step $2^k$ before it, and after $\lceil\log_2 T\rceil$ rounds step
# $t$ holds the map from $h_0$ to $h_t$. The drawing shows which steps each round reads.

# %%
fig, ax = plt.subplots(figsize=(7, 3.0))
rounds = int(np.ceil(np.log2(T)))
for k in range(rounds + 1):
    ax.scatter(range(T), [k] * T, s=18, color="black", zorder=3)
for k in range(rounds):
    d = 2 ** k
    for t in range(d, T):
        ax.annotate("", xy=(t, k + 1), xytext=(t - d, k),
                    arrowprops={"arrowstyle": "->", "color": f"C{k}", "lw": 0.8})
ax.set_yticks(range(rounds + 1), ["steps"] + [f"round {k + 1}" for k in range(rounds)])
ax.invert_yaxis()
ax.set_xlabel("time step t")
ax.set_title(f"Hillis-Steele scan: T = {T} steps in {rounds} rounds")
plt.show()

# %% [markdown]
# The rounds do $O(T \log T)$ work where the loop does $O(T)$: right for a GPU with a thread
# per step, wasteful on a CPU with two cores. There gradcells runs the *two-level* scan:
# cut time into chunks; (1) reduce each chunk to its map $(A_k, B_k)$, the chunks in
# parallel; (2) run the short sequential scan over the chunks' maps, giving each chunk its
# incoming state (the *carry*); (3) scan each chunk again from its carry, in parallel.
# The adjoint is a scan too (section 1), so the backward runs the same way, backwards.
#
# ## 3. Two forms, one function
#
# The parallel result is the sequential one composed in another order, so they differ only
# by rounding. docs/spec.md §18.1 states the bound: elementwise, a few ulps times
# $(\log_2 T + 2)$, relative to the same scan of $|a|, |b|, |h_0|$.

# %%
rng = np.random.default_rng(1)
a, b, h0 = (v.astype(np.float32) for v in case(rng, steps=300))
seq = gc.linear_scan(a, b, h0, method="sequential", **REF)
par = gc.linear_scan(a, b, h0, method="parallel", **REF)
scale = gc.linear_scan(np.abs(a), np.abs(b), np.abs(h0), method="sequential", **REF).h
ulps = np.abs(par.h - seq.h) / (scale * np.finfo(np.float32).eps)
print(f"float32, T = 300: max |parallel - sequential| = {np.abs(par.h - seq.h).max():.1e}, "
      f"{ulps.max():.1f} ulps of the scale (log2 T + 2 = {np.log2(300) + 2:.1f})")

# %% [markdown]
# The minGRU (Feng et al. 2024) is this recurrence with $a_t = 1 - z_t$ and $b_t = z_t \circ
# \tilde h_t$. Its paper computes the parallel form in log space, which needs positive
# states; gradcells's `method="parallel"` is the same associative scan and takes any sign.
# Both methods give one function, gradients included:

# %%
rng = np.random.default_rng(2)
I, H = 3, 4
x, h0 = rng.standard_normal((T, B, I)), rng.standard_normal((B, H))      # h0 of any sign
w, bias = rng.standard_normal((I, 2 * H)), rng.standard_normal(2 * H)
up = rng.standard_normal((T, B, H))
for method in ("sequential", "parallel"):
    s = gc.mingru_sequence(x, h0, w, bias, method=method, **REF)
    gr = gc.mingru_sequence_grad(x, h0, w, bias, s, d_h=up, **REF)
    if method == "sequential":
        first = s, gr
    else:
        print(f"minGRU parallel vs sequential: max |Δh| = {np.abs(s.h - first[0].h).max():.1e}, "
              f"max |Δ dw| = {np.abs(gr.w - first[1].w).max():.1e}")

# %% [markdown]
# ## 4. What the oracle catches
#
# **minGRU-pytorch's two modes.** Its minLSTM's parallel (log-space) mode, given a starting
# state, starts from $g(h_0)$ (the candidate's activation applied to it) where its
# sequential mode, like the paper, starts from $h_0$: known fault 71. `python -m gradcells
# audit mingru` runs the comparison; here one case, when the package is installed.

# %%
try:
    from gradcells.audit import mingru as audit_mingru

    audit_mingru.checks()
except ImportError as error:
    print(f"minGRU-pytorch is not installed ({error}): `pip install mingru-pytorch`")
else:
    verdict = audit_mingru.minlstm_verdict(np.random.default_rng(3))
    print(f"its parallel vs its sequential mode: |Δ| = {verdict.truth.abs_error:.2f} "
          f"(agrees: {verdict.truth.agrees}); run from g(h0), they agree: "
          f"{verdict.fault_model.agrees}")

# %% [markdown]
# **A dropped carry.** The two-level scan's one subtle line is the carry: each chunk must
# start from the state the chunks before it left. Below, a chunked adjoint scan written
# from section 2, correct but for one thing: each chunk of the backward starts from zero
# instead of the gradient flowing in from the later chunks. Within a chunk everything is
# right, so a test on a sequence shorter than a chunk passes; the oracle, on a longer one,
# does not.

# %%
CHUNK = 4


def dropped_carry_vjp(ct, a, b, h0):
    """``linear_scan_grad`` written as a chunked adjoint scan, except that every chunk's
    adjoint starts from zero (the carry from the later chunks is dropped)."""
    d_h, d_final = ct
    h = gc.linear_scan(a, b, h0, **REF).h
    g = np.empty_like(b)
    for start in reversed(range(0, a.shape[0], CHUNK)):
        stop = min(start + CHUNK, a.shape[0])
        carry = d_final if stop == a.shape[0] else np.zeros_like(d_final)   # the bug
        for t in reversed(range(start, stop)):
            carry = g[t] = d_h[t] + carry
            carry = a[t] * carry
    h_prev = np.concatenate([h0[None], h[:-1]])
    return g * h_prev, g, a[0] * g[0]


rng = np.random.default_rng(4)
for steps in (CHUNK, 3 * CHUNK):
    args = case(rng, steps=steps)
    rep = check_vjp(forward, dropped_carry_vjp, args, names=("a", "b", "h0"))
    print(f"T = {steps:2d}: the oracle {'passes' if rep.passed else 'FAILS'} it; worst "
          f"|analytic - numeric| = {rep.max_abs_error:.1e}")

# %% [markdown]
# The oracle compares every element of every gradient with central differences of the
# forward alone, so it needs no second implementation to trust; only the case must be long
# enough to cross a chunk, which is why gradcells's own tests run the parallel scans in
# chunks of two.
