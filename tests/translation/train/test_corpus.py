"""`tinyformer train --train PREFIX [--valid PREFIX] [--test PREFIX] --src xx --tgt yy`: a corpus of
one's own, prepared once into a cache (tinyformer.translation.data.prepared), cleaned by stated rules, refused
in one line when it is bad, and equal to the built-in Multi30k when given Multi30k's files."""

import gzip
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import trained_models

from tinyformer.translation import checkpoint
from tinyformer import cli
from tinyformer.translation.data.synthetic import synthetic_pairs
from tinyformer.translation.train import TrainConfig, build_parts, evaluate, load_corpus

# One BLAS thread, as the built-in task's runs have by default: a corpus of one's own gets all of
# them, and their spinning took most of these runs' CPU time for matrices this small.
QUICK = ["--preset", "tiny", "--vocab-size", "200", "--max-tokens", "512", "--max-steps", "6", "--save-every", "3",
         "--eval-every", "6", "--bleu-samples", "5", "--warmup-steps", "4", "--threads", "1", "--no-progress"]


def write_corpus(prefix, pairs, src="en", tgt="de", gzip_target=True):
    """PREFIX.src (plain) and PREFIX.tgt(.gz) holding ``pairs``, one sentence per line."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    target = "".join(t + "\n" for _, t in pairs).encode("utf-8")
    if gzip_target:
        Path(f"{prefix}.{tgt}.gz").write_bytes(gzip.compress(target, mtime=0))
    else:
        Path(f"{prefix}.{tgt}").write_bytes(target)
    return prefix


def built_in(split, count):
    english, german = synthetic_pairs(split)
    return list(zip(english, german))[:count]


@pytest.fixture
def corpus(tmp_path):
    """The built-in task as files of one's own: 1,500 training pairs, 100 validation, 60 test."""
    data = tmp_path / "data"
    return {split: write_corpus(data / split, built_in(split, n)) for split, n in
            (("train", 1500), ("val", 100), ("test", 60))}


def train(capsys, *argv):
    code = cli.main(["train", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_corpus_of_ones_own_trains_and_the_run_evaluates_on_its_test_files(corpus, tmp_path, capsys):
    run = tmp_path / "runs" / "mine"
    code, out, err = train(capsys, "--train", str(corpus["train"]), "--valid", str(corpus["val"]), "--test",
                           str(corpus["test"]), "--save-dir", str(run), *QUICK)
    assert code == 0, err
    assert "read 1,500 pairs: kept 1,500; prepared into" in out and "test: exact match" in out
    assert (run / "spm.model").is_file() and (tmp_path / "runs" / "corpus-cache").is_dir()  # beside the run
    _, meta, _ = checkpoint.load_checkpoint(checkpoint.list_checkpoints(run)[-1])
    config = meta["config"]
    assert config["data"] == "files" and config["train_data"] == str(corpus["train"].resolve())
    recorded = config["data_files"]
    assert sorted(recorded) == ["--test", "--train", "--valid"]
    assert {Path(p).name for p in recorded["--train"]} == {"train.en", "train.de.gz"}
    assert all(len(digest) == 64 for files in recorded.values() for digest in files.values())
    newest = checkpoint.list_checkpoints(run)[-1]
    assert cli.main(["eval", "--checkpoint", str(newest), "--limit", "5", "--beam", "1"]) == 0
    assert "test: exact match" in capsys.readouterr().out
    averaged = run / "averaged.npz"
    assert cli.main(["average", "--dir", str(run), "--last", "2", "--output", str(averaged)]) == 0
    (tmp_path / "in.txt").write_text("We see 3 red cars\n\nToday I buy 1 old book\n", encoding="utf-8")
    assert cli.main(["translate", "--checkpoint", str(averaged), "--input", str(tmp_path / "in.txt"), "--output",
                     str(tmp_path / "out.txt"), "--beam", "2"]) == 0
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")) == 4
    assert cli.main(["explain", "--checkpoint", str(newest), "--source", "We see 3 red cars", "--output",
                     str(tmp_path / "page.html")]) == 0
    assert (tmp_path / "page.html").stat().st_size > 10_000


def test_a_second_run_and_a_resume_read_the_prepared_corpus_and_changed_files_are_noticed(corpus, tmp_path,
                                                                                         capsys):
    first, second = tmp_path / "runs" / "first", tmp_path / "runs" / "second"
    common = ["--train", str(corpus["train"]), "--valid", str(corpus["val"]), *QUICK]
    assert train(capsys, *common, "--save-dir", str(first), "--max-steps", "3")[0] == 0
    code, out, _ = train(capsys, *common, "--save-dir", str(second))
    assert code == 0 and "; read from the cache in" in out and "training a joint BPE" not in out
    assert (first / "spm.model").read_bytes() == (second / "spm.model").read_bytes()
    code, out, _ = train(capsys, "--save-dir", str(first), "--resume", "--max-steps", "6", "--no-progress")
    assert code == 0 and "read from the cache in" in out and "resumed from checkpoint_0000003.npz" in out

    with open(f"{corpus['train']}.en", "a", encoding="utf-8") as f:  # one more pair on each side
        f.write("We see 3 old cars\n")
    with gzip.open(f"{corpus['train']}.de.gz", "at", encoding="utf-8") as f:
        f.write("Wir sehen drei alte Autos\n")
    code, out, err = train(capsys, "--save-dir", str(first), "--resume", "--max-steps", "9", "--no-progress")
    assert code == 1 and "train.en has changed since the run was trained on it" in err
    assert len(err.strip().splitlines()) == 1 and len(checkpoint.list_checkpoints(first)) == 2
    code, out, _ = train(capsys, *common, "--save-dir", str(tmp_path / "runs" / "third"))
    assert code == 0 and "read 1,501 pairs: kept 1,501; prepared into" in out  # other files: another entry
    assert len([p for p in (tmp_path / "runs" / "corpus-cache").iterdir() if p.is_dir()]) == 2


def test_without_valid_the_validation_pairs_are_held_out_of_the_training_pairs_by_seed(corpus, tmp_path):
    runs, configs = iter(range(3)), []

    def parts(seed):
        config = TrainConfig(train_data=str(corpus["train"]), save_dir=str(tmp_path / f"run{next(runs)}"),
                             preset="tiny", vocab_size=200, valid_size=50, seed=seed).resolved()
        configs.append(config)
        return build_parts(config, echo=lambda *a: None)

    a, b, c = parts(0), parts(0), parts(1)
    assert configs[0].data_files is None and list(a.config.data_files) == ["--train"]  # found, the config untouched
    assert a.found_in(configs[0]) == a.config
    assert load_corpus(configs[0], "val") == a.val_text  # as `tinyformer eval --split val` reads it
    assert len(a.val_data) == 50 and len(a.train_data) == 1450
    assert np.array_equal(a.val_data.original_index, b.val_data.original_index)
    assert not np.array_equal(a.val_data.original_index, c.val_data.original_index)
    assert not set(a.val_data.original_index) & set(a.train_data.original_index)
    pairs = built_in("train", 1500)
    assert list(zip(*a.val_text)) == [pairs[i] for i in a.val_data.original_index]


def test_each_cleaning_rule_drops_and_counts_its_pairs(tmp_path, capsys):
    pairs = built_in("train", 400)
    pairs += [("", "Leer"), ("   ", "Leer"), ("Empty", "")]  # empty sides
    pairs += pairs[:7]  # repeats
    pairs += [("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25", "Eins")]  # a far longer source
    prefix = write_corpus(tmp_path / "data" / "train", pairs)
    code, out, err = train(capsys, "--train", str(prefix), "--valid-size", "20", "--dedup", "--max-ratio", "5",
                           "--save-dir", str(tmp_path / "runs" / "clean"), *QUICK)
    assert code == 0, err
    assert "read 411 pairs: kept 401; dropped 3 empty, 7 duplicates" in out
    assert "dropped 1 training pairs with a length ratio over 5" in out
    assert "380 training pairs" in out  # 401 kept, 20 held out, 1 beyond the ratio
    code, out, _ = train(capsys, "--train", str(prefix), "--valid-size", "20", "--max-len", "12",
                         "--save-dir", str(tmp_path / "runs" / "long"), *QUICK)
    assert code == 0 and "read 411 pairs: kept 408; dropped 3 empty" in out
    assert "(new there: the cleaning, the tokenizer, the arrays of these settings)" in out  # not --dedup now
    dropped = int(out.split("training pairs longer than 12 tokens")[0].rsplit("dropped ", 1)[1].replace(",", ""))
    assert dropped > 0


@pytest.mark.parametrize("case", ["line counts", "missing file", "invalid UTF-8", "same language",
                                  "empty after cleaning", "valid without train", "train with multi30k"])
def test_bad_input_is_refused_in_one_line_and_nothing_is_half_written(case, tmp_path, capsys):
    prefix, run = tmp_path / "data" / "train", tmp_path / "runs" / "bad"
    pairs = built_in("train", 50)
    argv = ["--train", str(prefix)]
    if case == "line counts":
        write_corpus(prefix, pairs, gzip_target=False)
        Path(f"{prefix}.de").write_text("".join(t + "\n" for _, t in pairs[:48]), encoding="utf-8")
        expected, code = ["train.en", "50", "train.de", "48"], 1
    elif case == "missing file":
        write_corpus(prefix, pairs)
        os.remove(f"{prefix}.de.gz")
        expected, code = ["--train", "train.de", "train.de.gz"], 1
    elif case == "invalid UTF-8":
        write_corpus(prefix, pairs, gzip_target=False)
        lines = Path(f"{prefix}.de").read_bytes().split(b"\n")
        lines[2] = b"Gr\xfcne Autos"  # Latin-1, not UTF-8
        Path(f"{prefix}.de").write_bytes(b"\n".join(lines))
        expected, code = ["train.de", "line 3", "UTF-8"], 1
    elif case == "same language":
        write_corpus(prefix, pairs)
        argv += ["--tgt", "en"]
        expected, code = ["both 'en'"], 2
    elif case == "empty after cleaning":
        write_corpus(prefix, [("", "Leer")] * 5 + [("Empty", " ")] * 3)
        expected, code = ["no pair is left after cleaning", "8 empty"], 1
    elif case == "valid without train":
        argv = ["--valid", str(prefix)]
        expected, code = ["--valid", "replaces --data synthetic"], 2
    else:
        write_corpus(prefix, pairs)
        argv += ["--data", "multi30k"]
        expected, code = ["--train", "replaces --data multi30k"], 2
    got, out, err = train(capsys, *argv, "--save-dir", str(run), *QUICK)
    assert got == code, (out, err)
    assert len(err.strip().splitlines()) == 1 and all(word in err for word in expected), err
    assert not checkpoint.list_checkpoints(run)
    cache = tmp_path / "runs" / "corpus-cache"
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.name.startswith(".")]  # no partial product


PREPARE = """
import sys
from tinyformer.translation.data.corpus import file_fingerprints, find_corpus
from tinyformer.translation.data.prepared import prepare_corpus
files = find_corpus(sys.argv[1], "en", "de")
prepared = prepare_corpus(files, file_fingerprints(files), sys.argv[2], 200, 1_000_000)
print(prepared.tokenizer.sha256, int(prepared.src.ids.sum()), int(prepared.tgt.offsets[-1]))
"""


def test_processes_preparing_one_corpus_at_once_share_one_cache_entry(corpus, tmp_path):
    """As the ranks of a run (or two runs started together) do: one process prepares the corpus
    under the cache's locks, the other waits and reads the same tokenizer and arrays."""
    import children

    cache = tmp_path / "cache"
    started = [children.start([children.PYTHON, "-c", PREPARE, corpus["train"], cache], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    results = [child.communicate(timeout=300) for child in started]
    assert all(child.returncode == 0 for child in started), results
    outputs = [out for out, _ in results]
    assert sorted("prepared into" in out for out in outputs) == [False, True]
    assert sum("read from the cache" in out for out in outputs) == 1
    assert len({out.strip().splitlines()[-1] for out in outputs}) == 1
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1 and not list(cache.rglob(".*"))


# ------------------------------------------------------------------ Multi30k given as files of one's own
def multi30k_files():
    trained_models.multi30k_or_skip()
    folder = Path(os.environ["TINYFORMER_DATA"]) / "multi30k"
    return {split: str(folder / name) for split, name in (("train", "train"), ("val", "val"),
                                                          ("test", "test_2016_flickr"))}


def training_losses(run):
    return [r["loss"] for r in run.metrics()]


def test_multi30k_files_as_a_corpus_of_ones_own_train_as_the_built_in_multi30k(trained_multi30k, tmp_path):
    """--train/--valid/--test on Multi30k's own files (gzip, en-de) against `--data multi30k`, same
    options and seed: the same tokenizer, pairs, losses at every step, validation loss and BLEU,
    and test BLEU."""
    files = multi30k_files()
    options = {k: v for k, v in trained_models.MULTI30K.items() if k != "data"}
    mine = trained_models.train_into(tmp_path, "files", dict(options, train_data=files["train"],
                                                               valid_data=files["val"], test_data=files["test"]))
    built = trained_multi30k
    assert (mine.directory / "spm.model").read_bytes() == (built.directory / "spm.model").read_bytes()
    assert training_losses(mine) == training_losses(built) and len(training_losses(mine)) == options["max_steps"]
    (val_mine,), (val_built,) = mine.metrics("val"), built.metrics("val")
    assert {k: val_mine[k] for k in ("loss", "bleu_greedy")} == {k: val_built[k] for k in ("loss", "bleu_greedy")}
    scores = []
    for run in (mine, built):
        model, tokenizer = run.load()
        sources, references = run.corpus("test")
        scores.append(evaluate(model, tokenizer, sources[:12], references[:12], beam_size=2)["bleu"])
    assert scores[0] == scores[1]


def test_a_second_language_pair_trains_end_to_end_as_the_built_in_one(tmp_path):
    """English-French: the files of Multi30k given as a corpus of one's own reach the losses and
    BLEU of `--data multi30k --tgt fr` with the same options."""
    files = multi30k_files()
    # 10 steps: the loss falls from 8.1 to 6.6 (an equality of two runs holds at 10 steps as at 20)
    options = dict({k: v for k, v in trained_models.MULTI30K.items() if k != "data"}, tgt_lang="fr", max_steps=10,
                   eval_every=10, save_every=10)
    mine = trained_models.train_into(tmp_path, "files-fr", dict(options, train_data=files["train"],
                                                                 valid_data=files["val"]))
    built = trained_models.train_into(tmp_path, "multi30k-fr", dict(options, data="multi30k"))
    assert training_losses(mine) == training_losses(built)
    assert training_losses(mine)[-1] < training_losses(mine)[0] - 0.5
    assert mine.metrics("val")[-1]["bleu_greedy"] == built.metrics("val")[-1]["bleu_greedy"]
    assert json.loads((mine.directory / trained_models.RECORD).read_text())["config"]["tgt_lang"] == "fr"
