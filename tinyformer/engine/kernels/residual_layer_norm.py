"""The launchers of residual_layer_norm.cu: the post-LN sublayer connection
layer_norm(x + dropout(y + y_bias)) in one kernel each way (y_bias, the sublayer's output bias, optional).

Reference: ``functional.ResidualDropoutLayerNorm``; the mask is dropout.cu's for the same seed.
The forward runs one block per row (``registry.row_threads``); the backward one block per chunk of
rows, which also sums its rows' share of dw and db, then layer norm's one reduction launch
(``layer_norm.ChunkedSums``) adds them into the parameters' gradients or writes new ones; with
d(y_bias) = Σ_rows dy, summed beside them by the same blocks and launch (no launch of its own). Every
operand of one element type, or, under autocast, x, the parameters and y_bias float32 with y (and so dy)
float16 or bfloat16: the ``*_mixed`` kernels read and write y's type themselves (no cast launches).
The kernels and their element types are registered in ``registry.KERNELS``.
"""

import numpy

from .. import backend
from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, f32, i32, row_count, seed_arguments
from .layer_norm import ChunkedSums


def _forms(x, y, dtype, names=("x", "y")):
    """(kernel suffix, element type name): "" and x's type where y has it, "_mixed" and y's where
    x is float32 and y half; a clear error otherwise."""
    name = element_dtype(x, dtype)
    if y.dtype.name == name:
        return "", name
    if name == "float32" and backend.is_half(y.dtype):
        return "_mixed", element_dtype(y)
    raise TypeError(f"residual_layer_norm: {names[0]} is {x.dtype} and {names[1]} {y.dtype}: both of one type, "
                    f"or {names[0]} float32 and {names[1]} float16 or bfloat16")


def residual_layer_norm_forward(x, y, weight, bias, p=0.0, seed=0, offset=0, scale=None, eps=1e-5, dtype=None,
                                y_bias=None):
    """out = layer_norm(x + dropout(y + y_bias)) over the last axis in one kernel: returns (out, h, keep,
    mean, rstd) with h = x + (y + y_bias) ∘ keep · scale (what the backward normalises again) of x's
    type, keep a bool array of y's shape (all True at p = 0) drawn as ``dropout.dropout_forward`` draws
    it, mean/rstd float32 per row. y may be half where x is float32 (autocast's sublayer output);
    ``y_bias`` (None: none) is of x's type, one value per feature."""
    x, y, weight, bias = contiguous(x, y, weight, bias)
    if x.shape != y.shape:
        raise ValueError(f"residual_layer_norm: x {x.shape} and y {y.shape} must have the same shape")
    suffix, name = _forms(x, y, dtype)
    xp, cols = array_module(x), x.shape[-1]
    if y_bias is not None:
        (y_bias,) = contiguous(y_bias)
        if y_bias.shape != (cols,) or y_bias.dtype != x.dtype:
            raise ValueError(f"residual_layer_norm: y_bias must be a {x.dtype} array of shape ({cols},), "
                             f"got {y_bias.dtype} {y_bias.shape}")
    rows = row_count(x, cols)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    h, out = xp.empty_like(x), xp.empty_like(x)
    keep = xp.empty(x.shape, dtype=numpy.bool_)
    mean = xp.empty(rows, dtype=numpy.float32)
    rstd = xp.empty(rows, dtype=numpy.float32)
    if rows and cols:
        launch.launch("residual_layer_norm_forward" + suffix, name, (rows,), (registry.row_threads(cols),),
                      (x, y, numpy.uint64(0) if y_bias is None else y_bias, weight, bias, h, out, keep, mean, rstd,
                       i32(cols), f32(p), f32(scale), f32(eps), *seed_arguments(seed, x), numpy.uint64(offset)))
    return out, h, keep, mean, rstd


def residual_layer_norm_backward(h, weight, grad_out, mean, rstd, keep, scale=1.0, need_params=True, dtype=None,
                                 grad_y_dtype=None, rows_per_chunk=None, grad_weight=None, grad_bias=None,
                                 need_y_bias=False, grad_y_bias=None):
    """(grad_x, grad_y, grad_weight, grad_bias) of ``residual_layer_norm_forward``: grad_y of
    ``grad_y_dtype`` (y's; default h's), the parameter gradients (None unless ``need_params``) added
    into ``grad_weight``/``grad_bias`` where given (then returned), else new arrays. With
    ``need_y_bias``, a fifth: d(y_bias) = Σ_rows grad_y (of h's type), added into ``grad_y_bias``
    where given, summed by the same blocks and reduction launch."""
    h, weight, grad_out, keep = contiguous(h, weight, grad_out, keep)
    xp, cols = array_module(h), h.shape[-1]
    grad_y = xp.empty(h.shape, dtype=grad_y_dtype or h.dtype)
    suffix, name = _forms(h, grad_y, dtype, names=("h", "grad_y_dtype"))
    rows = row_count(h, cols)
    sums = ChunkedSums(xp, rows, cols, rows_per_chunk, need_params, extra=need_y_bias)
    grad_x = xp.empty_like(h)
    if rows and cols:
        launch.launch("residual_layer_norm_backward" + suffix, name, (sums.chunks,), (registry.row_threads(cols),),
                      (h, weight, grad_out, mean, rstd, keep, grad_x, grad_y, *sums.pointers(), sums.extra_pointer(),
                       i32(rows), i32(cols), i32(sums.rows_per_chunk), f32(scale), i32(sums.in_shared)),
                      shared_mem=sums.shared_mem)
    sums_out = (None, None, None)[:2 + int(need_y_bias)]
    if need_params or need_y_bias:
        sums_out = sums.reduce(element_dtype(h, dtype), weight, grad_weight, grad_bias, grad_y_bias)
    return (grad_x, grad_y) + tuple(sums_out)
