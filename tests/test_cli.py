"""The command line and the runnable scripts: they must keep working, not just import."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinyformer import cli

ROOT = Path(__file__).resolve().parent.parent


def test_info_prints_versions_and_gpu_availability(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "tinyformer" in out and "GPU available" in out


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        cli.main(["fly"])
    assert info.value.code == 2


def run_script(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_attention_example_gradchecks_and_learns():
    out = run_script("examples/attention_from_scratch.py", "--steps", "200")
    assert "gradcheck passed" in out
    final = [line for line in out.splitlines() if "step  200" in line][0]
    accuracy = int(final.rsplit(" ", 1)[1].rstrip("%"))
    assert accuracy >= 90, final


def test_engine_benchmark_runs():
    out = run_script("benchmarks/bench_engine.py", "--ops", "200", "--repeats", "1")
    assert "tinyformer: forward" in out and "us/op" in out


def test_step_benchmark_runs():
    out = run_script("benchmarks/bench_step.py", "--preset", "tiny", "--tokens", "256", "--repeats", "2",
                     "--warmup", "1")
    assert "256 target tokens" in out and "command:" in out and "versions:" in out
    header = next(line for line in out.splitlines() if line.startswith("preset"))
    for field in ("params", "batch", "tgt tokens", "median ms", "min ms", "tokens/s", "traced MB"):
        assert field in header, header
    assert "torch" not in header
    assert any(line.startswith("tiny ") for line in out.splitlines())


def test_step_benchmark_markdown_table_holds_positive_figures():
    out = run_script("benchmarks/bench_step.py", "--preset", "tiny", "--tokens", "64", "--repeats", "1",
                     "--warmup", "0", "--markdown")
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    header, row = ([c.strip() for c in line.strip("|").split("|")] for line in lines[:2])
    values = dict(zip(header, row))
    assert values["preset"] == "tiny" and values["tgt tokens"] == "64"
    for field in ("median ms", "tokens/s", "traced MB"):
        assert float(values[field].replace(",", "")) > 0, values


def test_reverse_task_example_trains_and_decodes():
    out = run_script("examples/transformer_reverse_task.py", "--steps", "250")
    accuracy = float(out.rsplit("cached decoding):", 1)[1].strip().rstrip("%"))
    assert accuracy >= 30.0, out
