"""How the command line reports misuse: the argument parser that says it in one line, and
``UsageError`` for arguments that parse but do not fit together (both exit with status 2)."""

import argparse


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exit status 2); under an MPI launch
    only rank 0 says it, since every rank parses the same arguments."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n" if first_rank() else None)


def first_rank():
    """False in the ranks other than 0 of an MPI launch (told by the environment)."""
    from ..translation.distributed.launch import environment_rank

    return environment_rank() in (None, 0)


class UsageError(Exception):
    """Arguments that parse but do not make sense together: exit status 2."""
