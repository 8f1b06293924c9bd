"""The CPU benchmarks' arithmetic: model FLOPs and the MFU column of bench_step.py; its --cuda-graphs
argument handling and report, checked on the CPU."""

import os
import sys

import numpy as np
import pytest

import children
import mpi_helpers
import step_benchmark
from scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name):
    return load_script(f"benchmarks/{name}.py")


def test_model_flops_is_six_n_t_plus_attention():
    bench = load("bench_step")
    batch = {"src": np.zeros((3, 5)), "tgt_in": np.zeros((3, 4)), "tgt_tokens": 10}
    config = {"d_model": 8, "num_layers": 2}
    attention = 3 * 4 * 3 * 2 * (5 * 5 + 4 * 4 + 4 * 5) * 8
    assert bench.model_flops(config, 1000, batch) == 6 * 1000 * 10 + attention == 60000 + 35136


def test_step_benchmark_reports_model_flop_utilisation(tmp_path_factory):
    report = step_benchmark.tiny_step_report(tmp_path_factory)  # one run shared with cli/test_commands.py
    assert "sgemm peak" in report and "GFLOP/s" in report
    mfu = dict(zip(*step_benchmark.markdown_table(report)))["MFU"]
    assert mfu.endswith("%") and 0 <= float(mfu[:-1]) <= 100


# ---------------------------------------------------------------- bench_step --cuda-graphs (issue 17)
BENCH_STEP = os.path.join(ROOT, "benchmarks", "bench_step.py")


def run_main(argv, monkeypatch, capsys):
    """(exit status, stdout, stderr) of bench_step.py's main(argv) in this process: argument errors
    and --help end before any measurement (the GPU check below needs a child, to hide the GPU)."""
    monkeypatch.setattr(sys, "argv", ["bench_step.py", *argv])  # argparse names the program after argv[0]
    with pytest.raises(SystemExit) as exit_:
        load("bench_step").main(argv)
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_step_benchmark_help_names_cuda_graphs(monkeypatch, capsys):
    code, out, _ = run_main(["--help"], monkeypatch, capsys)
    assert code == 0
    assert "--cuda-graphs" in out


def test_step_benchmark_cuda_graphs_on_the_cpu_is_one_line_usage_error(monkeypatch, capsys):
    code, out, err = run_main(["--cuda-graphs", "--preset", "tiny"], monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err.splitlines() == ["bench_step.py: error: --cuda-graphs needs --device cuda (CUDA graphs "
                                "capture GPU work)"]


def test_step_benchmark_cuda_graphs_without_a_usable_gpu_is_one_line_usage_error():
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this takes the no-GPU path on every machine.
    result = children.run([children.PYTHON, BENCH_STEP, "--cuda-graphs", "--device", "cuda"],
                          env={"CUDA_VISIBLE_DEVICES": ""}, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "--cuda-graphs needs CuPy with a usable GPU" in lines[0], result.stderr


def graph_result(preset, missing=(), **medians):
    result = {"preset": preset, "params": 1_234_567, "missing": {name: "it broke" for name in missing},
              "tf_graphs_launches": 410, "torch_launches": 1203, "tf_graphs_pool": 3 * 2 ** 20}
    for name, seconds in medians.items():
        result[f"{name}_median"] = result[f"{name}_min"] = seconds
        result[f"{name}_loss"] = 9.0
    return result


def test_graphs_table_has_the_four_step_times_ratios_and_launches():
    bench = load("bench_step")
    r = graph_result("small", tf_graphs=0.010, tf=0.050, torch=0.025, torch_graphs=0.008)
    header, rows = bench.graphs_table([r], 146, 32, 4096, vs_torch=True)
    values = dict(zip(header, rows[0]))
    assert values["graphs ms"] == "10.0" and values["eager ms"] == "50.0"
    assert values["torch eager ms"] == "25.0" and values["torch graphs ms"] == "8.0"
    assert values["graphs / torch eager"] == "0.40x" and values["graphs / torch graphs"] == "1.25x"
    assert values["launches/step"] == "410" and values["torch eager launches/step"] == "1,203"
    assert values["graph pool MB"] == "3" and values["batch"] == "146x32" and values["tgt tokens"] == "4,096"
    header, rows = bench.graphs_table([r], 146, 32, 4096, vs_torch=False)
    assert "torch eager ms" not in header and len(header) == len(rows[0])
    assert dict(zip(header, rows[0]))["launches/step"] == "410"


def test_graphs_table_and_notes_show_a_missing_figure_as_not_measured():
    bench = load("bench_step")
    r = graph_result("base", missing=["tf_graphs"], tf_graphs=0.001, tf=0.05, torch=0.04, torch_graphs=0.03)
    header, rows = bench.graphs_table([r], 146, 32, 4096, vs_torch=True)
    values = dict(zip(header, rows[0]))
    for field in ("graphs ms", "graphs / torch eager", "graphs / torch graphs", "launches/step", "graph pool MB"):
        assert values[field] == "n/a", field
    assert values["eager ms"] == "50.0" and values["torch eager ms"] == "40.0"
    notes = bench.graphs_notes([r], True, "bf16")
    assert "base: tinyformer graphs / PyTorch eager n/a in bf16; issue 17's target at most 0.8x: not measured" in notes
    assert "base: tinyformer graphs: not measured: it broke" in notes
    losses = next(line for line in notes if "loss at the last timed step" in line)
    assert "tinyformer graphs" not in losses and "PyTorch graphs 9.0000" in losses


def test_graphs_notes_judge_the_issue_targets():
    bench = load("bench_step")
    met = graph_result("small", tf_graphs=0.010, tf=0.05, torch=0.020, torch_graphs=0.008)  # 0.50x: at most 0.5
    missed = graph_result("base", tf_graphs=0.041, tf=0.09, torch=0.050, torch_graphs=0.03)  # 0.82x > 0.8
    notes = bench.graphs_notes([met, missed], True, "fp32")
    assert "small: tinyformer graphs / PyTorch eager 0.50x in fp32; issue 17's target at most 0.5x: met" in notes
    assert "base: tinyformer graphs / PyTorch eager 0.82x in fp32; issue 17's target at most 0.8x: not met" in notes
    assert not any("target" in line for line in bench.graphs_notes([met], False, "fp32"))


def test_count_kernels_leaves_out_host_events_and_memory_copies():
    from types import SimpleNamespace

    bench = load("bench_step")
    cpu, cuda = "CPU", "CUDA"
    events = [SimpleNamespace(device_type=cuda, name=n) for n in
              ("void gemm_kernel", "Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "elementwise_kernel")]
    events.append(SimpleNamespace(device_type=cpu, name="aten::mm"))
    assert bench.count_kernels(events, cuda) == 2


def test_graphed_runner_times_replayed_steps_with_the_emulated_capture():
    """Every timed step of the graphed runner is a replay of its one captured graph (a renamed
    method of Adam's device step or of GraphedStep fails here: no skip)."""
    from types import SimpleNamespace

    from emulated_capture import EmulatedCapture

    class CountingCapture(EmulatedCapture):
        replays = 0

        def replay(self, graph):
            self.replays += 1
            super().replay(graph)

    capture = CountingCapture()
    bench = load("bench_step")
    args = SimpleNamespace(vocab=200, device="cpu", seed=0, precision="fp32", vs_torch=False, order="interleaved",
                           warmup=1, repeats=2)
    batch = bench.make_batch(96, 16, 200, seed=0)
    result = bench.measure_graphs("tiny", args, batch, [], make_capture=lambda: capture)
    assert result["missing"] == {} and result["tf_graphs_shapes"] == 1
    # the priming steps: one eager, one captured and replayed; then the warm-up and timed steps replay
    assert capture.replays == bench.PRIMING_STEPS - 1 + args.warmup + args.repeats
    assert result["tf_graphs_median"] > 0 and result["tf_median"] > 0
    assert np.isfinite(result["tf_graphs_loss"]) and np.isfinite(result["tf_loss"])


def test_launch_count_reports_each_family_once_and_the_total():
    """launch_count.py on the CPU (tiny, fp32, one row): its groups share out every counted family."""
    result = children.run([children.PYTHON, os.path.join(ROOT, "benchmarks", "launch_count.py"), "--preset", "tiny",
                           "--precision", "fp32", "--tokens", "16", "--families"], timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (row,) = [line for line in lines if line.startswith("| tiny | fp32 |")]
    cells = [int(c.replace(",", "")) for c in row.strip("|").split("|")[2:]]
    families = [line for line in lines if line.startswith("| ") and not line.startswith(("| tiny", "| preset",
                                                                                          "| family"))]
    counts = {line.split("|")[1].strip(): int(line.split("|")[2]) for line in families}
    assert sum(cells[:-1]) == cells[-1] == sum(counts.values()) > 0
    assert counts["adam_update"] == 1 and counts["cublas_gemm"] > 0


# ---------------------------------------------------------------- bench_ddp (issue 49: two ranks against two threads)
def test_ddp_benchmark_ranks_share_out_the_rows_of_the_one_process_batch():
    """Each rank takes a consecutive part of bench_step's batch: together exactly its rows and its
    target tokens, so the two runs compute the same step (the MFU of both counts the whole batch)."""
    from types import SimpleNamespace

    bench = load("bench_ddp")
    args = SimpleNamespace(tokens=300, length=16, vocab=60, seed=3)
    whole, arrays = bench.the_batch(args)
    halves = [bench.the_batch(args, rank, 2)[0] for rank in (0, 1)]
    assert whole.num_tokens == arrays["tgt_tokens"] == sum(h.num_tokens for h in halves) >= 300
    assert np.array_equal(np.concatenate([h.indices for h in halves]), np.arange(len(arrays["src"])))
    assert all(len(h) > 0 for h in halves)
    for name in ("src", "tgt_in", "tgt_out"):
        assert np.array_equal(np.concatenate([getattr(h, name) for h in halves]), arrays[name])


@mpi_helpers.requires_mpi
def test_ddp_benchmark_reports_both_runs_with_their_share_of_the_peak():
    result = mpi_helpers.run([children.PYTHON, os.path.join(ROOT, "benchmarks", "bench_ddp.py"), "--preset", "tiny",
                              "--tokens", "128", "--vocab", "60", "--length", "16", "--steps", "1", "--rounds", "1",
                              "--repeats", "1"], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| 1 process")
            or line.startswith("| 2 ranks")]
    assert [r[0] for r in rows] == ["| 1 process × 2 threads", "| 2 ranks × 1 thread (--nproc 2)"]
    for row in rows:
        assert row[3].endswith("%") and 0 < float(row[3][:-1]) <= 100  # MFU
    assert "sgemm peak" in result.stdout and "speed-up of two ranks" in result.stdout
    assert sum(line.startswith("| ") and " MiB |" in line for line in result.stdout.splitlines()) == 7
