# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
# ---

# %% [markdown]
# # 2. The GRU cell, and three errors in a docstring
#
# First the same work as notebook 1 for TensorFlow's GRU block cell: the equations, each
# gradient line derived beside the line of `gradcells/cells/gru/reference.py` that computes it, and
# the oracle's verdict. Then TensorFlow's own documentation of this gradient (the docstring
# of `_GRUBlockCellGrad`), which has three errors (docs/spec.md §6, fault 5): we run the
# docstring as code and watch the oracle catch each error, with its size.

# %%
import inspect

import matplotlib.pyplot as plt
import numpy as np

import gradcells as gc
from gradcells.cells.gru import reference as ref

plt.rcParams.update({"figure.dpi": 80, "figure.figsize": (7, 3.2)})


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
# $W_{ru}$ is $[I+H, 2H]$ with the columns of the reset gate $r$ then the update gate $u$;
# $W_c$ is $[I+H, H]$. The reset gate acts on $h_{prev}$ *before* the candidate's matmul:
#
# $$[r,\ u] = \sigma\big([x,\ h_{prev}]\,W_{ru} + b_{ru}\big), \qquad
#   c = \tanh\big([x,\ r\circ h_{prev}]\,W_c + b_c\big), \qquad
#   h = u\circ h_{prev} + (1-u)\circ c$$

# %%
rng = np.random.default_rng(7)
case = gc.testing.gru_cell_case(rng, batch=3, input_size=4, hidden=5)
names = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
args = tuple(case[k] for k in names)
x, h_prev, w_ru, w_c, b_ru, b_c = args
st = gc.gru_cell(*args, backend="reference")
print({name: value.shape for name, value in st._asdict().items()})

# %% [markdown]
# ## The backward pass
#
# Given $\bar h = \partial L/\partial h$, write `dc_bar`, `du_bar`, `dr_bar` for the gradients
# with respect to the pre-activations of $c$, $u$ and $r$.
#
# **The candidate and the update gate.** $c$ enters $h$ with weight $(1-u)$, and
# $\partial h/\partial u = h_{prev} - c$:
#
# $$\bar c = \bar h\circ(1-u)\circ(1-c^2), \qquad \bar u = \bar h\circ(h_{prev} - c)\circ u(1-u)$$
#
# A loss may also read the gates themselves (every field of a result is an output, spec
# §16.1): their upstream gradients $\partial L/\partial c$, $\partial L/\partial u$ join
# $\bar h$'s paths before the activations' derivatives (`_plus` adds one that is given).

# %%
show(ref.gru_gate_grads, "dc_bar = _plus(d_h * (1 - u)", "du_bar = _plus(d_h * (h_prev - c)")

# %% [markdown]
# **The candidate's matmul.** Its input is $[x,\ r\circ h_{prev}]$, so the transposed matmul
# gives a part of $\partial L/\partial x$ and the gradient $\overline{hr}$ with respect to
# $r\circ h_{prev}$; the weight gradient uses the same input:
#
# $$[\bar x_c,\ \overline{hr}] = \bar c\, W_c^\top, \qquad
#   \frac{\partial L}{\partial W_c} = [x,\ r\circ h_{prev}]^\top \bar c, \qquad
#   \frac{\partial L}{\partial b_c} = \sum_{batch}\bar c$$

# %%
show(ref.gru_gate_grads, "dxhr = dc_bar @ w_c.T")
show(ref.gru_cell_grad, "dw_c = xp.concatenate([x, r * h_prev]", "db_c = dc_bar.sum")

# %% [markdown]
# **The reset gate** enters only through $r\circ h_{prev}$:
# $\bar r = \overline{hr}\circ h_{prev}\circ r(1-r)$. **The gates' matmul** then gives
#
# $$[\bar x_1,\ \bar h_1] = [\bar r,\ \bar u]\, W_{ru}^\top, \qquad
#   \frac{\partial L}{\partial W_{ru}} = [x,\ h_{prev}]^\top [\bar r,\ \bar u], \qquad
#   \frac{\partial L}{\partial b_{ru}} = \sum_{batch} [\bar r,\ \bar u]$$

# %%
show(ref.gru_gate_grads, "dr_bar = _plus(d_hr * h_prev",
     "return dc_bar, xp.concatenate([dr_bar, du_bar]")
show(ref.gru_cell_grad, "dxh_1 = d_ru @ w_ru.T", "w_ru=xp.concatenate")

# %% [markdown]
# **Summing the paths.** $x$ feeds both matmuls. $h_{prev}$ is used three times: in the
# gates' matmul, in $r\circ h_{prev}$, and directly in $u\circ h_{prev}$:
#
# $$\frac{\partial L}{\partial x} = \bar x_1 + \bar x_c, \qquad
#   \frac{\partial L}{\partial h_{prev}} = \bar h_1 + \overline{hr}\circ r + \bar h\circ u$$

# %%
show(ref.gru_gate_grads, "dh_c = d_hr * r")
show(ref.gru_cell_grad, "x=dxh_1", "h_prev=dxh_1")

# %% [markdown]
# The oracle compares all six gradients with float64 central differences of
# $L = \langle \bar h, h\rangle$ for a random cotangent $\bar h$:

# %%
def f(*args):
    return gc.gru_cell(*args, backend="reference").h


def vjp(d_h, *args):
    return gc.gru_cell_grad(*args, gc.gru_cell(*args, backend="reference"), d_h=d_h,
                            backend="reference")


print(gc.check_vjp(f, vjp, args, names=names))

# %% [markdown]
# ## The seed's docstring
#
# TensorFlow documents this gradient in the docstring of `_GRUBlockCellGrad`, the gradient
# its 1.x releases registered for `GRUBlockCell` (`tensorflow/contrib/rnn/python/ops/gru_ops.py`;
# TensorFlow 2 registers none, fault 9; `\circ` is $\circ$, `*` a matmul):
#
# ```
# d_c_bar = d_h \circ (1-u) \circ (1-c \circ c)
# d_u_bar = d_h \circ (h-c) \circ u \circ (1-u)
# d_r_bar_u_bar = [d_r_bar d_u_bar]
# [d_x_component_1 d_h_prev_component_1] = d_r_bar_u_bar * w_ru^T
# [d_x_component_2 d_h_prevr] = d_c_bar * w_c^T
# d_x = d_x_component_1 + d_x_component_2
# d_h_prev = d_h_prev_component_1 + d_h_prevr \circ r + u
#
# d_w_ru = x_h_prevr^T * d_c_bar
# d_w_c = x_h_prev^T * d_r_bar_u_bar
# d_b_ru = sum of d_r_bar_u_bar along axis = 0
# d_b_c = sum of d_c_bar along axis = 0
# ```
#
# Set beside the derivation above, three lines differ:
#
# | fault | the docstring says | correct |
# |---|---|---|
# | `(h - c)` | `d_u_bar = d_h ∘ (h-c) ∘ u ∘ (1-u)` | `(h_prev - c)` |
# | `+ u` | `d_h_prev = d_h_prev_component_1 + d_h_prevr ∘ r + u` | `+ d_h ∘ u` |
# | `swap` | `d_w_ru = x_h_prevr^T * d_c_bar`, `d_w_c = x_h_prev^T * d_r_bar_u_bar` | exchanged |
#
# The code under the docstring is right; the docstring is what a reader learns from. Below it
# is transcribed line by line. `fixed` names the faults to correct, so we can run the docstring
# as written (`fixed=()`), with one fault at a time, or with all three corrected. The
# docstring never defines `d_r_bar`; we use the kernel's (and our) definition.

# %%
FAULTS = ("(h - c)", "+ u", "swap")


def docstring_grad(d_h, x, h_prev, w_ru, w_c, b_ru, b_c, *, fixed=()):
    r, u, c, h = gc.gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c, backend="reference")
    n_in = x.shape[1]
    d_c_bar = d_h * (1 - u) * (1 - c * c)
    d_u_bar = d_h * ((h_prev if "(h - c)" in fixed else h) - c) * u * (1 - u)
    d_xc = d_c_bar @ w_c.T
    d_x_component_2, d_h_prevr = d_xc[:, :n_in], d_xc[:, n_in:]
    d_r_bar = d_h_prevr * h_prev * r * (1 - r)
    d_r_bar_u_bar = np.concatenate([d_r_bar, d_u_bar], axis=1)
    d_xh = d_r_bar_u_bar @ w_ru.T
    d_x_component_1, d_h_prev_component_1 = d_xh[:, :n_in], d_xh[:, n_in:]
    d_x = d_x_component_1 + d_x_component_2
    d_h_prev = d_h_prev_component_1 + d_h_prevr * r + (d_h * u if "+ u" in fixed else u)
    x_h_prev = np.concatenate([x, h_prev], axis=1)
    x_h_prevr = np.concatenate([x, h_prev * r], axis=1)
    if "swap" in fixed:
        d_w_ru, d_w_c = x_h_prev.T @ d_r_bar_u_bar, x_h_prevr.T @ d_c_bar
    else:
        d_w_ru, d_w_c = x_h_prevr.T @ d_c_bar, x_h_prev.T @ d_r_bar_u_bar
    return d_x, d_h_prev, d_w_ru, d_w_c, d_r_bar_u_bar.sum(axis=0), d_c_bar.sum(axis=0)


def check_docstring(fixed, **options):
    grad = lambda d_h, *args: docstring_grad(d_h, *args, fixed=fixed)  # noqa: E731
    return gc.check_vjp(f, grad, args, names=names, **options)

# %% [markdown]
# With all three faults corrected, the transcription passes: it differs from the truth in
# exactly those three places.

# %%
print(check_docstring(fixed=FAULTS))

# %% [markdown]
# **The docstring as written** does not even produce gradients of the right shape: $W_{ru}$ is
# $[I+H, 2H]$ but `x_h_prevr^T * d_c_bar` is $[I+H, H]$. The oracle checks shapes before values:

# %%
try:
    check_docstring(fixed=())
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# The swap is caught by shape alone, for every $H$: the two weight gradients have $H$ and $2H$
# columns. Now each of the other two faults alone (the others corrected), with the worst
# element of each argument:

# %%
reports = {"correct": check_docstring(fixed=FAULTS)}
for fault in ("(h - c)", "+ u"):
    reports[fault] = check_docstring(fixed=tuple(k for k in FAULTS if k != fault))
    print(f"--- the {fault} fault alone\n{reports[fault]}\n")

# %% [markdown]
# The sizes are what the algebra predicts.
#
# * **`(h - c)`**: since $h - c = u\circ h_{prev} + (1-u)\circ c - c = u\circ(h_{prev} - c)$, the
#   docstring's $\bar u$ is the true one times $u$: each element too small in magnitude by the
#   fraction $(1-u)$ of its value, a relative error of about a half for gates near $0.5$; sums over
#   the batch (the weight and bias gradients) can be off by more, even in sign. It reaches every
#   gradient that depends on $\bar u$: $x$, $h_{prev}$, the $u$ columns of $W_{ru}$ (45 of its 90
#   entries fail) and the $u$ half of $b_{ru}$ (5 of 10). $W_c$, $b_c$ and the $r$ columns pass.
# * **`+ u`**: the error in $\partial L/\partial h_{prev}$ is
#   $u - \bar h\circ u = u\circ(1-\bar h)$, of order one, and nothing else is affected.

# %%
labels = list(names)
fig, ax = plt.subplots()
for k, (label, report) in enumerate(reports.items()):
    errors = [max(report[n].rel_error, 1e-16) for n in labels]
    ax.bar(np.arange(len(labels)) + (k - 1) * 0.27, errors, width=0.27,
           label=label if label == "correct" else f"{label} fault")
ax.set_yscale("log")
ax.set_xticks(range(len(labels)), labels)
ax.set_ylabel("worst relative error")
ax.set_title("GRU gradient against float64 finite differences")
ax.axhline(1e-7, color="k", lw=0.8, ls="--", label="oracle rtol")
ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.12))
plt.show()

# %% [markdown]
# ## Why the cotangent is random
#
# The `+ u` fault is wrong by $u\circ(1-\bar h)$, which vanishes when $\bar h = 1$. A check that
# differentiates $L = \sum h$ (cotangent of ones, a common shortcut) cannot see it:

# %%
ones = check_docstring(fixed=("(h - c)", "swap"), cotangent=np.ones_like(st.h))
print("+ u fault, cotangent of ones:  passed =", ones.passed)
print("+ u fault, random cotangent:   passed =", reports["+ u"].passed)

# %% [markdown]
# A random normal cotangent has no special value, so a wrong term vanishes only on a set of
# probability zero. `check_vjp` draws one from a seeded generator unless you pass your own.
#
# ## Reset after, and the default backend
#
# cuDNN, PyTorch and Keras (`reset_after=True`) apply the reset gate after the recurrent
# matmul: $c = \tanh(x W_{cx} + b_{cx} + r\circ(h_{prev} W_{ch} + b_{ch}))$, so
# $\bar r = \bar c\circ(h_{prev} W_{ch} + b_{ch})\circ r(1-r)$ and $W_{ch}$ receives
# $h_{prev}^\top(\bar c\circ r)$. Both variants pass on the default backend:

# %%
for reset_after in (False, True):
    case = gc.testing.gru_cell_case(np.random.default_rng(1), reset_after=reset_after)
    report = gc.testing.vjp_check("gru_cell", case)
    print(f"reset_after={reset_after!s:5}  passed={report.passed}"
          f"  worst abs err={report.max_abs_error:.1e}")

# %% [markdown]
# **Summary.** The derivation is the chain rule plus bookkeeping: where a value is used twice,
# its gradients add. All three documented faults are bookkeeping errors (a variable confused
# with its neighbour, a factor dropped, two results exchanged), exactly the kind a reader copies
# and a test with an all-ones cotangent can miss. The oracle catches each: the swap by shape,
# the other two by errors of order one.
