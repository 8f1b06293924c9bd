"""``tinyformer average``: checkpoints averaged into one (§6.1)."""

from pathlib import Path

from .options import positive_int
from .usage import UsageError


def register(commands):
    average = commands.add_parser("average", help="average checkpoints into one (§6.1)")
    average.add_argument("checkpoints", nargs="*", help="checkpoint files to average")
    average.add_argument("--dir", help="average the newest --last checkpoints of this run directory")
    average.add_argument("--last", type=positive_int, default=5, help="how many (default 5)")
    average.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    average.set_defaults(run=run)


def run(args):
    from ..translation import checkpoint
    from ..translation.train.averaging import average_checkpoints
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
    out = average_checkpoints(paths, args.output, ignore=TRAINING_ONLY)
    print(f"averaged {len(paths)} checkpoints ({', '.join(Path(p).name for p in paths)}) into {out}")
    return 0
