"""Arrays that lie back to back in one buffer: made so (``pack_back_to_back``) and recognised
(``back_to_back``), so that several parameters of one shape (the queries', keys' and values'
projections) can be read by one product as a single matrix, and their gradients written by one."""

import numpy

from .devices import get_array_module

__all__ = ["pack_back_to_back", "back_to_back", "side_by_side", "address", "root_buffer"]


def address(array):
    """The address of ``array``'s first element (device or host memory)."""
    return array.ctypes.data if isinstance(array, numpy.ndarray) else array.data.ptr


def root_buffer(array):
    """The array that owns ``array``'s memory (the end of its chain of ``base``s), or ``array``."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "dtype"):
        array = array.base
    return array


def pack_back_to_back(arrays):
    """Copies of ``arrays`` (one dtype, one device) as C-contiguous views of one new 1-D buffer, in
    order and back to back (each starts where the one before ends)."""
    arrays = list(arrays)
    xp = get_array_module(arrays[0])
    buffer = xp.empty(sum(a.size for a in arrays), dtype=arrays[0].dtype)
    views, start = [], 0
    for a in arrays:
        view = buffer[start:start + a.size].reshape(a.shape)
        view[...] = a
        views.append(view)
        start += a.size
    return views


def back_to_back(arrays):
    """The single C-contiguous array of ``arrays`` stacked along their first axis when they already
    lie back to back in one buffer (a view of it: no copy), else None. 1-D arrays join into one
    1-D array; others must agree in their trailing shape."""
    arrays = list(arrays)
    first = arrays[0]
    if any(a.dtype != first.dtype or a.shape[1:] != first.shape[1:] or not a.flags.c_contiguous or a.ndim == 0
           for a in arrays):
        return None
    root = root_buffer(first)
    if any(root_buffer(a) is not root for a in arrays[1:]) or not root.flags.c_contiguous:
        return None
    expected = address(first)
    for a in arrays:
        if address(a) != expected:
            return None
        expected += a.nbytes
    offset = (address(first) - address(root)) // first.itemsize
    size = sum(a.size for a in arrays)
    flat = root.reshape(-1)
    if flat.dtype != first.dtype or offset < 0 or offset + size > flat.size:
        return None
    joined = flat[offset:offset + size].reshape((sum(a.shape[0] for a in arrays),) + first.shape[1:])
    if type(joined) is not type(first) and isinstance(first, numpy.ndarray):
        joined = joined.view(type(first))  # an array of a subclass stays one (a capture's memory type)
    return joined


def side_by_side(blocks):
    """The single 2-D array (rows, Σ nᵢ) whose column blocks are the 2-D ``blocks`` (rows, nᵢ), in
    order, when they already are that (a view: no copy), else None: the gradients of the parts of
    one product where the op after it wrote them side by side (attention's dQ, dK, dV)."""
    first = blocks[0]
    rows, item = first.shape[0], first.itemsize
    total = sum(b.shape[1] for b in blocks) if all(b.ndim == 2 for b in blocks) else -1
    if total <= 0 or any(b.shape[0] != rows or b.dtype != first.dtype or (b.shape[1] > 1 and b.strides[1] != item)
                         or (rows > 1 and b.strides[0] != total * item) for b in blocks):
        return None
    root, expected = root_buffer(first), address(first)
    for b in blocks:
        if root_buffer(b) is not root or address(b) != expected:
            return None
        expected += b.shape[1] * item
    strided = numpy.lib.stride_tricks.as_strided if isinstance(first, numpy.ndarray) else _cupy_as_strided
    joined = strided(first, shape=(rows, total), strides=(total * item, item), **(
        {"subok": True} if isinstance(first, numpy.ndarray) else {}))
    return joined


def _cupy_as_strided(array, shape, strides):
    from cupy.lib.stride_tricks import as_strided

    return as_strided(array, shape=shape, strides=strides)
