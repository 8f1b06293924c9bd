"""Philox4x32-10 in NumPy: the same numbers as ``philox.cuh`` on the GPU.

The fused attention kernel draws its dropout mask from (seed, offset, element index) and
regenerates it in the backward pass, and the dropout kernel (``dropout.cu``) draws its mask
the same way; this module reproduces those masks on the CPU so the kernels can be tested
against the NumPy references with dropout on.
"""

import numpy

_M0, _M1 = numpy.uint64(0xD2511F53), numpy.uint64(0xCD9E8D57)
_W0, _W1 = numpy.uint32(0x9E3779B9), numpy.uint32(0xBB67AE85)
_LOW = numpy.uint64(0xFFFFFFFF)


def philox4x32_10(counter, key):
    """Four uint32 words per counter: ``counter`` is 4 arrays of uint32, ``key`` 2 uint32."""
    x, y, z, w = (numpy.asarray(c, dtype=numpy.uint32) for c in counter)
    k0, k1 = numpy.uint32(key[0]), numpy.uint32(key[1])
    with numpy.errstate(over="ignore"):
        for round_ in range(10):
            if round_:
                k0, k1 = k0 + _W0, k1 + _W1
            p0 = _M0 * x.astype(numpy.uint64)
            p1 = _M1 * z.astype(numpy.uint64)
            hi0, lo0 = (p0 >> numpy.uint64(32)).astype(numpy.uint32), (p0 & _LOW).astype(numpy.uint32)
            hi1, lo1 = (p1 >> numpy.uint64(32)).astype(numpy.uint32), (p1 & _LOW).astype(numpy.uint32)
            x, y, z, w = hi1 ^ y ^ k0, lo1, hi0 ^ w ^ k1, lo0
    return x, y, z, w


def philox_uniform(seed, offset, index):
    """Uniform float32 in [0, 1) for each element ``index`` (an integer array) of stream (seed, offset)."""
    index = numpy.asarray(index, dtype=numpy.uint64)
    block = index >> numpy.uint64(2)
    zeros = numpy.zeros_like(block, dtype=numpy.uint32)
    counter = (
        (block & _LOW).astype(numpy.uint32),
        (block >> numpy.uint64(32)).astype(numpy.uint32),
        zeros + numpy.uint32(offset & 0xFFFFFFFF),
        zeros + numpy.uint32(offset >> 32),
    )
    words = numpy.stack(philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32)))
    word = numpy.take_along_axis(words, (index & numpy.uint64(3)).astype(numpy.int64)[None], axis=0)[0]
    return (word >> numpy.uint32(8)).astype(numpy.float32) * numpy.float32(1.0 / 16777216.0)
