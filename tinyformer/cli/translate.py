"""``tinyformer translate``: one output line per input line, and optionally their attention drawn."""

import sys
import warnings
from pathlib import Path

from ..engine import amp
from .options import (add_decoding_options, add_precision_option, check_length_penalty, check_precision_on_device,
                      fit_beam, limiting_threads, positive_int)
from .text_io import read_lines, warn, write_text
from .usage import UsageError


def register(commands):
    translate = commands.add_parser(
        "translate", help="translate lines from stdin or a file",
        description="One output line per input line (lines end at \\n); empty and whitespace-only lines "
                    "stay empty. Input is UTF-8: undecodable bytes and NUL characters become U+FFFD, "
                    "counted in a warning. Output is UTF-8.")
    translate.add_argument("--checkpoint", required=True,
                           help="a checkpoint_*.npz (or an averaged one, or a .safetensors export), or a "
                                "run directory (its newest)")
    translate.add_argument("--input", help="input file (default stdin)")
    translate.add_argument("--output", help="output file (default stdout)")
    translate.add_argument("--batch-size", type=positive_int, default=64, help="sentences per batch (default 64)")
    translate.add_argument("--max-input-tokens", type=positive_int, metavar="N",
                           help="longest input line in subword tokens (default and maximum: what the "
                                "model's positional table holds, less one for the EOS)")
    translate.add_argument("--long-lines", choices=("truncate", "refuse"), default="truncate",
                           help="a line longer than --max-input-tokens: truncate it to its first N tokens "
                                "with a warning naming the lines (default), or refuse the input with an "
                                "error naming the first such line, before translating anything")
    translate.add_argument("--plot-attention", metavar="DIR",
                           help="also draw the attention of every layer and head (needs the 'plot' extra): "
                                "one PNG per layer and kind in DIR/line<N> for input line N")
    translate.add_argument("--plot-limit", type=positive_int, default=1, metavar="N",
                           help="with --plot-attention, plot the first N non-empty lines (default 1)")
    add_decoding_options(translate, length_normalization=True)
    add_precision_option(translate)
    translate.set_defaults(run=limiting_threads(run))


def run(args):
    from ..translation.prediction import InputWarning, LongLineError, input_token_limit, translate
    from ..translation.train import load_model

    check_length_penalty(args)
    check_precision_on_device(args)
    if args.plot_attention and args.length_normalization != "gnmt" and args.beam > 1:
        raise UsageError("--plot-attention decodes with --length-normalization gnmt only: give that, or --beam 1")
    if args.plot_attention:
        from ..study import viz

        viz.require_matplotlib()  # before translating a whole file, not after
    # Files are checked before the model is loaded; stdin is read after, so that a bad checkpoint
    # is reported at once instead of after the input ends.
    if args.input not in (None, "-") and not Path(args.input).is_file():
        problem = "not a file" if Path(args.input).exists() else "no such file"
        raise FileNotFoundError(f"--input {args.input}: {problem}")
    if args.output not in (None, "-") and not Path(args.output).resolve().parent.is_dir():
        raise FileNotFoundError(f"--output {args.output}: the directory {Path(args.output).parent} does not exist")
    model, tokenizer, _ = load_model(args.checkpoint, args.device, args.tokenizer)
    args.beam = fit_beam(args.beam, model, tokenizer, args.command)
    limit = input_token_limit(model)
    if args.max_input_tokens is not None and limit is not None and args.max_input_tokens > limit:
        raise UsageError(f"--max-input-tokens {args.max_input_tokens} is more than this model can encode: "
                         f"{limit} tokens and the EOS (positional max_len {limit + 1})")
    lines = read_lines(args.input, "input", args.command)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        try:
            with amp.autocast(args.precision):
                outputs = translate(model, tokenizer, lines, beam_size=args.beam, alpha=args.alpha,
                                    batch_size=args.batch_size, max_input_tokens=args.max_input_tokens,
                                    long_lines=args.long_lines, length_normalization=args.length_normalization)
        except LongLineError as error:
            source = "<stdin>" if args.input in (None, "-") else args.input
            raise ValueError(f"{source}, line {error.line}: {error.tokens:,} tokens, more than "
                             f"--max-input-tokens {error.limit} (--long-lines refuse; nothing was "
                             "translated)") from None
    for warning in caught:
        if issubclass(warning.category, InputWarning):
            warn(args.command, f"{warning.message} (--long-lines refuse makes this an error)")
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    write_text("".join(o + "\n" for o in outputs), args.output)
    if args.plot_attention:
        _plot_attention(model, tokenizer, lines, args)
    return 0


def _plot_attention(model, tokenizer, lines, args):
    """Heatmaps of the first --plot-limit non-empty lines, each in DIR/line<N> (N: its line number)."""
    from ..study import viz

    from ..translation.prediction import input_token_limit

    limit = args.max_input_tokens or input_token_limit(model)
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()][:args.plot_limit]
    for n, line in numbered:
        if limit is not None and len(tokenizer.encode(line.strip())) > limit:
            warn(args.command, f"line {n} not plotted: longer than {limit} tokens")
            continue
        folder = Path(args.plot_attention) / f"line{n}"
        alpha = 0.6 if args.alpha is None else args.alpha  # gnmt's (hf with --beam > 1 is refused in run)
        _, paths = viz.plot_attention(model, tokenizer, line, folder, beam_size=args.beam, alpha=alpha)
        print(f"tinyformer {args.command}: attention of line {n}: {len(paths)} figures in {folder}",
              file=sys.stderr)
