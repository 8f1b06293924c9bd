"""The trainer: exact resume, checkpoints beside the tokenizer, refusals that lose nothing."""

import json
import os

import numpy as np
import pytest

from tinyformer import checkpoint
from tinyformer.train import TrainConfig, Trainer, load_model

QUIET = dict(echo=lambda *a: None, progress=False)


def small_config(save_dir, **overrides):
    values = dict(data="synthetic", preset="tiny", vocab_size=120, max_tokens=256, max_steps=6,
                  warmup_steps=4, save_every=3, eval_every=100, log_every=1, bleu_samples=8,
                  dropout=0.1, save_dir=str(save_dir), threads=1)
    values.update(overrides)
    return TrainConfig(**values)


def losses(save_dir):
    with open(os.path.join(save_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r["loss"] for r in map(json.loads, f) if "split" not in r]


def test_resume_repeats_the_uninterrupted_run_exactly(tmp_path):
    straight = tmp_path / "straight"
    Trainer(small_config(straight), **QUIET).run()
    interrupted = tmp_path / "interrupted"
    Trainer(small_config(interrupted, max_steps=3), **QUIET).run()
    assert [p.name for p in checkpoint.list_checkpoints(interrupted)] == ["checkpoint_0000003.npz"]
    Trainer(small_config(interrupted), resume=True, **QUIET).run()
    assert len(losses(straight)) == 6
    assert losses(interrupted) == losses(straight)
    a, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(straight, 6))
    b, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(interrupted, 6))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_resume_drops_metrics_logged_after_the_last_checkpoint(tmp_path):
    straight = tmp_path / "straight"
    Trainer(small_config(straight), **QUIET).run()
    interrupted = tmp_path / "interrupted"
    Trainer(small_config(interrupted, max_steps=3), **QUIET).run()
    with open(interrupted / "metrics.jsonl", "a", encoding="utf-8") as f:  # a run killed at step 5
        f.write(json.dumps({"step": 4, "loss": 99.0}) + "\n" + json.dumps({"step": 5, "loss": 98.0}) + "\n")
        f.write('{"step": 6, "lo')  # torn by the kill
    Trainer(small_config(interrupted), resume=True, **QUIET).run()
    assert losses(interrupted) == losses(straight)
    steps = [r["step"] for r in map(json.loads, open(interrupted / "metrics.jsonl")) if "split" not in r]
    assert steps == sorted(steps) and len(steps) == len(set(steps))


def test_accumulation_and_epochs_and_keep_last(tmp_path):
    config = small_config(tmp_path, accum=2, max_steps=4, save_every=1, keep_last=2)
    trainer = Trainer(config, **QUIET)
    trainer.run()
    assert trainer.step == 4 and trainer.batch_in_epoch == 8
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "checkpoint_0000003.npz", "checkpoint_0000004.npz"]
    _, meta, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(tmp_path, 4))
    assert meta["tokenizer_sha256"] == trainer.tokenizer.sha256
    assert meta["config"]["accum"] == 2 and meta["model_config"]["d_model"] == 64


def test_existing_run_is_not_overwritten_without_resume(tmp_path):
    Trainer(small_config(tmp_path, max_steps=3), **QUIET).run()
    before = checkpoint.checkpoint_path(tmp_path, 3).read_bytes()
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(small_config(tmp_path), **QUIET).run()
    assert checkpoint.checkpoint_path(tmp_path, 3).read_bytes() == before
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer(small_config(tmp_path / "empty"), resume=True, **QUIET).run()


def test_checkpoint_with_another_tokenizer_is_refused(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    Trainer(small_config(first, max_steps=3), **QUIET).run()
    Trainer(small_config(second, max_steps=3, vocab_size=100), **QUIET).run()
    model, tokenizer, meta = load_model(checkpoint.checkpoint_path(first, 3))
    assert not model.training and meta["step"] == 3 and len(tokenizer) == model.src_vocab_size
    with pytest.raises(checkpoint.CheckpointError, match="not the one"):
        load_model(checkpoint.checkpoint_path(first, 3), tokenizer_path=second / "spm.model")


@pytest.mark.parametrize("field, value, message", [
    ("data", "wmt", "data must be one of"),
    ("preset", "huge", "unknown preset"),
    ("max_tokens", 0, "max_tokens must be a positive integer"),
    ("tgt_lang", "en", "both 'en'"),
])
def test_bad_configuration_is_named(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        small_config(tmp_path, **{field: value}).resolved()


def test_a_short_multi30k_run_on_the_real_files(tmp_path):
    """A few dozen steps of En→De on Multi30k through $TINYFORMER_DATA: loss falls, BLEU is computed."""
    if not os.environ.get("TINYFORMER_DATA"):
        if os.environ.get("CI"):
            pytest.fail("CI must set TINYFORMER_DATA to the directory holding multi30k/")
        pytest.skip("TINYFORMER_DATA is not set (the Multi30k files are not here)")
    config = TrainConfig(data="multi30k", preset="tiny", vocab_size=2000, max_tokens=1500, max_steps=30,
                         warmup_steps=10, lr_factor=2.0, eval_every=30, save_every=30, log_every=1,
                         bleu_samples=10, save_dir=str(tmp_path), threads=1)
    trainer = Trainer(config, **QUIET)
    record = trainer.run()
    assert len(trainer.train_data) > 28000 and len(trainer.val_data) > 1000
    history = losses(tmp_path)
    assert len(history) == 30 and np.mean(history[-5:]) < np.mean(history[:5]) - 1.0
    assert record["split"] == "val" and record["bleu_sentences"] == 10 and record["ppl"] > 1


@pytest.mark.slow
def test_the_default_run_translates_the_built_in_test_split(tmp_path):
    """The quick start's main job (about 2 minutes on 2 cores): >= 95% exact match on the test split.

    Kept out of the default run; `test_cli.py` runs the same command for a few steps.
    """
    from tinyformer.train import evaluate, load_corpus

    trainer = Trainer(TrainConfig(save_dir=str(tmp_path)), **QUIET)
    trainer.run()
    sources, references = load_corpus(trainer.config, "test")
    result = evaluate(trainer.model, trainer.tokenizer, sources, references, beam_size=4, alpha=0.6)
    assert result["exact_match"] >= 0.95, result["exact_match"]
