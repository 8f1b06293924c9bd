"""How the command line reports misuse: the argument parser that says it in one line, and
``UsageError`` for arguments that parse but do not fit together (both exit with status 2)."""

import argparse
import re

# What argparse takes for a negative number, not an option: its own -1 and -.5, and also -1e308, -1.5E-3,
# -inf and -nan (which argparse before Python 3.13 read as an unknown option: "expected one argument").
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exit status 2); under an MPI launch
    only rank 0 says it, since every rank parses the same arguments. ``--alpha -1e308`` is a
    flag and its value (``NEGATIVE_NUMBER``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n" if first_rank() else None)


def first_rank():
    """False in the ranks other than 0 of an MPI launch (told by the environment)."""
    from ..translation.distributed.launch import environment_rank

    return environment_rank() in (None, 0)


class UsageError(Exception):
    """Arguments that parse but do not make sense together: exit status 2."""
