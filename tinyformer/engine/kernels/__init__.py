"""Raw CUDA kernels for the hot paths, and the one rule that decides when they run.

Each kernel's Python launcher is the module beside its source: ``attention.py`` (for
``attention_mma.cu``, fused attention forward and backward on tensor cores, fp16/bf16, and
``attention.cu``, the same on CUDA cores, fp32), ``softmax.py``, ``layer_norm.py``,
``cross_entropy.py``, ``dropout.py``, ``bias_relu_dropout.py``, ``residual_layer_norm.py``,
``embedding.py`` and ``adam.py``; what they share (argument checks, scalars, dropout seeds)
is ``arguments.py``, and ``launch.py`` runs a kernel. The sources include ``common.cuh``,
``attention.cuh``, ``layer_norm.cuh``, ``mma.cuh`` (the tensor-core instructions) and
``philox.cuh`` (the tests probe the instructions with a source of their own,
tests/kernels/mma_probe.cu).
Each kernel is specified by the NumPy reference in ``functional``/``optim`` and tested
against it by the cases of ``tinyformer.testing.kernel_cases``: on a GPU directly, and in CI through
the CPU emulation of the verification package (the same sources built as C++ and run on the CPU,
mma/ldmatrix/cp.async emulated warp by warp), which ``launch.install_host_loader`` lets launch
on NumPy arrays. Which kernels exist, their element types and the block sizes live in
``registry.py``, which passes the sizes to the sources at compile time, with what each family needs of the device (``registry.REQUIREMENTS``); ``paths.py`` picks
each op's path from the device's capability. ``nvrtc.py`` compiles a source for an architecture
(``cubins.py`` builds them ahead); ``python -m tinyformer.testing.compile_check`` compiles all of
them with NVRTC, per architecture, no GPU needed.
"""

from .. import backend
from . import paths
from .registry import CUDA_TYPES, OLDEST_CAPABILITY


def on_gpu(*arrays):
    """Whether the arrays all live on the GPU (CuPy arrays): the array check of ``use_kernels``."""
    return bool(arrays) and all(backend.is_cupy_array(a) for a in arrays)


def use_kernels(*arrays):
    """The one switch between a CUDA kernel and the NumPy reference, for every fused op and Adam.

    True for CuPy arrays of an element type the kernels have (``registry.CUDA_TYPES``: float32,
    float16 and a bfloat16 dtype; float64, used by gradient checks, always takes the reference)
    unless ``TINYFORMER_KERNELS`` is "0" (set it to compare against the reference on a GPU) or the
    device is older than every kernel (``registry.OLDEST_CAPABILITY``). An op adds its own conditions
    (softmax: the last axis; attention: its mask and head dim, and its kernel by dtype and device:
    ``paths.attention_path``); see ``tinyformer.engine.functional``.
    """
    if not paths.kernels_switched_on():
        return False
    return (on_gpu(*arrays) and all(a.dtype.name in CUDA_TYPES for a in arrays)
            and paths.capability_number(paths.device_capability()) >= OLDEST_CAPABILITY)
