"""`tinyformer train --init-from RUN`: fine-tuning an imported Marian run, or a run tinyformer trained, on a
corpus of one's own starts from that run's weights with its tokenizer (no new BPE), with a fresh Adam from
step 0; such a run resumes, and what cannot start is refused in one line with nothing written."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from marian_folders import corpus, make_marian_folder
from tests.translation.train.test_trainer import cached_corpus, small_corpus, three_steps  # noqa: F401 (fixtures)

from tinyformer import cli
from tinyformer.translation import checkpoint, decode
from tinyformer.translation.data.batching import ParallelData
from tinyformer.translation.data.synthetic import synthetic_pairs
from tinyformer.translation.data.tokenizer import load_tokenizer
from tinyformer.translation.interop.runs import import_marian
from tinyformer.translation.train import Trainer, TrainConfig, builders, init_from, load_model
from tinyformer.translation.train.evaluation import validation_loss

QUIET = dict(echo=lambda *a: None, progress=False)


def write_pairs(prefix, pairs):
    """PREFIX.en and PREFIX.de holding ``pairs``, one sentence per line."""
    for index, language in enumerate(("en", "de")):
        Path(f"{prefix}.{language}").write_text("".join(pair[index] + "\n" for pair in pairs), encoding="utf-8")
    return prefix


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A small Marian folder with random weights, imported as a run; with transformers' model and tokenizer."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("marian")
    folder, model, tokenizer = make_marian_folder(base / "marian")
    import_marian(folder, base / "imported")
    return SimpleNamespace(run=base / "imported", model=model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def own_corpus(tmp_path_factory):
    """The made-up task of tests/marian_folders.py as files of one's own: 300 training pairs, 12 validation."""
    data = tmp_path_factory.mktemp("data")
    return {"train": write_pairs(data / "train", corpus(300, seed=1)),
            "valid": write_pairs(data / "valid", corpus(12, seed=2))}


def finetune_config(init_from, save_dir, data, **overrides):
    values = dict(init_from=str(init_from), train_data=str(data["train"]), valid_data=str(data["valid"]),
                  src_lang="en", tgt_lang="de", max_tokens=512, max_steps=8, warmup_steps=2, lr_factor=0.1,
                  save_every=4, eval_every=8, log_every=1, bleu_samples=2, threads=1, save_dir=str(save_dir),
                  corpus_cache=str(Path(save_dir).parent / "cache"))
    values.update(overrides)
    return TrainConfig(**values)


def records(run):
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def training_losses(run):
    return [r["loss"] for r in records(run) if "split" not in r]


def validations(run):
    return [r for r in records(run) if r.get("split") == "val"]


def same_files(a, b):
    """The files of ``a`` and ``b`` (a file, or a folder's files), byte for byte."""
    a, b = Path(a), Path(b)
    if a.is_file():
        return b.is_file() and a.read_bytes() == b.read_bytes()
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(same_files(a / n, b / n) for n in names)


@pytest.fixture(scope="module")
def marian_finetuned(marian, own_corpus, tmp_path_factory):
    """The imported run fine-tuned for 8 steps (checkpoints at 4 and 8) on the corpus of one's own."""
    run = tmp_path_factory.mktemp("finetuned") / "run"
    Trainer(finetune_config(marian.run, run, own_corpus), **QUIET).run()
    return run


def transformers_nll(marian, pairs):
    """The NLL per target token of transformers' own model of the Marian folder on ``pairs``."""
    import torch

    inputs = marian.tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], return_tensors="pt",
                              padding=True)
    inputs["labels"][inputs["labels"] == marian.tokenizer.pad_token_id] = -100
    with torch.no_grad():
        return marian.model(**inputs).loss.item()


def test_an_imported_marian_run_fine_tunes_from_its_weights_with_its_tokenizer(marian, marian_finetuned):
    run = marian_finetuned
    # Step 0's validation is the imported model's NLL on the validation pairs, as transformers computes it: its
    # weights, its tokenizer's two models, its padding, start and end ids.
    first = validations(run)[0]
    assert first["step"] == 0
    assert first["nll"] == pytest.approx(transformers_nll(marian, corpus(12, seed=2)), abs=2e-5)
    losses = training_losses(run)
    assert len(losses) == 8 and np.mean(losses[-3:]) < losses[0] - 0.3, losses
    assert validations(run)[-1]["loss"] < first["loss"] - 0.3
    # No BPE trained: the imported tokenizer, byte for byte, under its own name; no spm.model anywhere.
    assert same_files(marian.run / "tokenizer", run / "tokenizer")
    assert not (run / "spm.model").exists() and not list(run.parent.rglob("*.model"))
    imported = checkpoint.load_checkpoint(marian.run / "checkpoint_0000000.npz")[1]
    for path in checkpoint.list_checkpoints(run):
        meta = checkpoint.load_checkpoint(path)[1]
        assert (meta["tokenizer_sha256"], meta["tokenizer_file"]) == (imported["tokenizer_sha256"], "tokenizer")
        assert meta["model_config"] == imported["model_config"]
    assert [checkpoint.step_of(p) for p in checkpoint.list_checkpoints(run)] == [4, 8]
    model, tokenizer, meta = load_model(run)
    assert meta["step"] == 8 and meta["config"]["init_from"] == str(marian.run)
    [translation] = decode.translate(model, tokenizer, ["the cat sees the dog."], beam_size=2, max_len_b=8)
    assert isinstance(translation, str)


def test_the_prepared_corpus_is_keyed_on_the_handed_tokenizer_and_its_targets_use_the_target_model(
        marian, own_corpus, marian_finetuned):
    tokenizer = load_tokenizer(marian.run / "tokenizer")
    [arrays] = (marian_finetuned.parent / "cache").glob(f"*/arrays-{tokenizer.sha256[:16]}-all")
    targets = Path(f"{own_corpus['train']}.de").read_text(encoding="utf-8").splitlines()
    target_ids = tokenizer.encode_target_batch(targets)
    assert target_ids != tokenizer.encode_batch(targets)  # the two sentencepiece models split German differently
    np.testing.assert_array_equal(np.load(arrays / "tgt_ids.npy"), np.concatenate(target_ids))


def test_a_fine_tuning_run_resumes_as_it_would_have_gone_on(marian, own_corpus, marian_finetuned, tmp_path, capsys):
    run, imported = tmp_path / "run", shutil.copytree(marian.run, tmp_path / "imported")
    Trainer(finetune_config(imported, run, own_corpus, max_steps=4), **QUIET).run()
    shutil.rmtree(imported)  # a resumed run reads its own checkpoints and tokenizer only
    assert cli.main(["train", "--save-dir", str(run), "--resume", "--max-steps", "8", "--no-progress"]) == 0
    assert "resumed from checkpoint_0000004.npz at step 4" in capsys.readouterr().out
    assert training_losses(run) == training_losses(marian_finetuned)
    assert [r["step"] for r in validations(run)] == [0, 4, 8]  # the shorter run validated at its end
    assert validations(run)[::2] == validations(marian_finetuned)


def test_a_run_tinyformer_trained_fine_tunes_with_its_joint_tokenizer(trained_run, tmp_path, capsys):
    source = trained_run
    pairs = list(zip(*synthetic_pairs("test")))
    data = {"train": write_pairs(tmp_path / "train", pairs[:60]),
            "valid": write_pairs(tmp_path / "valid", pairs[60:64])}
    run = tmp_path / "runs" / "tuned"
    argv = ["train", "--init-from", str(source), "--train", str(data["train"]), "--valid", str(data["valid"]),
            "--max-steps", "3", "--save-every", "2", "--eval-every", "3", "--warmup-steps", "2", "--lr-factor", "0.5",
            "--log-every", "1", "--bleu-samples", "2", "--threads", "1", "--save-dir", str(run), "--no-progress"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "training a joint BPE" not in out and "--init-from: the model and weights of" in out
    assert same_files(source / "spm.model", run / "spm.model") and not list(run.parent.rglob("tokenizer-*"))
    model, tokenizer, _ = load_model(source)
    sources, targets = zip(*pairs[60:64])
    valid = ParallelData(tokenizer.encode_batch(sources), tokenizer.encode_target_batch(targets))
    start_loss = validation_loss(model, valid, 512, 0.1)[0]
    assert validations(run)[0]["loss"] == pytest.approx(start_loss, abs=1e-5)
    assert validations(run)[-1]["loss"] < validations(run)[0]["loss"]
    sha = checkpoint.load_checkpoint(checkpoint.checkpoint_path(source, 3))[1]["tokenizer_sha256"]
    assert {checkpoint.load_checkpoint(p)[1]["tokenizer_sha256"] for p in checkpoint.list_checkpoints(run)} == {sha}
    assert cli.main(["train", "--init-from", str(source), "--save-dir", str(run), "--resume", "--max-steps", "4",
                     "--no-progress"]) == 0
    assert [r["step"] for r in records(run) if "split" not in r] == [1, 2, 3, 4]
    assert load_model(run)[2]["step"] == 4


def test_the_built_in_data_fine_tunes_a_run_with_its_tokenizer(trained_run, tmp_path):
    run = tmp_path / "run"
    config = TrainConfig(init_from=str(trained_run), data="synthetic", max_tokens=256, max_steps=2, eval_every=2,
                         bleu_samples=2, threads=1, save_dir=str(run))
    said = []
    Trainer(config, echo=said.append, progress=False).run()
    assert same_files(trained_run / "spm.model", run / "spm.model")
    assert not any("training a joint BPE" in line for line in said)
    assert [r["step"] for r in validations(run)] == [0, 2]


@pytest.fixture
def trained_run(request):
    """A run tinyformer trained: test_train's three steps on the built-in task, with its joint BPE (spm.model)."""
    return Path(request.getfixturevalue("three_steps"))


def cli_error(capsys, *argv):
    code = cli.main(["train", *argv, "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return code, err


@pytest.mark.parametrize("option", [["--preset", "tiny"], ["--vocab-size", "100"], ["--paper"]])
def test_an_option_that_defines_the_model_is_refused_with_init_from(option, marian, tmp_path, capsys):
    code, err = cli_error(capsys, "--init-from", str(marian.run), *option, "--save-dir", str(tmp_path / "run"))
    assert code == 2 and f"{option[0]} cannot be given with --init-from" in err
    assert not (tmp_path / "run").exists()


def test_what_cannot_start_a_fine_tuning_run_is_refused_in_one_line_with_nothing_written(marian, own_corpus,
                                                                                        tmp_path, capsys):
    common = ["--train", str(own_corpus["train"]), "--src", "en", "--tgt", "de", "--corpus-cache",
              str(tmp_path / "cache")]
    (tmp_path / "empty").mkdir()
    code, err = cli_error(capsys, "--init-from", str(tmp_path / "empty"), *common, "--save-dir", str(tmp_path / "a"))
    assert code == 1 and f"--init-from: no checkpoint_*.npz in {tmp_path / 'empty'}" in err
    bare = tmp_path / "bare"
    shutil.copytree(marian.run, bare, ignore=shutil.ignore_patterns("tokenizer"))
    code, err = cli_error(capsys, "--init-from", str(bare), *common, "--save-dir", str(tmp_path / "b"))
    assert code == 1 and f"the tokenizer of {bare / 'checkpoint_0000000.npz'}, {bare / 'tokenizer'}" in err
    assert "is missing" in err
    other = tmp_path / "c"
    shutil.copytree(marian.run / "tokenizer", other / "tokenizer")
    (other / "tokenizer" / "vocab.json").write_text('{"</s>": 0, "<unk>": 1, "<pad>": 2}', encoding="utf-8")
    code, err = cli_error(capsys, "--init-from", str(marian.run), *common, "--save-dir", str(other))
    assert code == 1 and f"already holds {other / 'tokenizer'}, which is not the tokenizer of --init-from" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "cache").exists()


class _Rank0:
    """Rank 0 of two, recording what it broadcasts."""

    rank, size = 0, 2

    def __init__(self):
        self.sent = []

    def broadcast_object(self, value, root=0):
        self.sent.append(value)
        return value

    broadcast_bytes = broadcast_object


class _Rank1:
    """Rank 1 of two, receiving what rank 0 broadcast."""

    rank, size = 1, 2

    def __init__(self, sent):
        self.sent = iter(sent)

    def broadcast_object(self, value, root=0):
        return next(self.sent)

    broadcast_bytes = broadcast_object


def test_several_ranks_share_a_marian_tokenizer_folder(marian):
    rank0 = _Rank0()
    mine = builders._shared_tokenizer(rank0, lambda: load_tokenizer(marian.run / "tokenizer"))
    theirs = builders._shared_tokenizer(_Rank1(rank0.sent), lambda: pytest.fail("only rank 0 builds"))
    assert type(theirs) is type(mine) and theirs.sha256 == mine.sha256 and Path(theirs.path).name == "tokenizer"
    assert theirs.encode_target("die katze.") == mine.encode_target("die katze.")


def test_pairs_beyond_the_positions_of_the_model_started_from_are_dropped(tmp_path):
    start = init_from.Start({"max_len": 128}, "tokenizer", "0" * 64, str(tmp_path / "checkpoint_0000000.npz"))
    said = []
    assert init_from.data_max_len(TrainConfig(max_len=100), start, said.append) == 100 and not said
    assert init_from.data_max_len(TrainConfig(), start, said.append) == 128
    assert said == ["--max-len 256 is more than the 128 positions of the model of --init-from: pairs longer than "
                    "128 tokens are dropped"]
