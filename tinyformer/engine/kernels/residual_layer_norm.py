"""The launchers of residual_layer_norm.cu: the post-LN sublayer connection layer_norm(x + dropout(y))
in one kernel each way.

Reference: ``functional.ResidualDropoutLayerNorm``; the mask is dropout.cu's for the same seed,
and the parameter gradients come from layer norm's own two-stage reduction
(``layer_norm.layer_norm_backward``) on h. One block per row (``registry.row_threads``); the
kernels and their element types are registered in ``registry.KERNELS``.
"""

import numpy

from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, f32, i32, row_count, seed_arguments
from .layer_norm import layer_norm_backward


def residual_layer_norm_forward(x, y, weight, bias, p=0.0, seed=0, offset=0, scale=None, eps=1e-5, dtype=None):
    """out = layer_norm(x + dropout(y)) over the last axis in one kernel: returns (out, h, keep, mean,
    rstd) with h = x + y ∘ keep · scale (what the backward normalises again), keep a bool array of
    y's shape (all True at p = 0) drawn as ``dropout.dropout_forward`` draws it, mean/rstd float32 per row."""
    x, y, weight, bias = contiguous(x, y, weight, bias)
    if x.shape != y.shape:
        raise ValueError(f"residual_layer_norm: x {x.shape} and y {y.shape} must have the same shape")
    name = element_dtype(x, dtype)
    xp, cols = array_module(x), x.shape[-1]
    rows = row_count(x, cols)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    h, out = xp.empty_like(x), xp.empty_like(x)
    keep = xp.empty(x.shape, dtype=numpy.bool_)
    mean = xp.empty(rows, dtype=numpy.float32)
    rstd = xp.empty(rows, dtype=numpy.float32)
    if rows and cols:
        launch.launch("residual_layer_norm_forward", name, (rows,), (registry.row_threads(cols),),
                      (x, y, weight, bias, h, out, keep, mean, rstd, i32(cols), f32(p), f32(scale), f32(eps),
                       *seed_arguments(seed, x), numpy.uint64(offset)))
    return out, h, keep, mean, rstd


def residual_layer_norm_backward(h, weight, grad_out, mean, rstd, keep, scale=1.0, need_params=True, dtype=None):
    """(grad_x, grad_y, grad_weight, grad_bias) of ``residual_layer_norm_forward``; the parameter
    gradients (None unless ``need_params``) by layer norm's two-stage reduction on h."""
    h, weight, grad_out, keep = contiguous(h, weight, grad_out, keep)
    name = element_dtype(h, dtype)
    xp, cols = array_module(h), h.shape[-1]
    rows = row_count(h, cols)
    grad_x, grad_y = xp.empty_like(h), xp.empty_like(h)
    if rows and cols:
        launch.launch("residual_layer_norm_backward", name, (rows,), (registry.row_threads(cols),),
                      (h, weight, grad_out, mean, rstd, keep, grad_x, grad_y, i32(cols), f32(scale)))
    grad_w = grad_b = None
    if need_params:
        _, grad_w, grad_b = layer_norm_backward(h, weight, grad_out, mean, rstd, need_input=False, dtype=dtype)
    return grad_x, grad_y, grad_w, grad_b
