"""Size and time of `tinyformer explain` pages: the manual's figures (docs/attention.md), measured.

Cases (each a fresh, untrained checkpoint built as `tinyformer train` builds it, unless
``--checkpoint`` names one; the page's size and plumbing do not depend on training):

- ``small-30``: `small` on Multi30k (its 8k BPE), the first test sentence of 30 BPE tokens, taught
  its reference (needs ``TINYFORMER_DATA``);
- ``small-128``: `small` on Multi30k, a 128-token source and target (the training sources' words);
- ``tiny-128``: `tiny` on the built-in task, a 128-token source and target;
- ``small-30-steps``: the sentence of ``small-30`` across five checkpoints of one `small` run on
  Multi30k (trained one step each: the size does not depend on training), `tinyformer explain
  --checkpoints`, the page with a step slider;
- ``opus-mt-30``: a run of Helsinki-NLP/opus-mt-en-de's shape as `tinyformer import marian` writes one
  (6 + 6 layers, d_model 512, 8 heads, d_ff 2,048, SiLU, a 58,101-piece Marian vocabulary, the decoder
  starting from the padding id), with random weights (``opus_shaped_run``: no Marian folder, no
  network), a 30-token source taught a 30-token reference.

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
from tinyformer.translation import checkpoint  # noqa: E402
from tinyformer import cli  # noqa: E402
from tinyformer.translation.data.tokenizer import Tokenizer  # noqa: E402
from tinyformer.translation.train import TrainConfig  # noqa: E402
from tinyformer.translation.train.builders import build_model, build_tokenizer, load_corpus  # noqa: E402
from tinyformer.translation.train.state import Position, run_metadata  # noqa: E402

CASES = {"small-30": dict(data="multi30k", preset="small"), "small-128": dict(data="multi30k", preset="small"),
         "tiny-128": dict(vocab_size=120), "small-30-steps": dict(data="multi30k", preset="small"),
         "opus-mt-30": None}
STEPS = 5
OPUS_MT_EN_DE = {  # the shape of Helsinki-NLP/opus-mt-en-de's config.json (its weights are not needed)
    "model_type": "marian", "vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
    "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048,
    "activation_function": "swish", "max_position_embeddings": 512, "scale_embedding": True, "pad_token_id": 58100,
    "eos_token_id": 0, "decoder_start_token_id": 58100, "forced_eos_token_id": 0, "dropout": 0.1,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True}
OPUS_TOKENS = 30


def five_checkpoints(directory, **options):
    """The run directory of `tinyformer train` with ``options`` for STEPS steps, a checkpoint each."""
    from tinyformer.translation.train import Trainer

    config = TrainConfig(save_dir=str(directory), max_steps=STEPS, save_every=1, keep_last=STEPS, eval_every=STEPS,
                         threads=1, bleu_samples=1, **options)
    Trainer(config, echo=lambda *a: None, progress=False).run()
    return checkpoint.list_checkpoints(directory)[-1]
CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


def marian_vocabulary_of_size(folder, size):
    """A Marian tokenizer folder at ``folder`` whose vocab.json has ``size`` pieces: the small
    sentencepiece models of tinyformer.testing.marian_folders over its made-up corpus, their pieces first, then
    made-up pieces no sentence produces, "<pad>" last (id ``size`` - 1), as opus-mt's vocabularies are."""
    from tinyformer.testing.marian_folders import corpus, write_tokenizer

    vocab = write_tokenizer(folder, corpus(600))
    del vocab["<pad>"]
    for number in range(size - 1 - len(vocab)):
        vocab[f"\u2581made-up-{number}"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (Path(folder) / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return Path(folder)


def opus_shaped_run(directory, values=None, seed=0):
    """The run `tinyformer import marian` would write of a Marian model with the config.json ``values``
    (default ``OPUS_MT_EN_DE``) and random weights, without writing the Marian folder (300 MB for
    opus-mt-en-de): a ``tokenizer/`` folder (``marian_vocabulary_of_size``) and checkpoint_0000000.npz
    with interop/runs.py's metadata. Returns the checkpoint's path."""
    from tinyformer.model.nn import Transformer
    from tinyformer.translation.data.marian_tokenizer import MarianTokenizer
    from tinyformer.translation.interop import marian, runs
    from tinyformer.translation.train.migration import FORMAT

    values = dict(values or OPUS_MT_EN_DE)
    directory = Path(directory)
    tokenizer = MarianTokenizer(marian_vocabulary_of_size(directory / runs.MARIAN_TOKENIZER_DIR,
                                                          values["vocab_size"]))
    config = marian.marian_config(values)
    model = Transformer.from_config(config.replace(seed=seed))
    meta = {"format": FORMAT, "model_config": config.to_dict(), "step": 0, "epoch": 0, "batch_in_epoch": 0,
            "tokens_seen": 0, "skipped_updates": 0, "tokenizer_sha256": tokenizer.sha256,
            "tokenizer_file": runs.MARIAN_TOKENIZER_DIR,
            "imported_from": {"kind": "marian", "folder": "opus-mt-en-de-shaped (random weights)", "config": values,
                              "generation_config": None}}
    return checkpoint.save_checkpoint(directory / runs.IMPORTED_CHECKPOINT, model.state_dict(), meta)


def sentence_of_length(words, encode, length):
    """The words of ``words``, in order, that fit: each kept when the text stays at most ``length``
    tokens; stops at ``length`` tokens."""
    text = ""
    for word in words:
        longer = f"{text} {word}".strip()
        count = len(encode(longer))
        if count <= length:
            text = longer
        if count == length:
            break
    return text


def opus_sentence(path):
    """(source, reference) of ``OPUS_TOKENS`` tokens each, from the made-up corpus of tinyformer.testing.marian_folders."""
    from tinyformer.testing.marian_folders import corpus
    from tinyformer.translation.data.marian_tokenizer import MarianTokenizer
    from tinyformer.translation.interop import runs

    tokenizer = MarianTokenizer(Path(path).parent / runs.MARIAN_TOKENIZER_DIR)
    pairs = corpus(50, seed=1)
    sources = " ".join(s for s, _ in pairs).split()
    targets = " ".join(t for _, t in pairs).split()
    return (sentence_of_length(sources, tokenizer.encode, OPUS_TOKENS),
            sentence_of_length(targets, tokenizer.encode_target, OPUS_TOKENS))


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
    if case.startswith("opus-mt"):
        return opus_sentence(path)
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
    elif case.startswith("opus-mt"):
        path = opus_shaped_run(directory / case)
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
