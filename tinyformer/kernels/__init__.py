"""Raw CUDA kernels for the hot paths, and the one place that decides when they run.

Sources: ``attention.cu`` (fused attention forward and backward), ``softmax.cu``,
``layer_norm.cu``, ``cross_entropy.cu``, ``dropout.cu``, ``adam.cu``, with ``common.cuh`` and
``philox.cuh``.
Each kernel is specified by the NumPy reference in ``functional``/``optim`` and tested
against it by the cases of ``cases.py``: on a GPU directly, and in CI through
``cpu_emulation.h`` (the fp32 kernels built as C++ and run on the CPU). Block sizes live in
``registry.py`` and reach the sources at compile time. ``python -m
tinyformer.kernels.compile_check`` compiles all of them with NVRTC, no GPU needed.
"""

import os

from .. import backend


def enabled(*arrays):
    """True when the kernels replace the NumPy reference: CuPy arrays, and
    ``TINYFORMER_KERNELS`` is not "0" (set it to compare against the reference on a GPU)."""
    if os.environ.get("TINYFORMER_KERNELS", "1") == "0":
        return False
    return any(backend.is_cupy_array(a) for a in arrays)
