"""Launching a kernel: on CuPy arrays through ``cupy.RawModule`` (or a prebuilt cubin), on NumPy
arrays through the host loader installed with ``install_host_loader``.

The host loader is the one seam through which a CPU build of the same sources reaches the engine:
the engine ships none and names none; the verification package installs the kernels' CPU
emulation through it (docs/architecture.md). The launchers beside the sources (``softmax.py``,
...) are therefore the same code on both, and CI exercises them (and the kernels) without a GPU.
"""

import functools
import time

import numpy

from .. import backend
from . import paths, prebuilt, registry, toolchain


@functools.lru_cache(maxsize=None)
def _module(source, geometry):
    """Every instantiation of ``source`` this GPU's architecture runs (``registry.instantiations_for``),
    once per process and ``registry.geometry()``: the prebuilt
    cubin of this device's architecture where ``$TINYFORMER_CUBINS`` has one (``prebuilt.load``),
    else compiled with NVRTC (CuPy also caches the binary on disk)."""
    module = prebuilt.load(source)
    if module is not None:
        return module
    start = time.perf_counter()
    headers = toolchain.cuda_include_dirs(backend.cuda_runtime_major())
    options = ["-std=c++17", f"-I{registry.KERNEL_DIR}", *(f"-I{d}" for d in headers), *registry.compile_options()]
    expressions = registry.instantiations_for(source, backend.compute_capability(capped=False))
    module = backend.raw_module(registry.read_source(source), options, expressions)
    for expression in expressions:  # CuPy compiles at the first lookup: do it here, timed
        module.get_function(expression)
    prebuilt.note_compiled(source, time.perf_counter() - start)
    return module


def module_of(source):
    """The module of ``source`` this process launches from (loaded or compiled on first use)."""
    return _module(source, registry.geometry())


_host_loader = None
"""``loader(expression) -> f(grid, block, args, shared_mem=0)``: what runs a kernel on NumPy arrays."""


def install_host_loader(loader):
    """Install ``loader``, a callable from a name expression (``"softmax_forward<float>"``) to a
    callable ``f(grid, block, args, shared_mem=0)`` (as ``cupy.RawModule.get_function`` gives) that
    runs the kernel on NumPy arrays, or None to have none; returns the loader installed before, so
    that a caller can put it back. The loader is asked at every launch on NumPy arrays (it keeps
    its own cache) and raises for a kernel it does not build."""
    global _host_loader
    if loader is not None and not callable(loader):
        raise TypeError(f"install_host_loader: loader must be callable or None, got {type(loader).__name__}")
    previous, _host_loader = _host_loader, loader
    return previous


def host_loader():
    """The loader ``install_host_loader`` installed (None: kernels run on CuPy arrays only)."""
    return _host_loader


@functools.lru_cache(maxsize=None)
def _runs_here(kernel, dtype_name, capability):
    """``registry.runs_on`` of ``kernel``'s family, once per (kernel, element type, capability): asked at every launch."""
    return registry.runs_on(registry.source_of(kernel), dtype_name, capability)


STATIC_SHARED_LIMIT = 48 * 1024
"""Shared memory a block gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize)."""


def function(kernel, dtype, head_dim=None, gpu=True, shared_mem=0):
    """The callable ``f(grid, block, args, shared_mem=0)`` for ``kernel`` instantiated for ``dtype``
    (and ``head_dim``); on the GPU opted in to ``shared_mem`` bytes of dynamic shared memory."""
    expression = registry.name_expression(kernel, dtype, head_dim)
    capability = paths.device_capability()
    name = dtype if isinstance(dtype, str) else numpy.dtype(dtype).name
    if not _runs_here(kernel, name, capability):
        raise RuntimeError(paths.precision_problem(capability, name, backend.device_name())
                           or f"{expression}: {registry.REQUIREMENTS[registry.source_of(kernel)].why}, not {capability}")
    if gpu:
        compiled = _module(registry.source_of(kernel), registry.geometry()).get_function(expression)
        if shared_mem > STATIC_SHARED_LIMIT and compiled.max_dynamic_shared_size_bytes < shared_mem:
            compiled.max_dynamic_shared_size_bytes = shared_mem
        return compiled
    if _host_loader is None:
        raise RuntimeError(f"{expression}: launched on NumPy arrays, and no host loader is installed to run it "
                           "there (kernels.launch.install_host_loader)")
    return _host_loader(expression)


def launch(kernel, dtype, grid, block, args, head_dim=None, shared_mem=0, cost=None):
    """Run ``kernel<dtype[, head_dim]><<<grid, block, shared_mem>>>(*args)``; args are arrays and typed
    NumPy scalars (a pointer into an array, for a strided operand, as a ``numpy.uint64``). ``cost``:
    (bytes, FLOPs, compute) of the launch for ``backend.note_launch`` where the arrays among the
    arguments do not tell it (operands passed as pointers, FLOPs); by default the bytes of those arrays."""
    gpu = any(backend.is_cupy_array(a) for a in args)
    function(kernel, dtype, head_dim, gpu, shared_mem)(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)
    if backend.is_counting_launches():
        if cost is None:
            cost = (sum(a.nbytes for a in args if getattr(a, "ndim", 0) > 0), 0, "memory")
        backend.note_launch(kernel, bytes=cost[0], flops=cost[1], compute=cost[2])
