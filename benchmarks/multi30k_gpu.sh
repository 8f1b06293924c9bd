#!/usr/bin/env bash
# Issue 17's Multi30k run: `small` En→De on one GPU with the step as CUDA graphs, in bf16, trained
# for at most MINUTES (default 5) with early stopping on validation BLEU, the last 5 checkpoints
# averaged, test_2016_flickr scored with beam 4, α 0.6 (sacreBLEU and tokenized lowercased BLEU).
#
#   benchmarks/multi30k_gpu.sh LOG_DIR [RUN_DIR] [MINUTES]
#
# LOG_DIR gets multi30k_gpu.log (everything this script prints), multi30k_gpu_test.txt (the test
# evaluation) and multi30k_gpu_metrics.jsonl (a copy of the run's metrics); RUN_DIR (default
# LOG_DIR/run) gets the checkpoints, spm.model and metrics.jsonl, and must not hold checkpoints
# yet. Recipe as benchmarks/multi30k.sh: joint BPE 8k, 4,096 tokens
# per batch, Noam factor 1 with warm-up 800, label smoothing 0.1, the preset's dropout 0.1; here
# with --time-limit MINUTES, --patience 3 (three validations in a row without a better greedy BLEU
# on 500 validation sentences stop it), a validation and a checkpoint every 500 steps. MINUTES counts
# the training loop (the trainer's --time-limit); setup, the last validation, averaging and the
# test evaluation come on top (about 1.5 minutes). Data: $TINYFORMER_DATA, the user cache, or a
# download. PYTHON names the interpreter (default python, else python3).
set -euo pipefail

if (($# < 1 || $# > 3)); then
    echo "usage: benchmarks/multi30k_gpu.sh LOG_DIR [RUN_DIR] [MINUTES]" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log_dir=$1
run_dir=${2:-$log_dir/run}
minutes=${3:-5}
if ! awk -v m="$minutes" 'BEGIN { exit !(m + 0 == m && m > 0) }'; then
    echo "multi30k_gpu: MINUTES must be a positive number, got '$minutes'" >&2
    exit 2
fi
mkdir -p "$log_dir" || { echo "multi30k_gpu: cannot create LOG_DIR $log_dir" >&2; exit 2; }
log=$log_dir/multi30k_gpu.log
exec > >(tee -a "$log") 2>&1

PYTHON=${PYTHON:-$(command -v python || command -v python3 || echo python)}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
tinyformer() { "$PYTHON" -m tinyformer.cli "$@"; }

echo "multi30k_gpu: small En→De, --cuda-graphs on, bf16, at most $minutes minutes of training"
date -u +"start %Y-%m-%dT%H:%M:%SZ"
echo "run directory: $run_dir; log: $log"

start=$(date +%s.%N)
tinyformer train --data multi30k --src en --tgt de --preset small --vocab-size 8000 \
    --max-tokens 4096 --warmup-steps 800 --lr-factor 1 --label-smoothing 0.1 \
    --device cuda --cuda-graphs on --precision bf16 \
    --max-steps 1000000 --time-limit "$minutes" --patience 3 --eval-every 500 --save-every 500 \
    --keep-last 5 --bleu-samples 500 --save-dir "$run_dir" --no-progress --no-test
train_seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
cp "$run_dir/metrics.jsonl" "$log_dir/multi30k_gpu_metrics.jsonl"

echo "== average of the last 5 checkpoints"
tinyformer average --dir "$run_dir" --last 5 --output "$run_dir/averaged.npz"
echo "== test_2016_flickr, averaged checkpoint, beam 4, alpha 0.6"
start=$(date +%s.%N)
scores=$log_dir/multi30k_gpu_test.txt
tinyformer eval --checkpoint "$run_dir/averaged.npz" --split test --beam 4 --alpha 0.6 --device cuda | tee "$scores"
eval_seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')

echo "== summary"
"$PYTHON" - "$run_dir/metrics.jsonl" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
steps = [r for r in records if "split" not in r and "skipped" not in r]
val = [r for r in records if r.get("split") == "val"]
if steps:
    last = steps[-1]
    graphs = (f"; CUDA graphs: {last['graph_shapes']} shapes, {last['graphs']} captured, private pool "
              f"{last['graph_pool_mib']} MiB" if "graphs" in last else "; no CUDA graphs (eager steps)")
    trained = max(r["step"] for r in steps + val)  # training is logged every 10 steps; the stop is validated
    print(f"steps trained: {trained} (epoch {last['epoch']}){graphs}")
if val:
    best = max(val, key=lambda r: r["bleu_greedy"])
    print(f"validations: {len(val)}; best greedy BLEU {best['bleu_greedy']} at step {best['step']}, "
          f"last {val[-1]['bleu_greedy']} at step {val[-1]['step']}")
EOF
echo "training wall time: ${train_seconds} s (tinyformer train with its setup and last validation;" \
    "--time-limit $minutes min)"
echo "test evaluation wall time: ${eval_seconds} s"
grep -E "^test: (BLEU|tokenized lowercased BLEU) " "$scores" ||
    echo "multi30k_gpu: no BLEU line in the evaluation's output"
date -u +"end %Y-%m-%dT%H:%M:%SZ"
