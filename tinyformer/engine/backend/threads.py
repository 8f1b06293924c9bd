"""Threads for large row-wise work on the CPU.

NumPy runs one ufunc loop on one core but releases the GIL inside it, so a large row-wise
computation (the vocabulary-wide softmax of the loss) can be split into row blocks that run on
several cores at once, the way PyTorch's CPU kernels use its intra-op threads. BLAS products keep
their own threads (see train.blas_threads, which sets both).
"""

import concurrent.futures
import os

import numpy

from ...common.validation import check_int
from .capture import is_counting_launches
from .devices import is_cupy_array

_num_threads = None
_pool, _pool_size = None, 0
ROW_BLOCK_MIN_ELEMENTS = 1 << 18  # elements per thread below which splitting costs more than it saves
# elements of one cache-sized piece (1 MB of float32): a piece's several passes stay in the cache
CACHE_BLOCK_ELEMENTS = 1 << 18


def get_num_threads():
    """Threads for row-parallel NumPy work: ``set_num_threads``'s value, else the usable cores (at most 4)."""
    if _num_threads is not None:
        return _num_threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores))


def set_num_threads(count):
    """Use ``count`` threads (>= 1) for row-parallel work; None restores the default. Returns the old setting."""
    global _num_threads
    if count is not None:
        count = check_int("set_num_threads: count", count, 1)
    old, _num_threads = _num_threads, count
    return old


def map_row_blocks(fn, rows, like, row_size=1, min_elements=None, cache_sized=False):
    """``[fn(start, stop), ...]`` over consecutive row blocks covering ``range(rows)``, in parallel
    threads when ``like`` is a NumPy array, several threads are allowed and the work is large
    (each thread gets at least ``min_elements``, default ROW_BLOCK_MIN_ELEMENTS, of
    rows × row_size); otherwise one call ``fn(0, rows)``. Blocks must write disjoint rows.

    ``cache_sized=True`` (NumPy arrays only): each thread walks its rows in pieces of about
    CACHE_BLOCK_ELEMENTS elements (at least one row), one call of ``fn`` per piece, in order, so
    that ``fn``'s several passes over a piece read it from the cache instead of memory. For ``fn``
    whose results per row do not depend on which other rows share the call (elementwise or row-wise
    work): the outputs are the same bit for bit."""
    global _pool, _pool_size
    min_elements = ROW_BLOCK_MIN_ELEMENTS if min_elements is None else min_elements
    threads = min(get_num_threads(), (rows * row_size) // max(min_elements, 1), rows)
    if is_cupy_array(like) or is_counting_launches():  # one call, as a device makes it (one launch an op)
        return [fn(0, rows)]
    piece = max(1, CACHE_BLOCK_ELEMENTS // max(row_size, 1)) if cache_sized else max(rows, 1)

    def in_pieces(start, stop):  # fn over [start, stop) a piece at a time (one piece unless cache_sized)
        return [fn(a, min(a + piece, stop)) for a in range(start, stop, piece)] or [fn(start, stop)]

    if threads <= 1:
        return in_pieces(0, rows)
    if _pool_size < threads:
        _pool, _pool_size = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="tinyformer"), threads
    bounds = [(rows * i // threads, rows * (i + 1) // threads) for i in range(threads)]
    return [result for part in _pool.map(lambda b: in_pieces(*b), bounds) for result in part]


def blockwise(ufunc, *operands):
    """``ufunc(*operands)`` for NumPy arrays of one shape (Python scalars allowed), computed in
    element blocks on several threads when large; anything else is the plain ufunc call."""
    arrays = [a for a in operands if hasattr(a, "shape")]
    shape = arrays[0].shape if arrays else ()
    size = arrays[0].size if arrays else 0
    if (size < 2 * ROW_BLOCK_MIN_ELEMENTS or get_num_threads() < 2 or any(is_cupy_array(a) for a in arrays)
            or any(a.shape != shape for a in arrays) or is_counting_launches()):
        return ufunc(*operands)
    flat = [numpy.ascontiguousarray(a).reshape(-1) if hasattr(a, "shape") else a for a in operands]
    dtype = ufunc(*[f[:1] if hasattr(f, "shape") else f for f in flat]).dtype
    out = numpy.empty(size, dtype=dtype)

    def block(start, stop):
        ufunc(*[f[start:stop] if hasattr(f, "shape") else f for f in flat], out=out[start:stop])

    map_row_blocks(block, size, out, cache_sized=True)
    return out.reshape(shape)
