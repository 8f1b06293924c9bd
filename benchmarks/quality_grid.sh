#!/usr/bin/env bash
# Issue 28's measurements at 800 steps, each seed: tinyformer's preset as `tinyformer train` builds
# it (small: PyTorch's init) against stock PyTorch nn.Transformer on identical batches, then the
# paper's model (no extra), all of PyTorch's extras in tinyformer, and each alone (the preset's own
# is skipped: the pair trained it). Every invocation is bench_quality.py with --skip-done and its
# training state saved every 100 steps: run this again after an interruption and it continues
# where it stopped (a finished invocation is skipped). JOBS engine runs at a time (one thread
# each; default 2): a side-by-side pair runs alone when JOBS is 2, so that its step times are
# measured side by side and nothing else; the reports are appended to REPORT.
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
for extra in none all torch-init final-norm attention-dropout activation-dropout; do
    for seed in $SEEDS; do
        invocations+=("--seed $seed --engines tinyformer --tf-extras $extra")
    done
done
for invocation in "${invocations[@]}"; do
    runs=1
    [[ $invocation == *tinyformer,torch* ]] && runs=2  # a pair trains both engines at once
    while [ "$(jobs -rp | wc -l)" -gt $((JOBS - runs)) ]; do
        wait -n || true  # a failed invocation says why in its own output; the others go on
    done
    # shellcheck disable=SC2086 # the invocation's options and ARGS are words
    "$PYTHON" benchmarks/bench_quality.py --steps "$STEPS" --work "$WORK" --report "$REPORT" --skip-done \
        $invocation $ARGS &
    if [ "$runs" -ge "$JOBS" ]; then wait || true; fi  # it holds every slot until it ends
done
wait
