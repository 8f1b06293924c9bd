"""F.residual_dropout_layer_norm: the post-LN sublayer connection as one node, the same values,
gradients and generator draws as layer_norm(x + dropout(y))."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import Tensor
from tinyformer.engine import functional as F
from tinyformer.engine.gradcheck import gradcheck


def _inputs(dtype=np.float32, shape=(2, 5, 16), seed=0):
    rng = np.random.default_rng(seed)
    return [Tensor(rng.standard_normal(s).astype(dtype), requires_grad=True)
            for s in (shape, shape, shape[-1:], shape[-1:])]


@pytest.mark.parametrize("p,training", [(0.3, True), (0.3, False), (0.0, True)])
def test_equals_layer_norm_of_x_plus_dropout_of_y_bit_for_bit(p, training):
    g = np.random.default_rng(9).standard_normal((2, 5, 16)).astype(np.float32)
    results = []
    for fused in (True, False):
        x, y, w, b = _inputs()
        generator = np.random.default_rng(4)
        if fused:
            out = F.residual_dropout_layer_norm(x, y, w, b, p, training, generator)
        else:
            out = F.layer_norm(x + F.dropout(y, p, training, generator), w, b)
        out.backward(Tensor(g))
        results.append([out.data, x.grad, y.grad, w.grad, b.grad, generator.random()])
    for fused_value, unfused_value in zip(*results):
        np.testing.assert_array_equal(fused_value, unfused_value)


def test_gradients_pass_central_differences_with_dropout():
    x, y, w, b = (Tensor(t.data.astype(np.float64), requires_grad=True) for t in _inputs(shape=(3, 7)))
    # the same mask at every evaluation: a fresh generator of one seed
    assert gradcheck(lambda x, y, w, b: F.residual_dropout_layer_norm(x, y, w, b, 0.4, True,
                                                                      np.random.default_rng(2)), [x, y, w, b])


def test_only_the_needed_gradients_are_made():
    x, y, w, b = _inputs()
    w.requires_grad = b.requires_grad = False
    out = F.residual_dropout_layer_norm(x, y, w, b, 0.2, True, np.random.default_rng(0))
    out.sum().backward()
    assert x.grad is not None and y.grad is not None and w.grad is None and b.grad is None


def test_the_post_ln_transformer_uses_it_and_trains_as_before(monkeypatch):
    calls = []
    original = F.residual.ResidualDropoutLayerNorm.apply
    monkeypatch.setattr(F.residual.ResidualDropoutLayerNorm, "apply",
                        classmethod(lambda cls, *a, **k: calls.append(1) or original(*a, **k)))
    model = tf.nn.Transformer(src_vocab_size=20, d_model=16, d_ff=32, heads=2, num_layers=1, dropout=0.1, seed=1)
    model(np.array([[4, 5, 6, 2]]), np.array([[1, 7, 8]]))
    assert len(calls) == 5  # encoder: attention, feed-forward; decoder: self, cross, feed-forward


def test_bad_input_is_named():
    x, y, w, b = _inputs()
    with pytest.raises(ValueError, match=r"x \(2, 5, 16\) and y \(2, 5, 15\) must have the same shape"):
        F.residual_dropout_layer_norm(x, Tensor(np.zeros((2, 5, 15), np.float32)), w, b)
    with pytest.raises(ValueError, match="residual_dropout_layer_norm: p"):
        F.residual_dropout_layer_norm(x, y, w, b, 1.5)
    with pytest.raises(TypeError, match="generator"):
        F.residual_dropout_layer_norm(x, y, w, b, 0.1, True, generator=3)
