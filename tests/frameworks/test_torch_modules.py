"""``gradcells.torch.LSTM``, ``GRU`` and ``RNN`` against ``torch.nn`` (docs/spec.md §13).

With one state dict, the modules and nn's compute the same outputs, final states and
gradients (of the input, the initial states and every parameter) in float64, on tensors and
packed ragged sequences; the state dicts load both ways; gradcells's options (peepholes, the
clips, the layer norm, zoneout, the reset-before GRU) agree with a torch-ops transcription,
pass ``torch.autograd.gradcheck`` on tiny modules and train; dropout and zoneout behave as
training and eval mode say; bad input raises named errors.
"""

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.func import functional_call  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

import gradcells as gc  # noqa: E402
import gradcells.torch as gt  # noqa: E402
from gradcells.torch._modules import GRU, LSTM, RNN  # noqa: E402

F64 = torch.float64
CELLS = {"lstm": (LSTM, nn.LSTM), "gru": (GRU, nn.GRU), "rnn": (RNN, nn.RNN)}
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def pair(cell, *args, seed=0, **kwargs):
    """(gradcells module, nn module) of one cell built with the same seed."""
    ours, theirs = CELLS[cell]
    torch.manual_seed(seed)
    a = ours(*args, dtype=F64, **kwargs)
    torch.manual_seed(seed)
    b = theirs(*args, dtype=F64, **kwargs)
    return a, b


def as_tuple(states):
    return states if isinstance(states, tuple) else (states,)


def run(module, x, hx, data=None):
    """Outputs, final states and the gradients of x, the states and every parameter of a
    loss that reads all outputs and final states (``data(x)``: what the module reads)."""
    module.zero_grad()
    leaves = [x, *as_tuple(hx)] if hx is not None else [x]
    for leaf in leaves:
        leaf.grad = None
    out, finals = module(x if data is None else data(x), hx)
    finals = as_tuple(finals)
    raw = out.data if hasattr(out, "batch_sizes") else out
    loss = (raw.sin() * torch.arange(raw.numel(), dtype=F64).reshape(raw.shape)).sum()
    loss = loss + sum((f ** 2 * (k + 1)).sum() for k, f in enumerate(finals))
    loss.backward()
    return ([raw.detach(), *(f.detach() for f in finals)],
            [leaf.grad.clone() for leaf in leaves],
            {n: p.grad.clone() for n, p in module.named_parameters()})


def assert_same_run(ours, theirs):
    (out_a, grads_a, params_a), (out_b, grads_b, params_b) = ours, theirs
    for a, b in zip(out_a, out_b, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], **TIGHT, msg=name)


def initial_states(cell, module, batch, unbatched=False):
    """Random nn initial states (requiring grad) for ``module``."""
    layers = module.num_layers * (2 if module.bidirectional else 1)
    lead = (layers,) if unbatched else (layers, batch)
    width = module.proj_size or module.hidden_size
    h0 = torch.randn(*lead, width, dtype=F64, requires_grad=True)
    if cell != "lstm":
        return h0
    return h0, torch.randn(*lead, module.hidden_size, dtype=F64, requires_grad=True)


CONFIGS = [
    ("lstm", {}),
    ("lstm", {"num_layers": 2, "bidirectional": True}),
    ("lstm", {"num_layers": 2, "proj_size": 2, "batch_first": True}),
    ("lstm", {"bidirectional": True, "proj_size": 3, "bias": False}),
    ("gru", {"num_layers": 2, "bidirectional": True}),
    ("gru", {"batch_first": True, "bias": False}),
    ("rnn", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("rnn", {"nonlinearity": "relu", "num_layers": 2}),
]


@pytest.mark.parametrize("cell, kwargs", CONFIGS)
@pytest.mark.parametrize("with_states", [False, True])
def test_tensor_input_matches_nn(cell, kwargs, with_states):
    ours, theirs = pair(cell, 3, 4, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name}: a seed must give nn's initial weights"
    torch.manual_seed(1)
    shape = (2, 5, 3) if kwargs.get("batch_first") else (5, 2, 3)
    x = torch.randn(*shape, dtype=F64, requires_grad=True)
    hx = initial_states(cell, ours, 2) if with_states else None
    assert_same_run(run(ours, x, hx), run(theirs, x, hx))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_ragged_sequences_match_nn(cell, enforce_sorted, batch_first):
    ours, theirs = pair(cell, 3, 4, num_layers=2, bidirectional=True, batch_first=batch_first,
                        **({"proj_size": 2} if cell == "lstm" else {}))
    torch.manual_seed(2)
    lengths = torch.tensor([6, 4, 4, 1]) if enforce_sorted else torch.tensor([3, 6, 1, 4])
    shape = (4, 6, 3) if batch_first else (6, 4, 3)
    x = torch.randn(*shape, dtype=F64, requires_grad=True)
    hx = initial_states(cell, ours, 4)

    def packed(x):
        return pack_padded_sequence(x, lengths, batch_first=batch_first,
                                    enforce_sorted=enforce_sorted)

    out_a, _ = ours(packed(x), hx)
    out_b, _ = theirs(packed(x), hx)
    assert torch.equal(out_a.batch_sizes, out_b.batch_sizes)
    for attr in ("sorted_indices", "unsorted_indices"):
        a, b = getattr(out_a, attr), getattr(out_b, attr)
        assert (a is None and b is None) or torch.equal(a, b)
    assert_same_run(run(ours, x, hx, packed), run(theirs, x, hx, packed))


@pytest.mark.parametrize("cell", CELLS)
def test_float32_default_dtype_matches_nn(cell):
    ours, theirs = CELLS[cell]
    torch.manual_seed(0)
    a = ours(3, 4, num_layers=2, bidirectional=True)
    torch.manual_seed(0)
    b = theirs(3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(5, 2, 3)
    out_a, finals_a = a(x)
    out_b, finals_b = b(x)
    assert out_a.dtype == torch.float32
    for u, v in zip((out_a, *as_tuple(finals_a)), (out_b, *as_tuple(finals_b)), strict=True):
        torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", CELLS)
def test_unbatched_input_matches_nn(cell):
    ours, theirs = pair(cell, 3, 4, num_layers=2, batch_first=True)
    x = torch.randn(5, 3, dtype=F64, requires_grad=True)
    hx = initial_states(cell, ours, 1, unbatched=True)
    a, b = ours(x, hx), theirs(x, hx)
    assert a[0].shape == b[0].shape == (5, 4)
    assert_same_run(run(ours, x, hx), run(theirs, x, hx))


@pytest.mark.parametrize("cell", CELLS)
def test_state_dicts_load_both_ways(cell):
    kwargs = {"num_layers": 2, "bidirectional": True,
              **({"proj_size": 2} if cell == "lstm" else {})}
    ours, theirs = pair(cell, 3, 4, seed=5, **kwargs)
    _, fresh = pair(cell, 3, 4, seed=6, **kwargs)
    fresh.load_state_dict(ours.state_dict())             # nn loads ours
    back, _ = pair(cell, 3, 4, seed=7, **kwargs)
    back.load_state_dict(fresh.state_dict())             # and ours loads nn's
    for name, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[name], value)
    converted = gc.layouts.stack_from_torch(back)         # a gradcells module is nn-shaped
    assert len(converted) == 4 and converted.cell == cell


def test_options_keep_nn_initialisation():
    """The options' parameters are drawn after nn's: a seed still gives nn's weights."""
    torch.manual_seed(9)
    ours = LSTM(3, 4, num_layers=2, dtype=F64, peepholes=True, layer_norm=True)
    torch.manual_seed(9)
    theirs = nn.LSTM(3, 4, num_layers=2, dtype=F64)
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name
    assert torch.equal(ours.ln_gamma_x_l1, torch.ones(16, dtype=F64))
    assert torch.equal(ours.ln_beta_c_l0, torch.zeros(4, dtype=F64))
    assert 0 < ours.weight_co_l1.abs().max() <= 0.5


def test_gate_permutation_is_gradcells_layout():
    """The forward hands gradcells the weights ``gc.layouts.stack_from_torch`` converts."""
    ours, _ = pair("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2)
    converted = gc.layouts.stack_from_torch(ours)
    for mine, theirs in zip(ours.weight_sets(), converted, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            if b is not None:
                torch.testing.assert_close(a.detach(), torch.from_numpy(b), **TIGHT)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("cell", CELLS)
def test_forward_mode_and_double_backward(cell):
    """The module's conversions are torch ops, so the functions' forward mode and double
    backward carry through it: the tangent equals nn's, ``gradgradcheck`` passes."""
    import torch.autograd.forward_ad as fwad

    ours, theirs = pair(cell, 2, 3, num_layers=2, bidirectional=True)
    x = torch.randn(4, 2, 2, dtype=F64)
    v = torch.randn_like(x)
    tangents = []
    for module in (ours, theirs):
        with fwad.dual_level():
            out = module(fwad.make_dual(x, v))[0]
            tangents.append(fwad.unpack_dual(out).tangent.detach().clone())
    torch.testing.assert_close(*tangents, **TIGHT)
    assert torch.autograd.gradgradcheck(lambda x: ours(x)[0], (x.clone().requires_grad_(),))


# -- gradcells's options ------------------------------------------------------------------


def torch_lstm_layer(module, x, h, c, suffix="_l0"):
    """One LSTM layer in torch ops, nn's gate order (i, f, g, o), with the module's
    peepholes, layer norm and cell clip: the options' model written independently."""
    p = {n: getattr(module, f"{n}{suffix}", None) for n in (
        "weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_ci", "weight_cf", "weight_co",
        "ln_gamma_x", "ln_beta_x", "ln_gamma_h", "ln_beta_h", "ln_gamma_c", "ln_beta_c")}
    hidden, eps, out = module.hidden_size, module.ln_epsilon, []

    def norm(z, name):
        if not module.layer_norm:
            return z
        return nn.functional.layer_norm(z, (z.shape[-1],), p[f"ln_gamma_{name}"],
                                        p[f"ln_beta_{name}"], eps)

    for t in range(x.shape[0]):
        g = (norm(x[t] @ p["weight_ih"].T, "x") + norm(h @ p["weight_hh"].T, "h")
             + p["bias_ih"] + p["bias_hh"])
        i, f, ci, o = g.split(hidden, dim=1)
        if module.peepholes:
            i, f = i + c * p["weight_ci"], f + c * p["weight_cf"]
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(ci)
        if module.cell_clip is not None:
            c = c.clamp(-module.cell_clip, module.cell_clip)
        if module.peepholes:
            o = o + c * p["weight_co"]
        h = torch.sigmoid(o) * torch.tanh(norm(c, "c"))
        out.append(h)
    return torch.stack(out), h, c


def perturbed(module, seed=3):
    """``module`` with every parameter moved off its initial value (gains off 1, ...)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("options", [
    {"peepholes": True},
    {"layer_norm": True},
    {"peepholes": True, "layer_norm": True, "cell_clip": 0.4},
])
def test_lstm_options_match_torch_ops(options):
    torch.manual_seed(0)
    module = perturbed(LSTM(3, 4, dtype=F64, **options))
    names = {n for n, _ in module.named_parameters()}
    if options.get("peepholes"):
        assert {"weight_ci_l0", "weight_cf_l0", "weight_co_l0"} <= names
    if options.get("layer_norm"):
        assert {"ln_gamma_x_l0", "ln_beta_c_l0"} <= names
    x = torch.randn(5, 2, 3, dtype=F64)
    h0, c0 = torch.randn(1, 2, 4, dtype=F64), torch.randn(1, 2, 4, dtype=F64)
    out, (h_n, c_n) = module(x, (h0, c0))
    expected = torch_lstm_layer(module, x, h0[0], c0[0])
    for a, b in zip((out, h_n[0], c_n[0]), expected, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


def test_gru_reset_before_matches_torch_ops():
    torch.manual_seed(0)
    module = GRU(3, 4, dtype=F64, reset_after=False)
    x, h = torch.randn(5, 2, 3, dtype=F64), torch.randn(1, 2, 4, dtype=F64)
    out, h_n = module(x, h)
    w_ih, w_hh = module.weight_ih_l0, module.weight_hh_l0
    b_ih, b_hh = module.bias_ih_l0, module.bias_hh_l0
    state, steps = h[0], []
    for t in range(5):
        gx = x[t] @ w_ih.T + b_ih
        r_x, z_x, n_x = gx.split(4, dim=1)
        r_h, z_h, _ = (state @ w_hh.T + b_hh).split(4, dim=1)
        r, z = torch.sigmoid(r_x + r_h), torch.sigmoid(z_x + z_h)
        n = torch.tanh(n_x + (r * state) @ w_hh[8:].T + b_hh[8:])
        state = z * state + (1 - z) * n
        steps.append(state)
    torch.testing.assert_close(out, torch.stack(steps), **TIGHT)
    torch.testing.assert_close(h_n[0], state, **TIGHT)


def gradcheck_module(module, x, hx, seed=None):
    """``torch.autograd.gradcheck`` of the module's outputs and final states in its input,
    initial states and every parameter (``seed``: reseed before each call, fixing the
    training mode's masks)."""
    names = [n for n, _ in module.named_parameters()]
    states = list(as_tuple(hx))

    def f(x, *rest):
        if seed is not None:
            torch.manual_seed(seed)
        given = rest[:len(states)]
        params = dict(zip(names, rest[len(states):], strict=True))
        hx_ = tuple(given) if len(given) == 2 else given[0]
        out, finals = functional_call(module, params, (x, hx_))
        return (out, *as_tuple(finals))

    inputs = (x, *states, *(p.detach().clone().requires_grad_() for p in module.parameters()))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("options", [
    {"peepholes": True, "layer_norm": True, "num_layers": 2, "bidirectional": True},
    {"peepholes": True, "cell_clip": 0.3, "proj_size": 2, "proj_clip": 0.2},
    {"layer_norm": True, "ln_carry": "normalized", "zoneout": 0.3},
])
def test_lstm_options_pass_gradcheck(options):
    torch.manual_seed(0)
    module = perturbed(LSTM(2, 3, dtype=F64, **options)).eval()
    x = torch.randn(3, 2, 2, dtype=F64, requires_grad=True)
    gradcheck_module(module, x, initial_states("lstm", module, 2))


def test_gru_reset_before_passes_gradcheck():
    torch.manual_seed(0)
    module = GRU(2, 3, num_layers=2, bidirectional=True, dtype=F64, reset_after=False)
    x = torch.randn(3, 2, 2, dtype=F64, requires_grad=True)
    gradcheck_module(module, x, initial_states("gru", module, 2))


@pytest.mark.parametrize("cell", CELLS)
def test_training_mode_masks_pass_gradcheck(cell):
    """Dropout and zoneout masks drawn in training mode are constants of the gradient."""
    torch.manual_seed(0)
    module = CELLS[cell][0](2, 3, num_layers=2, dropout=0.4, zoneout=0.3, dtype=F64).train()
    x = torch.randn(3, 2, 2, dtype=F64, requires_grad=True)
    gradcheck_module(module, x, initial_states(cell, module, 2), seed=11)


def test_options_train():
    """A few Adam steps fit a target: the options' gradients reach their parameters."""
    torch.manual_seed(0)
    module = LSTM(3, 5, num_layers=2, dtype=torch.float32, peepholes=True, layer_norm=True,
                  cell_clip=3.0, zoneout=0.1, dropout=0.1)
    x, target = torch.randn(6, 4, 3), torch.randn(6, 4, 5)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = ((module(x)[0] - target) ** 2).mean()
        loss.backward()
        assert module.weight_ci_l1.grad.abs().sum() > 0 and module.ln_gamma_c_l0.grad is not None
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


# -- training and eval mode ------------------------------------------------------------------


def test_dropout_only_in_training_mode():
    ours, theirs = pair("lstm", 3, 4, num_layers=3, dropout=0.5)
    x = torch.randn(5, 2, 3, dtype=F64)
    ours.eval(), theirs.eval()
    torch.testing.assert_close(ours(x)[0], theirs(x)[0], **TIGHT)
    ours.train()
    torch.manual_seed(4)
    first = ours(x)[0]
    second = ours(x)[0]
    torch.manual_seed(4)
    again = ours(x)[0]
    assert not torch.allclose(first, second), "each call draws new masks"
    torch.testing.assert_close(first, again, rtol=0, atol=0)   # torch's RNG draws them
    assert not torch.allclose(first, ours.eval()(x)[0])


def test_dropout_one_zeroes_the_layers_above():
    module, _ = pair("gru", 3, 4, num_layers=2, dropout=1.0)
    x = torch.randn(5, 2, 3, dtype=F64)
    h0 = torch.zeros(2, 2, 4, dtype=F64)
    out, h_n = module.train()(x, h0)
    top = GRU(4, 4, dtype=F64)
    top.load_state_dict({k.replace("_l1", "_l0"): v for k, v in module.state_dict().items()
                         if "_l1" in k})
    expected, _ = top(torch.zeros(5, 2, 4, dtype=F64))   # the top layer reads zeros
    torch.testing.assert_close(out, expected, **TIGHT)


@pytest.mark.parametrize("cell", CELLS)
def test_zoneout_eval_is_the_expectation(cell):
    """In eval mode a zoned step is ``p·old + (1-p)·new``; one step shows it exactly."""
    torch.manual_seed(0)
    ours = CELLS[cell][0]
    zoned = ours(3, 4, num_layers=2, dtype=F64, zoneout=0.3).eval()
    plain = ours(3, 4, num_layers=2, dtype=F64)
    plain.load_state_dict(zoned.state_dict())
    x = torch.randn(1, 2, 3, dtype=F64)
    hx = initial_states(cell, plain, 2)
    _, new = plain(x[:, :, :], hx)
    out, finals = zoned(x, hx)
    h0 = hx[0] if cell == "lstm" else hx
    h_n = finals[0] if cell == "lstm" else finals
    h_new = new[0] if cell == "lstm" else new
    # layer 0 mixes exactly; layer 1 reads layer 0's zoned output, so compare layer 0 only
    torch.testing.assert_close(h_n[0], 0.3 * h0[0] + 0.7 * h_new[0], **TIGHT)
    if cell == "lstm":
        torch.testing.assert_close(finals[1][0], 0.3 * hx[1][0] + 0.7 * new[1][0], **TIGHT)
    assert not torch.allclose(h_n[1], 0.3 * h0[1] + 0.7 * h_new[1])
    torch.testing.assert_close(out[0], h_n[1], **TIGHT)


def test_zoneout_training_keeps_units():
    """In training mode each unit either keeps its old value or takes the new one."""
    torch.manual_seed(0)
    zoned = LSTM(3, 64, dtype=F64, zoneout=0.5).train()
    plain = LSTM(3, 64, dtype=F64)
    plain.load_state_dict(zoned.state_dict())
    x = torch.randn(1, 8, 3, dtype=F64)
    h0, c0 = torch.randn(1, 8, 64, dtype=F64), torch.randn(1, 8, 64, dtype=F64)
    _, (h_new, _) = plain(x, (h0, c0))
    _, (h_n, _) = zoned(x, (h0, c0))
    kept, new = (h_n - h0).abs() < 1e-14, (h_n - h_new).abs() < 1e-14
    assert bool((kept | new).all())
    assert 0.3 < kept.double().mean().item() < 0.7


def test_zoneout_packed_matches_stack_when_zero_probability_masks():
    """The zoned path (one lstm_sequence per direction) composes layers as the stack does:
    in eval mode with zoneout ~0 it equals nn on a packed bidirectional input."""
    ours, theirs = pair("lstm", 3, 4, num_layers=2, bidirectional=True)
    ours.zoneout = 1e-300    # the zoned path, masks that change nothing representable
    x = torch.randn(5, 3, 3, dtype=F64)
    packed = pack_padded_sequence(x, torch.tensor([2, 5, 3]), enforce_sorted=False)
    a, (h_a, c_a) = ours.eval()(packed)
    b, (h_b, c_b) = theirs(packed)
    for u, v in ((a.data, b.data), (h_a, h_b), (c_a, c_b)):
        torch.testing.assert_close(u, v, **TIGHT)


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("build, error, words", [
    (lambda: LSTM(3, 4, proj_size=4), ValueError, "proj_size"),
    (lambda: LSTM(3, 4, dropout=1.5), ValueError, "dropout"),
    (lambda: LSTM(3, 4, zoneout=1.0), ValueError, "zoneout"),
    (lambda: LSTM(3, 4, proj_clip=1.0), ValueError, "proj_clip"),
    (lambda: LSTM(3, 4, ln_carry="no"), ValueError, "ln_carry"),
    (lambda: LSTM(3, 4, cell_clip="big"), TypeError, "cell_clip"),
    (lambda: LSTM(3.0, 4), TypeError, "input_size"),
    (lambda: RNN(3, 4, nonlinearity="sigmoid"), ValueError, "nonlinearity"),
])
def test_bad_constructor_arguments(build, error, words):
    with pytest.raises(error, match=words):
        build()


def test_bad_forward_arguments():
    module = LSTM(3, 4, num_layers=2, dtype=F64)
    x = torch.randn(5, 2, 3, dtype=F64)
    h0, c0 = torch.zeros(2, 2, 4, dtype=F64), torch.zeros(2, 2, 4, dtype=F64)
    cases = [
        ((x.numpy(),), TypeError, "input must be a torch.Tensor"),
        ((x.float(),), TypeError, "dtype"),
        ((torch.randn(5, 2, 2, dtype=F64),), ValueError, "input_size"),
        ((x[None],), ValueError, "3-D"),
        ((x, h0), TypeError, r"\(h0, c0\)"),
        ((x, (h0[:1], c0)), ValueError, "h0 must have shape"),
        ((x, (h0, c0[:, :1])), ValueError, "c0 must have shape"),
        ((x, (h0, c0.float())), TypeError, "c0"),
        ((x[:, 0], (h0, c0)), ValueError, "unbatched"),
    ]
    for args, error, words in cases:
        with pytest.raises(error, match=words):
            module(*args)
    assert torch.equal(x, x.clone())


@pytest.mark.parametrize("name", ["weight_hh_l1", "ln_gamma_h_l0", "weight_ci_l1"])
def test_a_weight_set_to_none_is_named(name):
    module = LSTM(3, 4, num_layers=2, dtype=F64, peepholes=True, layer_norm=True)
    setattr(module, name, None)
    with pytest.raises(TypeError, match=name):
        module(torch.randn(5, 2, 3, dtype=F64))


def test_all_weights_as_nn():
    ours, theirs = pair("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2)
    assert [[p.shape for p in ps] for ps in ours.all_weights] == \
        [[p.shape for p in ps] for ps in theirs.all_weights]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_module_matches_nn():
    pytest.importorskip("cupy")
    ours, theirs = pair("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2)
    ours, theirs = ours.cuda(), theirs.cuda()
    x = torch.randn(6, 4, 3, dtype=F64, device="cuda", requires_grad=True)
    packed = pack_padded_sequence(x, torch.tensor([3, 6, 1, 4]), enforce_sorted=False)
    out_a, (h_a, c_a) = ours(packed)
    out_b, (h_b, c_b) = theirs(packed)
    for u, v in ((out_a.data, out_b.data), (h_a, h_b), (c_a, c_b)):
        assert u.device == x.device
        torch.testing.assert_close(u, v, **TIGHT)
    out_a.data.sum().backward()
    grad_a, x.grad = x.grad, None
    out_b.data.sum().backward()
    torch.testing.assert_close(grad_a, x.grad, **TIGHT)


def test_benchmark_prints_its_table(capsys):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import torch_modules

    torch_modules.main(["--size", "3,2,3,4", "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(torch_modules.contestants_for((3, 2, 3, 4)))  # the header


def test_reexported_from_the_package():
    assert (gt.LSTM, gt.GRU, gt.RNN) == (LSTM, GRU, RNN)
