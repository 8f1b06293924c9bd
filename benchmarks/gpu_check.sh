#!/usr/bin/env bash
# One GPU check of tinyformer, at most 570 s on one GPU (one 600 s device call), everything into one
# report file.
#
#   benchmarks/gpu_check.sh [REPORT]      (default benchmarks/results/gpu_check_<date>.txt)
#
# Stages, each under `timeout` and clipped to what is left of an overall budget, the open questions first
# (issue 63: CUDA graphs proven on hardware, no device minute spent compiling). No NVRTC compile check runs
# here: `python -m tinyformer.testing.compile_check` is a CPU job, and CI runs it.
#   nvidia-smi          GPU name, driver, memory, compute capability
#   python env          Python, NumPy, CuPy (runtime, driver, device), PyTorch, the C++ compiler; fails
#                       without a usable GPU
#   kernels             python -m tinyformer.engine.kernels.warm: every kernel module loaded once, serially, from
#                       the prebuilt cubins ($TINYFORMER_CUBINS, default build/cubins when it has a manifest) or
#                       compiled into CuPy's disk cache; prints the seconds spent compiling
#   graph tests         tests/translation/train/test_graphs.py: 100 steps with --cuda-graphs on = 100 eager steps bit for
#   gradcheck cuda      bit (fp32, bf16), exact resume, shapes/graphs/pool, the capture fallback; gradcheck
#   docs gpu            --device cuda (float64 layers, every kernel against its reference); the manual's
#                       `docs-test: gpu` blocks as written. These three run side by side (none times anything);
#                       each one's output follows in the report when all three are done
#   multi30k graphs     benchmarks/multi30k_gpu.sh: small En→De, --cuda-graphs on, bf16, --time-limit
#                       (5 minutes, less when the budget left is short), --patience 3, the last 5
#                       checkpoints averaged, test BLEU with beam 4 (only when TINYFORMER_DATA is set);
#                       its log and metrics go to REPORT's name with _multi30k instead of .txt
#   bench_step graphs   benchmarks/bench_step.py --device cuda --cuda-graphs --preset small,base at 4,096
#   (fp32, bf16)        tokens: tinyformer with graphs and eager, PyTorch eager and PyTorch graphs
#                       (--vs-torch when PyTorch has CUDA), ratios, kernel launches per step
#   launch count        benchmarks/launch_count.py --device cuda: launches per captured step by family, and the
#                       graph's nodes by type as the CUDA driver counts them
#   sm_75 capped tests  issue 66: with TINYFORMER_MAX_CAPABILITY=sm_75 (a T4's path on this GPU), the GPU test of
#   multi30k sm_75 fp16 the capped dispatch, then 200 fp16 steps of the Multi30k recipe on it (with TINYFORMER_DATA)
# Earlier checks' stages follow while budget is left:
#   tensor-core tests   the GPU tests of the tensor-core attention and of its instructions
#   gpu tests           every other GPU test (-m gpu over the files that hold them), on 8 pytest-xdist workers
#   bench_attention     benchmarks/bench_attention.py: fp16/bf16, S 128/1024, D 64, not causal, next to
#                       each PyTorch SDPA backend
#   bench_rows          benchmarks/bench_attention.py --skip-attention --quick (row kernels, GB/s)
#   bench_attention all benchmarks/bench_attention.py --skip-rows: every dtype, causal and not, S 128-4096
#   bench_step          benchmarks/bench_step.py --device cuda --preset small,base (--vs-torch when
#                       PyTorch has CUDA)
#   bench_step bf16     the same at 16,384 tokens in bf16 (tinyformer.engine.amp; PyTorch under autocast(bfloat16))
#   train cuda          the quick start's job on the GPU: tinyformer train --device cuda (synthetic task,
#                       300 steps, then beam-search evaluation on its test split)
#   multi30k cuda       200 steps of the Multi30k recipe on the GPU (only when TINYFORMER_DATA is set)
#   multi30k bf16       the same 200 steps in bf16, to set its validation loss beside fp32's
# A failing stage is recorded as FAIL and the next one runs; a stage the budget has no time left
# for is recorded as SKIP. The exit status is 1 if any stage failed.
# PYTHON names the interpreter (default: python, else python3); GPU_CHECK_BUDGET overrides the
# overall budget in seconds (default 570, which keeps the whole run inside one 600 s device call);
# GPU_CHECK_ONLY, a comma-separated list of stage names, runs those alone (a rerun of the stages a
# run found failing), the others recorded as SKIP.
set -u

BUDGET=${GPU_CHECK_BUDGET:-570}  # seconds for all stages together; `timeout -k` may add KILL_AFTER to one
MULTI30K_RESERVE=50  # seconds of the multi30k graphs stage that are not training: setup, averaging, test BLEU
# (29 s on an H200 with 2.2 minutes of training: BPE, the last validation, averaging, beam-4 test BLEU)
KILL_AFTER=5
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

report=${1:-$ROOT/benchmarks/results/gpu_check_$(date +%Y%m%d-%H%M%S).txt}
case $report in /*) ;; *) report=$PWD/$report ;; esac
mkdir -p "$(dirname "$report")" && : >"$report" || { echo "gpu_check: cannot write $report" >&2; exit 2; }

PYTHON=${PYTHON:-$(command -v python || command -v python3 || echo python)}
export PYTHONUNBUFFERED=1   # stage output reaches the report as it comes, even when a stage is killed
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 2

names=() statuses=() times=() notes=()

log() {
    printf '%s\n' "$*" | tee -a "$report"
}

# unselected NAME: true, with NAME recorded as SKIP, when GPU_CHECK_ONLY is set and does not name it.
unselected() {
    [[ -n ${GPU_CHECK_ONLY:-} && ",$GPU_CHECK_ONLY," != *",$1,"* ]] || return 1
    record "$1" SKIP 0 "not selected (GPU_CHECK_ONLY)"
}

# stage_limit NAME CAP_SECONDS: set `limit` to the stage's time limit (CAP clipped to the budget
# left), or record NAME as SKIP and fail when under 10 s are left.
stage_limit() {
    unselected "$1" && return 1
    local left=$((BUDGET - SECONDS))
    limit=$(($2 < left ? $2 : left))
    if ((limit < 10)); then
        log ""
        log "== $1: not run, the ${BUDGET}s budget is spent"
        record "$1" SKIP 0 "not run: budget spent"
        return 1
    fi
}

stage_header() {  # NAME LIMIT COMMAND...
    local name=$1 limit=$2
    shift 2
    local shown=${*//$'\n'/ }
    ((${#shown} > 160)) && shown="${shown:0:157}..."
    log ""
    log "== $name (limit ${limit}s): $shown"
}

record_outcome() {  # NAME RC SECONDS LIMIT
    if (($2 == 0)); then
        record "$1" PASS "$3" ""
    elif (($2 == 124 || $2 == 137)); then
        record "$1" FAIL "$3" "timed out after ${4}s"
    else
        record "$1" FAIL "$3" "exit status $2$(stage_hint "$1" "$2")"
    fi
}

# run_stage NAME CAP_SECONDS COMMAND...: run COMMAND under timeout, tee its output, record the outcome.
run_stage() {
    local name=$1 cap=$2 limit
    shift 2
    stage_limit "$name" "$cap" || return 0
    stage_header "$name" "$limit" "$@"
    local start=$SECONDS
    timeout -k "$KILL_AFTER" "$limit" "$@" 2>&1 | tee -a "$report"
    local rc=${PIPESTATUS[0]}
    record_outcome "$name" "$rc" $((SECONDS - start)) "$limit"
}

# start_stage NAME CAP_SECONDS COMMAND...: run COMMAND under timeout in the background, its output
# to a file of its own; finish_stages waits for every started stage, then copies each one's output
# into the report and records its outcome, in the order they were started.
background=()
start_stage() {
    local name=$1 cap=$2 limit
    shift 2
    stage_limit "$name" "$cap" || return 0
    stage_header "$name" "$limit" "$@"
    log "   (runs in the background; its output follows when the stages beside it are done)"
    local output=$scratch/stage-${#background[@]}.log
    (
        start=$SECONDS
        timeout -k "$KILL_AFTER" "$limit" "$@" >"$output" 2>&1
        echo "$? $((SECONDS - start))" >"$output.status"
    ) &
    background+=("$name|$limit|$output")
}

finish_stages() {
    wait
    local entry name limit output rc took
    for entry in "${background[@]}"; do
        IFS='|' read -r name limit output <<<"$entry"
        read -r rc took <"$output.status" || { rc=1 took=0; }
        log ""
        log "== $name: its output"
        tee -a "$report" <"$output"
        record_outcome "$name" "$rc" "$took" "$limit"
    done
    background=()
}

stage_hint() {
    if [[ $1 == "gpu tests" && $2 == 5 ]]; then
        echo " (no tests selected by -m gpu)"
    elif [[ $2 == 127 ]]; then
        echo " (command not found)"
    fi
}

record() {
    names+=("$1") statuses+=("$2") times+=("$3") notes+=("$4")
    log "-- $1: $2 (${3}s)${4:+: $4}"
}

PYINFO=$(cat <<'EOF'
import platform, sys
import numpy
print(f"python {platform.python_version()} ({sys.executable}), numpy {numpy.__version__}")
try:
    import cupy
    rt, drv = cupy.cuda.runtime.runtimeGetVersion(), cupy.cuda.runtime.driverGetVersion()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name, memory = props["name"].decode(), props["totalGlobalMem"] / 2**30
    print(f"cupy {cupy.__version__}, CUDA runtime {rt}, driver API {drv}, device 0: {name} "
          f"(sm_{props['major']}{props['minor']}, {memory:.0f} GiB)")
except Exception as error:
    print(f"cupy: unusable: {type(error).__name__}: {error}")
try:
    import torch
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, built for CUDA {torch.version.cuda}")
except ImportError:
    print("torch: not installed")
import shutil, subprocess
compiler = shutil.which("g++") or shutil.which("clang++")
print("C++ compiler (the emulation's test): " + (subprocess.run([compiler, "--version"], capture_output=True,
      text=True).stdout.splitlines()[0] if compiler else "none"))
from tinyformer import backend
print(f"tinyformer.engine.backend.is_gpu_available(): {backend.is_gpu_available()}")
sys.exit(0 if backend.is_gpu_available() else 1)
EOF
)

torch_has_cuda() {
    timeout 30 "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

log "tinyformer GPU check"
log "report: $report"
log "date: $(date -Is)"
log "host: $(uname -srm), $(nproc) cpus"
log "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo ' (working tree modified)')"
log "python: $PYTHON"
step_args=(--device cuda --preset small,base)
if torch_has_cuda; then  # before the stages, so that its time counts against the budget
    step_args+=(--vs-torch)
    log "PyTorch with CUDA: yes, bench_step runs with --vs-torch"
else
    log "PyTorch with CUDA: no, bench_step runs without --vs-torch"
fi

scratch=$(mktemp -d) && trap 'rm -rf "$scratch"' EXIT
run_stage "nvidia-smi" 15 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
run_stage "python env" 30 "$PYTHON" -c "$PYINFO"
tensor_cores="hardware or tensor_core"
graph_tests=tests/translation/train/test_graphs.py
# The files that hold GPU tests (pytest -m gpu over them alone: the others need packages a GPU machine may lack).
gpu_test_files=(tests/engine/kernels/test_emulation.py tests/engine/kernels/test_cublas.py
                tests/engine/kernels/test_device_seed.py tests/engine/test_amp.py tests/engine/test_backend.py
                tests/engine/functional/test_devices.py tests/translation/test_distributed.py)
pytest_args=(-m gpu -q -rfE --tb=short --durations=5 -p no:cacheprovider)
# The kernels first: every module loaded from the prebuilt cubins in $TINYFORMER_CUBINS (default
# build/cubins where it holds a manifest: built on the CPU, no device minute spent compiling, with
#   python -m tinyformer.engine.kernels.cubins build/cubins --arch sm_90
# and carried to the device), or compiled once, serially, into CuPy's disk cache, so that no later stage
# and no test worker compiles a module again. Its last line gives the seconds spent compiling.
if [[ -z ${TINYFORMER_CUBINS:-} && -f $ROOT/build/cubins/manifest.json ]]; then
    export TINYFORMER_CUBINS=$ROOT/build/cubins
fi
log "prebuilt cubins: ${TINYFORMER_CUBINS:-none (every module is compiled on the device)}"
run_stage "kernels" 150 "$PYTHON" -m tinyformer.engine.kernels.warm
# The open questions (issue 63), in order. The three that check results and time nothing run side by side:
# the graph tests (100 steps with --cuda-graphs on = 100 eager steps bit for bit, fp32 and bf16, exact
# resume, the capture fallback); gradcheck in float64 of every layer (the reference attention on CuPy) and of
# every kernel against its reference (the kernel path); the manual's GPU code blocks as written.
start_stage "graph tests" 180 "$PYTHON" -m pytest "${pytest_args[@]}" -n 6 "$graph_tests"
start_stage "gradcheck cuda" 180 "$PYTHON" -m tinyformer.cli gradcheck --device cuda
start_stage "docs gpu" 150 "$PYTHON" -m pytest -q -rfE --tb=short -p no:cacheprovider -n 2 tests/project/test_docs.py \
    -k "test_every_code_block_runs and gpu"
finish_stages

if unselected "multi30k graphs"; then
    :
elif [[ -n ${TINYFORMER_DATA:-} ]]; then
    # Training gets what the stage's limit leaves after MULTI30K_RESERVE, at most 5 minutes.
    left=$((BUDGET - SECONDS))
    multi30k_limit=$((390 < left ? 390 : left))
    minutes=$(awk -v s=$((multi30k_limit - MULTI30K_RESERVE)) 'BEGIN { m = s / 60; printf "%.2f", (m > 5 ? 5 : m) }')
    if awk -v m="$minutes" 'BEGIN { exit !(m >= 0.5) }'; then
        log ""
        log "multi30k graphs: ${minutes} minutes of training in a stage limit of ${multi30k_limit}s"
        report_name=$(basename "$report")
        run_stage "multi30k graphs" 390 bash benchmarks/multi30k_gpu.sh \
            "$(dirname "$report")/${report_name%.*}_multi30k" "$scratch/multi30k-graphs" "$minutes"
    else
        log ""
        log "== multi30k graphs: not run, ${multi30k_limit}s left leave under half a minute of training"
        record "multi30k graphs" SKIP 0 "not run: budget spent"
    fi
else
    log ""
    log "== multi30k graphs: not run, TINYFORMER_DATA is not set"
    record "multi30k graphs" SKIP 0 "not run: TINYFORMER_DATA is not set"
fi

graph_step_args=("${step_args[@]}" --cuda-graphs --tokens 4096 --repeats 5 --markdown)
run_stage "bench_step graphs fp32" 75 "$PYTHON" benchmarks/bench_step.py "${graph_step_args[@]}" --precision fp32
run_stage "bench_step graphs bf16" 75 "$PYTHON" benchmarks/bench_step.py "${graph_step_args[@]}" --precision bf16
# Launches per captured step by family, and the graph's nodes by type from the CUDA driver (the CPU's
# emulated count of the same step: benchmarks/results/launches.md).
run_stage "launch count" 60 "$PYTHON" benchmarks/launch_count.py --device cuda --families
# Issue 66: the T4's path on this GPU, its capability capped at 7.5 (TINYFORMER_MAX_CAPABILITY): the GPU test of
# the capped dispatch (fp16 attention on CUDA cores, bf16 refused), then 200 steps of the Multi30k recipe in fp16
# on that path (fp32's path is the same kernels on any GPU: the gpu tests and `train cuda` run it).
run_stage "sm_75 capped tests" 60 env TINYFORMER_MAX_CAPABILITY=sm_75 "$PYTHON" -m pytest "${pytest_args[@]}" -n 0 \
    tests/engine/kernels/test_paths.py
if [[ -n ${TINYFORMER_DATA:-} ]]; then
    run_stage "multi30k sm_75 fp16" 120 env TINYFORMER_MAX_CAPABILITY=sm_75 "$PYTHON" -m tinyformer.cli train \
        --data multi30k --device cuda --precision fp16 --max-steps 200 --eval-every 100 --no-test --no-progress \
        --save-dir "$scratch/multi30k-sm75"
fi

# Earlier checks' stages, while budget is left.
run_stage "tensor-core tests" 90 "$PYTHON" -m pytest "${pytest_args[@]}" -n 4 tests/engine/kernels/test_mma.py \
    -k "$tensor_cores"
run_stage "gpu tests" 180 "$PYTHON" -m pytest "${pytest_args[@]}" -n 8 -k "not ($tensor_cores)" "${gpu_test_files[@]}"
run_stage "bench_attention" 60 "$PYTHON" benchmarks/bench_attention.py --skip-rows --markdown --dtypes fp16,bf16 \
    --seq-lens 128,1024 --head-dims 64 --causal no --warmup 2 --repeats 10
run_stage "bench_rows" 30 "$PYTHON" benchmarks/bench_attention.py --skip-attention --quick
run_stage "bench_attention all" 150 "$PYTHON" benchmarks/bench_attention.py --skip-rows --markdown --warmup 1 \
    --repeats 5 --cell-seconds 0.15
run_stage "bench_step" 100 "$PYTHON" benchmarks/bench_step.py "${step_args[@]}"
run_stage "bench_step bf16" 75 "$PYTHON" benchmarks/bench_step.py "${step_args[@]}" --precision bf16 --tokens 16384 \
    --repeats 3
run_stage "train cuda" 90 "$PYTHON" -m tinyformer.cli train --device cuda --max-steps 300 --no-progress \
    --save-dir "$scratch/synthetic"
if [[ -n ${TINYFORMER_DATA:-} ]]; then
    run_stage "multi30k cuda" 90 "$PYTHON" -m tinyformer.cli train --data multi30k --device cuda --max-steps 200 \
        --eval-every 100 --no-test --no-progress --save-dir "$scratch/multi30k"
    run_stage "multi30k bf16" 75 "$PYTHON" -m tinyformer.cli train --data multi30k --device cuda --max-steps 200 \
        --eval-every 100 --no-test --no-progress --precision bf16 --save-dir "$scratch/multi30k-bf16"
fi

log ""
log "== summary (${SECONDS}s in all)"
failed=0 skipped=0
for i in "${!names[@]}"; do
    log "$(printf '%-22s %-4s %5ss  %s' "${names[$i]}" "${statuses[$i]}" "${times[$i]}" "${notes[$i]}")"
    case ${statuses[$i]} in
        FAIL) failed=$((failed + 1)) ;;
        SKIP) skipped=$((skipped + 1)) ;;
    esac
done
ran=$((${#names[@]} - skipped))
if ((ran == 0)); then
    log "gpu_check: FAIL (no stage ran: the ${BUDGET}s budget was spent before the first); report: $report"
    exit 1
fi
if ((failed)); then
    log "gpu_check: FAIL ($failed of $ran stages run; $skipped not run); report: $report"
    exit 1
fi
log "gpu_check: PASS ($ran stages; $skipped not run); report: $report"
