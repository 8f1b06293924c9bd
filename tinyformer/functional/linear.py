"""The affine map of a linear layer, and the feed-forward net's first layer fused with its ReLU (§3.3)."""

import numpy

from .. import amp, backend
from ..tensor import Function

_xp = backend.get_array_module


class Linear(Function):
    """y = x Wᵀ + b with W of shape (out, in);  dx = dy W, dW = dyᵀ x, db = Σ dy.

    dW and db are single products over the flattened batch (no per-example temporaries).
    Half-precision operands without a native product (``backend.has_half_matmul``: NumPy) are
    multiplied in float32 and the result rounded once, as a float32 accumulator would.
    """

    def forward(self, x, weight, bias=None):
        if weight.ndim != 2:
            raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {weight.shape}")
        if x.ndim == 0:
            raise ValueError("input needs a feature axis, got a 0-d array")
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(
                f"input has {x.shape[-1]} features but weight expects {weight.shape[1]}"
            )
        if bias is not None and bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},) for {weight.shape[0]} output "
                             f"features, got {bias.shape}")
        self.half = x.dtype if backend.is_half(x.dtype) and not backend.has_half_matmul(x) else None
        if self.half is not None:
            x, weight, bias = (None if a is None else backend.cast(a, numpy.float32) for a in (x, weight, bias))
        self.x, self.weight = x, weight
        # One GEMM over the flattened batch (matmul on a 3-D x would loop over the batch).
        y = x.reshape(-1, x.shape[-1]) @ weight.T
        self._epilogue(y, bias)
        y = y.reshape(x.shape[:-1] + (weight.shape[0],))
        return y if self.half is None else backend.cast(y, self.half)

    def _epilogue(self, y, bias):
        """Adds the bias in place (y is ours: no second (batch, out) array), in row blocks."""
        def add_bias(start, stop):
            y[start:stop] += bias

        if bias is not None:
            backend.map_row_blocks(add_bias, len(y), y, row_size=y.shape[1])

    def backward(self, g):
        need_x, need_w, need_b = (tuple(self.needs_input_grad) + (False,))[:3]
        if self.half is not None:
            g = backend.cast(g, numpy.float32)
        g2 = g.reshape(-1, g.shape[-1])
        grad_x = (g2 @ self.weight).reshape(self.x.shape) if need_x else None
        grad_w = g2.T @ self.x.reshape(-1, self.x.shape[-1]) if need_w else None
        grad_b = g2.sum(axis=0) if need_b else None
        return grad_x, grad_w, grad_b


class LinearRelu(Linear):
    """z = max(0, x Wᵀ + b), the first layer of the position-wise feed-forward net (§3.3), as one
    node: the ReLU runs in place on the product, keeping only the mask m = [z > 0];
    dz/d(x Wᵀ + b) = m, then Linear's backward."""

    def _epilogue(self, y, bias):
        self.positive = positive = _xp(y).empty(y.shape, dtype=bool)

        def rows(start, stop):  # bias, mask and ReLU in one cache-resident pass per row block
            block = y[start:stop]
            if bias is not None:
                block += bias
            _xp(y).greater(block, 0, out=positive[start:stop])
            _xp(y).maximum(block, 0, out=block)

        backend.map_row_blocks(rows, len(y), y, row_size=y.shape[1])

    def backward(self, g):
        positive = self.positive.reshape(g.shape)
        if self.half is not None:
            g = backend.cast(g, numpy.float32)
        return super().backward(backend.blockwise(_xp(g).multiply, g, positive))


def linear(x, weight, bias=None):
    """x Wᵀ + b: the affine map of a linear layer, weight stored (out_features, in_features);
    in the half type under ``amp.autocast``."""
    x, weight, bias = amp.half_args(x, weight, bias)
    return Linear.apply(x, weight) if bias is None else Linear.apply(x, weight, bias)


def linear_relu(x, weight, bias=None):
    """max(0, x Wᵀ + b) in one node (see LinearRelu): the same values and gradients as
    ``linear(x, weight, bias).relu()`` without the second (batch, out) array."""
    x, weight, bias = amp.half_args(x, weight, bias)
    return LinearRelu.apply(x, weight) if bias is None else LinearRelu.apply(x, weight, bias)
