"""``tinyformer plot``: the learning-rate schedule of §5.3, or a run's training curves."""

from .options import positive_int
from .usage import UsageError

_SCHEDULE_DEFAULTS = {"d_model": 512, "warmup": 4000, "steps": 20000}


def register(commands):
    plot = commands.add_parser(
        "plot", help="plot the learning-rate schedule or a run's training curves (needs the 'plot' extra)",
        description="`tinyformer plot schedule` draws the learning rate of §5.3; `tinyformer plot LOG` "
                    "draws the curves of a metrics.jsonl written by `tinyformer train`.")
    plot.add_argument("what", metavar="schedule|LOG", help="`schedule`, or a metrics.jsonl file")
    plot.add_argument("--d-model", dest="d_model", type=positive_int, help="schedule: d_model (default 512)")
    plot.add_argument("--warmup", type=positive_int, help="schedule: warm-up steps (default 4000)")
    plot.add_argument("--steps", type=positive_int, help="schedule: steps to draw (default 20000)")
    plot.add_argument("--output", help="the PNG to write (default schedule.png or curves.png)")
    plot.set_defaults(run=run)


def run(args):
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
