"""Crash safety: a training process killed (SIGKILL) at any point of a checkpoint save, a pruning,
a log append or a step leaves checkpoints that load, and ``--resume`` then finishes the run with
the losses and parameters of an uninterrupted one; Ctrl-C saves the last completed step and exits 130.

Each kill happens in a child Python process that runs the trainer with one function wrapped to
``os.kill(os.getpid(), SIGKILL)`` at the chosen point. The runs are tiny (6 steps of `tiny` on
600 synthetic pairs, one BLAS thread), so the whole file takes well under a minute.
"""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import children
import numpy as np
import pytest
from tests.translation.train.test_trainer import cached_load_corpus

from tinyformer.translation import checkpoint, train
from tinyformer import cli
from tinyformer.engine import functional as F
from tinyformer.model.optim import Adam
from tinyformer.translation.train import TrainConfig, Trainer, TrainingInterrupted

CONFIG = dict(data="synthetic", preset="tiny", vocab_size=120, max_tokens=256, max_steps=6, warmup_steps=4,
              save_every=2, keep_last=1, eval_every=100, log_every=1, bleu_samples=4, dropout=0.1, threads=1)
QUIET = dict(echo=lambda *a: None, progress=False)
pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL and SIGINT to a process are POSIX")

# The child: the trainer with one function wrapped to die at a chosen point. argv: point, step,
# config (JSON), corpus (a JSON file), resume (0/1).
CHILD = r'''
import io, json, os, signal, sys
from pathlib import Path
import numpy as np
from tinyformer.translation import checkpoint, train
from tinyformer.model.optim import Adam

point, kill_step, config, corpus, resume = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), *sys.argv[4:6]
texts = json.loads(Path(corpus).read_text(encoding="utf-8"))
train.builders.load_corpus = lambda config, split: tuple(texts[split])
trainer = train.Trainer(train.TrainConfig(**config), resume=resume == "1", echo=lambda *a: None, progress=False)
target = checkpoint.checkpoint_path(trainer.save_dir, kill_step).name


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def saving():
    return trainer.step == kill_step


real_savez, real_replace, real_unlink = np.savez, os.replace, Path.unlink
if point == "mid-write":            # half the temporary file is on disk
    def savez(f, **arrays):
        if saving():
            whole = io.BytesIO()
            real_savez(whole, **arrays)
            f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
            f.flush()
            die()
        real_savez(f, **arrays)
    np.savez = savez
elif point == "written":            # the whole temporary file, not yet fsync'ed nor renamed
    def savez(f, **arrays):
        real_savez(f, **arrays)
        if saving():
            f.flush()
            die()
    np.savez = savez
elif point == "before rename":      # fsync'ed, about to be renamed into place
    def replace(src, dst):
        if Path(dst).name == target:
            die()
        real_replace(src, dst)
    os.replace = replace
elif point == "after rename":       # in place, the older checkpoints not yet pruned
    real_prune = checkpoint.prune_checkpoints
    checkpoint.prune_checkpoints = lambda d, k: die() if saving() else real_prune(d, k)
elif point == "during pruning":     # the oldest checkpoint deleted, pruning not finished
    def unlink(self, *args, **kwargs):
        real_unlink(self, *args, **kwargs)
        if saving() and self.name.startswith("checkpoint_"):
            die()
    Path.unlink = unlink
elif point == "metrics append":     # half a line of the first record after the checkpoint
    from tinyformer.translation.train.metrics_log import MetricsLog
    real_append = MetricsLog.append
    def append(self, record):
        if record.get("step") == kill_step + 1:
            line = json.dumps(record) + "\n"
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line[: len(line) // 2])
            die()
        real_append(self, record)
    MetricsLog.append = append
elif point == "adam":               # parameters updated in memory, the step not yet counted
    real_step = Adam.step
    def step(self, *args, **kwargs):
        norm = real_step(self, *args, **kwargs)
        if saving():
            die()
        return norm
    Adam.step = step
elif point == "validation":         # the final validation, before the last save
    train.Trainer.validate = lambda self: die()
elif point == "log repair":         # a resume rewriting metrics.jsonl, before its rename
    def replace(src, dst):
        if Path(dst).name == train.LOG_FILE:
            die()
        real_replace(src, dst)
    os.replace = replace
else:
    raise SystemExit(f"unknown point {point}")
trainer.run()
print("finished without being killed")
'''

# scenario: ([(point, step, resume)], the step of the newest checkpoint after the kills)
SCENARIOS = {
    "mid-write of the temporary file": ([("mid-write", 4, 0)], 2),
    "temporary file written, not synced": ([("written", 4, 0)], 2),
    "synced, before the rename": ([("before rename", 4, 0)], 2),
    "renamed, before pruning": ([("after rename", 4, 0)], 4),
    "during pruning": ([("during pruning", 4, 0)], 4),
    "during a metrics append": ([("metrics append", 4, 0)], 4),
    "in Adam's update between checkpoints": ([("adam", 4, 0)], 4),
    "during the last validation": ([("validation", 6, 0)], 4),
    "the last save, mid-write": ([("mid-write", 6, 0)], 4),
    "a metrics append, then the resume's log repair": ([("metrics append", 4, 0), ("log repair", 4, 1)], 4),
}
# 10 scenarios, 11 kills at 9 distinct points.
LEAVE_A_TEMPORARY = {"mid-write", "written", "before rename", "log repair"}  # removed or replaced by the resume


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """600 training and 20 validation pairs of the synthetic task, as a JSON file for the children."""
    config = TrainConfig(**CONFIG)
    texts = {split: [side[:n] for side in cached_load_corpus(config, split)]
             for split, n in (("train", 600), ("val", 20))}
    path = tmp_path_factory.mktemp("corpus") / "corpus.json"
    path.write_text(json.dumps(texts), encoding="utf-8")
    return path, texts


@pytest.fixture
def small_corpus(monkeypatch, corpus):
    texts = corpus[1]
    monkeypatch.setattr(train.builders, "load_corpus", lambda config, split: tuple(texts[split]))


def losses(save_dir):
    with open(Path(save_dir) / train.LOG_FILE, encoding="utf-8") as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r and "split" not in r]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The uninterrupted run: its losses, final parameters and tokenizer."""
    texts = corpus[1]
    save_dir = tmp_path_factory.mktemp("reference")
    real = train.builders.load_corpus
    train.builders.load_corpus = lambda config, split: tuple(texts[split])
    try:
        Trainer(TrainConfig(**CONFIG, save_dir=str(save_dir)), **QUIET).run()
    finally:
        train.builders.load_corpus = real
    state, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(save_dir, 6))
    return losses(save_dir), state, save_dir / train.TOKENIZER_FILE


def run_child(point, step, resume, save_dir, corpus_path):
    config = json.dumps(dict(CONFIG, save_dir=str(save_dir)))
    return children.run([children.PYTHON, "-c", CHILD, point, str(step), config, str(corpus_path), str(resume)])


def assert_resumes_like_the_uninterrupted_run(save_dir, reference):
    trainer = Trainer(TrainConfig(**CONFIG, save_dir=str(save_dir)), resume=True, **QUIET)
    trainer.run()
    assert trainer.step == 6
    expected_losses, expected_state, _ = reference
    assert losses(save_dir) == expected_losses
    state, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(save_dir, 6))
    for name, value in expected_state.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    assert not [p.name for p in Path(save_dir).iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_killed_at_any_point_the_run_resumes_exactly(scenario, tmp_path, corpus, reference, small_corpus):
    kills, newest = SCENARIOS[scenario]
    tmp_path.joinpath(train.TOKENIZER_FILE).write_bytes(reference[2].read_bytes())
    for point, step, resume in kills:
        result = run_child(point, step, resume, tmp_path, corpus[0])
        assert result.returncode == -signal.SIGKILL, (point, result.returncode, result.stderr[-3000:])
    temporaries = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert bool(temporaries) == (kills[-1][0] in LEAVE_A_TEMPORARY), temporaries
    paths = checkpoint.list_checkpoints(tmp_path)
    assert paths[-1] == checkpoint.checkpoint_path(tmp_path, newest)
    for path in paths:  # every checkpoint on disk loads, the newest above all
        _, meta, adam = checkpoint.load_checkpoint(path)
        assert meta["step"] == int(path.stem.split("_")[1]) and adam is not None
    assert_resumes_like_the_uninterrupted_run(tmp_path, reference)


# ------------------------------------------------------------------ Ctrl-C
def test_keyboard_interrupt_mid_step_saves_the_last_completed_step(tmp_path, reference, small_corpus,
                                                                   monkeypatch):
    """Cut short in step 4's forward pass (after its dropout draws): step 3 is saved, with the
    dropout generator as it was after step 3, so the resumed run is the uninterrupted one."""
    real, calls = F.cross_entropy, [0]

    def cross_entropy(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "cross_entropy", cross_entropy)
    lines = []
    with pytest.raises(TrainingInterrupted) as info:
        Trainer(TrainConfig(**CONFIG, save_dir=str(tmp_path)), echo=lines.append, progress=False).run()
    path = checkpoint.checkpoint_path(tmp_path, 3)
    assert info.value.checkpoint == path and isinstance(info.value, KeyboardInterrupt)
    assert lines[-1] == f"interrupted at step 3, which is saved in {path}; continue with --resume"
    assert checkpoint.list_checkpoints(tmp_path) == [path]
    monkeypatch.setattr(F, "cross_entropy", real)
    assert_resumes_like_the_uninterrupted_run(tmp_path, reference)


@pytest.mark.parametrize("where", ["adam", "save", "adam twice"])
def test_sigint_inside_an_update_or_a_save_lets_it_finish(where, tmp_path, reference, small_corpus,
                                                          monkeypatch):
    """A real SIGINT in the middle of Adam's update (step 3) or of the checkpoint write (step 2) is
    acted on once that is complete: the checkpoint holds the whole update, and is not written twice.
    A second SIGINT before then stops at once and saves nothing (the step-2 checkpoint stays)."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # conftest's known_process_state
    sent = []

    def interrupt():
        sent.append(True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside the section

    real_step, real_savez, real_save = Adam.step, np.savez, checkpoint.save_checkpoint

    def step(self, *args, **kwargs):
        if where.startswith("adam") and self.step_count == 2 and not sent:
            interrupt()
            if where == "adam twice":
                interrupt()
        return real_step(self, *args, **kwargs)

    def savez(f, **arrays):
        if where == "save" and not sent:
            interrupt()
        real_savez(f, **arrays)

    saves = []
    monkeypatch.setattr(Adam, "step", step)
    monkeypatch.setattr(np, "savez", savez)
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda path, *a: saves.append(path) or real_save(path, *a))
    with pytest.raises(TrainingInterrupted) as info:
        Trainer(TrainConfig(**CONFIG, save_dir=str(tmp_path)), **QUIET).run()
    expected = 3 if where == "adam" else 2
    assert info.value.checkpoint == checkpoint.checkpoint_path(tmp_path, expected)
    assert ("before a checkpoint could be saved" in str(info.value)) == (where == "adam twice")
    assert checkpoint.list_checkpoints(tmp_path) == [checkpoint.checkpoint_path(tmp_path, expected)]
    assert saves == [checkpoint.checkpoint_path(tmp_path, s) for s in range(2, expected + 1)]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    monkeypatch.setattr(Adam, "step", real_step)
    monkeypatch.setattr(np, "savez", real_savez)
    assert_resumes_like_the_uninterrupted_run(tmp_path, reference)


TRAIN_ARGS = ["--max-tokens", "256", "--vocab-size", "120", "--warmup-steps", "4", "--dropout", "0.1",
              "--eval-every", "100000", "--save-every", "100000", "--log-every", "1", "--bleu-samples", "4",
              "--threads", "1", "--no-progress", "--no-test"]


def log_lines(run):
    log = run / train.LOG_FILE
    return len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0


def wait_for_log_lines(child, run, count, timeout=240):
    """Wait until ``run``'s log holds ``count`` lines; fail if ``child`` ends or the time runs out."""
    deadline = time.monotonic() + timeout
    while log_lines(run) < count:
        assert child.poll() is None, f"the run ended with status {child.returncode}: {child.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"fewer than {count} log lines after {timeout} s"
        time.sleep(0.05)


def start_training(run, sigint):
    return children.start(children.tinyformer("train", "--save-dir", str(run), "--max-steps", "100000", *TRAIN_ARGS),
                          sigint=sigint, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_ctrl_c_on_the_command_saves_a_checkpoint_and_exits_130(tmp_path, monkeypatch, capsys):
    """SIGINT to a running `tinyformer train` (started with SIGINT at its default, whatever this
    test run's is): exit status 130, a checkpoint of the last completed step named on the way out,
    and `--resume` finishes with the uninterrupted run's losses."""
    run = tmp_path / "run"
    child = start_training(run, sigint="default")
    try:
        wait_for_log_lines(child, run, 2)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        children.stop(child)
    assert child.returncode == 130, err
    match = re.search(r"interrupted at step (\d+), which is saved in (\S+); continue with --resume", out + err)
    assert match, (out, err)
    step, path = int(match.group(1)), Path(match.group(2))
    assert step >= 2 and path == checkpoint.checkpoint_path(run, step)
    assert len(err.splitlines()) <= 1 and "Traceback" not in err, err
    assert checkpoint.list_checkpoints(run) == [path]
    _, meta, _ = checkpoint.load_checkpoint(path)
    assert meta["step"] == step

    monkeypatch.setattr(train.builders, "load_corpus", cached_load_corpus)
    capsys.readouterr()
    assert cli.main(["train", "--save-dir", str(run), "--resume", "--max-steps", str(step + 2),
                     "--no-progress", "--no-test"]) == 0
    straight = tmp_path / "straight"
    assert cli.main(["train", "--save-dir", str(straight), "--max-steps", str(step + 2), *TRAIN_ARGS]) == 0
    assert losses(run) == losses(straight) and len(losses(run)) == step + 2


def test_a_command_started_with_sigint_ignored_keeps_ignoring_it(tmp_path):
    """nohup semantics: `tinyformer train` started with SIGINT ignored installs no handler, so a
    SIGINT changes nothing: the run goes on logging steps, writes no "interrupted" line and no
    checkpoint, and ends only when it is terminated."""
    run = tmp_path / "run"
    child = start_training(run, sigint="ignore")
    try:
        wait_for_log_lines(child, run, 2)
        for _ in range(3):
            child.send_signal(signal.SIGINT)
            time.sleep(0.05)
        signalled_at = log_lines(run)
        wait_for_log_lines(child, run, signalled_at + 3)  # three more steps after the last SIGINT
        child.terminate()
        out, err = child.communicate(timeout=120)
    finally:
        children.stop(child)
    assert child.returncode == -signal.SIGTERM, (child.returncode, err)
    assert "interrupted" not in out + err, (out, err)
    assert checkpoint.list_checkpoints(run) == []


def test_the_trainer_leaves_an_ignored_sigint_ignored(tmp_path, small_corpus, monkeypatch):
    """In process: with SIGINT ignored the trainer installs no handler, a SIGINT in the middle of
    an update is lost, the run completes, and SIGINT is still ignored afterwards."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # conftest's known_process_state restores it
    real_step, sent = Adam.step, []

    def step(self, *args, **kwargs):
        if self.step_count == 2 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Adam, "step", step)
    trainer = Trainer(TrainConfig(**CONFIG, save_dir=str(tmp_path)), **QUIET)
    trainer.run()
    assert sent and trainer.step == CONFIG["max_steps"]
    assert checkpoint.list_checkpoints(tmp_path) == [checkpoint.checkpoint_path(tmp_path, CONFIG["max_steps"])]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
