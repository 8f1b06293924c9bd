"""The launchers of layer_norm.cu: layer normalisation over the last axis.

Reference: ``functional.LayerNorm``. The forward and dx run one block per row
(``registry.row_threads``); dw and db reduce in two stages, blocks of ``registry.COLUMN_BLOCK``
columns over chunks of ``registry.LAYER_NORM_ROWS_PER_CHUNK`` rows, then over the chunks. The
kernels and their element types are registered in ``registry.KERNELS``.
"""

import math

import numpy

from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, f32, i32, row_count


def layer_norm_forward(x, weight, bias, eps=1e-5, dtype=None):
    """Returns (y, mean, rstd); mean and rstd are float32 with one entry per row."""
    x, weight, bias = contiguous(x, weight, bias)
    name = element_dtype(x, dtype)
    xp, cols = array_module(x), x.shape[-1]
    rows = row_count(x, cols)
    y = xp.empty_like(x)
    mean = xp.empty(rows, dtype=numpy.float32)
    rstd = xp.empty(rows, dtype=numpy.float32)
    if rows and cols:
        launch.launch("layer_norm_forward", name, (rows,), (registry.row_threads(cols),),
                      (x, weight, bias, y, mean, rstd, i32(cols), f32(eps)))
    return y, mean, rstd


def layer_norm_backward(x, weight, grad_y, mean, rstd, need_input=True, need_params=True, dtype=None,
                        rows_per_chunk=None):
    """Returns (grad_x, grad_weight, grad_bias); an entry is None when not asked for.
    ``rows_per_chunk`` (default ``registry.LAYER_NORM_ROWS_PER_CHUNK``): rows per block of dw/db's first stage."""
    x, weight, grad_y = contiguous(x, weight, grad_y)
    name = element_dtype(x, dtype)
    xp, cols = array_module(x), x.shape[-1]
    rows = row_count(x, cols)
    grad_x = grad_w = grad_b = None
    if need_input:
        grad_x = xp.empty_like(x)
        if rows and cols:
            launch.launch("layer_norm_backward_input", name, (rows,), (registry.row_threads(cols),),
                          (x, weight, grad_y, mean, rstd, grad_x, i32(cols)))
    if need_params:
        rows_per_chunk = rows_per_chunk or registry.LAYER_NORM_ROWS_PER_CHUNK
        chunks = max(1, math.ceil(rows / rows_per_chunk))
        partial_w = xp.zeros((chunks, cols), dtype=numpy.float32)
        partial_b = xp.zeros((chunks, cols), dtype=numpy.float32)
        grad_w, grad_b = xp.empty_like(weight), xp.empty_like(weight)
        threads = registry.COLUMN_BLOCK
        column_blocks = math.ceil(cols / threads)
        if rows and cols:
            launch.launch("layer_norm_backward_params", name, (column_blocks, chunks), (threads,),
                          (x, grad_y, mean, rstd, partial_w, partial_b, i32(rows), i32(cols), i32(rows_per_chunk)))
        if cols:
            launch.launch("layer_norm_reduce_params", name, (column_blocks,), (threads,),
                          (partial_w, partial_b, grad_w, grad_b, i32(chunks), i32(cols)))
    return grad_x, grad_w, grad_b
