"""Files replaced whole: written to a temporary file beside the target, then renamed over it, so
that a reader sees the old file or the new one, never half of one, and a crash leaves the old one.

The new file gets the mode any new file gets (0o666 less the umask), not the 0o600 of
``tempfile.mkstemp``: a checkpoint, tokenizer or page is as readable as the folder's other files.
Likewise a folder built under a temporary name and renamed into place (``new_folder``: an imported
run, a copied tokenizer folder) gets mkdir's 0o777 less the umask, not the 0o700 of ``tempfile.mkdtemp``.
"""

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["replacing", "write_atomically", "fsync_directory", "new_file", "new_folder"]


def new_file(directory, prefix, suffix):
    """(fd, path) of a new file in ``directory`` named ``prefix``<random>``suffix``, mode 0o666 less the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = Path(directory) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory} for {prefix}*{suffix}")


def new_folder(parent, prefix, suffix=""):
    """A new empty folder in ``parent`` named ``prefix``<random>``suffix``, of mode 0o777 less the umask."""
    for _ in range(100):
        path = Path(parent) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            path.mkdir(0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {parent} for {prefix}*{suffix}")


def fsync_directory(directory):
    """Make a rename in ``directory`` durable (a power cut after it keeps the new name); POSIX only."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path, prefix=None, suffix=".tmp", durable=False):
    """A binary file to write in the with-block; when the block ends, it replaces ``path``. On an
    exception the temporary file (``prefix``, default ".<name>.", and ``suffix`` around a random
    part) is removed and ``path`` stays as it was. ``durable``: the data and the rename are synced
    to the disk before the block returns."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise IsADirectoryError(f"{path} is not a regular file: it cannot be replaced by one")
    fd, temporary = new_file(path.parent, f".{path.name}." if prefix is None else prefix, suffix)
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(path.parent)


def write_atomically(path, data):
    """Write bytes to ``path`` through ``replacing``: readers never see half a file."""
    with replacing(path) as stream:
        stream.write(data)
