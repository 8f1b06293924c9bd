"""Array backends: NumPy on the CPU, CuPy on the GPU.

This is the only module that imports ``cupy``. Everything else asks it for the
array module of the arrays at hand (``get_array_module``), the way Chainer and
CuPy code does, so the same op code runs on either device.
"""

import concurrent.futures
import contextlib
import os
import re

import numpy

from ..common.validation import check_int

try:  # CuPy is optional: the ``gpu`` extra.
    import cupy as _cupy
except Exception:  # ImportError, or a broken CUDA install raising at import time.
    _cupy = None

DEFAULT_DTYPE = numpy.float32
"""Floating dtype given to data created from Python floats (as in PyTorch)."""

# ``bfloat16``: the one bfloat16 dtype of both backends, ``ml_dtypes.bfloat16`` (a NumPy dtype;
# CuPy 14 takes it too). ``HALF_DTYPES``: the 16-bit floating dtypes of mixed precision
# (``tinyformer.engine.amp``), float16 and bfloat16. Both are made on first use (``__getattr__``):
# importing ml_dtypes takes over a second (it registers a dozen dtypes with NumPy), which a
# float32 program, and every process the command line starts, need not pay.


def __getattr__(name):
    """``backend.bfloat16`` and ``backend.HALF_DTYPES``, made on first use (PEP 562)."""
    if name not in ("bfloat16", "HALF_DTYPES"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import ml_dtypes

    globals()["bfloat16"] = numpy.dtype(ml_dtypes.bfloat16)
    globals()["HALF_DTYPES"] = (numpy.dtype(numpy.float16), globals()["bfloat16"])
    return globals()[name]


def is_bfloat16(dtype):
    """Whether ``dtype`` is ``bfloat16``, without importing ml_dtypes for any other dtype (an array
    of bfloat16 exists only once it is imported)."""
    dtype = numpy.dtype(dtype)
    return dtype.kind == "V" and dtype == __getattr__("bfloat16")

DEVICES = ("cpu", "cuda")

_gpu_available = None


def is_gpu_available():
    """True when CuPy is installed *and* reports a usable CUDA device.

    Based on ``cupy.is_available()``: a successful import alone says nothing
    about a driver or a device being present.
    """
    global _gpu_available
    if _gpu_available is None:
        try:
            _gpu_available = _cupy is not None and bool(_cupy.is_available())
        except Exception:
            _gpu_available = False
    return _gpu_available


def is_cupy_array(array):
    return _cupy is not None and isinstance(array, _cupy.ndarray)


def get_array_module(*arrays):
    """``cupy`` if any argument is a CuPy array, else ``numpy``."""
    if _cupy is not None:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return numpy


def device_of(array):
    """``"cuda"`` for a CuPy array, ``"cpu"`` for anything else."""
    return "cuda" if is_cupy_array(array) else "cpu"


def check_device(device):
    """Validate a device name; ``"cuda:0"`` style suffixes are not supported."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and not is_gpu_available():
        raise RuntimeError(
            "device 'cuda' requested but no GPU is usable: install the 'gpu' extra "
            "(cupy-cuda12x or cupy-cuda13x) on a machine with a CUDA driver"
        )
    return device


def to_device(array, device):
    """Return ``array`` on ``device`` (``"cpu"`` or ``"cuda"``), copying only when it moves (never
    inside a captured step: ``check_not_capturing``)."""
    if device != device_of(array):
        check_not_capturing(f"a copy to {device} (backend.to_device)")
    check_device(device)
    if device == "cpu":
        return _cupy.asnumpy(array) if is_cupy_array(array) else numpy.asarray(array)
    return _cupy.asarray(array)


def to_numpy(array):
    """A NumPy array holding ``array``'s values (a copy when it lives on the GPU); refused while a
    CUDA graph is captured (``capturing``: a read-back there would freeze one step's value)."""
    check_not_capturing("backend.to_numpy reads a value back to the host")
    return _cupy.asnumpy(array) if is_cupy_array(array) else numpy.asarray(array)


def like(array, reference):
    """``array`` on the device of ``reference`` (masks and index arrays follow their tensor)."""
    if hasattr(array, "dtype") and is_cupy_array(reference) != is_cupy_array(array):
        return to_device(array, device_of(reference))
    return array


def scatter_add(target, index, values):
    """``target[index] += values`` with repeated indices accumulated (``np.add.at``)."""
    get_array_module(target).add.at(target, index, values)
    return target


def cuda_runtime_major():
    """Major version of the CUDA runtime CuPy was built for (12, 13), or None without CuPy."""
    if _cupy is None:
        return None
    try:
        return _cupy.cuda.runtime.runtimeGetVersion() // 1000
    except Exception:
        return None


# ------------------------------------------------------------------ threads for large row-wise work
# NumPy runs one ufunc loop on one core but releases the GIL inside it, so a large row-wise
# computation (the vocabulary-wide softmax of the loss) can be split into row blocks that run
# on several cores at once, the way PyTorch's CPU kernels use its intra-op threads. BLAS
# products keep their own threads (see train.blas_threads, which sets both).
_num_threads = None
_pool, _pool_size = None, 0
ROW_BLOCK_MIN_ELEMENTS = 1 << 18  # elements per thread below which splitting costs more than it saves


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


_memory_kept = None


def keep_freed_memory():
    """Let freed memory stay in the process for the next allocation (glibc's ``mallopt``: no
    ``mmap`` for large blocks, no trimming), as a caching allocator does; returns whether it holds.

    A training step frees and allocates the same large arrays every step (logits, activations,
    masks). By default glibc maps each block above its mmap threshold (128 KiB at first, rising to
    at most 32 MiB) anew and unmaps it when freed, so every step pays a page fault for each page it
    touches and the kernel clears them; kept, the next step reuses them. The process's memory is
    then the high-water mark of one step, held until it ends. Once per process; False where the C library is not glibc (macOS, musl).
    """
    global _memory_kept
    if _memory_kept is None:
        _memory_kept = False
        try:
            import ctypes

            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError, TypeError):  # no mallopt in this C library (TypeError: Windows)
            return False
        m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
        _memory_kept = bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2 ** 31 - 1))
    return _memory_kept


def map_row_blocks(fn, rows, like, row_size=1, min_elements=None):
    """``[fn(start, stop), ...]`` over consecutive row blocks covering ``range(rows)``, in parallel
    threads when ``like`` is a NumPy array, several threads are allowed and the work is large
    (each thread gets at least ``min_elements``, default ROW_BLOCK_MIN_ELEMENTS, of
    rows × row_size); otherwise one call ``fn(0, rows)``. Blocks must write disjoint rows."""
    global _pool, _pool_size
    min_elements = ROW_BLOCK_MIN_ELEMENTS if min_elements is None else min_elements
    threads = min(get_num_threads(), (rows * row_size) // max(min_elements, 1), rows)
    if threads <= 1 or is_cupy_array(like):
        return [fn(0, rows)]
    if _pool_size < threads:
        _pool, _pool_size = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="tinyformer"), threads
    bounds = [(rows * i // threads, rows * (i + 1) // threads) for i in range(threads)]
    return list(_pool.map(lambda b: fn(*b), bounds))


def blockwise(ufunc, *operands):
    """``ufunc(*operands)`` for NumPy arrays of one shape (Python scalars allowed), computed in
    element blocks on several threads when large; anything else is the plain ufunc call."""
    arrays = [a for a in operands if hasattr(a, "shape")]
    shape = arrays[0].shape if arrays else ()
    size = arrays[0].size if arrays else 0
    if (size < 2 * ROW_BLOCK_MIN_ELEMENTS or get_num_threads() < 2 or any(is_cupy_array(a) for a in arrays)
            or any(a.shape != shape for a in arrays)):
        return ufunc(*operands)
    flat = [numpy.ascontiguousarray(a).reshape(-1) if hasattr(a, "shape") else a for a in operands]
    dtype = ufunc(*[f[:1] if hasattr(f, "shape") else f for f in flat]).dtype
    out = numpy.empty(size, dtype=dtype)

    def block(start, stop):
        ufunc(*[f[start:stop] if hasattr(f, "shape") else f for f in flat], out=out[start:stop])

    map_row_blocks(block, size, out)
    return out.reshape(shape)


def scatter_add_rows(target, index, rows):
    """``target[index[i]] += rows[i]`` for a 1-D ``index`` and 2-D ``rows``, repeats added up.

    On the CPU the rows are sorted by index and summed per run with ``add.reduceat``:
    faster than ``numpy.add.at``, which handles one element at a time.
    """
    if is_cupy_array(target) or len(index) == 0:
        return scatter_add(target, index, rows)
    order = numpy.argsort(index, kind="stable")
    sorted_index = index[order]
    starts = numpy.flatnonzero(numpy.r_[True, sorted_index[1:] != sorted_index[:-1]])
    target[sorted_index[starts]] += numpy.add.reduceat(rows[order], starts, axis=0)
    return target


def raw_module(code, options, name_expressions):
    """A ``cupy.RawModule`` compiling ``code`` with NVRTC for the given template instantiations."""
    if _cupy is None:
        raise RuntimeError("CUDA kernels need CuPy: install the 'gpu' extra")
    return _cupy.RawModule(code=code, options=tuple(options), name_expressions=list(name_expressions))


def is_floating(dtype):
    """Floating point, bfloat16 included (ml_dtypes' dtype has kind 'V', not 'f')."""
    dtype = numpy.dtype(dtype)
    return dtype.kind == "f" or is_bfloat16(dtype)


def is_half(dtype):
    """float16 or bfloat16."""
    return numpy.dtype(dtype) == numpy.float16 or is_bfloat16(dtype)


def to_bfloat16(x):
    """float32 (or any float) -> ``bfloat16`` by integer arithmetic on the bits, as ml_dtypes casts:
    round to nearest even (the upper 16 bits of ``bits + 0x7FFF + lsb``), overflow to ±inf, and a
    NaN stays a NaN — the quiet NaN ``sign | 0x7FC0`` (rounding its bits would carry a payload such
    as CUDA's 0x7FFFFFFF into the sign or the exponent: −0.0, +0.0 or inf). The same on NumPy and
    on a CuPy that cannot cast to bfloat16 itself."""
    xp = get_array_module(x)
    bits = xp.ascontiguousarray(x, dtype=numpy.float32).view(numpy.uint32)
    upper = bits >> numpy.uint32(16)
    rounded = ((bits + numpy.uint32(0x7FFF) + (upper & numpy.uint32(1))) >> numpy.uint32(16)).astype(numpy.uint16)
    quiet_nan = ((upper & numpy.uint32(0x8000)) | numpy.uint32(0x7FC0)).astype(numpy.uint16)
    is_nan = (bits & numpy.uint32(0x7FFFFFFF)) > numpy.uint32(0x7F800000)
    return xp.where(is_nan, quiet_nan, rounded).view(__getattr__("bfloat16"))


def from_bfloat16(x):
    """A ``bfloat16`` array -> float32 (exact), by a shift of the bits."""
    xp = get_array_module(x)
    return (xp.ascontiguousarray(x).view(numpy.uint16).astype(numpy.uint32) << numpy.uint32(16)).view(numpy.float32)


def cast(array, dtype):
    """``array.astype(dtype)``. To or from bfloat16 on CuPy: the native cast where this CuPy has
    one that rounds and keeps NaN as ml_dtypes does (CuPy 14; tried once), else through the bits
    (CuPy before 14 has no bfloat16 casts: the documented fallback); elsewhere the library's own
    cast."""
    dtype = numpy.dtype(dtype)
    if array.dtype == dtype:
        return array
    if is_cupy_array(array) and (is_bfloat16(dtype) or is_bfloat16(array.dtype)) and not has_native_bfloat16_cast():
        if is_bfloat16(dtype):
            return to_bfloat16(array)
        return from_bfloat16(array).astype(dtype, copy=False)
    return array.astype(dtype)


# float32 bit patterns whose bfloat16 the native cast must get right to be used: a tie to even
# each way, the largest finite value (overflows to inf), ±inf, a subnormal, and NaNs with a
# payload, CUDA's canonical one (0x7FFFFFFF) and a negative one included.
BFLOAT16_CAST_PROBE = (0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x00000001, 0x7FFFFFFF,
                       0xFFFFFFFF, 0x7F800001, 0x7FC00000)
_native_bfloat16_cast = []


def has_native_bfloat16_cast():
    """Whether CuPy's own ``astype`` to and from bfloat16 gives, on BFLOAT16_CAST_PROBE, the bits
    of the bit path (= ml_dtypes'); checked once per process."""
    if not _native_bfloat16_cast:
        try:
            bits = numpy.array(BFLOAT16_CAST_PROBE, dtype=numpy.uint32)
            expected = to_bfloat16(bits.view(numpy.float32)).view(numpy.uint16)
            native = _cupy.asarray(bits).view(numpy.float32).astype(__getattr__("bfloat16"))
            back = native.astype(numpy.float32).view(numpy.uint32).get()
            _native_bfloat16_cast.append(bool((native.view(numpy.uint16).get() == expected).all()
                                              and (back == expected.astype(numpy.uint32) << 16).all()))
        except Exception:
            _native_bfloat16_cast.append(False)
    return _native_bfloat16_cast[0]


_native_half_matmul = {}


def has_half_matmul(array):
    """Whether a matrix product of ``array``'s half dtype runs natively with float32 accumulation:
    on CuPy (cuBLAS) for float16, and for bfloat16 where this CuPy takes it (CuPy 14 added it; a
    tiny product is tried once). NumPy never: its float16 product has no BLAS and accumulates in
    float16, so products there run in float32 and are rounded once."""
    if not is_cupy_array(array):
        return False
    dtype = numpy.dtype(array.dtype)
    if dtype not in _native_half_matmul:
        try:
            probe = _cupy.ones((2, 2), dtype=dtype)
            _native_half_matmul[dtype] = (probe @ probe).dtype == dtype
        except Exception:
            _native_half_matmul[dtype] = False
    return _native_half_matmul[dtype]


# ------------------------------------------------------------------ running out of GPU memory
_ASKED = re.compile(r"allocating ([\d,]+) bytes")


def out_of_memory_errors():
    """The exception types an allocation that does not fit raises (CuPy's), as a tuple for ``except``."""
    if _cupy is None:
        return ()
    return (_cupy.cuda.memory.OutOfMemoryError,)


def out_of_memory_report(error):
    """(bytes asked for or None, bytes free on the device or None) for an out-of-memory ``error``;
    CuPy's message says "Out of memory allocating 1,073,741,824 bytes (allocated so far: ...)"."""
    found = _ASKED.search(str(error))
    asked = int(found.group(1).replace(",", "")) if found else None
    free = None
    if _cupy is not None:
        try:
            free = int(_cupy.cuda.runtime.memGetInfo()[0])
        except Exception:
            free = None
    return asked, free


# ------------------------------------------------------------------ CUDA graphs
_capturing = False
_captured_memory = None  # the memory function of the capture in progress (``capturing(memory=...)``)


@contextlib.contextmanager
def capturing(memory=None):
    """A region whose device work is being captured into a CUDA graph (``GraphCapture.capture``):
    nothing in it may read a value back to the host, so checks that would (the id range checks,
    for instance) are left to the caller, who checked the inputs on the host (``is_capturing``).

    ``memory`` is the one seam through which a capture whose device memory is not CuPy's reaches
    the engine: a function taking a NumPy array made on the host by an op's NumPy reference inside
    the region and returning it as memory of the captured step (``captured_memory``). CuPy's
    capture passes none (the reference's outputs are CuPy arrays already). Such a capture is chosen
    through ``translation.train.graphs.open_capture``; the tests run the graph step without a GPU
    on one whose memory is NumPy arrays (docs/cuda-graphs.md)."""
    global _capturing, _captured_memory
    outer = _capturing, _captured_memory
    _capturing, _captured_memory = True, memory
    try:
        yield
    finally:
        _capturing, _captured_memory = outer


def is_capturing():
    """True inside ``capturing()``."""
    return _capturing


def captured_memory(out):
    """The outputs of an op's NumPy reference (an array, None or a tuple of them) as memory of the
    step being captured: each NumPy array through the ``memory`` function of the enclosing
    ``capturing(memory=...)``; without one (outside a capture, or CuPy's), as they are."""
    memory = _captured_memory
    if memory is None:
        return out
    if type(out) is tuple:
        return tuple(memory(o) if isinstance(o, numpy.ndarray) else o for o in out)
    return memory(out) if isinstance(out, numpy.ndarray) else out


def check_not_capturing(what):
    """Raise ``CaptureUnavailable(what)`` inside ``capturing()``: the host-synchronising calls
    (``to_numpy``, ``Tensor.item``, host-to-device copies) say so, instead of capturing one step's
    value for every replay."""
    if _capturing:
        raise CaptureUnavailable(f"{what} inside a captured step")


class CaptureUnavailable(RuntimeError):
    """CUDA graphs cannot be used here; the message says why (the step then runs eagerly)."""


class GraphCapture:
    """Captures callables into CUDA graphs and replays them, on one stream of its own, every graph's
    allocations drawn from one private memory pool (graphs are never replayed concurrently, so
    they may share it); work outside ``capture`` uses CuPy's default pool.

    Work inside ``on_stream()`` runs on that stream without being captured (the warm-up of a new
    shape: kernels compile and load, persistent buffers come from the default pool). ``begin``
    orders the stream's next work after the current stream's; ``end`` waits for the stream.
    """

    def __init__(self):
        if _cupy is None or not is_gpu_available():
            raise CaptureUnavailable("CUDA graphs need CuPy and a GPU")
        if not hasattr(_cupy.cuda.Stream, "begin_capture"):
            raise CaptureUnavailable(f"this CuPy ({_cupy.__version__}) cannot capture CUDA graphs")
        self.stream = _cupy.cuda.Stream(non_blocking=True)
        self.pool = _cupy.cuda.MemoryPool()

    def begin(self):
        self.stream.wait_event(_cupy.cuda.get_current_stream().record())

    def end(self):
        self.stream.synchronize()

    def on_stream(self):
        return self.stream

    def capture(self, fn):
        """A graph of ``fn``'s device work (``fn`` runs, its kernels do not); raises
        ``CaptureUnavailable`` naming the reason when the capture fails."""
        graph, error = None, None
        with _cupy.cuda.using_allocator(self.pool.malloc), self.stream, capturing():
            self.stream.begin_capture()
            try:
                fn()
            except Exception as caught:  # end the capture in any case, then report
                error = caught
            try:
                graph = self.stream.end_capture()
            except Exception as caught:
                error = error or caught
        if error is not None:
            raise CaptureUnavailable(f"capturing the step failed: {type(error).__name__}: "
                                     f"{str(error).splitlines()[0] if str(error) else ''}") from error
        graph.upload(self.stream)
        return graph

    @staticmethod
    def adopt(array):
        """``array`` as memory of the captured step: as it is (it lives on the device)."""
        return array

    def replay(self, graph):
        graph.launch(self.stream)

    def pool_bytes(self):
        """Bytes the private pool holds for the graphs."""
        return int(self.pool.total_bytes())

    @staticmethod
    def kernel_nodes(graph):
        """The kernel launches in ``graph`` (its DOT description's kernel nodes), or None."""
        try:
            return graph.debug_dot_str().count("KERNEL")
        except Exception:
            return None


def copy_into(target, source):
    """Copy the host array ``source`` into the array ``target`` in place (on the current stream
    for a CuPy ``target``): the static inputs of a captured graph keep their memory. Not inside a
    capture (``check_not_capturing``): the copy would be replayed from a stale host buffer."""
    check_not_capturing("a host-to-device copy (backend.copy_into)")
    if is_cupy_array(target):
        host = numpy.require(numpy.asarray(source, dtype=target.dtype).reshape(target.shape), requirements="C")
        target.set(host, stream=_cupy.cuda.get_current_stream())
    else:
        numpy.copyto(target, source, casting="same_kind")
