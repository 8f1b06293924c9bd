"""What every kernel launcher shares: turning arrays, scalars and seeds into launch arguments.

A launcher (``softmax.py`` beside ``softmax.cu``, ``attention.py`` beside ``attention.cu`` and
``attention_mma.cu``, ...) takes CuPy arrays (the GPU path) or NumPy arrays (the same kernel
through the CPU emulation, for tests) and returns arrays of the same kind. It checks the element
type against ``registry.CUDA_TYPES`` (``element_dtype``), makes its operands contiguous, passes
sizes as the kernel's ``int`` (``i32``) and ``float`` (``f32``), and a dropout seed as an int or
a ``DeviceSeed`` (``seed_arguments``). bfloat16 arrays are ``ml_dtypes.bfloat16``
(``backend.bfloat16``) on both backends.
"""

import math

import numpy

from .. import backend
from . import registry


def array_module(*arrays):
    """numpy or cupy, whichever holds ``arrays``."""
    return backend.get_array_module(*arrays)


def element_dtype(array, dtype=None):
    """The dtype name a launch instantiates its kernel for: ``dtype`` (which must name ``array``'s
    own dtype) or ``array``'s; a clear TypeError for a dtype no kernel has."""
    name = dtype or array.dtype.name
    registry.cuda_type(name)
    if array.dtype.name != name:
        raise TypeError(f"array of dtype {array.dtype} passed as {name}")
    return name


def row_count(array, row_size):
    """How many rows of ``row_size`` elements ``array`` holds (0 for an empty row)."""
    return array.size // max(row_size, 1)


def contiguous(*arrays):
    """The arrays C-contiguous (each as it is when it already is; a copy otherwise, counted as a
    launch: ``backend.note_launch``)."""
    for a in arrays:
        if not a.flags.c_contiguous:
            backend.note_launch("copy (to C order)", bytes=2 * a.nbytes)
    return [array_module(a).ascontiguousarray(a) for a in arrays]


def i32(n):
    """A kernel's ``int`` argument."""
    return numpy.int32(n)


def f32(x):
    """A kernel's ``float`` argument."""
    return numpy.float32(x)


def pointer(array):
    """The device (CuPy) or host (NumPy) address of ``array``'s first element."""
    return backend.address(array)


def elementwise_grid(n, per_thread=1):
    """(blocks, threads) of a grid-stride launch over n elements, ``per_thread`` each (dropout's kernels)."""
    items = math.ceil(n / per_thread)
    threads = registry.row_threads(items)
    return min(registry.DROPOUT_MAX_BLOCKS, math.ceil(items / threads)), threads


class DeviceSeed:
    """A Philox seed that a kernel reads from device memory: element ``index`` of the 1-D uint64
    array ``table`` (CuPy on the GPU, NumPy under the emulation). A captured CUDA graph holds the
    element's address, not its value, so refilling the table before a replay gives the replay new
    dropout masks. Accepted wherever a kernel launcher takes ``seed``."""

    def __init__(self, table, index):
        if getattr(table, "ndim", None) != 1 or table.dtype != numpy.uint64:
            raise TypeError(f"DeviceSeed: table must be a 1-D uint64 array, got "
                            f"{getattr(table, 'dtype', type(table).__name__)} of shape {getattr(table, 'shape', None)}")
        if not 0 <= index < table.size:
            raise IndexError(f"DeviceSeed: index {index} outside a table of {table.size} seeds")
        self.table, self.index = table, int(index)

    @property
    def pointer(self):
        """The address of the seed (``unsigned long long*``)."""
        return pointer(self.table) + self.index * self.table.strides[0]

    def __repr__(self):
        return f"DeviceSeed(index={self.index} of {self.table.size} on {backend.device_of(self.table)})"


def seed_arguments(seed, like):
    """The (seed, seed_ptr) launch arguments of an int seed or a ``DeviceSeed`` (value 0 and its
    address: the kernel reads the seed there, ``tf::resolve_seed``) for a launch on ``like``'s device."""
    if isinstance(seed, DeviceSeed):
        if backend.is_cupy_array(seed.table) != backend.is_cupy_array(like):
            raise ValueError(f"{seed!r} must live on the device of the kernel's arrays "
                             f"({backend.device_of(like)})")
        return numpy.uint64(0), numpy.uint64(seed.pointer)
    return numpy.uint64(seed), numpy.uint64(0)
