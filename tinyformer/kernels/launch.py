"""Launching a kernel: on CuPy arrays through ``cupy.RawModule``, on NumPy arrays through
the CPU emulation. The Python wrappers in ``kernels/ops.py`` are therefore the same code on
both, and CI exercises them (and the kernels) without a GPU.
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


def function(kernel, dtype, head_dim=None, gpu=True):
    """The callable ``f(grid, block, args)`` for ``kernel`` instantiated for ``dtype`` (and ``head_dim``)."""
    expression = registry.name_expression(kernel, dtype, head_dim)
    if gpu:
        return _module(registry.source_of(kernel), registry.geometry()).get_function(expression)
    if registry.cuda_type(dtype) != "float":
        raise TypeError(f"{expression}: the CPU emulation runs the float32 kernels only")
    return emulation.function(expression)


def launch(kernel, dtype, grid, block, args, head_dim=None):
    """Run ``kernel<dtype[, head_dim]><<<grid, block>>>(*args)``; args are arrays and typed NumPy scalars."""
    gpu = any(backend.is_cupy_array(a) for a in args)
    function(kernel, dtype, head_dim, gpu)(tuple(grid), tuple(block), tuple(args))
