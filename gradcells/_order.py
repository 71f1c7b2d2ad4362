"""Time order and layout of the sequence operations (docs/spec.md §11.1, §11.2): the public
layer hands every backend a time-major sequence that runs forward; ``reverse`` and
``batch_first`` are a reordering of the per-step arrays around that call, written once here
for every cell and backend.

``batch_first``: ``[B, T, ·]`` arrays are swapped to ``[T, B, ·]`` (views) and back.

``reverse``: row b runs its own valid steps from last to first. With ``L = seq_len[b]``, the
per-row time reversal ``π_b(t) = L - 1 - t`` for ``t < L`` (and ``π_b(t) = t`` past the
row's length, where nothing is read or written) turns that into a forward run: the backend
runs ``x[π(t)]`` forward with the same lengths, and its per-step outputs go back through
``π`` (an involution) to their time positions. The final states are the backend's: the
state after the row's last step in run order, which is time 0. Without lengths ``π`` is the
flip ``T - 1 - t``, applied as a view; with lengths it is a gather.

The gradient is the same reordering: the result's per-step fields and the per-step upstream
gradients go into run order, the backend's gradient runs, and ``dx`` comes back; the
weights' and the initial states' gradients need no reordering.

A backend package that runs the reverse direction itself says so: ``NATIVE_REVERSE = True``
(the CPU backend's; ``forward`` and ``grad`` read it from the package passed as
``package``). Its calls with ``reverse`` and lengths skip the gather: the backend gets
``reverse=True`` and every per-step array and mask at its time position (time-major; a
``batch_first`` call is still transposed here) and returns every per-step output at its
time position. Without lengths the flip view stays here for every backend (it costs
nothing), and so do the forward-mode ops (``jvp``, ``grad_jvp``: only the reference has
them).
"""

from __future__ import annotations

import dataclasses

from ._core.arrays import namespace_of
from ._core.specs import MASKS


class _RunOrder:
    """The reordering of one call: ``to_run`` takes a per-step array of the caller's order and
    layout into the backend's (C-contiguous, time-major, in run order), ``from_run`` back.
    ``native``: the backend runs the reverse direction itself, so only the layout changes
    and the backend is told ``reverse`` (``settings``).

    A reordering with lengths is one row gather (``take`` over the ``T·B`` rows of the
    array as a ``[T·B, width]`` matrix, whole rows copied), which does the transpose of
    ``batch_first`` in the same pass; the others are views (``from_run``) or one copy of a
    view (``to_run``).
    """

    def __init__(self, x, settings, native=False):
        self.batch_first, self.native = settings.batch_first, native
        self.reverse = settings.reverse and not native
        self.xp = xp = namespace_of(x)
        n_steps, n_batch = x.shape[1::-1] if self.batch_first else x.shape[:2]
        self.rows = None
        if self.reverse and settings.seq_len is not None:
            lengths, t = settings.seq_len[None, :], xp.arange(n_steps)[:, None]
            source_time = xp.where(t < lengths, lengths - 1 - t, t)    # π, [T, B]
            # The row of a time-major [T·B, ·] matrix that run position (t, b) reads:
            self.rows = source_time * n_batch + xp.arange(n_batch)[None, :]
            # ... and of a batch-major [B·T, ·] one:
            self.rows_bt = xp.arange(n_batch)[None, :] * n_steps + source_time

    def _gather(self, a, rows, shape):
        matrix = a.reshape(a.shape[0] * a.shape[1], a.shape[2])   # no -1: a width may be 0
        return self.xp.take(matrix, rows.reshape(-1), axis=0).reshape(shape)

    def to_run(self, a):
        if a is None:
            return None
        xp = self.xp
        if self.rows is not None:
            shape = (a.shape[1], a.shape[0], a.shape[2]) if self.batch_first else a.shape
            return self._gather(a, self.rows_bt if self.batch_first else self.rows, shape)
        if self.batch_first:
            a = a.transpose(1, 0, 2)
        return xp.ascontiguousarray(a[::-1] if self.reverse else a)

    def mask_to_run(self, name, mask):
        """A mask (``MASKS``) in run order: one with a time axis of T transposed and
        reversed as the per-step arrays are, one that broadcasts over time (or has no time
        axis) as it is, transposed to time-major."""
        labels = MASKS[name]
        if mask is None or labels[0] != "T" or mask.ndim < len(labels):
            return mask
        if mask.ndim == 2:    # a per-step flag [T, B] (``resets``): as a [T, B, 1]
            return self.mask_to_run(name, mask[:, :, None])[:, :, 0]
        if self.batch_first:
            mask = mask.transpose(1, 0, 2)
        if mask.shape[0] == 1 or not self.reverse:
            return mask
        if self.rows is None:
            return mask[::-1]
        full = self.xp.broadcast_to(mask, (self.rows.shape[0], self.rows.shape[1],
                                           mask.shape[2]))
        return self._gather(self.xp.ascontiguousarray(full), self.rows, full.shape)

    def settings(self, settings):
        """``settings`` as the backend is given them: time-major, forward (``reverse`` kept
        when ``native``), masks in run order."""
        masks = {name: self.mask_to_run(name, getattr(settings, name))
                 for name in MASKS if hasattr(settings, name)}
        return dataclasses.replace(settings, reverse=settings.reverse and self.native,
                                   batch_first=False, **masks)

    def from_run(self, a):
        if self.rows is not None:  # π is an involution: the same rows take it back
            if self.batch_first:
                return self._gather(a, self.rows.T, (a.shape[1], a.shape[0], a.shape[2]))
            return self._gather(a, self.rows, a.shape)
        if self.reverse:
            a = a[::-1]
        return a.transpose(1, 0, 2) if self.batch_first else a


def runs_reverse(package, settings):
    """Whether the backend ``package`` is handed this call's ``reverse`` as it is: it runs
    the reverse direction itself (``NATIVE_REVERSE``) and the call has lengths (without
    them the reversal is a flip, a view, here)."""
    return bool(settings.reverse and settings.seq_len is not None
                and getattr(package, "NATIVE_REVERSE", False))


def unread_rows(x, settings):
    """``settings`` as a gradient's backend is given them: the recurrent mask's rows of the
    sequences of length 0 zeroed. No step of such a row runs, so its row of the mask is
    padding (docs/spec.md §11.3: never read); a backend's weight gradients would otherwise
    meet it, masked ``h0`` times zero gate gradients (NaN there gives 0·NaN)."""
    mask, seq_len = getattr(settings, "recurrent_mask", None), settings.seq_len
    if mask is None or seq_len is None or bool((seq_len > 0).all()):
        return settings
    xp = namespace_of(x)
    read = xp.where((seq_len > 0)[:, None], mask, xp.zeros((), mask.dtype))
    return dataclasses.replace(settings, recurrent_mask=read)


def forward(spec, op, x, states, weights, settings, *, package=None):
    """``op(x, *states, weights, settings)`` (a backend's sequence op, of the backend
    ``package``) in the order and layout ``settings`` ask for; returns its result with every
    per-step field in that order."""
    if not (settings.reverse or settings.batch_first):
        return op(x, *states, weights, settings)
    order = _RunOrder(x, settings, runs_reverse(package, settings))
    result = op(order.to_run(x), *states, weights, order.settings(settings))
    return _result_from_run(spec, order, result)


def jvp(spec, op, x, states, weights, tangents, settings):
    """``op(x, *states, weights, tangents, settings)`` (a backend's sequence JVP) in the
    order and layout ``settings`` ask for: ``x``'s tangent goes into run order with ``x``,
    and the result and its tangent come back as ``forward``'s result does."""
    if not (settings.reverse or settings.batch_first):
        return op(x, *states, weights, tangents, settings)
    order = _RunOrder(x, settings)
    pair = op(order.to_run(x), *states, weights, tangents._replace(x=order.to_run(tangents.x)),
              order.settings(settings))
    return tuple(_result_from_run(spec, order, result) for result in pair)


def grad_jvp(spec, op, x, states, weights, result, tangents, settings, upstream, **options):
    """``op`` (a backend's sequence gradient JVP) in the order and layout ``settings`` ask
    for, as ``grad``: the result, the upstream gradients and their tangents
    (``upstream``, by their keywords: ``d_h``, ``d_h_tangent``, ...) and ``x``'s tangent
    go into run order; both ``x`` gradients come back. The recurrent mask is read as
    ``unread_rows`` gives it."""
    seq = spec.result(*result)
    settings = unread_rows(x, settings)
    if not (settings.reverse or settings.batch_first):
        return op(x, *states, weights, seq, tangents, settings, **upstream, **options)
    order = _RunOrder(x, settings)
    seq = spec.result(*(order.to_run(a) if labels[0] == "T" else a
                        for a, labels in zip(seq, spec.result_labels(), strict=True)))
    upstream = {name: order.to_run(g) if spec.upstream_labels(
        name.removesuffix("_tangent"))[0] == "T" else g for name, g in upstream.items()}
    pair = op(order.to_run(x), *states, weights, seq,
              tangents._replace(x=order.to_run(tangents.x)), order.settings(settings),
              **upstream, **options)
    return tuple(g._replace(x=order.from_run(g.x)) for g in pair)


def _result_from_run(spec, order, result):
    """A sequence result with every per-step field back from run order."""
    return type(result)(*(order.from_run(a) if labels[0] == "T" else a
                          for a, labels in zip(result, spec.result_labels(), strict=True)))


def grad(spec, op, x, states, weights, result, settings, upstream, *, package=None,
         **options):
    """``op`` (a backend's sequence gradient, of the backend ``package``) on ``result`` and
    the ``upstream`` gradients in the order and layout ``settings`` ask for; returns the
    gradients, ``x``'s in that order. The recurrent mask is read as ``unread_rows`` gives
    it."""
    seq = spec.result(*result)
    settings = unread_rows(x, settings)
    if not (settings.reverse or settings.batch_first):
        return op(x, *states, weights, seq, settings, **upstream, **options)
    order = _RunOrder(x, settings, runs_reverse(package, settings))
    seq = spec.result(*(order.to_run(a) if labels[0] == "T" else a
                        for a, labels in zip(seq, spec.result_labels(), strict=True)))
    upstream = {name: order.to_run(g) if spec.upstream_labels(name)[0] == "T" else g
                for name, g in upstream.items()}
    grads = op(order.to_run(x), *states, weights, seq, order.settings(settings), **upstream,
               **options)
    return grads._replace(x=order.from_run(grads.x))


# The linear scan (docs/spec.md §18.1): per-step arrays ``a``, ``b`` (and ``resets [T, B]``)
# instead of ``x``, the same reorderings.


def _scan_settings(order, settings):
    """A linear scan's ``settings`` as the backend is given them: ``resets`` in run order."""
    resets = settings.resets
    if resets is not None:
        resets = order.to_run(resets[:, :, None])[:, :, 0]
    return dataclasses.replace(order.settings(settings), resets=resets)


def _scan_result_from_run(order, result):
    return type(result)(order.from_run(result.h), result.h_final)


def scan_forward(op, a, b, h0, settings, *, package=None):
    """``op(a, b, h0, settings)`` (a backend's ``linear_scan``) in the order and layout
    ``settings`` ask for."""
    if not (settings.reverse or settings.batch_first):
        return op(a, b, h0, settings)
    order = _RunOrder(a, settings, runs_reverse(package, settings))
    result = op(order.to_run(a), order.to_run(b), h0, _scan_settings(order, settings))
    return _scan_result_from_run(order, result)


def scan_jvp(op, a, b, h0, tangents, settings):
    """``op(a, b, h0, tangents, settings)`` (a backend's ``linear_scan_jvp``) in the order
    and layout ``settings`` ask for."""
    if not (settings.reverse or settings.batch_first):
        return op(a, b, h0, tangents, settings)
    order = _RunOrder(a, settings)
    pair = op(order.to_run(a), order.to_run(b), h0,
              tangents._replace(a=order.to_run(tangents.a), b=order.to_run(tangents.b)),
              _scan_settings(order, settings))
    return tuple(_scan_result_from_run(order, result) for result in pair)


def _scan_grads_from_run(order, grads):
    return grads._replace(a=order.from_run(grads.a), b=order.from_run(grads.b))


def scan_grad(op, a, b, h0, result, settings, upstream, *, package=None):
    """``op`` (a backend's ``linear_scan_grad``) on ``result`` and the ``upstream``
    gradients (``d_h``, ``d_h_final``) in the order and layout ``settings`` ask for; the
    gradients of ``a`` and ``b`` come back in that order."""
    if not (settings.reverse or settings.batch_first):
        return op(a, b, h0, result, settings, **upstream)
    order = _RunOrder(a, settings, runs_reverse(package, settings))
    result = result._replace(h=order.to_run(result.h))
    grads = op(order.to_run(a), order.to_run(b), h0, result, _scan_settings(order, settings),
               d_h=order.to_run(upstream["d_h"]), d_h_final=upstream["d_h_final"])
    return _scan_grads_from_run(order, grads)


def scan_grad_jvp(op, a, b, h0, result, tangents, settings, upstream):
    """``op`` (a backend's ``linear_scan_grad_jvp``) in the order and layout ``settings``
    ask for: ``upstream`` holds ``d_h``, ``d_h_final`` and their tangents."""
    if not (settings.reverse or settings.batch_first):
        return op(a, b, h0, result, tangents, settings, **upstream)
    order = _RunOrder(a, settings)
    steps = {name: order.to_run(g) if name.startswith("d_h") and "final" not in name else g
             for name, g in upstream.items()}
    pair = op(order.to_run(a), order.to_run(b), h0, result._replace(h=order.to_run(result.h)),
              tangents._replace(a=order.to_run(tangents.a), b=order.to_run(tangents.b)),
              _scan_settings(order, settings), **steps)
    return tuple(_scan_grads_from_run(order, grads) for grads in pair)
