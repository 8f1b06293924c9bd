"""Hostile files and extreme values (issue 64): every size a file states is checked against a stated
bound (``nn.limits``) and against the tensors the file holds, before any array of that size exists or
any model is built, at each of the four doors a model comes in by (a checkpoint, a safetensors
checkpoint, a Marian folder, a PyTorch state dict, and ``train --init-from``); metadata of the wrong
JSON type, integer weights, integer keys and unreadable files are one line naming the file and the
field. A property test feeds generated configs and metadata to every door: a clean refusal (the
project's own error types) or a working model, never another exception, never more than ``PEAK``
bytes traced before the answer.
"""

import json
import os
import shutil
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from children import run as run_child, tinyformer
from hypothesis import HealthCheck, given, settings, strategies as st
from marian_folders import corpus, write_tokenizer

from tinyformer import cli
from tinyformer.model.nn import Transformer, TransformerConfig, limits
from tinyformer.translation.checkpoint import CheckpointError, save_checkpoint
from tinyformer.translation.data.tokenizer import Tokenizer
from tinyformer.translation.interop.marian import config_to_marian, state_to_marian
from tinyformer.translation.interop.runs import import_marian
from tinyformer.translation.interop.tensor_files import InteropError
from tinyformer.translation.interop.torch_runs import import_torch
from tinyformer.translation.interop.torch_transformer import to_torch_state
from tinyformer.translation.train.init_from import build_model, read_start
from tinyformer.translation.train.migration import FORMAT
from tinyformer.translation.train.state import load_model

PEAK = 64 * 2**20  # bytes tracemalloc may see, at most, while a door reads a hostile file of a tiny model
QUICK = 2.0  # seconds a refusal may take, at most
# What a door may raise, one line each: the project's own, and FileNotFoundError where the metadata
# names a tokenizer file that is not there (a plain name, so not refused as a path).
REFUSALS = (CheckpointError, InteropError, FileNotFoundError)
TINY = dict(d_model=8, d_ff=16, heads=2, num_layers=1, max_len=32, seed=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny model at each door: a run (checkpoint, safetensors export, spm.model), a PyTorch state dict
    with its model_config JSON, and a Marian folder; each refused case below is a copy with one change."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("hostile")
    pairs = corpus(200)
    tokenizer = Tokenizer.train([s for s, _ in pairs] + [t for _, t in pairs], root / "run", vocab_size=60)
    model = Transformer(src_vocab_size=len(tokenizer), **TINY)
    state = model.state_dict()
    meta = {"format": FORMAT, "model_config": model.config.to_dict(), "step": 0, "tokenizer_sha256": tokenizer.sha256,
            "tokenizer_file": "spm.model"}
    save_checkpoint(root / "run" / "checkpoint_0000000.npz", state, meta)
    torch_folder = root / "torch"
    torch_folder.mkdir()
    config = model.config
    save_file({k: np.ascontiguousarray(v) for k, v in to_torch_state(state, config).items()},
              str(torch_folder / "model.safetensors"))
    (torch_folder / "model.json").write_text(json.dumps(model.config.to_dict()), encoding="utf-8")
    marian = root / "marian"
    vocab = write_tokenizer(marian, pairs, vocab_size=60)
    marian_config = TransformerConfig(src_vocab_size=len(vocab), pad_id=vocab["<pad>"], positional="sinusoid_split",
                                      final_norm=False, activation="silu", logits_bias=True, **TINY)
    marian_model = Transformer.from_config(marian_config)
    save_file(state_to_marian(marian_model.state_dict(), marian_config), str(marian / "model.safetensors"))
    (marian / "config.json").write_text(json.dumps(config_to_marian(marian_config, eos_id=0)), encoding="utf-8")
    return SimpleNamespace(root=root, run=root / "run", state=state, meta=meta, tokenizer=tokenizer,
                           torch=torch_folder, marian=marian)


def write_npz(path, state, meta):
    """A checkpoint as ``save_checkpoint`` lays it out, but whatever ``meta`` holds (NaN included)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{k}": v for k, v in state.items()}
    np.savez(path, metadata=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    return path


def write_safetensors(path, state, header):
    """A safetensors checkpoint whose "tinyformer" metadata is ``header`` (a JSON text) as it stands."""
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(path),
              metadata={"tinyformer": header, "format": "np"})
    return path


def copy_run(files, folder):
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files.run / "spm.model", folder / "spm.model")
    return folder


def copy_marian(files, folder, config=None):
    shutil.copytree(files.marian, folder)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def with_model_config(meta, field, value):
    meta = json.loads(json.dumps(meta))
    meta["model_config"][field] = value
    return meta


# ---------------------------------------------------------------- the doors, each on one edited dict

def checkpoint_door(files, folder, meta):
    return load_model(write_npz(copy_run(files, folder) / "checkpoint_0000000.npz", files.state, meta))[0]


def safetensors_door(files, folder, meta):
    path = write_safetensors(copy_run(files, folder) / "model.safetensors", files.state, json.dumps(meta))
    return load_model(path)[0]


def init_from_door(files, folder, meta):
    path = write_npz(copy_run(files, folder) / "checkpoint_0000000.npz", files.state, meta)
    start = read_start(SimpleNamespace(init_from=str(path)))
    return build_model(SimpleNamespace(dropout=None, seed=0, device="cpu"), start)


def torch_door(files, folder, model_config):
    folder.mkdir(parents=True)
    (folder / "model.json").write_text(json.dumps(model_config), encoding="utf-8")
    output = folder / "run"
    try:
        return import_torch(files.torch / "model.safetensors", output, files.run / "spm.model", folder / "model.json")
    except REFUSALS:
        assert not output.exists()
        raise


def marian_door(files, folder, config):
    output = folder.parent / (folder.name + "-run")
    try:
        return import_marian(copy_marian(files, folder, config), output)
    except REFUSALS:
        assert not output.exists()
        raise


def measured(door, *args):
    """(what ``door(*args)`` returned or the error it raised, seconds, peak bytes traced)."""
    tracemalloc.start()
    began = time.perf_counter()
    try:
        try:
            outcome = door(*args)
        except REFUSALS as error:
            outcome = error
        return outcome, time.perf_counter() - began, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------- the bounds, as arithmetic

@pytest.mark.parametrize("changes", [{}, dict(tgt_vocab_size=13, positional="learned", logits_bias=True),
                                     dict(norm_first=True, encoder_layers=3, decoder_layers=2),
                                     dict(final_norm=True, positional="sinusoid_split", heads=4)])
def test_the_implied_parameters_are_the_built_models(changes):
    config = TransformerConfig(src_vocab_size=11, **{**TINY, **changes})
    state = Transformer.from_config(config).state_dict()
    assert limits.parameter_count(config) == sum(value.size for value in state.values())
    assert limits.parameter_shapes(config) == {name: value.shape for name, value in state.items()}


@pytest.mark.parametrize("field, value, named", [
    ("d_model", 10**9, "d_model"), ("d_ff", 3 * 10**9, "d_ff"), ("num_layers", 100_000, "num_layers"),
    ("decoder_layers", 5_000, "decoder_layers"), ("max_len", 10**9, "max_len"), ("max_len", 70_000, "max_len"),
    ("src_vocab_size", 10**12, "src_vocab_size")])
def test_an_absurd_size_is_refused_by_arithmetic_naming_field_and_bound(field, value, named):
    config = TransformerConfig(**{"src_vocab_size": 11, **TINY, field: value})
    began = time.perf_counter()
    with pytest.raises(ValueError) as refused:
        limits.check_buildable(config, "here.json")
    assert time.perf_counter() - began < 0.1
    message = str(refused.value)
    assert message.startswith("here.json: ") and named in message and "at most" in message and "\n" not in message


# ---------------------------------------------------------------- through the command line

def one_error_line(capsys, argv, *phrases):
    tracemalloc.start()
    began = time.perf_counter()
    try:
        status = cli.main(argv)
        seconds, peak = time.perf_counter() - began, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert status == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tinyformer {argv[0]}: error: "), err
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
    assert "Traceback" not in err and "MemoryError" not in err
    assert seconds < QUICK and peak < PEAK, (seconds, peak)
    return lines[0]


@pytest.mark.parametrize("field, value", [("d_model", 10**9), ("d_ff", 10**9), ("num_layers", 10**6),
                                          ("max_len", 10**9), ("max_len", 80_000), ("d_ff", 40_000),
                                          ("encoder_layers", 20_000)])
@pytest.mark.parametrize("kind", ["checkpoint", "safetensors"])
def test_translate_refuses_an_absurd_or_mismatched_size_before_building(files, tmp_path, capsys, kind, field, value):
    meta = with_model_config(files.meta, field, value)
    folder = copy_run(files, tmp_path / "run")
    path = (write_npz(folder / "checkpoint_0000000.npz", files.state, meta) if kind == "checkpoint"
            else write_safetensors(folder / "model.safetensors", files.state, json.dumps(meta)))
    (tmp_path / "in.txt").write_text("the cat runs.\n", encoding="utf-8")
    one_error_line(capsys, ["translate", "--checkpoint", str(path), "--input", str(tmp_path / "in.txt")],
                   str(path), field)


@pytest.mark.parametrize("field, value", [("d_model", 10**9), ("encoder_ffn_dim", 10**9),
                                          ("decoder_ffn_dim", 10**9), ("encoder_layers", 10**6),
                                          ("max_position_embeddings", 10**9), ("max_position_embeddings", 70_000),
                                          ("encoder_ffn_dim", 40_000)])
def test_import_marian_refuses_an_absurd_config_json_naming_the_field(files, tmp_path, capsys, field, value):
    config = json.loads((files.marian / "config.json").read_text())
    if field.endswith("ffn_dim"):
        config["encoder_ffn_dim"] = config["decoder_ffn_dim"] = value
    else:
        config[field] = value
    folder = copy_marian(files, tmp_path / "opus", config)
    one_error_line(capsys, ["import", "marian", str(folder), "--output", str(tmp_path / "out")],
                   "config.json", field)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value", [("d_model", 10**9), ("max_len", 10**9), ("num_layers", 10**5),
                                          ("d_ff", 30_000)])
def test_import_torch_refuses_an_absurd_model_config_naming_the_field(files, tmp_path, capsys, field, value):
    values = {**json.loads((files.torch / "model.json").read_text()), field: value}
    (tmp_path / "model.json").write_text(json.dumps(values), encoding="utf-8")
    one_error_line(capsys, ["import", "torch", str(files.torch / "model.safetensors"), "--output",
                            str(tmp_path / "out"), "--model-config", str(tmp_path / "model.json"),
                            "--tokenizer", str(files.run / "spm.model")], "model.json", field)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("header, phrase", [
    ("[1, 2]", "metadata"), ('"a string"', "metadata"), ("null", "metadata"),
    ('{"model_config": [8]}', "model_config"), ('{"model_config": "base"}', "model_config"),
    ("MODEL_CONFIG_NULL", "model_config"), ("IMPORTED_FROM_LIST", "imported_from"),
    ("STEP_STRING", "step"), ("TOKENIZER_FILE_LIST", "tokenizer_file")])
def test_safetensors_metadata_of_the_wrong_json_type_is_one_line(files, tmp_path, capsys, header, phrase):
    meta = json.loads(json.dumps(files.meta))
    edits = {"MODEL_CONFIG_NULL": ("model_config", None), "IMPORTED_FROM_LIST": ("imported_from", [1]),
             "STEP_STRING": ("step", "ten"), "TOKENIZER_FILE_LIST": ("tokenizer_file", ["spm.model"])}
    if header in edits:
        meta[edits[header][0]] = edits[header][1]
        header = json.dumps(meta)
    path = write_safetensors(copy_run(files, tmp_path / "run") / "model.safetensors", files.state, header)
    (tmp_path / "in.txt").write_text("the cat runs.\n", encoding="utf-8")
    for argv in (["translate", "--checkpoint", str(path), "--input", str(tmp_path / "in.txt")],
                 ["export", str(path), "--format", "torch", "--output", str(tmp_path / "out.safetensors")]):
        one_error_line(capsys, argv, str(path), phrase)
        assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("kind", ["checkpoint", "safetensors"])
def test_an_integer_weight_is_refused_on_loading_naming_file_and_tensor(files, tmp_path, capsys, kind, dtype):
    state = dict(files.state)
    state["src_embed.weight"] = np.ones(state["src_embed.weight"].shape, dtype)
    folder = copy_run(files, tmp_path / "run")
    path = (write_npz(folder / "checkpoint_0000000.npz", state, files.meta) if kind == "checkpoint"
            else write_safetensors(folder / "model.safetensors", state, json.dumps(files.meta)))
    (tmp_path / "in.txt").write_text("the cat runs.\n", encoding="utf-8")
    one_error_line(capsys, ["translate", "--checkpoint", str(path), "--input", str(tmp_path / "in.txt")],
                   str(path), "src_embed.weight", np.dtype(dtype).name)


def test_an_integer_tensor_of_a_marian_folder_is_named_with_its_file(files, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    folder = copy_marian(files, tmp_path / "opus")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.shared.weight"] = tensors["model.shared.weight"].astype(np.int32)
    save_file(tensors, str(folder / "model.safetensors"))
    one_error_line(capsys, ["import", "marian", str(folder), "--output", str(tmp_path / "out")],
                   str(folder / "model.safetensors"), "model.shared.weight", "int32")
    assert not (tmp_path / "out").exists()


def test_an_integer_key_of_a_state_dict_is_called_so(files, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    stored = load_file(str(files.torch / "model.safetensors"))
    tensors = {name: torch.from_numpy(value) for name, value in stored.items()}
    tensors[7] = torch.zeros(3)
    torch.save(tensors, str(tmp_path / "model.pt"))
    line = one_error_line(capsys, ["import", "torch", str(tmp_path / "model.pt"), "--output", str(tmp_path / "out"),
                                   "--model-config", str(files.torch / "model.json"),
                                   "--tokenizer", str(files.run / "spm.model")], str(tmp_path / "model.pt"))
    assert "key 7" in line and "an int" in line and "Tensor, not a tensor" not in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["model-config", "config.json", "spm.model"])
def test_a_folder_where_a_file_belongs_is_called_a_folder(files, tmp_path, capsys, where):
    if where == "model-config":
        (tmp_path / "model.json").mkdir()
        argv = ["import", "torch", str(files.torch / "model.safetensors"), "--output", str(tmp_path / "out"),
                "--model-config", str(tmp_path / "model.json"), "--tokenizer", str(files.run / "spm.model")]
        named = tmp_path / "model.json"
    elif where == "config.json":
        folder = copy_marian(files, tmp_path / "opus")
        (folder / "config.json").unlink()
        (folder / "config.json").mkdir()
        argv, named = ["import", "marian", str(folder), "--output", str(tmp_path / "out")], folder / "config.json"
    else:
        (tmp_path / "spm.model").mkdir()
        argv = ["import", "torch", str(files.torch / "model.safetensors"), "--output", str(tmp_path / "out"),
                "--model-config", str(files.torch / "model.json"), "--tokenizer", str(tmp_path / "spm.model")]
        named = tmp_path / "spm.model"
    one_error_line(capsys, argv, str(named), "is a folder, not a file")
    assert not (tmp_path / "out").exists()


def _unprivileged(argv):
    """argv run where file permissions hold: as root, without the capabilities that override them."""
    if os.geteuid() != 0:
        return argv
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: a file cannot be made unreadable here")
    drop = "-dac_override,-dac_read_search"
    return ["setpriv", "--inh-caps", drop, "--bounding-set", drop, *argv]


@pytest.mark.parametrize("unreadable", ["spm.model", "checkpoint", "safetensors", "config.json", "vocab.json",
                                        "source.spm", "model-config", "torch-weights", "init-from tokenizer"])
def test_an_unreadable_file_is_called_unreadable(files, tmp_path, unreadable):
    folder = copy_run(files, tmp_path / "run")
    checkpoint = write_npz(folder / "checkpoint_0000000.npz", files.state, files.meta)
    safetensors = write_safetensors(folder / "model.safetensors", files.state, json.dumps(files.meta))
    (tmp_path / "in.txt").write_text("the cat runs.\n", encoding="utf-8")
    opus = copy_marian(files, tmp_path / "opus")
    shutil.copytree(files.torch, tmp_path / "torch")
    translate = ["translate", "--input", str(tmp_path / "in.txt"), "--checkpoint"]
    torch_import = ["import", "torch", str(tmp_path / "torch" / "model.safetensors"), "--output", str(tmp_path / "out"),
                    "--model-config", str(tmp_path / "torch" / "model.json"), "--tokenizer", str(folder / "spm.model")]
    cases = {"spm.model": (translate + [str(checkpoint)], folder / "spm.model"),
             "checkpoint": (translate + [str(checkpoint)], checkpoint),
             "safetensors": (translate + [str(safetensors)], safetensors),
             "config.json": (["import", "marian", str(opus), "--output", str(tmp_path / "out")], opus / "config.json"),
             "vocab.json": (["import", "marian", str(opus), "--output", str(tmp_path / "out")], opus / "vocab.json"),
             "source.spm": (["import", "marian", str(opus), "--output", str(tmp_path / "out")], opus / "source.spm"),
             "model-config": (torch_import, tmp_path / "torch" / "model.json"),
             "torch-weights": (torch_import, tmp_path / "torch" / "model.safetensors"),
             "init-from tokenizer": (["train", "--init-from", str(folder), "--save-dir", str(tmp_path / "out"),
                                      "--max-steps", "1"], folder / "spm.model")}
    argv, locked = cases[unreadable]
    locked.chmod(0)
    done = run_child(_unprivileged(tinyformer(*argv)), timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert str(locked) in lines[0] and "not readable (permission denied)" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the property test, at every door

HOSTILE = st.one_of(
    st.sampled_from([0, -1, -(2**63), 2**31, 2**63, 10**9, 10**100, 65_537, 70_000, 40_000, 1e300, float("nan"),
                     float("inf"), 1.5, 8.0, True, False, None, "8", "", [], [8], {}, {"d_model": 8}]),
    st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=4))
SIZES = st.one_of(st.sampled_from([0, -1, 2**31, 2**63, 10**9, 10**100, 65_537, 70_000, 40_000, 1025, 16, 8, 4]),
                  st.integers(-(2**70), 2**70), st.integers(1, 100_000))
MODEL_FIELDS = TransformerConfig.field_names() + ["not_a_field"]
SIZE_FIELDS = ("d_model", "d_ff", "heads", "num_layers", "encoder_layers", "decoder_layers", "max_len",
               "src_vocab_size", "tgt_vocab_size")
MARIAN_SIZES = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "max_position_embeddings",
                "encoder_attention_heads", "encoder_ffn_dim")  # the last two set with their decoder_ twins
META_FIELDS = ("model_config", "format", "step", "tokenizer_file", "tokenizer_sha256", "imported_from", "config")
PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def check_outcome(outcome, seconds, peak):
    assert peak < PEAK, peak
    if isinstance(outcome, BaseException):
        message = str(outcome)
        assert message and "\n" not in message, message
        assert seconds < QUICK, seconds


@pytest.mark.parametrize("door", [checkpoint_door, safetensors_door, init_from_door])
@PROPERTY
@given(where=st.sampled_from(["size", "model_config", "metadata", "whole"]), field=st.data(), value=HOSTILE)
def test_a_checkpoint_door_refuses_cleanly_or_builds(files, tmp_path_factory, door, where, field, value):
    meta = json.loads(json.dumps(files.meta))
    if where == "size":
        meta["model_config"][field.draw(st.sampled_from(SIZE_FIELDS))] = field.draw(SIZES)
    elif where == "model_config":
        meta["model_config"][field.draw(st.sampled_from(MODEL_FIELDS))] = value
    elif where == "metadata":
        meta[field.draw(st.sampled_from(META_FIELDS))] = value
    else:
        meta = value
    check_outcome(*measured(door, files, tmp_path_factory.mktemp("door"), meta))


@PROPERTY
@given(size=st.booleans(), field=st.data(), value=HOSTILE)
def test_the_torch_door_refuses_cleanly_or_imports(files, tmp_path_factory, size, field, value):
    values = json.loads((files.torch / "model.json").read_text())
    if size:
        values[field.draw(st.sampled_from(SIZE_FIELDS))] = field.draw(SIZES)
    else:
        values[field.draw(st.sampled_from(MODEL_FIELDS))] = value
    check_outcome(*measured(torch_door, files, tmp_path_factory.mktemp("door") / "torch", values))


@PROPERTY
@given(size=st.booleans(), field=st.data(), value=HOSTILE)
def test_the_marian_door_refuses_cleanly_or_imports(files, tmp_path_factory, size, field, value):
    config = json.loads((files.marian / "config.json").read_text())
    if size:
        name, value = field.draw(st.sampled_from(MARIAN_SIZES)), field.draw(SIZES)
        config[name] = value
        if name.startswith("encoder_") and name != "encoder_layers":
            config[name.replace("encoder_", "decoder_")] = value
    else:
        config[field.draw(st.sampled_from(sorted(config) + ["decoder_vocab_size"]))] = value
    check_outcome(*measured(marian_door, files, tmp_path_factory.mktemp("door") / "opus", config))


@pytest.mark.parametrize("overrides, field", [({"num_layers": 100_000}, "num_layers"), ({"d_model": 2**20}, "d_model"),
                                              ({"d_ff": 10**10}, "d_ff")])
def test_a_run_of_absurd_model_overrides_is_refused_before_building(files, overrides, field):
    """A training run's sizes come from flags, or on --resume from its checkpoint's config: the same bounds."""
    from tinyformer.translation.train.builders import build_model as build_run_model

    config = SimpleNamespace(dropout=None, model_overrides=overrides, seed=0, preset="tiny", paper=False, max_len=64,
                             device="cpu")
    tracemalloc.start()
    began = time.perf_counter()
    try:
        with pytest.raises(ValueError, match=f"{field}=.*at most") as refused:
            build_run_model(config, files.tokenizer)
        seconds, peak = time.perf_counter() - began, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(refused.value) and seconds < QUICK and peak < PEAK


@pytest.mark.parametrize("change, phrase", [(("model_config", "d_model", 10**9), "d_model"),
                                            (("model_config", "num_layers", 50_000), "num_layers"),
                                            (("config", None, [1, 2]), "config"), (("config", None, None), "config")])
def test_train_resume_refuses_a_hostile_checkpoint_in_one_line(files, tmp_path, capsys, change, phrase):
    meta = json.loads(json.dumps(files.meta))
    key, field, value = change
    if field is None:
        meta[key] = value
    else:
        meta[key][field] = value
    path = write_npz(copy_run(files, tmp_path / "run") / "checkpoint_0000002.npz", files.state, meta)
    one_error_line(capsys, ["train", "--resume", "--save-dir", str(tmp_path / "run")], str(path), phrase)


@pytest.mark.parametrize("extra", ["adam/m/0", "notes"])
def test_a_compressed_array_of_absurd_size_beside_the_parameters_is_never_read(files, tmp_path, extra):
    """A zip entry may deflate a gigabyte of zeros into a megabyte: an Adam moment larger than any parameter
    is refused from its header, and an entry that is neither a parameter nor a moment is not read at all."""
    from tinyformer.translation.checkpoint import load_checkpoint

    path = tmp_path / "checkpoint_0000000.npz"
    arrays = {f"model/{k}": v for k, v in files.state.items()}
    meta = {**files.meta, "adam": {"has_moment": [True], "step": 1}} if extra.startswith("adam") else files.meta
    np.savez_compressed(path, metadata=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                        **{**arrays, extra: np.zeros(2**28, np.uint8), "adam/v/0": np.zeros(1, np.float32)})
    outcome, seconds, peak = measured(load_checkpoint, path)
    assert peak < PEAK and seconds < QUICK, (peak, seconds)
    if extra == "notes":
        assert extra not in outcome[0] and "adam/m/0" not in str(outcome)
    else:
        assert isinstance(outcome, CheckpointError) and "adam/m/0" in str(outcome)
        assert "more values than any parameter" in str(outcome)
