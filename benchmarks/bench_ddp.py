"""Data-parallel training on one machine: one process with two threads against two MPI ranks with
one thread each, on the same model and the same step, plus MPI's all-reduce bandwidth.

Each step trains on one batch of ``--tokens`` target tokens (``bench_step.py``'s seeded,
length-bucketed batch of random sentence pairs over a ``--vocab`` vocabulary): one process takes
all of it with two threads (as ``tinyformer train --threads 2``), two ranks take half of its rows
each with one thread (as ``tinyformer train --nproc 2 --threads 1`` at half the ``--max-tokens``)
and sum their gradients in buckets during the backward pass; every rank then applies the whole
Adam update. The loss is the trainer's (``batch_loss``, label smoothing 0.1, divided by the step's
target tokens). Reported per run: the median step time, tokens/s, the share of the measured sgemm
peak (MFU, as ``bench_step.py`` computes it: the model FLOPs of the whole step over the peak of
NumPy's float32 products with two threads, measured first in the same run) and, for the ranks,
the all-reduce time per step and the share of it hidden behind the backward pass. ``--rounds``
alternates the two runs to show the machine's noise. Then the all-reduce of float32 buffers of 1
to 64 MiB between the two ranks (median of ``--repeats``): algorithm bandwidth (bytes / time) and
bus bandwidth (2 (n − 1) / n × that, NCCL's convention).

    python benchmarks/bench_ddp.py [--preset small] [--tokens 4096] [--steps 6] [--rounds 2] [--bucket-mb 25]

The two-rank part runs this file again under ``mpiexec -n 2`` (the mpi extra).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import tinyformer  # noqa: F401  first: its OpenBLAS setting (common/blas_spin.py) must precede NumPy
import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402  (benchmarks/ is not a package)
from step_batch import LABEL_SMOOTHING, PAD, make_batch, model_flops  # noqa: E402
from step_measure import sgemm_peak  # noqa: E402

SIZES_MIB = (1, 2, 4, 8, 16, 32, 64)


def the_batch(args, rank=0, size=1):
    """bench_step's batch, or rank ``rank``'s consecutive share of its rows, as a ``data.Batch``."""
    from tinyformer.translation.data.batching import Batch

    arrays = make_batch(args.tokens, args.length, args.vocab, args.seed)
    rows = len(arrays["src"])
    part = -(-rows // size)
    mine = slice(rank * part, min(rows, (rank + 1) * part))
    return Batch(arrays["src"][mine], arrays["tgt_in"][mine], arrays["tgt_out"][mine],
                 numpy.arange(rows)[mine], pad_id=PAD), arrays


def train_steps(args, comm, threads):
    """Median step seconds, the step's target tokens and FLOPs, and (ranks) hidden share and
    all-reduce ms per step."""
    from tinyformer.engine import backend
    from tinyformer.model import nn
    from tinyformer.model.optim import Adam, NoamSchedule
    from tinyformer.translation import distributed
    from tinyformer.translation.train import blas_threads
    from tinyformer.translation.train.evaluation import batch_loss

    backend.keep_freed_memory()  # as the Trainer does on the CPU
    model = nn.Transformer.from_preset(args.preset, vocab_size=args.vocab, pad_id=PAD, seed=args.seed)
    model.train()
    adam = Adam(model.parameters(), lr=NoamSchedule(model.d_model, 4000), betas=(0.9, 0.98), eps=1e-9)
    buckets = distributed.GradientBuckets(comm, model.parameters(), args.bucket_mb) if comm.size > 1 else None
    batch, whole = the_batch(args, comm.rank, comm.size)
    tokens = whole["tgt_tokens"]
    times = []
    with blas_threads(threads):
        for step in range(args.warmup + args.steps):
            if step == args.warmup and buckets is not None:
                buckets.take_timings()
            comm.barrier()
            start = time.perf_counter()
            adam.zero_grad()
            if buckets is not None:
                buckets.arm()
            loss, _ = batch_loss(model, batch, LABEL_SMOOTHING)
            (loss * (1.0 / tokens)).backward()
            if buckets is not None:
                buckets.finish()
            adam.step()
            times.append(time.perf_counter() - start)
    params = model.num_parameters()
    result = {"step_s": statistics.median(times[args.warmup:]), "tokens": tokens, "parameters": params,
              "flops": model_flops(model.config.to_dict(), params, whole), "rows": len(whole["src"])}
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
    """One rank of the two-rank run: prints the JSON result on rank 0 (with the bandwidth table
    unless ``--no-bandwidth``)."""
    from tinyformer.translation import distributed

    comm = distributed.init()
    result = {"train": train_steps(args, comm, threads=1)}
    if not args.no_bandwidth:
        result["bandwidth"] = bandwidth(comm, args.repeats)
    if comm.rank == 0:
        print(json.dumps(result), flush=True)
    distributed.shutdown()


def two_ranks(last):
    """Runs this file's worker under ``mpiexec -n 2``; its rank 0's result."""
    from tinyformer.translation.distributed import launch

    argv = [sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:]]
    argv += [] if last else ["--no-bandwidth"]
    run = subprocess.run(launch.mpiexec_command(2, argv), capture_output=True, text=True, check=False,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    if run.returncode != 0:
        sys.exit(f"the two-rank run failed ({run.returncode}): {run.stderr.strip()[-2000:]}")
    return json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000, help="shared vocabulary (default 8000, Multi30k's)")
    parser.add_argument("--tokens", type=int, default=4096, help="target tokens per step (default 4096)")
    parser.add_argument("--length", type=int, default=32, help="padded sentence length (default 32, as bench_step)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run (default 6)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each kind, alternating (default 2)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket size (default 25)")
    parser.add_argument("--repeats", type=int, default=5, help="all-reduces per buffer size (default 5)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-bandwidth", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    for name in ("tokens", "length", "steps", "rounds", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    from tinyformer.translation import distributed
    from tinyformer.translation.train import blas_threads

    with blas_threads(2):
        peak = sgemm_peak()
    rows = []
    for round_ in range(args.rounds):
        single = train_steps(args, distributed.SingleProcess(), threads=2)
        ranks = two_ranks(last=round_ == args.rounds - 1)
        rows += [("1 process × 2 threads", single, "–", "–"),
                 ("2 ranks × 1 thread (--nproc 2)", ranks["train"],
                  f"{ranks['train']['allreduce_ms']:.1f} ms ({ranks['train']['buckets']} buckets)",
                  f"{100 * ranks['train']['hidden']:.0f} %")]
    print(provenance.header("python benchmarks/bench_ddp.py " + " ".join(sys.argv[1:])))
    print(f"preset {args.preset} ({single['parameters']:,} parameters, vocabulary "
          f"{args.vocab}); one batch of {single['rows']} pairs padded to {args.length}, {single['tokens']:,} target "
          f"tokens per step (the ranks: half of its rows each); median of {args.steps} steps after {args.warmup}; "
          f"{args.rounds} round(s), alternating; buckets of {args.bucket_mb:g} MiB; sgemm peak {peak:,.0f} GFLOP/s "
          "(NumPy float32, 2 threads, step_measure.sgemm_peak)")
    print("\n| run | step | tokens/s | MFU | all-reduce per step | hidden behind backward |\n|---|---|---|---|---|---|")
    for name, result, allreduce, hidden in rows:
        print(f"| {name} | {result['step_s']:.3f} s | {result['tokens'] / result['step_s']:,.0f} | "
              f"{result['flops'] / result['step_s'] / (peak * 1e9):.1%} | {allreduce} | {hidden} |")
    speedups = [rows[i][1]["step_s"] / rows[i + 1][1]["step_s"] for i in range(0, len(rows), 2)]
    print(f"\nspeed-up of two ranks (one process's step / the ranks' step, per round): "
          f"{', '.join(f'{s:.2f}×' for s in speedups)}")
    print("\n| buffer | all-reduce | algorithm bandwidth | bus bandwidth |\n|---|---|---|---|")
    for row in ranks["bandwidth"]:
        print(f"| {row['MiB']} MiB | {row['ms']:.2f} ms | {row['algbw_GBps']:.2f} GB/s | "
              f"{row['busbw_GBps']:.2f} GB/s |")


if __name__ == "__main__":
    main()
