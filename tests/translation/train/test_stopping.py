"""StoppingRules: when a run stops, and why (Trainer's runs in test_train*.py exercise it whole)."""

import types

import pytest

from tinyformer.translation.train.state import Position
from tinyformer.translation.train.step_result import StepResult
from tinyformer.translation.train.stopping import StoppingRules, TrainingDiverged


def rules(ranks=1, **settings):
    config = types.SimpleNamespace(**{"max_steps": 10, "max_epochs": None, "time_limit": None, "patience": None,
                                      "max_bad_steps": 3, "min_loss_scale": 1.0, "schedule": "noam", **settings})
    made = StoppingRules(config, ranks, lead=True, checkpoint_note=lambda: "no checkpoint was written")
    made.start()
    return made


def test_the_end_and_an_early_stop_are_named():
    r = rules(max_epochs=2, patience=2)
    assert r.stop_reason(Position(step=3, epoch=1)) is None
    assert r.stop_reason(Position(step=10, epoch=1)) == "max_steps"
    assert r.stop_reason(Position(step=3, epoch=2)) == "max_epochs"
    for bleu in (5.0, 7.0, 6.0, 7.0):
        r.validated(bleu)
    assert r.stop_reason(Position(step=3)) == "2 validations without a better greedy BLEU than 7.00 (patience 2)"


def test_the_time_limit_agreed_in_a_step_stops_after_the_next_applied_update():
    r = rules(time_limit=0.5)
    r.step_done(StepResult(1.0, 1.0, 10, time_up=True))  # a skipped step: the run goes on
    assert r.stop_reason(Position(step=3)) is None
    r.applied()
    assert r.early_stop == "time limit of 0.5 minutes reached"


def test_bad_steps_in_a_row_diverge_and_an_applied_update_ends_the_row():
    r = rules(max_bad_steps=2)
    assert r.skipped("non-finite loss (nan)", 4) is None
    r.applied()
    assert r.skipped("non-finite loss (nan)", 6) is None
    diverged = r.skipped("non-finite loss (inf)", 7)
    assert isinstance(diverged, TrainingDiverged) and r.bad_in_a_row == 2
    assert "2 updates in a row were skipped" in str(diverged) and "(inf) at step 7" in str(diverged)
    assert "no checkpoint was written" in str(diverged)


def test_with_several_ranks_a_ctrl_c_stops_where_all_of_them_agreed():
    r = rules(ranks=2)
    r.interrupts.pending = True  # this rank's Ctrl-C waits for the step's collective
    r.stop_if_asked()
    r.step_done(StepResult(1.0, 1.0, 10, applied=True, interrupted=True))
    with pytest.raises(KeyboardInterrupt):
        r.stop_if_asked()
    one = rules()
    one.step_done(StepResult(1.0, 1.0, 10, applied=True, interrupted=True))  # one process: the guard's own rule
    one.stop_if_asked()
