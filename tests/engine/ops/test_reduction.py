import itertools

import numpy
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tinyformer
from strategies import AXIS_KINDS, axes, distinct, leaf, seeds, shapes, uniform


def draw_shape_and_axis(data, kind):
    shape = data.draw(shapes(min_dims=0 if kind == "none" else 1), label="shape")
    return shape, data.draw(axes(len(shape), kind), label="axis")


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("kind", AXIS_KINDS)
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
@settings(max_examples=8, deadline=None)
@given(data=st.data(), seed=seeds)
def test_reduction(name, kind, keepdims, data, seed):
    shape, axis = draw_shape_and_axis(data, kind)
    rng = numpy.random.default_rng(seed)
    a = distinct(rng, shape) if name in ("max", "min") else uniform(rng, shape)
    x = leaf(a)
    out = getattr(tinyformer, name)(x, axis=axis, keepdims=keepdims)
    expected = getattr(numpy, name)(a, axis=axis, keepdims=keepdims)
    assert out.shape == expected.shape
    numpy.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)
    tinyformer.gradcheck(lambda x: getattr(x, name)(axis=axis, keepdims=keepdims), [x])


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("kind", AXIS_KINDS)
@settings(max_examples=8, deadline=None)
@given(data=st.data(), seed=seeds)
def test_var(kind, keepdims, ddof, data, seed):
    shape, axis = draw_shape_and_axis(data, kind)
    a = uniform(numpy.random.default_rng(seed), shape)
    assume(a.size // numpy.var(a, axis=axis, keepdims=True).size > ddof)
    x = leaf(a)
    out = tinyformer.var(x, axis=axis, keepdims=keepdims, ddof=ddof)
    expected = numpy.var(a, axis=axis, keepdims=keepdims, ddof=ddof)
    assert out.shape == expected.shape
    numpy.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-14)
    tinyformer.gradcheck(lambda x: x.var(axis=axis, keepdims=keepdims, ddof=ddof), [x])


@pytest.mark.parametrize(
    "name, values, axis, expected",
    [
        ("max", [[1.0, 3.0, 3.0]], 1, [[0.0, 1.0, 0.0]]),
        ("min", [[2.0, 1.0, 1.0]], 1, [[0.0, 1.0, 0.0]]),
        ("max", [[5.0, 5.0], [5.0, 5.0]], None, [[1.0, 0.0], [0.0, 0.0]]),
        ("max", [[0.0, 7.0], [7.0, 1.0]], (0, 1), [[0.0, 1.0], [0.0, 0.0]]),
        ("min", [[4.0, 2.0], [2.0, 2.0]], 0, [[0.0, 1.0], [1.0, 0.0]]),
    ],
)
def test_tie_gradient_goes_to_the_first_extreme(name, values, axis, expected):
    x = leaf(values)
    out = getattr(x, name)(axis=axis)
    out.backward(numpy.full(out.shape, 2.5))
    numpy.testing.assert_array_equal(x.grad, 2.5 * numpy.array(expected))


def first_extreme_gradient(a, axis, g, smallest):
    """One-hot of the first extreme in C order of the reduced axes, per slice, times g."""
    reduced = range(a.ndim) if axis is None else [ax % a.ndim for ax in numpy.atleast_1d(axis)]
    kept = [ax for ax in range(a.ndim) if ax not in reduced]
    g = numpy.broadcast_to(g.reshape([1 if ax in reduced else n for ax, n in enumerate(a.shape)]), a.shape)
    grad = numpy.zeros_like(a)
    for outer in itertools.product(*[range(a.shape[ax]) for ax in kept]):
        slice_index = []
        for inner in itertools.product(*[range(a.shape[ax]) for ax in sorted(reduced)]):
            index = [0] * a.ndim
            for ax, i in zip(kept, outer):
                index[ax] = i
            for ax, i in zip(sorted(reduced), inner):
                index[ax] = i
            slice_index.append(tuple(index))
        values = [a[i] for i in slice_index]
        best = min(values) if smallest else max(values)
        first = slice_index[values.index(best)]
        grad[first] = g[first]
    return grad


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("kind", AXIS_KINDS)
@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=seeds)
def test_ties_send_the_gradient_to_exactly_one_element(name, kind, data, seed):
    shape, axis = draw_shape_and_axis(data, kind)
    rng = numpy.random.default_rng(seed)
    a = rng.integers(0, 2, shape).astype(numpy.float64)
    x = leaf(a)
    out = getattr(x, name)(axis=axis)
    g = rng.standard_normal(out.shape)
    out.backward(g)
    numpy.testing.assert_array_equal(x.grad, first_extreme_gradient(a, axis, g, name == "min"))
    numpy.testing.assert_allclose(x.grad.sum(), g.sum())


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var"])
@pytest.mark.parametrize("axis", [2, -3, (0, 2), (1, -3)])
def test_axis_out_of_range(name, axis):
    with pytest.raises(ValueError, match="out of range"):
        getattr(leaf(numpy.ones((2, 3))), name)(axis=axis)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var"])
def test_repeated_axis(name):
    with pytest.raises(ValueError, match="repeated"):
        getattr(leaf(numpy.ones((2, 3))), name)(axis=(1, -1))


def test_var_without_degrees_of_freedom():
    with pytest.raises(ValueError, match="ddof"):
        leaf(numpy.ones((3, 1))).var(axis=1, ddof=1)


@pytest.mark.parametrize("name", ["max", "min"])
def test_extreme_of_empty_tensor(name):
    with pytest.raises(ValueError, match="empty"):
        getattr(leaf(numpy.ones((0, 3))), name)()


REDUCTION_CALLS = {
    "sum": lambda x: x.sum(),
    "sum-axis": lambda x: x.sum(axis=1, keepdims=True),
    "mean": lambda x: x.mean(axis=0),
    "var": lambda x: x.var(axis=-1),
    "var-ddof": lambda x: x.var(ddof=1),
    "max": lambda x: x.max(axis=1),
    "min": lambda x: x.min(),
}


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("name", REDUCTION_CALLS)
def test_dtype_preserved(name, dtype):
    x = leaf(distinct(numpy.random.default_rng(0), (3, 4)), dtype=dtype)
    out = REDUCTION_CALLS[name](x)
    assert out.dtype == dtype
    assert out.grad_fn.backward(numpy.ones(out.shape, dtype)).dtype == dtype
    out.backward(numpy.ones(out.shape))
    assert x.grad.dtype == dtype
