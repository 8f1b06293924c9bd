"""scaled_dot_product_attention (``tinyformer/engine/functional/attention.py``).

Every forward is compared with a NumPy reference written here from the formula
(not from the implementation), every gradient is checked in float64 by
``tinyformer.engine.gradcheck`` (a random upstream gradient per output), over generated
masks (padding, full, broadcast, rows with no key), causal alignment, dropout and the
batch-block threads; fully masked rows give zeros and no NaN.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyformer as tf
from functional_helpers import FEW, MANY, SOME, assert_close, ref_causal, rng_of
from strategies import broadcasts_to, leaf, seeds, uniform
from tinyformer import Tensor
from tinyformer.engine import backend, functional as F
from tinyformer.engine.functional import attention as attention_module


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
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 8)
    set_threads(3)
    rng = np.random.default_rng(2)
    batch, heads, length, dim = 5, 2, 6, 4
    x = rng.standard_normal((3, batch, length, heads * dim)).astype(np.float32)
    mask = {"none": None, "causal": None,
            "padding": (np.arange(length) < np.array([6, 1, 3, 6, 4])[:, None])[:, None, None, :],
            "full": rng.random((batch, heads, length, length)) > 0.3}[mask_kind]
    g_out = rng.standard_normal((batch, heads, length, dim)).astype(np.float32)
    g_weights = rng.standard_normal((batch, heads, length, length)).astype(np.float32)
    results, decisions, batch_blocks = [], [], attention_module._batch_blocks
    monkeypatch.setattr(attention_module, "_batch_blocks",
                        lambda *args: decisions.append(batch_blocks(*args)) or decisions[-1])
    for blocks in (True, False):
        if not blocks:
            assert decisions == [True]
            monkeypatch.setattr(attention_module, "_batch_blocks", lambda *args: False)
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


def test_attention_with_a_key_length_mask_equals_the_boolean_mask_and_skips_the_check():
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal((3, 2, 5, 4)), requires_grad=True) for _ in range(3))
    lengths = np.array([5, 2, 0])
    mask = F.KeyLengthMask(lengths, 5)
    upstream = rng.standard_normal((3, 2, 5, 4))
    results = []
    for m in (mask, mask.mask):
        out = F.scaled_dot_product_attention(q, k, v, mask=m)
        grads = tf.grad([out], [q, k, v], [upstream])
        results.append([out.data, *grads])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    # the kernels take the lengths as they are, not recomputed from (and checked against) the mask
    fits, found = attention_module._key_lengths_of_mask(mask, 3, 5)
    assert fits and found is mask.lengths
    with pytest.raises(ValueError, match="does not broadcast to the scores' shape"):
        F.scaled_dot_product_attention(q, k, v, mask=F.KeyLengthMask(lengths, 6))
