"""The case of bias_relu_dropout.cu: its launchers against dropout(max(0, y + b)) in float64."""

import numpy

from ...engine import backend
from ...engine.kernels import bias_relu_dropout as bias_relu_dropout_kernel
from .harness import KernelRun, compared, philox_keep, rand, shape_label


def bias_relu_dropout(dev, rows, cols, p, seed=0, rng_seed=0):
    """bias_relu_dropout.cu against dropout(max(0, y + b)) in float64 with dropout.cu's Philox mask
    (keep = philox_uniform(seed, 0, e) >= p) and the mask [y + b > 0] ∧ keep compared exactly; the
    backward dz ∘ mask · scale."""
    rng = numpy.random.default_rng(rng_seed)
    y, b, g = dev.round(rand(rng, rows, cols)), dev.round(rand(rng, cols)), dev.round(rand(rng, rows, cols))
    keep = philox_keep(seed, 0, y.shape, p)
    scale = float(dev.round(numpy.array([1.0 / (1.0 - p)], numpy.float32))[0])
    pre = dev.round(y + b)  # y + b as the element type holds it
    mask = (pre > 0) & keep
    expected = numpy.where(mask, pre.astype(numpy.float64) * (scale if p else 1.0), 0.0)
    z, kernel_mask = bias_relu_dropout_kernel.bias_relu_dropout_forward(dev.put(y), dev.put(b), p, seed, scale=scale)
    grad = bias_relu_dropout_kernel.bias_relu_dropout_backward(dev.put(g), kernel_mask, scale if p else 1.0)
    expected_grad = numpy.where(mask, g.astype(numpy.float64) * (scale if p else 1.0), 0.0)
    tight = dev.dtype == "float32"
    return KernelRun(f"y {shape_label(y)} b {shape_label(b)} p {p:g}",
                     [compared("mask", kernel_mask, mask, 0.0, 0.0),
                      compared("output", dev.get(z), expected, 1e-6, 0.0) if tight
                      else dev.output("output", z, expected),
                      compared("grad y", dev.get(grad), expected_grad, 1e-6, 0.0) if tight
                      else dev.gradient("grad y", grad, expected_grad)],
                     {"mask": backend.to_numpy(kernel_mask)})
