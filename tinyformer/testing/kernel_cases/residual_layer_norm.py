"""The case of residual_layer_norm.cu: its launchers against ``F.layer_norm`` of x + dropout(y)."""

import numpy

from ...engine import backend, functional as F
from ...engine.kernels import residual_layer_norm as residual_layer_norm_kernel
from .harness import KernelRun, compared, philox_keep, rand, reference, shape_label


def residual_layer_norm(dev, rows, cols, p, seed=0, rng_seed=0):
    """residual_layer_norm.cu against F.layer_norm(h) in float64 with h = x + y ∘ Z as the kernel
    holds it (each term and the sum rounded to the element type, as the unfused path stores them),
    Z = keep/(1 − p) with dropout.cu's Philox mask keep = philox_uniform(seed, 0, e) >= p (compared
    exactly); outputs and the gradients of x (= dh), y (= dh ∘ Z), w, b for a random upstream
    gradient, with layer norm's tolerances. (A reference on the unrounded sum is off by h's
    rounding: in bfloat16 dw = Σ_rows dy ∘ x̂ then differs by 0.1 over 300 rows.)"""
    rng = numpy.random.default_rng(rng_seed)
    x, y = dev.round(rand(rng, rows, cols, scale=2.0) + 1.5), dev.round(rand(rng, rows, cols))
    w, b, g = dev.round(rand(rng, cols)), dev.round(rand(rng, cols)), dev.round(rand(rng, rows, cols))
    keep = philox_keep(seed, 0, x.shape, p)
    scale = float(dev.round(numpy.array([1.0 / (1.0 - p)], numpy.float32))[0])  # in the element type, as F passes it
    kept = keep * scale
    h = dev.round(dev.round(y * kept.astype(numpy.float32)) + x)
    (expected,), (gh, gw, gb) = reference(lambda h, w, b: F.layer_norm(h, w, b, 1e-5), [h, w, b], [g])
    gx, gy = gh, gh * kept
    out, kernel_h, kernel_keep, mean, rstd = residual_layer_norm_kernel.residual_layer_norm_forward(
        dev.put(x), dev.put(y), dev.put(w), dev.put(b), p, seed, scale=scale)
    kx, ky, kw, kb = residual_layer_norm_kernel.residual_layer_norm_backward(
        kernel_h, dev.put(w), dev.put(g), mean, rstd, kernel_keep, scale)
    sums = 1e-5 * max(1, rows / 16)
    return KernelRun(f"x,y {shape_label(x)} w,b {shape_label(w)} p {p:g}",
                     [compared("keep", kernel_keep, keep, 0.0, 0.0), dev.output("output", out, expected, atol=1e-5),
                      dev.gradient("grad x", kx, gx, atol=1e-5), dev.gradient("grad y", ky, gy, atol=1e-5),
                      dev.gradient("grad w", kw, gw, atol=sums), dev.gradient("grad b", kb, gb, atol=sums)],
                     {"keep": backend.to_numpy(kernel_keep)})
