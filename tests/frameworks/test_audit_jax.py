"""The Flax audit (``gradcells.audit.jax``): Flax's cells and ``RNN`` agree with the oracle and
gradcells or show their listed faults and conventions (20-24); an injected wrong gradient is
an unexpected mismatch; each new fault and convention shown with Flax directly.

Skips without JAX and Flax.
"""

import io
import re

import numpy as np
import pytest
from audit_runs import whole_audit

pytest.importorskip("flax")

from gradcells import audit  # noqa: E402
from gradcells.audit import jax as audit_jax  # noqa: E402
from gradcells.audit.faults import FAULTS  # noqa: E402

ROW = re.compile(r"^(?P<name>.+?)\s{2,}(?P<cases>\d+)\s{2,}(?P<result>agrees|(?:known fault|"
                 r"convention) \d+(?: \(\d+/\d+\))?|UNEXPECTED MISMATCH \(\d+/\d+\))"
                 r"(?:\s{2,}(?P<detail>.*))?$")
NEW = (20, 21, 22, 23, 24)


@pytest.fixture(autouse=True, scope="module")
def _restores_float32():
    """The audit turns on ``jax_enable_x64`` (its precision); JAX's setting is restored after
    this file (other files rely on JAX's float32 default)."""
    import jax

    before = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", before)


def _parsed(text):
    """{check name: result} of the audit's printed text."""
    return {m["name"]: m["result"] for m in map(ROW.match, text.splitlines()) if m}


def _audit(**options):
    """(exit status, {check name: result}, full text) of one Flax audit run."""
    out = io.StringIO()
    status = audit.run("jax", stream=out, progress=False, **options)
    text = out.getvalue()
    return status, _parsed(text), text


def _expected(result, check):
    allowed = {"agrees"} | ({FAULTS[check.fault].label} if check.fault else set())
    return result.split(" (")[0] in allowed


@pytest.fixture
def fresh():
    """Flax's jitted functions rebuilt before and after (a monkeypatch reaches them)."""
    audit_jax.flax_function.cache_clear()
    yield audit_jax
    audit_jax.flax_function.cache_clear()


@pytest.fixture(scope="module")
def flax_audit():
    """The whole Flax audit, one case per check (``tests/audit_runs.py``: CI's only run of
    it): ``(exit status, {check name: result}, text)``."""
    status, text = whole_audit("jax")
    return status, _parsed(text), text


@pytest.mark.conformance
def test_the_flax_audit_agrees_or_shows_its_listed_faults(flax_audit):
    """Exit status 0, a row per check in order, each 'agrees' or the entry its check
    expects."""
    status, rows, text = flax_audit
    assert status == 0, text
    assert list(rows) == [c.name for c in audit_jax.CHECKS], text
    for check in audit_jax.CHECKS:
        assert _expected(rows[check.name], check), (check.name, rows[check.name])


@pytest.fixture(scope="module")
def gru_audit(flax_audit):
    """The GRU cells' rows of the whole audit."""
    status, rows, text = flax_audit
    return status, {n: r for n, r in rows.items() if "grucell" in n.lower()}, text


@pytest.mark.conformance
def test_the_gru_rows_agree_or_show_their_listed_faults(gru_audit):
    status, rows, text = gru_audit
    checks = [c for c in audit_jax.CHECKS if "gru" in c.name.lower()]
    assert status == 0, text
    assert list(rows) == [c.name for c in checks], text
    for check in checks:
        assert _expected(rows[check.name], check), (check.name, rows[check.name])
    assert rows["nnx.GRUCell jax.vjp vs oracle"] == "agrees"
    assert rows["linen.RNN(GRUCell) a length-0 row: final carry vs initial state"] == (
        "known fault 22")
    assert "convention 20: Flax's RNN leaves the outputs past seq_lengths" in text


@pytest.mark.conformance
@pytest.mark.parametrize("cell", [c for c in audit_jax.CELLS if c[2] == "lstm"],
                         ids=lambda c: c[0])
def test_each_lstm_cell_agrees_alone(cell):
    """Each LSTM cell's forward mode against the oracle, its HVP against gradcells."""
    rng = np.random.default_rng(1)
    for check in (audit_jax.cell_jvp_oracle, audit_jax.cell_hvp_gradcells):
        verdict = check(rng, *cell[1:])
        assert verdict.kind(None) == "agrees", (check.__name__, verdict)


@pytest.mark.conformance
def test_the_lstm_sequences_agree_alone():
    rng = np.random.default_rng(2)
    for check in (audit_jax.seq_forward, audit_jax.seq_vjp_gradcells):
        for api in ("linen", "nnx"):
            assert check(rng, api, "lstm").kind(None) == "agrees", (check.__name__, api)


@pytest.mark.conformance
def test_an_injected_wrong_gradient_is_unexpected(fresh, monkeypatch):
    real = fresh.jax_vjp
    monkeypatch.setattr(fresh, "jax_vjp",
                        lambda fn, ct, *a: tuple(g * 1.001 for g in real(fn, ct, *a)))
    status, rows, text = _audit(examples=1, select="nnx.GRUCell jax.vjp")
    assert status == 1, text
    assert rows["nnx.GRUCell jax.vjp vs oracle"].startswith("UNEXPECTED"), text
    assert rows["nnx.GRUCell jax.vjp vs gradcells gru_cell_grad"].startswith("UNEXPECTED")


@pytest.mark.conformance
def test_a_mismatch_unlike_its_convention_is_unexpected(fresh, monkeypatch):
    """Outputs off at the valid steps too are no longer 'convention 20'."""
    real = fresh.CellCase.forward
    monkeypatch.setattr(fresh.SeqCase, "forward",
                        lambda self, *a: tuple(o + 1e-6 for o in real(self, *a)))
    status, rows, text = _audit(examples=1, select="linen.RNN(GRUCell) outputs past")
    assert status == 1, text
    assert "not fault 20 either" in text


@pytest.mark.parametrize("cell", audit_jax.CELLS, ids=lambda c: c[0])
def test_the_weight_converters_are_each_others_transpose(cell):
    """<gradcells_weights(p), g> = <p, flax_gradients(g)>: the gradients come back through
    the transpose of the map that built the weights."""
    _, api, kind, cls = cell
    rng = np.random.default_rng(0)
    _, shapes = audit_jax.build_module(api, cls, 3, 2)
    p = {n: rng.standard_normal(s) for n, s in shapes}
    weights = audit_jax.gradcells_weights(api, kind, cls, p)
    g = [rng.standard_normal(np.shape(w)) for w in weights]
    back = audit_jax.flax_gradients(api, kind, cls, list(p), g)
    assert [np.shape(b) for b in back] == [s for _, s in shapes]
    left = sum(float(np.sum(w * v)) for w, v in zip(weights, g, strict=True))
    right = sum(float(np.sum(a * b)) for a, b in zip(p.values(), back, strict=True))
    assert left == pytest.approx(right, rel=1e-12)


def test_the_flax_entries_name_the_flax_rows_that_expect_them():
    expected = {c.name: c.fault for c in audit_jax.CHECKS if c.fault is not None}
    listed = {name: f.number for f in FAULTS.values() if f.number in NEW for name in f.checks}
    assert listed == expected
    assert {FAULTS[n].kind for n in (20, 21, 24)} == {"convention"}
    assert {FAULTS[n].kind for n in (22, 23)} == {"fault"}


# ---------------------------------------------------------------------------------------------
# Each new fault and convention, with Flax directly and by its audit row


def _rnn(nn, **options):
    import jax

    rnn = nn.RNN(nn.GRUCell(2), **options)
    x = jax.numpy.ones((1, 3, 1), jax.numpy.float32)     # Flax's float32 parameters
    return rnn, x, rnn.init(jax.random.key(0), x)


@pytest.mark.conformance
def test_convention_20_padding_outputs_are_not_zeroed():
    import flax.linen as nn
    import jax.numpy as jnp

    rnn, x, v = _rnn(nn)
    y = np.asarray(rnn.apply(v, x, seq_lengths=jnp.array([1])))
    assert np.all(y[0, 1:] != 0)
    assert "NOT zeroed out" in nn.RNN.__doc__
    verdict = audit_jax.seq_padding(np.random.default_rng(0), "nnx", "lstm")
    assert verdict.kind(20) == "fault" and not verdict.truth.agrees


@pytest.mark.conformance
def test_convention_21_reverse_outputs_in_processing_order():
    import flax.linen as nn
    import jax.numpy as jnp

    rnn, _, v = _rnn(nn, reverse=True)
    x = jnp.arange(3.0, dtype=jnp.float32).reshape(1, 3, 1)
    y, z = rnn.apply(v, x), rnn.apply(v, x, keep_order=True)
    np.testing.assert_allclose(y, z[:, ::-1])
    assert not np.allclose(y, z)
    verdict = audit_jax.seq_order(np.random.default_rng(0), "linen", "gru")
    assert verdict.kind(21) == "fault" and not verdict.truth.agrees


@pytest.mark.conformance
def test_fault_22_empty_row_carry_is_the_last_padded_step():
    import flax.linen as nn
    import jax.numpy as jnp

    rnn, x, v = _rnn(nn, return_carry=True)
    carry, y = rnn.apply(v, x, initial_carry=jnp.zeros((1, 2), jnp.float32),
                         seq_lengths=jnp.array([0]))
    np.testing.assert_array_equal(carry, y[:, -1])
    assert np.all(np.asarray(carry) != 0)          # the initial carry was zero
    for api in ("linen", "nnx"):
        verdict = audit_jax.seq_empty(np.random.default_rng(0), api, "gru")
        assert verdict.kind(22) == "fault" and not verdict.truth.agrees, api


@pytest.mark.conformance
def test_fault_23_nnx_gru_has_no_b_hn():
    from flax import nnx

    cell = nnx.GRUCell(1, 2, rngs=nnx.Rngs(0))
    assert "b_{hn}" in nnx.GRUCell.__doc__ and cell.dense_h.bias is None
    _, linen_shapes = audit_jax.build_module("linen", "GRUCell", 1, 2)
    assert "hn.bias" in dict(linen_shapes)
    verdict = audit_jax.nnx_gru_documented(np.random.default_rng(0))
    assert verdict.kind(23) == "fault" and not verdict.truth.agrees


@pytest.mark.conformance
def test_convention_24_no_forget_bias():
    verdict = audit_jax.lstm_forget_bias(np.random.default_rng(0))
    assert verdict.kind(24) == "fault" and not verdict.truth.agrees
    assert FAULTS[24].label == "convention 24"
