"""The ``tinyformer`` command line: train, translate, eval, average, import, export, gradcheck, plot, explain,
study, info.

Usage errors exit with status 2 and one line on stderr; failures at run time
(missing data, a bad checkpoint) with status 1 and one line; no tracebacks
(set ``TINYFORMER_DEBUG=1`` to see them). Warnings, tinyformer's and other packages'
(``warnings.warn``, NumPy's floating-point ones), are one line each too:
``tinyformer CMD: warning: ...`` (``show_warning``). Each command is a module here with
``register(commands)``, which adds its parser, and ``run(args)``, its handler.
"""

import os
import sys
import warnings

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
        with warnings.catch_warnings():  # Python's own printer (two lines, with a source line) comes back after
            warnings.showwarning = show_warning(args.command)
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


def show_warning(command):
    """A ``warnings.showwarning`` that prints ``tinyformer COMMAND: warning: MESSAGE`` on one line (the
    message's lines joined); a warning of another kind than tinyformer's own says its kind, and the
    package it comes from when that is not tinyformer (NumPy's floating-point warnings come from the
    line of tinyformer that computed). Ranks other than the first say nothing: they all warn alike."""
    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
        if not category.__module__.startswith("tinyformer"):
            package = _package_of(filename)
            text += f" ({category.__name__}{f' from {package}' if package not in (None, 'tinyformer') else ''})"
        if first_rank():
            print(f"tinyformer {command}: warning: {text}", file=sys.stderr if file is None else file)
    return show


def _package_of(filename):
    """The top-level package of the imported module whose file is ``filename``, or None."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name.partition(".")[0]
    return None


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
