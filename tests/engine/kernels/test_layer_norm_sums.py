"""Layer norm's dw and db summed inside the backward kernels (each block's chunk of rows) and added
into the parameters' gradients by one reduction launch; and the residual kernels reading autocast's
half sublayer output y as it is (the *_mixed kernels), through the CPU emulation."""

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import amp, autograd, backend, kernels
from tinyformer.engine import functional as F
from tinyformer.engine.kernels import launch
from tinyformer.engine.kernels import layer_norm as layer_norm_kernel
from tinyformer.engine.kernels import residual_layer_norm as residual_kernel

pytestmark = pytest.mark.usefixtures("cxx_compiler")  # skipped without g++ or clang++; failed in CI (compilers.py)

HALF = {"bfloat16": backend.bfloat16, "float16": np.dtype(np.float16)}


def _rows(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    x, y, g = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(3))
    w, b = (rng.standard_normal(cols).astype(np.float32) for _ in range(2))
    return x + 1.5, y, w, b, g


def _backwards(x, y, w, b, g, **given):
    """dx, dw, db of layer_norm.cu and dx, dy, dw, db of residual_layer_norm.cu (p 0.3), 5 rows a chunk."""
    copies = {name: array.copy() for name, array in given.items()}  # the residual's, as they were given
    _, mean, rstd = layer_norm_kernel.layer_norm_forward(x, w, b)
    plain = layer_norm_kernel.layer_norm_backward(x, w, g, mean, rstd, rows_per_chunk=5, **given)
    _, h, keep, mean, rstd = residual_kernel.residual_layer_norm_forward(x, y, w, b, 0.3, seed=7)
    fused = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, 1 / 0.7, rows_per_chunk=5,
                                                         **copies)
    return plain, fused


def test_the_chunk_sums_in_shared_memory_and_in_global_memory_give_the_same_bits(monkeypatch):
    """Rows too wide for the block's shared memory keep their sums in the chunk's row of the
    partials: the same terms in the same order, so the same bits; and they match float64."""
    x, y, w, b, g = _rows(23, 40)
    in_shared = _backwards(x, y, w, b, g)
    monkeypatch.setattr(launch, "STATIC_SHARED_LIMIT", 0)
    assert not layer_norm_kernel.ChunkedSums(np, 23, 40).in_shared
    in_partials = _backwards(x, y, w, b, g)
    for got, want in zip(in_partials[0] + in_partials[1], in_shared[0] + in_shared[1]):
        np.testing.assert_array_equal(got, want)
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(in_partials[0][1], (g * xhat).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(in_partials[0][2], g.sum(0), rtol=1e-5, atol=1e-5)


def test_the_reduction_adds_into_the_gradients_it_is_given_and_writes_the_others():
    x, y, w, b, g = _rows(17, 33, seed=1)
    (_, fresh_w, fresh_b), (_, _, fresh_rw, fresh_rb) = _backwards(x, y, w, b, g)
    held = np.linspace(-1, 1, 33).astype(np.float32)
    given = held.copy()
    (_, got_w, got_b), (_, _, got_rw, got_rb) = _backwards(x, y, w, b, g, grad_bias=given)
    assert got_b is given
    np.testing.assert_array_equal(got_b, held + fresh_b)
    np.testing.assert_array_equal(got_rb, held + fresh_rb)
    np.testing.assert_array_equal(got_w, fresh_w)  # not given: written, not added to garbage
    np.testing.assert_array_equal(got_rw, fresh_rw)
    _, mean, rstd = layer_norm_kernel.layer_norm_forward(x, w, b)
    with pytest.raises(ValueError, match=r"layer_norm: grad_weight must be a contiguous float32 array of shape \(33,\)"):
        layer_norm_kernel.layer_norm_backward(x, w, g, mean, rstd, grad_weight=np.zeros(32, np.float32))


@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_the_mixed_kernels_equal_the_float32_kernels_on_y_cast_up_bit_for_bit(dtype, p):
    """x float32 and y half: what the float32 kernels give for y cast up, dy rounded once to y's type
    (the unfused path: a Cast up, the float32 kernels, a Cast of dy down)."""
    x, y, w, b, g = _rows(9, 70, seed=2)
    half = y.astype(HALF[dtype])
    mixed = residual_kernel.residual_layer_norm_forward(x, half, w, b, p, seed=3)
    plain = residual_kernel.residual_layer_norm_forward(x, half.astype(np.float32), w, b, p, seed=3)
    for got, want in zip(mixed, plain):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    _, h, keep, mean, rstd = plain
    scale = 1 / (1 - p)
    got = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, scale, grad_y_dtype=half.dtype)
    want = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, scale)
    assert got[1].dtype == half.dtype and got[0].dtype == np.float32
    np.testing.assert_array_equal(got[1], want[1].astype(half.dtype))
    for got_part, want_part in zip(got[:1] + got[2:], want[:1] + want[2:]):
        np.testing.assert_array_equal(got_part, want_part)
    with pytest.raises(TypeError, match="residual_layer_norm: x is float16 and y float32"):
        residual_kernel.residual_layer_norm_forward(x.astype(np.float16), y, w, b)


def _leaves(rows=6, cols=24, seed=3, y_dtype=np.float32):
    x, y, w, b, g = _rows(rows, cols, seed)
    return [Tensor(a, requires_grad=True) for a in (x, y.astype(y_dtype), w, b)], g


@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize("op", ["layer_norm", "residual"])
def test_dw_and_db_go_into_the_parameters_grad_without_the_engines_add(op, on_gpu, monkeypatch):
    """Held gradients of w and b get this backward's dw, db added by the op itself (the kernel's
    reduction, or the reference adding its row blocks): the engine's store_grad never sees them."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: on_gpu)

    def run(held):
        (x, y, w, b), g = _leaves()
        if held:
            w.grad, b.grad = np.full(24, 0.25, np.float32), np.full(24, -2.0, np.float32)
        out = F.layer_norm(x, w, b) if op == "layer_norm" else F.residual_dropout_layer_norm(x, y, w, b, 0.0)
        assert out.grad_fn.uses_kernel == on_gpu
        out.backward(Tensor(g))
        return w, b

    stored = []
    original = autograd.store_grad
    monkeypatch.setattr(autograd, "store_grad", lambda tensor, grad: stored.append(tensor) or original(tensor, grad))
    fresh_w, fresh_b = run(held=False)
    w, b = run(held=True)
    assert not any(t is w or t is b or t is fresh_w or t is fresh_b for t in stored)
    (x, y, _, _), g = _leaves()
    h = (x.data + y.data if op == "residual" else x.data).astype(np.float64)
    xhat = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(fresh_w.grad, (g * xhat).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fresh_b.grad, g.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.grad, fresh_w.grad + 0.25, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.grad, fresh_b.grad - 2.0, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize("dtype", sorted(HALF))
def test_under_autocast_the_residual_reads_the_half_sublayer_output_without_a_cast(dtype, on_gpu, monkeypatch):
    """y stays the half tensor it is (no Cast node between it and the op), the output and dx are
    float32, dy comes back in y's type; the values are float64's of x + y as float32, within rounding."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: on_gpu)
    (x, y, w, b), g = _leaves(y_dtype=HALF[dtype])
    with amp.autocast("bf16" if dtype == "bfloat16" else "fp16"):
        out = F.residual_dropout_layer_norm(x, y, w, b, 0.0)
    assert out.grad_fn.inputs[1] is y and out.grad_fn.uses_kernel == on_gpu and out.dtype == np.float32
    out.backward(Tensor(g))
    assert y.grad.dtype == y.dtype and x.grad.dtype == np.float32
    exact = [Tensor(t.data.astype(np.float64), requires_grad=True) for t in (x, y, w, b)]
    reference = F.layer_norm(exact[0] + exact[1], exact[2], exact[3])
    reference.backward(Tensor(g.astype(np.float64)))
    np.testing.assert_allclose(out.data, reference.data, rtol=1e-5, atol=1e-5)
    for got, want in zip((x, w, b), (exact[0], exact[2], exact[3])):
        np.testing.assert_allclose(got.grad, want.grad, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y.grad.astype(np.float64), exact[1].grad, rtol=1e-2, atol=1e-2)
