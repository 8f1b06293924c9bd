#!/usr/bin/env bash
# Issue 49's recipe sweep in short runs: `tinyformer train --recipe hour`'s choices varied one at a
# time, each point trained by bench_quality.py (tinyformer alone, one thread, a linear schedule that
# warms up to a peak and falls to zero at the last step: the step-count twin of `--schedule time`)
# for every seed, and chosen by the validation NLL (no smoothing, dropout off) only; the test split
# is not decoded (--no-score). JOBS runs at a time (one thread each; default 2, the machine's
# cores), so that the points of a pair share the machine alike. Resumable: every run saves its
# training state every 100 steps and a finished one is skipped (--skip-done); run it again after an
# interruption. The reports are appended to REPORT; benchmarks/recipe_summary.py tabulates them.
#
#   WORK=runs/recipe REPORT=runs/recipe/sweep.md SEEDS="0 1" POINTS="base peak dropout tokens" benchmarks/recipe_sweep.sh
#
# The points (STEPS steps of up to 4,096 padded tokens; the nominal peak = lr_factor * 256^-0.5 *
# warmup^-0.5, as `--recipe hour` sets it; the decay runs from the start, so the highest rate reached,
# at the end of the warm-up, is (1 - warmup/STEPS) of it: 0.75 of it for base):
#   base     warm-up STEPS/4 to a nominal peak of 2.5e-3 (the hour's), `small`'s dropout 0.1
#   peak     the same warm-up to 3.75e-3 (1.5x)
#   higher   the same warm-up to 5e-3 (2x)
#   low      the same warm-up to 1.67e-3 (1/1.5)
#   dropout  base with dropout 0.2 (residual, embeddings, attention and ReLU)
#   tokens   8,192 tokens a batch for STEPS/2 steps (the same tokens seen), base's peak
#   warmup   base's peak after a warm-up of STEPS/8
#   decay    base's peak held until half of the steps, then the linear decay to zero (--decay-fraction 0.5)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-runs/recipe}
REPORT=${REPORT:-$WORK/sweep.md}
SEEDS=${SEEDS:-0 1}
STEPS=${STEPS:-800}
JOBS=${JOBS:-2}
POINTS=${POINTS:-base peak dropout tokens}
ARGS=${ARGS:-}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, installed or not
mkdir -p "$WORK"

# factor PEAK WARMUP: the Noam factor whose peak after WARMUP steps is PEAK (small: d_model 256)
factor() { "$PYTHON" -c "import sys; p, w = map(float, sys.argv[1:]); print(f'{p / (256 ** -0.5 * w ** -0.5):.6g}')" "$1" "$2"; }

point_options() {
    local warmup=$((STEPS / 4)) steps=$STEPS val=$((STEPS / 4))
    case $1 in
        base) echo "--steps $steps --warmup-steps $warmup --lr-factor $(factor 2.5e-3 $warmup) --val-every $val" ;;
        peak) echo "--steps $steps --warmup-steps $warmup --lr-factor $(factor 3.75e-3 $warmup) --val-every $val" ;;
        higher) echo "--steps $steps --warmup-steps $warmup --lr-factor $(factor 5e-3 $warmup) --val-every $val" ;;
        low) echo "--steps $steps --warmup-steps $warmup --lr-factor $(factor 1.6667e-3 $warmup) --val-every $val" ;;
        dropout) echo "--steps $steps --warmup-steps $warmup --lr-factor $(factor 2.5e-3 $warmup) --val-every $val --dropout 0.2" ;;
        tokens) echo "--steps $((steps / 2)) --warmup-steps $((warmup / 2)) --lr-factor $(factor 2.5e-3 $((warmup / 2)))" \
                     "--val-every $((val / 2)) --max-tokens 8192" ;;
        warmup) echo "--steps $steps --warmup-steps $((warmup / 2)) --lr-factor $(factor 2.5e-3 $((warmup / 2))) --val-every $val" ;;
        decay) echo "--steps $steps --warmup-steps $warmup --lr-factor $(factor 2.5e-3 $warmup) --val-every $val --decay-fraction 0.5" ;;
        *) echo "recipe_sweep.sh: unknown point '$1' in POINTS (known: base peak higher low dropout tokens warmup decay)" >&2; exit 2 ;;
    esac
}

invocations=()
for point in $POINTS; do
    options=$(point_options "$point")
    for seed in $SEEDS; do
        invocations+=("--seed $seed $options")
    done
done
for invocation in "${invocations[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        wait -n || true  # a failed run says why in its own output; the others go on
    done
    # shellcheck disable=SC2086 # the invocation's options and ARGS are words
    "$PYTHON" benchmarks/bench_quality.py --engines tinyformer --schedule linear --no-score --save-every 100 \
        --work "$WORK" --report "$REPORT" --skip-done $invocation $ARGS &
done
wait
