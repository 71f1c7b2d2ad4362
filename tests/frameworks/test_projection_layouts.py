"""The LSTM converters with a projection (docs/spec.md §9.1): PyTorch's ``weight_hr [P, H]``
against gradcells's ``w_proj [H, P]`` (``conv.options["w_proj"]``), without PyTorch."""

import numpy as np
import pytest

from gradcells import layouts

I, H, P = 3, 5, 2


def _torch_arrays(rng, n_in=I, hidden=H, proj=P):
    return (rng.standard_normal((4 * hidden, n_in)), rng.standard_normal((4 * hidden, proj)),
            rng.standard_normal(4 * hidden), rng.standard_normal(4 * hidden),
            rng.standard_normal((proj, hidden)))


def test_from_torch_keeps_two_arrays_and_carries_w_proj(rng):
    arrays = _torch_arrays(rng)
    copies = [a.copy() for a in arrays]
    conv = layouts.lstm_from_torch(*arrays)
    w, b = conv                                     # unpacking keeps working
    assert w.shape == (I + P, 4 * H) and b.shape == (4 * H,)
    assert set(conv.options) == {"forget_bias", "w_proj"}
    assert conv.options["forget_bias"] == 0.0
    w_proj = conv.options["w_proj"]
    assert w_proj.shape == (H, P) and w_proj.flags.c_contiguous
    np.testing.assert_array_equal(w_proj, arrays[4].T)
    assert not np.shares_memory(w_proj, arrays[4])
    assert conv.state_order == ("h", "c")
    for a, c in zip(arrays, copies, strict=True):                # inputs are never modified
        np.testing.assert_array_equal(a, c)


def test_without_weight_hr_options_has_no_w_proj(rng):
    conv = layouts.lstm_from_torch(*_torch_arrays(rng, proj=H)[:4])
    assert conv.options == {"forget_bias": 0.0}
    assert len(layouts.lstm_to_torch(*conv)) == 4


@pytest.mark.parametrize("n_in, hidden, proj", [(3, 5, 2), (1, 4, 1), (2, 3, 3), (4, 2, 5)])
def test_round_trip_is_the_identity(rng, n_in, hidden, proj):
    w = rng.standard_normal((n_in + proj, 4 * hidden))
    b = rng.standard_normal(4 * hidden)
    w_proj = rng.standard_normal((hidden, proj))
    arrays = layouts.lstm_to_torch(w, b, w_proj)
    assert [a.shape for a in arrays] == [(4 * hidden, n_in), (4 * hidden, proj), (4 * hidden,),
                                         (4 * hidden,), (proj, hidden)]
    assert all(a.flags.c_contiguous for a in arrays)
    np.testing.assert_array_equal(arrays[3], 0.0)
    np.testing.assert_array_equal(arrays[4], w_proj.T)
    conv = layouts.lstm_from_torch(*arrays)
    np.testing.assert_array_equal(conv[0], w)
    np.testing.assert_array_equal(conv[1], b)
    np.testing.assert_array_equal(conv.options["w_proj"], w_proj)


def test_torch_side_round_trip(rng):
    """PyTorch's arrays → gradcells → PyTorch: the weights come back as they were, the two
    biases as their sum in ``bias_ih`` (the two-bias rule)."""
    arrays = _torch_arrays(rng)
    conv = layouts.lstm_from_torch(*arrays)
    back = layouts.lstm_to_torch(*conv, conv.options["w_proj"])
    for k in (0, 1, 4):
        np.testing.assert_array_equal(back[k], arrays[k])
    np.testing.assert_allclose(back[2], arrays[2] + arrays[3], rtol=1e-15)
    np.testing.assert_array_equal(back[3], 0.0)


def test_bias_is_optional_with_a_projection(rng):
    w_ih, w_hh, _, _, w_hr = _torch_arrays(rng)
    conv = layouts.lstm_from_torch(w_ih, w_hh, weight_hr=w_hr)
    np.testing.assert_array_equal(conv[1], 0.0)
    assert conv.options["w_proj"].shape == (H, P)


Z = np.zeros
BAD = [
    (lambda: layouts.lstm_from_torch(Z((20, 3)), Z((20, 2)), None, None, Z((2, 4))),
     "weight_hr"),
    (lambda: layouts.lstm_from_torch(Z((20, 3)), Z((20, 2)), None, None, Z((3, 5))),
     "weight_hr"),
    (lambda: layouts.lstm_from_torch(Z((20, 3)), Z((20, 2)), None, None, Z(5)), "weight_hr"),
    (lambda: layouts.lstm_from_torch(Z((20, 3)), Z((19, 2)), None, None, Z((2, 5))),
     "weight_hh"),
    (lambda: layouts.lstm_from_torch(Z((16, 3)), Z((20, 2)), None, None, Z((2, 5))),
     "weight_ih"),
    (lambda: layouts.lstm_from_torch(Z((20, 3)), Z((20, 2)), Z(16), None, Z((2, 5))),
     "bias_ih"),
    (lambda: layouts.lstm_from_torch(Z((20, 3)), Z((20, 2)), Z(20), Z(4), Z((2, 5))),
     "bias_hh"),
    (lambda: layouts.lstm_to_torch(Z((5, 20)), Z(20), Z((4, 2))), "w_proj"),
    (lambda: layouts.lstm_to_torch(Z((5, 20)), Z(20), Z(5)), "w_proj"),
    (lambda: layouts.lstm_to_torch(Z((5, 19)), Z(20), Z((5, 2))), "w"),
    (lambda: layouts.lstm_to_torch(Z((1, 20)), Z(20), Z((5, 2))), "w"),
    (lambda: layouts.lstm_to_torch(Z((5, 20)), Z(16), Z((5, 2))), "b"),
]


@pytest.mark.parametrize("call, name", BAD)
def test_shapes_are_checked_and_named(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        call()


def test_w_proj_dtype_must_match():
    with pytest.raises(TypeError, match="w_proj"):
        layouts.lstm_to_torch(Z((5, 20)), Z(20), Z((5, 2), dtype=np.float32))


def test_repr_shows_w_proj_by_its_shape(rng):
    conv = layouts.lstm_from_torch(*_torch_arrays(rng))
    assert repr(conv) == ("Converted(<2 arrays>, framework='torch', options={'forget_bias': "
                          "0.0, 'w_proj': <array (5, 2)>}, state_order=('h', 'c'))")
