"""The GPU benchmark scripts, checked on the CPU: they skip cleanly, parse, and count right."""

import shutil
from pathlib import Path

import numpy
import pytest

import children
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
BENCH_ATTENTION = ROOT / "benchmarks" / "bench_attention.py"
GPU_CHECK = ROOT / "benchmarks" / "gpu_check.sh"
MULTI30K_GPU = ROOT / "benchmarks" / "multi30k_gpu.sh"


bench = load_script("benchmarks/bench_attention.py")


def test_bench_attention_without_gpu_prints_one_skip_line_and_exits_0():
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this takes the no-GPU path on every machine.
    result = children.run([children.PYTHON, str(BENCH_ATTENTION), "--quick"], env={"CUDA_VISIBLE_DEVICES": ""},
                          timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and "status: skipped" in lines[0], result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", [GPU_CHECK, MULTI30K_GPU], ids=lambda path: path.name)
def test_gpu_scripts_parse(script):
    result = children.run(["bash", "-n", str(script)], timeout=30)
    assert result.returncode == 0, result.stderr


# Issue 63's order: the kernels loaded (or compiled once), then the open questions: the graph tests, gradcheck
# on CUDA and the manual's GPU blocks (side by side), Multi30k with graphs, the step benchmark, the launches.
FIRST_STAGES = ["nvidia-smi", "python env", "kernels", "graph tests", "gradcheck cuda", "docs gpu", "multi30k graphs",
                "bench_step graphs fp32", "bench_step graphs bf16", "launch count"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_runs_the_open_questions_first_and_skips_what_the_budget_leaves_out(tmp_path):
    report = tmp_path / "report.txt"
    result = children.run(["bash", str(GPU_CHECK), str(report)], timeout=120,
                          env={"GPU_CHECK_BUDGET": "0", "PYTHON": children.PYTHON, "TINYFORMER_DATA": str(tmp_path)})
    assert result.returncode == 1, result.stdout + result.stderr
    text = report.read_text(encoding="utf-8")
    summary = [line for line in text.split("== summary", 1)[1].splitlines()[1:]
               if line and not line.startswith("gpu_check:")]
    stages = [line[:22].strip() for line in summary]  # name column, then status, time, note
    assert stages[:10] == FIRST_STAGES, stages
    assert stages[10:12] == ["sm_75 capped tests", "multi30k sm_75 fp16"]  # issue 66's T4 path, then the rest
    assert {"tensor-core tests", "gpu tests", "bench_step", "train cuda"} <= set(stages[12:])
    assert "compile_check" not in stages  # a CPU job: CI runs it, the device does not
    assert all(line[22:].split()[0] == "SKIP" for line in summary), summary
    assert "gpu_check: FAIL (no stage ran" in text and not list(tmp_path.glob("*_multi30k"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("args, message", [([], "usage: benchmarks/multi30k_gpu.sh LOG_DIR"),
                                           (["LOG", "RUN", "0"], "MINUTES must be a positive number, got '0'"),
                                           (["LOG", "RUN", "five"], "MINUTES must be a positive number")])
def test_multi30k_gpu_refuses_bad_arguments_before_training(tmp_path, args, message):
    args = [str(tmp_path / a) if a in ("LOG", "RUN") else a for a in args]
    result = children.run(["bash", str(MULTI30K_GPU), *args], timeout=30)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "LOG").exists()


def test_attention_flops_forward_is_four_b_s2_h_d():
    assert bench.attention_flops(batch=2, seq_len=128, heads=8, head_dim=64) == 4 * 2 * 128 * 128 * 8 * 64
    assert bench.attention_flops(batch=2, seq_len=128, heads=8, head_dim=64) == 67_108_864
    assert bench.attention_flops(batch=1, seq_len=3, heads=1, head_dim=1) == 36


def test_attention_flops_forward_backward_is_three_and_a_half_forwards():
    assert bench.attention_flops(2, 128, 8, 64, backward=True) == 234_881_024  # 3.5 x 67,108,864
    assert bench.attention_flops(1, 3, 1, 1, backward=True) == 126


def test_attention_flops_halved_when_causal():
    assert bench.attention_flops(2, 128, 8, 64, causal=True) == 33_554_432
    assert bench.attention_flops(2, 128, 8, 64, causal=True, backward=True) == 117_440_512
    assert bench.attention_flops(1, 3, 1, 1, causal=True, backward=True) == 63


def test_attention_flops_at_the_benchmark_sizes_are_exact_integers():
    # 16,384 tokens x 2,048 channels, as the benchmark's defaults give at S = 4096, D = 128.
    flops = bench.attention_flops(batch=4, seq_len=4096, heads=16, head_dim=128, backward=True)
    assert flops == 1_924_145_348_608 and isinstance(flops, int)


def test_bfloat16_bits_round_to_nearest_even():
    x = numpy.array([1.0, -2.0, 0.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-7 + 2.0**-9],
                    dtype=numpy.float32)
    bits = bench.bfloat16_bits(x)
    assert bits.dtype.name == "bfloat16"  # ml_dtypes' dtype, as the kernels take it
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1.0); 1 + 3·2^-8 ties up to 1 + 2^-6.
    assert bits.view(numpy.uint16).tolist() == [0x3F80, 0xC000, 0x0000, 0x3F80, 0x3F82, 0x3F81]
    assert bench.bfloat16_to_float32(bits).tolist() == [1.0, -2.0, 0.0, 1.0, 1.0 + 2.0**-6, 1.0 + 2.0**-7]


def test_row_op_bytes_count_each_input_and_output_once():
    assert bench.row_op_bytes("softmax", "forward", 8192, 1024, "float32") == 2 * 8192 * 1024 * 4
    assert bench.row_op_bytes("softmax", "backward", 8192, 1024, "bfloat16") == 3 * 8192 * 1024 * 2
    assert bench.row_op_bytes("layer_norm", "forward", 4, 8, "float32") == (2 * 32 + 2 * 8) * 4 + 2 * 4 * 4
    assert bench.row_op_bytes("cross_entropy", "forward", 8192, 8000, "bfloat16") == (
        8192 * 8000 * 2 + 8192 * 8 + 3 * 8192 * 4)
    assert bench.row_op_bytes("dropout", "forward", 8192, 1024, "bfloat16") == 8192 * 1024 * (2 + 2 + 1)
    assert bench.adam_bytes(10) == 8 * 10 * 4  # the update (4 reads, 3 writes) and the norm pass (1 read)


def test_quick_and_full_attention_cases():
    full = bench.attention_cases(bench.parse_args([]))
    assert {(c.seq_len, c.head_dim) for c in full} == {(s, d) for s in (128, 512, 1024, 4096) for d in (64, 128)}
    assert {c.dtype for c in full} == {"bfloat16", "float16", "float32"} and {c.causal for c in full} == {False, True}
    assert all(c.batch * c.seq_len == 16384 and c.heads * c.head_dim == 2048 for c in full)
    quick = bench.attention_cases(bench.parse_args(["--quick"]))
    assert 0 < len(quick) < len(full) and not any(c.causal for c in quick)


def test_the_table_names_each_sdpa_backend_and_the_kernels_share_of_the_best():
    args = bench.parse_args([])
    assert bench.timed_columns(args) == ["kernel", "flash", "cudnn", "efficient"]
    assert bench.timed_columns(bench.parse_args(["--cuda-core", "--unfused"]))[:3] == ["kernel", "cuda-core", "unfused"]
    cells = {"kernel": "150", "flash": "300", "cudnn": "n/a", "efficient": "120"}
    assert bench.best_torch(cells) == ("flash", 300.0)
    assert bench.share_of_best(cells["kernel"], bench.best_torch(cells)) == "50% flash"
    assert bench.share_of_best("OOM", ("flash", 300.0)) == "n/a" and bench.share_of_best("1.0", None) == "n/a"


def test_the_kernel_column_is_the_tensor_core_path_for_16_bit_and_cuda_cores_for_fp32():
    args = bench.parse_args(["--cuda-core"])
    by_dtype = {c.dtype: bench.attention_impls(c, args, torch_ok=False) for c in bench.attention_cases(args)}
    assert by_dtype["bfloat16"]["kernel"][0] is bench.TensorCoreAttention
    assert by_dtype["float16"]["cuda-core"][0] is bench.CudaCoreAttention
    assert by_dtype["float32"]["kernel"][0] is bench.CudaCoreAttention and by_dtype["float32"]["cuda-core"] is None
    assert by_dtype["float32"]["flash"] is None  # no PyTorch: those columns are n/a
