"""cross_entropy and nll_loss (``tinyformer/engine/functional/cross_entropy.py``).

Every forward is compared with a NumPy reference written here from the formula
(not from the implementation), every gradient is checked in float64 by
``tinyformer.engine.gradcheck`` (a random upstream gradient per output); label
smoothing, ignored targets, huge logits, bad targets and the row-block threads are pinned down.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyformer as tf
from functional_helpers import FEW, SOME, assert_close, ref_log_softmax, rng_of
from strategies import leaf, seeds, shapes, uniform
from tinyformer import Tensor
from tinyformer.engine import backend, functional as F


def ref_cross_entropy(z, t, eps=0.0, ignore_index=None, reduction="mean"):
    """Per position −Σᵥ qᵥ log pᵥ with q = (1−ε)·onehot(t) + ε/V, ignored positions dropped."""
    vocab = z.shape[-1]
    logp = ref_log_softmax(z, -1)
    keep = np.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
    per = np.zeros(t.shape)
    for idx in np.ndindex(*t.shape):
        if not keep[idx]:
            continue
        q = np.full(vocab, eps / vocab)
        q[t[idx]] += 1.0 - eps
        per[idx] = -np.sum(q * logp[idx])
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / keep.sum() if keep.any() else 0.0


REDUCTIONS = ["mean", "sum", "none"]


@st.composite
def ce_cases(draw):
    batch = draw(shapes(max_dims=2, max_side=4, max_size=8))
    vocab = draw(st.integers(1, 5))
    ignore = draw(st.sampled_from([None, -100, 0]))
    return batch, vocab, ignore


def ce_targets(rng, batch, vocab, ignore):
    t = rng.integers(0, vocab, batch)
    if ignore is not None and ignore < 0:  # an out-of-vocabulary ignore id on some positions
        t = np.where(rng.random(batch) < 0.3, ignore, t)
    return t


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@SOME
@given(case=ce_cases(), seed=seeds)
def test_cross_entropy_matches_formula_and_gradchecks(smoothing, reduction, case, seed):
    batch, vocab, ignore = case
    rng = rng_of(seed)
    z = uniform(rng, batch + (vocab,), -3.0, 3.0)
    t = ce_targets(rng, batch, vocab, ignore)
    logits = leaf(z)
    loss, nll = F.cross_entropy(logits, t, smoothing, ignore, reduction, return_nll=True)
    expected_shape = batch if reduction == "none" else ()
    assert loss.shape == expected_shape and nll.shape == expected_shape
    assert_close(loss, ref_cross_entropy(z, t, smoothing, ignore, reduction))
    assert_close(nll, ref_cross_entropy(z, t, 0.0, ignore, reduction))
    alone = F.cross_entropy(logits, t, smoothing, ignore, reduction)
    assert_close(alone, loss.data, rtol=0, atol=0)
    tf.gradcheck(lambda z: F.cross_entropy(z, t, smoothing, ignore, reduction), [logits])
    tf.gradcheck(lambda z: F.cross_entropy(z, t, smoothing, ignore, reduction, return_nll=True),
                 [logits])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@FEW
@given(case=ce_cases(), seed=seeds)
def test_cross_entropy_gradient_through_nll_alone(reduction, case, seed):
    """return_nll=True but only the nll is used: the loss output gets no gradient at all."""
    batch, vocab, ignore = case
    rng = rng_of(seed)
    logits = leaf(uniform(rng, batch + (vocab,)))
    t = ce_targets(rng, batch, vocab, ignore)
    tf.gradcheck(lambda z: F.cross_entropy(z, t, 0.2, ignore, reduction, return_nll=True)[1], [logits])
    tf.gradcheck(lambda z: F.cross_entropy(z, t, 0.2, ignore, reduction, return_nll=True)[0], [logits])


def test_cross_entropy_hand_computed():
    z = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    t = np.array([0, 2])
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    nll = -np.array([logp[0, 0], logp[1, 2]])
    assert_close(F.cross_entropy(leaf(z), t), nll.mean())
    assert_close(F.cross_entropy(leaf(z), t, reduction="none"), nll)
    assert_close(F.nll_loss(leaf(z), t), nll.mean())
    smoothed = 0.8 * nll - 0.2 / 3 * logp.sum(axis=1)
    assert_close(F.cross_entropy(leaf(z), t, label_smoothing=0.2, reduction="sum"), smoothed.sum())
    # ignoring the second position: the mean is over the first one alone
    assert_close(F.cross_entropy(leaf(z), t, ignore_index=2), nll[0])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@FEW
@given(case=ce_cases(), seed=seeds)
def test_nll_loss_is_minus_log_softmax_at_target(reduction, case, seed):
    batch, vocab, ignore = case
    rng = rng_of(seed)
    z = uniform(rng, batch + (vocab,))
    t = ce_targets(rng, batch, vocab, ignore)
    logits = leaf(z)
    assert_close(F.nll_loss(logits, t, ignore, reduction), ref_cross_entropy(z, t, 0.0, ignore, reduction))
    tf.gradcheck(lambda z: F.nll_loss(z, t, ignore, reduction), [logits])


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_everything_ignored(reduction, smoothing):
    logits = leaf(uniform(rng_of(16), (2, 3, 4)))
    t = np.full((2, 3), -100)
    loss, nll = F.cross_entropy(logits, t, smoothing, -100, reduction, return_nll=True)
    for out in (loss, nll):
        assert np.all(out.data == 0) and out.shape == (() if reduction != "none" else (2, 3))
    tf.backward([loss, nll], [np.ones(loss.shape), np.ones(nll.shape)])
    assert np.all(np.isfinite(logits.grad)) and np.all(logits.grad == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_finite_for_huge_logits(dtype):
    z = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], dtype=dtype)
    logits = tf.Tensor(z, requires_grad=True)
    loss = F.cross_entropy(logits, np.array([1, 2]), label_smoothing=0.1, reduction="none")
    assert loss.dtype == dtype and np.all(np.isfinite(loss.data))
    assert_close(loss, ref_cross_entropy(z.astype(np.float64), np.array([1, 2]), 0.1, None, "none"),
                 rtol=1e-6)
    loss.backward(np.ones(2))
    assert np.all(np.isfinite(logits.grad))


@pytest.mark.parametrize("t_shape", [(3,), (2, 3, 1), (3, 2), ()])
def test_cross_entropy_bad_target_shape(t_shape):
    with pytest.raises(ValueError, match="cross_entropy: target shape") as info:
        F.cross_entropy(leaf(np.ones((2, 3, 4))), np.zeros(t_shape, dtype=int))
    message = str(info.value)
    assert str(t_shape) in message and "(2, 3)" in message and "(2, 3, 4)" in message


@pytest.mark.parametrize("t, ignore", [([0, 4], None), ([-1, 0], None), ([-1, 0], -100), ([5, -100], -100)])
def test_cross_entropy_target_out_of_range(t, ignore):
    with pytest.raises(IndexError, match=r"target ids must lie in \[0, 4\)"):
        F.cross_entropy(leaf(np.ones((2, 4))), np.array(t), ignore_index=ignore)


def test_cross_entropy_bad_arguments():
    logits = leaf(np.ones((2, 4)))
    with pytest.raises(ValueError, match="reduction must be one of.*'avg'"):
        F.cross_entropy(logits, np.array([0, 1]), reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(logits, np.array([0, 1]), label_smoothing=1.5)
    with pytest.raises(TypeError, match="integer class ids"):
        F.cross_entropy(logits, np.array([0.0, 1.0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_in_parallel_row_blocks_equals_one_block(reduction, monkeypatch, set_threads):
    """The vocabulary-wide softmax runs in row blocks on several threads: same values, same gradients."""
    rng = np.random.default_rng(0)
    logits, target = rng.standard_normal((2, 9, 11)), rng.integers(0, 11, (2, 9))
    target[0, :3] = 0
    upstream = rng.standard_normal((2, 9)) if reduction == "none" else rng.standard_normal(())

    def run(threads):
        set_threads(threads)
        x = Tensor(logits.copy(), requires_grad=True)
        loss, nll = F.cross_entropy(x, target, 0.1, ignore_index=0, reduction=reduction, return_nll=True)
        (loss * Tensor(upstream) + nll * Tensor(upstream * 0.5)).sum().backward()
        return loss.data, nll.data, x.grad

    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    for one, many in zip(run(1), run(4)):
        np.testing.assert_allclose(many, one, rtol=1e-12, atol=1e-15)
