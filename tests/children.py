"""The one way a test starts a child process (``tinyformer``, a Python script, a child pytest, a
compiler): from a known state, whatever the test run inherited.

A test run may be started with SIGINT ignored (``nohup``, ``( ... ) &`` in a script, CI runners),
in any locale, with a terminal or nothing on stdin, under any umask, and with ``TINYFORMER_*``
settings or thread limits exported. A child started here gets instead:

- SIGINT set explicitly: ``sigint="default"`` (the default: Ctrl-C or ``send_signal(SIGINT)``
  reaches the program) or ``sigint="ignore"`` (as under ``nohup``). An ignored signal survives
  ``exec`` and a caught one does not, so the disposition is set by a two-line wrapper that execs
  the command (``preexec_fn`` would run Python in a forked copy of a multi-threaded process).
- an environment built from a clean base: the inherited one without any ``TINYFORMER_*``
  or locale variable, with UTF-8 I/O (``LC_ALL=C.UTF-8``, ``PYTHONUTF8=1``, ``PYTHONIOENCODING=utf-8``), one
  BLAS/OpenMP thread, and this checkout first on ``PYTHONPATH``; then what the test passes
  (``env={"TINYFORMER_DATA": ...}``; a value of ``None`` removes the variable). ``inherit=False``
  starts from an empty base instead. ``CUDA_VISIBLE_DEVICES`` passes through: it says which
  devices the machine offers, and no test asserts on it (one that needs no GPU sets it to "").
- umask 022, stdin from ``/dev/null`` (unless the test gives ``input=`` or ``stdin=``), and its
  output decoded as UTF-8 whatever the parent's locale.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SIGINT_DISPOSITIONS = ("default", "ignore")
CLEAN_SETTINGS = {"LC_ALL": "C.UTF-8", "PYTHONUTF8": "1", "PYTHONIOENCODING": "utf-8",
                  "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
DROPPED_PREFIXES, DROPPED = ("TINYFORMER_", "LC_"), ("LANG", "LANGUAGE")
UMASK = 0o022

# argv: disposition, command...; -I -S: nothing but the standard library, whatever PYTHON* says.
_WRAPPER = ("import os, signal, sys; "
            "signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == 'ignore' else signal.SIG_DFL); "
            "os.execvp(sys.argv[2], sys.argv[2:])")


def tinyformer(*args):
    """The argv of ``tinyformer ARGS`` run from this checkout."""
    return [PYTHON, "-m", "tinyformer.cli", *args]


def child_env(env=None, *, inherit=True):
    """The environment of a child: the clean base (see the module docstring), then ``env``."""
    base = {name: value for name, value in os.environ.items()
            if not name.startswith(DROPPED_PREFIXES) and name not in DROPPED} if inherit else {}
    base.update(CLEAN_SETTINGS)
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
    for name, value in (env or {}).items():
        if value is None:
            base.pop(name, None)
        else:
            base[name] = value
    return base


def _popen_arguments(args, sigint, env, inherit, kwargs):
    if sigint not in SIGINT_DISPOSITIONS:
        raise ValueError(f"sigint must be one of {SIGINT_DISPOSITIONS}, got {sigint!r}")
    args = [os.fspath(a) for a in args]
    if os.name == "posix":
        args = [PYTHON, "-I", "-S", "-c", _WRAPPER, sigint, *args]
        kwargs.setdefault("umask", UMASK)
    elif sigint == "ignore":
        raise NotImplementedError("an ignored SIGINT is a POSIX notion")
    if "input" not in kwargs:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    if kwargs.pop("text", True):
        kwargs.setdefault("encoding", "utf-8")
    kwargs.setdefault("cwd", ROOT)
    return args, dict(kwargs, env=child_env(env, inherit=inherit))


def run(args, *, sigint="default", env=None, inherit=True, timeout=300, capture_output=True, **kwargs):
    """``subprocess.run(args)`` from the known state; output captured and decoded as UTF-8 (``text=False``:
    bytes), working directory the repository root unless ``cwd=`` says otherwise."""
    args, kwargs = _popen_arguments(args, sigint, env, inherit, kwargs)
    return subprocess.run(args, timeout=timeout, capture_output=capture_output, check=False, **kwargs)


def start(args, *, sigint="default", env=None, inherit=True, **kwargs):
    """``subprocess.Popen(args)`` from the known state (pass ``stdout=``/``stderr=`` to read them)."""
    args, kwargs = _popen_arguments(args, sigint, env, inherit, kwargs)
    return subprocess.Popen(args, **kwargs)


def stop(child):
    """Kill ``child`` if it still runs, and reap it (for a ``finally:``)."""
    if child.poll() is None:
        child.kill()
    child.wait()
