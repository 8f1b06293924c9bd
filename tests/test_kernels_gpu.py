"""The CUDA kernels on a GPU against their NumPy references (skipped without a usable GPU).

The same cases (tinyformer/study/kernel_cases/) run on the CPU through the emulation in
test_kernels_emulation.py; here they run on the real device, in float32, float16 and bfloat16
(tolerances in tinyformer/study/kernel_cases/harness.py), at the lengths where tiling goes wrong
first: 1, 7, 64, 129, 1000.
"""

import mma_probes
import numpy as np
import pytest

import tinyformer
from tinyformer import Tensor
from tinyformer.engine import backend, functional as F
from tinyformer.study import kernel_cases as cases
from tinyformer.study.kernel_cases import Device, rand
from tinyformer.engine.kernels import arguments, attention as attention_kernel, cublas, registry
from tinyformer.engine.kernels import dropout as dropout_kernel
from tinyformer.engine.kernels.philox import philox_uniform
from tinyformer.model.optim import Adam

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not backend.is_gpu_available(), reason="no usable CUDA GPU (cupy.is_available() is false)"),
]
DTYPES = ["float32", "float16", "bfloat16"]
LENGTHS = [1, 7, 64, 129, 1000]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", LENGTHS)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_kernel(dtype, cols, log):
    cases.softmax(Device("cuda", dtype), 37, cols, log, seed=cols).check()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", LENGTHS)
def test_layer_norm_kernel(dtype, cols):
    cases.layer_norm(Device("cuda", dtype), 300, cols, seed=cols).check()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", LENGTHS)
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_bias_relu_dropout_kernel(dtype, cols, p):
    cases.bias_relu_dropout(Device("cuda", dtype), 300, cols, p, seed=cols, rng_seed=cols).check()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", LENGTHS)
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_residual_layer_norm_kernel(dtype, cols, p):
    cases.residual_layer_norm(Device("cuda", dtype), 300, cols, p, seed=cols, rng_seed=cols).check()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 1000, 8000])
@pytest.mark.parametrize("smoothing,ignore_index", [(0.0, None), (0.1, 0)])
def test_cross_entropy_kernel(dtype, vocab, smoothing, ignore_index):
    cases.cross_entropy(Device("cuda", dtype), 129, vocab, smoothing, ignore_index, seed=vocab).check()


def test_fused_adam_kernel():
    cases.adam(Device("cuda"), [(512, 512), (7,), (70000,), (1,)], chunk_size=registry.ADAM_CHUNK).check()


@pytest.mark.parametrize("copy_dtype", [None, "float16", "bfloat16"])
def test_fused_adam_kernel_clips_and_unscales_as_the_reference(copy_dtype):
    cases.adam(Device("cuda"), [(512, 512), (7,), (70000,), (1,)], chunk_size=registry.ADAM_CHUNK,
               copy_dtype=copy_dtype, grad_scale=1024.0, max_grad_norm=100.0).check()


@pytest.mark.parametrize("poison", cases.ADAM_POISONS)
def test_fused_adam_kernel_skips_a_non_finite_step_on_the_device(poison):
    cases.adam_skip(Device("cuda"), [(512, 512), (7,), (70000,)], registry.ADAM_CHUNK, poison,
                    copy_dtype="bfloat16").check()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positions,vocab,cols", [(1, 1, 1), (300, 17, 33), (600, 40, 1100), (4096, 8000, 256)])
def test_embedding_backward_kernel(dtype, positions, vocab, cols):
    cases.embedding(Device("cuda", dtype), positions, vocab, cols, seed=positions).check()


def test_embedding_backward_kernel_repeats_bit_for_bit():
    """No atomics: the same ids and dy give the same bits at every run (CuPy's scatter add does not)."""
    first, second = (cases.embedding(Device("cuda"), 4096, 300, 256, seed=1).check()["grad w"] for _ in range(2))
    np.testing.assert_array_equal(first, second)


CUBLAS_TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.mark.parametrize("dtype", list(CUBLAS_TOLERANCE))
def test_cublas_products_of_every_layout_match_numpy(dtype):
    """kernels.cublas.matmul on the layouts of test_kernels_cublas.py (whose plans the CPU checks):
    the hardware's strided-batched GEMM against NumPy's product of the same rounded values."""
    import cupy

    from test_kernels_cublas import LAYOUTS

    rng = np.random.default_rng(5)
    dev = Device("cuda", dtype) if dtype != "float64" else None

    def r(*shape):  # an array on the GPU in dtype (float64: exact)
        values = rng.standard_normal(shape)
        return cupy.asarray(values) if dev is None else dev.put(values.astype(np.float32))

    def host(x):
        return (backend.to_numpy(x) if dev is None else dev.get(x)).astype(np.float64)

    for layout, make in LAYOUTS.items():
        a, b = make(r)  # the layout's views, of GPU memory
        got = host(cublas.matmul(a, b))
        expected = host(a) @ host(b)
        scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
        np.testing.assert_allclose(got, expected, rtol=0, atol=CUBLAS_TOLERANCE[dtype] * scale * 4, err_msg=layout)


def test_cublas_products_are_captured_and_replayed_bit_for_bit():
    """A linear layer's three products (y = xWᵀ, dx = g W, dW = gᵀx) captured into a CUDA graph and
    replayed on new inputs: the eager products' bits (CuPy's own product cannot be captured)."""
    import cupy

    capture = backend.GraphCapture()
    rng = np.random.default_rng(0)
    x, w, g = (cupy.asarray(rand(rng, *shape)) for shape in ((512, 256), (1024, 256), (512, 1024)))
    outs = {}

    def products():
        outs["y"] = cublas.matmul(x, w.T)
        outs["dx"] = cublas.matmul(g, w)
        outs["dw"] = cublas.matmul(g.T, x)

    products()  # eagerly first, as a new shape's first step is: cuBLAS loads its kernels, the handle is made
    capture.begin()
    graph = capture.capture(products)
    capture.end()
    for _ in range(2):
        for a in (x, w, g):
            a[...] = cupy.asarray(rand(rng, *a.shape))
        capture.begin()
        capture.replay(graph)
        capture.end()
        eager = {"y": cublas.matmul(x, w.T), "dx": cublas.matmul(g, w), "dw": cublas.matmul(g.T, x)}
        for name, value in eager.items():
            assert bool((outs[name] == value).all()), name
        np.testing.assert_allclose(backend.to_numpy(outs["y"]), backend.to_numpy(x) @ backend.to_numpy(w).T,
                                   rtol=1e-4, atol=1e-4)


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


def test_a_device_seed_on_the_gpu_gives_the_mask_of_its_value():
    import cupy

    rng = np.random.default_rng(2)
    x = cupy.asarray(rand(rng, 1000, 33))
    table = cupy.asarray(np.array([5, 2 ** 62 + 9, 11], dtype=np.uint64))
    y, keep = dropout_kernel.dropout_forward(x, 0.3, arguments.DeviceSeed(table, 1))
    y_value, keep_value = dropout_kernel.dropout_forward(x, 0.3, 2 ** 62 + 9)
    assert bool((keep == keep_value).all()) and bool((y == y_value).all())
    q, k, v, g = (cupy.asarray(rand(rng, 2, 3, 70, 64).astype(np.float16)) for _ in range(4))
    by_value = attention_kernel.attention_mma_forward(q, k, v, dropout_p=0.2, seed=11)
    from_table = attention_kernel.attention_mma_forward(q, k, v, dropout_p=0.2, seed=arguments.DeviceSeed(table, 2))
    assert all(bool((a == b).all()) for a, b in zip(by_value, from_table))
    grads = [attention_kernel.attention_mma_backward(q, k, v, *by_value, g, dropout_p=0.2, seed=s)
             for s in (11, arguments.DeviceSeed(table, 2))]
    assert all(bool((a == b).all()) for a, b in zip(*grads))
    with pytest.raises(ValueError, match="must live on the device of the kernel's arrays"):
        dropout_kernel.dropout_forward(x, 0.3, arguments.DeviceSeed(np.zeros(2, np.uint64), 0))


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("dim", [32, 64, 128])
def test_attention_kernel_lengths_and_head_dims(dtype, length, dim):
    cases.attention(Device("cuda", dtype), 2, 3, length, length, dim, rng_seed=length).check()


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_kernel_causal_with_padding_odd_batch_and_heads(dtype):
    cases.attention(Device("cuda", dtype), 5, 3, 129, 129, 64, lengths=[129, 1, 64, 100, 7], causal=True).check()


def test_attention_kernel_fully_masked_rows():
    results = cases.attention(Device("cuda"), 3, 2, 7, 7, 64, lengths=[0, 7, 3]).check()
    o, lse = results["o"], results["lse"]
    assert not o[:2].any() and np.isneginf(lse[:2]).all()


def test_attention_kernel_causal_aligned_with_last_keys():
    cases.attention(Device("cuda"), 2, 2, 7, 1000, 64, lengths=[1000, 500], causal=True).check()


def test_attention_kernel_dropout_matches_the_philox_reference():
    cases.attention(Device("cuda"), 2, 2, 64, 129, 64, lengths=[129, 70], causal=True, dropout_p=0.1, seed=42).check()


def test_attention_kernel_repeated_runs_are_identical():
    import cupy

    rng = np.random.default_rng(0)
    q, k, v, g = (cupy.asarray(rand(rng, 6, 1000, 64)) for _ in range(4))
    runs = []
    for _ in range(2):
        o, lse = attention_kernel.attention_forward(q, k, v, 3, causal=True, dropout_p=0.1, seed=7)
        runs.append((o, lse) + attention_kernel.attention_backward(q, k, v, o, lse, g, 3, causal=True, dropout_p=0.1,
                                                                   seed=7))
    for a, b in zip(*runs):
        assert bool((a == b).all())


# ------------------------------------------------------------------------ tensor cores (attention_mma.cu)
MMA_DTYPES = list(registry.MMA_DTYPES)


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_hardware_mma_ldmatrix_and_cp_async_follow_the_ptx_layouts(dtype):
    mma_probes.instructions(Device("cuda", dtype), seed=3).check()


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_hardware_mma_and_ldmatrix_follow_the_ptx_isas_own_formulas(dtype):
    """Registers packed and unpacked by the ISA's formulas (tests/ptx_layouts.py): the product,
    every one-hot placement, and ldmatrix from scattered rows."""
    dev = Device("cuda", dtype)
    mma_probes.mma_by_the_isa(dev, seed=4).check()
    mma_probes.mma_one_hot(dev).check()
    for seed in range(3):
        mma_probes.ldmatrix_by_the_isa(dev, seed=seed).check()


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


@pytest.mark.parametrize("dtype", MMA_DTYPES)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("dim", registry.HEAD_DIMS)
def test_tensor_core_attention_lengths_and_head_dims(dtype, length, dim):
    cases.attention_mma(Device("cuda", dtype), 2, 3, length, length, dim, rng_seed=length).check()


@pytest.mark.parametrize("dtype", MMA_DTYPES)
@pytest.mark.parametrize("layout", cases.MMA_LAYOUTS)
def test_tensor_core_attention_masks_dropout_and_layouts(dtype, layout):
    dev = Device("cuda", dtype)
    cases.attention_mma(dev, 5, 3, 129, 129, 64, lengths=[129, 1, 64, 100, 0], causal=True, layout=layout).check()
    cases.attention_mma(dev, 2, 2, 64, 129, 128, lengths=[129, 70], causal=True, dropout_p=0.1, seed=42,
                        layout="projection").check()
    cases.attention_mma(dev, 2, 2, 7, 1000, 32, lengths=[1000, 500], causal=True).check()


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 4, 5, 1000, 4099, 1_000_003])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_kernel(dtype, n, p):
    cases.dropout(Device("cuda", dtype), (n,), p, seed=2 ** 62 + n, offset=n % 3, rng_seed=n).check()


def test_dropout_kernel_grid_stride(monkeypatch):
    monkeypatch.setattr(registry, "DROPOUT_MAX_BLOCKS", 3)  # 3 blocks of 256 threads stride over 25,001 groups
    cases.dropout(Device("cuda"), (100_001,), 0.2, seed=17, offset=1).check()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_functional_dropout_on_the_gpu_uses_the_kernel_mask(dtype):
    import cupy

    rng = np.random.default_rng(0)
    x = Tensor(cupy.asarray(rand(rng, 8, 257)).astype(dtype), requires_grad=True)
    g = cupy.asarray(rand(rng, 8, 257)).astype(dtype)
    y = F.dropout(x, 0.3, True, np.random.default_rng(4))
    seed = int(np.random.default_rng(4).integers(2 ** 63))
    keep = cupy.asarray((philox_uniform(seed, 0, np.arange(x.size)) >= np.float32(0.3)).reshape(x.shape))
    scale = np.dtype(dtype).type(1 / 0.7)
    assert y.dtype == np.dtype(dtype)
    assert bool((y.data == x.data * keep * scale).all())
    y.backward(Tensor(g))
    assert bool((x.grad == g * keep * scale).all())


def test_functional_dropout_on_the_gpu_repeats_after_manual_seed():
    import cupy

    x = Tensor(cupy.ones((64, 1000), dtype=cupy.float32))
    runs = []
    for _ in range(2):
        tinyformer.manual_seed(99)
        runs.append([backend.to_numpy(F.dropout(x, 0.1).data != 0) for _ in range(3)])
    for first, second in zip(*runs):
        assert np.array_equal(first, second)
    assert not np.array_equal(runs[0][0], runs[0][1])
    assert abs(runs[0][0].mean() - 0.9) < 0.01


def _training_step(device):
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


def test_a_training_step_on_the_gpu_equals_the_cpu_step():
    loss_cpu, grads_cpu = _training_step("cpu")
    loss_gpu, grads_gpu = _training_step("cuda")
    assert loss_gpu == pytest.approx(loss_cpu, rel=1e-5)
    for name in grads_cpu:
        np.testing.assert_allclose(grads_gpu[name], grads_cpu[name], rtol=1e-3, atol=1e-6, err_msg=name)
