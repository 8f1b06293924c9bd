"""Gradients added where they belong by the product that makes them (``autograd.GradTarget``):
a weight's dW and a bias's db into the parameter's ``.grad``, dx into the gradient already gathered
for x, through a parameter's compute copy and an autocast cast, with the same values (bit for bit in
float32) as the path that returns arrays and adds them, and without the adds' launches."""

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import amp, backend, functional as F
from tinyformer.engine.functional.linear import Linear
from tinyformer.engine.kernels import cublas
from tinyformer.model.nn import Parameter


def returned_arrays_only(monkeypatch):
    """The engine as it was: no Function takes a target (every gradient returned and added)."""
    monkeypatch.setattr(Linear, "accepts_grad_targets", False)


def layer(seed=0, rows=6, width=5, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((rows, width)).astype(dtype), requires_grad=True)
    weights = [Tensor(rng.standard_normal((width, width)).astype(dtype), requires_grad=True) for _ in range(3)]
    biases = [Tensor(rng.standard_normal(width).astype(dtype), requires_grad=True) for _ in range(3)]
    upstream = rng.standard_normal((rows, width)).astype(dtype)
    return x, weights, biases, upstream


def run(x, weights, biases, upstream):
    """h = x·1.5 used by a residual sum and three products, as a block's input is by its queries,
    keys, values and the residual connection."""
    h = x * 1.5
    out = h
    for w, b in zip(weights, biases):
        out = out + F.linear(h, w, b)
    (out * Tensor(upstream)).sum().backward()
    return [t.grad.copy() for t in (x, *weights, *biases)]


def test_the_products_add_into_the_gradients_with_the_values_of_returned_arrays(monkeypatch):
    with_targets = run(*layer())
    returned_arrays_only(monkeypatch)
    without = run(*layer())
    for got, expected in zip(with_targets, without):
        np.testing.assert_array_equal(got, expected)  # float32, the same sums in the same order


def test_a_gradient_buffer_kept_between_steps_is_added_into_not_replaced():
    x, weights, biases, upstream = layer()
    buffers = [np.full(t.shape, 2.0, dtype=np.float32) for t in (*weights, *biases)]
    for t, buffer in zip((*weights, *biases), buffers):
        t.grad = buffer
    first = run(x, weights, biases, upstream)
    for t, buffer, grad in zip((*weights, *biases), buffers, first[1:]):
        assert t.grad is buffer  # written in place: a CUDA graph's gradient views stay valid
    fresh = run(*layer())
    for grad, plain in zip(first[1:], fresh[1:]):
        np.testing.assert_allclose(grad, plain + 2.0, rtol=1e-6, atol=1e-6)


def test_a_leaf_used_twice_or_seen_by_a_hook_gets_its_gradient_the_usual_way():
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    w = Tensor(rng.standard_normal((3, 3)).astype(np.float32), requires_grad=True)
    seen = []
    w.register_hook(lambda g: seen.append(g.copy()))
    (F.linear(x, w) + F.linear(x, w)).sum().backward()  # tied: two uses
    assert len(seen) == 1
    np.testing.assert_allclose(w.grad, seen[0])
    np.testing.assert_allclose(w.grad, 2 * np.ones((4, 3), np.float32).T @ x.data, rtol=1e-6)


def test_an_array_handed_to_two_inputs_is_never_added_into():
    """Add's backward hands the same array to both operands: adding x's later gradient (the
    product's dx) into it would change the leaf y's gradient too."""
    rng = np.random.default_rng(2)
    a, y = (Tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True) for _ in range(2))
    w = Tensor(rng.standard_normal((3, 3)).astype(np.float32), requires_grad=True)
    x = a * 1.0
    total = F.linear(x, w) + (x + y)  # the backward reaches x + y before the product
    upstream = rng.standard_normal((4, 3)).astype(np.float32)
    (total * Tensor(upstream)).sum().backward()  # a contiguous gradient of its own reaches x + y
    np.testing.assert_array_equal(y.grad, upstream)
    np.testing.assert_allclose(a.grad, upstream + upstream @ w.data, rtol=1e-6)


def test_under_autocast_dw_reaches_the_float32_parameter_unrounded_and_x_is_cast_once():
    x, weights, biases, upstream = layer(rows=8, width=4)
    weights, biases = [[Parameter(t.data) for t in group] for group in (weights, biases)]
    casts = []
    forward = amp.Cast.forward
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(amp.Cast, "forward", lambda self, *a, **k: casts.append(1) or forward(self, *a, **k))
        with amp.autocast("bf16"):
            grads = run(x, weights, biases, upstream)
    assert len(casts) == 1  # h, cast once for its three products
    assert all(g.dtype == np.float32 for g in grads)
    h = x.data * 1.5
    for w, grad in zip(weights, grads[1:4]):
        half = lambda a: backend.cast(backend.cast(a, backend.bfloat16), np.float32)  # noqa: E731
        expected = half(upstream).T @ half(h)  # bf16 operands, float32 product never rounded to bf16
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-5)


def test_matmul_accumulates_into_out_and_half_operands_write_float32():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    out = np.ones((5, 3), np.float32)
    assert cublas.matmul(a, b, out=out, accumulate=True) is out
    np.testing.assert_allclose(out, 1 + a @ b, rtol=1e-6)
    half_a, half_b = backend.cast(a, backend.bfloat16), backend.cast(b, backend.bfloat16)
    product = cublas.matmul(half_a, half_b)
    assert product.dtype == half_a.dtype
    wide = np.zeros((5, 3), np.float32)
    cublas.matmul(half_a, half_b, out=wide, accumulate=True)
    np.testing.assert_array_equal(wide, backend.cast(half_a, np.float32) @ backend.cast(half_b, np.float32))
    with pytest.raises(ValueError, match="accumulate=True needs out="):
        cublas.matmul(a, b, accumulate=True)


def test_column_sums_are_the_bias_gradient():
    g = np.random.default_rng(4).standard_normal((7, 3)).astype(np.float32)
    np.testing.assert_array_equal(cublas.column_sums(g), g.sum(axis=0))
    out = np.full(3, 0.5, np.float32)
    cublas.column_sums(g, out=out, accumulate=True)
    np.testing.assert_array_equal(out, 0.5 + g.sum(axis=0))
    with pytest.raises(ValueError, match="column_sums: a 2-D array expected"):
        cublas.column_sums(g[0])


def counted_backward():
    from emulated_capture import DeviceArray

    x, weights, biases, upstream = layer()
    for t in (x, *weights, *biases):
        t.data = t.data.view(DeviceArray)
        t.grad = np.zeros(t.shape, np.float32).view(DeviceArray)
    h = x * 1.5
    out = (F.linear(h, weights[0], biases[0]) + F.linear(h, weights[1], biases[1])) * Tensor(upstream.view(DeviceArray))
    with backend.capturing(), backend.counting_launches() as launches:
        out.backward(np.ones(out.shape, np.float32).view(DeviceArray))
    return launches


def test_counted_a_linear_backward_adds_nothing_of_its_own(monkeypatch):
    """On emulated device memory with persistent gradients (as the graph step keeps them), two
    linear layers on one input h: their backward is their six products (dx, dW, db each); the five
    adds of the gradients they returned (into the W's and b's .grad, and the two dx summed) are gone."""
    launches = counted_backward()
    returned_arrays_only(monkeypatch)
    before = counted_backward()
    assert launches["cublas_gemm"] == before["cublas_gemm"] == 6
    assert launches["array op: add"] == before["array op: add"] - 5, (dict(launches), dict(before))
