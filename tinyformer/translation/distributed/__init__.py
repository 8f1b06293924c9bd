"""Several processes, one model: data-parallel training over MPI (mpi4py) or NCCL (cupy.cuda.nccl).

``init()`` gives this process its communicator, once: one made from the MPI launch that
started it (``mpiexec -n N ...``, told by the environment, see ``launch.launched_by_mpi``), else
the group of one (``SingleProcess``), for which nothing is imported. ``world_size()``, ``rank()``,
``all_reduce``, ``broadcast`` and ``barrier`` then act on it; the trainer uses the same calls.

    from tinyformer.translation import distributed
    comm = distributed.init()                       # under mpiexec: MPI; else the group of one
    total = distributed.all_reduce(numpy.array([count]))  # every rank's count, summed
"""

from .communicator import (
    CollectiveTimeout,
    Communicator,
    DistributedError,
    PeerFailed,
    PeerLost,
    SingleProcess,
    StartupMismatch,
    Work,
)
from .data_parallel import (
    DriftError,
    GradientBuckets,
    broadcast_optimizer,
    broadcast_parameters,
    check_agreement,
    check_same_parameters,
    code_fingerprint,
    parameter_checksum,
    rank_seed,
)
from .launch import launched_by_mpi

__all__ = ["init", "current", "world_size", "rank", "all_reduce", "broadcast", "barrier", "shutdown",
           "COMMS", "Communicator", "SingleProcess", "Work", "DistributedError", "PeerLost", "PeerFailed",
           "CollectiveTimeout", "StartupMismatch", "DriftError", "GradientBuckets", "broadcast_parameters",
           "broadcast_optimizer", "parameter_checksum", "check_same_parameters", "check_agreement",
           "code_fingerprint", "rank_seed", "launched_by_mpi"]

COMMS = ("mpi", "nccl")

_current = None


def init(comm=None, device="cpu", timeout=300.0):
    """This process's communicator, made on the first call (later calls return it).

    ``comm``: "mpi", "nccl" or None (NCCL for ``device="cuda"`` when CuPy's NCCL loads, else
    MPI). Outside an MPI launch it is the group of one, except that ``comm="nccl"`` makes a
    one-rank NCCL communicator. ``timeout``: seconds a collective may take (None: no limit).
    Under an MPI launch with ``device="cuda"`` each rank takes the GPU of its rank on its host.
    """
    global _current
    if comm not in (None, *COMMS):
        raise ValueError(f"comm must be one of {COMMS} or None, got {comm!r}")
    if comm == "nccl" and device != "cuda":
        raise ValueError("--comm nccl reduces GPU arrays: it needs --device cuda")
    if _current is not None:
        if comm is not None and _current.size > 1 and _current.name != comm:
            raise ValueError(f"this process already communicates over {_current.name}, not {comm}")
        return _current
    launched = launched_by_mpi()
    if not launched and comm != "nccl":
        _current = SingleProcess()
        return _current
    control = None
    if launched:
        from .mpi import MPICommunicator

        control = MPICommunicator(timeout=timeout)
    if device == "cuda":
        from .nccl import nccl_available, use_local_gpu

        use_local_gpu(control.local_rank if control is not None else 0)
        if comm is None:
            comm = "nccl" if nccl_available() else "mpi"
    if comm == "nccl":
        from .nccl import NCCLCommunicator

        _current = NCCLCommunicator(control, timeout=timeout)
    else:
        _current = control
    return _current


def current():
    """The communicator ``init`` made, or the group of one before that."""
    return _current if _current is not None else SingleProcess()


def world_size():
    return current().size


def rank():
    return current().rank


def all_reduce(array, op="sum"):
    """``array`` (NumPy or CuPy) reduced over the ranks in place ("sum", "max" or "min")."""
    return current().all_reduce(array, op)


def broadcast(array, root=0):
    """Root's ``array`` on every rank, in place."""
    return current().broadcast(array, root)


def barrier(timeout="default"):
    current().barrier(timeout)


def shutdown(failed=False):
    """Close this process's communicator (after a failure: without waiting for the other ranks)."""
    global _current
    if _current is not None:
        _current.close(failed=failed)
    _current = None
