"""The diagonal linear recurrence (docs/spec.md §18.1) for any array namespace, and the
candidate activation of Feng et al. 2024's minimal RNNs: what the minGRU and the minLSTM
(docs/spec.md §18.2) share in their references.

    h_t = a_t∘h_{t-1} + c_t

Its steps compose associatively, ``(a, c)`` then ``(a', c')`` being ``(a'∘a, a'∘c + c')``:
``scan`` runs it step by step or as a parallel (Hillis-Steele) scan over time, log2 T rounds
of whole-array products. Its adjoint is the same recurrence backwards in time,

    g_t = d_h_t + a_{t+1}∘g_{t+1},   g_{T-1} = d_h_{T-1} + d_h_final,   dh0 = a_0∘g_0,

which ``adjoint`` runs as a ``scan`` over the reversed steps. Per-row lengths make the steps
past a row's length the identity (``a = 1``, ``c = 0``): the state passes through them
unchanged to ``h_final``, and the adjoint passes ``d_h_final`` back through them.
"""

from __future__ import annotations

from . import plan
from .arrays import namespace_of
from .xpmath import sigmoid

PARALLEL_FROM_STEPS = 8192
""""auto" (every scan op's ``method``) runs the parallel scan from this many steps on, the
sequential one below; the CPU asks for enough cores too (``gradcells.cpu._scan``'s
``PARALLEL_FROM_CORES``: on two cores its chunked scan, two passes over ``a`` and ``c`` on
two threads, was slower than the sequential one at every size measured,
docs/performance.md). The step threshold itself is not measured on a many-core machine
or a GPU."""


def scan_method(method: str, n_steps: int) -> str:
    """The method a sequence of ``n_steps`` runs: ``method``, "auto" resolved by
    ``PARALLEL_FROM_STEPS``."""
    if method != "auto":
        return method
    return "parallel" if n_steps >= PARALLEL_FROM_STEPS else "sequential"


def candidate(xp, p_h, activation):
    """``h̃ = act(p_h)``: the identity, or ``g(v) = v + 0.5`` for ``v >= 0`` and ``σ(v)``
    below (continuous at 0, where both are 0.5)."""
    if activation == "identity":
        return p_h + 0
    return xp.where(p_h >= 0, p_h + 0.5, sigmoid(xp, p_h))


def candidate_grad(xp, p_h, hc, d_hc, activation):
    """``d_hc∘act'(p_h)``: ``d_hc`` for the identity and where ``p_h >= 0``, ``d_hc∘h̃∘(1 -
    h̃)`` (σ's derivative, from the saved ``h̃ = σ(p_h)``) below. The branch reads ``p_h``:
    ``h̃`` alone cannot tell, as ``σ`` of a tiny negative ``p_h`` rounds to 0.5."""
    if activation == "identity":
        return d_hc
    return xp.where(p_h >= 0, d_hc, d_hc * hc * (1 - hc))


def scan(xp, a, c, h0, method):
    """The states ``h [T, B, H]`` of ``h_t = a_t∘h_{t-1} + c_t`` from ``h0``, by ``method``
    ("sequential" or "parallel"), in ``c``'s dtype (``a`` may be real with a complex ``c``)."""
    if method == "parallel":
        return _parallel_scan(xp, a, c, h0)
    h = xp.zeros(c.shape, dtype=c.dtype)
    state = h0
    for t in range(a.shape[0]):
        state = a[t] * state + c[t]
        h[t] = state
    return h


def _parallel_scan(xp, a, c, h0):
    """``scan`` as Hillis and Steele's parallel prefix: the initial state folded into the
    first step, then in round ``k`` every step ``t >= d = 2^k`` composes with step ``t - d``:
    ``c_t <- a_t∘c_{t-d} + c_t``, ``a_t <- a_t∘a_{t-d}``. After ``⌈log2 T⌉`` rounds ``c_t``
    is ``h_t``; each ``h_t`` is a sum of at most ``T`` products, each of at most ``log2 T +
    1`` rounded factors."""
    n_steps = a.shape[0]
    if n_steps == 0:
        return xp.zeros(c.shape, dtype=c.dtype)
    c = xp.concatenate([(a[0] * h0 + c[0])[None], c[1:]], axis=0)
    d = 1
    while d < n_steps:
        c = xp.concatenate([c[:d], a[d:] * c[:-d] + c[d:]], axis=0)
        a = xp.concatenate([a[:d], a[d:] * a[:-d]], axis=0)
        d *= 2
    return c


def adjoint(xp, a, d_h, d_final, method):
    """``(g, dh0)`` of the adjoint recurrence ``g_t = d_h_t + a_{t+1}∘g_{t+1}`` with
    ``g_{T-1} = d_h_{T-1} + d_final``, ``dh0 = a_0∘g_0``: a ``scan`` over the reversed steps
    with the multipliers shifted by one (the last step's is 1)."""
    if a.shape[0] == 0:
        return d_h, d_final * 1       # a fresh array (its tangent too): never an alias
    a_next = xp.concatenate([a[1:], a[:1] * 0 + 1], axis=0)
    g = scan(xp, a_next[::-1], d_h[::-1], d_final, method)[::-1]
    return g, a[0] * g[0]


def running_steps(xp, x, seq_len):
    """``[T, B, 1]`` booleans: the steps each row runs (None without lengths)."""
    return None if seq_len is None else plan.running_mask(xp, x.shape[0], seq_len)[:, :, None]


def only_running(a, running):
    """``a`` zeroed past each row's length (``a`` without lengths; NaN there too)."""
    return a if running is None else namespace_of(a).where(running, a, 0)


def final_state(h, h0):
    """The state after the last step (``h0`` for a sequence of none)."""
    return h[-1].copy() if h.shape[0] else h0 * 1
