"""The ``tinyformer`` command line: train, translate, eval, average, gradcheck, plot, explain, study, info.

Usage errors exit with status 2 and one line on stderr; failures at run time
(missing data, a bad checkpoint) with status 1 and one line; no tracebacks
(set ``TINYFORMER_DEBUG=1`` to see them).
"""

import argparse
import functools
import os
import re
import sys
import time
import warnings
from pathlib import Path

import numpy

from ..common.version import __version__
from ..engine import amp, backend
from ..common.validation import check_int, check_real


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exit status 2); under an MPI launch
    only rank 0 says it, since every rank parses the same arguments."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n" if _first_rank() else None)


def _first_rank():
    """False in the ranks other than 0 of an MPI launch (told by the environment)."""
    from ..translation.distributed.launch import environment_rank

    return environment_rank() in (None, 0)


class UsageError(Exception):
    """Arguments that parse but do not make sense together: exit status 2."""


# ------------------------------------------------------------------ argument types (bad values: exit 2)
def _checked(kind, check):
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


_positive_int = _checked(int, functools.partial(check_int, minimum=1))
_non_negative_float = _checked(float, functools.partial(check_real, minimum=0))


# ------------------------------------------------------------------ info
def _info(args):
    print(f"tinyformer {__version__}")
    print(f"numpy {numpy.__version__}")
    print(f"GPU available (cupy.is_available()): {backend.is_gpu_available()}")
    from ..engine.kernels import toolchain

    print(f"CUDA kernels: {'on' if os.environ.get('TINYFORMER_KERNELS', '1') != '0' else 'off (TINYFORMER_KERNELS=0)'}"
          f" for CuPy arrays; NVRTC for compile checks: {toolchain.find_nvrtc() or 'not installed'}")
    return 0


# ------------------------------------------------------------------ train
def _train(args):
    from ..translation.train import Trainer, evaluate, load_corpus
    from ..translation.train.config import OPTIONS, ConfigError, TrainConfig

    given = {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None}
    from ..translation.distributed.launch import launched_by_mpi, run_under_mpiexec

    try:
        config = _resumed_config(given) if args.resume else TrainConfig(**given)
        config.resolved()
    except ConfigError as error:
        raise UsageError(_flag_wording(error)) from None
    if (config.nproc or 1) > 1 and not launched_by_mpi():
        return run_under_mpiexec(config.nproc, args.argv)  # the same command, as nproc ranks
    try:
        trainer = Trainer(config, resume=args.resume, progress=not args.no_progress)
    except ConfigError as error:
        raise UsageError(_flag_wording(error)) from None
    trainer.run()
    if not trainer.lead:  # rank 0 tells where the run is and evaluates it
        return 0
    print(f"checkpoints, tokenizer and metrics.jsonl are in {trainer.save_dir}")
    if args.no_test:
        return 0
    if trainer.config.data == "files" and trainer.config.test_data is None:
        print("no --test corpus was given: no test evaluation")
        return 0
    sources, references = load_corpus(trainer.config, "test")
    with amp.autocast(trainer.config.precision):
        result = evaluate(trainer.model, trainer.tokenizer, sources, references,
                          trainer.config.beam_size, trainer.config.alpha)
    _print_evaluation(result, sources, references, "test")
    trainer.log({"step": trainer.step, "split": "test", **{k: v for k, v in result.items() if k != "hypotheses"}})
    return 0


def _resumed_config(given):
    """The config saved in the run's newest checkpoint, with the given options that --resume may
    change applied; the others may only repeat the saved values."""
    from ..translation.train.config import OPTIONS, RESUMABLE, flag_of

    config = _saved_config(Path(given.get("save_dir") or _default_save_dir(given)))

    def as_saved(name, value):  # a relative corpus path given again names the saved absolute one
        check = OPTIONS[name].check
        try:
            return check(name, value) if check else value
        except ValueError:
            return value

    changed = [flag_of(name) for name, value in given.items()
               if name not in RESUMABLE and as_saved(name, value) != getattr(config, name)]
    if changed:
        raise UsageError(f"--resume continues the saved run: {', '.join(changed)} cannot change (only "
                         f"{', '.join(_resumable_flags())} can)")
    for name, value in given.items():
        setattr(config, name, value)
    return config


def _resumable_flags():
    from ..translation.train.config import RESUMABLE, flag_of

    return sorted(flag_of(name) for name in RESUMABLE)


def _flag_wording(error):
    """A TrainConfig's ConfigError in the command line's words: the flag where it names the field."""
    from ..translation.train.config import flag_of

    message, flag = str(error), flag_of(error.field)
    return flag + message[len(error.field):] if flag and message.startswith(error.field) else message


def _default_save_dir(given):
    from ..translation.train.config import default_save_dir

    data = given.get("data") or ("files" if given.get("train_data") else "synthetic")
    return default_save_dir(data, given.get("preset"))


def _saved_config(save_dir):
    from ..translation import checkpoint
    from ..translation.train import TrainConfig

    paths = checkpoint.list_checkpoints(save_dir)
    if not paths:
        raise FileNotFoundError(f"--resume: no checkpoint_*.npz in {save_dir}")
    _, meta, _ = checkpoint.load_checkpoint(paths[-1])
    return TrainConfig.from_dict(meta["config"], meta.get("model_config"))


def _add_train_options(parser):
    """One option per TrainConfig field that has a flag: its type, check and help (with the real
    default) come from the field's declaration."""
    from ..translation.train.config import DEFAULTS, OPTIONS, flag_of

    for name, option in OPTIONS.items():
        if not flag_of(name):
            continue
        help_text = _option_help(option, DEFAULTS[name]).replace("%", "%%")
        if option.kind is bool:  # a switch: given means True
            parser.add_argument(flag_of(name), dest=name, action="store_const", const=True, default=None,
                                help=help_text)
        else:
            kind = str if option.kind is str else _checked(option.kind, option.check)
            parser.add_argument(flag_of(name), dest=name, type=kind, default=None, help=help_text)


def _option_help(option, default):
    """The field's help text with the values it takes and its default: "... (default 1)",
    "... (default 600 for synthetic, 8000 for multi30k)", "... (default: no clipping)"."""
    def shown(value):
        return option.unset if value is None else str(value)

    notes = []
    if isinstance(option.choices, dict):
        notes.append("; ".join(f"{', '.join(values) if values else 'any language code'} for {data}"
                               for data, values in option.choices.items()))
    elif option.choices:
        notes.append(", ".join(option.choices))
    if option.per_data:
        notes.append("default " + ", ".join(f"{shown(v)} for {data}" for data, v in option.per_data.items()))
    else:
        notes.append(f"default: {option.unset}" if default is None else f"default {default}")
    return f"{option.help} ({'; '.join(notes)})"


def _print_evaluation(result, sources, references, split, samples=3):
    for source, reference, hypothesis in list(zip(sources, references, result["hypotheses"]))[:samples]:
        print(f"  source:     {source}\n  reference:  {reference}\n  hypothesis: {hypothesis}")
    print(f"{split}: BLEU {result['bleu']:.2f}  ({result['signature']})")
    print(f"{split}: tokenized lowercased BLEU {result['tokenized_bleu']:.2f}  ({result['tokenized_signature']})")
    print(f"{split}: exact match {result['exact_match']:.1%} of {result['sentences']} sentences")


# ------------------------------------------------------------------ translate
# Bytes that are not UTF-8 (escaped to lone surrogates by "surrogateescape") and NUL characters.
_UNREADABLE = re.compile("[\udc80-\udcff\x00]")


def _plural(count, word):
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _split_lines(data):
    """(lines, replaced, line numbers) of raw bytes: lines end at b"\\n" (a final one ends the last
    line; a "\\r" before it is dropped); bytes that are not UTF-8 and NUL characters become U+FFFD,
    ``replaced`` of them on the lines numbered (from 1) in the third item."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    lines, replaced, where = [], 0, []
    for number, raw in enumerate(parts, 1):
        text, count = _UNREADABLE.subn("\ufffd", raw.removesuffix(b"\r").decode("utf-8", "surrogateescape"))
        if count:
            replaced += count
            where.append(number)
        lines.append(text)
    return lines, replaced, where


def _read_lines(path, what, command):
    """The lines of a file (or stdin for None or "-"), warning on stderr about replaced bytes."""
    if path in (None, "-"):
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        path = "<stdin>"
    else:
        data = Path(path).read_bytes()
    lines, replaced, where = _split_lines(data)
    if replaced:
        from ..translation.decode import line_list

        _warn(command, f"{what} {path}: replaced {_plural(replaced, 'undecodable byte')} / NUL characters by U+FFFD "
              f"on {_plural(len(where), 'line')} ({line_list(where)})")
    return lines


def _warn(command, message):
    print(f"tinyformer {command}: warning: {message}", file=sys.stderr)


def _write_text(text, path):
    """UTF-8 to a file (replaced whole: an interrupted write leaves the old one), or to stdout for None
    or "-" (whatever the locale's encoding)."""
    from ..common.atomic import write_atomically

    data = text.encode("utf-8")
    if path not in (None, "-"):
        target = Path(path)
        if target.exists() and not target.is_file():  # /dev/stdout, a pipe: written, never replaced
            target.write_bytes(data)
        else:
            write_atomically(target, data)
        return
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    buffer.write(data)
    buffer.flush()


def _translate(args):
    from ..translation.decode import InputWarning, LongLineError, input_token_limit, translate
    from ..translation.train import load_model

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
    limit = input_token_limit(model)
    if args.max_input_tokens is not None and limit is not None and args.max_input_tokens > limit:
        raise UsageError(f"--max-input-tokens {args.max_input_tokens} is more than this model can encode: "
                         f"{limit} tokens and the EOS (positional max_len {limit + 1})")
    lines = _read_lines(args.input, "input", args.command)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        try:
            with amp.autocast(args.precision):
                outputs = translate(model, tokenizer, lines, beam_size=args.beam, alpha=args.alpha,
                                    batch_size=args.batch_size, max_input_tokens=args.max_input_tokens,
                                    long_lines=args.long_lines)
        except LongLineError as error:
            source = "<stdin>" if args.input in (None, "-") else args.input
            raise ValueError(f"{source}, line {error.line}: {error.tokens:,} tokens, more than "
                             f"--max-input-tokens {error.limit} (--long-lines refuse; nothing was "
                             "translated)") from None
    for warning in caught:
        if issubclass(warning.category, InputWarning):
            _warn(args.command, f"{warning.message} (--long-lines refuse makes this an error)")
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    _write_text("".join(o + "\n" for o in outputs), args.output)
    if args.plot_attention:
        _plot_attention(model, tokenizer, lines, args)
    return 0


def _plot_attention(model, tokenizer, lines, args):
    """Heatmaps of the first --plot-limit non-empty lines, each in DIR/line<N> (N: its line number)."""
    from ..study import viz

    from ..translation.decode import input_token_limit

    limit = args.max_input_tokens or input_token_limit(model)
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()][:args.plot_limit]
    for n, line in numbered:
        if limit is not None and len(tokenizer.encode(line.strip())) > limit:
            _warn(args.command, f"line {n} not plotted: longer than {limit} tokens")
            continue
        folder = Path(args.plot_attention) / f"line{n}"
        _, paths = viz.plot_attention(model, tokenizer, line, folder, beam_size=args.beam, alpha=args.alpha)
        print(f"attention of line {n}: {len(paths)} figures in {folder}", file=sys.stderr)


# ------------------------------------------------------------------ eval
def _eval(args):
    from ..translation import metrics

    if args.hypotheses:
        if args.checkpoint or not args.references:
            raise UsageError("--hypotheses needs --references (and no --checkpoint)")
        hypotheses = _read_lines(args.hypotheses, "--hypotheses", args.command)
        references = _read_lines(args.references, "--references", args.command)
        bleu = metrics.corpus_bleu(hypotheses, references)
        tokenized = metrics.tokenized_bleu(hypotheses, references)
        print(f"BLEU {bleu.score:.2f}  ({bleu.signature})")
        print(f"tokenized lowercased BLEU {tokenized.score:.2f}  ({tokenized.signature})")
        return 0
    if not args.checkpoint:
        raise UsageError("give --checkpoint (translate and score a split) or --hypotheses/--references")
    from ..translation.train import TrainConfig, evaluate, load_corpus, load_model

    model, tokenizer, meta = load_model(args.checkpoint, args.device, args.tokenizer)
    config = TrainConfig.from_dict(meta["config"])
    if args.data_dir:
        config.data_dir = args.data_dir
    sources, references = load_corpus(config, args.split)
    if args.limit:
        sources, references = sources[:args.limit], references[:args.limit]
    with amp.autocast(args.precision):
        result = evaluate(model, tokenizer, sources, references, args.beam, args.alpha)
    _print_evaluation(result, sources, references, args.split)
    return 0


# ------------------------------------------------------------------ average
def _average(args):
    from ..translation import checkpoint
    from ..translation.train.config import TRAINING_ONLY

    if args.checkpoints and args.dir:
        raise UsageError("give either checkpoint files or --dir, not both")
    if args.dir:
        paths = checkpoint.list_checkpoints(args.dir)[-args.last:]
        if not paths:
            raise FileNotFoundError(f"no checkpoint_*.npz in {args.dir}")
    elif args.checkpoints:
        paths = args.checkpoints
    else:
        raise UsageError("give checkpoint files or --dir DIR")
    out = checkpoint.average_checkpoints(paths, args.output, ignore=TRAINING_ONLY)
    print(f"averaged {len(paths)} checkpoints ({', '.join(Path(p).name for p in paths)}) into {out}")
    return 0


# ------------------------------------------------------------------ gradcheck
def _gradcheck(args):
    from ..study import gradcheck_suite as suite

    if args.device == "cuda" and not backend.is_gpu_available():
        raise UsageError("--device cuda: no usable GPU (cupy.is_available() is false); install the 'gpu' "
                         "extra on a machine with a CUDA driver, or use --device cpu")
    valid = ["all", *suite.CASES, *suite.KERNEL_CASES]
    selected = []
    for name in (part.strip() for part in args.layer.split(",")):
        if name not in valid:
            raise UsageError(f"unknown --layer {name!r}; valid names: {', '.join(valid)}")
        selected += suite.names(args.device) if name == "all" else [name]
    print(f"gradcheck: mode {args.mode}, device {args.device}; {suite.TOLERANCE_NOTE}")
    start = time.perf_counter()
    rows = suite.run(dict.fromkeys(selected), args.mode, args.device)
    print(suite.format_table(rows))
    if any(r.name in suite.KERNEL_CASES for r in rows):
        print(suite.KERNEL_TOLERANCE_NOTE)
    failed = sum(not r.passed for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


# ------------------------------------------------------------------ plot
_SCHEDULE_DEFAULTS = {"d_model": 512, "warmup": 4000, "steps": 20000}


def _plot(args):
    from ..study import viz

    schedule_options = [f"--{k.replace('_', '-')}" for k in _SCHEDULE_DEFAULTS if getattr(args, k) is not None]
    if args.what == "schedule":
        options = {k: default if getattr(args, k) is None else getattr(args, k)
                   for k, default in _SCHEDULE_DEFAULTS.items()}
        path = viz.plot_schedule(args.output or "schedule.png", options["d_model"], options["warmup"],
                                 options["steps"])
    elif schedule_options:
        verb = "apply" if len(schedule_options) > 1 else "applies"
        raise UsageError(f"{', '.join(schedule_options)} only {verb} to `tinyformer plot schedule`, not to a log")
    else:
        path = viz.plot_curves(args.what, args.output or "curves.png")
    print(f"wrote {path}")
    return 0


# ------------------------------------------------------------------ explain
def _run_checkpoints(args, load_model):
    """[(step, file name, model)] of --checkpoints RUN_DIR (all, --every K or --steps a,b,c) and the
    run's tokenizer; checkpoints of another run (another tokenizer or model) are refused by name."""
    from ..translation.checkpoint import CheckpointError, list_checkpoints, step_of

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
        elif meta.get("model_config") != reference[1].get("model_config"):
            raise CheckpointError(f"--checkpoints {directory}: {path.name} has another model than "
                                  f"{reference[0].name}: not one run")
        steps.append((step, path.name, model))
    return steps, tokenizer


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


def _explain(args):
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
            raise FileNotFoundError(f"--input {args.input}: {'not a file' if Path(args.input).exists() else 'no such file'}")
        lines, line = _read_lines(args.input, "input", args.command), args.line or 1
        if line > len(lines):
            raise ValueError(f"--input {args.input} has {_plural(len(lines), 'line')}; there is no --line {line}")
        source, name = lines[line - 1], f"--input {args.input}, line {line},"
    else:
        source, name = args.source, "--source"
    options = dict(beam_size=args.beam, alpha=args.alpha, tokens=args.tokens, names=(name, "--reference"),
                   threads=args.threads)
    if args.checkpoints is None:
        if args.every is not None or args.steps is not None:
            raise UsageError("--every and --steps go with --checkpoints RUN_DIR")
        model, tokenizer, _ = load_model(args.checkpoint, args.device, args.tokenizer)
        start = time.perf_counter()
        page = viz.explain(model, tokenizer, source, args.reference, **options)
    else:
        steps, tokenizer = _run_checkpoints(args, load_model)
        start = time.perf_counter()
        page = viz.explain_steps(steps, tokenizer, source, args.reference, **options)
    _write_text(page, args.output)
    print(f"wrote {args.output} ({len(page.encode('utf-8')) / 2 ** 20:.1f} MiB) in {time.perf_counter() - start:.1f} s; "
          "open it in a browser (it makes no request)", file=sys.stderr)
    return 0


# ------------------------------------------------------------------ study
def _exercise_number(text):
    """An argparse type: an exercise number of `tinyformer study` (1 to the number of exercises)."""
    from ..study.course import EXERCISES

    try:
        number = int(text)
    except ValueError:
        number = None
    if number is None or not 1 <= number <= len(EXERCISES):
        raise argparse.ArgumentTypeError(f"must be an exercise number from 1 to {len(EXERCISES)} (tinyformer study "
                                         f"lists them), got {text!r}")
    return number


def _study(args):
    from ..study import course as study

    if args.action is None:
        print("tinyformer study: backpropagation by hand. Each exercise gives a forward pass in NumPy; you write "
              "its backward, and the checker compares it with tinyformer's own and with central differences, and "
              "tells you where it is wrong.")
        print()
        width = max(len(e.title) for e in study.EXERCISES)
        for e in study.EXERCISES:
            print(f"  {e.number}  {e.title:<{width}}  {e.summary}")
        print()
        print("start one:  tinyformer study start N [DIR]    (writes DIR/NN_name.py; DIR defaults to .)")
        print("check it:   tinyformer study check FILE         (then it trains a model with your backward)")
        return 0
    if args.action == "start":
        path = study.write_exercise(args.number, args.directory)
        item = study.exercise(args.number)
        print(f"wrote {path}: exercise {item.number}, {item.summary}")
        print(f"write backward() in it, then check it with:\n  tinyformer study check {path}")
        return 0
    try:
        report = study.check(args.file)
    except study.ExerciseFileError as error:
        raise UsageError(str(error)) from None
    print("\n".join(report.lines()))
    if not report.passed:
        return 1
    return _study_training(report, args)


def _study_training(report, args):
    """The passing backward swapped into a real model, which trains (swap.train), unless --no-train."""
    from ..study.course import EXERCISES, swap

    item = report.exercise
    following = (f"next: tinyformer study start {item.number + 1}" if item.number < len(EXERCISES)
                 else "that was the last exercise")
    if item.model_op is None:
        print(f"exercise {item.number} has no op in the model (its graph exists only here): no training run. "
              f"{following}")
        return 0
    if args.no_train:
        print(f"(--no-train: your backward was not tried inside a model.) {following}")
        return 0
    print(f"now inside a real model: {item.model_op} runs your backward while `tiny` trains {args.steps} steps on "
          "the built-in synthetic task (one BLAS thread)")
    try:
        proof = swap.train(item.number, report.module, steps=args.steps)
    except Exception as error:  # the reader's code, inside the model
        print(f"inside the model your backward failed: {type(error).__name__}: {str(error).strip().splitlines()[0]} "
              "(tinyformer's own backward is back in place)")
        return 1
    trend = "falling" if proof.falling else "NOT falling"
    print(f"loss {proof.first:.3f} at step 1 → {proof.last:.3f} at step {len(proof.losses)}, {trend}, with your "
          f"backward called {proof.calls:,} times; tinyformer's own backward is back in place.")
    if not proof.falling:
        print("a backward that passes the checker should train: tell tinyformer's authors how this one did not")
        return 1
    print(following)
    return 0


# ------------------------------------------------------------------ parser
def _add_decoding_options(parser, beam=4, threads=None):
    parser.add_argument("--beam", type=_positive_int, default=beam, help=f"beam size (default {beam}; 1 = greedy)")
    parser.add_argument("--threads", type=_positive_int, default=threads,
                        help=f"CPU threads for matrix products and row-wise work (default {threads or 'all'})")
    parser.add_argument("--alpha", type=_non_negative_float, default=0.6, help="GNMT length penalty α (default 0.6)")
    parser.add_argument("--device", default="cpu", choices=backend.DEVICES, help="cpu (default) or cuda")
    parser.add_argument("--tokenizer", help="the run's spm.model (default: beside the checkpoint)")


def _limiting_threads(command):
    """``command`` run with at most ``args.threads`` CPU threads (BLAS and tinyformer's own; None: all)."""
    @functools.wraps(command)
    def run(args):
        from ..translation.train import blas_threads

        with blas_threads(args.threads):
            return command(args)
    return run


def _add_precision_option(parser):
    parser.add_argument("--precision", default="fp32", choices=tuple(amp.PRECISIONS),
                        help="arithmetic of the matrix products and attention (default fp32); a checkpoint of "
                             "any precision loads in any other (its weights are float32)")


def build_parser():
    parser = _Parser(prog="tinyformer", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tinyformer {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    info = commands.add_parser("info", help="versions and whether a GPU is usable")
    info.set_defaults(run=_info)

    train = commands.add_parser(
        "train", help="train a translation model (default: `tiny` on the built-in task, on the CPU)",
        description="Train a Transformer with the paper's recipe; with no options, `tiny` on the "
                    "built-in synthetic English-German task, then evaluate it on its test split.")
    _add_train_options(train)
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --save-dir from its newest checkpoint, exactly; only "
                            f"{', '.join(_resumable_flags())} may change")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--no-test", action="store_true", help="skip the final test-set evaluation")
    train.set_defaults(run=_train)

    translate = commands.add_parser(
        "translate", help="translate lines from stdin or a file",
        description="One output line per input line (lines end at \\n); empty and whitespace-only lines "
                    "stay empty. Input is UTF-8: undecodable bytes and NUL characters become U+FFFD, "
                    "counted in a warning. Output is UTF-8.")
    translate.add_argument("--checkpoint", required=True, help="a checkpoint_*.npz (or an averaged one)")
    translate.add_argument("--input", help="input file (default stdin)")
    translate.add_argument("--output", help="output file (default stdout)")
    translate.add_argument("--batch-size", type=_positive_int, default=64, help="sentences per batch (default 64)")
    translate.add_argument("--max-input-tokens", type=_positive_int, metavar="N",
                           help="longest input line in subword tokens (default and maximum: what the "
                                "model's positional table holds, less one for the EOS)")
    translate.add_argument("--long-lines", choices=("truncate", "refuse"), default="truncate",
                           help="a line longer than --max-input-tokens: truncate it to its first N tokens "
                                "with a warning naming the lines (default), or refuse the input with an "
                                "error naming the first such line, before translating anything")
    translate.add_argument("--plot-attention", metavar="DIR",
                           help="also draw the attention of every layer and head (needs the 'plot' extra): "
                                "one PNG per layer and kind in DIR/line<N> for input line N")
    translate.add_argument("--plot-limit", type=_positive_int, default=1, metavar="N",
                           help="with --plot-attention, plot the first N non-empty lines (default 1)")
    _add_decoding_options(translate)
    _add_precision_option(translate)
    translate.set_defaults(run=_limiting_threads(_translate))

    evaluate = commands.add_parser("eval", help="BLEU of a checkpoint on a split, or of two files",
                                   description="sacreBLEU (cased, detokenized, 13a) and tokenized "
                                               "lowercased BLEU.")
    evaluate.add_argument("--checkpoint", help="translate the split with this checkpoint")
    evaluate.add_argument("--split", default="test", choices=("train", "val", "test"),
                          help="which split of the run's data (default test; Multi30k: test_2016_flickr)")
    evaluate.add_argument("--data-dir", help="where the Multi30k files are")
    evaluate.add_argument("--limit", type=_positive_int, help="only the first N sentences")
    evaluate.add_argument("--hypotheses", help="score this file of translations instead ...")
    evaluate.add_argument("--references", help="... against this file of references")
    _add_decoding_options(evaluate)
    _add_precision_option(evaluate)
    evaluate.set_defaults(run=_limiting_threads(_eval))

    average = commands.add_parser("average", help="average checkpoints into one (§6.1)")
    average.add_argument("checkpoints", nargs="*", help="checkpoint files to average")
    average.add_argument("--dir", help="average the newest --last checkpoints of this run directory")
    average.add_argument("--last", type=_positive_int, default=5, help="how many (default 5)")
    average.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    average.set_defaults(run=_average)

    check = commands.add_parser(
        "gradcheck", help="gradient-check every fused op and layer (and, on cuda, every kernel)",
        description="Check each fused op and layer's backward against central differences on random "
                    "float64 inputs, one row each; exit status 1 if any fails. With --device cuda the "
                    "checks run on CuPy arrays and every CUDA kernel is also compared with its NumPy "
                    "reference (kernel_* rows).")
    check.add_argument("--layer", default="all", metavar="NAME",
                       help="a case name, a comma-separated list, or all (default); an unknown name "
                            "lists the valid ones. kernel_* names on --device cpu run the kernel source "
                            "through the C++ emulation (needs g++)")
    check.add_argument("--mode", default="full", choices=("full", "fast"),
                       help="full: every element by central differences (default); fast: one random "
                            "direction per input")
    check.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu (default) or cuda")
    check.set_defaults(run=_gradcheck)

    explain = commands.add_parser(
        "explain", help="one offline HTML page: a sentence's attention and its gradients, checked",
        description="Write one self-contained HTML page (no request, no network) for one sentence pair, the "
                    "model's translation or --reference teacher-forced: every layer and head's attention P, "
                    "dL/dP and dL/dS, per-token gradients, saliency, head sensitivity, rollout, a gradient "
                    "check on this sentence and attention's backward with its numbers.")
    which = explain.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", help="a checkpoint_*.npz (or an averaged one)")
    which.add_argument("--checkpoints", metavar="RUN_DIR",
                       help="... or the checkpoints of one run, on one page with a step slider (with --every or "
                            "--steps, some of them)")
    explain.add_argument("--every", type=_positive_int, metavar="K",
                         help="with --checkpoints: the checkpoints whose step is a multiple of K")
    explain.add_argument("--steps", type=_step_list, metavar="A,B,...",
                         help="with --checkpoints: the checkpoints of these steps")
    explain.add_argument("--source", metavar="TEXT", help="the source sentence")
    explain.add_argument("--input", metavar="FILE", help="... or a file of sentences (with --line)")
    explain.add_argument("--line", type=_positive_int, metavar="N", help="which line of --input (default 1)")
    explain.add_argument("--reference", metavar="TEXT",
                         help="teacher-force this translation (default: the model's own, by --beam)")
    explain.add_argument("--output", required=True, metavar="PAGE", help="the HTML file to write")
    explain.add_argument("--tokens", type=_token_list, metavar="T1,T2,...",
                         help="target positions (1 = the first target token) whose own dL/dP and dL/dS the "
                              "page holds (default: all, or the first whose 900,000 numbers fit)")
    _add_decoding_options(explain, threads=1)  # one sentence's matrices are too small for more
    explain.set_defaults(run=_explain)

    plot = commands.add_parser(
        "plot", help="plot the learning-rate schedule or a run's training curves (needs the 'plot' extra)",
        description="`tinyformer plot schedule` draws the learning rate of §5.3; `tinyformer plot LOG` "
                    "draws the curves of a metrics.jsonl written by `tinyformer train`.")
    plot.add_argument("what", metavar="schedule|LOG", help="`schedule`, or a metrics.jsonl file")
    plot.add_argument("--d-model", dest="d_model", type=_positive_int, help="schedule: d_model (default 512)")
    plot.add_argument("--warmup", type=_positive_int, help="schedule: warm-up steps (default 4000)")
    plot.add_argument("--steps", type=_positive_int, help="schedule: steps to draw (default 20000)")
    plot.add_argument("--output", help="the PNG to write (default schedule.png or curves.png)")
    plot.set_defaults(run=_plot)

    study = commands.add_parser(
        "study", help="exercises: write the backward of softmax, layer norm, attention ... yourself, checked",
        description="Backpropagation by hand. `tinyformer study` lists the exercises; `start N [DIR]` writes "
                    "exercise N (the forward given, backward to write); `check FILE` compares your backward with "
                    "tinyformer's own and with central differences, says where and how it is wrong, and once it "
                    "is right trains a model with it. check's exit status: 0 right, 1 not right yet, 2 a file "
                    "it cannot check.")
    study.set_defaults(run=_study, action=None)
    actions = study.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    start = actions.add_parser("start", help="write exercise N as DIR/NN_name.py (never over an existing file)")
    start.add_argument("number", metavar="N", type=_exercise_number, help="the exercise's number")
    start.add_argument("directory", metavar="DIR", nargs="?", default=".", help="where to write it (default .)")
    checking = actions.add_parser("check", help="check the backward in FILE; once right, train a model with it")
    checking.add_argument("file", metavar="FILE", help="an exercise file written by `tinyformer study start`")
    checking.add_argument("--steps", type=_positive_int, default=300,
                          help="training steps of the proof in a real model (default 300)")
    checking.add_argument("--no-train", action="store_true", help="check only: no training run")
    return parser


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # what --nproc runs again under mpiexec
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except UsageError as error:
        if _tell(error, str(error)):
            print(f"tinyformer {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:
        if not getattr(error, "checkpoint", None):  # the trainer already said where it saved
            detail = "; the last checkpoint is intact" if args.command == "train" else ""
            print(f"tinyformer {args.command}: interrupted{detail}", file=sys.stderr)
        return 130
    except Exception as error:  # one line, never a traceback (unless TINYFORMER_DEBUG is set)
        if os.environ.get("TINYFORMER_DEBUG"):
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if not isinstance(error, _EXPECTED_ERRORS):
            message = f"{type(error).__name__}: {message} (set TINYFORMER_DEBUG=1 for the traceback)"
        if _tell(error, message):
            print(f"tinyformer {args.command}: error: {message}", file=sys.stderr)
        return 1


def _tell(error, message):
    """Whether this process prints ``error``: always, unless it is one of several ranks, which
    tell each failure once (a rank that fails tells the others, which stop without a word; of
    ranks failing alike, the lowest speaks). Several ranks end without waiting for each other."""
    from ..translation import distributed

    comm = distributed.current()
    if comm.size == 1:
        return _first_rank()
    if isinstance(error, (distributed.PeerFailed, distributed.PeerLost)):  # told by the rank that knows best
        tell = not error.quiet
    else:
        tell = comm.report_failure(message)
    sys.stdout.flush()
    distributed.shutdown(failed=True)
    return tell


# Failures of the run itself (files, data, checkpoints, numbers); anything else is reported with its type.
_EXPECTED_ERRORS = (OSError, ValueError, LookupError, FloatingPointError, RuntimeError, ImportError)

