"""Beam-search decoding speed, with and without the key/value cache, and the same search in PyTorch.

Translates Multi30k ``test_2016_flickr`` (1,000 sentences; English to German by default) with a
trained checkpoint, using the search of §6.1: beam 4, length penalty α = 0.6, maximum output
length = input length + 50. Sources are encoded as ``translate`` does (SentencePiece ids + EOS,
sorted by length, padded batches of ``--batch-size``), and each batch is decoded three ways:

* ``cached``: ``tinyformer.translation.decode.beam_search(..., use_cache=True)``, incremental decoding with
  cached self-attention keys/values and once-projected cross-attention keys/values;
* ``uncached``: the same call with ``use_cache=False``, the decoder re-run over the whole prefix
  every step (it must give the same tokens: the script counts the sentences that differ);
* ``torch``: when PyTorch is installed, the same weights in ``nn.Transformer`` (built and filled by
  ``torch_transformer.build_torch_model`` / ``copy_weights``) and ``torch_beam_search`` below, a compact
  port of tinyformer's beam search (same scoring, length penalty, candidate ranking and stopping
  rule): the encoder runs once, the decoder over the full prefix each step (``nn.Transformer`` has
  no cache), under ``torch.no_grad()`` with as many intra-op threads as NumPy's BLAS has.

It prints sentences/s per way, the speed-up cached/uncached, how many outputs equal the cached
ones, and the corpus BLEU of each way's output.

    TINYFORMER_DATA=<folder holding multi30k/> python benchmarks/bench_decode.py \\
        --checkpoint runs/multi30k-small/checkpoint_0003000.npz [--limit N] [--batch-size 64] [--markdown]
"""

import argparse
import contextlib
import datetime
import math
import os
import platform
import sys
import time
import warnings

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402  (benchmarks/ is not a package)
from step_report import print_table  # noqa: E402
import torch_transformer  # noqa: E402

MODES = ("cached", "uncached", "torch")


# ----------------------------------------------------------------------------- data
def encode_sources(tokenizer, lines, eos_id):
    """Source ids per line as ``translate`` builds them (ids + EOS); None for an empty line."""
    sources = []
    for line in lines:
        text = line.strip()
        sources.append([int(t) for t in tokenizer.encode(text)] + [eos_id] if text else None)
    return sources


def make_batches(sources, batch_size, pad_id):
    """(line indices, padded source array) per batch, lines sorted by length as ``translate`` does."""
    from tinyformer.translation.data.batching import pad

    order = sorted((i for i, ids in enumerate(sources) if ids is not None), key=lambda i: len(sources[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        batches.append((index, pad([sources[i] for i in index], pad_id)))
    return batches


# ----------------------------------------------------------------------------- searches
def tinyformer_search(model, src, use_cache, beam_size=4, alpha=0.6, max_len_a=1, max_len_b=50):
    from tinyformer.translation.decode import beam_search

    return beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b,
                       use_cache=use_cache)


def torch_beam_search(model, src, beam_size=4, alpha=0.6, max_len_a=1, max_len_b=50, bos_id=None, eos_id=None,
                      pad_id=0, max_positions=None, return_scores=False):
    """tinyformer's ``beam_search`` in PyTorch on ``torch_transformer.build_torch_model``'s model.

    Same conventions as ``tinyformer.translation.decode.beam_search``: float64 log-softmax of the last position's
    logits, pad and BOS banned, L = floor(a · src_len + b) capped at ``max_positions - 1`` with EOS
    forced after L tokens; per step the 2k best extensions by summed log-probability (ties to the lower
    flat index), EOS ones ranked within the first k finish, the k best others stay active; a sentence
    stops at its limit or once it has k finished hypotheses and its best active one, scored as if it
    ended now, does not beat the best finished one. Returns the best hypothesis' ids per sentence, or
    with ``return_scores`` the kept (ids, score, normalized score) triples per sentence, best first.
    """
    import torch
    from torch.nn import functional as TF

    from tinyformer.translation.data.special import BOS_ID, EOS_ID
    from tinyformer.translation.decode import length_penalty

    bos_id = BOS_ID if bos_id is None else bos_id
    eos_id = EOS_ID if eos_id is None else eos_id
    k = beam_size
    src = torch.as_tensor(numpy.asarray(src), dtype=torch.long)
    count = src.shape[0]
    if not count:
        return []
    limits = torch.floor(max_len_a * (src != pad_id).sum(1).double() + max_len_b).long()
    if max_positions is not None:
        limits = limits.clamp(max=max_positions - 1)
    weight = model.embed.weight
    vocab = weight.shape[0]
    banned = sorted(i for i in {pad_id, bos_id} - {eos_id} if 0 <= i < vocab)
    finished = [[] for _ in range(count)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            src_pad = src == pad_id  # True = ignore (PyTorch's convention)
            with warnings.catch_warnings():  # the encoder's fast path warns that nested tensors are a prototype
                warnings.simplefilter("ignore", UserWarning)
                memory = model.transformer.encoder(model._embed(src), src_key_padding_mask=src_pad)
            expand = torch.arange(count).repeat_interleave(k)
            memory, src_pad = memory[expand], src_pad[expand]
            alive = torch.arange(count)
            tokens = torch.full((count * k, 1), bos_id, dtype=torch.long)
            cumulative = torch.full((count, k), -math.inf, dtype=torch.float64)
            cumulative[:, 0] = 0.0  # the k beams start identical: extend only the first one at step 1
            while alive.numel():
                alive_ids = alive.tolist()
                n, length = len(alive_ids), tokens.shape[1]
                step = length - 1
                future = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)
                h = model.transformer.decoder(model._embed(tokens), memory, tgt_mask=future,
                                              memory_key_padding_mask=src_pad, tgt_is_causal=True)
                log_probs = torch.log_softmax(TF.linear(h[:, -1], weight).double(), dim=-1)
                if banned:
                    log_probs[:, banned] = -math.inf
                at_limit = limits[alive] <= step
                if at_limit.any():  # only EOS may follow
                    rows = at_limit.repeat_interleave(k)
                    eos = log_probs[rows, eos_id].clone()
                    log_probs[rows] = -math.inf
                    log_probs[rows, eos_id] = eos
                candidates = (cumulative[:, :, None] + log_probs.view(n, k, vocab)).view(n, k * vocab)
                _, top = candidates.topk(2 * k, dim=1)
                top = top.sort(dim=1).values  # best first, ties to the lower index: index order, then a
                top_scores = candidates.gather(1, top)  # stable sort by score
                rank = top_scores.sort(dim=1, descending=True, stable=True).indices
                top, top_scores = top.gather(1, rank), top_scores.gather(1, rank)
                top_beam, top_token = top // vocab, top % vocab
                is_eos = top_token == eos_id
                finishing = is_eos[:, :k] & torch.isfinite(top_scores[:, :k])
                for i, j in finishing.nonzero().tolist():  # sentence by sentence, best rank first
                    hyps = finished[alive_ids[i]]
                    ids = tokens[i * k + top_beam[i, j], 1:].tolist()
                    score = float(top_scores[i, j])
                    hyps.append((ids, score, score / length_penalty(len(ids) + 1, alpha)))
                    if len(hyps) > k:  # keep the k best (stable: the earlier of equals stays)
                        hyps.sort(key=lambda h: -h[2])
                        hyps.pop()
                order = is_eos.to(torch.uint8).sort(dim=1, stable=True).indices[:, :k]
                next_scores = top_scores.gather(1, order)
                best_active = next_scores[:, 0] / length_penalty(step + 1, alpha)
                best_finished = torch.tensor([max((h[2] for h in finished[s]), default=-math.inf)
                                              for s in alive_ids], dtype=torch.float64)
                enough = torch.tensor([len(finished[s]) >= k for s in alive_ids])
                done = at_limit | (enough & (best_active <= best_finished))
                keep = (~done).nonzero().squeeze(1)
                if not keep.numel():
                    break
                order = order[keep]
                new_beam = top_beam[keep].gather(1, order)
                new_token = top_token[keep].gather(1, order)
                cumulative = next_scores[keep]
                rows = (keep[:, None] * k + new_beam).reshape(-1)
                tokens = torch.cat([tokens[rows], new_token.reshape(-1, 1)], dim=1)
                memory, src_pad, alive = memory[rows], src_pad[rows], alive[keep]
    finally:
        model.train(was_training)
    ranked = [sorted(hyps, key=lambda h: -h[2]) for hyps in finished]
    return ranked if return_scores else [hyps[0][0] for hyps in ranked]


def torch_supported(model):
    """None if ``torch_transformer.build_torch_model`` builds this model exactly, else the reason it does not."""
    c = model.config
    if c.tgt_vocab_size is not None:
        return "two vocabularies (build_torch_model ties one shared embedding)"
    if c.norm_first:
        return "pre-LN model (build_torch_model builds post-LN)"
    if c.positional != "sinusoid":
        return f"positional={c.positional!r} (build_torch_model uses sinusoids)"
    return None


def build_torch(model):
    """The PyTorch copy of ``model``: ``torch_transformer.build_torch_model`` + ``copy_weights``, eval mode."""
    torch_model = torch_transformer.build_torch_model(model.config, "cpu")
    torch_transformer.copy_weights(model, torch_model)
    return torch_model.eval()


def searchers(model, torch_model, beam_size, alpha, max_len_a, max_len_b):
    """{mode: function(src) -> list of ids per sentence} for the modes that can run."""
    common = dict(beam_size=beam_size, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b)
    run = {"cached": lambda src: tinyformer_search(model, src, True, **common),
           "uncached": lambda src: tinyformer_search(model, src, False, **common)}
    if torch_model is not None:
        positions = model.config.max_len
        run["torch"] = lambda src: torch_beam_search(torch_model, src, pad_id=model.pad_id,
                                                     max_positions=positions, **common)
    return run


def decode_all(run, batches, count, order="interleaved", warmup=True):
    """Decode every batch with every mode; returns ({mode: seconds}, {mode: ids per line}).

    ``interleaved``: each batch by every mode in turn (machine noise hits all alike); ``blocks``: all
    batches by one mode, then the next. ``warmup`` first decodes the smallest batch once per mode, untimed.
    """
    seconds = {mode: 0.0 for mode in run}
    outputs = {mode: [None] * count for mode in run}

    def one(mode, index, src):
        start = time.perf_counter()
        ids = run[mode](src)
        seconds[mode] += time.perf_counter() - start
        for i, hyp in zip(index, ids):
            outputs[mode][i] = list(hyp)

    if warmup and batches:
        for mode in run:
            run[mode](batches[0][1][:4])
    if order == "interleaved":
        for index, src in batches:
            for mode in run:
                one(mode, index, src)
    else:
        for mode in run:
            for index, src in batches:
                one(mode, index, src)
    for mode in run:  # lines with no source (empty) translate to nothing, as in translate()
        outputs[mode] = [[] if ids is None else ids for ids in outputs[mode]]
    return seconds, outputs


# ----------------------------------------------------------------------------- reporting
def thread_counts():
    """(NumPy BLAS threads or None, description)."""
    try:
        from threadpoolctl import threadpool_info

        counts = sorted({p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"})
        return (counts[0] if len(counts) == 1 else None), ", ".join(map(str, counts)) or "unknown"
    except ImportError:
        return None, "unknown (threadpoolctl not installed)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a trained tinyformer checkpoint (.npz)")
    parser.add_argument("--tokenizer", help="SentencePiece model (default: spm.model beside the checkpoint)")
    parser.add_argument("--split", default="test_2016_flickr", help="Multi30k split (default test_2016_flickr)")
    parser.add_argument("--src", default=None, help="source language (default: the checkpoint's)")
    parser.add_argument("--tgt", default=None, help="target language (default: the checkpoint's)")
    parser.add_argument("--data-dir", help="folder holding the Multi30k files (default: $TINYFORMER_DATA, cache)")
    parser.add_argument("--limit", type=int, help="only the first N sentences of the split")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default 64, as translate)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--max-len-a", type=float, default=1.0)
    parser.add_argument("--max-len-b", type=float, default=50.0)
    parser.add_argument("--threads", type=int, help="BLAS threads for NumPy and intra-op threads for PyTorch "
                        "(default: NumPy's BLAS default, and PyTorch set to the same)")
    parser.add_argument("--order", choices=("interleaved", "blocks"), default="interleaved",
                        help="decode each batch by every mode in turn (default), or all batches mode by mode")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch search")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    if (args.limit is not None and args.limit < 1) or args.batch_size < 1 or args.beam_size < 1:
        parser.error("--limit, --batch-size and --beam-size must be positive")

    limit_threads = contextlib.nullcontext()
    if args.threads:
        from threadpoolctl import threadpool_limits

        limit_threads = threadpool_limits(limits=args.threads, user_api="blas")
    with limit_threads:
        run_benchmark(args)


def run_benchmark(args):
    from tinyformer.translation import metrics
    from tinyformer.translation.data.multi30k import load_multi30k
    from tinyformer.translation.data.special import EOS_ID
    from tinyformer.translation.train import load_model

    model, tokenizer, meta = load_model(args.checkpoint, "cpu", args.tokenizer)
    config = meta.get("config", {})
    src_lang, tgt_lang = args.src or config.get("src_lang", "en"), args.tgt or config.get("tgt_lang", "de")
    sources_text, references = load_multi30k(args.split, src_lang, tgt_lang, data_dir=args.data_dir,
                                             progress=False)
    if args.limit:
        sources_text, references = sources_text[:args.limit], references[:args.limit]
    count = len(sources_text)
    sources = encode_sources(tokenizer, sources_text, EOS_ID)
    batches = make_batches(sources, args.batch_size, model.pad_id)

    blas_threads, blas_desc = thread_counts()
    torch = torch_model = None
    torch_note = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch_note = "PyTorch not installed: torch search skipped"
        if torch is not None:
            reason = torch_supported(model)
            if reason:
                torch, torch_note = None, f"torch search skipped: {reason}"
            else:
                torch.set_num_threads(args.threads or blas_threads or torch.get_num_threads())
                torch_model = build_torch(model)
    run = searchers(model, torch_model, args.beam_size, args.alpha, args.max_len_a, args.max_len_b)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    wall = time.perf_counter()
    seconds, outputs = decode_all(run, batches, count, args.order)
    wall = time.perf_counter() - wall
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    print(f"Beam-search decoding of Multi30k {args.split} ({src_lang}->{tgt_lang}), with and without the "
          f"key/value cache" + (", and in PyTorch" if torch_model is not None else ""))
    print(f"command: {provenance.command_line()}")
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"machine: {provenance.machine_line()}")
    versions = f"python {platform.python_version()}, numpy {numpy.__version__}"
    if torch_model is not None:
        versions += f", torch {torch.__version__}"
    print(f"versions: {versions}")
    threads = f"NumPy BLAS {blas_desc}"
    if torch_model is not None:
        threads += f"; PyTorch intra-op {torch.get_num_threads()}"
    print(f"threads: {threads}")
    print(f"numpy BLAS: {provenance.blas_info()}")
    step = meta.get("step")
    print(f"model: {args.checkpoint}" + (f" (step {step})" if step is not None else "")
          + f", {model.extra_repr()}, {model.num_parameters():,} parameters")
    src_tokens = sum(len(s) for s in sources if s is not None)
    print(f"data: {count:,} sentences" + (f" (--limit {args.limit})" if args.limit else "")
          + f", {src_tokens:,} source tokens (EOS included), {len(batches)} batches of up to "
          f"{args.batch_size} sorted by length; beam {args.beam_size}, alpha {args.alpha}, max length "
          f"{args.max_len_a:g} x source length + {args.max_len_b:g}; order: {args.order}, one untimed warm-up "
          f"batch of 4 sentences per mode")
    if load_before is not None:
        print(f"machine load (1-minute load average): {load_before:.2f} before, {load_after:.2f} after the "
              f"{wall / 60:.1f} minutes of decoding, on {os.cpu_count()} logical cpus")
    if torch_note:
        print(torch_note)
    print()

    texts = {mode: [tokenizer.decode(ids) for ids in outputs[mode]] for mode in run}
    header = ["search", "seconds", "sentences/s", "output tokens/s", "vs uncached", "same ids as cached",
              "same text as cached", "BLEU"]
    rows = []
    for mode in run:
        out_tokens = sum(len(ids) + 1 for ids in outputs[mode])  # + EOS
        same_ids = sum(a == b for a, b in zip(outputs[mode], outputs["cached"]))
        same_text = sum(a == b for a, b in zip(texts[mode], texts["cached"]))
        bleu = metrics.corpus_bleu(texts[mode], references).score
        name = {"cached": "tinyformer, cached", "uncached": "tinyformer, uncached",
                "torch": "PyTorch, full prefix"}[mode]
        rows.append([name, f"{seconds[mode]:,.1f}", f"{count / seconds[mode]:,.2f}",
                     f"{out_tokens / seconds[mode]:,.0f}", f"{seconds['uncached'] / seconds[mode]:.2f}x",
                     f"{same_ids:,} / {count:,}", f"{same_text:,} / {count:,}", f"{bleu:.2f}"])
    print_table(header, rows, args.markdown)
    print()
    print("seconds: wall time of all batches' searches (encoder + beam search; tokenization and detokenization "
          "excluded); output tokens: tokens of the best hypotheses + EOS.")
    print(f"speed-up cached / uncached: {seconds['uncached'] / seconds['cached']:.2f}x; cached and uncached "
          f"outputs identical: {'yes' if outputs['cached'] == outputs['uncached'] else 'NO'}")
    if "torch" in run:
        print(f"PyTorch / tinyformer cached time: {seconds['torch'] / seconds['cached']:.2f}x; "
              f"PyTorch outputs equal to tinyformer's: {sum(a == b for a, b in zip(outputs['torch'], outputs['cached']))}"
              f" of {count} sentences")
    print("BLEU: sacreBLEU (tinyformer.translation.metrics.corpus_bleu) against the references of the same sentences.")


if __name__ == "__main__":
    main()
