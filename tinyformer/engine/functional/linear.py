"""The affine map of a linear layer, and the feed-forward net's first layer fused with its ReLU
(§3.3) and, for activation dropout, with its dropout too (kernels/bias_relu_dropout.cu on the GPU)."""


from .. import amp, backend, kernels
from ..kernels import bias_relu_dropout as bias_relu_dropout_kernel
from ..kernels.cublas import column_sums, matmul
from ..tensor import Function
from ...common.validation import check_probability
from ._dispatch import KernelFunction
from ..random import kernel_seed
from .dropout import _check_generator, _dropped, _scale, _scaled_by_mask

_xp = backend.get_array_module


def _check_linear(x, weight, bias):
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


def _linear_grads(g, x, weight, needs, targets=()):
    """(dx, dW, db) of y = x Wᵀ + b for the upstream g, each only where ``needs`` says. Each goes
    straight into the gradient that ``targets`` (autograd.GradTarget, by input) offers for it (a
    leaf's ``.grad``, or x's gradient gathered so far): the product accumulates into that buffer, one
    launch, and None is returned for it."""
    need_x, need_w, need_b = (tuple(needs) + (False,))[:3]
    target_x, target_w, target_b = (tuple(targets) + (None,) * 3)[:3]
    g2 = g.reshape(-1, g.shape[-1])
    grad_x = grad_w = grad_b = None
    if need_x:
        if target_x is None:
            grad_x = matmul(g2, weight).reshape(x.shape)
        else:
            out, accumulate = target_x.output()
            matmul(g2, weight, out=out.reshape(g2.shape[0], weight.shape[1]), accumulate=accumulate)
    if need_w:
        x2 = x.reshape(-1, x.shape[-1])
        if target_w is None:
            grad_w = matmul(g2.T, x2)
        else:
            out, accumulate = target_w.output()
            matmul(g2.T, x2, out=out, accumulate=accumulate)
    if need_b:
        if target_b is None:
            grad_b = column_sums(g2)
        else:
            out, accumulate = target_b.output()
            column_sums(g2, out=out, accumulate=accumulate)
    return grad_x, grad_w, grad_b


def _add_bias(y, bias):
    """y += bias over the rows of a 2-D y in place, in cache-sized row blocks (one launch on a GPU)."""
    def add_bias(start, stop):
        block = y[start:stop]
        _xp(y).add(block, bias, out=block)

    backend.map_row_blocks(add_bias, len(y), y, row_size=y.shape[1], cache_sized=True)


class Linear(Function):
    """y = x Wᵀ + b with W of shape (out, in);  dx = dy W, dW = dyᵀ x, db = Σ dy.

    dW and db are single products over the flattened batch (no per-example temporaries), added
    straight into the parameters' gradients where the engine offers them (``grad_targets``). On the
    GPU each product is one cuBLAS GEMM that CUDA graphs can capture (``kernels.cublas``); half
    operands accumulate in float32, and a float32 parameter's dW from its half compute copy is
    accumulated into its float32 gradient unrounded.
    """

    accepts_grad_targets = fresh_input_grads = True

    def forward(self, x, weight, bias=None):
        _check_linear(x, weight, bias)
        self.x, self.weight = x, weight
        # One GEMM over the flattened batch (matmul on a 3-D x would loop over the batch).
        y = matmul(x.reshape(-1, x.shape[-1]), weight.T)
        self._epilogue(y, bias)
        return y.reshape(x.shape[:-1] + (weight.shape[0],))

    def _epilogue(self, y, bias):
        """Adds the bias in place (y is ours: no second (batch, out) array)."""
        if bias is not None:
            _add_bias(y, bias)

    def backward(self, g):
        return _linear_grads(g, self.x, self.weight, self.needs_input_grad, self.grad_targets)


class LinearRelu(Linear):
    """z = max(0, x Wᵀ + b), the first layer of the position-wise feed-forward net (§3.3), as one
    node: the ReLU runs in place on the product, keeping only the mask m = [z > 0];
    dz/d(x Wᵀ + b) = m, then Linear's backward."""

    def _epilogue(self, y, bias):
        self.positive = positive = _xp(y).empty(y.shape, dtype=bool)

        def rows(start, stop):  # bias, mask and ReLU in one cache-resident pass per row block
            block = y[start:stop]
            if bias is not None:
                _xp(y).add(block, bias, out=block)
            _xp(y).greater(block, 0, out=positive[start:stop])
            _xp(y).maximum(block, 0, out=block)

        backend.map_row_blocks(rows, len(y), y, row_size=y.shape[1], cache_sized=True)

    def backward(self, g):
        return super().backward(backend.blockwise(_xp(g).multiply, g, self.positive.reshape(g.shape)))


class LinearReluDropout(KernelFunction):
    """z = dropout(max(0, x Wᵀ + b)): the feed-forward net's first layer with activation dropout,
    as one node. The same values, gradients and generator draws as ``dropout(linear_relu(x, W, b),
    p)``: the reference is ``LinearRelu`` then the dropout of ``Dropout``; dz/d(xWᵀ + b) =
    [xWᵀ + b > 0] ∘ m / (1 − p), then Linear's backward. On the GPU the product is one matmul and
    bias, ReLU and dropout one kernel after it (kernels/bias_relu_dropout.cu; dropout.cu's mask for
    the seed drawn from ``generator``), their backward one more.
    """

    accepts_grad_targets = fresh_input_grads = True

    def check_forward(self, x, weight, bias, p, generator):
        _check_linear(x, weight, bias)

    def kernel_applies(self, x, weight, bias, p, generator):
        return (bias is not None and kernels.use_kernels(x, weight, bias)
                and len({x.dtype, weight.dtype, bias.dtype}) == 1)

    def forward_reference(self, x, weight, bias, p, generator):
        self.relu = LinearRelu()
        self.relu.needs_input_grad = self.needs_input_grad[:3]
        z = self.relu.forward(x, weight, bias)
        self.p = p
        if p:  # z is this node's own: dropped in place; the ReLU's mask becomes [z > 0] ∘ keep
            self.scale = _scale(z, p)
            z, keep = _dropped(z, p, generator, out=z)
            positive = self.relu.positive
            _xp(z).logical_and(positive, keep.reshape(positive.shape), out=positive)
        return z

    def backward_reference(self, g):
        self.relu.grad_targets = self.grad_targets[:3]
        if not self.p:
            return (*self.relu.backward(g), None, None)
        # one pass for both masks: dz ∘ [z > 0] ∘ keep / (1 − p), then Linear's backward
        g = _scaled_by_mask(g, self.relu.positive.reshape(g.shape), self.scale)
        return (*Linear.backward(self.relu, g), None, None)

    def forward_kernel(self, x, weight, bias, p, generator):
        self.x, self.weight = x, weight
        self.scale = float(_scale(x, p)) if p else 1.0
        y = matmul(x.reshape(-1, x.shape[-1]), weight.T)
        z, self.mask = bias_relu_dropout_kernel.bias_relu_dropout_forward(
            y, bias, p, kernel_seed(generator) if p else 0, scale=self.scale)
        return z.reshape(x.shape[:-1] + (weight.shape[0],))

    def backward_kernel(self, g):
        grad_y = bias_relu_dropout_kernel.bias_relu_dropout_backward(
            g.astype(self.x.dtype, copy=False), self.mask.reshape(g.shape), self.scale)
        return (*_linear_grads(grad_y, self.x, self.weight, self.needs_input_grad, self.grad_targets), None, None)


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


def linear_relu_dropout(x, weight, bias=None, p=0.0, training=True, generator=None):
    """dropout(max(0, x Wᵀ + b), p) in one node (see LinearReluDropout): the feed-forward net's first
    layer with activation dropout; ``linear_relu`` when not training or p = 0."""
    p = check_probability("linear_relu_dropout: p", p)
    _check_generator(generator, "linear_relu_dropout: generator")
    x, weight, bias = amp.half_args(x, weight, bias)
    return LinearReluDropout.apply(x, weight, bias, p if training else 0.0, generator)
