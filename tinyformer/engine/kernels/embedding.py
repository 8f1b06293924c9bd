"""The launcher of embedding.cu: the embedding's weight gradient, deterministic (no atomics).

Reference: ``functional.Embedding`` (a scatter add). One block per vocabulary row, of
``registry.row_threads`` of the positions, each thread summing
``registry.EMBEDDING_COLUMNS_PER_THREAD`` columns per pass; the kernel and its element types are
registered in ``registry.KERNELS``.
"""

import numpy

from . import launch, registry
from .arguments import array_module, element_dtype, i32


def embedding_backward(ids, grad_out, vocab, dtype=None):
    """dW (vocab, cols) of an embedding lookup: the rows of ``grad_out`` (positions, cols) summed into
    the rows ``ids`` (positions,) name, in position order (embedding.cu: deterministic, no atomics)."""
    xp = array_module(grad_out)
    grad_out = xp.ascontiguousarray(grad_out)
    name = element_dtype(grad_out, dtype)
    ids = xp.ascontiguousarray(ids.reshape(-1), dtype=numpy.int32)
    positions, cols = grad_out.shape
    if len(ids) != positions:
        raise ValueError(f"embedding_backward: {len(ids)} ids for {positions} rows of grad_out")
    grad_weight = xp.empty((vocab, cols), dtype=grad_out.dtype)
    if vocab and cols:
        launch.launch("embedding_backward", name, (vocab,), (registry.row_threads(positions),),
                      (ids, grad_out, grad_weight, i32(positions), i32(cols)))
    return grad_weight
