"""The launchers of softmax.cu: softmax and log-softmax over the last axis, one block per row.

Reference: ``functional.Softmax`` / ``functional.LogSoftmax``. The kernels, their template
parameters and element types are registered in ``registry.KERNELS``; the block size is
``registry.row_threads`` of the row.
"""

from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, i32, row_count


def softmax_forward(x, log=False, dtype=None):
    """y = softmax(x) (log_softmax when ``log``) over the last axis."""
    (x,) = contiguous(x)
    name = element_dtype(x, dtype)
    cols = x.shape[-1]
    rows = row_count(x, cols)
    y = array_module(x).empty_like(x)
    if rows and cols:
        launch.launch("softmax_forward", name, (rows,), (registry.row_threads(cols),), (x, y, i32(cols), i32(log)))
    return y


def softmax_backward(y, grad_y, log=False, dtype=None):
    """dx from the forward's y: y ∘ (dy − Σ dy ∘ y), or dy − exp(y) · Σ dy for log-softmax."""
    y, grad_y = contiguous(y, grad_y)
    name = element_dtype(y, dtype)
    cols = y.shape[-1]
    rows = row_count(y, cols)
    grad_x = array_module(y).empty_like(y)
    if rows and cols:
        launch.launch("softmax_backward", name, (rows,), (registry.row_threads(cols),),
                      (y, grad_y, grad_x, i32(cols), i32(log)))
    return grad_x
