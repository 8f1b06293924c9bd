"""The launcher of dropout.cu: inverted dropout with its mask drawn on the device from Philox.

Reference: ``functional.Dropout`` with the mask of ``kernels/philox.py``. A grid-stride launch
(``arguments.elementwise_grid``), one thread per four elements: one Philox block. The kernel
and its element types are registered in ``registry.KERNELS``.
"""

import numpy

from . import launch
from .arguments import array_module, contiguous, element_dtype, elementwise_grid, f32, seed_arguments


def dropout_forward(x, p, seed, offset=0, scale=None, dtype=None):
    """Inverted dropout with the mask from Philox: returns (y, keep), keep a bool array of x's shape.

    keep_i = philox_uniform(seed, offset, i) >= p over x's elements in C order (``seed`` an int or
    an ``arguments.DeviceSeed``, as for every kernel that draws dropout);
    y = x ∘ keep · scale, scale = 1/(1 − p) unless given (functional passes x's dtype's value).
    """
    (x,) = contiguous(x)
    name = element_dtype(x, dtype)
    xp = array_module(x)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    y = xp.empty_like(x)
    keep = xp.empty(x.shape, dtype=numpy.bool_)
    if x.size:
        blocks, threads = elementwise_grid(x.size, 4)  # one thread per 4 elements: one Philox block
        launch.launch("dropout_forward", name, (blocks,), (threads,),
                      (x, y, keep, numpy.int64(x.size), f32(p), f32(scale), *seed_arguments(seed, x),
                       numpy.uint64(offset)))
    return y, keep
