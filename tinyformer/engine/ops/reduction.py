"""Reductions over ``axis=None | int | tuple`` with ``keepdims``.

The backward of a reduction puts the upstream gradient back on the reduced
axes (reshape to the ``keepdims`` shape, then broadcast to the input).
"""

from .. import backend
from ..tensor import Function, Tensor
from ._helpers import kept_shape, normalize_axes, reduced_count


class Sum(Function):
    """z = Σ_axes x;  dz/dx = 1 for every summed element."""

    def forward(self, x, axis, keepdims):
        axes = normalize_axes(axis, x.ndim)
        self.in_shape, self.kept = x.shape, kept_shape(x.shape, axes)
        return x.sum(axis=axes, keepdims=keepdims)

    def backward(self, g):
        xp = backend.get_array_module(g)
        return xp.broadcast_to(g.reshape(self.kept), self.in_shape)


class Mean(Function):
    """z = (1/N) Σ_axes x;  dz/dx = 1/N."""

    def forward(self, x, axis, keepdims):
        axes = normalize_axes(axis, x.ndim)
        self.in_shape, self.kept = x.shape, kept_shape(x.shape, axes)
        self.count = reduced_count(x.shape, axes)
        return x.mean(axis=axes, keepdims=keepdims)

    def backward(self, g):
        xp = backend.get_array_module(g)
        return xp.broadcast_to(g.reshape(self.kept) / self.count, self.in_shape)


class Var(Function):
    """z = (1/(N-ddof)) Σ_axes (x - x̄)²;  dz/dx = 2(x - x̄)/(N-ddof).

    The x̄ term needs no gradient of its own: Σ (x - x̄) = 0.
    """

    def forward(self, x, axis, keepdims, ddof):
        axes = normalize_axes(axis, x.ndim)
        self.kept = kept_shape(x.shape, axes)
        count = reduced_count(x.shape, axes)
        if count - ddof <= 0:
            raise ValueError(f"{count} elements with ddof={ddof} leaves no degrees of freedom")
        self.centered = x - x.mean(axis=axes, keepdims=True)
        self.denominator = count - ddof
        squares = self.centered * self.centered
        return squares.sum(axis=axes, keepdims=keepdims) / self.denominator

    def backward(self, g):
        return g.reshape(self.kept) * (2 / self.denominator) * self.centered


class Max(Function):
    """z = max_axes x (or min);  dz/dx = 1 at *one* extreme element per reduced slice.

    Documented choice: ties send the whole gradient to the first extreme element in
    C order of the reduced axes (``argmax``), so the gradient sums to the upstream
    gradient exactly, rather than being split among the tied elements.
    """

    def forward(self, x, axis, keepdims, smallest=False):
        xp = backend.get_array_module(x)
        axes = normalize_axes(axis, x.ndim)
        if x.size == 0:
            kind = "min" if smallest else "max"
            raise ValueError(f"cannot take the {kind} of an empty tensor of shape {x.shape}")
        order = [a for a in range(x.ndim) if a not in axes] + list(axes)  # reduced axes last
        moved = x.transpose(order)
        self.moved_shape, self.inverse = moved.shape, [order.index(a) for a in range(x.ndim)]
        flat = moved.reshape(moved.shape[: x.ndim - len(axes)] + (-1,))
        self.arg = (flat.argmin(axis=-1) if smallest else flat.argmax(axis=-1))[..., None]
        self.length = flat.shape[-1]
        out = xp.take_along_axis(flat, self.arg, axis=-1)
        return out.reshape(kept_shape(x.shape, axes) if keepdims else out.shape[:-1])

    def backward(self, g):
        xp = backend.get_array_module(g)
        one_hot = xp.arange(self.length) == self.arg
        flat = one_hot * g.reshape(self.arg.shape)
        return flat.reshape(self.moved_shape).transpose(self.inverse)


# ------------------------------------------------------------------- public functions
def sum(x, axis=None, keepdims=False):  # noqa: A001
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return Mean.apply(x, axis=axis, keepdims=keepdims)


def var(x, axis=None, keepdims=False, ddof=0):
    """Variance; ``ddof=0`` (the default, as NumPy) is the biased estimate used by layer norm."""
    return Var.apply(x, axis=axis, keepdims=keepdims, ddof=ddof)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return Max.apply(x, axis=axis, keepdims=keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    return Max.apply(x, axis=axis, keepdims=keepdims, smallest=True)


Tensor.sum = sum
Tensor.mean = mean
Tensor.var = var
Tensor.max = max
Tensor.min = min
