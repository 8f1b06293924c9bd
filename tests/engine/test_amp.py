"""tinyformer.engine.amp: which op runs in which precision, the compute copies Adam refreshes, every
fused op's float16/bfloat16 forward and gradient against the float64 reference, and a training
step in half precision on the kernels (emulated, and on a GPU) against the NumPy step."""

import devices
import numpy as np
import pytest

import tinyformer as tf
from tinyformer.engine import amp, backend, functional as F
from tinyformer.model import nn
from tinyformer.testing.kernel_cases import GRAD_FACTOR, TOLERANCE
from tinyformer.model.optim import Adam, GradScaler, LossScaleTooSmall

HALF = {"float16": np.dtype(np.float16), "bfloat16": backend.bfloat16}


def rounded(rng, dtype, *shape, scale=1.0):
    """Random values as the half type holds them: (half array, the same values in float64)."""
    half = (rng.standard_normal(shape) * scale).astype(np.float32).astype(HALF[dtype])
    return half, half.astype(np.float64)


def close(actual, expected, dtype, gradient=False):
    rtol, atol = TOLERANCE[dtype]
    factor = GRAD_FACTOR[dtype] if gradient else 1.0
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol * factor, atol=atol * factor)


# Each case: (name, input shapes, fn(*tensors) -> one tensor); the same fn runs on the half inputs
# and on their float64 values (the reference).
CASES = [
    ("softmax", [(4, 9)], lambda x: F.softmax(x)),
    ("log_softmax", [(4, 9)], lambda x: F.log_softmax(x)),
    ("layer_norm", [(3, 4, 16), (16,), (16,)], lambda x, w, b: F.layer_norm(x, w, b)),
    ("linear", [(3, 5, 8), (6, 8), (6,)], lambda x, w, b: F.linear(x, w, b)),
    ("linear_relu", [(3, 5, 8), (6, 8), (6,)], lambda x, w, b: F.linear_relu(x, w, b)),
    ("attention", [(2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)],
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask=F.padding_mask(np.array([[1] * 7, [1] * 4 + [0] * 3]), 0))),
    ("attention_causal", [(2, 2, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8)],
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True)),
    ("cross_entropy", [(3, 4, 11)], lambda z: F.cross_entropy(z, np.arange(12).reshape(3, 4) % 11, label_smoothing=0.1,
                                                             ignore_index=0, reduction="none")),
    ("embedding", [(11, 6)], lambda w: F.embedding(np.array([[1, 3, 3], [0, 10, 2]]), w)),
    ("dropout_eval", [(4, 6)], lambda x: F.dropout(x, 0.3, training=False)),
]


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("name, shapes, fn", CASES, ids=[c[0] for c in CASES])
def test_fused_op_in_half_precision_matches_the_float64_reference(name, shapes, fn, dtype):
    """Outside autocast, half inputs run each op's float32 reference (kernels on the GPU) and come
    back rounded to the half type; forward and input gradients within the type's tolerance
    (kernel_cases.TOLERANCE, gradients × GRAD_FACTOR) of float64 on the same rounded values,
    for a random upstream gradient."""
    rng = np.random.default_rng(len(name))
    pairs = [rounded(rng, dtype, *s) for s in shapes]
    half = [tf.Tensor(h, requires_grad=True) for h, _ in pairs]
    exact = [tf.Tensor(e, requires_grad=True) for _, e in pairs]
    out, reference = fn(*half), fn(*exact)
    assert out.dtype == (np.float32 if name == "cross_entropy" else HALF[dtype])  # the loss stays float32
    close(out.numpy().astype(np.float64), reference.data, dtype)
    upstream = rng.standard_normal(reference.shape)
    out.backward(upstream.astype(out.dtype))
    reference.backward(upstream)
    for h, e in zip(half, exact):
        assert h.grad.dtype == h.dtype
        close(h.grad.astype(np.float64), e.grad, dtype, gradient=True)


def test_autocast_runs_products_in_the_half_type_and_softmax_norm_and_loss_in_float32():
    rng = np.random.default_rng(0)
    x = tf.Tensor(rng.standard_normal((2, 3, 8)).astype(np.float32), requires_grad=True)
    w, b = (nn.Parameter(rng.standard_normal(s).astype(np.float32)) for s in ((8, 8), (8,)))
    for precision, half in (("bf16", backend.bfloat16), ("fp16", np.dtype(np.float16))):
        with amp.autocast(precision):
            assert amp.active_dtype() == half
            y = F.linear(x, w, b)
            assert y.dtype == half
            assert F.softmax(y).dtype == F.log_softmax(y).dtype == np.float32
            assert F.layer_norm(y, b * 0 + 1, b).dtype == np.float32
            q = y.reshape(2, 1, 3, 8)
            assert F.scaled_dot_product_attention(q, q, q).dtype == half
            loss = F.cross_entropy(y, np.array([[1, 2, 3], [4, 5, 6]]))
            assert loss.dtype == np.float32
            (y + x).sum().backward()  # the residual sum promotes to float32, as under torch.autocast
        assert amp.active_dtype() is None
        assert x.grad.dtype == w.grad.dtype == b.grad.dtype == np.float32  # master gradients
        x.grad = w.grad = b.grad = None
    with amp.autocast("fp32"):
        assert amp.active_dtype() is None and F.linear(x, w, b).dtype == np.float32


def test_autocast_restores_the_previous_setting_after_an_exception():
    with pytest.raises(RuntimeError):
        with amp.autocast("bf16"):
            raise RuntimeError
    assert amp.active_dtype() is None
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16, got 'fp8'"):
        amp.get_precision("fp8")


def test_a_model_under_autocast_gives_float32_gradients_close_to_fp32():
    tf.manual_seed(0)
    model = nn.Transformer.from_preset("tiny", vocab_size=23, dropout=0.0)
    rng = np.random.default_rng(0)  # 16 sentences: with fewer, single ReLU units that flip sign dominate
    src, tgt = rng.integers(4, 23, (16, 12)), rng.integers(4, 23, (16, 11))
    grads = {}
    for precision in ("fp32", "bf16", "fp16"):
        model.zero_grad()
        scale = 2.0 ** 16 if precision == "fp16" else 1.0  # fp16's small gradients need the loss scale
        with amp.autocast(precision):
            (F.cross_entropy(model(src, tgt), tgt, label_smoothing=0.1) * scale).backward()
        grads[precision] = [p.grad / np.float32(scale) for p in model.parameters()]
        assert all(g.dtype == np.float32 for g in grads[precision])
    flat = {k: np.concatenate([g.ravel() for g in v]) for k, v in grads.items()}
    for precision, tol in (("bf16", 0.03), ("fp16", 0.01)):  # measured 1.0 % and 0.3 %, of the whole norm
        assert np.linalg.norm(flat[precision] - flat["fp32"]) <= tol * np.linalg.norm(flat["fp32"])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_adam_keeps_float32_masters_and_refreshes_the_compute_copy(precision):
    w = nn.Parameter(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    x = tf.Tensor(np.ones((2, 4), np.float32), requires_grad=True)
    adam = Adam([w], lr=0.1)
    with amp.autocast(precision):
        F.linear(x, w).sum().backward()
    half = amp.PRECISIONS[precision].compute_dtype
    (copy,) = amp.compute_copies([w])
    assert copy.dtype == half and np.array_equal(copy, w.data.astype(half))
    adam.step()
    assert w.data.dtype == adam.m[0].dtype == adam.v[0].dtype == np.float32
    assert amp.compute_copies([x]) == [None]  # a plain tensor is cast at each use, never cached
    (after,) = amp.compute_copies([w])
    assert after is copy and np.array_equal(copy, w.data.astype(half))  # refreshed in place, same array
    with amp.autocast(precision):
        assert amp.compute_copy(w, half) is copy
    w.data = w.data * 2  # a new array (load_state_dict, Module.to): a new copy on the next use
    assert amp.compute_copies([w]) == [None]
    with amp.autocast(precision):
        assert np.array_equal(amp.compute_copy(w, half), w.data.astype(half))


def test_adam_with_a_grad_scale_equals_adam_on_the_unscaled_gradients():
    rng = np.random.default_rng(1)
    start, grad = rng.standard_normal(10).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    a, b = nn.Parameter(start.copy()), nn.Parameter(start.copy())
    plain, scaled = Adam([a], lr=0.01, max_grad_norm=0.5), Adam([b], lr=0.01, max_grad_norm=0.5)
    a.grad, b.grad = grad.copy(), grad * np.float32(1024)
    assert plain.step() == pytest.approx(scaled.step(grad_scale=1024.0), rel=1e-6)
    np.testing.assert_allclose(b.data, a.data, rtol=1e-6, atol=1e-7)


def test_grad_scaler_has_pytorchs_defaults_backs_off_grows_and_stops_at_its_floor():
    scaler = GradScaler()
    assert (scaler.scale, scaler.growth_factor, scaler.backoff_factor, scaler.growth_interval) == (2.0 ** 16, 2.0, 0.5,
                                                                                                   2000)
    scaler = GradScaler(init_scale=8.0, growth_interval=3, min_scale=1.0)
    for _ in range(2):
        scaler.update(overflow=False)
    assert scaler.scale == 8.0
    scaler.update(overflow=False)
    assert scaler.scale == 16.0 and scaler.good_steps == 0  # grown after the interval
    scaler.update(overflow=False)
    scaler.update(overflow=True)
    assert scaler.scale == 8.0 and scaler.good_steps == 0 and scaler.skipped_steps == 1
    state = scaler.state_dict()
    assert GradScaler().load_state_dict(state).state_dict()["scale"] == 8.0
    for _ in range(3):
        scaler.update(overflow=True)
    assert scaler.scale == 1.0
    with pytest.raises(LossScaleTooSmall, match="fell to 0.5, below its floor 1"):
        scaler.update(overflow=True)


def test_grad_scaler_step_skips_an_overflow_without_touching_parameters_or_moments():
    w = nn.Parameter(np.ones(4, np.float32))
    adam = Adam([w], lr=0.1)
    scaler = GradScaler(init_scale=4.0)
    w.grad = np.full(4, 4.0, np.float32)
    norm, overflow = scaler.step(adam)
    assert not overflow and norm == pytest.approx(2.0) and adam.step_count == 1
    before, m, v = w.data.copy(), adam.m[0].copy(), adam.v[0].copy()
    w.grad = np.array([1, np.inf, 1, 1], np.float32)
    norm, overflow = scaler.step(adam)
    assert overflow and scaler.scale == 2.0 and adam.step_count == 1
    assert np.array_equal(w.data, before) and np.array_equal(adam.m[0], m) and np.array_equal(adam.v[0], v)
    disabled = GradScaler(enabled=False)
    assert disabled.scale_loss(3.0) == 3.0


def test_bfloat16_tensors_can_require_grad_and_modules_cast_to_it():
    t = tf.Tensor(np.ones(3, backend.bfloat16), requires_grad=True)
    (t * 2.0).sum().backward()
    assert t.grad.dtype == backend.bfloat16 and t.grad.tolist() == [2.0, 2.0, 2.0]
    layer = nn.Linear(3, 2).to(dtype=backend.bfloat16)
    assert layer.weight.dtype == backend.bfloat16
    assert backend.is_floating(backend.bfloat16) and not backend.is_floating(np.int32)


@devices.needs_gpu
def test_bfloat16_casts_on_the_gpu_equal_numpys():
    """On CuPy the cast is the native one or goes through the bits (``backend.cast``); on NumPy it is
    ml_dtypes' own, so there is nothing to compare on the CPU."""
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    on_gpu = backend.cast(backend.to_device(x, "cuda"), backend.bfloat16)
    assert on_gpu.dtype == backend.bfloat16
    assert np.array_equal(backend.to_numpy(on_gpu).view(np.uint16), x.astype(backend.bfloat16).view(np.uint16))
    back = backend.cast(on_gpu, np.float32)
    assert np.array_equal(backend.to_numpy(back), x.astype(backend.bfloat16).astype(np.float32))


@pytest.mark.parametrize("device", devices.parameters("emulated", "cuda"))
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_kernel_step_in_half_precision_matches_numpys_and_the_fused_adam_writes_the_compute_copies(
        device, precision, request):
    """One step of `tiny` under autocast on the kernels (the CUDA kernels through the CPU emulation, or
    on a GPU) against the same step on NumPy's reference ops; the fused Adam refreshes each product
    weight's half compute copy to its float32 master's rounding."""
    if device == "emulated":
        request.getfixturevalue("cxx_compiler")
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(4, 23, (16, 12)), rng.integers(4, 23, (16, 11))
    results = {}
    for run_on in ("numpy", device):
        array_device = "cuda" if run_on == "cuda" else "cpu"
        with pytest.MonkeyPatch.context() as patch, backend.counting_launches() as launches:
            if run_on == "emulated":
                devices.take_the_kernel_path(patch)
            tf.manual_seed(0)
            model = nn.Transformer.from_preset("tiny", vocab_size=23, dropout=0.0).to(array_device)
            adam = Adam(model.parameters(), lr=1e-3)
            scaler = GradScaler(enabled=amp.get_precision(precision).loss_scaling)
            with amp.autocast(precision):
                loss = F.cross_entropy(model(backend.to_device(src, array_device), backend.to_device(tgt, array_device)),
                                       backend.to_device(tgt, array_device), label_smoothing=0.1)
                scaler.scale_loss(loss).backward()
            norm, overflow = scaler.step(adam)
        assert not overflow
        fused = {"embedding_forward", "cross_entropy_forward", "cross_entropy_backward", "adam_update"}
        assert fused <= set(launches) if run_on != "numpy" else not fused & set(launches)  # the path taken
        half = amp.PRECISIONS[precision].compute_dtype
        copies = amp.compute_copies(model.parameters())
        linear_weights = [(p, c) for p, c in zip(model.parameters(), copies) if c is not None]
        assert linear_weights  # the products' weights have copies, refreshed by the step
        for p, c in linear_weights:
            assert c.dtype == half and p.data.dtype == np.float32
            assert np.array_equal(backend.to_numpy(c).view(np.uint16),
                                  backend.to_numpy(backend.cast(p.data, half)).view(np.uint16))
        results[run_on] = (loss.item(), norm, [backend.to_numpy(p.data) for p in model.parameters()])
    assert results[device][0] == pytest.approx(results["numpy"][0], rel=2e-2)
    assert results[device][1] == pytest.approx(results["numpy"][1], rel=5e-2)
