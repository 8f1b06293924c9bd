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
    assert "tinyformer" in out and "GPU available" in out and "CUDA kernels: on" in out


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


# ---------------------------------------------------------------- train / translate / eval / average
@pytest.mark.parametrize("command", ["info", "train", "translate", "eval", "average"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert f"usage: tinyformer {command}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["train", "--max-steps", "many"], "invalid int value"),
    (["train", "--preset", "huge", "--save-dir", "unused"], "unknown preset"),
    (["train", "--data", "wmt", "--save-dir", "unused"], "data must be one of"),
    (["translate"], "--checkpoint"),
    (["eval"], "--checkpoint"),
    (["average", "--output", "x.npz"], "give checkpoint files or --dir"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_runtime_errors_exit_1_with_one_line(tmp_path, capsys):
    code = cli.main(["translate", "--checkpoint", str(tmp_path / "missing.npz")])
    err = capsys.readouterr().err
    assert code == 1 and "missing.npz" in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A short synthetic run through the CLI (a few steps: the plumbing, not the quality)."""
    run = tmp_path_factory.mktemp("run")
    code = cli.main(["train", "--save-dir", str(run), "--max-steps", "4", "--max-tokens", "256",
                     "--vocab-size", "120", "--save-every", "2", "--eval-every", "4",
                     "--bleu-samples", "4", "--no-progress", "--no-test"])
    assert code == 0
    return run


def test_train_writes_checkpoints_tokenizer_and_log(trained_run):
    names = sorted(p.name for p in trained_run.iterdir())
    assert names == ["checkpoint_0000002.npz", "checkpoint_0000004.npz", "metrics.jsonl", "spm.model", "spm.vocab"]


def test_translate_keeps_one_line_per_input_line(trained_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("I see 3 red cats\n\nToday we buy 1 old car\n   \n", encoding="utf-8")
    out = tmp_path / "out.txt"
    code = cli.main(["translate", "--checkpoint", str(trained_run / "checkpoint_0000004.npz"),
                     "--input", str(source), "--output", str(out), "--beam", "2"])
    assert code == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[3] == "" and lines[4] == ""


def test_average_and_eval_through_the_cli(trained_run, tmp_path, capsys):
    averaged = tmp_path / "avg.npz"
    assert cli.main(["average", "--dir", str(trained_run), "--last", "2", "--output", str(averaged)]) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    (trained_run / "avg_copy.npz").write_bytes(averaged.read_bytes())
    code = cli.main(["eval", "--checkpoint", str(trained_run / "avg_copy.npz"), "--split", "val",
                     "--limit", "5", "--beam", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "BLEU" in out and "tok:13a" in out and "exact match" in out
    refs, hyps = tmp_path / "refs.txt", tmp_path / "hyps.txt"
    refs.write_text("Ich sehe drei rote Katzen\n", encoding="utf-8")
    hyps.write_text("Ich sehe drei rote Katzen\n", encoding="utf-8")
    assert cli.main(["eval", "--hypotheses", str(hyps), "--references", str(refs)]) == 0
    assert "BLEU 100.00" in capsys.readouterr().out


def test_resume_cannot_change_the_recipe(trained_run, capsys):
    code = cli.main(["train", "--save-dir", str(trained_run), "--resume", "--preset", "small"])
    assert code == 2 and "cannot change" in capsys.readouterr().err
