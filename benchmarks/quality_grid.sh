#!/usr/bin/env bash
# Issue 28's measurements at 800 steps, each seed: the paper's configuration (tinyformer's default)
# against stock PyTorch nn.Transformer on identical batches, then each of PyTorch's extras alone in
# tinyformer, and all of them. Every invocation is bench_quality.py with --skip-done and its
# training state saved every 100 steps: run this again after an interruption and it continues
# where it stopped (a finished invocation is skipped). JOBS invocations at a time (one thread
# each; default 2); the reports are appended to REPORT.
#
#   WORK=runs/bench-quality REPORT=runs/bench-quality/grid.md SEEDS="0 1" JOBS=2 benchmarks/quality_grid.sh
#
# ARGS adds options to every invocation (e.g. ARGS="--data synthetic --preset tiny --limit 20" for a
# quick rehearsal).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-runs/bench-quality}
REPORT=${REPORT:-$WORK/grid.md}
SEEDS=${SEEDS:-0 1}
STEPS=${STEPS:-800}
JOBS=${JOBS:-2}
ARGS=${ARGS:-}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, installed or not
mkdir -p "$WORK"
invocations=()
for seed in $SEEDS; do
    invocations+=("--seed $seed --engines tinyformer,torch")
done
for extra in torch-init final-norm all attention-dropout activation-dropout; do
    for seed in $SEEDS; do
        invocations+=("--seed $seed --engines tinyformer --tf-extras $extra")
    done
done
for invocation in "${invocations[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        wait -n || true  # a failed invocation says why in its own output; the others go on
    done
    # shellcheck disable=SC2086 # the invocation's options and ARGS are words
    "$PYTHON" benchmarks/bench_quality.py --steps "$STEPS" --work "$WORK" --report "$REPORT" --skip-done \
        $invocation $ARGS &
done
wait
