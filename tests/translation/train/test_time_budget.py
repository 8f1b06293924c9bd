"""A run on a time budget (issue 49): the time schedule, the run's clock across --resume, checkpoints and
validations by the minute, the average of the last checkpoints, and --recipe hour. The clock is faked."""

import re

import numpy as np
import pytest

from tinyformer import cli
from tinyformer.model.optim import NoamSchedule, TimeBudgetSchedule
from tinyformer.translation import checkpoint, train
from tinyformer.translation.train import ConfigError, TrainConfig, Trainer, load_model
from tinyformer.translation.train import clock as clock_module
from tinyformer.translation.train.config import flag_of
from tinyformer.translation.train.recipes import RECIPES

from tests.translation.train.test_trainer import QUIET, cached_corpus, records, small_config, small_corpus, small_load_corpus  # noqa: F401


class FakeTime:
    """``time`` for the clock module: each ``monotonic()`` reading ``tick`` seconds after the last (the
    first is 0: the clock's start; then one reading a step)."""

    def __init__(self, tick):
        self.now, self.tick = 0.0, tick

    def monotonic(self):
        value, self.now = self.now, self.now + self.tick
        return value


@pytest.fixture
def ticking(monkeypatch):
    """Install a FakeTime of ``tick`` seconds a reading (a fresh one for each run)."""
    def install(tick=50.0):
        monkeypatch.setattr(clock_module, "time", FakeTime(tick))
    return install


def train_records(save_dir):
    return {r["step"]: r for r in records(save_dir) if "split" not in r and "skipped" not in r}


# ---------------------------------------------------------------------------- the schedule
def test_the_time_schedule_warms_up_to_noams_peak_holds_and_decays_to_zero():
    schedule = TimeBudgetSchedule(64, warmup_steps=10, factor=2.0, decay_fraction=0.5)
    peak = 2.0 * 64 ** -0.5 * 10 ** -0.5
    assert schedule.peak_lr() == pytest.approx(NoamSchedule(64, 10, 2.0)(10))

    def lr(step, t):
        schedule.elapsed_fraction = t
        return schedule(step)

    assert lr(5, 0.0) == pytest.approx(peak / 2)          # warm-up
    assert lr(10, 0.0) == lr(500, 0.5) == pytest.approx(peak)  # the plateau, to 1 − decay_fraction
    assert lr(500, 0.75) == pytest.approx(peak / 2)       # halfway down the decay
    assert lr(5, 0.75) == pytest.approx(peak / 4)         # the warm-up still applies
    assert lr(500, 1.0) == 0.0 and lr(500, 3.0) == 0.0 and lr(10, -1.0) == pytest.approx(peak)  # t clipped
    whole = TimeBudgetSchedule(64, warmup_steps=10, factor=2.0)  # decay_fraction 1: down from the start
    whole.elapsed_fraction = 0.25
    assert whole(20) == pytest.approx(0.75 * peak)
    with pytest.raises(ValueError, match="decay_fraction"):
        TimeBudgetSchedule(64, decay_fraction=0.0)


def test_the_time_schedules_state_round_trips_without_the_clock():
    schedule = TimeBudgetSchedule(32, warmup_steps=7, factor=1.5, decay_fraction=0.25)
    schedule.elapsed_fraction = 0.9
    other = TimeBudgetSchedule(8, 1, 1.0)
    other.elapsed_fraction = 0.9
    other.load_state_dict(schedule.state_dict())
    assert repr(other) == repr(schedule) and other(3) == schedule(3)
    assert "elapsed_fraction" not in schedule.state_dict()


# ---------------------------------------------------------------------------- the config
@pytest.mark.parametrize("settings, field, message", [
    ({"schedule": "time"}, "schedule", "schedule 'time' ends the learning rate with the time limit"),
    ({"schedule": "cosine"}, "schedule", "schedule must be one of ('noam', 'time')"),
    ({"schedule": "time", "time_limit": 5, "decay_fraction": 0.0}, "decay_fraction", "decay_fraction must be"),
    ({"decay_fraction": 1.5}, "decay_fraction", "decay_fraction must be"),
    ({"decay_fraction": 0.5}, "decay_fraction", "decay_fraction 0.5 shapes the decay of schedule 'time' only, not of "
                                                "schedule 'noam'"),
    ({"recipe": "day"}, "recipe", "recipe must be one of ('hour',)"),
    ({"save_every_minutes": 0}, "save_every_minutes", "save_every_minutes must be a positive number"),
    ({"average_last": 0}, "average_last", "average_last must be"),
])
def test_the_config_refuses(settings, field, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        TrainConfig(**settings).resolved()
    assert refused.value.field == field


def test_the_command_line_names_the_flag_of_a_time_schedule_without_a_time_limit(capsys):
    assert cli.main(["train", "--schedule", "time"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinyformer train: error: --schedule 'time' ends the learning rate") and "--time-limit" in err


def test_the_command_line_names_a_decay_fraction_without_a_time_schedule(capsys):
    assert cli.main(["train", "--decay-fraction", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinyformer train: error: --decay-fraction 0.5 shapes the decay of schedule 'time' only")
    assert TrainConfig(recipe="hour", schedule="noam").resolved().decay_fraction == 1.0  # a recipe's value is no error


def test_the_hour_recipe_sets_what_was_not_given_and_given_options_win(tmp_path):
    plain = TrainConfig(data="multi30k").resolved()
    hour = TrainConfig(data="multi30k", recipe="hour").resolved()
    assert {name: getattr(hour, name) for name in RECIPES["hour"]} == RECIPES["hour"]
    assert (plain.schedule, plain.lr_factor, plain.warmup_steps, plain.time_limit) == ("noam", 1.0, 800, None)
    given = TrainConfig(data="multi30k", recipe="hour", lr_factor=1.0, warmup_steps=800, time_limit=30,
                        schedule="noam").resolved()
    assert (given.lr_factor, given.warmup_steps, given.time_limit, given.schedule) == (1.0, 800, 30, "noam")
    assert given.average_last == 5
    corpus = TrainConfig(train_data=str(tmp_path / "corpus"), recipe="hour").resolved()
    assert corpus.data == "files" and corpus.schedule == "time" and corpus.time_limit == RECIPES["hour"]["time_limit"]


# ---------------------------------------------------------------------------- the clock in a run
def test_checkpoints_and_validations_by_the_minute(tmp_path, monkeypatch, ticking):
    ticking(50.0)  # step k ends at 50k seconds
    validated = []
    monkeypatch.setattr(Trainer, "validate", lambda self: validated.append(self.step) or {"bleu_greedy": 1.0})
    trainer = Trainer(small_config(tmp_path, max_steps=7, save_every=100, eval_every=100, keep_last=10,
                                   save_every_minutes=2.0, eval_every_minutes=3.0), **QUIET)
    trainer.run()
    # saves: 150 s (step 3) ≥ 120, then 300 s (step 6) ≥ 150 + 120, and the end; validations: 200 s, the end
    assert [checkpoint.step_of(p) for p in checkpoint.list_checkpoints(tmp_path)] == [3, 6, 7]
    assert validated == [4, 7]
    assert trainer.position.train_seconds == 350.0
    assert "minutes_left" not in train_records(tmp_path)[1]  # no time limit


def test_the_clock_and_the_time_schedule_continue_after_resume(tmp_path, ticking):
    ticking(50.0)
    config = dict(max_steps=3, save_every=3, schedule="time", time_limit=10.0, decay_fraction=1.0)
    first = Trainer(small_config(tmp_path, **config), **QUIET)
    first.run()
    _, meta, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(tmp_path, 3))
    assert meta["train_seconds"] == 150.0
    ticking(50.0)
    resumed = Trainer(small_config(tmp_path, **{**config, "max_steps": 6}), resume=True, **QUIET)
    resumed.run()
    assert resumed.position.train_seconds == 300.0  # 150 before, then 50 s a step
    logged = train_records(tmp_path)[4]
    peak = TimeBudgetSchedule(resumed.model.d_model, 4, 1.0).peak_lr()
    assert logged["lr"] == pytest.approx(peak * (1 - 200 / 600))  # t = 200 s of the run's 600
    assert logged["minutes_left"] == pytest.approx(400 / 60, abs=0.01)
    ticking(50.0)  # --time-limit counts the whole run: 5 minutes end it at step 6 (300 s), not 5 min from here
    again = Trainer(small_config(tmp_path, **{**config, "max_steps": 20, "time_limit": 5.5}), resume=True, **QUIET)
    again.run()
    assert again.step == 7 and again.stopping.early_stop == "time limit of 5.5 minutes reached"


def test_a_noam_runs_time_limit_counts_this_invocation(tmp_path, ticking):
    ticking(50.0)
    Trainer(small_config(tmp_path, max_steps=3, save_every=3), **QUIET).run()
    ticking(50.0)
    resumed = Trainer(small_config(tmp_path, max_steps=20, time_limit=2.0), resume=True, **QUIET)
    resumed.run()
    assert resumed.step == 6  # 120 s of this invocation: 3 more steps


# ---------------------------------------------------------------------------- averaging
def test_average_last_averages_the_newest_checkpoints_raises_keep_last_and_validates_the_average(tmp_path):
    said = []
    trainer = Trainer(small_config(tmp_path, max_steps=5, save_every=1, keep_last=2, average_last=3),
                      echo=said.append, progress=False)
    trainer.run()
    paths = checkpoint.list_checkpoints(tmp_path)
    assert [checkpoint.step_of(p) for p in paths] == [3, 4, 5]  # keep_last raised to 3
    assert any("--keep-last 2 raised to 3" in line for line in said)
    averaged = tmp_path / "averaged.npz"
    states = [checkpoint.load_checkpoint(p)[0] for p in paths]
    state, meta, adam = checkpoint.load_checkpoint(averaged)
    assert adam is None and meta["averaged_from"] == [p.name for p in paths]
    for name in state:
        np.testing.assert_allclose(state[name], np.mean([s[name] for s in states], axis=0, dtype=np.float64), rtol=1e-6)
    model, _, _ = load_model(averaged)
    np.testing.assert_array_equal(model.state_dict()["src_embed.weight"], trainer.averaged.model.state_dict()[
        "src_embed.weight"])
    assert trainer.averaged.label() == "averaged over the last 3 checkpoints (steps 3..5)"
    val = [r for r in records(tmp_path) if r.get("split") == "val"]
    assert [r.get("averaged") for r in val] == [None, 3]


def test_average_last_takes_the_checkpoints_there_are(tmp_path):
    said = []
    Trainer(small_config(tmp_path, max_steps=4, save_every=2, average_last=5), echo=said.append, progress=False).run()
    assert any("averaged the last 2 checkpoints (steps 2..4)" in line and "only 2 of --average-last 5" in line
               for line in said)


def test_the_cli_tests_the_average(tmp_path, monkeypatch, capsys):
    tested = []

    def evaluate(model, tokenizer, sources, references, beam_size, alpha):
        tested.append(model.state_dict())
        return {"hypotheses": ["x"] * 2, "bleu": 1.0, "signature": "s", "tokenized_bleu": 1.0,
                "tokenized_signature": "t", "exact_match": 0.0, "sentences": 2}

    monkeypatch.setattr(train, "evaluate", evaluate)
    monkeypatch.setattr(train, "load_corpus", lambda config, split: (["a b", "c d"], ["e f", "g h"]))
    assert cli.main(["train", "--save-dir", str(tmp_path), "--max-steps", "3", "--max-tokens", "256", "--preset",
                     "tiny", "--vocab-size", "120", "--warmup-steps", "4", "--save-every", "1", "--bleu-samples", "4",
                     "--threads", "1", "--average-last", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "test, averaged over the last 2 checkpoints (steps 2..3)" in out and "trained 3 steps in" in out
    averaged, _, _ = checkpoint.load_checkpoint(tmp_path / "averaged.npz")
    np.testing.assert_array_equal(tested[0]["src_embed.weight"], averaged["src_embed.weight"])
    assert [r.get("averaged") for r in records(tmp_path) if r.get("split") == "test"] == [2]


def test_a_run_of_the_recipe_says_its_values_and_the_minutes_left(tmp_path, ticking):
    ticking(50.0)
    said = []
    trainer = Trainer(small_config(tmp_path, recipe="hour", max_steps=2), echo=said.append, progress=False)
    trainer.run()
    values = {**RECIPES["hour"], "max_steps": 2}  # small_config's given options win
    values.update({name: getattr(trainer.config, name) for name in values})
    assert said[0] == ("--recipe hour: " + ", ".join(f"{flag_of(name)} {value}" for name, value in values.items())
                       + " (options given win)")
    limit = 60 * RECIPES["hour"]["time_limit"]
    assert train_records(tmp_path)[1]["minutes_left"] == pytest.approx((limit - 50) / 60, abs=0.01)
    assert any(line.startswith("step 2: val loss")
               and line.endswith(f"; {(limit - 100) / 60:.1f} min of --time-limit left") for line in said)
    assert "trained 2 steps in 2.5 min" in said  # 50 s a step, and 50 s to the last reading
    assert any("only 1 of --average-last 5 exist" in line for line in said) and trainer.averaged.count == 1


def test_a_corpus_of_ones_own_trains_by_the_recipe_until_its_time_limit_and_tests_the_average(tmp_path, ticking,
                                                                                                capsys):
    """`tinyformer train --train PREFIX --valid PREFIX --test PREFIX --recipe hour`: the clock (600 s a
    step here) ends the run at the recipe's time limit, a checkpoint by the minute at each step, and
    the test decodes the average of the last five."""
    from tests.translation.train.test_corpus import built_in, write_corpus

    data, run = tmp_path / "data", tmp_path / "run"
    files = {split: write_corpus(data / split, built_in(split, n)) for split, n in
             (("train", 600), ("val", 30), ("test", 20))}
    ticking(600.0)
    code = cli.main(["train", "--train", str(files["train"]), "--valid", str(files["val"]), "--test",
                     str(files["test"]), "--recipe", "hour", "--preset", "tiny", "--vocab-size", "200",
                     "--max-tokens", "512", "--bleu-samples", "4", "--threads", "1", "--no-progress",
                     "--save-dir", str(run)])
    out = capsys.readouterr().out
    assert code == 0
    steps, minutes = re.search(r"trained (\d+) steps in ([\d.]+) min", out).groups()
    assert int(steps) == 6 and float(minutes) >= RECIPES["hour"]["time_limit"]  # 6 × 600 s ≥ 56 min
    assert "test, averaged over the last 5 checkpoints (steps 2..6)" in out
    assert re.search(r"^test: BLEU \d", out, re.MULTILINE)
    assert [r.get("averaged") for r in records(run) if r.get("split") == "test"] == [5]
