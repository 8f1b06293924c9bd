"""Shape, indexing and selection ops: no arithmetic, only moving values around.

Their backward moves the gradient back to where each value came from.
"""

import numpy

from .. import backend
from ..tensor import Function, Tensor
from ...common.validation import is_integer
from ._helpers import operand, shape_of, sum_to_shape


class Reshape(Function):
    """z = x viewed with a new shape;  dx = dz viewed with x's shape."""

    def forward(self, x, shape):
        self.in_shape = x.shape
        return x.reshape(shape)

    def backward(self, g):
        return g.reshape(self.in_shape)


class Transpose(Function):
    """z = x with axes permuted by ``axes``;  dx = dz permuted by the inverse permutation."""

    def forward(self, x, axes):
        self.inverse = tuple(numpy.argsort(axes)) if axes is not None else None
        return x.transpose(axes)

    def backward(self, g):
        return g.transpose(self.inverse)


class BroadcastTo(Function):
    """z = x repeated along broadcast axes;  dx = dz summed over them."""

    def forward(self, x, shape):
        self.in_shape = x.shape
        return backend.get_array_module(x).broadcast_to(x, shape)

    def backward(self, g):
        return sum_to_shape(g, self.in_shape)


def _has_integer_array(index):
    parts = index if isinstance(index, tuple) else (index,)
    return any(
        hasattr(p, "dtype") and p.dtype.kind in "iu" or isinstance(p, list) for p in parts
    )


class GetItem(Function):
    """z = x[index] (slices, integers, integer arrays, boolean masks).

    dx is zero except at the selected places, which receive dz; with integer
    arrays one element may be selected several times, so those add up (scatter-add).
    """

    def forward(self, x, index):
        self.in_shape, self.index = x.shape, index
        return x[index]

    def backward(self, g):
        xp = backend.get_array_module(g)
        grad = xp.zeros(self.in_shape, dtype=g.dtype)
        if _has_integer_array(self.index):
            backend.scatter_add(grad, self.index, g)
        else:
            grad[self.index] = g
        return grad


class PackRows(Function):
    """z = the rows ``index`` of x seen as rows of its last axis, (prod(x.shape[:-1]), d)[index]:
    (count, d), ``index`` sorted and without repeats;  dx = zeros of x's shape, with dz's rows put
    back at ``index`` (an assignment: no row is taken twice, so none needs adding up)."""

    def forward(self, x, index):
        self.in_shape, self.index = x.shape, index
        return backend.get_array_module(x).take(x.reshape(-1, x.shape[-1]), index, axis=0)

    def backward(self, g):
        grad = backend.get_array_module(g).zeros((_rows(self.in_shape), g.shape[-1]), dtype=g.dtype)
        grad[self.index] = g
        return grad.reshape(self.in_shape)


class UnpackRows(Function):
    """PackRows' inverse: z of shape ``shape`` (…, d) is zero except that its rows, seen as
    (prod(shape[:-1]), d), take x's rows at ``index``;  dx = dz's rows ``index``."""

    def forward(self, x, index, shape):
        self.index = index
        out = backend.get_array_module(x).zeros((_rows(shape), x.shape[-1]), dtype=x.dtype)
        out[index] = x
        return out.reshape(shape)

    def backward(self, g):
        return backend.get_array_module(g).take(g.reshape(-1, g.shape[-1]), self.index, axis=0)


def _rows(shape):
    return int(numpy.prod(shape[:-1], dtype=numpy.int64))


class Concat(Function):
    """z = [x₁, x₂, ...] joined along ``axis``;  dxᵢ = the slice of dz that xᵢ filled."""

    def forward(self, *xs, axis):
        xp = backend.get_array_module(*xs)
        out = xp.concatenate(xs, axis=axis)  # validates axis first: ValueError, not IndexError
        self.axis = axis
        self.bounds = numpy.cumsum([x.shape[axis] for x in xs])[:-1].tolist()
        return out

    def backward(self, g):
        xp = backend.get_array_module(g)
        return tuple(xp.split(g, self.bounds, axis=self.axis))


class Stack(Function):
    """z = [x₁, x₂, ...] stacked on a new ``axis``;  dxᵢ = dz taken at index i of that axis."""

    def forward(self, *xs, axis):
        xp = backend.get_array_module(*xs)
        out = xp.stack(xs, axis=axis)
        self.axis = axis % out.ndim
        return out

    def backward(self, g):
        lead = (slice(None),) * self.axis
        return tuple(g[lead + (i,)] for i in range(g.shape[self.axis]))


class Where(Function):
    """z = a where cond else b;  da = dz where cond, db = dz elsewhere (both unbroadcast)."""

    def forward(self, a, b, condition):
        xp = backend.get_array_module(a, b, condition)
        self.condition = condition
        self.shapes = shape_of(a), shape_of(b)
        return xp.where(condition, a, b)

    def backward(self, g):
        xp = backend.get_array_module(g)
        need_a, need_b = self.needs_input_grad
        sa, sb = self.shapes
        zero = g.dtype.type(0)
        return (
            sum_to_shape(xp.where(self.condition, g, zero), sa) if need_a else None,
            sum_to_shape(xp.where(self.condition, zero, g), sb) if need_b else None,
        )


class MaskedFill(Function):
    """z = value where mask else x;  dx = dz where the mask is False, 0 where it is True."""

    def forward(self, x, mask, value):
        xp = backend.get_array_module(x, mask)
        out = xp.where(mask, x.dtype.type(value), x)
        if out.shape != x.shape:
            raise ValueError(
                f"mask of shape {mask.shape} must broadcast to the tensor's shape {x.shape}"
            )
        self.mask = mask
        return out

    def backward(self, g):
        return backend.get_array_module(g).where(self.mask, g.dtype.type(0), g)


# ------------------------------------------------------------------- public functions
def _raw(value):
    return value.data if isinstance(value, Tensor) else value


def reshape(x, *shape):
    """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``; one size may be -1."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    shape = tuple(shape)
    if not all(is_integer(n) for n in shape):
        raise TypeError(f"reshape: sizes must be integers, got {shape} for a tensor of shape {x.shape}")
    return Reshape.apply(x, shape=shape)


def transpose(x, *axes):
    """Permute axes: ``x.transpose(0, 2, 1)``; with no axes, reverse them (as NumPy)."""
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = axes[0]
    if axes and sorted(a % x.ndim if -x.ndim <= a < x.ndim else a for a in axes) != list(range(x.ndim)):
        raise ValueError(f"transpose: axes {tuple(axes)} are not a permutation of a {x.ndim}-d tensor's axes")
    axes = tuple(a % x.ndim for a in axes) if axes else tuple(range(x.ndim))[::-1]
    return Transpose.apply(x, axes=axes)


def swapaxes(x, axis1, axis2):
    axes = list(range(x.ndim))
    for a in (axis1, axis2):
        if not -x.ndim <= a < x.ndim:
            raise ValueError(f"swapaxes: axis {a} is out of range for a {x.ndim}-d tensor")
    axis1, axis2 = axis1 % x.ndim, axis2 % x.ndim
    axes[axis1], axes[axis2] = axes[axis2], axes[axis1]
    return Transpose.apply(x, axes=tuple(axes))


def broadcast_to(x, shape):
    shape = tuple(shape)
    try:
        return BroadcastTo.apply(x, shape=shape)
    except ValueError:
        raise ValueError(f"BroadcastTo: a tensor of shape {x.shape} cannot be broadcast to {shape} "
                         "(each axis must match or be 1, counting from the last)") from None


def _index(index, x):
    if isinstance(index, tuple):
        return tuple(_index(i, x) for i in index)
    if isinstance(index, list):
        index = numpy.asarray(index)
    return backend.like(_raw(index), x.data)


def getitem(x, index):
    try:
        return GetItem.apply(x, index=_index(index, x))
    except IndexError as error:
        raise IndexError(f"indexing a tensor of shape {x.shape} with {_describe_index(index)}: {error}") from None


def _describe_index(index):
    """A short description of an index for error messages (arrays by shape and dtype, not by value)."""
    parts = index if isinstance(index, tuple) else (index,)
    shown = [f"array of shape {tuple(p.shape)} and dtype {p.dtype}" if hasattr(p, "shape") and p.ndim
             else repr(p) for p in map(_raw, parts)]
    return shown[0] if not isinstance(index, tuple) else "(" + ", ".join(shown) + ")"


def pack_rows(x, index):
    """The rows ``index`` (sorted, no repeats, an integer array) of ``x`` (…, d) seen as rows of its
    last axis: (len(index), d). ``unpack_rows`` puts them back."""
    if x.ndim < 2:
        raise ValueError(f"pack_rows: x must have rows (…, d), got shape {x.shape}")
    return PackRows.apply(x, index=backend.like(_raw(index), x.data))


def unpack_rows(x, index, shape):
    """A tensor of ``shape`` (…, d), zero except at the rows ``index`` (of ``pack_rows``), which hold
    ``x``'s rows (len(index), d) in order."""
    shape = tuple(shape)
    if x.ndim != 2 or x.shape[1] != shape[-1] or x.shape[0] != len(index):
        raise ValueError(f"unpack_rows: x must be ({len(index)}, {shape[-1]}) for {len(index)} rows of shape "
                         f"{shape}, got {x.shape}")
    return UnpackRows.apply(x, index=backend.like(_raw(index), x.data), shape=shape)


def concat(tensors, axis=0):
    """Join tensors along an existing axis (``numpy.concatenate``)."""
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concat: needs at least one tensor")
    return Concat.apply(*tensors, axis=axis)


def stack(tensors, axis=0):
    """Join tensors along a new axis (``numpy.stack``)."""
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    return Stack.apply(*tensors, axis=axis)


def where(condition, a, b):
    """Elementwise choice: ``a`` where ``condition`` is true, else ``b`` (all broadcast)."""
    condition = _raw(condition)
    if not hasattr(condition, "dtype"):
        condition = numpy.asarray(condition)
    if condition.dtype != bool:
        raise TypeError(f"where: condition must be boolean, got dtype {condition.dtype}")
    a, b = operand(a), operand(b)
    reference = a if isinstance(a, Tensor) else b
    if isinstance(reference, Tensor):
        condition = backend.like(condition, reference.data)
    return Where.apply(a, b, condition=condition)


def masked_fill(x, mask, value):
    """``value`` where ``mask`` is True, ``x`` elsewhere; ``mask`` broadcasts to ``x``'s shape."""
    mask = _raw(mask)
    if not hasattr(mask, "dtype") or mask.dtype != bool:
        raise TypeError("masked_fill: mask must be a boolean tensor or array")
    return MaskedFill.apply(x, mask=backend.like(mask, x.data), value=value)


Tensor.reshape = reshape
Tensor.transpose = transpose
Tensor.swapaxes = swapaxes
Tensor.T = property(lambda self: transpose(self))
Tensor.broadcast_to = broadcast_to
Tensor.__getitem__ = getitem
Tensor.masked_fill = masked_fill
