"""The full Transformer: presets, tying, gradients, causality, padding, caching, dropout, training."""

import gc
import math
import time

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.engine import functional as F
from tinyformer.model import nn, optim
from tinyformer.model.nn.presets import preset_config

SRC = np.array([[3, 4, 5, 6, 0], [2, 6, 1, 7, 9], [5, 8, 0, 0, 0]])
TGT = np.array([[1, 3, 4, 2], [1, 8, 9, 9], [1, 2, 10, 3]])


def small_model(seed=0, **overrides):
    """A float64 eval-mode model, small enough for central differences."""
    config = dict(vocab_size=11, d_model=8, d_ff=16, heads=2, num_layers=2, dropout=0.0, seed=seed)
    config.update(overrides)
    return nn.Transformer.from_preset("tiny", **config).double().eval()


def expected_parameter_count(vocab, d, d_ff, layers, tgt_vocab=None, norm_first=False):
    attention = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder = layers * (attention + ffn + 2 * norm)
    decoder = layers * (2 * attention + ffn + 3 * norm)
    finals = 2 * norm if norm_first else 0
    return vocab * d + (tgt_vocab or 0) * d + encoder + decoder + finals


def decoder_output(model, tgt, memory, src_mask):
    """The last decoder states h (before the output projection), built from public parts (eval mode)."""
    x = model.positional(model.tgt_embed(tgt) * math.sqrt(model.d_model))
    return model.decoder(x, memory, src_mask)


# ---------------------------------------------------------------------------- presets
def test_presets_hold_the_papers_numbers():
    p = nn.PRESETS
    assert set(p) >= {"base", "big", "small", "tiny"}
    assert p["base"] == nn.TransformerConfig(num_layers=6, d_model=512, d_ff=2048, heads=8, dropout=0.1)
    assert p["big"] == nn.TransformerConfig(num_layers=6, d_model=1024, d_ff=4096, heads=16, dropout=0.3)
    for name, (layers, d, d_ff, heads) in {"small": (3, 256, 1024, 4), "tiny": (2, 64, 256, 4)}.items():
        assert (p[name].num_layers, p[name].d_model, p[name].d_ff, p[name].heads) == (layers, d, d_ff, heads)
    for config in p.values():  # the vocabulary is the user's; label smoothing the training's (TrainConfig)
        assert config.src_vocab_size is None and config.tgt_vocab_size is None
        assert "label_smoothing" not in config.to_dict()
    with pytest.raises(TypeError):
        p["tiny"] = p["base"]  # a read-only view: presets are not changed by accident


def lazily_zero_initialised(monkeypatch):
    """Weights drawn as zeros (calloc: pages untouched until read) instead of random numbers: a
    213 M-parameter model is built in a moment, with every parameter's shape and tying as built."""
    monkeypatch.setattr(nn.init, "xavier_uniform", lambda fan_out, fan_in, generator=None: nn.init.zeros(
        (fan_out, fan_in)))
    monkeypatch.setattr(nn.init, "normal", lambda shape, std, generator=None: nn.init.zeros(shape))


@pytest.mark.parametrize("name, low, high", [("base", 63e6, 65e6), ("big", 210e6, 215e6)])
def test_paper_sizes_parameter_counts(name, low, high, monkeypatch):
    lazily_zero_initialised(monkeypatch)  # the counts and the structure are the point, not the values
    model = nn.Transformer.from_preset(name, vocab_size=37000)
    try:
        count = model.num_parameters()
        c = nn.PRESETS[name]
        assert count == expected_parameter_count(37000, c.d_model, c.d_ff, c.num_layers)
        assert low <= count <= high
        assert model.src_embed.weight is model.tgt_embed.weight
        assert model.config == c.replace(src_vocab_size=37000)
        assert len(model.encoder.layers) == len(model.decoder.layers) == 6
        assert model.decoder.layers[0].self_attn.heads == c.heads
    finally:
        del model
        gc.collect()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("tgt_vocab", [None, 7])
def test_parameter_count_formula(norm_first, tgt_vocab):
    kwargs = dict(src_vocab_size=13) if tgt_vocab is None else dict(src_vocab_size=13, tgt_vocab_size=tgt_vocab)
    model = nn.Transformer.from_preset("tiny", norm_first=norm_first, **kwargs)
    assert model.num_parameters() == expected_parameter_count(13, 64, 256, 2, tgt_vocab, norm_first)
    assert (model.encoder.final_norm is not None) == norm_first


def test_preset_overrides_and_errors():
    model = nn.Transformer.from_preset("tiny", vocab_size=11, d_model=16, heads=2, num_layers=1)
    assert model.config.d_model == 16 and model.config.d_ff == 256 and len(model.encoder.layers) == 1
    with pytest.raises(ValueError) as error:
        nn.Transformer.from_preset("huge", vocab_size=11)
    message = str(error.value)
    assert "huge" in message and all(name in message for name in ("base", "big", "small", "tiny"))
    with pytest.raises(TypeError, match="d_modle"):
        nn.Transformer.from_preset("tiny", vocab_size=11, d_modle=16)
    with pytest.raises(TypeError):
        nn.Transformer.from_preset("tiny")  # no vocabulary
    with pytest.raises(TypeError):
        nn.Transformer.from_preset("tiny", vocab_size=11, src_vocab_size=11, tgt_vocab_size=9)


# ---------------------------------------------------------------------------- tying
def test_shared_vocabulary_ties_embeddings_and_output_projection():
    model = small_model()
    w = model.src_embed.weight
    assert model.tgt_embed is model.src_embed and model.tgt_embed.weight is w
    assert sum(p is w for p in model.parameters()) == 1
    memory = model.encode(SRC)
    mask = model.source_mask(SRC)
    logits = model.decode(TGT, memory, mask)
    assert logits.shape == (3, 4, 11)
    h = decoder_output(model, TGT, memory, mask).data
    np.testing.assert_allclose(logits.data, h @ w.data.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(model(SRC, TGT).data, logits.data)
    # the shared matrix gets gradient from the source side, the target side and the projection
    (g,) = tf.grad(model(SRC, TGT), [w], np.random.default_rng(0).standard_normal((3, 4, 11)))
    assert np.abs(g[7]).max() > 0  # id 7 occurs only in the source
    assert np.abs(g[10]).max() > 0  # id 10 occurs only in the target


def test_separate_vocabularies():
    model = small_model(vocab_size=None, src_vocab_size=13, tgt_vocab_size=7)
    assert model.src_embed is not model.tgt_embed
    assert model.src_embed.weight.shape == (13, 8) and model.tgt_embed.weight.shape == (7, 8)
    assert not model.shared_vocab
    src = np.array([[12, 3, 0], [11, 5, 6]])
    tgt = np.array([[1, 6, 2], [1, 3, 3]])
    memory = model.encode(src)
    logits = model.decode(tgt, memory, model.source_mask(src))
    assert logits.shape == (2, 3, 7)
    h = decoder_output(model, tgt, memory, model.source_mask(src)).data
    np.testing.assert_allclose(logits.data, h @ model.tgt_embed.weight.data.T, rtol=1e-12, atol=1e-12)
    names = [n for n, _ in model.named_parameters()]
    assert "src_embed.weight" in names and "tgt_embed.weight" in names
    with pytest.raises(IndexError):
        model(src, np.array([[1, 7, 2], [1, 3, 3]]))  # 7 is a source-only id


# ---------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_layer_norm_placements_gradcheck(norm_first):
    model = small_model(norm_first=norm_first, num_layers=1)
    params = model.parameters()
    tf.gradcheck(lambda *ps: model(SRC, TGT), params, mode="fast", seed=1)
    tf.gradcheck(lambda *ps: model(SRC[:2, :3], TGT[:2, :2]), params[:12], mode="full", seed=2)


def test_post_ln_and_pre_ln_differ():
    post, pre = small_model(seed=3), small_model(seed=3, norm_first=True)
    pre.load_state_dict(post.state_dict(), strict=False)
    assert not np.allclose(post(SRC, TGT).data, pre(SRC, TGT).data)


def test_whole_tiny_model_gradcheck():
    tf.manual_seed(0)
    model = nn.Transformer.from_preset("tiny", vocab_size=11, dropout=0.0).double()
    params = model.parameters()
    assert len(params) == len(model.named_parameters())
    report = tf.gradcheck(lambda *ps: model(SRC, TGT), params, mode="fast", seed=3)
    assert len(report.inputs) == len(params)


def assert_rows_of_the_full_logits(model, chosen, full, rows, seed):
    """``chosen`` (count, vocab) are ``full``'s logits at the boolean ``rows``, and in float64 a random
    upstream gradient on them gives every parameter the gradient of that upstream placed on those
    rows of ``full`` (zeros elsewhere)."""
    assert chosen.shape == (int(rows.sum()), full.shape[-1])
    np.testing.assert_allclose(chosen.data, full.data[rows], rtol=1e-12, atol=1e-12)
    upstream = np.random.default_rng(seed).standard_normal(chosen.shape)
    padded_upstream = np.zeros(full.shape)
    padded_upstream[rows] = upstream
    grads = []
    for logits, g in ((chosen, upstream), (full, padded_upstream)):
        model.zero_grad()
        (logits * tf.Tensor(g)).sum().backward()
        grads.append({n: p.grad.copy() for n, p in model.named_parameters()})
    for name in grads[0]:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-10, atol=1e-13, err_msg=name)


def test_the_logits_of_chosen_positions_are_those_rows_with_their_gradients():
    """``positions=`` (a boolean (batch, len_tgt) array) gives the logits of those positions only,
    (count, vocab) in row-major order: the rows of the full logits, and in float64 the same
    parameter gradients as the full logits with the upstream gradient (random) on those rows only."""
    model = small_model(seed=3)
    positions = TGT != 9  # two positions left out
    full = model(SRC, TGT)
    chosen = model(SRC, TGT, positions=positions)
    assert chosen.shape[-1] == 11
    assert_rows_of_the_full_logits(model, chosen, full, positions, seed=7)
    tf.gradcheck(lambda *ps: model(SRC, TGT, positions=positions), model.parameters(), mode="fast", seed=4)


def test_positions_of_the_wrong_kind_or_shape_are_named():
    model = small_model()
    with pytest.raises(TypeError, match=r"positions must be a boolean array of tgt_in's shape \(3, 4\), got dtype int64"):
        model(SRC, TGT, positions=(TGT != 9).astype(np.int64))
    with pytest.raises(ValueError, match=r"positions must have tgt_in's shape \(3, 4\), got \(3, 3\)"):
        model(SRC, TGT, positions=np.ones((3, 3), dtype=bool))
    memory = model.encode(SRC)
    with pytest.raises(TypeError, match=r"positions must be a boolean array of tgt's shape \(3, 4\), got list"):
        model.decode(TGT, memory, positions=[[True] * 4] * 3)


def test_gradient_reaches_memory():
    model = small_model()
    memory = tf.Tensor(np.random.default_rng(1).standard_normal((3, 5, 8)), requires_grad=True)
    mask = model.source_mask(SRC)
    tf.gradcheck(lambda m: model.decode(TGT, m, mask), [memory], mode="full")


# ---------------------------------------------------------------------------- the feed-forward activation
def test_silu_models_keep_relu_models_weights_and_gradcheck():
    """activation="silu" changes the feed-forward nonlinearity only: the same seed draws the same weights,
    the outputs differ, the config round-trips, and every parameter gradchecks (float64, random upstream)."""
    relu, silu = small_model(seed=5, num_layers=1), small_model(seed=5, num_layers=1, activation="silu")
    assert relu.config.activation == "relu" and silu.config.activation == "silu"
    for name, value in relu.state_dict().items():
        np.testing.assert_array_equal(silu.state_dict()[name], value)
    assert not np.allclose(relu(SRC, TGT).data, silu(SRC, TGT).data)
    rebuilt = nn.Transformer(silu.config).double().eval()
    rebuilt.load_state_dict(silu.state_dict())
    np.testing.assert_array_equal(rebuilt(SRC, TGT).data, silu(SRC, TGT).data)
    tf.gradcheck(lambda *ps: silu(SRC, TGT), silu.parameters(), mode="fast", seed=8)


def test_paper_restores_the_relu():
    assert preset_config("small", 10, activation="silu").activation == "silu"
    assert preset_config("small", 10, paper=True, activation="silu").activation == "silu"  # overrides still apply
    assert nn.PAPER_CHOICES["activation"] == "relu"


# ---------------------------------------------------------------------------- positions (§3.5, Table 3 (E))
def test_sinusoids_are_the_default_and_add_no_parameters():
    model = nn.Transformer.from_preset("tiny", vocab_size=13)
    assert model.config.positional == "sinusoid" and isinstance(model.positional, nn.PositionalEncoding)
    assert "positional" not in {n.split(".")[0] for n, _ in model.named_parameters()}
    assert model.num_parameters() == expected_parameter_count(13, 64, 256, 2)


def test_learned_positions_add_one_parameter_and_keep_every_other_initial_weight():
    sinusoid = small_model(seed=4, max_len=6)
    learned = small_model(seed=4, max_len=6, positional="learned")
    assert isinstance(learned.positional, nn.LearnedPositionalEmbedding)
    assert learned.config.positional == "learned" and "positional=learned" in learned.extra_repr()
    assert learned.num_parameters() == sinusoid.num_parameters() + 6 * 8
    own, other = learned.state_dict(), sinusoid.state_dict()
    assert set(own) - set(other) == {"positional.weight"} and own["positional.weight"].shape == (6, 8)
    for name in other:  # the same seed draws the same weights everywhere else
        np.testing.assert_array_equal(own[name], other[name])
    assert not np.allclose(learned(SRC, TGT).data, sinusoid(SRC, TGT).data)


def test_learned_positions_gradcheck():
    """Every parameter of a tiny model with learned positions, float64, random upstream gradient."""
    model = small_model(max_len=6, num_layers=1, positional="learned")
    params = model.parameters()
    weight = model.positional.weight
    assert any(p is weight for p in params)
    tf.gradcheck(lambda *ps: model(SRC, TGT), params, mode="fast", seed=5)
    tf.gradcheck(lambda w: model(SRC, TGT), [weight], mode="full", seed=6)
    (g,) = tf.grad(model(SRC, TGT), [weight], np.random.default_rng(7).standard_normal((3, 4, 11)))
    assert np.abs(g[:5]).min(axis=1).all()  # positions 0-4 hold source (and target) tokens
    assert not g[5].any()  # no sequence reaches position 5


def test_learned_positions_round_trip_through_state_dict_and_config():
    model = small_model(seed=1, max_len=6, positional="learned")
    model.positional.weight.data = model.positional.weight.data + 0.5  # as if trained
    rebuilt = nn.Transformer(model.config).double().eval()  # what load_model does with a checkpoint
    assert isinstance(rebuilt.positional, nn.LearnedPositionalEmbedding)
    assert not np.allclose(rebuilt(SRC, TGT).data, model(SRC, TGT).data)
    rebuilt.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(rebuilt(SRC, TGT).data, model(SRC, TGT).data)
    with pytest.raises(nn.StateDictError, match="positional.weight"):
        small_model(max_len=6).load_state_dict(model.state_dict())


def test_marians_sinusoids_add_no_parameters_and_decode_incrementally_as_in_full():
    split, plain = small_model(seed=2, positional="sinusoid_split"), small_model(seed=2)
    assert [n for n, _ in split.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert "positional=sinusoid_split" in split.extra_repr()
    assert not np.allclose(split(SRC, TGT).data, plain(SRC, TGT).data)
    memory, mask = split.encode(SRC), split.source_mask(SRC)
    full = split.decode(TGT, memory, mask).data
    state = split.init_state()
    steps = [split.decode(TGT[:, t:t + 1], memory, src_mask=mask, state=state).data for t in range(TGT.shape[1])]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("bad", ["rotary", "Learned", None, 1])
def test_unknown_positional_is_named(bad):
    with pytest.raises(ValueError) as error:
        nn.Transformer.from_preset("tiny", vocab_size=11, positional=bad)
    message = str(error.value)
    assert "positional" in message and "'sinusoid'" in message and "'learned'" in message
    assert repr(bad) in message


# ---------------------------------------------------------------------------- causality and padding
@pytest.mark.parametrize("t", [0, 1, 2])
def test_decoder_is_causal_in_logits_and_gradients(t):
    model = small_model()
    params = model.parameters()
    rng = np.random.default_rng(t)
    changed = TGT.copy()
    changed[:, t + 1] = np.where(TGT[:, t + 1] == 5, 6, 5)
    a, b = model(SRC, TGT), model(SRC, changed)
    np.testing.assert_allclose(b.data[:, :t + 1], a.data[:, :t + 1], rtol=0, atol=1e-12)
    assert not np.allclose(b.data[:, t + 1], a.data[:, t + 1])  # position t+1 itself does change
    upstream = rng.standard_normal((3, t + 1, 11))
    grads_a = tf.grad(a[:, :t + 1], params, upstream)
    grads_b = tf.grad(b[:, :t + 1], params, upstream)
    for (name, _), ga, gb in zip(model.named_parameters(), grads_a, grads_b):
        np.testing.assert_allclose(gb, ga, rtol=0, atol=1e-12, err_msg=name)
    assert any(np.abs(g).max() > 0 for g in grads_a)


def test_source_padding_does_not_change_logits():
    model = small_model()
    base = model(SRC, TGT).data
    for extra in (1, 3):
        padded = np.concatenate([SRC, np.zeros((3, extra), dtype=SRC.dtype)], axis=1)
        np.testing.assert_allclose(model(padded, TGT).data, base, rtol=0, atol=1e-10)
    other = SRC.copy()
    other[2, 1] = 9  # a real token does matter
    assert not np.allclose(model(other, TGT).data[2], base[2])


def test_source_mask_hides_pad_id():
    model = small_model(pad_id=2)
    mask = model.source_mask(np.array([[2, 5, 2], [3, 4, 6]]))
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == bool
    np.testing.assert_array_equal(mask[:, 0, 0], [[False, True, False], [True, True, True]])


# ---------------------------------------------------------------------------- nn.Transformer's extras (issue 28)
FINAL_NORMS = ["encoder.final_norm.weight", "encoder.final_norm.bias", "decoder.final_norm.weight",
               "decoder.final_norm.bias"]


def test_final_norm_adds_a_layer_norm_after_each_post_ln_stack_and_keeps_every_other_initial_weight():
    plain, final = small_model(seed=2), small_model(seed=2, final_norm=True)
    assert plain.encoder.final_norm is None and plain.decoder.final_norm is None
    assert final.num_parameters() == plain.num_parameters() + 4 * 8
    assert "final_norm=True" in final.extra_repr() and "final_norm" not in plain.extra_repr()
    own, other = final.state_dict(), plain.state_dict()
    assert sorted(set(own) - set(other)) == sorted(FINAL_NORMS)
    for name in other:  # the same seed draws the same weights everywhere else
        np.testing.assert_array_equal(own[name], other[name])
    memory = final.encode(SRC)  # the plain stack's output, normalised once more
    np.testing.assert_allclose(memory.data, final.encoder.final_norm(plain.encode(SRC)).data, rtol=0, atol=1e-12)
    mask = final.source_mask(SRC)
    h = final.decoder(final.positional(final.tgt_embed(TGT) * math.sqrt(8)), memory, mask)
    plain_h = plain.decoder(plain.positional(plain.tgt_embed(TGT) * math.sqrt(8)), memory, mask)
    np.testing.assert_allclose(h.data, final.decoder.final_norm(plain_h).data, rtol=0, atol=1e-12)
    # pre-LN has its final LayerNorms by default (final_norm None); False removes them
    assert small_model(norm_first=True).encoder.final_norm is not None
    bare = small_model(norm_first=True, final_norm=False)
    assert bare.encoder.final_norm is None and bare.num_parameters() == plain.num_parameters()


def test_final_norm_gradcheck():
    """Every parameter of a post-LN model with final LayerNorms, float64, random upstream gradient;
    the final LayerNorms element by element, at a gain and bias away from 1 and 0."""
    model = small_model(num_layers=1, final_norm=True)
    rng = np.random.default_rng(8)
    finals = []
    for norm in (model.encoder.final_norm, model.decoder.final_norm):
        norm.weight.data[...] = 1 + 0.2 * rng.standard_normal(8)
        norm.bias.data[...] = 0.2 * rng.standard_normal(8)
        finals += [norm.weight, norm.bias]
    params = model.parameters()
    assert all(any(p is f for p in params) for f in finals)
    tf.gradcheck(lambda *ps: model(SRC, TGT), params, mode="fast", seed=9)
    tf.gradcheck(lambda *ps: model(SRC, TGT), finals, mode="full", seed=10)


def test_incremental_decode_with_final_norm_equals_full_decode():
    model = small_model(final_norm=True)
    memory, mask = model.encode(SRC), model.source_mask(SRC)
    full = model.decode(TGT, memory, mask).data
    state = model.init_state()
    steps = [model.decode(TGT[:, t:t + 1], memory, src_mask=mask, state=state).data for t in range(TGT.shape[1])]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------- stacks of different depths
def test_encoder_and_decoder_depths_can_differ():
    """encoder_layers / decoder_layers (Marian's) build stacks of their own depth: layer counts, the
    config round trip, incremental decoding equal to the full pass, and every parameter gradchecks."""
    model = small_model(seed=6, num_layers=1, encoder_layers=2, decoder_layers=1)
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (2, 1)
    assert "N=2+1" in model.extra_repr()
    both_one = small_model(seed=6, num_layers=1)
    # one more encoder layer: self-attention, the feed-forward network, two LayerNorms
    one_layer = 4 * (8 * 8 + 8) + (8 * 16 + 16 + 16 * 8 + 8) + 2 * 2 * 8
    assert model.num_parameters() - both_one.num_parameters() == one_layer
    rebuilt = nn.Transformer(model.config).double().eval()
    rebuilt.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(rebuilt(SRC, TGT).data, model(SRC, TGT).data)
    memory, mask = model.encode(SRC), model.source_mask(SRC)
    full = model.decode(TGT, memory, mask).data
    state = model.init_state()
    steps = [model.decode(TGT[:, t:t + 1], memory, src_mask=mask, state=state).data for t in range(TGT.shape[1])]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)
    tf.gradcheck(lambda *ps: model(SRC, TGT), model.parameters(), mode="fast", seed=11)
    deeper_decoder = small_model(num_layers=2, decoder_layers=3)
    assert (len(deeper_decoder.encoder.layers), len(deeper_decoder.decoder.layers)) == (2, 3)


@pytest.mark.parametrize("name", ["encoder_layers", "decoder_layers"])
def test_a_depth_below_one_is_named(name):
    with pytest.raises(ValueError, match=f"Transformer: {name}"):
        small_model(**{name: 0})


# ---------------------------------------------------------------------------- Marian's embedding scale and logits bias
def test_embeddings_unscaled_when_scale_embedding_is_off():
    """scale_embedding=False leaves out §3.4's √d_model: the same weights, the embedding sum as it is."""
    scaled, plain = small_model(seed=7, num_layers=1), small_model(seed=7, num_layers=1, scale_embedding=False)
    for name, value in scaled.state_dict().items():
        np.testing.assert_array_equal(plain.state_dict()[name], value)
    weight = plain.src_embed.weight.data
    position = nn.PositionalEncoding(8, 1024)
    expected = position(tf.Tensor(weight[SRC]), 0).data
    np.testing.assert_allclose(plain._embed(plain.src_embed, SRC).data, expected, rtol=1e-12, atol=1e-12)
    assert not np.allclose(plain(SRC, TGT).data, scaled(SRC, TGT).data)
    assert "scale_embedding=False" in plain.extra_repr()


def test_a_logits_bias_is_one_more_parameter_added_to_every_position_and_trained():
    plain, biased = small_model(seed=8, num_layers=1), small_model(seed=8, num_layers=1, logits_bias=True)
    assert biased.num_parameters() == plain.num_parameters() + 11
    names = [n for n, _ in biased.named_parameters()]
    assert "logits_bias" in names
    assert [n for n, _ in plain.named_parameters()] == [n for n in names if n != "logits_bias"]
    np.testing.assert_array_equal(biased(SRC, TGT).data, plain(SRC, TGT).data)  # zeros at first
    bias = np.random.default_rng(9).standard_normal(11)
    biased.logits_bias.data = bias
    np.testing.assert_allclose(biased(SRC, TGT).data, plain(SRC, TGT).data + bias, rtol=1e-12, atol=1e-12)
    tf.gradcheck(lambda *ps: biased(SRC, TGT), biased.parameters(), mode="fast", seed=12)
    tf.gradcheck(lambda b: biased(SRC, TGT), [biased.logits_bias], mode="full", seed=13)
    rebuilt = nn.Transformer(biased.config).double().eval()
    rebuilt.load_state_dict(biased.state_dict())
    np.testing.assert_array_equal(rebuilt(SRC, TGT).data, biased(SRC, TGT).data)
    with pytest.raises(nn.StateDictError, match="logits_bias"):
        plain.load_state_dict(biased.state_dict())


@pytest.mark.parametrize("name", ["scale_embedding", "logits_bias"])
def test_the_marian_switches_take_booleans_only(name):
    with pytest.raises(ValueError, match=f"Transformer: {name} must be True or False, got 1"):
        small_model(**{name: 1})


def _uniform_bound_and_variance(arrays, bound):
    """Whether ``arrays`` look like U(-bound, bound) samples: within it, reaching near it (the largest
    of n falls below (1 - 10/n)·bound with probability e^-10), variance bound²/3 (to 4 standard
    deviations of a sample variance, 0.89/√n relative)."""
    samples = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
    n = samples.size
    assert np.abs(samples).max() <= bound
    assert np.abs(samples).max() > (1 - 10 / n) * bound
    np.testing.assert_allclose(samples.var(), bound ** 2 / 3, rtol=4 * 0.89 / math.sqrt(n))


def test_torch_init_draws_nn_transformers_statistics():
    d, d_ff = 64, 256
    model = nn.Transformer.from_preset("tiny", vocab_size=50, init="torch", seed=3)
    xavier = nn.Transformer.from_preset("tiny", vocab_size=50, seed=3)
    assert model.config.init == "torch" and "init=torch" in model.extra_repr()
    attentions = [layer.self_attn for layer in model.encoder.layers] + [
        a for layer in model.decoder.layers for a in (layer.self_attn, layer.cross_attn)]
    for attention in attentions:
        packed = [attention.w_q.weight.data, attention.w_k.weight.data, attention.w_v.weight.data]
        _uniform_bound_and_variance(packed, math.sqrt(6 / (d + 3 * d)))  # one (3d, d) in_proj_weight
        _uniform_bound_and_variance([attention.w_o.weight.data], math.sqrt(6 / (2 * d)))
        for linear in (attention.w_q, attention.w_k, attention.w_v, attention.w_o):
            assert not linear.bias.data.any()
    networks = [layer.feed_forward for layer in [*model.encoder.layers, *model.decoder.layers]]
    for ff in networks:
        _uniform_bound_and_variance([ff.linear1.weight.data], math.sqrt(6 / (d + d_ff)))
        _uniform_bound_and_variance([ff.linear2.weight.data], math.sqrt(6 / (d + d_ff)))
    _uniform_bound_and_variance([ff.linear1.bias.data for ff in networks], 1 / math.sqrt(d))  # nn.Linear's
    _uniform_bound_and_variance([ff.linear2.bias.data for ff in networks], 1 / math.sqrt(d_ff))
    for name, array in model.state_dict().items():
        assert array.dtype == np.float32, name
        if "norm" in name:  # LayerNorms: gain 1, bias 0, as with "xavier"
            np.testing.assert_array_equal(array, xavier.state_dict()[name], err_msg=name)
    np.testing.assert_array_equal(model.src_embed.weight.data, xavier.src_embed.weight.data)  # drawn first, the same
    # the paper's "xavier": each projection on its own (d, d) shape, biases zero
    attention = xavier.encoder.layers[0].self_attn
    _uniform_bound_and_variance([attention.w_q.weight.data], math.sqrt(6 / (2 * d)))
    assert not xavier.encoder.layers[0].feed_forward.linear1.bias.data.any()
    again = nn.Transformer.from_preset("tiny", vocab_size=50, init="torch", seed=3)
    for name, array in model.state_dict().items():  # seeded: the same draw again
        np.testing.assert_array_equal(array, again.state_dict()[name], err_msg=name)


# ---------------------------------------------------------------------------- incremental decoding
@pytest.mark.parametrize("positional", ["sinusoid", "learned"])
def test_incremental_decode_equals_full_decode(positional):
    model = small_model(positional=positional)
    memory = model.encode(SRC)
    mask = model.source_mask(SRC)
    full = model.decode(TGT, memory, mask).data
    state = model.init_state()
    assert len(state.caches) == 2 and state.position == 0
    steps = []
    for t in range(TGT.shape[1]):
        steps.append(model.decode(TGT[:, t:t + 1], memory, src_mask=mask, state=state).data)
        assert state.position == t + 1
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-10)


def test_state_reorder_selects_cached_rows():
    model = small_model()
    memory = model.encode(SRC)
    mask = model.source_mask(SRC)
    full = model.decode(TGT, memory, mask).data
    state = model.init_state()
    for t in range(2):
        model.decode(TGT[:, t:t + 1], memory, src_mask=mask, state=state)
    old = {(i, part, name): a.data.copy() for i, c in enumerate(state.caches)
           for part, d in c.items() for name, a in d.items()}
    assert {part for _, part, _ in old} == {"self", "cross"}
    index = np.array([2, 0, 0, 1])
    state.reorder(index)
    for (i, part, name), before in old.items():
        np.testing.assert_array_equal(state.caches[i][part][name].data, before[index])
    step = model.decode(TGT[index, 2:3], memory[index], src_mask=mask[index], state=state).data
    np.testing.assert_allclose(step, full[index, 2:3], rtol=0, atol=1e-10)


def test_decoding_beyond_max_len_raises():
    model = small_model(max_len=4)
    memory = model.encode(SRC[:, :4])
    mask = model.source_mask(SRC[:, :4])
    with pytest.raises(ValueError, match="max_len"):
        model.decode(np.ones((3, 5), dtype=np.int64), memory, mask)
    state = model.init_state()
    for _ in range(4):
        model.decode(np.ones((3, 1), dtype=np.int64), memory, mask, state=state)
    with pytest.raises(ValueError, match="max_len"):
        model.decode(np.ones((3, 1), dtype=np.int64), memory, mask, state=state)
    with pytest.raises(ValueError, match="max_len"):
        model.encode(SRC)  # 5 source positions


# ---------------------------------------------------------------------------- dropout
def test_dropout_repeats_after_manual_seed_and_eval_has_none():
    model = small_model(dropout=0.3, attention_dropout=0.2, activation_dropout=0.2, seed=None).train()
    tf.manual_seed(5)
    a = model(SRC, TGT).data
    tf.manual_seed(5)
    np.testing.assert_array_equal(model(SRC, TGT).data, a)
    tf.manual_seed(6)
    assert not np.allclose(model(SRC, TGT).data, a)
    model.eval()
    e1, e2 = model(SRC, TGT).data, model(SRC, TGT).data
    np.testing.assert_array_equal(e1, e2)
    no_dropout = small_model(seed=None)
    no_dropout.load_state_dict(model.state_dict())
    np.testing.assert_allclose(e1, no_dropout(SRC, TGT).data, rtol=1e-12, atol=1e-12)
    assert not np.allclose(a, e1)


def test_dropout_repeats_after_manual_seed_with_seeded_model():
    model = small_model(seed=7, dropout=0.0, attention_dropout=0.2).train()
    tf.manual_seed(5)
    a = model(SRC, TGT).data
    tf.manual_seed(5)
    np.testing.assert_array_equal(model(SRC, TGT).data, a)


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("src", [SRC[0], SRC[None]])
def test_encode_rejects_src_of_wrong_rank(src):
    model = small_model()
    with pytest.raises(ValueError, match="src"):
        model.encode(src)


@pytest.mark.parametrize("src", [SRC[0], SRC[None]])
def test_forward_rejects_src_of_wrong_rank_naming_src(src):
    model = small_model()
    with pytest.raises(ValueError, match="src"):
        model(src, TGT)


def test_bad_target_and_ids():
    model = small_model()
    with pytest.raises(ValueError, match="tgt"):
        model(SRC, TGT[0])
    with pytest.raises(IndexError, match="11"):
        model(SRC, np.array([[1, 11], [1, 2], [1, 2]]))
    with pytest.raises(IndexError, match="-1"):
        model(np.array([[3, -1]]), np.array([[1, 2]]))
    with pytest.raises(TypeError):
        model(SRC.astype(np.float64), TGT)


# ---------------------------------------------------------------------------- training
def test_tiny_model_overfits_a_few_pairs():
    tf.manual_seed(0)
    vocab, bos = 12, 1
    rng = np.random.default_rng(0)
    src = rng.integers(2, vocab, (8, 6))
    tgt = rng.integers(2, vocab, (8, 5))
    tgt_in = np.concatenate([np.full((8, 1), bos), tgt[:, :-1]], axis=1)
    model = nn.Transformer.from_preset("tiny", vocab_size=vocab, dropout=0.0)
    opt = optim.Adam(model.parameters(), lr=optim.NoamSchedule(64, warmup_steps=10, factor=0.1))
    start = time.perf_counter()
    losses = []
    for _ in range(150):
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits, tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if losses[-1] < 0.05:
            break
    elapsed = time.perf_counter() - start
    assert logits.dtype == np.float32
    assert losses[0] > 1.5  # starts near log(12)
    assert losses[-1] < 0.1, f"loss only fell to {losses[-1]:.3f} in {len(losses)} steps ({elapsed:.1f}s)"
    # About 30 steps with this seed and schedule; a step count (not a wall-clock limit) keeps
    # the test fast and deterministic on a loaded machine.
    assert len(losses) <= 60, f"{len(losses)} steps ({elapsed:.1f}s) to reach loss {losses[-1]:.3f}"
    model.eval()
    np.testing.assert_array_equal(model(src, tgt_in).data.argmax(axis=-1), tgt)
    # greedy decoding from BOS with the cache reproduces the targets too
    memory = model.encode(src)
    mask = model.source_mask(src)
    state = model.init_state()
    token = np.full((8, 1), bos)
    decoded = []
    for _ in range(5):
        token = model.decode(token, memory, mask, state=state).data[:, -1].argmax(axis=-1)[:, None]
        decoded.append(token)
    np.testing.assert_array_equal(np.concatenate(decoded, axis=1), tgt)


TGT_PADDED = np.array([[1, 3, 4, 2], [1, 8, 0, 0], [1, 2, 10, 0]])  # pad_id 0, as SRC's


def test_packed_rows_give_the_padded_models_logits_and_gradients():
    """``packed=True`` (the layers on the positions that are not padding, attention in the padded
    layout): the logits of the non-padding target positions and, in float64 with a random upstream
    gradient, every parameter gradient equal the padded model's; central differences agree."""
    model = small_model(seed=6)
    counted = TGT_PADDED != 0
    full = model(SRC, TGT_PADDED)
    packed = model(SRC, TGT_PADDED, packed=True)
    assert_rows_of_the_full_logits(model, packed, full, counted, seed=8)
    tf.gradcheck(lambda *ps: model(SRC, TGT_PADDED, packed=True), model.parameters(), mode="fast", seed=5)


def test_packed_rows_serve_any_positions_even_padding_ones():
    """Chosen positions, a padding position among them, come out as the padded model's rows: each
    target runs up to its last chosen or non-padding position, all that causal attention needs."""
    model = small_model(seed=7)
    positions = np.array([[False, True, False, False], [True, False, False, True], [False, False, True, False]])
    full = model(SRC, TGT_PADDED)
    packed = model(SRC, TGT_PADDED, positions=positions, packed=True)
    np.testing.assert_allclose(packed.data, full.data[positions], rtol=1e-12, atol=1e-12)
    from tinyformer.model.nn.packing import PackedRows

    rows = PackedRows.prefixes(positions | (TGT_PADDED != 0))
    np.testing.assert_array_equal(rows.mask, [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    np.testing.assert_array_equal(PackedRows.prefixes(np.zeros((1, 3), bool)).mask, [[0, 0, 0]])


def test_packed_rows_refuse_masks_of_their_own():
    model = small_model()
    with pytest.raises(ValueError, match="packed=True hides the padding itself; give no src_mask or tgt_mask"):
        model(SRC, TGT_PADDED, src_mask=model.source_mask(SRC), packed=True)
    attention = nn.MultiHeadAttention(8, 2)
    from tinyformer.model.nn.packing import PackedRows

    rows = PackedRows(TGT_PADDED != 0)
    with pytest.raises(ValueError, match=r"query must be its 9 packed rows \(9, 8\), got shape \(3, 4, 8\)"):
        attention(tf.Tensor(np.zeros((3, 4, 8))), query_rows=rows)
