"""Files opened for reading, their failures told as what happened: missing, a folder where a file
belongs, or not readable (permission denied); never one reported as another, nor as a corrupt file.

``readable_file`` opens the file to find out (the only honest test: permissions, capabilities and
mounts decide, not the mode bits), ``read_bytes`` and ``read_text`` read it; each raises the
OSError subclass of what happened (``FileNotFoundError``, ``IsADirectoryError``,
``PermissionError``) or the caller's ``error``, with one line naming the file.
"""

import errno
from pathlib import Path

__all__ = ["os_problem", "readable_file", "read_bytes", "read_text"]

_WORDS = {errno.ENOENT: "does not exist", errno.EISDIR: "is a folder, not a file",
          errno.EACCES: "is not readable (permission denied)", errno.EPERM: "is not readable (permission denied)",
          errno.ENOTDIR: "does not exist (a part of its path is a file, not a folder)"}
_KINDS = {errno.ENOENT: FileNotFoundError, errno.EISDIR: IsADirectoryError, errno.EACCES: PermissionError,
          errno.EPERM: PermissionError, errno.ENOTDIR: NotADirectoryError}


def os_problem(problem):
    """What an OSError says happened to its file, in words ("does not exist", "is a folder, not a
    file", "is not readable (permission denied)", or the system's own words)."""
    return _WORDS.get(problem.errno) or f"cannot be read ({problem.strerror or problem})"


def _refusal(path, what, problem, error):
    message = f"{what} {path} {os_problem(problem)}".strip()
    return (error or _KINDS.get(problem.errno, OSError))(message)


def readable_file(path, what="", error=None):
    """``path`` as a Path when it is a file this process can open for reading; otherwise ``error`` (or
    the OSError subclass of what happened) saying "{what} {path} does not exist" or what else it is."""
    path = Path(path)
    try:
        with open(path, "rb"):
            pass
    except OSError as problem:
        raise _refusal(path, what, problem, error) from None
    if not path.is_file():  # a FIFO or a device opens, but is no file of ours
        raise (error or OSError)(f"{what} {path} is not a regular file".strip())
    return path


def read_bytes(path, what="", error=None):
    """The bytes of file ``path``; failures as ``readable_file`` tells them."""
    readable_file(path, what, error)
    try:
        return Path(path).read_bytes()
    except OSError as problem:
        raise _refusal(path, what, problem, error) from None


def read_text(path, what="", error=None):
    """The UTF-8 text of file ``path`` (a UnicodeDecodeError is the caller's); failures as ``readable_file``."""
    return read_bytes(path, what, error).decode("utf-8")
