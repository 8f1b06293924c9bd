"""The CUDA kernels against the NumPy references in functional/optim (the cases of
tinyformer/testing/kernel_cases/), on two devices (``devices``): ``emulated``, the kernels' own source
run on the CPU through testing/emulation/cpu_emulation.h (in CI, where there is no GPU), and ``cuda``, the
compiled kernels on a GPU in float32, float16 and bfloat16 (skipped without one) at the lengths
where tiling goes wrong first: 1, 7, 64, 129, 1000.

The emulation runs a block's CUDA threads as fibers on one OS thread, so its shapes are small. Most
of the file runs again under AddressSanitizer (test_emulation_under_address_sanitizer). The tests
that exist only on a GPU (a captured Adam step, the functional ops on CuPy arrays) carry
``devices.needs_gpu``.
"""

import functools
import os
import re
import shutil

import children
import devices
import numpy as np
import pytest

import tinyformer
from tinyformer import Tensor
from tinyformer.engine import backend, functional as F
from tinyformer.testing import kernel_cases as cases
from tinyformer.testing.kernel_cases import Device, rand
from tinyformer.engine.kernels import adam as adam_kernel, attention as attention_kernel, dropout as dropout_kernel
from tinyformer.engine.kernels import launch, registry
from tinyformer.engine.kernels.philox import philox4x32_10, philox_uniform
from tinyformer.model.optim import Adam
from tinyformer.model.optim.adam import fused_update

pytestmark = pytest.mark.usefixtures("cxx_compiler")  # skipped without g++ or clang++; failed in CI (compilers.py)

CPU = Device("cpu")
DTYPES = ["float32", "float16", "bfloat16"]  # the GPU's; the emulation's 16-bit types are tested where named
LENGTHS = [1, 7, 64, 129, 1000]


def on_devices(emulated=(), cuda=()):
    """pytest parameters ``(device, *values)``: each ``values`` of ``emulated`` on the CPU's emulation
    (float32, small shapes), each ``(dtype, *values)`` of ``cuda`` on the GPU (``devices.on_cuda``)."""
    def name(*parts):
        return "-".join(str(part) for part in parts if isinstance(part, (int, float, str, type(None))))

    return ([pytest.param(CPU, *values, id=name("emulated", *values)) for values in emulated]
            + [devices.on_cuda(Device("cuda", dtype), *values, id=name("cuda", dtype, *values))
               for dtype, *values in cuda])


@pytest.mark.parametrize("device, rows", on_devices([(3,)], [(dtype, 37) for dtype in DTYPES]))
@pytest.mark.parametrize("cols", LENGTHS)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_kernel_matches_reference(device, rows, cols, log):
    cases.softmax(device, rows, cols, log, seed=cols).check()


@pytest.mark.parametrize("device, rows, cols, seed", on_devices(
    [(rows, cols, rows * cols) for rows, cols in [(1, 1), (5, 7), (3, 64), (130, 129), (2, 1000)]],
    [(dtype, 300, cols, cols) for dtype in DTYPES for cols in LENGTHS]))
def test_layer_norm_kernel_matches_reference(device, rows, cols, seed):
    cases.layer_norm(device, rows, cols, seed=seed).check()


@pytest.mark.parametrize("cols", [37, 300])
def test_layer_norm_kernel_rescales_rows_whose_float32_statistics_overflow(cols):
    """Rows near 1e20 (Σ (x − μ)² overflows float32) and 3e38 (Σ x overflows; x − μ too when the
    signs are mixed) among normal rows match the float64 reference: not the bias, finite gradients."""
    rng = np.random.default_rng(cols)
    x = rand(rng, 6, cols, scale=2.0) + 1.5
    x[1] = rng.uniform(-1, 1, cols) * 1e20
    x[3] = rng.uniform(0.0, 1.0, cols) * 3e38
    x[4] = rng.uniform(-1, 1, cols) * 3e38
    x[5] = -rng.uniform(0.5, 1.0, cols) * 1e20
    x[0] = 1e30  # a constant row: σ = 0 and eps/s² underflows in the rescaled statistics
    results = cases.layer_norm(CPU, 6, cols, seed=cols, x=x).check()
    for name in ("y", "grad x", "grad w", "grad b", "mean", "rstd"):
        assert np.isfinite(results[name]).all(), name
    assert (results["rstd"] > 0).all()
    assert np.abs(results["y"][[1, 3, 4, 5]]).max(axis=-1).min() > 0.5  # normalised rows, not the bias alone


@pytest.mark.parametrize("device, rows, cols, p, seed", on_devices(
    [(rows, cols, p, 7) for rows, cols in [(3, 1), (5, 7), (9, 129), (2, 1001)] for p in (0.0, 0.3)],
    [(dtype, 300, cols, p, cols) for dtype in DTYPES for cols in LENGTHS for p in (0.0, 0.1)]))
def test_bias_relu_dropout_kernel_matches_reference(device, rows, cols, p, seed):
    cases.bias_relu_dropout(device, rows, cols, p, seed=seed, rng_seed=cols).check()


def test_bias_relu_dropout_kernel_grid_stride(monkeypatch):
    monkeypatch.setattr(registry, "DROPOUT_MAX_BLOCKS", 2)
    cases.bias_relu_dropout(CPU, 33, 129, 0.2, seed=3).check()


@pytest.mark.parametrize("device, rows, cols, p, seed", on_devices(
    [(rows, cols, p, 77) for rows, cols in [(3, 1), (5, 7), (9, 129), (2, 1000)] for p in (0.0, 0.3)],
    [(dtype, 300, cols, p, cols) for dtype in DTYPES for cols in LENGTHS for p in (0.0, 0.1)]))
def test_residual_layer_norm_kernel_matches_reference(device, rows, cols, p, seed):
    cases.residual_layer_norm(device, rows, cols, p, seed=seed, rng_seed=cols).check()


@pytest.mark.parametrize("device, positions, vocab, cols", on_devices(
    [(0, 5, 3), (1, 1, 1), (7, 3, 5), (300, 17, 33), (600, 40, 1100)],
    [(dtype, *sizes) for dtype in DTYPES for sizes in [(1, 1, 1), (300, 17, 33), (600, 40, 1100), (4096, 8000, 256)]]))
def test_embedding_backward_kernel_matches_reference(device, positions, vocab, cols):
    """Chunks of positions past one block and rows wider than one pass of the block's columns."""
    cases.embedding(device, positions, vocab, cols, seed=positions).check()


@devices.needs_gpu
def test_embedding_backward_kernel_repeats_bit_for_bit():
    """No atomics: the same ids and dy give the same bits at every run (CuPy's scatter add does not)."""
    first, second = (cases.embedding(Device("cuda"), 4096, 300, 256, seed=1).check()["grad w"] for _ in range(2))
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_embedding_backward_kernel_in_16_bit_types(dtype):
    cases.embedding(Device("cpu", dtype), 300, 17, 33, seed=3).check()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cols,p", [(64, 0.0), (1000, 0.1)])
def test_layer_norms_in_16_bit_types_match_the_reference_on_what_the_kernel_rounds(dtype, cols, p):
    """The 16-bit instantiations at engine/kernels/test_emulation.py's 300 rows, where dw sums enough rows for h's
    rounding to show (the first H200 run found the reference summing unrounded h: 0.1 off in bfloat16)."""
    dev = Device("cpu", dtype)
    cases.layer_norm(dev, 300, cols, seed=cols).check()
    cases.residual_layer_norm(dev, 300, cols, p, seed=cols, rng_seed=cols).check()


@pytest.mark.parametrize("device, rows, vocab, smoothing, ignore_index", on_devices(
    [(9, vocab, smoothing, ignore) for vocab in [1, 7, 129, 1000] for smoothing in (0.0, 0.1) for ignore in (None, 0)],
    [(dtype, 129, vocab, smoothing, ignore) for dtype in DTYPES for vocab in [7, 1000, 8000]
     for smoothing, ignore in [(0.0, None), (0.1, 0)]]))
def test_cross_entropy_kernel_matches_reference(device, rows, vocab, smoothing, ignore_index):
    cases.cross_entropy(device, rows, vocab, smoothing, ignore_index, seed=vocab).check()


GPU_ADAM_SHAPES = [(512, 512), (7,), (70000,), (1,)]


@pytest.mark.parametrize("device, shapes, chunk_size", on_devices(
    [([(3, 5), (7,), (300,), (1,)], 128)], [("float32", GPU_ADAM_SHAPES, registry.ADAM_CHUNK)]))
def test_fused_adam_kernel_matches_reference_loop(device, shapes, chunk_size):
    plan = cases.adam(device, shapes, chunk_size=chunk_size).check()["plan"]
    assert plan.chunks == sum(-(-int(np.prod(shape)) // chunk_size) for shape in shapes)  # emulated: 300 in 3 of 128


@devices.needs_gpu
@pytest.mark.parametrize("copy_dtype", [None, "float16", "bfloat16"])
def test_fused_adam_kernel_clips_and_unscales_as_the_reference_on_the_gpu(copy_dtype):
    """At the GPU's sizes (the emulation's own checks of copies, unscaling and clipping follow)."""
    cases.adam(Device("cuda"), GPU_ADAM_SHAPES, chunk_size=registry.ADAM_CHUNK,
               copy_dtype=copy_dtype, grad_scale=1024.0, max_grad_norm=100.0).check()


@pytest.mark.parametrize("copy_dtype", ["float16", "bfloat16"])
def test_fused_adam_kernel_refreshes_the_compute_copies_and_unscales(copy_dtype):
    """Mixed precision: the kernel rounds the new float32 values into each parameter's half
    compute copy in the same pass (the last parameter has none) and divides gradients of a loss
    scaled by 2^10 by it."""
    plan = cases.adam(CPU, [(3, 5), (300,), (7,)], chunk_size=128, copy_dtype=copy_dtype,
                      grad_scale=1024.0).check()["plan"]
    assert plan.copy_type == adam_kernel.AdamPlan.COPY_TYPES[copy_dtype]


@pytest.mark.parametrize("max_grad_norm", [1.0, 1e6])
def test_fused_adam_kernel_clips_to_the_global_norm(max_grad_norm):
    """The norm (about √310 here) is the eager step's, over all tensors and chunks; clipping to
    1.0 is active, to 1e6 not."""
    results = cases.adam(CPU, [(3, 5), (300,)], chunk_size=64, max_grad_norm=max_grad_norm).check()
    assert (results["result"][0] > max_grad_norm) == (max_grad_norm == 1.0) and results["result"][1] == 1.0


def test_fused_adam_kernel_over_many_chunks_and_tensors_with_a_loss_scale():
    plan = cases.adam(CPU, [(3, 5), (7,), (1000,), (1,), (257,), (64,)], chunk_size=64, steps=2, grad_scale=8.0,
                      max_grad_norm=5.0).check()["plan"]
    assert plan.chunks == 1 + 1 + 16 + 1 + 5 + 1


@pytest.mark.parametrize("poison", cases.ADAM_POISONS)
@pytest.mark.parametrize("device, shapes, chunk_size, copy_dtype", on_devices(
    [([(3, 5), (300,), (7,)], 128, copy_dtype) for copy_dtype in (None, "float16")],
    [("float32", [(512, 512), (7,), (70000,)], registry.ADAM_CHUNK, "bfloat16")]))
def test_fused_adam_kernel_skips_a_non_finite_step_without_writing(poison, device, shapes, chunk_size, copy_dtype):
    cases.adam_skip(device, shapes, chunk_size, poison, copy_dtype=copy_dtype).check()


def _adam_state(seed=0, shapes=((3, 5), (300,))):
    """Parameters, gradients and zero moments: a first step."""
    rng = np.random.default_rng(seed)
    return [[rand(rng, *s) for s in shapes] for _ in range(2)] + [[np.zeros(s, np.float32) for s in shapes]
                                                                  for _ in range(2)]


def _hyper(skip_nonfinite=1.0, step_size=0.01, bias2=0.02, grad_scale=1.0, max_grad_norm=0.0):
    return np.array([step_size, bias2, grad_scale, max_grad_norm, skip_nonfinite], np.float32)


def test_fused_adam_kernel_without_the_skip_flag_applies_a_non_finite_update():
    """hyper's skip_nonfinite = 0 (Adam.step without skip_nonfinite): a NaN gradient updates
    anyway, as the reference does, and the result says so."""
    params, grads, m, v = _adam_state()
    grads[1][5] = np.nan
    expected = [[a.copy() for a in arrays] for arrays in (params, m, v)]
    expected_result = np.zeros(2, np.float32)
    with np.errstate(invalid="ignore"):
        fused_update(expected[0], grads, expected[1], expected[2], _hyper(skip_nonfinite=0.0),
                                expected_result, (0.9, 0.98), 1e-9, 0.0)
    result = np.zeros(2, np.float32)
    adam_kernel.grad_norm_adam_update(adam_kernel.AdamPlan(params, grads, m, v, chunk_size=64),
                                      _hyper(skip_nonfinite=0.0), result, 0.9, 0.98, 1e-9)
    assert np.isnan(result[0]) and result[1] == 1.0 and np.isnan(expected_result[0]) and expected_result[1] == 1.0
    for got, want in zip(params + m + v, expected[0] + expected[1] + expected[2]):
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any() == np.isnan(want).any()
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-6, atol=1e-7)


def test_fused_adam_kernel_is_deterministic():
    """The same state and gradients give the same bits: the norm's partial sums have no atomics
    and every block adds them in the same order."""
    runs = []
    for _ in range(2):
        params, grads, m, v = _adam_state(seed=3, shapes=((2000,), (33,), (700,)))
        result = np.zeros(2, np.float32)
        adam_kernel.grad_norm_adam_update(adam_kernel.AdamPlan(params, grads, m, v, chunk_size=100),
                                          _hyper(max_grad_norm=2.0), result, 0.9, 0.98, 1e-9, weight_decay=0.01)
        runs.append([result] + params + m + v)
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_fused_adam_kernel_with_nothing_to_update_still_writes_the_result():
    empty = [np.zeros((0, 3), np.float32)]
    result = np.full(2, 7.0, np.float32)
    plan = adam_kernel.AdamPlan(empty, empty, empty, empty)
    assert plan.chunks == 0
    adam_kernel.grad_norm_adam_update(plan, _hyper(), result, 0.9, 0.98, 1e-9)
    assert result.tolist() == [0.0, 1.0]


def test_fused_adam_kernel_checks_its_device_buffers():
    params, grads, m, v = _adam_state()
    plan = adam_kernel.AdamPlan(params, grads, m, v)
    result = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match=r"hyper must be a contiguous float32 array of at least 5 elements"):
        adam_kernel.grad_norm_adam_update(plan, _hyper().astype(np.float64), result, 0.9, 0.98, 1e-9)
    with pytest.raises(ValueError, match=r"result must be a contiguous float32 array of at least 2"):
        adam_kernel.grad_norm_adam_update(plan, _hyper(), np.zeros(1, np.float32), 0.9, 0.98, 1e-9)
    with pytest.raises(ValueError, match=r"loss must be a contiguous float32 array of at least 1"):
        adam_kernel.grad_norm_adam_update(plan, _hyper(), result, 0.9, 0.98, 1e-9, loss=np.zeros(1, np.float64))


def test_adam_hyper_names_follow_the_kernels_enum():
    enum = re.search(r"enum Hyper \{([^}]*)\}", registry.read_source("adam.cu")).group(1)
    names = [re.sub(r"(?<!^)([A-Z])", r"_\1", name.strip()[1:]).lower() for name in enum.split(",")]
    assert names == list(adam_kernel.ADAM_HYPER)


def test_adam_plan_refuses_compute_copies_of_two_dtypes():
    p = [np.zeros(3, np.float32), np.zeros(3, np.float32)]
    zeros = [np.zeros_like(a) for a in p]
    with pytest.raises(TypeError, match="compute copies must share one dtype"):
        adam_kernel.AdamPlan(p, zeros, zeros, zeros, copies=[np.zeros(3, np.float16), p[0].astype(backend.bfloat16)])


# Other block sizes than the registry's, for the row kernels, the attention kernels and the
# tensor-core attention. One geometry for this file's test and engine/kernels/test_mma.py's, so that
# both use one rebuilt emulation library (a build takes about ten seconds).
CHANGED_GEOMETRY = {"ROW_BLOCK": 64, "COLUMN_BLOCK": 32, "LAYER_NORM_ROWS_PER_CHUNK": 3, "ADAM_BLOCK": 64,
                    "ADAM_CHUNK": 100, "DROPOUT_MAX_BLOCKS": 3, "ATTENTION_WARPS": 2,
                    "ATTENTION_ROWS_PER_WARP": {32: 1, 64: 3, 128: 5}, "MMA_ATTENTION_WARPS": 2,
                    "MMA_ATTENTION_TILE": {32: 16, 64: 32, 128: 48}, "MMA_PAD": 16}


def change_geometry(monkeypatch):
    """Sets CHANGED_GEOMETRY in the registry for the test (monkeypatch undoes it)."""
    for name, value in CHANGED_GEOMETRY.items():
        assert hasattr(registry, name), name
        monkeypatch.setattr(registry, name, value)


def skip_where_the_sanitized_rerun_runs_it(request):
    """A changed-geometry test costs a build of the emulation of its own; where this run also
    reruns it under AddressSanitizer (test_emulation_under_address_sanitizer, selected, with an
    ASan runtime), the same test with the same checks runs there, so it is not built twice."""
    if os.environ.get("TINYFORMER_EMULATION_SANITIZE") == "1" or _libasan() is None:
        return
    for item in request.session.items:
        if getattr(item, "originalname", None) == "test_emulation_under_address_sanitizer":
            path, selection = SANITIZED[item.callspec.params["part"]]
            if os.path.samefile(path, request.node.path) and keyword_selects(selection, request.node.name):
                pytest.skip(f"runs under AddressSanitizer in {item.name} of this run")


def keyword_selects(selection, name):
    """Whether ``pytest -k selection`` picks a test of this name (words matched case-insensitively
    as substrings; and, or, not, parentheses)."""
    python = re.sub(r"\b(?!(?:and|or|not)\b)\w+\b", lambda word: str(word.group().lower() in name.lower()), selection)
    return eval(python, {"__builtins__": {}})  # only True, False, and, or, not and parentheses are left


def test_kernels_follow_a_changed_registry_geometry(monkeypatch, request):
    """Other block sizes in the registry: the emulation is rebuilt with them, the launches use
    them, and every kernel still matches its reference (a source that kept its own rows per warp
    or warps per block would leave rows unprocessed)."""
    skip_where_the_sanitized_rerun_runs_it(request)
    change_geometry(monkeypatch)
    launches = []
    original = launch.launch

    def recording(kernel, dtype, grid, block, args, head_dim=None, shared_mem=0, cost=None):
        launches.append((kernel, tuple(grid), tuple(block)))
        return original(kernel, dtype, grid, block, args, head_dim, shared_mem, cost)

    monkeypatch.setattr(launch, "launch", recording)
    cases.softmax(CPU, 3, 1000, seed=1).check()
    cases.layer_norm(CPU, 7, 300, seed=2, rows_per_chunk=None).check()
    cases.cross_entropy(CPU, 5, 1000, 0.1, 0, seed=3).check()
    assert cases.adam(CPU, [(300,), (7,)], chunk_size=None).check()["plan"].chunks == 4
    cases.dropout(CPU, (4099,), 0.3, seed=4).check()
    for dim in (32, 64, 128):
        cases.attention(CPU, 1, 2, 13, 17, dim, lengths=[15], causal=True, rng_seed=dim).check()
    blocks = {kernel: block for kernel, _, block in launches}
    grids = {kernel: grid for kernel, grid, _ in launches}
    assert blocks["softmax_forward"] == blocks["layer_norm_forward"] == blocks["dropout_forward"] == (64,)
    assert blocks["layer_norm_backward_input"] == (64,) and grids["layer_norm_backward_input"] == (3,)  # 7 rows, 3 a chunk
    assert blocks["layer_norm_reduce_params"] == (32,) and grids["layer_norm_reduce_params"] == (10,)
    assert blocks["adam_update"] == (64,) and grids["dropout_forward"] == (3,)
    assert blocks["attention_forward"] == (64,) and grids["attention_forward"] == (2, 2)  # 13 rows, 10 per block


def test_adam_plan_refuses_mismatched_arrays():
    p = [np.zeros((2, 3), np.float32)]
    with pytest.raises(ValueError, match=r"grads\[0\].*\(2, 3\)"):
        adam_kernel.AdamPlan(p, [np.zeros((3, 2), np.float32)], [np.zeros_like(p[0])], [np.zeros_like(p[0])])


@pytest.mark.parametrize("device, batch, heads, length, dim", on_devices(
    [(1, 1, length, 32) for length in [1, 7, 64, 129]],
    [(dtype, 2, 3, length, dim) for dtype in DTYPES for length in LENGTHS for dim in (32, 64, 128)]))
def test_attention_kernel_lengths(device, batch, heads, length, dim):
    cases.attention(device, batch, heads, length, length, dim, rng_seed=length).check()


@pytest.mark.parametrize("dim", [64, 128])
def test_attention_kernel_head_dims(dim):
    cases.attention(CPU, 1, 2, 9, 11, dim, lengths=[8]).check()


@pytest.mark.parametrize("device, sizes, lengths", on_devices(
    [((3, 3, 19, 19, 32), [19, 5, 12])], [(dtype, (5, 3, 129, 129, 64), [129, 1, 64, 100, 7]) for dtype in DTYPES]))
def test_attention_kernel_causal_with_padding_odd_batch_and_heads(device, sizes, lengths):
    cases.attention(device, *sizes, lengths=lengths, causal=True).check()


@pytest.mark.parametrize("device, sizes, lengths", on_devices(
    [((1, 1, 5, 37, 32), None)], [("float32", (2, 2, 7, 1000, 64), [1000, 500])]))
def test_attention_kernel_causal_queries_aligned_with_last_keys(device, sizes, lengths):
    cases.attention(device, *sizes, lengths=lengths, causal=True).check()


@pytest.mark.parametrize("device, batch, heads, length, dim, lengths", on_devices(
    [(2, 1, 6, 32, [0, 6])], [("float32", 3, 2, 7, 64, [0, 7, 3])]))
def test_attention_kernel_fully_masked_rows_give_zero_output_and_gradient(device, batch, heads, length, dim, lengths):
    results = cases.attention(device, batch, heads, length, length, dim, lengths=lengths).check()
    o, lse = results["o"], results["lse"]  # (batch·heads, ...): the first sequence's heads are masked whole
    assert not o[:heads].any() and np.isneginf(lse[:heads]).all()


@pytest.mark.parametrize("device, sizes, lengths, p, seed", on_devices(
    [((2, 1, 13, 40, 32), [40, 33], 0.3, 1234567)], [("float32", (2, 2, 64, 129, 64), [129, 70], 0.1, 42)]))
def test_attention_kernel_dropout_matches_reference_with_the_same_philox_mask(device, sizes, lengths, p, seed):
    cases.attention(device, *sizes, lengths=lengths, causal=True, dropout_p=p, seed=seed).check()


@pytest.mark.parametrize("device, shape, heads, causal, p, seed", on_devices(
    [((2, 33, 32), 1, False, 0.2, 9)], [("float32", (6, 1000, 64), 3, True, 0.1, 7)]))
def test_attention_kernel_is_deterministic(device, shape, heads, causal, p, seed):
    rng = np.random.default_rng(5)
    q, k, v, g = (backend.to_device(rand(rng, *shape), device.device) for _ in range(4))
    runs = []
    for _ in range(2):
        o, lse = attention_kernel.attention_forward(q, k, v, heads, causal=causal, dropout_p=p, seed=seed)
        runs.append((o, lse) + attention_kernel.attention_backward(q, k, v, o, lse, g, heads, causal=causal,
                                                                   dropout_p=p, seed=seed))
    for a, b in zip(*runs):
        assert np.array_equal(backend.to_numpy(a), backend.to_numpy(b))


def test_attention_kernel_refuses_unsupported_head_dim_and_dtype():
    x = np.zeros((1, 4, 48), np.float32)
    with pytest.raises(ValueError, match="head dimension 48"):
        attention_kernel.attention_forward(x, x, x, 1)
    y = np.zeros((1, 4, 32), np.float64)
    with pytest.raises(TypeError, match="float64"):
        attention_kernel.attention_forward(y, y, y, 1)


@pytest.mark.parametrize("device, n, seed, offset", on_devices(
    [(n, seed, offset) for n in [1, 3, 4, 5, 1000, 4099] for seed, offset in [(0, 0), (2 ** 63 - 25, 0), (987654321, 3)]],
    [(dtype, n, 2 ** 62 + n, n % 3) for dtype in DTYPES for n in [1, 3, 4, 5, 1000, 4099, 1_000_003]]))
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_kernel_matches_the_philox_reference(device, n, seed, offset, p):
    cases.dropout(device, (n,), p, seed, offset, rng_seed=n).check()


def test_dropout_kernel_masks_elements_in_c_order_of_any_shape():
    keep = cases.dropout(CPU, (3, 5, 7), 0.3, seed=11).check()["keep"]
    assert 0 < keep.sum() < keep.size


# emulated: 2 blocks of 256 threads stride over 1,025 groups; cuda: 3 blocks over 25,001
@pytest.mark.parametrize("device, blocks, n, p, seed", on_devices([(2, 4099, 0.5, 3)], [("float32", 3, 100_001, 0.2, 17)]))
def test_dropout_kernel_grid_stride(monkeypatch, device, blocks, n, p, seed):
    monkeypatch.setattr(registry, "DROPOUT_MAX_BLOCKS", blocks)
    cases.dropout(device, (n,), p, seed=seed, offset=1).check()


def test_dropout_kernel_keeps_everything_at_p_zero():
    x = rand(np.random.default_rng(0), 37)
    y, keep = dropout_kernel.dropout_forward(x, 0.0, seed=5)
    assert keep.all() and np.array_equal(y, x)


def test_dropout_kernel_gives_nan_for_a_dropped_non_finite_value_like_the_reference():
    x = np.array([np.nan, np.inf, -np.inf, 1.0, -2.0] * 20, np.float32)
    y, keep = dropout_kernel.dropout_forward(x, 0.5, seed=1)
    assert 0 < keep.sum() < keep.size
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(y, x * keep * np.float32(2.0))


def test_dropout_kernel_on_an_empty_array():
    y, keep = dropout_kernel.dropout_forward(np.zeros((0, 4), np.float32), 0.5, seed=1)
    assert y.shape == keep.shape == (0, 4) and keep.dtype == np.bool_


def test_philox_matches_the_random123_known_answers():
    zero = [np.zeros(1, np.uint32)] * 4
    assert [int(w[0]) for w in philox4x32_10(zero, (0, 0))] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = [np.full(1, 0xFFFFFFFF, np.uint32)] * 4
    assert [int(w[0]) for w in philox4x32_10(ones, (0xFFFFFFFF, 0xFFFFFFFF))] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


# ------------------------------------------------------------------------ through functional and the optimiser
def test_functional_attention_dispatches_to_the_fused_kernel(emulated_kernels):
    rng = np.random.default_rng(1)
    q, k, v = (Tensor(rand(rng, 2, 2, 5, 32), requires_grad=True) for _ in range(3))
    mask = F.padding_mask(np.array([[4, 5, 6, 0, 0], [1, 2, 3, 4, 5]]), 0)
    out = F.scaled_dot_product_attention(q, k, v, mask, causal=True)
    assert out.grad_fn.uses_kernel
    # a mask with holes, or asking for the weights, takes the reference
    holes = mask.copy()
    holes[1, 0, 0, 2] = False
    assert not F.scaled_dot_product_attention(q, k, v, holes).grad_fn.uses_kernel
    _, weights = F.scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert weights.shape == (2, 2, 5, 5) and not weights.grad_fn.uses_kernel


def on_the_kernel_path(device, request):
    """Where a functional test's arrays live: NumPy arrays on the emulated kernels, or CuPy arrays."""
    if device == "emulated":
        request.getfixturevalue("emulated_kernels")
        return "cpu"
    return "cuda"


@pytest.mark.parametrize("device, dtype, shape, p, generator_seed, rtol", [
    pytest.param("emulated", "float32", (4, 33), 0.25, 7, 1e-6, id="emulated"),
    *(devices.on_cuda("cuda", dtype, (8, 257), 0.3, 4, 0.0, id=f"cuda-{dtype}") for dtype in ("float32", "float16"))])
def test_functional_dropout_takes_the_kernel_with_a_seed_from_the_generator(device, dtype, shape, p, generator_seed,
                                                                            rtol, request):
    where = on_the_kernel_path(device, request)
    x = Tensor(backend.to_device(rand(np.random.default_rng(2), *shape).astype(dtype), where), requires_grad=True)
    g = backend.to_device(rand(np.random.default_rng(3), *shape).astype(dtype), where)
    y = F.dropout(x, p, True, np.random.default_rng(generator_seed))
    seed = int(np.random.default_rng(generator_seed).integers(2 ** 63))
    keep = backend.to_device((philox_uniform(seed, 0, np.arange(x.size)) >= np.float32(p)).reshape(shape), where)
    scale = np.dtype(dtype).type(1 / (1 - p))
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(backend.to_numpy(y.data), backend.to_numpy(x.data * keep * scale), rtol=rtol, atol=0)
    y.backward(Tensor(g))
    np.testing.assert_allclose(backend.to_numpy(x.grad), backend.to_numpy(g * keep * scale), rtol=rtol, atol=0)


@pytest.mark.parametrize("device, shape, p, seed, draws", [pytest.param("emulated", (3, 50), 0.5, 123, 2, id="emulated"),
                                                          devices.on_cuda("cuda", (64, 1000), 0.1, 99, 3, id="cuda")])
def test_functional_dropout_with_kernels_repeats_after_manual_seed(device, shape, p, seed, draws, request):
    x = Tensor(backend.to_device(np.ones(shape, np.float32), on_the_kernel_path(device, request)))
    masks = []
    for _ in range(2):
        tinyformer.manual_seed(seed)
        masks.append([backend.to_numpy(F.dropout(x, p).data != 0) for _ in range(draws)])
    assert all(np.array_equal(first, second) for first, second in zip(*masks))
    assert not np.array_equal(masks[0][0], masks[0][1])  # each call draws a fresh seed
    assert abs(masks[0][0].mean() - (1 - p)) < 8 * np.sqrt(p * (1 - p) / x.size)  # the rate kept


def _adam_with_params(shapes=((3, 5), (300,)), seed=4, **kwargs):
    rng = np.random.default_rng(seed)
    params = [Tensor(rand(rng, *s), requires_grad=True) for s in shapes]
    return Adam(params, lr=tinyformer.model.optim.NoamSchedule(16, warmup_steps=3), weight_decay=0.01, **kwargs)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_adam_steps_eagerly_and_through_the_device_calls_run_the_same_kernels(emulated_kernels, monkeypatch):
    """``Adam.step`` on the kernel path and the calls a captured step makes (scalars written
    outside, the step under ``backend.capturing()`` on persistent gradients, the result read after)
    give the same bits, with a loss scale, clipping and a skipped non-finite step in the middle;
    the device calls build their pointer tables once."""
    launched = []
    original = launch.launch
    monkeypatch.setattr(launch, "launch",
                        lambda kernel, *args, **kw: launched.append(kernel) or original(kernel, *args, **kw))
    eager, graphed = _adam_with_params(max_grad_norm=3.0), _adam_with_params(max_grad_norm=3.0)
    rng = np.random.default_rng(9)
    for p in graphed.params:
        p.grad = np.zeros_like(p.data)
    built = []
    for step in range(4):
        grads = [rand(rng, *p.shape) * np.float32(4.0) for p in eager.params]
        if step == 2:
            grads[0][1, 2] = np.nan
        for p, g in zip(eager.params, grads):
            p.grad = g.copy()
        norm = eager.step(skip_nonfinite=True, grad_scale=4.0)
        for p, g in zip(graphed.params, grads):
            np.copyto(p.grad, g)
        graphed.write_step_scalars(grad_scale=4.0)
        built.append(graphed.prepare_device_step())
        with backend.capturing():
            graphed.step_on_device()
        graphed_norm, applied = graphed.finish_device_step()
        assert applied == (step != 2) and np.array_equal([norm], [graphed_norm], equal_nan=True)
        for a, b in zip(eager.params, graphed.params):
            assert np.array_equal(a.data, b.data)
    assert eager.step_count == graphed.step_count == 3 and built == [True, False, False, False]
    assert launched == ["adam_norm_partials", "adam_update"] * 8


def test_adam_step_on_device_refuses_stale_tables_while_capturing(emulated_kernels):
    adam = _adam_with_params()
    for p in adam.params:
        p.grad = np.ones_like(p.data)
    with backend.capturing(), pytest.raises(RuntimeError, match="write_step_scalars copies to the device"):
        adam.write_step_scalars()
    adam.write_step_scalars()
    with backend.capturing(), pytest.raises(RuntimeError, match=r"call prepare_device_step\(\) before the capture"):
        adam.step_on_device()
    assert adam.prepare_device_step()
    adam.params[1].grad = np.ones_like(adam.params[1].data)  # a new gradient array: the tables hold the old one
    with backend.capturing(), pytest.raises(RuntimeError, match="keep the gradients in place"):
        adam.step_on_device()
    adam.step_on_device()  # outside a capture it rebuilds them
    assert adam.finish_device_step()[1] and adam.step_count == 1


def training_step(use_kernels, monkeypatch):
    monkeypatch.setenv("TINYFORMER_KERNELS", "1" if use_kernels else "0")
    model = tinyformer.model.nn.Transformer(src_vocab_size=40,
                                            d_model=64, d_ff=96, heads=2, num_layers=1, dropout=0.0, seed=3)
    adam = Adam(model.parameters(), lr=1e-3)
    src = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
    tgt_in = np.array([[2, 11, 12, 13], [2, 14, 15, 0]])
    tgt_out = np.array([[11, 12, 13, 3], [14, 15, 3, 0]])
    logits = model(src, tgt_in)
    loss = F.cross_entropy(logits, tgt_out, 0.1, ignore_index=0)
    loss.backward()
    grads = {name: p.grad.copy() for name, p in model.named_parameters()}
    adam.step()
    return loss.item(), grads, {name: p.data.copy() for name, p in model.named_parameters()}


def test_training_step_with_kernels_equals_the_reference_step(emulated_kernels, monkeypatch):
    loss_ref, grads_ref, params_ref = training_step(False, monkeypatch)
    loss_kernel, grads_kernel, params_kernel = training_step(True, monkeypatch)
    assert loss_kernel == pytest.approx(loss_ref, rel=1e-5)
    for name in grads_ref:
        np.testing.assert_allclose(grads_kernel[name], grads_ref[name], rtol=1e-3, atol=1e-6)
        # The key projections' bias has a zero gradient in exact arithmetic (a shift of every
        # key adds the same q·b to a query's scores); Adam turns its rounding noise into ±lr
        # steps, so its update is compared only where the gradient is not noise.
        if np.abs(grads_ref[name]).max() > 1e-6:
            np.testing.assert_allclose(params_kernel[name], params_ref[name], rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------ on the GPU only
@devices.needs_gpu
def test_adam_step_captured_in_a_cuda_graph_replays_as_the_eager_step():
    """Adam.step_on_device captured once (backend.GraphCapture) and replayed with new gradients
    and scalars each step: bit for bit the eager kernel steps, a skipped step included."""
    import cupy

    capture = backend.GraphCapture()  # on a usable GPU, CaptureUnavailable here is a failure, not a skip
    rng = np.random.default_rng(0)
    start = [rand(rng, 300, 70), rand(rng, 70000), rand(rng, 7)]
    eager, graphed = (Adam([Tensor(cupy.asarray(a), requires_grad=True) for a in start], lr=1e-3, max_grad_norm=50.0)
                      for _ in range(2))
    for p in graphed.params:
        p.grad = cupy.zeros_like(p.data)
    graph = None
    for step in range(4):
        grads = [cupy.asarray(rand(rng, *a.shape)) for a in start]
        if step == 2:
            grads[1][5] = cupy.inf
        for p, g in zip(eager.params, grads):
            p.grad = g.copy()
        norm = eager.step(skip_nonfinite=True)
        for p, g in zip(graphed.params, grads):
            p.grad[...] = g
        graphed.write_step_scalars()
        graphed.prepare_device_step()
        capture.begin()
        if graph is None:
            graph = capture.capture(graphed.step_on_device)
        capture.replay(graph)
        capture.end()
        graphed_norm, applied = graphed.finish_device_step()
        assert applied == (step != 2) and np.array_equal([graphed_norm], [norm])
        for a, b in zip(eager.params, graphed.params):
            assert bool((a.data == b.data).all())
    assert eager.step_count == graphed.step_count == 3


@devices.needs_gpu
def test_global_gradient_norm_and_clipping_on_the_gpu_equal_the_cpu():
    import cupy

    from tinyformer.model.nn import Parameter
    from tinyformer.model.optim import clip_grad_norm

    rng = np.random.default_rng(5)
    grads = [rand(rng, 300, 7), rand(rng, 11), np.full(4, 1e20, np.float32)]  # the last overflows float32
    cpu, gpu = ([Parameter(np.zeros_like(g)) for g in grads] for _ in range(2))
    for p_cpu, p_gpu, g in zip(cpu, gpu, grads):
        p_cpu.grad, p_gpu.grad = g.copy(), cupy.asarray(g)
    assert clip_grad_norm(gpu, 1.0) == pytest.approx(clip_grad_norm(cpu, 1.0), rel=1e-6)
    for p_cpu, p_gpu in zip(cpu, gpu):
        np.testing.assert_allclose(cupy.asnumpy(p_gpu.grad), p_cpu.grad, rtol=1e-6)


@devices.needs_gpu
def test_unsupported_head_dim_falls_back_to_the_reference_and_ops_refuse_it():
    import cupy

    rng = np.random.default_rng(0)
    q = Tensor(cupy.asarray(rand(rng, 2, 2, 5, 48)), requires_grad=True)
    out = F.scaled_dot_product_attention(q, q, q, causal=True)
    assert not out.grad_fn.uses_kernel
    with pytest.raises(ValueError, match="head dimension 48"):
        attention_kernel.attention_forward(*(q.data.reshape(4, 5, 48),) * 3, 2)
    with pytest.raises(TypeError, match="float64"):
        x = cupy.zeros((1, 4, 64))
        attention_kernel.attention_forward(x, x, x, 1)


def _training_step_on(device):
    model = tinyformer.model.nn.Transformer(src_vocab_size=60,
                                            d_model=128, d_ff=256, heads=2, num_layers=2, dropout=0.0, seed=3)
    model = model.to(device)
    adam = Adam(model.parameters(), lr=1e-3)
    src = np.array([[5, 6, 7, 8, 3, 0], [9, 10, 11, 12, 13, 3]])
    tgt_in = np.array([[2, 11, 12, 13, 0], [2, 14, 15, 16, 17]])
    tgt_out = np.array([[11, 12, 13, 3, 0], [14, 15, 16, 17, 3]])
    logits = model(backend.to_device(src, device), backend.to_device(tgt_in, device))
    loss = F.cross_entropy(logits, backend.to_device(tgt_out, device), 0.1, ignore_index=0)
    loss.backward()
    grads = {n: backend.to_numpy(p.grad) for n, p in model.named_parameters()}
    adam.step()
    return loss.item(), grads


@devices.needs_gpu
def test_a_training_step_on_the_gpu_equals_the_cpu_step():
    loss_cpu, grads_cpu = _training_step_on("cpu")
    loss_gpu, grads_gpu = _training_step_on("cuda")
    assert loss_gpu == pytest.approx(loss_cpu, rel=1e-5)
    for name in grads_cpu:
        np.testing.assert_allclose(grads_gpu[name], grads_cpu[name], rtol=1e-3, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------------ the same under AddressSanitizer
@functools.lru_cache(maxsize=None)
def _libasan():
    cxx = os.environ.get("CXX") or shutil.which("g++")
    out = children.run([cxx, "-print-file-name=libasan.so"], timeout=60).stdout.strip()
    return out if os.path.isabs(out) and os.path.exists(out) else None


# Of engine/kernels/test_mma.py under ASan: the instructions, each kind of attention case once, and the
# changed geometry.
# (the one-hot placements, 2,048 products of the same instruction, check the layout, not memory: not rerun)
TENSOR_CORE_SELECTION = ("follow_the_ptx_layouts and not one_hot or fully_masked_rows_give or dropout_with_the_philox "
                         "or reads_every_layout and fused or attention_follows_a_changed_registry_geometry")


# What reruns under ASan: of this file, every kernel's tests and the training step; of
# engine/kernels/test_mma.py, TENSOR_CORE_SELECTION (one expression for both files). In three parts, so
# that a run on several workers (pytest-xdist) runs them side by side.
SANITIZED_SELECTION = ("(attention_kernel or softmax_kernel or layer_norm_kernel or cross_entropy_kernel or adam_kernel "
                       "or residual_layer_norm_kernel or bias_relu_dropout_kernel or dropout_kernel or "
                       f"kernels_follow_a_changed_registry_geometry or training_step) or {TENSOR_CORE_SELECTION}")
TENSOR_CORE_TESTS = os.path.join(os.path.dirname(__file__), "test_mma.py")
SANITIZED = {
    "attention": (__file__, f"({SANITIZED_SELECTION}) and attention_kernel"),
    "other-kernels": (__file__, f"({SANITIZED_SELECTION}) and not attention_kernel"),
    "tensor-cores": (TENSOR_CORE_TESTS, SANITIZED_SELECTION),
}


def test_the_sanitized_rerun_selects_the_changed_geometry_tests():
    """What skip_where_the_sanitized_rerun_runs_it relies on: each changed-geometry test is in
    the selection of one ASan part (and keyword_selects reads a -k expression as pytest does)."""
    assert keyword_selects(SANITIZED["other-kernels"][1], "test_kernels_follow_a_changed_registry_geometry")
    assert keyword_selects(SANITIZED["tensor-cores"][1], "test_attention_follows_a_changed_registry_geometry")
    assert not keyword_selects(SANITIZED["attention"][1], "test_kernels_follow_a_changed_registry_geometry")
    assert keyword_selects("a and not (b or c)", "x_A_y") and not keyword_selects("a and not (b or c)", "a_c")


@pytest.mark.skipif(os.environ.get("TINYFORMER_EMULATION_SANITIZE") == "1", reason="already under ASan")
@pytest.mark.parametrize("part", SANITIZED)
def test_emulation_under_address_sanitizer(part):
    libasan = _libasan()
    if libasan is None:
        pytest.skip("the C++ compiler has no AddressSanitizer runtime")
    env = dict(TINYFORMER_EMULATION_SANITIZE="1", LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1")
    path, selection = SANITIZED[part]
    result = children.run([children.PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", path,
                           "-k", selection], env=env, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"\b[1-9]\d* passed", result.stdout), result.stdout[-3000:]
