"""The line a benchmark's report starts with: its command, the date, the commit and the machine."""

import datetime
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git_commit():
    """The short hash of the checkout's HEAD, or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def header(command, *extra, commit=None):
    """"`command`, date UTC, commit, machine, cores, Python[, extra...]"; ``commit`` (a text) in place
    of HEAD's hash, for a run whose code was read at an earlier commit."""
    parts = [f"`{command}`", f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"commit {commit or git_commit()}", platform.machine(), f"{os.cpu_count()} cores",
             f"Python {platform.python_version()}", *extra]
    return ", ".join(parts)
