"""How far bf16 and fp16 training drift from fp32 on the CPU, against how far fp32 drifts from
itself: the manual's figures (docs/mixed-precision.md), measured.

The runs of tests/translation/train/test_precision.py, as the command line makes them: `tiny` on the built-in
task, 150 steps of 256 target tokens. For each seed: fp32, bf16 and fp16 (same model, batches and
dropout), and the control, fp32 *nudged*: the same run with every initial weight moved by one unit
in the last place (up or down at random), which is how far apart rounding alone sets two runs.

Prints, for seed 0, the mean relative difference of each run's first 10 losses from fp32's
(against the format's unit roundoff) and the largest relative gap of its 25-step window means.
With ``--seeds N`` (N ≥ 2), over the seeds: each run's last window against fp32's (the mean and
standard error of the log ratio, the spread of each window) and against the nudged control's
from the same seed (the paired difference: a precision that learns less than fp32 shows here,
beyond what rounding alone does), and fp32 against fp32 from the next seed. Markdown, with
command, date, commit and machine.

    python benchmarks/precision_drift.py [--steps 150] [--seeds 1] [--jobs 1]
"""

import argparse
import contextlib
import io
import json
import multiprocessing
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import provenance  # noqa: E402
from tinyformer import cli  # noqa: E402
from tinyformer.translation.train import builders  # noqa: E402

WINDOW, EARLY = 25, 10
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
# (name, precision, nudged): the runs made for every seed.
RUNS = (("fp32", "fp32", False), ("fp32 nudged", "fp32", True), ("bf16", "bf16", False), ("fp16", "fp16", False))
HALVES = ("bf16", "fp16")


def nudged_build_model(build_model):
    """``build_model`` whose model has every initial weight one ulp up or down (a fixed random
    direction per element), the rest of the run unchanged."""
    def build(config, tokenizer, rank=0):
        model = build_model(config, tokenizer, rank)
        directions = np.random.default_rng(2 ** 31 + config.seed)
        for parameter in model.parameters():
            data = parameter.data
            up = directions.random(data.shape) < 0.5
            data[...] = np.nextafter(data, np.where(up, np.inf, -np.inf).astype(data.dtype))
        return model
    return build


def train(save_dir, precision, steps, seed, nudged=False):
    """The training losses of one run (fp16 overflow records have none)."""
    build_model = builders.build_model
    if nudged:
        builders.build_model = nudged_build_model(build_model)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli.main(["train", "--precision", precision, "--save-dir", str(save_dir), "--max-steps", str(steps),
                             "--max-tokens", "256", "--vocab-size", "120", "--warmup-steps", "30", "--log-every", "1",
                             "--eval-every", "100000", "--save-every", "100000", "--bleu-samples", "8", "--no-test",
                             "--no-progress", "--seed", str(seed)])
    finally:
        builders.build_model = build_model
    if code != 0:
        raise SystemExit(f"precision_drift: training in {precision} (seed {seed}) failed (exit {code})")
    with open(Path(save_dir) / "metrics.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in records if "split" not in r and "skipped" not in r]


def train_seed(job):
    """All RUNS of one seed: {name: losses}."""
    directory, steps, seed = job
    return {name: train(Path(directory) / f"{name.replace(' ', '-')}-{seed}", precision, steps, seed, nudged)
            for name, precision, nudged in RUNS}


def windows(values):
    return np.array([np.mean(values[i:i + WINDOW]) for i in range(0, len(values), WINDOW)])


def window_gaps(curve, reference):
    """|a − b| / b of each window mean."""
    a, b = windows(curve), windows(reference)
    return np.abs(a - b) / b


def seed_zero_table(runs):
    fp32 = np.array(runs["fp32"])
    lines = ["| run | mean relative difference of the first 10 losses from fp32's | unit roundoff | "
             "largest gap of the 25-step window means |", "|---|---|---|---|"]
    for name in ("fp32 nudged", *HALVES):
        early = float(np.mean(np.abs(np.array(runs[name][:EARLY]) - fp32[:EARLY]) / fp32[:EARLY]))
        roundoff = f"{UNIT_ROUNDOFF[name]:.1e}" if name in UNIT_ROUNDOFF else ""
        lines.append(f"| {name} | {early:.1e} | {roundoff} | {window_gaps(runs[name], fp32).max():.1%} |")
    return lines


def over_seeds_table(per_seed):
    """Rows over the seeds: the last window's log ratio against fp32 and against the nudged
    control (mean ± standard error), each window's spread, and the largest window gap."""
    last = {name: np.log(np.array([windows(runs[name])[-1] for runs in per_seed])) for name, _, _ in RUNS}
    spread = {name: np.std([windows(runs[name]) / windows(runs["fp32"]) - 1 for runs in per_seed], axis=0, ddof=1)
              for name, _, _ in RUNS}
    largest = {name: np.array([window_gaps(runs[name], runs["fp32"]).max() for runs in per_seed])
               for name, _, _ in RUNS}
    n = len(per_seed)

    def mean_se(x):
        return f"{x.mean():+.2%} ± {x.std(ddof=1) / np.sqrt(len(x)):.2%}"

    lines = [f"| run | last window against fp32's (log ratio, mean ± SE, {n} seeds) | against the nudged fp32's, "
             "paired | spread of each window against fp32's (sd) | largest window gap: median, 95th "
             "percentile, largest |", "|---|---|---|---|---|"]
    for name in ("fp32 nudged", *HALVES):
        paired = "" if name == "fp32 nudged" else mean_se(last[name] - last["fp32 nudged"])
        lines.append(f"| {name} | {mean_se(last[name] - last['fp32'])} | {paired} | "
                     f"{' '.join(f'{s:.1%}' for s in spread[name])} | {np.median(largest[name]):.1%}, "
                     f"{np.percentile(largest[name], 95):.1%}, {largest[name].max():.1%} |")
    nexts = [(a["fp32"], b["fp32"]) for a, b in zip(per_seed, per_seed[1:])]
    next_last = np.array([np.log(windows(b)[-1] / windows(a)[-1]) for a, b in nexts])
    next_largest = np.array([window_gaps(b, a).max() for a, b in nexts])
    next_spread = np.std([windows(b) / windows(a) - 1 for a, b in nexts], axis=0, ddof=1)
    lines.append(f"| fp32, the next seed | {mean_se(next_last)} | | {' '.join(f'{s:.1%}' for s in next_spread)} | "
                 f"{np.median(next_largest):.1%}, {np.percentile(next_largest, 95):.1%}, {next_largest.max():.1%} |")
    falls = np.array([1 - windows(runs["fp32"])[-1] / windows(runs["fp32"])[0] for runs in per_seed])
    lines.append(f"\nfp32's window mean falls from the first window to the last by {np.median(falls):.1%} "
                 f"(median over the seeds; {falls.min():.1%} to {falls.max():.1%}).")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 to N-1 (the tables over seeds need N >= 2)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at the same time (one process each)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be at least 1")
    print(provenance.header(f"python benchmarks/precision_drift.py --steps {args.steps} --seeds {args.seeds} "
                            f"--jobs {args.jobs}") + "\n")
    with tempfile.TemporaryDirectory() as directory:
        jobs = [(directory, args.steps, seed) for seed in range(args.seeds)]
        if args.jobs == 1:
            per_seed = [train_seed(job) for job in jobs]
        else:
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                per_seed = pool.map(train_seed, jobs, chunksize=1)
    print("Seed 0:\n")
    print("\n".join(seed_zero_table(per_seed[0])))
    fall = 1 - windows(per_seed[0]["fp32"])[-1] / windows(per_seed[0]["fp32"])[0]
    print(f"\nfp32's window mean falls by {fall:.1%} from the first window to the last.")
    if args.seeds >= 2:
        print(f"\nOver seeds 0-{args.seeds - 1}:\n")
        print("\n".join(over_seeds_table(per_seed)))


if __name__ == "__main__":
    main()
