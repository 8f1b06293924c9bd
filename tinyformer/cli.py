"""The ``tinyformer`` command line."""

import argparse
import sys

import numpy

from . import __version__, backend


def _info(args):
    print(f"tinyformer {__version__}")
    print(f"numpy {numpy.__version__}")
    print(f"GPU available (cupy.is_available()): {backend.is_gpu_available()}")
    return 0


def build_parser():
    parser = argparse.ArgumentParser(prog="tinyformer", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tinyformer {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = commands.add_parser("info", help="versions and whether a GPU is usable")
    info.set_defaults(run=_info)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
