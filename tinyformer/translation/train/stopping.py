"""When a training run stops, and why: every stopping rule of ``Trainer`` in one place.

* **the end**: ``max_steps`` updates, or ``max_epochs`` epochs (``stop_reason``);
* **an early stop**, after which the run validates, saves and says why (``early_stop``):
  ``time_limit`` minutes on rank 0's clock (``clock.TrainingClock``, read by ``lead_seconds`` and
  agreed by every rank in a step's collective, acted on after the next applied update), or
  ``patience`` validations in a row without a better greedy BLEU (``validated``);
* **divergence** (``TrainingDiverged``; nothing bad is saved): ``max_bad_steps`` updates in a row
  skipped for a non-finite loss or gradient (``skipped``), or fp16's loss scale below
  ``min_loss_scale`` (``scale_floor_stops``);
* **Ctrl-C** (KeyboardInterrupt at a safe point, ``stop_if_asked``): the ``InterruptGuard``'s
  rules; with several ranks, where all of them agreed to stop (``step_done``);
* **a batch too large for the GPU** (``TrainingOutOfMemory``, ``out_of_memory``): one line naming
  ``--max-tokens`` and the memory asked for and free.
"""

import contextlib

from ...model.optim import LossScaleTooSmall
from .clock import TrainingClock
from .interrupts import InterruptGuard

__all__ = ["StoppingRules", "TrainingDiverged", "TrainingOutOfMemory"]


class TrainingDiverged(FloatingPointError):
    """``max_bad_steps`` updates in a row had a non-finite loss or gradient, or fp16's loss scale fell
    below its floor; nothing bad was saved."""


class TrainingOutOfMemory(MemoryError):
    """A step's batch did not fit the GPU; the message names --max-tokens and the memory asked for and free."""


class StoppingRules:
    """The stopping rules of one run of ``config`` (resolved) over ``ranks`` processes; ``lead``:
    this is rank 0, whose clock decides the time limit; ``checkpoint_note()``: what a stop leaves
    behind ("the last checkpoint, ..., is intact" or "no checkpoint was written")."""

    def __init__(self, config, ranks, lead, checkpoint_note):
        self.config, self.ranks, self.lead, self.checkpoint_note = config, ranks, lead, checkpoint_note
        self.interrupts = InterruptGuard(deferred=ranks > 1)
        self.interrupt_agreed = False  # several ranks: some rank had a Ctrl-C by the last step
        self.clock = TrainingClock(config.time_limit, config.schedule == "time")  # start() restarts it
        self.seconds = 0.0             # the run's training seconds agreed on in the last step
        self.time_up = False           # rank 0's clock passed the deadline by the last step (agreed by all)
        self.early_stop = None         # why training ends before max_steps (time_limit, patience), once it does
        self.best_bleu = None          # patience: the best greedy BLEU of the validations so far
        self.without_gain = 0          # patience: validations in a row without a better one
        self.bad_in_a_row = 0          # skipped updates since the last applied one

    def new_run(self):
        """A fresh Ctrl-C guard for ``Trainer.run`` (one that a previous run or step left waiting acts no more)."""
        self.interrupts = InterruptGuard(deferred=self.ranks > 1)
        self.interrupt_agreed = False

    def start(self, before=0.0):
        """Training starts now, after ``before`` seconds of the run before a --resume: the clock runs from
        here; no early stop, no validation yet."""
        c = self.config
        self.clock = TrainingClock(c.time_limit, c.schedule == "time", before)
        self.seconds = float(before)
        self.time_up, self.early_stop = False, None
        self.best_bleu, self.without_gain = None, 0

    def stop_reason(self, position):
        """Why training stops before another step at ``position``, or None: "max_steps", "max_epochs"
        or the early stop's reason."""
        c = self.config
        if position.step >= c.max_steps:
            return "max_steps"
        if c.max_epochs is not None and position.epoch >= c.max_epochs:
            return "max_epochs"
        return self.early_stop

    # ------------------------------------------------------------------ Ctrl-C and the clock
    def stop_if_asked(self):
        """A safe point: KeyboardInterrupt if a Ctrl-C waits here (with several ranks: where all agreed)."""
        if self.interrupt_agreed:
            raise KeyboardInterrupt
        self.interrupts.stop_if_asked()

    def lead_seconds(self):
        """Rank 0's reading of the run's training seconds; 0 on the other ranks (a step's collective sums them)."""
        return self.clock.reading() if self.lead else 0.0

    def minutes_left(self):
        """Minutes of ``time_limit`` left by the last step (None without one)."""
        return self.clock.minutes_left(self.seconds)

    def step_done(self, result):
        """After every step (applied or not): what its collective agreed, a Ctrl-C somewhere
        (``result.interrupted``), the run's seconds (``result.seconds``) and the time limit (``result.time_up``)."""
        self.interrupt_agreed = self.interrupts.deferred and result.interrupted
        self.time_up, self.seconds = result.time_up, result.seconds

    def applied(self):
        """An update was applied: the bad steps in a row end; a time limit agreed by now stops the run."""
        self.bad_in_a_row = 0
        if self.time_up:
            self.early_stop = f"time limit of {self.config.time_limit:g} minutes reached"

    # ------------------------------------------------------------------ patience
    def validated(self, bleu):
        """``patience``: count validations in a row without a better greedy ``bleu`` (the same on every rank)."""
        if self.best_bleu is None or bleu > self.best_bleu:
            self.best_bleu, self.without_gain = bleu, 0
            return
        self.without_gain += 1
        if self.config.patience is not None and self.without_gain >= self.config.patience:
            self.early_stop = (f"{self.without_gain} validations without a better greedy BLEU than "
                               f"{self.best_bleu:.2f} (patience {self.config.patience})")

    # ------------------------------------------------------------------ divergence
    def skipped(self, reason, step):
        """Count the update of ``step`` skipped for a non-finite loss or gradient (``reason``); returns
        the TrainingDiverged that stops the run once ``max_bad_steps`` were skipped in a row (for the
        caller to raise once the skip is logged), else None."""
        self.bad_in_a_row += 1
        limit = self.config.max_bad_steps
        if self.bad_in_a_row < limit:
            return None
        return TrainingDiverged(
            f"training stopped: {self.bad_in_a_row} updates in a row were skipped for a non-finite loss "
            f"or gradient (max_bad_steps={limit}; the last: {reason} at step {step}); none was applied or "
            f"saved and {self.checkpoint_note()}; try a lower --lr-factor or a --max-grad-norm in a new run")

    @contextlib.contextmanager
    def scale_floor_stops(self, step):
        """fp16's loss scale below its floor, in the update of ``step``, stops the run (TrainingDiverged, one line)."""
        try:
            yield
        except LossScaleTooSmall as error:
            raise TrainingDiverged(f"training stopped at step {step}: {error} (--min-loss-scale "
                                   f"{self.config.min_loss_scale:g}); no such update was applied or saved and "
                                   f"{self.checkpoint_note()}; try --precision bf16 or a lower --lr-factor in a "
                                   "new run") from None

    # ------------------------------------------------------------------ out of memory
    def out_of_memory(self, step, asked, free):
        """The TrainingOutOfMemory of the step to ``step`` (``asked`` and ``free``: bytes, None where
        unknown, ``backend.out_of_memory_report``'s), for the caller to raise."""
        return TrainingOutOfMemory(
            f"out of GPU memory at step {step}: a batch of --max-tokens {self.config.max_tokens} "
            f"asked for {_mib(asked)} with {_mib(free)} free; lower --max-tokens (or raise --accum to keep the "
            f"tokens per step); {self.checkpoint_note()}")


def _mib(count):
    return "an unknown amount" if count is None else f"{count / 2 ** 20:,.1f} MiB"
