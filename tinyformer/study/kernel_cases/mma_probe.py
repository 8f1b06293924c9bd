"""The case of mma_probe.cu: the tensor-core instructions of kernels/mma.cuh against the PTX ISA."""

import numpy

from ...engine import backend
from ...engine.kernels import launch, registry  # the probes have no launcher of their own
from .harness import KernelRun, compared, rand


def _bits(dev, rng, *shape):
    """Random 16-bit patterns as an array of the element type (float16 or bfloat16) on the device:
    ldmatrix moves bits, whatever they mean."""
    bits = rng.integers(0, 1 << 16, shape, dtype=numpy.uint16)
    return backend.to_device(bits.view(backend.bfloat16 if dev.dtype == "bfloat16" else numpy.float16), dev.device)


def _storage_bits(array):
    return backend.to_numpy(array).view(numpy.uint16)


def ldmatrix_layout(matrices, count, trans):
    """The registers (32 lanes × 4, unused 0) that ldmatrix.x{count}[.trans] gives for 8×8 16-bit
    ``matrices`` stacked as (8·count, 8) rows, by the PTX ISA's layout: register i of lane l holds
    row l/4, elements 2(l%4) and 2(l%4)+1 of matrix i (transposed: column l/4, rows 2(l%4), 2(l%4)+1)."""
    regs = numpy.zeros((32, 4), dtype=numpy.uint64)
    m = matrices.astype(numpy.uint64)
    for lane in range(32):
        for i in range(count):
            if trans:
                lo, hi = m[8 * i + 2 * (lane % 4), lane // 4], m[8 * i + 2 * (lane % 4) + 1, lane // 4]
            else:
                lo, hi = m[8 * i + lane // 4, 2 * (lane % 4)], m[8 * i + lane // 4, 2 * (lane % 4) + 1]
            regs[lane, i] = lo | (hi << numpy.uint64(16))
    return regs


def mma_instructions(dev, seed=0):
    """mma_probe.cu (the helpers of kernels/mma.cuh) against the PTX ISA's fragment layouts, for a
    float16 or bfloat16 ``dev``: the six ldmatrix variants bit for bit; mma.m16n8k16 with fragments
    packed by the documented layout and with fragments from ldmatrix, against a·b + c in float64
    (products exact, float32 sums: rtol 1e-5); cp.async's two groups and zero fill; and the
    round-to-nearest-even conversions float -> T -> float bit for bit against NumPy's."""
    if dev.dtype not in registry.SOURCE_DTYPES["mma_probe.cu"]:
        raise ValueError(f"the tensor-core probes take float16 or bfloat16, got {dev.dtype}")
    rng = numpy.random.default_rng(seed)

    def on_device(array):
        return backend.to_device(numpy.ascontiguousarray(array), dev.device)

    kind = dev.dtype
    comparisons = []

    matrices = _bits(dev, rng, 32, 8)
    registers = on_device(numpy.zeros(6 * 32 * 4, dtype=numpy.uint32))
    launch.launch("ldmatrix_probe", kind, (1,), (32,), (matrices, registers))
    got = backend.to_numpy(registers).reshape(6, 32, 4)
    for variant, (count, trans) in enumerate([(1, False), (2, False), (4, False), (1, True), (2, True), (4, True)]):
        expected = ldmatrix_layout(_storage_bits(matrices), count, trans)
        comparisons.append(compared(f"ldmatrix.x{count}{'.trans' if trans else ''}", got[variant], expected, 0.0, 0.0))

    a, b = dev.round(rand(rng, 16, 16)), dev.round(rand(rng, 16, 8))
    c = rand(rng, 16, 8)
    expected = a.astype(numpy.float64) @ b.astype(numpy.float64) + c
    for via in (0, 1):
        d = on_device(numpy.zeros((16, 8), dtype=numpy.float32))
        launch.launch("mma_probe", kind, (1,), (32,), (dev.put(a), dev.put(b), on_device(c), d, numpy.int32(via)))
        comparisons.append(compared(f"mma.m16n8k16 {'via ldmatrix' if via else 'by layout'}", d, expected, 1e-5, 1e-5))

    chunk = 8  # 16-bit elements per 16-byte chunk
    source = _bits(dev, rng, 64 * chunk)
    out = on_device(numpy.zeros_like(backend.to_numpy(source)))
    valid = 29
    launch.launch("cp_async_probe", kind, (1,), (32,), (source, out, numpy.int32(valid), numpy.int32(0)))
    expected_bits = _storage_bits(source).reshape(2, 32, chunk).copy()
    expected_bits[:, valid:] = 0
    comparisons.append(compared("cp.async groups", _storage_bits(out), expected_bits.reshape(-1), 0.0, 0.0))

    tiny, big = (6e-8, 65504.0) if dev.dtype == "float16" else (9.2e-41, 3.3e38)
    x = numpy.concatenate([rand(rng, 200, scale=3.0), numpy.array(
        [0.0, -0.0, tiny, -tiny, tiny * 1.5, big, big * 1.0001, -big * 1.001, numpy.inf, -numpy.inf, 1 + 2 ** -11,
         1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 2 ** -15, 2 ** -24 * 2.5], numpy.float32)])
    y = on_device(numpy.zeros(x.size, dtype=backend.bfloat16 if dev.dtype == "bfloat16" else numpy.float16))
    back = on_device(numpy.zeros(x.size, dtype=numpy.float32))
    launch.launch("convert_probe", kind, (1,), (32,), (on_device(x), y, back, numpy.int32(x.size)))
    with numpy.errstate(over="ignore"):  # the values beyond T's range round to inf on purpose
        rounded = (backend.to_bfloat16(x) if dev.dtype == "bfloat16" else x.astype(numpy.float16)).view(numpy.uint16)
        widened = dev.round(x)
    comparisons.append(compared("float -> T (nearest even)", _storage_bits(y), rounded, 0.0, 0.0))
    comparisons.append(compared("T -> float (bits)", backend.to_numpy(back).view(numpy.uint32),
                                widened.view(numpy.uint32), 0.0, 0.0))
    return KernelRun(f"{dev.dtype} probes", comparisons, {})
