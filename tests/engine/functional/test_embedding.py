"""embedding (``tinyformer/engine/functional/embedding.py``).

Every forward is compared with a NumPy reference written here from the formula
(not from the implementation), every gradient is checked in float64 by
``tinyformer.engine.gradcheck`` (a random upstream gradient per output); repeated ids
accumulate and bad ids are named.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyformer as tf
from functional_helpers import SOME, assert_close, rng_of
from strategies import leaf, seeds, shapes, uniform
from tinyformer.engine import functional as F


@SOME
@given(ids_shape=shapes(max_dims=3, max_size=12), vocab=st.integers(1, 4), d=st.integers(1, 3),
       seed=seeds)
def test_embedding_matches_indexing_and_gradchecks(ids_shape, vocab, d, seed):
    rng = rng_of(seed)
    ids = rng.integers(0, vocab, ids_shape)  # small vocabularies: repeated ids are common
    w = leaf(uniform(rng, (vocab, d)))
    out = F.embedding(ids, w)
    assert out.shape == ids_shape + (d,) and out.dtype == np.float64
    for idx in np.ndindex(*ids_shape):
        np.testing.assert_array_equal(out.data[idx], w.data[ids[idx]])
    tf.gradcheck(lambda w: F.embedding(ids, w), [w])


def test_embedding_repeated_ids_accumulate():
    ids = np.array([[2, 0, 2], [2, 3, 0]])
    w = leaf(uniform(rng_of(13), (5, 2)))
    g = rng_of(14).standard_normal((2, 3, 2))
    F.embedding(ids, w).backward(g)
    expected = np.zeros((5, 2))
    expected[0] = g[0, 1] + g[1, 2]
    expected[2] = g[0, 0] + g[0, 2] + g[1, 0]
    expected[3] = g[1, 1]  # rows 1 and 4 are never picked: zero
    assert_close(w.grad, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("ids", [np.array([0, 2]), [1, 1], tf.Tensor(np.array([[3, 0]])),
                                 np.array(2), np.array([1, 2], dtype=np.uint8)])
def test_embedding_id_containers(ids):
    w = leaf(uniform(rng_of(15), (4, 3)))
    plain = np.asarray(ids.data if isinstance(ids, tf.Tensor) else ids)
    np.testing.assert_array_equal(F.embedding(ids, w).data, w.data[plain])


@pytest.mark.parametrize("ids, shown", [([0, 5], "from 0 to 5"), ([-1, 2], "from -1 to 2"),
                                        ([[7]], "from 7 to 7")])
def test_embedding_ids_out_of_range(ids, shown):
    with pytest.raises(IndexError, match=rf"embedding: ids must lie in \[0, 5\).*{shown}"):
        F.embedding(np.array(ids), leaf(np.ones((5, 2))))


@pytest.mark.parametrize("ids", [np.array([0.0, 1.0]), [0.5], np.array([True, False])])
def test_embedding_non_integer_ids(ids):
    with pytest.raises(TypeError, match="embedding: ids must be integers"):
        F.embedding(ids, leaf(np.ones((5, 2))))


def test_embedding_weight_must_be_2d():
    with pytest.raises(ValueError, match=r"weight must be 2-D.*\(5,\)"):
        F.embedding(np.array([0]), leaf(np.ones(5)))
