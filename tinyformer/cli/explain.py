"""``tinyformer explain``: one offline HTML page of a sentence's attention and its gradients, for one
checkpoint or the checkpoints of a run."""

import argparse
import sys
import time
from pathlib import Path

from .options import add_decoding_options, fit_beam, positive_int
from .text_io import plural, read_lines, write_text
from .usage import UsageError


def _numbers(least, what):
    """An argparse type: comma-separated whole numbers, each at least ``least`` (``what`` in errors)."""
    def parse(text):
        try:
            numbers = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            numbers = []
        if not numbers or min(numbers) < least:
            raise argparse.ArgumentTypeError(f"must be comma-separated {what}, got {text!r}")
        return numbers
    return parse


_token_list = _numbers(1, "positive integers")  # --tokens: target positions, 1 for the first target token
_step_list = _numbers(0, "steps (whole numbers)")  # --steps: training steps, 0 for the untrained model


def register(commands):
    explain = commands.add_parser(
        "explain", help="one offline HTML page: a sentence's attention and its gradients, checked",
        description="Write one self-contained HTML page (no request, no network) for one sentence pair, the "
                    "model's translation or --reference teacher-forced: every layer and head's attention P, "
                    "dL/dP and dL/dS, per-token gradients, saliency, head sensitivity, rollout, a gradient "
                    "check on this sentence and attention's backward with its numbers.")
    which = explain.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint",
                       help="a checkpoint_*.npz (or an averaged one, or a .safetensors export), or a "
                            "run directory (its newest)")
    which.add_argument("--checkpoints", metavar="RUN_DIR",
                       help="... or the checkpoints of one run, on one page with a step slider (with --every or "
                            "--steps, some of them)")
    explain.add_argument("--every", type=positive_int, metavar="K",
                         help="with --checkpoints: the checkpoints whose step is a multiple of K")
    explain.add_argument("--steps", type=_step_list, metavar="A,B,...",
                         help="with --checkpoints: the checkpoints of these steps")
    explain.add_argument("--source", metavar="TEXT", help="the source sentence")
    explain.add_argument("--input", metavar="FILE", help="... or a file of sentences (with --line)")
    explain.add_argument("--line", type=positive_int, metavar="N", help="which line of --input (default 1)")
    explain.add_argument("--reference", metavar="TEXT",
                         help="teacher-force this translation (default: the model's own, by --beam)")
    explain.add_argument("--output", required=True, metavar="PAGE", help="the HTML file to write")
    explain.add_argument("--tokens", type=_token_list, metavar="T1,T2,...",
                         help="target positions (1 = the first target token) whose own dL/dP and dL/dS the "
                              "page holds (default: all, or the first whose 900,000 numbers fit)")
    add_decoding_options(explain, threads=1)  # one sentence's matrices are too small for more
    explain.set_defaults(run=run)


def run(args):
    from ..study import viz
    from ..translation.train import load_model

    if (args.source is None) == (args.input is None):
        raise UsageError("give the sentence as --source TEXT or as --input FILE --line N (one of them)")
    if args.line is not None and args.input is None:
        raise UsageError("--line goes with --input FILE")
    if args.source is not None and not args.source.strip():
        raise UsageError("--source is empty")
    if args.reference is not None and not args.reference.strip():
        raise UsageError("--reference is empty")
    if not Path(args.output).resolve().parent.is_dir():
        raise FileNotFoundError(f"--output {args.output}: the directory {Path(args.output).parent} does not exist")
    if args.input is not None:
        if not Path(args.input).is_file():
            problem = "not a file" if Path(args.input).exists() else "no such file"
            raise FileNotFoundError(f"--input {args.input}: {problem}")
        lines, line = read_lines(args.input, "input", args.command), args.line or 1
        if line > len(lines):
            raise ValueError(f"--input {args.input} has {plural(len(lines), 'line')}; there is no --line {line}")
        source, name = lines[line - 1], f"--input {args.input}, line {line},"
    else:
        source, name = args.source, "--source"
    options = dict(beam_size=args.beam, alpha=args.alpha, tokens=args.tokens, names=(name, "--reference"),
                   threads=args.threads)
    if args.checkpoints is None:
        if args.every is not None or args.steps is not None:
            raise UsageError("--every and --steps go with --checkpoints RUN_DIR")
        model, tokenizer, _ = load_model(args.checkpoint, args.device, args.tokenizer)
        options["beam_size"] = fit_beam(args.beam, model, tokenizer, args.command)
        start = time.perf_counter()
        page = viz.explain(model, tokenizer, source, args.reference, **options)
    else:
        steps, tokenizer = _run_checkpoints(args, load_model)
        options["beam_size"] = fit_beam(args.beam, steps[-1][2], tokenizer, args.command)
        start = time.perf_counter()
        page = viz.explain_steps(steps, tokenizer, source, args.reference, **options)
    write_text(page, args.output)
    print(f"tinyformer {args.command}: wrote {args.output} ({len(page.encode('utf-8')) / 2 ** 20:.1f} MiB) in "
          f"{time.perf_counter() - start:.1f} s; open it in a browser (it makes no request)", file=sys.stderr)
    return 0


def _run_checkpoints(args, load_model):
    """[(step, file name, model)] of --checkpoints RUN_DIR (all, --every K or --steps a,b,c) and the
    run's tokenizer; checkpoints of another run (another tokenizer or model) are refused by name."""
    from ..translation.checkpoint import CheckpointError, list_checkpoints, step_of
    from ..translation.train.migration import migrate

    directory = Path(args.checkpoints)
    if args.every is not None and args.steps is not None:
        raise UsageError("--every and --steps: give one of them")
    if not directory.is_dir():
        raise FileNotFoundError(f"--checkpoints {directory}: not a directory (give the run's directory)")
    found = {step_of(path): path for path in list_checkpoints(directory)}
    if not found:
        raise FileNotFoundError(f"--checkpoints {directory}: no checkpoint_*.npz in it")
    if args.steps is not None:
        missing = [s for s in args.steps if s not in found]
        if missing:
            raise ValueError(f"--steps {missing[0]}: no checkpoint of step {missing[0]} in {directory} (its steps: "
                             f"{', '.join(map(str, sorted(found)))})")
        chosen = sorted(set(args.steps))
    elif args.every is not None:
        chosen = [s for s in sorted(found) if s % args.every == 0]
        if not chosen:
            raise ValueError(f"--every {args.every}: no checkpoint in {directory} has a step that is a multiple of "
                             f"{args.every} (its steps: {', '.join(map(str, sorted(found)))})")
    else:
        chosen = sorted(found)
    steps, tokenizer, reference = [], None, None
    for step in chosen:
        path = found[step]
        try:
            model, loaded, meta = load_model(path, args.device, args.tokenizer)
        except CheckpointError as error:
            raise CheckpointError(f"--checkpoints {directory}: {error}") from None
        if reference is None:
            reference, tokenizer = (path, meta), loaded
        elif meta.get("tokenizer_sha256") != reference[1].get("tokenizer_sha256"):
            raise CheckpointError(f"--checkpoints {directory}: {path.name} was trained with another tokenizer than "
                                  f"{reference[0].name}: not one run")
        elif migrate(meta, path)["model_config"] != migrate(reference[1], reference[0])["model_config"]:
            raise CheckpointError(f"--checkpoints {directory}: {path.name} has another model than "
                                  f"{reference[0].name}: not one run")
        steps.append((step, path.name, model))
    return steps, tokenizer
