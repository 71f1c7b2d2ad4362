"""The plain RNN's fused elementwise passes (Numba), one pass over ``[B, H]`` each way.

The math is ``gradcells.cells.rnn.reference``:

    rnn_forward_kernel(Z, addend, ...)     h = act(Z + addend)
    rnn_backward_kernel(h, carry, ...)     dz = (carry + d_h)∘act'(z) from the saved h, and
                                           the bias sum, accumulated

``cpu.py`` calls them around its BLAS matmuls: once for a cell, once per time step for a
sequence. Their contracts are in their docstrings. ``relu`` selects the activation (False:
tanh); the branch is outside the inner loops, so each loop is one activation's straight-line
arithmetic, which LLVM vectorizes.
"""

from __future__ import annotations

from ...cpu._activations import tanh, typed
from ...cpu._compile import kernel, row_of


@kernel
def rnn_forward_kernel(gates, addend, relu, h):
    """The RNN forward elementwise step; writes ``h``.

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``h.shape[1]``):

    - ``gates [B, H]``: the pre-activations without bias, e.g. ``[x, h_prev]·w``;
    - ``addend [1, H]`` (a cell's bias, broadcast over rows: ``_compile.one_row``) or
      ``[B, H]`` (per row: a sequence's precomputed ``x_t·W_x + b``);
    - ``relu``: True for ``max(z, 0)``, False for ``tanh(z)``;
    - ``h [B, H]``: the output, overwritten (must not overlap the inputs).

    Per element: ``h = act(gates + addend)``; relu keeps NaN (``np.maximum`` does too).
    """
    n_batch, n_hidden = h.shape
    zero = typed(0.0, h)
    for row in range(n_batch):
        g, a, h_r = gates[row], row_of(addend, row), h[row]
        if relu:
            for j in range(n_hidden):
                z = g[j] + a[j]
                h_r[j] = zero if z < zero else z          # NaN fails the test: stays NaN
        else:
            for j in range(n_hidden):
                h_r[j] = tanh(g[j] + a[j])


@kernel
def rnn_backward_kernel(h, carry, d_h, has_d_h, relu, d_z, d_bias):
    """The RNN backward elementwise step, with the bias sum fused.

    Arguments (all arrays C-contiguous, one float dtype; B rows, H = ``h.shape[1]``):

    - ``h [B, H]``: the forward's saved output;
    - ``carry [B, H]``: the gradient of h carried in (a sequence's gradient from the next
      step; a cell's upstream ``d_h``, or zeros);
    - ``d_h [B, H]``: a further upstream gradient, added when ``has_d_h`` (otherwise never
      read: pass any ``[B, H]`` array);
    - ``relu``: the forward's activation (True: relu, False: tanh);
    - ``d_z [B, H]``: dL/dz, overwritten;
    - ``d_bias [H]``: **accumulated** (``+=``, so a sequence can sum over steps; pass zeros
      for one step): Σ_batch dz.

    Per element, the derivative from the saved output (relu'(0) = 0, as PyTorch):

        dz = (carry + d_h)·(1 - h²)        tanh
        dz = (carry + d_h)·[h > 0]         relu
    """
    n_batch, n_hidden = h.shape
    zero = typed(0.0, h)
    one = typed(1.0, h)
    for row in range(n_batch):
        h_r, c_r, dh_r, dz_r = h[row], carry[row], d_h[row], d_z[row]
        if relu:
            for j in range(n_hidden):
                up = c_r[j] + dh_r[j] if has_d_h else c_r[j]
                dz_r[j] = up * (one if h_r[j] > zero else zero)
        else:
            for j in range(n_hidden):
                up = c_r[j] + dh_r[j] if has_d_h else c_r[j]
                dz_r[j] = up * (one - h_r[j] * h_r[j])
        # The reduction in a loop of its own, as in the LSTM's backward kernel: fewer memory
        # streams in each loop for LLVM's overlap checks.
        for j in range(n_hidden):
            d_bias[j] += dz_r[j]


# --------------------------------------------------------------------------------------
# forward mode: the primal's pass (or the forward's own) and the tangent's


@kernel
def rnn_jvp_kernel(gates, addend, t_gates, t_addend, relu, h, t_h):
    """The RNN step and its tangent; writes ``h, t_h [B, H]``.

    ``gates [B, H]`` (e.g. ``h_prev·W_h``), ``addend`` (``x·W_x + b`` or ``b``) and their
    tangents ``t_gates [B, H]``, ``t_addend``; ``relu``: True for relu, False for tanh:

        z = gates + addend;   h = act(z)
        t_h = (t_gates + t_addend)·(1 - h²)      tanh
        t_h = (t_gates + t_addend)·[h > 0]       relu (relu'(0) = 0; NaN gives 0·dz)
    """
    n_batch, n_hidden = h.shape
    zero = typed(0.0, h)
    one = typed(1.0, h)
    for row in range(n_batch):
        g, a, h_r = gates[row], row_of(addend, row), h[row]
        t_g, t_a, t_h_r = t_gates[row], row_of(t_addend, row), t_h[row]
        if relu:
            for j in range(n_hidden):
                z = g[j] + a[j]
                out = zero if z < zero else z
                h_r[j] = out
                t_h_r[j] = (t_g[j] + t_a[j]) * (one if out > zero else zero)
        else:
            for j in range(n_hidden):
                out = tanh(g[j] + a[j])
                h_r[j] = out
                t_h_r[j] = (t_g[j] + t_a[j]) * (one - out * out)


# --------------------------------------------------------------------------------------
# second order: the tangents of the backward kernel's gate gradients


@kernel
def rnn_backward_tangent_kernel(h, t_h, up, t_up, relu, t_d_z, t_d_bias):
    """The tangent of ``rnn_backward_kernel``'s ``dz = up·act'(z)``; writes ``t_d_z [B, H]``
    and accumulates (``+=``) ``t_d_bias [H]`` with Σ_batch t_d_z.

    ``h [B, H]``: the output act'(z) is read from (the step's own, before zoneout) and
    ``t_h`` its tangent; ``up [B, H]``: the gradient the backward kernel took and ``t_up``
    its tangent; ``relu``: the activation (False: tanh):

        t_d_z = t_up·(1 - h²) - up·2h·t_h       tanh
        t_d_z = t_up·[h > 0]                   relu
    """
    n_batch, n_hidden = h.shape
    zero = typed(0.0, h)
    one = typed(1.0, h)
    two = typed(2.0, h)
    for row in range(n_batch):
        h_r, t_h_r, up_r, t_up_r, t_dz_r = h[row], t_h[row], up[row], t_up[row], t_d_z[row]
        if relu:
            for j in range(n_hidden):
                t_dz_r[j] = t_up_r[j] * (one if h_r[j] > zero else zero)
        else:
            for j in range(n_hidden):
                out = h_r[j]
                t_dz_r[j] = t_up_r[j] * (one - out * out) - up_r[j] * (two * out * t_h_r[j])
        for j in range(n_hidden):
            t_d_bias[j] += t_dz_r[j]
