"""From corpus files to the first training step at WMT 2014 En-De's size (4.5 million pairs).

    python benchmarks/bench_corpus.py --data-dir DIR --work WORKDIR [--pairs 4500000] [--report FILE]

Writes a corpus of ``--pairs`` English-German pairs as plain files (WORKDIR/corpus.en, .de), each
pair two Multi30k training pairs joined (random, seeded: sentences of about WMT's length), then
runs `tinyformer train --train WORKDIR/corpus --src en --tgt de --max-steps 1` twice, each in a
fresh run directory beside a shared ``corpus-cache``, under ``/usr/bin/time -v``: the first run
prepares the corpus (reading, cleaning, the BPE on a sample, encoding into arrays), the second
finds it in the cache. Reports for each: the seconds until the first step's log line, the
command's wall-clock seconds, and its peak resident memory. Targets (issue 27): the first at most
10 minutes with at most 3 GB, the second at most 30 s.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy

from provenance import header

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyformer.translation.data.multi30k import load_multi30k  # noqa: E402


def write_corpus(data_dir, work, pairs, seed=0):
    """``pairs`` pairs, each two Multi30k training pairs joined with a space, into work/corpus.{en,de}."""
    english, german = load_multi30k("train", "en", "de", data_dir=data_dir)
    rng = numpy.random.default_rng(seed)
    with open(work / "corpus.en", "w", encoding="utf-8") as en, open(work / "corpus.de", "w", encoding="utf-8") as de:
        for start in range(0, pairs, 100_000):
            first, second = rng.integers(0, len(english), (2, min(100_000, pairs - start)))
            en.write("".join(f"{english[a]} {english[b]}\n" for a, b in zip(first, second)))
            de.write("".join(f"{german[a]} {german[b]}\n" for a, b in zip(first, second)))


def timed_run(work, name):
    """(seconds until the data is ready, the model line printed just before the first step; seconds
    until the first step's validation line, an upper bound of the first step; wall seconds; peak
    RSS in MiB; output) of one training start."""
    run = work / "runs" / name
    shutil.rmtree(run, ignore_errors=True)
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "tinyformer.cli", "train", "--train",
               str(work / "corpus"), "--src", "en", "--tgt", "de", "--max-steps", "1", "--max-tokens", "2048",
               "--save-dir", str(run), "--no-progress", "--no-test", "--log-every", "1", "--eval-every", "1000",
               "--bleu-samples", "10", "--valid-size", "500"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work)
    ready = first_step = None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if ready is None and line.startswith("model: "):
            ready = time.perf_counter() - start
        if first_step is None and line.startswith("step 1:"):
            first_step = time.perf_counter() - start
    err = process.stderr.read()
    process.wait()
    wall = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"run {name} failed:\n{''.join(lines)}\n{err}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) / 1024
    return ready, first_step, wall, peak, "".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="folder holding multi30k/ (or the files)")
    parser.add_argument("--work", required=True, help="scratch folder for the corpus, the runs and the cache")
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--report", help="append the report (markdown) to this file")
    args = parser.parse_args(argv)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "runs", ignore_errors=True)
    start = time.perf_counter()
    write_corpus(args.data_dir, work, args.pairs)
    written = time.perf_counter() - start
    size = sum((work / f"corpus.{lang}").stat().st_size for lang in ("en", "de")) / 2 ** 20
    rows = []
    for name in ("first", "second"):
        ready, first_step, wall, peak, out = timed_run(work, name)
        rows.append((name, ready, first_step, wall, peak))
        print(out, flush=True)
    lines = [header(f"python benchmarks/bench_corpus.py --pairs {args.pairs}"), "",
             f"Corpus: {args.pairs:,} pairs, {size:,.0f} MiB of plain text (written in {written:.0f} s).", "",
             "| start | data ready (s) | first step validated (s) | command (s) | peak memory (MiB) |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {ready:.1f} | {first:.1f} | {wall:.1f} | {peak:,.0f} |"
              for name, ready, first, wall, peak in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        with open(args.report, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
