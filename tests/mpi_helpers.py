"""What the tests that start several ranks share: whether an MPI is here (mpi4py and an
``mpiexec``: the ``mpi`` extra, which the ``test`` extra includes), the environment the ranks
get, and the argv of ``mpiexec`` with the options ``tinyformer train --nproc`` uses."""

import importlib.util

import children
import pytest

from tinyformer.translation.distributed import launch

MPIEXEC = launch.find_mpiexec()
# Open MPI refuses to start as root without them (CI runs as root); other MPIs ignore them.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

requires_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="needs mpi4py and mpiexec: pip install -e \".[mpi]\" (the test extra includes it)")


def mpiexec(nproc, command):
    """argv: ``command`` as ``nproc`` ranks, started as ``--nproc`` starts them."""
    return launch.mpiexec_command(nproc, [str(part) for part in command], MPIEXEC, environ=MPI_ENV)


def mpmd(*commands):
    """argv: one rank per command (MPI's MPMD form ``-n 1 A : -n 1 B``), with --nproc's options."""
    options = launch.mpiexec_command(1, ["x"], MPIEXEC, environ=MPI_ENV)[3:-1]
    argv = [MPIEXEC, *options]
    for i, command in enumerate(commands):
        argv += ([":"] if i else []) + ["-n", "1", *[str(part) for part in command]]
    return argv


def run(argv, timeout=180, **kwargs):
    return children.run(argv, env=MPI_ENV, timeout=timeout, **kwargs)
