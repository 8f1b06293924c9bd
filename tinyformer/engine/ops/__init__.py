"""Elementary differentiable ops, by family. Importing this package installs the
operators and methods (``+``, ``@``, ``.sum()``, ``[...]`` ...) onto ``Tensor``."""

from .arithmetic import abs, add, clip, div, exp, log, mul, neg, power, relu, gelu, silu, sqrt, sub, tanh
from .linalg import matmul
from .reduction import max, mean, min, sum, var
from .shape import (broadcast_to, concat, getitem, masked_fill, pack_rows, reshape, stack, swapaxes, transpose,
                    unpack_rows, where)
from ._helpers import sum_to_shape
