"""Training on two MPI ranks (CPU): the same run as one process with twice the accumulation,
resume, a killed rank, ranks started differently. Each test is one mpiexec launch of the
`tinyformer` command (a few seconds each on two cores)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import children
import mpi_helpers
import numpy as np
import pytest

from tinyformer.translation import checkpoint
from tinyformer.translation.train import TrainConfig, Trainer

pytestmark = mpi_helpers.requires_mpi

# The runs compared: checkpoints halfway and at the end (an equality of two runs holds at 8 steps as at 20).
STEPS = 8
COMMON = ["--max-tokens", "256", "--vocab-size", "120", "--warmup-steps", "4", "--eval-every", "100",
          "--log-every", "1", "--bleu-samples", "8", "--keep-last", "5", "--no-progress", "--no-test"]


def train(*args, nproc=None, save_dir):
    command = children.tinyformer("train", *COMMON, "--save-dir", save_dir, *args)
    result = mpi_helpers.run(command if nproc is None else mpi_helpers.mpiexec(nproc, command))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def training_records(save_dir):
    with open(Path(save_dir) / "metrics.jsonl", encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if "split" not in r]


def parameters(save_dir, step):
    state, meta, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(save_dir, step))
    return state, meta


def assert_close(a, b, rtol=1e-6):
    """Every array of ``a`` within ``rtol`` of ``b``'s, relative to ``b``'s largest magnitude."""
    assert a.keys() == b.keys()
    for name in a:
        scale = max(float(np.abs(b[name]).max()), 1e-30)
        assert float(np.abs(a[name] - b[name]).max()) <= rtol * scale, name


def test_two_ranks_train_as_one_process_with_twice_the_accumulation(tmp_path):
    """`tinyformer train --nproc 2` (mpiexec started by the command) against one process with
    --accum 2, dropout off: the same losses and parameters, and only rank 0 wrote."""
    two, one = tmp_path / "two", tmp_path / "one"
    result = train("--nproc", "2", "--max-steps", str(STEPS), "--save-every", str(STEPS // 2), "--dropout", "0",
                   save_dir=two)
    Trainer(TrainConfig(max_tokens=256, vocab_size=120, warmup_steps=4, eval_every=100, log_every=1, bleu_samples=8,
                        max_steps=STEPS, save_every=STEPS // 2, dropout=0.0, accum=2, save_dir=str(one)),
            echo=lambda *a: None, progress=False).run()
    records, reference = training_records(two), training_records(one)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # one writer: each step once
    np.testing.assert_allclose([r["loss"] for r in records], [r["loss"] for r in reference], rtol=1e-6)
    np.testing.assert_allclose([r["grad_norm"] for r in records], [r["grad_norm"] for r in reference], rtol=1e-6)
    assert all(0.0 <= r["allreduce_hidden"] <= 1.0 and r["allreduce_ms"] > 0 for r in records)
    for step in (STEPS // 2, STEPS):
        (state, meta), (expected, _) = parameters(two, step), parameters(one, step)
        assert_close(state, expected)
        assert meta["config"]["nproc"] == 2 and meta["config"]["accum"] == 1 and len(meta["rng_states"]) == 2
    assert result.stdout.count("checkpoints, tokenizer and metrics.jsonl are in") == 1
    assert "2 ranks over mpi" in result.stdout and result.stderr == ""


def test_resume_under_two_ranks_repeats_the_uninterrupted_run(tmp_path):
    """With dropout, each rank its own mask stream: the run stopped after step STEPS // 2 and resumed by
    `mpiexec -n 2 tinyformer train --resume` ends as the run that went straight on."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train("--max-steps", str(STEPS), "--save-every", str(STEPS // 2), "--dropout", "0.1", nproc=2, save_dir=straight)
    shutil.copytree(straight, resumed)
    checkpoint.checkpoint_path(resumed, STEPS).unlink()  # as if killed after the step before: its log lines stay
    result = train("--resume", nproc=2, save_dir=resumed)
    assert f"resumed from checkpoint_{STEPS // 2:07d}.npz at step {STEPS // 2}" in result.stdout
    assert [r["loss"] for r in training_records(resumed)] == [r["loss"] for r in training_records(straight)]
    (state, meta), (expected, expected_meta) = parameters(resumed, STEPS), parameters(straight, STEPS)
    for name in expected:
        np.testing.assert_array_equal(state[name], expected[name])
    assert meta["rng_states"] == expected_meta["rng_states"]
    assert meta["rng_states"][0] != meta["rng_states"][1]  # the ranks draw different masks
    assert meta["rng_states"][0] == meta["rng_state"]


def _rank_pid(launcher, rank, timeout=60):
    """The pid of MPI rank ``rank`` among the descendants of process ``launcher`` (from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        parents = {}
        for entry in Path("/proc").iterdir():
            try:
                status = (entry / "status").read_text()
            except (OSError, ValueError):
                continue
            ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), None)
            parents.setdefault(int(ppid or 0), []).append(int(entry.name)) if entry.name.isdigit() else None
        family, todo = [], [launcher]
        while todo:
            kids = parents.get(todo.pop(), [])
            family += kids
            todo += kids
        for pid in family:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ or f"PMIX_RANK={rank}".encode() in environ:
                if b"tinyformer.cli" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} below process {launcher}")


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank's process through /proc")
def test_a_killed_rank_stops_the_others_with_one_line_and_the_checkpoints_intact(tmp_path):
    command = children.tinyformer("train", "--nproc", "2", *COMMON, "--save-dir", tmp_path, "--max-steps", "100000",
                                  "--save-every", "5")
    child = children.start(command, env=mpi_helpers.MPI_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.checkpoint_path(tmp_path, 5).exists():
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.1)
        victim = _rank_pid(child.pid, 1)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        out, err = child.communicate(timeout=90)
        assert time.monotonic() - killed < 60
    finally:
        children.stop(child)
    assert child.returncode == 1, out[-2000:] + err[-2000:]
    assert err.strip().splitlines() == [
        f"tinyformer train: error: rank 1 (pid {victim} on {socket.gethostname()}) died; stopping the other ranks"]
    saved = checkpoint.list_checkpoints(tmp_path)
    assert saved and saved[0].name >= "checkpoint_0000005.npz"
    for path in saved:
        checkpoint.load_checkpoint(path)


def test_ranks_started_differently_refuse_to_start_naming_the_difference(tmp_path):
    """Rank 1 with another seed and another tinyformer (a copy with one changed file)."""
    other = tmp_path / "other"
    shutil.copytree(children.ROOT / "tinyformer", other / "tinyformer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(other / "tinyformer" / "metrics.py", "a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    run_dir = tmp_path / "run"
    rank0 = children.tinyformer("train", *COMMON, "--save-dir", run_dir)
    # -P: the copy, not the checkout that is the working directory, is the tinyformer imported
    rank1 = ["env", f"PYTHONPATH={other}", children.PYTHON, "-P", *children.tinyformer("train", *COMMON, "--save-dir",
                                                                                    run_dir, "--seed", "1")[1:]]
    result = mpi_helpers.run(mpi_helpers.mpmd(rank0, rank1))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tinyformer train: error: the ranks were not started alike: rank 1 has --seed 1 "
                               "(rank 0: 0), tinyformer code '0.1.0 (")
    assert not run_dir.exists()  # refused before anything was written


def test_two_ranks_agree_on_the_clock_of_a_time_schedule(tmp_path):
    """--schedule time on two ranks: rank 0's clock sets every rank's learning rate and minute-based
    checkpoints (a parameter check every step would stop a run whose ranks disagreed), and --average-last
    averages on rank 0 while the other waits."""
    result = train("--nproc", "2", "--max-steps", "6", "--schedule", "time", "--time-limit", "30", "--check-every",
                   "1", "--save-every", "100", "--save-every-minutes", "0.0001", "--average-last", "2",
                   save_dir=tmp_path)
    records = training_records(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 7)) and all(0 < r["minutes_left"] <= 30 for r in records)
    assert [checkpoint.step_of(p) for p in checkpoint.list_checkpoints(tmp_path)][-2:] == [5, 6]
    assert result.stdout.count("averaged the last 2 checkpoints (steps 5..6)") == 1
    _, meta = parameters(tmp_path, 6)
    assert meta["train_seconds"] > 0
