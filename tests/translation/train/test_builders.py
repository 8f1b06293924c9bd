"""The builders: a run's parts made from its config, handed to the Trainer finished."""

import copy
import dataclasses
import json

import pytest
from tests.translation.train.test_trainer import cached_corpus, copy_run, losses, small_config, small_corpus, three_steps  # noqa: F401 (fixtures)

from tinyformer.translation.train import Trainer, TrainConfig, build_parts, load_corpus
from tinyformer.translation.train.config import ConfigError

QUIET = dict(echo=lambda *a: None, progress=False)


def test_a_trainer_handed_finished_parts_runs_them_as_the_one_call_entry_does(tmp_path, three_steps):
    """The one-call entry's run is test_train's shared ``small_config(max_steps=3)`` run."""
    config = small_config(tmp_path / "parts", max_steps=3).resolved()
    parts = build_parts(config, echo=lambda *a: None)
    assert parts.position.step == 0 and len(parts.val_text[0]) == len(parts.val_data) > 0
    trainer = Trainer(config, parts=parts, **QUIET)
    trainer.run()
    assert trainer.model is parts.model and trainer.adam is parts.adam and trainer.step == 3
    assert losses(tmp_path / "parts") == losses(three_steps)


def test_building_leaves_the_config_unchanged_and_hands_on_what_it_found(tmp_path):
    config = small_config(tmp_path / "run", max_steps=1).resolved()
    given = copy.deepcopy(config)
    parts = build_parts(config, echo=lambda *a: None)
    assert config == given and parts.config == given  # the synthetic task: nothing to find
    found = dataclasses.replace(given, data_files={"--train": {"x": "0" * 64}})  # as a corpus run's parts hold
    trainer = Trainer(config, parts=dataclasses.replace(parts, config=found), **QUIET)
    assert trainer.config.data_files == {"--train": {"x": "0" * 64}} and trainer.config.max_steps == 1


def test_label_smoothing_is_a_setting_of_the_loss_not_of_the_model(tmp_path):
    trainer = Trainer(small_config(tmp_path, max_steps=2, label_smoothing=0.0), **QUIET)
    trainer.run()
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    training = [r for r in records if "split" not in r]
    assert len(training) == 2 and all(r["loss"] == r["nll"] for r in training)  # ε = 0: the loss is the NLL
    validation = [r for r in records if r.get("split") == "val"]
    assert validation and all(r["loss"] == r["nll"] for r in validation)
    assert "label_smoothing" not in trainer.model.config.to_dict()  # the Transformer is not told


def test_resumed_parts_stand_where_the_checkpoint_stood(tmp_path, three_steps):
    run = copy_run(three_steps, tmp_path / "run")
    lines = []
    parts = build_parts(small_config(run).resolved(), resume=True, echo=lines.append)
    assert (parts.position.step, parts.adam.step_count) == (3, 3)
    assert parts.position.batch_in_epoch == 3 and parts.position.tokens_seen > 0
    assert "resumed from checkpoint_0000003.npz at step 3 (epoch 1, batch 3)" in lines


def test_a_resumed_run_records_how_its_weights_were_first_drawn_whatever_the_preset_says_now(
        tmp_path, three_steps, monkeypatch):
    """A run begun with the paper's draw and resumed after its preset moved to PyTorch's (as ``small``
    did) keeps ``init="xavier"`` in its model_config: the weights are the checkpoint's."""
    from tinyformer.model.nn import presets

    run = copy_run(three_steps, tmp_path / "run")
    assert presets.PRESETS["tiny"].init == "xavier"
    monkeypatch.setattr(presets, "PRESETS", {**presets.PRESETS, "tiny": presets.PRESETS["tiny"].replace(init="torch")})
    assert build_parts(small_config(tmp_path / "fresh").resolved(), echo=lambda *a: None).model.config.init == "torch"
    parts = build_parts(small_config(run).resolved(), resume=True, echo=lambda *a: None)
    assert parts.model.config.init == "xavier" and parts.position.step == 3


def test_the_corpus_refuses_a_language_the_data_lacks():
    with pytest.raises(ConfigError, match="src_lang 'fr': the synthetic data has the languages en, de"):
        load_corpus(TrainConfig(src_lang="fr"), "train")  # an unresolved config, too
