"""Launching a kernel: on CuPy arrays through ``cupy.RawModule``, on NumPy arrays through
the CPU emulation. The launchers beside the sources (``softmax.py``, ...) are therefore the same
code on both, and CI exercises them (and the kernels) without a GPU.
"""

import functools

from .. import backend
from . import emulation, registry, toolchain


@functools.lru_cache(maxsize=None)
def _module(source, geometry):
    """Every instantiation of ``source``, compiled once per process and ``registry.geometry()``
    (CuPy also caches the binary on disk)."""
    headers = toolchain.cuda_include_dirs(backend.cuda_runtime_major())
    options = ["-std=c++17", f"-I{registry.KERNEL_DIR}", *(f"-I{d}" for d in headers), *registry.compile_options()]
    return backend.raw_module(registry.read_source(source), options, registry.instantiations(source))


@functools.lru_cache(maxsize=None)
def _emulated(geometry):
    """The name expressions the CPU emulation builds, once per geometry (not rebuilt at each launch)."""
    return frozenset(registry.emulated_instantiations())


STATIC_SHARED_LIMIT = 48 * 1024
"""Shared memory a block gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize)."""


def function(kernel, dtype, head_dim=None, gpu=True, shared_mem=0):
    """The callable ``f(grid, block, args, shared_mem=0)`` for ``kernel`` instantiated for ``dtype``
    (and ``head_dim``); on the GPU opted in to ``shared_mem`` bytes of dynamic shared memory."""
    expression = registry.name_expression(kernel, dtype, head_dim)
    if gpu:
        compiled = _module(registry.source_of(kernel), registry.geometry()).get_function(expression)
        if shared_mem > STATIC_SHARED_LIMIT and compiled.max_dynamic_shared_size_bytes < shared_mem:
            compiled.max_dynamic_shared_size_bytes = shared_mem
        return compiled
    if expression not in _emulated(registry.geometry()):
        raise TypeError(f"{expression}: the CPU emulation does not build this kernel (it builds "
                        "registry.emulated_instantiations(): no 16-bit CUDA-core attention)")
    return emulation.function(expression)


def launch(kernel, dtype, grid, block, args, head_dim=None, shared_mem=0):
    """Run ``kernel<dtype[, head_dim]><<<grid, block, shared_mem>>>(*args)``; args are arrays and typed
    NumPy scalars (a pointer into an array, for a strided operand, as a ``numpy.uint64``)."""
    gpu = any(backend.is_cupy_array(a) for a in args)
    function(kernel, dtype, head_dim, gpu, shared_mem)(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)
