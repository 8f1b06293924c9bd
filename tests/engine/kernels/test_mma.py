"""The tensor-core attention (kernels/attention_mma.cu) and the instructions it is built from
(kernels/mma.cuh), run on the CPU through the emulation of cpu_emulation.h: the emulated
mma/ldmatrix/cp.async against the PTX ISA's fragment layouts (through the test probes of
tests/kernels/mma_probe.cu, tests/mma_probes.py: once through the helpers of mma.cuh, once on
registers packed by the ISA's own formulas, tests/ptx_layouts.py), and the fp16/bf16 kernels,
forward and backward, against the float64 reference (tinyformer/testing/kernel_cases/attention.py). The same
cases run on a GPU in tests/engine/kernels/test_emulation.py. The file runs again under AddressSanitizer
(tests/engine/kernels/test_emulation.py::test_emulation_under_address_sanitizer).
"""

import os

import children
import devices
import mma_probes
import numpy as np
import ptx_layouts
import pytest

from tests.engine.kernels.test_emulation import change_geometry, skip_where_the_sanitized_rerun_runs_it
from tinyformer import Tensor
from tinyformer.engine import functional as F, kernels
from tinyformer.testing import kernel_cases as cases
from tinyformer.testing.kernel_cases import Device, rand
from tinyformer.engine import backend
from tinyformer.engine.kernels import attention as attention_kernel, registry

pytestmark = pytest.mark.usefixtures("cxx_compiler")  # skipped without g++ or clang++; failed in CI (compilers.py)

DTYPES = ("float16", "bfloat16")


@pytest.fixture(params=DTYPES)
def dev(request):
    return Device("cpu", request.param)


# ------------------------------------------------------------------------ the instructions
def test_mma_ldmatrix_cp_async_and_conversions_follow_the_ptx_layouts(dev):
    mma_probes.instructions(dev, seed=3).check()


def test_mma_fragments_packed_by_the_ptx_formulas_follow_the_ptx_layouts(dev):
    """A, B and C packed into registers and D unpacked by the ISA's formulas themselves (not the
    emulation's nor the probe's), against the plain product."""
    mma_probes.mma_by_the_isa(dev, seed=4).check()


def test_one_hot_mma_operands_follow_the_ptx_layouts(dev):
    """A 1 at (r, k) of A and at (k, j) of B lands at (r, j) of D, and nowhere else, for every r, k, j."""
    mma_probes.mma_one_hot(dev).check()


def test_ldmatrix_rows_at_scattered_addresses_follow_the_ptx_layouts(dev):
    for seed in range(3):
        mma_probes.ldmatrix_by_the_isa(dev, seed=seed).check()


def test_the_layout_reference_is_the_ptx_isas():
    """ldmatrix_layout itself, on matrices whose elements name their position: lane 5 of x4 holds
    row 1, columns 2 and 3 of each matrix; transposed, rows 2 and 3 of column 1."""
    m = (np.arange(32)[:, None] * 8 + np.arange(8)[None, :]).astype(np.uint16)  # element = 8·row + col
    regs = mma_probes.ldmatrix_layout(m, 4, trans=False)
    assert [(int(r) & 0xFFFF, int(r) >> 16) for r in regs[5]] == [(8 * (8 * i + 1) + 2, 8 * (8 * i + 1) + 3)
                                                                   for i in range(4)]
    regs = mma_probes.ldmatrix_layout(m, 2, trans=True)
    assert [(int(r) & 0xFFFF, int(r) >> 16) for r in regs[5][:2]] == [(8 * (8 * i + 2) + 1, 8 * (8 * i + 3) + 1)
                                                                       for i in range(2)]
    assert not regs[:, 2:].any()
    # the ISA's formulas, read the same way: the ldmatrix placement of the identity addressing
    # agrees with ldmatrix_layout, and A, B, C/D each place every element of their matrix once
    for num, trans in mma_probes.LDMATRIX_VARIANTS:
        assert np.array_equal(ptx_layouts.ldmatrix_registers(m, np.arange(32), num, trans),
                              mma_probes.ldmatrix_layout(m, num, trans))
    for position, elements, shape in ((ptx_layouts.a_position, 8, (16, 16)), (ptx_layouts.b_position, 4, (16, 8)),
                                      (ptx_layouts.c_position, 4, (16, 8))):
        places = sorted(position(lane, i) for lane in range(32) for i in range(elements))
        assert places == [(r, c) for r in range(shape[0]) for c in range(shape[1])]
    assert ptx_layouts.a_position(5, 1) == (1, 3) and ptx_layouts.a_position(5, 2) == (9, 2)
    assert ptx_layouts.a_position(5, 6) == (9, 10) and ptx_layouts.b_position(5, 3) == (11, 1)


def test_a_read_before_its_cp_async_group_is_waited_for_sees_no_data():
    """The emulation performs a copy only when a wait lets its group complete: the probe reading
    group 1 after wait_group 1 (read_early) sees the shared memory as it was before the copies
    (the probe's stale marker, 0xA5A5 in every element), group 0 already landed; with the
    wait_group 0 back before the read, it sees the data. Lanes 29-31 copy nothing: zero fill."""
    source = np.arange(1, 64 * 8 + 1, dtype=np.uint16).view(np.float16)
    valid = 29
    landed = source.view(np.uint16).reshape(2, 32, 8).copy()
    landed[:, valid:] = 0
    stale = np.full((32, 8), 0xA5A5, np.uint16)
    got = {}
    for read_early in (1, 0):
        out = np.zeros_like(source)
        mma_probes.launch("cp_async_probe", "float16", (1,), (32,), (source, out, np.int32(valid),
                                                                    np.int32(read_early)))
        got[read_early] = out.view(np.uint16).reshape(2, 32, 8)
    np.testing.assert_array_equal(got[1][0], landed[0])  # group 0 was waited for
    np.testing.assert_array_equal(got[1][1], stale)  # group 1 was not: no data, not even its zero fill
    np.testing.assert_array_equal(got[0], landed)  # the wait moved back before the read


_UNDRAINED = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
import mma_probes
source = np.arange(1, 32 * 8 + 1, dtype=np.uint16).view(np.float16)
mma_probes.launch("cp_async_drain_probe", "float16", (1,), (32,), (source, np.zeros_like(source), np.int32({mode})))
print("returned")
"""


@pytest.mark.parametrize("mode", ["uncommitted", "committed"])
def test_a_kernel_that_exits_with_cp_async_copies_in_flight_aborts_the_emulation(mode):
    """cp.async.wait_all (mode wait_all: the instructions' case) drains; a thread that returns with
    a copy in its open group, or in a committed group not waited for, stops the emulation with a
    message (in a child: it aborts the process), as a kernel must drain before it exits."""
    mma_probes.build(sanitize=False)  # here, so that the child (no TINYFORMER_* settings) does not build it
    script = _UNDRAINED.format(tests=str(children.ROOT / "tests"), mode=mma_probes.DRAIN_MODES[mode])
    result = children.run([children.PYTHON, "-c", script], timeout=300)
    assert result.returncode != 0 and "returned" not in result.stdout, result.stdout + result.stderr
    assert "a thread returned with cp.async copies in flight" in result.stderr, result.stderr[-2000:]


# ------------------------------------------------------------------------ attention
@pytest.mark.parametrize("length", [1, 15, 16, 17, 63, 64, 65, 129, 300])
def test_attention_lengths_on_and_off_the_tiles(length):
    for dtype in DTYPES:
        cases.attention_mma(Device("cpu", dtype), 1, 1, length, length, 32, rng_seed=length).check()


@pytest.mark.parametrize("dim", registry.HEAD_DIMS)
def test_attention_head_dims_with_padding_and_causal(dev, dim):
    cases.attention_mma(dev, 2, 2, 37, 45, dim, lengths=[40, 7], causal=True, rng_seed=dim).check()


@pytest.mark.parametrize("layout", cases.MMA_LAYOUTS)
def test_attention_reads_every_layout(dev, layout):
    cases.attention_mma(dev, 2, 3, 33, 33, 64, lengths=[33, 20], layout=layout).check()


def test_attention_causal_with_padding_odd_batch_and_heads(dev):
    cases.attention_mma(dev, 3, 3, 19, 19, 32, lengths=[19, 5, 12], causal=True).check()


@pytest.mark.parametrize("len_q,len_k", [(5, 37), (37, 5), (80, 130)])
def test_attention_causal_queries_aligned_with_the_last_keys(dev, len_q, len_k):
    cases.attention_mma(dev, 1, 1, len_q, len_k, 32, causal=True).check()


def test_attention_fully_masked_rows_give_zero_output_and_gradient(dev):
    results = cases.attention_mma(dev, 2, 1, 20, 20, 32, lengths=[0, 20]).check()
    assert not results["o"][0].any() and np.isneginf(results["lse"][0]).all()
    assert not any(g[0].any() for g in results["grads"])


def test_attention_dropout_with_the_philox_mask(dev):
    cases.attention_mma(dev, 2, 1, 13, 70, 32, lengths=[70, 33], causal=True, dropout_p=0.3, seed=1234567).check()
    cases.attention_mma(dev, 1, 2, 50, 50, 128, dropout_p=0.1, seed=99).check()


def test_attention_is_deterministic():
    rng = np.random.default_rng(5)
    q, k, v, g = (rand(rng, 2, 2, 70, 32).astype(np.float16) for _ in range(4))
    runs = []
    for _ in range(2):
        o, lse = attention_kernel.attention_mma_forward(q, k, v, dropout_p=0.2, seed=9)
        runs.append((o, lse) + attention_kernel.attention_mma_backward(q, k, v, o, lse, g, dropout_p=0.2, seed=9))
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_projection_layout_is_read_in_place_and_other_layouts_are_copied(monkeypatch):
    copies = []
    original = attention_kernel.projection_layout

    def recording(array):
        out = original(array)
        copies.append(out is not array)
        return out

    monkeypatch.setattr(attention_kernel, "projection_layout", recording)
    rng = np.random.default_rng(0)
    q, k, v = (rand(rng, 2, 9, 3, 32).astype(np.float16).transpose(0, 2, 1, 3) for _ in range(3))
    o, lse = attention_kernel.attention_mma_forward(q, k, v)
    attention_kernel.attention_mma_backward(q, k, v, o, lse, o)
    assert copies and not any(copies)  # q, k, v, o, grad_o all read where they are
    assert o.transpose(0, 2, 1, 3).flags.c_contiguous  # o in the layout the output projection reads
    # an operand off the 16-byte grid is copied, with the same result
    wide = rand(rng, 2, 3, 9, 40).astype(np.float16)
    shifted = wide[..., 4:36]  # 8 bytes off alignment
    copies.clear()
    o_shifted, _ = attention_kernel.attention_mma_forward(shifted, k, v)
    o_copied, _ = attention_kernel.attention_mma_forward(np.ascontiguousarray(shifted), k, v)
    assert copies[0] and np.array_equal(o_shifted, o_copied)


def test_attention_follows_a_changed_registry_geometry(monkeypatch, request):
    """Two warps per block, other key tiles and padding (test_kernels_emulation's CHANGED_GEOMETRY)."""
    skip_where_the_sanitized_rerun_runs_it(request)
    change_geometry(monkeypatch)
    assert (registry.MMA_ATTENTION_WARPS, registry.MMA_ATTENTION_TILE[64], registry.MMA_PAD) == (2, 32, 16)
    for dim in registry.HEAD_DIMS:
        cases.attention_mma(Device("cpu", "bfloat16"), 1, 2, 45, 70, dim, lengths=[66], causal=True, dropout_p=0.2,
                            seed=5, rng_seed=dim).check()


def test_attention_refuses_what_it_has_no_kernel_for():
    x = np.zeros((1, 1, 4, 32), np.float16)
    with pytest.raises(TypeError, match="float32"):
        attention_kernel.attention_mma_forward(x.astype(np.float32), x.astype(np.float32), x.astype(np.float32))
    with pytest.raises(ValueError, match="head dimension 48"):
        attention_kernel.attention_mma_forward(*(np.zeros((1, 1, 4, 48), np.float16),) * 3)
    with pytest.raises(TypeError, match="share a dtype"):
        attention_kernel.attention_mma_forward(x, x, x.astype(np.float32))
    with pytest.raises(ValueError, match=r"\(batch, heads, len, head_dim\)"):
        attention_kernel.attention_mma_forward(x[0], x[0], x[0])


# ------------------------------------------------------------------------ through functional
def _bfloat16():
    return pytest.importorskip("ml_dtypes", reason="ml_dtypes (the test extra) gives NumPy a bfloat16 dtype").bfloat16


def test_bfloat16_is_the_ml_dtypes_dtype_and_uint16_storage_is_refused():
    """ml_dtypes' bfloat16 arrays (the dtype CuPy 14 takes) run the bf16 kernels and come back in
    that dtype; uint16 storage, the old way, is refused naming the dtype."""
    bfloat16 = _bfloat16()
    rng = np.random.default_rng(2)
    q, k, v, g = (backend.to_bfloat16(rand(rng, 2, 3, 21, 32)) for _ in range(4))
    assert q.dtype == bfloat16
    o, lse = attention_kernel.attention_mma_forward(q, k, v, causal=True)
    grads = attention_kernel.attention_mma_backward(q, k, v, o, lse, g, causal=True)
    assert o.dtype == bfloat16 and all(a.dtype == bfloat16 for a in grads)
    bits = [a.view(np.uint16) for a in (q, k, v)]
    with pytest.raises(TypeError, match="uint16"):
        attention_kernel.attention_mma_forward(*bits, causal=True, dtype="bfloat16")


def test_the_dispatch_rule_takes_float16_float32_and_a_bfloat16_dtype(monkeypatch):
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
    assert kernels.use_kernels(np.zeros(2, np.float16), np.zeros(2, _bfloat16()), np.zeros(2, np.float32))
    assert not kernels.use_kernels(np.zeros(2, np.float64)) and not kernels.use_kernels(np.zeros(2, np.uint16))


def test_functional_attention_takes_the_tensor_core_kernel_for_float16(emulated_kernels, monkeypatch):
    """(A Tensor holds no bfloat16 yet: bfloat16 reaches the kernel through kernels.attention, tested above.)"""
    called = []
    for name in ("attention_mma_forward", "attention_forward"):
        original = getattr(attention_kernel, name)
        monkeypatch.setattr(attention_kernel, name,
                            lambda *a, _f=original, _n=name, **kw: called.append(_n) or _f(*a, **kw))
    rng = np.random.default_rng(1)
    arrays = [rand(rng, 2, 7, 2, 32) for _ in range(4)]  # (batch, len, heads, d): the projections' layout
    mask = F.padding_mask(np.array([[4, 5, 6, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]]), 0)
    half = np.float16
    arrays = [a.astype(half).astype(np.float32) for a in arrays]  # the same values in both runs
    outs = {}
    for dtype in (half, np.float64):
        q, k, v = (Tensor(a.astype(dtype).transpose(0, 2, 1, 3), requires_grad=True) for a in arrays[:3])
        out = F.scaled_dot_product_attention(q, k, v, mask, causal=True)
        assert out.grad_fn.uses_kernel == (dtype is half)
        out.backward(Tensor(arrays[3].astype(dtype).transpose(0, 2, 1, 3)))
        outs[dtype] = [x.astype(np.float64) for x in (out.data, q.grad, k.grad, v.grad)]
        assert out.data.dtype == dtype and q.grad.dtype == dtype
    assert called == ["attention_mma_forward"]
    for got, want in zip(outs[half], outs[np.float64]):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------------ on the GPU only
GPU_LENGTHS = [1, 7, 64, 129, 1000]
MMA_DTYPES = list(registry.MMA_DTYPES)


@devices.needs_gpu
@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_hardware_mma_ldmatrix_and_cp_async_follow_the_ptx_layouts(dtype):
    mma_probes.instructions(Device("cuda", dtype), seed=3).check()


@devices.needs_gpu
@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_hardware_mma_and_ldmatrix_follow_the_ptx_isas_own_formulas(dtype):
    """Registers packed and unpacked by the ISA's formulas (tests/ptx_layouts.py): the product,
    every one-hot placement, and ldmatrix from scattered rows."""
    dev = Device("cuda", dtype)
    mma_probes.mma_by_the_isa(dev, seed=4).check()
    mma_probes.mma_one_hot(dev).check()
    for seed in range(3):
        mma_probes.ldmatrix_by_the_isa(dev, seed=seed).check()


@devices.needs_gpu
@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_hardware_mma_agrees_with_the_emulation(dtype, cxx_compiler):
    """The same probe inputs through the hardware instruction and through cpu_emulation.h."""
    rng = np.random.default_rng(11)
    kind = "bfloat16" if dtype == "bfloat16" else "float16"
    dev_gpu, dev_cpu = Device("cuda", dtype), Device("cpu", dtype)
    a, b, c = dev_gpu.round(rand(rng, 16, 16)), dev_gpu.round(rand(rng, 16, 8)), rand(rng, 16, 8)
    results = []
    for dev in (dev_gpu, dev_cpu):
        d = backend.to_device(np.zeros((16, 8), np.float32), dev.device)
        mma_probes.launch("mma_probe", kind, (1,), (32,), (dev.put(a), dev.put(b), backend.to_device(c, dev.device), d,
                                                          np.int32(1)))
        results.append(backend.to_numpy(d))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-6)


@devices.needs_gpu
@pytest.mark.parametrize("dtype", MMA_DTYPES)
@pytest.mark.parametrize("length", GPU_LENGTHS)
@pytest.mark.parametrize("dim", registry.HEAD_DIMS)
def test_tensor_core_attention_lengths_and_head_dims(dtype, length, dim):
    cases.attention_mma(Device("cuda", dtype), 2, 3, length, length, dim, rng_seed=length).check()


@devices.needs_gpu
@pytest.mark.parametrize("dtype", MMA_DTYPES)
@pytest.mark.parametrize("layout", cases.MMA_LAYOUTS)
def test_tensor_core_attention_masks_dropout_and_layouts(dtype, layout):
    dev = Device("cuda", dtype)
    cases.attention_mma(dev, 5, 3, 129, 129, 64, lengths=[129, 1, 64, 100, 0], causal=True, layout=layout).check()
    cases.attention_mma(dev, 2, 2, 64, 129, 128, lengths=[129, 70], causal=True, dropout_p=0.1, seed=42,
                        layout="projection").check()
    cases.attention_mma(dev, 2, 2, 7, 1000, 32, lengths=[1000, 500], causal=True).check()


@devices.needs_gpu
def test_tensor_core_attention_repeated_runs_are_identical():
    import cupy

    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rand(rng, 2, 1000, 3, 64).astype(np.float16)).transpose(0, 2, 1, 3) for _ in range(4))
    runs = []
    for _ in range(2):
        o, lse = attention_kernel.attention_mma_forward(q, k, v, causal=True, dropout_p=0.1, seed=7)
        runs.append((o, lse) + attention_kernel.attention_mma_backward(q, k, v, o, lse, g, causal=True, dropout_p=0.1,
                                                                       seed=7))
    for a, b in zip(*runs):
        assert bool((a == b).all())


@devices.needs_gpu
def test_functional_attention_in_float16_runs_on_tensor_cores(monkeypatch):
    import cupy

    called = []
    original = attention_kernel.attention_mma_forward
    monkeypatch.setattr(attention_kernel, "attention_mma_forward",
                        lambda *a, **kw: called.append(1) or original(*a, **kw))
    rng = np.random.default_rng(1)
    q, k, v = (Tensor(cupy.asarray(rand(rng, 2, 3, 50, 64).astype(np.float16)), requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, causal=True)
    assert out.grad_fn.uses_kernel and called
    out.sum().backward()
    reference = F.scaled_dot_product_attention(*(Tensor(x.data.astype(np.float64)) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(cupy.asnumpy(out.data).astype(np.float64), cupy.asnumpy(reference.data), atol=1e-2)
    assert all(bool(cupy.isfinite(x.grad).all()) for x in (q, k, v))
