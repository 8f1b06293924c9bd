"""Raw CUDA kernels for the hot paths, and the one rule that decides when they run.

Sources: ``attention_mma.cu`` (fused attention forward and backward on tensor cores, fp16/bf16),
``attention.cu`` (the same on CUDA cores, fp32), ``softmax.cu``, ``layer_norm.cu``,
``cross_entropy.cu``, ``dropout.cu``, ``adam.cu``, with ``common.cuh``, ``attention.cuh``,
``mma.cuh`` (the tensor-core instructions) and ``philox.cuh`` (the tests probe the instructions
with a source of their own, tests/kernels/mma_probe.cu).
Each kernel is specified by the NumPy reference in ``functional``/``optim`` and tested
against it by the cases of ``tinyformer.study.kernel_cases``: on a GPU directly, and in CI through
``cpu_emulation.h`` (the fp32 kernels and the tensor-core attention built as C++ and run on the
CPU, mma/ldmatrix/cp.async emulated warp by warp). Block sizes live in
``registry.py`` and reach the sources at compile time. ``python -m
tinyformer.engine.kernels.compile_check`` compiles all of them with NVRTC, no GPU needed.
"""

import os

import numpy

from .. import backend

KERNEL_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float16))
KERNEL_DTYPE_NAMES = ("float32", "float16", "bfloat16")
"""bfloat16 by name: ``ml_dtypes.bfloat16`` (which CuPy 14 also takes) without importing it here."""


def on_gpu(*arrays):
    """Whether the arrays all live on the GPU (CuPy arrays): the array check of ``use_kernels``."""
    return bool(arrays) and all(backend.is_cupy_array(a) for a in arrays)


def use_kernels(*arrays):
    """The one switch between a CUDA kernel and the NumPy reference, for every fused op and Adam.

    True for CuPy arrays of float32, float16 or a bfloat16 dtype (float64, used by gradient checks,
    always takes the reference) unless ``TINYFORMER_KERNELS`` is "0" (set it to compare against
    the reference on a GPU). An op adds its own conditions (softmax: the last axis; attention: its mask and head
    dim, and its kernel by dtype: tensor cores for float16); see ``tinyformer.engine.functional``.
    """
    if os.environ.get("TINYFORMER_KERNELS", "1") == "0":
        return False
    return on_gpu(*arrays) and all(a.dtype.name in KERNEL_DTYPE_NAMES for a in arrays)
