"""Data-parallel training on one machine: one process with two threads against two MPI ranks with
one thread each, on the same model and the same global batch, plus MPI's all-reduce bandwidth.

Each step trains on two batches of about ``--tokens`` target tokens (random sentence pairs over a
``--vocab`` vocabulary): one process accumulates both (as ``tinyformer train --accum 2 --threads 2``),
two ranks take one each and sum their gradients in buckets during the backward pass (as
``tinyformer train --nproc 2 --threads 1``). Reported: the median step time, tokens/s, and for the
ranks the all-reduce time per step and the share of it hidden behind the backward pass; then the
all-reduce of float32 buffers of 1 to 64 MiB between the two ranks (median of ``--repeats``):
algorithm bandwidth (bytes / time) and bus bandwidth (2 (n − 1) / n × that, NCCL's convention).

    python benchmarks/bench_ddp.py [--preset small] [--tokens 4096] [--steps 6] [--bucket-mb 25]

The two-rank part runs this file again under ``mpiexec -n 2`` (the mpi extra).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy

SIZES_MIB = (1, 2, 4, 8, 16, 32, 64)


def make_batches(count, tokens, vocab, seed=0):
    """``count`` batches of random pairs, lengths 15-30, about ``tokens`` target tokens each."""
    from tinyformer.translation.data.batching import make_batch

    rng = numpy.random.default_rng(seed)
    batches = []
    for _ in range(count):
        src, tgt, total = [], [], 0
        while total < tokens:
            n = int(rng.integers(15, 31))
            src.append(rng.integers(4, vocab, size=int(rng.integers(15, 31))).tolist())
            tgt.append(rng.integers(4, vocab, size=n - 1).tolist())
            total += n
        batches.append(make_batch(src, tgt))
    return batches


def train_steps(args, comm, threads):
    """Median step seconds, tokens per step, and (ranks) hidden share and all-reduce ms per step."""
    from tinyformer.translation import distributed
    from tinyformer.model import nn
    from tinyformer.model.optim import Adam, NoamSchedule
    from tinyformer.translation.train import blas_threads
    from tinyformer.translation.train.evaluation import batch_loss

    model = nn.Transformer.from_preset(args.preset, vocab_size=args.vocab, seed=0)
    adam = Adam(model.parameters(), lr=NoamSchedule(model.d_model, 4000))
    buckets = distributed.GradientBuckets(comm, model.parameters(), args.bucket_mb) if comm.size > 1 else None
    batches = make_batches(2, args.tokens, args.vocab)
    mine = batches[comm.rank::comm.size]
    tokens = sum(b.num_tokens for b in batches)
    times = []
    with blas_threads(threads):
        for step in range(args.warmup + args.steps):
            if step == args.warmup and buckets is not None:
                buckets.take_timings()
            comm.barrier()
            start = time.perf_counter()
            adam.zero_grad()
            for i, batch in enumerate(mine):
                if buckets is not None and i == len(mine) - 1:
                    buckets.arm()
                loss, _ = batch_loss(model, batch, 0.1)
                (loss * (1.0 / tokens)).backward()
            if buckets is not None:
                buckets.finish()
            adam.step()
            times.append(time.perf_counter() - start)
    result = {"step_s": statistics.median(times[args.warmup:]), "tokens": tokens,
              "parameters": model.num_parameters()}
    if buckets is not None:
        hidden, seconds = buckets.take_timings()
        result.update(hidden=hidden, allreduce_ms=1000 * seconds, buckets=len(buckets.buckets))
    return result


def bandwidth(comm, repeats):
    rows = []
    for mib in SIZES_MIB:
        buffer = numpy.ones(mib * (1 << 20) // 4, dtype=numpy.float32)
        comm.all_reduce(buffer)  # warm up: connections and pages
        times = []
        for _ in range(repeats):
            comm.barrier()
            start = time.perf_counter()
            comm.all_reduce(buffer)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        algorithm = buffer.nbytes / seconds / 1e9
        rows.append({"MiB": mib, "ms": 1000 * seconds, "algbw_GBps": algorithm,
                     "busbw_GBps": algorithm * 2 * (comm.size - 1) / comm.size})
    return rows


def worker(args):
    """One rank of the two-rank run: prints the JSON result on rank 0."""
    from tinyformer.translation import distributed

    comm = distributed.init()
    result = {"train": train_steps(args, comm, threads=1), "bandwidth": bandwidth(comm, args.repeats)}
    if comm.rank == 0:
        print(json.dumps(result), flush=True)
    distributed.shutdown()


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=False).stdout.strip() or "?"
    except OSError:
        return "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000, help="shared vocabulary (default 8000, Multi30k's)")
    parser.add_argument("--tokens", type=int, default=4096, help="target tokens per batch (default 4096)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps (default 6)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket size (default 25)")
    parser.add_argument("--repeats", type=int, default=5, help="all-reduces per buffer size (default 5)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    from tinyformer.translation import distributed
    from tinyformer.translation.distributed import launch

    single = train_steps(args, distributed.SingleProcess(), threads=2)
    command = launch.mpiexec_command(2, [sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:]])
    run = subprocess.run(command, capture_output=True, text=True, check=False,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    if run.returncode != 0:
        sys.exit(f"the two-rank run failed ({run.returncode}): {run.stderr.strip()[-2000:]}")
    ranks = json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][-1])
    ddp = ranks["train"]
    print(f"bench_ddp: {datetime.date.today()}, commit {commit()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; preset {args.preset} ({single['parameters']:,} parameters, vocabulary "
          f"{args.vocab}), 2 batches of ~{args.tokens} target tokens per step, median of {args.steps} steps "
          f"after {args.warmup}; buckets of {args.bucket_mb:g} MiB")
    rows = [("1 process × 2 threads (--accum 2)", single, "", ""),
            ("2 ranks × 1 thread (--nproc 2)", ddp, f"{ddp['allreduce_ms']:.1f} ms ({ddp['buckets']} buckets)",
             f"{100 * ddp['hidden']:.0f} %")]
    print("\n| run | step | tokens/s | all-reduce per step | hidden behind backward |\n|---|---|---|---|---|")
    for name, result, allreduce, hidden in rows:
        print(f"| {name} | {result['step_s']:.2f} s | {result['tokens'] / result['step_s']:,.0f} | "
              f"{allreduce or '–'} | {hidden or '–'} |")
    print(f"\nspeed-up of two ranks: {single['step_s'] / ddp['step_s']:.2f}×")
    print("\n| buffer | all-reduce | algorithm bandwidth | bus bandwidth |\n|---|---|---|---|")
    for row in ranks["bandwidth"]:
        print(f"| {row['MiB']} MiB | {row['ms']:.2f} ms | {row['algbw_GBps']:.2f} GB/s | {row['busbw_GBps']:.2f} GB/s |")


if __name__ == "__main__":
    main()
