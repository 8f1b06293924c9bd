"""``tinyformer study``: the backpropagation exercises listed, started, checked, and once right
trained inside a real model."""

import argparse

from .options import positive_int
from .usage import Parser, UsageError


def register(commands):
    study = commands.add_parser(
        "study", help="exercises: write the backward of softmax, layer norm, attention ... yourself, checked",
        description="Backpropagation by hand. `tinyformer study` lists the exercises; `start N [DIR]` writes "
                    "exercise N (the forward given, backward to write); `check FILE` compares your backward with "
                    "tinyformer's own and with central differences, says where and how it is wrong, and once it "
                    "is right trains a model with it; `trace FILE` runs exercise 7's tiled forward beside "
                    "tinyformer's CUDA kernel, emulated on the CPU. check's exit status: 0 right, 1 not right yet, "
                    "2 a file it cannot check.")
    study.set_defaults(run=run, action=None)
    actions = study.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    start = actions.add_parser("start", help="write exercise N as DIR/NN_name.py (never over an existing file)")
    start.add_argument("number", metavar="N", type=_exercise_number, help="the exercise's number")
    start.add_argument("directory", metavar="DIR", nargs="?", default=".", help="where to write it (default .)")
    checking = actions.add_parser("check", help="check the backward in FILE; once right, train a model with it")
    checking.add_argument("file", metavar="FILE", help="an exercise file written by `tinyformer study start`")
    checking.add_argument("--steps", type=positive_int, default=None,
                          help="training steps of the proof in a real model (default 300; 800 for exercises 7 "
                               "and 8, whose exact match is compared with tinyformer's own)")
    checking.add_argument("--no-train", action="store_true", help="check only: no training run")
    tracing = actions.add_parser("trace", help="exercise 7: your forward's running max and sum beside those of "
                                 "tinyformer's CUDA kernel (emulated on the CPU), tile by tile")
    tracing.add_argument("file", metavar="FILE", help="your exercise 7 file (07_flash_forward.py)")
    tracing.add_argument("--queries", type=positive_int, default=40, help="query rows (default 40)")
    tracing.add_argument("--keys", type=positive_int, default=70, help="keys, in tiles of 32 (default 70)")
    tracing.add_argument("--key-length", type=positive_int, default=None,
                         help="keys the sequence has: the rest is padding (default: all)")
    tracing.add_argument("--causal", action="store_true", help="with the causal mask")
    tracing.add_argument("--seed", type=int, default=0, help="of the random q, k, v (default 0)")
    tracing.add_argument("--rows", type=positive_int, default=3, help="rows to print tile by tile (default 3)")


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


def run(args):
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
    if args.action == "trace":
        return _study_trace(args)
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
    if report.exercise.number in (7, 8):
        from ..study.course.flash_kernel import step_lines

        print("the same recurrence in tinyformer's CUDA kernels (tinyformer/engine/kernels/):")
        print("\n".join(step_lines(report.exercise.number)))
        if report.exercise.number == 7:
            print(f"trace the kernel beside your loop: tinyformer study trace {args.file}")
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
        print(f"(--no-train: your {item.writes} was not tried inside a model.) {following}")
        return 0
    tiled = item.number in (7, 8)
    steps = args.steps or (swap.EXACT_MATCH_STEPS if tiled else 300)
    print(f"now inside a real model: {item.model_op} runs your {item.writes} while `tiny` trains {steps} steps on "
          "the built-in synthetic task (one BLAS thread)")
    try:
        proof = swap.train(item.number, report.module, steps=steps, sentences=100 if tiled else 0)
    except Exception as error:  # the reader's code, inside the model
        print(f"inside the model your backward failed: {type(error).__name__}: {str(error).strip().splitlines()[0]} "
              "(tinyformer's own backward is back in place)")
        return 1
    trend = "falling" if proof.falling else "NOT falling"
    print(f"loss {proof.first:.3f} at step 1 → {proof.last:.3f} at step {len(proof.losses)}, {trend}, with your "
          f"{item.writes} called {proof.calls:,} times; tinyformer's own {item.writes} is back in place.")
    if not proof.falling:
        print(f"a {item.writes} that passes the checker should train: tell tinyformer's authors how this one did not")
        return 1
    if proof.exact_match is not None:
        print("tinyformer's own attention, the same seed and steps, for comparison:")
        own = swap.train(item.number, None, steps=steps, sentences=proof.sentences)
        same = abs(proof.exact_match - own.exact_match) <= swap.EXACT_MATCH_SLACK
        print(f"exact match (greedy, {proof.sentences} validation sentences): {proof.exact_match:.0%} with yours, "
              f"{own.exact_match:.0%} with tinyformer's own — {'the same' if same else 'NOT the same'}")
        if not same:
            return 1
    print(following)
    return 0


def _study_trace(args):
    """Exercise 7's forward traced beside the emulated kernel's (``flash_kernel.trace``)."""
    import numpy

    from ..study import course as study
    from ..study.course.flash_kernel import KEY_TILE, trace, trace_lines

    try:
        module, item = study.load(args.file)
    except study.ExerciseFileError as error:
        raise UsageError(str(error)) from None
    if item.number != 7:
        raise UsageError(f"{args.file}: exercise {item.number}; trace follows exercise 7's forward (the kernel's "
                         "running max and sum)")
    rng = numpy.random.default_rng(args.seed)
    q = rng.normal(size=(1, args.queries, 32))
    k, v = rng.normal(size=(1, args.keys, 32)), rng.normal(size=(1, args.keys, 32))
    lengths = None if args.key_length is None else numpy.array([min(args.key_length, args.keys)])
    try:
        found = trace(module, q, k, v, lengths, args.causal)
    except NotImplementedError:
        print(f"{args.file}: forward is not written yet: write it, then trace it")
        return 1
    except Exception as error:  # the reader's code
        print(f"your forward raised {type(error).__name__}: {str(error).strip().splitlines()[0]}")
        return 1
    print(f"attention.cu's forward (emulated on the CPU, float32, key tiles of {KEY_TILE}) beside yours (block = "
          f"{KEY_TILE}, float64) on q (1, {args.queries}, 32), k and v (1, {args.keys}, 32), seed {args.seed}"
          f"{'' if lengths is None else f', key length {int(lengths[0])}'}{', causal' if args.causal else ''}; the "
          "running max m and sum l of each row after each key tile:")
    print("\n".join(trace_lines(found, args.rows)))
    return 0
