"""softmax and log_softmax (``tinyformer/engine/functional/softmax.py``).

Every forward is compared with a NumPy reference written here from the formula
(not from the implementation), every gradient is checked in float64 by
``tinyformer.engine.gradcheck`` (a random upstream gradient per output); huge inputs stay
finite and an axis that is not one int is refused.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyformer as tf
from functional_helpers import MANY, assert_close, ref_log_softmax, rng_of
from strategies import leaf, seeds, shapes, uniform
from tinyformer.engine import functional as F


def ref_softmax(a, axis):
    e = np.exp(a)
    return e / e.sum(axis=axis, keepdims=True)


SOFTMAXES = {"softmax": (F.softmax, ref_softmax), "log_softmax": (F.log_softmax, ref_log_softmax)}


@pytest.mark.parametrize("name", SOFTMAXES)
@MANY
@given(data=st.data(), seed=seeds)
def test_softmax_matches_numpy_and_gradchecks(name, data, seed):
    op, ref = SOFTMAXES[name]
    shape = data.draw(shapes(min_dims=1, max_size=24), label="shape")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")  # negative axes too
    a = uniform(rng_of(seed), shape, -3.0, 3.0)
    x = leaf(a)
    out = op(x, axis=axis)
    assert out.shape == shape and out.dtype == np.float64
    assert_close(out, ref(a, axis))
    tf.gradcheck(lambda x: op(x, axis=axis), [x])


@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_default_axis_is_last(name):
    op, ref = SOFTMAXES[name]
    a = uniform(rng_of(1), (2, 3, 4))
    assert_close(op(leaf(a)), ref(a, -1))


def test_softmax_rows_sum_to_one_and_log_softmax_is_its_log():
    a = uniform(rng_of(2), (3, 5), -4.0, 4.0)
    p = F.softmax(leaf(a), axis=0).data
    assert_close(p.sum(axis=0), np.ones(5))
    assert_close(np.exp(F.log_softmax(leaf(a), axis=0).data), p)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("magnitude", [1e2, 1e3, 1e4])
@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_finite_for_large_inputs(dtype, magnitude, axis):
    rng = rng_of(3)
    a = rng.uniform(-magnitude, magnitude, (4, 6))
    a[0] = magnitude  # all equal, at the top
    a[1] = -magnitude  # all equal, at the bottom
    a[2, ::2], a[2, 1::2] = magnitude, -magnitude  # extremes side by side
    a = a.astype(dtype)
    exact = ref_log_softmax(a.astype(np.float64), axis)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(a.shape).astype(dtype)
    for name, expected in [("softmax", np.exp(exact)), ("log_softmax", exact)]:
        x = tf.Tensor(a, requires_grad=True)
        out = SOFTMAXES[name][0](x, axis=axis)
        assert out.dtype == dtype
        assert np.all(np.isfinite(out.data)), name
        assert_close(out, expected, **tol)
        out.backward(g)
        assert x.grad.dtype == dtype
        assert np.all(np.isfinite(x.grad)), name


@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_axis_out_of_range_and_scalar(name):
    op = SOFTMAXES[name][0]
    with pytest.raises(ValueError, match="out of range"):
        op(leaf(np.ones((2, 3))), axis=2)
    with pytest.raises(ValueError, match="at least one dimension"):
        op(leaf(np.float64(1.0)))


@pytest.mark.parametrize("axis", [None, (0, 1), (1, 0)])
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_refuses_several_axes_instead_of_picking_one(name, axis):
    op, _ = SOFTMAXES[name]
    with pytest.raises(ValueError, match="axis must be a single int"):
        op(leaf(uniform(rng_of(4), (2, 3))), axis=axis)
