"""The launchers of cross_entropy.cu: label-smoothed cross entropy fused with log-softmax, one
block per row of logits.

Reference: ``functional.CrossEntropy``. Per-row results (loss, NLL, log-sum-exp) are float32
whatever the logits' element type. The kernels and their element types are registered in
``registry.KERNELS``; the block size is ``registry.row_threads`` of the vocabulary.
"""

import numpy

from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, f32, i32, row_count


def _targets(target, xp):
    """The targets as the kernel reads them: flat, contiguous int64."""
    return xp.ascontiguousarray(target.reshape(-1), dtype=numpy.int64)


def cross_entropy_forward(logits, target, smoothing=0.0, ignore_index=None, dtype=None):
    """Per-row (loss, nll, lse) as float32 for logits (..., V) flattened to rows."""
    (logits,) = contiguous(logits)
    name = element_dtype(logits, dtype)
    xp, vocab = array_module(logits), logits.shape[-1]
    rows = row_count(logits, vocab)
    target = _targets(target, xp)
    loss, nll, lse = (xp.empty(rows, dtype=numpy.float32) for _ in range(3))
    if rows:
        launch.launch("cross_entropy_forward", name, (rows,), (registry.row_threads(vocab),),
                      (logits, target, loss, nll, lse, i32(vocab), numpy.int64(ignore_index or 0),
                       i32(ignore_index is not None), f32(smoothing)))
    return loss, nll, lse


def cross_entropy_backward(logits, target, lse, grad_loss, grad_nll, smoothing=0.0, ignore_index=None, dtype=None):
    """d logits from per-row upstream gradients of loss and nll (float32 arrays of rows)."""
    (logits,) = contiguous(logits)
    name = element_dtype(logits, dtype)
    xp, vocab = array_module(logits), logits.shape[-1]
    rows = row_count(logits, vocab)
    target = _targets(target, xp)
    grad_loss, grad_nll = (xp.ascontiguousarray(g, dtype=numpy.float32) for g in (grad_loss, grad_nll))
    grad = xp.empty_like(logits)
    if rows:
        launch.launch("cross_entropy_backward", name, (rows,), (registry.row_threads(vocab),),
                      (logits, target, lse, grad_loss, grad_nll, grad, i32(vocab),
                       numpy.int64(ignore_index or 0), i32(ignore_index is not None), f32(smoothing)))
    return grad
