import math
import operator
import warnings

import numpy
import pytest
from hypothesis import given, settings

import tinyformer
from strategies import (
    avoiding,
    broadcastable_shapes,
    leaf,
    nonzero,
    positive,
    scalar,
    seeds,
    shapes,
    uniform,
)

BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
OPERAND_KINDS = ["tensor-tensor", "tensor-scalar", "scalar-tensor", "tensor-ndarray", "ndarray-tensor"]


def binary_inputs(kind, rng, shape_a, shape_b):
    """(inputs for the op, the same values as NumPy sees them); the right operand never near 0."""
    a, b = uniform(rng, shape_a), nonzero(rng, shape_b)
    if kind == "tensor-scalar":
        b = scalar(rng)
    if kind == "scalar-tensor":
        a = scalar(rng)
    inputs = {
        "tensor-tensor": (leaf(a), leaf(b)),
        "tensor-scalar": (leaf(a), b),
        "scalar-tensor": (a, leaf(b)),
        "tensor-ndarray": (leaf(a), b),
        "ndarray-tensor": (a, leaf(b)),
    }[kind]
    return inputs, (a, b)


@pytest.mark.parametrize("kind", OPERAND_KINDS)
@pytest.mark.parametrize("name", BINARY)
@settings(max_examples=10, deadline=None)
@given(pair=broadcastable_shapes(), seed=seeds)
def test_binary(name, kind, pair, seed):
    op = BINARY[name]
    inputs, (a, b) = binary_inputs(kind, numpy.random.default_rng(seed), *pair)
    out = op(*inputs)
    assert isinstance(out, tinyformer.Tensor) and out.dtype == numpy.float64
    numpy.testing.assert_array_equal(out.numpy(), op(a, b))
    tinyformer.gradcheck(op, inputs)


@settings(max_examples=10, deadline=None)
@given(shape=shapes(), seed=seeds)
def test_same_tensor_on_both_sides_accumulates(shape, seed):
    x = leaf(nonzero(numpy.random.default_rng(seed), shape))
    tinyformer.gradcheck(lambda x: x * x + x / x - x, [x])


@pytest.mark.parametrize("exponent", [2, 3, 0, -1, 0.5, 1.5, -2.5])
@settings(max_examples=10, deadline=None)
@given(shape=shapes(), seed=seeds)
def test_pow_scalar_exponent(exponent, shape, seed):
    rng = numpy.random.default_rng(seed)
    a = nonzero(rng, shape) if float(exponent).is_integer() else positive(rng, shape)
    x = leaf(a)
    numpy.testing.assert_allclose((x**exponent).numpy(), a**exponent)
    tinyformer.gradcheck(lambda x: x**exponent, [x])


@pytest.mark.parametrize("base", [2, 0.5, math.e, 3.7])
@settings(max_examples=10, deadline=None)
@given(shape=shapes(), seed=seeds)
def test_scalar_base_pow(base, shape, seed):
    a = uniform(numpy.random.default_rng(seed), shape)
    x = leaf(a)
    numpy.testing.assert_allclose((base**x).numpy(), base**a)
    tinyformer.gradcheck(lambda x: base**x, [x])


def test_pow_needs_a_scalar_on_one_side():
    x = leaf([1.0, 2.0])
    with pytest.raises(TypeError, match="pow"):
        x ** leaf([2.0, 3.0])
    with pytest.raises(TypeError, match="pow"):
        x ** numpy.array([2.0, 3.0])
    with pytest.raises(ValueError, match="positive"):
        (-2.0) ** x


UNARY = [
    ("neg", operator.neg, numpy.negative, uniform),
    ("exp", tinyformer.exp, numpy.exp, uniform),
    ("log", tinyformer.log, numpy.log, positive),
    ("sqrt", tinyformer.Tensor.sqrt, numpy.sqrt, positive),
    ("tanh", tinyformer.tanh, numpy.tanh, uniform),
    ("relu", tinyformer.relu, lambda a: numpy.maximum(a, 0), lambda rng, s: avoiding(rng, s, [0.0])),
    ("silu", tinyformer.silu, lambda a: a / (1 + numpy.exp(-a)), uniform),
    ("gelu", tinyformer.gelu, lambda a: a * 0.5 * (1 + numpy.vectorize(math.erf)(a / math.sqrt(2))), uniform),
    ("abs", tinyformer.abs, numpy.abs, nonzero),
    ("builtin-abs", abs, numpy.abs, nonzero),
    ("clip-low", lambda x: tinyformer.clip(x, low=-0.5), lambda a: numpy.clip(a, -0.5, None),
     lambda rng, s: avoiding(rng, s, [-0.5])),
    ("clip-high", lambda x: x.clip(high=0.5), lambda a: numpy.clip(a, None, 0.5),
     lambda rng, s: avoiding(rng, s, [0.5])),
    ("clip-both", lambda x: x.clip(-0.5, 0.5), lambda a: numpy.clip(a, -0.5, 0.5),
     lambda rng, s: avoiding(rng, s, [-0.5, 0.5])),
]


@pytest.mark.parametrize("fn, reference, values", [u[1:] for u in UNARY], ids=[u[0] for u in UNARY])
@settings(max_examples=12, deadline=None)
@given(shape=shapes(), seed=seeds)
def test_unary(fn, reference, values, shape, seed):
    a = values(numpy.random.default_rng(seed), shape)
    x = leaf(a)
    out = fn(x)
    assert out.shape == a.shape and out.dtype == numpy.float64
    numpy.testing.assert_allclose(out.numpy(), reference(a))
    tinyformer.gradcheck(fn, [x])


@pytest.mark.parametrize(
    "fn, expected",
    [
        (tinyformer.relu, [0.0, 0.0, 1.0, 0.0]),
        (tinyformer.abs, [-1.0, 0.0, 1.0, -1.0]),
        (lambda x: x.clip(-0.5, 0.5), [1.0, 1.0, 1.0, 0.0]),
    ],
    ids=["relu", "abs", "clip"],
)
def test_gradient_at_kinks(fn, expected):
    x = leaf([-0.5, 0.0, 0.5, -3.0])
    fn(x).backward(numpy.ones(4))
    numpy.testing.assert_array_equal(x.grad, expected)


def test_silu_is_finite_and_exact_at_its_limits():
    """σ overflows nowhere and keeps its relative precision in the tails: silu(x) → x for large x and
    x e^x for very negative x, its slope → 1 and 0 (no warning raised, as exp(-x) would at x = -1000)."""
    x = leaf([-1000.0, -40.0, 0.0, 40.0, 1000.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = x.silu()
        out.backward(numpy.ones(5))
    numpy.testing.assert_allclose(out.numpy(), [0.0, -40.0 / (1 + math.exp(40.0)), 0.0, 40.0, 1000.0], rtol=1e-12,
                                  atol=0)
    numpy.testing.assert_allclose(x.grad, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-15)


def test_gelu_is_the_exact_one_not_the_tanh_approximation():
    """x Φ(x) with erf: 0.5·x·(1 + erf(x/√2)); the tanh approximation differs by about 1e-4 near |x| 2."""
    x = leaf([-40.0, -2.0, 0.0, 2.0, 40.0])
    out = x.gelu()
    exact = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in (-40.0, -2.0, 0.0, 2.0, 40.0)]
    numpy.testing.assert_allclose(out.numpy(), exact, rtol=1e-15, atol=0)
    approximation = 0.5 * 2.0 * (1 + math.tanh(math.sqrt(2 / math.pi) * (2.0 + 0.044715 * 8.0)))
    assert abs(out.numpy()[3] - approximation) > 1e-5
    out.backward(numpy.ones(5))
    numpy.testing.assert_allclose(x.grad, [0.0, -0.0852318, 0.5, 1.0852318, 1.0], atol=1e-7)


def test_clip_needs_a_bound():
    with pytest.raises(ValueError, match="clip"):
        leaf([1.0]).clip()


COMPARISONS = [operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge]


@pytest.mark.parametrize("other", ["tensor", "scalar", "ndarray", "ndarray-left"])
@pytest.mark.parametrize("op", COMPARISONS, ids=lambda op: op.__name__)
@settings(max_examples=10, deadline=None)
@given(pair=broadcastable_shapes(), seed=seeds)
def test_comparison(op, other, pair, seed):
    rng = numpy.random.default_rng(seed)
    a = rng.integers(-1, 2, pair[0]).astype(numpy.float64)
    b = rng.integers(-1, 2, pair[1]).astype(numpy.float64)
    x = leaf(a)
    if other == "tensor":
        out, expected = op(x, leaf(b)), op(a, b)
    elif other == "scalar":
        out, expected = op(x, 0.0), op(a, 0.0)
    elif other == "ndarray":
        out, expected = op(x, b), op(a, b)
    else:
        out, expected = op(b, x), op(b, a)
    assert isinstance(out, tinyformer.Tensor) and isinstance(out.data, numpy.ndarray)
    assert out.dtype == numpy.bool_
    assert not out.requires_grad and out.grad_fn is None
    numpy.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shape_a, shape_b", [((3, 4), (5,)), ((2, 3), (3, 2)), ((4,), (2, 3))])
def test_shape_mismatch_names_op_and_shapes(name, shape_a, shape_b):
    with pytest.raises(ValueError) as error:
        BINARY[name](leaf(numpy.ones(shape_a)), leaf(numpy.ones(shape_b)))
    message = str(error.value)
    assert name.capitalize() in message
    assert str(shape_a) in message and str(shape_b) in message


DTYPE_OPS = {
    "add": lambda x: x + 0.5,
    "radd": lambda x: 0.5 + x,
    "sub": lambda x: x - 0.5,
    "rsub": lambda x: 0.5 - x,
    "mul": lambda x: x * 0.5,
    "rmul": lambda x: 0.5 * x,
    "div": lambda x: x / 0.5,
    "rdiv": lambda x: 0.5 / x,
    "int-scalar": lambda x: 2 * x + 1,
    "pow-int": lambda x: x**2,
    "pow-float": lambda x: x**2.5,
    "rpow": lambda x: 2.0**x,
    "neg": lambda x: -x,
    "exp": tinyformer.exp,
    "log": tinyformer.log,
    "sqrt": tinyformer.sqrt,
    "tanh": tinyformer.tanh,
    "relu": tinyformer.relu,
    "silu": tinyformer.silu,
    "gelu": tinyformer.gelu,
    "abs": tinyformer.abs,
    "clip": lambda x: x.clip(0.5, 1.5),
}


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("name", DTYPE_OPS)
def test_dtype_preserved_with_python_scalars(name, dtype):
    x = leaf(positive(numpy.random.default_rng(0), (2, 3)), dtype=dtype)
    out = DTYPE_OPS[name](x)
    assert out.dtype == dtype
    raw = out.grad_fn.backward(numpy.ones(out.shape, dtype))
    assert all(g.dtype == dtype for g in (raw if isinstance(raw, tuple) else (raw,)) if g is not None)
    out.backward(numpy.ones(out.shape))
    assert x.grad.dtype == dtype


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_float_tensors_of_one_dtype_stay_in_it(dtype):
    rng = numpy.random.default_rng(1)
    x, y = leaf(positive(rng, (2, 3)), dtype), leaf(positive(rng, (3,)), dtype)
    out = (x * y + x / y - y) ** 2
    assert out.dtype == dtype
    out.backward(numpy.ones(out.shape))
    assert x.grad.dtype == dtype and y.grad.dtype == dtype
