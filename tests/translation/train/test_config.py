"""TrainConfig's declarations and what is derived from them: the command line's options, help texts
and --resume rule, resolved()'s defaults and checks (the same refusals through the API and the
command line), the model_overrides refusals and the settings that shape no parameter."""

import argparse
import dataclasses
import math
import os

import numpy as np
import pytest

from tinyformer.translation import checkpoint
from tinyformer import cli
from tinyformer.translation.train import TrainConfig
from tinyformer.translation.train.config import (
    DATASETS,
    OPTIONS,
    RESUMABLE,
    RUN_SET,
    TRAINING_ONLY,
    ConfigError,
    default_save_dir,
    default_value,
    flag_of,
)
from tinyformer.translation.train.recipes import RECIPES

CLI_ONLY = {"resume", "no_progress", "no_test"}  # train options that are no field of the config


def train_options():
    """{dest: argparse action} of `tinyformer train`."""
    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in commands.choices["train"]._actions if a.dest != "help"}


# Fields the command line does not set: a dict of Transformer arguments, the corpus files'
# SHA-256 that the run records when it starts, and the name of an --init-from run's tokenizer.
FLAGLESS = {"model_overrides", "data_files", "tokenizer_file"}


def resolved_for(data):
    """The defaults of ``data`` (a corpus of one's own needs its --train)."""
    return TrainConfig(data=data, train_data="corpus" if data == "files" else None).resolved()


def test_the_command_line_has_one_option_per_field():
    options = train_options()
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(options) - CLI_ONLY == fields - FLAGLESS
    for name in fields - FLAGLESS:
        assert options[name].option_strings == [flag_of(name)]
    assert [flag_of(n) for n in ("src_lang", "beam_size", "max_grad_norm")] == ["--src", "--beam", "--max-grad-norm"]


@pytest.mark.parametrize("data", DATASETS)
def test_each_help_text_names_the_real_default(data):
    """What a field resolves to when not given is what its help says: "default V", "V for DATA"
    (defaults that depend on the data), or "default: WHAT" (None, and what that means)."""
    resolved, plain = resolved_for(data), TrainConfig().resolved()
    assert resolved.save_dir == f"runs/{data}-{resolved.preset}"
    for name, action in train_options().items():
        if name in CLI_ONLY or name == "save_dir":
            continue
        option = OPTIONS[name]
        value = getattr(resolved if option.per_data else plain, name)
        shown = option.unset if value is None else str(value)
        expected = f"{shown} for {data}" if option.per_data else f"default: {shown}" if value is None \
            else f"default {shown}"
        assert expected in action.help, (name, action.help)
    assert "(default: runs/<data>-<preset>)" in train_options()["save_dir"].help


def test_help_texts_hold_the_recipe():
    options = train_options()
    assert "(default 600 for synthetic, 8000 for multi30k, 8000 for files)" in options["vocab_size"].help
    assert "(default 0.1)" in options["label_smoothing"].help  # §5.4, not "the preset's"
    assert "default: the preset's" in options["dropout"].help
    assert "(default 1 for synthetic, all for multi30k, all for files)" in options["threads"].help
    assert "(base, big, small, tiny; default tiny for synthetic, small for multi30k, small for files)" in \
        options["preset"].help
    assert "en, de for synthetic; en, de, fr for multi30k; any language code for files" in options["src_lang"].help
    assert "(default no limit for synthetic, no limit for multi30k, 9.0 for files)" in options["max_ratio"].help


def test_defaults_follow_the_data_and_none_means_the_default():
    synthetic, multi30k = TrainConfig().resolved(), TrainConfig(data="multi30k").resolved()
    assert (synthetic.preset, synthetic.vocab_size, synthetic.threads) == ("tiny", 600, 1)
    assert (multi30k.preset, multi30k.vocab_size, multi30k.threads) == ("small", 8000, None)
    assert (synthetic.save_dir, multi30k.save_dir) == ("runs/synthetic-tiny", "runs/multi30k-small")
    assert TrainConfig(data="multi30k", preset="tiny").resolved().save_dir == "runs/multi30k-tiny"
    assert default_save_dir("multi30k") == "runs/multi30k-small"
    assert TrainConfig(data="multi30k", vocab_size=100).resolved().vocab_size == 100
    given_none = TrainConfig(lr_factor=None, accum=None, label_smoothing=None).resolved()  # as examples/ pass them
    assert (given_none.lr_factor, given_none.accum, given_none.label_smoothing) == (1.0, 1, 0.1)
    assert TrainConfig().label_smoothing == 0.1  # the paper's (§5.4), a setting of the loss


def test_one_rule_says_where_a_default_comes_from_recipe_then_init_from_then_data_then_own():
    multi30k = {"data": "multi30k", "preset": "small", "init_from": None}
    assert default_value("max_steps", TrainConfig(), multi30k) == 3000  # the data's
    assert default_value("lr_factor", TrainConfig(), multi30k) == 1.0  # the field's own
    hour = TrainConfig(recipe="hour")
    assert default_value("max_steps", hour, multi30k) == RECIPES["hour"]["max_steps"]  # the recipe's, over the data's
    assert default_value("lr_factor", hour, multi30k) == RECIPES["hour"]["lr_factor"]  # and over the field's own
    assert default_value("save_dir", hour, multi30k) == "runs/multi30k-small"
    start = TrainConfig(init_from="runs/before", recipe="hour")
    for name in ("preset", "vocab_size", "model_overrides"):  # the --init-from run's model, not the data's
        assert default_value(name, start, multi30k) is None, name
    assert default_value("save_dir", start, dict(multi30k, preset=None, init_from="/x/runs/before")) == \
        "runs/multi30k-from-before"


@pytest.mark.parametrize("given", [dict(), dict(data="multi30k", recipe="hour"), dict(train_data="corpus", seed=3),
                                   dict(init_from="runs/before", recipe="hour", max_steps=7, dropout=0.2)])
def test_resolved_gives_each_field_not_given_its_default_value_and_keeps_each_given_one(given):
    config = TrainConfig(**given)
    resolved = config.resolved()
    values = resolved.to_dict()
    for name in OPTIONS:
        if name in given:
            assert values[name] == (os.path.abspath(given[name]) if name in ("train_data", "init_from")
                                    else given[name]), name
        elif name != "data" and getattr(config, name) is None:
            assert values[name] == default_value(name, config, values), name


def test_every_field_a_recipe_sets_is_none_until_resolved():
    """Else a recipe could not tell a value given from the field's default, and would never apply."""
    for recipe in RECIPES.values():
        for name in recipe:
            assert OPTIONS[name].recipe and getattr(TrainConfig(), name) is None, name
    given = TrainConfig(recipe="hour", lr_factor=1.0, schedule="noam", time_limit=5.0).resolved()
    assert (given.lr_factor, given.schedule, given.time_limit, given.average_last) == (1.0, "noam", 5.0, 5)


def test_every_field_that_may_stay_none_says_what_none_means():
    resolved = [resolved_for(data) for data in DATASETS]
    for name, option in OPTIONS.items():
        if any(getattr(config, name) is None for config in resolved):
            assert option.unset, name


@pytest.mark.parametrize("field, value, message", [
    ("data", "wmt", "data must be one of"),
    ("preset", "huge", "unknown preset"),
    ("max_tokens", 0, "max_tokens must be a positive integer"),
    ("tgt_lang", "en", "both 'en'"),
    ("max_bad_steps", 0, "max_bad_steps must be a positive integer"),
    ("keep_last", 0, "keep_last must be a positive integer, got 0"),
    ("vocab_size", True, "vocab_size must be a positive integer, got True"),
    ("max_grad_norm", math.inf, "max_grad_norm must be a finite number, got inf"),
    ("model_overrides", [("heads", 2)], "model_overrides must be a dict"),
])
def test_bad_configuration_is_named(field, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        TrainConfig(**{field: value}).resolved()
    assert info.value.field == field and isinstance(info.value, ValueError)


def test_resolved_values_are_plain_python_numbers():
    config = TrainConfig(vocab_size=np.int64(120), lr_factor=np.float32(2.0)).resolved()
    assert type(config.vocab_size) is int and type(config.lr_factor) is float


# The same refusal through the API and the command line: the requirement the API states after the
# field's name, the command line states after the flag (showing the text as typed).
SAME_REFUSALS = [
    # (command-line arguments, field, value, what both say after the name, the value as the API shows it)
    (["--dropout", "1.5"], "dropout", 1.5, "must be a probability in [0, 1)", "1.5"),
    (["--label-smoothing", "2"], "label_smoothing", 2.0, "must be a number in [0, 1]", "2.0"),
    (["--lr-factor", "0"], "lr_factor", 0.0, "must be a positive number", "0.0"),
    (["--lr-factor", "nan"], "lr_factor", math.nan, "must be a finite number", "nan"),
    (["--max-grad-norm", "-1"], "max_grad_norm", -1.0, "must be a positive number", "-1.0"),
    (["--alpha", "-0.5"], "alpha", -0.5, "must be a number in [0, 10]", "-0.5"),
    (["--seed", "-1"], "seed", -1, "must be an integer >= 0", "-1"),
    (["--accum", "0"], "accum", 0, "must be a positive integer", "0"),
]


@pytest.mark.parametrize("argv, field, value, requirement, shown", SAME_REFUSALS,
                         ids=[c[1] + "=" + c[0][1] for c in SAME_REFUSALS])
def test_a_bad_number_is_refused_in_the_same_words_by_the_api_and_the_command_line(
        argv, field, value, requirement, shown, capsys):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{field: value}).resolved()
    assert str(info.value) == f"{field} {requirement}, got {shown}"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert f"argument {argv[0]}: {requirement}, got {argv[1]!r}" in err, err


@pytest.mark.parametrize("argv, values, api, command_line", [
    (["--src", "fr"], dict(src_lang="fr"), "src_lang 'fr': the synthetic data has the languages en, de",
     "--src 'fr': the synthetic data has the languages en, de"),
    (["--data", "multi30k", "--tgt", "xx"], dict(data="multi30k", tgt_lang="xx"),
     "tgt_lang 'xx': the multi30k data has the languages en, de, fr",
     "--tgt 'xx': the multi30k data has the languages en, de, fr"),
    (["--src", "de", "--tgt", "de"], dict(src_lang="de", tgt_lang="de"), "source and target language are both 'de'",
     "source and target language are both 'de'"),
    (["--data", "wmt"], dict(data="wmt"), "data must be one of ('synthetic', 'multi30k', 'files'), got 'wmt'",
     "--data must be one of ('synthetic', 'multi30k', 'files'), got 'wmt'"),
    (["--device", "tpu"], dict(device="tpu"), "device must be one of ('cpu', 'cuda'), got 'tpu'",
     "--device must be one of ('cpu', 'cuda'), got 'tpu'"),
])
def test_a_bad_language_or_name_is_refused_in_the_same_words_by_the_api_and_the_command_line(
        argv, values, api, command_line, tmp_path, capsys):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**values).resolved()
    assert str(info.value) == api
    assert cli.main(["train", *argv, "--save-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"tinyformer train: error: {command_line}\n"
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ --resume
@pytest.fixture
def saved_run(tmp_path):
    """A run directory whose newest checkpoint holds a resolved config and the model it describes
    (--resume reads the model's config and parameter headers through the checks every model file
    gets; nothing else of a run is there)."""
    from tinyformer.model.nn import Transformer

    config = TrainConfig(save_dir=str(tmp_path), vocab_size=120, max_steps=6).resolved()
    model = Transformer.from_preset(config.preset, vocab_size=120, seed=0)
    checkpoint.save_checkpoint(checkpoint.checkpoint_path(tmp_path, 3), model.state_dict(),
                               {"config": config.to_dict(), "model_config": model.config.to_dict()})
    return tmp_path, config


@pytest.mark.parametrize("name", sorted(set(OPTIONS) - FLAGLESS - {"save_dir"}))
def test_resume_changes_exactly_the_resumable_fields(name, saved_run):
    run, saved = saved_run
    given = {"save_dir": str(run), name: "changed"}
    if name in RESUMABLE:
        config = cli.train._resumed_config(given)
        assert getattr(config, name) == "changed"
        assert {k: v for k, v in config.to_dict().items() if k != name} == \
            {k: v for k, v in saved.to_dict().items() if k != name}
    else:
        with pytest.raises(cli.UsageError, match=f"--resume continues the saved run: {flag_of(name)} cannot change"):
            cli.train._resumed_config(given)


def test_resume_accepts_options_that_repeat_the_saved_run(saved_run):
    """As in the manual (docs/training.md):
    `tinyformer train --data multi30k --preset small --resume --max-steps 6000`."""
    run, saved = saved_run
    config = cli.train._resumed_config({"save_dir": str(run), "data": "synthetic", "preset": "tiny", "vocab_size": 120,
                                  "max_steps": 9})
    assert config.max_steps == 9 and config.vocab_size == 120


def test_resume_through_the_command_line_names_the_flags_that_cannot_change(saved_run, capsys):
    run, _ = saved_run
    assert cli.main(["train", "--save-dir", str(run), "--resume", "--preset", "small", "--vocab-size", "120",
                     "--dropout", "0.3"]) == 2
    err = capsys.readouterr().err
    assert "--preset, --dropout cannot change (only --alpha, --average-last, --beam, " in err
    assert "--vocab-size" not in err
    flags = sorted(flag_of(name) for name in RESUMABLE)
    assert train_options()["resume"].help.endswith(f"only {', '.join(flags)} may change")


# ------------------------------------------------------------------ what the model may and may not be told
@pytest.mark.parametrize("argument", sorted(RUN_SET))
def test_model_overrides_of_what_the_run_sets_name_its_field(argument):
    field = RUN_SET[argument]
    with pytest.raises(ConfigError, match=f"model_overrides: '{argument}' is set by the run"
                                          + (f"; use TrainConfig.{field}" if field else "$")):
        TrainConfig(model_overrides={argument: 1}).resolved()


def test_the_settings_that_shape_no_parameter_come_from_the_fields():
    assert {"dropout", "label_smoothing", "seed"} <= TRAINING_ONLY  # the fields declared training-only
    assert {"attention_dropout", "activation_dropout", "init"} <= TRAINING_ONLY  # model_overrides-only ones
    assert not TRAINING_ONLY & {"d_model", "heads", "num_layers", "src_vocab_size", "max_len", "positional",
                                "final_norm"}
    saved, built = {"heads": 4, "dropout": 0.1, "seed": 0}, {"heads": 4, "dropout": 0.3, "seed": 1}
    assert checkpoint.model_config_mismatch(saved, built, TRAINING_ONLY) == []
    assert checkpoint.model_config_mismatch(dict(saved, heads=8), built, TRAINING_ONLY) == ["heads: 8 vs 4"]


def test_a_run_resumes_as_the_model_it_trained_after_its_preset_changed(tmp_path, monkeypatch):
    """`small` was PyTorch's initialisation alone before it became all of nn.Transformer's choices: a
    run trained then must resume as that model (no final LayerNorms, no attention or ReLU dropout)."""
    from tinyformer.model.nn import presets

    args = ["train", "--save-dir", str(tmp_path), "--preset", "small", "--max-tokens", "256", "--vocab-size", "120",
            "--eval-every", "100000", "--save-every", "1", "--bleu-samples", "4", "--threads", "1", "--no-progress",
            "--no-test"]
    before = presets.PRESETS["small"].replace(attention_dropout=0.0, activation_dropout=0.0, final_norm=None)
    with monkeypatch.context() as patch:
        patch.setattr(presets, "PRESETS", {**presets.PRESETS, "small": before})
        assert cli.main([*args, "--max-steps", "1"]) == 0
    assert cli.main([*args, "--resume", "--max-steps", "2"]) == 0
    _, meta, _ = checkpoint.load_checkpoint(checkpoint.list_checkpoints(tmp_path)[-1])
    assert meta["step"] == 2
    assert {name: meta["model_config"][name] for name in ("attention_dropout", "activation_dropout", "final_norm",
                                                          "init")} == \
        {"attention_dropout": 0.0, "activation_dropout": 0.0, "final_norm": None, "init": "torch"}
    assert meta["config"]["model_overrides"] == {"attention_dropout": 0.0, "activation_dropout": 0.0,
                                                 "final_norm": None}
    # a run of today's preset pins nothing
    assert TrainConfig.from_dict(meta["config"] | {"model_overrides": {}}, dict(
        meta["model_config"], attention_dropout=0.1, activation_dropout=0.1, final_norm=True)).model_overrides == {}
