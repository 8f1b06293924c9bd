"""Matrix products."""

from .. import backend
from ..tensor import Function, Tensor
from ._helpers import operand, sum_to_shape


class MatMul(Function):
    """Z = A @ B for 1-D to 4-D operands with NumPy's batch broadcasting.

    dA = dZ @ Bᵀ and dB = Aᵀ @ dZ on the last two axes, summed over broadcast
    batch axes. A 1-D operand is treated as a row (A) or a column (B) vector.
    When a batch of inputs meets one weight matrix (X (..., n) @ W (n, m), every
    linear layer), dW is one matrix product over the flattened batch instead of a
    batch of products summed afterwards: no (batch, n, m) temporary.
    """

    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("operands need at least one dimension")
        self.a, self.b = a, b
        try:
            return backend.get_array_module(a, b).matmul(a, b)
        except ValueError:
            raise ValueError(_mismatch(a.shape, b.shape)) from None

    def backward(self, g):
        xp = backend.get_array_module(g)
        a, b = self.a, self.b
        need_a, need_b = self.needs_input_grad
        a2 = a if a.ndim > 1 else a[None, :]
        b2 = b if b.ndim > 1 else b[:, None]
        if b.ndim == 1:
            g = g[..., None]
        if a.ndim == 1:
            g = g[..., None, :]
        grad_a = grad_b = None
        if need_a:
            if a2.ndim == 2 and g.ndim > 2:  # one matrix against a batch: contract the batch too
                batch = tuple(range(g.ndim - 2))
                grad_a = xp.tensordot(g, b2, axes=(batch + (g.ndim - 1,), batch + (g.ndim - 1,)))
            else:
                grad_a = sum_to_shape(xp.matmul(g, b2.swapaxes(-1, -2)), a2.shape)
            grad_a = grad_a.reshape(a.shape)
        if need_b:
            if b2.ndim == 2 and g.ndim > 2:
                n, m = a2.shape[-1], g.shape[-1]
                grad_b = a2.reshape(-1, n).T @ g.reshape(-1, m)
            else:
                grad_b = sum_to_shape(xp.matmul(a2.swapaxes(-1, -2), g), b2.shape)
            grad_b = grad_b.reshape(b.shape)
        return grad_a, grad_b


def _mismatch(a_shape, b_shape):
    """Why ``a_shape @ b_shape`` fails, in the terms of the operands (checked only after NumPy refused)."""
    inner_a = a_shape[-1]
    inner_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if inner_a != inner_b:
        return (f"inner dimensions differ: {a_shape} @ {b_shape} contracts the last axis of the first "
                f"({inner_a}) with the {'only' if len(b_shape) == 1 else 'second-to-last'} axis of the "
                f"second ({inner_b})")
    return f"the batch axes {a_shape[:-2]} and {b_shape[:-2]} of {a_shape} @ {b_shape} do not broadcast"


def matmul(a, b):
    return MatMul.apply(operand(a), operand(b))


Tensor.__matmul__ = matmul
Tensor.__rmatmul__ = lambda self, other: matmul(other, self)
