"""TransformerConfig: the model's shape in one frozen dataclass, its checks, replace, dict round trips,
presets as instances, and checkpoints written while label smoothing was still a model argument."""

import dataclasses
import inspect
import json

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.translation import checkpoint
from tinyformer.model import nn
from tinyformer.translation.data.synthetic import synthetic_pairs
from tinyformer.translation.data.tokenizer import Tokenizer
from tinyformer.model.nn import TransformerConfig
from tinyformer.model.nn.presets import preset_config

SMALL = dict(src_vocab_size=11, d_model=8, d_ff=16, heads=2, num_layers=1, dropout=0.0, seed=0)


def test_the_config_is_the_one_place_of_the_fields_and_their_defaults():
    """Transformer takes a config, or its fields as keywords: it repeats no field and no default."""
    parameters = list(inspect.signature(nn.Transformer.__init__).parameters.values())
    either, keywords = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_KEYWORD
    assert [(p.name, p.kind) for p in parameters] == [("self", either), ("config", either), ("fields", keywords)]
    model = nn.Transformer(src_vocab_size=11)  # every other field: the config's default
    assert model.config == TransformerConfig(src_vocab_size=11)
    for field in dataclasses.fields(TransformerConfig):
        assert getattr(model.config, field.name) == (11 if field.name == "src_vocab_size" else field.default)
    assert "label_smoothing" not in TransformerConfig.field_names()


def test_keyword_construction_is_the_config_built_from_the_keywords():
    for fields in (SMALL, dict(SMALL, tgt_vocab_size=13, positional="learned", init="torch", final_norm=True)):
        by_keywords, by_config = nn.Transformer(**fields), nn.Transformer(TransformerConfig(**fields))
        assert type(by_keywords.config) is TransformerConfig and by_keywords.config == by_config.config
        for (name, p), (_, q) in zip(by_keywords.named_parameters(), by_config.named_parameters()):
            np.testing.assert_array_equal(p.data, q.data, err_msg=name)


@pytest.mark.parametrize("call, parts", [
    (lambda: nn.Transformer(src_vocab_size=11, d_modle=8), ["unknown argument 'd_modle'", "allowed: src_vocab_size"]),
    (lambda: nn.Transformer(11, d_model=8), ["got int", "src_vocab_size=11"]),
    (lambda: nn.Transformer(TransformerConfig(**SMALL).to_dict()), ["got dict", "TransformerConfig.from_dict(d)"]),
    (lambda: nn.Transformer(TransformerConfig(**SMALL), seed=1), ["not both", "seed", "config.replace(seed=...)"]),
    (lambda: nn.Transformer(), ["src_vocab_size is unset"]),
])
def test_a_wrong_call_is_a_one_line_type_error_naming_what_is_wrong(call, parts):
    with pytest.raises(TypeError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and message.startswith("Transformer")
    for part in parts:
        assert part in message, (part, message)


def test_it_is_frozen_and_replace_makes_a_checked_copy():
    config = TransformerConfig(**SMALL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 16
    wider = config.replace(d_model=16, heads=4)
    assert (wider.d_model, wider.heads, config.d_model) == (16, 4, 8)
    with pytest.raises(ValueError, match=r"d_model=8 is not divisible by heads=3"):
        config.replace(heads=3)


def test_replace_refuses_an_unknown_name_in_one_line_listing_the_allowed_ones():
    with pytest.raises(TypeError) as error:
        TransformerConfig().replace(d_modle=16)
    message = str(error.value)
    assert "\n" not in message and "'d_modle'" in message
    assert message.endswith("allowed: " + ", ".join(TransformerConfig.field_names()))
    with pytest.raises(TypeError, match=r"label smoothing is a property of the loss.*F\.cross_entropy"):
        TransformerConfig().replace(label_smoothing=0.1)


@pytest.mark.parametrize("name, value, parts", [
    ("d_model", 0, ["Transformer: d_model", "positive integer", "0"]),
    ("d_ff", 2.5, ["Transformer: d_ff", "2.5"]),
    ("heads", True, ["Transformer: heads", "True"]),
    ("num_layers", -1, ["Transformer: num_layers", "-1"]),
    ("max_len", None, ["Transformer: max_len", "None"]),
    ("dropout", 1.0, ["Transformer: dropout", "[0, 1)", "1.0"]),
    ("attention_dropout", float("nan"), ["Transformer: attention_dropout", "nan"]),
    ("activation_dropout", "0.1", ["Transformer: activation_dropout", "'0.1'"]),
    ("eps", -1e-6, ["Transformer: eps", "-1e-06"]),
    ("norm_first", "yes", ["Transformer: norm_first", "True or False", "'yes'"]),
    ("positional", "rotary", ["Transformer: positional", "'sinusoid'", "'learned'", "'rotary'"]),
    ("final_norm", "yes", ["Transformer: final_norm", "None, True or False", "'yes'"]),
    ("init", "kaiming", ["Transformer: init", "'xavier'", "'torch'", "'kaiming'"]),
    ("seed", -1, ["Transformer: seed", "-1"]),
    ("src_vocab_size", 0, ["Transformer: src_vocab_size", "0"]),
    ("tgt_vocab_size", 1.5, ["Transformer: tgt_vocab_size", "1.5"]),
    ("pad_id", 11, ["Transformer: pad_id", "0 <= pad_id < 11", "11"]),
])
def test_every_field_is_checked_with_a_one_line_error_naming_it(name, value, parts):
    with pytest.raises(ValueError) as error:
        TransformerConfig(**dict(SMALL, **{name: value}))
    message = str(error.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


def test_pad_id_must_fit_the_smaller_vocabulary_and_without_one_just_be_an_id():
    with pytest.raises(ValueError, match=r"0 <= pad_id < 5, got 7"):
        TransformerConfig(src_vocab_size=11, tgt_vocab_size=5, pad_id=7)
    assert TransformerConfig(pad_id=7).pad_id == 7  # no vocabulary yet: a preset
    with pytest.raises(ValueError, match="pad_id"):
        TransformerConfig(pad_id=-1)


def test_values_are_kept_as_plain_python_values():
    config = TransformerConfig(src_vocab_size=np.int64(11), d_model=np.int32(8), heads=np.int64(2),
                               dropout=np.float32(0.25), eps=np.float64(1e-6), norm_first=np.bool_(True),
                               seed=np.uint8(3))
    values = config.to_dict()
    assert type(values["src_vocab_size"]) is int and type(values["d_model"]) is int and type(values["seed"]) is int
    assert type(values["dropout"]) is float and type(values["norm_first"]) is bool
    assert json.loads(json.dumps(values)) == values  # what a checkpoint's metadata holds


def test_final_norm_and_init_default_to_the_papers_model_and_round_trip():
    config = TransformerConfig(**SMALL)
    assert (config.final_norm, config.init, config.has_final_norm) == (None, "xavier", False)
    assert TransformerConfig(**SMALL, norm_first=True).has_final_norm  # pre-LN: its own final LayerNorm
    assert not TransformerConfig(**SMALL, norm_first=True, final_norm=False).has_final_norm
    torch_like = config.replace(final_norm=np.bool_(True), init="torch")
    assert torch_like.has_final_norm and type(torch_like.to_dict()["final_norm"]) is bool
    assert TransformerConfig.from_dict(torch_like.to_dict()) == torch_like
    older = {k: v for k, v in torch_like.to_dict().items() if k not in ("final_norm", "init")}
    assert TransformerConfig.from_dict(older) == config  # a model_config written before the two existed


def test_dict_round_trip_and_the_legacy_label_smoothing_key():
    config = TransformerConfig(**SMALL, positional="learned")
    assert TransformerConfig.from_dict(config.to_dict()) == config
    old = dict(config.to_dict(), label_smoothing=0.1)  # a model_config written before it moved to the loss
    assert TransformerConfig.from_dict(old) == config and "label_smoothing" in old
    with pytest.raises(TypeError, match=r"from_dict: unknown argument 'd_modle'"):
        TransformerConfig.from_dict(dict(config.to_dict(), d_modle=8))
    with pytest.raises(TypeError, match="expected a dict"):
        TransformerConfig.from_dict([("d_model", 8)])


# ---------------------------------------------------------------------------- the model built from it
def test_a_model_built_from_a_config_equals_one_built_from_arguments():
    config = TransformerConfig(**SMALL)
    a, b = nn.Transformer(config), nn.Transformer.from_config(config)
    assert a.config is config and b.config == config
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    rebuilt = nn.Transformer(TransformerConfig.from_dict(a.config.to_dict()))  # what a checkpoint rebuilds
    assert rebuilt.config == a.config
    with pytest.raises(TypeError, match="TransformerConfig.from_dict"):
        nn.Transformer.from_config(a.config.to_dict())
    with pytest.raises(TypeError, match="src_vocab_size is unset"):
        nn.Transformer(nn.PRESETS["tiny"])


def test_presets_are_configs_and_from_preset_applies_the_overrides():
    model = nn.Transformer.from_preset("small", vocab_size=8000, dropout=0.0, num_layers=1)
    assert model.config == nn.PRESETS["small"].replace(src_vocab_size=8000, dropout=0.0, num_layers=1)
    assert nn.PRESETS["small"].dropout == 0.1  # the preset itself is unchanged


@pytest.mark.parametrize("name", list(nn.PRESETS))
def test_paper_true_is_the_papers_model_of_the_presets_size(name):
    preset = nn.PRESETS[name]
    paper = preset_config(name, vocab_size=11, paper=True, max_len=16).to_dict()
    assert {k: paper[k] for k in nn.PAPER_CHOICES} == dict(nn.PAPER_CHOICES)
    for size in ("d_model", "d_ff", "heads", "num_layers", "dropout"):  # the size is the preset's
        assert paper[size] == getattr(preset, size)
    # and the choices are the paper's: no module that the paper does not have, Xavier's draw (built at
    # one layer of the preset's width: base and big in full take seconds to draw)
    model = nn.Transformer.from_preset(name, vocab_size=11, paper=True, max_len=16, num_layers=1)
    assert model.encoder.final_norm is None and model.decoder.final_norm is None
    assert all(float(abs(layer.feed_forward.linear1.bias.data).max()) == 0 for layer in model.encoder.layers)


def test_small_is_pytorchs_configuration_and_every_other_preset_is_the_papers():
    """``small``'s choices that the paper does not make (chosen by benchmarks/results/quality.md): all
    four of ``nn.Transformer``'s, with its one dropout p."""
    pytorchs = {"attention_dropout": 0.1, "activation_dropout": 0.1, "final_norm": True, "init": "torch"}
    for name, preset in nn.PRESETS.items():
        choices = {k: getattr(preset, k) for k in nn.PAPER_CHOICES}
        assert choices == dict(nn.PAPER_CHOICES, **(pytorchs if name == "small" else {})), name
    model = nn.Transformer.from_preset("small", vocab_size=11, max_len=16, num_layers=1)
    assert model.encoder.final_norm is not None and model.decoder.final_norm is not None
    w_q, bias = model.encoder.layers[0].self_attn.w_q.weight.data, model.encoder.layers[0].feed_forward.linear1.bias.data
    assert float(abs(w_q).max()) <= (6 / (4 * 256)) ** 0.5 < (6 / (2 * 256)) ** 0.5  # the packed Q, K, V bound
    assert 0 < float(abs(bias).max()) <= 256 ** -0.5  # nn.Linear's bias, not zero


def test_paper_true_undoes_a_presets_choices_that_the_paper_does_not_make(monkeypatch):
    from tinyformer.model.nn import presets
    unlike_the_paper = nn.PRESETS["tiny"].replace(attention_dropout=0.1, activation_dropout=0.1, final_norm=True,
                                                  init="torch", norm_first=True, positional="learned")
    monkeypatch.setattr(presets, "PRESETS", {**nn.PRESETS, "tiny": unlike_the_paper})
    own = preset_config("tiny", vocab_size=11).to_dict()
    assert {k: own[k] for k in nn.PAPER_CHOICES} != dict(nn.PAPER_CHOICES)
    paper = preset_config("tiny", vocab_size=11, paper=True).to_dict()
    assert {k: paper[k] for k in nn.PAPER_CHOICES} == dict(nn.PAPER_CHOICES)
    assert {k: v for k, v in paper.items() if k not in nn.PAPER_CHOICES} == \
           {k: v for k, v in own.items() if k not in nn.PAPER_CHOICES}


def test_paper_true_gives_way_to_explicit_overrides():
    config = nn.Transformer.from_preset("tiny", vocab_size=11, paper=True, init="torch", final_norm=True).config
    assert config.init == "torch" and config.final_norm is True
    assert config.attention_dropout == 0.0


def test_label_smoothing_is_the_losss_not_the_models():
    with pytest.raises(TypeError) as error:
        nn.Transformer(src_vocab_size=11, d_model=8, d_ff=16, heads=2, num_layers=1, label_smoothing=0.1)
    message = str(error.value)
    assert "\n" not in message and "F.cross_entropy(..., label_smoothing=)" in message
    assert "TrainConfig.label_smoothing" in message
    with pytest.raises(TypeError, match="label smoothing is a property of the loss"):
        nn.Transformer.from_preset("tiny", vocab_size=11, label_smoothing=0.1)
    model = nn.Transformer(**SMALL)
    with pytest.raises(AttributeError, match="label smoothing is a property of the loss"):
        model.label_smoothing  # noqa: B018


def test_no_field_is_positional():
    # The old positional order (where label_smoothing once stood a value would become max_len): refused.
    with pytest.raises(TypeError):
        nn.Transformer(11, None, 8, 16, 2, 1, 0.0, 0.0, 0.0, 0.1)
    assert nn.Transformer(TransformerConfig(11, None, 8, 16, 2, 1, max_len=12)).config.max_len == 12


def test_a_checkpoint_whose_model_config_holds_label_smoothing_still_loads(tmp_path):
    from tinyformer.translation.train import TrainConfig, load_model

    english, german = synthetic_pairs("val")
    tokenizer = Tokenizer.train(english + german, tmp_path, vocab_size=150)
    model = nn.Transformer(src_vocab_size=len(tokenizer),
                           d_model=16, d_ff=32, heads=2, num_layers=1, dropout=0.0, seed=0)
    legacy = {  # the Transformer's config as checkpoints held it, in its order, label smoothing included
        "src_vocab_size": len(tokenizer), "tgt_vocab_size": None, "d_model": 16, "d_ff": 32, "heads": 2,
        "num_layers": 1, "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "label_smoothing": 0.1, "max_len": 1024, "pad_id": 0, "norm_first": False, "eps": 1e-5, "seed": 0,
        "positional": "sinusoid",
    }
    # final_norm, init, activation and the two depths came later: absent from such a checkpoint, they take
    # the defaults, its model's
    assert dict({k: v for k, v in legacy.items() if k != "label_smoothing"}, final_norm=None, init="xavier",
                activation="relu", encoder_layers=None, decoder_layers=None, scale_embedding=True,
                logits_bias=False) == model.config.to_dict()
    meta = {"format": "tinyformer-checkpoint-1", "config": TrainConfig(save_dir=str(tmp_path)).to_dict(),
            "model_config": legacy, "step": 1, "epoch": 0, "batch_in_epoch": 1, "tokens_seen": 0,
            "rng_state": tf.random.get_rng_state(), "tokenizer_sha256": tokenizer.sha256,
            "tokenizer_file": "spm.model", "saved_at": "2026-01-01T00:00:00"}
    path = tmp_path / "checkpoint_0000001.npz"
    checkpoint.save_checkpoint(path, model.state_dict(), meta)
    loaded, _, loaded_meta = load_model(path)
    assert loaded.config == model.config and loaded_meta["model_config"]["label_smoothing"] == 0.1
    src, tgt = np.array([[5, 6, 7, 3]]), np.array([[2, 8, 9]])
    np.testing.assert_array_equal(loaded(src, tgt).data, model.eval()(src, tgt).data)
    from tinyformer.translation.train.config import TRAINING_ONLY
    from tinyformer.translation.train.migration import migrate_model_config

    # a run may resume (restore_checkpoint reads the model_config through the migration, as here)
    assert checkpoint.model_config_mismatch(migrate_model_config(legacy), loaded.config.to_dict(),
                                            ignore=TRAINING_ONLY) == []
