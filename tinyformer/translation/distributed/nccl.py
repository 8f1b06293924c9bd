"""NCCLCommunicator: collectives on CuPy arrays through NCCL (``cupy.cuda.nccl``).

Rank 0 makes NCCL's unique id and the MPI communicator (the control channel) carries it to the
others; it also carries every value that is not a GPU array (JSON objects, NumPy arrays), the
barrier and the failure checks. A GPU collective runs on a stream of its own, after the work
already queued on the current stream (an event), and its wait polls a completion event, so that
a hang times out (the NCCL communicator is then aborted) instead of blocking forever.

This is the one module besides ``engine/backend/devices.py`` that imports CuPy: ``cupy.cuda.nccl`` is the NCCL
binding. It is imported only when a run asks for NCCL.
"""

import time

import numpy

from ...engine import backend
from .communicator import CHECK_INTERVAL, CollectiveTimeout, Communicator, SingleProcess, Work, _check_op, _check_root

__all__ = ["NCCLCommunicator", "use_local_gpu", "nccl_available"]


def nccl_available():
    """Whether CuPy's NCCL binding loads (the ``nvidia-nccl-cu12`` wheel or a system NCCL)."""
    try:
        from cupy.cuda import nccl

        nccl.get_version()
    except Exception:
        return False
    return True


def use_local_gpu(local_rank):
    """Make GPU ``local_rank`` (modulo the GPUs of this host) the current device; returns its index."""
    import cupy

    index = local_rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(index).use()
    return index


class NCCLCommunicator(Communicator):
    """NCCL over the ranks of ``control`` (an MPICommunicator; None: a group of one)."""

    name = "nccl"

    def __init__(self, control=None, timeout=300.0):
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl = cupy, nccl
        self.control = control if control is not None else SingleProcess()
        self.rank, self.size, self.local_rank = self.control.rank, self.control.size, self.control.local_rank
        self.timeout = timeout
        unique_id = _encode_id(nccl.get_unique_id()) if self.rank == 0 else None
        unique_id = self.control.broadcast_object(unique_id)
        self._comm = nccl.NcclCommunicator(self.size, _decode_id(unique_id), self.rank)
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._types = {numpy.dtype(numpy.float16): nccl.NCCL_FLOAT16, numpy.dtype(numpy.float32): nccl.NCCL_FLOAT32,
                       numpy.dtype(numpy.float64): nccl.NCCL_FLOAT64, numpy.dtype(numpy.int32): nccl.NCCL_INT32,
                       numpy.dtype(numpy.int64): nccl.NCCL_INT64, numpy.dtype(numpy.uint8): nccl.NCCL_UINT8}
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}

    def _enqueue(self, array, launch, what):
        """Run ``launch(pointer, count, nccl type, stream)`` on the NCCL stream after the current
        stream's work; a Work whose wait makes the current stream wait for it."""
        if not array.flags.c_contiguous:
            raise ValueError(f"{what}: NCCL needs a contiguous array")
        kind = self._types.get(numpy.dtype(array.dtype))
        if kind is None:
            raise TypeError(f"{what}: NCCL takes {', '.join(str(t) for t in self._types)} arrays, got {array.dtype}")
        ready = self.cupy.cuda.Event(disable_timing=True)
        ready.record(self.cupy.cuda.get_current_stream())
        self._stream.wait_event(ready)
        launch(array.data.ptr, array.size, kind, self._stream.ptr)
        finished = self.cupy.cuda.Event(disable_timing=True)
        finished.record(self._stream)
        return _NCCLWork(self, array, finished, what)

    def all_reduce_async(self, array, op="sum"):
        _check_op(op)
        if not backend.is_cupy_array(array):
            return self.control.all_reduce_async(array, op)
        return self._enqueue(array, lambda ptr, n, kind, stream: self._comm.allReduce(
            ptr, ptr, n, kind, self._ops[op], stream), "all_reduce")

    def broadcast(self, array, root=0):
        _check_root(root, self.size)
        if not backend.is_cupy_array(array):
            return self.control.broadcast(array, root)
        return self._enqueue(array, lambda ptr, n, kind, stream: self._comm.bcast(
            ptr, n, kind, root, stream), "broadcast").wait()

    def broadcast_object(self, value, root=0):
        return self.control.broadcast_object(value, root)

    def all_gather_object(self, value):
        return self.control.all_gather_object(value)

    def barrier(self, timeout="default"):
        self.control.barrier(timeout)

    def check_peers(self):
        self.control.check_peers()

    def report_failure(self, message):
        return self.control.report_failure(message)

    def close(self, failed=False):
        if failed:
            self._comm.abort()
        else:
            self._stream.synchronize()
            self._comm.destroy()
        self.control.close(failed=failed)


class _NCCLWork(Work):
    def __init__(self, owner, array, event, what):
        super().__init__(array)
        self.owner, self.event, self.what = owner, event, what
        self.started, self.finished = time.perf_counter(), None

    def done(self):
        if self.finished is None and self.event.done:
            self.finished = time.perf_counter()
        return self.finished is not None

    def wait(self):
        start, owner = time.monotonic(), self.owner
        next_check = start
        while not self.done():
            now = time.monotonic()
            if now < next_check:
                time.sleep(0.0002)
                continue
            next_check = now + CHECK_INTERVAL  # the other ranks are looked at as MPICommunicator does
            owner.check_peers()
            if owner.timeout is not None and now - start > owner.timeout:
                owner._comm.abort()
                raise CollectiveTimeout(f"rank {owner.rank}: NCCL {self.what} did not complete within "
                                        f"{owner.timeout:g} s (--comm-timeout); the NCCL communicator was aborted")
            time.sleep(0.0002)
        owner.cupy.cuda.get_current_stream().wait_event(self.event)
        return self.array


def _encode_id(unique_id):
    """NCCL's unique id as JSON: CuPy 14 gives bytes, earlier versions a tuple of ints."""
    return {"bytes": list(unique_id)} if isinstance(unique_id, (bytes, bytearray)) else {"ints": list(unique_id)}


def _decode_id(encoded):
    return bytes(encoded["bytes"]) if "bytes" in encoded else tuple(encoded["ints"])
