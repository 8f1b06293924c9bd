"""``tinyformer eval``: the BLEU of a checkpoint on a split of its run's data, or of two files."""

from ..engine import amp
from .options import (add_decoding_options, add_precision_option, check_length_penalty, check_precision_on_device,
                      fit_beam, limiting_threads, positive_int)
from .text_io import read_lines
from .usage import UsageError


def register(commands):
    evaluate = commands.add_parser("eval", help="BLEU of a checkpoint on a split, or of two files",
                                   description="sacreBLEU (cased, detokenized, 13a) and tokenized "
                                               "lowercased BLEU.")
    evaluate.add_argument("--checkpoint", help="translate the split with this checkpoint")
    evaluate.add_argument("--split", default="test", choices=("train", "val", "test"),
                          help="which split of the run's data (default test; Multi30k: test_2016_flickr)")
    evaluate.add_argument("--data-dir", help="where the Multi30k files are")
    evaluate.add_argument("--limit", type=positive_int, help="only the first N sentences")
    evaluate.add_argument("--hypotheses", help="score this file of translations instead ...")
    evaluate.add_argument("--references", help="... against this file of references")
    evaluate.add_argument("--sources", help="with --checkpoint and --references: translate this file of sentences "
                                            "instead of a split (any model, an imported one too)")
    add_decoding_options(evaluate, length_normalization=True)
    add_precision_option(evaluate)
    evaluate.set_defaults(run=limiting_threads(run))


def run(args):
    from ..translation import metrics

    if args.hypotheses:
        if args.checkpoint or args.sources or not args.references:
            raise UsageError("--hypotheses needs --references (and no --checkpoint)")
        hypotheses = read_lines(args.hypotheses, "--hypotheses", args.command)
        references = read_lines(args.references, "--references", args.command)
        bleu = metrics.corpus_bleu(hypotheses, references)
        tokenized = metrics.tokenized_bleu(hypotheses, references)
        print(f"BLEU {bleu.score:.2f}  ({bleu.signature})")
        print(f"tokenized lowercased BLEU {tokenized.score:.2f}  ({tokenized.signature})")
        return 0
    if not args.checkpoint:
        raise UsageError("give --checkpoint (translate and score a split) or --hypotheses/--references")
    check_length_penalty(args)
    check_precision_on_device(args)
    from ..translation.train import TrainConfig, evaluate, load_corpus, load_model

    if bool(args.sources) != bool(args.references):
        raise UsageError("--sources and --references go together (with --checkpoint)")
    model, tokenizer, meta = load_model(args.checkpoint, args.device, args.tokenizer)
    args.beam = fit_beam(args.beam, model, tokenizer, args.command)
    if args.sources:
        sources = read_lines(args.sources, "--sources", args.command)
        references = read_lines(args.references, "--references", args.command)
        if len(sources) != len(references):
            raise UsageError(f"--sources has {len(sources):,} lines but --references {len(references):,}")
        split = args.sources
    elif "config" not in meta:
        raise UsageError(f"{args.checkpoint} was not written by tinyformer train (an imported model?): it has no "
                         "splits of its own; give --sources FILE --references FILE")
    else:
        config = TrainConfig.from_dict(meta["config"])
        if args.data_dir:
            config.data_dir = args.data_dir
        sources, references = load_corpus(config, args.split)
        split = args.split
    if args.limit:
        sources, references = sources[:args.limit], references[:args.limit]
    with amp.autocast(args.precision):
        result = evaluate(model, tokenizer, sources, references, args.beam, args.alpha, args.length_normalization)
    print_evaluation(result, sources, references, split)
    return 0


def print_evaluation(result, sources, references, split, samples=3):
    """A few sentences with their translations, then the scores of ``evaluate`` (also train's test split)."""
    for source, reference, hypothesis in list(zip(sources, references, result["hypotheses"]))[:samples]:
        print(f"  source:     {source}\n  reference:  {reference}\n  hypothesis: {hypothesis}")
    print(f"{split}: BLEU {result['bleu']:.2f}  ({result['signature']})")
    print(f"{split}: tokenized lowercased BLEU {result['tokenized_bleu']:.2f}  ({result['tokenized_signature']})")
    print(f"{split}: exact match {result['exact_match']:.1%} of {result['sentences']} sentences")
