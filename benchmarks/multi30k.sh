#!/usr/bin/env bash
# Train `small` En→De on Multi30k with the issue's recipe and score test_2016_flickr.
#
#   benchmarks/multi30k.sh [RUN_DIR] [STEPS]        (defaults: runs/multi30k-small, 3000)
#
# Recipe: joint BPE 8k, ~4,096 tokens per batch, Noam factor 1 with warm-up 800, label
# smoothing 0.1, dropout 0.1; evaluation with beam 4, α 0.6, one checkpoint (no averaging),
# then the average of the last 5 checkpoints as well. Data: --data-dir, $TINYFORMER_DATA,
# the user cache, or a download. Wall time is printed by `time`.
set -euo pipefail
run_dir=${1:-runs/multi30k-small}
steps=${2:-3000}
date -u +"start %Y-%m-%dT%H:%M:%SZ"
time tinyformer train --data multi30k --src en --tgt de --preset small --vocab-size 8000 \
    --max-tokens 4096 --warmup-steps 800 --lr-factor 1 --label-smoothing 0.1 \
    --max-steps "$steps" --save-every 500 --eval-every 500 --bleu-samples 200 \
    --save-dir "$run_dir" --no-progress --no-test
last=$(ls "$run_dir"/checkpoint_*.npz | tail -n 1)
echo "== one checkpoint: $last"
time tinyformer eval --checkpoint "$last" --split test --beam 4 --alpha 0.6
tinyformer average --dir "$run_dir" --last 5 --output "$run_dir/averaged.npz"
echo "== average of the last 5 checkpoints"
time tinyformer eval --checkpoint "$run_dir/averaged.npz" --split test --beam 4 --alpha 0.6
date -u +"end %Y-%m-%dT%H:%M:%SZ"
