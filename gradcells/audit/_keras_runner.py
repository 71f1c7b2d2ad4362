"""The Keras side of ``gradcells.audit.keras``, run in a subprocess per backend:
``python -m gradcells.audit._keras_runner <backend>`` (Keras reads its backend from
``KERAS_BACKEND`` at import, so each backend needs its own process).

The protocol: the parent writes a line naming a job file (``.npz``: the arguments, the
cotangents ``ct<k>``, the tangents ``t_<arg>`` and ``spec``, a JSON string), as many as it
likes ahead, and the worker answers each in turn with a line naming the result file it wrote
(``.npz``: the outputs ``out0, out1, ...``, the backend's autodiff gradients ``grad_<arg>``,
its forward-mode tangents ``jvp<k>``, its second derivatives ``hvp_<arg>``, and ``oracle``
and ``jvp_oracle``, the oracle's reports on the first two as JSON), or ``error: <message>``.
The oracle is ``gradcells.check_vjp``'s and ``check_jvp``'s central differences of the Keras
forward itself, in float64.
Anything Keras prints goes to stderr: stdout carries the protocol only.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from gradcells.oracle import check_jvp, check_vjp

LAYERS = {"lstm": "LSTM", "gru": "GRU", "rnn": "SimpleRNN"}


def _keras(backend):
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend == "jax":
        os.environ["JAX_ENABLE_X64"] = "1"
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import keras

    keras.config.set_floatx("float64")
    return keras


def build_layer(keras, spec, shapes):
    """The Keras layer of ``spec`` (its options), built for ``x [B, T, I]``."""
    options = {k: spec[k] for k in ("go_backwards", "unroll", "return_sequences",
                                    "return_state")}
    # every weight is the job's (``stateless_call``): the layer's own variables are zeros,
    # not an orthogonal draw (a QR compiled per shape on JAX)
    options.update(dict.fromkeys(("kernel_initializer", "recurrent_initializer",
                                  "bias_initializer"), "zeros"))
    if spec["cell"] == "gru":
        options["reset_after"] = spec["reset_after"]
    layer = getattr(keras.layers, LAYERS[spec["cell"]])(spec["hidden"], **options)
    layer.build(shapes["x"])
    return layer


class Job:
    """One case: the layer, its arguments (x, the initial states, the weights) and mask."""

    def __init__(self, keras, arrays, spec):
        self.keras, self.spec = keras, spec
        self.names = spec["names"]                 # x, h0[, c0], kernel, recurrent_kernel, bias
        self.states = [n for n in self.names if n in ("h0", "c0")]
        self.args = [arrays[n] for n in self.names]
        self.mask = arrays["mask"] if "mask" in arrays else None
        self.layer = build_layer(keras, spec, {"x": arrays["x"].shape})
        self.cotangent = tuple(arrays[f"ct{k}"] for k in range(spec["outputs"]))
        self.tangents = [arrays[f"t_{n}"] for n in self.names]
        self.traced = _traced(keras.backend.backend(), self.call)
        self.compiled = {}              # JAX: each transformation jitted once per job

    def call(self, tensors):
        """The layer's outputs (a tuple) for backend tensors aligned with ``names``."""
        ops = self.keras.ops
        named = dict(zip(self.names, tensors, strict=True))
        weights = [named[n] for n in self.names[len(self.states) + 1:]]
        mask = None if self.mask is None else ops.convert_to_tensor(self.mask)
        frozen = [v.value for v in self.layer.non_trainable_variables]   # a seed generator
        out, _ = self.layer.stateless_call(weights, frozen, named["x"], mask=mask,
                                           initial_state=[named[s] for s in self.states])
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    def forward(self, *arrays):
        ops = self.keras.ops
        out = self.traced([ops.convert_to_tensor(np.asarray(a)) for a in arrays])
        return tuple(np.asarray(ops.convert_to_numpy(o)) for o in out)

    def vjp(self, ct, *arrays):
        return [np.asarray(g) for g in VJPS[self.keras.backend.backend()](self, ct, arrays)]

    def jvp(self, tangents, *arrays):
        return [np.asarray(t) for t in JVPS[self.keras.backend.backend()](self, tangents, arrays)]

    def hvp(self):
        """The tangent of ``vjp(cotangent)`` along the tangents: the Hessian of
        ``<cotangent, outputs>`` times the tangents."""
        backend = self.keras.backend.backend()
        return [np.asarray(h) for h in HVPS[backend](self, self.cotangent, self.tangents,
                                                      self.args)]


def _traced(backend, call):
    """``call`` compiled once per job where the backend re-traces every eager call: JAX's
    ``lax.scan`` compiles anew on each eager call (seconds each), so its layers run under
    ``jax.jit`` (the oracle's differences then reuse one compilation); the others as they are."""
    if backend != "jax":
        return call
    import jax

    compiled = jax.jit(lambda *tensors: call(list(tensors)))
    return lambda tensors: compiled(*tensors)


def _tf_vjp(job, ct, arrays):
    import tensorflow as tf

    tensors = [tf.constant(a) for a in arrays]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = job.call(tensors)
    grads = tape.gradient(list(out), tensors, output_gradients=[tf.constant(c) for c in ct])
    return [np.zeros_like(a) if g is None else g.numpy()
            for a, g in zip(arrays, grads, strict=True)]


def _jitted(job, name, fn):
    """``jax.jit(fn)``, made once per job: the oracle and the HVP call the job's ``vjp`` and
    ``jvp`` again, and each ``jax.vjp``/``jax.jvp`` of the jitted layer traced anew would
    compile anew."""
    import jax

    if name not in job.compiled:
        job.compiled[name] = jax.jit(fn)
    return job.compiled[name]


def _jax_vjp(job, ct, arrays):
    import jax

    jnp = jax.numpy
    vjp = _jitted(job, "vjp", lambda args, ct: jax.vjp(lambda *t: job.traced(list(t)),
                                                       *args)[1](ct))
    return vjp(tuple(jnp.asarray(a) for a in arrays), tuple(jnp.asarray(c) for c in ct))


def _torch_vjp(job, ct, arrays):
    import torch

    tensors = [torch.from_numpy(np.array(a)).requires_grad_() for a in arrays]
    out = job.call(tensors)
    grads = torch.autograd.grad(out, tensors, [torch.from_numpy(np.array(c)) for c in ct],
                                allow_unused=True)
    return [np.zeros_like(a) if g is None else g.detach().numpy()
            for a, g in zip(arrays, grads, strict=True)]


VJPS = {"tensorflow": _tf_vjp, "jax": _jax_vjp, "torch": _torch_vjp}


def _tf_jvp(job, tangents, arrays):
    import tensorflow as tf

    tensors = [tf.constant(a) for a in arrays]
    with tf.autodiff.ForwardAccumulator(tensors, [tf.constant(t) for t in tangents]) as acc:
        out = job.call(tensors)
    return [np.zeros(o.shape) if d is None else d.numpy()
            for o, d in zip(out, (acc.jvp(o) for o in out), strict=True)]


def _jax_jvp(job, tangents, arrays):
    import jax

    jnp = jax.numpy
    jvp = _jitted(job, "jvp", lambda args, tangents: jax.jvp(lambda *t: job.traced(list(t)),
                                                             args, tangents)[1])
    return jvp(tuple(jnp.asarray(a) for a in arrays), tuple(jnp.asarray(t) for t in tangents))


def _torch_jvp(job, tangents, arrays):
    import torch
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        duals = [fwad.make_dual(torch.from_numpy(np.array(a)), torch.from_numpy(np.array(t)))
                 for a, t in zip(arrays, tangents, strict=True)]
        out = job.call(duals)
        found = [fwad.unpack_dual(o).tangent for o in out]
    return [np.zeros(tuple(o.shape)) if d is None else d.detach().numpy()
            for o, d in zip(out, found, strict=True)]


JVPS = {"tensorflow": _tf_jvp, "jax": _jax_jvp, "torch": _torch_jvp}


def _tf_hvp(job, ct, tangents, arrays):
    import tensorflow as tf

    tensors = [tf.constant(a) for a in arrays]
    with tf.GradientTape() as outer:
        outer.watch(tensors)
        with tf.GradientTape() as inner:
            inner.watch(tensors)
            out = job.call(tensors)
        grads = inner.gradient(list(out), tensors,
                               output_gradients=[tf.constant(c) for c in ct])
    hvp = outer.gradient(grads, tensors, output_gradients=[tf.constant(t) for t in tangents])
    return [np.zeros_like(a) if h is None else h.numpy() for a, h in zip(arrays, hvp, strict=True)]


def _jax_hvp(job, ct, tangents, arrays):
    import jax

    jnp = jax.numpy
    return jax.jvp(lambda *a: tuple(_jax_vjp(job, ct, a)), tuple(jnp.asarray(a) for a in arrays),
                   tuple(jnp.asarray(t) for t in tangents))[1]


def _torch_hvp(job, ct, tangents, arrays):
    import torch

    tensors = [torch.from_numpy(np.array(a)).requires_grad_() for a in arrays]
    out = job.call(tensors)
    grads = torch.autograd.grad(out, tensors, [torch.from_numpy(np.array(c)) for c in ct],
                                create_graph=True, allow_unused=True)
    used = [(k, g) for k, g in enumerate(grads) if g is not None and g.requires_grad]
    hvp = torch.autograd.grad([g for _, g in used], tensors,
                              [torch.from_numpy(np.array(tangents[k])) for k, _ in used],
                              allow_unused=True) if used else [None] * len(tensors)
    return [np.zeros_like(a) if h is None else h.detach().numpy()
            for a, h in zip(arrays, hvp, strict=True)]


HVPS = {"tensorflow": _tf_hvp, "jax": _jax_hvp, "torch": _torch_hvp}


def run_job(keras, path) -> str:
    """Run the job in ``path``; returns the path of the result file."""
    with np.load(path) as stored:
        arrays = {k: stored[k] for k in stored.files}
    spec = json.loads(str(arrays.pop("spec")))
    job = Job(keras, arrays, spec)
    out = job.forward(*job.args)
    grads = job.vjp(job.cotangent, *job.args)
    tangents = job.jvp(job.tangents, *job.args)
    reports = {"oracle": check_vjp(job.forward, job.vjp, job.args, names=job.names,
                                   cotangent=job.cotangent, seed=spec["seed"], fast=True,
                                   samples=1, repeat=False),
               "jvp_oracle": check_jvp(job.forward, job.jvp, job.args, tangents=job.tangents,
                                       seed=spec["seed"], repeat=False)}
    result = path.replace(".npz", ".out.npz")
    np.savez(result, **{k: json.dumps(_rows(r)) for k, r in reports.items()},
             **{f"out{k}": o for k, o in enumerate(out)},
             **{f"jvp{k}": t for k, t in enumerate(tangents)},
             **{f"grad_{n}": g for n, g in zip(job.names, grads, strict=True)},
             **{f"hvp_{n}": h for n, h in zip(job.names, job.hvp(), strict=True)})
    return result


def _rows(report) -> list:
    """The oracle's report as rows for the parent: name, checked, abs_error, bound."""
    return [(c.name, bool(c.checked), float(c.abs_error), float(c.bound))
            for c in report.checks]


def main(backend: str) -> None:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                         # whatever the frameworks print goes to stderr
    try:
        keras = _keras(backend)
        protocol.write(f"ready {keras.__version__}\n")
    except Exception as error:            # the backend failing to import is the answer
        protocol.write(f"error: {type(error).__name__}: {error}\n".replace("\n", " ") + "\n")
        protocol.flush()
        return
    protocol.flush()
    for line in sys.stdin:
        try:
            answer = run_job(keras, line.strip())
        except Exception as error:        # a finding for the parent, not a crash here
            answer = f"error: {type(error).__name__}: {error}".replace("\n", " ")
        protocol.write(answer + "\n")
        protocol.flush()


if __name__ == "__main__":
    main(sys.argv[1])
