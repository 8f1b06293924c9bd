"""A CUDA graph capture emulated on NumPy arrays (``EmulatedCapture``), for testing the graph
step's logic without a GPU, and the emulated device memory it runs on (``DeviceArray``). Test
machinery, used by the tests and by benchmarks/launch_count.py: the layers of tinyformer know
nothing of it (tests/project/test_imports.py).

A real capture runs the step's Python once, executes none of its kernels and records them all
(with the addresses of their dropout seeds); a replay executes the recorded kernels. The
emulation runs the step under ``backend.capturing()`` while recording and restores the device
memory afterwards (nothing executed), keeping the kernel seeds the step was handed; a replay runs
the step again, handing it the same seeds. Where the step takes the kernel path (the emulated CUDA
kernels: tests patch ``kernels.on_gpu``), its dropout kernels read those seeds from the seed slots
at each launch, so a replay's masks are those of the slots the graph's owner fills, as on the GPU;
on the NumPy reference path dropout draws its masks on the host and no seed is recorded.

It reaches tinyformer through one seam (docs/cuda-graphs.md): ``installed(capture)`` makes it the
capture that ``translation.train.graphs.open_capture`` hands the graphed step (which adopts the
step's persistent buffers as ``DeviceArray``s, ``adopt``), and the capture passes ``adopt`` to
``backend.capturing(memory=...)``, so that what the fused ops' NumPy reference computes on the
host inside a capture or a replay lands in emulated device memory, as a CuPy op's output would.
"""

import contextlib
import weakref

import numpy

from tinyformer.engine import backend
from tinyformer.engine import random as tf_random

__all__ = ["EmulatedCapture", "DeviceArray", "installed"]


class DeviceArray(numpy.ndarray):
    """NumPy memory standing in for device memory: like a CuPy array, indexing and reductions give
    0-d arrays, never host scalars, and reading a value to the host (``float``, ``int``, ``bool``,
    ``operator.index``, ``item``, ``tolist``) is refused inside ``backend.capturing()``
    (``CaptureUnavailable``), where on a GPU it would synchronise; so is the ``@`` product, as CuPy
    refuses its cuBLAS calls during a capture (``kernels.cublas.matmul`` is the capturable one), and
    indexing by a boolean mask (CuPy reads the mask's count to the host: "D2H transfers are
    disallowed" while capturing).
    Ufunc results stay
    DeviceArrays; every array owning memory is known (``device_memory``) so that a capture can
    leave it as it found it."""

    def __array_finalize__(self, obj):
        if not isinstance(self.base, DeviceArray):  # memory of its own (or a plain array's, adopted)
            key = id(self)
            _memory[key] = weakref.ref(self, lambda ref: _forget(key, ref))

    def __array_wrap__(self, array, context=None, return_scalar=False):
        return super().__array_wrap__(array, context, False)  # a 0-d array, as CuPy gives

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        """The ufunc on the plain arrays beneath, its results as DeviceArrays (0-d, never scalars);
        inside a capture, counted as the kernel CuPy would launch for it (``backend.note_launch``)."""
        plain = [numpy.asarray(i) if isinstance(i, DeviceArray) else i for i in inputs]
        if out is not None:
            kwargs["out"] = tuple(numpy.asarray(o) if isinstance(o, DeviceArray) else o for o in out)
        results = getattr(ufunc, method)(*plain, **kwargs)
        if backend.is_capturing():  # each operand read once, each result written once
            written = out if out is not None else results if isinstance(results, tuple) else (results,)
            arrays = [a for a in (*plain, *written) if isinstance(a, numpy.ndarray)]
            backend.note_launch(f"array op: {ufunc.__name__}" + ("" if method == "__call__" else f".{method}"),
                                bytes=sum(a.nbytes for a in arrays), flops=max((a.size for a in arrays), default=0))
        if out is not None:
            return out[0] if len(out) == 1 else out
        if method == "at":
            return None
        if isinstance(results, tuple):
            return tuple(numpy.asarray(r).view(DeviceArray) for r in results)
        return numpy.asarray(results).view(DeviceArray)

    def __getitem__(self, key):
        _refuse_boolean_index(key)
        item = super().__getitem__(key)
        return item if isinstance(item, numpy.ndarray) else numpy.asarray(item).view(DeviceArray)

    def __setitem__(self, key, value):
        _refuse_boolean_index(key)
        super().__setitem__(key, value)
        _count("array op: setitem", 2 * numpy.asarray(self)[key].nbytes)

    def fill(self, value):
        _count("array op: fill", self.nbytes)  # CuPy: a memset node for zeros of contiguous memory, else a kernel
        super().fill(value)

    def astype(self, dtype, *args, **kwargs):
        result = super().astype(dtype, *args, **kwargs)
        if result is not self:
            _count("array op: astype", self.nbytes + result.nbytes)
        return result

    def copy(self, *args, **kwargs):
        _count("array op: copy", 2 * self.nbytes)
        return super().copy(*args, **kwargs)

    def reshape(self, *args, **kwargs):
        """A reshape that cannot be a view copies (CuPy launches a copy kernel for it)."""
        result = super().reshape(*args, **kwargs)
        if self.size and not numpy.may_share_memory(result, self):
            _count("array op: copy", 2 * self.nbytes)
        return result

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __matmul__(self, other):
        _refuse_cupy_product()
        return super().__matmul__(other)

    def __rmatmul__(self, other):
        _refuse_cupy_product()
        return super().__rmatmul__(other)

    def _read(self, what):
        backend.check_not_capturing(f"{what} reads a device array's value to the host")
        return numpy.asarray(self)

    def __float__(self):
        return float(self._read("float()"))

    def __int__(self):
        return int(self._read("int()"))

    def __index__(self):
        return self._read("operator.index()").__index__()

    def __bool__(self):
        return bool(self._read("bool()"))

    def __complex__(self):
        return complex(self._read("complex()"))

    def item(self, *args):
        return self._read("item()").item(*args)

    def tolist(self):
        return self._read("tolist()").tolist()


def _count(family, moved):
    """Count a launch of ``family`` that moves ``moved`` bytes, where the step is being captured
    (``backend.note_launch``)."""
    if backend.is_capturing():
        backend.note_launch(family, bytes=moved)


def _refuse_boolean_index(key):
    """CuPy indexes by a boolean mask through the count of its true entries, read to the host."""
    keys = key if isinstance(key, tuple) else (key,)
    if backend.is_capturing() and any(str(getattr(k, "dtype", "")) == "bool" for k in keys):
        backend.check_not_capturing("indexing by a boolean mask reads its count to the host")


def _refuse_cupy_product():
    if backend.is_capturing():  # CuPy's words (cupy_backends/cuda/libs/cublas.pyx, setStream)
        raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")


_memory = {}  # id -> weak reference of every live DeviceArray that owns its memory


def _forget(key, ref):
    if _memory.get(key) is ref:
        del _memory[key]


def device_memory():
    """The live DeviceArrays that own their memory (views of them are covered by these)."""
    return [a for a in (ref() for ref in list(_memory.values())) if a is not None]


@contextlib.contextmanager
def _executing_nothing():
    """Device memory as it was when the block began, after it (a capture executes no kernel)."""
    saved = [(a, numpy.array(a, copy=True)) for a in device_memory()]
    try:
        yield
    finally:
        for array, values in saved:
            numpy.copyto(numpy.asarray(array), values)


class _Graph:
    """What the emulated capture recorded: the step, the kernel seeds handed to it in order
    (``DeviceSeed`` slots, or values frozen as a real graph freezes them), and its launches by
    family (``backend.counting_launches``: the kernels, cuBLAS products and array operations)."""

    def __init__(self, fn, seeds, launches):
        self.fn, self.seeds, self.launches = fn, seeds, launches


class EmulatedCapture:
    """``backend.GraphCapture``'s interface on NumPy arrays (``DeviceArray``s, via ``adopt``). It
    checks what a capture checks that can be checked on the CPU: the step runs under
    ``backend.capturing()`` when captured and at every replay (a host read refuses the capture, or
    fails the replay), replays take the seeds the capture recorded, and a replay that asks for
    other seeds than the capture recorded is not the captured step (``RuntimeError``)."""

    def begin(self):
        pass

    end = begin

    @staticmethod
    def adopt(array):
        """``array`` as emulated device memory (the same memory, a DeviceArray view)."""
        return array if isinstance(array, DeviceArray) else numpy.asarray(array).view(DeviceArray)

    def on_stream(self):
        return contextlib.nullcontext()

    def capture(self, fn):
        outer, seeds = tf_random.kernel_seed_recorder(), []

        def record(generator):
            with tf_random.recording_kernel_seeds(outer):
                seeds.append(tf_random.kernel_seed(generator))
            return seeds[-1]

        try:
            with _executing_nothing(), backend.capturing(memory=self.adopt), \
                    tf_random.recording_kernel_seeds(record), backend.counting_launches() as launches:
                fn()
        except backend.CaptureUnavailable:
            raise
        except Exception as error:  # as GraphCapture.capture reports a failed capture
            raise backend.CaptureUnavailable(f"capturing the step failed: {type(error).__name__}: {error}") from error
        return _Graph(fn, seeds, launches)

    def replay(self, graph):
        handed = iter(graph.seeds)

        def next_seed(generator):
            seed = next(handed, None)
            if seed is None:
                raise RuntimeError("the replayed step asks for more kernel seeds than its capture recorded")
            return seed

        with backend.capturing(memory=self.adopt), tf_random.recording_kernel_seeds(next_seed):
            graph.fn()
        if next(handed, None) is not None:
            raise RuntimeError("the replayed step asks for fewer kernel seeds than its capture recorded")

    def pool_bytes(self):
        return 0

    @staticmethod
    def kernel_nodes(graph):
        """Every launch the capture counted (kernels, products, array operations): the nodes a GPU's
        graph of the step would hold, fills and copies included (CuPy makes some of those memset
        and memcpy nodes rather than kernels)."""
        return sum(graph.launches.values())


@contextlib.contextmanager
def installed(capture):
    """``capture`` as the capture of every graphed step a ``Trainer`` sets up inside the block
    (``graphs.open_capture``, the seam, replaced: no check of the device, the processes or the
    kernels, as the CPU tests run none of them on a GPU)."""
    from tinyformer.translation.train import graphs

    original, graphs.open_capture = graphs.open_capture, lambda config, comm_size, like: capture
    try:
        yield capture
    finally:
        graphs.open_capture = original
