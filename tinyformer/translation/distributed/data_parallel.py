"""Data parallelism over a Communicator: gradients all-reduced in flat buckets during the backward
pass, parameters and optimiser state broadcast from rank 0, a checksum that catches ranks whose
parameters drifted apart, and the check that every rank was started the same way.
"""

import hashlib
import time
from pathlib import Path

import numpy

from ...engine import backend
from .communicator import DistributedError, StartupMismatch

__all__ = ["GradientBuckets", "broadcast_parameters", "broadcast_optimizer", "parameter_checksum",
           "check_same_parameters", "check_agreement", "code_fingerprint", "rank_seed", "DriftError"]


class DriftError(DistributedError):
    """The ranks' parameters differ: their updates were not the same (every rank raises it)."""


class _Bucket:
    """Consecutive parameters of one dtype and device whose gradients travel as one flat array."""

    def __init__(self, dtype, device):
        self.dtype, self.device = dtype, device
        self.params, self.offsets, self.size = [], [], 0
        self.flat = self.work = None
        self.pending = 0

    @property
    def nbytes(self):
        return self.size * numpy.dtype(self.dtype).itemsize

    def add(self, param):
        self.params.append(param)
        self.offsets.append(self.size)
        self.size += param.size

    def slot(self, index):
        start = self.offsets[index]
        return self.flat[start:start + self.params[index].size]


class GradientBuckets:
    """Sums the gradients of ``params`` over the ranks of ``comm``, as PyTorch's DDP does: the
    parameters are grouped, in the reverse of their order (roughly the order in which the backward
    pass completes their gradients), into flat buckets of at most ``bucket_mb`` MiB; during the
    backward pass that follows ``arm()``, each parameter's post-accumulate hook copies its finished
    gradient into its bucket, and a bucket whose last gradient arrived starts its all-reduce at
    once (in bucket order, the same on every rank), while the pass goes on. ``finish()`` starts
    what is left (gradients that never came count as zeros), waits for every bucket and makes each
    ``.grad`` a view of the summed bucket.

    ``hidden_share()`` is the part of the all-reduce time that the backward pass hid: for each
    step, 1 − (time waited in ``finish``) / (first start to last completion).
    """

    def __init__(self, comm, params, bucket_mb=25.0):
        self.comm, self.params = comm, list(params)
        limit = max(1, int(bucket_mb * (1 << 20)))
        self.buckets, self._where = [], {}
        for param in reversed(self.params):
            device = backend.device_of(param.data)
            last = self.buckets[-1] if self.buckets else None
            if last is None or (last.dtype, last.device) != (param.dtype, device) or \
                    (last.params and last.nbytes + param.data.nbytes > limit):
                last = _Bucket(param.dtype, device)
                self.buckets.append(last)
            self._where[id(param)] = (last, len(last.params))
            last.add(param)
        for bucket in self.buckets:
            bucket.flat = backend.get_array_module(bucket.params[0].data).empty(bucket.size, dtype=bucket.dtype)
        self._handles = [p.register_post_accumulate_grad_hook(self._gradient_ready) for p in self.params]
        self.armed, self._next = False, 0
        self._ready = set()
        self.exposed_seconds = self.span_seconds = 0.0
        self.steps = 0

    def arm(self):
        """Start the buckets' all-reduce from the next backward pass (the step's last one)."""
        self.armed, self._next, self._ready = True, 0, set()
        for bucket in self.buckets:
            bucket.pending, bucket.work = len(bucket.params), None

    def _gradient_ready(self, param):
        if not self.armed or id(param) in self._ready:
            return
        bucket, index = self._where[id(param)]
        bucket.slot(index)[...] = param.grad.reshape(-1)
        self._ready.add(id(param))
        bucket.pending -= 1
        self._start_ready_buckets()
        for started in self.buckets[:self._next]:  # MPI progresses a non-blocking collective when asked
            started.work.done()

    def _start_ready_buckets(self):
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self.buckets[self._next].work = self.comm.all_reduce_async(self.buckets[self._next].flat)
            self._next += 1

    def finish(self):
        """Complete the all-reduce of every bucket; each parameter's ``.grad`` is then the sum over the ranks."""
        if not self.armed:
            self.arm()
        end_of_backward = time.perf_counter()
        for bucket in self.buckets[self._next:]:
            for index, param in enumerate(bucket.params):
                if id(param) not in self._ready:
                    slot = bucket.slot(index)
                    if param.grad is None:
                        slot[...] = 0
                    else:
                        slot[...] = param.grad.reshape(-1)
                    bucket.pending -= 1
        self._start_ready_buckets()
        for bucket in self.buckets:
            bucket.work.wait()
        waited = time.perf_counter() - end_of_backward
        starts = [getattr(b.work, "started", None) for b in self.buckets]
        ends = [getattr(b.work, "finished", None) for b in self.buckets]
        if None not in starts and None not in ends:
            self.steps += 1
            self.exposed_seconds += waited
            self.span_seconds += max(max(ends) - min(starts), waited, 1e-12)
        for bucket in self.buckets:
            for index, param in enumerate(bucket.params):
                param.grad = bucket.slot(index).reshape(param.shape)
        self.armed = False

    def hidden_share(self):
        """The share of all-reduce time hidden behind the backward pass so far (None before a step)."""
        if not self.steps:
            return None
        return min(1.0, max(0.0, 1.0 - self.exposed_seconds / self.span_seconds))

    def take_timings(self):
        """(hidden share, all-reduce seconds per step) since the last call, and start anew."""
        share, steps, span = self.hidden_share(), self.steps, self.span_seconds
        self.exposed_seconds = self.span_seconds = 0.0
        self.steps = 0
        return share, (span / steps if steps else None)

    def close(self):
        for handle in self._handles:
            handle.remove()


def broadcast_parameters(comm, params, root=0):
    """Give every rank root's parameter values."""
    for param in params:
        if not param.data.flags.c_contiguous:
            param.data = backend.get_array_module(param.data).ascontiguousarray(param.data)
        comm.broadcast(param.data, root)


def broadcast_optimizer(comm, adam, root=0):
    """Give every rank root's Adam state (step count and moments); the rest comes from the config."""
    header = comm.broadcast_object({"step_count": adam.step_count, "moments": [m is not None for m in adam.m]}, root)
    adam.step_count = header["step_count"]
    for i, (param, has_moment) in enumerate(zip(adam.params, header["moments"])):
        if not has_moment:
            adam.m[i] = adam.v[i] = None
            continue
        xp = backend.get_array_module(param.data)
        if comm.rank != root:
            adam.m[i], adam.v[i] = xp.zeros_like(param.data), xp.zeros_like(param.data)
        comm.broadcast(adam.m[i], root)
        comm.broadcast(adam.v[i], root)


def parameter_checksum(params):
    """One float64 sum per parameter: ranks holding the same values get the same numbers."""
    return [float(backend.get_array_module(p.data).sum(p.data, dtype=numpy.float64)) for p in params]


def check_same_parameters(comm, named_params, step):
    """Raise DriftError on every rank if any rank's parameters differ from rank 0's (a checksum
    per parameter, gathered: a few numbers per rank)."""
    names = [name for name, _ in named_params]
    sums = comm.all_gather_object(parameter_checksum([p for _, p in named_params]))
    drifted = [(r, [n for n, a, b in zip(names, theirs, sums[0]) if a != b]) for r, theirs in enumerate(sums)]
    drifted = [(r, differing) for r, differing in drifted if differing]
    if drifted:
        detail = "; ".join(f"rank {r}: {len(d)} parameter(s), first {d[0]}" for r, d in drifted)
        raise DriftError(f"step {step}: the ranks' parameters drifted apart from rank 0's ({detail}); "
                         "the ranks did not apply the same updates")


def check_agreement(comm, facts):
    """Every rank's ``facts`` ({what: value}, JSON-able) must equal rank 0's; else every rank raises
    StartupMismatch naming each difference."""
    everyone = comm.all_gather_object(facts)
    reference, problems = everyone[0], []
    for r, theirs in enumerate(everyone[1:], 1):
        differences = [f"{key} {_shown(theirs.get(key))} (rank 0: {_shown(reference.get(key))})"
                       for key in sorted(set(theirs) | set(reference)) if theirs.get(key) != reference.get(key)]
        if differences:
            problems.append(f"rank {r} has {', '.join(differences)}")
    if problems:
        raise StartupMismatch(f"the ranks were not started alike: {'; '.join(problems)}; start every rank with "
                              "the same command, tinyformer code and files")


def _shown(value):
    return "(unset)" if value is None else repr(value)


def code_fingerprint():
    """tinyformer's version and a digest of its source files (Python and CUDA): ranks running other
    code refuse to train together."""
    from ...common.version import __version__

    root = Path(__file__).resolve().parents[2]  # the package's own folder
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".cu", ".cuh", ".h") and "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__} ({digest.hexdigest()[:12]})"


def rank_seed(seed, rank):
    """The seed of rank ``rank``'s dropout stream, drawn from numpy's SeedSequence((seed, rank)):
    independent of the other ranks' and of the initialisation's (``default_rng(seed)``, whose
    outputs a dropout stream seeded with ``seed`` itself would repeat). Rank 0's is a one-process
    run's."""
    return int(numpy.random.SeedSequence([seed, rank]).generate_state(1, dtype=numpy.uint64)[0])
