"""Every fused op keeps float32 in float32: outputs and gradients of float32 inputs stay
float32 and finite, and agree with central differences at float32 tolerances."""

import numpy as np
import pytest

import tinyformer as tf
from functional_helpers import rng_of
from strategies import uniform
from tinyformer.engine import functional as F


def _f32(rng, shape):
    return tf.Tensor(uniform(rng, shape), requires_grad=True, dtype=np.float32)


FLOAT32_CALLS = {
    "softmax": lambda r: (lambda x: F.softmax(x, axis=0), [_f32(r, (3, 4))]),
    "log_softmax": lambda r: (lambda x: F.log_softmax(x, axis=-1), [_f32(r, (3, 4))]),
    "layer_norm": lambda r: (F.layer_norm, [_f32(r, (2, 3, 4)), _f32(r, (4,)), _f32(r, (4,))]),
    "dropout": lambda r: (lambda x: F.dropout(x, 0.5, True, rng_of(0)), [_f32(r, (3, 4))]),
    "embedding": lambda r: (lambda w: F.embedding(np.array([[0, 2, 2]]), w), [_f32(r, (3, 4))]),
    "linear": lambda r: (F.linear, [_f32(r, (2, 3)), _f32(r, (4, 3)), _f32(r, (4,))]),
    "linear-no-bias": lambda r: (F.linear, [_f32(r, (2, 3)), _f32(r, (4, 3))]),
    "cross_entropy": lambda r: (
        lambda z: F.cross_entropy(z, np.array([[1, -1, 0]]), 0.1, -1, "mean", return_nll=True),
        [_f32(r, (1, 3, 5))]),
    "cross_entropy-none": lambda r: (
        lambda z: F.cross_entropy(z, np.array([1, 0]), reduction="none"), [_f32(r, (2, 5))]),
    "nll_loss": lambda r: (lambda z: F.nll_loss(z, np.array([1, 0]), reduction="sum"),
                           [_f32(r, (2, 5))]),
    "attention": lambda r: (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, F.padding_mask([[1, 0, 1]], 0),
                                                       causal=True, return_weights=True),
        [_f32(r, (1, 2, 3, 4)), _f32(r, (1, 1, 3, 4)), _f32(r, (1, 1, 3, 2))]),
    "attention-dropout": lambda r: (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, generator=rng_of(1)),
        [_f32(r, (2, 3, 4)), _f32(r, (2, 3, 4)), _f32(r, (2, 3, 4))]),
}


@pytest.mark.parametrize("name", FLOAT32_CALLS)
def test_float32_stays_float32(name):
    rng = rng_of(28)
    fn, inputs = FLOAT32_CALLS[name](rng)
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    upstream = []
    for out in outs:
        assert out.dtype == np.float32, name
        assert np.all(np.isfinite(out.data))
        upstream.append(rng.standard_normal(out.shape).astype(np.float32))
    grads = tf.grad(list(outs), inputs, upstream)
    for g, x in zip(grads, inputs):
        assert g.dtype == np.float32 and g.shape == x.shape and np.all(np.isfinite(g))
    # and the float32 gradients agree with central differences at float32 tolerances
    tf.gradcheck(fn, inputs, allow_float32=True)
