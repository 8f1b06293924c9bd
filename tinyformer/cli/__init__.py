"""The ``tinyformer`` command line: train, translate, eval, average, import, export, gradcheck, plot, explain,
study, info.

Usage errors exit with status 2 and one line on stderr; failures at run time
(missing data, a bad checkpoint) with status 1 and one line; no tracebacks
(set ``TINYFORMER_DEBUG=1`` to see them). Each command is a module here with
``register(commands)``, which adds its parser, and ``run(args)``, its handler.
"""

import os
import sys

from ..common.version import __version__
from . import average, eval, explain, export, gradcheck, import_model, info, plot, study, train, translate
from .usage import Parser, UsageError, first_rank

# The commands in the order `tinyformer --help` lists them.
COMMANDS = (info, train, translate, eval, average, import_model, export, gradcheck, explain, plot, study)


def build_parser():
    parser = Parser(prog="tinyformer", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tinyformer {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        command.register(commands)
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
        return first_rank()
    if isinstance(error, (distributed.PeerFailed, distributed.PeerLost)):  # told by the rank that knows best
        tell = not error.quiet
    else:
        tell = comm.report_failure(message)
    sys.stdout.flush()
    distributed.shutdown(failed=True)
    return tell


# Failures of the run itself (files, data, checkpoints, numbers); anything else is reported with its type.
_EXPECTED_ERRORS = (OSError, ValueError, LookupError, FloatingPointError, RuntimeError, ImportError)
