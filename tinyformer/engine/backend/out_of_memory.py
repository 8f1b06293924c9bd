"""Running out of GPU memory: the exceptions an allocation that does not fit raises, and what
their message and the device say about it."""

import re

from . import devices

_ASKED = re.compile(r"allocating ([\d,]+) bytes")


def out_of_memory_errors():
    """The exception types an allocation that does not fit raises (CuPy's), as a tuple for ``except``."""
    if devices.cupy is None:
        return ()
    return (devices.cupy.cuda.memory.OutOfMemoryError,)


def out_of_memory_report(error):
    """(bytes asked for or None, bytes free on the device or None) for an out-of-memory ``error``;
    CuPy's message says "Out of memory allocating 1,073,741,824 bytes (allocated so far: ...)"."""
    found = _ASKED.search(str(error))
    asked = int(found.group(1).replace(",", "")) if found else None
    free = None
    if devices.cupy is not None:
        try:
            free = int(devices.cupy.cuda.runtime.memGetInfo()[0])
        except Exception:
            free = None
    return asked, free
