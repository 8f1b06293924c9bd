"""Matrix products on the GPU through cuBLAS called directly (ctypes), so that they can be
captured into CUDA graphs.

CuPy refuses every cuBLAS call while a stream is capturing ("calling cuBLAS API during stream
capture is currently unsupported": its wrappers reset the handle's stream, and CuPy has not
settled when cuBLAS is safe to capture). cuBLAS itself captures a GEMM when the handle draws no
memory of its own during the capture and the scalars live on the host (their values are
recorded): the cuBLAS manual's section on CUDA graphs. So the product here is one
``cublasGemmStridedBatchedEx`` on a handle of our own, with a workspace allocated once, outside any capture,
and set again after each ``cublasSetStream`` (which resets it). Eager steps take the same path,
so a replayed graph runs the very GEMMs (same algorithm, same bits) the eager step ran.

Row-major products on column-major cuBLAS: C = A·B (m×n, k inner) is, read column-major,
Cᵀ = Bᵀ·Aᵀ. A C-contiguous (r×c) operand read column-major is its transpose with leading
dimension c (no operation needed); an F-contiguous one (a ``.T`` view) is the matrix itself with
leading dimension r (transposed by cuBLAS); batch axes that collapse into one stride (0 where an
operand is broadcast) make one strided-batched call. ``gemm_plan`` makes those choices; anything
else is copied to C order first. Accumulation is in float32 for float32/float16/bfloat16 (no TF32, as
CuPy's and PyTorch's defaults) and float64 for float64.

``out=`` with ``accumulate=True`` adds the product into ``out`` (β = 1): a weight's gradient
accumulated in its gradient buffer by the product itself. Half-precision operands may write a
float32 ``out`` (accumulated in float32 and never rounded to the half type: the gradient of a
float32 parameter from its half compute copy). ``column_sums`` is 1ᵀ·G on the same call: a bias's
gradient.

On NumPy arrays ``matmul`` is NumPy's product, in the caller's array type; half-precision operands
(which NumPy has no fast product for) are multiplied in float32 and the result rounded once, as
cuBLAS's float32 accumulator does. That stand-in's casts are not counted as launches: the device
makes none (``backend.counting_launches`` counts one GEMM).
"""

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy

from .. import backend

__all__ = ["matmul", "column_sums", "gemm_plan", "GemmPlan", "Operand", "available"]

WORKSPACE_BYTES = 32 * 1024 * 1024
"""The handle's workspace (PyTorch's size on Hopper): allocated once, outside every capture."""

_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
_COMPUTE_32F, _COMPUTE_64F = 68, 70
#: cudaDataType_t of each element type
_DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
#: (compute type, C type of alpha and beta) where not (32F, float)
_COMPUTE = {"float64": (_COMPUTE_64F, ctypes.c_double)}


@dataclass(frozen=True)
class Operand:
    """How cuBLAS reads one operand of a batch of row-major products: ``transposed`` (cuBLAS
    applies op T), leading dimension ``ld`` and ``stride`` between the batch's matrices (elements;
    0 for a matrix broadcast over the batch)."""

    transposed: bool
    ld: int
    stride: int


@dataclass(frozen=True)
class GemmPlan:
    """One ``cublasGemmStridedBatchedEx`` for C[i] = A[i]·B[i], i < count, in row major: the
    column-major call computes C[i]ᵀ = op(B[i]ᵀ)·op(A[i]ᵀ) (m×n each, C contiguous)."""

    m: int
    n: int
    k: int
    count: int
    a: Operand
    b: Operand


def _operand(shape, strides):
    """The ``Operand`` of a (batch..., rows, cols) view with ``strides`` in elements, or None when
    cuBLAS cannot read it in place (the caller copies it to C order). C order (unit column stride)
    reads as the transpose with ld = the row stride (no op); F order (unit row stride) as itself
    with ld = the column stride (op T); a single row or column fits either. The batch axes must
    collapse into one stride."""
    *batch, rows, cols = shape
    *batch_strides, row_stride, col_stride = strides
    if min(strides, default=0) < 0:
        return None
    if rows == 0 or cols == 0:  # nothing to read
        return Operand(False, max(1, cols), 0)
    if (col_stride == 1 or cols == 1) and (rows == 1 or row_stride >= max(1, cols)):
        transposed, ld = False, (row_stride if rows > 1 else max(1, cols))
    elif (row_stride == 1 or rows == 1) and (cols == 1 or col_stride >= max(1, rows)):
        transposed, ld = True, (col_stride if cols > 1 else max(1, rows))
    else:
        return None
    axes = [(size, stride) for size, stride in zip(batch, batch_strides) if size > 1]
    for (_, outer), (size, inner) in zip(axes, axes[1:]):
        if outer != inner * size:
            return None
    return Operand(transposed, ld, axes[-1][1] if axes else 0)


def gemm_plan(a_shape, a_strides, b_shape, b_strides):
    """The ``GemmPlan`` of a (..., m, k) · b (..., k, n), both already broadcast to one batch shape,
    strides in elements; None when an operand must be copied first."""
    *batch, m, k = a_shape
    *batch_b, k2, n = b_shape
    if k != k2 or batch != batch_b:
        raise ValueError(f"matmul: shapes do not agree: {tuple(a_shape)} @ {tuple(b_shape)}")
    a, b = _operand(a_shape, a_strides), _operand(b_shape, b_strides)
    if a is None or b is None:
        return None
    return GemmPlan(m, n, k, math.prod(batch), a, b)


class _Library:
    """cuBLAS's entry points, the handle and its workspace (one GPU: the current device's)."""

    def __init__(self):
        self.lib = _load_cublas()
        for name, argtypes in _SIGNATURES.items():
            function = getattr(self.lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = _cupy().empty(WORKSPACE_BYTES, dtype=numpy.uint8)

    def bind(self, stream):
        """Point the handle at ``stream`` (this resets the workspace) and give it ours again."""
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream")
        _check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                              ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace")


_p, _i, _ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
_SIGNATURES = {
    "cublasCreate_v2": [ctypes.POINTER(ctypes.c_void_p)],
    "cublasSetStream_v2": [_p, _p],
    "cublasSetWorkspace_v2": [_p, _p, ctypes.c_size_t],
    "cublasGemmStridedBatchedEx": [_p, _i, _i, _i, _i, _i, _p, _p, _i, _i, _ll, _p, _i, _i, _ll, _p, _p, _i, _i, _ll,
                                   _i, _i, _i],
}


def _cupy():
    import cupy

    return cupy


def _check(status, call):
    if status != 0:
        raise RuntimeError(f"{call} failed with cuBLAS status {status}")


def _load_cublas():
    """The libcublas CuPy loaded (by soname, else by the path this process mapped it from)."""
    from cupy_backends.cuda.libs import cublas  # noqa: F401 - loads libcublas into the process

    major = backend.cuda_runtime_major()
    for name in (f"libcublas.so.{major}", "libcublas.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    with open("/proc/self/maps", encoding="utf-8") as maps:
        paths = sorted({line.split()[-1] for line in maps if "/libcublas.so" in line})
    if not paths:
        raise OSError("libcublas is not loaded in this process")
    return ctypes.CDLL(paths[0])


@functools.lru_cache(maxsize=None)
def _library():
    return _Library()


@functools.lru_cache(maxsize=None)
def available():
    """Whether cuBLAS can be called directly here (else CuPy's product, which graphs cannot capture)."""
    if not backend.is_gpu_available():
        return False
    try:
        _library()
    except (OSError, AttributeError, RuntimeError, ImportError):
        return False
    return True


def _element_strides(array):
    return tuple(s // array.itemsize for s in array.strides)


def _note_launches(a, b, out, accumulate=False):
    """Count (``backend.note_launch``) the launches ``_gemm`` makes for this product, on either
    device, with their bytes and FLOPs: the GEMM (each operand read once, the result written once),
    and the copies of operands cuBLAS cannot read in place and of a result that cannot be written in
    place; CuPy's own product where cuBLAS is not called. Nothing is computed where no count is kept."""
    if not backend.is_counting_launches():
        return
    batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    (m, k), n, count = a.shape[-2:], b.shape[-1], math.prod(batch)
    flops, result_bytes = 2 * m * n * k * count, m * n * count * a.itemsize
    if b.dtype != a.dtype or a.dtype.name not in _DATA_TYPES or any(s % a.itemsize for s in a.strides + b.strides):
        backend.note_launch("cupy_matmul", bytes=a.nbytes + b.nbytes + result_bytes, flops=flops, compute="fp32")
        return
    shapes = [(batch + x.shape[-2:], _broadcast_strides(x, batch)) for x in (a, b)]
    if gemm_plan(*shapes[0], *shapes[1]) is None:
        for x, shape in zip((a, b), shapes):
            if _operand(*shape) is None:
                backend.note_launch("copy (operand to C order)", bytes=2 * math.prod(shape[0]) * x.itemsize)
    compute = {"float32": "fp32", "float64": "fp64"}.get(a.dtype.name, "tensor")
    if out is not None and _written_in_place(a.dtype, out):
        result_bytes = m * n * count * out.itemsize * (2 if accumulate else 1)  # β = 1 reads it too
    backend.note_launch("cublas_gemm", bytes=a.nbytes + b.nbytes + result_bytes, flops=flops, compute=compute)
    if out is not None and not _written_in_place(a.dtype, out):
        backend.note_launch("copy (product into out)", bytes=(3 if accumulate else 2) * result_bytes)


def _written_in_place(dtype, out):
    """Whether the GEMM writes ``out`` itself: C-contiguous, of the operands' type or float32 for
    half-precision operands (cuBLAS's C type may differ from A's and B's there)."""
    return out.flags.c_contiguous and (out.dtype == dtype or (out.dtype == numpy.float32 and backend.is_half(dtype)))


def _broadcast_strides(array, batch):
    """``array``'s strides in elements as ``broadcast_to(array, batch + its matrix shape)`` has them."""
    strides = _element_strides(array)
    *own, rows, cols = strides
    own = [0] * (len(batch) - len(own)) + own
    shape = (1,) * (len(batch) - array.ndim + 2) + array.shape[:-2]
    return tuple(0 if size == 1 and want != 1 else stride for size, want, stride in zip(shape, batch, own)) + (rows, cols)


def _gemm(a, b, out=None, accumulate=False):
    cp = _cupy()
    dtype, name = a.dtype, a.dtype.name
    if b.dtype != dtype or name not in _DATA_TYPES or any(s % a.itemsize for s in a.strides + b.strides):
        return _into(out, cp.matmul(a, b), accumulate) if out is not None else cp.matmul(a, b)
    batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = cp.broadcast_to(a, batch + a.shape[-2:])
    b = cp.broadcast_to(b, batch + b.shape[-2:])
    plan = gemm_plan(a.shape, _element_strides(a), b.shape, _element_strides(b))
    if plan is None:
        a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
        plan = gemm_plan(a.shape, _element_strides(a), b.shape, _element_strides(b))
    shape = batch + (plan.m, plan.n)
    in_place = out is not None and _written_in_place(dtype, out)
    result = out if in_place else cp.empty(shape, dtype)
    if plan.k == 0 or result.size == 0:
        if not (in_place and accumulate):
            result[...] = 0
    else:
        compute, scalar = _COMPUTE.get(name, (_COMPUTE_32F, ctypes.c_float))
        one, zero = scalar(1.0), scalar(1.0 if in_place and accumulate else 0.0)  # β
        library = _library()
        library.bind(cp.cuda.get_current_stream().ptr)
        data_type = _DATA_TYPES[name]
        first, second = plan.b, plan.a  # Cᵀ = Bᵀ·Aᵀ
        _check(library.lib.cublasGemmStridedBatchedEx(
            library.handle, _OP_T if first.transposed else _OP_N, _OP_T if second.transposed else _OP_N,
            plan.n, plan.m, plan.k, ctypes.byref(one),
            ctypes.c_void_p(b.data.ptr), data_type, first.ld, first.stride,
            ctypes.c_void_p(a.data.ptr), data_type, second.ld, second.stride,
            ctypes.byref(zero), ctypes.c_void_p(result.data.ptr), _DATA_TYPES[result.dtype.name], max(1, plan.n),
            plan.m * plan.n, plan.count, compute, _GEMM_DEFAULT), "cublasGemmStridedBatchedEx")
    if out is not None and result is not out:
        return _into(out, result, accumulate)
    return result


def _into(out, result, accumulate):
    """``result`` written (or, accumulating, added) into ``out``."""
    if accumulate:
        out += result
    else:
        out[...] = result
    return out


def matmul(a, b, out=None, accumulate=False):
    """a @ b (NumPy's matmul rules for operands of 2 or more axes, batch axes broadcast), into
    ``out`` when given, added to it with ``accumulate=True``. CuPy arrays: one strided-batched cuBLAS
    GEMM on the current stream, capturable into a CUDA graph (an operand cuBLAS cannot read in place
    is copied first; CuPy's own product where cuBLAS cannot be called directly, or for mixed or
    integer types). NumPy arrays: NumPy's product (half operands in float32, rounded once), in
    ``a``'s array type."""
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: operands of at least 2 axes expected, got shapes {a.shape} and {b.shape}")
    if accumulate and out is None:
        raise ValueError("matmul: accumulate=True needs out=")
    _note_launches(a, b, out, accumulate)
    if backend.is_cupy_array(a) and backend.is_cupy_array(b):
        if available():
            return _gemm(a, b, out, accumulate)
        return _into(out, _cupy().matmul(a, b), accumulate) if out is not None else _cupy().matmul(a, b)
    # On plain arrays: the stand-in's own steps are not the device's launches (the one GEMM is counted above).
    half = a.dtype if backend.is_half(a.dtype) and b.dtype == a.dtype else None
    plain_a, plain_b = numpy.asarray(a), numpy.asarray(b)
    if half is not None:
        plain_a, plain_b = backend.cast(plain_a, numpy.float32), backend.cast(plain_b, numpy.float32)
    if out is not None and not accumulate and half is None and out.dtype == numpy.result_type(a, b):
        numpy.matmul(plain_a, plain_b, out=numpy.asarray(out))  # written in place: no temporary
        return out
    product = numpy.matmul(plain_a, plain_b)
    if out is not None:
        _into(numpy.asarray(out), product, accumulate)
        return out
    if half is not None:
        product = backend.cast(product, half)
    return backend.captured_memory(product if type(a) is numpy.ndarray else product.view(type(a)))


_ONES = {}  # (dtype, device) -> rows of ones, the longest last; none is ever freed (graphs hold their addresses)


def _ones(like, length):
    key = (like.dtype.str, backend.device_of(like))
    kept = _ONES.setdefault(key, [])
    if not kept or kept[-1].shape[1] < length:
        size = 1 << max(0, length - 1).bit_length()
        kept.append(backend.get_array_module(like).ones((1, size), dtype=like.dtype))
    return kept[-1][:, :length]


def column_sums(g, out=None, accumulate=False):
    """Σ over the rows of a 2-D ``g`` (1ᵀ·G): a bias's gradient, into ``out`` (added with
    ``accumulate``) or as a new array. CuPy arrays: one GEMM of a row of ones by ``g``, accumulated in
    float32 (into a float32 ``out`` for half ``g``). NumPy arrays: NumPy's sum (float32 for half
    ``g``), counted as that GEMM."""
    if g.ndim != 2:
        raise ValueError(f"column_sums: a 2-D array expected, got shape {g.shape}")
    if backend.is_cupy_array(g):
        if out is None:
            return matmul(_ones(g, g.shape[0]), g)[0]
        return matmul(_ones(g, g.shape[0]), g, out=out.reshape(1, -1), accumulate=accumulate)[0]
    if backend.is_counting_launches():
        backend.note_launch("cublas_gemm", bytes=g.nbytes + 2 * g.shape[1] * (out if out is not None else g).itemsize,
                            flops=2 * g.size, compute="tensor" if backend.is_half(g.dtype) else "fp32")
    plain = numpy.asarray(g)
    sums = plain.sum(axis=0, dtype=numpy.float32 if backend.is_half(g.dtype) else None)
    if out is not None:
        _into(numpy.asarray(out), sums, accumulate)
        return out
    if backend.is_half(g.dtype):
        sums = backend.cast(sums, g.dtype)
    return backend.captured_memory(sums if type(g) is numpy.ndarray else sums.view(type(g)))
