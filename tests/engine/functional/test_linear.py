"""linear and linear_relu (``tinyformer/engine/functional/linear.py``).

Every forward is compared with a NumPy reference written here from the formula
(not from the implementation), every gradient is checked in float64 by
``tinyformer.engine.gradcheck`` (a random upstream gradient per output); linear_relu
equals linear followed by relu bit for bit.
"""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import tinyformer as tf
from functional_helpers import SOME, assert_close, rng_of
from strategies import leaf, seeds, shapes, uniform
from tinyformer import Tensor
from tinyformer.engine import backend, functional as F


@pytest.mark.parametrize("op, activation", [(F.linear, lambda z: z), (F.linear_relu, lambda z: np.maximum(z, 0))],
                         ids=["linear", "linear_relu"])
@SOME
@given(batch=shapes(max_dims=2, max_side=3), n_in=st.integers(1, 4), n_out=st.integers(1, 4),
       bias=st.booleans(), seed=seeds)
def test_linear_matches_numpy_and_gradchecks(op, activation, batch, n_in, n_out, bias, seed):
    rng = rng_of(seed)
    a, w, b = uniform(rng, batch + (n_in,)), uniform(rng, (n_out, n_in)), uniform(rng, (n_out,))
    pre = np.einsum("...i,oi->...o", a, w) + (b if bias else 0)
    if op is F.linear_relu:
        assume(np.abs(pre).min(initial=1.0) > 1e-3)  # central differences must not straddle the kink
    inputs = [leaf(a), leaf(w), leaf(b)] if bias else [leaf(a), leaf(w)]
    out = op(*inputs)
    assert out.shape == batch + (n_out,) and out.dtype == np.float64
    assert_close(out, activation(pre))
    tf.gradcheck(op, inputs)


@pytest.mark.parametrize("threads", [1, 2])
def test_linear_relu_is_linear_then_relu_bit_for_bit(threads, monkeypatch, set_threads):
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 16)
    set_threads(threads)
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((5, 7, 6), (9, 6), (9,)))
    g = rng.standard_normal((5, 7, 9)).astype(np.float32)
    results = []
    for fused in (True, False):
        inputs = [Tensor(a, requires_grad=True) for a in (x, w, b)]
        out = F.linear_relu(*inputs) if fused else F.linear(*inputs).relu()
        out.backward(Tensor(g))
        results.append([out.data] + [t.grad for t in inputs])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


def test_linear_feature_mismatch():
    with pytest.raises(ValueError, match="input has 3 features but weight expects 4"):
        F.linear(leaf(np.ones((2, 3))), leaf(np.ones((5, 4))))



@pytest.mark.parametrize("p,training", [(0.3, True), (0.3, False), (0.0, True)])
def test_linear_relu_dropout_equals_dropout_of_linear_relu_bit_for_bit(p, training):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 8), (12, 8), (12,), (2, 5, 12))]
    results = []
    for fused in (True, False):
        x, w, b = (Tensor(a, requires_grad=True) for a in arrays[:3])
        generator = np.random.default_rng(4)
        if fused:
            z = F.linear_relu_dropout(x, w, b, p, training, generator)
        else:
            z = F.dropout(F.linear_relu(x, w, b), p, training, generator)
        z.backward(Tensor(arrays[3]))
        results.append([z.data, x.grad, w.grad, b.grad, generator.random()])
    for fused_value, unfused_value in zip(*results):
        np.testing.assert_array_equal(fused_value, unfused_value)


def test_linear_relu_dropout_gradients_pass_central_differences():
    from tinyformer.engine.gradcheck import gradcheck

    rng = np.random.default_rng(5)
    x, w, b = (Tensor(rng.standard_normal(s), requires_grad=True) for s in ((3, 6), (5, 6), (5,)))
    assert gradcheck(lambda x, w, b: F.linear_relu_dropout(x, w, b, 0.4, True, np.random.default_rng(1)), [x, w, b])


def test_linear_relu_dropout_names_bad_input():
    x, w = Tensor(np.zeros((2, 6), np.float32)), Tensor(np.zeros((5, 7), np.float32))
    with pytest.raises(ValueError, match="input has 6 features but weight expects 7"):
        F.linear_relu_dropout(x, w, None, 0.1)
    with pytest.raises(ValueError, match="linear_relu_dropout: p"):
        F.linear_relu_dropout(x, Tensor(np.zeros((5, 6), np.float32)), None, -0.1)
