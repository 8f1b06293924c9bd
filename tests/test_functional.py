"""The fused ops of ``tinyformer.functional``.

Every forward is compared with a NumPy reference written here from the formula
(not from the implementation), every gradient is checked in float64 by
``tinyformer.gradcheck`` (a random upstream gradient per output), and the edge
cases the ops promise to handle (huge logits, fully masked attention rows,
ignored targets, seeded dropout) are pinned down.
"""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tinyformer as tf
import tinyformer.random as tf_random
from strategies import broadcasts_to, distinct, leaf, seeds, shapes, uniform
from tinyformer import Tensor, backend, functional as F

FEW = settings(max_examples=20, deadline=None)
SOME = settings(max_examples=30, deadline=None)
MANY = settings(max_examples=40, deadline=None)


def assert_close(actual, expected, rtol=1e-12, atol=1e-13):
    actual = actual.data if isinstance(actual, tf.Tensor) else actual
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# ============================================================== NumPy references
def ref_softmax(a, axis):
    e = np.exp(a)
    return e / e.sum(axis=axis, keepdims=True)


def ref_log_softmax(a, axis):
    """x − log Σ exp x, the log-sum-exp by NumPy's own pairwise logaddexp (stable for any x)."""
    return a - np.logaddexp.reduce(a, axis=axis, keepdims=True)


def ref_layer_norm(a, w, b, eps):
    mu = a.mean(axis=-1, keepdims=True)
    var = ((a - mu) ** 2).mean(axis=-1, keepdims=True)  # biased
    return (a - mu) / np.sqrt(var + eps) * w + b


def ref_causal(len_q, len_k):
    keep = np.zeros((len_q, len_k), dtype=bool)
    for i in range(len_q):
        for j in range(len_k):
            keep[i, j] = j <= i + (len_k - len_q)
    return keep


def ref_attention(q, k, v, keep=None):
    """softmax(q·kⱼ/√d over the kept keys j) · v, one query row at a time; no kept key: zeros."""
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    lq, d = q.shape[-2:]
    lk, dv = v.shape[-2:]
    q, k, v = (np.broadcast_to(t, batch + t.shape[-2:]) for t in (q, k, v))
    if keep is None:
        keep = np.ones((lq, lk), dtype=bool)
    keep = np.broadcast_to(keep, batch + (lq, lk))
    out = np.zeros(batch + (lq, dv))
    weights = np.zeros(batch + (lq, lk))
    for idx in np.ndindex(*batch):
        for i in range(lq):
            kept = np.flatnonzero(keep[idx + (i,)])
            if kept.size == 0:
                continue
            s = np.array([np.dot(q[idx + (i,)], k[idx + (j,)]) for j in kept]) / math.sqrt(d)
            w = np.exp(s - s.max())
            w /= w.sum()
            weights[idx + (i, slice(None))][kept] = w
            out[idx + (i,)] = sum(wj * v[idx + (j,)] for wj, j in zip(w, kept))
    return out, weights


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


def ref_sinusoid(max_len, d_model):
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(d_model):
            angle = pos / 10000 ** (2 * (i // 2) / d_model)
            table[pos, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return table


def rng_of(seed):
    return np.random.default_rng(seed)


# ============================================================== softmax / log_softmax
SOFTMAXES = {"softmax": (F.softmax, ref_softmax), "log_softmax": (F.log_softmax, ref_log_softmax)}


@pytest.mark.parametrize("name", SOFTMAXES)
@MANY
@given(data=st.data(), seed=seeds)
def test_softmax_matches_numpy_and_gradchecks(name, data, seed):
    op, ref = SOFTMAXES[name]
    shape = data.draw(shapes(min_dims=1, max_size=24), label="shape")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")  # negative axes too
    a = uniform(rng_of(seed), shape, -3.0, 3.0)
    x = leaf(a)
    out = op(x, axis=axis)
    assert out.shape == shape and out.dtype == np.float64
    assert_close(out, ref(a, axis))
    tf.gradcheck(lambda x: op(x, axis=axis), [x])


@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_default_axis_is_last(name):
    op, ref = SOFTMAXES[name]
    a = uniform(rng_of(1), (2, 3, 4))
    assert_close(op(leaf(a)), ref(a, -1))


def test_softmax_rows_sum_to_one_and_log_softmax_is_its_log():
    a = uniform(rng_of(2), (3, 5), -4.0, 4.0)
    p = F.softmax(leaf(a), axis=0).data
    assert_close(p.sum(axis=0), np.ones(5))
    assert_close(np.exp(F.log_softmax(leaf(a), axis=0).data), p)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("magnitude", [1e2, 1e3, 1e4])
@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_finite_for_large_inputs(dtype, magnitude, axis):
    rng = rng_of(3)
    a = rng.uniform(-magnitude, magnitude, (4, 6))
    a[0] = magnitude  # all equal, at the top
    a[1] = -magnitude  # all equal, at the bottom
    a[2, ::2], a[2, 1::2] = magnitude, -magnitude  # extremes side by side
    a = a.astype(dtype)
    exact = ref_log_softmax(a.astype(np.float64), axis)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(a.shape).astype(dtype)
    for name, expected in [("softmax", np.exp(exact)), ("log_softmax", exact)]:
        x = tf.Tensor(a, requires_grad=True)
        out = SOFTMAXES[name][0](x, axis=axis)
        assert out.dtype == dtype
        assert np.all(np.isfinite(out.data)), name
        assert_close(out, expected, **tol)
        out.backward(g)
        assert x.grad.dtype == dtype
        assert np.all(np.isfinite(x.grad)), name


@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_axis_out_of_range_and_scalar(name):
    op = SOFTMAXES[name][0]
    with pytest.raises(ValueError, match="out of range"):
        op(leaf(np.ones((2, 3))), axis=2)
    with pytest.raises(ValueError, match="at least one dimension"):
        op(leaf(np.float64(1.0)))


@pytest.mark.parametrize("axis", [None, (0, 1), (1, 0)])
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_refuses_several_axes_instead_of_picking_one(name, axis):
    op, _ = SOFTMAXES[name]
    with pytest.raises(ValueError, match="axis must be a single int"):
        op(leaf(uniform(rng_of(4), (2, 3))), axis=axis)


# ============================================================== layer norm
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


# ============================================================== dropout
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


# ============================================================== embedding
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


# ============================================================== linear
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
    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 16)
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


# ============================================================== cross entropy / nll
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


# ============================================================== causal / padding masks, sinusoids
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


# ============================================================== attention
MASK_KINDS = ["none", "padding", "full", "square", "broadcast", "empty-row"]


@st.composite
def attention_cases(draw, mask_kinds=MASK_KINDS):
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lq, lk, d, dv = (draw(st.integers(1, 3)) for _ in range(4))
    kv_batch = draw(st.sampled_from([(b, h), (b, 1), (1, h)]))  # k, v shared across heads/batch
    kind = draw(st.sampled_from(mask_kinds))
    causal = draw(st.booleans())
    mask_shape = draw(broadcasts_to((b, h, lq, lk)))
    return dict(b=b, h=h, lq=lq, lk=lk, d=d, dv=dv, kv_batch=kv_batch, kind=kind, causal=causal,
                mask_shape=mask_shape, seed=draw(seeds))


def build_attention(case, dtype=np.float64):
    """(q, k, v leaves, the mask to pass, the keep-mask the reference uses)."""
    rng = rng_of(case["seed"])
    b, h, lq, lk, d, dv = (case[n] for n in ("b", "h", "lq", "lk", "d", "dv"))
    q = leaf(uniform(rng, (b, h, lq, d)), dtype)
    k = leaf(uniform(rng, case["kv_batch"] + (lk, d)), dtype)
    v = leaf(uniform(rng, case["kv_batch"] + (lk, dv)), dtype)
    kind = case["kind"]
    if kind == "none":
        mask = None
    elif kind == "padding":
        mask = F.padding_mask(rng.integers(0, 3, (b, lk)), 0)  # a row of pads masks a whole item
    elif kind == "full":
        mask = rng.random((b, h, lq, lk)) < 0.6
    elif kind == "square":
        mask = rng.random((lq, lk)) < 0.6
    elif kind == "broadcast":
        mask = rng.random(case["mask_shape"]) < 0.6
    else:  # empty-row: one query row of every (batch, head) sees no key at all
        mask = rng.random((b, h, lq, lk)) < 0.8
        mask[..., rng.integers(lq), :] = False
    keep = np.ones((lq, lk), dtype=bool) if mask is None else mask
    if case["causal"]:
        keep = keep & ref_causal(lq, lk)
    return q, k, v, mask, keep


@MANY
@given(case=attention_cases(), return_weights=st.booleans())
def test_attention_matches_numpy_and_gradchecks(case, return_weights):
    q, k, v, mask, keep = build_attention(case)
    causal = case["causal"]
    out, weights = F.scaled_dot_product_attention(q, k, v, mask, causal, return_weights=True)
    ref_out, ref_weights = ref_attention(q.data, k.data, v.data, keep)
    assert out.shape == ref_out.shape and out.dtype == np.float64
    assert_close(out, ref_out)
    assert_close(weights, ref_weights)
    plain = F.scaled_dot_product_attention(q, k, v, mask, causal)
    assert isinstance(plain, tf.Tensor)
    assert_close(plain, out.data, rtol=0, atol=0)
    # return_weights=True: gradcheck draws an upstream gradient for the weights as well
    tf.gradcheck(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, causal,
                                                       return_weights=return_weights),
        [q, k, v],
    )


@FEW
@given(case=attention_cases(mask_kinds=["none", "full", "padding"]), p=st.sampled_from([0.2, 0.5]))
def test_attention_dropout_gradchecks(case, p):
    q, k, v, mask, keep = build_attention(case)
    seed, causal = case["seed"], case["causal"]

    def attend(q, k, v, **kwargs):
        return F.scaled_dot_product_attention(q, k, v, mask, causal, dropout_p=p,
                                              generator=rng_of(seed), **kwargs)

    out, weights = attend(q, k, v, return_weights=True)
    _, ref_weights = ref_attention(q.data, k.data, v.data, keep)
    assert_close(weights, ref_weights)  # the weights returned are those before dropout
    # with v = I the output is the dropped-out probabilities themselves (same seed: same mask)
    lk = case["lk"]
    eye = leaf(np.broadcast_to(np.eye(lk), v.shape[:-2] + (lk, lk)).copy())
    dropped = attend(q, k, eye).data
    scaled = np.broadcast_to(ref_weights, dropped.shape) / (1 - p)
    assert np.all(np.isclose(dropped, 0, atol=0) | np.isclose(dropped, scaled, rtol=1e-12, atol=0))
    assert_close(out, dropped @ v.data)
    tf.gradcheck(attend, [q, k, v])
    tf.gradcheck(lambda q, k, v: attend(q, k, v, return_weights=True), [q, k, v])


@FEW
@given(case=attention_cases(), p=st.sampled_from([0.0, 0.3]))
def test_attention_gradient_through_one_output_alone(case, p):
    """Backward from the weights alone (no gradient reaches the output) and from the output alone."""
    q, k, v, mask, _ = build_attention(case)
    seed, causal = case["seed"], case["causal"]

    def both(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, mask, causal, dropout_p=p,
                                              return_weights=True, generator=rng_of(seed))

    tf.gradcheck(lambda q, k, v: both(q, k, v)[1], [q, k, v])
    tf.gradcheck(lambda q, k, v: both(q, k, v)[0], [q, k, v])
    # the weights alone do not depend on v
    out, weights = both(q, k, v)
    assert np.all(tf.grad([weights], [v], [np.ones(weights.shape)])[0] == 0)


def test_attention_dropout_repeats_with_the_same_seed():
    case = dict(b=2, h=2, lq=4, lk=4, d=3, dv=3, kv_batch=(2, 2), kind="none", causal=False,
                mask_shape=(), seed=17)
    q, k, v, _, _ = build_attention(case)
    outs = [F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, generator=rng_of(s)).data
            for s in (1, 1, 2)]
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])
    no_drop = F.scaled_dot_product_attention(q, k, v).data
    assert not np.allclose(outs[0], no_drop)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "full"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_attention_in_batch_blocks_equals_the_whole_batch_bit_for_bit(mask_kind, dropout_p, monkeypatch,
                                                                     set_threads):
    """The threaded batch-block path gives exactly the one-piece path's outputs and gradients,
    and keeps a head-split q's (batch, len, heads, d) layout for the output and dQ."""
    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 8)
    set_threads(3)
    rng = np.random.default_rng(2)
    batch, heads, length, dim = 5, 2, 6, 4
    x = rng.standard_normal((3, batch, length, heads * dim)).astype(np.float32)
    mask = {"none": None, "causal": None,
            "padding": (np.arange(length) < np.array([6, 1, 3, 6, 4])[:, None])[:, None, None, :],
            "full": rng.random((batch, heads, length, length)) > 0.3}[mask_kind]
    g_out = rng.standard_normal((batch, heads, length, dim)).astype(np.float32)
    g_weights = rng.standard_normal((batch, heads, length, length)).astype(np.float32)
    results, decisions, batch_blocks = [], [], F._batch_blocks
    monkeypatch.setattr(F, "_batch_blocks", lambda *args: decisions.append(batch_blocks(*args)) or decisions[-1])
    for blocks in (True, False):
        if not blocks:
            assert decisions == [True]
            monkeypatch.setattr(F, "_batch_blocks", lambda *args: False)
        q, k, v = (Tensor(a.reshape(batch, length, heads, dim), requires_grad=True) for a in x)
        out, weights = F.scaled_dot_product_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask=mask,
            causal=mask_kind == "causal", dropout_p=dropout_p, return_weights=True, generator=rng_of(9))
        if blocks:
            assert out.data.transpose(0, 2, 1, 3).flags.c_contiguous
        ((out * Tensor(g_out)).sum() + (weights * Tensor(g_weights)).sum()).backward()
        results.append([out.data, weights.data, q.grad, k.grad, v.grad])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_attention_fully_masked_rows_are_zero_without_nan(dtype, dropout_p):
    rng = rng_of(18)
    q, k, v = (tf.Tensor(uniform(rng, (2, 2, 3, 4)) * 100, requires_grad=True, dtype=dtype)
               for _ in range(3))
    mask = rng.random((2, 2, 3, 3)) < 0.7
    mask[:, :, 0] = True
    mask[:, :, 1] = False  # query 1 sees no key
    mask[1] = False  # the whole second batch item sees nothing
    g_out, g_w = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 3, 3))

    def grads(g_out):
        out, w = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=dropout_p,
                                                return_weights=True, generator=rng_of(0))
        return out, w, tf.grad([out, w], [q, k, v], [g_out, g_w])

    out, w, (dq, dk, dv) = grads(g_out)
    for array in (out.data, w.data, dq, dk, dv):
        assert array.dtype == dtype and np.all(np.isfinite(array))
    assert np.all(out.data[:, :, 1] == 0) and np.all(out.data[1] == 0)
    assert np.all(w.data[:, :, 1] == 0) and np.all(w.data[1] == 0)
    assert np.all(dq[:, :, 1] == 0) and np.all(dq[1] == 0)
    assert np.all(dk[1] == 0) and np.all(dv[1] == 0)
    # the masked query row sends nothing to dK and dV: another upstream gradient there changes nothing
    g_other = g_out.copy()
    g_other[:, :, 1] = rng.standard_normal((2, 2, 4)) * 1e3
    _, _, (dq2, dk2, dv2) = grads(g_other)
    for a, b in ((dq, dq2), (dk, dk2), (dv, dv2)):
        np.testing.assert_array_equal(a, b)


def test_attention_everything_masked():
    q, k, v = (leaf(uniform(rng_of(s), (1, 2, 3, 2))) for s in (19, 20, 21))
    out = F.scaled_dot_product_attention(q, k, v, np.zeros((3, 3), dtype=bool))
    assert np.all(out.data == 0)
    out.backward(np.ones(out.shape))
    for t in (q, k, v):
        assert np.all(t.grad == 0)


def test_attention_causal_with_more_queries_than_keys():
    # 3 queries, 2 keys: aligned with the last keys, query 0 sees no key
    q, k, v = leaf(uniform(rng_of(22), (3, 2))), leaf(uniform(rng_of(23), (2, 2))), leaf(uniform(rng_of(24), (2, 2)))
    out = F.scaled_dot_product_attention(q, k, v, causal=True)
    assert np.all(out.data[0] == 0)
    assert_close(out.data[1], v.data[0])  # query 1 sees key 0 only
    assert_close(out, ref_attention(q.data, k.data, v.data, ref_causal(3, 2))[0])


@SOME
@given(b=st.integers(1, 2), lq=st.integers(1, 4), extra=st.integers(0, 2), d=st.integers(1, 3),
       i=st.integers(0, 3), seed=seeds)
def test_attention_causal_ignores_later_keys(b, lq, extra, d, i, seed):
    lk = lq + extra  # extra keys are a cache of earlier positions
    i = min(i, lq - 1)
    rng = rng_of(seed)
    q, k, v = leaf(uniform(rng, (b, 2, lq, d))), leaf(uniform(rng, (b, 2, lk, d))), leaf(uniform(rng, (b, 2, lk, d)))
    later = slice(i + extra + 1, None)  # the keys that query i must not see
    k2, v2 = k.data.copy(), v.data.copy()
    k2[..., later, :] = uniform(rng, k2[..., later, :].shape, -50, 50)
    v2[..., later, :] = uniform(rng, v2[..., later, :].shape, -50, 50)
    out = F.scaled_dot_product_attention(q, k, v, causal=True).data
    moved = F.scaled_dot_product_attention(q, leaf(k2), leaf(v2), causal=True).data
    assert_close(moved[..., : i + 1, :], out[..., : i + 1, :], rtol=1e-13, atol=1e-15)
    # and no gradient from rows <= i reaches the later keys
    g = np.zeros(out.shape)
    g[..., : i + 1, :] = rng.standard_normal(g[..., : i + 1, :].shape)
    dq, dk, dv = tf.grad(F.scaled_dot_product_attention(q, k, v, causal=True), [q, k, v], g)
    assert np.all(dk[..., later, :] == 0) and np.all(dv[..., later, :] == 0)


def test_attention_mask_as_tensor_and_list():
    q, k, v = (leaf(uniform(rng_of(s), (2, 3, 2))) for s in (25, 26, 27))
    keep = [[True, False, True], [True, True, False], [False, False, True]]
    expected = ref_attention(q.data, k.data, v.data, np.array(keep))[0]
    assert_close(F.scaled_dot_product_attention(q, k, v, keep), expected)
    assert_close(F.scaled_dot_product_attention(q, k, v, tf.Tensor(np.array(keep))), expected)


@pytest.mark.parametrize("mask_shape", [(2, 3), (2, 4, 4), (3, 4, 3), (2, 1, 4, 4), (1, 1, 1, 4, 4), (5,)])
def test_attention_mask_wrong_shape(mask_shape):
    q = leaf(np.ones((1, 3, 4, 2)))
    with pytest.raises(ValueError) as info:
        F.scaled_dot_product_attention(q, q, q, np.ones(mask_shape, dtype=bool))
    message = str(info.value)
    assert "mask" in message and str(mask_shape) in message and "(1, 3, 4, 4)" in message


@pytest.mark.parametrize("mask", [np.ones((2, 2), dtype=int), np.ones((2, 2)), [[1, 0], [1, 1]]])
def test_attention_mask_must_be_boolean(mask):
    q = leaf(np.ones((2, 2)))
    with pytest.raises(TypeError, match="mask must be boolean"):
        F.scaled_dot_product_attention(q, q, q, mask)


@pytest.mark.parametrize("k_shape, v_shape", [((1, 3, 2), (1, 3, 3)), ((1, 4, 3), (1, 3, 3)),
                                              ((3, 3), (3, 3)), ((1, 3, 3), (3, 3))])
def test_attention_shape_mismatch(k_shape, v_shape):
    q = leaf(np.ones((1, 2, 3)))
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        F.scaled_dot_product_attention(q, leaf(np.ones(k_shape)), leaf(np.ones(v_shape)))


def test_attention_d_k_mismatch_message():
    q, k = leaf(np.ones((2, 4))), leaf(np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"q \(2, 4\) and k \(3, 5\) need the same d_k"):
        F.scaled_dot_product_attention(q, k, leaf(np.ones((3, 2))))


@pytest.mark.parametrize("p", [-0.5, 1.0, 2.0])
def test_attention_dropout_out_of_range(p):
    q = leaf(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"dropout_p must be a probability in \[0, 1\)"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=p)


# ============================================================== float32 stays float32
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

    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 1)
    for one, many in zip(run(1), run(4)):
        np.testing.assert_allclose(many, one, rtol=1e-12, atol=1e-15)


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

    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 1)
    for one, many in zip(run(1), run(4)):
        np.testing.assert_allclose(many, one, rtol=1e-12, atol=1e-14)


def test_dropout_in_parallel_blocks_equals_one_block(monkeypatch, set_threads):
    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 1)
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
