"""layer_norm (``tinyformer/engine/functional/layer_norm.py``).

Every forward is compared with a NumPy reference written here from the formula
(not from the implementation), every gradient is checked in float64 by
``tinyformer.engine.gradcheck`` (a random upstream gradient per output); the biased variance,
eps inside the square root, constant rows and the row-block threads are pinned down.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyformer as tf
from functional_helpers import MANY, assert_close, rng_of
from strategies import distinct, leaf, seeds, shapes, uniform
from tinyformer import Tensor
from tinyformer.engine import backend, functional as F


def ref_layer_norm(a, w, b, eps):
    mu = a.mean(axis=-1, keepdims=True)
    var = ((a - mu) ** 2).mean(axis=-1, keepdims=True)  # biased
    return (a - mu) / np.sqrt(var + eps) * w + b


@MANY
@given(shape=shapes(min_dims=1, max_dims=3, max_size=24), eps=st.sampled_from([1e-5, 0.1, 1.0]),
       seed=seeds)
def test_layer_norm_matches_numpy_and_gradchecks(shape, eps, seed):
    rng = rng_of(seed)
    n = shape[-1]
    a = distinct(rng, shape)  # values 0.25 apart: no row with a near-zero variance
    w, b = uniform(rng, (n,)), uniform(rng, (n,))
    x, wt, bt = leaf(a), leaf(w), leaf(b)
    out = F.layer_norm(x, wt, bt, eps)
    assert out.shape == shape and out.dtype == np.float64
    assert_close(out, ref_layer_norm(a, w, b, eps), rtol=1e-10, atol=1e-12)
    tf.gradcheck(lambda x, w, b: F.layer_norm(x, w, b, eps), [x, wt, bt])


def test_layer_norm_biased_variance_eps_inside_sqrt():
    one, zero = leaf(np.ones(2)), leaf(np.zeros(2))
    # mean 1, biased variance 1: ±1/√(1 + 1); unbiased variance would give ±1/√3, std + eps ±1/2
    assert_close(F.layer_norm(leaf([[0.0, 2.0]]), one, zero, eps=1.0), [[-1 / math.sqrt(2), 1 / math.sqrt(2)]])
    assert_close(F.layer_norm(leaf([[0.0, 2.0]]), one, zero, eps=0.0), [[-1.0, 1.0]])


def test_layer_norm_constant_row_gives_bias():
    x = leaf(np.full((2, 4), 3.5))
    w, b = leaf(uniform(rng_of(5), (4,))), leaf(uniform(rng_of(6), (4,)))
    out = F.layer_norm(x, w, b)
    assert_close(out, np.broadcast_to(b.data, (2, 4)))
    out.backward(np.ones((2, 4)))
    assert np.all(np.isfinite(x.grad)) and np.all(np.isfinite(w.grad))


@pytest.mark.parametrize("w_shape, b_shape", [((3,), (4,)), ((4,), (3,)), ((1, 4), (4,)), ((4,), ())])
def test_layer_norm_wrong_parameter_shape(w_shape, b_shape):
    with pytest.raises(ValueError, match=r"must have shape \(4,\) for 4 features"):
        F.layer_norm(leaf(np.ones((2, 4))), leaf(np.ones(w_shape)), leaf(np.ones(b_shape)))


def test_layer_norm_in_parallel_row_blocks_equals_one_block(monkeypatch, set_threads):
    """Layer norm runs in row blocks on several threads: same values, same gradients."""
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((3, 7, 6)), rng.standard_normal(6), rng.standard_normal(6)
    upstream = rng.standard_normal((3, 7, 6))

    def run(threads):
        set_threads(threads)
        tensors = [Tensor(a.copy(), requires_grad=True) for a in (x, w, b)]
        y = F.layer_norm(*tensors)
        y.backward(Tensor(upstream))
        return [y.data] + [t.grad for t in tensors]

    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    for one, many in zip(run(1), run(4)):
        np.testing.assert_allclose(many, one, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("big", [1e20, 3e38, -3.4e38])
def test_layer_norm_float32_rows_whose_sums_overflow_stay_exact(big):
    """Rows near 1e20 overflow Σ (x − μ)², rows near the float32 maximum overflow the mean and x − μ
    as well: their statistics come from x / max|x|, and match a float64 reference (not the bias)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    x[1] = np.float32(big) * np.array([1.0, -0.5, 0.25, 0.9, -1.0, 0.0], dtype=np.float32)
    x[2] = np.float32(big) * np.array([1.0, 0.99, 0.98, 0.97, 0.96, 0.95], dtype=np.float32)
    w = rng.standard_normal(6).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    leaf = tf.Tensor(x, requires_grad=True)
    y = F.layer_norm(leaf, tf.Tensor(w), tf.Tensor(b))
    g = rng.standard_normal(x.shape).astype(np.float32)
    y.backward(g)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=-1, keepdims=True)
    xhat = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y.data, xhat * w + b, rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(leaf.grad))
    assert not np.allclose(y.data[1], b) and not np.allclose(y.data[2], b)



def test_a_constant_row_of_huge_values_normalises_to_the_bias():
    """σ = 0 with |x| = 1e30: Σ (x − μ)² overflows float32, and in the rescaled statistics eps/s²
    underflows to 0; x̂ is 0 (not 0 · ∞) and r = 1/√eps, the gradient finite (found by the fuzzer)."""
    x = Tensor(np.full((2, 3), 1e30, np.float32), requires_grad=True)
    w, b = Tensor(np.array([1.0, -2.0, 0.5], np.float32)), Tensor(np.array([0.25, 0.0, -1.0], np.float32))
    y = F.layer_norm(x, w, b, 1e-5)
    y.backward(Tensor(np.ones((2, 3), np.float32)))
    np.testing.assert_array_equal(y.data, np.broadcast_to(b.data, (2, 3)))
    assert np.isfinite(x.grad).all()
