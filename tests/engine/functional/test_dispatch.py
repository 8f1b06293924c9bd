"""The one dispatch rule (``kernels.use_kernels``) and the one pattern (``KernelFunction``) behind
every fused op and Adam's fused step (``tinyformer/engine/functional/_dispatch.py``).

NumPy arrays stand in for CuPy ones (``kernels.on_gpu``, the rule's array check, patched to say
so), and the kernel launchers (``kernels.softmax``, ...) are replaced by recording stand-ins that
compute the NumPy reference: no GPU and no compiler needed. Each op must call its kernels exactly
when the rule and the op's own condition say so, its backward must follow the forward's choice
even when the rule would now answer otherwise, and the kernel path's wiring (reshapes, seeds,
weights, reductions) must give the reference path's values.
"""

import importlib

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import Tensor
from tinyformer.engine import functional as F, kernels
from tinyformer.engine.kernels.philox import philox_uniform
from tinyformer.model.optim import Adam
from tinyformer.model.optim.adam import fused_update

GENERATOR_SEED = 7
KERNEL_SEED = int(np.random.default_rng(GENERATOR_SEED).integers(2 ** 63))  # what the kernel path draws


def generator():
    return np.random.default_rng(GENERATOR_SEED)


def philox_keep(seed, offset, shape, p):
    return (philox_uniform(seed, offset, np.arange(int(np.prod(shape)))) >= np.float32(p)).reshape(shape)


# ------------------------------------------------------------------ reference stand-ins for the kernel launchers
def softmax_forward(x, log=False, dtype=None):
    z = x.astype(np.float64)
    shifted = z - z.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return (log_p if log else np.exp(log_p)).astype(x.dtype)


def softmax_backward(y, grad_y, log=False, dtype=None):
    y64, g = y.astype(np.float64), grad_y.astype(np.float64)
    grad = g - np.exp(y64) * g.sum(-1, keepdims=True) if log else y64 * (g - (g * y64).sum(-1, keepdims=True))
    return grad.astype(y.dtype)


def layer_norm_forward(x, weight, bias, eps=1e-5, dtype=None):
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    mean = rows.mean(axis=-1)
    rstd = 1.0 / np.sqrt(((rows - mean[:, None]) ** 2).mean(axis=-1) + eps)
    y = (rows - mean[:, None]) * rstd[:, None] * weight + bias
    return y.reshape(x.shape).astype(x.dtype), mean.astype(np.float32), rstd.astype(np.float32)


def layer_norm_backward(x, weight, grad_y, mean, rstd, need_input=True, need_params=True, dtype=None,
                        rows_per_chunk=64, grad_weight=None, grad_bias=None):
    n = x.shape[-1]
    rows, g = x.reshape(-1, n).astype(np.float64), grad_y.reshape(-1, n).astype(np.float64)
    xhat = (rows - mean[:, None]) * rstd[:, None]
    grad_x = grad_w = grad_b = None
    if need_input:
        dxhat = g * weight
        grad_x = rstd[:, None] * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
        grad_x = grad_x.reshape(x.shape).astype(x.dtype)
    if need_params:
        grad_w, grad_b = (g * xhat).sum(axis=0).astype(x.dtype), g.sum(axis=0).astype(x.dtype)
        grad_w, grad_b = (s if into is None else np.add(into, s, out=into)
                          for s, into in ((grad_w, grad_weight), (grad_b, grad_bias)))
    return grad_x, grad_w, grad_b


def _log_probabilities(logits, target, ignore_index):
    z = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    t = target.reshape(-1)
    counted = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    return z - lse[:, None], np.where(counted, t, 0), counted, lse


def cross_entropy_forward(logits, target, smoothing=0.0, ignore_index=None, dtype=None):
    log_p, t, counted, lse = _log_probabilities(logits, target, ignore_index)
    nll = -log_p[np.arange(len(t)), t]
    loss = (1 - smoothing) * nll - smoothing / log_p.shape[-1] * log_p.sum(-1)
    return (np.where(counted, loss, 0).astype(np.float32), np.where(counted, nll, 0).astype(np.float32),
            lse.astype(np.float32))


def cross_entropy_forward_reduced(logits, target, smoothing=0.0, ignore_index=None, reduction="sum", dtype=None):
    loss, nll, lse = cross_entropy_forward(logits, target, smoothing, ignore_index)
    counted = _log_probabilities(logits, target, ignore_index)[2]
    scale = np.float32(1.0 / max(counted.sum(), 1) if reduction == "mean" else 1.0)
    loss, nll = (np.array(v.astype(np.float64).sum() * scale, np.float32) for v in (loss, nll))
    return loss, nll, lse, np.array(scale)


def cross_entropy_backward(logits, target, lse, grad_loss, grad_nll, smoothing=0.0, ignore_index=None, dtype=None,
                           scale=None):
    log_p, t, counted, _ = _log_probabilities(logits, target, ignore_index)
    p, vocab = np.exp(log_p), log_p.shape[-1]
    onehot = np.eye(vocab)[t]
    factor = 1.0 if scale is None else float(scale)
    grad_loss, grad_nll = (np.zeros(len(t)) if g is None else  # one value for every row, or one per row
                           np.broadcast_to(np.asarray(g, np.float64).reshape(-1), (len(t),)) * factor
                           for g in (grad_loss, grad_nll))
    grad = (p - (1 - smoothing) * onehot - smoothing / vocab) * grad_loss[:, None] + (p - onehot) * grad_nll[:, None]
    return (grad * counted[:, None]).reshape(logits.shape).astype(logits.dtype)


def dropout_forward(x, p, seed, offset=0, scale=None, dtype=None):
    keep = philox_keep(seed, offset, x.shape, p)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    return (x * keep * x.dtype.type(scale)).astype(x.dtype), keep


def bias_relu_dropout_forward(y, bias, p=0.0, seed=0, offset=0, scale=None, dtype=None):
    keep = philox_keep(seed, offset, y.shape, p) if p else np.ones(y.shape, bool)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    pre = (y + bias).astype(y.dtype)
    mask = (pre > 0) & keep
    y[...] = np.where(mask, pre * y.dtype.type(scale) if p else pre, 0)
    return y, mask


def bias_relu_dropout_backward(grad_z, mask, scale=1.0, dtype=None):
    return (grad_z * mask * grad_z.dtype.type(scale)).astype(grad_z.dtype)


def residual_layer_norm_forward(x, y, weight, bias, p=0.0, seed=0, offset=0, scale=None, eps=1e-5, dtype=None,
                                y_bias=None):
    keep = philox_keep(seed, offset, y.shape, p) if p else np.ones(y.shape, bool)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    y = y if y_bias is None else (y + y_bias).astype(x.dtype)
    h = (x + (y * keep * y.dtype.type(scale) if p else y)).astype(x.dtype)
    out, mean, rstd = layer_norm_forward(h, weight, bias, eps)
    return out, h, keep, mean, rstd


def residual_layer_norm_backward(h, weight, grad_out, mean, rstd, keep, scale=1.0, need_params=True, dtype=None,
                                 grad_y_dtype=None, rows_per_chunk=None, grad_weight=None, grad_bias=None,
                                 need_y_bias=False, grad_y_bias=None):
    grad_h, grad_w, grad_b = layer_norm_backward(h, weight, grad_out, mean, rstd, need_params=need_params,
                                                 grad_weight=grad_weight, grad_bias=grad_bias)
    grad_y = (grad_h * keep * h.dtype.type(scale)).astype(grad_y_dtype or h.dtype)
    if not need_y_bias:
        return grad_h, grad_y, grad_w, grad_b
    sums = grad_y.astype(h.dtype).reshape(-1, h.shape[-1]).sum(0)
    if grad_y_bias is not None:
        grad_y_bias += sums
    return grad_h, grad_y, grad_w, grad_b, sums if grad_y_bias is None else grad_y_bias


def _attention_probabilities(q, k, heads, key_lengths, causal, scale, dropout_p, seed, offset):
    """P (rows with no key: zeros) and the dropout factor D of (batch·heads, len_q, len_k) attention."""
    bh, len_q, dim = q.shape
    len_k = k.shape[1]
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    keep = np.ones((bh, len_q, len_k), bool)
    if key_lengths is not None:
        keep &= np.arange(len_k) < np.repeat(np.asarray(key_lengths), heads)[:, None, None]
    if causal:
        keep &= np.tril(np.ones((len_q, len_k), bool), k=len_k - len_q)
    scores = np.where(keep, q.astype(np.float64) @ k.astype(np.float64).swapaxes(1, 2) * scale, -np.inf)
    top = np.where(keep.any(-1, keepdims=True), scores.max(-1, keepdims=True), 0)
    e = np.exp(scores - top)
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total == 0, 1, total)
    lse = np.where(total[..., 0] == 0, -np.inf, np.log(np.where(total == 0, 1, total))[..., 0] + top[..., 0])
    drop = philox_keep(seed, offset, p.shape, dropout_p) / (1 - dropout_p) if dropout_p else 1.0
    return p, drop, scale, lse


def attention_forward(q, k, v, heads, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                      dtype=None):
    p, drop, _, lse = _attention_probabilities(q, k, heads, key_lengths, causal, scale, dropout_p, seed, offset)
    return ((p * drop) @ v.astype(np.float64)).astype(q.dtype), lse.astype(np.float32)


def attention_backward(q, k, v, o, lse, grad_o, heads, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                       seed=0, offset=0, dtype=None):
    p, drop, scale, _ = _attention_probabilities(q, k, heads, key_lengths, causal, scale, dropout_p, seed, offset)
    q64, k64, v64, g = (a.astype(np.float64) for a in (q, k, v, grad_o))
    dp = (g @ v64.swapaxes(1, 2)) * drop
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    grads = ds @ k64 * scale, ds.swapaxes(1, 2) @ q64 * scale, (p * drop).swapaxes(1, 2) @ g
    return tuple(a.astype(q.dtype) for a in grads)


def _by_heads(a):
    return a.reshape(-1, a.shape[2], a.shape[3])


def _in_projection_layout(flat, batch, heads):
    """(batch·heads, len, d) values as a (batch, heads, len, d) view of a (batch, len, heads, d) array."""
    split = flat.reshape(batch, heads, flat.shape[1], flat.shape[2])
    return np.ascontiguousarray(split.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def attention_mma_forward(q, k, v, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                          dtype=None):
    batch, heads = q.shape[:2]
    o, lse = attention_forward(_by_heads(q), _by_heads(k), _by_heads(v), heads, key_lengths, causal, scale,
                               dropout_p, seed, offset)
    return _in_projection_layout(o, batch, heads), lse


def attention_mma_backward(q, k, v, o, lse, grad_o, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                           seed=0, offset=0, dtype=None):
    batch, heads = q.shape[:2]
    grads = attention_backward(_by_heads(q), _by_heads(k), _by_heads(v), _by_heads(o), lse, _by_heads(grad_o), heads,
                               key_lengths, causal, scale, dropout_p, seed, offset)
    return tuple(_in_projection_layout(g, batch, heads) for g in grads)


def attention_heads_forward(q, k, v, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                            dtype=None):
    return attention_mma_forward(q, k, v, key_lengths, causal, scale, dropout_p, seed, offset)


def attention_heads_backward(q, k, v, o, lse, grad_o, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                             seed=0, offset=0, dtype=None):
    return attention_mma_backward(q, k, v, o, lse, grad_o, key_lengths, causal, scale, dropout_p, seed, offset)


def grad_norm_adam_update(plan, hyper, result, beta1, beta2, eps, weight_decay=0.0, loss=None, dtype=None):
    params, grads, m, v, copies = plan.keep_alive
    fused_update(params, grads, m, v, hyper, result, (beta1, beta2), eps, weight_decay, loss, copies)


STAND_INS = {  # launcher module (tinyformer.engine.kernels.<name>): the stand-ins of its launchers
    "softmax": [softmax_forward, softmax_backward],
    "layer_norm": [layer_norm_forward, layer_norm_backward],
    "cross_entropy": [cross_entropy_forward, cross_entropy_forward_reduced, cross_entropy_backward],
    "dropout": [dropout_forward],
    "residual_layer_norm": [residual_layer_norm_forward, residual_layer_norm_backward],
    "bias_relu_dropout": [bias_relu_dropout_forward, bias_relu_dropout_backward],
    "attention": [attention_forward, attention_backward, attention_heads_forward, attention_heads_backward,
                  attention_mma_forward, attention_mma_backward],
    "adam": [grad_norm_adam_update],
}


@pytest.fixture
def calls(monkeypatch):
    """The kernel entry points replaced by recording reference stand-ins: the names called, in order.

    The reference path's dropout draws the same Philox samples as the kernel path (seed
    ``KERNEL_SEED``), so that both paths' values can be compared with dropout on."""
    called = []

    def recording(stand_in):
        def kernel(*args, **kwargs):
            called.append(stand_in.__name__)
            return stand_in(*args, **kwargs)
        return kernel

    for module, stand_ins in STAND_INS.items():
        for stand_in in stand_ins:
            monkeypatch.setattr(importlib.import_module(f"tinyformer.engine.kernels.{module}"), stand_in.__name__,
                                recording(stand_in))
    def philox_keep(generator, p, keep, fn=None):
        keep[...] = philox_uniform(KERNEL_SEED, 0, np.arange(keep.size)) >= p
        if fn is not None:
            fn(0, keep.size)

    monkeypatch.setattr(importlib.import_module("tinyformer.engine.functional.dropout"), "fill_keep_mask", philox_keep)
    return called


def set_on_gpu(monkeypatch, value):
    """The rule's array check answers ``value`` for every array (NumPy arrays "on the GPU")."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: value)


# ------------------------------------------------------------------ the rule itself
def test_use_kernels_wants_gpu_arrays_of_float32_or_float16_and_the_kernels_on(monkeypatch):
    x = np.zeros(3, np.float32)
    assert not kernels.on_gpu(x) and not kernels.use_kernels(x)  # NumPy arrays are not on the GPU
    set_on_gpu(monkeypatch, True)
    assert kernels.use_kernels(x) and kernels.use_kernels(x.astype(np.float16), x)
    assert not kernels.use_kernels(x.astype(np.float64)) and not kernels.use_kernels(x, x.astype(np.float64))
    monkeypatch.setenv("TINYFORMER_KERNELS", "0")
    assert not kernels.use_kernels(x)
    monkeypatch.setenv("TINYFORMER_KERNELS", "1")
    assert kernels.use_kernels(x)


# ------------------------------------------------------------------ every fused op
rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 5, 32)).astype(np.float32)
W, B = rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
TARGET = rng.integers(0, 32, (2, 3, 5))
TARGET[0, 0] = 0
IDS = np.array([[4, 5, 6, 0, 0], [1, 2, 3, 4, 5]])
PADDING = F.padding_mask(IDS, 0)
HOLES = PADDING.copy()
HOLES[1, 0, 0, 2] = False

SOFTMAX = (["softmax_forward"], ["softmax_backward"])
ATTENTION = (["attention_heads_forward"], ["attention_heads_backward"])  # CUDA cores, heads read in place
TENSOR_CORE_ATTENTION = (["attention_mma_forward"], ["attention_mma_backward"])  # what float16 attention calls


def attend(mask=None, causal=False, dropout_p=0.0, return_weights=False):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, causal, dropout_p, return_weights,
                                                          generator())


# name: (fn, inputs, (forward kernels, backward kernels), whether the op's own condition holds)
CASES = {
    "softmax": (F.softmax, [X], SOFTMAX, True),
    "softmax-axis-0": (lambda x: F.softmax(x, axis=0), [X], SOFTMAX, False),
    "log_softmax": (F.log_softmax, [X], SOFTMAX, True),
    "log_softmax-axis-1": (lambda x: F.log_softmax(x, axis=1), [X], SOFTMAX, False),
    "layer_norm": (F.layer_norm, [X, W, B], (["layer_norm_forward"], ["layer_norm_backward"]), True),
    "cross_entropy": (lambda x: F.cross_entropy(x, TARGET, 0.1, ignore_index=0, return_nll=True), [X],
                      (["cross_entropy_forward_reduced"], ["cross_entropy_backward"]), True),
    "cross_entropy-none": (lambda x: F.cross_entropy(x, TARGET, reduction="none"), [X],
                           (["cross_entropy_forward"], ["cross_entropy_backward"]), True),
    "dropout": (lambda x: F.dropout(x, 0.3, True, generator()), [X], (["dropout_forward"], []), True),
    "residual_layer_norm": (lambda x, y, w, b: F.residual_dropout_layer_norm(x, y, w, b, 0.3, True, generator()),
                            [X, X[::-1] * 0.5, W, B], (["residual_layer_norm_forward"], ["residual_layer_norm_backward"]),
                            True),
    "linear_relu_dropout": (lambda x, w, b: F.linear_relu_dropout(x, w, b, 0.3, True, generator()),
                            [X, np.ones((24, 32), np.float32) * 0.1, B[:24]],
                            (["bias_relu_dropout_forward"], ["bias_relu_dropout_backward"]), True),
    "linear_relu_dropout-no-bias": (lambda x, w: F.linear_relu_dropout(x, w, None, 0.3, True, generator()),
                                    [X, np.ones((24, 32), np.float32) * 0.1], ([], []), False),
    "residual_layer_norm-y-bias": (lambda x, y, w, b, c: F.residual_dropout_layer_norm(x, y, w, b, 0.3, True,
                                                                                    generator(), y_bias=c),
                                   [X, X[::-1] * 0.5, W, B, B[::-1]],
                                   (["residual_layer_norm_forward"], ["residual_layer_norm_backward"]), True),
    "residual_layer_norm-eval": (lambda x, y, w, b: F.residual_dropout_layer_norm(x, y, w, b, 0.3, False), [X, X, W, B],
                                 (["residual_layer_norm_forward"], ["residual_layer_norm_backward"]), True),
    "attention": (attend(), [X, X[::-1], X * 2], ATTENTION, True),
    "attention-padding-causal": (attend(PADDING, causal=True), [X[:, :2], X[:, 1:], X[:, :2]], ATTENTION, True),
    "attention-dropout": (attend(PADDING, dropout_p=0.3), [X[:, :2], X[:, 1:], X[:, :2]], ATTENTION, True),
    "attention-mask-with-holes": (attend(HOLES), [X[:, :2], X[:, 1:], X[:, :2]], ATTENTION, False),
    "attention-full-mask": (attend(rng.random((2, 2, 5, 5)) > 0.3), [X[:, :2]] * 3, ATTENTION, False),
    "attention-return-weights": (attend(PADDING, return_weights=True), [X[:, :2]] * 3, ATTENTION, False),
    "attention-head-dim-12": (attend(), [X[..., :12]] * 3, ATTENTION, False),
    "attention-3d": (attend(), [X[0]] * 3, ATTENTION, False),
    "attention-shared-heads": (attend(), [X, X[:, :1], X[:, :1]], ATTENTION, False),
    "attention-mixed-half": (attend(), [X, X.astype(np.float16), X], ATTENTION, False),
}
# condition: (rule's array check, TINYFORMER_KERNELS, float dtype, whether use_kernels holds)
CONDITIONS = {
    "gpu-float32": (True, "1", np.float32, True),
    "gpu-float16": (True, "1", np.float16, True),
    "gpu-float64": (True, "1", np.float64, False),
    "gpu-kernels-off": (True, "0", np.float32, False),
    "cpu": (False, "1", np.float32, False),
}


def run(name, dtype, between=lambda: None):
    """Outputs, input gradients and the path taken; ``between`` runs after the forward."""
    fn, inputs, _, _ = CASES[name]
    tensors = [Tensor(a.astype(dtype) if a.dtype == np.float32 else a.copy(), requires_grad=True) for a in inputs]
    outs = fn(*tensors)
    outs = outs if isinstance(outs, tuple) else (outs,)
    (uses_kernel,) = {out.grad_fn.uses_kernel for out in outs}
    between()
    upstream = np.random.default_rng(1)
    grads = tf.grad(list(outs), tensors, [upstream.standard_normal(out.shape).astype(out.dtype) for out in outs])
    return [out.data for out in outs], grads, uses_kernel


@pytest.mark.parametrize("condition", CONDITIONS)
@pytest.mark.parametrize("name", CASES)
def test_every_fused_op_takes_its_kernel_exactly_when_the_rule_and_its_condition_say_so(name, condition, calls,
                                                                                       monkeypatch):
    on_gpu, switch, dtype, rule = CONDITIONS[condition]
    _, _, kernel_names, own_condition = CASES[name]
    forward_kernels, backward_kernels = (
        TENSOR_CORE_ATTENTION if kernel_names is ATTENTION and dtype == np.float16 else kernel_names)
    expect_kernel = rule and own_condition
    if name == "attention-mixed-half" and dtype != np.float32:
        pytest.skip("mixed float32 and float16 inputs are this case; under another dtype they agree")
    monkeypatch.setenv("TINYFORMER_KERNELS", switch)
    want_out, want_grads, _ = run(name, dtype)  # NumPy arrays, not on the GPU: the reference
    assert calls == []
    set_on_gpu(monkeypatch, on_gpu)
    out, grads, uses_kernel = run(name, dtype, between=lambda: set_on_gpu(monkeypatch, not on_gpu))
    assert uses_kernel == expect_kernel
    assert calls == (forward_kernels + backward_kernels if expect_kernel else [])
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-5)
    for got, want in zip(out + grads, want_out + want_grads):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tolerance)


# ------------------------------------------------------------------ Adam
def adam_run(dtypes, with_grads=(True, True, True), steps=2):
    params = [Tensor(np.linspace(-1, 1, 12).reshape(3, 4).astype(d) * (i + 1), requires_grad=True)
              for i, d in enumerate(dtypes)]
    adam = Adam(params, lr=0.01, weight_decay=0.01)
    for step in range(steps):
        for i, (p, has_grad) in enumerate(zip(params, with_grads)):
            p.grad = (np.cos(p.data * (step + 2) + i) if has_grad else None)
            p.grad = None if p.grad is None else p.grad.astype(p.data.dtype)
        adam.step()
    return [p.data for p in params]


ADAM_CASES = {  # name: (parameter dtypes, which have a gradient, whether the fused step may run)
    "float32": ((np.float32,) * 3, (True, True, True), True),
    "float16": ((np.float16,) * 3, (True, True, True), True),
    "one-without-gradient": ((np.float32,) * 3, (True, False, True), True),
    "float64": ((np.float64,) * 3, (True, True, True), False),
    "mixed-float32-float16": ((np.float32, np.float16, np.float32), (True, True, True), False),
    "no-gradient-at-all": ((np.float32,) * 3, (False, False, False), False),
}


@pytest.mark.parametrize("condition", ["gpu", "gpu-kernels-off", "cpu"])
@pytest.mark.parametrize("name", ADAM_CASES)
def test_adam_takes_its_fused_step_exactly_when_the_rule_says_so(name, condition, calls, monkeypatch):
    dtypes, with_grads, fusable = ADAM_CASES[name]
    want = adam_run(dtypes, with_grads)
    monkeypatch.setenv("TINYFORMER_KERNELS", "0" if condition == "gpu-kernels-off" else "1")
    set_on_gpu(monkeypatch, condition != "cpu")
    got = adam_run(dtypes, with_grads)
    assert calls == (["grad_norm_adam_update"] * 2 if fusable and condition == "gpu" else [])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-3 if g.dtype == np.float16
                                   else 1e-6, atol=1e-3 if g.dtype == np.float16 else 1e-7)


# ------------------------------------------------------------------ the pattern
def test_every_op_with_a_kernel_follows_the_pattern():
    """Each Function of functional that calls a kernel is a KernelFunction with all four paths."""
    with_kernels = {F.Softmax, F.LogSoftmax, F.LayerNorm, F.CrossEntropy, F.Dropout, F.ScaledDotProductAttention,
                    F.ResidualDropoutLayerNorm, F.LinearReluDropout, F.EmbeddingInput}
    for op in with_kernels:
        assert issubclass(op, F.KernelFunction), op
        for path in ("kernel_applies", "forward_reference", "forward_kernel", "backward_reference", "backward_kernel"):
            assert getattr(op, path) is not getattr(F.KernelFunction, path), (op, path)
    assert not issubclass(F.Linear, F.KernelFunction) and not issubclass(F.Embedding, F.KernelFunction)
