"""One table of every finished ``bench_quality.py`` run in one or more folders: BLEU per seed and its
mean for each configuration, against stock PyTorch on the same seeds, with the validation NLL.

    python benchmarks/quality_summary.py WORK [MORE ...] [--steps 800] [--data multi30k] [--preset small]
    python benchmarks/quality_summary.py WORK --keep benchmarks/results/quality-runs
    python benchmarks/quality_summary.py WORK --steps 3000 --bootstrap

A configuration is an engine and its extras (``none`` is the paper's model; PyTorch's ``all`` is stock
``nn.Transformer``). Each run's result file (``WORK/results/*.json``, written by ``bench_quality.py``,
or the files of a folder of kept records) gives its seed (its model's), its BLEU on the test set, its
per-step losses and step times and, since the validation loss was added, its NLL per token on the
validation split. A row's mean is over the seeds it has; "vs PyTorch" is that mean minus stock PyTorch's
mean over the same seeds (blank where PyTorch has none of them). Runs of ``--equal-init`` and unscored
runs are left out. Where two folders hold the same run (configuration, seed, steps), the later folder's wins.

``--bootstrap`` adds a table of each run beside stock PyTorch's run of the same seed and steps (both
read with their hypotheses, so from work folders, not kept records): the BLEU difference and sacreBLEU's
paired bootstrap p-value (two-sided, 1,000 resamples of the test sentences). It measures how much the
difference could be the test set's sampling alone; the spread between training seeds is not in it.

``--keep DIR`` writes each run read, without its hypotheses, into DIR (``benchmarks/results/quality-runs``
is the project's record: the work folders of the machines that trained them do not last). A kept
record made from a report in ``results/quality.md`` rather than from a result file carries
``from_report`` and, instead of per-step values, the mean loss of its last 100 steps and its median step.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ENGINE_NAMES = {"tinyformer": "tinyformer", "torch": "PyTorch", "tinyformer (init + 1 ulp)": "control"}
STOCK_TORCH = ("torch", "activation-dropout,attention-dropout,final-norm,torch-init")


def result_files(folder, data="multi30k", preset="small"):
    """The result files of ``folder``: its results/ (a --work folder) or, without one, its own files."""
    folder = Path(folder)
    inside = folder / "results" if (folder / "results").is_dir() else folder
    return sorted(inside.glob(f"{data}-{preset}-*.json"))


def run_of(result, name):
    """A scored result as one row's facts, or None for an --equal-init or unscored run."""
    if result.get("equal_init") or "bleu" not in result:
        return None
    losses = result.get("losses")
    if losses is None:  # a record made from a report: its figures, no per-step values
        steps, loss, step_s = result["steps"], result["loss_last_100"], result["median_step_s"]
    else:
        steps, loss, step_s = len(losses), statistics.fmean(losses[-100:]), statistics.median(result["seconds"])
    return {"engine": result["engine"], "extras": ",".join(sorted(result["extras"])) or "none",
            "seed": result["model_config"]["seed"], "steps": steps, "bleu": result["bleu"], "loss": loss,
            "step_s": step_s, "valid_nll": result.get("valid_nll"), "file": name, "result": result}


def load_runs(folders, steps=None, data="multi30k", preset="small"):
    """The scored runs of ``folders`` (one folder or several) with ``steps`` steps (any where None),
    as dicts with engine, extras (comma-joined, sorted), seed, steps, bleu, last-window loss, median
    step s and validation NLL (None where not measured); a run in a later folder replaces the same run
    in an earlier one."""
    folders = [folders] if isinstance(folders, (str, Path)) else list(folders)
    runs = {}
    for folder in folders:
        for path in result_files(folder, data, preset):
            run = run_of(json.loads(path.read_text(encoding="utf-8")), path.name)
            if run is not None and (steps is None or run["steps"] == steps):
                runs[(run["engine"], run["extras"], run["seed"], run["steps"])] = run
    return list(runs.values())


def keep(runs, folder):
    """Each run's result, without its hypotheses, as a JSON file in ``folder``; the names written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for run in runs:
        record = {k: v for k, v in run["result"].items() if k != "hypotheses"}
        (folder / run["file"]).write_text(json.dumps(record) + "\n", encoding="utf-8")
        written.append(run["file"])
    return written


def summary(runs):
    """Markdown: one row per (engine, extras), a column per seed, the mean, the mean minus stock
    PyTorch's over the same seeds, and the mean validation NLL over the seeds that have one."""
    seeds = sorted({r["seed"] for r in runs})
    configs = {}
    for r in runs:
        configs.setdefault((r["engine"], r["extras"]), {})[r["seed"]] = r
    torch = configs.get(STOCK_TORCH, {})
    header = (["engine", "extras"] + [f"seed {s}" for s in seeds]
              + ["mean BLEU", "vs PyTorch, same seeds", "validation NLL (mean)", "mean loss, last 100 steps",
                 "median step s (mean over seeds)"])
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
        nlls = [r["valid_nll"] for r in by_seed.values() if r["valid_nll"] is not None]
        nll = f"{statistics.fmean(nlls):.4f}" if nlls else ""
        if nlls and len(nlls) < len(by_seed):
            nll += f" ({len(nlls)} of {len(by_seed)} seeds)"
        row += [f"**{mean:.2f}**", versus, nll, f"{statistics.fmean(r['loss'] for r in by_seed.values()):.4f}",
                f"{statistics.fmean(r['step_s'] for r in by_seed.values()):.3f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def bootstrap(runs, references, samples=1000):
    """Markdown: one row per run that has stock PyTorch's run of the same seed and steps beside it,
    both with hypotheses for every reference: BLEU, PyTorch's, the difference and sacreBLEU's paired
    bootstrap p-value (``PairedTest``, test_type "bs": two-sided, ``samples`` resamples, its seed); none
    where the two scores are equal."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    def hypotheses(run):
        found = run["result"].get("hypotheses")
        return found if found is not None and len(found) == len(references) else None

    torch = {(r["seed"], r["steps"]): r for r in runs if (r["engine"], r["extras"]) == STOCK_TORCH}
    lines = ["| engine | extras | seed | steps | BLEU | stock PyTorch | difference | p (paired bootstrap) |",
             "|" + "---|" * 8]
    for run in sorted(runs, key=lambda r: (r["steps"], r["seed"], r["engine"] != "tinyformer", r["extras"])):
        baseline = torch.get((run["seed"], run["steps"]))
        if baseline is None or baseline is run:
            continue
        pair = hypotheses(baseline), hypotheses(run)
        if None in pair:
            continue
        test = PairedTest([("PyTorch", pair[0]), ("run", pair[1])], {"BLEU": BLEU()},
                          [list(references)], test_type="bs", n_samples=samples)
        theirs, ours = test()[1]["BLEU"]
        # sacreBLEU gives the smallest p to a difference of exactly 0 (identical translations); none is shown
        p = f"{ours.p_value:.3f}" if ours.score != theirs.score else "—"
        lines.append(f"| {ENGINE_NAMES.get(run['engine'], run['engine'])} | {run['extras']} | {run['seed']} | "
                     f"{run['steps']} | {ours.score:.2f} | {theirs.score:.2f} | {ours.score - theirs.score:+.2f} | "
                     f"{p} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def reference_lines(data, src, tgt, data_dir=None):
    """The test split's target lines, as bench_quality.py scores them."""
    from tinyformer.translation.train import TrainConfig
    from tinyformer.translation.train.builders import load_corpus

    return load_corpus(TrainConfig(data=data, src_lang=src, tgt_lang=tgt, data_dir=data_dir).resolved(), "test")[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", metavar="WORK",
                        help="bench_quality.py --work folders, or folders of kept records (later ones win)")
    parser.add_argument("--steps", type=int, help="only runs of this many steps (default: all)")
    parser.add_argument("--data", default="multi30k")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--keep", metavar="DIR", help="also write each run read, without its hypotheses, into DIR")
    parser.add_argument("--bootstrap", action="store_true", help="also each run against stock PyTorch on its "
                        "seed: the difference and sacreBLEU's paired bootstrap p-value (needs the hypotheses)")
    parser.add_argument("--src", default="en", help="source language of the runs (for --bootstrap's references)")
    parser.add_argument("--tgt", default="de", help="target language of the runs (for --bootstrap's references)")
    parser.add_argument("--data-dir", help="folder holding multi30k/ (default: $TINYFORMER_DATA)")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not Path(folder).is_dir():
            parser.error(f"{folder}: no such folder")
    runs = load_runs(args.folders, args.steps, args.data, args.preset)
    if not runs:
        parser.error(f"{', '.join(args.folders)}: no scored run" + (f" of {args.steps} steps" if args.steps else ""))
    if args.keep:
        for name in keep(runs, args.keep):
            print(f"kept {Path(args.keep) / name}", file=sys.stderr)
    sys.stdout.write(summary(runs))
    if args.bootstrap:
        table = bootstrap(runs, reference_lines(args.data, args.src, args.tgt, args.data_dir))
        sys.stdout.write("\n" + (table or "(--bootstrap: no run has stock PyTorch's of its seed and steps beside it "
                                          "with hypotheses)\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
