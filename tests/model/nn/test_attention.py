"""MultiHeadAttention against a per-head NumPy reference, central differences and its cache."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinyformer as tf
from tinyformer.model import nn
from strategies import leaf, seeds

D_MODEL, HEADS = 8, 2


def make_mha(rng, d_model=D_MODEL, heads=HEADS, **kwargs):
    """A float64 MultiHeadAttention with random weights and non-zero biases."""
    mha = nn.MultiHeadAttention(d_model, heads, **kwargs).double()
    for p in mha.parameters():
        p.data = rng.uniform(-0.8, 0.8, p.shape)
    return mha


def reference(mha, query, key, value, mask=None, causal=False):
    """Concat(head_1..head_h) W_Oᵀ + b_O with head_i = softmax(Q_i K_iᵀ/√d_k) V_i, per head.

    Q_i uses rows i·d_k..(i+1)·d_k of W_Q (and of b_Q): the per-head projections of
    §3.2.2 stacked into one matrix. Returns (output, probabilities (B, h, Lq, Lk)).
    """
    def proj(linear, x, rows):
        return x @ linear.weight.data[rows].T + linear.bias.data[rows]

    batch, len_q, _ = query.shape
    len_k = key.shape[1]
    keep = np.ones((batch, mha.heads, len_q, len_k), dtype=bool)
    if mask is not None:
        keep &= np.broadcast_to(mask, keep.shape)
    if causal:
        keep &= np.tril(np.ones((len_q, len_k), dtype=bool), k=len_k - len_q)
    heads, probs = [], np.zeros(keep.shape)
    for i in range(mha.heads):
        rows = slice(i * mha.d_k, (i + 1) * mha.d_k)
        q, k, v = proj(mha.w_q, query, rows), proj(mha.w_k, key, rows), proj(mha.w_v, value, rows)
        out = np.zeros((batch, len_q, mha.d_k))
        for b in range(batch):
            for t in range(len_q):
                allowed = keep[b, i, t]
                if not allowed.any():
                    continue  # a query with nothing to attend to gets a zero head output
                scores = q[b, t] @ k[b].T / math.sqrt(mha.d_k)
                e = np.where(allowed, np.exp(scores - scores[allowed].max()), 0.0)
                probs[b, i, t] = e / e.sum()
                out[b, t] = probs[b, i, t] @ v[b]
        heads.append(out)
    concat = np.concatenate(heads, axis=-1)
    return concat @ mha.w_o.weight.data.T + mha.w_o.bias.data, probs


@st.composite
def attention_cases(draw):
    """(batch, len_q, len_k, self_attention, mask kind, causal)."""
    batch = draw(st.integers(1, 2))
    self_attention = draw(st.booleans())
    len_q = draw(st.integers(1, 4))
    len_k = len_q if self_attention else draw(st.integers(1, 4))
    causal = draw(st.booleans())
    mask_kind = draw(st.sampled_from(["none", "padding", "full"]))
    return batch, len_q, len_k, self_attention, mask_kind, causal


def draw_mask(rng, kind, batch, len_q, len_k):
    if kind == "none":
        return None
    if kind == "padding":  # (B, 1, 1, Lk); batch row 0 fully padded half the time
        keep = rng.random((batch, 1, 1, len_k)) < 0.7
        if rng.random() < 0.5:
            keep[0] = False
        return keep
    return rng.random((batch, 1, len_q, len_k)) < 0.6  # a per-query mask, any row may be empty


@settings(max_examples=25, deadline=None)
@given(case=attention_cases(), seed=seeds)
def test_matches_reference_and_gradients(case, seed):
    batch, len_q, len_k, self_attention, mask_kind, causal = case
    rng = np.random.default_rng(seed)
    mha = make_mha(rng)
    mask = draw_mask(rng, mask_kind, batch, len_q, len_k)
    query = leaf(rng.uniform(-1, 1, (batch, len_q, D_MODEL)))
    params = mha.parameters()
    assert len(params) == 8
    if self_attention:
        out = mha(query, mask=mask, causal=causal)
        expected, _ = reference(mha, query.data, query.data, query.data, mask, causal)
        fn = lambda x, *ps: mha(x, mask=mask, causal=causal)  # noqa: E731
        inputs = [query]
    else:
        key = leaf(rng.uniform(-1, 1, (batch, len_k, D_MODEL)))
        value = leaf(rng.uniform(-1, 1, (batch, len_k, D_MODEL)))
        out = mha(query, key, value, mask=mask, causal=causal)
        expected, _ = reference(mha, query.data, key.data, value.data, mask, causal)
        fn = lambda q, k, v, *ps: mha(q, k, v, mask=mask, causal=causal)  # noqa: E731
        inputs = [query, key, value]
    assert out.shape == (batch, len_q, D_MODEL) and out.dtype == np.float64
    np.testing.assert_allclose(out.data, expected, rtol=1e-10, atol=1e-12)
    tf.gradcheck(fn, [*inputs, *params])


def test_fully_masked_query_gets_only_the_output_bias_and_no_key_gradient():
    rng = np.random.default_rng(0)
    mha = make_mha(rng)
    x, memory = leaf(rng.standard_normal((2, 3, D_MODEL))), leaf(rng.standard_normal((2, 4, D_MODEL)))
    mask = np.ones((2, 1, 1, 4), dtype=bool)
    mask[1] = False
    out = mha(x, memory, mask=mask)
    np.testing.assert_allclose(out.data[1], np.broadcast_to(mha.w_o.bias.data, (3, D_MODEL)), atol=1e-15)
    assert np.isfinite(out.data).all()
    (g_memory,) = tf.grad(out, [memory], rng.standard_normal(out.shape))
    np.testing.assert_array_equal(g_memory[1], 0.0)
    assert np.abs(g_memory[0]).max() > 0


def test_key_defaults_to_query_and_value_to_key():
    rng = np.random.default_rng(1)
    mha = make_mha(rng)
    x, m = tf.Tensor(rng.standard_normal((2, 3, D_MODEL))), tf.Tensor(rng.standard_normal((2, 4, D_MODEL)))
    np.testing.assert_array_equal(mha(x).data, mha(x, x, x).data)
    np.testing.assert_array_equal(mha(x, m).data, mha(x, m, m).data)


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("d_model, heads", [(10, 4), (6, 4), (3, 2)])
def test_d_model_not_divisible_by_heads(d_model, heads):
    with pytest.raises(ValueError) as error:
        nn.MultiHeadAttention(d_model, heads)
    message = str(error.value)
    assert f"d_model={d_model}" in message and f"heads={heads}" in message


def test_mask_of_wrong_shape_names_mask_and_shapes():
    mha = nn.MultiHeadAttention(D_MODEL, HEADS)
    x = tf.Tensor(np.zeros((2, 3, D_MODEL), dtype=np.float32))
    with pytest.raises(ValueError) as error:
        mha(x, mask=np.ones((2, 1, 1, 4), dtype=bool))
    message = str(error.value)
    assert "mask" in message and "(2, 1, 1, 4)" in message and "(2, 2, 3, 3)" in message
    with pytest.raises(ValueError, match="mask"):
        mha(x, mask=np.ones((3, 1, 1, 3), dtype=bool))  # wrong batch
    with pytest.raises(TypeError, match="boolean"):
        mha(x, mask=np.ones((2, 1, 1, 3), dtype=np.int64))


@pytest.mark.parametrize(
    "name, shapes",
    [
        ("query", [(3, D_MODEL), None]),
        ("query", [(2, 3, D_MODEL + 1), None]),
        ("key", [(2, 3, D_MODEL), (2, 4, D_MODEL - 2)]),
        ("key", [(2, 3, D_MODEL), (1, 2, 4, D_MODEL)]),
    ],
)
def test_wrong_input_rank_or_features_name_the_input(name, shapes):
    mha = nn.MultiHeadAttention(D_MODEL, HEADS)
    q_shape, k_shape = shapes
    query = tf.Tensor(np.zeros(q_shape, dtype=np.float32))
    key = None if k_shape is None else tf.Tensor(np.zeros(k_shape, dtype=np.float32))
    with pytest.raises(ValueError) as error:
        mha(query, key)
    message = str(error.value)
    assert name in message and str(q_shape if name == "query" else k_shape) in message


# ---------------------------------------------------------------------------- incremental decoding
@pytest.mark.parametrize("batch, length", [(1, 1), (2, 5), (3, 4)])
def test_cached_self_attention_equals_full_causal_pass(batch, length):
    rng = np.random.default_rng(length)
    mha = make_mha(rng).eval()
    x = tf.Tensor(rng.standard_normal((batch, length, D_MODEL)))
    full = mha(x, causal=True).data
    cache = {}
    steps = []
    for t in range(length):
        steps.append(mha(x[:, t:t + 1], causal=True, cache=cache).data)
        assert cache["k"].shape == cache["v"].shape == (batch, HEADS, t + 1, D_MODEL // HEADS)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)


def test_cached_self_attention_in_chunks():
    rng = np.random.default_rng(7)
    mha = make_mha(rng)
    x = tf.Tensor(rng.standard_normal((2, 5, D_MODEL)))
    full = mha(x, causal=True).data
    cache = {}
    first = mha(x[:, :2], causal=True, cache=cache).data
    rest = mha(x[:, 2:], causal=True, cache=cache).data
    np.testing.assert_allclose(np.concatenate([first, rest], axis=1), full, atol=1e-10)


def test_static_kv_cache_projects_memory_once():
    rng = np.random.default_rng(3)
    mha = make_mha(rng)
    x = tf.Tensor(rng.standard_normal((2, 4, D_MODEL)))
    memory = tf.Tensor(rng.standard_normal((2, 5, D_MODEL)))
    mask = np.array([True, True, True, False, False])[None, None, None, :].repeat(2, axis=0)
    full = mha(x, memory, mask=mask).data
    cache = {}
    first = mha(x[:, :1], memory, mask=mask, cache=cache, static_kv=True).data
    k, v = cache["k"], cache["v"]
    assert k.shape == (2, HEADS, 5, D_MODEL // HEADS)
    steps = [first]
    other_memory = tf.Tensor(rng.standard_normal((2, 5, D_MODEL)))  # ignored: the cache wins
    for t in range(1, 4):
        steps.append(mha(x[:, t:t + 1], other_memory, mask=mask, cache=cache, static_kv=True).data)
        assert cache["k"] is k and cache["v"] is v
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)


def test_cache_gradient_reaches_earlier_steps():
    # Cached keys stay in the graph: a later step's output depends on earlier inputs.
    rng = np.random.default_rng(4)
    mha = make_mha(rng)
    x = leaf(rng.standard_normal((1, 3, D_MODEL)))

    def stepwise(x):
        cache = {}
        return [mha(x[:, t:t + 1], causal=True, cache=cache) for t in range(3)]

    def full(x):
        return mha(x, causal=True)

    upstream = rng.standard_normal((1, 3, D_MODEL))
    (g_full,) = tf.grad(full(x), [x], upstream)
    outs = stepwise(x)
    (g_steps,) = tf.grad(outs, [x], [upstream[:, t:t + 1] for t in range(3)])
    np.testing.assert_allclose(g_steps, g_full, atol=1e-10)
    tf.gradcheck(stepwise, [x])


# ---------------------------------------------------------------------------- weights
def test_need_weights_keeps_probabilities():
    rng = np.random.default_rng(5)
    mha = make_mha(rng)
    q, kv = tf.Tensor(rng.standard_normal((2, 3, D_MODEL))), tf.Tensor(rng.standard_normal((2, 4, D_MODEL)))
    mask = np.ones((2, 1, 3, 4), dtype=bool)
    mask[0, 0, 1] = False  # one fully masked query row
    mask[1, 0, :, 2:] = False
    mha(q, kv, mask=mask, need_weights=True)
    weights = mha.last_weights
    assert isinstance(weights, tf.Tensor) and not weights.requires_grad
    assert weights.shape == (2, HEADS, 3, 4)
    sums = weights.data.sum(axis=-1)
    expected_sums = np.ones((2, HEADS, 3))
    expected_sums[0, :, 1] = 0.0
    np.testing.assert_allclose(sums, expected_sums, atol=1e-12)
    np.testing.assert_array_equal(weights.data[1, :, :, 2:], 0.0)
    _, probs = reference(mha, q.data, kv.data, kv.data, mask)
    np.testing.assert_allclose(weights.data, probs, rtol=1e-10, atol=1e-14)
    mha(q, kv, mask=mask)
    assert mha.last_weights is None


def test_causal_weights_are_lower_triangular():
    rng = np.random.default_rng(6)
    mha = make_mha(rng)
    mha(tf.Tensor(rng.standard_normal((1, 4, D_MODEL))), causal=True, need_weights=True)
    w = mha.last_weights.data
    assert np.all(np.triu(w[0, 0], k=1) == 0) and np.all(np.triu(w[0, 1], k=1) == 0)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-12)
    assert w[0, 0, 0, 0] == pytest.approx(1.0)


def test_attention_dropout_only_in_training_and_repeatable():
    rng = np.random.default_rng(8)
    mha = make_mha(rng, dropout=0.5)
    plain = make_mha(np.random.default_rng(8))
    x = tf.Tensor(rng.standard_normal((2, 4, D_MODEL)))
    tf.manual_seed(1)
    a = mha(x).data
    tf.manual_seed(1)
    np.testing.assert_array_equal(mha(x).data, a)
    assert not np.allclose(a, plain(x).data)
    mha.eval()
    np.testing.assert_allclose(mha(x).data, plain(x).data, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- the hook point (keep_attention)
def forward_and_grads(mha, inputs, upstream, seed, **kwargs):
    """(output, gradients of the inputs and parameters) for ⟨upstream, mha(*inputs)⟩, dropout seeded."""
    tf.manual_seed(seed)
    out = mha(*inputs, **kwargs)
    params = mha.parameters()
    return out, tf.grad(out, [*inputs, *params], upstream)


@settings(max_examples=25, deadline=None)
@given(case=attention_cases(), seed=seeds, dropout=st.sampled_from([0.0, 0.3]))
def test_keep_attention_gives_the_fused_paths_outputs_and_gradients(case, seed, dropout):
    batch, len_q, len_k, self_attention, mask_kind, causal = case
    rng = np.random.default_rng(seed)
    mha = make_mha(rng, dropout=dropout)
    mask = draw_mask(rng, mask_kind, batch, len_q, len_k)
    inputs = [leaf(rng.uniform(-1, 1, (batch, len_q, D_MODEL)))]
    if not self_attention:
        inputs += [leaf(rng.uniform(-1, 1, (batch, len_k, D_MODEL))) for _ in range(2)]
    upstream = rng.standard_normal((batch, len_q, D_MODEL))
    fused_out, fused_grads = forward_and_grads(mha, inputs, upstream, seed, mask=mask, causal=causal)
    assert mha.attention_probs is None
    mha.keep_attention = True
    out, grads = forward_and_grads(mha, inputs, upstream, seed, mask=mask, causal=causal)
    assert mha.attention_probs.shape == (batch, HEADS, len_q, len_k)
    np.testing.assert_allclose(out.data, fused_out.data, rtol=1e-12, atol=1e-14)
    for g, expected in zip(grads, fused_grads):
        np.testing.assert_allclose(g, expected, rtol=1e-11, atol=1e-13)


def split_heads(x, heads=HEADS):
    batch, length, d_model = x.shape
    return x.reshape(batch, length, heads, d_model // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    batch, heads, length, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, length, heads * d_k)


@pytest.mark.parametrize("causal", [False, True])
def test_hook_sees_dl_dp_equal_to_do_times_v_transposed_and_central_differences(causal):
    rng = np.random.default_rng(11)
    mha = make_mha(rng, keep_attention=True)
    x, memory = leaf(rng.standard_normal((2, 3, D_MODEL))), rng.standard_normal((2, 4, D_MODEL))
    if causal:
        memory, len_k = x.data, 3
    else:
        len_k = 4
    mask = np.ones((2, 1, 1, len_k), dtype=bool)
    mask[1, ..., -1] = False  # a padded key in the second sentence
    upstream = rng.standard_normal((2, 3, D_MODEL))
    out = mha(x, tf.Tensor(memory), mask=mask, causal=causal)
    probs = mha.attention_probs
    seen = []
    probs.register_hook(lambda g: seen.append(g.copy()))
    probs.retain_grad()
    out.backward(upstream)
    assert len(seen) == 1 and seen[0].shape == (2, HEADS, 3, len_k)
    np.testing.assert_array_equal(probs.grad, seen[0])

    # By hand: y = concat(O) W_Oᵀ + b_O, so dO = split(dY W_O); O = P V, so dP = dO Vᵀ.
    v = split_heads(memory @ mha.w_v.weight.data.T + mha.w_v.bias.data)
    d_o = split_heads(upstream @ mha.w_o.weight.data)
    np.testing.assert_allclose(seen[0], d_o @ v.swapaxes(-1, -2), rtol=1e-12, atol=1e-14)
    q_kept, _, v_kept = mha.attention_inputs  # the heads' inputs, kept beside P
    np.testing.assert_allclose(v_kept.data, v, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(q_kept.data, split_heads(x.data @ mha.w_q.weight.data.T + mha.w_q.bias.data),
                               rtol=1e-12, atol=1e-14)

    # Central differences of L(P) = ⟨dY, concat(P V) W_Oᵀ + b_O⟩ at the forward pass's P.
    def loss(p):
        return np.sum(upstream * (merge_heads(p @ v) @ mha.w_o.weight.data.T + mha.w_o.bias.data))

    numeric = np.zeros_like(probs.data)
    eps = 1e-6
    for index in np.ndindex(probs.shape):
        plus, minus = probs.data.copy(), probs.data.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = (loss(plus) - loss(minus)) / (2 * eps)
    np.testing.assert_allclose(seen[0], numeric, rtol=1e-6, atol=1e-8)


def test_a_hook_on_the_probabilities_changes_the_gradient_that_flows_on():
    # Q and K reach the output only through P: zeroing dL/dP zeroes their gradients, not V's or W_O's.
    rng = np.random.default_rng(12)
    mha = make_mha(rng, keep_attention=True)
    x = tf.Tensor(rng.standard_normal((2, 3, D_MODEL)))
    upstream = rng.standard_normal((2, 3, D_MODEL))
    params = [mha.w_q.weight, mha.w_k.weight, mha.w_v.weight, mha.w_o.weight]
    plain = tf.grad(mha(x, causal=True), params, upstream)
    out = mha(x, causal=True)
    handle = mha.attention_probs.register_hook(lambda g: np.zeros_like(g))
    g_q, g_k, g_v, g_o = tf.grad(out, params, upstream)
    np.testing.assert_array_equal(g_q, 0.0)
    np.testing.assert_array_equal(g_k, 0.0)
    np.testing.assert_allclose(g_v, plain[2], rtol=1e-12)
    np.testing.assert_allclose(g_o, plain[3], rtol=1e-12)
    handle.remove()


def test_keep_attention_with_need_weights_cache_and_switching_off():
    rng = np.random.default_rng(13)
    mha = make_mha(rng, keep_attention=True).eval()
    x = tf.Tensor(rng.standard_normal((2, 4, D_MODEL)))
    full = mha(x, causal=True, need_weights=True)
    assert not mha.last_weights.requires_grad
    np.testing.assert_array_equal(mha.last_weights.data, mha.attention_probs.data)
    cache, steps = {}, []
    for t in range(4):
        steps.append(mha(x[:, t:t + 1], causal=True, cache=cache).data)
        assert mha.attention_probs.shape == (2, HEADS, 1, t + 1)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full.data, atol=1e-12)
    mha.keep_attention = False
    np.testing.assert_allclose(mha(x, causal=True).data, full.data, rtol=1e-12, atol=1e-14)
    assert mha.attention_probs is None and mha.attention_inputs is None


def test_keep_attention_in_every_layer_of_a_transformer_changes_nothing_but_exposes_p():
    model = nn.Transformer(src_vocab_size=11, d_model=8, d_ff=16, heads=2, num_layers=1, dropout=0.1,
                           attention_dropout=0.1).double()
    rng = np.random.default_rng(14)
    src, tgt = rng.integers(1, 11, (2, 5)), rng.integers(1, 11, (2, 4))
    src[1, 3:] = 0

    def loss_and_grads():
        tf.manual_seed(0)
        loss = tf.functional.cross_entropy(model(src, tgt[:, :-1]), tgt[:, 1:], ignore_index=0)
        return loss.item(), tf.grad(loss, model.parameters())

    loss, grads = loss_and_grads()
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiHeadAttention)]
    assert len(attentions) == 3
    for m in attentions:
        m.keep_attention = True
    kept_loss, kept_grads = loss_and_grads()
    assert kept_loss == pytest.approx(loss, rel=1e-12)
    for g, expected in zip(kept_grads, grads):
        np.testing.assert_allclose(g, expected, rtol=1e-10, atol=1e-13)
    assert all(m.attention_probs is not None and m.attention_probs.requires_grad for m in attentions)


# ---------------------------------------------------------------------------- the switch without a graph
@pytest.mark.parametrize("causal", [False, True])
def test_keep_attention_without_a_graph_changes_no_output_and_keeps_the_reference_probabilities(causal):
    rng = np.random.default_rng(15)
    mha = make_mha(rng)
    q = tf.Tensor(rng.standard_normal((2, 3, D_MODEL)))
    kv = q if causal else tf.Tensor(rng.standard_normal((2, 4, D_MODEL)))
    mask = np.ones((2, 1, 1, kv.shape[1]), dtype=bool)
    mask[1, ..., -1] = False
    with tf.no_grad():
        plain = mha(q, kv, mask=mask, causal=causal).data
        mha.keep_attention = True
        kept = mha(q, kv, mask=mask, causal=causal).data
    np.testing.assert_array_equal(kept, plain)  # the same fused call: bit for bit
    expected_out, expected_probs = reference(mha, q.data, kv.data, kv.data, mask, causal)
    np.testing.assert_allclose(kept, expected_out, rtol=1e-12, atol=1e-13)
    assert not mha.attention_probs.requires_grad and mha.last_weights is None
    np.testing.assert_allclose(mha.attention_probs.data, expected_probs, rtol=1e-12, atol=1e-14)
    with tf.no_grad():
        mha.keep_attention = False
        mha(q, kv, mask=mask, causal=causal)
    assert mha.attention_probs is None


def test_keep_attention_in_inference_gives_a_models_outputs_and_every_heads_probabilities():
    model = nn.Transformer(src_vocab_size=11, d_model=8, d_ff=16, heads=2, num_layers=2, dropout=0.1, seed=3).double()
    src, tgt = np.array([[4, 5, 6, 7, 0]]), np.array([[1, 8, 9]])
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiHeadAttention)]
    with nn.inference(model):
        plain = model(src, tgt).data
        for m in attentions:
            m.keep_attention = True
        kept = model(src, tgt).data
    np.testing.assert_array_equal(kept, plain)
    assert all(m.attention_probs.shape[:2] == (1, 2) and not m.attention_probs.requires_grad for m in attentions)
    # the first encoder layer attends over the embedded source (post-LN: no norm before it)
    x = model.positional(model.src_embed(src) * math.sqrt(8)).data
    _, probs = reference(model.encoder.layers[0].self_attn, x, x, x, mask=src[:, None, None, :] != 0)
    np.testing.assert_allclose(model.encoder.layers[0].self_attn.attention_probs.data, probs, rtol=1e-12,
                               atol=1e-14)
    cross = model.decoder.layers[-1].cross_attn.attention_probs.data
    np.testing.assert_array_equal(cross[..., -1], 0.0)  # the padded source token
    assert cross.shape == (1, 2, 3, 5)
