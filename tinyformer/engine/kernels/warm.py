"""Every kernel module loaded (or compiled) once, serially: a GPU machine's first step, so that the
processes after it (test workers, benchmarks, training) find each module in CuPy's disk cache, or
load the prebuilt cubins of ``$TINYFORMER_CUBINS`` (``prebuilt``), and none compiles it again.

    python -m tinyformer.engine.kernels.warm

prints a line per kernel source (seconds, and whether it was loaded prebuilt or compiled here) and
the seconds spent in all.
"""

import sys
import time

from .. import backend
from . import launch, prebuilt, registry


def warm_every_module(out=print):
    """Load or compile each kernel source's module in turn; returns the seconds taken in all."""
    total = 0.0
    for source in registry.KERNELS:
        start = time.perf_counter()
        launch.module_of(source)
        seconds = time.perf_counter() - start
        total += seconds
        out(f"{source:26} {seconds:7.2f} s  {prebuilt.origins().get(source, 'compiled')}")
    compiled = [s for s in registry.KERNELS if not prebuilt.origins().get(s, "compiled").startswith("prebuilt")]
    out(f"kernel modules: {len(registry.KERNELS)} in {total:.1f} s, {len(compiled)} of them compiled on this machine")
    return total


def main():
    if not backend.is_gpu_available():
        print("warm: no usable CuPy GPU (nothing to load)", file=sys.stderr)
        return 1
    warm_every_module()
    return 0


if __name__ == "__main__":
    sys.exit(main())
