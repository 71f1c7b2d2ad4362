"""The Keras side of ``gradcells.audit.keras``, run in a subprocess per backend:
``python -m gradcells.audit._keras_runner <backend>`` (Keras reads its backend from
``KERAS_BACKEND`` at import, so each backend needs its own process).

The protocol, one job at a time: the parent writes a line naming a job file (``.npz``: the
arrays and ``spec``, a JSON string) and the worker answers a line naming the result file it
wrote (``.npz``: the outputs ``out0, out1, ...``, the backend's autodiff gradients ``grad_<arg>``
and ``oracle``, the oracle's report on them as JSON), or ``error: <message>``. The oracle is
``gradcells.check_vjp``'s central differences of the Keras forward itself, in float64.
Anything Keras prints goes to stderr: stdout carries the protocol only.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

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
        self.traced = _traced(keras.backend.backend(), self.call)

    def call(self, tensors):
        """The layer's outputs (a tuple) for backend tensors aligned with ``names``."""
        ops = self.keras.ops
        named = dict(zip(self.names, tensors))
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
    return [np.zeros_like(a) if g is None else g.numpy() for a, g in zip(arrays, grads)]


def _jax_vjp(job, ct, arrays):
    import jax

    _, pullback = jax.vjp(lambda *t: job.traced(list(t)), *(jax.numpy.asarray(a) for a in arrays))
    return pullback(tuple(jax.numpy.asarray(c) for c in ct))


def _torch_vjp(job, ct, arrays):
    import torch

    tensors = [torch.from_numpy(np.array(a)).requires_grad_() for a in arrays]
    out = job.call(tensors)
    grads = torch.autograd.grad(out, tensors, [torch.from_numpy(np.array(c)) for c in ct],
                                allow_unused=True)
    return [np.zeros_like(a) if g is None else g.detach().numpy() for a, g in zip(arrays, grads)]


VJPS = {"tensorflow": _tf_vjp, "jax": _jax_vjp, "torch": _torch_vjp}


def run_job(keras, path) -> str:
    """Run the job in ``path``; returns the path of the result file."""
    from gradcells.oracle import check_vjp

    with np.load(path) as stored:
        arrays = {k: stored[k] for k in stored.files}
    spec = json.loads(str(arrays.pop("spec")))
    job = Job(keras, arrays, spec)
    out = job.forward(*job.args)
    grads = job.vjp(job.cotangent, *job.args)
    report = check_vjp(job.forward, job.vjp, job.args, names=job.names,
                       cotangent=job.cotangent, seed=spec["seed"], fast=True, samples=1,
                       repeat=False)
    rows = [(c.name, bool(c.checked), float(c.abs_error), float(c.bound))
            for c in report.checks]
    result = path.replace(".npz", ".out.npz")
    np.savez(result, oracle=json.dumps(rows), **{f"out{k}": o for k, o in enumerate(out)},
             **{f"grad_{n}": g for n, g in zip(job.names, grads)})
    return result


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
