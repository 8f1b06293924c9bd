"""tinyformer: the Transformer of "Attention Is All You Need", from scratch on NumPy/CuPy.

The public surface: ``Tensor`` and its ops, ``no_grad``, the gradient checker,
the fused ops (``functional``), the layers (``nn``), ``optim`` and the array backend.
"""

# before anything loads NumPy (and with it OpenBLAS): see common/blas_spin.py
from .common import blas_spin  # noqa: F401  (isort: skip)
from .common import filecache, validation
from .engine import amp, backend, functional, kernels, ops, random
from .model import nn, optim
from .engine.random import manual_seed
from .engine.gradcheck import GradcheckError, GradcheckReport, gradcheck
from .engine.ops import (
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
    gelu,
    silu,
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
from .common.version import __version__
from .engine.tensor import Function, Tensor, backward, enable_grad, grad, is_grad_enabled, no_grad



def tensor(data, requires_grad=False, dtype=None):
    """Shorthand for ``Tensor(data, requires_grad, dtype)``."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)
