"""Ctrl-C while training, without losing or tearing anything.

Inside ``guard.cut_short_allowed()`` sections (a forward and backward pass, a validation, the
setup: nothing a checkpoint holds changes there) Ctrl-C stops at once. Elsewhere it is noted and
acted on at the next ``guard.stop_if_asked()``, so that an update with its counters, a log line and
a checkpoint write are never cut in two. A second Ctrl-C while one waits stops at once, and
``forced`` says so: then nothing more is saved.

With several ranks (``deferred``) a Ctrl-C cuts nothing short and no safe point acts on it by
itself: ``pending`` is summed over the ranks with each step's statistics, so that every rank
stops after the same step.

When a Ctrl-C stops the run, ``save_on_interrupt`` saves the last completed step (unless it is saved
already, or a second Ctrl-C forced the stop) and names that checkpoint in a ``TrainingInterrupted``.
"""

import contextlib
import signal
import threading

from ...engine import random as tf_random
from .. import checkpoint
from .run_checkpoints import kept_note

__all__ = ["InterruptGuard", "TrainingInterrupted", "save_on_interrupt"]


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training; ``checkpoint`` is the checkpoint of the last completed step (or None)."""

    def __init__(self, message, checkpoint=None):
        super().__init__(message)
        self.checkpoint = checkpoint


class InterruptGuard:
    """The SIGINT handler of one training run, and the state it keeps."""

    def __init__(self, deferred=False):
        self.pending = False  # a Ctrl-C waits for the next safe point
        self.forced = False   # a second one came meanwhile: stop at once, save nothing
        self.deferred = deferred  # several ranks: the trainer agrees on where to stop
        self._cut_short = 0   # > 0 inside sections that Ctrl-C may cut short

    @contextlib.contextmanager
    def installed(self):
        """Handle SIGINT as above inside this block. Off the main thread, or where SIGINT is not
        Python's default handler (ignored under nohup, or someone else's), nothing is installed."""
        if threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield self
            return
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_sigint(self, signum, frame):
        if self._cut_short and not self.deferred:
            raise KeyboardInterrupt
        if self.pending:
            self.forced = True
            raise KeyboardInterrupt
        self.pending = True

    @contextlib.contextmanager
    def cut_short_allowed(self):
        """A section that Ctrl-C may stop at once: it changes nothing a checkpoint holds."""
        self.stop_if_asked()
        self._cut_short += 1
        try:
            yield
        finally:
            self._cut_short -= 1

    def stop_if_asked(self):
        """A safe point: raise KeyboardInterrupt if a Ctrl-C is waiting (not when ``deferred``)."""
        if self.pending and not self.deferred:
            raise KeyboardInterrupt

    def stopping(self):
        """Stopping after a KeyboardInterrupt: from now on any Ctrl-C stops at once (saving
        nothing more). Returns ``forced``: whether a second Ctrl-C came before this point."""
        self._cut_short, self.pending = 0, True
        return self.forced


def save_on_interrupt(guard, step, checkpoints, save, boundary_rng=None):
    """The ``TrainingInterrupted`` of a Ctrl-C that stopped a run at ``step`` (its last completed one),
    naming the checkpoint of that step: ``save()`` writes it if ``checkpoints`` (``RunCheckpoints``)
    has not yet, after the dropout generator is set back to ``boundary_rng`` (its state before a step
    that was cut short, undoing that step's draws). After a second Ctrl-C (``guard.forced``) nothing is
    saved; the message then names the newest checkpoint, intact."""
    forced = guard.stopping()  # a further Ctrl-C stops at once, saving nothing
    newest = checkpoints.newest()
    if forced:
        return TrainingInterrupted(f"interrupted at step {step} before a checkpoint could be saved; "
                                   f"{kept_note(newest)}", newest)
    if boundary_rng is not None:
        tf_random.set_rng_state(boundary_rng)
    path = checkpoints.path(step)
    if checkpoints.saved_step != step:
        try:
            save()
        except (OSError, checkpoint.CheckpointError) as error:
            return TrainingInterrupted(f"interrupted at step {step}; saving it failed ({error})", newest)
    return TrainingInterrupted(f"interrupted at step {step}, which is saved in {path}; continue with --resume", path)
