"""The 16-bit floating dtypes of mixed precision, float16 and bfloat16: which dtypes they are,
and casts to and from bfloat16 that agree on NumPy and on every CuPy.

``bfloat16``: the one bfloat16 dtype of both backends, ``ml_dtypes.bfloat16`` (a NumPy dtype;
CuPy 14 takes it too). ``HALF_DTYPES``: the 16-bit floating dtypes of mixed precision
(``tinyformer.engine.amp``), float16 and bfloat16. Both are made on first use (``__getattr__``):
importing ml_dtypes takes over a second (it registers a dozen dtypes with NumPy), which a
float32 program, and every process the command line starts, need not pay.
"""

import numpy

from . import devices
from .devices import get_array_module, is_cupy_array


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
            native = devices.cupy.asarray(bits).view(numpy.float32).astype(__getattr__("bfloat16"))
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
            probe = devices.cupy.ones((2, 2), dtype=dtype)
            _native_half_matmul[dtype] = (probe @ probe).dtype == dtype
        except Exception:
            _native_half_matmul[dtype] = False
    return _native_half_matmul[dtype]
