"""How a benchmark's report says where it ran: its command, the date, the commit and the machine.

``header`` is the one line most reports start with; the pieces are here for the reports that lay
them out in lines of their own (``bench_step.py``, ``bench_decode.py``, ``table3.py``), so that each
piece is computed one way in every report.
"""

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git_commit(dirty=False):
    """The short hash of the checkout's HEAD, or "unknown" outside a git checkout; with ``dirty``,
    " with uncommitted changes" added when the work tree has any."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        return commit + (" with uncommitted changes" if dirty and _git("status", "--porcelain") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _git(*arguments):
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True,
                          check=True).stdout.strip()


def header(command, *extra, commit=None):
    """"`command`, date UTC, commit, machine, cores, Python[, extra...]"; ``commit`` (a text) in place
    of HEAD's hash, for a run whose code was read at an earlier commit."""
    parts = [f"`{command}`", f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"commit {commit or git_commit()}", platform.machine(), f"{os.cpu_count()} cores",
             f"Python {platform.python_version()}", *extra]
    return ", ".join(parts)


def command_line():
    """This process's command as the report shows it: ``python benchmarks/NAME.py ARGS``, the script
    relative to the working directory unless that leads out of it (then under ``benchmarks/``)."""
    script = sys.argv[0]
    try:
        script = os.path.relpath(script)
    except ValueError:
        pass
    if os.path.isabs(script) or script.startswith(".."):
        script = os.path.join("benchmarks", os.path.basename(script))
    return " ".join(["python", shlex.quote(script), *map(shlex.quote, sys.argv[1:])])


def cpu_model():
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores():
    """The cores this process may run on (its affinity), which a container may set below the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def machine_line():
    """"CPU, N logical cpus (K usable), architecture, system": the machine line of the step reports."""
    return (f"{cpu_model()}, {os.cpu_count()} logical cpus ({usable_cores()} usable), {platform.machine()}, "
            f"{platform.system()}")


def blas_info():
    """NumPy's BLAS library and its thread count (through threadpoolctl where installed)."""
    import numpy

    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:
        name = "unknown BLAS"
    try:
        from threadpoolctl import threadpool_info

        threads = sorted({f"{p['internal_api']} {p['num_threads']} threads" for p in threadpool_info()
                          if p.get("user_api") == "blas"})
        return f"{name} ({', '.join(threads) or 'thread count unknown'}, via threadpoolctl)"
    except ImportError:
        env = [f"{k}={os.environ[k]}" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
               if k in os.environ]
        return f"{name} ({', '.join(env) or 'threads: library default'}; threadpoolctl not installed)"
