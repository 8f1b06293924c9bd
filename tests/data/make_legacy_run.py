"""Writes a small run with the tinyformer of this checkout, kept so that the tests can check that later
code loads, translates and resumes it as this code did (tests/translation/test_legacy_run.py).

Run it only with the tinyformer whose checkpoint format is to be pinned; then commit the folder as
it is. The committed folders: legacy_run, made at commit 6f0884c, before the package was re-rooted
into layer folders, by this script with the imports of that layout (``tinyformer.data.synthetic``,
``tinyformer.train``); run_6ac33d7, made at 6ac33d7, before the model's config became a dataclass
(issue 68). The imports below are today's:

    python tests/data/make_legacy_run.py tests/data/run_<commit>

It trains a 7,488-parameter model for 150 steps on the built-in task (checkpoint, tokenizer),
translates the first 12 test sentences greedily and with beam 3, and resumes a copy of the run
for 3 more steps, recording the losses of those steps.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tinyformer.translation.data.synthetic import synthetic_pairs
from tinyformer.translation.train import Trainer, TrainConfig

STEPS, MORE = 150, 3
MODEL = {"d_model": 16, "d_ff": 32, "heads": 2, "num_layers": 1}


def main(folder):
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    config = TrainConfig(vocab_size=120, max_steps=STEPS, save_dir=str(folder), model_overrides=MODEL,
                         eval_every=1000, log_every=1, seed=3)
    Trainer(config, progress=False).run()
    (folder / "metrics.jsonl").unlink()
    sources = synthetic_pairs("test")[0][:12]
    (folder / "sources.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    checkpoint = folder / f"checkpoint_{STEPS:07d}.npz"
    expected = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True).stdout.strip()}
    for beam in (1, 3):
        expected[f"beam {beam}"] = subprocess.run(
            [sys.executable, "-m", "tinyformer.cli", "translate", "--checkpoint", str(checkpoint), "--beam",
             str(beam), "--input", str(folder / "sources.txt")], capture_output=True, text=True,
            check=True).stdout.splitlines()
    with tempfile.TemporaryDirectory() as scratch:
        resumed = Path(scratch) / "run"
        shutil.copytree(folder, resumed)
        Trainer(TrainConfig.from_dict({**config.to_dict(), "save_dir": str(resumed),
                                       "max_steps": STEPS + MORE}), resume=True, progress=False).run()
        records = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
        expected["resumed losses"] = [r["loss"] for r in records if "loss" in r and r.get("step", 0) > STEPS]
    (folder / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
