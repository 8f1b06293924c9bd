"""Runs written by earlier tinyformers load, translate and resume today as they did then: the same
translations, greedy and beam, and the same losses after resuming. Each folder was made by
tests/data/make_legacy_run.py at the commit its expected.json names: ``legacy_run`` before the
package was re-rooted into layer folders (6f0884c), ``run_6ac33d7`` before the model's config became
a dataclass and the hubs were split (issue 68)."""

import json
import shutil
from pathlib import Path

import children
import pytest

from tinyformer.translation.train import Trainer, TrainConfig

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = ["legacy_run", "run_6ac33d7"]


def expected(name):
    return json.loads((DATA / name / "expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.parametrize("beam", [1, 3])
def test_the_legacy_checkpoint_translates_as_it_did(name, beam):
    run = DATA / name
    done = children.run(children.tinyformer("translate", "--checkpoint", run / "checkpoint_0000150.npz", "--beam",
                                            str(beam), "--input", run / "sources.txt"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected(name)[f"beam {beam}"]


@pytest.mark.parametrize("name", RUNS)
def test_the_legacy_run_resumes_with_the_same_losses(name, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DATA / name, run)
    # the run's configuration, as tests/data/make_legacy_run.py wrote it, three steps longer
    config = TrainConfig(vocab_size=120, max_steps=153, save_dir=str(run), eval_every=1000, log_every=1, seed=3,
                         model_overrides={"d_model": 16, "d_ff": 32, "heads": 2, "num_layers": 1})
    Trainer(config, resume=True, progress=False).run()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records if "loss" in r and r.get("step", 0) > 150] == expected(name)["resumed losses"]
