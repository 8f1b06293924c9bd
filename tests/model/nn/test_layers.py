"""The basic layers against NumPy references and central differences (float64)."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tinyformer as tf
from tinyformer.model import nn
from tinyformer.engine.random import make_generator
from strategies import leaf, seeds

batch_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


def randomize(module, rng, scale=1.0):
    """Give every parameter random float64 values (biases and gains included), in place."""
    module.double()
    for p in module.parameters():
        p.data = rng.uniform(-scale, scale, p.shape)
    return module


def check_module(fn, inputs, module, mode="full"):
    """gradcheck ``fn`` with respect to ``inputs`` and every parameter of ``module``."""
    params = module.parameters()
    n = len(inputs)
    tf.gradcheck(lambda *args: fn(*args[:n]), [*inputs, *params], mode=mode)


# ---------------------------------------------------------------------------- Linear
def test_linear_xavier_uniform_init_and_zero_bias():
    fan_in, fan_out = 300, 200
    layer = nn.Linear(fan_in, fan_out)
    w = layer.weight.data
    assert w.shape == (fan_out, fan_in) and w.dtype == np.float32
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.99 * bound  # the whole interval is used
    assert abs(w.mean()) < 0.01 * bound
    assert w.var() == pytest.approx(bound**2 / 3, rel=0.03)  # uniform on [-a, a]
    np.testing.assert_array_equal(layer.bias.data, np.zeros(fan_out, dtype=np.float32))
    assert nn.Linear(3, 4, bias=False).bias is None


def test_linear_generator_makes_init_repeat():
    a = nn.Linear(5, 4, generator=make_generator(3)).weight.data
    b = nn.Linear(5, 4, generator=make_generator(3)).weight.data
    c = nn.Linear(5, 4, generator=make_generator(4)).weight.data
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    tf.manual_seed(9)
    d = nn.Linear(5, 4).weight.data
    tf.manual_seed(9)
    np.testing.assert_array_equal(nn.Linear(5, 4).weight.data, d)


@settings(max_examples=20, deadline=None)
@given(batch=batch_shapes, fan_in=st.integers(1, 4), fan_out=st.integers(1, 4),
       bias=st.booleans(), seed=seeds)
def test_linear_forward_and_gradients(batch, fan_in, fan_out, bias, seed):
    rng = np.random.default_rng(seed)
    layer = randomize(nn.Linear(fan_in, fan_out, bias=bias), rng)
    x = leaf(rng.uniform(-2, 2, batch + (fan_in,)))
    out = layer(x)
    w = layer.weight.data
    expected = x.data @ w.T + (layer.bias.data if bias else 0.0)
    assert out.shape == batch + (fan_out,) and out.dtype == np.float64
    np.testing.assert_allclose(out.data, expected, rtol=1e-12, atol=1e-12)
    assert len(layer.parameters()) == (2 if bias else 1)
    check_module(layer, [x], layer)


def test_linear_rejects_wrong_feature_count():
    layer = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="features"):
        layer(tf.Tensor(np.ones((2, 4), dtype=np.float32)))
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(0, 2)


# ---------------------------------------------------------------------------- Embedding
def test_embedding_init_std_is_inverse_sqrt_d_model():
    d_model = 64
    weight = nn.Embedding(4000, d_model).weight.data
    assert weight.shape == (4000, d_model) and weight.dtype == np.float32
    assert weight.std() == pytest.approx(d_model**-0.5, rel=0.02)
    assert abs(weight.mean()) < 0.01 * d_model**-0.5


@settings(max_examples=15, deadline=None)
@given(ids_shape=st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple),
       vocab=st.integers(1, 4), d=st.integers(1, 3), seed=seeds)
def test_embedding_lookup_and_gradient_with_repeated_ids(ids_shape, vocab, d, seed):
    rng = np.random.default_rng(seed)
    layer = randomize(nn.Embedding(vocab, d), rng)
    ids = rng.integers(0, vocab, ids_shape)
    out = layer(ids)
    assert out.shape == ids_shape + (d,)
    np.testing.assert_array_equal(out.data, layer.weight.data[ids])
    check_module(lambda: layer(ids), [], layer)


def test_embedding_gradient_adds_up_repeated_ids():
    rng = np.random.default_rng(0)
    layer = randomize(nn.Embedding(4, 3), rng)
    ids = np.array([[2, 0, 2], [2, 3, 0]])
    upstream = rng.standard_normal((2, 3, 3))
    (g,) = tf.grad(layer(ids), [layer.weight], upstream)
    expected = np.zeros((4, 3))
    for index, token in np.ndenumerate(ids):
        expected[token] += upstream[index]
    np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(g[1], 0.0)  # an id that never occurs gets nothing


@pytest.mark.parametrize("bad", [5, 9, -1])
def test_embedding_out_of_range_ids_raise_index_error(bad):
    layer = nn.Embedding(5, 3)
    with pytest.raises(IndexError) as error:
        layer(np.array([[0, bad, 2]]))
    message = str(error.value)
    assert "ids" in message and str(bad) in message and "5" in message


def test_embedding_rejects_float_ids():
    with pytest.raises(TypeError, match="integer"):
        nn.Embedding(5, 3)(np.array([[0.0, 1.0]]))


# ---------------------------------------------------------------------------- LayerNorm
def test_layer_norm_default_output_is_standardized():
    rng = np.random.default_rng(1)
    layer = nn.LayerNorm(16).double()
    x = rng.normal(3.0, 5.0, (4, 3, 16))
    out = layer(tf.Tensor(x)).data
    np.testing.assert_allclose(out.mean(axis=-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(out.var(axis=-1), 1.0, atol=1e-5)  # eps=1e-5 vs variance ~25
    np.testing.assert_array_equal(layer.weight.data, 1.0)
    np.testing.assert_array_equal(layer.bias.data, 0.0)


@settings(max_examples=15, deadline=None)
@given(batch=batch_shapes, d=st.integers(2, 5), seed=seeds)
def test_layer_norm_matches_reference_and_gradients(batch, d, seed):
    rng = np.random.default_rng(seed)
    layer = randomize(nn.LayerNorm(d), rng, scale=2.0)
    x = leaf(rng.uniform(-2, 2, batch + (d,)))
    out = layer(x)
    mu = x.data.mean(axis=-1, keepdims=True)
    var = ((x.data - mu) ** 2).mean(axis=-1, keepdims=True)
    expected = (x.data - mu) / np.sqrt(var + layer.eps) * layer.weight.data + layer.bias.data
    np.testing.assert_allclose(out.data, expected, rtol=1e-10, atol=1e-12)
    check_module(layer, [x], layer)


# ---------------------------------------------------------------------------- Dropout
def test_dropout_eval_is_identity():
    x = tf.Tensor(np.random.default_rng(0).standard_normal((4, 5)))
    layer = nn.Dropout(0.5).eval()
    np.testing.assert_array_equal(layer(x).data, x.data)
    np.testing.assert_array_equal(nn.Dropout(0.0)(x).data, x.data)  # p = 0 in training


@pytest.mark.parametrize("p", [0.1, 0.5, 0.75])
def test_dropout_train_zeros_and_rescales(p):
    tf.manual_seed(0)
    x = tf.Tensor(np.full((200, 100), 3.0))
    out = nn.Dropout(p)(x).data
    zero = out == 0
    assert abs(zero.mean() - p) < 0.02
    np.testing.assert_allclose(out[~zero], 3.0 / (1.0 - p), rtol=1e-12)


def test_dropout_repeats_after_manual_seed():
    layer = nn.Dropout(0.5)
    x = tf.Tensor(np.ones((10, 10)))
    tf.manual_seed(5)
    a = layer(x).data
    b = layer(x).data
    tf.manual_seed(5)
    np.testing.assert_array_equal(layer(x).data, a)
    np.testing.assert_array_equal(layer(x).data, b)
    assert not np.array_equal(a, b)  # successive calls draw fresh masks
    tf.manual_seed(6)
    assert not np.array_equal(layer(x).data, a)


def test_dropout_gradient_uses_the_same_mask():
    rng = np.random.default_rng(3)
    layer = nn.Dropout(0.4)
    x = leaf(rng.standard_normal((3, 4)))

    def fn(x):
        tf.manual_seed(11)
        return layer(x)

    out = fn(x)
    upstream = rng.standard_normal((3, 4))
    (g,) = tf.grad(out, [x], upstream)
    np.testing.assert_allclose(g, upstream * out.data / x.data, rtol=1e-12)
    tf.gradcheck(fn, [x])


@pytest.mark.parametrize("p", [1.0, -0.1, 1.5])
def test_dropout_rejects_bad_probability(p):
    with pytest.raises(ValueError, match="p"):
        nn.Dropout(p)


# ---------------------------------------------------------------------------- PositionalEncoding
def reference_sinusoids(positions, d_model):
    table = np.zeros((len(positions), d_model))
    for row, pos in enumerate(positions):
        for j in range(d_model):
            angle = pos / 10000 ** ((j - j % 2) / d_model)
            table[row, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return table


@pytest.mark.parametrize("d_model", [2, 7, 16])
def test_positional_encoding_matches_section_3_5(d_model):
    pe = nn.PositionalEncoding(d_model, max_len=60).double()
    out = pe(tf.Tensor(np.zeros((2, 60, d_model)))).data
    expected = reference_sinusoids(range(60), d_model)
    np.testing.assert_allclose(out[0], expected, atol=2e-6)  # the table is stored in float32
    np.testing.assert_allclose(out[1], expected, atol=2e-6)


def marians_sinusoids(positions, d_model):
    """transformers' MarianSinusoidalPositionalEmbedding._init_weight, written out: position_enc[pos, j] =
    pos / 10000^(2 (j // 2) / dim); out[:, :sentinel] = sin(position_enc[:, 0::2]),
    out[:, sentinel:] = cos(position_enc[:, 1::2]), sentinel = ⌈dim / 2⌉."""
    position_enc = np.array([[pos / np.power(10000, 2 * (j // 2) / d_model) for j in range(d_model)]
                             for pos in positions])
    sentinel = d_model // 2 if d_model % 2 == 0 else d_model // 2 + 1
    out = np.zeros((len(position_enc), d_model))
    out[:, :sentinel] = np.sin(position_enc[:, 0::2])
    out[:, sentinel:] = np.cos(position_enc[:, 1::2])
    return out


@pytest.mark.parametrize("d_model", [2, 7, 16])
def test_the_split_sinusoids_are_marians(d_model):
    pe = nn.PositionalEncoding(d_model, max_len=60, layout="split").double()
    out = pe(tf.Tensor(np.zeros((1, 60, d_model)))).data
    np.testing.assert_allclose(out[0], marians_sinusoids(range(60), d_model), atol=2e-6)  # stored in float32
    if d_model > 2:  # with two columns the two layouts are the same table
        assert not np.allclose(out[0], reference_sinusoids(range(60), d_model), atol=1e-3)
    with pytest.raises(ValueError, match="layout must be one of 'interleaved', 'split', got 'halves'"):
        nn.PositionalEncoding(d_model, layout="halves")


def test_positional_encoding_is_added_with_offset():
    rng = np.random.default_rng(0)
    pe = nn.PositionalEncoding(6, max_len=10).double()
    x = rng.standard_normal((2, 3, 6))
    out = pe(tf.Tensor(x), offset=4).data
    np.testing.assert_allclose(out, x + reference_sinusoids(range(4, 7), 6), atol=2e-6)
    # the same rows as a full pass at those positions
    full = pe(tf.Tensor(np.concatenate([np.zeros((2, 4, 6)), x], axis=1))).data
    np.testing.assert_array_equal(out, full[:, 4:])


def test_positional_encoding_passes_gradient_through():
    pe = nn.PositionalEncoding(4, max_len=5).double()
    x = leaf(np.random.default_rng(0).standard_normal((2, 3, 4)))
    assert pe.parameters() == []
    tf.gradcheck(pe, [x])


POSITIONS = {"sinusoid": nn.PositionalEncoding, "learned": nn.LearnedPositionalEmbedding}


@pytest.mark.parametrize("kind", POSITIONS)
@pytest.mark.parametrize("length, offset", [(9, 0), (5, 4), (1, 8)])
def test_positional_encoding_beyond_max_len_raises(kind, length, offset):
    pe = POSITIONS[kind](4, max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        pe(tf.Tensor(np.zeros((1, length, 4), dtype=np.float32)), offset=offset)
    pe(tf.Tensor(np.zeros((1, 8 - offset, 4), dtype=np.float32)), offset=offset)  # the last legal length


@pytest.mark.parametrize("kind", POSITIONS)
def test_positional_encoding_rejects_wrong_feature_count(kind):
    with pytest.raises(ValueError, match="features"):
        POSITIONS[kind](4, max_len=8)(tf.Tensor(np.zeros((1, 2, 5), dtype=np.float32)))


def test_learned_positions_are_a_parameter_initialised_like_embeddings():
    tf.manual_seed(0)
    pe = nn.LearnedPositionalEmbedding(64, max_len=300)
    assert pe.parameters() == [pe.weight] and pe.weight.shape == (300, 64)
    assert pe.weight.dtype == np.float32
    assert abs(pe.weight.data.std() - 64 ** -0.5) < 0.01 and abs(pe.weight.data.mean()) < 0.01
    a = nn.LearnedPositionalEmbedding(8, 5, generator=make_generator(3)).weight.data
    b = nn.LearnedPositionalEmbedding(8, 5, generator=make_generator(3)).weight.data
    np.testing.assert_array_equal(a, b)


def test_learned_positions_are_added_with_offset_and_gradient_reaches_their_rows():
    rng = np.random.default_rng(0)
    pe = randomize(nn.LearnedPositionalEmbedding(6, max_len=10), rng)
    x = rng.standard_normal((2, 3, 6))
    out = pe(tf.Tensor(x), offset=4).data
    np.testing.assert_array_equal(out, x + pe.weight.data[4:7])
    full = pe(tf.Tensor(np.concatenate([np.zeros((2, 4, 6)), x], axis=1))).data
    np.testing.assert_array_equal(out, full[:, 4:])
    # position p's row gets the sum over the batch of the upstream gradient at p, the others none
    upstream = rng.standard_normal((2, 3, 6))
    (g,) = tf.grad(pe(leaf(x), offset=4), [pe.weight], upstream)
    np.testing.assert_allclose(g[4:7], upstream.sum(axis=0), rtol=1e-12)
    assert not g[:4].any() and not g[7:].any()


@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 3), length=st.integers(1, 4), offset=st.integers(0, 2),
       d=st.integers(1, 5), seed=seeds)
def test_learned_positions_gradcheck(batch, length, offset, d, seed):
    rng = np.random.default_rng(seed)
    pe = randomize(nn.LearnedPositionalEmbedding(d, max_len=6), rng)
    x = leaf(rng.standard_normal((batch, length, d)))
    check_module(lambda x: pe(x, offset=offset), [x], pe)


def test_unknown_positional_kind_is_named():
    assert isinstance(nn.layers.positional_encoding("sinusoid", 4, 8), nn.PositionalEncoding)
    assert isinstance(nn.layers.positional_encoding("learned", 4, 8), nn.LearnedPositionalEmbedding)
    with pytest.raises(ValueError) as error:
        nn.layers.positional_encoding("rotary", 4, 8)
    assert all(word in str(error.value) for word in ("positional", "'sinusoid'", "'learned'", "'rotary'"))


# ---------------------------------------------------------------------------- feed-forward
@settings(max_examples=15, deadline=None)
@given(batch=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
       d_model=st.integers(1, 4), d_ff=st.integers(1, 5), seed=seeds)
def test_feed_forward_matches_reference_and_gradients(batch, d_model, d_ff, seed):
    rng = np.random.default_rng(seed)
    ffn = randomize(nn.PositionwiseFeedForward(d_model, d_ff), rng)
    x = leaf(rng.uniform(-2, 2, batch + (d_model,)))
    w1, b1 = ffn.linear1.weight.data, ffn.linear1.bias.data
    w2, b2 = ffn.linear2.weight.data, ffn.linear2.bias.data
    pre = x.data @ w1.T + b1
    assume(np.abs(pre).min() > 1e-3)  # stay off the ReLU kink for central differences
    expected = np.maximum(pre, 0.0) @ w2.T + b2
    np.testing.assert_allclose(ffn(x).data, expected, rtol=1e-12, atol=1e-12)
    check_module(ffn, [x], ffn)


def test_feed_forward_is_positionwise():
    rng = np.random.default_rng(2)
    ffn = randomize(nn.PositionwiseFeedForward(4, 8), rng)
    x = rng.standard_normal((2, 5, 4))
    full = ffn(tf.Tensor(x)).data
    for pos in range(5):
        np.testing.assert_allclose(ffn(tf.Tensor(x[:, pos:pos + 1])).data, full[:, pos:pos + 1],
                                   rtol=1e-12, atol=1e-12)


@settings(max_examples=10, deadline=None)
@given(batch=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
       d_model=st.integers(1, 4), d_ff=st.integers(1, 5), seed=seeds)
def test_feed_forward_with_silu_matches_reference_and_gradients(batch, d_model, d_ff, seed):
    rng = np.random.default_rng(seed)
    ffn = randomize(nn.PositionwiseFeedForward(d_model, d_ff, activation="silu"), rng)
    x = leaf(rng.uniform(-2, 2, batch + (d_model,)))
    pre = x.data @ ffn.linear1.weight.data.T + ffn.linear1.bias.data
    expected = (pre / (1 + np.exp(-pre))) @ ffn.linear2.weight.data.T + ffn.linear2.bias.data
    np.testing.assert_allclose(ffn(x).data, expected, rtol=1e-12, atol=1e-12)
    check_module(ffn, [x], ffn)


def test_feed_forward_with_gelu_gradchecks():
    rng = np.random.default_rng(3)
    ffn = randomize(nn.PositionwiseFeedForward(3, 5, activation="gelu"), rng)
    x = leaf(rng.uniform(-2, 2, (2, 4, 3)))
    pre = x.data @ ffn.linear1.weight.data.T + ffn.linear1.bias.data
    hidden = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    np.testing.assert_allclose(ffn(x).data, hidden @ ffn.linear2.weight.data.T + ffn.linear2.bias.data,
                               rtol=1e-12, atol=1e-12)
    check_module(ffn, [x], ffn)


def test_an_unknown_activation_is_named():
    with pytest.raises(ValueError, match="activation must be one of 'relu', 'silu', 'gelu', got 'swish'"):
        nn.PositionwiseFeedForward(4, 8, activation="swish")
    with pytest.raises(ValueError, match="Transformer: activation must be one of"):
        nn.Transformer(src_vocab_size=10, d_model=8, d_ff=16, heads=2, num_layers=1, activation="swish")
