"""How far bf16 and fp16 training drift from fp32 on the CPU: the manual's figures
(docs/mixed-precision.md), measured.

The runs of tests/test_train_precision.py, as the command line makes them: `tiny` on the built-in
task, 150 steps of 256 target tokens, seed 0 in fp32, bf16 and fp16, and fp32 again from seed 1.
Prints, for each half precision, the mean relative difference of its first 10 losses from fp32's
(against the format's unit roundoff) and the largest relative gap of its 25-step window means; and
the largest gap between the two fp32 seeds (the test's band). Markdown, with command, date,
commit and machine.

    python benchmarks/precision_drift.py [--steps 150]
"""

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import provenance  # noqa: E402
from tinyformer import cli  # noqa: E402

WINDOW, EARLY = 25, 10
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def train(save_dir, precision, steps, seed):
    """The training losses of one run (fp16 overflow records have none)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["train", "--precision", precision, "--save-dir", str(save_dir), "--max-steps", str(steps),
                         "--max-tokens", "256", "--vocab-size", "120", "--warmup-steps", "30", "--log-every", "1",
                         "--eval-every", "100000", "--save-every", "100000", "--bleu-samples", "8", "--no-test",
                         "--no-progress", "--seed", str(seed)])
    if code != 0:
        raise SystemExit(f"precision_drift: training in {precision} failed (exit {code})")
    with open(Path(save_dir) / "metrics.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in records if "split" not in r and "skipped" not in r]


def windows(values):
    return np.array([np.mean(values[i:i + WINDOW]) for i in range(0, len(values), WINDOW)])


def largest_window_gap(curve, reference):
    a, b = windows(curve), windows(reference)
    return float(np.max(np.abs(a - b) / b))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args(argv)
    print(provenance.header(f"python benchmarks/precision_drift.py --steps {args.steps}") + "\n")
    with tempfile.TemporaryDirectory() as directory:
        runs = {name: train(Path(directory) / name, precision, args.steps, seed)
                for name, precision, seed in (("fp32", "fp32", 0), ("fp32-seed1", "fp32", 1),
                                              ("bf16", "bf16", 0), ("fp16", "fp16", 0))}
    fp32 = np.array(runs["fp32"])
    print("| run | mean relative difference of the first 10 losses from fp32's | unit roundoff | "
          "largest gap of the 25-step window means |\n|---|---|---|---|")
    for name in ("bf16", "fp16"):
        early = float(np.mean(np.abs(np.array(runs[name][:EARLY]) - fp32[:EARLY]) / fp32[:EARLY]))
        print(f"| {name} | {early:.1e} | {UNIT_ROUNDOFF[name]:.1e} | {largest_window_gap(runs[name], fp32):.1%} |")
    print(f"| fp32, seed 1 | | | {largest_window_gap(runs['fp32-seed1'], fp32):.1%} (the test's band) |")
    fall = 1 - windows(fp32)[-1] / windows(fp32)[0]
    print(f"\nfp32's window mean falls by {fall:.1%} from the first window to the last.")


if __name__ == "__main__":
    main()
