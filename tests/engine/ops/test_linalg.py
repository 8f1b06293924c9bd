import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinyformer
from strategies import leaf, matmul_shapes, seeds, uniform

RANKS = [1, 2, 3, 4]


def check_matmul(shape_a, shape_b, seed, fn=lambda a, b: a @ b):
    rng = numpy.random.default_rng(seed)
    a, b = uniform(rng, shape_a), uniform(rng, shape_b)
    x, y = leaf(a), leaf(b)
    out = fn(x, y)
    expected = numpy.matmul(a, b)
    assert out.shape == expected.shape
    numpy.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)
    tinyformer.gradcheck(fn, [x, y])


@pytest.mark.parametrize("rank_b", RANKS)
@pytest.mark.parametrize("rank_a", RANKS)
@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=seeds)
def test_matmul_ranks_with_batch_broadcasting(rank_a, rank_b, data, seed):
    shape_a, shape_b = data.draw(matmul_shapes(rank_a, rank_b))
    check_matmul(shape_a, shape_b, seed)


@pytest.mark.parametrize(
    "shape_a, shape_b",
    [
        ((5,), (5,)),
        ((3, 5), (5,)),
        ((5,), (5, 4)),
        ((5,), (2, 5, 4)),
        ((2, 3, 5), (5,)),
        ((3, 5), (5, 4)),
        ((2, 1, 3, 5), (4, 5, 6)),
        ((3, 5), (2, 5, 4)),
        ((2, 3, 4, 5), (5, 6)),
        ((1, 3, 5), (2, 1, 5, 2)),
        ((2, 1, 1, 5), (1, 3, 5, 1)),
    ],
)
@pytest.mark.parametrize(
    "fn", [lambda a, b: a @ b, tinyformer.matmul], ids=["operator", "function"]
)
def test_matmul_examples(fn, shape_a, shape_b):
    check_matmul(shape_a, shape_b, seed=sum(shape_a) * 7 + sum(shape_b), fn=fn)


@pytest.mark.parametrize("side", ["left", "right"])
def test_matmul_with_an_ndarray(side):
    rng = numpy.random.default_rng(0)
    a, b = uniform(rng, (2, 3, 4)), uniform(rng, (4, 2))
    inputs = (leaf(a), b) if side == "left" else (a, leaf(b))
    out = inputs[0] @ inputs[1]
    assert isinstance(out, tinyformer.Tensor)
    numpy.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-12)
    tinyformer.gradcheck(lambda p, q: p @ q, inputs)


@pytest.mark.parametrize(
    "shape_a, shape_b",
    [((3, 4), (5, 6)), ((4,), (5,)), ((2, 3, 4), (3, 4, 2)), ((3, 4), (3,)), ((), (3,))],
)
def test_matmul_shape_mismatch_names_op_and_shapes(shape_a, shape_b):
    with pytest.raises(ValueError) as error:
        leaf(numpy.ones(shape_a)) @ leaf(numpy.ones(shape_b))
    message = str(error.value)
    assert "MatMul" in message and str(shape_a) in message and str(shape_b) in message


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("shape_a, shape_b", [((2, 3, 4), (4, 2)), ((4,), (4,)), ((3, 4), (2, 4, 1))])
def test_dtype_preserved(dtype, shape_a, shape_b):
    rng = numpy.random.default_rng(0)
    x, y = leaf(uniform(rng, shape_a), dtype), leaf(uniform(rng, shape_b), dtype)
    out = x @ y
    assert out.dtype == dtype
    assert all(g.dtype == dtype for g in out.grad_fn.backward(numpy.ones(out.shape, dtype)))
    out.backward(numpy.ones(out.shape))
    assert x.grad.dtype == dtype and y.grad.dtype == dtype
