"""Helpers shared by the op families: undoing broadcasting, axes, operand lifting."""

import math

from ..tensor import Tensor
from ...common.validation import is_integer

PYTHON_SCALARS = (int, float, bool)
_PASS_THROUGH = (Tensor,) + PYTHON_SCALARS


def sum_to_shape(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added or stretched, giving ``shape``.

    If ``y = broadcast(x)`` then ``dL/dx = sum_to_shape(dL/dy, x.shape)``: every
    copy of an element of ``x`` sends its gradient back to that element.
    """
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1
    )
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


def shape_of(value):
    """Shape of an array or () for a Python scalar."""
    return getattr(value, "shape", ())


def operand(value):
    """Lift the other operand of a binary op: Tensors and Python scalars pass through.

    Python scalars stay Python scalars so that NumPy treats them as "weak" and a
    float32 tensor times ``0.5`` stays float32; arrays and lists become constant
    Tensors and follow NumPy's promotion rules.
    """
    if isinstance(value, _PASS_THROUGH):
        return value
    return Tensor(value)


def normalize_axes(axis, ndim):
    """``axis`` (None, int or tuple of ints) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if is_integer(axis):
        axes = (axis,)
    elif isinstance(axis, (tuple, list)):
        axes = tuple(axis)
    else:
        raise ValueError(f"axis must be None, an integer or a tuple of integers, got {axis!r}")
    result = []
    for a in axes:
        if not is_integer(a) or not -ndim <= a < ndim:
            raise ValueError(f"axis {a!r} is out of range for a tensor with {ndim} dimensions")
        result.append(int(a) % ndim)
    if len(set(result)) != len(result):
        raise ValueError(f"repeated axis in {axis!r}")
    return tuple(sorted(result))


def reduced_count(shape, axes):
    """How many elements each output of a reduction over ``axes`` summarises."""
    return math.prod(shape[a] for a in axes)


def kept_shape(shape, axes):
    """``shape`` with the reduced ``axes`` set to 1 (the ``keepdims=True`` shape)."""
    return tuple(1 if i in axes else n for i, n in enumerate(shape))
