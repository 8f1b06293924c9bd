"""The clock of a run: seconds of training of the whole run, the parts before a ``--resume`` included.

A run's ``Position.train_seconds`` holds the seconds by its step, so that a resumed run continues
the count. Rank 0's clock decides: it is read once a step (``TrainingClock.reading``) and every
rank takes the seconds the step's collective agreed on (rank 0's reading, the others adding 0), so
that the time limit, the time schedule's elapsed fraction and the minute-based checkpoints and
validations (``Every``) come out the same on every rank.
"""

import time

__all__ = ["TrainingClock", "Every"]


class TrainingClock:
    """The training seconds of a run that had ``before`` seconds before this invocation, measured
    with ``time.monotonic`` from the clock's creation; and the ``time_limit`` (minutes) on them.

    With ``whole_run`` (``--schedule time``) the time limit counts the seconds of the whole run, so a
    resumed run stops at the same total; otherwise those of this invocation (seconds − ``before``).
    The methods but ``reading`` take the seconds the ranks agreed on.
    """

    def __init__(self, time_limit=None, whole_run=False, before=0.0):
        self.limit = None if time_limit is None else 60.0 * time_limit
        self.whole_run, self.before = whole_run, float(before)
        self.started = time.monotonic()

    def reading(self):
        """The run's training seconds by now (rank 0's, to be agreed on)."""
        return self.before + (time.monotonic() - self.started)

    def used(self, seconds):
        """The seconds of the time limit used when the run has trained ``seconds``."""
        return seconds if self.whole_run else seconds - self.before

    def fraction(self, seconds):
        """The elapsed fraction t = used / limit of the time limit, clipped to [0, 1] (0 without one)."""
        return 0.0 if self.limit is None else min(max(self.used(seconds) / self.limit, 0.0), 1.0)

    def out_of_time(self, seconds):
        return self.limit is not None and self.used(seconds) >= self.limit

    def minutes_left(self, seconds):
        """Minutes of the time limit left (None without one)."""
        return None if self.limit is None else max(self.limit - self.used(seconds), 0.0) / 60


class Every:
    """Due once ``minutes`` minutes of training (None: never) have passed since the last ``reset``
    (or ``since``, the run's seconds when counting began)."""

    def __init__(self, minutes, since=0.0):
        self.minutes, self.since = minutes, since

    def due(self, seconds):
        return self.minutes is not None and seconds - self.since >= 60 * self.minutes

    def reset(self, seconds):
        self.since = seconds
