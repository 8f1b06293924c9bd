"""The case of layer_norm.cu: its launchers against ``F.layer_norm``."""

import numpy

from ...engine import backend, functional as F
from ...engine.kernels import layer_norm as layer_norm_kernel
from .harness import KernelRun, rand, reference, shape_label


def layer_norm(dev, rows, cols, seed=0, rows_per_chunk=16, x=None):
    """layer_norm.cu (forward, dx, the two-stage dw/db) against F.layer_norm, eps 1e-5.
    ``x`` (float32, rows × cols) replaces the drawn N(1.5, 4) input, e.g. by rows near the
    float32 maximum, whose statistics the kernel computes on a rescaled row."""
    rng = numpy.random.default_rng(seed)
    x = dev.round(rand(rng, rows, cols, scale=2.0) + 1.5) if x is None else dev.round(x)
    w, b, g = dev.round(rand(rng, cols)), dev.round(rand(rng, cols)), dev.round(rand(rng, rows, cols))
    (expected,), (gx, gw, gb) = reference(lambda x, w, b: F.layer_norm(x, w, b, 1e-5), [x, w, b], [g])
    y, mean, rstd = layer_norm_kernel.layer_norm_forward(dev.put(x), dev.put(w), dev.put(b), 1e-5)
    kx, kw, kb = layer_norm_kernel.layer_norm_backward(dev.put(x), dev.put(w), dev.put(g), mean, rstd,
                                                       rows_per_chunk=rows_per_chunk)
    # r·(g − mean g − x̂·mean(g x̂)) cancels: a few ulp of r·|g|; dw and db sum over the rows
    sums = 1e-5 * max(1, rows / 16)
    return KernelRun(f"x {shape_label(x)} w,b {shape_label(w)}",
                     [dev.output("output", y, expected, atol=1e-5), dev.gradient("grad x", kx, gx, atol=1e-5),
                      dev.gradient("grad w", kw, gw, atol=sums), dev.gradient("grad b", kb, gb, atol=sums)],
                     {"y": dev.get(y), "grad x": dev.get(kx), "grad w": dev.get(kw), "grad b": dev.get(kb),
                      "mean": backend.to_numpy(mean), "rstd": backend.to_numpy(rstd)})
