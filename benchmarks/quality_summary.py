"""One table of every finished ``bench_quality.py`` run in a work folder: BLEU per seed and its mean
for each configuration, against stock PyTorch on the same seeds.

    python benchmarks/quality_summary.py WORK [--steps 800] [--data multi30k] [--preset small]

A configuration is an engine and its extras (``none`` is the paper's model; PyTorch's ``all`` is stock
``nn.Transformer``). Each run's result file (WORK/results/*.json, written by ``bench_quality.py``)
gives its seed (its model's), its BLEU on the test set, its per-step losses and step times. A row's
mean is over the seeds it has; "vs PyTorch" is that mean minus stock PyTorch's mean over the same
seeds (blank where PyTorch has none of them). Runs of ``--equal-init`` and unscored runs are left out.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ENGINE_NAMES = {"tinyformer": "tinyformer", "torch": "PyTorch", "tinyformer (init + 1 ulp)": "control"}
STOCK_TORCH = ("torch", "activation-dropout,attention-dropout,final-norm,torch-init")


def load_runs(work, steps=None, data="multi30k", preset="small"):
    """The scored runs of ``work``/results with ``steps`` steps (any where None), as dicts with
    engine, extras (comma-joined, sorted), seed, steps, bleu, last-window loss and median step s."""
    runs = []
    for path in sorted(Path(work, "results").glob(f"{data}-{preset}-*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        if result.get("equal_init") or "bleu" not in result:
            continue
        if steps is not None and len(result["losses"]) != steps:
            continue
        losses = result["losses"]
        runs.append({"engine": result["engine"], "extras": ",".join(sorted(result["extras"])) or "none",
                     "seed": result["model_config"]["seed"], "steps": len(losses), "bleu": result["bleu"],
                     "loss": statistics.fmean(losses[-100:]), "step_s": statistics.median(result["seconds"]),
                     "file": path.name})
    return runs


def summary(runs):
    """Markdown: one row per (engine, extras), a column per seed, the mean, and the mean minus
    stock PyTorch's over the same seeds."""
    seeds = sorted({r["seed"] for r in runs})
    configs = {}
    for r in runs:
        configs.setdefault((r["engine"], r["extras"]), {})[r["seed"]] = r
    torch = configs.get(STOCK_TORCH, {})
    header = (["engine", "extras"] + [f"seed {s}" for s in seeds]
              + ["mean BLEU", "vs PyTorch, same seeds", "mean loss, last 100 steps", "median step s (mean over seeds)"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    order = sorted(configs, key=lambda c: (c != STOCK_TORCH, c[0] != "tinyformer", c[1] != "none", c[1]))
    for config in order:
        by_seed = configs[config]
        row = [ENGINE_NAMES.get(config[0], config[0]), config[1]]
        row += [f"{by_seed[s]['bleu']:.2f}" if s in by_seed else "" for s in seeds]
        mean = statistics.fmean(r["bleu"] for r in by_seed.values())
        common = sorted(set(by_seed) & set(torch))
        versus = ""
        if common and config != STOCK_TORCH:
            difference = (statistics.fmean(by_seed[s]["bleu"] for s in common)
                          - statistics.fmean(torch[s]["bleu"] for s in common))
            versus = f"{difference:+.2f} ({len(common)} seed{'s' if len(common) > 1 else ''})"
        row += [f"**{mean:.2f}**", versus, f"{statistics.fmean(r['loss'] for r in by_seed.values()):.4f}",
                f"{statistics.fmean(r['step_s'] for r in by_seed.values()):.3f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", help="bench_quality.py's --work folder")
    parser.add_argument("--steps", type=int, help="only runs of this many steps (default: all)")
    parser.add_argument("--data", default="multi30k")
    parser.add_argument("--preset", default="small")
    args = parser.parse_args(argv)
    if not Path(args.work, "results").is_dir():
        parser.error(f"{args.work}: no results/ folder (not a bench_quality.py --work folder)")
    runs = load_runs(args.work, args.steps, args.data, args.preset)
    if not runs:
        parser.error(f"{args.work}: no scored run" + (f" of {args.steps} steps" if args.steps else ""))
    sys.stdout.write(summary(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
