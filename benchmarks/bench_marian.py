"""A Marian model of Helsinki-NLP/opus-mt-en-de's shape through tinyformer import, side by side with transformers.

Builds, with transformers itself, a folder laid out as opus-mt-en-de (6 + 6 layers, d_model 512, 8
heads, d_ff 2,048, SiLU, 58,101 pieces; random weights: there is no network here), then measures:
the seconds of ``tinyformer import marian`` (in-process ``import_marian``) and of loading the run;
whether greedy translations of ``--sentences`` sentences equal ``generate(num_beams=1)`` token for
token, and beam 4 with ``length_normalization="hf"`` ``generate(num_beams=4)``; and the seconds of
each, tinyformer's and transformers', interleaved in one run (a ratio, on a shared machine).

    python benchmarks/bench_marian.py [--sentences 8] [--max-new-tokens 30] [--threads 2] [--folder DIR]

Needs the test extra (transformers, torch). Prints a Markdown section for benchmarks/results/marian.md.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

OPUS_MT_EN_DE = dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                     decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                     max_position_embeddings=512, pad_token_id=58100, decoder_start_token_id=58100, eos_token_id=0,
                     forced_eos_token_id=0, activation_function="swish", scale_embedding=True)


def opus_shaped_folder(folder):
    """A Marian folder of opus-mt-en-de's shape with random weights, written by transformers."""
    import torch
    from tinyformer.testing.marian_folders import corpus, write_tokenizer
    from transformers import MarianConfig, MarianMTModel

    folder = Path(folder)
    write_tokenizer(folder, corpus(2000, 0), vocab_size=500)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    del vocab["<pad>"]
    filler = 0
    while len(vocab) < OPUS_MT_EN_DE["vocab_size"] - 1:  # made-up pieces up to the real vocabulary's size
        vocab.setdefault(f"\u2581w{filler}", len(vocab))
        filler += 1
    vocab["<pad>"] = OPUS_MT_EN_DE["pad_token_id"]
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(**OPUS_MT_EN_DE))
    model.generation_config.bad_words_ids = [[OPUS_MT_EN_DE["pad_token_id"]]]
    model.save_pretrained(str(folder))
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", help="an opus-mt-en-de-shaped folder made before (default: made now)")
    args = parser.parse_args(argv)

    import torch
    from threadpoolctl import threadpool_limits

    from tinyformer.testing.marian_folders import corpus, hf_greedy, hf_model
    from tinyformer.translation import decode
    from tinyformer.translation.data.batching import pad
    from tinyformer.translation.interop.runs import import_marian
    from tinyformer.translation.train import load_model

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-marian-"))
    start = time.perf_counter()
    folder = Path(args.folder) if args.folder else opus_shaped_folder(work / "opus-mt-en-de")
    made = time.perf_counter() - start
    weights = (folder / "model.safetensors").stat().st_size / 2 ** 20
    with threadpool_limits(args.threads):
        start = time.perf_counter()
        import_marian(folder, work / "run")
        imported = time.perf_counter() - start
        start = time.perf_counter()
        model, tokenizer, _ = load_model(work / "run")
        loaded = time.perf_counter() - start
        hf, hf_tokenizer = hf_model(folder)
        sentences = [source for source, _ in corpus(args.sentences, seed=3)]
        src = pad([tokenizer.encode(s) + [tokenizer.eos_id] for s in sentences], tokenizer.pad_id)
        limit = args.max_new_tokens
        seconds = {}

        def timed(name, run):
            start = time.perf_counter()
            result = run()
            seconds.setdefault(name, []).append(time.perf_counter() - start)
            return result

        for _ in range(2):  # interleaved, twice
            ours = timed("tinyformer greedy", lambda: decode.greedy_decode(
                model, src, max_len=limit - 1, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id))
            theirs = timed("transformers greedy", lambda: hf_greedy(hf, hf_tokenizer, sentences, limit))
            ours_beam = timed("tinyformer beam 4 (hf)", lambda: decode.beam_search(
                model, src, beam_size=4, max_len=limit - 1, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                length_normalization="hf"))
            inputs = hf_tokenizer(sentences, return_tensors="pt", padding=True)
            with torch.no_grad():
                generated = timed("transformers beam 4", lambda: hf.generate(
                    **inputs, num_beams=4, max_new_tokens=limit, bad_words_ids=[[tokenizer.pad_id]]))
    theirs_beam = [_strip(row, tokenizer) for row in generated.tolist()]
    import transformers
    from provenance import header

    command = "python benchmarks/bench_marian.py " + " ".join(argv if argv is not None else sys.argv[1:])
    versions = (f"torch {torch.__version__}", f"transformers {transformers.__version__}")
    print(f"**Command:** {header(command.strip(), *versions)}\n")
    parameters = sum(p.size for p in model.parameters())
    print(f"- {parameters:,} parameters, model.safetensors {weights:.1f} MiB (made by transformers in {made:.1f} s)")
    print(f"- `import_marian`: {imported:.2f} s; `load_model` of the run: {loaded:.2f} s")
    print(f"- greedy, {len(sentences)} sentences, at most {limit} tokens: "
          f"{sum(a == b for a, b in zip(ours, theirs))} of {len(sentences)} equal to generate(num_beams=1)")
    print(f"- beam 4, length_normalization hf: {sum(a == b for a, b in zip(ours_beam, theirs_beam))} of "
          f"{len(sentences)} equal to generate(num_beams=4)")
    for name, values in seconds.items():
        print(f"- {name}: {', '.join(f'{v:.2f}' for v in values)} s")
    return 0


def _strip(row, tokenizer):
    row = row[1:]
    while row and row[-1] == tokenizer.pad_id:
        row.pop()
    return row[:-1] if row and row[-1] == tokenizer.eos_id else row


if __name__ == "__main__":
    sys.exit(main())
