"""Loading is safe: no checkpoint is ever unpickled, and every bad file — a pickle, an object array,
a truncated, corrupt, empty or foreign file, a checkpoint of another architecture or vocabulary — is
refused with an error naming the file and what is wrong, through the API and through
`tinyformer translate/eval --checkpoint` (exit status 1, one line). No code runs a shell.
"""

import io
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.translation.train.test_trainer import cached_load_corpus, small_config

from tinyformer.translation import checkpoint, train
from tinyformer import cli
from tinyformer.translation.checkpoint import CheckpointError
from tinyformer.translation.data.tokenizer import Tokenizer
from tinyformer.model.nn import Transformer
from tinyformer.translation.train import Trainer, load_model

ROOT = Path(__file__).resolve().parents[2]
QUIET = dict(echo=lambda *a: None, progress=False)
MARKER = "unpickled-marker"  # a directory that unpickling any of the payloads below would create


class Payload:
    """Unpickling this calls os.makedirs(marker): proof that a loader ran code from the file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker,)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real two-step `tiny` run (vocabulary 120) and a tokenizer of another vocabulary (100)."""
    save_dir = tmp_path_factory.mktemp("run")
    real = train.builders.load_corpus
    train.builders.load_corpus = cached_load_corpus
    try:
        trainer = Trainer(small_config(save_dir, max_steps=2, save_every=2), **QUIET)
        trainer.run()
        english, german = cached_load_corpus(trainer.config, "train")
    finally:
        train.builders.load_corpus = real
    other = tmp_path_factory.mktemp("other-vocabulary")
    Tokenizer.train(english[:3000] + german[:3000], other, vocab_size=100, name="spm")
    return checkpoint.checkpoint_path(save_dir, 2), other / train.TOKENIZER_FILE


def _npz_bytes(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _metadata_array(meta):
    return np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)


def make_bad_file(kind, good, folder):
    """Write the bad file ``kind`` into ``folder`` (beside a copy of the run's tokenizer); returns
    (path, the phrase its error must hold)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(good.parent / train.TOKENIZER_FILE, folder / train.TOKENIZER_FILE)
    path = folder / "checkpoint_0000002.npz"
    data = good.read_bytes()
    state, meta, adam = checkpoint.load_checkpoint(good)
    marker = str(folder / MARKER)
    if kind == "object array":
        objects = np.empty(1, dtype=object)
        objects[0] = Payload(marker)
        path.write_bytes(_npz_bytes(metadata=_metadata_array(meta), **{"model/src_embed.weight": objects}))
        return path, "array 'model/src_embed.weight' is a pickled object array"
    if kind == "pickle":
        path.write_bytes(pickle.dumps({"model": Payload(marker)}))
        return path, "not a tinyformer checkpoint (an .npz, i.e. zip, file): it starts with b'\\x80"
    if kind == "truncated":
        path.write_bytes(data[: len(data) * 6 // 10])
        return path, "the file is truncated or corrupt"
    if kind == "corrupt bytes":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:])
        return path, "the file is truncated or corrupt"
    if kind == "text file":
        path.write_text("step 2: not a checkpoint at all\n")
        return path, "not a tinyformer checkpoint (an .npz, i.e. zip, file): it starts with b'step'"
    if kind == "empty file":
        path.write_bytes(b"")
        return path, "not a tinyformer checkpoint (an .npz, i.e. zip, file): the file is empty"
    if kind == ".npy file":
        buffer = io.BytesIO()
        np.save(buffer, state["src_embed.weight"])
        path.write_bytes(buffer.getvalue())
        return path, "it starts with b'\\x93NUM'"
    if kind == "no metadata":
        path.write_bytes(_npz_bytes(**{f"model/{k}": v for k, v in state.items()}))
        return path, "no 'metadata' entry: not a tinyformer checkpoint"
    if kind == "metadata not JSON":
        path.write_bytes(_npz_bytes(metadata=np.frombuffer(b"\xff{step: 2", np.uint8),
                                    **{f"model/{k}": v for k, v in state.items()}))
        return path, "its metadata is not JSON"
    if kind == "no model_config":
        checkpoint.save_checkpoint(path, state, {"step": 2, "tokenizer_sha256": meta["tokenizer_sha256"]})
        return path, "has no model_config in its metadata"
    if kind == "another architecture":  # the parameters of a d_model=32 model under d_model=64 metadata
        narrow = Transformer(**dict(meta["model_config"], d_model=32))
        checkpoint.save_checkpoint(path, narrow.state_dict(), meta, adam)
        return path, ("its parameters do not fit its model_config (d_model 64, d_ff 256, heads 4, num_layers 2): "
                      "src_embed.weight is (120, 32), not (120, 64) (and ")
    if kind == "another vocabulary":  # the checkpoint is fine; --tokenizer names another run's
        path.write_bytes(data)
        return path, "pieces) is not the one checkpoint"
    raise ValueError(kind)


BAD_FILES = ["object array", "pickle", "truncated", "corrupt bytes", "text file", "empty file", ".npy file",
             "no metadata", "metadata not JSON", "no model_config", "another architecture",
             "another vocabulary"]
# 12 bad files, each through the API, `translate` and `eval`; 2 refused resumes below.
NEEDS_A_MODEL = {"no model_config", "another architecture", "another vocabulary"}  # refused by load_model


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_bad_checkpoint_is_refused_through_the_api(kind, run, tmp_path):
    good, other_tokenizer = run
    path, phrase = make_bad_file(kind, good, tmp_path / "bad")
    tokenizer = other_tokenizer if kind == "another vocabulary" else None
    if kind not in NEEDS_A_MODEL:
        with pytest.raises(CheckpointError) as info:
            checkpoint.load_checkpoint(path)
        assert str(path) in str(info.value) and phrase in str(info.value), str(info.value)
    with pytest.raises(CheckpointError) as info:
        load_model(path, tokenizer_path=tokenizer)
    message = str(info.value)
    assert str(path) in message and phrase in message, message
    assert "\n" not in message
    if kind == "another vocabulary":
        assert "100 pieces" in message and "vocabulary 120" in message
    assert not (tmp_path / "bad" / MARKER).exists()  # nothing was unpickled


@pytest.mark.parametrize("command", ["translate", "eval"])
@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_bad_checkpoint_is_one_line_and_exit_1_on_the_command_line(kind, command, run, tmp_path, capsys):
    good, other_tokenizer = run
    path, phrase = make_bad_file(kind, good, tmp_path / "bad")
    source = tmp_path / "source.txt"
    source.write_text("a house\n")
    argv = ([command, "--checkpoint", str(path)]
            + (["--input", str(source)] if command == "translate" else ["--split", "val", "--limit", "2"])
            + (["--tokenizer", str(other_tokenizer)] if kind == "another vocabulary" else []))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"tinyformer {command}: error: ") and str(path) in err and phrase in err, err
    assert not (tmp_path / "bad" / MARKER).exists()


def test_the_good_checkpoint_still_loads(run):
    model, tokenizer, meta = load_model(run[0])
    assert meta["step"] == 2 and model.d_model == 64 and len(tokenizer) == 120


@pytest.mark.parametrize("change, phrase", [
    ("architecture", "holds another model than this run builds (d_model: 64 vs 32"),
    ("tokenizer", "was trained with another tokenizer than"),
])
def test_resuming_from_a_checkpoint_of_another_model_or_tokenizer_is_refused(change, phrase, run, tmp_path,
                                                                             monkeypatch):
    good, other_tokenizer = run
    monkeypatch.setattr(train.builders, "load_corpus", cached_load_corpus)
    shutil.copy(good, tmp_path / good.name)
    overrides = {}
    if change == "architecture":
        shutil.copy(good.parent / train.TOKENIZER_FILE, tmp_path / train.TOKENIZER_FILE)
        overrides["model_overrides"] = {"d_model": 32}
    else:
        shutil.copy(other_tokenizer, tmp_path / train.TOKENIZER_FILE)
    before = (tmp_path / good.name).read_bytes()
    with pytest.raises(CheckpointError) as info:
        Trainer(small_config(tmp_path, max_steps=4, **overrides), resume=True, **QUIET).run()
    assert str(tmp_path / good.name) in str(info.value) and phrase in str(info.value), str(info.value)
    assert (tmp_path / good.name).read_bytes() == before and checkpoint.list_checkpoints(tmp_path) == [
        tmp_path / good.name]


# ------------------------------------------------------------------ the source itself
def _python_files(*folders):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_numpy_never_loads_with_pickles_allowed():
    """Every np.load / numpy.load in the package and the benchmarks passes allow_pickle=False."""
    calls = 0
    for path in _python_files("tinyformer", "benchmarks", "examples"):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"\b(?:np|numpy)\.load\(", text):
            call = text[match.start(): text.find(")", match.end()) + 1]
            assert "allow_pickle=False" in call, f"{path.relative_to(ROOT)}: {call}"
            calls += 1
        assert not re.search(r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b", text, re.M), \
            f"{path.relative_to(ROOT)} imports a pickle module"
    assert calls >= 1  # checkpoint.load_checkpoint


def test_no_code_runs_a_shell():
    """No subprocess gets shell=True, and nothing calls os.system or os.popen."""
    pattern = re.compile(r"shell\s*=\s*True|\bos\.system\(|\bos\.popen\(")
    offenders = []
    for path in _python_files("tinyformer", "benchmarks", "examples", "tests"):
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
