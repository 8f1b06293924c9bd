"""Launching a kernel: on CuPy arrays through ``cupy.RawModule``, on NumPy arrays through
the CPU emulation. The Python wrappers in ``kernels/ops.py`` are therefore the same code on
both, and CI exercises them (and the kernels) without a GPU.
"""

import functools

from .. import backend
from . import emulation, registry, toolchain


def _module(source):
    """Every instantiation of ``source``, compiled with the registry's geometry as it is now."""
    headers = toolchain.cuda_include_dirs(backend.cuda_runtime_major())
    options = ["-std=c++17", f"-I{registry.KERNEL_DIR}", *(f"-I{d}" for d in headers), *registry.compile_options()]
    return _compiled(source, tuple(options), tuple(registry.instantiations(source)))


@functools.lru_cache(maxsize=None)
def _compiled(source, options, expressions):
    """Compiled once per process and geometry (CuPy also caches the binary on disk)."""
    return backend.raw_module(registry.read_source(source), list(options), list(expressions))


def function(kernel, dtype, head_dim=None, gpu=True):
    """The callable ``f(grid, block, args)`` for ``kernel`` instantiated for ``dtype`` (and ``head_dim``)."""
    expression = registry.name_expression(kernel, dtype, head_dim)
    if gpu:
        return _module(registry.source_of(kernel)).get_function(expression)
    if registry.cuda_type(dtype) != "float":
        raise TypeError(f"{expression}: the CPU emulation runs the float32 kernels only")
    return emulation.function(expression)


def launch(kernel, dtype, grid, block, args, head_dim=None):
    """Run ``kernel<dtype[, head_dim]><<<grid, block>>>(*args)``; args are arrays and typed NumPy scalars."""
    gpu = any(backend.is_cupy_array(a) for a in args)
    function(kernel, dtype, head_dim, gpu)(tuple(grid), tuple(block), tuple(args))
