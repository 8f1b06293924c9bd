"""Kernel-versus-reference cases shared by the emulation tests (NumPy arrays: the kernel
source runs on the CPU) and the GPU tests (CuPy arrays: the real kernels).

Each case draws float32 inputs, rounds them to the element type under test, computes the
NumPy reference in float32 from the rounded values, runs the kernel on ``device`` and
compares with the tolerance of that element type:
    float32   rtol 1e-5 (outputs), 1e-4 (gradients: longer sums)
    float16   rtol 2e-3, atol 2e-3   (output rounding 2^-11, accumulation in float32)
    bfloat16  rtol 2e-2, atol 2e-2   (output rounding 2^-8)
"""

import importlib

import numpy as np

from tinyformer import Tensor, backend, functional as F
from tinyformer.kernels import ops
from tinyformer.kernels.philox import philox_uniform
from tinyformer.optim import Adam

TOLERANCE = {"float32": (1e-5, 2e-6), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2)}
GRAD_FACTOR = {"float32": 10.0, "float16": 2.0, "bfloat16": 2.0}


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


class Device:
    """Moves arrays to ``device`` in the element type ``dtype`` and back as float32."""

    def __init__(self, device, dtype="float32"):
        self.device, self.dtype = device, dtype

    def round(self, x):
        """x as the element type would hold it, in float32 (the reference's input)."""
        if self.dtype == "bfloat16":
            return ops.from_bfloat16(ops.to_bfloat16(x))
        return x.astype(self.dtype).astype(np.float32)

    def put(self, x):
        x = backend.to_device(np.ascontiguousarray(x, dtype=np.float32), self.device)
        return ops.to_bfloat16(x) if self.dtype == "bfloat16" else x.astype(self.dtype)

    def get(self, x):
        x = ops.from_bfloat16(x) if self.dtype == "bfloat16" else x
        return backend.to_numpy(x).astype(np.float32)

    @property
    def kernel_dtype(self):
        return "bfloat16" if self.dtype == "bfloat16" else None

    def close(self, actual, expected, gradient=False, atol=None):
        """``atol`` names a case's own floor (cancellation in float32 sums); a half type's
        rounding floor (TOLERANCE) still applies when it is larger."""
        rtol, default_atol = TOLERANCE[self.dtype]
        factor = GRAD_FACTOR[self.dtype] if gradient else 1.0
        atol = default_atol if atol is None else max(atol, default_atol)
        np.testing.assert_allclose(self.get(actual), expected, rtol=rtol * factor, atol=atol * factor)


def reference(fn, inputs, grad_out):
    """Output and input gradients of the reference op for a random upstream gradient."""
    tensors = [Tensor(x, requires_grad=True) for x in inputs]
    out = fn(*tensors)
    out.backward(Tensor(grad_out))
    return out.data, [t.grad for t in tensors]


def softmax_case(dev, rows, cols, log, seed=0):
    rng = np.random.default_rng(seed)
    x, g = dev.round(rand(rng, rows, cols, scale=3.0)), dev.round(rand(rng, rows, cols))
    fn = F.log_softmax if log else F.softmax
    expected, (grad,) = reference(fn, [x], g)
    y = ops.softmax_forward(dev.put(x), log=log, dtype=dev.kernel_dtype)
    dev.close(y, expected)
    # the backward takes the kernel's own y: compare with the reference formula on it
    y32 = dev.get(y)
    expected_grad = g - np.exp(y32) * g.sum(-1, keepdims=True) if log else y32 * (g - (g * y32).sum(-1, keepdims=True))
    dev.close(ops.softmax_backward(y, dev.put(g), log=log, dtype=dev.kernel_dtype), expected_grad, gradient=True)
    if dev.dtype == "float32":
        np.testing.assert_allclose(expected_grad, grad, rtol=1e-4, atol=1e-5)


def layer_norm_case(dev, rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    x = dev.round(rand(rng, rows, cols, scale=2.0) + 1.5)
    w, b, g = dev.round(rand(rng, cols)), dev.round(rand(rng, cols)), dev.round(rand(rng, rows, cols))
    expected, (gx, gw, gb) = reference(lambda x, w, b: F.layer_norm(x, w, b, 1e-5), [x, w, b], g)
    y, mean, rstd = ops.layer_norm_forward(dev.put(x), dev.put(w), dev.put(b), 1e-5, dtype=dev.kernel_dtype)
    dev.close(y, expected, atol=1e-5)
    kx, kw, kb = ops.layer_norm_backward(dev.put(x), dev.put(w), dev.put(g), mean, rstd, rows_per_chunk=16,
                                         dtype=dev.kernel_dtype)
    # r·(g − mean g − x̂·mean(g x̂)) cancels: a few ulp of r·|g|; dw sums over rows
    dev.close(kx, gx, gradient=True, atol=1e-5)
    dev.close(kw, gw, gradient=True, atol=1e-5 * max(1, rows / 16))
    dev.close(kb, gb, gradient=True, atol=1e-5 * max(1, rows / 16))


def cross_entropy_case(dev, rows, vocab, smoothing, ignore_index, seed=0):
    rng = np.random.default_rng(seed)
    logits = dev.round(rand(rng, rows, vocab, scale=4.0))
    target = rng.integers(0, vocab, rows)
    target[: min(2, rows)] = 0  # ignored when ignore_index == 0
    g_loss, g_nll = rand(rng, rows), rand(rng, rows)
    t = Tensor(logits, requires_grad=True)
    loss, nll = F.cross_entropy(t, target, smoothing, ignore_index, reduction="none", return_nll=True)
    ((loss * Tensor(g_loss)).sum() + (nll * Tensor(g_nll)).sum()).backward()
    xp_target = backend.to_device(target, dev.device)
    k_loss, k_nll, lse = ops.cross_entropy_forward(dev.put(logits), xp_target, smoothing, ignore_index,
                                                   dtype=dev.kernel_dtype)
    np.testing.assert_allclose(backend.to_numpy(k_loss), loss.data, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(backend.to_numpy(k_nll), nll.data, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(backend.to_numpy(lse), np.log(np.exp(logits.astype(np.float64)).sum(-1)),
                               rtol=1e-5, atol=2e-5)
    keep = np.ones(rows, bool) if ignore_index is None else target != ignore_index
    gl, gn = (backend.to_device((g * keep).astype(np.float32), dev.device) for g in (g_loss, g_nll))
    grad = ops.cross_entropy_backward(dev.put(logits), xp_target, lse, gl, gn, smoothing, ignore_index,
                                      dtype=dev.kernel_dtype)
    dev.close(grad, t.grad, gradient=True, atol=1e-5)


def adam_case(dev, shapes, chunk_size, steps=3, seed=0):
    """The fused update against optim.Adam's loop (float32 moments and parameters)."""
    rng = np.random.default_rng(seed)
    start = [rand(rng, *s) for s in shapes]
    params_ref = [Tensor(a.copy(), requires_grad=True) for a in start]
    adam_ref = Adam(params_ref, lr=0.01, weight_decay=0.01)
    params = [dev.put(a) for a in start]
    m = [dev.put(np.zeros_like(a)) for a in start]
    v = [dev.put(np.zeros_like(a)) for a in start]
    for t in range(1, steps + 1):
        grads = [rand(rng, *s) for s in shapes]
        for p, g in zip(params_ref, grads):
            p.grad = g.copy()
        adam_ref.step()
        plan = ops.AdamPlan(params, [dev.put(g) for g in grads], m, v, chunk_size=chunk_size)
        ops.adam_update(plan, 0.01 / (1 - 0.9 ** t), 0.9, 0.98, 1 - 0.98 ** t, 1e-9, 0.01)
        for p, r in zip(params, params_ref):
            np.testing.assert_allclose(dev.get(p), r.data, rtol=1e-6, atol=1e-7)
    return plan


def dropout_case(dev, shape, p, seed, offset=0, rng_seed=0):
    """The dropout kernel against its Philox reference: keep_i = philox_uniform(seed, offset, i) >= p
    over the elements in C order, exactly; y = x ∘ keep / (1 − p) (float32: rtol 1e-6). Returns keep."""
    rng = np.random.default_rng(rng_seed)
    x = dev.round(rand(rng, *shape))
    keep_ref = (philox_uniform(seed, offset, np.arange(x.size)) >= np.float32(p)).reshape(x.shape)
    y_ref = np.where(keep_ref, x * np.float32(1.0 / (1.0 - p)), np.float32(0.0))
    y, keep = ops.dropout_forward(dev.put(x), p, seed, offset, dtype=dev.kernel_dtype)
    assert keep.dtype == np.bool_ and keep.shape == x.shape and y.shape == x.shape
    keep = backend.to_numpy(keep)
    np.testing.assert_array_equal(keep, keep_ref)
    if dev.dtype == "float32":
        np.testing.assert_allclose(dev.get(y), y_ref, rtol=1e-6, atol=0)
    else:
        dev.close(y, y_ref)
    return keep


def attention_reference(q, k, v, lengths, causal, g, dropout_p=0.0, seed=0, monkeypatch=None):
    """F.scaled_dot_product_attention on (B, H, L, D); dropout drawn from the kernel's Philox stream."""
    if dropout_p:
        # the NumPy reference draws through uniform_blocks: hand it the kernel's samples instead
        monkeypatch.setattr(importlib.import_module("tinyformer.functional.dropout"), "uniform_blocks",
                            lambda gen, size, fn: fn(0, size, philox_uniform(seed, 0, np.arange(size))))
    mask = None
    if lengths is not None:
        mask = (np.arange(k.shape[2])[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]
    return reference(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, causal, dropout_p), [q, k, v], g)


def attention_case(dev, batch, heads, len_q, len_k, dim, lengths=None, causal=False, dropout_p=0.0, seed=0,
                   monkeypatch=None, rng_seed=0):
    """Forward and backward of the fused kernel against the reference; returns (o, lse) as NumPy."""
    rng = np.random.default_rng(rng_seed)
    q, k, v = (dev.round(rand(rng, batch, heads, n, dim)) for n in (len_q, len_k, len_k))
    g = dev.round(rand(rng, batch, heads, len_q, dim))
    expected, (gq, gk, gv) = attention_reference(q, k, v, lengths, causal, g, dropout_p, seed, monkeypatch)

    def flat(a):
        return dev.put(a.reshape(batch * heads, a.shape[2], dim))

    key_lengths = None if lengths is None else backend.to_device(np.asarray(lengths, np.int32), dev.device)
    args = dict(key_lengths=key_lengths, causal=causal, dropout_p=dropout_p, seed=seed, dtype=dev.kernel_dtype)
    o, lse = ops.attention_forward(flat(q), flat(k), flat(v), heads, **args)
    dev.close(o, expected.reshape(batch * heads, len_q, dim))
    kq, kk, kv = ops.attention_backward(flat(q), flat(k), flat(v), o, lse, flat(g), heads, **args)
    for got, want in ((kq, gq), (kk, gk), (kv, gv)):
        dev.close(got, want.reshape(got.shape), gradient=True, atol=1e-5)
    return dev.get(o), backend.to_numpy(lse)
