"""The CUDA kernels built as C++ against ``cpu_emulation.h`` (beside this file) and called through
ctypes: every kernel in every element type but the CUDA-core attention in bfloat16
(``registry.emulated_instantiations()``).

CI has no GPU; this runs the very kernel source (engine/kernels/*.cu, unchanged) on the CPU so that
tests can compare its results with the NumPy references. A block's CUDA threads are fibers on the
calling thread, switched at barriers (cpu_emulation.h): much slower than a GPU, meant for small
shapes. ``install()`` makes the engine launch kernels on NumPy arrays through it
(``kernels.launch.install_host_loader``, the engine's seam); importing ``tinyformer.testing`` calls
it. ``TINYFORMER_EMULATION_SANITIZE=1`` builds with AddressSanitizer (the process must then preload
libasan, as ``tests/engine/kernels/test_emulation.py`` does). The test run builds the library in the
background (tests/background_builds.py).
"""

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy

from ...engine.kernels import launch, registry, toolchain

HEADER_DIR = Path(__file__).resolve().parent
"""cpu_emulation.h and the parts it includes: on the build's include path after engine/kernels/."""

_CTYPES = {
    numpy.dtype(numpy.int32): ctypes.c_int32,
    numpy.dtype(numpy.uint32): ctypes.c_uint32,
    numpy.dtype(numpy.int64): ctypes.c_int64,
    numpy.dtype(numpy.uint64): ctypes.c_uint64,
    numpy.dtype(numpy.float32): ctypes.c_float,
}


class EmulationError(RuntimeError):
    """The C++ compiler is missing or rejected the kernels."""


def symbol(expression):
    """C symbol of the launcher of a name expression: attention_forward<float, 64> -> tf_attention_forward_float_64."""
    return "tf_" + re.sub(r"\W+", "_", expression).strip("_")


def translation_unit(sources=None, expressions=None):
    """The C++ source: the emulation header, the kernel ``sources`` (default: every source of the
    registry; a path outside engine/kernels/ may be given, such as a test's own probe, which includes
    the kernels' headers by name), one extern "C" launcher per name expression of ``expressions``
    (default: ``registry.emulated_instantiations()``)."""
    sources = list(registry.KERNELS) if sources is None else [str(s) for s in sources]
    expressions = registry.emulated_instantiations() if expressions is None else list(expressions)
    lines = ['#include "cpu_emulation.h"']
    lines += [f'#include "{source}"' for source in sources]
    for expression in expressions:
        lines.append(
            f'extern "C" void {symbol(expression)}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
            f"unsigned bz, unsigned shared_bytes, void** args) {{ tf_emu::launch(&{expression}, dim3(gx, gy, gz), "
            f"dim3(bx, by, bz), shared_bytes, args); }}"
        )
    return "\n".join(lines) + "\n"


def sanitize_requested():
    return os.environ.get("TINYFORMER_EMULATION_SANITIZE", "") not in ("", "0")


def header_files():
    """The emulation's headers (cpu_emulation.h and the parts it includes), hashed into the build's key."""
    return sorted(HEADER_DIR.glob("*.h"))


def _compiler():
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise EmulationError("no C++ compiler found (set CXX or install g++) to build the CPU emulation")
    return cxx


def compile_flags(sanitize):
    """g++ flags: the registry's geometry as defines, as NVRTC gets them. Under AddressSanitizer,
    line tables only (``-g1``: a report still names file and line; a quarter less build time)."""
    flags = ["-std=c++20", "-shared", "-fPIC", "-pthread", "-w", f"-I{registry.KERNEL_DIR}", f"-I{HEADER_DIR}",
             *registry.compile_options()]
    return flags + (["-O1", "-g1", "-fsanitize=address", "-fno-omit-frame-pointer"] if sanitize else ["-O2"])


def build(sanitize=None, sources=None, expressions=None):
    """Compile (once per hash of everything it is built from, cached in the temp folder) and return
    the library's path: by default the registry's kernels; ``sources`` and ``expressions`` as for
    ``translation_unit``."""
    sanitize = sanitize_requested() if sanitize is None else sanitize
    cxx, flags, unit = _compiler(), compile_flags(sanitize), translation_unit(sources, expressions)
    digest = hashlib.sha256()
    for part in [cxx, " ".join(flags), unit]:
        digest.update(part.encode())
    outside = [Path(s) for s in sources or () if Path(s).is_absolute()]
    for path in registry.kernel_files() + header_files() + outside:
        digest.update(path.read_bytes())
    suffix = "-asan" if sanitize else ""

    def compile_into(partial):
        unit_path = partial.with_suffix(".cpp")
        unit_path.write_text(unit, encoding="utf-8")
        result = subprocess.run([cxx, *flags, str(unit_path), "-o", str(partial)], capture_output=True, text=True)
        if result.returncode != 0:
            raise EmulationError(f"building the CPU emulation failed ({cxx}):\n{result.stderr[-4000:]}")

    return toolchain.cached_product(f"kernels-{digest.hexdigest()[:16]}{suffix}.so", compile_into)


@functools.lru_cache(maxsize=None)
def _library(path):
    return ctypes.CDLL(str(path))


def _c_value(arg):
    if isinstance(arg, numpy.ndarray):
        if not arg.flags.c_contiguous:
            raise ValueError(f"emulated kernel arguments must be C-contiguous arrays, got strides {arg.strides}")
        return ctypes.c_void_p(arg.ctypes.data)
    if isinstance(arg, numpy.generic) and arg.dtype in _CTYPES:
        return _CTYPES[arg.dtype](arg.item())
    raise TypeError(f"kernel argument must be an array or a typed NumPy scalar, got {type(arg).__name__}")


class EmulatedFunction:
    """Callable as ``function(grid, block, args, shared_mem=0)``, like a ``cupy.RawKernel``."""

    def __init__(self, expression, library):
        self.expression = expression
        self._launch = getattr(_library(library), symbol(expression))
        self._launch.restype = None

    def __call__(self, grid, block, args, shared_mem=0):
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        values = [_c_value(a) for a in args]
        pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        self._launch(*(ctypes.c_uint(int(n)) for n in grid + block + (shared_mem,)), pointers)


def library():
    """The ctypes library of the registry's kernels as built now (the one ``function`` launches
    from), for its entry points that are not kernels: attention's trace buffer (attention.cuh)."""
    return _library(build(sanitize_requested()))


def function(expression):
    """The emulated ``expression``, from the library built for the registry's geometry as it is now;
    a TypeError for a name expression the emulation does not build."""
    if expression not in _emulated(registry.geometry()):
        raise TypeError(f"{expression}: the CPU emulation does not build this kernel (it builds "
                        "registry.emulated_instantiations(): no bfloat16 CUDA-core attention)")
    return _function(expression, registry.geometry(), sanitize_requested())


def install():
    """Make the engine run kernels on NumPy arrays through this emulation (``function``, installed
    with ``kernels.launch.install_host_loader``); returns the loader installed before."""
    return launch.install_host_loader(function)


@functools.lru_cache(maxsize=None)
def _emulated(geometry):
    """The name expressions the emulation builds, once per geometry (not rebuilt at each launch)."""
    return frozenset(registry.emulated_instantiations())


@functools.lru_cache(maxsize=None)
def _function(expression, geometry, sanitize):
    """Once per process, geometry and sanitizer setting (as ``launch._module`` compiles for the
    GPU): a launch neither hashes every source file again nor looks its symbol up again."""
    return EmulatedFunction(expression, build(sanitize))

