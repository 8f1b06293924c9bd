"""What the split tests of ``tinyformer.engine.functional`` share: hypothesis budgets, the comparison,
and the NumPy references used by more than one op's tests."""

import numpy as np
from hypothesis import settings

import tinyformer as tf

FEW = settings(max_examples=20, deadline=None)

SOME = settings(max_examples=30, deadline=None)

MANY = settings(max_examples=40, deadline=None)


def assert_close(actual, expected, rtol=1e-12, atol=1e-13):
    actual = actual.data if isinstance(actual, tf.Tensor) else actual
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def ref_log_softmax(a, axis):
    """x − log Σ exp x, the log-sum-exp by NumPy's own pairwise logaddexp (stable for any x)."""
    return a - np.logaddexp.reduce(a, axis=axis, keepdims=True)


def ref_causal(len_q, len_k):
    keep = np.zeros((len_q, len_k), dtype=bool)
    for i in range(len_q):
        for j in range(len_k):
            keep[i, j] = j <= i + (len_k - len_q)
    return keep


def rng_of(seed):
    return np.random.default_rng(seed)
