"""The launchers of layer_norm.cu: layer normalisation over the last axis.

Reference: ``functional.LayerNorm``. The forward runs one block per row (``registry.row_threads``);
the backward one block per chunk of ``registry.LAYER_NORM_ROWS_PER_CHUNK`` rows, which computes
dx row by row and sums its rows' share of dw and db as it goes; one more launch
(``registry.COLUMN_BLOCK`` columns per block) sums the chunks, adding into the gradients given
(``grad_weight``, ``grad_bias``: a parameter's ``.grad``) or writing new ones. The kernels and their
element types are registered in ``registry.KERNELS``.
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


class ChunkedSums:
    """The per-chunk partials of dw and db a backward launch fills (layer_norm.cuh's ChunkSums):
    its grid, the arguments it takes for them, and ``reduce``, the launch that sums them. ``extra``:
    one more column sum beside them (``partial_e``, the residual's d(y_bias)), summed by the same launch."""

    def __init__(self, xp, rows, cols, rows_per_chunk=None, needed=True, extra=False):
        self.rows_per_chunk = max(1, int(rows_per_chunk or registry.LAYER_NORM_ROWS_PER_CHUNK))
        self.cols, self.needed, self.extra = cols, needed, extra
        self.chunks = math.ceil(rows / self.rows_per_chunk)
        shape = (self.chunks, cols) if needed else (0,)
        self.partial_w, self.partial_b = xp.empty(shape, numpy.float32), xp.empty(shape, numpy.float32)
        self.partial_e = xp.empty((self.chunks, cols) if extra else (0,), numpy.float32)
        # the block's sums in dynamic shared memory where they fit without opting in, else in its partials' row
        sums = 2 * needed + extra
        self.in_shared = bool(sums) and sums * cols * 4 <= launch.STATIC_SHARED_LIMIT
        self.shared_mem = sums * cols * 4 if self.in_shared else 0

    def pointers(self):
        """The kernel's partial_w, partial_b: null pointers when the sums are not needed."""
        return (self.partial_w, self.partial_b) if self.needed else (numpy.uint64(0), numpy.uint64(0))

    def extra_pointer(self):
        """The kernel's partial_e: a null pointer without the extra sum."""
        return self.partial_e if self.extra else numpy.uint64(0)

    def reduce(self, name, weight, grad_weight=None, grad_bias=None, grad_extra=None):
        """(dw, db), and the extra sum third where ``extra``: the chunks summed in one launch, added into
        ``grad_weight``/``grad_bias``/``grad_extra`` where given (contiguous, weight's shape and element
        type), else into new arrays; None for the sums not ``needed``."""
        xp = array_module(weight)
        wanted = (("grad_weight", grad_weight, self.needed), ("grad_bias", grad_bias, self.needed),
                  ("grad_extra", grad_extra, self.extra))
        outs = []
        for label, given, made in wanted:
            if given is not None and (given.shape != weight.shape or given.dtype.name != name
                                      or not given.flags.c_contiguous):
                raise ValueError(f"layer_norm: {label} must be a contiguous {name} array of shape {weight.shape}, "
                                 f"got {given.dtype} {given.shape}")
            outs.append(None if not made else xp.empty(weight.shape, dtype=weight.dtype) if given is None else given)
        if self.cols and (self.needed or self.extra):
            null = numpy.uint64(0)
            launch.launch("layer_norm_reduce_params", name, (math.ceil(self.cols / registry.COLUMN_BLOCK),),
                          (registry.COLUMN_BLOCK,),
                          (*self.pointers(), self.extra_pointer(), *(null if out is None else out for out in outs),
                           i32(self.chunks), i32(self.cols),
                           *(i32(given is not None) for _, given, _ in wanted)))
        return tuple(outs) if self.extra else tuple(outs[:2])


def layer_norm_backward(x, weight, grad_y, mean, rstd, need_input=True, need_params=True, dtype=None,
                        rows_per_chunk=None, grad_weight=None, grad_bias=None):
    """Returns (grad_x, grad_weight, grad_bias); an entry is None when not asked for. dw and db are
    added into ``grad_weight``/``grad_bias`` where given (then returned), else new arrays.
    ``rows_per_chunk`` (default ``registry.LAYER_NORM_ROWS_PER_CHUNK``): rows per block of the backward."""
    x, weight, grad_y = contiguous(x, weight, grad_y)
    name = element_dtype(x, dtype)
    xp, cols = array_module(x), x.shape[-1]
    rows = row_count(x, cols)
    sums = ChunkedSums(xp, rows, cols, rows_per_chunk, need_params)
    grad_x = xp.empty_like(x) if need_input else None
    if rows and cols and (need_input or need_params):
        launch.launch("layer_norm_backward_input", name, (sums.chunks,), (registry.row_threads(cols),),
                      (x, weight, grad_y, mean, rstd, numpy.uint64(0) if grad_x is None else grad_x,
                       *sums.pointers(), i32(rows), i32(cols), i32(sums.rows_per_chunk), i32(sums.in_shared)),
                      shared_mem=sums.shared_mem)
    grad_w = grad_b = None
    if need_params:
        grad_w, grad_b = sums.reduce(name, weight, grad_weight, grad_bias)
    return grad_x, grad_w, grad_b
