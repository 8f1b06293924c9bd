"""tests/kernels/mma_probe.cu, the one-warp probes of the instructions in kernels/mma.cuh, built and
launched by the tests themselves: test machinery, not a shipped kernel (kernels/registry.py does
not list it). On NumPy arrays through the CPU emulation (a library of its own, from
``emulation.build`` with this source and its instantiations, cached as the kernels' library is);
on CuPy arrays through NVRTC (a ``cupy.RawModule`` with kernels/ on the include path and the
registry's geometry, as ``kernels/launch.py`` compiles the kernels).

The cases, each for a float16 or bfloat16 ``Device`` (CPU: the emulation; CUDA: the hardware):
``instructions`` runs every probe through the helpers of mma.cuh; ``mma_by_the_isa``,
``mma_one_hot`` and ``ldmatrix_by_the_isa`` hold the instructions against the PTX ISA's own
formulas (tests/ptx_layouts.py), packed and unpacked in Python, so that a layout the emulation
and the probe misread alike still fails.
"""

import functools
import hashlib
import json
from pathlib import Path

import numpy

import ptx_layouts
from tinyformer.engine import backend
from tinyformer.engine.kernels import registry, toolchain
from tinyformer.testing import compile_check, emulation
from tinyformer.testing.kernel_cases import KernelRun, compared, rand

SOURCE = Path(__file__).resolve().parent / "kernels" / "mma_probe.cu"
KERNELS = ("ldmatrix_probe", "mma_probe", "mma_fragment_probe", "cp_async_probe", "cp_async_drain_probe",
           "convert_probe")
DTYPES = registry.MMA_DTYPES
DRAIN_MODES = {"wait_all": 0, "uncommitted": 1, "committed": 2}
"""cp_async_drain_probe's modes: drained with cp.async.wait_all, or returning with the copy in flight."""


def expression(kernel, dtype):
    """``"kernel<__half>"`` or ``"kernel<__nv_bfloat16>"``."""
    if kernel not in KERNELS:
        raise KeyError(f"{kernel!r} is not a probe of {SOURCE.name}: {', '.join(KERNELS)}")
    if dtype not in DTYPES:
        raise TypeError(f"the probes take {' or '.join(DTYPES)}, got {dtype}")
    return f"{kernel}<{registry.cuda_type(dtype)}>"


def expressions():
    return [expression(kernel, dtype) for kernel in KERNELS for dtype in DTYPES]


def build(sanitize=None):
    """The emulation's library of the probes (built once per source hash and sanitizer setting)."""
    return emulation.build(sanitize, sources=[SOURCE], expressions=expressions())


@functools.lru_cache(maxsize=None)
def _emulated(name_expression, geometry, sanitize):
    return emulation.EmulatedFunction(name_expression, build(sanitize))


def _nvrtc_options():
    headers = toolchain.cuda_include_dirs(backend.cuda_runtime_major())
    return ["-std=c++17", f"-I{registry.KERNEL_DIR}", *(f"-I{d}" for d in headers), *registry.compile_options()]


@functools.lru_cache(maxsize=None)
def _module(geometry):
    return backend.raw_module(SOURCE.read_text(encoding="utf-8"), _nvrtc_options(), expressions())


def launch(kernel, dtype, grid, block, args):
    """``kernel<dtype><<<grid, block>>>(*args)``: on the GPU for CuPy arrays, else emulated."""
    name_expression = expression(kernel, dtype)
    if any(backend.is_cupy_array(a) for a in args):
        function = _module(registry.geometry()).get_function(name_expression)
    else:
        function = _emulated(name_expression, registry.geometry(), emulation.sanitize_requested())
    function(tuple(grid), tuple(block), tuple(args))


def nvrtc_reports(nvrtc, arch):
    """{expression: (registers, spill stores, spill loads, static shared bytes)} of the probes
    compiled by NVRTC for ``arch`` (ptxas -v), kept in the build cache per hash of the probe,
    kernels/ and the options."""
    options = [f"-arch={arch}", "-Xptxas", "-v", *_nvrtc_options()]
    digest = hashlib.sha256(repr((nvrtc.path, nvrtc.version, options, expressions())).encode())
    for path in [SOURCE, *registry.kernel_files()]:
        digest.update(path.read_bytes())

    def compile_into(partial):
        log, lowered = nvrtc.compile(SOURCE.read_text(encoding="utf-8"), SOURCE.name, expressions(), options)
        partial.write_text(json.dumps({"log": log, "lowered": lowered}), encoding="utf-8")

    stored = json.loads(toolchain.cached_product(f"nvrtc-probe-{digest.hexdigest()[:24]}.json", compile_into)
                        .read_text(encoding="utf-8"))
    stats = compile_check.parse_ptxas(stored["log"])
    return {e: stats.get(stored["lowered"][e], (0, 0, 0, 0)) for e in expressions()}


# ------------------------------------------------------------------------ the probes through mma.cuh
def _bits(dev, rng, *shape):
    """Random 16-bit patterns as an array of the element type on the device: ldmatrix moves bits."""
    bits = rng.integers(0, 1 << 16, shape, dtype=numpy.uint16)
    return backend.to_device(bits.view(backend.bfloat16 if dev.dtype == "bfloat16" else numpy.float16), dev.device)


def _storage_bits(array):
    return backend.to_numpy(array).view(numpy.uint16)


def _on_device(dev, array):
    return backend.to_device(numpy.ascontiguousarray(array), dev.device)


LDMATRIX_VARIANTS = [(1, False), (2, False), (4, False), (1, True), (2, True), (4, True)]
"""ldmatrix_probe's variants, in its order: (matrices, .trans)."""


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


def _ldmatrix(dev, memory, rows):
    """ldmatrix_probe's registers, (variants, 32, 4), lane t passing row rows[t] of ``memory`` (64 rows)."""
    registers = _on_device(dev, numpy.zeros(len(LDMATRIX_VARIANTS) * 32 * 4, dtype=numpy.uint32))
    launch("ldmatrix_probe", dev.dtype, (1,), (32,), (memory, _on_device(dev, numpy.asarray(rows, numpy.int32)),
                                                     registers))
    return backend.to_numpy(registers).reshape(len(LDMATRIX_VARIANTS), 32, 4)


def instructions(dev, seed=0):
    """The probes (the helpers of kernels/mma.cuh) against the PTX ISA's fragment layouts: the six
    ldmatrix variants bit for bit (lane l passing row l); mma.m16n8k16 with fragments packed by the
    documented layout and with fragments from ldmatrix, against a·b + c in float64 (products
    exact, float32 sums: rtol 1e-5); cp.async's two groups and zero fill; cp.async.wait_all; and
    the round-to-nearest-even conversions float -> T -> float bit for bit against NumPy's."""
    rng = numpy.random.default_rng(seed)
    kind = dev.dtype
    comparisons = []

    memory = _bits(dev, rng, 64, 8)
    got = _ldmatrix(dev, memory, numpy.arange(32))
    for variant, (count, trans) in enumerate(LDMATRIX_VARIANTS):
        expected = ldmatrix_layout(_storage_bits(memory)[:32], count, trans)
        comparisons.append(compared(f"ldmatrix.x{count}{'.trans' if trans else ''}", got[variant], expected, 0.0, 0.0))

    a, b = dev.round(rand(rng, 16, 16)), dev.round(rand(rng, 16, 8))
    c = rand(rng, 16, 8)
    expected = a.astype(numpy.float64) @ b.astype(numpy.float64) + c
    for via in (0, 1):
        d = _on_device(dev, numpy.zeros((16, 8), dtype=numpy.float32))
        launch("mma_probe", kind, (1,), (32,), (dev.put(a), dev.put(b), _on_device(dev, c), d, numpy.int32(via)))
        comparisons.append(compared(f"mma.m16n8k16 {'via ldmatrix' if via else 'by layout'}", d, expected, 1e-5, 1e-5))

    chunk = 8  # 16-bit elements per 16-byte chunk
    source = _bits(dev, rng, 64 * chunk)
    out = _on_device(dev, numpy.zeros_like(backend.to_numpy(source)))
    valid = 29
    launch("cp_async_probe", kind, (1,), (32,), (source, out, numpy.int32(valid), numpy.int32(0)))
    expected_bits = _storage_bits(source).reshape(2, 32, chunk).copy()
    expected_bits[:, valid:] = 0
    comparisons.append(compared("cp.async groups", _storage_bits(out), expected_bits.reshape(-1), 0.0, 0.0))

    out = _on_device(dev, numpy.zeros_like(backend.to_numpy(source))[:32 * chunk])
    launch("cp_async_drain_probe", kind, (1,), (32,), (source, out, numpy.int32(DRAIN_MODES["wait_all"])))
    comparisons.append(compared("cp.async.wait_all (uncommitted copies)", _storage_bits(out),
                                _storage_bits(source)[:32 * chunk], 0.0, 0.0))

    tiny, big = (6e-8, 65504.0) if dev.dtype == "float16" else (9.2e-41, 3.3e38)
    x = numpy.concatenate([rand(rng, 200, scale=3.0), numpy.array(
        [0.0, -0.0, tiny, -tiny, tiny * 1.5, big, big * 1.0001, -big * 1.001, numpy.inf, -numpy.inf, 1 + 2 ** -11,
         1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 2 ** -15, 2 ** -24 * 2.5], numpy.float32)])
    y = _on_device(dev, numpy.zeros(x.size, dtype=backend.bfloat16 if dev.dtype == "bfloat16" else numpy.float16))
    back = _on_device(dev, numpy.zeros(x.size, dtype=numpy.float32))
    launch("convert_probe", kind, (1,), (32,), (_on_device(dev, x), y, back, numpy.int32(x.size)))
    with numpy.errstate(over="ignore"):  # the values beyond T's range round to inf on purpose
        rounded = (backend.to_bfloat16(x) if dev.dtype == "bfloat16" else x.astype(numpy.float16)).view(numpy.uint16)
        widened = dev.round(x)
    comparisons.append(compared("float -> T (nearest even)", _storage_bits(y), rounded, 0.0, 0.0))
    comparisons.append(compared("T -> float (bits)", backend.to_numpy(back).view(numpy.uint32),
                                widened.view(numpy.uint32), 0.0, 0.0))
    return KernelRun(f"{dev.dtype} probes", comparisons, {})


# ------------------------------------------------------------------------ against the ISA's formulas
def _element_bits(dev, values):
    """The 16-bit patterns of float32 ``values`` (already representable) in the element type."""
    values = numpy.asarray(values, dtype=numpy.float32)
    if dev.dtype == "bfloat16":
        return backend.to_bfloat16(values).view(numpy.uint16)
    return values.astype(numpy.float16).view(numpy.uint16)


def _mma_on_registers(dev, a_registers, b_registers, c_registers):
    """mma_fragment_probe on a batch of register sets, (cases, 32, 4|2|4); D's registers back."""
    cases = a_registers.shape[0]
    d = _on_device(dev, numpy.zeros((cases, 32, 4), dtype=numpy.float32))
    launch("mma_fragment_probe", dev.dtype, (cases,), (32,),
           (_on_device(dev, a_registers), _on_device(dev, b_registers), _on_device(dev, c_registers), d))
    return backend.to_numpy(d)


def mma_by_the_isa(dev, cases=8, seed=0):
    """mma.m16n8k16 on A, B and C packed into registers by the PTX ISA's formulas (in Python), D
    unpacked by them, against the plain product a·b + c in float64 (rtol 1e-5, as above)."""
    rng = numpy.random.default_rng(seed)
    a, b = dev.round(rand(rng, cases, 16, 16)), dev.round(rand(rng, cases, 16, 8))
    c = rand(rng, cases, 16, 8)
    d_registers = _mma_on_registers(dev, ptx_layouts.pack_a(_element_bits(dev, a)),
                                    ptx_layouts.pack_b(_element_bits(dev, b)), ptx_layouts.pack_c(c))
    expected = a.astype(numpy.float64) @ b.astype(numpy.float64) + c
    return KernelRun(f"{dev.dtype} mma.m16n8k16 × {cases} by the PTX ISA's formulas",
                     [compared("d = a·b + c", ptx_layouts.unpack_d(d_registers), expected, 1e-5, 1e-5)], {})


def mma_one_hot(dev):
    """A single 1 at each place (r, k) of A and at each (k, j) of B, every other element and C 0:
    D, unpacked by the ISA's formulas, holds exactly one 1, at (r, j). 16·16·8 products, one block
    each."""
    r, k, j = (index.ravel() for index in numpy.meshgrid(numpy.arange(16), numpy.arange(16), numpy.arange(8),
                                                         indexing="ij"))
    cases = numpy.arange(r.size)
    a = numpy.zeros((r.size, 16, 16), numpy.float32)
    b = numpy.zeros((r.size, 16, 8), numpy.float32)
    expected = numpy.zeros((r.size, 16, 8), numpy.float32)
    a[cases, r, k] = b[cases, k, j] = expected[cases, r, j] = 1.0
    c = numpy.zeros_like(expected)
    d_registers = _mma_on_registers(dev, ptx_layouts.pack_a(_element_bits(dev, a)),
                                    ptx_layouts.pack_b(_element_bits(dev, b)), ptx_layouts.pack_c(c))
    return KernelRun(f"{dev.dtype} mma.m16n8k16 on one-hot A and B",
                     [compared("d", ptx_layouts.unpack_d(d_registers), expected, 0.0, 0.0)], {})


def ldmatrix_by_the_isa(dev, seed=0):
    """The six ldmatrix variants, each lane passing the address of a different row drawn at random
    from 64 (scattered, in no order), bit for bit against the ISA's placement; a variant's unused
    registers stay 0."""
    rng = numpy.random.default_rng(seed)
    memory = _bits(dev, rng, 64, 8)
    rows = rng.choice(64, 32, replace=False)
    got = _ldmatrix(dev, memory, rows)
    comparisons = []
    for variant, (num, trans) in enumerate(LDMATRIX_VARIANTS):
        expected = ptx_layouts.ldmatrix_registers(_storage_bits(memory), rows, num, trans)
        comparisons.append(compared(f"ldmatrix.x{num}{'.trans' if trans else ''} at rows {rows.tolist()}",
                                    got[variant], expected, 0.0, 0.0))
    return KernelRun(f"{dev.dtype} ldmatrix by the PTX ISA's formulas", comparisons, {})
