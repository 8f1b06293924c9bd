"""Size and time of `tinyformer explain` pages: the manual's figures (docs/attention.md), measured.

Cases (each a fresh, untrained checkpoint built as `tinyformer train` builds it, unless
``--checkpoint`` names one; the page's size and plumbing do not depend on training):

- ``small-30``: `small` on Multi30k (its 8k BPE), the first test sentence of 30 BPE tokens, taught
  its reference (needs ``TINYFORMER_DATA``);
- ``small-128``: `small` on Multi30k, a 128-token source and target (the training sources' words);
- ``tiny-128``: `tiny` on the built-in task, a 128-token source and target;
- ``small-30-steps``: the sentence of ``small-30`` across five checkpoints of one `small` run on
  Multi30k (trained one step each: the size does not depend on training), `tinyformer explain
  --checkpoints`, the page with a step slider.

For each: the page's size, the seconds `tinyformer explain` takes (Python, in this process), and,
where headless Chromium is on the PATH, the seconds Chromium takes to load, draw and self-test it
(`--dump-dom`), the page's first paint, the time its panels are drawn, its scripts' time with
the self-test, and the self-test's verdict. Prints a Markdown report
with the command, date, commit and machine.

    python benchmarks/bench_explain.py [--cases small-30,small-128,tiny-128] [--checkpoint PATH]
"""

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import provenance  # noqa: E402
from tinyformer.translation import checkpoint
from tinyformer import cli  # noqa: E402
from tinyformer.translation.data.tokenizer import Tokenizer  # noqa: E402
from tinyformer.translation.train import TrainConfig  # noqa: E402
from tinyformer.translation.train.builders import build_model, build_tokenizer, load_corpus  # noqa: E402
from tinyformer.translation.train.state import Position, run_metadata  # noqa: E402

CASES = {"small-30": dict(data="multi30k", preset="small"), "small-128": dict(data="multi30k", preset="small"),
         "tiny-128": dict(vocab_size=120), "small-30-steps": dict(data="multi30k", preset="small")}
STEPS = 5


def five_checkpoints(directory, **options):
    """The run directory of `tinyformer train` with ``options`` for STEPS steps, a checkpoint each."""
    from tinyformer.translation.train import Trainer

    config = TrainConfig(save_dir=str(directory), max_steps=STEPS, save_every=1, keep_last=STEPS, eval_every=STEPS,
                         threads=1, bleu_samples=1, **options)
    Trainer(config, echo=lambda *a: None, progress=False).run()
    return checkpoint.list_checkpoints(directory)[-1]
CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


def untrained_checkpoint(directory, **options):
    """A checkpoint of the run `tinyformer train` with ``options`` would start (before any update)."""
    config = TrainConfig(save_dir=str(directory), **options).resolved()
    tokenizer = build_tokenizer(config, load_corpus(config, "train"), echo=lambda message: None)
    model = build_model(config, tokenizer)
    path = Path(directory) / "checkpoint_0000000.npz"
    checkpoint.save_checkpoint(path, model.state_dict(), run_metadata(config, model, tokenizer, Position()))
    return path


def sentence_for(case, path):
    """(source, reference) of ``case`` for the run of checkpoint ``path``."""
    config = TrainConfig.from_dict(checkpoint.load_checkpoint(path)[1]["config"])
    if case.startswith("small-30"):
        tokenizer = Tokenizer.load(Path(path).parent / "spm.model")
        sources, targets = load_corpus(config, "test")
        return next((s, t) for s, t in zip(sources, targets) if len(tokenizer.encode(s)) == 30)
    sources, _ = load_corpus(config, "train")
    tokenizer = Tokenizer.load(Path(path).parent / "spm.model")
    words, text = " ".join(sources[:200]).split(), ""
    for word in words:  # the longest prefix of the training sources' words that is at most 128 tokens
        longer = f"{text} {word}".strip()
        if len(tokenizer.encode(longer)) > 128:
            break
        text = longer
    return text, text


def browse(page):
    """(seconds, script ms, self-test status) of ``page`` in headless Chromium, or None without it."""
    if CHROMIUM is None:
        return None
    with tempfile.TemporaryDirectory() as profile:
        args = [CHROMIUM, "--no-sandbox", "--headless", "--disable-gpu", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", f"--user-data-dir={profile}", "--virtual-time-budget=30000",
                "--dump-dom", page.resolve().as_uri()]
        start = time.perf_counter()
        dom = subprocess.run(args, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL).stdout
        seconds = time.perf_counter() - start
    tag = re.search(r'<[^>]*id="self-test"[^>]*>', dom)

    def attribute(name):
        found = re.search(rf'{name}="([^"]*)"', tag.group()) if tag else None
        return found.group(1) if found else "?"

    status = attribute("data-status") if tag else "no self-test element"
    return seconds, {name: attribute(f"data-{name}") for name in ("first-paint-ms", "drawn-ms", "ms")}, status


def measure(case, directory, given):
    steps = case.endswith("-steps")
    if given:
        path = Path(given)
    else:
        path = (five_checkpoints if steps else untrained_checkpoint)(directory / case, **CASES[case])
    source, reference = sentence_for(case, path)
    page = directory / f"{case}.html"
    which = ["--checkpoints", str(Path(path).parent)] if steps else ["--checkpoint", str(path)]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["explain", *which, "--source", source, "--reference", reference, "--output", str(page)])
    python_seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"bench_explain: tinyformer explain failed for {case} (exit {code})")
    data = json.loads(re.search(r'id="explain-data">(.*?)</script>', page.read_text(encoding="utf-8"), re.S).group(1))
    browser = browse(page)
    held = (data["steps"][-1] if "steps" in data else data)["token_gradients"]["positions"]
    return {"case": case, "source tokens": data["kinds"]["enc"]["rows"] - 1,
            "target tokens": len(data["target"]["ids"]), "held": len(held), "MiB": page.stat().st_size / 2 ** 20,
            "python s": python_seconds, "browser": browser}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--checkpoint", help="measure this checkpoint instead of an untrained one (one case)")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    needs_data = [c for c in cases if c.startswith("small")]
    if needs_data and not args.checkpoint and not os.environ.get("TINYFORMER_DATA"):
        parser.error(f"--cases {needs_data[0]} needs TINYFORMER_DATA (the directory holding multi30k/)")
    print(provenance.header(f"python benchmarks/bench_explain.py --cases {','.join(cases)}",
                            f"Chromium: {'yes' if CHROMIUM else 'not found'}") + "\n")
    print("| case | source / target tokens | tokens with their own dℓₜ/dP | page MiB | `tinyformer explain` s | "
          "Chromium s | first paint ms | panels drawn ms | scripts with the self-test ms | self-test |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        for case in cases:
            r = measure(case, Path(directory), args.checkpoint)
            browser = r["browser"]
            if browser:
                seen = (f"{browser[0]:.1f} | {browser[1]['first-paint-ms']} | {browser[1]['drawn-ms']} | "
                        f"{browser[1]['ms']}", browser[2])
            else:
                seen = ("n/a (no Chromium) | | |", "n/a")
            print(f"| {case} | {r['source tokens']} / {r['target tokens']} | {r['held']} | {r['MiB']:.2f} | "
                  f"{r['python s']:.1f} | {seen[0]} | {seen[1]} |", flush=True)


if __name__ == "__main__":
    main()
