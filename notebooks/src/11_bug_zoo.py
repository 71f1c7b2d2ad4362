# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 11. A bug zoo
#
# Hand-written backward passes of LSTMs have been shipped wrong in the same few ways again
# and again. This notebook writes a correct backward pass of a short LSTM sequence in plain
# NumPy, then breaks it five ways, one line each, the way real code has been broken:
#
# | bug | the wrong line |
# |---|---|
# | a missing σ′ | `do = dh * co` without `o * (1 - o)` |
# | the recurrent gradient not carried | `dh = d_h[t]`, the later step's `dh_next` not added |
# | `=` where `+=` belongs | a weight gradient overwritten at every step |
# | the final cell state's cotangent dropped | `d_cs_final` ignored (deeplearning4j #8838) |
# | swapped peepholes | the gradients of `wci` and `wcf` exchanged |
#
# For each, the oracle `gc.check_vjp` catches it and says where: the argument, the
# element, the claimed and the numeric derivative. Then the cheaper checks: the oracle's
# `fast=True` mode (one directional derivative), the Taylor test `gc.taylor_test` (a slope
# of 1 where a right gradient has 2), and Hypothesis shrinking a failing case to the
# smallest sizes $(B, H, T)$ at which the bug shows. Last, what is *not* a bug: a clip
# exactly at its boundary, reported as a kink.
#
# Notation as in docs/spec.md §2; every gradcells call names `backend="reference"`.

# %%
import matplotlib.pyplot as plt
import numpy as np
from hypothesis import find, settings
from hypothesis import strategies as st

import gradcells as gc

plt.rcParams.update({"figure.dpi": 80, "figure.figsize": (9, 3.4)})
REF = {"backend": "reference"}
NAMES = ("x", "cs0", "h0", "w", "b", "wci", "wcf", "wco")

# %% [markdown]
# ## The right backward pass
#
# The forward is gradcells's `lstm_sequence` with peepholes; the function the oracle sees
# maps the eight inputs to every step's output $h$ and the final cell state
# $\mathrm{cs}_T$, so that the loss $L = \langle \bar h, h\rangle + \langle
# \overline{\mathrm{cs}}_T, \mathrm{cs}_T\rangle$ has a cotangent for each. The backward
# walks the steps from last to first, carrying the gradients of the state after step $t$,
# $(\overline{h}_{next}, \overline{\mathrm{cs}}_{next})$:
#
# $$\bar h = \bar h_t + \bar h_{next},\quad \bar G_o = \bar h\circ\mathrm{co}\circ o(1-o),
#   \quad \overline{\mathrm{cs}} = \overline{\mathrm{cs}}_{next} + \bar h\circ o\circ
#   (1-\mathrm{co}^2) + \bar G_o\circ w_{co},$$
# $$\bar G_i = \overline{\mathrm{cs}}\circ\mathrm{ci}\circ i(1-i),\quad
#   \bar G_c = \overline{\mathrm{cs}}\circ i\circ(1-\mathrm{ci}^2),\quad
#   \bar G_f = \overline{\mathrm{cs}}\circ\mathrm{cs}_{prev}\circ f(1-f),$$
# $$\bar w \mathrel{+}= [x_t, h_{prev}]^\top \bar G,\quad [\bar x_t, \bar h_{next}] =
#   \bar G\, w^\top,\quad \overline{\mathrm{cs}}_{next} = \overline{\mathrm{cs}}\circ f +
#   \bar G_i\circ w_{ci} + \bar G_f\circ w_{cf},$$
#
# and the peepholes sum over the batch and the steps: $\bar w_{ci} \mathrel{+}= \sum_b \bar
# G_i\circ\mathrm{cs}_{prev}$, $\bar w_{cf} \mathrel{+}= \sum_b \bar G_f\circ
# \mathrm{cs}_{prev}$, $\bar w_{co} \mathrel{+}= \sum_b \bar G_o\circ\mathrm{cs}$. The
# function below is that, line for line; `bug` names the one line to get wrong, and each
# wrong line sits beside its right one.

# %%
def forward(x, cs0, h0, w, b, wci, wcf, wco):
    seq = gc.lstm_sequence(x, cs0, h0, w, b, wci=wci, wcf=wcf, wco=wco, **REF)
    return seq.h, seq.cs_final


def backward(ct, x, cs0, h0, w, b, wci, wcf, wco, bug=None):
    d_h, d_cs_final = ct
    seq = gc.lstm_sequence(x, cs0, h0, w, b, wci=wci, wcf=wcf, wco=wco, **REF)
    n_in = x.shape[2]
    cs_prev = np.concatenate([cs0[None], seq.cs[:-1]])
    h_prev = np.concatenate([h0[None], seq.h[:-1]])
    dx, dw, db = np.zeros_like(x), np.zeros_like(w), np.zeros_like(b)
    dwci, dwcf, dwco = np.zeros_like(wci), np.zeros_like(wcf), np.zeros_like(wco)
    dh_next = np.zeros_like(h0)
    if bug == "d_cs_final dropped":
        dcs_next = np.zeros_like(cs0)                      # BUG: the final cotangent ignored
    else:
        dcs_next = d_cs_final.copy()
    for t in reversed(range(x.shape[0])):
        i, cs, f, o, ci, co = (seq.i[t], seq.cs[t], seq.f[t], seq.o[t], seq.ci[t], seq.co[t])
        if bug == "dh_next not added":
            dh = d_h[t]                                    # BUG: the recurrent path cut
        else:
            dh = d_h[t] + dh_next
        if bug == "missing σ'":
            do = dh * co                                   # BUG: no o(1-o)
        else:
            do = dh * co * o * (1 - o)
        dcs = dcs_next + dh * o * (1 - co * co) + do * wco
        di = dcs * ci * i * (1 - i)
        dci = dcs * i * (1 - ci * ci)
        df = dcs * cs_prev[t] * f * (1 - f)
        d_gates = np.concatenate([di, dci, df, do], axis=1)
        xh = np.concatenate([x[t], h_prev[t]], axis=1)
        if bug == "= for +=":
            dw = xh.T @ d_gates                            # BUG: overwritten every step
        else:
            dw += xh.T @ d_gates
        db += d_gates.sum(axis=0)
        if bug == "swapped peepholes":
            dwcf += (di * cs_prev[t]).sum(axis=0)          # BUG: wci's gradient into wcf
            dwci += (df * cs_prev[t]).sum(axis=0)          #      and wcf's into wci
        else:
            dwci += (di * cs_prev[t]).sum(axis=0)
            dwcf += (df * cs_prev[t]).sum(axis=0)
        dwco += (do * cs).sum(axis=0)
        d_xh = d_gates @ w.T
        dx[t] = d_xh[:, :n_in]
        dh_next = d_xh[:, n_in:]
        dcs_next = dcs * f + di * wci + df * wcf
    return dx, dcs_next, dh_next, dw, db, dwci, dwcf, dwco


def buggy(bug):
    return lambda ct, *args: backward(ct, *args, bug=bug)


BUGS = ("missing σ'", "dh_next not added", "= for +=", "d_cs_final dropped",
        "swapped peepholes")


def make_case(seed=0, steps=3, batch=2, input_size=2, hidden=3):
    case = gc.testing.lstm_sequence_case(np.random.default_rng(seed), steps=steps,
                                         batch=batch, input_size=input_size, hidden=hidden,
                                         peephole=True)
    return tuple(case[k] for k in NAMES)


args = make_case()

# %% [markdown]
# Before breaking it: the right version agrees with gradcells's own `lstm_sequence_grad`
# to round-off, and passes the oracle in every argument.

# %%
rng = np.random.default_rng(1)
ct = (rng.standard_normal(args[0].shape[:2] + (args[2].shape[1],)),
      rng.standard_normal(args[1].shape))
ours = backward(ct, *args)
seq = gc.lstm_sequence(*args[:5], wci=args[5], wcf=args[6], wco=args[7], **REF)
theirs = gc.lstm_sequence_grad(*args[:5], seq, d_h=ct[0], d_cs_final=ct[1], wci=args[5],
                               wcf=args[6], wco=args[7], **REF)
print("max |ours - gradcells's|:", max(np.abs(a - b).max() for a, b in zip(ours, theirs)))
right = gc.check_vjp(forward, backward, args, names=NAMES)
print(right)
assert right.passed, "UNEXPECTED: the right backward failed the oracle"

# %% [markdown]
# ## Five bugs, five reports
#
# For each bug the full report, then its worst element: the failing argument and element
# furthest past its bound, with the claimed (analytic) and the numeric derivative.

# %%
def worst(report):
    """The failing check whose worst element is furthest past its bound."""
    failing = [c for c in report.checks if not c.passed]
    return max(failing, key=lambda c: c.abs_error / max(c.bound, 1e-300))


reports = {}
for bug in BUGS:
    reports[bug] = gc.check_vjp(forward, buggy(bug), args, names=NAMES)
    c = worst(reports[bug])
    print(f"=== {bug}\n{reports[bug]}\n-> worst: {c.name}{list(c.index)}: analytic "
          f"{c.analytic:.6g}, numeric {c.numeric:.6g}\n")
    assert not reports[bug].passed, f"UNEXPECTED: {bug} passed the oracle"

# %% [markdown]
# Each report points at the bug, once one reads *which* arguments fail:
#
# * **missing σ′**: everything fails: $\bar G_o$ is wrong at every step, and it feeds
#   $\bar w$, $\bar b$, $\bar x$ directly, $\overline{\mathrm{cs}}$ through the output
#   peephole and every earlier step through $\bar h_{next}$;
# * **$\bar h_{next}$ not added**: the recurrent path is cut, so every gradient that
#   depends on a later step's output through $h$ is wrong; but the last step's $\bar x_t$
#   is still right, since nothing comes into it from later;
# * **`=` for `+=`**: only $\bar w$ fails (it holds the first step's term alone); every
#   other gradient is right, because $\bar G$ is;
# * **$\overline{\mathrm{cs}}_T$ dropped**: everything fails, since the cotangent of the
#   final state reaches every input; with $\overline{\mathrm{cs}}_T = 0$, as in a loss on
#   $h$ alone, it would pass, which is how it ships;
# * **swapped peepholes**: exactly $\bar w_{ci}$ and $\bar w_{cf}$.

# %%
def failing(report):
    return [c.name for c in report.checks if not c.passed]


assert failing(reports["= for +="]) == ["w"]
assert failing(reports["swapped peepholes"]) == ["wci", "wcf"]
assert len(failing(reports["missing σ'"])) == len(failing(reports["d_cs_final dropped"])) == 8
zero_final = (ct[0], np.zeros_like(ct[1]))          # a loss on h alone
assert gc.check_vjp(forward, buggy("d_cs_final dropped"), args, cotangent=zero_final).passed
dx_error = np.abs(backward(ct, *args)[0] - backward(ct, *args, bug="dh_next not added")[0])
print("dh_next not added: max |error of dx_t| per step t:", dx_error.max(axis=(1, 2)))
assert dx_error[-1].max() == 0 and dx_error[:-1].min(axis=(1, 2)).max() > 0
for bug in BUGS:
    print(f"{bug:>20}: fails {', '.join(failing(reports[bug]))}")

# %% [markdown]
# ## One directional check is enough to catch them
#
# The full report differences every element of every argument: $2N$ evaluations of the
# function for $N$ elements (here $N = $ 99). `fast=True` first asks one question, for a
# random direction $u$ of all the arguments at once:
#
# $$\langle \mathrm{vjp}(\bar y), u\rangle \;\overset?=\; \frac{L(a + \epsilon u) -
#   L(a - \epsilon u)}{2\epsilon},$$
#
# two evaluations. A wrong gradient fails it for almost every $u$ (it would have to be
# wrong only in directions orthogonal to $u$), and only then does the oracle spend the
# full report on saying *where*. Written out, that first question is:

# %%
def directional(vjp, seed=0):
    r = np.random.default_rng(seed)
    cts = (r.standard_normal(forward(*args)[0].shape), r.standard_normal(args[1].shape))
    u = [r.standard_normal(a.shape) for a in args]
    claimed = sum(float(np.sum(g * d)) for g, d in zip(vjp(cts, *args), u))
    eps = np.cbrt(np.finfo(float).eps) * max(1, max(np.abs(a).max() for a in args))

    def loss(s):
        outs = forward(*(a + s * d for a, d in zip(args, u)))
        return sum(float(np.sum(c * o)) for c, o in zip(cts, outs))

    return claimed, (loss(eps) - loss(-eps)) / (2 * eps)


class Counted:
    """``forward``, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *a):
        self.calls += 1
        return forward(*a)


fast = {}
for label, vjp in (("right", backward), *((bug, buggy(bug)) for bug in BUGS)):
    claimed, numeric = directional(vjp)
    counted = Counted()
    fast[label] = gc.check_vjp(counted, vjp, args, names=NAMES, fast=True, repeat=False)
    rows = [c.name for c in fast[label].checks]
    assert (abs(claimed - numeric) <= 1e-7 * abs(numeric)) == (label == "right")
    print(f"{label:>20}: <g, u> = {claimed:+.8f}, difference {numeric:+.8f}; fast=True "
          f"{'passed' if fast[label].passed else 'FAILED'} after {counted.calls} calls of f "
          f"({'one row <g, u>' if rows == ['<g, u>'] else 'then the full report'})")
assert fast["right"].passed and [c.name for c in fast["right"].checks] == ["<g, u>"]
assert not any(fast[bug].passed for bug in BUGS), "UNEXPECTED: fast mode missed a bug"

# %% [markdown]
# The right gradient costs three evaluations of $f$ (the value and one pair) instead of
# $1 + 2N$; every bug is caught by the one directional question (and then, because it
# failed, located by the full per-element report, as above).
#
# ## The Taylor test: slope 2 or slope 1
#
# A different way to ask the same question, with no tolerance to choose: along a direction
# $u$, the remainder $r(h) = |L(a + hu) - L(a) - h\langle g, u\rangle|$ is $O(h^2)$ when
# $g$ is the gradient, and $O(h)$ when it is off by $e$ (the error adds $e\,h$, which wins
# as $h$ shrinks). `gc.taylor_test` halves $h$ twenty times and reads the slope of $\log
# r$ against $\log h$ at the small steps:

# %%
taylor_right = gc.taylor_test(forward, backward, args)
taylor_bug = gc.taylor_test(forward, buggy("dh_next not added"), args)
print(f"right gradient:      slope {taylor_right.slope:.2f}, "
      f"{'pass' if taylor_right.passed else 'FAIL'}")
print(f"dh_next not added:   slope {taylor_bug.slope:.2f}, "
      f"{'pass' if taylor_bug.passed else 'FAIL'}")
assert taylor_right.passed and abs(taylor_right.slope - 2) < 0.2
assert not taylor_bug.passed and abs(taylor_bug.slope - 1) < 0.2

fig, ax = plt.subplots(figsize=(6, 3.4))
for label, rep in (("right", taylor_right), ("dh_next not added", taylor_bug)):
    ax.loglog(rep.steps, rep.remainders, "o-", ms=3, label=f"{label} (slope {rep.slope:.2f})")
hs = np.array(taylor_right.steps)
ax.loglog(hs, hs ** 2 * taylor_right.remainders[0] / hs[0] ** 2, "k:", lw=1, label="∝ h²")
ax.axhline(1e3 * taylor_right.noise, color="grey", lw=0.5)
ax.set_xlabel("h")
ax.set_ylabel("|L(a+hu) - L(a) - h<g, u>|")
ax.legend(fontsize=8)
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
plt.show()

# %% [markdown]
# The right gradient's remainder falls four times per halving until it meets the rounding
# noise of $L$ (the grey line is 1000 times that noise, below which the test reads
# nothing); the wrong one's only twice, at every scale.
#
# ## The smallest case that fails
#
# A failing case of $B = 2$, $H = 3$, $T = 3$ says the gradient is wrong; the smallest
# sizes at which it fails say *what kind* of wrong. The question for one case is the
# oracle's directional check (a yes or no is all a search needs, and it costs a few
# evaluations of the forward). If the smallest case there is, one example, one unit, one
# step, already fails, no search is needed. Otherwise Hypothesis searches the sizes
# $(B, H, T)$, each case drawn from the same seed, and `find` shrinks the first failing one
# as far as it will go: derandomized and without an example database, so the notebook
# finds the same case on every run. (`gc.testing.lstm_sequence_inputs` draws whole cases,
# seeds, scales and forget biases too, for the wider searches of the test suite.)

# %%
SIZES = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4))   # B, H, T


def oracle_fails(bug, sizes):
    """Whether the oracle's directional check fails for ``bug`` on a case of these sizes
    (when it fails the report is the full one, here one sampled element per argument)."""
    batch, hidden, steps = sizes
    case = make_case(seed=0, steps=steps, batch=batch, hidden=hidden)
    report = gc.check_vjp(forward, buggy(bug), case, fast=True, samples=1, repeat=False)
    return [c.name for c in report.checks] != ["<g, u>"]


def smallest_failure(bug):
    if oracle_fails(bug, (1, 1, 1)):
        return (1, 1, 1), "fails at once"
    found = find(SIZES, lambda sizes: oracle_fails(bug, sizes),
                 settings=settings(database=None, derandomize=True, max_examples=30))
    return found, "Hypothesis, shrunk"


smallest = {}
for bug in BUGS:
    smallest[bug], how = smallest_failure(bug)
    print(f"{bug:>20}: smallest failing (B, H, T) = {smallest[bug]}   ({how})")
for bug in ("dh_next not added", "= for +="):
    assert not oracle_fails(bug, (3, 3, 1)), f"UNEXPECTED: {bug} failed at T = 1"
assert smallest["dh_next not added"] == smallest["= for +="] == (1, 1, 2)
assert smallest["missing σ'"] == smallest["swapped peepholes"] == (1, 1, 1)

# %% [markdown]
# Three of the bugs fail already on one example, one unit, one step: they are wrong in
# the cell itself. The other two need $T = 2$ and nothing more: with one step there is no
# $\bar h_{next}$ to add, and `=` and `+=` agree when there is one term to add up. A bug
# that only shows from two steps on lives in the bookkeeping *between* steps, and a test
# suite of single-step cases (or of $T = 1$ sequences) never sees it, at any batch or
# width.
#
# ## Not a bug: a clip at its boundary
#
# The cell clip $\mathrm{cs} = \mathrm{clip}(i\circ\mathrm{ci} + f\circ\mathrm{cs}_{prev},
# \pm c)$ has a kink where $|i\circ\mathrm{ci} + f\circ\mathrm{cs}_{prev}| = c$: there the
# function has two one-sided derivatives and no derivative. Put the clip level exactly on
# one element's unclipped cell state and check the reference's (right) gradient of one
# cell: the central difference straddles the kink and matches neither side, and the
# Richardson extrapolation cannot rescue it. The oracle then differences one-sidedly at
# steps $h$ and $h/2$; when the two one-sided slopes keep their gap as the step halves and
# the claim lies between them, the element is a **kink**, counted apart from the failures
# (docs/spec.md §12).

# %%
cell_case = gc.testing.lstm_cell_case(np.random.default_rng(3), batch=2, input_size=2,
                                      hidden=3)
state = gc.lstm_cell(**cell_case, **REF)
raw = state.i * state.ci + state.f * cell_case["cs_prev"]
cell_case["cell_clip"] = float(abs(raw[0, 1]))             # exactly on element (0, 1)
f, vjp, cell_args, cell_names = gc.testing.lstm_cell_vjp_pair(cell_case, **REF)
kink_report = gc.check_vjp(f, vjp, cell_args, names=cell_names)
print(kink_report)
assert kink_report.passed, "UNEXPECTED: the clip's boundary was reported as a failure"
assert sum(c.kinks for c in kink_report.checks) > 0, "UNEXPECTED: no kink was found"

# %% [markdown]
# Every argument passes, and the ones that reach the clipped element through the step
# report their kinks: a claim at a non-differentiable point is not wrong, and the oracle
# says so instead of failing it. It is no blanket excuse: a claim outside the two one-sided
# slopes still fails, kink or not.
#
# ## The zoo, summed up

# %%
header = ("bug", "caught by check_vjp: failing", "worst element", "fast=True",
          "smallest (B, H, T)")
rows = [(bug, ", ".join(failing(reports[bug])),
         f"{worst(reports[bug]).name}{list(worst(reports[bug]).index)}",
         "caught" if not fast[bug].passed else "MISSED", str(smallest[bug])) for bug in BUGS]
widths = [max(len(r[k]) for r in (header, *rows)) for k in range(len(header))]
for r in (header, tuple("-" * n for n in widths), *rows):
    print("  ".join(cell.ljust(n) for cell, n in zip(r, widths)))

# %% [markdown]
# What the zoo teaches: the oracle catches every one of them, and *which* arguments fail
# is the first clue to where the bug is (a single weight: the accumulation; a pair of
# peepholes: a swap; everything: a derivative in the cell itself). The directional check
# caught all five too and is far cheaper, so it is what to run on every case of a big random
# search; the Taylor test needs no tolerance at all; and the smallest failing case tells
# the cell's bugs ($T = 1$) from the bookkeeping's ($T = 2$).
