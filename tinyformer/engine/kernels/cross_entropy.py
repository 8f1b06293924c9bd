"""The launchers of cross_entropy.cu: label-smoothed cross entropy fused with log-softmax, one
block per row of logits.

Reference: ``functional.CrossEntropy``. Per-row results (loss, NLL, log-sum-exp) are float32
whatever the logits' element type. ``cross_entropy_forward_reduced`` makes the same launch sum the
rows too ("sum" or "mean", the count of kept rows on the device: no host read), in a fixed order
(its last block, counted in a per-device, per-stream block counter that the kernel sets back to 0);
``cross_entropy_backward`` reads the upstream gradients as they come (per row, or one device value
for every row, or none) and the forward's scale. The kernels and their element types are registered
in ``registry.KERNELS``; the block size is ``registry.row_threads`` of the vocabulary.
"""

import numpy

from .. import backend
from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, f32, i32, pointer, row_count

_counters = {}  # (device, stream) -> [int32 block counter, whether it may not be 0 yet]


def _targets(target, xp):
    """The targets as the kernel reads them: flat, contiguous int64."""
    return xp.ascontiguousarray(target.reshape(-1), dtype=numpy.int64)


def _block_counter(xp):
    """The block counter of the launches on the current device and stream: 0 between launches (the
    kernel's last block sets it back). Made once; one made inside a CUDA capture is zeroed by the
    captured memset, which has not run yet, so the next launch outside a capture zeroes it first."""
    key = "host" if xp is numpy else (xp.cuda.Device().id, xp.cuda.get_current_stream().ptr)
    entry = _counters.get(key)
    if entry is None:
        entry = _counters[key] = [xp.zeros(1, dtype=numpy.int32), xp is not numpy and backend.is_capturing()]
    elif entry[1] and not backend.is_capturing():
        entry[0].fill(0)
        entry[1] = False
    return entry[0]


def _forward(logits, target, smoothing, ignore_index, reduction, dtype):
    """One launch: (loss, nll, lse) per row and totals = (Σ loss·scale, Σ nll·scale, scale), views of one buffer."""
    (logits,) = contiguous(logits)
    name = element_dtype(logits, dtype)
    xp, vocab = array_module(logits), logits.shape[-1]
    rows = row_count(logits, vocab)
    target = _targets(target, xp)
    buffer = xp.empty(3 * rows + 3, dtype=numpy.float32)
    loss, nll, lse, totals = buffer[:rows], buffer[rows:2 * rows], buffer[2 * rows:3 * rows], buffer[3 * rows:]
    if rows:
        counter = _block_counter(xp) if reduction != "none" else numpy.uint64(0)
        launch.launch("cross_entropy_forward", name, (rows,), (registry.row_threads(vocab),),
                      (logits, target, loss, nll, lse, totals, counter, i32(vocab), numpy.int64(ignore_index or 0),
                       i32(ignore_index is not None), f32(smoothing), i32(reduction != "none"),
                       i32(reduction == "mean")))
    elif reduction != "none":  # no row: the sums are 0 and the scale 1, as the kernel's would be
        totals.fill(0)
        totals[2:].fill(1)
    return loss, nll, lse, totals


def cross_entropy_forward(logits, target, smoothing=0.0, ignore_index=None, dtype=None):
    """Per-row (loss, nll, lse) as float32 for logits (..., V) flattened to rows."""
    return _forward(logits, target, smoothing, ignore_index, "none", dtype)[:3]


def cross_entropy_forward_reduced(logits, target, smoothing=0.0, ignore_index=None, reduction="sum", dtype=None):
    """(loss, nll, lse, scale) in one launch: loss and nll summed over the rows ("sum") or averaged
    over the kept rows ("mean") as 0-d float32 device arrays, lse per row, and ``scale`` (0-d float32:
    1, or 1 / max(kept rows, 1) for "mean"), which ``cross_entropy_backward`` takes as its ``scale``."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"cross_entropy_forward_reduced: reduction must be 'sum' or 'mean', got {reduction!r}")
    _, _, lse, totals = _forward(logits, target, smoothing, ignore_index, reduction, dtype)
    loss, nll, scale = (totals[i:i + 1].reshape(()) for i in range(3))  # 0-d views (NumPy's [i] is a copy)
    return loss, nll, lse, scale


def _upstream(grad, rows, xp, label):
    """(the kernel's argument, its stride per row) for an upstream gradient: None (no gradient: a
    null pointer), one value for every row (a single element, or a broadcast view: stride 0) or one
    float32 value per row (stride 1). A copy only when it is neither, or not float32. The argument is
    an array (which the caller holds until the launch), or a broadcast view's address."""
    if grad is None:
        return numpy.uint64(0), numpy.int64(0), None
    if not isinstance(grad, xp.ndarray):  # a NumPy scalar (NumPy's reductions give them) or a number
        grad = xp.asarray(grad, dtype=numpy.float32)
    if grad.dtype != numpy.float32:
        grad = grad.astype(numpy.float32)
    if grad.size == 1 or (grad.size and not any(grad.strides)):
        argument = grad if grad.flags.c_contiguous else numpy.uint64(pointer(grad))
        return argument, numpy.int64(0), grad
    if grad.size != rows:
        raise ValueError(f"cross_entropy_backward: {label} of shape {tuple(grad.shape)} has neither one value "
                         f"nor one per row ({rows} rows)")
    grad = xp.ascontiguousarray(grad).reshape(-1)
    return grad, numpy.int64(1), grad


def cross_entropy_backward(logits, target, lse, grad_loss, grad_nll, smoothing=0.0, ignore_index=None, dtype=None,
                           scale=None):
    """d logits from the upstream gradients of loss and nll, each None, one float for every row or
    one per row; both multiplied by ``scale`` (a float32 device array, element 0: the reduced
    forward's) when given. One launch."""
    (logits,) = contiguous(logits)
    name = element_dtype(logits, dtype)
    xp, vocab = array_module(logits), logits.shape[-1]
    rows = row_count(logits, vocab)
    target = _targets(target, xp)
    (loss_grad, loss_stride, held_loss), (nll_grad, nll_stride, held_nll) = (
        _upstream(g, rows, xp, label) for g, label in ((grad_loss, "grad_loss"), (grad_nll, "grad_nll")))
    scale = numpy.uint64(0) if scale is None else numpy.uint64(pointer(scale))
    grad = xp.empty_like(logits)
    if rows:
        launch.launch("cross_entropy_backward", name, (rows,), (registry.row_threads(vocab),),
                      (logits, target, lse, loss_grad, nll_grad, loss_stride, nll_stride, scale, grad, i32(vocab),
                       numpy.int64(ignore_index or 0), i32(ignore_index is not None), f32(smoothing)))
    del held_loss, held_nll  # alive until the launch has read them
    return grad
