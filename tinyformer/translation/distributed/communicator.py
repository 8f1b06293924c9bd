"""The Communicator: what data-parallel training asks of a group of processes, and the errors
a group can fail with.

A communicator has a ``rank`` (0 .. ``size`` - 1) and collectives on arrays (``all_reduce``, its
non-blocking twin ``all_reduce_async``, ``broadcast``) and on small JSON-able values
(``broadcast_object``, ``all_gather_object``) and bytes (``broadcast_bytes``), plus ``barrier``.
``SingleProcess`` is the group of one, so that the trainer has a single code path; ``mpi.MPICommunicator`` and
``nccl.NCCLCommunicator`` are the real ones. Values travel as JSON, never as pickles.
"""

import numpy

__all__ = ["Communicator", "SingleProcess", "Work", "DistributedError", "PeerLost", "PeerFailed",
           "CollectiveTimeout", "StartupMismatch", "REDUCE_OPS"]

REDUCE_OPS = ("sum", "max", "min")
CHECK_INTERVAL = 0.25  # seconds between two looks at the other ranks while waiting for a collective


class DistributedError(RuntimeError):
    """A failure of the group. ``quiet`` is True on the ranks that should not print it, because
    another rank prints the same story (each failure is told in one line, by one rank)."""

    quiet = False


class PeerLost(DistributedError):
    """A rank died (its process is gone) or stopped answering: ``ranks`` names them."""

    def __init__(self, message, ranks, quiet=False):
        super().__init__(message)
        self.ranks, self.quiet = tuple(ranks), quiet


class PeerFailed(DistributedError):
    """Another rank stopped with an error of its own, which it reports itself."""

    quiet = True

    def __init__(self, message, rank):
        super().__init__(message)
        self.rank = rank


class CollectiveTimeout(DistributedError):
    """A collective did not complete within the communicator's timeout."""


class StartupMismatch(DistributedError):
    """The ranks were started with different settings, tokenizers or code (every rank raises it;
    rank 0 tells it)."""


class Work:
    """A started collective: ``wait()`` blocks until it is complete and returns its array."""

    def __init__(self, array):
        self.array = array

    def done(self):
        return True

    def wait(self):
        return self.array


class Communicator:
    """The interface; subclasses implement every method for their transport."""

    rank = 0
    size = 1
    local_rank = 0
    name = "single"

    def all_reduce(self, array, op="sum"):
        """Reduce ``array`` over the ranks, in place; returns it."""
        return self.all_reduce_async(array, op).wait()

    def all_reduce_async(self, array, op="sum"):
        """Start reducing ``array`` in place; the returned ``Work`` waits for it."""
        raise NotImplementedError

    def broadcast(self, array, root=0):
        """Give every rank root's ``array`` (in place); returns it."""
        raise NotImplementedError

    def broadcast_object(self, value, root=0):
        """Root's JSON-able ``value`` on every rank."""
        raise NotImplementedError

    def broadcast_bytes(self, data, root=0):
        """Root's ``data`` (bytes; the other ranks' are ignored) on every rank: its length, then it."""
        length = self.broadcast(numpy.array([len(data)], dtype=numpy.int64), root)
        buffer = numpy.frombuffer(data, dtype=numpy.uint8).copy() if self.rank == root else \
            numpy.empty(int(length[0]), dtype=numpy.uint8)
        return self.broadcast(buffer, root).tobytes()

    def all_gather_object(self, value):
        """[rank 0's value, rank 1's, ...] of a JSON-able value, on every rank."""
        raise NotImplementedError

    def barrier(self, timeout="default"):
        """Wait until every rank got here (``timeout=None``: as long as they are alive)."""
        raise NotImplementedError

    def report_failure(self, message):
        """Tell the other ranks that this one stops with ``message``; returns whether this rank
        should print it (False when a lower rank reported a failure too)."""
        return True

    def check_peers(self):
        """Raise PeerFailed or PeerLost if another rank reported a failure, died or fell silent."""

    def close(self, failed=False):
        """Release the transport; after a failure (``failed``) without waiting for the other ranks."""

    def __repr__(self):
        return f"{type(self).__name__}(rank {self.rank} of {self.size})"


class SingleProcess(Communicator):
    """The group of one process: every collective is the identity, and nothing is imported."""

    def all_reduce_async(self, array, op="sum"):
        _check_op(op)
        return Work(array)

    def broadcast(self, array, root=0):
        _check_root(root, 1)
        return array

    def broadcast_object(self, value, root=0):
        _check_root(root, 1)
        return value

    def all_gather_object(self, value):
        return [value]

    def barrier(self, timeout="default"):
        pass


def _check_op(op):
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")


def _check_root(root, size):
    if not isinstance(root, int) or not 0 <= root < size:
        raise ValueError(f"root must be a rank in [0, {size}), got {root!r}")
