"""The trainer: exact resume, checkpoints beside the tokenizer, refusals that lose nothing."""

import json
import os
import shutil

import numpy as np
import pytest
import trained_models

from tinyformer.translation import checkpoint, train
from tinyformer import cli
from tinyformer.engine import functional as F
from tinyformer.common.filecache import cached_product
from tinyformer.model.optim import Adam
from tinyformer.engine.tensor import Tensor
from tinyformer.translation.train import TrainConfig, Trainer, TrainingDiverged, load_model

QUIET = dict(echo=lambda *a: None, progress=False)
_CORPUS, _LOAD_CORPUS = {}, train.load_corpus


def cached_load_corpus(config, split):
    """``train.load_corpus``, each (data, languages, split) computed once: the synthetic task's
    20,000 pairs take seconds to generate."""
    key = (config.data, config.src_lang, config.tgt_lang, config.data_dir, split)
    if key not in _CORPUS:
        _CORPUS[key] = _LOAD_CORPUS(config, split)
    return _CORPUS[key]


@pytest.fixture(autouse=True)
def cached_corpus(monkeypatch):
    monkeypatch.setattr(train.builders, "load_corpus", cached_load_corpus)


# The first pairs of the synthetic splits the trainer's tests train and validate on: a run of a
# few steps on the whole task spent most of its time validating on the 500 validation pairs and
# encoding the 20,000 training ones. 2,000 pairs are 190 batches of 256 tokens, more than any
# test's steps take from an epoch; the test split stays whole.
SMALL_CORPUS = {"train": 2000, "val": 20}


def corpus_cut_to(sizes):
    """A ``load_corpus``: ``cached_load_corpus``'s splits cut to their first ``sizes[split]`` pairs
    (a split ``sizes`` does not name stays whole)."""
    def load(config, split):
        sides = cached_load_corpus(config, split)
        return tuple(side[:sizes[split]] for side in sides) if split in sizes else sides

    return load


small_load_corpus = corpus_cut_to(SMALL_CORPUS)


@pytest.fixture(autouse=True)
def small_corpus(cached_corpus, monkeypatch):
    """The trainer tests' runs on ``small_load_corpus`` (after ``cached_corpus``, which it replaces)."""
    monkeypatch.setattr(train.builders, "load_corpus", small_load_corpus)


def small_config(save_dir, **overrides):
    values = dict(data="synthetic", preset="tiny", vocab_size=120, max_tokens=256, max_steps=6,
                  warmup_steps=4, save_every=3, eval_every=100, log_every=1, bleu_samples=8,
                  dropout=0.1, save_dir=str(save_dir), threads=1)
    values.update(overrides)
    return TrainConfig(**values)


def losses(save_dir):
    with open(os.path.join(save_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r["loss"] for r in map(json.loads, f) if "split" not in r]


def shared_run(tmp_path_factory, name, **overrides):
    """The directory of ``small_config(**overrides)`` run on the small corpus, once per test run
    (trained_models' way: the first process that asks trains it under a lock): the resume tests of
    several files resume the same short run and compare with the same uninterrupted one. Its files
    are read-only; ``copy_run`` gives a copy to change."""
    def make(partial):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(train.builders, "load_corpus", small_load_corpus)
            Trainer(small_config(partial, **overrides), **QUIET).run()
        trained_models.make_read_only(partial)

    return cached_product(trained_models.shared_directory(tmp_path_factory), f"small-run-{name}", make)


def copy_run(run, destination):
    """A writable copy of the run directory ``run`` at ``destination``."""
    shutil.copytree(run, destination, copy_function=shutil.copyfile)
    return destination


@pytest.fixture(scope="session")
def six_steps(tmp_path_factory):
    """``small_config()`` run to its end, step 6 (checkpoints at 3 and 6): the uninterrupted run."""
    return shared_run(tmp_path_factory, "six-steps")


@pytest.fixture(scope="session")
def three_steps(tmp_path_factory):
    """``small_config(max_steps=3)`` run to its end: the run the resume tests continue to step 6."""
    return shared_run(tmp_path_factory, "three-steps", max_steps=3)


def test_resume_repeats_the_uninterrupted_run_exactly(tmp_path, six_steps, three_steps):
    straight = six_steps
    interrupted = copy_run(three_steps, tmp_path / "interrupted")
    assert [p.name for p in checkpoint.list_checkpoints(interrupted)] == ["checkpoint_0000003.npz"]
    Trainer(small_config(interrupted), resume=True, **QUIET).run()
    assert len(losses(straight)) == 6
    assert losses(interrupted) == losses(straight)
    a, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(straight, 6))
    b, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(interrupted, 6))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_resume_drops_metrics_logged_after_the_last_checkpoint(tmp_path, six_steps, three_steps):
    straight = six_steps
    interrupted = copy_run(three_steps, tmp_path / "interrupted")
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


def test_existing_run_is_not_overwritten_without_resume(tmp_path, three_steps):
    run = copy_run(three_steps, tmp_path / "run")
    before = checkpoint.checkpoint_path(run, 3).read_bytes()
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(small_config(run), **QUIET).run()
    assert checkpoint.checkpoint_path(run, 3).read_bytes() == before
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer(small_config(tmp_path / "empty"), resume=True, **QUIET).run()


def test_checkpoint_with_another_tokenizer_is_refused(tmp_path, three_steps):
    first, second = three_steps, tmp_path / "b"
    second.mkdir()  # the tokenizer a run with --vocab-size 100 trains (its training is not needed)
    other = small_config(second, max_steps=3, vocab_size=100).resolved()
    train.builders.build_tokenizer(other, train.builders.load_corpus(other, "train"), echo=lambda *a: None)
    model, tokenizer, meta = load_model(checkpoint.checkpoint_path(first, 3))
    assert not model.training and meta["step"] == 3 and len(tokenizer) == model.src_vocab_size
    with pytest.raises(checkpoint.CheckpointError, match="not the one"):
        load_model(checkpoint.checkpoint_path(first, 3), tokenizer_path=second / "spm.model")


# ------------------------------------------------------------------ non-finite losses and gradients
# NumPy warns about the NaN and Inf these tests inject; the trainer's handling of them is the point.
non_finite = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def poison(monkeypatch, bad_call, where="loss", value=np.nan, trainer=None):
    """Make the training forward passes numbered by ``bad_call(n)`` (1, 2, ...) non-finite: their loss
    (times ``value``) or, with ``where="gradient"``, the gradient of the shared embedding (times ``value``)."""
    real = F.cross_entropy
    state = {"calls": 0, "bad": False}

    def cross_entropy(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        state["calls"] += 1
        state["bad"] = bad_call(state["calls"])
        return (loss * value if state["bad"] and where == "loss" else loss), nll

    monkeypatch.setattr(F, "cross_entropy", cross_entropy)
    if where == "gradient":
        trainer.model.src_embed.weight.register_hook(lambda grad: grad * value if state["bad"] else None)
    return state


def records(save_dir):
    with open(os.path.join(save_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@non_finite
@pytest.mark.parametrize("where, value", [("loss", np.nan), ("loss", np.inf), ("gradient", np.nan),
                                          ("gradient", np.inf)])
def test_a_non_finite_loss_or_gradient_skips_the_update(tmp_path, monkeypatch, where, value):
    trainer = Trainer(small_config(tmp_path), **QUIET)
    trainer.setup()
    batches = trainer.train_data.batches(256, seed=0, epoch=0)
    before = [p.data.copy() for p in trainer.model.parameters()]
    poison(monkeypatch, lambda n: n == 1, where, value, trainer)
    result = trainer.train_step(batches[:1])
    loss, grad_norm = result.loss, result.grad_norm
    assert not result.applied and not result.overflowed
    if where == "loss":
        assert not np.isfinite(loss) and grad_norm is None
    else:
        assert np.isfinite(loss) and not np.isfinite(grad_norm)
    assert trainer.step == 0 and trainer.batch_in_epoch == 1 and trainer.tokens_seen == 0
    assert trainer.adam.step_count == 0 and all(m is None for m in trainer.adam.m)
    for p, b in zip(trainer.model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
    result = trainer.train_step(batches[1:2])  # the next batch is fine: it is applied
    loss, grad_norm = result.loss, result.grad_norm
    assert result.applied and np.isfinite(grad_norm) and trainer.step == 1 and trainer.batch_in_epoch == 2
    assert any(not np.array_equal(p.data, b) for p, b in zip(trainer.model.parameters(), before))


@non_finite
def test_skipped_updates_are_counted_in_the_log_the_bar_and_the_checkpoint(tmp_path, monkeypatch, capsys):
    poison(monkeypatch, lambda n: n == 2)
    trainer = Trainer(small_config(tmp_path, max_steps=4, save_every=100), echo=lambda *a: None, progress=True)
    trainer.run()
    assert trainer.step == 4 and trainer.skipped_updates == 1 and trainer.batch_in_epoch == 5
    log = [r for r in records(tmp_path) if "split" not in r]
    skipped = [r for r in log if "skipped" in r]
    assert skipped == [{"step": 2, "epoch": 1, "skipped": "non-finite loss (nan)", "skipped_updates": 1,
                        "bad_in_a_row": 1}]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4]
    assert [r["skipped_updates"] for r in log if "loss" in r] == [0, 1, 1, 1]
    _, meta, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(tmp_path, 4))
    assert meta["skipped_updates"] == 1
    out, err = capsys.readouterr()
    assert "step 2: update skipped, non-finite loss (nan) (1 in a row, 1 in all)" in out
    assert "skipped=1" in err  # the progress bar's postfix


@non_finite
def test_max_bad_steps_in_a_row_stop_the_run_keeping_the_last_good_checkpoint(tmp_path, monkeypatch):
    poison(monkeypatch, lambda n: n >= 4)  # steps 1-3 are applied, checkpoint at 2, then every update is bad
    config = small_config(tmp_path, max_steps=10, save_every=2, max_bad_steps=3)
    saved = {}
    real_save = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, "save_checkpoint",
                        lambda path, *a: saved.setdefault(path.name, real_save(path, *a).read_bytes()))
    with pytest.raises(TrainingDiverged) as info:
        Trainer(config, **QUIET).run()
    message = str(info.value)
    assert "\n" not in message
    assert "training stopped: 3 updates in a row were skipped for a non-finite loss or gradient" in message
    assert "max_bad_steps=3" in message and "at step 4" in message
    assert f"the last checkpoint, {checkpoint.checkpoint_path(tmp_path, 2)}, is intact" in message
    assert checkpoint.list_checkpoints(tmp_path) == [checkpoint.checkpoint_path(tmp_path, 2)]
    assert checkpoint.checkpoint_path(tmp_path, 2).read_bytes() == saved["checkpoint_0000002.npz"]
    assert list(saved) == ["checkpoint_0000002.npz"]
    assert [r["bad_in_a_row"] for r in records(tmp_path) if "skipped" in r] == [1, 2, 3]
    monkeypatch.undo()
    trainer = Trainer(config, resume=True, **QUIET)  # the good checkpoint resumes and finishes
    trainer.run()
    assert trainer.step == 10 and trainer.skipped_updates == 0


@non_finite
def test_the_cli_stops_a_diverging_run_with_exit_1_and_one_line(tmp_path, monkeypatch, capsys):
    poison(monkeypatch, lambda n: n >= 3)
    code = cli.main(["train", "--save-dir", str(tmp_path), "--max-steps", "20", "--max-tokens", "256",
                     "--vocab-size", "120", "--warmup-steps", "4", "--save-every", "1", "--no-progress",
                     "--no-test"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("tinyformer train: error: training stopped: 5 updates in a row were skipped")
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["checkpoint_0000001.npz",
                                                                        "checkpoint_0000002.npz"]


def test_a_trainer_never_saves_a_non_finite_parameter(tmp_path):
    trainer = Trainer(small_config(tmp_path), **QUIET)
    trainer.setup()
    trainer.model.src_embed.weight.data[5, 3] = np.inf
    with pytest.raises(checkpoint.CheckpointError, match="parameter 'src_embed.weight' holds 1 non-finite"):
        trainer.save()
    assert checkpoint.list_checkpoints(tmp_path) == []


@non_finite
def test_adam_can_skip_a_non_finite_gradient():
    p = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    adam = Adam([p], lr=0.1)
    p.grad = np.full((2, 3), np.nan, np.float32)
    assert np.isnan(adam.step(skip_nonfinite=True))
    assert adam.step_count == 0 and adam.m == [None] and np.array_equal(p.data, np.ones((2, 3)))
    p.grad = np.ones((2, 3), np.float32)
    assert adam.step(skip_nonfinite=True) == pytest.approx(6 ** 0.5)
    assert adam.step_count == 1 and (p.data < 1).all()
    p.grad = np.full((2, 3), np.inf, np.float32)
    adam.step()  # the default is unchanged: the update is applied
    assert adam.step_count == 2 and not np.isfinite(p.data).all()


def test_a_short_multi30k_run_on_the_real_files(trained_multi30k):
    """A few dozen steps of En→De on Multi30k through $TINYFORMER_DATA: loss falls, BLEU is computed.
    The run is conftest's ``trained_multi30k`` (trained once per test run, shared with the tests
    of the explain page and of a corpus of one's own)."""
    assert trained_multi30k.config.data == "multi30k" and trained_multi30k.config.data_dir is None
    assert [len(side) for side in trained_multi30k.corpus("train")] == [29_000, 29_000]
    history = [r["loss"] for r in trained_multi30k.metrics()]
    assert len(history) == trained_multi30k.config.max_steps >= 30
    # 7.24 -> 6.40 in this run; the mean loss of the first and last 5 steps fell 0.74-0.93 over seeds 0-11
    assert np.mean(history[-5:]) < np.mean(history[:5]) - 0.5
    (record,) = trained_multi30k.metrics("val")
    assert record["bleu_sentences"] == 10 and record["ppl"] > 1 and record["bleu_greedy"] >= 0


@pytest.mark.slow
def test_the_default_run_translates_the_built_in_test_split(tmp_path, monkeypatch):
    """The quick start's main job (about 2 minutes on 2 cores): >= 95% exact match on the test split.

    Kept out of the default run; `cli/test_commands.py` runs the same command for a few steps.
    """
    from tinyformer.translation.train import evaluate, load_corpus

    monkeypatch.setattr(train.builders, "load_corpus", cached_load_corpus)  # the whole task, not the small corpus
    trainer = Trainer(TrainConfig(save_dir=str(tmp_path)), **QUIET)
    trainer.run()
    sources, references = load_corpus(trainer.config, "test")
    result = evaluate(trainer.model, trainer.tokenizer, sources, references, beam_size=4, alpha=0.6)
    assert result["exact_match"] >= 0.95, result["exact_match"]


def test_a_cpu_run_keeps_freed_memory_for_its_next_steps(tmp_path, monkeypatch):
    """Each step's large arrays reuse the last step's memory (``backend.keep_freed_memory``)."""
    from tinyformer.engine import backend

    calls = []
    monkeypatch.setattr(backend, "keep_freed_memory", lambda: calls.append(1) or True)
    Trainer(small_config(tmp_path), **QUIET)
    assert calls == [1]


def test_the_dropout_stream_does_not_repeat_the_initialisations_draws(tmp_path):
    """The model is drawn from default_rng(seed); the run's dropout masks must come from another
    stream, or the first step's masks would be functions of the initial weights."""
    from tinyformer.engine import random as tf_random
    from tinyformer.translation.train.builders import build_model

    class Vocabulary:
        pad_id = 0

        def __len__(self):
            return 120

    config = small_config(tmp_path, seed=5).resolved()
    build_model(config, Vocabulary())
    dropout_outputs = tf_random.default_generator().bit_generator.random_raw(1000)
    initialisation_outputs = np.random.default_rng(5).bit_generator.random_raw(1000)
    assert not np.isin(dropout_outputs, initialisation_outputs).any()
