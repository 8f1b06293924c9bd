"""The launchers of bias_relu_dropout.cu: the feed-forward net's bias, ReLU and activation
dropout in one pass after its matmul, and their backward.

Reference: ``functional.LinearReluDropout``; the mask is dropout.cu's for the same seed. A
grid-stride launch (``arguments.elementwise_grid``). The kernels and their element types are
registered in ``registry.KERNELS``.
"""

import numpy

from . import launch
from .arguments import array_module, contiguous, element_dtype, elementwise_grid, f32, i32, seed_arguments


def bias_relu_dropout_forward(y, bias, p=0.0, seed=0, offset=0, scale=None, dtype=None):
    """z = dropout(max(0, y + bias)) in place on y (rows of len(bias)); returns (z, mask) with
    mask = [y + bias > 0] ∧ keep, keep drawn as ``dropout.dropout_forward`` draws it (all True at p = 0)."""
    if not y.flags.c_contiguous:
        raise ValueError("bias_relu_dropout: y must be C-contiguous (it is updated in place)")
    (bias,) = contiguous(bias)
    if bias.shape != (y.shape[-1],):
        raise ValueError(f"bias_relu_dropout: bias must have shape ({y.shape[-1]},), got {tuple(bias.shape)}")
    name = element_dtype(y, dtype)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    mask = array_module(y).empty(y.shape, dtype=numpy.bool_)
    if y.size:
        blocks, threads = elementwise_grid(y.size, 4)  # one Philox block per 4 elements
        launch.launch("bias_relu_dropout_forward", name, (blocks,), (threads,),
                      (y, bias, mask, numpy.int64(y.size), i32(y.shape[-1]), f32(p), f32(scale),
                       *seed_arguments(seed, y), numpy.uint64(offset)))
    return y, mask


def bias_relu_dropout_backward(grad_z, mask, scale=1.0, dtype=None):
    """dy = dz ∘ mask · scale."""
    grad_z, mask = contiguous(grad_z, mask)
    name = element_dtype(grad_z, dtype)
    grad_y = array_module(grad_z).empty_like(grad_z)
    if grad_z.size:
        blocks, threads = elementwise_grid(grad_z.size)
        launch.launch("bias_relu_dropout_backward", name, (blocks,), (threads,),
                      (grad_z, mask, grad_y, numpy.int64(grad_z.size), f32(scale)))
    return grad_y
