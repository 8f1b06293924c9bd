"""OpenBLAS's idle threads go to sleep soon after a matrix product instead of spinning.

OpenBLAS keeps its worker threads busy-waiting for the next product for 2^N cycles after each one
(N = ``OPENBLAS_THREAD_TIMEOUT``, 28 unless set: about a tenth of a second). In a training step the
matrix products alternate with row-wise passes (softmax, LayerNorm, dropout, the loss, Adam's
update) that tinyformer spreads over threads of its own (``backend.set_num_threads``); a BLAS
thread spinning on a core delays the pass that needs that core. N = 4, OpenBLAS's minimum, lets
it sleep at once: on 2 cores `small`'s step gains several points of the sgemm peak
(``benchmarks/results/cpu.md``), and the products themselves lose nothing measurable.

OpenBLAS reads the variable once, when NumPy loads it; so this module acts when imported before
NumPy (``import tinyformer`` imports it first) and leaves a value the user set alone.
"""

import os
import sys

__all__ = ["QUICK_SLEEP", "set_quick_sleep"]

QUICK_SLEEP = "4"  # OpenBLAS's shortest spin: 2^4 cycles


def set_quick_sleep(environ=os.environ, modules=sys.modules):
    """Set ``OPENBLAS_THREAD_TIMEOUT`` to ``QUICK_SLEEP`` when it is unset and NumPy not yet loaded;
    returns whether it did."""
    if "OPENBLAS_THREAD_TIMEOUT" in environ or "numpy" in modules:
        return False
    environ["OPENBLAS_THREAD_TIMEOUT"] = QUICK_SLEEP
    return True


set_quick_sleep()
