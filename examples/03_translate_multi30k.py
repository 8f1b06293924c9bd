"""The real recipe: train an English→German Transformer on Multi30k, translate, score with sacreBLEU.

"Attention Is All You Need" scaled down to Multi30k (29,000 training pairs):

  * data (§5.1): a joint BPE vocabulary (sentencepiece) over both languages, and
    batches holding about ``--max-tokens`` target tokens each, pairs of similar
    length together;
  * model (§3): a preset from tinyformer.model.nn.PRESETS, ``small`` by default
    (N=3, d_model=256, d_ff=1024, h=4), embeddings shared with the output projection;
  * training (§5.3, §5.4): Adam (β₁ = 0.9, β₂ = 0.98, ε = 1e-9) with the warm-up
    schedule, residual and attention dropout, label smoothing ε_ls = 0.1;
  * inference (§6.1): beam search with beam 4 and length penalty α = 0.6, then
    sacreBLEU (cased, 13a, the reproducible signature) on test_2016_flickr.

Everything the run needs is in ``tinyformer.translation.train``: ``Trainer(TrainConfig(...)).run()``
trains, validates and writes checkpoints, exactly as ``tinyformer train`` does.
The run goes to a temporary folder, deleted at the end, unless ``--save-dir`` names one.
The data are found through ``--data-dir`` or $TINYFORMER_DATA (a folder holding
multi30k/), else downloaded into the user cache. The defaults are the recipe
(3,000 steps; benchmarks/results/multi30k.md measured 36.34 sacreBLEU on test_2016_flickr
after about 105 minutes on a 2-core CPU; ``--device cuda`` runs it on a GPU, not yet timed).
A smoke test on a CPU takes under a minute:

    python examples/03_translate_multi30k.py --steps 30 --preset tiny --max-tokens 1500 \\
        --vocab-size 2000 --warmup 10 --lr-factor 2 --sentences 10 --threads 1

It exits with status 1 unless the training loss went down.
"""

import argparse
import json
import sys
import tempfile
import time

import numpy as np

from tinyformer.translation import checkpoint
from tinyformer.model.nn import PRESETS
from tinyformer.translation.train import LOG_FILE, TrainConfig, Trainer, evaluate, load_corpus, load_model


def training_losses(save_dir):
    with open(save_dir / LOG_FILE, encoding="utf-8") as f:
        return [record["loss"] for record in map(json.loads, f) if "split" not in record]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the recipe's 3000)")
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--max-tokens", type=int, default=None, help="target tokens per batch (default 4096)")
    parser.add_argument("--vocab-size", type=int, default=None, help="joint BPE pieces (default 8000)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 800)")
    parser.add_argument("--lr-factor", type=float, default=None, help="scales the schedule (default 1)")
    parser.add_argument("--data-dir", default=None, help="a folder holding the Multi30k files (or multi30k/)")
    parser.add_argument("--save-dir", default=None, help="keep the run here (default: a temporary folder)")
    parser.add_argument("--sentences", type=int, default=100, help="test sentences to translate and score")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: all)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tinyformer-multi30k-") as scratch:
        save_dir = args.save_dir or scratch
        config = TrainConfig(
            data="multi30k", src_lang="en", tgt_lang="de", data_dir=args.data_dir, preset=args.preset,
            vocab_size=args.vocab_size, max_tokens=args.max_tokens, max_steps=args.steps,
            warmup_steps=args.warmup, lr_factor=args.lr_factor, threads=args.threads,
            device=args.device, save_dir=save_dir, log_every=1, bleu_samples=min(args.sentences, 100),
        )
        if args.steps is not None:  # validate and save once, at the end of a short run
            config.eval_every = config.save_every = args.steps
        start = time.perf_counter()
        trainer = Trainer(config, progress=sys.stderr.isatty())
        trainer.run()
        c = trainer.config
        print(f"trained {trainer.step} steps ({c.preset}, {c.max_tokens} target tokens per batch, "
              f"warm-up {c.warmup_steps}, label smoothing {c.label_smoothing}) in "
              f"{time.perf_counter() - start:.0f}s")

        losses = training_losses(trainer.save_dir)
        window = max(1, min(5, len(losses) // 4))
        first, last = np.mean(losses[:window]), np.mean(losses[-window:])
        print(f"training loss: {first:.3f} (mean of the first {window} steps) -> {last:.3f} "
              f"(mean of the last {window})")

        # Reload as a user would: the newest checkpoint and the tokenizer saved beside it.
        model, tokenizer, meta = load_model(checkpoint.list_checkpoints(trainer.save_dir)[-1], device=c.device)
        sources, references = (lines[:args.sentences] for lines in load_corpus(c, "test"))
        start = time.perf_counter()
        result = evaluate(model, tokenizer, sources, references, beam_size=args.beam, alpha=args.alpha)
        print(f"\ntest_2016_flickr, first {result['sentences']} sentences, beam {args.beam}, "
              f"α {args.alpha} ({time.perf_counter() - start:.1f}s):")
        for source, hypothesis, reference in list(zip(sources, result["hypotheses"], references))[:3]:
            print(f"  EN  {source}\n  DE  {hypothesis}\n  REF {reference}\n")
        print(f"sacreBLEU {result['bleu']:.2f}  {result['signature']}")
        print(f"tokenized lowercased BLEU {result['tokenized_bleu']:.2f}  {result['tokenized_signature']}")
        if args.save_dir:
            print(f"the run is kept in {args.save_dir}")
    if not last < first:
        print(f"FAILED: the training loss did not go down ({first:.3f} -> {last:.3f})")
        return 1
    print("the training loss went down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
