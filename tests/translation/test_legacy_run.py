"""A run written by an earlier tinyformer (tests/data/legacy_run, made at the commit its
expected.json names by tests/data/make_legacy_run.py) loads, translates and resumes today as it did
then: the same translations, greedy and beam, and the same losses after resuming (those since the
packed rows, whose dropout masks skip the padding: expected.json's "resumed losses from")."""

import json
import shutil
from pathlib import Path

import children
import pytest

from tinyformer.translation.train import Trainer, TrainConfig

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy_run"
EXPECTED = json.loads((LEGACY / "expected.json").read_text(encoding="utf-8"))
CHECKPOINT = LEGACY / "checkpoint_0000150.npz"


@pytest.mark.parametrize("beam", [1, 3])
def test_the_legacy_checkpoint_translates_as_it_did(beam):
    done = children.run(children.tinyformer("translate", "--checkpoint", CHECKPOINT, "--beam", str(beam),
                                            "--input", LEGACY / "sources.txt"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == EXPECTED[f"beam {beam}"]


def test_the_legacy_run_resumes_with_the_same_losses(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LEGACY, run)
    # the run's configuration, as tests/data/make_legacy_run.py wrote it, three steps longer
    config = TrainConfig(vocab_size=120, max_steps=153, save_dir=str(run), eval_every=1000, log_every=1, seed=3,
                         model_overrides={"d_model": 16, "d_ff": 32, "heads": 2, "num_layers": 1})
    Trainer(config, resume=True, progress=False).run()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records if "loss" in r and r.get("step", 0) > 150] == EXPECTED["resumed losses"]
