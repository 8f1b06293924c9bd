"""One table of a recipe sweep (``benchmarks/recipe_sweep.sh``): each point's validation NLL per seed
and its mean, at the end and along the way.

    python benchmarks/recipe_summary.py WORK [--data multi30k] [--preset small]

A point is every finished tinyformer run of ``bench_quality.py --schedule linear`` in ``WORK/results``
that shares all options but the seed (its file name without the seed). Its facts come from the runs'
records, not from the options: the steps, the warm-up (the step of the highest learning rate) and that
highest rate (below the schedule's nominal peak, lr_factor · d_model^-0.5 · warmup^-0.5, where the
decay runs from the start: at the end of the warm-up it has taken its share already), the dropout, and the target tokens a step (the mean over the run's batches). The validation NLL
is bench_quality's (no label smoothing, dropout off, the whole validation split); "along the way"
gives it at each quarter of the run, the mean over the point's seeds. The rows are ordered by highest rate,
dropout, tokens a step and then the longer warm-up first; "vs first" is a point's mean final NLL
minus the first row's over the same seeds (``--reference TEXT``: the point whose file name contains
TEXT comes first instead).
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def point_runs(folder, data="multi30k", preset="small"):
    """{point name: {seed: record}} of the finished linear-schedule tinyformer runs in ``folder``."""
    folder = Path(folder)
    inside = folder / "results" if (folder / "results").is_dir() else folder
    points = {}
    for path in sorted(inside.glob(f"{data}-{preset}-s*-tinyformer.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("schedule") != "linear" or not record.get("validations"):
            continue
        name = re.sub(r"-s[0-9]+-", "-", path.name, count=1)
        points.setdefault(name, {})[record["model_config"]["seed"]] = record
    return points


def facts(record):
    """steps, warm-up, highest learning rate, dropout and mean target tokens a step of one run."""
    lrs = record["lrs"]
    peak = max(lrs)
    steps = len(lrs)
    return {"steps": steps, "warmup": lrs.index(peak) + 1, "peak": peak,
            "dropout": record["model_config"]["dropout"], "tokens": record["target_tokens"] / steps}


def nll_at(record, step):
    """The validation NLL of the validation at ``step`` (None where there is none)."""
    return next((nll for at, _, nll in record["validations"] if at == step), None)


def summary(points, reference=None):
    """Markdown: the final validation NLL per seed and its mean per point, and its mean along the way."""
    rows = [(name, runs, facts(next(iter(runs.values())))) for name, runs in points.items()]
    rows.sort(key=lambda row: (row[2]["peak"], row[2]["dropout"], row[2]["tokens"], -row[2]["warmup"]))
    if reference is not None:
        chosen = [row for row in rows if reference in row[0]]
        if not chosen:
            raise ValueError(f"--reference {reference!r}: no point's file name contains it")
        rows.remove(chosen[0])
        rows.insert(0, chosen[0])
    seeds = sorted({seed for _, runs, _ in rows for seed in runs})
    first = rows[0][1]
    header = (["steps", "warm-up", "highest lr", "dropout", "target tokens a step"]
              + [f"seed {s}" for s in seeds] + ["mean", "vs first (same seeds)", "median step s"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    curve = ["| steps | warm-up | highest lr | dropout | target tokens a step | 1/4 | 1/2 | 3/4 | end |",
             "|" + "---:|" * 9]
    for name, runs, f in rows:
        final = {seed: record["validations"][-1][2] for seed, record in runs.items()}
        common = sorted(set(final) & set(first))
        versus = ""
        if runs is not first and common:
            difference = (statistics.fmean(final[s] for s in common)
                          - statistics.fmean(first[s]["validations"][-1][2] for s in common))
            versus = f"{difference:+.4f}"
        step_s = statistics.fmean(statistics.median(record["seconds"]) for record in runs.values())
        described = [str(f["steps"]), str(f["warmup"]), f"{f['peak']:.3g}", f"{f['dropout']:g}",
                     f"{f['tokens']:,.0f}"]
        per_seed = [f"{final[s]:.4f}" if s in final else "" for s in seeds]
        mean = f"**{statistics.fmean(final.values()):.4f}**"
        lines.append("| " + " | ".join(described + per_seed + [mean, versus, f"{step_s:.3f}"]) + " |")
        along = []
        for quarter in (1, 2, 3, 4):
            values = [nll_at(record, f["steps"] * quarter // 4) for record in runs.values()]
            values = [v for v in values if v is not None]
            along.append(f"{statistics.fmean(values):.4f}" if values else "")
        curve.append("| " + " | ".join(described + along) + " |")
    return ("\n".join(lines) + "\n\nThe mean validation NLL along the way (each quarter of the run):\n\n"
            + "\n".join(curve) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", metavar="WORK", help="recipe_sweep.sh's WORK (bench_quality.py --work)")
    parser.add_argument("--data", default="multi30k")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--reference", help="the point to compare the others with: one whose file name contains this")
    args = parser.parse_args(argv)
    if not Path(args.folder).is_dir():
        parser.error(f"{args.folder}: no such folder")
    points = point_runs(args.folder, args.data, args.preset)
    if not points:
        parser.error(f"{args.folder}: no finished run of bench_quality.py --schedule linear "
                     f"for {args.data} {args.preset}")
    try:
        sys.stdout.write(summary(points, args.reference))
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
