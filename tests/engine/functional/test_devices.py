"""Every fused op on every device against the CPU: on CuPy arrays through the CUDA kernels
and, with TINYFORMER_KERNELS=0, through the CuPy reference path. GPU cases skip without a GPU."""

import devices
import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import backend, functional as F

DEVICES = [pytest.param(("cpu", "1"), id="cpu"),
           devices.on_cuda(("cuda", "1"), id="cuda-kernels"),
           devices.on_cuda(("cuda", "0"), id="cuda-reference")]

rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 7, 32)).astype(np.float32)
IDS = np.array([[4, 5, 6, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]])

OPS = {
    "softmax": (lambda x: F.softmax(x), [X]),
    "log_softmax": (lambda x: F.log_softmax(x), [X]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b), [X, X[0, 0, 0] + 1, X[0, 0, 1]]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [X, X[0, 0, :5], X[0, 1, 0, :5]]),
    "embedding": (lambda w: F.embedding(IDS, w), [X[0, :2].reshape(14, 32)]),
    "cross_entropy": (lambda x: F.cross_entropy(x, IDS[:, None, :].repeat(3, 1), 0.1, ignore_index=0,
                                                reduction="none"), [X]),
    "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, F.padding_mask(IDS, 0)), [X, X[::-1], X * 2]),
    "causal_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True), [X, X[::-1], X * 2]),
}


def run(name, device):
    fn, inputs = OPS[name]
    tensors = [Tensor(backend.to_device(x.copy(), device), requires_grad=True) for x in inputs]
    out = fn(*tensors)
    grad = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    out.backward(Tensor(backend.to_device(grad, device)))
    return backend.to_numpy(out.data), [backend.to_numpy(t.grad) for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_fused_op_on_device_matches_the_cpu(name, device, monkeypatch):
    device, kernels = device
    monkeypatch.setenv("TINYFORMER_KERNELS", kernels)
    out_cpu, grads_cpu = run(name, "cpu")
    out, grads = run(name, device)
    np.testing.assert_allclose(out, out_cpu, rtol=1e-5, atol=1e-5)
    for g, g_cpu in zip(grads, grads_cpu):
        np.testing.assert_allclose(g, g_cpu, rtol=1e-4, atol=1e-5)
