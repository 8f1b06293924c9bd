"""The case of softmax.cu: its launchers against ``F.softmax`` and ``F.log_softmax``."""

import numpy

from ...engine import functional as F
from ...engine.kernels import softmax as softmax_kernel
from .harness import KernelRun, rand, reference, shape_label


def softmax(dev, rows, cols, log=False, seed=0):
    """softmax.cu against F.softmax (F.log_softmax). The backward kernel takes the forward's y;
    it is compared with the backward's formula on that y, and (float32) with F's gradient:
        softmax:      dx = y ∘ (dy − Σ dy ∘ y);   log-softmax:  dx = dy − exp(y) · Σ dy
    """
    rng = numpy.random.default_rng(seed)
    x, g = dev.round(rand(rng, rows, cols, scale=3.0)), dev.round(rand(rng, rows, cols))
    (expected,), (expected_grad,) = reference(F.log_softmax if log else F.softmax, [x], [g])
    y = softmax_kernel.softmax_forward(dev.put(x), log=log)
    grad_x = softmax_kernel.softmax_backward(y, dev.put(g), log=log)
    y64, g64 = dev.get(y).astype(numpy.float64), g.astype(numpy.float64)
    if log:
        from_y = g64 - numpy.exp(y64) * g64.sum(-1, keepdims=True)
    else:
        from_y = y64 * (g64 - (g64 * y64).sum(-1, keepdims=True))
    comparisons = [dev.output("output", y, expected), dev.gradient("grad x", grad_x, from_y)]
    if dev.dtype == "float32":  # y is F's to float32 rounding: the formula is F's gradient
        comparisons.append(dev.gradient("grad x against F's", grad_x, expected_grad))
    return KernelRun(f"x {shape_label(x)}", comparisons, {"y": dev.get(y)})
