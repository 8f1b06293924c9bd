"""metrics.jsonl: one JSON record a line, appended as a run goes (training every ``log_every``
steps, each skipped update, each validation, the final test). On resume, the records that the
stopped run wrote after its last checkpoint, and a line torn by a kill, are dropped, so that the
log of a resumed run reads as that of one uninterrupted run."""

import json
import os
import time
from pathlib import Path

__all__ = ["LOG_FILE", "MetricsLog", "TokenRate"]

LOG_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends to, and on resume repairs, one run's ``metrics.jsonl``."""

    def __init__(self, path):
        self.path = Path(path)

    def append(self, record):
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_after(self, step):
        """Drop the records of steps after ``step`` and the lines that are not JSON; returns how many.

        The kept lines go to a temporary file renamed over the log, so a kill leaves the old
        log or the new one (a leftover temporary is replaced by the next repair).
        """
        if not self.path.exists():
            return 0
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if isinstance(record, dict) and record.get("step", 0) > step:
                dropped += 1
            else:
                kept.append(line)
        if dropped:
            partial = self.path.with_name(self.path.name + ".tmp")
            partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(partial, self.path)
        return dropped


class TokenRate:
    """Tokens per second over the updates since the last reading (the ``tokens_per_s`` of a log line)."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.tokens, self.start = 0, clock()

    def add(self, tokens):
        self.tokens += tokens

    def take(self):
        """The rate since the last ``take`` (or creation); starts a new window."""
        now = self.clock()
        rate = self.tokens / max(now - self.start, 1e-9)
        self.tokens, self.start = 0, now
        return rate
