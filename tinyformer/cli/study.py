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
                    "is right trains a model with it. check's exit status: 0 right, 1 not right yet, 2 a file "
                    "it cannot check.")
    study.set_defaults(run=run, action=None)
    actions = study.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    start = actions.add_parser("start", help="write exercise N as DIR/NN_name.py (never over an existing file)")
    start.add_argument("number", metavar="N", type=_exercise_number, help="the exercise's number")
    start.add_argument("directory", metavar="DIR", nargs="?", default=".", help="where to write it (default .)")
    checking = actions.add_parser("check", help="check the backward in FILE; once right, train a model with it")
    checking.add_argument("file", metavar="FILE", help="an exercise file written by `tinyformer study start`")
    checking.add_argument("--steps", type=positive_int, default=300,
                          help="training steps of the proof in a real model (default 300)")
    checking.add_argument("--no-train", action="store_true", help="check only: no training run")


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
