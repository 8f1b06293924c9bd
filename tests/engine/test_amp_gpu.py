"""Mixed precision on the GPU: the same checks as on the CPU, for CuPy arrays and the kernels
(skipped without a usable GPU; benchmarks/gpu_check.sh runs them)."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.engine import amp, backend, functional as F
from tinyformer.model import nn
from tinyformer.model.optim import Adam, GradScaler

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not backend.is_gpu_available(), reason="no usable CUDA GPU (cupy.is_available() is false)")]


def test_bfloat16_casts_on_the_gpu_equal_numpys():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    on_gpu = backend.cast(backend.to_device(x, "cuda"), backend.bfloat16)
    assert on_gpu.dtype == backend.bfloat16
    assert np.array_equal(backend.to_numpy(on_gpu).view(np.uint16), x.astype(backend.bfloat16).view(np.uint16))
    back = backend.cast(on_gpu, np.float32)
    assert np.array_equal(backend.to_numpy(back), x.astype(backend.bfloat16).astype(np.float32))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_gpu_step_in_half_precision_matches_the_cpu_and_the_fused_adam_writes_the_compute_copies(precision):
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(4, 23, (16, 12)), rng.integers(4, 23, (16, 11))
    results = {}
    for device in ("cpu", "cuda"):
        tf.manual_seed(0)
        model = nn.Transformer.from_preset("tiny", vocab_size=23, dropout=0.0).to(device)
        adam = Adam(model.parameters(), lr=1e-3)
        scaler = GradScaler(enabled=amp.get_precision(precision).loss_scaling)
        with amp.autocast(precision):
            loss = F.cross_entropy(model(backend.to_device(src, device), backend.to_device(tgt, device)),
                                   backend.to_device(tgt, device), label_smoothing=0.1)
            scaler.scale_loss(loss).backward()
        norm, overflow = scaler.step(adam)
        assert not overflow
        half = amp.PRECISIONS[precision].compute_dtype
        copies = amp.compute_copies(model.parameters())
        linear_weights = [(p, c) for p, c in zip(model.parameters(), copies) if c is not None]
        assert linear_weights  # the products' weights have copies, refreshed by the step
        for p, c in linear_weights:
            assert c.dtype == half and p.data.dtype == np.float32
            assert np.array_equal(backend.to_numpy(c).view(np.uint16),
                                  backend.to_numpy(backend.cast(p.data, half)).view(np.uint16))
        results[device] = (loss.item(), norm, [backend.to_numpy(p.data) for p in model.parameters()])
    assert results["cuda"][0] == pytest.approx(results["cpu"][0], rel=2e-2)
    assert results["cuda"][1] == pytest.approx(results["cpu"][1], rel=5e-2)
