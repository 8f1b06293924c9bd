"""MPICommunicator: the group of ranks an MPI launch made, through mpi4py.

NumPy arrays go to MPI as they are; CuPy arrays are staged through host memory (a copy to the
host, the collective there, a copy back). Every collective is non-blocking underneath (``Iallreduce``,
``Ibcast``, ...) and waited for by polling, so that a wait can notice what MPI itself would hang on:

- a rank that reported a failure (``report_failure`` sends a notice on a control channel):
  ``PeerFailed``, and this rank exits without a second message;
- a rank whose process is gone (a rank on this host: its pid no longer exists) or, for a rank on
  another host, that sent no heartbeat for ``dead_after`` seconds (a thread sends one every
  ``heartbeat`` seconds, answered whatever the main thread is doing): ``PeerLost`` naming it;
- a collective that is not complete after ``timeout`` seconds: ``CollectiveTimeout``.

mpi4py's own MPI_Finalize at exit is turned off: ``close()`` finalizes after a normal end, and
after a failure the process exits without it, since a finalize can wait forever on a dead rank.
"""

import atexit
import json
import os
import socket
import sys
import threading
import time

import numpy

from ...engine import backend
from .communicator import (
    CHECK_INTERVAL as _CHECK_INTERVAL,
    Communicator,
    CollectiveTimeout,
    PeerFailed,
    PeerLost,
    Work,
    _check_op,
    _check_root,
)

__all__ = ["MPICommunicator"]

_HEARTBEAT, _NOTICE = 1, 2   # tags on the control channel
_REPORT_WINDOW = 1.0         # seconds a failing rank waits to hear whether a lower rank failed too


class MPICommunicator(Communicator):
    """MPI_COMM_WORLD (or ``comm``) as a Communicator; ``timeout`` in seconds (None: no limit)."""

    name = "mpi"

    def __init__(self, timeout=300.0, heartbeat=1.0, dead_after=30.0, check_local_pids=True, comm=None):
        import mpi4py

        mpi4py.rc.finalize = False  # close() finalizes; a failed rank must not wait on a dead one at exit
        from mpi4py import MPI

        self.MPI = MPI
        world = comm if comm is not None else MPI.COMM_WORLD
        self.comm, self._control = world.Dup(), world.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        shared = world.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank = shared.Get_rank()
        shared.Free()
        self.timeout, self.heartbeat, self.dead_after = timeout, heartbeat, dead_after
        self._lock = threading.Lock()
        self._notices, self._last_seen = {}, {}
        self._next_check, self._closed = 0.0, False
        self.waiting = None  # what the main thread waits for, for messages
        here = (socket.gethostname(), os.getpid())
        self.places = [tuple(place) for place in self._gather_json(list(here), blocking=True)]
        self._local = {r for r, (host, _) in enumerate(self.places) if host == here[0] and r != self.rank
                       and check_local_pids}
        self._remote = [r for r in range(self.size) if r != self.rank and r not in self._local]
        self._thread = None
        if self._remote and MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
            now = time.monotonic()
            self._last_seen = {r: now for r in self._remote}
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._beat, name="tinyformer-heartbeat", daemon=True)
            self._thread.start()
        atexit.register(self.close)
        self._excepthook, sys.excepthook = sys.excepthook, self._uncaught

    def _uncaught(self, kind, error, traceback):
        """An exception nobody caught (in a script): told as usual, then to the other ranks, and
        the exit does not finalize (it would wait for ranks that wait for this one)."""
        self._excepthook(kind, error, traceback)
        if not self._closed and not isinstance(error, KeyboardInterrupt):
            self.report_failure(f"{kind.__name__}: {error}")
            self.close(failed=True)

    # ------------------------------------------------------------------ collectives
    def all_reduce_async(self, array, op="sum"):
        _check_op(op)
        host = _host_buffer(array)
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, host, op=getattr(self.MPI, op.upper()))
        return _MPIWork(self, request, array, host, "all_reduce")

    def broadcast(self, array, root=0):
        _check_root(root, self.size)
        host = _host_buffer(array)
        return _MPIWork(self, self.comm.Ibcast(host, root=root), array, host, "broadcast").wait()

    def broadcast_object(self, value, root=0):
        _check_root(root, self.size)
        data = json.dumps(value).encode("utf-8") if self.rank == root else b""
        return json.loads(self.broadcast_bytes(data, root).decode("utf-8"))

    def all_gather_object(self, value):
        return self._gather_json(value)

    def barrier(self, timeout="default"):
        self._wait(self.comm.Ibarrier(), "barrier", timeout)

    def _gather_json(self, value, blocking=False):
        data = numpy.frombuffer(json.dumps(value).encode("utf-8"), dtype=numpy.uint8)
        lengths = numpy.empty(self.size, dtype=numpy.int64)
        counts = numpy.array([data.size], dtype=numpy.int64)
        if blocking:  # before the liveness checks exist
            self.comm.Allgather(counts, lengths)
        else:
            self._wait(self.comm.Iallgather(counts, lengths), "all_gather_object")
        offsets = numpy.concatenate([[0], numpy.cumsum(lengths)[:-1]])
        gathered = numpy.empty(int(lengths.sum()), dtype=numpy.uint8)
        spec = [gathered, (lengths.tolist(), offsets.tolist()), self.MPI.BYTE]
        if blocking:
            self.comm.Allgatherv(data, spec)
        else:
            self._wait(self.comm.Iallgatherv(data, spec), "all_gather_object")
        return [json.loads(gathered[o:o + n].tobytes().decode("utf-8")) for o, n in zip(offsets, lengths)]

    # ------------------------------------------------------------------ waiting, and the other ranks
    def _wait(self, request, what, timeout="default"):
        """Poll ``request`` until it completes, looking at the other ranks every _CHECK_INTERVAL."""
        timeout = self.timeout if timeout == "default" else timeout
        start = time.monotonic()
        polls, self.waiting = 0, what
        try:
            while not request.Test():
                polls += 1
                now = time.monotonic()
                if now >= self._next_check:
                    self._next_check = now + _CHECK_INTERVAL
                    self.check_peers()
                    if timeout is not None and now - start > timeout:
                        raise CollectiveTimeout(
                            f"rank {self.rank}: {what} did not complete within {timeout:g} s (--comm-timeout): "
                            f"another rank is stuck, or the ranks called different collectives")
                if polls > 200:  # spin briefly for a fast collective, then yield the core
                    time.sleep(0.0005 if polls < 2000 else 0.005)
        finally:
            self.waiting = None

    def check_peers(self):
        """Raise PeerFailed or PeerLost if another rank reported a failure, died or fell silent."""
        self._drain_control()
        with self._lock:
            notices = dict(self._notices)
        if notices:
            rank = min(notices)
            raise PeerFailed(f"rank {rank} stopped: {notices[rank]}", rank)
        gone = [r for r in sorted(self._local) if not _process_exists(self.places[r][1])]
        now = time.monotonic()
        with self._lock:
            silent = [r for r, seen in self._last_seen.items() if now - seen > self.dead_after]
        if gone or silent:
            lost = sorted(set(gone) | set(silent))
            alive = [r for r in range(self.size) if r not in lost]
            names = ", ".join(f"rank {r} (pid {self.places[r][1]} on {self.places[r][0]})" for r in lost)
            how = ("died" if not silent else f"sent no heartbeat for {self.dead_after:g} s" if not gone
                   else "died or fell silent")
            raise PeerLost(f"{names} {how}; stopping the other ranks", lost, quiet=self.rank != min(alive))

    def report_failure(self, message):
        data = numpy.frombuffer(str(message).encode("utf-8"), dtype=numpy.uint8).copy()
        with self._lock:
            requests = [self._control.Isend(data, dest=r, tag=_NOTICE) for r in range(self.size) if r != self.rank]
        deadline = time.monotonic() + _REPORT_WINDOW
        while time.monotonic() < deadline:
            self._drain_control()
            with self._lock:
                done = all(request.Test() for request in requests)
                lower = any(r < self.rank for r in self._notices)
            if lower or (done and self.rank == 0):
                break
            time.sleep(0.01)
        return not lower

    def _drain_control(self):
        status = self.MPI.Status()
        with self._lock:
            while self._control.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status):
                source, tag = status.Get_source(), status.Get_tag()
                buffer = numpy.empty(status.Get_count(self.MPI.BYTE), dtype=numpy.uint8)
                self._control.Recv(buffer, source=source, tag=tag)
                if tag == _NOTICE:
                    self._notices.setdefault(source, buffer.tobytes().decode("utf-8", "replace"))
                if source in self._last_seen:  # any message says the rank is alive
                    self._last_seen[source] = time.monotonic()

    def _beat(self):
        """The heartbeat thread: a byte to each rank on another host every ``heartbeat`` seconds."""
        beat, pending = numpy.zeros(1, dtype=numpy.uint8), []
        while not self._stop.wait(self.heartbeat):
            with self._lock:
                pending = [request for request in pending if not request.Test()]
                if len(pending) < 64 * len(self._remote):  # a dead rank's sends are never completed
                    pending += [self._control.Isend(beat, dest=r, tag=_HEARTBEAT) for r in self._remote]
            self._drain_control()

    def close(self, failed=False):
        """Stop the heartbeat; after a normal end (``failed=False``) finalize MPI."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2 * self.heartbeat + 1)
        if not failed and not self.MPI.Is_finalized():
            self.MPI.Finalize()


class _MPIWork(Work):
    """A started MPI collective on ``array`` (through ``host`` when ``array`` is on the GPU)."""

    def __init__(self, owner, request, array, host, what):
        super().__init__(array)
        self.owner, self.request, self.host, self.what = owner, request, host, what
        self.started, self.finished = time.perf_counter(), None

    def done(self):
        if self.finished is None and self.request.Test():
            self._complete()
        return self.finished is not None

    def wait(self):
        if self.finished is None:
            self.owner._wait(self.request, self.what)
            self._complete()
        return self.array

    def _complete(self):
        self.finished = time.perf_counter()
        if self.host is not self.array:
            self.array[...] = backend.like(self.host, self.array)


def _host_buffer(array):
    """``array`` itself (a contiguous NumPy array), or a host copy of a CuPy array."""
    if backend.is_cupy_array(array):
        return numpy.ascontiguousarray(backend.to_numpy(array))
    if not isinstance(array, numpy.ndarray) or not array.flags.c_contiguous:
        raise ValueError(f"collectives need a contiguous NumPy or CuPy array, got {type(array).__name__}")
    return array


def _process_exists(pid):
    """Whether ``pid`` is a live process of this host (a zombie, dead but not reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True
