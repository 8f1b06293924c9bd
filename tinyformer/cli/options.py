"""Argument types that check their values (a bad value: exit status 2) and the options that
several commands share: decoding, precision, CPU threads."""

import argparse
import functools

from ..common.validation import check_int, check_real
from ..engine import amp, backend
from ..translation.length_penalties import ALPHA_LIMIT, alpha_range
from .usage import UsageError


def checked(kind, check):
    """An argparse type: the text as ``kind``, then ``check(name, value)`` (tinyformer.common.validation's, or
    a TrainConfig field's), whose "NAME must be ..., got VALUE" becomes "must be ..., got 'TEXT'":
    argparse puts "argument --flag: " before it, so the message names the flag and shows the text."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        try:
            return check("value", value)
        except ValueError as error:
            requirement = str(error).removeprefix("value ").rpartition(", got ")[0]
            raise argparse.ArgumentTypeError(f"{requirement}, got {text!r}") from None

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


positive_int = checked(int, functools.partial(check_int, minimum=1))
float_number = checked(float, check_real)
gnmt_alpha = checked(float, functools.partial(check_real, minimum=0, maximum=ALPHA_LIMIT))


def add_decoding_options(parser, beam=4, threads=None, length_normalization=False):
    """--beam, --threads, --alpha, --device, --tokenizer; with ``length_normalization`` also
    --length-normalization {gnmt,hf}, and --alpha defaults to None (the normalisation's own default)."""
    parser.add_argument("--beam", type=positive_int, default=beam,
                        help=f"beam size (default {beam}; 1 = greedy); one wider than the tokens the model can emit "
                             "(its target vocabulary less padding and BOS) is searched at that width, with a warning")
    parser.add_argument("--threads", type=positive_int, default=threads,
                        help=f"CPU threads for matrix products and row-wise work (default {threads or 'all'})")
    if length_normalization:
        parser.add_argument("--length-normalization", choices=("gnmt", "hf"), default="gnmt",
                            help="how beam search ranks finished outputs: gnmt (default): log-probability / "
                                 "((5 + length) / 6)^α, §6.1; hf: Hugging Face transformers' beam search, "
                                 "log-probability / length^α with its stopping rule (generate(num_beams=N))")
        parser.add_argument("--alpha", type=float_number, default=None,
                            help=f"the length penalty: GNMT's α, a number in [0, {ALPHA_LIMIT}] (default 0.6), or "
                                 "with --length-normalization hf transformers' length_penalty, a number in "
                                 f"[-{ALPHA_LIMIT}, {ALPHA_LIMIT}] (default 1.0)")
    else:
        parser.add_argument("--alpha", type=gnmt_alpha, default=0.6,
                            help=f"GNMT length penalty α, in [0, {ALPHA_LIMIT}] (default 0.6)")
    parser.add_argument("--device", default="cpu", choices=backend.DEVICES, help="cpu (default) or cuda")
    parser.add_argument("--tokenizer", help="the run's spm.model (default: beside the checkpoint)")


def check_precision_on_device(args):
    """A UsageError for a --precision the --device cuda GPU does not run (bf16 below sm_80), before any work."""
    from ..engine.kernels import paths

    if args.device == "cuda":
        problem = paths.precision_problem(backend.compute_capability(), args.precision, backend.device_name())
        if problem:
            raise UsageError(f"--{problem}")


def check_length_penalty(args):
    """A UsageError for an --alpha outside its normalisation's range (``length_penalties.alpha_range``)."""
    least, greatest = alpha_range(args.length_normalization)
    if args.alpha is not None and not least <= args.alpha <= greatest:
        if args.length_normalization == "gnmt":
            raise UsageError(f"--alpha {args.alpha:g}: GNMT's α must be a number in [{least}, {greatest}]"
                             + (" (negative ones: --length-normalization hf)" if args.alpha < 0 else ""))
        raise UsageError(f"--alpha {args.alpha:g}: transformers' length_penalty must be a number in "
                         f"[{least}, {greatest}]")


def fit_beam(beam, model, tokenizer, command):
    """``beam``, or the widest beam the model can use (``search.widest_beam``) with a one-line warning."""
    from ..translation.data.special import BOS_ID, EOS_ID
    from ..translation.search import widest_beam
    from .text_io import warn

    widest = widest_beam(model, getattr(tokenizer, "bos_id", BOS_ID), getattr(tokenizer, "eos_id", EOS_ID))
    if beam <= widest:
        return beam
    warn(command, f"--beam {beam:,} is wider than the {widest:,} tokens this model can emit (its target vocabulary "
                  f"less padding and BOS): searching with --beam {widest}")
    return widest


def limiting_threads(command):
    """``command`` run with at most ``args.threads`` CPU threads (BLAS and tinyformer's own; None: all)."""
    @functools.wraps(command)
    def run(args):
        from ..translation.train import blas_threads

        with blas_threads(args.threads):
            return command(args)
    return run


def add_precision_option(parser):
    parser.add_argument("--precision", default="fp32", choices=tuple(amp.PRECISIONS),
                        help="arithmetic of the matrix products and attention (default fp32); a checkpoint of "
                             "any precision loads in any other (its weights are float32)")
