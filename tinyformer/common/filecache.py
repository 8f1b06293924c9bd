"""Products made once and kept in a folder for other processes: built kernels, a prepared corpus.

A product (a file or a folder) is named by a digest of everything it is made from, so a name that
exists is the right product. ``cached_product`` makes it under a lock file beside it, into a
temporary path that is renamed when complete: a process that asks while another makes it waits
and takes the finished product, and no reader ever sees half of one, even after a crash.
"""

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

__all__ = ["cached_product", "locked"]


@contextlib.contextmanager
def locked(path):
    """Holds an exclusive ``fcntl`` lock on ``path`` (made if missing) for the with-block."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached_product(folder, name, make):
    """The path of ``name`` in ``folder``, made by ``make(partial_path)`` (a file or a folder) if it
    is not there, one process at a time."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    product = folder / name
    if product.exists():
        return product
    with locked(folder / f"{name}.lock"):
        if not product.exists():
            with tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}.") as work:
                partial = Path(work) / name
                make(partial)
                os.replace(partial, product)
    return product
