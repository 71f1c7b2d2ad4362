# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 12. The sLSTM's stabiliser and its gradient
#
# xLSTM's sLSTM (Beck et al. 2024) gives the LSTM an *exponential* input gate, $i = e^{\tilde
# \imath}$, and normalises the cell by a second state $n$ that sums the same gates, so that
# the output $h = o\,c/n$ is a weighted average of the $z$'s. Exponentials overflow; the
# sLSTM carries a third state, the stabiliser $m$, a running log-scale that keeps every gate
# at most 1. This notebook
#
# 1. overflows the unstabilised cell in float32 and shows that $h$ only sees the ratio
#    $c/n$;
# 2. adds the stabiliser and checks with `gc.slstm_sequence` that $h$ is unchanged where the
#    unstabilised cell is finite, and finite where it is not;
# 3. derives the backward in terms of the saved outputs, and why $m$ cancels from a loss on
#    $h$ for every input but $m_0$;
# 4. compares the two gradient conventions, `stabilizer_grad="exact"` ($m$ differentiated)
#    and `"stop"` ($m$ held constant, xLSTM's CUDA backward), on a truncated-BPTT loss that
#    also reads the returned state $(c, n, m)$;
# 5. lets the oracle, `check_vjp` (central differences in float64), decide which is exact;
# 6. holds xLSTM's own vanilla cell (PyTorch autograd, float64) to the same gradient, when
#    `xlstm` is installed.
#
# Notation is docs/spec.md's (§2 and §19): $\bar a = \partial L/\partial a$. Every call names
# `backend="reference"`.

# %%
import numpy as np

import gradcells as gc
from gradcells.cells.slstm.reference import recurrent
from gradcells.oracle import check_vjp

REF = {"backend": "reference"}
NAMES = ("x", "c0", "n0", "m0", "h0", "w", "r", "b")
T, B, I, H, N = 5, 2, 3, 4, 2          # steps, batch, inputs, hidden, heads


def sigmoid(a):
    return 1 / (1 + np.exp(-a))


def weights(rng, scale=1.0):
    """``w [I, 4H]``, ``r [N, H/N, 4H/N]``, ``b [4H]`` (gate blocks i, f, z, o)."""
    return (rng.standard_normal((I, 4 * H)) * scale / np.sqrt(I),
            rng.standard_normal((N, H // N, 4 * H // N)) * scale / np.sqrt(H),
            rng.standard_normal(4 * H) * 0.5)


def state(rng):
    """A carried state ``(c0, n0, m0, h0)``: ``n0 > 0``, as after some steps."""
    return (rng.standard_normal((B, H)) * 0.5, rng.uniform(0.5, 2.0, (B, H)),
            rng.standard_normal((B, H)), rng.standard_normal((B, H)) * 0.5)


def unstabilised(x, c0, n0, m0, h0, w, r, b, forget="sigmoid"):
    """The sLSTM without the stabiliser: ``i = e^ĩ``, ``f = σ(f̃)`` or ``e^f̃``, started from
    the state ``(c0·e^{m0}, n0·e^{m0})`` that the stabilised ``(c0, n0, m0)`` stands for.
    Returns every step's ``h`` and the final ``(c, n)``."""
    c, n, h = c0 * np.exp(m0), n0 * np.exp(m0), h0
    hs = []
    for t in range(x.shape[0]):
        it, ft, zt, ot = np.split(x[t] @ w + recurrent(h, r) + b, 4, axis=-1)
        f = sigmoid(ft) if forget == "sigmoid" else np.exp(ft)
        c = f * c + np.exp(it) * np.tanh(zt)
        n = f * n + np.exp(it)
        h = sigmoid(ot) * c / n
        hs.append(h)
    return np.stack(hs), c, n

# %% [markdown]
# ## 1. Exponential gating overflows
#
# The unstabilised step is
#
# $$i = e^{\tilde\imath},\quad f = \sigma(\tilde f)\ \text{or}\ e^{\tilde f},\quad
#   c_t = f\,c_{t-1} + i\,z,\quad n_t = f\,n_{t-1} + i,\quad h_t = o\,c_t/n_t .$$
#
# float32's largest number is about $e^{88.7}$, so an input-gate pre-activation of 89
# already gives $i = \infty$, and then $c/n = \infty/\infty = $ NaN. With the exponential
# forget gate it need not even be one large value: $n_t$ is a sum of products
# $e^{\tilde f_t + \dots + \tilde f_{s+1} + \tilde\imath_s}$, so modest pre-activations
# *accumulate* past the limit over a sequence.

# %%
with np.errstate(over="ignore", invalid="ignore"):
    for a in (80.0, 88.0, 89.0):
        i = np.exp(np.float32(a))
        c, n = i * np.float32(0.3), i            # one step from a zero state, z = 0.3
        print(f"ĩ = {a:4.0f}:  i = e^ĩ = {i:.3e}   c/n = {c / n}")

# %% [markdown]
# Yet $h$ never needed the scale: multiplying $c$ and $n$ by any $\lambda > 0$ multiplies
# every later $c$ and $n$ by $\lambda$ too (both are linear in the pair $(c_{t-1},
# n_{t-1})$ with the same $f$), and $o\,c/n$ is unchanged. That freedom is what the
# stabiliser spends.

# %%
rng = np.random.default_rng(0)
c, n, o = rng.standard_normal(4), rng.uniform(0.5, 2, 4), rng.uniform(0, 1, 4)
print("o·c/n =", np.array2string(o * c / n, precision=6))
for lam in (1e-30, 1e30):
    print(f"λ = {lam:.0e}:  max |o·(λc)/(λn) - o·c/n| = "
          f"{np.abs(o * (lam * c) / (lam * n) - o * c / n).max():.1e}")

# %% [markdown]
# A sequence with the exponential forget gate and moderate pre-activations (the biases of
# $\tilde\imath$ and $\tilde f$ raised by 6 and 4), $T = 30$ steps. In float32
# $n_t \approx e^{\sum \tilde f}$ leaves the range after about twenty steps.

# %%
rng = np.random.default_rng(1)
TL = 30
w, r, b = weights(rng)
b[:H] += 6.0                 # ĩ around 6
b[H:2 * H] += 4.0            # f̃ around 4 (forget="exp": f = e^f̃ > 1)
x = rng.standard_normal((TL, B, I))
c0, n0, m0, h0 = state(rng)
args64 = (x, c0, n0, m0, h0, w, r, b)
args32 = tuple(a.astype(np.float32) for a in args64)

with np.errstate(over="ignore", invalid="ignore"):
    h32, _, n32 = unstabilised(*args32, forget="exp")
    h64, _, n64 = unstabilised(*args64, forget="exp")
first_bad = int(np.argmax(~np.isfinite(h32).all(axis=(1, 2))))
print(f"unstabilised, float32: first non-finite h at step {first_bad}; "
      f"{np.isnan(h32).sum()} of {h32.size} h are NaN")
print(f"unstabilised, float64: max log n_T = {np.log(n64).max():.1f} "
      f"(float32 overflows above {np.log(np.finfo(np.float32).max):.1f}); h finite: "
      f"{np.isfinite(h64).all()}")

# %% [markdown]
# ## 2. The stabiliser
#
# Carry $m_t$, the log of the scale, and divide it out of both gates:
#
# $$m_t = \max(\tilde\imath,\ \log f + m_{t-1}),\qquad i' = e^{\tilde\imath - m_t},\qquad
#   f' = e^{\log f + m_{t-1} - m_t},$$
#
# with $\log f = \log\sigma(\tilde f)$ (written $-\mathrm{softplus}(-\tilde f)$, finite
# for every $\tilde f$) or $\tilde f$. Both exponents are $\le 0$, so $i', f' \le 1$ and one
# of them is exactly 1. By induction $c_t = c^{u}_t e^{-m_t}$ and $n_t = n^{u}_t
# e^{-m_t}$ ($u$: unstabilised), so $h$ is the same and $m_t$ holds the part of the scale
# that would overflow. `gc.slstm_sequence` is this forward; in float64, where the
# unstabilised run is finite, the two agree, and in float32 the stabilised run stays finite.

# %%
seq64 = gc.slstm_sequence(*args64, forget="exp", **REF)
seq32 = gc.slstm_sequence(*args32, forget="exp", **REF)
_, cu, nu = unstabilised(*args64, forget="exp")
print(f"float64: max |h_stabilised - h_unstabilised| = {np.abs(seq64.h - h64).max():.1e}")
print(f"float64: max rel |c_T·e^(m_T) - c_T^u| = "
      f"{np.abs(seq64.c_final * np.exp(seq64.m_final) / cu - 1).max():.1e},  "
      f"n: {np.abs(seq64.n_final * np.exp(seq64.m_final) / nu - 1).max():.1e}")
print(f"float32 stabilised: h finite: {np.isfinite(seq32.h).all()},  max m_T = "
      f"{seq32.m_final.max():.1f},  max |h32 - h64| = {np.abs(seq32.h - seq64.h).max():.1e}")
print(f"gates: max i' = {seq64.i.max():.3f}, max f' = {seq64.f.max():.3f}, "
      f"min over units of max(i', f') = {np.maximum(seq64.i, seq64.f).min():.3f}")

# %% [markdown]
# ## 3. The backward, in terms of saved outputs
#
# Walk back one step with $\bar c, \bar n, \bar m$ the total gradients of the step's new
# state (its upstream plus what step $t{+}1$ sends back) and $\bar h$ that of its output.
# Every line uses only what the forward saved ($i', f', z, o, c, n, h$ and the state it
# started from):
#
# $$h = o\,c/n:\quad \bar c \mathrel{+}= \bar h\,o/n,\quad \bar n \mathrel{-}= \bar h\,h/n,
#   \quad \bar{\tilde o} = \bar h\,(c/n)\,o(1-o),$$
# $$c, n:\quad \bar{\imath}' = \bar c\,z + \bar n,\quad \bar f' = \bar c\,c_{t-1} + \bar n\,
#   n_{t-1},\quad \bar{\tilde z} = \bar c\,i'(1-z^2),\quad \bar c_{t-1} = \bar c f',\quad
#   \bar n_{t-1} = \bar n f',$$
# $$i' = e^{\tilde\imath - m},\ f' = e^{\log f + m_{t-1} - m}:\quad
#   \bar m \mathrel{-}= \bar\imath' i' + \bar f' f',$$
# $$m = \max(\tilde\imath, \log f + m_{t-1}):\quad
#   \bar{\tilde\imath} = \bar\imath' i' + [\tilde\imath\ \text{taken}]\,\bar m,\quad
#   \overline{\log f} = \bar m_{t-1} = \bar f' f' + [\log f + m_{t-1}\ \text{taken}]\,\bar m,$$
#
# and $\bar{\tilde f} = \overline{\log f}\,\sigma(-\tilde f)$ (sigmoid forget) or
# $\overline{\log f}$ (exp). The max's subgradient goes to the branch taken, a tie to
# $\tilde\imath$; the branch is read from the saved gate ($\tilde\imath$ taken where $i' =
# 1$). `stabilizer_grad="stop"` drops the two $\bar m$ lines: $\bar m = 0$,
# $\bar m_{t-1} = 0$.
#
# **Why $m$ cancels from a loss on $h$.** If the loss reads only $h$, the upstream $\bar m$
# is zero and the $\bar m$ that reaches the max, $-(\bar\imath' i' + \bar f' f')$, is the
# derivative of the loss along "scale $c$ and $n$ by $e^{-\delta}$": zero, by the
# invariance of section 1. So the rest of the gradient is the same with or without the
# $\bar m$ terms, except where the scale enters from outside the cell: $m_0$, the log-scale
# of the initial $(c_0, n_0)$. There $h$ sees $c_0 e^{m_0}$ and $n_0 e^{m_0}$, so
#
# $$\bar m_0 = \bar c_0\, c_0 + \bar n_0\, n_0 \quad(\text{exact}),\qquad \bar m_0 = 0\quad
#   (\text{stop}).$$

# %%
rng = np.random.default_rng(2)
w, r, b = weights(rng)
x = rng.standard_normal((T, B, I))
args = (x, *state(rng), w, r, b)
d_h = rng.standard_normal((T, B, H))


def grads(convention, args, **upstream):
    seq = gc.slstm_sequence(*args, stabilizer_grad=convention, **REF)
    return gc.slstm_sequence_grad(*args, seq, **upstream, **REF)


exact, stop = grads("exact", args, d_h=d_h), grads("stop", args, d_h=d_h)
print("loss on h alone:  max |exact - stop| per input")
for name in NAMES:
    print(f"  {name:3s} {np.abs(getattr(exact, name) - getattr(stop, name)).max():.1e}")
c0, n0 = args[1], args[2]
print(f"exact m̄0 vs c̄0·c0 + n̄0·n0: max diff "
      f"{np.abs(exact.m0 - (exact.c0 * c0 + exact.n0 * n0)).max():.1e};  "
      f"stop m̄0 max |·| = {np.abs(stop.m0).max():.1e}")
taken = gc.slstm_sequence(*args, **REF).i >= 1
print(f"the max took ĩ at {int(taken.sum())} of {taken.size} (step, row, unit)s, "
      f"log f + m_prev at the rest")

# %% [markdown]
# ## 4. Truncated BPTT: a loss on the returned state
#
# Truncated backpropagation through time runs a long sequence in windows, carrying the state
# $(c, n, m, h)$ from one window to the next; the loss of a window that is differentiated
# through that carry reads the *returned* state, not only $h$:
#
# $$L = \langle \bar h, h_{1..T}\rangle + \langle \bar c_T, c_T\rangle + \langle \bar n_T,
#   n_T\rangle + \langle \bar m_T, m_T\rangle .$$
#
# $c_T$ and $n_T$ carry the factor $e^{-m_T}$ themselves, so nothing cancels now, and
# holding $m$ constant changes every gradient.

# %%
d_state = {k: rng.standard_normal((B, H)) for k in ("d_c_final", "d_n_final", "d_m_final")}
exact_s = grads("exact", args, d_h=d_h, **d_state)
stop_s = grads("stop", args, d_h=d_h, **d_state)
print("loss on h and the returned c, n, m:  max |exact - stop| per input")
for name in NAMES:
    print(f"  {name:3s} {np.abs(getattr(exact_s, name) - getattr(stop_s, name)).max():.1e}")

# %% [markdown]
# ## 5. The oracle decides
#
# `check_vjp(f, vjp, args)` draws a random cotangent for $f$'s outputs, asks `vjp` for the
# gradient of $\langle \text{cotangent}, f\rangle$ and compares every element with a central
# difference of $f$ in float64. $f$ returns either $h$ alone or $h$ and the returned $(c_T,
# n_T, m_T)$; `vjp` is `gc.slstm_sequence_grad` with one convention.

# %%
def oracle_pair(convention, with_state):
    def f(*a):
        seq = gc.slstm_sequence(*a, stabilizer_grad=convention, **REF)
        return (seq.h, seq.c_final, seq.n_final, seq.m_final) if with_state else seq.h

    def vjp(ct, *a):
        seq = gc.slstm_sequence(*a, stabilizer_grad=convention, **REF)
        if with_state:
            d_h, d_c, d_n, d_m = ct
            return tuple(gc.slstm_sequence_grad(*a, seq, d_h=d_h, d_c_final=d_c,
                                                d_n_final=d_n, d_m_final=d_m, **REF))
        return tuple(gc.slstm_sequence_grad(*a, seq, d_h=ct, **REF))

    return f, vjp


reports = {}
for with_state in (False, True):
    for convention in ("exact", "stop"):
        report = check_vjp(*oracle_pair(convention, with_state), args, names=NAMES)
        reports[convention, with_state] = report
        failed = [c.name for c in report.checks if not c.passed]
        print(f"{'h + state' if with_state else 'h only':9s} {convention:5s}: "
              f"{'PASS' if report.passed else 'FAIL'}"
              f"{'  (failing: ' + ', '.join(failed) + ')' if failed else ''}")

# %% [markdown]
# "exact" passes both. "stop" fails on $h$ alone only at $m_0$ (section 3), and on the
# state loss everywhere. Its table:

# %%
print(reports["stop", True])

# %% [markdown]
# And "stop" on $h$ alone, with $m_0$ left out of the check (`wrt`), passes: holding $m$
# constant is exact for a loss on $h$ from a constant initial state, what xLSTM's CUDA
# backward is usually asked, and wrong as soon as the loss reads the returned state.

# %%
report = check_vjp(*oracle_pair("stop", False), args, names=NAMES, wrt=[0, 1, 2, 4, 5, 6, 7])
print("h only, stop, every input but m0:", "PASS" if report.passed else "FAIL")

# %% [markdown]
# ## 6. xLSTM's vanilla cell
#
# xLSTM's vanilla PyTorch backend computes $m$ with `torch.max` and lets autograd
# differentiate it, so it should agree with "exact". Its cell takes the gate
# pre-activations $Wx$ (its layer projects the input outside the cell), so gradcells runs
# with $w = I_{4H}$; `gc.layouts.slstm_from_xlstm` maps its recurrent kernel and bias, and
# its state is stacked $(h, c, n, m)$.

# %%
try:
    import torch
    from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig
except ImportError:
    print("xlstm (or PyTorch) is not installed: the comparison with xLSTM's cell is skipped")
else:
    rng = np.random.default_rng(3)
    d = H // N
    kernel = rng.standard_normal((N, d, 4, d)) / np.sqrt(H)
    bias = rng.standard_normal((N, 4, d)) * 0.5
    wx = rng.standard_normal((B, T, 4 * H))
    st = np.stack([rng.standard_normal((B, H)) * 0.5, rng.standard_normal((B, H)) * 0.5,
                   rng.uniform(0.5, 2.0, (B, H)), rng.standard_normal((B, H))])  # h, c, n, m
    config = sLSTMCellConfig(hidden_size=H, num_heads=N, backend="vanilla", dtype="float32",
                             output_shape="SBH", enable_automatic_mixed_precision=False)
    cell = sLSTMCell(config).double()
    with torch.no_grad():
        cell._recurrent_kernel_.copy_(cell._recurrent_kernel_ext2int(torch.from_numpy(kernel)))
        cell._bias_.copy_(cell._bias_ext2int(torch.from_numpy(bias)))
    wx_t, st_t = torch.from_numpy(wx).requires_grad_(), torch.from_numpy(st).requires_grad_()
    out, final = cell(wx_t, st_t)
    ct_out, ct_final = rng.standard_normal(out.shape), rng.standard_normal(final.shape)
    loss = (out * torch.from_numpy(ct_out)).sum() + (final * torch.from_numpy(ct_final)).sum()
    d_wx, d_st = torch.autograd.grad(loss, (wx_t, st_t))

    conv = gc.layouts.slstm_from_xlstm(kernel, bias)
    xs = (np.ascontiguousarray(wx.transpose(1, 0, 2)), *conv.gradcells_states(*st), *conv)
    upstream = dict(d_h=ct_out, d_h_final=ct_final[0], d_c_final=ct_final[1],
                    d_n_final=ct_final[2], d_m_final=ct_final[3])
    seq = gc.slstm_sequence(*xs, **REF)
    print(f"forward: max |h_xlstm - h| = {np.abs(out.detach().numpy() - seq.h).max():.1e}")
    for convention in ("exact", "stop"):
        g = grads(convention, xs, **upstream)
        ours = np.stack([g.h0, g.c0, g.n0, g.m0])
        print(f"{convention:5s}: max |autograd - grad| for Wx "
              f"{np.abs(d_wx.numpy() - g.x.transpose(1, 0, 2)).max():.1e}, "
              f"for the state (h, c, n, m) {np.abs(d_st.numpy() - ours).max():.1e}")
