"""tinyformer export: a checkpoint's model as safetensors (translation/weights.py, cli/export.py), read
back by translate as the checkpoint itself; the file is plain safetensors that the package reads."""

import json
import shutil
from pathlib import Path

import children
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tinyformer.translation import checkpoint
from tinyformer.translation.checkpoint import CheckpointError
from tinyformer.translation.train import load_model
from tinyformer.translation.train.migration import migrate
from tinyformer.translation.weights import load_safetensors

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy_run"
EXPECTED = json.loads((LEGACY / "expected.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    run = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(LEGACY, run)
    done = children.run(children.tinyformer("export", run))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {run / 'checkpoint_0000150.safetensors'} (")
    return run / "checkpoint_0000150.safetensors"


@pytest.mark.parametrize("beam", [1, 3])
def test_the_exported_model_translates_as_the_checkpoint(exported, beam):
    done = children.run(children.tinyformer("translate", "--checkpoint", exported, "--beam", str(beam),
                                            "--input", LEGACY / "sources.txt"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == EXPECTED[f"beam {beam}"]


def test_the_file_is_plain_safetensors_with_the_model_config_in_its_metadata(exported):
    state, meta, _ = checkpoint.load_checkpoint(exported.with_suffix(".npz"))
    tensors = load_file(str(exported))
    assert set(tensors) == set(state)
    for name, value in state.items():
        np.testing.assert_array_equal(tensors[name], value)
    _, written = load_safetensors(exported)
    assert written["model_config"] == migrate(meta, "c")["model_config"]
    assert written["tokenizer_sha256"] == meta["tokenizer_sha256"] and "adam" not in written
    model, _, _ = load_model(exported)
    reference, _, _ = load_model(exported.with_suffix(".npz"))
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_a_safetensors_file_not_written_by_tinyformer_is_refused_by_name(tmp_path):
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(foreign))
    with pytest.raises(CheckpointError, match=f"{foreign} is a safetensors file without tinyformer's metadata"):
        load_model(foreign)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    done = children.run(children.tinyformer("translate", "--checkpoint", broken), input="a\n")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert f"cannot read {broken} as safetensors" in done.stderr


def test_bad_export_arguments_are_one_line_and_write_nothing(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LEGACY, run)
    before = sorted(p.name for p in run.iterdir())
    wrong = children.run(children.tinyformer("export", run, "--output", tmp_path / "model.bin"))
    assert wrong.returncode == 2 and "--output" in wrong.stderr and ".safetensors" in wrong.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = children.run(children.tinyformer("export", empty))
    assert missing.returncode == 1 and f"no checkpoint_*.npz in {empty}" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == before and list(empty.iterdir()) == []
