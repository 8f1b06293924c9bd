"""An hour of the CPU (issue 49): `tinyformer train --recipe hour` from a fresh run directory, timed whole.

    python benchmarks/bench_hour.py --seed 0 [--work runs/bench-hour] [--report FILE] [-- TRAIN FLAGS...]

Runs ``tinyformer train --data multi30k --recipe hour --seed S --save-dir WORK/seed-S`` (the folder
removed first, so the BPE is trained again) as a child process and measures its wall time: the BPE
and data, training, the averaging, the averaged model's validation and the test decoding (beam 4)
all included. Flags after ``--`` are passed to ``tinyformer train`` (a variant of the recipe: given
flags win over the recipe's). The report gives the test BLEU, the steps trained, every validation
(step, minutes left, loss, NLL, greedy BLEU), the averaged model's validation, the test decoding's
seconds and the load average before and after; ``--report FILE`` appends it (markdown) with the
command, date, commit and machine.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402  (benchmarks/ is not a package)

TARGET_BLEU, TARGET_MINUTES = 36.0, 60.0


def train_command(seed, save_dir, extra):
    return [sys.executable, "-u", "-m", "tinyformer.cli", "train", "--data", "multi30k", "--recipe", "hour",
            "--seed", str(seed), "--save-dir", str(save_dir), "--no-progress", *extra]


def run(command, log_path):
    """Run ``command``, its output to the terminal and ``log_path`` with each line's seconds since
    the start; returns (wall seconds, [(seconds, line)], exit status)."""
    start, lines = time.monotonic(), []
    with open(log_path, "w") as log, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      text=True, bufsize=1) as child:
        for line in child.stdout:
            at = time.monotonic() - start
            lines.append((at, line.rstrip("\n")))
            log.write(f"{at:8.1f} {line}")
            print(f"{at:8.1f} {line}", end="", flush=True)
    return time.monotonic() - start, lines, child.returncode


def parse(lines, save_dir):
    """What the run printed and logged: test BLEU, steps and minutes trained, the test decoding's
    seconds, and the validation records of metrics.jsonl."""
    found = {"bleu": None, "steps": None, "train_minutes": None, "decode_s": None}
    test_started = None
    for at, line in lines:
        if m := re.match(r"trained (\d+) steps in ([\d.]+) min", line):
            found["steps"], found["train_minutes"] = int(m[1]), float(m[2])
        elif line.startswith("test, averaged") or line.startswith("checkpoints, tokenizer"):
            test_started = at
        elif m := re.match(r"test: BLEU ([\d.]+)", line):
            found["bleu"] = float(m[1])
            found["decode_s"] = None if test_started is None else round(at - test_started, 1)
    metrics = Path(save_dir) / "metrics.jsonl"
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    found["validations"] = [r for r in records if r.get("split") == "val"]
    found["minutes_left"] = {r["step"]: r.get("minutes_left") for r in records if "minutes_left" in r}
    return found


def load_average():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(args, wall, found, status, loads):
    head = provenance.header(" ".join(["python benchmarks/bench_hour.py", *map(shlex.quote, sys.argv[1:])]))
    out = [f"## `tinyformer train --data multi30k --recipe hour`, seed {args.seed}"
           + (f", with {' '.join(args.extra)}" if args.extra else ""), "", head + ".", "",
           f"Load average before {loads[0]}, after {loads[1]}; exit status {status}.", ""]
    bleu, minutes = found["bleu"], wall / 60
    out += ["| seed | wall min (all) | training min | steps | test BLEU (beam 4, averaged) | test decoding s |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {args.seed} | {minutes:.1f} | {found['train_minutes']} | {found['steps']} | "
            f"**{bleu if bleu is not None else 'n/a'}** | {found['decode_s']} |", ""]
    out += ["| step | averaged | val loss | val NLL | greedy BLEU (500) |", "|---:|---|---:|---:|---:|"]
    for r in found["validations"]:
        out.append(f"| {r['step']} | {r.get('averaged', '')} | {r['loss']} | {r['nll']} | {r['bleu_greedy']} |")
    met = bleu is not None and bleu >= TARGET_BLEU and minutes <= TARGET_MINUTES
    out += ["", f"Target ≥ {TARGET_BLEU:g} BLEU within {TARGET_MINUTES:g} min: "
                f"{'met' if met else 'not met'} ({bleu} BLEU in {minutes:.1f} min).", ""]
    return "\n".join(out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=os.path.join("runs", "bench-hour"))
    parser.add_argument("--report", help="append the markdown report to this file")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    save_dir = Path(args.work) / (f"seed-{args.seed}" + ("-" + "-".join(a.lstrip("-") for a in extra) if extra else ""))
    shutil.rmtree(save_dir, ignore_errors=True)
    save_dir.mkdir(parents=True)
    loads = [load_average()]
    wall, lines, status = run(train_command(args.seed, save_dir, extra), save_dir.parent / f"{save_dir.name}.log")
    loads.append(load_average())
    text = report(args, wall, parse(lines, save_dir), status, loads)
    print(text)
    if args.report:
        with open(args.report, "a") as f:
            f.write("\n" + text)
    return status


if __name__ == "__main__":
    sys.exit(main())
