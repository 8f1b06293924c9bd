"""tinyformer: the Transformer of "Attention Is All You Need", from scratch on NumPy/CuPy.

The public surface: ``Tensor`` and its ops, ``no_grad``, the gradient checker,
the fused ops (``functional``), the layers (``nn``), ``optim`` and the array backend.
"""

from . import backend, ops
from . import amp, functional, nn, optim
from .random import manual_seed
from .gradcheck import GradcheckError, GradcheckReport, gradcheck
from .ops import (
    abs,
    broadcast_to,
    clip,
    concat,
    exp,
    log,
    masked_fill,
    matmul,
    max,
    mean,
    min,
    relu,
    reshape,
    sqrt,
    stack,
    sum,
    swapaxes,
    tanh,
    transpose,
    var,
    where,
)
from .tensor import Function, Tensor, backward, enable_grad, grad, is_grad_enabled, no_grad

__version__ = "0.1.0"


def tensor(data, requires_grad=False, dtype=None):
    """Shorthand for ``Tensor(data, requires_grad, dtype)``."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)
