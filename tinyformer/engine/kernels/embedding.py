"""The launchers of embedding.cu: the Transformer's input (the rows of the embedding picked by the
ids, scaled, plus the position table, through dropout) in one launch, and the embedding's weight
gradient, deterministic (no atomics), added into the parameter's gradient where given.

Reference: ``functional.EmbeddingInput`` (``functional.Embedding`` for the gradient alone). The
forward is a grid-stride launch over groups of four elements (``arguments.elementwise_grid``:
dropout.cu's mask layout); the backward one block per vocabulary row, of ``registry.row_threads``
of the positions, each thread summing ``registry.EMBEDDING_COLUMNS_PER_THREAD`` columns per pass.
The kernels and their element types are registered in ``registry.KERNELS``.
"""

import numpy

from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, elementwise_grid, f32, i32, seed_arguments


def _ids(ids):
    """The ids as the kernels read them: contiguous int64 (no copy where they already are)."""
    return array_module(ids).ascontiguousarray(ids.reshape(-1), dtype=numpy.int64)


def embedding_forward(ids, weight, table=None, scale=1.0, p=0.0, seed=0, offset=0, drop_scale=None, dtype=None):
    """out = dropout(weight[ids] · scale + table[position]) in one launch: returns (out, keep), out of
    shape ids.shape + (cols,), position = the index along ids' last axis (``table``: (ids.shape[-1],
    cols), or None for none), keep the bool mask (None at p = 0) drawn as ``dropout.dropout_forward``
    draws it over out's elements, drop_scale = 1/(1 − p) unless given."""
    (weight,) = contiguous(weight)
    name = element_dtype(weight, dtype)
    xp, (vocab, cols) = array_module(weight), weight.shape
    length = ids.shape[-1] if ids.ndim else 1
    if table is not None:
        (table,) = contiguous(table)
        if table.shape != (length, cols) or table.dtype != weight.dtype:
            raise ValueError(f"embedding_forward: table must be ({length}, {cols}) of {weight.dtype} for ids of shape "
                             f"{tuple(ids.shape)}, got {table.dtype} {table.shape}")
    flat = _ids(ids)
    out = xp.empty(tuple(ids.shape) + (cols,), dtype=weight.dtype)
    keep = xp.empty(out.shape, dtype=numpy.bool_) if p else None
    drop_scale = 1.0 / (1.0 - p) if drop_scale is None else drop_scale
    if out.size:
        blocks, threads = elementwise_grid(out.size, 4)  # one thread per 4 elements: one Philox block
        launch.launch("embedding_forward", name, (blocks,), (threads,),
                      (flat, weight, numpy.uint64(0) if table is None else table, out,
                       numpy.uint64(0) if keep is None else keep, numpy.int64(out.size), i32(cols), i32(length),
                       f32(scale), f32(p), f32(drop_scale), *seed_arguments(seed, weight), numpy.uint64(offset)))
    return out, keep


def embedding_backward(ids, grad_out, vocab, dtype=None, keep=None, factor=1.0, grad_weight=None):
    """dW (vocab, cols) of an embedding lookup: the rows of ``grad_out`` (positions, cols), times
    ``keep`` (a dropout mask of its shape, or None) · ``factor``, summed into the rows ``ids``
    (positions,) name, in position order (embedding.cu: deterministic, no atomics); added into
    ``grad_weight`` where given (contiguous, (vocab, cols) of grad_out's type; then returned)."""
    xp = array_module(grad_out)
    grad_out = xp.ascontiguousarray(grad_out)
    name = element_dtype(grad_out, dtype)
    ids = _ids(ids)
    positions, cols = grad_out.shape
    if len(ids) != positions:
        raise ValueError(f"embedding_backward: {len(ids)} ids for {positions} rows of grad_out")
    if keep is not None:
        keep = xp.ascontiguousarray(keep).reshape(grad_out.shape)
    if grad_weight is not None and (grad_weight.shape != (vocab, cols) or grad_weight.dtype != grad_out.dtype
                                    or not grad_weight.flags.c_contiguous):
        raise ValueError(f"embedding_backward: grad_weight must be a contiguous {grad_out.dtype} array of shape "
                         f"({vocab}, {cols}), got {grad_weight.dtype} {grad_weight.shape}")
    out = xp.empty((vocab, cols), dtype=grad_out.dtype) if grad_weight is None else grad_weight
    if vocab and cols:
        launch.launch("embedding_backward", name, (vocab,), (registry.row_threads(positions),),
                      (ids, grad_out, numpy.uint64(0) if keep is None else keep, out, i32(positions), i32(cols),
                       f32(factor), i32(grad_weight is not None)))
    return out
