"""Run under ``mpiexec -n 2`` by tests/translation/test_distributed.py: the communicators and the gradient
buckets between two real ranks, each check's outcome printed by rank 0 as one JSON line.

The last checks break the group on purpose: a rank that reports a failure, a collective that one
rank is late for, and a rank that kills itself (found by the heartbeat, its pid being ignored);
rank 0 then exits without finalizing MPI, as the CLI does after a failure.
"""

import json
import os
import signal
import sys
import time

import numpy as np

from tinyformer.translation import distributed
from tinyformer.model import nn
from tinyformer.translation.distributed.mpi import MPICommunicator

comm = distributed.init()
results = {}


def record(name, value):
    results[name] = value
    if comm.rank == 0:
        print(json.dumps({name: value}), flush=True)


# ------------------------------------------------------------------ collectives
values = np.arange(6, dtype=np.float32) * (comm.rank + 1)
record("all_reduce sum", distributed.all_reduce(values).tolist())
record("all_reduce max", comm.all_reduce(np.array([comm.rank, -comm.rank], dtype=np.int64), "max").tolist())
record("broadcast from 1", comm.broadcast(np.full(3, float(comm.rank)), root=1).tolist())
record("broadcast_object", comm.broadcast_object({"from": comm.rank, "text": "αβ"}))
record("all_gather_object", comm.all_gather_object([comm.rank]))
distributed.barrier()

# ------------------------------------------------------------------ gradient buckets during backward
model = nn.Transformer.from_preset("tiny", vocab_size=50, dropout=0.0, seed=3)
rng = np.random.default_rng(comm.rank)
src, tgt = rng.integers(4, 50, size=(3, 7)), rng.integers(4, 50, size=(3, 6))


def backward():
    for p in model.parameters():
        p.grad = None
    model(src, tgt).sum().backward()


backward()
expected = [comm.all_reduce(p.grad.copy()) for p in model.parameters()]
buckets = distributed.GradientBuckets(comm, model.parameters(), bucket_mb=0.05)
buckets.arm()
backward()
end_of_backward = time.perf_counter()
started_during_backward = sum(b.work is not None and b.work.started < end_of_backward for b in buckets.buckets)
buckets.finish()
record("buckets", {"count": len(buckets.buckets), "started during backward": started_during_backward,
                   "sums equal": all(np.array_equal(p.grad, e) for p, e in zip(model.parameters(), expected)),
                   "hidden share in [0, 1]": 0.0 <= buckets.hidden_share() <= 1.0})
buckets.close()

# ------------------------------------------------------------------ agreement and drift
try:
    distributed.check_agreement(comm, {"--seed": comm.rank, "code": "same"})
    record("agreement", None)
except distributed.StartupMismatch as error:
    record("agreement", str(error))
named = list(model.named_parameters())[:3]
if comm.rank == 1:
    named[2][1].data.reshape(-1)[0] += 1.0
try:
    distributed.check_same_parameters(comm, named, step=7)
    record("drift", None)
except distributed.DriftError as error:
    record("drift", str(error))

# ------------------------------------------------------------------ a rank reports a failure
reporting = MPICommunicator()
if comm.rank == 1:
    reporting.report_failure("disk full")
    comm.barrier()
else:
    try:
        reporting.barrier()
        record("peer failed", None)
    except distributed.PeerFailed as error:
        record("peer failed", {"message": str(error), "quiet": error.quiet})
    comm.barrier()

# ------------------------------------------------------------------ a collective one rank is late for
hurried = MPICommunicator(timeout=1.0)
late = hurried.all_reduce_async(np.ones(2))
if comm.rank == 1:
    time.sleep(3)
    late.wait()
else:
    start = time.monotonic()
    try:
        late.wait()
        record("timeout", None)
    except distributed.CollectiveTimeout as error:
        record("timeout", {"message": str(error), "seconds": round(time.monotonic() - start, 1)})
    hurried.timeout = None
    late.wait()  # rank 1 comes after all: the collective completes

# ------------------------------------------------------------------ a rank dies; only its heartbeat tells
watched = MPICommunicator(heartbeat=0.2, dead_after=2.0, check_local_pids=False, timeout=None)
comm.barrier()
if comm.rank == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()
try:
    watched.barrier()
    record("heartbeat", None)
except distributed.PeerLost as error:
    record("heartbeat", {"message": str(error), "ranks": list(error.ranks), "quiet": error.quiet,
                         "seconds": round(time.monotonic() - start, 1)})
sys.stdout.flush()
os._exit(0)
