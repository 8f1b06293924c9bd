"""Elementwise arithmetic and unary functions.

Each Function's docstring gives the forward and the local derivative; the
backward multiplies the upstream gradient ``g`` by it and, for binary ops,
sums over broadcast axes (``sum_to_shape``).
"""

import math

from .. import backend
from ..tensor import Function, Tensor
from ._helpers import PYTHON_SCALARS, operand, shape_of, sum_to_shape


class Add(Function):
    """z = a + b;  dz/da = 1, dz/db = 1."""

    def forward(self, a, b):
        self.shapes = shape_of(a), shape_of(b)
        xp = backend.get_array_module(a, b)
        return backend.blockwise(xp.add, a, b)  # a + b; large same-shape sums on several threads

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        sa, sb = self.shapes
        return (sum_to_shape(g, sa) if need_a else None, sum_to_shape(g, sb) if need_b else None)


class Sub(Function):
    """z = a - b;  dz/da = 1, dz/db = -1."""

    def forward(self, a, b):
        self.shapes = shape_of(a), shape_of(b)
        return a - b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        sa, sb = self.shapes
        return (sum_to_shape(g, sa) if need_a else None, sum_to_shape(-g, sb) if need_b else None)


class Mul(Function):
    """z = a * b;  dz/da = b, dz/db = a."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        a, b = self.a, self.b
        return (
            sum_to_shape(g * b, shape_of(a)) if need_a else None,
            sum_to_shape(g * a, shape_of(b)) if need_b else None,
        )


class Div(Function):
    """z = a / b;  dz/da = 1/b, dz/db = -a/b²."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return a / b

    def backward(self, g):
        need_a, need_b = self.needs_input_grad
        a, b = self.a, self.b
        ga = g / b
        return (
            sum_to_shape(ga, shape_of(a)) if need_a else None,
            sum_to_shape(-ga * a / b, shape_of(b)) if need_b else None,
        )


class Neg(Function):
    """z = -x;  dz/dx = -1."""

    def forward(self, x):
        return -x

    def backward(self, g):
        return -g


class Pow(Function):
    """z = x ** p for a scalar exponent p;  dz/dx = p·x^(p-1)."""

    def forward(self, x, exponent):
        self.x, self.exponent = x, exponent
        return x**exponent

    def backward(self, g):
        p = self.exponent
        if p == 2:
            return g * (2 * self.x)
        return g * (p * self.x ** (p - 1))


class ScalarPow(Function):
    """z = c ** x for a scalar base c;  dz/dx = z·ln c."""

    def forward(self, x, base):
        self.out = base**x
        self.log_base = math.log(base)
        return self.out

    def backward(self, g):
        return g * self.out * self.log_base


class Exp(Function):
    """z = eˣ;  dz/dx = z."""

    def forward(self, x):
        self.out = backend.get_array_module(x).exp(x)
        return self.out

    def backward(self, g):
        return g * self.out


class Log(Function):
    """z = ln x;  dz/dx = 1/x."""

    def forward(self, x):
        self.x = x
        return backend.get_array_module(x).log(x)

    def backward(self, g):
        return g / self.x


class Sqrt(Function):
    """z = √x;  dz/dx = 1/(2z)."""

    def forward(self, x):
        self.out = backend.get_array_module(x).sqrt(x)
        return self.out

    def backward(self, g):
        return g / (2 * self.out)


class Tanh(Function):
    """z = tanh x;  dz/dx = 1 - z²."""

    def forward(self, x):
        self.out = backend.get_array_module(x).tanh(x)
        return self.out

    def backward(self, g):
        return g * (1 - self.out * self.out)


class Silu(Function):
    """z = x σ(x) (SiLU, "swish");  dz/dx = σ + x σ (1 - σ) = σ (1 + x (1 - σ)).

    σ(x) = 1 / (1 + e) for x ≥ 0 and e / (1 + e) below, with e = exp(-|x|) ≤ 1: no overflow at any x,
    and full relative precision in both tails."""

    def forward(self, x):
        xp = backend.get_array_module(x)
        e = xp.exp(-xp.abs(x))
        self.x, self.sigmoid = x, xp.where(x >= 0, 1, e) / (1 + e)
        return x * self.sigmoid

    def backward(self, g):
        s = self.sigmoid
        return g * (s * (1 + self.x * (1 - s)))


_SQRT_HALF, _INV_SQRT_2PI = math.sqrt(0.5), 1 / math.sqrt(2 * math.pi)


class Gelu(Function):
    """z = x Φ(x), Φ(x) = (1 + erf(x/√2)) / 2 (GELU, exact: transformers' "gelu");
    dz/dx = Φ(x) + x φ(x), φ(x) = exp(-x²/2) / √(2π)."""

    def forward(self, x):
        self.x, self.cdf = x, (1 + backend.erf(x * _SQRT_HALF)) * 0.5
        return x * self.cdf

    def backward(self, g):
        x = self.x
        density = backend.get_array_module(x).exp(x * x * -0.5) * _INV_SQRT_2PI
        return g * (self.cdf + x * density)


class Relu(Function):
    """z = max(x, 0);  dz/dx = 1 where x > 0, else 0 (0 at the kink, as PyTorch)."""

    def forward(self, x):
        xp = backend.get_array_module(x)
        self.positive = backend.blockwise(xp.greater, x, 0)
        return backend.blockwise(xp.maximum, x, 0)

    def backward(self, g):
        return backend.blockwise(backend.get_array_module(g).multiply, g, self.positive)


class Abs(Function):
    """z = |x|;  dz/dx = sign(x) (0 at 0)."""

    def forward(self, x):
        xp = backend.get_array_module(x)
        self.sign = xp.sign(x)
        return xp.abs(x)

    def backward(self, g):
        return g * self.sign


class Clip(Function):
    """z = min(max(x, low), high);  dz/dx = 1 inside [low, high] (bounds included), else 0."""

    def forward(self, x, low, high):
        xp = backend.get_array_module(x)
        self.inside = xp.ones(x.shape, dtype=bool)
        if low is not None:
            self.inside &= x >= low
        if high is not None:
            self.inside &= x <= high
        return xp.clip(x, low, high)

    def backward(self, g):
        return g * self.inside


# ------------------------------------------------------------------- public functions
def add(a, b):
    return Add.apply(operand(a), operand(b))


def sub(a, b):
    return Sub.apply(operand(a), operand(b))


def mul(a, b):
    return Mul.apply(operand(a), operand(b))


def div(a, b):
    return Div.apply(operand(a), operand(b))


def neg(x):
    return Neg.apply(x)


def power(x, exponent):
    """``x ** exponent``: one of the two must be a Python scalar."""
    if isinstance(x, Tensor) and isinstance(exponent, PYTHON_SCALARS):
        return Pow.apply(x, exponent)
    if isinstance(exponent, Tensor) and isinstance(x, PYTHON_SCALARS):
        if x <= 0:
            raise ValueError(f"pow: a scalar base must be positive to differentiate, got {x}")
        return ScalarPow.apply(exponent, x)
    raise TypeError(
        "pow: the exponent (or the base) must be a Python scalar, got "
        f"{type(x).__name__} ** {type(exponent).__name__}"
    )


def exp(x):
    return Exp.apply(x)


def log(x):
    return Log.apply(x)


def sqrt(x):
    return Sqrt.apply(x)


def tanh(x):
    return Tanh.apply(x)


def relu(x):
    return Relu.apply(x)


def gelu(x):
    """x Φ(x) with the exact normal CDF (not the tanh approximation), as transformers' "gelu"."""
    return Gelu.apply(x)


def silu(x):
    """x σ(x), the feed-forward activation of Marian and of many later Transformers ("swish")."""
    return Silu.apply(x)


def abs(x):  # noqa: A001 - the name users expect, as numpy.abs
    return Abs.apply(x)


def clip(x, low=None, high=None):
    """Clamp to [low, high]; either bound may be None."""
    if low is None and high is None:
        raise ValueError("clip: give at least one of low and high")
    return Clip.apply(x, low=low, high=high)


def _compare(op):
    def compare(self, other):
        other = other.data if isinstance(other, Tensor) else other
        xp = backend.get_array_module(self.data)
        return Tensor._make(xp.asarray(op(self.data, other)))  # 0-d: an array, not numpy.bool_

    return compare


Tensor.__add__ = add
Tensor.__radd__ = lambda self, other: add(other, self)
Tensor.__sub__ = sub
Tensor.__rsub__ = lambda self, other: sub(other, self)
Tensor.__mul__ = mul
Tensor.__rmul__ = lambda self, other: mul(other, self)
Tensor.__truediv__ = div
Tensor.__rtruediv__ = lambda self, other: div(other, self)
Tensor.__neg__ = neg
Tensor.__pow__ = power
Tensor.__rpow__ = lambda self, other: power(other, self)
Tensor.exp = exp
Tensor.log = log
Tensor.sqrt = sqrt
Tensor.tanh = tanh
Tensor.relu = relu
Tensor.silu = silu
Tensor.gelu = gelu
Tensor.abs = abs
Tensor.__abs__ = abs
Tensor.clip = clip
Tensor.__eq__ = _compare(lambda a, b: a == b)
Tensor.__ne__ = _compare(lambda a, b: a != b)
Tensor.__lt__ = _compare(lambda a, b: a < b)
Tensor.__le__ = _compare(lambda a, b: a <= b)
Tensor.__gt__ = _compare(lambda a, b: a > b)
Tensor.__ge__ = _compare(lambda a, b: a >= b)
