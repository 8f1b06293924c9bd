"""The case of dropout.cu: its launcher against the Philox mask of ``kernels/philox.py``."""

import numpy

from ...engine import backend
from ...engine.kernels import dropout as dropout_kernel
from .harness import KernelRun, compared, philox_keep, rand, shape_label


def dropout(dev, shape, p, seed, offset=0, rng_seed=0):
    """dropout.cu against its Philox reference: keep_i = philox_uniform(seed, offset, i) >= p over
    the elements in C order, exactly; y = x ∘ keep / (1 − p) (float32: rtol 1e-6)."""
    rng = numpy.random.default_rng(rng_seed)
    x = dev.round(rand(rng, *shape))
    keep = philox_keep(seed, offset, x.shape, p)
    expected = numpy.where(keep, x.astype(numpy.float64) / (1.0 - p), 0.0)
    y, kernel_keep = dropout_kernel.dropout_forward(dev.put(x), p, seed, offset)
    if kernel_keep.dtype != numpy.bool_ or kernel_keep.shape != x.shape or y.shape != x.shape:
        raise AssertionError(f"dropout kernel: keep {kernel_keep.dtype} {kernel_keep.shape}, y {y.shape} "
                             f"for x {x.shape}")
    output = (compared("output", dev.get(y), expected, 1e-6, 0.0) if dev.dtype == "float32"
              else dev.output("output", y, expected))
    return KernelRun(f"x {shape_label(x)}", [compared("keep", kernel_keep, keep, 0.0, 0.0), output],
                     {"keep": backend.to_numpy(kernel_keep)})
