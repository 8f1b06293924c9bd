"""The case of cross_entropy.cu: its launchers against ``F.cross_entropy``."""

import numpy

from ...engine import backend, functional as F
from ...engine.kernels import cross_entropy as cross_entropy_kernel
from .harness import KernelRun, compared, rand, reference, shape_label


def cross_entropy(dev, rows, vocab, smoothing, ignore_index, seed=0):
    """cross_entropy.cu against F.cross_entropy(reduction="none", return_nll=True): per-row loss,
    NLL and log-sum-exp (float32 whatever the element type) and d logits; the first two targets
    are 0 (ignored when ignore_index is 0)."""
    rng = numpy.random.default_rng(seed)
    logits = dev.round(rand(rng, rows, vocab, scale=4.0))
    target = rng.integers(0, vocab, rows)
    target[: min(2, rows)] = 0
    keep = numpy.ones(rows, bool) if ignore_index is None else target != ignore_index
    g_loss, g_nll = (rand(rng, rows) * keep for _ in range(2))
    (loss, nll), (expected_grad,) = reference(
        lambda z: F.cross_entropy(z, target, smoothing, ignore_index, reduction="none", return_nll=True),
        [logits], [g_loss, g_nll])
    device_target = backend.to_device(target, dev.device)
    k_loss, k_nll, lse = cross_entropy_kernel.cross_entropy_forward(dev.put(logits), device_target, smoothing,
                                                                    ignore_index)
    k_grad = cross_entropy_kernel.cross_entropy_backward(dev.put(logits), device_target, lse,
                                                         *(backend.to_device(g, dev.device) for g in (g_loss, g_nll)),
                                                         smoothing, ignore_index)
    z = logits.astype(numpy.float64)
    shift = z.max(axis=-1)
    expected_lse = shift + numpy.log(numpy.exp(z - shift[:, None]).sum(axis=-1))
    return KernelRun(f"logits {shape_label(logits)}",
                     [compared("loss", k_loss, loss, 1e-5, 2e-5), compared("nll", k_nll, nll, 1e-5, 2e-5),
                      compared("lse", lse, expected_lse, 1e-5, 2e-5),
                      dev.gradient("grad logits", k_grad, expected_grad, atol=1e-5)], {})
