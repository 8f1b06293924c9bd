"""dropout (``tinyformer/engine/functional/dropout.py``): the mask and its scale, seeded repeatability,
the default generator, the gradient (checked in float64 by ``tinyformer.engine.gradcheck``) and the
block-threaded draw.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyformer as tf
import tinyformer.engine.random as tf_random
from functional_helpers import FEW, assert_close, rng_of
from strategies import leaf, seeds, shapes, uniform
from tinyformer import Tensor
from tinyformer.engine import backend, functional as F


def test_dropout_identity_in_eval_and_at_zero():
    x = leaf(uniform(rng_of(7), (3, 4)))
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0, training=True) is x
    assert F.dropout(x, 0, training=True, generator=rng_of(0)) is x


@pytest.mark.parametrize("p", [0.1, 0.3, 0.9])
def test_dropout_mask_scale_and_repeatability(p):
    a = uniform(rng_of(8), (6, 7)) + 5.0  # no zeros in the input
    y1 = F.dropout(leaf(a), p, True, rng_of(11)).data
    y2 = F.dropout(leaf(a), p, True, rng_of(11)).data
    np.testing.assert_array_equal(y1, y2)
    kept = y1 != 0
    assert_close(y1[kept], a[kept] / (1 - p))
    assert np.all(y1[~kept] == 0)
    # a generator advances: a second draw from the same one gives another mask
    gen = rng_of(11)
    first, second = (F.dropout(leaf(a), p, True, gen).data != 0 for _ in range(2))
    assert np.any(first != second)


def test_dropout_default_generator_follows_manual_seed(monkeypatch):
    monkeypatch.setattr(tf_random, "_default", tf_random._default)  # restored after the test
    x = leaf(np.ones((20, 20)))
    tf.manual_seed(123)
    y1 = F.dropout(x, 0.5).data
    tf.manual_seed(123)
    y2 = F.dropout(x, 0.5).data
    np.testing.assert_array_equal(y1, y2)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_drops_about_p(p):
    y = F.dropout(tf.Tensor(np.ones(200_000)), p, True, rng_of(12)).data
    assert abs(np.mean(y == 0) - p) < 0.01
    assert abs(y.mean() - 1.0) < 0.02  # inverted dropout keeps the expectation


@FEW
@given(shape=shapes(min_dims=1, max_size=24), p=st.sampled_from([0.2, 0.5]), seed=seeds)
def test_dropout_gradient_is_the_scaled_mask(shape, p, seed):
    rng = rng_of(seed)
    x = leaf(uniform(rng, shape))
    scale = F.dropout(leaf(np.ones(shape)), p, True, rng_of(seed)).data  # mask / (1 − p)
    assert set(np.unique(scale)) <= {0.0, 1 / (1 - p)}
    y = F.dropout(x, p, True, rng_of(seed))
    assert_close(y, x.data * scale)
    g = rng.standard_normal(shape)
    y.backward(g)
    assert_close(x.grad, g * scale)
    tf.gradcheck(lambda x: F.dropout(x, p, True, rng_of(seed)), [x])


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_probability_out_of_range(p):
    with pytest.raises(ValueError, match=r"dropout: p must be a probability in \[0, 1\)"):
        F.dropout(leaf(np.ones(3)), p)
    with pytest.raises(ValueError, match=r"dropout: p must be a probability"):
        F.dropout(leaf(np.ones(3)), p, training=False)  # checked in eval mode too


def test_dropout_accepts_numpy_float32_probability():
    y = F.dropout(leaf(np.ones(10)), np.float32(0.5), True, rng_of(0))
    assert set(np.unique(y.data)) <= {0.0, 2.0}


def test_dropout_in_parallel_blocks_equals_one_block(monkeypatch, set_threads):
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    x = np.random.default_rng(2).standard_normal((4, 5, 3))
    results = []
    for threads in (1, 3):
        set_threads(threads)
        t = Tensor(x.copy(), requires_grad=True)
        y = F.dropout(t, 0.4, True, np.random.default_rng(7))
        y.backward(Tensor(np.ones_like(x) * 2.0))
        results.append((y.data, t.grad))
    for one, many in zip(*results):
        np.testing.assert_array_equal(many, one)
