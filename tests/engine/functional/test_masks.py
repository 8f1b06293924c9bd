"""causal_mask, padding_mask and sinusoid_table (``tinyformer/engine/functional/masks.py``), each against
a reference written here element by element."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyformer as tf
from functional_helpers import MANY, assert_close, ref_causal
from tinyformer.engine import functional as F


def ref_sinusoid(max_len, d_model):
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(d_model):
            angle = pos / 10000 ** (2 * (i // 2) / d_model)
            table[pos, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return table


@MANY
@given(len_q=st.integers(1, 6), len_k=st.integers(1, 6))
def test_causal_mask_aligns_queries_with_the_last_keys(len_q, len_k):
    mask = F.causal_mask(len_q, len_k)
    assert mask.dtype == bool and mask.shape == (len_q, len_k)
    np.testing.assert_array_equal(mask, ref_causal(len_q, len_k))
    if len_q <= len_k:  # the last query sees every key
        assert mask[-1].all()


def test_causal_mask_square_default():
    np.testing.assert_array_equal(F.causal_mask(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    # two new queries after three cached keys: they see keys 0..3 and 0..4
    np.testing.assert_array_equal(F.causal_mask(2, 5), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


@pytest.mark.parametrize("ids", [np.array([[5, 0, 0], [1, 2, 0]]), [[5, 0, 0], [1, 2, 0]],
                                 tf.Tensor(np.array([[5, 0, 0], [1, 2, 0]]))])
def test_padding_mask(ids):
    mask = F.padding_mask(ids, 0)
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == bool
    np.testing.assert_array_equal(mask[:, 0, 0], [[True, False, False], [True, True, False]])


def test_padding_mask_needs_2d_ids():
    with pytest.raises(ValueError, match=r"padding_mask: ids must be \(batch, len\).*\(3,\)"):
        F.padding_mask(np.array([1, 2, 0]), 0)


@pytest.mark.parametrize("max_len, d_model", [(1, 1), (5, 4), (7, 5), (50, 16)])
def test_sinusoid_table(max_len, d_model):
    table = F.sinusoid_table(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == np.float32
    assert_close(table, ref_sinusoid(max_len, d_model), rtol=1e-6, atol=1e-6)
    exact = F.sinusoid_table(max_len, d_model, dtype=np.float64)
    assert exact.dtype == np.float64
    assert_close(exact, ref_sinusoid(max_len, d_model), rtol=1e-12, atol=1e-12)
    assert_close(exact[0], [0.0 if i % 2 == 0 else 1.0 for i in range(d_model)])


@given(st.lists(st.integers(0, 9), min_size=1, max_size=5), st.integers(0, 3))
def test_key_length_mask_is_the_padding_mask_of_trailing_padding(lengths, extra):
    len_k = max(lengths) + extra
    ids = np.array([[5] * n + [0] * (len_k - n) for n in lengths])
    mask = F.KeyLengthMask(np.array(lengths), len_k)
    np.testing.assert_array_equal(mask.mask, F.padding_mask(ids, 0))
    assert mask.shape == (len(lengths), 1, 1, len_k) and mask.ndim == 4 and mask.dtype == bool
    assert mask.lengths.dtype == np.int32
    np.testing.assert_array_equal(mask[:1], F.padding_mask(ids, 0)[:1])


def test_key_length_mask_refuses_what_are_not_lengths():
    with pytest.raises(ValueError, match="KeyLengthMask: lengths must be a 1-D integer array, got float64"):
        F.KeyLengthMask(np.ones(3), 4)
    with pytest.raises(ValueError, match="shape \\(2, 2\\)"):
        F.KeyLengthMask(np.ones((2, 2), dtype=int), 4)
